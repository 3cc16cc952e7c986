"""``%%chat --each`` after a batch stopped: rows it never sent are "not sent" in the footer and the
output's metadata, not "failed" — after a rejected key and after Ctrl-C."""

from __future__ import annotations

import _thread
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from dispatch_nb.notebook.display import ChatInterrupted
from tests.fakes.batching import BatchFake
from tests.fakes.server import wait_for
from tests.notebook.conftest import run, serve_fake

ROWS = 40
CONCURRENCY = 16  # batch()'s default, which --each uses


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> Iterator[BatchFake]:
    """(conftest's ``fake``: here a :class:`BatchFake` that counts what each row asked)"""
    yield from serve_fake(BatchFake(events=4, delay=1.0), monkeypatch, tmp_path, live="display")


def final_output(shell: Any) -> tuple[str, dict[str, Any]]:
    outputs = [o for o in shell.front.outputs if "text/markdown" in o["data"]]
    assert outputs, shell.front.outputs
    return str(outputs[-1]["data"]["text/markdown"]), outputs[-1].get("metadata") or {}


def test_a_rejected_key_stops_the_rows_and_the_footer_says_not_sent(shell: Any,
                                                                    fake: BatchFake) -> None:
    fake.api_key = "a key the notebook does not have"
    run(shell, f"words = [f'word {{i}}' for i in range({ROWS})]")
    result = run(shell, "%%chat --each words -o res\nSay {row}")
    assert not result.success  # no row answered: the first error is explained after the table
    assert "401" in str(result.error_in_exec) or "key" in str(result.error_in_exec).lower()
    assert sum(fake.asked.values()) == CONCURRENCY  # only the rows already in flight
    markdown, metadata = final_output(shell)
    unsent = ROWS - CONCURRENCY
    assert f"0 ok, {CONCURRENCY} failed, {unsent} not sent" in markdown
    assert "stopped at row" in markdown and f"{ROWS} failed" not in markdown
    assert metadata["dispatch_nb"]["failed"] == CONCURRENCY
    assert metadata["dispatch_nb"]["not_sent"] == unsent
    res = shell.user_ns["res"]
    assert (res.failed, res.not_sent) == (CONCURRENCY, unsent)


def test_a_server_that_cannot_be_reached_stops_the_rows_and_says_what_to_check(
    shell: Any, fake: BatchFake, monkeypatch: pytest.MonkeyPatch
) -> None:
    with socket.socket() as sock:  # a loopback port nothing listens on: connecting is refused
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    monkeypatch.setenv("DISPATCH_NB_FAKE_URL", f"http://127.0.0.1:{port}")
    run(shell, f"words = [f'word {{i}}' for i in range({ROWS})]")
    started = time.monotonic()
    result = run(shell, "%%chat --each words -o res\nSay {row}")
    assert time.monotonic() - started < 5
    said = str(result.error_in_exec)
    assert "the server could not be reached" in said and f"127.0.0.1:{port}" in said, said
    assert "Check that the server is running and that the base URL is right" in said
    markdown, metadata = final_output(shell)
    assert f"0 ok, {CONCURRENCY} failed, {ROWS - CONCURRENCY} not sent" in markdown
    assert "stopped at row" in markdown and "APIConnectionError" in markdown
    assert metadata["dispatch_nb"]["not_sent"] == ROWS - CONCURRENCY


def test_ctrl_c_counts_the_rows_never_sent_apart(shell: Any, fake: BatchFake) -> None:
    # Each row takes ~3 s; Ctrl-C once the first 16 are in flight: those are cancelled, the other
    # 24 were never sent.
    run(shell, f"words = [f'word {{i}}' for i in range({ROWS})]")

    def interrupt_when_the_first_rows_are_in_flight() -> None:
        if wait_for(lambda: sum(fake.asked.values()) == CONCURRENCY, timeout=20):
            time.sleep(0.3)
            _thread.interrupt_main()

    threading.Thread(target=interrupt_when_the_first_rows_are_in_flight, daemon=True).start()
    result = run(shell, "%%chat --each words -o res\nSay {row}")
    assert isinstance(result.error_in_exec, ChatInterrupted)
    markdown, metadata = final_output(shell)
    unsent = ROWS - CONCURRENCY
    assert f"0 ok, {CONCURRENCY} cancelled, {unsent} not sent" in markdown
    assert "interrupted" in markdown and "failed" not in markdown
    assert metadata["dispatch_nb"]["not_sent"] == unsent
    assert (metadata["dispatch_nb"]["cancelled"], metadata["dispatch_nb"]["failed"]) == \
        (CONCURRENCY, 0)
    assert sum(fake.asked.values()) == CONCURRENCY
