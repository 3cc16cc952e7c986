"""The Copilot token exchange against a loopback fake GitHub: caching, refresh, single flight,
and every error the endpoint gives."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Iterator

import pytest

from dispatch_nb.auth import (
    DEFAULT_COPILOT_API_URL,
    CopilotToken,
    CopilotTokenManager,
)
from dispatch_nb.auth.copilot_token import MIN_TOKEN_AGE
from dispatch_nb.errors import (
    APIConnectionError,
    APITimeoutError,
    AuthenticationError,
    RateLimitError,
    ServerError,
)
from tests.fakes.github import FakeGitHub


class Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def github() -> Iterator[FakeGitHub]:
    with FakeGitHub() as fake:
        yield fake


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def manager(github: FakeGitHub, clock: Clock) -> CopilotTokenManager:
    return CopilotTokenManager(github.github_token, github_api_url=github.api_url, clock=clock)


def closed_port_url() -> str:
    fake = FakeGitHub().start()
    url = fake.api_url
    fake.close()
    return url


# -- success ---------------------------------------------------------------------------------------
def test_get_exchanges_the_github_token(github: FakeGitHub, manager: CopilotTokenManager) -> None:
    github.copilot_token_response(endpoints_api="http://127.0.0.1:9/copilot/")
    token = manager.get()
    assert token.token == github.issued_copilot_tokens[-1]
    assert github.check_copilot_token(token.token)
    assert token.endpoints_api == "http://127.0.0.1:9/copilot"
    assert token.endpoints["proxy"] == "https://proxy.individual.githubcopilot.com"
    assert token.sku == "copilot_for_individuals_subscriber"
    assert token.refresh_in == 1500
    assert token.expires_in() == pytest.approx(1800, abs=5)
    assert token.details["chat_enabled"] is True
    assert "token" not in token.details
    request = github.requests_to("/copilot_internal/v2/token")[0]
    assert request.method == "GET"
    assert request.header("authorization") == f"token {github.github_token}"
    assert request.header("accept") == "application/json"
    assert request.header("x-github-api-version") == "2025-04-01"
    assert request.header("editor-version") == "vscode/1.104.3"
    assert request.header("editor-plugin-version") == "copilot-chat/0.26.7"
    assert request.header("user-agent") == "GitHubCopilotChat/0.26.7"


def test_the_api_url_comes_from_the_environment(github: FakeGitHub, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DISPATCH_NB_GITHUB_API_URL", github.api_url + "/")
    manager = CopilotTokenManager(github.github_token)
    assert manager.token_url == f"{github.api_url}/copilot_internal/v2/token"
    assert manager.get().token


def test_without_endpoints_the_default_api_url_is_used(
    github: FakeGitHub, manager: CopilotTokenManager
) -> None:
    github.copilot_token_response(endpoints_api=None)
    assert manager.get().endpoints_api == DEFAULT_COPILOT_API_URL == "https://api.githubcopilot.com"


def test_the_token_is_cached_until_it_needs_refreshing(
    github: FakeGitHub, manager: CopilotTokenManager, clock: Clock
) -> None:
    first = manager.get()
    assert manager.get() is first
    assert github.copilot_exchanges == 1
    assert first.refresh_at == pytest.approx(first.fetched_at + 1500 - 60)
    clock.advance(1439)
    assert manager.get() is first
    clock.advance(1)
    second = manager.get()
    assert second is not first
    assert github.copilot_exchanges == 2
    assert manager.exchanges == 2


def test_without_refresh_in_the_token_is_refreshed_five_minutes_before_expiry(
    github: FakeGitHub, manager: CopilotTokenManager, clock: Clock
) -> None:
    github.copilot_token_response(refresh_in=None, expires_at=clock.now + 1000)
    token = manager.get()
    assert token.refresh_in is None
    assert token.refresh_at == pytest.approx(clock.now + 700, abs=1)
    clock.advance(699)
    assert manager.get() is token
    clock.advance(2)
    assert manager.get() is not token


def test_a_skewed_clock_cannot_cause_an_exchange_storm(
    github: FakeGitHub, manager: CopilotTokenManager, clock: Clock
) -> None:
    github.copilot_token_response(refresh_in=None, expires_at=clock.now - 3600)
    token = manager.get()
    assert token.refresh_at == pytest.approx(token.fetched_at + MIN_TOKEN_AGE)
    for _ in range(5):
        assert manager.get() is token
    assert github.copilot_exchanges == 1


def test_invalidate_forces_a_refresh_but_only_once_for_a_stale_token(
    github: FakeGitHub, manager: CopilotTokenManager
) -> None:
    first = manager.get()
    manager.invalidate(first)
    second = manager.get()
    assert second is not first
    manager.invalidate(first)  # a late 401 for the old token: nothing to do
    assert manager.get() is second
    manager.invalidate()
    assert manager.get() is not second
    assert github.copilot_exchanges == 3


def test_the_provider_is_asked_on_each_exchange(github: FakeGitHub, clock: Clock) -> None:
    other = github.add_github_token(login="hubot")
    tokens = [github.github_token, other]
    calls: list[str] = []

    def provider() -> str:
        calls.append("x")
        return tokens[len(calls) - 1]

    manager = CopilotTokenManager(provider, github_api_url=github.api_url, clock=clock)
    manager.get()
    manager.invalidate()
    manager.get()
    sent = [r.header("authorization") for r in github.requests_to("/copilot_internal/v2/token")]
    assert sent == [f"token {github.github_token}", f"token {other}"]


def test_an_empty_github_token_is_an_authentication_error(github: FakeGitHub) -> None:
    manager = CopilotTokenManager("", github_api_url=github.api_url)
    with pytest.raises(AuthenticationError, match="no GitHub token") as info:
        manager.get()
    assert info.value.code == "authentication_failed"
    assert github.copilot_exchanges == 0


# -- single flight ---------------------------------------------------------------------------------
def test_32_threads_across_an_expiry_cause_exactly_one_exchange(
    github: FakeGitHub, manager: CopilotTokenManager, clock: Clock
) -> None:
    first = manager.get()
    clock.advance(1500)  # past refresh_at
    github.copilot_token_response(delay=0.1)
    barrier = threading.Barrier(32)
    results: list[CopilotToken] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def worker() -> None:
        barrier.wait()
        try:
            token = manager.get()
        except BaseException as exc:
            with lock:
                errors.append(exc)
            return
        with lock:
            results.append(token)

    threads = [threading.Thread(target=worker) for _ in range(32)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert not errors
    assert len(results) == 32
    assert github.copilot_exchanges == 2
    assert len({id(token) for token in results}) == 1
    assert results[0] is not first


async def test_many_tasks_across_an_expiry_cause_exactly_one_exchange(
    github: FakeGitHub, manager: CopilotTokenManager, clock: Clock
) -> None:
    github.copilot_token_response(delay=0.05)
    tokens = await asyncio.gather(*(manager.aget() for _ in range(50)))
    assert github.copilot_exchanges == 1
    assert len({id(token) for token in tokens}) == 1
    clock.advance(1500)
    tokens = await asyncio.gather(*(manager.aget() for _ in range(50)))
    assert github.copilot_exchanges == 2
    assert len({id(token) for token in tokens}) == 1


def test_threads_and_event_loops_together_cause_one_exchange(
    github: FakeGitHub, manager: CopilotTokenManager
) -> None:
    github.copilot_token_response(delay=0.1)
    barrier = threading.Barrier(8)
    results: list[CopilotToken] = []
    lock = threading.Lock()

    def sync_worker() -> None:
        barrier.wait()
        token = manager.get()
        with lock:
            results.append(token)

    def async_worker() -> None:
        async def many() -> list[CopilotToken]:
            barrier.wait()
            return list(await asyncio.gather(*(manager.aget() for _ in range(10))))

        tokens = asyncio.run(many())
        with lock:
            results.extend(tokens)

    threads = [threading.Thread(target=sync_worker) for _ in range(4)]
    threads += [threading.Thread(target=async_worker) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert len(results) == 44
    assert github.copilot_exchanges == 1
    assert len({id(token) for token in results}) == 1


async def test_a_sync_get_inside_the_loop_does_not_deadlock_with_an_async_refresh(
    github: FakeGitHub, manager: CopilotTokenManager
) -> None:
    github.copilot_token_response(delay=0.2)
    task = asyncio.ensure_future(manager.aget())
    await asyncio.to_thread(lambda: _wait_until(lambda: github.copilot_exchanges == 1))
    token = manager.get()  # blocks this loop's thread while the task holds the lock
    assert token.token
    assert (await task).token


def _wait_until(predicate: object, timeout: float = 5.0) -> None:
    end = time.monotonic() + timeout
    while not predicate() and time.monotonic() < end:  # type: ignore[operator]
        time.sleep(0.005)


async def test_aget_caches_and_refreshes(
    github: FakeGitHub, manager: CopilotTokenManager, clock: Clock
) -> None:
    first = await manager.aget()
    assert await manager.aget() is first
    assert manager.get() is first
    manager.invalidate(first)
    assert await manager.aget() is not first
    assert github.copilot_exchanges == 2


async def test_a_cancelled_aget_releases_the_lock(github: FakeGitHub, manager: CopilotTokenManager) -> None:
    github.copilot_token_response(delay=5, times=1)
    task = asyncio.ensure_future(manager.aget())
    await asyncio.to_thread(lambda: _wait_until(lambda: github.copilot_exchanges == 1))
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert (await asyncio.wait_for(manager.aget(), 2)).token
    assert (await asyncio.to_thread(manager.get)).token


# -- errors ----------------------------------------------------------------------------------------
def test_401_says_to_log_in_again(github: FakeGitHub, clock: Clock) -> None:
    manager = CopilotTokenManager("ghu_revoked_token", github_api_url=github.api_url)
    with pytest.raises(AuthenticationError) as info:
        manager.get()
    error = info.value
    assert type(error) is AuthenticationError
    assert error.status_code == 401
    assert error.code == "authentication_failed"
    assert "rejected your GitHub token" in error.message
    assert "python -m dispatch_nb login" in error.message
    assert "%chat login" in error.message
    assert "Personal access tokens" not in error.message


def test_401_for_the_token_in_the_environment_says_to_unset_it(
    github: FakeGitHub, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``DISPATCH_NB_GITHUB_TOKEN`` comes before any login: "log in again" cannot fix it."""
    monkeypatch.setenv("DISPATCH_NB_GITHUB_TOKEN", "ghu_revoked_token")
    manager = CopilotTokenManager("ghu_revoked_token", github_api_url=github.api_url)
    with pytest.raises(AuthenticationError) as info:
        manager.get()
    assert info.value.code == "authentication_failed"
    assert "It is the value of DISPATCH_NB_GITHUB_TOKEN" in info.value.message
    assert "unset it" in info.value.message and "ghu_revoked_token" not in info.value.message


def test_401_for_a_personal_access_token_explains_why(github: FakeGitHub) -> None:
    manager = CopilotTokenManager("ghp_" + "p" * 36, github_api_url=github.api_url)
    with pytest.raises(AuthenticationError, match="Personal access tokens") as info:
        manager.get()
    assert (info.value.status_code, info.value.code) == (401, "authentication_failed")


NOTIFICATIONS = {
    "no_copilot_access": "https://github.com/features/copilot",
    "not_signed_up": "Sign up",
    "subscription_ended": "subscription has ended",
    "enterprise_managed_user_account": "Enterprise Managed User",
    "feature_flag_blocked": "policy",
    "spammy_user": "GitHub Support",
    "billing_locked": "billing",
    "trade_restricted": "trade restrictions",
    "trade_restricted_country": "country",
    "codespaces_demo_inactive": "Codespaces",
    "snippy_not_configured": "public code",
    "expired_coupon": "coupon",
    "something_brand_new": "something_brand_new",
}


@pytest.mark.parametrize("notification_id", NOTIFICATIONS, ids=list(NOTIFICATIONS))
def test_403_notifications_say_what_to_do(
    github: FakeGitHub, manager: CopilotTokenManager, notification_id: str
) -> None:
    github.copilot_token_response(
        notification_id=notification_id,
        message="You do not have access to GitHub Copilot.",
        url="https://github.com/settings/copilot",
    )
    with pytest.raises(AuthenticationError) as info:
        manager.get()
    error = info.value
    assert error.status_code == 403
    assert error.code == notification_id
    assert error.provider_code == notification_id
    assert NOTIFICATIONS[notification_id] in error.message
    assert "GitHub says: You do not have access to GitHub Copilot." in error.message
    assert "https://github.com/settings/copilot" in error.message


def test_rate_limit_403_is_a_rate_limit_error(github: FakeGitHub, manager: CopilotTokenManager) -> None:
    github.copilot_token_response(rate_limited=True)
    with pytest.raises(RateLimitError) as info:
        manager.get()
    assert info.value.status_code == 403
    assert info.value.retry_after is not None
    assert 0 < info.value.retry_after <= 61
    assert "rate limit" in info.value.message


def test_429_is_a_rate_limit_error(github: FakeGitHub, manager: CopilotTokenManager) -> None:
    github.copilot_token_response(status=429, headers={"retry-after": "7"}, message="slow down")
    with pytest.raises(RateLimitError) as info:
        manager.get()
    assert (info.value.status_code, info.value.code) == (429, "rate_limited")
    assert info.value.retry_after == 7


def test_a_plain_403_is_an_authentication_error(github: FakeGitHub, manager: CopilotTokenManager) -> None:
    github.copilot_token_response(status=403, message="Resource not accessible by integration")
    with pytest.raises(AuthenticationError, match="Resource not accessible") as info:
        manager.get()
    assert (info.value.status_code, info.value.code) == (403, "authentication_failed")


def test_404_hints_at_the_app_or_the_api_url(github: FakeGitHub, manager: CopilotTokenManager) -> None:
    github.copilot_token_response(status=404, message="Not Found")
    with pytest.raises(AuthenticationError, match="DISPATCH_NB_GITHUB_API_URL") as info:
        manager.get()
    assert (info.value.status_code, info.value.code) == (404, "authentication_failed")


@pytest.mark.parametrize("status", [500, 502, 503])
def test_5xx_is_a_server_error(github: FakeGitHub, manager: CopilotTokenManager, status: int) -> None:
    github.copilot_token_response(status=status, message="unicorn")
    with pytest.raises(ServerError) as info:
        manager.get()
    assert info.value.status_code == status
    assert info.value.retryable


def test_a_200_without_a_token_is_a_server_error(github: FakeGitHub, manager: CopilotTokenManager) -> None:
    github.copilot_token_response(body={"expires_at": 1})
    with pytest.raises(ServerError, match="no token") as info:
        manager.get()
    assert (info.value.status_code, info.value.code) == (200, "server_error")


def test_an_unreachable_server_is_a_connection_error() -> None:
    manager = CopilotTokenManager("ghu_x", github_api_url=closed_port_url())
    with pytest.raises(APIConnectionError) as info:
        manager.get()
    assert info.value.code == "network_error"
    assert isinstance(info.value, ConnectionError)


def test_a_timed_out_exchange_says_it_was_the_copilot_token_request(github: FakeGitHub) -> None:
    # the wording of the error before the auth refactor (the exchange and the device flow each
    # say what did not answer)
    github.copilot_token_response(delay=2.0)
    manager = CopilotTokenManager(github.github_token, github_api_url=github.api_url, timeout=0.2)
    with pytest.raises(APITimeoutError) as info:
        manager.get()
    assert info.value.message == f"{github.api_url} did not answer the Copilot token request in time"
    assert info.value.code == "timeout" and isinstance(info.value, TimeoutError)


def test_a_failed_exchange_leaves_no_token_and_recovers(
    github: FakeGitHub, manager: CopilotTokenManager
) -> None:
    github.copilot_token_response(status=500, times=1)
    with pytest.raises(ServerError) as info:
        manager.get()
    assert (info.value.status_code, info.value.code) == (500, "server_error")
    assert manager.cached is None
    assert manager.get().token


async def test_async_errors(github: FakeGitHub, manager: CopilotTokenManager) -> None:
    github.copilot_token_response(notification_id="no_copilot_access", times=1)
    with pytest.raises(AuthenticationError) as info:
        await manager.aget()
    assert info.value.code == "no_copilot_access"
    github.copilot_token_response(status=500, times=1)
    with pytest.raises(ServerError) as raised:
        await manager.aget()
    assert (raised.value.status_code, raised.value.code) == (500, "server_error")
    unreachable = CopilotTokenManager("ghu_x", github_api_url=closed_port_url())
    with pytest.raises(APIConnectionError) as raised:
        await unreachable.aget()
    assert raised.value.code == "network_error"
    assert (await manager.aget()).token


# -- secrets ---------------------------------------------------------------------------------------
async def test_no_secret_in_reprs_errors_or_logs(
    github: FakeGitHub, manager: CopilotTokenManager, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    token = manager.get()
    atoken = await manager.aget()
    texts = [repr(token), str(token), repr(atoken), repr(manager), repr(dict(token.endpoints))]
    secrets = [github.github_token, *github.issued_copilot_tokens]
    github.copilot_token_response(notification_id="no_copilot_access", message="nope")
    manager.invalidate()
    with pytest.raises(AuthenticationError) as info:
        manager.get()
    assert (info.value.status_code, info.value.code) == (403, "no_copilot_access")
    texts += [str(info.value), repr(info.value)]
    manager.invalidate()
    with pytest.raises(AuthenticationError) as info:
        await manager.aget()
    assert (info.value.status_code, info.value.code) == (403, "no_copilot_access")
    texts += [str(info.value), repr(info.value)]
    bad = CopilotTokenManager("ghu_" + "b" * 36, github_api_url=github.api_url)
    secrets.append("ghu_" + "b" * 36)
    with pytest.raises(AuthenticationError) as info:
        bad.get()
    assert (info.value.status_code, info.value.code) == (401, "authentication_failed")
    texts += [str(info.value), repr(info.value), repr(bad)]
    texts += [r.getMessage() for r in caplog.records] + [repr(r.args) for r in caplog.records]
    assert caplog.records
    for text in texts:
        for secret in secrets:
            assert secret not in text, text
