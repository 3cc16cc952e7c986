"""Model calls on worker threads, their events handed to the kernel's thread; Ctrl-C cancels them
(``docs/notebook.md``, "Event loops and Ctrl-C"). While jobs run, the ``dispatch_nb`` logger's
warnings made for a job become its :class:`NoteEvent` s ("Retries are quiet").
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import queue
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..cancel import CancelToken
from ..errors import RequestCancelled
from ..types import RetryEvent

__all__ = ["Job", "JobOutcome", "NoteEvent", "run_jobs"]

#: how long to wait for cancelled jobs to wind down after Ctrl-C before abandoning them
ABANDON_AFTER = 0.5
#: the longest wait for an event before ``tick`` is called anyway
IDLE_WAIT = 0.5


@dataclass
class NoteEvent:
    """Another warning the library logged while a job ran; shown with the answer."""

    message: str
    type: str = "note"


class _JobLogCapture(logging.Handler):
    """Routes ``dispatch_nb`` log records made for a job to that job (see the module docstring);
    other records get the handling they would have had without us."""

    def emit(self, record: logging.LogRecord) -> None:
        emit = _JOB_EMIT.get()
        if emit is None:
            if logging.lastResort is not None and not _other_handlers(record.name):
                logging.lastResort.handle(record)
            return
        if getattr(record, "dispatch_nb_event", None) is not None:
            return  # the job's stream has it as an event
        message = record.getMessage()
        if message.startswith("tool ") and " raised " in message:
            return  # the tool's line already shows its error
        # A cell's session is internal to the cell: its random id means nothing to the reader.
        emit(NoteEvent(re.sub(r"^session [0-9a-f]{32}: ", "", message)))


def _other_handlers(name: str) -> bool:
    """True when a handler other than ours would see a record of logger ``name``."""
    logger: logging.Logger | None = logging.getLogger(name)
    while logger is not None:
        if any(not isinstance(h, _JobLogCapture) for h in logger.handlers):
            return True
        if not logger.propagate:
            return False
        logger = logger.parent
    return False

Emit = Callable[[Any], None]
#: the job a log record is made for (set on the job's thread; tasks it starts inherit it)
_JOB_EMIT: contextvars.ContextVar[Emit | None] = contextvars.ContextVar("dispatch_nb_job_emit", default=None)


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


@dataclass
class Job:
    """One call: ``work(emit, cancel)`` runs on a worker thread, calls ``emit(event)`` for each
    event and returns the result (or raises)."""

    name: str
    work: Callable[[Emit, CancelToken], Any]
    cancel: CancelToken = field(default_factory=CancelToken)
    outcome: JobOutcome = field(default_factory=JobOutcome)
    #: True when Ctrl-C gave up waiting for this job (it still ran a tool); its thread's later
    #: result and events are dropped
    abandoned: bool = False


#: what a worker puts in the queue when its job has ended
_DONE = object()


def run_jobs(
    jobs: list[Job],
    on_event: Callable[[int, Any], None],
    *,
    tick: Callable[[], float | None] | None = None,
    on_done: Callable[[int, JobOutcome], None] | None = None,
    on_interrupt: Callable[[], None] | None = None,
) -> list[JobOutcome]:
    """Run ``jobs`` concurrently; call ``on_event(index, event)`` on *this* thread for each event,
    ``on_done(index, outcome)`` as each job ends, and ``tick()`` after events and timeouts (it returns
    the seconds until it wants to be called again; None: when something happens). On Ctrl-C every
    job is cancelled, ``on_interrupt()`` called, and the interrupt re-raised once the jobs ended or,
    after :data:`ABANDON_AFTER` seconds, were abandoned (their outcome: ``RequestCancelled``)."""
    events: queue.SimpleQueue[tuple[int, Any]] = queue.SimpleQueue()
    threads: list[threading.Thread] = []
    lock = threading.Lock()

    for index, job in enumerate(jobs):

        def body(index: int = index, job: Job = job) -> None:
            outcome = job.outcome

            def emit(event: Any) -> None:
                if job.abandoned:
                    return
                if outcome.first_output is None and not isinstance(event, (RetryEvent, NoteEvent)):
                    outcome.first_output = time.monotonic()
                events.put((index, event))

            _JOB_EMIT.set(emit)  # the thread's own context: gone with the thread
            result: Any = None
            error: BaseException | None = None
            try:
                result = job.work(emit, job.cancel)
            except BaseException as exc:  # handed to the main thread, which decides
                error = exc
            with lock:
                if not job.abandoned:
                    outcome.result, outcome.error = result, error
                    outcome.ended = time.monotonic()
                    events.put((index, _DONE))

        job.outcome.started = time.monotonic()
        threads.append(threading.Thread(target=body, name=f"dispatch_nb-{job.name}", daemon=True))

    reported: set[int] = set()  # the jobs whose end on_done was told

    def pump(deadline: float | None) -> None:
        wait = IDLE_WAIT
        while len(reported) < len(jobs):
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                wait = min(wait, left)
            try:
                index, event = events.get(timeout=wait)
            except queue.Empty:
                pass
            else:
                if event is _DONE:
                    reported.add(index)
                    if on_done is not None:
                        on_done(index, jobs[index].outcome)
                elif not jobs[index].abandoned:
                    on_event(index, event)
            nxt = None if tick is None else tick()
            wait = IDLE_WAIT if nxt is None else max(0.0, min(IDLE_WAIT, nxt))

    capture = _JobLogCapture(logging.WARNING)
    logger = logging.getLogger("dispatch_nb")
    logger.addHandler(capture)
    try:
        for thread in threads:
            thread.start()
        pump(None)
    except BaseException as exc:
        # Ctrl-C, or a failure while showing events (a display or widget error): either way the
        # workers must not go on streaming and running tools in the background.
        interrupted = isinstance(exc, KeyboardInterrupt)
        reason = ("interrupted (KeyboardInterrupt)" if interrupted
                  else f"stopped: the cell failed ({type(exc).__name__})")
        for job in jobs:
            job.cancel.cancel(reason)
        try:
            if interrupted and on_interrupt is not None:
                on_interrupt()
            pump(time.monotonic() + ABANDON_AFTER)
        except BaseException:  # a second Ctrl-C or the same failure again: stop waiting
            pass
        now = time.monotonic()
        for index, job in enumerate(jobs):
            if index in reported:
                continue
            with lock:
                if not job.outcome.ended:  # still running (a tool): give up on it
                    job.abandoned = True
                    job.outcome.error = RequestCancelled("interrupted while a tool was running")
                    job.outcome.ended = now
            if on_done is not None:
                with contextlib.suppress(Exception):
                    on_done(index, job.outcome)
        raise
    finally:
        logger.removeHandler(capture)
    return [job.outcome for job in jobs]
