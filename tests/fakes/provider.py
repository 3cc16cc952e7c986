"""Scripted provider fakes: canonical scenarios rendered in each provider's real wire protocol.

A test scripts what the "model" does in provider-neutral terms — :class:`Turn` (text, thinking,
tool calls, usage, stop reason, streaming pace and faults), :class:`Fail` (an HTTP error),
:class:`Drop` (connection reset before any answer), :class:`Stall` (no answer for a while) — and a
:class:`ProviderFake` subclass renders it in its protocol (OpenAI chat.completions, Responses,
Anthropic Messages, Copilot, dispatch_nb's canonical one). With nothing scripted, the fake echoes
the last user message, which is what notebook tests want.

A subclass implements the ``render_*`` methods and the request inspectors (``system_of``,
``max_tokens_of``...) that the contract suite uses to check where things landed on the wire.
"""

from __future__ import annotations

import collections
import re
import threading
from dataclasses import dataclass, replace
from typing import Any, ClassVar, Literal

from dispatch_nb import ToolDefinition, testing
from dispatch_nb.testing import Fail, ToolCall

from .server import LoopbackServer, RecordedRequest, Reply

#: the tool the tests ask every model to call (``ToolCall("call_1", "get_weather", {"city": ...})``)
WEATHER = ToolDefinition(
    name="get_weather",
    description="Current weather for a city",
    parameters={
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
)

__all__ = ["Drop", "Fail", "LateKind", "ProviderFake", "Stall", "ToolCall", "Turn", "send_late"]


@dataclass
class Drop:
    """Reset the connection before sending anything."""


@dataclass
class Stall:
    """Send nothing for ``seconds`` (then a normal echo answer); a client that hangs up meanwhile
    ends it (so a long stall costs a test nothing once the call under test has given up)."""

    seconds: float


@dataclass
class Turn(testing.Turn):
    """One scripted model answer (:class:`dispatch_nb.testing.Turn`: text, thinking, tool calls,
    usage, stop reason, ``chunk``, ``error_after``/``error``) with the pace and faults only a
    socket can have."""

    delay: float = 0.0  # seconds between streamed events
    reset_after: int | None = None  # drop the connection after this many events
    stall_after: int | None = None  # stall this many events in ...
    stall: float = 0.0  # ... for this long
    hold: threading.Event | None = None  # ... or until the test sets this event
    #: send the last ``text``, ``thinking`` or ``arguments`` delta late: one event later
    #: (``"next"``: after its block's stop or done event) or after the terminal event (``"end"``,
    #: in the same read, so that the client has it); every event is then its own chunk
    late: tuple[LateKind, Literal["next", "end"]] | None = None


LateKind = Literal["text", "thinking", "arguments"]
ScriptItem = Turn | Fail | Drop | Stall

_FRAME_END = re.compile(rb"(?:\r\n\r\n|\n\n)")


def send_late(events: list[bytes], marker: bytes, where: str) -> list[bytes]:
    """``events`` (SSE chunks) as one chunk per event, with the last event that holds ``marker``
    moved one event later (``where="next"``) or after the last event, in its chunk (``"end"``)."""
    frames: list[bytes] = []
    for chunk in events:
        start = 0
        for match in _FRAME_END.finditer(chunk):
            frames.append(chunk[start : match.end()])
            start = match.end()
        if chunk[start:]:
            frames.append(chunk[start:])
    index = max(i for i, frame in enumerate(frames) if marker in frame)
    frame = frames.pop(index)
    if where == "next":
        frames.insert(index + 1, frame)
    else:
        frames[-1] += frame
    return frames


#: the request headers a server that echoes what it got (a gateway, a proxy) quotes
CREDENTIAL_HEADERS = ("authorization", "x-api-key", "api-key")


def echo_credentials(fail: Fail, request: RecordedRequest) -> Fail:
    """``fail`` with ``{credentials}`` in its message replaced by the credential headers the
    request carried, as a gateway quoting the ``Authorization`` header it got does."""
    if "{credentials}" not in fail.message:
        return fail
    sent = "; ".join(f"{name}: {request.headers[name]}" for name in CREDENTIAL_HEADERS
                     if name in request.headers)
    return replace(fail, message=fail.message.replace("{credentials}", sent or "(none)"))


class ProviderFake:
    """Base of every provider fake: scripting, request capture, echo default, fault rendering."""

    #: name used in test ids
    name = "fake"

    def __init__(self, **server_options: Any) -> None:
        """``server_options``: the :class:`LoopbackServer`'s (``tls``, ``idle_timeout``,
        ``rudeness``)."""
        self.script: collections.deque[ScriptItem] = collections.deque()
        self.chat_requests: list[RecordedRequest] = []
        self._lock = threading.Lock()
        self.server = LoopbackServer(self._dispatch, **server_options)

    # -- lifecycle -------------------------------------------------------------------------------
    def start(self) -> ProviderFake:
        self.server.start()
        return self

    def close(self) -> None:
        self.server.close()

    def __enter__(self) -> ProviderFake:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def base_url(self) -> str:
        """What to pass as the adapter's ``base_url``."""
        return self.server.url

    @property
    def requests(self) -> list[RecordedRequest]:
        return self.server.requests

    @property
    def last_request(self) -> RecordedRequest:
        return self.chat_requests[-1]

    def push(self, *items: ScriptItem) -> ProviderFake:
        """Queue scripted answers, consumed one per chat request."""
        with self._lock:
            self.script.extend(items)
        return self

    # -- dispatch --------------------------------------------------------------------------------
    def _dispatch(self, request: RecordedRequest) -> Reply:
        if not self.is_chat(request):
            return self.route_other(request)
        with self._lock:
            self.chat_requests.append(request)
            item: ScriptItem | None = self.script.popleft() if self.script else None
        problem = self.validate(request)
        if problem is None:
            from . import structured

            refused = structured.check_request(self, request.json)  # structured output rules
            if refused is not None and item is not None:
                with self._lock:  # a refused request does not use up the scripted answer
                    self.script.appendleft(item)
            if isinstance(refused, Reply):
                return refused
            problem = refused
        if problem is not None:
            return self.render_error(problem)
        if item is None:
            item = self.default_turn(request)
        return self.render(item, request)

    def default_turn(self, request: RecordedRequest) -> Turn:
        from . import structured

        answer = structured.default_answer(request.json)  # JSON for a structured request
        return answer or Turn(text=f"echo: {self.last_user_text(request)}")

    def render(self, item: ScriptItem, request: RecordedRequest) -> Reply:
        if isinstance(item, Turn):
            from . import structured

            item = structured.shape_turn(item, request.json)  # tool-mode answers call the tool
        if isinstance(item, Fail):
            return self.render_error(echo_credentials(item, request))
        if isinstance(item, Drop):
            return Reply(reset_before_headers=True)
        if isinstance(item, Stall):
            reply = self.render(self.default_turn(request), request)
            reply.stall = item.seconds
            reply.stall_after = None
            return reply
        if not self.wants_stream(request):
            return Reply.json(self.render_json(item, request))
        events = self.render_events(item, request)
        if item.late is not None:
            kind, where = item.late
            events = send_late(events, self.delta_marker(kind), where)
        if item.error is not None:
            cut = item.error_after if item.error_after is not None else len(events)
            events = [*events[:cut], self.render_stream_error(echo_credentials(item.error, request))]
        return Reply.sse(
            events,
            delay=item.delay,
            reset_after=item.reset_after,
            stall_after=item.stall_after,
            stall=item.stall,
            hold=item.hold,
        )

    # -- what a protocol supplies ----------------------------------------------------------------
    #: what marks each kind of delta event in this protocol's stream (:attr:`Turn.late`)
    delta_markers: ClassVar[dict[LateKind, bytes]] = {}

    def delta_marker(self, kind: LateKind) -> bytes:
        return self.delta_markers[kind]

    def is_chat(self, request: RecordedRequest) -> bool:
        raise NotImplementedError

    def route_other(self, request: RecordedRequest) -> Reply:
        return Reply.json({"error": {"message": f"no route {request.method} {request.path}"}}, 404)

    def wants_stream(self, request: RecordedRequest) -> bool:
        return bool((request.json or {}).get("stream"))

    def validate(self, request: RecordedRequest) -> Fail | None:
        """Reject a malformed request the way the real API would (400)."""
        return None

    def render_events(self, turn: Turn, request: RecordedRequest) -> list[bytes]:
        """The SSE events (one bytes item each) of a streamed answer."""
        raise NotImplementedError

    def render_json(self, turn: Turn, request: RecordedRequest) -> Any:
        raise NotImplementedError

    def render_error(self, fail: Fail) -> Reply:
        return Reply.json(
            {"error": {"message": fail.message, "type": fail.error_type or "error"}},
            status=fail.status,
            headers=fail.headers,
        )

    def render_stream_error(self, fail: Fail) -> bytes:
        raise NotImplementedError

    # -- request inspectors (used by the contract suite) -------------------------------------
    def last_user_text(self, request: RecordedRequest) -> str:
        raise NotImplementedError

    def system_of(self, request: RecordedRequest) -> str | None:
        raise NotImplementedError

    def max_tokens_of(self, request: RecordedRequest) -> int | None:
        raise NotImplementedError

    def tool_names_of(self, request: RecordedRequest) -> list[str]:
        raise NotImplementedError

    def tool_result_ids_of(self, request: RecordedRequest) -> list[str]:
        """Ids of the tool results the request sends back."""
        raise NotImplementedError

    def thinking_signatures_of(self, request: RecordedRequest) -> list[str]:
        """Thinking signatures the request sends back, in order. The default collects every
        ``"signature"`` string anywhere in the JSON body; override it when a protocol carries
        them under another name (e.g. encrypted reasoning)."""
        found: list[str] = []

        def walk(node: Any) -> None:
            if isinstance(node, dict):
                for key, value in node.items():
                    if key == "signature" and isinstance(value, str):
                        found.append(value)
                    else:
                        walk(value)
            elif isinstance(node, list):
                for item in node:
                    walk(item)

        walk(request.json)
        return found


sse_event = testing.sse_event
