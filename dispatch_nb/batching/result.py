"""What a batch gives back: :class:`BatchResult`, a sequence of answers in input order."""

from __future__ import annotations

import array
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, overload

from ..budget import Budget
from ..cancel import CancelToken
from ..cost import CostTotal, format_usd
from ..errors import (
    AuthenticationError,
    BudgetExceededError,
    DispatchError,
    ModelUnavailableError,
    RequestCancelled,
)
from ..types import Response, Usage

__all__ = ["NOT_SENT", "BatchInterrupted", "BatchResult", "RowOrigin", "Stats", "is_cancelled",
           "is_not_sent", "mark_not_sent", "not_sent", "row_status", "stops_batch"]

#: the ``code`` of a row's error when the batch never sent the row (it stopped first)
NOT_SENT = "not_sent"


class RowOrigin:
    """Where a row's item came from (the codes kept per row in :class:`BatchResult`)."""

    SENT = 0  #: asked of the model in this run
    CHECKPOINT = 1  #: answered in an earlier run (read from the checkpoint)
    REPLAYED = 2  #: answered from the response cache (nothing sent)
    NOT_SENT = 3  #: never sent (the batch stopped first, or the row's template failed)

    NAMES = ("sent", "checkpoint", "replayed", "not sent")


def stops_batch(error: DispatchError) -> bool:
    """Whether every later row would end with ``error`` too, so the batch stops sending: a
    rejected credential, an exhausted quota (not an ordinary rate limit, which is retried), a
    model the provider does not know, or a request refused before it was sent for an option every
    row shares (``option_refused``: ``max_tokens`` under the Responses API's minimum, ``stop=``
    there), never for one row's content."""
    return isinstance(error, (AuthenticationError, ModelUnavailableError)) \
        or error.code == "quota_exceeded" or error.option_refused


def not_sent(result: BatchResult, cancel: CancelToken) -> DispatchError:
    """The item of a row ``result``'s batch never sent: code :data:`NOT_SENT`; a
    :class:`~dispatch_nb.errors.RequestCancelled` when Ctrl-C or the cancel token stopped the
    batch, else a :class:`~dispatch_nb.errors.DispatchError` whose ``__cause__`` is the error
    the batch stopped at (:attr:`BatchResult.stopped_by`). No provider: the row never reached
    one (so every such row reads the same, wherever the batch marked it)."""
    cause = None
    if cancel.cancelled:
        reason = cancel.reason or "the batch was cancelled"
    elif result.stopped_by is not None:
        position, cause = result.stopped_by
        reason = (f"the batch stopped at row {position}'s {type(cause).__name__} "
                  f"({cause.code}), which every row would get: {cause.message}")
    else:
        reason = "the batch was stopped"
    cls = RequestCancelled if cancel.cancelled else DispatchError
    error = cls(f"not sent: {reason}", code=NOT_SENT)
    error.__cause__ = cause
    return error


def mark_not_sent(result: BatchResult, position: int, cancel: CancelToken) -> None:
    """Row ``position`` was never sent: the batch was cancelled or stopped first."""
    result._set(position, not_sent(result, cancel))
    result._stats.not_sent += 1


def is_not_sent(item: Any) -> bool:
    """Whether ``item`` is a row the batch never sent (stopped first, or over its budget)."""
    return isinstance(item, DispatchError) and item.code in (NOT_SENT, "budget_exceeded")


def is_cancelled(item: Any) -> bool:
    """Whether ``item`` is a row that was sent and then stopped in flight (Ctrl-C, the cancel
    token, or the batch stopping): cancelled, neither failed nor never sent."""
    return isinstance(item, RequestCancelled) and not is_not_sent(item)


def row_status(item: Any) -> str:
    """How a row ended: ``"ok"``, ``"not sent"``, ``"cancelled"`` or ``"failed"``."""
    return "ok" if isinstance(item, Response) else "not sent" if is_not_sent(item) \
        else "cancelled" if is_cancelled(item) else "failed"


@dataclass
class Stats:
    """Live counters for the progress display (read from another thread: plain ints)."""

    total: int | None = None
    ok: int = 0
    failed: int = 0
    cancelled: int = 0
    not_sent: int = 0
    in_flight: int = 0
    resumed: int = 0
    replayed: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    rate_limited: int = 0
    started: float = field(default_factory=time.monotonic)
    first_sent: float | None = None
    sent_done: int = 0
    #: a deferred batch's jobs, one line (``openai job batch_…: in_progress, 340 of 1,000 answered``)
    job: str = ""

    @property
    def finished(self) -> int:
        return self.ok + self.failed + self.cancelled + self.not_sent

    def count(self, item: Any, origin: int, usage: Usage) -> None:
        """One row ended as ``item`` (an answer or an error); ``origin``: a :class:`RowOrigin` code."""
        status = row_status(item).replace(" ", "_")  # the counter of that name
        setattr(self, status, getattr(self, status) + 1)
        if origin == RowOrigin.SENT:
            self.sent_done += 1
        self.input_tokens += usage.input_tokens
        self.output_tokens += usage.output_tokens


class BatchResult(Sequence[Any]):
    """The answers of a batch, in input order: ``result[i]`` is row ``i``'s
    :class:`~dispatch_nb.types.Response`, or the :class:`~dispatch_nb.errors.DispatchError` that
    row ended with (one failure never loses the rest). Its totals and per-row facts: the table
    in docs/batch.md, "The result"."""

    def __init__(self, source: Any = None, *, model: str = "") -> None:
        self._items: list[Any] = []
        self._latency = array.array("d")
        self._attempts = array.array("l")
        self._origin = bytearray()
        self._input_tokens = array.array("q")
        self._output_tokens = array.array("q")
        self._source = source
        #: the live counters the progress bar shows
        self._stats = Stats(total=source.total if source is not None else None)
        #: ``provider:model`` of the batch
        self.model = model
        self.usage = Usage()
        self.elapsed = 0.0
        self.interrupted = False
        self.stopped_by: tuple[int, DispatchError] | None = None
        self.lowest_concurrency: float | None = None
        self.premium_requests: float | None = None
        #: ``budget=`` of the run (its ``spent`` and ``remaining``), if one was given
        self.budget: Budget | None = None
        self.retries = 0
        self.rate_limited = 0
        self.model_calls = 0
        #: a deferred batch's provider jobs (:class:`~dispatch_nb.batching.deferred.BatchJob`),
        #: None for a live batch
        self.job: Any = None
        self._plan: Any = None  # what the batch was asked (for retry_failed)
        self._deferred: Any = None  # the deferred run (for refresh / wait)
        self._retry: Any = None  # run.retry_failed (for retry_failed)
        self._progress_setting: bool | str | None = None  # progress= (for retry_failed)
        #: the notebook output the progress bar ended in (a display handle; None: there was none)
        self._progress_output: Any = None

    # -- filling (the engine) --------------------------------------------------------------------
    def _reserve(self, position: int) -> None:
        while len(self._items) <= position:
            self._items.append(None)
            self._latency.append(0.0)
            self._attempts.append(0)
            self._origin.append(RowOrigin.NOT_SENT)
            self._input_tokens.append(0)
            self._output_tokens.append(0)

    def _set(self, position: int, item: Response | DispatchError, *,
             origin: int = RowOrigin.NOT_SENT, usage: Usage | None = None, latency: float = 0.0,
             attempts: int = 0) -> None:
        """Row ``position`` ended as ``item`` (the defaults: a row never sent)."""
        usage = usage if usage is not None else Usage()
        self._reserve(position)
        self._items[position] = item
        self._latency[position] = latency
        self._attempts[position] = attempts
        self._origin[position] = origin
        self._input_tokens[position] = usage.input_tokens
        self._output_tokens[position] = usage.output_tokens
        self.usage = self.usage + usage

    # -- the sequence ----------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._items)

    @overload
    def __getitem__(self, index: int) -> Any: ...

    @overload
    def __getitem__(self, index: slice) -> list[Any]: ...

    def __getitem__(self, index: int | slice) -> Any:
        return self._items[index]

    def __iter__(self) -> Iterator[Any]:
        return iter(self._items)

    # -- per row ---------------------------------------------------------------------------------
    def latency(self, position: int) -> float:
        """Seconds row ``position`` took (all its attempts; 0 for rows not sent)."""
        return self._latency[position]

    def attempts(self, position: int) -> int:
        """Requests row ``position`` needed (retries included)."""
        return self._attempts[position]

    def origin(self, position: int) -> str:
        """``"sent"``, ``"checkpoint"``, ``"replayed"`` or ``"not sent"``."""
        return RowOrigin.NAMES[self._origin[position]]

    def usage_of(self, position: int) -> tuple[int, int]:
        """``(input_tokens, output_tokens)`` of row ``position``."""
        return self._input_tokens[position], self._output_tokens[position]

    # -- totals ----------------------------------------------------------------------------------
    @property
    def ok(self) -> int:
        """Rows that have a Response."""
        return sum(1 for item in self._items if isinstance(item, Response))

    @property
    def failed(self) -> int:
        """Rows that ended with an error (not rows cancelled in flight, nor rows never sent)."""
        return len(self._items) - self.ok - self.cancelled - self.not_sent - self.pending

    @property
    def cancelled(self) -> int:
        """Rows sent, then stopped in flight by Ctrl-C, the cancel token or the batch stopping
        (each one's item: a :class:`~dispatch_nb.errors.RequestCancelled` with code
        ``"cancelled"``)."""
        return sum(1 for item in self._items if is_cancelled(item))

    @property
    def pending(self) -> int:
        """A deferred batch's rows whose job has not answered yet
        (:class:`~dispatch_nb.batching.deferred.BatchPendingError`)."""
        return sum(1 for item in self._items
                   if isinstance(item, DispatchError) and item.code == "batch_pending")

    @property
    def not_sent(self) -> int:
        """Rows never sent because the batch stopped first (Ctrl-C, the cancel token, or an
        error every row would get: :attr:`stopped_by`); each one's item is a
        :class:`~dispatch_nb.errors.DispatchError` with code ``"not_sent"``."""
        return sum(1 for item in self._items if is_not_sent(item))

    @property
    def sent(self) -> int:
        """Rows asked of the model in this run."""
        return self._origin.count(RowOrigin.SENT)

    @property
    def resumed(self) -> int:
        """Rows answered in an earlier run, read from the checkpoint."""
        return self._origin.count(RowOrigin.CHECKPOINT)

    @property
    def replayed(self) -> int:
        """Rows answered by the response cache."""
        return self._origin.count(RowOrigin.REPLAYED)

    @property
    def cost(self) -> CostTotal:
        """What this run's answers cost (docs/cost.md): rows sent now at their price, replayed
        rows as saved; rows read from the checkpoint were paid for by the run that answered
        them and are not counted. Answers whose price is unknown are counted in ``unknown``."""
        total = CostTotal()
        for item, origin in zip(self._items, self._origin, strict=False):
            if isinstance(item, Response) and origin != RowOrigin.CHECKPOINT:
                total.add(item.cost, replayed=origin == RowOrigin.REPLAYED)
        return total

    @property
    def errors(self) -> list[tuple[int, DispatchError]]:
        """``(position, error)`` of every row that failed (not the rows cancelled in flight, nor
        the rows never sent)."""
        return [(i, item) for i, item in enumerate(self._items) if row_status(item) == "failed"]

    @property
    def responses(self) -> list[Response | None]:
        """Each row's Response, None where the row failed."""
        return [item if isinstance(item, Response) else None for item in self._items]

    @property
    def texts(self) -> list[str | None]:
        """Each row's answer text, None where the row failed."""
        return [item.text if isinstance(item, Response) else None for item in self._items]

    def raise_for_errors(self) -> BatchResult:
        """Raise the first failed row's error (saying how many rows failed, were cancelled and
        were not sent), or, when no row failed, the first cancelled row's, else the first not
        sent; when every row was answered, return self."""
        items = list(enumerate(self._items))
        groups = [(rows, what) for rows, what in (
            (self.errors, "failed"),
            ([(i, item) for i, item in items if is_cancelled(item)], "were cancelled"),
            ([(i, item) for i, item in items if is_not_sent(item)], "were not sent"),
        ) if rows]
        if not groups:
            return self
        (rows, what), others = groups[0], groups[1:]
        position, error = rows[0]
        also = "".join(f", {len(r):,} {w.removeprefix('were ')}" for r, w in others)
        raise type(error)(
            f"{len(rows):,} of {len(self):,} rows {what}{also}; row {position}: {error.message}",
            status_code=error.status_code, provider=error.provider, code=error.code,
        ) from error

    # -- deferred jobs and retries ---------------------------------------------------------------
    def refresh(self) -> BatchResult:
        """A deferred batch: poll its jobs once and collect the rows of every finished one."""
        self._deferred_run().run_sync(wait=False)
        return self

    def wait(self) -> BatchResult:
        """A deferred batch: poll until every job is collected (Ctrl-C stops the waiting; the
        jobs keep running)."""
        self._deferred_run().run_sync(wait=True)
        return self

    def cancel(self) -> BatchResult:
        """A deferred batch: ask the provider to cancel its running jobs, and collect what they
        hand over within a few seconds (what they finished is kept, and billed; the rows that
        never ran are not sent, and a rerun submits them again)."""
        self._deferred_run().cancel_sync()
        return self

    def _deferred_run(self) -> Any:
        if self._deferred is None:
            raise ValueError("refresh(), wait() and cancel() are for a deferred batch (batch(..., "
                             "deferred=True)); this one ran live and is complete")
        return self._deferred

    def retry_failed(self, *, deferred: bool | None = None) -> BatchResult:
        """Send the rows that have no answer again — failed, cancelled or never sent; only
        those — and put their new answers in place (``deferred``: through the provider's batch
        API or live; default: as this batch ran). Rows not answered yet (a deferred job still
        running) are left alone."""
        if self._retry is None:
            raise ValueError("this BatchResult does not know the batch it came from")
        result: BatchResult = self._retry(self, deferred=deferred)
        return result

    # -- display ---------------------------------------------------------------------------------
    def summary(self) -> str:
        """One line: rows, ok, failed, where answers came from, tokens, time."""
        over = sum(1 for item in self._items if isinstance(item, BudgetExceededError))
        over_budget = "" if not over else " (over budget)" if over == self.not_sent \
            else f" ({over:,} over budget)"
        counts = ((self.failed, "failed"), (self.cancelled, "cancelled"),
                  (self.not_sent, "not sent" + over_budget), (self.pending, "not answered yet"))
        rows = f"{len(self):,} row{'' if len(self) == 1 else 's'}"
        parts = [f"{rows}: {self.ok:,} ok" + "".join(f", {n:,} {what}" for n, what in counts if n)]
        origins = [f"{n:,} {what}" for n, what in ((self.resumed, "from the checkpoint"),
                                                   (self.replayed, "replayed from the cache")) if n]
        if self.sent and origins:
            origins.append(f"{self.sent:,} sent")
        if origins:
            parts.append(", ".join(origins))
        tokens = self.usage.input_tokens + self.usage.output_tokens
        parts.append(f"{tokens:,} tokens ({self.usage.input_tokens:,} in, "
                     f"{self.usage.output_tokens:,} out)")
        cost = self.cost
        sent_priced = cost.calls - cost.replayed - cost.unknown
        if sent_priced or cost.saved_usd or cost.premium_requests is not None:
            parts.append(str(cost) + (f" of a {format_usd(self.budget.usd)} budget"
                                      if self.budget is not None else ""))
        if self.rate_limited:
            parts.append(f"{self.rate_limited:,} rate-limited")
        if self.job is not None:
            parts.append(self.job.summary())
        if self.interrupted:
            parts.append("interrupted")
        if self.stopped_by is not None:
            position, error = self.stopped_by
            parts.append(f"stopped at row {position}: {type(error).__name__} ({error.code})")
        return "; ".join(parts) + f"; {self.elapsed:.1f} s"

    def __repr__(self) -> str:
        return f"BatchResult({self.summary()})"

    def _repr_markdown_(self) -> str:
        lines = [f"**batch** `{self.model}` — {self.summary()}", ""]
        errors = self.errors[:5]
        for position, error in errors:
            lines.append(f"- row {position}: `{type(error).__name__}`: {error.message[:200]}")
        if len(self.errors) > len(errors):
            lines.append(f"- … {len(self.errors) - len(errors):,} more failed rows (`.errors`)")
        if self.stopped_by is not None:
            position, error = self.stopped_by
            lines.append(f"- not sent: {self.not_sent:,} rows, after row {position}'s "
                         f"`{type(error).__name__}` (every row would get it): "
                         f"{error.message[:200]}")
        return "\n".join(lines)

    # -- pandas ----------------------------------------------------------------------------------
    def to_pandas(self, *, prefix: str = "") -> Any:
        """A pandas DataFrame: the input (when it was kept in memory) with the columns of
        docs/batch.md, "The result" added, each name preceded by ``prefix``."""
        try:
            import pandas as pd
        except ImportError:
            raise ImportError(
                "BatchResult.to_pandas() needs pandas: pip install 'dispatch-nb[dask]' "
                "(or pip install pandas)"
            ) from None
        n = len(self)
        added = {
            f"{prefix}answer": [i.text if isinstance(i, Response) else None for i in self._items],
            f"{prefix}error": [None if isinstance(i, Response) or i is None
                               else f"{type(i).__name__}: {i.message}" for i in self._items],
            f"{prefix}status": [row_status(i) for i in self._items],
            f"{prefix}stop_reason": [i.stop_reason if isinstance(i, Response) else None
                                     for i in self._items],
            f"{prefix}input_tokens": list(self._input_tokens),
            f"{prefix}output_tokens": list(self._output_tokens),
            f"{prefix}latency_s": [round(x, 3) for x in self._latency],
            f"{prefix}origin": [RowOrigin.NAMES[o] for o in self._origin],
        }
        parsed = [i.parsed if isinstance(i, Response) else None for i in self._items]
        if any(p is not None for p in parsed):
            added[f"{prefix}parsed"] = parsed
        source = self._source
        kept = getattr(source, "kept", None)
        if kept is None or len(kept) != n:  # an iterator's rows are not kept
            return pd.DataFrame(added)
        if source.kind == "dataframe":
            frame = kept.copy()
        else:
            rows = list(kept)
            if not (rows and all(isinstance(r, dict) for r in rows)):
                column = getattr(kept, "name", None) or "row"
                return pd.DataFrame({str(column): rows, **added}, index=source.index)
            frame = pd.DataFrame(rows, index=source.index)
        clash = sorted(set(added) & {str(c) for c in frame.columns})
        if clash:
            has = ("the input already has column(s)" if source.kind == "dataframe"
                   else "the rows already have key(s)")
            raise ValueError(
                f"{has} {', '.join(clash)}; call to_pandas(prefix='llm_') to name the added "
                "columns apart"
            )
        for name, values in added.items():
            frame[name] = values
        return frame


class BatchInterrupted(KeyboardInterrupt):
    """Ctrl-C stopped :func:`~dispatch_nb.batch`: every row that finished is in ``result`` (and in
    the checkpoint, when there is one; rerun to send only the rest)."""

    def __init__(self, result: BatchResult, checkpoint: str | None = None) -> None:
        where = (f"; they are also in {checkpoint}: run the batch again to send only the rest"
                 if checkpoint else "; pass checkpoint='run.jsonl' to resume a batch later")
        finished = len(result) - result.cancelled - result.not_sent - result.pending
        kept = f"{finished:,} finished row{' is' if finished == 1 else 's are'} kept"
        said = (f"batch interrupted: {kept} in this exception's .result (in IPython: "
                f"sys.last_value.result){where}")
        job = result.job
        if job is not None and result.pending:  # a deferred batch: its jobs are not cancelled
            ids = [part.id for part in job.parts if not part.done] or job.ids
            which = (f"the {job.provider} job {ids[0]} keeps" if len(ids) == 1
                     else f"the {len(ids)} {job.provider} jobs ({', '.join(ids)}) keep")
            pending = f"{result.pending:,} row{'s' if result.pending != 1 else ''}"
            said = (f"stopped waiting: {which} running at the provider ({pending} not answered "
                    f"yet), recorded in {checkpoint}. Run the batch again with that checkpoint, "
                    "or call .result.wait() on this exception (in IPython: "
                    "sys.last_value.result.wait()), to collect the answers; .result.cancel() "
                    f"cancels {'it' if len(ids) == 1 else 'them'}. {kept} in .result")
        super().__init__(said)
        #: the partial result: finished rows, and RequestCancelled for the others (code
        #: ``"not_sent"`` for rows never sent, ``"cancelled"`` for rows stopped in flight)
        self.result = result
