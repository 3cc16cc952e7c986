"""dispatch_nb's canonical test protocol: the canonical types on the wire, both ways, so a test
server for it is a few lines and the adapter exercises the whole shared HTTP machinery (SSE,
errors, retries, deadlines, cancellation)::

    POST {base_url}/chat   {"model", "messages": [Message...], "system", "tools": [ToolDefinition...],
                            "max_tokens", "temperature", "stream", "options"}
                            (+ "output": {"name", "description", "schema"} for structured output)
      stream=false → 200  Response JSON
      stream=true  → 200  text/event-stream of {"type": ...} events:
          text {text} | thinking {text} | signature {signature} | block {block}
          tool_start {id, name} | tool_delta {id, fragment} | tool_end {id}
          done {stop_reason, usage, model} | error {status, message, error_type}
      errors       → 4xx/5xx  {"error": {"message", "type"}}
    GET  {base_url}/models → {"data": [ModelInfo...]}

Client side: :class:`CanonicalWire`, what the ``fake`` provider speaks. Server side: a scripted
answer (:class:`Turn`, :class:`Fail`, :class:`ToolCall`) rendered as stream events or a JSON body,
what :mod:`dispatch_nb.testing` and the repository's loopback fake answer with.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from ..errors import APIConnectionError, error_for_status
from ..sse import ServerSentEvent
from ..types import Response, StreamDelta, ToolDefinition, Usage
from .base import WireFormat
from .request import ChatRequest, output_tool_choice

if TYPE_CHECKING:
    from ..stream import Accumulator

__all__ = [
    "CANONICAL_OPTIONS",
    "CanonicalWire",
    "Fail",
    "ToolCall",
    "Turn",
    "canonical_body",
    "canonical_error_body",
    "canonical_error_event",
    "canonical_events",
    "last_user_text",
    "sse_event",
    "stream_events",
]

#: per-call options the canonical protocol carries (in the body's ``options``)
CANONICAL_OPTIONS = frozenset({"echo"})


# -- client: answers → deltas ----------------------------------------------------------------------
class CanonicalStreamParser:
    """Turns the canonical protocol's stream events into deltas through ``acc``."""

    __slots__ = ("acc", "complete")

    def __init__(self, acc: Accumulator) -> None:
        self.acc = acc
        self.complete = False

    def feed(self, event: ServerSentEvent) -> Iterable[StreamDelta]:
        data = event.json()
        kind = data.get("type")
        acc = self.acc
        if kind == "text":
            return (acc.text(data["text"]),)
        if kind == "thinking":
            return (acc.thinking(data["text"]),)
        if kind == "signature":
            acc.signature(data["signature"])
            return ()
        if kind == "tool_start":
            return (acc.tool_start(data["id"], data["id"], data["name"]),)
        if kind == "tool_delta":
            tool = acc.tool(data["id"])
            if tool is not None and tool.done:  # after its tool_end
                return acc.late_tool_delta(data["id"], data["fragment"])
            return (acc.tool_delta(data["id"], data["fragment"]),)
        if kind == "tool_end":
            return (acc.tool_end(data["id"]),)
        if kind == "block":
            acc.add_block(Response.model_validate({"content": [data["block"]]}).content[0])
            return ()
        if kind == "done":
            acc.stop_reason = data.get("stop_reason")
            acc.usage = Usage.model_validate(data.get("usage") or {})
            if data.get("model"):
                acc.model = data["model"]
            self.complete = True
            return ()
        if kind == "error":
            raise error_for_status(
                int(data.get("status") or 500),
                str(data.get("message") or "error in stream"),
                provider="fake",
                error_type=data.get("error_type"),
            )
        return ()  # unknown event types are ignored, as every provider may add some

    def end(self) -> Iterable[StreamDelta]:
        if not self.complete:
            raise APIConnectionError("the stream ended before the answer was complete", provider="fake")
        return ()


# -- client: the wire format -----------------------------------------------------------------------
@dataclass(frozen=True)
class CanonicalWire(WireFormat):
    """The canonical protocol: ``POST chat`` with the call's canonical types as JSON."""

    provider: str = "fake"

    name = "canonical"
    path = "chat"
    options = CANONICAL_OPTIONS
    #: how ``output=`` goes natively: the body's ``output`` (name, description, schema)
    native_output: ClassVar[str] = "canonical"

    def build_body(
        self, request: ChatRequest, model: str, *, output_mode: str | None = None
    ) -> dict[str, Any]:
        transport = ("extra_body", "extra_headers", "max_retries")
        options = {k: v for k, v in request.options.items() if k not in transport}
        tools = list(request.tools)
        if request.output is not None and output_mode == "tool":
            options["tool_choice"] = output_tool_choice(request)
            tools.append(request.output.tool_definition())
        body: dict[str, Any] = {
            "model": model,
            "messages": [m.model_dump(mode="json", exclude_none=True) for m in request.messages],
            "system": request.system,
            "tools": [t.model_dump(mode="json") if isinstance(t, ToolDefinition) else t for t in tools],
            "max_tokens": request.max_tokens,
            "temperature": request.temperature,
            "stream": request.stream,
            "options": options,
        }
        if request.output is not None and output_mode == "canonical":
            output = request.output
            body["output"] = {"name": output.name, "description": output.description,
                              "schema": output.schema}
        return body

    def stream_parser(self, acc: Accumulator) -> CanonicalStreamParser:
        return CanonicalStreamParser(acc)

    def parse_body(self, body: Any, acc: Accumulator) -> None:
        """Fill ``acc`` from a non-streamed answer (a :class:`~dispatch_nb.types.Response` as
        JSON)."""
        response = Response.model_validate(body)
        for block in response.content:
            if block.type == "text":
                acc.text(block.text)
            elif block.type == "tool_use":
                acc.tool_start(block.id, block.id, block.name)
                acc.tool_end(block.id, arguments=block.arguments)
            else:
                acc.add_block(block)
        acc.stop_reason = response.stop_reason
        acc.usage = response.usage
        if response.model:
            acc.model = response.model


# -- server: scripted answers → the protocol -------------------------------------------------------
@dataclass
class ToolCall:
    """A tool call the model makes. ``arguments`` as a str is sent raw (may be invalid JSON)."""

    id: str
    name: str
    arguments: dict[str, Any] | str = field(default_factory=dict)

    @property
    def arguments_json(self) -> str:
        return self.arguments if isinstance(self.arguments, str) else json.dumps(self.arguments)


@dataclass
class Fail:
    """An HTTP error reply (or, as ``Turn.error``, an error event inside a stream)."""

    status: int
    message: str = "something went wrong"
    error_type: str | None = None
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class Turn:
    """One scripted model answer: text, thinking, tool calls, usage, stop reason; streamed in
    ``chunk``-character text deltas, optionally cut by ``error`` after ``error_after`` events."""

    text: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    thinking: str | None = None
    signature: str | None = None
    redacted_thinking: list[str] = field(default_factory=list)
    stop_reason: str | None = None  # canonical; None → tool_use if tool calls else end_turn
    # Canonical usage, as in dispatch_nb.Usage: input_tokens EXCLUDES cache reads/writes.
    input_tokens: int = 12
    output_tokens: int = 7
    cache_read_tokens: int = 0
    cache_creation_tokens: int = 0
    model: str | None = None
    chunk: int = 4  # characters per text delta when streaming
    error_after: int | None = None  # replace the rest of the stream with an error event ...
    error: Fail | None = None  # ... this one

    @property
    def canonical_stop(self) -> str:
        if self.stop_reason:
            return self.stop_reason
        return "tool_use" if self.tool_calls else "end_turn"

    def text_pieces(self) -> list[str]:
        n = max(1, self.chunk)
        return [self.text[i : i + n] for i in range(0, len(self.text), n)]


# -- the canonical protocol, rendered (shared with the repository's loopback fake) ---------------
def _usage(turn: Turn) -> dict[str, int]:
    return {name: getattr(turn, name) for name in Usage.model_fields}


def canonical_events(turn: Turn, model: str | None) -> list[dict[str, Any]]:
    """The stream events (``{"type": ...}`` dicts) of ``turn``; ``model`` is the requested one."""
    events: list[dict[str, Any]] = []
    if turn.thinking is not None:
        events.append({"type": "thinking", "text": turn.thinking})
        if turn.signature is not None:
            events.append({"type": "signature", "signature": turn.signature})
    for data in turn.redacted_thinking:
        events.append({"type": "block", "block": {"type": "redacted_thinking", "data": data}})
    for piece in turn.text_pieces():
        events.append({"type": "text", "text": piece})
    for call in turn.tool_calls:
        events.append({"type": "tool_start", "id": call.id, "name": call.name})
        raw = call.arguments_json
        for i in range(0, len(raw), 5):
            events.append({"type": "tool_delta", "id": call.id, "fragment": raw[i : i + 5]})
        events.append({"type": "tool_end", "id": call.id})
    events.append({"type": "done", "stop_reason": turn.canonical_stop, "usage": _usage(turn),
                   "model": turn.model or model})
    return events


def canonical_body(turn: Turn, model: str | None) -> dict[str, Any]:
    """The JSON body of ``turn`` answered without streaming."""
    content: list[dict[str, Any]] = []
    if turn.thinking is not None:
        content.append({"type": "thinking", "thinking": turn.thinking,
                        "signature": turn.signature})
    content += [{"type": "redacted_thinking", "data": d} for d in turn.redacted_thinking]
    if turn.text:
        content.append({"type": "text", "text": turn.text})
    calls = [{"type": "tool_use", "id": c.id, "name": c.name,
              "arguments": c.arguments if isinstance(c.arguments, dict) else {}}
             for c in turn.tool_calls]
    content += calls
    return {"content": content, "tool_calls": calls, "stop_reason": turn.canonical_stop,
            "usage": _usage(turn), "model": turn.model or model}


def canonical_error_event(fail: Fail) -> dict[str, Any]:
    """The stream event that ends a stream with ``fail``."""
    return {"type": "error", "status": fail.status, "message": fail.message,
            "error_type": fail.error_type}


def canonical_error_body(fail: Fail) -> dict[str, Any]:
    """The JSON body of an HTTP error reply."""
    return {"error": {"message": fail.message, "type": fail.error_type or "error"}}


def sse_event(data: Any, event: str | None = None) -> bytes:
    """One server-sent-event frame."""
    payload = data if isinstance(data, str) else json.dumps(data)
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {payload}\n\n".encode()


def last_user_text(body: dict[str, Any] | None) -> str:
    """The text of the last user message of a canonical request body."""
    for message in reversed((body or {}).get("messages", [])):
        if message.get("role") != "user":
            continue
        content = message.get("content")
        if isinstance(content, str):
            return content
        texts = [b["text"] for b in content or [] if b.get("type") == "text"]
        if texts:
            return "".join(texts)
    return ""


def stream_events(turn: Turn, model: str | None) -> list[bytes]:
    """The SSE frames of a streamed answer, cut by ``turn.error`` when it has one."""
    events = canonical_events(turn, model)
    if turn.error is not None:
        cut = turn.error_after if turn.error_after is not None else len(events)
        events = [*events[:cut], canonical_error_event(turn.error)]
    return [sse_event(e) for e in events]


