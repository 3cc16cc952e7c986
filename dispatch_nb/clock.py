"""The clock deadlines read: :func:`time.monotonic`, unless a test put its own in its place
(:class:`dispatch_nb.testing.ManualClock`; docs/testing.md)."""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["monotonic", "set_clock"]

_source: Callable[[], float] = time.monotonic


def monotonic() -> float:
    """Seconds on the library's clock (:func:`time.monotonic` unless a test set another)."""
    return _source()


def set_clock(source: Callable[[], float] | None) -> Callable[[], float]:
    """Make ``source`` the clock deadlines read (``None``: the real one again); returns the clock
    it replaced, to put back afterwards."""
    global _source
    previous, _source = _source, source or time.monotonic
    return previous
