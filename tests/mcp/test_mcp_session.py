"""MCP servers as a session's tools, against real servers: one written with the SDK's server API
(stdio and streamable HTTP) and the npm reference servers; the model is the canonical loopback
fake scripting the tool calls. Approval: a denied call provably never runs (``touch`` would
create a file)."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest

from dispatch_nb import APITimeoutError, ToolResultEvent
from dispatch_nb.approval import ALWAYS, ToolCall, set_asker
from dispatch_nb.mcp import MCPServer
from dispatch_nb.providers.fake import CanonicalAdapter
from dispatch_nb.session import Session, tool

from ..fakes.canonical import CanonicalFake
from ..fakes.provider import ToolCall as Call
from ..fakes.provider import Turn
from .conftest import EVERYTHING, FILESYSTEM, npm_server, sdk_stdio


def results(fake: CanonicalFake, index: int = -1) -> list[dict[str, Any]]:
    body = fake.chat_requests[index].json
    last = body["messages"][-1]
    return [b for b in last["content"] if b.get("type") == "tool_result"]


def text_of(block: dict[str, Any]) -> str:
    content = block["content"]
    return content if isinstance(content, str) else "".join(p["text"] for p in content)


def test_tools_are_listed_lazily_once_and_pass_as_they_are(
    fake: CanonicalFake, adapter: CanonicalAdapter, sdk_server: MCPServer
) -> None:
    session = Session(adapter, tools=[sdk_server], approve="auto")
    assert sdk_server.state == "stopped"  # nothing starts before the first turn
    fake.push(Turn(tool_calls=[Call("c1", "add", {"a": 2, "b": 3})]), Turn(text="5"),
              Turn(text="again"))
    answer = session.send("2+3?")
    assert answer.text == "5" and sdk_server.state == "running"
    sent_tools = {t["name"]: t for t in fake.chat_requests[0].json["tools"]}
    listed = {t.name: t for t in sdk_server.tools}
    assert set(sent_tools) == set(listed) >= {"add", "fail", "slow", "touch"}
    assert sent_tools["add"]["parameters"] == listed["add"].parameters
    assert sent_tools["add"]["description"] == "Add two integers."
    assert text_of(results(fake, 1)[0]) == "5"
    session.send("more")
    assert fake.tool_names_of(fake.chat_requests[2]) == fake.tool_names_of(fake.chat_requests[0])
    session.close()
    assert sdk_server.state == "stopped"


def test_a_clashing_name_gets_the_server_prefix(
    fake: CanonicalFake, adapter: CanonicalAdapter, sdk_server: MCPServer
) -> None:
    @tool
    def add(a: int, b: int) -> int:
        """Python's add."""
        return 1000

    fake.push(Turn(tool_calls=[Call("c1", "add", {"a": 1, "b": 1}),
                               Call("c2", "calc_add", {"a": 1, "b": 1})]), Turn(text="ok"))
    Session(adapter, tools=[add, sdk_server], approve="auto").send("go")
    names = fake.tool_names_of(fake.chat_requests[0])
    assert names.count("add") == 1 and "calc_add" in names
    assert [text_of(r) for r in results(fake)] == ["1000", "2"]


def test_errors_crashes_and_slow_tools_become_results(
    fake: CanonicalFake, adapter: CanonicalAdapter
) -> None:
    server = sdk_stdio(name="calc", timeout=2)
    fake.push(
        Turn(tool_calls=[Call("c1", "fail", {"message": "bad input"}), Call("c2", "slow", {"seconds": 30}),
                         Call("c3", "crash", {})]),
        Turn(tool_calls=[Call("c4", "add", {"a": 1, "b": 2})]),
        Turn(text="done"),
    )
    session = Session(adapter, tools=[server], approve="auto")
    assert session.send("go", timeout=60).text == "done"
    first, second = results(fake, 1), results(fake, 2)
    assert [r["is_error"] for r in first] == [True, True, True]
    assert "timed out" in text_of(first[1]) and "2 s" in text_of(first[1])
    assert "stopped while running crash" in text_of(first[2])
    assert text_of(second[0]) == "3"  # the crashed server started again for the next call
    session.close()


def test_a_slow_tool_under_the_session_deadline(fake: CanonicalFake, adapter: CanonicalAdapter) -> None:
    server = sdk_stdio(name="calc", timeout=300)
    session = Session(adapter, tools=[server], approve="auto")
    fake.push(Turn(text="hi"))
    session.send("warm up")  # the server starts within this turn
    fake.push(Turn(tool_calls=[Call("c1", "slow", {"seconds": 60})]), Turn(text="never"))
    started = time.monotonic()
    with pytest.raises(APITimeoutError) as info:
        session.send("go", timeout=3)
    assert info.value.code == "timeout"
    assert time.monotonic() - started < 30
    assert "not run" in text_of(session.history[-1].model_dump()["content"][0])
    session.close()


def test_a_list_change_is_seen_at_the_next_round(
    fake: CanonicalFake, adapter: CanonicalAdapter, sdk_server: MCPServer
) -> None:
    fake.push(Turn(tool_calls=[Call("c1", "learn", {"name": "owl"})]),
              Turn(tool_calls=[Call("c2", "owl", {})]), Turn(text="ok"))
    Session(adapter, tools=[sdk_server], approve="auto").send("learn")
    assert "owl" not in fake.tool_names_of(fake.chat_requests[0])
    assert "owl" in fake.tool_names_of(fake.chat_requests[1])
    assert text_of(results(fake)[0]) == "I am owl"


# -- approval ----------------------------------------------------------------------------------
def test_mcp_tools_ask_by_default_and_a_denied_call_never_runs(
    fake: CanonicalFake, adapter: CanonicalAdapter, sdk_server: MCPServer, tmp_path: Path
) -> None:
    target = tmp_path / "touched.txt"
    fake.push(Turn(tool_calls=[Call("c1", "touch", {"path": str(target)})]), Turn(text="ok"))
    stream = Session(adapter, tools=[sdk_server]).stream("touch it")
    events = [e for e in stream if isinstance(e, ToolResultEvent)]
    assert not target.exists()  # pytest has no terminal: "ask" found no one, so a denial
    assert events[0].approval is not None and events[0].approval.startswith("denied: ")
    result = results(fake)[0]
    # no one could be asked here: the model reads why, not that a user denied it
    assert result["is_error"] and "touch was not run: no one was" in text_of(result)
    assert "the user denied it" not in text_of(result)


def test_an_approval_function_decides_and_its_reason_reaches_the_model(
    fake: CanonicalFake, adapter: CanonicalAdapter, sdk_server: MCPServer, tmp_path: Path
) -> None:
    seen: list[ToolCall] = []

    def approve(call: ToolCall) -> bool | str:
        seen.append(call)
        return True if call.name == "add" else "files are off limits"

    target = tmp_path / "nope.txt"
    fake.push(Turn(tool_calls=[Call("c1", "touch", {"path": str(target)}),
                               Call("c2", "add", {"a": 1, "b": 1})]), Turn(text="ok"))
    stream = Session(adapter, tools=[sdk_server], approve=approve).stream("go")
    approvals = [e.approval for e in stream if isinstance(e, ToolResultEvent)]
    assert not target.exists()
    assert approvals == ["denied: files are off limits", "approved"]
    assert [(c.name, c.server, c.arguments) for c in seen] == [
        ("touch", "calc", {"path": str(target)}), ("add", "calc", {"a": 1, "b": 1})]
    first, second = results(fake)
    assert "files are off limits" in text_of(first) and text_of(second) == "2"


def test_python_tools_too_when_asked_and_always_holds_for_the_session(
    fake: CanonicalFake, adapter: CanonicalAdapter
) -> None:
    ran: list[int] = []

    @tool
    def bump(n: int) -> int:
        """Side effect."""
        ran.append(n)
        return n

    asked: list[str] = []

    def asker(call: ToolCall, seconds: float | None) -> bool | str:
        asked.append(call.name)
        return ALWAYS

    previous = set_asker(asker)
    try:
        session = Session(adapter, tools=[bump], approve="ask")
        fake.push(Turn(tool_calls=[Call("c1", "bump", {"n": 1})]), Turn(text="a"),
                  Turn(tool_calls=[Call("c2", "bump", {"n": 2})]), Turn(text="b"))
        session.send("one")
        session.send("two")
    finally:
        set_asker(previous)
    assert asked == ["bump"] and ran == [1, 2]
    # without approve= a Python tool runs without asking
    fake.push(Turn(tool_calls=[Call("c3", "bump", {"n": 3})]), Turn(text="c"))
    Session(adapter, tools=[bump]).send("three")
    assert ran == [1, 2, 3]


def test_a_tools_time_is_its_run_not_the_wait_for_approval(
    fake: CanonicalFake, adapter: CanonicalAdapter
) -> None:
    """A person took half a second to approve: the call's ``duration`` (the cell's "0.00 s")
    is how long the tool ran, in the sync and the async loop; a denied call ran for 0 s."""

    @tool
    def bump(n: int) -> int:
        """No side effect worth timing."""
        return n

    def slow_person(call: ToolCall) -> bool | str:
        time.sleep(0.5)
        return call.arguments["n"] == 1 or "not that one"

    def turns() -> None:
        fake.push(Turn(tool_calls=[Call("c1", "bump", {"n": 1}), Call("c2", "bump", {"n": 2})]),
                  Turn(text="ok"))

    async def run_async() -> list[ToolResultEvent]:
        session = Session(adapter, tools=[bump], approve=slow_person)
        return [e async for e in session.astream("go") if isinstance(e, ToolResultEvent)]

    turns()
    synced = [e for e in Session(adapter, tools=[bump], approve=slow_person).stream("go")
              if isinstance(e, ToolResultEvent)]
    turns()
    for ran, denied in (synced, asyncio.run(run_async())):
        assert ran.approval == "approved" and ran.duration < 0.5, ran
        assert denied.approval == "denied: not that one" and denied.duration == 0.0, denied


def test_async_session_over_streamable_http(
    fake: CanonicalFake, adapter: CanonicalAdapter, http_url: str, tmp_path: Path
) -> None:
    target = tmp_path / "async.txt"
    server = MCPServer.http(http_url, headers={"X-Test": "1"}, name="web")

    async def main() -> list[ToolResultEvent]:
        fake.push(Turn(tool_calls=[Call("c1", "add", {"a": 20, "b": 22}),
                                   Call("c2", "touch", {"path": str(target)})]), Turn(text="42"))
        async with Session(adapter, tools=[server],
                           approve=lambda c: c.name != "touch" or "no") as session:
            return [e async for e in session.astream("go") if isinstance(e, ToolResultEvent)]

    events = asyncio.run(main())
    assert events[0].result.text == "42"
    assert events[1].result.is_error and not target.exists()
    assert server.state == "stopped"


# -- the reference servers nobody here wrote --------------------------------------------------------
def test_server_everything(fake: CanonicalFake, adapter: CanonicalAdapter) -> None:
    server = npm_server(EVERYTHING, "stdio", name="everything")
    fake.push(Turn(tool_calls=[Call("c1", "echo", {"message": "hello"}),
                               Call("c2", "get-sum", {"a": 2, "b": 5}),
                               Call("c3", "get-tiny-image", {}),
                               Call("c4", "get-structured-content", {"location": "New York"})]),
              Turn(text="ok"))
    with Session(adapter, tools=[server], approve="auto") as session:
        session.send("go", timeout=120)
    echo, total, image, structured = results(fake)
    assert text_of(echo) == "Echo: hello" and "7" in text_of(total)
    assert [p["type"] for p in image["content"]] == ["text", "image", "text"]  # a real image
    assert image["content"][1]["media_type"] == "image/png"
    assert "temperature" in text_of(structured)
    assert server.state == "stopped"


def test_server_filesystem(fake: CanonicalFake, adapter: CanonicalAdapter, tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("buy milk")
    server = npm_server(FILESYSTEM, str(tmp_path), name="files")
    fake.push(Turn(tool_calls=[Call("c1", "read_text_file", {"path": str(tmp_path / "notes.txt")}),
                               Call("c2", "read_text_file", {"path": "/etc/passwd"})]),
              Turn(text="ok"))
    with Session(adapter, tools=[server], approve="auto") as session:
        session.send("read", timeout=120)
    inside, outside = results(fake)
    assert text_of(inside) == "buy milk" and not inside["is_error"]
    assert outside["is_error"] and "denied" in text_of(outside).lower()
    assert json.dumps(fake.chat_requests[0].json["tools"])  # schemas went as the server gave them


def test_adapter_chat_declares_a_servers_tools(
    fake: CanonicalFake, adapter: CanonicalAdapter, sdk_server: MCPServer
) -> None:
    fake.push(Turn(tool_calls=[Call("d1", "add", {"a": 4, "b": 5})]))
    response = adapter.chat("4+5?", tools=[sdk_server])
    assert "add" in fake.tool_names_of(fake.chat_requests[-1])
    call = response.tool_calls[0]
    assert sdk_server.call(call.name, call.arguments).text == "9"


def test_record_then_replay_without_the_server(
    fake: CanonicalFake, adapter: CanonicalAdapter, tmp_path: Path
) -> None:
    """A session through a CachedAdapter records the server's listing and results; replaying
    needs no server at all (its command would fail to start)."""
    from dispatch_nb.cache import CachedAdapter, ResponseCache

    path = tmp_path / "lesson.dispatch-cache.jsonl"
    script = (Turn(tool_calls=[Call("r1", "add", {"a": 20, "b": 22})]), Turn(text="42"))
    fake.push(*script)
    live = sdk_stdio(name="calc")
    recording = CachedAdapter(adapter, ResponseCache(path, "record"))
    with Session(recording, tools=[live], approve="auto") as session:
        session.send("20+22?")
    kinds = [json.loads(line).get("kind") for line in path.read_text().splitlines()]
    assert kinds.count("mcp_tools") == 1 and kinds.count("mcp_call") == 1
    requests = len(fake.chat_requests)

    gone = MCPServer.stdio("/nonexistent/mcp-server", name="calc")
    replaying = CachedAdapter(adapter, ResponseCache(path, "replay"))
    stream = Session(replaying, tools=[gone], approve="auto").stream("20+22?")
    events = [e for e in stream if isinstance(e, ToolResultEvent)]
    assert stream.response is not None and stream.response.text == "42"
    assert events[0].result.text == "42" and events[0].tool_name == "add"
    assert gone.state == "stopped" and len(fake.chat_requests) == requests  # nothing ran live


def test_cancel_stops_a_turn_while_a_server_works(
    fake: CanonicalFake, adapter: CanonicalAdapter, sdk_server: MCPServer
) -> None:
    import threading

    from dispatch_nb import RequestCancelled
    from dispatch_nb.session import CancelToken

    fake.push(Turn(tool_calls=[Call("x1", "slow", {"seconds": 60})]), Turn(text="never"))
    session = Session(adapter, tools=[sdk_server], approve="auto")
    token = CancelToken()
    timer = threading.Timer(4, token.cancel)
    timer.start()
    started = time.monotonic()
    with pytest.raises(RequestCancelled) as info:
        session.send("go", cancel=token)
    assert info.value.code == "cancelled"
    assert time.monotonic() - started < 30  # not the tool's 60 s
    timer.cancel()
    fake.script.clear()  # the cancelled turn never asked for its second answer
    fake.push(Turn(tool_calls=[Call("x2", "add", {"a": 1, "b": 1})]), Turn(text="2"))
    assert session.send("again").text == "2"  # the server still serves the session
