"""The example notebooks (``notebooks/``) replay their recorded answers, identically, offline.

``pytest`` also runs every notebook under nbval (``--nbval``, see pyproject's ``addopts`` and
``notebooks/conftest.py``), which compares each cell's outputs with the saved ones. Here the whole
notebook is checked through nbclient: two replays (one with widgets) give the same outputs, and the
same outputs as the recording run saved in the notebook (timings — this run's wall clock — masked).
The kernels get no credentials and no network.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import nbformat
import pytest

from tests.notebooks_support import (
    NOTEBOOK_NAMES,
    NOTEBOOKS,
    REPO,
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
def test_the_setup_cell_replays_unless_the_environment_says_otherwise(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An empty ``DISPATCH_NB_CACHE=`` (a blank line of a ``.env`` file or a CI template) is
    unset: the notebook replays; a value set is kept. (``setdefault`` kept the empty value,
    which means ``off``: the model was asked.)"""
    [line] = [line for line in _saved(name).cells[1].source.splitlines()
              if "DISPATCH_NB_CACHE" in line and line.startswith("os.environ")]
    python = ["import os", line]
    for given, expected in (("", "replay"), (None, "replay"), ("record", "record")):
        if given is None:
            monkeypatch.delenv("DISPATCH_NB_CACHE", raising=False)
        else:
            monkeypatch.setenv("DISPATCH_NB_CACHE", given)
        exec("\n".join(python), {})
        assert os.environ["DISPATCH_NB_CACHE"] == expected, (name, given)


@pytest.mark.parametrize("name", NOTEBOOK_NAMES)
def test_saved_notebook_reads_well_on_github(name: str) -> None:
    nb = _saved(name)
    assert "widgets" not in nb.metadata  # no widget state saved
    assert nb.cells[0].cell_type == "markdown" and nb.cells[0].source.startswith("# ")
    setup = nb.cells[1].source
    assert 'os.environ["DISPATCH_NB_CACHE"] = os.environ.get("DISPATCH_NB_CACHE") or "replay"' in setup
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


# -- notebooks/deferred.ipynb: a deferred batch, replayed from its checkpoint ---------------------
# Its answers are not a response cache's but a deferred batch's checkpoint (the job and the rows),
# recorded by notebooks/record_deferred.py: a loopback server speaking OpenAI's Batch API
# (tests/fakes/batch_api.py) whose requests the embedded model answered.
DEFERRED = NOTEBOOKS / "deferred.ipynb"
DEFERRED_CHECKPOINT = NOTEBOOKS / "deferred.checkpoint.jsonl"


def test_deferred_notebook_says_how_it_was_recorded_and_reads_well_on_github() -> None:
    nb = _saved("deferred")
    intro = nb.cells[0].source
    assert intro.startswith("# ")
    assert "loopback server speaking OpenAI's Batch API" in intro and "embedded model" in intro
    assert "OPENAI_API_KEY" in intro and "MODEL" in intro  # what to change to run it for real
    assert "record_deferred.py" in intro
    assert 'CHECKPOINT = "deferred.checkpoint.jsonl"' in nb.cells[1].source
    assert "widgets" not in nb.metadata
    code = [c for c in nb.cells if c.cell_type == "code"]
    shown = json.dumps([c.outputs for c in code])
    assert str(REPO) not in shown and "/home/" not in shown and "sk-" not in shown
    for cell in code:
        for output in cell.outputs:
            assert WIDGET_VIEW not in output.get("data", {})
            assert output["output_type"] != "error"
    [chat] = _chat_cells(nb)
    assert "--deferred" in chat.source and f"--checkpoint {DEFERRED_CHECKPOINT.name}" in chat.source
    assert "| # | text | label | answer |" in chat.outputs[-1].data["text/markdown"]
    assert "sent: 0, from the checkpoint: 12, same answers: True" in shown
    assert sum(c.cell_type == "markdown" for c in nb.cells) >= len(nb.cells) // 3


def test_deferred_checkpoint_holds_one_finished_job_answered_by_the_embedded_model() -> None:
    text = DEFERRED_CHECKPOINT.read_text(encoding="utf-8")
    assert "sk-" not in text and str(REPO) not in text
    entries = [json.loads(line) for line in text.splitlines()]
    assert len({e["key"] for e in entries}) == len(entries)
    [job] = [e for e in entries if "job" in e]
    rows = [e for e in entries if "response" in e]
    assert job["collected"] and job["job"]["state"] == "completed"
    assert job["job"]["provider"] == "openai" and job["job"]["total"] == 12 == len(rows)
    assert sorted(job["keys"]) == sorted(e["key"] for e in rows)
    for entry in rows:
        assert (entry["provider"], entry["model"]) == ("openai", "gpt-4.1-mini")  # as asked
        response = entry["response"]
        assert response["model"] == "smollm2"  # who answered
        assert not entry["streamed"] and response["usage"]["output_tokens"] > 0
        assert "batch price" in response["cost"]["source"]


def test_deferred_recording_script_asks_what_the_notebook_asks() -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("record_deferred",
                                                  NOTEBOOKS / "record_deferred.py")
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    namespace: dict[str, Any] = {}
    exec(_saved("deferred").cells[1].source, namespace)
    assert (namespace["MODEL"], namespace["TEMPLATE"], namespace["OPTIONS"]) == (
        script.MODEL, script.TEMPLATE, script.OPTIONS)
    assert namespace["CHECKPOINT"] == script.CHECKPOINT.name
    assert len(script.reviews()) == 12


@pytest.mark.kernel
@pytest.mark.timeout(600)
def test_deferred_notebook_replays_without_key_or_server_identically(tmp_path: Path) -> None:
    before = (DEFERRED.read_bytes(), DEFERRED_CHECKPOINT.read_bytes())
    first = execute(DEFERRED, kernel_env(tmp_path))  # no credentials
    second = execute(DEFERRED, kernel_env(tmp_path, DISPATCH_NB_LIVE="widget"))
    assert normalized_outputs(first) == normalized_outputs(second)
    assert normalized_outputs(first) == normalized_outputs(_saved("deferred"))
    assert (DEFERRED.read_bytes(), DEFERRED_CHECKPOINT.read_bytes()) == before  # reads only
