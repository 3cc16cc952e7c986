"""Per-call deadline and cancellation: one object every adapter call carries.

A call's :class:`CallControl` knows its total deadline (``timeout=`` seconds, covering connect,
every read and every retry) and its :class:`~dispatch_nb.cancel.CancelToken`. When either fires, it
runs the abort hooks the transport registered (closing a socket, cancelling an asyncio task), so a
blocked read wakes at once instead of waiting for the server.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Literal

from .cancel import CancelToken
from .errors import APITimeoutError, DispatchError, RequestCancelled

__all__ = ["CallControl"]

AbortReason = Literal["cancel", "timeout"]


class CallControl:
    """Deadline + cancel token + abort hooks for one call (sync or async)."""

    __slots__ = (
        "_aborted_after",
        "_hooks",
        "_lock",
        "_remove_cancel",
        "_timer",
        "_wake",
        "cancel",
        "deadline",
        "provider",
        "reason",
        "started_at",
        "timeout",
    )

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
        self.cancel = cancel
        self.provider = provider
        self.started_at = time.monotonic()
        self.deadline = self.started_at + timeout if timeout is not None else None
        self.reason: AbortReason | None = None
        self._aborted_after: float | None = None
        self._hooks: list[Callable[[], None]] = []
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._timer: threading.Timer | asyncio.TimerHandle | None = None
        self._remove_cancel: Callable[[], None] | None = None

    # -- lifecycle -------------------------------------------------------------------------------
    def _restart_clock(self) -> None:
        # The deadline counts from the first read of the stream, not from when it was created.
        self.started_at = time.monotonic()
        if self.timeout is not None:
            self.deadline = self.started_at + self.timeout

    def start(self) -> None:
        """Arm the deadline timer (a thread) and the cancel callback."""
        self._restart_clock()
        if self.cancel is not None:
            self._remove_cancel = self.cancel.add_callback(lambda: self.abort("cancel"))
        if self.timeout is not None and self.reason is None:
            timer = threading.Timer(self.timeout, self.abort, args=("timeout",))
            timer.daemon = True
            timer.start()
            self._timer = timer

    def start_async(self, loop: asyncio.AbstractEventLoop) -> None:
        """Arm the deadline on the event loop and the cancel callback."""
        self._restart_clock()
        if self.cancel is not None:
            self._remove_cancel = self.cancel.add_callback(lambda: self.abort("cancel"))
        if self.timeout is not None and self.reason is None:
            self._timer = loop.call_later(self.timeout, self.abort, "timeout")

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
        self._wake.set()
        for hook in hooks:
            try:
                hook()
            except Exception:
                pass

    def on_abort(self, hook: Callable[[], None]) -> Callable[[], None]:
        """Register a hook (run at once if already aborted); returns a function removing it."""
        with self._lock:
            if self.reason is None:
                self._hooks.append(hook)

                def remove() -> None:
                    with self._lock:
                        try:
                            self._hooks.remove(hook)
                        except ValueError:
                            pass

                return remove
        hook()
        return lambda: None

    # -- queries ---------------------------------------------------------------------------------
    def remaining(self) -> float | None:
        """Seconds left before the deadline (None: no deadline)."""
        if self.deadline is None:
            return None
        return max(0.0, self.deadline - time.monotonic())

    def _waited(self) -> float:
        return self._aborted_after if self._aborted_after is not None else self.elapsed()

    def elapsed(self) -> float:
        """Seconds since the call started."""
        return time.monotonic() - self.started_at

    def error(self) -> DispatchError:
        """The error that describes why the call was aborted."""
        if self.reason == "timeout":
            return APITimeoutError(
                f"no complete answer within the {self.timeout:g} s timeout "
                f"(waited {self._waited():.1f} s); pass a larger timeout= or try again",
                provider=self.provider,
            )
        reason = self.cancel.reason if self.cancel is not None else None
        return RequestCancelled(reason or "the request was cancelled", provider=self.provider)

    def check(self) -> None:
        """Raise the abort error if the call has been aborted (or the deadline has passed)."""
        if self.reason is None and self.deadline is not None and time.monotonic() >= self.deadline:
            self.abort("timeout")
        if self.reason is not None:
            raise self.error()

    def sleep(self, seconds: float) -> None:
        """Wait ``seconds`` (e.g. a retry backoff), waking early on abort; then :meth:`check`."""
        remaining = self.remaining()
        if remaining is not None and seconds >= remaining:
            seconds = remaining
        if seconds > 0:
            self._wake.wait(seconds)
        self.check()

    async def asleep(self, seconds: float) -> None:
        """The async twin of :meth:`sleep`."""
        remaining = self.remaining()
        if remaining is not None and seconds >= remaining:
            seconds = remaining
        end = time.monotonic() + seconds
        while self.reason is None:
            left = end - time.monotonic()
            if left <= 0:
                break
            await asyncio.sleep(min(left, 0.05))
        self.check()
