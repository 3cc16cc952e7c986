"""Test your own code against dispatch_nb without a model, a key or a network: a real adapter for
the ``fake`` provider's canonical protocol, answered in-process by a scripted model (the guide:
docs/testing-your-code.md). ``import dispatch_nb`` does not import this module.
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
    """An ``httpx.MockTransport`` handler speaking the canonical protocol, for sync and async
    clients: it answers ``POST …/chat`` with the next scripted item (:meth:`push`; with none, it
    echoes ``"{model}: {last user message}"``) and ``GET …/models`` with :attr:`models`, keeps
    every chat request in :attr:`requests` (its JSON in :attr:`bodies`); thread-safe.
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
    """The ``fake`` provider answered in-process by a :class:`CanonicalHandler` (:attr:`handler`,
    which holds the script and the requests seen): a real adapter with a scripted model.
    ``options`` are the ``fake`` provider's (``max_tokens``, ``max_retries``, ``timeout``...).
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
        super().__init__(model, base_url=FAKE_BASE_URL,
                         async_http_client=httpx.AsyncClient(transport=transport), **options)

    def push(self, *items: ScriptItem) -> FakeAdapter:
        """Queue answers on :attr:`handler`."""
        self.handler.push(*items)
        return self

    @property
    def requests(self) -> list[dict[str, Any]]:
        """The JSON bodies of the chat requests made so far."""
        return self.handler.bodies


class ManualClock:
    """A clock for deadlines that moves only when the test moves it (docs/testing-your-code.md):
    inside ``with ManualClock(tick=...)``, every deadline dispatch_nb reads counts on it;
    :meth:`advance` moves it, and each read moves it ``tick`` seconds.
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
