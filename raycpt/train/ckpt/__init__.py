"""Checkpoints, shared by the driver and the worker: the folder layout and its loading
(:mod:`~raycpt.train.ckpt.checkpoint`), the manifest that proves a folder whole (:mod:`~raycpt.train.ckpt.manifest`),
every rank's RNG states (:mod:`~raycpt.train.ckpt.rng`)."""
