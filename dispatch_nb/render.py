"""Render a :class:`~dispatch_nb.types.Response` as Markdown / HTML (no IPython needed).

Used by ``Response._repr_markdown_`` / ``_repr_html_`` and by the notebook's final output, so a
saved notebook reads the same on GitHub, nbviewer and VS Code.
"""

from __future__ import annotations

import html
import json
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .types import Response

__all__ = ["footer_text", "markdown_to_html", "response_markdown"]


def footer_text(
    response: Response, *, latency: float | None = None, extra: dict[str, Any] | None = None
) -> str:
    """``model · 12 in / 7 out tokens · 1.2 s · end_turn``."""
    parts: list[str] = []
    if response.model:
        parts.append(response.model)
    u = response.usage
    tokens = f"{u.input_tokens} in / {u.output_tokens} out tokens"
    if u.cache_read_tokens:
        tokens += f" ({u.cache_read_tokens} cached)"
    parts.append(tokens)
    if latency is not None:
        parts.append(f"{latency:.1f} s")
    if response.stop_reason and response.stop_reason != "end_turn":
        parts.append(response.stop_reason)
    for key, value in (extra or {}).items():
        parts.append(f"{key} {value}")
    return " · ".join(parts)


def response_markdown(
    response: Response, *, footer: bool = True, latency: float | None = None
) -> str:
    """The response as Markdown: thinking collapsed, text, tool calls, and a small footer."""
    out: list[str] = []
    thinking = response.thinking
    if thinking.strip():
        out.append(
            "<details><summary>Thinking</summary>\n\n"
            + html.escape(thinking.strip(), quote=False)
            + "\n\n</details>\n"
        )
    if response.text:
        out.append(response.text)
    for call in response.tool_calls:
        args = json.dumps(call.arguments, ensure_ascii=False)
        out.append(f"\n🔧 `{call.name}({args})`")
    if not out:
        out.append("*(no text)*")
    if footer:
        out.append(f"\n\n<sub>{html.escape(footer_text(response, latency=latency))}</sub>")
    return "\n".join(out)


def markdown_to_html(text: str) -> str | None:
    """Markdown → HTML with markdown-it-py when it is installed, else None."""
    try:
        from markdown_it import MarkdownIt
    except ImportError:
        return None
    # CommonMark plus GFM tables and strikethrough ("gfm-like" would also need linkify-it-py).
    md = MarkdownIt("commonmark", {"html": True}).enable(["table", "strikethrough"])
    return str(md.render(text))
