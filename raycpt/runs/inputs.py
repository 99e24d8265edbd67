"""What a command's run read and what it made, as MLflow shows them (issue 48): its dataset inputs (the run's Datasets
column: the training corpus's packed store, the held-out, validation and general slices, each benchmark that ran) and
a LoggedModel linked to a model folder outside MLflow (the Models tab; registrable, nothing copied).

Two record kinds of a run folder's ``records.jsonl`` (:mod:`raycpt.runs.records`), built here as JSON
(:func:`dataset_record`, :func:`model_record`) and projected into MLflow here (:func:`project_dataset`,
:func:`project_model`), live and by ``raycpt runs sync``: the same code, and neither sends what the run already has."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
from typing import Optional

DIGEST_CHARS = 16
"""Hex digits of a digest as MLflow stores it (its dataset digest column holds 36 characters)."""
CONTEXT_TAG = "mlflow.data.context"
"""The input tag MLflow's UI shows as a dataset's context (training, validation, evaluation)."""
CONTEXTS = ("training", "validation", "evaluation")
LOCATION_TAG = "raycpt.model.location"
"""A linked model's tag: the folder its weights are in (outside MLflow)."""
MODEL_TYPE = "raycpt-row"
"""The ``model_type`` of the models raycpt links (a sweep's or a decision's row), to search them by."""


def short_digest(data: bytes) -> str:
    """The first :data:`DIGEST_CHARS` hex digits of the sha256 of ``data``."""
    return hashlib.sha256(data).hexdigest()[:DIGEST_CHARS]


def dataset_record(name: str, digest: str, source: str, context: str, profile: Optional[dict] = None) -> dict:
    """A ``dataset`` record: one dataset input of the run (``source``: a local path; ``profile``: its numbers, e.g.
    rows and tokens)."""
    if context not in CONTEXTS:
        raise ValueError(f"dataset context {context!r}: one of {', '.join(CONTEXTS)}")
    return {"dataset": {"name": name, "digest": str(digest)[:DIGEST_CHARS], "source": str(source),
                        "context": context, "profile": dict(profile or {})}}


def model_record(name: str, location: str, params: dict, metrics: dict, tags: Optional[dict] = None,
                 dataset: Optional[tuple] = None) -> dict:
    """A ``model`` record: a LoggedModel of the run whose weights stay in ``location`` (a folder); ``metrics`` are
    logged on the run and the model (with ``dataset`` ``(name, digest)``, linked to that dataset input)."""
    return {"model": {"name": name, "location": str(location),
                      "params": {k: str(v)[:500] for k, v in params.items() if v is not None},
                      "metrics": {k: float(v) for k, v in metrics.items() if v is not None},
                      "tags": {k: str(v) for k, v in (tags or {}).items()},
                      "dataset": list(dataset) if dataset else None}}


def input_key(name: str, digest: str, context: Optional[str]) -> tuple:
    return name, digest, context


def run_inputs(client, run_id: str) -> set:
    """The dataset inputs a run has, as :func:`input_key` triples."""
    out = set()
    for di in client.get_run(run_id).inputs.dataset_inputs or []:
        ctx = next((t.value for t in di.tags if t.key == CONTEXT_TAG), None)
        out.add(input_key(di.dataset.name, di.dataset.digest, ctx))
    return out


def run_models(client, run_id: str) -> set:
    """The names of the models a run made (its outputs)."""
    outputs = client.get_run(run_id).outputs
    return {client.get_logged_model(m.model_id).name for m in (outputs.model_outputs if outputs else []) or []}


def dataset_entity(d: dict):
    """The :class:`mlflow.entities.DatasetInput` of a ``dataset`` record's body: a
    :class:`mlflow.data.meta_dataset.MetaDataset` (metadata only: the data stays where ``source`` says) with the
    record's digest, its profile, and the context tag."""
    from mlflow.data.meta_dataset import MetaDataset
    from mlflow.data.sources import LocalArtifactDatasetSource
    from mlflow.entities import Dataset, DatasetInput, InputTag

    meta = MetaDataset(LocalArtifactDatasetSource(d["source"]), name=d["name"], digest=d["digest"]).to_dict()
    ds = Dataset(name=meta["name"], digest=meta["digest"], source_type=meta["source_type"], source=meta["source"],
                 schema=meta.get("schema"), profile=json.dumps(d.get("profile") or {}, sort_keys=True))
    return DatasetInput(ds, tags=[InputTag(CONTEXT_TAG, d["context"])])


def project_dataset(client, run_id: str, d: dict, have: set) -> int:
    """One dataset input onto ``run_id`` unless ``have`` (:func:`run_inputs`) holds it; returns how many were sent."""
    key = input_key(d["name"], d["digest"], d["context"])
    if key in have:
        return 0
    client.log_inputs(run_id, datasets=[dataset_entity(d)])
    have.add(key)
    return 1


def project_model(client, run_id: str, m: dict, have: set) -> int:
    """One linked LoggedModel made by ``run_id`` unless ``have`` (:func:`run_models`) names it: created READY with the
    record's params and tags (:data:`LOCATION_TAG`: its folder; ``mlflow.model.isExternal``), an MLmodel that says
    its artifacts are external (so the registry takes it: ``mlflow.register_model("models:/<id>", NAME)``), its
    metrics on the run and the model, and the run's output. Returns how many models were made."""
    from mlflow.entities import LoggedModelOutput, LoggedModelStatus, Metric
    from mlflow.models.utils import get_external_mlflow_model_spec
    from mlflow.utils.mlflow_tags import MLFLOW_MODEL_IS_EXTERNAL

    if m["name"] in have:
        return 0
    exp = client.get_run(run_id).info.experiment_id
    tags = {**m.get("tags", {}), LOCATION_TAG: m["location"], MLFLOW_MODEL_IS_EXTERNAL: "true"}
    model = client.create_logged_model(exp, name=m["name"], source_run_id=run_id, tags=tags,
                                       params=m.get("params") or None, model_type=MODEL_TYPE)
    with tempfile.TemporaryDirectory() as tmp:
        get_external_mlflow_model_spec(model).save(os.path.join(tmp, "MLmodel"))
        client.log_model_artifacts(model.model_id, tmp)
    client.finalize_logged_model(model.model_id, LoggedModelStatus.READY)
    ds = m.get("dataset") or (None, None)
    ts = int(time.time() * 1000)
    metrics = [Metric(k, v, ts, 0, model_id=model.model_id, dataset_name=ds[0], dataset_digest=ds[1])
               for k, v in (m.get("metrics") or {}).items()]
    if metrics:
        client.log_batch(run_id, metrics=metrics)
    client.log_outputs(run_id, [LoggedModelOutput(model.model_id, 0)])
    have.add(m["name"])
    return 1


def dataset_shape_ok(v) -> bool:
    return isinstance(v, dict) and all(isinstance(v.get(k), str) for k in ("name", "digest", "source", "context")) \
        and isinstance(v.get("profile", {}), dict)


def model_shape_ok(v) -> bool:
    return isinstance(v, dict) and isinstance(v.get("name"), str) and isinstance(v.get("location"), str) and all(
        isinstance(v.get(k, {}), dict) for k in ("params", "metrics", "tags"))


def blocks_profile(data: bytes) -> Optional[dict]:
    """``{"rows", "tokens"}`` of a blocks file's bytes (a JSON list of token lists: the held-out, validation, general
    slice); None when it holds no blocks (``null``, an empty list)."""
    blocks = json.loads(data.decode("utf-8"))
    if not isinstance(blocks, list) or not blocks:
        return None
    return {"rows": len(blocks), "tokens": sum(len(b) for b in blocks)}
