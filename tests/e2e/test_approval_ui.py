"""Approval in the browser: a ``%%chat --mcp`` cell asks before an MCP tool runs (the call in
full, then the front end's input box); typing "n" denies it and the tool provably never runs
(``touch`` would create a file)."""

from __future__ import annotations

import sys
from typing import Any

from ..fakes.canonical import CanonicalFake
from ..fakes.provider import ToolCall, Turn
from ..mcp.conftest import SDK_SERVER
from .harness import JupyterServer

LOAD = "%load_ext dispatch_nb"


def test_deny_in_the_browser_never_runs_the_tool(
    open_notebook: Any, fake: CanonicalFake, jupyter: JupyterServer
) -> None:
    target = jupyter.root / f"touched-{jupyter.frontend.name}.txt"
    fake.push(Turn(tool_calls=[ToolCall("b1", "touch", {"path": str(target)})]),
              Turn(text="I did not touch it."))
    nb = open_notebook([LOAD, f"%chat mcp add calc -- {sys.executable} {SDK_SERVER} stdio",
                        "%%chat --mcp calc\nTouch the file."])
    nb.run(0)
    nb.run(1)
    before = nb.start(2)
    box = nb.cell(2).locator("input.jp-Stdin-input")
    box.wait_for(state="visible", timeout=90_000)  # the server starts, the model asks
    assert str(target) in nb.output_text(2)  # the tool and its arguments, in full
    assert "touch" in nb.output_text(2)
    box.fill("n")
    box.press("Enter")
    nb.wait_done(2, before, timeout=90)
    text = nb.wait_output(2, lambda t: "I did not touch it." in t, 30, "the final answer")
    assert not target.exists(), "the denied tool ran"
    assert "denied" in text
    nb.screenshot("approval-denied")
