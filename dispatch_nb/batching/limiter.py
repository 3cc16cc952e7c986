"""Adaptive concurrency for a batch: AIMD, like TCP's congestion control (docs/batch.md, "Rate
limits, retries, deadlines"). A 429 lowers the limit only if its request started after the last
decrease, so one burst counts once; waiting rows are admitted in order, retries first. It lives on
one event loop: other threads reach it through that loop.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time
from collections.abc import Callable

from ..errors import DispatchError

__all__ = ["AdaptiveLimiter"]

#: the lowest the limit goes
MIN_LIMIT = 1.0
#: the factor a rate limit multiplies the limit by
DECREASE = 0.5


class AdaptiveLimiter:
    """Slots for in-flight requests, sized by AIMD. ``await acquire()`` … ``release()``."""

    def __init__(self, concurrency: int) -> None:
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            raise ValueError(f"concurrency must be a positive integer, not {concurrency!r}")
        self.ceiling = concurrency
        #: the current limit (float: additive increase adds fractions)
        self.limit = float(concurrency)
        #: requests holding a slot now
        self.in_flight = 0
        #: increments at every decrease; a request remembers the epoch it started in
        self.epoch = 0
        #: the lowest limit reached
        self.lowest = float(concurrency)
        #: how many times a rate limit lowered the limit
        self.decreases = 0
        self._paused_until = 0.0
        self._first: collections.deque[asyncio.Future[None]] = collections.deque()
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self._timer: asyncio.TimerHandle | None = None
        self._cancelled: Callable[[], DispatchError] | None = None

    @property
    def paused_for(self) -> float:
        """Seconds until new requests may start again after a ``retry-after`` (0: not paused)."""
        return max(0.0, self._paused_until - time.monotonic())

    # -- slots -----------------------------------------------------------------------------------
    async def acquire(self, *, first: bool = False) -> int:
        """Wait for a slot; returns the epoch the request starts in. ``first``: ahead of rows
        that have not started yet (a retry). Raises the cancel error once :meth:`cancel_all` ran."""
        if self._cancelled is not None:
            raise self._cancelled()
        if self._free() and not self._first and (first or not self._waiters):
            self.in_flight += 1
            return self.epoch
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        (self._first if first else self._waiters).append(future)
        self._wake()  # a free slot behind a queue, or a pause that needs its wake-up timer
        try:
            await future
        except BaseException:
            if future.done() and not future.cancelled() and future.exception() is None:
                self.release()  # granted while we were being cancelled: give it back
            else:
                for queue in (self._first, self._waiters):
                    with contextlib.suppress(ValueError):
                        queue.remove(future)
            raise
        return self.epoch

    def release(self) -> None:
        self.in_flight = max(0, self.in_flight - 1)
        self._wake()

    def _free(self) -> bool:
        return self.in_flight < int(self.limit) and self.paused_for == 0

    def _wake(self) -> None:
        while self._free():
            queue = self._first or self._waiters
            if not queue:
                return
            future = queue.popleft()
            if future.done():
                continue
            self.in_flight += 1
            future.set_result(None)
        if (self._first or self._waiters) and self.paused_for > 0 and self._timer is None:
            loop = asyncio.get_running_loop()

            def resume() -> None:
                self._timer = None
                self._wake()

            self._timer = loop.call_later(self.paused_for, resume)

    # -- feedback --------------------------------------------------------------------------------
    def on_success(self) -> None:
        """An answer arrived: grow back towards the ceiling."""
        if self.limit < self.ceiling:
            self.limit = min(float(self.ceiling), self.limit + 1.0 / self.limit)
            self._wake()

    def on_rate_limited(self, started_epoch: int, retry_after: float | None) -> None:
        """A request that started in ``started_epoch`` got a 429 (``retry_after`` seconds, if the
        server said): halve the limit once per burst, and hold new requests until then."""
        if started_epoch == self.epoch:
            self.limit = max(MIN_LIMIT, self.limit * DECREASE)
            self.lowest = min(self.lowest, self.limit)
            self.epoch += 1
            self.decreases += 1
        if retry_after is not None and retry_after > 0:
            self._paused_until = max(self._paused_until, time.monotonic() + retry_after)

    def cancel_all(self, error: Callable[[], DispatchError]) -> None:
        """Fail every waiting and future :meth:`acquire` with a fresh ``error()``."""
        self._cancelled = error
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for queue in (self._first, self._waiters):
            while queue:
                future = queue.popleft()
                if not future.done():
                    future.set_exception(error())
