"""The live view of a streaming answer, and its fallbacks.

Three renderings, picked by :func:`detect_mode` (``%config ChatMagics.live = "auto"`` (default),
``"widget"``, ``"display"`` or ``"text"``; the environment variable ``DISPATCH_NB_LIVE`` sets the
default):

``widget``  (a kernel with ipywidgets: JupyterLab, Notebook 7, VS Code, Colab)
    A small widget tree: a header (model, state), the text, thinking in a collapsed accordion, one
    line per tool call (updated when its result arrives), and a footer.
``display`` (a kernel without ipywidgets)
    ``display_id`` outputs updated in place: a status line (state, tool calls, thinking size) and
    the text.
``text``    (terminal IPython, or no kernel)
    The text printed as it arrives, then a footer line.

**Bytes on the wire grow linearly with the answer.** Neither widgets nor ``display_id`` outputs can
append: every update re-sends the whole value. So the text is cut into *segments* of at most
:data:`SEGMENT_CHARS` characters, each its own widget / display output; an update re-sends only the
segment still growing. Updates are coalesced by a :class:`Pacer`: the first text is shown at once,
later ones at most ``rate`` times per second (20 by default). So an answer of N characters costs
about N·(segment/2)/(chars per update) bytes — linear in N — instead of the N²/2 of re-sending
everything on every delta.

When the answer is complete, :meth:`LiveView.finish` replaces the live view with ONE static
output (see ``display.final_output``): the widget's output is updated in place to plain
``text/markdown`` + ``text/plain`` and the widgets are closed, so no widget state is left in the
saved notebook; the ``display`` rendering clears its outputs and displays the final one.

Every method runs on the kernel's main thread (the runner hands events over), never from a
background thread.
"""

from __future__ import annotations

import html
import os
import sys
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .display import FinalOutput, ToolPart

__all__ = [
    "MODES",
    "SEGMENT_CHARS",
    "DisplayView",
    "LiveView",
    "Pacer",
    "TextView",
    "WidgetView",
    "detect_mode",
    "make_view",
]

MODES = ("auto", "widget", "display", "text")
LIVE_ENV = "DISPATCH_NB_LIVE"
#: the most characters one live segment (widget or display output) holds
SEGMENT_CHARS = 600
#: the most segments one block (a VBox) of the widget view holds
BLOCK_SEGMENTS = 16
DEFAULT_RATE = 20.0

_TEXT_STYLE = (
    "white-space: pre-wrap; word-break: break-word; margin: 0; line-height: 1.45; "
    "font-family: var(--jp-content-font-family, var(--vscode-font-family, sans-serif));"
)
_DIM = "color: var(--jp-ui-font-color2, #777); font-size: 0.85em;"
#: sent once per view, so each streamed segment update carries only ``<div class=...>text</div>``
_CSS = (
    "<style>.dnb-text{" + _TEXT_STYLE + "}.dnb-thinking{" + _TEXT_STYLE + _DIM + "}</style>"
)


def ipy_display(obj: Any, **kwargs: Any) -> Any:
    """``IPython.display.display`` (typed for this package)."""
    from IPython.display import display

    return display(obj, **kwargs)  # type: ignore[no-untyped-call]


def ipy_clear_output(wait: bool = False) -> None:
    """``IPython.display.clear_output``."""
    from IPython.display import clear_output

    clear_output(wait=wait)  # type: ignore[no-untyped-call]


def default_mode() -> str:
    """``$DISPATCH_NB_LIVE`` when it names a mode, else ``auto``."""
    value = os.environ.get(LIVE_ENV, "").strip().lower()
    return value if value in MODES else "auto"


def has_kernel(shell: Any) -> bool:
    """True inside a Jupyter kernel (ipykernel), False in terminal IPython or a bare shell."""
    return getattr(shell, "kernel", None) is not None


def widgets_available() -> bool:
    """True when ipywidgets can be imported."""
    try:
        import ipywidgets  # noqa: F401
    except ImportError:
        return False
    return True


def detect_mode(shell: Any, requested: str = "auto") -> str:
    """The rendering to use: ``requested`` unless ``auto`` (or impossible), else the best one.

    ``auto`` → ``widget`` inside a kernel whose environment has ipywidgets, ``display`` inside a
    kernel without, ``text`` without a kernel. ``widget`` without ipywidgets falls back to
    ``display``; ``display``/``widget`` without a kernel stay as asked (useful in tests).
    """
    requested = (requested or "auto").lower()
    if requested not in MODES:
        raise ValueError(f"live mode must be one of {', '.join(MODES)}, not {requested!r}")
    if requested == "auto":
        if not has_kernel(shell):
            return "text"
        return "widget" if widgets_available() else "display"
    if requested == "widget" and not widgets_available():
        return "display"
    return requested


class Pacer:
    """At most ``rate`` updates per second; the first one at once."""

    def __init__(self, rate: float = DEFAULT_RATE) -> None:
        self.interval = 1.0 / rate if rate > 0 else 0.0
        self.last: float | None = None
        self.updates = 0

    def wait(self, now: float) -> float:
        """Seconds until the next update is allowed (``0``: now)."""
        if self.last is None:
            return 0.0
        return max(0.0, self.last + self.interval - now)

    def mark(self, now: float) -> None:
        """Record an update made at ``now``."""
        self.last = now
        self.updates += 1


class _Segments:
    """Text cut into chunks of at most ``limit`` characters; tracks which chunks changed."""

    __slots__ = ("chunks", "dirty", "limit")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.chunks: list[list[str]] = []
        self.dirty: set[int] = set()

    def _room(self) -> int:
        if not self.chunks:
            return 0
        return self.limit - sum(len(p) for p in self.chunks[-1])

    def add(self, text: str) -> list[int]:
        """Append ``text``; returns the indexes of chunks it created."""
        created: list[int] = []
        while text:
            room = self._room()
            if room <= 0:
                self.chunks.append([])
                created.append(len(self.chunks) - 1)
                room = self.limit
            piece, text = text[:room], text[room:]
            self.chunks[-1].append(piece)
            self.dirty.add(len(self.chunks) - 1)
        return created

    def text(self, index: int) -> str:
        return "".join(self.chunks[index])

    def take_dirty(self) -> list[int]:
        dirty = sorted(self.dirty)
        self.dirty.clear()
        return dirty


def _tool_html(part: ToolPart) -> str:
    from .display import tool_line

    icon = "⏳" if part.result is None else ("⚠️" if part.is_error else "🔧")
    took = f" <span style='{_DIM}'>{part.duration:.2f} s</span>" if part.duration else ""
    return (
        f"<div style='{_TEXT_STYLE} font-family: var(--jp-code-font-family, monospace); "
        f"font-size: 0.9em;'>{icon} {html.escape(tool_line(part, 300))}{took}</div>"
    )


def _status_html(title: str, state: str) -> str:
    return f"<div style='{_DIM}'><b>{html.escape(title)}</b> · {html.escape(state)}</div>"


class LiveView:
    """What every rendering offers; the runner drives it from the kernel's main thread.

    ``titles`` are the columns (one per model; compare mode has several).
    """

    mode = "base"

    def __init__(self, titles: list[str], *, rate: float = DEFAULT_RATE) -> None:
        from .display import Transcript

        self.titles = titles
        self.pacer = Pacer(rate)
        self.transcripts = [Transcript(t) for t in titles]
        self.states = ["waiting for the first token…" for _ in titles]
        self.dirty = False
        self.text_shown = False
        self.notes: list[str] = []
        self.finished = False

    @property
    def compare(self) -> bool:
        """True when several models stream side by side."""
        return len(self.titles) > 1

    # -- driven by the runner ---------------------------------------------------------------------
    def start(self, notes: list[str] | None = None) -> None:
        """Show the (empty) live view; ``notes`` are shown above it (interpolation notes)."""
        self.notes = list(notes or [])

    def feed(self, index: int, event: Any) -> None:
        """Take one event of column ``index`` (buffered until the next flush)."""
        self.transcripts[index].feed(event)
        if self.states[index] != "streaming…":
            self.states[index] = "streaming…"
        self._feed(index, event)
        self.dirty = True

    def tick(self) -> float | None:
        """Flush if due; seconds until the next flush is due (None: nothing pending)."""
        if not self.dirty:
            return None
        now = time.monotonic()
        wait = self.pacer.wait(now)
        if wait > 0 and not self.text_shown and self._has_text():
            wait = 0.0  # the first text is shown at once
        if wait > 0:
            return wait
        self._flush()
        self.dirty = False
        if self._has_text():
            self.text_shown = True
        self.pacer.mark(now)
        return None

    def job_done(self, index: int, footer: str, error: str | None = None) -> None:
        """Column ``index`` finished: show its footer (compare mode shows each as it ends)."""
        self.states[index] = ("⚠ " + error) if error else "done"
        self._job_done(index, footer, error)
        self.dirty = True

    def finish(self, final: FinalOutput) -> None:
        """Replace the live view with the one static ``final`` output."""
        if self.dirty:
            self._flush()
            self.dirty = False
        self.finished = True
        self._finish(final)

    def close(self) -> None:
        """Release resources if the cell stops early (unexpected error)."""

    # -- what a rendering supplies -------------------------------------------------------------------
    def _has_text(self) -> bool:
        return any(t.has_text for t in self.transcripts)

    def _feed(self, index: int, event: Any) -> None:
        pass

    def _flush(self) -> None:
        pass

    def _job_done(self, index: int, footer: str, error: str | None) -> None:
        pass

    def _finish(self, final: FinalOutput) -> None:
        pass


# ------------------------------------------------------------------------------------------------
# widget


class _Run:
    """A stretch of one kind of text (answer or thinking) as widgets: segments of at most
    ``segment_chars`` characters, grouped in blocks of at most :data:`BLOCK_SEGMENTS`, so no
    update ever re-sends more than one segment's text or one block's list of children."""

    def __init__(self, kind: str, segment_chars: int, inner: Any = None) -> None:
        self.kind = kind
        self.segments = _Segments(segment_chars)
        self.widgets: list[Any] = []
        self.blocks: list[Any] = []
        self.dirty_blocks: set[int] = set()
        self.inner = inner  # the accordion's box for thinking; None: blocks go in the body
        self.inner_dirty = False


class _WidgetColumn:
    """One model's live view as ipywidgets: header, body (text / thinking / tool parts), footer."""

    def __init__(self, widgets: Any, title: str, segment_chars: int, width: str | None) -> None:
        from ipywidgets.widgets.widget_string import HTMLStyle

        self.w = widgets
        self.title = title
        self.segment_chars = segment_chars
        self.created: list[Any] = []
        self.header = self._make(
            widgets.HTML, value=_CSS + _status_html(title, "waiting for the first token…")
        )
        # Segments share one layout and one style model: one comm per segment, not three.
        self.segment_layout = self._make(widgets.Layout, margin="0")
        self.segment_style = self._make(HTMLStyle)
        self.body = self._make(widgets.VBox, children=())
        self.footer = self._make(widgets.HTML, value="")
        layout = {"width": width, "padding": "0 6px"} if width else {}
        self.box = self._make(
            widgets.VBox, children=(self.header, self.body, self.footer), layout=layout
        )
        self.parts: list[Any] = []
        self.parts_dirty = False
        self.runs: list[_Run] = []
        self.current: _Run | None = None
        self.accordions: list[Any] = []
        self.tools: dict[str, tuple[Any, ToolPart]] = {}
        self.dirty_tools: set[str] = set()
        self.state = "waiting for the first token…"
        self.state_dirty = False

    def _make(self, cls: Any, **kw: Any) -> Any:
        widget = cls(**kw)
        self.created.append(widget)
        return widget

    def set_state(self, state: str) -> None:
        if state != self.state:
            self.state = state
            self.state_dirty = True

    def _open(self, kind: str) -> _Run:
        if self.current is not None and self.current.kind == kind:
            return self.current
        inner = None
        if kind == "thinking":
            inner = self._make(self.w.VBox, children=())
            accordion = self._make(self.w.Accordion, children=(inner,), selected_index=None)
            accordion.set_title(0, "Thinking…")
            self.accordions.append(accordion)
            self.parts.append(accordion)
            self.parts_dirty = True
        run = _Run(kind, self.segment_chars, inner)
        self.runs.append(run)
        self.current = run
        return run

    def add_text(self, kind: str, text: str) -> None:
        run = self._open(kind)
        for _ in run.segments.add(text):
            segment = self._make(
                self.w.HTML, value="", layout=self.segment_layout, style=self.segment_style
            )
            run.widgets.append(segment)
            if not run.blocks or len(run.blocks[-1]._dnb_children) >= BLOCK_SEGMENTS:
                block = self._make(self.w.VBox, children=(), layout=self.segment_layout)
                block._dnb_children = []
                run.blocks.append(block)
                if run.inner is None:
                    self.parts.append(block)
                    self.parts_dirty = True
                else:
                    run.inner_dirty = True
            run.blocks[-1]._dnb_children.append(segment)
            run.dirty_blocks.add(len(run.blocks) - 1)

    def tool_started(self, part: ToolPart) -> None:
        self.current = None
        line = self._make(self.w.HTML, value=_tool_html(part))
        self.tools[part.id] = (line, part)
        self.parts.append(line)
        self.parts_dirty = True

    def tool_changed(self, tool_id: str) -> None:
        if tool_id in self.tools:
            self.dirty_tools.add(tool_id)

    def flush(self) -> None:
        for run in self.runs:
            css = "dnb-text" if run.kind == "text" else "dnb-thinking"
            for i in run.segments.take_dirty():
                text = html.escape(run.segments.text(i))
                run.widgets[i].value = f"<div class='{css}'>{text}</div>"
            for b in sorted(run.dirty_blocks):
                block = run.blocks[b]
                block.children = tuple(block._dnb_children)
            run.dirty_blocks.clear()
            if run.inner_dirty:
                run.inner.children = tuple(run.blocks)
                run.inner_dirty = False
        for tool_id in sorted(self.dirty_tools):
            line, part = self.tools[tool_id]
            line.value = _tool_html(part)
        self.dirty_tools.clear()
        if self.parts_dirty:
            self.body.children = tuple(self.parts)
            self.parts_dirty = False
        if self.state_dirty:
            self.header.value = _CSS + _status_html(self.title, self.state)
            self.state_dirty = False

    def done(self, footer: str, error: str | None) -> None:
        for accordion in self.accordions:
            accordion.set_title(0, "Thinking")
        self.set_state("⚠ " + error if error else "done")
        self.footer.value = f"<div style='{_DIM}'>{html.escape(footer)}</div>"

    def close(self) -> None:
        for widget in reversed(self.created):
            try:
                widget.close()
            except Exception:
                pass
        self.created.clear()


class WidgetView(LiveView):
    """The ipywidgets rendering (see the module docstring)."""

    mode = "widget"

    def __init__(
        self, titles: list[str], *, rate: float = DEFAULT_RATE, segment_chars: int = SEGMENT_CHARS
    ) -> None:
        super().__init__(titles, rate=rate)
        self.segment_chars = segment_chars
        self.columns: list[_WidgetColumn] = []
        self.root: Any = None
        self.handle: Any = None
        self._extra: list[Any] = []

    def start(self, notes: list[str] | None = None) -> None:
        super().start(notes)
        import ipywidgets as widgets
        width = f"{100 / len(self.titles):.2f}%" if self.compare else None
        self.columns = [_WidgetColumn(widgets, t, self.segment_chars, width) for t in self.titles]
        children: list[Any] = []
        if self.notes:
            note = widgets.HTML(
                value="".join(f"<div style='{_DIM}'>ℹ {html.escape(n)}</div>" for n in self.notes)
            )
            self._extra.append(note)
            children.append(note)
        if self.compare:
            row = widgets.HBox([c.box for c in self.columns], layout={"width": "100%"})
            self._extra.append(row)
            children.append(row)
        else:
            children.append(self.columns[0].box)
        self.root = widgets.VBox(children)
        self._extra.append(self.root)
        self.handle = ipy_display(self.root, display_id=True)

    def _feed(self, index: int, event: Any) -> None:
        column = self.columns[index]
        column.set_state("streaming…")
        kind = getattr(event, "type", None)
        if kind == "text_delta":
            column.add_text("text", event.text or "")
        elif kind == "thinking_delta":
            column.add_text("thinking", event.text or "")
        elif kind == "tool_use_start":
            transcript = self.transcripts[index]
            column.tool_started(transcript.tools[-1])
        elif kind in ("tool_use_end", "tool_use_delta"):
            column.tool_changed(event.tool_call_id or "")
        elif kind == "tool_result":
            column.tool_changed(event.result.tool_use_id)
            column.current = None

    def _flush(self) -> None:
        for column in self.columns:
            column.flush()

    def _job_done(self, index: int, footer: str, error: str | None) -> None:
        self.columns[index].done(footer, error)

    def _finish(self, final: FinalOutput) -> None:
        if self.handle is not None:
            self.handle.update(final.data, metadata=final.metadata, raw=True)
        self.close()

    def close(self) -> None:
        for column in self.columns:
            column.close()
        for widget in self._extra:
            try:
                widget.close()
            except Exception:
                pass
        self._extra.clear()


# ------------------------------------------------------------------------------------------------
# display


class DisplayView(LiveView):
    """The ``display_id`` rendering: a status output plus text segments (one model), or one HTML
    table re-rendered at most ``compare_rate`` times per second (compare mode)."""

    mode = "display"

    def __init__(
        self,
        titles: list[str],
        *,
        rate: float = DEFAULT_RATE,
        segment_chars: int = SEGMENT_CHARS,
        compare_rate: float = 10.0,
    ) -> None:
        super().__init__(titles, rate=rate if len(titles) == 1 else min(rate, compare_rate))
        self.segments = _Segments(segment_chars)
        self.segment_handles: list[Any] = []
        self.status_handle: Any = None
        self.table_handle: Any = None
        self.status_dirty = True
        self.footers = ["" for _ in titles]

    def _status_markdown(self) -> str:
        lines = [f"<sub>**{html.escape(self.titles[0])}** · {self.states[0]}"]
        transcript = self.transcripts[0]
        thinking = transcript.thinking
        if thinking:
            lines[0] += f" · 💭 thinking ({len(thinking):,} characters)"
        lines[0] += "</sub>"
        for note in self.notes:
            lines.append(f"<sub>ℹ {html.escape(note)}</sub>")
        from .display import tool_markdown

        for tool in transcript.tools:
            lines.append(tool_markdown(tool).rstrip())
        return "\n\n".join(lines)

    def _table_html(self) -> str:
        cells = []
        head = []
        for i, title in enumerate(self.titles):
            head.append(
                f"<th style='text-align:left'>{html.escape(title)}"
                f"<div style='{_DIM}'>{html.escape(self.footers[i] or self.states[i])}</div></th>"
            )
            cells.append(
                f"<td style='vertical-align:top; text-align:left'><div style='{_TEXT_STYLE}'>"
                f"{html.escape(self.transcripts[i].plain())}</div></td>"
            )
        return (
            "<table style='width:100%; table-layout:fixed'><tr>"
            + "".join(head)
            + "</tr><tr>"
            + "".join(cells)
            + "</tr></table>"
        )

    def start(self, notes: list[str] | None = None) -> None:
        super().start(notes)
        if self.compare:
            self.table_handle = ipy_display(
                {"text/html": self._table_html(), "text/plain": "streaming…"},
                raw=True,
                display_id=True,
            )
        else:
            self.status_handle = ipy_display(
                {"text/markdown": self._status_markdown(), "text/plain": self.titles[0]},
                raw=True,
                display_id=True,
            )
            self.status_dirty = False

    def _feed(self, index: int, event: Any) -> None:
        if self.compare:
            return
        kind = getattr(event, "type", None)
        if kind == "text_delta":
            self.segments.add(event.text or "")
            if self.states[0] == "streaming…" and not self.text_shown:
                self.status_dirty = True
        else:
            self.status_dirty = True

    def _flush(self) -> None:
        if self.compare:
            self.table_handle.update(
                {"text/html": self._table_html(), "text/plain": "streaming…"}, raw=True
            )
            return
        if self.status_dirty:
            self.status_handle.update(
                {"text/markdown": self._status_markdown(), "text/plain": self.titles[0]}, raw=True
            )
            self.status_dirty = False
        for i in self.segments.take_dirty():
            data = {"text/plain": self.segments.text(i)}
            if i < len(self.segment_handles):
                self.segment_handles[i].update(data, raw=True)
            else:
                self.segment_handles.append(ipy_display(data, raw=True, display_id=True))

    def _job_done(self, index: int, footer: str, error: str | None) -> None:
        self.footers[index] = footer + (f" · ⚠ {error}" if error else "")
        self.status_dirty = True

    def _finish(self, final: FinalOutput) -> None:
        ipy_clear_output(wait=True)
        ipy_display(final.data, metadata=final.metadata, raw=True)


# ------------------------------------------------------------------------------------------------
# text


class TextView(LiveView):
    """Plain streamed text (terminal IPython). Compare mode prints each answer as it completes."""

    mode = "text"

    def __init__(self, titles: list[str], *, rate: float = DEFAULT_RATE, in_kernel: bool = False):
        super().__init__(titles, rate=rate)
        self.in_kernel = in_kernel
        self.pending: list[str] = []
        self.thinking_said = False
        self.at_line_start = True

    def _write(self, text: str) -> None:
        if not text:
            return
        sys.stdout.write(text)
        sys.stdout.flush()
        self.at_line_start = text.endswith("\n")

    def start(self, notes: list[str] | None = None) -> None:
        super().start(notes)
        for note in self.notes:
            self._write(f"ℹ {note}\n")

    def _feed(self, index: int, event: Any) -> None:
        if self.compare:
            return
        from .display import tool_line

        kind = getattr(event, "type", None)
        if kind == "text_delta":
            self.pending.append(event.text or "")
        elif kind == "thinking_delta" and not self.thinking_said:
            self.thinking_said = True
            self.pending.append("💭 thinking…\n")
        elif kind == "tool_use_end":
            tool = self.transcripts[0].tools[-1] if self.transcripts[0].tools else None
            if tool is not None:
                prefix = "" if self.at_line_start and not self.pending else "\n"
                self.pending.append(f"{prefix}🔧 {tool_line(tool)}\n")
        elif kind == "tool_result":
            for tool in self.transcripts[0].tools:
                if tool.id == event.result.tool_use_id:
                    arrow = "⚠" if tool.is_error else "→"
                    self.pending.append(f"   {arrow} {(tool.result or '')[:300]}\n")

    def _flush(self) -> None:
        if self.pending:
            self._write("".join(self.pending))
            self.pending.clear()

    def _has_text(self) -> bool:
        return bool(self.pending) or super()._has_text()

    def _job_done(self, index: int, footer: str, error: str | None) -> None:
        if not self.compare:
            return
        transcript = self.transcripts[index]
        self._write(f"\n== {self.titles[index]} ==\n{transcript.plain()}\n")
        self._write(f"[{footer}{' · ⚠ ' + error if error else ''}]\n")

    def _finish(self, final: FinalOutput) -> None:
        if self.in_kernel:
            ipy_clear_output(wait=True)
            ipy_display(final.data, metadata=final.metadata, raw=True)
            return
        if not self.compare:
            footer = final.metadata.get("dispatch_nb", {}).get("footer", "")
            if not self.at_line_start:
                self._write("\n")
            if final.terminal is not None:
                self._write(final.terminal.rstrip("\n") + "\n")
            if footer:
                self._write(f"[{footer}]\n")


def make_view(
    mode: str, titles: list[str], *, rate: float = DEFAULT_RATE, in_kernel: bool = False
) -> LiveView:
    """The live view for ``mode`` (``widget`` / ``display`` / ``text``)."""
    if mode == "widget":
        return WidgetView(titles, rate=rate)
    if mode == "display":
        return DisplayView(titles, rate=rate)
    if mode == "text":
        return TextView(titles, rate=rate, in_kernel=in_kernel)
    raise ValueError(f"unknown live mode {mode!r}")
