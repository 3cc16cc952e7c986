"""A fake GitHub Copilot API on loopback, with its own fake GitHub for the token exchange.

::

    with CopilotFake() as copilot:                 # starts copilot.github (a FakeGitHub) too
        adapter = CopilotAdapter("gpt-4.1", github_token=copilot.github.github_token,
                                 github_api_url=copilot.github.api_url)
        copilot.push(Turn(text="Hi"))               # the canonical script items (Turn, Fail...)
        adapter.chat("Hello")

Routes (PROTOCOLS.md §3): ``GET /models`` in Copilot's shape (:data:`COPILOT_MODELS`: picker and
hidden models, a disabled policy, an embeddings model, a ``/responses``-only Codex model),
``POST /chat/completions`` rendered by the chat.completions fake with Copilot's quirks, and
``POST /responses`` rendered by the Responses fake — with a fresh ``item_id`` on every streamed event
of an item, as Copilot's Codex-class models send it (``rotate_ids``; ``output_index`` stays
stable). The fake GitHub's token answers point
``endpoints.api`` here.

Like the real API, every request without ``Copilot-Integration-Id`` or ``Editor-Version`` gets a
400, and one whose ``Authorization: Bearer`` is not a current Copilot token of the fake GitHub (see
:meth:`FakeGitHub.revoke_copilot_tokens`) a 401 — before a scripted answer is used, so the answer
waits for the retry with a new token. Rejected requests land in :attr:`CopilotFake.rejected`.

Quirks (``claude=True``, the default): every tool call on ``index`` 0 with a new id, text in choice
0 and tool calls in choice 1, ``finish_reason: "stop"`` with tool calls, usage on the finish chunk,
reasoning as ``reasoning_text`` + ``reasoning_opaque``. Always: an Azure-style first chunk with
empty ``choices`` and ``prompt_filter_results``, and a ``choices: null`` chunk with
``copilot_references``. ``claude=False`` sends usage as a separate chunk, one index per call, one
choice. A scripted ``Fail(401)`` / ``Fail(403)`` answers twice (``repeat_auth_failures``): the
credentials stay bad after the adapter's one token refresh.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from typing import Any

from .github import FakeGitHub
from .openai_chat import OpenAIChatFake
from .openai_responses import OpenAIResponsesFake
from .provider import Fail, ScriptItem, Turn
from .server import RecordedRequest, Reply

__all__ = ["COPILOT_MODELS", "CopilotFake", "copilot_model"]


def copilot_model(
    model_id: str,
    *,
    name: str | None = None,
    vendor: str = "Azure OpenAI",
    picker: bool = True,
    kind: str = "chat",
    policy: str | None = "enabled",
    endpoints: list[str] | None = None,
    multiplier: float | None = 0,
    context: int = 128_000,
    prompt: int = 128_000,
    output: int = 16_384,
    vision: bool = True,
    tools: bool = True,
    thinking: bool = False,
) -> dict[str, Any]:
    """One ``GET /models`` entry in Copilot's shape (PROTOCOLS.md §3.3)."""
    supports: dict[str, Any] = {"streaming": True, "tool_calls": tools,
                                "parallel_tool_calls": tools, "vision": vision}
    if thinking:
        supports.update({"thinking": True, "max_thinking_budget": 32000,
                         "min_thinking_budget": 1024})
    entry: dict[str, Any] = {
        "id": model_id,
        "name": name or model_id,
        "object": "model",
        "vendor": vendor,
        "version": model_id,
        "preview": False,
        "model_picker_enabled": picker,
        "is_chat_default": model_id == "gpt-4.1",
        "is_chat_fallback": model_id == "gpt-4.1",
        "capabilities": {
            "type": kind,
            "family": model_id,
            "object": "model_capabilities",
            "tokenizer": "o200k_base",
            "limits": {"max_context_window_tokens": context, "max_prompt_tokens": prompt,
                       "max_output_tokens": output},
            "supports": supports,
        },
    }
    if multiplier is not None:
        entry["billing"] = {"is_premium": multiplier > 0, "multiplier": multiplier}
    if policy is not None:
        entry["policy"] = {"state": policy, "terms": f"Enable access to {model_id}."}
    if endpoints is not None:
        entry["supported_endpoints"] = endpoints
    return entry


#: The fake's model list: what the pickers show (gpt-4.1, gpt-4o, claude-sonnet-4, gpt-5-codex),
#: a hidden but usable model (o3-mini-paygo), a model whose policy is not enabled, an embeddings
#: model, and a duplicate entry (Copilot lists some twice).
COPILOT_MODELS: list[dict[str, Any]] = [
    copilot_model("gpt-4.1", name="GPT-4.1", endpoints=["/chat/completions", "/responses"]),
    copilot_model("gpt-4o", name="GPT-4o", context=128_000, prompt=64_000, output=4_096),
    copilot_model("claude-sonnet-4", name="Claude Sonnet 4", vendor="Anthropic", multiplier=1,
                  context=216_000, prompt=128_000, output=16_000, thinking=True,
                  endpoints=["/chat/completions", "/v1/messages"]),
    copilot_model("gpt-5-codex", name="GPT-5-Codex", vendor="OpenAI", multiplier=1,
                  context=400_000, prompt=128_000, output=128_000, endpoints=["/responses"]),
    copilot_model("o3-mini-paygo", name="o3-mini", picker=False, policy=None, context=200_000,
                  prompt=64_000, output=100_000, vision=False),
    copilot_model("gemini-2.5-pro", name="Gemini 2.5 Pro", vendor="Google", multiplier=1,
                  policy="unconfigured"),
    copilot_model("text-embedding-3-small", picker=False, kind="embeddings", multiplier=None,
                  policy=None, vision=False, tools=False),
    copilot_model("gpt-4o", name="GPT-4o", context=128_000, prompt=64_000, output=4_096),
]

_FIRST_CHUNK = {
    "choices": [],
    "created": 0,
    "id": "",
    "prompt_filter_results": [
        {"prompt_index": 0, "content_filter_results": {
            "hate": {"filtered": False, "severity": "safe"},
            "self_harm": {"filtered": False, "severity": "safe"},
            "sexual": {"filtered": False, "severity": "safe"},
            "violence": {"filtered": False, "severity": "safe"}}}
    ],
}
_REFERENCES_CHUNK = {"choices": None, "copilot_references": [
    {"type": "github.web-search", "id": "ref-1", "data": {"query": "weather"}}]}


@dataclass
class _RepeatedFail(Fail):
    """A scripted auth failure answering the adapter's retry (not repeated again)."""


class CopilotFake(OpenAIChatFake):
    """The Copilot API (see the module docstring). ``github``: a :class:`FakeGitHub` to issue
    and check Copilot tokens (one is created, started and closed with this fake if not given);
    on :meth:`start` its token answers are pointed here."""

    name = "copilot"

    def __init__(
        self,
        *,
        github: FakeGitHub | None = None,
        models: list[dict[str, Any]] | None = None,
        claude: bool = True,
        repeat_auth_failures: bool = True,
        rotate_ids: bool = True,
    ) -> None:
        super().__init__(
            prefix="",
            models=copy.deepcopy(models if models is not None else COPILOT_MODELS),
            reuse_index=claude,
            split_choices=claude,
            usage="finish" if claude else "separate",
            stop_with_tools=claude,
            reasoning_field="reasoning_text",
            signature_field="reasoning_opaque",
        )
        self._owns_github = github is None
        self.github = github if github is not None else FakeGitHub()
        #: renders ``POST /responses`` (its own server is started but unused); like Copilot's
        #: Codex-class models, it gives every streamed event of an item a fresh ``item_id``
        self.responses = OpenAIResponsesFake(prefix="", rotate_ids=rotate_ids)
        self.repeat_auth_failures = repeat_auth_failures
        #: requests refused for missing editor headers or a bearer that is not a current token
        self.rejected: list[RecordedRequest] = []
        #: replaces the answers of ``GET /models`` when set
        self.models_reply: Reply | None = None

    # -- lifecycle -------------------------------------------------------------------------------
    def start(self) -> CopilotFake:
        super().start()
        self.responses.start()
        if self._owns_github:
            self.github.start()
        self.github.copilot_token_response(endpoints_api=self.url)
        return self

    def close(self) -> None:
        super().close()
        self.responses.close()
        if self._owns_github:
            self.github.close()

    def __enter__(self) -> CopilotFake:
        return self.start()

    def restart_ids(self) -> None:
        super().restart_ids()
        self.responses.restart_ids()

    # -- routing and checks ----------------------------------------------------------------------
    def is_chat(self, request: RecordedRequest) -> bool:
        return request.method == "POST" and request.path in ("/chat/completions", "/responses")

    @staticmethod
    def is_responses(request: RecordedRequest) -> bool:
        return request.path == "/responses"

    def bearer_of(self, request: RecordedRequest) -> str | None:
        scheme, _, token = (request.header("authorization") or "").partition(" ")
        return token.strip() if scheme.lower() == "bearer" and token.strip() else None

    def copilot_problem(self, request: RecordedRequest) -> Fail | None:
        """What the real API refuses before looking at the body: editor headers, the token."""
        if not request.header("copilot-integration-id"):
            return Fail(400, "missing required Copilot-Integration-Id header", "bad_request")
        if not request.header("editor-version"):
            return Fail(400, "missing Editor-Version header for IDE auth", "bad_request")
        token = self.bearer_of(request)
        if token is None:
            return Fail(401, "unauthorized: no token", "unauthorized")
        if not self.github.check_copilot_token(token):
            return Fail(401, "unauthorized: token expired", "unauthorized")
        return None

    def _dispatch(self, request: RecordedRequest) -> Reply:
        guarded = self.is_chat(request) or (request.method == "GET" and request.path == "/models")
        if guarded:
            problem = self.copilot_problem(request)
            if problem is not None:
                with self._lock:
                    self.rejected.append(request)
                return self.render_error(problem)
        if request.method == "GET" and request.path == "/models" and self.models_reply:
            return self.models_reply
        return super()._dispatch(request)

    def validate(self, request: RecordedRequest) -> Fail | None:
        body = request.json
        model = body.get("model") if isinstance(body, dict) else None
        entry: dict[str, Any] | None = next((m for m in self.models if m["id"] == model), None)
        if isinstance(model, str) and entry is None:
            return Fail(400, "The requested model is not supported.", "model_not_supported")
        endpoints = (entry or {}).get("supported_endpoints") or []
        if endpoints and request.path not in endpoints:
            return Fail(400, f"model {model} is not accessible via the {request.path} endpoint",
                        "unsupported_api_for_model")
        if self.is_responses(request):
            return self.responses.validate(request)
        return super().validate(request)

    # -- rendering -------------------------------------------------------------------------------
    def render(self, item: ScriptItem, request: RecordedRequest) -> Reply:
        if (
            isinstance(item, Fail)
            and item.status in (401, 403)
            and self.repeat_auth_failures
            and not isinstance(item, _RepeatedFail)
        ):
            with self._lock:
                self.script.appendleft(_RepeatedFail(item.status, item.message, item.error_type,
                                                     dict(item.headers)))
        if isinstance(item, Turn) and self.is_responses(request):
            return self.responses.render(item, request)
        return super().render(item, request)

    def render_events(self, turn: Turn, request: RecordedRequest) -> list[bytes]:
        events = super().render_events(turn, request)
        extra = f"data: {json.dumps(_FIRST_CHUNK)}\n\n".encode()
        extra += f"data: {json.dumps(_REFERENCES_CHUNK)}\n\n".encode()
        return [extra + events[0], *events[1:]] if events else [extra]

    # -- inspectors (path-aware) -----------------------------------------------------------------
    def last_user_text(self, request: RecordedRequest) -> str:
        if self.is_responses(request):
            return self.responses.last_user_text(request)
        return super().last_user_text(request)

    def system_of(self, request: RecordedRequest) -> str | None:
        if self.is_responses(request):
            return self.responses.system_of(request)
        return super().system_of(request)

    def max_tokens_of(self, request: RecordedRequest) -> int | None:
        if self.is_responses(request):
            return self.responses.max_tokens_of(request)
        return super().max_tokens_of(request)

    def tool_names_of(self, request: RecordedRequest) -> list[str]:
        if self.is_responses(request):
            return self.responses.tool_names_of(request)
        return super().tool_names_of(request)

    def tool_result_ids_of(self, request: RecordedRequest) -> list[str]:
        if self.is_responses(request):
            return self.responses.tool_result_ids_of(request)
        return super().tool_result_ids_of(request)

    def thinking_signatures_of(self, request: RecordedRequest) -> list[str]:
        if self.is_responses(request):
            return self.responses.thinking_signatures_of(request)
        return super().thinking_signatures_of(request)
