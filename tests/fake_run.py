"""A stand-in for :class:`raycpt.runs.run.Run` where a test needs only what the base row logs (metrics, params, tags)."""


class FakeRun:
    created, run_id, elapsed = True, "r" * 32, 1.5

    def __init__(self, location=None):
        self.metrics, self.params, self.location = {}, {}, location

    def log_metrics(self, m):
        self.metrics.update(m)

    def log_params(self, p):
        self.params.update(p)

    def set_tags(self, t):
        pass


def sqlite_parent(tmp_path, folder: str = "run"):
    """A real MLflow SQLite store under ``tmp_path/runs`` with one parent run, and a :class:`raycpt.runs.run.Run` on
    it in ``tmp_path/<folder>``: ``(cfg, client, exp, parent_id, run_at)`` where ``run_at(folder, run_id)`` makes
    another Run of that store (a trial's child run)."""
    from types import SimpleNamespace

    from mlflow.tracking import MlflowClient

    from raycpt.config import TrackingConfig
    from raycpt.runs.run import Run
    from raycpt.runs.location import locate
    from raycpt.runs.store import ensure_store

    (tmp_path / "runs").mkdir(exist_ok=True)
    cfg = TrackingConfig(run_root=str(tmp_path / "runs"), uri=f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}",
                         experiment="t")
    exp = ensure_store(locate(cfg))
    client = MlflowClient(cfg.uri)
    parent = client.create_run(exp, run_name="parent").info.run_id

    def run_at(where: str = folder, run_id: str = parent):
        return Run(SimpleNamespace(tracking=cfg), "sweep", tmp_path / where, run_id, client, False, exp)
    return cfg, client, exp, parent, run_at
