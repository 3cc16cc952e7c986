"""A batch's progress bar: tqdm's widget in an interactive Jupyter front end, one text line updated
in place in a notebook run nobody watches (nbclient, papermill), tqdm's text bar in a terminal, or
nothing (docs/batch.md, "Progress").
"""

from __future__ import annotations

import contextlib
import sys
import time
from typing import Any

from .result import Stats

__all__ = ["PROGRESS_MODES", "BatchProgress", "progress_mode"]

#: what ``progress=`` takes besides True / False / None
PROGRESS_MODES = ("notebook", "display", "text", "off")


def progress_mode(progress: bool | str | None) -> str:
    """``"notebook"``, ``"display"``, ``"text"`` or ``"off"`` for the ``progress=`` argument."""
    if progress is False or progress == "off":
        return "off"
    if progress in PROGRESS_MODES:
        return str(progress)
    if progress is not None and progress is not True:
        raise ValueError("progress must be True, False, None, 'text', 'display' or 'notebook', "
                         f"not {progress!r}")
    from ..frontend import current_shell, unattended

    shell = current_shell()
    if shell is not None:  # a kernel: a text line when nobody watches (widget state would be saved)
        return "display" if unattended(shell) else "notebook"
    if progress is True:
        return "text"
    isatty = getattr(sys.stderr, "isatty", None)
    return "text" if callable(isatty) and isatty() else "off"


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
    parts = [f"ok {stats.ok:,}"]
    parts += [f"{what} {n:,}" for what, n in (("failed", stats.failed),
              ("cancelled", stats.cancelled), ("not sent", stats.not_sent)) if n]
    if stats.job:  # a deferred batch: the provider's jobs say where it is
        return f"{stats.job}; " + ", ".join(parts)
    parts.append(f"in flight {stats.in_flight}")
    parts.append(f"{_count(stats.input_tokens + stats.output_tokens)} tokens")
    parts += [f"{n:,} {what}" for what, n in (("from checkpoint", stats.resumed),
              ("replayed", stats.replayed)) if n]
    if stats.rate_limited:
        parts.append(f"429×{stats.rate_limited}")
    if stats.first_sent is not None and stats.sent_done:
        rate = stats.sent_done / max(time.monotonic() - stats.first_sent, 1e-6)
        parts.append(f"{rate:.1f} rows/s")
        if stats.total is not None:
            left = stats.total - stats.finished
            if left > 0:
                from tqdm import tqdm

                parts.append(f"ETA {tqdm.format_interval(round(left / rate))}")
    return ", ".join(parts)


class BatchProgress:
    """One bar for one batch: :meth:`update` with the counters, :meth:`close` with the summary.
    In a notebook (``notebook`` and ``display``) the bar is one output, :attr:`output` (a display
    handle), which ends as the one-line summary: whoever shows the batch's result may put it
    there instead (``%%chat --each`` does: its table's footer is the same summary)."""

    def __init__(self, mode: str, *, description: str = "batch") -> None:
        self.mode = mode
        self.description = description
        self._bar: Any = None
        #: the notebook output the bar is shown in (None: none, or not yet)
        self.output: Any = None
        self._line = ""  # the display mode's line last shown
        self._format = ""  # tqdm's bar_format for this batch
        self._started = 0.0
        self._closed = False

    def _open(self, stats: Stats) -> None:
        # tqdm's own rate and ETA are left out: the counters (describe) have the ones that count
        # only rows actually sent
        self._format = bar_format = (
            "{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} [{elapsed}{postfix}]"
            if stats.total is not None else "{desc}: {n_fmt} rows [{elapsed}{postfix}]"
        )
        self._started = time.monotonic()
        if self.mode == "display":  # a text line, no widget: nothing of it outlives the output
            from ..frontend import current_shell

            if current_shell() is not None:
                from IPython.display import display

                self._line = self._text(stats)
                self.output = display({"text/plain": self._line}, raw=True, display_id=True)  # type: ignore[no-untyped-call]
                return
            self.mode = "text"  # no kernel to show the line in
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
                self.output = display(self._bar.container, display_id=True)  # type: ignore[no-untyped-call]
                return
            except Exception:  # no ipywidgets in this kernel: the text bar instead
                self.mode = "text"
        from tqdm import tqdm

        self._bar = tqdm(
            total=stats.total, desc=self.description, unit="row", file=sys.stderr,
            dynamic_ncols=True, mininterval=0.1, bar_format=bar_format,
        )

    def _text(self, stats: Stats) -> str:
        """The ``display`` mode's line: what tqdm's text bar shows."""
        from tqdm import tqdm

        return str(tqdm.format_meter(stats.finished - stats.not_sent, stats.total,
                                     time.monotonic() - self._started, ncols=80,
                                     prefix=self.description, unit="row",
                                     bar_format=self._format, postfix=describe(stats)))

    @property
    def shown(self) -> bool:
        """Whether the bar has been shown (it is, once the batch started a row or has news)."""
        return self.output is not None or self._bar is not None

    def update(self, stats: Stats) -> None:
        """Show the counters now (nothing before the first row starts, so that a batch refused
        before anything is sent shows no bar)."""
        if self.mode == "off" or self._closed:
            return
        if not self.shown:
            if stats.first_sent is None and not stats.in_flight and not stats.finished \
                    and not stats.job:
                return
            self._open(stats)
        if self.mode == "display":
            line = self._text(stats)
            if line != self._line:  # about once a second when nothing finished
                self._line = line
                self.output.update({"text/plain": line}, raw=True)
            return
        bar = self._bar
        if stats.total is not None and bar.total != stats.total:
            bar.total = stats.total
        bar.n = stats.finished - stats.not_sent  # rows never sent are not done: not 100%
        bar.set_postfix_str(describe(stats), refresh=False)
        bar.refresh()

    def close(self, stats: Stats, summary: str) -> None:
        """Final counters; in a notebook, replace the bar by the one-line ``summary``."""
        if self.mode == "off" or self._closed:
            return
        if not self.shown:
            self._open(stats)  # a batch with nothing to do still says so
        self.update(stats)
        self._closed = True
        if self.output is None:
            self._bar.close()
            return
        with contextlib.suppress(Exception):
            if self._bar is not None:
                self._bar.close()
            self.output.update({"text/plain": f"{self.description}: {summary}"}, raw=True)
