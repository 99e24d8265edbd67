"""Ray's own ``ray`` command line (``ray start ...``, ``ray stop ...``) with one change: a loopback
``--node-ip-address`` / ``--address`` stays loopback.

``ray start --node-ip-address=127.0.0.1`` alone turns 127.0.0.1 into this machine's outward address
(``ray._private.services.resolve_ip_for_localhost``), so the GCS, the raylet and the Ray client server
listen on every interface. Ray's single-machine switch (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``) keeps
loopback but refuses to start a second node. So: the switch is set in the environment of every node (the
agents, the job supervisor and the workers then connect to 127.0.0.1), and in this process only the
address is kept as given and a second node allowed. Every process of a node (GCS, raylet, object manager,
agents, workers) then binds 127.0.0.1, and several nodes join one head on one machine
(tests/integration/local_cluster.py checks the sockets).

Run as ``python ray_start_loopback.py start --head ...``: the arguments are ``ray``'s."""

from __future__ import annotations

import sys

import ray._private.ray_constants as ray_constants
import ray._private.services as services
from ray._common.network_utils import is_localhost

_resolve = services.resolve_ip_for_localhost


def _keep_loopback(host: str) -> str:
    return host if host and is_localhost(host) else _resolve(host)


services.resolve_ip_for_localhost = _keep_loopback
# RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 in the environment makes every Ray process of the node resolve a loopback
# address to loopback when it connects (an agent that turned 127.0.0.1 into the outward address would wait for a
# GCS that does not listen there); here, in `ray start` only, multi-node stays allowed so that workers can join
ray_constants.ENABLE_RAY_CLUSTER = True

if __name__ == "__main__":
    from ray.scripts.scripts import main

    sys.argv[0] = "ray"
    main()
