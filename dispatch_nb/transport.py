"""HTTP transports: aiohttp's C HTTP parser under httpx's API, for async and sync calls alike.

Every ``httpx`` client dispatch_nb makes comes from :func:`sync_client` / :func:`async_client` here.
Which transport they use (``DISPATCH_NB_TRANSPORT``):

* ``aiohttp`` — the default wherever the ``aiohttp`` and ``httpx-aiohttp`` packages are installed.
  Async clients use :class:`AiohttpTransport` (httpx-aiohttp's transport: aiohttp parses HTTP in C,
  several times cheaper per streamed chunk than httpx's pure-Python h11). Sync clients use
  :class:`ThreadedTransport`: the same async transport, run on one private event-loop thread,
  handing the raw body over to the calling thread in batches (whatever arrived since the caller
  last looked), with backpressure.
* ``httpx`` — httpx's own transports (``DISPATCH_NB_TRANSPORT=httpx``, or when aiohttp is missing).
  Sync clients use :class:`AbortableHTTPTransport`: a transport of its own over httpcore's public
  connection pool, given a watching network backend (:meth:`AbortableHTTPTransport.make_pool`
  builds the pool; its size is the ``limits=`` argument).

Whichever it is, clients keep what httpx gives: proxies from the environment (``HTTP_PROXY``,
``HTTPS_PROXY``, ``ALL_PROXY``, ``NO_PROXY``), TLS verification with ``SSL_CERT_FILE`` /
``SSL_CERT_DIR``, connection pooling, and content-encoding left to httpx (``iter_bytes`` decodes
gzip/deflate/br; ``iter_raw`` hands the bytes as sent). Async clients are made one per event loop
(:class:`LoopClients`) and closed when that loop shuts down.

A blocked sync read cannot be interrupted by the thread doing it, so a request may carry the
:data:`ABORT_EXTENSION`: ``request.extensions[ABORT_EXTENSION] = register``, where
``register(hook) -> remove`` arranges for ``hook()`` to run, from any thread, when the call is
cancelled or its deadline passes (:meth:`CallControl.on_abort <dispatch_nb.call_control.CallControl.on_abort>`
is such a function). Both sync transports then stop the exchange at once — before the headers
arrive, while connecting, or in the middle of the body — and the blocked call raises an
``httpx.TransportError``. Async calls are stopped by cancelling their task.

An async response of :class:`AiohttpTransport` carries :data:`READ_EXTENSION`: ``await read()``
returns every raw byte of the body that arrived since the last call (waiting when none did), ``b""``
at its end, with the errors ``aiter_raw`` would raise. A streamed answer read this way costs one
coroutine per wake-up instead of a stack of async generators per chunk (httpx's ``aiter_raw``, its
bound stream, the transport's stream, aiohttp's chunk iterator) — at hundreds of concurrent streams,
a large share of the client's CPU.

A caller that stops reading a body early (a streamed answer ends at its terminal event, before the
chunked body's closing bytes) would make the pool drop the connection. A sync response of
:class:`ThreadedTransport` carries :data:`RELEASE_EXTENSION`: ``release(seconds)`` lets the loop
thread read the rest of the body, so that the connection goes back to the pool before the caller's
next request; the caller waits for that at most ``seconds`` (normally the closing bytes are already
there), then the exchange is cancelled and its connection dropped.

Nothing here is imported by ``import dispatch_nb``; aiohttp is imported when the first client of an
aiohttp transport is made.
"""

from __future__ import annotations

import asyncio
import atexit
import importlib.util
import ipaddress
import logging
import os
import socket
import ssl
import threading
import weakref
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, Literal, NoReturn
from urllib.request import getproxies

import httpcore
import httpx

if TYPE_CHECKING:
    import aiohttp

__all__ = [
    "ABORT_EXTENSION",
    "READ_EXTENSION",
    "RELEASE_EXTENSION",
    "TRANSPORT_ENV",
    "AbortableHTTPTransport",
    "AiohttpTransport",
    "LoopClients",
    "ThreadedTransport",
    "async_client",
    "environment_proxies",
    "prepare_async_transport",
    "sync_client",
    "tls_context",
    "transport_name",
]

logger = logging.getLogger("dispatch_nb")

TRANSPORT_ENV = "DISPATCH_NB_TRANSPORT"
TransportName = Literal["aiohttp", "httpx"]
#: the request extension through which a sync call aborts its exchange (see the module docstring)
ABORT_EXTENSION = "dispatch_nb.abort"
#: the response extension that reads the rest of an abandoned body in the background (module doc)
RELEASE_EXTENSION = "dispatch_nb.release"
#: the response extension of an async aiohttp response that reads its raw body (module doc)
READ_EXTENSION = "dispatch_nb.read"
#: bytes the loop thread may read ahead of a sync caller before it stops reading the socket
HIGH_WATER = 1 << 16
#: ...and resumes once the caller has taken the buffer below this
LOW_WATER = 1 << 14
#: at most this many bytes are handed to the caller at once (joined from what is buffered)
BATCH = 1 << 15

#: connection limits of every client: the openai SDK's (httpx's default of 100 connections would
#: cap a batch's concurrency; aiohttp has no limit on idle connections, httpx keeps 100)
DEFAULT_LIMITS = httpx.Limits(max_connections=1000, max_keepalive_connections=100)

AbortRegister = Callable[[Callable[[], None]], Callable[[], None]]


# -- which transport ------------------------------------------------------------------------------
_aiohttp_installed: bool | None = None


def _have_aiohttp() -> bool:
    global _aiohttp_installed
    if _aiohttp_installed is None:
        try:
            _aiohttp_installed = all(
                importlib.util.find_spec(name) is not None for name in ("aiohttp", "httpx_aiohttp")
            )
        except (ImportError, ValueError):  # e.g. blocked in sys.modules
            _aiohttp_installed = False
    return _aiohttp_installed


_warned_missing = False


def transport_name() -> TransportName:
    """The transport new clients use: ``DISPATCH_NB_TRANSPORT`` (``aiohttp`` | ``httpx``), by
    default ``aiohttp`` where it is installed. Asking for aiohttp where it is missing falls back to
    httpx with a warning; any other value is an error."""
    global _warned_missing
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
    if value == "aiohttp" and not _warned_missing:
        _warned_missing = True
        logger.warning(
            "%s=aiohttp, but aiohttp / httpx-aiohttp are not installed: using httpx "
            "(pip install aiohttp httpx-aiohttp)", TRANSPORT_ENV,
        )
    return "httpx"


_aiohttp_imported = False


def _import_aiohttp() -> None:
    global _aiohttp_imported
    import httpx_aiohttp  # noqa: F401  (and aiohttp)

    _aiohttp_imported = True


async def prepare_async_transport() -> None:
    """Import the configured transport's modules on a worker thread, once per process.

    aiohttp takes 0.1–0.5 s to import; done on the event loop by the first call it would freeze
    that loop, and with it the call's deadline and cancellation."""
    if not _aiohttp_imported and transport_name() == "aiohttp":
        await asyncio.to_thread(_import_aiohttp)


# -- proxies --------------------------------------------------------------------------------------
def environment_proxies() -> dict[str, str | None]:
    """httpx mount patterns for the proxies the environment asks for, following httpx's rules:
    ``{"https://": "http://proxy:3128", "all://*.internal": None, ...}`` (None: no proxy).

    ``HTTP_PROXY`` / ``HTTPS_PROXY`` / ``ALL_PROXY`` (either case) name the proxies; ``NO_PROXY``
    lists hosts (``*`` for all, ``.example.com`` or ``example.com`` for a domain and its
    subdomains, IP addresses, ``localhost``) reached directly."""
    info = getproxies()
    mounts: dict[str, str | None] = {}
    for scheme in ("http", "https", "all"):
        url = info.get(scheme)
        if url:
            mounts[f"{scheme}://"] = url if "://" in url else f"http://{url}"
    for host in (h.strip() for h in info.get("no", "").split(",")):
        if not host:
            continue
        if host == "*":
            return {}
        if "://" in host:
            mounts[host] = None
            continue
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            address = None
        if address is not None:
            mounts[f"all://[{host}]" if address.version == 6 else f"all://{host}"] = None
        elif host.lower() == "localhost":
            mounts[f"all://{host}"] = None
        else:
            mounts[f"all://*{host}"] = None
    return mounts


# -- the aiohttp transport ------------------------------------------------------------------------
def _translate(exc: BaseException, reading: bool) -> BaseException:
    """The httpx exception for an aiohttp failure (``exc`` may be httpx-aiohttp's own mapping of
    it, whose classes do not always fit: it calls a dropped connection a connect timeout)."""
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
        return exc
    return new


def _reraise(exc: BaseException, reading: bool) -> NoReturn:
    translated = _translate(exc, reading)
    if translated is exc:
        raise exc
    raise translated from (exc.__cause__ if isinstance(exc, httpx.HTTPError) else exc)


class _AiohttpBody(httpx.AsyncByteStream):
    """A response body read by aiohttp, with its errors translated."""

    __slots__ = ("_content", "_inner")

    def __init__(self, inner: httpx.AsyncByteStream) -> None:
        self._inner = inner
        response = getattr(inner, "_aiohttp_response", None)  # httpx-aiohttp's response stream
        self._content: aiohttp.StreamReader | None = getattr(response, "content", None)

    async def read(self) -> bytes:
        """Every raw byte that arrived since the last read (waiting for some when none did);
        ``b""`` at the end of the body. The :data:`READ_EXTENSION`."""
        assert self._content is not None
        try:
            return await self._content.readany()
        except Exception as exc:
            _reraise(exc, reading=True)

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._inner:
                yield chunk
        except Exception as exc:
            _reraise(exc, reading=True)

    async def aclose(self) -> None:
        try:
            await self._inner.aclose()
        except Exception:
            pass  # closing a broken connection


class AiohttpTransport(httpx.AsyncBaseTransport):
    """httpx-aiohttp's transport: aiohttp sends the request and parses the answer (in C).

    Keywords as httpx's own transports: ``verify`` (``SSL_CERT_FILE`` / ``SSL_CERT_DIR`` apply
    with ``trust_env``), ``cert``, ``limits``, ``proxy`` (http:// or https:// proxies). On top of
    httpx-aiohttp: aiohttp's errors become the httpx exception the same failure raises in httpx
    (a dropped connection is a ``RemoteProtocolError``, not a timeout); aiohttp keeps no cookies of
    its own (httpx does); content-encoding is left to httpx, as httpx-aiohttp does."""

    def __init__(
        self,
        *,
        verify: Any = True,
        cert: Any = None,
        trust_env: bool = True,
        limits: httpx.Limits = DEFAULT_LIMITS,
        proxy: httpx.Proxy | None = None,
    ) -> None:
        from httpx_aiohttp import AiohttpTransport as Base  # imports aiohttp

        self.limits = limits
        self._inner = Base(
            verify=verify, cert=cert, trust_env=trust_env, limits=limits, proxy=proxy,
            client=self._session,
        )

    def _session(self) -> aiohttp.ClientSession:
        import aiohttp

        limit = self.limits.max_connections
        connector = aiohttp.TCPConnector(
            keepalive_timeout=self.limits.keepalive_expiry,
            ssl=self._inner.ssl_context,
            limit=limit if limit is not None else 0,
        )
        return aiohttp.ClientSession(connector=connector, cookie_jar=aiohttp.DummyCookieJar())

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        try:
            response = await self._inner.handle_async_request(request)
        except Exception as exc:
            _reraise(exc, reading=False)
        body = _AiohttpBody(response.stream)  # type: ignore[arg-type]
        response.stream = body
        if body._content is not None:
            response.extensions[READ_EXTENSION] = body.read
        return response

    async def aclose(self) -> None:
        await self._inner.aclose()


# -- sync over async: a private event-loop thread -------------------------------------------------
class _LoopThread:
    """One event loop on a daemon thread, shared by every sync client of the process."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._run, name="dispatch_nb-http", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def run(self, coro: Any, timeout: float) -> Any:
        """Run a coroutine on the loop and wait for it (from another thread)."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self) -> None:
        if self.thread.is_alive():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(2)


_loop_thread: _LoopThread | None = None
_loop_thread_lock = threading.Lock()
_threaded_transports: weakref.WeakSet[ThreadedTransport] = weakref.WeakSet()


def _shared_loop() -> _LoopThread:
    global _loop_thread
    runner = _loop_thread
    if runner is None or runner.pid != os.getpid():  # none yet, or forked: threads do not survive
        with _loop_thread_lock:
            runner = _loop_thread
            if runner is None or runner.pid != os.getpid():
                runner = _loop_thread = _LoopThread()
    return runner


def loop_thread() -> asyncio.AbstractEventLoop:
    """The library's private event loop (started on first use; it runs on a daemon thread):
    long-lived async clients (MCP servers) live there, whichever thread or loop calls them."""
    return _shared_loop().loop


@atexit.register
def _close_at_exit() -> None:
    runner = _loop_thread
    if runner is None or runner.pid != os.getpid() or not runner.thread.is_alive():
        return
    for transport in list(_threaded_transports):
        try:
            transport.close()
        except Exception:
            pass
    runner.stop()


class _Exchange(httpx.SyncByteStream):
    """One request made on the loop thread, seen from the calling thread.

    The loop thread sends the request, then reads the body as it arrives into ``_chunks`` (at most
    :data:`HIGH_WATER` bytes ahead of the caller); the caller takes everything buffered at once.
    The caller blocks only when nothing is buffered, on an event that Ctrl-C interrupts."""

    def __init__(self, runner: _LoopThread) -> None:
        self._loop = runner.loop
        self._wake = threading.Event()
        self._sleeping = False  # the caller is (about to be) blocked on _wake
        self._chunks: deque[bytes] = deque()
        self._put = 0  # bytes buffered so far (written by the loop thread only)
        self._taken = 0  # ...and taken (written by the caller only)
        self._paused = False
        self._resume: asyncio.Event | None = None
        self._head: httpx.Response | None = None
        self._error: BaseException | None = None
        self._done = False
        self._aborted = False
        self._closed = False
        self._releasing = False  # the loop thread reads the rest of the body, dropping it
        self._ended: threading.Event | None = None  # set when a released body has been read
        self._task: asyncio.Task[None] | None = None
        self._remove_abort: Callable[[], None] | None = None

    # -- the calling thread ----------------------------------------------------------------------
    def open(self, inner: httpx.AsyncBaseTransport, request: httpx.Request) -> httpx.Response:
        register: AbortRegister | None = request.extensions.get(ABORT_EXTENSION)
        try:
            self._loop.call_soon_threadsafe(self._start, inner, request)
        except RuntimeError:  # the loop is gone (interpreter shutdown)
            raise httpx.ConnectError("dispatch_nb's HTTP thread has stopped") from None
        if register is not None:
            self._remove_abort = register(self.abort)
        try:
            while self._head is None and not self._done and not self._aborted:
                self._sleep(head=True)
        except BaseException:
            self.close()
            raise
        if self._aborted or self._head is None:
            self.close()
            if self._error is not None and not isinstance(self._error, asyncio.CancelledError):
                raise self._error
            raise httpx.ReadError("the request was aborted")
        head = self._head
        extensions = {**head.extensions, RELEASE_EXTENSION: self.release}
        return httpx.Response(
            head.status_code, headers=head.headers, stream=self, extensions=extensions
        )

    def _sleep(self, head: bool = False) -> None:
        """Block until the loop thread has news: the headers (``head``), body bytes, the end."""
        self._wake.clear()
        self._sleeping = True
        if self._chunks or self._done or self._aborted or (head and self._head is not None):
            self._sleeping = False  # it came meanwhile
            return
        self._wake.wait()
        self._sleeping = False

    def __iter__(self) -> Iterator[bytes]:
        chunks = self._chunks
        while True:
            if chunks:
                data = chunks.popleft()
                if chunks and len(data) < BATCH:
                    batch = [data]
                    size = len(data)
                    while chunks and size < BATCH:
                        data = chunks.popleft()
                        batch.append(data)
                        size += len(data)
                    data = b"".join(batch)
                self._taken += len(data)
                if self._paused and self._put - self._taken <= LOW_WATER:
                    self._paused = False
                    self._loop.call_soon_threadsafe(self._wake_reader)
                yield data
            elif self._aborted:
                raise httpx.ReadError("the request was aborted")
            elif self._done:
                error = self._error
                if error is None:
                    return
                if isinstance(error, asyncio.CancelledError):
                    raise httpx.ReadError("the request was aborted")
                raise error
            else:
                self._sleep()

    def abort(self) -> None:
        """Stop the exchange now (any thread): the blocked caller raises ``httpx.ReadError``."""
        self._aborted = True
        self._wake.set()
        self._cancel_soon()

    def release(self, seconds: float) -> None:
        """Let the loop thread read (and drop) the rest of the body, so that its connection goes
        back to the pool before the caller's next request; waits for that ``seconds`` at most,
        then the exchange is cancelled (its connection dropped)."""
        if self._done or self._aborted or self._closed:
            return
        ended = self._ended = threading.Event()
        self._releasing = True
        try:
            self._loop.call_soon_threadsafe(self._drain, seconds)
        except RuntimeError:
            self._releasing = False
            return
        if not self._done:
            ended.wait(seconds)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        remove, self._remove_abort = self._remove_abort, None
        if remove is not None:
            remove()
        if not self._done and not self._releasing:
            self._cancel_soon()

    def _cancel_soon(self) -> None:
        try:
            self._loop.call_soon_threadsafe(self._cancel)
        except RuntimeError:
            pass

    # -- the loop thread -------------------------------------------------------------------------
    def _start(self, inner: httpx.AsyncBaseTransport, request: httpx.Request) -> None:
        if self._aborted or self._closed:
            self._finish(None)
            return
        self._task = self._loop.create_task(self._run(inner, request))

    def _cancel(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()

    def _wake_reader(self) -> None:
        if self._resume is not None:
            self._resume.set()

    def _drain(self, seconds: float) -> None:
        self._chunks.clear()
        self._wake_reader()  # a paused reader goes on (it drops what it reads from now on)
        if not self._done:
            self._loop.call_later(seconds, self._cancel)

    async def _run(self, inner: httpx.AsyncBaseTransport, request: httpx.Request) -> None:
        response: httpx.Response | None = None
        error: BaseException | None = None
        try:
            response = await inner.handle_async_request(request)
            self._head = response
            self._wake.set()
            chunks = self._chunks
            assert isinstance(response.stream, httpx.AsyncByteStream)
            async for chunk in response.stream:
                if self._releasing:
                    continue  # the caller has what it wanted: read to the end, keep nothing
                chunks.append(chunk)
                self._put += len(chunk)
                if self._sleeping:
                    self._sleeping = False
                    self._wake.set()
                if self._put - self._taken > HIGH_WATER:
                    if self._resume is None:
                        self._resume = asyncio.Event()
                    self._resume.clear()
                    self._paused = True
                    if self._put - self._taken > LOW_WATER:  # not drained meanwhile
                        await self._resume.wait()
                    self._paused = False
        except BaseException as exc:  # handed to the caller (a cancel is the caller's own doing)
            error = exc
        finally:
            if not self._releasing:
                self._finish(error)  # wake the caller first...
            if response is not None:
                try:
                    await response.aclose()
                except BaseException:
                    pass
            if self._releasing:
                self._finish(error)  # ...or once the connection is back in the pool

    def _finish(self, error: BaseException | None) -> None:
        self._error = error
        self._done = True
        self._wake.set()
        if self._ended is not None:
            self._ended.set()


class ThreadedTransport(httpx.BaseTransport):
    """A sync transport that runs an async one on dispatch_nb's private event-loop thread.

    ``ThreadedTransport(lambda: AiohttpTransport())`` gives sync calls aiohttp's C parser. The
    body is read on the loop thread and handed over in batches; a caller blocked on it wakes at
    once on Ctrl-C (the main thread) or on an abort (:data:`ABORT_EXTENSION`, any thread)."""

    def __init__(self, make: Callable[[], httpx.AsyncBaseTransport]) -> None:
        self._make = make
        self._closed = False
        self._start()
        _threaded_transports.add(self)

    def _start(self) -> None:
        self._runner = _shared_loop()
        self._inner = self._make()
        # an unclosed client's connections are closed when it is garbage-collected (at exit,
        # _close_at_exit closes the live ones and waits: a close merely scheduled then would be
        # destroyed pending with the loop)
        self._finalizer = weakref.finalize(self, _close_soon, self._runner, self._inner)
        self._finalizer.atexit = False

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if self._closed:
            raise RuntimeError("this transport has been closed")
        if self._runner.pid != os.getpid():  # a forked child: the parent's thread is not here
            self._start()
        request.read()
        return _Exchange(self._runner).open(self._inner, request)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        _threaded_transports.discard(self)
        self._finalizer.detach()  # closed now: nothing left for the garbage collector to close
        if self._runner.thread.is_alive():
            try:
                self._runner.run(self._inner.aclose(), timeout=5)
            except Exception:
                pass


def _close_soon(runner: _LoopThread, inner: httpx.AsyncBaseTransport) -> None:
    if runner.thread.is_alive():
        try:
            asyncio.run_coroutine_threadsafe(inner.aclose(), runner.loop)
        except RuntimeError:
            pass


# -- httpx's own sync transport, abortable --------------------------------------------------------
def _shutdown(network_stream: Any) -> None:
    sock = network_stream.get_extra_info("socket") if network_stream is not None else None
    if isinstance(sock, socket.socket):
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


# httpx's sync transport cannot cancel a blocked read by itself: an abort must shut the socket down
# from another thread. New connections announce their socket through httpx's trace extension, but a
# connection reused from the pool does not, so this transport's network backend wraps every stream
# so that it tells the request writing on it (through this thread-local) which socket it uses.
_writer = threading.local()


class _WatchedStream(httpcore.NetworkStream):
    """A network stream that reports itself to the request writing on it (see ``_writer``)."""

    def __init__(self, inner: httpcore.NetworkStream) -> None:
        self._inner = inner

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._inner.read(max_bytes, timeout)

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        hook = getattr(_writer, "hook", None)
        if hook is not None:
            _writer.hook = None
            hook(self)
        self._inner.write(buffer, timeout)

    def close(self) -> None:
        self._inner.close()

    def start_tls(
        self,
        ssl_context: Any,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore.NetworkStream:
        return _WatchedStream(self._inner.start_tls(ssl_context, server_hostname, timeout))

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class _WatchedBackend(httpcore.NetworkBackend):
    """Wraps httpcore's network backend so every stream is a :class:`_WatchedStream`."""

    def __init__(self, inner: httpcore.NetworkBackend) -> None:
        self._inner = inner

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        return _WatchedStream(
            self._inner.connect_tcp(host, port, timeout, local_address, socket_options)
        )

    def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        return _WatchedStream(self._inner.connect_unix_socket(path, timeout, socket_options))

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


#: httpcore's exceptions as httpx's (what ``httpx.HTTPTransport`` raises for each); the most
#: specific match wins (``httpcore.ReadTimeout`` is an ``httpx.ReadTimeout``, not just a timeout)
_HTTPCORE_ERRORS: tuple[tuple[type[Exception], type[httpx.TransportError]], ...] = (
    (httpcore.TimeoutException, httpx.TimeoutException),
    (httpcore.ConnectTimeout, httpx.ConnectTimeout),
    (httpcore.ReadTimeout, httpx.ReadTimeout),
    (httpcore.WriteTimeout, httpx.WriteTimeout),
    (httpcore.PoolTimeout, httpx.PoolTimeout),
    (httpcore.NetworkError, httpx.NetworkError),
    (httpcore.ConnectError, httpx.ConnectError),
    (httpcore.ReadError, httpx.ReadError),
    (httpcore.WriteError, httpx.WriteError),
    (httpcore.ProxyError, httpx.ProxyError),
    (httpcore.UnsupportedProtocol, httpx.UnsupportedProtocol),
    (httpcore.ProtocolError, httpx.ProtocolError),
    (httpcore.LocalProtocolError, httpx.LocalProtocolError),
    (httpcore.RemoteProtocolError, httpx.RemoteProtocolError),
)


def _as_httpx_error(exc: Exception) -> Exception:
    """``exc`` (from httpcore) as the httpx exception ``httpx.HTTPTransport`` would raise."""
    mapped: type[httpx.TransportError] | None = None
    for source, target in _HTTPCORE_ERRORS:
        if isinstance(exc, source) and (mapped is None or issubclass(target, mapped)):
            mapped = target
    if mapped is None:
        return exc
    error = mapped(str(exc))
    error.__cause__ = exc
    return error


def _httpcore_url(url: httpx.URL) -> httpcore.URL:
    return httpcore.URL(scheme=url.raw_scheme, host=url.raw_host, port=url.port,
                        target=url.raw_path)


class _WatchedBody(httpx.SyncByteStream):
    """A response body read from httpcore: its errors become httpx's, and its abort hooks are
    removed when it is closed."""

    def __init__(self, inner: Iterable[bytes], removers: list[Callable[[], None]]) -> None:
        self._inner = inner
        self._removers = removers

    def __iter__(self) -> Iterator[bytes]:
        try:
            yield from self._inner
        except Exception as exc:
            error = _as_httpx_error(exc)
            if error is exc:
                raise
            raise error from exc

    def close(self) -> None:
        for remove in self._removers:
            remove()
        self._removers = []
        close = getattr(self._inner, "close", None)
        if close is not None:
            close()


class AbortableHTTPTransport(httpx.BaseTransport):
    """A sync transport on httpcore's connection pool (``httpx.HTTPTransport``'s keywords and
    errors), made abortable through :data:`ABORT_EXTENSION`: an abort shuts the request's socket
    down, whether it is connecting, waiting for the headers on a reused keep-alive connection, or
    reading the body.

    The pool (:attr:`pool`, made in :meth:`make_pool`) is httpcore's public ``ConnectionPool``
    (``HTTPProxy`` through an http(s) proxy) given a watching network backend through its
    ``network_backend=`` argument: every network stream tells the request writing on it which
    socket it uses. (httpcore's ``SOCKSProxy`` takes no network backend: through a SOCKS proxy an
    abort reaches new connections, through httpcore's trace, but not reused ones.)
    """

    def __init__(
        self,
        verify: ssl.SSLContext | str | bool = True,
        cert: Any = None,
        trust_env: bool = True,
        http1: bool = True,
        http2: bool = False,
        limits: httpx.Limits = DEFAULT_LIMITS,
        proxy: httpx.Proxy | str | httpx.URL | None = None,
        uds: str | None = None,
        local_address: str | None = None,
        retries: int = 0,
        socket_options: Iterable[Any] | None = None,
    ) -> None:
        self.limits = limits
        #: the httpcore connection pool every request of this transport goes through
        self.pool = self.make_pool(
            ssl_context=httpx.create_ssl_context(verify=verify, cert=cert, trust_env=trust_env),
            limits=limits,
            proxy=httpx.Proxy(url=proxy) if isinstance(proxy, (str, httpx.URL)) else proxy,
            http1=http1, http2=http2, uds=uds, local_address=local_address, retries=retries,
            socket_options=socket_options,
        )

    @staticmethod
    def make_pool(
        *,
        ssl_context: ssl.SSLContext,
        limits: httpx.Limits,
        proxy: httpx.Proxy | None = None,
        http1: bool = True,
        http2: bool = False,
        uds: str | None = None,
        local_address: str | None = None,
        retries: int = 0,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.ConnectionPool:
        """The connection pool (its size: ``limits``), as ``httpx.HTTPTransport`` makes it, on
        a watching network backend."""
        backend = _WatchedBackend(httpcore.SyncBackend())
        sizes: dict[str, Any] = {
            "max_connections": limits.max_connections,
            "max_keepalive_connections": limits.max_keepalive_connections,
            "keepalive_expiry": limits.keepalive_expiry,
        }
        if proxy is None:
            return httpcore.ConnectionPool(
                ssl_context=ssl_context, http1=http1, http2=http2, uds=uds,
                local_address=local_address, retries=retries, socket_options=socket_options,
                network_backend=backend, **sizes,
            )
        if proxy.url.scheme in ("http", "https"):
            return httpcore.HTTPProxy(
                proxy_url=_httpcore_url(proxy.url), proxy_auth=proxy.raw_auth,
                proxy_headers=proxy.headers.raw, ssl_context=ssl_context,
                proxy_ssl_context=proxy.ssl_context, http1=http1, http2=http2,
                socket_options=socket_options, network_backend=backend, **sizes,
            )
        if proxy.url.scheme in ("socks5", "socks5h"):
            if importlib.util.find_spec("socksio") is None:
                raise ImportError(
                    "Using a SOCKS proxy needs the 'socksio' package: pip install 'httpx[socks]'"
                )
            return httpcore.SOCKSProxy(
                proxy_url=_httpcore_url(proxy.url), proxy_auth=proxy.raw_auth,
                ssl_context=ssl_context, http1=http1, http2=http2, **sizes,
            )
        raise ValueError(
            "the proxy's scheme must be http, https, socks5 or socks5h, not "
            f"{proxy.url.scheme!r}"
        )

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        assert isinstance(request.stream, httpx.SyncByteStream)
        removers: list[Callable[[], None]] = []
        extensions = request.extensions
        register: AbortRegister | None = extensions.get(ABORT_EXTENSION)
        if register is not None:

            def watch(stream: Any) -> None:
                removers.append(register(lambda: _shutdown(stream)))

            user_trace = extensions.get("trace")

            def trace(name: str, info: dict[str, Any]) -> None:
                if name == "connection.connect_tcp.complete":
                    watch(info.get("return_value"))
                if user_trace is not None:
                    user_trace(name, info)

            extensions = {**extensions, "trace": trace}
            _writer.hook = watch
        core_request = httpcore.Request(
            method=request.method,
            url=_httpcore_url(request.url),
            headers=request.headers.raw,
            content=request.stream,
            extensions=extensions,
        )
        try:
            response = self.pool.handle_request(core_request)
        except Exception as exc:
            for remove in removers:
                remove()
            error = _as_httpx_error(exc)
            if error is exc:
                raise
            raise error from exc
        except BaseException:
            for remove in removers:
                remove()
            raise
        finally:
            _writer.hook = None
        assert isinstance(response.stream, Iterable)
        return httpx.Response(
            status_code=response.status,
            headers=response.headers,
            stream=_WatchedBody(response.stream, removers),
            extensions=response.extensions,
        )

    def close(self) -> None:
        self.pool.close()


# -- clients --------------------------------------------------------------------------------------
def _proxy_mounts(make: Callable[[httpx.Proxy], Any]) -> dict[str, Any]:
    return {
        pattern: None if url is None else make(httpx.Proxy(url))
        for pattern, url in environment_proxies().items()
    }


def _aiohttp_can_proxy(proxy: httpx.Proxy) -> bool:
    return proxy.url.scheme in ("http", "https")


_tls_lock = threading.Lock()
_tls_contexts: dict[tuple[str, str], ssl.SSLContext] = {}


def tls_context() -> ssl.SSLContext:
    """The TLS context every client verifies servers with: ``SSL_CERT_FILE`` / ``SSL_CERT_DIR``
    when set, else certifi's bundle (httpx's rules). Made once per setting and shared: loading a
    CA bundle takes tens of milliseconds, which every new client (one per event loop: every
    ``asyncio.run``) would otherwise pay."""
    key = (os.environ.get("SSL_CERT_FILE", ""), os.environ.get("SSL_CERT_DIR", ""))
    context = _tls_contexts.get(key)
    if context is None:
        with _tls_lock:
            context = _tls_contexts.get(key)
            if context is None:
                context = _tls_contexts[key] = httpx.create_ssl_context(trust_env=True)
    return context


def sync_client(timeout: httpx.Timeout) -> httpx.Client:
    """A new sync client on the configured transport (see the module docstring)."""
    tls = tls_context()
    if transport_name() == "aiohttp":

        def proxied(proxy: httpx.Proxy) -> httpx.BaseTransport:
            if not _aiohttp_can_proxy(proxy):  # e.g. socks5://: httpx's transport speaks it
                return AbortableHTTPTransport(verify=tls, proxy=proxy, limits=DEFAULT_LIMITS)
            return ThreadedTransport(lambda: AiohttpTransport(verify=tls, proxy=proxy))

        return httpx.Client(
            timeout=timeout,
            transport=ThreadedTransport(lambda: AiohttpTransport(verify=tls)),
            mounts=_proxy_mounts(proxied),
        )
    return httpx.Client(
        timeout=timeout,
        transport=AbortableHTTPTransport(verify=tls, limits=DEFAULT_LIMITS),
        mounts=_proxy_mounts(
            lambda proxy: AbortableHTTPTransport(verify=tls, proxy=proxy, limits=DEFAULT_LIMITS)
        ),
    )


def async_client(timeout: httpx.Timeout) -> httpx.AsyncClient:
    """A new async client on the configured transport, for the running event loop."""
    tls = tls_context()
    if transport_name() == "aiohttp":

        def proxied(proxy: httpx.Proxy) -> httpx.AsyncBaseTransport:
            if not _aiohttp_can_proxy(proxy):
                return httpx.AsyncHTTPTransport(verify=tls, proxy=proxy, limits=DEFAULT_LIMITS)
            return AiohttpTransport(verify=tls, proxy=proxy)

        return httpx.AsyncClient(
            timeout=timeout, transport=AiohttpTransport(verify=tls), mounts=_proxy_mounts(proxied)
        )
    # httpx reads the proxy environment
    return httpx.AsyncClient(timeout=timeout, verify=tls, limits=DEFAULT_LIMITS)


class LoopClients:
    """One async client per running event loop, closed when that loop shuts down.

    ``clients.get()`` returns the running loop's client, made by ``make()`` on first use. When the
    loop shuts down (``asyncio.run`` ending, or ``loop.shutdown_asyncgens()``), the client is
    closed and forgotten: a finalizer rides on an async generator the loop knows about. When the
    owner is dropped first (an adapter replaced in a notebook whose loop lives on), its clients are
    closed on their loops; until then they stay reachable from a module-level finalizer, so the
    garbage collector never finds an open aiohttp session ("Unclosed client session")."""

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
            try:
                step.send(None)  # ...and runs to its ``yield`` without awaiting anything
            except StopIteration:
                pass
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


class _LoopEntry:
    """A loop's client, the finalizer that closes it if its owner is dropped, and the async
    generator that closes it when the loop shuts down."""

    __slots__ = ("client", "closer", "dropped")

    def __init__(self, client: httpx.AsyncClient, dropped: weakref.finalize[Any, Any]) -> None:
        self.client = client
        self.dropped = dropped
        self.closer: AsyncGenerator[None, None] | None = None


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
        try:
            loop.call_soon_threadsafe(start)
        except RuntimeError:  # closed meanwhile
            pass
