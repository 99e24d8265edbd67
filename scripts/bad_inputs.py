"""Run every known bad input through the real ``raycpt`` console script and print a table.

    python scripts/bad_inputs.py [--fast] [--markdown OUT.md]

Each case is one command line a new user or an unlucky operator could type. What should happen:
exit code 2 and exactly one line on stderr (``error: ...``), never a traceback. The table lists
input, exit code, the number of stderr lines and the last stderr line; the script exits 1 when any
case breaks the rule. ``--fast`` skips the cases that start Ray (``train``). The fixtures (a tiny
random model, binary files, malformed ranking files, a hybrid spec, ...) are made in a temporary
folder. ``tests/integration/test_bad_inputs_cli.py`` runs the same cases.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Case:
    label: str
    args: list[str]
    expect: str  # a substring of the one stderr line
    ray: bool = False  # starts a local Ray (slow)
    owner: str = "19"  # the issue whose work makes this case one line (others' run with --all)
    env: dict = field(default_factory=dict)  # extra environment of this one command (a test-only fault)


def fixtures(tmp: Path) -> dict:
    """Files the cases point at."""
    sys.path.insert(0, str(ROOT / "tests"))
    from tiny import save_tiny

    tmp.mkdir(parents=True, exist_ok=True)
    f = {"tmp": tmp, "model": str(save_tiny(tmp / "tiny")), "model2": str(save_tiny(tmp / "tiny2", seed=1))}
    (tmp / "binary.bin").write_bytes(bytes(range(256)) * 4)
    for name in ("binary.yaml", "binary.jsonl", "binary.json", "binary.txt"):
        (tmp / name).write_bytes(bytes(range(256)) * 4)
    (tmp / "adir").mkdir(exist_ok=True)
    (tmp / "broken.yaml").write_text("train: [1, 2\n")
    (tmp / "list.yaml").write_text("- 1\n- 2\n")
    (tmp / "dupkey.yaml").write_text("train:\n  lr: 1.0e-3\nplan:\n  name: full\ntrain:\n  max_steps: 2\n")
    bomb = ['a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    bomb += [f"{c}: &{c} [" + ", ".join([f"*{p}"] * 9) + "]" for p, c in zip("abcdefgh", "bcdefghi")]
    (tmp / "bomb.yaml").write_text("\n".join(bomb) + "\n")  # ~350 bytes, 9**9 strings once expanded
    (tmp / "huge.yaml").write_text("name: x\n" + "#" * (2 << 20) + "\n")
    (tmp / "intfield.jsonl").write_text('{"text": "a gloss"}\n{"text": 12345}\n')
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": [1, 2, 3]}), tmp / "ints.parquet")
    ok = {"format": "raycpt.layer-ranking/1", "model": "tiny", "num_layers": 4, "metric": "contribution",
          "ranking": [{"layer": i, "score": 1.0 - i / 10} for i in range(4)]}
    variants = {"ok": ok, "nl_text": {**ok, "num_layers": "many"},
                "score_text": {**ok, "ranking": [{"layer": 0, "score": "high"}]},
                "dup": {**ok, "ranking": [{"layer": 1, "score": 1.0}, {"layer": 1, "score": 0.5}]},
                "nl9": {**ok, "num_layers": 9}, "empty": {**ok, "ranking": []},
                "layer_text": {**ok, "ranking": [{"layer": "two", "score": 1.0}]},
                "no_layer": {**ok, "ranking": [{"score": 1.0}]}}
    for k, v in variants.items():
        (tmp / f"rank_{k}.json").write_text(json.dumps(v))
    (tmp / "rank_badjson.json").write_text("{\"ranking\": [")
    (tmp / "empty.jsonl").write_text("")
    runs = tmp / "runs"
    hy = {"name": "h", "model": {"ref": f["model"]}, "tracking": {"run_root": str(runs)},
          "hybrid": {"depth": 4, "new_kind": "qwen3", "builds": ["new_shallow"]}}
    import yaml

    (tmp / "hybrid.yaml").write_text(yaml.safe_dump(hy))
    (tmp / "out" / "new_shallow").mkdir(parents=True, exist_ok=True)
    (tmp / "out" / "new_shallow" / "my_notes.txt").write_text("the user's file")
    _issue27_fixtures(tmp, f)
    _issue41_fixtures(tmp, f)
    os.mkfifo(tmp / "fifo.jsonl")  # issue 51: a corpus nobody writes
    _issue51_record_fixtures(tmp)
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen(1)
    f.update(runs=str(runs), busy=busy, busy_port=busy.getsockname()[1])
    return f


def _issue27_fixtures(tmp: Path, f: dict) -> None:
    """Issue 27's fixtures: model folders an evaluation must refuse, broken MLflow stores, files in an --out's way."""
    import shutil

    import torch

    sys.path.insert(0, str(ROOT))
    from raycpt.train.ckpt.manifest import write_manifest

    tiny = Path(f["model"])
    (tmp / "noweights").mkdir(exist_ok=True)
    shutil.copy(tiny / "config.json", tmp / "noweights" / "config.json")
    shutil.copytree(tiny, tmp / "truncated", dirs_exist_ok=True)
    write_manifest(tmp / "truncated", 4, finite=True)
    weights = tmp / "truncated" / "model.safetensors"
    with open(weights, "r+b") as fh:  # cut short after its manifest was written (a copy or a disk that failed)
        fh.truncate(weights.stat().st_size // 2)
    (tmp / "pickled").mkdir(exist_ok=True)
    shutil.copy(tiny / "config.json", tmp / "pickled" / "config.json")
    torch.save({"w": torch.zeros(2)}, tmp / "pickled" / "pytorch_model.bin")
    (tmp / "corrupt_runs").mkdir(exist_ok=True)
    (tmp / "corrupt_runs" / "mlflow.db").write_bytes(b"this is not a database" * 100)
    (tmp / "notes.txt").write_text("the user's notes, not a database")
    (tmp / "an_out_file").write_text("the user's file named as --out")
    (tmp / "out2").mkdir(exist_ok=True)
    (tmp / "out2" / "new_shallow").write_text("the user's file where a build would go")
    (tmp / "broken.gguf").write_bytes(b"GGUF" + b"\0" * 4)  # a GGUF header cut short
    dup = json.dumps({"s1": "Example: hot->cold; Query: up->", "s2": "down", "group": "antonym"})
    (tmp / "dup_prompts.jsonl").write_text((dup + "\n") * 4)
    (tmp / "small.jsonl").write_text("".join(json.dumps({"text": f"gloss {i} of a small corpus"}) + "\n"
                                             for i in range(200)))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        f["free_port"] = str(s.getsockname()[1])
    lost = tmp / "contribution-lost"  # a scan that finished while its tracking server was gone (it still is)
    lost.mkdir(exist_ok=True)
    (lost / "config.yaml").write_text(f"name: c\ntracking:\n  run_root: {tmp / 'runs'}\n  uri: http://127.0.0.1:9\n")
    (lost / "state.json").write_text(json.dumps({"command": "contribution", "status": "finished",
                                                 "tracking_lost": {"uri": "http://127.0.0.1:9"}}))


def cases(f: dict) -> list[Case]:
    t, m, runs = f["tmp"], f["model"], f["runs"]
    rr = f"tracking.run_root={runs}"
    plan = ["plan", "show", f"model.ref={m}", rr]
    train = ["train", f"model.ref={m}", rr, "data.seq_len=32", "train.max_steps=2", "train.num_workers=1",
             "ray.num_cpus=2"]
    c = [
        # config files and overrides
        Case("config file missing", ["config", "validate", str(t / "nope.yaml")], "config file not found"),
        Case("config is a directory", ["config", "validate", str(t / "adir")], "is a directory"),
        Case("binary config", ["config", "validate", str(t / "binary.yaml")], "is not UTF-8 text"),
        Case("broken YAML", ["config", "validate", str(t / "broken.yaml")], "is not valid YAML at line"),
        Case("YAML list at top level", ["config", "validate", str(t / "list.yaml")], "must hold a mapping"),
        Case("a YAML key twice", ["config", "validate", str(t / "dupkey.yaml")],
             "key 'train' is given twice (lines 1 and 5)"),
        Case("a YAML alias bomb", ["config", "validate", str(t / "bomb.yaml")], "expands to more than 100,000 nodes"),
        Case("a 2 MB config", ["config", "validate", str(t / "huge.yaml")], "a config is at most 1,048,576 bytes"),
        Case("two config files", ["config", "validate", str(t / "list.yaml"), str(t / "broken.yaml")],
             "give at most one CONFIG file"),
        Case("unknown key", ["config", "validate", "train.lrr=1"], "unknown key (did you mean 'train.lr'?)"),
        Case("unknown section", ["config", "validate", "trian.lr=1"], "unknown key"),
        Case("empty override key", ["config", "validate", "=3"], "empty key"),
        Case("int field given text", ["config", "validate", "train.max_steps=abc"], "an integer"),
        Case("int field given 2.5", ["config", "validate", "train.max_steps=2.5"], "an integer"),
        Case("train.max_steps=0", ["config", "validate", "train.max_steps=0"], "an integer >= 1"),
        Case("train.max_steps=1e309", ["config", "validate", "train.max_steps=1e309"], "an integer"),
        Case("train.lr=inf", ["config", "validate", "train.lr=inf"], "a finite number"),
        Case("train.lr=1e309", ["config", "validate", "train.lr=1e309"], "a finite number"),
        Case("train.lr=nan", ["config", "validate", "train.lr=nan"], "a finite number"),
        Case("train.lr=-1", ["config", "validate", "train.lr=-1"], "a positive learning rate"),
        Case("train.lr=10**400", ["config", "validate", "train.lr=" + "1" + "0" * 400], "a finite number"),
        Case("train.betas=[0.9,inf]", ["config", "validate", "train.betas=[0.9,inf]"], "a finite number"),
        Case("train.betas=[0.9]", ["config", "validate", "train.betas=[0.9]"], "two numbers in [0, 1)"),
        Case("train.warmup_ratio=1", ["config", "validate", "train.warmup_ratio=1"], "a number in [0, 1)"),
        Case("train.precision=fp16", ["config", "validate", "train.precision=fp16"], "one of auto, fp32, bf16"),
        Case("train.distributed=zero", ["config", "validate", "train.distributed=zero"], "one of ddp, fsdp"),
        Case("train.use_gpu=maybe", ["config", "validate", "train.use_gpu=maybe"], "true or false"),
        Case("data.seq_len=4", ["config", "validate", "data.seq_len=4"], "an integer >= 8"),
        Case("data.corpus=[]", ["config", "validate", "data.corpus=[]"], "a non-empty list"),
        Case("eval.modes=[fast]", ["config", "validate", "eval.modes=[fast]"], "one of logit, generate"),
        Case("eval.limit=0", ["config", "validate", "eval.limit=0"], "an integer >= 1, null, or per task"),
        Case("trace.top_k=-1", ["config", "validate", "trace.top_k=-1"], "an integer >= 0"),
        Case("trace.grid=[0.8,0.2,0.1]", ["config", "validate", "trace.grid=[0.8,0.2,0.1]"], "[start, stop, step]"),
        Case("sweep.splits=[1.5]", ["config", "validate", "sweep.splits=[1.5]"], "ratios strictly between 0 and 1"),
        Case("plan.name=bogus", ["config", "validate", "plan.name=bogus"], "one of full"),
        Case("plan.split=1.5", ["config", "validate", "plan.split=1.5"], "a ratio strictly between 0 and 1"),
        Case("plan.pattern=012", ["config", "validate", "plan.pattern=012"], "a string of 0 and 1"),
        Case("plan.k=0", ["config", "validate", "plan.k=0"], "an integer >= 1"),
        Case("plan.lr_scales={3: -1}", ["config", "validate", "plan.lr_scales={3: -1}"], "a positive multiplier"),
        Case("hybrid.depth=3", ["config", "validate", "hybrid.depth=3"], "an even integer >= 2"),
        Case("hybrid.builds=[bogus]", ["config", "validate", "hybrid.builds=[bogus]"], "one of new_shallow"),
        Case("name with path separators", ["config", "validate", "name=x/../../../escaped"], "no path separators"),
        Case("name empty", ["config", "validate", "name="], "1-100 letters"),
        Case("name ..", ["config", "validate", "name=.."], "1-100 letters"),
        Case("name with a space", ["config", "validate", "name=my run"], "1-100 letters"),
        # plans on a model
        Case("plan.name=blocks plan.pattern=", plan + ["plan.name=blocks", "plan.pattern="], "plan.pattern"),
        Case("plan.name=blocks plan.pattern=00", plan + ["plan.name=blocks", "plan.pattern=00"], "trains nothing"),
        Case("plan.layers out of range", plan + ["plan.name=layers", "plan.layers=[1,9]"], "out of range"),
        Case("plan.split leaves a side empty", plan + ["plan.split=0.9"], "leaves the deep side empty"),
        Case("elite without ranking", plan + ["plan.name=elite"], "plan.ranking_file is not set"),
        Case("plan.ranking_file=/bin/ls", plan + ["plan.name=elite", "plan.ranking_file=/bin/ls"],
             "is not UTF-8 text"),
        Case("ranking file missing", plan + ["plan.name=elite", f"plan.ranking_file={t / 'nope.json'}"],
             "ranking file not found"),
        Case("ranking file is a directory", plan + ["plan.name=elite", f"plan.ranking_file={t / 'adir'}"],
             "is a directory"),
        Case("ranking file broken JSON", plan + ["plan.name=elite", f"plan.ranking_file={t / 'rank_badjson.json'}"],
             "is not valid JSON"),
        Case("ranking num_layers='many'", plan + ["plan.name=elite", f"plan.ranking_file={t / 'rank_nl_text.json'}"],
             "\"num_layers\" is 'many'"),
        Case("ranking score='high'", plan + ["plan.name=elite", f"plan.ranking_file={t / 'rank_score_text.json'}"],
             "has score 'high'"),
        Case("ranking layer='two'", plan + ["plan.name=elite", f"plan.ranking_file={t / 'rank_layer_text.json'}"],
             "is not an integer"),
        Case("ranking entry without layer", plan + ["plan.name=elite", f"plan.ranking_file={t / 'rank_no_layer.json'}"],
             "needs a \"layer\""),
        Case("ranking layer twice", plan + ["plan.name=elite", f"plan.ranking_file={t / 'rank_dup.json'}"],
             "listed twice"),
        Case("plan.adapter=qlora", ["config", "validate", "plan.adapter=qlora"], "one of none, lora", owner="25"),
        Case("plan.lora_rank=0", ["config", "validate", "plan.lora_rank=0"], "an integer >= 1", owner="25"),
        Case("LoRA rank wider than a layer", plan + ["plan.name=full", "plan.adapter=lora", "plan.lora_rank=64"],
             "is larger than the layer width", owner="25"),
        Case("LoRA target the layers lack", plan + ["plan.adapter=lora", "plan.lora_targets=[qkv]"],
             "has no linear module 'qkv'", owner="25"),
        Case("LoRA under FSDP", plan + ["plan.adapter=lora", "train.num_workers=2", "train.distributed=fsdp"],
             "runs under train.distributed=ddp", owner="25"),
        Case("plan.lisa_interval=0", ["config", "validate", "plan.lisa_interval=0"], "an integer >= 1", owner="25"),
        Case("LISA draws more layers than the model has", plan + ["plan.name=lisa", "plan.lisa_layers=9"],
             "cannot draw 9 layers of a 4-layer model", owner="25"),
        Case("LISA on two workers", plan + ["plan.name=lisa", "train.num_workers=2"], "trains on one worker",
             owner="25"),
        Case("LISA period not below the step count", plan + ["plan.name=lisa", "plan.lisa_interval=8",
                                                             "train.max_steps=8"],
             "plan.lisa_interval=8 is not below train.max_steps=8", owner="38"),
        Case("learning-rate grid with a non-positive value", ["config", "validate", "sweep.lr_grid=[0.5, 0, 2]"],
             "distinct positive learning-rate multipliers", owner="38"),
        Case("contribution learning-rate grid with a negative value",
             ["config", "validate", "contribution.lr_grid=[1, -3]"], "positive learning-rate multipliers", owner="38"),
        Case("learning-rate grid value that underflows to 0", ["config", "validate", "sweep.lr_grid=[1e-320]"],
             "train.lr x 1e-320 = 0", owner="51"),
        Case("train.lr that rounds to 0 in float32", ["config", "validate", "train.lr=1e-320"], "rounds to 0",
             owner="51"),
        Case("train.seed past torch's range", ["config", "validate", "train.seed=18446744073709551616"],
             "torch.manual_seed's range", owner="51"),
        Case("sweep.seeds past torch's range", ["config", "validate", "sweep.seeds=[18446744073709551616]"],
             "torch.manual_seed's range", owner="51"),
        Case("sweep.floor_seeds past torch's range", ["config", "validate", "sweep.floor_seeds=[18446744073709551616]"],
             "torch.manual_seed's range", owner="51"),
        Case("run root component past NAME_MAX", ["config", "validate", f"tracking.run_root={t / ('r' * 300)}"],
             "NAME_MAX", owner="51"),
        Case("two grid values, one trial name", ["config", "validate", "sweep.lr_grid=[1,1.0001]"],
             "both named -lr1", owner="51"),
        # issue 51 rule 4: every path a command names, through the one bounded reader (every kind and command:
        # tests/unit/test_user_paths.py); rule 6: an export into its run (full disk: tests/unit/test_write_faults.py)
        Case("cluster check /dev/zero", ["cluster", "check", "/dev/zero"], "is a device, not a regular file",
             owner="51"),
        Case("cluster check of a FIFO nobody writes", ["cluster", "check", str(t / "fifo.yaml")], "is a FIFO",
             owner="51"),
        Case("cluster check of an alias bomb", ["cluster", "check", str(t / "bomb.yaml")], "expands to more than",
             owner="51"),
        Case("runs show /dev/zero", ["runs", "show", "/dev/zero"], "RUN_DIR /dev/zero is a device, not a folder",
             owner="51"),
        Case("runs sync of a FIFO", ["runs", "sync", str(t / "fifo.jsonl")], "is a FIFO (named pipe), not a folder",
             owner="51"),
        Case("models pull /dev/zero", ["models", "pull", "/dev/zero"], "REF /dev/zero is a device", owner="51"),
        Case("eval --tasks of a binary benchmark YAML", ["eval", rr, "--tasks", str(t / "binary.yaml")],
             "is not UTF-8 text (byte 0x80 at offset 128)", owner="51"),
        Case("trace --prompts of a FIFO", ["trace", rr, "--prompts", str(t / "fifo.yaml")], "--prompts", owner="51"),
        Case("contribution --against /dev/zero", ["contribution", rr, "--against", "/dev/zero"],
             "--against /dev/zero is a device", owner="51"),
        Case("compare --sweep of a file", ["compare", rr, "--sweep", str(t / "binary.bin")], "not a folder",
             owner="51"),
        Case("data.corpus a FIFO nobody writes", ["data", "prepare", rr, f"data.corpus=[{t / 'fifo.jsonl'}]"],
             "is a FIFO", owner="51"),
        Case("runs export into the trial's own final_model", ["runs", "export", str(t / "runs41/sweep-s-1/trials/b"),
                                                              str(t / "runs41/sweep-s-1/trials/b/train/final_model/x")],
             "the folder being exported: nothing was written", owner="51"),
        Case("ELO plan on a model without the layers it names", plan + ["plan.name=elo", "plan.elo_layers=3"],
             "trains the first and the last 3 layers, 6 of this 4-layer model's 4", owner="38"),
        Case("Spectrum matrix the layer lacks", plan + ["plan.name=spectrum", "plan.matrices=[1.mlp.nope]"],
             "layer 1 has no module 'mlp.nope'", owner="38"),
        Case("plan.expand_blocks=0", ["config", "validate", "plan.expand_blocks=0"], "an integer >= 1", owner="25"),
        Case("block expansion beyond the depth", plan + ["plan.name=expand", "plan.expand_blocks=5"],
             "inserts between 1 and 4 blocks", owner="25"),
        Case("data.replay.ratio=1", ["config", "validate", "data.replay.ratio=1", "data.replay.corpus=[x.jsonl]"],
             "a share in [0, 1)", owner="25"),
        Case("data.replay.ratio=-0.25", ["config", "validate", "data.replay.ratio=-0.25"], "a share in [0, 1)",
             owner="25"),
        Case("data.replay without a corpus", ["config", "validate", "data.replay.ratio=0.25"],
             "data.replay.corpus", owner="25"),
        Case("select --k 0", ["select", f"model.ref={m}", rr, "--method", "snr", "--k", "0"],
             "expected an integer from 1 to 4", owner="25"),
        Case("select --k beyond the depth", ["select", f"model.ref={m}", rr, "--method", "random", "--k", "5"],
             "expected an integer from 1 to 4", owner="25"),
        Case("select unknown method", ["select", f"model.ref={m}", rr, "--method", "shortgpt"],
             "one of bi, snr, layertracer, random, elo, gradnorm", owner="25"),
        Case("sweep --budget below one layer", ["sweep", f"model.ref={m}", rr, "--budget", "5"],
             "below one layer's parameters", owner="25"),
        Case("sweep --budget above the model", ["sweep", f"model.ref={m}", rr, "--budget", "999999999"],
             "above the model's", owner="25"),
        Case("ranking for a 9-layer model", plan + ["plan.name=elite", f"plan.ranking_file={t / 'rank_nl9.json'}"],
             "is for a 9-layer model"),
        Case("ranking empty", plan + ["plan.name=elite", f"plan.ranking_file={t / 'rank_empty.json'}"],
             "needs a non-empty"),
        Case("plan.k beyond the ranking", plan + ["plan.name=elite", f"plan.ranking_file={t / 'rank_ok.json'}",
                                                  "plan.k=9"], "lists only 4 layers"),
        Case("model.ref missing folder", ["plan", "show", f"model.ref={t / 'nope'}", rr], "nope"),
        Case("model.ref is a binary file", ["plan", "show", f"model.ref={t / 'binary.bin'}", rr], ""),
        # contribution --spearman
        Case("--spearman one file", ["contribution", "--spearman", str(t / "rank_ok.json")], "exactly two"),
        Case("--spearman binary file", ["contribution", "--spearman", f"{t / 'binary.json'},{t / 'rank_ok.json'}"],
             "is not UTF-8 text"),
        Case("--spearman a directory", ["contribution", "--spearman", f"{t / 'adir'},{t / 'rank_ok.json'}"],
             "is a directory"),
        Case("contribution elite control: 2 x elite_k > scanned layers",
             ["contribution", f"model.ref={m}", rr, "--layers", "0,1,2", "contribution.elite_lr_control=true",
              "contribution.elite_k=2"], "needs 2 x 2 = 4 scanned layers; the scan has 3", owner="25"),
        # compare
        Case("compare X X", ["compare", m, m, "-c", rr], "are the same model"),
        Case("compare X X (one via ./)", ["compare", m, m + "/.", "-c", rr], "are the same model"),
        Case("compare with one model", ["compare", m, "-c", rr], "compare needs BASE and TUNED"),
        Case("compare --alpha 0", ["compare", m, m, "--alpha", "0", "-c", rr], "compare.alpha=0.0"),
        Case("compare --prompts a directory", ["compare", m, f["model2"], "--prompts", str(t / "adir"), "-c", rr],
             "is a directory"),
        Case("compare --prompts binary", ["compare", m, f["model2"], "--prompts", str(t / "binary.jsonl"), "-c", rr],
             "is not UTF-8 text"),
        Case("compare --sweep and models", ["compare", m, m, "--sweep", str(t / "adir"), "-c", rr], "not both"),
        # eval
        Case("eval --checkpoints ','", ["eval", rr, "--checkpoints", ","], "no checkpoint given"),
        Case("eval --modes fast", ["eval", rr, "--modes", "fast"], "one of logit, generate"),
        Case("eval --tasks a directory", ["eval", rr, f"model.ref={m}", "--tasks", str(t / "adir")], ""),
        Case("eval --tasks binary .jsonl", ["eval", rr, f"model.ref={m}", "--tasks", str(t / "binary.jsonl")], ""),
        # trace
        Case("trace --prompts missing", ["trace", f"model.ref={m}", rr, "--prompts", str(t / "nope.jsonl")],
             "prompt file not found"),
        Case("trace --prompts a directory", ["trace", f"model.ref={m}", rr, "--prompts", str(t / "adir")],
             "is a directory"),
        Case("trace --prompts binary", ["trace", f"model.ref={m}", rr, "--prompts", str(t / "binary.jsonl")],
             "is not UTF-8 text"),
        Case("trace --splits a,b", ["trace", f"model.ref={m}", rr, "--splits", "a,b"], "is not a number"),
        # sweep
        Case("sweep --splits ,", ["sweep", rr, "--splits", ","], "no values given"),
        Case("sweep --splits x", ["sweep", rr, "--splits", "x"], "is not a number"),
        Case("sweep.seeds=[]", ["sweep", rr, "sweep.seeds=[]"], "a non-empty list of distinct integers", owner="15"),
        Case("duplicate seeds", ["sweep", rr, "sweep.seeds=[0,1,0]"], "seed 0 is listed twice", owner="15"),
        Case("non-integer seed", ["sweep", rr, "sweep.seeds=[0,x]"], "sweep.seeds", owner="15"),
        Case("cloze on cmmlu", ["sweep", rr, "eval.tasks=[cmmlu]", "eval.modes=[cloze]"], "has no cloze variant",
             owner="15"),
        Case("data_dir missing a subject", ["eval", rr, f"model.ref={m}", "eval.tasks=[ceval]",
                                            f"eval.data_dir={ROOT / 'tests' / 'data'}"], "accountant_val.csv", owner="15"),
        # hybrid
        Case("hybrid build --out non-empty", ["hybrid", "build", str(t / "hybrid.yaml"), "--out", str(t / "out")],
             "already exists and is not empty"),
        # ui
        Case("ui on a busy port", ["ui", rr, "--port", str(f["busy_port"])], "is not free"),
        Case("ui --port 0", ["ui", rr, "--port", "0"], "not a TCP port"),
        Case("ui --port 70000", ["ui", rr, "--port", "70000"], "not a TCP port"),
        # CLI usage
        Case("unknown command", ["trian"], "No such command", owner="16"),
        Case("unknown option", ["train", "--bogus"], "No such option", owner="16"),
        # train (these start Ray)
        Case("a JSONL text field holding a number", ["data", "prepare", f"model.ref={m}", rr,
                                                     f"data.corpus=[{t / 'intfield.jsonl'}]"],
             "field 'text' is a number (12345), not a string"),
        Case("a Parquet text column of int64", ["data", "prepare", f"model.ref={m}", rr,
                                                f"data.corpus=[{t / 'ints.parquet'}]"],
             "column 'text' is of type int64, not a string column"),
        Case("train empty corpus", train + [f"data.corpus=[{t / 'empty.jsonl'}]"], "gives no full", ray=True),
        Case("train --resume without an earlier run", train + ["name=never", "--resume"],
             "no earlier 'train' run named 'never'", ray=True),
        Case("train seq_len beyond the model", train + ["data.seq_len=4096"], "beyond this model's limit", ray=True),
        Case("train a binary corpus named .txt", train + [f"data.corpus=[{t / 'binary.txt'}]"], "", ray=True,
             owner="12"),
        Case("train corpus is a directory", train + [f"data.corpus=[{t / 'adir'}]"], "is a directory", ray=True,
             owner="12"),
        Case("train unreachable tracking.uri", train + ["tracking.uri=http://127.0.0.1:9"], "", ray=True,
             owner="13"),
    ]
    return c + issue27_cases(f) + issue41_cases(f) + issue51_record_cases(f)


def issue27_cases(f: dict) -> list[Case]:
    """Issue 27: every failure path ends with one line (what is left behind is checked by
    tests/integration/test_failure_paths.py)."""
    t, m, runs = f["tmp"], f["model"], f["runs"]
    rr = f"tracking.run_root={runs}"
    hy = ["hybrid", "build", str(t / "hybrid.yaml")]
    port = f["free_port"]
    return [
        Case("hybrid build --out FILE", hy + ["--out", str(t / "an_out_file")], "is a regular file, not a folder", owner="27"),
        Case("hybrid build --out DIR --overwrite, a file at DIR/new_shallow",
             hy + ["--out", str(t / "out2"), "--overwrite"], "new_shallow is a file, not a folder", owner="27"),
        Case("eval a folder without weights", ["eval", rr, "--checkpoints", str(t / "noweights")],
             "has config.json but no weights", owner="27"),
        Case("eval a checkpoint its manifest disagrees with", ["eval", rr, "--checkpoints", str(t / "truncated")],
             "fails its manifest check: model.safetensors has", owner="27"),
        Case("eval pickle weights (.bin)", ["eval", rr, "--checkpoints", str(t / "pickled")],
             "pytorch_model.bin is pickle weights, which raycpt never loads", owner="27"),
        Case("ui on a corrupt mlflow.db", ["ui", f"tracking.run_root={t / 'corrupt_runs'}", "--port", port],
             "the MLflow store cannot be opened", owner="27"),
        Case("train on a corrupt mlflow.db", ["train", f"model.ref={m}", f"tracking.run_root={t / 'corrupt_runs'}",
                                              f"data.corpus=[{t / 'small.jsonl'}]", "data.seq_len=32",
                                              "train.max_steps=2", "train.num_workers=1"],
             "the MLflow store cannot be opened", owner="27"),
        Case("tracking.uri naming a text file", ["ui", rr, f"tracking.uri=sqlite:///{t / 'notes.txt'}", "--port",
                                                 port], "file is not a database", owner="27"),
        Case("tracking.uri postgresql:// without its driver",
             ["ui", rr, "tracking.uri=postgresql://me:secret@127.0.0.1:1/db", "--port", port],
             "its database driver is not installed", owner="27"),
        Case("tracking.uri mysql:// without its driver", ["ui", rr, "tracking.uri=mysql://me@127.0.0.1:1/db",
                                                          "--port", port], "its database driver is not installed",
             owner="27"),
        Case("trace on four identical prompts", ["trace", f"model.ref={m}", rr, "--prompts",
                                                 str(t / "dup_prompts.jsonl")], "line 2 repeats line 1", owner="27"),
        Case("models pull a broken .gguf", ["models", "pull", str(t / "broken.gguf"), "--cache-dir",
                                            str(t / "cache")], "transformers cannot load broken.gguf", owner="27"),
        Case("tracking.run_root=~ (YAML null)", ["config", "validate", "tracking.run_root=~"],
             "YAML reads a bare ~ or an empty value as null", owner="27"),
        Case("train.num_workers beyond the cluster's CPUs", ["train", f"model.ref={m}", rr, "data.seq_len=32",
                                                             "train.max_steps=2", "train.num_workers=16",
                                                             "ray.num_cpus=2", f"data.corpus=[{t / 'small.jsonl'}]"],
             "train.num_workers=16", ray=True, owner="27"),
        Case("train, the disk full at a checkpoint (simulated ENOSPC)",
             ["train", f"model.ref={m}", f"tracking.run_root={t / 'enospc_runs'}", "data.seq_len=32",
              "train.max_steps=2", "train.num_workers=1", "train.max_failures=0", f"data.corpus=[{t / 'small.jsonl'}]"],
             "No space left on device (ENOSPC)", ray=True, owner="27",
             env={"RAYCPT_FAULTS": json.dumps({"oserror_step": 2, "oserror_errno": "ENOSPC"})}),
        *[Case(f"train, {what} at a checkpoint with train.max_failures=2 (simulated {code}: not retried)",
               ["train", f"model.ref={m}", f"tracking.run_root={t / (code.lower() + '_retry_runs')}", "data.seq_len=32",
                "train.max_steps=2", "train.num_workers=1", "train.max_failures=2", f"data.corpus=[{t / 'small.jsonl'}]"],
               f"({code})", ray=True, owner="27",
               env={"RAYCPT_FAULTS": json.dumps({"oserror_step": 2, "oserror_errno": code})})
          for what, code in (("the disk full", "ENOSPC"), ("a read-only file system", "EROFS"),
                             ("a run root this user may not write", "EACCES"))],
        Case("runs sync a folder that is not a run folder", ["runs", "sync", str(t / "adir")],
             "is not a raycpt run folder (it has no config.yaml)", owner="27"),
        Case("runs sync a contribution folder while its tracking server is still gone",
             ["runs", "sync", str(t / "contribution-lost")], "no MLflow server answers", owner="27"),
        Case("runs show a folder that is not a sweep folder", ["runs", "show", str(t / "adir")],
             "has no summary/summary.json", owner="37"),
        Case("runs show a folder that does not exist", ["runs", "show", str(t / "no-such-run")],
             "RUN_DIR not found", owner="37"),
        Case("sweep.general_docs negative", ["config", "validate", "sweep.general_docs=-1"],
             "sweep.general_docs", owner="37"),
    ]


def _issue41_fixtures(tmp: Path, f: dict) -> None:
    """Issue 41's fixtures: a FIFO, a corpus with one over-long line, replay corpora, a train folder whose checkpoint
    read another pack of the replay corpus, a finished sweep folder, a finished train folder with an older result,
    a sweep folder that lost a trial, model folders with a cut-short or unlisted weight file, two trials sharing a
    base shard damaged through one of them, a config that does not belong to its weights."""
    import shutil

    import torch
    import yaml

    sys.path.insert(0, str(ROOT))
    from raycpt.config import load_config, save_config
    from raycpt.models.shards import ensure_base_shards
    from raycpt.runs.folder import write_state
    from raycpt.runs.run import Run
    from raycpt.train.ckpt.manifest import write_manifest
    from raycpt.train.driver.publish import publish_model

    tiny, r41 = Path(f["model"]), tmp / "runs41"
    os.mkfifo(tmp / "fifo.yaml")
    (tmp / "longline.jsonl").write_text(json.dumps({"text": "x" * (5 << 20)}) + "\n")
    (tmp / "replay.jsonl").write_text("".join(json.dumps({"text": f"general text {i}"}) + "\n" for i in range(300)))
    (tmp / "short_replay.jsonl").write_text(json.dumps({"text": "one"}) + "\n")
    small = tmp / "small.jsonl"
    f["train41"] = ["train", f"model.ref={tiny}", f"tracking.run_root={r41}", f"data.corpus=[{small}]",
                    "data.seq_len=32", "train.max_steps=2", "train.num_workers=1"]
    replay = ["data.replay.ratio=0.25", f"data.replay.corpus=[{tmp / 'replay.jsonl'}]"]
    # a train run interrupted after step 2; its checkpoint read another pack of the replay corpus
    cfg = load_config(None, f["train41"][1:] + replay + ["name=replayed"])
    run = r41 / "train-replayed-0001"
    ckpt = run / "ray" / "a1" / "checkpoint_000002"
    shutil.copytree(tiny, ckpt / "model")
    torch.save({}, ckpt / "train_state.pt")
    (ckpt / "train_state.json").write_text(json.dumps({"step": 2, "data": {
        "replay_store_identity": "the pack before the replay corpus was edited"}}))
    write_manifest(ckpt, 2, finite=True)
    save_config(cfg, run / "config.yaml")
    write_state(run, command="train", status="interrupted", mlflow_run_id="0" * 32)
    (run / "records.jsonl").write_text("")  # a real run folder has its record (issue 51 rule 2 refuses one without)
    # two trials of one run root publishing by reference; a byte of the shared rest shard flipped through trial a
    shards = ensure_base_shards(tiny, r41 / "base_shards", "float32")
    for name in ("a", "b"):
        publish_model(ckpt, r41 / "sweep-s-1" / "trials" / name / "train" / "final_model", base_shards=shards)
    rest = shards / "rest.safetensors"
    rest.chmod(0o644)
    with open(r41 / "sweep-s-1" / "trials" / "a" / "train" / "final_model" / "rest.safetensors", "r+b") as fh:
        fh.seek(-1, 2)
        last = fh.read(1)
        fh.seek(-1, 2)
        fh.write(bytes([last[0] ^ 0xFF]))
    f["trial_b"] = str(r41 / "sweep-s-1" / "trials" / "b" / "train" / "final_model")
    # a finished sweep folder made with train.lr=3e-05 (resumed below with another)
    f["sweep41"] = ["sweep", f"model.ref={tiny}", f"tracking.run_root={r41}", f"data.corpus=[{small}]",
                    "data.seq_len=32", "train.max_steps=2", "sweep.trace_first=false", "eval.limit=4", "name=done"]
    done = r41 / "sweep-done-0001"
    save_config(load_config(None, f["sweep41"][1:] + ["train.lr=3e-05"]), done / "config.yaml")
    write_state(done, command="sweep", status="finished", mlflow_run_id="1" * 32)
    (done / "records.jsonl").write_text("")
    # a finished train run whose train_result.json is older: no tokens_per_s, no trainable_params
    old = r41 / "train-older-0001"
    shutil.copytree(tiny, old / "final_model")
    write_manifest(old / "final_model", 2, finite=True)
    save_config(load_config(None, f["train41"][1:] + ["name=older"]), old / "config.yaml")
    write_state(old, command="train", status="finished")
    moved = r41 / "train-moved-0001"  # a finished run folder whose MLflow run is not in this run root's store
    shutil.copytree(old, moved, symlinks=True)
    save_config(load_config(None, f["train41"][1:] + ["name=moved"]), moved / "config.yaml")
    write_state(moved, mlflow_run_id="2" * 32)
    (moved / "records.jsonl").write_text("")
    (old / "train_result.json").write_text(json.dumps({"final_model_dir": str(old / "final_model"), "losses": [4.0],
                                                       "steps": [1], "wall_s": 1.0, "frozen_params": 0,
                                                       "plan": {"name": "full"}}))
    # a finished sweep folder (records only, its store empty) whose trial folder and summary file were deleted
    lost = tmp / "lost-sweep"
    lcfg = load_config(None, [f"tracking.run_root={tmp / 'lost_runs'}"])
    save_config(lcfg, lost / "config.yaml")
    write_state(lost, command="sweep", status="finished", run_name="sweep-lost")
    top = Run(lcfg, "sweep", lost, None, None, False, None)
    top.note_children([(lost / "trials" / "full", "trial.json")])
    (lost / "summary").mkdir()
    (lost / "summary" / "summary.json").write_text("{}")
    top.log_artifact(lost / "summary" / "summary.json", "summary")
    (lost / "summary" / "summary.json").unlink()
    # model folders: a weight file cut short (no manifest), an unlisted weight file beside a manifest
    shutil.copytree(tiny, tmp / "cut_plain")
    w = tmp / "cut_plain" / "model.safetensors"
    with open(w, "r+b") as fh:
        fh.truncate(w.stat().st_size - 100)
    shutil.copytree(tiny, tmp / "stray")
    write_manifest(tmp / "stray", 2, finite=True)
    shutil.copy(tiny / "model.safetensors", tmp / "stray" / "extra.safetensors")
    with open(tmp / "stray" / "extra.safetensors", "r+b") as fh:
        fh.truncate(1000)
    shutil.copytree(tiny, tmp / "odd_config")
    conf = json.loads((tmp / "odd_config" / "config.json").read_text())
    (tmp / "odd_config" / "config.json").write_text(json.dumps({**conf, "num_hidden_layers": 30}))
    del yaml


def issue41_cases(f: dict) -> list[Case]:
    """Issue 41: resumes that notice what changed, shared shards, one line wherever raycpt stops, bounded input.
    (Cases that are processes dying mid-run besides Ray's own - a run root made immutable, a full tmpfs holding
    the store - and the right results - two syncs at once, a sync into another store then a resume - are
    tests/integration/test_outside_faults3_processes.py's.)"""
    t, m = f["tmp"], f["model"]
    r41, train, sweep = t / "runs41", f["train41"], f["sweep41"]
    replay = ["data.replay.ratio=0.25"]
    faults = {"RAYCPT_FAULTS": json.dumps({"kill_ray_step": 2, "kill_ray_process": "gcs_server", "step_sleep": 1})}
    return [
        Case("config validate /dev/zero", ["config", "validate", "/dev/zero"], "is a device, not a regular file",
             owner="41"),
        Case("a config that is a FIFO nobody writes", ["config", "validate", str(t / "fifo.yaml")],
             "is a FIFO (named pipe), not a regular file", owner="41"),
        Case("an override key with a Cyrillic letter", ["config", "validate", "tr\u0430in.lr=1e-4"],
             "non-ASCII character '\u0430' (U+0430 CYRILLIC SMALL LETTER A)", owner="41"),
        Case("a corpus line of 5 MB", ["data", "prepare", f"model.ref={m}", f"tracking.run_root={r41}",
                                       f"data.corpus=[{t / 'longline.jsonl'}]"],
             "is a line longer than 4,194,304 bytes", owner="41"),
        Case("data.replay.corpus missing", train + replay + [f"data.replay.corpus=[{t / 'nope.jsonl'}]"],
             "data.replay.corpus: ", owner="41"),
        Case("data.replay.corpus empty", train + replay + [f"data.replay.corpus=[{t / 'empty.jsonl'}]"],
             "data.replay.corpus [", owner="41"),
        Case("data.replay.corpus too short", train + replay + [f"data.replay.corpus=[{t / 'short_replay.jsonl'}]"],
             "data.replay.corpus [", owner="41"),
        Case("train --resume after the replay corpus was re-packed",
             train + replay + [f"data.replay.corpus=[{t / 'replay.jsonl'}]", "name=replayed", "--resume"],
             "(data.replay.corpus: corpus the pack before", owner="41"),
        Case("sweep --resume of a finished sweep with another train.lr", sweep + ["train.lr=1e-3", "--resume"],
             "train.lr: 3e-05 -> 0.001", ray=True, owner="41"),
        Case("train --resume of a finished run whose train_result.json is older", train + ["name=older", "--resume"],
             "train_result.json lacks tokens_per_s, trainable_params", ray=True, owner="41"),
        Case("train --resume of a folder whose MLflow run is not in the store", train + ["name=moved", "--resume"],
             "names is not in the store", owner="41"),
        Case("runs sync of a finished sweep that lost a trial folder and its summary",
             ["runs", "sync", str(t / "lost-sweep")], "the folder lacks 2 thing(s)", owner="41"),
        Case("eval of a trial whose shared base shard was damaged through another trial",
             ["eval", f"tracking.run_root={r41}", "--checkpoints", f["trial_b"]], "which is damaged (shared by 2",
             owner="41"),
        Case("eval of a folder whose weight file is cut short (no manifest)",
             ["eval", f"tracking.run_root={r41}", "--checkpoints", str(t / "cut_plain")],
             "its header lays out", owner="41"),
        Case("eval of a verified folder with a cut-short weight file beside it",
             ["eval", f"tracking.run_root={r41}", "--checkpoints", str(t / "stray")],
             "extra.safetensors is not in its manifest", owner="41"),
        Case("a config.json that does not belong to its weights", ["plan", "show", f"model.ref={t / 'odd_config'}",
                                                                   f"tracking.run_root={r41}"],
             "config.json declares 30 decoder layers, its weights hold 4", owner="41"),
        Case("runs export of a folder with no model", ["runs", "export", str(t / "adir"), str(t / "exported")],
             "holds no published model", owner="41"),
        Case("kill -9 of the private Ray's gcs_server mid-train (test fault)",
             ["train", f"model.ref={m}", f"tracking.run_root={t / 'gcs_runs'}", f"data.corpus=[{t / 'small.jsonl'}]",
              "data.seq_len=32", "train.max_steps=6", "train.num_workers=1"],
             "error: Ray's own gcs_server", ray=True, owner="41", env=faults),
    ]


def _issue51_record_fixtures(tmp: Path) -> None:
    """Issue 51's run folders (records only, no store): a sealed records.jsonl changed in its middle line, one whose
    top-level records.jsonl was deleted, one with non-UTF-8 bytes, one with a record of the wrong shape."""
    sys.path.insert(0, str(ROOT))
    from raycpt.config import load_config, save_config
    from raycpt.runs.folder import write_state
    from raycpt.runs.run import Run

    cfg = load_config(None, [f"tracking.run_root={tmp / 'runs51'}"])
    for name in ("r51-changed", "r51-missing", "r51-bytes", "r51-shape"):
        folder = tmp / name
        save_config(cfg, folder / "config.yaml")
        write_state(folder, command="sweep", status="finished", mlflow_run_id="5" * 32)
        run = Run(cfg, "sweep", folder, None, None, False, None)
        for step in (1, 2, 3):
            run.log_metrics({"loss": 4.0 - step}, step=step)
    rec = tmp / "r51-changed" / "records.jsonl"
    rec.write_text(rec.read_text().replace('"loss": 2.0', '"loss": 2.5'))
    (tmp / "r51-missing" / "records.jsonl").unlink()
    with open(tmp / "r51-bytes" / "records.jsonl", "ab") as fh:
        fh.write(b'{"metrics": {"loss": \xff}}\n')
    with open(tmp / "r51-shape" / "records.jsonl", "a") as fh:
        fh.write('{"points": 5}\n')


def issue51_record_cases(f: dict) -> list[Case]:
    """Issue 51, rule 2: a run folder's record is checked before runs sync, runs show or --resume trusts it."""
    t = f["tmp"]
    return [
        Case("runs sync of a folder whose records.jsonl has a changed middle line",
             ["runs", "sync", str(t / "r51-changed")], "line 2 is damaged: its checksum does not match", owner="51"),
        Case("runs sync of a sweep whose top-level records.jsonl was deleted", ["runs", "sync", str(t / "r51-missing")],
             "records.jsonl is missing though state.json names its run", owner="51"),
        Case("runs sync of a records.jsonl with non-UTF-8 bytes", ["runs", "sync", str(t / "r51-bytes")],
             "line 4 is damaged: not UTF-8", owner="51"),
        Case("runs show of a folder with a record of the wrong shape", ["runs", "show", str(t / "r51-shape")],
             "line 4 is damaged: a points record of the wrong shape", owner="51"),
    ]


def run_case(case: Case, env: dict, timeout: float = 600) -> dict:
    exe = Path(sys.executable).with_name("raycpt")
    try:
        r = subprocess.run([str(exe), *case.args], capture_output=True, text=True, timeout=timeout,
                           env={**env, **case.env})
        rc, err = r.returncode, r.stderr
    except subprocess.TimeoutExpired as e:
        rc, err = "timeout", (e.stderr or b"").decode() if isinstance(e.stderr, bytes) else (e.stderr or "")
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    last = lines[-1] if lines else ""
    ok = rc == 2 and len(lines) == 1 and "Traceback" not in err and case.expect in last
    return {"label": case.label, "rc": rc, "lines": len(lines), "line": last, "ok": ok, "owner": case.owner}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fast", action="store_true", help="skip the cases that start Ray")
    ap.add_argument("--markdown", help="also write the table to this file")
    ap.add_argument("--all", action="store_true", help="also the cases other issues own (12: corpus, 13: tracking "
                                                       "server, 16: CLI usage errors, 25, 27, 41, ...)")
    a = ap.parse_args(argv)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    env.pop("RAY_ADDRESS", None)
    with tempfile.TemporaryDirectory(prefix="raycpt-bad-") as tmp:
        f = fixtures(Path(tmp))
        rows = [run_case(c, env) for c in cases(f) if not (a.fast and c.ray) and (a.all or c.owner == "19")]
        kept = (Path(tmp) / "out" / "new_shallow" / "my_notes.txt").read_text() == "the user's file"
    out = ["| # | input | exit | stderr lines | line |", "|---|---|---|---|---|"]
    for i, r in enumerate(rows, 1):
        flag = ("" if r["ok"] else " **(!)**") + ("" if r["owner"] == "19" else f" (issue {r['owner']})")
        out.append(f"| {i} | {r['label']} | {r['rc']} | {r['lines']} | `{r['line'][:220]}`{flag} |")
    bad = [r for r in rows if not r["ok"]]
    out.append(f"\n{len(rows) - len(bad)} of {len(rows)} bad inputs: exit 2 and one line; the user's file under "
               f"--out {'kept' if kept else 'LOST'}")
    text = "\n".join(out)
    print(text)
    if a.markdown:
        Path(a.markdown).write_text(text + "\n")
    return 1 if bad or not kept else 0


if __name__ == "__main__":
    sys.exit(main())
