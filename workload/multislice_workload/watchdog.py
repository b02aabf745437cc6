"""Hang watchdog: a thread that ends the process when no training step completes in time.

A hung collective (a peer that stopped answering, a wedged DCN link) blocks every process of the
job inside the runtime, where no exception is ever raised; the chips idle until someone notices.
The bound is ``hang_factor`` x the median step time once ``hang_warmup_steps`` steps have run,
never more than ``hang_timeout_s`` (also the bound during warm-up and long phases such as a
checkpoint save) and never less than ``hang_min_s``. On a hang: every thread's stack to stderr
(`faulthandler`), a ``hang`` log event, the termination message, exit 75 (docs/environment.md
section 4).
"""

from __future__ import annotations

import collections
import contextlib
import faulthandler
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator

from multislice_workload import logs, termination
from multislice_workload.exitcodes import EXIT_HANG

_SAMPLES = 100  # step times kept for the median


class Watchdog:
    def __init__(
        self,
        factor: float,
        warmup_steps: int,
        timeout_s: float,
        min_s: float,
        *,
        on_hang: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.factor = factor
        self.warmup_steps = warmup_steps
        self.timeout_s = timeout_s
        self.min_s = min_s
        self._on_hang = on_hang or hang_exit
        self._clock = clock
        self._lock = threading.Lock()
        self._durations: collections.deque[float] = collections.deque(maxlen=_SAMPLES)
        self._steps_seen = 0
        self._last_step: int | None = None
        self._last_progress = clock()
        self._long_phases = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def enabled(self) -> bool:
        return self.timeout_s > 0

    def bound(self) -> float:
        """Seconds without progress that count as a hang, now."""
        with self._lock:
            if self._long_phases or not self._durations:
                return self.timeout_s
            typical = self.factor * statistics.median(self._durations)
        return min(self.timeout_s, max(self.min_s, typical))

    def step_done(self, step: int, seconds: float) -> None:
        """A step completed (its result is on the host) after `seconds` of work."""
        with self._lock:
            self._steps_seen += 1
            if self._steps_seen > self.warmup_steps:
                self._durations.append(seconds)
            self._last_step = step
            self._last_progress = self._clock()

    @contextlib.contextmanager
    def long_phase(self) -> Iterator[None]:
        """A phase that is not a step (checkpoint save, restore): only the absolute cap holds."""
        with self._lock:
            self._long_phases += 1
        try:
            yield
        finally:
            with self._lock:
                self._long_phases -= 1
                self._last_progress = self._clock()

    def idle_seconds(self) -> float:
        with self._lock:
            return self._clock() - self._last_progress

    def check(self) -> bool:
        """True (and the hang handler called) when the bound has passed."""
        bound = self.bound()
        idle = self.idle_seconds()
        if idle <= bound:
            return False
        with self._lock:
            last = self._last_step
        self._on_hang(
            f"no training step completed for {idle:.0f} s (bound {bound:.0f} s); last step {last}"
        )
        return True

    def start(self) -> None:
        if not self.enabled or self._thread is not None:
            return
        with self._lock:
            self._last_progress = self._clock()
        self._thread = threading.Thread(target=self._run, name="hang-watchdog", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def _run(self) -> None:
        while not self._stop.wait(min(1.0, max(0.05, self.bound() / 20))):
            if self.check():
                return


def hang_exit(message: str) -> None:
    """Report the hang and end the process now; the stuck main thread never resumes."""
    sys.stderr.write(f"hang watchdog: {message}; stacks of every thread follow\n")
    faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
    logs.emit(
        "hang",
        message=message,
        step=termination.STATUS.step,
        checkpoint_step=termination.STATUS.checkpoint_step,
        exit_code=EXIT_HANG,
    )
    termination.write(EXIT_HANG, message)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(EXIT_HANG)
