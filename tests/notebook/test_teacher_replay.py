"""A teacher's lesson, recorded once against the ``fake`` provider and replayed in a kernel that has
no model at all, as a student runs it (``jupyter nbconvert --execute``: nbclient)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from nbformat.v4 import new_code_cell, new_notebook

from tests.fakes.canonical import CanonicalFake
from tests.kernels import notebook_client
from tests.notebook.conftest import fake_kernel_env

pytestmark = [pytest.mark.kernel, pytest.mark.timeout(180)]

SETUP = (
    'import os\nos.environ["DISPATCH_NB_CACHE"] = os.environ.get("DISPATCH_NB_CACHE") or "replay"\n'
    "%load_ext dispatch_nb\n"
    '%config ChatMagics.model = "fake:echo"\n'
    '%config ChatMagics.cache_file = "lesson.dispatch-cache.jsonl"'
)
LESSON = [SETUP, "%%chat\nMy name is Ada. What is a list?", "%%chat\nWhat is my name?"]


def _run(cells: list[str], env: dict[str, str], cwd: Path) -> Any:
    nb = new_notebook(cells=[new_code_cell(source) for source in cells])
    notebook_client(nb, timeout=60, allow_errors=True,
                    resources={"metadata": {"path": str(cwd)}}).execute(env=env)
    return nb


def _markdown(cell: Any) -> str:
    return "\n".join(str(o.get("data", {}).get("text/markdown", "")) for o in cell.outputs)


def _errors(cell: Any) -> list[Any]:
    return [o for o in cell.outputs if o.output_type == "error"]


def _student_env(tmp_path: Path) -> dict[str, str]:
    """A student's kernel: no fake server, no DISPATCH_NB_FAKE_URL, no cache mode set."""
    (tmp_path / "student").mkdir(exist_ok=True)
    env = fake_kernel_env("", tmp_path / "student", "unused.jsonl")
    for key in ("DISPATCH_NB_FAKE_URL", "DISPATCH_NB_CACHE_FILE", "DISPATCH_NB_MODEL"):
        env.pop(key)
    return env


@pytest.fixture
def recorded(tmp_path: Path) -> Path:
    """The lesson recorded the way docs/teaching.md says (DISPATCH_NB_CACHE=record)."""
    (tmp_path / "teacher").mkdir()
    with CanonicalFake() as fake:
        env = fake_kernel_env(fake.url, tmp_path / "teacher", "unused.jsonl",
                              DISPATCH_NB_CACHE="record")
        env.pop("DISPATCH_NB_CACHE_FILE")
        nb = _run(LESSON, env, tmp_path)
    assert [_errors(c) for c in nb.cells] == [[], [], []]
    assert "echo: What is my name?" in _markdown(nb.cells[2])
    assert (tmp_path / "lesson.dispatch-cache.jsonl").exists()
    return tmp_path


def test_a_lesson_recorded_with_the_fake_provider_replays_without_its_server(recorded: Path
                                                                             ) -> None:
    """Replay needs no model (docs/record-replay.md): the fake provider's missing URL is no more
    a reason to fail than a missing llama.cpp; it once raised "the fake provider needs base_url="
    in every %%chat cell of the replayed lesson."""
    nb = _run(LESSON, _student_env(recorded), recorded)
    assert [[(e.ename, e.evalue) for e in _errors(c)] for c in nb.cells] == [[], [], []]
    assert "echo: My name is Ada. What is a list?" in _markdown(nb.cells[1])
    assert "echo: What is my name?" in _markdown(nb.cells[2])
    assert "· replayed" in _markdown(nb.cells[2])


def test_a_student_who_edits_a_prompt_is_told_why_and_what_asking_needs(recorded: Path) -> None:
    """The miss names the edit as the likely cause (the recorded answer comes back when it is
    undone) and, where the model cannot run (no fake server here, as no llama.cpp on binder), that
    --cache off / read-write needs it and why it cannot run: the hint once said only "run the
    cell with --cache off to ask it", which then failed with another error."""
    edited = [SETUP, "%%chat\nMy name is Ada. What is a Python list?", "%%chat\nWhat is my name?"]
    nb = _run(edited, _student_env(recorded), recorded)
    (error,) = _errors(nb.cells[1])
    assert error.ename == "ChatError"
    assert "no recorded answer" in error.evalue
    assert "undo the edit" in error.evalue
    assert "--cache off" in error.evalue and "--cache read-write" in error.evalue
    assert "cannot run here: the fake provider needs base_url=" in error.evalue
    # the next cell asks what was recorded after the original first turn: told to fix that first
    (after,) = _errors(nb.cells[2])
    assert "an earlier cell of this thread, got no answer" in after.evalue


def test_an_edited_each_prompt_shows_each_rows_miss_whole_and_the_fix_once(tmp_path: Path
                                                                           ) -> None:
    """Each failed row's cell in the --each table says what is missing (row, prompt, model,
    file), whole; the fix is the cell's error, once. The table once showed the core message cut
    at 200 characters in every row ("…; the cache is in replay mode and sends nothing to the
    model. Record it once w…"), the teacher's advice, cut off, three times."""
    (tmp_path / "teacher").mkdir()
    table = 'import pandas as pd\ndf = pd.DataFrame({"word": ["cat", "dog"]})'
    lesson = [SETUP, table, "%%chat --each df\nTranslate {word} to French."]
    with CanonicalFake() as fake:
        env = fake_kernel_env(fake.url, tmp_path / "teacher", "unused.jsonl",
                              DISPATCH_NB_CACHE="record")
        env.pop("DISPATCH_NB_CACHE_FILE")
        _run(lesson, env, tmp_path)
    edited = [SETUP, table, "%%chat --each df\nTranslate {word} to German."]
    nb = _run(edited, _student_env(tmp_path), tmp_path)
    shown = _markdown(nb.cells[2])
    for row, word in enumerate(["cat", "dog"]):
        assert (f"| {row} | {word} | CacheMissError: fake: no recorded answer for row {row} "
                f"('Translate {word} to German.', fake:echo) in lesson.dispatch-cache.jsonl |"
                ) in shown, shown
    assert "Record it once" not in shown
    (error,) = _errors(nb.cells[2])
    assert error.ename == "ChatError" and "undo the edit" in error.evalue


def test_an_edited_comparison_shows_no_empty_answer_above_each_miss(recorded: Path) -> None:
    """A model that got no answer (here: never asked, a replay miss) shows its warning alone
    under its heading, as a --schema comparison does, and no latency in the table: it once
    showed "(no text)" above it, as if the model had answered with nothing."""
    edited = [SETUP, "%%chat -m fake:echo,fake:other\nExplain recursion in two sentences."]
    nb = _run(edited, _student_env(recorded), recorded)
    shown = _markdown(nb.cells[1])
    assert "#### fake:echo\n\n⚠ *fake: no recorded answer for In[2]" in shown, shown
    assert "#### fake:other\n\n⚠ *fake: no recorded answer for In[2]" in shown, shown
    assert "(no text)" not in shown
    # never asked: no latency (it once read "0.00 s", as if the model had answered at once)
    for spec in ("fake:echo", "fake:other"):
        assert f"| `{spec}` | – | – | – | ⚠ fake: no recorded answer" in shown, shown
    plain = "\n".join(str(o.get("data", {}).get("text/plain", "")) for o in nb.cells[1].outputs)
    assert "== fake:echo ==\n⚠ fake: no recorded answer" in plain, plain
    (error,) = _errors(nb.cells[1])
    assert error.ename == "ChatError" and "undo the edit" in error.evalue


def test_chat_status_tells_a_student_in_replay_that_no_login_is_needed(recorded: Path) -> None:
    """A student's %chat status lists every provider as not logged in / key not set ("run
    `%chat login`"); in replay mode its cache row says that none of that is needed."""
    nb = _run([SETUP, "%chat status"], _student_env(recorded), recorded)
    shown = _markdown(nb.cells[1])
    assert "not logged in — run `%chat login`" in shown  # still the facts
    assert ("| cache | `replay` — `lesson.dispatch-cache.jsonl` — plays back the recorded answers "
            "and sends nothing: no login or key is needed |") in shown, shown
