"""One batch of prompts -> every LayerTracer number per prompt and per layer (no Ray, no MLflow).

:func:`trace_batch` is the fast path used by the Ray actors and the benchmark:

1. one clean :meth:`LayerStack.trace` of the (right-padded) batch keeps every residual state and
   every block's call arguments;
2. P, t* and P_t(i) come from the logit lens at each row's last position only;
3. Q(i) for i = -1..N-1 re-runs only the blocks after i, all perturbations stacked into few large
   calls, the zeroed context rows computed once per group of prompts with the same prefix and
   only each prompt's own query rows run per prompt
   (:func:`raycpt.diagnostics.perturb.perturbed_logits`), head at the last position only;
4. JS, Ratio and dJS are computed from those (:mod:`raycpt.diagnostics.scores`).

Everything runs under ``torch.inference_mode()``.
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from raycpt.diagnostics.lens import final_logits, target_probs
from raycpt.diagnostics.perturb import perturbed_logits
from raycpt.diagnostics.scores import EPS, delta_js, mass_outside, ratio, support, topk_js


def model_device(stack) -> torch.device:
    return next(stack.model.parameters()).device


def trace_batch(stack, batch: dict, top_k: int = 10, eps: float = EPS, schedule: str = "shared_context",
                max_rows: Optional[int] = None) -> dict[str, np.ndarray]:
    """LayerTracer metrics of one batch (see :func:`raycpt.diagnostics.prompts.collate` for ``batch``).

    Returns numpy arrays keyed ``t_star`` (B,), ``p_final`` (B,) = P(t*), ``p_t`` (B, N+1) over
    [embedding, block 0..N-1], ``js`` (B, N+1) over perturbations [embedding, block 0..N-1],
    ``ratio`` (B, N) and ``djs`` (B, N) per decoder layer; ``p_t_topk`` / ``ratio_topk`` under each layer's
    own top-k (004 §4.1, the Task-Particle interval's reading) and ``q_mass_outside`` (B, N+1), the mass
    of Q(i) outside P's top-k support that JS@k cannot see.
    """
    device = model_device(stack)
    input_ids = batch["input_ids"].to(device)
    attention_mask = batch["attention_mask"].to(device)
    context_mask = batch["context_mask"].to(device)
    last = batch["last"].to(device)
    with torch.inference_mode():
        tr = stack.trace(input_ids, attention_mask, logits=False)
        p_logits = final_logits(stack, tr.hidden, last)
        t_star = p_logits.argmax(dim=-1)
        p_t = target_probs(stack, tr.hidden, last, t_star, top_k=top_k)
        p_t, p_t_k = p_t if isinstance(p_t, tuple) else (p_t, p_t)
        idx = support(p_logits, top_k)
        n = stack.num_layers
        js = torch.zeros(input_ids.shape[0], n + 1, dtype=torch.float64)
        outside = torch.zeros(input_ids.shape[0], n + 1, dtype=torch.float64)
        for i, q_logits in perturbed_logits(stack, tr, context_mask, last, schedule=schedule,
                                            max_rows=max_rows, input_ids=input_ids):
            js[:, i + 1] = topk_js(p_logits, q_logits, top_k, idx=idx).cpu()
            outside[:, i + 1] = mass_outside(p_logits, q_logits, idx)
    p_t_np = p_t.double().cpu().numpy()
    p_k_np = p_t_k.double().cpu().numpy()
    js_np = js.numpy()
    return dict(t_star=t_star.cpu().numpy().astype(np.int64), p_final=p_t_np[:, -1].copy(), p_t=p_t_np, js=js_np,
                ratio=ratio(p_t_np, eps), djs=delta_js(js_np, eps), p_t_topk=p_k_np,
                ratio_topk=ratio(p_k_np, eps), q_mass_outside=outside.numpy())
