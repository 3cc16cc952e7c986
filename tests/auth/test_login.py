"""device_login, the one login routine, against a loopback fake GitHub: the callbacks in order,
the saved token and its owner, a denial and a cancel through on_error, a token kept in memory when
it cannot be saved."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from dispatch_nb.auth import (
    DeviceCode,
    DeviceFlow,
    DeviceFlowDenied,
    LoginResult,
    TokenStore,
    device_login,
)
from dispatch_nb.cancel import CancelToken
from dispatch_nb.errors import RequestCancelled
from tests.fakes.github import FakeGitHub


@pytest.fixture
def github() -> Iterator[FakeGitHub]:
    with FakeGitHub(interval=0) as fake:
        yield fake


def flow_for(github: FakeGitHub) -> DeviceFlow:
    return DeviceFlow(github_url=github.github_url, min_interval=0)


def test_a_login_calls_back_in_order_and_saves_the_token(github: FakeGitHub, tmp_path: Path) -> None:
    seen: list[str] = []
    approved: list[str] = []

    def on_code(code: DeviceCode) -> None:
        seen.append(f"code {code.user_code}")
        github.respond(code.user_code, "authorization_pending")
        approved.append(github.approve(code.user_code, login="octocat"))

    def on_state(state: Any, info: Mapping[str, Any]) -> None:
        seen.append(f"state {state.value}")

    def on_done(result: LoginResult) -> None:
        seen.append(f"done {result.user}")

    store = TokenStore(tmp_path / "token.json")
    result = device_login(flow_for(github), store=store, github_api_url=github.api_url,
                          on_code=on_code, on_state=on_state, on_done=on_done,
                          on_error=lambda exc: seen.append("error"))
    assert seen[0].startswith("code ") and seen[-1] == "done octocat"
    assert "state pending" in seen and "state approved" in seen and "error" not in seen
    assert (result.user, result.path, result.save_error) == ("octocat", store.path, None)
    assert result.token == approved[0]
    assert json.loads(store.path.read_text())["github_token"] == approved[0]
    assert approved[0] not in repr(result)


def test_a_denial_goes_to_on_error_and_propagates(github: FakeGitHub, tmp_path: Path) -> None:
    errors: list[BaseException] = []
    store = TokenStore(tmp_path / "token.json")
    with pytest.raises(DeviceFlowDenied) as denied:
        device_login(flow_for(github), store=store, github_api_url=github.api_url,
                     on_code=lambda code: github.deny(code.user_code), on_error=errors.append)
    assert denied.value.code == "access_denied"
    assert [type(e) for e in errors] == [DeviceFlowDenied]
    assert not store.path.exists()


def test_cancel_stops_the_poll(tmp_path: Path) -> None:
    with FakeGitHub(interval=5) as github:
        cancel = CancelToken()
        errors: list[BaseException] = []

        def on_code(code: DeviceCode) -> None:
            threading.Timer(0.2, cancel.cancel).start()

        with pytest.raises(RequestCancelled) as cancelled:
            device_login(DeviceFlow(github_url=github.github_url), store=TokenStore(tmp_path / "t"),
                         github_api_url=github.api_url, on_code=on_code, cancel=cancel,
                         on_error=errors.append)
        assert cancelled.value.code == "cancelled"
        assert [type(e) for e in errors] == [RequestCancelled]


def test_a_token_that_cannot_be_saved_is_kept_only_when_asked(github: FakeGitHub,
                                                               tmp_path: Path) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("not a directory")
    store = TokenStore(blocked / "token.json")  # its directory cannot be made

    def approve(code: DeviceCode) -> None:
        github.approve(code.user_code)

    result = device_login(flow_for(github), store=store, github_api_url=github.api_url,
                          on_code=approve, keep_unsaved=True)
    assert result.path is None and isinstance(result.save_error, OSError) and result.token
    with pytest.raises(OSError):
        device_login(flow_for(github), store=store, github_api_url=github.api_url, on_code=approve)
