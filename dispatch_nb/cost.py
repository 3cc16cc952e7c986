"""What answers cost: :class:`Cost` per answer, :class:`CostTotal` sums, :func:`estimate` before
sending, :class:`Budget` for ``budget=`` (see docs/cost.md).

Prices come from ``genai-prices`` (pydantic's maintained price database), its data bundled with
the installed package: nothing is fetched at run time. A provider's answers are priced under the
``genai-prices`` provider id of its :class:`~dispatch_nb.registry.ProviderDescriptor`
(``price_provider``); a provider without one (the embedded model, OpenAI-compatible servers) or a
model the data does not know has an unknown price: ``None``, never zero.

Usage maps onto ``genai-prices``' like this: its ``input_tokens`` are all input tokens (ours plus
cache reads and writes), ``cache_read_tokens`` / ``cache_write_tokens`` are priced at their own
rates, and reasoning tokens are part of ``output_tokens`` (as every provider reports them).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from decimal import ROUND_HALF_UP, Decimal
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict

from .errors import BudgetExceededError

if TYPE_CHECKING:
    from .adapter import Adapter
    from .cancel import CancelToken
    from .types import Message, Response, Usage

__all__ = [
    "PREMIUM_REQUEST_USD",
    "Budget",
    "Cost",
    "CostTotal",
    "Estimate",
    "add_costs",
    "estimate",
    "format_usd",
    "ledger",
    "price",
]

#: GitHub's published overage price of one Copilot premium request (what the ``%chat cost``
#: table multiplies premium requests by, labelled as such)
PREMIUM_REQUEST_USD = Decimal("0.04")
#: chars per token of the approximation used where no tokenizer is at hand
CHARS_PER_TOKEN = 4
#: tokens a request adds per message, and once, around what the text counts (roles, framing)
MESSAGE_OVERHEAD_TOKENS = 8
REQUEST_OVERHEAD_TOKENS = 16


def _usd(value: Decimal | None) -> str:
    return "unknown" if value is None else format_usd(value)


def format_usd(value: Decimal) -> str:
    """``$0.0031``: two significant digits below a cent, up to four places below a dollar,
    cents from a dollar up (halves rounded up)."""
    if value == 0:
        return "$0"
    if abs(value) >= 1:
        return f"${value.quantize(Decimal('0.01'), ROUND_HALF_UP):,}"
    if abs(value) >= Decimal("0.01"):
        text = f"{value.quantize(Decimal('0.0001'), ROUND_HALF_UP)}".rstrip("0")
        return "$" + (text + "0" if len(text.split(".")[1]) < 2 else text)
    places = -value.adjusted() + 1  # two significant digits
    return f"${value.quantize(Decimal(1).scaleb(-places), ROUND_HALF_UP)}"


def _premium(value: float) -> str:
    shown = f"{value:g}"
    return f"{shown} premium request" + ("" if value == 1 else "s")


class Cost(BaseModel):
    """What one answer cost, from the usage the provider reported for the successful attempt.

    ``usd`` = ``input_usd`` + ``output_usd`` (``Decimal`` dollars, as ``genai-prices``
    computes them). ``premium_requests``: GitHub Copilot's premium requests for the call (the
    model's multiplier from ``/models``; 0 for included models and for the follow-up calls of a
    tool loop), ``None`` elsewhere. ``usd`` is ``None`` only for a Copilot answer whose premium
    requests are known but whose dollar price is not. ``source`` names the price data and the
    date the price was taken for. ``replayed``: the answer came from the response cache — it
    cost ``usd`` when it was recorded and nothing now (equality ignores it).
    """

    model_config = ConfigDict(extra="forbid")

    usd: Decimal | None
    input_usd: Decimal | None = None
    output_usd: Decimal | None = None
    premium_requests: float | None = None
    source: str = ""
    replayed: bool = False

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Cost):
            return NotImplemented
        return self.model_dump(exclude={"replayed"}) == other.model_dump(exclude={"replayed"})

    __hash__ = None  # type: ignore[assignment]

    @property
    def spent_usd(self) -> Decimal | None:
        """What it costs now: ``usd``, or 0 for a replayed answer."""
        return Decimal(0) if self.replayed else self.usd

    def label(self) -> str:
        """The footer's words: ``$0.0031``, ``1 premium request``, ``$0 · 1 premium request``,
        with ``(replayed, was $0.0031)`` for a replayed answer."""
        parts = []
        if self.usd is not None:
            parts.append(format_usd(self.usd))
        if self.premium_requests is not None:
            parts.append(_premium(self.premium_requests))
        text = " · ".join(parts) or "price unknown"
        return f"$0 now (replayed; was {text})" if self.replayed else text

    def __str__(self) -> str:
        return self.label()


def _sum(a: Any, b: Any) -> Any:
    return None if a is None or b is None else a + b


def add_costs(a: Cost | None, b: Cost | None) -> Cost | None:
    """The cost of two calls that make one answer (e.g. the attempts of ``output=``); ``None``
    when either is unknown."""
    if a is None or b is None:
        return None
    return Cost(usd=_sum(a.usd, b.usd), input_usd=_sum(a.input_usd, b.input_usd),
                output_usd=_sum(a.output_usd, b.output_usd),
                premium_requests=_sum(a.premium_requests, b.premium_requests),
                source=b.source, replayed=a.replayed and b.replayed)


def _genai() -> Any:
    """``genai_prices``, imported on first use (None where it is not installed)."""
    try:
        import genai_prices
    except ImportError:  # Python 3.10: genai-prices needs 3.11
        return None
    return genai_prices


def price(provider: str, model: str, usage: Usage, *, when: datetime | None = None,
          premium_requests: float | None = None) -> Cost | None:
    """The :class:`Cost` of ``usage`` on ``provider:model`` (dispatch_nb's provider names), or
    ``None`` when its price is unknown. ``when``: the time of the request (default: now)."""
    from .registry import find_descriptor

    descriptor = find_descriptor(provider)
    price_id = descriptor.price_provider if descriptor is not None else None
    found = _calc(price_id, model, usage, when) if price_id and model else None
    if found is None:
        if premium_requests is None:
            return None
        return Cost(usd=None, premium_requests=premium_requests,
                    source=f"GitHub Copilot /models multiplier (no dollar price for {model})")
    calc, source = found
    return Cost(usd=calc.total_price, input_usd=calc.input_price, output_usd=calc.output_price,
                premium_requests=premium_requests, source=source)


def genai_usage(usage: Usage) -> Any:
    """``usage`` as a ``genai_prices.Usage`` (input tokens include cache reads and writes)."""
    genai = _genai()
    assert genai is not None
    return genai.Usage(
        input_tokens=usage.input_tokens + usage.cache_read_tokens + usage.cache_creation_tokens,
        cache_read_tokens=usage.cache_read_tokens,
        cache_write_tokens=usage.cache_creation_tokens,
        output_tokens=usage.output_tokens,
    )


def _calc(price_id: str, model: str, usage: Usage, when: datetime | None) -> tuple[Any, str] | None:
    genai = _genai()
    if genai is None:
        return None
    when = when or datetime.now(timezone.utc)
    try:
        calc = genai.calc_price(genai_usage(usage), model, provider_id=price_id,
                                genai_request_timestamp=when)
    except LookupError:
        return None
    source = (f"genai-prices {genai.__version__} ({calc.provider.id} {calc.model.id}, "
              f"prices of {when.date().isoformat()})")
    return calc, source


# -- sums -----------------------------------------------------------------------------------------
@dataclass
class CostTotal:
    """The sum of many answers' costs (``Session.cost``, ``BatchResult.cost``).

    ``usd``: what the answers with a known price cost now (replayed answers count 0);
    ``unknown``: how many answers have no known price (never counted as 0 silently);
    ``replayed`` / ``saved_usd``: answers replayed from the cache and what they cost when recorded;
    ``premium_requests``: Copilot's (``None`` when no answer had any).
    """

    calls: int = 0
    usd: Decimal = Decimal(0)
    input_usd: Decimal = Decimal(0)
    output_usd: Decimal = Decimal(0)
    premium_requests: float | None = None
    unknown: int = 0
    replayed: int = 0
    saved_usd: Decimal = Decimal(0)

    def add(self, cost: Cost | None) -> None:
        """Count one answer's cost (``None``: its price is unknown)."""
        self.calls += 1
        if cost is None:
            self.unknown += 1
            return
        if cost.premium_requests is not None and not cost.replayed:
            self.premium_requests = (self.premium_requests or 0) + cost.premium_requests
        if cost.usd is None:
            self.unknown += 1
            return
        if cost.replayed:
            self.replayed += 1
            self.saved_usd += cost.usd
            return
        self.usd += cost.usd
        self.input_usd += cost.input_usd or 0
        self.output_usd += cost.output_usd or 0

    @classmethod
    def of(cls, costs: Iterable[Cost | None]) -> CostTotal:
        total = cls()
        for cost in costs:
            total.add(cost)
        return total

    @property
    def known(self) -> bool:
        """Whether every answer's price is known."""
        return self.unknown == 0

    def __str__(self) -> str:
        parts = [format_usd(self.usd)]
        if self.premium_requests is not None:
            parts.append(_premium(self.premium_requests))
        text = " · ".join(parts)
        notes = []
        if self.unknown:
            notes.append(f"{self.unknown} of {self.calls} answers' price unknown, not counted")
        if self.replayed:
            notes.append(f"{self.replayed} replayed, saved {format_usd(self.saved_usd)}")
        return text + (f" ({'; '.join(notes)})" if notes else "")


# -- the kernel's ledger --------------------------------------------------------------------------
@dataclass
class LedgerRow:
    """One model's spend in this process (``%chat cost``)."""

    provider: str
    model: str
    calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    cost: CostTotal = field(default_factory=CostTotal)


class Ledger:
    """Every answer this process received (sent or replayed), by ``provider:model``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rows: dict[tuple[str, str], LedgerRow] = {}

    def record(self, provider: str, model: str, usage: Usage, cost: Cost | None) -> None:
        with self._lock:
            row = self._rows.get((provider, model))
            if row is None:
                row = self._rows[(provider, model)] = LedgerRow(provider, model)
            row.cost.add(cost)
            if cost is not None and cost.replayed:
                return  # nothing was sent: its tokens are the recording's, not this kernel's
            row.calls += 1
            row.input_tokens += usage.input_tokens + usage.cache_creation_tokens
            row.output_tokens += usage.output_tokens
            row.cached_tokens += usage.cache_read_tokens

    def rows(self) -> list[LedgerRow]:
        with self._lock:
            return list(self._rows.values())

    def clear(self) -> None:
        with self._lock:
            self._rows.clear()


#: this process's ledger (``%chat cost`` shows it)
ledger = Ledger()


# -- before sending: token counts, worst cases, estimates ------------------------------------------
def _text_of(messages: list[Message], system: str | None, tools: Iterable[Any] | None) -> str:
    parts = [system or ""]
    for message in messages:
        for block in message.blocks:
            parts.append(block.model_dump_json(exclude={"type", "provider_data"}))
    for tool in tools or ():
        dump = getattr(tool, "model_dump_json", None)
        parts.append(dump() if dump is not None else str(tool))
    return "".join(parts)


def token_bound(messages: list[Message], system: str | None = None,
                tools: Iterable[Any] | None = None) -> int:
    """An upper bound of a request's input tokens without a tokenizer: its UTF-8 bytes (a BPE
    token is at least one byte) plus framing. What a budget reserves, so it cannot be beaten."""
    text = _text_of(messages, system, tools)
    return (len(text.encode()) + REQUEST_OVERHEAD_TOKENS
            + MESSAGE_OVERHEAD_TOKENS * (len(messages) + 1))


def approximate_tokens(messages: list[Message], system: str | None = None,
                       tools: Iterable[Any] | None = None) -> int:
    """About how many input tokens: ~4 characters a token, plus framing. An approximation."""
    text = _text_of(messages, system, tools)
    return (-(-len(text) // CHARS_PER_TOKEN) + REQUEST_OVERHEAD_TOKENS
            + MESSAGE_OVERHEAD_TOKENS * len(messages))


def _max_tokens(adapter: Adapter, max_tokens: int | None) -> int:
    value = max_tokens if max_tokens is not None else adapter.default_max_tokens
    if value is None:
        raise ValueError(f"budget= needs max_tokens= for {adapter.provider_name}:"
                         f"{adapter.model_name} (the most one answer may cost depends on it)")
    return int(value)


def worst_case(adapter: Adapter, messages: list[Message], *, system: str | None = None,
               tools: Iterable[Any] | None = None, max_tokens: int | None = None) -> Decimal:
    """The most one request can cost: :func:`token_bound` input tokens and ``max_tokens`` output.
    Raises ``ValueError`` when the model's price is unknown (a budget cannot be kept then)."""
    from .types import Usage

    usage = Usage(input_tokens=token_bound(messages, system, tools),
                  output_tokens=_max_tokens(adapter, max_tokens))
    cost = price(adapter.provider_name, adapter.model_name, usage)
    if cost is None or cost.usd is None:
        raise ValueError(
            f"budget= needs a known price, and {adapter.provider_name}:{adapter.model_name} has "
            "none in genai-prices' data (see docs/cost.md); drop budget= for this model"
        )
    return cost.usd


class Estimate(BaseModel):
    """What a cell or a batch would cost, before anything is sent (:func:`estimate`).

    ``input_tokens`` is the provider's own count where it has one (``counted_by``:
    ``"count_tokens"`` for Anthropic's endpoint, ``"tokenizer"`` for the embedded model) and
    otherwise ``"approximation"`` (about 4 characters a token); ``approximate`` says whether the
    number is one. ``max_output_usd`` is the most the output could cost (every row writing
    ``max_tokens``); the answer costs between ``low_usd`` (the input alone) and ``high_usd``
    (input + the most output). ``None`` where the price is unknown.
    """

    model: str
    rows: int
    input_tokens: int
    counted_by: str
    approximate: bool
    max_tokens: int
    input_usd: Decimal | None = None
    max_output_usd: Decimal | None = None
    low_usd: Decimal | None = None
    high_usd: Decimal | None = None
    premium_requests: float | None = None
    source: str = ""

    def summary(self) -> str:
        """One line: rows, tokens, the USD range."""
        rows = f"{self.rows:,} row{'s' if self.rows != 1 else ''} · " if self.rows != 1 else ""
        tokens = (f"{'~' if self.approximate else ''}{self.input_tokens:,} input tokens "
                  f"({self.counted_by})")
        if self.low_usd is not None and self.high_usd is not None:
            money = f"{format_usd(self.low_usd)} – {format_usd(self.high_usd)}"
        else:
            money = "price unknown"
        text = (f"{self.model}: {rows}{tokens} + at most {self.rows * self.max_tokens:,} output "
                f"tokens · {money}")
        if self.premium_requests is not None:
            text += f" · {_premium(self.premium_requests)}"
        return text

    def __str__(self) -> str:
        return self.summary()


def _count(adapter: Adapter, messages: list[Message], system: str | None) -> int:
    try:
        return int(adapter.count_tokens(messages, system=system))
    except Exception:
        return -1


#: rows counted by the provider's own counter; more rows are scaled from these (approximate)
COUNTED_ROWS = 20


def estimate(template: Any, rows: Any = None, *, model: Adapter | str,
             max_tokens: int | None = None, system: str | None = None,
             namespace: Any = None) -> Estimate:
    """What sending ``template`` (once, or filled from each of ``rows`` as :func:`batch` would)
    to ``model`` could cost — nothing is sent to the model. See :class:`Estimate`."""
    from .adapter import Adapter
    from .batching.rows import RowSource, fill_template
    from .registry import connect
    from .types import as_messages

    adapter = model if isinstance(model, Adapter) else connect(model)
    try:
        prompts: list[list[Message]] = []
        if rows is None:
            prompts.append(as_messages(template))
        else:
            source = RowSource(rows, namespace=namespace)
            for _position, row in source:
                filled = fill_template(template, row, source.namespace(row))
                prompts.append(as_messages(filled.messages))
        limit = _max_tokens(adapter, max_tokens)
        counted_by, exact = "approximation", False
        total = 0
        sample = [_count(adapter, m, system) for m in prompts[:COUNTED_ROWS]]
        if sample and all(n >= 0 for n in sample):
            counted_by = ("tokenizer" if adapter.provider_name == "local" else "count_tokens")
            total = sum(sample)
            exact = len(prompts) <= COUNTED_ROWS
            if not exact:
                chars = sum(len(_text_of(m, system, None)) for m in prompts[:COUNTED_ROWS])
                rest = sum(len(_text_of(m, system, None)) for m in prompts[COUNTED_ROWS:])
                total += round(rest * total / max(chars, 1))
                counted_by += f" for the first {COUNTED_ROWS} rows, scaled"
        else:
            total = sum(approximate_tokens(m, system) for m in prompts)
        from .types import Usage

        premium = _premium_estimate(adapter, len(prompts))
        low = price(adapter.provider_name, adapter.model_name, Usage(input_tokens=total))
        high = price(adapter.provider_name, adapter.model_name,
                     Usage(input_tokens=total, output_tokens=limit * len(prompts)))
        known = low is not None and high is not None and low.usd is not None \
            and high.usd is not None
        return Estimate(
            model=f"{adapter.provider_name}:{adapter.model_name}", rows=len(prompts),
            input_tokens=total, counted_by=counted_by, approximate=not exact, max_tokens=limit,
            input_usd=low.usd if known and low else None,
            max_output_usd=(high.usd - low.usd) if known and high and low and high.usd is not None
            and low.usd is not None else None,
            low_usd=low.usd if known and low else None,
            high_usd=high.usd if known and high else None,
            premium_requests=premium, source=high.source if high is not None else "",
        )
    finally:
        if not isinstance(model, Adapter):
            adapter.close()


def _premium_estimate(adapter: Adapter, calls: int) -> float | None:
    multiplier = getattr(adapter, "premium_multiplier", None)
    if not callable(multiplier):
        return None
    try:
        value = multiplier()
    except Exception:
        return None
    return None if value is None else float(value) * calls


# -- budgets --------------------------------------------------------------------------------------
class Budget:
    """``budget=``: dollars a batch or a session may spend. Before each request its worst case
    is reserved (:meth:`reserve`); the answer's real cost replaces the reservation
    (:meth:`settle`). A request whose worst case does not fit in what is left — spent plus
    reserved — is not sent: :class:`~dispatch_nb.errors.BudgetExceededError`. So the spending
    never exceeds the budget, however many requests are in flight."""

    def __init__(self, usd: float | Decimal | str) -> None:
        if isinstance(usd, bool):
            raise TypeError("budget= is an amount of US dollars, e.g. budget=0.50")
        try:
            amount = Decimal(str(usd))
        except Exception:
            raise TypeError(f"budget= is an amount of US dollars, e.g. budget=0.50; not {usd!r}") \
                from None
        if not amount.is_finite() or amount < 0:
            raise ValueError(f"budget= must be a non-negative amount of US dollars, not {usd!r}")
        self.usd = amount
        self.spent = Decimal(0)
        self.reserved = Decimal(0)
        self._lock = threading.Lock()
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []

    @classmethod
    def of(cls, value: Budget | float | Decimal | str | None) -> Budget | None:
        """``budget=`` as given: a Budget (shared), an amount, or None."""
        if value is None or isinstance(value, Budget):
            return value
        return cls(value)

    @property
    def remaining(self) -> Decimal:
        """What may still be spent or reserved."""
        return self.usd - self.spent - self.reserved

    def _refusal(self, worst: Decimal) -> BudgetExceededError:
        return BudgetExceededError(
            f"not sent: this request could cost up to {format_usd(worst)} and "
            f"{format_usd(max(self.remaining, Decimal(0)))} of the {format_usd(self.usd)} "
            f"budget is left ({format_usd(self.spent)} spent); run it again with a larger budget=",
        )

    def reserve(self, worst: Decimal) -> Decimal:
        """Reserve ``worst`` dollars now or raise :class:`BudgetExceededError`."""
        with self._lock:
            if worst > self.remaining:
                raise self._refusal(worst)
            self.reserved += worst
            return worst

    async def areserve(self, worst: Decimal, cancel: CancelToken | None = None) -> Decimal:
        """Reserve ``worst``; while it does not fit but other requests are in flight, wait for
        them to settle (they usually cost less than they reserved). Raises
        :class:`BudgetExceededError` when it cannot fit."""
        loop = asyncio.get_running_loop()
        while True:
            with self._lock:
                if worst <= self.remaining:
                    self.reserved += worst
                    return worst
                if self.reserved <= 0 or (cancel is not None and cancel.cancelled):
                    raise self._refusal(worst)
                waiter: asyncio.Future[None] = loop.create_future()
                self._waiters.append((loop, waiter))
            try:
                await asyncio.wait_for(asyncio.shield(waiter), 0.5)
            except asyncio.TimeoutError:
                pass

    def settle(self, reserved: Decimal, spent: Decimal | None) -> None:
        """A request that reserved ``reserved`` ended having cost ``spent`` (``None``: unknown,
        counted as what was reserved)."""
        with self._lock:
            self.reserved -= reserved
            self.spent += reserved if spent is None else spent
            waiters, self._waiters = self._waiters, []
        for loop, waiter in waiters:
            try:
                loop.call_soon_threadsafe(_wake, waiter)
            except RuntimeError:
                pass

    def __repr__(self) -> str:
        return (f"Budget(usd={self.usd}, spent={self.spent}, reserved={self.reserved})")


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


def attempt_cost(response: Response | None, failed: bool, reserved: Decimal) -> Decimal | None:
    """What an attempt cost for a budget: a finished answer's price; a failed attempt that had
    started answering counts what it reserved (a provider may bill what it generated), one that
    failed before any output counts 0 (nothing is billed)."""
    if response is None:
        return Decimal(0)
    if not failed:
        cost = response.cost
        return cost.spent_usd if cost is not None else None
    if response.content or response.usage.output_tokens:
        return reserved
    return Decimal(0)


