"""The :class:`Session` object: a conversation's settings, tools, history and usage, the entry
points of a turn (``send`` / ``stream`` and their async twins) and the turn loop, under one
:class:`~dispatch_nb.call_control.TurnControl` per turn (the rules: docs/sessions.md). The sync
loop (:meth:`Session._run`: tools in order, on the caller's thread) and the async one
(:meth:`Session._arun`: tools concurrently) differ only in how they wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
import uuid
import warnings
from collections.abc import AsyncGenerator, Generator, Iterable, Iterator, Sequence
from decimal import Decimal
from typing import TYPE_CHECKING, Any, Literal

from ..adapter import Adapter
from ..approval import SAID_NO, NotAsked, ToolCall, check_approve, decide
from ..budget import Budget
from ..call_control import TurnControl
from ..cancel import CancelToken
from ..cost import CostTotal
from ..errors import BudgetExceededError
from ..render import is_replayed
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
from ..validation import check_call, check_tools, clean_messages, clean_text, describe
from .inputs import SessionTool, session_tools, user_message
from .serialization import SavedSession, loads, restore_tools
from .stream import AsyncSessionStream, SessionStream, TurnState

if TYPE_CHECKING:
    from ..mcp import MCPServer, MCPTool
    from ..turn import TurnAccumulator

__all__ = ["Session", "Turn"]

logger = logging.getLogger("dispatch_nb")

#: what the loop does after a model answer
Action = Literal["done", "again", "limit", "tools"]

WHILE_TOOLS = "while running tools"


class Turn:
    """One ``send``: the options of its model calls, its :class:`TurnControl`, rounds so far, and
    the :class:`TurnState` it shares with its stream."""

    #: the user's message that began the turn (set once it is checked)
    message: Message

    def __init__(self, session: Session, options: dict[str, Any], streaming: bool,
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
        self.approve = options.pop("approve", session._approve)
        check_approve(self.approve)
        if cancel is not None and not isinstance(cancel, CancelToken):
            raise TypeError(f"cancel must be a CancelToken, not {type(cancel).__name__}")
        self.system = options.pop("system", session._system)
        for default in ("max_tokens", "temperature"):  # the session's, unless this turn sets one
            if options.get(default) is None:
                options[default] = getattr(session, default)
        self.options = options
        #: the turn's deadline and cancel switch, handed to each model call
        self.control = TurnControl(timeout=timeout, cancel=cancel,
                                   provider=session._adapter.provider_name)
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


def _sendable(system: str | None) -> str | None:
    """A system prompt as every turn will send it: lone surrogates replaced once, with one
    warning (anything but a str is left for the call's checks to refuse)."""
    return clean_text(system, "the system prompt") if isinstance(system, str) else system


class Session:
    """A conversation with one model: history, system prompt, Python tools and the tool loop.

    The arguments are in docs/sessions.md (``approve=`` and ``context=``: docs/tools.md;
    ``budget=``: docs/cost.md).
    """

    def __init__(
        self,
        model_or_adapter: Adapter | str | None,
        *,
        system: str | None = None,
        tools: Iterable[Any] | None = None,
        max_tool_rounds: int = 8,
        id: str | None = None,
        max_tokens: int | None = None,
        temperature: float | None = None,
        budget: Budget | float | str | None = None,
        approve: Any = None,
        context: Any = None,
    ) -> None:
        # Every argument is checked before an adapter is made (and long before any request).
        check_call(
            "Session: ", system=system, max_tool_rounds=max_tool_rounds, id=id,
            max_tokens=max_tokens, temperature=temperature,
        )
        check_approve(approve)
        if context is not None:  # read-only tools over the notebook's variables (context.py)
            from ..context import session_context

            tools = [*(tools or []), *session_context(context)]
        if isinstance(model_or_adapter, Adapter):
            self._adapter, self._owns_adapter = model_or_adapter, False
        elif model_or_adapter is None or isinstance(model_or_adapter, str):
            from ..registry import connect, default_model_spec

            spec = default_model_spec() if model_or_adapter is None else model_or_adapter
            self._adapter, self._owns_adapter = connect(spec), True
        else:
            raise TypeError(
                "Session needs an Adapter or a model spec such as 'openai:gpt-4.1' (None: the "
                f"default model) — not {describe(model_or_adapter)}"
            )
        #: this conversation's id (given, or a random hex uuid); survives to_json/from_json
        self.id: str = id or uuid.uuid4().hex
        #: tool rounds one turn may run before the loop stops (docs/sessions.md)
        self.max_tool_rounds = max_tool_rounds
        #: default ``max_tokens`` for every model call (None: the adapter's default)
        self.max_tokens = max_tokens
        #: default ``temperature`` for every model call (None: the provider's default)
        self.temperature = temperature
        #: True when the last turn stopped because ``max_tool_rounds`` was reached
        self.tool_limit_reached = False
        #: the last model answer (of any turn)
        self.last_response: Response | None = None
        #: the last turn, collected: its rounds, tool results and summed usage
        #: (a :class:`~dispatch_nb.turn.TurnAccumulator`; ``.events()`` replays it)
        self.last_turn: TurnAccumulator | None = None
        self._system = _sendable(system)
        self._history: list[Message] = []
        self._usage = Usage()
        self._cost = CostTotal()
        #: ``budget=``: US dollars this session may spend (docs/cost.md); a call whose worst
        #: case does not fit is not sent (:class:`~dispatch_nb.errors.BudgetExceededError`)
        self.budget = Budget.of(budget)
        self._lock = threading.Lock()
        self._tools: list[SessionTool] = []
        self._handlers: dict[str, Tool] = {}
        self._servers: list[MCPServer] = []
        self._server_tools: list[MCPTool] = []
        #: who approves tool calls: "auto", "ask" or a function (None: ask for MCP tools only)
        self._approve = approve
        self._always: set[str] = set()
        self.set_tools(tools)

    # -- configuration -------------------------------------------------------------------------
    @property
    def adapter(self) -> Adapter:
        """The adapter this session talks through."""
        return self._adapter

    @property
    def model(self) -> str:
        """The model's name."""
        return self._adapter.model_name

    @property
    def system(self) -> str | None:
        """The system prompt (change it with :meth:`set_system_prompt`)."""
        return self._system

    def set_system_prompt(self, system: str | None) -> None:
        """Use ``system`` from the next turn on (``None``: no system prompt)."""
        self._system = _sendable(system)

    @property
    def tools(self) -> list[Tool | ToolDefinition | dict[str, Any]]:
        """The tools, as :class:`Tool` (runnable), ``ToolDefinition`` (declared only) or
        provider built-in dicts."""
        return list(self._tools)

    @property
    def unhandled_tools(self) -> list[str]:
        """Names of declared tools without a Python handler: their calls come back to you."""
        return [t.name for t in self._tools if isinstance(t, ToolDefinition)]

    def set_tools(self, tools: Iterable[Any] | None) -> None:
        """Replace the tools (``None`` or ``[]``: none). Plain functions are wrapped with
        :func:`tool`; a ``Tool``'s name must be unique. An :class:`~dispatch_nb.mcp.MCPServer`
        brings its tools (listed at the next turn)."""
        from ..mcp import MCPServer

        check_tools(tools)
        items = list(tools or [])
        self._servers = [t for t in items if isinstance(t, MCPServer)]
        self._server_tools = []
        out = session_tools([t for t in items if not isinstance(t, MCPServer)])
        names = [t.name for t in out if not isinstance(t, dict)]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"tool names must be unique; repeated: {', '.join(dupes)}")
        self._tools = out
        self._handlers = {t.name: t for t in out if isinstance(t, Tool)}

    # -- state ---------------------------------------------------------------------------------
    @property
    def history(self) -> list[Message]:
        """The conversation so far (the live list: edit it between turns if you need to); set it
        to ``Message`` s or their dicts, e.g. to resume or trim it."""
        return self._history

    @history.setter
    def history(self, messages: Iterable[Message | dict[str, Any]]) -> None:
        history = [m if isinstance(m, Message) else Message.model_validate(m) for m in messages]
        with self._turn_lock():
            self._history = history

    @property
    def usage(self) -> Usage:
        """Tokens used by every model call of this session, failed ones included."""
        return self._usage

    @property
    def cost(self) -> CostTotal:
        """What this session's answers cost (docs/cost.md): the sum of every model call's
        ``Response.cost``; replayed answers count 0 (and as saved), unknown prices are counted
        in ``unknown``. Not reset by :meth:`clear_history`."""
        return self._cost

    def clear_history(self) -> None:
        """Forget the conversation (the id, settings, tools and cumulative usage stay)."""
        with self._turn_lock():
            self._history.clear()
            self.tool_limit_reached = False
            self.last_response = None
            self.last_turn = None

    def close(self) -> None:
        """Stop its MCP servers; release the adapter's connections if this session created
        the adapter."""
        for server in self._servers:
            server.close()
        if self._owns_adapter:
            self._adapter.close()

    async def aclose(self) -> None:
        """The async twin of :meth:`close`."""
        for server in self._servers:
            await server.aclose()
        if self._owns_adapter:
            await self._adapter.aclose()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> Session:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return (
            f"Session(id={self.id!r}, model={self._adapter.provider_name}:{self.model}, "
            f"messages={len(self._history)}, tools={[getattr(t, 'name', 'builtin') for t in self._tools]})"
        )

    # -- sending -------------------------------------------------------------------------------
    def send(self, content: Any, **chat_options: Any) -> Response:
        """Add ``content`` (a str, blocks, or a user :class:`Message`) as the user's turn, run the
        tool loop, and return the model's final :class:`Response`; ``chat_options`` go to every
        model call of the turn (docs/sessions.md)."""
        state = TurnState(self.model)
        for _ in self._run(content, chat_options, state, streaming=False):
            pass
        assert state.response is not None
        return state.response

    def stream(
        self, content: Any, *, raise_errors: bool = True, **chat_options: Any
    ) -> SessionStream:
        """Like :meth:`send`, but returns a :class:`SessionStream` of the turn's events
        (docs/sessions.md, "Streaming events"). Nothing happens until you iterate."""
        state = TurnState(self.model)
        return SessionStream(
            self._run(content, chat_options, state, streaming=True), state, raise_errors
        )

    async def asend(self, content: Any, **chat_options: Any) -> Response:
        """The async twin of :meth:`send`; tool calls of one turn run concurrently."""
        state = TurnState(self.model)
        async for _ in self._arun(content, chat_options, state, streaming=False):
            pass
        assert state.response is not None
        return state.response

    def astream(
        self, content: Any, *, raise_errors: bool = True, **chat_options: Any
    ) -> AsyncSessionStream:
        """The async twin of :meth:`stream` (``async for event in session.astream(...)``)."""
        state = TurnState(self.model)
        return AsyncSessionStream(
            self._arun(content, chat_options, state, streaming=True), state, raise_errors
        )

    # -- serialization (the format: dispatch_nb.session.serialization) ---------------------------
    def to_json(self, *, indent: bool = False) -> str:
        """The whole session as JSON: id, model, settings, system prompt, tool definitions (not
        their Python handlers), history (thinking signatures, provider data, tool calls
        included) and usage. :meth:`from_json` restores it exactly."""
        return SavedSession(
            id=self.id,
            model=self._adapter.spec,
            system=self._system,
            max_tool_rounds=self.max_tool_rounds,
            max_tokens=self.max_tokens,
            temperature=self.temperature,
            tools=[t.definition if isinstance(t, Tool) else t
                   for t in self._tools if not isinstance(t, dict)],
            builtin_tools=[t for t in self._tools if isinstance(t, dict)],
            history=self._history,
            usage=self._usage,
        ).dumps(indent=indent)

    @classmethod
    def from_json(
        cls,
        text: str | bytes,
        *,
        adapter: Adapter | str | None = None,
        tools: Iterable[Any] | None = None,
    ) -> Session:
        """Restore a session written by :meth:`to_json`, through ``adapter`` (default: the saved
        ``provider:model``), with the Python handlers of ``tools`` re-attached by name (a given
        tool's current definition wins; docs/sessions.md, "Saving and resuming")."""
        saved = loads(text)
        session = cls(
            adapter if adapter is not None else saved.model,
            system=saved.system,
            max_tool_rounds=saved.max_tool_rounds,
            id=saved.id,
            max_tokens=saved.max_tokens,
            temperature=saved.temperature,
        )
        session.set_tools(restore_tools(saved, session_tools(tools)))
        missing = session.unhandled_tools
        if missing:
            warnings.warn(
                f"session {session.id}: no Python handler for tool(s) {', '.join(missing)}; pass "
                "them with Session.from_json(..., tools=[...]). Until then the model still sees "
                "them and its calls to them come back to you unanswered.",
                UserWarning,
                stacklevel=2,
            )
        session._history = saved.history
        session._usage = saved.usage
        return session

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
        with self._round(turn, calls) as done:
            for i, call in enumerate(calls):
                turn.control.check(WHILE_TOOLS)
                result, approval, duration = self._run_one(turn, call)
                done[i] = result
                yield turn.tool_result(call, result, duration, approval)

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
        durations = [0.0] * len(calls)
        approvals: list[str | None] = [None] * len(calls)

        async def one(i: int, call: ToolUseBlock) -> None:
            done[i], approvals[i], durations[i] = await self._arun_one(turn, call)

        with self._round(turn, calls) as done:
            turn.control.check(WHILE_TOOLS)
            tasks = [asyncio.ensure_future(one(i, c)) for i, c in enumerate(calls)]
            try:
                await turn.control.run_async(asyncio.gather(*tasks), WHILE_TOOLS)
            finally:
                for task in tasks:
                    task.cancel()
        return [
            turn.tool_result(call, result, duration, approval)
            for call, result, duration, approval in zip(calls, done, durations, approvals,
                                                        strict=True)
            if result is not None
        ]

    # -- one tool call: approval, then the Python function or the MCP server ---------------------
    def _run_one(self, turn: Turn, call: ToolUseBlock
                 ) -> tuple[ToolResultBlock, str | None, float]:
        """Run one call in the sync loop: ask for approval if needed, then run it (an MCP tool
        on the library's loop thread, under the turn's deadline and Ctrl-C). Returns the
        result, the approval decision and how long the tool ran (not the wait for approval)."""
        handler = self._handlers.get(call.name)
        if handler is None:
            return self._unknown_tool(call), None, 0.0
        approval, denied = self._approval(turn, call, handler)
        if denied is not None:
            return denied, approval, 0.0
        started = time.monotonic()
        if handler.is_async and hasattr(handler, "server"):
            from ..mcp import run_sync

            result = run_sync(handler.arun(call), turn.control, WHILE_TOOLS)
        else:
            result = handler.run(call)
        return result, approval, time.monotonic() - started

    async def _arun_one(self, turn: Turn, call: ToolUseBlock
                        ) -> tuple[ToolResultBlock, str | None, float]:
        """The async loop's :meth:`_run_one` (approval asked on a worker thread)."""
        handler = self._handlers.get(call.name)
        if handler is None:
            return self._unknown_tool(call), None, 0.0
        approval, denied = None, None
        if self._policy(turn, handler) != "auto":  # a person or a function decides
            approval, denied = await asyncio.to_thread(self._approval, turn, call, handler)
        if denied is not None:
            return denied, approval, 0.0
        started = time.monotonic()
        result = await handler.arun(call)
        return result, approval, time.monotonic() - started

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
            decision = NotAsked("denied: no answer within the turn's deadline")
        if decision == "approved (always)":
            self._always.add(call.name)
        if decision.startswith("denied"):
            reason = decision.removeprefix("denied:").strip()
            if not isinstance(decision, NotAsked):  # a person (or an approval function) said no
                reason = "the user denied it" + ("" if reason == SAID_NO else f" ({reason})")
            return decision, error_result(call.id, f"{call.name} was not run: {reason}")
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
        """The user message for ``content``, checked against what the model is waiting for; lone
        surrogates in its text are replaced here, once (one warning), so the history holds what
        was sent: later turns send it again without a warning, and ``to_json`` can save it."""
        message: Message = clean_messages(user_message(content))
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
        given); on any failure (an interrupt, the caller closing the turn too: the error is
        raised as it is) settle the reservation and count the usage of what arrived. A turn whose
        first call was refused before anything was sent (bad options: TypeError, ValueError; or
        over budget) leaves no trace in history. Either way no model call streams after."""
        reserved = None
        try:
            reserved = self._reserve(kwargs)
            yield reserved
        except BaseException as exc:
            partial = getattr(exc, "partial", None)
            self._settle(reserved, partial, failed=True)
            if isinstance(partial, Response):
                self._usage = self._usage + partial.usage
            if (turn.calls == 0 and isinstance(exc, (TypeError, ValueError, BudgetExceededError))
                    and self._history and self._history[-1] is turn.message):
                self._history.pop()
            raise
        finally:
            turn.state.stream = None

    def _answered(self, turn: Turn, response: Response,
                  reserved: Decimal | None) -> MessageDoneEvent:
        """A model call answered: its budget settled, its usage and answer the session's and the
        turn's so far."""
        self._settle(reserved, response, failed=False)
        turn.calls += 1
        self._usage = self._usage + response.usage
        self._cost.add(response.cost, replayed=is_replayed(response))
        self.last_response = response
        if response.content:  # providers reject an empty assistant message
            self._history.append(response.to_message())
        turn.state.collected.add_round(response)
        self.last_turn = turn.state.collected
        return MessageDoneEvent(response=response)

    def _next_action(self, turn: Turn, response: Response) -> Action:
        calls = response.tool_calls
        if not calls:
            if response.stop_reason == "pause_turn" and turn.rounds < self.max_tool_rounds:
                turn.rounds += 1
                return "again"  # the provider paused a long server-side turn: let it go on
            return "done"
        declared_only = {t.name for t in self._tools if isinstance(t, ToolDefinition)}
        if any(c.name in declared_only for c in calls):
            return "done"  # the caller answers these (docs/sessions.md)
        if turn.rounds >= self.max_tool_rounds:
            return "limit"
        return "tools"

    def _stop_loop(self, turn: Turn, response: Response) -> list[ToolResultEvent]:
        self.tool_limit_reached = True
        rounds = f"{self.max_tool_rounds} tool round{'' if self.max_tool_rounds == 1 else 's'}"
        logger.warning("session %s: stopped after %s (max_tool_rounds); the model's last tool "
                       "calls were not run", self.id, rounds)
        results = [
            error_result(c.id, f"not run: this session stops after {rounds} per turn "
                               "(max_tool_rounds); the user may ask you to continue")
            for c in response.tool_calls
        ]
        self._history.append(Message(role="user", content=list(results)))
        return [turn.tool_result(c, r) for c, r in zip(response.tool_calls, results, strict=True)]

    def _unknown_tool(self, call: ToolUseBlock) -> ToolResultBlock:
        names = ", ".join(t.name for t in [*self._tools, *self._server_tools]
                          if not isinstance(t, dict)) or "none"
        return error_result(call.id, f"unknown tool {call.name!r}; available tools: {names}")

    @contextlib.contextmanager
    def _round(self, turn: Turn, calls: Sequence[ToolUseBlock]
               ) -> Iterator[list[ToolResultBlock | None]]:
        """One round of tool calls and the list their results go in: however the round ends,
        they go to history (a call an interruption left unrun, as an error result)."""
        done: list[ToolResultBlock | None] = [None] * len(calls)
        why = ""
        try:
            yield done
            turn.rounds += 1
        except BaseException as exc:
            why = type(exc).__name__
            raise
        finally:
            blocks: list[Any] = [
                result if result is not None else error_result(
                    call.id, f"not run: the turn was interrupted ({why}) before {call.name} finished")
                for call, result in zip(calls, done, strict=True)
            ]
            self._history.append(Message(role="user", content=blocks))
