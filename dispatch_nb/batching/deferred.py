"""``batch(..., deferred=True)``: the rows as provider batch jobs (docs/batch.md, "Deferred"), over
:mod:`dispatch_nb.providers.batch_api`; each row's body is the one a live, non-streamed call sends,
and its answer is parsed by the same wire format.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from ..adapter import ChatRequest
from ..cancel import CancelToken
from ..cost import attempt_cost
from ..errors import BudgetExceededError, DispatchError, RequestCancelled, RequestError
from ..providers.batch_api import BatchAPI, JobPart, RowOutcome, cancelled_error, expired_error
from ..stream import Accumulator
from ..types import Response, Usage
from ..wire.base import WireRequest
from .budget import RowBudget
from .checkpoint import Checkpoint
from .engine import Pending, prepare_call, resume, row_call
from .plan import BatchPlan, resolve_adapter
from .progress import BatchProgress, progress_mode
from .result import BatchResult, RowOrigin, Stats, is_not_sent, not_sent

if TYPE_CHECKING:
    from ..http_adapter import HTTPAdapter

__all__ = ["BatchJob", "BatchPendingError", "DeferredRun", "custom_id"]

log = logging.getLogger("dispatch_nb")

#: seconds between polls of a running job (``poll_interval=``, else this environment variable,
#: else :data:`DEFAULT_POLL_INTERVAL`; ``%%chat --each --deferred`` reads the variable)
POLL_INTERVAL_ENV = "DISPATCH_NB_POLL_INTERVAL"
DEFAULT_POLL_INTERVAL = 30.0
#: seconds a cancelled batch waits for the provider to confirm and hand over what finished
PROVIDER_CANCEL_GRACE = 3.0
#: seconds Ctrl-C waits for a batch's thread to stop its rows in flight (or cancel its jobs)
INTERRUPT_GRACE = 5.0
#: seconds between progress refreshes while a batch's thread runs
TICK = 0.1


class BatchPendingError(DispatchError):
    """A deferred row whose job has not answered yet: ``result.wait()`` / ``result.refresh()``
    collect it, and so does running the same batch again (its checkpoint knows the job)."""

    default_code = "batch_pending"


def custom_id(key: str) -> str:
    """A row's ``custom_id``: derived from its key, within both providers' rules
    (``^[a-zA-Z0-9_-]{1,64}$``)."""
    return "row-" + hashlib.sha256(key.encode()).hexdigest()[:40]


@dataclass
class BatchJob:
    """The provider jobs of a deferred batch (``BatchResult.job``): their ids, state, counts and
    times. ``state`` is the least finished job's (``validating`` → ``in_progress`` →
    ``finalizing`` / ``cancelling``), or once every job has ended ``completed`` — or ``failed``,
    ``expired``, ``cancelled`` when any job ended so."""

    provider: str
    parts: list[JobPart] = field(default_factory=list)
    #: the checkpoint file that records the jobs (rerun the batch with it to collect them)
    checkpoint: str | None = None

    @property
    def ids(self) -> list[str]:
        return [p.id for p in self.parts]

    @property
    def state(self) -> str:
        live = [p.state for p in self.parts if not p.done]
        if live:
            return next((s for s in ("validating", "in_progress", "finalizing", "cancelling")
                         if s in live), live[0])
        ended = {p.state for p in self.parts}
        return next((s for s in ("failed", "expired", "cancelled") if s in ended), "completed")

    @property
    def done(self) -> bool:
        return all(p.done for p in self.parts)

    @property
    def total(self) -> int:
        return sum(p.total for p in self.parts)

    @property
    def completed(self) -> int:
        return sum(p.completed for p in self.parts)

    @property
    def failed(self) -> int:
        return sum(p.failed for p in self.parts)

    @property
    def created_at(self) -> float | None:
        return min((p.created_at for p in self.parts if p.created_at is not None), default=None)

    @property
    def ended_at(self) -> float | None:
        times = [p.ended_at for p in self.parts if p.ended_at is not None]
        return max(times) if self.done and times else None

    def summary(self) -> str:
        jobs = f"{len(self.parts)} jobs" if len(self.parts) != 1 else "job " + self.parts[0].id
        counts = f"{self.completed:,} of {self.total:,} answered"
        # a cancelled job counts the requests it never ran as failed: the rows say "not sent"
        failed = sum(p.failed for p in self.parts if p.state != "cancelled")
        if failed:
            counts += f", {failed:,} failed"
        return f"{self.provider} {jobs}: {self.state}, {counts}"

    def __repr__(self) -> str:
        return f"BatchJob({self.summary()})"


@dataclass
class _Row:
    position: int
    key: str
    request: ChatRequest
    wire: WireRequest
    number: int  # the row's number in the whole batch (Pending.number)


class DeferredRun:
    """One deferred batch: its rows, its jobs, and the steps :func:`batch` / :func:`abatch` and
    ``BatchResult.refresh()`` / ``wait()`` take."""

    def __init__(self, plan: BatchPlan, result: BatchResult, cancel: CancelToken, *,
                 poll_interval: float | None = None) -> None:
        if plan.call.runs_tools:
            raise ValueError(
                "deferred=True cannot run Python tools: each row's tool loop needs an answer "
                "before its next request. Run this batch live (deferred=False)"
            )
        if plan.cache is not None:
            raise ValueError("deferred=True does not take cache=: the checkpoint keeps the "
                             "answers (run the batch again to read them)")
        interval: Any = poll_interval
        name = "poll_interval"
        if interval is None:
            name = POLL_INTERVAL_ENV
            interval = os.environ.get(POLL_INTERVAL_ENV, "").strip() or DEFAULT_POLL_INTERVAL
            with contextlib.suppress(ValueError):
                interval = float(interval)
        if isinstance(interval, bool) or not isinstance(interval, (int, float)) \
                or not math.isfinite(interval) or interval < 0:
            raise ValueError(f"{name} must be a number of seconds ≥ 0, not {interval!r}")
        self.plan = plan
        self.result = result
        self.stats = result._stats
        #: ``cancel=`` (or the batch's own token): cancelling it cancels the jobs at the provider
        self.cancel = cancel
        #: Ctrl-C, or the awaiting task cancelled: stop submitting and waiting; the jobs
        #: submitted keep running at the provider (a rerun, ``wait()`` or ``cancel()`` follows)
        self.interrupt = CancelToken()
        self.poll_interval = float(interval)
        self.adapter: HTTPAdapter | None = None
        self.api: BatchAPI | None = None
        self.checkpoint: Checkpoint | None = None
        self.rows: dict[str, _Row] = {}
        self.parts: dict[str, tuple[JobPart, list[str]]] = {}
        self.job: BatchJob | None = None
        self._collected_ok = 0
        self._collected_failed = 0
        #: the ids of the jobs this run has collected (or read, collected, from the checkpoint)
        self.collected: set[str] = set()
        self._reserved: dict[str, Decimal] = {}  # budget= reservations of the rows submitted

    # -- setting up ----------------------------------------------------------------------------
    def _read_rows(self) -> list[Pending]:
        """The rows to ask; the rows the checkpoint answers go in ``result``."""
        plan = self.plan
        if plan.checkpoint is not None:
            self.checkpoint = Checkpoint(plan.checkpoint)
        pending = list(plan.rows(self.checkpoint, self.result))
        if self.checkpoint is None and pending:  # one named after what the batch asks
            from ..auth.token_store import dispatch_nb_home

            keys = "\n".join([plan.model_key, *(p.key for p in pending)])
            digest = hashlib.sha256(keys.encode()).hexdigest()
            plan.checkpoint = str(dispatch_nb_home() / "batches" / f"{digest[:24]}.jsonl")
            self.checkpoint = Checkpoint(plan.checkpoint)
            # rows an earlier run of this same call already answered
            pending = [p for p in pending
                       if not resume(self.result, p.position, self.checkpoint.answer(p.key))]
        return pending

    async def start(self) -> None:
        """Read the rows, then collect the rows recorded jobs hold and submit the others
        (nothing is sent for a provider without a batch API, or when every row is answered)."""
        adapter = resolve_adapter(self.plan.model, None)
        api = adapter.batch_api()
        if api is None:
            raise RequestError(
                f"{adapter.display_name} ({adapter.spec}) has no "
                "batch API (OpenAI's and Anthropic's APIs have one). Run this batch live "
                "(deferred=False)", provider=adapter.provider_name,
                code="batch_unsupported",
            )
        self.adapter, self.api = api.adapter, api
        self.job = self.result.job = BatchJob(adapter.provider_name)
        pending = self._read_rows()
        self._collected_failed = self.stats.failed  # rows whose template failed (plan.rows)
        self.job.checkpoint = self.plan.checkpoint
        if pending:  # the request a live, non-streamed call sends (the same wire code)
            prepared = prepare_call(api.adapter, pending[0].messages, self.plan.call, stream=False)
        for item in pending:
            request = api.adapter._with_output_prompt(row_call(prepared, item.messages).request)
            self.rows[item.key] = _Row(item.position, item.key, request,
                                       api.adapter.build_request(request), item.number)
        if self.checkpoint is not None and self.checkpoint.read:
            # the jobs, recorded and collected, that answered the rows read from the checkpoint:
            # in result.job as they ended (nothing is asked of the provider, no key is needed)
            for job, keys in self.checkpoint.jobs(collected=True):
                if self.checkpoint.read.intersection(keys):
                    part = JobPart(**job)
                    self.collected.add(part.id)
                    self.parts[part.id] = (part, keys)
        if not self.rows:
            self._show()
            return
        assert self.checkpoint is not None
        claimed: set[str] = set()
        for job, keys in self.checkpoint.jobs():
            mine = [k for k in keys if k in self.rows]
            if not mine:
                continue
            part = JobPart(**job)
            self.parts[part.id] = (part, keys)
            claimed.update(mine)
            log.info("batch %s: collecting %d row(s) from %s job %s, submitted earlier",
                     self.plan.model_key, len(mine), part.provider, part.id)
        fresh = [key for key in self.rows if key not in claimed]
        for row in self.rows.values():
            self._pending(row, "submitting")
        fresh = self._within_budget(fresh)
        submitted: set[str] = set()
        for chunk, lines in self._chunks(api, fresh):
            if self.cancel.cancelled or self.interrupt.cancelled:
                break
            # every row shares one call, so one row's headers are the job's
            part = await api.submit(lines, self.rows[chunk[0]].wire.headers)
            self.checkpoint.record_job(part.to_json(), chunk)
            self.parts[part.id] = (part, chunk)
            submitted.update(chunk)
            log.info("batch %s: submitted %d row(s) as %s job %s", self.plan.model_key,
                     len(chunk), part.provider, part.id)
        stopped = self.cancel if self.cancel.cancelled else self.interrupt
        for key in fresh:  # cancelled before their job was submitted: never sent
            if key not in submitted:
                self._finish_row(self.rows[key], not_sent(self.result, stopped), None)
        self._show()

    def _within_budget(self, keys: list[str]) -> list[str]:
        """With ``budget=``: the rows whose worst case (at the batch price) still fits, each
        reserved; the others end as :class:`~dispatch_nb.errors.BudgetExceededError`, not sent.
        Rows collected from a job an earlier run submitted cost this run nothing."""
        budget = self.result.budget
        if budget is None or not keys:
            return keys
        assert self.adapter is not None
        worst = RowBudget(budget, self.adapter, self.plan.call).worst
        kept = []
        for key in keys:
            row = self.rows[key]
            try:
                self._reserved[key] = budget.reserve(worst(row.request.messages, batch=True))
            except BudgetExceededError as exc:
                exc.provider = self.adapter.provider_name
                self.result._set(row.position, exc)
                self.stats.not_sent += 1  # as a live batch counts a row over its budget
                del self.rows[key]
                continue
            kept.append(key)
        return kept

    def _chunks(self, api: BatchAPI, keys: list[str]) -> Iterator[tuple[list[str], list[bytes]]]:
        """``keys`` and their lines in jobs within the provider's limits (requests per job,
        bytes per job)."""
        chunk: list[str] = []
        lines: list[bytes] = []
        size = 0
        for key in keys:
            line = api.line(custom_id(key), self.rows[key].wire.json)
            if chunk and (len(chunk) >= api.max_requests or size + len(line) + 1 > api.max_bytes):
                yield chunk, lines
                chunk, lines, size = [], [], 0
            chunk.append(key)
            lines.append(line)
            size += len(line) + 1
        if chunk:
            yield chunk, lines

    # -- the rows ------------------------------------------------------------------------------
    def _pending(self, row: _Row, state: str) -> None:
        where = (f"; its checkpoint {self.plan.checkpoint} knows the job"
                 if self.plan.checkpoint else "")
        self.result._set(row.position, BatchPendingError(
            f"not answered yet: the batch job is {state}. result.wait() or result.refresh() "
            f"collect it, and so does running the batch again{where}",
            provider=self.adapter.provider_name if self.adapter else None,
        ))

    def _show(self) -> None:
        """Refresh ``result.job`` and the progress counters from the jobs."""
        assert self.job is not None
        self.job.parts = [part for part, _keys in self.parts.values()]
        for part, keys in self.parts.values():
            if not part.done:
                for key in keys:
                    row = self.rows.get(key)
                    if row is not None:
                        self._pending(row, part.state)
        live = self.live_parts()
        self.stats.ok = self.stats.resumed + self._collected_ok + sum(p.completed for p in live)
        self.stats.failed = self._collected_failed + sum(p.failed for p in live)
        self.stats.in_flight = sum(max(0, p.total - p.completed - p.failed) for p in live)
        if self.job.parts:
            self.stats.job = self.job.summary()

    def _answer(self, row: _Row, body: Any) -> Response | DispatchError:
        """A job's answer as the Response a live call gives (``parsed`` for ``output=``)."""
        adapter = self.adapter
        assert adapter is not None
        acc = Accumulator(adapter.model_name, adapter.spec)
        try:
            adapter._parse_body(row.wire, row.request, body, acc)
            adapter._priced(row.request, acc, batch=True)  # the batch price, in the ledger too
            response = acc.finish()
            if row.request.output is not None:
                from ..structured import settle_answer

                response = settle_answer(response, row.request.output)
        except DispatchError as exc:
            exc.provider = exc.provider or adapter.provider_name
            return exc
        return response

    def _missing(self, part: JobPart) -> DispatchError:
        provider = part.provider
        if part.state == "expired":
            return expired_error(provider)
        if part.state == "cancelled":
            return cancelled_error(provider)
        if part.state == "failed":
            return RequestError(f"the batch job {part.id} failed validation: "
                                f"{part.message or 'no reason given'}", provider=provider,
                                code="batch_failed")
        return DispatchError(f"the batch job {part.id} ({part.state}) has no result for this "
                             "request", provider=provider)

    def _finish_row(self, row: _Row, item: Response | DispatchError,
                    part: JobPart | None) -> None:
        usage = item.usage if isinstance(item, Response) else (
            item.partial.usage if item.partial is not None else Usage())
        latency = max(0.0, part.ended_at - part.created_at) if part is not None \
            and part.ended_at is not None and part.created_at is not None else 0.0
        reserved = self._reserved.pop(row.key, None)
        if reserved is not None and self.result.budget is not None:
            answer = item if isinstance(item, Response) else item.partial
            self.result.budget.settle(reserved, attempt_cost(answer, not isinstance(item, Response),
                                                             reserved))
        never_ran = isinstance(item, RequestCancelled)
        self.result._set(row.position, item, usage=usage, latency=latency,
                         attempts=0 if never_ran else 1,
                         origin=RowOrigin.NOT_SENT if never_ran else RowOrigin.SENT)
        if isinstance(item, Response):
            self._collected_ok += 1
            self.result.model_calls += 1
        elif is_not_sent(item):  # its job was cancelled (or never submitted) before it ran
            self.stats.not_sent += 1
        else:
            self._collected_failed += 1
        self.stats.input_tokens += usage.input_tokens
        self.stats.output_tokens += usage.output_tokens
        self.stats.sent_done += 1
        if self.checkpoint is not None and isinstance(item, Response):
            assert self.adapter is not None
            self.checkpoint.record(row.key, row.number, row.request.messages, item, self.adapter,
                                   streamed=False, usage=usage, latency=latency,
                                   attempts=1)

    async def _collect(self, part: JobPart, keys: list[str]) -> None:
        assert self.api is not None and self.checkpoint is not None
        outcomes: list[RowOutcome] = []
        if part.state != "failed":
            outcomes = await self.api.results(part)
        waiting = {custom_id(key): self.rows[key] for key in keys if key in self.rows}
        for outcome in outcomes:
            row = waiting.pop(outcome.custom_id, None)
            if row is None:
                continue  # not a row of this call (or a duplicate line)
            item = outcome.error if outcome.error is not None else self._answer(row, outcome.body)
            self._finish_row(row, item, part)
        for row in waiting.values():
            self._finish_row(row, self._missing(part), part)
        self.collected.add(part.id)
        # a job that also holds rows of another call stays open for that call to collect
        self.checkpoint.record_job(part.to_json(), keys,
                                   collected=all(key in self.rows for key in keys))

    # -- polling -------------------------------------------------------------------------------
    async def refresh(self) -> bool:
        """Poll every unfinished job once and collect the finished ones; True when every job
        is collected."""
        api = self.api
        if api is None:
            return True
        for job_id, (part, keys) in list(self.parts.items()):
            if part.id in self.collected:
                continue
            if not part.done:
                part = await api.poll(part)
                self.parts[job_id] = (part, keys)
            if part.done:
                await self._collect(part, keys)
        self._show()
        return all(p.id in self.collected for p, _k in self.parts.values())

    async def wait(self) -> None:
        """Poll until every job is collected; until :attr:`cancel` is cancelled (then cancel the
        jobs at the provider), or until :attr:`interrupt` is, or the awaiting task is cancelled
        (then stop waiting: the jobs keep running, recorded in the checkpoint)."""
        wake = asyncio.Event()
        loop = asyncio.get_running_loop()

        def on_cancel() -> None:
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(wake.set)

        removers = [self.cancel.add_callback(on_cancel), self.interrupt.add_callback(on_cancel)]
        try:
            while not await self.refresh():
                if self.cancel.cancelled:
                    await self.cancel_jobs()
                    return
                if self.interrupt.cancelled:
                    return
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(wake.wait(), self.poll_interval)
            log.info("batch %s: %s", self.plan.model_key, self.job.summary() if self.job else "")
        finally:
            for remove in removers:
                remove()

    async def cancel_jobs(self) -> None:
        """Ask the provider to cancel every running job; collect what it hands over within
        PROVIDER_CANCEL_GRACE seconds (a rerun collects the rest)."""
        api = self.api
        if api is None:
            return
        for job_id, (part, keys) in list(self.parts.items()):
            if part.done:
                continue
            try:
                part = await api.cancel(part)
            except DispatchError as exc:
                log.warning("could not cancel batch job %s: %s", part.id, exc)
                continue
            self.parts[job_id] = (part, keys)
            assert self.checkpoint is not None
            self.checkpoint.record_job(part.to_json(), keys)
        end = time.monotonic() + PROVIDER_CANCEL_GRACE
        while time.monotonic() < end:
            if await self.refresh():
                break
            await asyncio.sleep(min(0.5, max(self.poll_interval, 0.05)))

    def live_parts(self) -> list[JobPart]:
        """This run's jobs not collected yet."""
        return [part for part, _keys in self.parts.values() if part.id not in self.collected]

    def run_sync(self, *, wait: bool) -> None:
        """``BatchResult.refresh()`` (``wait=False``) / ``wait()``: :func:`collect_sync`."""
        collect_sync(self.result, [self], wait=wait, stats=lambda: self.stats)

    def cancel_sync(self) -> None:
        """``BatchResult.cancel()``: :meth:`cancel_jobs`, from any thread."""
        self.interrupt = CancelToken()
        in_thread(self.cancel_jobs, self.interrupt)


def collect_sync(result: BatchResult, runs: list[DeferredRun], *, wait: bool,
                 stats: Callable[[], Stats], merge: Callable[[], None] | None = None) -> None:
    """``BatchResult.refresh()`` (``wait=False``) / ``wait()`` of the batch whose jobs ``runs``
    hold (its first run's and its deferred retries', side by side), from a thread that may run an
    event loop of its own (a notebook's). Ctrl-C stops the waiting, not the jobs. ``wait()`` shows
    the batch's one progress bar (its ``progress=``; ``stats()``: its counters) while a job runs,
    as ``batch()`` does: its clock and the jobs' line move while it waits. ``merge()`` puts what
    the runs collected in ``result``; the time it took adds to ``result.elapsed``, and
    ``result.interrupted`` says whether Ctrl-C stopped it (docs/batch.md)."""
    interrupt = CancelToken()
    for run in runs:
        run.interrupt = interrupt
    running = wait and any(run.live_parts() for run in runs)
    bar = BatchProgress(progress_mode(result._progress_setting) if running else "off",
                        description=f"batch {result.model}")
    began = time.monotonic()

    async def work() -> None:
        await asyncio.gather(*(run.wait() if wait else run.refresh() for run in runs))

    try:
        in_thread(work, interrupt, lambda: bar.update(stats()))
    finally:
        if merge is not None:
            merge()
        result.elapsed += time.monotonic() - began
        result.interrupted = interrupt.cancelled
        bar.close(stats(), result.summary())


def in_thread(work: Callable[[], Coroutine[Any, Any, Any]], token: CancelToken,
              tick: Callable[[], None] | None = None) -> None:
    """Run ``work()`` on an event loop of its own thread (a notebook's main thread already runs
    one), calling ``tick()`` every :data:`TICK` seconds meanwhile (a progress bar); Ctrl-C
    cancels ``token``, waits up to :data:`INTERRUPT_GRACE` seconds for it to stop and raises."""
    done = threading.Event()
    failure: list[BaseException] = []

    def run() -> None:
        try:
            asyncio.run(work())
        except BaseException as exc:
            failure.append(exc)
        finally:
            done.set()

    def wait(seconds: float) -> None:
        end = time.monotonic() + seconds
        while not done.wait(TICK) and time.monotonic() < end:
            if tick is not None:
                tick()

    threading.Thread(target=run, name="dispatch_nb-batch", daemon=True).start()
    try:
        wait(math.inf)
    except KeyboardInterrupt:
        token.cancel("interrupted (KeyboardInterrupt)")
        with contextlib.suppress(KeyboardInterrupt):
            wait(INTERRUPT_GRACE)
        raise
    if failure:
        raise failure[0]
