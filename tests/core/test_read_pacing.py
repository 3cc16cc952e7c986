"""Paced reads (:func:`dispatch_nb.transport.read_interval`): many streams read in bursts on one
shared clock instead of event by event — the batch's default from concurrency 64 up.

Checked against real loopback servers: a paced body is read in a few bursts and arrives whole; the
same answer comes back through an adapter, with its deltas in bursts, and its partial answer when
the connection drops mid-way; the connection is still reused; httpx's transport is left alone;
bad intervals are refused with a clear error; and a batch runs its rows with the interval its
concurrency calls for (the CPU it saves is measured by ``benchmarks/bench_batch.py``).
"""

from __future__ import annotations

import asyncio
import itertools
import math
import time
from typing import Any

import httpx
import pytest

from dispatch_nb import APIConnectionError, Response, abatch, batch
from dispatch_nb.batching.engine import (
    PACED_CONCURRENCY,
    PACED_MAX_INTERVAL,
    BatchSettings,
    auto_read_interval,
)
from dispatch_nb.providers.fake import CanonicalAdapter
from dispatch_nb.transport import (
    PACE_EXTENSION,
    READ_EXTENSION,
    TRANSPORT_ENV,
    async_client,
    current_read_interval,
    read_interval,
)

from ..fakes.batching import BatchFake
from ..fakes.canonical import CanonicalFake
from ..fakes.provider import Turn
from ..fakes.server import LoopbackServer, Reply

EVENTS = [f"data: {i:04d}\n\n".encode() for i in range(24)]
EVENT_GAP = 0.02  # the server's pause between events: 24 events over ~0.5 s


def bursts(times: list[float], gap: float = 0.01) -> int:
    """How many groups ``times`` (ascending) falls into, a new group after each pause > ``gap``."""
    return 1 + sum(1 for a, b in itertools.pairwise(times) if b - a > gap) if times else 0


# -- the interval itself -------------------------------------------------------------------------
@pytest.mark.parametrize("bad", [-0.1, math.inf, math.nan, "fast", True, None])
def test_a_bad_interval_says_what_an_interval_is(bad: Any) -> None:
    with pytest.raises(ValueError, match=r"read_interval must be a number of seconds >= 0"), \
            read_interval(bad):
        pass
    if bad is None:
        return  # a batch's read_interval=None is its own choice (test_a_batch_paces_its_rows...)
    with pytest.raises(ValueError, match=r"read_interval must be a number of seconds >= 0"):
        BatchSettings(read_interval=bad)


def test_the_interval_holds_in_its_context_and_the_tasks_it_starts() -> None:
    assert current_read_interval() == 0.0

    async def main() -> tuple[float, float, float]:
        with read_interval(0.25):
            inner = await asyncio.create_task(asyncio.sleep(0, current_read_interval()))
            here = current_read_interval()
        return inner, here, current_read_interval()

    assert asyncio.run(main()) == (0.25, 0.25, 0.0)
    assert current_read_interval() == 0.0


# -- the transport ---------------------------------------------------------------------------------
async def read_body(url: str, interval: float) -> tuple[bytes, list[float], bool]:
    """The whole body, the loop times at which reads returned data, whether it was paced."""
    loop = asyncio.get_running_loop()
    with read_interval(interval):
        async with async_client(httpx.Timeout(10)) as client, \
                client.stream("GET", url) as response:
            read = response.extensions[READ_EXTENSION]
            pace = response.extensions.get(PACE_EXTENSION)
            parts, times = [], []
            while chunk := await read():
                parts.append(chunk)
                times.append(loop.time())
                if pace is not None:
                    pace()
    return b"".join(parts), times, pace is not None


def test_a_paced_body_is_read_in_a_few_bursts_and_arrives_whole(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(TRANSPORT_ENV, "aiohttp")
    reply = Reply.sse(EVENTS, delay=EVENT_GAP)
    with LoopbackServer(lambda request: reply) as server:
        body, times, paced = asyncio.run(read_body(server.url, 0.2))
        plain, plain_times, plain_paced = asyncio.run(read_body(server.url, 0.0))
    assert body == plain == b"".join(EVENTS)
    assert paced and not plain_paced
    # ~0.5 s of events read every 0.2 s: the first event at once, then a read per tick (one more
    # when a tick falls just before an event). Read as they arrive, they take one read each.
    assert len(times) <= 6, f"{len(times)} reads of a body paced at 0.2 s"
    assert len(plain_times) > len(times)
    # every read after the first waited for a tick of the shared clock (a multiple of 0.2 s)
    assert all(t % 0.2 < 0.1 for t in times[1:]), [round(t % 0.2, 3) for t in times]


def test_streams_on_one_loop_share_the_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TRANSPORT_ENV, "aiohttp")
    reply = Reply.sse(EVENTS, delay=EVENT_GAP)

    async def both(url: str) -> list[tuple[bytes, list[float], bool]]:
        return list(await asyncio.gather(read_body(url, 0.2), read_body(url + "/b", 0.2)))

    with LoopbackServer(lambda request: reply) as server:
        (body_a, times_a, _), (body_b, times_b, _) = asyncio.run(both(server.url))
    assert body_a == body_b == b"".join(EVENTS)
    # after their first reads, both streams are resumed by the same ticks
    ticks_a = {round(t / 0.2) for t in times_a[1:]}
    ticks_b = {round(t / 0.2) for t in times_b[1:]}
    assert len(ticks_a & ticks_b) >= min(len(ticks_a), len(ticks_b)) - 1


def test_httpx_transport_is_not_paced(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TRANSPORT_ENV, "httpx")
    reply = Reply.sse(EVENTS[:3])

    async def extensions(url: str) -> set[str]:
        with read_interval(0.2):
            async with async_client(httpx.Timeout(10)) as client, \
                    client.stream("GET", url) as response:
                await response.aread()
                return set(response.extensions)

    with LoopbackServer(lambda request: reply) as server:
        assert PACE_EXTENSION not in asyncio.run(extensions(server.url))


# -- through an adapter ------------------------------------------------------------------------------
def paced_answer(adapter: CanonicalAdapter, interval: float, prompt: str = "q") -> tuple[Response, int]:
    """The streamed answer read at ``interval``, and how many bursts its deltas came in."""

    async def main() -> tuple[Response, int]:
        loop = asyncio.get_running_loop()
        times: list[float] = []
        with read_interval(interval):
            response = await adapter.achat(prompt, stream=True,
                                           on_delta=lambda d: times.append(loop.time()))
        return response, bursts(times)

    return asyncio.run(main())


def test_a_paced_answer_is_whole_and_its_deltas_come_in_bursts(
    fake: CanonicalFake, adapter: CanonicalAdapter, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(TRANSPORT_ENV, "aiohttp")
    text = "".join(f"w{i:02d} " for i in range(25))
    fake.push(Turn(text=text, chunk=4, delay=EVENT_GAP, output_tokens=25))
    started = time.monotonic()
    response, paced_bursts = paced_answer(adapter, 0.2)
    elapsed = time.monotonic() - started
    assert response.text == text and response.usage.output_tokens == 25
    assert paced_bursts <= 6, f"{paced_bursts} bursts of deltas at a 0.2 s read interval"
    # the answer ends at most one interval after its last event (~0.5 s of events)
    assert elapsed < 0.5 + 0.2 + 2.0
    fake.push(Turn(text=text, chunk=4, delay=EVENT_GAP, output_tokens=25))
    plain, plain_bursts = paced_answer(adapter, 0.0)
    assert plain.text == text
    assert plain_bursts > paced_bursts


def test_a_paced_stream_cut_mid_way_keeps_its_partial_answer(
    fake: CanonicalFake, adapter: CanonicalAdapter, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(TRANSPORT_ENV, "aiohttp")
    fake.push(Turn(text="abcdefghijklmnopqrstuvwxyz", chunk=2, delay=EVENT_GAP, reset_after=8))
    with pytest.raises(APIConnectionError) as caught:
        paced_answer(adapter, 0.15)
    assert caught.value.code == "network_error"
    assert caught.value.partial is not None
    assert caught.value.partial.text and "abcdefghijklmnopqrstuvwxyz".startswith(
        caught.value.partial.text)


def test_a_paced_stream_gives_its_connection_back(
    fake: CanonicalFake, adapter: CanonicalAdapter, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(TRANSPORT_ENV, "aiohttp")
    for i in range(3):
        fake.push(Turn(text=f"answer {i} " * 5, chunk=3, delay=0.01))

    async def three() -> list[str]:
        with read_interval(0.1):
            return [(await adapter.achat(f"q{i}", stream=True)).text for i in range(3)]

    started = time.monotonic()
    texts = asyncio.run(three())
    assert texts == [f"answer {i} " * 5 for i in range(3)]
    assert fake.server.connections_made == 1
    assert time.monotonic() - started < 10  # a connection left paused would not hold a call


# -- the batch ---------------------------------------------------------------------------------------
class IntervalRecorder(CanonicalAdapter):
    """A CanonicalAdapter that notes the read interval each call runs under."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.intervals: list[float] = []

    async def achat(self, *args: Any, **kwargs: Any) -> Response:
        self.intervals.append(current_read_interval())
        return await super().achat(*args, **kwargs)


@pytest.mark.parametrize(
    ("concurrency", "given", "expected"),
    [(8, None, 0.0), (PACED_CONCURRENCY - 1, None, 0.0), (PACED_CONCURRENCY, None, 0.05),
     (256, None, 0.2), (256, 0, 0.0), (4, 0.05, 0.05)],
)
def test_a_batch_paces_its_rows_by_its_concurrency(concurrency: int, given: float | None,
                                                   expected: float) -> None:
    assert BatchSettings(concurrency=concurrency, read_interval=given).pace == expected
    with BatchFake(events=6, delay=0.005) as fake:
        adapter = IntervalRecorder("echo", base_url=fake.base_url)
        result = batch("row {row}", list(range(12)), model=adapter, concurrency=concurrency,
                       read_interval=given, progress=False)
        adapter.close()
    assert [r.text for r in result] == [f"echo: row {i}" for i in range(12)]
    assert adapter.intervals == [expected] * 12
    assert current_read_interval() == 0.0  # the batch's interval stays in the batch


def test_an_async_batch_paces_only_its_own_rows() -> None:
    with BatchFake(events=6, delay=0.005) as fake:
        adapter = IntervalRecorder("echo", base_url=fake.base_url)

        async def main() -> tuple[list[str], float]:
            result = await abatch("row {row}", list(range(6)), model=adapter, concurrency=64,
                                  progress=False)
            return [r.text for r in result], current_read_interval()

        texts, after = asyncio.run(main())
        adapter.close()
    assert texts == [f"echo: row {i}" for i in range(6)]
    assert adapter.intervals == [0.05] * 6
    assert after == 0.0


def test_the_automatic_interval_grows_with_concurrency_up_to_its_cap() -> None:
    intervals = [auto_read_interval(c) for c in (1, 63, 64, 128, 256, 320, 1000, 10_000)]
    assert intervals == [0.0, 0.0, 0.05, 0.1, 0.2, 0.25, 0.25, 0.25]
    assert max(intervals) == PACED_MAX_INTERVAL


def test_a_bad_interval_fails_the_batch_before_any_row_is_sent() -> None:
    with BatchFake() as fake:
        with pytest.raises(ValueError, match="read_interval must be a number of seconds"):
            batch("row {row}", [1, 2], model=CanonicalAdapter("echo", base_url=fake.base_url),
                  read_interval=-1, progress=False)
        assert sum(fake.asked.values()) == 0


def test_a_stream_cancelled_while_paused_leaves_the_others_reading(
    fake: CanonicalFake, adapter: CanonicalAdapter, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(TRANSPORT_ENV, "aiohttp")
    text = "".join(f"c{i:02d} " for i in range(30))
    for _ in range(3):
        fake.push(Turn(text=text, chunk=4, delay=EVENT_GAP))

    async def main() -> tuple[bool, str, str]:
        with read_interval(0.2):
            first = asyncio.create_task(adapter.achat("a", stream=True))
            second = asyncio.create_task(adapter.achat("b", stream=True))
            await asyncio.sleep(0.3)  # both mid-stream, their sockets paused between ticks
            first.cancel()
            cancelled = False
            try:
                await first
            except asyncio.CancelledError:
                cancelled = True
            survivor = await asyncio.wait_for(second, 10)
            after = await asyncio.wait_for(adapter.achat("c", stream=True), 10)
        return cancelled, survivor.text, after.text

    assert asyncio.run(main()) == (True, text, text)
