"""A thread pool whose idle threads go: the blocking cloud client's calls run here.

`concurrent.futures.ThreadPoolExecutor` starts a thread per submitted call up to its maximum and
keeps every one until shutdown: after one burst (a 200-job load creates 400 node pools at once)
the operator held 32 idle threads for the rest of its life, each with its stack and its own
malloc arena (glibc gives each thread one, up to 8 per core, and trimming cannot give back an
arena's fragmented pages while the thread lives). Here a thread that found no work for `idle_s`
seconds exits; the next burst starts threads again, which costs microseconds next to a cloud call.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any, ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")

_Item = tuple[Future[Any], Callable[..., Any], tuple[Any, ...], dict[str, Any]]


class IdleExitThreadPool(Executor):
    """At most `max_workers` threads; each exits after `idle_s` seconds without work."""

    def __init__(self, max_workers: int, idle_s: float, thread_name_prefix: str = "pool") -> None:
        if max_workers < 1:
            raise ValueError("max_workers must be at least 1")
        self._max = max_workers
        self._idle_s = idle_s
        self._prefix = thread_name_prefix
        self._work: queue.SimpleQueue[_Item | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads = 0  # alive
        self._idle = 0  # alive and waiting for work
        self._queued = 0  # submitted, not yet taken by a thread
        self._started = 0  # for thread names
        self._alive: set[threading.Thread] = set()
        self._shutdown = False

    @property
    def threads(self) -> int:
        """Threads alive now."""
        with self._lock:
            return self._threads

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        future: Future[T] = Future()
        with self._lock:
            if self._shutdown:
                raise RuntimeError("cannot submit after shutdown")
            self._work.put((future, fn, args, kwargs))
            self._queued += 1
            # Every queued call has an idle thread to take it, or a new one is started.
            if self._queued > self._idle and self._threads < self._max:
                self._threads += 1
                self._idle += 1  # counted idle until it takes its first item
                self._started += 1
                name = f"{self._prefix}_{self._started}"
                thread = threading.Thread(target=self._run, name=name, daemon=True)
                self._alive.add(thread)
                thread.start()
        return future

    def _run(self) -> None:
        while True:
            try:
                item = self._work.get(timeout=self._idle_s)
            except queue.Empty:
                with self._lock:
                    # A call queued since the timeout fired is taken on the next loop; leaving
                    # now could strand it (submit saw this thread idle and started none).
                    if self._queued == 0:
                        self._leave()
                        return
                continue
            if item is None:  # shutdown
                with self._lock:
                    self._leave()
                return
            with self._lock:
                self._queued -= 1
                self._idle -= 1
            future, fn, args, kwargs = item
            if future.set_running_or_notify_cancel():
                try:
                    result = fn(*args, **kwargs)
                except BaseException as exc:
                    future.set_exception(exc)
                else:
                    future.set_result(result)
            del item, future, fn, args, kwargs  # nothing of a call outlives it
            with self._lock:
                self._idle += 1

    def _leave(self) -> None:
        """This (idle) thread exits; called with the lock held."""
        self._threads -= 1
        self._idle -= 1
        self._alive.discard(threading.current_thread())

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._lock:
            self._shutdown = True
            threads = self._threads
            alive = list(self._alive)
        if cancel_futures:
            while True:
                try:
                    item = self._work.get_nowait()
                except queue.Empty:
                    break
                if item is not None:
                    with self._lock:
                        self._queued -= 1
                    item[0].cancel()
        for _ in range(threads):
            self._work.put(None)
        if wait:
            for thread in alive:
                if thread is not threading.current_thread():
                    thread.join()
