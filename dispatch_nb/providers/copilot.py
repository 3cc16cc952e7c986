"""GitHub Copilot: the models of a Copilot subscription, through GitHub's Copilot API.

::

    CopilotAdapter("gpt-4.1")                 # or connect("copilot:gpt-4.1")
    CopilotAdapter("claude-sonnet-4", on_device_code=lambda code: print(code.user_code))

This uses GitHub's **undocumented** Copilot API the way the Copilot editor plugins do (PROTOCOLS.md
§1–§3, ``docs/copilot-login.md``): a GitHub token (from the ``github_token`` argument,
``$DISPATCH_NB_GITHUB_TOKEN``, our token file, or a Copilot editor login) is exchanged for a
short-lived Copilot token (:class:`~dispatch_nb.auth.CopilotTokenManager`: refreshed before it runs
out and once after a 401/403, one exchange at a time however many threads or tasks share the
adapter), and requests go to the token's ``endpoints.api`` with editor headers.

**Not signed in**: with ``on_device_code`` the adapter runs GitHub's device flow on first use — it
calls ``on_device_code(DeviceCode)`` so a UI can show the code, polls until it is approved, and
stores the token (mode 0600) — else it raises :class:`~dispatch_nb.errors.AuthenticationError`
("not signed in to GitHub Copilot: run `python -m dispatch_nb login` or `%chat login`").

**Models**: ``GET /models`` is read once per adapter, on the first call (or ``list_models()``): it
tells which endpoint a model speaks (``/chat/completions``, else ``/responses`` when that is the only
one listed), and an unknown model name becomes a
:class:`~dispatch_nb.errors.ModelUnavailableError` listing the models on offer. ``list_models()``
shows what the editors' model pickers show (``model_picker_enabled``, ``capabilities.type ==
"chat"``, policy enabled or absent), with the premium-request multiplier of each.

**Requests**: chat.completions through :mod:`.openai_chat` (Copilot's stream quirks included:
empty-choices first chunks, Claude's reused tool-call index, text and tools in different choices,
``stop`` with tool calls, usage on any chunk); Claude's ``reasoning_text`` / ``reasoning_opaque``
become a :class:`~dispatch_nb.types.ThinkingBlock` (``signature`` = the opaque value, provider data
``{"openai_chat": {"field": "reasoning_text", "provider": "copilot"}}``) that is sent back on the
next assistant message — only thinking marked as Copilot's is. ``/responses`` models go through
:mod:`.openai_responses`. Headers: ``Authorization: Bearer <Copilot token>``,
``Copilot-Integration-Id``, ``Editor-Version``, ``Editor-Plugin-Version``, ``User-Agent``,
``OpenAI-Intent``, ``X-GitHub-Api-Version``, a fresh ``X-Request-Id`` per request,
``X-Initiator: user`` for a turn the user typed and ``agent`` when the last message is anything else
(tool results: proxies count only user turns as premium requests; the ``initiator`` option
overrides it), and ``Copilot-Vision-Request: true`` when a message holds an image.

**Errors** (PROTOCOLS.md §3.6): 401/403 → a new Copilot token and one retry, then
:class:`~dispatch_nb.errors.AuthenticationError`; 402 → :class:`~dispatch_nb.errors.RateLimitError`
with code ``quota_exceeded`` (not retried; the message says when the quota resets when GitHub
says); 429 → ``RateLimitError`` with ``retry_after``; 466 (client too old), 422 (content filter),
400 → :class:`~dispatch_nb.errors.RequestError`; 5xx → :class:`~dispatch_nb.errors.ServerError`
(retried). Token-exchange problems (``no_copilot_access``...) come from the token manager. No
GitHub or Copilot token ever appears in a repr, a log record or an exception message.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as _dt
import logging
import os
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from typing import Any, Literal

import httpx
import orjson

from ..adapter import ChatRequest, ValidationResult
from ..auth import (
    COPILOT_CLIENT_ID,
    DEFAULT_COPILOT_API_URL,
    EDITOR_HEADERS,
    CopilotAuth,
    CopilotTokenManager,
    DeviceCode,
    DeviceFlow,
    FoundToken,
    TokenStore,
    default_github_api_url,
    default_github_url,
    device_login,
    find_github_token,
)
from ..call_control import CallControl
from ..errors import (
    AuthenticationError,
    DispatchError,
    ModelUnavailableError,
    RateLimitError,
    RequestError,
    ServerError,
    error_for_status,
    parse_retry_after,
)
from ..http_adapter import HTTPAdapter, StreamParser, WireRequest, error_details
from ..stream import Accumulator
from ..structured import requested_mode, unsupported_mode
from ..types import ImageBlock, Message, ModelInfo, StreamDelta, TextBlock
from .openai_chat import (
    CHAT_OPTIONS,
    REASONING_FIELDS,
    ChatStreamParser,
    build_chat_body,
    parse_chat_completion,
)
from .openai_responses import (
    RESPONSES_OPTIONS,
    ResponsesStreamParser,
    build_responses_body,
    parse_response_object,
)

__all__ = [
    "COPILOT_API_VERSION",
    "COPILOT_INTEGRATION_ID",
    "COPILOT_OPTIONS",
    "FALLBACK_CONTEXT_TOKENS",
    "NOT_SIGNED_IN",
    "CopilotAdapter",
    "copilot_endpoint",
    "copilot_error",
    "copilot_model_info",
    "fallback_context_tokens",
    "has_images",
    "initiator_for",
    "is_picker_model",
]

log = logging.getLogger(__name__)

PROVIDER = "copilot"

#: ``Copilot-Integration-Id``: the Copilot API refuses requests without it (400).
COPILOT_INTEGRATION_ID = "vscode-chat"
#: ``X-GitHub-Api-Version`` of the Copilot API requests (VS Code's).
COPILOT_API_VERSION = "2025-05-01"
#: ``OpenAI-Intent`` (what copilot-api and litellm send for chat).
OPENAI_INTENT = "conversation-panel"

NOT_SIGNED_IN = "not signed in to GitHub Copilot: run `python -m dispatch_nb login` or `%chat login`"

#: per-call options: the chat.completions and Responses ones, plus ``initiator`` ("user"/"agent")
COPILOT_OPTIONS = frozenset(CHAT_OPTIONS | RESPONSES_OPTIONS | {"initiator"})

#: Approximate context windows (tokens) by model-name prefix, longest prefix first; used only
#: while the model list is unknown (offline, or before the first call).
FALLBACK_CONTEXT_TOKENS: tuple[tuple[str, int], ...] = (
    ("gpt-4.1", 128_000),
    ("gpt-4o", 128_000),
    ("gpt-5", 128_000),
    ("o1", 200_000),
    ("o3", 200_000),
    ("o4", 200_000),
    ("claude", 200_000),
    ("gemini", 128_000),
    ("grok", 128_000),
)

#: Copilot's chat stream carries reasoning in these delta fields (Claude: ``reasoning_text``).
COPILOT_REASONING_FIELDS: tuple[str, ...] = (*REASONING_FIELDS, "cot_summary")

Route = Literal["chat/completions", "responses"]
_CHAT_PATH: Route = "chat/completions"
_RESPONSES_PATH: Route = "responses"

_LOGIN_HINT = "`python -m dispatch_nb login` or `%chat login`"
_PLANS_URL = "https://github.com/features/copilot/plans"

_EDITOR_HEADERS_LOWER = {k.lower(): v for k, v in EDITOR_HEADERS.items()}


# -- sans-I/O helpers ------------------------------------------------------------------------------
def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _int(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return int(value) if value > 0 else None


def _output_limit(entry: Mapping[str, Any] | None) -> int | None:
    limits = _dict(_dict(_dict(entry).get("capabilities")).get("limits"))
    return _int(limits.get("max_output_tokens"))


def is_picker_model(entry: Mapping[str, Any]) -> bool:
    """Whether editors show this ``/models`` entry in their model picker (zed's and
    CopilotChat.nvim's rule): ``model_picker_enabled``, ``capabilities.type == "chat"``, and a
    ``policy`` that is absent or ``enabled``."""
    if entry.get("model_picker_enabled") is not True:
        return False
    if _dict(entry.get("capabilities")).get("type") != "chat":
        return False
    policy = entry.get("policy")
    return policy is None or _dict(policy).get("state") == "enabled"


def copilot_model_info(entry: Mapping[str, Any]) -> ModelInfo | None:
    """One ``GET /models`` entry → :class:`ModelInfo` (None for an entry without an id).

    ``max_context_tokens`` is ``limits.max_context_window_tokens``; ``premium_multiplier`` is
    ``billing.multiplier`` (0 for models that cost no premium requests); ``endpoints`` is
    ``supported_endpoints``. Extras: ``max_prompt_tokens``, ``family``, ``preview``,
    ``model_picker_enabled``, ``policy_state``, ``supports_thinking``, ``reasoning_effort``.
    """
    model_id = entry.get("id")
    if not isinstance(model_id, str) or not model_id:
        return None
    caps = _dict(entry.get("capabilities"))
    limits = _dict(caps.get("limits"))
    supports = _dict(caps.get("supports"))
    billing = _dict(entry.get("billing"))
    prompt = _int(limits.get("max_prompt_tokens"))
    output = _int(limits.get("max_output_tokens"))
    context = _int(limits.get("max_context_window_tokens"))
    if context is None and prompt is not None:
        context = prompt + (output or 0)
    multiplier: float | None = None
    raw_multiplier = billing.get("multiplier")
    if isinstance(raw_multiplier, (int, float)) and not isinstance(raw_multiplier, bool):
        multiplier = float(raw_multiplier)
    elif billing.get("is_premium") is False:
        multiplier = 0.0
    endpoints = [e for e in entry.get("supported_endpoints") or [] if isinstance(e, str)]
    extra: dict[str, Any] = {
        "max_prompt_tokens": prompt,
        "family": caps.get("family") if isinstance(caps.get("family"), str) else None,
        "preview": bool(entry.get("preview", False)),
        "model_picker_enabled": bool(entry.get("model_picker_enabled", False)),
        "policy_state": _dict(entry.get("policy")).get("state"),
        "supports_thinking": bool(supports.get("thinking", False)),
    }
    effort = supports.get("reasoning_effort")
    if isinstance(effort, list):
        extra["reasoning_effort"] = [e for e in effort if isinstance(e, str)]
    vendor = entry.get("vendor")
    name = entry.get("name")
    return ModelInfo(
        id=model_id,
        name=name if isinstance(name, str) and name else model_id,
        max_context_tokens=context,
        supports_vision=bool(supports.get("vision", False)),
        supports_tool_use=bool(supports.get("tool_calls", False)),
        supports_streaming=bool(supports.get("streaming", True)),
        max_output_tokens=output,
        vendor=vendor if isinstance(vendor, str) else None,
        premium_multiplier=multiplier,
        endpoints=endpoints,
        **extra,
    )


def copilot_endpoint(entry: Mapping[str, Any] | None, model: str) -> Route:
    """Where a model is spoken to: ``responses`` when its ``supported_endpoints`` list
    ``/responses`` but not ``/chat/completions`` (VS Code's rule), else ``chat/completions``.
    Without an entry (the model list is unavailable) Codex models go to ``responses``."""
    if entry is None:
        return _RESPONSES_PATH if "codex" in model.lower() else _CHAT_PATH
    endpoints = entry.get("supported_endpoints")
    if (
        isinstance(endpoints, list)
        and "/chat/completions" not in endpoints
        and "/responses" in endpoints
    ):
        return _RESPONSES_PATH
    return _CHAT_PATH


def fallback_context_tokens(model: str) -> int | None:
    """The built-in, approximate context window for ``model`` (None when unknown)."""
    name = model.lower()
    for prefix, tokens in FALLBACK_CONTEXT_TOKENS:
        if name.startswith(prefix):
            return tokens
    return None


def has_images(messages: Sequence[Message]) -> bool:
    """Whether any message holds an image (then Copilot wants ``Copilot-Vision-Request``)."""
    return any(
        isinstance(block, ImageBlock)
        for message in messages
        if not isinstance(message.content, str)
        for block in message.content
    )


def initiator_for(messages: Sequence[Message]) -> Literal["user", "agent"]:
    """``X-Initiator``: ``user`` when the last message is a user turn of text and images (someone
    typed it), ``agent`` otherwise (tool results, a continuation of an assistant turn)."""
    if not messages:
        return "user"
    last = messages[-1]
    if last.role != "user":
        return "agent"
    if isinstance(last.content, str):
        return "user"
    blocks = last.content
    if blocks and all(isinstance(b, (TextBlock, ImageBlock)) for b in blocks):
        return "user"
    return "agent"


def _json_object(body: bytes) -> dict[str, Any]:
    try:
        data = orjson.loads(body) if body else None
    except orjson.JSONDecodeError:
        return {}
    return data if isinstance(data, dict) else {}


def _in_words(seconds: float) -> str:
    if seconds < 90:
        return f"{max(1, round(seconds))} seconds"
    if seconds < 90 * 60:
        return f"{round(seconds / 60)} minutes"
    if seconds < 48 * 3600:
        return f"{round(seconds / 3600)} hours"
    return f"{round(seconds / 86400)} days"


def _when(seconds: float) -> str:
    at = _dt.datetime.now().astimezone() + _dt.timedelta(seconds=seconds)
    return f"in {_in_words(seconds)} ({at:%Y-%m-%d %H:%M %Z})"


def copilot_error(
    status: int,
    body: bytes,
    headers: Mapping[str, str],
    *,
    available: Sequence[str] = (),
) -> DispatchError:
    """The :class:`DispatchError` for an HTTP error from the Copilot API (PROTOCOLS.md §3.6).

    (A 401/403 that a new Copilot token may cure gets here only after
    :class:`~dispatch_nb.auth.CopilotAuth` refreshed the token and resent once.)
    ``available`` (model ids) decorates a "model not found" error.
    """
    message, etype = error_details(body)
    data = _json_object(body)
    inner = _dict(data.get("error")) or data
    request_id = headers.get("x-request-id") or headers.get("x-github-request-id")
    kw: dict[str, Any] = {
        "status_code": status,
        "provider": PROVIDER,
        "request_id": request_id,
        "provider_code": etype,
    }
    retry_after = parse_retry_after(headers)
    if status in (401, 403):
        authorize_url = inner.get("authorize_url") or data.get("authorize_url")
        if isinstance(authorize_url, str) and authorize_url:
            return AuthenticationError(
                f"GitHub Copilot needs you to authorize this first: open {authorize_url} "
                f"(GitHub says: {message})",
                **kw,
            )
        return AuthenticationError(f"GitHub Copilot rejected the request: {message}", **kw)
    quota_codes = ("quota_exceeded", "free_quota_exceeded", "overage_limit_reached",
                   "billing_not_configured")
    if status == 402 or (etype or "").split(":")[0] in quota_codes:
        text = (
            "GitHub Copilot quota exceeded: this account has used up its premium requests "
            "(or its Copilot Free allowance) for now"
        )
        text += f"; the quota resets {_when(retry_after)}." if retry_after else "."
        text += (
            f" GitHub says: {message}. Models with a premium multiplier of 0 (see "
            f"list_models()) keep working; more requests: {_PLANS_URL}."
        )
        return RateLimitError(
            text, retry_after=retry_after, code="quota_exceeded", retryable=False, **kw
        )
    if status == 429:
        limit = headers.get("x-ratelimit-exceeded")
        if etype == "extension_blocked":
            return RateLimitError(
                f"GitHub Copilot has blocked this client (extension_blocked): {message}",
                retry_after=retry_after,
                retryable=False,
                **kw,
            )
        text = f"GitHub Copilot rate limit: {message}"
        if limit:
            text += f" (limit: {limit})"
        if retry_after:
            text += f"; retry {_when(retry_after)}"
        return RateLimitError(text, retry_after=retry_after, **kw)
    if status == 466:
        return RequestError(
            f"GitHub Copilot no longer accepts this client version (HTTP 466: {message}). "
            f"dispatch_nb identifies itself as {EDITOR_HEADERS['Editor-Version']} / "
            f"{EDITOR_HEADERS['Editor-Plugin-Version']}; update dispatch_nb "
            "(`pip install -U dispatch_nb`).",
            code="client_not_supported",
            **kw,
        )
    if status == 422:
        return RequestError(
            f"GitHub Copilot's content filter blocked this request: {message}",
            code="content_filter",
            **kw,
        )
    if status == 400 and "off_topic" in message:
        return RequestError(
            "GitHub Copilot refused the prompt as off topic (its intent filter). Rephrase it.",
            code="content_filter",
            **kw,
        )
    if status == 499:
        return ServerError(f"GitHub Copilot cancelled the request: {message}", **kw)
    error = error_for_status(
        status,
        message,
        provider=PROVIDER,
        error_type=etype,
        headers=headers,
        request_id=request_id,
    )
    if isinstance(error, ModelUnavailableError) and available:
        error.available = list(available)
        error.message = f"{error.message} (available: {', '.join(available)})"
        error.args = (error.message,)
    return error


# -- the parsers of the two routes ------------------------------------------------------------------
def _chat_parser(acc: Accumulator) -> StreamParser:
    return ChatStreamParser(
        acc,
        provider=PROVIDER,
        reasoning_fields=COPILOT_REASONING_FIELDS,
        reasoning_provider=PROVIDER,
    )


def _responses_parser(acc: Accumulator) -> StreamParser:
    return ResponsesStreamParser(acc, provider=PROVIDER)


def _chat_body(body: Any, acc: Accumulator) -> None:
    parse_chat_completion(
        body,
        acc,
        provider=PROVIDER,
        reasoning_fields=COPILOT_REASONING_FIELDS,
        reasoning_provider=PROVIDER,
    )


def _responses_body(body: Any, acc: Accumulator) -> None:
    parse_response_object(body, acc, provider=PROVIDER)


# -- the adapter -----------------------------------------------------------------------------------
class CopilotAdapter(HTTPAdapter):
    """GitHub Copilot's chat models (see the module docstring).

    ``github_url`` / ``github_api_url``: ``None`` (the default) means ``$DISPATCH_NB_GITHUB_URL``,
    else ``https://github.com``, and ``$DISPATCH_NB_GITHUB_API_URL``, else the API URL of that
    GitHub (``https://api.github.com`` for github.com); a value given here always wins over the
    environment. ``token_path``: our token file (default ``$DISPATCH_NB_HOME/github_token.json``).
    ``on_device_code(code)``: called with the :class:`~dispatch_nb.auth.DeviceCode` to show when a
    device-flow login is needed (possibly from a worker thread in async code); without it a
    missing login is an :class:`AuthenticationError`. ``token_manager``: share one
    :class:`~dispatch_nb.auth.CopilotTokenManager` (one Copilot token) among several adapters;
    ``github_token`` / ``token_path`` / ``on_device_code`` then play no part in the exchange.
    """

    provider_options: frozenset[str] = COPILOT_OPTIONS

    def __init__(
        self,
        model: str = "gpt-4.1",
        github_token: str | None = None,
        token_path: str | os.PathLike[str] | None = None,
        max_tokens: int | None = 8192,
        *,
        client_id: str = COPILOT_CLIENT_ID,
        github_url: str | None = None,
        github_api_url: str | None = None,
        on_device_code: Callable[[DeviceCode], Any] | None = None,
        timeout: float | None = None,
        max_retries: int = 2,
        http_client: httpx.Client | None = None,
        async_http_client: httpx.AsyncClient | None = None,
        token_manager: CopilotTokenManager | None = None,
        structured_output: str = "auto",
    ) -> None:
        if not model or not isinstance(model, str):
            raise ValueError("model must be a non-empty string, e.g. 'gpt-4.1'")
        self._github_url = (github_url or default_github_url()).rstrip("/")
        self._github_api_url = (
            github_api_url or default_github_api_url(self._github_url)
        ).rstrip("/")
        self._manager = token_manager or CopilotTokenManager(
            self._github_token,
            github_api_url=self._github_api_url,
            http_client=http_client,
            async_http_client=async_http_client,
        )
        cached = self._manager.cached
        super().__init__(
            base_url=cached.endpoints_api if cached is not None else DEFAULT_COPILOT_API_URL,
            headers={
                **_EDITOR_HEADERS_LOWER,
                "copilot-integration-id": COPILOT_INTEGRATION_ID,
                "openai-intent": OPENAI_INTENT,
                "x-github-api-version": COPILOT_API_VERSION,
            },
            http_client=http_client,
            async_http_client=async_http_client,
            max_tokens=max_tokens,
            timeout=timeout,
            max_retries=max_retries,
        )
        self._model = model
        self._github_token_arg = github_token
        self._token_path = token_path
        self._client_id = client_id
        self._on_device_code = on_device_code
        self._given_http = http_client
        self._login_lock = threading.Lock()
        self._login_token: str | None = None
        self._token_source: str | None = None
        self._models_lock = threading.Lock()
        self._raw_models: list[dict[str, Any]] | None = None
        self._models_failed = False
        self._entry: dict[str, Any] | None = None
        #: the Copilot token on every request, one refresh and resend after a 401
        self._owns_manager = token_manager is None
        self._auth = CopilotAuth(
            self._manager, prepare=self._ensure_signed_in, aprepare=self._aensure_signed_in
        )
        #: the same without a device login (validate(), max_context_tokens)
        self._auth_no_login = CopilotAuth(self._manager)
        self.backend_mode = self._backend_for(copilot_endpoint(None, model))
        #: how ``output=`` is asked for (see :meth:`output_mode`)
        self.structured_output = structured_output

    # -- identity --------------------------------------------------------------------------------
    @property
    def model_name(self) -> str:
        return self._model

    @property
    def provider_name(self) -> str:
        return PROVIDER

    @property
    def display_name(self) -> str:
        return "GitHub Copilot"

    @property
    def github_url(self) -> str:
        """The GitHub this adapter logs in to (device flow, token file host)."""
        return self._github_url

    @property
    def github_api_url(self) -> str:
        """Where the Copilot token is exchanged (``{github_api_url}/copilot_internal/v2/token``)."""
        return self._manager.github_api_url

    @property
    def token_manager(self) -> CopilotTokenManager:
        """The manager that exchanges and refreshes this adapter's Copilot token."""
        return self._manager

    @property
    def token_source(self) -> str | None:
        """Where the GitHub token came from ("argument", a path...), once one was used."""
        return self._token_source

    @property
    def base_url(self) -> str:
        """The Copilot API: the current token's ``endpoints.api`` (before the first exchange,
        ``https://api.githubcopilot.com``)."""
        token = self._manager.cached
        return token.endpoints_api if token is not None else self._base_url

    def __repr__(self) -> str:
        return f"CopilotAdapter(model={self._model!r}, github_url={self._github_url!r})"

    @property
    def max_context_tokens(self) -> int | None:
        """The model's context window from Copilot's model list (fetched once if need be, never
        with a login prompt); the built-in approximate table when the list is unavailable."""
        if self._raw_models is None and not self._models_failed:
            try:
                self._load_models(login=False)
            except DispatchError as exc:
                self._models_failed = True
                log.debug("no Copilot model list for max_context_tokens: %s", exc.message)
        entry = self._find_entry(self._raw_models or [])
        info = copilot_model_info(entry) if entry is not None else None
        if info is not None and info.max_context_tokens:
            return info.max_context_tokens
        return fallback_context_tokens(self._model)

    # -- the GitHub token ------------------------------------------------------------------------
    def _find_github_token(self) -> FoundToken | None:
        found = find_github_token(
            self._github_token_arg,
            token_path=self._token_path,
            github_url=self._github_url,
            client_id=self._client_id,
        )
        if found is None and self._login_token:
            found = FoundToken(self._login_token, "device-flow login")
        if found is not None and found.source != self._token_source:
            self._token_source = found.source
            log.debug("GitHub Copilot: using the GitHub token from %s", found.source)
        return found

    def _github_token(self) -> str:
        """The GitHub token to exchange (the token manager calls this on every exchange; a login,
        if one is due, ran before, in :meth:`_ensure_signed_in`)."""
        found = self._find_github_token()
        if found is not None:
            return found.token
        raise AuthenticationError(NOT_SIGNED_IN, provider=PROVIDER)

    def _login_due(self) -> bool:
        """Whether the next request needs a device login first: ``on_device_code`` was given,
        this adapter's own manager is about to exchange, and no GitHub token is found."""
        if self._on_device_code is None or not self._owns_manager:
            return False
        cached = self._manager.cached
        if cached is not None and not cached.needs_refresh(time.time()):
            return False
        return self._find_github_token() is None

    def _ensure_signed_in(self) -> None:
        """Run a pending device-flow login (the auth flow calls this before each request)."""
        if self._login_due():
            self._device_login()

    def _device_login(self) -> str:
        """Run the device flow once (for all threads), store the token, return it."""
        with self._login_lock:
            found = self._find_github_token()
            if found is not None:
                return found.token
            assert self._on_device_code is not None
            store = TokenStore(self._token_path)
            result = device_login(
                DeviceFlow(self._client_id, github_url=self._github_url,
                           http_client=self._given_http),
                store=store,
                github_api_url=self._github_api_url,
                on_code=self._on_device_code,
                http_client=self._given_http,
                keep_unsaved=True,
            )
            self._login_token = result.token
            if result.save_error is not None:
                log.warning(
                    "GitHub Copilot: logged in, but could not save the GitHub token to %s (%s); "
                    "it is kept in memory for this adapter only",
                    store.path,
                    result.save_error.strerror or type(result.save_error).__name__,
                )
            self._token_source = str(store.path)
            return result.token

    async def _aensure_signed_in(self) -> None:
        """Run a pending device-flow login on a worker thread, not on the event loop."""
        if self._login_due():
            await asyncio.to_thread(self._device_login)

    # -- auth ------------------------------------------------------------------------------------
    def http_auth(self) -> CopilotAuth:
        """The Copilot token on every request (exchanged or refreshed when need be; a new one and
        one resend after a 401/403) — see :class:`~dispatch_nb.auth.CopilotAuth`. The editor
        headers are the adapter's fixed headers."""
        return self._auth

    # -- requests (sans-I/O) ---------------------------------------------------------------------
    def _route(self) -> Route:
        return copilot_endpoint(self._entry, self._model)

    @staticmethod
    def _backend_for(route: Route) -> str:
        return "responses" if route == _RESPONSES_PATH else "chat"

    def _openai_model(self) -> bool:
        vendor = _dict(self._entry).get("vendor")
        if isinstance(vendor, str) and vendor:
            return vendor.lower() in ("openai", "azure openai")
        return self._model.lower().startswith(("gpt-", "o1", "o3", "o4", "chatgpt-"))

    def output_mode(self, request: ChatRequest) -> str | None:
        """Structured output on the wire: ``text.format`` for models on ``/responses``;
        ``response_format`` (``json_schema``) for OpenAI's models on ``/chat/completions``; a
        forced function (``tool``) for the other vendors' models there (Claude, Gemini...), for
        which Copilot does not document ``response_format``."""
        if request.output is None:
            return None
        mode = requested_mode(self, request)
        responses = self._route() == _RESPONSES_PATH
        if mode == "auto":
            if responses:
                return "text.format"
            return "response_format" if self._openai_model() else "tool"
        if mode == "native":
            return "text.format" if responses else "response_format"
        if mode in ("tool", "prompt") or (mode == "json_object" and not responses):
            return mode
        raise unsupported_mode(self, mode, ("auto", "native", "tool", "prompt"))

    def build_request(self, request: ChatRequest) -> WireRequest:
        initiator = request.options.get("initiator") or initiator_for(request.messages)
        if initiator not in ("user", "agent"):
            raise ValueError(f"initiator must be 'user' or 'agent', not {initiator!r}")
        headers = {"x-request-id": str(uuid.uuid4()), "x-initiator": initiator}
        if has_images(request.messages):
            headers["copilot-vision-request"] = "true"
        limit = _output_limit(self._entry)
        if (
            limit is not None
            and request.max_tokens is not None
            and request.max_tokens == self.default_max_tokens
            and request.max_tokens > limit
        ):
            # the adapter's default, not the caller's choice: keep within what the model allows
            request = dataclasses.replace(request, max_tokens=limit)
        route = self._route()
        mode = self.output_mode(request)
        if route == _RESPONSES_PATH:
            body = build_responses_body(request, self._model, provider=PROVIDER, output_mode=mode)
            return WireRequest(
                "POST", route, json=body, headers=headers,
                stream_parser=_responses_parser, parse_body=_responses_body,
            )
        body = build_chat_body(
            request,
            self._model,
            provider=PROVIDER,
            echo_reasoning=True,
            reasoning_provider=PROVIDER,
            output_mode=mode,
        )
        return WireRequest(
            "POST", route, json=body, headers=headers,
            stream_parser=_chat_parser, parse_body=_chat_body,
        )

    def stream_parser(self, request: ChatRequest, acc: Accumulator) -> StreamParser:
        """The parser of the route the model is spoken to (each request names its own)."""
        if self._route() == _RESPONSES_PATH:
            return _responses_parser(acc)
        return _chat_parser(acc)

    def parse_body(self, request: ChatRequest, body: Any, acc: Accumulator) -> None:
        if self._route() == _RESPONSES_PATH:
            _responses_body(body, acc)
        else:
            _chat_body(body, acc)

    def parse_error(self, status: int, body: bytes, headers: httpx.Headers) -> DispatchError:
        available = [m.id for m in self._picker_infos()] if self._raw_models else []
        return copilot_error(status, body, headers, available=available)

    # -- one attempt: the model check first ------------------------------------------------------
    def _stream_once(
        self, request: ChatRequest, acc: Accumulator, control: CallControl
    ) -> Iterator[StreamDelta]:
        self._check_model()
        yield from super()._stream_once(request, acc, control)

    async def _astream_once(
        self, request: ChatRequest, acc: Accumulator, control: CallControl
    ) -> AsyncIterator[StreamDelta]:
        await self._acheck_model()
        async for delta in super()._astream_once(request, acc, control):
            yield delta

    # -- models ----------------------------------------------------------------------------------
    def _find_entry(self, raw: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
        return next((e for e in raw if e.get("id") == self._model), None)

    def _store_models(self, body: Any) -> list[dict[str, Any]]:
        data = body.get("data") if isinstance(body, dict) else body
        raw = [dict(e) for e in data or [] if isinstance(e, dict) and isinstance(e.get("id"), str)]
        self._raw_models = raw
        self._models_failed = False
        log.debug("GitHub Copilot lists %d models", len(raw))
        return raw

    def _models_url(self) -> str:
        return f"{self.base_url}/models"

    def _models_headers(self) -> dict[str, str]:
        return {"x-request-id": str(uuid.uuid4())}

    def _load_models(self, refresh: bool = False, *, login: bool = True) -> list[dict[str, Any]]:
        raw = self._raw_models
        if raw is not None and not refresh:
            return raw
        with self._models_lock:
            if self._raw_models is not None and not refresh:
                return self._raw_models
            body = self.get_json(self._models_url(), headers=self._models_headers(),
                                 auth=self._auth if login else self._auth_no_login)
            return self._store_models(body)

    async def _aload_models(self, refresh: bool = False) -> list[dict[str, Any]]:
        if self._raw_models is not None and not refresh:
            return self._raw_models
        body = await self.aget_json(self._models_url(), headers=self._models_headers())
        return self._store_models(body)

    def _picker_infos(self) -> list[ModelInfo]:
        seen: set[str] = set()
        out: list[ModelInfo] = []
        for entry in self._raw_models or []:
            if not is_picker_model(entry) or entry["id"] in seen:
                continue
            info = copilot_model_info(entry)
            if info is not None:
                seen.add(info.id)
                out.append(info)
        return out

    def list_models(self, refresh: bool = False) -> list[ModelInfo]:
        """The chat models Copilot's model pickers show for this account (``GET /models``,
        cached per adapter; ``refresh=True`` fetches again)."""
        self._load_models(refresh)
        return self._picker_infos()

    async def alist_models(self, refresh: bool = False) -> list[ModelInfo]:
        """The async twin of :meth:`list_models`."""
        await self._aload_models(refresh)
        return self._picker_infos()

    def _use_models(self, raw: list[dict[str, Any]]) -> None:
        entry = self._find_entry(raw)
        if entry is None:
            available = [m.id for m in self._picker_infos()]
            raise ModelUnavailableError(
                f"GitHub Copilot has no model {self._model!r} for this account. "
                f"Available: {', '.join(available) or '(none)'}",
                provider=PROVIDER,
                available=available,
            )
        self._entry = entry
        self.backend_mode = self._backend_for(self._route())

    def _check_model(self) -> None:
        if self._entry is not None:
            return
        try:
            raw = self._load_models()
        except (ServerError, RequestError) as exc:
            log.debug("GitHub Copilot: no model list (%s); routing %s by its name",
                      exc.message, self._model)
            return
        self._use_models(raw)

    async def _acheck_model(self) -> None:
        if self._entry is not None:
            return
        try:
            raw = await self._aload_models()
        except (ServerError, RequestError) as exc:
            log.debug("GitHub Copilot: no model list (%s); routing %s by its name",
                      exc.message, self._model)
            return
        self._use_models(raw)

    # -- validate --------------------------------------------------------------------------------
    def validate(self) -> ValidationResult:
        """Exchange the GitHub token for a Copilot token and read the model list; never starts a
        login. Not ok when not signed in, Copilot refuses the account, or the model is unknown."""
        try:
            token = self._manager.get()  # never a login: that runs only in the auth flow
            self._load_models(refresh=True, login=False)
            models = self._picker_infos()
        except AuthenticationError as exc:
            return ValidationResult(False, f"GitHub Copilot: {exc.message}")
        except DispatchError as exc:
            return ValidationResult(False, f"GitHub Copilot could not be checked: {exc}")
        if self._find_entry(self._raw_models or []) is None:
            return ValidationResult(
                False,
                f"GitHub Copilot accepted the login, but has no model {self._model!r}; "
                f"available: {', '.join(m.id for m in models) or '(none)'}",
            )
        plan = f", plan {token.sku}" if token.sku else ""
        return ValidationResult(
            True, f"GitHub Copilot accepted the credentials ({len(models)} models{plan})"
        )

