"""The Copilot token: a short-lived key for the Copilot API, exchanged for a GitHub token, cached
and refreshed one exchange at a time (docs/copilot-login.md, "The Copilot token"; the endpoint
and its errors: PROTOCOLS.md §2).
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import httpx

from ..bridge import CALLER_THREAD, run_sync
from ..errors import (
    AuthenticationError,
    DispatchError,
    RateLimitError,
    ServerError,
    error_for_status,
    parse_retry_after,
)
from ..transport import tls_context
from .device_flow import body_fields, nonempty_str, transport_error
from .endpoints import default_github_api_url
from .token_store import GITHUB_TOKEN_ENV

__all__ = [
    "DEFAULT_COPILOT_API_URL",
    "EDITOR_HEADERS",
    "CopilotToken",
    "CopilotTokenManager",
]

log = logging.getLogger(__name__)

PROVIDER = "copilot"

#: Where the Copilot API lives when the token names no ``endpoints.api``.
DEFAULT_COPILOT_API_URL = "https://api.githubcopilot.com"

#: The editor identity sent with the token exchange. The Copilot API *requires* ``Editor-Version``
#: (400 without it), so the chat adapter sends these too.
EDITOR_HEADERS: Mapping[str, str] = MappingProxyType(
    {
        "Editor-Version": "vscode/1.104.3",
        "Editor-Plugin-Version": "copilot-chat/0.26.7",
        "User-Agent": "GitHubCopilotChat/0.26.7",
    }
)

#: ``X-GitHub-Api-Version`` for the token exchange.
GITHUB_API_VERSION = "2025-04-01"

#: refresh this many seconds before ``expires_at`` (when there is no ``refresh_in``)
REFRESH_MARGIN = 300.0
#: refresh this many seconds before the server's ``refresh_in`` has elapsed
REFRESH_IN_MARGIN = 60.0
#: never refresh a token younger than this
MIN_TOKEN_AGE = 30.0

_LOGIN_HINT = "`python -m dispatch_nb login --force` (or `%chat login` in a notebook)"

#: notification_id → what the user must do
_NOTIFICATIONS: dict[str, str] = {
    "no_copilot_access": (
        "This GitHub account has no GitHub Copilot access. Sign up at "
        "https://github.com/features/copilot (Copilot Free works), or ask your organization's "
        "admin for a Copilot seat."
    ),
    "not_signed_up": (
        "This GitHub account has not signed up for GitHub Copilot. Sign up at "
        "https://github.com/features/copilot (Copilot Free works), then try again."
    ),
    "subscription_ended": (
        "Your GitHub Copilot subscription has ended. Renew it at "
        "https://github.com/settings/copilot, or ask your organization's admin for a seat."
    ),
    "enterprise_managed_user_account": (
        "This is an Enterprise Managed User account: only your enterprise can give it Copilot. "
        "Ask your enterprise admin to assign you a Copilot seat (and check the org's Copilot "
        "policy)."
    ),
    "feature_flag_blocked": (
        "Copilot is turned off for this account by a policy. Check your organization's Copilot "
        "policy, or ask its admin."
    ),
    "spammy_user": (
        "GitHub has restricted this account, so it cannot use Copilot. Contact GitHub Support "
        "(https://support.github.com)."
    ),
    "billing_locked": (
        "Copilot is locked because of a billing problem on this account. Fix it at "
        "https://github.com/settings/billing."
    ),
    "trade_restricted": (
        "Copilot is not available to this account because of trade restrictions. See "
        "https://docs.github.com/site-policy/other-site-policies/github-and-trade-controls."
    ),
    "trade_restricted_country": (
        "Copilot is not available in your country or region because of trade restrictions. See "
        "https://docs.github.com/site-policy/other-site-policies/github-and-trade-controls."
    ),
    "codespaces_demo_inactive": (
        "Copilot is not active for this Codespaces demo account. Sign in with your own GitHub account."
    ),
    "snippy_not_configured": (
        "Your organization has not yet set its policy on suggestions that match public code. "
        "Ask an organization admin to configure Copilot's policies."
    ),
    "expired_coupon": (
        "The coupon that paid for this account's Copilot has expired. Renew at "
        "https://github.com/settings/copilot."
    ),
}


@dataclass(frozen=True)
class CopilotToken:
    """A Copilot API token and what came with it. The repr hides ``token`` and ``details``.

    ``expires_at``, ``fetched_at`` and ``refresh_at`` are Unix seconds (``fetched_at`` and
    ``refresh_at`` by the manager's clock). ``endpoints_api`` has no trailing slash.
    """

    token: str = field(repr=False)
    expires_at: float
    refresh_in: float | None
    endpoints_api: str
    sku: str | None
    fetched_at: float
    refresh_at: float
    endpoints: Mapping[str, str] = field(default_factory=dict)
    #: the rest of GitHub's answer (everything except ``token``)
    details: Mapping[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_response(cls, data: Mapping[str, Any], *, fetched_at: float) -> CopilotToken:
        """Build from the token endpoint's JSON. Raises ``ValueError`` without a ``token``."""
        token = nonempty_str(data.get("token"))
        if token is None:
            raise ValueError("the answer has no token")
        refresh_in = _positive(data.get("refresh_in"))
        expires_at = _positive(data.get("expires_at"))
        if expires_at is None:
            expires_at = fetched_at + (refresh_in or 1500.0)
        raw_endpoints = data.get("endpoints")
        endpoints = (
            {k: v.rstrip("/") for k, v in raw_endpoints.items() if isinstance(v, str)}
            if isinstance(raw_endpoints, dict)
            else {}
        )
        api = endpoints.get("api", "")
        if not api.startswith(("https://", "http://")):
            api = DEFAULT_COPILOT_API_URL
        if refresh_in is not None:
            refresh_at = fetched_at + refresh_in - REFRESH_IN_MARGIN
        else:
            refresh_at = expires_at - REFRESH_MARGIN
        refresh_at = max(refresh_at, fetched_at + MIN_TOKEN_AGE)
        sku = data.get("sku")
        return cls(token=token, expires_at=expires_at, refresh_in=refresh_in, endpoints_api=api,
                   sku=sku if isinstance(sku, str) else None, fetched_at=fetched_at, refresh_at=refresh_at,
                   endpoints=MappingProxyType(endpoints),
                   details=MappingProxyType({k: v for k, v in data.items() if k != "token"}))

    def needs_refresh(self, now: float) -> bool:
        """True once ``now`` (by the manager's clock) has reached ``refresh_at``."""
        return now >= self.refresh_at

    def expires_in(self) -> float:
        """Seconds until ``expires_at`` (by the wall clock)."""
        return self.expires_at - time.time()


class CopilotTokenManager:
    """Gets, caches and refreshes the Copilot token for one GitHub token; thread- and task-safe.

    ``github_token_provider`` is the GitHub token itself or a function returning it (called on
    each exchange, so a new login is picked up). ``github_api_url`` defaults to
    ``$DISPATCH_NB_GITHUB_API_URL``, else ``https://api.github.com``. ``clock`` decides when to
    refresh (tests pass a fake one).
    """

    def __init__(
        self,
        github_token_provider: str | Callable[[], str],
        *,
        github_api_url: str | None = None,
        async_http_client: httpx.AsyncClient | None = None,
        clock: Callable[[], float] = time.time,
        timeout: float = 30.0,
    ) -> None:
        fixed = github_token_provider
        self._provider: Callable[[], str] = fixed if callable(fixed) else (lambda: fixed)
        self.github_api_url = (github_api_url or default_github_api_url()).rstrip("/")
        self._async_http = async_http_client
        self._clock = clock
        self._timeout = timeout
        self._token: CopilotToken | None = None
        self._lock = threading.Lock()
        self._async_locks: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock]
        self._async_locks = weakref.WeakKeyDictionary()
        self._async_locks_guard = threading.Lock()
        # the thread whose event loop runs the async exchange that holds self._lock
        self._async_holder: int | None = None
        #: how many exchanges this manager has made (diagnostics)
        self.exchanges = 0

    def __repr__(self) -> str:
        token = self._token
        state = "none" if token is None else f"expires_at={token.expires_at:.0f}"
        return f"CopilotTokenManager(github_api_url={self.github_api_url!r}, token={state})"

    @property
    def token_url(self) -> str:
        return f"{self.github_api_url}/copilot_internal/v2/token"

    @property
    def cached(self) -> CopilotToken | None:
        """The last token fetched, fresh or not (no I/O)."""
        return self._token

    def _fresh(self) -> CopilotToken | None:
        token = self._token
        return token if token is not None and not token.needs_refresh(self._clock()) else None

    def invalidate(self, token: CopilotToken | None = None) -> None:
        """Forget the cached token so the next :meth:`get` exchanges again.

        Pass the token that was rejected: if another caller already replaced it, nothing happens,
        so many concurrent 401s cause one refresh, not many.
        """
        if token is None or self._token is token:
            self._token = None

    def get(self) -> CopilotToken:
        """A valid Copilot token, exchanging (once, for all threads) when needed."""
        return self._fresh() or run_sync(self.aget())

    def _async_lock(self) -> asyncio.Lock:
        loop = asyncio.get_running_loop()
        with self._async_locks_guard:
            return self._async_locks.setdefault(loop, asyncio.Lock())

    async def aget(self) -> CopilotToken:
        """The async twin of :meth:`get` (one exchange at a time across tasks and threads)."""
        if (token := self._fresh()) is not None:
            return token
        if self._async_holder is not None and self._async_holder == CALLER_THREAD.get():
            # A sync get() blocks the thread whose event loop runs the exchange holding the lock:
            # that exchange cannot finish while we wait for it, so exchange on our own.
            return await self._aexchange()
        async with self._async_lock():
            if (token := self._fresh()) is not None:
                return token
            # Also exclude the tasks of other event loops, without blocking this one. A
            # threading.Lock has nothing to await, and a helper thread blocked in acquire() would
            # leak the lock if this task were cancelled, so poll (only while another refresh runs).
            while not self._lock.acquire(blocking=False):  # noqa: ASYNC110
                await asyncio.sleep(0.005)
            self._async_holder = threading.get_ident()
            try:
                return self._fresh() or await self._aexchange()
            finally:
                self._async_holder = None
                self._lock.release()

    async def _aexchange(self) -> CopilotToken:
        """Exchange the GitHub token for a new Copilot token, and keep it."""
        github_token = self._provider()
        if not github_token:
            raise AuthenticationError(
                f"There is no GitHub token to exchange for a Copilot token. Log in: {_LOGIN_HINT}.",
                provider=PROVIDER,
            )
        headers = {
            "Authorization": f"token {github_token}",
            "Accept": "application/json",
            "X-GitHub-Api-Version": GITHUB_API_VERSION,
            **EDITOR_HEADERS,
        }
        try:
            if self._async_http is not None:
                response = await self._async_http.get(self.token_url, headers=headers, timeout=self._timeout)
            else:
                async with httpx.AsyncClient(timeout=self._timeout, verify=tls_context()) as client:
                    response = await client.get(self.token_url, headers=headers)
        except httpx.TransportError as exc:
            raise transport_error(exc, self.github_api_url, PROVIDER, "the Copilot token request") from None
        data = body_fields(response.content)
        if response.status_code != 200:
            raise self._error(response, data, github_token)
        try:
            token = self._token = CopilotToken.from_response(data, fetched_at=self._clock())
        except ValueError:
            raise ServerError("GitHub's answer to the Copilot token request holds no token",
                              status_code=200, provider=PROVIDER) from None
        self.exchanges += 1
        log.debug("got a Copilot token for %s (expires in %.0f s, refresh in %.0f s)", token.endpoints_api,
                  token.expires_at - token.fetched_at, token.refresh_at - token.fetched_at)
        return token

    def _error(self, response: httpx.Response, data: Mapping[str, Any], github_token: str) -> DispatchError:
        status = response.status_code
        message = nonempty_str(data.get("message")) or ""
        details = data.get("error_details")
        details = details if isinstance(details, dict) else {}
        notification = nonempty_str(details.get("notification_id"))
        kw: dict[str, Any] = {"status_code": status, "provider": PROVIDER}
        if status == 401:
            text = "GitHub rejected your GitHub token when asked for a Copilot token. " + (
                f"It is the value of {GITHUB_TOKEN_ENV}, which comes before any login: unset it "
                f"(then {_LOGIN_HINT}), or set it to a working token."
                if github_token == os.environ.get(GITHUB_TOKEN_ENV, "").strip()
                else f"Log in again: {_LOGIN_HINT}."
            )
            if github_token.startswith(("ghp_", "github_pat_")):
                text += (
                    " Personal access tokens (ghp_…, github_pat_…) do not work with Copilot: "
                    "use the device-flow login instead."
                )
            return AuthenticationError(text, **kw)
        if notification:
            text = _NOTIFICATIONS.get(
                notification, f"GitHub refused a Copilot token for this account ({notification})."
            )
            said = nonempty_str(details.get("message")) or message
            if said:
                text += f" GitHub says: {said}"
            if url := nonempty_str(details.get("url")):
                text += f" ({url})"
            return AuthenticationError(text, code=notification, provider_code=notification, **kw)
        rate_limited = status == 429 or (
            status == 403
            and ("rate limit" in message.lower() or response.headers.get("x-ratelimit-remaining") == "0")
        )
        if rate_limited:
            retry_after = parse_retry_after(response.headers)
            reset = response.headers.get("x-ratelimit-reset")
            if retry_after is None and reset and reset.isdigit():
                retry_after = max(0.0, float(reset) - time.time())
            return RateLimitError(
                f"GitHub's API rate limit stopped the Copilot token request: "
                f"{message or 'rate limit exceeded'}",
                retry_after=retry_after,
                **kw,
            )
        if status == 403:
            return AuthenticationError(
                "GitHub refused a Copilot token for this GitHub token"
                + (f": {message}" if message else "")
                + ". Check that the account has Copilot; to log in as someone else: "
                + f"{_LOGIN_HINT}.",
                **kw,
            )
        if status == 404:
            return AuthenticationError(
                f"{self.token_url} was not found (HTTP 404): the GitHub token may not belong to a "
                "Copilot app, or DISPATCH_NB_GITHUB_API_URL points to the wrong server. "
                f"Log in with the device flow: {_LOGIN_HINT}.",
                **kw,
            )
        text = message or response.text[:500] or "no message"
        return error_for_status(
            status,
            f"the Copilot token request failed: {text}",
            provider=PROVIDER,
            headers=response.headers,
        )


def _positive(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if value > 0 else None
