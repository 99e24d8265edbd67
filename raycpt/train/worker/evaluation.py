"""Evaluation in the training worker: the final weights scored where they are, ``eval_result.json`` written."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from raycpt.data.corpus import eos_id_of
from raycpt.evaluate import evaluate_model, merge_shards
from raycpt.evaluate.heldout import DEFINITION, BlockScores, document_block_scores, prefix_id_of
from raycpt.io import write_sealed_json
from raycpt.models.adapters import merge_lora_
from raycpt.train.ckpt.checkpoint import model_state, weights_dtype
from raycpt.train.worker.loss import DEFAULT_CHUNK_TOKENS, chunked_supported
from raycpt.train.worker.session import SessionBase

EVAL_RESULT_FILE = "eval_result.json"


@dataclass(frozen=True)
class EvalRequest:
    """Evaluate the final weights in the training worker (``run_training(evaluate=...)``) with the loop
    config's own ``cfg.eval``; :func:`raycpt.train.driver.final_eval.final_evaluation` reads what it wrote."""

    out_dir: str
    """Folder of the evaluation files and ``eval_result.json``."""
    name: str
    """Name of the evaluated model in those files."""
    heldout_path: Optional[str] = None
    """JSON file of token blocks: also write their language-model loss (``heldout_loss``)."""
    validation_path: Optional[str] = None
    """JSON file of the validation slice's blocks (``sweep.lr_grid``): also write ``validation_loss``."""
    general_path: Optional[str] = None
    """JSON file of the general probe's token blocks (:mod:`raycpt.evaluate.general`): also write their loss
    (``general_loss``), the forgetting axis."""


def cast_weights(model, dtype):
    """``model``'s parameters in ``dtype``, in place; its buffers as they are: a model loaded in ``dtype`` keeps
    float32 buffers (RoPE's ``inv_freq``), and ``model.to(dtype)`` would round them, so that in-worker evaluation
    scored another function than the saved model (scripts/device_check.py's eval_same_model)."""
    for p in model.parameters():
        p.data = p.data.to(dtype)
    return model


def eval_model(model, wrapped, plan, fsdp: bool, rank: int, device, precision: str, session
               ) -> tuple[Any, Optional[SessionBase]]:
    """The model in-worker evaluation scores, and the session that shards its questions.

    One dtype for both evaluation paths: the trained weights in the dtype the checkpoint stores them in
    (:func:`weights_dtype`: bf16 when training in bf16), which is what evaluating the saved model scores
    (:func:`raycpt.train.driver.final_eval.final_evaluation` loads it in that dtype). DDP / one worker: the model
    itself, cast in place (training is over), every rank a share of the questions. FSDP: the full state
    is gathered (every rank takes part), rank 0 evaluates a plain copy alone on its device; the other
    ranks return (None, None)."""
    dtype = weights_dtype(precision, device)
    if plan.adapter == "lora":  # the merged weights, as the final checkpoint's model/ holds them
        merge_lora_(model)
    if not fsdp:
        return cast_weights(model, dtype), session
    from transformers import AutoModelForCausalLM

    msd = model_state(model, wrapped, True)  # the caller freed the optimizer's state before this gather
    if rank != 0:
        return None, None
    plain = AutoModelForCausalLM.from_config(model.config)
    plain.load_state_dict(msd)
    return plain.to(device, dtype).eval(), None



def evaluate_in_worker(model, tokenizer, eval_cfg, req: EvalRequest, session: Optional[SessionBase] = None
                       ) -> Optional[Path]:
    """Evaluate the trained model where it already is (this worker's device and threads), with the
    eval bridge, and write ``<out_dir>/eval_result.json`` (``EvalResult.to_dict()``, the flat ``metrics``,
    ``heldout_loss``); :func:`raycpt.train.driver.final_eval.final_evaluation` reads it.

    With several workers (``session.world_size > 1``) every rank evaluates its share of the
    questions (``evaluate_model(shard=(rank, world))``), rank 0 gathers them
    (:func:`raycpt.evaluate.merge_shards`: the same per-question records and scores as one worker)
    and writes; the other ranks return None.

    The in-memory model equals the final checkpoint (it was saved from these weights), so nothing is
    reloaded; on a cluster the evaluation runs on the training GPU instead of a CPU-only trial actor.
    With ``req.heldout_path`` the file also holds ``heldout_loss`` (:func:`raycpt.evaluate.heldout.lm_loss`)."""
    rank, world = (session.rank, session.world_size) if session is not None else (0, 1)
    use_cache = getattr(model.config, "use_cache", None)
    model.config.use_cache = True  # generation mode: the training loop turned the KV cache off
    ckpt = getattr(model, "is_gradient_checkpointing", False)
    if ckpt:
        model.gradient_checkpointing_disable()
    try:
        if world > 1:
            part = evaluate_model(model, eval_cfg, tokenizer=tokenizer, name=req.name, shard=(rank, world))
            parts = session.all_gather_object(part)
            if rank != 0:
                return None
            res = merge_shards(parts, out_dir=req.out_dir)
        else:
            res = evaluate_model(model, eval_cfg, tokenizer=tokenizer, out_dir=req.out_dir, name=req.name)
    finally:
        model.config.use_cache = use_cache
    out = eval_result_record(res, model, req.heldout_path, eval_cfg.batch_size,
                             validation_path=req.validation_path, general_path=req.general_path, tokenizer=tokenizer,
                             budget_tokens=eval_cfg.loss_batch_tokens)
    return write_sealed_json(Path(req.out_dir) / EVAL_RESULT_FILE, out)  # read back by final_evaluation


def eval_result_record(res, model, heldout_path: Optional[str], batch_size: int,
                       validation_path: Optional[str] = None, general_path: Optional[str] = None,
                       tokenizer=None, budget_tokens: Optional[int] = None) -> dict:
    """What ``eval_result.json`` holds: ``EvalResult.to_dict()``, the flat ``metrics``, and with a held-out
    blocks file its ``heldout_loss`` (each document scored on its own, the token mean over the counted targets:
    :mod:`raycpt.evaluate.heldout`), ``heldout_bpb`` (bits per byte of the same targets), ``heldout_block_losses`` /
    ``heldout_block_weights`` (per block: the loss and its counted targets, for the paired interval over blocks) and
    ``heldout_block_bytes``, and its seconds as ``seconds["heldout"]``; None / absent without one. The same with
    the general probe's blocks (``general_path``) under ``general_*`` and with the validation slice's
    (``validation_path``, ``sweep.lr_grid``: the grid's choice is made on these blocks, never on the held-out ones)
    under ``validation_*``. ``loss_definition`` names the rule (:data:`raycpt.evaluate.heldout.DEFINITION`).
    ``tokenizer``: the model's (its EOS separates the documents); required with any blocks file."""
    out = {**res.to_dict(), "metrics": res.metrics(), "heldout_loss": None}
    for key, path in (("heldout", heldout_path), ("general", general_path), ("validation", validation_path)):
        if path:
            t0 = time.perf_counter()
            blocks = json.loads(Path(path).read_text())
            sc = heldout_block_scores(model, tokenizer, blocks, batch_size, budget_tokens)
            out.update({f"{key}_loss": sc.loss(), f"{key}_bpb": sc.bpb(), f"{key}_block_losses": sc.losses,
                        f"{key}_block_weights": sc.targets, f"{key}_block_bytes": sc.bytes,
                        "loss_definition": DEFINITION,
                        "seconds": {**out.get("seconds", {}), key: time.perf_counter() - t0}})
    return out


def heldout_block_scores(model, tokenizer, blocks: list[list[int]], batch_size: int,
                         budget_tokens: Optional[int] = None) -> BlockScores:
    """Per-block document-aware losses, counts and bytes (:func:`raycpt.evaluate.heldout.document_block_scores`):
    chunked over the vocabulary when the head allows (:func:`raycpt.train.worker.loss.chunked_supported`), else from
    the full logits."""
    if tokenizer is None:
        raise ValueError("eval_result_record: a blocks file needs the model's tokenizer (its EOS separates documents)")
    chunk = DEFAULT_CHUNK_TOKENS if chunked_supported(model) is None else None
    return document_block_scores(model, blocks, eos_id_of(tokenizer), batch_size, prefix_id=prefix_id_of(tokenizer),
                                 tokenizer=tokenizer, chunk_tokens=chunk, budget_tokens=budget_tokens)
