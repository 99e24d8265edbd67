"""Fault injection for tests that drive the console script from outside: with ``RAYCPT_TEST_ENOSPC=DIR`` set, an
``os.replace`` (the last step of every atomic write) into DIR fails as a full disk does (ENOSPC). Put this
folder first on PYTHONPATH of the child process only."""

import errno
import os

_full = os.environ.get("RAYCPT_TEST_ENOSPC")
if _full:
    _replace = os.replace

    def _replace_on_a_full_disk(src, dst, *a, **k):
        if os.path.abspath(os.fspath(dst)).startswith(os.path.abspath(_full)):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), os.fspath(dst))
        return _replace(src, dst, *a, **k)

    os.replace = _replace_on_a_full_disk

# With ``RAYCPT_TEST_COUNT_RUNS=FILE`` set, every MLflow client call that starts or ends a run (``create_run``,
# ``set_terminated``, and ``update_run`` with a status) appends one line ``<call> <run id> <status>`` to FILE, from
# whichever process makes it (the driver, a Tune trial, a training worker): how many owners a run has.
_count = os.environ.get("RAYCPT_TEST_COUNT_RUNS")
if _count:
    import importlib.abc
    import sys

    def _note(*words):
        with open(_count, "a", encoding="utf-8") as f:
            f.write(" ".join(str(w) for w in words) + "\n")

    def _patch(client_cls):
        create, terminate, update = client_cls.create_run, client_cls.set_terminated, client_cls.update_run

        def create_run(self, *a, **k):
            run = create(self, *a, **k)
            _note("create", run.info.run_id, "RUNNING")
            return run

        def set_terminated(self, run_id, status=None, *a, **k):
            _note("end", run_id, status or "FINISHED")
            return terminate(self, run_id, status, *a, **k)

        def update_run(self, run_id, status=None, *a, **k):
            if status is not None:
                _note("update", run_id, status)
            return update(self, run_id, status, *a, **k)

        client_cls.create_run, client_cls.set_terminated, client_cls.update_run = create_run, set_terminated, update_run

    class _PatchOnImport(importlib.abc.MetaPathFinder):
        """Patch ``mlflow.tracking.client.MlflowClient`` once that module is imported (mlflow is heavy: no import
        here before the program asks for it)."""

        def find_spec(self, name, path=None, target=None):
            if name != "mlflow.tracking.client":
                return None
            sys.meta_path.remove(self)
            import importlib.util

            spec = importlib.util.find_spec(name)
            loader = spec.loader
            run_module = loader.exec_module

            def exec_module(module):
                run_module(module)
                _patch(module.MlflowClient)

            loader.exec_module = exec_module
            return spec

    sys.meta_path.insert(0, _PatchOnImport())
