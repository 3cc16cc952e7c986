"""GitHub Copilot: the models of a Copilot subscription, through GitHub's undocumented Copilot API
(PROTOCOLS.md §1–§3; what the user sees — login, models, premium requests, ``X-Initiator``,
errors — is docs/copilot-login.md). The auth is :mod:`dispatch_nb.auth`'s, the model catalogue
:mod:`.copilot_models`, the error table :mod:`.copilot_errors`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from typing import TYPE_CHECKING, Any, Literal

import httpx

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
from ..bridge import run_sync
from ..call_control import CallControl
from ..errors import (
    AuthenticationError,
    DispatchError,
    ModelUnavailableError,
    RequestError,
    ServerError,
)
from ..http_adapter import HTTPAdapter, WireRequest
from ..stream import Accumulator
from ..types import ImageBlock, Message, ModelInfo, StreamDelta, TextBlock, Usage
from ..wire.chat_completions import (
    CHAT_OPTIONS,
    REASONING_FIELDS,
    ChatCompletionsWire,
    ChatQuirks,
)
from ..wire.request import requested_mode
from ..wire.responses import RESPONSES_OPTIONS, ResponsesWire
from .copilot_errors import copilot_error
from .copilot_models import (
    Route,
    copilot_endpoint,
    copilot_model_info,
    fallback_context_tokens,
    find_entry,
    is_openai_model,
    is_picker_model,
    model_entries,
    output_limit,
    picker_models,
)

if TYPE_CHECKING:
    from ..cost import Cost

__all__ = [
    "COPILOT_CHAT_QUIRKS",
    "NOT_SIGNED_IN",
    "CopilotAdapter",
    "copilot_endpoint",
    "copilot_error",
    "copilot_model_info",
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

#: Copilot's chat stream carries reasoning in these delta fields (Claude: ``reasoning_text``).
COPILOT_REASONING_FIELDS: tuple[str, ...] = (*REASONING_FIELDS, "cot_summary")

#: How Copilot's ``/chat/completions`` differs from plain chat.completions: Claude's
#: ``reasoning_text`` / ``reasoning_opaque`` (and ``cot_summary``) are read as thinking marked as
#: Copilot's, and sent back on the next assistant message — only thinking marked so.
COPILOT_CHAT_QUIRKS = ChatQuirks(
    echo_reasoning=True, reasoning_provider=PROVIDER, reasoning_fields=COPILOT_REASONING_FIELDS
)
#: The two wire formats Copilot speaks, chosen per model (:func:`copilot_endpoint`).
COPILOT_WIRES: dict[Route, ChatCompletionsWire | ResponsesWire] = {
    "chat/completions": ChatCompletionsWire(PROVIDER, COPILOT_CHAT_QUIRKS),
    "responses": ResponsesWire(PROVIDER),
}


def initiator_for(messages: Sequence[Message]) -> Literal["user", "agent"]:
    """``X-Initiator``: ``user`` when the last message is a user turn of text and images (someone
    typed it), ``agent`` otherwise (tool results, a continuation of an assistant turn)."""
    if not messages:
        return "user"
    last = messages[-1]
    typed = isinstance(last.content, str) or (
        bool(last.content) and all(isinstance(b, (TextBlock, ImageBlock)) for b in last.content)
    )
    return "user" if last.role == "user" and typed else "agent"


# -- the adapter -----------------------------------------------------------------------------------
class CopilotAdapter(HTTPAdapter):
    """GitHub Copilot's chat models; the arguments, the login and where the GitHub token comes
    from: docs/copilot-login.md. With a shared ``token_manager``, ``github_token`` /
    ``token_path`` / ``on_device_code`` play no part in the exchange."""

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
            async_http_client=async_http_client,
        )
        super().__init__(
            base_url=DEFAULT_COPILOT_API_URL,  # until a token names its API (the base_url property)
            model=model,
            headers={
                **{k.lower(): v for k, v in EDITOR_HEADERS.items()},
                "copilot-integration-id": COPILOT_INTEGRATION_ID,
                "openai-intent": OPENAI_INTENT,
                "x-github-api-version": COPILOT_API_VERSION,
            },
            async_http_client=async_http_client, max_tokens=max_tokens, timeout=timeout,
            max_retries=max_retries,
        )
        self._github_token_arg = github_token
        self._token_path = token_path
        self._client_id = client_id
        self._on_device_code = on_device_code
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
        self.backend_mode = "responses" if self.route == "responses" else "chat"
        #: how ``output=`` is asked for (see :meth:`output_mode`)
        self.structured_output = structured_output

    # -- identity --------------------------------------------------------------------------------
    provider_name = PROVIDER
    display_name = "GitHub Copilot"

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
        info = self._info()
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
        """Run a pending device-flow login, once for all threads, and keep its token (the auth
        flow calls this before each request)."""
        if not self._login_due():
            return
        with self._login_lock:
            if self._find_github_token() is not None:
                return
            assert self._on_device_code is not None
            store = TokenStore(self._token_path)
            result = device_login(DeviceFlow(self._client_id, github_url=self._github_url), store=store,
                                  github_api_url=self._github_api_url, on_code=self._on_device_code,
                                  keep_unsaved=True)
            self._login_token = result.token
            if result.save_error is not None:
                log.warning("GitHub Copilot: logged in, but could not save the GitHub token to %s (%s); "
                            "it is kept in memory for this adapter only", store.path,
                            result.save_error.strerror or type(result.save_error).__name__)
            self._token_source = str(store.path)

    async def _aensure_signed_in(self) -> None:
        """Run a pending device-flow login on a worker thread, not on the event loop."""
        if self._login_due():
            await asyncio.to_thread(self._ensure_signed_in)

    # -- auth ------------------------------------------------------------------------------------
    def http_auth(self) -> CopilotAuth:
        """The Copilot token on every request (exchanged or refreshed when need be; a new one and
        one resend after a 401/403) — see :class:`~dispatch_nb.auth.CopilotAuth`. The editor
        headers are the adapter's fixed headers."""
        return self._auth

    # -- requests (sans-I/O) ---------------------------------------------------------------------
    @property
    def route(self) -> Route:
        """Where this model is spoken to: ``chat/completions`` or ``responses`` (from its model
        list entry once read, else by its name — :func:`copilot_endpoint`)."""
        return copilot_endpoint(self._entry, self._model)

    @property
    def wire(self) -> ChatCompletionsWire | ResponsesWire:  # type: ignore[override]
        """The wire format of this model's route (:data:`COPILOT_WIRES`); each request carries
        the one it was built with, and its answer is read with that one."""
        return COPILOT_WIRES[self.route]

    def output_mode(self, request: ChatRequest) -> str | None:
        """Structured output on the wire: ``text.format`` for models on ``/responses``;
        ``response_format`` (``json_schema``) for OpenAI's models on ``/chat/completions``; a
        forced function (``tool``) for the other vendors' models there (Claude, Gemini...), for
        which Copilot does not document ``response_format``."""
        wire = self.wire
        if (
            request.output is not None
            and requested_mode(self, request) == "auto"
            and wire.native_output != "text.format"
            and not is_openai_model(self._entry, self._model)
        ):
            return "tool"
        return wire.output_mode_for(self, request)

    def build_request(self, request: ChatRequest) -> WireRequest:
        """The model's wire format's request, with Copilot's per-request headers and the
        adapter's default ``max_tokens`` kept within the model's output limit."""
        initiator = request.options.get("initiator") or initiator_for(request.messages)
        if initiator not in ("user", "agent"):
            raise ValueError(f"initiator must be 'user' or 'agent', not {initiator!r}")
        headers = {"x-request-id": str(uuid.uuid4()), "x-initiator": initiator}
        if any(isinstance(block, ImageBlock) for message in request.messages
               if not isinstance(message.content, str) for block in message.content):
            headers["copilot-vision-request"] = "true"  # Copilot wants it when a message has an image
        limit = output_limit(self._entry)
        if (
            limit is not None
            and request.max_tokens is not None
            and request.max_tokens == self.default_max_tokens
            and request.max_tokens > limit
        ):
            # the adapter's default, not the caller's choice: keep within what the model allows
            request = dataclasses.replace(request, max_tokens=limit)
        return self.wire.wire_request(
            request, self._model, output_mode=self.output_mode(request), headers=headers
        )

    def parse_error(self, status: int, body: bytes, headers: httpx.Headers) -> DispatchError:
        available = [m.id for m in self._picker_infos()] if self._raw_models else []
        return copilot_error(status, body, headers, available=available)

    # -- one attempt: the model check first ------------------------------------------------------
    async def astream_once(
        self, request: ChatRequest, acc: Accumulator, control: CallControl
    ) -> AsyncIterator[StreamDelta]:
        await self._acheck_model()
        async for delta in super().astream_once(request, acc, control):
            yield delta

    # -- cost ------------------------------------------------------------------------------------
    def premium_multiplier(self) -> float | None:
        """Premium requests one user-initiated call of this model costs: ``billing.multiplier``
        of its ``/models`` entry (0 for included models; None while the list is unknown)."""
        info = self._info()
        return info.premium_multiplier if info is not None else None

    def price_call(self, request: ChatRequest, model: str, usage: Usage, *,
                   batch: bool = False) -> Cost | None:
        """The dollar price (genai-prices' ``github-copilot`` rates) and the premium requests:
        the model's multiplier for a call someone typed, 0 for the calls a tool loop makes on its
        own (``X-Initiator: agent`` is not billed as a premium request)."""
        from ..cost import price

        premium = self.premium_multiplier()
        if premium is not None and initiator_for(request.messages) == "agent":
            premium = 0.0
        return price(self.provider_name, self.model_name, usage, premium_requests=premium,
                     batch=batch)

    # -- models ----------------------------------------------------------------------------------
    def _info(self) -> ModelInfo | None:
        entry = find_entry(self._raw_models or [], self._model)
        return copilot_model_info(entry) if entry is not None else None

    async def _aload_models(self, refresh: bool = False, *, login: bool = True) -> list[dict[str, Any]]:
        if self._raw_models is None or refresh:
            body = await self.aget_json(f"{self.base_url}/models",
                                        headers={"x-request-id": str(uuid.uuid4())},
                                        auth=self._auth if login else self._auth_no_login)
            self._raw_models = model_entries(body)
            self._models_failed = False
            log.debug("GitHub Copilot lists %d models", len(self._raw_models))
        return self._raw_models

    def _load_models(self, refresh: bool = False, *, login: bool = True) -> list[dict[str, Any]]:
        if self._raw_models is not None and not refresh:  # no trip to the loop thread for it
            return self._raw_models
        with self._models_lock:  # one GET /models for all threads
            return run_sync(self._aload_models(refresh, login=login))

    def _picker_infos(self) -> list[ModelInfo]:
        return picker_models(self._raw_models or [])

    def list_models(self, refresh: bool = False) -> list[ModelInfo]:
        """The chat models Copilot's model pickers show for this account (``GET /models``,
        cached per adapter; ``refresh=True`` fetches again)."""
        self._load_models(refresh)
        return self._picker_infos()

    async def alist_models(self, refresh: bool = False) -> list[ModelInfo]:
        """The async twin of :meth:`list_models`."""
        await self._aload_models(refresh)
        return self._picker_infos()

    async def _acheck_model(self) -> None:
        """Read the model list once: the model's entry routes it, and a model not listed is an
        error naming those that are (no list: route by the name)."""
        if self._entry is not None:
            return
        try:
            entry = find_entry(await self._aload_models(), self._model)
        except (ServerError, RequestError) as exc:
            log.debug("GitHub Copilot: no model list (%s); routing %s by its name",
                      exc.message, self._model)
            return
        if entry is None:
            available = [m.id for m in self._picker_infos()]
            raise ModelUnavailableError(
                f"GitHub Copilot has no model {self._model!r} for this account. "
                f"Available: {', '.join(available) or '(none)'}",
                provider=PROVIDER,
                available=available,
            )
        self._entry = entry
        self.backend_mode = "responses" if self.route == "responses" else "chat"

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
        if find_entry(self._raw_models or [], self._model) is None:
            return ValidationResult(
                False,
                f"GitHub Copilot accepted the login, but has no model {self._model!r}; "
                f"available: {', '.join(m.id for m in models) or '(none)'}",
            )
        plan = f", plan {token.sku}" if token.sku else ""
        return ValidationResult(
            True, f"GitHub Copilot accepted the credentials ({len(models)} models{plan})"
        )

