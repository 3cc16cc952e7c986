"""A batch's progress bar: tqdm's widget in Jupyter, tqdm's text bar in a terminal, or nothing
(docs/batch.md, "Progress").
"""

from __future__ import annotations

import contextlib
import sys
import time
from typing import Any

from .result import Stats

__all__ = ["BatchProgress", "progress_mode"]


def _in_jupyter_kernel() -> bool:
    if "ipykernel" not in sys.modules:
        return False
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


def progress_mode(progress: bool | str | None) -> str:
    """``"notebook"``, ``"text"`` or ``"off"`` for the ``progress=`` argument."""
    if progress is False or progress == "off":
        return "off"
    if progress in ("notebook", "text"):
        return str(progress)
    if progress is not None and progress is not True:
        raise ValueError(f"progress must be True, False, None, 'text' or 'notebook', not {progress!r}")
    if _in_jupyter_kernel():
        return "notebook"
    if progress is True:
        return "text"
    isatty = getattr(sys.stderr, "isatty", None)
    return "text" if callable(isatty) and isatty() else "off"


def _eta(seconds: float) -> str:
    seconds = max(0, int(seconds + 0.5))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def _count(n: int) -> str:
    if n >= 1_000_000:
        return f"{n / 1_000_000:.1f}M"
    if n >= 10_000:
        return f"{n / 1000:.0f}k"
    if n >= 1000:
        return f"{n / 1000:.1f}k"
    return str(n)


def describe(stats: Stats) -> str:
    """The counters as one line: ok / failed / not sent / in flight, tokens, rows/s, ETA."""
    if stats.job:  # a deferred batch: the provider's jobs say where it is
        return f"{stats.job}; ok {stats.ok:,}" + (f", failed {stats.failed:,}" if stats.failed
                                                 else "")
    parts = [f"ok {stats.ok:,}"]
    if stats.failed:
        parts.append(f"failed {stats.failed:,}")
    if stats.not_sent:
        parts.append(f"not sent {stats.not_sent:,}")
    parts.append(f"in flight {stats.in_flight}")
    parts.append(f"{_count(stats.input_tokens + stats.output_tokens)} tokens")
    if stats.resumed:
        parts.append(f"{stats.resumed:,} from checkpoint")
    if stats.replayed:
        parts.append(f"{stats.replayed:,} replayed")
    if stats.rate_limited:
        parts.append(f"429×{stats.rate_limited}")
    if stats.first_sent is not None and stats.sent_done:
        rate = stats.sent_done / max(time.monotonic() - stats.first_sent, 1e-6)
        parts.append(f"{rate:.1f} rows/s")
        if stats.total is not None:
            left = stats.total - stats.finished
            if left > 0:
                parts.append(f"ETA {_eta(left / rate)}")
    return ", ".join(parts)


class BatchProgress:
    """One bar for one batch: :meth:`update` with the counters, :meth:`close` with the summary."""

    def __init__(self, mode: str, *, description: str = "batch") -> None:
        self.mode = mode
        self.description = description
        self._bar: Any = None
        self._handle: Any = None
        self._closed = False

    def _open(self, stats: Stats) -> None:
        # tqdm's own rate and ETA are left out: the counters (describe) have the ones that count
        # only rows actually sent
        bar_format = (
            "{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} [{elapsed}{postfix}]"
            if stats.total is not None else "{desc}: {n_fmt} rows [{elapsed}{postfix}]"
        )
        if self.mode == "notebook":
            try:
                from IPython.display import display
                from tqdm.notebook import tqdm as notebook_tqdm

                self._bar = notebook_tqdm(total=stats.total, desc=self.description,
                                          display=False, unit="row", leave=True,
                                          bar_format=bar_format)
                # the counters stay on one line: the bar gives way, not the text
                _label, gauge, counters = self._bar.container.children
                gauge.layout.flex = "1 1 auto"
                gauge.layout.min_width = "60px"
                counters.layout.flex = "0 0 auto"
                self._handle = display(self._bar.container, display_id=True)  # type: ignore[no-untyped-call]
                return
            except Exception:  # no ipywidgets in this kernel: the text bar instead
                self.mode = "text"
        from tqdm import tqdm

        self._bar = tqdm(
            total=stats.total, desc=self.description, unit="row", file=sys.stderr,
            dynamic_ncols=True, mininterval=0.1, bar_format=bar_format,
        )

    def update(self, stats: Stats) -> None:
        """Show the counters now."""
        if self.mode == "off" or self._closed:
            return
        if self._bar is None:
            self._open(stats)
        bar = self._bar
        if stats.total is not None and bar.total != stats.total:
            bar.total = stats.total
        bar.n = stats.finished
        bar.set_postfix_str(describe(stats), refresh=False)
        bar.refresh()

    def close(self, stats: Stats, summary: str) -> None:
        """Final counters; in Jupyter, replace the widget by the one-line ``summary``."""
        if self.mode == "off" or self._closed:
            return
        self.update(stats)  # opens the bar if no update did
        self._closed = True
        if self._handle is None:
            self._bar.close()
            return
        with contextlib.suppress(Exception):
            self._bar.close()
            self._handle.update({"text/plain": f"{self.description}: {summary}"}, raw=True)
