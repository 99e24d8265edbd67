"""What each command prints: ``render_<job>(result, console)``, the renderer a row of the CLI table names.

Data in, text out; every table is drawn here (or by the job's own report module), never in ``cli.py``.
"""

from __future__ import annotations

import math
import sys

from raycpt.report.eval import render_table
from raycpt.report.hybrid import counts_line, segment_table
from raycpt.report.sweep.views.sections import SECTION_HELP  # noqa: F401 - the CLI's runs show --section help

PLAIN = dict(markup=False, highlight=False, soft_wrap=True)


def render_sweep(res, console) -> None:
    """The verdict in a few lines and one table (Δ against full, gain and forgetting against base), then where the
    rest is: every per-category table is in ``summary/summary.md`` and ``raycpt runs show RUN_DIR --section all``."""
    from raycpt.report.sweep.views.terminal import compact_table, compact_verdict

    for line in compact_verdict(res.summary):
        console.print(line, markup=False, highlight=False)
    console.print(compact_table(res.summary))
    console.print(f"Per-category tables, legend, runs (also summary/summary.md): raycpt runs show {res.run_dir} "
                  "--section all", markup=False, highlight=False)
    console.print(f"sweep finished in {res.wall_s:.0f}s; MLflow parent run {res.parent_run_id} (raycpt ui to browse)",
                  markup=False, highlight=False)


def render_decide(res, console) -> None:
    """``raycpt decide``: its report was printed as it finished (:func:`raycpt.report.decide.write_decision`); where
    it is."""
    console.print(f"decide finished in {res.wall_s:.0f}s; summary/decision.md and decision.png in {res.run_dir}; "
                  f"MLflow parent run {res.parent_run_id} (raycpt ui to browse)", markup=False, highlight=False)


def render_runs_show(shown, console) -> None:
    """``raycpt runs show``: the overview, one section or all of them
    (:func:`raycpt.report.sweep.views.runs_show.show_items`); lines as written (no markup), a path's line unwrapped."""
    from raycpt.report.sweep.views.runs_show import PathLine, show_items

    for item in show_items(shown.section, shown.summary, shown.trials, shown.run_dir):
        if isinstance(item, str):
            console.print(item, markup=False, highlight=False, soft_wrap=isinstance(item, PathLine))
        else:
            console.print(item)


def render_compare(res, console) -> None:
    from rich.table import Table

    for child in res.children:
        t = Table("layer", "CKA", "cos", "shift", "dW attn", "dW mlp", "H prompt b/t", "eff.rank b/t", "probe b/t",
                  title=f"compare {child.run_dir.name}")
        for r in child.rows:
            t.add_row(str(r["layer"]), f"{r['cka']:.3f}", f"{r['cosine']:.3f}", f"{r['mean_shift']:.3g}",
                      f"{r.get('wc_attn', float('nan')):.3g}", f"{r.get('wc_mlp', float('nan')):.3g}",
                      f"{r['prompt_entropy_base']:.3f}/{r['prompt_entropy_tuned']:.3f}",
                      f"{r['effective_rank_base']:.1f}/{r['effective_rank_tuned']:.1f}",
                      f"{r['probe_accuracy_base']:.3f}/{r['probe_accuracy_tuned']:.3f}")
        console.print(t)
        if child.swaps:
            line = "  ".join(f"{s['direction']}[{s['layers'][0]}-{s['layers'][-1]}] {s['score']:.2f}"
                             for s in child.swaps)
            console.print(f"swap ({child.swaps[0]['score_key']}): base {child.base_score:.2f}, tuned "
                          f"{child.tuned_score:.2f}; {line}")
    console.print(f"compare finished in {res.wall_s:.1f}s; run folder {res.run_dir}; MLflow run {res.mlflow_run_id}")


def render_eval(out, console) -> None:
    results, run_dir, files = out
    for t in render_table(results):
        console.print(t)
    secs = ", ".join(f"{r.name}: " + " ".join(f"{k} {v:.1f}s" for k, v in r.seconds.items()) for r in results)
    console.print(f"times: {secs}")
    console.print(f"run folder {run_dir}: {files['csv'].name}, {files['questions'].name}, {files['table'].name}")


def render_contribution(res, console) -> None:
    from rich.table import Table

    if isinstance(res, dict):  # --spearman A.json,B.json
        console.print(f"Spearman rho = {res['rho']:.3f}, p = {res['p_value']:.3g} over {res['layers']} layers")
        return
    a = res.analysis
    t = Table("layer", "depth", "score", "contribution", "rank", "L2 alone", "L2 in full",
              title=f"contribution ({a['score_key']}): base {a['base_score']:.2f}, full {a['full_score']:.2f}")
    rank_of = {l: i + 1 for i, l in enumerate(a["ranking"])}
    for l in sorted(a["contribution"]):
        t.add_row(str(l), f"{(l + 0.5) / res.num_layers:.2f}", f"{a['scores'][l]:.2f}", f"{a['contribution'][l]:.3f}",
                  str(rank_of[l]), f"{a['l2_single'].get(l, float('nan')):.3g}",
                  f"{a['l2_full'].get(l, float('nan')):.3g}")
    console.print(t)
    console.print(f"{a['num_above']} layer(s) above {a['threshold']:g}; mean contribution in the "
                  f"{a['band'][0]:.0%}-{a['band'][1]:.0%} band {a['band_mean']:.3f}, outside {a['outside_mean']:.3f}")
    if "vote" in a:
        v = a["vote"]
        console.print(f"majority vote (accuracy %) of top-{v['k']} {v['models']}: {v['vote_acc']:.2f} vs best single "
                      f"(L{v['best_single_layer']}) {v['best_single_acc']:.2f} vs full {v['full_acc']:.2f} vs base "
                      f"{v['base_acc']:.2f}")
    if "jaccard" in a:
        console.print(f"mean Jaccard of newly solved questions (top-{len(a['top_k'])}): {a['jaccard']['mean']:.3f}")
    if "spearman" in a:
        console.print(f"Spearman vs {a.get('against_name', 'the ranking')}: rho {a['spearman']['rho']:.3f}, "
                      f"p {a['spearman']['p_value']:.3g}")
    console.print(f"ranking -> {res.ranking_file} (use with plan.name=elite plan.ranking_file=...); "
                  f"finished in {res.wall_s:.1f}s; MLflow parent run {res.parent_run_id}")


def render_hybrid_build(out, console) -> None:
    root, built = out
    for b in built:
        console.print(segment_table(b))
        console.print(counts_line(b), markup=False, highlight=False)
    console.print(f"wrote {len(built)} hybrid(s) under {root}; load with AutoModelForCausalLM.from_pretrained(folder) "
                  "after import raycpt", markup=False, highlight=False)


def render_hybrid_run(res, console) -> None:
    for r in res.builds:
        console.print(f"{r['name']}: trained layers {r['trainable_layers']}, final loss {r['final_loss']:.3f}, "
                      f"{r['counts']['trainable_layers']:,} of {r['counts']['total']:,} parameters trained, "
                      f"{r['wall_s']:.0f}s", markup=False, highlight=False)
    console.print(f"hybrid run finished in {res.wall_s:.0f}s; run folder {res.run_dir}; table {res.paths['table']}; "
                  f"profiles {res.paths['profiles']}; MLflow parent run {res.parent_run_id} (raycpt ui to browse)",
                  markup=False, highlight=False)


def render_trace(res, console) -> None:
    from rich.table import Table

    from raycpt.report.trace import S_INTERVAL_NOTE, SHORT_COLUMNS, fmt_cell

    table = Table(*(h for _, h in SHORT_COLUMNS), title=f"S(b) on {res.num_prompts} prompts, {res.num_layers} layers, "
                                                        f"top-k {res.top_k}")
    for row in res.split_table:
        cells = {**row, "S_ci": (row.get("S_lo"), row.get("S_hi"))}
        table.add_row(*(fmt_cell(k, cells[k]) for k, _ in SHORT_COLUMNS))
    console.print(table)
    console.print(S_INTERVAL_NOTE, style="dim")
    rec = res.recommended
    console.print(f"recommended split: r = {rec['ratio']:g} (train layers 0-{rec['split_layer'] - 1}, freeze "
                  f"{rec['split_layer']}-{res.num_layers - 1}), S(b) = {rec['S']:.3f}")
    if res.median:
        med = res.median["recommended"]
        console.print(f"(on per-layer medians instead of means: r = {med['ratio']:g}, S(b) = {med['S']:.3f})")
    if res.answer_hit_rate is not None:
        console.print(f"top-1 = expected answer's first token on {res.answer_hit_rate:.1%} of prompts")
    if res.seam_note:
        console.print(f"note: {res.seam_note}", **PLAIN)
    console.print(f"trace finished in {res.wall_s:.1f}s; run folder {res.run_dir}; MLflow run {res.run_id}")


def render_plan(out, console) -> None:
    from rich.table import Table

    title, tab = out
    table = Table("part", "trains", "lr scale", "params", title=title)
    for r in tab["rows"]:
        mark = "[green]train[/green]" if r["trainable"] else "[dim]frozen[/dim]"
        note = " (tied to embed)" if r["tied"] else ""
        if r["trainable"] and r.get("trainable_params", r["params"]) != r["params"]:  # LoRA: adapters train
            note += f" ({r['trainable_params']:,} adapter parameters train)"
        table.add_row(r["part"], mark, "" if r["lr_scale"] is None else f"x{r['lr_scale']:g}", f"{r['params']:,}{note}")
    console.print(table)
    console.print(f"layer map (layer 0 first, T = trains): {tab['layer_map']}", **PLAIN)
    share = tab["trainable"] / max(1, tab["total"])
    console.print(f"trainable {tab['trainable']:,} / frozen {tab['frozen']:,} of {tab['total']:,} parameters "
                  f"({100 * share:.1f}% train)", **PLAIN)
    for n in tab["notes"]:
        console.print(f"note: {n}", **PLAIN)


def render_train(res, console) -> None:
    first = f"{res.losses[0]:.4f}" if res.losses else "n/a"
    last = f"{res.losses[-1]:.4f}" if res.losses else "n/a"
    resumed = f" (resumed at step {res.resumed_from_step})" if res.resumed_from_step else ""
    if res.reused:
        console.print("run already finished: nothing re-run; its saved result follows", markup=False)
    console.print(f"plan {res.plan['name']}: {res.trainable_params:,} trainable / {res.frozen_params:,} frozen "
                  f"parameters; {len(res.steps)} steps{resumed}; loss {first} -> {last}; "
                  f"{res.tokens_per_s:,.0f} tokens/s (median); wall {res.wall_s:.1f}s", **PLAIN)
    console.print(f"final model {res.final_model_dir}; run folder {res.run_dir}; MLflow run {res.mlflow_run_id}",
                  **PLAIN)


def render_models(models, console) -> None:
    from rich.table import Table

    table = Table("source", "model_type", "layers", "params", "folder", "state")
    for m in models:
        table.add_row(m["source"], str(m.get("model_type")), str(m.get("num_layers")), f"{m.get('num_params', 0):,}",
                      m["path"], m.get("state", ""))
    console.print(table)


def render_stores(out, console) -> None:
    from raycpt.data.store import builds_logged

    root, stores = out
    if not stores:
        console.print(f"no packed stores under {root} (raycpt data prepare [CONFIG] packs one)", markup=False)
        return
    for st, state in stores:
        m = st.manifest
        if state.startswith("store damaged"):  # its manifest's numbers are not to be shown as a store's
            console.print(f"{st.key}  {st.path}: {state}", **PLAIN)
            continue
        console.print(f"{st.key}  {', '.join(m['sources'])}  seq_len={m['seq_len']} text_field={m['text_field']} "
                      f"max_documents={m['max_documents']}: {st.describe()}; {st.disk_bytes() / 1e6:,.1f} MB on disk "
                      f"({m['bytes_per_token']} bytes/token); packed {len(builds_logged(root, st.key))} time(s); "
                      f"{state}", **PLAIN)


def render_text(text: str, console) -> None:
    """Plain stdout (``config show``: rich would wrap long values and break the YAML)."""
    sys.stdout.write(text)


def render_line(text: str, console) -> None:
    console.print(text, **PLAIN)


def render_nothing(_result, console) -> None:
    """For jobs that print their own one line (``data prepare``)."""



def render_select(res, console) -> None:
    from rich.table import Table

    table = Table("layer", "score", "top-k", title=f"{res.method} scores, {res.num_layers} layers")
    for i, v in enumerate(res.scores):
        table.add_row(str(i), "-" if not math.isfinite(float(v)) else f"{v:.4g}", "*" if i in res.top_k else "")
    console.print(table)
    console.print(f"scores: {res.note}", **PLAIN)
    console.print(f"top-{res.k} by {res.method}: {res.top_k}", **PLAIN)
    console.print(f"ranking {res.paths['ranking']} (train it: plan.name=elite plan.k={res.k} "
                  f"plan.ranking_file={res.paths['ranking']}); plot {res.paths['plot']}; select took "
                  f"{res.wall_s:.1f}s; MLflow run {res.run_id}", **PLAIN)
