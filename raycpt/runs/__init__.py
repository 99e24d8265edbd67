"""Where a command's work is recorded, one idea per module:

* :mod:`~raycpt.runs.location` - where a command's runs live (run root, tracking URI, store checked), resolved once
  where the command starts and carried;
* :mod:`~raycpt.runs.run` - THE run: :func:`~raycpt.runs.run.command_run` (the lifecycle under every command) and
  :class:`~raycpt.runs.run.Run` (the only holder of an MLflow run id and its folder; children via ``run.child``);
* :mod:`~raycpt.runs.folder` - the run folder and its ``state.json``: opened, resumed, ended on every exit path;
* :mod:`~raycpt.runs.records` - ``records.jsonl`` and its one projection into MLflow (live and ``raycpt runs sync``);
* :mod:`~raycpt.runs.store` - the MLflow store a run root records into (made once, checked writable);
* :mod:`~raycpt.runs.lost` - a tracking server that stopped answering: recorded once, the run goes on locally.

This file imports nothing: import the module that holds the idea.
"""
