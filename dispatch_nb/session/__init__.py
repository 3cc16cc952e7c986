"""Sessions: one conversation with a model, running Python tools, that never hangs or loses what arrived.

::

    session = Session("openai:gpt-4.1", system="Be brief.", tools=[get_weather])
    answer = session.send("Weather in Paris?")      # runs the tool loop, returns the final Response
    for event in session.stream("And in Oslo?"):    # StreamDelta / ToolResultEvent /
        ...                                          # MessageDoneEvent / ErrorEvent
    text = session.to_json()                         # restores exactly with Session.from_json(text)

**The tool loop.** After each model turn that asks for tools, the session runs them (validated by
:class:`~dispatch_nb.tools.Tool`; several calls of one turn run in call order, concurrently in
``asend`` / ``astream``), appends the results and asks the model again, until the model answers
without tool calls. Problems in a tool go back to the model as ``is_error`` results. After
``max_tool_rounds`` rounds the loop stops without running the new calls: they get ``is_error``
results saying so (history stays valid; ``send("continue")`` lets the model go on), the last
``Response`` is returned (its ``stop_reason`` is still ``"tool_use"``), ``tool_limit_reached`` is
True and a warning is logged. A call to a declared tool without a Python handler (a plain
``ToolDefinition``, or a restored session whose handlers were not re-attached) ends the turn and
returns the ``Response``: answer it with ``send([ToolResultBlock(tool_use_id=..., content=...)])``.

**Failures.** ``timeout=`` is a total deadline for the whole turn (every model call and tool).
If a turn fails or is cancelled, history keeps the user message and every completed model turn
(with its tool results; tools that did not finish get ``is_error`` results); the unfinished
answer is *not* added to history but is on the exception's ``partial`` (a turn refused before
anything was sent, e.g. for an unknown option, leaves no trace). Consecutive messages of one
role (e.g. a new question after a failed turn) are merged when sent, so every provider accepts
them.

**Streams.** :meth:`Session.stream` returns a :class:`SessionStream`. On a failure it yields one
:class:`~dispatch_nb.types.ErrorEvent` (``error`` carries ``partial``) and then raises that error
(``raise_errors=False``: it just ends; the error stays on ``stream.error``). ``KeyboardInterrupt``
and task cancellation are raised at once, with ``partial`` attached.

**Turn control.** Each turn makes one :class:`~dispatch_nb.call_control.TurnControl` (its deadline
and cancel switch) and hands it to every model call and tool run of the turn.

The package: :mod:`~dispatch_nb.session.core` (the :class:`Session` object),
:mod:`~dispatch_nb.session.loop` (the turn loop), :mod:`~dispatch_nb.session.stream` (the
stream objects), :mod:`~dispatch_nb.session.serialization` (the saved format) and
:mod:`~dispatch_nb.session.inputs` (tools and content, normalized).
"""

from __future__ import annotations

from ..call_control import TurnControl
from ..cancel import CancelToken
from ..tools import Tool, tool
from .core import Session
from .serialization import FORMAT as FORMAT
from .serialization import VERSION as VERSION
from .stream import AsyncSessionStream, SessionStream

__all__ = [
    "AsyncSessionStream",
    "CancelToken",
    "Session",
    "SessionStream",
    "Tool",
    "TurnControl",
    "tool",
]
