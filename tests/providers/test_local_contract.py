"""The adapter contract, for the embedded local model.

The contract suite (tests/contract) scripts what the "model" answers through wire-protocol fakes;
a real in-process model cannot follow a script, so the local provider is not a target there.
This file checks every contract property that needs no script, against the real model:
``content`` is a list of blocks, streamed == non-streamed == async (the local model is
deterministic), streamed text == concatenated deltas, ``on_delta`` sees every delta,
``to_message`` round trips (text and tool calls), JSON round trip, usage filled, per-call
``max_tokens`` beats the constructor default, timeout and cancel keep ``partial``, ``close()`` ends
the stream, and the types of blocks.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from dispatch_nb import (
    APITimeoutError,
    CancelToken,
    Message,
    RequestCancelled,
    Response,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from dispatch_nb.providers.local import LocalAdapter, local_model_available
from dispatch_nb.testing import ManualClock

from ..fakes.provider import WEATHER
from .test_local import MID_ANSWER, cut_short, whole_answer

pytestmark = [
    pytest.mark.local,
    pytest.mark.skipif(not local_model_available(), reason="the local extra is not installed"),
]

LONG = "Write a long story about a lighthouse keeper and a whale."


@pytest.fixture(scope="module")
def adapter() -> LocalAdapter:
    return LocalAdapter(max_tokens=24)


@pytest.fixture(scope="module")
def tools_adapter() -> LocalAdapter:
    return LocalAdapter(max_tokens=48, chat_format="chatml-function-calling")


def _same(a: Response, b: Response) -> None:
    assert a.content == b.content
    assert a.tool_calls == b.tool_calls
    assert a.stop_reason == b.stop_reason
    assert a.usage == b.usage
    assert a.model == b.model


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_text_reply(adapter: LocalAdapter, stream: bool) -> None:
    response = adapter.chat("Hi! Who are you?", stream=stream, temperature=0)
    assert isinstance(response.content, list)
    assert [b.type for b in response.content] == ["text"]
    assert isinstance(response.content[0], TextBlock)
    assert response.text
    assert response.tool_calls == []
    assert response.stop_reason in ("end_turn", "max_tokens")
    assert response.usage.input_tokens > 0 and response.usage.output_tokens > 0


def test_streamed_plain_and_async_give_the_same_response(adapter: LocalAdapter) -> None:
    with adapter.stream("Name three rivers.", temperature=0) as stream:
        deltas = list(stream)
    streamed = stream.response
    plain = adapter.chat("Name three rivers.", temperature=0)
    _same(streamed, plain)
    assert "".join(d.text or "" for d in deltas) == streamed.text
    assert sum(d.type == "text_delta" for d in deltas) >= 2

    async def main() -> tuple[Response, Response, list[str]]:
        achat = await adapter.achat("Name three rivers.", temperature=0)
        texts: list[str] = []
        async with adapter.astream("Name three rivers.", temperature=0) as astream:
            async for delta in astream:
                texts.append(delta.text or "")
        return achat, astream.response, texts

    achat, astreamed, texts = asyncio.run(main())
    _same(achat, plain)
    _same(astreamed, plain)
    assert "".join(texts) == plain.text


def test_on_delta_sees_every_delta(adapter: LocalAdapter) -> None:
    seen: list[str] = []
    response = adapter.chat("Say something nice.", stream=True,
                            on_delta=lambda d: seen.append(d.text or ""))
    assert "".join(seen) == response.text
    assert len(seen) >= 2


def test_system_prompt_and_max_tokens(adapter: LocalAdapter) -> None:
    bare = adapter.chat("Hi", system="Reply briefly.", max_tokens=3)
    longer = adapter.chat("Hi", system="Reply briefly, in French, like a poet.", max_tokens=3)
    assert longer.usage.input_tokens > bare.usage.input_tokens  # the system prompt is sent
    assert bare.usage.output_tokens == 3 and bare.stop_reason == "max_tokens"
    # the constructor default (24) applies when the call gives none
    default = adapter.chat(LONG)
    assert default.usage.output_tokens == 24 and default.stop_reason == "max_tokens"


def test_to_message_round_trip_accepted(adapter: LocalAdapter) -> None:
    history = [Message("user", "Tell me a colour.")]
    first = adapter.chat(history, temperature=0)
    history += [first.to_message(), Message("user", "Another one?")]
    second = adapter.chat(history, temperature=0)
    assert second.text
    assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens - 1


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_tool_call_and_round_trip(tools_adapter: LocalAdapter, stream: bool) -> None:
    history: list[Message] = [Message("user", "What is the weather in Rome?")]
    first = tools_adapter.chat(history, tools=[WEATHER], tool_choice="get_weather",
                               stream=stream, temperature=0)
    assert first.stop_reason == "tool_use"
    [call] = first.tool_calls
    assert isinstance(first.content[-1], ToolUseBlock) and first.content[-1] == call
    assert call.name == "get_weather" and "city" in call.arguments
    history += [first.to_message(),
                Message("user", [ToolResultBlock(tool_use_id=call.id, content="21 °C, sunny")])]
    second = tools_adapter.chat(history, tools=[WEATHER], tool_choice="none", stream=stream,
                                temperature=0)
    assert second.text and second.tool_calls == []
    # the call and its result were sent: more prompt than the question alone
    alone = tools_adapter.chat(history[:1], tools=[WEATHER], tool_choice="none", max_tokens=1)
    assert second.usage.input_tokens > alone.usage.input_tokens + 5


def test_response_json_round_trip(tools_adapter: LocalAdapter) -> None:
    response = tools_adapter.chat("Weather in Oslo?", tools=[WEATHER], tool_choice="get_weather",
                                  stream=True)
    assert Response.model_validate_json(response.model_dump_json()) == response


def test_timeout_mid_stream_keeps_partial(adapter: LocalAdapter) -> None:
    whole = whole_answer(adapter, LONG)
    with ManualClock(tick=1), pytest.raises(APITimeoutError) as info:
        adapter.chat(LONG, stream=True, max_tokens=100, temperature=0, timeout=MID_ANSWER)
    error = info.value
    assert error.code == "timeout"
    assert isinstance(error, TimeoutError)
    assert f"{MID_ANSWER:g} s timeout" in error.message
    assert cut_short(error.partial, whole)


def test_cancel_mid_stream_keeps_partial(adapter: LocalAdapter) -> None:
    token = CancelToken()
    seen: list[str] = []

    def on_delta(d: Any) -> None:
        seen.append(d.text or "")
        if len(seen) == 3:
            threading.Timer(0.05, token.cancel).start()

    with pytest.raises(RequestCancelled) as info:
        adapter.chat(LONG, stream=True, max_tokens=400, on_delta=on_delta, cancel=token)
    assert info.value.code == "cancelled"
    partial = info.value.partial
    assert partial is not None
    assert partial.text == "".join(seen)
    assert len(seen) >= 3


def test_close_ends_the_stream(adapter: LocalAdapter) -> None:
    stream = adapter.stream(LONG, max_tokens=400)
    first = next(iter(stream))
    assert first.type == "text_delta"
    stream.close()
    assert list(stream) == []
    # what arrived: what the caller took, and any token that came while it closed the stream
    # (the model runs ahead of the caller on the library's thread), as the contract suite says
    assert stream.partial.text.startswith(first.text)
    assert adapter.chat("Hi", max_tokens=2).usage.output_tokens == 2  # the model is free again


def test_async_cancel_keeps_partial(adapter: LocalAdapter) -> None:
    async def main() -> RequestCancelled:
        token = CancelToken()
        seen: list[str] = []

        async def on_delta(d: Any) -> None:
            seen.append(d.text or "")
            if len(seen) == 2:
                asyncio.get_running_loop().call_later(0.05, token.cancel)

        with pytest.raises(RequestCancelled) as info:
            await adapter.achat(LONG, stream=True, max_tokens=400, on_delta=on_delta,
                                cancel=token)
        assert info.value.code == "cancelled"
        assert info.value.partial is not None
        assert info.value.partial.text.startswith("".join(seen))
        return info.value

    err = asyncio.run(main())
    assert err.partial is not None and err.partial.text


@pytest.mark.parametrize("mode", ["json", "stream", "async-stream"])
def test_downstream_code_works_unchanged(tools_adapter: LocalAdapter, mode: str) -> None:
    """The contract suite's provider-agnostic calling code, run on the real embedded model.

    The model decides whether to call the tool; either way the same code must work.
    """
    from ..contract.test_downstream import downstream

    preview, final, history = downstream(tools_adapter, "What is the weather in Paris?", mode)
    assert isinstance(preview, list) and all(isinstance(line, str) for line in preview)
    assert isinstance(final.content, list)
    assert [m.role for m in history][:2] == ["user", "assistant"]
    assert history[-1].role == "assistant"
    if len(history) > 2:  # a tool round happened: results answered every call, in a user turn
        results = history[2].content
        assert isinstance(results, list) and all(b.type == "tool_result" for b in results)
