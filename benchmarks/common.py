"""What every benchmark shares: clients, fake Ready nodes, watches, apiserver request counts,
process footprint, percentiles, tables and the JSON results under benchmarks/results/."""

from __future__ import annotations

import json
import os
import platform
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from kubernetes import client, config

from multislice_local.apimetrics import (  # noqa: F401 (re-exported for the benchmarks)
    OPERATOR_RESOURCES,
    READ_VERBS,
    WRITE_VERBS,
    count_diff,
    reads,
    request_counts,
    settle,
    writes,
)
from multislice_local.controlplane import ControlPlane
from multislice_local.nodes import tpu_node_manifest
from multislice_operator.api import models

RESULTS = Path(__file__).resolve().parent / "results"
JOBSET = ("jobset.x-k8s.io", "v1alpha2", "jobsets")
MSJ = (models.GROUP, models.VERSION, models.PLURAL)
WORKERS = 16  # client threads, the same for the operator runs and their baselines
T = TypeVar("T")
R = TypeVar("R")


# ---------------------------------------------------------------- clients and objects


def admin_client(cp: ControlPlane, pool_size: int = 32) -> client.ApiClient:
    """An admin client whose connection pool fits WORKERS threads (the default keeps 10)."""
    cfg = client.Configuration()
    config.load_kube_config(config_file=str(cp.kubeconfig), client_configuration=cfg)  # type: ignore[no-untyped-call]
    cfg.connection_pool_maxsize = pool_size
    return client.ApiClient(cfg)


def create_namespace(api: client.ApiClient, name: str) -> str:
    client.CoreV1Api(api).create_namespace({"metadata": {"name": name}})  # type: ignore[arg-type]
    return name


def job_body(
    name: str,
    accelerator: str = "v5litepod-16",
    slices: int = 2,
    mode: str = "Existing",
    template: dict[str, Any] | None = None,
    max_restarts: int = 3,
) -> dict[str, Any]:
    return {
        "apiVersion": models.API_VERSION,
        "kind": models.KIND,
        "metadata": {"name": name},
        "spec": {
            "accelerator": accelerator,
            "slices": slices,
            "provisioning": {"mode": mode},
            "failurePolicy": {"maxRestarts": max_restarts},
            "template": template
            or {"spec": {"containers": [{"name": "train", "image": "example.invalid/t:1"}]}},
        },
    }


def ready_node(
    name: str,
    pool: str,
    accelerator_label: str,
    topology: str,
    chips_per_host: int,
    extra_labels: dict[str, str] | None = None,
    spot: bool = False,
) -> dict[str, Any]:
    """A fake GKE TPU node created Ready (the api profile has no kwok to mark it Ready; the
    apiserver keeps a node's status given at creation)."""
    body = tpu_node_manifest(
        name, pool, accelerator_label, topology, chips_per_host, extra_labels, spot
    )
    body["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
    return body


def ready_pools(
    api: client.ApiClient,
    prefix: str,
    pools: int,
    hosts: int,
    accelerator_label: str = "tpu-v5-lite-podslice",
    topology: str = "4x4",
    chips_per_host: int = 4,
    extra_labels: dict[str, str] | None = None,
) -> list[str]:
    """Existing node pools `<prefix>-<p>` of `hosts` Ready nodes each."""
    core = client.CoreV1Api(api)
    names: list[str] = []
    for p in range(pools):
        pool = f"{prefix}-{p}"
        for i in range(hosts):
            body = ready_node(
                f"{pool}-{i}", pool, accelerator_label, topology, chips_per_host, extra_labels
            )
            core.create_node(body)  # type: ignore[arg-type]
            names.append(body["metadata"]["name"])
    return names


def pool_label(pool: dict[str, Any], suffix: str) -> str:
    """The value of a GKE simulator pool's label (node or resource label) ending in `suffix`."""
    config = pool.get("config") or {}
    for labels in (config.get("labels") or {}, config.get("resourceLabels") or {}):
        for key, value in labels.items():
            if key.endswith(suffix):
                return str(value)
    return ""


def parallel(fn: Callable[[T], R], items: Iterable[T], workers: int = WORKERS) -> list[R]:
    with ThreadPoolExecutor(workers, thread_name_prefix="bench") as pool:
        return list(pool.map(fn, items))


def wait_until(check: Callable[[], Any], timeout: float, what: str, interval: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")


# ---------------------------------------------------------------- process footprint


def process_tree(pid: int) -> list[int]:
    """pid and every live descendant (from /proc/*/stat)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children.get(p, [])
    return out


def rss_mib(pid: int) -> float:
    """Resident memory (VmRSS) of the process and its descendants, MiB."""
    total_kib = 0
    for p in process_tree(pid):
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total_kib += int(line.split()[1])
        except OSError:
            continue
    return total_kib / 1024


def cpu_seconds(pid: int, tree: bool = True) -> float:
    """utime + stime of the process (and, with `tree`, its live descendants), seconds."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for p in process_tree(pid) if tree else [pid]:
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)
    return total / ticks


class CpuMeter:
    """CPU seconds used by named processes between start() and stop()."""

    def __init__(self, pids: dict[str, int], tree: frozenset[str] = frozenset()) -> None:
        self.pids, self.tree = dict(pids), tree
        self.start_s: dict[str, float] = {}
        self.wall = self.busy = 0.0

    def _now(self) -> dict[str, float]:
        return {k: cpu_seconds(p, k in self.tree) for k, p in self.pids.items()}

    def start(self) -> CpuMeter:
        self.start_s, self.wall, self.busy = self._now(), time.monotonic(), machine_busy_s()
        return self

    def stop(self) -> dict[str, float]:
        """CPU seconds per named process, `wall`, and `others`: CPU the rest of the machine used
        meanwhile (other users of a shared machine), which slows whatever was measured."""
        now = self._now()
        out = {k: round(now[k] - self.start_s[k], 2) for k in now}
        busy = machine_busy_s() - self.busy
        out["wall"] = round(time.monotonic() - self.wall, 2)
        out["others"] = round(max(0.0, busy - sum(out[k] for k in now)), 2)
        return out


def machine_busy_s() -> float:
    """CPU seconds the whole machine has been busy (all cores; /proc/stat)."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[:8])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def threads_of(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    return 0


# ---------------------------------------------------------------- statistics and output


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile, q in [0, 100]."""
    if not values:
        return float("nan")
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def stats(values: Sequence[float]) -> dict[str, float]:
    return {
        "n": len(values),
        "p50": percentile(values, 50),
        "p95": percentile(values, 95),
        "p99": percentile(values, 99),
        "max": max(values) if values else float("nan"),
        "mean": sum(values) / len(values) if values else float("nan"),
    }


def fmt(value: Any, digits: int = 2) -> str:
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def table(title: str, headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[fmt(c) for c in row] for row in rows]
    widths = [max([len(h), *(len(r[i]) for r in cells)]) for i, h in enumerate(headers)]
    line = "  ".join(h.rjust(w) for h, w in zip(headers, widths, strict=True))
    out = [f"\n== {title}", line, "  ".join("-" * w for w in widths)]
    out += ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in cells]
    text = "\n".join(out)
    print(text, flush=True)
    return text


def machine() -> dict[str, Any]:
    load = os.getloadavg()
    return {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "loadavg_at_start": [round(x, 2) for x in load],
        "time": datetime.now(UTC).isoformat(timespec="seconds"),
    }


def save(name: str, data: dict[str, Any]) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps({"benchmark": name, "machine": machine(), **data}, indent=2) + "\n")
    print(f"-> {path.relative_to(RESULTS.parent.parent)}", flush=True)
    return path


def say(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)
