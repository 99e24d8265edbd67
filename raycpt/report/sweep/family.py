"""The statistics of a sweep's verdict: which comparisons against ``full`` count as a change, which row is best, and
what every interval covers (the registered statistics' own words, :mod:`raycpt.report.sweep.statistics`). Pure (numbers in, decisions out); :mod:`raycpt.report.sweep.verdict` builds the family
from the sweep's tables and writes these decisions into its cells.

**The family.** Every comparison a reading or a mark can rest on: for each row (a plan at a split, not
the baseline) the change against ``full`` of each domain and general task in each mode (all of the
task's questions, exact McNemar) and of the held-out loss (t over documents). One of them is the
pre-declared **primary** comparison (``report.primary``: ``task/mode`` or ``heldout_loss``); the rest are
**secondary** (exploratory).

**Two families** (issue 50): the comparisons against ``full`` (which plan is better than training every layer)
and the comparisons against the untrained model (``family: base``: each row's gain and forgetting). Each family
gets its own ``report.alpha`` and its own control, so a real forgetting is reported whether or not any plan beats
``full``; the legend names the family of every mark.

**Error control** (``report.adjust``), within each family:

* ``holm`` (default) - family-wise error <= ``report.alpha`` over *every* mark of the sweep, by the
  graphical procedure of Bretz et al. (2009) with a gate: the primary comparisons of the rows share
  ``alpha`` (Holm over rows); a rejected primary passes half of its weight on to the other rows'
  primaries and half to the secondary comparisons, which share it (Holm among themselves). With no
  primary rejected no secondary can be marked, so under no true change the chance of any mark is
  <= alpha. Adjusted p-values by the graph's sequential rejection (Bretz et al. 2011).
* ``bh`` - Benjamini-Hochberg over the whole family: the expected share of false marks among the
  marks is <= ``report.alpha`` (a weaker promise, stated as such in the legend).

A cell is marked ▲ / ▼ only when its *adjusted* p-value is below ``alpha``; cells outside the family
(per-category columns, the Average column) carry intervals but never a mark.

**Best.** On the primary metric the best row is named only when it beats every other row in a paired
test, Bonferroni over all pairs of rows (valid whichever row turns out on top); otherwise "no clear best"
with the runner-up it did not beat.
"""

from __future__ import annotations

from typing import Optional, Sequence

from raycpt.report.sweep.statistics import covers
from raycpt.stats import adjust

HELDOUT = "heldout_loss"
ALPHA = 0.05


def parse_primary(spec: Optional[str]) -> Optional[dict]:
    """``"wordnet_mc/logit"`` -> ``{"task", "mode"}``; ``"heldout_loss"`` -> ``{"task": "heldout_loss"}``;
    None / "" -> None (no primary: every comparison is in one Holm family)."""
    if not spec:
        return None
    if spec == HELDOUT:
        return {"task": HELDOUT, "mode": None}
    parts = spec.split("/")
    if len(parts) != 2 or not all(parts):
        raise ValueError(f"report.primary={spec!r}: expected 'task/mode' (e.g. wordnet_mc/logit) or 'heldout_loss'")
    return {"task": parts[0], "mode": parts[1]}


def is_primary(comp: dict, primary: Optional[dict]) -> bool:
    if primary is None:
        return False
    if primary["task"] == HELDOUT:
        return comp["task"] == HELDOUT
    return comp["task"] == primary["task"] and comp["mode"] == primary["mode"]


# ------------------------------------------------------------------------------------------ graphical Holm
def _gate_graph(primary: Sequence[bool]) -> tuple[list[float], list[list[float]]]:
    """Initial weights and transition matrix: primaries share weight 1; a primary passes half to the other
    primaries and half to the secondaries (equal shares; all to one side when the other is empty); a
    secondary passes everything to the other secondaries (Holm among them). No primary: plain Holm."""
    m = len(primary)
    prim = [i for i in range(m) if primary[i]]
    sec = [i for i in range(m) if not primary[i]]
    first = prim or sec
    w = [1.0 / len(first) if i in first else 0.0 for i in range(m)] if m else []
    g = [[0.0] * m for _ in range(m)]
    for i in range(m):
        same = [j for j in (prim if primary[i] else sec) if j != i]
        other = sec if primary[i] else []
        share_same = (0.5 if other else 1.0) if same else 0.0
        share_other = 1.0 - share_same if other else 0.0
        for j in same:
            g[i][j] = share_same / len(same)
        for j in other:
            g[i][j] = share_other / len(other)
    return w, g


def graph_adjusted(pvalues: Sequence[float], weights: Sequence[float], graph: Sequence[Sequence[float]]
                   ) -> list[float]:
    """Adjusted p-values of the weighted-Bonferroni graphical procedure (Bretz et al. 2009, 2011): at each
    step the hypothesis with the smallest p / w is rejected at the running maximum of those ratios, and its
    weight flows along the graph (edges renormalised through it)."""
    m = len(pvalues)
    w = list(map(float, weights))
    g = [list(map(float, row)) for row in graph]
    left = set(range(m))
    out = [1.0] * m
    run = 0.0
    while left:
        j = min(left, key=lambda i: (pvalues[i] / w[i]) if w[i] > 0 else float("inf"))
        q = pvalues[j] / w[j] if w[j] > 0 else float("inf")
        run = min(1.0, max(run, q))
        out[j] = run
        left.discard(j)
        for k in left:
            w[k] += w[j] * g[j][k]
        g2 = [row[:] for row in g]
        for k in left:
            for l2 in left:
                if k == l2:
                    g2[k][l2] = 0.0
                    continue
                den = 1.0 - g[k][j] * g[j][k]
                g2[k][l2] = (g[k][l2] + g[k][j] * g[j][l2]) / den if den > 1e-12 else 0.0
        g, w[j] = g2, 0.0
    return out


FAMILY_FULL, FAMILY_BASE = "vs full", "vs base"


def adjusted(comparisons: list[dict], method: str = "holm") -> list[Optional[float]]:
    """Adjusted p-values of the comparisons (``comparisons[i]["p"]``, ``["primary"]``), each family
    (``["family"]``: :data:`FAMILY_FULL` by default, :data:`FAMILY_BASE`) controlled on its own; None where p is
    None."""
    out: list[Optional[float]] = [None] * len(comparisons)
    for fam in dict.fromkeys(c.get("family", FAMILY_FULL) for c in comparisons):
        idx = [i for i, c in enumerate(comparisons)
               if c.get("p") is not None and c.get("family", FAMILY_FULL) == fam]
        if not idx:
            continue
        ps = [float(comparisons[i]["p"]) for i in idx]
        if method == "bh":
            vals = adjust(ps, "bh")
        elif method == "holm":
            w, g = _gate_graph([bool(comparisons[i].get("primary")) for i in idx])
            vals = graph_adjusted(ps, w, g)
        else:
            raise ValueError(f"report.adjust={method!r}: holm or bh")
        for i, v in zip(idx, vals):
            out[i] = v
    return out


def decide(comparisons: list[dict], method: str = "holm", alpha: float = ALPHA) -> list[dict]:
    """Each comparison with ``p_adj`` and its adjusted ``sign`` (+1 / -1 when p_adj < alpha, by the sign of
    the delta; 0 otherwise; None without a p-value) and ``role`` (primary / secondary)."""
    out = []
    for c, pa in zip(comparisons, adjusted(comparisons, method)):
        sign = None if pa is None else (0 if pa >= alpha or not c.get("delta") else (1 if c["delta"] > 0 else -1))
        out.append({**c, "p_adj": pa, "sign": sign, "role": "primary" if c.get("primary") else "secondary",
                    "family": c.get("family", FAMILY_FULL)})
    return out


# ------------------------------------------------------------------------------------------ best
def best_row(values: dict[str, float], pair_p, alpha: float = ALPHA, higher_is_better: bool = True) -> dict:
    """The best row on the primary metric, named only when it beats every other row: ``pair_p(a, b)``, the
    two-sided p-value of a paired test of rows a and b, below alpha / (number of pairs of rows) for each
    other row. Returns ``{"best", "top", "runner_up", "p", "clear", "pairs"}``; ``best`` is None when the top
    row does not beat the runner-up (or another row), ``p`` is the largest of its pairwise p-values."""
    names = [n for n, v in values.items() if v is not None]
    if len(names) < 2:
        return {"best": None, "top": names[0] if names else None, "runner_up": None, "p": None, "clear": False,
                "pairs": 0}
    order = sorted(names, key=lambda n: values[n], reverse=higher_is_better)
    top, runner = order[0], order[1]
    pairs = len(names) * (len(names) - 1) // 2
    ps = [pair_p(top, other) for other in order[1:]]
    worst = None if any(p is None for p in ps) else max(ps)
    clear = worst is not None and values[top] != values[runner] and worst < alpha / pairs
    return {"best": top if clear else None, "top": top, "runner_up": runner, "p": worst, "clear": clear,
            "pairs": pairs}


# ------------------------------------------------------------------------------------------ words
def method_words(method: str, alpha: float = ALPHA) -> str:
    """How the family's marks are controlled, in words."""
    if method == "bh":
        return (f"Benjamini-Hochberg over the whole family: expected share of false marks among the marks "
                f"<= {alpha:g} (false-discovery rate, not family-wise)")
    return (f"Holm with a gate (graphical procedure): the primary comparison across rows first, then the "
            f"secondary ones with the alpha the rejected primaries pass on; family-wise error <= {alpha:g} "
            f"over every ▲ / ▼ of the family")


def legend(methods: Sequence[str], primary: Optional[str], adjust_method: str = "holm", alpha: float = ALPHA,
           family_size: int = 0, base_size: int = 0) -> list[str]:
    """The legend lines: what the marks mean in each family, the primary comparison, and the noise each interval
    covers. ``family_size``: comparisons against full; ``base_size``: against base (their own family)."""
    lines = [f"▲ / ▼ in a Δ vs full column: family 'vs full', better / worse than full after multiplicity control "
             f"({method_words(adjust_method, alpha)} of that family; {family_size} comparisons); an interval "
             "excluding 0 without a mark is not a finding."]
    if base_size:
        lines.append(f"▲ / ▼ in a gain / forgetting column: family 'vs base', better / worse than the untrained model, "
                     f"its own error control ({adjust_method}, error <= {alpha:g} over its {base_size} comparisons), "
                     "decided whether or not any plan beats full.")
    lines += [f"Primary comparison (pre-declared, report.primary): {primary or 'none (all comparisons secondary)'}; "
              "every other comparison is secondary and exploratory."]
    for m in dict.fromkeys(m for m in methods if m):
        lines.append(f"[{m}] 95% interval covers {covers(m)}.")
    return lines
