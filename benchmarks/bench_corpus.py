#!/usr/bin/env python
"""Does the corpus path scale? Pack once at the tokenizer's speed; first step and memory flat in corpus size.

Synthetic English JSONL corpora (documents stitched from the shipped WordNet glosses, seeded) of
``--sizes`` MB (default 5, 40, 160) are written to a temp folder. Then, per size, interleaved:

* **pack**: ``raycpt data prepare`` (the whole console command: start-up, Ray, Ray Data tasks,
  written store) against the **plain** ceiling: one plain Python process that reads the same JSONL,
  ``json.loads`` every line and encodes the documents in batches of 1024 with the same fast tokenizer
  (Rust ``encode_batch_fast``, its own threads: ``TOKENIZERS_PARALLELISM=true``), counting tokens plus
  one EOS per document. Both are timed from process start to exit; tokens/s = tokens / wall.
* **first step**: ``raycpt train configs/default.yaml data.corpus=[FILE] data.max_documents=null
  train.max_steps=2`` with the pack cached (the store from the pack run): seconds from command start
  until the first step's record appears in the run's ``train_metrics.jsonl``, and the peak resident
  memory of the whole job (sum of RSS over the command's process tree - the driver, the Ray
  processes it starts, every Ray worker - polled every 0.2 s with psutil).

Prints a table and::

    RESULT corpus_pack_ratio <ours/plain tokens/s at the largest size> target >= 0.8 PASS|FAIL
    RESULT corpus_first_step_growth <t(largest)/t(smallest)> target <= 1.2 PASS|FAIL
    RESULT corpus_memory_growth <m(largest)/m(smallest)> target <= 1.2 PASS|FAIL

Run: ``python benchmarks/bench_corpus.py [--sizes 5,40,160] [--model REF] [--keep]``.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _smoke import add_smoke, smoke

ROOT = Path(__file__).resolve().parent.parent
PLAIN = r"""
import json, sys, time
from transformers import AutoTokenizer
path, tok_path = sys.argv[1], sys.argv[2]
backend = AutoTokenizer.from_pretrained(tok_path).backend_tokenizer
tokens, batch = 0, []
def flush():
    global tokens
    tokens += sum(len(e.ids) + 1 for e in backend.encode_batch_fast(batch, add_special_tokens=False))
    batch.clear()
with open(path, encoding="utf-8") as f:
    for line in f:
        if line.strip():
            t = json.loads(line)["text"]
            if t.strip():
                batch.append(t)
                if len(batch) == 1024:
                    flush()
flush()
print(json.dumps({"tokens": tokens}))
"""


def make_corpus(path: Path, mb: float, seed: int = 0) -> int:
    """Documents of 3-12 glosses each, seeded; stops once the file has ``mb`` MB. Returns documents."""
    import random

    from raycpt.data.corpus import GLOSSES

    with gzip.open(GLOSSES, "rt", encoding="utf-8") as f:
        glosses = [json.loads(line)["text"] for line in f if line.strip()]
    rng = random.Random(seed)
    target, n = mb * 1_000_000, 0
    with open(path, "w", encoding="utf-8") as out:
        while out.tell() < target:
            out.write(json.dumps({"text": " ".join(rng.choices(glosses, k=rng.randint(3, 12)))}) + "\n")
            n += 1
    return n


def env() -> dict:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "RAY_USAGE_STATS_ENABLED": "0", "TOKENIZERS_PARALLELISM": "false",
            "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}


def tree_rss(pid: int) -> int:
    import psutil

    try:
        procs = [psutil.Process(pid)]
        procs += procs[0].children(recursive=True)
    except psutil.Error:
        return 0
    total = 0
    for p in procs:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass
    return total


def timed(cmd: list[str], extra_env: dict | None = None, watch: Path | None = None, timeout: float = 1800
          ) -> dict:
    """Run ``cmd``; wall seconds, peak tree RSS, stdout, and (``watch``: a glob root) the seconds until a
    step record first appears in a ``train_metrics.jsonl`` under it."""
    t0 = time.time()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**env(), **(extra_env or {})})
    peak, first = 0, None
    import threading

    out: dict = {}
    reader = threading.Thread(target=lambda: out.update(zip(("stdout", "stderr"), p.communicate())))
    reader.start()
    while reader.is_alive() and time.time() - t0 < timeout:
        peak = max(peak, tree_rss(p.pid))
        if watch is not None and first is None:
            for m in watch.glob("*/train_metrics.jsonl"):
                if '"loss"' in m.read_text():
                    first = time.time() - t0
        reader.join(0.2)
    if reader.is_alive():
        p.kill()
        reader.join()
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[:4])} ... failed ({p.returncode}): {out.get('stderr', '')[-2000:]}")
    return {"wall": time.time() - t0, "peak": peak, "first_step": first, "stdout": out.get("stdout", "")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="5,40,160", help="corpus sizes in MB")
    ap.add_argument("--model", default=None, help="model reference (default: the embedded SmolLM2)")
    ap.add_argument("--keep", action="store_true", help="keep the temp folder")
    add_smoke(ap)
    # one size (the growth ratios are then 1), with enough documents (~500) that a rule leaving some out of the
    # store (data.heldout_share: 1% of documents) would break the token-count assertion here as in the full run
    args = smoke(ap.parse_args(), sizes="0.5")
    sizes = [float(s) for s in args.sizes.split(",")]

    from raycpt.config import load_config
    from raycpt.data.store import list_stores
    from raycpt.train.driver.prepare import resolve_model_path

    over = [f"model.ref={args.model}"] if args.model else []
    tok_path = resolve_model_path(load_config(str(ROOT / "configs/default.yaml"), over))
    work = Path(tempfile.mkdtemp(prefix="bench-corpus-"))
    raycpt = str(Path(sys.executable).parent / "raycpt")
    rows = []
    try:
        for mb in sizes:
            corpus = work / f"corpus-{mb}mb.jsonl"
            docs = make_corpus(corpus, mb)
            # every document packed, as the plain reader reads every one (the default holds 1% out of the store)
            base = [str(ROOT / "configs/default.yaml"), f"data.corpus=[{corpus}]", "data.max_documents=null",
                    "data.heldout_share=0", f"tracking.run_root={work / f'runs-{mb}'}",
                    f"data.store_dir={work / f'store-{mb}'}"] + over
            plain = timed([sys.executable, "-c", PLAIN, str(corpus), tok_path], {"TOKENIZERS_PARALLELISM": "true"})
            plain_tokens = json.loads(plain["stdout"].strip().splitlines()[-1])["tokens"]
            ours = timed([raycpt, "data", "prepare", *base])
            (store,) = list_stores(work / f"store-{mb}")
            ours_tokens = store.manifest["tokens_read"]
            assert ours_tokens == plain_tokens, (ours_tokens, plain_tokens)  # the same documents, the same tokens
            print(f"{mb:5g} MB pack: plain {plain_tokens / plain['wall']:,.0f} tok/s ({plain['wall']:.0f}s), ours "
                  f"{ours_tokens / ours['wall']:,.0f} tok/s ({ours['wall']:.0f}s)", flush=True)
            train = timed([raycpt, "train", *base, "train.max_steps=2", "train.checkpoint_every=2"],
                          watch=work / f"runs-{mb}")
            row = {"mb": mb, "docs": docs, "tokens": ours_tokens, "plain_tok_s": plain_tokens / plain["wall"],
                   "ours_tok_s": ours_tokens / ours["wall"], "first_step_s": train["first_step"],
                   "train_wall_s": train["wall"], "peak_gb": train["peak"] / 1e9, "store_mb": store.disk_bytes() / 1e6}
            rows.append(row)
            print(f"{mb:5g} MB  {docs:9,d} docs  {ours_tokens:12,d} tokens | pack: plain {row['plain_tok_s']:9,.0f} "
                  f"tok/s  ours {row['ours_tok_s']:9,.0f} tok/s  ratio {row['ours_tok_s'] / row['plain_tok_s']:.3f}"
                  f"  store {row['store_mb']:.0f} MB | train (cached pack): first step {row['first_step_s']:.1f}s, "
                  f"wall {row['train_wall_s']:.1f}s, peak RSS {row['peak_gb']:.2f} GB", flush=True)
            shutil.rmtree(work / f"store-{mb}", ignore_errors=True)
            corpus.unlink()
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    lo, hi = rows[0], rows[-1]
    pack = hi["ours_tok_s"] / hi["plain_tok_s"]
    first = hi["first_step_s"] / lo["first_step_s"]
    mem = hi["peak_gb"] / lo["peak_gb"]
    print(f"machine: {os.cpu_count()} cores; plain tokenizer ceiling {hi['plain_tok_s']:,.0f} tokens/s at {hi['mb']} MB")
    print(f"RESULT corpus_pack_ratio {pack:.3f} target >= 0.8 {'PASS' if pack >= 0.8 else 'FAIL'}")
    print(f"RESULT corpus_first_step_growth {first:.3f} target <= 1.2 {'PASS' if first <= 1.2 else 'FAIL'}")
    print(f"RESULT corpus_memory_growth {mem:.3f} target <= 1.2 {'PASS' if mem <= 1.2 else 'FAIL'}")


if __name__ == "__main__":
    main()
