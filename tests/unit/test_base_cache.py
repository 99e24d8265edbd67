"""Issue 51, rule 1: the base row's cache entry is a claim about content. Its key covers the model folder's files by
content (weights and tokenizer), and the entry carries its own digests: a model rewritten in place, an entry edited
by hand, an entry of the wrong shape or one written by an older raycpt are each evaluated again, with one line saying
why, and the base row then reports the numbers of the model on disk. The reference numbers are a plain held-out loss
computed here with transformers (no raycpt), and the evaluation is counted at the bridge."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from fake_run import FakeRun
from raycpt.runs.location import locate

CATS = ["STEM", "Social Science", "Humanities", "Other"]
BLOCKS = [[1 + (7 * i + 3 * j) % 90 for j in range(12)] for i in range(4)]  # 4 blocks of 12 token ids


_FakeRun = FakeRun


def _plain_heldout_loss(folder: Path) -> float:
    """The held-out loss of BLOCKS under the model in ``folder``, computed directly: each document piece (the
    stretches between EOS tokens, 2 in the tiny tokenizer) in its own forward after the tokenizer's BOS (1, which it
    puts before every text), its tokens after the first the targets; the mean over all of them."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    total, n = 0.0, 0
    with torch.no_grad():
        for b in BLOCKS:
            cuts = [-1] + [i for i, t in enumerate(b) if t == 2] + [len(b)]
            for piece in (b[x + 1:y] for x, y in zip(cuts, cuts[1:]) if y - x - 1 >= 2):
                ids = torch.tensor([[1] + piece])
                logits = model(ids).logits[0, 1:-1].float()  # after the BOS and the piece's first token
                total += float(torch.nn.functional.cross_entropy(logits, ids[0, 2:], reduction="sum"))
                n += len(piece) - 1
    return total / n


@pytest.fixture
def base(tmp_path, monkeypatch):
    """``run(folder_name, model_dir, root)``: the base trial of a sweep (inline), its result; ``calls``: the
    evaluations made; ``lines``: the warning lines printed."""
    import raycpt.jobs.base_row as br
    import raycpt.train.driver.final_eval as fe
    from raycpt.config import load_config
    from raycpt.jobs.grid import Trial
    from raycpt.jobs.sweep import TrialSpec

    calls, lines = [], []
    real = fe.evaluate_model

    def counted(*a, **k):
        calls.append(1)
        return real(*a, **k)

    monkeypatch.setattr(fe, "evaluate_model", counted)
    monkeypatch.setattr(br, "_warn", lines.append)
    qfile = tmp_path / "q.jsonl"
    qfile.write_text("".join(json.dumps({"id": f"t{i}", "question": f"Which is {i}?", "A": "cat", "B": "dog",
                                         "C": "eel", "D": "fox", "answer": "ABCD"[i % 4], "category": CATS[i % 4]})
                             + "\n" for i in range(4)))
    blocks = tmp_path / "heldout.json"
    blocks.write_text(json.dumps(BLOCKS))

    def run(folder: str, model_dir: Path, root: Path = tmp_path / "runs"):
        cfg = load_config(None, [f"tracking.run_root={root}", f"eval.tasks=[{qfile}]", "eval.modes=[cloze]"])
        tdir = tmp_path / folder
        tdir.mkdir(parents=True)
        trial = Trial(cfg=cfg, dir=tdir, run=_FakeRun(locate(cfg.tracking, check=False)), parent_run_id="p",
                      shared={"model_path": str(model_dir), "heldout_path": str(blocks)})
        return TrialSpec(name=br.BASE, strategy=br.BASE).run(trial)

    run.calls, run.lines = calls, lines
    return run


def _rewrite_in_place(dst: Path, src: Path, keep_mtime: bool) -> None:
    """Write ``src``'s bytes over ``dst`` (same inode, as a re-download into the same folder does); with
    ``keep_mtime`` the old modification time is set back (``cp -p``, ``rsync -t``): only the change time moves."""
    st = dst.stat()
    with open(dst, "r+b") as f:
        f.truncate(0)
        f.write(src.read_bytes())
    if keep_mtime:
        os.utime(dst, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert dst.stat().st_ino == st.st_ino


@pytest.mark.parametrize("keep_mtime", [False, True])
def test_weights_changed_in_place_are_evaluated_again(tmp_path, base, keep_mtime):
    from tiny import save_tiny

    model = save_tiny(tmp_path / "model", seed=0)
    other = save_tiny(tmp_path / "other", seed=1)
    old_ref, new_ref = _plain_heldout_loss(model), _plain_heldout_loss(other)
    assert abs(old_ref - new_ref) > 1e-3  # two models, two numbers

    first = base("s1/trials/base", model)
    assert len(base.calls) == 1 and first["heldout_loss"] == pytest.approx(old_ref, rel=1e-5)
    again = base("s2/trials/base", model)  # unchanged: read from the cache
    assert len(base.calls) == 1 and again["heldout_loss"] == first["heldout_loss"]

    _rewrite_in_place(model / "model.safetensors", other / "model.safetensors", keep_mtime)
    changed = base("s3/trials/base", model)
    assert len(base.calls) == 2  # a miss: evaluated again
    assert changed["heldout_loss"] == pytest.approx(new_ref, rel=1e-5)  # the model on disk, not the old row
    assert changed["base_cache"] != first["base_cache"]


def test_a_changed_tokenizer_is_another_entry(tmp_path, base):
    from tiny import save_tiny

    model = save_tiny(tmp_path / "model")
    base("s1/trials/base", model)
    conf = model / "tokenizer_config.json"
    doc = json.loads(conf.read_text())
    doc["model_max_length"] = 4096
    conf.write_text(json.dumps(doc))
    base("s2/trials/base", model)
    assert len(base.calls) == 2


def test_the_weights_are_hashed_once_while_unchanged(tmp_path, base, monkeypatch):
    import raycpt.models.digests as dg
    from tiny import save_tiny

    hashed = []
    real = dg.sha256_file
    monkeypatch.setattr(dg, "sha256_file", lambda p: hashed.append(Path(p).name) or real(p))
    model = save_tiny(tmp_path / "model")
    for i in range(3):
        base(f"s{i}/trials/base", model)
    assert hashed.count("model.safetensors") == 1


def _entry(result: dict) -> Path:
    return Path(result["base_cache"])


def test_an_entry_edited_by_hand_is_refused_and_evaluated_again(tmp_path, base):
    from tiny import save_tiny

    model = save_tiny(tmp_path / "model")
    ref = _plain_heldout_loss(model)
    first = base("s1/trials/base", model)
    f = _entry(first) / "eval_result.json"
    doc = json.loads(f.read_text())
    doc["heldout_loss"] += 1.0  # the 5.133 -> 6.133
    f.write_text(json.dumps(doc))
    again = base("s2/trials/base", model)
    assert len(base.calls) == 2 and again["heldout_loss"] == pytest.approx(ref, rel=1e-5)
    assert len(base.lines) == 1 and "eval_result.json does not match its sha256" in base.lines[0]
    assert "\n" not in base.lines[0] and str(_entry(first)) in base.lines[0]
    third = base("s3/trials/base", model)  # the new entry verifies: read, not evaluated
    assert len(base.calls) == 2 and third["heldout_loss"] == again["heldout_loss"]


@pytest.mark.parametrize("bad, says", [
    ([1, 2], "holds a list"),
    ({"scores": {"q": ["x"]}}, "its scores are not"),
    ({"scores": {}, "heldout_loss": "5.1"}, "its heldout_loss is '5.1'"),
])
def test_an_entry_of_the_wrong_shape_is_evaluated_again_not_a_traceback(tmp_path, base, bad, says):
    """Sealed again after the edit, so the digests agree and only the shape is wrong."""
    import raycpt.jobs.base_row as br
    from tiny import save_tiny

    model = save_tiny(tmp_path / "model")
    ref = _plain_heldout_loss(model)
    entry = _entry(base("s1/trials/base", model))
    (entry / "eval_result.json").write_text(json.dumps(bad))
    seal = json.loads((entry / br.ENTRY_FILE).read_text())
    seal["files"] = {rel: br.sha256_file(entry / rel) for rel in seal["files"]}
    (entry / br.ENTRY_FILE).write_text(json.dumps(seal))
    again = base("s2/trials/base", model)
    assert len(base.calls) == 2 and again["heldout_loss"] == pytest.approx(ref, rel=1e-5)
    assert len(base.lines) == 1 and says in base.lines[0], base.lines


@pytest.mark.parametrize("damage, says", [
    ("unseal", "has no entry.json"),
    ("seal-list", "is not a raycpt.base-eval-entry/1 record"),
    ("seal-bytes", "cannot be read"),
])
def test_an_entry_without_a_valid_seal_is_evaluated_again(tmp_path, base, damage, says):
    """An entry of an older raycpt (no ``entry.json``) or a damaged seal."""
    import raycpt.jobs.base_row as br
    from tiny import save_tiny

    model = save_tiny(tmp_path / "model")
    entry = _entry(base("s1/trials/base", model))
    seal = entry / br.ENTRY_FILE
    if damage == "unseal":
        seal.unlink()
    elif damage == "seal-list":
        seal.write_text("[]")
    else:
        seal.write_bytes(b"\xff\xfe{")
    base("s2/trials/base", model)
    assert len(base.calls) == 2 and len(base.lines) == 1 and says in base.lines[0], base.lines
    assert entry.with_name(f"{entry.name}.refused-1").is_dir()  # kept aside for a look


def test_a_copy_of_the_folder_elsewhere_reads_the_same_entry(tmp_path, base):
    """The key is the content, not the path: the same files in another folder are the same model."""
    from tiny import save_tiny

    model = save_tiny(tmp_path / "model")
    first = base("s1/trials/base", model)
    copy = tmp_path / "copy"
    shutil.copytree(model, copy)
    again = base("s2/trials/base", copy)
    assert len(base.calls) == 1 and again["base_cache"] == first["base_cache"]


def test_a_cache_folder_that_cannot_be_written_costs_the_cache_not_the_sweep(tmp_path, monkeypatch):
    """Issue 51: a base_eval folder that cannot be written (132 lines and 2 tracebacks before): one line, and the
    base row is evaluated into the trial's own folder instead. Root ignores file modes, so the refusal is injected
    at the write the probe makes."""
    from pathlib import Path

    from raycpt.jobs.base_row import writable_cache

    cache, fallback = tmp_path / "base_eval" / "abc", tmp_path / "trial" / "base_eval_uncached"
    said = []
    assert writable_cache(cache, fallback, say=said.append) == cache and not said  # writable: the cache itself
    real = Path.write_bytes

    def refuse(self, data):
        if "base_eval" in str(self):
            raise PermissionError(13, "Permission denied", str(self))
        return real(self, data)

    monkeypatch.setattr(Path, "write_bytes", refuse)
    assert writable_cache(cache, fallback, say=said.append) == fallback and fallback.is_dir()
    assert len(said) == 1 and "cannot be written (Permission denied)" in said[0] and str(fallback) in said[0]
