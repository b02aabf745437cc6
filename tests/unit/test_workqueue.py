"""The work queue's debounce (issue 23: the gang's operator share): a burst of a job's dependent
events (its nodes registering, its pods restarting) costs one pass, due a quiet moment after the
last event, not up to a whole batch window after it, and never later than the window after the
first. On a clock the test moves (the loop's time), so nothing here depends on how busy the
machine is."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from multislice_operator.controller.workqueue import WorkQueue

T = TypeVar("T")


class Clock:
    """The running loop's time, set by the test (nothing here sleeps on it)."""

    def __init__(self) -> None:
        self.now = 1000.0
        asyncio.get_running_loop().time = lambda: self.now  # type: ignore[method-assign]

    def due(self, q: WorkQueue[str], key: str = "job") -> float | None:
        when = q._due.get(key)
        return None if when is None else round(when - 1000.0, 6)


def run(scenario: Callable[[Clock, WorkQueue[str]], Awaitable[T]]) -> T:
    async def main() -> T:
        return await scenario(Clock(), WorkQueue())

    return asyncio.run(main())


def test_a_burst_is_due_a_quiet_moment_after_its_last_event() -> None:
    async def scenario(clock: Clock, q: WorkQueue[str]) -> float | None:
        for i in range(5):  # events 0.05 s apart
            clock.now = 1000.0 + 0.05 * i
            q.debounce("job", 0.1, 1.0)
        return clock.due(q)

    assert run(scenario) == 0.3  # the last event at 0.2, then 0.1 quiet: not 1.0


async def _passes(clock: Clock, q: WorkQueue[str], events: list[float], until: float) -> list:
    """Events at `events` (seconds), a worker taking the key whenever it is due (at once)."""
    taken: list[float] = []
    t = 0.0
    while t <= until:
        clock.now = 1000.0 + t
        due = clock.due(q)
        if due is not None and due <= t + 1e-9:
            assert await q.get() == "job"
            q.done("job")
            taken.append(round(t, 2))
        if events and events[0] <= t + 1e-9:
            events.pop(0)
            q.debounce("job", 0.1, 0.3)
        t = round(t + 0.01, 2)
    return taken


def test_a_burst_that_does_not_end_is_taken_by_its_window_then_once_after_it() -> None:
    events = [round(0.02 * i, 2) for i in range(26)]  # every 0.02 s until 0.5, windows of 0.3

    async def scenario(clock: Clock, q: WorkQueue[str]) -> list:
        return await _passes(clock, q, events, 1.0)

    # By the window's end (0.3 after the first event), then 0.1 after the last (0.5).
    assert run(scenario) == [0.3, 0.6]


def test_sparse_events_each_get_a_pass_a_quiet_moment_later() -> None:
    async def scenario(clock: Clock, q: WorkQueue[str]) -> list:
        return await _passes(clock, q, [0.0, 0.5], 1.0)

    assert run(scenario) == [0.1, 0.6]


def test_a_sooner_add_is_never_postponed_by_a_debounce() -> None:
    async def scenario(clock: Clock, q: WorkQueue[str]) -> float | None:
        q.add("job")  # the job's own event: now
        q.debounce("job", 0.5, 1.0)
        return clock.due(q)

    assert run(scenario) == 0.0


def test_a_debounce_brings_a_resync_forward() -> None:
    async def scenario(clock: Clock, q: WorkQueue[str]) -> float | None:
        q.add("job", 60)  # the next resync
        q.debounce("job", 0.1, 1.0)
        return clock.due(q)

    assert run(scenario) == 0.1


def test_a_debounce_while_the_key_is_processed_queues_it_again_after() -> None:
    async def scenario(clock: Clock, q: WorkQueue[str]) -> float | None:
        q.add("job")
        await q.get()
        q.debounce("job", 0.1, 1.0)  # an event during the pass
        assert clock.due(q) is None
        q.done("job")
        return clock.due(q)

    assert run(scenario) == 0.1


def test_a_forgotten_key_leaves_no_debounce_behind() -> None:
    async def scenario(clock: Clock, q: WorkQueue[str]) -> WorkQueue[str]:
        q.debounce("job", 0.1, 1.0)
        q.forget("job")
        return q

    q = run(scenario)
    assert not q._due and not q._debounced and not q._bursts


def test_a_burst_through_a_pass_still_costs_one_pass_per_window() -> None:
    """An event during a pass re-queues the key the debounced way: the burst's later events may
    still move it later (bounded by the window). Found by benchmarks/pass_cpu.py: the re-queue went
    through add(), which later events could not push back, so a burst longer than a pass cost a
    pass every quiet interval (0.05 s) instead of one per window."""

    async def scenario(clock: Clock, q: WorkQueue[str]) -> list[float]:
        taken: list[float] = []
        busy_until: float | None = None  # each pass takes 0.05 s
        t = 0.0
        while t <= 2.0:
            clock.now = 1000.0 + t
            if busy_until is not None and t >= busy_until - 1e-9:
                q.done("job")
                busy_until = None
            due = clock.due(q)
            if busy_until is None and due is not None and due <= t + 1e-9:
                assert await q.get() == "job"
                taken.append(round(t, 2))
                busy_until = round(t + 0.05, 2)
            if t <= 1.5:  # an event every 0.01 s for 1.5 s
                q.debounce("job", 0.05, 0.5)
            t = round(t + 0.01, 2)
        return taken

    taken = run(scenario)
    # One pass per 0.5 s window while the burst lasts, then one after it: at most 1.5/0.5 + 2.
    assert len(taken) <= 5, taken
    assert taken[-1] >= 1.5  # the burst's last events were seen
