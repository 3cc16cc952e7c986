"""Conversation memory for ``%%chat``: named threads of turns, one turn per cell; re-running a cell
replaces its turn (``docs/notebook.md``, "Threads and re-running cells").
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ..render import answer_markdown, code_span, short_line
from ..types import Message, ToolResultBlock, ToolUseBlock

__all__ = ["ChatThread", "ThreadStore", "Turn", "cell_identity"]


def cell_identity(cell_id: str | None, execution_count: int | None = None) -> str:
    """The identity of the cell running a ``%%chat``: its front end's cell id, else ``In[n]``, else
    a fresh one (``docs/notebook.md``, "Threads and re-running cells"); never the cell's text."""
    if cell_id:
        return f"cell:{cell_id}"
    if execution_count is not None:
        return f"in:{execution_count}"
    return "call:" + uuid.uuid4().hex[:12]


@dataclass
class Turn:
    """One cell's exchange: the user message and every message the model (and tools) produced."""

    key: str
    messages: list[Message]
    #: the model that answered, named as the cell's footer names it (``fake:echo``)
    model: str = ""
    execution_count: int | None = None

    @property
    def prompt(self) -> str:
        """The user's text of this turn."""
        return self.messages[0].text if self.messages else ""

    def steps(self) -> list[tuple[str, str]]:
        """The tool calls (``("call", "name({...})")``) and results (``("result", text)``) of
        this turn, in order."""
        steps: list[tuple[str, str]] = []
        for message in self.messages[1:]:
            for block in message.blocks:
                if isinstance(block, ToolUseBlock):
                    args = json.dumps(block.arguments, ensure_ascii=False)
                    steps.append(("call", short_line(f"{block.name}({args})")))
                elif isinstance(block, ToolResultBlock):
                    prefix = "⚠ " if block.is_error else ""
                    steps.append(("result", prefix + short_line(block.text)))
        return steps

    @property
    def answer(self) -> str:
        """The final assistant text of this turn."""
        return next((m.text for m in reversed(self.messages) if m.role == "assistant"), "")


class ChatThread:
    """One named conversation (see the module docstring for the re-run rules)."""

    def __init__(self, name: str) -> None:
        self.name = name
        #: the most turns it keeps (0: all; set by its :class:`ThreadStore`)
        self.max_turns = 0
        self.turns: list[Turn] = []
        #: the cells whose last run in this thread got no answer: turn key → ``In[n]``
        self.failed: dict[str, str] = {}

    def __len__(self) -> int:
        return len(self.turns)

    def __iter__(self) -> Iterator[Turn]:
        return iter(self.turns)

    def __repr__(self) -> str:
        return f"ChatThread(name={self.name!r}, turns={len(self.turns)})"

    def index(self, key: str) -> int | None:
        """Position of the turn keyed ``key``, or None."""
        return next((i for i, turn in enumerate(self.turns) if turn.key == key), None)

    def history_for(self, key: str) -> list[Message]:
        """The messages to send before the prompt of the turn keyed ``key``."""
        position = self.index(key)
        turns = self.turns if position is None else self.turns[:position]
        return [m for turn in turns for m in turn.messages]

    def failed_before(self, key: str) -> list[str]:
        """The cells (``In[n]``), other than the one keyed ``key``, that got no answer and have
        no turn in this thread: the conversation lacks them."""
        return [label for k, label in self.failed.items() if k != key and self.index(k) is None]

    def record(self, turn: Turn) -> None:
        """Store ``turn``: replace the turn with the same key in place, else append."""
        self.failed.pop(turn.key, None)
        position = self.index(turn.key)
        if position is None:
            self.turns.append(turn)
        else:
            self.turns[position] = turn
        if self.max_turns > 0 and len(self.turns) > self.max_turns:
            del self.turns[: len(self.turns) - self.max_turns]

    def clear(self) -> None:
        """Forget every turn."""
        self.turns.clear()
        self.failed.clear()

    def to_markdown(self) -> str:
        """The thread for ``%chat history``: each turn's prompt, its tool calls with their
        results, and the answer."""
        if not self.turns:
            return f"*Thread `{self.name}` is empty.*"
        count = len(self.turns)
        parts = [f"**Thread `{self.name}`** — {count} turn{'' if count == 1 else 's'}\n"]
        for i, turn in enumerate(self.turns, 1):
            where = f"In [{turn.execution_count}]" if turn.execution_count else ""
            meta = " · ".join(x for x in (where, turn.model) if x)
            meta = f" <sub>{meta}</sub>" if meta else ""
            parts.append(f"---\n**{i}. You**{meta}\n\n{_quote(turn.prompt)}\n")
            for kind, text in turn.steps():  # a call, or a result
                parts.append(f"{'🔧' if kind == 'call' else '→'} {code_span(text)}\n")
            parts.append(f"**Assistant**\n\n{_quote(turn.answer) or '*(no text)*'}\n")
        return "\n".join(parts)

    def to_plain(self) -> str:
        """The thread as plain text (a terminal's ``%chat history``)."""
        if not self.turns:
            return f"Thread {self.name} is empty."
        out = []
        for turn in self.turns:
            lines = [f"You: {turn.prompt}"]
            for kind, text in turn.steps():
                lines.append(("  tool: " if kind == "call" else "  → ") + text)
            lines.append(f"Assistant: {turn.answer}")
            out.append("\n".join(lines))
        return "\n\n".join(out)


def _quote(text: str) -> str:
    """``text`` (a prompt or an answer) as a Markdown block quote: its raw HTML as text, a code
    block it left open closed (:func:`answer_markdown`), so one turn cannot spill into the next."""
    text = answer_markdown(text.strip())
    return "\n".join(f"> {line}" if line else ">" for line in text.splitlines())


class ThreadStore:
    """Every thread of one kernel, by name."""

    def __init__(self) -> None:
        self.max_turns = 0
        self._threads: dict[str, ChatThread] = {}

    def get(self, name: str) -> ChatThread:
        """The thread called ``name`` (created empty on first use)."""
        thread = self._threads.setdefault(name, ChatThread(name))
        thread.max_turns = self.max_turns
        return thread

    def names(self) -> list[str]:
        """Names of threads that exist."""
        return list(self._threads)

    def __contains__(self, name: object) -> bool:
        return name in self._threads

    def reset(self, name: str | None = None) -> list[str]:
        """Clear thread ``name`` (every thread when None); returns the names cleared."""
        names = list(self._threads) if name is None else [name] if name in self._threads else []
        for cleared in names:
            del self._threads[cleared]
        return names

    def summary(self) -> dict[str, Any]:
        """``{name: number of turns}``."""
        return {name: len(t) for name, t in self._threads.items()}
