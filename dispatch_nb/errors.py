"""The error tree, and the one table that maps HTTP statuses (and provider error types) onto it.

::

    DispatchError                      message, status_code, provider, code, partial
    ├── AuthenticationError            401, 403: bad or missing credentials
    ├── RateLimitError                 429 (and quota/spend limits): retry_after seconds
    ├── ServerError                    5xx, 529: the provider failed
    ├── RequestError                   400, 404, 413, 422: the request itself is wrong
    │   ├── ContextLengthError         the prompt does not fit the model's context
    │   ├── ModelUnavailableError      unknown model, or not enabled for this account
    │   └── OutputValidationError      the answer is not what ``output=`` asked for: text, errors
    ├── APIConnectionError             (also ConnectionError) the server could not be reached
    │   └── APITimeoutError            (also TimeoutError) no complete answer before the deadline
    ├── RequestCancelled               a CancelToken (or Ctrl-C) stopped the call
    └── BudgetExceededError            not sent: ``budget=`` does not cover it (docs/cost.md)

The provider-neutral ``code`` values, ``partial``, and what a proxy's page becomes
(:func:`summarize_body`): README.md, "Errors".
"""
from __future__ import annotations

import contextlib
import email.utils
import functools
import html
import re
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .types import Response

__all__ = [
    "APIConnectionError",
    "APITimeoutError",
    "AuthenticationError",
    "BudgetExceededError",
    "ContextLengthError",
    "DispatchError",
    "ModelUnavailableError",
    "OutputValidationError",
    "RateLimitError",
    "RequestCancelled",
    "RequestError",
    "ServerError",
    "error_for_status",
    "looks_like_html",
    "option_refused",
    "parse_retry_after",
    "redact",
    "redact_pieces",
    "sent_credentials",
    "summarize_body",
]


class DispatchError(Exception):
    """Base of every error an adapter raises."""

    default_code = "unknown"
    #: whether the same request may succeed when sent again, unless the raiser said (``retryable=``)
    default_retryable = False

    def __init__(
        self,
        message: str,
        *,
        status_code: int | None = None,
        provider: str | None = None,
        code: str | None = None,
        partial: Response | None = None,
        retryable: bool | None = None,
        request_id: str | None = None,
        provider_code: str | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status_code = status_code
        self.provider = provider
        self.code = code or self.default_code
        self.partial = partial
        self.request_id = request_id
        #: the provider's own error type/code (e.g. ``overloaded_error``), for diagnostics
        self.provider_code = provider_code
        #: seconds the server asked us to wait before retrying (``retry-after``), if it said
        self.retry_after = retry_after
        self._retryable = retryable
        #: refused before sending for an option every request with it would get (batches stop)
        self.option_refused = False

    @property
    def retryable(self) -> bool:
        """Whether sending the same request again may succeed."""
        return self.default_retryable if self._retryable is None else self._retryable

    def __str__(self) -> str:
        where = f"{self.provider}: " if self.provider else ""
        status = f" (HTTP {self.status_code})" if self.status_code else ""
        return f"{where}{self.message}{status}"

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(message={self.message!r}, status_code={self.status_code!r}, "
            f"provider={self.provider!r}, code={self.code!r})"
        )

    def __reduce__(self) -> Any:
        return (_rebuild, (type(self), self.message, self.__dict__))

    def __getattr__(self, name: str) -> Any:
        # Called only for a name the error lacks. ``%%chat -o VAR`` stores the error a failed cell
        # ended with: ``VAR.parsed`` in the next cell says so, not just "no attribute 'parsed'".
        types = None if name.startswith("_") else sys.modules.get(f"{__package__}.types")
        response = getattr(types, "Response", None)  # not loaded: no Response was ever made
        if response is None or not (name in response.model_fields or hasattr(response, name)):
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        partial = self.__dict__.get("partial")
        arrived = partial is not None and bool(partial.content or partial.tool_calls)
        raise AttributeError(
            f"{type(self).__name__} has no attribute {name!r}: this is the error a call ended with "
            f"({self}), not a Response. "
            + (f"Its .partial holds what arrived (.partial.{name})." if arrived else
               "Fix what it says and run the call (the cell) again.")
        )

    def redact(self, secrets: Iterable[str] = ()) -> None:
        """Replace, in the message, every value of ``secrets`` and every secret-looking string
        (:func:`redact`): what a server echoes of a request never reaches an output or a log."""
        self.message = redact(self.message, secrets)
        self.args = (self.message,)


def _rebuild(cls: type[DispatchError], message: str, state: dict[str, Any]) -> DispatchError:
    err = cls.__new__(cls)
    Exception.__init__(err, message)
    err.__dict__.update(state)
    return err


#: what replaces a secret
REDACTED = "[REDACTED]"
#: strings that look like credentials wherever they appear
_SECRET_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = (
    # "Bearer <credential>": the credential has a digit, so prose ("bearer bonds") is left alone
    (re.compile(r"(?i)\b(bearer)(\s+)(?=[A-Za-z0-9._~+/=\-]*[0-9])[A-Za-z0-9._~+/=\-]{8,}"),
     rf"\1\2{REDACTED}"),
    (re.compile(r"\bsk-[A-Za-z0-9_\-]{16,}"), REDACTED),
    (re.compile(r"\bgh[pousr]_[A-Za-z0-9]{20,}"), REDACTED),
    (re.compile(r"\bgithub_pat_[A-Za-z0-9_]{20,}"), REDACTED),
    (re.compile(r"\btid=[0-9a-f]{8,};[^\s\"']*"), REDACTED),  # Copilot session tokens
)
#: request headers that carry a credential
_CREDENTIAL_HEADERS = ("authorization", "proxy-authorization", "x-api-key", "api-key")


def redact(text: str, secrets: Iterable[str] = (), *, patterns: bool = True) -> str:
    """``text`` with every value of ``secrets`` and (``patterns``) every secret-looking string
    (an ``sk-…`` key, a GitHub or Copilot token, a bearer credential) replaced by ``[REDACTED]``."""
    return redact_pieces([text], secrets, patterns=patterns)[0]


def redact_pieces(pieces: Sequence[str], secrets: Iterable[str] = (), *,
                  patterns: bool = True) -> list[str]:
    """:func:`redact` over one text that came in ``pieces`` (a stream's deltas): a secret split
    between pieces is replaced in the piece where it begins, its rest taken out of the others."""
    finders = list(_SECRET_PATTERNS) if patterns else []
    known = tuple(sorted({s for s in secrets if s}, key=len, reverse=True))
    if known:
        finders.insert(0, (_alternatives(known), REDACTED))
    out = list(pieces)
    for pattern, replacement in finders:
        edits = [(m.start(), m.end(), m.expand(replacement))
                 for m in pattern.finditer("".join(out))]
        if edits:
            out = _splice(out, edits)
    return out


@functools.lru_cache(maxsize=32)
def _alternatives(known: tuple[str, ...]) -> re.Pattern[str]:
    return re.compile("|".join(map(re.escape, known)))


def _splice(pieces: list[str], edits: list[tuple[int, int, str]]) -> list[str]:
    """``pieces`` with each ``(start, end, text)`` of their joined text replaced (``text`` goes
    where the span starts)."""
    out: list[str] = []
    offset = k = 0
    for piece in pieces:
        lo, hi = offset, offset + len(piece)
        parts: list[str] = []
        pos = lo
        while k < len(edits) and edits[k][0] < hi:
            start, end, text = edits[k]
            if start >= pos:  # it begins here (else in an earlier piece, which has its text)
                parts += [piece[pos - lo:start - lo], text]
            pos = max(pos, min(end, hi))
            if end > hi:  # it goes on into the next piece
                break
            k += 1
        parts.append(piece[pos - lo:])
        out.append("".join(parts))
        offset = hi
    return out


def sent_credentials(headers: Mapping[str, str]) -> list[str]:
    """The credentials a request's ``headers`` carry: each credential header's value and the
    part after its scheme (``Bearer …``), when 8 characters or longer (a shorter one, such as
    Ollama's ``ollama``, is a placeholder, and a word a message may use)."""
    found: list[str] = []
    for name in _CREDENTIAL_HEADERS:
        value = headers.get(name)
        if value:
            found += [v for v in (value, value.split(" ", 1)[-1].strip()) if len(v) >= 8]
    return found


def option_refused(message: str, *, provider: str | None) -> RequestError:
    """A :class:`RequestError` for an option this provider does not take, raised before anything
    is sent: every request with it would get it (``option_refused``), so a batch stops at once."""
    error = RequestError(message, provider=provider)
    error.option_refused = True
    return error


class AuthenticationError(DispatchError):
    """Credentials are missing, wrong or expired (401/403). Log in again or fix the key."""

    default_code = "authentication_failed"


class RateLimitError(DispatchError):
    """Too many requests, or a quota/spend limit (429, Copilot 402)."""

    default_code = "rate_limited"

    @property
    def retryable(self) -> bool:
        if self._retryable is not None:
            return self._retryable
        return self.code == "rate_limited"


class ServerError(DispatchError):
    """The provider failed (5xx, 529 overloaded). Usually worth retrying."""

    default_code = "server_error"
    default_retryable = True


class RequestError(DispatchError):
    """The request is wrong (400/404/413/422): retrying the same request will not help."""

    default_code = "invalid_request"


class ContextLengthError(RequestError):
    """The prompt (plus max_tokens) does not fit in the model's context window."""

    default_code = "context_length_exceeded"


class ModelUnavailableError(RequestError):
    """The model does not exist or is not enabled for this account."""

    default_code = "model_unavailable"

    def __init__(self, message: str, *, available: list[str] | None = None, **kw: Any) -> None:
        super().__init__(message, **kw)
        #: model ids the provider does offer, when known
        self.available = available or []


class OutputValidationError(RequestError):
    """The answer is not what ``output=`` asked for: not JSON, not valid for the schema, cut off
    at ``max_tokens`` (code ``output_truncated``) or refused by the model (``output_refused``).

    ``text`` is the raw text the model wrote (the JSON it produced, or its refusal), ``errors``
    the validation errors (pydantic's ``ValidationError.errors()`` shape: ``type``, ``loc``,
    ``msg``, ``input``), ``partial`` the last answer as a :class:`~dispatch_nb.types.Response`
    (its ``usage`` counts every attempt) and ``attempts`` how many answers were tried
    (``output_retries`` + 1 at most).
    """

    default_code = "output_invalid"

    def __init__(
        self,
        message: str,
        *,
        text: str = "",
        errors: list[dict[str, Any]] | None = None,
        attempts: int = 1,
        **kw: Any,
    ) -> None:
        super().__init__(message, **kw)
        self.text = text
        self.errors: list[dict[str, Any]] = list(errors or [])
        self.attempts = attempts


class APIConnectionError(DispatchError, ConnectionError):
    """The server could not be reached, or the connection broke."""

    default_code = "network_error"
    default_retryable = True
    #: no connection could be made (refused, no such host): the server was not reached at all
    connect_failed = False


class APITimeoutError(APIConnectionError, TimeoutError):
    """No complete answer before the deadline."""

    default_code = "timeout"


class RequestCancelled(DispatchError):
    """The call was cancelled (``CancelToken.cancel()`` or a keyboard interrupt)."""

    default_code = "cancelled"


class BudgetExceededError(DispatchError):
    """Not sent: what is left of ``budget=`` does not cover this request's worst case (its input
    estimate plus ``max_tokens`` of output). Nothing was sent for it; not retryable — run it
    again with a larger budget (a checkpointed batch resumes where it stopped). See
    docs/cost.md."""

    default_code = "budget_exceeded"


# ---------------------------------------------------------------------------------------------
# The table: HTTP status → error class. Provider error types refine it (see error_for_status).

STATUS_TABLE: dict[int, type[DispatchError]] = {
    400: RequestError,
    401: AuthenticationError,
    402: RateLimitError,  # Copilot quota / Anthropic billing: not retryable (code quota_exceeded)
    403: AuthenticationError,
    404: RequestError,
    408: ServerError,
    409: ServerError,
    413: RequestError,
    422: RequestError,
    429: RateLimitError,
}

#: the provider error types of a quota or spend limit: code ``quota_exceeded``, not retried
QUOTA_TYPES = frozenset({"insufficient_quota", "quota_exceeded", "free_quota_exceeded",
                         "overage_limit_reached", "billing_error", "enforced_spend_limit_reached"})
#: provider error type/code → error class (its ``default_code``). Checked before the status table.
TYPE_TABLE: dict[str, type[DispatchError]] = {
    error_type: cls
    for cls, error_types in (
        (ContextLengthError, "context_length_exceeded exceed_context_size_error string_above_max_length"),
        (ModelUnavailableError, "model_not_found model_not_supported unsupported_model"),
        (RateLimitError, "rate_limit_error rate_limit_exceeded"),
        (ServerError, "overloaded_error api_error server_error timeout_error unavailable_error"),
        (AuthenticationError, "authentication_error permission_error invalid_api_key"),
        (RequestError, "request_too_large"),
    )
    for error_type in error_types.split()
}
TYPE_TABLE.update(dict.fromkeys(QUOTA_TYPES, RateLimitError))

_CONTEXT_PHRASES = (
    "context length",
    "context_length",
    "context window",
    "maximum context",
    "too many tokens",
    "prompt is too long",
    "exceeds the context",
)


def error_for_status(
    status: int,
    message: str,
    *,
    provider: str | None = None,
    error_type: str | None = None,
    headers: Mapping[str, str] | None = None,
    request_id: str | None = None,
) -> DispatchError:
    """The right :class:`DispatchError` for an HTTP error (or an in-stream error event).
    ``error_type``, the provider's own (``insufficient_quota``...), refines the class the status
    gives; ``headers`` supply ``retry-after`` / ``retry-after-ms`` and ``x-should-retry``."""
    cls: type[DispatchError] = STATUS_TABLE.get(status) or (
        ServerError if not status or status >= 500 else RequestError if status >= 400 else DispatchError
    )
    code: str | None = None
    if error_type in TYPE_TABLE:
        cls = TYPE_TABLE[error_type]
        code = "quota_exceeded" if error_type in QUOTA_TYPES else cls.default_code
        # A type table hit never turns a 5xx into a client error or vice versa, except quota.
        if status >= 500 and not issubclass(cls, ServerError):
            cls, code = ServerError, None
    lowered = message.lower()
    if cls is RequestError:
        if any(p in lowered for p in _CONTEXT_PHRASES):
            cls, code = ContextLengthError, "context_length_exceeded"
        elif status == 404 and "model" in lowered:
            cls, code = ModelUnavailableError, "model_unavailable"
    if status == 402 and code is None:
        code = "quota_exceeded"

    should_retry = str(headers.get("x-should-retry", "")).strip().lower() if headers else ""
    return cls(
        message,
        status_code=status or None,
        provider=provider,
        code=code,
        retryable={"true": True, "false": False}.get(should_retry),
        request_id=request_id,
        provider_code=error_type,
        retry_after=parse_retry_after(headers) if headers is not None else None,
    )


#: the longest message :func:`summarize_body` makes from a body that is not a provider's JSON
SUMMARY_LIMIT = 200
_HTML_START = re.compile(rb"\A\s*(?:<!--.*?-->\s*)*<(?:!doctype\s+html|html|head|body|title|h1|center|p)\b",
                         re.IGNORECASE | re.DOTALL)
_HTML_TITLE = re.compile(r"<(title|h1|h2)\b[^>]*>(.*?)</\1\s*>", re.IGNORECASE | re.DOTALL)
_HTML_HIDDEN = re.compile(r"<(script|style|head)\b.*?</\1\s*>|<!--.*?-->", re.IGNORECASE | re.DOTALL)
_HTML_BLOCK_TAG = re.compile(
    r"</?(?:p|div|br|hr|h[1-6]|li|ul|ol|tr|td|th|table|center|body|html|head|title|pre|form|"
    r"section|header|footer|main|article|blockquote)\b[^>]*>",
    re.IGNORECASE,
)
_HTML_TAG = re.compile(r"<[^>]*>")


def looks_like_html(body: bytes) -> bool:
    """Whether a body is an HTML page (what proxies and web servers answer), not an API's."""
    return bool(_HTML_START.match(body[:4096]))


def summarize_body(body: bytes, *, limit: int = SUMMARY_LIMIT) -> str:
    """One short line describing a body that is not a provider's JSON: an HTML page's
    ``<title>`` (else its first heading or line of text), without markup; plain text's first
    non-empty line. At most ``limit`` characters (cut with "…")."""
    text = body.decode("utf-8", "replace")
    if looks_like_html(body):
        titled = _HTML_TITLE.search(text)
        if titled and _HTML_TAG.sub("", titled.group(2)).strip():
            text = " ".join(_HTML_TAG.sub("", titled.group(2)).split())
        else:
            text = _HTML_BLOCK_TAG.sub("\n", _HTML_HIDDEN.sub("\n", text))
        text = html.unescape(_HTML_TAG.sub("", text))
    line = next((ln for ln in (" ".join(raw.split()) for raw in text.splitlines()) if ln), "")
    if len(line) > limit:
        line = line[: limit - 1].rstrip() + "…"
    return line


def parse_retry_after(headers: Mapping[str, str], *, now: float | None = None) -> float | None:
    """Seconds to wait, from ``retry-after-ms``, else ``retry-after`` (seconds or an HTTP date)."""
    ms = headers.get("retry-after-ms")
    if ms is not None:
        with contextlib.suppress(ValueError):
            return max(0.0, float(ms) / 1000.0)
    value = headers.get("retry-after")
    if value is None:
        return None
    value = value.strip()
    with contextlib.suppress(ValueError):
        return max(0.0, float(value))
    try:
        parsed = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    now = time.time() if now is None else now
    return max(0.0, parsed.timestamp() - now)
