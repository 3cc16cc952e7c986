"""The GitHub device flow against a loopback fake GitHub: every outcome, sync and async."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any

import pytest

from dispatch_nb.auth import (
    DeviceCode,
    DeviceCodeExpired,
    DeviceFlow,
    DeviceFlowDenied,
    DeviceFlowError,
    DeviceFlowState,
    DeviceFlowUnsupported,
    afetch_github_user,
    fetch_github_user,
)
from dispatch_nb.cancel import CancelToken
from dispatch_nb.errors import (
    APIConnectionError,
    AuthenticationError,
    RequestCancelled,
    ServerError,
)
from tests.fakes.github import FakeGitHub
from tests.fakes.server import Reply


@pytest.fixture
def github() -> Iterator[FakeGitHub]:
    with FakeGitHub(interval=0) as fake:
        yield fake


@pytest.fixture
def flow(github: FakeGitHub) -> DeviceFlow:
    return DeviceFlow(github_url=github.github_url, min_interval=0)


class Recorder:
    """An ``on_state`` callback that remembers what it saw."""

    def __init__(self) -> None:
        self.events: list[tuple[DeviceFlowState, dict[str, Any]]] = []

    def __call__(self, state: DeviceFlowState, info: Mapping[str, Any]) -> None:
        self.events.append((state, dict(info)))

    @property
    def states(self) -> list[str]:
        return [state.value for state, _ in self.events]


def closed_port_url() -> str:
    fake = FakeGitHub().start()
    url = fake.github_url
    fake.close()
    return url


# -- start ---------------------------------------------------------------------------------------
def test_start_returns_the_code_and_hides_the_device_code(github: FakeGitHub, flow: DeviceFlow) -> None:
    code = flow.start()
    issued = github.authorization()
    assert code.user_code == issued.user_code
    assert code.device_code == issued.device_code
    assert code.verification_uri == f"{github.github_url}/login/device"
    assert code.expires_in == 900
    assert code.interval == 0
    assert abs(code.expires_at - (time.time() + 900)) < 5
    assert code.device_code not in repr(code)
    assert code.user_code in repr(code)
    request = github.requests_to("/login/device/code")[0]
    assert request.header("accept") == "application/json"
    assert request.json == {"client_id": "Iv1.b507a08c87ecfe98", "scope": "read:user"}
    assert issued.client_id == "Iv1.b507a08c87ecfe98"


def test_github_url_comes_from_the_environment(github: FakeGitHub, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DISPATCH_NB_GITHUB_URL", github.github_url + "/")
    flow = DeviceFlow(min_interval=0)
    assert flow.github_url == github.github_url
    assert flow.start().user_code == github.authorization().user_code


@pytest.mark.parametrize(
    "reply",
    [
        Reply.json({"message": "Not Found"}, 404),
        Reply.json({"message": "Requires authentication"}, 401),
        Reply.json({"message": "Forbidden"}, 403),
        Reply.json({"message": "Unprocessable"}, 422),
        Reply.json({"error": "unauthorized_client"}, 400),
        Reply.json({"error": "device_flow_disabled"}, 200),
        Reply.json({"device_code": "x" * 40, "user_code": "ABCD-EFGH", "interval": 5}),
    ],
    ids=["404", "401", "403", "422", "unauthorized_client", "disabled", "no-verification-uri"],
)
def test_start_reports_an_unsupported_device_flow(github: FakeGitHub, flow: DeviceFlow, reply: Reply) -> None:
    github.device_code_reply = reply
    with pytest.raises(DeviceFlowUnsupported) as info:
        flow.start()
    assert isinstance(info.value, AuthenticationError)
    assert info.value.code == "device_flow_unsupported"
    message = str(info.value)
    assert "does not offer the device flow" in message
    assert github.github_url in message
    assert "DISPATCH_NB_GITHUB_TOKEN" in message


def test_start_maps_server_errors_and_unreachable_servers(github: FakeGitHub, flow: DeviceFlow) -> None:
    github.device_code_reply = Reply.json({"message": "boom"}, 502)
    with pytest.raises(ServerError) as info:
        flow.start()
    assert (info.value.status_code, info.value.code) == (502, "server_error")
    with pytest.raises(APIConnectionError, match="could not reach") as info:
        DeviceFlow(github_url=closed_port_url()).start()
    assert info.value.code == "network_error"


def test_start_reads_a_form_encoded_answer(github: FakeGitHub, flow: DeviceFlow) -> None:
    body = b"device_code=abc&user_code=WDJB-MJHT&verification_uri=https%3A%2F%2Fx%2Fdevice"
    body += b"&expires_in=600&interval=7"
    github.device_code_reply = Reply(200, {"content-type": "application/x-www-form-urlencoded"}, body)
    code = flow.start()
    assert (code.user_code, code.verification_uri, code.expires_in, code.interval) == (
        "WDJB-MJHT",
        "https://x/device",
        600,
        7.0,
    )


async def test_astart_is_the_async_twin(github: FakeGitHub, flow: DeviceFlow) -> None:
    code = await flow.astart()
    assert code.user_code == github.authorization().user_code
    github.device_code_reply = Reply.json({"message": "Not Found"}, 404)
    with pytest.raises(DeviceFlowUnsupported) as info:
        await flow.astart()
    assert (info.value.status_code, info.value.code) == (404, "device_flow_unsupported")


# -- poll: success -------------------------------------------------------------------------------
def test_poll_keeps_polling_while_pending_then_returns_the_token(
    github: FakeGitHub, flow: DeviceFlow
) -> None:
    code = flow.start()
    github.respond(code.user_code, "authorization_pending", "authorization_pending", "approve")
    recorder = Recorder()
    token = flow.poll(code, on_state=recorder)
    assert token == github.authorization().access_token
    assert token.startswith("ghu_")
    assert github.authorization().polls == 3
    assert recorder.states == ["pending", "approved"]
    assert flow.state is DeviceFlowState.APPROVED
    assert DeviceFlowState("approved") == "approved"  # a str enum
    request = github.requests_to("/login/oauth/access_token")[0]
    assert request.json == {
        "client_id": "Iv1.b507a08c87ecfe98",
        "device_code": code.device_code,
        "grant_type": "urn:ietf:params:oauth:grant-type:device_code",
    }
    assert request.header("accept") == "application/json"


def test_approval_from_another_thread_ends_a_waiting_poll(github: FakeGitHub) -> None:
    flow = DeviceFlow(github_url=github.github_url, min_interval=0.02)
    code = flow.start()

    def approve_later() -> None:
        github.wait_for_polls(code.user_code, 2)
        github.approve(code.user_code)

    thread = threading.Thread(target=approve_later)
    thread.start()
    token = flow.poll(code)
    thread.join()
    assert token == github.authorization().access_token
    assert github.authorization().polls >= 3


def test_poll_waits_the_interval_between_requests(github: FakeGitHub) -> None:
    flow = DeviceFlow(github_url=github.github_url, min_interval=0.05)
    code = flow.start()
    github.respond(code.user_code, "pending", "pending", "approve")
    flow.poll(code)
    times = github.authorization().poll_times
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert len(gaps) == 2
    assert all(gap >= 0.045 for gap in gaps), gaps


def test_slow_down_uses_the_interval_in_the_body_for_every_later_poll(
    github: FakeGitHub, flow: DeviceFlow
) -> None:
    code = flow.start()
    github.respond(code.user_code, ("slow_down", 0.1), "pending", "approve")
    recorder = Recorder()
    flow.poll(code, on_state=recorder)
    assert recorder.states == ["pending", "slow_down", "pending", "approved"]
    assert recorder.events[1][1]["interval"] == pytest.approx(0.1)
    assert flow.interval == pytest.approx(0.1)
    times = github.authorization().poll_times
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert len(gaps) == 2
    assert all(gap >= 0.095 for gap in gaps), gaps


def test_slow_down_without_an_interval_adds_the_step_each_time(github: FakeGitHub) -> None:
    flow = DeviceFlow(github_url=github.github_url, min_interval=0, slow_down_step=0.05)
    code = flow.start()
    github.respond(code.user_code, "slow_down", "slow_down", "approve")
    recorder = Recorder()
    flow.poll(code, on_state=recorder)
    intervals = [info["interval"] for state, info in recorder.events if state == "slow_down"]
    assert intervals == pytest.approx([0.05, 0.10])
    times = github.authorization().poll_times
    assert times[2] - times[1] >= 0.095


def test_min_interval_is_a_floor_under_githubs_interval(github: FakeGitHub) -> None:
    flow = DeviceFlow(github_url=github.github_url, min_interval=0.05)
    code = flow.start()
    github.respond(code.user_code, ("slow_down", 0.0), "approve")
    flow.poll(code)
    assert flow.interval == pytest.approx(0.05)


def test_transient_server_errors_are_retried(github: FakeGitHub, flow: DeviceFlow) -> None:
    code = flow.start()
    github.respond(code.user_code, Reply.json({"message": "oops"}, 502), "approve")
    assert flow.poll(code) == github.authorization().access_token


def test_too_many_transient_errors_fail(github: FakeGitHub) -> None:
    flow = DeviceFlow(github_url=github.github_url, min_interval=0, max_transient_errors=2)
    code = flow.start()
    github.respond(code.user_code, *[Reply.json({"message": "oops"}, 500)] * 3)
    with pytest.raises(ServerError) as info:
        flow.poll(code)
    assert (info.value.status_code, info.value.code) == (500, "server_error")
    assert flow.state is DeviceFlowState.ERROR


def test_a_broken_on_state_callback_does_not_break_the_login(
    github: FakeGitHub, flow: DeviceFlow, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(state: DeviceFlowState, info: Mapping[str, Any]) -> None:
        raise RuntimeError("widget went away")

    code = flow.start()
    github.approve(code.user_code)
    assert flow.poll(code, on_state=broken) == github.authorization().access_token
    assert "on_state callback failed" in caplog.text


def test_sync_poll_calls_on_state_in_the_calling_thread(github: FakeGitHub, flow: DeviceFlow) -> None:
    """A sync caller's callback runs in its own thread, as before the auth refactor (and as the
    sync entry points hand their events to the calling thread): it may block, or call
    dispatch_nb's sync API, without stalling or tripping over the library's event loop."""
    seen: list[tuple[str, str]] = []
    users: list[str | None] = []

    def on_state(state: DeviceFlowState, info: Mapping[str, Any]) -> None:
        seen.append((state.value, threading.current_thread().name))
        if state is DeviceFlowState.PENDING:
            users.append(fetch_github_user(github.github_token, github.api_url))

    code = flow.start()
    threading.Timer(0.2, lambda: github.approve(code.user_code)).start()
    assert flow.poll(code, on_state=on_state) == github.authorization().access_token
    caller = threading.current_thread().name
    assert seen[0] == ("pending", caller) and seen[-1] == ("approved", caller)
    assert {thread for _, thread in seen} == {caller}
    assert users == [github.login]


# -- poll: failures ------------------------------------------------------------------------------
FAILURES = [
    ("expire", DeviceCodeExpired, "expired", "device_code_expired", "Start the login again"),
    ("token_expired", DeviceCodeExpired, "expired", "device_code_expired", "expired"),
    ("deny", DeviceFlowDenied, "denied", "access_denied", "declined"),
    ("incorrect_device_code", DeviceFlowError, "error", "device_flow_error", "does not recognise"),
    ("incorrect_client_credentials", DeviceFlowError, "error", "device_flow_error", "client id"),
    ("unsupported_grant_type", DeviceFlowError, "error", "device_flow_error", "bug"),
    ("device_flow_disabled", DeviceFlowUnsupported, "error", "device_flow_unsupported", "disabled"),
    ("something_new", DeviceFlowError, "error", "device_flow_error", "something_new"),
]


@pytest.mark.parametrize(("script", "cls", "state", "code", "words"), FAILURES, ids=[f[0] for f in FAILURES])
def test_poll_failures_raise_and_set_the_state(
    github: FakeGitHub,
    flow: DeviceFlow,
    script: str,
    cls: type[Exception],
    state: str,
    code: str,
    words: str,
) -> None:
    device = flow.start()
    github.respond(device.user_code, "pending", script)
    recorder = Recorder()
    with pytest.raises(cls) as info:
        flow.poll(device, on_state=recorder)
    assert type(info.value) is cls
    assert isinstance(info.value, AuthenticationError)
    assert info.value.code == code
    assert words in str(info.value)
    assert flow.state == state
    assert recorder.states[-1] == state
    assert recorder.events[-1][1]["message"] == info.value.message
    assert device.device_code not in str(info.value)


def test_status_changes_on_the_fake_reach_the_client(github: FakeGitHub, flow: DeviceFlow) -> None:
    code = flow.start()
    github.deny(code.user_code)
    with pytest.raises(DeviceFlowDenied) as info:
        flow.poll(code)
    assert info.value.code == "access_denied"
    code = flow.start()
    github.expire(code.user_code)
    with pytest.raises(DeviceCodeExpired) as info:
        flow.poll(code)
    assert info.value.code == "device_code_expired"


def test_a_wrong_device_code_and_a_wrong_client_id_are_real_errors(
    github: FakeGitHub, flow: DeviceFlow
) -> None:
    code = flow.start()
    with pytest.raises(DeviceFlowError, match="does not recognise") as info:
        flow.poll(dataclasses.replace(code, device_code="0" * 40))
    assert (info.value.status_code, info.value.code) == (200, "device_flow_error")
    assert info.value.provider_code == "incorrect_device_code"
    other = DeviceFlow("Iv1.0000000000000000", github_url=github.github_url, min_interval=0)
    with pytest.raises(DeviceFlowError, match=r"Iv1\.0000000000000000") as info:
        other.poll(code)
    assert (info.value.status_code, info.value.code) == (200, "device_flow_error")
    assert info.value.provider_code == "incorrect_client_credentials"


def test_a_locally_expired_code_is_not_even_sent(github: FakeGitHub, flow: DeviceFlow) -> None:
    code = dataclasses.replace(flow.start(), expires_at=time.time() - 1)
    with pytest.raises(DeviceCodeExpired) as info:
        flow.poll(code)
    assert info.value.code == "device_code_expired"
    assert github.authorization().polls == 0
    assert flow.state is DeviceFlowState.EXPIRED


def test_a_code_expiring_during_the_wait_stops_at_expiry(github: FakeGitHub) -> None:
    github.interval = 30
    flow = DeviceFlow(github_url=github.github_url, min_interval=0)
    code = dataclasses.replace(flow.start(), expires_at=time.time() + 0.1)
    started = time.monotonic()
    with pytest.raises(DeviceCodeExpired) as info:
        flow.poll(code)
    assert info.value.code == "device_code_expired"
    assert time.monotonic() - started < 1.0
    assert github.authorization().polls == 0


# -- cancellation --------------------------------------------------------------------------------
#: a cancel wakes a waiting poll at once ("within 100 ms"), not at the next poll 30 s later or
#: when a stalled request ends: this much, with room for a busy 2-core machine (as in
#: tests/core/test_cancel_timeout.py)
CANCEL_BUDGET = 0.5


def test_cancel_stops_a_waiting_poll_at_once(github: FakeGitHub) -> None:
    github.interval = 30
    flow = DeviceFlow(github_url=github.github_url, min_interval=0)
    code = flow.start()
    cancel = CancelToken()
    recorder = Recorder()
    outcome: list[BaseException] = []

    def run() -> None:
        try:
            flow.poll(code, cancel=cancel, on_state=recorder)
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    time.sleep(0.05)
    assert thread.is_alive()
    started = time.monotonic()
    cancel.cancel()
    thread.join(2)
    elapsed = time.monotonic() - started
    assert not thread.is_alive()
    assert elapsed < CANCEL_BUDGET, elapsed  # at once, not at the next poll 30 s later
    assert len(outcome) == 1
    assert isinstance(outcome[0], RequestCancelled) and outcome[0].code == "cancelled"
    assert flow.state is DeviceFlowState.CANCELLED
    assert recorder.states == ["pending", "cancelled"]


def test_an_already_cancelled_token_stops_before_any_request(github: FakeGitHub, flow: DeviceFlow) -> None:
    code = flow.start()
    cancel = CancelToken()
    cancel.cancel("user closed the widget")
    with pytest.raises(RequestCancelled, match="user closed the widget") as info:
        flow.poll(code, cancel=cancel)
    assert info.value.code == "cancelled"
    assert github.authorization().polls == 0


# -- async ---------------------------------------------------------------------------------------
async def test_apoll_returns_the_token_after_pending_and_slow_down(
    github: FakeGitHub, flow: DeviceFlow
) -> None:
    code = await flow.astart()
    github.respond(code.user_code, "pending", ("slow_down", 0.05), "approve")
    recorder = Recorder()
    token = await flow.apoll(code, on_state=recorder)
    assert token == github.authorization().access_token
    assert recorder.states == ["pending", "slow_down", "approved"]
    assert flow.interval == pytest.approx(0.05)


@pytest.mark.parametrize(
    ("script", "cls", "state", "code", "words"), FAILURES[:3], ids=[f[0] for f in FAILURES[:3]]
)
async def test_apoll_failures(
    github: FakeGitHub,
    flow: DeviceFlow,
    script: str,
    cls: type[Exception],
    state: str,
    code: str,
    words: str,
) -> None:
    device = await flow.astart()
    github.respond(device.user_code, script)
    with pytest.raises(cls) as info:
        await flow.apoll(device)
    assert info.value.code == code  # type: ignore[attr-defined]
    assert flow.state == state


async def test_apoll_cancel_stops_the_wait_at_once(github: FakeGitHub) -> None:
    github.interval = 30
    flow = DeviceFlow(github_url=github.github_url, min_interval=0)
    code = await flow.astart()
    cancel = CancelToken()
    task = asyncio.ensure_future(flow.apoll(code, cancel=cancel))
    await asyncio.sleep(0.05)
    assert not task.done()
    started = time.monotonic()
    # cancel from another thread, as a widget button or a signal handler would
    threading.Thread(target=cancel.cancel).start()
    with pytest.raises(RequestCancelled) as info:
        await asyncio.wait_for(task, 2)
    assert info.value.code == "cancelled"
    assert time.monotonic() - started < CANCEL_BUDGET
    assert flow.state is DeviceFlowState.CANCELLED


async def test_apoll_cancel_aborts_a_request_on_the_wire(github: FakeGitHub, flow: DeviceFlow) -> None:
    code = await flow.astart()
    stalled = dataclasses.replace(Reply.json({"error": "authorization_pending"}), stall=5)
    github.respond(code.user_code, stalled)
    cancel = CancelToken()
    task = asyncio.ensure_future(flow.apoll(code, cancel=cancel))
    assert await asyncio.to_thread(github.wait_for_polls, code.user_code, 1)
    started = time.monotonic()
    cancel.cancel()
    with pytest.raises(RequestCancelled) as info:
        await asyncio.wait_for(task, 2)
    assert info.value.code == "cancelled"
    assert time.monotonic() - started < CANCEL_BUDGET


async def test_apoll_locally_expired(github: FakeGitHub, flow: DeviceFlow) -> None:
    code = dataclasses.replace(await flow.astart(), expires_at=time.time() - 1)
    with pytest.raises(DeviceCodeExpired) as info:
        await flow.apoll(code)
    assert info.value.code == "device_code_expired"


async def test_asyncio_cancellation_marks_the_flow_cancelled(github: FakeGitHub) -> None:
    github.interval = 30
    flow = DeviceFlow(github_url=github.github_url, min_interval=0)
    code = await flow.astart()
    task = asyncio.ensure_future(flow.apoll(code))
    await asyncio.sleep(0.02)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert flow.state is DeviceFlowState.CANCELLED


# -- the GitHub user -----------------------------------------------------------------------------
def test_fetch_github_user(github: FakeGitHub) -> None:
    assert fetch_github_user(github.github_token, github.api_url) == "octocat"
    assert fetch_github_user("ghu_unknown", github.api_url) is None
    github.user_reply = Reply(200, {"content-type": "text/html"}, b"<html>")
    assert fetch_github_user(github.github_token, github.api_url) is None
    assert fetch_github_user(github.github_token, closed_port_url()) is None
    assert fetch_github_user(github.github_token, "not a url at all") is None
    request = github.requests_to("/user")[0]
    assert request.header("authorization") == f"token {github.github_token}"


def test_fetch_github_user_uses_the_api_url_from_the_environment(
    github: FakeGitHub, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DISPATCH_NB_GITHUB_API_URL", github.api_url)
    assert fetch_github_user(github.github_token) == "octocat"


async def test_afetch_github_user(github: FakeGitHub) -> None:
    assert await afetch_github_user(github.github_token, github.api_url) == "octocat"
    assert await afetch_github_user("ghu_nope", github.api_url) is None
    assert await afetch_github_user(github.github_token, closed_port_url()) is None


# -- secrets -------------------------------------------------------------------------------------
def test_no_secret_in_reprs_errors_or_logs(
    github: FakeGitHub, flow: DeviceFlow, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    texts: list[str] = []
    code = flow.start()
    token = github.approve(code.user_code)
    github.respond(code.user_code, ("slow_down", 0.0), "pending")
    recorder = Recorder()
    assert flow.poll(code, on_state=recorder) == token
    assert fetch_github_user(token, github.api_url) == "octocat"
    texts += [repr(flow), repr(code), str(code), repr(recorder.events)]
    second = flow.start()
    github.respond(second.user_code, "deny")
    with pytest.raises(DeviceFlowDenied) as info:
        flow.poll(second)
    assert info.value.code == "access_denied"
    texts += [str(info.value), repr(info.value)]
    texts += [record.getMessage() for record in caplog.records]
    texts += [repr(record.args) for record in caplog.records]
    assert caplog.records, "expected debug logging to scan"
    for text in texts:
        for secret in (token, code.device_code, second.device_code):
            assert secret not in text


def test_device_code_is_a_frozen_dataclass() -> None:
    code = DeviceCode("d" * 40, "ABCD-EFGH", "https://github.com/login/device", 900, 5.0, time.time() + 900)
    with pytest.raises(dataclasses.FrozenInstanceError):
        code.user_code = "x"  # type: ignore[misc]
    assert not code.expired
    assert 899 < code.seconds_left() <= 900
    assert "d" * 40 not in repr(code)
