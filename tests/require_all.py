"""``DISPATCH_NB_REQUIRE_ALL=1`` (set by ``.ci/run``): every skip in the session is a failure.

A skipped test is a test that did not run, so in CI a skip is as bad as a failure: the machine
installs every extra, Debian's chromium and the model, and a test that cannot run there has a bug
(in the test or in CI's setup), not an excuse. This plugin (loaded for the whole session by the
repository's top-level ``conftest.py``, so it covers ``tests/`` and the notebooks under nbval alike)
turns into a failure, wherever the skip comes from:

- a test skipped at setup or while running (``@pytest.mark.skip``/``skipif``, ``pytest.skip()``
  in a test or a fixture, nbval's ``nbval-skip``), marked or not;
- a module skipped while it is collected (``pytest.importorskip`` at import time,
  ``pytest.skip(allow_module_level=True)``): that is a collection error.

``xfail`` is not a skip and is left alone. Without the variable, skips stay skips (a laptop without
chromium can still run the rest).
"""

from __future__ import annotations

import os
from collections.abc import Generator
from typing import Any

import pytest

ENV = "DISPATCH_NB_REQUIRE_ALL"


def required() -> bool:
    """Whether this session may skip nothing."""
    return os.environ.get(ENV) == "1"


def _reason(longrepr: Any) -> str:
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if required() and report.skipped and not hasattr(report, "wasxfail"):
        reason = _reason(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"{ENV}=1: no test may be skipped here, but {item.nodeid} was: {reason}"
    return report


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(
    collector: pytest.Collector,
) -> Generator[None, pytest.CollectReport, pytest.CollectReport]:
    report = yield
    if required() and report.skipped:
        reason = _reason(report.longrepr)
        report.outcome = "failed"
        report.longrepr = (
            f"{ENV}=1: no test may be skipped here, but all of {collector.nodeid} was skipped "
            f"while collecting it: {reason}"
        )
    return report
