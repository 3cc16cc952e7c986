"""``%%chat --each NAME``: the cell's prompt over every row, through :func:`dispatch_nb.batch`
(``docs/notebook.md``, "One prompt over many rows").
"""

from __future__ import annotations

import argparse
import functools
import html
import json
import re
from collections import ChainMap
from typing import TYPE_CHECKING, Any

from IPython.core.error import UsageError

from ..errors import DispatchError
from ..frontend import unattended
from ..prompting import build_prompt
from ..registry import connect, parse_model_spec
from ..render import dollars, parsed_rows, plain_block, rows_markdown, small
from ..types import Response
from ..validation import article
from .display import ChatInterrupted, explain_error, magic_words, miss_facts, notes_markdown
from .live import detect_mode, has_kernel, ipy_display
from .login import ensure_copilot_login
from .options import check_limits, evaluate_option, resolve_schema
from .state import KernelState

if TYPE_CHECKING:
    from ..batching import BatchResult

__all__ = ["MAX_TABLE_ROWS", "each_output", "run_each_cell"]

#: the most rows the result table shows (the rest: ``-o VAR`` and ``VAR.to_pandas()``)
MAX_TABLE_ROWS = 100
#: the most characters of an answer or an error one table cell shows
MAX_CELL_CHARS = 300

#: what the error column says of a row stopped or refused before it was answered
NOT_SENT = {"cancelled": "cancelled", "not_sent": "not sent",
            "budget_exceeded": "not sent (over budget)", "batch_pending": "not answered yet"}

ACCEPTED = "--each takes a list, a tuple, a pandas Series or a pandas DataFrame from the namespace"


def _rows_value(expression: str, namespace: dict[str, Any]) -> Any:
    """``--each NAME`` → the rows (``NAME`` may be an expression such as ``df.head(20)``)."""
    from ..batching.rows import _is_dataframe, _is_series

    expression, value = evaluate_option("--each", expression, namespace, ACCEPTED)
    if not (isinstance(value, (list, tuple)) or _is_dataframe(value) or _is_series(value)):
        raise UsageError(f"--each {expression} is {article(type(value).__name__)}. {ACCEPTED}.")
    if len(value) == 0:
        raise UsageError(f"--each {expression} is empty: there is no row to ask about")
    return value


def _refuse(args: argparse.Namespace, specs: list[str]) -> None:
    if len(specs) > 1:
        raise UsageError(
            "--each runs one model over the rows; for several models run one --each cell per "
            "model (each with -o) and compare the results' to_pandas() tables"
        )
    if args.tools:
        raise UsageError("--each does not run tools: drop --tools, or call dispatch_nb.batch("
                         "..., tools=[...]) in a code cell")
    if args.format in ("code", "text"):
        raise UsageError(f"--each shows a result table: -f {args.format} does not apply")
    if args.no_interpolate:
        raise UsageError("--each fills {column} in the prompt for each row: it cannot be combined "
                         "with --no-interpolate")


def run_each_cell(state: KernelState, args: argparse.Namespace, cell: str) -> None:
    """Run one ``%%chat --each`` cell (see the module docstring)."""
    # batching (and tqdm) are imported by --each cells only
    from ..batching.rows import RowSource, TemplateError, _undefined

    settings, namespace, mode = state.settings, state.shell.user_ns, state.cache_mode(args.cache)
    specs = state.model_specs(args.model, mode)
    _refuse(args, specs)
    spec = specs[0]
    rows = _rows_value(args.each, namespace)
    if args.limit is not None:
        if args.limit <= 0:
            raise UsageError(f"--limit takes a positive number of rows, not {args.limit}")
        rows = rows[:args.limit] if isinstance(rows, (list, tuple)) else rows.head(args.limit)
    template = re.sub(r"\A(?:[ \t]*\n)+", "", cell).rstrip()
    if not template:
        raise UsageError("the %%chat cell is empty: write the prompt (with {column} placeholders) "
                         "below the %%chat line")
    check_limits(args)
    schema = resolve_schema(args.schema, namespace)
    system = args.system if args.system is not None else (settings.system or None)
    names = RowSource(rows)

    def fill(row: Any) -> str:
        prompt = build_prompt(template, ChainMap(names.namespace(row), namespace),
                              max_chars=settings.max_value_chars, max_rows=settings.max_rows)
        missing = _undefined(prompt.notes)
        if missing:
            row_names = ", ".join(sorted(k for k in names.namespace(row) if k != "row"))
            raise TemplateError(
                f"{missing[0].split(' was left')[0]} names nothing in this row (its names: "
                f"{row_names or 'none: use {row}'}; {{row}} is the whole row) nor in the "
                "namespace. Write {{ and }} for literal braces."
            )
        return prompt.text

    # the first row's prompt is made now: a wrong template stops the cell before anything is
    # sent or shown (no progress bar before the error)
    try:
        fill(next(iter(names))[1])
    except ValueError as exc:  # a TemplateError, or a PromptError ({1/0} raised)
        raise UsageError(f"--each {args.each.strip()}: {exc}") from None
    provider, _model = parse_model_spec(spec)  # state.model_specs checked it
    if args.deferred:  # before a login: a provider without a batch API can never run this cell
        _check_batch_api(spec)
    if state.needs_login(provider, mode):
        ensure_copilot_login(state)
    max_tokens = args.max_tokens if args.max_tokens is not None else settings.max_tokens
    options: dict[str, Any] = {
        "system": system,
        "max_tokens": max_tokens,
        "temperature": args.temperature if args.temperature is not None else settings.temperature,
        "timeout": settings.timeout,
        # the checkpoint keeps a deferred batch's answers
        "cache": None if args.deferred or mode == "off" else state.response_cache(mode),
        "output": schema,
        "budget": args.budget,
        "deferred": args.deferred,
        "checkpoint": args.checkpoint or None,
        "progress": _progress(state),
    }

    def estimated() -> Any:
        from ..estimates import estimate

        try:
            return estimate(fill, rows, model=spec, max_tokens=max_tokens, system=system,
                            batch=bool(args.deferred))
        except (TypeError, ValueError) as exc:  # a TemplateError among them
            raise UsageError(f"--each {args.each.strip()}: {exc}") from None

    if args.estimate:
        show_estimate(estimated(), f"--each {args.each.strip()}")
        return
    run = functools.partial(_run_rows, state, args, spec, fill, rows, options,
                            _placeholders(template))
    if len(rows) > settings.confirm_rows and not args.yes:
        ask_first(state, len(rows), estimated(), run)
    else:
        run()


def _placeholders(template: str) -> frozenset[str]:
    """The names a template's ``{name}`` / ``{name...}`` placeholders start with (literal
    ``{{`` left out): the columns whose empty values the result's notes point out."""
    return frozenset(re.findall(r"(?<!\{)\{\s*([A-Za-z_]\w*)", template))


_NO_BATCH_API = ("--deferred: {spec} has no batch API (OpenAI's and Anthropic's APIs have one); "
                 "run the cell without --deferred")


def _check_batch_api(spec: str) -> None:
    """``--deferred`` with a model whose provider has no batch API: a UsageError (nothing is
    sent, no login is asked for)."""
    adapter = connect(spec)
    try:
        supported = adapter.batch_api() is not None
    finally:
        adapter.close()
    if not supported:
        raise UsageError(_NO_BATCH_API.format(spec=spec))


def _progress(state: KernelState) -> str | None:
    """``progress=`` for the batch: tqdm's widget only with the widget live view, one text line
    updated in place with any other view in a kernel (no widget state for the notebook to save),
    batch's own choice in terminal IPython."""
    if detect_mode(state.shell, state.settings.live) == "widget":
        return "notebook"
    return "display" if has_kernel(state.shell) else None


def show_estimate(est: Any, what: str, tools: bool = False) -> None:
    """``--estimate``: what the cell would cost (one model call: ``tools``, a cell with tools
    says what that leaves out); nothing was sent."""
    text = est.summary()
    note = ("input tokens approximated (about 4 characters a token)" if est.counted_by ==
            "approximation" else f"input tokens: {est.counted_by}")
    if tools:
        note += ("; one model call: the tool definitions and the tool loop's further calls are not "
                 "counted")
    md = (plain_block(f"**Estimate** ({what}) — nothing was sent\n\n"
                      + dollars(html.escape(text, quote=False))) + "\n\n"
          + small(f"{html.escape(note, quote=False)}; the most output assumes every answer uses "
                  f"max_tokens ({est.max_tokens:,}); prices: {html.escape(est.source or 'unknown')}"))
    ipy_display({"text/markdown": md, "text/plain": f"Estimate ({what}), nothing was sent: "
                 f"{text}\n[{note}]"}, raw=True,
                metadata={"dispatch_nb": {"estimate": est.model_dump(mode="json")}})


def ask_first(state: KernelState, count: int, est: Any, run: Any) -> None:
    """A large ``--each`` asks first: the row count and the estimate, then a **Send** button in
    the running cell (an input box where buttons cannot work, a y/N prompt in terminal IPython);
    nothing is sent before the answer, and the rows run in the cell, so its table is the cell's
    own output. A run nobody watches (nbclient) is told how to send them instead."""
    from .approval import Question, ask_with_buttons

    question = (f"--each has {count:,} rows (more than ChatMagics.confirm_rows = "
                f"{state.settings.confirm_rows:,}): {est.summary()}")
    instead = "run again with --yes, or --limit N for the first N rows."
    asked = Question()

    def shown(sent: bool) -> dict[str, Any]:
        """The question as text and what came of it: what the notebook keeps."""
        said = ("*Confirmed.*" if sent else "*Nothing was sent.* Run the cell again with `--yes` "
                "to send them, or `--limit N` for the first N rows.")
        return {"text/markdown": plain_block(dollars(html.escape(question, quote=False))
                                             + "\n\n" + said),
                "text/plain": f"{question}\n" + ("Confirmed." if sent else
                                                  f"Nothing was sent: {instead}")}

    attended = not unattended(state.shell)  # (the live view's "display" or "text": the input box)
    buttons = attended and detect_mode(state.shell, state.settings.live) == "widget" and ask_with_buttons(
        asked, f"<b>{html.escape(question)}</b><br>Nothing has been sent.",
        f"{question}\nThis front end cannot show the Send button: interrupt the cell (Kernel → "
        f"Interrupt), then {instead}",
        [({"description": f"Send {count:,} rows", "button_style": "warning",
           "tooltip": "Send every row to the model"}, True), ({"description": "Cancel"}, False)],
        lambda: shown(asked.answer is True))
    if attended and not buttons:
        try:
            answer = input(question + "\nSend them? [y/N] ")
        except Exception:  # no input box after all (StdinNotImplementedError, EOF)
            answer = ""
        asked.settle(answer.strip().lower() in ("y", "yes"))
    if asked.answer is True:
        run()
    elif not attended:
        ipy_display(shown(False), raw=True)
    elif not buttons:  # (the question is on the screen already)
        ipy_display({"text/plain": f"Nothing was sent: {instead}"}, raw=True)


def _run_rows(state: KernelState, args: argparse.Namespace, spec: str, fill: Any, rows: Any,
              options: dict[str, Any], placed: frozenset[str]) -> None:
    """Send the rows (``options``: :func:`dispatch_nb.batch`'s) and show the result table (after
    a confirmation when one was asked) in place of the progress bar's output, whose last line
    (the batch's summary) the table's footer says again."""
    from ..batching import BatchInterrupted, batch

    namespace = state.shell.user_ns
    interrupted = False
    try:
        result = batch(fill, rows, model=spec, **options)
    except BatchInterrupted as exc:
        result, interrupted = exc.result, True
    except (TypeError, ValueError) as exc:  # a TemplateError, an unknown price for --budget...
        raise UsageError(f"--each {args.each.strip()}: {magic_words(str(exc))}") from None
    except DispatchError as exc:
        if exc.code != "batch_unsupported":
            raise
        raise UsageError(_NO_BATCH_API.format(spec=spec)) from None

    final_data, metadata = each_output(result, rows, name=args.each.strip(), spec=spec,
                                       schema=args.schema.strip() if args.schema else None,
                                       output=args.output, placed=placed)
    bar = result._progress_output
    if bar is not None:
        bar.update(final_data, raw=True, metadata=metadata)
    else:
        ipy_display(final_data, raw=True, metadata=metadata)
    if args.output:
        namespace[args.output] = result
    out = namespace.get("Out")
    count = state.execution_count
    if isinstance(out, dict) and isinstance(count, int):
        out[count] = result
    if interrupted:
        kept = f"Out[{count}]" if isinstance(out, dict) and isinstance(count, int) else None
        raise ChatInterrupted(_interrupted(result, args.output, args.output or kept)) from None
    errors = result.errors
    if errors and result.ok == 0:  # every row failed or was never sent: say why once
        raise explain_error((result.stopped_by or errors[0])[1], spec=spec) from None


def _interrupted(result: BatchResult, name: str | None, kept: str | None) -> str:
    """What Ctrl-C in a ``--each`` cell says: the finished rows are kept (in ``name``, the cell's
    ``-o``); a deferred batch's jobs keep running: the cell, run again, collects them, and the
    result (``kept``: ``-o``'s name, else ``Out[n]``) can wait for them or cancel them."""
    said = "interrupted; the finished rows are in the table above" + (f" and in {name}" if name
                                                                       else "")
    job = result.job
    if job is None or not result.pending:
        return said
    ids = [part.id for part in job.parts if not part.done] or job.ids  # the jobs still running
    which = (f"the {job.provider} job {ids[0]} keeps" if len(ids) == 1
             else f"the {len(ids)} {job.provider} jobs keep")
    it = "it" if len(ids) == 1 else "them"
    later = f" (or {kept}.wait()); {kept}.cancel() cancels {it}" if kept else ""
    rows = f"{result.pending:,} row{'s' if result.pending != 1 else ''}"
    return (f"stopped waiting: {which} running at the provider ({rows} not answered yet); run "
            f"this cell again to collect {it}{later}. {said[0].upper()}{said[1:]}")


def _short(text: str, limit: int = MAX_CELL_CHARS) -> str:
    text = text.strip()
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def _answer_columns(response: Any, taken: set[str], schema: bool) -> dict[str, Any]:
    if not schema:
        return {"answer": _short(response.text)}
    parsed = parsed_rows(response.parsed)
    is_list = isinstance(response.parsed, (list, tuple))
    if not is_list and len(parsed) == 1 and set(parsed[0]) != {"value"}:
        return {(f"answer.{k}" if k in taken or k in ("answer", "error") else k):
                (_short(v) if isinstance(v, str) else v) for k, v in parsed[0].items()}
    data = [next(iter(r.values())) if set(r) == {"value"} else r for r in parsed]
    value = data if is_list else data[0]
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    return {"answer": _short(text)}


def _empty(value: Any) -> bool:
    """A missing value of a table: None, NaN, pandas' NA or NaT (pandas is never imported)."""
    if value is None or type(value).__name__ in ("NAType", "NaTType"):
        return True
    return isinstance(value, float) and value != value


def _empty_note(key: str, positions: list[int], said: str) -> str:
    """The note naming the rows whose ``{key}`` was empty."""
    shown = ", ".join(str(p) for p in positions[:10]) + (", …" if len(positions) > 10 else "")
    rows = f"row {shown}" if len(positions) == 1 else f"{len(positions):,} rows ({shown})"
    return (f"{{{key}}} is empty (NaN or None) in {rows}: the prompt said {said!r} there; "
            f"fill or drop them first (e.g. df.dropna(subset=[{key!r}])).")


def each_output(
    result: BatchResult, rows: Any, *, name: str, spec: str, schema: str | None = None,
    output: str | None = None, placed: frozenset[str] = frozenset(),
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The static output of a ``--each`` cell: ``(data, metadata)``. A table with the input's
    columns, each row's answer (``--schema``: its parsed fields) and, when any row failed, an
    ``error`` column; at most :data:`MAX_TABLE_ROWS` rows (``output``: the ``-o`` name that holds
    them all); the summary as the footer. ``placed``: the template's placeholders; a note names
    the rows where one of them was empty (NaN, None), which the prompt said as ``nan``..."""
    from ..batching.rows import RowSource

    source = RowSource(rows)
    column = source.name or "row"
    failed = any(not isinstance(item, Response) for item in result)
    table: list[dict[str, Any]] = []
    empty: dict[str, tuple[list[int], str]] = {}  # placeholder → (rows, what the prompt said)
    for (position, row), item in zip(source, result, strict=False):
        items = row.items() if isinstance(row, dict) else [(column, row)]
        for key, value in items:
            if str(key) in placed and _empty(value) and item is not None:
                empty.setdefault(str(key), ([], str(value)))[0].append(position)
        if position >= MAX_TABLE_ROWS:
            continue
        line = {str(k): (_short(v) if isinstance(v, str) else v) for k, v in items}
        if isinstance(item, Response):
            line.update(_answer_columns(item, set(line), schema is not None))
        if failed and isinstance(item, DispatchError) and item.code in NOT_SENT:
            line["error"] = NOT_SENT[item.code]  # the footer says why (over budget: a note)
        elif failed and isinstance(item, DispatchError):  # its message in the magic's words
            said = str(item).replace(item.message, magic_words(miss_facts(item)))
            line["error"] = _short(f"{type(item).__name__}: {said}", 200)
        elif failed:
            line["error"] = None if isinstance(item, Response) or item is None \
                else _short(f"{type(item).__name__}: {item}", 200)
        table.append(line)
    notes = [_empty_note(key, positions, said) for key, (positions, said) in empty.items()]
    over = next((i for i in result if getattr(i, "code", None) == "budget_exceeded"), None)
    if over is not None:  # the first row refused, in full: the others differ in their amounts
        notes.append(f"{type(over).__name__}: {magic_words(over.message)}")
    if len(result) > MAX_TABLE_ROWS:
        notes.append(f"The first {MAX_TABLE_ROWS} of {len(result):,} rows are shown; " + (
            f"see them all with {output}.to_pandas()." if output else
            "keep the result with -o VAR and see them all with VAR.to_pandas()."))
    footer = f"{spec} · --each {name}" + (f" · --schema {schema}" if schema else "")
    footer += f" · {result.summary()}"
    body = rows_markdown(table, index=True, start=0)  # numbered like VAR[i] and to_pandas()
    md = plain_block(body) + "\n\n" + notes_markdown(notes) + small(html.escape(footer, quote=False))
    plain = html.unescape(body.replace("\\$", "$")) + "".join(f"\nℹ {n}" for n in notes) \
        + f"\n\n[{footer}]"
    meta = {"dispatch_nb": {"each": name, "model": spec, "schema": schema, "rows": len(result),
                            "ok": result.ok, "failed": result.failed, "cancelled": result.cancelled,
                            "not_sent": result.not_sent, "footer": footer}}
    return {"text/markdown": md, "text/plain": plain}, meta
