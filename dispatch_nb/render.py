"""What a :class:`~dispatch_nb.types.Response` shows, as Markdown / HTML (no IPython needed): the
one footer (:func:`footer_line`, for ``Response._repr_markdown_`` and ``%%chat`` alike) and the
tables of structured answers (docs/structured-output.md). It renders anything shaped like a
``Response``: :mod:`dispatch_nb.types` imports this module for its rich reprs, not the reverse.
"""

from __future__ import annotations

import functools
import html
import json
import re
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

__all__ = [
    "answer_markdown",
    "close_open_fence",
    "code_fences",
    "code_span",
    "compare_parsed_markdown",
    "dollars",
    "flatten_parsed",
    "footer_line",
    "footer_text",
    "inert_html",
    "is_replayed",
    "mark_replayed",
    "markdown_to_html",
    "model_label",
    "money",
    "name_spec",
    "parsed_html",
    "parsed_markdown",
    "parsed_rows",
    "plain_block",
    "raw_json",
    "response_markdown",
    "rows_markdown",
    "scan_inline",
    "short_line",
    "small",
    "thinking_details",
]


class _Usage(Protocol):
    input_tokens: int
    output_tokens: int
    cache_read_tokens: int

    @property
    def total_tokens(self) -> int: ...


class _Call(Protocol):
    name: str
    arguments: dict[str, Any]


class _Answer(Protocol):
    """What rendering reads of a :class:`~dispatch_nb.types.Response`."""

    model: str
    parsed: Any

    @property
    def usage(self) -> _Usage: ...
    @property
    def stop_reason(self) -> str | None: ...
    @property
    def text(self) -> str: ...
    @property
    def thinking(self) -> str: ...
    @property
    def tool_calls(self) -> Sequence[_Call]: ...


def code_span(text: str) -> str:
    """``text`` as one Markdown code span, fenced with more backticks than it holds."""
    fence = "`"
    while fence in text:
        fence += "`"
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def short_line(text: str, limit: int = 200) -> str:
    """``text`` on one line (runs of whitespace made one space), cut to ``limit`` characters."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def model_label(spec: str, model: str = "") -> str:
    """The one name of a model in what the library shows (footers, status lines, comparisons):
    the ``provider:model`` spec it was asked by, as ``-m`` and ``%chat status`` write it, so
    the reader sees where it ran (``copilot:claude-sonnet-4``, not Anthropic's bare name), with
    the model that answered in parentheses when it is another (a dated version:
    ``openai:gpt-4.1 (gpt-4.1-2025-04-14)``); ``model`` alone when no spec is known."""
    if not spec:
        return model
    if not model or model in (spec, spec.partition(":")[2]):
        return spec
    return f"{spec} ({model})"


def footer_line(
    *,
    model: str = "",
    usage: _Usage | None = None,
    latency: float | None = None,
    replayed: bool = False,
    rounds: int = 1,
    stop_reason: str | None = None,
    retries: Sequence[str] = (),
    notes: Iterable[str] = (),
    cost: Any = None,
) -> str:
    """The one footer of an answer, for ``Response._repr_markdown_`` and ``%%chat`` alike:
    ``model · 1,234 in / 7 out tokens · $0.0031 · 1.2 s · 2 rounds · stop: max_tokens · retried
    once (rate limited, HTTP 429) · note``; ``cost`` is a :class:`~dispatch_nb.cost.Cost`, or the
    :class:`~dispatch_nb.cost.CostTotal` of a turn's rounds (docs/sessions.md, docs/cost.md)."""
    parts: list[str] = []
    if model:
        parts.append(model)
    if usage is not None and usage.total_tokens:
        tokens = f"{usage.input_tokens:,} in / {usage.output_tokens:,} out tokens"
        if usage.cache_read_tokens:
            tokens += f" ({usage.cache_read_tokens:,} cached)"
        parts.append(tokens)
    if words := _cost_words(cost):
        parts.append(words)
    if replayed:
        parts.append("replayed")
    elif latency is not None:
        parts.append(f"{latency:.1f} s")
    if rounds > 1:
        parts.append(f"{rounds} rounds")
    if stop_reason and stop_reason != "end_turn":
        parts.append(f"stop: {stop_reason}")
    if retries:
        reasons = list(dict.fromkeys(retries))
        count = len(retries)
        parts.append(f"retried {count}× ({', '.join(reasons)})" if count > 1
                     else f"retried once ({reasons[0]})")
    parts.extend(note for note in notes if note)
    return " · ".join(parts)


def _cost_words(cost: Any) -> str:
    """A cost's words for a footer, ``""`` when nothing about it is known."""
    from .cost import Cost, CostTotal, format_usd

    if isinstance(cost, Cost):
        return "" if cost.usd is None and cost.premium_requests is None else cost.label()
    if isinstance(cost, CostTotal) and cost.calls:
        if cost.unknown == cost.calls and cost.premium_requests is None:
            return ""
        if cost.replayed == cost.calls:
            return f"{format_usd(cost.saved_usd)} when recorded, $0 now"
        return str(cost) if cost.calls > cost.unknown else ""
    return ""


#: the attribute that marks an answer the response cache replayed (see :func:`mark_replayed`)
_REPLAYED = "_dispatch_nb_replayed"
#: the attribute that names the spec an answer was asked by (see :func:`footer_text`)
_SPEC = "_dispatch_nb_spec"


def mark_replayed(response: object) -> None:
    """Mark ``response`` as replayed from the response cache (``dispatch_nb.cache`` does, for
    every answer it replays), so its footer says ``replayed`` as a ``%%chat`` cell's does. The
    mark is not a field: a replayed answer stays equal (``==``) to the recorded one, and its
    dumps are the same."""
    object.__setattr__(response, _REPLAYED, True)


def is_replayed(response: object) -> bool:
    """True for an answer the response cache replayed (:func:`mark_replayed`)."""
    return getattr(response, _REPLAYED, False) is True


def name_spec(response: object, spec: str) -> None:
    """Mark ``response`` as asked of ``spec`` (``provider:model``), so its footer names the model
    as the cell that asked it did (:func:`model_label`); a mark, not a field, like
    :func:`mark_replayed`'s."""
    object.__setattr__(response, _SPEC, spec)


def footer_text(response: _Answer, *, latency: float | None = None) -> str:
    """A response's footer (:func:`footer_line`): ``model · 12 in / 7 out tokens · 1.2 s``
    (``replayed`` for an answer the response cache replayed; the model named as
    :func:`model_label` does when :func:`name_spec` marked it)."""
    return footer_line(
        model=model_label(getattr(response, _SPEC, ""), response.model),
        usage=response.usage,
        latency=latency,
        replayed=is_replayed(response),
        stop_reason=response.stop_reason,
        cost=getattr(response, "cost", None),
    )


def response_markdown(response: _Answer, *, footer: bool = True, for_html: bool = False) -> str:
    """The response as Markdown: thinking collapsed, text, tool calls, and a small footer (a
    structured answer: :func:`parsed_markdown`); ``for_html``: for :func:`markdown_to_html`, which
    reads tags inside math too (:func:`inert_html`'s ``math=False``)."""
    if response.parsed is not None:
        return parsed_markdown(response, footer=footer)
    out = [part for part in (thinking_details(response.thinking),
                             answer_markdown(response.text, math=not for_html)) if part]
    for call in response.tool_calls:
        args = json.dumps(call.arguments, ensure_ascii=False)
        out.append("\n🔧 " + code_span(f"{call.name}({args})"))
    if not out:
        out.append("*(no text)*")
    if footer:
        out.append("\n\n" + small(html.escape(footer_text(response))))
    return "\n".join(out)


def thinking_details(thinking: str) -> str:
    """Thinking as Markdown, folded in a ``<details>`` (``""`` when there is none)."""
    body = html.escape(thinking.strip(), quote=False)
    return f"<details><summary>Thinking</summary>\n\n{body}\n\n</details>\n" if body else ""


def markdown_to_html(text: str) -> str | None:
    """Markdown → HTML with markdown-it-py when it is installed, else None: CommonMark plus GFM
    tables and strikethrough, the same on every machine (markdown-it-py's "gfm-like" preset would
    also linkify bare URLs, but raises where linkify-it-py is not installed)."""
    try:
        from markdown_it import MarkdownIt
    except ImportError:
        return None
    md = MarkdownIt("commonmark", {"html": True}).enable(["table", "strikethrough"])
    return str(md.render(text))


# -- structured answers -----------------------------------------------------------------------------
def _jsonable(value: Any) -> Any:
    from pydantic_core import to_jsonable_python

    return to_jsonable_python(value, fallback=str)


def _cell(value: Any) -> Any:
    """A table cell: scalars as they are, lists and objects as compact JSON text."""
    if isinstance(value, (dict, list)):
        return json.dumps(value, ensure_ascii=False, separators=(", ", ": "))
    return value


def parsed_rows(value: Any) -> list[dict[str, Any]]:
    """A parsed answer as table rows: one per item of a list, one for an object (a model, a
    dataclass, a dict), ``{"value": x}`` for anything else; values are JSON data (enums as their
    values), nested lists and objects as compact JSON text. ``pandas.DataFrame(parsed_rows(x))``
    makes it a DataFrame."""
    data = _jsonable(value)
    return [{str(k): _cell(v) for k, v in item.items()} if isinstance(item, dict)
            else {"value": _cell(item)} for item in (data if isinstance(data, list) else [data])]


def _cell_text(value: Any) -> str:
    """A table cell's text: ``""`` for None, a string as it is, anything else as JSON."""
    return "" if value is None else value if isinstance(value, str) else json.dumps(
        value, ensure_ascii=False)


#: the class of an element whose text the front end's MathJax leaves alone: JupyterLab and
#: Notebook 7 typeset the rendered output, where an escaped ``\\$`` is a ``$`` again (their
#: MathJax 3 skips ``tex2jax_ignore``; MathJax 3's own default is ``mathjax_ignore``)
NO_MATH = ' class="tex2jax_ignore mathjax_ignore"'


def dollars(text: str) -> str:
    """Markdown text whose ``$`` are dollar signs, escaped (``\\$``) for Markdown renderers that
    honour it (GitHub, nbviewer): two amounts in one paragraph (``$0.02 ... $1``) are not LaTeX
    math. For the text the library writes (footers, tables, notes), not a model's answer; put it
    in :func:`small` or :func:`plain_block` for JupyterLab too."""
    return text.replace("$", "\\$")


#: an opening fence: a top-level one (a backtick fence's info has no backtick), or at any indent
FENCE_OPEN = re.compile(r"^ {0,3}(`{3,}|~{3,})[^\n`]*$")
ANY_FENCE = re.compile(r"^[ \t]*(`{3,}|~{3,})")
_INLINE = re.compile(r"\\.|`+|\$", re.S)
_BLANK_LINE = re.compile(r"\n[ \t]*\n")


def code_fences(
    lines: list[str], opening: re.Pattern[str] = FENCE_OPEN
) -> tuple[list[bool], tuple[str, str] | None]:
    """Which ``lines`` belong to a fenced code block (fence lines included), and the opening line
    and marker of a fence left open at their end (None: none is)."""
    inside: list[bool] = []
    fence: tuple[str, str] | None = None
    for line in lines:
        if fence is None:
            match = opening.match(line)
            fence = (line, match.group(1)) if match else None
            inside.append(fence is not None)
            continue
        inside.append(True)
        stripped, marker = line.strip(), fence[1]
        if stripped and set(stripped) == {marker[0]} and len(stripped) >= len(marker):
            fence = None
    return inside, fence


def scan_inline(text: str, *, growing: bool = False) -> tuple[str, list[int], int | None]:
    """Markdown prose (its code blocks blanked) read for code spans and ``$``: the text with the
    inside of code spans and math replaced by spaces (same length; the delimiters stay, which
    emphasis next to them sees as punctuation, as CommonMark does), the positions of the ``$``
    that are dollar signs, and where the first construct still open begins (a code span; in
    ``growing`` text also math whose closer may yet come, and a ``$`` ending the text, which may
    yet open, close or be half of ``$$``; None: none is).

    Pandoc's rule tells math from money: an opening ``$`` has a non-space after it, a closing one
    a non-space before it and no digit after it, and no blank line is in between; a ``$`` after a
    space before any closer opens rather than closes, so ``$45 and $30``, a table of
    ``$1.2M | $1.5M`` and ``$5-$10`` are money while ``$x^2$`` and ``$$…$$`` stay math. A ``$``
    whose closer never comes is money; in growing text, one with a digit after it (``$45``) is
    money until a closer comes, and other openers wait for theirs."""
    out = list(text)
    dollars: list[int] = []
    held: list[int] = []
    i = 0
    while (token := _INLINE.search(text, i)) is not None:
        i = token.end()
        if token[0] == "$":
            dollars.append(token.start())
        elif token[0][0] == "`":
            close = re.compile(f"(?<!`){token[0]}(?!`)").search(text, i)
            blank = _BLANK_LINE.search(text, i)
            if blank is not None and (close is None or blank.start() < close.start()):
                continue  # the paragraph ends first: these backticks open no code span
            if close is None:
                held.append(token.start())
            else:
                out[i : close.start()] = " " * (close.start() - i)
                i = close.end()
    if growing and dollars and dollars[-1] == len(text) - 1:
        held.append(len(text.rstrip("$")))
        dollars = [d for d in dollars if d < held[-1]]
    money: list[int] = []
    k = 0
    while k < len(dollars):
        i = dollars[k]
        width = 2 if k + 1 < len(dollars) and dollars[k + 1] == i + 1 else 1
        closer = _closer(text, dollars, k, width)
        if closer is None and growing and not text[i + width : i + width + 1].isdigit():
            held.append(i)
        if closer is None or closer < 0:
            money += dollars[k : k + width]
            k += width
        else:
            out[i + width : dollars[closer]] = " " * (dollars[closer] - i - width)
            k = closer + width
    return "".join(out), money, min(held, default=None)


def _closer(text: str, dollars: list[int], k: int, width: int) -> int | None:
    """The index in ``dollars`` of the ``$`` (``$$``: its first one) closing the math opened at
    ``dollars[k]``: -1 when it opens none, None when its closer has not come (yet)."""
    opened = dollars[k]
    if width == 1 and (opened + 1 == len(text) or text[opened + 1].isspace()):
        return -1
    for m in range(k + width, len(dollars) - width + 1):
        j = dollars[m]
        if _BLANK_LINE.search(text, opened, j):
            return -1
        if width == 2:
            if dollars[m + 1] == j + 1:
                return m
        elif not text[j - 1].isspace() and not (j + 1 < len(text) and text[j + 1].isdigit()) \
                and not text.startswith("$$", j):
            return m
        elif text[j - 1].isspace():  # "… $30": a "$" that opens rather than closes, so the
            return -1                # first one is money ("$45 and … $30; $x^2$")
    return -1 if _BLANK_LINE.search(text, opened) else None


def money(markdown: str) -> str:
    """A model's Markdown with every ``$`` that is no math delimiter (:func:`scan_inline`: Pandoc's
    rule) shown as a dollar sign: escaped, in a span MathJax skips; code is left alone."""
    if "$" not in markdown:
        return markdown
    lines = markdown.split("\n")
    code = code_fences(lines)[0]
    prose = "\n".join(" " * len(line) if c else line for line, c in zip(lines, code, strict=True))
    escape = set(scan_inline(prose)[1])
    return "".join(f"<span{NO_MATH}>\\$</span>" if i in escape else c
                   for i, c in enumerate(markdown))


#: the ``<`` that starts raw HTML in Markdown: a start or end tag (``<script``, ``</div>``, and a
#: tag name cut off by the end of the text so far), a comment, a declaration or a processing
#: instruction; an autolink (``<https://…>``) or a comparison (``a < b``, ``x<5``) starts none.
#: The inline formatting tags models write in Markdown (``<br>`` in a table cell, ``<sup>``,
#: ``<kbd>``), without attributes, stay tags: they cannot run or load anything.
_RAW_HTML = re.compile(
    r"<(?!/?(?:br|sup|sub|kbd|b|i|u|s|em|strong|del|ins|mark|small|code)\s*/?>)"
    r"(?=/?[A-Za-z][A-Za-z0-9-]*(?:[\s/>]|\Z)|[!?])", re.IGNORECASE)


def inert_html(markdown: str, *, math: bool = True) -> str:
    """A model's Markdown with its raw HTML shown as text, never run or rendered: each ``<`` that
    would start a tag, a comment or a declaration outside code (code blocks, code spans, math)
    is written ``&lt;``, which every Markdown renderer shows as ``<``. So an answer quoting
    ``<script>``, ``<img onerror=…>`` or a stray ``</div>`` reads as the text it is, in the live
    view, the saved notebook and on GitHub alike; code keeps its ``<`` as they are, and so do
    plain formatting tags (``<br>``, ``<sup>``, ``<b>``: :data:`_RAW_HTML`). ``math=False``: math
    is no exception (for HTML made here, where nothing takes math out before the tags are read).
    Code blocks are CommonMark's (markdown-it-py's), not guessed from lines: a ``<`` that a
    renderer would read as a tag is never taken for code."""
    if "<" not in markdown:
        return markdown
    lines = markdown.split("\n")
    code = _code_lines(lines)
    prose = "\n".join(" " * len(line) if c else line for line, c in zip(lines, code, strict=True))
    scanned = scan_inline(prose if math else prose.replace("$", " "))[0]
    starts = {m.start() for m in _RAW_HTML.finditer(scanned)}
    if not starts:
        return markdown
    return "".join("&lt;" if i in starts else c for i, c in enumerate(markdown))


@functools.lru_cache(maxsize=1)
def _fence_parser() -> Any:
    from markdown_it import MarkdownIt

    return MarkdownIt("commonmark", {"html": True}).enable(["table", "strikethrough"])


def _code_lines(lines: list[str]) -> list[bool]:
    """Which ``lines`` are in a code block (fenced or indented, at any depth: in a list item, a
    quote), as CommonMark reads them; without markdown-it-py, fences at any indent."""
    try:
        parser = _fence_parser()
    except ImportError:
        return code_fences(lines, ANY_FENCE)[0]
    code = [False] * len(lines)
    for token in parser.parse("\n".join(lines)):
        if token.type in ("fence", "code_block") and token.map:
            code[token.map[0] : token.map[1]] = [True] * (token.map[1] - token.map[0])
    return code[: len(lines)]


def close_open_fence(markdown: str) -> str:
    """``markdown`` with its closing fence added when it ends inside a top-level fenced code
    block (an answer cut off by ``max_tokens``, a live view's growing block), so that what is put
    after it (a footer, a status line, the next part) is not code."""
    if "`" not in markdown and "~" not in markdown:
        return markdown
    try:
        parser = _fence_parser()
    except ImportError:  # no markdown-it-py: top-level fences by their lines
        fence = code_fences(markdown.split("\n"))[1]
        return markdown.rstrip("\n") + "\n" + fence[1] if fence is not None else markdown
    # what a paragraph after a blank line would be part of: the last top-level block
    tokens = parser.parse(markdown + "\n\nx")
    last = [t for t in tokens if t.level == 0 and t.nesting >= 0 and t.map is not None][-1]
    if last.type != "fence":
        return markdown
    return markdown.rstrip("\n") + "\n" + str(last.markup)


def answer_markdown(text: str, *, math: bool = True) -> str:
    """A model's text as the Markdown an output shows: its raw HTML as text (:func:`inert_html`,
    ``math``: its argument), its dollar signs as dollar signs (:func:`money`), a code block it left
    open closed (:func:`close_open_fence`)."""
    return close_open_fence(money(inert_html(text, math=math)))


def small(text: str) -> str:
    """``text`` (HTML-escaped already) as a small line no front end typesets as math (the class
    only when it has a ``$``: everything else reads as it always did)."""
    return f"<sub{NO_MATH if '$' in text else ''}>{dollars(text)}</sub>"


def plain_block(markdown: str) -> str:
    """Markdown of the library's own (a table, notes; its ``$`` escaped by :func:`dollars` or
    :func:`rows_markdown` already) in a block no front end typesets as math (when it has one)."""
    return f"<div{NO_MATH}>\n\n{markdown}\n\n</div>" if "$" in markdown else markdown


def _md_cell(value: Any) -> str:
    return dollars(html.escape(_cell_text(value), quote=False)).replace("|", "\\|").replace(
        "\n", "<br>")


def rows_markdown(rows: list[dict[str, Any]], *, index: bool | None = None, start: int = 1) -> str:
    """Rows (:func:`parsed_rows`) as a GitHub-flavoured Markdown table; columns in order of first
    appearance; ``index`` (default: when there are several rows) numbers them from ``start``."""
    if not rows:
        return "*(empty list)*"
    head, body = _grid(rows, len(rows) > 1 if index is None else index, start)
    return _md_table([_md_cell(c) for c in head], ([_md_cell(v) for v in cells] for cells in body))


def _grid(rows: list[dict[str, Any]], numbered: bool,
          start: int = 1) -> tuple[list[str], list[list[Any]]]:
    """The header and body cells of a table of ``rows``: columns in order of first appearance,
    a first ``#`` column numbering the rows from ``start`` when ``numbered``."""
    columns = list(dict.fromkeys(c for row in rows for c in row))
    head = (["#"] if numbered else []) + columns
    return head, [([str(n)] if numbered else []) + [row.get(c) for c in columns]
                  for n, row in enumerate(rows, start)]


def _md_table(head: list[str], body: Iterable[list[str]]) -> str:
    return "\n".join(["| " + " | ".join(head) + " |", "|" + "---|" * len(head),
                      *("| " + " | ".join(cells) + " |" for cells in body)])


def raw_json(response: _Answer) -> str:
    """The answer's JSON, indented (its text as it is when it is not JSON); a list or a single
    value asked for is shown as it is, without the ``{"result": ...}`` object it travelled in
    (``structured.RESULT_KEY``: a schema's root must be an object on the wire)."""
    try:
        data = json.loads(response.text)
    except ValueError:
        return response.text
    parsed = response.parsed
    if (isinstance(data, dict) and list(data) == ["result"]
            and isinstance(parsed, (list, tuple, str, int, float))):
        data = data["result"]
    return json.dumps(data, ensure_ascii=False, indent=2)


def _json_details(response: _Answer, summary: str = "JSON") -> str:
    """The raw JSON of ``response``, folded (a fence inside it cannot close the block)."""
    raw = raw_json(response).replace("```", "`\u200b``")
    return f"\n<details><summary>{summary}</summary>\n\n```json\n{raw}\n```\n\n</details>"


def parsed_markdown(response: _Answer, *, footer: bool = True) -> str:
    """A structured answer as Markdown: its table, the raw JSON folded below, a small footer."""
    out = [plain_block(rows_markdown(parsed_rows(response.parsed))), _json_details(response)]
    if footer:
        out.append("\n" + small(html.escape(footer_text(response))))
    return "\n".join(out)


def parsed_html(response: _Answer, *, footer: bool = True) -> str:
    """A structured answer as HTML (no Markdown renderer needed): its table, the raw JSON in a
    folded ``<details>``, a small footer."""
    rows = parsed_rows(response.parsed)
    cells, lines = _grid(rows, len(rows) > 1)

    def cell(value: Any, tag: str = "td") -> str:
        return f"<{tag}>{html.escape(_cell_text(value))}</{tag}>"

    head = "".join(cell(c, "th") for c in cells)
    body = "".join("<tr>" + "".join(map(cell, line)) + "</tr>" for line in lines)
    parts = [f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
             if rows else "<p><em>(empty list)</em></p>",
             "<details><summary>JSON</summary><pre><code>"
             f"{html.escape(raw_json(response))}</code></pre></details>"]
    if footer:
        parts.append(f"<p><sub{NO_MATH}>{html.escape(footer_text(response))}</sub></p>")
    return "\n".join(parts)


def flatten_parsed(value: Any) -> dict[str, Any]:
    """A parsed answer as ``{path: value}``: object fields by name, list items numbered from 1
    (``items.2.name``), leaves as JSON data; a scalar is ``{"value": x}``."""
    out: dict[str, Any] = {}

    def walk(item: Any, path: str) -> None:
        if isinstance(item, dict) and item:
            for key, sub in item.items():
                walk(sub, f"{path}.{key}" if path else str(key))
        elif isinstance(item, list) and item:
            for n, sub in enumerate(item, 1):
                walk(sub, f"{path}.{n}" if path else str(n))
        else:
            out[path or "value"] = item

    walk(_jsonable(value), "")
    return out


def compare_parsed_table(answers: Sequence[tuple[str, _Answer]]) -> str:
    """Several models' structured answers as one Markdown table: a row per field (list items
    numbered, ``items.2.name``), a column per model."""
    flat = [(label, flatten_parsed(r.parsed)) for label, r in answers]
    paths = list(dict.fromkeys(p for _, fields in flat for p in fields))
    return _md_table(["field", *[_md_cell(label) for label, _ in flat]], (
        [_md_cell(path), *[_md_cell(fields[path]) if path in fields else "—" for _, fields in flat]]
        for path in paths))


def compare_parsed_markdown(answers: Sequence[tuple[str, _Answer]]) -> str:
    """:func:`compare_parsed_table`, with each model's raw JSON folded below."""
    return "\n".join([plain_block(compare_parsed_table(answers)),
                      *(_json_details(r, f"JSON: {html.escape(label)}") for label, r in answers)])
