"""``fake``: the provider of dispatch_nb's own canonical wire protocol
(:mod:`dispatch_nb.wire.canonical`), for tests and demos: endpoint (``base_url=``, else
``DISPATCH_NB_FAKE_URL``), optional key, model list.
"""

from __future__ import annotations

import os

import httpx

from ..adapter import ChatRequest
from ..errors import RequestError
from ..http_adapter import BaseURLError, HTTPAdapter
from ..types import ModelInfo
from ..wire.canonical import CANONICAL_OPTIONS, CanonicalWire

__all__ = ["CanonicalAdapter", "FakeURLMissingError"]


class FakeURLMissingError(RequestError, BaseURLError):
    """No ``base_url=`` and no ``DISPATCH_NB_FAKE_URL``: a ``RequestError`` (code
    ``invalid_request``) and, like any unusable base URL, a ``BaseURLError``, so a replay (which
    sends nothing) does without the server (docs/record-replay.md, "Replaying without the model")."""


class CanonicalAdapter(HTTPAdapter):
    """Talks to a server speaking the canonical protocol (see the module docstring)."""

    provider_options = CANONICAL_OPTIONS
    #: the wire format: the canonical protocol (:mod:`dispatch_nb.wire.canonical`)
    wire: CanonicalWire = CanonicalWire("fake")

    def __init__(
        self,
        model: str = "echo",
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        max_tokens: int | None = 1024,
        async_http_client: httpx.AsyncClient | None = None,
        timeout: float | None = None,
        max_retries: int = 2,
    ) -> None:
        url = base_url or os.environ.get("DISPATCH_NB_FAKE_URL")
        if not url:
            raise FakeURLMissingError(
                "the fake provider needs base_url= (or DISPATCH_NB_FAKE_URL) pointing at a server "
                "that speaks dispatch_nb's canonical protocol",
                provider="fake",
            )
        super().__init__(base_url=url, model=model, async_http_client=async_http_client,
                         max_tokens=max_tokens, timeout=timeout, max_retries=max_retries)
        self._api_key = api_key

    provider_name = "fake"
    display_name = "Fake (canonical protocol)"

    def auth_headers(self) -> dict[str, str]:
        return {"authorization": f"Bearer {self._api_key}"} if self._api_key else {}

    def output_mode(self, request: ChatRequest) -> str | None:
        """Structured output: ``canonical`` (the body's ``output``: name, description, schema),
        ``tool`` or ``prompt``."""
        return self.wire.output_mode_for(self, request)

    def list_models(self) -> list[ModelInfo]:
        data = self.get_json("models")
        return [ModelInfo.model_validate(m) for m in data.get("data", [])]
