"""The ``widget`` rendering of the live view (see :mod:`dispatch_nb.notebook.live`): a small
ipywidgets tree per model — the answer as rendered Markdown, one ``Output`` widget per block,
thinking in a collapsed accordion cut in segments, one line per tool call, and a status line that
becomes the footer. No update re-sends more than one segment's text, one block or one box's list
of children.
"""

from __future__ import annotations

import html
from typing import TYPE_CHECKING, Any

from .blocks import Block, MarkdownBlocks
from .display import FinalOutput, notes_markdown, tool_line
from .live import _DIM, _TEXT_STYLE, DEFAULT_RATE, LiveView, _replace_outputs, close_widgets, ipy_display

if TYPE_CHECKING:
    from ..turn import ToolRun

__all__ = ["SEGMENT_CHARS", "WidgetView"]

#: the most characters one live thinking segment holds
SEGMENT_CHARS = 600
#: the most segments (or Markdown blocks) one box of the widget view holds
BLOCK_SEGMENTS = 16

#: the live view's own styles (sent with the status line): the blocks sit where the final
#: output's elements will (``docs/notebook.md``, "How it renders while it streams")
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
    # (a piece of a long code block continued below keeps no margin: the seam stays hidden)
    ".dnb-live .dnb-md:not(.dnb-has-cont) .jp-RenderedMarkdown > pre:last-child"
    "{margin-bottom:1.5em;}"
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

    def take_dirty(self) -> list[int]:
        dirty = sorted(self.dirty)
        self.dirty.clear()
        return dirty


def _tool_html(part: ToolRun) -> str:
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


class _Run:
    """A stretch of thinking as widgets in a collapsed accordion: segments of at most
    :data:`SEGMENT_CHARS` characters, grouped in blocks of at most :data:`BLOCK_SEGMENTS`, so no
    update ever re-sends more than one segment's text or one block's list of children."""

    kind = "thinking"

    def __init__(self, column: _WidgetColumn) -> None:
        self.column = column
        self.segments = _Segments(SEGMENT_CHARS)
        self.widgets: list[Any] = []
        self.blocks: list[Any] = []
        self.inner = column._make(column.w.VBox, children=())  # the accordion's box
        self.inner_dirty = False
        accordion = column._make(column.w.Accordion, children=(self.inner,), selected_index=None)
        accordion.set_title(0, "Thinking…")
        column.accordions.append(accordion)
        column.parts.append(accordion)
        column.parts_dirty = True

    def add(self, text: str) -> None:
        column = self.column
        for _ in self.segments.add(text):
            segment = column._make(
                column.w.HTML, value="", layout=column.segment_layout, style=column.segment_style
            )
            self.widgets.append(segment)
            self.inner_dirty |= column.put(self.blocks, segment)

    def flush(self, final: bool = False) -> None:
        for i in self.segments.take_dirty():
            text = html.escape(self.segments.chunks[i])
            self.widgets[i].value = f"<div class='dnb-thinking'>{text}</div>"
        if self.inner_dirty:
            self.inner.children = tuple(self.blocks)
            self.inner_dirty = False


class _MarkdownRun:
    """A stretch of answer text as rendered Markdown: one ``Output`` widget per block (see the
    module docstring), grouped in boxes of at most :data:`BLOCK_SEGMENTS`."""

    kind = "text"

    def __init__(self, column: _WidgetColumn) -> None:
        self.column = column
        self.blocks = MarkdownBlocks()
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
        finished, current, markdown = self.blocks.shown(final)
        for block in finished:
            self._show(self._output_for(block), block.source)
            self.current = None
        if markdown.strip():
            self._show(self._output_for(current), markdown)


class _WidgetColumn:
    """One model's live view as ipywidgets: the body (text / thinking / tool parts), then the
    status line, which becomes the footer."""

    def __init__(self, widgets: Any, title: str, width: str | None) -> None:
        from ipywidgets.widgets.widget_string import HTMLStyle

        self.w = widgets
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
        self.boxes: list[Any] = []  # of thinking segments, and of Markdown blocks in the body
        self.dirty_boxes: list[Any] = []
        self.accordions: list[Any] = []
        self.tools: dict[str, tuple[Any, ToolRun]] = {}
        self.dirty_tools: set[str] = set()

    def _make(self, cls: Any, **kw: Any) -> Any:
        widget = cls(**kw)
        self.created.append(widget)
        return widget

    def put(self, parts: list[Any], widget: Any) -> bool:
        """Put ``widget`` in the last box of ``parts``, or in a new one when that is full or no
        box: True when a box was added to ``parts``."""
        last: Any = parts[-1] if parts else None
        new = last not in self.boxes or len(last._dnb_children) >= BLOCK_SEGMENTS
        if new:
            last = self._make(self.w.VBox, children=(), layout=self.segment_layout)
            last._dnb_children = []
            self.boxes.append(last)
            parts.append(last)
        last._dnb_children.append(widget)
        if last not in self.dirty_boxes:
            self.dirty_boxes.append(last)
        return new

    def place(self, widget: Any) -> None:
        """Put a new Markdown block widget at the end of the body (in boxes of 16)."""
        if self.put(self.parts, widget):
            self.parts[-1].add_class("dnb-flow")
            self.parts_dirty = True

    def open(self, kind: str) -> _Run | _MarkdownRun:
        """The run ``kind`` text (``text`` / ``thinking``) goes to: the last, else a new one."""
        if self.current is not None and self.current.kind == kind:
            return self.current
        self._settle()
        run = _Run(self) if kind == "thinking" else _MarkdownRun(self)
        self.runs.append(run)
        self.current = run
        return run

    def _settle(self) -> None:
        """The text before a tool call or thinking is complete: show all of it."""
        if isinstance(self.current, _MarkdownRun):
            self.current.flush(final=True)
        self.current = None

    def tool_started(self, part: ToolRun) -> None:
        self._settle()
        line = self._make(self.w.HTML, value=_tool_html(part))
        self.tools[part.id] = (line, part)
        self.parts.append(line)
        self.parts_dirty = True

    def tool_changed(self, tool_id: str) -> None:
        if tool_id in self.tools:
            self.dirty_tools.add(tool_id)

    def flush(self, status: str, final: bool = False) -> None:
        """Show what changed; ``status``: the state, and the footer once the column is done."""
        for run in self.runs:
            run.flush(final=final)
        for box in self.dirty_boxes:
            box.children = tuple(box._dnb_children)
        self.dirty_boxes.clear()
        for tool_id in sorted(self.dirty_tools):
            line, part = self.tools[tool_id]
            line.value = _tool_html(part)
        self.dirty_tools.clear()
        if self.parts_dirty:
            self.body.children = tuple(self.parts)
            self.parts_dirty = False
        status = _status_html(self.label, status)
        if status != self.status.value:
            self.status.value = status

    def done(self, status: str) -> None:
        for accordion in self.accordions:
            accordion.set_title(0, "Thinking")
        self.flush(status, final=True)

    def close(self) -> None:
        close_widgets(reversed(self.created))
        self.created.clear()


class WidgetView(LiveView):
    """The ipywidgets rendering (see the module docstring)."""

    mode = "widget"

    def __init__(self, titles: list[str], *, rate: float = DEFAULT_RATE) -> None:
        super().__init__(titles, rate=rate)
        self.columns: list[_WidgetColumn] = []
        self.root: Any = None
        self.handle: Any = None
        self._extra: list[Any] = []
        #: True once an approval question was shown below the live view (see _approval_asked)
        self.outputs_below = False

    def start(self, notes: list[str] | None = None) -> None:
        super().start(notes)
        import ipywidgets as widgets
        width = f"{100 / len(self.titles):.2f}%" if self.compare else None
        self.columns = [_WidgetColumn(widgets, t, width) for t in self.titles]
        children: list[Any] = []
        if self.notes:
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

    def _feed(self, index: int, event: Any) -> None:
        column = self.columns[index]
        kind = getattr(event, "type", None)
        if kind in ("text_delta", "thinking_delta"):
            column.open(kind.removesuffix("_delta")).add(event.text or "")
        elif kind == "tool_use_start":
            column.tool_started(self.transcripts[index].tools[-1])
        elif kind in ("tool_use_end", "tool_use_delta"):
            column.tool_changed(event.tool_call_id or "")
        elif kind == "tool_result":
            column.tool_changed(event.result.tool_use_id)
            column._settle()

    def _flush(self) -> None:
        for index, column in enumerate(self.columns):
            column.flush(self.footers[index] or self.states[index])

    def interrupt(self) -> None:
        for index, column in enumerate(self.columns):
            if not self.ended[index]:
                for part in self.transcripts[index].abandon_tools():
                    column.tool_changed(part.id)
        super().interrupt()

    def _not_run(self, index: int, tool: ToolRun) -> None:
        if self.columns:
            self.columns[index].tool_changed(tool.id)

    def _approval_asked(self, index: int, tool: ToolRun) -> None:
        # the question is an output of its own below this one (the buttons, emptied once
        # answered; or the input box's question): the final output replaces them all
        self.outputs_below = True

    def _job_done(self, index: int) -> None:
        self.columns[index].done(self.footers[index] or self.states[index])

    def _finish(self, final: FinalOutput) -> None:
        if not final.data or self.outputs_below:  # nothing to show (a cell that failed before
            # its first token), or the cell holds more outputs than the live view's
            _replace_outputs(final)
        elif self.handle is not None:
            self.handle.update(final.data, metadata=final.metadata, raw=True)
        self.close()

    def close(self) -> None:
        for column in self.columns:
            column.close()
        close_widgets(self._extra)
        self._extra.clear()
