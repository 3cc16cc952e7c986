"""A fake server for dispatch_nb's canonical protocol (the ``fake`` provider).

With nothing scripted, an answer names the model it was asked of: model ``echo`` answers ``hi`` with
``echo: hi``, model ``other`` with ``other: hi`` — so an answer shown under the wrong model (a
swapped comparison column, a ``-o`` entry for the wrong model) cannot pass. :meth:`CanonicalFake.
push_for` scripts one model's answers when several are asked at once.
"""

from __future__ import annotations

import collections
from typing import Any, ClassVar

from dispatch_nb.testing import (
    canonical_body,
    canonical_error_event,
    canonical_events,
    last_user_text,
)

from .provider import Fail, LateKind, ProviderFake, ScriptItem, Turn, sse_event
from .server import RecordedRequest, Reply


class CanonicalFake(ProviderFake):
    name = "fake"
    delta_markers: ClassVar[dict[LateKind, bytes]] = {
        "text": b'"type": "text"', "thinking": b'"type": "thinking"',
        "arguments": b'"type": "tool_delta"'}

    def __init__(self, **server_options: Any) -> None:
        super().__init__(**server_options)
        self.scripts_by_model: dict[str, collections.deque[ScriptItem]] = {}

    def push_for(self, model: str, *items: ScriptItem) -> CanonicalFake:
        """Queue answers for requests to ``model`` only; they are used while the shared script
        (:meth:`push`) is empty, so concurrent calls to several models get their own."""
        with self._lock:
            self.scripts_by_model.setdefault(model, collections.deque()).extend(items)
        return self

    def default_turn(self, request: RecordedRequest) -> Any:
        model = str((request.json or {}).get("model") or "")
        with self._lock:
            queue = self.scripts_by_model.get(model)
            if queue:
                return queue.popleft()  # (a Turn, or a Fail/Drop/Stall that render() handles)
        return Turn(text=f"{model}: {self.last_user_text(request)}")

    models = [{"id": "echo", "name": "Echo", "max_context_tokens": 4096, "supports_tool_use": True}]

    def is_chat(self, request: RecordedRequest) -> bool:
        return request.method == "POST" and request.path == "/chat"

    def route_other(self, request: RecordedRequest) -> Reply:
        if request.path == "/models":
            return Reply.json({"data": self.models})
        return super().route_other(request)

    def validate(self, request: RecordedRequest) -> Fail | None:
        body = request.json or {}
        # Every tool result must answer a tool_use of the assistant turn before it.
        seen: set[str] = set()
        for message in body.get("messages", []):
            content = message.get("content")
            if not isinstance(content, list):
                continue
            for block in content:
                if block.get("type") == "tool_use":
                    seen.add(block["id"])
                if block.get("type") == "tool_result" and block["tool_use_id"] not in seen:
                    return Fail(400, f"tool_result {block['tool_use_id']!r} answers no tool_use",
                                "invalid_request_error")
        return None

    def render_events(self, turn: Turn, request: RecordedRequest) -> list[bytes]:
        return [sse_event(e) for e in canonical_events(turn, (request.json or {}).get("model"))]

    def render_json(self, turn: Turn, request: RecordedRequest) -> Any:
        return canonical_body(turn, (request.json or {}).get("model"))

    def render_stream_error(self, fail: Fail) -> bytes:
        return sse_event(canonical_error_event(fail))

    # -- inspectors ------------------------------------------------------------------------------
    def last_user_text(self, request: RecordedRequest) -> str:
        return last_user_text(request.json)

    def system_of(self, request: RecordedRequest) -> str | None:
        return (request.json or {}).get("system")

    def max_tokens_of(self, request: RecordedRequest) -> int | None:
        return (request.json or {}).get("max_tokens")

    def tool_names_of(self, request: RecordedRequest) -> list[str]:
        return [t["name"] for t in (request.json or {}).get("tools", []) if "name" in t]

    def tool_result_ids_of(self, request: RecordedRequest) -> list[str]:
        ids = []
        for message in (request.json or {}).get("messages", []):
            content = message.get("content")
            if isinstance(content, list):
                ids += [b["tool_use_id"] for b in content if b.get("type") == "tool_result"]
        return ids
