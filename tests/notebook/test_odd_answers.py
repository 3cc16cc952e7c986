"""Awkward answers as a person sees them: raw HTML in an answer, an answer cut inside a code block,
control characters in a terminal (what a data scientist's pass with odd input found)."""

from __future__ import annotations

import re
from typing import Any

import pytest

from dispatch_nb.render import markdown_to_html
from tests.fakes.provider import ToolCall, Turn
from tests.notebook.conftest import run

#: an answer that quotes HTML: a script, an event handler, tags that would close the output's own
#: elements, a comment; and the same HTML as code, which must stay code
HTML_ANSWER = (
    "Try <script>alert(1)</script> and <img src=x onerror=alert(2)> then </div></details>\n"
    "<!-- hidden --> a < b and x<5, <https://example.com>, `<b>in a span</b>`\n\n"
    "```html\n<div class=\"kept\">code</div>\n```\n"
)

#: tags a front end would create from the answer (a renderer shows &lt;tag> as text)
_ACTIVE = re.compile(r"<(script|img|/div|/details|!--)", re.I)


def _rendered(markdown: str) -> str:
    html = markdown_to_html(markdown)
    assert html is not None  # markdown-it-py is installed with the notebook extra
    return html


@pytest.mark.parametrize("live", ["display", "widget"])
def test_raw_html_in_an_answer_reads_as_text_and_never_runs(shell: Any, fake: Any, live: str) -> None:
    run(shell, f'%config ChatMagics.live = "{live}"')
    fake.push(Turn(text=HTML_ANSWER, chunk=7))
    result = run(shell, "%%chat\nquote some HTML")
    assert result.success, result.error_in_exec
    [output] = shell.front.outputs
    markdown = output["data"]["text/markdown"]
    html = _rendered(markdown)
    assert not _ACTIVE.search(html), html
    # ... it is all there, as text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "&lt;img src=x onerror=alert(2)&gt;" in html and "&lt;/div&gt;&lt;/details&gt;" in html
    assert "a &lt; b and x&lt;5" in html and '<a href="https://example.com">' in html
    # code stays code: its < are the code's own
    assert "<code>&lt;b&gt;in a span&lt;/b&gt;</code>" in html
    assert "&lt;div class=&quot;kept&quot;&gt;code&lt;/div&gt;" in html
    assert "<sub" in html.rsplit("</pre>", 1)[1]  # the footer is rendered, after the code
    assert output["data"]["text/plain"].startswith("Try <script>alert(1)</script>")  # text as sent
    if live == "display":  # every live update of the answer was as inert
        for kind, body in shell.front.messages:
            if kind != "clear" and "text/markdown" in body["data"]:
                assert not _ACTIVE.search(_rendered(body["data"]["text/markdown"])), body


def test_the_widget_view_shows_raw_html_as_text_while_it_streams(shell: Any, fake: Any) -> None:
    from dispatch_nb.notebook.live_widget import WidgetView
    from dispatch_nb.types import StreamDelta

    view = WidgetView(["fake:echo"])
    view.start([])
    view.feed(0, StreamDelta(type="text_delta", text="Hi <img src=x onerror=alert(1)> and <scr"))
    assert view.tick() is None
    [box] = view.columns[0].body.children
    [output] = box.children[0].outputs
    shown = output["data"]["text/markdown"]
    assert shown == "Hi &lt;img src=x onerror=alert(1)> and"  # (the rest is held: it may grow)
    assert not _ACTIVE.search(_rendered(shown))
    view.close()


@pytest.mark.parametrize(
    ("markdown", "inert"),
    [
        ("a <scr", "a &lt;scr"),  # a tag still growing is text already
        ("x</", "x</"),  # (no tag name yet: nothing a renderer would open)
        ("<p>hi</p>", "&lt;p>hi&lt;/p>"),
        ("a<b and a < b", "a&lt;b and a < b"),
        ("<?php x ?> <!DOCTYPE html>", "&lt;?php x ?> &lt;!DOCTYPE html>"),
        ("see <mailto:a@b.c> or <https://x.y/?a=<p>>", "see <mailto:a@b.c> or <https://x.y/?a=&lt;p>>"),
        ("`<b>` and ``<i>``", "`<b>` and ``<i>``"),
        ("$a<b$ but <b/>", "$a<b$ but <b/>"),  # math is not HTML
        # formatting tags models write (a table cell's <br>) stay tags, but not with attributes
        ("| a<br>b | x<sup>2</sup> |", "| a<br>b | x<sup>2</sup> |"),
        ("<KBD>Ctrl</KBD> <br/> <b onclick=x>", "<KBD>Ctrl</KBD> <br/> &lt;b onclick=x>"),
        ("<bdi>x</bdi> <br", "&lt;bdi>x&lt;/bdi> &lt;br"),
        ("- item\n    ```\n    <b>\n    ```", "- item\n    ```\n    <b>\n    ```"),
        # code is what CommonMark calls code: "```bash```" is a code span, not a fence, so the
        # tag after it is read as a tag; a backtick before a blank line opens no code span
        ("```bash```\n\n<img src=x>", "```bash```\n\n&lt;img src=x>"),
        ("Use ` here.\n\n<img src=x>\n\nand ` there", "Use ` here.\n\n&lt;img src=x>\n\nand ` there"),
        ("- item\n\n      ```\n      x\n\n<img src=x>", "- item\n\n      ```\n      x\n\n&lt;img src=x>"),
        # an indented code block (in a list item too) keeps its < as they are
        ("code:\n\n    <div>x</div>\n\nafter", "code:\n\n    <div>x</div>\n\nafter"),
        ("1. step\n\n        <html>\n", "1. step\n\n        <html>\n"),
    ],
)
def test_inert_html(markdown: str, inert: str) -> None:
    from dispatch_nb.render import inert_html

    assert inert_html(markdown) == inert


def test_an_answer_cut_off_inside_a_code_block_keeps_its_footer_outside_it(
    shell: Any, fake: Any
) -> None:
    run(shell, '%config ChatMagics.live = "display"')
    fake.push(Turn(text="Here is the code:\n\n```python\nfor i in range(3):\n    print(i",
                   stop_reason="max_tokens"))
    result = run(shell, "%%chat -o answer\nwrite a loop")
    assert result.success, result.error_in_exec
    [output] = shell.front.outputs
    html = _rendered(output["data"]["text/markdown"])
    code, after = html.rsplit("</code></pre>", 1)
    assert "print(i" in code and "<sub" not in code
    assert "<sub" in after and "max_tokens" in after  # the footer says why the answer stops there
    # the Response kept by -o shows the same way (its own Markdown)
    kept = _rendered(shell.user_ns["answer"]._repr_markdown_())
    assert "<sub" in kept.rsplit("</code></pre>", 1)[1]


def test_history_quotes_html_and_open_code_blocks_without_spilling(shell: Any, fake: Any) -> None:
    run(shell, '%config ChatMagics.live = "display"')
    fake.push(Turn(text="<details><summary>x</summary> never closed"),
              Turn(text="```\nunclosed"))
    run(shell, "%%chat\nfirst <div>")
    run(shell, "%%chat\nsecond")
    run(shell, "%chat history")
    html = _rendered(shell.front.markdown[0])
    assert "<details" not in html and "<div" not in html
    assert "&lt;details&gt;&lt;summary&gt;x&lt;/summary&gt; never closed" in html
    # the second turn's open code block ends inside its own quote
    assert html.rstrip().endswith("</code></pre>\n</blockquote>")


def test_a_tool_result_with_a_fence_stays_in_its_code_block(shell: Any, fake: Any) -> None:
    run(shell, '%config ChatMagics.live = "display"')

    def lookup(topic: str) -> str:
        """Look a topic up."""
        return "line one\n```\n<img src=x onerror=alert(3)>\n" + "long " * 60

    shell.user_ns["lookup"] = lookup
    fake.push(Turn(tool_calls=[ToolCall("c1", "lookup", {"topic": "x"})]), Turn(text="done"))
    result = run(shell, "%%chat --tools lookup\nlook it up")
    assert result.success, result.error_in_exec
    [output] = shell.front.outputs
    html = _rendered(output["data"]["text/markdown"])
    assert "<img" not in html and "&lt;img src=x onerror=alert(3)&gt;" in html


def test_the_terminal_shows_control_characters_of_an_answer_and_obeys_none(
    shell: Any, fake: Any, capsys: Any
) -> None:
    run(shell, '%config ChatMagics.live = "text"')
    fake.push(Turn(text="title\x1b]0;pwned\x07 red\x1b[31mRED\x1b[0m nul\x00 del\x7f csi\x9b2J\r\nend",
                   chunk=3))
    result = run(shell, "%%chat\nanswer oddly")
    assert result.success, result.error_in_exec
    out = capsys.readouterr().out
    assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]", out), repr(out)
    assert "title␛]0;pwned␇ red␛[31mRED␛[0m nul␀ del␡ csi\ufffd2J\nend" in out


def test_a_changed_base_url_reaches_the_next_cell(
    shell: Any, fake: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``%env DISPATCH_NB_COMPATIBLE_BASE_URL=...`` between two cells: the second went to the
    first server anyway (the kernel kept the adapter made for it); with OPENAI_BASE_URL and a
    key, the error then said the key was for the new server so it was not sent to the old one."""
    from tests.fakes.openai_chat import OpenAIChatFake

    run(shell, '%config ChatMagics.live = "display"')
    with OpenAIChatFake() as first, OpenAIChatFake() as second:
        monkeypatch.setenv("DISPATCH_NB_COMPATIBLE_BASE_URL", first.base_url)
        assert run(shell, "%%chat -m compatible:llama3\none").success
        monkeypatch.setenv("DISPATCH_NB_COMPATIBLE_BASE_URL", second.base_url)
        result = run(shell, "%%chat -m compatible:llama3\ntwo")
        assert result.success, result.error_in_exec
        assert [len(first.chat_requests), len(second.chat_requests)] == [1, 1]
        assert "echo: two" in shell.front.outputs[0]["data"]["text/markdown"]


def test_a_value_split_by_a_space_gets_the_quoted_spelling(shell: Any, fake: Any) -> None:
    """``-m a, b`` (a space after the comma) and ``%chat history my thread`` said only
    "unrecognized arguments: b": which option the stray word belonged to was left to guess."""
    from IPython.core.error import UsageError

    with pytest.raises(UsageError, match=r'unrecognized arguments: fake:b \(a value with spaces '
                                         r'goes in quotes: -m "fake:a, fake:b"\)\nusage: %%chat'):
        shell.run_cell_magic("chat", "-m fake:a, fake:b", "hi")
    with pytest.raises(UsageError, match=r'unrecognized arguments: thread \(a value with spaces '
                                         r'goes in quotes: history "my thread"\)'):
        shell.run_line_magic("chat", "history my thread")
    with pytest.raises(UsageError, match=r"unrecognized arguments: --bogus\nusage"):  # as before
        shell.run_cell_magic("chat", "--bogus", "hi")
    assert fake.chat_requests == []
    shell.run_cell_magic("chat", '-m "fake:a, fake:b" --no-stream', "hi")  # quoted: it works
    assert sorted(r.json["model"] for r in fake.chat_requests) == ["a", "b"]


@pytest.mark.parametrize("text", [
    "Inline math $a <img src=x onerror=alert(1)> b$.", "$$\n<img src=x onerror=alert(1)>\n$$"])
def test_a_kept_responses_html_has_no_tag_of_the_answer_in_its_math(text: str) -> None:
    """A ``Response``'s own ``text/html`` (JupyterLab prefers it) is made here by markdown-it,
    which takes no math out first: a tag between ``$`` is read as a tag there."""
    from dispatch_nb.types import Response, TextBlock

    response = Response(content=[TextBlock(text=text)], model="m")
    assert "<img" not in (response._repr_html_() or "")
    assert "<img" in response._repr_markdown_()  # (front ends take math out of Markdown first)


def test_a_kept_responses_tool_call_cannot_leave_its_code_span() -> None:
    from dispatch_nb.types import Response, ToolUseBlock

    call = ToolUseBlock(id="1", name="search", arguments={"q": "x` <img src=x onerror=alert(1)> `y"})
    response = Response(content=[call], tool_calls=[call], model="m")
    assert "search" in response._repr_markdown_()
    assert "<img" not in (response._repr_html_() or "")
