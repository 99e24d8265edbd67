"""Layer contribution from single-layer training scans (pure: no Ray, no MLflow, no torch).

``contribution(l) = (score_l - score_base) / (score_full - score_base)``: the share of full training's
gain that training layer ``l`` alone recovers. 1.0 = as good as full training, > 1.0 better than it,
0 = no gain, < 0 = worse than the untrained base.

Also here: ranking, counts above a threshold, Spearman rank correlation between two scans (scipy,
with its p-value), Jaccard overlap of the questions each layer-trained model newly solves, and a
majority vote over several models' per-question answers, and its control (seed 003): one model answering
k times by seeded sampling of its choice distribution, then voting.
"""

from __future__ import annotations

import itertools
import math
import zlib
from collections import Counter
from typing import Any, Hashable, Mapping, Optional, Sequence

import numpy as np

from raycpt.errors import RaycptError
from raycpt.stats import fieller_ratio, paired_accuracy_delta


def contributions(scores: Mapping[int, float], base: float, full: float) -> dict[int, float]:
    """contribution(l) for every layer in ``scores`` (layer -> score of the model trained on l alone).

    Raises RaycptError when full training did not move the score (the ratio is undefined)."""
    gain = full - base
    if not math.isfinite(gain) or abs(gain) < 1e-12:
        raise RaycptError(f"contribution is undefined: full training scored {full:.6g}, the same as the base "
                          f"({base:.6g}); train longer or evaluate on more questions")
    return {int(l): (float(s) - base) / gain for l, s in sorted(scores.items())}


def rank_layers(contrib: Mapping[int, float]) -> list[int]:
    """Layers by contribution, best first (ties: the lower layer first; NaN last)."""
    def key(item):
        l, c = item
        return (1, 0.0, l) if c is None or not math.isfinite(c) else (0, -c, l)
    return [l for l, _ in sorted(contrib.items(), key=key)]


def count_above(contrib: Mapping[int, float], threshold: float = 1.0) -> int:
    """How many layers have a contribution strictly above ``threshold`` (1.0 = beats full training)."""
    return sum(1 for c in contrib.values() if c is not None and math.isfinite(c) and c > threshold)


def relative_depth(layer: int, num_layers: int) -> float:
    """Relative depth of a layer's centre: ``(l + 0.5) / N`` in (0, 1)."""
    return (layer + 0.5) / num_layers


def in_band(layer: int, num_layers: int, band: tuple[float, float] = (0.4, 0.6)) -> bool:
    """Whether a layer's relative depth lies in ``band`` (the papers' middle 40-60%)."""
    d = relative_depth(layer, num_layers)
    return band[0] <= d <= band[1]


def spearman(a: Mapping[int, float], b: Mapping[int, float]) -> tuple[float, float]:
    """Spearman rank correlation between two contribution maps over their common layers, and its p-value."""
    from scipy.stats import spearmanr

    common = sorted(set(a) & set(b))
    if len(common) < 3:
        raise RaycptError(f"Spearman needs at least 3 layers in common between the two rankings, got {len(common)}")
    res = spearmanr([a[l] for l in common], [b[l] for l in common])
    return float(res.statistic), float(res.pvalue)


def _ranks(x) -> np.ndarray:
    """Average ranks (1-based; ties share their mean rank)."""
    x = np.asarray(x, dtype=np.float64)
    order = np.argsort(x, kind="stable")
    r = np.empty(len(x))
    r[order] = np.arange(1, len(x) + 1)
    for v in np.unique(x):
        tie = x == v
        r[tie] = r[tie].mean()
    return r


def l2_control(contribution: Mapping[int, float], l2_full: Mapping[int, float], n_perm: int = 20000,
               seed: int = 0) -> dict:
    """Seed 003's L2 control as a statistic: do the layers that contribute most (trained alone) simply move most
    under full training? Spearman's rho between ``contribution(l)`` and full training's per-layer weight change
    ``||W_l - W_l(base)||`` over the layers both have (finite), with a two-sided permutation p-value (every
    pairing when n <= 8, else ``n_perm`` seeded permutations, p = (1 + #{|rho*| >= |rho|}) / (1 + n_perm)); and
    how uniform full's changes are (coefficient of variation, max / min), the seed's "0.5 to 0.8" reading."""
    common = sorted(l for l in set(contribution) & set(l2_full)
                    if math.isfinite(float(contribution[l])) and math.isfinite(float(l2_full[l])))
    if len(common) < 3:
        return {"unavailable": f"{len(common)} layers with both a contribution and a full-training L2 change "
                               "(needs 3)"}
    a, b = _ranks([contribution[l] for l in common]), _ranks([l2_full[l] for l in common])
    rho = float(np.corrcoef(a, b)[0, 1]) if a.std() > 0 and b.std() > 0 else float("nan")
    n = len(common)
    if n <= 8:
        perms = np.array(list(itertools.permutations(range(n))))
        method = f"exact over all {len(perms)} pairings"
    else:
        rng = np.random.default_rng(int(seed))
        perms = np.array([rng.permutation(n) for _ in range(int(n_perm))])
        method = f"{int(n_perm)} seeded permutations"
    null = np.array([np.corrcoef(a, b[p])[0, 1] for p in perms])
    hits = int(np.sum(np.abs(null) >= abs(rho) - 1e-12))
    p = hits / len(perms) if n <= 8 else (1 + hits) / (1 + len(perms))
    l2 = np.array([float(l2_full[l]) for l in common])
    return {"rho": rho, "p": float(p), "n": n, "method": method, "layers": common,
            "l2_full_cv": float(l2.std(ddof=1) / l2.mean()) if l2.mean() > 0 else float("nan"),
            "l2_full_max_over_min": float(l2.max() / l2.min()) if l2.min() > 0 else float("inf")}


def newly_solved(base_correct: Mapping[Hashable, bool], model_correct: Mapping[Hashable, bool]) -> set:
    """Questions the model answers correctly that the base model got wrong."""
    return {q for q, ok in model_correct.items() if ok and not base_correct.get(q, False)}


def jaccard(a: set, b: set) -> float:
    """|A & B| / |A | B| (NaN when both are empty)."""
    union = a | b
    return len(a & b) / len(union) if union else float("nan")


def pairwise_jaccard(sets: Mapping[Any, set]) -> dict[tuple, float]:
    """Jaccard of every unordered pair of named sets."""
    return {(x, y): jaccard(sets[x], sets[y]) for x, y in itertools.combinations(sorted(sets), 2)}


def mean_jaccard(sets: Mapping[Any, set]) -> float:
    """Mean pairwise Jaccard (NaN pairs skipped; NaN if none left)."""
    vals = [v for v in pairwise_jaccard(sets).values() if math.isfinite(v)]
    return float(np.mean(vals)) if vals else float("nan")


def majority_vote(answers: Sequence[Mapping[Hashable, Any]]) -> dict[Hashable, Any]:
    """Per question, the answer most of the models give.

    ``answers`` is ordered best model first; a tie between answers goes to the one the best-ranked model
    among the tied gave (so with one model the vote is that model). Missing answers (None) do not vote."""
    if not answers:
        raise RaycptError("majority vote needs at least one model's answers")
    questions: list = []
    seen: set = set()
    for amap in answers:
        for q in amap:
            if q not in seen:
                seen.add(q)
                questions.append(q)
    out = {}
    for q in questions:
        votes = [amap.get(q) for amap in answers]
        votes = [v for v in votes if v is not None]
        if not votes:
            out[q] = None
            continue
        counts = Counter(votes)
        top = max(counts.values())
        tied = {v for v, c in counts.items() if c == top}
        out[q] = next(v for v in votes if v in tied)
    return out


def sample_choice(logprobs: Sequence[float], temperature: float, u: float) -> int:
    """The choice a model answering once picks: index ``i`` of ``softmax(logprobs / T)`` at the uniform draw
    ``u`` in [0, 1) (inverse CDF). ``T <= 0`` is the greedy answer, the first maximum (as the argmax
    prediction of logit / cloze mode), and so is the limit ``T -> 0``."""
    if temperature <= 0:
        return max(range(len(logprobs)), key=lambda i: (logprobs[i], -i))
    z = np.asarray(logprobs, dtype=np.float64) / temperature
    p = np.exp(z - z.max())
    cdf = np.cumsum(p / p.sum())
    return int(min(np.searchsorted(cdf, u, side="right"), len(cdf) - 1))


def question_draws(question: str, k: int, seed: int) -> np.ndarray:
    """``k`` uniforms in [0, 1) for one question: a pure function of (seed, question id), so a question's
    samples do not depend on which other questions were evaluated or in what order."""
    return np.random.default_rng([int(seed), zlib.crc32(str(question).encode())]).random(k)


def sampled_answers(logprobs: Mapping[Hashable, Sequence[float]], k: int, temperature: float, seed: int,
                    letters: str = "ABCDEFGHIJ") -> list[dict[Hashable, str]]:
    """One model answering every question ``k`` times by sampling its choice distribution at ``temperature``
    (seeded: :func:`question_draws`): ``k`` answer maps, draw 0 first."""
    draws = {q: question_draws(q, k, seed) for q in logprobs}
    return [{q: letters[sample_choice(lp, temperature, draws[q][j])] for q, lp in logprobs.items()}
            for j in range(k)]


def sampled_vote(answers: Mapping[Hashable, Mapping[str, Any]], k: int, temperature: float, seed: int) -> dict:
    """Seed 003's control of the top-k vote: the same (full-trained) model answering ``k`` times and voting.

    ``answers``: ``{question: {"pred", "gold", "logprobs"}}`` (logit or cloze mode). The draws are
    exchangeable, so a tie goes to the earliest draw among the tied (:func:`majority_vote`). Accuracies in
    percent: the vote, one sample on average, and the greedy answer."""
    lps = {q: a["logprobs"] for q, a in answers.items() if a.get("logprobs")}
    if len(lps) < len(answers) or not lps:
        raise RaycptError("the sampled vote needs every question's choice log-likelihoods (logit or cloze mode)")
    gold = {q: a["gold"] for q, a in answers.items()}
    samples = sampled_answers(lps, k, temperature, seed)
    return dict(k=k, temperature=float(temperature), seed=int(seed),
                vote_acc=100 * accuracy(majority_vote(samples), gold),
                sample_acc=100 * float(np.mean([accuracy(s, gold) for s in samples])),
                greedy_acc=100 * accuracy({q: a["pred"] for q, a in answers.items()}, gold), num_questions=len(gold))


def gold_probability(logprobs: Sequence[float], gold_index: int) -> float:
    """Probability of the gold choice among the choices: ``softmax(logprobs)[gold_index]``."""
    m = max(logprobs)
    exps = [math.exp(v - m) for v in logprobs]
    return exps[gold_index] / sum(exps)


def primary_score(cells: dict[str, float], eval_cfg) -> tuple[str, float]:
    """The one number a model is judged by: ``<first task>/overall/<first mode>`` (accuracy over all
    questions, percent), else that task's ``average``, else the mean of all cells."""
    task, mode = eval_cfg.tasks[0], eval_cfg.modes[0]
    for key in (f"{task}/overall/{mode}", f"{task}/average/{mode}"):
        if key in cells:
            return key, float(cells[key])
    vals = [float(v) for v in cells.values() if isinstance(v, (int, float))]
    return "mean", (sum(vals) / len(vals) if vals else float("nan"))


def answers_of(questions: list[dict], mode: str) -> dict[str, dict]:
    """Per-question ``{pred, gold, correct}`` of one task's evaluated questions in ``mode`` (plus the
    choices' ``logprobs`` in logit and cloze mode)."""
    out = {}
    for q in questions:
        rec = q.get(mode)
        if rec:
            pred = rec.get("extracted") if mode == "generate" else rec.get("prediction")  # logit, cloze: the argmax
            out[str(q["id"])] = {"pred": pred, "gold": q.get("gold"), "correct": bool(rec.get("correct"))}
            if rec.get("logprobs"):  # logit, cloze: what the sampled vote draws from
                out[str(q["id"])]["logprobs"] = [float(v) for v in rec["logprobs"]]
    return out


def gold_prob_of(questions: list[dict]) -> Optional[float]:
    """Mean probability (percent) of the gold letter among A-D in logit mode; None without logit records."""
    vals = [gold_probability(q["logit"]["logprobs"], "ABCD".index(q["gold"])) for q in questions
            if q.get("logit") and q["logit"].get("logprobs") and q.get("gold") in "ABCD"]
    return 100.0 * sum(vals) / len(vals) if vals else None


def accuracy(pred: Mapping[Hashable, Any], gold: Mapping[Hashable, Any]) -> float:
    """Share of the questions in ``gold`` whose prediction equals the gold answer."""
    if not gold:
        return float("nan")
    return sum(1 for q, g in gold.items() if pred.get(q) == g) / len(gold)


def summarize_scan(scores: Mapping[int, float], base: float, full: float, num_layers: int,
                   band: tuple[float, float] = (0.4, 0.6), threshold: float = 1.0) -> dict:
    """Everything the contribution table shows, from the raw scores."""
    contrib = contributions(scores, base, full)
    ranking = rank_layers(contrib)
    above = count_above(contrib, threshold)
    band_layers = [l for l in contrib if in_band(l, num_layers, band)]
    band_mean = float(np.mean([contrib[l] for l in band_layers])) if band_layers else float("nan")
    out_mean = float(np.mean([c for l, c in contrib.items() if l not in band_layers])) \
        if len(band_layers) < len(contrib) else float("nan")
    return dict(contribution=contrib, ranking=ranking, num_above=above, threshold=threshold,
                base_score=base, full_score=full, band=list(band), band_mean=band_mean, outside_mean=out_mean,
                best_layer=ranking[0] if ranking else None)


def analyze_scan(base: Mapping[str, Any], full: Mapping[str, Any], singles: Mapping[int, Mapping[str, Any]],
                 num_layers: int, band: tuple[float, float] = (0.4, 0.6), threshold: float = 1.0,
                 top_k: int = 7, against: Optional[Mapping[int, float]] = None,
                 sample: Optional[Mapping[str, float]] = None) -> dict:
    """Everything ``raycpt contribution`` reports, from the trials' results.

    Each result is a mapping with ``score`` (the benchmark number), optionally ``answers``
    (``{question: {"pred": x, "gold": y, "correct": bool}}``) and ``l2`` (per-layer
    ``||W - W_base||_F`` of that model, a list over layers). ``singles`` maps layer -> result.

    Returns the :func:`summarize_scan` fields plus ``l2_single`` / ``l2_full`` ({layer: value}), ``l2_control``
    (:func:`l2_control`: Spearman of contribution against full's L2 change, permutation p-value),
    ``jaccard`` (mean pairwise Jaccard of the newly solved questions of the top-k single-layer
    models, and the pairs), ``vote`` (majority vote of the top-k models vs the best single model and
    full, accuracies in percent on the same questions), ``sampled_vote`` (with ``sample`` = ``{temperature,
    seed}``: ``full`` answering k times and voting, :func:`sampled_vote`; ``{"unavailable": why}`` when its
    answers carry no choice log-likelihoods) and ``spearman`` against another ranking."""
    scores = {int(l): float(r["score"]) for l, r in singles.items()}
    out = summarize_scan(scores, float(base["score"]), float(full["score"]), num_layers, band, threshold)
    contrib, ranking = out["contribution"], out["ranking"]
    out["scores"] = scores
    out["l2_single"] = {int(l): float(r["l2"][int(l)]) for l, r in singles.items() if r.get("l2")}
    out["l2_full"] = {i: float(v) for i, v in enumerate(full.get("l2") or [])}
    out["l2_control"] = l2_control(out["contribution"], out["l2_full"])
    k = max(1, min(top_k, len(ranking)))
    top = ranking[:k]
    out["top_k"] = top
    if base.get("answers") and all(singles[l].get("answers") for l in top):
        base_ok = {q: a["correct"] for q, a in base["answers"].items()}
        sets = {l: newly_solved(base_ok, {q: a["correct"] for q, a in singles[l]["answers"].items()}) for l in top}
        pairs = pairwise_jaccard(sets)
        out["jaccard"] = dict(mean=mean_jaccard(sets), newly_solved={l: len(s) for l, s in sets.items()},
                              pairs=[{"a": a, "b": b, "jaccard": v} for (a, b), v in pairs.items()])
        gold = {q: a["gold"] for q, a in base["answers"].items()}
        vote = majority_vote([{q: a["pred"] for q, a in singles[l]["answers"].items()} for l in top])
        single_acc = {l: 100 * accuracy({q: a["pred"] for q, a in r["answers"].items()}, gold)
                      for l, r in singles.items() if r.get("answers")}
        best = max(single_acc, key=lambda l: (single_acc[l], -l))
        out["vote"] = dict(k=k, models=top, vote_acc=100 * accuracy(vote, gold), best_single_layer=best,
                           best_single_acc=single_acc[best],
                           full_acc=100 * accuracy({q: a["pred"] for q, a in full["answers"].items()}, gold)
                           if full.get("answers") else float("nan"),
                           base_acc=100 * accuracy({q: a["pred"] for q, a in base["answers"].items()}, gold),
                           num_questions=len(gold))
        if sample is not None:
            out["sampled_vote"] = full_sampled_vote(full, k, sample)
            if "unavailable" not in out["sampled_vote"]:
                out["sampled_vote"]["paired"] = vote_against_sampled(vote, full["answers"], k, sample)
    out.update(contribution_intervals(base, full, singles))
    if against:
        rho, p = spearman(contrib, against)
        out["spearman"] = dict(rho=rho, p_value=p, layers=len(set(contrib) & set(against)))
    return out


def full_sampled_vote(full: Mapping[str, Any], k: int, sample: Mapping[str, float]) -> dict:
    """:func:`sampled_vote` of the full model's answers, or ``{"unavailable": why}`` (one line)."""
    answers = full.get("answers") or {}
    if not answers or not all(a.get("logprobs") for a in answers.values()):
        return {"unavailable": "the full model's answers carry no choice log-likelihoods: the sampled vote needs "
                               "eval.modes[0] logit or cloze (generate answers cannot be resampled afterwards)"}
    return sampled_vote(answers, k, float(sample["temperature"]), int(sample["seed"]))


def vote_against_sampled(vote: Mapping[Hashable, Any], answers: Mapping[Hashable, Mapping[str, Any]], k: int,
                         sample: Mapping[str, float], level: float = 0.95) -> dict:
    """The top-k vote against its control, question by question: ``vote`` (question -> the top-k models' voted
    answer) minus the full model's ``k``-sample vote (:func:`sampled_answers` of ``answers``, then
    :func:`majority_vote`), in accuracy points with the exact McNemar p (:func:`raycpt.stats.paired_accuracy_delta`)
    over the questions of ``answers``."""
    lps = {q: a["logprobs"] for q, a in answers.items()}
    control = majority_vote(sampled_answers(lps, k, float(sample["temperature"]), int(sample["seed"])))
    qs = list(answers)
    x = np.array([vote.get(q) == answers[q]["gold"] for q in qs], dtype=float)
    y = np.array([control.get(q) == answers[q]["gold"] for q in qs], dtype=float)
    d = paired_accuracy_delta(x, y, level, scale=100.0)
    return {"delta": d.point, "lo": d.lo, "hi": d.hi, "p": d.p, "num_questions": len(qs)}


def elite_lr_control(full: Mapping[str, Any], top: Mapping[str, Any], bottom: Mapping[str, Any],
                     level: float = 0.95) -> dict:
    """Seed 003's elite-LR recipe against its control: ``top`` (the k best layers at a higher LR, the rest at
    lr x1) and ``bottom`` (the k lowest-contribution layers, same k and scale) against ``full`` (every layer at
    lr x1). Scores and their differences; with per-question answers also the paired accuracy differences
    (exact McNemar p, :func:`raycpt.stats.paired_accuracy_delta`) top - full, bottom - full, top - bottom."""
    sf, st, sb = float(full["score"]), float(top["score"]), float(bottom["score"])
    out: dict = dict(full_score=sf, top_score=st, bottom_score=sb, top_minus_full=st - sf,
                     bottom_minus_full=sb - sf, top_minus_bottom=st - sb, top_layers=top.get("elite_layers"),
                     bottom_layers=bottom.get("elite_layers"))
    ans = [m.get("answers") or {} for m in (full, top, bottom)]
    qs = [q for q in ans[0] if q in ans[1] and q in ans[2]]
    if qs:
        x = {name: np.array([a[q]["correct"] for q in qs], dtype=float)
             for name, a in zip(("full", "top", "bottom"), ans)}
        pairs = {}
        for a, b in (("top", "full"), ("bottom", "full"), ("top", "bottom")):
            d = paired_accuracy_delta(x[a], x[b], level, scale=100.0)
            pairs[f"{a}-{b}"] = {"delta": d.point, "lo": d.lo, "hi": d.hi, "p": d.p}
        out["accuracy"] = {"num_questions": len(qs), **{k: 100 * float(v.mean()) for k, v in x.items()}}
        out["paired"] = pairs
    return out


def contribution_intervals(base: Mapping[str, Any], full: Mapping[str, Any], singles: Mapping[int, Mapping[str, Any]],
                           level: float = 0.95) -> dict:
    """Fieller intervals of each layer's contribution (per-question 0/1 answers: layer-l model minus base
    over full minus base), with the guard a ratio needs: when full training's own gain over the base is
    not distinguishable from 0, or negative, the ratios (and their signs) mean nothing and no interval is
    given - ``contribution_guard`` says why. {} without per-question answers."""
    if not base.get("answers") or not full.get("answers"):
        return {}
    qs = [q for q in base["answers"] if q in full["answers"]]
    x0 = np.array([base["answers"][q]["correct"] for q in qs], dtype=float)
    xf = np.array([full["answers"][q]["correct"] for q in qs], dtype=float)
    gain = paired_accuracy_delta(xf, x0, level, scale=100.0)
    out: dict = {"full_gain": {"delta": gain.point, "lo": gain.lo, "hi": gain.hi, "p": gain.p}}
    if gain.lo <= 0:
        out["contribution_guard"] = (f"full training's gain over the base is {gain.point:+.2f} points "
                                     f"[{gain.lo:+.2f}, {gain.hi:+.2f}] (exact McNemar p = {gain.p:.3g}): not above "
                                     "0, so the contribution ratios and their signs are not interpretable")
        return out
    cis = {}
    for l, r in singles.items():
        ans = r.get("answers") or {}
        if all(q in ans for q in qs):
            xl = np.array([ans[q]["correct"] for q in qs], dtype=float)
            lo, hi, ok = fieller_ratio(xl - x0, xf - x0, level)
            cis[int(l)] = [lo, hi] if ok else [None, None]
    out["contribution_ci"] = cis
    return out
