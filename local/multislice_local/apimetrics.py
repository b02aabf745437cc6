"""What the apiserver says it served: apiserver_request_total by verb and resource, for the
write budget test and the benchmarks (counts are deterministic where times are not)."""

from __future__ import annotations

import re
import time
from collections import Counter

from kubernetes import client

WRITE_VERBS = frozenset({"POST", "PUT", "PATCH", "DELETE", "DELETECOLLECTION", "APPLY"})
READ_VERBS = frozenset({"GET", "LIST", "WATCH", "WATCHLIST"})
# Resources the operator touches; the apiserver's own bookkeeping (leases...) is left out.
OPERATOR_RESOURCES = frozenset(
    {
        "multislicejobs",
        "multislicejobs/status",
        "jobsets",
        "jobsets/status",
        "events",
        "pods",
        "nodes",
    }
)


_METRIC = re.compile(r"^apiserver_request_total\{(?P<labels>[^}]*)\} (?P<value>\S+)$")
_LABEL = re.compile(r'(\w+)="([^"]*)"')


def request_counts(api: client.ApiClient) -> Counter[tuple[str, str]]:
    """apiserver_request_total summed by (verb, resource[/subresource]); GET /metrics as admin."""
    resp = api.call_api("GET", f"{api.configuration.host}/metrics")
    resp.read()  # type: ignore[no-untyped-call]
    counts: Counter[tuple[str, str]] = Counter()
    for line in (resp.data or b"").decode().splitlines():
        m = _METRIC.match(line)
        if not m:
            continue
        labels = dict(_LABEL.findall(m["labels"]))
        resource = labels.get("resource", "")
        if not resource:
            continue  # /readyz, /metrics, discovery
        if labels.get("subresource"):
            resource = f"{resource}/{labels['subresource']}"
        counts[(labels.get("verb", ""), resource)] += int(float(m["value"]))
    return counts


def count_diff(after: Counter[tuple[str, str]], before: Counter[tuple[str, str]]) -> dict[str, int]:
    """'VERB resource' -> requests between the two scrapes (non-zero only)."""
    out = {f"{v} {r}": after[(v, r)] - before.get((v, r), 0) for (v, r) in after}
    return {k: n for k, n in sorted(out.items()) if n}


def writes(diff: dict[str, int], resources: frozenset[str] = OPERATOR_RESOURCES) -> int:
    return sum(
        n for k, n in diff.items() if k.split()[0] in WRITE_VERBS and k.split()[1] in resources
    )


def reads(diff: dict[str, int], resources: frozenset[str] = OPERATOR_RESOURCES) -> int:
    """GET and LIST requests (a WATCH is counted when it ends, so it is left out here)."""
    return sum(
        n for k, n in diff.items() if k.split()[0] in {"GET", "LIST"} and k.split()[1] in resources
    )


def settle(api: client.ApiClient, quiet_s: float = 2.0, timeout: float = 30.0) -> float:
    """Wait until no write reaches the apiserver for `quiet_s`; return the time waited."""
    start = time.monotonic()
    last, last_change = writes(count_diff(request_counts(api), Counter())), time.monotonic()
    while time.monotonic() - start < timeout:
        time.sleep(0.5)
        now = writes(count_diff(request_counts(api), Counter()))
        if now != last:
            last, last_change = now, time.monotonic()
        elif time.monotonic() - last_change >= quiet_s:
            break
    return time.monotonic() - start
