"""One event pipeline: deltas become an answer in one place (``Accumulator.feed``), an answer
becomes its events in one place (``Response.deltas`` / ``Response.events``), a turn's events are
collected by one ``TurnAccumulator`` (sessions, the cache, the notebook), and one footer renderer
serves ``Response._repr_markdown_`` and ``%%chat``.

Streams and sessions here talk to the canonical fake over loopback HTTP."""

from __future__ import annotations

import ast
import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import BaseModel

from dispatch_nb import (
    MessageDoneEvent,
    RedactedThinkingBlock,
    Response,
    Session,
    StreamDelta,
    TextBlock,
    ThinkingBlock,
    ToolUseBlock,
    Usage,
    tool,
)
from dispatch_nb.cache import CachedAdapter, ResponseCache
from dispatch_nb.notebook.display import Transcript
from dispatch_nb.providers.fake import CanonicalAdapter
from dispatch_nb.render import footer_line, footer_text, name_spec
from dispatch_nb.stream import Accumulator
from dispatch_nb.turn import TextPart, ToolRun, TurnAccumulator

from ..fakes.canonical import CanonicalFake
from ..fakes.provider import ToolCall, Turn

ROOT = Path(__file__).resolve().parents[2]


def _bad_arguments_call() -> ToolUseBlock:
    acc = Accumulator()
    acc.tool_start(0, "call_bad", "lookup")
    acc.tool_delta(0, '{"city": "Par')
    return acc.finish().tool_calls[0]


BAD = _bad_arguments_call()
ANSWERS = {
    "text": Response(content=[TextBlock("Hello there")], model="m",
                     usage=Usage(input_tokens=3, output_tokens=2), stop_reason="end_turn"),
    "empty": Response(model="m", stop_reason="end_turn"),
    "rich": Response(
        content=[
            ThinkingBlock(thinking="The user wants weather.", signature="sig-1",
                          provider_data={"id": "rs_1"}),
            RedactedThinkingBlock(data="opaque=="),
            TextBlock("Let me look.", provider_data={"id": "msg_1"}),
            ToolUseBlock(id="c1", name="get_weather", arguments={"city": "Paris", "n": [1, 2]}),
        ],
        tool_calls=[ToolUseBlock(id="c1", name="get_weather",
                                 arguments={"city": "Paris", "n": [1, 2]})],
        model="gpt-x", stop_reason="tool_use", provider_data={"response_id": "r1"},
        usage=Usage(input_tokens=1200, output_tokens=34, cache_read_tokens=100),
    ),
    "bad tool arguments": Response(content=[BAD], tool_calls=[BAD], model="m",
                                   stop_reason="tool_use"),
}


@pytest.mark.parametrize("name", list(ANSWERS))
def test_a_response_replays_its_events_into_an_equal_response(name: str) -> None:
    response = ANSWERS[name]
    events = response.events()
    assert isinstance(events[-1], MessageDoneEvent) and events[:-1] == response.deltas()
    turn = TurnAccumulator.replay(events)
    assert turn.response == response
    assert turn.rounds == [response] and turn.usage == response.usage
    # what streamed is the answer's text, thinking and tool calls
    assert turn.text == response.text and turn.thinking == response.thinking
    assert [t.id for t in turn.tools] == [c.id for c in response.tool_calls]
    # the dump (saved notebooks, cache files) is untouched by the new methods
    assert Response.model_validate(response.model_dump(mode="json")) == response


@pytest.mark.parametrize("name", ["text", "empty", "bad tool arguments"])
def test_deltas_fed_to_an_accumulator_rebuild_the_blocks(name: str) -> None:
    response = ANSWERS[name]
    acc = Accumulator(response.model)
    for delta in response.deltas():
        acc.feed(delta)
    rebuilt = acc.finish()
    assert rebuilt.content == response.content
    assert rebuilt.tool_calls == response.tool_calls
    if name == "bad tool arguments":  # the raw text and the error survive a replay
        call = rebuilt.tool_calls[0]
        assert call.raw_arguments == '{"city": "Par' and call.arguments_error == BAD.arguments_error


def test_feed_merges_text_like_a_stream_and_ignores_unknown_tool_fragments() -> None:
    acc = Accumulator()
    for delta in [StreamDelta(type="text_delta", text="Hel"),
                  StreamDelta(type="text_delta", text="lo"),
                  StreamDelta(type="tool_use_delta", tool_call_id="nope", argument_delta="{"),
                  StreamDelta(type="tool_use_end", tool_call_id="nope", arguments={}),
                  StreamDelta(type="thinking_delta", text="hm"),
                  StreamDelta(type="text_delta", text="!")]:
        acc.feed(delta)
    assert [(b.type, getattr(b, "text", None)) for b in acc.finish().content] == [
        ("text", "Hello"), ("thinking", None), ("text", "!")]
    assert list(acc.pieces()) == [("text", "Hello"), ("thinking", "hm"), ("text", "!")]


# -- streams keep their event log -----------------------------------------------------------------
@pytest.fixture
def fake() -> Iterator[CanonicalFake]:
    with CanonicalFake() as f:
        yield f


@pytest.fixture
def adapter(fake: CanonicalFake) -> Iterator[CanonicalAdapter]:
    a = CanonicalAdapter("echo", base_url=fake.base_url, max_retries=0)
    yield a
    a.close()


RICH = Turn(text="Let me look that up for you, it will take a second.",
            thinking="The user wants the weather.", signature="sig-abc123",
            tool_calls=[ToolCall("call_1", "get_weather", {"city": "Paris"})],
            input_tokens=31, output_tokens=17, chunk=4)


def test_a_stream_kept_log_is_exactly_what_it_yielded(fake: CanonicalFake,
                                                      adapter: CanonicalAdapter) -> None:
    fake.push(RICH)
    with adapter.stream("Weather?").keep_events() as stream:
        seen = list(stream)
    assert len(seen) > 10 and stream.events == seen
    assert all(a is b for a, b in zip(stream.events, seen, strict=True))  # references, no copies
    turn = TurnAccumulator.replay([*stream.events, MessageDoneEvent(response=stream.response)])
    assert turn.response == stream.response
    rebuilt = Accumulator()
    for delta in stream.events:
        rebuilt.feed(delta)
    assert rebuilt.finish().text == stream.response.text
    assert rebuilt.finish().tool_calls == stream.response.tool_calls


def test_a_stream_log_without_keep_events_is_the_compact_accumulator(
    fake: CanonicalFake, adapter: CanonicalAdapter
) -> None:
    fake.push(RICH)
    with adapter.stream("Weather?") as stream:
        first = next(iter(stream))
        assert first.type == "thinking_delta"
        assert stream.events == stream.partial.deltas()  # what arrived so far
        rest = list(stream)
    assert len(rest) > 10
    assert stream.events == stream.response.deltas()  # one delta per block, nothing kept per delta


async def test_an_async_stream_keeps_its_log_too(fake: CanonicalFake,
                                                 adapter: CanonicalAdapter) -> None:
    fake.push(RICH)
    async with adapter.astream("Weather?").keep_events() as stream:
        seen = [delta async for delta in stream]
    assert stream.events == seen and stream.response.text == RICH.text


def test_closing_a_logged_stream_releases_it(fake: CanonicalFake, adapter: CanonicalAdapter) -> None:
    fake.push(RICH, Turn(text="still usable"))
    stream = adapter.stream("Weather?").keep_events()
    first = next(stream)
    stream.close()  # closes the HTTP stream under the log
    assert stream.events == [first] and list(stream) == []
    assert stream.partial.thinking == first.text
    assert adapter.chat("again").text == "still usable"
    never = adapter.stream("unsent").keep_events()
    never.close()
    assert never.events == [] and len(fake.chat_requests) == 2  # nothing was sent for it


# -- one turn accumulator for sessions ------------------------------------------------------------
@tool
def get_weather(city: str) -> dict[str, object]:
    """Current weather for a city.

    Args:
        city: The city name.
    """
    return {"city": city, "temp_c": 21}


def test_a_session_turn_collected_by_the_turn_accumulator(fake: CanonicalFake,
                                                          adapter: CanonicalAdapter) -> None:
    fake.push(RICH, Turn(text="It is 21 °C in Paris.", input_tokens=50, output_tokens=9))
    session = Session(adapter, tools=[get_weather])
    turn = TurnAccumulator()
    for event in session.stream("Weather in Paris?"):
        turn.feed(event)
    assert len(turn.rounds) == 2 and turn.response == session.last_response
    assert turn.usage == session.usage
    assert turn.messages() == session.history[1:]  # what the turn added after the user message
    run = turn.tool("call_1")
    assert isinstance(run, ToolRun) and run.arguments == {"city": "Paris"}
    assert json.loads(run.result or "") == {"city": "Paris", "temp_c": 21}
    assert [type(p).__name__ for p in turn.parts()] == ["TextPart", "TextPart", "ToolRun",
                                                        "TextPart"]
    assert turn.text == RICH.text + "It is 21 °C in Paris."
    # the turn's events replay into the same rounds, results and usage
    again = TurnAccumulator.replay(turn.events())
    assert again.rounds == turn.rounds and again.results == turn.results
    assert again.usage == turn.usage and again.messages() == turn.messages()
    assert isinstance(again.parts()[0], TextPart)


@pytest.mark.parametrize("mode", ["send", "asend"])
def test_a_session_collects_each_turn_in_its_own_turn_accumulator(
    fake: CanonicalFake, adapter: CanonicalAdapter, mode: str
) -> None:
    # The session's own turn state is a TurnAccumulator (rounds and tool results as they happen),
    # kept as session.last_turn: the same thing a caller feeding the events by hand collects.
    fake.push(RICH, Turn(text="It is 21 °C in Paris.", input_tokens=50, output_tokens=9))
    session = Session(adapter, tools=[get_weather])
    assert session.last_turn is None
    if mode == "send":
        answer = session.send("Weather in Paris?")
    else:
        answer = asyncio.run(session.asend("Weather in Paris?"))
    turn = session.last_turn
    assert isinstance(turn, TurnAccumulator)
    assert turn.response == answer == session.last_response
    assert [r.text for r in turn.rounds] == [RICH.text, "It is 21 °C in Paris."]
    assert turn.usage == session.usage
    assert [e.tool_name for e in turn.results] == ["get_weather"]
    assert json.loads(turn.results[0].result.text) == {"city": "Paris", "temp_c": 21}
    assert turn.messages() == session.history[1:]
    fake.push(Turn(text="Anything else?"))
    session.send("Thanks")
    assert session.last_turn is not turn and session.last_turn.rounds[0].text == "Anything else?"
    assert session.last_turn.results == []
    session.clear_history()
    assert session.last_turn is None


# -- the cache replays through the same accumulator -----------------------------------------------
def test_a_cache_round_trip_goes_through_the_shared_accumulator(fake: CanonicalFake,
                                                                tmp_path: Path) -> None:
    path = tmp_path / "c.dispatch-cache.jsonl"
    fake.push(RICH)
    inner = CanonicalAdapter("echo", base_url=fake.base_url, max_retries=0)
    with CachedAdapter(inner, ResponseCache(path, "record")).stream("Weather?") as live:
        recorded_deltas = list(live)
    recorded = live.response
    player = CachedAdapter(inner, ResponseCache(path, "replay"))
    with player.stream("Weather?") as replay:
        shown = []
        for delta in replay:
            shown.append(delta)
            partial = replay.partial  # rebuilt by Accumulator.feed as the deltas are replayed
            expect = Accumulator(recorded.model)
            for d in shown:
                expect.feed(d)
            assert partial == expect.snapshot()
    assert shown == recorded_deltas
    assert replay.response == recorded  # the recorded answer itself, signature included
    turn = TurnAccumulator.replay([*shown, MessageDoneEvent(response=replay.response)])
    assert turn.response == recorded and turn.text == recorded.text

    # an unstreamed recording stores the deltas Response.deltas() gives
    fake.push(Turn(text="plain answer", chunk=3))
    answer = CachedAdapter(inner, ResponseCache(path, "record")).chat("plain?", stream=False)
    entry = [json.loads(line) for line in path.read_text().splitlines()][-1]
    assert [{k: v for k, v in d.items() if k != "t"} for d in entry["deltas"]] == [
        d.model_dump(mode="json", exclude_none=True) for d in answer.deltas()]
    inner.close()


# -- one footer ----------------------------------------------------------------------------------
def test_one_footer_for_a_response_and_a_chat_cell() -> None:
    response = ANSWERS["rich"].model_copy()  # (named below: not the module's own)
    transcript = Transcript("openai:gpt-x")
    for event in response.events():
        transcript.feed(event)
    cell = transcript.footer(None)
    # a cell names the model by the spec it asked (as its live view, -m and %chat status do);
    # an answer knows only the model's own name, until the cell that asked names it
    assert footer_text(response) == "gpt-x · 1,200 in / 34 out tokens (100 cached) · stop: tool_use"
    name_spec(response, "openai:gpt-x")
    assert cell == footer_text(response) == footer_line(
        model="openai:gpt-x", usage=response.usage, stop_reason="tool_use")
    assert cell == "openai:gpt-x · 1,200 in / 34 out tokens (100 cached) · stop: tool_use"
    assert response._repr_markdown_().endswith(f"<sub>{cell}</sub>")
    assert transcript.footer(2.04) == footer_text(response, latency=2.04)
    transcript.replayed = True
    assert transcript.footer(2.04).endswith("tokens (100 cached) · replayed · stop: tool_use")
    # what the saved notebooks show
    plain = Transcript("local:smollm2")
    for event in Response(content=[TextBlock("x")], model="smollm2",
                          usage=Usage(input_tokens=56, output_tokens=26)).events():
        plain.feed(event)
    assert plain.footer(None) == "local:smollm2 · 56 in / 26 out tokens"
    # the model that answered, when it is not the one asked for (a dated version)
    dated = Transcript("openai:gpt-4.1")
    dated.feed(MessageDoneEvent(response=Response(model="gpt-4.1-2025-04-14")))
    assert dated.footer(None) == "openai:gpt-4.1 (gpt-4.1-2025-04-14)"


def test_an_answer_from_python_names_its_provider_in_its_footer(
    fake: CanonicalFake, adapter: CanonicalAdapter, tmp_path: Path
) -> None:
    """Every path that ends in a Response from Python (chat, stream, async, output=, a session,
    a replay) names the model as ``provider:model``, as the notebook's footers do."""
    class Pick(BaseModel):
        n: int

    assert adapter.spec == "fake:echo"
    fake.push(Turn(text="a"), Turn(text="b"), Turn(text="c"), Turn(text='{"n": 1}'),
              Turn(text="d"), Turn(text="e"))
    answers = [adapter.chat("x"), adapter.chat("x", stream=True)]
    with adapter.stream("x") as stream:
        list(stream)
    answers.append(stream.response)
    answers.append(adapter.chat("x", output=Pick))
    answers.append(asyncio.run(adapter.achat("x")))
    answers.append(Session(adapter).send("x"))
    for answer in answers:
        assert footer_text(answer).startswith("fake:echo · "), footer_text(answer)
        assert "<sub>fake:echo · " in answer._repr_markdown_()
    path = tmp_path / "cache.jsonl"
    fake.push(Turn(text="recorded"))
    CachedAdapter(adapter, ResponseCache(path, "record")).chat("y")
    replayed = CachedAdapter(adapter, ResponseCache(path, "replay")).chat("y")
    assert footer_text(replayed).startswith("fake:echo · ") and "replayed" in footer_text(replayed)
    # a Response made by hand knows no provider: its model alone
    assert footer_text(Response(model="gpt-x")) == "gpt-x"


def test_render_does_not_import_types() -> None:
    tree = ast.parse((ROOT / "dispatch_nb" / "render.py").read_text())
    imported = {
        node.module for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module
    } | {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import)
         for alias in node.names}
    assert not any(name == "types" or name.endswith(".types") for name in imported), imported
