"""Suite-wide fixtures.

``DISPATCH_NB_REQUIRE_ALL=1`` (set by ``.ci/run``) turns every skip into a failure: see
``tests/require_all.py``, loaded for the whole session by the top-level ``conftest.py``.

A loopback fake whose handler raises fails the test that made the request (at its teardown, with
the handler's traceback): the client saw a 500 that no adapter retries, so the crash cannot pass
for a provider error. (A crash on a server thread after its test ended is reported by the next
test to end; the traceback names the request.)

Two fixtures many files share (a folder's or a module's own fixture of the same name wins, e.g. the
contract suite's ``fake`` in ``tests/contract/conftest.py``):

- ``fake``: the canonical-protocol fake (``tests/fakes/canonical.py``) on a loopback port, closed
  after the test;
- ``adapter``: a ``CanonicalAdapter("echo")`` pointed at it, without retries, closed after the test.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from tests.fakes.server import take_handler_errors

if TYPE_CHECKING:
    from dispatch_nb.providers.fake import CanonicalAdapter
    from tests.fakes.canonical import CanonicalFake


#: the test files whose OpenAI tests have every request body checked against OpenAI's published
#: schema by the fakes (tests/fakes/openai_schema.py; tests/contract/test_openai_schema.py)
CHECKED_SUITES = (
    "tests/contract/test_contract.py",
    "tests/contract/test_downstream.py",
    "tests/contract/test_real_shapes.py",
    "tests/providers/test_openai_chat.py",
    "tests/providers/test_openai_responses.py",
    "tests/providers/test_openai.py",
)


def checks_openai_bodies(nodeid: str) -> bool:
    """Whether the test ``nodeid`` is one of the OpenAI tests of :data:`CHECKED_SUITES`."""
    return nodeid.partition("::")[0] in CHECKED_SUITES and "openai" in nodeid.lower()


@pytest.fixture(autouse=True)
def _openai_bodies_follow_the_schema(request: pytest.FixtureRequest) -> Iterator[None]:
    from tests.fakes.openai_schema import checking

    if not checks_openai_bodies(request.node.nodeid):
        yield
        return
    checking.set()
    try:
        yield
    finally:
        checking.clear()


@pytest.fixture(autouse=True)
def _ctrl_c_raises_keyboard_interrupt() -> None:
    """Ctrl-C raises KeyboardInterrupt in every test, whatever ran before in the process.

    pytest-xdist starts its test processes with SIGINT ignored; it became Python's handler again
    only once nbclient had run a kernel in that process (asyncio's ``remove_signal_handler`` puts
    ``default_int_handler`` back). So the Ctrl-C tests passed only in a process that happened to
    run a kernel before them: a change of order (three processes, the longest files first) left
    five of them with a Ctrl-C that did nothing."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.default_int_handler)


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


@pytest.fixture
def fake() -> Iterator[CanonicalFake]:
    from tests.fakes.canonical import CanonicalFake

    with CanonicalFake() as f:
        yield f


@pytest.fixture
def adapter(fake: CanonicalFake) -> Iterator[CanonicalAdapter]:
    from dispatch_nb.providers.fake import CanonicalAdapter

    a = CanonicalAdapter("echo", base_url=fake.base_url, max_retries=0)
    yield a
    a.close()
