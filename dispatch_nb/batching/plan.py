"""A batch's plan (its arguments, checked by :mod:`.run`) and its rows, the adapter they go
through, and its final accounting — what the local run (:mod:`.run`), the Dask run
(:mod:`.cluster`) and the deferred run (:mod:`.deferred`) share."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ..adapter import Adapter
from ..cache import CachedAdapter, ResponseCache
from ..cancel import CancelToken
from ..errors import DispatchError, RequestCancelled, RequestError
from ..registry import qualify_model_spec
from ..replay_only import connect_for_cache
from ..types import Message
from .checkpoint import Checkpoint
from .engine import BatchSettings, Pending, resume
from .result import NOT_SENT, BatchResult, RowOrigin, mark_not_sent, not_sent
from .rows import RowCall, RowSource, TemplateError, fill_template, row_key

__all__ = ["BatchPlan", "aclose_adapter", "finish", "resolve_adapter"]

log = logging.getLogger("dispatch_nb")


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

    @property
    def model_key(self) -> str:
        """``provider:model``, the model's part of every row key (a bare model name replays as
        the provider's that recorded it: :meth:`ResponseCache.qualify`)."""
        if isinstance(self.model, Adapter):
            return self.model.spec
        return self.cache.qualify(self.model) if self.cache is not None \
            else qualify_model_spec(self.model)

    #: a retry's plan (its ``source``: some of the batch's rows): each row's position and key in
    #: the whole batch (``run.retry_failed``), so that a retried answer is recorded where a rerun
    #: of the whole batch finds it, as that row; ``None`` (or a ``None`` key): ``source``'s own
    whole: list[tuple[int, str | None]] | None = None

    def keyed(self) -> Iterator[tuple[int, Any, str | list[Message] | TemplateError, str | None]]:
        """Each row of ``source``: its position, the row, its filled template (or the
        :class:`TemplateError` filling it raised) and its key (``None`` when the template
        failed). The ``n``-th repeat of a request in the input is keyed ``…#n``."""
        material, model = self.call.key_material(), self.model_key
        seen: dict[str, int] = {}
        for position, row in self.source:
            try:
                messages = fill_template(self.template, row, self.source.namespace(row))
            except TemplateError as exc:
                yield position, row, exc, None
                continue
            base = row_key(model, messages, material)
            occurrence = seen.get(base, 0)
            seen[base] = occurrence + 1
            yield position, row, messages, base if occurrence == 0 else f"{base}#{occurrence}"

    def rows(self, checkpoint: Checkpoint | None, result: BatchResult) -> Iterator[Pending]:
        """Fill each row's template and yield the rows to send; rows answered in the checkpoint
        and rows whose template fails go straight into ``result``. The first row's template
        failure is raised (the template is wrong, not the row)."""
        for position, _row, messages, key in self.keyed():
            result._reserve(position)
            number, given = (position, None) if self.whole is None else self.whole[position]
            if isinstance(messages, TemplateError):
                if position == 0:
                    raise messages
                result._set(position, RequestError(
                    f"row {number}: the template could not be filled: {messages}",
                    code="invalid_request"))
                result._stats.failed += 1
                continue
            key = given or key
            assert key is not None
            if checkpoint is None or not resume(result, position, checkpoint.answer(key)):
                yield Pending(position, messages, key, None if self.whole is None else number)


def resolve_adapter(model: Adapter | str, cache: ResponseCache | None) -> Adapter:
    """The adapter rows go through (behind the response cache when one is given)."""
    # connect_for_cache: connect(), but in replay mode the model need not be able to run here
    adapter = model if isinstance(model, Adapter) else connect_for_cache(
        cache.qualify(model) if cache is not None else model, cache.mode if cache is not None else "off")
    if cache is not None and cache.mode != "off":
        adapter = CachedAdapter(adapter, cache)
    return adapter


async def aclose_adapter(adapter: Adapter) -> None:
    """Close an adapter the batch built; errors are ignored."""
    with contextlib.suppress(Exception):
        await adapter.aclose()


def finish(plan: BatchPlan, result: BatchResult, cancel: CancelToken) -> None:
    """Mark rows never sent as such (a cancelled or stopped batch over a sized input: the rows
    not read yet too) and set totals."""
    for position, item in enumerate(result._items):
        if item is None:  # handed out, never finished (the engine stopped abruptly): maybe sent
            result._set(position, RequestCancelled("not finished: the batch was stopped"),
                        origin=RowOrigin.SENT)
            result._stats.cancelled += 1
        elif isinstance(item, DispatchError) and item.code == NOT_SENT and item.__cause__ is None \
                and result.stopped_by is not None and not cancel.cancelled:
            # marked before the row that stopped the batch was known (a Dask partition that saw
            # the stop event and was collected before the partition that set it): say why now
            result._items[position] = not_sent(result, cancel)
    total = plan.source.total
    if total is not None and len(result) < total \
            and (cancel.cancelled or result.stopped_by is not None):
        for position in range(len(result), total):
            mark_not_sent(result, position, cancel)
    result.interrupted = cancel.cancelled
    result.elapsed = time.monotonic() - result._stats.started
    if result.resumed:
        log.info("batch %s: %d of %d rows were already answered in %s; sent %d", plan.model_key,
                 result.resumed, len(result), plan.checkpoint, result.sent)

