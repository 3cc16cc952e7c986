"""GitHub Copilot's error table, sans-I/O: an HTTP error from the Copilot API → the
:class:`~dispatch_nb.errors.DispatchError` to raise (PROTOCOLS.md §3.6; docs/copilot-login.md,
"Errors")."""

from __future__ import annotations

import datetime as _dt
from collections.abc import Mapping, Sequence
from typing import Any

from ..auth import EDITOR_HEADERS, authorize_url
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
from ..http_adapter import error_details

__all__ = ["PLANS_URL", "copilot_error"]

PROVIDER = "copilot"
#: where more premium requests are bought (named in quota errors)
PLANS_URL = "https://github.com/features/copilot/plans"


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
    """The :class:`DispatchError` for an HTTP error from the Copilot API (see the module
    docstring); ``available`` (model ids) decorates a "model not found" error."""
    message, etype = error_details(body)
    request_id = headers.get("x-request-id") or headers.get("x-github-request-id")
    kw: dict[str, Any] = {
        "status_code": status,
        "provider": PROVIDER,
        "request_id": request_id,
        "provider_code": etype,
    }
    retry_after = parse_retry_after(headers)
    if status in (401, 403):
        url = authorize_url(body)
        return AuthenticationError(
            f"GitHub Copilot needs you to authorize this first: open {url} (GitHub says: {message})"
            if url else f"GitHub Copilot rejected the request: {message}", **kw)
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
            f"list_models()) keep working; more requests: {PLANS_URL}."
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
