"""The live view of a streaming answer: the ``display`` and ``text`` renderings (``widget`` is in
:mod:`.live_widget`) and how one is picked (``docs/notebook.md``, "The live view and its
fallbacks"). Every method runs on the kernel's main thread (the runner hands events over).
"""

from __future__ import annotations

import contextlib
import html
import re
import sys
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from ..frontend import unattended
from ..render import small
from .blocks import BLOCK_LIMIT, MarkdownBlocks, close_open_fence, warm_up
from .constants import LIVE_MODES
from .display import (
    FinalOutput,
    Transcript,
    notes_markdown,
    terminal_text,
    tool_line,
    tool_markdown,
)

if TYPE_CHECKING:
    from ..turn import ToolRun

__all__ = [
    "DisplayView",
    "LiveView",
    "TextView",
    "detect_mode",
    "make_view",
]

DEFAULT_RATE = 20.0

_TEXT_STYLE = (
    "white-space: pre-wrap; word-break: break-word; margin: 0; line-height: 1.45; "
    "font-family: var(--jp-content-font-family, var(--vscode-font-family, sans-serif));"
)
_DIM = "color: var(--jp-ui-font-color2, #777); font-size: 0.85em;"


def ipy_display(obj: Any, **kwargs: Any) -> Any:
    """``IPython.display.display`` (typed for this package)."""
    from IPython.display import display

    return display(obj, **kwargs)  # type: ignore[no-untyped-call]


def _replace_outputs(final: FinalOutput) -> None:
    """Clear the cell's live outputs and display the one static ``final`` output instead (none
    when it has nothing to show)."""
    from IPython.display import clear_output

    clear_output(wait=True)  # type: ignore[no-untyped-call]
    if final.data:
        ipy_display(final.data, metadata=final.metadata, raw=True)


def close_widgets(widgets: Iterable[Any]) -> None:
    """Close each widget, so no widget state is left in the saved notebook (one that cannot be
    closed any more is skipped)."""
    for widget in widgets:
        with contextlib.suppress(Exception):
            widget.close()


def has_kernel(shell: Any) -> bool:
    """True inside a Jupyter kernel (ipykernel), False in terminal IPython or a bare shell."""
    return getattr(shell, "kernel", None) is not None


def detect_mode(shell: Any, requested: str = "auto") -> str:
    """The rendering to use: ``auto`` as ``docs/notebook.md``'s table says, else ``requested``
    (``widget`` without ipywidgets is ``display``; without a kernel only ``auto`` becomes ``text``).
    ``auto`` in a run nobody watches (nbclient, papermill: :func:`.frontend.unattended`) is
    ``display``: a widget's state would be saved with the notebook, and nobody sees it live."""
    requested = (requested or "auto").lower()
    if requested not in LIVE_MODES:
        raise ValueError(f"live mode must be one of {', '.join(LIVE_MODES)}, not {requested!r}")
    if requested == "auto" and not has_kernel(shell):
        return "text"
    if requested == "auto" and unattended(shell):
        return "display"
    if requested in ("auto", "widget"):
        try:
            import ipywidgets  # noqa: F401
        except ImportError:
            return "display"
        return "widget"
    return requested


def retry_state(event: Any) -> str:
    """The quiet status line of a retry: ``↻ rate limited, HTTP 429 — retrying in 2 s``."""
    wait = f"in {event.wait:.0f} s" if event.wait >= 1 else "now"
    return f"↻ {event.reason} — retrying {wait}"


class LiveView:
    """What every rendering offers (``titles``: a column per model); the runner drives it from the
    kernel's main thread."""

    mode = "base"

    def __init__(self, titles: list[str], *, rate: float = DEFAULT_RATE) -> None:
        self.titles = titles
        #: at most ``rate`` repaints a second: the seconds between two, and when the last ended
        self.interval = 1.0 / rate if rate > 0 else 0.0
        self.flushed = float("-inf")
        self.transcripts = [Transcript(t) for t in titles]
        self.states = ["waiting for the first token…" for _ in titles]
        #: each finished column's footer (with its error)
        self.footers = ["" for _ in titles]
        self.ended = [False for _ in titles]
        self.dirty = False
        self.text_shown = False
        self.notes: list[str] = []

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
        self.states[index] = retry_state(event) if kind == "retry" else "streaming…"
        self._feed(index, event)
        self.dirty = True

    def tick(self) -> float | None:
        """Flush if due; seconds until the next flush is due (None: nothing pending)."""
        if not self.dirty:
            return None
        wait = self.flushed + self.interval - time.monotonic()
        if wait > 0 and (self.text_shown or not self._has_text()):  # the first text: at once
            return wait
        self._flush_now()
        self.text_shown = self.text_shown or self._has_text()
        return None

    def _flush_now(self) -> None:
        self._flush()
        self.dirty = False
        self.flushed = time.monotonic()  # the next update waits from the end of this one

    def job_done(self, index: int, footer: str, error: str | None = None) -> None:
        """Column ``index`` finished: show its footer (compare mode shows each as it ends);
        ``error`` starts with its mark (⚠ a failure, ⏹ the interrupt). The footer is shown beside
        the column's title, which names the model already: its name is not said twice."""
        self.ended[index] = True
        self.states[index] = error or "done"
        title = self.titles[index]
        shown = "" if footer == title else footer.removeprefix(f"{title} · ")
        self.footers[index] = " · ".join(part for part in (shown, error) if part)
        self._job_done(index)
        self.dirty = True

    def approval_asked(self, index: int, tool_id: str) -> None:
        """Column ``index``'s call ``tool_id`` waits for approval: the status line says so at once
        (this thread waits for the answer next)."""
        tool = self.transcripts[index].tool(tool_id)
        if tool is None:
            return
        tool.waiting = True
        self.states[index] = f"waiting for approval of {tool.name}"
        self._approval_asked(index, tool)
        self._flush_now()

    def approval_answered(self, index: int, tool_id: str, answer: bool | str) -> None:
        """The person answered (or the turn's deadline passed): the status line moves on. A
        question its cell stopped before it was shown was not run either, and says so."""
        from ..approval import ALWAYS
        from .approval import INTERRUPTED

        tool = self.transcripts[index].tool(tool_id)
        if tool is None or tool.result is not None:
            return
        if answer == INTERRUPTED:
            tool.waiting = True
            for stopped in self.transcripts[index].stop_waiting(INTERRUPTED):
                self._not_run(index, stopped)
            self.dirty = True
            return
        if not tool.waiting:
            return
        tool.waiting = False
        approved = answer is True or answer == ALWAYS
        self.states[index] = f"running {tool.name}…" if approved else "streaming…"
        self.dirty = True

    def interrupt(self) -> None:
        """Ctrl-C: say so at once in every column still running (what arrived stays). A call
        still waiting for approval was not run, and says so (it is not abandoned: it never
        started)."""
        from .approval import INTERRUPTED

        for index, ended in enumerate(self.ended):
            if not ended:
                for tool in self.transcripts[index].stop_waiting(INTERRUPTED):
                    self._not_run(index, tool)
                self.states[index] = "⏹ interrupted"
        self._flush_now()

    def finish(self, final: FinalOutput) -> None:
        """Replace the live view with the one static ``final`` output."""
        if self.dirty:
            self._flush_now()
        self._finish(final)

    def close(self) -> None:
        """Release resources if the cell stops early (unexpected error)."""

    # -- what a rendering supplies -------------------------------------------------------------------
    def _has_text(self) -> bool:
        return any(t.has_text for t in self.transcripts)

    def _approval_asked(self, index: int, tool: ToolRun) -> None:
        pass

    def _not_run(self, index: int, tool: ToolRun) -> None:
        pass

    def _feed(self, index: int, event: Any) -> None:
        pass

    def _flush(self) -> None:
        pass

    def _job_done(self, index: int) -> None:
        pass

    def _finish(self, final: FinalOutput) -> None:
        pass


# ------------------------------------------------------------------------------------------------
# display


class DisplayView(LiveView):
    """The ``display_id`` rendering. One model: one Markdown output per finished block or tool
    call, and a last output holding the growing block and the status line (so the status stays
    below the answer). Compare mode: one HTML table re-rendered at most 10 times per second."""

    mode = "display"

    def __init__(
        self,
        titles: list[str],
        *,
        rate: float = DEFAULT_RATE,
        block_chars: int = BLOCK_LIMIT,
    ) -> None:
        super().__init__(titles, rate=rate if len(titles) == 1 else min(rate, 10.0))
        self.block_chars = block_chars
        self.table_handle: Any = None
        self.live_handle: Any = None  # the last output: growing block + status line
        self.live_markdown = ""  # the growing block's part of it
        self.shown: dict[str, Any] | None = None
        self.run: MarkdownBlocks | None = None  # the answer text since the last tool call
        self.tool_handles: dict[str, Any] = {}

    # -- one model -------------------------------------------------------------------------------
    def _status_line(self) -> str:
        state = self.footers[0] or self.states[0]
        line = f"**{html.escape(self.titles[0])}** · {html.escape(state)}"
        thinking = self.transcripts[0].thinking
        if thinking and not self.ended[0]:
            line += f" · 💭 thinking ({len(thinking):,} characters)"
        return small(line)

    def _live_bundle(self) -> dict[str, Any]:
        body = self.live_markdown.rstrip()
        # a code block still growing is closed: the status line below it is not code
        markdown = (close_open_fence(body) + "\n\n" if body else "") + self._status_line()
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

    def _take_blocks(self, final: bool = False) -> None:
        """Commit the answer's finished blocks; what shows of the growing one is ``live_markdown``."""
        if self.run is not None:
            finished, _, markdown = self.run.shown(final=final)
            for block in finished:
                self._commit(block.source)
            self.live_markdown = markdown

    def _settle(self) -> None:
        self._take_blocks(final=True)
        if self.live_markdown.strip():
            self._commit(self.live_markdown)
        self.run = None

    def start(self, notes: list[str] | None = None) -> None:
        super().start(notes)
        if self.compare:
            self.table_handle = ipy_display(self._table(), raw=True, display_id=True)
            return
        if self.notes:
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
                self.run = MarkdownBlocks(self.block_chars)
            self.run.feed(event.text or "")
        elif kind == "tool_use_start":
            self._settle()
            tool = self.transcripts[0].tools[-1]
            self.tool_handles[tool.id] = self._commit(tool_markdown(tool).rstrip())
        elif kind in ("tool_use_end", "tool_result"):
            tool_id = event.tool_call_id if kind == "tool_use_end" else event.result.tool_use_id
            self._update_tool(tool_id or "")

    def _update_tool(self, tool_id: str) -> None:
        handle = self.tool_handles.get(tool_id)
        tool = self.transcripts[0].tool(tool_id)
        if handle is not None and tool is not None:
            md = tool_markdown(tool).rstrip()
            handle.update({"text/markdown": md, "text/plain": md}, raw=True)

    def _flush(self, final: bool = False) -> None:
        if self.compare:
            self.table_handle.update(self._table(), raw=True)
            return
        self._take_blocks(final)
        bundle = self._live_bundle()
        if bundle != self.shown:
            self.live_handle.update(bundle, raw=True)
            self.shown = bundle

    def interrupt(self) -> None:
        if not self.compare:
            for tool in self.transcripts[0].abandon_tools():
                self._update_tool(tool.id)
        super().interrupt()

    def _not_run(self, index: int, tool: ToolRun) -> None:
        if not self.compare:
            self._update_tool(tool.id)

    def _job_done(self, index: int) -> None:
        if not self.compare:
            self._flush(final=True)

    # -- compare ---------------------------------------------------------------------------------
    def _table(self) -> dict[str, str]:
        head = "".join(
            f"<th style='text-align:left'>{html.escape(title)}"
            f"<div style='{_DIM}'>{html.escape(self.footers[i] or self.states[i])}</div></th>"
            for i, title in enumerate(self.titles)
        )
        cells = "".join(
            f"<td style='vertical-align:top; text-align:left'><div style='{_TEXT_STYLE}'>"
            f"{html.escape(transcript.plain())}</div></td>"
            for transcript in self.transcripts
        )
        table = f"<table style='width:100%; table-layout:fixed'><tr>{head}</tr><tr>{cells}</tr></table>"
        return {"text/html": table, "text/plain": "streaming…"}

    def _finish(self, final: FinalOutput) -> None:
        _replace_outputs(final)


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
        #: the calls whose end was already written (not run: the cell was interrupted)
        self.said: set[str] = set()

    def _write(self, text: str) -> None:
        if not text:
            return
        text = terminal_safe(text)
        sys.stdout.write(text)
        sys.stdout.flush()
        self.at_line_start = text.endswith("\n")

    def start(self, notes: list[str] | None = None) -> None:
        super().start(notes)
        for note in self.notes:
            self._write(f"ℹ {terminal_text(note)}\n")

    def _feed(self, index: int, event: Any) -> None:
        if self.compare:
            return
        kind = getattr(event, "type", None)
        if kind == "text_delta":
            self.pending.append(event.text or "")
        elif kind == "thinking_delta" and not self.thinking_said:
            self.thinking_said = True
            self.pending.append("💭 thinking…\n")
        elif kind == "tool_use_end":
            if tools := self.transcripts[0].tools:
                prefix = "" if self.at_line_start and not self.pending else "\n"
                self.pending.append(f"{prefix}🔧 {tool_line(tools[-1])}\n")
        elif kind == "tool_result":
            tool = self.transcripts[0].tool(event.result.tool_use_id)
            if tool is not None and tool.id not in self.said:
                arrow = "⚠" if tool.is_error else "→"
                result = (tool.result or "").rstrip()
                if len(result) > 300:  # cut where it shows: not mid-number, silently
                    result = result[:299].rstrip() + "…"
                self.pending.append(f"   {arrow} " + result.replace("\n", "\n     ") + "\n")
        elif kind == "retry" or (kind == "note" and event.message not in self.said):
            if kind == "note":  # a warning logged while the cell ran (each round: said once)
                self.said.add(event.message)
            prefix = "" if self.at_line_start and not self.pending else "\n"
            said = retry_state(event) if kind == "retry" else f"ℹ {terminal_text(event.message)}"
            self.pending.append(f"{prefix}{said}\n")

    def interrupt(self) -> None:
        if not self.compare:
            for _tool in self.transcripts[0].abandon_tools():
                self.pending.append("   ⏹ abandoned: still running when interrupted\n")
        super().interrupt()

    def _approval_asked(self, index: int, tool: ToolRun) -> None:
        if not self.compare:  # the question follows (the input box, or the buttons)
            self.pending.append(f"   ⏳ waiting for approval of {tool.name}\n")

    def _not_run(self, index: int, tool: ToolRun) -> None:
        if not self.compare:
            self.said.add(tool.id)  # (on a line of its own: the question's prompt waited)
            self.pending.append(f"\n   ⏹ {tool.result}\n")

    def _flush(self) -> None:
        if self.pending:
            self._write("".join(self.pending))
            self.pending.clear()

    def _has_text(self) -> bool:
        return bool(self.pending) or super()._has_text()

    def _job_done(self, index: int) -> None:
        if self.compare:  # each answer as it ends, with its footer
            self._write(f"\n== {self.titles[index]} ==\n{self.transcripts[index].plain()}\n"
                        f"[{self.footers[index]}]\n")

    def _finish(self, final: FinalOutput) -> None:
        if self.in_kernel:
            _replace_outputs(final)
            return
        if self.compare:  # each answer and its footer were printed as it ended; --schema: a table
            if final.terminal:
                self._write("\n" + terminal_text(final.terminal.rstrip("\n")) + "\n")
            return
        footer = final.metadata.get("dispatch_nb", {}).get("footer", "")
        if not self.at_line_start:
            self._write("\n")
        if final.terminal:  # a warning or a hint; the answer itself was printed as it came
            self._write(terminal_text(final.terminal.rstrip("\n")) + "\n")
        if footer:
            self._write(f"[{footer}]\n")


#: control characters a terminal acts on (escape sequences: colours, the window title, the
#: clipboard, moving the cursor over what was written) as the symbols that name them: C0 but tab and
#: newline (␛, ␇, ␀, ␍, …), DEL (␡), and the C1 controls (some terminals read ``\x9b`` as ESC [)
_CONTROLS = {c: 0x2400 + c for c in range(0x20) if c not in (0x09, 0x0A)}
_CONTROLS |= {0x7F: 0x2421} | {c: 0xFFFD for c in range(0x80, 0xA0)}
_LINE_END_CR = re.compile(r"\r(?=\n|\Z)")


def terminal_safe(text: str) -> str:
    """``text`` to print in a terminal: an answer's control characters are shown, never obeyed
    (a model's ``\\x1b]0;…\\x07`` must not retitle the window, nor ``\\x1b[2J`` clear it); a CRLF
    line end is a line end (also when the ``\\r`` ends one piece of the stream and the ``\\n``
    starts the next)."""
    return _LINE_END_CR.sub("", text).translate(_CONTROLS)


def make_view(
    mode: str, titles: list[str], *, rate: float = DEFAULT_RATE, in_kernel: bool = False
) -> LiveView:
    """The live view for ``mode``: ``widget``, ``display`` or ``text`` (what :func:`detect_mode`
    returns)."""
    if mode == "widget":
        from .live_widget import WidgetView

        return WidgetView(titles, rate=rate)
    if mode == "display":
        return DisplayView(titles, rate=rate)
    return TextView(titles, rate=rate, in_kernel=in_kernel)
