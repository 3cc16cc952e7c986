"""A fake OpenAI chat.completions server (OpenAI, llama.cpp, llama-cpp-python, Copilot flavours).

Speaks the real wire format (PROTOCOLS.md §4, §7) and can switch on each quirk real servers have::

    OpenAIChatFake()                       # OpenAI-style: usage chunk when include_usage is asked
    OpenAIChatFake.llama()                 # llama-cpp-python: id+name repeated on every tool chunk,
                                           # no usage, comment pings, strict template validation
    OpenAIChatFake(reuse_index=True)       # Claude via Copilot: every call on index 0, new ids
    OpenAIChatFake(split_choices=True)     # text in choice 0, tool calls in choice 1
    OpenAIChatFake(usage="finish")         # usage on the finish chunk (old llama.cpp, Copilot)
    OpenAIChatFake(prefix="", reasoning_field="reasoning_text",
                   signature_field="reasoning_opaque")   # Copilot's paths and reasoning fields
    OpenAIChatFake.mistral()               # content as a list of parts: thinking parts
                                           # ({"type": "thinking", "thinking": [text parts]}),
                                           # text parts, any ChatTurn.parts; thinking echoed back
    OpenAIChatFake(crlf=True)              # SSE lines end in CRLF

``validate()`` rejects what real servers reject: a ``tool`` message answering no pending
``tool_call_id``, tool calls left unanswered, ``stream_options`` without ``stream``, built-in tools,
``tool_choice`` naming an unknown function; in ``strict`` (llama) mode also assistant content null,
a system message that is not first, and roles that do not alternate. Assistant content may be a
list of ``text`` parts; in ``content_parts`` (Mistral) mode also of well-formed ``thinking`` parts
and of the part types this fake issued.

:class:`OpenAIFakeBase` holds what both OpenAI fakes share (path prefix, API key check, ``/models``,
error bodies); the Responses fake and the Copilot fake build on it.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, field
from typing import Any

from .openai_schema import check_body, checking
from .provider import Fail, LateKind, ProviderFake, ToolCall, Turn, sse_event
from .server import RecordedRequest, Reply

__all__ = ["REFERENCE_PART", "ChatTurn", "OpenAIChatFake", "OpenAIFakeBase",
           "group_frames"]


_DEFAULT_TYPE = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    403: "invalid_request_error",
    404: "invalid_request_error",
    429: "requests",
}
_DEFAULT_CODE = {401: "invalid_api_key", 429: "rate_limit_exceeded"}

_FINISH = {
    "end_turn": "stop",
    "tool_use": "tool_calls",
    "max_tokens": "length",
    "content_filter": "content_filter",
    "stop_sequence": "stop",
    "refusal": "stop",
    "pause_turn": "stop",
}


#: a content part dispatch_nb has no type for (Mistral's documented ``reference`` chunk: the ids of
#: the sources the text drew on); our own fixture
REFERENCE_PART: dict[str, Any] = {"type": "reference", "reference_ids": [0, 2]}


@dataclass
class ChatTurn(Turn):
    """A :class:`Turn` with extra content ``parts`` after the text (any part types, e.g.
    :data:`REFERENCE_PART`); they make the answer's content a list of parts."""

    parts: list[dict[str, Any]] = field(default_factory=list)


def group_frames(frames: list[tuple[bytes, bool]]) -> list[bytes]:
    """Group SSE frames into stream "events" (one chunk each): every delta frame closes an event
    that also carries the bookkeeping frames before it; trailing frames form the last event. So
    ``Turn.error_after`` / ``stall_after`` count model output, whatever the protocol's ceremony."""
    out: list[bytes] = []
    buf = b""
    for frame, is_delta in frames:
        buf += frame
        if is_delta:
            out.append(buf)
            buf = b""
    if buf:
        out.append(buf)
    return out


class OpenAIFakeBase(ProviderFake):
    """What the OpenAI-style fakes share: ``prefix`` for every path, an optional API key (then
    requests without ``Authorization: Bearer <key>`` get 401), ``GET {prefix}/models``, and
    OpenAI-shaped error bodies (``llama_errors``: llama.cpp's ``{"code": <status>, ...}``)."""

    chat_path = "/chat/completions"

    def __init__(
        self,
        *,
        prefix: str = "/v1",
        api_key: str | None = None,
        models: list[dict[str, Any]] | None = None,
        llama_errors: bool = False,
    ) -> None:
        super().__init__()
        self.prefix = prefix.rstrip("/")
        self.api_key = api_key
        self.llama_errors = llama_errors
        self.models = models if models is not None else [
            {"id": "gpt-4.1", "object": "model", "created": 1744316542, "owned_by": "system"},
            {"id": "gpt-5", "object": "model", "created": 1754425777, "owned_by": "system"},
        ]
        self._ids = itertools.count(1)

    @property
    def base_url(self) -> str:
        return self.server.url + self.prefix

    def next_id(self, prefix: str) -> str:
        return f"{prefix}{next(self._ids):04d}"

    def restart_ids(self) -> None:
        """Number ids from 1 again, so the same turn rendered twice carries the same ids (to
        compare a streamed answer with a non-streamed one)."""
        self._ids = itertools.count(1)

    # -- routing ---------------------------------------------------------------------------------
    def _dispatch(self, request: RecordedRequest) -> Reply:
        if checking.is_set() and self.is_chat(request) and request.body:
            check_body(self.chat_path, json.loads(request.body))  # OpenAI's published schema
        return super()._dispatch(request)

    def is_chat(self, request: RecordedRequest) -> bool:
        return request.method == "POST" and request.path == self.prefix + self.chat_path

    def auth_failure(self, request: RecordedRequest) -> Fail | None:
        if self.api_key is None:
            return None
        if request.header("authorization") != f"Bearer {self.api_key}":
            return Fail(401, "Incorrect API key provided.", "invalid_api_key")
        return None

    def route_other(self, request: RecordedRequest) -> Reply:
        if request.method == "GET" and request.path == self.prefix + "/models":
            problem = self.auth_failure(request)
            if problem is not None:
                return self.render_error(problem)
            return Reply.json({"object": "list", "data": self.models})
        return self.render_error(
            Fail(404, f"Invalid URL ({request.method} {request.path})", "invalid_request_error")
        )

    def validate(self, request: RecordedRequest) -> Fail | None:
        problem = self.auth_failure(request)
        if problem is not None:
            return problem
        body = request.json
        if not isinstance(body, dict):
            return Fail(400, "We could not parse the JSON body of your request.")
        if not isinstance(body.get("model"), str) or not body["model"]:
            return Fail(400, "you must provide a model parameter")
        return None

    # -- errors ----------------------------------------------------------------------------------
    def error_body(self, fail: Fail) -> dict[str, Any]:
        if self.llama_errors:
            return {"error": {"code": fail.status, "message": fail.message,
                              "type": fail.error_type or ("server_error" if fail.status >= 500
                                                          else "invalid_request_error")}}
        etype = fail.error_type or _DEFAULT_TYPE.get(fail.status, "server_error")
        return {"error": {"message": fail.message, "type": etype, "param": None,
                          "code": fail.error_type or _DEFAULT_CODE.get(fail.status)}}

    def render_error(self, fail: Fail) -> Reply:
        return Reply.json(self.error_body(fail), status=fail.status, headers=fail.headers)


class OpenAIChatFake(OpenAIFakeBase):
    """chat.completions with switchable quirks (see the module docstring)."""

    name = "openai-chat"

    def __init__(
        self,
        *,
        prefix: str = "/v1",
        api_key: str | None = None,
        models: list[dict[str, Any]] | None = None,
        repeat_ids: bool = False,
        reuse_index: bool = False,
        split_choices: bool = False,
        usage: str = "separate",
        pings: bool = False,
        stop_with_tools: bool = False,
        reasoning_field: str = "reasoning_content",
        signature_field: str | None = None,
        strict: bool = False,
        max_tokens_field: str = "max_tokens",
        null_content: bool = False,
        llama_errors: bool = False,
        content_parts: bool = False,
        crlf: bool = False,
    ) -> None:
        super().__init__(prefix=prefix, api_key=api_key, models=models, llama_errors=llama_errors)
        self.content_parts = content_parts
        self.crlf = crlf
        #: content part types this fake issued (accepted back in assistant turns)
        self.issued_part_types: set[str] = set()
        if usage not in ("separate", "finish", "none"):
            raise ValueError("usage must be 'separate', 'finish' or 'none'")
        self.repeat_ids = repeat_ids
        self.reuse_index = reuse_index
        self.split_choices = split_choices
        self.usage_mode = usage
        self.pings = pings
        self.stop_with_tools = stop_with_tools
        self.reasoning_field = reasoning_field
        self.signature_field = signature_field
        self.strict = strict
        self.max_tokens_field = max_tokens_field
        self.null_content = null_content

    @classmethod
    def mistral(cls, **kw: Any) -> OpenAIChatFake:
        """Mistral's chat.completions: reasoning as ``thinking`` content parts (streamed as one
        part per chunk, then an empty one), text as plain content deltas when streamed and as a
        ``text`` part in a whole answer; assistant history may carry the parts back."""
        kw.setdefault("content_parts", True)
        kw.setdefault("models", [{"id": "magistral-medium-latest", "object": "model",
                                  "owned_by": "mistralai"}])
        return cls(**kw)

    @classmethod
    def llama(cls, **kw: Any) -> OpenAIChatFake:
        """llama-cpp-python's server: repeated ids, no usage, pings, strict templates."""
        kw.setdefault("repeat_ids", True)
        kw.setdefault("usage", "none")
        kw.setdefault("pings", True)
        kw.setdefault("strict", True)
        kw.setdefault("null_content", True)
        kw.setdefault("llama_errors", True)
        kw.setdefault("models", [{"id": "smollm2", "object": "model", "owned_by": "me",
                                  "permissions": []}])
        return cls(**kw)

    # -- validation ------------------------------------------------------------------------------
    def validate(self, request: RecordedRequest) -> Fail | None:
        problem = super().validate(request)
        if problem is not None:
            return problem
        body = request.json
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return Fail(400, "'messages' must be a non-empty array")
        if "stream_options" in body and not body.get("stream"):
            return Fail(400, "The 'stream_options' parameter is only allowed when 'stream' is "
                             "enabled.")
        limit = body.get(self.max_tokens_field)
        if limit is not None and (not isinstance(limit, int) or limit < 1):
            return Fail(400, f"Invalid '{self.max_tokens_field}': must be a positive integer")
        tools = body.get("tools")
        names: list[str] = []
        if tools is not None:
            if not isinstance(tools, list):
                return Fail(400, "'tools' must be an array")
            for i, tool in enumerate(tools):
                fn = tool.get("function") if isinstance(tool, dict) else None
                if tool.get("type") != "function" or not isinstance(fn, dict) or not fn.get("name"):
                    return Fail(400, f"Invalid value for 'tools[{i}]': only function tools with "
                                     f"a 'function.name' are supported, got {tool!r}")
                names.append(fn["name"])
        choice = body.get("tool_choice")
        if choice is not None and not tools:
            return Fail(400, "'tool_choice' is only allowed when 'tools' are specified")
        if isinstance(choice, dict):
            name = (choice.get("function") or {}).get("name")
            if choice.get("type") != "function" or name not in names:
                return Fail(400, f"Invalid 'tool_choice': no function named {name!r} in tools")
        elif choice is not None and choice not in ("auto", "none", "required"):
            return Fail(400, f"Invalid value for 'tool_choice': {choice!r}")
        if body.get("parallel_tool_calls") is not None and not tools:
            return Fail(400, "'parallel_tool_calls' is only allowed when 'tools' are specified")
        return self._validate_messages(messages)

    def _validate_messages(self, messages: list[Any]) -> Fail | None:
        pending: list[str] = []
        previous_role: str | None = None
        for i, message in enumerate(messages):
            if not isinstance(message, dict):
                return Fail(400, f"messages[{i}] must be an object")
            role = message.get("role")
            if role not in ("system", "developer", "user", "assistant", "tool"):
                return Fail(400, f"Invalid value for messages[{i}].role: {role!r}")
            if role == "tool":
                tool_id = message.get("tool_call_id")
                if tool_id not in pending:
                    return Fail(400, f"Invalid parameter: messages[{i}] with role 'tool' must be "
                                     f"a response to a preceding message with 'tool_calls' "
                                     f"(tool_call_id {tool_id!r})")
                if not isinstance(message.get("content"), (str, list)):
                    return Fail(400, f"messages[{i}].content must be a string")
                pending.remove(tool_id)
                previous_role = role
                continue
            if pending:
                return Fail(400, "An assistant message with 'tool_calls' must be followed by tool "
                                 "messages responding to each 'tool_call_id'. The following "
                                 f"tool_call_ids did not have response messages: {pending}")
            if self.strict:
                if role in ("system", "developer") and i != 0:
                    return Fail(400, "System message must be at the beginning.")
                if role == previous_role and role in ("user", "assistant"):
                    return Fail(400, "Conversation roles must alternate user/assistant/user/"
                                     "assistant/...")
            content = message.get("content")
            if role == "assistant":
                calls = message.get("tool_calls") or []
                if content is None and (self.strict or not calls):
                    return Fail(400, f"messages[{i}]: assistant content must not be null")
                if isinstance(content, list):
                    problem = self._validate_assistant_parts(i, content)
                    if problem is not None:
                        return problem
                for call in calls:
                    fn = call.get("function") or {}
                    if not call.get("id") or call.get("type") != "function" or not fn.get("name"):
                        return Fail(400, f"messages[{i}].tool_calls: malformed call {call!r}")
                    if not isinstance(fn.get("arguments"), str):
                        return Fail(400, f"messages[{i}].tool_calls: arguments must be a string")
                    pending.append(call["id"])
            elif isinstance(content, list):
                for part in content:
                    kind = part.get("type")
                    if kind == "text" and isinstance(part.get("text"), str):
                        continue
                    if kind == "image_url" and isinstance((part.get("image_url") or {}).get("url"),
                                                          str):
                        continue
                    return Fail(400, f"messages[{i}]: invalid content part {part!r}")
            elif not isinstance(content, str):
                return Fail(400, f"messages[{i}].content must be a string or an array of parts")
            previous_role = role
        if pending:
            return Fail(400, f"tool_call_ids without response messages: {pending}")
        return None

    def _validate_assistant_parts(self, i: int, parts: list[Any]) -> Fail | None:
        if not self.content_parts:
            if all(isinstance(p, dict) and p.get("type") == "text" for p in parts):
                return None
            return Fail(400, f"messages[{i}].content: assistant content parts must be text")
        for part in parts:
            kind = part.get("type") if isinstance(part, dict) else None
            if kind == "text" and isinstance(part.get("text"), str):
                continue
            if kind == "thinking":
                inner = part.get("thinking")
                if isinstance(inner, list) and inner and all(
                    isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                    for p in inner
                ):
                    continue
                return Fail(400, f"messages[{i}].content: a thinking chunk needs a list of text "
                                 f"chunks, got {part!r}")
            if kind in self.issued_part_types:
                continue
            return Fail(400, f"messages[{i}].content: unexpected content chunk {part!r}")
        return None

    # -- rendering -------------------------------------------------------------------------------
    def _usage(self, turn: Turn) -> dict[str, Any]:
        details: dict[str, int] = {"cached_tokens": turn.cache_read_tokens}
        if turn.cache_creation_tokens:
            details["cache_write_tokens"] = turn.cache_creation_tokens
        prompt = turn.input_tokens + turn.cache_read_tokens + turn.cache_creation_tokens
        return {"prompt_tokens": prompt, "completion_tokens": turn.output_tokens,
                "total_tokens": prompt + turn.output_tokens, "prompt_tokens_details": details,
                "completion_tokens_details": {"reasoning_tokens": 0}}

    def _finish_reason(self, turn: Turn) -> str:
        stop = turn.canonical_stop
        if stop == "tool_use" and self.stop_with_tools:
            return "stop"
        return _FINISH.get(stop, "stop")

    def delta_marker(self, kind: LateKind) -> bytes:
        if kind == "arguments":
            return b'"arguments": "'
        if kind == "thinking" and self.content_parts:
            return b'"thinking": [{"type": "text"'
        field = self.reasoning_field if kind == "thinking" else "content"
        return f'"{field}": "'.encode()

    def _chunk(self, model: str, choices: list[dict[str, Any]], **extra: Any) -> bytes:
        data = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 1700000000,
                "model": model, "choices": choices, **extra}
        frame = sse_event(data)
        return self._lines(b": ping\n\n" + frame if self.pings else frame)

    def _lines(self, frame: bytes) -> bytes:
        return frame.replace(b"\n", b"\r\n") if self.crlf else frame

    def _tool_frames(self, call: ToolCall, n: int, model: str, cidx: int) -> list[bytes]:
        index = 0 if self.reuse_index else n
        raw = call.arguments_json
        pieces = [raw[i : i + 5] for i in range(0, len(raw), 5)] or [""]
        head = {"index": index, "id": call.id, "type": "function"}
        frames = []
        if self.repeat_ids:
            for piece in pieces:
                frames.append({**head, "function": {"name": call.name, "arguments": piece}})
        else:
            frames.append({**head, "function": {"name": call.name, "arguments": ""}})
            frames += [{"index": index, "function": {"arguments": p}} for p in pieces if p]
        return [
            self._chunk(model, [{"index": cidx, "delta": {"tool_calls": [f]},
                                 "finish_reason": None}])
            for f in frames
        ]

    def render_events(self, turn: Turn, request: RecordedRequest) -> list[bytes]:
        body = request.json or {}
        model = turn.model or body.get("model", "")
        frames: list[tuple[bytes, bool]] = []
        role_sent = False

        def delta(d: dict[str, Any], cidx: int = 0) -> bytes:
            nonlocal role_sent
            if not role_sent:
                d = {"role": "assistant", **d}
                role_sent = True
            return self._chunk(model, [{"index": cidx, "delta": d, "finish_reason": None}])

        if turn.thinking is not None:
            n = max(1, turn.chunk)
            for i in range(0, len(turn.thinking), n):
                piece = turn.thinking[i : i + n]
                if self.content_parts:
                    part = {"type": "thinking", "thinking": [{"type": "text", "text": piece}]}
                    frames.append((delta({"content": [part]}), True))
                else:
                    frames.append((delta({self.reasoning_field: piece}), True))
            if self.content_parts:
                frames.append((delta({"content": [{"type": "thinking", "thinking": []}]}), False))
            elif turn.signature is not None and self.signature_field:
                frames.append((delta({self.signature_field: turn.signature}), False))
        text_field = "refusal" if turn.canonical_stop == "refusal" else "content"
        for piece in turn.text_pieces():
            frames.append((delta({text_field: piece}), True))
        for part in turn.parts if isinstance(turn, ChatTurn) else []:
            self.issued_part_types.add(part["type"])
            # a part streams in pieces: each list field one item at a time
            lists = {k: v for k, v in part.items() if isinstance(v, list) and v}
            width = max((len(v) for v in lists.values()), default=1)
            for k in range(width):
                piece = {**part, **{name: v[k : k + 1] for name, v in lists.items()}}
                frames.append((delta({"content": [piece]}), True))
        tool_choice = 1 if self.split_choices else 0
        for n, call in enumerate(turn.tool_calls):
            if not role_sent:
                frames.append((delta({"content": None} if self.null_content else {}), False))
            frames += [(f, True) for f in self._tool_frames(call, n, model, tool_choice)]
        if not role_sent:
            frames.append((delta({"content": ""}), False))
        finish: dict[str, Any] = {"index": 0, "delta": {}, "finish_reason": self._finish_reason(turn)}
        extra: dict[str, Any] = {}
        if self.usage_mode == "finish":
            extra["usage"] = self._usage(turn)
        frames.append((self._chunk(model, [finish], **extra), False))
        wants_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        if self.usage_mode == "separate" and wants_usage:
            frames.append((self._chunk(model, [], usage=self._usage(turn)), False))
        frames.append((self._lines(b"data: [DONE]\n\n"), False))
        return group_frames(frames)

    def render_json(self, turn: Turn, request: RecordedRequest) -> Any:
        model = turn.model or (request.json or {}).get("model", "")
        message: dict[str, Any] = {"role": "assistant",
                                   "content": turn.text or (None if turn.tool_calls else "")}
        if turn.canonical_stop == "refusal":
            message["content"], message["refusal"] = None, turn.text
        parts: list[dict[str, Any]] = list(turn.parts) if isinstance(turn, ChatTurn) else []
        self.issued_part_types.update(p["type"] for p in parts)
        if turn.thinking is not None and self.content_parts:
            parts.insert(0, {"type": "thinking",
                             "thinking": [{"type": "text", "text": turn.thinking}]})
        elif turn.thinking is not None:
            message[self.reasoning_field] = turn.thinking
            if turn.signature is not None and self.signature_field:
                message[self.signature_field] = turn.signature
        if parts:
            text = [{"type": "text", "text": message["content"]}] if message["content"] else []
            thinking = [p for p in parts if p["type"] == "thinking"]
            message["content"] = [*thinking, *text, *(p for p in parts if p["type"] != "thinking")]
        calls = [{"id": c.id, "type": "function",
                  "function": {"name": c.name, "arguments": c.arguments_json}}
                 for c in turn.tool_calls]
        choices = [{"index": 0, "message": message, "finish_reason": self._finish_reason(turn),
                    "logprobs": None}]
        if calls and self.split_choices:
            choices.append({"index": 1, "message": {"role": "assistant", "content": None,
                                                    "tool_calls": calls},
                            "finish_reason": "tool_calls", "logprobs": None})
        elif calls:
            message["tool_calls"] = calls
        data: dict[str, Any] = {"id": "chatcmpl-fake", "object": "chat.completion",
                                "created": 1700000000, "model": model, "choices": choices}
        if self.usage_mode != "none":
            data["usage"] = self._usage(turn)
        return data

    def render_stream_error(self, fail: Fail) -> bytes:
        frame = f"data: {json.dumps(self.error_body(fail))}\n\n".encode()
        return self._lines(b": ping\n\n" + frame if self.pings else frame)

    # -- inspectors ------------------------------------------------------------------------------
    @staticmethod
    def _messages(request: RecordedRequest) -> list[dict[str, Any]]:
        return list((request.json or {}).get("messages") or [])

    def last_user_text(self, request: RecordedRequest) -> str:
        for message in reversed(self._messages(request)):
            if message.get("role") != "user":
                continue
            content = message.get("content")
            if isinstance(content, str):
                return content
            texts = [p["text"] for p in content or [] if p.get("type") == "text"]
            if texts:
                return "".join(texts)
        return ""

    def system_of(self, request: RecordedRequest) -> str | None:
        messages = self._messages(request)
        if messages and messages[0].get("role") in ("system", "developer"):
            content = messages[0].get("content")
            return content if isinstance(content, str) else None
        return None

    def max_tokens_of(self, request: RecordedRequest) -> int | None:
        return (request.json or {}).get(self.max_tokens_field)

    def tool_names_of(self, request: RecordedRequest) -> list[str]:
        return [t["function"]["name"] for t in (request.json or {}).get("tools") or []]

    def tool_result_ids_of(self, request: RecordedRequest) -> list[str]:
        return [m["tool_call_id"] for m in self._messages(request) if m.get("role") == "tool"]

    def thinking_signatures_of(self, request: RecordedRequest) -> list[str]:
        if not self.signature_field:
            return []
        return [m[self.signature_field] for m in self._messages(request)
                if m.get("role") == "assistant" and m.get(self.signature_field)]
