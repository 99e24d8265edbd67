"""Replay (data.replay): a second corpus mixed into the packed stream at rho, exactly per window of 64 blocks,
reproducibly, resumably (arithmetic skip), each corpus read once per its epoch; rho outside [0, 1) one line."""

import numpy as np
import pytest

from raycpt.config import ConfigError, DataConfig, ReplayConfig, load_config
from raycpt.data.replay import iter_mixed_micro_batches, replay_before_window, replay_mask
from raycpt.data.stream import ArrayBlocks

SEQ = 8


def _sources(n_primary=200, n_replay=50):
    # every row is constant: primary block i holds i, replay block i holds 10_000 + i (the kind is readable)
    prim = np.repeat(np.arange(n_primary)[:, None], SEQ, axis=1)
    rep = np.repeat(10_000 + np.arange(n_replay)[:, None], SEQ, axis=1)
    return ArrayBlocks(prim, counts=[120, 80]), ArrayBlocks(rep)


def _stream(world=1, mbs=4, n_micro=160, ratio=0.25, seed=0, skip=0):
    """The blocks of all ranks in global stream order (position (c R + r) m + i)."""
    prim, rep = _sources()
    its = [iter_mixed_micro_batches(prim, rep, mbs, ratio=ratio, rank=r, world=world, seed=seed, window=16,
                                    skip=skip) for r in range(world)]
    out = []
    for _ in range(n_micro):
        for it in its:
            out.extend(int(row[0]) for row in next(it)[1])
    return np.array(out)


@pytest.mark.parametrize("world,mbs", [(1, 4), (2, 4), (3, 2)])
def test_every_window_of_64_blocks_holds_exactly_a_quarter_replay(world, mbs):
    n_micro = -(-1280 // (world * mbs))  # at least 20 windows of 64
    ids = _stream(world=world, mbs=mbs, n_micro=n_micro)
    assert len(ids) >= 1280
    for w in range(len(ids) // 64):
        window = ids[64 * w:64 * (w + 1)]
        assert int((window >= 10_000).sum()) == 16, w
    assert np.array_equal(ids, _stream(world=world, mbs=mbs, n_micro=n_micro))  # reproducible


def test_the_layout_does_not_depend_on_the_number_of_ranks_and_the_seed_moves_it():
    one, two = _stream(world=1, mbs=4, n_micro=64), _stream(world=2, mbs=2, n_micro=64)
    assert np.array_equal(one, two)  # the same global stream, however it is split over ranks
    other = _stream(world=1, mbs=4, n_micro=64, seed=1)
    assert not np.array_equal(one >= 10_000, other >= 10_000)


def test_each_corpus_is_read_once_per_its_epoch():
    ids = _stream(n_micro=96)  # 384 blocks = 6 windows: 288 primary (epochs of 200), 96 replay (epochs of 50)
    prim, rep = ids[ids < 10_000], ids[ids >= 10_000] - 10_000
    assert len(prim) == 288 and len(rep) == 96
    assert sorted(prim[:200]) == list(range(200)) and len(set(prim[200:])) == 88
    assert sorted(rep[:50]) == list(range(50)) and len(set(rep[50:])) == 46
    assert not np.array_equal(rep[:46], rep[50:])  # a new order per replay epoch


def test_a_resume_skips_by_arithmetic_to_the_same_blocks():
    full = _stream(world=2, mbs=4, n_micro=50)
    resumed = _stream(world=2, mbs=4, n_micro=30, skip=20)
    assert np.array_equal(full[20 * 8:], resumed)


def test_a_ratio_that_is_not_whole_per_window_is_exact_over_windows_and_within_one_per_window():
    counts = [int(replay_mask(w, 0.3, seed=0).sum()) for w in range(100)]  # 0.3 * 64 = 19.2
    assert set(counts) <= {19, 20} and sum(counts) == replay_before_window(100, 0.3) == 1920


def test_zero_ratio_is_the_primary_stream_only():
    ids = _stream(ratio=0.0, n_micro=20)
    assert (ids < 10_000).all()


@pytest.mark.parametrize("bad", [1.0, 1.5, -0.1, float("nan")])
def test_ratio_outside_zero_one_is_one_config_error(bad):
    with pytest.raises(ConfigError, match=r"data.replay.ratio=.*a share in \[0, 1\)"):
        ReplayConfig(corpus=["x.jsonl"], ratio=bad)


def test_replay_needs_a_corpus_and_loads_from_dotted_keys():
    with pytest.raises(ConfigError, match="data.replay.corpus"):
        DataConfig(replay=ReplayConfig(ratio=0.25))
    cfg = load_config(None, ["data.replay.ratio=0.25", "data.replay.corpus=[builtin:wordnet-glosses]"])
    assert cfg.data.replay.ratio == 0.25 and cfg.data.replay.corpus == ["builtin:wordnet-glosses"]


def test_the_loop_reads_the_mixed_stream_and_resumes_exactly(tiny_dir, tmp_path):
    import copy

    from raycpt.config import config_to_dict
    from raycpt.strategies import build_plan
    from raycpt.train.worker.loop import run_loop
    from worker_specs import worker_spec
    from raycpt.train.worker.session import LocalSession

    cfg = load_config(None, [f"model.ref={tiny_dir}", "data.seq_len=16", "plan.name=train_deep",
                             "data.replay.ratio=0.25", "data.replay.corpus=[unused.jsonl]", "train.max_steps=4",
                             "train.checkpoint_every=2", "train.lr=0.01", "train.micro_batch_size=4"])
    plan = build_plan(cfg.plan, 4, tied_embeddings=True)
    conf = {"cfg": config_to_dict(cfg), "model_path": str(tiny_dir), "plan": plan.to_dict(),
            "run_dir": str(tmp_path / "a"), "torch_threads": 1}
    rng = np.random.default_rng(0)
    prim, rep = rng.integers(4, 60, size=(64, 16)), rng.integers(60, 128, size=(32, 16))
    full = run_loop(worker_spec(conf), LocalSession(prim, tmp_path / "a" / "ck", replay_blocks=rep))
    plain = run_loop(worker_spec({**conf, "run_dir": str(tmp_path / "p")}), LocalSession(prim, None, replay_blocks=rep[:, ::-1]))
    assert full["losses"] != plain["losses"]  # the replay blocks are read: other replay data, other losses
    conf_b = copy.deepcopy(conf)
    conf_b.update(run_dir=str(tmp_path / "b"), resume_from=str(tmp_path / "a" / "ck" / "checkpoint_000002"))
    resumed = run_loop(worker_spec(conf_b), LocalSession(prim, tmp_path / "b" / "ck", replay_blocks=rep))
    assert resumed["losses"] == full["losses"]
