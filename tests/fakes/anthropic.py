"""A fake Anthropic Messages API: the real wire format, and a validator as strict as the real one.

``POST /v1/messages`` answers scripted :class:`~tests.fakes.provider.Turn` s as a real Messages API
stream (``event:`` lines, ``ping`` events, cumulative ``message_delta`` usage, ``event: error``) or
as a ``message`` object; ``GET /v1/models`` pages through :attr:`AnthropicFake.models`;
``POST /v1/messages/count_tokens`` counts with :meth:`AnthropicFake.token_count`.

Like the real API, every request is checked first and rejected with a 400 ``invalid_request_error``
when it is wrong: ``max_tokens`` missing, a ``system`` (or any other) role inside ``messages``, roles
that do not alternate, empty turns or text blocks, a ``tool_result`` that does not answer a
``tool_use`` of the assistant turn just before it, a ``tool_use`` left unanswered, and — the point of
this fake — thinking that was not echoed verbatim: every ``thinking`` block's ``signature`` must be
one this fake issued, for exactly that thinking text; every ``redacted_thinking`` ``data`` must be
one it issued; and the assistant turn whose tool calls are being answered must carry the thinking
and redacted thinking blocks that came with those calls, all of them, in their original order,
before the ``tool_use``. A missing or wrong ``x-api-key`` is a 401.

:class:`AnthropicTurn` scripts the content blocks explicitly, blocks the adapter has no type for
included: a ``compaction`` block streams as ``content_block_start`` with ``"content": null`` and
``compaction_delta`` events (as api.anthropic.com streams it), ``server_tool_use`` with
``input_json_delta``, a text block with ``citations`` with ``citations_delta`` events; a block sent
back must be what was issued (a ``compaction`` block without its content is a 400).
``AnthropicTurn(start_holds_content=True)`` sends the whole answer inside ``message_start``, as
programmatic tool calling does. A :class:`ToolCall` whose ``arguments`` is a string streams that
string as it is (cut JSON, for a call that ``max_tokens`` interrupted); the non-streamed answer
then has ``"input": {}``.

Streams are split into one chunk per content delta (a text piece, a thinking piece, a tool-argument
fragment); structural events (``message_start``, ``ping``, ``content_block_start``/``stop``) ride
with the next delta. So ``Turn.error_after=2`` cuts the stream after two deltas, whatever the
protocol — the same as every other fake.
"""

from __future__ import annotations

import base64
import copy
import hashlib
import itertools
import json
from dataclasses import dataclass
from typing import Any, ClassVar

from .provider import Fail, LateKind, ProviderFake, Turn, sse_event
from .server import RecordedRequest, Reply

__all__ = ["ANTHROPIC_ERROR_TYPES", "COMPACTION", "SERVER_TOOL_USE", "WEB_SEARCH_RESULT",
           "AnthropicFake", "AnthropicTurn"]

ANTHROPIC_ERROR_TYPES: dict[int, str] = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    504: "timeout_error",
    529: "overloaded_error",
}

_BLOCK_TYPES = {"text", "image", "tool_use", "tool_result", "thinking", "redacted_thinking",
                "document", "server_tool_use", "web_search_tool_result", "compaction"}

#: block type → the string field its ``<type>_delta`` events fill (blocks streamed piece by piece
#: that the adapter has no rule for; the adapter must merge such deltas generically)
_STREAMED_FIELDS = {"compaction": "content"}

# -- content blocks of our own, from the documented block shapes -----------------------------------
#: what server-side context compaction leaves at the start of an answer
COMPACTION: dict[str, Any] = {
    "type": "compaction",
    "content": "Summary of the earlier conversation: the user is planning a trip to Lisbon in "
               "May and prefers trains to planes; they asked for a three-day itinerary.",
}
SERVER_TOOL_USE: dict[str, Any] = {
    "type": "server_tool_use", "id": "srvtoolu_fake01", "name": "web_search",
    "input": {"query": "Lisbon weather in May"},
}
WEB_SEARCH_RESULT: dict[str, Any] = {
    "type": "web_search_tool_result", "tool_use_id": "srvtoolu_fake01",
    "content": [{"type": "web_search_result", "url": "https://weather.example/lisbon",
                 "title": "Lisbon in May", "encrypted_content": "EqgfCioIARgBIiQ3fake",
                 "page_age": "April 30, 2026"}],
}


@dataclass
class AnthropicTurn(Turn):
    """A :class:`Turn` whose content blocks are listed explicitly, in order: block dicts (sent as
    they are; see the module docstring for how they stream) or the placeholders ``"thinking"``,
    ``"redacted"``, ``"text"`` and ``"tools"`` for the blocks the Turn's own fields make."""

    content: list[dict[str, Any] | str] | None = None
    #: stream the whole answer inside ``message_start`` (its ``content``, ``stop_reason`` and
    #: ``usage``), then ``message_stop``, with no content-block events: what programmatic tool
    #: calling sends when a tool call comes out of the code execution container
    start_holds_content: bool = False


def _invalid(message: str) -> Fail:
    return Fail(400, message, "invalid_request_error")


class _Chunks:
    """Builds the stream's chunk list: structural frames ride with the next delta frame."""

    def __init__(self) -> None:
        self.items: list[bytes] = []
        self.pending = b""

    def frame(self, data: dict[str, Any]) -> None:
        self.pending += sse_event(data, event=data["type"])

    def delta(self, data: dict[str, Any]) -> None:
        self.items.append(self.pending + sse_event(data, event=data["type"]))
        self.pending = b""

    def done(self) -> list[bytes]:
        if self.pending:
            self.items.append(self.pending)
            self.pending = b""
        return self.items


class AnthropicFake(ProviderFake):
    """``AnthropicFake(api_key="sk-ant-test")``; pass ``api_key=None`` to accept any key."""

    name = "anthropic"
    delta_markers: ClassVar[dict[LateKind, bytes]] = {
        "text": b'"type": "text_delta"', "thinking": b'"type": "thinking_delta"',
        "arguments": b'"type": "input_json_delta"'}

    def __init__(self, api_key: str | None = "sk-ant-test", page_size: int = 1000) -> None:
        super().__init__()
        self.api_key = api_key
        self.page_size = page_size
        self.models: list[dict[str, Any]] = [
            {"type": "model", "id": "claude-sonnet-4-5", "display_name": "Claude Sonnet 4.5",
             "created_at": "2025-09-29T00:00:00Z"},
            {"type": "model", "id": "claude-haiku-4-5", "display_name": "Claude Haiku 4.5",
             "created_at": "2025-10-01T00:00:00Z"},
        ]
        #: signature → the thinking text it was issued for
        self.issued_signatures: dict[str, str] = {}
        #: redacted_thinking data this fake issued
        self.issued_redacted: set[str] = set()
        #: tool_use id → the thinking / redacted_thinking blocks issued with it, in order
        self.issued_turns: dict[str, list[dict[str, Any]]] = {}
        #: every request this fake rejected, as the Fail it answered
        self.rejections: list[Fail] = []
        self._ids = itertools.count(1)

    def restart_ids(self) -> None:
        """Number messages from 1 again (so the same turn rendered twice is the same answer)."""
        self._ids = itertools.count(1)

    # -- routing -------------------------------------------------------------------------------
    def is_chat(self, request: RecordedRequest) -> bool:
        return request.method == "POST" and request.path == "/v1/messages"

    def route_other(self, request: RecordedRequest) -> Reply:
        problem = self._check_headers(request)
        if problem is not None:
            return self.render_error(problem)
        if request.method == "GET" and request.path == "/v1/models":
            return self._models_page(request)
        if request.method == "POST" and request.path == "/v1/messages/count_tokens":
            body = request.json if request.body else None
            if not isinstance(body, dict) or not isinstance(body.get("model"), str):
                return self.render_error(_invalid("model: Field required"))
            extra = set(body) - {"model", "messages", "system", "tools", "tool_choice", "thinking"}
            if extra:
                return self.render_error(
                    _invalid(f"{sorted(extra)[0]}: Extra inputs are not permitted"))
            problem = self._check_messages(body.get("messages"))
            if problem is not None:
                return self.render_error(problem)
            return Reply.json({"input_tokens": self.token_count(body)})
        return self.render_error(Fail(404, f"Not found: {request.method} {request.path}",
                                      "not_found_error"))

    def _models_page(self, request: RecordedRequest) -> Reply:
        limit = min(int(request.query.get("limit", ["20"])[0]), self.page_size)
        after = request.query.get("after_id", [None])[0]
        start = 0
        if after is not None:
            ids = [m["id"] for m in self.models]
            start = ids.index(after) + 1 if after in ids else len(ids)
        page = self.models[start : start + limit]
        return Reply.json({
            "data": page,
            "has_more": start + limit < len(self.models),
            "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None,
        })

    @staticmethod
    def token_count(body: dict[str, Any]) -> int:
        """What count_tokens answers: one token per 4 characters of the JSON prompt, plus 3."""
        prompt = {k: body.get(k) for k in ("system", "messages", "tools")}
        return len(json.dumps(prompt, sort_keys=True)) // 4 + 3

    # -- validation ----------------------------------------------------------------------------
    def validate(self, request: RecordedRequest) -> Fail | None:
        problem = self._check_headers(request) or self._check_body(request)
        if problem is not None:
            self.rejections.append(problem)
        return problem

    def _check_headers(self, request: RecordedRequest) -> Fail | None:
        if self.api_key is not None and request.header("x-api-key") != self.api_key:
            return Fail(401, "invalid x-api-key", "authentication_error")
        if not request.header("anthropic-version"):
            return _invalid("anthropic-version: header is required")
        return None

    def _check_body(self, request: RecordedRequest) -> Fail | None:
        try:
            body = request.json
        except ValueError:
            return _invalid("There was an error parsing the body as JSON")
        if not isinstance(body, dict):
            return _invalid("the body must be a JSON object")
        if not isinstance(body.get("model"), str) or not body["model"]:
            return _invalid("model: Field required")
        max_tokens = body.get("max_tokens")
        if max_tokens is None:
            return _invalid("max_tokens: Field required")
        if not isinstance(max_tokens, int) or max_tokens < 1:
            return _invalid("max_tokens: Input should be greater than or equal to 1")
        system = body.get("system")
        if system is not None and not isinstance(system, (str, list)):
            return _invalid("system: Input should be a valid string or list of text blocks")
        for i, tool in enumerate(body.get("tools") or []):
            if "type" in tool and "input_schema" not in tool:
                continue  # a server tool, e.g. web_search_20250305
            if not tool.get("name") or not isinstance(tool.get("input_schema"), dict):
                return _invalid(f"tools.{i}: name and input_schema are required")
            if "parameters" in tool:
                return _invalid(f"tools.{i}.parameters: Extra inputs are not permitted")
        choice = body.get("tool_choice")
        if choice is not None and (not isinstance(choice, dict)
                                   or choice.get("type") not in ("auto", "any", "tool", "none")):
            return _invalid("tool_choice: Input tag does not match any of the expected tags")
        thinking = body.get("thinking")
        if thinking is not None:
            if thinking.get("type") == "enabled":
                budget = thinking.get("budget_tokens")
                if not isinstance(budget, int) or budget < 1024:
                    return _invalid("thinking.enabled.budget_tokens: Input should be >= 1024")
                if budget >= max_tokens:
                    return _invalid("`max_tokens` must be greater than `thinking.budget_tokens`")
            elif thinking.get("type") not in ("disabled", "adaptive"):
                return _invalid("thinking: Input tag does not match any of the expected tags")
        return self._check_messages(body.get("messages"))

    def _check_messages(self, messages: Any) -> Fail | None:
        if not isinstance(messages, list) or not messages:
            return _invalid("messages: at least one message is required")
        prev_role: str | None = None
        for i, message in enumerate(messages):
            role = message.get("role")
            if role == "system":
                return _invalid(
                    'Unexpected role "system". The Messages API accepts a top-level `system` '
                    "parameter, not \"system\" as an input message role.")
            if role not in ("user", "assistant"):
                return _invalid(f"messages.{i}.role: Input should be 'user' or 'assistant'")
            if role == prev_role:
                return _invalid(
                    f"messages.{i}: roles must alternate between \"user\" and \"assistant\", "
                    "but found multiple \"%s\" roles in a row" % role)
            if i == 0 and role != "user":
                return _invalid("messages.0.role: the first message must use the \"user\" role")
            prev_role = role
            content = message.get("content")
            final_assistant = i == len(messages) - 1 and role == "assistant"
            if isinstance(content, str):
                if not content and not final_assistant:
                    return _invalid(f"messages.{i}: all messages must have non-empty content "
                                    "except for the optional final assistant message")
                continue
            if not isinstance(content, list):
                return _invalid(f"messages.{i}.content: Input should be a string or a list")
            if not content and not final_assistant:
                return _invalid(f"messages.{i}: all messages must have non-empty content "
                                "except for the optional final assistant message")
            for j, block in enumerate(content):
                problem = self._check_block(i, j, role, block)
                if problem is not None:
                    return problem
        return self._check_tool_pairs(messages) or self._check_thinking_turn(messages)

    def _check_block(self, i: int, j: int, role: str, block: Any) -> Fail | None:
        where = f"messages.{i}.content.{j}"
        btype = block.get("type") if isinstance(block, dict) else None
        if btype not in _BLOCK_TYPES:
            return _invalid(f"{where}: Input tag {btype!r} does not match any of the expected tags")
        if btype == "text" and not block.get("text"):
            return _invalid(f"{where}: text content blocks must be non-empty")
        if btype == "text" and not str(block["text"]).strip():
            return _invalid(f"{where}: text content blocks must contain non-whitespace text")
        if btype == "tool_use":
            if role != "assistant":
                return _invalid(f"{where}: tool_use blocks may only appear in assistant turns")
            if not isinstance(block.get("input"), dict):
                return _invalid(f"{where}.input: Input should be a valid dictionary")
        if btype == "tool_result" and role != "user":
            return _invalid(f"{where}: tool_result blocks may only appear in user turns")
        if btype == "tool_result" and isinstance(block.get("content"), list):
            for k, part in enumerate(block["content"]):  # text, image, document, search_result
                kind = part.get("type") if isinstance(part, dict) else None
                if kind not in ("text", "image", "document", "search_result"):
                    return _invalid(f"{where}.content.{k}: Input tag {kind!r} does not match "
                                    "any of the expected tags")
                failed = self._check_block(i, j, role, part)
                if failed is not None:
                    return failed
        if btype == "thinking":
            if role != "assistant":
                return _invalid(f"{where}: thinking blocks may only appear in assistant turns")
            issued = self.issued_signatures.get(block.get("signature") or "")
            if issued is None or issued != block.get("thinking"):
                return _invalid(f"{where}: Invalid `signature` in `thinking` block")
        if btype == "redacted_thinking" and block.get("data") not in self.issued_redacted:
            return _invalid(f"{where}: Invalid `data` in `redacted_thinking` block")
        if btype == "compaction" and not isinstance(block.get("content"), str):
            return _invalid(f"{where}.content: Input should be a valid string")
        if btype == "text" and "citations" in block and not all(
            isinstance(c, dict) and c.get("type") for c in block["citations"] or []
        ):
            return _invalid(f"{where}.citations: each citation needs a type")
        if btype == "image":
            source = block.get("source") or {}
            if source.get("type") == "base64":
                if not source.get("media_type") or not source.get("data"):
                    return _invalid(f"{where}.source: media_type and data are required")
            elif source.get("type") != "url" or not source.get("url"):
                return _invalid(f"{where}.source: expected a base64 or url source")
        return None

    @staticmethod
    def _blocks(message: dict[str, Any]) -> list[dict[str, Any]]:
        content = message.get("content")
        return content if isinstance(content, list) else []

    def _check_tool_pairs(self, messages: list[dict[str, Any]]) -> Fail | None:
        for i, message in enumerate(messages):
            blocks = self._blocks(message)
            if message["role"] == "assistant":
                asked = [b["id"] for b in blocks if b.get("type") == "tool_use"]
                if asked and i + 1 < len(messages):
                    answered = {b.get("tool_use_id") for b in self._blocks(messages[i + 1])
                                if b.get("type") == "tool_result"}
                    missing = [a for a in asked if a not in answered]
                    if missing:
                        return _invalid(
                            f"messages.{i + 1}: `tool_use` ids were found without `tool_result` "
                            f"blocks immediately after: {', '.join(missing)}. Each `tool_use` "
                            "block must have a corresponding `tool_result` block in the next "
                            "message.")
                continue
            results = [j for j, b in enumerate(blocks) if b.get("type") == "tool_result"]
            if not results:
                continue
            if results != list(range(len(results))):
                return _invalid(f"messages.{i}: tool_result blocks must come first in the "
                                "content array, before any other content")
            previous = self._blocks(messages[i - 1]) if i > 0 else []
            asked_ids = {b.get("id") for b in previous if b.get("type") == "tool_use"}
            for j in results:
                if blocks[j].get("tool_use_id") not in asked_ids:
                    return _invalid(
                        f"messages.{i}.content.{j}: unexpected `tool_use_id` found in "
                        "`tool_result` blocks: each `tool_result` block must have a "
                        "corresponding `tool_use` block in the previous message.")
        return None

    def _check_thinking_turn(self, messages: list[dict[str, Any]]) -> Fail | None:
        """The assistant turn whose tool calls are answered last must keep its thinking as issued."""
        for i in range(len(messages) - 1, -1, -1):
            if messages[i]["role"] != "assistant":
                continue
            blocks = self._blocks(messages[i])
            calls = [b for b in blocks if b.get("type") == "tool_use"]
            if not calls:
                return None  # only the turn with the latest tool calls is checked, like the API
            issued = self.issued_turns.get(calls[0].get("id"), [])
            if not issued:
                return None
            sent = [b for b in blocks if b.get("type") in ("thinking", "redacted_thinking")]
            first_call = blocks.index(calls[0])
            if sent != issued or any(blocks.index(b) > first_call for b in sent):
                return _invalid(
                    f"messages.{i}.content: `thinking` or `redacted_thinking` blocks in the latest "
                    "assistant message cannot be modified. These blocks must remain as they were "
                    "in the original response.")
            return None
        return None

    # -- rendering -----------------------------------------------------------------------------
    def _content(self, turn: Turn) -> list[dict[str, Any]]:
        """The answer's content blocks; registers the thinking it issues."""
        thinking: list[dict[str, Any]] = []
        if turn.thinking is not None:
            signature = turn.signature or self._sign(turn.thinking)
            self.issued_signatures[signature] = turn.thinking
            thinking.append({"type": "thinking", "thinking": turn.thinking,
                             "signature": signature})
        for data in turn.redacted_thinking:
            self.issued_redacted.add(data)
            thinking.append({"type": "redacted_thinking", "data": data})
        plan: list[dict[str, Any] | str] = ["thinking", "redacted", "text", "tools"]
        if isinstance(turn, AnthropicTurn) and turn.content is not None:
            plan = turn.content
        blocks: list[dict[str, Any]] = []
        for entry in plan:
            if entry == "thinking":
                blocks += [b for b in thinking if b["type"] == "thinking"]
            elif entry == "redacted":
                blocks += [b for b in thinking if b["type"] == "redacted_thinking"]
            elif entry == "text":
                if turn.text:
                    blocks.append({"type": "text", "text": turn.text})
            elif entry == "tools":
                for call in turn.tool_calls:
                    self.issued_turns[call.id] = thinking
                    blocks.append({"type": "tool_use", "id": call.id, "name": call.name,
                                   "input": call.arguments if isinstance(call.arguments, dict)
                                   else {}})
            elif isinstance(entry, dict):
                blocks.append(copy.deepcopy(entry))
            else:
                raise ValueError(f"unknown content entry {entry!r}")
        return blocks

    @staticmethod
    def _sign(thinking: str) -> str:
        digest = hashlib.sha256(b"fake-anthropic:" + thinking.encode()).digest()
        return base64.b64encode(digest * 3).decode()

    @staticmethod
    def _wire_stop(turn: Turn) -> str:
        stop = turn.canonical_stop
        return "refusal" if stop == "content_filter" else stop

    def _message(self, turn: Turn, request: RecordedRequest) -> dict[str, Any]:
        return {
            "id": f"msg_{next(self._ids):04d}",
            "type": "message",
            "role": "assistant",
            "model": turn.model or (request.json or {}).get("model"),
            "stop_reason": None,
            "stop_sequence": None,
        }

    @staticmethod
    def _usage(turn: Turn, output_tokens: int) -> dict[str, int]:
        return {
            "input_tokens": turn.input_tokens,
            "cache_creation_input_tokens": turn.cache_creation_tokens,
            "cache_read_input_tokens": turn.cache_read_tokens,
            "output_tokens": output_tokens,
        }

    def render_json(self, turn: Turn, request: RecordedRequest) -> Any:
        message = self._message(turn, request)
        message.update(content=self._content(turn), stop_reason=self._wire_stop(turn),
                       usage=self._usage(turn, turn.output_tokens))
        return message

    def render_events(self, turn: Turn, request: RecordedRequest) -> list[bytes]:
        out = _Chunks()
        message = self._message(turn, request)
        if isinstance(turn, AnthropicTurn) and turn.start_holds_content:
            out.delta({"type": "message_start", "message": {
                **message, "content": self._content(turn), "stop_reason": self._wire_stop(turn),
                "usage": self._usage(turn, turn.output_tokens)}})
            out.frame({"type": "message_stop"})
            return out.done()
        out.frame({"type": "message_start",
                   "message": {**message, "content": [], "usage": self._usage(turn, 1)}})
        out.frame({"type": "ping"})
        for index, block in enumerate(self._content(turn)):
            kind = block["type"]
            if kind == "thinking":
                out.frame({"type": "content_block_start", "index": index,
                           "content_block": {"type": "thinking", "thinking": ""}})
                text = block["thinking"]
                for k in range(0, len(text), 8):
                    out.delta({"type": "content_block_delta", "index": index,
                               "delta": {"type": "thinking_delta", "thinking": text[k : k + 8]}})
                out.frame({"type": "content_block_delta", "index": index,
                           "delta": {"type": "signature_delta", "signature": block["signature"]}})
                out.frame({"type": "content_block_stop", "index": index})
            elif kind == "redacted_thinking":
                out.frame({"type": "content_block_start", "index": index, "content_block": block})
                out.frame({"type": "content_block_stop", "index": index})
            elif kind == "text":
                out.frame({"type": "content_block_start", "index": index,
                           "content_block": {"type": "text", "text": ""}})
                for citation in block.get("citations") or []:
                    out.frame({"type": "content_block_delta", "index": index,
                               "delta": {"type": "citations_delta", "citation": citation}})
                n = max(1, turn.chunk)
                text = block["text"]
                for k in range(0, len(text), n):
                    out.delta({"type": "content_block_delta", "index": index,
                               "delta": {"type": "text_delta", "text": text[k : k + n]}})
                out.frame({"type": "content_block_stop", "index": index})
                out.frame({"type": "ping"})
            elif kind in _STREAMED_FIELDS:
                name = _STREAMED_FIELDS[kind]
                out.frame({"type": "content_block_start", "index": index,
                           "content_block": {**block, name: None}})
                value = block.get(name) or ""
                for k in range(0, len(value), 24):
                    out.delta({"type": "content_block_delta", "index": index,
                               "delta": {"type": f"{kind}_delta", name: value[k : k + 24]}})
                out.frame({"type": "content_block_stop", "index": index})
            elif kind == "server_tool_use":
                out.frame({"type": "content_block_start", "index": index,
                           "content_block": {**block, "input": {}}})
                raw = json.dumps(block["input"])
                for k in range(0, len(raw), 7):
                    out.delta({"type": "content_block_delta", "index": index,
                               "delta": {"type": "input_json_delta",
                                         "partial_json": raw[k : k + 7]}})
                out.frame({"type": "content_block_stop", "index": index})
            elif kind != "tool_use":  # complete in its start event (web_search_tool_result...)
                out.frame({"type": "content_block_start", "index": index, "content_block": block})
                out.delta({"type": "content_block_stop", "index": index})
            elif kind == "tool_use":
                call = next(c for c in turn.tool_calls if c.id == block["id"])
                out.delta({"type": "content_block_start", "index": index,
                           "content_block": {**block, "input": {}}})
                raw = "" if call.arguments == {} else call.arguments_json
                for k in range(0, max(len(raw), 1), 5):
                    out.delta({"type": "content_block_delta", "index": index,
                               "delta": {"type": "input_json_delta",
                                         "partial_json": raw[k : k + 5]}})
                out.delta({"type": "content_block_stop", "index": index})
        out.frame({"type": "message_delta",
                   "delta": {"stop_reason": self._wire_stop(turn), "stop_sequence": None},
                   "usage": self._usage(turn, turn.output_tokens)})
        out.frame({"type": "message_stop"})
        return out.done()

    def render_error(self, fail: Fail) -> Reply:
        return Reply.json(self._error_body(fail), status=fail.status,
                          headers={"request-id": "req_fake_0001", **fail.headers})

    def render_stream_error(self, fail: Fail) -> bytes:
        body = self._error_body(fail)
        del body["request_id"]
        return sse_event(body, event="error")

    @staticmethod
    def _error_body(fail: Fail) -> dict[str, Any]:
        known = set(ANTHROPIC_ERROR_TYPES.values())
        error: dict[str, Any] = {"message": fail.message}
        if fail.error_type in known:
            error["type"] = fail.error_type
        else:
            error["type"] = ANTHROPIC_ERROR_TYPES.get(fail.status, "api_error")
            if fail.error_type:
                error["details"] = {"error_code": fail.error_type}
        return {"type": "error", "error": error, "request_id": "req_fake_0001"}

    # -- inspectors ------------------------------------------------------------------------------
    def last_user_text(self, request: RecordedRequest) -> str:
        for message in reversed((request.json or {}).get("messages", [])):
            if message.get("role") != "user":
                continue
            content = message.get("content")
            if isinstance(content, str):
                return content
            texts = [b["text"] for b in content if b.get("type") == "text"]
            if texts:
                return "".join(texts)
        return ""

    def system_of(self, request: RecordedRequest) -> str | None:
        system = (request.json or {}).get("system")
        if isinstance(system, list):
            return "".join(b.get("text", "") for b in system)
        return system

    def max_tokens_of(self, request: RecordedRequest) -> int | None:
        return (request.json or {}).get("max_tokens")

    def tool_names_of(self, request: RecordedRequest) -> list[str]:
        return [t["name"] for t in (request.json or {}).get("tools", []) if "name" in t]

    def tool_result_ids_of(self, request: RecordedRequest) -> list[str]:
        ids: list[str] = []
        for message in (request.json or {}).get("messages", []):
            content = message.get("content")
            if isinstance(content, list):
                ids += [b["tool_use_id"] for b in content if b.get("type") == "tool_result"]
        return ids

    def thinking_signatures_of(self, request: RecordedRequest) -> list[str]:
        sigs: list[str] = []
        for message in (request.json or {}).get("messages", []):
            content = message.get("content")
            if isinstance(content, list):
                sigs += [b["signature"] for b in content if b.get("type") == "thinking"]
        return sigs
