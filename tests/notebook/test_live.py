"""The live view: first text at once, coalesced repaints, bytes linear in the answer's length."""

from __future__ import annotations

import json
import re
import time
from typing import Any

import pytest

from dispatch_nb.frontend import allow_stdin, unattended
from dispatch_nb.notebook.live import DisplayView, detect_mode, make_view
from dispatch_nb.types import StreamDelta
from tests.fakes.provider import Turn
from tests.notebook.conftest import run


def text(piece: str) -> StreamDelta:
    return StreamDelta(type="text_delta", text=piece)


def test_first_text_is_shown_at_once_and_later_text_is_coalesced(shell: Any) -> None:
    front = shell.front
    front.reset()
    view = DisplayView(["fake:echo"])
    view.start()
    view.feed(0, text("Hel"))
    assert view.tick() is None  # flushed immediately
    assert front.outputs[-1]["data"]["text/plain"] == "Hel"
    assert front.outputs[-1]["data"]["text/markdown"].startswith("Hel\n\n<sub>**fake:echo**")
    sent = len(front.messages)
    view.feed(0, text("lo"))
    view.feed(0, text(" world"))
    wait = view.tick()
    assert wait is not None and 0 < wait <= 0.05  # within 50 ms of the last repaint: wait
    assert len(front.messages) == sent
    time.sleep(wait)
    assert view.tick() is None
    assert front.outputs[-1]["data"]["text/plain"] == "Hello world"
    assert len(front.messages) == sent + 1  # the two deltas became one update


def test_long_text_is_cut_in_blocks_so_updates_stay_small(shell: Any) -> None:
    front = shell.front
    front.reset()
    view = DisplayView(["m"], rate=1000, block_chars=100)
    view.start()
    words = "".join(f"word{i} " for i in range(120))
    for i in range(0, len(words), 10):
        view.feed(0, text(words[i : i + 10]))
        time.sleep(0.002)
        view.tick()
    view.job_done(0, "m · done")
    view.tick()
    blocks = [o["data"]["text/markdown"] for o in front.outputs]
    finished, live = blocks[:-1], blocks[-1]
    assert len(finished) >= 6 and all(len(b) <= 100 for b in finished)
    joined = " ".join([*finished, live.split("\n\n<sub>")[0]])
    assert joined.split() == words.split()  # every word, in order, none split
    # the status line stays at the bottom; it names the model once (the footer names it too)
    assert live.endswith("<sub>**m** · done</sub>")
    updates = [b["data"]["text/markdown"] for kind, b in front.messages if kind == "update"]
    assert max(len(u) for u in updates) <= 100 + 40


def _top_level(markdown: str) -> list[tuple[str, str]]:
    """``(token type, source)`` of every top-level block ``markdown`` renders to."""
    from markdown_it import MarkdownIt

    lines = markdown.split("\n")
    tokens = MarkdownIt("commonmark", {"html": True}).enable("table").parse(markdown)
    return [
        (t.type.removesuffix("_open"), "\n".join(lines[t.map[0] : t.map[1]]))
        for t in tokens
        if t.level == 0 and t.nesting >= 0 and t.map is not None
    ]


@pytest.mark.parametrize("chars", [60, 600])
def test_the_status_line_is_never_inside_a_growing_code_block(shell: Any, chars: int) -> None:
    """The display view's live output is the growing block and the status line: a code block
    still open (short, or a long one's continuation) is closed before it, so the status line is
    rendered as a line of its own, never shown as code (a raw ``<sub>**m** · streaming…</sub>``)."""
    front = shell.front
    front.reset()
    view = DisplayView(["m"], rate=1000, block_chars=chars)
    view.start()
    answer = "Some code:\n\n```python\n" + "".join(
        f"value_{i} = compute({i})  # step {i}\n" for i in range(30)
    )
    lives = []
    for i in range(0, len(answer), 7):
        view.feed(0, text(answer[i : i + 7]))
        time.sleep(0.002)
        view.tick()
        live = front.outputs[-1]["data"]["text/markdown"]
        if "```" in live:
            lives.append(live)
    assert len(lives) > 10
    for live in lives:
        blocks = _top_level(live)
        assert blocks[-1] == ("paragraph", "<sub>**m** · streaming…</sub>"), live
        assert [kind for kind, _ in blocks[:-1]] in (["fence"], ["paragraph", "fence"]), live
        assert "<sub>" not in front.outputs[-1]["data"]["text/plain"]


@pytest.mark.parametrize(
    ("markdown", "closed"),
    [
        ("```py\nx = 1", "```py\nx = 1\n```"),
        ("```py\nx = 1\n```", "```py\nx = 1\n```"),  # closed already
        ("~~~~\nx\n~~~", "~~~~\nx\n~~~\n~~~~"),  # a shorter fence does not close it
        ("````\nx\n```", "````\nx\n```\n````"),
        ("- a\n  ```\n  code", "- a\n  ```\n  code"),  # the list ends before the status line
        ("> ```\n> code", "> ```\n> code"),
        ("text `code`", "text `code`"),
    ],
)
def test_close_open_fence(markdown: str, closed: str) -> None:
    from dispatch_nb.notebook.blocks import close_open_fence

    assert close_open_fence(markdown) == closed


@pytest.mark.parametrize("live", ["display", "text"])
def test_bytes_grow_linearly_with_the_answer(shell: Any, fake: Any, live: str, capfd: Any) -> None:
    run(shell, f'%config ChatMagics.live = "{live}"')
    once, largest = {}, {}
    for n in (2000, 4000, 8000):
        shell.front.reset()
        fake.push(Turn(text="y" * n, chunk=8, delay=0.001))
        started = time.monotonic()
        run(shell, "%%chat --no-history\ngo")
        duration = time.monotonic() - started
        printed = capfd.readouterr().out
        sizes = [len(json.dumps(body, default=str)) for _, body in shell.front.messages]
        # a repaint shows the answer so far; what is sent once shows all of it
        repaints = [size for (kind, body), size in zip(shell.front.messages, sizes, strict=True)
                    if kind != "clear" and "y" * n not in json.dumps(body)]
        largest[n] = max(repaints, default=0)
        once[n] = sum(sizes) - sum(repaints) + len(printed)
        painted = len([m for m in shell.front.messages if m[0] != "clear"])
        assert painted <= 20 * duration + 15 + n / 600, (painted, duration)
    # Linear, however long the stream took: no repaint carries the whole answer so far, only the
    # block still growing (a repaint of a 4x longer answer is no larger; a quadratic view's
    # would be 4x), at most 20 a second; and what is sent once is linear in the answer.
    assert largest[8000] <= 1.3 * largest[2000] + 200, largest
    assert once[4000] / once[2000] < 2.6, once
    assert once[8000] / once[4000] < 2.6, once


def test_detect_mode() -> None:
    class Terminal:
        kernel = None

    class Kernel:
        kernel = object()

    assert detect_mode(Terminal(), "auto") == "text"
    assert detect_mode(Kernel(), "auto") == "widget"
    assert detect_mode(Terminal(), "display") == "display"
    with pytest.raises(ValueError, match="live mode"):
        detect_mode(Kernel(), "fancy")
    assert make_view("text", ["a"]).mode == "text"


def test_auto_is_display_when_the_cell_comes_from_a_client_nobody_watches() -> None:
    # what ipykernel's Kernel.get_parent("shell") returns while it runs a request
    class Kernel:
        def __init__(self, msg_type: str, content: dict[str, Any]) -> None:
            self.parent = {"header": {"msg_type": msg_type}, "content": content}

        def get_parent(self, channel: str = "shell") -> dict[str, Any]:
            return self.parent

    class Shell:
        def __init__(self, kernel: Kernel) -> None:
            self.kernel = kernel

    nbclient = Shell(Kernel("execute_request", {"code": "", "allow_stdin": False}))
    lab = Shell(Kernel("execute_request", {"code": "", "allow_stdin": True}))
    click = Shell(Kernel("comm_msg", {"comm_id": "x", "data": {}}))  # a widget's callback
    assert detect_mode(nbclient, "auto") == "display"
    assert detect_mode(nbclient, "widget") == "widget"  # asked for: kept
    assert detect_mode(lab, "auto") == "widget"
    assert detect_mode(click, "auto") == "widget"
    assert (unattended(nbclient), unattended(lab), unattended(click)) == (True, False, False)
    assert (allow_stdin(nbclient), allow_stdin(lab), allow_stdin(click)) == (False, True, None)
    silent = Shell(Kernel("execute_request", {"code": ""}))  # a client that does not say
    assert (unattended(silent), allow_stdin(silent), detect_mode(silent, "auto")) == (
        False, None, "widget")


# -- Markdown blocks (what the widget and display views show) ---------------------------------------

TRICKY = [
    "Some **bold** and *slanted* and `code` and $x^2$ and [a link](http://example.com).",
    "Title\n=====\n\nA paragraph.",
    "Intro:\n\n- one\n- two *items*\n\n1. first\n2. second\n\nAfter the lists.",
    "| a | b |\n|---|---|\n| 1 | 2 |\n| 3 | 4 |\n\nThe table ended.",
    "```python\ndef f():\n    return '**not bold**'\n```\n\nAnd `x = 1` inline.",
    "Use snake_case_names and 2 * 3 * 4 and a_b here.",
    "A <b>tag</b> &amp; an entity, and a line\n---\nthat became a heading.",
    "> A quote with **bold**\n> over two lines.\n\nThen text.",
    "Price: $5 and $10 total.\n\nNext.",
    "Call **`run()`** first, then *$x$* and `stop()`.",  # emphasis right before open code / math
]


def _visible(markdown: str) -> str:
    """Rendered text of ``markdown`` (markdown-it, as a reader sees it), words only."""
    import html as html_lib

    from markdown_it import MarkdownIt

    rendered = MarkdownIt("commonmark", {"html": True}).enable(["table", "strikethrough"]).render(
        markdown
    )
    text = re.sub(r"</?(?:strong|em|code|a|span|del|s|b)\b[^>]*>", "", rendered)
    return " ".join(html_lib.unescape(re.sub(r"<[^>]+>", " ", text)).split())


@pytest.mark.parametrize("answer", TRICKY)
def test_what_a_growing_answer_shows_is_never_taken_back(answer: str) -> None:
    """Fed one character at a time, the blocks shown so far render to a prefix of the whole
    answer's rendering, and together they are the whole answer."""
    from dispatch_nb.notebook.blocks import MarkdownBlocks, stable_prefix

    final = _visible(answer)
    blocks = MarkdownBlocks(limit=40)
    finished: list[str] = []
    for ch in answer:
        blocks.feed(ch)
        done, current = blocks.take()
        finished += [b.source for b in done]
        shown = _visible("\n\n".join([*finished, stable_prefix(current.source)]))
        assert final.startswith(shown), (shown, final)
    done, current = blocks.take()
    finished += [b.source for b in done]
    whole = "\n\n".join([*finished, current.source])
    assert _visible(whole) == final

    def content(text: str) -> str:  # without the fences and empty table headers a cut adds
        cut_marks = r"```\w*|\|(   \|)+|\|?(\s*:?-+:?\s*\|)+"  # fences, headers, delimiter rows
        lines = [ln for ln in text.split("\n") if not re.fullmatch(cut_marks, ln)]
        return re.sub(r"\s+", "", "".join(lines))

    assert content(whole) == content(answer)  # nothing lost or added


def test_thinking_segments_end_between_words() -> None:
    from dispatch_nb.notebook.live_widget import _Segments

    segments = _Segments(50)
    text = " ".join(f"thought{i}" for i in range(60))
    for i in range(0, len(text), 7):
        segments.add(text[i : i + 7])
    chunks = segments.chunks
    assert len(chunks) > 5 and all(len(c) <= 50 for c in chunks)
    assert "".join(chunks) == text
    assert all(c.endswith(" ") for c in chunks[:-1])  # no word cut in two


def test_a_models_dollar_amounts_are_money_and_its_math_stays_math() -> None:
    """Pandoc's rule: "$45 and $30", "| $1.2M | $1.5M |", "$5-$10" are dollars (escaped, in the
    span MathJax skips: JupyterLab typeset "45 and the median was 30" as math and a table lost a
    cell); $x^2$, $$a+b$$, code and an escaped \\$ are left alone. The live view shows the same."""
    from dispatch_nb.notebook.blocks import MarkdownBlocks
    from dispatch_nb.render import NO_MATH, money

    d = f"<span{NO_MATH}>\\$</span>"
    assert money("It cost $45 and the median was $30.") == \
        f"It cost {d}45 and the median was {d}30."
    assert money("| EU | $1.2M | $1.5M | +25% |") == f"| EU | {d}1.2M | {d}1.5M | +25% |"
    assert money("from $5-$10") == f"from {d}5-{d}10"
    assert money("cost $45 and was $30; the area is $x^2$.") == \
        f"cost {d}45 and was {d}30; the area is $x^2$."
    for kept in ("Math: $x^2$ and $$a+b$$.", "code `$x $y` here", "```\nx = '$5'\n```",
                 "an escaped \\$5", "no dollar at all"):
        assert money(kept) == kept
    assert money("```\nprice = '$5'\n```\nthen $7") == f"```\nprice = '$5'\n```\nthen {d}7"
    run = MarkdownBlocks()
    run.feed("Revenue was $1.2M, up from $1.0M.\n\nNext paragraph")
    finished, _current, shown = run.shown(final=True)
    assert [b.source for b in finished] == [f"Revenue was {d}1.2M, up from {d}1.0M."]
    assert shown == "Next paragraph"


def test_the_live_view_streams_on_past_a_dollar_amount() -> None:
    """The live view tells money from math by the same rule as the final output (Pandoc's): text
    after an amount ("$45") is shown as it streams, not held back until its block ends; math is
    shown once closed, and a "$" ending the text (an opener, a closer or half of "$$") waits."""
    from dispatch_nb.notebook.blocks import MarkdownBlocks
    from dispatch_nb.render import NO_MATH

    d = f"<span{NO_MATH}>\\$</span>"
    for fed, shown in [("It costs $45 and the rest of it", f"It costs {d}45 and the rest of it"),
                       ("the area is $x^2$ and *so* on", "the area is $x^2$ and *so* on"),
                       ("It costs $45 and `$5` is code", f"It costs {d}45 and `$5` is code"),
                       ("the area is $x^2", "the area is"),
                       ("the area is $x^2$", "the area is"),
                       ("from $5-$10 or $", f"from {d}5-{d}10 or"),
                       ("it costs $", "it costs")]:
        run = MarkdownBlocks()
        run.feed(fed)
        assert run.shown()[2] == shown, fed
