"""``raycpt eval`` scores a saved model in the dtype it was saved in, as ``final_evaluation`` (and so the
in-worker evaluation, see tests/integration/test_fsdp.py) does: one loader rule, :func:`saved_model_load`."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from raycpt.config import load_config
from raycpt.train.driver.final_eval import saved_dtype, saved_model_load

EVAL = ["eval.tasks=[wordnet_mc]", "eval.modes=[logit]", "eval.limit=6", "eval.batch_size=4"]


@pytest.fixture(scope="module")
def published_bf16(tmp_path_factory):
    """A tiny model folder as a bf16 training run publishes it: bf16 weights, config dtype, a manifest."""
    from tiny import tiny_model, tiny_tokenizer

    path = tmp_path_factory.mktemp("published") / "final_model"
    model = tiny_model("llama").to(torch.bfloat16)
    model.save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    from raycpt.train.ckpt.manifest import write_manifest

    write_manifest(path, step=0, finite=True)  # a real manifest: raycpt eval verifies it (issue 27)
    return path


def _logprobs(ev) -> list:
    return [q["logit"]["logprobs"] for q in ev.questions["wordnet_mc"]]


def test_saved_model_load_is_the_saved_dtype_on_the_reserved_device(published_bf16, tmp_path):
    assert saved_dtype(published_bf16) == "bfloat16"
    assert saved_model_load(published_bf16) == {"dtype": "bfloat16", "device": "cpu"}
    (tmp_path / "config.json").write_text(json.dumps({"dtype": "bfloat16"}))  # no manifest: a base model folder
    assert saved_model_load(tmp_path)["dtype"] == "auto"


def test_raycpt_eval_scores_the_saved_model_as_final_evaluation_does(published_bf16, tmp_path):
    from raycpt.evaluate import evaluate_model
    from raycpt.jobs.eval import _eval_remote, evaluate_checkpoints
    from raycpt.train.driver.final_eval import final_evaluation
    from raycpt.train.worker.evaluation import EvalRequest

    cfg = load_config(None, EVAL)
    final, _ = final_evaluation(published_bf16, cfg.eval, EvalRequest(str(tmp_path / "final"), "trial"))
    in_process = evaluate_checkpoints(cfg, [str(published_bf16)], use_ray=False, progress=False)[0]  # one model, no Ray
    ray_task = _eval_remote(str(published_bf16), dataclasses.asdict(cfg.eval), "m", 1)  # the body of each Ray task
    assert len(_logprobs(final)) == 6
    assert _logprobs(in_process) == _logprobs(final) and _logprobs(ray_task) == _logprobs(final)
    assert in_process.scores == final.scores
    # the check has teeth: what raycpt eval scored before (dtype auto = float32 on a CPU) differs
    f32 = evaluate_model(str(published_bf16), cfg.eval, dtype="float32", device="cpu")
    assert _logprobs(f32) != _logprobs(final)
