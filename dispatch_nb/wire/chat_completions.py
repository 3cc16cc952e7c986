"""OpenAI chat.completions, sans-I/O: :class:`ChatCompletionsWire` (one server, described by a
frozen :class:`ChatQuirks`) builds the body, :class:`ChatStreamParser` reads the answer. The rules
both OpenAI formats share live here too. What is sent, the stream quirks survived and the opaque
data in ``provider_data["openai_chat"]``: docs/openai.md; the quirks: docs/providers.md.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import orjson

from ..errors import (
    APIConnectionError,
    DispatchError,
    error_for_status,
    option_refused,
)
from ..types import ImageBlock, TextBlock, ThinkingBlock, ToolDefinition, ToolResultBlock, ToolUseBlock, Usage
from .base import WireFormat, answer_object, merge_delta, provider_entry
from .openai_schema import openai_json_schema
from .request import ChatRequest, output_tool_choice

if TYPE_CHECKING:
    from ..sse import ServerSentEvent
    from ..stream import Accumulator
    from ..types import Message, StreamDelta

__all__ = [
    "CHAT_OPTIONS",
    "PROVIDER_DATA_KEY",
    "REASONING_FIELDS",
    "ChatCompletionsWire",
    "ChatQuirks",
    "ChatStreamParser",
    "chat_messages",
    "chat_usage",
    "openai_error",
    "tool_arguments_text",
    "tool_fields",
    "tool_result_text",
]

#: the key of this wire format's entry in a block's ``provider_data``
PROVIDER_DATA_KEY = "openai_chat"

#: delta/message fields that carry visible reasoning, in the order they are checked
REASONING_FIELDS: tuple[str, ...] = ("reasoning_content", "reasoning", "reasoning_text")

#: the field whose reasoning (with ``reasoning_opaque``) is echoed back when ``echo_reasoning``
ECHOED_REASONING_FIELD = "reasoning_text"

#: options :meth:`ChatCompletionsWire.build_body` understands (besides the common transport ones)
CHAT_OPTIONS = frozenset(
    {"tool_choice", "stop", "top_p", "parallel_tool_calls", "response_format", "reasoning"}
)


# -- request ---------------------------------------------------------------------------------------
def tool_result_text(block: ToolResultBlock) -> str:
    """A tool result as the text a model reads; errors are marked ``Error: ...`` (the OpenAI wire
    formats have no error flag). chat.completions tool messages carry text only, so an image
    is a note saying so."""
    text = block.text
    if block.images:
        text += (f"\n({len(block.images)} image(s) in this tool result could not be sent: "
                 "this API takes only text in tool results)")
    if block.is_error and not text.lower().startswith("error"):
        return f"Error: {text}"
    return text


def tool_arguments_text(block: ToolUseBlock) -> str:
    """A tool call's arguments as the JSON text both OpenAI wire formats carry: the model's own
    text when it did not parse (so the model sees what it sent), else the arguments encoded."""
    if block.arguments_error and block.raw_arguments is not None:
        return block.raw_arguments
    return orjson.dumps(block.arguments).decode()


def _tool_call(block: ToolUseBlock) -> dict[str, Any]:
    function: dict[str, Any] = {"name": block.name, "arguments": tool_arguments_text(block)}
    data = provider_entry(block, PROVIDER_DATA_KEY)
    if data.get("thought_signature"):
        function["thought_signature"] = data["thought_signature"]
    return {"id": block.id, "type": "function", "function": function}


def _merge(out: list[dict[str, Any]], message: dict[str, Any]) -> None:
    """Append ``message``, merging it into the previous one when both are user or assistant:
    string contents joined by a blank line, else one list of parts (empty text parts left out)."""
    prev = out[-1] if out else None
    role = message["role"]
    if prev is None or prev["role"] != role or role not in ("user", "assistant"):
        out.append(message)
        return
    a, b = prev["content"], message["content"]
    if isinstance(a, str) and isinstance(b, str):
        prev["content"] = f"{a}\n\n{b}" if a and b else a or b
    else:
        parts = [p for c in (a, b) for p in ([{"type": "text", "text": c}] if isinstance(c, str) else c)]
        prev["content"] = [p for p in parts if p.get("type") != "text" or p.get("text")]
    calls = [*prev.get("tool_calls", []), *message.get("tool_calls", [])]
    if calls:
        prev["tool_calls"] = calls
    for key in ("reasoning_text", "reasoning_opaque"):
        if key in message and key not in prev:
            prev[key] = message[key]


def chat_messages(
    messages: Sequence[Message],
    system: str | None = None,
    *,
    echo_reasoning: bool = False,
    reasoning_provider: str | None = None,
) -> list[dict[str, Any]]:
    """The ``messages`` array: system first, tool results as ``role: "tool"`` right after the
    assistant turn that asked, same-role neighbours merged, assistant content ``""`` not null.

    ``echo_reasoning``: send ``reasoning_text`` / ``reasoning_opaque`` back; with
    ``reasoning_provider`` only for thinking marked with that provider."""
    out: list[dict[str, Any]] = []
    if system:
        out.append({"role": "system", "content": system})
    for message in messages:
        blocks = message.blocks
        if message.role == "user":
            parts: list[dict[str, Any]] = []
            for block in blocks:
                if isinstance(block, ToolResultBlock):
                    out.append({"role": "tool", "tool_call_id": block.tool_use_id,
                                "content": tool_result_text(block)})
                elif isinstance(block, TextBlock):
                    parts.append({"type": "text", "text": block.text})
                elif isinstance(block, ImageBlock):
                    parts.append({"type": "image_url", "image_url": {"url": block.as_data_url()}})
            if parts:  # text-only content is a string (chat templates render lists verbatim)
                text_only = all(p["type"] == "text" for p in parts)
                content = "\n\n".join(p["text"] for p in parts) if text_only else parts
                _merge(out, {"role": "user", "content": content})
            continue
        answer_parts: list[dict[str, Any]] = []  # the content as parts, if it came as parts
        as_parts = False
        calls: list[dict[str, Any]] = []
        reasoning: list[str] = []
        opaque: str | None = None
        for block in blocks:
            data = provider_entry(block, PROVIDER_DATA_KEY)
            if isinstance(block, TextBlock):
                if isinstance(data.get("part"), dict):
                    as_parts = True
                    answer_parts.append(dict(data["part"]))
                elif block.text:
                    answer_parts.append({"type": "text", "text": block.text})
            elif isinstance(block, ToolUseBlock):
                calls.append(_tool_call(block))
            elif isinstance(block, ThinkingBlock):
                if data.get("field") == "content":
                    # thinking that came as a content part goes back as one (Mistral expects it)
                    as_parts = True
                    answer_parts.append({"type": "thinking",
                                         "thinking": [{"type": "text", "text": block.thinking}]})
                elif (
                    echo_reasoning
                    and data.get("field") == ECHOED_REASONING_FIELD
                    and (reasoning_provider is None or data.get("provider") == reasoning_provider)
                ):
                    reasoning.append(block.thinking)
                    if block.signature:
                        opaque = block.signature
        wire: dict[str, Any] = {"role": "assistant", "content": answer_parts if as_parts else
                                "".join(p["text"] for p in answer_parts)}
        if calls:
            wire["tool_calls"] = calls
        if reasoning or opaque:
            wire["reasoning_text"] = "".join(reasoning)
            if opaque:
                wire["reasoning_opaque"] = opaque
        if wire["content"] or calls or opaque:
            _merge(out, wire)
    return out


def chat_tools(
    tools: Sequence[ToolDefinition | dict[str, Any]], *, provider: str
) -> list[dict[str, Any]]:
    """Function tools as ``{"type": "function", "function": {...}}``; built-in tools are refused
    with a :class:`RequestError` (chat.completions servers cannot run them)."""
    out: list[dict[str, Any]] = []
    for tool in tools:
        if isinstance(tool, ToolDefinition):
            function: dict[str, Any] = {"name": tool.name, "parameters": tool.parameters}
            if tool.description:
                function["description"] = tool.description
            out.append({"type": "function", "function": function})
        elif tool.get("type") == "function" and isinstance(tool.get("function"), dict):
            out.append(dict(tool))  # already in chat.completions shape
        else:
            raise option_refused(
                f"the built-in tool {tool.get('type', '?')!r} only works with the OpenAI Responses "
                "API (backend='official'); a chat.completions server cannot run it. Remove it from "
                "tools= or use connect('openai:MODEL').",
                provider=provider,
            )
    return out


def tool_fields(
    tools: list[dict[str, Any]],
    tool_names: Sequence[str],
    options: Mapping[str, Any],
    *,
    provider: str,
    named: Callable[[str], dict[str, Any]],
) -> dict[str, Any]:
    """The ``tools``, ``tool_choice`` and ``parallel_tool_calls`` fields of a request body in
    either OpenAI wire format. ``tool_choice`` ``"auto"``, ``"none"``, ``"required"`` (``"any"``
    too) and wire dicts pass through; a tool name must name a tool of this call and becomes
    ``named(name)``, that format's shape. Without tools nothing is sent, and a ``tool_choice``
    that needs one is a :class:`RequestError`."""
    choice = options.get("tool_choice")
    if not tools:
        if choice not in (None, "auto", "none"):
            raise option_refused(
                f"tool_choice={choice!r} needs tools=; this call defines none", provider=provider
            )
        return {}
    if choice == "any":
        choice = "required"
    elif isinstance(choice, str) and choice not in ("auto", "none", "required"):
        if choice not in tool_names:
            raise option_refused(
                f"tool_choice={choice!r} names no tool of this call; tools: "
                f"{', '.join(tool_names) or '(none)'}",
                provider=provider,
            )
        choice = named(choice)
    elif not isinstance(choice, (str, dict, type(None))):
        raise TypeError(
            "tool_choice must be 'auto', 'none', 'required', a tool name or a dict, "
            f"not {type(choice).__name__}"
        )
    fields: dict[str, Any] = {"tools": tools}
    if choice is not None:
        fields["tool_choice"] = choice
    if options.get("parallel_tool_calls") is not None:
        fields["parallel_tool_calls"] = bool(options["parallel_tool_calls"])
    return fields


@dataclass(frozen=True)
class ChatQuirks:
    """What one chat.completions server does its own way (a frozen description, like pydantic-ai's
    model profiles; docs/providers.md tabulates the fields). The defaults suit llama.cpp, vLLM,
    Ollama, LM Studio and OpenAI itself."""

    max_tokens_field: str = "max_tokens"
    include_usage: bool = True
    echo_reasoning: bool = False
    reasoning_provider: str | None = None
    reasoning_fields: tuple[str, ...] = REASONING_FIELDS
    signature_field: str | None = "reasoning_opaque"
    schema_in_json_object: bool = False


# -- answers ---------------------------------------------------------------------------------------
def chat_usage(
    usage: Mapping[str, Any], input_field: str = "prompt_tokens", output_field: str = "completion_tokens"
) -> Usage:
    """chat.completions usage → :class:`Usage`: ``input_tokens`` excludes cached prompt tokens,
    which become ``cache_read_tokens`` (``cache_write_tokens``, where sent, become
    ``cache_creation_tokens``). The Responses API names the fields ``input_tokens`` /
    ``output_tokens`` (its details: ``input_tokens_details``)."""
    prompt = int(usage.get(input_field) or 0)
    details = usage.get(f"{input_field}_details") or {}
    cached = int(details.get("cached_tokens") or 0) if isinstance(details, dict) else 0
    written = int(details.get("cache_write_tokens") or 0) if isinstance(details, dict) else 0
    return Usage(
        input_tokens=max(0, prompt - cached - written),
        output_tokens=int(usage.get(output_field) or 0),
        cache_read_tokens=cached,
        cache_creation_tokens=written,
    )


def status_for_error_code(code: Any) -> int:
    """The HTTP status an in-stream error most likely stands for (they carry none, or an int)."""
    if isinstance(code, int) and 400 <= code < 600:
        return code
    text = str(code or "").lower()
    if any(k in text for k in ("rate_limit", "quota", "too_many")):
        return 429
    if any(k in text for k in ("auth", "api_key", "permission")):
        return 401
    if text.startswith("invalid") or any(
        k in text for k in ("context_length", "exceed_context", "bad_request", "not_found")
    ):
        return 400
    return 500


def openai_error(error: Any, *, provider: str) -> DispatchError:
    """The :class:`DispatchError` for an error inside a 200 answer in either OpenAI format: a
    chat.completions ``{"error": ...}`` chunk, a Responses ``error`` event or ``response.error``."""
    if isinstance(error, dict) and isinstance(error.get("error"), dict):
        error = error["error"]  # {"type": "error", "error": {...}}
    if not isinstance(error, dict):
        return error_for_status(500, str(error or "the server reported an error"),
                                provider=provider)
    message = str(error.get("message") or "the server reported an error")
    code = error.get("code")
    etype = error.get("type")
    status = error.get("status")
    if not isinstance(status, int):
        status = status_for_error_code(code if code is not None else etype)
        if status == 500 and etype:
            status = status_for_error_code(etype)
    provider_type = code if isinstance(code, str) and code else etype
    return error_for_status(status, message, provider=provider, error_type=provider_type or None)


def completion_chunk(body: Mapping[str, Any]) -> dict[str, Any]:
    """A non-streamed ``chat.completion`` as one stream chunk: every choice, whole tool calls."""
    chunk: dict[str, Any] = {k: body[k] for k in ("error", "model", "usage") if k in body}
    chunk["choices"] = []
    for choice in body.get("choices") or []:
        message = dict(choice.get("message") or {})
        if message.get("tool_calls"):
            message["tool_calls"] = [{**c, "index": i} for i, c in enumerate(message["tool_calls"])]
        chunk["choices"].append({"index": choice.get("index", 0), "delta": message,
                                 "finish_reason": choice.get("finish_reason") or "stop"})
    return chunk


def _part_block(part: dict[str, Any]) -> TextBlock:
    """A content part this module has no type for, kept verbatim (and sent back as it came)."""
    return TextBlock(text="", provider_data={PROVIDER_DATA_KEY: {"part": part}})


class ChatStreamParser:
    """Turns chat.completions SSE events into deltas through ``acc``, reading reasoning as the
    server's :class:`ChatQuirks` say."""

    __slots__ = (
        "_fn_seen",
        "_n",
        "_open_part",
        "_reasons",
        "_refused",
        "_slots",
        "_tool_choice",
        "acc",
        "complete",
        "finished",
        "provider",
        "quirks",
    )

    def __init__(self, acc: Accumulator, *, provider: str, quirks: ChatQuirks = ChatQuirks()) -> None:
        self.acc = acc
        self.provider = provider
        self.quirks = quirks
        #: True once ``[DONE]`` arrived
        self.complete = False
        #: True once every open tool call was closed and the stop reason set
        self.finished = False
        self._slots: dict[Any, tuple[str, str]] = {}  # (choice, index) → (acc key, call id)
        self._tool_choice: dict[str, int] = {}  # acc key → choice index
        self._n = 0
        self._reasons: set[str] = set()
        self._refused = False
        self._fn_seen = False
        self._open_part: tuple[Any, dict[str, Any]] | None = None  # unknown part being streamed

    # -- feeding ---------------------------------------------------------------------------------
    def feed(self, event: ServerSentEvent) -> Iterable[StreamDelta]:
        """Deltas for one SSE event; raises :class:`DispatchError` for an in-stream error."""
        raw = event.raw
        if not raw:
            return ()
        if raw == b"[DONE]":
            self.complete = True
            return self._finish()
        try:
            chunk = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return ()  # keep-alive junk: nothing to show
        if type(chunk) is not dict:
            return ()
        # the common chunk: one choice whose delta is text alone (what most of a stream is)
        choices = chunk.get("choices")
        if type(choices) is list and len(choices) == 1 and not chunk.get("usage"):
            choice = choices[0]
            delta = choice.get("delta") if type(choice) is dict else None
            if type(delta) is dict and len(delta) == 1 and not choice.get("finish_reason"):
                content = delta.get("content")
                if content and type(content) is str and not chunk.get("error"):
                    model = chunk.get("model")
                    if model:
                        self.acc.model = model
                    self._open_part = None
                    return (self.acc.text(content),)
        return self.feed_chunk(chunk)

    def feed_chunk(self, chunk: dict[str, Any]) -> list[StreamDelta]:
        """Deltas for one decoded chunk."""
        error = chunk.get("error")
        if error:
            raise openai_error(error, provider=self.provider)
        acc = self.acc
        model = chunk.get("model")
        if model:
            acc.model = model
        usage = chunk.get("usage")
        if usage:
            acc.usage = chat_usage(usage)
        choices = chunk.get("choices")
        if not choices:
            return []
        out: list[StreamDelta] = []
        for choice in choices:
            delta = choice.get("delta")
            cidx = choice.get("index", 0)
            if delta:
                self._delta(delta, cidx, out)
            reason = choice.get("finish_reason")
            if reason:
                self._reasons.add(reason)
                out.extend(acc.tool_end(key) for key, index in self._tool_choice.items()
                           if index == cidx and acc.has_tool(key))
        return out

    def _reasoning_data(self, field: str) -> dict[str, Any]:
        data: dict[str, Any] = {"field": field}
        if self.quirks.reasoning_provider:
            data["provider"] = self.quirks.reasoning_provider
        return {PROVIDER_DATA_KEY: data}

    def _delta(self, delta: dict[str, Any], cidx: int, out: list[StreamDelta]) -> None:
        acc = self.acc
        for field in self.quirks.reasoning_fields:
            text = delta.get(field)
            if text and isinstance(text, str):
                out.append(acc.thinking(text, key=("reasoning", field),
                                        provider_data=self._reasoning_data(field)))
        if self.quirks.signature_field:
            sig = delta.get(self.quirks.signature_field)
            if sig and isinstance(sig, str):
                acc.signature(sig, key=("reasoning", ECHOED_REASONING_FIELD),
                              provider_data=self._reasoning_data(ECHOED_REASONING_FIELD))
        content = delta.get("content")
        if content:
            if isinstance(content, str):
                self._open_part = None
                out.append(acc.text(content))
            elif isinstance(content, list):  # Mistral (and others) send a list of parts
                for part in content:
                    if isinstance(part, dict):
                        self._part(part, out)
        refusal = delta.get("refusal")
        if refusal and isinstance(refusal, str):
            self._refused = True
            out.append(acc.text(refusal))
        calls = delta.get("tool_calls")
        if calls:
            self._fn_seen = True
            for call in calls:
                self._tool_fragment(call, cidx, out)
        elif not self._fn_seen:
            legacy = delta.get("function_call")
            if legacy:
                self._tool_fragment({"index": "function_call", "function": legacy}, cidx, out)

    def _part(self, part: dict[str, Any], out: list[StreamDelta]) -> None:
        """One content part: ``text`` → text, ``thinking`` (Mistral: ``{"type": "thinking",
        "thinking": [{"type": "text", "text": ...}]}``) → thinking, any other type kept verbatim
        (consecutive pieces of one part in a stream merged into one)."""
        acc = self.acc
        ptype = part.get("type")
        if ptype in ("text", None) and isinstance(part.get("text"), str):
            self._open_part = None
            if part["text"]:
                out.append(acc.text(part["text"]))
            return
        if ptype == "thinking":
            self._open_part = None
            inner = part.get("thinking")
            pieces = [inner] if isinstance(inner, str) else [
                p.get("text") for p in inner or [] if isinstance(p, dict)
            ]
            for text in pieces:
                if isinstance(text, str) and text:
                    out.append(acc.thinking(text, key=("part", "thinking"),
                                            provider_data=self._reasoning_data("content")))
            return
        open_part = self._open_part
        if open_part is not None and open_part[1].get("type") == ptype:
            merged = dict(open_part[1])
            merge_delta(merged, part)
            acc.set_block(open_part[0], _part_block(merged))
            self._open_part = (open_part[0], merged)
            return
        self._n += 1
        key = ("part", self._n)
        acc.add_block(_part_block(dict(part)), key=key)
        self._open_part = (key, dict(part))

    def _tool_fragment(self, call: dict[str, Any], cidx: int, out: list[StreamDelta]) -> None:
        acc = self.acc
        slot = (cidx, call.get("index", 0))
        function = call.get("function") or {}
        call_id = call.get("id")
        name = function.get("name")
        current = self._slots.get(slot)
        # A new non-empty id on a slot is a new call (Copilot/Claude reuse index 0); the same id
        # repeated (llama-cpp-python repeats id and name on every chunk) continues the current one.
        if current is None or (call_id and call_id != current[1]):
            if current is None and not call_id and not name and not function.get("arguments"):
                return
            self._n += 1
            key = f"tool{self._n}"
            call_id = call_id or f"call_{self._n}"
            data = None
            if function.get("thought_signature"):
                data = {PROVIDER_DATA_KEY: {"thought_signature": function["thought_signature"]}}
            self._slots[slot] = (key, call_id)
            self._tool_choice[key] = cidx
            out.append(acc.tool_start(key, call_id, name or "", provider_data=data))
        else:
            key = current[0]
            tool = acc.tool(key)
            if tool is not None and name and not tool.name:
                tool.name = name
        arguments = function.get("arguments")
        if arguments and acc.has_tool(key):
            if isinstance(arguments, str):
                out.append(acc.tool_delta(key, arguments))
            elif isinstance(arguments, dict):  # a few servers send parsed arguments
                out.append(acc.tool_end(key, arguments=arguments))
        elif arguments and isinstance(arguments, str) and acc.tool(key) is not None:
            out.extend(acc.late_tool_delta(key, arguments))  # after its choice's finish_reason

    def _finish(self) -> list[StreamDelta]:
        if self.finished:
            return []
        self.finished = True
        acc = self.acc
        out = acc.end_open_tools()
        reasons = self._reasons  # every choice's finish_reason; the first rule that holds wins
        if self._refused:
            acc.stop_reason = "refusal"
        elif "content_filter" in reasons:
            acc.stop_reason = "content_filter"
        elif "length" in reasons:
            acc.stop_reason = "max_tokens"
        elif acc.tool_count or "tool_calls" in reasons or "function_call" in reasons:
            acc.stop_reason = "tool_use"
        elif reasons:
            acc.stop_reason = "end_turn"
        return out

    def end(self) -> Iterable[StreamDelta]:
        """The stream closed: finish the answer, or raise if it was cut before any finish."""
        if not self.complete and not self._reasons:
            raise APIConnectionError(
                "the stream ended before the answer was complete", provider=self.provider
            )
        return self._finish()


# -- the wire format object ------------------------------------------------------------------------
@dataclass(frozen=True)
class ChatCompletionsWire(WireFormat):
    """OpenAI chat.completions for one server: ``POST chat/completions``, its body, its parsers.
    ``provider``: the name errors carry; ``quirks``: the server's :class:`ChatQuirks`."""

    provider: str
    quirks: ChatQuirks = ChatQuirks()

    name = "chat.completions"
    path = "chat/completions"
    options = CHAT_OPTIONS
    output_modes = ("tool", "json_object", "prompt")

    @property
    def native_output(self) -> str:
        """How ``output=`` goes natively: ``response_format`` (``json_schema``), or ``json_object``
        with the schema when the server wants that (:attr:`ChatQuirks.schema_in_json_object`)."""
        return "json_object" if self.quirks.schema_in_json_object else "response_format"

    def with_quirks(self, **changes: Any) -> ChatCompletionsWire:
        """The same wire format with some quirks changed (the object itself never changes)."""
        return replace(self, quirks=replace(self.quirks, **changes))

    def build_body(
        self, request: ChatRequest, model: str, *, output_mode: str | None = None
    ) -> dict[str, Any]:
        """The JSON body of ``POST /chat/completions`` (its options: docs/openai.md);
        ``output_mode`` ``"response_format"``, ``"json_object"`` or ``"tool"`` sends
        ``request.output``, anything else nothing."""
        q, provider, options = self.quirks, self.provider, request.options
        n = (options.get("extra_body") or {}).get("n")
        if n is not None and n != 1:
            raise option_refused(
                f"n={n!r} asks for several answers in one call; dispatch_nb returns one answer per "
                "call: drop n from extra_body and make separate calls (batch() runs them in parallel)",
                provider=provider,
            )
        output = request.output if output_mode in ("response_format", "json_object", "tool") else None
        if output is not None and options.get("response_format") is not None:
            raise ValueError("pass output= or response_format=, not both")
        body: dict[str, Any] = {
            "model": model,
            "messages": chat_messages(request.messages, request.system, echo_reasoning=q.echo_reasoning,
                                      reasoning_provider=q.reasoning_provider),
            "stream": request.stream,
        }
        if request.stream and q.include_usage:
            body["stream_options"] = {"include_usage": True}
        if request.max_tokens is not None:
            body[q.max_tokens_field] = request.max_tokens
        if request.temperature is not None:
            body["temperature"] = request.temperature
        tool_list = list(request.tools)
        if output is not None and output_mode == "tool":
            options = {**options, "tool_choice": output_tool_choice(request)}
            tool_list.append(output.tool_definition())
        tools = chat_tools(tool_list, provider=provider)
        body.update(tool_fields(
            tools, [t["function"]["name"] for t in tools], options, provider=provider,
            named=lambda name: {"type": "function", "function": {"name": name}},
        ))
        for name in ("stop", "top_p", "response_format"):
            if options.get(name) is not None:
                body[name] = options[name]
        if output is not None and output_mode == "json_object":
            body["response_format"] = {"type": "json_object", "schema": output.schema}
        elif output is not None and output_mode == "response_format":
            body["response_format"] = {"type": "json_schema", "json_schema": openai_json_schema(output)}
        reasoning = options.get("reasoning")
        if isinstance(reasoning, str):
            body["reasoning_effort"] = reasoning
        elif isinstance(reasoning, dict) and reasoning.get("effort"):
            body["reasoning_effort"] = reasoning["effort"]
        return body

    def stream_parser(self, acc: Accumulator) -> ChatStreamParser:
        return ChatStreamParser(acc, provider=self.provider, quirks=self.quirks)

    def parse_body(self, body: Any, acc: Accumulator) -> None:
        """Fill ``acc`` from a ``chat.completion`` body, read as one chunk (every choice)."""
        parser = self.stream_parser(acc)
        parser.feed_chunk(completion_chunk(answer_object(body, self.provider)))
        parser._finish()

    def should_resend(self, error: DispatchError) -> ChatCompletionsWire | None:
        """With :attr:`ChatQuirks.schema_in_json_object` after llama-cpp-python's server refused
        ``json_schema`` (an HTTP 500 whose message is its validation of ``response_format.type``
        against ``text`` / ``json_object``); else None."""
        if (
            not self.quirks.schema_in_json_object
            and error.status_code in (400, 422, 500)
            and "response_format" in error.message
            and "json_object" in error.message
        ):
            return self.with_quirks(schema_in_json_object=True)
        return None
