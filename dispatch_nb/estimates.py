"""Before sending: what a request could cost. :func:`estimate` (``dispatch_nb.estimate``) for a
cell or a batch, :func:`worst_case` for a budget (docs/cost.md)."""

from __future__ import annotations

from collections.abc import Iterable
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from .cost import format_usd, premium_words, price
from .types import ImageBlock, Message, ToolResultBlock, Usage, as_messages

if TYPE_CHECKING:
    from .adapter import Adapter

__all__ = ["Estimate", "approximate_tokens", "estimate", "token_bound", "worst_case"]

#: chars per token of the approximation used where no tokenizer is at hand
CHARS_PER_TOKEN = 4
#: tokens a request adds per message, and once, around what the text counts (roles, framing)
MESSAGE_OVERHEAD_TOKENS = 8
REQUEST_OVERHEAD_TOKENS = 16
#: tokens an image costs at most (providers scale an image down before they count it: Anthropic
#: ~1,600 tokens at most, OpenAI's high detail a few thousand), and about what it costs
IMAGE_TOKEN_BOUND = 6000
IMAGE_TOKENS = 1600


def _text_of(messages: list[Message], system: str | None,
             tools: Iterable[Any] | None) -> tuple[str, int]:
    """The request's text as JSON (what framing and text cost) and its number of images (counted
    apart: an image's bytes are not its tokens)."""
    parts, images = [system or ""], 0
    for message in messages:
        for block in message.blocks:
            if isinstance(block, ImageBlock):
                images += 1
                continue
            if isinstance(block, ToolResultBlock) and block.images:
                images += len(block.images)
                block = block.model_copy(update={"content": [
                    b for b in block.content if not isinstance(b, ImageBlock)]})
            parts.append(block.model_dump_json(exclude={"type", "provider_data"}))
    for tool in tools or ():
        dump = getattr(tool, "model_dump_json", None)
        parts.append(dump() if dump is not None else str(tool))
    return "".join(parts), images


def token_bound(messages: list[Message], system: str | None = None,
                tools: Iterable[Any] | None = None) -> int:
    """An upper bound of a request's input tokens without a tokenizer: its UTF-8 bytes (a BPE
    token is at least one byte) plus framing. What a budget reserves, so it cannot be beaten."""
    text, images = _text_of(messages, system, tools)
    return (len(text.encode()) + IMAGE_TOKEN_BOUND * images + REQUEST_OVERHEAD_TOKENS
            + MESSAGE_OVERHEAD_TOKENS * (len(messages) + 1))


def approximate_tokens(messages: list[Message], system: str | None = None,
                       tools: Iterable[Any] | None = None) -> int:
    """About how many input tokens: ~4 characters a token, plus framing. An approximation."""
    text, images = _text_of(messages, system, tools)
    return (-(-len(text) // CHARS_PER_TOKEN) + IMAGE_TOKENS * images + REQUEST_OVERHEAD_TOKENS
            + MESSAGE_OVERHEAD_TOKENS * len(messages))


def _max_tokens(adapter: Adapter, max_tokens: int | None) -> int:
    value = max_tokens if max_tokens is not None else adapter.default_max_tokens
    if value is None:
        raise ValueError(f"budget= needs max_tokens= for {adapter.provider_name}:"
                         f"{adapter.model_name} (the most one answer may cost depends on it)")
    return int(value)


#: bytes a structured request may add around its schema (the instructions of prompt mode)
OUTPUT_PROMPT_BYTES = 1024


def worst_case(adapter: Adapter, messages: list[Message], *, system: str | None = None,
               tools: Iterable[Any] | None = None, max_tokens: int | None = None,
               output: Any = None, batch: bool = False) -> Decimal:
    """The most one request can cost: :func:`token_bound` input tokens (with ``output=``'s
    schema, which may be sent in the prompt) and ``max_tokens`` output (``batch``: at the
    provider's batch price). Raises ``ValueError`` when the model's price is unknown (a budget
    cannot be kept then)."""
    bound = token_bound(messages, system, tools)
    if output is not None:
        import json

        from .structured import as_output

        bound += len(json.dumps(as_output(output).schema).encode()) + OUTPUT_PROMPT_BYTES
    usage = Usage(input_tokens=bound, output_tokens=_max_tokens(adapter, max_tokens))
    cost = price(adapter.provider_name, adapter.model_name, usage, batch=batch)
    if cost is None or cost.usd is None:
        raise ValueError(
            f"budget= needs a known price, and {adapter.spec} has "
            "none in genai-prices' data (see docs/cost.md); drop budget= for this model"
        )
    return cost.usd


class Estimate(BaseModel):
    """What a cell or a batch would cost, before anything is sent (:func:`estimate`): between
    ``low_usd`` (the input alone) and ``high_usd`` (input + every row writing ``max_tokens``),
    ``None`` where the price is unknown; how ``input_tokens`` was counted: docs/cost.md."""

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
    #: priced at the provider's batch price (``estimate(..., batch=True)``)
    batch: bool = False

    def summary(self) -> str:
        """One line: rows, tokens, the USD range."""
        rows = f"{self.rows:,} rows · " if self.rows != 1 else ""
        tokens = (f"{'~' if self.approximate else ''}{self.input_tokens:,} input tokens "
                  f"({self.counted_by})")
        if self.low_usd is not None and self.high_usd is not None:
            money = format_usd(self.low_usd) + ("" if self.low_usd == self.high_usd
                                                else f" – {format_usd(self.high_usd)}")
            money += " at the batch price" if self.batch else ""
        else:
            money = "price unknown"
        text = (f"{self.model}: {rows}{tokens} + at most {self.rows * self.max_tokens:,} output "
                f"tokens · {money}")
        if self.premium_requests is not None:
            text += f" · {premium_words(self.premium_requests)}"
        return text

    __str__ = summary


def _count(adapter: Adapter, messages: list[Message], system: str | None) -> int:
    try:
        return int(adapter.count_tokens(messages, system=system))
    except Exception:
        return -1


#: rows counted by the provider's own counter; more rows are scaled from these (approximate)
COUNTED_ROWS = 20


def estimate(template: Any, rows: Any = None, *, model: Adapter | str,
             max_tokens: int | None = None, system: str | None = None,
             namespace: Any = None, batch: bool = False) -> Estimate:
    """What sending ``template`` (once, or filled from each of ``rows`` as :func:`batch` would)
    to ``model`` could cost — nothing is sent to the model. See :class:`Estimate`.
    ``batch=True``: at the provider's batch price (``batch(..., deferred=True)``)."""
    from .batching.rows import RowSource, fill_template
    from .registry import connect

    owned = isinstance(model, str)
    adapter = connect(model) if isinstance(model, str) else model
    try:
        if rows is None:
            prompts = [as_messages(template)]
        else:
            source = RowSource(rows, namespace=namespace)
            prompts = [as_messages(fill_template(template, row, source.namespace(row)))
                       for _position, row in source]
        limit = _max_tokens(adapter, max_tokens)
        counted_by, exact = "approximation", False
        sample = [_count(adapter, m, system) for m in prompts[:COUNTED_ROWS]]
        if sample and all(n >= 0 for n in sample):
            counted_by = adapter.token_counter
            total = sum(sample)
            exact = len(prompts) <= COUNTED_ROWS
            if not exact:
                chars = sum(approximate_tokens(m, system) for m in prompts[:COUNTED_ROWS])
                rest = sum(approximate_tokens(m, system) for m in prompts[COUNTED_ROWS:])
                total += round(rest * total / max(chars, 1))
                counted_by += f" for the first {COUNTED_ROWS} rows, scaled"
        else:
            total = sum(approximate_tokens(m, system) for m in prompts)
        premium = _premium_estimate(adapter, len(prompts))
        low = price(adapter.provider_name, adapter.model_name, Usage(input_tokens=total),
                    batch=batch)
        high = price(adapter.provider_name, adapter.model_name,
                     Usage(input_tokens=total, output_tokens=limit * len(prompts)), batch=batch)
        low_usd = low.usd if low is not None else None
        high_usd = high.usd if high is not None else None
        if low_usd is None or high_usd is None:  # a range needs both ends
            low_usd = high_usd = None
        return Estimate(
            model=adapter.spec, rows=len(prompts),
            input_tokens=total, counted_by=counted_by, approximate=not exact, max_tokens=limit,
            input_usd=low_usd, low_usd=low_usd, high_usd=high_usd,
            max_output_usd=None if low_usd is None or high_usd is None else high_usd - low_usd,
            premium_requests=premium, source=high.source if high is not None else "",
            batch=batch,
        )
    finally:
        if owned:
            adapter.close()


def _premium_estimate(adapter: Adapter, calls: int) -> float | None:
    multiplier = getattr(adapter, "premium_multiplier", None)
    if not callable(multiplier):
        return None
    try:
        value = multiplier()
        if value is None:  # the model list is read once (GET /models: no prompt is sent)
            adapter.list_models()
            value = multiplier()
    except Exception:
        return None
    return None if value is None else float(value) * calls
