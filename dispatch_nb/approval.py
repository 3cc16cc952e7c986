"""Approval before a tool runs: ``approve="auto" | "ask" | function(ToolCall) -> bool | str``
(docs/tools.md, "Approval before a tool runs")."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ALWAYS", "SAID_NO", "Approve", "NotAsked", "ToolCall", "check_approve", "decide", "set_asker"]


@dataclass(frozen=True)
class ToolCall:
    """A call the model asked for, as an approval function sees it."""

    id: str
    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    #: the MCP server the tool comes from (None: a Python tool)
    server: str | None = None
    description: str = ""


#: what ``approve=`` takes
Approve = str | Callable[[ToolCall], "bool | str"]

#: an asker's answer meaning "approve this call and every later call of this tool in this session"
ALWAYS = "always"
#: the reason of a plain "no" (a Deny button, ``n``, ``False``): the model reads "the user denied it"
SAID_NO = "the user said no"

class NotAsked(str):
    """An asker's answer when no one could answer (a front end that cannot ask, a cell
    interrupted while it waited): the call is not run, and the text, which says why and what to
    do instead, is the whole reason the model reads after "NAME was not run: " — no person
    denied anything."""


#: who answers ``"ask"``: ``(call, seconds_left or None) -> True | False | ALWAYS | reason``
Asker = Callable[[ToolCall, "float | None"], "bool | str"]

_asker: Asker | None = None
_asker_lock = threading.Lock()


def set_asker(asker: Asker | None) -> Asker | None:
    """Install the function that answers ``approve="ask"`` (a front end does this: the
    notebook's buttons). Returns the previous one. ``None``: the terminal prompt."""
    global _asker
    with _asker_lock:
        previous, _asker = _asker, asker
    return previous


def check_approve(approve: Any) -> None:
    """Raise a clear error unless ``approve`` is ``None``, ``"auto"``, ``"ask"`` or a function."""
    if approve is None or approve in ("auto", "ask") or callable(approve):
        return
    raise ValueError(
        f"approve must be 'auto', 'ask' or a function (ToolCall) -> bool | str, not {approve!r}"
    )


def _terminal(call: ToolCall, seconds: float | None) -> bool | str:
    """The y/N prompt of a terminal (IPython or plain Python); no terminal: a denial."""
    if not (sys.stdin and sys.stdin.isatty()):
        if "ipykernel" in sys.modules:
            return NotAsked(
                "no one was asked: a notebook asks in %%chat cells and in session.send() / "
                "session.stream() run in a cell after %load_ext dispatch_nb, not in an async "
                "turn (await session.asend(...)) or another thread; there, use approve='auto' "
                "or an approval function"
            )
        return NotAsked(
            "no one was there to approve it (no notebook and no terminal): run with "
            "approve='auto' or an approval function"
        )
    arguments = ", ".join(f"{k}={v!r}" for k, v in call.arguments.items())
    where = f" (MCP server {call.server})" if call.server else ""
    answer = input(f"Run tool {call.name}{where}({arguments})? [y/N/a=always] ").strip().lower()
    if answer in ("a", "always"):
        return ALWAYS
    return answer in ("y", "yes") or SAID_NO


def decide(approve: Any, call: ToolCall, seconds: float | None) -> str | None:
    """Ask ``approve`` about ``call``: ``None`` when it may run without asking (``"auto"``),
    else ``"approved"``, ``"approved (always)"`` or ``"denied: reason"`` (a :class:`NotAsked`
    when no one could be asked). Blocks while a
    person answers (``seconds``: the time left in the turn)."""
    if approve == "auto":
        return None
    answer = (_asker or _terminal)(call, seconds) if approve == "ask" else approve(call)
    if answer == ALWAYS and approve == "ask":
        return "approved (always)"
    if answer is True:
        return "approved"
    if isinstance(answer, NotAsked):
        return NotAsked(f"denied: {answer.strip()}")
    if isinstance(answer, str) and answer.strip():
        return f"denied: {answer.strip()}"
    if answer is False or answer is None or isinstance(answer, str):
        return f"denied: {SAID_NO}"
    raise TypeError(
        f"an approval function must return True, False or a reason (str), not {answer!r}"
    )
