"""``tests/parallel.py``: what may run in separate processes under ``pytest -n``."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.parallel import LONGEST, queue_rank, unit

REPO = Path(__file__).resolve().parent.parent


def test_units() -> None:
    # a file is one unit (its module fixtures start once), whatever the test or its parameters
    assert unit("tests/core/test_sse.py::test_a") == unit("tests/core/test_sse.py::test_b[x@y]")
    assert unit("tests/core/test_sse.py::test_a") != unit("tests/core/test_types.py::test_a")
    # a notebook's cells run in one kernel; the browser tests share servers and a browser
    assert unit("notebooks/quickstart.ipynb::Cell 0") == unit("notebooks/quickstart.ipynb::Cell 3")
    assert unit("tests/e2e/test_smoke.py::test_print_renders[lab]") == unit(
        "tests/e2e/test_notebook_ui.py::test_compare_renders_columns[notebook]")
    # the files split per test
    assert unit("tests/test_notebooks.py::test_x[quickstart]") != unit(
        "tests/test_notebooks.py::test_x[tools]")
    # an xdist_group mark, where xdist writes it into the node id
    assert unit("tests/core/test_sse.py::test_a@kernel") == unit("tests/core/test_x.py::t@kernel")


def test_the_longest_units_are_queued_first() -> None:
    ranks = [queue_rank("tests/e2e/test_smoke.py::test_print_renders[lab]"),
             *(queue_rank(f"{path}::test_x") for path in LONGEST),
             queue_rank("tests/core/test_sse.py::test_a")]
    assert ranks == sorted(ranks) and len(set(ranks)) == len(ranks)
    for path in LONGEST:  # a renamed or moved file must be renamed here too
        assert (REPO / path).is_file(), path


def test_a_module_fixture_starts_once_per_file_on_two_workers(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = pytester.path / "starts.log"
    for name in ("a", "b"):
        pytester.makepyfile(**{f"test_{name}": f"""
            import os, pytest

            @pytest.fixture(scope="module")
            def costly():
                with open({str(log)!r}, "a") as f:
                    f.write("{name} " + os.environ["PYTEST_XDIST_WORKER"] + "\\n")

            @pytest.mark.parametrize("i", range(6))
            def test_{name}(costly, i):
                pass
            """})
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    # xdist and the scheduler only: every installed plugin would cost each process ~5 s of CPU
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    result = pytester.runpytest_subprocess("-p", "xdist", "-n", "2", "-p", "tests.parallel")
    result.assert_outcomes(passed=12)
    starts = sorted(log.read_text().split("\n")[:-1])
    assert [line.split()[0] for line in starts] == ["a", "b"]  # once per file, not per worker
