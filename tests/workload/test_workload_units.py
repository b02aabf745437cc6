"""Unit tests without training: data pipeline, termination message, watchdog, pod-info
annotations, checkpoint-request agreement and the pod PATCH (no JAX backend except for data)."""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from multislice_workload import data, kube, podinfo, termination
from multislice_workload.watchdog import Watchdog

# --- Data. ------------------------------------------------------------------------------------


def test_corpus_is_the_stdlib_source_without_tests_or_packages() -> None:
    files = data.corpus_files()
    root = data.stdlib_root()
    relative = [f.relative_to(root).as_posix() for f in files]
    assert "os.py" in relative and "json/decoder.py" in relative
    assert relative == sorted(relative)
    assert not [r for r in relative if set(r.split("/")[:-1]) & data.SKIPPED_DIRS]


def test_byte_windows_are_file_bytes(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_bytes(b"0123456789")  # two windows of 4, remainder dropped
    (tmp_path / "b.py").write_bytes(b"ab")  # too short: no window
    (tmp_path / "c.py").write_bytes(b"wxyz")
    source = data.ByteWindows(sorted(tmp_path.glob("*.py")), 4, tmp_path)
    assert len(source) == 3
    assert [bytes(source[i].astype(np.uint8)) for i in range(3)] == [b"0123", b"4567", b"wxyz"]
    assert source[3].dtype == np.int32 and bytes(source[3].astype(np.uint8)) == b"0123"


# --- Termination message. ---------------------------------------------------------------------


def test_termination_message_fields_and_size_limit() -> None:
    status = termination.RunStatus(
        step=123, checkpoint_step=120, checkpoint_request={"id": "1733050000", "step": 120}
    )
    text = termination.render(75, "no step for 312 s", status)
    assert json.loads(text) == {
        "v": 1,
        "reason": "hang",
        "exitCode": 75,
        "step": 123,
        "checkpointStep": 120,
        "checkpointRequest": {"id": "1733050000", "step": 120},
        "message": "no step for 312 s",
    }
    huge = termination.render(1, 'x"\\\n' * 5000, termination.RunStatus())
    record = json.loads(huge)
    assert len(huge.encode()) <= termination.MAX_BYTES
    assert record["reason"] == "crash" and "checkpointRequest" not in record
    assert record["message"].startswith('x"\\\n')
    assert len(huge.encode()) > termination.MAX_BYTES - 8  # cut as little as possible


def test_termination_path_is_the_env_then_the_kubelet_file(tmp_path: Path) -> None:
    target = tmp_path / "sub" / "msg"
    env = {termination.TERMINATION_LOG_ENV: str(target)}
    assert termination.write(0, "done", environ=env, status=termination.RunStatus(step=5)) == target
    assert json.loads(target.read_text())["step"] == 5
    blocked = tmp_path / "file"
    blocked.write_text("")
    env = {termination.TERMINATION_LOG_ENV: str(blocked / "x")}  # parent is a file: no raise
    assert termination.write(1, "crash", environ=env) is None


# --- Watchdog. --------------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def watchdog(clock: Clock, hangs: list[str], **kwargs: float) -> Watchdog:
    options = {"factor": 10.0, "warmup_steps": 2, "timeout_s": 600.0, "min_s": 5.0, **kwargs}
    return Watchdog(
        options["factor"],
        int(options["warmup_steps"]),
        options["timeout_s"],
        options["min_s"],
        on_hang=hangs.append,
        clock=clock,
    )


def test_watchdog_bound_is_the_cap_until_warm_then_k_times_the_median() -> None:
    clock, hangs = Clock(), []
    dog = watchdog(clock, hangs)
    assert dog.bound() == 600
    for step, seconds in enumerate([30.0, 20.0, 1.0, 2.0, 3.0], start=1):
        dog.step_done(step, seconds)  # the first two are warm-up (compile, restore)
    assert dog.bound() == 20.0  # 10 x median(1, 2, 3)
    with dog.long_phase():
        assert dog.bound() == 600  # a checkpoint save: only the cap
    dog.step_done(6, 0.01)
    dog.step_done(7, 0.01)
    assert dog.bound() == 10.0  # 10 x median(1, 2, 3, 0.01, 0.01) = 10 x 1
    dog.step_done(8, 0.01)
    dog.step_done(9, 0.01)
    assert dog.bound() == 5.0  # 10 x 0.01 is below the floor


def test_watchdog_fires_once_the_bound_has_passed() -> None:
    clock, hangs = Clock(), []
    dog = watchdog(clock, hangs, warmup_steps=0, min_s=0)
    dog.step_done(1, 1.0)
    clock.now = 9.9
    assert not dog.check() and not hangs
    clock.now = 10.1
    assert dog.check()
    assert hangs == ["no training step completed for 10 s (bound 10 s); last step 1"]


def test_watchdog_disabled_by_a_zero_cap() -> None:
    dog = watchdog(Clock(), [], timeout_s=0)
    assert not dog.enabled
    dog.start()  # no thread
    dog.stop()


# --- Pod info and checkpoint requests. ----------------------------------------------------------


def test_annotations_file_parses_go_quoting() -> None:
    text = (
        'kubectl.kubernetes.io/last-applied-configuration="{\\"a\\":1}\\n"\n'
        'multislice.dev/checkpoint-request="maint-1733050000"\n'
        "broken line\n"
        'multislice.dev/checkpoint-saved="{\\"id\\": \\"x\\", \\"step\\": 3}"\n'
    )
    parsed = podinfo.parse_annotations(text)
    assert parsed[podinfo.REQUEST_ANNOTATION] == "maint-1733050000"
    assert json.loads(parsed[podinfo.SAVED_ANNOTATION]) == {"id": "x", "step": 3}
    assert parsed["kubectl.kubernetes.io/last-applied-configuration"] == '{"a":1}\n'
    assert podinfo.parse_annotations(podinfo.format_annotations(parsed)) == parsed


def test_watcher_rereads_only_when_due_and_changed(tmp_path: Path) -> None:
    clock = Clock()
    watcher = podinfo.AnnotationWatcher(str(tmp_path), poll_s=2.0, clock=clock)
    assert watcher.requested_id() is None  # no file yet
    path = tmp_path / podinfo.ANNOTATIONS_FILE
    path.write_text(podinfo.format_annotations({podinfo.REQUEST_ANNOTATION: "one"}))
    assert watcher.requested_id() is None  # not due: the last poll was less than 2 s ago
    clock.now = 2.0
    assert watcher.requested_id() == "one"
    path.write_text(podinfo.format_annotations({podinfo.REQUEST_ANNOTATION: "x" * 64}))
    os.utime(path, ns=(10**18, 10**18))  # a new mtime, whatever the filesystem's resolution
    clock.now = 4.0
    assert watcher.requested_id() is None  # longer than 63 characters: not a valid id
    assert podinfo.AnnotationWatcher(None).requested_id() is None


class FixedWatcher(podinfo.AnnotationWatcher):
    def __init__(self, value: str | None) -> None:
        super().__init__(None)
        self.value = value

    def requested_id(self) -> str | None:
        return self.value


def test_requests_agree_on_the_first_pending_id_of_any_process() -> None:
    others: list[str] = ["", "", ""]

    def gather(own: str) -> Sequence[str]:
        return [own, *others]  # this process is process 0

    requests = podinfo.CheckpointRequests(FixedWatcher(None), every_steps=5, gather=gather)
    assert [requests.due(s) for s in (4, 5, 10)] == [False, True, True]
    assert requests.agree() is None
    others[2] = "late-host-saw-it"  # only process 3's kubelet has refreshed
    assert requests.agree() == "late-host-saw-it"
    requests.served = "late-host-saw-it"
    assert requests.agree() is None  # served: not again, though process 3 still shows it
    requests.watcher = FixedWatcher("newer")
    assert requests.agree() == "newer"


# --- Acknowledgement PATCH. -------------------------------------------------------------------


def service_account(tmp_path: Path) -> Path:
    (tmp_path / "token").write_text("sekret\n")
    return tmp_path


POD_ENV = {
    "KUBERNETES_SERVICE_HOST": "10.0.0.1",
    "KUBERNETES_SERVICE_PORT": "443",
    kube.POD_NAME_ENV: "job-slice-0-0-abcde",
    kube.POD_NAMESPACE_ENV: "team",
}


def test_patch_request_is_a_merge_patch_of_the_pods_annotation(tmp_path: Path) -> None:
    target, why = kube.in_cluster_target(POD_ENV, service_account(tmp_path))
    assert target is not None and why == ""
    saved = json.dumps({"id": "maint-1", "step": 120})
    request = kube.annotation_patch(target, {podinfo.SAVED_ANNOTATION: saved})
    assert request.get_method() == "PATCH"
    assert (
        request.full_url == "https://10.0.0.1:443/api/v1/namespaces/team/pods/job-slice-0-0-abcde"
    )
    assert request.get_header("Content-type") == "application/merge-patch+json"
    assert request.get_header("Authorization") == "Bearer sekret"
    assert request.data is not None
    body = json.loads(request.data)
    assert body == {"metadata": {"annotations": {"multislice.dev/checkpoint-saved": saved}}}
    assert json.loads(body["metadata"]["annotations"][podinfo.SAVED_ANNOTATION])["step"] == 120


@pytest.mark.parametrize(
    ("drop", "why"),
    [
        ("KUBERNETES_SERVICE_HOST", "not in a cluster"),
        (kube.POD_NAME_ENV, "MULTISLICE_POD_NAME / MULTISLICE_POD_NAMESPACE not set"),
        ("token", "no service-account token"),
    ],
)
def test_no_credentials_means_no_target(tmp_path: Path, drop: str, why: str) -> None:
    account = service_account(tmp_path)
    if drop == "token":
        (account / "token").unlink()
    environ = {k: v for k, v in POD_ENV.items() if k != drop}
    target, reason = kube.in_cluster_target(environ, account)
    assert target is None and why in reason


def test_annotator_without_credentials_warns_once(capsys: pytest.CaptureFixture[str]) -> None:
    annotator = kube.Annotator(None, "not in a cluster (KUBERNETES_SERVICE_HOST is not set)")
    assert annotator.annotate({"a": "b"}) is None
    assert annotator.annotate({"a": "c"}) is None
    events = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [e["event"] for e in events] == ["warning"]
    assert "acknowledgement skipped: not in a cluster" in events[0]["message"]


@pytest.fixture
def api_server() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """A plain-HTTP stand-in for the API server that records each PATCH."""
    seen: list[dict[str, Any]] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_PATCH(self) -> None:
            length = int(self.headers["Content-Length"])
            seen.append(
                {
                    "path": self.path,
                    "type": self.headers["Content-Type"],
                    "auth": self.headers["Authorization"],
                    "body": json.loads(self.rfile.read(length)),
                }
            )
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}", seen
    server.shutdown()
    thread.join()


def test_annotator_patches_the_pod(
    api_server: tuple[str, list[dict[str, Any]]], capsys: pytest.CaptureFixture[str]
) -> None:
    url, seen = api_server
    target = kube.PodTarget(url, "sekret", None, "team", "job-slice-0-0-abcde")
    annotator = kube.Annotator(target)
    thread = annotator.annotate({podinfo.SAVED_ANNOTATION: '{"id": "x", "step": 3}'})
    assert thread is not None
    annotator.join()
    assert seen == [
        {
            "path": "/api/v1/namespaces/team/pods/job-slice-0-0-abcde",
            "type": "application/merge-patch+json",
            "auth": "Bearer sekret",
            "body": {
                "metadata": {"annotations": {podinfo.SAVED_ANNOTATION: '{"id": "x", "step": 3}'}}
            },
        }
    ]
    events = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(e["event"], e["status"]) for e in events] == [("pod_annotated", 200)]


def test_termination_message_is_replaced_whole_or_not_at_all(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A process stopped mid-write left an empty message (seen in the local launcher): the text is
    # written aside and renamed into place, so a failed write keeps the previous message intact.
    path = tmp_path / "termination-log"
    env = {termination.TERMINATION_LOG_ENV: str(path)}
    assert termination.write(78, "first", environ=env) == path
    before = path.read_text()

    def refuse(*_: object) -> None:
        raise OSError("stopped mid-write")

    monkeypatch.setattr(termination.os, "replace", refuse)
    assert termination.write(75, "second", environ=env) is None
    assert path.read_text() == before and json.loads(before)["exitCode"] == 78
    assert [p.name for p in tmp_path.iterdir()] == ["termination-log"]  # nothing left aside


@pytest.mark.parametrize("dev", ["writable", "read-only"])
def test_termination_message_reaches_a_file_the_kubelet_bind_mounted(
    tmp_path: Path, dev: str
) -> None:
    # The kubelet bind-mounts the pod's termination-log file onto /dev/termination-log, in a
    # /dev the program (uid 10001) may not write; nothing can be renamed onto a mount point
    # (EBUSY) and nothing written beside it: no message was ever written in a real pod (a
    # finished container's was empty; found on real nodes). Here the same mounts in a mount
    # namespace of the test's own (in a user namespace: no root needed; a read-only /dev
    # stands for root's), and the message read back from the kubelet's side.
    kubelet_side, target = tmp_path / "kubelet-file", tmp_path / "dev" / "termination-log"
    target.parent.mkdir()
    kubelet_side.touch()
    program = (
        "import os, sys; from multislice_workload import termination; "
        f"wrote = termination.write(0, 'done', environ={{'{termination.TERMINATION_LOG_ENV}': "
        f"'{target}'}}); sys.exit(0 if wrote and os.listdir('{target.parent}') == "
        "['termination-log'] else 1)"
    )
    remount = f'mount -o remount,ro "{target.parent}"; ' if dev == "read-only" else ""
    script = (
        f'mount -t tmpfs tmpfs "{target.parent}"; touch "{target}"; '
        f'mount --bind "{kubelet_side}" "{target}"; {remount}'
        f'exec "{sys.executable}" -c "{program}"'
    )
    done = subprocess.run(
        ["unshare", "--user", "--map-root-user", "--mount", "--propagation", "private",
         "sh", "-ec", script],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    message = json.loads(kubelet_side.read_text())
    assert (message["exitCode"], message["message"], message["reason"]) == (0, "done", "finished")
