"""The recipes people copy from the docs, notebooks and README keep secrets out of notebooks."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
#: ``%env NAME=value`` (IPython echoes it into the saved output) or ``os.environ[NAME] = "..."``
#: (the value is in the saved cell) for a secret's variable
_SECRET_RECIPE = re.compile(
    r"%env\s+[A-Z0-9_]*(?:KEY|TOKEN|SECRET)[A-Z0-9_]*\s*[= ]"
    r"|os\.environ\[\s*['\"][A-Z0-9_]*(?:KEY|TOKEN|SECRET)[A-Z0-9_]*['\"]\s*\]\s*=\s*['\"]"
)


def _documents() -> list[Path]:
    found = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md")),
             *sorted((REPO / "notebooks").rglob("*.ipynb")), *sorted((REPO / "binder").rglob("*"))]
    return [p for p in found if p.is_file()]


def test_no_recipe_puts_a_key_into_a_notebook() -> None:
    """One safe recipe everywhere: ``%chat key PROVIDER`` (or the environment Jupyter starts
    from), never a key typed into a cell."""
    offending = []
    for path in _documents():
        text = path.read_text(errors="replace")
        for match in _SECRET_RECIPE.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            context = text[match.start():match.start() + 60].splitlines()[0]
            # the docs may name the bad recipe to warn against it ("never `%env KEY=...`")
            before = text[max(0, match.start() - 40):match.start()].lower()
            if "never" in before or "not " in before:
                continue
            offending.append(f"{path.relative_to(REPO)}:{line}: {context}")
    assert offending == []
    assert len(_documents()) > 10  # the scan reads the docs and the notebooks
    assert "%chat key openai" in (REPO / "docs" / "openai.md").read_text()
