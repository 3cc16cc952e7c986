"""What a ``%%chat`` cell leaves behind: the static final output, and short readable errors.

* :class:`Transcript` assembles the streamed events of one model (text, thinking, tool calls and
  their results, usage over every tool round) — the same events the live view shows, so what the
  final output says is exactly what streamed, partial answers included.
* :func:`final_output` turns it into ONE static output for the requested format (``markdown``,
  ``text``, ``code``, ``json``): ``text/markdown`` + ``text/plain`` with a small footer (model,
  tokens, latency, stop reason), and the same facts in the output's metadata under
  ``"dispatch_nb"``. No widget state is involved, so a saved notebook reads the same on GitHub,
  nbviewer and VS Code. :func:`compare_output` does the same for ``-m a,b,c``.
* :func:`explain_error` turns an expected error into a :class:`ChatError` whose rendering is a
  couple of lines — what went wrong and the fix — instead of a long traceback.
"""

from __future__ import annotations

import html
import json
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..types import Response, Usage

__all__ = [
    "ChatError",
    "ChatInterrupted",
    "FinalOutput",
    "ToolPart",
    "Transcript",
    "compare_output",
    "explain_error",
    "extract_code",
    "final_output",
    "parse_json_answer",
]

FORMATS = ("markdown", "text", "code", "json")
_RED, _BOLD, _RESET = "\x1b[31m", "\x1b[1m", "\x1b[0m"


# ------------------------------------------------------------------------------------------------
# Transcript


@dataclass
class ToolPart:
    """A tool call the model made and, once it ran, its result."""

    id: str
    name: str
    raw_arguments: list[str] = field(default_factory=list)
    arguments: dict[str, Any] | None = None
    result: str | None = None
    is_error: bool = False
    duration: float | None = None

    @property
    def arguments_text(self) -> str:
        """The arguments as compact JSON (or the raw fragments while they stream)."""
        if self.arguments is not None:
            return json.dumps(self.arguments, ensure_ascii=False)
        return "".join(self.raw_arguments)


@dataclass
class _TextPart:
    kind: str  # "text" | "thinking"
    pieces: list[str] = field(default_factory=list)

    @property
    def text(self) -> str:
        return "".join(self.pieces)


class Transcript:
    """Everything one model produced for a cell, in order, built from stream events."""

    def __init__(self, spec: str = "") -> None:
        self.spec = spec
        self.parts: list[_TextPart | ToolPart] = []
        self.model = ""
        self.stop_reason: str | None = None
        self.usage: Usage | None = None
        self.rounds = 0
        #: True when every model call was answered from the response cache (no latency to show)
        self.replayed = False
        #: True once any answer text arrived (cheap to ask on every repaint)
        self.has_text = False
        self._tools: dict[str, ToolPart] = {}

    # -- feeding ---------------------------------------------------------------------------------
    def feed(self, event: Any) -> None:
        """Record one ``StreamDelta`` / ``ToolResultEvent`` / ``MessageDoneEvent``."""
        kind = getattr(event, "type", None)
        if kind == "text_delta" or kind == "thinking_delta":
            name = "text" if kind == "text_delta" else "thinking"
            if name == "text" and event.text:
                self.has_text = True
            last = self.parts[-1] if self.parts else None
            if isinstance(last, _TextPart) and last.kind == name:
                last.pieces.append(event.text or "")
            else:
                self.parts.append(_TextPart(name, [event.text or ""]))
        elif kind == "tool_use_start":
            part = ToolPart(id=event.tool_call_id or "", name=event.tool_name or "?")
            self._tools[part.id] = part
            self.parts.append(part)
        elif kind == "tool_use_delta":
            tool = self._tools.get(event.tool_call_id or "")
            if tool is not None and event.argument_delta:
                tool.raw_arguments.append(event.argument_delta)
        elif kind == "tool_use_end":
            tool = self._tools.get(event.tool_call_id or "")
            if tool is not None:
                tool.arguments = event.arguments if event.arguments is not None else {}
        elif kind == "tool_result":
            result = event.result
            tool = self._tools.get(result.tool_use_id)
            if tool is not None:
                tool.result = result.text
                tool.is_error = result.is_error
                tool.duration = event.duration
        elif kind == "message_done":
            self.add_response(event.response)

    def add_response(self, response: Response) -> None:
        """Count one finished model round (usage adds up over tool rounds)."""
        self.rounds += 1
        self.usage = response.usage if self.usage is None else self.usage + response.usage
        self.model = response.model or self.model
        self.stop_reason = response.stop_reason

    def finish(self, response: Response | None) -> None:
        """Take usage/model/stop from the final ``Response`` unless rounds already supplied them."""
        if response is not None and self.rounds == 0:
            self.add_response(response)

    # -- reading ---------------------------------------------------------------------------------
    @property
    def text(self) -> str:
        """The answer's text (every round), without thinking or tool lines."""
        return "".join(p.text for p in self.parts if isinstance(p, _TextPart) and p.kind == "text")

    @property
    def thinking(self) -> str:
        """The visible reasoning, joined."""
        return "".join(
            p.text for p in self.parts if isinstance(p, _TextPart) and p.kind == "thinking"
        )

    @property
    def tools(self) -> list[ToolPart]:
        """The tool calls, in order."""
        return [p for p in self.parts if isinstance(p, ToolPart)]

    def footer(self, latency: float | None, *, note: str | None = None) -> str:
        """``model · 12 in / 7 out tokens · 1.2 s · stop`` (plus ``note``); a replayed answer
        says ``replayed`` instead of a latency."""
        parts: list[str] = []
        model = self.model or self.spec
        if model:
            parts.append(model)
        if self.usage is not None and self.usage.total_tokens:
            u = self.usage
            tokens = f"{u.input_tokens:,} in / {u.output_tokens:,} out tokens"
            if u.cache_read_tokens:
                tokens += f" ({u.cache_read_tokens:,} cached)"
            parts.append(tokens)
        if self.replayed:
            parts.append("replayed")
        elif latency is not None:
            parts.append(f"{latency:.1f} s")
        if self.rounds > 1:
            parts.append(f"{self.rounds} rounds")
        if self.stop_reason and self.stop_reason != "end_turn":
            parts.append(f"stop: {self.stop_reason}")
        if note:
            parts.append(note)
        return " · ".join(parts)

    def markdown(self) -> str:
        """The transcript as Markdown: thinking collapsed, text, tool calls with their results."""
        out: list[str] = []
        for part in self.parts:
            if isinstance(part, ToolPart):
                out.append(tool_markdown(part))
            elif part.kind == "thinking":
                body = part.text.strip()
                if body:
                    out.append(
                        "<details><summary>Thinking</summary>\n\n"
                        + html.escape(body, quote=False)
                        + "\n\n</details>\n"
                    )
            else:
                out.append(part.text)
        return "\n".join(s for s in out if s) or "*(no text)*"

    def plain(self) -> str:
        """The transcript as plain text (tool calls as one line each)."""
        out: list[str] = []
        for part in self.parts:
            if isinstance(part, ToolPart):
                out.append(f"\n[tool] {tool_line(part)}\n")
            elif part.kind == "text":
                out.append(part.text)
        return "".join(out).strip()

    def metadata(self, latency: float | None, ttft: float | None) -> dict[str, Any]:
        """Facts for the output's metadata (never a secret)."""
        u = self.usage
        facts: dict[str, Any] = {
            "spec": self.spec,
            "model": self.model,
            "stop_reason": self.stop_reason,
            "usage": {
                "input_tokens": u.input_tokens if u else 0,
                "output_tokens": u.output_tokens if u else 0,
                "cache_read_tokens": u.cache_read_tokens if u else 0,
                "cache_creation_tokens": u.cache_creation_tokens if u else 0,
            },
            "latency_s": None if latency is None else round(latency, 3),
            "time_to_first_token_s": None if ttft is None else round(ttft, 3),
            "rounds": self.rounds,
            "tool_calls": [t.name for t in self.tools],
        }
        if self.replayed:
            facts["replayed"] = True
        return facts


def _short(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def tool_line(part: ToolPart, limit: int = 160) -> str:
    """``name({"x": 1}) → result`` on one line."""
    line = f"{part.name}({_short(part.arguments_text, limit)})"
    if part.result is not None:
        arrow = "⚠" if part.is_error else "→"
        line += f" {arrow} {_short(part.result, limit)}"
    return line


def _code_span(text: str) -> str:
    fence = "`"
    while fence in text:
        fence += "`"
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def tool_markdown(part: ToolPart) -> str:
    """One tool call (and its result) as Markdown."""
    call = f"🔧 **{part.name}** {_code_span(_short(part.arguments_text, 300))}"
    if part.result is None:
        return call + "\n"
    label = "⚠ error" if part.is_error else "→"
    took = f" <sub>{part.duration:.2f} s</sub>" if part.duration else ""
    result = part.result
    if len(result) <= 200 and "\n" not in result:
        return f"{call} {label} {_code_span(result)}{took}\n"
    return (
        f"{call} {label}{took}\n\n<details><summary>result ({len(result):,} characters)"
        f"</summary>\n\n```\n{result[:4000]}\n```\n\n</details>\n"
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
    return f"\n\n<sub>{html.escape(text, quote=False)}</sub>"


_FENCE = re.compile(r"```[ \t]*([\w+#.-]*)[^\n]*\n(.*?)```", re.DOTALL)


def extract_code(text: str) -> tuple[str, str]:
    """The code in an answer: every fenced block joined (language of the first), else the text."""
    blocks = _FENCE.findall(text)
    if not blocks:
        return "", text.strip()
    language = blocks[0][0]
    return language, "\n\n".join(code.rstrip("\n") for _, code in blocks)


def parse_json_answer(text: str) -> Any:
    """JSON from an answer: code fences stripped; else the outermost ``{...}`` / ``[...]``.

    Raises ``ValueError`` (``json.JSONDecodeError``) when there is no valid JSON.
    """
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


def final_output(
    transcript: Transcript,
    *,
    fmt: str = "markdown",
    latency: float | None = None,
    ttft: float | None = None,
    extra: dict[str, Any] | None = None,
    note: str | None = None,
) -> FinalOutput:
    """The one static output a finished (or failed, or interrupted) cell leaves."""
    footer = transcript.footer(latency, note=note)
    meta = {
        "dispatch_nb": {
            **transcript.metadata(latency, ttft),
            "format": fmt,
            "footer": footer,
            **(extra or {}),
        }
    }
    text = transcript.text
    if fmt == "text":
        plain = transcript.plain()
        return FinalOutput({"text/plain": f"{plain}\n\n[{footer}]"}, meta, terminal=None)
    if fmt == "code":
        language, code = extract_code(text)
        md = f"```{language}\n{code}\n```" + _sub(footer + " · sent to the next cell")
        return FinalOutput({"text/markdown": md, "text/plain": code}, meta, terminal=code, code=code)
    if fmt == "json":
        try:
            value = parse_json_answer(text)
        except ValueError as exc:
            md = (
                transcript.markdown()
                + f"\n\n⚠ *The answer is not valid JSON: {html.escape(str(exc))}*"
                + _sub(footer)
            )
            meta["dispatch_nb"]["json_error"] = str(exc)
            return FinalOutput({"text/markdown": md, "text/plain": text}, meta, terminal=text)
        pretty = json.dumps(value, indent=2, ensure_ascii=False)
        data: dict[str, Any] = {
            "text/markdown": f"```json\n{pretty}\n```" + _sub(footer),
            "text/plain": pretty,
        }
        if isinstance(value, (dict, list)):
            data["application/json"] = value
        return FinalOutput(data, meta, terminal=pretty)
    md = transcript.markdown() + _sub(footer)
    return FinalOutput({"text/markdown": md, "text/plain": transcript.plain() or text}, meta)


@dataclass
class CompareEntry:
    """One model's part of a comparison."""

    spec: str
    transcript: Transcript
    latency: float | None
    ttft: float | None
    error: str | None = None


def compare_output(entries: list[CompareEntry], *, extra: dict[str, Any] | None = None) -> FinalOutput:
    """One static comparison: a table of usage and latency, then each model's answer."""
    rows = [
        "| model | tokens in / out | latency | first token | stop |",
        "|---|---:|---:|---:|---|",
    ]
    for e in entries:
        u = e.transcript.usage
        tokens = f"{u.input_tokens:,} / {u.output_tokens:,}" if u else "–"
        replayed = e.transcript.replayed and not e.error
        latency = "replayed" if replayed else f"{e.latency:.2f} s" if e.latency is not None else "–"
        ttft = "–" if replayed else f"{e.ttft:.2f} s" if e.ttft is not None else "–"
        stop = "⚠ " + _short(e.error, 60) if e.error else (e.transcript.stop_reason or "–")
        model = e.transcript.model or e.spec
        name = e.spec if model == e.spec.partition(":")[2] or model == e.spec else f"{e.spec} ({model})"
        rows.append(f"| `{name}` | {tokens} | {latency} | {ttft} | {stop.replace('|', '/')} |")
    sections = []
    plain = []
    for e in entries:
        body = e.transcript.markdown()
        if e.error:
            body += f"\n\n⚠ *{html.escape(e.error)}*"
        sections.append(f"#### {e.spec}\n\n{body}")
        plain.append(f"== {e.spec} ==\n{e.transcript.plain()}" + (f"\n[error] {e.error}" if e.error else ""))
    md = "\n".join(rows) + "\n\n" + "\n\n---\n\n".join(sections)
    meta = {
        "dispatch_nb": {
            "compare": [
                {**e.transcript.metadata(e.latency, e.ttft), "error": e.error} for e in entries
            ],
            **(extra or {}),
        }
    }
    text = "\n\n".join(plain)
    return FinalOutput({"text/markdown": md, "text/plain": text}, meta, terminal=None)


# ------------------------------------------------------------------------------------------------
# Errors


class ChatError(Exception):
    """An expected failure of a ``%%chat`` cell, shown as a short message plus the fix.

    IPython renders it through ``_render_traceback_``: two or three lines, no traceback.
    ``original`` is the underlying exception (``Err[n]`` holds this error; ``.original`` the cause).
    """

    def __init__(self, title: str, message: str, fix: str = "", original: BaseException | None = None):
        super().__init__(f"{title}: {message}" + (f" — {fix}" if fix else ""))
        self.title = title
        self.message = message
        self.fix = fix
        self.original = original

    def _render_traceback_(self) -> list[str]:
        lines = [f"{_RED}{_BOLD}{self.title}{_RESET}{_RED}: {self.message}{_RESET}"]
        if self.fix:
            lines.append(f"→ {self.fix}")
        return lines


class ChatInterrupted(KeyboardInterrupt):
    """Ctrl-C stopped a ``%%chat`` cell; the partial answer stays visible above."""

    def _render_traceback_(self) -> list[str]:
        return [
            f"{_RED}{_BOLD}KeyboardInterrupt{_RESET}{_RED}: {self.args[0] if self.args else 'interrupted'}"
            f"{_RESET}"
        ]


_KEY_FIX = {
    "copilot": "Run `%chat login` to sign in to GitHub Copilot (or set DISPATCH_NB_GITHUB_TOKEN).",
    "openai": "Set OPENAI_API_KEY (e.g. `%env OPENAI_API_KEY=sk-...`), or choose another model with -m.",
    "anthropic": (
        "Set ANTHROPIC_API_KEY (e.g. `%env ANTHROPIC_API_KEY=...`), or choose another model with -m."
    ),
    "compatible": "Check the server's API key (OPENAI_API_KEY) and OPENAI_BASE_URL.",
}


def explain_error(exc: BaseException, *, spec: str = "", available: list[str] | None = None) -> ChatError:
    """A :class:`ChatError` saying what went wrong with ``exc`` and how to fix it."""
    from .. import errors as e
    from .prompt import PromptError

    if isinstance(exc, ChatError):
        return exc
    if isinstance(exc, PromptError):
        return ChatError("Prompt error", str(exc), original=exc)
    if not isinstance(exc, e.DispatchError):
        return ChatError(type(exc).__name__, str(exc) or repr(exc), original=exc)
    provider = exc.provider or spec.partition(":")[0]
    title = type(exc).__name__
    message = str(exc)
    fix = ""
    if isinstance(exc, e.AuthenticationError):
        fix = _KEY_FIX.get(provider, "Check the provider's credentials.")
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
        fix = (
            "The conversation no longer fits the model's context: use --new or --no-history, "
            "`%chat reset`, or a lower `%config ChatMagics.history_length`."
        )
    elif isinstance(exc, e.APITimeoutError):
        fix = "Run the cell again, or allow more time: `%config ChatMagics.timeout = 600`."
    elif isinstance(exc, e.APIConnectionError):
        fix = "Check the network and the provider's base URL, then run the cell again."
    elif isinstance(exc, e.ServerError):
        fix = "The provider failed; run the cell again in a moment."
    elif isinstance(exc, e.RequestCancelled):
        fix = ""
    elif exc.code == "cache_miss":
        fix = (
            "This answer was never recorded: run the cell once with --cache read-write (or "
            "record) where the model is reachable, or use --cache off."
        )
    elif type(exc).__name__ == "UnknownProviderError":
        fix = "Write the model as provider:model, e.g. -m openai:gpt-4.1."
    return ChatError(title, message, fix, original=exc)
