"""``budget=``: dollars a batch or a session may spend (docs/cost.md)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from decimal import Decimal
from typing import TYPE_CHECKING

from .cost import format_usd
from .errors import BudgetExceededError

if TYPE_CHECKING:
    from .cancel import CancelToken

__all__ = ["Budget"]


class Budget:
    """``budget=``: dollars a batch or a session may spend (docs/cost.md, "Budgets"). Each
    request reserves its worst case (:meth:`reserve`) and :meth:`settle` replaces that with what
    it cost; one that does not fit raises :class:`~dispatch_nb.errors.BudgetExceededError`."""

    def __init__(self, usd: float | Decimal | str) -> None:
        if isinstance(usd, bool):
            raise TypeError("budget= is an amount of US dollars, e.g. budget=0.50")
        try:
            amount = Decimal(str(usd))
        except Exception:
            raise TypeError(f"budget= is an amount of US dollars, e.g. budget=0.50; not {usd!r}") \
                from None
        if not amount.is_finite() or amount < 0:
            raise ValueError(f"budget= must be a non-negative amount of US dollars, not {usd!r}")
        self.usd = amount
        self.spent = Decimal(0)
        self.reserved = Decimal(0)
        self._lock = threading.Lock()
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []

    @classmethod
    def of(cls, value: Budget | float | Decimal | str | None) -> Budget | None:
        """``budget=`` as given: a Budget (shared), an amount, or None."""
        if value is None or isinstance(value, Budget):
            return value
        return cls(value)

    @property
    def remaining(self) -> Decimal:
        """What may still be spent or reserved."""
        return self.usd - self.spent - self.reserved

    def _refusal(self, worst: Decimal) -> BudgetExceededError:
        return BudgetExceededError(
            f"not sent: this request could cost up to {format_usd(worst)} and "
            f"{format_usd(max(self.remaining, Decimal(0)))} of the {format_usd(self.usd)} "
            f"budget is left ({format_usd(self.spent)} spent); run it again with a larger budget=, "
            "or a smaller max_tokens= (the worst case counts every answer as max_tokens long)",
        )

    def reserve(self, worst: Decimal) -> Decimal:
        """Reserve ``worst`` dollars now or raise :class:`BudgetExceededError`."""
        with self._lock:
            if worst > self.remaining:
                raise self._refusal(worst)
            self.reserved += worst
            return worst

    async def areserve(self, worst: Decimal, cancel: CancelToken | None = None) -> Decimal:
        """Reserve ``worst``, waiting while it does not fit but other requests are in flight (they
        usually cost less than they reserved); else raise :class:`BudgetExceededError`."""
        loop = asyncio.get_running_loop()
        while True:
            with self._lock:
                if worst <= self.remaining:
                    self.reserved += worst
                    return worst
                if self.reserved <= 0 or (cancel is not None and cancel.cancelled):
                    raise self._refusal(worst)
                waiter: asyncio.Future[None] = loop.create_future()
                self._waiters.append((loop, waiter))
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.shield(waiter), 0.5)

    def settle(self, reserved: Decimal, spent: Decimal | None) -> None:
        """A request that reserved ``reserved`` ended having cost ``spent`` (``None``: unknown,
        counted as what was reserved)."""
        with self._lock:
            self.reserved -= reserved
            self.spent += reserved if spent is None else spent
            waiters, self._waiters = self._waiters, []
        for loop, waiter in waiters:
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(_wake, waiter)

    def __repr__(self) -> str:
        return (f"Budget(usd={self.usd}, spent={self.spent}, reserved={self.reserved})")


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)
