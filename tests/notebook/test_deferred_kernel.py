"""A deferred batch outlives its kernel: submitted in one real kernel, collected by the same
``%%chat --each --deferred`` call in a fresh one, without submitting again."""

from __future__ import annotations

import _thread
import os
import threading
from pathlib import Path
from typing import Any

import nbformat
import pytest
from IPython.core.error import UsageError
from nbformat.v4 import new_code_cell, new_notebook

from dispatch_nb.notebook.display import ChatInterrupted
from tests.fakes.batch_api import OpenAIBatches
from tests.fakes.openai_responses import OpenAIResponsesFake
from tests.fakes.server import wait_for
from tests.kernels import notebook_client
from tests.notebook.conftest import chat_env, run

KEY = "sk-test-kernel-deferred"
ROWS = "rows = ['Paris', 'Rome', 'Oslo']"


def run_notebook(cells: list[str], env: dict[str, str]) -> nbformat.NotebookNode:
    nb = new_notebook(cells=[new_code_cell(source) for source in cells])
    notebook_client(nb, timeout=90, allow_errors=False).execute(env=env)
    return nb


def outputs_text(cell: nbformat.NotebookNode) -> str:
    parts = []
    for out in cell.outputs:
        parts.append(out.get("text", ""))
        parts.extend(str(v) for k, v in out.get("data", {}).items() if k.startswith("text/"))
    return "\n".join(parts)


@pytest.mark.kernel
@pytest.mark.timeout(240)
def test_a_job_submitted_in_one_kernel_is_collected_in_the_next(tmp_path: Path) -> None:
    checkpoint = tmp_path / "cities.jsonl"
    with OpenAIResponsesFake(api_key=KEY) as fake:
        batches = OpenAIBatches(fake)
        env = chat_env()
        env.update({
            "OPENAI_API_KEY": KEY, "OPENAI_BASE_URL": fake.base_url,
            "DISPATCH_NB_MODEL": "openai:gpt-4.1-mini",
            "DISPATCH_NB_HOME": str(tmp_path / "dispatch"), "HOME": str(tmp_path),
            "XDG_CONFIG_HOME": str(tmp_path / ".config"),
            "PYTHONPATH": os.environ.get("PYTHONPATH", ""),
            "DISPATCH_NB_POLL_INTERVAL": "0.1",  # the fake's job ends after a poll or two
        })
        first = run_notebook([
            f"from dispatch_nb import batch\n{ROWS}",
            f"r = batch('About {{row}}', rows, model='openai:gpt-4.1-mini', deferred=True, "
            f"wait=False, checkpoint={str(checkpoint)!r}, progress=False)\n"
            "print(r.job.state, r.job.ids, type(r[0]).__name__)",
        ], env)
        printed = outputs_text(first.cells[1])
        job_id = batches.created[0].id
        assert f"validating ['{job_id}'] BatchPendingError" in printed
        assert not fake.chat_requests  # nothing answered yet; the kernel is gone
        # a new kernel (a restart, the next morning): the same rows, the same checkpoint
        second = run_notebook([
            f"%load_ext dispatch_nb\n{ROWS}",
            f"%%chat --each rows --deferred --checkpoint {checkpoint} -o res\nAbout {{row}}",
            "print(res.ok, res.job.state, res.job.ids, [r.text for r in res])",
        ], env)
    assert len(batches.created) == 1 and len(fake.chat_requests) == 3
    table = outputs_text(second.cells[1])
    assert "echo: About Paris" in table and "echo: About Oslo" in table
    printed = outputs_text(second.cells[2])
    assert (f"3 completed ['{job_id}'] ['echo: About Paris', 'echo: About Rome', "
            "'echo: About Oslo']") in printed
    assert KEY not in table + printed


def test_deferred_on_a_provider_without_a_batch_api_says_so(shell: Any, fake: Any) -> None:
    shell.user_ns["words"] = ["a", "b"]
    with pytest.raises(UsageError, match="--deferred applies to --each cells"):
        shell.run_cell_magic("chat", "--deferred", "Say hi")
    with pytest.raises(UsageError, match="--checkpoint applies to --each cells"):
        shell.run_cell_magic("chat", "--checkpoint run.jsonl", "Say hi")
    with pytest.raises(UsageError, match=r"--deferred: fake:echo has no batch API .*; run the "
                       "cell without --deferred"):
        shell.run_cell_magic("chat", "--each words --deferred", "Say {row}")
    assert fake.chat_requests == []


def test_interrupting_the_wait_leaves_the_job_running_and_the_cell_collects_it_later(
    shell: Any, fake: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stop button while a --deferred cell waits stops the waiting, not the job: the table
    says which rows are not answered yet, the message says how to collect them, and running the
    cell again collects the same job (nothing is submitted again)."""
    checkpoint = tmp_path / "reviews.jsonl"
    cell = f"%%chat --each words --deferred --checkpoint {checkpoint} -o res\nAbout {{row}}"
    with OpenAIResponsesFake(api_key=KEY) as server:
        batches = OpenAIBatches(server)
        batches.stall = True
        monkeypatch.setenv("OPENAI_API_KEY", KEY)
        monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
        monkeypatch.setenv("DISPATCH_NB_MODEL", "openai:gpt-4.1-mini")
        monkeypatch.setenv("DISPATCH_NB_POLL_INTERVAL", "0.05")
        run(shell, "words = ['Paris', 'Rome', 'Oslo']")

        def interrupt_once_polled() -> None:
            if wait_for(lambda: batches.polls >= 2, timeout=30):
                _thread.interrupt_main()

        threading.Thread(target=interrupt_once_polled, daemon=True).start()
        result = run(shell, cell)
        assert isinstance(result.error_in_exec, ChatInterrupted)
        job_id = batches.created[0].id
        said = str(result.error_in_exec)
        assert f"the openai job {job_id} keeps running at the provider" in said
        assert "run this cell again to collect it" in said and "res.cancel()" in said
        assert batches.cancels == 0
        plain = shell.front.outputs[-1]["data"]["text/plain"]
        assert "| 0 | Paris | not answered yet |" in plain
        assert "3 not answered yet" in plain and "interrupted" in plain
        batches.stall = False
        again = run(shell, cell)
        assert again.success, again.error_in_exec
    assert len(batches.created) == 1 and batches.cancels == 0
    assert [r.text for r in shell.user_ns["res"]] == [
        "echo: About Paris", "echo: About Rome", "echo: About Oslo"]


def test_after_ctrl_c_the_cell_names_only_the_jobs_still_running(
    shell: Any, fake: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two jobs: the first answered the rows the cell ran before, a second one holds a row added
    since and is still running when the cell is interrupted. The message names that one only,
    as BatchInterrupted from batch() does."""
    checkpoint = tmp_path / "cities.jsonl"
    cell = f"%%chat --each words --deferred --checkpoint {checkpoint} -o res\nAbout {{row}}"
    with OpenAIResponsesFake(api_key=KEY) as server:
        batches = OpenAIBatches(server)
        monkeypatch.setenv("OPENAI_API_KEY", KEY)
        monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
        monkeypatch.setenv("DISPATCH_NB_MODEL", "openai:gpt-4.1-mini")
        monkeypatch.setenv("DISPATCH_NB_POLL_INTERVAL", "0.05")
        run(shell, "words = ['Paris', 'Rome']")
        assert run(shell, cell).success
        run(shell, "words = ['Paris', 'Rome', 'Oslo']")
        batches.stall = True

        def interrupt_once_polled() -> None:
            if wait_for(lambda: len(batches.created) == 2 and batches.polls >= 6, timeout=30):
                _thread.interrupt_main()

        threading.Thread(target=interrupt_once_polled, daemon=True).start()
        result = run(shell, cell)
        assert isinstance(result.error_in_exec, ChatInterrupted)
        done, running = (job.id for job in batches.created)
        assert [job.state for job in batches.created] == ["completed", "in_progress"]
        assert shell.user_ns["res"].job.ids == [done, running]
        said = str(result.error_in_exec)
        assert f"the openai job {running} keeps running at the provider" in said, said
        assert "(1 row not answered yet)" in said, said  # Oslo's
        assert done not in said and "2 openai jobs" not in said
        assert "run this cell again to collect it (or res.wait())" in said
        assert "res.cancel() cancels it" in said and batches.cancels == 0


def test_deferred_on_a_model_without_a_batch_api_refuses_before_a_login_or_a_bar(
    shell: Any, fake: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Copilot, an OpenAI-compatible server and the embedded model have no batch API: the cell
    says so at once — no GitHub login is asked for first, and no progress line is left behind."""
    monkeypatch.setenv("DISPATCH_NB_GITHUB_URL", "http://127.0.0.1:9")  # never the internet
    monkeypatch.setenv("DISPATCH_NB_GITHUB_API_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("DISPATCH_NB_COMPATIBLE_BASE_URL", "http://127.0.0.1:9/v1")
    run(shell, "words = ['a', 'b']")
    for spec in ("copilot:gpt-4.1", "compatible:llama3", "fake:echo"):
        result = run(shell, f"%%chat --each words --deferred -m {spec}\nSay {{row}}")
        assert isinstance(result.error_in_exec, UsageError), (spec, result.error_in_exec)
        assert f"--deferred: {spec} has no batch API" in str(result.error_in_exec)
        assert shell.front.outputs == [], (spec, shell.front.outputs)  # no login, no bar
    assert fake.chat_requests == []
