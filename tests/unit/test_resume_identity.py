"""What a resume checks it resumes (issue 27): the packed store's identity recorded in a checkpoint against
the store the corpus packs to now, and ``data.verify: content`` for corpora edited with size and mtime kept."""

import json
import os

import pytest

from raycpt.config import DataConfig, load_config
from raycpt.data.pack import ensure_packed, find_packed
from raycpt.errors import RaycptError
from raycpt.train.driver.resume import check_resume_data, resume_data_mismatch
from tiny import save_tiny


def _corpus(path, words):
    path.write_text("".join(json.dumps({"text": f"document {w} " * 6}) + "\n" for w in words))
    return path


def _same_size_edit(path):
    """Replace one letter by another (same size) and put the old mtime back, as `cp -p` / `touch -r` do."""
    st = os.stat(path)
    text = path.read_text()
    i = text.index("document a")
    path.write_text(text[:i] + "document b" + text[i + len("document a"):])
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert os.stat(path).st_size == st.st_size and os.stat(path).st_mtime_ns == st.st_mtime_ns


def test_an_edit_keeping_size_and_mtime_passes_stat_and_is_caught_by_content(tmp_path):
    tiny = save_tiny(tmp_path / "tiny")
    corpus = _corpus(tmp_path / "c.jsonl", "a" + "xyz" * 30)
    stat_cfg = DataConfig(corpus=[str(corpus)], seq_len=16)
    content_cfg = DataConfig(corpus=[str(corpus)], seq_len=16, verify="content")
    store, _ = ensure_packed(content_cfg, str(tiny), tmp_path / "runs")
    assert all(r["hash_kind"] == "full" for r in store.manifest["fingerprints"])
    _same_size_edit(corpus)
    # the documented shortcut: same size and mtime = the same corpus (the case the issue found)
    assert find_packed(stat_cfg, str(tiny), tmp_path / "runs").build_id == store.build_id
    with pytest.raises(RaycptError, match=r"c.jsonl changed \(same size, different content\) since it was packed.*"
                                          "--rebuild") as e:
        find_packed(content_cfg, str(tiny), tmp_path / "runs")
    assert "\n" not in str(e.value)


def test_content_check_of_a_store_fingerprinted_by_samples_says_so(tmp_path, monkeypatch):
    import raycpt.data.store as store_mod

    tiny = save_tiny(tmp_path / "tiny")
    corpus = _corpus(tmp_path / "c.jsonl", "abc" * 30)
    monkeypatch.setattr(store_mod, "FULL_HASH_BYTES", 100)  # the file is "large": sampled at pack time
    monkeypatch.setattr(store_mod, "SAMPLE_BYTES", 10)
    ensure_packed(DataConfig(corpus=[str(corpus)], seq_len=16), str(tiny), tmp_path / "runs")
    with pytest.raises(RaycptError, match="fingerprinted by samples.*data.verify: content needs a store packed"):
        find_packed(DataConfig(corpus=[str(corpus)], seq_len=16, verify="content"), str(tiny), tmp_path / "runs")


def test_store_identity_survives_a_repack_of_the_same_files_and_changes_with_their_content(tmp_path):
    tiny = save_tiny(tmp_path / "tiny")
    corpus = _corpus(tmp_path / "c.jsonl", "abc" * 30)
    cfg = DataConfig(corpus=[str(corpus)], seq_len=16)
    first, _ = ensure_packed(cfg, str(tiny), tmp_path / "runs")
    again, built = ensure_packed(cfg, str(tiny), tmp_path / "runs", rebuild=True)
    assert built and again.build_id != first.build_id and again.identity == first.identity
    rec = {"store_build": first.build_id, "store_key": first.key, "store_identity": first.identity}
    assert resume_data_mismatch(rec, again) is None
    _corpus(corpus, "abd" * 30)  # same length, other words
    edited, _ = ensure_packed(cfg, str(tiny), tmp_path / "runs", rebuild=True)
    assert edited.key == first.key and edited.identity != first.identity
    assert f"corpus {first.identity}, now {edited.identity}" in resume_data_mismatch(rec, edited)
    # a checkpoint of an older raycpt recorded only the build: a re-pack is refused, the same build passes
    assert resume_data_mismatch({"store_build": edited.build_id}, edited) is None
    assert "store build" in resume_data_mismatch({"store_build": first.build_id}, edited)
    assert resume_data_mismatch(None, edited) is None


def test_check_resume_data_is_one_line_saying_how_to_start_fresh(tmp_path):
    tiny = save_tiny(tmp_path / "tiny")
    corpus = _corpus(tmp_path / "c.jsonl", "abc" * 30)
    cfg = DataConfig(corpus=[str(corpus)], seq_len=16)
    first, _ = ensure_packed(cfg, str(tiny), tmp_path / "runs")
    ckpt = tmp_path / "checkpoint_000002"
    ckpt.mkdir()
    (ckpt / "train_state.json").write_text(json.dumps({"step": 2, "data": {
        "store_build": first.build_id, "store_key": first.key, "store_identity": first.identity}}))
    check_resume_data(ckpt, first)  # the same pack: nothing to say
    _corpus(corpus, "xyz" * 30)
    edited, _ = ensure_packed(cfg, str(tiny), tmp_path / "runs", rebuild=True)
    with pytest.raises(RaycptError) as e:
        check_resume_data(ckpt, edited)
    msg = str(e.value)
    assert "\n" not in msg and str(ckpt) in msg and "without --resume" in msg and "other data" in msg


def test_data_verify_is_a_checked_config_key():
    assert load_config(None, ["data.verify=content"]).data.verify == "content"
    with pytest.raises(RaycptError, match="data.verify.*stat.*content"):
        load_config(None, ["data.verify=sha"])
