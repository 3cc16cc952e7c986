"""A notebook run by a client nobody watches (nbclient: ``jupyter execute``, ``jupyter nbconvert
--execute``, papermill, nbval) saves no widget state, with no setting needed.

``NotebookClient.execute()`` runs the whole notebook and ends with ``set_widgets_metadata()``,
which writes the state of every widget the kernel ever opened — closed ones included — into
``metadata.widgets``. A run that executes cells one by one (``execute_cell``) never gets there,
so only a whole ``execute()`` shows what ``jupyter execute --inplace`` saves.
"""

from __future__ import annotations

import json
from typing import Any

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook

from tests.kernels import notebook_client
from tests.notebook.conftest import fake_kernel_env
from tests.notebook.test_schema_each import SETUP, JsonEchoFake, table

pytestmark = [pytest.mark.kernel, pytest.mark.timeout(180)]

WIDGET_MIME = "application/vnd.jupyter.widget-view+json"


def _record(tmp_path: Any, live: str | None) -> Any:
    """The notebook of the record-replay workflow, run the way ``DISPATCH_NB_CACHE=record jupyter
    execute --inplace`` runs it, saved and read back."""
    cells = [
        "%load_ext dispatch_nb\n" + SETUP
        + "import pandas as pd\ndf = pd.DataFrame({'city': ['Paris', 'Rome', 'Oslo']})",
        "%%chat\nSay hello.",                                  # 1
        "%%chat --schema Echo\nParse me.",                     # 2
        "%%chat --each df\nAbout {city}",                      # 3
        "import dispatch_nb\nrun = dispatch_nb.batch('Hi {row}', ['a', 'b'], model='fake:echo')",
    ]
    nb = new_notebook(cells=[new_code_cell(source) for source in cells])
    with JsonEchoFake() as fake:
        env = fake_kernel_env(fake.url, tmp_path, "lesson.dispatch-cache.jsonl",
                              DISPATCH_NB_CACHE="record")
        if live is not None:
            env["DISPATCH_NB_LIVE"] = live
        notebook_client(nb, timeout=60, allow_errors=False).execute(env=env)
    path = tmp_path / "lesson.ipynb"
    nbformat.write(nb, path)
    return nbformat.read(path, as_version=4)


@pytest.mark.parametrize("live", [None, "display"])
def test_a_recorded_notebook_saves_no_widget_state(tmp_path: Any, live: str | None) -> None:
    nb = _record(tmp_path, live)
    assert "widgets" not in nb.metadata, json.dumps(nb.metadata.get("widgets"))[:500]
    for cell in nb.cells:
        for output in cell.outputs:
            assert WIDGET_MIME not in output.get("data", {}), output
            assert output.output_type != "error", output
    # the answers are there, as static Markdown; auto picked the display view
    for index in (1, 2):
        [out] = nb.cells[index].outputs
        assert set(out.data) == {"text/markdown", "text/plain"}
        assert out.metadata["dispatch_nb"]["live"] == "display"
    # batch() in a code cell: its progress ended as its summary line
    [line] = nb.cells[4].outputs
    assert line.data == {"text/plain": line.data["text/plain"]}
    assert line.data["text/plain"].startswith("batch fake:echo: 2 rows: 2 ok;")
    assert "echo: Say hello." in nb.cells[1].outputs[0].data["text/markdown"]
    assert '"prompt": "Parse me."' in nb.cells[2].outputs[0].data["text/plain"] or (
        "Parse me." in nb.cells[2].outputs[0].data["text/markdown"])


def test_each_says_its_summary_once(tmp_path: Any) -> None:
    # the table's footer is the batch's summary: no progress line above it says it again
    nb = _record(tmp_path, None)
    [out] = nb.cells[3].outputs  # the progress line became the table
    markdown = out.data["text/markdown"]
    assert table(markdown) == [["#", "city", "answer"], ["0", "Paris", "echo: About Paris"],
                               ["1", "Rome", "echo: About Rome"], ["2", "Oslo", "echo: About Oslo"]]
    footer = out.metadata["dispatch_nb"]["footer"]
    assert footer.startswith("fake:echo · --each df · 3 rows: 3 ok;") and footer in out.data[
        "text/plain"]
