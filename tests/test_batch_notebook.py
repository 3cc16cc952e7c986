"""``notebooks/evaluation.ipynb``: ``batch`` over a labelled set, recorded from the embedded model,
replays offline — identically, writing nothing, with static progress lines instead of widgets."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import nbformat
import pytest

from tests.notebooks_support import NOTEBOOKS, WIDGET_VIEW, execute, kernel_env, normalized_outputs

NAME = "evaluation"
NOTEBOOK = NOTEBOOKS / f"{NAME}.ipynb"
CACHE = NOTEBOOKS / f"{NAME}.dispatch-cache.jsonl"


def _without_images(outputs: list[list[dict[str, Any]]]) -> list[list[dict[str, Any]]]:
    """PNG bytes depend on the machine's font rendering: compare that a plot is there, not its
    pixels."""
    out = []
    for cell in outputs:
        kept = []
        for output in cell:
            data = dict(output.get("data", {}))
            if "image/png" in data:
                data["image/png"] = "<png>"
            kept.append({**output, "data": data} if "data" in output else output)
        out.append(kept)
    return out


def _batch_lines(nb: Any) -> list[str]:
    lines = []
    for cell in nb.cells:
        if cell.cell_type == "code" and "batch(" in cell.source:
            lines += [o["data"]["text/plain"] for o in cell.outputs if o.get("data")]
    return lines


def test_the_saved_notebook_reads_well_without_a_kernel() -> None:
    nb = nbformat.read(NOTEBOOK, as_version=4)
    assert nb.cells[0].cell_type == "markdown" and nb.cells[0].source.startswith("# ")
    replay = 'os.environ["DISPATCH_NB_CACHE"] = os.environ.get("DISPATCH_NB_CACHE") or "replay"'
    assert replay in nb.cells[1].source
    assert f'ResponseCache("{NAME}.dispatch-cache.jsonl")' in nb.cells[1].source
    assert "widgets" not in nb.metadata
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            assert WIDGET_VIEW not in output.get("data", {})  # the bar became one static line
            assert output["output_type"] != "error"
    lines = _batch_lines(nb)
    assert len(lines) == 2
    assert all(line.startswith("batch local:smollm2: 12 rows: 12 ok; 12 replayed") for line in lines)
    assert any("image/png" in o.get("data", {}) for c in nb.cells for o in c.get("outputs", []))
    assert sum(c.cell_type == "markdown" for c in nb.cells) >= len(nb.cells) // 3


def test_the_answers_were_recorded_from_the_embedded_model() -> None:
    entries = [json.loads(line) for line in CACHE.read_text(encoding="utf-8").splitlines()]
    assert len(entries) == 24  # 12 reviews × 2 prompts
    assert len({e["key"] for e in entries}) == 24
    assert {e["provider"] for e in entries} == {"local"} and {e["model"] for e in entries} == {
        "smollm2"}
    assert sorted({e["label"] for e in entries}) == sorted(f"row {i}" for i in range(12))
    for entry in entries:
        assert entry["streamed"] and entry["deltas"] and all("t" in d for d in entry["deltas"])
        assert entry["response"]["usage"]["output_tokens"] > 0


@pytest.mark.kernel
@pytest.mark.timeout(600)
def test_it_replays_offline_identically_to_the_saved_outputs(tmp_path: Path) -> None:
    before = (NOTEBOOK.read_bytes(), CACHE.read_bytes())
    replayed = execute(NOTEBOOK, kernel_env(tmp_path), timeout=300)
    saved = nbformat.read(NOTEBOOK, as_version=4)
    assert _without_images(normalized_outputs(replayed)) == _without_images(
        normalized_outputs(saved))
    assert (NOTEBOOK.read_bytes(), CACHE.read_bytes()) == before  # replay writes nothing
