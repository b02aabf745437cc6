"""Watches in a child process: when did each object first satisfy a predicate?

The load the benchmarks generate comes from client threads in the parent process; a watch in the
same process would compete with them for the GIL, fall behind and report late times (the
apiserver even closes a watch that is read too slowly). So the watches run in a process of their
own and stamp each event with time.monotonic(), which is one clock for every process on Linux.

Predicates are named (they cross a process boundary): see PREDICATES.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

Predicate = Callable[[dict[str, Any], Any], bool]
DELETED = "__deleted__"  # set on the object of a DELETED watch event


def _phase(obj: dict[str, Any], phases: Any) -> bool:
    return (obj.get("status") or {}).get("phase") in tuple(phases)


def _label(obj: dict[str, Any], kv: Any) -> bool:
    key, value = kv
    return bool(((obj.get("metadata") or {}).get("labels") or {}).get(key) == value)


def _status_field(obj: dict[str, Any], kv: Any) -> bool:
    key, value = kv
    return bool((obj.get("status") or {}).get(key) == value)


def _condition(obj: dict[str, Any], kv: Any) -> bool:
    ctype, status = kv
    return any(
        c.get("type") == ctype and c.get("status") == status
        for c in (obj.get("status") or {}).get("conditions") or []
    )


def _deleted(obj: dict[str, Any], _: Any) -> bool:
    return bool(obj.get(DELETED))


def _node_ready(obj: dict[str, Any], _: Any) -> bool:
    return _condition(obj, ("Ready", "True"))


def _pod_running(obj: dict[str, Any], kv: Any) -> bool:
    return _label(obj, kv) and (obj.get("status") or {}).get("phase") == "Running"


def _pod_annotated(obj: dict[str, Any], kv: Any) -> bool:
    """A Running pod whose annotation `key` is `value` (an in-place restart keeps the pod)."""
    key, value = kv
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    return annotations.get(key) == value and (obj.get("status") or {}).get("phase") == "Running"


PREDICATES: dict[str, Predicate] = {
    "exists": lambda _o, _a: True,
    "phase": _phase,
    "label": _label,
    "status": _status_field,
    "condition": _condition,
    "node_ready": _node_ready,
    "deleted": _deleted,
    "pod_running": _pod_running,
    "pod_annotated": _pod_annotated,
}


@dataclass(frozen=True)
class Spec:
    """What to watch: a resource ("pods", "nodes" or (group, version, plural)) in a namespace
    (None: all), and the named predicate with its argument."""

    resource: tuple[str, str, str] | str
    namespace: str | None
    predicate: str = "exists"
    arg: Any = None


# ---------------------------------------------------------------- the child process


class _Child:
    def __init__(self, kubeconfig: str) -> None:
        from kubernetes import client, config

        cfg = client.Configuration()
        config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)  # type: ignore[no-untyped-call]
        self.api = client.ApiClient(cfg)
        self.lock = threading.Condition()
        self.specs: dict[str, Spec] = {}
        self.seen: dict[str, dict[str, float]] = {}
        self.latest: dict[tuple[Any, str | None], dict[str, dict[str, Any]]] = {}
        self.streams: set[tuple[Any, str | None]] = set()
        self.errors: list[str] = []

    def add(self, name: str, spec: Spec) -> None:
        stream = (spec.resource, spec.namespace)
        with self.lock:
            self.specs[name] = spec
            self.seen[name] = {}
            now = time.monotonic()
            for key, obj in self.latest.get(stream, {}).items():
                if PREDICATES[spec.predicate](obj, spec.arg):
                    self.seen[name][key] = now
        if stream not in self.streams:
            self.streams.add(stream)
            ready = threading.Event()
            threading.Thread(target=self._watch, args=(stream, ready), daemon=True).start()
            ready.wait(30)

    def _list_fn(self, resource: Any, namespace: str | None) -> tuple[Any, list[Any]]:
        from kubernetes import client

        if resource in ("pods", "nodes"):
            core = client.CoreV1Api(self.api)
            if resource == "nodes":
                return core.list_node, []
            if namespace:
                return core.list_namespaced_pod, [namespace]
            return core.list_pod_for_all_namespaces, []
        custom = client.CustomObjectsApi(self.api)
        group, version, plural = resource
        if namespace:
            return custom.list_namespaced_custom_object, [group, version, namespace, plural]
        return custom.list_cluster_custom_object, [group, version, plural]

    def _watch(self, stream: tuple[Any, str | None], ready: threading.Event) -> None:
        """List, then watch from there; when the watch ends or fails (an expired resource
        version on a loaded apiserver sends an ERROR event), list and watch again: objects
        first seen by that list are stamped when it came back."""
        import json

        from kubernetes import watch

        fn, args = self._list_fn(*stream)
        while True:
            try:
                resp = fn(*args, _preload_content=False)
                listed = json.loads(resp.data)
                now = time.monotonic()
                for obj in listed.get("items") or []:
                    self._offer(stream, obj, now)
                rv = listed["metadata"]["resourceVersion"]
            except Exception as exc:  # the control plane went away
                self.errors.append(f"list {stream}: {exc}")
                ready.set()
                return
            ready.set()
            w = watch.Watch()  # type: ignore[no-untyped-call]
            try:
                events = w.stream(fn, *args, resource_version=rv, deserialize=False)  # type: ignore[no-untyped-call]
                for event in events:
                    obj = event.get("object")
                    if event.get("type") == "ERROR" or not isinstance(obj, dict):
                        break  # e.g. 410 Gone: list again
                    if event.get("type") == "DELETED":
                        obj[DELETED] = True
                    self._offer(stream, obj, time.monotonic())
            except Exception as exc:
                self.errors.append(f"watch {stream}: {exc}")
                time.sleep(0.2)

    def _offer(self, stream: tuple[Any, str | None], obj: dict[str, Any], now: float) -> None:
        meta = obj.get("metadata") or {}
        key = str(meta.get("name"))
        with self.lock:
            self.latest.setdefault(stream, {})[key] = obj
            hit = False
            for name, spec in self.specs.items():
                if (spec.resource, spec.namespace) != stream or key in self.seen[name]:
                    continue
                if PREDICATES[spec.predicate](obj, spec.arg):
                    self.seen[name][key] = now
                    hit = True
            if hit:
                self.lock.notify_all()

    def wait(
        self, name: str, keys: list[str] | None, count: int | None, timeout: float
    ) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        with self.lock:
            while True:
                seen = self.seen[name]
                done = (keys is None or all(k in seen for k in keys)) and (
                    count is None or len(seen) >= count
                )
                if done:
                    wanted = keys if keys is not None else list(seen)
                    return {"ok": True, "seen": {k: seen[k] for k in wanted}}
                left = deadline - time.monotonic()
                if left <= 0:
                    return {"ok": False, "seen": dict(seen), "errors": list(self.errors)}
                self.lock.wait(min(left, 0.5))


def _main(kubeconfig: str, conn: Connection) -> None:
    child = _Child(kubeconfig)
    conn.send("ready")
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        op = msg[0]
        if op == "add":
            child.add(msg[1], msg[2])
            conn.send(True)
        elif op == "wait":
            conn.send(child.wait(*msg[1:]))
        elif op == "snapshot":
            with child.lock:
                conn.send(dict(child.seen[msg[1]]))
        elif op == "stop":
            conn.send(True)
            return


# ---------------------------------------------------------------- the parent's handle


class Watcher:
    """A child process holding watches; `add` a named spec, then `wait` for its objects."""

    def __init__(self, kubeconfig: Path) -> None:
        ctx = mp.get_context("spawn")
        self._conn, child_conn = ctx.Pipe()
        self._proc = ctx.Process(target=_main, args=(str(kubeconfig), child_conn), daemon=True)
        self._proc.start()
        if not self._conn.poll(60):
            raise TimeoutError("watcher process did not start")
        self._conn.recv()
        self._lock = threading.Lock()

    @property
    def pid(self) -> int:
        return int(self._proc.pid or 0)

    def _call(self, *msg: Any) -> Any:
        with self._lock:
            self._conn.send(msg)
            return self._conn.recv()

    def add(self, name: str, spec: Spec) -> Watcher:
        self._call("add", name, spec)
        return self

    def wait(
        self,
        name: str,
        keys: Iterable[str] | None = None,
        count: int | None = None,
        timeout: float = 60.0,
    ) -> dict[str, float]:
        """First-seen times of `keys` (or of at least `count` objects); TimeoutError if not."""
        wanted = list(keys) if keys is not None else None
        got = self._call("wait", name, wanted, count, timeout)
        if not got["ok"]:
            missing = [k for k in wanted or [] if k not in got["seen"]]
            raise TimeoutError(
                f"{name}: {len(got['seen'])} seen after {timeout:.0f}s"
                f"{f', missing {missing[:5]}' if missing else ''} {got.get('errors') or ''}"
            )
        return dict(got["seen"])

    def snapshot(self, name: str) -> dict[str, float]:
        return dict(self._call("snapshot", name))

    def close(self) -> None:
        with contextlib.suppress(OSError, EOFError):
            self._call("stop")
        self._proc.join(5)
        if self._proc.is_alive():
            self._proc.kill()

    def __enter__(self) -> Watcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
