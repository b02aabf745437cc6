"""`multislice-operator status NAME` (and `kubectl msj status NAME`): one job, for a person.

The job is read with `kubectl get -o json`, so the view authenticates exactly as the user's kubectl
does (kubeconfig, contexts, exec plugins such as gke-gcloud-auth-plugin) and the operator needs
no Kubernetes client library. `view()` is the data (what `-o json` prints); `render()` draws it
with rich, which is the optional `cli` extra and never imported by `run` or by `-o json`.
"""

from __future__ import annotations

import json
import subprocess
from datetime import UTC, datetime
from typing import Any

from multislice_operator.api.models import (
    PLURAL,
    GoodputState,
    MultisliceJobStatus,
)
from multislice_operator.reconcile.goodput import live

RESOURCE = f"{PLURAL}.multislice.dev"
# One colour per state, used by the bar, the table and the timeline alike.
COLOURS = {
    GoodputState.QUEUED.value: "grey58",
    GoodputState.PROVISIONING.value: "dodger_blue2",
    GoodputState.STARTING.value: "cyan",
    GoodputState.RUNNING.value: "green3",
    GoodputState.RESTARTING.value: "orange1",
    GoodputState.REPAIRING.value: "red1",
    GoodputState.SUSPENDED.value: "magenta",
}
BAR_WIDTH = 60


class FetchError(Exception):
    """kubectl could not give us the job."""


def fetch_job(
    name: str,
    namespace: str | None = None,
    kubectl: str = "kubectl",
    context: str | None = None,
    kubeconfig: str | None = None,
) -> dict[str, Any]:
    argv = [kubectl, "get", RESOURCE, name, "-o", "json"]
    if namespace:
        argv += ["-n", namespace]
    if context:
        argv += ["--context", context]
    if kubeconfig:
        argv += ["--kubeconfig", kubeconfig]
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    except FileNotFoundError:
        raise FetchError(f"{kubectl}: not found; install kubectl or pass --kubectl") from None
    except OSError as exc:  # not executable, ...
        raise FetchError(f"{kubectl}: cannot run: {exc.strerror or exc}") from None
    except subprocess.TimeoutExpired:
        raise FetchError(f"{' '.join(argv)}: no answer within 60s") from None
    if out.returncode != 0:
        raise FetchError(out.stderr.strip() or f"{' '.join(argv)} exited {out.returncode}")
    obj: dict[str, Any] = json.loads(out.stdout)
    return obj


def _iso(t: datetime | None) -> str | None:
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ") if t else None


def _mapping(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _preflight_lines(pre: dict[str, Any] | None) -> list[str]:
    """spec.preflight's compile: its state and, once it ran, the HBM it needs per device."""
    if not pre:
        return []
    need, have = pre.get("hbmBytesPerDevice"), pre.get("hbmCapacityBytes")
    hbm = f", HBM {need / 2**30:.2f} GiB per device" if isinstance(need, int) else ""
    hbm += f" of {have / 2**30:.2f} GiB" if hbm and isinstance(have, int) else ""
    step = pre.get("stepTimeSeconds")
    hbm += f", step ~{step:.3g} s" if isinstance(step, (int, float)) else ""
    return [f"preflight: {pre.get('state', '?')} (Job {pre.get('job', '?')}){hbm}"]


def _fallback_lines(fb: dict[str, Any] | None) -> list[str]:
    """provisioning.mode Fallback: the option tried now, each option tried (how long, why it was
    left) and each shape the compiler judged."""
    if not fb:
        return []
    options = {o.get("option"): o for o in fb.get("options", [])}
    k = _int(fb.get("option")) or 0
    what = options.get(k, {}).get("what")
    head = f"fallback: option {k + 1}{f' ({what})' if what else ''}, round {fb.get('round', 1)}"
    if fb.get("leaving"):
        head += f", leaving it ({fb['leaving']})"
    elif fb.get("lastLeft"):
        head += f"; left option {(_int(fb.get('lastLeftOption')) or 0) + 1}: {fb['lastLeft']}"
    lines = [head]
    for i, o in sorted(options.items(), key=lambda kv: _int(kv[0]) or 0):
        n = _int(o.get("attempts")) or 0
        line = f"  option {(_int(i) or 0) + 1} ({o.get('what', '?')}): {n} attempt"
        line += f"{'s' if n != 1 else ''}, waited {duration(o.get('waitedSeconds', 0))}"
        if o.get("lastLeft"):
            line += f", last left: {o['lastLeft']}"
        lines.append(line)
    for sh in fb.get("shapes", []):
        name = sh.get("name") or "the job's own"
        need = sh.get("hbmBytesPerDevice")
        hbm = f", HBM {need / 2**30:.2f} GiB per device" if isinstance(need, int) else ""
        verdict = "compiles" if sh.get("fits") else "refused by the compiler"
        lines.append(f"  shape {name} ({sh.get('what', '?')}): {verdict}{hbm}")
    return lines


def _dump(part: Any) -> dict[str, Any] | None:
    """A part of the status as it is stored (camelCase, no nulls); None for none."""
    return part.model_dump(by_alias=True, exclude_none=True, mode="json") if part else None


def _timeline(st: MultisliceJobStatus, until: datetime) -> list[dict[str, Any]]:
    """The goodput timeline, each state with its seconds (the last one's up to `until`)."""
    entries = st.goodput.timeline if st.goodput else []
    out = []
    for i, seg in enumerate(entries):
        end = entries[i + 1].since if i + 1 < len(entries) else until
        seconds = max(0, int((end - seg.since).total_seconds()))
        out.append({"state": seg.state, "since": _iso(seg.since), "seconds": seconds})
    return out


def _by_cause(raw: dict[str, Any], st: MultisliceJobStatus) -> dict[str, Any]:
    """The causes that happened, as the status says (a status without the split: the last
    restart's cause for all of them)."""
    by_cause = raw.get("restartsByCause")
    if isinstance(by_cause, dict):
        return {
            k: n for k, n in by_cause.items() if isinstance(k, str) and _int(n) is not None and n
        }
    return {st.last_restart.cause: st.restarts} if st.last_restart and st.restarts else {}


def _next_attempt(st: MultisliceJobStatus, now: datetime) -> int | None:
    when = st.next_attempt_time
    return max(0, int((when - now).total_seconds())) if when else None


def view(obj: dict[str, Any], now: datetime) -> dict[str, Any]:
    """Everything the view shows, as plain data: the status as read, the goodput live at `now`."""
    # A file (status -f) may hold anything where a mapping belongs: read what is well typed.
    meta, spec, raw = (_mapping(obj.get(k)) for k in ("metadata", "spec", "status"))
    st = MultisliceJobStatus.from_dict(raw)
    g = live(st.goodput, now)
    checkpoint = st.checkpoint if st.checkpoint and st.checkpoint.request_id else None
    return {
        # A file from `kubectl get -o yaml` always has one; a hand-written one means default.
        "namespace": _str(meta.get("namespace")) or "default",
        "name": _str(meta.get("name")),
        "accelerator": _str(spec.get("accelerator")),
        "slicesWanted": _int(spec.get("slices")),
        "totalChips": st.total_chips,
        "phase": st.phase,
        "message": st.message,
        "readySlices": st.ready_slices,
        "activeSlices": st.active_slices,
        "slices": [_dump(s) for s in st.slices],
        "restarts": st.restarts,
        "restartsByCause": _by_cause(raw, st),
        "lastRestart": _dump(st.last_restart),
        "lastFailure": _dump(st.last_failure),
        "maintenance": _dump(st.maintenance),
        "checkpoint": _dump(checkpoint),
        "preflight": _dump(st.preflight),
        "fallback": _dump(st.fallback),
        "provisioningAttempts": st.provisioning_attempts,
        "nextAttemptTime": _iso(st.next_attempt_time),
        "nextAttemptInSeconds": _next_attempt(st, now),
        # A job MultiKueue dispatched: the cluster that runs it (the manager shows it too).
        "runsIn": st.queue.cluster if st.queue else None,
        "creationTimestamp": _str(meta.get("creationTimestamp")),
        "completionTime": _iso(st.completion_time),
        "goodput": g.as_dict(),
        "timeline": _timeline(st, g.now),
    }


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def percent(ratio: float | None) -> str:
    return f"{ratio * 100:.1f}%" if ratio is not None else "-"


NO_STATUS = "(no status yet)"
NO_STATUS_HINT = (
    "no operator has written this job's status yet: is multislice-operator running, and "
    "watching namespace {namespace}?"
)


def render(v: dict[str, Any], console: Any) -> None:
    """Draw the view on a rich Console."""
    for part in (_head, _slices, _restarts, _moments, _goodput, _timeline_strip, _next):
        part(v, console)


def _head(v: dict[str, Any], console: Any) -> None:
    from rich.text import Text

    head = Text()
    head.append(f"{v['namespace']}/{v['name']}", style="bold")
    head.append(f"  {v['phase'] or NO_STATUS}", style="bold " + _phase_style(v["phase"]))
    if v["accelerator"]:
        chips = f", {v['totalChips']} chips" if v["totalChips"] else ""
        head.append(f"  {v['slicesWanted']} x {v['accelerator']}{chips}")
    active, wanted = v.get("activeSlices"), v["slicesWanted"]
    if active is not None and wanted and active < wanted:
        head.append(f"  running on {active} of {wanted} slices (elastic)", style="orange1")
    console.print(head)
    if v["message"]:
        console.print(Text(f"  {v['message']}"))
    if v.get("runsIn"):
        console.print(Text(f"  runs in {v['runsIn']} (dispatched by MultiKueue)"))
    if not v["message"] and not v["phase"]:
        console.print(Text(f"  {NO_STATUS_HINT.format(namespace=v['namespace'])}"))


def _slices(v: dict[str, Any], console: Any) -> None:
    from rich import box
    from rich.table import Table

    if not v["slices"]:
        return
    table = Table(box=box.SIMPLE, title="slices", title_justify="left", pad_edge=False)
    for col in ("slice", "node pool", "hosts ready", "phase", "message"):
        table.add_column(col)
    for s in v["slices"]:
        table.add_row(
            str(s["index"]),
            s.get("nodePool") or "-",
            f"{s.get('readyHosts', 0)}/{s['hosts']}",
            s.get("phase", ""),
            s.get("message") or "",
        )
    console.print(table)


def _restarts(v: dict[str, Any], console: Any) -> None:
    from rich.text import Text

    restarts = Text(f"restarts: {v['restarts']}")
    if v["restartsByCause"]:
        causes = ", ".join(f"{k} {n}" for k, n in sorted(v["restartsByCause"].items()))
        restarts.append(f" ({causes})")
    console.print(restarts)
    last = v["lastRestart"]
    if last:
        lost = last.get("lostSteps")
        recovery = last.get("recoverySeconds")
        console.print(
            f"  last: restart {last['restart']}, cause {last['cause']}, at "
            f"{last.get('time', '-')}, "
            f"{'unknown steps' if lost is None else f'{lost} steps'} lost, "
            + (f"recovered in {duration(recovery)}" if recovery is not None else "recovering")
        )
    failure = v["lastFailure"]
    if failure:
        code = failure.get("exitCode")
        console.print(
            f"  last failure: pod {failure['pod']}"
            + (f" exit code {code}" if code is not None else "")
            + (f" {failure['reason']}" if failure.get("reason") else "")
            + (f" (cause {failure['cause']})" if failure.get("cause") else "")
        )


def _moments(v: dict[str, Any], console: Any) -> None:
    """The preflight, announced maintenance and the last checkpoint request."""
    for line in [*_preflight_lines(v.get("preflight")), *_fallback_lines(v.get("fallback"))]:
        console.print(line)
    maint = v["maintenance"]
    if maint:
        slices = ", ".join(str(i) for i in maint.get("slices", [])) or "-"
        what = "in progress" if maint.get("active") else f"at {maint.get('time', '-')}"
        console.print(f"maintenance: {what} on slices {slices} ({maint.get('nodes', 0)} nodes)")
    cp = v["checkpoint"]
    if cp:
        saved = cp.get("savedStep")
        console.print(
            f"checkpoint: request {cp['requestId']} ({cp.get('source')}) at "
            f"{cp.get('requestTime', '-')}, {cp.get('podsAnnotated', 0)} pods, "
            + (f"saved at step {saved}" if saved is not None else "not saved yet")
        )


def _goodput(v: dict[str, Any], console: Any) -> None:
    from rich import box
    from rich.bar import Bar
    from rich.table import Table
    from rich.text import Text

    g = v["goodput"]
    console.print()
    wall = g["wallSeconds"]
    title = Text("goodput", style="bold")
    title.append(f"  {duration(wall)} since creation, as of {g['asOf']}")
    console.print(title)
    console.print(stacked_bar(g["seconds"], wall, BAR_WIDTH))
    table = Table(box=box.SIMPLE, pad_edge=False)
    for col, justify in (
        ("state", "left"),
        ("time", "right"),
        ("share", "right"),
        ("", "left"),
        ("chip-hours", "right"),
    ):
        table.add_column(col, justify=justify)  # type: ignore[arg-type]
    for state in GoodputState:
        secs = g["seconds"][state.value]
        share = secs / wall if wall else 0.0
        table.add_row(
            Text(state.value, style=COLOURS[state.value]),
            duration(secs),
            percent(share),
            Bar(size=1.0, begin=0.0, end=share, width=24, color=COLOURS[state.value]),
            f"{g['chipSeconds'][state.value] / 3600:.2f}",
        )
    console.print(table)
    console.print(
        f"chip goodput {percent(g['chipGoodput'])} (running / held chip-seconds)   "
        f"wall goodput {percent(g['wallGoodput'])} (running / time since admission)   "
        f"steps lost {g['lostSteps']}"
    )
    if g.get("degradedChipSeconds"):
        console.print(
            f"of running, on fewer slices (spec.elastic): "
            f"{g['degradedChipSeconds'] / 3600:.2f} chip-hours"
        )


def _timeline_strip(v: dict[str, Any], console: Any) -> None:
    from rich.table import Table
    from rich.text import Text

    if not v["timeline"]:
        return
    console.print()
    first, end = v["timeline"][0]["since"], v["goodput"]["asOf"]
    console.print(Text("timeline", style="bold") + Text(f"  {first} -> {end}"))
    strip = Text()
    total = sum(seg["seconds"] for seg in v["timeline"]) or 1
    for seg, width in zip(v["timeline"], _widths(v["timeline"], total), strict=True):
        strip.append("█" * width, style=COLOURS[seg["state"]])
    console.print(strip)
    rows = Table(box=None, show_header=False, pad_edge=False)
    for _ in range(3):
        rows.add_column()
    for seg in v["timeline"][-8:]:
        rows.add_row(
            seg["since"],
            Text(seg["state"], style=COLOURS[seg["state"]]),
            duration(seg["seconds"]),
        )
    console.print(rows)


def _next(v: dict[str, Any], console: Any) -> None:
    if v["nextAttemptTime"]:
        console.print(
            f"next gang attempt at {v['nextAttemptTime']} "
            f"(in {duration(v['nextAttemptInSeconds'])}, attempt "
            f"{(v['provisioningAttempts'] or 0) + 1})"
        )


def stacked_bar(seconds: dict[str, int], wall: int, width: int) -> Any:
    """One bar, each state's share of the time in its colour."""
    from rich.text import Text

    bar = Text()
    if wall <= 0:
        return bar
    items: list[dict[str, Any]] = [
        {"state": s, "seconds": seconds[s]} for s in seconds if seconds[s] > 0
    ]
    for item, w in zip(items, _widths(items, wall, width), strict=True):
        bar.append("█" * w, style=COLOURS[item["state"]])
    return bar


def _widths(items: list[dict[str, Any]], total: int, width: int = BAR_WIDTH) -> list[int]:
    """Cells per item, proportional (largest remainder), every non-empty item at least one."""
    if total <= 0:
        return [0] * len(items)
    raw = [item["seconds"] * width / total for item in items]
    cells = [
        max(1, int(r)) if item["seconds"] > 0 else 0 for r, item in zip(raw, items, strict=True)
    ]
    left = width - sum(cells)
    for k in sorted(range(len(items)), key=lambda k: raw[k] - int(raw[k]), reverse=True):
        if left <= 0:
            break
        if items[k]["seconds"] > 0:
            cells[k] += 1
            left -= 1
    return cells


def _phase_style(phase: str | None) -> str:
    return {
        "Running": "green3",
        "Succeeded": "green3",
        "Failed": "red1",
        "Restarting": "orange1",
        "Suspended": "magenta",
    }.get(phase or "", "")


def now_utc() -> datetime:
    return datetime.now(UTC)
