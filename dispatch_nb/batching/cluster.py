"""The same batch on a Dask cluster: ``batch(..., executor=distributed.Client(...))``; each
partition runs :class:`~dispatch_nb.batching.engine.RowRunner` on a worker, through an adapter
the worker builds from the model spec (docs/batch.md, "On a Dask cluster").
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

from ..adapter import Adapter
from ..cache import ResponseCache
from ..cancel import CancelToken
from ..errors import DispatchError
from ..types import Response, Usage
from .checkpoint import Checkpoint, shared_checkpoint
from .engine import BatchSettings, Pending, RowRunner, resume
from .plan import aclose_adapter, resolve_adapter
from .progress import BatchProgress
from .result import BatchResult, RowOrigin, is_not_sent, mark_not_sent, not_sent
from .rows import RowCall

__all__ = ["PartitionTask", "run_on_dask", "run_partition"]

#: seconds between a worker's looks at the batch's cancel event
CANCEL_POLL = 0.5
#: seconds Ctrl-C waits for running partitions to hand back their finished rows
CANCEL_GRACE = 10.0


def _require_distributed() -> Any:
    try:
        import distributed
    except ImportError:
        raise ImportError(
            "executor= runs the batch on Dask, which is not installed: "
            "pip install 'dispatch-nb[dask]'"
        ) from None
    return distributed


@dataclass
class PartitionTask:
    """What one partition ships to a worker: no adapter and no credential, by design."""

    model: str
    rows: list[Pending]
    call: RowCall
    settings: BatchSettings
    checkpoint: str | None
    cache: tuple[str, str, str] | None  # (path, mode, pace)
    cancel_event: str | None
    #: a row of the batch was answered before this partition was submitted (the server can be
    #: reached: a failed connection does not stop the batch)
    answered: bool = False


# -- on the worker --------------------------------------------------------------------------------
def run_partition(task: PartitionTask) -> BatchResult:
    """Run one partition on this worker (a Dask task; also callable directly): its rows, at their
    positions, and the engine's counters."""
    cache = None
    if task.cache is not None:
        path, mode, pace = task.cache
        cache = ResponseCache(path, mode, pace="recorded" if pace == "recorded" else "instant")
    adapter = resolve_adapter(task.model, cache)
    result = BatchResult(model=task.model)
    checkpoint = shared_checkpoint(task.checkpoint) if task.checkpoint is not None else None
    if checkpoint is not None and not checkpoint.path.exists():
        raise FileNotFoundError(
            f"the checkpoint {checkpoint.path} is not reachable from this Dask worker: with "
            "executor=, the checkpoint must be on a filesystem the workers share with the "
            "client (the same machine, or a shared mount)"
        )
    # A partition re-run after its worker died: rows that worker finished are not sent again.
    pending = [row for row in task.rows if checkpoint is None
               or not resume(result, row.position, checkpoint.answer(row.key), RowOrigin.SENT)]
    token = CancelToken()
    finished = threading.Event()
    watcher = _watch(task.cancel_event, token, finished)
    runner = RowRunner(adapter, task.call, task.settings, result=result, cancel=token,
                       checkpoint=checkpoint, answered=task.answered)

    async def go() -> None:
        try:
            await runner.run(iter(pending))
        finally:
            await aclose_adapter(adapter)

    try:
        asyncio.run(go())
        if result.stopped_by is not None:  # partitions started from now on send nothing
            _stop(_event(task.cancel_event))
        for row in pending:  # rows the stopped runner never read
            if row.position >= len(result) or result[row.position] is None:
                result._set(row.position, not_sent(result, token))
    finally:
        finished.set()
        if watcher is not None:
            watcher.join(CANCEL_POLL * 2)
    result.lowest_concurrency = runner.limiter.lowest
    return result


def _event(name: str | None) -> Any:
    """The batch's Dask event, or None (no name, or not inside a worker with a scheduler)."""
    if name is None:
        return None
    distributed = _require_distributed()
    try:
        return distributed.Event(name)
    except Exception:  # not inside a worker with a scheduler (a direct call): nothing to watch
        return None


def _watch(name: str | None, token: CancelToken,
           finished: threading.Event) -> threading.Thread | None:
    """Cancel ``token`` when the batch's Dask event is set (polled from a thread; checked once
    at once, so a partition started after the batch stopped sends nothing)."""
    event = _event(name)
    if event is None:
        return None
    with contextlib.suppress(Exception):
        if event.is_set():
            token.cancel("the batch was cancelled")
            return None

    def loop() -> None:
        while not finished.is_set():
            try:
                if event.wait(CANCEL_POLL):
                    token.cancel("the batch was cancelled")
                    return
            except Exception:
                if finished.wait(CANCEL_POLL):
                    return

    thread = threading.Thread(target=loop, name="dispatch_nb-batch-cancel", daemon=True)
    thread.start()
    return thread


# -- on the client --------------------------------------------------------------------------------
def dask_partition_size(plan: Any, client: Any, partition_size: int | None) -> int:
    """The rows per partition of ``plan`` (a :class:`~dispatch_nb.batching.plan.BatchPlan`) on
    ``client``, once ``executor=`` and the plan are checked for Dask."""
    distributed = _require_distributed()
    if isinstance(plan.model, Adapter):
        raise TypeError(
            "with executor=, pass model as a spec string (e.g. 'openai:gpt-4.1'): each worker "
            "builds its own adapter from it, with credentials from the worker's environment or "
            "token store. An Adapter object holds credentials and is never shipped to workers."
        )
    if not isinstance(client, distributed.Client):
        raise TypeError(f"executor must be a dask.distributed.Client, not {type(client).__name__}")
    size = partition_size if partition_size is not None else max(4, 2 * plan.settings.concurrency)
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ValueError(f"partition_size must be a positive integer, not {partition_size!r}")
    return size


def run_on_dask(plan: Any, client: Any, result: BatchResult, bar: BatchProgress, *,
                cancel: CancelToken, size: int) -> None:
    """Run ``plan``'s rows on ``client``'s workers into ``result``; Ctrl-C waits a moment for
    the partitions running to hand back what finished, then raises."""
    distributed = _require_distributed()
    cache = plan.cache
    cache_spec = (str(cache.path.absolute()), cache.mode, cache.pace) if cache is not None else None
    checkpoint = Checkpoint(plan.checkpoint) if plan.checkpoint is not None else None
    if checkpoint is not None:
        checkpoint.path.parent.mkdir(parents=True, exist_ok=True)
        checkpoint.path.touch()  # the workers check they see this file (a shared filesystem)
    event_name = f"dispatch-nb-batch-{uuid.uuid4().hex}"
    stop_event = distributed.Event(event_name, client=client)
    remove_callback = cancel.add_callback(lambda: _stop(stop_event))
    stats = result._stats
    rows = plan.rows(checkpoint, result)
    threads = sum(client.nthreads().values()) or 2  # no worker yet: assume two threads
    ahead = 2 * threads + 2  # partitions submitted at a time
    outstanding: dict[Any, list[int]] = {}  # future → the positions of its rows
    exhausted = False

    def submit_more() -> None:
        nonlocal exhausted
        while not exhausted and len(outstanding) < ahead and not cancel.cancelled \
                and result.stopped_by is None:
            part = list(itertools.islice(rows, size))
            if not part:
                exhausted = True
                return
            task = PartitionTask(
                model=plan.model, rows=part,
                call=plan.call, settings=plan.settings,
                checkpoint=str(checkpoint.path) if checkpoint is not None else None,
                cache=cache_spec, cancel_event=event_name,
                answered=stats.ok > stats.resumed + stats.replayed,
            )
            future = client.submit(run_partition, task, pure=False,
                                   key=f"dispatch-nb-partition-{uuid.uuid4().hex}")
            outstanding[future] = [p.position for p in part]
            stats.in_flight += len(part)

    def collect(future: Any) -> None:
        positions = outstanding.pop(future)
        stats.in_flight -= len(positions)
        if future.status == "cancelled":
            for position in positions:
                mark_not_sent(result, position, cancel)
            return
        try:
            part: BatchResult = future.result()
        except (TypeError, ValueError, FileNotFoundError):
            raise  # the request or the setup is wrong (a rejected option, an unreachable
            # checkpoint): every row would fail alike
        except Exception as exc:  # the task failed (e.g. its workers kept dying): its rows fail
            for position in positions:
                error = DispatchError(
                    f"the Dask task running this row failed: {type(exc).__name__}: {exc}",
                    code="executor_failed",
                )
                result._set(position, error, origin=RowOrigin.SENT)
                stats.failed += 1
            return
        if part.stopped_by is not None and result.stopped_by is None:
            result.stopped_by = part.stopped_by
            _stop(stop_event)
        result.retries += part.retries
        result.rate_limited += part.rate_limited
        result.model_calls += part.model_calls
        stats.rate_limited += part.rate_limited
        result.lowest_concurrency = min(
            (low for low in (result.lowest_concurrency, part.lowest_concurrency) if low), default=None)
        for position, item in enumerate(part):
            if item is None:
                continue
            if is_not_sent(item) and not cancel.cancelled:  # the batch stopped: say why
                item = not_sent(result, cancel)
            tokens_in, tokens_out = part.usage_of(position)
            usage = Usage(input_tokens=tokens_in, output_tokens=tokens_out)
            if isinstance(item, Response):
                usage = usage.model_copy(update={
                    "cache_read_tokens": item.usage.cache_read_tokens,
                    "cache_creation_tokens": item.usage.cache_creation_tokens})
            origin = part._origin[position]
            result._set(position, item, usage=usage, latency=part.latency(position),
                        attempts=part.attempts(position), origin=origin)
            stats.count(item, origin, usage)
            if origin == RowOrigin.SENT and stats.first_sent is None:
                stats.first_sent = stats.started
            elif origin == RowOrigin.REPLAYED:
                stats.replayed += 1

    def pump(deadline: float) -> None:
        submit_more()
        while outstanding:
            if time.monotonic() >= deadline:
                return
            for future in [f for f in outstanding if f.done()]:
                collect(future)
            submit_more()
            bar.update(stats)
            if outstanding:
                time.sleep(0.05)

    try:  # cancelling the token sets the stop event (its callback)
        pump(math.inf)
    except KeyboardInterrupt:
        cancel.cancel("interrupted (KeyboardInterrupt)")
        with contextlib.suppress(KeyboardInterrupt, Exception):
            pump(time.monotonic() + CANCEL_GRACE)
        _cancel_rest(client, outstanding)
        raise
    except BaseException:
        cancel.cancel("the batch failed")
        _cancel_rest(client, outstanding)
        raise
    finally:
        remove_callback()


def _stop(event: Any) -> None:
    """Tell every partition to stop: running ones end their rows in flight and hand back what
    finished; ones not started yet start, see the event, and end at once."""
    with contextlib.suppress(Exception):
        event.set()


def _cancel_rest(client: Any, outstanding: dict[Any, list[int]]) -> None:
    with contextlib.suppress(Exception):
        client.cancel(list(outstanding))
