"""The paths real users take, which the polite loopback fakes used to skip.

- HTTPS: cancel and deadline over TLS (a throw-away CA from ``trustme``, trusted the way users trust
  a corporate CA: ``SSL_CERT_FILE``), mid-stream, before the headers on a reused connection, and
  during a TLS handshake that never completes.
- A stream that ends without its terminal event, async as well as sync.
- ``asyncio.wait_for`` (and ``asyncio.timeout``) cancelling a call from outside.
- ``ResponseStream.text_stream``.
- A cancel callback that raises.
- A server that closes idle keep-alive connections (uvicorn after 5 s, nginx after 75 s), or each
  one right after its answer.

Rude event streams (split inside UTF-8 characters, comments, ``id:``/``retry:``, CRLF) are run
through every adapter in ``tests/contract/test_rude_wire.py``.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trustme

from dispatch_nb import APIConnectionError, APITimeoutError, CancelToken, RequestCancelled, http_adapter
from dispatch_nb.providers.fake import CanonicalAdapter

from ..fakes.canonical import CanonicalFake
from ..fakes.provider import Stall, Turn, sse_event
from ..fakes.server import (
    LoopbackServer,
    RecordedRequest,
    Reply,
    closed_by_client,
    tls_context,
    wait_for,
)

#: a cancel wakes a blocked call at once ("within 100 ms"), not at the next poll or when the
#: server answers: this much, with room for a busy 2-core machine, is far less than any stall here
CANCEL_BUDGET = 0.5


def cancel_when(token: CancelToken, started: threading.Event, delay: float,
                at: list[float]) -> threading.Thread:
    def run() -> None:
        started.wait(5)
        time.sleep(delay)
        at.append(time.monotonic())
        token.cancel("stopped by the test")

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


# -- HTTPS ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture
def trusted(ca: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Clients trust the throw-away CA, as users trust a corporate one."""
    pem = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(pem))
    monkeypatch.setenv("SSL_CERT_FILE", str(pem))


@pytest.fixture
def tls_fake(ca: Any, trusted: None) -> Iterator[CanonicalFake]:
    with CanonicalFake(tls=tls_context(ca)) as fake:
        yield fake


@pytest.fixture
def tls_adapter(tls_fake: CanonicalFake) -> Iterator[CanonicalAdapter]:
    adapter = CanonicalAdapter("echo", base_url=tls_fake.base_url, max_retries=0)
    yield adapter
    adapter.close()


def test_https_works_and_is_https(tls_fake: CanonicalFake, tls_adapter: CanonicalAdapter) -> None:
    assert tls_fake.base_url.startswith("https://127.0.0.1:")
    assert tls_adapter.chat("over TLS", stream=True).text == "echo: over TLS"
    assert asyncio.run(tls_adapter.achat("again", stream=True)).text == "echo: again"


def test_an_untrusted_certificate_is_a_clear_connection_error(ca: Any) -> None:
    with CanonicalFake(tls=tls_context(ca)) as fake:  # (no SSL_CERT_FILE: the CA is unknown)
        adapter = CanonicalAdapter("echo", base_url=fake.base_url, max_retries=0)
        with pytest.raises(APIConnectionError) as info:
            adapter.chat("hi")
        adapter.close()
    assert info.value.code == "network_error"
    assert "certificate" in info.value.message.lower()


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_cancel_mid_stream_over_tls(tls_fake: CanonicalFake, tls_adapter: CanonicalAdapter,
                                    mode: str) -> None:
    tls_fake.push(Turn(text="abcdefghijkl", chunk=2, stall_after=3, stall=2.0))
    token, streaming, at = CancelToken(), threading.Event(), []
    thread = cancel_when(token, streaming, 0.15, at)

    def run() -> Any:
        if mode == "sync":
            return tls_adapter.chat("x", stream=True, cancel=token,
                                    on_delta=lambda d: streaming.set())
        return asyncio.run(tls_adapter.achat("x", stream=True, cancel=token,
                                             on_delta=lambda d: streaming.set()))

    with pytest.raises(RequestCancelled) as info:
        run()
    reacted = time.monotonic() - at[0]
    thread.join()
    assert info.value.code == "cancelled" and info.value.message == "stopped by the test"
    assert reacted < CANCEL_BUDGET, reacted
    assert info.value.partial is not None and info.value.partial.text == "abcdef"
    assert closed_by_client(tls_fake)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_deadline_mid_stream_over_tls(tls_fake: CanonicalFake, tls_adapter: CanonicalAdapter,
                                      mode: str) -> None:
    # the deadline covers the TLS handshake and the first three chunks too: 1.5 s leaves room
    # for them on a busy machine (0.4 s did not, once)
    tls_fake.push(Turn(text="abcdefghijkl", chunk=2, stall_after=3, stall=6.0))

    def run() -> Any:
        if mode == "sync":
            return tls_adapter.chat("x", stream=True, timeout=1.5)
        return asyncio.run(tls_adapter.achat("x", stream=True, timeout=1.5))

    started = time.monotonic()
    with pytest.raises(APITimeoutError) as info:
        run()
    assert info.value.code == "timeout"
    assert time.monotonic() - started < 1.5 + CANCEL_BUDGET + 0.1
    assert info.value.partial is not None and info.value.partial.text == "abcdef"
    assert closed_by_client(tls_fake)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_deadline_before_headers_on_a_reused_tls_connection(
    tls_fake: CanonicalFake, tls_adapter: CanonicalAdapter, mode: str
) -> None:
    async def twice() -> None:
        await tls_adapter.achat("warm up")
        tls_fake.push(Stall(2.0))
        await tls_adapter.achat("x", stream=True, timeout=0.4)

    def run() -> None:
        if mode == "sync":
            tls_adapter.chat("warm up")
            tls_fake.push(Stall(2.0))
            tls_adapter.chat("x", stream=True, timeout=0.4)
        else:
            asyncio.run(twice())

    started = time.monotonic()
    with pytest.raises(APITimeoutError) as info:
        run()
    assert info.value.code == "timeout"
    assert len(tls_fake.chat_requests) == 2
    assert time.monotonic() - started < 2.0  # the warm-up plus 0.4 s, not the server's 2 s stall
    assert closed_by_client(tls_fake)


@pytest.fixture
def silent_tls_port() -> Iterator[int]:
    """A port that accepts TCP connections and then says nothing: a TLS handshake never ends."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.05)
        while not stop.is_set():
            try:
                accepted.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    thread.join(2)
    for sock in [*accepted, server]:
        sock.close()


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_deadline_during_a_tls_handshake_that_never_ends(silent_tls_port: int, trusted: None,
                                                         mode: str) -> None:
    adapter = CanonicalAdapter("echo", base_url=f"https://127.0.0.1:{silent_tls_port}", max_retries=0)

    def run() -> Any:
        if mode == "sync":
            return adapter.chat("x", timeout=0.4)
        return asyncio.run(adapter.achat("x", timeout=0.4))

    started = time.monotonic()
    with pytest.raises(APITimeoutError) as info:
        run()
    assert info.value.code == "timeout"
    assert time.monotonic() - started < 0.4 + CANCEL_BUDGET + 0.3  # not the 15 s connect timeout
    adapter.close()


# -- a stream that stops short ------------------------------------------------------------------


def _no_done(request: RecordedRequest) -> Reply:
    # A proxy that cut the stream cleanly: text, then the end of the body, no "done" event.
    return Reply.sse([sse_event({"type": "text", "text": t}) for t in ("Hello", ", wor")])


@pytest.mark.parametrize("mode", ["stream", "async-stream", "async-chat"])
def test_a_stream_that_ends_without_its_terminal_event(mode: str) -> None:
    with LoopbackServer(_no_done) as server:
        adapter = CanonicalAdapter("echo", base_url=server.url, max_retries=2)
        seen: list[str] = []

        async def consume() -> None:
            async with adapter.astream("hi") as stream:
                async for delta in stream:
                    seen.append(delta.text or "")

        def run() -> None:
            if mode == "stream":
                with adapter.stream("hi") as stream:
                    seen.extend(d.text or "" for d in stream)
            elif mode == "async-stream":
                asyncio.run(consume())
            else:
                asyncio.run(adapter.achat("hi", stream=True, on_delta=lambda d: seen.append(d.text)))

        with pytest.raises(APIConnectionError) as info:
            run()
        adapter.close()
    assert info.value.code == "network_error" and info.value.status_code is None
    assert "ended before the answer was complete" in info.value.message
    assert "".join(seen) == "Hello, wor"  # what arrived reached the caller...
    assert info.value.partial is not None and info.value.partial.text == "Hello, wor"  # ...and stays
    assert len(server.requests) == 1  # output reached the caller: never retried


# -- asyncio cancelling from outside ------------------------------------------------------------


@pytest.mark.parametrize("where", ["before-headers", "mid-stream"])
def test_asyncio_wait_for_cancels_the_call_and_closes_its_connection(fake: CanonicalFake,
                                                                     where: str) -> None:
    adapter = CanonicalAdapter("echo", base_url=fake.base_url, max_retries=0)
    if where == "before-headers":
        fake.push(Stall(3.0))
    else:
        fake.push(Turn(text="abcdefgh", chunk=2, stall_after=2, stall=3.0))

    # long enough for the request to reach the server on a busy machine: cancelled before it is
    # sent, the call would leave the stall to the next request (and test nothing)
    timeout = 1.0

    async def main() -> float:
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(adapter.achat("x", stream=True), timeout=timeout)
        waited = time.monotonic() - started
        assert len(fake.chat_requests) == 1  # the call under test was on the wire
        # the adapter is still usable on the same loop, and answers the next call
        assert (await adapter.achat("after", stream=True)).text == "echo: after"
        return waited

    assert asyncio.run(main()) < timeout + CANCEL_BUDGET
    assert closed_by_client(fake)
    adapter.close()


def test_asyncio_timeout_around_a_stream_keeps_what_arrived(fake: CanonicalFake) -> None:
    adapter = CanonicalAdapter("echo", base_url=fake.base_url, max_retries=0)
    fake.push(Turn(text="abcdefgh", chunk=2, stall_after=2, stall=3.0))
    seen: list[str] = []

    async def consume(stream: Any) -> None:
        async with stream:
            async for delta in stream:
                seen.append(delta.text or "")

    async def within(seconds: float, stream: Any) -> None:
        if sys.version_info >= (3, 11):  # the task itself is cancelled
            async with asyncio.timeout(seconds):
                await consume(stream)
        else:
            await asyncio.wait_for(consume(stream), seconds)

    async def main() -> Any:
        stream = adapter.astream("x")
        with pytest.raises(TimeoutError):
            await within(0.3, stream)
        return stream

    stream = asyncio.run(main())
    assert "".join(seen) == "abcd" and stream.partial.text == "abcd"
    assert closed_by_client(fake)
    adapter.close()


# -- text_stream ---------------------------------------------------------------------------------


def test_text_stream_yields_only_the_text_and_leaves_the_response(fake: CanonicalFake) -> None:
    from ..fakes.provider import ToolCall

    fake.push(Turn(text="Grüße aus Köln!", chunk=3, thinking="hmm", signature="sig",
                   tool_calls=[ToolCall("c1", "look", {"q": "x"})]))
    adapter = CanonicalAdapter("echo", base_url=fake.base_url, max_retries=0)
    with adapter.stream("hi") as stream:
        pieces = list(stream.text_stream)
    assert pieces == ["Grü", "ße ", "aus", " Kö", "ln!"]
    assert stream.response.text == "Grüße aus Köln!"
    assert [b.type for b in stream.response.content] == ["thinking", "text", "tool_use"]
    assert stream.response.tool_calls[0].arguments == {"q": "x"}
    adapter.close()


def test_leaving_text_stream_early_closes_the_connection(fake: CanonicalFake) -> None:
    # one chunk, then nothing until the client hangs up: what arrived is exactly what was read
    # (a busy machine could otherwise deliver a second chunk before the loop breaks)
    fake.push(Turn(text="y" * 400, chunk=4, stall_after=1, stall=10.0))
    adapter = CanonicalAdapter("echo", base_url=fake.base_url, max_retries=0)
    with adapter.stream("hi") as stream:
        for piece in stream.text_stream:
            if piece:
                break
    assert closed_by_client(fake)
    with pytest.raises(RequestCancelled) as info:
        stream.response  # noqa: B018
    assert info.value.code == "cancelled"
    assert info.value.partial is not None and info.value.partial.text == "yyyy"
    assert adapter.chat("next").text == "echo: next"
    adapter.close()


def test_text_stream_raises_the_error_with_what_arrived() -> None:
    with LoopbackServer(_no_done) as server:
        adapter = CanonicalAdapter("echo", base_url=server.url, max_retries=0)
        pieces: list[str] = []

        def read() -> None:
            with adapter.stream("hi") as stream:
                pieces.extend(stream.text_stream)

        with pytest.raises(APIConnectionError) as info:
            read()
        adapter.close()
    assert info.value.code == "network_error"
    assert pieces == ["Hello", ", wor"] and info.value.partial.text == "Hello, wor"  # type: ignore[union-attr]


# -- a cancel callback that raises ----------------------------------------------------------------


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_cancel_callback_that_raises_does_not_stop_the_cancel(
    fake: CanonicalFake, mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    fake.push(Turn(text="abcdefghijkl", chunk=2, stall_after=3, stall=2.0))
    adapter = CanonicalAdapter("echo", base_url=fake.base_url, max_retries=0)
    token, streaming, at = CancelToken(), threading.Event(), []
    after: list[str] = []

    def broken() -> None:
        raise RuntimeError("a broken cancel callback")

    token.add_callback(broken)  # registered before the call's own: it runs first
    token.add_callback(lambda: after.append("ran"))
    thread = cancel_when(token, streaming, 0.15, at)

    def run() -> Any:
        if mode == "sync":
            return adapter.chat("x", stream=True, cancel=token, on_delta=lambda d: streaming.set())
        return asyncio.run(adapter.achat("x", stream=True, cancel=token,
                                         on_delta=lambda d: streaming.set()))

    with caplog.at_level(logging.WARNING, logger="dispatch_nb"), \
            pytest.raises(RequestCancelled) as info:
        run()
    reacted = time.monotonic() - at[0]
    thread.join()
    assert info.value.code == "cancelled"
    assert reacted < CANCEL_BUDGET, reacted
    assert after == ["ran"]
    assert closed_by_client(fake)
    # the broken callback is reported (with its traceback), not silently swallowed
    [report] = [r for r in caplog.records if "cancel callback" in r.getMessage()]
    assert report.exc_info is not None and "a broken cancel callback" in str(report.exc_info[1])
    adapter.close()


# -- a server that closes idle keep-alive connections ---------------------------------------------


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_connection_the_server_closed_while_idle_is_not_an_error(mode: str) -> None:
    # (a non-streamed answer, read to its end, leaves its connection in the pool for the next call)
    with CanonicalFake(idle_timeout=0.2) as fake:
        adapter = CanonicalAdapter("echo", base_url=fake.base_url, max_retries=0)

        async def both() -> list[str]:
            first = await adapter.achat("first")
            await asyncio.sleep(0.6)  # the server closes the idle connection meanwhile
            return [first.text, (await adapter.achat("second")).text]

        if mode == "sync":
            first = adapter.chat("first").text
            assert wait_for(lambda: fake.server.idle_closes == 1)
            texts = [first, adapter.chat("second").text]
        else:
            texts = asyncio.run(both())
        adapter.close()
        assert texts == ["echo: first", "echo: second"]
        assert fake.server.idle_closes == 1
        assert len(fake.chat_requests) == 2


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_server_that_closes_every_connection_after_its_answer(mode: str) -> None:
    # Keep-alive advertised, the connection closed right after each answer. A call that races the
    # close is retried (it never reached the server); no answer is lost, none is asked twice.
    with CanonicalFake(idle_timeout=0) as fake:
        adapter = CanonicalAdapter("echo", base_url=fake.base_url)
        adapter.retry_backoff = 0.01

        async def many() -> list[str]:
            return [(await adapter.achat(f"q{i}", stream=i % 2 == 0)).text for i in range(12)]

        if mode == "sync":
            texts = [adapter.chat(f"q{i}", stream=i % 2 == 0).text for i in range(12)]
        else:
            texts = asyncio.run(many())
        adapter.close()
        assert texts == [f"echo: q{i}" for i in range(12)]
        assert [fake.last_user_text(r) for r in fake.chat_requests] == [f"q{i}" for i in range(12)]
        assert fake.server.idle_closes >= 11


def test_non_streamed_answers_reuse_their_connection(fake: CanonicalFake) -> None:
    adapter = CanonicalAdapter("echo", base_url=fake.base_url, max_retries=0)
    for i in range(4):
        adapter.chat(f"q{i}", stream=False)

    async def four() -> None:
        for i in range(4):
            await adapter.achat(f"a{i}", stream=False)

    asyncio.run(four())
    adapter.close()
    assert fake.server.connections_made == 2  # one for the sync pool, one for the loop's


@pytest.fixture(params=["aiohttp", "httpx"])
def transport(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each transport dispatch_nb can use (``DISPATCH_NB_TRANSPORT``)."""
    monkeypatch.setenv("DISPATCH_NB_TRANSPORT", request.param)
    return str(request.param)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_streamed_answers_reuse_their_connection(
    fake: CanonicalFake, transport: str, mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A stream's terminal event comes just before the chunked body's closing bytes: reading stopped
    # at the event, the pool would drop the connection and every streamed call would pay a TCP
    # (and, to a real provider, TLS) handshake. Here the closing bytes come 50 ms after the event;
    # the wait for them is longer than its 0.25 s here: on a busy machine the fake's thread can be
    # late by more than that
    monkeypatch.setattr(http_adapter, "RELEASE_SECONDS", 5.0)
    for i in range(4):
        fake.push(Turn(text=f"answer {i}", stall_after=10**6, stall=0.05))
    adapter = CanonicalAdapter("echo", base_url=fake.base_url, max_retries=0)

    async def four() -> list[str]:
        return [(await adapter.achat(f"q{i}", stream=True)).text for i in range(4)]

    if mode == "sync":
        texts = [adapter.chat(f"q{i}", stream=True).text for i in range(4)]
    else:
        texts = asyncio.run(four())
    adapter.close()
    assert texts == [f"answer {i}" for i in range(4)]
    assert fake.server.connections_made == 1


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_stream_kept_open_after_its_terminal_event_does_not_hold_the_call(
    fake: CanonicalFake, transport: str, mode: str
) -> None:
    # The server sends every event, then keeps the body open: the answer is complete, so the call
    # returns at once (the connection, never finished, is dropped), and the next call still works.
    fake.push(Turn(text="complete", stall_after=10**6, stall=30))
    adapter = CanonicalAdapter("echo", base_url=fake.base_url, max_retries=0)

    async def two() -> list[str]:
        return [(await adapter.achat(q, stream=True)).text for q in ("first", "second")]

    started = time.monotonic()
    if mode == "sync":
        texts = [adapter.chat(q, stream=True).text for q in ("first", "second")]
    else:
        texts = asyncio.run(two())
    elapsed = time.monotonic() - started
    adapter.close()
    assert texts == ["complete", "echo: second"]
    assert elapsed < 5, f"the calls took {elapsed:.1f}s: the open stream held them"
    assert fake.server.connections_made == 2


def test_a_gateway_that_echoes_the_key_never_gets_it_into_any_error() -> None:
    """Not only chats: model lists and checks (validate(), %chat status), token counting and
    provider batch jobs read errors too. A gateway quoting the Authorization header it got, for
    any request, with a key no pattern knows (no digit, no sk- prefix)."""
    from dispatch_nb import AuthenticationError
    from dispatch_nb.providers.anthropic import AnthropicAdapter
    from dispatch_nb.providers.openai import OpenAIAdapter

    def echo(request: RecordedRequest) -> Reply:
        sent = request.header("authorization") or request.header("x-api-key")
        return Reply.json({"error": {"message": f"bad credentials; you sent {sent}",
                                     "type": "authentication_error"}}, status=401)

    key = "mygatewaykeyabcdef"
    with LoopbackServer(echo) as server:
        url = f"http://127.0.0.1:{server.port}/v1"
        compatible = OpenAIAdapter("llama3", backend="compatible", base_url=url, api_key=key,
                                   max_retries=0)
        anthropic = AnthropicAdapter("claude-sonnet-4-5", base_url=url, api_key=key,
                                     max_retries=0)
        try:
            calls = [compatible.list_models, lambda: compatible.chat("hi"),
                     anthropic.list_models, lambda: anthropic.count_tokens("hi")]
            for call in calls:
                with pytest.raises(AuthenticationError) as info:
                    call()
                error = info.value
                assert error.code == "authentication_failed"
                shown = " ".join([error.message, str(error), repr(error), *map(str, error.args)])
                assert "you sent" in shown and key not in shown, shown
            checked = compatible.validate()
            assert not checked.ok and key not in str(checked), checked
        finally:
            compatible.close()
            anthropic.close()

