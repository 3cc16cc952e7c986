"""The clock deadlines read: :func:`time.monotonic`, unless a test put its own in its place.

Every deadline of a call and of a turn (:mod:`dispatch_nb.call_control`) asks :func:`monotonic`
for the time. A test that wants a deadline to pass at a known point — after the fifth token, while
a tool runs — installs a clock it moves itself (:class:`dispatch_nb.testing.ManualClock`) instead
of racing the machine's speed. The deadline's timer still runs on real time, so a test clock that
jumps past a deadline is noticed at the next check (between two tokens or chunks), not at once.
"""

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
