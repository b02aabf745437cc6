"""`multislice-operator run`: settings, logging, the provisioner, then kopf."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from typing import Any

from multislice_operator.provisioning.base import Provisioner
from multislice_operator.settings import Settings, from_args


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        data: dict[str, Any] = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            data["exception"] = self.formatException(record.exc_info)
        return json.dumps(data)


def setup_logging(settings: Settings) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if settings.log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.DEBUG if settings.verbose else logging.INFO)
    # kopf is chatty at INFO about every handler; keep its warnings.
    logging.getLogger("kopf").setLevel(logging.DEBUG if settings.verbose else logging.WARNING)
    for noisy in ("urllib3", "kubernetes", "google", "aiohttp"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def make_provisioner(settings: Settings) -> Provisioner | None:
    """The GKE provisioner when a cluster is configured (or read from the metadata server)."""
    if not (settings.gke_configured or settings.gke_from_metadata):
        return None
    from multislice_operator.provisioning.gke import GkeProvisioner

    return GkeProvisioner.from_settings(
        project=settings.gke_project,
        location=settings.gke_location,
        cluster=settings.gke_cluster,
        node_locations=settings.gke_node_locations,
        endpoint=settings.gke_endpoint,
        simulator=settings.gke_simulator,
        node=settings.node_options(),
    )


def run_operator(args: argparse.Namespace) -> int:
    import kopf
    import uvloop

    from multislice_operator.controller import discovery, handlers, relist

    settings = from_args(args)
    problems = settings.problems()
    if problems:
        for problem in problems:
            print(f"error: {problem}", file=sys.stderr)
        return 2
    setup_logging(settings)
    handlers.configure(settings, make_provisioner)
    discovery.install(handlers.api_groups(), optional=handlers.optional_api_groups())
    relist.install()
    namespaces = settings.namespaces
    try:
        # uvloop's event loop: its transports and TLS are libuv's and C, where asyncio's are
        # Python (the apiserver's watch streams and writes were a fifth of the operator's busy
        # samples under a 1000-job load; docs/benchmarks.md).
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(
                kopf.operator(
                    clusterwide=not namespaces,
                    namespaces=namespaces,
                    # High availability is a coordination.k8s.io Lease (--leader-elect), not
                    # kopf's peering: kopf never pauses, every replica watches, one reconciles.
                    standalone=True,
                    memories=relist.MEMORIES,
                )
            )
    except KeyboardInterrupt:
        return 130
    return 0
