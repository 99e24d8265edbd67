"""Diagnostics: pure torch/numpy (lens, perturbation, scores, similarity, contribution, drift, selectors).

The layer selectors are declared here, in the one registry (:data:`raycpt.registry.SELECTORS`), in the order
``raycpt select --help`` lists them: each name with its help, the ranking file's ``metric``, what it ``needs``
(``weights``: the model; ``blocks``: the model and corpus blocks; ``trace``: a trace's profiles; ``seed``: nothing
else) and a lazy reference to its score function ``SelectorInputs -> (N,) scores`` in
:mod:`raycpt.diagnostics.selectors`, imported (with torch) on the first ``SELECTORS.get``. The package root imports
this package, so ``select.method`` is checked and the CLI help written without torch.
"""

from __future__ import annotations

from raycpt.registry import SELECTORS
from raycpt.usage import lazy

SELECTORS.register("bi", lazy("raycpt.diagnostics.selectors", "block_influence_of_blocks"),
                   help="Block Influence on corpus blocks", metric="block_influence", needs="blocks")
SELECTORS.register("snr", lazy("raycpt.diagnostics.selectors", "weight_snr_of"),
                   help="weight-only SNR, the mean over a layer's matrices", metric="weight_snr", needs="weights")
SELECTORS.register("layertracer", lazy("raycpt.diagnostics.selectors", "layertracer_of"),
                   help="LS^ - TP^ of a trace", metric="ls_norm_minus_tp_norm", needs="trace")
SELECTORS.register("random", lazy("raycpt.diagnostics.selectors", "random_of"),
                   help="seeded", metric="random", needs="seed")
SELECTORS.register("elo", lazy("raycpt.diagnostics.selectors", "elo_of"),
                   help="first and last layers first", metric="distance_from_middle", needs="seed")
SELECTORS.register("gradnorm", lazy("raycpt.diagnostics.selectors", "gradient_norm_scores"),
                   help="per-layer gradient norm of the LM loss on corpus blocks, AdaGradSelect-style",
                   metric="gradient_norm", needs="blocks")
