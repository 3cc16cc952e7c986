"""The rules the suite holds itself to, each shown by running what it forbids.

- A loopback fake whose handler raises fails the test that made the request (``tests/conftest.py``);
  the client meanwhile gets a 500 that no adapter retries — not a provider error to shrug off.
- ``DISPATCH_NB_REQUIRE_ALL=1`` turns every skip into a failure, wherever it comes from
  (``tests/require_all.py``): unmarked ``skipif``, ``pytest.skip()`` in a test or a fixture, a module
  skipped at import (``importorskip``), a notebook cell nbval skips.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dispatch_nb import ServerError
from dispatch_nb.providers.fake import CanonicalAdapter

from .fakes.server import LoopbackServer, RecordedRequest, Reply, take_handler_errors

REPO = Path(__file__).resolve().parent.parent


def _crash(request: RecordedRequest) -> Reply:
    raise KeyError("a typo in the fake")


@pytest.mark.parametrize("stream", [False, True])
def test_a_crashing_fake_is_a_test_bug_not_a_retried_server_error(stream: bool) -> None:
    with LoopbackServer(_crash) as server:
        adapter = CanonicalAdapter(base_url=server.url, max_retries=2)
        with pytest.raises(ServerError) as info:
            adapter.chat("hi", stream=stream)
    assert info.value.status_code == 500 and info.value.code == "server_error"
    assert not info.value.retryable and "fake server bug" in info.value.message
    assert len(server.requests) == 1  # not retried: one crash, one request
    crashes = take_handler_errors()  # taken here, so this test's own teardown stays green
    assert len(crashes) == 1 and crashes == server.errors
    assert "POST /chat" in crashes[0] and "KeyError: 'a typo in the fake'" in crashes[0]
    assert "Traceback" in crashes[0]


def _run(pytester: pytest.Pytester, *args: str, require_all: bool) -> pytest.RunResult:
    # only the plugins a run names (-p): autoloading every installed one (hypothesis, nbval,
    # playwright; jsonschema's format grammar) costs each run about 5 s of CPU
    env = {"PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
           "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    if require_all:
        env["DISPATCH_NB_REQUIRE_ALL"] = "1"
    with pytest.MonkeyPatch.context() as mp:
        for key, value in env.items():
            mp.setenv(key, value)
        if not require_all:
            mp.delenv("DISPATCH_NB_REQUIRE_ALL", raising=False)
        return pytester.runpytest_subprocess("-p", "tests.require_all", "-p", "no:cacheprovider",
                                             *args, timeout=300)


def test_the_suite_fails_a_test_whose_fake_crashed(pytester: pytest.Pytester) -> None:
    pytester.makeconftest("from tests.conftest import _fakes_must_not_crash  # noqa: F401\n")
    pytester.makepyfile(test_inner=(
        "from dispatch_nb.providers.fake import CanonicalAdapter\n"
        "from tests.fakes.server import LoopbackServer\n"
        "def crash(request):\n    raise KeyError('a typo in the fake')\n"
        "def test_swallows_the_error():\n"
        "    with LoopbackServer(crash) as server:\n"
        "        try:\n            CanonicalAdapter(base_url=server.url).chat('hi')\n"
        "        except Exception:\n            pass  # a test that only expects *an* error\n"
    ))
    result = _run(pytester, require_all=False)
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(["*ERROR at teardown of test_swallows_the_error*",
                                 "*a loopback fake crashed*", "*KeyError: 'a typo in the fake'*"])


SKIPPING = {
    "test_skips": (
        "import pytest\n"
        "@pytest.mark.skipif(True, reason='an unmarked skipif')\n"
        "def test_skipif():\n    pass\n"
        "def test_skip_call():\n    pytest.skip('skipped while running')\n"
        "@pytest.fixture\ndef peer():\n    pytest.skip('no peer here')\n"
        "def test_fixture_skip(peer):\n    pass\n"
        "@pytest.mark.xfail(reason='known', strict=True)\n"
        "def test_xfail():\n    assert False\n"
        "def test_runs():\n    pass\n"
    ),
    "test_import_skip": (
        "import pytest\n"
        "pytest.importorskip('no_such_module_for_dispatch_nb')\n"
        "def test_never_collected():\n    pass\n"
    ),
}


def test_without_require_all_skips_stay_skips(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(**SKIPPING)
    result = _run(pytester, require_all=False)
    result.assert_outcomes(passed=1, skipped=4, xfailed=1)


def test_require_all_fails_every_skip_wherever_it_comes_from(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(**SKIPPING)
    result = _run(pytester, "--continue-on-collection-errors", require_all=True)
    # (a skip at setup — skipif, a fixture — fails as an error at setup)
    result.assert_outcomes(passed=1, failed=1, errors=3, xfailed=1)
    result.stdout.fnmatch_lines_random([
        "*DISPATCH_NB_REQUIRE_ALL=1: no test may be skipped here, but *test_skipif was: an unmarked skipif",
        "*test_skip_call was: skipped while running",
        "*test_fixture_skip was: no peer here",
        "*all of test_import_skip.py was skipped while collecting it*no_such_module_for_dispatch_nb*",
    ])
    # In CI (no --continue-on-collection-errors) a module skipped at import stops the run.
    assert _run(pytester, require_all=True).ret != 0


@pytest.mark.kernel
def test_require_all_covers_notebook_cells_nbval_skips(pytester: pytest.Pytester) -> None:
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("x = 1"),
                nbformat.v4.new_code_cell("x = 2", metadata={"tags": ["nbval-skip"]})]
    nbformat.write(nb, str(pytester.path / "skipping.ipynb"))
    args = ("--nbval-lax", "--nbval-current-env", "-p", "nbval", "skipping.ipynb")
    result = _run(pytester, *args, require_all=True)
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*DISPATCH_NB_REQUIRE_ALL=1: no test may be skipped here*"])
