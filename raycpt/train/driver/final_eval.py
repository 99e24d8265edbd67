"""The final model's evaluation after training: on the device this process reserved, with the dtype its weights were
saved in, read back from what the training worker wrote when it evaluated in the worker."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

from raycpt.evaluate import evaluate_model
from raycpt.evaluate.heldout import DEFINITION
from raycpt.evaluate.results import EvalResult
from raycpt.io import sealed_json_problem, write_sealed_json
from raycpt.models.sources import load_model
from raycpt.train.driver.result import read_json
from raycpt.train.worker.evaluation import EVAL_RESULT_FILE, EvalRequest, eval_result_record


def eval_device(cuda_available: bool, in_ray_worker: bool, reserved_gpus: int) -> str:
    """Where a model may go: a GPU only when this process reserved one. Ray 2.60 no longer hides the GPUs
    from a task or actor that reserved none, so a CPU-only trial process on a GPU node would otherwise load
    onto ``cuda:0``, next to another trial's worker. Outside Ray workers (a driver, a plain process): any
    visible GPU."""
    if not cuda_available:
        return "cpu"
    if in_ray_worker and reserved_gpus == 0:
        return "cpu"
    return "cuda"


def reserved_device() -> str:
    """:func:`eval_device` of this process (a Ray worker's reserved GPUs from its runtime context)."""
    import torch

    in_worker, gpus = False, 0
    try:
        import ray

        if ray.is_initialized():
            ctx = ray.get_runtime_context()
            in_worker = ctx.worker.mode == ray.WORKER_MODE
            gpus = len(ctx.get_accelerator_ids().get("GPU", []))
    except Exception:  # noqa: BLE001 - no Ray context: a plain process
        in_worker = False
    return eval_device(torch.cuda.is_available(), in_worker, gpus)


def saved_dtype(model_dir) -> str:
    """The dtype a model folder published by a training run (it has a ``manifest.json``) stores its weights in
    (``config.json``), so that evaluating it scores the weights the training worker evaluated
    (:func:`raycpt.train.worker.loop.eval_model`); ``auto`` for any other folder (a base model) or when it says none."""
    if not (Path(model_dir) / "manifest.json").is_file():
        return "auto"
    conf = read_json(Path(model_dir) / "config.json")
    name = conf.get("dtype") or conf.get("torch_dtype")
    return name if name in ("float32", "bfloat16", "float16") else "auto"


def saved_model_load(model_dir) -> dict:
    """``load_model`` / ``evaluate_model`` keywords for evaluating a saved model folder, the one rule of every
    path that scores one (:func:`final_evaluation`, ``raycpt eval``): the dtype it was saved in
    (:func:`saved_dtype`) on this process's reserved device (:func:`reserved_device`)."""
    return {"dtype": saved_dtype(model_dir), "device": reserved_device()}


def current_definition(record: dict, req: EvalRequest) -> bool:
    """Whether a written ``eval_result.json`` may be reused: without a blocks file any; with one, only a record whose
    losses follow today's rule (``loss_definition``, :data:`raycpt.evaluate.heldout.DEFINITION`): a record from
    before per-document scoring is evaluated again, never read as the new loss."""
    if not (req.heldout_path or req.general_path or req.validation_path):
        return True
    return record.get("loss_definition") == DEFINITION


def final_evaluation(final_model_dir, eval_cfg, req: EvalRequest, threads: Optional[int] = None,
                     trusted: bool = False):
    """``(EvalResult, held-out loss or None)`` of a training run's final model.

    What the training worker wrote with ``run_training(evaluate=req)`` when it did (DDP and FSDP alike);
    else (the base model of a scan, a file from before) the same bridge runs here on the saved folder, loaded
    in the dtype it was saved in (:func:`saved_dtype`), with ``threads``
    torch threads, and the held-out loss on the blocks of ``req.heldout_path``; it then writes the same
    ``eval_result.json`` the worker would have (per-block held-out losses included), so a resumed trial
    reads it instead of evaluating again (unless it predates per-document scoring: :func:`current_definition`).
    A file read back is one that matches its seal (:func:`raycpt.io.sealed_json_problem`; ``trusted``: its caller
    verified it, the base row's cache entry); one that does not is evaluated again with one line saying why."""

    path = Path(req.out_dir) / EVAL_RESULT_FILE
    why = None if trusted or not path.exists() else sealed_json_problem(path)
    done = read_json(path) if why is None else None
    if done and current_definition(done, req):
        return EvalResult.from_dict(done), done.get("heldout_loss")
    if why is not None:
        print(f"warning: {path} refused ({why}); evaluating again", file=sys.stderr, flush=True)
    import torch


    if threads:
        torch.set_num_threads(threads)
    model, tok = load_model(str(final_model_dir), **saved_model_load(final_model_dir))
    ev = evaluate_model(model, eval_cfg, tokenizer=tok, out_dir=req.out_dir, name=req.name)
    record = eval_result_record(ev, model, req.heldout_path, eval_cfg.batch_size,
                                validation_path=req.validation_path, general_path=req.general_path, tokenizer=tok,
                                budget_tokens=eval_cfg.loss_batch_tokens)
    write_sealed_json(path, record)
    return ev, record["heldout_loss"]
