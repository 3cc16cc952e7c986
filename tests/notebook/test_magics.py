"""``%%chat`` / ``%chat`` through a real IPython shell against the loopback canonical fake."""

from __future__ import annotations

import _thread
import asyncio
import html
import json
import re
import subprocess
import sys
import threading
from typing import Any

import pytest
from IPython.core.error import UsageError

from dispatch_nb.errors import RequestError
from dispatch_nb.notebook.display import ChatError, ChatInterrupted
from dispatch_nb.render import small
from tests.fakes.provider import Fail, ToolCall, Turn
from tests.notebook.compare_output import sections, table_rows
from tests.notebook.conftest import run

WIDGET_MIME = "application/vnd.jupyter.widget-view+json"


def sent_messages(fake: Any, index: int = -1) -> list[dict[str, Any]]:
    return fake.chat_requests[index].json["messages"]


# -- loading and options --------------------------------------------------------------------------


def test_load_ext_imports_no_heavy_module() -> None:
    code = (
        "import sys\n"
        "from IPython.core.interactiveshell import InteractiveShell\n"
        "ip = InteractiveShell.instance()\n"
        "ip.run_line_magic('load_ext', 'dispatch_nb')\n"
        "assert ip.find_cell_magic('chat') and ip.find_line_magic('chat')\n"
        "heavy = ['httpx', 'pydantic', 'ipywidgets', 'orjson', 'dispatch_nb.types',\n"
        "         'dispatch_nb.registry', 'dispatch_nb.providers', 'dispatch_nb.notebook.cell',\n"
        "         'dispatch_nb.notebook.live']\n"
        "print([m for m in heavy if m in sys.modules])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_unload_ext_puts_back_the_approval_asker_it_replaced(shell: Any) -> None:
    from dispatch_nb.approval import set_asker

    def mine(call: Any, seconds: float | None) -> bool:
        return True

    shell.run_line_magic("unload_ext", "dispatch_nb")  # (the fixture loaded it)
    before = set_asker(mine)
    try:
        shell.run_line_magic("load_ext", "dispatch_nb")
        loaded = set_asker(None)
        set_asker(loaded)
        assert loaded is not mine and loaded is not None  # cells ask while it is loaded
        shell.run_line_magic("unload_ext", "dispatch_nb")
        assert set_asker(before) is mine  # and what was there before is back
    finally:
        shell.run_line_magic("load_ext", "dispatch_nb")  # for the fixture's teardown


def test_generated_help_lists_every_option(shell: Any) -> None:
    doc = shell.find_cell_magic("chat").__doc__
    for option in ("-m SPEC", "-s SYSTEM", "-t THREAD", "--new", "--max-tokens N", "--temperature T",
                   "--tools NAMES", "-f", "-o VAR", "--no-stream", "--no-history",
                   "--no-interpolate", "--cache MODE", "--estimate", "--budget USD",
                   "--limit N", "--yes"):
        assert option in doc, option
    assert "{login,logout,status,models,history,reset,key,cost,mcp}" in \
        shell.find_line_magic("chat").__doc__


def test_bad_options_raise_usage_error_with_the_usage_line(shell: Any, fake: Any) -> None:
    with pytest.raises(UsageError, match=r"unrecognized arguments: --bogus\nusage: %%chat \[-m SPEC\]"):
        shell.run_cell_magic("chat", "--bogus", "hi")
    with pytest.raises(UsageError, match="invalid choice: 'yaml'"):
        shell.run_cell_magic("chat", "-f yaml", "hi")
    with pytest.raises(UsageError, match="usage: %chat") as bad:
        shell.run_line_magic("chat", "frobnicate")
    assert "'cost', 'mcp')" in str(bad.value)  # every command is offered, %chat mcp too
    with pytest.raises(UsageError, match=r"needs a command: .*cost, mcp"):
        shell.run_line_magic("chat", "")
    with pytest.raises(UsageError, match="empty"):
        shell.run_cell_magic("chat", "", "   \n")
    assert fake.chat_requests == []


def test_config_traits(shell: Any, fake: Any) -> None:
    run(shell, '%config ChatMagics.system = "Be terse."')
    run(shell, "%config ChatMagics.max_tokens = 77")
    run(shell, '%config ChatMagics.model = "fake:configured"')
    result = run(shell, "%%chat\nhello")
    assert result.success
    body = fake.chat_requests[-1].json
    assert body["system"] == "Be terse." and body["max_tokens"] == 77 and body["model"] == "configured"
    result = run(shell, "%%chat -s Other --max-tokens 5 --temperature 0.5 -m fake:echo\nhello again")
    body = fake.chat_requests[-1].json
    assert (body["system"], body["max_tokens"], body["temperature"], body["model"]) == (
        "Other", 5, 0.5, "echo")


# -- streaming and the final output ------------------------------------------------------------------


def test_terminal_streams_text_then_a_footer(shell: Any, fake: Any, capsys: Any) -> None:
    shell.user_ns["x"] = 42
    result = run(shell, "%%chat\nWhat is {x}?")
    assert result.success, result.error_in_exec
    out = capsys.readouterr().out
    assert "echo: What is 42?" in out
    assert "[fake:echo · 12 in / 7 out tokens" in out
    assert sent_messages(fake)[-1]["content"] == "What is 42?"


@pytest.mark.parametrize("live", ["display", "widget"])
def test_one_static_output_replaces_the_live_view(shell: Any, fake: Any, live: str) -> None:
    run(shell, f'%config ChatMagics.live = "{live}"')
    fake.push(Turn(text="# Title\n\nSome **markdown** and $x^2$.", thinking="let me think", chunk=3,
                   delay=0.005, input_tokens=21, output_tokens=9))
    result = run(shell, "%%chat\nexplain")
    assert result.success, result.error_in_exec
    front = shell.front
    assert len(front.outputs) == 1
    data, metadata = front.outputs[0]["data"], front.outputs[0]["metadata"]
    assert set(data) == {"text/markdown", "text/plain"}
    assert "Some **markdown** and $x^2$." in data["text/markdown"]
    assert "<details><summary>Thinking</summary>" in data["text/markdown"]
    assert "21 in / 9 out tokens" in data["text/markdown"]
    facts = metadata["dispatch_nb"]
    assert facts["model"] == "echo" and facts["usage"]["input_tokens"] == 21
    assert facts["stop_reason"] == "end_turn" and facts["latency_s"] > 0 and facts["thread"] == "default"
    assert facts["live"] == live
    displayed = [body["data"] for kind, body in front.messages if kind == "display"]
    if live == "widget":
        assert WIDGET_MIME in displayed[0]  # the live view was a widget...
        assert all(WIDGET_MIME not in o["data"] for o in front.outputs)  # ...and is gone
        magics = shell._dispatch_nb_magics
        assert magics is not None
    else:
        assert ("clear", {"wait": True}) in front.messages


def test_widget_view_shows_text_thinking_and_tools_then_closes_its_widgets(shell: Any, fake: Any) -> None:
    import ipywidgets

    from dispatch_nb.notebook.live_widget import WidgetView

    view = WidgetView(["fake:echo"])
    view.start(["a note"])
    from dispatch_nb.types import StreamDelta, ToolResultBlock, ToolResultEvent

    view.feed(0, StreamDelta(type="thinking_delta", text="hmm"))
    view.feed(0, StreamDelta(type="text_delta", text="Hello <b>"))
    view.feed(0, StreamDelta(type="tool_use_start", tool_call_id="t1", tool_name="add"))
    view.feed(0, StreamDelta(type="tool_use_end", tool_call_id="t1", arguments={"a": 1}))
    view.feed(0, ToolResultEvent(result=ToolResultBlock(tool_use_id="t1", content="2"), tool_name="add"))
    view.feed(0, StreamDelta(type="text_delta", text="done"))
    assert view.tick() is None  # the first flush happens at once
    column = view.columns[0]
    kinds = [type(p).__name__ for p in column.body.children]
    assert kinds == ["Accordion", "VBox", "HTML", "VBox"]  # thinking, text, tool, text
    accordion = column.body.children[0]
    assert accordion.selected_index is None  # thinking is collapsed
    assert "hmm" in accordion.children[0].children[0].children[0].value
    def markdown(box: Any) -> str:  # the Markdown an Output widget of the answer holds
        [output] = box.children[0].outputs
        return str(output["data"]["text/markdown"])

    # Markdown, rendered by the front end (a formatting tag stays a tag: render.inert_html)
    assert markdown(column.body.children[1]) == "Hello <b>"
    assert "add" in column.body.children[2].value and "→ 2" in column.body.children[2].value
    assert markdown(column.body.children[3]) == "done"
    assert "a note" in view.root.children[0].outputs[0]["data"]["text/markdown"]
    created = list(column.created)
    from dispatch_nb.notebook.display import FinalOutput

    view.finish(FinalOutput({"text/markdown": "x", "text/plain": "x"}, {}))
    assert all(w.comm is None for w in created)
    assert isinstance(accordion, ipywidgets.Accordion)


def test_no_stream_waits_for_the_whole_answer(shell: Any, fake: Any) -> None:
    run(shell, '%config ChatMagics.live = "display"')
    result = run(shell, "%%chat --no-stream\nquiet")
    assert result.success
    assert fake.chat_requests[-1].json["stream"] is False
    assert "echo: quiet" in shell.front.markdown[0]


def test_formats(shell: Any, fake: Any) -> None:
    run(shell, '%config ChatMagics.live = "display"')
    fake.push(Turn(text="Here:\n```python\nprint('hi')\n```\nand\n```python\nx = 1\n```"))
    run(shell, "%%chat -f code\nwrite code")
    assert shell.front.outputs[0]["data"]["text/plain"] == "print('hi')\n\nx = 1"
    assert shell.rl_next_input == "print('hi')\n\nx = 1"

    fake.push(Turn(text='Sure!\n```json\n{"a": [1, 2], "b": null}\n```'))
    run(shell, "%%chat -f json -o answer\ngive json")
    data = shell.front.outputs[0]["data"]
    assert data["application/json"] == {"a": [1, 2], "b": None}
    assert '"a": [' in data["text/markdown"]
    assert shell.user_ns["answer"].text.startswith("Sure!")

    fake.push(Turn(text="not json at all"))
    run(shell, "%%chat -f json\ngive json")
    assert "not valid JSON" in shell.front.markdown[0]

    fake.push(Turn(text="plain *text*"))
    run(shell, "%%chat -f text\nplain please")
    data = shell.front.outputs[0]["data"]
    assert list(data) == ["text/plain"] and data["text/plain"].startswith("plain *text*")


def test_output_variable_and_out(shell: Any, fake: Any) -> None:
    result = run(shell, "%%chat -o r\nkeep me")
    from dispatch_nb.types import Response

    assert isinstance(shell.user_ns["r"], Response) and shell.user_ns["r"].text == "echo: keep me"
    assert shell.user_ns["Out"][result.execution_count] is shell.user_ns["r"]
    run(shell, f"%%chat -o r2\nWhat did you say? {{Out[{result.execution_count}]}}")
    assert sent_messages(fake)[-1]["content"] == "What did you say? echo: keep me"


# -- prompt references ------------------------------------------------------------------------------


def test_in_out_err_references(shell: Any, fake: Any) -> None:
    first = run(shell, "numbers = [1, 2, 3]\nsum(numbers)")
    failed = run(shell, "1 / 0")
    assert not failed.success
    n, m = first.execution_count, failed.execution_count
    run(shell, f"%%chat\nCode: {{In[{n}]}} gave {{Out[{n}]}}; then: {{Err[{m}]}}")
    text = sent_messages(fake)[-1]["content"]
    assert "Code: numbers = [1, 2, 3]\nsum(numbers) gave 6; then: Traceback" in text
    assert text.rstrip().endswith("ZeroDivisionError: division by zero")
    assert "interactiveshell.py" not in text


def test_interpolation_notes_and_no_interpolate(shell: Any, fake: Any, capsys: Any) -> None:
    run(shell, "%%chat\nuse {undefined_thing} and {{braces}}")
    assert sent_messages(fake)[-1]["content"] == "use {undefined_thing} and {braces}"
    assert "{undefined_thing} was left as written" in capsys.readouterr().out
    run(shell, "%%chat --no-interpolate\nuse {x} and {{braces}}")
    assert sent_messages(fake)[-1]["content"] == "use {x} and {{braces}}"


# -- memory -----------------------------------------------------------------------------------------


def test_thread_memory_and_rerun_replaces_the_turn(shell: Any, fake: Any, magics: Any) -> None:
    run(shell, "%%chat\nfirst", cell_id="c1")
    run(shell, "%%chat\nsecond", cell_id="c2")
    sent = sent_messages(fake)
    assert len(sent) == 3 and sent[0]["content"] == "first" and sent[2]["content"] == "second"
    run(shell, "%%chat\nfirst", cell_id="c1")  # re-run of the first cell: sees what came before
    assert [m["content"] for m in sent_messages(fake)] == ["first"]
    thread = magics.state.threads.get("default")
    assert [t.prompt for t in thread] == ["first", "second"]  # replaced in place, later turn kept
    run(shell, "%%chat\nthird", cell_id="c3")
    assert len(sent_messages(fake)) == 5


def test_same_text_in_new_cells_adds_turns_where_no_cell_id_comes(
    shell: Any, fake: Any, magics: Any
) -> None:
    """Terminal IPython and nbclient send no cell id: each input (In[n]) is its own turn, so
    "continue" typed twice is two turns, in order, and the model sees both."""
    run(shell, "%%chat\nTell me a story.")
    run(shell, "%%chat\ncontinue")
    run(shell, "%%chat\ncontinue")
    contents = [m["content"] for m in sent_messages(fake)]
    assert contents[0::2] == ["Tell me a story.", "continue", "continue"]
    assert len(contents) == 5
    thread = magics.state.threads.get("default")
    assert [t.prompt for t in thread] == ["Tell me a story.", "continue", "continue"]
    counts = [t.execution_count for t in thread]
    assert counts == sorted(counts) and len(set(counts)) == 3
    run(shell, "%chat history")
    md = shell.front.markdown[0]
    assert md.index("Tell me a story.") < md.index("continue") < md.rindex("continue")


def test_cell_id_identifies_a_cell_across_edits(shell: Any, fake: Any, magics: Any) -> None:
    run(shell, "%%chat\nversion one", cell_id="cell-a")
    run(shell, "%%chat\nanother cell", cell_id="cell-b")
    run(shell, "%%chat\nversion two", cell_id="cell-a")
    assert [t.prompt for t in magics.state.threads.get("default")] == ["version two", "another cell"]
    assert len(sent_messages(fake)) == 1


def test_loop_of_chat_calls_in_one_cell_keeps_every_answer(shell: Any, fake: Any, magics: Any) -> None:
    run(shell, "for q in ['a', 'b', 'c']:\n    get_ipython().run_cell_magic('chat', '', q)",
        cell_id="loop")
    assert [t.prompt for t in magics.state.threads.get("default")] == ["a", "b", "c"]


def test_threads_new_no_history_reset_and_history(shell: Any, fake: Any, magics: Any) -> None:
    run(shell, "%%chat -t research\nalpha")
    run(shell, "%%chat -t research\nbeta")
    assert len(sent_messages(fake)) == 3
    run(shell, "%%chat\nother thread")
    assert len(sent_messages(fake)) == 1
    run(shell, "%%chat -t research --no-history\none-off")
    assert len(sent_messages(fake)) == 1
    assert len(magics.state.threads.get("research")) == 2
    run(shell, "%chat history research")
    md = shell.front.markdown[0]
    assert "alpha" in md and "echo: beta" in md and "one-off" not in md
    assert md.count(" · fake:echo</sub>") == 2  # each turn's model, named as its footer names it
    run(shell, "%%chat -t research --new\nfresh start")
    assert len(sent_messages(fake)) == 1
    assert [t.prompt for t in magics.state.threads.get("research")] == ["fresh start"]
    run(shell, "%chat reset research")
    assert "research" not in magics.state.threads
    run(shell, "%chat reset --all")
    assert magics.state.threads.names() == []
    run(shell, "%config ChatMagics.history_length = 2")
    for word in ("one", "two", "three"):
        run(shell, f"%%chat\n{word}")
    assert [t.prompt for t in magics.state.threads.get("default")] == ["two", "three"]


# -- errors and interruption ------------------------------------------------------------------------


def test_auth_error_is_short_with_the_fix(shell: Any, fake: Any) -> None:
    fake.push(Fail(401, "bad key", "authentication_error"))
    result = run(shell, "%%chat\nhi")
    error = result.error_in_exec
    assert isinstance(error, ChatError)
    lines = error._render_traceback_()
    assert len(lines) == 2 and "AuthenticationError" in lines[0] and "bad key" in lines[0]
    assert shell._dispatch_nb_magics.state.errors[result.execution_count] is error


def test_rate_limit_says_how_long_to_wait(shell: Any, fake: Any) -> None:
    for _ in range(3):
        fake.push(Fail(429, "slow down", "rate_limit_error", headers={"retry-after": "120"}))
    error = run(shell, "%%chat\nhi").error_in_exec
    assert isinstance(error, ChatError) and "Wait 120 s" in error.fix


def test_unknown_model_lists_the_available_ones(shell: Any, fake: Any) -> None:
    fake.push(Fail(404, "The model `nope` does not exist", "model_not_found"))
    error = run(shell, "%%chat -m fake:nope\nhi").error_in_exec
    assert isinstance(error, ChatError) and "Available models: echo" in error.fix


def test_only_an_unknown_model_asks_for_the_model_list(shell: Any, fake: Any) -> None:
    fake.push(Fail(401, "bad key", "authentication_error"))
    assert isinstance(run(shell, "%%chat\nhi").error_in_exec, ChatError)
    assert not [r for r in fake.requests if r.path.endswith("/models")]  # nothing to explain
    fake.push(Fail(404, "The model `nope` does not exist", "model_not_found"))
    assert isinstance(run(shell, "%%chat -m fake:nope\nhi").error_in_exec, ChatError)
    assert [r for r in fake.requests if r.path.endswith("/models")]


def test_unknown_provider_is_short(shell: Any, fake: Any) -> None:
    error = run(shell, "%%chat -m nosuch:model\nhi").error_in_exec
    assert isinstance(error, ChatError) and "available providers" in error.message


def test_partial_text_stays_visible_after_a_mid_stream_error(shell: Any, fake: Any) -> None:
    run(shell, '%config ChatMagics.live = "display"')
    fake.push(Turn(text="The beginning of an answer", chunk=5, error_after=3,
                   error=Fail(500, "overloaded", "overloaded_error")))
    result = run(shell, "%%chat\nhi")
    assert isinstance(result.error_in_exec, ChatError)
    md = shell.front.markdown[0]
    assert md.startswith("The beginning o") and "ServerError" in md and "0 in" not in md


def run_interrupted(shell: Any, cell: str, after: float = 0.5) -> Any:
    """Run ``cell`` and press Ctrl-C ``after`` seconds in (as a person does mid-stream)."""
    timer = threading.Timer(after, _thread.interrupt_main)
    timer.start()
    try:
        return run(shell, cell)
    finally:
        timer.cancel()


def test_ctrl_c_cancels_and_keeps_the_partial_answer(shell: Any, fake: Any) -> None:
    run(shell, '%config ChatMagics.live = "display"')
    fake.push(Turn(text="word " * 400, chunk=5, delay=0.02))
    result = run_interrupted(shell, "%%chat\nlong answer please")
    assert isinstance(result.error_in_exec, ChatInterrupted)
    assert result.error_in_exec._render_traceback_()[0].count("\n") == 0
    md = shell.front.markdown[0]
    assert md.startswith("word word") and "interrupted" in md
    assert 0 < md.count("word") < 400
    assert len(shell._dispatch_nb_magics.state.threads.get("default")) == 0  # nothing half-recorded


def test_ctrl_c_in_a_comparison_is_marked_as_an_interrupt_not_a_failure(
    shell: Any, fake: Any
) -> None:
    """⏹ (the interrupt) in the table, each section and the text, as one model shows it; ⚠ is
    for failures; tool calls read the same in the text as in the terminal's live view (🔧)."""
    run(shell, '%config ChatMagics.live = "display"')
    for model in ("echo", "second"):
        fake.push_for(model, Turn(text="word " * 400, chunk=5, delay=0.02))
    result = run_interrupted(shell, "%%chat -m fake:echo,fake:second\nlong answers please")
    assert isinstance(result.error_in_exec, ChatInterrupted)
    data = shell.front.outputs[-1]["data"]
    assert data["text/markdown"].count("⏹ interrupted") == 2, data["text/markdown"]  # the table
    assert data["text/markdown"].count("⏹ *interrupted*") == 2  # under each answer
    assert "⚠" not in data["text/markdown"] and "⚠" not in data["text/plain"]
    assert data["text/plain"].count("⏹ interrupted") == 2
    assert "0 / 0" not in data["text/markdown"]  # no usage arrived: "–", not zero tokens


# -- compare and event loops --------------------------------------------------------------------------


@pytest.mark.parametrize("live", ["display", "widget", "text"])
def test_compare_streams_several_models_and_leaves_one_table(shell: Any, fake: Any, live: str,
                                                             capsys: Any) -> None:
    run(shell, f'%config ChatMagics.live = "{live}"')
    fake.push_for("echo", Turn(text="slow answer from echo " * 5, delay=0.01))
    # ("other" answers with the fake's echo, which names its model: "other: same prompt")
    result = run(shell, "%%chat -m fake:echo,fake:other -o both\nsame prompt")
    assert result.success, result.error_in_exec
    assert {r.json["model"] for r in fake.chat_requests} == {"echo", "other"}
    both = shell.user_ns["both"]
    assert list(both) == ["fake:echo", "fake:other"]
    assert (both["fake:echo"].model, both["fake:echo"].text) == ("echo", "slow answer from echo " * 5)
    assert (both["fake:other"].model, both["fake:other"].text) == ("other", "other: same prompt")
    if live == "text":
        # each model's answer as it finishes, under its own heading
        printed = dict(re.findall(r"== (\S+) ==\n(.*?)\n\[", capsys.readouterr().out, re.DOTALL))
        assert printed == {"fake:echo": "slow answer from echo " * 4 + "slow answer from echo",
                           "fake:other": "other: same prompt"}
        return
    assert len(shell.front.outputs) == 1
    md = shell.front.markdown[0]
    assert "| model | tokens in / out | latency |" in md
    assert list(table_rows(md)) == ["fake:echo", "fake:other"]
    answers = sections(md)
    assert list(answers) == ["fake:echo", "fake:other"]
    assert answers["fake:echo"].startswith("slow answer from echo " * 4)
    assert "other:" not in answers["fake:echo"]
    assert answers["fake:other"].startswith("other: same prompt") and "slow" not in answers["fake:other"]
    meta = shell.front.outputs[0]["metadata"]["dispatch_nb"]["compare"]
    assert [m["spec"] for m in meta] == ["fake:echo", "fake:other"]
    assert [m["model"] for m in meta] == ["echo", "other"]


def test_compare_reports_one_failing_model_in_the_table(shell: Any, fake: Any) -> None:
    run(shell, '%config ChatMagics.live = "display"')
    fake.push_for("b", Fail(400, "nope"))
    result = run(shell, "%%chat -m fake:a,fake:b -o answers\nq")
    assert result.success
    md = shell.front.markdown[0]
    rows = table_rows(md)
    assert "⚠" not in rows["fake:a"] and "end_turn" in rows["fake:a"]
    assert "⚠" in rows["fake:b"] and "nope" in rows["fake:b"]
    answers = sections(md)
    assert answers["fake:a"].startswith("a: q") and "⚠" not in answers["fake:a"]
    assert "⚠" in answers["fake:b"] and "nope" in answers["fake:b"] and "a: q" not in answers["fake:b"]
    answers_by_spec = shell.user_ns["answers"]  # every model: its Response, or the error it raised
    assert list(answers_by_spec) == ["fake:a", "fake:b"] and answers_by_spec["fake:a"].text == "a: q"
    failed = answers_by_spec["fake:b"]
    assert isinstance(failed, RequestError) and failed.status_code == 400 and "nope" in failed.message


def test_a_model_a_replay_miss_never_asked_shows_no_latency_in_the_terminal(
        shell: Any, fake: Any, capsys: Any) -> None:
    # (it printed "[0.0 s · ⚠ … no recorded answer …]", as if the model had answered at once)
    run(shell, '%config ChatMagics.live = "text"')
    result = run(shell, "%%chat -m fake:echo,fake:other --cache replay\nnever recorded")
    assert isinstance(result.error_in_exec, ChatError)
    footers = re.findall(r"== (\S+) ==\n+\[(.*?)\]\n", capsys.readouterr().out)
    assert sorted(spec for spec, _ in footers) == ["fake:echo", "fake:other"]
    assert all(footer.startswith("⚠ fake: no recorded answer") for _, footer in footers), footers
    assert fake.chat_requests == []


def test_works_after_await_cells_and_inside_a_running_loop(shell: Any, fake: Any) -> None:
    assert run(shell, "import asyncio\nawait asyncio.sleep(0.01)\nx = 5").success
    assert run(shell, "%%chat\nafter await {x}").success
    assert sent_messages(fake)[-1]["content"] == "after await 5"

    async def inside_loop() -> None:
        shell.run_cell_magic("chat", "--no-history", "from a running loop")

    asyncio.run(inside_loop())
    assert sent_messages(fake)[-1]["content"] == "from a running loop"
    assert run(shell, "await asyncio.sleep(0.01)\ny = 1").success


# -- subcommands ------------------------------------------------------------------------------------


def test_status_shows_the_default_and_no_secret(shell: Any, fake: Any, monkeypatch: Any) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret-value-123")
    monkeypatch.setenv("DISPATCH_NB_GITHUB_TOKEN", "gho_secrettoken456")
    run(shell, "%chat status")
    md = shell.front.markdown[0]
    assert "`fake:echo`" in md and "DISPATCH_NB_MODEL" in md
    assert "OPENAI_API_KEY` set" in md and "logged in" in md
    everything = json.dumps(shell.front.messages)
    assert "sk-secret" not in everything and "gho_secret" not in everything


def test_models_lists_the_providers_models(shell: Any, fake: Any) -> None:
    run(shell, "%chat models")
    assert "`fake:echo`" in shell.front.markdown[0] and "4,096" in shell.front.markdown[0]
    run(shell, "%chat models fake")
    assert "`fake:echo`" in shell.front.markdown[0]
    with pytest.raises(UsageError, match="unknown provider"):
        shell.run_line_magic("chat", "models nosuch")


def test_login_for_key_providers_explains_the_variable(shell: Any, fake: Any) -> None:
    run(shell, "%chat login openai")
    assert "OPENAI_API_KEY" in shell.front.markdown[0]


def test_tools_run_through_the_session_loop(shell: Any, fake: Any) -> None:
    pytest.importorskip("dispatch_nb.session")
    run(shell, '%config ChatMagics.live = "display"')
    run(shell, "def add(a: int, b: int) -> int:\n    '''Add two numbers.'''\n    return a + b")
    fake.push(Turn(tool_calls=[ToolCall("c1", "add", {"a": 2, "b": 3})]), Turn(text="It is 5."))
    result = run(shell, "%%chat --tools add\nwhat is 2+3?")
    assert result.success, result.error_in_exec
    assert fake.chat_requests[0].json["tools"][0]["name"] == "add"
    md = shell.front.markdown[0]
    assert "🔧 **add**" in md and "→ `5`" in md and "It is 5." in md and "2 rounds" in md
    run(shell, "%%chat\nand then?")
    roles = [m["role"] for m in sent_messages(fake)]
    assert roles == ["user", "assistant", "user", "assistant", "user"]


def test_a_context_name_that_is_not_defined_is_refused_before_sending(
        shell: Any, fake: Any) -> None:
    """``--context dff`` (a typo of df) is a UsageError naming the close name, as a wrong --tools
    name is: the model was given tools over nothing ("none of the allowed variables exist yet")
    and answered without the data, with no word to the user."""
    run(shell, "df = [1, 2, 3]")
    with pytest.raises(UsageError, match=r"--context dff: there is no 'dff' in the namespace "
                                         r"\(did you mean df\?\)"):
        shell.run_cell_magic("chat", "--context df,dff", "What is in df?")
    with pytest.raises(UsageError, match=r"--context .*needs the names"):
        shell.run_cell_magic("chat", "--context ' , '", "What is in df?")
    assert fake.chat_requests == []
    fake.push(Turn(tool_calls=[ToolCall("c1", "list_variables", {})]), Turn(text="A list."))
    assert run(shell, "%%chat --context df\nWhat is in df?").success
    assert "df: list" in json.dumps(fake.chat_requests[-1].json)


def test_tools_on_the_embedded_model_are_refused_in_the_magics_words(shell: Any, fake: Any) -> None:
    """The embedded model (the default with nothing set up) cannot call tools in its chat
    format: --tools / --context is a UsageError before anything runs, saying to choose another
    model with -m; it was the adapter's RequestError in the Python API's words
    (``LocalAdapter(..., chat_format=...)``, which a %%chat cell cannot pass)."""
    from dispatch_nb.providers.local import smollm2_path

    if smollm2_path() is None:
        pytest.skip("the embedded model's GGUF file is not installed")
    run(shell, 'def add(a: int, b: int) -> int:\n    """Add."""\n    return a + b\ndf = [1]')
    for options in ("--tools add", "--context df"):
        with pytest.raises(UsageError) as info:
            shell.run_cell_magic("chat", f"-m local:smollm2 {options}", "Add 2 and 40.")
        message = str(info.value)
        assert "local:smollm2 cannot call tools" in message and "-m openai:gpt-4.1" in message
        assert "LocalAdapter" not in message and "chat_format=" not in message


def test_a_comparisons_approval_question_names_the_model_that_asks(
        shell: Any, fake: Any, capsys: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """With -m a,b each model's call is asked about; the question says which model made it (two
    models may make the very same call, and one is approved, the other denied)."""
    import io

    run(shell, 'def add(a: int, b: int) -> int:\n    """Add."""\n    return a + b')
    for model in ("echo", "other"):
        fake.push_for(model, Turn(tool_calls=[ToolCall(f"{model}-1", "add", {"a": 2, "b": 40})]),
                      Turn(text=f"{model} done"))
    monkeypatch.setattr(sys, "stdin", io.StringIO("y\ny\n"))
    assert run(shell, "%%chat -m fake:echo,fake:other --tools add --approve ask\nAdd.").success
    out = capsys.readouterr().out
    for spec in ("fake:echo", "fake:other"):
        assert out.count(f"Approve tool call add (asked by {spec})?") == 1, out
    assert "Approve tool call add?" not in out
    fake.push(Turn(tool_calls=[ToolCall("one-1", "add", {"a": 1, "b": 1})]), Turn(text="2"))
    monkeypatch.setattr(sys, "stdin", io.StringIO("y\n"))
    assert run(shell, "%%chat --tools add --approve ask\nAdd.").success
    assert "Approve tool call add?" in capsys.readouterr().out  # one model: no need to say


@pytest.mark.parametrize("live", ["display", "widget"])
def test_no_stream_with_tools_sends_without_streaming_and_shows_the_exchange(
    shell: Any, fake: Any, live: str
) -> None:
    pytest.importorskip("dispatch_nb.session")
    run(shell, f'%config ChatMagics.live = "{live}"')
    run(shell, "def add(a: int, b: int) -> int:\n    '''Add two numbers.'''\n    return a + b")
    fake.push(Turn(tool_calls=[ToolCall("c1", "add", {"a": 2, "b": 3})]), Turn(text="It is 5."))
    result = run(shell, "%%chat --tools add --no-stream -o answer\nwhat is 2+3?")
    assert result.success, result.error_in_exec
    assert [r.json["stream"] for r in fake.chat_requests] == [False, False]
    assert fake.chat_requests[0].json["tools"][0]["name"] == "add"
    assert len(shell.front.outputs) == 1  # one static output, no widget left behind
    output = shell.front.outputs[0]
    assert WIDGET_MIME not in output["data"]
    md = output["data"]["text/markdown"]
    assert "🔧 **add**" in md and "→ `5`" in md and "It is 5." in md and "2 rounds" in md
    assert md.index("🔧 **add**") < md.index("It is 5.")
    meta = output["metadata"]["dispatch_nb"]
    assert meta["rounds"] == 2
    last_round = shell.user_ns["answer"].usage.input_tokens
    assert meta["usage"]["input_tokens"] > last_round  # both rounds' tokens, not only the last's
    run(shell, "%%chat\nand then?")
    roles = [m["role"] for m in sent_messages(fake)]
    assert roles == ["user", "assistant", "user", "assistant", "user"]


def test_unknown_tool_name(shell: Any, fake: Any) -> None:
    pytest.importorskip("dispatch_nb.tools")
    error = run(shell, "%%chat --tools nothing_here\nhi").error_in_exec
    assert isinstance(error, UsageError) and str(error).startswith(
        "--tools nothing_here: there is no 'nothing_here' in the namespace. No functions are "
        "defined here yet. --tools takes functions"), error
    # what exists is named: the notebook's functions and @tool objects, not imported ones
    run(shell, "from dispatch_nb import tool\nfrom os.path import join\n"
               "@tool\ndef add(a: int, b: int) -> int:\n    return a + b\n"
               "def weather(city: str) -> str:\n    return 'sunny'")
    error = run(shell, "%%chat --tools weathr\nhi").error_in_exec
    assert isinstance(error, UsageError) and "(did you mean weather?). Functions defined here: " \
        "add, weather. --tools takes" in str(error), error
    assert fake.chat_requests == []


def test_cache_records_then_replays_without_the_model(shell: Any, fake: Any, tmp_path: Any) -> None:
    run(shell, '%config ChatMagics.live = "display"')
    fake.push(Turn(text="a recorded answer"))
    assert run(shell, "%%chat --cache record --no-history\nremember this").success
    assert len(fake.chat_requests) == 1
    assert "remember this" in (tmp_path / "answers.dispatch-cache.jsonl").read_text()
    assert run(shell, "%%chat --cache replay --no-history\nremember this").success
    assert len(fake.chat_requests) == 1  # answered from the file
    assert "a recorded answer" in shell.front.markdown[0]
    error = run(shell, "%%chat --cache replay --no-history\nnever asked").error_in_exec
    assert isinstance(error, ChatError) and "--cache read-write" in error.fix
    assert "In[" in error.message  # the miss names the cell
    run(shell, '%config ChatMagics.cache = "replay"')
    run(shell, "%chat status")
    assert "`replay` — `" in shell.front.markdown[0]


def test_a_replay_miss_whose_prompt_is_recorded_after_another_conversation_says_so(
    shell: Any, fake: Any, tmp_path: Any
) -> None:
    """The prompt is recorded, but the thread before it differs (an extra cell was run first):
    the miss says so in the magic's words and points at --no-history / a fresh kernel."""
    run(shell, '%config ChatMagics.live = "display"')
    prompt = "Explain recursion in one sentence."
    assert run(shell, f'%%chat --cache record -s "Answer briefly."\n{prompt}').success
    assert run(shell, "%chat reset").success
    assert run(shell, "%%chat\nHi").success  # one extra cell in the thread
    sent = len(fake.chat_requests)
    error = run(shell, f'%%chat --cache replay -s "Answer briefly."\n{prompt}').error_in_exec
    assert isinstance(error, ChatError) and error.title == "CacheMissError", error
    assert len(error._render_traceback_()) == 2  # what is missing, then the fix
    assert prompt in error.message and "answers.dispatch-cache.jsonl" in error.message
    assert ("this prompt is recorded there for this model, but after a different conversation: "
            "no earlier message before it, this cell sends 2 earlier messages") in error.message
    assert "--no-history" in error.fix and "--new" in error.fix
    assert "run the notebook from the top" in error.fix
    assert "Session" not in error.message + error.fix  # the magic's words, not Python's
    # what the fix says works
    assert run(shell, f'%%chat --cache replay --no-history -s "Answer briefly."\n{prompt}').success
    # the other way round: recorded after a turn, replayed in a fresh thread
    assert run(shell, "%%chat --cache record\nWhat is a stack?").success
    assert run(shell, "%chat reset").success
    error = run(shell, "%%chat --cache replay\nWhat is a stack?").error_in_exec
    assert isinstance(error, ChatError) and error.title == "CacheMissError", error
    assert "no earlier message" in error.message and "--cache read-write" in error.fix
    assert "Restart the kernel and run the notebook from the top" in error.fix
    assert len(fake.chat_requests) == sent + 1  # the recording; replay sent nothing


def test_a_cache_file_that_does_not_exist_is_named_not_taken_for_a_changed_prompt(
    shell: Any, fake: Any, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The recording is elsewhere (moved, or the kernel started in another folder): the miss
    says the file does not exist and where it looked, and the fix is the path, not recording
    (which would start a new file in the wrong place); ``%chat status`` says so too."""
    monkeypatch.chdir(tmp_path)
    run(shell, "%config ChatMagics.cache_file = 'data/lesson.dispatch-cache.jsonl'")
    error = run(shell, "%%chat --cache replay\nHi").error_in_exec
    assert isinstance(error, ChatError) and error.title == "CacheMissError", error
    where = str(tmp_path / "data" / "lesson.dispatch-cache.jsonl")
    assert "does not exist" in error.message and where in error.message, error.message
    assert "ChatMagics.cache_file" in error.fix and "--cache off" not in error.fix
    assert error.fix.index("cache_file") < error.fix.index("--cache record")  # the path first
    assert not (tmp_path / "data").exists() and fake.chat_requests == []
    run(shell, "%config ChatMagics.cache = 'replay'")
    run(shell, "%chat status")
    assert f"(does not exist: looked for `{where}`)" in shell.front.markdown[-1]


def test_a_wrong_cache_mode_is_one_line_with_a_guess(
    shell: Any, fake: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DISPATCH_NB_CACHE", "readwrite")
    error = run(shell, "%%chat\nHi").error_in_exec
    assert isinstance(error, UsageError), error
    assert str(error) == ("DISPATCH_NB_CACHE='readwrite' is not a cache mode (did you mean "
                          "read-write?); use one of off, read-write, replay, record")
    assert run(shell, "%chat status").success  # status says it rather than failing
    assert "⚠ DISPATCH_NB_CACHE='readwrite' is not a cache mode" in shell.front.markdown[-1]
    assert fake.chat_requests == []


def test_a_replay_miss_whose_prompt_differs_only_in_spacing_says_so(
    shell: Any, fake: Any
) -> None:
    """Recorded with two spaces, replayed with one: the preview shows both alike, so the miss
    says the spacing differs (not "the conversation, the system prompt, the tools or an
    option")."""
    run(shell, '%config ChatMagics.live = "display"')
    cell = ("%%chat -t intro --new --max-tokens 80 --cache {}\n"
            "What is photosynthesis?{}Answer in two sentences.")
    assert run(shell, cell.format("record", "  ")).success
    error = run(shell, cell.format("replay", " ")).error_in_exec
    assert isinstance(error, ChatError) and error.title == "CacheMissError", error
    assert ("this prompt is recorded there for this model with other spaces or line breaks"
            in error.message)
    assert "after as many messages" not in error.message
    assert "spaces and line breaks it was recorded with" in error.fix
    assert "--cache read-write" in error.fix
    assert run(shell, cell.format("replay", "  ")).success  # what the fix says works


def test_a_replay_miss_after_an_earlier_cell_of_the_thread_failed_names_that_cell(
    shell: Any, fake: Any
) -> None:
    """Cell 2's prompt was edited (it misses), then cell 3 of the same thread runs: its miss is
    that cell 2's turn is not in the conversation, so the fix names cell 2 instead of "restart the
    kernel and run the notebook from the top" (cell 2 would miss again)."""
    run(shell, '%config ChatMagics.live = "display"')
    cells = [("c1", "%%chat -t intro --new --cache {}\nWhat is a cell?"),
             ("c2", "%%chat -t intro --cache {}\nName its parts."),
             ("c3", "%%chat -t intro --cache {}\nWhich part makes energy?")]
    for cell_id, source in cells:
        assert run(shell, source.format("record"), cell_id=cell_id).success
    assert run(shell, "%chat reset intro").success  # as in a fresh kernel
    assert run(shell, cells[0][1].format("replay"), cell_id="c1").success
    edited = run(shell, "%%chat -t intro --cache replay\nName all its parts.", cell_id="c2")
    assert isinstance(edited.error_in_exec, ChatError)
    for _ in range(2):  # and again: the cell itself failing twice does not hide cell 2
        error = run(shell, cells[2][1].format("replay"), cell_id="c3").error_in_exec
        assert isinstance(error, ChatError) and error.title == "CacheMissError", error
        assert "but after a different conversation" in error.message
        assert (f"In[{edited.execution_count}], an earlier cell of this thread, got no answer"
                in error.fix), error.fix
        assert "Restart the kernel" not in error.fix
    # what the fix says works: cell 2 as recorded, then cell 3
    assert run(shell, cells[1][1].format("replay"), cell_id="c2").success
    assert run(shell, cells[2][1].format("replay"), cell_id="c3").success


def test_a_replayed_answer_says_replayed_instead_of_a_latency(shell: Any, fake: Any) -> None:
    run(shell, '%config ChatMagics.live = "display"')
    fake.push(Turn(text="a recorded answer"))
    assert run(shell, "%%chat --cache read-write --no-history\nremember this").success
    recorded = shell.front.outputs[0]
    assert len(fake.chat_requests) == 1
    assert "replayed" not in recorded["data"]["text/markdown"]
    assert re.search(r"\d+\.\d s", recorded["metadata"]["dispatch_nb"]["footer"])
    assert "replayed" not in recorded["metadata"]["dispatch_nb"]
    for mode in ("replay", "read-write"):  # a read-write hit is a replay too
        assert run(shell, f"%%chat --cache {mode} --no-history\nremember this").success
        assert len(fake.chat_requests) == 1
        [output] = shell.front.outputs
        footer = output["metadata"]["dispatch_nb"]["footer"]
        assert footer.endswith(" out tokens · replayed"), footer
        assert not re.search(r"\d+\.\d s", footer)
        assert f"<sub>{footer}</sub>" in output["data"]["text/markdown"]
        assert output["metadata"]["dispatch_nb"]["replayed"] is True
    # In a comparison, the replayed model's latency column says so.
    run(shell, "%%chat --cache read-write --no-history -m fake:echo,fake:second\nremember this")
    [output] = shell.front.outputs
    answers = sections(output["data"]["text/markdown"])
    assert answers["fake:echo"].startswith("a recorded answer")  # from the cache
    assert answers["fake:second"].startswith("second: remember this")  # from the model
    assert [r.json["model"] for r in fake.chat_requests] == ["echo", "second"]
    rows = output["data"]["text/markdown"].split("\n")
    echo = next(r for r in rows if r.startswith("| `fake:echo"))
    second = next(r for r in rows if r.startswith("| `fake:second"))
    assert "| replayed |" in echo and "| replayed |" not in second
    facts = output["metadata"]["dispatch_nb"]["compare"]
    assert facts[0]["replayed"] is True and "replayed" not in facts[1]


# -- bare model names and the default provider (%chat status) ----------------------------------------


@pytest.fixture
def openai_only(fake: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """No DISPATCH_NB_MODEL, no GitHub login: only OPENAI_API_KEY (for a loopback Responses
    server), as a new user with an OpenAI account has it."""
    from tests.fakes.openai_responses import OpenAIResponsesFake

    with OpenAIResponsesFake(api_key="sk-test-openai-only-0000") as server:
        monkeypatch.delenv("DISPATCH_NB_MODEL")
        monkeypatch.delenv("OPENAI_BACKEND", raising=False)
        monkeypatch.setenv("OPENAI_API_KEY", "sk-test-openai-only-0000")
        monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
        yield server


def test_a_bare_model_name_goes_to_the_default_provider_status_shows(
    shell: Any, openai_only: Any, capsys: Any
) -> None:
    run(shell, "%config ChatMagics.login_on_demand = False")  # a Copilot call must not log in
    run(shell, "%chat status")
    assert "`openai:gpt-4.1` — OPENAI_API_KEY is set" in shell.front.markdown[0]
    result = run(shell, "%%chat -m gpt-4.1-mini\nhi")
    assert result.error_in_exec is None, result.error_in_exec
    assert openai_only.chat_requests[-1].json["model"] == "gpt-4.1-mini"
    assert "echo: hi" in capsys.readouterr().out


def test_a_refused_rows_reason_reads_plainly_in_text(shell: Any, openai_only: Any) -> None:
    """An ``--each`` row's error in the table's text/plain (what a terminal prints) has no HTML
    entities: ``>=``, not ``&gt;=`` (the Markdown keeps them escaped)."""
    run(shell, "%config ChatMagics.login_on_demand = False\nrows = ['a', 'b']")
    assert run(shell, "%%chat --each rows --max-tokens 10 -m openai:gpt-4.1\nSay {row}")
    data = shell.front.outputs[-1]["data"]
    assert "needs max_tokens >= 16" in data["text/plain"] and "&gt;" not in data["text/plain"]
    assert "needs max_tokens &gt;= 16" in data["text/markdown"]


def test_a_bare_model_name_with_nothing_set_up_is_refused(
    shell: Any, fake: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DISPATCH_NB_MODEL")
    for name in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # the local extra is not installed
    error = run(shell, "%%chat -m gpt4\nhi").error_in_exec
    assert isinstance(error, ChatError), error
    assert "no provider is set up here" in error.message
    assert "'copilot:MODEL' (after `%chat login`)" in error.message
    assert "'openai:MODEL' (OPENAI_API_KEY)" in error.message
    assert shell.front.markdown == [] or "Sign in" not in "".join(shell.front.markdown)


def test_a_vendors_bare_model_name_without_its_key_says_which_provider_in_the_magics_words(
    shell: Any, fake: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No credentials, the embedded model the default: ``%%chat -m gpt-4.1`` names OpenAI
    (``-m openai:gpt-4.1``, ``%chat key openai``) and Copilot (``%chat login``), never a GGUF
    file or ``connect(...)``, and sends nothing."""
    monkeypatch.setenv("DISPATCH_NB_MODEL", "local:smollm2")
    for name in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    error = run(shell, "%%chat -m gpt-4.1\nHi").error_in_exec
    assert isinstance(error, ChatError), error
    assert error.title == "ProviderNotSetUpError"
    assert "'openai:gpt-4.1'" in error.message and "nothing was sent" in error.message
    assert "-m openai:gpt-4.1 after `%chat key openai`" in error.fix
    assert "OPENAI_API_KEY" in error.fix
    assert "-m copilot:gpt-4.1 after `%chat login copilot`" in error.fix
    shown = error.message + error.fix
    for python_words in ("connect(", "api_key=", "model_path", "GGUF", "gguf"):
        assert python_words not in shown, shown
    assert fake.chat_requests == []
    # with only OpenAI's key, a Claude name is refused too (it is not sent to OpenAI)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-magic-vendor-0000")
    monkeypatch.delenv("DISPATCH_NB_MODEL")
    error = run(shell, "%%chat -m claude-sonnet-4-5\nHi").error_in_exec
    assert isinstance(error, ChatError), error
    assert "-m anthropic:claude-sonnet-4-5 after `%chat key anthropic`" in error.fix


def test_a_vendors_bare_model_name_replays_without_its_key(
    shell: Any, fake: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A replay sends nothing, so ``-m gpt-4.1`` needs no key there: it is OpenAI's model, and
    the miss (nothing recorded) names ``openai:gpt-4.1``."""
    monkeypatch.setenv("DISPATCH_NB_MODEL", "local:smollm2")
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    error = run(shell, "%%chat --cache replay -m gpt-4.1\nHi").error_in_exec
    assert isinstance(error, ChatError), error
    assert error.title == "CacheMissError" and "openai:gpt-4.1" in error.message


def test_a_bare_model_name_replays_as_the_provider_that_recorded_it(
    shell: Any, fake: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Any, capsys: Any
) -> None:
    """A teacher logged in to GitHub Copilot records ``-m gpt-4.1`` (Copilot's, the default
    there); a student with no login and no key replays it: the bare name is the recording's
    provider, not OpenAI's, and nothing is sent."""
    from tests.fakes.copilot import CopilotFake

    run(shell, "%config ChatMagics.login_on_demand = False")
    monkeypatch.setenv("DISPATCH_NB_HOME", str(tmp_path / "dnb"))
    for name in ("DISPATCH_NB_MODEL", "OPENAI_API_KEY", "ANTHROPIC_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    with CopilotFake() as copilot:
        copilot.push(Turn(text="Recorded through Copilot."))
        monkeypatch.setenv("DISPATCH_NB_GITHUB_TOKEN", copilot.github.github_token)
        monkeypatch.setenv("DISPATCH_NB_GITHUB_URL", copilot.github.github_url)
        monkeypatch.setenv("DISPATCH_NB_GITHUB_API_URL", copilot.github.api_url)
        assert run(shell, "%%chat --cache record --no-history -m gpt-4.1\nHi").success
        assert len(copilot.chat_requests) == 1
    assert "Recorded through Copilot." in capsys.readouterr().out
    for name in ("DISPATCH_NB_GITHUB_TOKEN", "DISPATCH_NB_GITHUB_URL", "DISPATCH_NB_GITHUB_API_URL"):
        monkeypatch.delenv(name)
    monkeypatch.setenv("DISPATCH_NB_MODEL", "local:smollm2")  # the student's default
    run(shell, "%chat reset")
    result = run(shell, "%%chat --cache replay --no-history -m gpt-4.1\nHi")
    assert result.error_in_exec is None, result.error_in_exec
    assert "Recorded through Copilot." in capsys.readouterr().out
    # a name no recording has still resolves as without a cache (a vendor's: its vendor's)
    error = run(shell, "%%chat --cache replay --no-history -m gpt-4.1-mini\nHi").error_in_exec
    assert isinstance(error, ChatError) and "openai:gpt-4.1-mini" in error.message, error


def test_a_claude_model_answered_by_a_gateway_names_the_gateway_in_its_footer(
    shell: Any, fake: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Logged in to GitHub Copilot (the default provider), ``-m claude-sonnet-4`` is Copilot's
    (it serves Anthropic's model names): the footer, the live status line and a later look at
    ``-o``'s answer say ``copilot:claude-sonnet-4``, not Anthropic's bare name, so the reader sees
    where it ran."""
    from tests.fakes.copilot import CopilotFake

    run(shell, '%config ChatMagics.live = "display"')
    for name in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    with CopilotFake() as copilot:
        copilot.push(Turn(text="Answered by Copilot."))
        monkeypatch.setenv("DISPATCH_NB_MODEL", "copilot:gpt-4.1")
        monkeypatch.setenv("DISPATCH_NB_GITHUB_TOKEN", copilot.github.github_token)
        monkeypatch.setenv("DISPATCH_NB_GITHUB_URL", copilot.github.github_url)
        monkeypatch.setenv("DISPATCH_NB_GITHUB_API_URL", copilot.github.api_url)
        result = run(shell, "%%chat -m claude-sonnet-4 --no-history -o answer\nWho answers?")
        assert result.success, result.error_in_exec
        assert copilot.chat_requests[-1].json["model"] == "claude-sonnet-4"
    [output] = shell.front.outputs
    footer = output["metadata"]["dispatch_nb"]["footer"]
    assert footer.startswith("copilot:claude-sonnet-4 · "), footer
    assert small(html.escape(footer)) in output["data"]["text/markdown"]
    live = [b["data"]["text/markdown"] for kind, b in shell.front.messages
            if kind in ("display", "update") and "text/markdown" in b["data"]]
    assert any("**copilot:claude-sonnet-4** · " in md for md in live), live
    assert shell.user_ns["answer"]._repr_markdown_().endswith(
        small(html.escape(footer.rsplit(" · ", 1)[0])))  # (an answer has no latency)


def test_a_changed_default_provider_is_said_once(
    shell: Any, fake: Any, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    monkeypatch.delenv("DISPATCH_NB_MODEL")
    for name in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    first = run(shell, "%%chat -m fake:echo\nhi")
    assert first.error_in_exec is None
    assert "default model is now" not in capsys.readouterr().out
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test-note-0000")  # e.g. %chat key anthropic
    run(shell, "%%chat -m fake:echo\nagain")
    lines = capsys.readouterr().out.splitlines()
    assert ("ℹ The default model is now anthropic:claude-sonnet-4-5 (ANTHROPIC_API_KEY is set): "
            "-m with a bare model name now means Anthropic.") in lines
    run(shell, "%%chat -m fake:echo\nonce more")
    assert "default model is now" not in capsys.readouterr().out
