"""HTTP transports: httpx's API over aiohttp's C HTTP parser, or over httpx's own.

Every HTTP client of a chat comes from :func:`async_client`: :class:`AiohttpTransport` by default
where aiohttp is installed, ``httpx.AsyncHTTPTransport`` with ``DISPATCH_NB_TRANSPORT=httpx`` or
when the environment names a proxy; one client per event loop (:class:`LoopClients`).
docs/architecture.md (I/O) says more.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib
import importlib.util
import logging
import os
import ssl
import threading
import weakref
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, NoReturn
from urllib.request import getproxies

import httpx

if TYPE_CHECKING:
    import aiohttp

__all__ = [
    "READ_EXTENSION",
    "TRANSPORT_ENV",
    "AiohttpTransport",
    "LoopClients",
    "async_client",
    "prepare_async_transport",
    "tls_context",
    "transport_name",
]

logger = logging.getLogger("dispatch_nb")

TRANSPORT_ENV = "DISPATCH_NB_TRANSPORT"
TransportName = Literal["aiohttp", "httpx"]
#: the response extension of an aiohttp response that reads its raw body (module doc)
READ_EXTENSION = "dispatch_nb.read"

#: the most bytes one read of :data:`READ_EXTENSION` returns (what a slow reader finds buffered is
#: parsed in pieces of this size, not all at once)
READ_SIZE = 1 << 16

#: connection limits of every client: the openai SDK's (httpx's default of 100 connections would
#: cap a batch's concurrency; aiohttp has no limit on idle connections, httpx keeps 100)
DEFAULT_LIMITS = httpx.Limits(max_connections=1000, max_keepalive_connections=100)


# -- which transport ------------------------------------------------------------------------------
@functools.cache
def _have_aiohttp() -> bool:
    try:
        return importlib.util.find_spec("aiohttp") is not None
    except (ImportError, ValueError):  # e.g. blocked in sys.modules
        return False


@functools.cache  # once per process
def _warn_missing() -> None:
    logger.warning("%s=aiohttp, but aiohttp is not installed: using httpx (pip install aiohttp)",
                   TRANSPORT_ENV)


def transport_name() -> TransportName:
    """The transport new clients use: ``DISPATCH_NB_TRANSPORT`` (``aiohttp`` | ``httpx``), by
    default ``aiohttp`` where it is installed (else httpx, with a warning when it was asked for)."""
    value = os.environ.get(TRANSPORT_ENV, "").strip().lower()
    if value not in ("", "aiohttp", "httpx"):
        raise ValueError(
            f"{TRANSPORT_ENV} must be 'aiohttp' or 'httpx', not {value!r} "
            f"(unset it to use aiohttp where it is installed)"
        )
    if value == "httpx":
        return "httpx"
    if _have_aiohttp():
        return "aiohttp"
    if value == "aiohttp":
        _warn_missing()
    return "httpx"


#: the transports whose modules are imported (:func:`prepare_async_transport`)
_imported: set[str] = set()


async def prepare_async_transport() -> None:
    """Import the configured transport's modules on a worker thread, once per process: aiohttp
    takes 0.1–0.5 s to import, which would freeze the event loop (and the call's deadline). Not
    ``sys.modules``: it holds aiohttp from the moment a first call's import starts."""
    if "aiohttp" not in _imported and transport_name() == "aiohttp":
        await asyncio.to_thread(importlib.import_module, "aiohttp")
        _imported.add("aiohttp")


# -- the aiohttp transport ------------------------------------------------------------------------
def _reraise(exc: BaseException, reading: bool) -> NoReturn:
    """Raise the httpx exception httpx's own transport raises for the same failure (a dropped
    connection is a ``RemoteProtocolError``); anything else as it is."""
    import aiohttp

    original = exc.__cause__ if isinstance(exc, httpx.HTTPError) and exc.__cause__ else exc
    text = str(original) or type(original).__name__
    new: httpx.TransportError
    if isinstance(original, aiohttp.ServerTimeoutError):
        connecting = isinstance(original, getattr(aiohttp, "ConnectionTimeoutError", ()))
        new = httpx.ReadTimeout(text) if reading and not connecting else httpx.ConnectTimeout(text)
    elif isinstance(original, (aiohttp.ClientProxyConnectionError, aiohttp.ClientHttpProxyError)):
        new = httpx.ProxyError(text)
    elif isinstance(original, aiohttp.ClientConnectorError):
        # the reason alone: aiohttp's text names "ssl:default" even for an http:// URL
        reason = original.os_error
        new = httpx.ConnectError(os.strerror(reason.errno) if isinstance(reason, ConnectionRefusedError)
                                 and reason.errno else reason.strerror or str(reason) or text)
    elif isinstance(original, aiohttp.ServerDisconnectedError):
        new = httpx.RemoteProtocolError(
            "the server closed the connection " + ("mid-answer" if reading else "without answering")
        )
    elif isinstance(original, (aiohttp.ClientPayloadError, aiohttp.ClientResponseError)):
        new = httpx.RemoteProtocolError(text)
    elif isinstance(original, (aiohttp.ClientError, OSError)):
        new = httpx.ReadError(text) if reading else httpx.ConnectError(text)
    else:
        raise exc
    raise new from (exc.__cause__ if isinstance(exc, httpx.HTTPError) else exc)


class _AiohttpBody(httpx.AsyncByteStream):
    """An aiohttp response's body, with its errors translated."""

    __slots__ = ("_response",)

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self._response = response

    async def read(self) -> bytes:
        """The :data:`READ_EXTENSION`: the raw bytes that arrived since the last read (at most
        :data:`READ_SIZE`; waiting for some when none did); ``b""`` at the end of the body."""
        try:
            return await self._response.content.read(READ_SIZE)
        except Exception as exc:
            _reraise(exc, reading=True)

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._response.content.iter_any():
                yield chunk
        except Exception as exc:
            _reraise(exc, reading=True)

    async def aclose(self) -> None:
        self._response.release()  # a body read to its end keeps its connection; else it is dropped


class AiohttpTransport(httpx.AsyncBaseTransport):
    """An httpx transport that sends requests with aiohttp (which parses the answer in C). Its
    errors become httpx's; it keeps no cookies (httpx does) and decodes nothing (httpx does)."""

    def __init__(self, *, verify: ssl.SSLContext | None = None) -> None:
        self._ssl = verify if verify is not None else tls_context()
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            import aiohttp

            connector = aiohttp.TCPConnector(
                keepalive_timeout=DEFAULT_LIMITS.keepalive_expiry, ssl=self._ssl,
                limit=DEFAULT_LIMITS.max_connections or 0,
            )
            self._session = aiohttp.ClientSession(connector=connector,
                                                  cookie_jar=aiohttp.DummyCookieJar())
        return self._session

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        import aiohttp

        timeout = request.extensions.get("timeout", {})
        body = await request.aread()
        for attempt in (1, 2):
            try:
                response = await self._client().request(
                    request.method, str(request.url), headers=request.headers.multi_items(),
                    data=body or None, allow_redirects=False, auto_decompress=False, compress=None,
                    timeout=aiohttp.ClientTimeout(sock_connect=timeout.get("connect"),
                                                  sock_read=timeout.get("read"),
                                                  connect=timeout.get("pool")),
                )
                break
            except Exception as exc:
                # a kept-alive connection the server closed a moment ago, before the loop saw the
                # close: the request could not be written, so no server has it; it goes once more,
                # on a new connection (as httpcore does with a connection that is not available)
                if attempt == 1 and isinstance(exc, aiohttp.ClientOSError) \
                        and "Can not write request body" in str(exc):
                    continue
                _reraise(exc, reading=False)
        stream = _AiohttpBody(response)
        extensions: dict[str, Any] = {"http_version": b"HTTP/1.1", READ_EXTENSION: stream.read}
        if response.reason:
            extensions["reason_phrase"] = response.reason.encode()
        return httpx.Response(response.status, headers=response.raw_headers, stream=stream,
                              extensions=extensions)

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()


# -- clients --------------------------------------------------------------------------------------
def tls_context() -> ssl.SSLContext:
    """The TLS context every client verifies servers with (httpx's rules: ``SSL_CERT_FILE`` /
    ``SSL_CERT_DIR``, else certifi's bundle), made once per setting: loading a CA bundle takes
    tens of milliseconds, which every new client (every ``asyncio.run``) would otherwise pay."""
    return _tls_context(os.environ.get("SSL_CERT_FILE", ""), os.environ.get("SSL_CERT_DIR", ""))


@functools.cache
def _tls_context(cert_file: str, cert_dir: str) -> ssl.SSLContext:
    return httpx.create_ssl_context(trust_env=True)  # (it reads the two variables itself)


def _proxied() -> bool:
    """Whether the environment names a proxy (then httpx's own transport follows its rules)."""
    return any(getproxies().get(scheme) for scheme in ("http", "https", "all"))


def async_client(timeout: httpx.Timeout) -> httpx.AsyncClient:
    """A new async client on the configured transport, for the running event loop."""
    tls = tls_context()
    if transport_name() == "aiohttp" and not _proxied():
        return httpx.AsyncClient(timeout=timeout, transport=AiohttpTransport(verify=tls))
    # httpx reads the proxy environment (trust_env)
    return httpx.AsyncClient(timeout=timeout, verify=tls, limits=DEFAULT_LIMITS)


class LoopClients:
    """One async client per running event loop (``get()``, made by ``make()`` on first use).

    When the loop shuts down (``asyncio.run`` ending), the client is closed and forgotten: a
    finalizer rides on an async generator the loop knows about. When the owner is dropped first,
    its clients are closed on their loops; until then a module-level finalizer keeps them
    reachable, so the garbage collector never finds an open aiohttp session."""

    def __init__(self, make: Callable[[], httpx.AsyncClient]) -> None:
        self._make = make
        self._lock = threading.Lock()
        self._clients: dict[asyncio.AbstractEventLoop, _LoopEntry] = {}

    def get(self) -> httpx.AsyncClient:
        """The running loop's client."""
        loop = asyncio.get_running_loop()
        entry = self._clients.get(loop)
        if entry is None:
            client = self._make()
            entry = _LoopEntry(client, weakref.finalize(self, _close_on_loop, loop, client))
            entry.closer = _closer(self._lock, self._clients, loop, entry)
            step: Any = entry.closer.__anext__()  # the first step registers it with the loop...
            with contextlib.suppress(StopIteration):
                step.send(None)  # ...and runs to its ``yield`` without awaiting anything
            with self._lock:
                self._clients[loop] = entry
            return client
        return entry.client

    async def aclose(self) -> None:
        """Close the running loop's client (a new one is made if the adapter is used again)."""
        loop = asyncio.get_running_loop()
        with self._lock:
            entry = self._clients.pop(loop, None)
        if entry is not None:
            entry.dropped.detach()
            if entry.closer is not None:
                await entry.closer.aclose()
            await entry.client.aclose()


@dataclass(slots=True)
class _LoopEntry:
    """A loop's client and what closes it: a finalizer (its owner dropped) and an async
    generator (the loop shuts down)."""

    client: httpx.AsyncClient
    dropped: weakref.finalize[Any, Any]
    closer: AsyncGenerator[None, None] | None = None


async def _closer(
    lock: threading.Lock,
    clients: dict[asyncio.AbstractEventLoop, _LoopEntry],
    loop: asyncio.AbstractEventLoop,
    entry: _LoopEntry,
) -> AsyncGenerator[None, None]:
    # (a function, not a method: a reference to the LoopClients would keep it in a cycle)
    try:
        yield
    finally:
        with lock:
            if clients.get(loop) is entry:
                del clients[loop]
        entry.dropped.detach()
        await entry.client.aclose()


_closing: set[asyncio.Task[None]] = set()


def _close_on_loop(loop: asyncio.AbstractEventLoop, client: httpx.AsyncClient) -> None:
    """The owner of ``client`` is gone: close it on its loop (if that loop still runs)."""

    def start() -> None:
        task = loop.create_task(client.aclose())
        _closing.add(task)
        task.add_done_callback(_closing.discard)

    if not loop.is_closed():
        with contextlib.suppress(RuntimeError):  # closed meanwhile
            loop.call_soon_threadsafe(start)
