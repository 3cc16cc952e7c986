"""Sync calls over the async core: the library's private event-loop thread.

A sync entry point runs its coroutine as a task on one event loop that a daemon thread of this
module keeps: :func:`run_sync` waits for its result, :class:`SyncIterator` hands an async
iterator's items to the calling thread a batch at a time. The calling thread never runs the loop;
Ctrl-C and ``close()`` cancel the task. docs/architecture.md (I/O) says more.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import contextvars
import functools
import inspect
import os
import threading
from collections import deque
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable
from typing import Any, Generic, ParamSpec, TypeVar, cast

__all__ = ["HIGH_WATER", "SyncIterator", "loop_thread", "run_sync", "same_parameters"]

T = TypeVar("T")
P = ParamSpec("P")

#: items the task may put ahead of the calling thread before it waits for the caller
HIGH_WATER = 256
#: ...and it goes on once the caller has taken the buffer down to this, or starts on a batch
LOW_WATER = 64
#: seconds ``close()`` waits for a cancelled task to unwind (its connection to close)
CLOSE_WAIT = 5.0


def same_parameters(
    of: Callable[P, object], *, hide: Iterable[str] = ()
) -> Callable[[Callable[..., T]], Callable[P, T]]:
    """Give the decorated function (written ``(*args, **kwargs)``, passing them on) the parameters
    of ``of`` for type checkers and :func:`inspect.signature` (less ``hide``, accepted and
    ignored): how a sync entry point and its async twin share one list of keywords. Arguments that
    do not fit raise :class:`TypeError` naming the decorated function."""

    def decorate(func: Callable[..., T]) -> Callable[P, T]:
        signature = inspect.signature(of)
        hidden = set(hide)
        params = [p for p in signature.parameters.values() if p.name not in hidden]
        public = signature.replace(
            parameters=params, return_annotation=inspect.signature(func).return_annotation
        )

        def check(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            try:
                signature.bind(*args, **kwargs)
            except TypeError as exc:
                raise TypeError(f"{func.__qualname__}(): {exc}") from None

        async def checked_async(*args: Any, **kwargs: Any) -> Any:
            check(args, kwargs)
            return await func(*args, **kwargs)  # type: ignore[misc]

        def checked(*args: Any, **kwargs: Any) -> Any:
            check(args, kwargs)
            return func(*args, **kwargs)

        wrapper: Any = checked_async if inspect.iscoroutinefunction(func) else checked
        functools.update_wrapper(wrapper, func)
        wrapper.__signature__ = public
        return cast("Callable[P, T]", wrapper)

    return decorate


class _LoopThread:
    """One event loop on a daemon thread, shared by every sync call of the process."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="dispatch_nb-loop",
                                       daemon=True)
        self.thread.start()

    def stop(self) -> None:
        """Close the loop's async generators (the clients made on it), then stop it."""
        if not self.thread.is_alive():
            return
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(self.loop.shutdown_asyncgens(), self.loop).result(5)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(2)


_loop_thread: _LoopThread | None = None
_loop_thread_lock = threading.Lock()


def _runner() -> _LoopThread:
    global _loop_thread
    runner = _loop_thread
    if runner is None or runner.pid != os.getpid():  # none yet, or forked: threads do not survive
        with _loop_thread_lock:
            runner = _loop_thread
            if runner is None or runner.pid != os.getpid():
                runner = _loop_thread = _LoopThread()
    return runner


def loop_thread() -> asyncio.AbstractEventLoop:
    """The library's private event loop (started on first use, on a daemon thread), where
    long-lived async clients (MCP servers) live."""
    return _runner().loop


def running_loop() -> asyncio.AbstractEventLoop | None:
    """The private loop when its thread runs in this process (None: no sync call made one)."""
    runner = _loop_thread
    if runner is None or runner.pid != os.getpid() or not runner.thread.is_alive():
        return None
    return runner.loop


@atexit.register
def _stop_at_exit() -> None:
    if running_loop() is not None and _loop_thread is not None:
        _loop_thread.stop()


#: the thread of the sync call a task on the private loop runs for (None: an async caller); the
#: embedded model's lock reads it
CALLER_THREAD: contextvars.ContextVar[int | None] = contextvars.ContextVar(
    "dispatch_nb_caller_thread", default=None)


def caller_thread() -> int:
    """The thread a call is made for: the sync caller's, else the current thread."""
    return CALLER_THREAD.get() or threading.get_ident()


def _loop_for_caller() -> asyncio.AbstractEventLoop:
    runner = _runner()
    if _on_loop_thread():
        raise RuntimeError(
            "a sync dispatch_nb call was made inside dispatch_nb's own event loop (from async "
            "code it runs): use the async method (achat, astream, asend...) there"
        )
    return runner.loop


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` on the private loop and return its result (or raise its error). Ctrl-C in
    the calling thread cancels it, waits for it to unwind, and raises ``KeyboardInterrupt``."""

    async def result() -> AsyncIterator[T]:
        yield await coro

    once = SyncIterator(result)
    try:
        return next(once)
    except BaseException:
        once.close()
        raise


class SyncIterator(Generic[T]):
    """Iterate the async iterator ``make()`` gives (called on the loop's thread) from a sync
    thread. :meth:`close` cancels the task and waits for it."""

    __slots__ = ("_done", "_error", "_items", "_loop", "_make", "_paused", "_resume", "_sleeping",
                 "_task", "_wake")

    def __init__(self, make: Callable[[], AsyncIterator[T]]) -> None:
        self._make = make
        self._items: deque[T] = deque()  # the task appends, the caller pops
        self._wake = threading.Event()
        self._sleeping = False  # the caller is (about to be) blocked on _wake
        self._done = False
        self._error: BaseException | None = None
        self._paused = False
        self._resume: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    # -- the calling thread ----------------------------------------------------------------------
    def __iter__(self) -> SyncIterator[T]:
        return self

    def __next__(self) -> T:
        items = self._items
        if items:
            item = items.popleft()
            if self._paused and len(items) <= LOW_WATER:
                self._go_on_soon()
            return item
        batch = self.batch()
        if batch is None:
            raise StopIteration
        return batch.popleft()

    def batch(self) -> deque[T] | None:
        """The items that arrived and are not taken yet (waiting while there are none; the caller
        pops the ``len()`` it finds while the task appends); ``None`` at the end. Raises the
        task's error."""
        items = self._items
        while True:
            if self._paused:  # the caller is about to take what waits: the task may go on
                self._go_on_soon()
            if items:
                return items
            if self._done:
                if items:  # the last items came after the first look
                    continue
                if self._error is not None:
                    error, self._error = self._error, None
                    raise error
                return None
            if self._loop is None:
                self._start()
            else:
                self._sleep()

    def _go_on_soon(self) -> None:
        self._paused = False
        self._loop.call_soon_threadsafe(self._go_on)  # type: ignore[union-attr]

    def _start(self) -> None:
        loop = self._loop = _loop_for_caller()
        context = contextvars.copy_context()  # the caller's, naming the caller's thread
        context.run(CALLER_THREAD.set, threading.get_ident())
        loop.call_soon_threadsafe(self._begin, context=context)

    def _sleep(self) -> None:
        self._wake.clear()
        self._sleeping = True
        if self._items or self._done:
            self._sleeping = False  # it came meanwhile
            return
        self._wake.wait()
        self._sleeping = False

    def close(self) -> None:
        """Stop the task (idempotent) and wait for it to unwind (its connection closed)."""
        loop = self._loop
        if loop is None or self._done:
            self._done = True
            return
        done = threading.Event()

        def cancel() -> None:
            current = self._task
            if current is None or current.done():
                done.set()
            else:
                current.add_done_callback(lambda _: done.set())
                current.cancel()

        try:
            loop.call_soon_threadsafe(cancel)
        except RuntimeError:  # the loop is gone (interpreter shutdown)
            return
        if not _on_loop_thread():
            done.wait(CLOSE_WAIT)
        self._done = True
        self._items.clear()

    # -- the loop thread -------------------------------------------------------------------------
    def _begin(self) -> None:
        if self._done:
            return
        self._task = asyncio.get_running_loop().create_task(self._run())

    def _go_on(self) -> None:
        if self._resume is not None:
            self._resume.set()

    async def _run(self) -> None:
        items = self._items
        iterator: AsyncIterator[T] | None = None
        try:
            iterator = self._make()
            async for item in iterator:
                items.append(item)
                if self._sleeping:
                    self._sleeping = False
                    self._wake.set()
                if len(items) > HIGH_WATER:
                    if self._resume is None:
                        self._resume = asyncio.Event()
                    self._resume.clear()
                    self._paused = True
                    if len(items) > LOW_WATER:  # not taken meanwhile
                        await self._resume.wait()
                    self._paused = False
        except BaseException as exc:  # handed to the caller (a cancel is the caller's own doing)
            self._error = exc
        finally:
            aclose = getattr(iterator, "aclose", None)
            if aclose is not None:
                with contextlib.suppress(BaseException):
                    await aclose()
            self._done = True
            self._wake.set()


def _on_loop_thread() -> bool:
    runner = _loop_thread
    return runner is not None and threading.current_thread() is runner.thread
