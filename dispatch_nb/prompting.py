"""Prompt templates: ``{expression}`` interpolation and bounded summaries of values (the rules:
docs/notebook.md, "Prompts: interpolation and references"); DataFrame-like values are duck-typed
(``shape`` + ``head``).

Core, not notebook: ``%%chat`` cells (``notebook/cell.py``, the user namespace) and batch rows
(``batching/rows.py``, a row's columns) fill templates with it. This module imports only the
standard library.
"""

from __future__ import annotations

import ast
import functools
import re
import traceback
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from types import CodeType
from typing import Any

__all__ = [
    "DEFAULT_MAX_CHARS",
    "DEFAULT_MAX_ROWS",
    "Prompt",
    "PromptError",
    "build_prompt",
    "describe_value",
]

DEFAULT_MAX_CHARS = 4000
DEFAULT_MAX_ROWS = 10
#: what interpolation acts on: a literal ``{{`` or ``}}``, or the ``{`` of an expression
_BRACE = re.compile(r"\{\{|\}\}|\{")
#: what just before a ``{`` makes it LaTeX, not Python: a command of two or more letters
#: (``\mathbf{x}``, ``\frac{n}``, ``\begin{align*}``) or a superscript (``e^{n}``). A lone
#: backslash does so only as ``\{…\}`` (a path's ``C:\data\{name}.csv`` is filled in), a
#: one-letter escape never (``\n{text}`` in a raw string is filled in)
_LATEX_BEFORE = re.compile(r"(?:\\[A-Za-z]{2,}\*?|\^)\Z")


class PromptError(ValueError):
    """An ``{expression}`` in a prompt raised an error while being evaluated."""


@dataclass
class Prompt:
    """The text to send, and notes for the user about what interpolation did."""

    text: str
    notes: list[str] = field(default_factory=list)


def build_prompt(
    template: str,
    namespace: Mapping[str, Any],
    *,
    interpolate: bool = True,
    max_chars: int = DEFAULT_MAX_CHARS,
    max_rows: int = DEFAULT_MAX_ROWS,
) -> Prompt:
    """Interpolate ``{expression}`` s in ``template`` from ``namespace`` (the rules: docs/notebook.md)."""
    if not interpolate:
        return Prompt(template)
    out: list[str] = []
    notes: list[str] = []
    i = 0
    latex_end = -1  # where the last LaTeX argument ended (\frac{a}{b}: {b} is one too)
    while (brace := _BRACE.search(template, i)) is not None:
        out.append(template[i : brace.start()])
        i = brace.end()
        if brace.group() != "{":  # {{ or }}: a literal brace
            out.append(brace.group()[0])
            continue
        end = _matching_brace(template, brace.start())
        if end < 0:  # an unbalanced brace: the rest is literal
            i = brace.start()
            break
        inner = template[i:end]
        start = brace.start()
        if (start == latex_end or _LATEX_BEFORE.search(template, max(0, start - 40), start)
                or (template[start - 1 : start] == "\\" and inner.endswith("\\"))):
            before = template[max(0, start - 40) : start]
            out.append(_latex(inner, before, namespace, notes, max_chars=max_chars,
                              max_rows=max_rows))
            latex_end = i = end + 1
            continue
        out.append(_substitute(inner, namespace, notes, max_chars=max_chars, max_rows=max_rows))
        i = end + 1
    out.append(template[i:])
    return Prompt("".join(out), notes)


def _latex(
    inner: str, before: str, namespace: Mapping[str, Any], notes: list[str], *, max_chars: int,
    max_rows: int
) -> str:
    """The argument of a LaTeX command (``\\mathbf{x}``), left as written: math in a prompt keeps
    its meaning even where ``x`` is a variable. A bare name or expression that would have
    named something defined gets a note saying how to insert its value (``{x!s}``: a
    conversion says it is Python; a ``:`` does not, ``\\text{Note: x}`` is LaTeX)."""
    literal = "{" + inner + "}"
    _expr, conversion, _spec = _split_spec(inner)
    if conversion:  # {x!s}, {x!r:>8}: Python, wherever it stands
        return _substitute(inner, namespace, notes, max_chars=max_chars, max_rows=max_rows)
    code = _compiled(inner.strip()) if inner.strip() else None
    if code is not None and any(name in namespace for name in code.co_names):
        command = re.search(r"(\\[A-Za-z]+\*?|\\|\^|\})\Z", before)
        after = f" after {command.group(1)}" if command and command.group(1) != "}" else ""
        notes.append(f"{literal}{after} was left as written (LaTeX, not a value); write "
                     f"{{{inner.strip()}!s}} to insert the value.")
    return literal


def _outside_quotes(text: str, start: int = 0) -> Iterator[tuple[int, str, int]]:
    """``(index, character, nesting depth after it)`` for each character of ``text`` from
    ``start`` that is not inside a string literal (backslash escapes respected)."""
    depth = 0
    quote: str | None = None
    i = start
    while i < len(text):
        c = text[i]
        if quote:
            if c == "\\":
                i += 1
            elif c == quote:
                quote = None
        elif c in "'\"":
            quote = c
        else:
            depth += (c in "{[(") - (c in "}])")
            yield i, c, depth
        i += 1


def _matching_brace(text: str, start: int) -> int:
    """Index of the ``}`` closing the ``{`` at ``start`` (nesting and quotes respected), or -1."""
    for i, c, depth in _outside_quotes(text, start):
        if depth == 0:
            return i if c == "}" else -1
    return -1


def _split_spec(inner: str) -> tuple[str, str | None, str]:
    """``expr!r:>10`` → (``expr``, ``r``, ``>10``): the top-level conversion and format spec."""
    for i, c, depth in _outside_quotes(inner):
        if depth:
            continue
        if c == "!" and inner[i + 1 : i + 2] in ("r", "s", "a") and (
            i + 2 == len(inner) or inner[i + 2] == ":"
        ):
            spec = inner[i + 3 :] if i + 2 < len(inner) else ""
            return inner[:i], inner[i + 1], spec
        if c == ":" and inner[i + 1 : i + 2] != "=" and "lambda" not in inner[:i]:  # := / lambda
            return inner[:i], None, inner[i + 1 :]
    return inner, None, ""


@functools.lru_cache(maxsize=1024)
def _compiled(source: str) -> CodeType | None:
    """``source`` compiled as an expression, or None when it is not one or is a plain constant
    (``"a"``, ``1, 2``: JSON and set literals stay as written; a batch fills the same template
    for every row: each expression is parsed once)."""
    try:
        tree = ast.parse(source, mode="eval")
    except SyntaxError:
        return None
    if not any(isinstance(node, ast.Name) for node in ast.walk(tree)):
        try:
            ast.literal_eval(tree)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            pass  # it computes something ({1/0}, {2**10}): evaluated like any expression
        else:
            return None
    return compile(tree, "<%%chat prompt>", "eval")


def _substitute(
    inner: str, namespace: Mapping[str, Any], notes: list[str], *, max_chars: int, max_rows: int
) -> str:
    literal = "{" + inner + "}"
    expr, conversion, spec = _split_spec(inner)
    source = expr.strip()
    if not source:
        return literal
    code = _compiled(source)
    if code is None:
        return literal  # not an expression, or one naming nothing (constants, JSON, {}...)
    try:
        value = eval(code, dict(namespace))
    except NameError as exc:
        notes.append(
            f"{literal} was left as written: {exc}. Write {{{{ and }}}} for literal braces, "
            "or use --no-interpolate."
        )
        return literal
    except Exception as exc:
        raise PromptError(
            f"{literal} in the prompt raised {type(exc).__name__}: {exc}. "
            "Write {{ and }} for literal braces, or use --no-interpolate."
        ) from None
    if conversion or spec:
        if conversion:
            value = _CONVERSIONS[conversion](value)
        try:
            text = format(value, spec)
        except (TypeError, ValueError) as exc:
            raise PromptError(f"{literal}: bad format spec {spec!r}: {exc}") from None
        text, note = _cut(text, max_chars, source)
    else:
        text, note = describe_value(value, max_chars=max_chars, max_rows=max_rows, name=source)
    if note:
        notes.append(note)
    return text


_CONVERSIONS: dict[str, Callable[[Any], str]] = {"r": repr, "a": ascii, "s": str}


def _cut(text: str, max_chars: int, name: str) -> tuple[str, str | None]:
    """``text`` cut to ``max_chars``, and the note saying so (``None``: it fits)."""
    if len(text) <= max_chars:
        return text, None
    return (
        text[:max_chars] + f"\n… [{len(text) - max_chars:,} more characters not shown]",
        f"{{{name}}} ({len(text):,} characters) was cut to {max_chars:,}.",
    )


def describe_value(
    value: Any,
    *,
    max_chars: int = DEFAULT_MAX_CHARS,
    max_rows: int = DEFAULT_MAX_ROWS,
    name: str = "value",
) -> tuple[str, str | None]:
    """``value`` as prompt text of at most about ``max_chars`` characters, and a note if it was
    shortened (``None`` otherwise)."""
    if isinstance(value, BaseException):
        return _describe_exception(value, max_chars, name)
    if isinstance(value, str):
        text = value
    elif type(value).__name__ == "Response" and isinstance(getattr(value, "text", None), str):
        text = value.text  # a dispatch_nb Response (e.g. ``{Out[5]}`` of a %%chat cell)
    elif _is_table(value):
        return _describe_table(value, max_chars, max_rows, name)
    else:
        try:
            text = str(value)
        except Exception as exc:  # a broken __str__ must not break the prompt
            text = f"<{type(value).__name__} object: str() failed with {exc!r}>"
    return _cut(text, max_chars, name)


def _is_table(value: Any) -> bool:
    shape = getattr(value, "shape", None)
    return (
        isinstance(shape, tuple)
        and len(shape) in (1, 2)
        and callable(getattr(value, "head", None))
        and (callable(getattr(value, "to_string", None)) or callable(getattr(value, "to_markdown", None)))
    )


def _table_text(value: Any) -> str:
    try:
        return str(value.to_markdown())
    except Exception:  # none, or ImportError: pandas needs the optional ``tabulate`` for it
        to_string = getattr(value, "to_string", None)
        return str(to_string() if callable(to_string) else value)


def _describe_table(
    value: Any, max_chars: int, max_rows: int, name: str
) -> tuple[str, str | None]:
    shape = value.shape
    rows = int(shape[0])
    kind = type(value).__name__
    size = f"{rows:,} rows × {int(shape[1]):,} columns" if len(shape) == 2 else f"{rows:,} rows"
    note: str | None = None
    if rows > max_rows:
        body = _table_text(value.head(max_rows))
        head = f"{kind} with {size}; the first {max_rows} rows:\n"
        note = f"{{{name}}} ({kind}, {size}) was summarized to its first {max_rows} rows."
    else:
        body = _table_text(value)
        head = f"{kind} with {size}:\n"
    text, cut = _cut(head + body, max_chars, name)
    if cut:
        note = f"{{{name}}} ({kind}, {size}) was summarized to {max_chars:,} characters."
    return text, note


def _describe_exception(exc: BaseException, max_chars: int, name: str) -> tuple[str, str | None]:
    lines = traceback.format_exception(type(exc), exc, exc.__traceback__)
    # Drop IPython's own frames: the user's cell frames and the error line are what matter.
    kept = [ln for ln in lines if "site-packages/IPython/" not in ln and "interactiveshell.py" not in ln]
    text = "".join(kept).rstrip()
    if len(text) <= max_chars:
        return text, None
    # Keep the end: the innermost frames and the error message.
    tail = text[-max_chars:]
    return (
        f"… [{len(text) - max_chars:,} earlier characters of the traceback not shown]\n{tail}",
        f"{{{name}}} (a {len(text):,}-character traceback) was cut to its last {max_chars:,}.",
    )
