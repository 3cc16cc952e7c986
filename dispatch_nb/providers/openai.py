"""OpenAI: the official Responses API, or any OpenAI-compatible chat.completions server.

One adapter, two explicit execution paths (no silent fallback from one to the other)::

    OpenAIAdapter("gpt-4.1")                                  # backend="official": POST /responses
    OpenAIAdapter("llama3", backend="compatible",
                  base_url="http://127.0.0.1:11434/v1")       # POST /chat/completions
    connect("openai:gpt-4.1"); connect("compatible:llama3", base_url=...)

Backend: the ``backend`` argument, else ``OPENAI_BACKEND``, else ``"official"``; an unknown value is
an error. ``base_url`` / ``OPENAI_BASE_URL`` only say where requests go and never switch the backend
(default ``https://api.openai.com/v1``; for ``compatible`` ``http://127.0.0.1:8080/v1``). API key:
``api_key``, else ``OPENAI_API_KEY`` (read when a call is made); the official backend without one
fails at call time with an :class:`~dispatch_nb.errors.AuthenticationError`, a compatible server
gets it only when there is one. On the compatible backend, ``OPENAI_API_KEY`` from the environment is
sent only to the environment's server (``OPENAI_BASE_URL`` or the default): a server named with an
explicit ``base_url=`` gets a key only through ``api_key=``, so your OpenAI key never leaks to it.

Per-call options (``adapter.chat(..., **options)``): ``tool_choice`` (``"auto"``, ``"none"``,
``"required"`` or a tool name), ``top_p``, ``parallel_tool_calls``, ``reasoning`` (an effort such as
``"low"`` or a Responses ``reasoning`` dict), ``response_format`` (chat.completions shape; converted
to ``text.format`` for Responses), ``text`` (Responses only), ``stop`` (chat.completions only: the
Responses API has none), plus ``extra_body`` / ``extra_headers`` / ``max_retries``.

Structured output (``output=``): ``text.format`` on the Responses API, ``response_format`` on
chat.completions (see :meth:`OpenAIAdapter.output_mode` and docs/structured-output.md);
``structured_output=`` chooses another mechanism for every call.

The backend is a wire format (:mod:`dispatch_nb.wire`): :class:`~dispatch_nb.wire.responses.ResponsesWire`
or :class:`~dispatch_nb.wire.chat_completions.ChatCompletionsWire`; this module is the provider's
endpoint, key, model list and defaults.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Literal

import httpx

from ..adapter import ChatRequest
from ..errors import AuthenticationError, DispatchError
from ..http_adapter import HTTPAdapter
from ..structured import requested_mode, unsupported_mode
from ..types import ModelInfo
from ..wire.chat_completions import CHAT_OPTIONS, ChatCompletionsWire, parse_model_list
from ..wire.responses import RESPONSES_OPTIONS, ResponsesWire

__all__ = [
    "BACKENDS",
    "DEFAULT_COMPATIBLE_URL",
    "DEFAULT_OFFICIAL_URL",
    "OpenAIAdapter",
    "connect_compatible",
    "connect_official",
]

Backend = Literal["official", "compatible"]
BACKENDS: tuple[str, ...] = ("official", "compatible")
DEFAULT_OFFICIAL_URL = "https://api.openai.com/v1"
DEFAULT_COMPATIBLE_URL = "http://127.0.0.1:8080/v1"

logger = logging.getLogger("dispatch_nb")


def _resolve_backend(backend: str | None) -> Backend:
    source = "backend="
    if backend is None:
        env = os.environ.get("OPENAI_BACKEND", "").strip()
        if env:
            backend, source = env, "OPENAI_BACKEND="
        else:
            backend = "official"
    value = backend.strip().lower()
    if value == "official":
        return "official"
    if value == "compatible":
        return "compatible"
    raise ValueError(
        f"unknown OpenAI backend {source}{backend!r}: use 'official' (the OpenAI Responses API) "
        "or 'compatible' (any chat.completions server: llama.cpp, vLLM, Ollama, LM Studio)"
    )


class OpenAIAdapter(HTTPAdapter):
    """OpenAI's Responses API (``backend="official"``) or a chat.completions server
    (``backend="compatible"``). See the module docstring for the selection rules and options."""

    provider_options: frozenset[str] = frozenset(CHAT_OPTIONS | RESPONSES_OPTIONS)

    def __init__(
        self,
        model: str,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        backend: str | None = None,
        max_tokens: int | None = 4096,
        timeout: float | None = None,
        max_retries: int = 2,
        async_http_client: httpx.AsyncClient | None = None,
        headers: dict[str, str] | None = None,
        structured_output: str = "auto",
    ) -> None:
        if not model or not isinstance(model, str):
            raise ValueError("model must be a non-empty string, e.g. 'gpt-4.1'")
        mode = _resolve_backend(backend)
        default_url = DEFAULT_OFFICIAL_URL if mode == "official" else DEFAULT_COMPATIBLE_URL
        url = base_url or os.environ.get("OPENAI_BASE_URL", "").strip() or default_url
        super().__init__(
            base_url=url,
            headers=headers,
            async_http_client=async_http_client,
            max_tokens=max_tokens,
            timeout=timeout,
            max_retries=max_retries,
        )
        self._model = model
        self._api_key = api_key  # else OPENAI_API_KEY, read at call time
        # A key from the environment goes only where the environment points: never to a server
        # named by an explicit base_url on the compatible backend (it may be a third party's).
        self._env_key_allowed = mode == "official" or base_url is None
        #: the official API refuses calls without a key; a compatible server may need none
        self._key_required = mode == "official"
        self._provider = "openai" if mode == "official" else "compatible"
        self._display = "OpenAI" if mode == "official" else "OpenAI-compatible server"
        #: ``"official"`` (Responses API) or ``"compatible"`` (chat.completions); logged per request
        self.backend_mode: Backend = mode
        #: the wire format: the Responses API (official) or chat.completions (compatible); a
        #: compatible server that refuses ``json_schema`` gets one with the json_object quirk
        self.wire: ChatCompletionsWire | ResponsesWire = (
            ResponsesWire(self._provider) if mode == "official"
            else ChatCompletionsWire(self._provider)
        )
        #: the per-call options this backend understands (others raise ``TypeError``)
        self.provider_options = self.wire.options
        #: how ``output=`` is asked for: ``auto``, ``native``, ``tool``, ``json_object``
        #: (compatible only) or ``prompt`` (see :meth:`output_mode`)
        self.structured_output = structured_output

    # -- identity --------------------------------------------------------------------------------
    @property
    def model_name(self) -> str:
        return self._model

    @property
    def provider_name(self) -> str:
        return self._provider

    @property
    def display_name(self) -> str:
        return self._display

    def __repr__(self) -> str:
        return (
            f"OpenAIAdapter(model={self._model!r}, backend={self.backend_mode!r}, "
            f"base_url={self.base_url!r})"
        )

    # -- HTTP seams (requests and answers: the wire format's) ------------------------------------
    def auth_headers(self) -> dict[str, str]:
        key = self._api_key
        if not key and self._env_key_allowed:
            key = os.environ.get("OPENAI_API_KEY", "").strip()
        if key:
            return {"authorization": f"Bearer {key}"}
        if self._key_required:
            raise AuthenticationError(
                "no OpenAI API key: set the OPENAI_API_KEY environment variable or pass api_key=",
                provider=self.provider_name,
            )
        return {}

    def output_mode(self, request: ChatRequest) -> str | None:
        """Structured output on the wire: ``auto`` / ``native`` is the wire format's own
        mechanism — ``text.format`` (a ``json_schema`` format, strict when the schema allows) on
        the Responses API, ``response_format`` (``json_schema``) on chat.completions, or
        ``json_object`` (the schema in ``{"type": "json_object", "schema": ...}``, what
        llama-cpp-python's server takes — chosen by itself after a server rejects ``json_schema``,
        with a warning); else ``tool`` or ``prompt`` (and ``json_object`` on chat.completions)."""
        if request.output is None:
            return None
        mode = requested_mode(self, request)
        wire = self.wire
        if mode in ("auto", "native"):
            return wire.native_output
        if mode in wire.output_modes:
            return mode
        raise unsupported_mode(self, mode, ("auto", "native", *wire.output_modes))

    def should_retry_now(self, error: DispatchError) -> bool:
        """Resend at once when the error shows a server quirk the wire format can work around
        (llama-cpp-python's server refuses ``response_format`` ``json_schema``: structured output
        goes as ``json_object`` with a schema from then on)."""
        if self.structured_output not in ("auto", "native"):
            return False
        wire = self.wire.should_resend(error)
        if wire is None:
            return False
        self.wire = wire
        logger.warning(
            "%s at %s rejected response_format json_schema; asking for structured output as "
            "json_object with a schema from now on (structured_output='json_object')",
            self.display_name, self.base_url,
        )
        return True

    # -- models ----------------------------------------------------------------------------------
    def list_models(self) -> list[ModelInfo]:
        """The models ``GET {base_url}/models`` lists."""
        return parse_model_list(self.get_json("models"))

    async def alist_models(self) -> list[ModelInfo]:
        return parse_model_list(await self.aget_json("models"))


def _with_backend(backend: Backend, options: dict[str, Any]) -> dict[str, Any]:
    given = options.pop("backend", None)
    if given is not None and _resolve_backend(given) != backend:
        raise ValueError(
            f"backend={given!r} contradicts the provider: use 'openai:MODEL' for the official "
            "Responses API and 'compatible:MODEL' for a chat.completions server"
        )
    return options


def connect_official(model: str, **options: Any) -> OpenAIAdapter:
    """The ``openai`` provider: ``OpenAIAdapter(model, **options)`` with the usual backend rules
    (``backend=``, else ``OPENAI_BACKEND``, else ``official``)."""
    return OpenAIAdapter(model, **options)


def connect_compatible(model: str, **options: Any) -> OpenAIAdapter:
    """The ``compatible`` provider: a chat.completions server at ``base_url`` (default
    ``OPENAI_BASE_URL``, else ``http://127.0.0.1:8080/v1``); an API key is optional."""
    return OpenAIAdapter(model, backend="compatible", **_with_backend("compatible", options))
