"""What answers cost: :class:`Cost` per answer, :class:`CostTotal` sums, the process's
:data:`ledger` (``%chat cost``), priced from ``genai-prices``' bundled data (docs/cost.md). This
module imports nothing of dispatch_nb: the registry fills :data:`PRICE_PROVIDERS` and
:data:`FREE_PROVIDERS`.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from decimal import ROUND_HALF_UP, Decimal
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict

__all__ = [
    "FREE_PROVIDERS",
    "PREMIUM_REQUEST_USD",
    "PRICE_PROVIDERS",
    "Cost",
    "CostTotal",
    "add_costs",
    "attempt_cost",
    "format_usd",
    "ledger",
    "premium_words",
    "price",
]


class UsageLike(Protocol):
    """What a price is computed from (:class:`dispatch_nb.types.Usage`)."""

    input_tokens: int
    output_tokens: int
    cache_read_tokens: int
    cache_creation_tokens: int


#: dispatch_nb provider name → ``genai-prices`` provider id: each
#: :class:`~dispatch_nb.registry.ProviderDescriptor`'s ``price_provider``, kept here by the
#: registry as providers are registered (this module imports nothing of dispatch_nb)
PRICE_PROVIDERS: dict[str, str | None] = {}
#: the providers whose answers cost nothing (they run on this machine): priced at $0, a known
#: price, where other providers without a price are unknown (``ProviderDescriptor.free``)
FREE_PROVIDERS: set[str] = set()

#: GitHub's published overage price of one Copilot premium request (what the ``%chat cost``
#: table multiplies premium requests by, labelled as such)
PREMIUM_REQUEST_USD = Decimal("0.04")


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
    return f"${value.quantize(Decimal(1).scaleb(-places), ROUND_HALF_UP):f}"  # never 1.0E-7


def premium_words(value: float) -> str:
    shown = f"{value:g}"
    return f"{shown} premium request" + ("" if value == 1 else "s")


class Cost(BaseModel):
    """What one answer cost, from the usage the provider reported for the successful attempt
    (docs/cost.md): ``usd`` = ``input_usd`` + ``output_usd`` (``Decimal`` dollars; ``None`` only
    for a Copilot answer known by its ``premium_requests`` alone), ``source`` (the price data and
    its date), ``replayed`` (from the response cache: nothing spent now; equality ignores it)."""

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

    @property
    def spent_usd(self) -> Decimal | None:
        """What it costs now: ``usd``, or 0 for a replayed answer."""
        return Decimal(0) if self.replayed else self.usd

    def label(self) -> str:
        """The footer's words: ``$0.0031``, ``1 premium request``, ``$0 · 1 premium request``,
        ``$0.0031 when recorded, $0 now`` for a replayed answer."""
        parts = []
        if self.usd is not None:
            parts.append(format_usd(self.usd))
        if self.premium_requests is not None:
            parts.append(premium_words(self.premium_requests))
        text = " · ".join(parts) or "price unknown"
        return f"{text} when recorded, $0 now" if self.replayed else text

    __str__ = label


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


def price(provider: str, model: str, usage: UsageLike, *, premium_requests: float | None = None,
          batch: bool = False) -> Cost | None:
    """The :class:`Cost` of ``usage`` on ``provider:model`` (dispatch_nb's provider names) now,
    or ``None`` when its price is unknown. ``batch``: answered through the provider's batch
    API, at its batch price."""
    if provider in FREE_PROVIDERS:
        return Cost(usd=Decimal(0), input_usd=Decimal(0), output_usd=Decimal(0),
                    source="runs on this machine: no charge")
    price_id = PRICE_PROVIDERS.get(provider)
    genai = _genai() if price_id and model else None
    calc = None
    when = datetime.now(timezone.utc)
    if genai is not None:
        # genai-prices' input tokens are all of them (ours plus cache reads and writes), the
        # cache's priced at their own rates; reasoning tokens are output tokens, as every
        # provider reports them
        priced = genai.Usage(
            input_tokens=usage.input_tokens + usage.cache_read_tokens
            + usage.cache_creation_tokens, cache_read_tokens=usage.cache_read_tokens,
            cache_write_tokens=usage.cache_creation_tokens, output_tokens=usage.output_tokens,
        )
        with contextlib.suppress(LookupError):
            calc = genai.calc_price(priced, model, provider_id=price_id,
                                    genai_request_timestamp=when,
                                    price_context={"processing": "batch"} if batch else None)
    if calc is None:
        if premium_requests is None:
            return None
        return Cost(usd=None, premium_requests=premium_requests,
                    source=f"GitHub Copilot /models multiplier (no dollar price for {model})")
    assert genai is not None
    source = (f"genai-prices {genai.__version__} ({calc.provider.id} {calc.model.id}"
              f"{', batch price' if batch else ''}, prices of {when.date().isoformat()})")
    return Cost(usd=calc.total_price, input_usd=calc.input_price, output_usd=calc.output_price,
                premium_requests=premium_requests, source=source)


#: taken for good by the first :func:`warm_up` that starts loading the price data
_loading = threading.Lock()


def warm_up(provider: str) -> None:
    """Load ``genai-prices`` (its data takes a moment to import) on a background thread, once,
    when a priced provider's first request starts — so pricing its answer does not hold up the
    event loop. Does nothing for providers without a price."""
    if PRICE_PROVIDERS.get(provider) and _loading.acquire(blocking=False):
        threading.Thread(target=_load, name="dispatch_nb-prices", daemon=True).start()


def _load() -> None:
    genai = _genai()
    if genai is not None:
        with contextlib.suppress(LookupError):
            genai.calc_price(genai.Usage(input_tokens=1), "gpt-4.1")  # loads the price data


# -- sums -----------------------------------------------------------------------------------------
@dataclass
class CostTotal:
    """The sum of many answers' costs (``Session.cost``, ``BatchResult.cost``): ``usd`` is what
    the answers with a known price cost now; the others are counted in ``unknown``, never as 0
    (docs/cost.md)."""

    calls: int = 0
    usd: Decimal = Decimal(0)
    input_usd: Decimal = Decimal(0)
    output_usd: Decimal = Decimal(0)
    premium_requests: float | None = None
    unknown: int = 0
    replayed: int = 0
    saved_usd: Decimal = Decimal(0)

    def add(self, cost: Cost | None, *, replayed: bool = False) -> None:
        """Count one answer's cost (``None``: its price is unknown). A replayed answer
        (``replayed``, or ``cost.replayed``) cost nothing now, whether its price is known or not:
        it counts in ``replayed``, and its recorded price, when known, in ``saved_usd``."""
        self.calls += 1
        if replayed or (cost is not None and cost.replayed):
            self.replayed += 1
            if cost is not None and cost.usd is not None:
                self.saved_usd += cost.usd
            return
        if cost is not None and cost.premium_requests is not None:
            self.premium_requests = (self.premium_requests or 0) + cost.premium_requests
        if cost is None or cost.usd is None:
            self.unknown += 1
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
        # no answer sent had a price: no sum to show (an unknown price is never $0)
        unpriced = self.unknown and self.unknown + self.replayed == self.calls
        parts = ["price unknown" if unpriced else format_usd(self.usd)]
        if self.premium_requests is not None:
            parts.append(premium_words(self.premium_requests))
        text = " · ".join(parts)
        notes = []
        if self.unknown:
            notes.append(f"{self.unknown} of {self.calls} answers' price unknown"
                         + ("" if unpriced else ", not counted"))
        if self.replayed:
            saved = f", saved {format_usd(self.saved_usd)}" if self.saved_usd else ""
            notes.append(f"{self.replayed} replayed{saved}")
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

    def record(self, provider: str, model: str, usage: UsageLike, cost: Cost | None, *,
               replayed: bool = False) -> None:
        """Enter one answer (``replayed``: the response cache replayed it, nothing was sent)."""
        with self._lock:
            row = self._rows.setdefault((provider, model), LedgerRow(provider, model))
            row.cost.add(cost, replayed=replayed)
            if replayed or (cost is not None and cost.replayed):
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


def attempt_cost(response: Any, failed: bool, reserved: Decimal) -> Decimal | None:
    """What an attempt cost, for a budget: a finished answer's price (``None``: unknown); a failed
    attempt that had started answering counts what it reserved (a provider may bill what it
    generated), one that failed before any output counts 0 (nothing is billed)."""
    if response is None:
        return Decimal(0)
    if not failed:
        cost: Cost | None = response.cost
        return cost.spent_usd if cost is not None else None
    if response.content or response.usage.output_tokens:
        return reserved
    return Decimal(0)
