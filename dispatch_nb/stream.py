"""Streams of deltas, and the one accumulator that turns deltas into the final :class:`Response`.

Provider modules drive an :class:`Accumulator`; each of its calls returns the :class:`StreamDelta`
to hand on, so a streamed and a non-streamed call end in the same ``Response``.
:class:`ResponseStream` / :class:`AsyncResponseStream` are what ``adapter.stream()`` /
``adapter.astream()`` return.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Hashable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import orjson

from .bridge import SyncIterator
from .cost import Cost
from .errors import RequestCancelled
from .render import name_spec
from .types import (
    RedactedThinkingBlock,
    Response,
    StopReason,
    StreamDelta,
    TextBlock,
    ThinkingBlock,
    ToolUseBlock,
    Usage,
    text_delta,
)

__all__ = [
    "Accumulator",
    "AsyncResponseStream",
    "ResponseStream",
    "parse_tool_arguments",
    "sync_stream",
]


def parse_tool_arguments(raw: str) -> tuple[dict[str, Any], str | None]:
    """Parse streamed tool arguments: ``({...}, None)`` (``{}`` for an empty string), or
    ``({}, "what is wrong")``."""
    if not raw.strip():
        return {}, None
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        return {}, f"the model's tool arguments are not valid JSON ({exc}): {raw[:200]!r}"
    if not isinstance(value, dict):
        return {}, f"the model's tool arguments must be a JSON object, got {type(value).__name__}"
    return value, None


#: text fragments kept as separate strings before they are joined into one (memory stays the text
#: itself plus ~0.2 bytes per delta, instead of a ~57-byte str object per delta)
_BATCH = 256


@dataclass(slots=True, eq=False)
class _Prose:
    """An open text or thinking block: its text so far, as fragments."""

    key: Hashable
    provider_data: dict[str, Any] | None
    parts: list[str] = field(default_factory=list)
    batches: list[str] = field(default_factory=list)  # earlier parts, joined _BATCH at a time

    def add(self, text: str) -> None:
        parts = self.parts
        parts.append(text)
        if len(parts) >= _BATCH:
            self.batches.append("".join(parts))
            parts.clear()

    def joined(self) -> str:
        return "".join([*self.batches, *self.parts])


@dataclass(slots=True, eq=False)
class _Text(_Prose):
    def build(self) -> TextBlock:
        return TextBlock(text=self.joined(), provider_data=self.provider_data)


@dataclass(slots=True, eq=False)
class _Thinking(_Prose):
    signature: list[str] | None = None

    def build(self) -> ThinkingBlock:
        sig = "".join(self.signature) if self.signature is not None else None
        return ThinkingBlock(thinking=self.joined(), signature=sig, provider_data=self.provider_data)


@dataclass(slots=True, eq=False)
class _Tool:
    key: Hashable
    id: str
    name: str
    provider_data: dict[str, Any] | None
    parts: list[str] = field(default_factory=list)
    done: bool = False
    arguments: dict[str, Any] | None = None
    error: str | None = None  # the arguments are unusable whatever they parse to

    def add(self, fragment: str) -> None:
        """The next fragment of the arguments; one after the call ended (a late event) reopens
        it: its arguments are parsed again at its next end."""
        if self.done:
            self.done, self.arguments = False, None
        self.parts.append(fragment)

    def build(self) -> ToolUseBlock:
        arguments, error, raw = self.arguments, self.error, None
        if error is not None:
            arguments, raw = {}, "".join(self.parts) or orjson.dumps(arguments or {}).decode()
        elif arguments is None:
            arguments, error = parse_tool_arguments("".join(self.parts))
            raw = "".join(self.parts) if error else None
        return ToolUseBlock(id=self.id, name=self.name, arguments=arguments, raw_arguments=raw,
                            arguments_error=error, provider_data=self.provider_data)


@dataclass(slots=True, eq=False)
class _Fixed:
    """A finished block, with its key (so :meth:`Accumulator.order_by` can place it)."""

    key: Hashable
    block: Any

    def build(self) -> Any:
        return self.block


_Builder = Any  # _Text | _Thinking | _Tool | _Fixed


class Accumulator:
    """Collects one answer as it streams; :meth:`snapshot` / :meth:`finish` give the ``Response``.
    ``key`` arguments address several open blocks at once (an output or content-block index); a
    text or thinking delta with a new key starts a new block."""

    __slots__ = (
        "_items",
        "_last",
        "_tools",
        "cost",
        "model",
        "provider_data",
        "spec",
        "started",
        "stop_reason",
        "usage",
    )

    def __init__(self, model: str = "", spec: str = "") -> None:
        #: the ``provider:model`` asked, which the answer's footer names (:func:`name_spec`)
        self.spec = spec
        self.reset(model)

    def reset(self, model: str | None = None) -> None:
        """Forget everything (before a retry)."""
        if model is not None:
            self.model = model
        self._items: list[_Builder] = []
        self._tools: dict[Hashable, _Tool] = {}
        self._last: _Builder = None
        self.usage = Usage()
        self.stop_reason: StopReason | None = None
        self.provider_data: dict[str, Any] | None = None
        #: the answer's price, set once the call succeeded (docs/cost.md)
        self.cost: Cost | None = None
        #: True once any delta has been produced (then a failure must not be retried)
        self.started = False

    # -- text and thinking -------------------------------------------------------------------
    def text(self, text: str, *, key: Hashable = None) -> StreamDelta:
        """Append text to the text block with this key (a late delta too, whatever came after
        that block), else to a new one (``key=None``: the last block, when it is text); its
        provider data, if any: :meth:`text_provider_data`."""
        last = self._last
        if type(last) is _Text and last.key == key:
            parts = last.parts  # the hot path of every stream: the open block grows (_Prose.add)
            parts.append(text)
            if len(parts) >= _BATCH:
                last.batches.append("".join(parts))
                parts.clear()
        else:
            self._add_text(text, key)
        return text_delta("text_delta", text)

    def _add_text(self, text: str, key: Hashable) -> None:
        last = self._last
        if not (type(last) is _Text and last.key == key):
            found = self._find((_Text,), key) if key is not None else None
            if found is not None:  # a late delta: its block, not a new one after the others
                found.add(text)
                self.started = True
                return
            last = _Text(key, None)
            self._items.append(last)
            self._last = last
        last.add(text)
        self.started = True

    def thinking(
        self, text: str, *, key: Hashable = None, provider_data: dict[str, Any] | None = None
    ) -> StreamDelta:
        """Append visible reasoning (to the open thinking block with this key, else a new one)."""
        self._thinking_block(key, provider_data).add(text)
        self.started = True
        return text_delta("thinking_delta", text)

    def signature(
        self, signature: str, *, key: Hashable = None, provider_data: dict[str, Any] | None = None
    ) -> None:
        """Append to the signature of the open thinking block (opening an empty one if needed)."""
        block = self._thinking_block(key, provider_data)
        if block.signature is None:
            block.signature = []
        block.signature.append(signature)

    def thinking_provider_data(self, provider_data: dict[str, Any], *, key: Hashable = None) -> None:
        """Attach opaque provider data to the open thinking block with this key."""
        self._thinking_block(key, None).provider_data = provider_data

    def _thinking_block(self, key: Hashable, provider_data: dict[str, Any] | None) -> _Thinking:
        block: _Thinking | None = self._last
        if not (type(block) is _Thinking and block.key == key):
            block = self._find((_Thinking,), key) if key is not None else None
        if block is None:
            block = _Thinking(key, provider_data)
            self._items.append(block)
            self._last = block
        elif provider_data is not None:
            block.provider_data = provider_data
        return block

    def _find(self, kinds: tuple[type, ...], key: Hashable) -> Any:
        """The last block of one of ``kinds`` with this key (None: there is none)."""
        return next((i for i in reversed(self._items) if type(i) in kinds and i.key == key), None)

    def text_provider_data(self, provider_data: dict[str, Any], *, key: Hashable = None) -> None:
        """Attach opaque provider data to the text block with this key (e.g. a message id)."""
        block = self._find((_Text,), key)
        if block is not None:
            block.provider_data = provider_data

    def shown_text(self, key: Hashable) -> str | None:
        """The text or thinking that streamed into the block with this key (None: none did)."""
        block = self._find((_Text, _Thinking), key)
        return None if block is None else block.joined()

    def replace_text(self, key: Hashable, text: str) -> bool:
        """Replace the text of the text or thinking block with this key (a finished item is the
        final word on what streamed); False when there is none."""
        block = self._find((_Text, _Thinking), key)
        if block is None:
            return False
        block.batches, block.parts = [text], []
        return True

    def redacted_thinking(self, data: str) -> None:
        """Record an encrypted reasoning block (no delta: there is nothing to show)."""
        self.add_block(RedactedThinkingBlock(data=data))

    def add_block(self, block: Any, *, key: Hashable = None) -> None:
        """Append a finished block as is (``key``: its address for :meth:`order_by`)."""
        item = _Fixed(key, block)
        self._items.append(item)
        self._last = item
        self.started = True

    def set_block(self, key: Hashable, block: Any) -> None:
        """Replace the finished block added with ``key`` (earlier snapshots keep theirs)."""
        fixed = self._find((_Fixed,), key)
        if fixed is None:
            raise KeyError(key)
        fixed.block = block

    def order_by(self, rank: Mapping[Hashable, int]) -> None:
        """Reorder the blocks by ``rank[key]`` (a Responses ``output_index``: events may arrive
        out of order), stably; a block without a rank stays after the block before it."""
        ranked: list[tuple[int, int, _Builder]] = []
        current = -1
        for position, item in enumerate(self._items):
            value = rank.get(item.key)
            if value is not None:
                current = value
            ranked.append((current, position, item))
        ranked.sort(key=lambda entry: (entry[0], entry[1]))
        self._items = [item for _, _, item in ranked]

    # -- tools ---------------------------------------------------------------------------------
    def tool_start(
        self,
        key: Hashable,
        id: str,
        name: str,
        *,
        provider_data: dict[str, Any] | None = None,
    ) -> StreamDelta:
        """A tool call begins. ``key`` addresses it in later :meth:`tool_delta` / :meth:`tool_end`."""
        tool = _Tool(key, id, name, provider_data)
        self._tools[key] = tool
        self._items.append(tool)
        self._last = tool
        self.started = True
        return StreamDelta(type="tool_use_start", tool_call_id=id, tool_name=name)

    def has_tool(self, key: Hashable) -> bool:
        """Whether a tool call with this key is open."""
        tool = self._tools.get(key)
        return tool is not None and not tool.done

    def tool(self, key: Hashable) -> _Tool | None:
        """The tool call with this key (open or finished), if any."""
        return self._tools.get(key)

    def tool_delta(self, key: Hashable, fragment: str) -> StreamDelta:
        """The next fragment of a tool call's JSON arguments. A fragment of a call that already
        ended (a late event) reopens it: its arguments are parsed again at the next
        :meth:`tool_end` (:meth:`late_tool_delta` gives both)."""
        tool = self._tools[key]
        tool.add(fragment)
        return StreamDelta(
            type="tool_use_delta", tool_call_id=tool.id, tool_name=tool.name, argument_delta=fragment
        )

    def late_tool_delta(self, key: Hashable, fragment: str) -> tuple[StreamDelta, StreamDelta]:
        """A fragment of a call that already ended: it joins the call's arguments (its
        ``tool_use_delta``), which end again, parsed with it (a new ``tool_use_end``)."""
        return self.tool_delta(key, fragment), self.tool_end(key)

    def tool_end(
        self,
        key: Hashable,
        *,
        arguments: dict[str, Any] | None = None,
        raw_arguments: str | None = None,
    ) -> StreamDelta:
        """A tool call is complete: its arguments are parsed now (or given)."""
        tool = self._tools[key]
        if raw_arguments is not None:
            tool.parts = [raw_arguments]
        if arguments is not None:
            tool.arguments = arguments
        tool.done = True
        built = tool.build()
        if built.arguments_error is None:
            tool.arguments = built.arguments  # parsed once; later snapshots reuse it
        return StreamDelta(
            type="tool_use_end",
            tool_call_id=tool.id,
            tool_name=tool.name,
            arguments=built.arguments,
        )

    def tool_cut(self, key: Hashable, reason: str) -> None:
        """The answer ended mid-arguments (``max_tokens``): the call stays, with ``arguments={}``,
        ``raw_arguments`` and ``reason`` as its ``arguments_error`` (a session answers it with an
        error instead of running it)."""
        self._tools[key].error = reason

    def end_open_tools(self) -> list[StreamDelta]:
        """Finish every tool call still open (providers that never say a call ended)."""
        return [self.tool_end(t.key) for t in list(self._tools.values()) if not t.done]

    @property
    def tool_count(self) -> int:
        """How many tool calls have started."""
        return len(self._tools)

    # -- deltas from elsewhere -----------------------------------------------------------------
    def feed(self, delta: StreamDelta) -> None:
        """Take one :class:`StreamDelta` produced elsewhere (a replayed recording, a session's
        events, :meth:`Response.deltas <dispatch_nb.types.Response.deltas>`, which it rebuilds).
        A tool call is addressed by its ``tool_call_id``; its arguments are parsed from its
        fragments, else taken from ``tool_use_end``; a fragment of a call never started is
        ignored, one of a call that ended reopens it (a late fragment: its ``tool_use_end``
        follows)."""
        kind = delta.type
        if kind == "text_delta":  # (the hot path of a replay or a live view: no delta is built)
            self._add_text(delta.text or "", None)
        elif kind == "thinking_delta":
            self.thinking(delta.text or "")
        elif kind == "tool_use_start":
            key = delta.tool_call_id or ""
            self.tool_start(key, key, delta.tool_name or "")
        elif kind == "tool_use_delta":
            tool = self._tools.get(delta.tool_call_id or "")
            if tool is not None:
                tool.add(delta.argument_delta or "")
        elif kind == "tool_use_end":
            key = delta.tool_call_id or ""
            if self.has_tool(key):
                # the streamed raw arguments when there are some (arguments that are not valid
                # JSON keep their raw text and error), else the parsed ones the delta carries
                given = None if self._tools[key].parts else delta.arguments
                self.tool_end(key, arguments=given)

    # -- results -------------------------------------------------------------------------------
    def blocks(self) -> list[Any]:
        """The answer's blocks so far, in order (open tool calls with what arrived)."""
        return [item.build() for item in self._items]

    def pieces(self) -> Iterator[tuple[str, Any]]:
        """The answer so far as ``(kind, value)`` pairs, without building blocks: ``("text",
        str)``, ``("thinking", str)``, ``("tool", call)`` (the same record of a call every time:
        ``id``, ``name``, raw ``parts``, ``arguments`` once parsed, ``done``) and ``("block",
        block)``."""
        for item in self._items:
            kind = type(item)
            if kind is _Text:
                yield "text", item.joined()
            elif kind is _Thinking:
                yield "thinking", item.joined()
            elif kind is _Tool:
                yield "tool", item
            else:
                yield "block", item.block

    def snapshot(self) -> Response:
        """The answer so far (open tool calls included with what arrived of their arguments)."""
        blocks = self.blocks()
        response = Response(
            content=blocks,
            tool_calls=[b for b in blocks if isinstance(b, ToolUseBlock)],
            model=self.model,
            stop_reason=self.stop_reason,
            usage=self.usage,
            provider_data=self.provider_data,
            cost=self.cost,
        )
        if self.spec:
            name_spec(response, self.spec)
        return response

    def finish(self) -> Response:
        """The final answer; an unset stop reason becomes ``tool_use`` or ``end_turn``."""
        self.end_open_tools()
        if self.stop_reason is None:
            self.stop_reason = "tool_use" if self._tools else "end_turn"
        elif self.stop_reason == "end_turn" and self._tools:
            self.stop_reason = "tool_use"
        return self.snapshot()


def attach_partial(exc: BaseException, partial: Response | Accumulator | None) -> None:
    """Give ``exc`` (a ``KeyboardInterrupt`` too) what arrived unless it already carries some."""
    if partial is None or getattr(exc, "partial", None) is not None:
        return
    with contextlib.suppress(Exception):  # an exception type that takes no attributes
        exc.partial = partial.snapshot() if isinstance(partial, Accumulator) else partial  # type: ignore[attr-defined]


class _Tapped:
    """Deltas (sync or async) passed on as they are, each handed to ``tap`` first. A class, not a
    generator: ``close()`` may come from another thread while the reader is inside ``__next__``
    (a generator would refuse: "generator already executing")."""

    __slots__ = ("deltas", "tap")

    def __init__(self, deltas: Any, tap: Callable[[StreamDelta], None]) -> None:
        self.deltas = deltas
        self.tap = tap

    def __iter__(self) -> _Tapped:
        return self

    def __next__(self) -> StreamDelta:
        delta: StreamDelta = next(self.deltas)
        self.tap(delta)
        return delta

    def close(self) -> None:
        close = getattr(self.deltas, "close", None)
        if close is not None:
            close()

    def __aiter__(self) -> _Tapped:
        return self

    async def __anext__(self) -> StreamDelta:
        delta: StreamDelta = await self.deltas.__anext__()
        self.tap(delta)
        return delta

    async def aclose(self) -> None:
        aclose = getattr(self.deltas, "aclose", None)
        if aclose is not None:
            await aclose()


_D = TypeVar("_D", bound="Iterator[StreamDelta] | AsyncIterator[StreamDelta]")
_S = TypeVar("_S", bound="_DeltaStream[Any]")


class _DeltaStream(Generic[_D]):
    """What :class:`ResponseStream` and :class:`AsyncResponseStream` share."""

    def __init__(self, deltas: _D, accumulator: Accumulator) -> None:
        self._deltas: _D = deltas
        self._acc = accumulator
        self._log: list[StreamDelta] | None = None
        self._response: Response | None = None
        self._error: BaseException | None = None
        self._closed = False

    @property
    def partial(self) -> Response:
        """What has arrived so far (the final response once finished)."""
        return self._response if self._response is not None else self._acc.snapshot()

    @property
    def events(self) -> list[StreamDelta]:
        """Deltas that rebuild what arrived so far: those yielded after :meth:`keep_events`, else
        one per block of :attr:`partial` (docs/sessions.md, "A stream's log")."""
        if self._log is not None:
            return list(self._log)
        return self.partial.deltas()

    def keep_events(self: _S) -> _S:
        """Keep every delta yielded from now on in :attr:`events` (call it before iterating;
        it keeps the deltas alive, so it is off unless asked for); returns the stream."""
        if self._log is None:
            self._log = []
            self._deltas = _Tapped(self._deltas, self._log.append)
        return self

    @property
    def partial_parsed(self) -> Any:
        """The structured answer so far: None without ``output=``."""
        return None

    def _final(self) -> Response | None:
        """The final response (None while the stream runs); raises the error that ended it."""
        if self._response is None and self._error is not None:
            raise self._error
        return self._response

    def _ended(self) -> None:
        """The deltas ran out: the answer is final."""
        self._response = self._acc.finish()

    def _failed(self, exc: BaseException) -> None:
        """Iterating raised ``exc``: remember it and attach what arrived (the caller closes)."""
        self._error = exc
        attach_partial(exc, self._acc)

    def _left(self, exc: BaseException | None) -> None:
        """The ``with`` block is left: an exception raised in its body (Ctrl-C) keeps what
        arrived."""
        if exc is not None and self._response is None:
            attach_partial(exc, self._acc)


class ResponseStream(_DeltaStream[Iterator[StreamDelta]]):
    """Iterate for :class:`StreamDelta` s; ``.response`` is the final :class:`Response`. Leaving
    the ``with`` block (or :meth:`close`) ends the HTTP stream. An error raised while iterating
    (a ``KeyboardInterrupt`` too) carries ``partial``."""

    def __iter__(self) -> Iterator[StreamDelta]:
        source = self._deltas
        if isinstance(source, SyncIterator):  # a loop takes the deltas a batch at a time
            return self._batched(source)
        return self

    def _batched(self, source: SyncIterator[StreamDelta]) -> Iterator[StreamDelta]:
        """:meth:`__next__` without a call per delta: what arrived since the last look, a batch
        at a time."""
        while self._response is None and not self._closed:
            try:
                batch = source.batch()
                if batch is not None:
                    for _ in range(len(batch)):
                        if self._closed:
                            return
                        yield batch.popleft()
                    continue
            except GeneratorExit:  # the loop was left (break): the stream stays open
                raise
            except BaseException as exc:  # Ctrl-C included, wherever it lands
                self._failed(exc)
                self.close()
                raise
            self._ended()
            return

    def __next__(self) -> StreamDelta:
        if self._response is not None or self._closed:
            raise StopIteration
        try:
            return next(self._deltas)
        except StopIteration:
            self._ended()
            raise
        except BaseException as exc:
            self._failed(exc)
            self.close()
            raise

    def until_done(self) -> Response:
        """Consume what is left and return the final response."""
        for _ in self:
            pass
        return self.response

    @property
    def response(self) -> Response:
        """The final response; reading it consumes any deltas not yet iterated."""
        response = self._final()
        if response is not None:
            return response
        if self._closed:
            raise RequestCancelled(
                "the stream was closed before it finished", partial=self._acc.snapshot()
            )
        return self.until_done()

    @property
    def text_stream(self) -> Iterator[str]:
        """Just the answer's text, piece by piece."""
        for delta in self:
            if delta.type == "text_delta" and delta.text:
                yield delta.text

    def close(self) -> None:
        """End the stream and release the connection (idempotent)."""
        if self._closed:
            return
        self._closed = True
        close = getattr(self._deltas, "close", None)
        if close is not None:
            close()

    def __enter__(self) -> ResponseStream:
        return self

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        self._left(exc)
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            if not self._closed and self._response is None:
                self.close()


class AsyncResponseStream(_DeltaStream[AsyncIterator[StreamDelta]]):
    """The async twin of :class:`ResponseStream` (``async for``, ``async with``, ``aclose``)."""

    def __aiter__(self) -> AsyncResponseStream:
        return self

    async def __anext__(self) -> StreamDelta:
        if self._response is not None or self._closed:
            raise StopAsyncIteration
        try:
            return await self._deltas.__anext__()
        except StopAsyncIteration:
            self._ended()
            raise
        except BaseException as exc:
            self._failed(exc)
            await self.aclose()
            raise

    async def until_done(self) -> Response:
        """Consume what is left and return the final response."""
        async for _ in self:
            pass
        return self.response

    @property
    def response(self) -> Response:
        """The final response (iterate to the end first, or use :meth:`until_done`)."""
        response = self._final()
        if response is None:
            raise RuntimeError(
                "the stream has not finished: iterate it to the end or await until_done()"
            )
        return response

    async def aclose(self) -> None:
        """End the stream and release the connection (idempotent)."""
        if self._closed:
            return
        self._closed = True
        aclose = getattr(self._deltas, "aclose", None)
        if aclose is not None:
            await aclose()

    async def __aenter__(self) -> AsyncResponseStream:
        return self

    async def __aexit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        self._left(exc)
        await self.aclose()


class _Mirror(Accumulator):
    """The accumulator of a stream that passes another stream's deltas on: its answer is that
    stream's (nothing is accumulated or finished twice)."""

    def __init__(self, inner: AsyncResponseStream) -> None:
        super().__init__("")
        self._inner = inner

    def snapshot(self) -> Response:
        return self._inner.partial

    def finish(self) -> Response:
        return self._inner.response


class _Taken(Accumulator):
    """What a sync caller has taken of another stream (fed on the caller's thread, so ``partial``
    is what it has seen); the answer is that stream's."""

    def __init__(self, inner: AsyncResponseStream) -> None:
        super().__init__(inner.partial.model)
        self._inner = inner

    def finish(self) -> Response:
        return self._inner.response


def sync_stream(inner: AsyncResponseStream) -> ResponseStream:
    """``inner`` for a sync caller: it runs on the library's event-loop thread
    (:class:`~dispatch_nb.bridge.SyncIterator`); closing the sync stream (or Ctrl-C) cancels it
    there."""
    taken = _Taken(inner)
    return ResponseStream(_Tapped(SyncIterator(lambda: inner), taken.feed), taken)
