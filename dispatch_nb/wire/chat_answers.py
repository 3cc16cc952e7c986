"""OpenAI chat.completions answers, sans-I/O: SSE events or a whole ``chat.completion`` body → deltas
(:class:`ChatStreamParser`); usage, stop reasons, in-stream errors and ``GET /models``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import orjson

from ..errors import APIConnectionError, DispatchError, error_for_status
from ..sse import ServerSentEvent
from ..stream import Accumulator
from ..types import ModelInfo, StopReason, StreamDelta, TextBlock, Usage
from .base import answer_object, merge_delta

__all__ = [
    "ECHOED_REASONING_FIELD",
    "PROVIDER_DATA_KEY",
    "REASONING_FIELDS",
    "ChatStreamParser",
    "chat_usage",
    "openai_error",
    "parse_model_list",
    "status_for_error_code",
]

#: the key of this wire format's entry in a block's ``provider_data``
PROVIDER_DATA_KEY = "openai_chat"

#: delta/message fields that carry visible reasoning, in the order they are checked
REASONING_FIELDS: tuple[str, ...] = ("reasoning_content", "reasoning", "reasoning_text")

#: the field whose reasoning (with ``reasoning_opaque``) is echoed back when ``echo_reasoning``
ECHOED_REASONING_FIELD = "reasoning_text"


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


class ChatStreamParser:
    """Turns chat.completions SSE events into deltas through ``acc``; ``reasoning_fields``,
    ``signature_field`` and ``reasoning_provider``: as in
    :class:`~dispatch_nb.wire.chat_completions.ChatQuirks`."""

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

    def parse_completion(self, body: Any) -> None:
        """Fill the accumulator from a non-streamed ``chat.completion`` body (every choice is
        read)."""
        body = answer_object(body, self.provider)
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
        self.feed_chunk(chunk)
        self._finish()


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
