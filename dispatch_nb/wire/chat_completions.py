"""OpenAI chat.completions, sans-I/O: canonical request → wire body, wire stream/body → deltas.

Used by the ``compatible`` backend of :class:`~dispatch_nb.providers.openai.OpenAIAdapter`
(llama.cpp, llama-cpp-python, vLLM, Ollama, LM Studio...) and by the GitHub Copilot adapter as a
:class:`ChatCompletionsWire`: the format for one server, built from a frozen :class:`ChatQuirks`
(what that server does its own way). Nothing here holds adapter state::

    wire = ChatCompletionsWire("compatible")                 # or ChatQuirks(...) for a server's ways
    body = wire.build_body(request, "llama3")
    parser = wire.stream_parser(acc)                         # feed(ServerSentEvent) -> deltas
    wire.parse_body(json_body, acc)

The functions underneath (:func:`build_chat_body`, :class:`ChatStreamParser`,
:func:`parse_chat_completion`) take the same quirks as plain keyword arguments.

The rules both OpenAI wire formats share live here too, and the Responses module imports them:
:func:`map_tool_choice` and :func:`tool_fields` (``tool_choice`` and the tools section of a
body), :func:`tool_arguments_text` and :func:`tool_result_text`.

Request rules: the system prompt is the first message; ``ToolUseBlock`` s become the assistant's
``tool_calls`` (content ``""``, never null: llama.cpp rejects null); each ``ToolResultBlock`` becomes a
``role: "tool"`` message placed right after the assistant turn; consecutive messages of the same role
are merged; text-only user content is a plain string (templates such as llama-cpp-python's
``chatml-function-calling`` render list content verbatim), images make it a list of ``text`` /
``image_url`` parts; streaming asks for ``stream_options.include_usage``. Built-in tools (dicts
without a ``name``, e.g. ``{"type": "web_search"}``) are refused before anything is sent.

Stream quirks survived (PROTOCOLS.md §3.4, §4, §7): id/name repeated on every tool-call chunk
(llama-cpp-python), one ``index`` reused for several calls with new ids (Claude via Copilot), calls
and text spread over several choices, ``finish_reason: "stop"`` with tool calls, usage on any chunk
or none at all, SSE comment pings, empty or null ``choices``, the deprecated ``function_call`` delta,
reasoning in ``reasoning_content`` / ``reasoning`` / ``reasoning_text`` (+ ``reasoning_opaque``),
``refusal``, ``[DONE]``, and ``{"error": ...}`` in the middle of a stream. Tool arguments are parsed
only when the call is complete; invalid JSON becomes ``ToolUseBlock.arguments_error``.

Content may be a list of parts (Mistral): ``text`` parts are text, ``thinking`` parts
(``{"type": "thinking", "thinking": [{"type": "text", "text": ...}]}``) a :class:`ThinkingBlock`
marked ``{"field": "content"}``, any other part type an empty :class:`TextBlock` holding the part
verbatim (``{"part": {...}}``; streamed pieces of one part merged). An assistant turn that came as
parts goes back as parts. ``n`` above 1 (through ``extra_body``) is refused: one answer per call.

Opaque data rides in ``provider_data["openai_chat"]``: on a :class:`ThinkingBlock` the field the
reasoning came in (``{"field": "reasoning_text"}``; ``reasoning_opaque`` is the block's
``signature``), on a :class:`ToolUseBlock` a Gemini ``thought_signature``. With
``echo_reasoning=True`` (Copilot) thinking that arrived as ``reasoning_text`` / ``reasoning_opaque``
is sent back on the next assistant message; ``reasoning_content`` is never echoed (DeepSeek-style
servers reject it in requests). ``reasoning_provider="copilot"`` marks the thinking a parser makes
(``{"field": ..., "provider": "copilot"}``) and makes ``chat_messages`` echo only thinking marked so,
never another server's signature.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar

import orjson

from ..errors import APIConnectionError, DispatchError, RequestError, error_for_status
from ..sse import ServerSentEvent
from ..stream import Accumulator
from ..types import (
    ImageBlock,
    Message,
    ModelInfo,
    StopReason,
    StreamDelta,
    TextBlock,
    ThinkingBlock,
    ToolDefinition,
    ToolResultBlock,
    ToolUseBlock,
    Usage,
)
from .base import WireRequest, post
from .openai_schema import openai_output_schema
from .request import ChatRequest, output_tool_choice

__all__ = [
    "CHAT_OPTIONS",
    "PROVIDER_DATA_KEY",
    "REASONING_FIELDS",
    "ChatCompletionsWire",
    "ChatQuirks",
    "ChatStreamParser",
    "build_chat_body",
    "chat_error",
    "chat_messages",
    "chat_response_format",
    "chat_stop_reason",
    "chat_tool_choice",
    "chat_tools",
    "chat_usage",
    "map_tool_choice",
    "parse_chat_completion",
    "parse_model_list",
    "status_for_error_code",
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

#: options :func:`build_chat_body` understands (besides the common transport ones)
CHAT_OPTIONS = frozenset(
    {"tool_choice", "stop", "top_p", "parallel_tool_calls", "response_format", "reasoning"}
)

_FINISH: dict[str, StopReason] = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "content_filter": "content_filter",
}


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
    data = (block.provider_data or {}).get(PROVIDER_DATA_KEY)
    if isinstance(data, dict) and data.get("thought_signature"):
        function["thought_signature"] = data["thought_signature"]
    return {"id": block.id, "type": "function", "function": function}


def _user_content(parts: list[dict[str, Any]]) -> str | list[dict[str, Any]]:
    if all(p["type"] == "text" for p in parts):
        return "\n\n".join(p["text"] for p in parts)
    return parts


def _merge(out: list[dict[str, Any]], message: dict[str, Any]) -> None:
    """Append ``message``, merging it into the previous one when both are user or assistant."""
    prev = out[-1] if out else None
    role = message["role"]
    if prev is None or prev["role"] != role or role not in ("user", "assistant"):
        out.append(message)
        return
    if role == "user":
        a, b = prev["content"], message["content"]
        if isinstance(a, str) and isinstance(b, str):
            prev["content"] = f"{a}\n\n{b}" if a and b else a or b
        else:
            la = [{"type": "text", "text": a}] if isinstance(a, str) else a
            lb = [{"type": "text", "text": b}] if isinstance(b, str) else b
            prev["content"] = [p for p in (*la, *lb) if p.get("type") != "text" or p["text"]]
        return
    a_text, b_text = prev.get("content") or "", message.get("content") or ""
    if isinstance(a_text, list) or isinstance(b_text, list):
        la = [{"type": "text", "text": a_text}] if isinstance(a_text, str) and a_text else a_text
        lb = [{"type": "text", "text": b_text}] if isinstance(b_text, str) and b_text else b_text
        prev["content"] = [*(la or []), *(lb or [])]
    else:
        prev["content"] = f"{a_text}\n\n{b_text}" if a_text and b_text else a_text or b_text
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
                    out.append(
                        {
                            "role": "tool",
                            "tool_call_id": block.tool_use_id,
                            "content": tool_result_text(block),
                        }
                    )
                elif isinstance(block, TextBlock):
                    parts.append({"type": "text", "text": block.text})
                elif isinstance(block, ImageBlock):
                    parts.append({"type": "image_url", "image_url": {"url": block.as_data_url()}})
            if parts:
                _merge(out, {"role": "user", "content": _user_content(parts)})
            continue
        texts: list[str] = []
        answer_parts: list[dict[str, Any]] = []  # the content as parts, if it came as parts
        as_parts = False
        calls: list[dict[str, Any]] = []
        reasoning: list[str] = []
        opaque: str | None = None
        for block in blocks:
            data = (block.provider_data or {}).get(PROVIDER_DATA_KEY)
            data = data if isinstance(data, dict) else {}
            if isinstance(block, TextBlock):
                if isinstance(data.get("part"), dict):
                    as_parts = True
                    answer_parts.append(dict(data["part"]))
                    continue
                texts.append(block.text)
                if block.text:
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
        content: str | list[dict[str, Any]] = answer_parts if as_parts else "".join(texts)
        wire: dict[str, Any] = {"role": "assistant", "content": content}
        if calls:
            wire["tool_calls"] = calls
        if reasoning or opaque:
            wire["reasoning_text"] = "".join(reasoning)
            if opaque:
                wire["reasoning_opaque"] = opaque
        if wire["content"] or calls or opaque:
            _merge(out, wire)
    return out


def _refuse_native(tool: Mapping[str, Any], provider: str) -> RequestError:
    kind = tool.get("type", "?")
    return RequestError(
        f"the built-in tool {kind!r} only works with the OpenAI Responses API (backend="
        f"'official'); a chat.completions server cannot run it. Remove it from tools= or use "
        f"connect('openai:MODEL').",
        provider=provider,
    )


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
            raise _refuse_native(tool, provider)
    return out


def map_tool_choice(
    choice: Any,
    tool_names: Sequence[str],
    *,
    provider: str,
    named: Callable[[str], dict[str, Any]],
) -> Any:
    """Neutral ``tool_choice`` → either OpenAI wire format: ``"auto"``, ``"none"``,
    ``"required"`` (``"any"`` too) and wire dicts pass through; a tool name must name a tool of
    this call and becomes ``named(name)``. ``None`` means "do not send"."""
    if choice is None or isinstance(choice, dict):
        return choice
    if choice in ("auto", "none", "required"):
        return choice
    if choice == "any":
        return "required"
    if isinstance(choice, str):
        if choice not in tool_names:
            raise RequestError(
                f"tool_choice={choice!r} names no tool of this call; tools: "
                f"{', '.join(tool_names) or '(none)'}",
                provider=provider,
            )
        return named(choice)
    raise TypeError(
        "tool_choice must be 'auto', 'none', 'required', a tool name or a dict, "
        f"not {type(choice).__name__}"
    )


def chat_tool_choice(choice: Any, tool_names: Sequence[str], *, provider: str) -> Any:
    """Neutral ``tool_choice`` (``"auto"``, ``"none"``, ``"required"``, a tool name, or a wire dict
    passed through) → chat.completions. ``None`` means "do not send"."""
    return map_tool_choice(
        choice, tool_names, provider=provider,
        named=lambda name: {"type": "function", "function": {"name": name}},
    )


def tool_fields(
    tools: list[dict[str, Any]],
    tool_names: Sequence[str],
    options: Mapping[str, Any],
    *,
    provider: str,
    tool_choice: Callable[..., Any],
) -> dict[str, Any]:
    """The ``tools``, ``tool_choice`` and ``parallel_tool_calls`` fields of a request body in
    either OpenAI wire format (``tool_choice``: :func:`chat_tool_choice` or its Responses twin).
    Without tools nothing is sent, and a ``tool_choice`` that needs one is a
    :class:`RequestError`."""
    choice = options.get("tool_choice")
    if not tools:
        if choice not in (None, "auto", "none"):
            raise RequestError(
                f"tool_choice={choice!r} needs tools=; this call defines none", provider=provider
            )
        return {}
    fields: dict[str, Any] = {"tools": tools}
    wire_choice = tool_choice(choice, tool_names, provider=provider)
    if wire_choice is not None:
        fields["tool_choice"] = wire_choice
    if options.get("parallel_tool_calls") is not None:
        fields["parallel_tool_calls"] = bool(options["parallel_tool_calls"])
    return fields


def chat_response_format(request: ChatRequest, output_mode: str) -> dict[str, Any]:
    """``response_format`` for structured output (``output=``): ``json_schema`` (OpenAI's shape,
    the schema made strict when it can be) or, for ``"json_object"``, llama-cpp-python's
    ``{"type": "json_object", "schema": ...}``."""
    output = request.output
    assert output is not None
    if output_mode == "json_object":
        return {"type": "json_object", "schema": output.schema}
    schema, strict = openai_output_schema(output)
    spec: dict[str, Any] = {"name": output.name, "schema": schema, "strict": strict}
    if output.description:
        spec["description"] = output.description
    return {"type": "json_schema", "json_schema": spec}


def build_chat_body(
    request: ChatRequest,
    model: str,
    *,
    provider: str,
    max_tokens_field: str = "max_tokens",
    include_usage: bool = True,
    echo_reasoning: bool = False,
    reasoning_provider: str | None = None,
    output_mode: str | None = None,
) -> dict[str, Any]:
    """The JSON body of ``POST /chat/completions`` for a call.

    ``max_tokens_field``: ``"max_tokens"`` (every compatible server, Copilot) or
    ``"max_completion_tokens"`` (official OpenAI reasoning models). ``echo_reasoning`` /
    ``reasoning_provider``: see :func:`chat_messages`. Options read from
    ``request.options``: ``tool_choice``, ``stop``, ``top_p``, ``parallel_tool_calls``,
    ``response_format`` and ``reasoning`` (sent as ``reasoning_effort``). ``output_mode`` (for
    ``request.output``): ``"response_format"`` / ``"json_object"`` (see
    :func:`chat_response_format`) or ``"tool"`` (a function the model must call); anything else
    sends nothing for it.
    """
    options = request.options
    n = (options.get("extra_body") or {}).get("n")
    if n is not None and n != 1:
        raise RequestError(
            f"n={n!r} asks for several answers in one call; dispatch_nb returns one answer per "
            "call: drop n from extra_body and make separate calls (batch() runs them in parallel)",
            provider=provider,
        )
    output = request.output if output_mode in ("response_format", "json_object", "tool") else None
    if output is not None and options.get("response_format") is not None:
        raise ValueError("pass output= or response_format=, not both")
    body: dict[str, Any] = {
        "model": model,
        "messages": chat_messages(
            request.messages,
            request.system,
            echo_reasoning=echo_reasoning,
            reasoning_provider=reasoning_provider,
        ),
        "stream": request.stream,
    }
    if request.stream and include_usage:
        body["stream_options"] = {"include_usage": True}
    if request.max_tokens is not None:
        body[max_tokens_field] = request.max_tokens
    if request.temperature is not None:
        body["temperature"] = request.temperature
    tool_list = list(request.tools)
    if output is not None and output_mode == "tool":
        options = {**options, "tool_choice": output_tool_choice(request)}
        tool_list.append(output.tool_definition())
    tools = chat_tools(tool_list, provider=provider)
    names = [t["function"]["name"] for t in tools]
    body.update(tool_fields(tools, names, options, provider=provider, tool_choice=chat_tool_choice))
    if options.get("stop") is not None:
        body["stop"] = options["stop"]
    if options.get("top_p") is not None:
        body["top_p"] = options["top_p"]
    if options.get("response_format") is not None:
        body["response_format"] = options["response_format"]
    if output is not None and output_mode in ("response_format", "json_object"):
        body["response_format"] = chat_response_format(request, output_mode)
    reasoning = options.get("reasoning")
    if isinstance(reasoning, str):
        body["reasoning_effort"] = reasoning
    elif isinstance(reasoning, dict) and reasoning.get("effort"):
        body["reasoning_effort"] = reasoning["effort"]
    return body


# -- responses -------------------------------------------------------------------------------------
def chat_usage(usage: Mapping[str, Any]) -> Usage:
    """chat.completions usage → :class:`Usage`: ``input_tokens`` excludes cached prompt tokens,
    which become ``cache_read_tokens`` (``cache_write_tokens``, where sent, become
    ``cache_creation_tokens``)."""
    prompt = int(usage.get("prompt_tokens") or 0)
    details = usage.get("prompt_tokens_details") or {}
    cached = int(details.get("cached_tokens") or 0) if isinstance(details, dict) else 0
    written = int(details.get("cache_write_tokens") or 0) if isinstance(details, dict) else 0
    return Usage(
        input_tokens=max(0, prompt - cached - written),
        output_tokens=int(usage.get("completion_tokens") or 0),
        cache_read_tokens=cached,
        cache_creation_tokens=written,
    )


def chat_stop_reason(finish_reason: str | None) -> StopReason | None:
    """One ``finish_reason`` → the canonical stop reason (unknown values → ``end_turn``)."""
    if not finish_reason:
        return None
    return _FINISH.get(finish_reason, "end_turn")


def _combined_stop(reasons: set[str], refused: bool, has_tools: bool) -> StopReason | None:
    if refused:
        return "refusal"
    if "content_filter" in reasons:
        return "content_filter"
    if "length" in reasons:
        return "max_tokens"
    if has_tools or "tool_calls" in reasons or "function_call" in reasons:
        return "tool_use"
    if reasons:
        return "end_turn"
    return None


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


def chat_error(error: Any, *, provider: str) -> DispatchError:
    """The :class:`DispatchError` for an ``{"error": ...}`` payload inside a 200 answer."""
    if not isinstance(error, dict):
        return error_for_status(500, str(error), provider=provider)
    message = str(error.get("message") or "the server reported an error mid-stream")
    code = error.get("code")
    etype = error.get("type")
    status = error.get("status") if isinstance(error.get("status"), int) else None
    if status is None:
        status = status_for_error_code(code if code is not None else etype)
        if status == 500 and etype:
            status = status_for_error_code(etype)
    provider_type = code if isinstance(code, str) and code else etype
    return error_for_status(
        status, message, provider=provider, error_type=provider_type or None
    )


#: the accumulator key of thinking that arrives as ``thinking`` content parts
THINKING_PART_KEY = ("part", "thinking")


def _part_block(part: dict[str, Any]) -> TextBlock:
    """A content part this module has no type for, kept verbatim (and sent back as it came)."""
    return TextBlock(text="", provider_data={PROVIDER_DATA_KEY: {"part": part}})


def _merged_part(first: Mapping[str, Any], more: Mapping[str, Any]) -> dict[str, Any]:
    """Two streamed pieces of one content part as one: strings appended, lists extended."""
    out = dict(first)
    for name, value in more.items():
        current = out.get(name)
        if name == "type":
            continue
        if isinstance(value, str) and isinstance(current, str):
            out[name] = current + value
        elif isinstance(value, list) and isinstance(current, list):
            out[name] = [*current, *value]
        else:
            out[name] = value
    return out


class ChatStreamParser:
    """Turns chat.completions SSE events into deltas through ``acc`` (see the module docstring).

    ``reasoning_fields``: delta fields read as visible reasoning; ``signature_field``: the field
    whose value becomes the thinking block's signature (Copilot's ``reasoning_opaque``);
    ``reasoning_provider``: added as ``"provider"`` to the thinking blocks' provider data.
    """

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
        "reasoning_fields",
        "reasoning_provider",
        "signature_field",
    )

    def __init__(
        self,
        acc: Accumulator,
        *,
        provider: str,
        reasoning_fields: Sequence[str] = REASONING_FIELDS,
        signature_field: str | None = "reasoning_opaque",
        reasoning_provider: str | None = None,
    ) -> None:
        self.acc = acc
        self.provider = provider
        self.reasoning_provider = reasoning_provider
        self.reasoning_fields = tuple(reasoning_fields)
        self.signature_field = signature_field
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
        if not isinstance(chunk, dict):
            return ()
        return self.feed_chunk(chunk)

    def feed_chunk(self, chunk: dict[str, Any]) -> list[StreamDelta]:
        """Deltas for one decoded chunk."""
        error = chunk.get("error")
        if error:
            raise chat_error(error, provider=self.provider)
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
                out.extend(self._end_tools(cidx))
        return out

    def _reasoning_data(self, field: str) -> dict[str, Any]:
        data: dict[str, Any] = {"field": field}
        if self.reasoning_provider:
            data["provider"] = self.reasoning_provider
        return {PROVIDER_DATA_KEY: data}

    def _delta(self, delta: dict[str, Any], cidx: int, out: list[StreamDelta]) -> None:
        acc = self.acc
        if len(delta) == 1:  # the common chunk, ``{"content": "..."}``: text and nothing else
            content = delta.get("content")
            if content and type(content) is str:
                self._open_part = None
                out.append(acc.text(content))
                return
        for field in self.reasoning_fields:
            text = delta.get(field)
            if text and isinstance(text, str):
                out.append(
                    acc.thinking(
                        text,
                        key=("reasoning", field),
                        provider_data=self._reasoning_data(field),
                    )
                )
        if self.signature_field:
            sig = delta.get(self.signature_field)
            if sig and isinstance(sig, str):
                acc.signature(
                    sig,
                    key=("reasoning", ECHOED_REASONING_FIELD),
                    provider_data=self._reasoning_data(ECHOED_REASONING_FIELD),
                )
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
                    out.append(acc.thinking(text, key=THINKING_PART_KEY,
                                            provider_data=self._reasoning_data("content")))
            return
        open_part = self._open_part
        if open_part is not None and open_part[1].get("type") == ptype:
            merged = _merged_part(open_part[1], part)
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

    def _end_tools(self, cidx: int) -> list[StreamDelta]:
        acc = self.acc
        return [
            acc.tool_end(key)
            for key, choice in self._tool_choice.items()
            if choice == cidx and acc.has_tool(key)
        ]

    def _finish(self) -> list[StreamDelta]:
        if self.finished:
            return []
        self.finished = True
        acc = self.acc
        out = acc.end_open_tools()
        stop = _combined_stop(self._reasons, self._refused, acc.tool_count > 0)
        if stop is not None:
            acc.stop_reason = stop
        return out

    def end(self) -> Iterable[StreamDelta]:
        """The stream closed: finish the answer, or raise if it was cut before any finish."""
        if not self.complete and not self._reasons:
            raise APIConnectionError(
                "the stream ended before the answer was complete", provider=self.provider
            )
        return self._finish()


def parse_chat_completion(
    body: Any,
    acc: Accumulator,
    *,
    provider: str,
    reasoning_fields: Sequence[str] = REASONING_FIELDS,
    signature_field: str | None = "reasoning_opaque",
    reasoning_provider: str | None = None,
) -> None:
    """Fill ``acc`` from a non-streamed ``chat.completion`` body (every choice is read)."""
    if not isinstance(body, dict):
        raise APIConnectionError(
            f"the server answered with an unexpected body: {str(body)[:200]!r}", provider=provider
        )
    parser = ChatStreamParser(
        acc,
        provider=provider,
        reasoning_fields=reasoning_fields,
        signature_field=signature_field,
        reasoning_provider=reasoning_provider,
    )
    chunk: dict[str, Any] = {k: body[k] for k in ("error", "model", "usage") if k in body}
    choices = []
    for choice in body.get("choices") or []:
        message = dict(choice.get("message") or {})
        calls = message.get("tool_calls")
        if calls:
            message["tool_calls"] = [{**c, "index": i} for i, c in enumerate(calls)]
        choices.append(
            {
                "index": choice.get("index", 0),
                "delta": message,
                "finish_reason": choice.get("finish_reason") or "stop",
            }
        )
    chunk["choices"] = choices
    parser.feed_chunk(chunk)
    parser._finish()


def parse_model_list(body: Any) -> list[ModelInfo]:
    """``GET /models`` (``{"object": "list", "data": [...]}``) → :class:`ModelInfo` s."""
    data = body.get("data") if isinstance(body, dict) else body
    out: list[ModelInfo] = []
    for item in data or []:
        if not isinstance(item, dict) or not item.get("id"):
            continue
        extra: dict[str, Any] = {}
        if item.get("created"):
            extra["created"] = item["created"]
        meta = item.get("meta")
        if isinstance(meta, dict) and meta.get("n_ctx_train"):
            extra["n_ctx_train"] = meta["n_ctx_train"]
        arch = item.get("architecture")
        vision = isinstance(arch, dict) and "image" in (arch.get("input_modalities") or [])
        out.append(
            ModelInfo(
                id=str(item["id"]),
                name=str(item.get("name") or item["id"]),
                vendor=item.get("owned_by"),
                supports_vision=vision,
                **extra,
            )
        )
    return out


# -- the wire format object ------------------------------------------------------------------------
@dataclass(frozen=True)
class ChatQuirks:
    """What one chat.completions server does its own way (a frozen description, like pydantic-ai's
    model profiles). The defaults suit llama.cpp, vLLM, Ollama, LM Studio and OpenAI itself.

    ``max_tokens_field``: ``"max_tokens"`` or ``"max_completion_tokens"`` (OpenAI's reasoning
    models). ``include_usage``: ask for ``stream_options.include_usage`` when streaming.
    ``echo_reasoning`` / ``reasoning_provider``: send ``reasoning_text`` / ``reasoning_opaque`` back
    on the next assistant message, only for thinking marked with ``reasoning_provider`` (Copilot),
    which the parser also marks its thinking with (see :func:`chat_messages`).
    ``reasoning_fields``: delta fields read as visible reasoning; ``signature_field``: the field
    whose value becomes the thinking block's signature. ``schema_in_json_object``: structured
    output as ``{"type": "json_object", "schema": ...}`` instead of ``json_schema``
    (llama-cpp-python's server, which refuses ``json_schema``).
    """

    max_tokens_field: str = "max_tokens"
    include_usage: bool = True
    echo_reasoning: bool = False
    reasoning_provider: str | None = None
    reasoning_fields: tuple[str, ...] = REASONING_FIELDS
    signature_field: str | None = "reasoning_opaque"
    schema_in_json_object: bool = False


@dataclass(frozen=True)
class ChatCompletionsWire:
    """OpenAI chat.completions for one server: ``POST chat/completions``, its body, its parsers.

    ``provider``: the name errors carry; ``quirks``: the server's :class:`ChatQuirks`::

        wire = ChatCompletionsWire("compatible")
        wire.build_body(request, "llama3")                  # the JSON body
        wire.stream_parser(acc).feed(event)                  # deltas
        ChatCompletionsWire("copilot", ChatQuirks(echo_reasoning=True, reasoning_provider="copilot"))
    """

    provider: str
    quirks: ChatQuirks = ChatQuirks()

    #: the format's name (the adapter's backend in logs)
    name: ClassVar[str] = "chat.completions"
    #: where requests go, relative to the base URL
    path: ClassVar[str] = "chat/completions"
    #: the per-call options the format understands
    options: ClassVar[frozenset[str]] = CHAT_OPTIONS
    #: the structured-output modes a call may ask for besides ``auto`` / ``native``
    output_modes: ClassVar[tuple[str, ...]] = ("tool", "json_object", "prompt")

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
        q = self.quirks
        return build_chat_body(
            request, model, provider=self.provider, max_tokens_field=q.max_tokens_field,
            include_usage=q.include_usage, echo_reasoning=q.echo_reasoning,
            reasoning_provider=q.reasoning_provider, output_mode=output_mode,
        )

    def wire_request(
        self,
        request: ChatRequest,
        model: str,
        *,
        output_mode: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> WireRequest:
        return post(self, self.build_body(request, model, output_mode=output_mode), headers)

    def stream_parser(self, acc: Accumulator) -> ChatStreamParser:
        q = self.quirks
        return ChatStreamParser(
            acc, provider=self.provider, reasoning_fields=q.reasoning_fields,
            signature_field=q.signature_field, reasoning_provider=q.reasoning_provider,
        )

    def parse_body(self, body: Any, acc: Accumulator) -> None:
        q = self.quirks
        parse_chat_completion(
            body, acc, provider=self.provider, reasoning_fields=q.reasoning_fields,
            signature_field=q.signature_field, reasoning_provider=q.reasoning_provider,
        )

    def should_resend(self, error: DispatchError) -> ChatCompletionsWire | None:
        """The wire format to resend a request with after ``error``, when the error shows a quirk
        this description did not know (else None). llama-cpp-python's server validates
        ``response_format.type`` against ``text`` / ``json_object`` and answers ``json_schema``
        with an error (HTTP 500 whose message is that validation error): the answer is these
        quirks with :attr:`ChatQuirks.schema_in_json_object`."""
        if (
            not self.quirks.schema_in_json_object
            and error.status_code in (400, 422, 500)
            and "response_format" in error.message
            and "json_object" in error.message
        ):
            return self.with_quirks(schema_in_json_object=True)
        return None
