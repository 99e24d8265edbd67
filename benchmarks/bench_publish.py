"""What verified checkpoints and a non-aliased final_model/ cost on the default model (~540 MB).

    python benchmarks/bench_publish.py [--model FOLDER] [--repeats 3]

Side by side, interleaved (so contention hits all alike), on a checkpoint-shaped folder of the
default model's float32 safetensors: the manifest (sha256 of every file, written once per
checkpoint), the verification a resume/publish does, the publish itself (reflink where the
filesystem can, else a byte copy, then a sha256 check of the copy) and the old hard-link publish.
Ends with ``RESULT`` lines; the targets are budgets for a 40-step run of the default sweep (a
publish under 15 s; verification under 10 s on this 2-core machine)."""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _smoke import add_smoke, smoke  # noqa: E402

from raycpt.train.ckpt.manifest import _VERIFIED, verify_checkpoint, write_manifest  # noqa: E402
from raycpt.train.driver.publish import publish_model  # noqa: E402


def default_model() -> Path:
    root = Path(os.environ.get("RAYCPT_CACHE", Path.home() / ".cache" / "raycpt")) / "models"
    for d in sorted(root.glob("smollm2-135m*")):
        if (d / "config.json").is_file():
            return d
    raise SystemExit(f"no default model under {root}: run `raycpt models pull` first")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None)
    ap.add_argument("--repeats", type=int, default=3)
    add_smoke(ap)
    a = smoke(ap.parse_args(argv), repeats=1)
    src = Path(a.model) if a.model else default_model()
    with tempfile.TemporaryDirectory(prefix="bench-publish-", dir=os.environ.get("BENCH_DIR")) as tmp:
        ck = Path(tmp) / "checkpoint_000040"
        shutil.copytree(src, ck / "model")
        (ck / "train_state.json").write_text('{"step": 40}')
        (ck / "train_state.pt").write_bytes(b"0" * 16)
        size = sum(p.stat().st_size for p in ck.rglob("*") if p.is_file())
        t = {"manifest": [], "verify": [], "publish": [], "hardlink": []}
        how = None
        for i in range(a.repeats):
            t0 = time.perf_counter()
            write_manifest(ck, 40, finite=True)
            t["manifest"].append(time.perf_counter() - t0)
            _VERIFIED.clear()
            t0 = time.perf_counter()
            assert verify_checkpoint(ck) is None
            t["verify"].append(time.perf_counter() - t0)
            dest = Path(tmp) / f"final_model_{i}"
            info = publish_model(ck, dest)
            t["publish"].append(info["seconds"])
            how = info["how"]
            t0 = time.perf_counter()
            shutil.copytree(ck / "model", Path(tmp) / f"linked_{i}", copy_function=os.link)
            t["hardlink"].append(time.perf_counter() - t0)
            shutil.rmtree(dest)
            shutil.rmtree(Path(tmp) / f"linked_{i}")
    med = {k: statistics.median(v) for k, v in t.items()}
    print(f"checkpoint of {size / 1e6:.0f} MB ({src.name}); publish by {how}; medians of {a.repeats}:")
    for k, v in med.items():
        print(f"  {k:9s} {v:6.2f} s  ({size / 1e6 / max(v, 1e-9):7.0f} MB/s)")
    print(f"RESULT publish_copy_s {med['publish']:.2f} target <= 15 {'PASS' if med['publish'] <= 15 else 'FAIL'}")
    print(f"RESULT verify_s {med['verify']:.2f} target <= 10 {'PASS' if med['verify'] <= 10 else 'FAIL'}")
    print(f"RESULT hardlink_publish_s {med['hardlink']:.3f} (the old way, for comparison)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
