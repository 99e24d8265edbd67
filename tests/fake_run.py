"""A stand-in for :class:`raycpt.runs.run.Run` where a test needs only what the base row logs (metrics, params, tags)."""


class FakeRun:
    created, run_id, elapsed = True, "r" * 32, 1.5

    def __init__(self):
        self.metrics, self.params = {}, {}

    def log_metrics(self, m):
        self.metrics.update(m)

    def log_params(self, p):
        self.params.update(p)

    def set_tags(self, t):
        pass
