"""Every adapter reads a rude event stream exactly like a polite one.

Real servers and the proxies in front of them do not send one event per read: an event arrives in
pieces (cut inside a multi-byte UTF-8 character, or between the ``\\r`` and ``\\n`` of a CRLF line
ending), with ``: keep-alive`` comments, ``id:`` and ``retry:`` fields (all valid SSE). The fakes
can send exactly that (``Rudeness`` in ``tests/fakes/server.py``); here each provider's fake answers
the same turns politely and rudely, sync and async, and the responses must be identical.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from dispatch_nb import Message, Response
from dispatch_nb.adapter import Adapter

from ..fakes.provider import WEATHER, ToolCall, Turn
from ..fakes.server import Rudeness
from .targets import Target

TEXT = 'Grüße aus Köln — 東京は晴れ 👋🏽, ça va? "quoted"\n\nNew paragraph: naïve café.'


def turns(target: Target) -> list[Turn]:
    answers = [
        Turn(text=TEXT, chunk=3, input_tokens=30, output_tokens=20),
        Turn(text="Let me look: ", chunk=5,
             tool_calls=[ToolCall("call_1", "get_weather", {"city": "Zürich — 東京"})]),
    ]
    if target.supports_thinking:
        answers.append(Turn(thinking="Überlegung: 考える…", signature="c2lnbmF0dXJl+/==",
                            text="Fertig ✓", chunk=2))
    return answers


def ask(adapter: Adapter, mode: str) -> Response:
    messages = [Message(role="user", content="Wetter?")]
    if mode == "sync":
        with adapter.stream(messages, tools=[WEATHER]) as stream:
            for _ in stream:
                pass
        return stream.response

    async def run() -> Response:
        async with adapter.astream(messages, tools=[WEATHER]) as stream:
            async for _ in stream:
                pass
        return stream.response

    return asyncio.run(run())


def answers(
    target: Target, mode: str, rudeness: Rudeness | None, compress: str | None = None
) -> list[Any]:
    """The responses to :func:`turns` from a fresh fake (so that the ids it makes match)."""
    with target.make_fake() as fake:
        fake.server.rudeness = rudeness
        fake.server.compress = compress
        adapter = target.make_adapter(fake, max_retries=0)
        try:
            got = []
            for turn in turns(target):
                fake.push(turn)
                got.append(ask(adapter, mode).model_dump())
            return got
        finally:
            adapter.close()


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_rude_stream_reads_like_a_polite_one(target: Target, mode: str) -> None:
    polite = answers(target, mode, None)
    assert polite[0]["content"][0]["text"] == TEXT
    assert polite[1]["tool_calls"][0]["arguments"] == {"city": "Zürich — 東京"}
    assert answers(target, mode, Rudeness()) == polite


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_rude_compressed_stream_reads_like_a_polite_one(target: Target, mode: str) -> None:
    """Rudeness shapes the event stream, then the server compresses it (comments, ids and splits
    travel inside the gzip stream, each piece flushed as its own HTTP chunk)."""
    assert answers(target, mode, Rudeness(), "gzip") == answers(target, mode, None)


@pytest.mark.parametrize(
    "rudeness",
    [Rudeness(split=True, comments=False, ids=False, retry=None, crlf=False),
     Rudeness(split=False, comments=True, ids=False, retry=None, crlf=False),
     Rudeness(split=False, comments=False, ids=True, retry=3000, crlf=False),
     Rudeness(split=True, comments=False, ids=False, retry=None, crlf=True)],
    ids=["split", "comments", "ids-and-retry", "crlf-split"],
)
def test_each_kind_of_rudeness_alone(target: Target, rudeness: Rudeness) -> None:
    assert answers(target, "sync", rudeness) == answers(target, "sync", None)


def test_the_rude_wire_is_what_it_claims() -> None:
    event = 'data: {"type": "text", "text": "Grüße"}\n\n'.encode()
    pieces = Rudeness().pieces(0, event)
    wire = b"".join(pieces)
    assert wire.startswith(b"retry: 3000\r\n\r\n: keep-alive\r\n\r\nid: evt-0\r\n")
    assert b": a comment line inside the event\r\n" in wire and wire.endswith(b"\r\n\r\n")
    assert b"\n" not in wire.replace(b"\r\n", b"")  # CRLF everywhere
    assert len(pieces) >= 4
    with pytest.raises(UnicodeDecodeError):
        pieces[2].decode()  # cut inside "ü"
    assert pieces[-1] == b"\n"  # the last CRLF is cut between \r and \n
    assert Rudeness().pieces(1, event)[0].startswith(b": keep-alive")  # retry: only first
