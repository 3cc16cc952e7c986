"""The stream of one session turn, what :meth:`Session.stream <dispatch_nb.session.Session.stream>`
and :meth:`Session.astream <dispatch_nb.session.Session.astream>` return (how it ends on a
failure: docs/sessions.md, "Streaming events"). It drives the turn's event generator (the
session's ``_run`` or ``_arun``) and shares a :class:`TurnState` with it.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Generator
from typing import Any, Generic, TypeVar

from ..errors import RequestCancelled
from ..stream import AsyncResponseStream, ResponseStream, attach_partial
from ..turn import TurnAccumulator
from ..types import ErrorEvent, Response, StreamEvent

__all__ = ["AsyncSessionStream", "SessionStream", "TurnState"]


class TurnState:
    """What a running turn shares with the stream object that drives it: the model call streaming
    now, and the turn collected so far (a :class:`~dispatch_nb.turn.TurnAccumulator` of its
    rounds and tool results)."""

    __slots__ = ("collected", "stream")

    def __init__(self, model: str = "") -> None:
        self.stream: ResponseStream | AsyncResponseStream | None = None
        self.collected = TurnAccumulator(model)

    @property
    def response(self) -> Response | None:
        """The turn's answer so far: its last model round's (None before the first ends)."""
        return self.collected.response


_E = TypeVar(
    "_E", bound="Generator[StreamEvent, None, None] | AsyncGenerator[StreamEvent, None]"
)


class _TurnStream(Generic[_E]):
    """What :class:`SessionStream` and :class:`AsyncSessionStream` share: the turn's events and
    state, the error that ended it, and what happens when its events end, fail or are
    interrupted."""

    def __init__(self, events: _E, state: TurnState, raise_errors: bool) -> None:
        self._events = events
        self._state = state
        self._raise = raise_errors  # cleared once the error is raised: it is raised once
        #: the exception that ended the turn, if one did
        self.error: Exception | None = None
        self._finished = False
        self._closed = False

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
        if self.error is not None and self._raise:
            self._raise = False
            raise self.error
        return True

    def _failed(self, exc: BaseException) -> ErrorEvent:
        """The turn failed: the event that says so (the error is raised on the next step). Ctrl-C
        or task cancellation (not an ``Exception``) is raised at once, with what arrived
        attached."""
        self._finished = True
        if not isinstance(exc, Exception):
            attach_partial(exc, self.partial)
            raise exc
        self.error = exc
        return ErrorEvent(error=exc)


class SessionStream(_TurnStream[Generator[StreamEvent, None, None]]):
    """What :meth:`Session.stream` returns: iterate for events; a context manager
    (docs/sessions.md, "Streaming events")."""

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
        except BaseException as exc:
            return self._failed(exc)

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
            attach_partial(exc, self.partial)
        self.close()


class AsyncSessionStream(_TurnStream[AsyncGenerator[StreamEvent, None]]):
    """The async twin of :class:`SessionStream` (``async for``, ``async with``, ``aclose``)."""

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
        except BaseException as exc:
            return self._failed(exc)

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
            attach_partial(exc, self.partial)
        await self.aclose()

