"""``raycpt data prepare`` / ``raycpt data info`` through the installed console script (subprocess):
bad corpora are one line on stderr and exit 2, with no store (complete or half-written) left; a
changed corpus is refused with the line that says how to re-pack. No Ray: every check runs
before Ray would start, and a cache hit needs none."""

import json
import os
import subprocess
import sys
from pathlib import Path


from raycpt.config import DataConfig
from raycpt.data.pack import ensure_packed
from raycpt.data.store import builds_logged, list_stores
from tiny import save_tiny

SCRIPT = str(Path(sys.executable).parent / "raycpt")


def _run(*args, cwd=None):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "RAY_ADDRESS": ""}
    return subprocess.run([SCRIPT, "data", *args], capture_output=True, text=True, timeout=300, env=env, cwd=cwd)


def _no_store_left(root: Path) -> bool:
    return not root.exists() or not [p for p in root.iterdir() if p.is_dir()]


def test_bad_corpora_are_one_line_and_leave_no_pack(tmp_path):
    tiny = save_tiny(tmp_path / "tiny")
    good = tmp_path / "good.jsonl"
    good.write_text("".join(json.dumps({"text": f"document {i}"}) + "\n" for i in range(20)))
    (tmp_path / "dir.jsonl").mkdir()
    (tmp_path / "bin.jsonl").write_bytes(bytes(range(256)) * 64)
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "nofield.jsonl").write_text(json.dumps({"body": "a"}) + "\n")
    cases = {
        "directory": (str(tmp_path / "dir.jsonl"), "is a directory"),
        "binary": (str(tmp_path / "bin.jsonl"), "is a binary file"),
        "empty": (str(tmp_path / "empty.jsonl"), "is empty"),
        "no text field": (str(tmp_path / "nofield.jsonl"), "has no field 'text' (data.text_field)"),
        "glob matching nothing": (str(tmp_path / "nothing-*.jsonl"), "matches no file"),
    }
    root = tmp_path / "runs" / "packed"
    for name, (corpus, msg) in cases.items():
        p = _run("prepare", f"model.ref={tiny}", f"data.corpus=[{corpus}]", "data.seq_len=16",
                 f"tracking.run_root={tmp_path / 'runs'}")
        err = p.stderr.strip()
        assert p.returncode == 2, (name, p.stderr[-2000:])
        assert msg in err and len(err.splitlines()) == 1 and err.startswith("error: "), (name, err)
        assert _no_store_left(root), name


def test_changed_corpus_is_refused_with_how_to_rebuild(tmp_path):
    tiny = save_tiny(tmp_path / "tiny")
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps({"text": f"document number {i}"}) + "\n" for i in range(40)))
    args = [f"model.ref={tiny}", f"data.corpus=[{corpus}]", "data.seq_len=16", f"tracking.run_root={tmp_path / 'runs'}"]
    store, _ = ensure_packed(DataConfig(corpus=[str(corpus)], seq_len=16), str(tiny), tmp_path / "runs")
    hit = _run("prepare", *args)
    assert hit.returncode == 0 and f"packed store {store.key} reused" in hit.stdout, hit.stderr[-2000:]
    info = _run("info", *args)
    assert info.returncode == 0 and store.key in info.stdout and "packed 1 time(s); corpus: current" in info.stdout
    with open(corpus, "a") as f:
        f.write(json.dumps({"text": "an edit after packing"}) + "\n")
    p = _run("prepare", *args)
    err = p.stderr.strip()
    assert p.returncode == 2 and len(err.splitlines()) == 1, p.stderr[-2000:]
    assert "c.jsonl changed (size" in err and "raycpt data prepare [CONFIG] [overrides] --rebuild" in err
    # nothing was re-packed or removed by the refusal
    (left,) = list_stores(tmp_path / "runs" / "packed")
    assert left.build_id == store.build_id and len(builds_logged(tmp_path / "runs" / "packed")) == 1
    info = _run("info", *args)
    assert info.returncode == 0 and "corpus: " + str(corpus) + " changed" in info.stdout


def test_prepare_packs_a_store_smaller_than_a_training_run_needs(tmp_path):
    """Packing is separate from "is it big enough for this run": ``data prepare`` packs any non-empty store
    whatever train.* says (no faked training shape); a training run checks its own need."""
    from raycpt.config import load_config
    from raycpt.errors import RaycptError
    from raycpt.data.run_store import packed_corpus

    tiny = save_tiny(tmp_path / "tiny")
    corpus = tmp_path / "small.jsonl"
    corpus.write_text("".join(json.dumps({"text": f"document number {i}"}) + "\n" for i in range(10)))
    args = [f"model.ref={tiny}", f"data.corpus=[{corpus}]", "data.seq_len=16", f"tracking.run_root={tmp_path / 'runs'}",
            "train.num_workers=4", "train.micro_batch_size=64"]
    p = _run("prepare", *args)
    assert p.returncode == 0, p.stderr[-2000:]
    (store,) = list_stores(tmp_path / "runs" / "packed")
    assert 0 < store.num_blocks < 4 * 64
    try:
        packed_corpus(load_config(None, args), str(tiny), tmp_path / "runs")
        raise AssertionError("a run that needs more blocks than the store holds must stop")
    except RaycptError as e:
        assert "need at least 256" in str(e)


def test_data_info_and_prepare_give_one_verdict_on_a_damaged_store(tmp_path):
    """Issue 51, rule 1: a shard changed in place (size kept, mtime set back): ``data info`` says the store is
    damaged and why, ``data prepare`` (a reader) says the same in one line and packs it again, then both say current."""
    from test_cache_claims import rewrite_in_place

    tiny = save_tiny(tmp_path / "tiny")
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps({"text": f"document number {i}"}) + "\n" for i in range(40)))
    args = [f"model.ref={tiny}", f"data.corpus=[{corpus}]", "data.seq_len=16", f"tracking.run_root={tmp_path / 'runs'}"]
    store, _ = ensure_packed(DataConfig(corpus=[str(corpus)], seq_len=16), str(tiny), tmp_path / "runs")
    rewrite_in_place(store.path / store.manifest["shards"][0]["file"], -1)
    info = _run("info", *args)
    why = f"its shard {store.manifest['shards'][0]['file']} does not match its sha256 (changed after it was packed)"
    assert info.returncode == 0 and f"store damaged: {why}" in info.stdout, info.stdout + info.stderr[-2000:]
    p = _run("prepare", *args)
    err = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert p.returncode == 0 and len(err) == 1 and why in err[0] and "packing it again" in err[0], p.stderr[-2000:]
    assert "corpus: packed" in p.stdout
    info = _run("info", *args)
    assert info.returncode == 0 and "packed 2 time(s); corpus: current" in info.stdout
