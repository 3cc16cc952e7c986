"""Session: history, the tool loop, stream events, failures mid-turn, async twins, serialization.

Every test talks to the canonical protocol's loopback fake (``tests/fakes/canonical.py``), which
rejects a tool result that answers no tool call, so a broken history shows up as a 400.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
import uuid
from typing import Any

import pytest

from dispatch_nb import (
    ErrorEvent,
    ImageBlock,
    Message,
    MessageDoneEvent,
    RedactedThinkingBlock,
    RequestError,
    Response,
    ServerError,
    StreamDelta,
    TextBlock,
    ThinkingBlock,
    ToolDefinition,
    ToolResultBlock,
    ToolResultEvent,
    ToolUseBlock,
    Usage,
)
from dispatch_nb.adapter import Adapter
from dispatch_nb.providers.fake import CanonicalAdapter
from dispatch_nb.session import CancelToken, Session, tool

from ..fakes.canonical import CanonicalFake
from ..fakes.provider import Fail, ToolCall, Turn


def sent(fake: CanonicalFake, index: int = -1) -> dict[str, Any]:
    body: dict[str, Any] = fake.chat_requests[index].json
    return body


def roles(fake: CanonicalFake, index: int = -1) -> list[str]:
    return [m["role"] for m in sent(fake, index)["messages"]]


calls_made: list[tuple[str, Any]] = []


@tool
def get_weather(city: str) -> dict[str, Any]:
    """Current weather for a city.

    Args:
        city: The city name.
    """
    calls_made.append(("get_weather", city))
    return {"city": city, "temp_c": 21}


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    calls_made.append(("add", (a, b)))
    return a + b


@pytest.fixture(autouse=True)
def _reset_calls() -> None:
    calls_made.clear()


# -- conversations -------------------------------------------------------------------------------
def test_send_keeps_a_conversation(fake: CanonicalFake, adapter: CanonicalAdapter) -> None:
    session = Session(adapter, system="Be brief.", max_tokens=50, temperature=0.3)
    first = session.send("Hello")
    second = session.send([TextBlock("How"), " are you?"])
    assert (first.text, second.text) == ("echo: Hello", "echo: How are you?")
    assert [m.role for m in session.history] == ["user", "assistant", "user", "assistant"]
    body = sent(fake)
    assert (body["system"], body["max_tokens"], body["temperature"]) == ("Be brief.", 50, 0.3)
    assert roles(fake) == ["user", "assistant", "user"]
    assert session.usage == Usage(input_tokens=24, output_tokens=14)
    assert session.last_response == second


def test_per_call_options_beat_session_defaults(fake: CanonicalFake, adapter: CanonicalAdapter) -> None:
    session = Session(adapter, system="default", max_tokens=50)
    session.send("x", max_tokens=7, system="just this turn", temperature=1.5)
    assert (sent(fake)["max_tokens"], sent(fake)["system"], sent(fake)["temperature"]) == (
        7, "just this turn", 1.5)
    session.set_system_prompt("new")
    session.send("y")
    assert (sent(fake)["max_tokens"], sent(fake)["system"]) == (50, "new")
    session.set_system_prompt(None)
    session.send("z")
    assert sent(fake)["system"] is None


def test_content_forms(fake: CanonicalFake, adapter: CanonicalAdapter) -> None:
    session = Session(adapter)
    session.send(Message(role="user", content="as a message"))
    session.send({"role": "user", "content": "as a dict"})
    session.send([{"type": "text", "text": "a block dict"},
                  ImageBlock(source="https://example.org/cat.png")])
    assert [b["type"] for b in sent(fake)["messages"][-1]["content"]] == ["text", "image"]
    with pytest.raises(ValueError, match="role='user'"):
        session.send(Message(role="assistant", content="no"))
    with pytest.raises(ValueError, match="nothing to send"):
        session.send("")
    with pytest.raises(TypeError, match="content must be"):
        session.send(42)
    with pytest.raises(TypeError, match="set_tools"):
        session.send("x", tools=[add])
    with pytest.raises(TypeError, match="does not understand option"):
        session.send("x", bogus=1)
    with pytest.raises(ValueError, match="temperature"):
        session.send("x", temperature=7)
    assert len(session.history) == 6  # refused sends left no trace
    assert len(fake.chat_requests) == 3


def test_session_ids(adapter: CanonicalAdapter) -> None:
    a, b = Session(adapter), Session(adapter)
    assert a.id != b.id and uuid.UUID(hex=a.id).hex == a.id
    assert Session(adapter, id="thread-7").id == "thread-7"


def test_session_from_a_model_spec(fake: CanonicalFake, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DISPATCH_NB_FAKE_URL", fake.base_url)
    with Session("fake:echo") as session:
        assert isinstance(session.adapter, CanonicalAdapter) and session.model == "echo"
        assert session.send("spec").text == "echo: spec"
    with pytest.raises(TypeError, match="Adapter or a model spec"):
        Session(3.14)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_tool_rounds"):
        Session("fake:echo", max_tool_rounds=-1)


def test_clear_history_keeps_usage_and_settings(adapter: CanonicalAdapter) -> None:
    session = Session(adapter, system="s", tools=[add])
    session.send("x")
    usage = session.usage
    session.clear_history()
    assert session.history == [] and session.usage == usage
    assert session.system == "s" and session.tools == [add]


def test_history_can_be_replaced(fake: CanonicalFake, adapter: CanonicalAdapter) -> None:
    session = Session(adapter)
    session.history = [{"role": "user", "content": "earlier"},
                       Message(role="assistant", content="noted")]
    session.send("now")
    assert roles(fake) == ["user", "assistant", "user"]


def test_thinking_signatures_go_back_verbatim(fake: CanonicalFake, adapter: CanonicalAdapter) -> None:
    fake.push(Turn(text="Done.", thinking="Let me think.", signature="sig-abc=="))
    session = Session(adapter)
    session.send("think", stream=True)
    block = session.history[1].blocks[0]
    assert isinstance(block, ThinkingBlock) and block.signature == "sig-abc=="
    session.send("again")
    assert sent(fake)["messages"][1]["content"][0] == {
        "type": "thinking", "thinking": "Let me think.", "signature": "sig-abc=="}


# -- the tool loop -------------------------------------------------------------------------------
def test_tool_loop_runs_calls_in_order(fake: CanonicalFake, adapter: CanonicalAdapter) -> None:
    fake.push(
        Turn(text="Checking.", tool_calls=[ToolCall("c1", "get_weather", {"city": "Paris"}),
                                           ToolCall("c2", "add", {"a": 2, "b": 3}),
                                           ToolCall("c3", "get_weather", {"city": "Oslo"})]),
        Turn(text="Paris 21, Oslo 21, and 5."),
    )
    session = Session(adapter, tools=[get_weather, add])
    response = session.send("Weather and a sum?")
    assert response.text == "Paris 21, Oslo 21, and 5."
    assert calls_made == [("get_weather", "Paris"), ("add", (2, 3)), ("get_weather", "Oslo")]
    assert fake.tool_names_of(fake.chat_requests[0]) == ["get_weather", "add"]
    results = sent(fake)["messages"][2]["content"]
    assert [r["tool_use_id"] for r in results] == ["c1", "c2", "c3"]
    assert [r["content"] for r in results] == [
        '{"city":"Paris","temp_c":21}', "5", '{"city":"Oslo","temp_c":21}']
    assert [m.role for m in session.history] == ["user", "assistant", "user", "assistant"]
    assert session.usage.input_tokens == 24 and not session.tool_limit_reached


def test_plain_functions_are_wrapped_as_tools(fake: CanonicalFake, adapter: CanonicalAdapter) -> None:
    def multiply(a: int, b: int) -> int:
        """Multiply two integers."""
        return a * b

    fake.push(Turn(tool_calls=[ToolCall("m1", "multiply", {"a": 6, "b": 7})]), Turn(text="42"))
    session = Session(adapter, tools=[multiply])
    assert session.send("6*7?").text == "42"
    assert sent(fake)["messages"][2]["content"][0]["content"] == "42"
    assert sent(fake, 0)["tools"][0]["description"] == "Multiply two integers."


def test_tool_problems_go_back_to_the_model(fake: CanonicalFake, adapter: CanonicalAdapter) -> None:
    @tool
    def explode() -> str:
        raise RuntimeError("the database is down")

    fake.push(
        Turn(tool_calls=[ToolCall("e1", "explode"),
                         ToolCall("e2", "add", {"a": "x", "b": 1}),
                         ToolCall("e3", "add", '{"a": 1, "b": '),
                         ToolCall("e4", "teleport", {"to": "Mars"})]),
        Turn(text="Sorry, those failed."),
    )
    session = Session(adapter, tools=[add, explode])
    assert session.send("go", stream=True).text == "Sorry, those failed."
    results = {r["tool_use_id"]: r for r in sent(fake)["messages"][2]["content"]}
    assert all(r["is_error"] for r in results.values())
    assert results["e1"]["content"] == "explode failed: RuntimeError: the database is down"
    assert results["e2"]["content"].startswith("invalid arguments for add: a: Input should be")
    assert "not valid JSON" in results["e3"]["content"]
    assert results["e4"]["content"] == "unknown tool 'teleport'; available tools: add, explode"
    assert calls_made == []


def test_max_tool_rounds_stops_a_runaway_loop(
    fake: CanonicalFake, adapter: CanonicalAdapter, caplog: pytest.LogCaptureFixture
) -> None:
    fake.push(*[Turn(text=f"round {i}", tool_calls=[ToolCall(f"c{i}", "add", {"a": i, "b": 1})])
                for i in range(4)])
    session = Session(adapter, tools=[add], max_tool_rounds=3)
    response = session.send("loop forever")
    warnings = [r for r in caplog.records if r.name == "dispatch_nb" and r.levelname == "WARNING"]
    assert any("stopped after 3 tool rounds" in r.getMessage() for r in warnings)
    assert len(fake.chat_requests) == 4  # 3 rounds of tools, then the 4th answer is not run
    assert response.text == "round 3" and response.stop_reason == "tool_use"
    assert session.tool_limit_reached
    assert [c[1] for c in calls_made] == [(0, 1), (1, 1), (2, 1)]
    last = session.history[-1]
    assert last.role == "user"
    (result,) = last.blocks
    assert isinstance(result, ToolResultBlock) and result.is_error
    assert result.tool_use_id == "c3" and "max_tool_rounds" in result.text
    # everything is kept, and the conversation goes on
    assert len(session.history) == 9
    fake.push(Turn(text="OK, stopping."))
    assert session.send("continue").text == "OK, stopping."
    assert not session.tool_limit_reached
    assert roles(fake)[-1] == "user" and roles(fake).count("user") == 5


def test_max_tool_rounds_zero_never_runs_tools(fake: CanonicalFake, adapter: CanonicalAdapter) -> None:
    fake.push(Turn(tool_calls=[ToolCall("c1", "add", {"a": 1, "b": 1})]))
    session = Session(adapter, tools=[add], max_tool_rounds=0)
    assert session.send("x").tool_calls[0].id == "c1"
    assert calls_made == [] and session.tool_limit_reached


def test_declared_tools_without_handlers_come_back_to_the_caller(
    fake: CanonicalFake, adapter: CanonicalAdapter
) -> None:
    lookup = ToolDefinition(name="lookup", description="Client-side lookup",
                            parameters={"type": "object", "properties": {"q": {"type": "string"}}})
    fake.push(Turn(tool_calls=[ToolCall("l1", "lookup", {"q": "x"})]), Turn(text="Thanks."))
    session = Session(adapter, tools=[lookup, add])
    assert session.unhandled_tools == ["lookup"]
    response = session.send("find x")
    assert response.stop_reason == "tool_use" and response.tool_calls[0].name == "lookup"
    with pytest.raises(ValueError, match=r"lookup \(id 'l1'\)"):
        session.send("never mind")
    answer = session.send([ToolResultBlock(tool_use_id="l1", content="found")])
    assert answer.text == "Thanks."
    assert sent(fake)["messages"][-1]["content"][0]["tool_use_id"] == "l1"


def test_set_tools(fake: CanonicalFake, adapter: CanonicalAdapter) -> None:
    session = Session(adapter, tools=[add])
    session.set_tools([get_weather, {"type": "web_search"}])
    session.send("x")
    assert sent(fake)["tools"] == [get_weather.definition.model_dump(), {"type": "web_search"}]
    session.set_tools(None)
    session.send("y")
    assert sent(fake)["tools"] == []
    with pytest.raises(ValueError, match="unique"):
        session.set_tools([add, add])
    with pytest.raises(TypeError, match="a tool must be"):
        session.set_tools([42])


# -- streams -------------------------------------------------------------------------------------
def test_stream_events(fake: CanonicalFake, adapter: CanonicalAdapter) -> None:
    fake.push(
        Turn(text="Let me see.", chunk=4, tool_calls=[ToolCall("c1", "add", {"a": 1, "b": 2})],
             input_tokens=10, output_tokens=5),
        Turn(text="It is 3.", input_tokens=20, output_tokens=3),
    )
    session = Session(adapter, tools=[add])
    with session.stream("1+2?") as events:
        seen = list(events)
    kinds = [e.type for e in seen]
    first_done = kinds.index("message_done")
    assert kinds[:3] == ["text_delta"] * 3
    assert kinds[3] == "tool_use_start" and kinds[first_done - 1] == "tool_use_end"
    assert kinds[first_done + 1] == "tool_result"
    assert kinds[-1] == "message_done" and kinds.count("message_done") == 2
    done = [e for e in seen if isinstance(e, MessageDoneEvent)]
    assert [d.response.stop_reason for d in done] == ["tool_use", "end_turn"]
    assert [d.response.usage.input_tokens for d in done] == [10, 20]
    (result,) = [e for e in seen if isinstance(e, ToolResultEvent)]
    assert (result.tool_name, result.result.content, result.result.is_error) == ("add", "3", False)
    assert result.duration >= 0
    text = "".join(e.text or "" for e in seen if isinstance(e, StreamDelta))
    assert text == "Let me see.It is 3."
    assert events.response.text == "It is 3."
    assert session.usage == Usage(input_tokens=30, output_tokens=8)


def test_stream_is_lazy_and_response_finishes_it(fake: CanonicalFake, adapter: CanonicalAdapter) -> None:
    session = Session(adapter)
    stream = session.stream("lazy")
    assert fake.chat_requests == [] and session.history == []
    assert stream.response.text == "echo: lazy"
    assert len(session.history) == 2


def test_stream_error_event_then_raise(fake: CanonicalFake, adapter: CanonicalAdapter) -> None:
    fake.push(Fail(400, "bad request"))
    session = Session(adapter)
    seen: list[Any] = []

    def consume() -> None:
        for event in session.stream("x"):
            seen.append(event)

    with pytest.raises(RequestError, match="bad request") as info:
        consume()
    assert (info.value.status_code, info.value.code) == (400, "invalid_request")
    assert len(seen) == 1 and isinstance(seen[0], ErrorEvent)
    assert isinstance(seen[0].error, RequestError)
    assert (seen[0].error.status_code, seen[0].error.code) == (400, "invalid_request")

    fake.push(Fail(400, "bad again"))
    quiet = session.stream("y", raise_errors=False)
    events = list(quiet)
    assert [e.type for e in events] == ["error"]
    assert quiet.error is events[0].error
    with pytest.raises(RequestError) as info:
        quiet.response  # noqa: B018
    assert (info.value.status_code, info.value.code) == (400, "invalid_request")


def test_failure_mid_stream_keeps_history_consistent(
    fake: CanonicalFake, adapter: CanonicalAdapter
) -> None:
    fake.push(Turn(text="abcdefgh", chunk=2, error_after=2,
                   error=Fail(529, "Overloaded", "overloaded_error")))
    session = Session(adapter)
    events = session.stream("first question", raise_errors=False)
    error_events = [e for e in events if isinstance(e, ErrorEvent)]
    error = error_events[0].error
    assert isinstance(error, ServerError) and (error.status_code, error.code) == (529, "server_error")
    assert error.partial is not None and error.partial.text == "abcd"
    # the user message stays; the unfinished answer is not in history
    assert [m.text for m in session.history] == ["first question"]
    session.send("second question")
    # both questions go as one user turn, so strict providers accept them
    assert sent(fake)["messages"] == [{"role": "user", "content": [
        {"type": "text", "text": "first question"}, {"type": "text", "text": "second question"}]}]
    assert [m.role for m in session.history] == ["user", "user", "assistant"]


def test_failure_after_a_tool_round_keeps_the_round(
    fake: CanonicalFake, adapter: CanonicalAdapter
) -> None:
    fake.push(Turn(tool_calls=[ToolCall("c1", "add", {"a": 1, "b": 1})]),
              Fail(500, "server fell over"))
    session = Session(adapter, tools=[add])
    with pytest.raises(ServerError) as info:
        session.send("1+1")
    assert (info.value.status_code, info.value.code) == (500, "server_error")
    assert [m.role for m in session.history] == ["user", "assistant", "user"]
    assert isinstance(session.history[-1].blocks[0], ToolResultBlock)
    assert session.send("try again").text == "echo: try again"


def test_one_turn_at_a_time(fake: CanonicalFake, adapter: CanonicalAdapter) -> None:
    fake.push(Turn(text="slow answer", chunk=1, delay=0.01))
    session = Session(adapter)
    stream = session.stream("first")
    next(iter(stream))
    with pytest.raises(RuntimeError, match="already running a turn"):
        session.send("second")
    stream.close()
    # the interrupted question stays in history and goes along with the next one
    assert session.send("third").text == "echo: firstthird"
    assert [m.text for m in session.history] == ["first", "third", "echo: firstthird"]


def test_closing_a_stream_early_ends_the_turn(fake: CanonicalFake, adapter: CanonicalAdapter) -> None:
    fake.push(Turn(text="x" * 200, chunk=1, delay=0.005))
    session = Session(adapter)
    with session.stream("go") as stream:
        for i, _ in enumerate(stream):
            if i == 5:
                break
        assert stream.partial is not None and stream.partial.text == "x" * 6
    assert [m.role for m in session.history] == ["user"]
    with pytest.raises(Exception, match="closed before the turn finished"):
        stream.response  # noqa: B018


# -- async ---------------------------------------------------------------------------------------
def test_async_tools_run_concurrently_in_call_order(
    fake: CanonicalFake, adapter: CanonicalAdapter
) -> None:
    """The four calls run at once: each tool waits until all four have started (run one after
    another, the first would wait in vain), then B (the shortest wait) finishes first."""
    order: list[str] = []
    started: set[str] = set()
    all_started = threading.Event()

    def begin(name: str) -> None:
        started.add(name)
        if len(started) == 4:
            all_started.set()

    @tool
    async def slow(name: str, seconds: float) -> str:
        begin(name)
        for _ in range(1000):  # up to 10 s
            if all_started.is_set():
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(seconds)
        order.append(name)
        return name if all_started.is_set() else f"{name} ran alone"

    @tool
    def blocking(name: str) -> str:
        begin(name)
        together = all_started.wait(10)
        time.sleep(0.3)
        order.append(name)
        return name if together else f"{name} ran alone"

    fake.push(
        Turn(tool_calls=[ToolCall("a", "slow", {"name": "A", "seconds": 0.3}),
                         ToolCall("b", "slow", {"name": "B", "seconds": 0.01}),
                         ToolCall("c", "blocking", {"name": "C"}),
                         ToolCall("d", "blocking", {"name": "D"})]),
        Turn(text="all done"),
    )
    session = Session(adapter, tools=[slow, blocking])

    response = asyncio.run(session.asend("go"))
    assert response.text == "all done"
    assert all_started.is_set(), f"only {sorted(started)} ever ran at once"
    assert order[0] == "B"  # finished first...
    results = sent(fake)["messages"][2]["content"]
    assert [r["content"] for r in results] == ["A", "B", "C", "D"]  # ...returned in call order


def test_astream_events_and_errors(fake: CanonicalFake, adapter: CanonicalAdapter) -> None:
    fake.push(Turn(text="hi there", chunk=3, tool_calls=[ToolCall("c1", "add", {"a": 2, "b": 2})]),
              Turn(text="four"), Fail(401, "bad key"))
    session = Session(adapter, tools=[add])

    async def main() -> tuple[list[Any], list[Any], Response]:
        async with session.astream("2+2") as stream:
            events = [e async for e in stream]
        errors: list[Any] = []
        quiet = session.astream("again", raise_errors=False)
        errors = [e async for e in quiet]
        return events, errors, stream.response

    events, errors, final = asyncio.run(main())
    kinds = [e.type for e in events]
    assert kinds.count("message_done") == 2 and "tool_result" in kinds
    assert final.text == "four"
    assert [e.type for e in errors] == ["error"]
    assert [m.role for m in session.history] == ["user", "assistant", "user", "assistant", "user"]


# -- serialization -------------------------------------------------------------------------------
def rich_history() -> list[Message]:
    return [
        Message(role="user", content=[TextBlock("Look:"),
                                      ImageBlock(source="aGVsbG8=", media_type="image/png")]),
        Message(role="assistant", content=[
            ThinkingBlock(thinking="Hmm.", signature="EqQBCkYIARgCIkC+sig==",
                          provider_data={"anthropic": {"raw": {"x": [1, 2]}}}),
            RedactedThinkingBlock(data="ENCRYPTED=="),
            TextBlock(text="Checking.", provider_data={"openai": {"id": "msg_1"}}),
            ToolUseBlock(id="c1", name="add", arguments={"a": 1, "b": 2},
                         provider_data={"openai": {"call_id": "call_1"}}),
            ToolUseBlock(id="c2", name="add", raw_arguments='{"a": 1,',
                         arguments_error="not valid JSON"),
        ]),
        Message(role="user", content=[
            ToolResultBlock(tool_use_id="c1", content=[TextBlock("3")]),
            ToolResultBlock(tool_use_id="c2", content="bad JSON", is_error=True),
        ]),
        Message(role="assistant", content="Three — ünïcödé ✓"),
    ]


def test_to_json_restores_exactly(adapter: CanonicalAdapter) -> None:
    session = Session(adapter, system="sys", tools=[add, {"type": "web_search"}],
                      max_tool_rounds=3, id="abc", max_tokens=99, temperature=0.5)
    session.history = rich_history()
    session._usage = Usage(input_tokens=5, output_tokens=6, cache_read_tokens=7,
                           cache_creation_tokens=8)
    text = session.to_json()
    data = json.loads(text)
    assert data["format"] == "dispatch_nb.session" and data["version"] == 1
    assert data["model"] == "fake:echo" and [t["name"] for t in data["tools"]] == ["add"]

    restored = Session.from_json(text, adapter=adapter, tools=[add])
    assert restored.history == session.history
    assert restored.to_json() == text
    assert (restored.id, restored.system, restored.max_tool_rounds, restored.max_tokens,
            restored.temperature) == ("abc", "sys", 3, 99, 0.5)
    assert restored.usage == session.usage
    assert restored.tools == [add, {"type": "web_search"}] and restored.unhandled_tools == []
    thinking = restored.history[1].blocks[0]
    assert isinstance(thinking, ThinkingBlock) and thinking.signature == "EqQBCkYIARgCIkC+sig=="
    assert thinking.provider_data == {"anthropic": {"raw": {"x": [1, 2]}}}
    assert json.loads(session.to_json(indent=True)) == data


def test_to_json_keeps_a_whole_number_temperature(adapter: CanonicalAdapter) -> None:
    # the saved format writes the settings as given (the code before SavedSession wrote 1, not 1.0)
    text = Session(adapter, id="t", temperature=1).to_json()
    assert '"temperature":1,' in text
    restored = Session.from_json(text, adapter=adapter)
    assert restored.to_json() == text and type(restored.temperature) is int


def test_from_json_says_what_it_takes(adapter: CanonicalAdapter) -> None:
    with pytest.raises(TypeError, match=r"from_json\(\) takes the text session.to_json\(\) "
                                        r"returned \(a str\) — not dict"):
        Session.from_json({"format": "x"}, adapter=adapter)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not a saved session: the text is not JSON"):
        Session.from_json("{oops", adapter=adapter)
    with pytest.raises(ValueError, match="not a saved session: no \"format\""):
        Session.from_json('{"a": 1}', adapter=adapter)


def test_from_json_reattaches_handlers_and_names_missing_ones(
    fake: CanonicalFake, adapter: CanonicalAdapter, monkeypatch: pytest.MonkeyPatch
) -> None:
    session = Session(adapter, tools=[add, get_weather], id="resume-me")
    session.send("hello")
    text = session.to_json()

    with pytest.warns(UserWarning, match=r"no Python handler for tool\(s\) get_weather"):
        partial = Session.from_json(text, adapter=adapter, tools=[add])
    assert partial.unhandled_tools == ["get_weather"]
    assert [getattr(t, "name", None) for t in partial.tools] == ["add", "get_weather"]

    monkeypatch.setenv("DISPATCH_NB_FAKE_URL", fake.base_url)
    restored = Session.from_json(text, tools=[add, get_weather])  # reconnects to "fake:echo"
    assert restored.id == "resume-me" and restored.unhandled_tools == []
    fake.push(Turn(tool_calls=[ToolCall("w1", "get_weather", {"city": "Rome"})]),
              Turn(text="Sunny."))
    assert restored.send("Rome?").text == "Sunny."
    assert calls_made == [("get_weather", "Rome")]
    assert roles(fake) == ["user", "assistant", "user", "assistant", "user"]
    restored.close()


def test_from_json_rejects_other_documents(adapter: CanonicalAdapter) -> None:
    with pytest.raises(ValueError, match="not JSON"):
        Session.from_json("{nope", adapter=adapter)
    with pytest.raises(ValueError, match="format"):
        Session.from_json('{"history": []}', adapter=adapter)
    with pytest.raises(ValueError, match="version 99"):
        Session.from_json('{"format": "dispatch_nb.session", "version": 99}', adapter=adapter)


def test_cancel_token_is_reexported() -> None:
    from dispatch_nb import CancelToken as Public

    assert CancelToken is Public


# -- entry points refuse bad arguments before any request (issue 13.3) -----------------------------


@pytest.mark.parametrize(
    ("kwargs", "error", "says"),
    [
        ({"max_tokens": "100"}, TypeError, "max_tokens must be a whole number of tokens above 0"),
        ({"max_tokens": 1.5}, TypeError, "not 1.5 (a float)"),
        ({"max_tokens": True}, TypeError, "max_tokens must be"),
        ({"max_tokens": 0}, ValueError, "max_tokens must be a whole number of tokens above 0"),
        ({"timeout": "5"}, TypeError, "timeout must be a number of seconds above 0"),
        ({"timeout": 0}, ValueError, "timeout must be a number of seconds above 0"),
        ({"system": 123}, TypeError, "system must be a str (the system prompt) or None"),
        ({"temperature": 3}, ValueError, "temperature must be a number from 0 to 2"),
        ({"temperature": "hot"}, TypeError, "temperature must be a number from 0 to 2"),
        ({"cancel": "stop"}, TypeError, "cancel must be a CancelToken or None"),
        ({"tools": len}, TypeError, "tools= takes a list of tools, e.g. tools=[get_weather]"),
        ({"tools": {"name": "t", "description": "", "parameters": {}}}, TypeError,
         "tools= takes a list of tools"),
    ],
)
def test_chat_and_stream_refuse_bad_arguments_before_any_request(
    adapter: CanonicalAdapter, fake: CanonicalFake, kwargs: dict[str, Any], error: type, says: str
) -> None:
    for call in (adapter.chat, adapter.stream):
        with pytest.raises(error) as caught:
            call("hello", **kwargs)
        assert says in str(caught.value)
        assert "— not " in str(caught.value)  # and what it got
    with pytest.raises(error, match=re.escape(says)):
        asyncio.run(adapter.achat("hello", **kwargs))
    assert fake.chat_requests == []


def test_an_adapters_own_defaults_and_on_delta_are_checked_before_any_request(
    fake: CanonicalFake,
) -> None:
    """connect(..., timeout="30") failed only at the first call ("'<=' not supported ..."); a
    base_url with no scheme was retried as a connection error; on_delta=5 was found only after
    the request was sent; a single tool for tools= failed inside Session and batch too."""
    from dispatch_nb import Session, batch

    with pytest.raises(TypeError, match=r"CanonicalAdapter: timeout must be a number of "
                                        r"seconds above 0 .* not '30' \(a str\)"):
        CanonicalAdapter("echo", base_url=fake.base_url, timeout="30")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"max_tokens must be .* not 'big'"):
        CanonicalAdapter("echo", base_url=fake.base_url, max_tokens="big")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="max_retries must be a whole number"):
        CanonicalAdapter("echo", base_url=fake.base_url, max_retries="2")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"base_url must start with http:// or https:// .*"
                                         r"not '127.0.0.1:1/v1'"):
        CanonicalAdapter("echo", base_url="127.0.0.1:1/v1")
    adapter = CanonicalAdapter("echo", base_url=fake.base_url)
    with pytest.raises(TypeError, match=r"on_delta must be a function of one delta .* not 5"):
        adapter.chat("hi", stream=True, on_delta=5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="tools= takes a list of tools"):
        Session(adapter, tools=len)
    with pytest.raises(TypeError, match="tools= takes a list of tools"):
        batch("{row}", ["a"], model=adapter, tools=len, progress=False)
    with pytest.raises(TypeError, match=r"batch\(\) has no option concurency \(did you mean "
                                        r"concurrency\?\)"):
        batch("{row}", ["a"], model=adapter, concurency=4, progress=False)
    assert fake.chat_requests == []


@pytest.mark.parametrize("messages", [42, None, 3.5, [42], ["hi", object()]])
def test_chat_refuses_messages_it_cannot_send(
    adapter: CanonicalAdapter, fake: CanonicalFake, messages: Any
) -> None:
    with pytest.raises(TypeError, match="messages must be a str, a Message, a dict"):
        adapter.chat(messages)
    assert fake.chat_requests == []


def test_session_checks_its_arguments_and_model_spec_before_any_request(
    adapter: CanonicalAdapter, fake: CanonicalFake
) -> None:
    with pytest.raises(TypeError, match=r"Session: max_tokens must be .* not '100' \(a str\)"):
        Session(adapter, max_tokens="100")
    with pytest.raises(TypeError, match="Session: system must be a str"):
        Session(adapter, system=123)
    with pytest.raises(TypeError, match="Session: max_tool_rounds must be a whole number"):
        Session(adapter, max_tool_rounds="3")
    with pytest.raises(RequestError, match="'nope' is neither 'provider:model' nor a model name") as info:
        Session("nope")
    assert info.value.code == "unknown_provider"
    with pytest.raises(RequestError, match="'openai' is a provider, not a model: write it as "
                                           "'openai:MODEL'") as info:
        Session("openai")
    assert info.value.code == "invalid_request"
    with pytest.raises(TypeError, match="Session needs an Adapter or a model spec"):
        Session(42)  # type: ignore[arg-type]
    session = Session(adapter)
    with pytest.raises(TypeError, match="timeout must be a number of seconds above 0"):
        session.send("hi", timeout="5")
    with pytest.raises(TypeError, match="max_tokens must be"):
        session.send("hi", max_tokens="5")
    assert fake.chat_requests == []


def test_connect_refuses_none_non_strings_and_provider_names() -> None:
    from dispatch_nb import connect
    from dispatch_nb.registry import UnknownProviderError

    with pytest.raises(TypeError, match=r"connect\(\) takes a model spec 'provider:model'"):
        connect(None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"not 42 \(an int\)"):
        connect(42)  # type: ignore[arg-type]
    with pytest.raises(RequestError, match="'anthropic' is a provider, not a model") as info:
        connect("anthropic")
    assert info.value.code == "invalid_request"
    with pytest.raises(UnknownProviderError, match="write it as 'provider:model'") as info:
        connect("nope")
    assert info.value.code == "unknown_provider"
    with pytest.raises(UnknownProviderError, match="unknown provider 'nope'") as info:
        connect("nope:model")
    assert info.value.code == "unknown_provider"
    assert connect("fake:echo", base_url="http://127.0.0.1:9").model_name == "echo"


def test_lone_surrogates_are_replaced_with_one_warning(
    adapter: CanonicalAdapter, fake: CanonicalFake
) -> None:
    name = b"caf\xe9.txt".decode("utf-8", "surrogateescape")  # what os.listdir gives
    with pytest.warns(UnicodeWarning, match="1 character in the message could not be encoded"):
        response = adapter.chat(f"Open {name}")
    assert sent(fake)["messages"][-1]["content"] == "Open caf\ufffd.txt"
    assert response.text == "echo: Open caf\ufffd.txt"
    with pytest.warns(UnicodeWarning, match="in the system prompt"):
        adapter.chat("hi", system="be \udcff")
    assert sent(fake)["system"] == "be \ufffd"


def test_a_session_warns_of_lone_surrogates_once_and_can_still_be_saved(
    adapter: CanonicalAdapter, fake: CanonicalFake
) -> None:
    """A turn with a lone surrogate (a file name from os.listdir) warned again on every later
    turn, whose own text had none (the history kept the surrogate and was cleaned on each
    call), and ``to_json()`` raised TypeError (the history could not be encoded)."""
    import warnings

    name = b"caf\xe9.txt".decode("utf-8", "surrogateescape")
    with pytest.warns(UnicodeWarning, match="in the system prompt") as caught:
        session = Session(adapter, system="be \udcff")
    assert [w.filename for w in caught] == [__file__]
    with pytest.warns(UnicodeWarning, match="1 character in the message could not") as caught:
        session.send(f"Open {name}")
    assert len(caught) == 1 and caught[0].filename == __file__
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the next turn's text is clean: not a word about it
        session.send("And now?")
    assert sent(fake)["messages"][0]["content"] == "Open caf\ufffd.txt"
    assert sent(fake)["system"] == "be \ufffd"
    assert session.history[0].content == "Open caf\ufffd.txt"  # what was sent
    restored = Session.from_json(session.to_json(), adapter=adapter)
    assert [m.content for m in restored.history] == [m.content for m in session.history]


def test_the_surrogate_warning_names_the_callers_line(adapter: CanonicalAdapter) -> None:
    """Whichever entry point, sync or async, the warning points at the line that called it."""

    async def achat(text: str) -> None:
        await adapter.achat(text)

    async def astream(text: str) -> None:
        async with adapter.astream(text) as deltas:
            async for _ in deltas:
                pass

    def stream(text: str) -> None:
        with adapter.stream(text) as deltas:
            list(deltas)

    calls = {
        "chat": lambda text: adapter.chat(text),
        "stream": stream,
        "achat": lambda text: asyncio.run(achat(text)),
        "astream": lambda text: asyncio.run(astream(text)),
    }
    for name, call in calls.items():
        with pytest.warns(UnicodeWarning) as caught:
            call("caf\udce9")
        assert [w.filename for w in caught] == [__file__], name


def test_wrong_arguments_name_the_entry_point(adapter: CanonicalAdapter) -> None:
    with pytest.raises(TypeError, match=r"^Adapter.chat\(\): missing a required"):
        adapter.chat()  # type: ignore[call-arg]
    with pytest.raises(TypeError, match=r"^Adapter.stream\(\): too many positional"):
        adapter.stream("x", "y")  # type: ignore[call-arg]
    with pytest.raises(TypeError, match=r"^Adapter.achat\(\): missing a required"):
        asyncio.run(adapter.achat())  # type: ignore[call-arg]


def test_a_session_closes_the_adapter_it_made_and_only_that_one() -> None:
    closed: list[str] = []

    class Closing(Adapter):
        def __init__(self, model: str) -> None:
            super().__init__()
            self.model = model

        def close(self) -> None:  # only the sync close: the async one must fall back to it
            closed.append(self.model)

    from dispatch_nb import registry

    registry.register_provider("closing-test", lambda model, **_: Closing(model))
    try:
        asyncio.run(Session("closing-test:made").aclose())
        Session("closing-test:made-sync").close()
        given = Closing("given")
        asyncio.run(Session(given).aclose())
    finally:
        registry._providers.pop("closing-test", None)
    assert closed == ["made", "made-sync"]
