"""The harness itself: a server starts, a notebook opens, a cell runs and its output renders."""

from __future__ import annotations

import sys
from typing import Any

import pytest

from .harness import JupyterServer

pytestmark = pytest.mark.e2e


def test_print_renders(open_notebook: Any, jupyter: JupyterServer) -> None:
    nb = open_notebook(["print('hello')", "import sys; print(sys.executable)"])
    assert nb.run(0).strip() == "hello"
    # the kernel is this project's interpreter, so dispatch_nb is importable in it
    assert nb.run(1).strip() == sys.executable
    nb.set_source(0, "print('edited', 6 * 7)")
    assert nb.run(0).strip() == "edited 42"
    nb.screenshot("smoke")


def test_widgets_render(open_notebook: Any) -> None:
    """ipywidgets render in this front end (the live view and the login widget need them)."""
    nb = open_notebook(["import ipywidgets as w\nw.HTML('<b class=\"probe\">widget-ok</b>')"])
    nb.run(0)
    probe = nb.output(0).locator(".jupyter-widgets b.probe")
    probe.wait_for(timeout=20_000)
    assert probe.inner_text() == "widget-ok"
