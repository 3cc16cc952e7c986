"""The OpenAI Responses API, sans-I/O: :class:`ResponsesWire` builds the ``POST /responses`` body,
:class:`ResponsesStreamParser` reads the answer (events, or a whole Response object).

What is sent and what comes back (stateless ``input``, reasoning items and the ids that pair them,
other output items kept verbatim in their place, stop reasons, usage): docs/openai.md. Streamed
parts are keyed by ``output_index``, never by ``item_id`` (Copilot rotates it); ``output_item.done``'s
complete item replaces what its index streamed.
"""

from __future__ import annotations

import functools
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import orjson

from ..errors import APIConnectionError, option_refused
from ..types import ImageBlock, TextBlock, ThinkingBlock, ToolDefinition, ToolResultBlock, ToolUseBlock
from .base import WireFormat, answer_object, provider_entry
from .chat_completions import (
    chat_usage,
    openai_error,
    tool_arguments_text,
    tool_fields,
    tool_result_text,
)
from .openai_schema import openai_json_schema, openai_output_schema
from .request import ChatRequest, output_tool_choice

if TYPE_CHECKING:
    from ..sse import ServerSentEvent
    from ..stream import Accumulator
    from ..types import Message, StreamDelta

__all__ = [
    "PROVIDER_DATA_KEY",
    "RESPONSES_OPTIONS",
    "ResponsesQuirks",
    "ResponsesStreamParser",
    "ResponsesWire",
    "is_reasoning_model",
    "responses_input",
]

#: the key of this wire format's entry in a block's ``provider_data``
PROVIDER_DATA_KEY = "openai_responses"

#: options :meth:`ResponsesWire.build_body` understands (besides the common transport ones)
RESPONSES_OPTIONS = frozenset(
    {"tool_choice", "top_p", "parallel_tool_calls", "reasoning", "response_format", "text"}
)

#: the smallest ``max_output_tokens`` the API accepts
MIN_OUTPUT_TOKENS = 16

_NON_REASONING_PREFIXES = ("gpt-4", "gpt-3.5", "chatgpt-", "gpt-5-chat", "ft:gpt-4", "ft:gpt-3.5",
                           "davinci", "babbage")


def is_reasoning_model(model: str) -> bool:
    """Whether ``model`` produces reasoning items (and accepts ``reasoning.encrypted_content``):
    every model but the known non-reasoning families (``gpt-4*``, ``chatgpt-*``...)."""
    name = model.lower().rsplit("/", 1)[-1]
    return not name.startswith(_NON_REASONING_PREFIXES)


# -- request ---------------------------------------------------------------------------------------
def _assistant_items(
    blocks: Sequence[Any], include_reasoning: bool, issuer: str | None = None
) -> list[dict[str, Any]]:
    """One assistant turn → output items, in the order the model produced them: reasoning and
    verbatim items as they came, messages and function calls rebuilt from their blocks; what is
    left out and why (reasoning of another ``issuer``...): docs/openai.md, "What is sent"."""
    items: list[dict[str, Any]] = []
    texts: list[TextBlock] = []
    paired = False  # a reasoning item was sent: this turn's items carry their ids
    reasoning_left_out = False

    def ours(data: Mapping[str, Any]) -> bool:
        return issuer is None or data.get("issuer") in (None, issuer)

    def flush() -> None:
        if not texts:
            return
        data = provider_entry(texts[0], PROVIDER_DATA_KEY)
        text = "".join(t.text for t in texts)
        item: dict[str, Any] = {"type": "message", "role": "assistant",
                                "content": [{"type": "output_text", "text": text, "annotations": []}]}
        if paired and data.get("id"):
            item["id"] = data["id"]
            item["status"] = "completed"
        if data.get("phase"):
            item["phase"] = data["phase"]
        items.append(item)
        texts.clear()

    for block in blocks:
        if isinstance(block, TextBlock):
            data = provider_entry(block, PROVIDER_DATA_KEY)
            kept = data.get("item")
            if isinstance(kept, dict):
                flush()
                if ours(data) and not reasoning_left_out:
                    items.append(dict(kept))
                continue
            if not block.text and block.provider_data and not data:
                continue  # another wire format's opaque block (e.g. Anthropic's server tools)
            if texts and provider_entry(texts[0], PROVIDER_DATA_KEY).get("id") != data.get("id"):
                flush()
            texts.append(block)
        elif isinstance(block, ThinkingBlock):
            data = provider_entry(block, PROVIDER_DATA_KEY)
            reasoning = data.get("item")
            if not (isinstance(reasoning, dict) and reasoning.get("id")):
                continue  # another provider's reasoning: nothing this API could verify
            if include_reasoning and ours(data):
                flush()
                items.append(dict(reasoning))
                paired = True
            else:
                reasoning_left_out = True
        elif isinstance(block, ToolUseBlock):
            flush()
            item = {"type": "function_call", "call_id": block.id, "name": block.name,
                    "arguments": tool_arguments_text(block)}
            fc_id = provider_entry(block, PROVIDER_DATA_KEY).get("id")
            if paired and fc_id:
                item["id"] = fc_id
            items.append(item)
    flush()
    # A reasoning item must be followed by the item it produced: drop one left dangling.
    while items and items[-1].get("type") == "reasoning":
        items.pop()
    return items


def responses_input(
    messages: Sequence[Message], *, include_reasoning: bool = True, issuer: str | None = None
) -> list[dict[str, Any]]:
    """The ``input`` items for a conversation (docs/openai.md, "What is sent"); reasoning items
    issued by another provider than ``issuer`` are left out."""
    items: list[dict[str, Any]] = []
    for message in messages:
        blocks = message.blocks
        if message.role == "assistant":
            items.extend(_assistant_items(blocks, include_reasoning, issuer))
            continue
        parts: list[dict[str, Any]] = []
        for block in blocks:
            if isinstance(block, ToolResultBlock):
                items.append({"type": "function_call_output", "call_id": block.tool_use_id,
                              "output": _tool_output(block)})
            elif isinstance(block, (TextBlock, ImageBlock)):
                parts.append(_input_part(block))
        if parts:
            items.append({"type": "message", "role": "user", "content": parts})
    return items


def _input_part(block: TextBlock | ImageBlock) -> dict[str, Any]:
    if isinstance(block, ImageBlock):
        detail = (block.provider_data or {}).get("detail", "auto")
        return {"type": "input_image", "image_url": block.as_data_url(), "detail": detail}
    return {"type": "input_text", "text": block.text}


def _tool_output(block: ToolResultBlock) -> str | list[dict[str, Any]]:
    """A ``function_call_output``'s ``output``: the text, or with images a list of
    ``input_text`` / ``input_image`` items."""
    if not block.images or isinstance(block.content, str):
        return tool_result_text(block)
    items = [{"type": "input_text", "text": "Error:"}] if block.is_error else []
    return items + [_input_part(p) for p in block.content if isinstance(p, ImageBlock) or p.text]


def responses_tools(tools: Sequence[ToolDefinition | dict[str, Any]]) -> list[dict[str, Any]]:
    """Flat function tools; built-in tool dicts (``{"type": "web_search"}``) pass through."""
    out: list[dict[str, Any]] = []
    for tool in tools:
        if isinstance(tool, ToolDefinition):
            item: dict[str, Any] = {"type": "function", "name": tool.name,
                                    "parameters": tool.parameters, "strict": False}
            if tool.description:
                item["description"] = tool.description
            out.append(item)
        elif tool.get("type") == "function" and isinstance(tool.get("function"), dict):
            fn = tool["function"]  # chat.completions shape → flat
            out.append({"type": "function", "name": fn["name"], "description": fn.get("description"),
                        "parameters": fn.get("parameters") or {"type": "object", "properties": {}},
                        "strict": bool(fn.get("strict", False))})
        else:
            out.append(dict(tool))
    return out


def _text_format(response_format: Mapping[str, Any]) -> dict[str, Any]:
    """A chat.completions ``response_format`` → the Responses ``text.format``."""
    schema = response_format.get("json_schema")
    if response_format.get("type") != "json_schema" or not isinstance(schema, dict):
        return dict(response_format)
    kept = {k: schema[k] for k in ("schema", "strict", "description") if k in schema}
    return {"type": "json_schema", "name": schema.get("name", "response"), **kept}


# -- responses -------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=64)
def _output_key(index: int) -> str:
    """The block key of an ``output_index`` (one string per index: keys compare by identity)."""
    return f"output{index}"


class ResponsesStreamParser:
    """Turns Responses API SSE events into deltas through ``acc``; blocks end in
    ``output_index`` order, whatever order the events came in."""

    __slots__ = (
        "_args",
        "_final",
        "_indexes",
        "_items_seen",
        "_key_of_id",
        "_other_items",
        "_paired",
        "_reasoning_at",
        "_refused",
        "_summary_index",
        "acc",
        "complete",
        "provider",
    )

    def __init__(self, acc: Accumulator, *, provider: str) -> None:
        self.acc = acc
        self.provider = provider
        #: True once a terminal event (completed / incomplete) arrived
        self.complete = False
        self._summary_index: dict[str, tuple[str, int]] = {}
        self._args: dict[str, list[str]] = {}
        #: block keys whose complete item arrived (output_item.done, arguments.done): final
        self._final: set[str] = set()
        self._refused = False
        self._items_seen = 0
        self._other_items: list[dict[str, Any]] = []
        self._indexes: dict[Hashable, int] = {}  # block key → output_index
        self._key_of_id: dict[str, str] = {}  # item id → block key (events without an index)
        self._reasoning_at: int | None = None  # the first reasoning item's output_index
        #: messages / function calls whose ids go back if a reasoning item comes before them:
        #: (output_index, kind, block key, item id, message phase)
        self._paired: list[tuple[int, str, str, str, Any]] = []

    def feed(self, event: ServerSentEvent) -> Iterable[StreamDelta]:
        """Deltas for one SSE event; raises :class:`DispatchError` for a failure event."""
        raw = event.raw
        if not raw or raw == b"[DONE]":
            return ()
        try:
            data = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return ()
        if not isinstance(data, dict):
            return ()
        kind = data.get("type")
        acc = self.acc
        if kind == "response.output_text.delta":
            index = data.get("output_index")  # self._key(data), inlined: most events are these
            key = _output_key(index) if type(index) is int else self._key(data)
            if key in self._final:
                return ()  # late: the complete item, already shown, holds it
            return (acc.text(data.get("delta", ""), key=key),)
        if kind == "response.function_call_arguments.delta":
            key = self._key(data)
            if acc.has_tool(key):
                return (acc.tool_delta(key, data.get("delta", "")),)
            if acc.tool(key) is None:  # (after its .done: the arguments it gave hold it)
                self._args.setdefault(key, []).append(data.get("delta", ""))
            return ()
        if kind in ("response.reasoning_summary_text.delta", "response.reasoning_text.delta"):
            return self._thinking(data, kind)
        if kind == "response.refusal.delta":
            self._refused = True
            key = self._key(data)
            return () if key in self._final else (acc.text(data.get("delta", ""), key=key),)
        if kind == "response.output_item.added":
            item = data.get("item") or {}
            key, _ = self._place(item, data)
            return self._start_call(key, item) if item.get("type") == "function_call" else []
        if kind == "response.output_item.done":
            return self.item_done(data.get("item") or {}, data)
        if kind == "response.function_call_arguments.done":
            key = self._key(data)
            if acc.has_tool(key) and isinstance(data.get("arguments"), str):
                return self._end_call(key, data["arguments"])
            return ()
        if kind in ("response.created", "response.in_progress", "response.queued"):
            self._response_meta(data.get("response") or {})
            return ()
        if kind in ("response.completed", "response.incomplete"):
            self.complete = True
            return self.finalize(data.get("response") or {})
        if kind == "response.failed":
            response = data.get("response") or {}
            raise openai_error(response.get("error"), provider=self.provider)
        if kind == "error":
            raise openai_error(data, provider=self.provider)
        # content_part / annotation events, built-in tools' progress (web_search_call.searching,
        # code_interpreter_call_code.delta...): the complete item arrives in output_item.done
        return ()

    # -- pieces ----------------------------------------------------------------------------------
    def _key(self, data: Mapping[str, Any]) -> str:
        """The block an item event belongs to: its ``output_index`` (Copilot rotates item ids from
        one event to the next). The ``item_id`` is used only when a server leaves the index out:
        the index its ``output_item.added`` gave that id, else the id itself."""
        index = data.get("output_index")
        if isinstance(index, int):
            return _output_key(index)
        item_id = str(data.get("item_id") or "")
        return self._key_of_id.get(item_id, item_id or "output0")

    def _place(self, item: Mapping[str, Any], data: Mapping[str, Any]) -> tuple[str, int]:
        """An item's block key and where it goes: its ``output_index`` (the key of its id from
        then on), else its place in arrival order."""
        index = data.get("output_index")
        item_id = str(item.get("id") or "")
        if isinstance(index, int):
            key = _output_key(index)
            if item_id:
                self._key_of_id[item_id] = key
        else:
            key = self._key_of_id.get(item_id, item_id or "output0")
            index = self._indexes.get(key, len(self._indexes))
        self._indexes[key] = index
        if item.get("type") == "reasoning" and (
            self._reasoning_at is None or index < self._reasoning_at
        ):
            self._reasoning_at = index
        return key, index

    def _response_meta(self, response: Mapping[str, Any]) -> None:
        if response.get("model"):
            self.acc.model = response["model"]
        if response.get("id"):
            self.acc.provider_data = {PROVIDER_DATA_KEY: {"id": response["id"]}}

    def _thinking(self, data: Mapping[str, Any], kind: str) -> tuple[StreamDelta, ...]:
        key = self._key(data)
        if key in self._final:
            return ()  # late: the complete item, already shown, holds it
        delta = data.get("delta", "")
        index = data.get("summary_index", data.get("content_index", 0))
        last = self._summary_index.get(key)
        self._summary_index[key] = (kind, index)
        if last is not None and last != (kind, index):
            delta = "\n\n" + delta  # a new summary part
        return (self.acc.thinking(delta, key=key),)

    def _complete_text(self, key: str, text: str, *, thinking: bool = False) -> list[StreamDelta]:
        """The complete text of the block at ``key`` (its item is done): it is the block's text;
        what of it had not streamed streams now (a delta that was late, or never sent), so the
        stream shows what the answer holds. A delta for ``key`` after this is not added twice."""
        acc = self.acc
        self._final.add(key)
        shown = acc.shown_text(key)
        if shown is None or (text.startswith(shown) and text != shown):
            rest = text[len(shown or ""):]
            return [acc.thinking(rest, key=key) if thinking else acc.text(rest, key=key)]
        acc.replace_text(key, text)  # a server that rewrote what it streamed: its final word
        return []

    def _end_call(self, key: str, arguments: str | None) -> list[StreamDelta]:
        """A function call's complete arguments (``None``: none given, the fragments are all):
        what of them had not streamed streams now, then the call ends."""
        acc = self.acc
        self._final.add(key)
        tool = acc.tool(key)
        out: list[StreamDelta] = []
        if arguments is not None and tool is not None:
            shown = "".join(tool.parts)
            if arguments.startswith(shown) and arguments != shown:
                out.append(acc.tool_delta(key, arguments[len(shown):]))
        out.append(acc.tool_end(key, raw_arguments=arguments))
        return out

    def _start_call(self, key: str, item: Mapping[str, Any]) -> list[StreamDelta]:
        acc = self.acc
        if acc.tool(key) is not None:
            return []
        call_id = str(item.get("call_id") or item.get("id") or key)
        out = [acc.tool_start(key, call_id, str(item.get("name") or ""))]
        for fragment in self._args.pop(key, []):
            out.append(acc.tool_delta(key, fragment))
        return out

    def item_done(self, item: Mapping[str, Any], data: Mapping[str, Any]) -> list[StreamDelta]:
        """Record one complete output item (``output_item.done``, or a body's output), which
        replaces what its ``output_index`` streamed: a message, reasoning or function call
        becomes its block; any other item an empty :class:`TextBlock` keeping it verbatim."""
        acc = self.acc
        self._items_seen += 1
        kind = item.get("type")
        item_id = str(item.get("id") or "")
        key, index = self._place(item, data)
        out: list[StreamDelta] = []
        if kind == "message":
            if item_id:
                self._paired.append((index, "message", key, item_id, item.get("phase")))
            texts: list[str] = []
            for part in item.get("content") or []:
                if part.get("type") == "output_text" and part.get("text"):
                    texts.append(part["text"])
                elif part.get("type") == "refusal":
                    self._refused = True
                    if part.get("refusal"):
                        texts.append(part["refusal"])
            if texts:
                out.extend(self._complete_text(key, "".join(texts)))
            if item.get("phase"):
                acc.text_provider_data({PROVIDER_DATA_KEY: {"phase": item["phase"]}}, key=key)
        elif kind == "reasoning":
            texts = [s.get("text", "") for s in item.get("summary") or []]
            texts += [c.get("text", "") for c in item.get("content") or []]
            text = "\n\n".join(t for t in texts if t)
            if text:
                out.extend(self._complete_text(key, text, thinking=True))
            if item.get("encrypted_content"):
                acc.signature(str(item["encrypted_content"]), key=key)
            acc.thinking_provider_data(
                {PROVIDER_DATA_KEY: {"item": dict(item), "issuer": self.provider}}, key=key
            )
        elif kind == "function_call":
            if item_id:
                self._paired.append((index, "function_call", key, item_id, None))
            out.extend(self._start_call(key, item))
            if acc.has_tool(key):
                arguments = item.get("arguments")
                out.extend(self._end_call(key, arguments if isinstance(arguments, str) else None))
        elif kind:
            self._other_items.append(dict(item))
            ours = {"item": dict(item), "issuer": self.provider}
            acc.add_block(TextBlock(text="", provider_data={PROVIDER_DATA_KEY: ours}), key=key)
        return out

    def finalize(self, response: Mapping[str, Any]) -> list[StreamDelta]:
        """The terminal response object: usage, stop reason, anything the stream left out."""
        acc = self.acc
        self._response_meta(response)
        out: list[StreamDelta] = []
        if self._items_seen == 0:  # a server that sent no item events: read the output
            for index, item in enumerate(response.get("output") or []):
                out.extend(self.item_done(item, {"output_index": index}))
        out.extend(acc.end_open_tools())
        acc.order_by(self._indexes)
        self._keep_paired_ids()
        usage = response.get("usage")
        if usage:
            acc.usage = chat_usage(usage, "input_tokens", "output_tokens")
        if response.get("status") == "failed":
            raise openai_error(response.get("error"), provider=self.provider)
        if response.get("status") == "incomplete":
            reason = (response.get("incomplete_details") or {}).get("reason")
            acc.stop_reason = "content_filter" if reason == "content_filter" else "max_tokens"
        elif self._refused:
            acc.stop_reason = "refusal"
        else:
            acc.stop_reason = "tool_use" if acc.tool_count else "end_turn"
        if self._other_items:
            data = acc.provider_data or {}
            ours = {**(data.get(PROVIDER_DATA_KEY) or {}), "output_items": self._other_items}
            acc.provider_data = {**data, PROVIDER_DATA_KEY: ours}
        return out

    def _keep_paired_ids(self) -> None:
        """The API pairs a reasoning item with the items after it by their ids: keep the ``msg_`` /
        ``fc_`` ids of the items a reasoning item comes before, by ``output_index`` (not by the
        order the events came in)."""
        first = self._reasoning_at
        if first is None:
            return
        acc = self.acc
        for index, kind, key, item_id, phase in self._paired:
            if index < first:
                continue
            ours: dict[str, Any] = {"id": item_id}
            if kind == "message":
                if phase:
                    ours["phase"] = phase
                acc.text_provider_data({PROVIDER_DATA_KEY: ours}, key=key)
            else:
                tool = acc.tool(key)
                if tool is not None:
                    tool.provider_data = {PROVIDER_DATA_KEY: ours}

    def end(self) -> Iterable[StreamDelta]:
        """The stream closed without ``response.completed``: the answer is incomplete."""
        if not self.complete:
            raise APIConnectionError(
                "the stream ended before the response was complete", provider=self.provider
            )
        return ()


# -- the wire format object ------------------------------------------------------------------------
@dataclass(frozen=True)
class ResponsesQuirks:
    """What one Responses server does its own way (a frozen description).

    ``encrypted_reasoning``: ask for (and send back) encrypted reasoning items; None decides per
    model (:func:`is_reasoning_model`; always on when the ``reasoning`` option is given)."""

    encrypted_reasoning: bool | None = None


@dataclass(frozen=True)
class ResponsesWire(WireFormat):
    """The OpenAI Responses API for one server: ``POST responses``, its body, its parsers.

    ``provider``: the name errors (and the reasoning items' issuer) carry; ``quirks``: the
    server's :class:`ResponsesQuirks`."""

    provider: str
    quirks: ResponsesQuirks = ResponsesQuirks()

    name = "responses"
    path = "responses"
    options = RESPONSES_OPTIONS
    native_output: ClassVar[str] = "text.format"

    def build_body(
        self, request: ChatRequest, model: str, *, output_mode: str | None = None
    ) -> dict[str, Any]:
        """The JSON body of ``POST /responses`` (its options: docs/openai.md); ``output_mode``
        ``"text.format"`` or ``"tool"`` sends ``request.output``, anything else nothing."""
        provider, options = self.provider, request.options
        if request.output is not None and output_mode in ("text.format", "tool") and (
            options.get("response_format") is not None or (options.get("text") or {}).get("format")
        ):
            raise ValueError("pass output= or response_format= / text={'format': ...}, not both")
        if options.get("stop") is not None:
            raise option_refused(
                "the OpenAI Responses API has no stop sequences; drop stop= or use a "
                "chat.completions server (backend='compatible')",
                provider=provider,
            )
        if request.max_tokens is not None and request.max_tokens < MIN_OUTPUT_TOKENS:
            raise option_refused(
                f"the OpenAI Responses API needs max_tokens >= {MIN_OUTPUT_TOKENS} "
                f"(max_output_tokens), not {request.max_tokens}",
                provider=provider,
            )
        reasoning = options.get("reasoning")
        encrypted_reasoning = self.quirks.encrypted_reasoning
        if encrypted_reasoning is None:
            encrypted_reasoning = reasoning is not None or is_reasoning_model(model)
        body: dict[str, Any] = {
            "model": model,
            "input": responses_input(request.messages, include_reasoning=encrypted_reasoning,
                                     issuer=provider),
            "stream": request.stream,
            "store": False,
        }
        if encrypted_reasoning:
            body["include"] = ["reasoning.encrypted_content"]
        if request.system:
            body["instructions"] = request.system
        if request.max_tokens is not None:
            body["max_output_tokens"] = request.max_tokens
        if request.temperature is not None:
            body["temperature"] = request.temperature
        if options.get("top_p") is not None:
            body["top_p"] = options["top_p"]
        tools = responses_tools(request.tools)
        if request.output is not None and output_mode == "tool":
            options = {**options, "tool_choice": output_tool_choice(request)}
            definition = request.output.tool_definition()
            schema, strict = openai_output_schema(request.output)
            tools.append({"type": "function", "name": definition.name,
                          "description": definition.description, "parameters": schema, "strict": strict})
        names = [t["name"] for t in tools if t.get("type") == "function" and "name" in t]
        body.update(tool_fields(tools, names, options, provider=provider,
                                named=lambda name: {"type": "function", "name": name}))
        if isinstance(reasoning, str):
            body["reasoning"] = {"effort": reasoning}
        elif isinstance(reasoning, dict):
            body["reasoning"] = dict(reasoning)
        text = dict(options.get("text") or {})
        if options.get("response_format") is not None:
            text["format"] = _text_format(options["response_format"])
        if request.output is not None and output_mode == "text.format":
            text["format"] = {"type": "json_schema", **openai_json_schema(request.output)}
        if text:
            body["text"] = text
        return body

    def stream_parser(self, acc: Accumulator) -> ResponsesStreamParser:
        return ResponsesStreamParser(acc, provider=self.provider)

    def parse_body(self, body: Any, acc: Accumulator) -> None:
        """Fill ``acc`` from a non-streamed Response object."""
        body = answer_object(body, self.provider)
        if body.get("error") and body.get("status") in (None, "failed"):
            raise openai_error(body["error"], provider=self.provider)
        ResponsesStreamParser(acc, provider=self.provider).finalize(body)  # reads its output
