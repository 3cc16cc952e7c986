"""A fake GitHub on loopback: the OAuth device flow, ``GET /user``, and the Copilot token exchange.

::

    with FakeGitHub() as github:                       # github.github_url == github.api_url
        flow = DeviceFlow(github_url=github.github_url, min_interval=0)
        code = flow.start()
        github.respond(code.user_code, "authorization_pending", ("slow_down", 0.1))
        github.approve(code.user_code)                 # from any thread, e.g. while poll() waits
        token = flow.poll(code)
        manager = CopilotTokenManager(token, github_api_url=github.api_url)
        github.copilot_token_response(endpoints_api="http://127.0.0.1:9999", delay=0.1)
        manager.get(); assert github.copilot_exchanges == 1

Device codes answer, in order: anything scripted with :meth:`FakeGitHub.respond`, then what the
code's status says (``pending`` until :meth:`approve` / :meth:`deny` / :meth:`expire`). Real
GitHub behaviour is kept where it is cheap: errors come as HTTP 200 bodies, an unknown device code
gives ``incorrect_device_code``, another client id ``incorrect_client_credentials``, a wrong grant
type ``unsupported_grant_type``.

The Copilot token endpoint checks ``Authorization: token <GitHub token>`` against the tokens it
issued (``approve``) or was told about (:meth:`add_github_token`; :attr:`github_token` is one
ready to use), then answers as :meth:`copilot_token_response` says. Copilot tokens it hands out are
remembered, so a chat fake can check a bearer token with :meth:`check_copilot_token`.
:meth:`add_route` mounts more endpoints on the same server.
"""

from __future__ import annotations

import collections
import json
import secrets
import string
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl

from .server import LoopbackServer, RecordedRequest, Reply

__all__ = ["COPILOT_CLIENT_ID", "DeviceAuthorization", "FakeGitHub", "ScriptItem"]

COPILOT_CLIENT_ID = "Iv1.b507a08c87ecfe98"
GRANT_TYPE = "urn:ietf:params:oauth:grant-type:device_code"

#: One scripted answer to a token poll: an outcome name ("approve", "deny", "expire", "pending"),
#: a GitHub error code ("slow_down", "incorrect_device_code"...), ``("slow_down", interval)``,
#: a raw JSON body (dict, HTTP 200) or a full :class:`Reply`.
ScriptItem = str | tuple[str, float] | dict[str, Any] | Reply

_DESCRIPTIONS = {
    "authorization_pending": "The authorization request is still pending.",
    "slow_down": "Too many requests have been made in the same timeframe.",
    "expired_token": "The device code has expired.",
    "access_denied": "The authorization request was denied.",
    "incorrect_device_code": "The device_code provided is not valid.",
    "incorrect_client_credentials": "The client_id is not valid.",
    "unsupported_grant_type": "The grant type is not supported.",
    "device_flow_disabled": "Device Flow must be explicitly enabled for this App",
}


@dataclass
class DeviceAuthorization:
    """One device code the fake issued, and what happened to it."""

    device_code: str
    user_code: str
    client_id: str
    scope: str
    interval: float
    expires_at: float
    status: str = "pending"  # pending | approved | denied | expired
    access_token: str | None = None
    login: str = "octocat"
    script: collections.deque[ScriptItem] = field(default_factory=collections.deque)
    poll_times: list[float] = field(default_factory=list)  # time.monotonic() of each poll

    @property
    def polls(self) -> int:
        """How many token polls arrived for this code."""
        return len(self.poll_times)


@dataclass
class _CopilotBehaviour:
    status: int = 200
    endpoints_api: str | None = "https://api.individual.githubcopilot.com"
    expires_in: float = 1800
    expires_at: float | None = None
    refresh_in: float | None = 1500
    sku: str = "copilot_for_individuals_subscriber"
    notification_id: str | None = None
    message: str | None = None
    url: str | None = None
    rate_limited: bool = False
    body: dict[str, Any] | None = None
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0


class FakeGitHub:
    """GitHub's login and token endpoints on ``http://127.0.0.1:<port>`` (see the module doc).

    ``interval`` and ``expires_in`` go into every device-code answer; ``login`` is the user name
    approvals and :attr:`github_token` belong to. Use it as a context manager, or ``start()`` /
    ``close()``.
    """

    def __init__(
        self,
        *,
        interval: float = 0,
        expires_in: float = 900,
        login: str = "octocat",
        client_id: str = COPILOT_CLIENT_ID,
    ) -> None:
        self.interval = interval
        self.expires_in = expires_in
        self.login = login
        self.client_id = client_id
        self._cond = threading.Condition()
        self.authorizations: list[DeviceAuthorization] = []
        self.users: dict[str, str] = {}
        #: a reply that replaces the next answers of ``POST /login/device/code`` (None: normal)
        self.device_code_reply: Reply | None = None
        #: a reply that replaces the answers of ``GET /user`` (None: normal)
        self.user_reply: Reply | None = None
        self._copilot_default = _CopilotBehaviour()
        self._copilot_once: collections.deque[_CopilotBehaviour] = collections.deque()
        #: requests that reached ``GET /copilot_internal/v2/token``
        self.copilot_exchanges = 0
        #: every Copilot token handed out, oldest first
        self.issued_copilot_tokens: list[str] = []
        self._revoked: set[str] = set()
        self._routes: dict[tuple[str, str], Callable[[RecordedRequest], Reply]] = {}
        self.server = LoopbackServer(self._handle)
        self.github_url = self.server.url
        self.api_url = self.server.url
        #: a GitHub token the Copilot exchange and /user accept, owned by ``login``
        self.github_token = self.add_github_token(login=login)

    # -- lifecycle -------------------------------------------------------------------------------
    def start(self) -> FakeGitHub:
        """Start serving (idempotent for the context manager)."""
        self.server.start()
        return self

    def close(self) -> None:
        """Stop serving and drop open connections."""
        self.server.close()

    def __enter__(self) -> FakeGitHub:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def requests(self) -> list[RecordedRequest]:
        """Every request received, in order."""
        return self.server.requests

    def requests_to(self, path: str) -> list[RecordedRequest]:
        """The requests received for ``path``."""
        return [r for r in self.server.requests if r.path == path]

    def add_route(self, method: str, path: str, handler: Callable[[RecordedRequest], Reply]) -> None:
        """Serve ``method path`` with ``handler`` (checked before the built-in endpoints)."""
        self._routes[(method.upper(), path)] = handler

    # -- users -----------------------------------------------------------------------------------
    def add_github_token(self, token: str | None = None, *, login: str | None = None) -> str:
        """Make a GitHub token valid (a new ``ghu_`` one if not given); returns it."""
        token = token or f"ghu_{secrets.token_hex(18)}"
        with self._cond:
            self.users[token] = login or self.login
        return token

    def revoke_github_token(self, token: str) -> None:
        """Make a GitHub token invalid (the exchange and /user answer 401)."""
        with self._cond:
            self.users.pop(token, None)

    # -- device flow control ---------------------------------------------------------------------
    def authorization(self, user_code: str | None = None) -> DeviceAuthorization:
        """The authorization for ``user_code`` (case and hyphen ignored); the latest if None."""
        with self._cond:
            if user_code is None:
                if not self.authorizations:
                    raise LookupError("no device code has been issued yet")
                return self.authorizations[-1]
            wanted = _normal_code(user_code)
            for auth in self.authorizations:
                if _normal_code(auth.user_code) == wanted:
                    return auth
        raise LookupError(f"no device code with user code {user_code!r}")

    def wait_for_device_code(self, timeout: float = 5.0) -> DeviceAuthorization:
        """Block until a device code has been issued; returns the latest one."""
        with self._cond:
            if not self._cond.wait_for(lambda: bool(self.authorizations), timeout):
                raise TimeoutError("no device code was requested")
            return self.authorizations[-1]

    def wait_for_polls(self, user_code: str, count: int = 1, timeout: float = 5.0) -> bool:
        """Block until ``count`` token polls have arrived for ``user_code``."""
        auth = self.authorization(user_code)
        with self._cond:
            return self._cond.wait_for(lambda: auth.polls >= count, timeout)

    def respond(self, user_code: str, *items: ScriptItem) -> None:
        """Script the next answers to token polls for ``user_code`` (see :data:`ScriptItem`)."""
        auth = self.authorization(user_code)
        with self._cond:
            auth.script.extend(items)

    def approve(
        self, user_code: str | None = None, *, token: str | None = None, login: str | None = None
    ) -> str:
        """Approve a code (the latest if None); returns the GitHub token the next poll receives."""
        auth = self.authorization(user_code)
        token = token or f"ghu_{secrets.token_hex(18)}"
        with self._cond:
            auth.status = "approved"
            auth.access_token = token
            auth.login = login or self.login
            self.users[token] = auth.login
            self._cond.notify_all()
        return token

    def deny(self, user_code: str | None = None) -> None:
        """The user pressed Cancel: the next poll answers ``access_denied``."""
        self._set_status(user_code, "denied")

    def expire(self, user_code: str | None = None) -> None:
        """The code expires: the next poll answers ``expired_token``."""
        self._set_status(user_code, "expired")

    def _set_status(self, user_code: str | None, status: str) -> None:
        auth = self.authorization(user_code)
        with self._cond:
            auth.status = status
            self._cond.notify_all()

    # -- Copilot token control -------------------------------------------------------------------
    def copilot_token_response(
        self,
        *,
        status: int = 200,
        endpoints_api: str | None = "https://api.individual.githubcopilot.com",
        expires_in: float = 1800,
        expires_at: float | None = None,
        refresh_in: float | None = 1500,
        sku: str = "copilot_for_individuals_subscriber",
        notification_id: str | None = None,
        message: str | None = None,
        url: str | None = None,
        rate_limited: bool = False,
        body: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
        delay: float = 0.0,
        times: int | None = None,
    ) -> None:
        """How ``GET /copilot_internal/v2/token`` answers from now on (or, with ``times=N``, for
        the next N exchanges only).

        ``status=200`` issues a token (``endpoints_api=None`` leaves ``endpoints`` out,
        ``refresh_in=None`` leaves it out); ``notification_id`` answers 403 with Copilot's error
        envelope; ``rate_limited`` answers GitHub's 403 "API rate limit exceeded"; any other
        status answers ``{"message": message}``. ``body`` replaces the JSON body; ``delay``
        holds the answer back that many seconds (to provoke races).
        """
        behaviour = _CopilotBehaviour(
            status=403 if (notification_id or rate_limited) and status == 200 else status,
            endpoints_api=endpoints_api,
            expires_in=expires_in,
            expires_at=expires_at,
            refresh_in=refresh_in,
            sku=sku,
            notification_id=notification_id,
            message=message,
            url=url,
            rate_limited=rate_limited,
            body=body,
            headers=dict(headers or {}),
            delay=delay,
        )
        with self._cond:
            if times is None:
                self._copilot_default = behaviour
                self._copilot_once.clear()
            else:
                self._copilot_once.extend([behaviour] * times)

    def check_copilot_token(self, token: str) -> bool:
        """True if the fake issued this Copilot token and it is neither revoked nor expired."""
        with self._cond:
            if token not in self.issued_copilot_tokens or token in self._revoked:
                return False
        fields = dict(part.split("=", 1) for part in token.split(":", 1)[0].split(";") if "=" in part)
        return float(fields.get("exp", "0")) > time.time()

    def revoke_copilot_tokens(self) -> None:
        """Invalidate every Copilot token issued so far (a chat fake then answers 401)."""
        with self._cond:
            self._revoked.update(self.issued_copilot_tokens)

    # -- HTTP ------------------------------------------------------------------------------------
    def _handle(self, request: RecordedRequest) -> Reply:
        route = self._routes.get((request.method, request.path))
        if route is not None:
            return route(request)
        if request.method == "POST" and request.path == "/login/device/code":
            return self._device_code(request)
        if request.method == "POST" and request.path == "/login/oauth/access_token":
            return self._access_token(request)
        if request.method == "GET" and request.path == "/user":
            return self._user(request)
        if request.method == "GET" and request.path == "/copilot_internal/v2/token":
            return self._copilot_token(request)
        return Reply.json({"message": "Not Found", "documentation_url": "https://docs.github.com/rest"}, 404)

    def _device_code(self, request: RecordedRequest) -> Reply:
        if self.device_code_reply is not None:
            return self.device_code_reply
        form = _form(request)
        auth = DeviceAuthorization(
            device_code=secrets.token_hex(20),
            user_code=_user_code(),
            client_id=str(form.get("client_id", "")),
            scope=str(form.get("scope", "")),
            interval=self.interval,
            expires_at=time.monotonic() + self.expires_in,
        )
        with self._cond:
            self.authorizations.append(auth)
            self._cond.notify_all()
        return Reply.json(
            {
                "device_code": auth.device_code,
                "user_code": auth.user_code,
                "verification_uri": f"{self.github_url}/login/device",
                "expires_in": self.expires_in,
                "interval": self.interval,
            }
        )

    def _access_token(self, request: RecordedRequest) -> Reply:
        form = _form(request)
        if form.get("grant_type") != GRANT_TYPE:
            return _oauth_error("unsupported_grant_type")
        with self._cond:
            auth = next((a for a in self.authorizations if a.device_code == form.get("device_code")), None)
            if auth is None:
                return _oauth_error("incorrect_device_code")
            auth.poll_times.append(time.monotonic())
            self._cond.notify_all()
            if form.get("client_id") != auth.client_id:
                return _oauth_error("incorrect_client_credentials")
            item = auth.script.popleft() if auth.script else None
        if item is not None:
            return self._scripted(auth, item)
        return self._by_status(auth)

    def _scripted(self, auth: DeviceAuthorization, item: ScriptItem) -> Reply:
        if isinstance(item, Reply):
            return item
        if isinstance(item, dict):
            return Reply.json(item)
        if isinstance(item, tuple):
            name, interval = item
            return _oauth_error(name, interval=interval)
        if item == "approve":
            self.approve(auth.user_code)
            return self._by_status(auth)
        if item == "deny":
            return _oauth_error("access_denied")
        if item == "expire":
            return _oauth_error("expired_token")
        if item == "pending":
            return _oauth_error("authorization_pending")
        return _oauth_error(item)

    def _by_status(self, auth: DeviceAuthorization) -> Reply:
        with self._cond:
            if auth.status == "approved" and auth.access_token:
                return Reply.json(
                    {"access_token": auth.access_token, "token_type": "bearer", "scope": auth.scope}
                )
            if auth.status == "denied":
                return _oauth_error("access_denied")
            if auth.status == "expired" or time.monotonic() >= auth.expires_at:
                return _oauth_error("expired_token")
        return _oauth_error("authorization_pending")

    def _github_user_of(self, request: RecordedRequest) -> str | None:
        scheme, _, token = (request.header("authorization") or "").partition(" ")
        if scheme.lower() not in ("token", "bearer"):
            return None
        with self._cond:
            return self.users.get(token.strip())

    def _user(self, request: RecordedRequest) -> Reply:
        if self.user_reply is not None:
            return self.user_reply
        login = self._github_user_of(request)
        if login is None:
            return _bad_credentials()
        return Reply.json({"login": login, "id": 1, "type": "User", "name": login.title()})

    def _copilot_token(self, request: RecordedRequest) -> Reply:
        with self._cond:
            self.copilot_exchanges += 1
            behaviour = self._copilot_once.popleft() if self._copilot_once else self._copilot_default
        reply = self._copilot_reply(request, behaviour)
        reply.stall = behaviour.delay
        return reply

    def _copilot_reply(self, request: RecordedRequest, b: _CopilotBehaviour) -> Reply:
        if self._github_user_of(request) is None:
            return _bad_credentials()
        headers = dict(b.headers)
        if b.body is not None:
            return Reply.json(b.body, b.status, headers)
        if b.status == 200:
            now = time.time()
            expires_at = int(b.expires_at if b.expires_at is not None else now + b.expires_in)
            token = (
                f"tid={secrets.token_hex(16)};exp={expires_at};sku={b.sku};"
                f"proxy-ep=proxy.individual.githubcopilot.com;8kp=1:{secrets.token_hex(32)}"
            )
            with self._cond:
                self.issued_copilot_tokens.append(token)
            data: dict[str, Any] = {
                "token": token,
                "expires_at": expires_at,
                "sku": b.sku,
                "individual": True,
                "chat_enabled": True,
                "tracking_id": secrets.token_hex(16),
            }
            if b.refresh_in is not None:
                data["refresh_in"] = b.refresh_in
            if b.endpoints_api is not None:
                data["endpoints"] = {
                    "api": b.endpoints_api,
                    "proxy": "https://proxy.individual.githubcopilot.com",
                    "telemetry": "https://telemetry.individual.githubcopilot.com",
                }
            return Reply.json(data, 200, headers)
        if b.notification_id:
            details: dict[str, Any] = {"notification_id": b.notification_id}
            if b.message:
                details["message"] = b.message
            if b.url:
                details["url"] = b.url
            return Reply.json(
                {
                    "message": b.message or "Resource not accessible by integration",
                    "error_details": details,
                    "can_signup_for_limited": False,
                },
                b.status,
                headers,
            )
        if b.rate_limited:
            headers.setdefault("x-ratelimit-limit", "5000")
            headers.setdefault("x-ratelimit-remaining", "0")
            headers.setdefault("x-ratelimit-reset", str(int(time.time()) + 60))
            return Reply.json(
                {
                    "message": "API rate limit exceeded for user ID 1.",
                    "documentation_url": "https://docs.github.com/rest/rate-limit",
                    "status": str(b.status),
                },
                b.status,
                headers,
            )
        return Reply.json({"message": b.message or "Server Error"}, b.status, headers)


def _form(request: RecordedRequest) -> dict[str, Any]:
    """A JSON or form-encoded request body as a dict."""
    if not request.body:
        return {}
    try:
        data = json.loads(request.body)
    except ValueError:
        return dict(parse_qsl(request.body.decode("utf-8")))
    return data if isinstance(data, dict) else {}


def _oauth_error(error: str, *, interval: float | None = None) -> Reply:
    body: dict[str, Any] = {
        "error": error,
        "error_description": _DESCRIPTIONS.get(error, "Something went wrong."),
        "error_uri": "https://docs.github.com/developers/apps/authorizing-oauth-apps",
    }
    if interval is not None:
        body["interval"] = interval
    return Reply.json(body)  # GitHub answers device-flow errors with HTTP 200


def _bad_credentials() -> Reply:
    return Reply.json(
        {"message": "Bad credentials", "documentation_url": "https://docs.github.com/rest"}, 401
    )


def _user_code() -> str:
    alphabet = string.ascii_uppercase.replace("O", "").replace("I", "") + "23456789"
    chars = "".join(secrets.choice(alphabet) for _ in range(8))
    return f"{chars[:4]}-{chars[4:]}"


def _normal_code(code: str) -> str:
    return code.replace("-", "").strip().upper()
