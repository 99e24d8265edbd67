"""The sweep's summary: what a sweep's trials mean, and every view of it.

* model and statistics: :mod:`~raycpt.report.sweep.outcomes` (the trials' files read back),
  :mod:`~raycpt.report.sweep.cells` (each row's cells: value, Δ, interval, p), :mod:`~raycpt.report.sweep.base`
  (gain and forgetting against the base row), :mod:`~raycpt.report.sweep.domain`, :mod:`~raycpt.report.sweep.seeds`
  (run noise: seeds or a floor), :mod:`~raycpt.report.sweep.verdict` (marks after multiplicity control: the family of
  comparisons from the tables) and :mod:`~raycpt.report.sweep.family` (its statistics: Holm graph, BH, best, legend);
* :mod:`~raycpt.report.sweep.summary` - the one entry: ``build_summary`` (its JSON form) / ``summarise`` (typed) /
  ``write_summary``;
* :mod:`~raycpt.report.sweep.model` - the summary typed: ``Cell``, ``Row``, ``Summary`` (round-trip summary.json);
* :mod:`~raycpt.report.sweep.views` - terminal, rich, Markdown and plots, all reading the typed summary; a task's
  table columns declared once in :mod:`~raycpt.report.sweep.views.columns`.
"""
