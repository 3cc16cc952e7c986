"""The example notebooks run under nbval, and what each cell shows is compared with the notebook.

``--nbval`` (pyproject's ``addopts``) runs every code cell in a real kernel and compares its outputs
with the ones saved in the notebook. The notebooks replay their recorded answers (each one's first
code cell makes ``replay`` the default cache mode; no model, account or network is needed), so a
chat cell must show, word for word, what the recording run saved: a rendering regression fails.
Only this run's wall clock is masked (nbval's sanitizers, ``nbval-sanitize.cfg``: "2.4 s" and the
word "replayed" that stands in for it). A cell whose output cannot be reproduced would carry the
``nbval-ignore-output`` tag; none does.

nbval 0.11 drops ``update_display_data`` and ``clear_output`` messages, which a front end applies:
the live view ends by replacing itself with the one static output the notebook saves. So
:class:`OutputArea` applies them to the outputs nbval collects, as JupyterLab and nbclient do.

Copied beside your own notebooks (with ``nbval-sanitize.cfg``), plain ``pytest`` there compares
them the same way. In this repository nbval's kernels listen on ipc sockets (tests/kernels.py).
Every notebook cell is marked ``kernel`` (``make test-fast`` leaves them out).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

SANITIZE = Path(__file__).with_name("nbval-sanitize.cfg")


def pytest_configure(config: pytest.Config) -> None:
    if getattr(config.option, "nbval_sanitize_with", "unset") is None:
        config.option.nbval_sanitize_with = str(SANITIZE)
    if hasattr(config.option, "nbval") and not (config.option.nbval or config.option.nbval_lax):
        config.option.nbval = True  # copied beside your notebooks: plain `pytest` compares them
    # In this repository, nbval's kernels on ipc sockets, not TCP ports another test process can
    # take between jupyter_client choosing them and the kernel binding them (tests/kernels.py).
    # nbval 0.11 has no option for the transport; its start_new_kernel builds the manager from
    # this name. A copy of this file elsewhere keeps nbval's own kernels.
    import nbval.kernel

    try:
        from tests.kernels import IPCKernelManager
    except ImportError:
        return

    assert nbval.kernel.KernelManager.__name__.endswith("KernelManager"), "nbval has changed"
    nbval.kernel.KernelManager = IPCKernelManager  # type: ignore[misc]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every notebook cell ``kernel``; let its notebook's outputs see display updates."""
    for item in items:
        if item.path.suffix == ".ipynb":
            item.add_marker(pytest.mark.kernel)
            OutputArea.install(item.parent)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Any:
    area = getattr(item.parent, "_dispatch_nb_output_area", None)
    if area is not None:
        area.start(item)
    try:
        return (yield)
    finally:
        if area is not None:
            area.stop()


class OutputArea:
    """What a notebook front end does with a cell's display messages, applied to the outputs
    nbval collects for that cell (``item.test_outputs``, filled while the cell runs):
    ``update_display_data`` replaces the data of the outputs shown with that ``display_id``;
    ``clear_output`` empties them, at once or (``wait=True``) when the next output arrives."""

    HANDLED = ("update_display_data", "clear_output")
    OUTPUTS = ("display_data", "execute_result", "stream", "error")

    def __init__(self, collector: Any) -> None:
        self.get_message = collector.get_kernel_message
        self.item: Any = None
        self.parent_id: str | None = None
        self.shown: dict[str, list[int]] = {}
        self.clear_pending = False

    @classmethod
    def install(cls, collector: Any) -> None:
        if getattr(collector, "_dispatch_nb_output_area", None) is None:
            area = cls(collector)
            collector._dispatch_nb_output_area = area
            collector.get_kernel_message = area.next_message

    def start(self, item: Any) -> None:
        self.item, self.parent_id, self.shown, self.clear_pending = item, None, {}, False

    def stop(self) -> None:
        self.item = None

    def _outputs(self) -> list[Any] | None:
        return getattr(self.item, "test_outputs", None) if self.item is not None else None

    def next_message(self, timeout: float | None = None, stream: str = "iopub") -> Any:
        while True:
            msg = self.get_message(timeout=timeout, stream=stream)
            outputs = self._outputs()
            if stream != "iopub" or outputs is None:
                return msg
            kind = msg["msg_type"]
            parent = msg.get("parent_header", {}).get("msg_id")
            if kind == "execute_input":
                self.parent_id = parent
            if parent is None or parent != self.parent_id:
                return msg
            content = msg["content"]
            if kind == "clear_output":
                if content.get("wait"):
                    self.clear_pending = True
                else:
                    outputs.clear()
                    self.shown.clear()
                continue
            if kind == "update_display_data":
                display_id = content.get("transient", {}).get("display_id")
                for index in self.shown.get(display_id, []):
                    outputs[index]["data"] = content["data"]
                    outputs[index]["metadata"] = content["metadata"]
                continue
            if kind in self.OUTPUTS:
                if self.clear_pending:
                    outputs.clear()
                    self.shown.clear()
                    self.clear_pending = False
                display_id = content.get("transient", {}).get("display_id")
                if kind == "display_data" and display_id:
                    self.shown.setdefault(display_id, []).append(len(outputs))  # nbval appends it
            return msg
