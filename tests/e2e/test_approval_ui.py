"""Approval in the browser: a ``%%chat --mcp`` cell shows the MCP call in full with Approve / Deny /
Always buttons (ipywidgets) while the cell runs. Clicking the real **Deny** button denies it and
the tool provably never runs (``touch`` would create a file); clicking **Always** runs it and a
later cell's call of the same tool is not asked about."""

from __future__ import annotations

import sys
from typing import Any

from ..fakes.canonical import CanonicalFake
from ..fakes.provider import ToolCall, Turn
from ..mcp.conftest import SDK_SERVER
from .harness import JupyterServer, update_doc_image

LOAD = "%load_ext dispatch_nb"


def approval_box(nb: Any, index: int) -> Any:
    """The cell's Approve / Deny / Always widget once it is on screen."""
    box = nb.cell(index).locator(".widget-vbox", has_text="Approve tool call")
    box.wait_for(state="visible", timeout=90_000)  # the server starts, the model asks
    return box


def test_deny_in_the_browser_never_runs_the_tool(
    open_notebook: Any, fake: CanonicalFake, jupyter: JupyterServer
) -> None:
    # a path relative to the notebook (the kernel's and so the MCP server's working directory, as
    # the next test shows), as a user would give it: the screenshot in docs/ shows no temp path
    name = f"touched-{jupyter.frontend.name}.txt"
    target = jupyter.root / name
    fake.push(Turn(tool_calls=[ToolCall("b1", "touch", {"path": name})]),
              Turn(text="I did not touch it."))
    nb = open_notebook([LOAD, f"%chat mcp add calc -- {sys.executable} {SDK_SERVER} stdio",
                        "%%chat --mcp calc\nTouch the file."])
    nb.run(0)
    nb.run(1)
    before = nb.start(2)
    box = approval_box(nb, 2)
    assert f'"path": "{name}"' in box.inner_text()  # the tool and its arguments, in full
    assert "touch" in box.inner_text()
    shot = nb.screenshot("approval-buttons", element=box)
    if jupyter.frontend.name == "lab":  # docs/tools.md shows JupyterLab's
        update_doc_image(shot, "approval-buttons.png")
    box.get_by_role("button", name="Deny").click()
    nb.wait_done(2, before, timeout=90)
    text = nb.wait_output(2, lambda t: "I did not touch it." in t, 30, "the final answer")
    assert not target.exists(), "the denied tool ran"
    # the decision, saved with the output: what the model read, said once
    assert "touch was not run: the user denied it" in text
    assert text.count("the user denied it") == 1 and "said no" not in text
    assert "touch was not run: the user denied it" in fake.chat_requests[-1].body.decode()
    nb.screenshot("approval-denied")


def test_always_in_the_browser_holds_for_the_session(
    open_notebook: Any, fake: CanonicalFake, jupyter: JupyterServer
) -> None:
    # relative paths land beside the notebook (which the deny test relies on)
    first, second = (f"always-{n}-{jupyter.frontend.name}.txt" for n in (1, 2))
    fake.push(Turn(tool_calls=[ToolCall("a1", "touch", {"path": first})]),
              Turn(text="Touched once."),
              Turn(tool_calls=[ToolCall("a2", "touch", {"path": second})]),
              Turn(text="Touched twice."))
    nb = open_notebook([LOAD, f"%chat mcp add calc -- {sys.executable} {SDK_SERVER} stdio",
                        "%%chat --mcp calc\nTouch the first file.",
                        "%%chat --mcp calc\nTouch the second file."])
    nb.run(0)
    nb.run(1)
    before = nb.start(2)
    approval_box(nb, 2).get_by_role("button", name="Always allow touch").click()
    nb.wait_done(2, before, timeout=90)
    text = nb.wait_output(2, lambda t: "Touched once." in t, 30, "the first answer")
    assert (jupyter.root / first).exists() and "approved (always)" in text
    nb.run(3, timeout=90)  # not asked again: it would wait for a click until the test timed out
    text = nb.wait_output(3, lambda t: "Touched twice." in t, 30, "the second answer")
    assert (jupyter.root / second).exists()
    assert nb.cell(3).locator(".widget-vbox", has_text="Approve tool call").count() == 0


def test_approve_in_the_browser_leaves_no_output_behind(
    open_notebook: Any, fake: CanonicalFake, jupyter: JupyterServer
) -> None:
    """Issue 7 of a new user's pass: after a click on Approve and a save, the cell holds its one
    final output — no emptied approval box (``{"text/html": []}``) is left after it."""
    fake.push(Turn(tool_calls=[ToolCall("p1", "add", {"a": 2, "b": 40})]), Turn(text="It is 42."))
    nb = open_notebook([LOAD, "def add(a: int, b: int) -> int:\n    '''Add.'''\n    return a + b",
                        "%%chat --tools add --approve ask\nAdd 2 and 40."])
    nb.run(0)
    nb.run(1)
    before = nb.start(2)
    box = approval_box(nb, 2)
    assert '"b": 40' in box.inner_text()
    box.get_by_role("button", name="Approve").click()
    nb.wait_done(2, before, timeout=90)
    nb.wait_output(2, lambda t: "It is 42." in t, 30, "the final answer")
    saved = nb.save()
    outputs = saved["cells"][2]["outputs"]
    assert len(outputs) == 1, outputs  # the final answer only
    [final] = outputs
    assert final["output_type"] == "display_data"
    assert "It is 42." in "".join(final["data"]["text/markdown"])
    assert "approved" in "".join(final["data"]["text/markdown"])
    assert nb.cell(2).locator(".widget-vbox", has_text="Approve tool call").count() == 0
