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
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
import warnings
from collections.abc import AsyncGenerator, Generator, Iterable, Sequence
from typing import Any

import orjson
from pydantic import BaseModel, TypeAdapter

from .adapter import Adapter, normalize_tools
from .cancel import CancelToken
from .errors import APITimeoutError, RequestCancelled
from .stream import AsyncResponseStream, ResponseStream
from .tools import Tool, error_result, tool
from .types import (
    Block,
    ErrorEvent,
    Message,
    MessageDoneEvent,
    Response,
    StreamEvent,
    TextBlock,
    ToolDefinition,
    ToolResultBlock,
    ToolResultEvent,
    ToolUseBlock,
    Usage,
)
from .validation import check_call, describe

__all__ = ["AsyncSessionStream", "CancelToken", "Session", "SessionStream", "Tool", "tool"]

logger = logging.getLogger("dispatch_nb")

#: the ``format`` and ``version`` written by :meth:`Session.to_json`
FORMAT = "dispatch_nb.session"
VERSION = 1

_BLOCK = TypeAdapter(Block)
_SessionTool = Tool | ToolDefinition | dict[str, Any]


class _State:
    """What a running turn shares with the stream object that drives it."""

    __slots__ = ("response", "stream")

    def __init__(self) -> None:
        self.stream: ResponseStream | AsyncResponseStream | None = None
        self.response: Response | None = None


class _Turn:
    """One ``send``: per-call options, the total deadline, the cancel token, rounds so far."""

    def __init__(self, session: Session, options: dict[str, Any]) -> None:
        options = dict(options)
        if "tools" in options:
            raise TypeError("a session's tools are set with Session(tools=...) or set_tools()")
        options.pop("messages", None)
        check_call(
            **{k: options[k] for k in ("system", "max_tokens", "temperature", "timeout")
               if k in options}
        )
        self.timeout: float | None = options.pop("timeout", None)
        cancel = options.get("cancel")
        if cancel is not None and not isinstance(cancel, CancelToken):
            raise TypeError(f"cancel must be a CancelToken, not {type(cancel).__name__}")
        self.cancel: CancelToken | None = cancel
        self.system = options.pop("system", session.system)
        if options.get("max_tokens") is None:
            options["max_tokens"] = session.max_tokens
        if options.get("temperature") is None:
            options["temperature"] = session.temperature
        self.options = options
        self.provider = session.adapter.provider_name
        self.started = time.monotonic()
        self.deadline = self.started + self.timeout if self.timeout is not None else None
        self.rounds = 0  # tool rounds run
        self.calls = 0  # model calls answered

    def call_kwargs(self, tools: list[ToolDefinition | dict[str, Any]]) -> dict[str, Any]:
        """Keyword arguments for the next model call (``timeout`` = what is left)."""
        self.check()
        kwargs = dict(self.options, system=self.system, tools=tools or None)
        if self.deadline is not None:
            kwargs["timeout"] = max(self.deadline - time.monotonic(), 0.001)
        return kwargs

    def remaining(self) -> float | None:
        return None if self.deadline is None else max(0.0, self.deadline - time.monotonic())

    def check(self, where: str = "") -> None:
        """Raise if the turn was cancelled or its deadline passed."""
        if self.cancel is not None and self.cancel.cancelled:
            raise RequestCancelled(
                self.cancel.reason or "the request was cancelled", provider=self.provider
            )
        if self.deadline is not None and time.monotonic() >= self.deadline:
            raise self.timeout_error(where=where)

    def timeout_error(self, cause: BaseException | None = None, where: str = "") -> APITimeoutError:
        waited = time.monotonic() - self.started
        return APITimeoutError(
            f"no complete answer within the {self.timeout:g} s timeout (waited {waited:.1f} s"
            f"{', ' + where if where else ''}); pass a larger timeout= or try again",
            provider=self.provider,
            partial=getattr(cause, "partial", None),
        )

    def failure(self, exc: BaseException) -> BaseException:
        """The error to raise for a failed model call (the session's deadline, when it passed)."""
        if (
            isinstance(exc, APITimeoutError)
            and self.deadline is not None
            and time.monotonic() >= self.deadline - 0.05
        ):
            return self.timeout_error(exc)
        return exc


class Session:
    """A conversation with one model: history, system prompt, Python tools and the tool loop.

    ``model_or_adapter`` is an :class:`~dispatch_nb.adapter.Adapter` or a model spec for
    :func:`~dispatch_nb.registry.connect` (``"openai:gpt-4.1"``; ``None``: the default model).
    ``tools`` are ``@tool`` functions, plain typed functions (wrapped automatically),
    ``ToolDefinition`` s or dicts (declared to the model; their calls come back to you) and
    provider built-in tool dicts. ``max_tokens`` / ``temperature`` are defaults for every turn.
    ``id`` (default: a random hex uuid) survives :meth:`to_json`. See the module docstring for
    the tool loop and what happens on failures.
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
    ) -> None:
        # Every argument is checked before an adapter is made (and long before any request).
        check_call(
            "Session: ", system=system, max_tool_rounds=max_tool_rounds, id=id,
            max_tokens=max_tokens, temperature=temperature,
        )
        if isinstance(model_or_adapter, Adapter):
            self._adapter, self._owns_adapter = model_or_adapter, False
        elif model_or_adapter is None or isinstance(model_or_adapter, str):
            from .registry import connect, default_model_spec

            spec = default_model_spec() if model_or_adapter is None else model_or_adapter
            self._adapter, self._owns_adapter = connect(spec), True
        else:
            raise TypeError(
                "Session needs an Adapter or a model spec such as 'openai:gpt-4.1' (None: the "
                f"default model) — not {describe(model_or_adapter)}"
            )
        #: this conversation's id (given, or a random hex uuid); survives to_json/from_json
        self.id: str = id or uuid.uuid4().hex
        #: tool rounds one turn may run before the loop stops (see the module docstring)
        self.max_tool_rounds = max_tool_rounds
        #: default ``max_tokens`` for every model call (None: the adapter's default)
        self.max_tokens = max_tokens
        #: default ``temperature`` for every model call (None: the provider's default)
        self.temperature = temperature
        #: True when the last turn stopped because ``max_tool_rounds`` was reached
        self.tool_limit_reached = False
        #: the last model answer (of any turn)
        self.last_response: Response | None = None
        self._system = system
        self._history: list[Message] = []
        self._usage = Usage()
        self._lock = threading.Lock()
        self._tools: list[_SessionTool] = []
        self._handlers: dict[str, Tool] = {}
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
    def unhandled_tools(self) -> list[str]:
        """Names of declared tools without a Python handler: their calls come back to you."""
        return [t.name for t in self._tools if isinstance(t, ToolDefinition)]

    def set_tools(self, tools: Iterable[Any] | None) -> None:
        """Replace the tools (``None`` or ``[]``: none). Plain functions are wrapped with
        :func:`tool`; a ``Tool``'s name must be unique."""
        out = _session_tools(tools)
        names = [t.name for t in out if not isinstance(t, dict)]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"tool names must be unique; repeated: {', '.join(dupes)}")
        self._tools = out
        self._handlers = {t.name: t for t in out if isinstance(t, Tool)}

    def _tool_payload(self) -> list[ToolDefinition | dict[str, Any]]:
        return [t.definition if isinstance(t, Tool) else t for t in self._tools]

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

    def clear_history(self) -> None:
        """Forget the conversation (the id, settings, tools and cumulative usage stay)."""
        with self._turn_lock():
            self._history.clear()
            self.tool_limit_reached = False
            self.last_response = None

    def close(self) -> None:
        """Release the adapter's connections if this session created the adapter."""
        if self._owns_adapter:
            self._adapter.close()

    async def aclose(self) -> None:
        """The async twin of :meth:`close`."""
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
        state = _State()
        events = self._run(content, chat_options, state, streaming=False)
        for _ in events:
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
        chat_options.pop("stream", None)
        chat_options.pop("on_delta", None)
        state = _State()
        return SessionStream(
            self._run(content, chat_options, state, streaming=True), state, raise_errors
        )

    async def asend(self, content: Any, **chat_options: Any) -> Response:
        """The async twin of :meth:`send`; tool calls of one turn run concurrently."""
        state = _State()
        async for _ in self._arun(content, chat_options, state, streaming=False):
            pass
        assert state.response is not None
        return state.response

    def astream(
        self, content: Any, *, raise_errors: bool = True, **chat_options: Any
    ) -> AsyncSessionStream:
        """The async twin of :meth:`stream` (``async for event in session.astream(...)``)."""
        chat_options.pop("stream", None)
        chat_options.pop("on_delta", None)
        state = _State()
        return AsyncSessionStream(
            self._arun(content, chat_options, state, streaming=True), state, raise_errors
        )

    # -- the tool loop, sync -------------------------------------------------------------------
    def _run(
        self, content: Any, options: dict[str, Any], state: _State, *, streaming: bool
    ) -> Generator[StreamEvent, None, None]:
        turn = _Turn(self, options)
        message = self._start(content)
        with self._turn_lock():
            self._history.append(message)
            self.tool_limit_reached = False
            while True:
                kwargs = turn.call_kwargs(self._tool_payload())
                try:
                    if streaming:
                        with self._adapter.stream(self._wire_history(), **kwargs) as stream:
                            state.stream = stream
                            yield from stream
                        response = stream.response
                    else:
                        response = self._adapter.chat(self._wire_history(), **kwargs)
                except BaseException as exc:
                    error = self._call_failed(turn, message, exc)
                    if error is exc:
                        raise
                    raise error from exc
                finally:
                    state.stream = None
                yield self._answered(turn, state, response)
                action = self._next_action(turn, response)
                if action == "done":
                    return
                if action == "again":
                    continue
                if action == "limit":
                    yield from self._stop_loop(response)
                    return
                done: list[ToolResultBlock | None] = [None] * len(response.tool_calls)
                try:
                    for i, call in enumerate(response.tool_calls):
                        turn.check("while running tools")
                        started = time.monotonic()
                        result = done[i] = self._execute(call)
                        yield self._tool_event(call, result, time.monotonic() - started)
                except BaseException as exc:
                    self._append_results(response.tool_calls, done, exc)
                    raise
                self._append_results(response.tool_calls, done)
                turn.rounds += 1

    def _execute(self, call: ToolUseBlock) -> ToolResultBlock:
        handler = self._handlers.get(call.name)
        if handler is None:
            return self._unknown_tool(call)
        return handler.run(call)

    # -- the tool loop, async ------------------------------------------------------------------
    async def _arun(
        self, content: Any, options: dict[str, Any], state: _State, *, streaming: bool
    ) -> AsyncGenerator[StreamEvent, None]:
        turn = _Turn(self, options)
        message = self._start(content)
        with self._turn_lock():
            self._history.append(message)
            self.tool_limit_reached = False
            while True:
                kwargs = turn.call_kwargs(self._tool_payload())
                try:
                    if streaming:
                        astream = self._adapter.astream(self._wire_history(), **kwargs)
                        async with astream:
                            state.stream = astream
                            async for delta in astream:
                                yield delta
                        response = astream.response
                    else:
                        response = await self._adapter.achat(self._wire_history(), **kwargs)
                except BaseException as exc:
                    error = self._call_failed(turn, message, exc)
                    if error is exc:
                        raise
                    raise error from exc
                finally:
                    state.stream = None
                yield self._answered(turn, state, response)
                action = self._next_action(turn, response)
                if action == "done":
                    return
                if action == "again":
                    continue
                if action == "limit":
                    for event in self._stop_loop(response):
                        yield event
                    return
                calls = response.tool_calls
                done: list[ToolResultBlock | None] = [None] * len(calls)
                durations = [0.0] * len(calls)
                try:
                    await self._arun_tools(turn, calls, done, durations)
                except BaseException as exc:
                    self._append_results(calls, done, exc)
                    raise
                self._append_results(calls, done)
                for call, result, duration in zip(calls, done, durations, strict=True):
                    assert result is not None
                    yield self._tool_event(call, result, duration)
                turn.rounds += 1

    async def _arun_tools(
        self,
        turn: _Turn,
        calls: list[ToolUseBlock],
        done: list[ToolResultBlock | None],
        durations: list[float],
    ) -> None:
        """Run every call concurrently; stop early (cancelling them) on cancel or deadline."""

        async def one(i: int, call: ToolUseBlock) -> None:
            started = time.monotonic()
            handler = self._handlers.get(call.name)
            done[i] = await handler.arun(call) if handler else self._unknown_tool(call)
            durations[i] = time.monotonic() - started

        turn.check("while running tools")
        tasks = [asyncio.ensure_future(one(i, c)) for i, c in enumerate(calls)]
        gathered = asyncio.gather(*tasks)
        waiters: set[asyncio.Future[Any]] = {gathered}
        remove_callback = None
        if turn.cancel is not None:
            loop = asyncio.get_running_loop()
            cancelled = loop.create_future()

            def settle() -> None:
                if not cancelled.done():
                    cancelled.set_result(None)

            def wake() -> None:
                loop.call_soon_threadsafe(settle)

            remove_callback = turn.cancel.add_callback(wake)
            waiters.add(cancelled)
        try:
            await asyncio.wait(
                waiters, timeout=turn.remaining(), return_when=asyncio.FIRST_COMPLETED
            )
            if not gathered.done():
                turn.check("while running tools")
                raise turn.timeout_error(where="while running tools")
            gathered.result()
        finally:
            if remove_callback is not None:
                remove_callback()
            for task in tasks:
                task.cancel()
            if not gathered.done():
                gathered.cancel()
                await asyncio.gather(gathered, return_exceptions=True)

    # -- shared steps --------------------------------------------------------------------------
    def _turn_lock(self) -> _NonBlockingLock:
        return _NonBlockingLock(self._lock)

    def _start(self, content: Any) -> Message:
        """The user message for ``content``, checked against what the model is waiting for."""
        message = _user_message(content)
        waiting = self._pending_tool_calls()
        if waiting:
            answered = {b.tool_use_id for b in message.blocks if isinstance(b, ToolResultBlock)}
            missing = [c for c in waiting if c.id not in answered]
            if missing:
                listed = ", ".join(f"{c.name} (id {c.id!r})" for c in missing)
                raise ValueError(
                    f"the model is waiting for the result of tool call(s) {listed}; answer them "
                    "with session.send([ToolResultBlock(tool_use_id=..., content=...), ...])"
                )
        return message

    def _pending_tool_calls(self) -> list[ToolUseBlock]:
        if not self._history or self._history[-1].role != "assistant":
            return []
        return [b for b in self._history[-1].blocks if isinstance(b, ToolUseBlock)]

    def _wire_history(self) -> list[Message]:
        """History as sent: consecutive messages of one role merged into one."""
        out: list[Message] = []
        for message in self._history:
            if out and out[-1].role == message.role:
                out[-1] = Message(role=message.role, content=[*out[-1].blocks, *message.blocks])
            else:
                out.append(message)
        return out

    def _answered(self, turn: _Turn, state: _State, response: Response) -> MessageDoneEvent:
        """A model call answered: count it, add its usage and answer to the session, and make
        it the turn's response so far."""
        turn.calls += 1
        self._usage = self._usage + response.usage
        self.last_response = response
        if response.content:  # providers reject an empty assistant message
            self._history.append(response.to_message())
        state.response = response
        return MessageDoneEvent(response=response)

    def _call_failed(self, turn: _Turn, message: Message, exc: BaseException) -> BaseException:
        """A model call failed with ``exc``: count the usage of what arrived, and return the
        error to raise (the turn's own timeout when its deadline passed, else ``exc``).

        A turn whose first call was refused before anything was sent (bad options: TypeError,
        ValueError) leaves no trace in history."""
        partial = getattr(exc, "partial", None)
        if isinstance(partial, Response):
            self._usage = self._usage + partial.usage
        if (
            turn.calls == 0
            and isinstance(exc, (TypeError, ValueError))
            and self._history
            and self._history[-1] is message
        ):
            self._history.pop()
        return turn.failure(exc)

    def _next_action(self, turn: _Turn, response: Response) -> str:
        calls = response.tool_calls
        if not calls:
            if response.stop_reason == "pause_turn" and turn.rounds < self.max_tool_rounds:
                turn.rounds += 1
                return "again"  # the provider paused a long server-side turn: let it go on
            return "done"
        declared_only = set(self.unhandled_tools)
        if any(c.name in declared_only for c in calls):
            return "done"  # the caller answers these (see the module docstring)
        if turn.rounds >= self.max_tool_rounds:
            return "limit"
        return "tools"

    def _stop_loop(self, response: Response) -> Iterable[ToolResultEvent]:
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
        return [self._tool_event(c, r, 0.0) for c, r in zip(response.tool_calls, results, strict=True)]

    def _unknown_tool(self, call: ToolUseBlock) -> ToolResultBlock:
        names = ", ".join(t.name for t in self._tools if not isinstance(t, dict)) or "none"
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

    @staticmethod
    def _tool_event(call: ToolUseBlock, result: ToolResultBlock, duration: float) -> ToolResultEvent:
        return ToolResultEvent(result=result, tool_name=call.name, duration=duration)

    # -- serialization -------------------------------------------------------------------------
    def to_json(self, *, indent: bool = False) -> str:
        """The whole session as JSON: id, model, settings, system prompt, tool definitions (not
        their Python handlers), history (thinking signatures, provider data, tool calls
        included) and usage. :meth:`from_json` restores it exactly."""
        data = {
            "format": FORMAT,
            "version": VERSION,
            "id": self.id,
            "model": f"{self._adapter.provider_name}:{self._adapter.model_name}",
            "system": self._system,
            "max_tool_rounds": self.max_tool_rounds,
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            "tools": [
                (t.definition if isinstance(t, Tool) else t).model_dump(mode="json")
                for t in self._tools
                if not isinstance(t, dict)
            ],
            "builtin_tools": [t for t in self._tools if isinstance(t, dict)],
            "history": [m.model_dump(mode="json") for m in self._history],
            "usage": self._usage.model_dump(mode="json"),
        }
        option = orjson.OPT_INDENT_2 if indent else 0
        return orjson.dumps(data, option=option).decode()

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
        try:
            data = orjson.loads(text)
        except orjson.JSONDecodeError as exc:
            raise ValueError(f"not a saved session: the text is not JSON ({exc})") from None
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ValueError(f"not a saved session: no \"format\": \"{FORMAT}\" in the JSON")
        if data.get("version") != VERSION:
            raise ValueError(
                f"this session was saved in format version {data.get('version')!r}; this version "
                f"of dispatch_nb reads version {VERSION}"
            )
        session = cls(
            adapter if adapter is not None else data["model"],
            system=data.get("system"),
            max_tool_rounds=data.get("max_tool_rounds", 8),
            id=data["id"],
            max_tokens=data.get("max_tokens"),
            temperature=data.get("temperature"),
        )
        given = _session_tools(tools)
        by_name = {t.name: t for t in given if not isinstance(t, dict)}
        restored: list[_SessionTool] = []
        for saved in data.get("tools", []):
            definition = ToolDefinition.model_validate(saved)
            restored.append(by_name.pop(definition.name, definition))
        restored += [t for t in given if isinstance(t, dict) or t.name in by_name]
        restored += [dict(t) for t in data.get("builtin_tools", [])]
        session.set_tools(restored)
        missing = session.unhandled_tools
        if missing:
            warnings.warn(
                f"session {session.id}: no Python handler for tool(s) {', '.join(missing)}; pass "
                "them with Session.from_json(..., tools=[...]). Until then the model still sees "
                "them and its calls to them come back to you unanswered.",
                UserWarning,
                stacklevel=2,
            )
        session._history = [Message.model_validate(m) for m in data.get("history", [])]
        session._usage = Usage.model_validate(data.get("usage") or {})
        return session


def _session_tools(tools: Iterable[Any] | None) -> list[_SessionTool]:
    out: list[_SessionTool] = []
    for item in tools or []:
        if isinstance(item, Tool):
            out.append(item)
        elif isinstance(item, (ToolDefinition, dict)):
            out.extend(normalize_tools([item]))
        elif callable(item):
            out.append(tool(item))
        else:
            raise TypeError(
                "a tool must be an @tool function, a typed function, a ToolDefinition or a "
                f"dict, not {type(item).__name__}"
            )
    return out


class _NonBlockingLock:
    """One turn at a time per session: a second concurrent turn is a mistake, not a wait."""

    __slots__ = ("_lock",)

    def __init__(self, lock: threading.Lock) -> None:
        self._lock = lock

    def __enter__(self) -> None:
        if not self._lock.acquire(blocking=False):
            raise RuntimeError(
                "this session is already running a turn; wait for it to finish (or close its "
                "stream), or use one Session per concurrent conversation"
            )

    def __exit__(self, *exc: object) -> None:
        self._lock.release()


def _user_message(content: Any) -> Message:
    if isinstance(content, Message):
        if content.role != "user":
            raise ValueError("send() takes the user's turn: a Message must have role='user'")
        message = content
    elif isinstance(content, str):
        message = Message(role="user", content=content)
    elif isinstance(content, dict) and "role" in content:
        return _user_message(Message.model_validate(content))
    elif isinstance(content, (list, tuple)):
        message = Message(role="user", content=[_block(item) for item in content])
    elif isinstance(content, (dict, BaseModel)):
        message = Message(role="user", content=[_block(content)])
    else:
        raise TypeError(
            f"content must be a str, a list of blocks or a user Message, not {type(content).__name__}"
        )
    if not message.blocks:
        raise ValueError("there is nothing to send: the content is empty")
    return message


def _block(item: Any) -> Any:
    if isinstance(item, str):
        return TextBlock(text=item)
    if isinstance(item, dict):
        return _BLOCK.validate_python(item)
    if isinstance(item, BaseModel) and getattr(item, "type", None) is not None:
        return item
    raise TypeError(f"a content block must be a str, a dict or a block, not {type(item).__name__}")


class _TurnStream:
    """What :class:`SessionStream` and :class:`AsyncSessionStream` share: the turn's state, the
    error that ended it, and what happens when its events end, fail or are interrupted."""

    def __init__(self, state: _State, raise_errors: bool) -> None:
        self._state = state
        self._raise = raise_errors
        self._finished = False
        self._raised = False
        self._closed = False
        #: the exception that ended the turn, if one did
        self.error: Exception | None = None

    @property
    def partial(self) -> Response | None:
        """What the model turn in progress has produced so far (None between model turns)."""
        stream = self._state.stream
        return stream.partial if stream is not None else None

    @property
    def partial_parsed(self) -> Any:
        """With ``output=``: the structured answer so far as JSON data while the model writes it
        (see :class:`~dispatch_nb.structured.StructuredResponseStream`), the validated object
        once the turn is done; None otherwise."""
        stream = self._state.stream
        if stream is not None:
            return stream.partial_parsed
        response = self._state.response
        return response.parsed if response is not None else None

    def _over(self) -> bool:
        """Whether the turn has finished or was closed; the first time after a failure, raise
        its error instead (unless ``raise_errors=False``)."""
        if not (self._finished or self._closed):
            return False
        if self.error is not None and self._raise and not self._raised:
            self._raised = True
            raise self.error
        return True

    def _failed(self, exc: Exception) -> ErrorEvent:
        """The turn failed: the event that says so (the error is raised on the next step)."""
        self._finished = True
        self.error = exc
        return ErrorEvent(error=exc)

    def _interrupted(self, exc: BaseException) -> None:
        """Ctrl-C or task cancellation: raised at once, with what arrived attached."""
        self._finished = True
        _attach_partial(exc, self.partial)


class SessionStream(_TurnStream):
    """What :meth:`Session.stream` returns: iterate for events; a context manager.

    ``response`` is the final :class:`Response` (reading it finishes the turn); ``partial`` is what
    the current model turn has produced so far; ``error`` is the failure, if any; ``close()`` ends
    the turn and its HTTP stream (the unfinished answer stays out of history).
    """

    def __init__(
        self, events: Generator[StreamEvent, None, None], state: _State, raise_errors: bool
    ) -> None:
        super().__init__(state, raise_errors)
        self._events = events

    def __iter__(self) -> SessionStream:
        return self

    def __next__(self) -> StreamEvent:
        if self._over():
            raise StopIteration
        try:
            return next(self._events)
        except StopIteration:
            self._finished = True
            raise
        except Exception as exc:
            return self._failed(exc)
        except BaseException as exc:
            self._interrupted(exc)
            raise

    @property
    def response(self) -> Response:
        """The final response of the turn (consumes the rest of the stream first)."""
        if not self._finished and not self._closed:
            for _ in self:
                pass
        if self.error is not None:
            raise self.error
        if self._state.response is None or not self._finished:
            raise RequestCancelled("the stream was closed before the turn finished",
                                   partial=self.partial)
        return self._state.response

    def close(self) -> None:
        """End the turn now, closing its HTTP stream (idempotent)."""
        if not self._closed:
            self._closed = True
            self._events.close()

    def __enter__(self) -> SessionStream:
        return self

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        if exc is not None:
            _attach_partial(exc, self.partial)
        self.close()


class AsyncSessionStream(_TurnStream):
    """The async twin of :class:`SessionStream` (``async for``, ``async with``, ``aclose``)."""

    def __init__(
        self, events: AsyncGenerator[StreamEvent, None], state: _State, raise_errors: bool
    ) -> None:
        super().__init__(state, raise_errors)
        self._events = events

    def __aiter__(self) -> AsyncSessionStream:
        return self

    async def __anext__(self) -> StreamEvent:
        if self._over():
            raise StopAsyncIteration
        try:
            return await self._events.__anext__()
        except StopAsyncIteration:
            self._finished = True
            raise
        except Exception as exc:
            return self._failed(exc)
        except BaseException as exc:
            self._interrupted(exc)
            raise

    async def until_done(self) -> Response:
        """Consume the rest of the turn and return its final response."""
        if not self._finished and not self._closed:
            async for _ in self:
                pass
        return self.response

    @property
    def response(self) -> Response:
        """The final response (iterate to the end first, or ``await until_done()``)."""
        if self.error is not None:
            raise self.error
        if self._state.response is None or not self._finished:
            raise RuntimeError(
                "the turn has not finished: iterate the stream to the end or await until_done()"
            )
        return self._state.response

    async def aclose(self) -> None:
        """End the turn now, closing its HTTP stream (idempotent)."""
        if not self._closed:
            self._closed = True
            await self._events.aclose()

    async def __aenter__(self) -> AsyncSessionStream:
        return self

    async def __aexit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        if exc is not None:
            _attach_partial(exc, self.partial)
        await self.aclose()


def _attach_partial(exc: BaseException, partial: Response | None) -> None:
    if partial is not None and getattr(exc, "partial", None) is None:
        try:
            exc.partial = partial  # type: ignore[attr-defined]
        except Exception:
            pass

