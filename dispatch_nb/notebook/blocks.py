"""A streaming Markdown answer cut into blocks, so the live view can show it rendered while sending
bytes linear in its length (``docs/notebook.md``, "How it renders while it streams" and "Cost on
the wire"). Nothing here imports IPython; markdown-it-py is imported on first use.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from functools import lru_cache
from itertools import pairwise
from typing import Any

from ..render import ANY_FENCE, close_open_fence, code_fences, inert_html, money, scan_inline

__all__ = [
    "BLOCK_LIMIT", "Block", "MarkdownBlocks", "close_open_fence", "stable_prefix", "warm_up",
]

#: the most characters the growing block may reach before it is cut (see the module docstring)
BLOCK_LIMIT = 600


@dataclass
class Block:
    """One piece of the answer to render: ``source`` is Markdown; ``continued`` is True when it
    continues the block before it (a long block cut in pieces), ``hide_header`` when its first
    two lines repeat a table's header (the live view hides them)."""

    source: str
    continued: bool = False
    hide_header: bool = False


@lru_cache(maxsize=1)
def _parser() -> Any:
    from markdown_it import MarkdownIt

    return MarkdownIt("commonmark", {"html": True}).enable(["table", "strikethrough"])


def warm_up() -> None:
    """Load markdown-it-py on a background thread (about 0.1–0.2 s), so the first block of the
    first answer is not held up by the import."""
    if _parser.cache_info().currsize:
        return
    import threading

    threading.Thread(target=_parser, name="dispatch_nb-markdown", daemon=True).start()


def block_starts(text: str) -> list[tuple[int, str]]:
    """``(first line, token type)`` of every top-level block of ``text``."""
    return [(token.map[0], token.type) for token in _parser().parse(text)
            if token.level == 0 and token.nesting >= 0 and token.map is not None]


_MARKER_ONLY = re.compile(r"^[ \t]*(?:[-+*>#|=_~`:.]+|\d{1,9}[.)]?)?[ \t]*$")
_DELIMITER_ROW = re.compile(r"^[ \t]*\|?[ \t]*:?-+:?[ \t]*(?:\|[ \t]*:?-+:?[ \t]*)*\|?[ \t]*$")
_ITEM = re.compile(r"^( {0,3})(?:[-+*]|\d{1,9}[.)])(?:[ \t]|$)")


def _shown(source: str) -> str:
    """A block of the answer as the live view shows it (:func:`render.answer_markdown` without
    closing its fence: the view closes it where it adds the status line)."""
    return money(inert_html(source))


# ------------------------------------------------------------------------------------------------
# what of the growing block can be shown


def stable_prefix(block: str) -> str:
    """The part of the growing ``block`` whose rendering more text cannot change (without
    trailing blank space)."""
    return _stable(block).rstrip()


def _stable(block: str) -> str:
    head, _, last = block.rpartition("\n")
    lines = block.split("\n")
    if code_fences(lines[:-1])[1] is not None:
        # Inside an open code block: a partial line of fence characters may be the closing fence.
        if not last.strip() or set(last.strip()) <= {"`", "~"}:
            return head + "\n" if head else ""
        return block
    if _MARKER_ONLY.match(last):
        block = head + "\n" if head else ""
        lines = block.split("\n")
    code = code_fences(lines, ANY_FENCE)[0]  # inside a list item or quote too
    if code and code[-1] and lines[-1].strip():
        return block  # inside a fenced block of a list item or quote: code, shown as it is
    block = _hold_tables(block, code)
    lines = block.split("\n")
    code = code[: len(lines)]
    prose = "\n".join(" " * len(line) if c else line for line, c in zip(lines, code, strict=False))
    cut = _open_at(prose)
    return block if cut is None else block[:cut].rstrip(" \t")


def _hold_tables(block: str, code: list[bool]) -> str:
    """Hold back a table header until its delimiter row is complete, and a partial table row."""
    lines = block.split("\n")
    complete, partial = lines[:-1], lines[-1]
    in_table = False
    for i, line in enumerate(complete):
        if code[i]:
            in_table = False
            continue
        if in_table:
            if "|" not in line:
                in_table = False
            continue
        if "|" in line:
            following = complete[i + 1] if i + 1 < len(complete) else None
            if following is not None and _DELIMITER_ROW.match(following) and "-" in following:
                in_table = True
                continue
            if following is None:  # a possible header: wait for the delimiter row
                return "\n".join(lines[:i])
    if in_table:  # only whole rows
        return "\n".join(complete)
    if "|" in partial:
        return "\n".join(complete) + ("\n" if complete else "")
    return block


_PUNCT = re.compile(r"[!-/:-@\[-`{-~\s]")


def _open_at(block: str) -> int | None:
    """Where the first inline construct still open in ``block`` begins (None: none is)."""
    if not block:
        return None
    masked, _, cut = scan_inline(block, growing=True)
    candidates = [cut] if cut is not None else []
    scan = masked if cut is None else masked[:cut]
    # emphasis and strikethrough: delimiter runs with CommonMark's flanking rules
    stacks: dict[str, list[int]] = {"*": [], "_": [], "~": []}
    for match in re.finditer(r"\*+|_+|~+", scan):
        start, end = match.span()
        char = scan[start]
        before = scan[start - 1] if start > 0 else "\n"
        if end == len(block):  # the run ends the text: it may be an opener still growing
            candidates.append(start)
            break
        after = masked[end]  # past the scan: the code span or math left open
        left = not after.isspace() and (not _PUNCT.match(after) or bool(_PUNCT.match(before)))
        right = not before.isspace() and (not _PUNCT.match(before) or bool(_PUNCT.match(after)))
        if char == "_":
            can_open = left and (not right or bool(_PUNCT.match(before)))
            can_close = right and (not left or bool(_PUNCT.match(after)))
        else:
            can_open, can_close = left, right
        if char == "~" and end - start > 2:
            continue
        stack = stacks[char]
        if can_close and stack:
            stack.pop()
        elif can_open:
            stack.append(start)
    candidates += [stack[0] for stack in stacks.values() if stack]
    # links and images: "[" without its "]", or "](" without its ")"
    depth: list[int] = []
    i = 0
    while i < len(scan):
        c = scan[i]
        if c == "\\":
            i += 2
            continue
        if c == "[":
            depth.append(i - 1 if i > 0 and scan[i - 1] == "!" else i)
        elif c == "]" and depth:
            opener = depth.pop()
            if i + 1 == len(scan):  # "[text]" may still become a link: wait for what follows
                candidates.append(opener)
                break
            if scan.startswith("(", i + 1):
                close = scan.find(")", i + 2)
                if close < 0:
                    candidates.append(opener)
                    break
                i = close
        i += 1
    if depth:
        candidates.append(depth[0])
    # an HTML tag or autolink being typed, an entity, a trailing backslash
    for pattern in (r"<(?:[A-Za-z/!?][^<>\n]*)?$", r"&#?[A-Za-z0-9]*$"):
        if found := re.search(pattern, scan):
            candidates.append(found.start())
    if scan.endswith("\\") and not scan.endswith("\\\\"):
        candidates.append(len(scan) - 1)
    return min(candidates) if candidates else None


# ------------------------------------------------------------------------------------------------
# cutting the text in blocks


def _fitting(lines: list[str], first: int, limit: int) -> int:
    """How many of the complete ``lines`` a piece cut at a line boundary keeps: the ``first``
    ones (a fence's opening, a table's header and delimiter row) and at least one more, then as
    many as fit in ``limit`` characters, never the last."""
    k, size = first, sum(len(line) + 1 for line in lines[:first])
    while k < len(lines) - 1 and size + len(lines[k]) + 1 <= limit:
        size += len(lines[k]) + 1
        k += 1
    return max(k, first + 1)


class MarkdownBlocks:
    """The blocks of a growing Markdown text: ``feed(text)`` appends; ``take()`` returns the blocks
    finished since the last call and the current block (show its :func:`stable_prefix`)."""

    def __init__(self, limit: int = BLOCK_LIMIT) -> None:
        self.limit = limit
        self._pieces: list[str] = []
        self._text = ""
        self._start = 0  # where the unfinished part begins in the text
        self._carry = ""  # text to put before it (a reopened fence, a repeated table header)
        self._carry_hides_header = False
        self._continued = False

    def feed(self, text: str) -> None:
        """Append ``text``."""
        if text:
            self._pieces.append(text)

    @property
    def text(self) -> str:
        """Everything fed so far."""
        if self._pieces:
            self._text += "".join(self._pieces)
            self._pieces.clear()
        return self._text

    def take(self) -> tuple[list[Block], Block]:
        """``(finished blocks, current block)``; each finished block is returned once."""
        text = self.text
        finished: list[Block] = []
        while True:
            tail = self._carry + text[self._start :]
            lines = tail.split("\n")
            complete = len(lines) - 1
            starts = block_starts(tail) if tail.strip() else []
            if starts and starts[0][0] > 0:  # blank lines before the first block
                self._advance(sum(len(line) + 1 for line in lines[: starts[0][0]]))
                continue
            # A block is finished once a later block has begun for sure: on a complete line, or
            # on the partial line after a blank one (a partial line right after text may still
            # turn out to continue it: "#include" after a paragraph).
            sure = [
                k for k, (line, _) in enumerate(starts)
                if k and (line < complete or not lines[line - 1].strip())
            ]
            if sure:
                last = sure[-1]
                for (line, _), (next_line, _) in pairwise(starts[: last + 1]):
                    source = "\n".join(lines[line:next_line]).rstrip("\n")
                    finished.append(self._block(source, first=line == 0))
                self._advance(sum(len(line) + 1 for line in lines[: starts[last][0]]))
                continue
            if len(tail) > self.limit:
                kind = starts[0][1].removesuffix("_open") if starts else "paragraph"
                piece = self._cut_long(tail, kind)
                if piece is not None:
                    finished.append(piece)
                    continue
            return finished, self._block(tail, first=True, keep_flags=True)

    def shown(self, final: bool = False) -> tuple[list[Block], Block, str]:
        """:meth:`take`, and what to show of the current block: all of it once the text is
        ``final``, else its :func:`stable_prefix`."""
        finished, current = self.take()
        shown = current.source.rstrip() if final else stable_prefix(current.source)
        # as in the final output: raw HTML reads as text, a "$" that is no math delimiter as a
        # dollar sign (render.answer_markdown; the status line's fence is closed where it goes)
        return ([replace(b, source=_shown(b.source)) for b in finished], current, _shown(shown))

    # -- internals -------------------------------------------------------------------------------
    def _block(self, source: str, *, first: bool, keep_flags: bool = False) -> Block:
        block = Block(
            source,
            continued=self._continued and first,
            hide_header=self._carry_hides_header and first,
        )
        if not keep_flags and first:
            self._continued = False
            self._carry_hides_header = False
        return block

    def _advance(self, cut: int, carry: str = "") -> None:
        """The first ``cut`` characters of carry + text are finished (no block boundary is inside
        the carry: it is a fence's opening or a table's header); put ``carry`` before the rest."""
        self._start += cut - len(self._carry)
        self._carry = carry

    def _piece(self, source: str, cut: int, carry: str = "") -> Block:
        """A finished piece of a long block: ``source``, the first ``cut`` characters of carry +
        text; what remains continues it, after ``carry``."""
        piece = self._block(source, first=True)
        self._continued = True
        self._advance(cut, carry)
        return piece

    def _cut_long(self, tail: str, kind: str) -> Block | None:
        """Cut a finished piece off a block longer than the limit (None: no safe place yet)."""
        lines = tail.split("\n")
        complete = lines[:-1]
        if kind == "fence":
            fence = code_fences(complete)[1]
            if fence is None or len(complete) < 2:
                return None
            opening, marker = fence
            k = _fitting(complete, 1, self.limit)
            body = "\n".join(complete[:k])
            return self._piece(body + "\n" + marker, len(body) + 1, opening + "\n")
        if kind == "table":
            if len(complete) < 3:
                return None
            # The continuation needs a header row to be a table: an empty one (nothing to read
            # twice; the widget view hides it), with the same delimiter row (column alignment).
            columns = max(1, complete[1].strip().strip("|").count("|") + 1)
            header = "|" + "   |" * columns + "\n" + complete[1] + "\n"
            k = _fitting(complete, 2, self.limit)
            body = "\n".join(complete[:k])
            piece = self._piece(body, len(body) + 1, header)
            self._carry_hides_header = True
            return piece
        if kind in ("bullet_list", "ordered_list"):
            indent = _ITEM.match(complete[0]) if complete else None
            if indent is None:
                return None
            width = len(indent.group(1))
            cut_line = None
            size = 0
            for k, line in enumerate(complete):
                if k and size > 0 and size + len(line) > self.limit:
                    break
                item = _ITEM.match(line)
                if k and item and len(item.group(1)) == width:
                    cut_line = k
                size += len(line) + 1
            if cut_line is None:
                return self._cut_text(tail)
            cut = sum(len(line) + 1 for line in lines[:cut_line])
            return self._piece(tail[:cut].rstrip("\n"), cut)
        if kind in ("paragraph", "blockquote", "heading"):
            return self._cut_text(tail)
        return None

    def _cut_text(self, tail: str) -> Block | None:
        """Cut prose at a space (the last sentence end when there is one) where no inline
        construct is open, at most ``limit`` characters in."""
        window = tail[: self.limit]
        spaces = [m.start() for m in re.finditer(r"[ \t\n]+", window)]
        if not spaces:
            if len(tail) < 2 * self.limit:
                return None
            spaces = [self.limit]  # a "word" of thousands of characters: cut it after all
        sentence = [s for s in spaces if s > self.limit // 2 and window[s - 1] in ".!?:;"]
        for position in [*reversed(sentence), *reversed(spaces)]:
            if position < self.limit // 4:
                break
            head = tail[:position]
            if _open_at(head) is None and not _MARKER_ONLY.match(
                head.rsplit("\n", 1)[-1]
            ):
                rest = position
                while rest < len(tail) and tail[rest] in " \t\n":
                    rest += 1
                return self._piece(head.rstrip(), rest)
        return None
