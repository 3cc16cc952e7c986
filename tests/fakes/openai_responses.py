"""A fake OpenAI Responses API server (``POST {prefix}/responses``, PROTOCOLS.md §5).

Renders scripted turns as the real event sequence (``response.created`` … ``output_item.added`` /
deltas / ``.done`` … ``response.completed`` / ``response.incomplete``), with reasoning items
(summary + ``encrypted_content``), messages, refusals and function calls, and in-stream failures as
a bare ``error`` event or ``response.failed`` (``error_style``). A :class:`ResponsesTurn` scripts the
output items explicitly: built-in tool calls between reasoning items (``[reasoning,
web_search_call, reasoning, message]``, with each tool's progress events), MCP items,
``compaction``; and ``late_reasoning_done`` sends reasoning items' ``output_item.done`` after the
later items' (an order OpenRouter was seen to use). ``rotate_ids=True`` gives every event of an
item a fresh opaque ``item_id`` (``output_item.added``'s item too), as GitHub Copilot's
``/responses`` does for Codex-class models; only ``output_index`` stays stable, and the complete
item in ``output_item.done`` / ``response.completed`` carries the id that goes back next turn.
The item fixtures below (:data:`WEB_SEARCH_CALL`
...) are our own, written from the documented item shapes.

``validate()`` rejects what the real API rejects: ``stop`` (unknown parameter), ``max_output_tokens``
below 16, nested chat-style tools, ``tool_choice`` naming an unknown function, assistant content
that is not ``output_text``/``refusal``, a ``function_call_output`` whose ``call_id`` matches no
earlier ``function_call``, a function call left without output, and reasoning items that are not
byte-for-byte what this server issued or that lack the item they were paired with (and the paired
``fc_``/``msg_``/``ws_``... id sent without its reasoning item), an item id sent twice, and built-in
items without their required fields. Beyond the API, the fake also rejects an item it issued that
comes back altered (``issued_items``), so a test sees that items go back verbatim.
"""

from __future__ import annotations

import base64
import copy
import itertools
from dataclasses import dataclass
from typing import Any, ClassVar

from .openai_chat import OpenAIFakeBase, group_frames
from .provider import Fail, LateKind, Turn, sse_event
from .server import RecordedRequest

__all__ = [
    "BUILTIN_ITEMS",
    "CODE_INTERPRETER_CALL",
    "COMPACTION",
    "FILE_SEARCH_CALL",
    "IMAGE_GENERATION_CALL",
    "MCP_APPROVAL_REQUEST",
    "MCP_CALL",
    "MCP_LIST_TOOLS",
    "WEB_SEARCH_CALL",
    "OpenAIResponsesFake",
    "ResponsesTurn",
]

BUILTIN_TOOLS = frozenset({
    "web_search", "web_search_preview", "file_search", "code_interpreter", "image_generation",
    "mcp", "computer_use_preview", "local_shell", "shell", "custom", "apply_patch",
})
_CODE_FOR_STATUS = {400: "invalid_prompt", 401: "invalid_api_key", 429: "rate_limit_exceeded"}

# -- output items of built-in tools (our own fixtures, from the documented item shapes; ids are
# -- assigned when a turn is rendered) --------------------------------------------------------------
WEB_SEARCH_CALL: dict[str, Any] = {
    "type": "web_search_call", "status": "completed",
    "action": {"type": "search", "query": "Paris weather today",
               "sources": [{"type": "url", "url": "https://weather.example/paris"}]},
}
FILE_SEARCH_CALL: dict[str, Any] = {
    "type": "file_search_call", "status": "completed", "queries": ["refund policy"],
    "results": [{"file_id": "file-fake1", "filename": "policy.md", "score": 0.92,
                 "text": "Refunds within 30 days.", "attributes": {}}],
}
CODE_INTERPRETER_CALL: dict[str, Any] = {
    "type": "code_interpreter_call", "status": "completed", "container_id": "cntr_fake1",
    "code": "print(6 * 7)", "outputs": [{"type": "logs", "logs": "42\n"}],
}
IMAGE_GENERATION_CALL: dict[str, Any] = {
    "type": "image_generation_call", "status": "completed",
    "result": "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR4nGNgYGD4DwABBAEAwS2OUAAAAABJ"
              "RU5ErkJggg==",  # a 1x1 PNG
}
MCP_LIST_TOOLS: dict[str, Any] = {
    "type": "mcp_list_tools", "server_label": "docs", "error": None,
    "tools": [{"name": "search_docs", "description": "Search the documentation",
               "input_schema": {"type": "object", "properties": {"q": {"type": "string"}}},
               "annotations": None}],
}
MCP_CALL: dict[str, Any] = {
    "type": "mcp_call", "server_label": "docs", "name": "search_docs",
    "arguments": '{"q": "install"}', "output": "pip install dispatch-nb", "error": None,
    "status": "completed",
}
MCP_APPROVAL_REQUEST: dict[str, Any] = {
    "type": "mcp_approval_request", "server_label": "docs", "name": "delete_page",
    "arguments": '{"page": "old-news"}',
}
#: server-side context compaction: an item dispatch_nb has no special handling for
COMPACTION: dict[str, Any] = {"type": "compaction", "encrypted_content": "gAAAA-compacted-history"}

#: item type → (id prefix, required fields when sent back as input, progress event suffixes)
BUILTIN_ITEMS: dict[str, tuple[str, tuple[str, ...], tuple[str, ...]]] = {
    "web_search_call": ("ws_", ("id", "status", "action"), ("in_progress", "searching", "completed")),
    "file_search_call": ("fs_", ("id", "status", "queries"), ("in_progress", "searching",
                                                              "completed")),
    "code_interpreter_call": ("ci_", ("id", "status", "container_id", "code", "outputs"),
                              ("in_progress", "interpreting", "completed")),
    "image_generation_call": ("ig_", ("id", "status", "result"),
                              ("in_progress", "generating", "completed")),
    "mcp_call": ("mcp_", ("id", "server_label", "name", "arguments"), ("in_progress", "completed")),
    "mcp_list_tools": ("mcpl_", ("id", "server_label", "tools"), ("in_progress", "completed")),
    "mcp_approval_request": ("mcpr_", ("id", "server_label", "name", "arguments"), ()),
    "compaction": ("cmp_", ("encrypted_content",), ()),
}
#: input item types the API accepts that this fake checks no further
_OTHER_INPUT_ITEMS = {"mcp_approval_response", "item_reference"}


@dataclass
class ResponsesTurn(Turn):
    """A :class:`Turn` whose output items are listed explicitly, in output order.

    ``output`` entries are item dicts without an ``id`` (the fake assigns one; a ``reasoning`` dict
    also gets ``encrypted_content``, a ``message`` dict is ``{"type": "message", "text": ...}``),
    or the placeholders ``"thinking"``, ``"redacted"``, ``"text"`` and ``"tools"`` for the items
    the Turn's own fields make. ``late_reasoning_done``: every reasoning item's
    ``response.output_item.done`` comes after all the other items' (out of ``output_index``
    order, as OpenRouter sent it)."""

    output: list[dict[str, Any] | str] | None = None
    late_reasoning_done: bool = False


class OpenAIResponsesFake(OpenAIFakeBase):
    """The Responses API (see the module docstring)."""

    name = "openai-responses"
    delta_markers: ClassVar[dict[LateKind, bytes]] = {
        "text": b'"type": "response.output_text.delta"',
        "thinking": b'"type": "response.reasoning_summary_text.delta"',
        "arguments": b'"type": "response.function_call_arguments.delta"'}
    chat_path = "/responses"

    def __init__(
        self,
        *,
        prefix: str = "/v1",
        api_key: str | None = None,
        models: list[dict[str, Any]] | None = None,
        error_style: str = "error",
        rotate_ids: bool = False,
    ) -> None:
        super().__init__(prefix=prefix, api_key=api_key, models=models)
        if error_style not in ("error", "failed"):
            raise ValueError("error_style must be 'error' or 'failed'")
        self.error_style = error_style
        #: every streamed event of an item carries a fresh opaque ``item_id`` (Copilot)
        self.rotate_ids = rotate_ids
        self._rotation = itertools.count(1)
        #: reasoning items this server issued, by id, exactly as issued
        self.issued_reasoning: dict[str, dict[str, Any]] = {}
        #: reasoning id → id of the item it was paired with (the one right after it)
        self.paired_with: dict[str, str] = {}
        #: item id → the reasoning id it belongs to
        self.reasoning_of: dict[str, str] = {}
        #: built-in (and other verbatim) items this server issued, by id, exactly as issued
        self.issued_items: dict[str, dict[str, Any]] = {}
        self._seq = 0

    # -- validation ------------------------------------------------------------------------------
    def validate(self, request: RecordedRequest) -> Fail | None:
        problem = super().validate(request)
        if problem is not None:
            return problem
        body = request.json
        if "stop" in body:
            return Fail(400, "Unknown parameter: 'stop'.")
        if "messages" in body:
            return Fail(400, "Unknown parameter: 'messages'.")
        limit = body.get("max_output_tokens")
        if limit is not None and (not isinstance(limit, int) or limit < 16):
            return Fail(400, f"Invalid 'max_output_tokens': integer below minimum value. "
                             f"Expected a value >= 16, but got {limit} instead.")
        if "instructions" in body and not isinstance(body["instructions"], str):
            return Fail(400, "Invalid type for 'instructions': expected a string")
        for value in body.get("include") or []:
            if value not in ("reasoning.encrypted_content", "message.output_text.logprobs",
                             "web_search_call.action.sources", "file_search_call.results",
                             "code_interpreter_call.outputs"):
                return Fail(400, f"Invalid value for 'include': {value!r}")
        names: list[str] = []
        for i, tool in enumerate(body.get("tools") or []):
            kind = tool.get("type")
            if kind == "function":
                if "function" in tool or not tool.get("name"):
                    return Fail(400, f"Missing required parameter: 'tools[{i}].name'.")
                names.append(tool["name"])
            elif kind not in BUILTIN_TOOLS:
                return Fail(400, f"Invalid value: {kind!r} for 'tools[{i}].type'")
        choice = body.get("tool_choice")
        if isinstance(choice, dict) and choice.get("type") == "function":
            if choice.get("name") not in names:
                return Fail(400, f"Tool choice '{choice.get('name')}' not found in 'tools' "
                                 "parameter.")
        elif choice is not None and not isinstance(choice, dict) and choice not in (
            "auto", "none", "required"
        ):
            return Fail(400, f"Invalid value for 'tool_choice': {choice!r}")
        items = body.get("input")
        if isinstance(items, str):
            return None
        if not isinstance(items, list) or not items:
            return Fail(400, "Invalid 'input': expected a string or a non-empty array")
        return self._validate_items(items)

    def _validate_items(self, items: list[Any]) -> Fail | None:
        calls: set[str] = set()
        pending: list[str] = []
        ids: set[str] = set()
        for i, item in enumerate(items):
            kind = item.get("type", "message" if "role" in item else None)
            item_id = item.get("id")
            if item_id in ids:
                return Fail(400, f"Duplicate item found with id {item_id}. Remove the duplicate "
                                 "item and try again.")
            if item_id:
                ids.add(item_id)
            if item_id and item_id in self.reasoning_of:
                owner = self.reasoning_of[item_id]
                if i == 0 or items[i - 1].get("id") != owner:
                    return Fail(400, f"Item '{item_id}' of type '{kind}' was provided without its "
                                     f"required 'reasoning' item: '{owner}'.")
            if kind == "message":
                role = item.get("role")
                if role not in ("user", "assistant", "system", "developer"):
                    return Fail(400, f"Invalid value for 'input[{i}].role': {role!r}")
                if pending and role != "assistant":
                    return Fail(400, f"No tool output found for function call {pending[0]}.")
                problem = self._validate_content(i, role, item.get("content"))
                if problem is not None:
                    return problem
            elif kind == "function_call":
                if not item.get("call_id") or not item.get("name"):
                    return Fail(400, f"Missing required parameter: 'input[{i}].call_id'.")
                if not isinstance(item.get("arguments"), str):
                    return Fail(400, f"Invalid type for 'input[{i}].arguments': expected a string")
                calls.add(item["call_id"])
                pending.append(item["call_id"])
            elif kind == "function_call_output":
                call_id = item.get("call_id")
                if call_id not in calls:
                    return Fail(400, f"No tool call found for function call output with call_id "
                                     f"{call_id}.")
                if not isinstance(item.get("output"), (str, list)):
                    return Fail(400, f"Invalid type for 'input[{i}].output'")
                if call_id in pending:
                    pending.remove(call_id)
            elif kind == "reasoning":
                issued = self.issued_reasoning.get(item_id or "")
                if issued is None:
                    return Fail(404, f"Item with id '{item_id}' not found. Items are not persisted "
                                     "when `store` is set to false.")
                if item != issued:
                    return Fail(400, "The encrypted content for item "
                                     f"{item_id} could not be verified.")
                follower = self.paired_with.get(item_id or "")
                nxt = items[i + 1] if i + 1 < len(items) else None
                if follower is not None and (nxt is None or nxt.get("id") != follower):
                    return Fail(400, f"Item '{item_id}' of type 'reasoning' was provided without "
                                     "its required following item.")
            elif kind in BUILTIN_ITEMS:
                missing = [f for f in BUILTIN_ITEMS[kind][1] if f not in item]
                if missing:
                    return Fail(400, f"Missing required parameter: 'input[{i}].{missing[0]}'.")
                issued = self.issued_items.get(item_id or "")
                if issued is not None and item != issued:
                    return Fail(400, f"Item '{item_id}' of type '{kind}' is not the item this "
                                     "server returned (the fake checks items go back verbatim).")
            elif kind not in _OTHER_INPUT_ITEMS:
                return Fail(400, f"Invalid value for 'input[{i}].type': {kind!r}")
        if pending:
            return Fail(400, f"No tool output found for function call {pending[0]}.")
        return None

    @staticmethod
    def _validate_content(i: int, role: str, content: Any) -> Fail | None:
        if isinstance(content, str):
            return None
        if not isinstance(content, list):
            return Fail(400, f"Invalid type for 'input[{i}].content'")
        allowed = ({"output_text", "refusal"} if role == "assistant"
                   else {"input_text", "input_image", "input_file"})
        for part in content:
            kind = part.get("type")
            if kind not in allowed:
                return Fail(400, f"Invalid value: '{kind}'. Supported values are: "
                                 f"{', '.join(repr(a) for a in sorted(allowed))}.")
            if kind == "input_image" and not (part.get("image_url") or part.get("file_id")):
                return Fail(400, f"input[{i}]: input_image needs image_url or file_id")
            if kind in ("input_text", "output_text") and not isinstance(part.get("text"), str):
                return Fail(400, f"input[{i}]: text part without text")
        return None

    # -- rendering -------------------------------------------------------------------------------
    def _event(self, data: dict[str, Any]) -> bytes:
        data = {**data, "sequence_number": self._seq}
        if self.rotate_ids:
            if "item_id" in data:
                data["item_id"] = self._opaque_id()
            if data["type"] == "response.output_item.added" and "id" in data["item"]:
                data["item"] = {**data["item"], "id": self._opaque_id()}
        self._seq += 1
        return sse_event(data, event=data["type"])

    def _opaque_id(self) -> str:
        """A fresh id in the shape Copilot rotates through (a long opaque blob)."""
        seed = f"copilot-rotated-item-{next(self._rotation):06d}".encode()
        return base64.b64encode(seed * 4).decode()

    def _usage(self, turn: Turn) -> dict[str, Any]:
        details: dict[str, int] = {"cached_tokens": turn.cache_read_tokens}
        if turn.cache_creation_tokens:
            details["cache_write_tokens"] = turn.cache_creation_tokens
        total_in = turn.input_tokens + turn.cache_read_tokens + turn.cache_creation_tokens
        return {"input_tokens": total_in, "input_tokens_details": details,
                "output_tokens": turn.output_tokens,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": total_in + turn.output_tokens}

    def _plan(self, turn: Turn) -> list[dict[str, Any]]:
        """The complete output items of a turn, registering reasoning items and their pairing."""
        plan: list[dict[str, Any] | str] = ["thinking", "redacted", "text", "tools"]
        if isinstance(turn, ResponsesTurn) and turn.output is not None:
            plan = turn.output
        items: list[dict[str, Any]] = []
        for entry in plan:
            if entry == "thinking":
                if turn.thinking is not None:
                    rid = self.next_id("rs_")
                    items.append({"type": "reasoning", "id": rid,
                                  "summary": [{"type": "summary_text", "text": turn.thinking}],
                                  "encrypted_content": turn.signature or f"enc:{rid}"})
            elif entry == "redacted":
                for data in turn.redacted_thinking:
                    items.append({"type": "reasoning", "id": self.next_id("rs_"), "summary": [],
                                  "encrypted_content": data})
            elif entry == "text":
                if turn.text:
                    items.append(self._message(turn.text, turn.canonical_stop == "refusal"))
            elif entry == "tools":
                for call in turn.tool_calls:
                    items.append({"type": "function_call", "id": self.next_id("fc_"),
                                  "call_id": call.id, "name": call.name,
                                  "arguments": call.arguments_json, "status": "completed"})
            elif isinstance(entry, dict):
                items.append(self._explicit(entry))
            else:
                raise ValueError(f"unknown output entry {entry!r}")
        for i, item in enumerate(items):
            if item["type"] == "reasoning":
                self.issued_reasoning[item["id"]] = copy.deepcopy(item)
                # a reasoning item pairs with the item right after it
                if i + 1 < len(items):
                    follower = items[i + 1]["id"]
                    self.paired_with[item["id"]] = follower
                    if items[i + 1]["type"] != "reasoning":
                        self.reasoning_of[follower] = item["id"]
            elif item["type"] in BUILTIN_ITEMS:
                self.issued_items[item["id"]] = copy.deepcopy(item)
        return items

    def _message(self, text: str, refusal: bool = False) -> dict[str, Any]:
        part = ({"type": "refusal", "refusal": text} if refusal
                else {"type": "output_text", "text": text, "annotations": [], "logprobs": []})
        return {"type": "message", "id": self.next_id("msg_"), "role": "assistant",
                "status": "completed", "content": [part]}

    def _explicit(self, entry: dict[str, Any]) -> dict[str, Any]:
        kind = entry["type"]
        if kind == "message":
            return self._message(entry["text"])
        prefix = BUILTIN_ITEMS[kind][0] if kind in BUILTIN_ITEMS else {
            "reasoning": "rs_"}.get(kind, f"{kind[:3]}_")
        item = {"id": self.next_id(prefix), **copy.deepcopy(entry)}
        if kind == "reasoning":
            item.setdefault("summary", [])
            item.setdefault("encrypted_content", f"enc:{item['id']}")
        return item

    def _response(self, turn: Turn, request: RecordedRequest, rid: str, status: str,
                  output: list[dict[str, Any]]) -> dict[str, Any]:
        body = request.json or {}
        response: dict[str, Any] = {
            "id": rid, "object": "response", "created_at": 1700000000, "status": status,
            "model": turn.model or body.get("model", ""), "output": output, "error": None,
            "incomplete_details": None, "usage": None,
        }
        if status in ("completed", "incomplete"):
            response["usage"] = self._usage(turn)
        if status == "incomplete":
            reason = ("content_filter" if turn.canonical_stop == "content_filter"
                      else "max_output_tokens")
            response["incomplete_details"] = {"reason": reason}
        return response

    @staticmethod
    def _status(turn: Turn) -> str:
        return "incomplete" if turn.canonical_stop in ("max_tokens", "content_filter") else \
            "completed"

    def render_events(self, turn: Turn, request: RecordedRequest) -> list[bytes]:
        self._seq = 0
        rid = self.next_id("resp_")
        items = self._plan(turn)
        frames: list[tuple[bytes, bool]] = []
        ev = self._event
        start = self._response(turn, request, rid, "in_progress", [])
        frames.append((ev({"type": "response.created", "response": start}), False))
        frames.append((ev({"type": "response.in_progress", "response": start}), False))
        late = isinstance(turn, ResponsesTurn) and turn.late_reasoning_done
        held: list[tuple[int, dict[str, Any]]] = []
        n = max(1, turn.chunk)
        for index, item in enumerate(items):
            kind = item["type"]
            base = {"output_index": index, "item_id": item["id"]}
            if kind == "reasoning":
                frames.append((ev({"type": "response.output_item.added", "output_index": index,
                                   "item": {**item, "summary": [], "encrypted_content": None}}),
                               False))
                for s_index, summary in enumerate(item["summary"]):
                    part = {"type": "summary_text", "text": ""}
                    frames.append((ev({"type": "response.reasoning_summary_part.added", **base,
                                       "summary_index": s_index, "part": part}), False))
                    text = summary["text"]
                    for i in range(0, len(text), n):
                        frames.append((ev({"type": "response.reasoning_summary_text.delta", **base,
                                           "summary_index": s_index, "delta": text[i : i + n]}),
                                       True))
                    frames.append((ev({"type": "response.reasoning_summary_text.done", **base,
                                       "summary_index": s_index, "text": text}), False))
                    frames.append((ev({"type": "response.reasoning_summary_part.done", **base,
                                       "summary_index": s_index, "part": summary}), False))
                if late:
                    held.append((index, item))
                    continue
            elif kind == "message":
                frames += self._message_frames(item, base, n)
            elif kind == "function_call":
                frames.append((ev({"type": "response.output_item.added", "output_index": index,
                                   "item": {**item, "arguments": "", "status": "in_progress"}}),
                               True))
                raw = item["arguments"]
                for i in range(0, len(raw), 5):
                    frames.append((ev({"type": "response.function_call_arguments.delta", **base,
                                       "delta": raw[i : i + 5]}), True))
                frames.append((ev({"type": "response.function_call_arguments.done", **base,
                                   "name": item["name"], "arguments": raw}), False))
            else:
                frames += self._builtin_frames(item, base)
            frames.append((ev({"type": "response.output_item.done", "output_index": index,
                               "item": item}), kind not in ("reasoning", "message", "function_call")))
        for index, item in held:
            frames.append((ev({"type": "response.output_item.done", "output_index": index,
                               "item": item}), False))
        status = self._status(turn)
        final = self._response(turn, request, rid, status, items)
        frames.append((ev({"type": f"response.{status}", "response": final}), False))
        return group_frames(frames)

    def _message_frames(self, item: dict[str, Any], base: dict[str, Any],
                        n: int) -> list[tuple[bytes, bool]]:
        ev = self._event
        part = item["content"][0]
        refusal = part["type"] == "refusal"
        text = part["refusal"] if refusal else part["text"]
        frames = [(ev({"type": "response.output_item.added", "output_index": base["output_index"],
                       "item": {**item, "status": "in_progress", "content": []}}), False)]
        empty = ({"type": "refusal", "refusal": ""} if refusal
                 else {"type": "output_text", "text": "", "annotations": []})
        frames.append((ev({"type": "response.content_part.added", **base, "content_index": 0,
                           "part": empty}), False))
        delta_type = "response.refusal.delta" if refusal else "response.output_text.delta"
        for i in range(0, len(text), n):
            extra = {} if refusal else {"logprobs": []}
            frames.append((ev({"type": delta_type, **base, "content_index": 0,
                               "delta": text[i : i + n], **extra}), True))
        if refusal:
            frames.append((ev({"type": "response.refusal.done", **base, "content_index": 0,
                               "refusal": text}), False))
        else:
            frames.append((ev({"type": "response.output_text.done", **base, "content_index": 0,
                               "text": text, "logprobs": []}), False))
        frames.append((ev({"type": "response.content_part.done", **base, "content_index": 0,
                           "part": part}), False))
        return frames

    def _builtin_frames(self, item: dict[str, Any], base: dict[str, Any]
                        ) -> list[tuple[bytes, bool]]:
        """``output_item.added`` and the tool's progress events (the documented stream events of
        each built-in tool); the complete item follows in ``output_item.done``."""
        ev = self._event
        kind = item["type"]
        added = {"id": item["id"], "type": kind}
        if "status" in item:
            added["status"] = "in_progress"
        frames = [(ev({"type": "response.output_item.added", "output_index": base["output_index"],
                       "item": added}), False)]
        for step in BUILTIN_ITEMS.get(kind, ("", (), ()))[2]:
            if kind == "code_interpreter_call" and step == "interpreting":
                code = item.get("code") or ""
                for i in range(0, len(code), 6):
                    frames.append((ev({"type": "response.code_interpreter_call_code.delta", **base,
                                       "delta": code[i : i + 6]}), False))
                frames.append((ev({"type": "response.code_interpreter_call_code.done", **base,
                                   "code": code}), False))
            if kind == "mcp_call" and step == "completed":
                frames.append((ev({"type": "response.mcp_call_arguments.delta", **base,
                                   "delta": item["arguments"]}), False))
                frames.append((ev({"type": "response.mcp_call_arguments.done", **base,
                                   "arguments": item["arguments"]}), False))
            if kind == "image_generation_call" and step == "completed":
                frames.append((ev({"type": "response.image_generation_call.partial_image", **base,
                                   "partial_image_index": 0,
                                   "partial_image_b64": item.get("result") or ""}), False))
            frames.append((ev({"type": f"response.{kind}.{step}", **base}), False))
        return frames

    def render_json(self, turn: Turn, request: RecordedRequest) -> Any:
        rid = self.next_id("resp_")
        items = self._plan(turn)
        return self._response(turn, request, rid, self._status(turn), items)

    def render_stream_error(self, fail: Fail) -> bytes:
        code = fail.error_type or _CODE_FOR_STATUS.get(fail.status, "server_error")
        if self.error_style == "failed":
            response = {"id": "resp_failed", "object": "response", "status": "failed",
                        "output": [], "error": {"code": code, "message": fail.message},
                        "incomplete_details": None, "usage": None}
            return self._event({"type": "response.failed", "response": response})
        return self._event({"type": "error", "code": code, "message": fail.message,
                            "param": None})

    # -- inspectors ------------------------------------------------------------------------------
    @staticmethod
    def _items(request: RecordedRequest) -> list[dict[str, Any]]:
        items = (request.json or {}).get("input")
        if isinstance(items, str):
            return [{"type": "message", "role": "user", "content": items}]
        return list(items or [])

    def last_user_text(self, request: RecordedRequest) -> str:
        for item in reversed(self._items(request)):
            if item.get("type", "message") != "message" or item.get("role") != "user":
                continue
            content = item.get("content")
            if isinstance(content, str):
                return content
            texts = [p["text"] for p in content or [] if p.get("type") == "input_text"]
            if texts:
                return "".join(texts)
        return ""

    def system_of(self, request: RecordedRequest) -> str | None:
        return (request.json or {}).get("instructions")

    def max_tokens_of(self, request: RecordedRequest) -> int | None:
        return (request.json or {}).get("max_output_tokens")

    def tool_names_of(self, request: RecordedRequest) -> list[str]:
        return [t["name"] for t in (request.json or {}).get("tools") or []
                if t.get("type") == "function"]

    def tool_result_ids_of(self, request: RecordedRequest) -> list[str]:
        return [i["call_id"] for i in self._items(request)
                if i.get("type") == "function_call_output"]

    def thinking_signatures_of(self, request: RecordedRequest) -> list[str]:
        return [i["encrypted_content"] for i in self._items(request)
                if i.get("type") == "reasoning" and i.get("encrypted_content")]
