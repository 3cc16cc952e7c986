"""Deadlines, cancellation and Ctrl-C: nothing hangs, the connection is closed, nothing is lost.

``timeout`` is a total deadline (connect, every read, retries, and in a session every tool);
``CancelToken.cancel()`` from another thread or task ends a call within 100 ms by shutting its
socket; ``KeyboardInterrupt`` during a sync stream closes the connection and carries ``partial``.
The server side checks that the connection really went away (``open_connections``).

What a test asserts is what happened, not how fast: the server stalls for :data:`STALL` seconds
(a stall ends as soon as the client hangs up, so it costs nothing), a tool or a backoff lasts
seconds, and the call must end at its deadline or cancel — long before the stall, the tool or the
backoff would have ended it — whatever the load on the machine.
"""

from __future__ import annotations

import asyncio
import re
import signal
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from dispatch_nb import (
    APITimeoutError,
    CancelToken,
    RequestCancelled,
    ToolResultBlock,
)
from dispatch_nb.providers.fake import CanonicalAdapter
from dispatch_nb.session import Session, tool
from dispatch_nb.testing import ManualClock

from ..fakes.canonical import CanonicalFake
from ..fakes.provider import Fail, Stall, ToolCall, Turn
from ..fakes.server import RecordedRequest, Reply, closed_by_client, wait_for

#: a cancel wakes a blocked call at once ("within 100 ms"), not at the next poll or when the
#: server answers: this much, with room for a busy 2-core machine, is far less than STALL
CANCEL_BUDGET = 0.5
#: how long the server sends nothing (ended early by the client hanging up, see Stall)
STALL = 10.0
#: a call stopped by its deadline or a cancel, not by the stall, ends before this
LONG_BEFORE_THE_STALL = STALL / 4


# -- deadlines -----------------------------------------------------------------------------------
@pytest.mark.parametrize("reused", [False, True], ids=["new-connection", "keep-alive"])
def test_deadline_before_headers_sync(fake: CanonicalFake, adapter: CanonicalAdapter,
                                      reused: bool) -> None:
    if reused:
        adapter.chat("warm up")  # a finished JSON answer leaves the connection in the pool
        assert fake.server.open_connections == 1
    fake.push(Stall(STALL))
    started = time.monotonic()
    with pytest.raises(APITimeoutError) as info:
        adapter.chat("x", stream=True, timeout=0.3)
    assert info.value.code == "timeout"
    waited = time.monotonic() - started
    assert 0.3 <= waited < LONG_BEFORE_THE_STALL
    assert isinstance(info.value, TimeoutError)
    assert re.search(r"within the 0\.3 s timeout \(waited \d+\.\d s\)", info.value.message)
    assert closed_by_client(fake)


@pytest.mark.parametrize("reused", [False, True], ids=["new-connection", "keep-alive"])
def test_deadline_before_headers_async(fake: CanonicalFake, adapter: CanonicalAdapter,
                                       reused: bool) -> None:
    async def main() -> float:
        if reused:
            await adapter.achat("warm up")
        fake.push(Stall(STALL))
        started = time.monotonic()
        with pytest.raises(APITimeoutError, match=r"within the 0.3 s timeout") as info:
            await adapter.achat("x", stream=True, timeout=0.3)
        assert info.value.code == "timeout"
        return time.monotonic() - started

    assert 0.3 <= asyncio.run(main()) < LONG_BEFORE_THE_STALL
    assert closed_by_client(fake)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_deadline_mid_stream_keeps_partial(fake: CanonicalFake, adapter: CanonicalAdapter,
                                           mode: str) -> None:
    fake.push(Turn(text="abcdefghijkl", chunk=2, stall_after=3, stall=STALL))

    async def run_async() -> Any:
        return await adapter.achat("x", stream=True, timeout=0.4)

    def run() -> Any:
        if mode == "sync":
            return adapter.chat("x", stream=True, timeout=0.4)
        return asyncio.run(run_async())

    started = time.monotonic()
    with pytest.raises(APITimeoutError) as info:
        run()
    assert info.value.code == "timeout"
    assert time.monotonic() - started < LONG_BEFORE_THE_STALL
    assert info.value.partial is not None and info.value.partial.text == "abcdef"
    assert re.search(r"within the 0\.4 s timeout \(waited \d+\.\d s\)", info.value.message)
    assert closed_by_client(fake)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_test_clock_moves_the_deadline(fake: CanonicalFake, adapter: CanonicalAdapter,
                                         mode: str) -> None:
    # dispatch_nb.testing.ManualClock: the deadline counts on a clock the test moves, one second
    # each time it is read (once per read from the socket). The server sends 125 chunks, one each
    # 10 ms, and the deadline is 20 s: only that clock can stop the call, and only part-way.
    text = " ".join(f"w{i}" for i in range(100))
    fake.push(*[Turn(text=text, chunk=4, delay=0.01)] * 2)

    def run() -> Any:
        if mode == "sync":
            return adapter.chat("x", stream=True, timeout=20)
        return asyncio.run(adapter.achat("x", stream=True, timeout=20))

    with ManualClock(tick=1), pytest.raises(APITimeoutError) as info:
        run()
    assert info.value.code == "timeout"
    partial = info.value.partial
    assert partial is not None and partial.text and len(partial.text) < len(text)
    assert text.startswith(partial.text)
    assert re.search(r"within the 20 s timeout \(waited 2\d\.\d s\)", info.value.message)
    # the real clock is back after the block: the same call ends normally
    assert run().text == text


def test_a_manual_clock_moves_only_forward() -> None:
    with pytest.raises(ValueError, match="0 or more"):
        ManualClock(tick=-1)
    with ManualClock() as clock:
        with pytest.raises(ValueError, match="only moves forward"):
            clock.advance(-1)
        before = clock()
        clock.advance(5)
        assert clock() == before + 5 == clock()  # no tick: it stays put until moved


@pytest.fixture
def unanswered_port() -> Iterator[int]:
    """A loopback port whose listen queue is full: a new connect hangs (its SYNs are dropped)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(0)
    port = server.getsockname()[1]
    fillers = []
    for _ in range(8):
        filler = socket.socket()
        filler.setblocking(False)
        try:
            filler.connect(("127.0.0.1", port))
        except BlockingIOError:
            pass
        fillers.append(filler)
    time.sleep(0.1)
    yield port
    for sock in [*fillers, server]:
        sock.close()


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_deadline_while_connecting(unanswered_port: int, mode: str) -> None:
    adapter = CanonicalAdapter("echo", base_url=f"http://127.0.0.1:{unanswered_port}", max_retries=0)

    def run() -> Any:
        if mode == "sync":
            return adapter.chat("x", timeout=0.4)
        return asyncio.run(adapter.achat("x", timeout=0.4))

    started = time.monotonic()
    with pytest.raises(APITimeoutError) as info:
        run()
    assert info.value.code == "timeout"
    assert time.monotonic() - started < 5  # not the 15 s connect timeout
    adapter.close()


def test_adapter_default_timeout(fake: CanonicalFake) -> None:
    adapter = CanonicalAdapter("echo", base_url=fake.base_url, timeout=0.3, max_retries=0)
    fake.push(Stall(STALL))
    with pytest.raises(APITimeoutError, match=r"0\.3 s timeout") as info:
        adapter.chat("x")
    assert info.value.code == "timeout"
    adapter.close()


def test_session_deadline_covers_the_whole_tool_loop(fake: CanonicalFake,
                                                     adapter: CanonicalAdapter) -> None:
    @tool
    def slowish() -> str:
        time.sleep(0.3)
        return "done"

    # the tool's time counts: the second model call stalls, and the turn ends at its deadline
    adapter.chat("warm up")  # (a first call in a process imports its transport: not timed here)
    fake.push(Turn(tool_calls=[ToolCall("s1", "slowish")]), Stall(STALL))
    session = Session(adapter, tools=[slowish])
    started = time.monotonic()
    with pytest.raises(APITimeoutError) as info:
        session.send("go", timeout=1.0)
    assert info.value.code == "timeout"
    assert 1.0 <= time.monotonic() - started < LONG_BEFORE_THE_STALL
    waited = re.search(r"within the 1 s timeout \(waited (\d+\.\d) s\)", info.value.message)
    assert waited and float(waited[1]) >= 0.95  # counted from the turn's start, not the call's
    assert [m.role for m in session.history] == ["user", "assistant", "user"]


def test_session_deadline_while_tools_run(fake: CanonicalFake, adapter: CanonicalAdapter) -> None:
    ran: list[str] = []
    adapter.chat("warm up")  # (a first call in a process imports its transport: not timed here)
    timeout = 1.5  # room for the model's answer (the first request) on a busy machine
    started = time.monotonic()

    @tool
    def sleepy(name: str) -> str:
        while time.monotonic() < started + timeout + 0.05:  # runs past the turn's deadline
            time.sleep(0.01)
        ran.append(name)
        return name

    fake.push(Turn(tool_calls=[ToolCall("a", "sleepy", {"name": "A"}),
                               ToolCall("b", "sleepy", {"name": "B"})]))
    session = Session(adapter, tools=[sleepy])
    with pytest.raises(APITimeoutError, match="while running tools") as info:
        session.send("go", timeout=timeout)
    assert info.value.code == "timeout"
    assert ran == ["A"]  # a sync tool is not interrupted, but nothing more starts
    results = session.history[-1].blocks
    assert [r.tool_use_id for r in results] == ["a", "b"]
    assert isinstance(results[0], ToolResultBlock) and results[0].content == "A"
    assert results[1].is_error and "not run" in results[1].text  # type: ignore[union-attr]
    assert session.send("and now?").text == "echo: and now?"


def test_async_session_deadline_cancels_async_tools(fake: CanonicalFake,
                                                    adapter: CanonicalAdapter) -> None:
    finished: list[str] = []

    @tool
    async def forever() -> str:
        await asyncio.sleep(STALL)
        finished.append("forever")
        return "never"

    session = Session(adapter, tools=[forever])

    async def main() -> float:
        await adapter.achat("warm up")  # (the first call imports the transport: not timed here)
        fake.push(Turn(tool_calls=[ToolCall("f1", "forever")]))
        started = time.monotonic()
        with pytest.raises(APITimeoutError, match="while running tools") as info:
            await session.asend("go", timeout=1.0)
        assert info.value.code == "timeout"
        return time.monotonic() - started

    assert asyncio.run(main()) < LONG_BEFORE_THE_STALL  # the deadline, not the tool's end
    assert finished == []
    assert "not run" in session.history[-1].blocks[0].text  # type: ignore[union-attr]


# -- cancellation --------------------------------------------------------------------------------
def cancel_later(token: CancelToken, after: threading.Event, delay: float,
                 at: list[float]) -> threading.Thread:
    def run() -> None:
        after.wait(5)
        time.sleep(delay)
        at.append(time.monotonic())
        token.cancel("stopped by the test")

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_cancel_from_another_thread_mid_stream(fake: CanonicalFake, adapter: CanonicalAdapter) -> None:
    fake.push(Turn(text="abcdefghijkl", chunk=2, stall_after=3, stall=STALL))
    token, streaming, at = CancelToken(), threading.Event(), []
    thread = cancel_later(token, streaming, 0.15, at)
    with pytest.raises(RequestCancelled) as info:
        adapter.chat("x", stream=True, cancel=token, on_delta=lambda d: streaming.set())
    assert info.value.code == "cancelled"
    reacted = time.monotonic() - at[0]
    thread.join()
    assert reacted < CANCEL_BUDGET, reacted
    assert info.value.message == "stopped by the test"
    assert info.value.partial is not None and info.value.partial.text == "abcdef"
    assert closed_by_client(fake)


def test_cancel_before_headers_on_a_reused_connection(fake: CanonicalFake,
                                                      adapter: CanonicalAdapter) -> None:
    adapter.chat("warm up")
    fake.push(Stall(STALL))
    token, now, at = CancelToken(), threading.Event(), []
    now.set()
    thread = cancel_later(token, now, 0.2, at)
    with pytest.raises(RequestCancelled) as info:
        adapter.chat("x", stream=True, cancel=token)
    assert info.value.code == "cancelled"
    reacted = time.monotonic() - at[0]
    thread.join()
    assert reacted < CANCEL_BUDGET, reacted
    assert closed_by_client(fake)


def test_cancel_async_from_another_task_and_thread(fake: CanonicalFake,
                                                   adapter: CanonicalAdapter) -> None:
    fake.push(Turn(text="z" * 100, chunk=1, stall_after=5, stall=STALL),
              Turn(text="y" * 100, chunk=1, stall_after=5, stall=STALL))

    async def main() -> tuple[float, float]:
        at: list[float] = []
        token = CancelToken()

        async def canceller() -> None:
            await asyncio.sleep(0.2)
            at.append(time.monotonic())
            token.cancel()

        task = asyncio.create_task(canceller())
        with pytest.raises(RequestCancelled) as info:
            await adapter.achat("x", stream=True, cancel=token)
        assert info.value.code == "cancelled"
        from_task = time.monotonic() - at[0]
        await task
        assert info.value.partial is not None and info.value.partial.text == "zzzzz"

        token2, now, at2 = CancelToken(), threading.Event(), []
        now.set()
        cancel_later(token2, now, 0.2, at2)
        async def consume() -> None:
            async with adapter.astream("y", cancel=token2) as stream:
                async for _ in stream:
                    pass

        with pytest.raises(RequestCancelled) as raised:
            await consume()
        assert raised.value.code == "cancelled"
        return from_task, time.monotonic() - at2[0]

    from_task, from_thread = asyncio.run(main())
    assert from_task < CANCEL_BUDGET and from_thread < CANCEL_BUDGET, (from_task, from_thread)
    assert closed_by_client(fake)


def test_cancel_during_retry_backoff(fake: CanonicalFake) -> None:
    adapter = CanonicalAdapter("echo", base_url=fake.base_url, max_retries=2)
    fake.push(Fail(503, "busy", headers={"retry-after": "5"}), Turn(text="never"))
    token, asked, at = CancelToken(), threading.Event(), []
    # cancel 0.2 s into the 5 s backoff (counted from the first answer: the machine may be slow)
    threading.Thread(target=lambda: wait_for(lambda: len(fake.chat_requests) == 1)
                     and asked.set(), daemon=True).start()
    cancel_later(token, asked, 0.2, at)
    with pytest.raises(RequestCancelled) as info:
        adapter.chat("x", cancel=token)
    assert info.value.code == "cancelled"
    assert time.monotonic() - at[0] < CANCEL_BUDGET
    assert len(fake.chat_requests) == 1
    adapter.close()


def test_cancelled_token_stops_a_session_and_async_tools(fake: CanonicalFake,
                                                          adapter: CanonicalAdapter) -> None:
    finished: list[str] = []
    token, at = CancelToken(), []

    def cancel() -> None:
        at.append(time.monotonic())
        token.cancel()

    @tool
    async def long_job() -> str:
        asyncio.get_running_loop().call_later(0.05, cancel)  # cancelled while the tool runs
        await asyncio.sleep(STALL)
        finished.append("long_job")
        return "done"

    fake.push(Turn(tool_calls=[ToolCall("j1", "long_job")]))
    session = Session(adapter, tools=[long_job])

    async def main() -> float:
        with pytest.raises(RequestCancelled) as info:
            await session.asend("go", cancel=token)
        assert info.value.code == "cancelled"
        return time.monotonic() - at[0]

    assert asyncio.run(main()) < CANCEL_BUDGET
    assert finished == []
    (result,) = session.history[-1].blocks
    assert isinstance(result, ToolResultBlock) and result.is_error
    assert "RequestCancelled" in result.text
    with pytest.raises(RequestCancelled) as info:  # a cancelled token stays cancelled
        session.send("again", cancel=token)
    assert info.value.code == "cancelled"


# -- Ctrl-C --------------------------------------------------------------------------------------
def test_keyboard_interrupt_in_on_delta(fake: CanonicalFake, adapter: CanonicalAdapter) -> None:
    fake.push(Turn(text="k" * 400, chunk=2, delay=0.01))
    session = Session(adapter)
    seen: list[str] = []

    def on_delta(delta: Any) -> None:
        seen.append(delta.text or "")
        if len(seen) == 5:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt) as info:
        session.send("go", stream=True, on_delta=on_delta)
    partial = info.value.partial  # type: ignore[attr-defined]
    assert partial.text == "".join(seen) == "k" * 10
    assert [m.role for m in session.history] == ["user"]
    assert closed_by_client(fake)
    assert session.send("after").text == "echo: goafter"


def test_sigint_while_blocked_in_a_sync_stream(fake: CanonicalFake, adapter: CanonicalAdapter) -> None:
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("SIGINT is delivered to the main thread")
    fake.push(Turn(text="abcdefghij", chunk=2, stall_after=3, stall=STALL))
    session = Session(adapter)
    streaming = threading.Event()
    main_id = threading.main_thread().ident
    assert main_id is not None

    def interrupt() -> None:
        streaming.wait(5)
        time.sleep(0.15)  # the main thread is now blocked reading the stalled stream
        signal.pthread_kill(main_id, signal.SIGINT)

    thread = threading.Thread(target=interrupt, daemon=True)
    thread.start()
    texts: list[str] = []

    def consume() -> None:
        with session.stream("go") as events:
            for event in events:
                if event.type == "text_delta":
                    texts.append(event.text or "")
                    streaming.set()

    with pytest.raises(KeyboardInterrupt) as info:
        consume()
    thread.join()
    assert info.value.partial.text == "".join(texts) == "abcdef"  # type: ignore[attr-defined]
    assert [m.role for m in session.history] == ["user"]
    assert closed_by_client(fake)


# -- validate() ----------------------------------------------------------------------------------
class KeyCheckingFake(CanonicalFake):
    """The canonical fake, but /models wants ``Authorization: Bearer good-key``."""

    def route_other(self, request: RecordedRequest) -> Reply:
        if request.path == "/models" and request.header("authorization") != "Bearer good-key":
            return Reply.json({"error": {"message": "invalid API key",
                                         "type": "authentication_error"}}, status=401)
        return super().route_other(request)


def test_validate_reports_whether_credentials_work() -> None:
    with KeyCheckingFake() as fake:
        good = CanonicalAdapter("echo", base_url=fake.base_url, api_key="good-key")
        bad = CanonicalAdapter("echo", base_url=fake.base_url, api_key="bad-key")
        result = good.validate()
        assert result and result.ok and "accepted" in result.reason
        result = bad.validate()
        assert not result and not result.ok
        assert result.reason == (
            "Fake (canonical protocol) rejected the credentials: invalid API key")
        assert good.display_name == "Fake (canonical protocol)"
        url = fake.base_url
        good.close()
        bad.close()
    gone = CanonicalAdapter("echo", base_url=url, api_key="good-key")
    result = gone.validate()
    assert not result.ok and "could not be checked" in result.reason
    gone.close()


def test_the_deadline_counts_from_the_first_read(fake: CanonicalFake, adapter: CanonicalAdapter) -> None:
    fake.push(Turn(text="in time", chunk=2))
    stream = adapter.stream("x", timeout=0.3)
    time.sleep(0.4)  # created long before it is read: the clock has not started yet
    assert "".join(d.text or "" for d in stream) == "in time"


class _SlowAuthAdapter(CanonicalAdapter):
    """Authentication that takes a while (a token refresh), as Copilot's does."""

    async def aauth_headers(self) -> dict[str, str]:
        await asyncio.sleep(STALL)
        return {}


def test_async_deadline_during_a_slow_token_refresh(fake: CanonicalFake) -> None:
    fake.push(Stall(STALL))
    adapter = _SlowAuthAdapter("echo", base_url=fake.base_url, max_retries=0)

    async def main() -> None:
        await adapter.achat("x", stream=True, timeout=0.2)

    started = time.monotonic()
    with pytest.raises(APITimeoutError) as info:
        asyncio.run(main())
    assert info.value.code == "timeout"
    assert time.monotonic() - started < LONG_BEFORE_THE_STALL  # not the refresh, nor the server
