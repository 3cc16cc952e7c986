"""Compressed answers on the shared HTTP layer (``http_adapter``), against raw loopback servers.

The contract suite checks every adapter decodes every encoding the fakes send; this file checks
the edges: an encoding the installation cannot decode, a corrupt compressed stream, a compressed
stream cut in the middle, and a stream that says ``identity``.
"""

from __future__ import annotations

import asyncio
import zlib
from typing import Any

import pytest

from dispatch_nb import APIConnectionError
from dispatch_nb.providers.openai import OpenAIAdapter

from ..fakes.provider import sse_event
from ..fakes.server import LoopbackServer, RecordedRequest, Reply, compressed


def chunk(text: str | None = None, finish: str | None = None) -> bytes:
    delta = {"content": text} if text is not None else {}
    return sse_event({"id": "c1", "object": "chat.completion.chunk", "model": "m",
                      "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})


EVENTS = [chunk("Hel"), chunk("lo"), chunk(finish="stop"), b"data: [DONE]\n\n"]


def adapter_for(server: LoopbackServer, **kw: Any) -> OpenAIAdapter:
    kw.setdefault("max_retries", 0)
    return OpenAIAdapter("m", backend="compatible", base_url=server.url + "/v1", **kw)


def call(adapter: OpenAIAdapter, mode: str) -> Any:
    if mode == "async":
        return asyncio.run(adapter.achat("x", stream=True))
    return adapter.chat("x", stream=mode == "stream")


@pytest.mark.parametrize("mode", ["json", "stream", "async"])
def test_an_encoding_httpx_cannot_decode_is_a_clear_error_and_not_retried(mode: str) -> None:
    body = {"choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"},
                         "finish_reason": "stop"}]}

    def handler(request: RecordedRequest) -> Reply:
        reply = Reply.json(body) if mode == "json" else Reply.sse(EVENTS)
        reply.headers["content-encoding"] = "compress"  # LZW: no decoder in httpx
        return reply

    with LoopbackServer(handler) as server:
        adapter = adapter_for(server, max_retries=2)
        with pytest.raises(APIConnectionError) as info:
            call(adapter, mode)
        assert info.value.code == "network_error"
        assert len(server.requests) == 1  # the same request would get the same encoding
    assert "'compress'" in info.value.message and "cannot decode" in info.value.message
    assert "gzip" in info.value.message  # what it can decode
    assert not info.value.retryable


@pytest.mark.parametrize("mode", ["stream", "async"])
def test_a_corrupt_compressed_stream_says_so_and_keeps_what_arrived(mode: str) -> None:
    gzip = zlib.compressobj(wbits=31)
    good = gzip.compress(EVENTS[0]) + gzip.flush(zlib.Z_SYNC_FLUSH)
    # the first event decodes; then, in a later read, bytes that are not deflate data at all (what
    # one read brings is decoded in one go, so a corrupt read loses its own bytes, never earlier ones)
    reply = Reply.sse([good, b"\xff" * 64], headers={"content-encoding": "gzip"}, delay=0.2)
    with LoopbackServer(lambda request: reply) as server, pytest.raises(
            APIConnectionError) as info:
        call(adapter_for(server), mode)
    assert info.value.code == "network_error"
    assert "gzip-compressed answer could not be decoded" in info.value.message
    assert info.value.partial is not None and info.value.partial.text == "Hel"


@pytest.mark.parametrize("encoding", ["gzip", "deflate", "br", "zstd"])
@pytest.mark.parametrize("mode", ["stream", "async"])
def test_a_compressed_stream_cut_in_the_middle_keeps_partial(encoding: str, mode: str) -> None:
    def handler(request: RecordedRequest) -> Reply:
        return Reply.sse(EVENTS, compress=encoding, reset_after=2)

    with LoopbackServer(handler) as server, pytest.raises(APIConnectionError) as info:
        call(adapter_for(server), mode)
    assert info.value.code == "network_error"
    assert info.value.partial is not None and info.value.partial.text == "Hello"


@pytest.mark.parametrize("mode", ["stream", "async"])
def test_identity_and_compressed_streams_give_the_same_answer(mode: str) -> None:
    answers = []
    for encoding in ("identity", "gzip, identity", "deflate"):
        with LoopbackServer(lambda request, e=encoding: _encoded(EVENTS, e)) as server:
            answers.append(call(adapter_for(server), mode).model_dump())
    assert answers[0] == answers[1] == answers[2]
    assert answers[0]["content"] == [{"type": "text", "text": "Hello", "provider_data": None}]


def _encoded(events: list[bytes], header: str) -> Reply:
    """The events with ``Content-Encoding: header`` (``identity`` codings send no bytes changed)."""
    codings = [c.strip() for c in header.split(",") if c.strip() != "identity"]
    reply = Reply.sse(events)
    for coding in codings:
        reply = compressed(reply, coding)
    reply.headers["content-encoding"] = header
    return reply


def test_the_fake_compresses_event_by_event() -> None:
    """Each chunk is flushed on its own, so a compressed stream still arrives piece by piece."""
    reply = compressed(Reply.sse(EVENTS), "gzip")
    assert reply.headers["content-encoding"] == "gzip"
    decoder = zlib.decompressobj(wbits=31)
    pieces = [decoder.decompress(c) for c in reply.chunks or []]
    assert pieces == EVENTS
    assert decoder.eof
