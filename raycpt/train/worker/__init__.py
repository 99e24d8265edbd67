"""The worker side of training: what runs inside a Ray Train worker (or a gloo process).

The entry point is :func:`raycpt.train.worker.loop.train_loop_per_worker`; it imports nothing from
:mod:`raycpt.train.driver`.
"""
