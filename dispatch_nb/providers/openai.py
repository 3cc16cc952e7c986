"""OpenAI: the official Responses API (:class:`ResponsesAdapter`) or any OpenAI-compatible
chat.completions server (:class:`CompatibleAdapter`); :class:`OpenAIAdapter` makes the one its
``backend`` names. This module is the provider's endpoint, key, model list and defaults; the
backend rules, which key goes where, the options and structured output are in docs/openai.md.
"""

from __future__ import annotations

import logging
import os
import threading
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, Literal, cast, get_args

import httpx

from ..adapter import ChatRequest
from ..errors import AuthenticationError, DispatchError
from ..http_adapter import HTTPAdapter
from ..types import ModelInfo
from ..wire.base import WireFormat, WireRequest
from ..wire.chat_completions import CHAT_OPTIONS, ChatCompletionsWire
from ..wire.responses import RESPONSES_OPTIONS, ResponsesWire
from .credentials import EnvCredentials

if TYPE_CHECKING:
    from .batch_api import OpenAIBatchAPI

__all__ = [
    "COMPATIBLE_ENV",
    "DEFAULT_COMPATIBLE_URL",
    "DEFAULT_OFFICIAL_URL",
    "OPENAI_ENV",
    "CompatibleAdapter",
    "OpenAIAdapter",
    "ResponsesAdapter",
    "connect_compatible",
]

Backend = Literal["official", "compatible"]
DEFAULT_OFFICIAL_URL = "https://api.openai.com/v1"
DEFAULT_COMPATIBLE_URL = "http://127.0.0.1:8080/v1"
#: OpenAI's variables: its key is for ``OPENAI_BASE_URL``, else api.openai.com
OPENAI_ENV = EnvCredentials("OPENAI_API_KEY", "OPENAI_BASE_URL", DEFAULT_OFFICIAL_URL)
#: the compatible server's own variables
COMPATIBLE_ENV = EnvCredentials("DISPATCH_NB_COMPATIBLE_API_KEY",
                                "DISPATCH_NB_COMPATIBLE_BASE_URL", DEFAULT_COMPATIBLE_URL)

logger = logging.getLogger("dispatch_nb")

#: the wire format this thread's (or task's) last request was built with: a retry decision judges
#: the request that failed, not whatever another thread learnt meanwhile
_sent_with: ContextVar[WireFormat | None] = ContextVar("dispatch_nb_openai_sent_with", default=None)


def _resolve_backend(backend: str | None) -> Backend:
    source = "backend="
    if backend is None:
        backend, source = os.environ.get("OPENAI_BACKEND", "").strip() or "official", "OPENAI_BACKEND="
    value = backend.strip().lower()
    if value in get_args(Backend):
        return cast(Backend, value)
    raise ValueError(
        f"unknown OpenAI backend {source}{backend!r}: use 'official' (the OpenAI Responses API) "
        "or 'compatible' (any chat.completions server: llama.cpp, vLLM, Ollama, LM Studio)"
    )


class OpenAIAdapter(HTTPAdapter):
    """OpenAI's Responses API (``backend="official"``: a :class:`ResponsesAdapter`) or a
    chat.completions server (``backend="compatible"``: a :class:`CompatibleAdapter`); making an
    ``OpenAIAdapter`` makes the one its backend names (docs/openai.md: the selection rules,
    credentials and options)."""

    provider_options: frozenset[str] = frozenset(CHAT_OPTIONS | RESPONSES_OPTIONS)
    #: ``"official"`` (Responses API) or ``"compatible"`` (chat.completions); logged per request
    backend_mode: Backend = "official"
    #: the wire format, fixed when the adapter is made
    wire: ChatCompletionsWire | ResponsesWire
    provider_name = "openai"
    display_name = "OpenAI"

    def __new__(cls, *args: Any, backend: str | None = None, **kwargs: Any) -> OpenAIAdapter:
        if cls is OpenAIAdapter:
            cls = ResponsesAdapter if _resolve_backend(backend) == "official" else CompatibleAdapter
        return super().__new__(cls)

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
        if backend is not None and _resolve_backend(backend) != self.backend_mode:
            raise ValueError(
                f"backend={backend!r} contradicts {type(self).__name__} (backend "
                f"{self.backend_mode!r}): use OpenAIAdapter(..., backend=...) to choose"
            )
        official = self.backend_mode == "official"
        # with OPENAI_BACKEND=compatible (and no backend=) the OPENAI_* pair names the server
        chosen_by_env = backend is None and os.environ.get("OPENAI_BACKEND", "").strip()
        settings = OPENAI_ENV if official or chosen_by_env else COMPATIBLE_ENV
        default_url = DEFAULT_OFFICIAL_URL if official else DEFAULT_COMPATIBLE_URL
        url = base_url or os.environ.get(settings.url_env, "").strip() or default_url
        super().__init__(base_url=url, model=model, headers=headers,
                         async_http_client=async_http_client, max_tokens=max_tokens,
                         timeout=timeout, max_retries=max_retries)
        self._api_key = api_key  # else the environment's key, read at call time
        #: the environment variables its server and key come from
        self.settings = settings
        self.wire = (ResponsesWire if official else ChatCompletionsWire)(self.provider_name)
        #: what this adapter learnt about its server (a chat.completions server that refuses
        #: ``json_schema``): the wire format to build requests with from then on
        self._learnt: WireFormat | None = None
        self._learn_lock = threading.Lock()
        #: the per-call options this backend understands (others raise ``TypeError``)
        self.provider_options = self.wire.options
        #: how ``output=`` is asked for: ``auto``, ``native``, ``tool``, ``json_object``
        #: (compatible only) or ``prompt`` (see :meth:`output_mode`)
        self.structured_output = structured_output

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(model={self._model!r}, backend={self.backend_mode!r}, "
                f"base_url={self.base_url!r})")

    def auth_headers(self) -> dict[str, str]:
        key, kept_back = (self._api_key, "") if self._api_key else \
            self.settings.key_for(self.base_url)
        if key:
            return {"authorization": f"Bearer {key}"}
        if self.backend_mode == "official":  # a compatible server may need no key
            why = kept_back or (f"set {self.settings.key_env} (`%chat key {self.provider_name}` in a "
                                "notebook) or pass api_key=")
            raise AuthenticationError(
                f"no {self.display_name} API key for {self.provider_name}:{self._model} at "
                f"{self.base_url}: {why}",
                provider=self.provider_name,
            )
        if kept_back:
            logger.info("%s:%s at %s: %s", self.provider_name, self._model, self.base_url, kept_back)
        return {}

    def parse_error(self, status: int, body: bytes, headers: httpx.Headers) -> DispatchError:
        """The wire format's error; a refused or missing key names the model and the URL, and
        why a key that is set was not sent."""
        error = super().parse_error(status, body, headers)
        if isinstance(error, AuthenticationError) and not self._api_key:
            _key, kept_back = self.settings.key_for(self.base_url)
            note = f" ({kept_back})" if kept_back else ""
            error.message = f"{error.message} [{self.provider_name}:{self._model} at {self.base_url}]{note}"
        return error

    def build_request(self, request: ChatRequest) -> WireRequest:
        wire = self._learnt or self.wire
        _sent_with.set(wire)
        return wire.wire_request(request, self.model_name,
                                 output_mode=wire.output_mode_for(self, request))

    def output_mode(self, request: ChatRequest) -> str | None:
        """Structured output on the wire: ``auto`` / ``native`` is the wire format's own
        mechanism (``text.format``, ``response_format``, or ``json_object`` once a server refused
        ``json_schema``: docs/openai.md); else ``tool`` or ``prompt`` (and ``json_object`` on
        chat.completions)."""
        return (self._learnt or self.wire).output_mode_for(self, request)

    def batch_api(self) -> OpenAIBatchAPI | None:
        """OpenAI's Batch API (``batch(..., deferred=True)``): the official API has one; a
        chat.completions server (``compatible``) has none."""
        if self.provider_name != "openai":
            return None
        from .batch_api import OpenAIBatchAPI

        return OpenAIBatchAPI(self)

    def should_retry_now(self, error: DispatchError) -> bool:
        """Resend at once when the error shows a server quirk the wire format can work around
        (llama-cpp-python's server refuses ``response_format`` ``json_schema``: structured output
        goes as ``json_object`` with a schema from then on). Judged by the wire format the failed
        request was built with, so every thread whose request failed that way resends it."""
        if self.structured_output not in ("auto", "native"):
            return False
        learnt = (_sent_with.get() or self.wire).should_resend(error)
        if learnt is None:
            return False
        with self._learn_lock:
            if self._learnt is None:
                self._learnt = learnt
                logger.warning(
                    "%s at %s rejected response_format json_schema; asking for structured output "
                    "as json_object with a schema from now on (structured_output='json_object')",
                    self.display_name, self.base_url,
                )
        return True

    def list_models(self) -> list[ModelInfo]:
        """The models ``GET {base_url}/models`` lists."""
        return _model_list(self.get_json("models"))

    async def alist_models(self) -> list[ModelInfo]:
        return _model_list(await self.aget_json("models"))


def _model_list(body: Any) -> list[ModelInfo]:
    """``GET /models`` (``{"object": "list", "data": [...]}``) → :class:`ModelInfo` s."""
    data = body.get("data") if isinstance(body, dict) else body
    out: list[ModelInfo] = []
    for item in data or []:
        if not isinstance(item, dict) or not item.get("id"):
            continue
        meta = item.get("meta")
        extra = {"created": item.get("created"),
                 "n_ctx_train": meta.get("n_ctx_train") if isinstance(meta, dict) else None}
        arch = item.get("architecture")
        vision = isinstance(arch, dict) and "image" in (arch.get("input_modalities") or [])
        out.append(ModelInfo(id=str(item["id"]), name=str(item.get("name") or item["id"]),
                             vendor=item.get("owned_by"), supports_vision=vision,
                             **{k: v for k, v in extra.items() if v}))
    return out


class ResponsesAdapter(OpenAIAdapter):
    """OpenAI's Responses API (``POST /responses``): ``OpenAIAdapter(model)`` with the official
    backend. Its server and key: ``OPENAI_BASE_URL`` / ``OPENAI_API_KEY``."""


class CompatibleAdapter(OpenAIAdapter):
    """A chat.completions server (llama.cpp, vLLM, Ollama, LM Studio): ``OpenAIAdapter(model,
    backend="compatible")``, the ``compatible`` provider. Its server and key:
    ``DISPATCH_NB_COMPATIBLE_BASE_URL`` / ``DISPATCH_NB_COMPATIBLE_API_KEY`` (``OPENAI_*`` when
    ``OPENAI_BACKEND=compatible`` chose it); a key is optional."""

    backend_mode: Backend = "compatible"
    provider_name = "compatible"
    display_name = "OpenAI-compatible server"


def connect_compatible(model: str, **options: Any) -> OpenAIAdapter:
    """The ``compatible`` provider: a chat.completions server at ``base_url`` (default
    ``DISPATCH_NB_COMPATIBLE_BASE_URL``, else ``http://127.0.0.1:8080/v1``); an API key
    (``api_key=``, else ``DISPATCH_NB_COMPATIBLE_API_KEY``) is optional."""
    given = options.pop("backend", None)
    if given is not None and _resolve_backend(given) != "compatible":
        raise ValueError(
            f"backend={given!r} contradicts the provider: use 'openai:MODEL' for the official "
            "Responses API and 'compatible:MODEL' for a chat.completions server"
        )
    return CompatibleAdapter(model, backend="compatible", **options)
