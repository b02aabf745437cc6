"""The verbs of `kubectl msj` that act on a cluster: list, logs, events, suspend, resume,
checkpoint, delete (docs/cli.md).

Every call goes through the user's own kubectl, as `status` does (cli/view.py): the same kubeconfig,
contexts and exec plugins (gke-gcloud-auth-plugin), RBAC as the user, and no Kubernetes client
library in the thin install. Reads are `kubectl get -o json`; writes are one `kubectl patch`,
`annotate` or `delete` each, so `--dry-run` style questions have kubectl's answers.
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from multislice_operator.common import keys

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
POLL_SECONDS = 1.0
# JobSet's replicatedJob name for the slices (render.REPLICATED_JOB; not imported: render pulls in
# the whole planning stack, which `list` and `logs` do not need).
RJOB = "slice"


class KubectlError(Exception):
    """kubectl failed; the message is its own stderr."""


class NotFound(KubectlError):
    """The object does not exist (kubectl's NotFound)."""


# ---------------------------------------------------------------- kubectl


class Kubectl:
    """The user's kubectl with the global flags the verbs share."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.exe: str = args.kubectl
        self.flags: list[str] = []
        if getattr(args, "context", None):
            self.flags += ["--context", args.context]
        if getattr(args, "kubeconfig", None):
            self.flags += ["--kubeconfig", args.kubeconfig]
        self.namespace: str | None = getattr(args, "namespace", None)

    def argv(
        self, *args: str, namespace: str | None = None, all_namespaces: bool = False
    ) -> list[str]:
        argv = [self.exe, *args, *self.flags]
        if all_namespaces:
            argv.append("--all-namespaces")
        elif namespace or self.namespace:
            argv += ["-n", namespace or self.namespace or ""]
        return argv

    def output(self, argv: list[str], timeout: float = 60) -> str:
        try:
            out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
        except FileNotFoundError:
            raise KubectlError(
                f"{self.exe}: not found; install kubectl or pass --kubectl"
            ) from None
        except OSError as exc:  # not executable, ...
            raise KubectlError(f"{self.exe}: cannot run: {exc.strerror or exc}") from None
        except subprocess.TimeoutExpired:
            raise KubectlError(f"{' '.join(argv)}: no answer within {timeout:.0f}s") from None
        if out.returncode != 0:
            message = out.stderr.strip() or f"{' '.join(argv)} exited {out.returncode}"
            raise (NotFound if "NotFound" in message or "not found" in message else KubectlError)(
                message
            )
        return out.stdout

    def get(self, *args: str, **kw: Any) -> dict[str, Any]:
        data: dict[str, Any] = json.loads(self.output(self.argv("get", *args, "-o", "json", **kw)))
        return data

    def job(self, name: str, namespace: str | None = None) -> dict[str, Any]:
        return self.get(resource(), name, namespace=namespace)

    def stream(self, argv: list[str]) -> int:
        """Run with the terminal's stdout and stderr (logs -f); kubectl's failure is ours
        (KubectlError: exit 2, as every verb's), not its own exit code passed through."""
        try:
            code = subprocess.run(argv, check=False).returncode
        except FileNotFoundError:
            raise KubectlError(
                f"{self.exe}: not found; install kubectl or pass --kubectl"
            ) from None
        except OSError as exc:
            raise KubectlError(f"{self.exe}: cannot run: {exc.strerror or exc}") from None
        if code in (-signal.SIGINT, 128 + signal.SIGINT):
            raise KeyboardInterrupt  # Ctrl-C reached kubectl too: exit 130
        if code in (-signal.SIGPIPE, 128 + signal.SIGPIPE):
            raise BrokenPipeError  # `logs | head`: the reader left: exit 141
        if code != 0:
            raise KubectlError(f"{' '.join(argv[:2])} exited {code} (its message is above)")
        return EXIT_OK


def resource() -> str:
    from multislice_operator.cli.view import RESOURCE

    return RESOURCE


def _ns_name(obj: dict[str, Any]) -> tuple[str, str]:
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace", "")), str(meta.get("name", ""))


def _parse_time(value: str | None) -> datetime | None:
    if not value:
        return None
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def age(since: str | None, now: datetime) -> str:
    """kubectl's style: 45s, 12m, 5h, 3d."""
    t = _parse_time(since)
    if t is None:
        return "-"
    s = max(0, int((now - t).total_seconds()))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= size * (2 if unit != "m" else 1):
            return f"{s // size}{unit}"
    return f"{s}s"


def table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["   ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- list


def list_rows(items: list[dict[str, Any]], now: datetime) -> list[dict[str, Any]]:
    """One summary per job, as `list -o json` prints it."""
    from multislice_operator.cli import view

    rows = []
    for obj in items:
        v = view.view(obj, now)
        created = _parse_time(v["creationTimestamp"])
        rows.append(
            {
                "namespace": v["namespace"],
                "name": v["name"],
                "phase": v["phase"] or "Pending",
                "accelerator": v["accelerator"],
                "slices": v["slicesWanted"],
                "readySlices": _ready(v["readySlices"]),
                "restarts": v["restarts"] or 0,
                "chipGoodput": v["goodput"]["chipGoodput"],
                "creationTimestamp": v["creationTimestamp"],
                "ageSeconds": int((now - created).total_seconds()) if created else None,
            }
        )
    return sorted(rows, key=lambda r: (r["namespace"] or "", r["name"] or ""))


def _ready(value: str | None) -> int:
    """status.readySlices is 'ready/total' (what `kubectl get msj` prints)."""
    head = (value or "0").split("/")[0]
    return int(head) if head.isdigit() else 0


def cmd_list(args: argparse.Namespace) -> int:
    from multislice_operator.cli.view import now_utc, percent

    kubectl = Kubectl(args)
    items = kubectl.get(resource(), all_namespaces=args.all_namespaces).get("items") or []
    now = now_utc()
    rows = list_rows(items, now)
    if args.output == "json":
        print(json.dumps(rows, indent=2))
        return EXIT_OK
    if not rows:
        where = (
            "any namespace" if args.all_namespaces else f"namespace {args.namespace or '(current)'}"
        )
        print(f"No MultisliceJobs in {where}.", file=sys.stderr)
        return EXIT_OK
    head = ["NAME", "PHASE", "SLICES", "ACCELERATOR", "RESTARTS", "GOODPUT", "AGE"]
    out = [(["NAMESPACE"] if args.all_namespaces else []) + head]
    for r in rows:
        cells = [
            r["name"],
            r["phase"],
            f"{r['readySlices']}/{r['slices']}",
            r["accelerator"] or "-",
            str(r["restarts"]),
            percent(r["chipGoodput"]),
            age(r["creationTimestamp"], now),
        ]
        out.append(([r["namespace"]] if args.all_namespaces else []) + cells)
    print(table(out), end="")
    return EXIT_OK


# ---------------------------------------------------------------- logs


def _attempt(pod: dict[str, Any]) -> int:
    labels = (pod.get("metadata") or {}).get("labels") or {}
    try:
        return int(labels.get(keys.JOBSET_RESTART_ATTEMPT, "0"))
    except ValueError:
        return 0


def job_pods(kubectl: Kubectl, name: str, namespace: str) -> list[dict[str, Any]]:
    """The pods of the job's current attempt (JobSet's restart-attempt label), not deleting."""
    pods = kubectl.get("pods", "-l", f"{keys.JOB_NAME}={name}", namespace=namespace)["items"]
    live = [p for p in pods if not (p.get("metadata") or {}).get("deletionTimestamp")]
    latest = max((_attempt(p) for p in live), default=0)
    return [p for p in live if _attempt(p) == latest]


def _index(pod: dict[str, Any], key: str) -> int | None:
    value = ((pod.get("metadata") or {}).get("labels") or {}).get(key)
    return int(value) if value is not None and value.isdigit() else None


def _chosen(job: dict[str, Any], pods: list[dict[str, Any]], args: argparse.Namespace
            ) -> list[dict[str, Any]]:  # fmt: skip
    """The pods of worker `args.worker` (of slice `args.slice`, or of every slice), slice order;
    none: a KubectlError saying which and why."""
    chosen = [
        p
        for p in pods
        if _index(p, keys.JOB_COMPLETION_INDEX) == args.worker
        and (args.slice is None or _index(p, keys.JOBSET_JOB_INDEX) == args.slice)
    ]
    if not chosen:
        ns, name = _ns_name(job)
        which = f"worker {args.worker}"
        which = f"slice {args.slice}, {which}" if args.slice is not None else which
        phase = (job.get("status") or {}).get("phase") or "Pending"
        raise KubectlError(
            f"{ns}/{name}: no pod for {which} (job phase {phase}, {len(pods)} pods in the "
            "current attempt)"
        )
    return sorted(chosen, key=lambda p: (_index(p, keys.JOBSET_JOB_INDEX) or 0,
                                         p["metadata"]["name"]))  # fmt: skip


def _log_flags(args: argparse.Namespace, container: str | None) -> list[str]:
    flags = ["--tail", str(args.tail)]  # a selector alone would mean --tail 10
    if container:
        flags += ["-c", container]
    if args.follow:
        flags.append("-f")
    if args.since:
        flags += ["--since", args.since]
    return flags


def _logs_argv(kubectl: Kubectl, name: str, ns: str, chosen: list[dict[str, Any]],
               args: argparse.Namespace, flags: list[str]) -> list[str]:  # fmt: skip
    if len(chosen) == 1:
        return kubectl.argv("logs", chosen[0]["metadata"]["name"], *flags, namespace=ns)
    selector = ",".join(
        [
            f"{keys.JOB_NAME}={name}",
            f"{keys.JOB_COMPLETION_INDEX}={args.worker}",
            f"{keys.JOBSET_RESTART_ATTEMPT}={_attempt(chosen[0])}",
        ]
        + ([f"{keys.JOBSET_JOB_INDEX}={args.slice}"] if args.slice is not None else [])
    )
    # Every slice's worker: one stream each, each line prefixed with its pod.
    return kubectl.argv(
        "logs", "-l", selector, "--prefix", f"--max-log-requests={len(chosen)}", *flags,
        namespace=ns,
    )  # fmt: skip


def cmd_logs(args: argparse.Namespace) -> int:
    kubectl = Kubectl(args)
    job = kubectl.job(args.name)
    ns, name = _ns_name(job)
    containers = ((job.get("spec") or {}).get("template") or {}).get("spec", {}).get("containers")
    container = args.container or (containers[0]["name"] if containers else None)
    chosen = _chosen(job, job_pods(kubectl, name, ns), args)
    argv = _logs_argv(kubectl, name, ns, chosen, args, _log_flags(args, container))
    if args.print_pods:
        print("\n".join(p["metadata"]["name"] for p in chosen))
        return EXIT_OK
    for p in chosen:  # which pod is which, on stderr: stdout stays the logs alone
        print(
            f"# {p['metadata']['name']}: slice {_index(p, keys.JOBSET_JOB_INDEX)}, worker "
            f"{args.worker}, restart attempt {_attempt(p)}",
            file=sys.stderr,
        )
    sys.stderr.flush()
    return kubectl.stream(argv)


# ---------------------------------------------------------------- events


def _related(name: str) -> Callable[[dict[str, Any]], bool]:
    """Whether an event is about the job or what it owns: the MultisliceJob, its JobSet (same
    name), the slice Jobs `<name>-slice-<i>` and their pods `<job>-<worker>-<suffix>` (Indexed
    Job pod names), and its Kueue Workload (`jobset-<name>-<hash>`, Kueue's
    GetWorkloadNameForOwnerWithGVK)."""
    child = re.compile(rf"{re.escape(name)}-{RJOB}-\d+(-\d+-[a-z0-9]{{5}})?")
    workload = re.compile(rf"jobset-{re.escape(name)}-[0-9a-f]{{5}}")

    def related(event: dict[str, Any]) -> bool:
        obj = event.get("involvedObject") or event.get("regarding") or {}
        kind, oname = obj.get("kind"), obj.get("name") or ""
        return (
            (kind in ("MultisliceJob", "JobSet") and oname == name)
            or (kind in ("Job", "Pod") and child.fullmatch(oname) is not None)
            or (kind == "Workload" and workload.fullmatch(oname) is not None)
        )

    return related


def _event_time(e: dict[str, Any]) -> str:
    return str(
        e.get("lastTimestamp") or e.get("eventTime") or e.get("firstTimestamp")
        or (e.get("metadata") or {}).get("creationTimestamp") or ""
    )  # fmt: skip


def job_events(kubectl: Kubectl, name: str, namespace: str) -> list[dict[str, Any]]:
    items = kubectl.get("events", namespace=namespace).get("items") or []
    chosen = [e for e in items if _related(name)(e)]
    return sorted(
        chosen, key=lambda e: _parse_time(_event_time(e)) or datetime.min.replace(tzinfo=UTC)
    )


def _event_row(e: dict[str, Any], now: datetime) -> list[str]:
    obj = e.get("involvedObject") or {}
    count = e.get("count") or 1
    return [
        age(_event_time(e) or None, now),
        str(e.get("type") or ""),
        str(e.get("reason") or ""),
        f"{str(obj.get('kind', '')).lower()}/{obj.get('name', '')}",
        (f"(x{count}) " if count > 1 else "") + " ".join(str(e.get("message") or "").split()),
    ]


def cmd_events(args: argparse.Namespace) -> int:
    from multislice_operator.cli.view import now_utc

    kubectl = Kubectl(args)
    ns, name = _ns_name(kubectl.job(args.name))
    events = job_events(kubectl, name, ns)
    if args.output == "json":
        print(json.dumps(events, indent=2))
        return EXIT_OK
    head = ["LAST SEEN", "TYPE", "REASON", "OBJECT", "MESSAGE"]
    if not events and not args.watch:
        print(f"No events for {ns}/{name}.", file=sys.stderr)
        return EXIT_OK
    print(table([head] + [_event_row(e, now_utc()) for e in events]) if events else "", end="")
    if not args.watch:
        return EXIT_OK
    seen = {_event_key(e) for e in events}
    while True:  # until interrupted (Ctrl-C: exit 130)
        time.sleep(args.interval)
        for e in job_events(kubectl, name, ns):
            if _event_key(e) not in seen:
                seen.add(_event_key(e))
                print("   ".join(_event_row(e, now_utc())), flush=True)


def _event_key(e: dict[str, Any]) -> tuple[str, Any, str]:
    return ((e.get("metadata") or {}).get("uid", ""), e.get("count"), _event_time(e))


# ---------------------------------------------------------------- suspend, resume, checkpoint


def _patch_suspend(args: argparse.Namespace, suspend: bool) -> int:
    kubectl = Kubectl(args)
    ns, name = _ns_name(kubectl.job(args.name))
    patch = json.dumps({"spec": {"suspend": suspend}})
    kubectl.output(
        kubectl.argv("patch", resource(), name, "--type", "merge", "-p", patch, namespace=ns)
    )
    verb = "suspend" if suspend else "resume"
    print(
        f"{ns}/{name}: {verb} requested ("
        + (
            "pods deleted; in Managed mode the node pools are released"
            if suspend
            else "capacity re-provisioned, training resumes from the last checkpoint"
        )
        + ")"
    )
    if not args.wait:
        return EXIT_OK

    def done(st: dict[str, Any]) -> bool:
        phase = st.get("phase")
        return phase == "Suspended" if suspend else phase not in (None, "Suspended")

    return _wait_status(
        kubectl, name, ns, done, args.timeout, what="suspended" if suspend else "resumed"
    )


def cmd_suspend(args: argparse.Namespace) -> int:
    return _patch_suspend(args, True)


def cmd_resume(args: argparse.Namespace) -> int:
    return _patch_suspend(args, False)


def cmd_checkpoint(args: argparse.Namespace) -> int:
    from multislice_operator.reconcile.checkpoint import MAX_ID_LENGTH, valid_id

    request = args.id or f"cli-{int(time.time())}"
    if not valid_id(request):
        raise KubectlError(
            f"--id {request!r}: a checkpoint request id is 1-{MAX_ID_LENGTH} printable "
            "characters, no double quote"
        )
    kubectl = Kubectl(args)
    ns, name = _ns_name(kubectl.job(args.name))
    kubectl.output(
        kubectl.argv(
            "annotate", resource(), name, f"{keys.CHECKPOINT_REQUEST}={request}", "--overwrite",
            namespace=ns,
        )
    )  # fmt: skip
    print(f"{ns}/{name}: checkpoint requested (id {request})")
    if not args.wait:
        return EXIT_OK

    def saved(st: dict[str, Any]) -> bool:
        cp = st.get("checkpoint") or {}
        return cp.get("requestId") == request and cp.get("savedStep") is not None

    def progress(st: dict[str, Any]) -> str:
        cp = st.get("checkpoint") or {}
        if cp.get("requestId") != request:
            return "waiting for the operator to take the request"
        if cp.get("savedStep") is not None:
            return f"saved at step {cp['savedStep']}"
        return f"{cp.get('podsAnnotated', 0)} pods asked; waiting for the save"

    return _wait_status(kubectl, name, ns, saved, args.timeout, what="saved", progress=progress)


def _wait_status(
    kubectl: Kubectl,
    name: str,
    ns: str,
    done: Callable[[dict[str, Any]], bool],
    timeout: float,
    *,
    what: str,
    progress: Callable[[dict[str, Any]], str] | None = None,
) -> int:
    deadline = time.monotonic() + timeout if timeout > 0 else None
    last = None
    while True:
        st = kubectl.job(name, ns).get("status") or {}
        line = progress(st) if progress else f"phase {st.get('phase') or 'Pending'}"
        if line != last:
            print(f"  {line}", flush=True)
            last = line
        if done(st):
            print(f"{ns}/{name}: {what}")
            return EXIT_OK
        if deadline is not None and time.monotonic() > deadline:
            print(f"{ns}/{name}: not {what} after {timeout:.0f}s ({line})", file=sys.stderr)
            return EXIT_FAILED
        time.sleep(POLL_SECONDS)


# ---------------------------------------------------------------- delete


def delete_progress(obj: dict[str, Any]) -> str:
    """What is left before the job can go: the operator's message and the pools still held."""
    st = obj.get("status") or {}
    held = [
        f"{s['nodePool']} ({s.get('phase', '?')})"
        for s in st.get("slices") or []
        if s.get("nodePool") and s.get("phase") not in ("Pending",)
    ]
    finalizers = (obj.get("metadata") or {}).get("finalizers") or []
    parts = [st.get("message") or "waiting for the operator"]
    if held:
        parts.append(f"node pools: {', '.join(held)}")
    foreign = [f for f in finalizers if f != keys.FINALIZER]  # someone else's hold on it
    if foreign:
        parts.append(f"other finalizers: {', '.join(foreign)}")
    return "; ".join(parts)


def cmd_delete(args: argparse.Namespace) -> int:
    kubectl = Kubectl(args)
    ns, name = _ns_name(kubectl.job(args.name))
    kubectl.output(kubectl.argv("delete", resource(), name, "--wait=false", namespace=ns))
    if args.no_wait:
        print(f"{ns}/{name}: deletion requested (the operator releases its node pools first)")
        return EXIT_OK
    print(f"{ns}/{name}: deleting; the operator releases every node pool before the job goes")
    deadline = time.monotonic() + args.timeout if args.timeout > 0 else None
    last = None
    while True:
        try:
            obj = kubectl.job(name, ns)
        except NotFound:
            print(f"{ns}/{name}: deleted; every node pool released")
            return EXIT_OK
        line = delete_progress(obj)
        if line != last:
            print(f"  {line}", flush=True)
            last = line
        if deadline is not None and time.monotonic() > deadline:
            print(
                f"{ns}/{name}: still deleting after {args.timeout:.0f}s ({line}); the deletion "
                f"goes on: `kubectl msj delete {name} -n {ns}` again to follow it",
                file=sys.stderr,
            )
            return EXIT_FAILED
        time.sleep(POLL_SECONDS)


# ---------------------------------------------------------------- the parser


def _cluster_flags(p: argparse.ArgumentParser, *, name: bool = True) -> None:
    if name:
        p.add_argument("name", help="the MultisliceJob's name")
    p.add_argument("-n", "--namespace", help="its namespace (default: kubectl's)")
    p.add_argument("--kubectl", default="kubectl", help="the kubectl to call")
    p.add_argument("--context", help="kubeconfig context (passed to kubectl)")
    p.add_argument("--kubeconfig", help="kubeconfig file (passed to kubectl)")


def _wait_flags(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("--wait", action="store_true", help=f"wait until {what}, printing progress")
    p.add_argument(
        "--timeout", type=float, default=0, help="with --wait: give up after SECONDS (0: never)"
    )


def add_verbs(sub: Any) -> None:
    """Add the cluster verbs to the `multislice-operator` / `kubectl msj` subcommands."""
    p = sub.add_parser("list", help="MultisliceJobs with phase, slices, restarts, goodput and age")
    _cluster_flags(p, name=False)
    p.add_argument(
        "-A", "--all-namespaces", action="store_true", help="every namespace (a NAMESPACE column)"
    )
    p.add_argument("-o", "--output", choices=["text", "json"], default="text")
    p.set_defaults(func=_guard(cmd_list))

    p = sub.add_parser(
        "logs",
        help="a worker's logs: one slice's (--slice), or that worker on every slice, prefixed",
    )
    _cluster_flags(p)
    p.add_argument("--slice", type=int, help="slice index (default: every slice)")
    p.add_argument("--worker", type=int, default=0, help="worker (host) index in the slice")
    p.add_argument("-c", "--container", help="container (default: the template's first)")
    p.add_argument("-f", "--follow", action="store_true", help="stream new lines")
    p.add_argument("--tail", type=int, default=-1, help="lines from the end (default: all)")
    p.add_argument("--since", help="only newer than a duration, e.g. 10m (kubectl's --since)")
    p.add_argument("--print-pods", action="store_true", help="print the pods it would read")
    p.set_defaults(func=_guard(cmd_logs))

    p = sub.add_parser(
        "events", help="events of the job, its JobSet, slice Jobs, pods and Kueue Workload"
    )
    _cluster_flags(p)
    p.add_argument("-o", "--output", choices=["text", "json"], default="text")
    p.add_argument("-w", "--watch", action="store_true", help="then print new events as they come")
    p.add_argument("--interval", type=float, default=2.0, help=argparse.SUPPRESS)
    p.set_defaults(func=_guard(cmd_events))

    for verb, func, what in (
        ("suspend", cmd_suspend, "the job is Suspended"),
        ("resume", cmd_resume, "the job is no longer Suspended"),
    ):
        p = sub.add_parser(
            verb,
            help="set spec.suspend: pods go, Managed node pools are released"
            if verb == "suspend"
            else "clear spec.suspend: re-provision and resume from the last checkpoint",
        )
        _cluster_flags(p)
        _wait_flags(p, what)
        p.set_defaults(func=_guard(func))

    p = sub.add_parser(
        "checkpoint", help=f"ask the workload for a checkpoint now ({keys.CHECKPOINT_REQUEST})"
    )
    _cluster_flags(p)
    p.add_argument("--id", help="the request's id (default: cli-<unix seconds>)")
    _wait_flags(p, "the workload has saved it")
    p.set_defaults(func=_guard(cmd_checkpoint))

    p = sub.add_parser(
        "delete", help="delete the job and wait until its node pools are released, with progress"
    )
    _cluster_flags(p)
    p.add_argument("--no-wait", action="store_true", help="return once the deletion is asked")
    p.add_argument("--timeout", type=float, default=0, help="give up after SECONDS (0: never)")
    p.set_defaults(func=_guard(cmd_delete))


def _guard(func: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """kubectl's failures as one line and exit 2, as cli.main reports bad input."""

    def run(args: argparse.Namespace) -> int:
        try:
            return func(args)
        except KubectlError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return EXIT_USAGE

    run.__name__ = func.__name__
    return run
