"""Layer plans: which decoder layers train, at what learning-rate scale, and whether embeddings,
final norm and head train.

A plan is chosen by registered name (``plan.name`` in the config); each builder maps
``(PlanConfig, num_layers)`` onto a :class:`LayerPlan`, a plain, model-agnostic value (layer indices,
per-layer LR scales, three flags and human-readable notes). Three functions apply it to a model:

* :func:`apply_plan` - the ONLY code in raycpt that writes ``requires_grad``;
* :func:`param_groups` - AdamW parameter groups over the trainable parameters only, one group per
  (LR scale, decay / no decay); norms and biases (1-D tensors) get no weight decay;
* :func:`plan_table` - the rows ``raycpt plan show`` prints (layer map, trainable/frozen counts).

Layer indexing: decoder layers are 0..N-1; ``split r`` puts layers [0, b) in the shallow side with
``b = floor(r * N + 1/2)`` (half up, :func:`raycpt.splits.split_index`: 0.5 * 5 -> 3; 2/3 of 28 -> 19).
Module paths always come from :class:`~raycpt.models.stack.LayerStack`.

Plans (papers: ``seeds/004`` train_shallow / train_deep; ``seeds/002`` Mid-Block patterns;
``seeds/003`` single layer, elite top-k, middle-5, higher LR for elite layers):

==============  ===============================================================================
full            every layer, embeddings, final norm and head (full-parameter training)
train_shallow   layers [0, b) train, [b, N) frozen
train_deep      layers [b, N) train, [0, b) frozen
blocks          a 0/1 pattern over equal contiguous blocks (``01100``: blocks 1 and 2 of 5 train);
                when N is not divisible by the pattern length the first ``N mod B`` blocks hold
                one layer more (``numpy.array_split``), e.g. N=30, ``0110`` -> 8, 8, 7, 7
layers          an explicit list of layers
single          one layer
elite           the top-k layers of a ranking file (see :func:`write_ranking`), trained with
                ``plan.elite_lr_scale``; ``plan.elite_train_rest`` also trains the others at scale 1;
                ``plan.elite_pick=bottom`` takes the k lowest-scored layers instead (003's control)
middle          the middle k layers: [(N - k) // 2, (N - k) // 2 + k) (28 layers, k=5 -> 11..15)
lisa            every K steps a seeded draw of gamma layers (LISA); embeddings, final norm, head always
expand          LLaMA-Pro block expansion: only the P inserted identity copies train
spectrum        Spectrum per weight type: the matrices ``plan.matrices`` names + embeddings and head
elo             ELO: the first and the last ``plan.elo_layers`` layers
==============  ===============================================================================

``plan.lr_scales`` ({layer: multiplier}) combine with any plan; a scale on a frozen layer is
ignored with a note.
"""

from __future__ import annotations

from raycpt.splits import split_index  # noqa: F401 - re-exported
from raycpt.strategies.apply import (adapter_ids, apply_plan, count_params, matrix_split, param_groups,
                                     param_layer_index, plan_table)
from raycpt.strategies.budget import budget_plans, check_budget
from raycpt.strategies.build import build_plan, plan_for_model
from raycpt.strategies.builders import block_sizes, ranked_pick  # importing it registers the plans
from raycpt.strategies.lisa import lisa_draw, lisa_interval_index, lisa_trainable_params
from raycpt.strategies.plan import LayerPlan
from raycpt.strategies.rankings import RANKING_FORMAT, read_ranking, write_ranking
from raycpt.strategies.registry import PLANS, PlanSpec, register_plan, split_plans, takes_split

__all__ = [
    "LayerPlan", "PLANS", "PlanSpec", "RANKING_FORMAT", "adapter_ids", "apply_plan", "block_sizes", "budget_plans",
    "build_plan", "check_budget", "count_params", "matrix_split", "lisa_draw", "lisa_interval_index",
    "lisa_trainable_params", "param_groups", "param_layer_index", "plan_for_model", "plan_table", "ranked_pick",
    "read_ranking", "register_plan", "split_index", "split_plans", "takes_split", "write_ranking",
]
