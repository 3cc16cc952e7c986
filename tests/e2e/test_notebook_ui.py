"""What a user sees, proven in JupyterLab and Notebook 7 (each test runs in both front ends).

Every scenario runs ``%%chat`` cells in a real kernel against the loopback fakes of this test
process (the canonical ``fake`` provider, a fake GitHub for the login) and checks the DOM of the
output area in headless chromium. Screenshots go to ``test-artifacts/e2e/<scenario>-<frontend>.png``;
with DISPATCH_NB_UPDATE_DOC_IMAGES=1 the live view and the login widget are copied to docs/images/.
"""

from __future__ import annotations

import json
import re
import threading
from typing import Any

import pytest

from ..fakes.canonical import CanonicalFake
from ..fakes.copilot import CopilotFake
from ..fakes.github import FakeGitHub
from ..fakes.provider import Fail, Stall, Turn
from .harness import JupyterServer, NotebookPage, update_doc_image, wait_until

pytestmark = pytest.mark.e2e

LOAD = "%load_ext dispatch_nb"

#: A long answer with every markdown feature the live view and the final output must render.
REPORT = """# Streaming report

The answer arrives a few characters at a time, and the output area grows while it does. \
Each update carries only the block still growing, so a long answer costs linear bytes on the \
wire. Words may be **bold**, *slanted* or `inline code`, and math like $e^{i\\pi} + 1 = 0$ is \
typeset while the answer streams.

## Code

```python
def greet(name: str) -> str:
    return f"hello {name}"
```

## Steps

1. Open a notebook.
2. Run a `%%chat` cell.
3. Watch the answer render as it streams.

## Table

| model | tokens | latency |
|---|---|---|
| fake:echo | 42 | 0.3 s |
| fake:a | 7 | 0.1 s |

That is the whole report.
"""


def _words(text: str) -> str:
    """Visible text, compared word by word: whitespace collapsed (block boundaries and table cells
    show as newlines or tabs depending on the element)."""
    return " ".join(text.split())


def expected_answer_text(markdown: str) -> str:
    """What a reader sees of ``markdown`` rendered (math left out, as the sampler leaves it out)."""
    import html as html_lib

    from markdown_it import MarkdownIt

    rendered = MarkdownIt("commonmark").enable("table").render(markdown)
    text = re.sub(r"</?(?:strong|em|code|a|span|del|s)\b[^>]*>", "", rendered)  # inline
    text = re.sub(r"<[^>]+>", " ", text)  # block elements
    text = html_lib.unescape(text)
    text = re.sub(r"\$\$[^$]*\$\$|\$[^$\n]*\$", " ", text)
    return _words(text)


def _final_markdown(nb: NotebookPage, index: int) -> Any:
    """The rendered markdown (with a heading) of the cell's final output (waits for it)."""
    markdown = nb.output(index).locator(".jp-RenderedMarkdown:has(h1)")
    markdown.first.wait_for(timeout=20_000)
    return markdown.first


def _assert_report_rendered(markdown: Any) -> None:
    """The final output is real markdown: headings, a code block, a list, a table."""
    assert markdown.locator("h1").count() >= 1
    assert "Streaming report" in markdown.locator("h1").first.inner_text()
    assert markdown.locator("h2").count() >= 3
    code = markdown.locator("pre code, pre")
    assert code.count() >= 1
    assert "def greet" in code.first.inner_text()
    assert markdown.locator("ol li").count() == 3
    table = markdown.locator("table")
    assert table.count() >= 1
    assert table.first.locator("th").count() >= 3
    assert "fake:echo" in table.first.inner_text()


def test_streamed_answer_renders_markdown_while_it_streams(
    open_notebook: Any, fake: CanonicalFake, jupyter: JupyterServer
) -> None:
    """(a) a %%chat cell shows rendered Markdown from the first token; the visible text only
    grows (every sample is a prefix of the final answer), the final text is the whole answer,
    and nothing above the footer moves when the answer is complete."""
    # every piece is sent, then the stream's end waits until the live view has shown it all (so
    # a slow machine cannot skip from a half-drawn live view straight to the final output)
    shown = threading.Event()
    fake.push(Turn(text=REPORT, chunk=3, delay=0.03, input_tokens=21, output_tokens=140,
                   stall_after=-(-len(REPORT) // 3), hold=shown))
    nb = open_notebook([LOAD, "%%chat\nWrite a short report with a heading, code and a table."])
    nb.run(0)
    nb.start_answer_sampling(1, interval_ms=40)
    try:
        before = nb.start(1)
        # mid-stream: the code block and the list are rendered while the cell still runs
        wait_until(
            lambda: nb.prompt(1) == "[*]:"
            and nb.output(1).locator(".jp-RenderedMarkdown ol li").count() >= 2,
            40, 0.03, "the live view to render the code block and the list",
        )
        # a taller window for the picture, so it shows the status line below the growing answer
        nb.page.set_viewport_size({"width": 1200, "height": 1250})
        nb.page.wait_for_timeout(150)
        shot = nb.screenshot("live-view", upto_cell=1)
        nb.page.set_viewport_size({"width": 1200, "height": 900})
        if jupyter.frontend.name == "lab":
            update_doc_image(shot, "live-view.png")
        wait_until(lambda: nb.answer_sampled(
                       lambda s: s.live and "That is the whole report." in _words(s.text)),
                   40, 0.05, "the live view to show the answer's last line")
    finally:
        shown.set()
    nb.wait_done(1, before, timeout=60)
    nb.page.wait_for_timeout(300)
    samples = nb.stop_answer_sampling()
    markdown = _final_markdown(nb, 1)
    _assert_report_rendered(markdown)
    # the live view was replaced by one static output: no widget is left in the cell
    assert nb.output(1).locator(".jupyter-widgets, .widget-output").count() == 0
    nb.screenshot("final-markdown")

    final = _words(samples[-1].text)
    assert final == expected_answer_text(REPORT), "the final output does not show the whole answer"
    # (a sample of only whitespace — the live view's empty frame — shows no text yet)
    live = [s._replace(text=_words(s.text)) for s in samples if s.running and _words(s.text)]
    assert len({s.text for s in live}) >= 10, "the answer did not visibly grow"
    for s in live:
        assert final.startswith(s.text), (
            f"at {s.ms:.0f} ms the page showed what it took back: {s.text[-200:]}"
        )
    seen = {tag for s in live for tag, on in s.has.items() if on}
    assert {"h1", "h2", "pre", "li", "table", "strong", "code"} <= seen, seen
    # rendered from the first token: the heading is a heading as soon as any text is visible
    assert live[0].has["h1"], f"the first text was not rendered Markdown: {live[0]}"
    # no jump at the end: the answer's first heading stays where it was
    tops = [s.top for s in live if s.top is not None]
    final_top = samples[-1].top
    assert tops and final_top is not None, (tops, final_top)
    assert abs(final_top - tops[-1]) <= 6, f"the answer moved when it completed: {tops[-1]} → {final_top}"
    on_screen = [s for s in samples if s.live]  # the live view itself, not the final output yet
    assert_blocks_stay(on_screen[-1].blocks, samples[-1].blocks)


def assert_blocks_stay(
    live: list[tuple[str, float]], final: list[tuple[str, float]], at_least: int = 8
) -> None:
    """Every block the live view showed last (headings, paragraphs, lists, code, tables) is the
    same block at the same height in the final output: nothing below the first heading moves."""
    assert len(live) >= at_least, f"the live view showed too few blocks to compare: {live}"
    assert [tag for tag, _ in final[: len(live)]] == [tag for tag, _ in live], (
        f"the final output's blocks are not the live view's:\nlive:  {live}\nfinal: {final}"
    )
    moved = [
        f"{tag} #{i}: {was:.1f} → {now:.1f} px"
        for i, ((tag, was), (_, now)) in enumerate(zip(live, final, strict=False))
        if abs(now - was) > 1
    ]
    assert not moved, "blocks moved when the answer completed:\n" + "\n".join(moved)


#: A code block four times longer than the growing block may be: it streams in pieces.
LONG_CODE = "Some code:\n\n```python\n" + "".join(
    f"value_{i} = compute_something({i}, factor={i * 3})  # step {i}\n" for i in range(40)
) + "```\n\nDone.\n"

#: The top of every ``value_N`` in the code of a cell's output (px from the top of the cell).
_CODE_LINE_TOPS_JS = """
(index) => {
  const notebook = [...document.querySelectorAll('.jp-Notebook')]
    .find((el) => el.offsetParent !== null);
  const cell = notebook.querySelectorAll('.jp-Cell')[index];
  const cellTop = cell.getBoundingClientRect().top;
  const tops = {};
  const walker = document.createTreeWalker(cell.querySelector('.jp-OutputArea'),
                                           NodeFilter.SHOW_TEXT);
  for (let node = walker.nextNode(); node; node = walker.nextNode()) {
    if (!node.parentElement.closest('pre')) continue;
    for (const match of node.data.matchAll(/value_(\\d+)/g)) {
      const range = document.createRange();
      range.setStart(node, match.index);
      range.setEnd(node, match.index + match[0].length);
      if (!(match[1] in tops)) tops[match[1]] = range.getBoundingClientRect().top - cellTop;
    }
  }
  return tops;
}
"""


@pytest.mark.parametrize("live", ["widget", "display"])
def test_a_long_code_block_streams_without_seams(
    open_notebook: Any, fake: CanonicalFake, live: str
) -> None:
    """A code block longer than a block may grow is sent in pieces (the fence closed and
    reopened). The widget view hides the seams: every line of code sits where it will in the
    final output, nothing jumps. The display view's status line is below the code, never in it
    (its pieces are outputs of their own, with the front end's spacing between them)."""
    shown = threading.Event()
    fake.push(Turn(text=LONG_CODE, chunk=8, delay=0.01, stall_after=-(-len(LONG_CODE) // 8),
                   hold=shown))
    nb = open_notebook([LOAD + f"\n%config ChatMagics.live = {live!r}", "%%chat\nLong code."],
                       name=f"long-code-{live}")
    nb.run(0)
    nb.start_watching(1, r"<sub>[^\n]*|\*\*fake")  # a raw status line, however briefly
    try:
        before = nb.start(1)
        wait_until(lambda: nb.prompt(1) == "[*]:" and "Done." in nb.output_text(1),
                   40, 0.05, "the live view to show the whole answer")
        nb.page.wait_for_timeout(300)
        pieces = nb.output(1).locator(".jp-RenderedMarkdown pre").count()
        live_tops = nb.page.evaluate(_CODE_LINE_TOPS_JS, 1)
        text = nb.output_text(1)
        nb.screenshot(f"long-code-{live}-live", upto_cell=1)
    finally:
        shown.set()
    nb.wait_done(1, before, timeout=60)
    nb.page.wait_for_timeout(300)
    nb.screenshot(f"long-code-{live}-final", upto_cell=1)
    final_tops = nb.page.evaluate(_CODE_LINE_TOPS_JS, 1)
    assert nb.output(1).locator(".jp-RenderedMarkdown pre").count() == 1
    assert pieces >= 4, f"the code block was not sent in pieces ({pieces} code blocks)"
    raw = nb.stop_watching()
    assert not raw, f"the status line was shown raw: {raw}"
    assert "<sub>" not in text and "streaming" in text, f"the status line is raw:\n{text}"
    if live == "display":
        return
    assert sorted(live_tops, key=int) == [str(i) for i in range(40)], live_tops
    assert sorted(final_tops, key=int) == [str(i) for i in range(40)], final_tops
    moved = [f"value_{i}: {live_tops[i]:.1f} → {final_tops[i]:.1f} px"
             for i in sorted(live_tops, key=int) if abs(live_tops[i] - final_tops[i]) > 1]
    assert not moved, "code lines moved when the answer completed:\n" + "\n".join(moved)


def test_notes_stay_and_a_retry_is_one_quiet_line(
    open_notebook: Any, fake: CanonicalFake, jupyter: JupyterServer
) -> None:
    """(6, 7) an interpolation note stays above the answer, in the final output and the saved
    notebook, and neither it nor the answer below it moves when the answer completes; a 429 shows
    as one quiet status line while the cell waits, then as a note in the footer — never as a red
    stderr box, and never saved."""
    answer = "# After a retry\n\nThe answer, after one retry.\n\n## Then\n\nMore text."
    # the stream pauses once the second heading is sent, until the live view has shown it
    shown = threading.Event()
    then_sent = -(-(answer.index("## Then") + len("## Then")) // 4)  # pieces of 4 characters
    fake.push(
        Fail(429, "slow down", "rate_limit_error", headers={"retry-after": "1.5"}),
        Turn(text=answer, chunk=4, delay=0.04, stall_after=then_sent, hold=shown),
    )
    nb = open_notebook([LOAD, "%%chat\nExplain {nope} please."])
    nb.run(0)
    nb.start_watching(1, r"retrying in \d+ s|retried once \([^)]*\)")
    nb.start_answer_sampling(1, interval_ms=40)
    try:
        before = nb.start(1)
        wait_until(lambda: "retrying in" in nb.output_text(1), 30, 0.05, "the retry status line")
        nb.screenshot("retry-status", element=nb.cell(1))
        wait_until(lambda: nb.answer_sampled(lambda s: s.live and "Then" in s.text), 30, 0.05,
                   "the live view to show the second heading")
    finally:
        shown.set()
    nb.wait_done(1, before, timeout=60)
    nb.page.wait_for_timeout(300)
    samples = nb.stop_answer_sampling()
    seen = nb.stop_watching()
    live = [s for s in samples if s.live and "Then" in s.text]
    assert live and not samples[-1].live, "the live view never showed the second heading"
    assert_blocks_stay(live[-1].blocks, samples[-1].blocks, at_least=4)
    assert any(s.startswith("retrying in") for s in seen), seen
    text = nb.output_text(1)
    assert "The answer, after one retry." in text
    assert "{nope} was left as written" in text
    assert text.index("{nope} was left as written") < text.index("The answer, after one retry.")
    assert "retried once (rate limited, HTTP 429)" in text
    assert "retrying in" not in text and "WARNING" not in text
    assert nb.output(1).locator("[data-mime-type='application/vnd.jupyter.stderr']").count() == 0
    nb.screenshot("notes-and-retry", element=nb.cell(1))
    saved = nb.save()
    outputs = saved["cells"][1]["outputs"]
    assert not [o for o in outputs if o.get("output_type") == "stream"], outputs
    [final] = [o for o in outputs if "text/markdown" in (o.get("data") or {})]
    markdown = "".join(final["data"]["text/markdown"])
    assert "{nope} was left as written" in markdown
    assert "retried once (rate limited, HTTP 429)" in markdown


def _login_in_cell(nb: NotebookPage, index: int, github: FakeGitHub, scenario: str) -> str:
    """Run cell ``index`` (which needs a login) and act as the user: check the login widget
    (code, link, countdown, still running), then approve on the fake GitHub. Waits for the cell
    to finish; returns the GitHub token the fake issued."""
    issued = len(github.authorizations)
    nb.start_watching(index, r"approved|logged in[^.]*")
    before = nb.start(index)
    auth = wait_until(
        lambda: len(github.authorizations) > issued and github.authorizations[-1],
        30, 0.05, "the kernel to request a device code",
    )
    # the code, the link and the countdown are separate widgets: each update arrives on its own
    nb.wait_output(index, lambda t: auth.user_code in t and "expires in" in t, 20,
                   "the user code and the countdown")
    link = nb.output(index).locator("a[href*='/login/device']")
    wait_until(lambda: link.count() >= 1, 10, 0.05, "the verification link")
    assert link.first.get_attribute("href") == f"{github.github_url}/login/device"
    assert link.first.is_visible()
    # the code is shown large (its own element, bigger than the surrounding text)
    code = nb.output(index).get_by_text(auth.user_code, exact=True)
    assert code.count() >= 1 and code.first.is_visible()
    size = float(code.first.evaluate("el => parseFloat(getComputedStyle(el).fontSize)"))
    body = float(link.first.evaluate("el => parseFloat(getComputedStyle(el).fontSize)"))
    assert size > 1.5 * body, f"the user code is not large: {size}px vs {body}px"
    assert nb.prompt(index) == "[*]:", "the cell finished before the user approved"
    shot = nb.screenshot(scenario, element=nb.cell(index))
    if scenario == "login-pending-chat" and nb.frontend == "lab":
        update_doc_image(shot, "login-widget.png")
    token: str = github.approve(auth.user_code, login="octocat")
    nb.wait_done(index, before, timeout=60)
    nb.wait_output(index, lambda t: "octocat" in t, 10, "the approved user")
    seen = nb.stop_watching()
    assert any("approved" in s.lower() for s in seen), f"never showed 'approved': {seen}"
    assert token not in nb.page.content(), "the GitHub token is on the page"
    return token


def test_login_widget_approves_and_cell_completes(
    open_notebook: Any, github_fake: FakeGitHub
) -> None:
    """(b) `%chat login`: the widget shows the code and link, turns to approved, cell completes."""
    nb = open_notebook([LOAD, "%chat logout", "%chat login"])
    nb.run(0)
    nb.run(1)
    _login_in_cell(nb, 2, github_fake, "login-widget")
    assert "error" not in nb.output_text(2).lower()
    nb.screenshot("login-approved")


def test_pending_chat_cell_logs_in_then_answers(
    open_notebook: Any, copilot: CopilotFake, github_fake: FakeGitHub
) -> None:
    """(b) a Copilot %%chat cell without a login shows the login, then answers by itself."""
    copilot.push(Turn(text="# After the login\n\nThe pending cell went on **by itself**.",
                      chunk=4, delay=0.02))
    nb = open_notebook([LOAD, "%chat logout", "%%chat -m copilot:gpt-4.1\nHello after login."])
    nb.run(0)
    nb.run(1)
    token = _login_in_cell(nb, 2, github_fake, "login-pending-chat")
    markdown = _final_markdown(nb, 2)
    assert "After the login" in markdown.locator("h1").first.inner_text()
    assert markdown.locator("strong").first.inner_text() == "by itself"
    # the answer came from the Copilot API with a Copilot token exchanged for the new login
    assert copilot.chat_requests, "the cell never reached the Copilot API"
    assert copilot.github.check_copilot_token(copilot.bearer_of(copilot.chat_requests[-1]) or "")
    assert token not in nb.page.content()
    nb.screenshot("login-pending-chat-answered")


def test_compare_renders_columns(open_notebook: Any, fake: CanonicalFake) -> None:
    """(c) -m a,b streams side by side in columns, each headed by its model while it streams,
    then leaves a comparison table."""
    answer = (
        "A measured answer that streams for a little while, so that both columns are visible "
        "side by side and each one grows on its own, with its own usage and latency at the end."
    )
    # both streams pause a dozen pieces in (past "A measured") until the test has seen the two
    # columns stream: a busy machine cannot skip from an empty cell to the finished table
    shown = threading.Event()
    fake.push(*(Turn(text=answer, chunk=4, delay=0.04, stall_after=12, hold=shown)
                for _ in range(2)))
    nb = open_notebook([LOAD, "%%chat -m fake:a,fake:b\nCompare yourselves."])
    nb.run(0)
    before = nb.start(1)
    out = nb.output(1)

    def columns() -> list[Any]:
        """The two column headers' boxes, once both columns show streamed text."""
        if nb.prompt(1) != "[*]:" or nb.output_text(1).count("A measured") < 2:
            return []
        boxes = []
        for label in ("fake:a", "fake:b"):
            hit = out.get_by_text(label, exact=False)
            box = hit.first.bounding_box() if hit.count() else None
            if box is None:
                return []
            boxes.append(box)
        # where the streamed text of each column is
        texts = out.locator(".jp-RenderedMarkdown", has_text="A measured answer").evaluate_all(
            "els => els.map(el => el.getBoundingClientRect()).filter(r => r.width > 0)"
            ".map(r => ({x: r.x, y: r.y}))"
        )
        return [*boxes, texts] if len(texts) >= 2 and nb.prompt(1) == "[*]:" else []

    try:
        a, b, texts = wait_until(columns, 30, 0.03, "both model columns to stream")
        assert abs(a["y"] - b["y"]) < 40 and b["x"] - a["x"] > 200, (
            f"the models are not side by side: {a} {b}"
        )
        # each column is headed by its model: the name sits above the text streaming below it
        for header in (a, b):
            below = [t for t in texts if abs(t["x"] - header["x"]) < 40]
            assert below and all(header["y"] + header["height"] <= t["y"] + 1 for t in below), (
                f"no model header above the column's text: {header} {texts}"
            )
        nb.screenshot("compare-live")
    finally:
        shown.set()
    nb.wait_done(1, before, timeout=60)
    table = out.locator("table")
    table.first.wait_for(timeout=20_000)
    text = table.first.inner_text()
    assert "fake:a" in text and "fake:b" in text
    assert nb.output_text(1).count(answer) == 2, "each model's answer belongs in the final output"
    nb.screenshot("compare")


def test_error_is_a_short_message(open_notebook: Any, fake: CanonicalFake) -> None:
    """(d) an expected error (401) is a short readable message with the fix, not a traceback."""
    fake.push(Fail(401, "Bad credentials", "authentication_error"))
    nb = open_notebook([LOAD, "%%chat\nHello?"])
    nb.run(0)
    text = nb.run(1).strip()
    assert text, "the error left no message"
    assert "Traceback" not in text
    lines = [line for line in text.splitlines() if line.strip()]
    assert len(lines) <= 8, f"the error message is too long ({len(lines)} lines):\n{text}"
    assert re.search(r"401|authenticat|credential|log ?in|key", text, re.I), text
    nb.screenshot("error")


def test_saved_notebook_reopens_with_markdown(
    open_notebook: Any, fake: CanonicalFake, jupyter: JupyterServer
) -> None:
    """(e) saved, kernel stopped, page reloaded: the final markdown is still there."""
    fake.push(Turn(text=REPORT, chunk=40, delay=0.01))
    nb = open_notebook([LOAD, "%%chat\nThe report again."])
    nb.run(0)
    nb.run(1)
    _assert_report_rendered(_final_markdown(nb, 1))
    saved = nb.save()
    outputs = saved["cells"][1]["outputs"]
    assert any("text/markdown" in (o.get("data") or {}) for o in outputs), outputs
    # the saved result needs no widget state (GitHub, nbviewer and VS Code show it as is)
    assert not any(
        "application/vnd.jupyter.widget-view+json" in (o.get("data") or {}) for o in outputs
    ), outputs
    # stop the kernel that produced the output, then reopen the notebook from disk
    old_kernel = jupyter.session_for(nb.path)["kernel"]["id"]  # type: ignore[index]
    jupyter.shutdown_kernels()
    wait_until(lambda: not jupyter.listing("/api/kernels"), 20, 0.2, "the kernel to stop")
    nb.reload()
    # the reopened page renders its outputs a moment after the cells appear (a loaded machine
    # showed the heading's element before its text)
    wait_until(lambda: "Streaming report" in nb.output_text(1), 30, 0.1,
               "the reopened notebook to show the saved answer")
    _assert_report_rendered(_final_markdown(nb, 1))
    assert all(k["id"] != old_kernel for k in jupyter.listing("/api/kernels"))
    # the front end starts a fresh kernel for the reopened notebook: stop that one too, and the
    # output is still there (it comes from the file, not from any kernel or widget state)
    nb.server.wait_kernel_idle(nb.path)
    jupyter.shutdown_kernels()
    wait_until(lambda: not jupyter.listing("/api/kernels"), 20, 0.2, "the new kernel to stop")
    nb.page.wait_for_timeout(500)
    _assert_report_rendered(_final_markdown(nb, 1))
    text = nb.output_text(1)
    assert "Error displaying widget" not in text and "model not found" not in text.lower()
    nb.screenshot("reopened")


#: In the page: the progress widget's counters (the text right of the bar), and on how many
#: lines that text is drawn.
_PROGRESS_JS = """
(out) => {
  const gauge = out.querySelector('.widget-hprogress, .widget-progress');
  if (!gauge) return null;
  const counters = gauge.parentElement.lastElementChild;
  const tops = new Set();
  const walker = document.createTreeWalker(counters, NodeFilter.SHOW_TEXT);
  for (let node = walker.nextNode(); node; node = walker.nextNode()) {
    const range = document.createRange();
    range.selectNodeContents(node);
    for (const r of range.getClientRects()) if (r.width > 0) tops.add(Math.round(r.top));
  }
  return [counters.innerText, tops.size];
}
"""


def test_each_progress_is_one_line_and_its_table_counts_from_zero(
    open_notebook: Any, fake: CanonicalFake
) -> None:
    """(issue 23) ``%%chat --each``: the progress bar's counters stay on one line and show one
    rate (the rows actually sent), the result table numbers its rows from 0 like ``res[i]``, and a
    template that names nothing stops the cell before any bar shows."""
    for i in range(8):  # rows are not streamed: each answer arrives whole, one after another
        fake.push(Stall(1.0 + 0.6 * i))
    words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta"]
    nb = open_notebook([LOAD, f"words = {words!r}", "%%chat --each words -o res\nSay {row}",
                        "%%chat --each words\nSay {typo}"])
    nb.run(0)
    nb.run(1)
    before = nb.start(2)
    out = nb.output(2)
    seen: list[tuple[str, int]] = wait_until(
        lambda: (p := out.evaluate(_PROGRESS_JS)) and "ETA" in p[0] and [p], 40, 0.05,
        "the progress bar to show a rate and an ETA",
    )
    nb.screenshot("each-progress", element=nb.cell(2))
    text, lines = seen[0]
    assert lines == 1, f"the progress counters take {lines} lines: {text!r}"
    assert len(re.findall(r"rows?/s|s/rows?", text)) == 1, f"not one rate: {text!r}"
    nb.wait_done(2, before, timeout=60)
    rows = out.locator("table tr")
    assert rows.nth(1).locator("td").first.inner_text().strip() == "0"
    assert rows.nth(8).locator("td").nth(1).inner_text().strip() == "theta"
    nb.screenshot("each-table", element=nb.cell(2))
    sent = len(fake.chat_requests)
    text = nb.run(3)
    assert "UsageError" in text and "{typo} names nothing" in text, text
    assert "batch" not in text and "%" not in text, f"a progress bar before the error: {text!r}"
    assert len(fake.chat_requests) == sent
def test_a_large_each_waits_for_the_button(open_notebook: Any, fake: CanonicalFake) -> None:
    """(e) `--each` over more rows than ChatMagics.confirm_rows shows the row count and the
    estimate with a button; nothing is sent until it is clicked, then the rows run in the cell,
    whose saved outputs are the question as text and the table: no widget."""
    nb = open_notebook([LOAD + "\nrows = ['one', 'two', 'three', 'four', 'five']",
                        "%config ChatMagics.confirm_rows = 3",
                        "%%chat --each rows -o res\nSay {row}"])
    nb.run(0)
    nb.run(1)
    before = len(fake.chat_requests)
    prompt = nb.start(2)
    button = nb.output(2).get_by_role("button", name="Send 5 rows")
    button.wait_for(timeout=30_000)
    assert "5 rows" in nb.output_text(2) and "confirm_rows = 3" in nb.output_text(2)
    assert len(fake.chat_requests) == before, "rows were sent before the confirmation"
    nb.screenshot("each-confirm")
    button.click()
    nb.wait_done(2, prompt, timeout=60)
    nb.wait_output(2, lambda text: "5 rows: 5 ok" in text, timeout=60)
    sent = [fake.last_user_text(r) for r in fake.chat_requests[before:]]
    assert sorted(sent) == sorted(f"Say {w}" for w in ("one", "two", "three", "four", "five"))
    assert "echo: Say three" in nb.output_text(2)
    nb.screenshot("each-confirmed")
    outputs = nb.save()["cells"][2]["outputs"]
    assert not any("application/vnd.jupyter.widget-view+json" in o.get("data", {})
                   for o in outputs), outputs
    saved = json.dumps(outputs)
    assert "--each has 5 rows" in saved and "Confirmed." in saved and "echo: Say three" in saved


def test_a_models_dollar_amounts_are_money_and_its_math_is_math(
    open_notebook: Any, fake: CanonicalFake
) -> None:
    """An answer about money ("$45 and $30", a table of "$1.2M | $1.5M") reads as dollars in
    JupyterLab and Notebook 7 — no text swallowed by math, no table cell lost — while the same
    answer's $x^2$ is still typeset (render.money, Pandoc's rule)."""
    answer = ("The average order cost $45 and the median was $30; the area is $x^2$.\n\n"
              "| region | 2024 | 2025 | change |\n|---|---|---|---|\n"
              "| EU | $1.2M | $1.5M | +25% |\n")
    fake.push(Turn(text=answer, chunk=7, delay=0.01))
    nb = open_notebook([LOAD, "%%chat\nSummarize the sales."])
    nb.run(0)
    nb.run(1)
    out = nb.output(1)
    table = out.locator("table")
    table.wait_for(state="visible", timeout=30_000)
    text = nb.wait_output(1, lambda t: "+25%" in t, 30, "the final answer")
    assert "The average order cost $45 and the median was $30" in text, text
    assert table.locator("tr").last.locator("td").count() == 4  # no cell swallowed by "math"
    assert "$1.2M" in table.inner_text() and "$1.5M" in table.inner_text()
    assert out.locator("mjx-container, .MathJax").count() >= 1  # $x^2$ is math
    assert table.locator("mjx-container, .MathJax").count() == 0
    nb.screenshot("money")


def test_dollar_amounts_stay_dollars_not_latex(open_notebook: Any, fake: CanonicalFake) -> None:
    """Two amounts in one paragraph (a replayed answer's footer: ``$… when recorded, $0 now``)
    are dollars: the front end's math typesetting must not take the text between them for LaTeX
    (the library escapes them, docs/notebook.md "Final output")."""
    code = ("from decimal import Decimal\nfrom dispatch_nb import Response, TextBlock\n"
            "from dispatch_nb.cost import Cost\n"
            "Response(content=[TextBlock(text='Hello.')], model='gpt-4.1',\n"
            "         cost=Cost(usd=Decimal('0.00008'), replayed=True))")
    # Markdown outputs (no HTML): a %%chat footer, and the %chat cost table and notes
    footer = ("from IPython.display import Markdown\nfrom dispatch_nb.render import small\n"
              "Markdown('The answer: $x^2$ is math.' + small('$0.000080 when recorded, $0 now'))")
    spent = ("%load_ext dispatch_nb\nfrom decimal import Decimal\n"
             "from dispatch_nb.cost import Cost, ledger\nfrom dispatch_nb.types import Usage\n"
             "ledger.clear()\nledger.record('openai', 'gpt-4.1', Usage(input_tokens=12, "
             "output_tokens=7), Cost(usd=Decimal('0.00008')))\n"
             "ledger.record('openai', 'gpt-4.1', Usage(input_tokens=12, output_tokens=7), "
             "Cost(usd=Decimal('0.00008')), replayed=True)")
    nb = open_notebook([code, footer, spent, "%chat cost"])
    for index in (0, 1):
        nb.run(index)
        sub = nb.cell(index).locator(".jp-OutputArea-output sub")
        sub.wait_for(state="visible", timeout=30_000)
        assert "$0.000080 when recorded, $0 now" in sub.inner_text()
        assert sub.locator("mjx-container, .MathJax, .katex").count() == 0
    # the Markdown outside the footer is still typeset: only the library's own text is plain
    assert nb.cell(1).locator("mjx-container, .MathJax").count() >= 1
    nb.run(2)
    nb.run(3)
    table = nb.cell(3).locator(".jp-OutputArea-output table")
    table.wait_for(state="visible", timeout=30_000)
    # every column is there, none swallowed by "math" (no cached or premium-requests column: no
    # answer had one): model, calls, tokens in, out, USD, replayed (saved)
    assert table.locator("th").count() == 6
    text = nb.cell(3).locator(".jp-OutputArea-output").inner_text()
    assert "$0.000080" in text and "Spent in this kernel: $0.000080." in text.replace("**", "")
    assert nb.cell(3).locator("mjx-container, .MathJax, .katex").count() == 0
    nb.screenshot("dollars", upto_cell=3)
