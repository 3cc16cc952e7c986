"""``python -m dispatch_nb login / logout / status`` against a loopback fake GitHub.

``login`` runs as a real subprocess (the test approves the code it prints, or presses Ctrl-C);
``logout`` and ``status`` also run in-process through ``main(argv)``.
"""

from __future__ import annotations

import json
import os
import re
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dispatch_nb.__main__ import COMMANDS, build_parser, main
from dispatch_nb.auth import TokenStore
from tests.fakes.github import FakeGitHub

REPO = Path(__file__).resolve().parents[1]
ENV_NAMES = (
    "DISPATCH_NB_GITHUB_TOKEN",
    "DISPATCH_NB_GITHUB_URL",
    "DISPATCH_NB_GITHUB_API_URL",
    "DISPATCH_NB_HOME",
    "LOCALAPPDATA",
)


@pytest.fixture
def github() -> Iterator[FakeGitHub]:
    with FakeGitHub() as fake:
        yield fake


@pytest.fixture
def env(github: FakeGitHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """An environment pointing at the fake, with empty homes; also applied to this process."""
    values = {
        "DISPATCH_NB_GITHUB_URL": github.github_url,
        "DISPATCH_NB_GITHUB_API_URL": github.api_url,
        "DISPATCH_NB_HOME": str(tmp_path / "dnb"),
        "HOME": str(tmp_path / "home"),
        "XDG_CONFIG_HOME": str(tmp_path / "xdg"),
    }
    for name in ENV_NAMES:
        monkeypatch.delenv(name, raising=False)
    for name, value in values.items():
        monkeypatch.setenv(name, value)
    child = {k: v for k, v in os.environ.items() if k not in ENV_NAMES}
    child.update(values)
    child["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), child.get("PYTHONPATH")]))
    child["PYTHONUNBUFFERED"] = "1"
    child["NO_PROXY"] = child["no_proxy"] = "127.0.0.1,localhost"
    return child


class Login:
    """``python -m dispatch_nb login ...`` running in a subprocess, its stdout read as it comes."""

    def __init__(self, env: dict[str, str], *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "dispatch_nb", "login", *args],
            cwd=REPO,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: list[str] = []
        self.errors: list[str] = []
        self._cond = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self._err_reader = threading.Thread(target=self._read_errors, daemon=True)
        self._err_reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._cond:
                self.lines.append(line)
                self._cond.notify_all()

    def _read_errors(self) -> None:
        assert self.proc.stderr is not None
        self.errors.extend(self.proc.stderr)

    def wait_for(self, pattern: str, timeout: float = 20) -> re.Match[str]:
        """The first stdout line matching ``pattern`` (waiting for it to be printed)."""
        found: list[re.Match[str]] = []

        def seen() -> bool:
            for line in self.lines:
                match = re.search(pattern, line)
                if match:
                    found.append(match)
                    return True
            return self.proc.poll() is not None and not self._reader.is_alive()

        with self._cond:
            self._cond.wait_for(seen, timeout)
        if not found:
            self.proc.kill()
            raise AssertionError(f"{pattern!r} not printed; stdout so far: {''.join(self.lines)}")
        return found[0]

    def finish(self, timeout: float = 20) -> tuple[int, str, str]:
        try:
            self.proc.wait(timeout=timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
        self._reader.join(5)
        self._err_reader.join(5)
        return self.proc.returncode, "".join(self.lines), "".join(self.errors)


def stored(env: dict[str, str]) -> Path:
    return Path(env["DISPATCH_NB_HOME"]) / "github_token.json"


# -- login (subprocess) ----------------------------------------------------------------------------
def test_login_prints_the_code_waits_for_approval_and_stores_the_token(
    github: FakeGitHub, env: dict[str, str]
) -> None:
    login = Login(env)
    url = login.wait_for(r"^\s+(http\S+)").group(1)
    user_code = login.wait_for(r"enter the code:\s+(\S+)").group(1)
    login.wait_for(r"Waiting for approval.*Ctrl-C to cancel")
    assert url == f"{github.github_url}/login/device"
    token = github.approve(user_code)
    code, out, err = login.finish()
    assert code == 0, (out, err)
    assert "Logged in as octocat." in out
    path = stored(env)
    assert str(path) in out
    if sys.platform != "win32":
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    data = json.loads(path.read_text())
    assert data["github_token"] == token
    assert data["user"] == "octocat"
    assert data["github_url"] == github.github_url
    assert token not in out
    assert token not in err


def test_login_with_a_token_already_available_does_nothing(github: FakeGitHub, env: dict[str, str]) -> None:
    TokenStore(stored(env)).save(github.github_token, github_url=github.github_url)
    code, out, _ = Login(env).finish()
    assert code == 0
    assert "Already logged in" in out
    assert str(stored(env)) in out
    assert "--force" in out
    assert github.requests_to("/login/device/code") == []
    assert github.github_token not in out


def test_login_force_logs_in_again(github: FakeGitHub, env: dict[str, str]) -> None:
    env["DISPATCH_NB_GITHUB_TOKEN"] = github.github_token
    login = Login(env, "--force")
    user_code = login.wait_for(r"enter the code:\s+(\S+)").group(1)
    token = github.approve(user_code, login="hubot")
    code, out, err = login.finish()
    assert code == 0, (out, err)
    assert "Logged in as hubot." in out
    assert "DISPATCH_NB_GITHUB_TOKEN is set" in out
    assert TokenStore(stored(env)).load() == token


@pytest.mark.skipif(sys.platform == "win32", reason="SIGINT to a child process")
def test_ctrl_c_cancels_cleanly_with_exit_code_130(github: FakeGitHub, env: dict[str, str]) -> None:
    login = Login(env)
    login.wait_for(r"Waiting for approval")
    time.sleep(0.05)
    login.proc.send_signal(signal.SIGINT)
    code, out, err = login.finish()
    assert code == 130, (out, err)
    assert "cancelled" in err
    assert "nothing was stored" in err
    assert "Traceback" not in err
    assert not stored(env).exists()


def test_a_declined_login_fails_and_stores_nothing(github: FakeGitHub, env: dict[str, str]) -> None:
    login = Login(env)
    user_code = login.wait_for(r"enter the code:\s+(\S+)").group(1)
    github.deny(user_code)
    code, _, err = login.finish()
    assert code == 1
    assert "declined" in err
    assert not stored(env).exists()


def test_login_reports_a_github_without_device_flow(github: FakeGitHub, env: dict[str, str]) -> None:
    from tests.fakes.server import Reply

    github.device_code_reply = Reply.json({"message": "Not Found"}, 404)
    code, _, err = Login(env).finish()
    assert code == 1
    assert "does not offer the device flow" in err


def test_login_refuses_to_overwrite_a_corrupt_token_file(github: FakeGitHub, env: dict[str, str]) -> None:
    path = stored(env)
    path.parent.mkdir(parents=True)
    path.write_text("{oops")
    code, _, err = Login(env).finish()
    assert code == 1
    assert str(path) in err
    assert "--force" in err
    assert path.read_text() == "{oops"


# -- logout and status (in-process) ----------------------------------------------------------------
def test_logout_removes_our_token_and_leaves_editor_logins(
    github: FakeGitHub, env: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    apps = Path(env["XDG_CONFIG_HOME"]) / "github-copilot" / "apps.json"
    apps.parent.mkdir(parents=True)
    apps.write_text(json.dumps({"127.0.0.1:Iv1.b507a08c87ecfe98": {"oauth_token": "ghu_editor"}}))
    TokenStore().save(github.github_token)
    assert main(["logout"]) == 0
    out = capsys.readouterr().out
    assert f"Removed the GitHub token saved in {stored(env)}" in out
    assert "editor logins" in out
    assert f"Copilot editor login ({apps})" in out  # still used, and we say so
    assert not stored(env).exists()
    assert apps.exists()
    assert main(["logout"]) == 0
    assert "nothing to remove" in capsys.readouterr().out


def test_status_reports_the_source_and_a_working_copilot_token(
    github: FakeGitHub, env: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    github.copilot_token_response(endpoints_api="https://copilot.example.test")
    TokenStore().save(github.github_token, user="octocat", github_url=github.github_url)
    assert main(["status"]) == 0
    out = capsys.readouterr().out
    assert f"from {stored(env)}" in out
    assert "ghu_…" in out
    assert "octocat" in out
    assert "Copilot API:    https://copilot.example.test" in out
    assert "expires" in out
    assert github.github_token not in out
    for issued in github.issued_copilot_tokens:
        assert issued not in out


def test_status_shows_why_copilot_fails(
    github: FakeGitHub,
    env: dict[str, str],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    github.copilot_token_response(notification_id="no_copilot_access")
    monkeypatch.setenv("DISPATCH_NB_GITHUB_TOKEN", github.github_token)
    assert main(["status"]) == _exit_without_copilot()
    out = capsys.readouterr().out
    assert "from DISPATCH_NB_GITHUB_TOKEN" in out
    assert "not available" in out
    assert "https://github.com/features/copilot" in out
    assert github.github_token not in out


def _exit_without_copilot() -> int:
    """status's exit code when Copilot does not work and no key is set: 0 exactly when the
    embedded model would work (it is another provider that works)."""
    from dispatch_nb.providers.local import local_model_available

    return 0 if local_model_available() else 1


def test_status_without_a_token(env: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["status"]) == _exit_without_copilot()
    out = capsys.readouterr().out
    assert "GitHub token:   none" in out and "Copilot:        not logged in" in out
    assert "OPENAI_API_KEY is not set" in out and "ANTHROPIC_API_KEY is not set" in out
    assert "Embedded model:" in out and "Default model:" in out


def test_status_reports_every_provider_and_works_with_a_key_alone(
    env: dict[str, str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 13.11: no Copilot login, but an OpenAI key: status says so and exits 0."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-status-test-secret")
    monkeypatch.setenv("DISPATCH_NB_MODEL", "")
    assert main(["status"]) == 0
    out = capsys.readouterr().out
    lines = {line.split(":", 1)[0]: line for line in out.splitlines()}
    assert "not logged in" in lines["Copilot"]
    assert "OPENAI_API_KEY is set" in lines["OpenAI"]
    assert "ANTHROPIC_API_KEY is not set" in lines["Anthropic"]
    assert "Embedded model" in lines and "Default model" in lines
    assert "openai:gpt-4.1" in lines["Default model"]
    assert "sk-status-test-secret" not in out


def test_status_with_a_damaged_token_file_still_reports_the_rest(
    env: dict[str, str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A token file that is not JSON is said on the token's line; the other providers follow,
    and an OpenAI key still makes the exit status 0 ("exit 0 when any would work")."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-status-test-secret")
    path = stored(env)
    path.parent.mkdir(parents=True)
    path.write_text("{bad")
    assert main(["status"]) == 0
    out = capsys.readouterr().out
    lines = {line.split(":", 1)[0]: line for line in out.splitlines()}
    assert "⚠" in lines["GitHub token"] and str(path) in lines["GitHub token"]
    assert "not available" in lines["Copilot"]
    assert "OPENAI_API_KEY is set" in lines["OpenAI"] and "Default model" in lines
    assert path.read_text() == "{bad"  # status only reads


def test_status_says_a_default_model_that_cannot_work(
    env: dict[str, str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A typo in DISPATCH_NB_MODEL is said by status, with a guess (a warning: a provider the
    user's own code registers is not known to the CLI); connect() names the variable too."""
    from dispatch_nb import connect
    from dispatch_nb.registry import UnknownProviderError

    monkeypatch.setenv("OPENAI_API_KEY", "sk-status-test-secret")
    monkeypatch.setenv("DISPATCH_NB_MODEL", "opneai:gpt-4.1")
    assert main(["status"]) == 0  # the OpenAI key would work
    out = capsys.readouterr().out
    assert "⚠ unknown provider 'opneai' in model spec 'opneai:gpt-4.1' (the value of " \
           "DISPATCH_NB_MODEL) (did you mean openai?)" in out
    with pytest.raises(UnknownProviderError) as info:
        connect()
    assert info.value.code == "unknown_provider" and "DISPATCH_NB_MODEL" in info.value.message


def test_status_piped_into_head_ends_quietly(env: dict[str, str]) -> None:
    """``status | head -1``: the reader goes away; no BrokenPipeError traceback, exit 0."""
    done = subprocess.run(f"{sys.executable} -m dispatch_nb status | head -1", shell=True,
                          env=env, capture_output=True, text=True, timeout=60)
    assert done.stdout.startswith("GitHub:"), done.stdout
    assert "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr, done.stderr
    # a reader gone before anything was written (the output still in the buffer at exit)
    done = subprocess.run(f"{sys.executable} -m dispatch_nb status | true", shell=True,
                          env=env, capture_output=True, text=True, timeout=60)
    assert "BrokenPipe" not in done.stderr, done.stderr


def test_status_puts_a_space_after_every_label_and_no_backticks(
    env: dict[str, str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 23.10: ``OpenAI base URL: http://…``, not ``URL:http://…`` (a label as long as the
    column); and a terminal shows no Markdown backticks."""
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:8080/v1")
    main(["status"])
    out = capsys.readouterr().out
    assert "OpenAI base URL: http://127.0.0.1:8080/v1" in out
    assert "`" not in out, out
    glued = [line for line in out.splitlines() if re.match(r"^[A-Z][\w -]*:(?! )\S", line)]
    assert not glued, glued


def test_status_runs_as_a_subprocess(github: FakeGitHub, env: dict[str, str]) -> None:
    env["DISPATCH_NB_GITHUB_TOKEN"] = github.github_token
    result = subprocess.run(
        [sys.executable, "-m", "dispatch_nb", "status"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "Copilot:        OK" in result.stdout
    assert github.github_token not in result.stdout + result.stderr


# -- the parser ------------------------------------------------------------------------------------
def test_no_command_prints_help_and_returns_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    err = capsys.readouterr().err
    for name in ("login", "logout", "status"):
        assert name in err


def test_every_command_is_registered_in_the_parser() -> None:
    assert {"login", "logout", "status"} <= set(COMMANDS)
    parser = build_parser()
    args = parser.parse_args(
        ["login", "--force", "--github-url", "https://ghe.example.com", "--token-path", "/tmp/x.json"]
    )
    assert (args.force, args.github_url, args.token_path) == (
        True,
        "https://ghe.example.com",
        "/tmp/x.json",
    )
