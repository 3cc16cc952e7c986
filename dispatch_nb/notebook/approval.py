"""``approve="ask"`` in a notebook: the turn (on a worker thread) hands the call to the kernel's
thread, which shows the tool and its arguments in full and asks with the front end's input box
(``y`` approve, ``n`` or a reason deny, ``a`` always for this tool). A front end without an input
box (nbclient, a voilà page) denies, saying how to approve instead; in terminal IPython this is
the terminal's prompt. No answer within the turn's deadline is a denial.
"""

from __future__ import annotations

import contextvars
import json
import threading
from collections.abc import Callable
from typing import Any

from ..approval import ALWAYS, ToolCall, set_asker

__all__ = ["ApprovalRequest", "answer_here", "asking_through", "install"]

#: the current cell's ``emit`` (set on its worker thread; asyncio.to_thread carries it along)
_emit: contextvars.ContextVar[Callable[[Any], None] | None] = contextvars.ContextVar(
    "dispatch_nb_approval_emit", default=None
)
_installed = False
#: tools the person approved "always" in this kernel (every later cell runs them without asking)
_always: set[str] = set()


class ApprovalRequest:
    """A call waiting for the person at the notebook (an event of the cell's queue)."""

    type = "approval_request"

    def __init__(self, call: ToolCall) -> None:
        self.call = call
        self.answer: bool | str = "no answer"
        self.done = threading.Event()


def _ask(call: ToolCall, seconds: float | None) -> bool | str:
    emit = _emit.get()
    if emit is None:  # not inside a %%chat cell: the terminal's prompt (or a denial)
        from ..approval import _terminal

        return _terminal(call, seconds)
    if call.name in _always:
        return ALWAYS
    request = ApprovalRequest(call)
    emit(request)
    if not request.done.wait(seconds):
        return "no answer within the turn's deadline"
    if request.answer == ALWAYS:
        _always.add(call.name)
    return request.answer


def install() -> None:
    """Make the kernel's cells answer ``approve="ask"`` (idempotent)."""
    global _installed
    if not _installed:
        set_asker(_ask)
        _installed = True


def asking_through(emit: Callable[[Any], None]) -> contextvars.Token[Any]:
    """Route this thread's approval requests to ``emit`` (the cell's event queue)."""
    install()
    return _emit.set(emit)


def answer_here(request: ApprovalRequest) -> None:
    """On the kernel's thread: show the call in full and ask (the front end's input box)."""
    call = request.call
    where = f" from MCP server {call.server}" if call.server else ""
    print(f"Approve tool call {call.name}{where}?\n"
          + json.dumps(call.arguments, indent=2, ensure_ascii=False), flush=True)
    try:
        text = input("[y]es / [n]o (or a reason) / [a]lways for this tool: ").strip()
    except Exception:  # no input box (StdinNotImplementedError, EOF): a denial saying why
        request.answer = (
            "this front end cannot ask (it has no input box): use --approve auto or an "
            "approval function"
        )
    else:
        lowered = text.lower()
        if lowered in ("a", "always"):
            request.answer = ALWAYS
        elif lowered in ("y", "yes"):
            request.answer = True
        elif lowered in ("", "n", "no"):
            request.answer = "the user said no"
        else:
            request.answer = text
    finally:
        request.done.set()
