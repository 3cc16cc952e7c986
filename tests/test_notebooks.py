"""The example notebooks (``notebooks/``) replay their recorded answers, identically, offline.

``pytest`` also runs every notebook under nbval (``--nbval``, see pyproject's ``addopts`` and
``notebooks/conftest.py``), which compares each cell's outputs with the saved ones. Here the whole
notebook is checked through nbclient: two replays (one with widgets) give the same outputs, and the
same outputs as the recording run saved in the notebook (timings — this run's wall clock — masked).
The kernels get no credentials and no network.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import nbformat
import pytest

from tests.notebooks_support import (
    NOTEBOOK_NAMES,
    NOTEBOOKS,
    WIDGET_VIEW,
    execute,
    kernel_env,
    normalized_outputs,
)

CACHE_SUFFIX = ".dispatch-cache.jsonl"


def _saved(name: str) -> Any:
    return nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)


def _chat_cells(nb: Any) -> list[Any]:
    return [c for c in nb.cells if c.cell_type == "code" and c.source.startswith("%%chat")]


@pytest.mark.parametrize("name", NOTEBOOK_NAMES)
def test_saved_notebook_reads_well_on_github(name: str) -> None:
    nb = _saved(name)
    assert "widgets" not in nb.metadata  # no widget state saved
    assert nb.cells[0].cell_type == "markdown" and nb.cells[0].source.startswith("# ")
    setup = nb.cells[1].source
    assert 'os.environ.setdefault("DISPATCH_NB_CACHE", "replay")' in setup
    assert f'%config ChatMagics.cache_file = "{name}{CACHE_SUFFIX}"' in setup
    chats = _chat_cells(nb)
    assert chats, "every example notebook asks the model something"
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            assert WIDGET_VIEW not in output.get("data", {})
            assert output["output_type"] != "error"
    for cell in chats:
        [final] = cell.outputs  # one static output per answer
        assert "text/markdown" in final.data and "text/plain" in final.data
        facts = final.metadata["dispatch_nb"]  # model, usage, stop reason (per model: compare)
        assert all(m["stop_reason"] for m in facts.get("compare", [facts]))
    markdown = sum(c.cell_type == "markdown" for c in nb.cells)
    assert markdown >= len(nb.cells) // 3  # the notebook explains itself


@pytest.mark.parametrize("name", NOTEBOOK_NAMES)
def test_cache_file_is_committed_beside_the_notebook(name: str) -> None:
    lines = (NOTEBOOKS / f"{name}{CACHE_SUFFIX}").read_text(encoding="utf-8").splitlines()
    entries = [json.loads(line) for line in lines]
    assert entries
    keys = [e["key"] for e in entries]
    assert len(set(keys)) == len(keys)  # no stale duplicates
    for entry in entries:
        if entry.get("kind") in ("mcp_tools", "mcp_call"):  # a real MCP server's listing/result
            assert entry["request"]["server"] and entry["response"]
            continue
        # Recorded from the embedded model's real runs (deltas with their arrival times).
        assert entry["provider"] == "local"
        assert entry["deltas"] and all("t" in d for d in entry["deltas"])
        assert entry["response"]["usage"]["output_tokens"] > 0


@pytest.mark.kernel
@pytest.mark.timeout(600)
@pytest.mark.parametrize("name", NOTEBOOK_NAMES)
def test_replay_is_identical_across_runs_and_to_the_recording(name: str, tmp_path: Path) -> None:
    path = NOTEBOOKS / f"{name}.ipynb"
    cache = NOTEBOOKS / f"{name}{CACHE_SUFFIX}"
    before = (path.read_bytes(), cache.read_bytes())
    # The notebook selects replay by itself; the second run also renders with widgets.
    first = execute(path, kernel_env(tmp_path))
    second = execute(path, kernel_env(tmp_path, DISPATCH_NB_CACHE="replay", DISPATCH_NB_LIVE="widget"))
    assert normalized_outputs(first) == normalized_outputs(second)
    assert normalized_outputs(first) == normalized_outputs(_saved(name))
    answers = [c.outputs[0].data["text/markdown"] for c in _chat_cells(first)]
    assert all(answers) and len(answers) == len(_chat_cells(_saved(name)))
    assert (path.read_bytes(), cache.read_bytes()) == before  # replay writes nothing
