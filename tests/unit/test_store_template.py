"""Issue 28: a new run root's SQLite MLflow store is a copy of an empty store of this MLflow's schema kept in the
user's cache. The copy must be what MLflow itself would have made: the same tables and indexes (read from
``sqlite_master`` of a store MLflow created on its own), the newest schema revision, and MLflow opens it, adds its
Default experiment, and logs to it."""

import sqlite3

import mlflow
import pytest
from mlflow.store.db.utils import _get_latest_schema_revision
from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

from raycpt.config import load_config
from raycpt.runs.location import locate
from raycpt.runs.store import STORE_TEMPLATES, ensure_store, new_sqlite_store


def _schema(db) -> dict:
    """Every table's columns (name, type, not null, primary key) and every index's name and table (the SQL text
    itself differs with the path a migration took: ``ALTER TABLE`` or a table rebuilt)."""
    with sqlite3.connect(db) as c:
        tables = [r[0] for r in c.execute("SELECT name FROM sqlite_master WHERE type='table' AND name NOT LIKE 'sqlite_%'")]
        out = {t: sorted((r[1], r[2].upper(), r[3], r[5]) for r in c.execute(f"PRAGMA table_info('{t}')"))
               for t in tables}
        out["indexes"] = sorted(c.execute("SELECT name, tbl_name FROM sqlite_master WHERE type='index' "
                                          "AND name NOT LIKE 'sqlite_%'"))
        return out


def _rows(db, sql) -> list:
    with sqlite3.connect(db) as c:
        return list(c.execute(sql))


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("RAYCPT_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_a_new_store_is_a_copy_of_what_mlflow_makes(cache, tmp_path):
    SqlAlchemyStore(f"sqlite:///{tmp_path / 'own.db'}", str(tmp_path / "art"))  # MLflow alone, no raycpt
    (tmp_path / "a").mkdir()
    assert new_sqlite_store(tmp_path / "a" / "mlflow.db")
    templates = list((cache / STORE_TEMPLATES).glob("*.db"))
    assert len(templates) == 1 and mlflow.__version__ in templates[0].name
    assert _schema(templates[0]) == _schema(tmp_path / "own.db")
    assert _rows(templates[0], "SELECT version_num FROM alembic_version") == [(_get_latest_schema_revision(),)]
    assert _rows(templates[0], "SELECT COUNT(*) FROM experiments") == [(0,)]  # MLflow adds Default at first open
    assert _schema(tmp_path / "a" / "mlflow.db") == _schema(tmp_path / "own.db")
    assert not new_sqlite_store(tmp_path / "a" / "mlflow.db")  # an existing store is never replaced


def test_a_run_root_opened_from_the_template_takes_runs(cache, tmp_path):
    for name in ("one", "two"):  # the first makes the template, the second copies it
        cfg = load_config(None, [f"tracking.run_root={tmp_path / name}"])
        exp = ensure_store(locate(cfg.tracking))
        client = mlflow.tracking.MlflowClient(f"sqlite:///{tmp_path / name / 'mlflow.db'}")
        assert client.get_experiment(exp).artifact_location == (tmp_path / name / "mlartifacts").as_uri()
        run = client.create_run(exp)
        client.log_metric(run.info.run_id, "x", 1.5, step=3)
        client.set_terminated(run.info.run_id)
        assert [(m.value, m.step) for m in client.get_metric_history(run.info.run_id, "x")] == [(1.5, 3)]
        assert sorted(e.name for e in client.search_experiments()) == ["Default", "raycpt"]
    assert len(list((cache / STORE_TEMPLATES).glob("*.db"))) == 1


@pytest.mark.parametrize("damage", ["garbage", "cut short"])
def test_a_damaged_cached_template_is_made_again_not_blamed_on_the_run_root(cache, tmp_path, damage):
    """Issue 41: a corrupt template in the cache broke every new run root, and the line blamed
    ``<run_root>/mlflow.db`` ("Move it aside"), which moving aside did not cure. Now it is checked and made again."""
    first = load_config(None, [f"tracking.run_root={tmp_path / 'a'}"])
    ensure_store(locate(first.tracking))
    (template,) = (cache / STORE_TEMPLATES).glob("mlflow-*.db")
    if damage == "garbage":
        template.write_bytes(b"this is not a database" * 100)
    else:
        with open(template, "r+b") as f:
            f.truncate(template.stat().st_size // 3)
    cfg = load_config(None, [f"tracking.run_root={tmp_path / 'b'}"])
    exp = ensure_store(locate(cfg.tracking))  # a new run root: its store opens
    assert mlflow.tracking.MlflowClient(f"sqlite:///{tmp_path / 'b' / 'mlflow.db'}").get_experiment(exp).name
    assert _rows(template, "SELECT version_num FROM alembic_version") == \
        [(_get_latest_schema_revision(),)]  # the template is whole again
