"""What a batch gives back: :class:`BatchResult`, a sequence of answers in input order."""

from __future__ import annotations

import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, overload

from ..budget import Budget
from ..cost import CostTotal, format_usd
from ..errors import BudgetExceededError, DispatchError
from ..types import Response, Usage

__all__ = ["BatchInterrupted", "BatchResult", "RowOrigin"]


class RowOrigin:
    """Where a row's item came from (the codes kept per row in :class:`BatchResult`)."""

    SENT = 0  #: asked of the model in this run
    CHECKPOINT = 1  #: answered in an earlier run (read from the checkpoint)
    REPLAYED = 2  #: answered from the response cache (nothing sent)
    NOT_RUN = 3  #: never sent (the batch was cancelled first, or the template failed)

    NAMES = ("sent", "checkpoint", "replayed", "not run")


@dataclass
class _Totals:
    retries: int = 0
    rate_limited: int = 0
    model_calls: int = 0


class BatchResult(Sequence[Any]):
    """The answers of a batch, in input order: ``result[i]`` is row ``i``'s
    :class:`~dispatch_nb.types.Response`, or the :class:`~dispatch_nb.errors.DispatchError` that
    row ended with (one failure never loses the rest).

    Totals: ``usage`` (every row's tokens, failed attempts' partial answers included),
    ``ok`` / ``failed`` counts, ``sent`` (rows asked of the model in this run), ``resumed`` (rows
    read from the checkpoint), ``replayed`` (rows answered by the response cache), ``retries``,
    ``rate_limited`` (429s seen), ``model_calls`` (calls that reached the model, tool rounds
    included), ``premium_requests`` (GitHub Copilot: model calls × the model's premium
    multiplier, when known), ``elapsed`` (seconds), ``lowest_concurrency`` (how far rate limits
    pushed the batch down), ``interrupted``. Per row: :meth:`latency`, :meth:`origin`,
    :meth:`usage_of`. :meth:`to_pandas` puts the answers beside the input.
    """

    def __init__(self, source: Any = None, *, model: str = "") -> None:
        self._items: list[Any] = []
        self._latency = array.array("d")
        self._attempts = array.array("l")
        self._origin = bytearray()
        self._input_tokens = array.array("q")
        self._output_tokens = array.array("q")
        self._source = source
        #: ``provider:model`` of the batch
        self.model = model
        #: every row's tokens
        self.usage = Usage()
        #: wall-clock seconds the batch took
        self.elapsed = 0.0
        #: True when Ctrl-C or a cancel token stopped the batch before every row finished
        self.interrupted = False
        #: the lowest the adaptive concurrency went (rate limits halve it)
        self.lowest_concurrency: float | None = None
        #: Copilot premium requests this run used (model calls × the model's multiplier), if known
        self.premium_requests: float | None = None
        #: ``budget=`` of the run (its ``spent`` and ``remaining``), if one was given
        self.budget: Budget | None = None
        self._totals = _Totals()

    # -- filling (the engine) --------------------------------------------------------------------
    def _reserve(self, position: int) -> None:
        while len(self._items) <= position:
            self._items.append(None)
            self._latency.append(0.0)
            self._attempts.append(0)
            self._origin.append(RowOrigin.NOT_RUN)
            self._input_tokens.append(0)
            self._output_tokens.append(0)

    def _set(self, position: int, item: Response | DispatchError, *, usage: Usage,
             latency: float, attempts: int, origin: int) -> None:
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
        """``"sent"``, ``"checkpoint"``, ``"replayed"`` or ``"not run"``."""
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
        """Rows that ended with an error (cancelled rows included)."""
        return len(self._items) - self.ok

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
    def retries(self) -> int:
        """Retried requests (rate limits, dropped connections, server errors)."""
        return self._totals.retries

    @property
    def rate_limited(self) -> int:
        """HTTP 429 answers the batch received."""
        return self._totals.rate_limited

    @property
    def model_calls(self) -> int:
        """Calls that reached the model in this run (tool rounds included; replays excluded)."""
        return self._totals.model_calls

    @property
    def cost(self) -> CostTotal:
        """What this run's answers cost (docs/cost.md): rows sent now at their price, replayed
        rows as saved; rows read from the checkpoint were paid for by the run that answered
        them and are not counted. Answers whose price is unknown are counted in ``unknown``."""
        total = CostTotal()
        for item, origin in zip(self._items, self._origin, strict=False):
            if isinstance(item, Response) and origin != RowOrigin.CHECKPOINT:
                total.add(item.cost)
        return total

    @property
    def errors(self) -> list[tuple[int, DispatchError]]:
        """``(position, error)`` of every row that failed."""
        return [(i, item) for i, item in enumerate(self._items) if not isinstance(item, Response)]

    @property
    def responses(self) -> list[Response | None]:
        """Each row's Response, None where the row failed."""
        return [item if isinstance(item, Response) else None for item in self._items]

    @property
    def texts(self) -> list[str | None]:
        """Each row's answer text, None where the row failed."""
        return [item.text if isinstance(item, Response) else None for item in self._items]

    def raise_for_errors(self) -> BatchResult:
        """Raise the first row error (with how many rows failed), else return self."""
        errors = self.errors
        if errors:
            position, error = errors[0]
            raise type(error)(
                f"{len(errors)} of {len(self)} rows failed; row {position}: {error.message}",
                status_code=error.status_code, provider=error.provider, code=error.code,
            ) from error
        return self

    # -- display ---------------------------------------------------------------------------------
    def summary(self) -> str:
        """One line: rows, ok, failed, where answers came from, tokens, time."""
        parts = [f"{len(self):,} rows: {self.ok:,} ok"]
        if self.failed:
            parts[-1] += f", {self.failed:,} failed"
        origins = []
        if self.resumed:
            origins.append(f"{self.resumed:,} from the checkpoint")
        if self.replayed:
            origins.append(f"{self.replayed:,} replayed from the cache")
        if self.sent and origins:
            origins.append(f"{self.sent:,} sent")
        if origins:
            parts.append(", ".join(origins))
        tokens = self.usage.input_tokens + self.usage.output_tokens
        parts.append(f"{tokens:,} tokens ({self.usage.input_tokens:,} in, "
                     f"{self.usage.output_tokens:,} out)")
        cost = self.cost
        if cost.calls and (cost.calls > cost.unknown or cost.premium_requests is not None):
            parts.append(str(cost) + (f" of a {format_usd(self.budget.usd)} budget"
                                      if self.budget is not None else ""))
        over = sum(1 for item in self._items if isinstance(item, BudgetExceededError))
        if over:
            parts.append(f"{over:,} not sent (over budget)")
        if self.rate_limited:
            parts.append(f"{self.rate_limited:,} rate-limited")
        if self.interrupted:
            parts.append("interrupted")
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
        return "\n".join(lines)

    # -- pandas ----------------------------------------------------------------------------------
    COLUMNS = ("answer", "error", "stop_reason", "input_tokens", "output_tokens", "latency_s",
               "origin")

    def to_pandas(self, *, prefix: str = "") -> Any:
        """A pandas DataFrame: the input (when it was a DataFrame, a Series or a list kept in
        memory; not an iterator) with the columns ``answer``, ``error``, ``stop_reason``,
        ``input_tokens``, ``output_tokens``, ``latency_s`` and ``origin`` added (each name
        preceded by ``prefix``), one row per input row, on the input's index. A batch run with
        ``output=`` also has ``parsed``: each row's validated object (``None`` for a failed row);
        ``pd.json_normalize`` turns its fields into columns."""
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
        kind = getattr(source, "kind", None)
        if kind == "dataframe" and kept is not None and len(kept) == n:
            clash = sorted(set(added) & {str(c) for c in kept.columns})
            if clash:
                raise ValueError(
                    f"the input already has column(s) {', '.join(clash)}; call "
                    "to_pandas(prefix='llm_') to name the added columns apart"
                )
            frame = kept.copy()
            for name, values in added.items():
                frame[name] = values
            return frame
        if kind in ("series", "sequence") and kept is not None and len(kept) == n:
            index = getattr(source, "index", None)
            rows = list(kept)
            if rows and all(isinstance(r, dict) for r in rows):
                frame = pd.DataFrame(rows, index=index)
                clash = sorted(set(added) & {str(c) for c in frame.columns})
                if clash:
                    raise ValueError(
                        f"the rows already have key(s) {', '.join(clash)}; call "
                        "to_pandas(prefix='llm_') to name the added columns apart"
                    )
                for name, values in added.items():
                    frame[name] = values
                return frame
            column = getattr(kept, "name", None) or "row"
            data = {str(column): rows, **added}
            return pd.DataFrame(data, index=index)
        return pd.DataFrame(added)


class BatchInterrupted(KeyboardInterrupt):
    """Ctrl-C stopped :func:`~dispatch_nb.batch`: every row that finished is in ``result`` (and in
    the checkpoint, when there is one; rerun to send only the rest)."""

    def __init__(self, result: BatchResult, checkpoint: str | None = None) -> None:
        where = (f"; they are also in {checkpoint}: run the batch again to send only the rest"
                 if checkpoint else "; pass checkpoint='run.jsonl' to resume a batch later")
        finished = sum(1 for i in range(len(result)) if result.origin(i) != "not run"
                       and not _is_cancelled(result[i]))
        super().__init__(
            f"batch interrupted: {finished:,} finished rows are kept in this exception's "
            f".result (in IPython: sys.last_value.result){where}"
        )
        #: the partial result: finished rows, and RequestCancelled for the others
        self.result = result


def _is_cancelled(item: Any) -> bool:
    from ..errors import RequestCancelled

    return isinstance(item, RequestCancelled)
