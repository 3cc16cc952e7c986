"""GitHub's OAuth device flow (RFC 8628): how a terminal or a notebook gets a GitHub token.

``astart`` / ``apoll`` are the implementation; ``start`` / ``poll`` run them on the library's
event-loop thread, and ``poll`` calls ``on_state`` in the calling thread. GitHub's answers and
what each means: PROTOCOLS.md §1; the states a login goes through: docs/copilot-login.md.
Neither the device code nor the token ever appears in a repr, a log record or an error message.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from types import MappingProxyType
from typing import Any, TypeVar
from urllib.parse import parse_qsl

import httpx

from ..bridge import SyncIterator, run_sync, same_parameters
from ..call_control import TurnControl
from ..cancel import CancelToken
from ..errors import (
    APIConnectionError,
    APITimeoutError,
    AuthenticationError,
    DispatchError,
    RateLimitError,
    RequestCancelled,
    ServerError,
    parse_retry_after,
)
from ..transport import tls_context
from .endpoints import COPILOT_CLIENT_ID, default_github_api_url, default_github_url

__all__ = [
    "DeviceCode",
    "DeviceCodeExpired",
    "DeviceFlow",
    "DeviceFlowDenied",
    "DeviceFlowError",
    "DeviceFlowState",
    "DeviceFlowUnsupported",
    "afetch_github_user",
    "fetch_github_user",
]

log = logging.getLogger(__name__)

PROVIDER = "github"
USER_AGENT = "dispatch-nb/0.1"
GRANT_TYPE = "urn:ietf:params:oauth:grant-type:device_code"
_T = TypeVar("_T")


class DeviceFlowState(str, Enum):
    """Where a device-flow login stands. Compares equal to its string value."""

    PENDING = "pending"
    SLOW_DOWN = "slow_down"
    APPROVED = "approved"
    DENIED = "denied"
    EXPIRED = "expired"
    ERROR = "error"
    CANCELLED = "cancelled"

    def __str__(self) -> str:
        return self.value

    @property
    def finished(self) -> bool:
        """True for the states a login ends in."""
        return self not in (DeviceFlowState.PENDING, DeviceFlowState.SLOW_DOWN)


#: ``on_state(state, info)``; ``info`` holds ``interval``, ``expires_at``, ``message``, ``error``
#: and ``user_code`` where they apply (never a secret).
StateCallback = Callable[[DeviceFlowState, Mapping[str, Any]], None]


class DeviceFlowError(AuthenticationError):
    """The device flow failed; ``provider_code`` holds GitHub's ``error`` value, if any."""

    default_code = "device_flow_error"


class DeviceFlowUnsupported(DeviceFlowError):
    """This GitHub (or this client id) does not offer the device flow."""

    default_code = "device_flow_unsupported"


class DeviceCodeExpired(DeviceFlowError):
    """The code expired before anyone approved it. Start the login again."""

    default_code = "device_code_expired"


class DeviceFlowDenied(DeviceFlowError):
    """The user pressed Cancel on GitHub's page. Start the login again to retry."""

    default_code = "access_denied"


@dataclass(frozen=True)
class DeviceCode:
    """What GitHub answered to a device-code request. Show ``user_code`` and ``verification_uri``.

    ``device_code`` is the secret half: it is left out of the repr. ``expires_at`` is Unix seconds.
    """

    device_code: str = field(repr=False)
    user_code: str
    verification_uri: str
    expires_in: int
    interval: float
    expires_at: float

    def seconds_left(self) -> float:
        """Seconds until the code expires (negative once it has)."""
        return self.expires_at - time.time()

    @property
    def expired(self) -> bool:
        """True once ``expires_at`` has passed."""
        return self.seconds_left() <= 0


class DeviceFlow:
    """One GitHub device-flow login (RFC 8628); reusable for several attempts.

    ``min_interval`` is the floor for the polling interval (GitHub's ``interval`` is used when it
    is larger); ``slow_down_step`` is what ``slow_down`` adds when GitHub gives no new interval.
    Tests set both small. Transient failures (5xx, network) are retried, up to
    ``max_transient_errors`` in a row, as long as the code is valid.
    """

    def __init__(
        self,
        client_id: str = COPILOT_CLIENT_ID,
        *,
        github_url: str | None = None,
        min_interval: float = 1.0,
        slow_down_step: float = 5.0,
        max_transient_errors: int = 3,
    ) -> None:
        if min_interval < 0 or slow_down_step < 0:
            raise ValueError("min_interval and slow_down_step must not be negative")
        self.client_id = client_id
        self.github_url = (github_url or default_github_url()).rstrip("/")
        self.min_interval = min_interval
        self.slow_down_step = slow_down_step
        self.max_transient_errors = max_transient_errors
        #: the current state; ``None`` until :meth:`poll` starts
        self.state: DeviceFlowState | None = None
        #: the polling interval in force (seconds); ``None`` until :meth:`poll` starts
        self.interval: float | None = None

    def __repr__(self) -> str:
        return (
            f"DeviceFlow(github_url={self.github_url!r}, client_id={self.client_id!r}, "
            f"state={self.state.value if self.state else None!r})"
        )

    # -- requests and answers --------------------------------------------------------------------
    async def _post(self, path: str, body: dict[str, str]) -> httpx.Response:
        async with httpx.AsyncClient(timeout=30.0, verify=tls_context()) as client:
            try:
                return await client.post(
                    f"{self.github_url}{path}", json=body,
                    headers={"Accept": "application/json", "User-Agent": USER_AGENT},
                )
            except httpx.TransportError as exc:
                raise transport_error(exc, self.github_url) from None

    def _unsupported(self, detail: str, status: int | None, error: str | None) -> DeviceFlowError:
        return DeviceFlowUnsupported(
            f"GitHub at {self.github_url} does not offer the device flow for client id "
            f"{self.client_id} ({detail}). For GitHub Enterprise set DISPATCH_NB_GITHUB_URL to "
            "your server's URL; or set DISPATCH_NB_GITHUB_TOKEN to a GitHub token you already "
            "have.",
            status_code=status,
            provider=PROVIDER,
            provider_code=error,
        )

    # -- start -----------------------------------------------------------------------------------
    def start(self) -> DeviceCode:
        """Ask GitHub for a device code and a user code. Raises :class:`DeviceFlowUnsupported`
        when this GitHub or client id has no device flow."""
        return run_sync(self.astart())

    async def astart(self) -> DeviceCode:
        """The async twin of :meth:`start`."""
        body = {"client_id": self.client_id, "scope": "read:user"}
        response = await self._post("/login/device/code", body)
        status = response.status_code
        data = body_fields(response.content)
        error = nonempty_str(data.get("error"))
        if error in ("unauthorized_client", "device_flow_disabled"):
            raise self._unsupported(f"GitHub says {error}", status, error)
        if status in (401, 403, 404, 422):
            raise self._unsupported(f"HTTP {status}", status, error)
        if status != 200 or error:
            raise _http_error(response, data, "requesting a device code")
        verification_uri = nonempty_str(data.get("verification_uri"))
        if not verification_uri:
            raise self._unsupported("the answer has no verification_uri", status, None)
        device_code = nonempty_str(data.get("device_code"))
        user_code = nonempty_str(data.get("user_code"))
        if not device_code or not user_code:
            raise DeviceFlowError("GitHub's device-code answer lacks device_code or user_code",
                                  status_code=status, provider=PROVIDER)
        expires_in = int(_number(data.get("expires_in"), 900.0))
        return DeviceCode(device_code=device_code, user_code=user_code, verification_uri=verification_uri,
                          expires_in=expires_in, interval=_number(data.get("interval"), 5.0),
                          expires_at=time.time() + expires_in)

    # -- poll ------------------------------------------------------------------------------------
    def poll(
        self,
        code: DeviceCode,
        *,
        cancel: CancelToken | None = None,
        on_state: StateCallback | None = None,
    ) -> str:
        """Wait until the user approves ``code`` and return the GitHub token.

        Raises :class:`DeviceCodeExpired`, :class:`DeviceFlowDenied`, :class:`DeviceFlowError`,
        or :class:`~dispatch_nb.errors.RequestCancelled` (within milliseconds of
        ``cancel.cancel()``, a request on the wire included). ``on_state`` is called in this
        thread (the poll runs on the library's event loop and hands its state changes back).
        """
        if on_state is None:
            return run_sync(self.apoll(code, cancel=cancel))
        changes: SyncIterator[Any] = SyncIterator(lambda: self._achanges(code, cancel))
        last: DeviceFlowState | None = None
        try:
            for item in changes:
                if isinstance(item, str):
                    return item  # the token
                last = item[0]
                _call_on_state(on_state, *item)
        except KeyboardInterrupt:
            changes.close()
            if last is None or not last.finished:
                interval = self.interval if self.interval is not None else code.interval
                _call_on_state(on_state, DeviceFlowState.CANCELLED, MappingProxyType({
                    "interval": interval, "expires_at": code.expires_at,
                    "message": "the login was interrupted"}))
            raise
        finally:
            changes.close()
        raise AssertionError("the poll ended without a token or an error")  # pragma: no cover

    async def _achanges(self, code: DeviceCode, cancel: CancelToken | None) -> AsyncIterator[Any]:
        """:meth:`apoll`'s state changes as ``(state, info)`` as they come, then its token (or
        its error)."""
        changes: asyncio.Queue[Any] = asyncio.Queue()
        task = asyncio.ensure_future(self.apoll(
            code, cancel=cancel, on_state=lambda state, info: changes.put_nowait((state, info))))
        task.add_done_callback(changes.put_nowait)  # the task itself comes last, after its changes
        try:
            while (item := await changes.get()) is not task:
                yield item
            yield task.result()
        finally:
            if not task.done():
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task

    async def apoll(
        self,
        code: DeviceCode,
        *,
        cancel: CancelToken | None = None,
        on_state: StateCallback | None = None,
    ) -> str:
        """The async twin of :meth:`poll`."""
        run = _PollRun(self, code, cancel, on_state)
        body = {"client_id": self.client_id, "device_code": code.device_code, "grant_type": GRANT_TYPE}

        async def unless_cancelled(awaitable: Awaitable[_T]) -> _T:
            # ends a wait, or a request on the wire, as soon as ``cancel`` fires
            try:
                result: _T = await control.run_async(asyncio.ensure_future(awaitable))
            except RequestCancelled:
                raise run.cancelled() from None
            return result

        try:
            run.emit(DeviceFlowState.PENDING, user_code=code.user_code)
            with TurnControl(cancel=cancel, provider=PROVIDER) as control:
                while True:
                    run.check()  # then wait the interval, cut short when the code expires sooner
                    await unless_cancelled(asyncio.sleep(max(0.0, min(run.interval, code.seconds_left()))))
                    run.check()
                    try:
                        response = await unless_cancelled(self._post("/login/oauth/access_token", body))
                    except APIConnectionError as exc:  # timeouts included
                        run.transient(exc)
                        continue
                    if (token := run.handle(response)) is not None:
                        return token
        except asyncio.CancelledError:
            run.interrupted()
            raise


def _call_on_state(on_state: StateCallback, state: DeviceFlowState, info: Mapping[str, Any]) -> None:
    try:
        on_state(state, info)
    except Exception:  # a broken display must not break the login
        log.exception("device flow: the on_state callback failed")


@dataclass
class _PollRun:
    """The state machine of one :meth:`DeviceFlow.apoll` call."""

    flow: DeviceFlow
    code: DeviceCode
    cancel: CancelToken | None
    on_state: StateCallback | None
    #: transient failures in a row
    failures: int = 0

    def __post_init__(self) -> None:
        self.interval = max(self.code.interval, self.flow.min_interval)

    def emit(self, state: DeviceFlowState, **info: Any) -> None:
        self.flow.state, self.flow.interval = state, self.interval
        log.debug("device flow: %s", state.value)
        if self.on_state is None:
            return
        payload = {"interval": self.interval, "expires_at": self.code.expires_at, **info}
        _call_on_state(self.on_state, state, MappingProxyType(payload))

    def check(self) -> None:
        if self.cancel is not None and self.cancel.cancelled:
            raise self.cancelled()
        if self.code.expired:
            raise self.expired()

    def expired(self, provider_code: str | None = None) -> DispatchError:
        return self.fail(DeviceFlowState.EXPIRED, DeviceCodeExpired(
            "The login code expired before it was approved. Start the login again "
            "(`python -m dispatch_nb login` or `%chat login`).",
            provider=PROVIDER, provider_code=provider_code,
        ))

    def fail(self, state: DeviceFlowState, error: DispatchError) -> DispatchError:
        self.emit(state, message=error.message, error=error.provider_code or error.code)
        return error

    def cancelled(self) -> RequestCancelled:
        reason = self.cancel.reason if self.cancel is not None else None
        error = RequestCancelled(reason or "the login was cancelled", provider=PROVIDER)
        self.emit(DeviceFlowState.CANCELLED, message=error.message)
        return error

    def interrupted(self) -> None:
        if self.flow.state is None or not self.flow.state.finished:
            self.emit(DeviceFlowState.CANCELLED, message="the login was interrupted")

    def transient(self, error: DispatchError) -> None:
        """A 5xx, 429 or network failure: try again while the code is valid, a few times."""
        self.failures += 1
        log.debug("device flow: transient failure %d: %s", self.failures, error.message)
        if self.failures > self.flow.max_transient_errors:
            raise self.fail(DeviceFlowState.ERROR, error)
        if isinstance(error, RateLimitError) and error.retry_after:
            self.interval = max(self.interval, min(error.retry_after, 60.0))

    def handle(self, response: httpx.Response) -> str | None:
        """The token, or None to keep polling; raises for the final failures."""
        status = response.status_code
        data = body_fields(response.content)
        error = nonempty_str(data.get("error"))
        if not error:
            if status >= 500 or status == 429:
                self.transient(_http_error(response, data, "polling for the token"))
                return None
            token = nonempty_str(data.get("access_token"))
            if status == 200 and token:
                self.emit(DeviceFlowState.APPROVED, scope=nonempty_str(data.get("scope")) or "")
                return token
            raise self.fail(DeviceFlowState.ERROR, DeviceFlowError(
                "GitHub's answer to the token poll has neither access_token nor error",
                status_code=status, provider=PROVIDER,
            ) if status == 200 else _http_error(response, data, "polling for the token"))
        self.failures = 0
        if error == "authorization_pending":
            if self.flow.state is not DeviceFlowState.PENDING:
                self.emit(DeviceFlowState.PENDING)
            return None
        if error == "slow_down":
            new = _number(data.get("interval"), self.interval + self.flow.slow_down_step)
            self.interval = max(new, self.flow.min_interval)
            self.emit(DeviceFlowState.SLOW_DOWN)
            return None
        raise self._final_error(error, status, nonempty_str(data.get("error_description")))

    def _final_error(self, error: str, status: int, description: str | None) -> DispatchError:
        flow = self.flow
        if error in ("expired_token", "token_expired"):
            return self.expired(error)
        kw: dict[str, Any] = {"provider": PROVIDER, "provider_code": error}
        if error == "access_denied":
            return self.fail(DeviceFlowState.DENIED, DeviceFlowDenied(
                "The login was declined on GitHub (access denied). Start the login again if that "
                "was a mistake.", **kw,
            ))
        message = {
            "incorrect_device_code": "GitHub does not recognise this login code. Start the login again.",
            "incorrect_client_credentials": (
                f"GitHub at {flow.github_url} rejected the client id {flow.client_id!r}. "
                "Check the client_id argument (or the GitHub URL, for GitHub Enterprise)."
            ),
            "unsupported_grant_type": (
                "GitHub rejected the grant type of the token request. This is a bug in "
                "dispatch_nb; please report it."
            ),
            "device_flow_disabled": (
                f"The device flow is disabled for client id {flow.client_id!r} at "
                f"{flow.github_url}. Set DISPATCH_NB_GITHUB_TOKEN to a GitHub token instead."
            ),
        }.get(error, f"GitHub refused the login ({error}).")
        if description:
            message = f"{message} GitHub says: {description}"
        cls = DeviceFlowUnsupported if error == "device_flow_disabled" else DeviceFlowError
        return self.fail(DeviceFlowState.ERROR, cls(message, status_code=status or None, **kw))


# -- the GitHub user -----------------------------------------------------------------------------
async def afetch_github_user(token: str, api_url: str | None = None) -> str | None:
    """The login name of the token's owner (``GET {api_url}/user``), or None if that fails.

    Never raises for HTTP or network trouble: it only decorates "approved as <login>".
    ``api_url`` defaults to ``$DISPATCH_NB_GITHUB_API_URL`` else ``https://api.github.com``.
    """
    url = f"{(api_url or default_github_api_url()).rstrip('/')}/user"
    headers = {
        "Authorization": f"token {token}",
        "Accept": "application/vnd.github+json",
        "User-Agent": USER_AGENT,
    }
    try:
        async with httpx.AsyncClient(timeout=10.0, verify=tls_context()) as client:
            response = await client.get(url, headers=headers)
    except (httpx.HTTPError, httpx.InvalidURL, ValueError) as exc:
        log.debug("GET /user failed: %s", type(exc).__name__)
        return None
    if response.status_code != 200:
        log.debug("GET /user answered HTTP %d", response.status_code)
        return None
    return nonempty_str(body_fields(response.content).get("login"))


@same_parameters(afetch_github_user)
def fetch_github_user(*args: Any, **kwargs: Any) -> str | None:
    """The sync twin of :func:`afetch_github_user`."""
    return run_sync(afetch_github_user(*args, **kwargs))


# -- small parsing helpers -----------------------------------------------------------------------
def body_fields(body: bytes) -> dict[str, Any]:
    """A JSON object body, or a form-encoded one (GitHub's answer without ``Accept``); else {}."""
    if not body:
        return {}
    try:
        data = json.loads(body)
    except ValueError:
        try:
            return dict(parse_qsl(body.decode("utf-8"), strict_parsing=True))
        except (ValueError, UnicodeDecodeError):
            return {}
    return data if isinstance(data, dict) else {}


def nonempty_str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _number(value: Any, default: float) -> float:
    if isinstance(value, (int, float, str)) and not isinstance(value, bool):
        with contextlib.suppress(ValueError):
            return float(value)
    return default


def _http_error(response: httpx.Response, data: Mapping[str, Any], doing: str) -> DispatchError:
    status = response.status_code
    detail = nonempty_str(data.get("error_description")) or nonempty_str(data.get("message"))
    error = nonempty_str(data.get("error"))
    text = f"GitHub answered HTTP {status} when {doing}"
    if error:
        text += f" ({error})"
    if detail:
        text += f": {detail}"
    kw: dict[str, Any] = {"status_code": status, "provider": PROVIDER, "provider_code": error}
    if status == 429:
        return RateLimitError(text, retry_after=parse_retry_after(response.headers), **kw)
    if status >= 500:
        return ServerError(text, **kw)
    return DeviceFlowError(text, **kw)


def transport_error(exc: httpx.TransportError, url: str, provider: str = PROVIDER,
                    request: str = "") -> DispatchError:
    """A network failure reaching ``url`` (while making ``request``, e.g. "the Copilot token
    request")."""
    if isinstance(exc, httpx.TimeoutException):
        return APITimeoutError(f"{url} did not answer {request + ' ' if request else ''}in time",
                               provider=provider)
    return APIConnectionError(f"could not reach {url}{' for ' + request if request else ''} "
                              f"({type(exc).__name__}: {exc})", provider=provider)
