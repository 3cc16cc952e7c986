"""``%%chat`` in replay mode needs neither the model nor a login: a recorded notebook replays on a
machine without the ``local`` extra (mybinder.org) and for a student who never signed in."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
from IPython.core.interactiveshell import InteractiveShell

from dispatch_nb.notebook.display import ChatError
from tests.notebook.test_magics import run

QUICKSTART_CACHE = Path(__file__).resolve().parents[2] / "notebooks" / "quickstart.dispatch-cache.jsonl"


def test_local_answers_replay_without_llama_cpp(shell: InteractiveShell, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    # What binder has: dispatch_nb[notebook] but no llama-cpp-python.
    monkeypatch.setitem(sys.modules, "llama_cpp", None)
    cache = tmp_path / "quickstart.dispatch-cache.jsonl"
    shutil.copy(QUICKSTART_CACHE, cache)
    first = json.loads(cache.read_text(encoding="utf-8").splitlines()[0])
    recorded = first["response"]["content"][0]["text"]
    run(shell, f'%config ChatMagics.cache_file = "{cache}"')
    run(shell, '%config ChatMagics.live = "display"')
    result = run(shell, "%%chat -m local:smollm2 --cache replay --max-tokens 80\n"
                        "What is a Python list? Answer in one sentence.")
    assert result.success, result.error_in_exec
    assert recorded in shell.front.markdown[0]  # type: ignore[attr-defined]
    # A prompt that was never recorded is a clear miss, not an ImportError about llama.cpp.
    missed = run(shell, "%%chat -m local:smollm2 --cache replay\nSomething new.").error_in_exec
    assert isinstance(missed, ChatError) and "--cache read-write" in missed.fix
    # Outside replay the model is needed, and the error says how to install it.
    needed = run(shell, "%%chat -m local:smollm2 --cache read-write\nSomething new.").error_in_exec
    assert isinstance(needed, ChatError) and "dispatch-nb[local]" in str(needed)


def test_copilot_replay_shows_no_login(shell: InteractiveShell, fake: Any, tmp_path: Path,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    # No GitHub token anywhere; a login attempt would go to this closed port and fail.
    monkeypatch.setenv("DISPATCH_NB_GITHUB_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("DISPATCH_NB_GITHUB_API_URL", "http://127.0.0.1:9")
    run(shell, '%config ChatMagics.live = "display"')
    error = run(shell, "%%chat -m copilot:gpt-4.1 --cache replay\nhello").error_in_exec
    assert isinstance(error, ChatError)
    assert "no recorded answer" in str(error) and "login" not in error.message.lower()
    assert not any("login/device" in m for m in shell.front.markdown)  # type: ignore[attr-defined]
