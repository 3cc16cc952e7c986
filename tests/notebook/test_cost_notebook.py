"""What answers cost, in the notebook (docs/cost.md): the footer's price, ``%%chat --estimate``,
``%chat cost``, ``--budget`` and the large ``--each`` that asks first (``--limit``, ``--yes``) —
in a real kernel (nbclient) against the loopback Responses fake, with a real model name."""

from __future__ import annotations

import io
import json
import os
import re
import sys
from decimal import Decimal
from pathlib import Path
from typing import Any

import genai_prices
import nbformat
import pytest
from IPython.core.error import UsageError
from nbformat.v4 import new_code_cell, new_notebook

from dispatch_nb.cache import CachedAdapter, ResponseCache
from dispatch_nb.cost import format_usd, ledger
from dispatch_nb.providers.copilot import CopilotAdapter
from dispatch_nb.providers.openai import OpenAIAdapter
from tests.fakes.copilot import CopilotFake
from tests.fakes.openai_chat import OpenAIChatFake
from tests.fakes.openai_responses import OpenAIResponsesFake
from tests.kernels import notebook_client
from tests.notebook.conftest import chat_env, run

WIDGET_MIME = "application/vnd.jupyter.widget-view+json"


def _price(input_tokens: int, output_tokens: int) -> Decimal:
    price: Decimal = genai_prices.calc_price(
        genai_prices.Usage(input_tokens=input_tokens, output_tokens=output_tokens), "gpt-4.1",
        provider_id="openai").total_price
    return price


def md(text: str) -> str:
    """``text`` as the library writes it in Markdown: ``$`` escaped, so it is not LaTeX math."""
    return text.replace("$", "\\$")


def _shown(cell: Any) -> str:
    texts = []
    for output in cell.outputs:
        data = output.get("data", {})
        texts.append(str(data.get("text/markdown", data.get("text/plain", ""))))
        texts.append(str(output.get("text", "")))
    return "\n".join(texts)


def kernel_env(fake: OpenAIResponsesFake, tmp_path: Path) -> dict[str, str]:
    env = chat_env()
    env.update({
        "OPENAI_BASE_URL": fake.base_url,
        "OPENAI_API_KEY": "sk-test",
        "DISPATCH_NB_MODEL": "openai:gpt-4.1",
        "DISPATCH_NB_HOME": str(tmp_path / "dispatch"),
        "DISPATCH_NB_CACHE_FILE": str(tmp_path / "cache.jsonl"),
        "HOME": str(tmp_path),
        "XDG_CONFIG_HOME": str(tmp_path / ".config"),
        "PYTHONPATH": os.environ.get("PYTHONPATH", ""),
    })
    env.pop("OPENAI_BACKEND", None)
    return env


@pytest.mark.kernel
@pytest.mark.timeout(240)
def test_cost_in_a_real_kernel(tmp_path: Path) -> None:
    cells = [
        "%load_ext dispatch_nb\n"
        "big = [f'row {i:04d}' for i in range(1500)]\nsmall = ['a', 'b', 'c']\n"
        "%config ChatMagics.live = 'widget'",  # 0
        "%%chat\nHello there",                                                     # 1
        "%%chat --estimate --max-tokens 100\nHello there",                        # 2
        "%%chat --each big -o never\nSay {row}",                                   # 3
        "%%chat --each big --limit 4 -o limited\nSay {row}",                       # 4
        "%config ChatMagics.confirm_rows = 2\n%config ChatMagics.live = 'auto'",  # 5
        "%%chat --each small -o asked\nSay {row}",                                 # 6
        "%%chat --each small --yes --budget 0.50 -o yes\nSay {row}",               # 7
        "%%chat --each big --estimate --max-tokens 10\nSay {row}",                 # 8
        "print('never' in dir(), 'asked' in dir(), limited.sent, yes.sent, "
        "yes.budget.usd)",                                                         # 9
        "%chat cost",                                                              # 10
        "%%chat --each small --estimate --max-tokens 10\nSay {row}",               # 11
        "%%chat --each small --deferred --estimate --max-tokens 10\nSay {row}",    # 12
    ]
    nb = new_notebook(cells=[new_code_cell(source) for source in cells])
    with OpenAIResponsesFake(api_key="sk-test") as fake:
        client = notebook_client(nb, timeout=120, allow_errors=False)
        client.execute(env=kernel_env(fake, tmp_path))
        sent = [fake.last_user_text(r) for r in fake.chat_requests]
    path = tmp_path / "saved.ipynb"
    nbformat.write(nb, path)
    nb = nbformat.read(path, as_version=4)

    # nothing was sent by --estimate or by the runs that asked first
    assert sent == ["Hello there", *[f"Say row {i:04d}" for i in range(4)], "Say a", "Say b",
                    "Say c"] or sorted(sent) == sorted(
        ["Hello there", *[f"Say row {i:04d}" for i in range(4)], "Say a", "Say b", "Say c"])
    # the footer shows the answer's price (the fake's echo usage: 12 in / 7 out)
    one = _price(12, 7)
    assert f"· {md(format_usd(one))} ·" in _shown(nb.cells[1])  # a dollar, not LaTeX math
    estimate = _shown(nb.cells[2])
    assert "nothing was sent" in estimate and "openai:gpt-4.1" in estimate
    assert "approximat" in estimate
    asked = _shown(nb.cells[3])
    assert "1,500 rows" in asked and "ChatMagics.confirm_rows = 1,000" in asked
    # no button, even with the widget view asked for: nbclient could never click it (a cell
    # waiting for it would never end); the button: test_the_send_button_runs_the_rows_in_the_cell
    assert not any(WIDGET_MIME in o.get("data", {}) for o in nb.cells[3].outputs)
    assert "Nothing was sent" in asked and "--yes" in asked
    assert "4 rows: 4 ok" in _shown(nb.cells[4])
    assert "3 rows" in _shown(nb.cells[6]) and "confirm_rows = 2" in _shown(nb.cells[6])
    # a run nobody watches (nbclient) gets no button it cannot click: it says how to send them
    assert not any(WIDGET_MIME in o.get("data", {}) for o in nb.cells[6].outputs)
    assert "Nothing was sent" in _shown(nb.cells[6]) and "--yes" in _shown(nb.cells[6])
    assert "\\$" in _shown(nb.cells[6]) and "tex2jax_ignore" in _shown(nb.cells[6])
    assert not re.search(r"(?<!\\)\$", _shown(nb.cells[6]))  # every dollar escaped: no LaTeX
    assert "of a \\$0.50 budget" in _shown(nb.cells[7])
    big_estimate = _shown(nb.cells[8])
    assert "1,500 rows" in big_estimate and "15,000 output tokens" in big_estimate
    printed = _shown(nb.cells[9]).strip()
    assert printed == "False False 4 3 0.5"
    table = _shown(nb.cells[10])
    assert "openai:gpt-4.1" in table
    row = next(line for line in table.splitlines() if "openai:gpt-4.1" in line)
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1] == "8"  # calls
    assert md(format_usd(one * 8)) in row
    # --deferred --estimate: at the batch price, half the live one
    live, deferred = (nb.cells[i].outputs[0].metadata["dispatch_nb"]["estimate"] for i in (11, 12))
    assert Decimal(deferred["high_usd"]) * 2 == Decimal(live["high_usd"]) > 0
    assert "batch price" in deferred["source"] and "batch price" not in live["source"]


def test_a_terminal_asks_y_or_n_before_a_large_each(shell: Any, fake: Any,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Terminal IPython (no kernel): a y/N question; "n" sends nothing, "y" sends the rows."""
    run(shell, "%config ChatMagics.confirm_rows = 2\nrows = ['a', 'b', 'c']")
    monkeypatch.setattr(sys, "stdin", io.StringIO("n\n"))
    assert run(shell, "%%chat --each rows -o no\nSay {row}").success
    assert fake.chat_requests == [] and "no" not in shell.user_ns
    assert "Nothing was sent" in shell.front.outputs[-1]["data"]["text/plain"]
    assert "rows (more than" not in shell.front.outputs[-1]["data"]["text/plain"]  # asked once
    monkeypatch.setattr(sys, "stdin", io.StringIO("y\n"))
    assert run(shell, "%%chat --each rows -o yes\nSay {row}").success
    assert sorted(fake.last_user_text(r) for r in fake.chat_requests) == ["Say a", "Say b",
                                                                          "Say c"]
    assert shell.user_ns["yes"].ok == 3
    with pytest.raises(UsageError, match="--limit takes a positive number"):
        shell.run_cell_magic("chat", "--each rows --limit 0", "Say {row}")


def test_chat_cost_shows_premium_requests_and_what_replays_saved(
        shell: Any, tmp_path: Path) -> None:
    """``%chat cost`` counts every answer of this process: a Copilot call (its premium request
    at GitHub's overage price, labelled) and an OpenAI answer recorded, then replayed."""
    ledger.clear()
    with CopilotFake() as copilot:
        github = copilot.github
        adapter = CopilotAdapter("claude-sonnet-4", github_token=github.github_token,
                                 github_url=github.github_url, github_api_url=github.api_url)
        adapter.chat("hi")
        adapter.close()
    with OpenAIResponsesFake(api_key="sk-test") as openai:
        cached = CachedAdapter(OpenAIAdapter("gpt-4.1", backend="official",
                                             base_url=openai.base_url, api_key="sk-test"),
                               ResponseCache(tmp_path / "c.jsonl", mode="read-write"))
        first = cached.chat("hello")
        cached.chat("hello")
        cached.close()
    with OpenAIChatFake.llama() as llama:  # a server with no price: its replay saves nothing known
        unpriced = CachedAdapter(OpenAIAdapter("smollm2", backend="compatible", base_url=llama.base_url),
                                 ResponseCache(tmp_path / "u.jsonl", mode="read-write"))
        unpriced.chat("hello")
        unpriced.chat("hello")
        unpriced.close()
    assert first.cost is not None and first.cost.usd is not None
    assert run(shell, "%chat cost").success
    shown = shell.front.outputs[-1]["data"]["text/markdown"]
    header = [c.strip() for c in next(line for line in shown.splitlines() if line.startswith("| model"))
              .strip("|").split("|")]

    def row(model: str) -> dict[str, str]:
        line = next(line for line in shown.splitlines() if model in line)
        return dict(zip(header, (c.strip() for c in line.strip("|").split("|")), strict=True))

    assert row("copilot:claude-sonnet-4")["premium requests"] == "1"
    assert "1 premium request — \\$0.04 at GitHub's published overage price" in shown
    assert not re.search(r"(?<!\\)\$", shown)  # every dollar escaped: no LaTeX math
    openai = row("openai:gpt-4.1")
    assert openai["calls"] == "1" and openai["USD"] == md(format_usd(first.cost.usd))
    assert openai["replayed (saved)"] == f"1 ({md(format_usd(first.cost.usd))})"
    assert "Replayed from the response cache: 2 answers, " in shown
    llama = row("compatible:smollm2")  # sent once, replayed once
    assert llama["calls"] == "1" and llama["USD"] == "unknown" and llama["replayed (saved)"] == "1"
    assert "(and 1 answer whose price is unknown)." in shown


def test_chat_cost_says_unknown_when_no_answer_had_a_price(shell: Any) -> None:
    ledger.clear()
    with OpenAIChatFake.llama() as llama:
        adapter = OpenAIAdapter("smollm2", backend="compatible", base_url=llama.base_url)
        adapter.chat("one")
        adapter.chat("two")
        adapter.close()
    assert run(shell, "%chat cost").success
    shown = shell.front.outputs[-1]["data"]["text/markdown"]
    assert "Spent in this kernel: **unknown** (2 answers whose price is unknown)." in shown
    assert "$0" not in shown
    header = shown.splitlines()[0]  # no column that is empty in every row
    assert "model" in header and "premium requests" not in header and "replayed" not in header
    assert "cached" not in header  # (it was shown, all 0: docs/notebook.md says it is left out)


def test_each_only_options_are_refused_elsewhere(shell: Any, fake: Any) -> None:
    with pytest.raises(UsageError, match="--budget applies to --each cells"):
        shell.run_cell_magic("chat", "--budget 0.5", "Hello")
    with pytest.raises(UsageError, match="--limit, --yes apply to --each cells"):
        shell.run_cell_magic("chat", "--limit 3 --yes", "Hello")
    assert fake.chat_requests == []


def test_each_budget_errors_speak_the_magic(shell: Any, fake: Any,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """--budget in an --each cell: an unknown price, and rows refused by the budget, say
    --budget and --max-tokens (not budget= and max_tokens=, the Python API's words)."""
    run(shell, "rows = ['a', 'b', 'c']")
    with pytest.raises(UsageError) as info:  # fake:echo has no price
        shell.run_cell_magic("chat", "--each rows --budget 0.01", "Say {row}")
    message = str(info.value)
    assert "--budget needs a known price" in message and "drop --budget" in message
    assert "budget=" not in message
    assert fake.chat_requests == []
    with OpenAIResponsesFake(api_key="sk-test") as openai:
        monkeypatch.setenv("OPENAI_BASE_URL", openai.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
        run(shell, "%%chat --each rows -m openai:gpt-4.1 --budget 0.001 -o refused\nSay {row}")
        assert openai.chat_requests == []
    table = shell.front.outputs[-1]["data"]["text/markdown"]
    assert "BudgetExceededError" in table
    assert "a larger --budget, or a smaller --max-tokens" in table and "budget=" not in table
    # said once, in full, under the table; each refused row reads "not sent (over budget)" (the
    # message was repeated in every row, cut off at 200 characters)
    assert table.count("BudgetExceededError") == 1 and table.count("larger --budget") == 1
    assert sum("| not sent (over budget) |" in line for line in table.splitlines()) == 3, table


def _saved_outputs(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The outputs a front end keeps (and saves) from one execution's IOPub messages: displays
    replaced by their updates, cleared by clear_output."""
    outputs: list[dict[str, Any]] = []
    for msg in messages:
        kind, content = msg["msg_type"], msg["content"]
        display_id = content.get("transient", {}).get("display_id")
        if kind == "clear_output":
            outputs.clear()
        elif kind == "update_display_data":
            outputs = [{**o, "data": content["data"]} if o.get("display_id") == display_id else o
                       for o in outputs]
        elif kind in ("display_data", "execute_result", "stream", "error"):
            outputs.append({**content, "display_id": display_id})
    return outputs


@pytest.mark.kernel
@pytest.mark.timeout(240)
def test_the_send_button_runs_the_rows_in_the_cell(tmp_path: Path) -> None:
    """A large --each in a front end a person works in (stdin allowed) waits for its **Send N
    rows** button, clicked through its comm as JupyterLab sends it; the rows then run in the cell,
    so the table is the cell's own output and the question is left as text — a saved notebook
    reads well without widgets (the rows once ran in the click's handler, into an Output widget:
    the notebook saved only ``VBox(...)``). Cancel sends nothing and leaves no widget either."""
    from tests.fakes.canonical import CanonicalFake
    from tests.kernels import IPCKernelManager

    with CanonicalFake() as fake:
        env = chat_env()
        env.update({"DISPATCH_NB_FAKE_URL": fake.url, "DISPATCH_NB_MODEL": "fake:echo",
                    "DISPATCH_NB_HOME": str(tmp_path / "home"), "HOME": str(tmp_path)})
        km = IPCKernelManager(kernel_name="python3")
        km.start_kernel(env=env, cwd=str(tmp_path))
        kc = km.client()
        kc.start_channels()

        def run(code: str, click: str | None = None, type_in: str = "") -> list[dict[str, Any]]:
            messages: list[dict[str, Any]] = []
            buttons: dict[str, str] = {}  # description -> comm id

            def on_output(msg: dict[str, Any]) -> None:
                messages.append(msg)
                if msg["msg_type"] == "comm_open":
                    state = msg["content"]["data"].get("state", {})
                    if state.get("_model_name") == "ButtonModel":
                        buttons[state["description"]] = msg["content"]["comm_id"]
                shown = msg["content"].get("data", {})
                if msg["msg_type"] == "display_data" and WIDGET_MIME in shown and click in buttons:
                    kc.shell_channel.send(kc.session.msg("comm_msg", {
                        "comm_id": buttons.pop(click),
                        "data": {"method": "custom", "content": {"event": "click"}}}))

            reply = kc.execute_interactive(code, allow_stdin=True, output_hook=on_output,
                                           stdin_hook=lambda msg: kc.input(type_in), timeout=120)
            assert reply["content"]["status"] == "ok", reply["content"]
            return _saved_outputs(messages)

        try:
            kc.wait_for_ready(timeout=60)
            run("%load_ext dispatch_nb\n%config ChatMagics.confirm_rows = 2\n"
                "rows = ['a', 'b', 'c']")
            saved = run("%%chat --each rows -o res\nSay {row}", click="Send 3 rows")
            assert sorted(fake.last_user_text(r) for r in fake.chat_requests) == [
                "Say a", "Say b", "Say c"]
            assert not any(WIDGET_MIME in o.get("data", {}) for o in saved), saved
            shown = "\n".join(str(o.get("data", {}).get("text/markdown", "")) for o in saved)
            assert "--each has 3 rows" in shown and "Confirmed." in shown  # the question, as text
            assert "echo: Say b" in shown and "3 rows: 3 ok" in shown  # the table, in the cell
            saved = run("%%chat --each rows -o never\nSay {row}", click="Cancel")
            assert len(fake.chat_requests) == 3
            assert not any(WIDGET_MIME in o.get("data", {}) for o in saved), saved
            assert "Nothing was sent" in json.dumps(saved)
            # with the live view set to "display" (no widgets wanted): the front end's input box
            run('%config ChatMagics.live = "display"')
            saved = run("%%chat --each rows -o typed\nSay {row}", type_in="y")
            assert len(fake.chat_requests) == 6, "answered y in the input box: sent"
            assert not any(WIDGET_MIME in o.get("data", {}) for o in saved), saved
        finally:
            kc.stop_channels()
            km.shutdown_kernel(now=True)


def test_an_estimate_with_tools_says_what_it_leaves_out(shell: Any, fake: Any) -> None:
    """``--estimate`` counts one model call of the prompt and the thread: a cell with --tools,
    --mcp or --context also sends the tools' definitions and makes a call per round of its tool
    loop, so its estimate says it does not count them (it read the same as a cell without tools,
    a figure the cell would exceed)."""
    run(shell, 'def add(a: int, b: int) -> int:\n    """Add."""\n    return a + b\ndf = [1, 2]')
    assert run(shell, "%%chat --estimate --max-tokens 50\nAdd 2 and 40.").success
    plain = shell.front.outputs[-1]["data"]["text/plain"]
    assert "not counted" not in plain
    for options in ("--tools add", "--context df"):
        assert run(shell, f"%%chat --estimate --max-tokens 50 {options}\nAdd 2 and 40.").success
        shown = shell.front.outputs[-1]["data"]
        for text in (shown["text/plain"], shown["text/markdown"]):
            assert "tool definitions and the tool loop's further calls are not counted" in text
    assert fake.chat_requests == []


def test_a_deferred_estimate_in_a_terminal_says_it_is_the_batch_price(
        shell: Any, fake: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Terminal IPython shows the plain text only: ``--deferred --estimate`` says there that the
    figure is the batch price (only the Markdown's small "prices:" note said so)."""
    run(shell, "rows = ['a', 'b', 'c']")
    with OpenAIResponsesFake(api_key="sk-test") as openai:
        monkeypatch.setenv("OPENAI_BASE_URL", openai.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
        for deferred in ("", " --deferred"):
            assert run(shell, f"%%chat --each rows -m openai:gpt-4.1{deferred} --estimate "
                              "--max-tokens 10\nSay {row}").success
            shown = shell.front.outputs[-1]["data"]
            for text in (shown["text/plain"], shown["text/markdown"]):
                assert "nothing was sent" in text
                assert ("at the batch price" in text) == bool(deferred), text
        assert openai.chat_requests == [] and openai.requests == []
