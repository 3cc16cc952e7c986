"""``%chat mcp`` and ``%%chat --mcp / --approve / --context`` in a real kernel (nbclient), with the
SDK-written MCP server over stdio and the canonical loopback fake as the model."""

from __future__ import annotations

import json
import os
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from nbformat.v4 import new_code_cell, new_notebook

from tests.fakes.canonical import CanonicalFake
from tests.fakes.provider import ToolCall, Turn
from tests.kernels import IPCKernelManager, notebook_client
from tests.notebook.conftest import chat_env

from .conftest import SDK_SERVER

pytestmark = [pytest.mark.kernel, pytest.mark.timeout(240)]

WIDGET = "application/vnd.jupyter.widget-view+json"


@pytest.fixture
def fake() -> Iterator[CanonicalFake]:
    # one per test (each starts its own kernel): a turn one test leaves unanswered (a deadline
    # denial) must not answer the next test's cell, in whatever order they run
    with CanonicalFake() as server:
        yield server


def tool_results(fake: CanonicalFake) -> list[dict[str, Any]]:
    last = fake.chat_requests[-1].json["messages"][-1]
    return [b for b in last["content"] if b.get("type") == "tool_result"]


def text(cell: Any) -> str:
    return json.dumps(cell.get("outputs", []))


def test_mcp_approval_and_context_in_a_kernel(fake: CanonicalFake, tmp_path: Path) -> None:
    target = tmp_path / "touched.txt"
    cells = [
        "%load_ext dispatch_nb",
        f"%chat mcp add calc -- {sys.executable} {SDK_SERVER} stdio",
        "%%chat --mcp calc --approve auto\nAdd 2 and 3.",
        "%%chat --mcp calc\nTouch a file.",
        "import pandas as pd\ndf = pd.DataFrame({'price': [1.5, 2.5, 4.0]})\nsecret = 'hush-123'",
        "%%chat --context df\nWhat is in df?",
        "%chat mcp list",
        "%chat mcp remove calc",
    ]
    nb = new_notebook(cells=[new_code_cell(source) for source in cells])
    env = chat_env()
    env.update({"DISPATCH_NB_FAKE_URL": fake.url, "DISPATCH_NB_MODEL": "fake:echo",
                "DISPATCH_NB_HOME": str(tmp_path / "home"), "HOME": str(tmp_path)})
    client = notebook_client(nb, timeout=120, allow_errors=False)
    with client.setup_kernel(env=env, cwd=str(tmp_path)):
        for index in (0, 1):
            client.execute_cell(nb.cells[index], index)
        fake.push(Turn(tool_calls=[ToolCall("k1", "add", {"a": 2, "b": 3})]), Turn(text="It is 5."))
        client.execute_cell(nb.cells[2], 2)
        assert [r["content"] for r in tool_results(fake)] == ["5"]
        fake.push(Turn(tool_calls=[ToolCall("k2", "touch", {"path": str(target)})]),
                  Turn(text="Denied."))
        client.execute_cell(nb.cells[3], 3)
        denial = tool_results(fake)[0]
        # nbclient cannot ask: no user denied it (this assertion read "the user denied it" until
        # that text was found false: tests/notebook/test_approval_kernel.py)
        assert denial["is_error"] and "touch was not run: " in denial["content"]
        assert "the user denied it" not in denial["content"]
        assert "cannot ask" in denial["content"]  # nbclient has no input box
        client.execute_cell(nb.cells[4], 4)
        fake.push(Turn(tool_calls=[ToolCall("k3", "describe", {"name": "df"}),
                                   ToolCall("k4", "describe", {"name": "secret"}),
                                   ToolCall("k5", "list_variables", {})]), Turn(text="Prices."))
        client.execute_cell(nb.cells[5], 5)
        described, refused, listed = tool_results(fake)
        for index in (6, 7):
            client.execute_cell(nb.cells[index], index)
    assert not target.exists()  # the denied call never ran
    assert "It is 5." in text(nb.cells[2])
    assert "touch was not run: this front end cannot ask" in text(nb.cells[3])
    sent = described["content"]
    assert "shape: (3, 1)" in sent and "price" in sent and "describe():" in sent
    assert refused["is_error"] and "hush-123" not in json.dumps(fake.chat_requests[-1].json)
    assert listed["content"] == "df: DataFrame"
    shown = nb.cells[5].outputs[0].data["text/markdown"]
    assert f"```\n{sent}\n```" in shown  # the folded result shows exactly what the fake received
    # the decision is saved, in the words the model read (no one denied it: no "denied")
    saved = nb.cells[3].outputs[0].data["text/markdown"]
    assert "touch was not run: this front end cannot ask" in saved and "denied" not in saved
    assert "calc: running" in text(nb.cells[6]) and "add, fail" in text(nb.cells[6])
    assert "removed MCP server calc" in text(nb.cells[7])


def test_session_context_in_a_kernel(fake: CanonicalFake, tmp_path: Path) -> None:
    """``Session(context="df")`` opened in a notebook cell: the model reads ``df`` of the kernel
    (the fake receives its description) and nothing else (``secret`` is refused)."""
    cells = [
        "import pandas as pd\ndf = pd.DataFrame({'price': [1.5, 2.5, 4.0]})\nsecret = 'hush-123'",
        "from dispatch_nb import Session\n"
        "session = Session('fake:echo', context='df')\n"
        "print(session.send('What is in df?').text)",
    ]
    nb = new_notebook(cells=[new_code_cell(source) for source in cells])
    env = chat_env()
    env.update({"DISPATCH_NB_FAKE_URL": fake.url, "DISPATCH_NB_HOME": str(tmp_path / "home"),
                "HOME": str(tmp_path)})
    fake.push(Turn(tool_calls=[ToolCall("x1", "describe", {"name": "df"}),
                               ToolCall("x2", "describe", {"name": "secret"})]),
              Turn(text="Three prices."))
    notebook_client(nb, timeout=120).execute(env=env, cwd=str(tmp_path))
    described, refused = tool_results(fake)
    assert "shape: (3, 1)" in described["content"] and "price" in described["content"]
    assert refused["is_error"] and "hush-123" not in json.dumps(fake.chat_requests[-1].json)
    assert "Three prices." in text(nb.cells[1])


def without_ipywidgets(env: dict[str, str], tmp_path: Path) -> None:
    """Make ``import ipywidgets`` fail in the kernel ``env`` starts (a kernel without it)."""
    shadow = tmp_path / "no-ipywidgets" / "ipywidgets"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('ipywidgets is not installed')\n")
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(shadow.parent), env.get("PYTHONPATH", "")) if p
    )


def test_ask_in_a_kernel_with_an_input_box(fake: CanonicalFake, tmp_path: Path) -> None:
    """Without ipywidgets, a front end with an input box (stdin) is asked there: "n" denies (the
    file is never made), "a" approves this tool for the rest of the kernel (a later cell's call
    is not asked about)."""
    target = tmp_path / "touched.txt"
    env = chat_env()
    env.update({"DISPATCH_NB_FAKE_URL": fake.url, "DISPATCH_NB_MODEL": "fake:echo",
                "DISPATCH_NB_HOME": str(tmp_path / "home"), "HOME": str(tmp_path)})
    without_ipywidgets(env, tmp_path)
    km = IPCKernelManager(kernel_name="python3")
    km.start_kernel(env=env, cwd=str(tmp_path))
    kc = km.client()
    kc.start_channels()
    prompts: list[str] = []
    answers: list[str] = []

    def run(code: str) -> str:
        out: list[str] = []

        def on_stdin(msg: dict[str, Any]) -> None:
            prompts.append(msg["content"]["prompt"])
            kc.input(answers.pop(0))

        def on_output(msg: dict[str, Any]) -> None:
            out.append(json.dumps(msg["content"]))

        reply = kc.execute_interactive(code, allow_stdin=True, stdin_hook=on_stdin,
                                       output_hook=on_output, timeout=120)
        assert reply["content"]["status"] == "ok", reply["content"]
        return "".join(out)

    try:
        kc.wait_for_ready(timeout=60)
        run("%load_ext dispatch_nb")
        run(f"%chat mcp add calc -- {sys.executable} {SDK_SERVER} stdio")
        fake.push(Turn(tool_calls=[ToolCall("s1", "touch", {"path": str(target)})]),
                  Turn(text="ok"))
        answers.append("n")
        shown = run("%%chat --mcp calc\nTouch it.")
        assert not target.exists() and len(prompts) == 1
        assert str(target).replace("\\", "\\\\") in shown  # the arguments were shown in full
        assert tool_results(fake)[0]["content"] == "touch was not run: the user denied it"
        fake.push(Turn(tool_calls=[ToolCall("s2", "add", {"a": 1, "b": 2})]), Turn(text="3"))
        answers.append("a")
        run("%%chat --mcp calc\nAdd.")
        assert tool_results(fake)[0]["content"] == "3" and len(prompts) == 2
        fake.push(Turn(tool_calls=[ToolCall("s3", "add", {"a": 2, "b": 2})]), Turn(text="4"))
        run("%%chat --mcp calc\nAdd again.")
        assert tool_results(fake)[0]["content"] == "4" and len(prompts) == 2  # always holds
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def test_buttons_in_a_kernel(fake: CanonicalFake, tmp_path: Path) -> None:
    """A front end that asks (stdin allowed) gets Approve / Deny / Always buttons while the cell
    runs; their clicks (comm messages, as JupyterLab sends them) reach the kernel although the
    cell is busy. Deny: the file is never made; Always: a later cell's call is not asked about;
    no click before the deadline: a denial."""
    target = tmp_path / "touched.txt"
    env = chat_env()
    env.update({"DISPATCH_NB_FAKE_URL": fake.url, "DISPATCH_NB_MODEL": "fake:echo",
                "DISPATCH_NB_HOME": str(tmp_path / "home"), "HOME": str(tmp_path)})
    km = IPCKernelManager(kernel_name="python3")
    km.start_kernel(env=env, cwd=str(tmp_path))
    kc = km.client()
    kc.start_channels()
    asked: list[str] = []  # the headline of each set of buttons shown
    clicks: list[str] = []  # which button to click, in order
    lock = threading.Lock()

    def run(code: str, ok: bool = True) -> str:
        out: list[str] = []
        buttons: dict[str, str] = {}  # description -> comm id

        def on_output(msg: dict[str, Any]) -> None:
            out.append(json.dumps(msg["content"]))
            if msg["msg_type"] == "comm_open":
                state = msg["content"]["data"].get("state", {})
                if "Approve tool call" in str(state.get("value", "")):
                    asked.append(state["value"])
                if state.get("_model_name") == "ButtonModel":
                    buttons[state["description"]] = msg["content"]["comm_id"]
            shown = msg["content"].get("data", {})
            if msg["msg_type"] == "display_data" and WIDGET in shown:  # on screen: click
                with lock:
                    wanted = clicks[0] if clicks and clicks[0] in buttons else None
                    if wanted is not None:
                        clicks.pop(0)
                if wanted is not None:
                    kc.shell_channel.send(kc.session.msg("comm_msg", {
                        "comm_id": buttons.pop(wanted),
                        "data": {"method": "custom", "content": {"event": "click"}}}))

        reply = kc.execute_interactive(code, allow_stdin=True, output_hook=on_output,
                                       stdin_hook=lambda msg: None, timeout=120)
        assert not ok or reply["content"]["status"] == "ok", reply["content"]
        return "".join(out)

    try:
        kc.wait_for_ready(timeout=60)
        run("%load_ext dispatch_nb")
        run(f"%chat mcp add calc -- {sys.executable} {SDK_SERVER} stdio")
        fake.push(Turn(tool_calls=[ToolCall("w1", "touch", {"path": str(target)})]),
                  Turn(text="ok"))
        clicks.append("Deny")
        shown = run("%%chat --mcp calc\nTouch it.")
        assert not target.exists() and len(asked) == 1, "the denied tool ran"
        assert "touch" in asked[0] and str(target) in asked[0]  # the arguments, in full
        assert tool_results(fake)[0]["content"] == "touch was not run: the user denied it"
        # the decision replaces the buttons: the result the model read, with no "denied:" chip
        assert "touch was not run: the user denied it" in shown and "said no" not in shown
        fake.push(Turn(tool_calls=[ToolCall("w2", "add", {"a": 1, "b": 2})]), Turn(text="3"))
        clicks.append("Always allow add")
        shown = run("%%chat --mcp calc\nAdd.")
        assert tool_results(fake)[0]["content"] == "3" and len(asked) == 2
        assert "approved (always)" in shown
        fake.push(Turn(tool_calls=[ToolCall("w3", "add", {"a": 2, "b": 2})]), Turn(text="4"))
        run("%%chat --mcp calc\nAdd again.")
        assert tool_results(fake)[0]["content"] == "4" and len(asked) == 2  # always holds
        session_cell = (  # a Session used in a cell asks with the same buttons
            "from dispatch_nb import Session\nfrom dispatch_nb.mcp import MCPServer\n"
            f"server = MCPServer.stdio({sys.executable!r}, {str(SDK_SERVER)!r}, 'stdio')\n"
            "with Session('fake:echo', tools=[server]) as session:\n"
            "    print(session.send('Touch it.').text)")
        fake.push(Turn(tool_calls=[ToolCall("w5", "touch", {"path": str(target)})]),
                  Turn(text="not touched"))
        clicks.append("Deny")
        shown = run(session_cell)
        assert len(asked) == 3 and "not touched" in shown and not target.exists()
        assert tool_results(fake)[0]["content"] == "touch was not run: the user denied it"
        fake.push(Turn(tool_calls=[ToolCall("w4", "touch", {"path": str(target)})]),
                  Turn(text="late"))
        run("%config ChatMagics.timeout = 5")
        shown = run("%%chat --mcp calc\nTouch it, nobody will click.", ok=False)
        assert "touch was not run: no answer within the turn's deadline" in shown
        assert "user denied" not in shown  # nobody denied it: nobody answered
        assert not target.exists() and len(asked) == 4
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
