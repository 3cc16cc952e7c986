"""What answers cost (docs/cost.md), against the loopback fakes with real model names: every price
equals genai-prices' own calculation from the usage the fake put on the wire."""

from __future__ import annotations

import asyncio
import contextlib
import io
import re
from collections.abc import Callable, Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import genai_prices
import pytest

from dispatch_nb import (
    BudgetExceededError,
    Cost,
    Response,
    Session,
    abatch,
    batch,
    estimate,
)
from dispatch_nb.adapter import Adapter
from dispatch_nb.budget import Budget
from dispatch_nb.cache import CachedAdapter, ResponseCache
from dispatch_nb.cost import CostTotal, format_usd, ledger
from dispatch_nb.estimates import worst_case
from dispatch_nb.providers.anthropic import AnthropicAdapter
from dispatch_nb.providers.copilot import CopilotAdapter
from dispatch_nb.providers.openai import CompatibleAdapter, OpenAIAdapter
from dispatch_nb.types import Message

from ..fakes.anthropic import AnthropicFake
from ..fakes.copilot import CopilotFake
from ..fakes.openai_chat import OpenAIChatFake
from ..fakes.openai_responses import OpenAIResponsesFake
from ..fakes.provider import Fail, ProviderFake, ToolCall, Turn

USAGE = Turn(text="The answer.", input_tokens=1_234, output_tokens=567, cache_read_tokens=2_048,
             cache_creation_tokens=300)


def _anthropic(fake: ProviderFake, **kw: Any) -> Adapter:
    return AnthropicAdapter("claude-sonnet-4-5", api_key="sk-ant-test", base_url=fake.base_url,
                            **kw)


def _openai(fake: ProviderFake, **kw: Any) -> Adapter:
    return OpenAIAdapter("gpt-4.1", backend="official", base_url=fake.base_url, api_key="sk-test",
                         **kw)


def _copilot(model: str) -> Callable[..., Adapter]:
    def make(fake: ProviderFake, **kw: Any) -> Adapter:
        github = fake.github  # type: ignore[attr-defined]
        return CopilotAdapter(model, github_token=github.github_token,
                              github_url=github.github_url, github_api_url=github.api_url, **kw)

    return make


def _wire(fake: ProviderFake, turn: Turn) -> dict[str, Any]:
    """The usage object the fake sent for ``turn``, as on the wire."""
    if isinstance(fake, AnthropicFake):
        return fake._usage(turn, turn.output_tokens)
    return fake._usage(turn)  # type: ignore[attr-defined]


# name, fake, adapter, genai-prices provider id, extractor flavour, model
PRICED = [
    ("anthropic", lambda: AnthropicFake(api_key="sk-ant-test"), _anthropic, "anthropic",
     "default", "claude-sonnet-4-5"),
    ("openai", lambda: OpenAIResponsesFake(api_key="sk-test"), _openai, "openai", "responses",
     "gpt-4.1"),
    ("copilot", CopilotFake, _copilot("claude-sonnet-4"), "github-copilot", "chat",
     "claude-sonnet-4"),
]


@pytest.fixture(params=PRICED, ids=[p[0] for p in PRICED])
def priced(request: pytest.FixtureRequest) -> Iterator[tuple[ProviderFake, Adapter, str, str, str]]:
    _name, make_fake, make_adapter, price_id, flavor, model = request.param
    with make_fake() as fake:
        adapter = make_adapter(fake, max_retries=1)
        adapter.retry_backoff = 0.01
        yield fake, adapter, price_id, flavor, model
        adapter.close()


def _genai_price(fake: ProviderFake, turn: Turn, price_id: str, flavor: str,
                 model: str) -> Any:
    """genai-prices' own calculation for the usage the fake put on the wire: all input tokens,
    cache reads and writes among them, and the output. Where its extractor reads every one of
    those fields from this wire format, its extraction must agree."""
    usage = genai_prices.Usage(
        input_tokens=turn.input_tokens + turn.cache_read_tokens + turn.cache_creation_tokens,
        cache_read_tokens=turn.cache_read_tokens, cache_write_tokens=turn.cache_creation_tokens,
        output_tokens=turn.output_tokens)
    calc = genai_prices.calc_price(usage, model, provider_id=price_id)
    if price_id != "github-copilot":  # its chat extractor has no cache-write field
        extracted = genai_prices.extract_usage({"model": model, "usage": _wire(fake, turn)},
                                               provider_id=price_id, api_flavor=flavor)
        assert extracted.calc_price().total_price == calc.total_price
    return calc


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_cost_equals_genai_prices_to_the_last_digit(priced: Any, stream: bool, mode: str) -> None:
    fake, adapter, price_id, flavor, model = priced
    fake.push(USAGE)
    if mode == "sync":
        response = adapter.chat("What is it?", stream=stream)
    else:
        response = asyncio.run(adapter.achat("What is it?", stream=stream))
    expected = _genai_price(fake, USAGE, price_id, flavor, model)
    cost = response.cost
    assert cost is not None and cost.usd is not None
    assert expected.total_price > 0
    assert (cost.usd, cost.input_usd, cost.output_usd) == (
        expected.total_price, expected.input_price, expected.output_price)
    assert cost.usd == cost.input_usd + cost.output_usd
    assert f"genai-prices {genai_prices.__version__}" in cost.source
    assert price_id in cost.source
    # cache reads and writes have their own rates: the same tokens as plain input cost otherwise
    plain = genai_prices.calc_price(
        genai_prices.Usage(input_tokens=1_234 + 2_048 + 300, output_tokens=567), model,
        provider_id=price_id)
    if price_id != "github-copilot":
        assert plain.total_price != cost.usd


def test_only_the_successful_attempt_is_billed(priced: Any) -> None:
    fake, adapter, price_id, flavor, model = priced
    fake.push(Fail(500, "overloaded"), USAGE)
    before = {(r.provider, r.model): r.calls for r in ledger.rows()}
    response = adapter.chat("What is it?", stream=True)
    assert len(fake.chat_requests) == 2
    assert response.cost is not None
    assert response.cost.usd == _genai_price(fake, USAGE, price_id, flavor, model).total_price
    key = (adapter.provider_name, adapter.model_name)
    assert next(r.calls for r in ledger.rows() if (r.provider, r.model) == key) \
        == before.get(key, 0) + 1


def test_copilot_premium_requests_from_the_model_multiplier() -> None:
    with CopilotFake() as fake:
        claude = _copilot("claude-sonnet-4")(fake)  # billing.multiplier 1
        gpt = _copilot("gpt-4.1")(fake)  # multiplier 0: an included model
        codex = _copilot("gpt-5-codex")(fake)  # multiplier 1, no dollar price in genai-prices
        assert claude.chat("hi").cost.premium_requests == 1  # type: ignore[union-attr]
        included = gpt.chat("hi").cost
        assert included is not None and included.premium_requests == 0
        assert included.usd == 0  # genai-prices prices Copilot's included gpt-4.1 at $0
        unpriced = codex.chat("hi").cost
        assert unpriced is not None and unpriced.usd is None and unpriced.premium_requests == 1
        assert unpriced.label() == "1 premium request"

        # a tool loop's follow-up call is agent-initiated: no premium request
        def get_weather(city: str) -> str:
            """Weather."""
            return "sunny"

        fake.push(Turn(tool_calls=[ToolCall("call_1", "get_weather", {"city": "Oslo"})]),
                  Turn(text="Sunny."))
        session = Session(claude, tools=[get_weather])
        session.send("Weather in Oslo?")
        assert session.cost.calls == 2
        assert session.cost.premium_requests == 1
        for adapter in (claude, gpt, codex):
            adapter.close()


def test_unknown_price_is_none_never_zero() -> None:
    with OpenAIChatFake.llama() as fake:
        adapter = OpenAIAdapter("smollm2", backend="compatible", base_url=fake.base_url,
                                max_retries=0)
        assert adapter.chat("hi").cost is None
        session = Session(adapter)
        session.send("one")
        session.send("two")
        assert session.cost.unknown == 2 and session.cost.usd == 0 and not session.cost.known
        assert "2 of 2 answers' price unknown" in str(session.cost)
        assert str(session.cost) == "price unknown (2 of 2 answers' price unknown)"  # never $0
    with OpenAIResponsesFake(api_key="sk-test") as fake:
        adapter = OpenAIAdapter("no-such-model-x1", backend="official", base_url=fake.base_url,
                                api_key="sk-test")
        assert adapter.chat("hi").cost is None


def test_a_provider_that_runs_on_this_machine_costs_zero_not_unknown() -> None:
    """A descriptor with ``free=True`` (the embedded model's): its answers cost $0, a known
    price, so sums add them, ``%chat cost`` says $0 and a budget can be kept."""
    from dispatch_nb import connect, registry
    from dispatch_nb.cost import FREE_PROVIDERS

    class Here(CompatibleAdapter):
        provider_name = "here-test"

    with OpenAIChatFake.llama() as fake:
        registry.register_provider(registry.ProviderDescriptor(
            "here-test", lambda model, **kw: Here(model, base_url=fake.base_url, **kw), free=True))
        try:
            adapter = connect("here-test:smollm2")
            answer = adapter.chat("hi")
            assert answer.cost is not None and answer.cost.usd == 0
            assert answer.cost.label() == "$0"
            session = Session(adapter)
            session.send("one")
            session.send("two")
            assert session.cost.known and session.cost.calls == 2 and str(session.cost) == "$0"
            shown = estimate("Row {n}", ROWS[:2], model=adapter, max_tokens=10)
            assert shown.low_usd == 0 and shown.high_usd == 0
            assert shown.summary().endswith("output tokens · $0")  # not a range "$0 – $0"
            result = batch("Row {n}", ROWS[:2], model=adapter, max_tokens=10, budget=0.01,
                           progress=False)
            assert [r.cost.usd for r in result] == [0, 0] and result.cost.known
        finally:
            registry._providers.pop("here-test", None)
            FREE_PROVIDERS.discard("here-test")


def test_cost_survives_dumps_and_plain_dumps_stay_as_they_were() -> None:
    with OpenAIResponsesFake(api_key="sk-test") as fake:
        fake.push(USAGE)
        response = _openai(fake).chat("hi")
    dumped = response.model_dump(mode="json")
    assert dumped["cost"]["usd"] == str(response.cost.usd)  # type: ignore[union-attr]
    again = Response.model_validate_json(response.model_dump_json())
    assert again == response and again.cost == response.cost
    assert isinstance(again.cost.usd, Decimal)  # type: ignore[union-attr]
    assert "cost" not in Response(model="x").model_dump()


def test_a_replayed_answer_keeps_its_cost_and_costs_nothing_now(tmp_path: Path) -> None:
    with OpenAIResponsesFake(api_key="sk-test") as fake:
        fake.push(USAGE)
        cache = ResponseCache(tmp_path / "cache.jsonl", mode="read-write")
        adapter = CachedAdapter(_openai(fake), cache)
        recorded = adapter.chat("What is it?")
        replayed = adapter.chat("What is it?")
        assert len(fake.chat_requests) == 1
    assert recorded.cost is not None and replayed.cost is not None
    assert replayed.cost.usd == recorded.cost.usd and replayed.cost.replayed
    assert not recorded.cost.replayed and replayed == recorded
    assert replayed.cost.spent_usd == 0
    total = CostTotal.of([recorded.cost, replayed.cost])
    assert total.usd == recorded.cost.usd and total.saved_usd == recorded.cost.usd
    assert total.replayed == 1 and total.known
    assert replayed.cost.label() == f"{format_usd(recorded.cost.usd)} when recorded, $0 now"  # type: ignore[arg-type]


def test_a_replayed_answer_of_unknown_price_costs_nothing_now(tmp_path: Path) -> None:
    # compatible servers have no price: replayed, such an answer is
    # counted as replayed (nothing spent now), not as an answer of unknown price
    path = tmp_path / "lesson.jsonl"
    with OpenAIChatFake.llama() as fake:
        adapter = OpenAIAdapter("smollm2", backend="compatible", base_url=fake.base_url,
                                max_retries=0)
        CachedAdapter(adapter, ResponseCache(path, mode="record")).chat("hi")
        batch("{row}", ["a", "b"], model=CachedAdapter(adapter, ResponseCache(path, mode="record")),
              progress=False)
        asked = len(fake.chat_requests)
        replaying = CachedAdapter(adapter, ResponseCache(path, mode="replay"))
        key = ("compatible", "smollm2")
        before = next((r.cost.replayed, r.cost.unknown, r.calls) for r in ledger.rows()
                      if (r.provider, r.model) == key)
        session = Session(replaying)
        session.send("hi")
        result = batch("{row}", ["a", "b"], model=replaying, progress=False)
        assert len(fake.chat_requests) == asked  # nothing sent
    assert session.cost.replayed == 1 and session.cost.unknown == 0 and session.cost.known
    assert result.cost.replayed == 2 and result.cost.unknown == 0 and result.cost.usd == 0
    replayed, unknown, calls = next((r.cost.replayed, r.cost.unknown, r.calls) for r in ledger.rows()
                                    if (r.provider, r.model) == key)
    assert (replayed - before[0], unknown - before[1], calls - before[2]) == (3, 0, 0)


def test_format_usd() -> None:
    assert format_usd(Decimal("0.0031234")) == "$0.0031"
    assert format_usd(Decimal("0.000012")) == "$0.000012"
    assert format_usd(Decimal("0.0000001")) == "$0.00000010"  # never "$1.0E-7"
    assert format_usd(Decimal("0.5")) == "$0.50"
    assert format_usd(Decimal("0.05315")) == "$0.0532"
    assert format_usd(Decimal("1234.5")) == "$1,234.50"
    assert format_usd(Decimal("12.345")) == "$12.35"
    assert format_usd(Decimal(0)) == "$0"


# -- budgets ---------------------------------------------------------------------------------------
ROW = Turn(text="ok", input_tokens=20, output_tokens=500)
ROWS = [{"n": f"{i:03d}"} for i in range(200)]


def _row_price() -> Decimal:
    price: Decimal = genai_prices.calc_price(
        genai_prices.Usage(input_tokens=20, output_tokens=500), "gpt-4.1",
        provider_id="openai").total_price
    return price


def test_a_batch_sends_exactly_the_rows_its_budget_fits_and_resumes(tmp_path: Path) -> None:
    checkpoint = tmp_path / "rows.jsonl"
    with OpenAIResponsesFake(api_key="sk-test") as fake:
        fake.push(*[ROW] * 200)
        adapter = _openai(fake)
        worst = worst_case(adapter, [Message(role="user", content="Row 000")], max_tokens=1000)
        actual = _row_price()
        assert worst > actual
        budget = Decimal("0.1")
        fits = int((budget - worst) // actual) + 1  # the last row sent still had room for worst
        assert 0 < fits < 200
        result = batch("Row {n}", ROWS, model=adapter, max_tokens=1000, budget=budget,
                       concurrency=16, checkpoint=checkpoint, progress=False)
        assert len(fake.chat_requests) == fits
        assert result.sent == fits and result.ok == fits
        assert result.cost.usd == actual * fits <= budget
        assert result.budget is not None and result.budget.spent == actual * fits
        over = [item for item in result if isinstance(item, BudgetExceededError)
                and item.code == "budget_exceeded"]
        assert len(over) == 200 - fits
        assert over[0].code == "budget_exceeded" and not over[0].retryable
        assert "not sent (over budget)" in result.summary()

        resumed = batch("Row {n}", ROWS, model=adapter, max_tokens=1000, budget=5,
                        checkpoint=checkpoint, progress=False)
        assert len(fake.chat_requests) == 200  # no finished row was sent again
        assert resumed.resumed == fits and resumed.sent == 200 - fits and resumed.ok == 200
        sent = [r.json["input"] for r in fake.chat_requests]
        assert len({str(s) for s in sent}) == 200
        assert resumed.cost.usd == actual * (200 - fits)
        adapter.close()


def test_retry_failed_spends_only_what_the_batch_budget_left() -> None:
    """retry_failed() keeps the batch's budget=: the rows over budget are not sent again once
    what is left does not fit them."""
    with OpenAIResponsesFake(api_key="sk-test") as fake:
        fake.push(*[ROW] * 40)
        adapter = _openai(fake)
        budget = Decimal("0.02")
        result = batch("Row {n}", ROWS[:20], model=adapter, max_tokens=1000, budget=budget,
                       concurrency=4, progress=False)
        sent = len(fake.chat_requests)
        assert 0 < sent < 20 and result.ok == sent
        assert result.budget is not None and result.budget.spent == _row_price() * sent
        assert result.retry_failed() is result
        assert len(fake.chat_requests) == sent  # what is left of $0.02 fits no row
        assert result.budget.spent == _row_price() * sent <= budget
        assert result.ok == sent and result.not_sent == 20 - sent
        assert sum(isinstance(item, BudgetExceededError) and item.code == "budget_exceeded"
                   for item in result) == 20 - sent
        adapter.close()


def test_abatch_budget_never_exceeded_with_rows_in_flight() -> None:
    with OpenAIResponsesFake(api_key="sk-test") as fake:
        fake.push(*[ROW] * 200)
        adapter = _openai(fake)
        result = asyncio.run(abatch("Row {n}", ROWS[:60], model=adapter, max_tokens=1000,
                                    budget="0.05", concurrency=32, progress=False))
        assert result.budget is not None
        assert result.budget.spent == result.cost.usd <= Decimal("0.05")
        assert len(fake.chat_requests) == result.sent
        assert 0 < result.sent < 60
        adapter.close()


def test_a_budget_needs_a_known_price_before_anything_is_sent() -> None:
    with OpenAIChatFake.llama() as fake:
        adapter = OpenAIAdapter("smollm2", backend="compatible", base_url=fake.base_url)
        with pytest.raises(ValueError, match="needs a known price"):
            batch("Row {n}", ROWS[:3], model=adapter, max_tokens=10, budget=1, progress=False)
        assert fake.chat_requests == []
        # and no progress bar: the text bar writes to stderr (as abatch's does)
        for run in (lambda: batch("Row {n}", ROWS[:3], model=adapter, max_tokens=10, budget=1,
                                  progress="text"),
                    lambda: asyncio.run(abatch("Row {n}", ROWS[:3], model=adapter, max_tokens=10,
                                               budget=1, progress="text"))):
            with contextlib.redirect_stderr(io.StringIO()) as err, \
                    pytest.raises(ValueError, match="needs a known price"):
                run()
            assert err.getvalue() == ""
        assert fake.chat_requests == []


def test_a_session_budget_refuses_the_turn_that_might_not_fit() -> None:
    with OpenAIResponsesFake(api_key="sk-test") as fake:
        fake.push(*[ROW] * 20)
        adapter = _openai(fake)
        session = Session(adapter, budget=Decimal("0.02"), max_tokens=1000)
        sent = 0
        refused: BudgetExceededError | None = None
        for _ in range(20):
            try:
                session.send("Row 000")
            except BudgetExceededError as exc:
                refused = exc
                break
            sent += 1
        assert refused is not None and refused.code == "budget_exceeded"
        assert len(fake.chat_requests) == sent > 0
        assert session.cost.usd == _row_price() * sent <= Decimal("0.02")
        assert session.history[-1].role == "assistant"  # the refused turn left no trace
        adapter.close()


def test_budget_rejects_nonsense() -> None:
    with pytest.raises(ValueError, match="non-negative"):
        Budget(-1)
    with pytest.raises(TypeError, match="US dollars"):
        Budget("lots")  # type: ignore[arg-type]


# -- estimates -------------------------------------------------------------------------------------
def test_estimate_uses_anthropic_count_tokens() -> None:
    with AnthropicFake(api_key="sk-ant-test") as fake:
        adapter = _anthropic(fake)
        est = estimate("Summarise {n}", ROWS[:5], model=adapter, max_tokens=100)
        counts = [r for r in fake.requests if r.path == "/v1/messages/count_tokens"]
        assert len(counts) == 5 and fake.chat_requests == []
        assert est.counted_by == "count_tokens" and not est.approximate
        assert est.rows == 5 and est.max_tokens == 100
        expected_low = genai_prices.calc_price(
            genai_prices.Usage(input_tokens=est.input_tokens), "claude-sonnet-4-5",
            provider_id="anthropic").total_price
        expected_high = genai_prices.calc_price(
            genai_prices.Usage(input_tokens=est.input_tokens, output_tokens=500),
            "claude-sonnet-4-5", provider_id="anthropic").total_price
        assert (est.low_usd, est.high_usd) == (expected_low, expected_high)
        assert est.max_output_usd == expected_high - expected_low
        adapter.close()


def test_estimate_without_a_counter_says_it_approximates() -> None:
    with OpenAIResponsesFake(api_key="sk-test") as fake:
        adapter = _openai(fake)
        est = estimate("x" * 400, model=adapter, max_tokens=50)
        assert est.approximate and est.counted_by == "approximation"
        assert est.rows == 1 and 100 <= est.input_tokens < 200
        assert "~" in est.summary() and "approximation" in est.summary()
        assert fake.requests == []
        adapter.close()


def test_estimate_for_a_deferred_batch_is_at_the_batch_price() -> None:
    with OpenAIResponsesFake(api_key="sk-test") as fake:
        adapter = _openai(fake)
        live = estimate("Rate {n}", ROWS[:3], model=adapter, max_tokens=50)
        deferred = estimate("Rate {n}", ROWS[:3], model=adapter, max_tokens=50, batch=True)
        assert fake.requests == []
        adapter.close()
    assert live.low_usd and live.high_usd and deferred.low_usd and deferred.high_usd
    assert deferred.low_usd * 2 == live.low_usd and deferred.high_usd * 2 == live.high_usd
    assert "batch price" in deferred.source and "batch price" not in live.source


def test_cost_is_exported() -> None:
    import dispatch_nb

    assert dispatch_nb.Cost is Cost
    for name in ("Cost", "CostTotal", "Estimate", "Budget", "estimate", "BudgetExceededError"):
        assert name in dispatch_nb.__all__


def test_estimate_counts_copilot_premium_requests_without_sending_a_prompt() -> None:
    with CopilotFake() as fake:
        adapter = _copilot("claude-sonnet-4")(fake)
        est = estimate("Rate {n}", ROWS[:3], model=adapter, max_tokens=10)
        assert fake.chat_requests == []
        assert est.premium_requests == 3 and "3 premium requests" in est.summary()
        assert est.high_usd is not None and est.low_usd is not None and est.high_usd > est.low_usd
        adapter.close()


def test_a_response_shows_its_price_in_its_footer() -> None:
    with OpenAIResponsesFake(api_key="sk-test") as fake:
        fake.push(USAGE)
        response = _openai(fake).chat("hi")
    assert response.cost is not None and response.cost.usd is not None
    shown = response._repr_markdown_()
    assert "· " + format_usd(response.cost.usd).replace("$", "\\$") in shown
    assert not re.search(r"(?<!\\)\$", shown)  # every dollar escaped: not LaTeX math
    assert "$" not in Response(model="x")._repr_markdown_()


def test_a_structured_row_reserves_its_schema_and_its_retry() -> None:
    """``output=`` may send the schema in the prompt and ask twice: its worst case counts both, so
    a budget that fits a plain row refuses the structured one before anything is sent."""
    from pydantic import BaseModel

    class Verdict(BaseModel):
        positive: bool
        reason: str

    with OpenAIResponsesFake(api_key="sk-test") as fake:
        adapter = _openai(fake)
        plain = worst_case(adapter, [Message(role="user", content="Row 000")], max_tokens=1000)
        structured = worst_case(adapter, [Message(role="user", content="Row 000")],
                                max_tokens=1000, output=Verdict)
        assert structured > plain
        budget = plain + (2 * structured - plain) / 2  # fits a plain row, not 2 structured calls
        refused = batch("Row {n}", ROWS[:2], model=adapter, max_tokens=1000, budget=budget,
                        output=Verdict, progress=False)
        assert fake.chat_requests == []
        assert all(isinstance(item, BudgetExceededError) and item.code == "budget_exceeded"
                   for item in refused)
        fake.push(ROW)
        sent = batch("Row {n}", ROWS[:1], model=adapter, max_tokens=1000, budget=budget,
                     progress=False)
        assert sent.ok == 1 and len(fake.chat_requests) == 1
        adapter.close()


def test_an_image_counts_as_a_bounded_number_of_tokens_not_as_its_bytes() -> None:
    # a screenshot an MCP tool returned stays in the turn's history: a budget reserves a bounded
    # number of tokens for it, not one per byte of its base64 (which would stop every later call)
    from dispatch_nb.estimates import IMAGE_TOKEN_BOUND, IMAGE_TOKENS, approximate_tokens, token_bound
    from dispatch_nb.types import ImageBlock, TextBlock, ToolResultBlock

    def history(image_bytes: int) -> list[Message]:
        image = ImageBlock.from_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * image_bytes, "image/png")
        result = ToolResultBlock(tool_use_id="c1", content=[TextBlock(text="the screen"), image])
        return [Message("user", "Look."), Message("user", [result])]

    small, large = history(10), history(500_000)
    assert token_bound(large) == token_bound(small) < IMAGE_TOKEN_BOUND + 200
    assert token_bound(small) > IMAGE_TOKEN_BOUND  # the image is counted, as a bound
    assert approximate_tokens(large) == approximate_tokens(small) < IMAGE_TOKENS + 100
    assert token_bound([Message("user", [TextBlock(text="hi"), large[1].blocks[0].images[0]])]) \
        > IMAGE_TOKEN_BOUND  # an image the user sends counts the same
