"""Contract closure: code written once against the public API works unchanged on every adapter.

ADR 001 exists because code written against one adapter broke on another
(``response.content.lines`` on a list). :func:`downstream` below is that kind of calling code —
preview the answer's first lines, append ``response.to_message()`` to the history, run one tool
round — written once and run against every target in ``targets.py``. The other tests pin the shape
promises it relies on: ``Response.content`` is always a list (also when the model says nothing),
usage means the same everywhere (``input_tokens`` excludes cache reads), and thinking signatures
survive the round trip byte-for-byte where a provider has them.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from dispatch_nb import (
    Message,
    Response,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from dispatch_nb.adapter import Adapter

from ..fakes.provider import WEATHER, ProviderFake, ToolCall, Turn
from .targets import TARGETS, Target, only

TEMPERATURES = {"Paris": "18 °C", "Oslo": "4 °C"}
MODES = ["json", "stream", "async-stream"]


def ask(adapter: Adapter, history: list[Message], mode: str, **kw: Any) -> Response:
    """One call, the way the calling code happens to make it."""
    if mode == "json":
        return adapter.chat(history, **kw)
    if mode == "stream":
        with adapter.stream(history, **kw) as stream:
            for _ in stream:
                pass
        return stream.response

    async def run() -> Response:
        async with adapter.astream(history, **kw) as stream:
            async for _ in stream:
                pass
        return stream.response

    return asyncio.run(run())


# -- the downstream code, written once -----------------------------------------------------------
def downstream(adapter: Adapter, question: str, mode: str) -> tuple[list[str], Response,
                                                                     list[Message]]:
    """Ask, preview the answer, run the requested tools once, ask again. Provider-agnostic."""
    history = [Message(role="user", content=question)]
    first = ask(adapter, history, mode, tools=[WEATHER])
    preview = first.text.splitlines()[:3]
    history.append(first.to_message())
    if first.tool_calls:
        results = [
            ToolResultBlock(tool_use_id=call.id,
                            content=TEMPERATURES.get(call.arguments.get("city", ""), "unknown"))
            for call in first.tool_calls
        ]
        history.append(Message(role="user", content=results))
        final = ask(adapter, history, mode, tools=[WEATHER])
        history.append(final.to_message())
    else:
        final = first
    return preview, final, history


@pytest.mark.parametrize("mode", MODES)
def test_downstream_code_works_unchanged(adapter: Adapter, fake: ProviderFake, mode: str) -> None:
    fake.push(
        Turn(
            text="Let me check.\nParis first.\nThen Oslo.\nOne moment.",
            tool_calls=[
                ToolCall("call_paris", "get_weather", {"city": "Paris"}),
                ToolCall("call_oslo", "get_weather", {"city": "Oslo"}),
            ],
        ),
        Turn(text="Paris: 18 °C.\nOslo: 4 °C."),
    )
    preview, final, history = downstream(adapter, "Weather in Paris and Oslo?", mode)

    assert preview == ["Let me check.", "Paris first.", "Then Oslo."]
    assert final.text.splitlines() == ["Paris: 18 °C.", "Oslo: 4 °C."]
    assert fake.tool_result_ids_of(fake.last_request) == ["call_paris", "call_oslo"]
    assert [m.role for m in history] == ["user", "assistant", "user", "assistant"]
    assert [b.type for b in history[1].blocks] == ["text", "tool_use", "tool_use"]
    # The history survives a JSON round trip (how sessions are saved) unchanged.
    restored = [Message.model_validate_json(m.model_dump_json()) for m in history]
    assert restored == history


@pytest.mark.parametrize("mode", MODES)
def test_downstream_code_without_tool_calls(adapter: Adapter, fake: ProviderFake,
                                            mode: str) -> None:
    fake.push(Turn(text="Just one line."))
    preview, final, history = downstream(adapter, "Say one line.", mode)
    assert preview == ["Just one line."]
    assert final.tool_calls == []
    assert len(history) == 2


@pytest.mark.parametrize("mode", MODES)
def test_content_is_always_a_list(adapter: Adapter, fake: ProviderFake, mode: str) -> None:
    fake.push(Turn(text="", tool_calls=[]), Turn(text="Still here."))
    history = [Message(role="user", content="Say nothing.")]
    silent = ask(adapter, history, mode)
    assert isinstance(silent.content, list)
    assert silent.content == []
    assert silent.text == ""
    assert silent.text.splitlines()[:3] == []
    assert silent.tool_calls == []
    assert silent.stop_reason == "end_turn"
    assert Response.model_validate_json(silent.model_dump_json()).content == []

    # Appending an empty assistant turn must not break the next call.
    history += [silent.to_message(), Message(role="user", content="Are you there?")]
    answer = ask(adapter, history, mode)
    assert isinstance(answer.content, list)
    assert [type(b) for b in answer.content] == [TextBlock]
    assert answer.text == "Still here."


@only([t for t in TARGETS if t.reports_usage])
@pytest.mark.parametrize("mode", MODES)
def test_usage_input_tokens_exclude_cache_reads(adapter: Adapter, fake: ProviderFake,
                                                target: Target, mode: str) -> None:
    fake.push(Turn(text="cached", input_tokens=20, cache_read_tokens=5, output_tokens=3))
    usage = ask(adapter, [Message(role="user", content="x")], mode).usage
    # Turn.input_tokens is canonical: the prompt was 25 tokens, 5 of them read from the cache.
    assert usage.input_tokens == 20
    assert usage.cache_read_tokens == 5
    assert usage.output_tokens == 3
    assert usage.input_tokens + usage.cache_read_tokens + usage.cache_creation_tokens == 25
    assert usage.total_tokens == 28


@only([t for t in TARGETS if t.supports_thinking])
@pytest.mark.parametrize("mode", MODES)
def test_thinking_round_trip(adapter: Adapter, fake: ProviderFake, target: Target,
                             mode: str) -> None:
    signature = "EqQBCkYIBxgCKkBsig+/contract=="
    thought = "The user wants Paris weather; call get_weather."
    fake.push(
        Turn(thinking=thought, signature=signature,
             tool_calls=[ToolCall("call_t", "get_weather", {"city": "Paris"})]),
        Turn(text="18 °C in Paris."),
    )
    history = [Message(role="user", content="Weather in Paris?")]
    first = ask(adapter, history, mode, tools=[WEATHER])
    assert isinstance(first.content[0], ThinkingBlock)
    assert first.content[0].signature == signature
    assert first.thinking == thought
    assert isinstance(first.content[-1], ToolUseBlock)

    # Through JSON (a saved session), then back to the provider on the next turn.
    assistant = Message.model_validate_json(first.to_message().model_dump_json())
    history += [assistant,
                Message(role="user", content=[ToolResultBlock(tool_use_id="call_t",
                                                              content="18 °C")])]
    second = ask(adapter, history, mode, tools=[WEATHER])
    assert second.text == "18 °C in Paris."
    assert fake.thinking_signatures_of(fake.last_request) == [signature]
