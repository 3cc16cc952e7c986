"""One turn's events become its answer: :class:`TurnAccumulator` (docs/sessions.md).

A turn is what one ``send`` / one ``%%chat`` cell produces: model rounds and the tool results
between them. The notebook's transcript, the response cache and sessions collect turns with it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from .stream import Accumulator
from .types import (
    Message,
    MessageDoneEvent,
    Response,
    StreamDelta,
    ToolResultEvent,
    Usage,
)

__all__ = ["TextPart", "ToolRun", "TurnAccumulator"]

_DELTAS = frozenset(
    {"text_delta", "thinking_delta", "tool_use_start", "tool_use_delta", "tool_use_end"}
)


@dataclass
class TextPart:
    """A run of answer text (``kind == "text"``) or visible reasoning (``"thinking"``)."""

    kind: str
    text: str


@dataclass(slots=True, eq=False, repr=False)
class ToolRun:
    """A tool call the model made (its arguments as they stream) and, once it ran, its result."""

    #: the accumulator's record of the call (``id``, ``name``, ``parts``, ``arguments``)
    call: Any
    #: the result's text, once the tool ran
    result: str | None = None
    is_error: bool = False
    duration: float | None = None
    #: True when the turn was interrupted while this tool still ran (its result is dropped)
    abandoned: bool = False
    #: the approval decision, when one was asked for ("approved", "denied: …")
    approval: str | None = None
    #: True while the call waits for a person's approval (it has not started)
    waiting: bool = False

    @property
    def id(self) -> str:
        return str(self.call.id)

    @property
    def name(self) -> str:
        return str(self.call.name) or "?"

    @property
    def arguments(self) -> dict[str, Any] | None:
        """The arguments once the call ended (None while they stream)."""
        if not self.call.done:
            return None
        arguments = self.call.arguments
        return arguments if arguments is not None else {}

    @property
    def arguments_text(self) -> str:
        """The arguments as compact JSON (or the raw fragments while they stream)."""
        arguments = self.arguments
        if arguments is not None:
            return json.dumps(arguments, ensure_ascii=False)
        return "".join(self.call.parts)

    def __repr__(self) -> str:
        return (f"ToolRun(id={self.id!r}, name={self.name!r}, arguments={self.arguments_text!r}, "
                f"result={self.result!r}, is_error={self.is_error})")


class TurnAccumulator:
    """Collects one turn — model rounds, their streamed deltas, tool results — from its events."""

    def __init__(self, model: str = "") -> None:
        #: everything that streamed in this turn, in order (rounds one after another)
        self.answer = Accumulator(model)
        #: each model round's final answer, in order
        self.rounds: list[Response] = []
        #: the tool results, in order
        self.results: list[ToolResultEvent] = []
        #: the turn's usage, summed over its rounds (None before the first round ends)
        self.usage: Usage | None = None
        #: the model that answered (the last round's)
        self.model = model
        #: the last round's stop reason
        self.stop_reason: str | None = None
        #: True once any answer text arrived (cheap to ask on every repaint)
        self.has_text = False
        #: every tool call, in the order they started
        self.tools: list[ToolRun] = []
        self._runs: dict[int, ToolRun] = {}
        self._by_id: dict[str, ToolRun] = {}
        self._steps: list[Response | ToolResultEvent] = []

    # -- feeding ---------------------------------------------------------------------------------
    def feed(self, event: Any) -> None:
        """Take one event: a :class:`~dispatch_nb.types.StreamDelta`, a ``ToolResultEvent`` or a
        ``MessageDoneEvent`` (anything else is ignored)."""
        kind = getattr(event, "type", None)
        if kind in _DELTAS:
            if kind == "text_delta" and event.text:
                self.has_text = True
            self.answer.feed(event)
            call = self.answer.tool(event.tool_call_id or "") if kind == "tool_use_start" else None
            if call is not None and id(call) not in self._runs:
                run = ToolRun(call)
                self._runs[id(call)] = run
                self._by_id[run.id] = run
                self.tools.append(run)
        elif kind == "tool_result":
            self.add_result(event)
        elif kind == "message_done":
            self.add_round(event.response)

    def add_round(self, response: Response) -> None:
        """One model round finished with ``response`` (its usage adds to the turn's)."""
        self.rounds.append(response)
        self._steps.append(response)
        self.usage = response.usage if self.usage is None else self.usage + response.usage
        self.model = response.model or self.model
        self.stop_reason = response.stop_reason

    def add_result(self, event: ToolResultEvent) -> None:
        """A tool ran: its result goes to its call."""
        self.results.append(event)
        self._steps.append(event)
        result = event.result
        run = self._by_id.get(result.tool_use_id)
        if run is not None:
            run.waiting = False
            run.result = result.text
            run.is_error = result.is_error
            run.duration = event.duration
            run.approval = event.approval

    def finish(self, response: Response | None) -> None:
        """Take ``response`` as the round when none ended (a caller that saw only deltas, or the
        partial answer of a failure)."""
        if response is not None and not self.rounds:
            self.add_round(response)

    def abandon_tools(self) -> list[ToolRun]:
        """Mark the tools still running (not waiting for approval) as abandoned (an interrupt);
        returns them."""
        running = [t for t in self.tools
                   if t.arguments is not None and t.result is None and not t.waiting]
        for tool in running:
            tool.abandoned = True
        return running

    def stop_waiting(self, reason: str) -> list[ToolRun]:
        """The calls still waiting for approval are not run (an interrupt): each gets the error
        result ``NAME was not run: reason``; returns them."""
        waiting = [t for t in self.tools if t.waiting and t.result is None]
        for tool in waiting:
            tool.waiting = False
            tool.result = f"{tool.name} was not run: {reason}"
            tool.is_error = True
        return waiting

    # -- reading ---------------------------------------------------------------------------------
    def tool(self, tool_call_id: str) -> ToolRun | None:
        """The tool call with this id (the last one, should a model reuse an id)."""
        return self._by_id.get(tool_call_id)

    def parts(self) -> list[TextPart | ToolRun]:
        """What streamed, in order: runs of text and of thinking, and the tool calls."""
        out: list[TextPart | ToolRun] = []
        for kind, value in self.answer.pieces():
            if kind == "tool":
                run = self._runs.get(id(value))
                if run is not None:
                    out.append(run)
            elif kind in ("text", "thinking"):
                out.append(TextPart(kind, value))
        return out

    @property
    def text(self) -> str:
        """The answer's text (every round), without thinking or tool calls."""
        return "".join(v for k, v in self.answer.pieces() if k == "text")

    @property
    def thinking(self) -> str:
        """The visible reasoning, joined."""
        return "".join(v for k, v in self.answer.pieces() if k == "thinking")

    @property
    def empty(self) -> bool:
        """True when nothing at all arrived (no text, thinking or tool call)."""
        return not any(k == "tool" or (k in ("text", "thinking") and v.strip())
                       for k, v in self.answer.pieces())

    @property
    def response(self) -> Response | None:
        """The last round's answer (None before a round ended)."""
        return self.rounds[-1] if self.rounds else None

    def messages(self) -> list[Message]:
        """The history the turn added after the user's message: each non-empty round's answer
        and, after it, one user message with the results of its tool calls."""
        out: list[Message] = []
        results: list[Any] = []
        for step in self._steps:
            if isinstance(step, Response):
                if results:
                    out.append(Message(role="user", content=results))
                    results = []
                if step.content:
                    out.append(step.to_message())
            else:
                results.append(step.result)
        if results:
            out.append(Message(role="user", content=results))
        return out

    def events(self) -> list[StreamDelta | MessageDoneEvent | ToolResultEvent]:
        """The turn as the events that make it (each round's :meth:`Response.events
        <dispatch_nb.types.Response.events>`, then its tool results): :meth:`replay` them."""
        out: list[StreamDelta | MessageDoneEvent | ToolResultEvent] = []
        for step in self._steps:
            if isinstance(step, Response):
                out.extend(step.events())
            else:
                out.append(step)
        return out

    @classmethod
    def replay(cls, events: Iterable[Any], model: str = "") -> TurnAccumulator:
        """A turn accumulator fed with ``events``."""
        turn = cls(model)
        for event in events:
            turn.feed(event)
        return turn
