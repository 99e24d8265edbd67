"""The contribution scan's files: the per-layer table, the markdown summary, the plots and summary.json."""

from __future__ import annotations

from pathlib import Path

from raycpt.diagnostics.contribution import in_band, relative_depth
from raycpt.report.compare import markdown_table, plot_contribution, plot_l2_change, write_csv
from raycpt.io import atomic_write_json, atomic_write_text


def write_outputs(run_dir: Path, a: dict, trials: dict[str, dict], n: int, s) -> list[Path]:
    """contribution.csv / .md, plots (contribution vs depth with the band, L2 change), summary.json;
    ``s`` is the :class:`raycpt.config.ContributionConfig`."""
    rows = []
    rank_of = {l: i + 1 for i, l in enumerate(a["ranking"])}
    for l in sorted(a["contribution"]):
        t = trials[f"single-L{l:02d}"]
        rows.append({"layer": l, "depth": round(relative_depth(l, n), 4), "in_band": in_band(l, n, s.band),
                     "score": t["score"], "contribution": a["contribution"][l],
                     "contribution_lo": (a.get("contribution_ci") or {}).get(l, [None, None])[0],
                     "contribution_hi": (a.get("contribution_ci") or {}).get(l, [None, None])[1], "rank": rank_of[l],
                     "l2_single": a["l2_single"].get(l, float("nan")), "l2_full": a["l2_full"].get(l, float("nan")),
                     "final_loss": t.get("final_loss", float("nan")), "wall_s": round(t.get("wall_s", 0.0), 1)})
    files = [write_csv(rows, run_dir / "contribution.csv")]
    key = a.get("score_key", trials["full"]["score_key"])
    lines = [f"# Layer contribution ({key})", "",
             f"base {a['base_score']:.2f}, full {a['full_score']:.2f}; {a['num_above']} of {len(rows)} scanned "
             f"layers above {s.threshold:g}; mean contribution in the {s.band[0]:.0%}-{s.band[1]:.0%} band "
             f"{a['band_mean']:.3f}, outside {a['outside_mean']:.3f}; ranking (best first): "
             f"{', '.join(map(str, a['ranking']))}", ""]
    if a.get("contribution_guard"):
        lines += [f"**Guard:** {a['contribution_guard']}.", ""]
    elif a.get("contribution_ci") is not None:
        lines += ["contribution_lo / _hi: 95% Fieller interval over questions (per-question answers of base, full "
                  "and the layer's model; the full-training gain is clearly above 0).", ""]
    lines.append(markdown_table(rows))
    if "vote" in a:
        v = a["vote"]
        lines += ["", f"## Majority vote of the top-{v['k']} single-layer models (layers {v['models']})", "",
                  f"vote {v['vote_acc']:.2f} vs best single (layer {v['best_single_layer']}) "
                  f"{v['best_single_acc']:.2f} vs full {v['full_acc']:.2f} vs base {v['base_acc']:.2f} "
                  f"on {v['num_questions']} questions"]
    lines += control_lines(a)
    if "jaccard" in a:
        j = a["jaccard"]
        lines += ["", "## Newly solved questions (vs base) of the top-k models", "",
                  f"mean pairwise Jaccard {j['mean']:.3f}; newly solved per layer {j['newly_solved']}"]
        if j["pairs"]:
            files.append(write_csv(j["pairs"], run_dir / "jaccard.csv"))
    if "spearman" in a:
        sp = a["spearman"]
        lines += ["", f"## Spearman vs {s.against}", "",
                  f"rho {sp['rho']:.3f}, p {sp['p_value']:.3g} over {sp['layers']} layers"]
    files.append(atomic_write_text(run_dir / "contribution.md", "\n".join(lines) + "\n"))
    files.append(plot_contribution(a["contribution"], n, run_dir / "plots" / "contribution.png", s.band,
                                   title=f"contribution ({key}); {a['num_above']} layer(s) > {s.threshold:g}"))
    if a["l2_single"]:
        files.append(plot_l2_change(a["l2_single"], a["l2_full"], n, run_dir / "plots" / "l2_change.png"))
    summary = {k: v for k, v in a.items()}
    summary["contribution"] = {str(k): v for k, v in a["contribution"].items()}
    summary["scores"] = {str(k): v for k, v in a["scores"].items()}
    summary["l2_single"] = {str(k): v for k, v in a["l2_single"].items()}
    summary["l2_full"] = {str(k): v for k, v in a["l2_full"].items()}
    if "jaccard" in summary:
        solved = {str(k): v for k, v in a["jaccard"]["newly_solved"].items()}
        summary["jaccard"] = {**a["jaccard"], "newly_solved": solved}
    summary["trials"] = {k: {kk: vv for kk, vv in t.items() if kk not in ("answers", "cells")}
                         for k, t in trials.items()}
    files.append(atomic_write_json(run_dir / "summary.json", summary))
    return files


def _paired(d: dict) -> str:
    return f"{d['delta']:+.2f} points [{d['lo']:+.2f}, {d['hi']:+.2f}], exact McNemar p = {d['p']:.3g}"


def control_lines(a: dict) -> list[str]:
    """The markdown of seed 003's controls: the top-k vote against the full model's k-sample vote, the L2 control's
    statistic, the tuned-learning-rate baseline (``contribution.lr_grid``) and the elite-LR recipe against its
    bottom-k control (both against ``full``)."""
    lines: list[str] = []
    sv = a.get("sampled_vote")
    if sv and "unavailable" in sv:
        lines += ["", f"Sampled-vote control: not computed ({sv['unavailable']})."]
    elif sv:
        lines += ["", f"## Control: the full model answering {sv['k']} times (T = {sv['temperature']:g}, seed "
                      f"{sv['seed']}) and voting", "",
                  f"top-{sv['k']} vote {a['vote']['vote_acc']:.2f} vs full's sampled vote {sv['vote_acc']:.2f} "
                  f"(one sample {sv['sample_acc']:.2f}, greedy {sv['greedy_acc']:.2f}) on {sv['num_questions']} "
                  f"questions; vote - sampled vote: {_paired(sv['paired'])}"]
    lc = a.get("l2_control")
    if lc and "unavailable" in lc:
        lines += ["", f"L2 control: not computed ({lc['unavailable']})."]
    elif lc:
        lines += ["", "## Control: do the high-contribution layers simply move most under full training?", "",
                  f"Spearman rho between contribution and full training's per-layer L2 change = {lc['rho']:+.3f} over "
                  f"{lc['n']} layers, two-sided permutation p = {lc['p']:.3g} ({lc['method']}); full's L2 changes: "
                  f"coefficient of variation {lc['l2_full_cv']:.3f}, max / min {lc['l2_full_max_over_min']:.2f}"]
    t = a.get("lr_tuning")
    if t:
        grid = ", ".join(f"{g['lr']:.3g}{'*' if g['lr_mult'] == t['picked_mult'] else ''} "
                         f"(val {g['validation_loss']:.4f})" for g in t["grid"])
        lines += ["", "## Baseline: full at a tuned learning rate", "",
                  f"full trained at {grid}; the lowest validation loss picked lr {t['picked_lr']:.3g}"
                  + (" (at the grid's edge)" if t["edge"] else "") + ", which every scan trial used"]
    e = a.get("elite_lr_control")
    if e:
        lines += ["", f"## Control: elite LR x{e['lr_scale']:g} on the top-{e['k']} vs the bottom-{e['k']} layers",
                  "", f"{a.get('score_key', 'score')}: full {e['full_score']:.4g}, top (layers {e['top_layers']}) "
                      f"{e['top_score']:.4g}, bottom (layers {e['bottom_layers']}) {e['bottom_score']:.4g}; "
                      f"top - bottom {e['top_minus_bottom']:+.4g}"]
        if "paired" in e:
            acc = e["accuracy"]
            lines += ["", f"accuracy on {acc['num_questions']} questions: full {acc['full']:.2f}, top {acc['top']:.2f},"
                          f" bottom {acc['bottom']:.2f}"] + [f"- {k}: {_paired(v)}" for k, v in e["paired"].items()]
    return lines
