"""Reading a ``%%chat -m a,b`` comparison's markdown back: its table rows and its sections, by model.

A comparison is a table (one row per model) and then one ``#### spec`` section per model, separated
by ``---``. Tests look each model's answer up here, so an answer under the wrong heading fails.
"""

from __future__ import annotations


def table_rows(markdown: str) -> dict[str, str]:
    """``{spec: row}`` for the table's model rows (the spec is the row's first, code cell)."""
    rows = {}
    for line in markdown.split("\n\n", 1)[0].splitlines()[2:]:
        name = line.split("`")[1]
        rows[name.split(" (")[0]] = line
    return rows


def sections(markdown: str) -> dict[str, str]:
    """``{spec: body}`` for each model's section, in order."""
    found = {}
    for part in markdown.split("\n\n", 1)[1].split("\n\n---\n\n"):
        heading, _, body = part.partition("\n\n")
        assert heading.startswith("#### "), part
        found[heading.removeprefix("#### ")] = body
    return found
