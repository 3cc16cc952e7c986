"""One adapter, many threads or tasks; pull-based streams; memory flat in the number of deltas."""

from __future__ import annotations

import asyncio
import gc
import json
import signal
import socket
import sys
import threading
import time
import tracemalloc
from collections.abc import Iterable, Iterator
from typing import Any

import httpx
import pytest

from dispatch_nb.adapter import BRIDGE_BUFFER, Adapter, ChatRequest
from dispatch_nb.bridge import run_sync
from dispatch_nb.call_control import CallControl
from dispatch_nb.providers.fake import CanonicalAdapter
from dispatch_nb.session import Session
from dispatch_nb.stream import Accumulator
from dispatch_nb.types import StreamDelta

from ..fakes.canonical import CanonicalFake
from ..fakes.server import LoopbackServer, Reply

SESSIONS = 64


def test_64_threads_share_one_adapter(fake: CanonicalFake) -> None:
    adapter = CanonicalAdapter("echo", base_url=fake.base_url, max_retries=0, timeout=30)
    barrier = threading.Barrier(SESSIONS)
    problems: list[str] = []

    def converse(i: int) -> None:
        try:
            session = Session(adapter, id=f"s{i}")
            barrier.wait(10)
            first = session.send(f"prompt {i}", stream=i % 2 == 0)
            with session.stream(f"follow-up {i}") as events:
                second = events.response
            if (first.text, second.text) != (f"echo: prompt {i}", f"echo: follow-up {i}"):
                problems.append(f"{i}: got {first.text!r} / {second.text!r}")
            if [m.text for m in session.history] != [
                f"prompt {i}", f"echo: prompt {i}", f"follow-up {i}", f"echo: follow-up {i}"
            ]:
                problems.append(f"{i}: history mixed up")
        except Exception as exc:  # reported below, with the session it happened in
            problems.append(f"{i}: {exc!r}")

    threads = [threading.Thread(target=converse, args=(i,)) for i in range(SESSIONS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    adapter.close()
    assert problems == []
    assert len(fake.chat_requests) == 2 * SESSIONS
    # every request carried its own conversation
    firsts = sorted(r.json["messages"][0]["content"] for r in fake.chat_requests)
    assert firsts == sorted([f"prompt {i}" for i in range(SESSIONS)] * 2)


def test_64_tasks_share_one_adapter(fake: CanonicalFake) -> None:
    adapter = CanonicalAdapter("echo", base_url=fake.base_url, max_retries=0, timeout=30)

    async def converse(i: int) -> tuple[str, str]:
        session = Session(adapter)
        first = await session.asend(f"task {i}", stream=i % 2 == 1)
        async with session.astream(f"again {i}") as stream:
            second = await stream.until_done()
        return first.text, second.text

    async def main() -> list[tuple[str, str]]:
        results = await asyncio.gather(*(converse(i) for i in range(SESSIONS)))
        await adapter.aclose()
        return results

    results = asyncio.run(main())
    assert results == [(f"echo: task {i}", f"echo: again {i}") for i in range(SESSIONS)]


# -- backpressure and memory -------------------------------------------------------------------
def sse(data: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(data).encode() + b"\n\n"


DONE = sse({"type": "done", "stop_reason": "end_turn",
            "usage": {"input_tokens": 1, "output_tokens": 1}})


class CountingChunks(list[bytes]):
    """Chunks that count how many the server has handed to the socket."""

    def __init__(self, items: Iterable[bytes]) -> None:
        super().__init__(items)
        self.sent = 0

    def __iter__(self) -> Iterator[bytes]:
        for item in super().__iter__():
            yield item
            self.sent += 1


def test_a_slow_consumer_slows_the_server() -> None:
    piece = sse({"type": "text", "text": "x" * 4000})
    chunks = CountingChunks([piece * 16] * 640 + [DONE])  # ~41 MB, 10,240 deltas
    # A fixed receive buffer: loopback sockets otherwise grow theirs to tens of MB.
    small_buffer = httpx.AsyncHTTPTransport(
        socket_options=[(socket.SOL_SOCKET, socket.SO_RCVBUF, 256 * 1024)]
    )
    reply = Reply(headers={"content-type": "text/event-stream"}, chunks=chunks)
    with LoopbackServer(lambda request: reply) as server:
        client = httpx.AsyncClient(transport=small_buffer)
        adapter = CanonicalAdapter("echo", base_url=server.url, max_retries=0,
                                   async_http_client=client)
        session = Session(adapter)
        with session.stream("go") as events:
            next(events)
            time.sleep(0.5)  # a slow consumer: nothing is read meanwhile
            in_flight = chunks.sent
            rest = sum(1 for e in events if e.type == "text_delta")
        adapter.close()
    assert in_flight < len(chunks) / 4, in_flight  # the server was held back by the socket
    assert rest == 640 * 16 - 1
    assert len(session.history[-1].text) == 640 * 16 * 4000


def peak_while_streaming(deltas: int) -> tuple[int, int]:
    """Peak traced bytes above the baseline while a session streams ``deltas`` deltas, and the
    answer's length."""
    per_chunk = 500
    event = sse({"type": "text", "text": "tok "})
    chunks = [event * per_chunk for _ in range(deltas // per_chunk)] + [DONE]
    reply = Reply.sse(chunks)  # built before measuring: the server only sends it
    with LoopbackServer(lambda request: reply) as server:
        adapter = CanonicalAdapter("echo", base_url=server.url, max_retries=0)
        session = Session(adapter)
        session.send("warm up", stream=True)  # imports, connection pool, caches
        session.clear_history()
        gc.collect()
        tracemalloc.start()
        try:
            baseline = tracemalloc.get_traced_memory()[0]
            count = 0
            with session.stream("go") as events:
                for _ in events:
                    count += 1
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        adapter.close()
    text = session.history[-1].text
    assert count == deltas + 1 and len(text) == 4 * deltas
    return peak - baseline, len(text)


def test_memory_stays_flat_over_100k_deltas() -> None:
    # Streaming 200,000 deltas may take more memory than 50,000 only for the longer text (which
    # may exist twice at the end: fragments joined into the final block), plus under a byte per
    # extra delta; keeping each delta (~100 bytes) would cost 15 MB more. What does not grow with
    # the deltas (buffers: the socket's, the parser's, the bridge's; larger when the caller falls
    # behind on a busy machine) is bounded apart, and must stay well under the body (8 MB).
    small, small_text = peak_while_streaming(50_000)
    large, large_text = peak_while_streaming(200_000)
    extra = 150_000
    growth = large - small - 2 * (large_text - small_text)
    assert growth < extra, f"{growth / extra:.1f} bytes per extra delta"
    fixed = small - 2 * small_text
    assert fixed < 3_000_000, f"{fixed:,} bytes besides the text"


class CountingAdapter(Adapter):
    """A sync-only adapter (like an in-process model): its async twin runs on a worker thread."""

    def __init__(self, deltas: int) -> None:
        super().__init__()
        self.deltas = deltas
        self.produced = 0
        self.closed = threading.Event()

    @property
    def model_name(self) -> str:
        return "counting"

    def stream_once(
        self, request: ChatRequest, acc: Accumulator, control: CallControl
    ) -> Iterator[StreamDelta]:
        try:
            for _ in range(self.deltas):
                control.check()
                self.produced += 1
                yield acc.text("x")
            acc.stop_reason = "end_turn"
        finally:
            self.closed.set()


def test_async_over_a_sync_adapter_is_pull_based_too() -> None:
    adapter = CountingAdapter(5_000)

    async def main() -> tuple[int, int, int]:
        async with adapter.astream("go") as stream:
            await stream.__anext__()
            await asyncio.sleep(0.3)  # the worker thread may run ahead only a little
            ahead = adapter.produced
            rest = 0
            async for _ in stream:
                rest += 1
        early = CountingAdapter(5_000)
        async with early.astream("stop soon") as stream:
            for _ in range(3):
                await stream.__anext__()
        await asyncio.to_thread(early.closed.wait, 5)
        return ahead, rest, early.produced

    ahead, rest, early_produced = asyncio.run(main())
    assert ahead <= BRIDGE_BUFFER + 2, ahead
    assert rest == 4_999
    assert early_produced <= BRIDGE_BUFFER + 5  # closing the stream stopped the worker


def test_the_bridge_hands_over_every_item_however_the_threads_interleave(
    monkeypatch: Any,
) -> None:
    """The loop thread and the caller, stopped for a moment on random lines of the hand-over
    (a trace hook, as a debugger's or coverage's would be, lets the other thread run there): every
    item arrives once and in order, by ``next()`` and by batches, through the pauses of a small
    buffer, and nothing hangs."""
    import random
    import sys

    from dispatch_nb import bridge

    monkeypatch.setattr(bridge, "HIGH_WATER", 4)
    monkeypatch.setattr(bridge, "LOW_WATER", 1)
    rng = random.Random(25)
    names = {"_run", "batch", "_sleep", "_go_on", "_go_on_soon", "__next__", "take"}

    def tracer(frame: Any, event: str, arg: Any) -> Any:
        if frame.f_code.co_name not in names:
            return None

        def local(frame: Any, event: str, arg: Any) -> Any:
            if event == "line" and rng.random() < 0.3:
                time.sleep(rng.random() * 0.0005)
            return local

        return local

    async def source(n: int):  # type: ignore[no-untyped-def]
        for i in range(n):
            yield i
            if rng.random() < 0.2:
                await asyncio.sleep(0)

    def take(it: bridge.SyncIterator[int], by_next: bool, got: list[list[int]]) -> None:
        sys.settrace(tracer)
        out: list[int] = []
        while True:
            if by_next or rng.random() < 0.2:
                try:
                    out.append(next(it))
                except StopIteration:
                    break
                continue
            batch = it.batch()
            if batch is None:
                break
            out += [batch.popleft() for _ in range(len(batch))]
        got.append(out)

    def on_loop_thread(trace: Any) -> Any:
        """Set the library's loop thread's trace function (it may run since an earlier test);
        returns the one it had."""
        had: list[Any] = []

        def swap() -> None:
            had.append(sys.gettrace())
            sys.settrace(trace)

        done = asyncio.run_coroutine_threadsafe(asyncio.sleep(0), loop)
        loop.call_soon_threadsafe(swap)
        done.result(5)
        asyncio.run_coroutine_threadsafe(asyncio.sleep(0), loop).result(5)
        return had[0]

    loop = bridge.loop_thread()
    loop_had = on_loop_thread(tracer)
    try:
        for trial in range(30):
            n = rng.randint(0, 40)
            got: list[list[int]] = []
            caller = threading.Thread(
                target=take, daemon=True,
                args=(bridge.SyncIterator(lambda n=n: source(n)), trial % 3 == 0, got),
            )
            caller.start()
            caller.join(20)
            assert not caller.is_alive(), f"trial {trial}: the hand-over hung"
            assert got == [list(range(n))], f"trial {trial}"
    finally:
        on_loop_thread(loop_had)


def test_ctrl_c_in_a_sync_call_returns_once_its_task_has_unwound() -> None:
    """run_sync: Ctrl-C cancels the coroutine on the library's loop and raises once the
    coroutine's own cleanup (a connection closing) has run, not before."""
    started, cleaned = threading.Event(), threading.Event()

    async def work() -> None:
        started.set()
        try:
            await asyncio.sleep(30)
        finally:
            await asyncio.sleep(0.3)  # cleanup that takes a while
            cleaned.set()

    main = threading.get_ident()

    def interrupt() -> None:  # a real SIGINT once the caller waits for the answer
        started.wait(5)
        deadline = time.monotonic() + 10
        while sys._current_frames()[main].f_code.co_name != "wait" and time.monotonic() < deadline:
            time.sleep(0.001)
        signal.pthread_kill(main, signal.SIGINT)

    threading.Thread(target=interrupt, daemon=True).start()
    with pytest.raises(KeyboardInterrupt):
        run_sync(work())
    assert cleaned.is_set()
