"""Training, split at the Ray boundary.

* :mod:`raycpt.train.driver` - runs in the command's process: checks before launch (``prepare``, ``preflight``, the
  memory estimate), the ``TorchTrainer`` (``launch.run_training``), resume checks, publishing the final model, the
  result files.
* :mod:`raycpt.train.worker` - runs inside Ray Train's worker (or gloo processes): the loop, its session, the step,
  data parallelism, the per-layer plan verification, in-worker evaluation and metrics.
* :mod:`raycpt.train.ckpt` - what both sides read and write: checkpoint folders, their manifests, RNG states.

The driver imports the worker and the checkpoint packages; the worker imports the checkpoint package; the
checkpoint package imports neither (tests/unit/test_import_graph.py holds it).
"""
