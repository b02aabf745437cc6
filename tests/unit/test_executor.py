"""The cloud client's thread pool: threads up to the limit under a burst, none once it is idle."""

from __future__ import annotations

import threading
import time

import pytest

from multislice_operator.provisioning.executor import IdleExitThreadPool


def wait_until(check: object, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_a_burst_gets_up_to_max_threads_and_they_go_once_idle() -> None:
    pool = IdleExitThreadPool(4, idle_s=0.2, thread_name_prefix="t-burst")
    gate = threading.Event()

    def held(i: int) -> int:
        gate.wait(5)
        return i

    futures = [pool.submit(held, i) for i in range(10)]
    wait_until(lambda: pool.threads == 4)
    time.sleep(0.05)
    assert pool.threads == 4  # never more than the limit, however many are queued
    gate.set()
    assert [f.result(5) for f in futures] == list(range(10))
    wait_until(lambda: pool.threads == 0)
    assert not [t for t in threading.enumerate() if t.name.startswith("t-burst")]
    # The next burst starts threads again.
    assert pool.submit(lambda: 7).result(5) == 7
    pool.shutdown()
    assert pool.threads == 0


def test_sequential_calls_reuse_one_idle_thread() -> None:
    pool = IdleExitThreadPool(8, idle_s=5.0, thread_name_prefix="t-seq")
    names = {pool.submit(lambda: threading.current_thread().name).result(5) for _ in range(20)}
    assert len(names) == 1 and pool.threads == 1
    pool.shutdown()
    assert pool.threads == 0


def test_no_call_is_stranded_when_a_thread_times_out_as_it_is_submitted() -> None:
    """Submissions timed to meet threads leaving: every one still runs."""
    pool = IdleExitThreadPool(2, idle_s=0.001, thread_name_prefix="t-race")
    for i in range(300):
        assert pool.submit(int, i).result(5) == i
        if i % 7 == 0:
            time.sleep(0.002)  # let the threads time out
    pool.shutdown()


def test_errors_reach_the_caller_and_shutdown_refuses_more() -> None:
    pool = IdleExitThreadPool(2, idle_s=1.0, thread_name_prefix="t-err")

    def boom() -> None:
        raise ValueError("no")

    with pytest.raises(ValueError, match="no"):
        pool.submit(boom).result(5)
    pool.shutdown()
    with pytest.raises(RuntimeError):
        pool.submit(lambda: 1)


def test_shutdown_cancels_what_no_thread_took() -> None:
    pool = IdleExitThreadPool(1, idle_s=1.0, thread_name_prefix="t-cancel")
    gate = threading.Event()
    running = pool.submit(gate.wait, 5)
    wait_until(lambda: running.running())
    queued = pool.submit(lambda: 1)
    pool.shutdown(wait=False, cancel_futures=True)
    assert queued.cancelled()
    gate.set()
    assert running.result(5) is True
    wait_until(lambda: pool.threads == 0)


def test_max_workers_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_workers"):
        IdleExitThreadPool(0, idle_s=1.0)
