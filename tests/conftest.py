"""Suite-wide settings.

``DISPATCH_NB_REQUIRE_ALL=1`` (set by ``.ci/run``) turns a skipped test that needs a real peer —
a browser (``e2e``), a llama.cpp server (``llama``), the embedded model (``local``) or a Jupyter
kernel (``kernel``) — into a failure, so CI cannot go green without running them.
"""

from __future__ import annotations

import os

import pytest

REAL_PEER_MARKERS = ("e2e", "llama", "local", "kernel")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    outcome = yield
    report = outcome.get_result()
    if (
        report.skipped
        and os.environ.get("DISPATCH_NB_REQUIRE_ALL") == "1"
        and any(item.get_closest_marker(m) for m in REAL_PEER_MARKERS)
    ):
        reason = report.longrepr[-1] if isinstance(report.longrepr, tuple) else report.longrepr
        report.outcome = "failed"
        report.longrepr = (
            f"DISPATCH_NB_REQUIRE_ALL=1: a real-peer test may not be skipped ({reason})"
        )
