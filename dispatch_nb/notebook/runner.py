"""Run model calls on worker threads and hand their events to the kernel's thread.

The design (no event loop involved, so nothing depends on — or patches — the user's loop):

* each call (:class:`Job`) runs the *synchronous* adapter / session API on its own daemon thread
  and pushes every event into one queue;
* the kernel's main thread (where the cell runs, where ``display`` and widget updates belong)
  waits on that queue, hands events to the live view and calls ``tick`` when the view asked to
  be woken (coalesced repaints);
* Ctrl-C (``KeyboardInterrupt`` on the main thread, which is where the kernel delivers it)
  cancels every job's :class:`~dispatch_nb.cancel.CancelToken`; the jobs end promptly with
  ``RequestCancelled`` carrying the partial answer, and :func:`run_jobs` re-raises the interrupt
  once they did, so the caller can show what arrived.

This works the same inside ipykernel's running asyncio loop, in terminal IPython and after the
user's own ``await`` cells. Compare mode is simply several jobs.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..cancel import CancelToken

__all__ = ["Job", "JobOutcome", "run_jobs"]

#: how long to wait for cancelled jobs to wind down after Ctrl-C
CANCEL_GRACE = 5.0

Emit = Callable[[Any], None]


@dataclass
class JobOutcome:
    """How a job ended: ``result`` (whatever ``work`` returned) or ``error``; timings in seconds."""

    result: Any = None
    error: BaseException | None = None
    started: float = 0.0
    first_output: float | None = None
    ended: float = 0.0

    @property
    def latency(self) -> float:
        """Seconds from start to end."""
        return max(0.0, self.ended - self.started)

    @property
    def time_to_first_output(self) -> float | None:
        """Seconds from start to the first event, when there was one."""
        return None if self.first_output is None else self.first_output - self.started


@dataclass
class Job:
    """One call: ``work(emit, cancel)`` runs on a worker thread, calls ``emit(event)`` for each
    event and returns the result (or raises)."""

    name: str
    work: Callable[[Emit, CancelToken], Any]
    cancel: CancelToken = field(default_factory=CancelToken)
    outcome: JobOutcome = field(default_factory=JobOutcome)


class _Done:
    __slots__ = ()


_DONE = _Done()


def run_jobs(
    jobs: list[Job],
    on_event: Callable[[int, Any], None],
    *,
    tick: Callable[[], float | None] | None = None,
    on_done: Callable[[int, JobOutcome], None] | None = None,
    idle_wait: float = 0.5,
) -> list[JobOutcome]:
    """Run ``jobs`` concurrently; call ``on_event(index, event)`` on *this* thread for each event.

    ``tick()`` is called after events and timeouts; it returns the seconds until it wants to be
    called again (None: only when something happens). ``on_done(index, outcome)`` is called as each
    job ends. On ``KeyboardInterrupt`` every job is cancelled, the jobs get up to
    :data:`CANCEL_GRACE` seconds to end (their outcomes then hold ``RequestCancelled`` with the
    partial answer), and the interrupt is re-raised.
    """
    events: queue.SimpleQueue[tuple[int, Any]] = queue.SimpleQueue()
    threads: list[threading.Thread] = []

    for index, job in enumerate(jobs):

        def body(index: int = index, job: Job = job) -> None:
            outcome = job.outcome

            def emit(event: Any) -> None:
                if outcome.first_output is None:
                    outcome.first_output = time.monotonic()
                events.put((index, event))

            try:
                outcome.result = job.work(emit, job.cancel)
            except BaseException as exc:  # handed to the main thread, which decides
                outcome.error = exc
            finally:
                outcome.ended = time.monotonic()
                events.put((index, _DONE))

        job.outcome.started = time.monotonic()
        thread = threading.Thread(target=body, name=f"dispatch_nb-{job.name}", daemon=True)
        threads.append(thread)

    for thread in threads:
        thread.start()

    pending = len(jobs)

    def pump(deadline: float | None) -> None:
        nonlocal pending
        wait = idle_wait
        while pending:
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                wait = min(wait, left)
            try:
                index, event = events.get(timeout=wait)
            except queue.Empty:
                event = None
            else:
                if event is _DONE:
                    pending -= 1
                    if on_done is not None:
                        on_done(index, jobs[index].outcome)
                else:
                    on_event(index, event)
            if tick is not None:
                nxt = tick()
                wait = idle_wait if nxt is None else max(0.0, min(idle_wait, nxt))
            else:
                wait = idle_wait

    try:
        pump(None)
    except BaseException as exc:
        # Ctrl-C, or a failure while showing events (a display or widget error): either way the
        # workers must not go on streaming and running tools in the background.
        reason = (
            "interrupted (KeyboardInterrupt)"
            if isinstance(exc, KeyboardInterrupt)
            else f"stopped: the cell failed ({type(exc).__name__})"
        )
        for job in jobs:
            job.cancel.cancel(reason)
        try:
            pump(time.monotonic() + CANCEL_GRACE)
        except BaseException:  # a second Ctrl-C or the same failure again: stop waiting
            pass
        raise
    return [job.outcome for job in jobs]
