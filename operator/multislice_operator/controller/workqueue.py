"""A work queue of job keys, as client-go's: deduplicated, delayed adds, one worker per key.

Watch events add a key now; a reconcile's requeue adds it later; a burst of a job's dependent
events debounces it (one pass a quiet moment after the burst's last event, by a deadline). A key is
never processed by two workers at once: added while in flight, it is marked dirty and goes back in
line when the worker is done. Memory is one entry per job, whatever the number of events.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
from collections.abc import Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


class WorkQueue(Generic[K]):
    def __init__(self) -> None:
        self._due: dict[K, float] = {}  # queued keys -> when they may be processed
        self._heap: list[tuple[float, int, K]] = []
        self._seq = itertools.count()
        self._processing: set[K] = set()
        self._dirty: dict[K, float] = {}  # added while processing -> earliest due time
        self._dirty_debounced: set[K] = set()  # ... and that due time is debounce()'s to move
        self._debounced: dict[K, float] = {}  # the due time debounce() set (it may move it later)
        self._bursts: dict[K, float] = {}  # when the first debounce since the key was taken came
        self._changed = asyncio.Event()
        self._closed = False

    def __len__(self) -> int:
        return len(self._due)

    def due(self) -> int:
        """Keys due now and waiting for a worker (client-go's workqueue_depth: delayed adds
        are not counted until their time comes)."""
        now = asyncio.get_running_loop().time()
        return sum(1 for when in self._due.values() if when <= now)

    def add(self, key: K, delay: float = 0.0) -> None:
        """Process `key` after `delay` seconds, or sooner if it is already due sooner."""
        if self._closed:
            return
        due = asyncio.get_running_loop().time() + max(delay, 0.0)
        if key in self._processing:
            if due < self._dirty.get(key, float("inf")):
                self._dirty[key] = due
                self._dirty_debounced.discard(key)
            return
        if key in self._due and self._due[key] <= due:
            return
        self._due[key] = due
        heapq.heappush(self._heap, (due, next(self._seq), key))
        self._changed.set()

    def debounce(self, key: K, quiet: float, window: float) -> None:
        """Process `key` once `quiet` seconds passed with no other debounce of it, and at the
        latest `window` seconds after the first debounce since it was last taken: a burst of
        events costs one pass, right after its last event (or one per window while it lasts).
        Unlike add(), this may move a due time later, but only one it set itself: a sooner
        add() (the job's own event, a requeue) is kept."""
        if self._closed:
            return
        now = asyncio.get_running_loop().time()
        first = self._bursts.setdefault(key, now)
        due = max(now, min(now + quiet, first + window))
        if key in self._processing:
            # Remembered as debounced, so that when the pass ends the burst's later events may
            # still move it (done() below); a sooner add() while processing is kept.
            dirty = self._dirty.get(key)
            if dirty is None or key in self._dirty_debounced or due < dirty:
                self._dirty[key] = due
                self._dirty_debounced.add(key)
            return
        self._schedule_debounced(key, due)

    def _schedule_debounced(self, key: K, due: float) -> None:
        current = self._due.get(key)
        if current is not None and current <= due and self._debounced.get(key) != current:
            return
        if current == due:
            return
        self._due[key] = self._debounced[key] = due
        heapq.heappush(self._heap, (due, next(self._seq), key))
        self._changed.set()

    def forget(self, key: K) -> None:
        """The job is gone: drop any pending work for it. Its heap entries are skipped when they
        come up, which may be a resync away: when they outnumber the live ones (a burst of
        deletions) the heap is rebuilt, so that the deleted keys are not held until then."""
        self._due.pop(key, None)
        self._dirty.pop(key, None)
        self._dirty_debounced.discard(key)
        self._debounced.pop(key, None)
        self._bursts.pop(key, None)
        if len(self._heap) > 2 * len(self._due):
            self._heap = [e for e in self._heap if self._due.get(e[2]) == e[0]]
            heapq.heapify(self._heap)

    async def get(self) -> K:
        """The next due key; the caller must call done(key) afterwards."""
        loop = asyncio.get_running_loop()
        while True:
            while self._heap:
                due, _, key = self._heap[0]
                if self._due.get(key) != due:  # superseded by an earlier add, or forgotten
                    heapq.heappop(self._heap)
                    continue
                wait = due - loop.time()
                if wait > 0:
                    break
                heapq.heappop(self._heap)
                del self._due[key]
                self._debounced.pop(key, None)
                self._bursts.pop(key, None)
                self._processing.add(key)
                return key
            if self._closed:
                raise asyncio.CancelledError
            self._changed.clear()
            timeout = (self._heap[0][0] - loop.time()) if self._heap else None
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), timeout)

    def done(self, key: K) -> None:
        self._processing.discard(key)
        due = self._dirty.pop(key, None)
        if due is None:
            return
        if key in self._dirty_debounced:  # the burst goes on: its next events may move it later
            self._dirty_debounced.discard(key)
            if not self._closed:
                self._schedule_debounced(key, max(due, asyncio.get_running_loop().time()))
            return
        self.add(key, due - asyncio.get_running_loop().time())

    def close(self) -> None:
        self._closed = True
        self._changed.set()
