"""``approve="ask"`` in a notebook: buttons in the cell, else the front end's input box
(``docs/tools.md``, "Approval before a tool runs"). ``%load_ext dispatch_nb`` installs :func:`ask`.
:func:`ask_with_buttons` also shows the **Send N rows** question of a large ``--each``.
"""

from __future__ import annotations

import contextvars
import functools
import html
import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from ..approval import ALWAYS, SAID_NO, NotAsked, ToolCall
from ..cancel import CancelToken
from ..errors import RequestCancelled
from ..frontend import current_shell, unattended

log = logging.getLogger(__name__)

__all__ = ["INTERRUPTED", "NO_ANSWER", "ApprovalRequest", "Question", "answer_here", "ask",
           "ask_with_buttons", "asking_through", "cannot_ask"]

#: why a call was not run when its cell was interrupted while the question waited
INTERRUPTED = "the cell was interrupted while it waited for approval"
#: why a call was not run when the turn's deadline passed while the question waited
NO_ANSWER = NotAsked("no answer within the turn's deadline")

#: the current cell's ``emit`` and its job's cancel switch (set on its worker thread;
#: asyncio.to_thread carries it along)
_emit: contextvars.ContextVar[tuple[Callable[[Any], None], CancelToken | None] | None] = (
    contextvars.ContextVar("dispatch_nb_approval_emit", default=None)
)
#: tools the person approved "always" in this kernel, by (MCP server, name): every later cell
#: runs them without asking (a tool of the same name from another server is still asked about)
_always: set[tuple[str | None, str]] = set()


class Question:
    """A question waiting for the person at the notebook; the first answer counts."""

    def __init__(self, seconds: float | None = None, cancel: CancelToken | None = None) -> None:
        #: the cell's job's cancel switch: once it is set, the question is not shown
        self.cancel = cancel
        #: when the turn's deadline passes (``time.monotonic()``; None: no deadline)
        self.deadline = None if seconds is None else time.monotonic() + seconds
        self.answer: bool | str = NO_ANSWER
        #: set once the answer is given (by the person, the deadline, Ctrl-C or the cell's stop)
        self.answered = threading.Event()
        self._lock = threading.Lock()

    def settle(self, answer: bool | str) -> bool:
        """Give the answer, unless one was given already (the first counts: a click just after
        the deadline, or after Ctrl-C, changes nothing). True when this one counts."""
        with self._lock:
            if self.answered.is_set():
                return False
            self.answer = answer
            self.answered.set()
            return True

    def wait(self) -> None:
        """Wait for the answer in short waits (Ctrl-C reaches this thread); the turn's deadline or
        the cell's stop settles it."""
        while not self.answered.wait(0.1):
            if self.cancel is not None and self.cancel.cancelled:
                self.settle(NotAsked(INTERRUPTED))
            elif self.deadline is not None and time.monotonic() >= self.deadline:
                self.settle(NO_ANSWER)


class ApprovalRequest(Question):
    """A call waiting for approval (an event of the cell's queue)."""

    type = "approval_request"

    def __init__(self, call: ToolCall, seconds: float | None = None, *,
                 in_cell: bool = False, cancel: CancelToken | None = None) -> None:
        super().__init__(seconds, cancel)
        self.call = call
        #: True when a %%chat cell asks (what to do instead is said with its options), False
        #: for the Python API (``session.send()`` in a cell)
        self.in_cell = in_cell
        #: the model whose call it is, when several are compared (the question names it)
        self.asked_by = ""


def ask(call: ToolCall, seconds: float | None) -> bool | str:
    """The kernel's asker (see the module docstring). In a %%chat cell it waits on the cell's
    worker thread until the kernel's thread has the answer, the turn's deadline passes or the
    cell stops (Ctrl-C: then the turn ends here, with :class:`RequestCancelled` — neither the
    tool nor the model runs again)."""
    emit, cancel = _emit.get() or (None, None)
    if (call.server, call.name) in _always:
        return ALWAYS
    request = ApprovalRequest(call, seconds, in_cell=emit is not None, cancel=cancel)
    if emit is not None:  # a %%chat cell's worker: its kernel thread asks
        emit(request)
    elif threading.current_thread() is threading.main_thread():  # session.send() in a cell
        answer_here(request)
    else:  # another thread outside a %%chat cell: the terminal's prompt (or a denial)
        from ..approval import _terminal

        return _terminal(call, seconds)
    request.wait()
    if request.answer == INTERRUPTED or (cancel is not None and cancel.cancelled):
        raise RequestCancelled(f"{call.name} was not run: {INTERRUPTED}")
    if request.answer == ALWAYS:
        _always.add((call.server, call.name))
    return request.answer


def asking_through(emit: Callable[[Any], None], cancel: CancelToken | None = None
                   ) -> contextvars.Token[Any]:
    """Route this thread's approval requests to ``emit`` (the cell's event queue); ``cancel``
    (the cell's job's) ends a wait when the cell stops."""
    return _emit.set((emit, cancel))


def _parse(text: str) -> bool | str:
    """An answer typed in the input box: y, a(lways), n / nothing, or a reason (a denial)."""
    lowered = text.strip().lower()
    if lowered in ("a", "always"):
        return ALWAYS
    if lowered in ("y", "yes"):
        return True
    if lowered in ("", "n", "no"):
        return SAID_NO
    return text.strip()


def _instead(in_cell: bool) -> str:
    """What to use instead of asking, in the words of a %%chat cell or of the Python API."""
    return "%%chat --approve auto" if in_cell else "approve='auto' or an approval function"


def cannot_ask(in_cell: bool) -> str:
    """Why no one is asked in a front end without an input box, and what to do instead."""
    return ("this front end cannot ask for approval — it runs the cell with no one to answer, as "
            f"jupyter execute and nbclient do; use {_instead(in_cell)}, or run the cell where you "
            "can answer, such as JupyterLab or Notebook 7")


def answer_here(request: ApprovalRequest, asking: Callable[[], None] | None = None) -> None:
    """On the kernel's thread: show the call in full and ask, with buttons where the front end
    can click them while the cell runs, else in its input box. ``asking()`` is called just before
    the question is shown (never when no one can be asked). Ctrl-C while it waits: the call is
    not run (:data:`INTERRUPTED`) and the interrupt goes on."""
    if request.cancel is not None and request.cancel.cancelled:  # its cell stopped
        request.settle(NotAsked(INTERRUPTED))
    if request.answered.is_set():
        return
    try:
        if unattended():  # nbclient, jupyter execute, voilà: no one is there to click or type
            request.settle(NotAsked(cannot_ask(request.in_cell)))
            return
        if asking is not None:
            asking()
        if not _ask_with_buttons(request):
            _ask_in_input_box(request)
    except KeyboardInterrupt:
        request.settle(NotAsked(INTERRUPTED))
        raise


def _describe(request: ApprovalRequest) -> tuple[str, str]:
    """The call's headline and its arguments in full (JSON)."""
    call = request.call
    where = f" from MCP server {call.server}" if call.server else ""
    where += f" (asked by {request.asked_by})" if request.asked_by else ""
    return f"Approve tool call {call.name}{where}?", json.dumps(call.arguments, indent=2, ensure_ascii=False)


def _ask_in_input_box(request: ApprovalRequest) -> None:
    headline, arguments = _describe(request)
    print(f"{headline}\n{arguments}", flush=True)
    try:
        text = input("[y]es / [n]o (or a reason) / [a]lways for this tool: ")
    except Exception:  # no input box after all (StdinNotImplementedError, EOF): say why
        request.settle(NotAsked(cannot_ask(request.in_cell)))
    else:
        request.settle(_parse(text))


@functools.cache  # an answer (a subshell, or a refusal) is kept; a timeout raises: tried again
def _subshell(kernel: Any) -> str | None:
    """This kernel's subshell for approval buttons, made once through the kernel's own control
    channel (a client of the kernel's connection file); None when the kernel has none."""
    if "kernel subshells" not in kernel.kernel_info.get("supported_features", ()):
        return None
    from ipykernel.connect import get_connection_file
    from jupyter_client.blocking.client import BlockingKernelClient

    client = BlockingKernelClient(connection_file=get_connection_file())
    client.load_connection_file()
    client.start_channels(shell=False, iopub=False, stdin=False, hb=False, control=True)
    try:
        client.control_channel.send(client.session.msg("create_subshell_request", {}))
        reply = client.control_channel.get_msg(timeout=10)
    finally:
        client.stop_channels()
    content = reply["content"]
    return content["subshell_id"] if content.get("status") == "ok" else None


def _ask_with_buttons(request: ApprovalRequest) -> bool:
    """Show the call with Approve / Deny / Always buttons and wait for a click (or the turn's
    deadline); the buttons then go (the decision is shown, and saved, with the call in the
    answer). False when buttons cannot work here (then nothing was shown)."""
    call = request.call
    headline, arguments = _describe(request)
    buttons: list[tuple[dict[str, Any], bool | str]] = [
        ({"description": "Approve", "button_style": "success", "icon": "check"}, True),
        ({"description": "Deny", "button_style": "danger", "icon": "times"}, SAID_NO),
        ({"description": f"Always allow {call.name}", "icon": "check-double",
          "tooltip": "approve this tool for the rest of this kernel",
          "layout": {"width": "auto"}}, ALWAYS)]
    return ask_with_buttons(
        request, f"<b>{html.escape(headline)}</b>"
                 f"<pre style='margin:4px 0'>{html.escape(arguments)}</pre>",
        f"{headline}\n{arguments}\nThis front end cannot show the Approve / Deny buttons: "
        f"interrupt the cell not to run the tool, and use {_instead(request.in_cell)} here.",
        buttons, lambda: {"text/html": ""} if request.in_cell else _decided(request))


def _decided(request: ApprovalRequest) -> dict[str, Any]:
    """What a code cell (``session.send``) keeps of its answered buttons: the call and the
    decision, one line (a ``%%chat`` cell shows them with the call in its answer)."""
    answer = request.answer
    said = ("approved (always)" if answer == ALWAYS else "approved" if answer is True
            else f"denied: {answer}")
    return {"text/plain": f"{request.call.name}: {said}"}


def ask_with_buttons(question: Question, body: str, text: str,
                     buttons: list[tuple[dict[str, Any], bool | str]],
                     after: Callable[[], dict[str, Any]]) -> bool:
    """Show ``body`` (HTML) with ``buttons`` (``ipywidgets.Button`` options, and the answer a
    click gives) in the running cell and wait for a click; then the buttons are replaced by
    ``after()`` (a display bundle: what the notebook keeps). ``text`` is shown by a front end
    that cannot show widgets. False when buttons cannot work here (then nothing was shown): no
    kernel, no ipywidgets, no kernel subshell to run the click while the cell waits."""
    kernel: Any = getattr(current_shell(), "kernel", None)
    parent = kernel.get_parent("shell") if kernel is not None else None
    if not parent:
        return False  # no kernel (terminal IPython): its input box, stdin
    try:
        import ipywidgets as widgets
        from IPython.display import display

        subshell = _subshell(kernel)
        ident = kernel._parent_ident["shell"]  # the cell's request, restored below
    except Exception as exc:  # no ipywidgets / jupyter_client, no answer about a subshell
        log.debug("buttons cannot be used here (%s: %s); asking in the input box",
                  type(exc).__name__, exc)
        return False
    if subshell is None:
        return False
    # the widgets' comms are opened under the subshell: the front end's clicks go to its thread
    kernel.set_parent(ident, {**parent, "header": {**parent["header"], "subshell_id": subshell}})
    try:
        shown = [widgets.Button(**options) for options, _answer in buttons]

        def on_click(button: Any) -> None:  # on the subshell's thread; the first answer counts
            question.settle(buttons[shown.index(button)][1])

        for button in shown:
            button.on_click(on_click)
        box = widgets.VBox([widgets.HTML(body), widgets.HBox(shown)])
    finally:
        kernel.set_parent(ident, parent)
    handle = display({**box._repr_mimebundle_(), "text/plain": text}, raw=True,  # type: ignore[no-untyped-call]
                     display_id=True)
    try:
        question.wait()
    finally:  # after Ctrl-C a click that lands now changes nothing (the first answer counts)
        question.settle(NotAsked(INTERRUPTED))
        handle.update(after(), raw=True)
        for widget in (*shown, *box.children, box):
            widget.close()
    return True
