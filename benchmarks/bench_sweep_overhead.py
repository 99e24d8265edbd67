#!/usr/bin/env python
"""Does the main job spend its time computing? Wall time of a sweep (and of a contribution scan) against the
compute inside it.

    python benchmarks/bench_sweep_overhead.py                      # a small default sweep, then a small scan
    python benchmarks/bench_sweep_overhead.py --only sweep         # the sweep alone (--only scan: the scan)
    python benchmarks/bench_sweep_overhead.py runs/sweep-default-XXXX   # reads a finished sweep (or scan) folder
    python benchmarks/bench_sweep_overhead.py --splits 0.33,0.5,0.66 train.max_steps=8   # the sweep to run

The scan is ``raycpt contribution configs/contribution.yaml`` at a small size (``SCAN_DEFAULT``: the untrained
base, full and three single layers, 8 steps each): one trial per layer, so there the per-trial fixed cost is
most of the wall time.

Compute = what the trials already record, nothing estimated:
  trace forwards      trace/summary.json  ``forward_s`` (the actors' trace_batch calls)
  optimizer steps     trials/*/train/train_metrics.jsonl  ``step_time_s`` (forward, backward, clip, AdamW)
  evaluation forwards trials/*/eval/eval_result.json  ``seconds`` of every mode (logit, generate, cloze)
                      and the held-out loss (all but ``load``)
Wall = the ``raycpt sweep`` command (when this script runs it), else the sweep's MLflow parent run. The script
packs the corpus into the fresh run root first (``raycpt data prepare``, its time printed on its own line): a
store is packed once per corpus and reused by every later command, so it is not a per-sweep cost; ``--cold``
counts it (what a first run on a new run root pays).
Everything else is overhead; the per-trial table splits it into what the records name (corpus and plan
preparation on the trial driver, worker set-up to the first step, checkpoints, the rest: Ray Train /
Tune start and stop, MLflow, publishing). The machine's speed (median training tokens/s of the trials)
is printed beside the wall time.

A second table is the timeline of every trial from its own records (``attempts.json``, ``train/state.json``'s
``clock``, the events of ``train_metrics.jsonl``): open (child run, trial start) -> prepare (model, plan, corpus
on the trial driver) -> mlflow (the run opened, config logged) -> start (Ray Train up to the loop; in local mode
nothing is started) -> setup (model load, plan, wrap) -> steps -> ckpt -> eval -> stop (after the evaluation
until ``fit()`` returns) -> publish (``final_model/``) -> summary (loss curve, metrics) -> close (scores read,
logged, child run ended).

Last lines: ``RESULT sweep_overhead <wall/compute> target <= 1.3 PASS|FAIL`` and
``RESULT scan_overhead <wall/compute> target <= 1.3 PASS|FAIL``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _smoke import add_smoke, tiny_model_dir

REPO = Path(__file__).resolve().parents[1]
TARGET = 1.3
DEFAULT_SWEEP = ["--splits", "0.5"]  # full + train_shallow + train_deep at r = 0.5 on configs/default.yaml
SCAN_DEFAULT = ["--layers", "0,15,29"]  # configs/contribution.yaml: base, full, 3 single layers (5 trials)
PHASES = ("open", "prepare", "mlflow", "start", "setup", "steps", "ckpt", "eval", "stop", "publish", "summary",
          "close")


def _read_json(p: Path) -> dict:
    return json.loads(p.read_text()) if p.is_file() else {}


def _events(p: Path) -> list[dict]:
    if not p.is_file():
        return []
    return [json.loads(line) for line in p.read_text().splitlines() if line.strip()]


def trial_record(tdir: Path) -> dict:
    """One trial's compute and the overhead pieces its files name (seconds)."""
    ev = _events(tdir / "train" / "train_metrics.jsonl")
    steps = [e["step_time_s"] for e in ev if "step_time_s" in e]
    start = next((e for e in ev if e.get("event") in ("start", "resume")), {})
    ckpt = sum(e.get("seconds", 0.0) for e in ev if e.get("timing") == "checkpoint")
    evaluated = next((e for e in ev if e.get("timing") == "evaluated"), {})
    secs = _read_json(tdir / "eval" / "eval_result.json").get("seconds", {})
    eval_fwd = sum(float(v) for k, v in secs.items() if k != "load")  # every mode that ran, and the held-out loss
    result = _read_json(tdir / "result.json")
    state = _read_json(tdir / "train" / "state.json")
    tok = [e["tokens_per_s"] for e in ev if "tokens_per_s" in e]
    return {"name": tdir.name, "wall": float(result.get("wall_s", 0.0)), "steps": sum(steps), "n_steps": len(steps),
            "eval": eval_fwd, "eval_block": float(evaluated.get("seconds", eval_fwd)),
            "prepare": float(state.get("prepare_s", float("nan"))), "setup": float(start.get("setup_s", float("nan"))),
            "checkpoint": ckpt, "tokens_per_s": statistics.median(tok[1:] or tok) if tok else float("nan")}


def timeline(tdir: Path) -> dict:
    """Seconds of each of :data:`PHASES` in a trial's last attempt, from its own records (NaN where a record is
    missing: an untrained trial, a file from before the clock)."""
    nan = float("nan")
    ev = _events(tdir / "train" / "train_metrics.jsonl")
    clock = _read_json(tdir / "train" / "state.json").get("clock") or {}
    attempts = _read_json(tdir / "attempts.json").get("attempts") or [{}]
    t0, t_end = attempts[-1].get("start", nan), attempts[-1].get("last", nan)
    start = next((e for e in reversed(ev) if e.get("event") in ("start", "resume")), {})
    end = next((e for e in reversed(ev) if e.get("event") == "finished"), {})
    evaluated = next((e for e in reversed(ev) if e.get("timing") == "evaluated"), {})
    steps = sum(e["step_time_s"] for e in ev if "step_time_s" in e and e.get("step", 0) > start.get("step", 0))
    ckpt = sum(e.get("seconds", 0.0) for e in ev if e.get("timing") == "checkpoint")
    loop0 = start.get("time", nan) - start.get("setup_s", nan)  # when this attempt's loop began
    prepared = clock.get("start", nan) + _read_json(tdir / "train" / "state.json").get("prepare_s", nan)
    return {"open": clock.get("start", nan) - t0, "prepare": prepared - clock.get("start", nan),
            "mlflow": clock.get("fit_start", nan) - prepared, "start": loop0 - clock.get("fit_start", nan),
            "setup": start.get("setup_s", nan), "steps": steps, "ckpt": ckpt,
            "eval": evaluated.get("seconds", 0.0), "stop": clock.get("fit_end", nan) - evaluated.get("time", end.get(
                "time", nan)), "publish": clock.get("published", nan) - clock.get("fit_end", nan),
            "summary": clock.get("summarized", nan) - clock.get("published", nan),
            "close": t_end - clock.get("summarized", nan), "wall": t_end - t0,
            "local_mode": clock.get("local_mode")}


def report_timeline(run_dir: Path) -> None:
    print("timeline of each trial's last attempt (s), from its records:")
    print(("{:<20}" + "{:>8}" * (len(PHASES) + 1)).format("trial", *PHASES, "wall"))
    for d in sorted((run_dir / "trials").iterdir()):
        if d.is_dir():
            t = timeline(d)
            mode = {True: " (local)", False: " (group)"}.get(t["local_mode"], "")
            print(("{:<20}" + "{:>8.1f}" * (len(PHASES) + 1) + "{}").format(
                d.name[:20], *(t[k] for k in PHASES), t["wall"], mode))


def parent_wall(run_dir: Path) -> float:
    """Seconds between the sweep's MLflow parent run start and end."""
    from mlflow.tracking import MlflowClient

    from raycpt.config import load_config
    from raycpt.runs.store import tracking_uri

    cfg = load_config(str(run_dir / "config.yaml"), [])
    state = _read_json(run_dir / "state.json")
    run_id = state.get("mlflow_run_id") or state.get("parent_run_id")
    info = MlflowClient(tracking_uri(cfg.tracking)).get_run(run_id).info
    return (info.end_time - info.start_time) / 1000.0


def analyse(run_dir: Path, wall: float) -> dict:
    trials = [trial_record(d) for d in sorted((run_dir / "trials").iterdir()) if d.is_dir()]
    trace = _read_json(run_dir / "trace" / "summary.json")
    trace_fwd = float(trace.get("forward_s") or 0.0)
    compute = trace_fwd + sum(t["steps"] + t["eval"] for t in trials)
    return {"run_dir": str(run_dir), "wall": wall, "compute": compute, "trace_forward": trace_fwd,
            "trace_wall": float(trace.get("wall_s") or 0.0), "trials": trials,
            "ratio": wall / compute if compute > 0 else float("inf"),
            "tokens_per_s": statistics.median([t["tokens_per_s"] for t in trials]) if trials else float("nan")}


def report(a: dict) -> None:
    print(f"run folder {a['run_dir']}")
    print(f"wall {a['wall']:.1f} s at {a['tokens_per_s']:.0f} training tokens/s (median of the trials' steps); "
          f"compute {a['compute']:.1f} s (trace forwards {a['trace_forward']:.1f} s of a {a['trace_wall']:.1f} s trace)")
    cols = ("trial", "wall", "steps", "eval fwd", "prepare", "setup", "ckpt", "other")
    print(("{:<22}" + "{:>9}" * (len(cols) - 1)).format(*cols))
    for t in a["trials"]:
        known = t["steps"] + t["eval_block"] + (t["prepare"] if t["prepare"] == t["prepare"] else 0) + \
            (t["setup"] if t["setup"] == t["setup"] else 0) + t["checkpoint"]
        print(("{:<22}" + "{:>9.1f}" * (len(cols) - 1)).format(
            t["name"], t["wall"], t["steps"], t["eval"], t["prepare"], t["setup"], t["checkpoint"],
            t["wall"] - known))
    sums = {k: sum(t[k] for t in a["trials"] if t[k] == t[k]) for k in ("wall", "prepare", "setup", "checkpoint")}
    print(f"per-trial overhead in all: prepare (corpus + plan, trial driver) {sums['prepare']:.1f} s, worker set-up "
          f"{sums['setup']:.1f} s, checkpoints {sums['checkpoint']:.1f} s; trials {sums['wall']:.1f} s of "
          f"{a['wall']:.1f} s wall")


def run_sweep(extra: list[str], command: str = "sweep", config: str = "default.yaml",
              cold: bool = False) -> tuple[Path, float]:
    """Run the command in a fresh run root; unless ``cold``, its corpus is packed first (``raycpt data prepare``,
    timed on its own line): packing happens once per corpus and store, not once per sweep, and is not a trial's
    fixed cost."""
    root = Path(tempfile.mkdtemp(prefix="bench-sweep-overhead-"))
    env = dict(os.environ, PYTHONPATH=str(REPO))
    if not cold:
        prep = [sys.executable, "-m", "raycpt", "data", "prepare", str(REPO / "configs" / config),
                *[w for w in extra if "=" in w], f"tracking.run_root={root}"]
        t0 = time.perf_counter()
        if subprocess.run(prep, cwd=REPO, env=env, stdout=subprocess.DEVNULL).returncode != 0:
            raise SystemExit(f"packing the corpus failed; its folder: {root}")
        print(f"packed the corpus first (once per corpus and store; --cold counts it): "
              f"{time.perf_counter() - t0:.1f} s, not in the wall below", flush=True)
    cmd = [sys.executable, "-m", "raycpt", command, str(REPO / "configs" / config), *extra,
           f"tracking.run_root={root}"]
    print("running:", " ".join(cmd), flush=True)
    t0 = time.perf_counter()
    rc = subprocess.run(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL).returncode
    wall = time.perf_counter() - t0
    if rc != 0:
        raise SystemExit(f"the sweep failed (exit {rc}) after {wall:.0f}s; its folder: {root}")
    return next(root.glob(f"{command}-*")), wall


SMOKE = [f"data.max_documents=200", "train.max_steps=1", "eval.tasks=[wordnet_mc]", "eval.modes=[logit]",
         "eval.limit=4"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("run_dir", nargs="?", help="a finished sweep or scan folder (default: run a small sweep and scan)")
    ap.add_argument("--splits", default=None, help="splits of the sweep this script runs (default 0.5)")
    ap.add_argument("--only", choices=("sweep", "scan"), default=None, help="run only the sweep or only the scan")
    ap.add_argument("--cold", action="store_true", help="count packing the corpus in the wall time (a first run)")
    ap.add_argument("overrides", nargs="*", help="key=value overrides of the sweep this script runs")
    add_smoke(ap)
    args, rest = ap.parse_known_args()
    scan_extra = list(SCAN_DEFAULT)
    if args.smoke:  # one trial (full, 1 step) of the tiny model, no trace, 4 questions; a 3-trial scan of it
        args.splits = "0.5"
        tiny = tiny_model_dir()
        rest += [f"model.ref={tiny}", "sweep.strategies=[full]", "sweep.trace_first=false", "sweep.heldout_docs=0",
                 *SMOKE]
        scan_extra = ["--layers", "1", f"model.ref={tiny}", *SMOKE, "contribution.heldout_docs=16"]
        print("smoke mode: one 1-step trial of a tiny model, and a 3-trial scan of it (numbers are not the claim)",
              flush=True)
    words = [w for w in ([args.run_dir] if args.run_dir else []) + args.overrides + rest]
    folder = next((w for w in words if "=" not in w and Path(w).is_dir()), None)
    overrides = [w for w in words if "=" in w]
    if folder:
        run_dir = Path(folder).resolve()
        name = "scan" if run_dir.name.startswith("contribution-") else "sweep"
        _result(name, run_dir, parent_wall(run_dir))
        return 0
    if args.only != "scan":
        run_dir, wall = run_sweep((["--splits", args.splits] if args.splits else DEFAULT_SWEEP) + overrides,
                                  cold=args.cold)
        _result("sweep", run_dir, wall)
    if args.only != "sweep":
        run_dir, wall = run_sweep(scan_extra, command="contribution", config="contribution.yaml", cold=args.cold)
        _result("scan", run_dir, wall)
    return 0


def _result(name: str, run_dir: Path, wall: float) -> None:
    a = analyse(run_dir, wall)
    report(a)
    report_timeline(run_dir)
    print(f"RESULT {name}_overhead {a['ratio']:.2f} target <= {TARGET} {'PASS' if a['ratio'] <= TARGET else 'FAIL'}",
          flush=True)


if __name__ == "__main__":
    sys.exit(main())
