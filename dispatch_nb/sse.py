"""Incremental Server-Sent Events decoding, straight from raw byte chunks (:class:`SSEDecoder`).

The WHATWG event-stream rules (PROTOCOLS.md §0), with two leniencies that keep what arrived: a last
event not followed by a blank line is still dispatched at the end of the stream, and invalid UTF-8
is replaced, never fatal. Data stays ``bytes`` until asked for (:attr:`ServerSentEvent.data`), so
JSON goes to the parser without a decode/encode round trip.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import orjson

__all__ = ["SSEDecoder", "ServerSentEvent", "aiter_sse", "iter_sse"]


@dataclass(slots=True)
class ServerSentEvent:
    """One dispatched event. ``data`` is text; ``raw`` the undecoded bytes."""

    raw: bytes
    event: str | None = None
    id: str | None = None
    retry: int | None = None

    @property
    def data(self) -> str:
        """The data lines joined with ``\\n``, decoded as UTF-8 (invalid bytes replaced)."""
        return self.raw.decode("utf-8", "replace")

    def json(self) -> Any:
        """The data parsed as JSON (raises ``ValueError`` when it is not JSON)."""
        try:
            return orjson.loads(self.raw)
        except orjson.JSONDecodeError:
            # Invalid UTF-8 inside an otherwise valid payload: replace and retry once.
            return orjson.loads(self.raw.decode("utf-8", "replace"))

    def __repr__(self) -> str:
        return f"ServerSentEvent(event={self.event!r}, data={self.data!r}, id={self.id!r})"


class SSEDecoder:
    """A pure state machine: ``feed(bytes)`` → events; ``end()`` flushes at end of stream."""

    __slots__ = ("_buf", "_data", "_event", "_has_data", "_last_id", "_retry", "_skip_lf")

    def __init__(self) -> None:
        self._buf = b""
        self._skip_lf = False
        self._data: list[bytes] = []
        self._has_data = False
        self._event: str | None = None
        self._last_id: str | None = None
        self._retry: int | None = None

    def feed(self, chunk: bytes) -> list[ServerSentEvent]:
        """Decode a chunk of any size; returns the events it completed (often none or one)."""
        if not chunk:
            return []
        if (
            not self._skip_lf
            and not self._has_data
            and self._event is None
            and self._retry is None
            and 13 not in chunk  # no b"\r" (an int is found by memchr: 8x faster here)
        ):
            # Fastest path: the chunk is exactly one complete event, ``data: ...`` or
            # ``event: ...`` + ``data: ...``, and nothing is pending (one HTTP chunk per event):
            # its only line feeds are the data line's and the blank line's (and the event line's)
            if not self._buf and chunk.endswith(b"\n\n"):
                blank = len(chunk) - 2  # the data line's line feed: the last but one byte
                if chunk.startswith(b"data: "):
                    if chunk.find(b"\n", 6) == blank:
                        return [ServerSentEvent(chunk[6:-2], None, self._last_id, None)]
                elif chunk.startswith(b"event: "):
                    end = chunk.find(b"\n", 7)
                    if chunk.startswith(b"data: ", end + 1) and chunk.find(b"\n", end + 7) == blank:
                        name = chunk[7:end].decode("utf-8", "replace")
                        return [ServerSentEvent(chunk[end + 7 : -2], name, self._last_id, None)]
            return self._feed_blocks(chunk)
        if self._skip_lf:
            self._skip_lf = False
            if chunk[:1] == b"\n":
                chunk = chunk[1:]
                if not chunk:
                    return []
        buf = self._buf + chunk if self._buf else chunk
        lines = buf.splitlines(keepends=True)
        last = lines[-1]
        if last[-1:] in (b"\n", b"\r"):
            self._buf = b""
            if last[-1:] == b"\r":
                self._skip_lf = True
        else:
            self._buf = last
            lines.pop()
        events = map(self._line, [line.rstrip(b"\r\n") for line in lines])
        return [event for event in events if event is not None]

    def _feed_blocks(self, chunk: bytes) -> list[ServerSentEvent]:
        # Fast path: LF line endings and no event half-parsed (what LLM APIs send, whether one
        # event per chunk or many). Whole events end in a blank line, so splitting on b"\n\n"
        # yields each event's lines as one block; the last block is not finished yet and waits
        # in ``_buf`` (unparsed) for the next chunk. ``data: ...`` and ``event: ...`` +
        # ``data: ...`` blocks become events directly; any other block goes line by line.
        buf = self._buf + chunk if self._buf else chunk
        blocks = buf.split(b"\n\n")
        self._buf = blocks.pop()
        events: list[ServerSentEvent] = []
        append = events.append
        for block in blocks:
            if block[:6] == b"data: ":
                if block.find(b"\n", 6) < 0:
                    append(ServerSentEvent(block[6:], None, self._last_id, None))
                    continue
            elif block[:7] == b"event: ":
                end = block.find(b"\n", 7)
                if (
                    end > 0
                    and block[end + 1 : end + 7] == b"data: "
                    and block.find(b"\n", end + 7) < 0
                ):
                    name = block[7:end].decode("utf-8", "replace")
                    append(ServerSentEvent(block[end + 7 :], name, self._last_id, None))
                    continue
            for line in block.split(b"\n"):
                self._line(line)
            event = self._line(b"")
            if event is not None:
                append(event)
        return events

    def end(self) -> list[ServerSentEvent]:
        """The end of the stream: process an unterminated last line and a pending event."""
        lines = [*self._buf.splitlines(), b""]  # the fast path may leave several lines in _buf
        self._buf = b""
        self._skip_lf = False
        return [event for event in map(self._line, lines) if event is not None]

    def _line(self, line: bytes) -> ServerSentEvent | None:
        if not line:
            if not self._has_data:
                # WHATWG: an event with an empty data buffer is not dispatched.
                self._event = None
                self._retry = None
                return None
            event = ServerSentEvent(
                b"\n".join(self._data), self._event, self._last_id, self._retry
            )
            self._data = []
            self._has_data = False
            self._event = None
            self._retry = None
            return event
        if line[:1] == b":":
            return None
        name, sep, value = line.partition(b":")
        if sep and value[:1] == b" ":
            value = value[1:]
        if name == b"data":
            self._data.append(value)
            self._has_data = True
        elif name == b"event":
            self._event = value.decode("utf-8", "replace")
        elif name == b"id":
            if b"\0" not in value:
                self._last_id = value.decode("utf-8", "replace")
        elif name == b"retry" and value.isdigit():
            self._retry = int(value)
        return None


def iter_sse(chunks: Iterable[bytes]) -> Iterator[ServerSentEvent]:
    """Events from an iterable of byte chunks (e.g. ``response.iter_raw()``)."""
    decoder = SSEDecoder()
    for chunk in chunks:
        yield from decoder.feed(chunk)
    yield from decoder.end()


async def aiter_sse(chunks: AsyncIterable[bytes]) -> AsyncIterator[ServerSentEvent]:
    """Events from an async iterable of byte chunks (e.g. ``response.aiter_raw()``)."""
    decoder = SSEDecoder()
    async for chunk in chunks:
        for event in decoder.feed(chunk):
            yield event
    for event in decoder.end():
        yield event
