"""Copilot's request authentication as one :class:`httpx.Auth` flow: the Copilot token on every
request, one refresh and one resend after a refusal (docs/copilot-login.md, "How a request is
authenticated")."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Awaitable, Callable, Generator

import httpx

from .copilot_token import DEFAULT_COPILOT_API_URL, CopilotToken, CopilotTokenManager
from .device_flow import body_fields

__all__ = ["REFRESH_STATUSES", "CopilotAuth", "authorize_url", "token_rejected"]

#: the statuses after which a new Copilot token may help (PROTOCOLS.md §3.6)
REFRESH_STATUSES = frozenset({401, 403})


def authorize_url(body: bytes) -> str | None:
    """The ``authorize_url`` in a refusal's JSON body (flat or under ``error``): a page the user
    must open first, which a new token would not replace."""
    data = body_fields(body)
    inner = data.get("error")
    url = (inner.get("authorize_url") if isinstance(inner, dict) else None) or data.get("authorize_url")
    return url if isinstance(url, str) and url else None


def token_rejected(status: int, body: bytes) -> bool:
    """Whether an answer says the Copilot *token* was refused, so a new one may cure it: a 401, or a
    403 without an :func:`authorize_url`."""
    return status in REFRESH_STATUSES and authorize_url(body) is None


class CopilotAuth(httpx.Auth):
    """Authenticates requests to the Copilot API with a managed Copilot token.

    ``prepare`` / ``aprepare``: run before a token is asked for (the adapter's pending device
    login; the async one runs it off the event loop).

    A request addressed to the Copilot API the adapter knew when it built it (the cached token's
    ``endpoints.api``, else :data:`DEFAULT_COPILOT_API_URL`) is re-addressed to the ``endpoints.api``
    of the token actually sent, so the first request, and one after a refresh that moved the API,
    reach the right host.
    """

    def __init__(
        self,
        manager: CopilotTokenManager,
        *,
        prepare: Callable[[], None] | None = None,
        aprepare: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self._manager = manager
        self._prepare = prepare
        self._aprepare = aprepare

    def __repr__(self) -> str:
        return f"CopilotAuth(token_url={self._manager.token_url!r})"

    # -- shared ----------------------------------------------------------------------------------
    def _base(self) -> str:
        cached = self._manager.cached
        return cached.endpoints_api if cached is not None else DEFAULT_COPILOT_API_URL

    def _apply(self, request: httpx.Request, token: CopilotToken, base: str) -> None:
        target = token.endpoints_api  # like base: a CopilotToken's, with no trailing slash
        url = str(request.url)
        if target != base and (url == base or url.startswith(base + "/")):
            request.url = httpx.URL(target + url[len(base):])
            request.headers["host"] = request.url.netloc.decode("ascii")
        request.headers["authorization"] = f"Bearer {token.token}"

    # -- the flows -------------------------------------------------------------------------------
    def sync_auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        if self._prepare is not None:
            self._prepare()
        base = self._base()
        token = self._manager.get()
        self._apply(request, token, base)
        response = yield request
        # (the status first: an answer that cannot be a refusal is not read here)
        if response.status_code not in REFRESH_STATUSES or not token_rejected(
            response.status_code, response.read()
        ):
            return
        self._manager.invalidate(token)  # only this token: concurrent 401s cause one exchange
        self._apply(request, self._manager.get(), token.endpoints_api)
        yield request

    async def async_auth_flow(
        self, request: httpx.Request
    ) -> AsyncGenerator[httpx.Request, httpx.Response]:
        if self._aprepare is not None:
            await self._aprepare()
        base = self._base()
        token = await self._manager.aget()
        self._apply(request, token, base)
        response = yield request
        if response.status_code not in REFRESH_STATUSES or not token_rejected(
            response.status_code, await response.aread()
        ):
            return
        self._manager.invalidate(token)
        self._apply(request, await self._manager.aget(), token.endpoints_api)
        yield request
