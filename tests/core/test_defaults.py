"""resolve_default_model: which model runs when nobody said, and what the user is told."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dispatch_nb.defaults import resolve_default_model
from dispatch_nb.providers.local import local_model_available

COPILOT_DEFAULT = "copilot:gpt-4.1"
OPENAI_DEFAULT = "openai:gpt-4.1"
ANTHROPIC_DEFAULT = "anthropic:claude-sonnet-4-5"
LOCAL_DEFAULT = "local:smollm2"
TOKEN = "ghu_" + "a1B2c3D4e5" * 4


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh HOME with no Copilot editor login; no GitHub token in the process environment."""
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / ".config"))
    monkeypatch.delenv("DISPATCH_NB_GITHUB_TOKEN", raising=False)
    monkeypatch.delenv("DISPATCH_NB_GITHUB_URL", raising=False)
    return tmp_path


def _env(home: Path, **values: str) -> dict[str, str]:
    return {"DISPATCH_NB_HOME": str(home / "dnb"), **values}


def test_dispatch_nb_model_wins(home: Path) -> None:
    env = _env(home, DISPATCH_NB_MODEL="anthropic:claude-x", OPENAI_API_KEY="sk-x",
               DISPATCH_NB_GITHUB_TOKEN=TOKEN)
    resolved = resolve_default_model(env)
    assert resolved.spec == "anthropic:claude-x"
    assert resolved.reason == "DISPATCH_NB_MODEL is set"
    assert resolved.login_hint == "" and not resolved.needs_login


def test_github_token_in_the_environment_means_copilot(home: Path) -> None:
    resolved = resolve_default_model(_env(home, DISPATCH_NB_GITHUB_TOKEN=TOKEN,
                                          OPENAI_API_KEY="sk-x"))
    assert resolved.spec == COPILOT_DEFAULT
    assert "DISPATCH_NB_GITHUB_TOKEN" in resolved.reason
    assert TOKEN not in repr(resolved)


def test_saved_login_means_copilot(home: Path) -> None:
    store = home / "dnb"
    store.mkdir(mode=0o700)
    path = store / "github_token.json"
    path.write_text(json.dumps({"github_token": TOKEN, "github_url": "https://github.com"}))
    path.chmod(0o600)
    resolved = resolve_default_model(_env(home))
    assert resolved.spec == COPILOT_DEFAULT and resolved.source == "copilot"
    assert str(path) in resolved.reason
    assert TOKEN not in repr(resolved)


def test_copilot_editor_login_means_copilot(home: Path) -> None:
    editor = home / ".config" / "github-copilot"
    editor.mkdir(parents=True)
    (editor / "hosts.json").write_text(json.dumps({"github.com": {"oauth_token": TOKEN}}))
    resolved = resolve_default_model(_env(home))
    assert resolved.spec == COPILOT_DEFAULT
    assert "Copilot editor login" in resolved.reason


@pytest.mark.parametrize(
    ("keys", "spec", "reason"),
    [
        ({"OPENAI_API_KEY": "sk-o"}, OPENAI_DEFAULT, "OPENAI_API_KEY is set"),
        ({"OPENAI_API_KEY": "sk-o", "ANTHROPIC_API_KEY": "sk-a"}, OPENAI_DEFAULT,
         "OPENAI_API_KEY is set"),
        ({"ANTHROPIC_API_KEY": "sk-a"}, ANTHROPIC_DEFAULT, "ANTHROPIC_API_KEY is set"),
        ({"OPENAI_API_KEY": "  ", "ANTHROPIC_API_KEY": "sk-a"}, ANTHROPIC_DEFAULT,
         "ANTHROPIC_API_KEY is set"),
    ],
)
def test_api_keys(home: Path, keys: dict[str, str], spec: str, reason: str) -> None:
    resolved = resolve_default_model(_env(home, **keys))
    assert (resolved.spec, resolved.reason, resolved.login_hint) == (spec, reason, "")


@pytest.mark.skipif(not local_model_available(), reason="the local extra is not installed")
def test_nothing_configured_uses_the_embedded_model_and_says_how_to_sign_in(home: Path) -> None:
    resolved = resolve_default_model(_env(home))
    assert resolved.spec == LOCAL_DEFAULT and resolved.source == "local"
    assert resolved.login_hint == (
        "Using the embedded local model SmolLM2-135M; run %chat login to use GitHub Copilot, "
        "or set OPENAI_API_KEY / ANTHROPIC_API_KEY"
    )
    assert "\n" not in resolved.login_hint
    assert not resolved.needs_login


def test_a_corrupt_saved_login_does_not_break_resolution(home: Path) -> None:
    store = home / "dnb"
    store.mkdir(mode=0o700)
    (store / "github_token.json").write_text("{not json")
    resolved = resolve_default_model(_env(home, ANTHROPIC_API_KEY="sk-a"))
    assert resolved.spec == ANTHROPIC_DEFAULT
    nothing = resolve_default_model(_env(home))
    assert "cannot be read" in nothing.reason


def _run(code: str, home: Path) -> str:
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(home),
           "XDG_CONFIG_HOME": str(home / ".config"), "DISPATCH_NB_HOME": str(home / "dnb")}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, env=env, check=True, cwd=os.getcwd()).stdout


def test_without_the_local_extra_copilot_needs_login(home: Path) -> None:
    out = _run(
        "import sys; sys.modules['llama_cpp'] = None\n"
        "from dispatch_nb.defaults import resolve_default_model\n"
        "r = resolve_default_model()\n"
        "print(r.spec); print(r.reason); print(r.needs_login); print(r.login_hint)\n",
        home,
    )
    spec, reason, needs, hint = out.strip().splitlines()
    assert (spec, reason, needs) == (COPILOT_DEFAULT, "needs login", "True")
    assert "%chat login" in hint and "dispatch-nb[local]" in hint


def test_resolution_is_cheap(home: Path) -> None:
    out = _run(
        "import sys, time\n"
        "from dispatch_nb.defaults import resolve_default_model\n"
        "resolve_default_model()\n"
        "t = time.perf_counter()\n"
        "for _ in range(20): r = resolve_default_model()\n"
        "print((time.perf_counter() - t) / 20)\n"
        "print('llama_cpp' in sys.modules, 'httpx' in sys.modules and 'llm' in sys.modules)\n",
        home,
    )
    per_call, imported = out.strip().splitlines()
    assert float(per_call) < 0.02  # a few file checks, no model load, no network
    assert imported == "False False"
