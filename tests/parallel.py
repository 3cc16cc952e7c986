"""Running the suite on several processes (pytest-xdist), in any order (pytest-random-order), and
Hypothesis's profiles. Loaded for the whole session by the top-level ``conftest.py``.

``make test`` runs ``pytest -n auto``. Which tests may go to different worker processes is decided
here (the scheduler below replaces xdist's ``load`` and ``loadgroup``; ``--dist loadfile`` etc.
still mean what xdist says): a *unit* runs on one worker, in order, and a worker takes the next
unit when it is free.

- A test file is one unit: its module- and session-scoped fixtures (a kernel, the embedded
  model, a Dask cluster, a llama.cpp server) start once, as in a run without ``-n``. That is the
  default, so a new test file needs nothing special.
- A notebook under nbval (``notebooks/*.ipynb``) is one unit: its cells run in order in its kernel.
- The browser tests (``tests/e2e/``) are one unit: one Jupyter server per front end, one browser.
  It is the longest, so it starts first and the other units fill in around it.
- The files in :data:`PER_TEST` are split into one unit per test: their tests share nothing
  costly (each starts its own kernel or server, or is a cheap loopback test) and together they
  would hold one worker for long.

Order: ``--random-order`` (or ``--random-order-seed=N`` to repeat one) shuffles the tests within
each file and the files (pytest-random-order; the workers all get the same seed). A notebook's
cells are put back in the notebook's order after the shuffle.

Hypothesis: ``CI=true`` selects the ``ci`` profile (derandomized: the same examples every run; no
per-example deadline and no "too slow" health check, which fail on a busy machine); otherwise
``dev``, which tries more examples, different ones each run. ``HYPOTHESIS_PROFILE=ci`` or ``dev``
picks one by name.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

#: test files whose tests may run on different workers (see the module docstring)
PER_TEST: frozenset[str] = frozenset({
    "tests/test_notebooks.py",  # each example notebook replayed twice, each run in a new kernel
    "tests/test_benchmarks.py",  # each benchmark's smoke run: a minute or two each, apart
})
#: the unit of the browser tests
E2E = "tests/e2e/"
#: the longest units after the browser tests, longest first (``--durations``, docs/testing.md):
#: queued before the rest, so that no long unit starts last and leaves the other workers idle
LONGEST: tuple[str, ...] = (
    "tests/test_binder.py",
    "tests/providers/test_local.py",
    "tests/providers/test_local_contract.py",
    "tests/contract/test_contract.py",
    "tests/test_demo.py",
    "tests/notebook/test_kernel.py",
    "tests/mcp/test_mcp_session.py",
    "tests/mcp/test_mcp_kernel.py",
    "tests/test_suite_rules.py",
    "tests/core/test_batch_dask.py",
    "tests/integration/test_llama_server.py",
    "tests/notebook/test_as_a_user.py",
    "tests/core/test_batch.py",
)


#: The embedded model reads prompts on every core by default; with a test process per core, its
#: threads then wait on each other's descheduled siblings, spinning: on 2 cores the model's tests
#: took twice the CPU. One thread each (kernels and subprocesses inherit it) unless set already.
os.environ.setdefault("DISPATCH_NB_LOCAL_THREADS", "1")


def _register_hypothesis_profiles() -> None:
    try:
        from hypothesis import HealthCheck, settings
    except ImportError:  # the test extra brings it; without it, nothing to configure
        return
    quiet = [HealthCheck.too_slow]
    settings.register_profile("ci", max_examples=300, derandomize=True, deadline=None,
                              print_blob=True, suppress_health_check=quiet)
    settings.register_profile("dev", max_examples=1000, deadline=None, print_blob=True,
                              suppress_health_check=quiet)
    default = "ci" if os.environ.get("CI", "").lower() in ("1", "true", "yes") else "dev"
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", default))


_register_hypothesis_profiles()


def unit(nodeid: str) -> str:
    """The unit of work (see the module docstring) that the test ``nodeid`` belongs to."""
    if nodeid.rfind("@") > nodeid.rfind("]"):  # an xdist_group mark, where xdist applies it
        return nodeid.rsplit("@", 1)[-1]
    path = nodeid.split("::", 1)[0]
    if path.startswith(E2E):
        return E2E
    if path in PER_TEST:
        return nodeid
    return path


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``-n N`` (``--dist load``) and ``--dist loadgroup``: units as in the module docstring."""
    if config.getoption("dist") not in ("load", "loadgroup"):
        return None
    from xdist.scheduler import LoadScopeScheduling

    # units are queued as collected (the browser tests first), not largest-count first: the
    # browser tests are few but the longest
    config.option.loadscopereorder = False

    class UnitScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return unit(nodeid)

    return UnitScheduling(config, log)


def queue_rank(nodeid: str) -> int:
    """Where the unit of ``nodeid`` is queued: the browser tests (0), then :data:`LONGEST` in
    order, then every other unit as collected."""
    path = nodeid.split("::", 1)[0]
    if path.startswith(E2E):
        return 0
    return 1 + LONGEST.index(path) if path in LONGEST else 1 + len(LONGEST)


def _notebook(item: pytest.Item) -> bool:
    return item.path.suffix == ".ipynb"


@pytest.hookimpl(wrapper=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> object:
    """After every other hook (shuffling, the browser tests' own order): each notebook's cells in
    the notebook's order and, on an xdist worker, the longest units first (:func:`queue_rank`)."""
    collected = {id(item): index for index, item in enumerate(items)}
    result = yield
    cells = [i for i, item in enumerate(items) if _notebook(item)]
    by_notebook: dict[Path, list[pytest.Item]] = {}
    for i in cells:
        by_notebook.setdefault(items[i].path, []).append(items[i])
    ordered = {path: iter(sorted(group, key=lambda it: collected[id(it)]))
               for path, group in by_notebook.items()}
    for i in cells:
        items[i] = next(ordered[items[i].path])
    if hasattr(config, "workerinput"):  # the units are queued in this order
        items.sort(key=lambda item: queue_rank(item.nodeid))
    return result
