"""Suite-wide fixtures.

``DISPATCH_NB_REQUIRE_ALL=1`` (set by ``.ci/run``) turns every skip into a failure: see
``tests/require_all.py``, loaded for the whole session by the top-level ``conftest.py``.

A loopback fake whose handler raises fails the test that made the request (at its teardown, with
the handler's traceback): the client saw a 500 that no adapter retries, so the crash cannot pass
for a provider error. (A crash on a server thread after its test ended is reported by the next
test to end; the traceback names the request.)
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.fakes.server import take_handler_errors


@pytest.fixture(autouse=True)
def _fakes_must_not_crash() -> Iterator[None]:
    yield
    crashes = take_handler_errors()
    if crashes:
        pytest.fail(
            "a loopback fake crashed — a bug in the test or its fake, not a provider error:\n\n"
            + "\n".join(crashes),
            pytrace=False,
        )
