"""A delta that arrives late is neither lost nor shown twice, and the stream shows the answer.

A server (or a proxy that reorders what it relays) may send a block's last text, thinking or
tool-argument delta after that block's stop / done event, or even after the answer's terminal
event, still on the wire. The rule (docs/architecture.md, "Wire formats"): a late delta joins its
own block, addressed by the protocol's index (an Anthropic block ``index``, a Responses
``output_index``) and streams; where the protocol then sends the complete item (Responses' done
events) that is the final word: what of it had not streamed streams then, and the delta that
follows it is not added twice. So for every provider the response equals the one of the same
answer sent in order, and the stream's deltas add up to it.
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest

from dispatch_nb import Message, Response, StreamDelta
from dispatch_nb.adapter import Adapter
from dispatch_nb.stream import Accumulator

from ..fakes.canonical import CanonicalFake
from ..fakes.provider import WEATHER, LateKind, ToolCall, Turn
from .targets import TARGETS, Target, only

#: targets whose stream says which block each delta belongs to (an index), so a delta can come
#: late past a later block and still join its own
INDEXED = [t for t in TARGETS if t.name in ("anthropic", "openai-responses", "copilot-responses")]

TEXT = "Grüße aus Köln — the weather is mild today."


def ask(adapter: Adapter, mode: str) -> tuple[list[StreamDelta], Response]:
    messages = [Message(role="user", content="Wetter?")]
    if mode == "sync":
        with adapter.stream(messages, tools=[WEATHER]) as stream:
            deltas = list(stream)
        return deltas, stream.response

    async def run() -> tuple[list[StreamDelta], Response]:
        async with adapter.astream(messages, tools=[WEATHER]) as stream:
            deltas = [d async for d in stream]
        return deltas, stream.response

    return asyncio.run(run())


def answer(target: Target, turn: Turn, mode: str = "sync") -> tuple[list[StreamDelta], Response]:
    """The stream and response of ``turn`` from a fresh fake (so that the ids it makes match)."""
    with target.make_fake() as fake:
        adapter = target.make_adapter(fake, max_retries=0)
        try:
            fake.push(turn)
            return ask(adapter, mode)
        finally:
            adapter.close()


def streamed(deltas: list[StreamDelta], kind: str) -> str:
    return "".join(d.text or "" for d in deltas if d.type == kind)


def check_stream_shows_the_response(deltas: list[StreamDelta], response: Response) -> None:
    """Text and thinking deltas add up to the response's; each call's argument fragments are its
    arguments, and its last ``tool_use_end`` carries them; what a consumer of the deltas rebuilds
    (a session's turn, a live view: ``Accumulator.feed``) is the response's content."""
    rebuilt = Accumulator()
    for delta in deltas:
        rebuilt.feed(delta)
    again = rebuilt.finish()
    assert again.text == response.text
    assert [(c.id, c.arguments) for c in again.tool_calls] == [
        (c.id, c.arguments) for c in response.tool_calls]
    assert streamed(deltas, "text_delta") == response.text
    thinking = "".join(b.thinking for b in response.content if b.type == "thinking")
    assert streamed(deltas, "thinking_delta") == thinking
    for call in response.tool_calls:
        fragments = "".join(d.argument_delta or "" for d in deltas
                            if d.type == "tool_use_delta" and d.tool_call_id == call.id)
        assert orjson.loads(fragments) == call.arguments
        ends = [d for d in deltas if d.type == "tool_use_end" and d.tool_call_id == call.id]
        assert ends and ends[-1].arguments == call.arguments


def late_turn(kind: LateKind, where: Any) -> Turn:
    if kind == "text":
        return Turn(text=TEXT, chunk=4, input_tokens=30, output_tokens=20,
                    late=(kind, where))
    if kind == "arguments":
        return Turn(tool_calls=[ToolCall("call_1", "get_weather", {"city": "Zürich — 東京"})],
                    late=(kind, where))
    return Turn(thinking="Überlegung: erst das Wetter, dann die Antwort.",
                signature="c2lnbmF0dXJl+/==", text="Fertig ✓", chunk=3,
                late=(kind, where))


def polite(turn: Turn) -> Turn:
    return Turn(text=turn.text, thinking=turn.thinking, signature=turn.signature,
                tool_calls=turn.tool_calls, chunk=turn.chunk, input_tokens=turn.input_tokens,
                output_tokens=turn.output_tokens)


#: (target, where) for a late thinking delta: the targets that stream thinking; after the
#: answer's end only where thinking deltas name their block (the canonical protocol's do not:
#: after the text, they are new thinking)
LATE_THINKING = [pytest.param(t, where, id=f"{t.name}-{where}") for t in TARGETS
                 if t.supports_thinking for where in ("next", "end")
                 if not (where == "end" and t.make_fake is CanonicalFake)]


@pytest.mark.parametrize("where", ["next", "end"])
@pytest.mark.parametrize("kind", ["text", "arguments"])
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_late_delta_is_kept_once_and_streamed(
    target: Target, kind: LateKind, where: str, mode: str
) -> None:
    check_late(target, kind, where, mode)


@pytest.mark.parametrize(("target", "where"), LATE_THINKING, indirect=["target"])
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_late_thinking_delta_is_kept_once_and_streamed(
    target: Target, where: str, mode: str
) -> None:
    check_late(target, "thinking", where, mode)


def check_late(target: Target, kind: LateKind, where: str, mode: str) -> None:
    turn = late_turn(kind, where)
    deltas, response = answer(target, turn, mode)
    _, in_order = answer(target, polite(turn), mode)
    assert response.model_dump() == in_order.model_dump()
    check_stream_shows_the_response(deltas, response)


@only(INDEXED)
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_late_text_delta_joins_its_own_block_past_a_later_one(target: Target, mode: str) -> None:
    """The text's last delta comes after the tool call that follows it (and after the terminal
    event): it joins the text block, not a new block after the call."""
    turn = Turn(text=TEXT, chunk=4, late=("text", "end"),
                tool_calls=[ToolCall("call_1", "get_weather", {"city": "Lyon"})])
    deltas, response = answer(target, turn, mode)
    _, in_order = answer(target, polite(turn), mode)
    assert response.model_dump() == in_order.model_dump()
    assert [b.type for b in response.content] == ["text", "tool_use"]
    assert response.text == TEXT
    assert sorted(streamed(deltas, "text_delta")) == sorted(TEXT)  # every piece, once
    assert [d.type for d in deltas if d.type != "text_delta"][-1] == "tool_use_end"


def test_the_fake_sends_the_delta_late() -> None:
    """The moved event really is late: after its block's stop, or after ``message_stop``."""
    from ..fakes.anthropic import AnthropicFake
    from ..fakes.provider import send_late
    from ..fakes.server import RecordedRequest

    fake: Any = AnthropicFake()
    body = orjson.dumps({"model": "claude-sonnet-4-5", "stream": True})
    request = RecordedRequest("POST", "/v1/messages", {}, {}, body)
    events = fake.render_events(Turn(text="abcdefgh", chunk=4), request)
    nxt = b"".join(send_late(events, b'"type": "text_delta"', "next"))
    assert nxt.index(b'"text": "efgh"') > nxt.index(b"content_block_stop")
    end = send_late(events, b'"type": "text_delta"', "end")
    assert end[-1].index(b'"text": "efgh"') > end[-1].index(b"message_stop")
