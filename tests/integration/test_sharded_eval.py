"""Evaluation on every worker: a 2-worker trial splits the questions and gathers on rank 0, and the
per-question predictions equal a one-worker evaluation of the same final weights."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from raycpt.config import load_config


def _corpus(path: Path, n: int = 120) -> Path:
    from raycpt.data.corpus import iter_documents

    with open(path, "w") as f:
        for d in iter_documents(["builtin:wordnet-glosses"], max_documents=n):
            f.write(json.dumps({"text": d}) + "\n")
    return path


def test_two_workers_evaluate_shards_with_one_workers_predictions(ray_local, tmp_path, tiny_dir):
    from raycpt.evaluate import evaluate_model
    from raycpt.models.sources import load_model
    from train_runs import train_command
    from raycpt.train.worker.evaluation import EVAL_RESULT_FILE, EvalRequest

    corpus = _corpus(tmp_path / "corpus.jsonl")
    cfg = load_config(None, [f"model.ref={tiny_dir}", f"data.corpus=[{corpus}]", "data.seq_len=32",
                             "plan.name=train_deep", f"tracking.run_root={tmp_path / 'runs'}", "train.max_steps=2",
                             "train.checkpoint_every=2", "train.num_workers=2", "train.cpus_per_worker=0.5",
                             "train.micro_batch_size=2", "eval.tasks=[wordnet_mc]", "eval.modes=[logit,generate]",
                             "eval.limit=9", "eval.batch_size=4", "eval.max_gen_toks=4"])
    ecfg = cfg.eval
    out = tmp_path / "eval"
    res = train_command(cfg, evaluate=EvalRequest(out_dir=str(out), name="trial"))
    got = json.loads((out / EVAL_RESULT_FILE).read_text())
    model, tok = load_model(str(res.final_model_dir), dtype="float32", device="cpu")
    one = evaluate_model(model, ecfg, tokenizer=tok)
    a, b = got["questions"]["wordnet_mc"], one.questions["wordnet_mc"]
    assert len(a) == len(b) == 9 and [q["id"] for q in a] == [q["id"] for q in b]
    assert [q["logit"]["prediction"] for q in a] == [q["logit"]["prediction"] for q in b]
    assert [q["generate"]["extracted"] for q in a] == [q["generate"]["extracted"] for q in b]
    assert [q["generate"]["text"] for q in a] == [q["generate"]["text"] for q in b]
    for x, y in zip(a, b):
        assert x["logit"]["logprobs"] == pytest.approx(y["logit"]["logprobs"], abs=1e-4)
    # accuracies exactly; a continuous score (mean gold probability or log-probability over a category's questions)
    # to the per-question log-probabilities' own tolerance: the shards batch and pad the questions differently
    from raycpt.tasks import is_continuous

    assert {t: set(m) for t, m in got["scores"].items()} == {t: set(m) for t, m in one.scores.items()}
    for task, modes in one.scores.items():
        for mode, cats in modes.items():
            mine = got["scores"][task][mode]
            assert set(mine) == set(cats)
            for cat, v in cats.items():
                if is_continuous(mode):
                    assert mine[cat] == pytest.approx(v, abs=1e-4), (task, mode, cat)
                else:
                    assert mine[cat] == v, (task, mode, cat)
