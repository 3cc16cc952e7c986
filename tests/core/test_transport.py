"""The HTTP transports: aiohttp by default, httpx on request or when aiohttp is missing.

Each behaviour is checked on both transports, sync and async, against real loopback servers:
proxies from the environment, TLS with ``SSL_CERT_FILE``, one pool per event loop closed when the
loop ends, content-encoding decoded by httpx, and that ``import dispatch_nb`` loads neither
aiohttp nor httpx. The fault behaviours (deadlines, cancel, Ctrl-C, dropped connections) are the
fault suites, which CI runs once more with ``DISPATCH_NB_TRANSPORT=httpx``.
"""

from __future__ import annotations

import asyncio
import gc
import gzip
import json
import logging
import os
import socket
import ssl
import subprocess
import sys
import textwrap
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from dispatch_nb import APIConnectionError
from dispatch_nb.providers.fake import CanonicalAdapter
from dispatch_nb.transport import (
    READ_EXTENSION,
    TRANSPORT_ENV,
    AiohttpTransport,
    async_client,
    transport_name,
)

from ..fakes.canonical import CanonicalFake
from ..fakes.server import LoopbackServer, Reply, wait_for

REPO = Path(__file__).resolve().parents[2]
PROXY_VARS = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY")


@pytest.fixture(autouse=True)
def no_proxy_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in PROXY_VARS:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)


@pytest.fixture(params=["aiohttp", "httpx"])
def transport(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv(TRANSPORT_ENV, request.param)
    return str(request.param)


def answer(adapter: CanonicalAdapter, mode: str, prompt: str = "hello") -> str:
    """The streamed answer's text, through the sync or the async API."""
    if mode == "sync":
        with adapter.stream(prompt) as stream:
            return "".join(d.text or "" for d in stream)

    async def main() -> str:
        async with adapter.astream(prompt) as stream:
            return "".join([d.text or "" async for d in stream])

    return asyncio.run(main())


# -- which transport -----------------------------------------------------------------------------
def run_python(code: str, **env: str) -> str:
    """Run ``code`` in a fresh interpreter with this checkout first on the path; its stdout."""
    environ = {k: v for k, v in os.environ.items() if k != TRANSPORT_ENV}
    environ.update(env, PYTHONPATH=os.pathsep.join([str(REPO), environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=environ,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


CALL_AND_REPORT = """
    import sys
    {prelude}
    from dispatch_nb.providers.fake import CanonicalAdapter
    from tests.fakes.canonical import CanonicalFake
    with CanonicalFake() as fake:
        adapter = CanonicalAdapter("echo", base_url=fake.base_url, max_retries=0)
        text = adapter.chat("hi", stream=True).text
        adapter.close()
    from dispatch_nb.transport import transport_name
    print(text, transport_name(), "aiohttp" in sys.modules)
"""


def test_import_dispatch_nb_loads_neither_aiohttp_nor_httpx() -> None:
    out = run_python("""
        import sys, dispatch_nb
        print(sorted(m for m in ("aiohttp", "httpx", "httpx_aiohttp") if m in sys.modules))
    """)
    assert out == "[]"


@pytest.mark.parametrize(
    ("env", "expected"),
    [({}, "echo: hi aiohttp True"), ({TRANSPORT_ENV: "aiohttp"}, "echo: hi aiohttp True"),
     ({TRANSPORT_ENV: "httpx"}, "echo: hi httpx False")],
    ids=["default", "aiohttp", "httpx"],
)
def test_aiohttp_is_the_default_and_the_switch_falls_back(env: dict[str, str],
                                                           expected: str) -> None:
    assert run_python(CALL_AND_REPORT.format(prelude=""), **env) == expected


def test_without_aiohttp_calls_use_httpx() -> None:
    block_aiohttp = """
    import importlib.abc
    class NoAiohttp(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("aiohttp", "httpx_aiohttp"):
                raise ModuleNotFoundError(f"No module named {name!r}")
            return None
    sys.meta_path.insert(0, NoAiohttp())
    """
    out = run_python(CALL_AND_REPORT.format(prelude=block_aiohttp))
    assert out == "echo: hi httpx False"
    # asking for aiohttp explicitly on such a machine warns and still works
    out = run_python(CALL_AND_REPORT.format(prelude=block_aiohttp), **{TRANSPORT_ENV: "aiohttp"})
    assert out == "echo: hi httpx False"


def test_an_unknown_transport_is_a_clear_error(fake: CanonicalFake,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TRANSPORT_ENV, "curl")
    adapter = CanonicalAdapter("echo", base_url=fake.base_url, max_retries=0)
    with pytest.raises(ValueError, match=r"DISPATCH_NB_TRANSPORT must be 'aiohttp' or 'httpx', "
                                         r"not 'curl'"):
        adapter.chat("hi")


def test_clients_use_the_chosen_transport(transport: str) -> None:
    assert transport_name() == transport
    client = async_client(httpx.Timeout(5))
    used = client._transport  # httpx keeps no public handle on it
    assert isinstance(used, AiohttpTransport if transport == "aiohttp"
                      else httpx.AsyncHTTPTransport)


# -- proxies -------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_requests_go_through_the_proxy_from_the_environment(
    transport: str, mode: str, fake: CanonicalFake, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The fake serves absolute-form requests as a forward proxy would after forwarding them: the
    # answer can only come back through it (the host below does not resolve).
    monkeypatch.setenv("HTTP_PROXY", fake.base_url)
    adapter = CanonicalAdapter("echo", base_url="http://llm.invalid", max_retries=0)
    assert answer(adapter, mode) == "echo: hello"
    assert fake.chat_requests[-1].header("host") == "llm.invalid"
    adapter.close()


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_no_proxy_hosts_are_reached_directly(
    transport: str, mode: str, fake: CanonicalFake, monkeypatch: pytest.MonkeyPatch
) -> None:
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        dead = closed.getsockname()[1]  # nothing listens here once closed
    monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{dead}")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    adapter = CanonicalAdapter("echo", base_url=fake.base_url, max_retries=0)
    assert answer(adapter, mode) == "echo: hello"
    adapter.close()
    monkeypatch.delenv("NO_PROXY")  # and without the exception, the dead proxy is used
    adapter = CanonicalAdapter("echo", base_url=fake.base_url, max_retries=0)
    with pytest.raises(APIConnectionError) as info:
        answer(adapter, mode)
    assert info.value.code == "network_error"
    adapter.close()


# -- TLS -----------------------------------------------------------------------------------------
@pytest.fixture
def tls_fake(tmp_path: Path) -> Iterator[tuple[CanonicalFake, Path]]:
    """The canonical fake over HTTPS, with a certificate from a throw-away CA (its PEM path)."""
    trustme = pytest.importorskip("trustme")
    ca = trustme.CA()
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1", "localhost").configure_cert(server_ctx)
    ca_pem = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_pem))
    fake = CanonicalFake()
    httpd = fake.server._server  # wrap the listening socket before it serves
    httpd.socket = server_ctx.wrap_socket(httpd.socket, server_side=True)
    with fake:
        yield fake, ca_pem


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_tls_is_verified_against_ssl_cert_file(
    transport: str, mode: str, tls_fake: tuple[CanonicalFake, Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake, ca_pem = tls_fake
    base_url = f"https://127.0.0.1:{fake.server.port}"
    monkeypatch.setenv("SSL_CERT_FILE", str(ca_pem))
    adapter = CanonicalAdapter("echo", base_url=base_url, max_retries=0)
    assert answer(adapter, mode) == "echo: hello"
    adapter.close()
    monkeypatch.delenv("SSL_CERT_FILE")
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    untrusting = CanonicalAdapter("echo", base_url=base_url, max_retries=0)
    with pytest.raises(APIConnectionError, match=r"(?i)certificate") as info:
        answer(untrusting, mode)
    assert info.value.code == "network_error"
    untrusting.close()


def test_the_tls_context_is_made_once_per_ca_setting(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from dispatch_nb.transport import tls_context

    first = tls_context()
    assert tls_context() is first  # loading a CA bundle is slow: not once per event loop
    trustme = pytest.importorskip("trustme")
    pem = tmp_path / "ca.pem"
    trustme.CA().cert_pem.write_to_path(str(pem))
    monkeypatch.setenv("SSL_CERT_FILE", str(pem))
    assert tls_context() is not first


# -- pools ---------------------------------------------------------------------------------------
def test_one_pool_per_event_loop_closed_when_the_loop_ends(
    transport: str, fake: CanonicalFake, caplog: pytest.LogCaptureFixture
) -> None:
    adapter = CanonicalAdapter("echo", base_url=fake.base_url, max_retries=0)

    async def two_calls(tag: str) -> int:
        first = await adapter.achat(f"{tag} 1", stream=True)
        second = await adapter.achat(f"{tag} 2")
        assert (first.text, second.text) == (f"echo: {tag} 1", f"echo: {tag} 2")
        return fake.server.open_connections

    with caplog.at_level(logging.ERROR):
        assert asyncio.run(two_calls("a")) == 1  # both calls on one kept-alive connection
        assert wait_for(lambda: fake.server.open_connections == 0, timeout=3)  # loop ended
        assert asyncio.run(two_calls("b")) == 1  # a new loop gets a new pool
        assert wait_for(lambda: fake.server.open_connections == 0, timeout=3)
        gc.collect()
    assert not [r for r in caplog.records if "Unclosed" in r.getMessage()]


def test_aclose_closes_this_loops_pool_and_the_adapter_stays_usable(
    transport: str, fake: CanonicalFake
) -> None:
    adapter = CanonicalAdapter("echo", base_url=fake.base_url, max_retries=0)

    async def main() -> str:
        await adapter.achat("one")
        await adapter.aclose()
        assert wait_for(lambda: fake.server.open_connections == 0, timeout=3)
        return (await adapter.achat("two")).text

    assert asyncio.run(main()) == "echo: two"


def test_sync_pool_is_reused_and_closed(transport: str, fake: CanonicalFake) -> None:
    adapter = CanonicalAdapter("echo", base_url=fake.base_url, max_retries=0)
    assert [adapter.chat(p, stream=s).text for p, s in [("x", True), ("y", False)]] == [
        "echo: x", "echo: y"]
    assert fake.server.open_connections == 1
    adapter.close()
    assert wait_for(lambda: fake.server.open_connections == 0, timeout=3)
    assert adapter.chat("z").text == "echo: z"  # a new pool on demand
    adapter.close()


def test_a_forgotten_sync_adapter_releases_its_connections(transport: str,
                                                           fake: CanonicalFake) -> None:
    adapter = CanonicalAdapter("echo", base_url=fake.base_url, max_retries=0)
    assert adapter.chat("x").text == "echo: x"
    del adapter
    gc.collect()
    assert wait_for(lambda: fake.server.open_connections == 0, timeout=3)


def test_a_forgotten_async_adapter_on_a_living_loop_closes_its_pool_on_that_loop(
    transport: str, fake: CanonicalFake, caplog: pytest.LogCaptureFixture
) -> None:
    # A notebook's loop runs for the whole session; re-running `a = connect(...)` drops the old
    # adapter. Its pool is closed on that loop — not found open by the garbage collector, which
    # makes aiohttp print "Unclosed client session" into the notebook.
    loop = asyncio.new_event_loop()
    try:
        with caplog.at_level(logging.ERROR):
            adapter = CanonicalAdapter("echo", base_url=fake.base_url, max_retries=0)
            assert loop.run_until_complete(adapter.achat("x", stream=True)).text == "echo: x"
            assert fake.server.open_connections == 1
            del adapter
            gc.collect()
            loop.run_until_complete(asyncio.sleep(0.05))  # the loop goes on: the close runs
            assert wait_for(lambda: fake.server.open_connections == 0, timeout=3)
            gc.collect()
        assert not [r for r in caplog.records if "Unclosed" in r.getMessage()]
    finally:
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()


# -- content-encoding ----------------------------------------------------------------------------
EVENTS = [f"data: {json.dumps({'type': 'text', 'text': f'part {i} '})}\n\n".encode()
          for i in range(50)]


def compressed(encoding: str) -> list[bytes]:
    """The events compressed as one stream, cut into small chunks."""
    data = b"".join(EVENTS)
    body = gzip.compress(data) if encoding == "gzip" else zlib.compress(data)
    return [body[i : i + 37] for i in range(0, len(body), 37)]


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_content_encoding_is_left_to_httpx(transport: str, encoding: str) -> None:
    chunks = compressed(encoding)
    reply = Reply.sse(chunks, headers={"content-encoding": encoding})
    with LoopbackServer(lambda request: reply) as server:

        async def main() -> tuple[bytes, bytes]:
            async with async_client(httpx.Timeout(5)) as client:
                async with client.stream("GET", server.url) as r:
                    decoded = b"".join([c async for c in r.aiter_bytes()])
                async with client.stream("GET", server.url) as r:
                    raw = b"".join([c async for c in r.aiter_raw()])
            return decoded, raw

        assert asyncio.run(main()) == (b"".join(EVENTS), b"".join(chunks))


def test_an_aiohttp_body_reads_directly_as_aiter_raw_would(monkeypatch: pytest.MonkeyPatch) -> None:
    """The :data:`READ_EXTENSION` of an async aiohttp response reads the same bytes as
    ``aiter_raw`` (``b""`` at the end), and a connection cut mid-body raises the same error."""
    monkeypatch.setenv(TRANSPORT_ENV, "aiohttp")
    whole = Reply.sse(EVENTS, delay=0.001)
    cut = Reply.sse(EVENTS, delay=0.001, reset_after=5)

    async def read_all(client: httpx.AsyncClient, url: str, direct: bool) -> bytes | str:
        async with client.stream("GET", url) as r:
            try:
                if not direct:
                    return b"".join([c async for c in r.aiter_raw()])
                read = r.extensions[READ_EXTENSION]
                parts = []
                while chunk := await read():
                    parts.append(chunk)
                assert await read() == b""  # and stays at the end
                return b"".join(parts)
            except httpx.HTTPError as exc:
                return type(exc).__name__

    async def main(url: str) -> list[bytes | str]:
        async with async_client(httpx.Timeout(5)) as client:
            return [await read_all(client, url + path, direct)
                    for path in ("/whole", "/cut") for direct in (True, False)]

    with LoopbackServer(lambda request: cut if request.path == "/cut" else whole) as server:
        got = asyncio.run(main(server.url))
    assert got[0] == got[1] == b"".join(EVENTS)
    assert got[2] == got[3] == "RemoteProtocolError"


# -- sync calls over the event-loop thread --------------------------------------------------------
def test_a_long_stream_arrives_whole_and_in_order(transport: str) -> None:
    pieces = [f"data: {json.dumps({'type': 'text', 'text': f'{i:06d}'})}\n\n".encode()
              for i in range(20_000)]
    done = b'data: {"type": "done", "stop_reason": "end_turn"}\n\n'
    reply = Reply.sse([b"".join(pieces[i : i + 7]) for i in range(0, len(pieces), 7)] + [done])
    with LoopbackServer(lambda request: reply) as server:
        adapter = CanonicalAdapter("echo", base_url=server.url, max_retries=0)
        text = answer(adapter, "sync")
        assert text == "".join(f"{i:06d}" for i in range(20_000))
        assert answer(adapter, "async") == text
        adapter.close()


def test_a_request_body_is_sent_whole(transport: str) -> None:
    seen: list[Any] = []

    def handler(request: Any) -> Reply:
        seen.append(request.json)
        return Reply.json({"ok": True})

    payload = {"text": "é" * 100_000}

    async def main(url: str) -> Any:
        async with async_client(httpx.Timeout(5)) as client:
            return (await client.post(url, json=payload)).json()

    with LoopbackServer(handler) as server:
        assert asyncio.run(main(server.url)) == {"ok": True}
    assert seen == [payload]


def test_a_forked_child_makes_its_own_http_thread() -> None:
    out = run_python("""
        import os
        from dispatch_nb.providers.fake import CanonicalAdapter
        from tests.fakes.canonical import CanonicalFake
        with CanonicalFake() as fake:
            adapter = CanonicalAdapter("echo", base_url=fake.base_url, max_retries=0, timeout=20)
            print(adapter.chat("parent").text, flush=True)
            pid = os.fork()  # the parent's HTTP thread does not exist in the child
            if pid == 0:
                try:
                    print(adapter.chat("child").text, flush=True)
                finally:
                    os._exit(0)
            os.waitpid(pid, 0)
            adapter.close()
    """)
    assert out.splitlines() == ["echo: parent", "echo: child"]
