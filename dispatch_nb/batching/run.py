"""``batch`` and ``abatch``: one prompt template over many rows (see the package docstring)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import threading
import time
from collections.abc import Iterable, Mapping
from typing import Any

from ..adapter import Adapter
from ..cache import ResponseCache
from ..cancel import CancelToken
from .checkpoint import Checkpoint
from .engine import DEFAULT_MAX_RETRIES, RowRunner, Stats, prepare_rows, validate_call
from .plan import BatchPlan, finish, make_plan, new_result, resolve_adapter
from .progress import BatchProgress, progress_mode
from .result import BatchInterrupted, BatchResult

__all__ = ["abatch", "batch"]

log = logging.getLogger("dispatch_nb")

#: seconds Ctrl-C waits for the rows in flight to stop
CANCEL_GRACE = 5.0
#: seconds between progress refreshes
PROGRESS_INTERVAL = 0.1


async def _aclose(adapter: Adapter) -> None:
    aclose = getattr(adapter, "aclose", None)
    with contextlib.suppress(Exception):
        if aclose is not None:
            await aclose()
        else:
            adapter.close()


async def _premium(adapter: Adapter, result: BatchResult) -> None:
    """Copilot bills each model call × the model's premium multiplier."""
    if adapter.provider_name != "copilot" or not result.model_calls:
        return
    with contextlib.suppress(Exception):
        for info in await adapter.alist_models():
            if info.id == adapter.model_name and info.premium_multiplier is not None:
                result.premium_requests = result.model_calls * info.premium_multiplier


async def run_local(plan: BatchPlan, result: BatchResult, stats: Stats, cancel: CancelToken,
                    *, close_adapter: bool) -> None:
    """Run ``plan`` on the running event loop, filling ``result``."""
    adapter, owned = resolve_adapter(plan.model, plan.cache)
    checkpoint = Checkpoint(plan.checkpoint) if plan.checkpoint is not None else None
    try:
        if checkpoint is not None:
            checkpoint.load()
        rows = prepare_rows(plan.source, plan.template, plan.model_key, plan.call, checkpoint,
                            result, stats)
        first = next(rows, None)
        if first is None:
            return
        validate_call(adapter, first.messages, plan.call)
        runner = RowRunner(adapter, plan.call, plan.settings, result=result, stats=stats,
                           cancel=cancel, checkpoint=checkpoint)
        await runner.run(itertools.chain([first], rows))
        await _premium(adapter, result)
    finally:
        if checkpoint is not None:
            checkpoint.close()
        if owned or close_adapter:
            await _aclose(adapter)


class _Job:
    """One call of :func:`batch` / :func:`abatch`: its plan, cancel token, and — run here — its
    result, counters and progress bar. The steps both share."""

    def __init__(self, plan: BatchPlan, cancel: CancelToken | None,
                 progress: bool | str | None) -> None:
        self.plan = plan
        self.token = cancel if cancel is not None else CancelToken()
        self.progress = progress
        self.result, self.stats = new_result(plan)
        self.bar = BatchProgress(progress_mode(progress), description=f"batch {plan.model_key}")

    def on_dask(self, executor: Any, partition_size: int | None) -> BatchResult:
        """Run on a Dask cluster instead (``executor=``): the cluster keeps its own result and
        bar."""
        from .cluster import run_on_dask

        return run_on_dask(self.plan, executor, cancel=self.token, progress=self.progress,
                           partition_size=partition_size)

    async def run_here(self, *, close_adapter: bool) -> None:
        """Run the rows on the running event loop."""
        await run_local(self.plan, self.result, self.stats, self.token,
                        close_adapter=close_adapter)

    def finish(self) -> None:
        """Account for rows never run, set the totals, close the bar."""
        finish(self.plan, self.result, self.stats, self.token)
        self.bar.close(self.stats, self.result.summary())


def batch(
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
    **options: Any,
) -> BatchResult:
    """Ask ``model`` the ``template`` filled from each of ``rows``; return a :class:`BatchResult`
    (each row's ``Response`` or ``DispatchError``, in input order).

    ``rows``: a list of str or dicts, a pandas DataFrame or Series, or any iterable (read lazily).
    ``template``: a str with ``{column}`` placeholders (``%%chat`` interpolation rules; ``{row}``
    is the whole row) or a function ``row -> prompt``. ``model``: a spec (``"openai:gpt-4.1"``) or
    an :class:`~dispatch_nb.adapter.Adapter`. ``output``: a pydantic model, a type or a JSON
    schema; each row's answer is validated into ``response.parsed`` (see
    ``docs/structured-output.md``). ``system``, ``tools`` (Python tools run the tool loop per row),
    ``max_tokens``, ``temperature`` and ``**options`` go to every call.

    ``concurrency``: the most rows in flight (rate limits lower it for the whole batch, successes
    raise it back). ``max_retries``: retries per row. ``timeout``: seconds per row, retries
    included. ``checkpoint``: a JSON-lines file where each row is recorded as it finishes; a rerun
    sends only the rows not answered there. ``cache``: a
    :class:`~dispatch_nb.cache.ResponseCache` (or its path) to record / replay answers.
    ``executor``: a ``dask.distributed.Client`` to run the rows on its workers, in partitions of
    ``partition_size`` rows. ``progress``: ``None`` (auto), ``True`` or ``False``. ``cancel``: a
    :class:`~dispatch_nb.cancel.CancelToken` that stops the batch (finished rows are kept).
    ``namespace``: names the template may use besides each row's (a notebook's variables).
    ``None`` (auto): 0 — every event as it arrives — below ``concurrency`` 64; from 64 up,
    ``concurrency / 1280`` s, at most 0.25 s (0.2 s at 256), which keeps the batch to about
    1,280 reads a second: hundreds of streams read event by event would take most of a core.

    Ctrl-C stops the rows in flight within moments and raises :class:`BatchInterrupted`, whose
    ``.result`` holds every finished row.
    """
    plan = make_plan(template, rows, model=model, system=system, tools=tools,
                     concurrency=concurrency, max_retries=max_retries, timeout=timeout,
                     checkpoint=checkpoint, cache=cache, namespace=namespace,
                     options={"max_tokens": max_tokens, "temperature": temperature,
                              "output": output, **options})
    job = _Job(plan, cancel, progress)
    if executor is not None:
        return job.on_dask(executor, partition_size)
    done = threading.Event()
    failure: list[BaseException] = []

    def work() -> None:
        try:
            asyncio.run(job.run_here(close_adapter=True))
        except BaseException as exc:
            failure.append(exc)
        finally:
            done.set()

    thread = threading.Thread(target=work, name="dispatch_nb-batch", daemon=True)
    thread.start()
    try:
        while not done.wait(PROGRESS_INTERVAL):
            job.bar.update(job.stats)
    except KeyboardInterrupt:
        job.token.cancel("interrupted (KeyboardInterrupt)")
        end = time.monotonic() + CANCEL_GRACE
        with contextlib.suppress(KeyboardInterrupt):
            while not done.wait(PROGRESS_INTERVAL) and time.monotonic() < end:
                job.bar.update(job.stats)
        job.finish()
        raise BatchInterrupted(job.result, plan.checkpoint) from None
    job.finish()
    if failure:
        raise failure[0]
    return job.result


async def abatch(
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
    **options: Any,
) -> BatchResult:
    """The async twin of :func:`batch`, on the running event loop. Cancelling the awaiting task
    stops the rows in flight (finished rows stay in the checkpoint) and re-raises."""
    plan = make_plan(template, rows, model=model, system=system, tools=tools,
                     concurrency=concurrency, max_retries=max_retries, timeout=timeout,
                     checkpoint=checkpoint, cache=cache, namespace=namespace,
                     options={"max_tokens": max_tokens, "temperature": temperature,
                              "output": output, **options})
    job = _Job(plan, cancel, progress)
    if executor is not None:
        try:
            return await asyncio.to_thread(job.on_dask, executor, partition_size)
        except asyncio.CancelledError:
            job.token.cancel("the awaiting task was cancelled")
            raise

    async def refresh() -> None:
        while True:
            job.bar.update(job.stats)
            await asyncio.sleep(PROGRESS_INTERVAL)

    ticker = asyncio.create_task(refresh()) if job.bar.mode != "off" else None
    try:
        await job.run_here(close_adapter=False)
    finally:
        if ticker is not None:
            ticker.cancel()
        job.finish()
    return job.result
