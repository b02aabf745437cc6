"""The node-pool listing with and without the operator's response field mask.

    python -m benchmarks.gke_listing [--pools 256]

One listing of N TPU pools as GKE answers it (the pool the operator sends, `build_node_pool`,
plus the fields GKE adds: selfLink, version, instance groups, management, upgrade and network
settings), whole (the baseline) and through `LISTED_POOL_FIELDS` as the simulator applies it:
bytes on the wire and the client's `json_format.Parse` CPU (best of 3 rounds of 5).
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from google.cloud.container_v1.types import cluster_service as cs
from google.protobuf import json_format

from benchmarks.common import job_body
from multislice_local import fieldmask
from multislice_operator.planning.plan import load_job, plan_job
from multislice_operator.provisioning.gke import LISTED_POOL_FIELDS
from multislice_operator.provisioning.gke_requests import build_node_pool

GKE_ADDS = {
    "status": "RUNNING",
    "selfLink": "https://container.googleapis.com/v1/projects/p/zones/z/clusters/c/nodePools/x",
    "version": "1.36.3-gke.1000000",
    "instanceGroupUrls": [
        "https://www.googleapis.com/compute/v1/projects/p/zones/z/instanceGroupManagers/gke-c-x"
    ],
    "podIpv4CidrSize": 24,
    "etag": "4c2c5a0e",
    "management": {"autoUpgrade": True, "autoRepair": True},
    "upgradeSettings": {"maxSurge": 1, "strategy": "SURGE"},
    "networkConfig": {"podRange": "pods", "podIpv4CidrBlock": "10.0.0.0/14"},
}


def listing(pools: int) -> dict[str, Any]:
    plan = plan_job(load_job(job_body("listing", "v5litepod-16", 1, mode="Managed")))
    pool = json.loads(cs.NodePool.to_json(build_node_pool(plan, plan.pools[0], "uid", ["z"])))
    return {"nodePools": [{**pool, **GKE_ADDS, "name": f"pool-{i}"} for i in range(pools)]}


def parse_ms(text: str) -> float:
    best = float("inf")
    for _ in range(3):
        start = time.process_time()
        for _ in range(5):
            response = cs.ListNodePoolsResponse.pb(cs.ListNodePoolsResponse())
            json_format.Parse(text, response, ignore_unknown_fields=True)
        best = min(best, (time.process_time() - start) / 5 * 1000)
    return best


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pools", type=int, default=256)
    args = p.parse_args(argv)
    whole = listing(args.pools)
    descriptor = cs.ListNodePoolsResponse.pb().DESCRIPTOR
    mask = fieldmask.resolve(fieldmask.parse(LISTED_POOL_FIELDS), descriptor)
    rows = {"whole": json.dumps(whole), "masked": json.dumps(fieldmask.apply(whole, mask))}
    figures = {name: (len(text), parse_ms(text)) for name, text in rows.items()}
    print(f"one listing of {args.pools} pools   bytes   parse ms")
    for name, (size, ms) in figures.items():
        print(f"{name:>22} {size:>9,} {ms:>8.1f}")
    (size0, ms0), (size1, ms1) = figures["whole"], figures["masked"]
    print(f"masked vs whole: bytes {size1 / size0:.2f}x, parse {ms1 / ms0:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
