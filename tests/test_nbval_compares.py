"""The nbval run of the example notebooks compares what each cell shows with the saved notebook.

``pytest`` collects ``notebooks/*.ipynb`` with ``--nbval`` (pyproject's ``addopts``): every cell's
outputs, replayed from the recording, must equal the saved ones, only this run's timings masked
(``notebooks/nbval-sanitize.cfg``), and the live view's display updates applied as a front end
applies them (``notebooks/conftest.py``). Shown here on a copy of the quickstart notebook run with
the repository's own configuration: an answer that renders differently fails its cell; a footer
whose timing differs does not.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import nbformat
import pytest

REPO = Path(__file__).resolve().parent.parent
COPIED = ["pyproject.toml", "conftest.py", "notebooks/conftest.py", "notebooks/nbval-sanitize.cfg",
          "notebooks/quickstart.ipynb", "notebooks/quickstart.dispatch-cache.jsonl"]


@pytest.mark.kernel
@pytest.mark.timeout(600)
def test_a_replayed_answer_that_renders_differently_fails_its_cell(pytester: pytest.Pytester) -> None:
    for name in COPIED:
        (pytester.path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / name, pytester.path / name)
    path = pytester.path / "notebooks" / "quickstart.ipynb"
    nb = nbformat.read(path, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    chats = [i for i, c in enumerate(code) if c.source.startswith("%%chat")]
    changed, retimed = chats[0], chats[1]
    shown = code[changed].outputs[0].data
    assert "A Python list is a collection" in shown["text/markdown"]
    # what a rendering regression looks like: the cell no longer shows what the recording saved
    shown["text/markdown"] = shown["text/markdown"].replace("collection", "kind", 1)
    timed = code[retimed].outputs[0].data
    assert "· replayed</sub>" in timed["text/markdown"]
    # a recording run's footer has its latency where a replay says "replayed": masked
    timed["text/markdown"] = timed["text/markdown"].replace("· replayed</sub>", "· 2.4 s</sub>")
    nbformat.write(nb, path)

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PYTHONPATH", os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
        mp.delenv("DISPATCH_NB_CACHE", raising=False)
        mp.delenv("DISPATCH_NB_LIVE", raising=False)
        result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "notebooks/quickstart.ipynb",
                                               timeout=500)
    result.assert_outcomes(passed=len(code) - 1, failed=1)
    result.stdout.fnmatch_lines(["*Cell outputs differ*",
                                 f"FAILED notebooks/quickstart.ipynb::Cell {changed} *"])
    assert "A Python list is a collection" in result.stdout.str()  # the diff shows the answer


@pytest.mark.kernel
@pytest.mark.timeout(600)
def test_the_conftest_copied_beside_a_teachers_notebook_compares_it(
    pytester: pytest.Pytester,
) -> None:
    """docs/teaching.md: copy ``notebooks/conftest.py`` and ``nbval-sanitize.cfg`` beside your own
    notebooks, then plain ``pytest`` there compares them — where this repository's ``tests``
    package cannot be imported (as with dispatch-nb installed from PyPI), with no option."""
    for name in COPIED[2:]:
        shutil.copy(REPO / name, pytester.path / Path(name).name)
    code = [c for c in nbformat.read(pytester.path / "quickstart.ipynb", as_version=4).cells
            if c.cell_type == "code"]
    run = ("import sys; sys.modules['tests'] = None  # not this repository's tests package\n"
           "import pytest; sys.exit(pytest.main(['-p', 'no:cacheprovider']))")
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("DISPATCH_NB_CACHE", raising=False)
        mp.delenv("DISPATCH_NB_LIVE", raising=False)
        result = pytester.run(sys.executable, "-c", run, timeout=500)
    result.assert_outcomes(passed=len(code))
