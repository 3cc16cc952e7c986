"""A real loopback HTTP/1.1 server for tests, with fault injection.

Every provider fake is built on :class:`LoopbackServer`: it binds 127.0.0.1 on a free port, serves
each connection on its own thread, and hands every request to a handler that returns a
:class:`Reply`. A reply can stream its body in chunks (chunked transfer encoding, keep-alive), pause
between chunks, stall, or drop the connection mid-stream — the faults real servers have.
"""

from __future__ import annotations

import json
import socket
import threading
import time
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

__all__ = ["ENCODINGS", "LoopbackServer", "RecordedRequest", "Reply", "compressed"]


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


@dataclass
class Reply:
    """What the server answers.

    ``chunks`` streams the body piece by piece (with ``delay`` seconds between pieces);
    ``reset_after`` drops the connection after that many chunks; ``stall`` sleeps that long before
    anything is sent (or, with ``stall_after``, after that many chunks). ``compress`` sends the body
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
    compress: str | None = None

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


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    block_on_close = False
    request_queue_size = 128  # many clients connecting at once (concurrency tests)

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # clients that hang up mid-reply are expected in fault-injection tests


class LoopbackServer:
    """``with LoopbackServer(handler) as server: ... server.url ...``

    ``compress``: the ``Content-Encoding`` of every reply that does not choose its own
    (``Reply.compress``); settable while the server runs (``server.compress = "gzip"``)."""

    def __init__(self, handler: Handler, *, compress: str | None = None) -> None:
        self.handler = handler
        self.compress = compress
        self.requests: list[RecordedRequest] = []
        self.stopping = threading.Event()
        self._lock = threading.Lock()
        self._connections: set[socket.socket] = set()
        owner = self

        class RequestHandler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def setup(self) -> None:
                super().setup()
                with owner._lock:
                    owner._connections.add(self.connection)

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
                except Exception as exc:  # a bug in a fake must be visible, not a hang
                    reply = Reply.json({"error": {"message": f"fake server bug: {exc!r}",
                                                  "type": "fake_error"}}, status=599)
                self._send(reply)

            do_GET = do_POST = do_PUT = do_DELETE = _handle

            def _wait(self, seconds: float) -> bool:
                return owner.stopping.wait(seconds)

            def _send(self, reply: Reply) -> None:
                reply = compressed(reply, reply.compress or owner.compress)
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
                    for i, chunk in enumerate(reply.chunks):
                        if reply.reset_after is not None and i >= reply.reset_after:
                            self._reset()
                            return
                        if (
                            reply.stall_after is not None
                            and i == reply.stall_after
                            and self._wait(reply.stall)
                        ):
                            return
                        if i and reply.delay and self._wait(reply.delay):
                            return
                        if chunk:
                            self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                            self.wfile.flush()
                    if reply.reset_after is not None and reply.reset_after >= len(reply.chunks):
                        self._reset()
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
        self.port = self._server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
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


def wait_for(predicate: Callable[[], bool], timeout: float = 5.0, interval: float = 0.01) -> bool:
    """Poll ``predicate`` until true or ``timeout``; returns its last value."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()
