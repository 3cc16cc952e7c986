"""Deadlines and cancellation: a call's :class:`CallControl`, a turn's :class:`TurnControl`.

A turn's control is the ``cancel=`` token of each of its calls, so a call also stops at the turn's
deadline and when the turn is cancelled.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable
from typing import Any, Literal

from .cancel import CancelToken, remover
from .clock import monotonic
from .errors import APITimeoutError, DispatchError, RequestCancelled

__all__ = ["CallControl", "TurnControl"]

AbortReason = Literal["cancel", "timeout"]


class _Clock:
    """What a call's control and a turn's share: ``timeout=`` seconds from when the clock starts,
    never past the deadline of the turn its ``cancel=`` token is."""

    def __init__(
        self,
        *,
        timeout: float | None = None,
        cancel: CancelToken | None = None,
        provider: str | None = None,
    ) -> None:
        if timeout is not None and timeout <= 0:
            raise ValueError(f"timeout must be a positive number of seconds, not {timeout!r}")
        self.timeout = timeout
        self.provider = provider
        self._start_clock(cancel)

    def _start_clock(self, enclosing: CancelToken | None) -> None:
        self.started_at = monotonic()
        self.deadline = self.started_at + self.timeout if self.timeout is not None else None
        #: the enclosing turn whose deadline comes first (its timeout error is the one raised)
        self.outer: TurnControl | None = None
        if isinstance(enclosing, TurnControl) and enclosing.deadline is not None and (
            self.deadline is None or enclosing.deadline <= self.deadline
        ):
            self.outer, self.deadline = enclosing, enclosing.deadline

    def elapsed(self) -> float:
        """Seconds since the call or turn started."""
        return monotonic() - self.started_at

    def remaining(self) -> float | None:
        """Seconds left before the deadline (None: no deadline)."""
        if self.deadline is None:
            return None
        return max(0.0, self.deadline - monotonic())

    def expired(self) -> bool:
        """True once the deadline has passed."""
        return self.deadline is not None and monotonic() >= self.deadline

    def timeout_error(self, where: str = "", waited: float | None = None) -> APITimeoutError:
        """The error of a deadline that passed (``where``: what was being done; ``waited``:
        seconds, by default :meth:`elapsed`); the enclosing turn's when it was its deadline."""
        if self.outer is not None:
            return self.outer.timeout_error(where)
        waited = self.elapsed() if waited is None else waited
        return APITimeoutError(
            f"no complete answer within the {self.timeout:g} s timeout (waited "
            f"{waited:.1f} s{', ' + where if where else ''}); pass a larger timeout= or "
            "try again",
            provider=self.provider,
        )


class CallControl(_Clock):
    """Deadline + cancel token + abort hooks for one call (sync or async). The deadline counts
    from the first read of the stream (:meth:`start_async`), not from when it was created."""

    def __init__(self, *, timeout: float | None = None, cancel: CancelToken | None = None,
                 provider: str | None = None) -> None:
        super().__init__(timeout=timeout, cancel=cancel, provider=provider)
        self.cancel = cancel
        self.reason: AbortReason | None = None
        self._aborted_after: float | None = None
        self._hooks: list[Callable[[], None]] = []
        self._lock = threading.Lock()
        self._timer: asyncio.TimerHandle | None = None
        self._remove_cancel: Callable[[], None] | None = None

    # -- lifecycle -------------------------------------------------------------------------------
    def start_async(self, loop: asyncio.AbstractEventLoop) -> None:
        """Arm the deadline on the event loop and the cancel callback."""
        self._start_clock(self.cancel)
        if self.cancel is not None:
            self._remove_cancel = self.cancel.add_callback(lambda: self.abort("cancel"))
        remaining = self.remaining()
        if remaining is not None and self.reason is None:
            self._timer = loop.call_later(remaining, self.abort, "timeout")

    def stop(self) -> None:
        """Disarm everything (idempotent)."""
        timer, self._timer = self._timer, None
        if timer is not None:
            timer.cancel()
        remove, self._remove_cancel = self._remove_cancel, None
        if remove is not None:
            remove()
        with self._lock:
            self._hooks.clear()

    # -- aborting --------------------------------------------------------------------------------
    def abort(self, reason: AbortReason) -> None:
        """Stop the call now: record why and run the transport's hooks. Safe from any thread."""
        with self._lock:
            if self.reason is not None:
                return
            self.reason = reason
            self._aborted_after = self.elapsed()
            hooks = list(self._hooks)
        for hook in hooks:
            with contextlib.suppress(Exception):
                hook()

    def on_abort(self, hook: Callable[[], None]) -> Callable[[], None]:
        """Register a hook (run at once if already aborted); returns a function removing it."""
        with self._lock:
            if self.reason is None:
                self._hooks.append(hook)
                return remover(self._lock, self._hooks, hook)
        hook()
        return lambda: None

    # -- queries ---------------------------------------------------------------------------------
    def error(self) -> DispatchError:
        """The error that describes why the call was aborted."""
        if self.reason == "timeout":
            return self.timeout_error(waited=self._aborted_after)
        reason = self.cancel.reason if self.cancel is not None else None
        return RequestCancelled(reason or "the request was cancelled", provider=self.provider)

    def check(self) -> None:
        """Raise the abort error if the call has been aborted (or the deadline has passed)."""
        if self.reason is None and self.expired():
            self.abort("timeout")
        if self.reason is not None:
            raise self.error()

    async def asleep(self, seconds: float) -> None:
        """Wait ``seconds`` (e.g. a retry backoff), waking early on abort; then :meth:`check`."""
        remaining = self.remaining()
        if remaining is not None and seconds >= remaining:
            seconds = remaining
        end = time.monotonic() + seconds  # a real wait, whatever clock the deadline reads
        while self.reason is None:
            left = end - time.monotonic()
            if left <= 0:
                break
            await asyncio.sleep(min(left, 0.05))
        self.check()


class TurnControl(_Clock, CancelToken):
    """One deadline and one cancel switch for a whole turn: ``with TurnControl(timeout=...,
    cancel=token) as turn:``, then ``cancel=turn`` to each model call. ``timeout`` counts from
    now; cancelling ``token`` cancels the turn. :meth:`run_async` waits for async work (tools)
    under the turn's deadline and cancel switch."""

    def __init__(self, *, timeout: float | None = None, cancel: CancelToken | None = None,
                 provider: str | None = None) -> None:
        CancelToken.__init__(self)
        _Clock.__init__(self, timeout=timeout, cancel=cancel, provider=provider)
        self._remove_parent: Callable[[], None] | None = None
        if cancel is not None:
            self._remove_parent = cancel.add_callback(lambda: self.cancel(cancel.reason))

    def close(self) -> None:
        """Detach from the caller's token (idempotent); the turn's calls have ended."""
        remove, self._remove_parent = self._remove_parent, None
        if remove is not None:
            remove()

    def __enter__(self) -> TurnControl:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- queries ---------------------------------------------------------------------------------
    def check(self, where: str = "") -> None:
        """Raise if the turn was cancelled (:class:`RequestCancelled`) or its deadline passed
        (:class:`APITimeoutError`, saying ``where``)."""
        if self.cancelled:
            raise RequestCancelled(self.reason or "the request was cancelled",
                                   provider=self.provider)
        if self.expired():
            raise self.timeout_error(where)

    async def run_async(self, work: asyncio.Future[Any], where: str = "") -> Any:
        """``work``'s result; when the turn is cancelled or its deadline passes first, cancel
        ``work`` (waiting for it to unwind) and raise as :meth:`check` does."""
        self.check(where)
        loop = asyncio.get_running_loop()
        woken = loop.create_future()

        def settle() -> None:
            if not woken.done():
                woken.set_result(None)

        def wake() -> None:  # the cancel may come from any thread
            loop.call_soon_threadsafe(settle)

        remove = self.add_callback(wake)
        try:
            await asyncio.wait({work, woken}, timeout=self.remaining(),
                               return_when=asyncio.FIRST_COMPLETED)
            if not work.done():
                self.check(where)
                raise self.timeout_error(where)  # asyncio.wait's clock ran out a hair early
            return work.result()
        finally:
            remove()
            woken.cancel()
            if not work.done():
                work.cancel()
                await asyncio.gather(work, return_exceptions=True)
