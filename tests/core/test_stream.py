"""The accumulator: deltas in, the same Response a non-streamed call gives out."""

from __future__ import annotations

import tracemalloc

from dispatch_nb import TextBlock, ThinkingBlock, ToolUseBlock
from dispatch_nb.stream import Accumulator, ResponseStream, parse_tool_arguments


def test_blocks_keep_model_order_and_keys() -> None:
    acc = Accumulator("m")
    acc.thinking("Let me ", key=0)
    acc.thinking("think", key=0)
    acc.signature("sig-", key=0)
    acc.signature("nature", key=0)
    acc.text("Hel")
    acc.text("lo")
    acc.tool_start("k1", "call_1", "f")
    acc.tool_delta("k1", '{"a":')
    acc.tool_start("k2", "call_2", "g")
    acc.tool_delta("k1", " 1}")
    acc.tool_end("k2", raw_arguments="")
    response = acc.finish()
    assert [b.type for b in response.content] == ["thinking", "text", "tool_use", "tool_use"]
    assert response.content[0] == ThinkingBlock(thinking="Let me think", signature="sig-nature")
    assert response.content[1] == TextBlock("Hello")
    assert response.tool_calls == [
        ToolUseBlock(id="call_1", name="f", arguments={"a": 1}),
        ToolUseBlock(id="call_2", name="g", arguments={}),
    ]
    assert response.stop_reason == "tool_use"


def test_new_text_key_starts_a_new_block() -> None:
    acc = Accumulator()
    acc.text("a", key="msg_1")
    acc.text("b", key="msg_2")
    assert [b.text for b in acc.finish().content] == ["a", "b"]


def test_bad_tool_json_is_reported_on_the_call() -> None:
    assert parse_tool_arguments("") == ({}, None)
    args, error = parse_tool_arguments('{"a": ')
    assert args == {} and error and "not valid JSON" in error
    assert "JSON object" in (parse_tool_arguments("[1, 2]")[1] or "")
    acc = Accumulator()
    acc.tool_start(0, "c", "f")
    acc.tool_delta(0, '{"city": "Par')
    call = acc.finish().tool_calls[0]
    assert call.arguments == {} and call.raw_arguments == '{"city": "Par'
    assert call.arguments_error


def test_snapshot_is_partial_and_finish_defaults_stop_reason() -> None:
    acc = Accumulator()
    acc.text("so far")
    assert acc.snapshot().text == "so far" and acc.snapshot().stop_reason is None
    assert acc.finish().stop_reason == "end_turn"


def test_response_stream_consumes_on_response_access() -> None:
    acc = Accumulator()

    def deltas():  # type: ignore[no-untyped-def]
        yield acc.text("a")
        yield acc.text("b")

    stream = ResponseStream(deltas(), acc)
    assert stream.response.text == "ab"
    assert list(stream) == []


def test_memory_is_flat_in_the_number_of_deltas() -> None:
    acc = Accumulator()
    tracemalloc.start()
    for _ in range(1000):
        acc.text("x")
    base, _ = tracemalloc.get_traced_memory()
    for _ in range(100_000):
        acc.text("x")
    now, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    # one list slot per fragment (8 bytes) plus the interned 1-char string: far below 100 B/delta
    assert (now - base) / 100_000 < 20
    assert len(acc.finish().text) == 101_000


def test_fast_text_deltas_equal_validated_ones() -> None:
    from dispatch_nb import StreamDelta
    from dispatch_nb.types import text_delta

    fast = text_delta("text_delta", "hé")
    slow = StreamDelta(type="text_delta", text="hé")
    assert fast == slow
    assert fast.model_dump() == slow.model_dump()
    assert fast.model_dump(exclude_unset=True) == slow.model_dump(exclude_unset=True)
    assert fast.model_dump_json() == slow.model_dump_json()
    assert StreamDelta.model_validate(fast.model_dump()) == fast


# -- a sync stream over the bridge: the caller takes batches ---------------------------------------
def _bridged(n: int, *, fail_after: int | None = None) -> tuple[ResponseStream, Accumulator]:
    """A sync stream of ``n`` text deltas made by a coroutine on the library's loop thread (as
    every adapter's ``stream()`` is), a few at a time, so the caller takes them in batches."""
    import asyncio

    from dispatch_nb.bridge import SyncIterator
    from dispatch_nb.errors import APIConnectionError

    acc = Accumulator("m")

    async def deltas():  # type: ignore[no-untyped-def]
        for i in range(n):
            if i == fail_after:
                raise APIConnectionError("the connection dropped", provider="fake")
            yield acc.text(f"{i},")
            if i % 7 == 6:
                await asyncio.sleep(0.001)

    return ResponseStream(SyncIterator(deltas), acc), acc


def test_a_loop_left_half_way_loses_nothing() -> None:
    stream, _ = _bridged(500)
    seen: list[str] = []
    with stream:
        for delta in stream:
            seen.append(delta.text or "")
            if len(seen) == 3:
                break  # in the middle of a batch
        seen.append(next(stream).text or "")  # the 4th, from the batch the loop left
        for delta in stream:
            seen.append(delta.text or "")
            if len(seen) == 250:
                break
        seen += [d.text or "" for d in stream]
    assert seen == [f"{i}," for i in range(500)]
    assert stream.response.text == "".join(seen)


def test_close_inside_the_loop_ends_it() -> None:
    stream, _ = _bridged(500)
    seen = []
    for delta in stream:
        seen.append(delta)
        if len(seen) == 2:
            stream.close()
    assert len(seen) == 2
    assert list(stream) == []


def test_an_error_mid_stream_keeps_what_arrived() -> None:
    import pytest

    from dispatch_nb.errors import APIConnectionError

    stream, _ = _bridged(100, fail_after=40)
    seen: list[str | None] = []
    with pytest.raises(APIConnectionError) as caught:
        seen.extend(delta.text for delta in stream)
    assert caught.value.code == "network_error"
    assert caught.value.partial is not None
    assert caught.value.partial.text == "".join(f"{i}," for i in range(40))
    assert len(seen) == 40
    assert list(stream) == []  # closed by the error


def _slow_deltas(acc: Accumulator):  # type: ignore[no-untyped-def]
    import asyncio

    async def deltas():  # type: ignore[no-untyped-def]
        yield acc.text("hello ")
        await asyncio.sleep(30)
        yield acc.text("never")

    return deltas


def test_close_from_another_thread_ends_a_tapped_sync_stream() -> None:
    # keep_events() and sync_stream() (a CachedAdapter's stream()) wrap the bridge; closing
    # the stream from another thread must still cancel the task and wake the reading thread
    import threading

    from dispatch_nb.bridge import SyncIterator
    from dispatch_nb.stream import AsyncResponseStream, sync_stream

    def kept() -> ResponseStream:
        acc = Accumulator("m")
        return ResponseStream(SyncIterator(_slow_deltas(acc)), acc).keep_events()

    def bridged_async() -> ResponseStream:
        acc = Accumulator("m")
        return sync_stream(AsyncResponseStream(_slow_deltas(acc)(), acc))

    def read(stream: ResponseStream, got: list[str], first: threading.Event) -> None:
        try:
            for delta in stream:
                got.append(delta.text or "")
                first.set()
            got.append("end")
        except BaseException as exc:
            got.append(type(exc).__name__)

    for make in (kept, bridged_async):
        stream = make()
        got: list[str] = []
        first = threading.Event()
        reader = threading.Thread(target=read, args=(stream, got, first), daemon=True)
        reader.start()
        assert first.wait(10)
        stream.close()
        reader.join(5)
        assert not reader.is_alive(), make.__name__
        assert got[0] == "hello " and "never" not in got, make.__name__
