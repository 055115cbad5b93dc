"""Run by test_ray_real: a two-node Ray cluster on this machine (ray.cluster_utils: two raylets,
2 declared GPUs each), joined by its address; one 4-GPU trial spread over both nodes. Prints
one JSON line: the nodes of the trial's bundles, what each node's process saw, the outcome."""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

from ray.cluster_utils import Cluster

from dse.runners.ray_runner import RayOptions, RayRunner
from tests.runners.conftest import make_launch, seen


def main() -> None:
    import ray

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "num_gpus": 2})
    cluster.add_node(num_cpus=2, num_gpus=2)
    cluster.wait_for_nodes()
    try:
        r = RayRunner(
            RayOptions(address=cluster.address), device="cuda", world_size=4, gpus_per_node=2
        )
        with tempfile.TemporaryDirectory() as d:
            la = make_launch(Path(d), 1, 3.0, world_size=4, device="cuda")
            r.submit(la)
            pg = r._trials[1].pg
            ray.get(pg.ready(), timeout=120)
            nodes = ray.util.placement_group_table(pg)["bundles_to_node_id"]
            done = []
            deadline = time.monotonic() + 120
            while not done and time.monotonic() < deadline:
                done = r.poll()
                time.sleep(0.2)
            print(json.dumps({
                "capacity": r.capacity,
                "bundle_nodes": list(nodes.values()),
                "seen": seen(la),
                "ok": bool(done) and done[0].outcome.ok,
                "reason": done[0].outcome.reason if done else "did not finish",
                "placement": done[0].placement if done else None,
            }))  # fmt: skip
    finally:
        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    sys.exit(main())
