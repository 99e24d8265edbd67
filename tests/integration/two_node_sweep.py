"""Run by test_two_node.py in its own process: a two-node Ray cluster on this machine
(``ray.cluster_utils.Cluster``: a head and a second node carrying the custom resource ``trial_node``),
the shared-storage check, and a tiny sweep whose trials ask for ``trial_node``. Prints one JSON line;
both nodes are always stopped (``Cluster.shutdown`` ends only the processes it started)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


def main(cfg_path: str) -> None:
    import ray
    from ray.cluster_utils import Cluster

    from raycpt.cluster import check_shared_storage
    from raycpt.config import load_config
    from raycpt.jobs.sweep import run_sweep

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "object_store_memory": 400_000_000})
    try:
        second = cluster.add_node(num_cpus=3, resources={"trial_node": 2}, object_store_memory=400_000_000)
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, log_to_driver=False)
        cfg = load_config(cfg_path, [])
        checked = check_shared_storage(Path(cfg.tracking.run_root))
        res = run_sweep(cfg, splits=[0.5], strategies=["train_shallow"])
        print("RESULT-JSON " + json.dumps({
            "alive": sorted(n["NodeID"] for n in ray.nodes() if n["Alive"]), "checked": sorted(checked),
            "second": second.node_id, "head": cluster.head_node.node_id, "parent_run_id": res.parent_run_id,
            "trials": [t["name"] for t in res.trials], "uri": cfg.tracking.uri}), flush=True)
    finally:
        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    main(sys.argv[1])
