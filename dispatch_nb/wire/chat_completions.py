"""OpenAI chat.completions, sans-I/O: :class:`ChatCompletionsWire` (the format for one server, built
from a frozen :class:`ChatQuirks`) builds the ``POST chat/completions`` body; the answer side
(:class:`ChatStreamParser`) is :mod:`~dispatch_nb.wire.chat_answers`, re-exported here. The rules
both OpenAI formats share (:func:`tool_fields`, :func:`tool_arguments_text`,
:func:`tool_result_text`) live here too.

What is sent, the stream quirks survived and the opaque data kept in
``provider_data["openai_chat"]``: docs/openai.md (PROTOCOLS.md §3.4, §4, §7); the quirks:
docs/providers.md.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import orjson

from ..errors import DispatchError, RequestError
from ..stream import Accumulator
from ..types import (
    ImageBlock,
    Message,
    TextBlock,
    ThinkingBlock,
    ToolDefinition,
    ToolResultBlock,
    ToolUseBlock,
)
from .base import WireBase
from .chat_answers import (
    ECHOED_REASONING_FIELD,
    PROVIDER_DATA_KEY,
    REASONING_FIELDS,
    ChatStreamParser,
    chat_usage,
    openai_error,
    parse_model_list,
)
from .openai_schema import openai_json_schema
from .request import ChatRequest, output_tool_choice

__all__ = [
    "CHAT_OPTIONS",
    "PROVIDER_DATA_KEY",
    "REASONING_FIELDS",
    "ChatCompletionsWire",
    "ChatQuirks",
    "ChatStreamParser",
    "chat_messages",
    "chat_tools",
    "chat_usage",
    "map_tool_choice",
    "openai_error",
    "parse_model_list",
    "tool_arguments_text",
    "tool_fields",
    "tool_result_text",
]

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
    data = (block.provider_data or {}).get(PROVIDER_DATA_KEY)
    if isinstance(data, dict) and data.get("thought_signature"):
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
            data = (block.provider_data or {}).get(PROVIDER_DATA_KEY)
            data = data if isinstance(data, dict) else {}
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
            raise RequestError(
                f"the built-in tool {tool.get('type', '?')!r} only works with the OpenAI Responses "
                "API (backend='official'); a chat.completions server cannot run it. Remove it from "
                "tools= or use connect('openai:MODEL').",
                provider=provider,
            )
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


def tool_fields(
    tools: list[dict[str, Any]],
    tool_names: Sequence[str],
    options: Mapping[str, Any],
    *,
    provider: str,
    named: Callable[[str], dict[str, Any]],
) -> dict[str, Any]:
    """The ``tools``, ``tool_choice`` and ``parallel_tool_calls`` fields of a request body in
    either OpenAI wire format (``named``: a tool name as that format's ``tool_choice``, see
    :func:`map_tool_choice`). Without tools nothing is sent, and a ``tool_choice`` that needs one
    is a :class:`RequestError`."""
    choice = options.get("tool_choice")
    if not tools:
        if choice not in (None, "auto", "none"):
            raise RequestError(
                f"tool_choice={choice!r} needs tools=; this call defines none", provider=provider
            )
        return {}
    fields: dict[str, Any] = {"tools": tools}
    wire_choice = map_tool_choice(choice, tool_names, provider=provider, named=named)
    if wire_choice is not None:
        fields["tool_choice"] = wire_choice
    if options.get("parallel_tool_calls") is not None:
        fields["parallel_tool_calls"] = bool(options["parallel_tool_calls"])
    return fields


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
class ChatCompletionsWire(WireBase):
    """OpenAI chat.completions for one server: ``POST chat/completions``, its body, its parsers.

    ``provider``: the name errors carry; ``quirks``: the server's :class:`ChatQuirks` (the module
    docstring shows its use)."""

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
        """The JSON body of ``POST /chat/completions``. Options read from ``request.options``:
        ``tool_choice``, ``stop``, ``top_p``, ``parallel_tool_calls``, ``response_format`` and
        ``reasoning`` (sent as ``reasoning_effort``). ``output_mode`` (for ``request.output``):
        ``"response_format"`` (``json_schema``, strict when the schema can be), ``"json_object"``
        (llama-cpp-python's ``{"type": "json_object", "schema": ...}``) or ``"tool"`` (a function
        the model must call); anything else sends nothing for it."""
        q, provider, options = self.quirks, self.provider, request.options
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
                echo_reasoning=q.echo_reasoning,
                reasoning_provider=q.reasoning_provider,
            ),
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
        q = self.quirks
        return ChatStreamParser(
            acc, provider=self.provider, reasoning_fields=q.reasoning_fields,
            signature_field=q.signature_field, reasoning_provider=q.reasoning_provider,
        )

    def parse_body(self, body: Any, acc: Accumulator) -> None:
        self.stream_parser(acc).parse_completion(body)

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
