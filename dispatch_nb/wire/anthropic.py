"""Anthropic's Messages API, sans-I/O: :class:`MessagesWire` builds the ``POST v1/messages`` body,
:class:`MessagesStreamParser` reads the answer (a non-streamed message is replayed through it, so
both build the same :class:`~dispatch_nb.types.Response`).

The rules (PROTOCOLS.md §6) are in docs/anthropic.md, "What the adapter does with your messages":
turns merged, the thinking round trip, unknown blocks and fields kept in
``provider_data["anthropic"]`` and sent back, cumulative usage, stop reasons, cut tool calls.
"""
from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import orjson

from ..errors import APIConnectionError, DispatchError, error_for_status
from ..types import (
    ImageBlock,
    RedactedThinkingBlock,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
    Usage,
)
from .base import WireFormat, answer_object, merge_delta, provider_entry
from .request import ChatRequest, output_tool_choice
from .schema import NOT_STRICT, is_recursive, map_schema, with_note

if TYPE_CHECKING:
    from ..sse import ServerSentEvent
    from ..stream import Accumulator
    from ..types import Message, StopReason, StreamDelta, ToolDefinition

__all__ = [
    "DEFAULT_MAX_TOKENS",
    "MESSAGES_OPTIONS",
    "PROVIDER_DATA_KEY",
    "MessagesQuirks",
    "MessagesStreamParser",
    "MessagesWire",
    "anthropic_schema",
    "error_status",
    "prompt_fields",
    "wire_messages",
]

#: ``max_tokens`` when a call gives none (the API requires the field)
DEFAULT_MAX_TOKENS = 4096
PROVIDER_DATA_KEY = "anthropic"

_STOP_REASONS: dict[str, StopReason] = {
    "end_turn": "end_turn",
    "max_tokens": "max_tokens",
    "stop_sequence": "stop_sequence",
    "tool_use": "tool_use",
    "pause_turn": "pause_turn",
    "refusal": "refusal",
    "model_context_window_exceeded": "max_tokens",
}

#: the HTTP status each Anthropic error type stands for (for in-stream ``error`` events)
_ERROR_STATUS: dict[str, int] = {
    "invalid_request_error": 400,
    "authentication_error": 401,
    "billing_error": 402,
    "permission_error": 403,
    "not_found_error": 404,
    "request_too_large": 413,
    "rate_limit_error": 429,
    "api_error": 500,
    "timeout_error": 504,
    "overloaded_error": 529,
}


def error_status(error_type: Any) -> int:
    """The HTTP status an Anthropic error type stands for (500 when unknown): for errors that
    arrive without one (in-stream ``error`` events, Message Batches' ``errored`` results)."""
    return _ERROR_STATUS.get(str(error_type), 500)


_PASS_THROUGH_OPTIONS = ("top_k", "metadata", "service_tier")


#: the fields of each known block type that its canonical block holds (the rest is "extra")
_KNOWN_FIELDS: dict[str, frozenset[str]] = {
    "text": frozenset({"type", "text"}),
    "thinking": frozenset({"type", "thinking", "signature"}),
    "tool_use": frozenset({"type", "id", "name", "input"}),
}
#: the block types that become canonical blocks (any other is kept verbatim, "raw")
_CANONICAL_TYPES = frozenset({"text", "thinking", "redacted_thinking", "tool_use"})
#: extra fields of a text block that go back on the next turn (the request accepts them)
_SENT_TEXT_EXTRA = frozenset({"citations"})


# -- Anthropic's JSON Schema dialect (output_config) --------------------------------------------
_ANTHROPIC_FORMATS = frozenset({"date-time", "time", "date", "duration", "email", "hostname", "uri",
                                "ipv4", "ipv6", "uuid"})
_ANTHROPIC_KEEP = frozenset({
    "type", "description", "title", "enum", "const", "anyOf", "allOf", "$ref", "$defs",
    "definitions", "properties", "required", "additionalProperties", "items", "format",
    "pattern", "default", "minItems",
})
#: constraints Anthropic does not take: dropped, noted in the description, checked by us
_ANTHROPIC_NOTE = frozenset({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf",
                             "minLength", "maxLength", "maxItems", "uniqueItems", "minProperties",
                             "maxProperties"})


def anthropic_schema(schema: Mapping[str, Any]) -> dict[str, Any]:
    """``schema`` the way Anthropic's ``output_config`` takes it (docs/structured-output.md);
    ``ValueError`` for what it cannot take: a recursive schema, a map type, ``not`` / ``if`` /
    ``patternProperties``."""
    if is_recursive(schema):
        raise ValueError("Anthropic's structured outputs do not take recursive schemas")

    def clean(node: dict[str, Any]) -> dict[str, Any]:
        if NOT_STRICT & node.keys():
            raise ValueError(
                f"Anthropic's structured outputs do not take {sorted(NOT_STRICT & node.keys())}"
            )
        if "oneOf" in node:
            node["anyOf"] = [*node.get("anyOf", []), *node.pop("oneOf")]
        dropped = {k: node.pop(k) for k in sorted(_ANTHROPIC_NOTE & node.keys())}
        for key in [k for k in node if k not in _ANTHROPIC_KEEP]:
            del node[key]
        if isinstance(node.get("minItems"), int) and node["minItems"] > 1:
            dropped["minItems"] = node.pop("minItems")
        if node.get("format") is not None and node["format"] not in _ANTHROPIC_FORMATS:
            dropped["format"] = node.pop("format")
        if node.get("type") == "object" or "properties" in node:
            extra = node.get("additionalProperties")
            if isinstance(extra, dict) and extra:
                raise ValueError("Anthropic's structured outputs do not take map types "
                                 "(additionalProperties with a schema)")
            node["additionalProperties"] = False
        return with_note(node, dropped)

    out: dict[str, Any] = map_schema(copy.deepcopy(dict(schema)), clean)
    return out


def _add_field(block: dict[str, Any], delta: Mapping[str, Any]) -> None:
    """Add a streamed field of a block (a citation, or a delta no rule covers) to its fields."""
    if delta.get("type") == "citations_delta" and "citation" in delta:
        block["citations"] = [*block.get("citations", ()), delta["citation"]]
    else:
        merge_delta(block, delta)


class MessagesStreamParser:
    """Turns Messages API stream events into deltas; also replays a non-streamed message. Every
    block ends as the non-streamed answer shows it (docs/anthropic.md): known deltas applied, any
    other merged by :func:`~dispatch_nb.wire.base.merge_delta`."""

    __slots__ = (
        "_extra", "_kinds", "_last_tool", "_raw", "_stopped", "_wire_usage", "acc", "complete",
    )

    def __init__(self, acc: Accumulator) -> None:
        self.acc = acc
        self.complete = False
        self._kinds: dict[int, str] = {}  # block index → its type, "raw" for one kept verbatim
        self._raw: dict[int, tuple[dict[str, Any], list[str]]] = {}
        self._extra: dict[int, dict[str, Any]] = {}  # known blocks' other fields
        #: stopped text and thinking blocks: their kind and other fields (for a late delta)
        self._stopped: dict[int, tuple[str, dict[str, Any]]] = {}
        self._wire_usage: dict[str, Any] = {}
        self._last_tool: int | None = None  # the tool_use block's index when it is the last block

    # -- SSE entry points ----------------------------------------------------------------------
    def feed(self, event: ServerSentEvent) -> Iterable[StreamDelta]:
        try:
            data = event.json()
        except ValueError:
            return ()  # empty, or not JSON: nothing we can use (robust parsing, PROTOCOLS §0)
        if not isinstance(data, dict):
            return ()
        if data.get("type") == "content_block_delta":  # most events: text, straight to _delta
            return self._delta(int(data.get("index", 0)), data.get("delta") or {})
        return self.handle(data, event.event)

    def end(self) -> Iterable[StreamDelta]:
        if not self.complete:
            raise APIConnectionError("the Anthropic stream ended before message_stop: the answer is "
                                     "incomplete", provider="anthropic")
        return ()

    # -- events ------------------------------------------------------------------------------------
    def handle(self, data: dict[str, Any], event_name: str | None = None) -> Iterable[StreamDelta]:
        """Process one event payload; returns the deltas it produced."""
        kind = data.get("type") or event_name
        if kind == "content_block_delta":
            return self._delta(int(data.get("index", 0)), data.get("delta") or {})
        if kind == "content_block_start":
            return self._start(int(data.get("index", 0)), data.get("content_block") or {})
        if kind == "content_block_stop":
            return self._stop(int(data.get("index", 0)))
        if kind == "message_start":
            # programmatic tool calling sends the whole answer here (content, stop_reason,
            # usage) and no content-block events: start from it, as the official SDKs do
            message = data.get("message") or {}
            self._message(message)
            return self._blocks(message.get("content"))
        if kind == "message_delta":
            delta = data.get("delta") or {}
            self._stop_reason(delta.get("stop_reason"), delta.get("stop_sequence"))
            self._update_usage(data.get("usage"))
        elif kind == "message_stop":
            self._ended()
        elif kind == "error":
            raise self._error(data.get("error") or {})
        # ping and event types added later are ignored (the docs say new ones may appear)
        return ()

    def _message(self, message: Mapping[str, Any]) -> None:
        acc = self.acc
        if message.get("model"):
            acc.model = str(message["model"])
        if message.get("id"):
            acc.provider_data = {**(acc.provider_data or {}), "id": message["id"]}
        self._update_usage(message.get("usage"))
        if message.get("stop_reason"):
            self._stop_reason(message["stop_reason"], message.get("stop_sequence"))

    def _update_usage(self, usage: Any) -> None:
        if not isinstance(usage, dict):
            return
        # Cumulative: a later value replaces an earlier one; nothing is added up.
        wire = self._wire_usage
        wire.update({k: v for k, v in usage.items() if isinstance(v, int)})
        self.acc.usage = Usage(
            input_tokens=wire.get("input_tokens", 0),
            output_tokens=wire.get("output_tokens", 0),
            cache_read_tokens=wire.get("cache_read_input_tokens", 0),
            cache_creation_tokens=wire.get("cache_creation_input_tokens", 0),
        )

    def _stop_reason(self, reason: Any, stop_sequence: Any) -> None:
        if not reason:
            return
        acc = self.acc
        acc.stop_reason = _STOP_REASONS.get(str(reason))
        extra: dict[str, Any] = {}
        if acc.stop_reason != reason:
            extra["stop_reason"] = reason
        if stop_sequence is not None:
            extra["stop_sequence"] = stop_sequence
        if extra:
            acc.provider_data = {**(acc.provider_data or {}), **extra}

    def _error(self, error: Mapping[str, Any]) -> DispatchError:
        etype = str(error.get("type") or "api_error")
        details = error.get("details")
        if isinstance(details, dict) and isinstance(details.get("error_code"), str):
            etype = details["error_code"]
        message = str(error.get("message") or etype)
        return error_for_status(error_status(error.get("type")), message, provider="anthropic",
                                error_type=etype)

    def _ended(self) -> None:
        """The message is complete. A tool call that is its last block when it stopped at
        ``max_tokens`` was cut off while its arguments were being written: it stays, with an
        argument error (a session answers it with that error instead of running it)."""
        self.complete = True
        index = self._last_tool
        if self.acc.stop_reason == "max_tokens" and index is not None:
            tool = self.acc.tool(index)
            name = tool.name if tool is not None else "the tool"
            self.acc.tool_cut(index, (
                f"the answer reached max_tokens while the arguments of {name} were being "
                "written, so they are incomplete (a larger max_tokens, or a smaller call, avoids "
                "it)"))

    # -- content blocks ----------------------------------------------------------------------------
    def _blocks(self, content: Any) -> list[StreamDelta]:
        """Complete content blocks (a non-streamed message, or one ``message_start`` holds)."""
        out: list[StreamDelta] = []
        for index, block in enumerate(content or []):
            if isinstance(block, dict):
                out.extend(self._start(index, block))
                out.extend(self._stop(index))
        return out

    def _start(self, index: int, block: dict[str, Any]) -> Iterable[StreamDelta]:
        acc = self.acc
        btype = str(block.get("type"))
        self._last_tool = index if btype == "tool_use" else None
        self._kinds[index] = btype if btype in _CANONICAL_TYPES else "raw"
        known = _KNOWN_FIELDS.get(btype)
        if known is not None:  # its other fields, but empty ones (a stream fills them by deltas)
            self._extra[index] = {k: v for k, v in block.items()
                                  if k not in known and v not in (None, "", [], {})}
        if btype == "text":
            text = block.get("text") or ""
            return (acc.text(text, key=index),) if text else ()
        if btype == "thinking":
            out: list[StreamDelta] = []
            if block.get("thinking"):
                out.append(acc.thinking(block["thinking"], key=index))
            if block.get("signature"):
                acc.signature(block["signature"], key=index)
            return out
        if btype == "redacted_thinking":
            acc.redacted_thinking(str(block.get("data", "")))
            return ()
        if btype == "tool_use":
            start = acc.tool_start(index, str(block.get("id", "")), str(block.get("name", "")))
            given = block.get("input")
            if isinstance(given, dict) and given:
                self._raw[index] = (given, [])  # a non-streamed body: arguments arrive whole
            return (start,)
        self._raw[index] = (dict(block), [])
        return ()

    def _delta(self, index: int, delta: Mapping[str, Any]) -> Iterable[StreamDelta]:
        acc = self.acc
        dtype = delta.get("type")
        if dtype == "text_delta":
            return (acc.text(str(delta.get("text", "")), key=index),)
        kind = self._kinds.get(index)
        if dtype == "thinking_delta":
            return (acc.thinking(str(delta.get("thinking", "")), key=index),)
        if dtype == "signature_delta":
            acc.signature(str(delta.get("signature", "")), key=index)
            return ()
        if dtype == "input_json_delta":
            fragment = str(delta.get("partial_json", ""))
            if kind == "tool_use":
                return (acc.tool_delta(index, fragment),) if fragment else ()
            if kind is None and fragment and acc.tool(index) is not None:
                return acc.late_tool_delta(index, fragment)  # after its content_block_stop
            if kind == "raw":
                self._raw[index][1].append(fragment)
            return ()
        # Nothing to show, but the block must end as the non-streamed answer has it.
        target = self._raw[index][0] if kind == "raw" else self._extra.get(index)
        if target is not None:
            _add_field(target, delta)
        elif index in self._stopped:  # after its content_block_stop: it joins the block's fields
            kind, extra = self._stopped[index]
            extra = {**extra}
            _add_field(extra, delta)
            self._prose_fields(kind, index, extra)
        return ()

    def _prose_fields(self, kind: str, index: int, extra: dict[str, Any]) -> None:
        """A stopped text or thinking block's other fields: on the block, and kept for a late
        delta of one."""
        self._stopped[index] = (kind, extra)
        if extra:
            ours = {PROVIDER_DATA_KEY: {"extra": extra}}
            if kind == "text":
                self.acc.text_provider_data(ours, key=index)
            else:
                self.acc.thinking_provider_data(ours, key=index)

    def _stop(self, index: int) -> Iterable[StreamDelta]:
        kind = self._kinds.pop(index, None)
        extra = self._extra.pop(index, None)
        if kind in ("text", "thinking"):
            self._prose_fields(kind, index, extra or {})
        ours = {PROVIDER_DATA_KEY: {"extra": extra}} if extra else None
        if kind == "tool_use":
            given = self._raw.pop(index, None)
            tool = self.acc.tool(index)
            if tool is not None and ours:
                tool.provider_data = ours
            if given is not None and tool is not None and not tool.parts:
                return (self.acc.tool_end(index, arguments=given[0]),)
            return (self.acc.tool_end(index),)  # "" parses as {}
        if kind == "raw":
            block, parts = self._raw.pop(index)
            if parts:
                raw = "".join(parts)
                try:
                    block["input"] = orjson.loads(raw) if raw.strip() else {}
                except orjson.JSONDecodeError:
                    block["input"] = {}
            self.acc.add_block(
                TextBlock(text="", provider_data={PROVIDER_DATA_KEY: {"block": block}})
            )
        return ()

    # -- a whole (non-streamed) message -------------------------------------------------------
    def replay(self, message: Mapping[str, Any]) -> None:
        """Fill the accumulator from a complete ``message`` object, as if it had streamed: a
        ``message_start`` that holds the whole answer, then ``message_stop``."""
        if message.get("type") == "error":
            raise self._error(message.get("error") or {})
        self.handle({"type": "message_start", "message": message})
        self._ended()


#: per-call options the Messages format understands (besides the common ones)
MESSAGES_OPTIONS = frozenset({"thinking", "stop_sequences", "betas", *_PASS_THROUGH_OPTIONS})


def prompt_fields(
    system: str | None, tools: Sequence[Any], options: Mapping[str, Any]
) -> dict[str, Any]:
    """``system``, ``tools``, ``tool_choice`` and ``thinking`` of a body (shared with the
    provider's token counting)."""
    out: dict[str, Any] = {}
    if system:
        out["system"] = system
    if tools:
        out["tools"] = [wire_tool(t) for t in tools]
    choice = options.get("tool_choice")
    if choice is not None:
        out["tool_choice"] = wire_tool_choice(choice)
    thinking = options.get("thinking")
    if thinking is not None and thinking is not False:
        if isinstance(thinking, bool) or not isinstance(thinking, (int, dict)):
            raise TypeError(
                "thinking must be a dict such as {'type': 'enabled', 'budget_tokens': 2048} "
                f"or a budget in tokens, not {thinking!r}"
            )
        if isinstance(thinking, int):
            thinking = {"type": "enabled", "budget_tokens": thinking}
        out["thinking"] = thinking
    return out


@dataclass(frozen=True)
class MessagesQuirks:
    """What one Messages server does its own way (a frozen description).

    ``default_max_tokens``: sent when a call gives no ``max_tokens`` (the API requires one);
    ``pass_through``: options copied into the body as they are."""

    default_max_tokens: int = DEFAULT_MAX_TOKENS
    pass_through: tuple[str, ...] = _PASS_THROUGH_OPTIONS


@dataclass(frozen=True)
class MessagesWire(WireFormat):
    """Anthropic's Messages API for one server: ``POST v1/messages``, its body, its parsers."""

    provider: str = "anthropic"
    quirks: MessagesQuirks = MessagesQuirks()

    name = "messages"
    path = "v1/messages"
    options = MESSAGES_OPTIONS
    native_output: ClassVar[str] = "output_config"

    def build_body(
        self, request: ChatRequest, model: str, *, output_mode: str | None = None
    ) -> dict[str, Any]:
        """The JSON body: ``output_mode`` ``"output_config"`` (a ``json_schema`` format) or
        ``"tool"`` (one tool whose input is the answer, forced with ``tool_choice`` — ``auto``
        plus an instruction when thinking is on: a forced tool is not allowed with thinking)."""
        options = request.options
        body: dict[str, Any] = {
            "model": model,
            "max_tokens": request.max_tokens or self.quirks.default_max_tokens,
            "messages": wire_messages(request.messages),
        }
        system, tools = request.system, request.tools
        if request.output is not None and output_mode == "tool":
            thinking = options.get("thinking")
            thinking_on = thinking not in (None, False) and not (
                isinstance(thinking, dict) and thinking.get("type") == "disabled"
            )
            options = {**options,
                       "tool_choice": output_tool_choice(request, can_force=not thinking_on)}
            tools = [*tools, request.output.tool_definition()]
            if thinking_on:
                note = request.output.tool_instructions()
                system = f"{system}\n\n{note}" if system else note
        body.update(prompt_fields(system, tools, options))
        if request.output is not None and output_mode == "output_config":
            body["output_config"] = {
                "format": {"type": "json_schema", "schema": anthropic_schema(request.output.schema)}
            }
        if request.stream:
            body["stream"] = True
        if request.temperature is not None:
            body["temperature"] = request.temperature
        if options.get("top_p") is not None:
            body["top_p"] = options["top_p"]
        stops = options.get("stop_sequences", options.get("stop"))
        if stops:
            body["stop_sequences"] = [stops] if isinstance(stops, str) else list(stops)
        for name in self.quirks.pass_through:
            if options.get(name) is not None:
                body[name] = options[name]
        return body

    def stream_parser(self, acc: Accumulator) -> MessagesStreamParser:
        return MessagesStreamParser(acc)

    def parse_body(self, body: Any, acc: Accumulator) -> None:
        MessagesStreamParser(acc).replay(answer_object(body, self.provider))


# -- canonical → wire ------------------------------------------------------------------------------
def wire_tool(tool: ToolDefinition | dict[str, Any]) -> dict[str, Any]:
    """A tool definition in Anthropic's shape; raw dicts (built-in tools) pass through."""
    if isinstance(tool, dict):
        return tool
    out: dict[str, Any] = {"name": tool.name, "input_schema": tool.parameters}
    if tool.description:
        out["description"] = tool.description
    return out


def wire_tool_choice(choice: Any) -> dict[str, Any]:
    """Neutral ``tool_choice`` → Anthropic's: ``auto``, ``none``, ``required`` (``any``) or a
    tool name; dicts in Anthropic's own shape (or OpenAI's function shape) are accepted too."""
    if isinstance(choice, dict):
        if choice.get("type") == "function":
            name = (choice.get("function") or {}).get("name") or choice.get("name")
            return {"type": "tool", "name": name}
        return choice
    if not isinstance(choice, str) or not choice:
        raise TypeError(f"tool_choice must be a string or a dict, not {choice!r}")
    if choice in ("auto", "none", "any", "required"):
        return {"type": "any" if choice == "required" else choice}
    return {"type": "tool", "name": choice}


def _foreign(block: Any) -> bool:
    """Whether the block carries another wire format's opaque data (and none of ours)."""
    data = block.provider_data
    return bool(data) and PROVIDER_DATA_KEY not in data


def _with_cache_control(out: dict[str, Any], block: Any) -> dict[str, Any]:
    cache_control = provider_entry(block, PROVIDER_DATA_KEY).get("cache_control")
    if cache_control is not None:
        out["cache_control"] = cache_control
    return out


def wire_block(block: Any) -> dict[str, Any] | None:
    """One canonical block in Anthropic's shape, or None when it must not be sent."""
    raw = provider_entry(block, PROVIDER_DATA_KEY).get("block")
    if isinstance(raw, dict):
        return dict(raw)
    if isinstance(block, TextBlock):
        if not block.text.strip():
            return None  # the API rejects empty and whitespace-only text blocks
        text: dict[str, Any] = {"type": "text", "text": block.text}
        extra = provider_entry(block, PROVIDER_DATA_KEY).get("extra")
        if isinstance(extra, dict):
            text.update({k: v for k, v in extra.items() if k in _SENT_TEXT_EXTRA})
        return _with_cache_control(text, block)
    if isinstance(block, ThinkingBlock):
        if not block.signature or _foreign(block):
            return None  # reasoning Anthropic did not sign cannot be verified: leave it out
        return {"type": "thinking", "thinking": block.thinking, "signature": block.signature}
    if isinstance(block, RedactedThinkingBlock):
        if _foreign(block):
            return None
        return {"type": "redacted_thinking", "data": block.data}
    if isinstance(block, ToolUseBlock):
        return _with_cache_control(
            {"type": "tool_use", "id": block.id, "name": block.name, "input": block.arguments},
            block,
        )
    if isinstance(block, ToolResultBlock):
        content: str | list[dict[str, Any]]
        if isinstance(block.content, str):
            content = block.content
        else:
            content = [  # text and images, as Anthropic's tool_result content takes them
                w for w in (
                    {"type": "text", "text": b.text} if isinstance(b, TextBlock) else wire_block(b)
                    for b in block.content if not isinstance(b, TextBlock) or b.text.strip()
                ) if w is not None
            ]
        out: dict[str, Any] = {"type": "tool_result", "tool_use_id": block.tool_use_id, "content": content}
        if block.is_error:
            out["is_error"] = True
        return _with_cache_control(out, block)
    if isinstance(block, ImageBlock):
        if block.is_url:
            source: dict[str, Any] = {"type": "url", "url": block.source}
        else:
            media_type, payload = block.as_base64()
            source = {"type": "base64", "media_type": media_type, "data": payload}
        return _with_cache_control({"type": "image", "source": source}, block)
    raise TypeError(f"Anthropic cannot send a {type(block).__name__}")


def wire_messages(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """Canonical history → Anthropic ``messages``: blocks converted, empty turns dropped,
    consecutive same-role turns merged, tool results first in each user turn."""
    out: list[dict[str, Any]] = []
    for message in messages:
        blocks = [w for w in (wire_block(b) for b in message.blocks) if w is not None]
        if not blocks:
            continue
        if out and out[-1]["role"] == message.role:
            out[-1]["content"].extend(blocks)
        else:
            out.append({"role": message.role, "content": blocks})
    for turn in out:
        if turn["role"] == "user":
            content = turn["content"]
            turn["content"] = [b for b in content if b.get("type") == "tool_result"] + [
                b for b in content if b.get("type") != "tool_result"
            ]
    return out
