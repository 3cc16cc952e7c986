"""The turn loop of a session: one ``send`` from the user's message to the model's final answer,
under one :class:`~dispatch_nb.call_control.TurnControl` (the rules: docs/sessions.md).
:class:`ToolLoop` is the part of :class:`~dispatch_nb.session.Session` that runs turns; the sync
loop (:meth:`ToolLoop._run`: tools in order, on the caller's thread) and the async one
(:meth:`ToolLoop._arun`: tools concurrently) differ only in how they wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import AsyncGenerator, Generator, Iterator, Sequence
from decimal import Decimal
from typing import TYPE_CHECKING, Any, Literal

from ..approval import ToolCall, check_approve, decide
from ..call_control import TurnControl
from ..cancel import CancelToken
from ..errors import BudgetExceededError
from ..tools import Tool, error_result
from ..types import (
    Message,
    MessageDoneEvent,
    Response,
    StreamEvent,
    ToolDefinition,
    ToolResultBlock,
    ToolResultEvent,
    ToolUseBlock,
    Usage,
)
from ..validation import check_call
from .inputs import SessionTool, user_message
from .stream import TurnState

if TYPE_CHECKING:
    from ..adapter import Adapter
    from ..budget import Budget
    from ..cost import CostTotal
    from ..mcp import MCPServer, MCPTool
    from ..turn import TurnAccumulator

__all__ = ["ToolLoop", "Turn"]

logger = logging.getLogger("dispatch_nb")

#: what the loop does after a model answer
Action = Literal["done", "again", "limit", "tools"]

WHILE_TOOLS = "while running tools"


class Turn:
    """One ``send``: the options of its model calls, its :class:`TurnControl`, rounds so far, and
    the :class:`TurnState` it shares with its stream."""

    #: the user's message that began the turn (set once it is checked)
    message: Message

    def __init__(self, loop: ToolLoop, options: dict[str, Any], streaming: bool,
                 state: TurnState) -> None:
        self.state = state
        options = dict(options)
        if "tools" in options:
            raise TypeError("a session's tools are set with Session(tools=...) or set_tools()")
        for ignored in ("messages", "stream", "on_delta") if streaming else ("messages",):
            options.pop(ignored, None)
        check_call(
            **{k: options[k] for k in ("system", "max_tokens", "temperature", "timeout")
               if k in options}
        )
        timeout: float | None = options.pop("timeout", None)
        cancel = options.pop("cancel", None)
        #: this turn's approval policy (``approve=``; default: the session's)
        self.approve = options.pop("approve", loop._approve)
        check_approve(self.approve)
        if cancel is not None and not isinstance(cancel, CancelToken):
            raise TypeError(f"cancel must be a CancelToken, not {type(cancel).__name__}")
        self.system = options.pop("system", loop._system)
        for default in ("max_tokens", "temperature"):  # the session's, unless this turn sets one
            if options.get(default) is None:
                options[default] = getattr(loop, default)
        self.options = options
        #: the turn's deadline and cancel switch, handed to each model call
        self.control = TurnControl(timeout=timeout, cancel=cancel,
                                   provider=loop._adapter.provider_name)
        self.rounds = 0  # tool rounds run
        self.calls = 0  # model calls answered

    def tool_result(self, call: ToolUseBlock, result: ToolResultBlock, duration: float = 0.0,
                    approval: str | None = None) -> ToolResultEvent:
        """The event of a tool result on its way out, recorded in the turn's accumulator."""
        event = ToolResultEvent(result=result, tool_name=call.name, duration=duration,
                                approval=approval)
        self.state.collected.add_result(event)
        return event

    def call_kwargs(self, tools: list[ToolDefinition | dict[str, Any]]) -> dict[str, Any]:
        """Keyword arguments for the next model call: it carries the turn's control as its
        ``cancel=`` (and the turn's budget as its ``timeout``, so that the adapter's default
        timeout does not apply within a turn that has one: the turn's deadline comes first)."""
        self.control.check()
        kwargs = dict(self.options, system=self.system, tools=tools or None, cancel=self.control)
        if self.control.timeout is not None:
            kwargs["timeout"] = self.control.timeout
        return kwargs


class ToolLoop:
    """Runs a session's turns (mixed into :class:`~dispatch_nb.session.Session`, which owns the
    state declared here)."""

    id: str
    max_tool_rounds: int
    max_tokens: int | None
    temperature: float | None
    tool_limit_reached: bool
    last_response: Response | None
    last_turn: TurnAccumulator | None
    _adapter: Adapter
    _system: str | None
    _history: list[Message]
    _usage: Usage
    _cost: CostTotal
    budget: Budget | None
    _lock: threading.Lock
    _tools: list[SessionTool]
    _handlers: dict[str, Tool]
    _servers: list[MCPServer]
    _server_tools: list[MCPTool]
    _approve: Any
    _always: set[str]

    # -- the loop, sync --------------------------------------------------------------------------
    def _run(
        self, content: Any, options: dict[str, Any], state: TurnState, *, streaming: bool
    ) -> Generator[StreamEvent, None, None]:
        with self._turn(content, options, state, streaming) as turn:
            while True:
                if self._servers:
                    from ..mcp import run_sync

                    run_sync(self._alist_servers(), turn.control, "while listing MCP tools")
                kwargs = turn.call_kwargs(self._tool_payload())
                with self._model_call(turn, kwargs) as reserved:
                    if streaming:
                        with self._adapter.stream(self._wire_history(), **kwargs) as stream:
                            state.stream = stream
                            yield from stream
                        response = stream.response
                    else:
                        response = self._adapter.chat(self._wire_history(), **kwargs)
                yield self._answered(turn, response, reserved)
                action = self._next_action(turn, response)
                if action == "tools":
                    yield from self._run_tools(turn, response.tool_calls)
                elif action == "limit":
                    yield from self._stop_loop(turn, response)
                    return
                elif action == "done":
                    return

    def _run_tools(self, turn: Turn, calls: list[ToolUseBlock]) -> Generator[ToolResultEvent, None, None]:
        """Run one round's calls in order; before each, the turn's deadline and cancel."""
        done: list[ToolResultBlock | None] = [None] * len(calls)
        try:
            for i, call in enumerate(calls):
                turn.control.check(WHILE_TOOLS)
                started = time.monotonic()
                result, approval = self._run_one(turn, call)
                done[i] = result
                yield turn.tool_result(call, result, time.monotonic() - started, approval)
        except BaseException as exc:
            self._append_results(calls, done, exc)
            raise
        self._append_results(calls, done)
        turn.rounds += 1

    # -- the loop, async -------------------------------------------------------------------------
    async def _arun(
        self, content: Any, options: dict[str, Any], state: TurnState, *, streaming: bool
    ) -> AsyncGenerator[StreamEvent, None]:
        with self._turn(content, options, state, streaming) as turn:
            while True:
                if self._servers:
                    await turn.control.run_async(
                        asyncio.ensure_future(self._alist_servers()), "while listing MCP tools")
                kwargs = turn.call_kwargs(self._tool_payload())
                with self._model_call(turn, kwargs) as reserved:
                    if streaming:
                        astream = self._adapter.astream(self._wire_history(), **kwargs)
                        async with astream:
                            state.stream = astream
                            async for delta in astream:
                                yield delta
                        response = astream.response
                    else:
                        response = await self._adapter.achat(self._wire_history(), **kwargs)
                yield self._answered(turn, response, reserved)
                action = self._next_action(turn, response)
                if action == "tools":
                    for event in await self._arun_tools(turn, response.tool_calls):
                        yield event
                elif action == "limit":
                    for event in self._stop_loop(turn, response):
                        yield event
                    return
                elif action == "done":
                    return

    async def _arun_tools(self, turn: Turn, calls: list[ToolUseBlock]) -> list[ToolResultEvent]:
        """Run one round's calls concurrently, under the turn's deadline and cancel switch
        (which cancel the calls still running)."""
        done: list[ToolResultBlock | None] = [None] * len(calls)
        durations = [0.0] * len(calls)
        approvals: list[str | None] = [None] * len(calls)

        async def one(i: int, call: ToolUseBlock) -> None:
            started = time.monotonic()
            done[i], approvals[i] = await self._arun_one(turn, call)
            durations[i] = time.monotonic() - started

        try:
            turn.control.check(WHILE_TOOLS)
            tasks = [asyncio.ensure_future(one(i, c)) for i, c in enumerate(calls)]
            try:
                await turn.control.run_async(asyncio.gather(*tasks), WHILE_TOOLS)
            finally:
                for task in tasks:
                    task.cancel()
        except BaseException as exc:
            self._append_results(calls, done, exc)
            raise
        self._append_results(calls, done)
        turn.rounds += 1
        return [
            turn.tool_result(call, result, duration, approval)
            for call, result, duration, approval in zip(calls, done, durations, approvals,
                                                        strict=True)
            if result is not None
        ]

    # -- one tool call: approval, then the Python function or the MCP server ---------------------
    def _run_one(self, turn: Turn, call: ToolUseBlock) -> tuple[ToolResultBlock, str | None]:
        """Run one call in the sync loop: ask for approval if needed, then run it (an MCP tool
        on the library's loop thread, under the turn's deadline and Ctrl-C)."""
        handler = self._handlers.get(call.name)
        if handler is None:
            return self._unknown_tool(call), None
        approval, denied = self._approval(turn, call, handler)
        if denied is not None:
            return denied, approval
        if handler.is_async and hasattr(handler, "server"):
            from ..mcp import run_sync

            return run_sync(handler.arun(call), turn.control, WHILE_TOOLS), approval
        return handler.run(call), approval

    async def _arun_one(self, turn: Turn, call: ToolUseBlock) -> tuple[ToolResultBlock, str | None]:
        """The async loop's :meth:`_run_one` (approval asked on a worker thread)."""
        handler = self._handlers.get(call.name)
        if handler is None:
            return self._unknown_tool(call), None
        approval, denied = None, None
        if self._policy(turn, handler) != "auto":  # a person or a function decides
            approval, denied = await asyncio.to_thread(self._approval, turn, call, handler)
        if denied is not None:
            return denied, approval
        return await handler.arun(call), approval

    def _approval(
        self, turn: Turn, call: ToolUseBlock, handler: Tool
    ) -> tuple[str | None, ToolResultBlock | None]:
        """``(decision, denial result or None)`` for ``call`` under the turn's ``approve``:
        Python tools run without asking unless ``approve`` says otherwise, MCP tools are asked
        about (``"ask"``) by default; "Always" holds for the rest of the session."""
        server = getattr(handler, "server", None)
        policy = self._policy(turn, handler)
        if policy == "auto":
            return None, None
        if policy == "ask" and call.name in self._always:
            return "approved (always)", None
        request = ToolCall(
            id=call.id, name=call.name, arguments=dict(call.arguments),
            server=getattr(server, "name", None), description=handler.description,
        )
        decision = decide(policy, request, turn.control.remaining())
        if decision is None:
            return None, None
        if turn.control.expired():
            decision = "denied: no answer within the turn's deadline"
        if decision == "approved (always)":
            self._always.add(call.name)
        if decision.startswith("denied"):
            reason = decision.removeprefix("denied:").strip()
            return decision, error_result(
                call.id, f"{call.name} was not run: the user denied it ({reason})"
            )
        return decision, None

    @staticmethod
    def _policy(turn: Turn, handler: Tool) -> Any:
        """The turn's ``approve``; without one, "ask" for MCP tools and "auto" for the rest."""
        if turn.approve is not None:
            return turn.approve
        return "ask" if hasattr(handler, "server") else "auto"

    async def _alist_servers(self) -> None:
        """List the session's MCP servers (started on first use; listed again after a change)
        and make their tools callable; a clashing name gets the server's name as a prefix."""
        from ..mcp import gather_tools

        own = [t for t in self._tools if isinstance(t, Tool)]
        cache = getattr(self._adapter, "cache", None)  # a CachedAdapter records and replays
        self._server_tools = await gather_tools(
            self._servers, {t.name for t in own}, cache if hasattr(cache, "reads") else None)
        self._handlers = {t.name: t for t in [*own, *self._server_tools]}

    # -- shared steps ----------------------------------------------------------------------------
    @contextlib.contextmanager
    def _turn(self, content: Any, options: dict[str, Any], state: TurnState,
              streaming: bool) -> Iterator[Turn]:
        """Begin a turn: its options and control, the user's message checked and added to
        history, the session held for this turn alone; the control lets go at the end."""
        turn = Turn(self, options, streaming, state)
        with turn.control:
            turn.message = self._start(content)
            with self._turn_lock():
                self._history.append(turn.message)
                self.tool_limit_reached = False
                yield turn

    @contextlib.contextmanager
    def _turn_lock(self) -> Iterator[None]:
        """One turn at a time per session: a second concurrent turn is a mistake, not a wait."""
        if not self._lock.acquire(blocking=False):
            raise RuntimeError(
                "this session is already running a turn; wait for it to finish (or close its "
                "stream), or use one Session per concurrent conversation"
            )
        try:
            yield
        finally:
            self._lock.release()

    def _tool_payload(self) -> list[ToolDefinition | dict[str, Any]]:
        return [t.definition if isinstance(t, Tool) else t
                for t in [*self._tools, *self._server_tools]]

    def _start(self, content: Any) -> Message:
        """The user message for ``content``, checked against what the model is waiting for."""
        message = user_message(content)
        if self._history and self._history[-1].role == "assistant":
            answered = {b.tool_use_id for b in message.blocks if isinstance(b, ToolResultBlock)}
            missing = [b for b in self._history[-1].blocks
                       if isinstance(b, ToolUseBlock) and b.id not in answered]
            if missing:
                listed = ", ".join(f"{c.name} (id {c.id!r})" for c in missing)
                raise ValueError(
                    f"the model is waiting for the result of tool call(s) {listed}; answer them "
                    "with session.send([ToolResultBlock(tool_use_id=..., content=...), ...])"
                )
        return message

    def _wire_history(self) -> list[Message]:
        """History as sent: consecutive messages of one role merged into one."""
        out: list[Message] = []
        for message in self._history:
            if out and out[-1].role == message.role:
                out[-1] = Message(role=message.role, content=[*out[-1].blocks, *message.blocks])
            else:
                out.append(message)
        return out

    def _reserve(self, kwargs: dict[str, Any]) -> Decimal | None:
        """``budget=``: reserve the next call's worst case (its history's token bound +
        ``max_tokens`` of output) or raise :class:`BudgetExceededError` — nothing is sent."""
        if self.budget is None:
            return None
        from ..estimates import worst_case

        worst = worst_case(self._adapter, self._wire_history(), system=kwargs.get("system"),
                           tools=kwargs.get("tools"), max_tokens=kwargs.get("max_tokens"),
                           output=kwargs.get("output"))
        if kwargs.get("output") is not None:
            retries = kwargs.get("output_retries")
            worst *= 2 if retries is None else 1 + int(retries)
        return self.budget.reserve(worst)

    def _settle(self, reserved: Decimal | None, response: Any, *, failed: bool) -> None:
        if reserved is not None and self.budget is not None:
            from ..cost import attempt_cost

            partial = response if isinstance(response, Response) else None
            self.budget.settle(reserved, attempt_cost(partial, failed, reserved))

    @contextlib.contextmanager
    def _model_call(self, turn: Turn, kwargs: dict[str, Any]) -> Iterator[Decimal | None]:
        """Around one model call of the sync or the async loop: reserve its budget (the value
        given), and on any failure (an interrupt, the caller closing the turn) settle the call
        as :meth:`_call_failed` says; either way the turn has no model call streaming after."""
        reserved = None
        try:
            reserved = self._reserve(kwargs)
            yield reserved
        except BaseException as exc:
            self._call_failed(turn, exc, reserved)
            raise
        finally:
            turn.state.stream = None

    def _answered(self, turn: Turn, response: Response,
                  reserved: Decimal | None) -> MessageDoneEvent:
        """A model call answered: settle its budget reservation, count it, add its usage and
        answer to the session, and make it the turn's response so far."""
        self._settle(reserved, response, failed=False)
        turn.calls += 1
        self._usage = self._usage + response.usage
        self._cost.add(response.cost)
        self.last_response = response
        if response.content:  # providers reject an empty assistant message
            self._history.append(response.to_message())
        turn.state.collected.add_round(response)
        self.last_turn = turn.state.collected
        return MessageDoneEvent(response=response)

    def _call_failed(self, turn: Turn, exc: BaseException, reserved: Decimal | None) -> None:
        """A model call failed with ``exc`` (raised as it is: a call that ran out of the turn's
        time already raises the turn's timeout error): settle its budget reservation, count the
        usage of what arrived.

        A turn whose first call was refused before anything was sent (bad options: TypeError,
        ValueError) leaves no trace in history."""
        partial = getattr(exc, "partial", None)
        self._settle(reserved, partial, failed=True)
        if isinstance(partial, Response):
            self._usage = self._usage + partial.usage
        if (
            turn.calls == 0
            and isinstance(exc, (TypeError, ValueError, BudgetExceededError))
            and self._history
            and self._history[-1] is turn.message
        ):
            self._history.pop()

    def _next_action(self, turn: Turn, response: Response) -> Action:
        calls = response.tool_calls
        if not calls:
            if response.stop_reason == "pause_turn" and turn.rounds < self.max_tool_rounds:
                turn.rounds += 1
                return "again"  # the provider paused a long server-side turn: let it go on
            return "done"
        declared_only = {t.name for t in self._tools if isinstance(t, ToolDefinition)}
        if any(c.name in declared_only for c in calls):
            return "done"  # the caller answers these (see the module docstring)
        if turn.rounds >= self.max_tool_rounds:
            return "limit"
        return "tools"

    def _stop_loop(self, turn: Turn, response: Response) -> list[ToolResultEvent]:
        self.tool_limit_reached = True
        logger.warning(
            "session %s: stopped after %d tool rounds (max_tool_rounds); the model's last "
            "tool calls were not run",
            self.id,
            self.max_tool_rounds,
        )
        results = [
            error_result(
                c.id,
                f"not run: this session stops after {self.max_tool_rounds} tool rounds per turn "
                "(max_tool_rounds); the user may ask you to continue",
            )
            for c in response.tool_calls
        ]
        self._history.append(Message(role="user", content=list(results)))
        return [turn.tool_result(c, r) for c, r in zip(response.tool_calls, results, strict=True)]

    def _unknown_tool(self, call: ToolUseBlock) -> ToolResultBlock:
        names = ", ".join(t.name for t in [*self._tools, *self._server_tools]
                          if not isinstance(t, dict)) or "none"
        return error_result(call.id, f"unknown tool {call.name!r}; available tools: {names}")

    def _append_results(
        self,
        calls: Sequence[ToolUseBlock],
        results: Sequence[ToolResultBlock | None],
        interrupted: BaseException | None = None,
    ) -> None:
        blocks: list[Any] = []
        for call, result in zip(calls, results, strict=True):
            if result is None:
                why = type(interrupted).__name__ if interrupted is not None else "interrupted"
                result = error_result(
                    call.id, f"not run: the turn was interrupted ({why}) before {call.name} finished"
                )
            blocks.append(result)
        self._history.append(Message(role="user", content=blocks))
