"""Model Context Protocol servers as tools (:class:`MCPServer`, :class:`MCPTool`), through the
official ``mcp`` SDK's client; every connection lives on the library's event-loop thread.
What a user sees (start and stop, listing, results, errors, record and replay): docs/tools.md.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import hashlib
import json
import logging
import os
import re
import tempfile
import time
import weakref
from collections.abc import Coroutine, Mapping
from typing import TYPE_CHECKING, Any, Literal, TextIO, TypeVar
from urllib.parse import urlsplit

import pydantic_core

from . import bridge
from .cache.store import _now
from .tools import MAX_ERROR_CHARS, Tool, error_result
from .types import ImageBlock, TextBlock, ToolDefinition, ToolResultBlock, ToolUseBlock

if TYPE_CHECKING:
    from .cache.store import ResponseCache
    from .call_control import TurnControl

__all__ = ["MCPServer", "MCPTool"]

logger = logging.getLogger("dispatch_nb")

T = TypeVar("T")

#: seconds one tool call may take on a server before it becomes a "timed out" result
DEFAULT_TIMEOUT = 120.0
#: seconds a server may take to start and answer its first listing
START_TIMEOUT = 60.0
#: characters of a server's stderr quoted when it stopped
STDERR_TAIL = 400

State = Literal["stopped", "running", "failed"]

_live: weakref.WeakSet[MCPServer] = weakref.WeakSet()


async def _await_on_loop(coro: Coroutine[Any, Any, T]) -> T:
    """Await ``coro`` on the private loop from any loop (cancelling this cancels it there)."""
    loop = bridge.loop_thread()
    if asyncio.get_running_loop() is loop:
        return await coro
    return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, loop))


def run_sync(coro: Coroutine[Any, Any, T], control: TurnControl | None = None,
             where: str = "") -> T:
    """:func:`dispatch_nb.bridge.run_sync` under ``control``'s deadline and cancel switch."""
    if control is None:
        return bridge.run_sync(coro)

    async def controlled() -> T:
        result: T = await control.run_async(asyncio.ensure_future(coro), where)
        return result

    return bridge.run_sync(controlled())


class MCPServer:
    """One MCP server: a command over stdio (:meth:`stdio`) or a URL (:meth:`http`).

    ``name`` names it in prefixes, approvals and the notebook (default: the command's or
    host's name). ``timeout``: seconds one tool call may take. Use :meth:`list_tools` /
    :meth:`alist_tools` and :meth:`call` / :meth:`acall` directly, or hand the server to a
    :class:`~dispatch_nb.session.Session` as a tool.
    """

    def __init__(
        self,
        *,
        command: str | None = None,
        args: list[str] | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        url: str | None = None,
        headers: Mapping[str, str] | None = None,
        name: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> None:
        if (command is None) == (url is None):
            raise ValueError("an MCP server is a command (MCPServer.stdio) or a URL (MCPServer.http)")
        if not (isinstance(timeout, (int, float)) and timeout > 0):
            raise ValueError(f"timeout must be a positive number of seconds, not {timeout!r}")
        self.command = command
        self.args = [str(a) for a in args or []]
        self.env = dict(env) if env is not None else None
        self.cwd = os.fspath(cwd) if cwd is not None else None
        self.url = url
        self._headers = dict(headers or {})
        self.name = name or _default_name(command, url)
        self.timeout = float(timeout)
        self._state: State = "stopped"
        self._error: str = ""
        self._client: Any = None
        self._owner: asyncio.Task[None] | None = None
        self._closing: asyncio.Event | None = None
        self._starting: asyncio.Future[None] | None = None
        self._tools: list[ToolDefinition] | None = None
        self._stale = True
        self._stderr: TextIO | None = None
        _live.add(self)

    @classmethod
    def stdio(
        cls,
        command: str,
        *args: str,
        env: Mapping[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        name: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> MCPServer:
        """A server the library starts as ``command args…`` and talks to over stdin/stdout
        (``env`` is added to a minimal environment: PATH, HOME, ...)."""
        if not command or not isinstance(command, str):
            raise ValueError("MCPServer.stdio needs the command that starts the server")
        return cls(command=command, args=list(args), env=env, cwd=cwd, name=name, timeout=timeout)

    @classmethod
    def http(
        cls,
        url: str,
        headers: Mapping[str, str] | None = None,
        *,
        name: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> MCPServer:
        """A server at ``url`` over streamable HTTP; ``headers`` go with every request."""
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ValueError(f"MCPServer.http needs an http(s) URL, not {url!r}")
        return cls(url=url, headers=headers, name=name, timeout=timeout)

    def __repr__(self) -> str:
        target = self.url if self.url is not None else " ".join([self.command or "", *self.args])
        return f"MCPServer(name={self.name!r}, {target!r}, state={self._state!r})"

    # -- state -----------------------------------------------------------------------------------
    @property
    def state(self) -> State:
        """``"stopped"`` (not started yet, or stopped after a crash: the next use starts it),
        ``"running"`` or ``"failed"`` (the last start failed; see :attr:`error`)."""
        return self._state

    @property
    def error(self) -> str:
        """Why the server last failed or stopped ("" when it did not)."""
        return self._error

    @property
    def tools(self) -> list[ToolDefinition]:
        """The tools as last listed ([] before the first listing)."""
        return list(self._tools or [])

    # -- public API --------------------------------------------------------------------------------
    def list_tools(self, timeout: float | None = START_TIMEOUT) -> list[ToolDefinition]:
        """Start the server if needed and list its tools (again when its list changed)."""
        return run_sync(asyncio.wait_for(self._list(), timeout))

    async def alist_tools(self) -> list[ToolDefinition]:
        """The async twin of :meth:`list_tools`."""
        return await _await_on_loop(asyncio.wait_for(self._list(), START_TIMEOUT))

    def call(self, name: str, arguments: Mapping[str, Any] | None = None) -> ToolResultBlock:
        """Call tool ``name`` on the server; problems become an ``is_error`` result."""
        return run_sync(self.acall(name, arguments))

    async def acall(self, name: str, arguments: Mapping[str, Any] | None = None) -> ToolResultBlock:
        """The async twin of :meth:`call`."""
        block = ToolUseBlock(id="call", name=name, arguments=dict(arguments or {}))
        return await _await_on_loop(self._call(block))

    def close(self) -> None:
        """Stop the server (a stdio server's process ends); the next use starts it again."""
        if self._owner is not None:
            with contextlib.suppress(RuntimeError):  # the loop thread is gone (interpreter exit)
                run_sync(self._stop())

    async def aclose(self) -> None:
        """The async twin of :meth:`close`."""
        if self._owner is not None:
            await _await_on_loop(self._stop())

    # -- on the private loop -----------------------------------------------------------------------
    async def _ensure_started(self) -> Any:
        if self._owner is not None and not self._owner.done() and self._client is not None:
            return self._client
        if self._starting is None or self._starting.done():
            loop = asyncio.get_running_loop()
            self._starting = loop.create_future()
            self._closing = asyncio.Event()
            self._owner = asyncio.ensure_future(self._own(self._starting, self._closing))
        await asyncio.shield(self._starting)
        return self._client

    async def _own(self, ready: asyncio.Future[None], closing: asyncio.Event) -> None:
        """The one task that opens the connection, keeps it and closes it (the SDK's client is
        entered and left in one task)."""
        try:
            from mcp import types
            from mcp.client import Client
        except ImportError as exc:
            self._state, self._error = "failed", (
                "MCP servers need the mcp package: pip install 'dispatch-nb[mcp]'")
            ready.set_exception(RuntimeError(self._error))
            raise RuntimeError(self._error) from exc

        async def on_message(message: Any) -> None:
            if isinstance(message, types.ServerNotification) and isinstance(
                getattr(message, "root", message), types.ToolListChangedNotification
            ):
                self._stale = True

        try:
            async with Client(self._target(), message_handler=on_message) as client:
                listener = asyncio.ensure_future(self._listen(client))
                self._client, self._state, self._error = client, "running", ""
                ready.set_result(None)
                try:
                    await closing.wait()
                finally:
                    listener.cancel()
                    await asyncio.gather(listener, return_exceptions=True)
                    self._client = None
        except BaseException as exc:
            self._client = None
            message = self._describe(exc, stderr=True)
            if not ready.done():
                self._state, self._error = "failed", message
                ready.set_exception(RuntimeError(message))
            elif not closing.is_set():
                self._state, self._error = "stopped", message
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
        finally:
            self._stale = True
            if self._state == "running":
                self._state = "stopped"

    async def _listen(self, client: Any) -> None:
        """Watch the tool list on servers that send changes over ``subscriptions/listen``."""
        try:
            async with client.listen(tools_list_changed=True) as subscription:
                async for _event in subscription:
                    self._stale = True
        except Exception:  # an older server: changes come as notifications (on_message)
            return

    def _target(self) -> Any:
        if self.url is not None:
            if not self._headers:
                return self.url
            import httpx2
            from mcp.client.streamable_http import streamable_http_client

            client = httpx2.AsyncClient(headers=self._headers, timeout=httpx2.Timeout(30, read=300))
            return streamable_http_client(self.url, http_client=client)
        from mcp.client import stdio

        if self._stderr is None:
            self._stderr = tempfile.TemporaryFile(  # noqa: SIM115 - kept open for the process
                "w+", encoding="utf-8", errors="replace")
        self._stderr.seek(0)
        self._stderr.truncate()  # quote only this run's stderr
        params = stdio.StdioServerParameters(
            command=self.command or "", args=self.args, env=self.env, cwd=self.cwd
        )
        return stdio.stdio_client(params, errlog=self._stderr)

    def _stderr_tail(self) -> str:
        if self._stderr is None:
            return ""
        with contextlib.suppress(Exception):
            self._stderr.flush()
            self._stderr.seek(max(0, self._stderr.seek(0, os.SEEK_END) - 4 * STDERR_TAIL))
            return self._stderr.read().strip()[-STDERR_TAIL:]
        return ""

    def _describe(self, exc: BaseException, *, stderr: bool = False) -> str:
        while getattr(exc, "exceptions", None):  # an exception group: its first
            exc = exc.exceptions[0]  # type: ignore[attr-defined]
        text = str(exc) or type(exc).__name__
        tail = self._stderr_tail() if stderr else ""
        return text + (f" (its stderr ends: {tail})" if tail else "")

    async def _stop(self) -> None:
        owner, closing = self._owner, self._closing
        self._owner = None
        if owner is None:
            return
        if closing is not None:
            closing.set()
        try:
            await asyncio.wait_for(asyncio.shield(owner), 10)
        except Exception:  # a timeout included
            owner.cancel()
            await asyncio.gather(owner, return_exceptions=True)
        self._state = "stopped"

    async def _list(self) -> list[ToolDefinition]:
        client = await self._ensure_started()
        if self._tools is not None and not self._stale:
            return list(self._tools)
        self._stale = False
        tools: list[ToolDefinition] = []
        cursor: str | None = None
        for _ in range(100):  # a paginator that never ends cannot hang a turn
            page = await client.list_tools(cursor=cursor, cache_mode="refresh")
            tools += [ToolDefinition(name=t.name, description=t.description or "",
                                     parameters=t.input_schema) for t in page.tools]
            cursor = page.next_cursor
            if not cursor:
                break
        self._tools = tools
        return list(tools)

    async def _call(self, call: ToolUseBlock, remote_name: str | None = None) -> ToolResultBlock:
        """Run ``call`` on the server; every problem becomes an ``is_error`` result."""
        name = remote_name or call.name
        if call.arguments_error:
            return error_result(call.id, f"{call.arguments_error}. Call {call.name} again with a "
                                "JSON object of arguments.")
        try:
            client = await self._ensure_started()
        except Exception as exc:
            return error_result(call.id, f"MCP server {self.name} could not start: {exc}")
        owner = self._owner
        work = asyncio.ensure_future(client.call_tool(name, dict(call.arguments)))
        waits: set[asyncio.Future[Any]] = {work} if owner is None else {work, owner}
        try:
            await asyncio.wait(waits, timeout=self.timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not work.done():
                work.cancel()
                await asyncio.gather(work, return_exceptions=True)
        if work.cancelled():
            if owner is not None and owner.done():
                return error_result(call.id, f"MCP server {self.name} stopped while running "
                                    f"{call.name}: {self._error or 'the connection closed'}")
            return error_result(call.id, f"{call.name} timed out: MCP server {self.name} did not "
                                f"answer within {self.timeout:g} s")
        failure = work.exception()
        if failure is not None:
            if _connection_lost(failure) or (owner is not None and owner.done()):
                why = self._describe(failure, stderr=True)
                await self._stop()  # the next use starts it again
                self._error = why
                return error_result(call.id, f"MCP server {self.name} stopped while running "
                                    f"{call.name}: {why}")
            return error_result(call.id, f"{call.name} failed on MCP server {self.name}: "
                                f"{self._describe(failure)}")
        return call_result(call.id, work.result())


class MCPTool(Tool):
    """One tool of an :class:`MCPServer`, as a session runs it (``definition`` as listed, the
    name possibly prefixed; ``remote_name`` is the server's own)."""

    server: MCPServer
    remote_name: str

    def __init__(self, server: MCPServer, definition: ToolDefinition, name: str,
                 cache: ResponseCache | None = None) -> None:
        # Not Tool.__init__: the schema is the server's, not a Python signature's.
        self.server = server
        self.cache = cache
        self.remote_name = definition.name
        self.name = name
        self.description = definition.description
        self.parameters = definition.parameters
        self.definition = definition.model_copy(update={"name": name})
        self.is_async = True
        self.function = self.__call__

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if args:
            raise TypeError(f"call the MCP tool {self.name} with keyword arguments")
        return self.server.call(self.remote_name, kwargs)

    def __repr__(self) -> str:
        return f"MCPTool(name={self.name!r}, server={self.server.name!r})"

    def run(self, call: ToolUseBlock) -> ToolResultBlock:
        return run_sync(self.arun(call))

    async def arun(self, call: ToolUseBlock) -> ToolResultBlock:
        key = _call_key(self.server.name, self.remote_name, call.arguments)
        if self.cache is not None and self.cache.reads:
            entry = self.cache.get(key)
            if entry is not None:
                recorded = ToolResultBlock.model_validate(entry["response"]["result"])
                return recorded.model_copy(update={"tool_use_id": call.id})
        result = await _await_on_loop(self.server._call(call, self.remote_name))
        if self.cache is not None and self.cache.writes:
            self.cache.put({
                "v": 1, "key": key, "kind": "mcp_call", "created": _now(),
                "label": f"mcp:{self.server.name}/{self.remote_name}",
                "request": {"server": self.server.name, "tool": self.remote_name,
                            "arguments": call.arguments},
                "response": {"result": result.model_dump(mode="json", exclude_none=True)},
            })
        return result


# -- results ---------------------------------------------------------------------------------------
#: the image types every provider that reads images in tool results takes, and the size Anthropic
#: allows per image (OpenAI allows more): a larger or other image is described in text instead
MODEL_IMAGE_TYPES = frozenset({"image/png", "image/jpeg", "image/gif", "image/webp"})
MAX_IMAGE_BYTES = 5 * 1024 * 1024

def call_result(tool_use_id: str, result: Any) -> ToolResultBlock:
    """A ``CallToolResult`` as the tool result the model reads: text as it is; images as image
    blocks; structured content as JSON when no text came with it; audio and resources as a
    short note."""
    parts: list[str | ImageBlock] = []
    for block in result.content or []:
        kind = getattr(block, "type", "")
        if kind == "text":
            parts.append(block.text)
        elif kind == "image":
            size = len(block.data) * 3 // 4 - block.data[-2:].count("=")  # base64's bytes
            if block.mime_type in MODEL_IMAGE_TYPES and size <= MAX_IMAGE_BYTES:
                parts.append(ImageBlock(source=block.data, media_type=block.mime_type))
            else:  # a model would refuse it (and with it the whole request): say what it was
                parts.append(f"[image {block.mime_type}, {size} bytes: not shown to the model, "
                             "which takes PNG, JPEG, GIF or WebP images of at most 5 MB]")
        elif kind == "audio":
            parts.append(f"[audio {block.mime_type}, {len(block.data) * 3 // 4} bytes]")
        elif kind == "resource_link":
            parts.append(f"[resource {block.uri}]")
        elif kind == "resource":
            inner = block.resource
            text = getattr(inner, "text", None)
            parts.append(text if isinstance(text, str) else f"[resource {inner.uri}]")
    structured = getattr(result, "structured_content", None)
    if structured is not None and not parts:
        parts.append(pydantic_core.to_json(structured).decode())
    if getattr(result, "is_error", False):
        text = "\n".join(p for p in parts if isinstance(p, str)) or "the tool reported an error"
        return error_result(tool_use_id, text[:MAX_ERROR_CHARS])
    if not any(isinstance(p, ImageBlock) for p in parts):  # text parts: one line each
        return ToolResultBlock(tool_use_id=tool_use_id, content="\n".join(map(str, parts)))
    return ToolResultBlock(tool_use_id=tool_use_id, content=[
        p if isinstance(p, ImageBlock) else TextBlock(text=p) for p in parts
    ])


def _connection_lost(exc: BaseException) -> bool:
    """True when ``exc`` means the server is gone (the connection closed, the transport
    failed), not that it answered with an error."""
    from mcp.shared.exceptions import MCPError
    from mcp_types import CONNECTION_CLOSED

    if isinstance(exc, MCPError):
        return exc.error.code == CONNECTION_CLOSED
    return (
        isinstance(exc, (OSError, EOFError))
        or bool(getattr(exc, "exceptions", None))  # an exception group from the transport
        or type(exc).__module__.startswith(("anyio", "httpx"))
    )


def _default_name(command: str | None, url: str | None) -> str:
    """The URL's host name, else the command's file name, as a tool-name prefix may use it."""
    base = urlsplit(url).hostname if url is not None else os.path.basename(command or "")
    return re.sub(r"[^A-Za-z0-9_-]", "_", base or "") or "server"


def _prefixed(server: str, name: str) -> str:
    return f"{re.sub(r'[^A-Za-z0-9_-]', '_', server)}_{name}"[:64]


def _key(payload: dict[str, Any]) -> str:
    return hashlib.sha256(pydantic_core.to_json(payload)).hexdigest()


def _call_key(server: str, tool: str, arguments: dict[str, Any]) -> str:
    canonical = json.loads(json.dumps(arguments, sort_keys=True, default=str))
    return _key({"mcp_call": server, "tool": tool, "arguments": canonical})


async def gather_tools(servers: list[MCPServer], taken: set[str],
                       cache: ResponseCache | None = None) -> list[MCPTool]:
    """List every server (each lazily started; again after a change) and return their tools,
    prefixed where a name clashes. A server that cannot start adds no tools (it is logged).
    With ``cache`` a recorded listing is replayed (the server is not started) and a new one
    is recorded."""
    listings: dict[str, list[ToolDefinition] | None] = {}

    async def one(server: MCPServer) -> None:
        key = _key({"mcp_tools": server.name})
        if cache is not None and cache.reads and server.state != "running":
            entry = cache.get(key)
            if entry is not None:
                listings[server.name] = [ToolDefinition.model_validate(t)
                                         for t in entry["response"]["tools"]]
                return
        try:
            tools = await server.alist_tools()
        except Exception as exc:
            logger.warning("MCP server %s: %s", server.name, server.error or exc)
            return
        if cache is not None and cache.writes:
            cache.put({"v": 1, "key": key, "kind": "mcp_tools", "created": _now(),
                       "label": f"mcp:{server.name}", "request": {"server": server.name},
                       "response": {"tools": [t.model_dump(mode="json") for t in tools]}})

    await asyncio.gather(*(one(s) for s in servers))
    out: list[MCPTool] = []
    for server in servers:
        listed = listings.get(server.name)
        for definition in server._tools or [] if listed is None else listed:
            exposed = definition.name
            if exposed in taken:
                exposed = _prefixed(server.name, definition.name)
            taken.add(exposed)
            out.append(MCPTool(server, definition, exposed, cache))
    return out


@atexit.register
def _close_all() -> None:
    """Stop every running server before the loop thread stops (kernel shutdown, exit)."""
    deadline = time.monotonic() + 5
    for server in list(_live):
        if server._owner is not None and time.monotonic() < deadline:
            with contextlib.suppress(BaseException):
                server.close()
