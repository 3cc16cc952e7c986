"""The :class:`Session` object: a conversation's settings, tools, history and usage, and the
entry points of a turn (``send`` / ``stream`` and their async twins)."""

from __future__ import annotations

import threading
import uuid
import warnings
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from ..adapter import Adapter
from ..approval import check_approve
from ..budget import Budget
from ..cost import CostTotal
from ..tools import Tool
from ..types import Message, Response, ToolDefinition, Usage
from ..validation import check_call, describe
from .inputs import SessionTool, session_tools
from .loop import ToolLoop
from .serialization import SavedSession, loads, restore_tools
from .stream import AsyncSessionStream, SessionStream, TurnState

if TYPE_CHECKING:
    from ..mcp import MCPServer, MCPTool
    from ..turn import TurnAccumulator

__all__ = ["Session"]


class Session(ToolLoop):
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
        self._system = system
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
        self._system = system

    @property
    def tools(self) -> list[Tool | ToolDefinition | dict[str, Any]]:
        """The tools, as :class:`Tool` (runnable), ``ToolDefinition`` (declared only) or
        provider built-in dicts."""
        return list(self._tools)

    @property
    def servers(self) -> list[MCPServer]:
        """The MCP servers whose tools this session offers."""
        return list(self._servers)

    @property
    def unhandled_tools(self) -> list[str]:
        """Names of declared tools without a Python handler: their calls come back to you."""
        return [t.name for t in self._tools if isinstance(t, ToolDefinition)]

    def set_tools(self, tools: Iterable[Any] | None) -> None:
        """Replace the tools (``None`` or ``[]``: none). Plain functions are wrapped with
        :func:`tool`; a ``Tool``'s name must be unique. An :class:`~dispatch_nb.mcp.MCPServer`
        brings its tools (listed at the next turn)."""
        from ..mcp import MCPServer

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
        """The conversation so far (the live list: edit it between turns if you need to)."""
        return self._history

    @history.setter
    def history(self, messages: Iterable[Message | dict[str, Any]]) -> None:
        """Replace the conversation (``Message`` s or their dicts), e.g. to resume or trim it."""
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
            aclose = getattr(self._adapter, "aclose", None)
            if aclose is not None:
                await aclose()
            else:
                self._adapter.close()

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
        tool loop, and return the model's final :class:`Response`.

        ``chat_options`` go to every model call: ``timeout`` (a total deadline for the turn),
        ``cancel``, ``max_tokens``, ``temperature``, ``system`` (this turn only), ``stream`` /
        ``on_delta``, ``max_retries``, ``tool_choice``...
        """
        state = TurnState(self.model)
        for _ in self._run(content, chat_options, state, streaming=False):
            pass
        assert state.response is not None
        return state.response

    def stream(
        self, content: Any, *, raise_errors: bool = True, **chat_options: Any
    ) -> SessionStream:
        """Like :meth:`send`, but returns a :class:`SessionStream` of events: ``StreamDelta`` s
        as the model writes, a ``ToolResultEvent`` per tool call, a ``MessageDoneEvent`` per
        model turn, and on failure an ``ErrorEvent`` (then the error is raised, unless
        ``raise_errors=False``). Nothing happens until you iterate."""
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
            model=f"{self._adapter.provider_name}:{self._adapter.model_name}",
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
        """Restore a session written by :meth:`to_json`.

        ``adapter``: the adapter (or model spec) to use; default: connect to the saved
        ``provider:model``. ``tools``: the Python handlers to re-attach, matched by name (a
        given tool's current definition wins; extra tools are added). Saved tools left without
        a handler stay declared to the model, are listed in :attr:`unhandled_tools`, and a
        ``UserWarning`` names them.
        """
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
