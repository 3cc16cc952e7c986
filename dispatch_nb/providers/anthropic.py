"""``anthropic``: Claude through Anthropic's Messages API (``POST {base}/v1/messages``).

The provider: endpoint, key, ``anthropic-beta`` headers, model list, token counting and error
mapping; the wire format is :mod:`dispatch_nb.wire.anthropic` (docs/anthropic.md).
"""
from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import httpx
import orjson

from ..adapter import ChatRequest
from ..errors import (
    APIConnectionError,
    AuthenticationError,
    ModelUnavailableError,
    RequestError,
)
from ..http_adapter import HTTPAdapter, WireRequest
from ..types import ModelInfo
from ..wire.anthropic import (
    DEFAULT_MAX_TOKENS,
    MESSAGES_OPTIONS,
    MessagesQuirks,
    MessagesWire,
    anthropic_schema,
    prompt_fields,
    wire_messages,
)
from ..wire.request import requested_mode
from .credentials import EnvCredentials

if TYPE_CHECKING:
    from .batch_api import AnthropicBatchAPI

__all__ = ["AnthropicAdapter", "supports_output_config"]

DEFAULT_BASE_URL = "https://api.anthropic.com"
#: its key is for ``ANTHROPIC_BASE_URL``, else api.anthropic.com
ANTHROPIC_ENV = EnvCredentials("ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL", DEFAULT_BASE_URL)
#: context window of every current Claude model (without the 1M-context beta)
CLAUDE_CONTEXT_TOKENS = 200_000


class AnthropicAdapter(HTTPAdapter):
    """Claude models through Anthropic's Messages API: the constructor's arguments and the
    chat options are in docs/anthropic.md, "Configuration". ``ANTHROPIC_API_KEY`` is read at call
    time and goes only to the server ``ANTHROPIC_BASE_URL`` names (else Anthropic's)."""

    provider_options = MESSAGES_OPTIONS
    wire: MessagesWire

    def __init__(
        self,
        model: str,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        max_tokens: int = DEFAULT_MAX_TOKENS,
        timeout: float | None = None,
        max_retries: int = 2,
        async_http_client: httpx.AsyncClient | None = None,
        headers: Mapping[str, str] | None = None,
        anthropic_version: str = "2023-06-01",
        betas: Sequence[str] | None = None,
        structured_output: str = "auto",
    ) -> None:
        if not model:
            raise ValueError("AnthropicAdapter needs a model name, e.g. 'claude-sonnet-4-5'")
        url = ANTHROPIC_ENV.base_url(base_url)
        if url.endswith("/v1"):
            url = url[: -len("/v1")]  # paths below already start with v1/
        extra = {"anthropic-version": anthropic_version, **{k.lower(): v for k, v in (headers or {}).items()}}
        super().__init__(base_url=url, model=model, headers=extra,
                         async_http_client=async_http_client, max_tokens=max_tokens,
                         timeout=timeout, max_retries=max_retries)
        self._api_key = api_key
        self._betas = list(betas or [])
        #: the wire format: Anthropic's Messages API (``max_tokens`` defaults to this adapter's)
        self.wire = MessagesWire("anthropic",
                                 MessagesQuirks(default_max_tokens=max_tokens or DEFAULT_MAX_TOKENS))
        #: how ``output=`` is asked for: ``auto``, ``native`` (``output_config``), ``tool`` (a
        #: forced tool, for models and servers without ``output_config``) or ``prompt``
        self.structured_output = structured_output

    provider_name = "anthropic"
    display_name = "Anthropic"

    @property
    def max_context_tokens(self) -> int | None:
        """200 000 for Claude models (the standard window), else unknown."""
        return CLAUDE_CONTEXT_TOKENS if self._model.startswith("claude") else None

    def batch_api(self) -> AnthropicBatchAPI:
        """Anthropic's Message Batches (``batch(..., deferred=True)``)."""
        from .batch_api import AnthropicBatchAPI

        return AnthropicBatchAPI(self)

    def auth_headers(self) -> dict[str, str]:
        """``x-api-key``; raises :class:`AuthenticationError` when there is no key at all."""
        fixed = self.fixed_headers
        if "x-api-key" in fixed or "authorization" in fixed:
            return {}
        key, kept_back = (self._api_key, "") if self._api_key else \
            ANTHROPIC_ENV.key_for(self.base_url)
        if not key:
            raise AuthenticationError(
                f"no Anthropic API key for anthropic:{self._model} at {self.base_url}: "
                + (kept_back or "set ANTHROPIC_API_KEY (`%chat key anthropic` in a notebook) or "
                   "pass AnthropicAdapter(..., api_key=...)"),
                provider=self.provider_name,
            )
        return {"x-api-key": key}

    def _beta_header(self, extra: Any = None) -> dict[str, str]:
        extra = [extra] if isinstance(extra, str) else list(extra or ())
        betas = ",".join(dict.fromkeys(b for b in [*self._betas, *extra] if b))
        return {"anthropic-beta": betas} if betas else {}

    def output_mode(self, request: ChatRequest) -> str | None:
        """``output_config`` on models that take it (:func:`supports_output_config`) when the
        schema suits it, else ``tool``; ``structured_output=`` / ``StructuredOutput(mode=...)``
        choose ``native``, ``tool`` or ``prompt`` instead (docs/anthropic.md)."""
        chosen = self.wire.output_mode_for(self, request)
        if chosen != "output_config":
            return chosen
        auto = requested_mode(self, request) == "auto"
        if auto and not supports_output_config(self._model):
            return "tool"
        try:
            anthropic_schema(request.output.schema)
        except ValueError as exc:
            if auto:
                return "tool"
            raise ValueError(f"{exc}: use structured_output='tool' (or mode='tool'), or "
                             "simplify the schema") from None
        return "output_config"

    def build_request(self, request: ChatRequest) -> WireRequest:
        """The Messages request (:attr:`wire`), with the ``anthropic-beta`` header."""
        return self.wire.wire_request(
            request, self._model, output_mode=self.output_mode(request),
            headers=self._beta_header(request.options.get("betas")),
        )

    def error_request_id(self, body: bytes, headers: httpx.Headers) -> str | None:
        """Anthropic's ``request-id`` header, else the body's ``request_id``."""
        request_id: str | None = headers.get("request-id") or headers.get("x-request-id")
        if request_id is None:
            try:
                data = orjson.loads(body)
            except orjson.JSONDecodeError:
                data = None
            if isinstance(data, dict) and isinstance(data.get("request_id"), str):
                request_id = data["request_id"]
        return request_id

    def list_models(self) -> list[ModelInfo]:
        """Every model the key can use (``GET /v1/models``, all pages)."""
        models: list[ModelInfo] = []
        after: str | None = None
        for _ in range(100):  # a page holds up to 1000 models; 100 pages is a safety bound
            url = "v1/models?limit=1000" + (f"&after_id={quote(after)}" if after else "")
            page = self.get_json(url, headers=self._beta_header())
            data = page.get("data", []) if isinstance(page, dict) else []
            models += [_model_info(m) for m in data if isinstance(m, dict) and m.get("id")]
            after = page.get("last_id") if isinstance(page, dict) else None
            if not (isinstance(page, dict) and page.get("has_more") and after):
                break
        return models

    def _count_tokens(self, request: ChatRequest) -> int:
        """Input tokens the prompt would use (``POST /v1/messages/count_tokens``); what it raises
        and when it returns ``-1``: docs/anthropic.md."""
        body = {"model": self._model, "messages": wire_messages(request.messages),
                **prompt_fields(request.system, request.tools, {})}
        try:
            response = self.post_json("v1/messages/count_tokens", body,
                                      headers=self._beta_header())
        except APIConnectionError:
            return -1
        if response.status_code >= 400:
            error = self.redacted(self.parse_error(response.status_code, response.content,
                                                   response.headers))
            if isinstance(error, (AuthenticationError, ModelUnavailableError)):
                raise error
            if isinstance(error, RequestError) and response.status_code not in (404, 405):
                raise error
            return -1
        try:
            count = orjson.loads(response.content).get("input_tokens")
        except (orjson.JSONDecodeError, AttributeError):
            return -1
        return int(count) if isinstance(count, int) else -1


_CLAUDE_VERSION = re.compile(r"claude-(opus|sonnet|haiku)-(\d+)(?:-(\d{1,2}))?(?=-|$|@)")


def supports_output_config(model: str) -> bool:
    """Whether ``model`` takes ``output_config`` structured outputs: Claude Opus 4.1, and Sonnet /
    Opus / Haiku 4.5 and every later version (``claude-sonnet-4-5``, ``claude-opus-4-1-20250805``;
    not ``claude-sonnet-4-20250514`` nor the ``claude-3-*`` models)."""
    found = _CLAUDE_VERSION.search(model.lower())
    if found is None:
        return False
    family, major, minor = found.group(1), int(found.group(2)), int(found.group(3) or 0)
    if major > 4:
        return True
    return major == 4 and (minor >= 5 or (family == "opus" and minor >= 1))


def _model_info(data: Mapping[str, Any]) -> ModelInfo:
    return ModelInfo(
        id=str(data["id"]),
        name=str(data.get("display_name") or data["id"]),
        vendor="anthropic",
        supports_tool_use=True,
        supports_vision=True,
        supports_streaming=True,
        max_context_tokens=data.get("max_input_tokens") or CLAUDE_CONTEXT_TOKENS,
        max_output_tokens=data.get("max_tokens"),
        **({"created_at": data["created_at"]} if data.get("created_at") else {}),
    )
