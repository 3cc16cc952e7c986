"""The live view of a streaming answer, and its fallbacks.

Three renderings, picked by :func:`detect_mode` (``%config ChatMagics.live = "auto"`` (default),
``"widget"``, ``"display"`` or ``"text"``; the environment variable ``DISPATCH_NB_LIVE`` sets the
default):

``widget``  (a kernel with ipywidgets: JupyterLab, Notebook 7, VS Code, Colab)
    A small widget tree: the answer as rendered Markdown, thinking in a collapsed accordion, one
    line per tool call (updated when its result arrives), and a status line at the bottom that
    becomes the footer.
``display`` (a kernel without ipywidgets)
    ``display_id`` outputs updated in place: the answer as rendered Markdown, one output per
    block, the last one ending with the status line.
``text``    (terminal IPython, or no kernel)
    The text printed as it arrives, then a footer line.

**Rendered Markdown from the first token, bytes linear in the answer.** Neither widgets nor
``display_id`` outputs can append: every update re-sends the whole value. So the answer is cut
into Markdown blocks (:mod:`~dispatch_nb.notebook.blocks`): each finished block is its own output
(an ``Output`` widget, or a ``display_id`` output) holding ``text/markdown`` that the front end
renders — with the same renderer as the final output, math and code highlighting included — and
is never sent again; only the block still growing is re-sent, and it never exceeds
:data:`~dispatch_nb.notebook.blocks.BLOCK_LIMIT` characters (a longer block is cut where no word
is split). Updates are coalesced by a :class:`Pacer`: the first text is shown at once, later ones
at most ``rate`` times per second (20 by default). So an answer of N characters costs about
N·(block/2)/(characters per update) bytes — linear in N — instead of the N²/2 of re-sending
everything on every delta. What a growing block shows is its :func:`stable_prefix`, so text once
shown is never taken back, and the status line sits *below* the answer where the footer will be:
when the answer is complete nothing above it moves.

When the answer is complete, :meth:`LiveView.finish` replaces the live view with ONE static
output (see ``display.final_output``): the widget's output is updated in place to plain
``text/markdown`` + ``text/plain`` and the widgets are closed, so no widget state is left in the
saved notebook; the ``display`` rendering clears its outputs and displays the final one.

Every method runs on the kernel's main thread (the runner hands events over), never from a
background thread.
"""

from __future__ import annotations

import html
import sys
import time
from typing import TYPE_CHECKING, Any

from .blocks import Block, MarkdownBlocks, stable_prefix, warm_up

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
#: the most characters one live thinking segment holds
SEGMENT_CHARS = 600
#: the most segments (or Markdown blocks) one box of the widget view holds
BLOCK_SEGMENTS = 16
DEFAULT_RATE = 20.0

_TEXT_STYLE = (
    "white-space: pre-wrap; word-break: break-word; margin: 0; line-height: 1.45; "
    "font-family: var(--jp-content-font-family, var(--vscode-font-family, sans-serif));"
)
_DIM = "color: var(--jp-ui-font-color2, #777); font-size: 0.85em;"
#: the live view's own styles (sent with the status line): the answer's Markdown blocks sit
#: one after the other exactly like the elements of the final output, which is ONE Markdown
#: output — so nothing moves when it replaces them. The blocks and the boxes grouping them are
#: plain block boxes (no flex, no scrolling container), so the margins of two neighbouring
#: blocks collapse as those of two elements of one output do; and a block's first and last
#: elements keep their ordinary margins (JupyterLab halves a heading's margin at the edge of an
#: output and shrinks the last element's), except at the top of the answer. A block cut in
#: pieces reads as one (a continued table hides its repeated header, a continued code block its
#: seam).
_HEADINGS = ",".join(f"h{n}" for n in range(1, 7))
_CSS = (
    "<style>"
    ".dnb-thinking{" + _TEXT_STYLE + _DIM + "}"
    ".dnb-live .widget-output,.dnb-live .dnb-md{margin:0;padding:0;}"
    ".dnb-live.dnb-flow,.dnb-live .dnb-flow{display:block;overflow:visible;}"
    ".dnb-live .dnb-md .jp-OutputArea{overflow:visible;}"
    ".dnb-live .dnb-md .jp-OutputArea-child{display:block;overflow:visible;margin:0;padding:0;}"
    ".dnb-live .dnb-md .jp-OutputArea-prompt{display:none;}"
    ".dnb-live .dnb-md .jp-OutputArea-output{padding-top:0;padding-bottom:0;overflow:visible;}"
    ".dnb-live .dnb-md .jp-RenderedMarkdown > :last-child{margin-bottom:1em;}"
    ".dnb-live .dnb-md .jp-RenderedMarkdown > pre:last-child{margin-bottom:1.5em;}"
    f".dnb-live .dnb-md .jp-RenderedMarkdown > :is({_HEADINGS}):last-child"
    "{margin-bottom:var(--jp-content-heading-margin-bottom);}"
    f".dnb-live .dnb-next .jp-RenderedMarkdown > :is({_HEADINGS}):first-child"
    "{margin-top:var(--jp-content-heading-margin-top);}"
    ".dnb-live .dnb-hide-header thead{visibility:collapse;}"
    ".dnb-live .dnb-has-cont pre,.dnb-live .dnb-has-cont table{margin-bottom:0;}"
    ".dnb-live .dnb-cont pre,.dnb-live .dnb-cont table{margin-top:0;}"
    ".dnb-live .dnb-has-cont .jp-RenderedMarkdown > :last-child{margin-bottom:0;}"
    ".dnb-live .dnb-cont .jp-RenderedMarkdown > :first-child{margin-top:0;}"
    "</style>"
)


def ipy_display(obj: Any, **kwargs: Any) -> Any:
    """``IPython.display.display`` (typed for this package)."""
    from IPython.display import display

    return display(obj, **kwargs)  # type: ignore[no-untyped-call]


def ipy_clear_output(wait: bool = False) -> None:
    """``IPython.display.clear_output``."""
    from IPython.display import clear_output

    clear_output(wait=wait)  # type: ignore[no-untyped-call]


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
    """Text cut into chunks of at most ``limit`` characters, never inside a word (a chunk ends at
    a space when it can); tracks which chunks changed."""

    __slots__ = ("chunks", "dirty", "limit")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.chunks: list[str] = []
        self.dirty: set[int] = set()

    def add(self, text: str) -> list[int]:
        """Append ``text``; returns the indexes of chunks it created."""
        created: list[int] = []
        if not text:
            return created
        if not self.chunks:
            self.chunks.append("")
            created.append(0)
        last = self.chunks[-1] + text
        while len(last) > self.limit:
            window = last[: self.limit]
            cut = max(window.rfind(" "), window.rfind("\n"))
            cut = cut + 1 if cut >= self.limit // 2 else self.limit
            self.chunks[-1] = last[:cut]
            self.dirty.add(len(self.chunks) - 1)
            last = last[cut:]
            self.chunks.append("")
            created.append(len(self.chunks) - 1)
        self.chunks[-1] = last
        self.dirty.add(len(self.chunks) - 1)
        return created

    def text(self, index: int) -> str:
        return self.chunks[index]

    def take_dirty(self) -> list[int]:
        dirty = sorted(self.dirty)
        self.dirty.clear()
        return dirty


def _tool_html(part: ToolPart) -> str:
    from .display import tool_line

    icon = "⏳" if part.result is None else ("⚠️" if part.is_error else "🔧")
    icon = "⏹" if part.abandoned else icon
    took = f" <span style='{_DIM}'>{part.duration:.2f} s</span>" if part.duration else ""
    return (
        f"<div style='{_TEXT_STYLE} font-family: var(--jp-code-font-family, monospace); "
        f"font-size: 0.9em;'>{icon} {html.escape(tool_line(part, 300))}{took}</div>"
    )


def _status_html(title: str, state: str) -> str:
    """The status line (``title`` in bold, unless empty: a compare column has its own header)."""
    named = f"<b>{html.escape(title)}</b> · " if title else ""
    return f"{_CSS}<div class='dnb-status' style='{_DIM}'>{named}{html.escape(state)}</div>"


def _markdown_bundle(markdown: str) -> dict[str, Any]:
    return {"output_type": "display_data", "data": {"text/markdown": markdown}, "metadata": {}}


def retry_state(event: Any) -> str:
    """The quiet status line of a retry: ``↻ rate limited, HTTP 429 — retrying in 2 s``."""
    wait = f"in {event.wait:.0f} s" if event.wait >= 1 else "now"
    return f"↻ {event.reason} — retrying {wait}"


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
        self.ended = [False for _ in titles]
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
        if self.mode in ("widget", "display"):
            warm_up()  # the Markdown parser loads while the request is on its way

    def feed(self, index: int, event: Any) -> None:
        """Take one event of column ``index`` (buffered until the next flush)."""
        self.transcripts[index].feed(event)
        kind = getattr(event, "type", None)
        state = retry_state(event) if kind == "retry" else "streaming…"
        if self.states[index] != state:
            self.states[index] = state
            self._state_changed(index)
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
        self.pacer.mark(time.monotonic())  # the next update waits from the end of this one
        return None

    def job_done(self, index: int, footer: str, error: str | None = None) -> None:
        """Column ``index`` finished: show its footer (compare mode shows each as it ends)."""
        self.ended[index] = True
        self.states[index] = ("⚠ " + error) if error else "done"
        self._job_done(index, footer, error)
        self.dirty = True

    def interrupt(self) -> None:
        """Ctrl-C: say so at once in every column still running (what arrived stays)."""
        for index, ended in enumerate(self.ended):
            if not ended:
                self.states[index] = "⏹ interrupted"
                self._state_changed(index)
        self.dirty = True
        self._flush()
        self.dirty = False

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

    def _state_changed(self, index: int) -> None:
        pass

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
    """A stretch of thinking as widgets: segments of at most ``segment_chars`` characters,
    grouped in blocks of at most :data:`BLOCK_SEGMENTS`, so no update ever re-sends more than
    one segment's text or one block's list of children."""

    kind = "thinking"

    def __init__(self, segment_chars: int, inner: Any) -> None:
        self.segments = _Segments(segment_chars)
        self.widgets: list[Any] = []
        self.blocks: list[Any] = []
        self.dirty_blocks: set[int] = set()
        self.inner = inner  # the accordion's box
        self.inner_dirty = False


class _MarkdownRun:
    """A stretch of answer text as rendered Markdown: one ``Output`` widget per block (see the
    module docstring), grouped in boxes of at most :data:`BLOCK_SEGMENTS`."""

    kind = "text"

    def __init__(self, column: _WidgetColumn, limit: int) -> None:
        self.column = column
        self.blocks = MarkdownBlocks(limit)
        self.outputs: list[Any] = []
        self.current: Any = None  # the Output showing the block still growing
        self.shown = ""
        self.dirty = False

    def add(self, text: str) -> None:
        self.blocks.feed(text)
        self.dirty = True

    def _output_for(self, block: Block) -> Any:
        if self.current is not None:
            return self.current
        column = self.column
        out = column._make(column.w.Output, layout=column.segment_layout)
        out.add_class("dnb-md")
        if column.parts or column.after_notes:  # not the top of the output: its first heading
            # keeps its whole margin
            out.add_class("dnb-next")
        if block.continued and self.outputs:
            out.add_class("dnb-cont")
            self.outputs[-1].add_class("dnb-has-cont")
        if block.hide_header:
            out.add_class("dnb-hide-header")
        self.outputs.append(out)
        column.place(out)
        self.current = out
        self.shown = ""
        return out

    def _show(self, out: Any, markdown: str) -> None:
        if markdown != self.shown:
            out.outputs = (_markdown_bundle(markdown),)
            self.shown = markdown

    def flush(self, final: bool = False) -> None:
        if not self.dirty and not final:
            return
        self.dirty = False
        finished, current = self.blocks.take()
        for block in finished:
            self._show(self._output_for(block), block.source)
            self.current = None
        markdown = current.source.rstrip() if final else stable_prefix(current.source)
        if markdown.strip():
            self._show(self._output_for(current), markdown)


class _WidgetColumn:
    """One model's live view as ipywidgets: the body (text / thinking / tool parts), then the
    status line, which becomes the footer."""

    def __init__(self, widgets: Any, title: str, segment_chars: int, width: str | None) -> None:
        from ipywidgets.widgets.widget_string import HTMLStyle

        from .blocks import BLOCK_LIMIT

        self.w = widgets
        self.title = title
        self.segment_chars = segment_chars
        self.block_limit = BLOCK_LIMIT
        self.created: list[Any] = []
        # Segments share one layout and one style model: one comm per segment, not three.
        self.segment_layout = self._make(widgets.Layout, margin="0")
        self.segment_style = self._make(HTMLStyle)
        self.body = self._make(widgets.VBox, children=())
        self.body.add_class("dnb-flow")
        #: a compare column (``width``) is headed by its model; the status line then says only
        #: the state
        self.label = "" if width else title
        self.status = self._make(
            widgets.HTML, value=_status_html(self.label, "waiting for the first token…")
        )
        children: tuple[Any, ...] = (self.body, self.status)
        if width:
            header = self._make(
                widgets.HTML, value=f"<div class='dnb-title'><b>{html.escape(title)}</b></div>"
            )
            children = (header, *children)
        layout = {"width": width, "padding": "0 6px"} if width else {}
        self.box = self._make(widgets.VBox, children=children, layout=layout)
        self.parts: list[Any] = []
        #: notes sit above the answer (its first block is not the top of the output)
        self.after_notes = False
        self.parts_dirty = False
        self.runs: list[_Run | _MarkdownRun] = []
        self.current: _Run | _MarkdownRun | None = None
        self.groups: list[Any] = []  # boxes of Markdown blocks in the body
        self.dirty_groups: set[int] = set()
        self.accordions: list[Any] = []
        self.tools: dict[str, tuple[Any, ToolPart]] = {}
        self.dirty_tools: set[str] = set()
        self.state = "waiting for the first token…"
        self.state_dirty = False
        self.footer = ""

    def _make(self, cls: Any, **kw: Any) -> Any:
        widget = cls(**kw)
        self.created.append(widget)
        return widget

    def set_state(self, state: str) -> None:
        if state != self.state:
            self.state = state
            self.state_dirty = True

    def place(self, widget: Any) -> None:
        """Put a new Markdown block widget at the end of the body (in groups of 16)."""
        last = self.parts[-1] if self.parts else None
        if last is None or last not in self.groups or len(last._dnb_children) >= BLOCK_SEGMENTS:
            group = self._make(self.w.VBox, children=(), layout=self.segment_layout)
            group.add_class("dnb-flow")
            group._dnb_children = []
            self.groups.append(group)
            self.parts.append(group)
            self.parts_dirty = True
            last = group
        last._dnb_children.append(widget)
        self.dirty_groups.add(self.groups.index(last))

    def _open(self, kind: str) -> _Run | _MarkdownRun:
        if self.current is not None and self.current.kind == kind:
            return self.current
        self._settle()
        run: _Run | _MarkdownRun
        if kind == "thinking":
            inner = self._make(self.w.VBox, children=())
            accordion = self._make(self.w.Accordion, children=(inner,), selected_index=None)
            accordion.set_title(0, "Thinking…")
            self.accordions.append(accordion)
            self.parts.append(accordion)
            self.parts_dirty = True
            run = _Run(self.segment_chars, inner)
        else:
            run = _MarkdownRun(self, self.block_limit)
        self.runs.append(run)
        self.current = run
        return run

    def _settle(self) -> None:
        """The text before a tool call or thinking is complete: show all of it."""
        if isinstance(self.current, _MarkdownRun):
            self.current.flush(final=True)
        self.current = None

    def add_text(self, kind: str, text: str) -> None:
        run = self._open(kind)
        if isinstance(run, _MarkdownRun):
            run.add(text)
            return
        for _ in run.segments.add(text):
            segment = self._make(
                self.w.HTML, value="", layout=self.segment_layout, style=self.segment_style
            )
            run.widgets.append(segment)
            if not run.blocks or len(run.blocks[-1]._dnb_children) >= BLOCK_SEGMENTS:
                block = self._make(self.w.VBox, children=(), layout=self.segment_layout)
                block._dnb_children = []
                run.blocks.append(block)
                run.inner_dirty = True
            run.blocks[-1]._dnb_children.append(segment)
            run.dirty_blocks.add(len(run.blocks) - 1)

    def tool_started(self, part: ToolPart) -> None:
        self._settle()
        line = self._make(self.w.HTML, value=_tool_html(part))
        self.tools[part.id] = (line, part)
        self.parts.append(line)
        self.parts_dirty = True

    def tool_changed(self, tool_id: str) -> None:
        if tool_id in self.tools:
            self.dirty_tools.add(tool_id)

    def flush(self, final: bool = False) -> None:
        for run in self.runs:
            if isinstance(run, _MarkdownRun):
                run.flush(final=final)
                continue
            for i in run.segments.take_dirty():
                text = html.escape(run.segments.text(i))
                run.widgets[i].value = f"<div class='dnb-thinking'>{text}</div>"
            for b in sorted(run.dirty_blocks):
                block = run.blocks[b]
                block.children = tuple(block._dnb_children)
            run.dirty_blocks.clear()
            if run.inner_dirty:
                run.inner.children = tuple(run.blocks)
                run.inner_dirty = False
        for g in sorted(self.dirty_groups):
            group = self.groups[g]
            group.children = tuple(group._dnb_children)
        self.dirty_groups.clear()
        for tool_id in sorted(self.dirty_tools):
            line, part = self.tools[tool_id]
            line.value = _tool_html(part)
        self.dirty_tools.clear()
        if self.parts_dirty:
            self.body.children = tuple(self.parts)
            self.parts_dirty = False
        if self.state_dirty:
            self.status.value = _status_html(self.label, self.footer or self.state)
            self.state_dirty = False

    def done(self, footer: str, error: str | None) -> None:
        for accordion in self.accordions:
            accordion.set_title(0, "Thinking")
        self.flush(final=True)
        self.footer = footer + (f" · ⚠ {error}" if error else "")
        self.state_dirty = True

    def abandon(self, parts: list[ToolPart]) -> None:
        for part in parts:
            self.tool_changed(part.id)

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
            from .display import notes_markdown

            note = widgets.Output()
            note.add_class("dnb-md")
            note.outputs = (_markdown_bundle(notes_markdown(self.notes).rstrip("\n")),)
            self._extra.append(note)
            children.append(note)
        if self.compare:
            row = widgets.HBox([c.box for c in self.columns], layout={"width": "100%"})
            self._extra.append(row)
            children.append(row)
        else:
            # one answer: its notes, blocks and status line flow like the final output's elements
            column = self.columns[0]
            column.box.add_class("dnb-flow")
            column.after_notes = bool(self.notes)
            children.append(column.box)
        self.root = widgets.VBox(children)
        self.root.add_class("dnb-live")
        if not self.compare:
            self.root.add_class("dnb-flow")
        self._extra.append(self.root)
        self.handle = ipy_display(self.root, display_id=True)

    def _state_changed(self, index: int) -> None:
        if self.columns:
            self.columns[index].set_state(self.states[index])

    def _feed(self, index: int, event: Any) -> None:
        column = self.columns[index]
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
            column._settle()

    def _flush(self) -> None:
        for column in self.columns:
            column.flush()

    def interrupt(self) -> None:
        for index, column in enumerate(self.columns):
            if not self.ended[index]:
                column.abandon(self.transcripts[index].abandon_tools())
        super().interrupt()

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


class _DisplayRun:
    """A stretch of answer text as ``display_id`` Markdown outputs, one per block."""

    def __init__(self, limit: int) -> None:
        self.blocks = MarkdownBlocks(limit)

    def take(self, final: bool) -> tuple[list[str], str]:
        finished, current = self.blocks.take()
        markdown = current.source.rstrip() if final else stable_prefix(current.source)
        return [b.source for b in finished], markdown


class DisplayView(LiveView):
    """The ``display_id`` rendering. One model: one Markdown output per finished block or tool
    call, and a last output holding the growing block and the status line (so the status stays
    below the answer). Compare mode: one HTML table re-rendered at most ``compare_rate`` times
    per second."""

    mode = "display"

    def __init__(
        self,
        titles: list[str],
        *,
        rate: float = DEFAULT_RATE,
        block_chars: int | None = None,
        compare_rate: float = 10.0,
    ) -> None:
        from .blocks import BLOCK_LIMIT

        super().__init__(titles, rate=rate if len(titles) == 1 else min(rate, compare_rate))
        self.block_chars = block_chars or BLOCK_LIMIT
        self.table_handle: Any = None
        self.live_handle: Any = None  # the last output: growing block + status line
        self.live_markdown = ""  # the growing block's part of it
        self.shown: dict[str, Any] | None = None
        self.run: _DisplayRun | None = None
        self.tool_handles: dict[str, Any] = {}
        self.footers = ["" for _ in titles]

    # -- one model -------------------------------------------------------------------------------
    def _status_line(self) -> str:
        state = self.footers[0] or self.states[0]
        line = f"**{html.escape(self.titles[0])}** · {html.escape(state)}"
        thinking = self.transcripts[0].thinking
        if thinking and not self.footers[0]:
            line += f" · 💭 thinking ({len(thinking):,} characters)"
        return f"<sub>{line}</sub>"

    def _live_bundle(self) -> dict[str, Any]:
        body = self.live_markdown.rstrip()
        markdown = (body + "\n\n" if body else "") + self._status_line()
        return {"text/markdown": markdown, "text/plain": body or self.titles[0]}

    def _commit(self, markdown: str) -> Any:
        """Turn the live output into a finished one holding ``markdown``; open a new live one
        below it. Returns the finished output's handle."""
        handle = self.live_handle
        handle.update({"text/markdown": markdown, "text/plain": markdown}, raw=True)
        self.live_markdown = ""
        self.shown = None
        self.live_handle = ipy_display(self._live_bundle(), raw=True, display_id=True)
        return handle

    def _settle(self) -> None:
        if self.run is not None:
            finished, markdown = self.run.take(final=True)
            for source in finished:
                self._commit(source)
            if markdown.strip():
                self._commit(markdown)
        self.run = None

    def start(self, notes: list[str] | None = None) -> None:
        super().start(notes)
        if self.compare:
            self.table_handle = ipy_display(
                {"text/html": self._table_html(), "text/plain": "streaming…"},
                raw=True,
                display_id=True,
            )
            return
        if self.notes:
            from .display import notes_markdown

            md = notes_markdown(self.notes).rstrip("\n")
            ipy_display({"text/markdown": md, "text/plain": "\n".join(self.notes)}, raw=True)
        self.live_handle = ipy_display(self._live_bundle(), raw=True, display_id=True)
        self.shown = self._live_bundle()

    def _feed(self, index: int, event: Any) -> None:
        if self.compare:
            return
        kind = getattr(event, "type", None)
        if kind == "text_delta":
            if self.run is None:
                self.run = _DisplayRun(self.block_chars)
            self.run.blocks.feed(event.text or "")
        elif kind == "tool_use_start":
            from .display import tool_markdown

            self._settle()
            tool = self.transcripts[0].tools[-1]
            self.tool_handles[tool.id] = self._commit(tool_markdown(tool).rstrip())
        elif kind in ("tool_use_end", "tool_result"):
            tool_id = event.tool_call_id if kind == "tool_use_end" else event.result.tool_use_id
            self._update_tool(tool_id or "")

    def _update_tool(self, tool_id: str) -> None:
        from .display import tool_markdown

        handle = self.tool_handles.get(tool_id)
        tool = next((t for t in self.transcripts[0].tools if t.id == tool_id), None)
        if handle is not None and tool is not None:
            md = tool_markdown(tool).rstrip()
            handle.update({"text/markdown": md, "text/plain": md}, raw=True)

    def _flush(self, final: bool = False) -> None:
        if self.compare:
            self.table_handle.update(
                {"text/html": self._table_html(), "text/plain": "streaming…"}, raw=True
            )
            return
        if self.run is not None:
            finished, markdown = self.run.take(final=final)
            for source in finished:
                self._commit(source)
            self.live_markdown = markdown
        bundle = self._live_bundle()
        if bundle != self.shown:
            self.live_handle.update(bundle, raw=True)
            self.shown = bundle

    def interrupt(self) -> None:
        if not self.compare:
            for tool in self.transcripts[0].abandon_tools():
                self._update_tool(tool.id)
        super().interrupt()

    def _job_done(self, index: int, footer: str, error: str | None) -> None:
        self.footers[index] = footer + (f" · ⚠ {error}" if error else "")
        if not self.compare:
            self._flush(final=True)

    # -- compare ---------------------------------------------------------------------------------
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
        from .display import terminal_text

        for note in self.notes:
            self._write(f"ℹ {terminal_text(note)}\n")

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
        elif kind == "retry":
            prefix = "" if self.at_line_start and not self.pending else "\n"
            self.pending.append(f"{prefix}{retry_state(event)}\n")

    def interrupt(self) -> None:
        if not self.compare:
            for _tool in self.transcripts[0].abandon_tools():
                self.pending.append("   ⏹ abandoned: still running when interrupted\n")
        super().interrupt()

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
            if final.terminal:  # a warning or a hint; the answer itself was printed as it came
                from .display import terminal_text

                self._write(terminal_text(final.terminal.rstrip("\n")) + "\n")
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
