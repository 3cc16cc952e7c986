"""``batch`` and ``abatch``: one prompt template over many rows (see the package docstring)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
from collections.abc import Iterable, Mapping
from typing import Any

from ..adapter import Adapter
from ..bridge import same_parameters
from ..budget import Budget
from ..cache import CachedAdapter, ResponseCache
from ..cancel import CancelToken
from ..errors import DispatchError
from ..registry import default_model_spec, find_descriptor
from ..types import Usage
from ..validation import check_tools
from .budget import RowBudget
from .checkpoint import Checkpoint
from .cluster import dask_partition_size, run_on_dask
from .deferred import TICK, BatchJob, BatchPendingError, DeferredRun, collect_sync, in_thread
from .engine import DEFAULT_MAX_RETRIES, BatchSettings, RowRunner
from .plan import BatchPlan, aclose_adapter, finish, resolve_adapter
from .progress import BatchProgress, progress_mode
from .result import BatchInterrupted, BatchResult, RowOrigin, Stats
from .rows import RowCall, RowSource

__all__ = ["abatch", "batch"]

log = logging.getLogger("dispatch_nb")


async def _premium(adapter: Adapter, result: BatchResult) -> None:
    """A provider that counts premium requests (its descriptor's ``premium_multiplier``: GitHub
    Copilot) bills each model call × the model's premium multiplier."""
    descriptor = find_descriptor(adapter.provider_name) if result.model_calls else None
    if descriptor is None or not descriptor.premium_multiplier:
        return
    with contextlib.suppress(Exception):
        for info in await adapter.alist_models():
            if info.id == adapter.model_name and info.premium_multiplier is not None:
                result.premium_requests = result.model_calls * info.premium_multiplier


class _Job:
    """One call of :func:`batch` / :func:`abatch`: its plan, cancel token, and — run here — its
    result, counters and progress bar. The steps both share."""

    def __init__(self, plan: BatchPlan, cancel: CancelToken | None,
                 progress: bool | str | None, budget: Budget | float | str | None = None, *,
                 deferred: bool = False, wait: bool = True, poll_interval: float | None = None,
                 executor: Any = None) -> None:
        self.plan = plan
        self.token = cancel if cancel is not None else CancelToken()
        self.result = BatchResult(plan.source, model=plan.model_key)
        self.stats = self.result._stats
        self.result._plan = plan
        self.result._retry = retry_failed
        self.result._progress_setting = progress  # a retry shows progress as the batch did
        self.result.budget = Budget.of(budget)
        where = " on Dask" if executor is not None else ""
        self.bar = BatchProgress(progress_mode(progress),
                                 description=f"batch {plan.model_key}{where}")
        #: ``deferred=True``: the rows go to the provider's batch API (see :mod:`.deferred`)
        self.deferred = DeferredRun(plan, self.result, self.token, poll_interval=poll_interval) \
            if deferred else None
        self.result._deferred = self.deferred
        self.wait = wait
        #: ``executor=``: a Dask client to run the rows on, in partitions of ``partition_size``
        self.executor = executor
        self.partition_size = 0  # set by _job, once checked

    def on_dask(self) -> None:
        """Run the rows on the Dask cluster of ``executor=`` instead, from this thread."""
        run_on_dask(self.plan, self.executor, self.result, self.bar, cancel=self.token,
                    size=self.partition_size)

    def run(self) -> None:
        """Run the job from this thread (its rows on Dask, or on a thread of their own) and
        :meth:`finish` it, also when it raises (Ctrl-C: ``KeyboardInterrupt``)."""
        try:
            if self.executor is not None:
                self.on_dask()
            else:
                # Ctrl-C stops a deferred batch's waiting, not its jobs (result.cancel() does that)
                in_thread(lambda: self.run_here(close_adapter=True),
                          self.deferred.interrupt if self.deferred is not None else self.token,
                          lambda: self.bar.update(self.stats))
        except KeyboardInterrupt:
            self.finish()
            raise
        except BaseException as exc:
            self.finish(exc)
            raise
        self.finish()

    async def run_here(self, *, close_adapter: bool) -> None:
        """Run the rows on the running event loop (or submit them to the provider's batch API
        and, with ``wait``, collect the answers)."""
        if self.deferred is not None:
            await self.deferred.start()
            if self.wait:
                await self.deferred.wait()
            return
        plan, result = self.plan, self.result
        adapter = resolve_adapter(plan.model, plan.cache)
        checkpoint = Checkpoint(plan.checkpoint) if plan.checkpoint is not None else None
        try:
            rows = plan.rows(checkpoint, result)
            budget = RowBudget(result.budget, adapter, plan.call) \
                if result.budget is not None else None
            runner = RowRunner(adapter, plan.call, plan.settings, result=result,
                               cancel=self.token, checkpoint=checkpoint, budget=budget)
            await runner.run(rows)
            await _premium(adapter, result)
        finally:
            if close_adapter or not isinstance(plan.model, Adapter):  # or the batch built it
                await aclose_adapter(adapter)

    def finish(self, error: BaseException | None = None) -> None:
        """Account for rows never run, set the totals, close the bar — unless the batch ended
        with ``error`` before its bar was shown (a TypeError / ValueError before any row started,
        a model without a batch API for ``deferred=True``): refused (docs/batch.md), it has
        nothing to show."""
        if error is not None and not self.bar.shown:
            return
        stopped = self.token
        if self.deferred is not None and self.deferred.interrupt.cancelled:
            stopped = self.deferred.interrupt  # Ctrl-C: the rows submitted stay pending
        finish(self.plan, self.result, stopped)
        self.bar.close(self.stats, self.result.summary())
        self.result._progress_output = self.bar.output


def _job(
    template: Any,
    rows: Any,
    *,
    model: Adapter | str | None = None,
    output: Any = None,
    system: str | None = None,
    tools: Iterable[Any] | None = None,
    concurrency: int = 16,
    max_retries: int = DEFAULT_MAX_RETRIES,
    timeout: float | None = None,
    checkpoint: str | os.PathLike[str] | None = None,
    executor: Any = None,
    progress: bool | str | None = None,
    cache: ResponseCache | str | os.PathLike[str] | None = None,
    cancel: CancelToken | None = None,
    partition_size: int | None = None,
    namespace: Mapping[str, Any] | None = None,
    max_tokens: int | None = None,
    temperature: float | None = None,
    stream: bool = False,
    budget: Budget | float | str | None = None,
    deferred: bool = False,
    wait: bool = True,
    poll_interval: float | None = None,
    **options: Any,
) -> _Job:
    """The parameters of :func:`batch` and :func:`abatch`, written once (:func:`batch` says what
    they mean), checked: the batch planned, as the job both run."""
    if not (isinstance(template, str) or callable(template)):
        raise TypeError(
            f"template must be a str with {{column}} placeholders or a function row -> prompt, "
            f"not {type(template).__name__}"
        )
    if model is None:
        model = default_model_spec()
    if not isinstance(model, (Adapter, str)):
        raise TypeError(
            "model must be a model spec such as 'openai:gpt-4.1' or an Adapter, "
            f"not {type(model).__name__}"
        )
    if not isinstance(stream, bool):
        raise TypeError(f"stream must be True or False, not {stream!r}")
    for reserved in ("on_delta", "cancel", "messages"):
        if reserved in options:
            raise TypeError(f"batch() sets {reserved} itself; it is not an option here")
    import difflib
    import inspect

    own = [p for p in inspect.signature(_job).parameters if p != "options"]
    for name in options:  # a typo of batch()'s own (concurency=4): not a model option
        close = difflib.get_close_matches(name, own, n=1, cutoff=0.8)
        if close:
            raise TypeError(f"batch() has no option {name} (did you mean {close[0]}?)")
    check_tools(tools)
    named = {"max_tokens": max_tokens, "temperature": temperature, "output": output}
    options.update({k: v for k, v in named.items() if v is not None})
    if cache is not None and not isinstance(cache, ResponseCache):
        cache = ResponseCache(cache)
    if isinstance(model, CachedAdapter) and cache is not None:
        raise ValueError("model is already a CachedAdapter: give the response cache only once")
    plan = BatchPlan(
        template=template,
        source=RowSource(rows, namespace),
        model=model,
        call=RowCall(system=system, tools=list(tools or []), options=options, stream=stream),
        settings=BatchSettings(concurrency=concurrency, max_retries=max_retries, timeout=timeout),
        checkpoint=os.fspath(checkpoint) if checkpoint is not None else None,
        cache=cache,
    )
    job = _Job(plan, cancel, progress, budget, deferred=deferred, wait=wait,
               poll_interval=poll_interval, executor=executor)
    if executor is not None:
        if deferred:
            raise ValueError("deferred=True runs the rows at the provider, not on a Dask "
                             "cluster: leave executor= out")
        if job.result.budget is not None:
            raise ValueError("budget= is kept by one process: run the batch without executor= "
                             "to give it a budget")
        job.partition_size = dask_partition_size(plan, executor, partition_size)
    return job


@same_parameters(_job)
def batch(*args: Any, **kwargs: Any) -> BatchResult:
    """Ask ``model`` the ``template`` filled from each of ``rows``; return a :class:`BatchResult`
    (each row's ``Response`` or ``DispatchError``, in input order).

    ``rows``: a list of str or dicts, a DataFrame, a Series or any iterable (read lazily);
    ``template``: a str with ``{column}`` placeholders or a function ``row -> prompt``;
    ``model``: a spec or an :class:`~dispatch_nb.adapter.Adapter`. ``output``, ``system``,
    ``tools``, ``max_tokens``, ``temperature`` and ``**options`` go to every row's call;
    ``concurrency`` (adaptive), ``max_retries`` and ``timeout`` (seconds) hold per row.
    ``checkpoint`` (a JSON-lines file a rerun resumes from), ``cache``, ``executor`` (a Dask
    client) and ``partition_size``, ``progress``, ``cancel``, ``namespace``, ``stream``,
    ``budget`` (US dollars) and ``deferred`` / ``wait`` / ``poll_interval`` (the provider's batch
    API): docs/batch.md. Ctrl-C raises :class:`BatchInterrupted`, whose ``.result`` holds every
    finished row.
    """
    job = _job(*args, **kwargs)
    try:
        job.run()
    except KeyboardInterrupt:
        raise BatchInterrupted(job.result, job.plan.checkpoint) from None
    return job.result


@same_parameters(_job)
async def abatch(*args: Any, **kwargs: Any) -> BatchResult:
    """The async twin of :func:`batch`, on the running event loop. Cancelling the awaiting task
    stops the rows in flight (finished rows stay in the checkpoint) and re-raises."""
    job = _job(*args, **kwargs)
    if job.executor is not None:
        try:
            await asyncio.to_thread(job.on_dask)
        except asyncio.CancelledError:
            job.token.cancel("the awaiting task was cancelled")
            raise
        except BaseException as exc:  # its thread has ended: the bar closes as batch()'s does
            job.finish(exc)
            raise
        job.finish()
        return job.result

    async def refresh() -> None:
        while True:
            job.bar.update(job.stats)
            await asyncio.sleep(TICK)

    ticker = asyncio.create_task(refresh()) if job.bar.mode != "off" else None
    try:
        await job.run_here(close_adapter=False)
    except BaseException as exc:
        job.finish(exc)
        raise
    finally:
        if ticker is not None:
            ticker.cancel()
    job.finish()
    return job.result


def retry_failed(result: BatchResult, *, deferred: bool | None = None) -> BatchResult:
    """``BatchResult.retry_failed()``: the failed rows (not the pending ones) as a batch of
    their own with the same plan (each row keeping the key the whole batch gives it), budget
    and progress setting; their answers replace the errors in ``result``. Ctrl-C raises
    :class:`BatchInterrupted` (a deferred retry's jobs keep running); a deferred retry's jobs
    join ``result.job``, and ``result.wait()`` / ``refresh()`` / ``cancel()`` reach them."""
    plan: BatchPlan = result._plan  # set with result._retry, which calls this
    failed = [i for i, item in enumerate(result)
              if isinstance(item, DispatchError) and not isinstance(item, BatchPendingError)]
    if not failed:
        return result
    source = plan.source
    if source.kept is None:
        raise ValueError("retry_failed() needs the rows in memory (a list, DataFrame or "
                         "Series); run the batch again with the same checkpoint= instead")
    wanted = set(failed)
    # each row keeps its number and the key the whole batch gives it (a repeated prompt's second
    # row is keyed …#1 even when only it is retried), counted over the rows as they are now, as a
    # rerun does
    keyed = {position: (row, key) for position, row, _messages, key in plan.keyed()
             if position in wanted}
    again = dataclasses.replace(plan, source=RowSource([keyed[p][0] for p in failed], source.extra),
                                whole=[(p, keyed[p][1]) for p in failed])
    use_deferred = (result._deferred is not None) if deferred is None else deferred
    # budget=: the same Budget, so the retry spends only what the batch left
    job = _Job(again, None, result._progress_setting, result.budget, deferred=use_deferred,
               poll_interval=result._deferred.poll_interval if result._deferred else None)
    retried = _Retried(result, job, failed)
    try:
        job.run()
    except KeyboardInterrupt:
        retried.merge()
        result.interrupted = True
        result.elapsed += job.result.elapsed
        raise BatchInterrupted(result, plan.checkpoint) from None
    retried.merge()
    result.interrupted = job.result.interrupted  # False: the retry ran to its end
    result.elapsed += job.result.elapsed  # the time the retry took, as wait() adds its own
    return result


def _less(total: Usage, part: Usage) -> Usage:
    return Usage(**{name: getattr(total, name) - getattr(part, name) for name in Usage.model_fields})


class _Retried:
    """A result after ``retry_failed()`` sent some of its rows again: :meth:`merge` puts the
    retry's rows in place (again after each later ``refresh()`` / ``wait()`` / ``cancel()`` of a
    deferred retry, which reach the earlier jobs and the retry's: ``result._deferred``)."""

    def __init__(self, result: BatchResult, job: _Job, positions: list[int]) -> None:
        self.result = result
        self.again = job.result
        self.positions = positions
        self.earlier = result._deferred  # the earlier run (or an earlier retry's)
        self.retry = job.deferred
        self.poll_interval = self.retry.poll_interval if self.retry is not None else None
        self._usage = Usage()  # what of the retry's usage and calls is in result already
        self._calls = 0
        self._counted: tuple[tuple[int, ...], Stats] | None = None  # stats() of rows collected
        self._merged = False  # merge() ran: later ones put in place only rows still pending

    @property
    def job(self) -> BatchJob | None:
        """The earlier jobs and the retry's, as one ``result.job``."""
        jobs = [run.job for run in (self.earlier, self.retry) if run is not None and run.job]
        if not jobs:
            return None
        return BatchJob(jobs[0].provider, [part for job in jobs for part in job.parts],
                        jobs[-1].checkpoint)

    def merge(self) -> None:
        result, again = self.result, self.again
        for index, (position, item) in enumerate(zip(self.positions, again, strict=True)):
            if self._merged and not isinstance(result[position], BatchPendingError):
                continue  # put in place already; a later live retry may have answered it since
            tokens_in, tokens_out = again.usage_of(index)
            result._set(position, item, usage=Usage(), latency=again.latency(index),
                        attempts=again.attempts(index), origin=again._origin[index])
            result._input_tokens[position], result._output_tokens[position] = tokens_in, tokens_out
        # the whole usage (cache tokens too), which the rows' own counts do not hold
        result.usage = result.usage + _less(again.usage, self._usage)
        result.model_calls += again.model_calls - self._calls
        if not self._merged:  # (a later merge must not undo a later live retry's stop)
            # the row and error the retry stopped at (numbered in the batch), as if the batch
            # had stopped there; None once a retry did not stop: no row is left unsent by an
            # earlier stop
            result.stopped_by = again.stopped_by
        self._usage, self._calls = again.usage, again.model_calls
        self._counted = None
        self._merged = True
        if self.retry is not None:
            result.job = self.job
            result._deferred = self

    def runs(self) -> list[DeferredRun]:
        """The deferred runs that hold the batch's jobs: its first run's, each deferred retry's."""
        earlier = self.earlier.runs() if isinstance(self.earlier, _Retried) \
            else [self.earlier] if self.earlier is not None else []
        return earlier + ([self.retry] if self.retry is not None else [])

    def merge_all(self) -> None:
        """:meth:`merge` this retry's rows and, first, those of the retries before it."""
        if isinstance(self.earlier, _Retried):
            self.earlier.merge_all()
        self.merge()

    def stats(self) -> Stats:
        """The whole batch's counters, for its one bar while its jobs (the first run's and the
        retries') run: each row as the result has it, or as the retry holding it has it; and the
        rows the jobs report but are not collected yet, as a deferred bar counts them."""
        runs = self.runs()
        seen = tuple(len(run.collected) for run in runs)  # rows change when a job is collected
        if self._counted is None or self._counted[0] != seen:
            items = self._items()
            counted = Stats(total=len(items))
            for item in items:
                if not isinstance(item, BatchPendingError):
                    counted.count(item, RowOrigin.NOT_SENT, Usage())
            self._counted = (seen, counted)
        stats = dataclasses.replace(self._counted[1])
        live = [part for run in runs for part in run.live_parts()]
        stats.ok += sum(part.completed for part in live)
        stats.failed += sum(part.failed for part in live)
        job = self.job
        stats.job = job.summary() if job is not None and job.parts else ""
        return stats

    def _items(self) -> list[Any]:
        items = self.earlier._items() if isinstance(self.earlier, _Retried) \
            else list(self.result)
        for position, item in zip(self.positions, self.again, strict=False):
            if isinstance(items[position], BatchPendingError):  # not merged yet
                items[position] = item
        return items

    def run_sync(self, *, wait: bool) -> None:
        collect_sync(self.result, self.runs(), wait=wait, stats=self.stats, merge=self.merge_all)

    def cancel_sync(self) -> None:
        try:
            for run in (self.earlier, self.retry):
                if run is not None:
                    run.cancel_sync()
        finally:
            self.merge()
