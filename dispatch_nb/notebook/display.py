"""What a ``%%chat`` cell leaves behind: the :class:`Transcript` of what streamed, the one static
final output (``docs/notebook.md``, "Final output"), and short readable errors ("Errors").
"""

from __future__ import annotations

import ast
import html
import json
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..cost import CostTotal
from ..prompting import PromptError
from ..registry import find_descriptor
from ..render import (
    answer_markdown,
    code_span,
    compare_parsed_markdown,
    compare_parsed_table,
    dollars,
    footer_line,
    model_label,
    parsed_markdown,
    parsed_rows,
    raw_json,
    short_line,
    small,
    thinking_details,
)
from ..turn import ToolRun, TurnAccumulator
from ..types import Usage

if TYPE_CHECKING:
    from ..types import Response

__all__ = [
    "ChatError",
    "ChatInterrupted",
    "FinalOutput",
    "Transcript",
    "compare_output",
    "explain_error",
    "extract_code",
    "final_output",
    "magic_words",
    "notes_markdown",
    "parse_json_answer",
    "terminal_text",
]

_RED, _BOLD, _RESET = "\x1b[31m", "\x1b[1m", "\x1b[0m"


# ------------------------------------------------------------------------------------------------
# Transcript


class Transcript(TurnAccumulator):
    """Everything one model produced for a cell, in order, built from stream events: the
    library's :class:`~dispatch_nb.turn.TurnAccumulator` plus what a cell shows besides the
    answer (retries, logged warnings, whether it was replayed) and its renderings."""

    def __init__(self, spec: str = "") -> None:
        super().__init__()
        self.spec = spec
        #: True when every model call was answered from the response cache (no latency to show)
        self.replayed = False
        #: why each retry happened (``"rate limited, HTTP 429"``), in order
        self.retries: list[str] = []
        #: other warnings the library logged while this answer streamed
        self.log_notes: list[str] = []

    # -- feeding ---------------------------------------------------------------------------------
    def feed(self, event: Any) -> None:
        """Record one ``StreamDelta`` / ``ToolResultEvent`` / ``MessageDoneEvent``, or one of the
        cell's own ``retry`` / ``note`` events."""
        kind = getattr(event, "type", None)
        if kind == "retry":
            self.retries.append(event.reason)
        elif kind == "note":
            if event.message not in self.log_notes:
                self.log_notes.append(event.message)
        else:
            super().feed(event)

    # -- reading ---------------------------------------------------------------------------------
    def footer(self, latency: float | None, *, note: str | None = None) -> str:
        """``provider:model · 12 in / 7 out tokens · 1.2 s · stop`` (plus ``note``; the model
        named as the live view and a comparison name it: :func:`~dispatch_nb.render.model_label`);
        a replayed answer says ``replayed`` instead of a latency. The same renderer as a
        ``Response``'s footer (:func:`dispatch_nb.render.footer_line`), with one round's cost or
        the total of all."""
        rounds = self.rounds
        return footer_line(
            model=model_label(self.spec, self.model),
            usage=self.usage,
            latency=latency,
            replayed=self.replayed,
            rounds=len(self.rounds),
            stop_reason=self.stop_reason,
            retries=self.retries,
            notes=[note] if note else (),
            cost=rounds[0].cost if len(rounds) == 1 else CostTotal.of(r.cost for r in rounds)
            if rounds else None,
        )

    def markdown(self) -> str:
        """The transcript as Markdown: thinking collapsed, text, tool calls with their results."""
        out: list[str] = []
        for part in self.parts():
            if isinstance(part, ToolRun):
                out.append(tool_markdown(part).strip("\n"))
            elif part.kind == "thinking":
                out.append(thinking_details(part.text))
            else:
                # raw HTML reads as text, "$45 and $30" are not math, a code block left open
                # (max_tokens) is closed before what follows it
                out.append(answer_markdown(part.text.strip("\n")))
        return "\n\n".join(s for s in out if s) or "*(no text)*"

    def plain(self) -> str:
        """The transcript as plain text (tool calls as one line each)."""
        return "".join(f"\n🔧 {tool_line(part)}\n" if isinstance(part, ToolRun) else part.text
                       for part in self.parts()
                       if isinstance(part, ToolRun) or part.kind == "text").strip()

    def metadata(self, latency: float | None, ttft: float | None) -> dict[str, Any]:
        """Facts for the output's metadata (never a secret)."""
        facts: dict[str, Any] = {
            "spec": self.spec,
            "model": self.model,
            "stop_reason": self.stop_reason,
            "usage": (self.usage or Usage()).model_dump(),
            "latency_s": None if latency is None else round(latency, 3),
            "time_to_first_token_s": None if ttft is None else round(ttft, 3),
            "rounds": len(self.rounds),
            "tool_calls": [t.name for t in self.tools],
        }
        if self.replayed:
            facts["replayed"] = True
        return facts


def tool_line(part: ToolRun, limit: int = 160) -> str:
    """``name({"x": 1}) → result`` on one line."""
    line = f"{part.name}({short_line(part.arguments_text, limit)})"
    if part.abandoned:
        line += " ⏹ abandoned (interrupted while it ran)"
    elif part.result is not None:
        arrow = "⚠" if part.is_error else "→"
        line += f" {arrow} {short_line(part.result, limit)}"
    return line


def code_block(text: str) -> str:
    """``text`` as a fenced code block whose fence is longer than any run of backticks in it, so
    nothing in ``text`` can end the block early."""
    fence = "```"
    while fence in text:
        fence += "`"
    return f"{fence}\n{text}\n{fence}"


def tool_markdown(part: ToolRun) -> str:
    """One tool call (and its result) as Markdown."""
    call = f"🔧 **{part.name}** {code_span(short_line(part.arguments_text, 300))}"
    if part.abandoned:
        return f"{call} ⏹ *abandoned: still running when the cell was interrupted*\n"
    if part.result is None:
        return call + "\n"
    label = "⚠ error" if part.is_error else "→"
    took = f" <sub>{part.duration:.2f} s</sub>" if part.duration else ""
    approval = part.approval
    result = part.result
    if (approval and approval.startswith("denied")) or result.startswith(f"{part.name} was not run"):
        return f"{call} ⚠ {code_span(result)}\n"  # not run: why (and what to do), in full
    if approval:
        call += f" <sub>{approval.replace('<', '&lt;').replace('>', '&gt;')[:300]}</sub>"
    if len(result) <= 200 and "\n" not in result:
        return f"{call} {label} {code_span(result)}{took}\n"
    return (
        f"{call} {label}{took}\n\n<details><summary>result ({len(result):,} characters)"
        f"</summary>\n\n{code_block(result[:4000])}\n\n</details>\n"
    )


# ------------------------------------------------------------------------------------------------
# Final outputs


@dataclass
class FinalOutput:
    """A display bundle and its metadata; ``terminal`` is what a terminal should print, if any."""

    data: dict[str, Any]
    metadata: dict[str, Any]
    terminal: str | None = None
    code: str | None = None  # for -f code: what goes into the next cell


def _sub(text: str) -> str:
    return "\n\n" + small(html.escape(text, quote=False))


_FENCE = re.compile(r"```[ \t]*([\w+#.-]*)[^\n]*\n(.*?)```", re.DOTALL)


_PYTHON_NAMES = ("python", "py", "python3", "ipython", "ipython3")


def _is_python(code: str) -> bool:
    """Whether ``code`` parses as Python and is not prose that happens to: a line of
    ``Label: text`` (``Answer: 42``) parses as a bare annotation."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        return False
    return not (tree.body and all(isinstance(node, ast.AnnAssign) and node.value is None
                                  for node in tree.body))


def extract_code(text: str) -> tuple[str, str, str | None]:
    """The code in an answer for ``-f code``: ``(language, code, note)``; ``note`` says what was
    left out (``docs/notebook.md``, "Formats")."""
    blocks = [(lang.lower(), code.rstrip("\n")) for lang, code in _FENCE.findall(text)]
    if not blocks:
        stripped = text.strip()
        if stripped and _is_python(stripped):
            return "python", stripped, None
        return "", "", (
            "The answer has no fenced code block (```), so nothing was put in the next cell."
        )
    keep = [i for i, (lang, _) in enumerate(blocks) if lang in _PYTHON_NAMES]
    if not keep:
        keep = [i for i, (lang, code) in enumerate(blocks) if not lang and _is_python(code)]
    language = "python" if keep else blocks[0][0]
    if not keep:
        keep = [i for i, (lang, _) in enumerate(blocks) if lang == language]
    code = "\n\n".join(blocks[i][1] for i in keep)
    left = [blocks[i][0] or "unlabelled" for i in range(len(blocks)) if i not in keep]
    note = None
    if left:
        what = "block" if len(left) == 1 else "blocks"
        kept = f"the {language} code" if language else "the first block's code"
        note = (
            f"{len(left)} code {what} in another language ({', '.join(left)}) left out: the next "
            f"cell has {kept} only."
        )
    return language, code, note


def parse_json_answer(text: str) -> Any:
    """JSON from an answer: code fences stripped; else the outermost ``{...}`` / ``[...]``; raises
    ``ValueError`` (``json.JSONDecodeError``) when there is none."""
    candidates: list[str] = [code for _, code in _FENCE.findall(text)]
    candidates.append(text.strip())
    for opener, closer in (("{", "}"), ("[", "]")):
        start, end = text.find(opener), text.rfind(closer)
        if 0 <= start < end:
            candidates.append(text[start : end + 1])
    error: ValueError | None = None
    for candidate in candidates:
        try:
            return json.loads(candidate)
        except ValueError as exc:
            error = error or exc
    raise error or ValueError("no JSON found")


def notes_markdown(notes: list[str]) -> str:
    """Interpolation notes and hints, as small lines above an answer."""
    return "".join(small(f"ℹ {html.escape(n, quote=False)}") + "\n\n" for n in notes)


def _notes_plain(notes: list[str]) -> str:
    return "".join(f"ℹ {n}\n" for n in notes)


def _metadata(facts: dict[str, Any], notes: list[str]) -> dict[str, Any]:
    """The output's metadata: ``facts`` and the notes, under ``"dispatch_nb"``."""
    return {"dispatch_nb": {**facts, "notes": notes} if notes else facts}


def final_output(
    transcript: Transcript,
    *,
    fmt: str = "markdown",
    latency: float | None = None,
    ttft: float | None = None,
    extra: dict[str, Any] | None = None,
    note: str | None = None,
    notes: list[str] | None = None,
    failed: bool = False,
    parsed: Response | None = None,
) -> FinalOutput:
    """The one static output a finished (or failed, or interrupted) cell leaves (``docs/notebook.md``,
    "Final output"); ``parsed``: a ``--schema`` answer, shown as a table."""
    notes = list(notes or [])
    footer = transcript.footer(latency, note=note)
    top = notes_markdown(notes)
    top_plain = _notes_plain(notes)
    facts = {**transcript.metadata(latency, ttft), "format": fmt, "footer": footer}
    if parsed is not None:
        rows = len(parsed_rows(parsed.parsed))
        meta = _metadata({**facts, "format": "schema", "rows": rows, **(extra or {})}, notes)
        md = top + parsed_markdown(parsed, footer=False) + _sub(footer)
        plain = raw_json(parsed)
        # a terminal printed the JSON as it came (the answer, live): what adds to it is that it
        # is valid, not the same values again as a table
        items = f" ({rows} item{'s' if rows != 1 else ''})" if isinstance(
            parsed.parsed, (list, tuple)) else ""
        schema = (extra or {}).get("schema") or "the schema"
        return FinalOutput({"text/markdown": md, "text/plain": f"{top_plain}{plain}\n\n[{footer}]"},
                           meta, terminal=f"✓ the JSON matches {schema}{items}")
    meta = _metadata({**facts, **(extra or {})}, notes)
    if failed and transcript.empty:
        meta["dispatch_nb"]["footer"] = ""
        if not notes:  # nothing to show: the error follows
            return FinalOutput({}, meta, terminal="")
        # a terminal printed the notes when the cell started: nothing more to print
        return FinalOutput({"text/markdown": top.rstrip("\n"), "text/plain": top_plain.rstrip("\n")},
                           meta, terminal="")
    text = transcript.text

    def warned(warning: str) -> FinalOutput:
        """The answer as it came, with ``warning`` below it (a terminal prints only that)."""
        md = top + transcript.markdown() + f"\n\n⚠ *{html.escape(warning)}*" + _sub(footer)
        return FinalOutput({"text/markdown": md, "text/plain": text}, meta, terminal=f"⚠ {warning}")

    if fmt == "text":
        plain = transcript.plain()
        return FinalOutput({"text/plain": f"{top_plain}{plain}\n\n[{footer}]"}, meta, terminal=None)
    if fmt == "code":
        language, code, warning = extract_code(text)
        if warning:
            meta["dispatch_nb"]["code_note"] = warning
        if not code:
            return warned(warning or "")
        shown = f"```{language}\n{code}\n```"
        if warning:
            shown += f"\n\n⚠ *{html.escape(warning)}*"
        md = top + shown + _sub(footer + " · sent to the next cell")
        said = (f"⚠ {warning}\n" if warning else "") + "The code is in the next input."
        return FinalOutput({"text/markdown": md, "text/plain": code}, meta, terminal=said, code=code)
    if fmt == "json":
        try:
            value = parse_json_answer(text)
        except ValueError as exc:
            meta["dispatch_nb"]["json_error"] = str(exc)
            return warned(f"The answer is not valid JSON: {exc}")
        pretty = json.dumps(value, indent=2, ensure_ascii=False)
        data: dict[str, Any] = {
            "text/markdown": top + f"```json\n{pretty}\n```" + _sub(footer),
            "text/plain": pretty,
        }
        if isinstance(value, (dict, list)):
            data["application/json"] = value
        return FinalOutput(data, meta, terminal=None)
    md = top + transcript.markdown() + _sub(footer)
    return FinalOutput({"text/markdown": md, "text/plain": top_plain + (transcript.plain() or text)},
                       meta)


@dataclass
class CompareEntry:
    """One model's part of a comparison."""

    spec: str
    transcript: Transcript
    latency: float | None
    ttft: float | None
    error: str | None = None
    #: the error is the cell's interrupt (⏹), not a failure (⚠)
    interrupted: bool = False


def compare_output(
    entries: list[CompareEntry],
    *,
    extra: dict[str, Any] | None = None,
    notes: list[str] | None = None,
    parsed: list[Response | None] | None = None,
) -> FinalOutput:
    """One static comparison: a table of usage and latency, then each model's answer (``parsed``:
    their ``--schema`` answers, as one table with a column per model)."""
    rows = [
        "| model | tokens in / out | latency | first token | stop |",
        "|---|---:|---:|---:|---|",
    ]
    for e in entries:
        u = e.transcript.usage
        tokens = f"{u.input_tokens:,} / {u.output_tokens:,}" if u and u.total_tokens else "–"
        replayed = e.transcript.replayed and not e.error
        latency = "replayed" if replayed else f"{e.latency:.2f} s" if e.latency is not None else "–"
        ttft = "–" if replayed else f"{e.ttft:.2f} s" if e.ttft is not None else "–"
        mark = "⏹" if e.interrupted else "⚠"
        stop = f"{mark} {short_line(e.error, 60)}" if e.error else (e.transcript.stop_reason or "–")
        name = model_label(e.spec, e.transcript.model)
        rows.append(f"| `{name}` | {tokens} | {latency} | {ttft} | {stop.replace('|', '/')} |")
    sections = []
    plain = []
    for e in entries:
        mark = "⏹" if e.interrupted else "⚠"
        # a model that ended in an error before anything arrived shows the error alone, not an
        # empty answer ("(no text)") above it
        answered = not (e.error and e.transcript.empty)
        md_parts = [e.transcript.markdown()] if answered else []
        plain_parts = [e.transcript.plain()] if answered else []
        if e.error:
            md_parts.append(f"{mark} *{dollars(html.escape(e.error))}*")
            plain_parts.append(f"{mark} {e.error}")
        sections.append(f"#### {e.spec}\n\n" + "\n\n".join(md_parts))
        plain.append(f"== {e.spec} ==\n" + "\n".join(plain_parts))
    terminal = None
    if parsed is not None and any(r is not None for r in parsed):
        answers = [(e.spec, r) for e, r in zip(entries, parsed, strict=True) if r is not None]
        terminal = compare_parsed_table(answers)  # a terminal printed each JSON as it came
        failed = [e for e, r in zip(entries, parsed, strict=True) if r is None]
        sections = [compare_parsed_markdown(answers), *(
            f"#### {e.spec}\n\n{e.transcript.markdown() if not e.transcript.empty else ''}"
            f"\n\n⚠ *{dollars(html.escape(e.error or 'no structured answer'))}*" for e in failed)]
        plain = ([f"== {spec} ==\n{r.text}" for spec, r in answers]
                 + [f"== {e.spec} ==\n{'⏹' if e.interrupted else '⚠'} {e.error}" for e in failed])
    md = notes_markdown(list(notes or [])) + "\n".join(rows) + "\n\n" + "\n\n---\n\n".join(sections)
    compared = [{**e.transcript.metadata(e.latency, e.ttft), "error": e.error} for e in entries]
    meta = _metadata({"compare": compared, **(extra or {})}, list(notes or []))
    text = _notes_plain(notes or []) + "\n\n".join(plain)
    return FinalOutput({"text/markdown": md, "text/plain": text}, meta, terminal=terminal)


# ------------------------------------------------------------------------------------------------
# Errors

#: advice a core error gives in the Python API's words, at the end of its message (``; pass a
#: larger timeout=``, ``: set OPENAI_API_KEY or pass api_key=``, ``; bound ... Field(max_length=…)
#: ..., or pass a larger max_tokens=``): a magic gives its own advice instead (the fix)
_API_ADVICE = re.compile(r"(?:[;:]| —) (?:set|pass|use|bound)\b[^;]*?\b[a-z_]+=.*\Z", re.S)


def miss_facts(exc: BaseException) -> str:
    """A replay miss's message cut to its facts (the cell or row, the prompt, the model, the
    file): in a notebook the fix is said once, in the cell's error, in the magic's words. Any
    other error's message is returned whole."""
    message: str = getattr(exc, "message", str(exc))
    path = getattr(exc, "path", None)
    if getattr(exc, "code", None) != "cache_miss" or path is None:
        return message
    end = message.find(f" in {path}")
    return message[: end + len(f" in {path}")] if end >= 0 else message


def magic_words(text: str) -> str:
    """A core error's message as a magic says it: the Python API's advice at its end is dropped
    (the :class:`ChatError`'s fix says it with the magic's options), ``output=`` is the
    ``--schema`` value and ``budget=`` / ``max_tokens=`` are ``--budget`` / ``--max-tokens``."""
    text = _API_ADVICE.sub("", text)
    text = re.sub(r"\b(budget|max_tokens)=", lambda m: "--" + m[1].replace("_", "-"), text)
    return re.sub(r"\boutput=(?=\S)", "", text).replace("output= ", "the schema ")


def terminal_text(text: str) -> str:
    """A hint as a terminal shows it: no Markdown backticks around commands, ``$`` and HTML
    entities (``&gt;``) unescaped."""
    return html.unescape(text.replace("`", "").replace("\\$", "$"))


class ChatError(Exception):
    """An expected failure of a ``%%chat`` cell, shown by IPython (``_render_traceback_``) as two or
    three lines: the message and the fix; ``original`` is the underlying exception."""

    def __init__(self, title: str, message: str, fix: str = "", original: BaseException | None = None):
        super().__init__(f"{title}: {message}" + (f" — {fix}" if fix else ""))
        self.title = title
        self.message = message
        self.fix = fix
        self.original = original

    def _render_traceback_(self) -> list[str]:
        """What IPython shows (plain text in a terminal and a notebook alike: no Markdown)."""
        message = terminal_text(self.message)
        lines = [f"{_RED}{_BOLD}{self.title}{_RESET}{_RED}: {message}{_RESET}"]
        if self.fix:
            lines.append(f"→ {terminal_text(self.fix)}")
        return lines


class ChatInterrupted(KeyboardInterrupt):
    """Ctrl-C stopped a ``%%chat`` cell (or a login); what arrived stays visible above."""

    def _render_traceback_(self) -> list[str]:
        return [
            f"{_RED}{_BOLD}KeyboardInterrupt{_RESET}{_RED}: {self.args[0] if self.args else 'interrupted'}"
            f"{_RESET}"
        ]


def _context_fix(context: dict[str, Any]) -> str:
    turns = int(context.get("history_turns") or 0)
    if turns and not context.get("no_history"):
        return (
            f"The conversation ({turns} earlier turn{'s' if turns != 1 else ''}) no longer fits "
            "the model's context: start afresh with --new, send this cell alone with "
            "--no-history, or keep fewer turns (`%config ChatMagics.history_length = 5`)."
        )
    return (
        "The prompt alone is too long for this model: shorten it, interpolate less (smaller "
        "`%config ChatMagics.max_value_chars` / `max_rows`), or use a model with a larger "
        "context (-m)."
    )


#: the fix of an error whose fix does not depend on the error (the first class that matches)
_FIXES = {
    "APITimeoutError": "Run the cell again, or allow more time: `%config ChatMagics.timeout = 600`.",
    "APIConnectionError": "Check the network and the provider's base URL, then run the cell again.",
    "ServerError": "The provider failed; run the cell again in a moment.",
    "UnknownProviderError": "Write the model as provider:model, e.g. -m openai:gpt-4.1.",
}


def _same_prompt_miss(message: str, recorded: tuple[int, ...], earlier: int | None,
                      failed: list[str]) -> tuple[str, str]:
    """A replay miss whose prompt is recorded for this model in another request: the message
    says what differs (the conversation before it, or something else), the fix what to do
    (``failed``: the earlier cells of the thread that got no answer, e.g. ``["In[2]"]``)."""
    def count(values: tuple[int, ...]) -> str:
        if values == (0,):
            return "no earlier message"
        return f"{' or '.join(map(str, values))} earlier message{'' if values == (1,) else 's'}"

    if earlier is not None and earlier not in recorded:
        message += (f"; this prompt is recorded there for this model, but after a different "
                    f"conversation: {count(recorded)} before it, this cell sends "
                    f"{count((earlier,))} (the earlier cells of its thread are part of the "
                    "request)")
        if failed and max(recorded) > earlier:  # their turns are what is missing
            return message, (f"{failed[0]}, an earlier cell of this thread, got no answer in this "
                             "kernel, so its turn is missing from the conversation: fix that cell "
                             "first (run it as it was recorded; or record it again with --cache "
                             "read-write, and then this cell too: it was recorded after that "
                             "cell's old answer).")
        if 0 in recorded:
            return message, ("Run this cell alone with --no-history (or in a new thread with "
                             "--new), or restart the kernel and run the notebook from the top, "
                             "so the thread is what it was when recorded.")
        return message, ("Restart the kernel and run the notebook from the top, so the same cells "
                         "come before this one as when it was recorded (a cell run twice, or an "
                         "extra cell, adds turns); or ask the model and record the answer with "
                         "--cache read-write.")
    message += ("; this prompt is recorded there for this model, after as many messages, but "
                "the conversation before it, the system prompt, the tools or an option differ")
    return message, ("Run it as it was recorded: the notebook from the top in a fresh kernel, with "
                     "the same -s / ChatMagics.system, --tools, --max-tokens and --temperature; "
                     "or ask the model and record the answer with --cache read-write.")


def _not_set_up_fix(exc: Any) -> str:
    """The fix of a :class:`~dispatch_nb.registry.ProviderNotSetUpError`: the ``-m`` spec of the
    model's vendor and how to give it credentials, then the providers serving it too."""
    def how(spec: str) -> str:
        descriptor = find_descriptor(spec.partition(":")[0])
        if descriptor is None:
            return f"-m {spec}"
        if descriptor.key_env:
            return (f"-m {spec} after `%chat key {descriptor.name}` to type its key (nothing is "
                    f"saved in the notebook; or set {descriptor.key_env} in the environment "
                    "Jupyter starts from)")
        return f"-m {spec} after `%chat login {descriptor.name}`"

    return "Use " + "; or ".join(how(spec) for spec in (exc.spec, *exc.alternatives)) + "."


def explain_error(
    exc: BaseException,
    *,
    spec: str = "",
    available: list[str] | None = None,
    context: dict[str, Any] | None = None,
) -> ChatError:
    """A :class:`ChatError` saying what went wrong with ``exc`` and how to fix it; ``context`` is
    :attr:`CellRun.context <dispatch_nb.notebook.cell.CellRun.context>`, so the advice fits the cell."""
    import dispatch_nb.errors as e  # the module only: no import edge to the package

    if isinstance(exc, ChatError):
        return exc
    if isinstance(exc, PromptError):
        return ChatError("Prompt error", str(exc), original=exc)
    if not isinstance(exc, e.DispatchError):
        return ChatError(type(exc).__name__, str(exc) or repr(exc), original=exc)
    provider = exc.provider or spec.partition(":")[0]
    message = str(exc).replace(exc.message, magic_words(exc.message))
    fix = ""
    if isinstance(exc, e.AuthenticationError) and getattr(exc, "alternatives", None) is not None:
        fix = _not_set_up_fix(exc)  # a vendor's bare model name, and no credentials for it
    elif isinstance(exc, e.AuthenticationError):  # the provider's login hint
        descriptor = find_descriptor(provider)
        fix = descriptor.credentials_hint if descriptor else "Check the provider's credentials."
    elif isinstance(exc, e.RateLimitError):
        if exc.code == "quota_exceeded":
            fix = "Your quota or spending limit is used up: check the account, or use another model (-m)."
        elif exc.retry_after:
            fix = f"Wait {exc.retry_after:.0f} s, then run the cell again."
        else:
            fix = "Wait a little, then run the cell again."
    elif isinstance(exc, e.ModelUnavailableError):
        names = list(getattr(exc, "available", None) or available or [])
        if names:
            shown = ", ".join(names[:20]) + (f" … ({len(names) - 20} more)" if len(names) > 20 else "")
            fix = f"Available models: {shown}. Run `%chat models {provider}` for details."
        else:
            fix = f"Run `%chat models {provider}` to list the models you can use."
    elif isinstance(exc, e.ContextLengthError):
        fix = _context_fix(context or {})
    elif exc.code == "output_truncated":
        fix = (
            "Bound the schema's strings and lists (Field(max_length=…), Annotated[list[...], "
            "Field(max_length=…)]) so the whole answer fits; a larger --max-tokens mostly buys "
            "more rambling."
        )
    elif exc.code == "cache_miss" and (path := getattr(exc, "path", None)) is not None \
            and not path.exists():
        cut = exc.message.find(" Replay mode sends nothing")
        message = message.replace(exc.message, exc.message[:cut] if cut >= 0 else exc.message)
        fix = (
            "If the answers are recorded elsewhere, point the cache at that file: %config "
            "ChatMagics.cache_file = \"PATH\" (relative to the working directory above), or "
            "DISPATCH_NB_CACHE_FILE. If nothing is recorded yet, run the cell with --cache "
            "record, which makes the file there."
        )
    elif exc.code == "cache_miss":
        # the facts only (the cell, the prompt, the model, the file): the fix says what to do
        message = message.replace(exc.message, miss_facts(exc))
        fix = (
            "Only the prompts recorded with this notebook replay, word for word (a changed "
            "prompt, model, system prompt or option is a new request): if you edited this cell, "
            "undo the edit to see the recorded answer. Replay mode sends nothing to the model: "
            "run the cell with --cache off to ask it, or with --cache read-write to ask it and "
            "record the answer"
        )
        unavailable = getattr(exc, "unavailable", None)
        fix += (f"; that needs the model, which cannot run here: {unavailable.rstrip('.')}."
                if unavailable else ".")
        recorded = tuple(getattr(exc, "recorded_earlier", ()) or ())
        if recorded:  # the same prompt is recorded, in another request
            message, fix = _same_prompt_miss(message, recorded, getattr(exc, "earlier", None),
                                             (context or {}).get("failed_cells", []))
        elif getattr(exc, "spacing", False):
            message += ("; this prompt is recorded there for this model with other spaces or line "
                        "breaks (they are part of the prompt)")
            fix = ("Write the prompt with the spaces and line breaks it was recorded with, or ask "
                   "the model and record this version with --cache read-write.")
    elif exc.code != "plugin_unloadable":  # that one says what to do
        fix = next((_FIXES[c.__name__] for c in type(exc).__mro__ if c.__name__ in _FIXES), "")
    return ChatError(type(exc).__name__, message, fix, original=exc)
