"""Imported by every Python worker of the private local Ray before it accepts work (Ray's
``preload_python_modules``, set by :func:`raycpt.runtime.init_ray`): torch.distributed's rendezvous store binds
to loopback there (:func:`raycpt.runtime.private_worker_setup`).

A preloaded module needs no job runtime env, as Ray's ``worker_process_setup_hook`` did: a worker then starts as
itself, without the runtime env agent's wrapper process (``setup_worker.py``, 0.4 s per worker start, measured),
and the job's Tune trial actor is up that much sooner."""

from raycpt.runtime import private_worker_setup

private_worker_setup()
