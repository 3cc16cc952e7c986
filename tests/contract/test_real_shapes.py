"""Answers shaped like real provider traffic, for every adapter, sync and async.

Real servers compress event streams, interleave built-in tool items with reasoning, stream blocks
with delta types nobody told the adapter about, send ``output_item.done`` events out of order and
answer with lists of content parts. Each fake can produce those shapes (our own fixtures, written
from the documented wire formats: see ``targets.py``), and here every target must

* give the same ``Response`` streamed, streamed async and not streamed, for every answer its fake
  can produce (the generic scenarios below plus the target's own ``extra_turns``);
* decode every content encoding the fakes can send (gzip, deflate, br, zstd);
* send every such answer back on the next turn in a form the strict fake accepts;
* map the documented stop reasons;
* read the shapes particular providers send (Copilot's rotating Responses item ids, Anthropic's
  ``message_start`` that already holds the answer, its in-stream ``overloaded_error``, a tool call
  cut by ``max_tokens``).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from dispatch_nb import (
    Message,
    Response,
    StreamDelta,
    TextBlock,
    ToolDefinition,
    ToolResultBlock,
)
from dispatch_nb.adapter import Adapter

from ..fakes.provider import WEATHER, ProviderFake, ToolCall, Turn
from ..fakes.server import ENCODINGS
from .targets import TARGETS, Target, only

CLOCK = ToolDefinition(name="get_time", description="The time now")
TOOLS = [WEATHER, CLOCK]
MODES = ["json", "stream", "async-stream"]


def scenarios(target: Target) -> list[tuple[str, Turn]]:
    """Every kind of answer a fake renders from a canonical :class:`Turn`, then the target's own."""
    found = [
        ("text", Turn(text="Hello there, how can I help?")),
        ("unicode", Turn(text="Grüße, 世界 👋 — ça va?", chunk=1)),
        ("nothing", Turn(text="")),
        ("tools", Turn(text="Let me check both.", chunk=3, tool_calls=[
            ToolCall("call_a", "get_weather", {"city": "Paris"}),
            ToolCall("call_b", "get_weather", {"city": "Oslo"})])),
        ("tool-without-arguments", Turn(tool_calls=[ToolCall("call_t", "get_time", {})])),
        ("max-tokens", Turn(text="The answer was cut o", stop_reason="max_tokens")),
        ("refusal", Turn(text="I can't help with that.", stop_reason="refusal")),
        ("content-filter", Turn(text="Partial", stop_reason="content_filter")),
        ("cached-usage", Turn(text="ok", input_tokens=20, cache_read_tokens=5,
                              output_tokens=2)),
    ]
    if target.supports_thinking:
        found += [
            ("thinking", Turn(thinking="Plan: call the tool, then answer.",
                              signature="EqQBCkYIBxgCKkBsig+/real==", text="Checking.",
                              tool_calls=[ToolCall("call_k", "get_weather", {"city": "Rome"})])),
            ("redacted-thinking", Turn(thinking="Short.", signature="EqQBsig2==",
                                       redacted_thinking=["gAAAA-redacted-1"], text="Done.")),
        ]
    return found + target.extra_turns()


def ask(adapter: Adapter, history: list[Message], mode: str,
        **kw: Any) -> tuple[Response, list[StreamDelta]]:
    """One call and the deltas it streamed (none for ``json``)."""
    if mode == "json":
        return adapter.chat(history, **kw), []
    if mode == "stream":
        with adapter.stream(history, **kw) as stream:
            deltas = list(stream)
        return stream.response, deltas

    async def run() -> tuple[Response, list[StreamDelta]]:
        async with adapter.astream(history, **kw) as stream:
            got = [d async for d in stream]
        return stream.response, got

    return asyncio.run(run())


def answer(adapter: Adapter, fake: ProviderFake, turn: Turn, mode: str,
           history: list[Message] | None = None) -> tuple[Response, list[StreamDelta]]:
    """``turn`` answered in ``mode``, the fake's ids numbered as for every other mode."""
    restart = getattr(fake, "restart_ids", None)
    if restart is not None:
        restart()
    fake.push(turn)
    return ask(adapter, history or [Message(role="user", content="Go.")], mode, tools=TOOLS)


# -- streamed and non-streamed answers are the same answer -----------------------------------------
@pytest.mark.parametrize("encoding", [None, "gzip"], ids=["plain", "gzip"])
def test_streamed_and_non_streamed_answers_are_identical(
        adapter: Adapter, fake: ProviderFake, target: Target, encoding: str | None) -> None:
    fake.server.compress = encoding
    cases = scenarios(target)
    got: dict[str, list[tuple[Response, list[StreamDelta]]]] = {}
    for name, turn in cases:
        got[name] = [answer(adapter, fake, turn, "json"), answer(adapter, fake, turn, "stream")]

    async def async_answers() -> None:  # one event loop for all (one connection pool)
        for name, turn in cases:
            restart = getattr(fake, "restart_ids", None)
            if restart is not None:
                restart()
            fake.push(turn)
            async with adapter.astream([Message(role="user", content="Go.")],
                                       tools=TOOLS) as stream:
                deltas = [d async for d in stream]
            got[name].append((stream.response, deltas))

    asyncio.run(async_answers())
    for name, ((plain, _), *streams) in got.items():
        for mode, (streamed, deltas) in zip(("stream", "async-stream"), streams, strict=True):
            assert streamed.model_dump() == plain.model_dump(), f"{name}: {mode} differs"
            shown = "".join(d.text or "" for d in deltas if d.type == "text_delta")
            assert shown == streamed.text, f"{name}: the text deltas are not the text"
            thought = "".join(d.text or "" for d in deltas if d.type == "thinking_delta")
            assert thought == streamed.thinking, f"{name}: the thinking deltas are not the thinking"
            ends = [d.tool_call_id for d in deltas if d.type == "tool_use_end"]
            assert ends == [c.id for c in streamed.tool_calls], name


# -- compressed answers ------------------------------------------------------------------------------
@pytest.mark.parametrize("encoding", ["gzip", "deflate", "br", "zstd"])
@pytest.mark.parametrize("mode", MODES)
def test_every_content_encoding_is_decoded(adapter: Adapter, fake: ProviderFake, encoding: str,
                                           mode: str) -> None:
    assert encoding in ENCODINGS, f"the test extra installs the {encoding} library"
    fake.server.compress = encoding
    turn = Turn(text="Compressed, and still streamed piece by piece.", chunk=5,
                tool_calls=[ToolCall("call_z", "get_weather", {"city": "Zürich"})])
    response, deltas = answer(adapter, fake, turn, mode)
    assert response.text == turn.text
    assert [(c.id, c.arguments) for c in response.tool_calls] == [("call_z", {"city": "Zürich"})]
    assert response.stop_reason == "tool_use"
    if mode != "json":
        assert sum(d.type == "text_delta" for d in deltas) >= 5  # not one lump at the end


# -- every answer goes back --------------------------------------------------------------------------
@pytest.mark.parametrize("mode", MODES)
def test_every_answer_goes_back_on_the_next_turn(adapter: Adapter, fake: ProviderFake,
                                                 target: Target, mode: str) -> None:
    """The strict fakes reject history that lost or changed what the model produced (a reasoning
    item without its following item, a compaction block without its content...). The plain
    shapes' round trips are ``test_contract.py``'s; these are the ones with more to lose."""
    kept = [(n, t) for n, t in scenarios(target)
            if n in ("tools", "thinking", "redacted-thinking")] + target.extra_turns()
    for name, turn in kept:
        history = [Message(role="user", content="Go.")]
        first, _ = answer(adapter, fake, turn, mode, history)
        saved = Message.model_validate_json(first.to_message().model_dump_json())
        results = [ToolResultBlock(tool_use_id=c.id, content="18 °C") for c in first.tool_calls]
        history += [saved, Message(role="user", content=[*results, TextBlock("And then?")])]
        fake.push(Turn(text=f"next after {name}"))
        second, _ = ask(adapter, history, mode, tools=TOOLS)
        assert second.text == f"next after {name}", name


# -- documented stop reasons -------------------------------------------------------------------------
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("stop", ["max_tokens", "refusal", "content_filter"])
def test_stop_reasons_map_as_documented(adapter: Adapter, fake: ProviderFake, target: Target,
                                        mode: str, stop: str) -> None:
    expected = stop
    if target.name == "anthropic" and stop == "content_filter":
        expected = "refusal"  # the Messages API's only filter stop is "refusal"
    response, _ = answer(adapter, fake, Turn(text="Some of it", stop_reason=stop), mode)
    assert response.stop_reason == expected
    assert response.text == "Some of it"


# -- Copilot's /responses rotates item ids ----------------------------------------------------------
COPILOT_RESPONSES = [t for t in TARGETS if t.name == "copilot-responses"]


@only(COPILOT_RESPONSES)
@pytest.mark.parametrize("mode", MODES)
def test_copilot_rotating_item_ids_give_one_block_per_output_item(
        adapter: Adapter, fake: ProviderFake, mode: str) -> None:
    """Copilot (Codex-class models) gives every event of an output item a fresh ``item_id``; only
    ``output_index`` is stable. One reasoning item, one message and one call are three blocks,
    each once, and each goes back once next turn."""
    turn = Turn(thinking="Look the weather up, then answer.", signature="enc-rotated-1",
                text="Paris is sunny today, 24 °C.", chunk=3,
                tool_calls=[ToolCall("call_r", "get_weather", {"city": "Paris"})])
    response, deltas = answer(adapter, fake, turn, mode)
    assert [b.type for b in response.content] == ["thinking", "text", "tool_use"]
    assert response.text == turn.text and response.thinking == turn.thinking
    assert [(c.id, c.arguments) for c in response.tool_calls] == [("call_r", {"city": "Paris"})]
    assert response.stop_reason == "tool_use"
    if mode != "json":
        assert "".join(d.text or "" for d in deltas if d.type == "text_delta") == turn.text
        assert [d.tool_call_id for d in deltas if d.type == "tool_use_start"] == ["call_r"]

    history = [Message(role="user", content="Go."),
               Message.model_validate_json(response.to_message().model_dump_json()),
               Message(role="user", content=[ToolResultBlock(tool_use_id="call_r",
                                                             content="24 °C")])]
    fake.push(Turn(text="Enjoy the sun."))
    second, _ = ask(adapter, history, mode, tools=TOOLS)
    assert second.text == "Enjoy the sun."
    sent = [i.get("type", "message") for i in fake.last_request.json["input"]
            if i.get("role") != "user"]
    assert sent == ["reasoning", "message", "function_call", "function_call_output"]


@only(COPILOT_RESPONSES)
def test_the_copilot_fake_rotates_item_ids_as_copilot_does(fake: ProviderFake,
                                                           adapter: Adapter) -> None:
    """What the tests above read: no two events share an ``item_id``, ``output_index`` repeats."""
    fake.push(Turn(thinking="Hmm.", text="Rotated.", chunk=2))
    adapter.chat("Go.")
    stream = b"".join(fake.responses.render_events(  # type: ignore[attr-defined]
        Turn(thinking="Hmm.", text="Rotated.", chunk=2), fake.last_request))
    events = [json.loads(line[6:]) for line in stream.splitlines() if line.startswith(b"data: ")]
    ids = [e["item_id"] for e in events if "item_id" in e]
    ids += [e["item"]["id"] for e in events if e["type"] == "response.output_item.added"]
    assert len(ids) > 8 and len(set(ids)) == len(ids)
    indexes = [e["output_index"] for e in events if "item_id" in e]
    assert set(indexes) == {0, 1} and len(indexes) > 4


# -- Anthropic: shapes the documented protocol allows ------------------------------------------------
ANTHROPIC = [t for t in TARGETS if t.name == "anthropic"]


@only(ANTHROPIC)
@pytest.mark.parametrize("mode", MODES)
def test_anthropic_message_start_that_already_holds_the_answer(
        adapter: Adapter, fake: ProviderFake, mode: str) -> None:
    """Programmatic tool calling: the ``tool_use`` block and ``stop_reason`` arrive inside
    ``message_start``, then ``message_stop``; no content-block events. The call is not lost, and
    its result goes back next turn."""
    from ..fakes.anthropic import AnthropicTurn

    turn = AnthropicTurn(text="Running the lookup.", content=["text", "tools"],
                         tool_calls=[ToolCall("toolu_ptc", "get_weather", {"city": "Oslo"})],
                         input_tokens=40, output_tokens=12, start_holds_content=True)
    response, deltas = answer(adapter, fake, turn, mode)
    assert response.text == "Running the lookup."
    assert [(c.id, c.name, c.arguments) for c in response.tool_calls] == [
        ("toolu_ptc", "get_weather", {"city": "Oslo"})]
    assert response.stop_reason == "tool_use"
    assert (response.usage.input_tokens, response.usage.output_tokens) == (40, 12)
    if mode != "json":
        assert [d.type for d in deltas] == ["text_delta", "tool_use_start", "tool_use_end"]

    history = [Message(role="user", content="Go."), response.to_message(),
               Message(role="user", content=[ToolResultBlock(tool_use_id="toolu_ptc",
                                                             content="9 °C")])]
    fake.push(Turn(text="Cold."))
    assert ask(adapter, history, mode, tools=TOOLS)[0].text == "Cold."


@only(ANTHROPIC)
@pytest.mark.parametrize("mode", MODES)
def test_anthropic_tool_call_cut_by_max_tokens_is_kept_with_an_argument_error(
        adapter: Adapter, fake: ProviderFake, mode: str) -> None:
    """``max_tokens`` in the middle of a tool call: the arguments are incomplete. The call stays
    (with ``arguments_error``, as invalid arguments are; a session answers it with that error
    instead of running it), the stop reason is ``max_tokens``, and the streamed answer keeps
    what arrived. Non-streamed, the API gives no partial JSON: the call's error is the same."""
    cut = '{"city": "Rio de Jan'
    turn = Turn(text="Let me look.", tool_calls=[ToolCall("toolu_cut", "get_weather", cut)],
                stop_reason="max_tokens")
    response, _ = answer(adapter, fake, turn, mode)
    assert response.stop_reason == "max_tokens"
    assert response.text == "Let me look."
    [call] = response.tool_calls
    assert (call.id, call.name, call.arguments) == ("toolu_cut", "get_weather", {})
    assert call.arguments_error is not None and "max_tokens" in call.arguments_error
    assert call.raw_arguments == (cut if mode != "json" else "{}")

    from dispatch_nb.tools import tool

    ran: list[str] = []

    @tool
    def get_weather(city: str) -> str:
        """The weather."""
        ran.append(city)
        return "sunny"

    result = get_weather.run(call)
    assert result.is_error and "max_tokens" in str(result.content) and not ran


@only(ANTHROPIC)
@pytest.mark.parametrize("mode", MODES)
def test_anthropic_refusal_keeps_what_came_before_it(
        adapter: Adapter, fake: ProviderFake, mode: str) -> None:
    """``stop_reason: "refusal"`` (the streaming classifier stopped the answer): the thinking and
    text that arrived stay, the stop reason says ``refusal``."""
    turn = Turn(thinking="The user asks for something I should not help with.",
                text="I can start by", stop_reason="refusal")
    response, _ = answer(adapter, fake, turn, mode)
    assert response.stop_reason == "refusal"
    assert (response.thinking, response.text) == (turn.thinking, "I can start by")
    assert response.tool_calls == []


@only(ANTHROPIC)
@pytest.mark.parametrize("mode", ["stream", "async-stream"])
def test_anthropic_in_stream_overloaded_error_keeps_the_partial_answer(
        make: Any, fake: ProviderFake, mode: str) -> None:
    """``event: error`` / ``overloaded_error`` in the middle of a tool call: a ``ServerError``
    with the event's 529 (not retried: the answer had begun), ``partial`` holding the text and
    the call as far as it came."""
    from dispatch_nb import ServerError

    from ..fakes.provider import Fail

    fake.push(Turn(text="Checking both.", chunk=4, error_after=6,
                   error=Fail(529, "Overloaded", "overloaded_error"),
                   tool_calls=[ToolCall("toolu_o", "get_weather", {"city": "Oslo"})]),
              Turn(text="a retry would get this"))
    with pytest.raises(ServerError) as info:
        ask(make(max_retries=2), [Message(role="user", content="Go.")], mode, tools=TOOLS)
    error = info.value
    assert (error.status_code, error.code, error.provider_code) == (
        529, "server_error", "overloaded_error")
    assert len(fake.requests) == 1
    partial = error.partial
    assert partial is not None and partial.text == "Checking both."
    assert [c.id for c in partial.tool_calls] == ["toolu_o"]
