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
from dataclasses import dataclass, field
from typing import Any

from ..adapter import Adapter
from ..cache import CachedAdapter, ResponseCache
from ..cancel import CancelToken
from ..errors import RequestCancelled
from ..types import Usage
from .checkpoint import Checkpoint
from .engine import (
    DEFAULT_MAX_RETRIES,
    BatchSettings,
    RowRunner,
    Stats,
    model_id,
    prepare_rows,
    validate_call,
)
from .progress import BatchProgress, progress_mode
from .result import BatchInterrupted, BatchResult, RowOrigin
from .rows import RowCall, RowSource, check_template

__all__ = ["abatch", "batch"]

log = logging.getLogger("dispatch_nb")

#: seconds Ctrl-C waits for the rows in flight to stop
CANCEL_GRACE = 5.0
#: seconds between progress refreshes
PROGRESS_INTERVAL = 0.1


@dataclass
class BatchPlan:
    """Everything a batch was asked to do, checked (shared by the local and the Dask runs)."""

    template: Any
    source: RowSource
    model: Adapter | str
    call: RowCall
    settings: BatchSettings
    checkpoint: str | None
    cache: ResponseCache | None
    model_key: str = field(init=False)

    def __post_init__(self) -> None:
        self.model_key = model_id(self.model)


def make_plan(
    template: Any,
    rows: Any,
    *,
    model: Adapter | str | None,
    system: str | None,
    tools: Iterable[Any] | None,
    concurrency: int,
    max_retries: int,
    timeout: float | None,
    checkpoint: str | os.PathLike[str] | None,
    cache: ResponseCache | str | os.PathLike[str] | None,
    options: dict[str, Any],
    namespace: Mapping[str, Any] | None = None,
) -> BatchPlan:
    """Check the arguments of :func:`batch` and bundle them."""
    check_template(template)
    if model is None:
        from ..registry import default_model_spec

        model = default_model_spec()
    if not isinstance(model, (Adapter, str)):
        raise TypeError(
            "model must be a model spec such as 'openai:gpt-4.1' or an Adapter, "
            f"not {type(model).__name__}"
        )
    for reserved in ("stream", "on_delta", "cancel", "messages"):
        if reserved in options:
            raise TypeError(f"batch() sets {reserved} itself; it is not an option here")
    if options.get("max_tokens") is None:
        options.pop("max_tokens", None)
    if options.get("temperature") is None:
        options.pop("temperature", None)
    if options.get("output") is None:
        options.pop("output", None)
    if cache is not None and not isinstance(cache, ResponseCache):
        cache = ResponseCache(cache)
    if isinstance(model, CachedAdapter) and cache is not None:
        raise ValueError("model is already a CachedAdapter: give the response cache only once")
    return BatchPlan(
        template=template,
        source=RowSource(rows, namespace),
        model=model,
        call=RowCall(system=system, tools=list(tools or []), options=options),
        settings=BatchSettings(concurrency=concurrency, max_retries=max_retries, timeout=timeout),
        checkpoint=os.fspath(checkpoint) if checkpoint is not None else None,
        cache=cache,
    )


def resolve_adapter(model: Adapter | str, cache: ResponseCache | None) -> tuple[Adapter, bool]:
    """The adapter rows go through (behind the response cache when one is given), and whether
    the batch built it (then the batch closes it)."""
    owned = not isinstance(model, Adapter)
    if isinstance(model, Adapter):
        adapter = model
    elif cache is not None:
        from ..replay_only import connect_for_cache

        adapter = connect_for_cache(model, cache.mode)
    else:
        from ..registry import connect

        adapter = connect(model)
    if cache is not None and cache.mode != "off":
        adapter = CachedAdapter(adapter, cache)
    return adapter, owned


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


def finish(plan: BatchPlan, result: BatchResult, stats: Stats, cancel: CancelToken) -> None:
    """Mark rows never read as not run (a cancelled batch over a sized input) and set totals."""
    total = plan.source.total
    if total is not None and len(result) < total and cancel.cancelled:
        reason = cancel.reason or "the batch was cancelled"
        for position in range(len(result), total):
            result._set(position, RequestCancelled(f"not sent: {reason}"), usage=Usage(),
                        latency=0.0, attempts=0, origin=RowOrigin.NOT_RUN)
            stats.failed += 1
    for position, item in enumerate(result._items):
        if item is None:  # reserved but never finished (the engine stopped abruptly)
            result._set(position, RequestCancelled("not finished: the batch was stopped"),
                        usage=Usage(), latency=0.0, attempts=0, origin=RowOrigin.NOT_RUN)
    result.interrupted = cancel.cancelled
    result.elapsed = time.monotonic() - stats.started
    if result.resumed:
        log.info("batch %s: %d of %d rows were already answered in %s; sent %d", plan.model_key,
                 result.resumed, len(result), plan.checkpoint, result.sent)


def _new_result(plan: BatchPlan) -> tuple[BatchResult, Stats]:
    result = BatchResult(plan.source, model=plan.model_key)
    return result, Stats(total=plan.source.total)


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

    Ctrl-C stops the rows in flight within moments and raises :class:`BatchInterrupted`, whose
    ``.result`` holds every finished row.
    """
    plan = make_plan(template, rows, model=model, system=system, tools=tools,
                     concurrency=concurrency, max_retries=max_retries, timeout=timeout,
                     checkpoint=checkpoint, cache=cache, namespace=namespace,
                     options={"max_tokens": max_tokens, "temperature": temperature,
                              "output": output, **options})
    token = cancel if cancel is not None else CancelToken()
    if executor is not None:
        from .cluster import run_on_dask

        return run_on_dask(plan, executor, cancel=token, progress=progress,
                           partition_size=partition_size)
    result, stats = _new_result(plan)
    bar = BatchProgress(progress_mode(progress), description=f"batch {plan.model_key}")
    done = threading.Event()
    failure: list[BaseException] = []

    def work() -> None:
        try:
            asyncio.run(run_local(plan, result, stats, token, close_adapter=True))
        except BaseException as exc:
            failure.append(exc)
        finally:
            done.set()

    thread = threading.Thread(target=work, name="dispatch_nb-batch", daemon=True)
    thread.start()
    try:
        while not done.wait(PROGRESS_INTERVAL):
            bar.update(stats)
    except KeyboardInterrupt:
        token.cancel("interrupted (KeyboardInterrupt)")
        end = time.monotonic() + CANCEL_GRACE
        with contextlib.suppress(KeyboardInterrupt):
            while not done.wait(PROGRESS_INTERVAL) and time.monotonic() < end:
                bar.update(stats)
        finish(plan, result, stats, token)
        bar.close(stats, result.summary())
        raise BatchInterrupted(result, plan.checkpoint) from None
    finish(plan, result, stats, token)
    bar.close(stats, result.summary())
    if failure:
        raise failure[0]
    return result


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
    token = cancel if cancel is not None else CancelToken()
    if executor is not None:
        from .cluster import run_on_dask

        try:
            return await asyncio.to_thread(run_on_dask, plan, executor, cancel=token,
                                           progress=progress, partition_size=partition_size)
        except asyncio.CancelledError:
            token.cancel("the awaiting task was cancelled")
            raise
    result, stats = _new_result(plan)
    bar = BatchProgress(progress_mode(progress), description=f"batch {plan.model_key}")

    async def refresh() -> None:
        while True:
            bar.update(stats)
            await asyncio.sleep(PROGRESS_INTERVAL)

    ticker = asyncio.create_task(refresh()) if bar.mode != "off" else None
    try:
        await run_local(plan, result, stats, token, close_adapter=False)
    finally:
        if ticker is not None:
            ticker.cancel()
        finish(plan, result, stats, token)
        bar.close(stats, result.summary())
    return result
