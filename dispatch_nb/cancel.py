"""Cancellation that works across threads and event loops: :class:`CancelToken`.

``token.cancel()`` from any thread stops every call made with ``cancel=token``, which raises
:class:`~dispatch_nb.errors.RequestCancelled` carrying what arrived so far in ``partial``.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable

from .errors import RequestCancelled

__all__ = ["CancelToken"]

logger = logging.getLogger("dispatch_nb")


class CancelToken:
    """A one-way switch: ``cancel()`` once, observed by every call that holds it."""

    __slots__ = ("_callbacks", "_event", "_lock", "reason")

    def __init__(self) -> None:
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._callbacks: list[Callable[[], None]] = []
        self.reason: str | None = None

    @property
    def cancelled(self) -> bool:
        """True once :meth:`cancel` has been called."""
        return self._event.is_set()

    def cancel(self, reason: str | None = None) -> None:
        """Cancel every call holding this token. Safe from any thread; idempotent."""
        with self._lock:
            if self._event.is_set():
                return
            self.reason = reason
            self._event.set()
            callbacks = list(self._callbacks)  # a remover may run during the loop below
            self._callbacks.clear()
        for callback in callbacks:
            try:
                callback()
            except Exception:  # a broken callback must not stop the others, nor go unseen
                logger.warning("a cancel callback (%r) raised; the cancel went on", callback,
                               exc_info=True)

    def add_callback(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Run ``callback`` on cancel (now, if already cancelled). Returns a function to remove it."""
        with self._lock:
            if not self._event.is_set():
                self._callbacks.append(callback)
                return remover(self._lock, self._callbacks, callback)
        callback()
        return lambda: None

    def wait(self, timeout: float | None = None) -> bool:
        """Block until cancelled or ``timeout`` seconds pass; True if cancelled."""
        return self._event.wait(timeout)

    def raise_if_cancelled(self) -> None:
        """Raise :class:`RequestCancelled` if the token has been cancelled."""
        if self._event.is_set():
            raise RequestCancelled(self.reason or "the request was cancelled")

    def __repr__(self) -> str:
        return f"CancelToken(cancelled={self.cancelled})"


def remover(lock: threading.Lock, callbacks: list[Callable[[], None]],
            callback: Callable[[], None]) -> Callable[[], None]:
    """A function that takes ``callback`` out of ``callbacks`` (under ``lock``); idempotent."""

    def remove() -> None:
        with lock, contextlib.suppress(ValueError):
            callbacks.remove(callback)

    return remove
