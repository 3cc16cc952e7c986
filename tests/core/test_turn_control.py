"""One control for a whole turn: a :class:`TurnControl` (deadline + cancel switch) made once and
handed to each model call and tool run of the turn.

The turn's budget is one budget: a second model call gets what the first call and the tools left,
not a fresh ``timeout``; the error says the turn's timeout and how long the turn waited. A cancel
reaches whatever runs now (a model call's socket, async tools). Real loopback fakes throughout.
"""

from __future__ import annotations

import asyncio
import re
import threading
import time
from collections.abc import Iterator

import pytest

from dispatch_nb import APITimeoutError, CancelToken, RequestCancelled, ToolResultEvent
from dispatch_nb.call_control import CallControl, TurnControl
from dispatch_nb.providers.fake import CanonicalAdapter
from dispatch_nb.session import Session, tool
from dispatch_nb.testing import ManualClock

from ..fakes.canonical import CanonicalFake
from ..fakes.provider import Stall, ToolCall, Turn
from ..fakes.server import wait_for

#: a cancel wakes a blocked call at once ("within 100 ms"), not at the next poll or when the
#: server answers: this much, with room for a busy 2-core machine, is far less than any stall here
CANCEL_BUDGET = 0.5
#: how long a stalled answer sends nothing (ended early by the client hanging up)
STALL = 6.0


def reported_wait(message: str, budget: float) -> float:
    """The seconds an :class:`APITimeoutError` for a ``budget``-second timeout says it waited."""
    found = re.search(rf"within the {budget:g} s timeout \(waited (\d+\.\d) s", message)
    assert found, message
    return float(found.group(1))


@pytest.fixture
def fake() -> Iterator[CanonicalFake]:
    with CanonicalFake() as f:
        yield f


@pytest.fixture
def adapter(fake: CanonicalFake) -> Iterator[CanonicalAdapter]:
    a = CanonicalAdapter("echo", base_url=fake.base_url, max_retries=0)
    yield a
    a.close()


def test_a_turn_control_is_one_budget_for_several_calls(fake: CanonicalFake,
                                                        adapter: CanonicalAdapter) -> None:
    adapter.chat("warm up")  # the first call of a process pays for imports and the client
    fake.push(Turn(text="echo: a"), Stall(STALL))
    with ManualClock() as clock, TurnControl(timeout=60, provider="fake") as turn:
        assert adapter.chat("a", cancel=turn).text == "echo: a"
        clock.advance(59.7)  # the first call took all but 0.3 s of the turn's minute
        started = time.monotonic()
        with pytest.raises(APITimeoutError) as info:
            adapter.chat("b", stream=True, cancel=turn)
    # the turn's last 0.3 s, not a minute more for the second call: it ended long before the stall
    assert time.monotonic() - started < STALL / 2
    assert reported_wait(info.value.message, 60) >= 59.7
    assert info.value.code == "timeout"
    assert wait_for(lambda: fake.server.open_connections == 0)


def test_a_shorter_call_timeout_still_applies_within_a_turn(fake: CanonicalFake,
                                                            adapter: CanonicalAdapter) -> None:
    fake.push(Stall(2.0))
    with TurnControl(timeout=30) as turn, pytest.raises(APITimeoutError) as info:
        adapter.chat("a", cancel=turn, timeout=0.3)
    assert info.value.code == "timeout"
    assert "within the 0.3 s timeout" in info.value.message
    control = CallControl(timeout=60, cancel=TurnControl(timeout=0.5))
    remaining = control.remaining()
    assert remaining is not None and remaining <= 0.5  # the turn's deadline comes first


def test_cancelling_the_callers_token_cancels_the_turn_and_detaches() -> None:
    token = CancelToken()
    with TurnControl(cancel=token) as turn:
        token.cancel("stop now")
        assert turn.cancelled and turn.reason == "stop now"
        with pytest.raises(RequestCancelled, match="stop now") as info:
            turn.check()
        assert info.value.code == "cancelled"
    reused = CancelToken()
    for _ in range(3):
        with TurnControl(cancel=reused):
            pass
    assert reused._callbacks == []  # a finished turn leaves nothing on the caller's token
    with pytest.raises(ValueError, match="timeout must be a positive number"):
        TurnControl(timeout=0)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_session_deadline_spans_two_model_calls_and_a_tool(fake: CanonicalFake,
                                                           adapter: CanonicalAdapter,
                                                           mode: str) -> None:
    clock = ManualClock()

    @tool
    def pause() -> str:
        clock.advance(59.5)  # the tool takes all but 0.5 s of the turn's minute
        return "paused"

    @tool
    async def apause() -> str:
        clock.advance(59.5)
        return "paused"

    name = "pause" if mode == "sync" else "apause"
    # the first call of a process pays for imports and the client (async: in a loop of its own,
    # whose client closes with it, so that no idle connection of another pool stays open)
    if mode == "sync":
        adapter.chat("warm up")
    else:
        asyncio.run(adapter.achat("warm up"))
    fake.push(Turn(tool_calls=[ToolCall("t1", name)], delay=0.05),
              Turn(text="abcdefghijkl", chunk=2, stall_after=2, stall=STALL))
    session = Session(adapter, tools=[pause, apause])
    events: list[object] = []

    async def run_async() -> None:
        async for event in session.astream("go", timeout=60):
            events.append(event)

    def run() -> None:
        if mode == "sync":
            events.extend(session.stream("go", timeout=60))
        else:
            asyncio.run(run_async())

    started = time.monotonic()
    with clock, pytest.raises(APITimeoutError) as info:
        run()
    assert info.value.code == "timeout"
    # one minute's budget for call, tool and call: the second call had the last 0.5 s, not a
    # minute of its own, and ended long before the stall would have ended it
    assert time.monotonic() - started < STALL / 2
    assert reported_wait(info.value.message, 60) >= 59.5
    assert any(isinstance(e, ToolResultEvent) for e in events)  # the tool ran inside the budget
    assert info.value.partial is not None and info.value.partial.text == "abcd"
    assert [m.role for m in session.history] == ["user", "assistant", "user"]
    assert wait_for(lambda: fake.server.open_connections == 0)


def test_cancel_reaches_the_model_call_running_now(fake: CanonicalFake,
                                                   adapter: CanonicalAdapter) -> None:
    @tool
    def quick() -> str:
        return "ok"

    fake.push(Turn(tool_calls=[ToolCall("q1", "quick")]),
              Turn(text="abcdefghijkl", chunk=2, stall_after=2, stall=3.0))
    session = Session(adapter, tools=[quick])
    token = CancelToken()
    at: list[float] = []

    def cancel_during_second_call() -> None:
        wait_for(lambda: len(fake.chat_requests) == 2)
        time.sleep(0.2)
        at.append(time.monotonic())
        token.cancel("the user stopped it")

    thread = threading.Thread(target=cancel_during_second_call, daemon=True)
    thread.start()
    with pytest.raises(RequestCancelled) as info:
        session.send("go", cancel=token, timeout=10, stream=True)
    reacted = time.monotonic() - at[0]
    assert info.value.code == "cancelled"
    thread.join()
    assert reacted < CANCEL_BUDGET, reacted
    assert info.value.message == "the user stopped it"
    assert info.value.partial is not None and info.value.partial.text == "abcd"
    assert wait_for(lambda: fake.server.open_connections == 0)
    assert token._callbacks == []  # the turn let go of the caller's token


def test_cancel_reaches_async_tools_running_now(fake: CanonicalFake,
                                                adapter: CanonicalAdapter) -> None:
    finished: list[str] = []

    @tool
    async def forever(name: str) -> str:
        await asyncio.sleep(5)
        finished.append(name)
        return name

    fake.push(Turn(tool_calls=[ToolCall("a", "forever", {"name": "A"}),
                               ToolCall("b", "forever", {"name": "B"})]))
    session = Session(adapter, tools=[forever])

    async def main() -> float:
        token = CancelToken()
        loop = asyncio.get_running_loop()
        at: list[float] = []

        def cancel_from_a_thread() -> None:
            time.sleep(0.3)
            at.append(time.monotonic())
            token.cancel("enough")

        loop.run_in_executor(None, cancel_from_a_thread)
        with pytest.raises(RequestCancelled, match="enough") as info:
            await session.asend("go", cancel=token)
        assert info.value.code == "cancelled"
        return time.monotonic() - at[0]

    assert asyncio.run(main()) < CANCEL_BUDGET
    assert finished == []
    results = session.history[-1].blocks
    assert all(r.is_error and "not run" in r.text for r in results)  # type: ignore[union-attr]


def test_a_structured_call_inside_a_turn_never_outlives_it(fake: CanonicalFake,
                                                           adapter: CanonicalAdapter) -> None:
    # A structured call's attempts share one control of their own; inside a turn it ends at the
    # turn's deadline even when the call itself was given more time.
    adapter.chat("warm up")
    fake.push(Stall(3.0))
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    with TurnControl(timeout=0.5) as turn, pytest.raises(APITimeoutError) as info:
        adapter.chat("x", output=schema, cancel=turn, timeout=30)
    assert time.monotonic() - turn.started_at < 2.0  # the turn's 0.5 s, not the 30 s or the stall
    assert info.value.code == "timeout"
    assert "within the 0.5 s timeout" in info.value.message
