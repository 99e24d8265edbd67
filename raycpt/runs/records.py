"""A run's records: one JSON line each in its folder's ``records.jsonl`` (params, metrics, points, tags,
artifacts, tables, texts, dataset inputs, linked models, children), and their ONE projection into MLflow by run id
(:func:`project`), live and for ``raycpt runs sync``."""

from __future__ import annotations

import collections
import contextlib
import hashlib
import json
import math
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from raycpt.runs.inputs import (dataset_shape_ok, model_shape_ok, project_dataset, project_model, run_inputs,
                                 run_models)
from raycpt.runs.lost import unreachable


def flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def log_points(client, run_id: str, series) -> int:
    """``(key, step, value)`` points into a run, in batches of MLflow's 1000 per call (one call for a scan's 30
    layers instead of 30: 0.12 s -> 0.01 s per trial on SQLite, measured); only finite values, names as
    :func:`clean_metrics` makes them. Returns how many were logged."""
    from mlflow.entities import Metric

    ts = int(time.time() * 1000)
    points = [Metric(k, v, ts, int(step)) for key, step, value in series
              for k, v in clean_metrics({key: value}).items()]
    for i in range(0, len(points), 1000):
        client.log_batch(run_id, metrics=points[i:i + 1000])
    return len(points)


def clean_metrics(metrics: dict) -> dict[str, float]:
    """The finite numeric values of ``metrics`` as floats, names sanitised for MLflow (``/`` and ``.`` kept)."""
    clean = {}
    for k, v in metrics.items():
        try:
            f = float(v)
        except (TypeError, ValueError):
            continue
        if math.isfinite(f):
            clean[k.replace(" ", "_").replace("(", "").replace(")", "")] = f
    return clean


# ------------------------------------------------------------------------------------- the projection
RECORDS = "records.jsonl"
"""In a run folder: every record its MLflow run gets (params, metrics, tags, files, tables, texts, dataset inputs,
linked models, children), one JSON object a line, in order. The folder is the record; :func:`project` sends one record to MLflow, live as the job
writes it and again, the same code, for ``raycpt runs sync``."""


def record_kind(rec: dict) -> str:
    """The kind of a record: its one key among :data:`KINDS`."""
    for k in KINDS:
        if k in rec:
            return k
    raise ValueError(f"not a run record: {sorted(rec)}")


KINDS = ("params", "metrics", "points", "tags", "artifact", "table", "text", "dataset", "model", "children")


class Seen:
    """What a run in the store already has (params, metric points, artifact paths), read lazily: a record is
    projected only where the run lacks it, so a replay of a folder adds nothing twice. ``None`` in place of a
    :class:`Seen` (live logging) projects without looking."""

    def __init__(self, client, run_id: str):
        self.client, self.run_id = client, run_id
        self._params: Optional[dict] = None
        self._tags: Optional[dict] = None
        self._history: dict[str, collections.Counter] = {}
        self._artifacts: dict[str, set] = {}
        self._inputs: Optional[set] = None
        self._models: Optional[set] = None

    def inputs(self) -> set:
        """The run's dataset inputs (:func:`raycpt.runs.inputs.run_inputs`)."""
        if self._inputs is None:
            self._inputs = run_inputs(self.client, self.run_id)
        return self._inputs

    def models(self) -> set:
        """The names of the models the run made (:func:`raycpt.runs.inputs.run_models`)."""
        if self._models is None:
            self._models = run_models(self.client, self.run_id)
        return self._models

    def params(self) -> dict:
        if self._params is None:
            data = self.client.get_run(self.run_id).data
            self._params, self._tags = dict(data.params), dict(data.tags)
        return self._params

    def tags(self) -> dict:
        self.params()
        return self._tags

    def points(self, key: str) -> "collections.Counter":
        """The run's ``(step, value)`` points of ``key``, counted: a point the folder holds twice (logged twice live)
        is in the store twice, so a replay matches the store point for point."""
        if key not in self._history:
            self._history[key] = collections.Counter((m.step, m.value)
                                                     for m in self.client.get_metric_history(self.run_id, key))
        return self._history[key]

    def artifacts(self, folder: Optional[str]) -> set:
        key = folder or ""
        if key not in self._artifacts:
            self._artifacts[key] = {a.path for a in self.client.list_artifacts(self.run_id, folder or None)}
        return self._artifacts[key]


RUN_ID_MARK = "{{run_id}}"
"""Stands for the MLflow run id in a tag's value; :func:`project` puts the id in (live, or the id ``raycpt runs sync``
made when the server was gone while the job ran): e.g. the sweep description's trade-off picture, an image whose
URL names the run (:func:`raycpt.report.sweep.views.advice.artifact_image`)."""


def record_path(base: Path, path: str) -> Path:
    """A record's file: relative to its run folder (``base``), or absolute."""
    p = Path(path)
    return p if p.is_absolute() else Path(base) / p


def project(client, run_id: str, rec: dict, base: Path, seen: Optional[Seen] = None) -> int:
    """THE translation of one run record into MLflow calls on ``run_id`` (the projection): live with
    ``seen`` None, in a replay with the run's :class:`Seen` (then only what the run lacks). ``base`` is the folder
    the record's files are relative to. Returns how many items were sent. A ``children`` record is the sync's
    (:func:`raycpt.runs.sync_tree`): nothing to send."""
    kind = record_kind(rec)
    if kind == "params":
        return _project_params(client, run_id, rec["params"], seen)
    if kind in ("metrics", "points"):
        pts = ([(k, int(rec.get("step") or 0), v) for k, v in rec["metrics"].items()] if kind == "metrics"
               else [tuple(p) for p in rec["points"]])
        if seen is not None:  # each point the store has already stands for one of the folder's
            pts = [(k, s, v) for k, s, v in pts if not _consume(seen.points(k), (s, float(v)))]
        return log_points(client, run_id, pts)
    if kind == "tags":
        from mlflow.entities import RunTag

        tags = {k: str(v).replace(RUN_ID_MARK, run_id)[:5000] for k, v in rec["tags"].items()}
        if seen is not None:
            tags = {k: v for k, v in tags.items() if seen.tags().get(k) != v}
            seen.tags().update(tags)
        if tags:
            client.log_batch(run_id, tags=[RunTag(k, v) for k, v in tags.items()])
        return len(tags)
    if kind == "artifact":
        f, folder = record_path(base, rec["artifact"]), rec.get("dir")
        if not f.exists() or (seen is not None and (f"{folder}/{f.name}" if folder else f.name)
                              in seen.artifacts(folder)):
            return 0
        (client.log_artifacts if f.is_dir() else client.log_artifact)(run_id, str(f), folder)
        return 1
    if kind == "table":  # log_table appends to a table that exists: a resumed job's second summary is left out
        folder = str(Path(rec["file"]).parent) if "/" in rec["file"] else None
        if rec["file"] in (seen or Seen(client, run_id)).artifacts(folder):
            return 0
        client.log_table(run_id, data=rec["table"], artifact_file=rec["file"])
        return 1
    if kind == "dataset":  # never twice, live (a resumed job) or replayed: the run's inputs are read first
        return project_dataset(client, run_id, rec["dataset"], (seen or Seen(client, run_id)).inputs())
    if kind == "model":
        return project_model(client, run_id, rec["model"], (seen or Seen(client, run_id)).models())
    if kind == "text":
        folder = str(Path(rec["file"]).parent) if "/" in rec["file"] else None
        if seen is not None and rec["file"] in seen.artifacts(folder):
            return 0
        client.log_text(run_id, rec["text"], rec["file"])
        return 1
    return 0


def _consume(counts: "collections.Counter", point) -> bool:
    """Whether ``point`` is among ``counts`` (then one of it is used up)."""
    if counts[point] > 0:
        counts[point] -= 1
        return True
    return False


def _project_params(client, run_id: str, params: dict, seen: Optional[Seen]) -> int:
    """Params the run lacks; a value it has is never changed (MLflow refuses that: a resumed run re-logs its
    params, and a changed one keeps the value it was made with)."""
    from mlflow.entities import Param
    from mlflow.exceptions import MlflowException

    have = seen.params() if seen is not None else {}
    new = [Param(k, str(v)[:500]) for k, v in params.items() if v is not None and k not in have]
    sent = 0
    for i in range(0, len(new), 100):
        try:
            client.log_batch(run_id, params=new[i:i + 100])
            sent += len(new[i:i + 100])
        except MlflowException as e:
            if unreachable(e):
                raise
            for p in new[i:i + 100]:  # one param that may not change must not lose the others
                with contextlib.suppress(MlflowException):
                    client.log_param(run_id, p.key, p.value)
                    sent += 1
    if seen is not None:
        have.update({p.key: p.value for p in new})
    return sent


SUM = "sum"
"""The key each line of :data:`RECORDS` ends with: the first 16 hex digits of the sha256 of the line's JSON without it
(:func:`seal_line`), so a line changed after it was written is found (:func:`check_line`). A line without it is a
legacy record (written before the check existed) and is read as it is."""
_SUM_TAIL = re.compile(r', "sum": "([0-9a-f]{16})"\}$')


def _digest(body: str) -> str:
    return hashlib.sha256(body.encode("utf-8")).hexdigest()[:16]


def seal_line(rec: dict) -> str:
    """One record as its line of :data:`RECORDS`: its JSON with :data:`SUM` appended (newline included)."""
    body = json.dumps(rec, allow_nan=False, default=str)
    return f'{body[:-1]}, "{SUM}": "{_digest(body)}"}}\n'


def shape_problem(rec) -> Optional[str]:
    """None when ``rec`` has the shape of a run record (:data:`KINDS`: what :func:`project` reads of it); else what is
    wrong, in a few words."""
    if not isinstance(rec, dict):
        return f"a JSON {type(rec).__name__}, not a record"
    kind = next((k for k in KINDS if k in rec), None)
    if kind is None:
        return f"no record kind among its keys {sorted(rec)[:4]}"
    v = rec[kind]

    def number(x):
        return isinstance(x, (int, float)) and not isinstance(x, bool)

    ok = {"params": lambda: isinstance(v, dict), "tags": lambda: isinstance(v, dict),
          "metrics": lambda: isinstance(v, dict) and (rec.get("step") is None or number(rec["step"])),
          "points": lambda: isinstance(v, list) and all(
              isinstance(p, list) and len(p) == 3 and isinstance(p[0], str) and number(p[1]) and number(p[2])
              for p in v),
          "artifact": lambda: isinstance(v, str) and isinstance(rec.get("dir"), (str, type(None))),
          "table": lambda: isinstance(v, dict) and isinstance(rec.get("file"), str),
          "text": lambda: isinstance(v, str) and isinstance(rec.get("file"), str),
          "dataset": lambda: dataset_shape_ok(v), "model": lambda: model_shape_ok(v),
          "children": lambda: isinstance(v, list) and all(
              isinstance(c, list) and len(c) == 2 and all(isinstance(x, str) for x in c) for c in v)}[kind]
    return None if ok() else f"a {kind} record of the wrong shape"


def check_line(raw: bytes) -> tuple[Optional[dict], Optional[str]]:
    """``(record, None)`` for a line of :data:`RECORDS` that reads and verifies (its :data:`SUM`, when it has one,
    matches; its shape is a record's), else ``(None, why)``."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        return None, f"not UTF-8 (byte 0x{raw[e.start]:02x} at offset {e.start})"
    try:
        rec = json.loads(text)
    except ValueError as e:
        return None, f"not JSON ({str(e).split(':')[0]})"
    if isinstance(rec, dict) and SUM in rec:
        tail = _SUM_TAIL.search(text.rstrip("\r"))
        if tail is None or _digest(text.rstrip("\r")[:tail.start()] + "}") != tail.group(1):
            return None, "its checksum does not match (changed after it was written)"
        rec.pop(SUM)
    why = shape_problem(rec)
    return (None, why) if why else (rec, None)


@dataclass
class RecordFile:
    """What :func:`check_records` found in one run folder's :data:`RECORDS`: the records kept (in order), the damaged
    lines (``(line number, why)``), whether the file is missing and whether its last line was cut short by a kill (a
    write that never finished: not damage)."""

    path: Path
    kept: list = field(default_factory=list)
    damaged: list = field(default_factory=list)
    missing: bool = False
    torn: bool = False

    @property
    def lines(self) -> int:
        return len(self.kept) + len(self.damaged)


def check_records(folder: Path) -> RecordFile:
    """THE reader of a run folder's :data:`RECORDS`: every line checked (:func:`check_line`), nothing trusted unchecked.
    A last line without its newline is a write a kill cut short (left out, ``torn``); any other line that does not
    read or verify is damage, reported with its number; a file that cannot be read at all is ``missing``."""
    path = Path(folder) / RECORDS
    out = RecordFile(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        out.missing = True
        return out
    except OSError as e:  # a folder in its place, no permission: nothing of it can be trusted
        out.damaged.append((0, f"cannot be read ({type(e).__name__})"))
        return out
    lines = data.split(b"\n")
    tail = lines.pop()  # b"" when the file ends with its newline
    for n, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        rec, why = check_line(raw)
        if why:
            out.damaged.append((n, why))
        else:
            out.kept.append(rec)
    if tail.strip():
        rec, why = check_line(tail)
        if why:
            out.torn = True
        else:
            out.kept.append(rec)
    return out


def read_records(folder: Path) -> list[dict]:
    """The records of a run folder that read and verify, in order (:func:`check_records`; a caller that must not go on
    past damage checks the folder first: :func:`raycpt.runs.trust.trusted_records`)."""
    return check_records(folder).kept


def append_record(folder: Path, rec: dict) -> None:
    """One record appended to ``folder``'s :data:`RECORDS`, sealed (:func:`seal_line`), in one write of one line: a kill
    leaves at most that line cut short, which the next append ends with a newline first (so it stays one torn line,
    never joined to the next record)."""
    Path(folder).mkdir(parents=True, exist_ok=True)
    line = seal_line(rec).encode("utf-8")
    path = Path(folder) / RECORDS
    with open(path, "ab") as f:
        if f.tell() > 0:
            with open(path, "rb") as r:
                r.seek(-1, 2)
                if r.read(1) != b"\n":
                    line = b"\n" + line
        f.write(line)
