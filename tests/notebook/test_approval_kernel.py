"""``%%chat --approve ask`` as a person meets it, in real kernels and in terminal IPython, against
the loopback canonical fake scripting the model's tool call:

* a front end that cannot ask (nbclient, like ``jupyter execute``) shows no question, and the
  model and the user read that this front end cannot ask and what to do in a cell (the Python
  API's own advice where ``session.send()`` asks) — no user denied anything;
* while the buttons wait, the status line of each live view says so; the buttons leave no output
  behind once the cell has its final output;
* Ctrl-C while the question waits says one true thing: the call was not run because the cell was
  interrupted while it waited for approval (in a kernel and at the terminal's prompt).
"""

from __future__ import annotations

import io
import json
import os
import queue
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from nbformat.v4 import new_code_cell, new_notebook

from tests.fakes.canonical import CanonicalFake
from tests.fakes.provider import ToolCall, Turn
from tests.fakes.server import wait_for
from tests.kernels import IPCKernelManager, notebook_client
from tests.notebook.conftest import chat_env

pytestmark = [pytest.mark.kernel, pytest.mark.timeout(240)]

ADD = "def add(a: int, b: int) -> int:\n    '''Add two numbers.'''\n    return a + b"
CELL = "%%chat --tools add --approve ask\nAdd 2 and 40."
WIDGET = "application/vnd.jupyter.widget-view+json"
NOT_RUN = "add was not run: the cell was interrupted while it waited for approval"


@pytest.fixture
def fake() -> Iterator[CanonicalFake]:
    with CanonicalFake() as server:
        yield server


def env_for(fake: CanonicalFake, tmp_path: Path) -> dict[str, str]:
    env = chat_env()
    env.update({"DISPATCH_NB_FAKE_URL": fake.url, "DISPATCH_NB_MODEL": "fake:echo",
                "DISPATCH_NB_HOME": str(tmp_path / "home"), "HOME": str(tmp_path)})
    return env


def tool_result(fake: CanonicalFake) -> dict[str, Any]:
    """The one tool result the model got in the last request."""
    last = fake.chat_requests[-1].json["messages"][-1]
    [result] = [b for b in last["content"] if b.get("type") == "tool_result"]
    return dict(result)


def test_a_front_end_that_cannot_ask_shows_no_question_and_says_so(
    fake: CanonicalFake, tmp_path: Path
) -> None:
    cells = [
        "%load_ext dispatch_nb",
        ADD,
        CELL,
        "from dispatch_nb import Session\n"
        "with Session('fake:echo', tools=[add], approve='ask') as session:\n"
        "    print(session.send('Add 2 and 40.').text)",
    ]
    nb = new_notebook(cells=[new_code_cell(source) for source in cells])
    client = notebook_client(nb, timeout=120, allow_errors=False)  # allow_stdin: false
    with client.setup_kernel(env=env_for(fake, tmp_path), cwd=str(tmp_path)):
        for index in (0, 1):
            client.execute_cell(nb.cells[index], index)
        fake.push(Turn(tool_calls=[ToolCall("t1", "add", {"a": 2, "b": 40})]),
                  Turn(text="I could not add."))
        client.execute_cell(nb.cells[2], 2)
        in_cell = tool_result(fake)
        fake.push(Turn(tool_calls=[ToolCall("t2", "add", {"a": 2, "b": 40})]),
                  Turn(text="Not added."))
        client.execute_cell(nb.cells[3], 3)
        in_python = tool_result(fake)

    outputs = nb.cells[2].outputs
    assert [o.output_type for o in outputs] == ["display_data"], outputs  # no stray question
    assert "Approve tool call" not in json.dumps(outputs)
    said = in_cell["content"]
    assert in_cell["is_error"] and said.startswith(
        "add was not run: this front end cannot ask for approval")
    assert "--approve auto" in said and "where you can answer" in said
    assert "denied" not in said and "approval function" not in said
    assert "(" not in said  # no reason in parentheses, nested or not
    assert said in outputs[0].data["text/markdown"]  # the user reads what the model read
    assert "<details>" not in outputs[0].data["text/markdown"]  # next to the call, not folded
    # the Python API's words where session.send() asks
    assert "Approve tool call" not in json.dumps(nb.cells[3].outputs)
    assert "Not added." in json.dumps(nb.cells[3].outputs)
    said = in_python["content"]
    assert said.startswith("add was not run: this front end cannot ask for approval")
    assert "approve='auto' or an approval function" in said and "denied" not in said
    assert "--approve" not in said


def test_an_answer_after_the_deadline_changes_nothing() -> None:
    """The worker's wait ends at the turn's deadline: a click arriving just after it (the kernel
    thread's buttons) is not taken, so what the cell shows is what the worker did."""
    from dispatch_nb.approval import ToolCall as Call
    from dispatch_nb.notebook.approval import NO_ANSWER, ApprovalRequest, ask, asking_through

    asked: list[ApprovalRequest] = []
    token = asking_through(asked.append)  # the cell's queue: nobody answers in time
    try:
        answer = ask(Call(id="d1", name="add", arguments={"a": 1}), 0.05)
    finally:
        from dispatch_nb.notebook import approval

        approval._emit.reset(token)
    [request] = asked
    assert answer == NO_ANSWER
    assert request.settle(True) is False  # the late click
    assert request.answer == NO_ANSWER


# -- a front end that asks: the buttons -----------------------------------------------------------


class Kernel:
    """A kernel driven like JupyterLab drives it (stdin allowed); ``click`` clicks a button as
    JupyterLab sends the click (a comm message)."""

    def __init__(self, env: dict[str, str], cwd: Path) -> None:
        self.km = IPCKernelManager(kernel_name="python3")
        self.km.start_kernel(env=env, cwd=str(cwd))
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=60)

    def run(self, code: str, timeout: float = 60) -> None:
        """Execute ``code`` and wait until the kernel is idle again."""
        reply = self.kc.execute_interactive(code, allow_stdin=True, timeout=timeout,
                                            output_hook=lambda msg: None)
        assert reply["content"]["status"] == "ok", reply["content"]

    def click(self, comm_id: str) -> None:
        self.kc.shell_channel.send(self.kc.session.msg("comm_msg", {
            "comm_id": comm_id, "data": {"method": "custom", "content": {"event": "click"}}}))

    def close(self) -> None:
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=True)


def outputs_of(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The cell's outputs as a front end keeps them: display data updated by display id,
    ``clear_output(wait=True)`` applied at the next output, streams."""
    outputs: list[dict[str, Any]] = []
    clear_next = False
    for msg in messages:
        kind, content = msg["msg_type"], msg["content"]
        if kind == "clear_output":
            if content.get("wait"):
                clear_next = True
            else:
                outputs.clear()
            continue
        if kind == "update_display_data":
            display_id = content.get("transient", {}).get("display_id")
            for output in outputs:
                if output.get("display_id") == display_id:
                    output["data"] = content["data"]
            continue
        if kind not in ("display_data", "stream", "execute_result", "error"):
            continue
        if clear_next:
            outputs.clear()
            clear_next = False
        outputs.append({"type": kind, "data": content.get("data", content.get("text")),
                        "display_id": content.get("transient", {}).get("display_id")})
    return outputs


def status_shown(messages: list[dict[str, Any]], live: str) -> str:
    """What the live view's status line (widget, display) or text (text) says last."""
    for msg in reversed(messages):
        content = msg["content"]
        if live == "widget" and msg["msg_type"] in ("comm_msg", "comm_open"):
            value = str(content.get("data", {}).get("state", {}).get("value", ""))
            if "dnb-status" in value:
                return value
        if live == "display" and msg["msg_type"] in ("display_data", "update_display_data"):
            markdown = content["data"].get("text/markdown", "")
            if "<sub>" in markdown:
                return str(markdown)
        if live == "text" and msg["msg_type"] == "stream":
            return "".join(m["content"]["text"] for m in messages if m["msg_type"] == "stream")
    return ""


@pytest.fixture
def kernel(fake: CanonicalFake, tmp_path: Path) -> Iterator[Kernel]:
    k = Kernel(env_for(fake, tmp_path), tmp_path)
    try:
        for code in ("%load_ext dispatch_nb", ADD):
            k.run(code)
        yield k
    finally:
        k.close()


class Buttons:
    """The approval box's and its buttons' comm ids, from every iopub message (their comm_opens
    come under the subshell's parent, not the cell's)."""

    def __init__(self) -> None:
        self.comms: dict[str, str] = {}
        self.box_parts: set[str] = set()
        self.boxes: set[str] = set()
        self.done = threading.Event()

    def feed(self, msg: dict[str, Any]) -> None:
        if msg["msg_type"] != "comm_open":
            return
        content = msg["content"]
        state = content["data"].get("state", {})
        if state.get("_model_name") == "ButtonModel":
            self.comms[state["description"]] = content["comm_id"]
        if "Approve tool call" in str(state.get("value", "")):
            self.box_parts.add(f"IPY_MODEL_{content['comm_id']}")
        if state.get("_model_name") == "VBoxModel" and self.box_parts & set(state["children"]):
            self.boxes.add(content["comm_id"])


def run_with_buttons(kernel: Kernel, code: str, then: Any, timeout: float = 120
                     ) -> list[dict[str, Any]]:
    """Execute ``code``; once the approval box is displayed, ``then(messages, buttons)``."""
    watcher = Buttons()
    msg_id = kernel.kc.execute(code, allow_stdin=True)
    messages: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            msg = kernel.kc.get_iopub_msg(timeout=1)
        except queue.Empty:
            continue
        watcher.feed(msg)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        messages.append(msg)
        content = msg["content"]
        if (msg["msg_type"] == "display_data" and WIDGET in content["data"]
                and content["data"][WIDGET]["model_id"] in watcher.boxes
                and not watcher.done.is_set()):
            watcher.done.set()
            then(list(messages), dict(watcher.comms))
        if msg["msg_type"] == "status" and content["execution_state"] == "idle":
            assert watcher.done.is_set(), "the approval buttons were never shown"
            return messages
    raise TimeoutError(code)


@pytest.mark.parametrize("live", ["widget", "display", "text"])
def test_the_status_says_it_waits_and_the_buttons_leave_no_output(
    kernel: Kernel, fake: CanonicalFake, live: str
) -> None:
    kernel.run(f'%config ChatMagics.live = "{live}"')
    fake.push(Turn(tool_calls=[ToolCall("b1", "add", {"a": 2, "b": 40})]), Turn(text="It is 42."))
    status: list[str] = []

    def approve(messages: list[dict[str, Any]], buttons: dict[str, str]) -> None:
        status.append(status_shown(messages, live))
        kernel.click(buttons["Approve"])

    messages = run_with_buttons(kernel, CELL, approve)
    assert "waiting for approval of add" in status[0]
    assert tool_result(fake)["content"] == "42"
    outputs = outputs_of(messages)
    # one final output: no emptied approval box (nor anything else) left behind it
    assert len(outputs) == 1, outputs
    assert "It is 42." in outputs[0]["data"]["text/markdown"]
    assert "approved" in outputs[0]["data"]["text/markdown"]


def test_ctrl_c_while_the_buttons_wait_says_the_call_was_not_run(
    kernel: Kernel, fake: CanonicalFake
) -> None:
    kernel.run('%config ChatMagics.live = "display"')
    fake.push(Turn(tool_calls=[ToolCall("c1", "add", {"a": 2, "b": 40})]), Turn(text="never"))
    messages = run_with_buttons(kernel, CELL, lambda *_: kernel.km.interrupt_kernel())
    errors = [m for m in messages if m["msg_type"] == "error"]
    assert len(errors) == 1 and "interrupted" in errors[0]["content"]["traceback"][0]
    # no answer arrived, only the call: no "partial answer" is claimed
    assert "what arrived is kept above" in errors[0]["content"]["traceback"][0]
    [final] = outputs_of([m for m in messages if m["msg_type"] != "error"])
    shown = final["data"]["text/markdown"]
    assert NOT_RUN in shown
    assert "⚠ error" not in shown  # "⚠ add was not run: …", as a denied call reads
    assert "abandoned" not in shown and "still running" not in shown
    assert "user denied" not in shown and "no answer" not in shown
    assert len(fake.chat_requests) == 1  # the cell stopped: the model was not asked again


def test_ctrl_c_in_a_comparison_stops_every_question(kernel: Kernel, fake: CanonicalFake) -> None:
    """Both models call the tool; the first question is shown, the second waits behind it.
    Ctrl-C: the second question is never shown on the stopped cell, neither call runs, neither
    model is asked again, and no worker is left waiting for an answer (nothing abandoned)."""
    kernel.run('%config ChatMagics.live = "display"')
    for model in ("echo", "second"):
        fake.push_for(model, Turn(tool_calls=[ToolCall(f"{model}-1", "add", {"a": 2, "b": 40})]),
                      Turn(text="never"))

    def interrupt(*_: Any) -> None:
        wait_for(lambda: len(fake.chat_requests) == 2, timeout=30)
        time.sleep(0.5)  # the second model's question is queued behind the first
        kernel.km.interrupt_kernel()

    messages = run_with_buttons(
        kernel, "%%chat --tools add --approve ask -m fake:echo,fake:second\nAdd 2 and 40.",
        interrupt)
    boxes = [m for m in messages
             if m["msg_type"] == "display_data" and WIDGET in m["content"]["data"]]
    assert len(boxes) == 1, "a question was shown after the interrupt"
    [final] = outputs_of([m for m in messages if m["msg_type"] != "error"])
    shown = final["data"]["text/markdown"]
    assert shown.count(NOT_RUN) == 2, shown
    assert "abandoned" not in shown and "still running" not in shown, shown
    assert len(fake.chat_requests) == 2  # neither model was asked again
    kernel.run("pass", timeout=10)  # the kernel answers: nothing holds it


def test_ctrl_c_at_the_terminal_prompt_says_the_call_was_not_run(
    fake: CanonicalFake, tmp_path: Path
) -> None:
    pexpect = pytest.importorskip("pexpect")
    fake.push(Turn(tool_calls=[ToolCall("p1", "add", {"a": 2, "b": 40})]), Turn(text="never"))
    ipython = os.path.join(os.path.dirname(sys.executable), "ipython")
    child = pexpect.spawn(ipython, ["--simple-prompt", "--no-banner", "--colors=NoColor",
                                    "--HistoryManager.enabled=False"],
                          env=env_for(fake, tmp_path), cwd=str(tmp_path), encoding="utf-8",
                          timeout=60)
    seen = io.StringIO()
    child.logfile_read = seen  # everything the terminal showed
    try:
        child.expect(r"In \[1\]: ")
        child.sendline("%load_ext dispatch_nb")
        child.expect(r"In \[2\]: ")
        child.sendline("def add(a, b): return a + b")
        child.expect(r"In \[3\]: ")
        child.sendline("get_ipython().run_cell_magic('chat', '--tools add --approve ask', "
                       "'Add 2 and 40.')")
        child.expect(r"\[y\]es / \[n\]o")
        child.sendintr()
        child.expect(r"In \[4\]: ")
    finally:
        child.close(force=True)
    shown = seen.getvalue().split("In [3]: ", 1)[1]
    assert "waiting for approval of add" in shown
    assert NOT_RUN in shown
    assert shown.count("was not run") == 1  # one line says it
    assert "still running" not in shown and "abandoned" not in shown
    assert "user denied" not in shown and "no answer" not in shown


def test_session_send_in_a_code_cell_keeps_the_decision_where_the_buttons_were(
    kernel: Kernel, fake: CanonicalFake
) -> None:
    """``session.send(...)`` with approve='ask' in a code cell: once clicked, the buttons' output
    reads the call and the decision (it was an empty output in the saved notebook); a deny too."""
    fake.push(Turn(tool_calls=[ToolCall("s1", "add", {"a": 2, "b": 40})]), Turn(text="It is 42."),
              Turn(tool_calls=[ToolCall("s2", "add", {"a": 1, "b": 1})]), Turn(text="Not added."))
    code = ("from dispatch_nb import Session\n"
            "session = Session('fake:echo', tools=[add], approve='ask')\n"
            "print(session.send('Add 2 and 40.').text)")
    messages = run_with_buttons(kernel, code, lambda _m, buttons: kernel.click(buttons["Approve"]))
    outputs = outputs_of(messages)
    assert [o["data"] for o in outputs] == [{"text/plain": "add: approved"}, "It is 42.\n"], outputs
    messages = run_with_buttons(kernel, "print(session.send('Add 1 and 1.').text)",
                                lambda _m, buttons: kernel.click(buttons["Deny"]))
    assert outputs_of(messages)[0]["data"] == {"text/plain": "add: denied: the user said no"}
