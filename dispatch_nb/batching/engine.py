"""The batch engine: rows through one adapter on one event loop, adaptively concurrent.

:meth:`.BatchPlan.rows` fills and keys the rows, skipping those the checkpoint answered;
:class:`RowRunner` runs the rest, one task per row in flight. Retries are the batch's (each call
has ``max_retries=0``, so every 429 reaches the limiter). See docs/batch.md, "Rate limits,
retries, deadlines" and "Stopping".
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import logging
import time
from collections.abc import Iterator
from dataclasses import KW_ONLY, dataclass
from typing import Any

from ..adapter import Adapter, _Call, backoff_delay
from ..budget import Budget
from ..cache import CachedAdapter
from ..cancel import CancelToken
from ..errors import (
    APIConnectionError,
    APITimeoutError,
    BudgetExceededError,
    DispatchError,
    RateLimitError,
    RequestCancelled,
    RequestError,
)
from ..registry import find_descriptor
from ..types import Message, Response, Usage, as_messages
from ..validation import clean_messages
from .budget import RowBudget
from .checkpoint import Checkpoint
from .limiter import AdaptiveLimiter
from .result import BatchResult, RowOrigin, is_not_sent, mark_not_sent, not_sent, stops_batch
from .rows import RowCall

__all__ = ["BatchSettings", "Pending", "RowRunner", "ask", "prepare_call", "resume", "row_call"]

log = logging.getLogger("dispatch_nb")

DEFAULT_MAX_RETRIES = 6
#: attempts in a row that could not connect, before any row was answered, that stop the batch
UNREACHABLE_AFTER = 3


@dataclass
class BatchSettings:
    """How rows are run (the same locally and on every Dask worker)."""

    concurrency: int = 16
    max_retries: int = DEFAULT_MAX_RETRIES
    timeout: float | None = None

    def __post_init__(self) -> None:
        if isinstance(self.max_retries, bool) or not isinstance(self.max_retries, int) \
                or self.max_retries < 0:
            raise ValueError(f"max_retries must be an integer ≥ 0, not {self.max_retries!r}")
        if self.timeout is not None and not self.timeout > 0:
            raise ValueError(f"timeout must be a positive number of seconds, not {self.timeout!r}")
        AdaptiveLimiter(self.concurrency)  # validates concurrency


@dataclass
class Pending:
    """A row to send: its position in the input, its prompt and its key (``row``: its position
    in the whole batch, when this input is some of its rows: a retry's)."""

    position: int
    messages: str | list[Message]
    key: str
    row: int | None = None

    @property
    def number(self) -> int:
        """The row's number in the whole batch: what its label, errors and checkpoint line say."""
        return self.position if self.row is None else self.row


# -- one row's call -------------------------------------------------------------------------------
def prepare_call(adapter: Adapter, messages: str | list[Message], call: RowCall, *,
                 stream: bool, **options: Any) -> _Call:
    """The first row's call, checked by the adapter before any row is sent: it raises the
    adapter's own TypeError / ValueError for an option it rejects (or a bad ``output=`` schema),
    which would otherwise fail every row alike. Every row's call is this one with its own prompt
    (:func:`row_call`), so a batch checks its tools and options once, not once per row."""
    prepared = adapter._prepare(messages, system=call.system, tools=call.tools, stream=stream,
                                **{**call.options, **options})
    if prepared.output is None:
        return prepared
    from ..structured import as_output

    output = as_output(prepared.output)
    return prepared._replace(request=dataclasses.replace(prepared.request, output=output),
                             output=output)


def row_call(prepared: _Call, messages: str | list[Message], *, timeout: float | None = None,
             cancel: CancelToken | None = None) -> _Call:
    """``prepared`` (:func:`prepare_call`) for one row's prompt, lone surrogates replaced as
    ``chat`` replaces them."""
    request = dataclasses.replace(prepared.request, messages=as_messages(clean_messages(messages)))
    if not request.messages:
        raise RequestError("there is nothing to send: the template gave no messages")
    return prepared._replace(request=request, timeout=timeout, cancel=cancel)


async def ask(
    adapter: Adapter,
    messages: str | list[Message],
    call: RowCall,
    prepared: _Call,
    *,
    timeout: float | None,
    cancel: CancelToken,
    budget: Budget | None = None,
) -> tuple[Response, Usage, int]:
    """One attempt at one row: ``(response, usage, model calls)``. Without Python tools a single
    call, ``prepared`` with the row's prompt (streamed only with ``call.stream``: nobody watches a
    row's tokens arrive); with them a fresh :class:`~dispatch_nb.session.Session` runs the tool
    loop, keeping ``budget``. ``call.options`` pass straight through (``max_tokens``,
    ``temperature``, ``output``...)."""
    if call.runs_tools:
        from ..session import Session

        session = Session(adapter, system=call.system, tools=call.tools, budget=budget)
        response = await session.asend(messages, stream=call.stream, timeout=timeout,
                                       cancel=cancel, max_retries=0, **call.options)
        calls = sum(1 for m in session.history if m.role == "assistant")
        return response, session.usage, max(1, calls)
    async with adapter._open(row_call(prepared, messages, timeout=timeout, cancel=cancel),
                             asynchronous=True) as deltas:
        async for _delta in deltas:
            pass
    response = deltas.response
    return response, response.usage, 1


# -- resuming rows ------------------------------------------------------------------------------
def resume(result: BatchResult, position: int, answer: tuple[Response, Usage, float] | None,
           origin: int = RowOrigin.CHECKPOINT) -> bool:
    """Put ``answer``, a checkpoint's (:meth:`.Checkpoint.answer`), in ``result`` as row
    ``position``'s; False when there is none (the row is to be sent)."""
    if answer is None:
        return False
    response, usage, latency = answer
    result._set(position, response, usage=usage, latency=latency, attempts=0, origin=origin)
    result._stats.resumed += 1
    result._stats.count(response, origin, usage)
    return True


# -- running rows ---------------------------------------------------------------------------------
@dataclass(eq=False, repr=False)
class RowRunner:
    """Runs :class:`Pending` rows through ``adapter`` with adaptive concurrency, retries, a
    per-row deadline and one cancel token; each finished row goes to ``result`` and the
    checkpoint at once. An error :func:`~dispatch_nb.batching.result.stops_batch` stops it
    (``result.stopped_by``), and so does a server that cannot be reached before any row was
    answered (:meth:`_unreachable`)."""

    adapter: Adapter
    call: RowCall
    settings: BatchSettings
    _: KW_ONLY
    result: BatchResult
    cancel: CancelToken
    #: where each answered row is recorded the moment it finishes, if anywhere
    checkpoint: Checkpoint | None
    #: ``budget=``: asked before each attempt, told how it ended (batching/budget.py)
    budget: RowBudget | None = None
    #: a row was answered (on Dask: by an earlier partition): the server can be reached, so a
    #: failed connection is retried, never a reason to stop
    answered: bool = False

    def __post_init__(self) -> None:
        self.stats = self.result._stats
        self.limiter = AdaptiveLimiter(self.settings.concurrency)
        #: set when the batch stops sending (cancelled, or an error every row would get)
        self._stopped = asyncio.Event()
        #: attempts in a row that could not connect (while no row has been answered)
        self._unreached = 0

    def _cancel_error(self) -> RequestCancelled:
        return RequestCancelled(self.cancel.reason or "the batch was cancelled",
                                provider=self.adapter.provider_name)

    async def run(self, rows: Iterator[Pending]) -> None:
        """Run every row of ``rows`` (read one at a time, as slots free up); first the first
        row's request and worst case are made, so that what would fail every row alike (an
        option the adapter rejects, an unknown price) fails before anything is sent."""
        first = next(rows, None)
        if first is None:
            return
        self._prepared = prepare_call(self.adapter, first.messages, self.call,
                                      stream=self.call.stream, max_retries=0)
        if self.budget is not None:
            self.budget.worst(first.messages)
        rows = itertools.chain([first], rows)
        loop = asyncio.get_running_loop()

        def on_cancel() -> None:
            with contextlib.suppress(RuntimeError):  # the loop is closed: nothing left to stop
                loop.call_soon_threadsafe(self._stop)

        remove = self.cancel.add_callback(on_cancel)
        if self.cancel.cancelled:  # before the callback scheduled above has run
            self._stop()
        tasks: set[asyncio.Task[None]] = set()
        try:
            for pending in rows:
                try:  # raises at once when the batch stopped (_stop and _halt cancel the limiter)
                    epoch = await self.limiter.acquire()
                except DispatchError:  # cancelled or stopped (or while waiting for a slot)
                    mark_not_sent(self.result, pending.position, self.cancel)
                    break  # rows not read yet stay unread (the caller marks them not sent)
                if self._stopped.is_set():  # the slot came free as the batch stopped
                    self.limiter.release()
                    mark_not_sent(self.result, pending.position, self.cancel)
                    break
                task = loop.create_task(self._row(pending, epoch))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            if tasks:
                await asyncio.gather(*tasks)
        except BaseException:
            # Task cancelled (abatch's caller) or the row source failed: stop the rows in flight,
            # let them end (their finished answers are kept), then raise.
            self.cancel.cancel("the batch was stopped")
            self._stop()
            if tasks:
                await asyncio.wait(tasks, timeout=5.0)
            raise
        finally:
            remove()
            self.result.lowest_concurrency = self.limiter.lowest

    def _stop(self) -> None:
        self._stopped.set()
        self.limiter.cancel_all(self._cancel_error)

    def _halt(self, number: int, error: DispatchError) -> None:
        """Row ``number`` (:attr:`Pending.number`) ended with ``error``, which every row would
        get: send nothing more."""
        if self.result.stopped_by is not None or self.cancel.cancelled:
            return
        self.result.stopped_by = (number, error)
        self._stopped.set()
        self.limiter.cancel_all(lambda: not_sent(self.result, self.cancel))

    def _unreachable(self, error: DispatchError) -> APIConnectionError | None:
        """The error to stop at when ``error`` makes :data:`UNREACHABLE_AFTER` attempts in a row
        that could not connect (refused, no such host) with no row answered — a server that is
        down or a wrong base URL, which every row would get too — else None. A timeout or a
        broken connection is not one."""
        if self.answered:
            return None
        failed = isinstance(error, APIConnectionError) and error.connect_failed
        self._unreached = self._unreached + 1 if failed else 0
        if self._unreached < UNREACHABLE_AFTER:
            return None
        descriptor = find_descriptor(self.adapter.provider_name)
        variable = descriptor.base_url_env if descriptor is not None else None
        stop = APIConnectionError(
            f"the server could not be reached: {self._unreached} requests in a row failed to "
            f"connect and no row was answered ({error.message}). Check that the server is "
            "running and that the base URL is right (the model's base_url="
            + (f", or {variable}" if variable else "") + ")",
            provider=error.provider,
        )
        stop.connect_failed, stop.__cause__ = True, error
        return stop

    async def _sleep(self, seconds: float) -> None:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._stopped.wait(), seconds)

    async def _row(self, pending: Pending, epoch: int) -> None:
        settings, stats = self.settings, self.stats
        began = time.monotonic()
        if stats.first_sent is None:
            stats.first_sent = began
        deadline = began + settings.timeout if settings.timeout is not None else None
        adapter = self.adapter
        if isinstance(adapter, CachedAdapter):  # the cache names the row ("cell 3, row 17")
            row = f"row {pending.number}"
            adapter = adapter.with_label(f"{adapter.label}, {row}" if adapter.label else row)
        usage = Usage()
        attempts = calls = 0
        holding = True
        stats.in_flight += 1
        item: Response | DispatchError
        last: DispatchError | None = None  # the error of the row's last attempt
        try:
            while True:
                if not holding:
                    try:
                        epoch = await self._acquire_before(deadline)
                    except DispatchError as exc:
                        # stopped while waiting to retry: the row was sent, its last error stands
                        item = last if is_not_sent(exc) and last is not None else exc
                        break
                    holding = True
                attempts += 1
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    item = self._timeout_error(began)
                    break
                budget, reserved = self.budget, None
                if budget is not None:
                    try:
                        reserved = await budget.reserve(pending.messages, self.cancel)
                    except BudgetExceededError as exc:
                        attempts -= 1  # not sent
                        item = self._cancel_error() if self.cancel.cancelled else exc
                        break
                error: DispatchError | None = None
                try:
                    response, row_usage, calls = await ask(
                        adapter, pending.messages, self.call, self._prepared, timeout=remaining,
                        cancel=self.cancel,
                        budget=budget.budget if budget else None,
                    )
                except DispatchError as exc:
                    error = exc
                except Exception as exc:  # a tool or template bug: this row fails, not the batch
                    # (a plain DispatchError: neither retried nor stopping the batch)
                    error = DispatchError(
                        f"row {pending.number} failed: {type(exc).__name__}: {exc}",
                        provider=self.adapter.provider_name,
                    )
                    error.__cause__ = exc
                if budget is not None and reserved is not None:
                    budget.settle(reserved, response if error is None else error.partial,
                                  failed=error is not None)
                if error is None:
                    self.answered = True
                elif stops_batch(error):
                    self._halt(pending.number, error)  # before the slot is released
                elif (unreachable := self._unreachable(error)) is not None:
                    error = unreachable
                    self._halt(pending.number, error)
                self.limiter.release()
                holding = False
                if error is None:
                    self.limiter.on_success()
                    usage = usage + row_usage
                    item = response
                    break
                last = error
                if error.partial is not None:
                    usage = usage + error.partial.usage
                delay = self._retry_delay(error, attempts, epoch, deadline)
                if delay is None:
                    item = error
                    if isinstance(error, APITimeoutError) and deadline is not None \
                            and time.monotonic() >= deadline - 0.05:
                        item = self._timeout_error(began, error)
                    break
                self.result.retries += 1
                await self._sleep(delay)
                if self.cancel.cancelled:
                    item = self._cancel_error()
                    item.partial = error.partial
                    break
                if self.result.stopped_by is not None:
                    item = error
                    break
        finally:
            if holding:
                self.limiter.release()
            stats.in_flight -= 1
        self._finish(pending, item, adapter, usage, time.monotonic() - began, attempts, calls)

    async def _acquire_before(self, deadline: float | None) -> int:
        if deadline is None:
            return await self.limiter.acquire(first=True)
        left = deadline - time.monotonic()
        if left <= 0:
            raise APITimeoutError("the row's timeout passed while it waited to be retried",
                                  provider=self.adapter.provider_name)
        try:
            return await asyncio.wait_for(self.limiter.acquire(first=True), left)
        except asyncio.TimeoutError:
            raise APITimeoutError(
                f"no complete answer within the {self.settings.timeout:g} s timeout (the row "
                "waited for a free slot after a rate limit); pass a larger timeout=",
                provider=self.adapter.provider_name,
            ) from None

    def _timeout_error(self, began: float, cause: DispatchError | None = None) -> APITimeoutError:
        return APITimeoutError(
            f"no complete answer within the {self.settings.timeout:g} s timeout "
            f"(waited {time.monotonic() - began:.1f} s, retries included); pass a larger timeout=",
            provider=self.adapter.provider_name,
            partial=cause.partial if cause is not None else None,
        )

    def _retry_delay(self, exc: DispatchError, attempts: int, epoch: int,
                     deadline: float | None) -> float | None:
        """Seconds to wait before retrying after ``exc``, or None to give up."""
        if isinstance(exc, RateLimitError):
            self.result.rate_limited += 1
            self.stats.rate_limited += 1
            if exc.code != "quota_exceeded":
                self.limiter.on_rate_limited(epoch, exc.retry_after)
        if isinstance(exc, RequestCancelled) or self.cancel.cancelled \
                or self.result.stopped_by is not None or attempts > self.settings.max_retries \
                or not exc.retryable or exc.code == "quota_exceeded":
            return None
        delay = backoff_delay(attempts - 1, exc.retry_after, self.adapter.retry_backoff)
        if delay is None or (deadline is not None and time.monotonic() + delay >= deadline):
            return None
        return delay

    def _finish(self, pending: Pending, item: Response | DispatchError, adapter: Adapter,
                usage: Usage, latency: float, attempts: int, calls: int) -> None:
        stats = self.stats
        origin = RowOrigin.SENT
        if isinstance(adapter, CachedAdapter):
            calls = adapter.model_calls
            if adapter.replayed_calls and not calls:
                origin = RowOrigin.REPLAYED
                stats.replayed += 1
        self.result.model_calls += calls
        if isinstance(item, BudgetExceededError) and attempts == 0:
            origin = RowOrigin.NOT_SENT  # over the budget: never sent
        self.result._set(pending.position, item, usage=usage, latency=latency, attempts=attempts,
                         origin=origin)
        stats.count(item, origin, usage)
        if self.checkpoint is not None and isinstance(item, Response):
            try:
                self.checkpoint.record(pending.key, pending.number, pending.messages, item,
                                       self.adapter, streamed=self.call.stream, usage=usage,
                                       latency=latency, attempts=attempts)
            except OSError as exc:
                log.warning("could not write row %d to the checkpoint %s: %s", pending.number,
                            self.checkpoint.path, exc)
