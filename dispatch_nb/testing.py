"""Test your own code against dispatch_nb without a model, a key or a network: the canonical fake.

dispatch_nb's ``fake`` provider speaks a tiny *canonical* protocol (dispatch_nb's own types as
JSON, see :mod:`dispatch_nb.wire.canonical`, which also renders the scripted answers below). This
module answers that protocol in-process, through an :class:`httpx.MockTransport`, so the whole real
client runs — request building, SSE parsing, error mapping, retries, ``error.partial`` — and only
the model is scripted::

    from dispatch_nb.testing import Fail, FakeAdapter, ToolCall, Turn

    model = FakeAdapter(Turn(text="Paris."))           # answers "Paris." once, then echoes
    assert model.chat("Capital of France?").text == "Paris."
    assert model.handler.last_body["messages"][-1]["content"] == "Capital of France?"

    model.push(Turn(tool_calls=[ToolCall("c1", "get_weather", {"city": "Lima"})]),
               Turn(text="Sunny in Lima."))            # a tool round, then the answer
    model.push(Turn(text="Half an ans", error_after=2, error=Fail(529, "overloaded")))
    model.push(Fail(401, "bad key", "authentication_error"))   # an HTTP error reply

With nothing scripted, a model answers with its own name and the last user message
(``echo: hi`` for model ``echo``). :class:`CanonicalHandler` is the same server as a plain
``httpx`` handler, for code that builds its own client or adapter::

    handler = CanonicalHandler().push(Turn(text="hi"))
    client = httpx.Client(transport=httpx.MockTransport(handler), base_url="http://fake.test")

``import dispatch_nb`` does not import this module; import it in your tests.
"""

from __future__ import annotations

import collections
import json
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import httpx

from .clock import set_clock
from .providers.fake import CanonicalAdapter
from .wire.canonical import (
    Fail,
    ToolCall,
    Turn,
    canonical_body,
    canonical_error_body,
    canonical_error_event,
    canonical_events,
    last_user_text,
    sse_event,
    stream_events,
)

__all__ = [
    "CanonicalHandler",
    "Fail",
    "FakeAdapter",
    "ManualClock",
    "ToolCall",
    "Turn",
    "canonical_body",
    "canonical_error_event",
    "canonical_events",
    "sse_event",
]

#: the base URL a :class:`FakeAdapter` talks to (nothing listens there: the transport answers)
FAKE_BASE_URL = "http://dispatch-nb-fake.test"


ScriptItem = Turn | Fail


class CanonicalHandler:
    """An ``httpx.MockTransport`` handler speaking the canonical protocol.

    ``POST {base}/chat`` takes the next scripted item (:meth:`push`) — a :class:`Turn` answers, a
    :class:`Fail` is an HTTP error — or, with nothing scripted, echoes: ``"{model}: {last user
    message}"``. ``GET {base}/models`` lists :attr:`models`. Every chat request is kept in
    :attr:`requests` (its JSON in :attr:`bodies`). Thread-safe; works for sync and async clients.
    """

    def __init__(self, *script: ScriptItem, models: list[dict[str, Any]] | None = None) -> None:
        self._lock = threading.Lock()
        self.script: collections.deque[ScriptItem] = collections.deque(script)
        self.requests: list[httpx.Request] = []
        self.bodies: list[dict[str, Any]] = []
        self.models: list[dict[str, Any]] = models if models is not None else [
            {"id": "echo", "name": "Echo", "max_context_tokens": 4096, "supports_tool_use": True}
        ]

    def push(self, *items: ScriptItem) -> CanonicalHandler:
        """Queue answers, one per chat request, in order."""
        with self._lock:
            self.script.extend(items)
        return self

    @property
    def last_body(self) -> dict[str, Any]:
        """The JSON body of the last chat request."""
        if not self.bodies:
            raise LookupError("no chat request has been made yet")
        return self.bodies[-1]

    def default_turn(self, body: dict[str, Any]) -> Turn:
        """The answer when nothing is scripted: the model's name and the last user message."""
        return Turn(text=f"{body.get('model') or ''}: {last_user_text(body)}")

    def __call__(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path.rstrip("/")
        if request.method == "GET" and path.endswith("/models"):
            return httpx.Response(200, json={"data": self.models})
        if request.method != "POST" or not path.endswith("/chat"):
            return httpx.Response(404, json=canonical_error_body(
                Fail(404, f"no route {request.method} {request.url.path}", "not_found")))
        try:
            body = json.loads(request.read() or b"{}")
        except ValueError:
            return httpx.Response(400, json=canonical_error_body(
                Fail(400, "the request body is not JSON", "invalid_request_error")))
        with self._lock:
            self.requests.append(request)
            self.bodies.append(body)
            item: ScriptItem | None = self.script.popleft() if self.script else None
        if item is None:
            item = self.default_turn(body)
        if isinstance(item, Fail):
            return httpx.Response(item.status, json=canonical_error_body(item),
                                  headers=item.headers)
        model = body.get("model")
        if not body.get("stream"):
            return httpx.Response(200, json=canonical_body(item, model))
        return httpx.Response(200, stream=_FrameStream(stream_events(item, model)),
                              headers={"content-type": "text/event-stream"})


class _FrameStream(httpx.SyncByteStream, httpx.AsyncByteStream):
    """A response body sent one SSE frame per chunk, to sync and async clients alike."""

    def __init__(self, frames: list[bytes]) -> None:
        self._frames = frames

    def __iter__(self) -> Iterator[bytes]:
        yield from self._frames

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for frame in self._frames:
            yield frame


class FakeAdapter(CanonicalAdapter):
    """The ``fake`` provider answered in-process by a :class:`CanonicalHandler`: a real adapter
    (chat, stream, async, tools, sessions, caches) with a scripted model and no server.

    ``FakeAdapter(*script, model="echo", handler=None, **options)``: ``script`` items are queued
    on the handler; ``options`` are the ``fake`` provider's (``max_tokens``, ``max_retries``,
    ``timeout``...). :attr:`handler` holds the script and the requests seen.
    """

    def __init__(
        self,
        *script: ScriptItem,
        model: str = "echo",
        handler: CanonicalHandler | None = None,
        **options: Any,
    ) -> None:
        self.handler = handler if handler is not None else CanonicalHandler()
        self.handler.push(*script)
        transport = httpx.MockTransport(self.handler)
        super().__init__(
            model,
            base_url=FAKE_BASE_URL,
            async_http_client=httpx.AsyncClient(transport=transport),
            **options,
        )

    def push(self, *items: ScriptItem) -> FakeAdapter:
        """Queue answers on :attr:`handler`."""
        self.handler.push(*items)
        return self

    @property
    def requests(self) -> list[dict[str, Any]]:
        """The JSON bodies of the chat requests made so far."""
        return self.handler.bodies


class ManualClock:
    """A clock for deadlines that moves only when the test moves it.

    ``with ManualClock() as clock:`` makes every deadline dispatch_nb reads (a call's
    ``timeout=``, a session turn's) count on this clock until the block ends; :meth:`advance`
    moves it. ``tick`` moves it by that many seconds each time a deadline is read, which is once
    or twice per streamed chunk or token: with ``tick=1``, a ``timeout=40`` passes a few dozen
    chunks into an answer on any machine, fast or loaded::

        with ManualClock(tick=1):
            model.chat(prompt, timeout=40)       # APITimeoutError, error.partial holds the start

    A deadline passed on this clock is noticed at the next check (between two chunks or tokens),
    not while a read is blocked. Real waits (retry backoffs, a server's silence) still take real
    time.
    """

    def __init__(self, *, tick: float = 0.0) -> None:
        if tick < 0:
            raise ValueError(f"tick must be 0 or more seconds, not {tick!r}")
        self.tick = tick
        self._now = time.monotonic()
        self._lock = threading.Lock()
        self._previous: Callable[[], float] | None = None

    def __call__(self) -> float:
        with self._lock:
            now = self._now
            self._now += self.tick
            return now

    def advance(self, seconds: float) -> None:
        """Move the clock ``seconds`` forward."""
        if seconds < 0:
            raise ValueError("a clock only moves forward: give advance() 0 or more seconds")
        with self._lock:
            self._now += seconds

    def __enter__(self) -> ManualClock:
        self._previous = set_clock(self)
        return self

    def __exit__(self, *exc: object) -> None:
        set_clock(self._previous)
        self._previous = None
