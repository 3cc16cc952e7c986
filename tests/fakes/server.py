"""A real loopback HTTP/1.1 server for tests, with fault injection.

Every provider fake is built on :class:`LoopbackServer`: it binds 127.0.0.1 on a free port, serves
each connection on its own thread, and hands every request to a handler that returns a
:class:`Reply`. A reply can stream its body in chunks (chunked transfer encoding, keep-alive), pause
between chunks, stall, or drop the connection mid-stream — the faults real servers have.

What real servers and proxies also do, on request:

- ``tls=`` serves HTTPS (a throw-away CA from ``trustme``: see :func:`tls_context`);
- ``idle_timeout=`` closes a keep-alive connection that stays idle that long, from the server side
  (uvicorn after 5 s, nginx after 75 s; 0 closes it right after each answer, still advertising
  keep-alive);
- ``rudeness=`` (:class:`Rudeness`) makes event streams rude but valid: each event split across
  several HTTP chunks (inside a UTF-8 character, and between ``\r`` and ``\n``), SSE comments,
  ``id:`` and ``retry:`` fields, CRLF line endings.

A handler that raises is a bug in the test, not a provider error: the client gets a 500 that says
so (with ``x-should-retry: false``, so nothing retries it), and the exception is kept in
:attr:`LoopbackServer.errors` and in a process-wide list that ``tests/conftest.py`` raises at the
end of the test that caused it (:func:`take_handler_errors`).
"""

from __future__ import annotations

import contextlib
import gc
import json
import select
import socket
import ssl
import sys
import threading
import time
import traceback
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

__all__ = [
    "ENCODINGS",
    "FakeServerBug",
    "LoopbackServer",
    "RecordedRequest",
    "Reply",
    "Rudeness",
    "compressed",
    "take_handler_errors",
    "tls_context",
]


@dataclass
class RecordedRequest:
    """What a client sent."""

    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]  # lower-cased names
    body: bytes

    @property
    def json(self) -> Any:
        return json.loads(self.body) if self.body else None

    def header(self, name: str) -> str | None:
        return self.headers.get(name.lower())


#: the longest a reply waits for its ``hold`` (a test that failed before setting it)
HOLD_LIMIT = 120.0


@dataclass
class Reply:
    """What the server answers.

    ``chunks`` streams the body piece by piece (with ``delay`` seconds between pieces);
    ``reset_after`` drops the connection after that many chunks; ``stall`` sleeps that long before
    anything is sent (or, with ``stall_after``, after that many chunks; with ``stall_after`` at
    least the number of chunks, after the last one, before the body's end); ``hold``, with
    ``stall_after``, pauses there until the test sets that event instead. ``compress`` sends the body
    with that ``Content-Encoding`` (see :data:`ENCODINGS`; ``None``: the server's default).
    """

    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    chunks: list[bytes] | None = None
    delay: float = 0.0
    reset_after: int | None = None
    reset_before_headers: bool = False
    stall: float = 0.0
    stall_after: int | None = None
    hold: threading.Event | None = None
    compress: str | None = None

    def __post_init__(self) -> None:
        if self.hold is not None and self.stall_after is None:
            raise ValueError("hold= pauses at stall_after=: give both")

    @classmethod
    def json(cls, data: Any, status: int = 200, headers: dict[str, str] | None = None) -> Reply:
        return cls(
            status=status,
            headers={"content-type": "application/json", **(headers or {})},
            body=json.dumps(data).encode(),
        )

    @classmethod
    def sse(
        cls,
        events: Iterable[bytes],
        *,
        delay: float = 0.0,
        headers: dict[str, str] | None = None,
        **kw: Any,
    ) -> Reply:
        return cls(
            status=200,
            headers={"content-type": "text/event-stream", "cache-control": "no-cache",
                     **(headers or {})},
            chunks=list(events),
            delay=delay,
            **kw,
        )


# -- compression (Content-Encoding), as real servers send it --------------------------------------
def _gzip_like(wbits: int) -> Callable[[], tuple[Callable[[bytes], bytes], Callable[[], bytes]]]:
    def make() -> tuple[Callable[[bytes], bytes], Callable[[], bytes]]:
        z = zlib.compressobj(9, zlib.DEFLATED, wbits)
        return (lambda data: z.compress(data) + z.flush(zlib.Z_SYNC_FLUSH)), z.flush
    return make


def _brotli() -> tuple[Callable[[bytes], bytes], Callable[[], bytes]]:
    import brotli

    c = brotli.Compressor()
    return (lambda data: c.process(data) + c.flush()), c.finish


def _zstd() -> tuple[Callable[[bytes], bytes], Callable[[], bytes]]:
    import zstandard

    c = zstandard.ZstdCompressor().compressobj()
    return (lambda data: c.compress(data) + c.flush(zstandard.COMPRESSOBJ_FLUSH_BLOCK)), c.flush


def _installed(module: str) -> bool:
    try:
        __import__(module)
    except ImportError:
        return False
    return True


#: Content-Encodings the fakes can send: ``name → () -> (encode chunk, finish)``; each chunk is
#: flushed on its own, so a compressed stream still arrives event by event (br/zstd only where
#: their libraries are installed — the same ones httpx needs to decode them)
ENCODINGS: dict[str, Callable[[], tuple[Callable[[bytes], bytes], Callable[[], bytes]]]] = {
    "gzip": _gzip_like(31),
    "deflate": _gzip_like(15),  # HTTP "deflate" is the zlib format
    **({"br": _brotli} if _installed("brotli") else {}),
    **({"zstd": _zstd} if _installed("zstandard") else {}),
}


def compressed(reply: Reply, encoding: str | None) -> Reply:
    """``reply`` sent with ``Content-Encoding: encoding`` (unchanged for None / ``identity``).

    A streamed body is compressed chunk by chunk with a flush after each, the stream's end rides
    on the last chunk; a cut stream (``reset_after``) never sends it, as a real cut would."""
    if encoding in (None, "identity") or (reply.chunks is None and not reply.body):
        return reply
    if encoding not in ENCODINGS:
        raise ValueError(f"cannot compress with {encoding!r}: choose from {sorted(ENCODINGS)}")
    encode, finish = ENCODINGS[encoding]()
    headers = {**reply.headers, "content-encoding": encoding}
    if reply.chunks is None:
        return replace(reply, headers=headers, body=encode(reply.body) + finish(), compress=None)
    chunks = [encode(chunk) if chunk else b"" for chunk in reply.chunks]
    last = max((i for i, chunk in enumerate(chunks) if chunk), default=None)
    if last is None:
        chunks.append(finish())
    else:
        chunks[last] += finish()
    return replace(reply, headers=headers, chunks=chunks, compress=None)


Handler = Callable[[RecordedRequest], Reply]


# -- a crashing handler is a test bug ------------------------------------------------------------


class FakeServerBug(AssertionError):
    """A fake's handler raised: the test that made the request fails with the traceback."""


_handler_errors: list[str] = []
_handler_errors_lock = threading.Lock()


def _record_handler_error(server: LoopbackServer, where: str, exc: BaseException) -> str:
    text = f"the fake at {server.url} crashed {where}:\n" + "".join(
        traceback.format_exception(type(exc), exc, exc.__traceback__)
    )
    with _handler_errors_lock:
        server.errors.append(text)
        _handler_errors.append(text)
    return text


def take_handler_errors() -> list[str]:
    """Every handler crash (any server) not yet reported, oldest first; clears the list."""
    with _handler_errors_lock:
        taken = list(_handler_errors)
        _handler_errors.clear()
    return taken


def _crash_reply(exc: BaseException) -> Reply:
    # Not a provider error: a plain 500 that no client retries, naming the real culprit.
    return Reply(
        status=500,
        headers={"content-type": "text/plain; charset=utf-8", "x-should-retry": "false"},
        body=f"fake server bug (the test fails at teardown): {exc!r}".encode(),
    )


# -- rude but valid event streams ----------------------------------------------------------------


@dataclass
class Rudeness:
    """How rude an event stream is (every switch is valid SSE that real servers or proxies send).

    ``split``: each event goes out in several HTTP chunks — cut inside its first multi-byte UTF-8
    character, in the middle, and before its last byte (between ``\r`` and ``\n`` with CRLF).
    ``comments``: a ``: keep-alive`` comment block before every event and a comment line inside it.
    ``ids``: an ``id:`` field on every event. ``retry``: a ``retry:`` field (milliseconds) first.
    ``crlf``: CRLF line endings instead of LF.
    """

    split: bool = True
    comments: bool = True
    ids: bool = True
    retry: int | None = 3000
    crlf: bool = True

    def pieces(self, index: int, event: bytes) -> list[bytes]:
        """The HTTP chunks that carry event number ``index`` (``b""`` chunks are never written)."""
        if not event.strip():
            return [event]
        lines = event.split(b"\n")
        head: list[bytes] = []
        if index == 0 and self.retry is not None:
            head.append(b"retry: %d\n\n" % self.retry)
        if self.comments:
            head.append(b": keep-alive\n\n")
            lines.insert(1 if len(lines) > 2 else 0, b": a comment line inside the event")
        if self.ids:
            lines.insert(0, b"id: evt-%d" % index)
        body = b"\n".join(lines)
        prefix = b"".join(head)
        if self.crlf:
            body = body.replace(b"\n", b"\r\n")
            prefix = prefix.replace(b"\n", b"\r\n")
        if not self.split:
            return [prefix + body]
        cuts = {len(body) // 2, len(body) - 1}
        multibyte = next((i for i, byte in enumerate(body) if byte >= 0xC0), None)
        if multibyte is not None:
            cuts.add(multibyte + 1)  # inside the character
        cuts = {c for c in cuts if 0 < c < len(body)}
        out = [prefix] if prefix else []
        start = 0
        for cut in sorted(cuts):
            out.append(body[start:cut])
            start = cut
        out.append(body[start:])
        return out


# -- HTTPS ---------------------------------------------------------------------------------------


def tls_context(ca: Any) -> ssl.SSLContext:
    """A server-side TLS context with a certificate for 127.0.0.1 issued by ``ca``
    (a ``trustme.CA``; clients trust it with ``ca.cert_pem.write_to_path(...)`` +
    ``SSL_CERT_FILE``)."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1", "localhost").configure_cert(context)
    return context


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    block_on_close = False
    request_queue_size = 128  # many clients connecting at once (concurrency tests)
    tls: ssl.SSLContext | None = None

    def get_request(self) -> tuple[socket.socket, Any]:
        sock, address = super().get_request()
        if self.tls is not None:  # the handshake runs on the connection's own thread
            sock = self.tls.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
        return sock, address

    owner: LoopbackServer | None = None

    def handle_error(self, request: Any, client_address: Any) -> None:
        # Clients that hang up mid-reply are expected in fault-injection tests; anything else
        # (a reply the server cannot send, say) is a bug in the test.
        exc = sys.exc_info()[1]
        if exc is None or isinstance(exc, OSError) or self.owner is None:
            return
        if isinstance(exc, ValueError) and "closed file" in str(exc):
            return
        _record_handler_error(self.owner, "sending a reply", exc)


class LoopbackServer:
    """``with LoopbackServer(handler) as server: ... server.url ...`` (see the module docstring
    for ``tls``, ``idle_timeout`` and ``rudeness``).

    ``compress``: the ``Content-Encoding`` of every reply that does not choose its own
    (``Reply.compress``); settable while the server runs (``server.compress = "gzip"``)."""

    def __init__(
        self,
        handler: Handler,
        *,
        compress: str | None = None,
        tls: ssl.SSLContext | None = None,
        idle_timeout: float | None = None,
        rudeness: Rudeness | None = None,
    ) -> None:
        self.handler = handler
        self.compress = compress
        self.requests: list[RecordedRequest] = []
        #: tracebacks of handler crashes (also raised by tests/conftest.py at the test's teardown)
        self.errors: list[str] = []
        #: close a keep-alive connection after this many idle seconds (None: keep it open)
        self.idle_timeout = idle_timeout
        #: make event streams rude (None: one event per HTTP chunk, LF line endings)
        self.rudeness = rudeness
        #: connections the server closed because they stayed idle
        self.idle_closes = 0
        #: connections clients opened (fewer than requests when keep-alive reuses them)
        self.connections_made = 0
        self.stopping = threading.Event()
        self._lock = threading.Lock()
        self._connections: set[socket.socket] = set()
        owner = self

        class RequestHandler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # as real servers do: small chunks leave at once

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def setup(self) -> None:
                super().setup()
                with owner._lock:
                    owner._connections.add(self.connection)
                    owner.connections_made += 1
                if isinstance(self.connection, ssl.SSLSocket):
                    self.connection.do_handshake()

            def handle_one_request(self) -> None:
                _wait_for_request(self, owner)

            def finish(self) -> None:
                with owner._lock:
                    owner._connections.discard(self.connection)
                try:
                    super().finish()
                except OSError:
                    pass

            def _handle(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length) if length else b""
                parts = urlsplit(self.path)
                request = RecordedRequest(
                    method=self.command,
                    path=parts.path,
                    query=parse_qs(parts.query),
                    headers={k.lower(): v for k, v in self.headers.items()},
                    body=body,
                )
                with owner._lock:
                    owner.requests.append(request)
                try:
                    reply = owner.handler(request)
                except Exception as exc:  # a bug in a fake fails the test (see module docstring)
                    _record_handler_error(owner, f"handling {request.method} {request.path}", exc)
                    reply = _crash_reply(exc)
                self._send(reply)

            do_GET = do_POST = do_PUT = do_DELETE = _handle

            def _wait(self, seconds: float) -> bool:
                """Pause ``seconds``; True (send nothing more) once the server is closing or the
                client hung up: a stalled reply does not outlive the call that waited for it."""
                if owner.stopping.is_set():
                    return True
                try:  # readable while a reply is pending: the client closed, or close() shut it
                    readable = select.select([self.connection], [], [], seconds)[0]
                    if readable and not isinstance(self.connection, ssl.SSLSocket) and \
                            self.connection.recv(1, socket.MSG_PEEK):
                        return owner.stopping.wait(seconds)  # a pipelined request: keep pausing
                except (OSError, ValueError):
                    return True
                return bool(readable) or owner.stopping.is_set()

            def _pause(self, reply: Reply) -> bool:
                """The pause at ``stall_after``: until ``reply.hold`` is set (at most
                :data:`HOLD_LIMIT` seconds), or ``stall`` seconds; True (send nothing more) as
                :meth:`_wait`."""
                if reply.hold is None:
                    return self._wait(reply.stall)
                end = time.monotonic() + HOLD_LIMIT
                while not reply.hold.wait(0.02):
                    if self._wait(0) or time.monotonic() > end:
                        return True
                return False

            def _send(self, reply: Reply) -> None:
                encoding = reply.compress or owner.compress
                # rudeness shapes the event stream itself, so it comes before any compression
                rude = _rude_chunks(reply, owner.rudeness)
                reply = compressed(reply, encoding)
                if encoding is not None:
                    rude = _compressed_pieces(rude, encoding)
                if reply.reset_before_headers:
                    self._reset()
                    return
                if reply.stall and reply.stall_after is None and self._wait(reply.stall):
                    return
                try:
                    self.send_response(reply.status)
                    headers = {k.lower(): v for k, v in reply.headers.items()}
                    if reply.chunks is None:
                        headers.setdefault("content-length", str(len(reply.body)))
                        for k, v in headers.items():
                            self.send_header(k, v)
                        self.end_headers()
                        self.wfile.write(reply.body)
                        self.wfile.flush()
                        return
                    headers["transfer-encoding"] = "chunked"
                    for k, v in headers.items():
                        self.send_header(k, v)
                    self.end_headers()
                    self.wfile.flush()
                    chunks = rude if rude is not None else ([chunk] for chunk in reply.chunks)
                    for i, chunk in enumerate(chunks):
                        if reply.reset_after is not None and i >= reply.reset_after:
                            self._reset()
                            return
                        if (
                            reply.stall_after is not None
                            and i == reply.stall_after
                            and self._pause(reply)
                        ):
                            return
                        if i and reply.delay and self._wait(reply.delay):
                            return
                        for piece in chunk:
                            if piece:
                                self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                                self.wfile.flush()
                    if reply.reset_after is not None and reply.reset_after >= len(reply.chunks):
                        self._reset()
                        return
                    if (  # every event sent, the body kept open (a stream that never ends)
                        reply.stall_after is not None
                        and reply.stall_after >= len(reply.chunks)
                        and self._pause(reply)
                    ):
                        return
                    self.wfile.write(b"0\r\n\r\n")
                    self.wfile.flush()
                except (BrokenPipeError, ConnectionResetError, OSError):
                    self.close_connection = True

            def _reset(self) -> None:
                self.close_connection = True
                try:
                    self.connection.setsockopt(
                        socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00"
                    )
                    self.connection.close()
                except OSError:
                    pass

        self._server = _Server(("127.0.0.1", 0), RequestHandler)
        self._server.tls = tls
        self._server.owner = self
        self.port = self._server.server_address[1]
        self.url = f"{'https' if tls else 'http'}://127.0.0.1:{self.port}"
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.005}, daemon=True
        )

    @property
    def open_connections(self) -> int:
        """Client connections the server still holds open (0 once every client hung up)."""
        with self._lock:
            return len(self._connections)

    def start(self) -> LoopbackServer:
        self._thread.start()
        return self

    def close(self) -> None:
        if self.stopping.is_set():
            return
        self.stopping.set()
        self._server.shutdown()
        with self._lock:
            conns = list(self._connections)
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._server.server_close()
        self._thread.join(5)

    def __enter__(self) -> LoopbackServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


def _wait_for_request(handler: Any, owner: LoopbackServer) -> None:
    """Serve the next request on a connection, closing it instead if it stays idle longer than
    ``owner.idle_timeout`` after an answer (reads of the request itself and every write are not
    limited)."""
    idle = owner.idle_timeout
    served = getattr(handler, "_requests_served", 0)
    handler._requests_served = served + 1
    if idle is None or not served:  # (a new connection gets its first request in any case)
        BaseHTTPRequestHandler.handle_one_request(handler)
        return
    if idle <= 0:  # closed right after the answer, though the answer advertised keep-alive
        with owner._lock:
            owner.idle_closes += 1
        handler.close_connection = True
        return
    connection = handler.connection
    try:
        connection.settimeout(idle)
        if not handler.rfile.peek(1):  # the client hung up
            handler.close_connection = True
            return
    except (TimeoutError, OSError):
        with owner._lock:
            owner.idle_closes += 1
        handler.close_connection = True
        return
    finally:
        try:
            connection.settimeout(None)
        except OSError:
            pass
    BaseHTTPRequestHandler.handle_one_request(handler)


def _rude_chunks(reply: Reply, rudeness: Rudeness | None) -> list[list[bytes]] | None:
    """The HTTP chunks to write for each of the reply's chunks (several when ``rudeness`` splits an
    event stream), or None for a reply that is not made rude; ``delay``, ``stall_after`` and
    ``reset_after`` still count reply chunks."""
    content_type = next((v for k, v in reply.headers.items() if k.lower() == "content-type"), "")
    if rudeness is None or reply.chunks is None or "text/event-stream" not in content_type:
        return None
    return [rudeness.pieces(i, chunk) for i, chunk in enumerate(reply.chunks)]


def _compressed_pieces(rude: list[list[bytes]] | None, encoding: str) -> list[list[bytes]] | None:
    """Rude pieces compressed as one stream (each piece flushed on its own, so the splits stay
    HTTP chunks of their own); the stream's end rides on the last piece."""
    if rude is None or encoding == "identity":
        return rude
    encode, finish = ENCODINGS[encoding]()
    out = [[encode(piece) if piece else b"" for piece in pieces] for pieces in rude]
    if out and out[-1]:
        out[-1][-1] += finish()
    else:
        out.append([finish()])
    return out


def wait_for(predicate: Callable[[], bool], timeout: float = 5.0, interval: float = 0.01) -> bool:
    """Poll ``predicate`` until true or ``timeout``; returns its last value."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


def closed_by_client(fake: Any, timeout: float = 4.0) -> bool:
    """The server of ``fake`` (a provider fake) saw every client connection go away; else an
    ``AssertionError`` that says what this process still holds open to the server, what holds
    it, and whether a garbage collection closed it (a connection nobody closed, only dropped,
    closes then)."""
    if wait_for(lambda: fake.server.open_connections == 0, timeout=timeout):
        return True
    port = fake.server.port
    held = []
    for obj in gc.get_objects():
        if isinstance(obj, socket.socket) and obj.fileno() != -1:
            with contextlib.suppress(OSError):
                if obj.getpeername()[1] == port:
                    holders = sorted({type(r).__qualname__ for r in gc.get_referrers(obj)} - {"list"})
                    held.append(f"{obj!r} held by {', '.join(holders) or 'nothing'}")
    gc.collect()
    after = wait_for(lambda: fake.server.open_connections == 0, timeout=1.0)
    raise AssertionError(
        f"{fake.server.open_connections} connection(s) still open {timeout} s after the call; "
        f"client sockets to the server: {held or 'none found'}; after gc.collect(): "
        f"{'all closed' if after else 'still open'}"
    )
