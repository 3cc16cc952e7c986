"""Issue 13, "the notebook as a user meets it": each item through a real IPython shell (the
recording front end of conftest.py) against the loopback canonical fake.

The browser suite (tests/e2e) checks the same live view in JupyterLab and Notebook 7, and
test_kernel.py the parts that need a real kernel (stdin for ``%chat key``, nbclient's record run).
"""

from __future__ import annotations

import _thread
import logging
import re
import threading
import time
from typing import Any

import pytest
from IPython.core.error import UsageError

from dispatch_nb.cost import ledger
from dispatch_nb.notebook.display import ChatError, ChatInterrupted
from dispatch_nb.types import Response
from tests.fakes.provider import Fail, ToolCall, Turn
from tests.notebook.conftest import run

WIDGET_MIME = "application/vnd.jupyter.widget-view+json"


def body(fake: Any, index: int = -1) -> dict[str, Any]:
    return dict(fake.chat_requests[index].json)


# -- 2. the option line is read like a shell would ----------------------------------------------


def test_quotes_group_words_and_are_removed(shell: Any, fake: Any, magics: Any) -> None:
    run(shell, '%%chat -s "Be terse." -t "my thread"\nhello')
    sent = body(fake)
    assert sent["system"] == "Be terse."
    assert "my thread" in magics.state.threads and len(magics.state.threads.get("my thread")) == 1
    run(shell, "%%chat -s 'It'\"'\"'s fine.' --no-history\nhi")
    assert body(fake)["system"] == "It's fine."
    run(shell, '%%chat -m "fake:a, fake:b" -o both\nsame question')
    assert {r.json["model"] for r in fake.chat_requests[-2:]} == {"a", "b"}
    assert set(shell.user_ns["both"]) == {"fake:a", "fake:b"}


def test_an_unbalanced_quote_is_a_usage_error_with_the_usage_line(shell: Any, fake: Any) -> None:
    with pytest.raises(UsageError, match=r"no closing quotation.*\nusage: %%chat \[-m SPEC\]"):
        shell.run_cell_magic("chat", '-s "Be terse.', "hi")
    with pytest.raises(UsageError, match=r"unrecognized arguments: --bogus"):
        shell.run_cell_magic("chat", '-s "two words" --bogus', "hi")
    assert fake.chat_requests == []
    assert "-s SYSTEM" in shell.find_cell_magic("chat").__doc__  # the generated help stays


# -- 4. text that cannot be encoded ------------------------------------------------------------


def test_lone_surrogates_are_replaced_and_said_in_one_line(shell: Any, fake: Any) -> None:
    run(shell, '%config ChatMagics.live = "display"')
    shell.user_ns["name"] = b"caf\xe9.txt".decode("utf-8", "surrogateescape")  # as os.listdir
    result = run(shell, "%%chat\nSummarize the file {name}, please \udcff.")
    assert result.success, result.error_in_exec
    assert body(fake)["messages"][-1]["content"] == "Summarize the file caf\ufffd.txt, please \ufffd."
    [output] = shell.front.outputs
    md = output["data"]["text/markdown"]
    notes = [line for line in md.splitlines() if "could not be encoded" in line]
    assert len(notes) == 1 and "2 characters in the prompt" in notes[0]
    assert output["metadata"]["dispatch_nb"]["notes"] == [notes[0][len("<sub>ℹ "):-len("</sub>")]]


# -- 5. the live view: rendered Markdown, blocks sent once ---------------------------------------


REPORT = (
    "# Title\n\nA first paragraph with **bold** text.\n\n```python\nprint('hi')\n```\n\n"
    "- one\n- two\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\nThe end."
)


def test_widget_view_renders_markdown_blocks_each_finished_block_sent_once(
    shell: Any, fake: Any
) -> None:
    from dispatch_nb.notebook.live_widget import WidgetView
    from dispatch_nb.types import StreamDelta

    view = WidgetView(["fake:echo"], rate=1000)
    view.start()
    column = view.columns[0]
    updates: dict[int, list[str]] = {}
    for i in range(0, len(REPORT), 4):
        view.feed(0, StreamDelta(type="text_delta", text=REPORT[i : i + 4]))
        time.sleep(0.002)
        view.tick()
        for run_ in column.runs:
            for out in getattr(run_, "outputs", []):
                if out.outputs:
                    shown = out.outputs[0]["data"]["text/markdown"]
                    seen = updates.setdefault(id(out), [])
                    if not seen or seen[-1] != shown:
                        seen.append(shown)
    view.job_done(0, "echo · done")
    time.sleep(0.01)
    assert view.tick() is None
    [md_run] = column.runs
    blocks = [out.outputs[0]["data"]["text/markdown"] for out in md_run.outputs]
    assert blocks == [
        "# Title", "A first paragraph with **bold** text.", "```python\nprint('hi')\n```",
        "- one\n- two", "| a | b |\n|---|---|\n| 1 | 2 |", "The end.",
    ]
    for out, final in zip(md_run.outputs, blocks, strict=True):
        shown = updates[id(out)]
        # what a block showed only grew, and never showed a half-typed marker
        assert all(final.startswith(s) or s == final.rstrip() for s in shown), shown
        if not final.startswith("|"):  # (a table shows whole rows: "|" ends each)
            assert not any(s.endswith(("*", "|", "`", "-")) and s != final for s in shown), shown
    # the status line is below the answer, and becomes the footer
    assert column.box.children == (column.body, column.status)
    assert "echo · done" in column.status.value


def test_no_word_is_split_and_updates_stay_small_for_a_long_answer(shell: Any, fake: Any) -> None:
    run(shell, '%config ChatMagics.live = "display"')
    words = " ".join(f"word{i}" for i in range(900))  # one 7,000-character paragraph
    fake.push(Turn(text=words, chunk=7, delay=0.0005))
    assert run(shell, "%%chat --no-history\nwrite").success
    updates = [b["data"]["text/markdown"] for kind, b in shell.front.messages
               if kind in ("update", "display") and "text/markdown" in b["data"]]
    live = [re.sub(r"(\n\n)?<sub>[^\n]*</sub>$", "", u) for u in updates[:-1]]
    assert max(len(u) for u in live) <= 700
    for text in live:
        assert text == "" or re.fullmatch(r"(word\d+ ?)*(word\d*|wor|wo|w)?", text), text[-40:]
    # finished blocks were committed whole: joined, they are the answer, every word intact
    committed = [b["data"]["text/markdown"] for kind, b in shell.front.messages
                 if kind == "update" and "<sub>" not in b["data"]["text/markdown"]]
    assert " ".join(committed).split() == words.split()[: len(" ".join(committed).split())]


# -- 6. notes stay -----------------------------------------------------------------------------


@pytest.mark.parametrize("live", ["widget", "display"])
def test_notes_and_the_model_hint_stay_in_the_final_output(shell: Any, fake: Any, live: str,
                                                           monkeypatch: Any) -> None:
    run(shell, f'%config ChatMagics.live = "{live}"')
    result = run(shell, "%%chat\nUse {nope} here.")
    assert result.success
    [output] = shell.front.outputs
    md = output["data"]["text/markdown"]
    assert "{nope} was left as written" in md
    assert md.index("{nope} was left") < md.index("echo: Use {nope} here.")  # above the answer
    assert "{nope} was left as written" in output["data"]["text/plain"]
    assert output["metadata"]["dispatch_nb"]["notes"][0].startswith("{nope} was left as written")


@pytest.mark.local
def test_the_embedded_model_hint_stays(shell: Any, fake: Any, monkeypatch: Any) -> None:
    """No model configured, no login, no key: the embedded model answers, and the hint on how
    to sign in for a stronger one is still there when the answer is complete."""
    from dispatch_nb.defaults import LOCAL_HINT
    from dispatch_nb.providers.local import local_model_available

    if not local_model_available():
        pytest.skip("the embedded model is not installed (the local extra)")
    for name in ("DISPATCH_NB_MODEL", "OPENAI_API_KEY", "ANTHROPIC_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    run(shell, '%config ChatMagics.live = "display"')
    ledger.clear()
    # a cell refused before it was sent shows no answer: the hint is still to be said
    assert not run(shell, "%%chat --tools no_such_tool --no-history\nSay hi.").success
    result = run(shell, "%%chat --max-tokens 8 --no-history\nSay hi.")
    assert result.success, result.error_in_exec
    [output] = shell.front.outputs
    assert LOCAL_HINT in output["data"]["text/markdown"]
    assert output["metadata"]["dispatch_nb"]["spec"] == "local:smollm2"
    assert output["metadata"]["dispatch_nb"]["notes"] == [LOCAL_HINT]
    # said once a kernel: the next cell's answer is not under the same line again
    result = run(shell, "%%chat --max-tokens 8 --no-history\nSay hello.")
    assert result.success, result.error_in_exec
    again = shell.front.outputs[-1]
    assert LOCAL_HINT not in again["data"]["text/markdown"]
    assert "notes" not in again["metadata"]["dispatch_nb"]
    # %chat cost: the embedded model's answers cost $0, and no price came from genai-prices
    run(shell, "%chat cost")
    shown = shell.front.outputs[-1]["data"]["text/markdown"]
    assert "Spent in this kernel: **\\$0**." in shown and "genai-prices" not in shown


# -- 7. retries are quiet ----------------------------------------------------------------------


@pytest.mark.parametrize("live", ["display", "widget"])
def test_a_retry_is_one_quiet_status_line_and_a_footer_note(
    shell: Any, fake: Any, live: str, capfd: Any
) -> None:
    run(shell, f'%config ChatMagics.live = "{live}"')
    capfd.readouterr()
    fake.push(Fail(429, "slow down", "rate_limit_error", headers={"retry-after": "0.4"}),
              Turn(text="finally an answer"))
    result = run(shell, "%%chat\nhi")
    assert result.success, result.error_in_exec
    assert len(fake.chat_requests) == 2
    [output] = shell.front.outputs
    footer = output["metadata"]["dispatch_nb"]["footer"]
    assert footer.endswith("retried once (rate limited, HTTP 429)"), footer
    assert "finally an answer" in output["data"]["text/markdown"]
    captured = capfd.readouterr()
    assert "retrying" not in captured.err and "429" not in captured.err  # no red stderr box
    assert "retrying" not in captured.out
    if live == "display":  # (widget values are checked in the next test and in the browser)
        shown = [b["data"].get("text/markdown", "") for _, b in shell.front.messages if "data" in b]
        assert any("↻ rate limited, HTTP 429 — retrying" in md for md in shown)  # quietly
    assert logging.getLogger("dispatch_nb").handlers == []  # no handler of ours is left


def test_a_retry_in_the_widget_status_line(shell: Any, fake: Any) -> None:
    from dispatch_nb import RetryEvent
    from dispatch_nb.notebook.live_widget import WidgetView

    view = WidgetView(["fake:echo"], rate=1000)
    view.start()
    view.feed(0, RetryEvent(reason="rate limited, HTTP 429", attempt=1, wait=2.0))
    view.tick()
    status = view.columns[0].status.value
    assert "↻ rate limited, HTTP 429 — retrying in 2 s" in status
    assert view.transcripts[0].footer(1.0).endswith("retried once (rate limited, HTTP 429)")


# -- 8. Ctrl-C while a tool runs ---------------------------------------------------------------


@pytest.mark.parametrize("live", ["display", "widget", "text"])
def test_ctrl_c_during_a_sync_tool_stops_at_once_and_abandons_the_tool(
    shell: Any, fake: Any, live: str, capsys: Any
) -> None:
    run(shell, f'%config ChatMagics.live = "{live}"')
    started = threading.Event()
    finished = threading.Event()

    def slow_lookup(city: str) -> str:
        """Look a city up (slowly)."""
        started.set()
        time.sleep(6)
        finished.set()
        return f"{city}: found"

    shell.user_ns["slow_lookup"] = slow_lookup
    fake.push(Turn(text="Let me look that up.", tool_calls=[ToolCall("c1", "slow_lookup",
                                                                     {"city": "Oslo"})]),
              Turn(text="never sent"))

    interrupted: list[float] = []

    def interrupt_when_the_tool_runs() -> None:
        if started.wait(20):
            time.sleep(0.2)
            interrupted.append(time.monotonic())
            _thread.interrupt_main()

    threading.Thread(target=interrupt_when_the_tool_runs, daemon=True).start()
    result = run(shell, "%%chat --tools slow_lookup -o partial\nWhere is Oslo?")
    # from Ctrl-C to the end of the cell (waiting for the tool would take 5.8 s more)
    took = time.monotonic() - interrupted[0]
    assert isinstance(result.error_in_exec, ChatInterrupted)
    assert "interrupted" in result.error_in_exec._render_traceback_()[0]
    assert took < 3, f"the cell waited {took:.1f} s for the tool"
    assert not finished.is_set()
    if live == "text":
        out = capsys.readouterr().out
        assert "Let me look that up." in out and "abandoned" in out and "interrupted" in out
    else:
        [output] = shell.front.outputs
        md = output["data"]["text/markdown"]
        assert md.startswith("Let me look that up.")
        assert "slow_lookup" in md and "abandoned" in md and "⏹ interrupted" in md
    partial = shell.user_ns["partial"]  # -o stores what arrived, even after Ctrl-C
    assert isinstance(partial, Response) and partial.text == "Let me look that up."
    assert [c.name for c in partial.tool_calls] == ["slow_lookup"]  # the call it was running
    assert len(fake.chat_requests) == 1  # the tool's result was dropped: no second round
    assert finished.wait(10)
    time.sleep(0.3)
    assert len(fake.chat_requests) == 1
    assert len(shell._dispatch_nb_magics.state.threads.get("default")) == 0


# -- 9. -f code and -o ---------------------------------------------------------------------------


def test_code_format_warns_without_a_fence_and_keeps_one_language(shell: Any, fake: Any) -> None:
    run(shell, '%config ChatMagics.live = "display"')
    shell.rl_next_input = None
    fake.push(Turn(text="You could sort the list, then take the middle element."))
    run(shell, "%%chat -f code\nmedian?")
    md = shell.front.markdown[0]
    assert "no fenced code block" in md and "nothing was put in the next cell" in md
    assert shell.rl_next_input is None

    fake.push(Turn(text="Install it:\n```bash\npip install numpy\n```\nthen:\n```python\n"
                        "import numpy as np\n```\nand\n```python\nprint(np.median([1, 2]))\n```"))
    run(shell, "%%chat -f code\nmedian with numpy?")
    assert shell.rl_next_input == "import numpy as np\n\nprint(np.median([1, 2]))"
    md = shell.front.markdown[0]
    assert "pip install" not in md.split("```")[1]
    assert "1 code block in another language (bash) left out" in md

    fake.push(Turn(text="x = [3, 1, 2]\nprint(sorted(x)[1])"))  # unfenced, but valid Python
    run(shell, "%%chat -f code\nplain code")
    assert shell.rl_next_input == "x = [3, 1, 2]\nprint(sorted(x)[1])"

    shell.rl_next_input = None  # "Label: text" parses as a bare annotation, but is prose
    fake.push(Turn(text="Answer: 42"))
    run(shell, "%%chat -f code\nthe answer?")
    assert shell.rl_next_input is None and "no fenced code block" in shell.front.markdown[0]


def test_output_variable_needs_a_valid_name_before_anything_is_sent(shell: Any, fake: Any) -> None:
    with pytest.raises(UsageError, match="-o needs a Python variable name"):
        shell.run_cell_magic("chat", "-o my-var", "hi")
    with pytest.raises(UsageError, match="-o needs a Python variable name"):
        shell.run_cell_magic("chat", "-o class", "hi")
    assert fake.chat_requests == []


def test_output_variable_in_a_comparison_holds_each_models_answer_or_error(
    shell: Any, fake: Any
) -> None:
    run(shell, '%config ChatMagics.live = "display"')
    fake.push(Fail(400, "bad request for this one", "invalid_request_error"), Turn(text="fine"))
    assert run(shell, "%%chat -m fake:a,fake:b -o both\nq").success
    both = shell.user_ns["both"]
    values = list(both.values())
    assert any(isinstance(v, Response) and v.text == "fine" for v in values)
    errors = [v for v in values if isinstance(v, Exception)]
    assert len(errors) == 1 and errors[0].status_code == 400


def test_output_variable_after_a_failure_holds_the_error(shell: Any, fake: Any) -> None:
    fake.push(Fail(401, "bad key", "authentication_error"))
    result = run(shell, "%%chat -o answer\nhi")
    assert isinstance(result.error_in_exec, ChatError)
    assert shell.user_ns["answer"].status_code == 401


# -- 10. the terminal ----------------------------------------------------------------------------


def test_terminal_gets_plain_text_not_markdown(shell: Any, fake: Any, capsys: Any) -> None:
    run(shell, "%chat login openai")
    run(shell, "%chat history nothing-here")
    run(shell, "%%chat\nhello")
    run(shell, "%chat reset")
    plains = [o["data"]["text/plain"] for kind, o in shell.front.messages if kind == "display"]
    plains += [o["data"]["text/plain"] for o in shell.front.outputs]
    for text in plains:
        assert "**" not in text and "`" not in text and not re.search(r"(^|\s)\*\w", text), text


def test_terminal_prints_a_json_answer_once(shell: Any, fake: Any, capsys: Any) -> None:
    fake.push(Turn(text='{"a": [1, 2]}'))
    assert run(shell, "%%chat -f json\njson please").success
    out = capsys.readouterr().out
    assert out.count('"a"') == 1, out
    assert "[fake:echo · 12 in / 7 out tokens" in out


def test_terminal_prints_a_failed_cells_notes_once(shell: Any, fake: Any, capsys: Any) -> None:
    # the notes are printed when the cell starts; a cell that fails before its first token
    # must not print them again above its error
    fake.push(Fail(401, "bad key", "authentication_error"))
    assert not run(shell, "%%chat\nNote {nope} here.").success
    out = capsys.readouterr().out
    assert out.count("{nope} was left as written") == 1, out


def test_terminal_shows_a_long_tool_result_cut_visibly(shell: Any, fake: Any, capsys: Any) -> None:
    """A tool result longer than the terminal shows (a DataFrame's describe()) ends with … where
    it is cut, and its lines stay under the call: it was cut silently, mid-number ("75%  23" of
    230.0), its later lines at the left margin like the answer's."""
    run(shell, 'def table() -> str:\n    """A table."""\n'
               '    return "\\n".join(f"{i:>4} {i * 10:>8.1f}" for i in range(40))')
    fake.push(Turn(tool_calls=[ToolCall("t1", "table", {})]), Turn(text="Done."))
    assert run(shell, "%%chat --tools table\nShow the table.").success
    out = capsys.readouterr().out
    shown = out[out.index("→"):out.index("Done.")].rstrip("\n").splitlines()
    assert shown[0] == "→    0      0.0" and shown[-1].endswith("…"), shown
    assert all(line.startswith("     ") for line in shown[1:]), shown


def test_terminal_prints_a_warning_logged_while_the_cell_ran(shell: Any, fake: Any,
                                                            capsys: Any) -> None:
    """A warning the library logs while a cell runs (an MCP server that cannot start adds no
    tools) is shown with the answer in a notebook, and printed in the terminal too: there it was
    dropped, so the model answered without the tools and nobody was told why."""
    pytest.importorskip("mcp")
    run(shell, 'def add(a: int, b: int) -> int:\n    """Add."""\n    return a + b')
    run(shell, "%chat mcp add broken -- /nonexistent/command")
    fake.push(Turn(tool_calls=[ToolCall("a1", "add", {"a": 1, "b": 2})]), Turn(text="It is 3."))
    try:
        assert run(shell, "%%chat --mcp broken --tools add\nAdd 1 and 2.").success
        out = capsys.readouterr().out
        assert "ℹ MCP server broken:" in out and "No such file or directory" in out, out
        assert out.count("ℹ MCP server broken") == 1  # listed again each round: said once
        assert out.index("ℹ MCP server broken") < out.index("It is 3.")
    finally:
        run(shell, "%chat mcp remove broken")


# -- 11. login, models, status --------------------------------------------------------------------


def test_login_when_logged_in_says_so_and_asks_for_force(
    shell: Any, fake: Any, monkeypatch: Any
) -> None:
    monkeypatch.setenv("DISPATCH_NB_GITHUB_TOKEN", "gho_alreadythere123")
    run(shell, "%chat login")
    [md] = shell.front.markdown
    assert "Already logged in to GitHub Copilot" in md and "%chat login --force" in md
    assert "gho_alreadythere123" not in md


def test_models_for_copilot_while_logged_out_explains(shell: Any, fake: Any) -> None:
    run(shell, "%chat models copilot")
    [md] = shell.front.markdown
    assert "Not logged in to GitHub Copilot" in md and "%chat login" in md
    assert shell._dispatch_nb_magics.state.login_view is None  # no login was started


def test_models_table_shows_only_columns_with_data(shell: Any, fake: Any) -> None:
    fake.models = [{"id": "echo"}, {"id": "other", "max_context_tokens": 1000}]
    try:
        run(shell, "%chat models fake")
    finally:
        fake.models = type(fake).models
    md = shell.front.markdown[0]
    header = next(line for line in md.splitlines() if line.startswith("| model"))
    assert header == "| model | context |"
    assert "**2 models from fake**" in md


# -- 12. never a key in a cell ---------------------------------------------------------------------


def test_key_advice_never_puts_a_key_in_a_cell(shell: Any, fake: Any) -> None:
    from dispatch_nb.errors import AuthenticationError
    from dispatch_nb.notebook.display import explain_error

    for provider in ("openai", "anthropic", "compatible"):
        error = explain_error(AuthenticationError("no key", provider=provider))
        assert "%env" not in error.fix and "=sk" not in error.fix
        assert f"%chat key {provider}" in error.fix
    run(shell, "%chat login anthropic")
    md = shell.front.markdown[0]
    assert "%chat key anthropic" in md and "%env" not in md


# -- 13. small things ------------------------------------------------------------------------------


def test_an_error_before_any_text_shows_only_the_error(shell: Any, fake: Any) -> None:
    run(shell, '%config ChatMagics.live = "display"')
    fake.push(Fail(401, "bad key", "authentication_error"))
    result = run(shell, "%%chat\nhi")
    assert isinstance(result.error_in_exec, ChatError)
    shown = "".join(str(o["data"]) for o in shell.front.outputs)
    assert "(no text)" not in shown and "0 in / 0 out" not in shown and "tokens" not in shown


def test_context_length_advice_fits_what_the_cell_used(shell: Any, fake: Any) -> None:
    too_long = Fail(400, "prompt is too long", "context_length_exceeded")
    fake.push(too_long)
    error = run(shell, "%%chat --no-history\nhuge").error_in_exec
    assert isinstance(error, ChatError) and "The prompt alone is too long" in error.fix
    assert "--no-history" not in error.fix
    run(shell, "%%chat\nfirst")
    fake.push(too_long)
    error = run(shell, "%%chat\nsecond").error_in_exec
    assert "1 earlier turn)" in error.fix and "--new" in error.fix


def test_print_response_prints_the_text(shell: Any, fake: Any, capsys: Any) -> None:
    run(shell, "%%chat -o r\nhello")
    capsys.readouterr()
    run(shell, "print(r)")
    assert capsys.readouterr().out == "echo: hello\n"
    assert repr(shell.user_ns["r"]).startswith("Response(")


def test_history_shows_tool_calls_and_results_and_counts_turns(shell: Any, fake: Any) -> None:
    run(shell, "def add(a: int, b: int) -> int:\n    '''Add two numbers.'''\n    return a + b")
    fake.push(Turn(tool_calls=[ToolCall("c1", "add", {"a": 2, "b": 3})]), Turn(text="It is 5."))
    assert run(shell, "%%chat --tools add\nwhat is 2+3?").success
    run(shell, "%chat history")
    md = shell.front.markdown[0]
    assert "1 turn\n" in md and "1 turns" not in md
    assert '🔧 `add({"a": 2, "b": 3})`' in md and "→ `5`" in md and "It is 5." in md
    assert md.index("add(") < md.index("→ `5`") < md.index("It is 5.")
    run(shell, "%chat status")
    assert "`default` (1 turn)" in shell.front.markdown[0]
    assert shell.front.markdown[0].startswith("| setting | value |\n")  # a header, not an empty row


def test_a_tool_that_is_not_a_function_is_named_with_the_right_article(
    shell: Any, fake: Any
) -> None:
    shell.user_ns["x"] = 5
    error = run(shell, "%%chat --tools x\nhi").error_in_exec
    assert isinstance(error, UsageError) and str(error).startswith(
        "--tools x: x is an int, not a function.")
    assert fake.chat_requests == []
