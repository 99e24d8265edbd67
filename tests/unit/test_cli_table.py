"""The CLI is a table (``raycpt.cli.COMMANDS``): every option that sets a config key is an override applied before
the config loads, so every check sees what will run - the sweep's memory check names the plans of ``--splits``,
not the config's, and a bad ``--splits`` is one line before anything else is printed."""

from __future__ import annotations

from tiny import save_tiny


def test_every_option_key_is_a_config_key():
    from raycpt.cli import COMMANDS
    from raycpt.config import ExperimentConfig, config_to_dict
    from raycpt.runs.records import flatten

    keys = set(flatten(config_to_dict(ExperimentConfig())))
    named = [(name, o.key) for name, row in COMMANDS.items() for o in row.options if o.key]
    assert named and all(k in keys for _, k in named), [k for _, k in named if k not in keys]
    assert {"sweep", "trace", "compare", "eval", "contribution", "hybrid run", "train"} <= set(COMMANDS)


def test_sweep_splits_1_is_one_line_and_nothing_else(capsys):
    from raycpt.entry import main

    assert main(["sweep", "configs/default.yaml", "--splits", "1"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1 and "sweep.splits" in err


def test_sweep_memory_check_names_the_plans_of_the_given_splits(tmp_path, capsys):
    from raycpt.entry import main

    model = save_tiny(tmp_path / "tiny10", num_layers=10)
    capsys.readouterr()  # (saving the tiny model prints a progress bar)
    code = main(["sweep", "configs/default.yaml", "--splits", "0.8", f"model.ref={model}",
                 f"tracking.run_root={tmp_path / 'runs'}", "train.device_memory_gb=0.000001"])
    out, err = capsys.readouterr()
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "train_shallow r=0.8" in err and "train_deep r=0.8" in err and "0.33" not in err and "0.66" not in err
    maps = [ln.split("(")[1].split(")")[0] for ln in out.splitlines() if ln.startswith("memory: plan train_")]
    assert maps == ["T" * 8 + "..", "." * 8 + "TT"], out  # b = 8 of 10 layers: r = 0.8, nothing else
    assert not (tmp_path / "runs").exists() or not list((tmp_path / "runs").glob("sweep-*"))  # nothing started


def test_every_row_resolves_to_a_job_and_a_renderer():
    """Each row's lazy reference names a :class:`raycpt.jobs.job.Job` (prepare, run_spec, execute) and its renderer
    is a function (result, console): a typo in the table fails here, not when a user runs that command."""
    from raycpt.cli import COMMANDS
    from raycpt.jobs.job import Job
    from raycpt.usage import Lazy

    for name, row in COMMANDS.items():
        assert isinstance(row.job, Lazy) and row.job.module.startswith("raycpt.jobs."), name
        job = row.job.resolve()
        assert isinstance(job, Job), name
        assert callable(row.render) and row.render.__module__ == "raycpt.report.render", name


def test_config_validate_imports_no_job_module_and_no_torch_ray_or_mlflow(tmp_path):
    """The CLI starts light: the table imports a job's module only when its command runs."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    code = ("import sys; from raycpt.entry import main; assert main(['config', 'validate']) == 0; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'ray', 'mlflow', 'transformers') "
            "or m in ('raycpt.jobs.sweep', 'raycpt.jobs.train', 'raycpt.jobs.grid')))")
    repo = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(repo)})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout


def test_cli_py_is_at_most_250_lines():
    """The table and its wiring only (issue 40): the entry and its error mapping are raycpt/entry.py, the runner is
    raycpt/jobs/job.py."""
    from pathlib import Path

    cli = Path(__file__).resolve().parents[2] / "raycpt" / "cli.py"
    n = len(cli.read_text(encoding="utf-8").splitlines())
    assert n <= 250, f"raycpt/cli.py has {n} lines (at most 250)"
