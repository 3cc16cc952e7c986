"""``%chat login`` / ``logout`` and the device-login views, against the loopback fake GitHub."""

from __future__ import annotations

import _thread
import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from dispatch_nb.notebook.display import ChatError, ChatInterrupted
from tests.fakes.github import FakeGitHub
from tests.notebook.conftest import run

WIDGET_MIME = "application/vnd.jupyter.widget-view+json"


@pytest.fixture
def github(fake: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeGitHub]:
    with FakeGitHub() as server:
        monkeypatch.setenv("DISPATCH_NB_GITHUB_URL", server.github_url)
        monkeypatch.setenv("DISPATCH_NB_GITHUB_API_URL", server.api_url)
        yield server


def in_background(action: Callable[[], None]) -> threading.Thread:
    thread = threading.Thread(target=action, daemon=True)
    thread.start()
    return thread


def token_file() -> Path:
    from dispatch_nb.auth.token_store import TokenStore

    return TokenStore().path


def all_output(shell: Any, capsys: Any) -> str:
    return json.dumps(shell.front.messages, default=str) + capsys.readouterr().out


@pytest.mark.parametrize("live", ["widget", "display", "text"])
def test_login_approved_saves_the_token_and_never_shows_it(
    shell: Any, github: FakeGitHub, live: str, capsys: Any
) -> None:
    run(shell, f'%config ChatMagics.live = "{live}"')
    run(shell, "%config ChatMagics.login_min_interval = 0.05")
    tokens: list[str] = []

    def approve() -> None:
        auth = github.wait_for_device_code()
        github.wait_for_polls(auth.user_code, 2)
        tokens.append(github.approve(auth.user_code))

    worker = in_background(approve)
    result = run(shell, "%chat login")
    worker.join(5)
    assert result.success, result.error_in_exec
    saved = json.loads(token_file().read_text())
    assert saved["github_token"] == tokens[0] and saved["user"] == "octocat"
    auth = github.authorizations[-1]
    everything = all_output(shell, capsys)
    if live != "widget":  # (the widget shows it through widget state: see the next test)
        assert auth.user_code in everything and "/login/device" in everything
    assert tokens[0] not in everything and auth.device_code not in everything
    if live != "text":
        final = shell.front.outputs[-1]["data"]
        assert "Logged in to GitHub Copilot as **@octocat**" in final["text/markdown"]
        assert WIDGET_MIME not in final
    else:
        printed = everything
        assert printed.count("Logged in to GitHub Copilot as @octocat") == 1
        assert "Approved" not in printed  # said once, with who logged in (issue 13.10)
        assert printed.count("Sign in to GitHub Copilot") == 1
    run(shell, "%chat status")
    assert "logged in as @octocat" in shell.front.markdown[-1]
    run(shell, "%chat logout")
    assert not token_file().exists()
    assert "Removed the saved GitHub token" in shell.front.markdown[-1]


def test_widget_view_shows_code_copy_link_countdown_and_status(shell: Any, github: FakeGitHub) -> None:
    run(shell, '%config ChatMagics.live = "widget"')
    run(shell, "%config ChatMagics.login_min_interval = 0.05")
    seen: dict[str, str] = {}

    def watch_then_approve() -> None:
        auth = github.wait_for_device_code()
        github.respond(auth.user_code, ("slow_down", 0.1))
        github.wait_for_polls(auth.user_code, 3)
        view = shell._dispatch_nb_magics.state.login_view
        seen["code"] = view.code_html.value
        seen["link"] = view.link.value
        seen["clock"] = view.clock.value
        seen["status"] = view.status.value
        github.approve(auth.user_code)

    worker = in_background(watch_then_approve)
    assert run(shell, "%chat login").success
    worker.join(5)
    user_code = github.authorizations[-1].user_code
    assert f">{user_code}</span>" in seen["code"] and "font-size:2.2em" in seen["code"]
    assert "navigator.clipboard.writeText" in seen["code"]
    assert f"href='{github.github_url}/login/device'" in seen["link"]
    assert "The code expires in 14:" in seen["clock"] or "The code expires in 15:" in seen["clock"]
    assert "Waiting" in seen["status"]
    view = shell._dispatch_nb_magics.state.login_view
    assert view.box.comm is None  # closed: no widget state left


def test_login_denied_is_a_short_error(shell: Any, github: FakeGitHub) -> None:
    run(shell, '%config ChatMagics.live = "display"')
    run(shell, "%config ChatMagics.login_min_interval = 0.05")
    worker = in_background(lambda: github.deny(github.wait_for_device_code().user_code))
    result = run(shell, "%chat login")
    worker.join(5)
    assert isinstance(result.error_in_exec, ChatError)
    assert result.error_in_exec.title == "Login denied"
    assert "denied" in shell.front.markdown[-1] and "%chat login" in shell.front.markdown[-1]
    assert not token_file().exists()


@pytest.mark.parametrize("end", ["denied", "expired", "cancelled"])
def test_widget_login_that_fails_leaves_one_static_line_and_no_widget(
    shell: Any, github: FakeGitHub, end: str
) -> None:
    run(shell, '%config ChatMagics.live = "widget"')
    run(shell, "%config ChatMagics.login_min_interval = 0.05")

    def finish() -> None:
        user_code = github.wait_for_device_code().user_code
        if end == "denied":
            github.deny(user_code)
        elif end == "expired":
            github.expire(user_code)
        else:
            github.wait_for_polls(user_code, 2)
            _thread.interrupt_main()

    worker = in_background(finish)
    result = run(shell, "%chat login")
    worker.join(5)
    expected = ChatInterrupted if end == "cancelled" else ChatError
    assert isinstance(result.error_in_exec, expected)
    if end != "cancelled":
        assert result.error_in_exec.fix == "Run `%chat login` again."
    assert len(shell.front.outputs) == 1
    final = shell.front.outputs[0]["data"]
    assert WIDGET_MIME not in final and set(final) == {"text/markdown", "text/plain"}
    said = "interrupted" if end == "cancelled" else end  # one wording for Ctrl-C everywhere
    assert said in final["text/markdown"] and "Sign in to GitHub Copilot" in final["text/markdown"]
    assert ("%chat login" in final["text/markdown"]) is (end != "cancelled")
    view = shell._dispatch_nb_magics.state.login_view
    assert view.state == end and view.box.comm is None  # its widgets are closed
    assert not token_file().exists()
    # A fresh `%chat login` still works afterwards.
    first = len(github.authorizations)

    def approve_the_new_code() -> None:
        deadline = time.monotonic() + 5
        while len(github.authorizations) == first and time.monotonic() < deadline:
            time.sleep(0.02)
        github.approve(github.authorizations[-1].user_code)

    worker = in_background(approve_the_new_code)
    assert run(shell, "%chat login").success
    worker.join(5)
    assert token_file().exists()
    assert WIDGET_MIME not in shell.front.outputs[-1]["data"]


def test_widget_login_github_unreachable_leaves_no_widget(
    shell: Any, fake: Any, monkeypatch: Any
) -> None:
    monkeypatch.setenv("DISPATCH_NB_GITHUB_URL", "http://127.0.0.1:9")
    run(shell, '%config ChatMagics.live = "widget"')
    result = run(shell, "%chat login")
    assert isinstance(result.error_in_exec, ChatError)
    final = shell.front.outputs[-1]["data"]
    assert WIDGET_MIME not in final and "⚠" in final["text/markdown"]


def test_interrupt_cancels_the_login_cleanly(shell: Any, github: FakeGitHub) -> None:
    run(shell, '%config ChatMagics.live = "display"')
    run(shell, "%config ChatMagics.login_min_interval = 0.05")

    def interrupt() -> None:
        github.wait_for_polls(github.wait_for_device_code().user_code, 2)
        _thread.interrupt_main()

    worker = in_background(interrupt)
    started = time.monotonic()
    result = run(shell, "%chat login")
    worker.join(5)
    assert isinstance(result.error_in_exec, ChatInterrupted)
    assert time.monotonic() - started < 3
    assert "Login interrupted" in shell.front.markdown[-1]
    assert not token_file().exists()


def test_github_unreachable_is_a_short_error(shell: Any, fake: Any, monkeypatch: Any) -> None:
    monkeypatch.setenv("DISPATCH_NB_GITHUB_URL", "http://127.0.0.1:9")
    run(shell, '%config ChatMagics.live = "text"')
    result = run(shell, "%chat login")
    assert isinstance(result.error_in_exec, ChatError)
    assert result.error_in_exec.title == "Login failed"
    assert shell._dispatch_nb_magics.state.login_view.state == "error"  # not left "starting"


def test_a_copilot_cell_without_login_shows_the_login_then_continues(
    shell: Any, fake: Any, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    from tests.fakes.copilot import CopilotFake

    with CopilotFake() as copilot:
        github = copilot.github
        monkeypatch.setenv("DISPATCH_NB_GITHUB_URL", github.github_url)
        monkeypatch.setenv("DISPATCH_NB_GITHUB_API_URL", github.api_url)
        run(shell, '%config ChatMagics.live = "display"')
        run(shell, "%config ChatMagics.login_min_interval = 0.05")
        tokens: list[str] = []

        def approve() -> None:
            auth = github.wait_for_device_code()
            github.wait_for_polls(auth.user_code, 1)
            tokens.append(github.approve(auth.user_code))

        worker = in_background(approve)
        result = run(shell, "%%chat -m copilot:gpt-4.1\nHello Copilot")
        worker.join(5)
        assert result.success, result.error_in_exec
        assert token_file().exists()
        assert copilot.last_user_text(copilot.last_request) == "Hello Copilot"
        assert "echo: Hello Copilot" in shell.front.markdown[-1]  # the cell went on by itself
        everything = all_output(shell, capsys)
        assert tokens[0] not in everything
        assert not any(t in everything for t in github.issued_copilot_tokens)
        # The next Copilot cell needs no login.
        before = len(github.authorizations)
        assert run(shell, "%%chat -m copilot:gpt-4.1\nAgain").success
        assert len(github.authorizations) == before
