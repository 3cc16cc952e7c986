"""The SSE decoder: WHATWG rules, any chunking, bad input, sync and async."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dispatch_nb.sse import ServerSentEvent, SSEDecoder, aiter_sse, iter_sse


def decode(data: bytes, sizes: list[int] | None = None) -> list[ServerSentEvent]:
    decoder = SSEDecoder()
    events: list[ServerSentEvent] = []
    if sizes is None:
        events += decoder.feed(data)
    else:
        pos = 0
        for size in sizes:
            events += decoder.feed(data[pos : pos + size])
            pos += size
        events += decoder.feed(data[pos:])
    return events + decoder.end()


def test_fields_and_dispatch() -> None:
    stream = (
        b": a comment\n"
        b"event: message_start\n"
        b"id: 42\n"
        b"retry: 1500\n"
        b"data: {\"a\": 1}\n"
        b"\n"
        b"data:no-space\n\n"
        b"unknown: field\n"
        b"data: x\n\n"
    )
    events = decode(stream)
    assert [(e.event, e.data, e.id) for e in events] == [
        ("message_start", '{"a": 1}', "42"),
        (None, "no-space", "42"),
        (None, "x", "42"),
    ]
    assert events[0].retry == 1500
    assert events[0].json() == {"a": 1}


@pytest.mark.parametrize("newline", [b"\n", b"\r", b"\r\n"])
def test_line_endings(newline: bytes) -> None:
    stream = newline.join([b"event: e", b"data: one", b"data: two", b"", b"data: three", b"", b""])
    events = decode(stream)
    assert [(e.event, e.data) for e in events] == [("e", "one\ntwo"), (None, "three")]


def test_one_event_per_chunk_decodes_like_any_other_chunking() -> None:
    """The one-event-per-chunk shapes APIs send (``data:``, ``event:`` + ``data:``) decode as they
    would line by line, including fields still pending from an earlier chunk."""
    chunks = [
        b"event: response.output_text.delta\ndata: {\"delta\": \"Hi\"}\n\n",
        b"data: {\"x\": 1}\n\n",
        b"retry: 10\nid: 7\n",
        b"data: after\n\n",
        b"retry: 20\n",
        b"event: a:b\ndata: \n\n",
        b"event: \xff\ndata: z\n\n",
    ]
    decoder = SSEDecoder()
    by_chunk = [event for chunk in chunks for event in decoder.feed(chunk)] + decoder.end()
    data = b"".join(chunks)
    assert by_chunk == decode(data, [1] * len(data))
    assert [(e.event, e.data, e.id, e.retry) for e in by_chunk] == [
        ("response.output_text.delta", '{"delta": "Hi"}', None, None),
        (None, '{"x": 1}', None, None),
        (None, "after", "7", 10),
        ("a:b", "", "7", 20),
        ("\ufffd", "z", "7", None),
    ]


def test_crlf_split_across_chunks_is_one_line_break() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"data: a\r") == []
    events = decoder.feed(b"\n\r\n")
    assert [e.data for e in events] == ["a"]


def test_only_one_leading_space_is_removed() -> None:
    assert decode(b"data:  two spaces\n\n")[0].data == " two spaces"


def test_event_without_data_is_not_dispatched() -> None:
    assert decode(b"event: ping\n\ndata: real\n\n")[0].data == "real"
    assert len(decode(b"event: ping\n\ndata: real\n\n")) == 1


def test_truncated_final_event_is_kept() -> None:
    events = decode(b"data: first\n\ndata: unfinished")
    assert [e.data for e in events] == ["first", "unfinished"]


def test_invalid_utf8_is_replaced_not_fatal() -> None:
    events = decode(b"data: caf\xc3\n\ndata: {\"t\": \"\xff\"}\n\n")
    assert events[0].data == "caf\ufffd"
    assert events[1].json() == {"t": "\ufffd"}


def test_done_sentinel_is_plain_data() -> None:
    assert decode(b"data: [DONE]\n\n")[0].data == "[DONE]"


def test_iterators_sync_and_async() -> None:
    chunks = [b"data: a", b"\n\nda", b"ta: b\n", b"\n"]
    assert [e.data for e in iter_sse(chunks)] == ["a", "b"]

    async def agen() -> AsyncIterator[bytes]:
        for c in chunks:
            yield c

    async def collect() -> list[str]:
        return [e.data async for e in aiter_sse(agen())]

    assert asyncio.run(collect()) == ["a", "b"]


_line = st.one_of(
    st.builds(
        lambda v: b"data: " + v,
        st.binary(max_size=12).filter(lambda b: b"\r" not in b and b"\n" not in b),
    ),
    st.builds(lambda v: b"event: " + v, st.sampled_from([b"a", b"message_stop", b"\xff\xfe"])),
    st.just(b": ping"),
    st.just(b"id: 7"),
    st.just(b"retry: 10"),
    st.just(b""),
)


@given(
    lines=st.lists(_line, max_size=25),
    newline=st.sampled_from([b"\n", b"\r", b"\r\n"]),
    cuts=st.lists(st.integers(min_value=0, max_value=7), max_size=60),
    tail=st.binary(max_size=6),
)
def test_any_chunking_gives_identical_events(
    lines: list[bytes], newline: bytes, cuts: list[int], tail: bytes
) -> None:
    data = newline.join(lines) + newline + tail
    whole = decode(data)
    assert decode(data, cuts) == whole
    assert decode(data, [1] * len(data)) == whole
    for event in whole:  # never crashes on what it dispatched
        assert isinstance(event.data, str)


@given(st.binary(max_size=200), st.lists(st.integers(min_value=1, max_value=9), max_size=40))
def test_arbitrary_bytes_never_crash(data: bytes, cuts: list[int]) -> None:
    assert decode(data, cuts) == decode(data)


@given(events=st.lists(st.lists(_line, min_size=1, max_size=4), max_size=12))
def test_each_event_in_its_own_chunk_gives_identical_events(events: list[list[bytes]]) -> None:
    """The one-event-per-chunk fast path (the shape APIs send) against byte-by-byte decoding,
    over events of any lines: several data lines, ids, comments, names, empty values."""
    chunks = [b"\n".join(lines) + b"\n\n" for lines in events]
    decoder = SSEDecoder()
    by_chunk = [event for chunk in chunks for event in decoder.feed(chunk)] + decoder.end()
    data = b"".join(chunks)
    assert by_chunk == decode(data, [1] * len(data))
