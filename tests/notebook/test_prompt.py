"""Prompt building: interpolation rules, bounded summaries, ``Err``."""

from __future__ import annotations

from typing import Any

import pytest

from dispatch_nb.notebook.state import ErrorLog
from dispatch_nb.prompting import PromptError, build_prompt, describe_value


def test_names_and_expressions_are_interpolated() -> None:
    ns = {"x": 3.14159, "d": {"k": [1, 2, 3]}, "words": ["a", "b"]}
    p = build_prompt('v={x:.2f} r={x!r} n={len(words)} s={d["k"][1:]}', ns)
    assert p.text == "v=3.14 r=3.14159 n=2 s=[2, 3]"
    assert p.notes == []


def test_literal_braces_json_and_code_survive() -> None:
    ns = {"x": 1}
    template = 'Return {{"a": {x}}} like {"b": 2} or {} or { not python }'
    assert build_prompt(template, ns).text == 'Return {"a": 1} like {"b": 2} or {} or { not python }'


def test_unknown_name_is_left_as_written_with_a_note() -> None:
    p = build_prompt("hello {nobody}", {})
    assert p.text == "hello {nobody}"
    assert "nobody" in p.notes[0] and "--no-interpolate" in p.notes[0]


def test_failing_expression_is_a_prompt_error() -> None:
    with pytest.raises(PromptError, match="ZeroDivisionError"):
        build_prompt("{x / 0}", {"x": 1})


def test_no_interpolate_sends_the_text_verbatim() -> None:
    assert build_prompt("{x} {{y}}", {"x": 1}, interpolate=False).text == "{x} {{y}}"


def test_in_out_references() -> None:
    ns = {"In": ["", "a = 1", "a + 1"], "Out": {2: 2}}
    assert build_prompt("{In[1]} gives {Out[2]}", ns).text == "a = 1 gives 2"


def test_long_text_is_cut_with_a_note() -> None:
    text, note = describe_value("x" * 10_000, max_chars=100, name="big")
    assert len(text) < 200 and "9,900 more characters" in text
    assert note is not None and "{big}" in note


class FakeFrame:
    """Duck-typed like a pandas DataFrame (the tests never import pandas)."""

    def __init__(self, rows: int) -> None:
        self.rows = rows
        self.shape = (rows, 2)

    def head(self, n: int) -> FakeFrame:
        return FakeFrame(min(n, self.rows))

    def to_markdown(self) -> str:
        return "| a | b |\n|---|---|\n" + "\n".join(f"| {i} | {i * i} |" for i in range(self.rows))

    def to_string(self) -> str:
        return "unused"


def test_dataframe_like_values_are_summarized_to_their_first_rows() -> None:
    p = build_prompt("Describe {df}", {"df": FakeFrame(1000)}, max_rows=5)
    assert "FakeFrame with 1,000 rows × 2 columns; the first 5 rows" in p.text
    assert "| 4 | 16 |" in p.text and "| 5 | 25 |" not in p.text
    assert "first 5 rows" in p.notes[0]


def test_small_dataframe_is_shown_whole() -> None:
    text, note = describe_value(FakeFrame(3))
    assert note is None and "| 2 | 4 |" in text


def test_exceptions_become_their_traceback() -> None:
    try:
        {}["missing"]
    except KeyError as exc:
        error: BaseException = exc
    text, note = describe_value(error)
    assert "KeyError: 'missing'" in text and "Traceback" in text and note is None
    log = ErrorLog()
    log[3] = error
    assert build_prompt("{Err[3]}", {"Err": log}).text.endswith("KeyError: 'missing'")
    with pytest.raises(PromptError, match="raised no error"):
        build_prompt("{Err[4]}", {"Err": log})


def test_response_objects_interpolate_as_their_text() -> None:
    from dispatch_nb.types import Response, TextBlock

    response: Any = Response(content=[TextBlock(text="the answer")])
    assert build_prompt("{r}", {"r": response}).text == "the answer"


def test_latex_arguments_keep_their_meaning_even_where_a_name_is_defined() -> None:
    """``$\\mathbf{x}^T \\frac{n}{2}$`` is math, not two values: a data scientist's ``x`` and
    ``n`` are defined, and interpolating them turned the formula into ``\\mathbf[0 1 2]^T
    \\frac3{2}`` without a word. A command's arguments, ``\\{...\\}`` and ``^{...}`` are left as
    written (with a note when the name is defined), ``{x!s}`` inserts the value anyway, and
    ``file_{n}.csv`` or ``{name}{n}`` are interpolated as before."""
    ns = {"x": [0, 1, 2], "n": 3, "name": "Bob"}
    p = build_prompt(r"Explain $\mathbf{x}^T \frac{n}{2}$, e^{n} and \{n\}", ns)
    assert p.text == r"Explain $\mathbf{x}^T \frac{n}{2}$, e^{n} and \{n\}"
    assert p.notes == [
        "{x} after \\mathbf was left as written (LaTeX, not a value); write {x!s} to insert the value.",
        "{n} after \\frac was left as written (LaTeX, not a value); write {n!s} to insert the value.",
        "{n} after ^ was left as written (LaTeX, not a value); write {n!s} to insert the value.",
    ]
    p = build_prompt(r"\begin{align*} \textbf{x!s} \end{align*} file_{n}.csv {name}{n}", ns)
    assert p.text == r"\begin{align*} \textbf[0, 1, 2] \end{align*} file_3.csv Bob3"
    assert p.notes == []
    # an undefined name after a command is LaTeX too: no "not defined" note, no error in a batch;
    # nor is a ":" in a command's argument a format spec
    assert build_prompt(r"\hat{beta} \text{Note: n} and {n}", ns) == \
        build_prompt(r"\hat{beta} \text{Note: n} and 3", {})
    assert build_prompt(r"\text{Note: n}", ns).notes == []


@pytest.mark.parametrize(("template", "sent"), [
    (r"Open C:\data\{name}.csv", r"Open C:\data\Bob.csv"),  # a path's backslash is no LaTeX
    (r"C:\Users\{name}\notes and C:\files\x{n}", r"C:\Users\Bob\notes and C:\files\x3"),
    (r"Summarize:\n\n{name}", r"Summarize:\n\nBob"),  # (a raw string's \n: no command)
])
def test_a_backslash_before_a_placeholder_is_no_latex_unless_it_is_a_command(
    template: str, sent: str
) -> None:
    """Only a command of two or more letters, ``^`` or ``\\{…\\}`` make an argument LaTeX: a
    Windows path ``C:\\data\\{name}.csv`` in a cell is filled in, as it always was."""
    p = build_prompt(template, {"name": "Bob", "n": 3})
    assert (p.text, p.notes) == (sent, [])
