"""Fixtures of the browser tests: loopback fakes, one Jupyter server per front end, one browser.

Every test here is marked ``e2e`` (``-m e2e`` selects them, ``-m "not e2e"`` leaves them out) and
is skipped, with the reason, when playwright, the Jupyter front ends or Debian's chromium are
missing. The kernels the servers start inherit an environment that points dispatch_nb at the fakes
running in this test process, so nothing leaves 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ..fakes.canonical import CanonicalFake
from ..fakes.copilot import CopilotFake
from ..fakes.github import FakeGitHub
from .harness import (
    ARTIFACTS,
    FRONTENDS,
    JupyterServer,
    NotebookPage,
    launch_browser,
    missing_requirements,
    write_notebook,
)

_MISSING = missing_requirements()


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark (or skip) the browser tests and run them last, in the order pytest grouped them by
    front end: the quick tests report first, and the servers and the browser (Playwright's own
    event loop) never stay alive while other tests run. (Under ``pytest -n`` they are one unit
    that a worker runs first, alone, while the others run the rest: ``tests/parallel.py``.)"""
    here = Path(__file__).parent
    browser_tests: list[pytest.Item] = []
    others: list[pytest.Item] = []
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.e2e)
            if _MISSING:
                item.add_marker(pytest.mark.skip(reason=f"browser tests need: {_MISSING}"))
            browser_tests.append(item)
        else:
            others.append(item)
    def order(item: pytest.Item) -> tuple[int, int]:
        callspec = getattr(item, "callspec", None)
        frontend = callspec.params.get("jupyter", "") if callspec is not None else ""
        group = list(FRONTENDS).index(frontend) if frontend in FRONTENDS else len(FRONTENDS)
        module = getattr(getattr(item, "module", None), "__name__", "")
        return group, 0 if module.endswith("test_smoke") else 1

    items[:] = others + sorted(browser_tests, key=order)  # one server at a time, smoke first


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    setattr(item, f"rep_{report.when}", report)


@pytest.fixture(scope="package")
def canonical_fake() -> Iterator[CanonicalFake]:
    """The ``fake`` provider's server; the kernels reach it through DISPATCH_NB_FAKE_URL."""
    with CanonicalFake() as fake:
        yield fake


@pytest.fixture(scope="package")
def copilot_fake() -> Iterator[CopilotFake]:
    """The Copilot API fake and its fake GitHub (device flow, token exchange pointing here)."""
    with CopilotFake() as copilot:
        yield copilot


@pytest.fixture(scope="package")
def github_fake(copilot_fake: CopilotFake) -> FakeGitHub:
    """The fake GitHub the kernels log in to (DISPATCH_NB_GITHUB_URL / _API_URL)."""
    return copilot_fake.github


@pytest.fixture
def copilot(copilot_fake: CopilotFake) -> Iterator[CopilotFake]:
    """The session's Copilot fake with an empty script for each test."""
    copilot_fake.script.clear()
    yield copilot_fake
    copilot_fake.script.clear()


@pytest.fixture
def fake(canonical_fake: CanonicalFake) -> Iterator[CanonicalFake]:
    """The session's canonical fake with an empty script (echo) for each test."""
    canonical_fake.script.clear()
    yield canonical_fake
    canonical_fake.script.clear()


@pytest.fixture(scope="package", params=["lab", "notebook"])
def jupyter(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    canonical_fake: CanonicalFake,
    github_fake: FakeGitHub,
) -> Iterator[JupyterServer]:
    """A running JupyterLab or Notebook 7 server (one per front end per session)."""
    frontend = FRONTENDS[request.param]
    workdir = tmp_path_factory.mktemp(f"jupyter-{frontend.name}")
    home = workdir / "dispatch-home"
    home.mkdir()
    env = {
        "DISPATCH_NB_FAKE_URL": canonical_fake.url,
        "DISPATCH_NB_MODEL": "fake:echo",
        "DISPATCH_NB_HOME": str(home),
        "DISPATCH_NB_GITHUB_URL": github_fake.github_url,
        "DISPATCH_NB_GITHUB_API_URL": github_fake.api_url,
        # no Copilot editor login of the user's can be found
        "XDG_CONFIG_HOME": str(workdir / "xdg-config"),
    }
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    server = JupyterServer(
        frontend, workdir, env=env, log_path=ARTIFACTS / f"server-{frontend.name}.log"
    )
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="package")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One headless chromium (fresh profile) for the whole session."""
    with launch_browser(tmp_path_factory.mktemp("chromium-profile")) as context:
        yield context


@pytest.fixture
def page(browser: Any, jupyter: JupyterServer, request: pytest.FixtureRequest) -> Iterator[Any]:
    """A new tab; on failure a screenshot goes to test-artifacts/e2e/FAILED-<test>.png."""
    tab = browser.new_page()
    console: list[str] = []
    tab.on("console", lambda msg: console.append(f"{msg.type}: {msg.text}"))
    try:
        yield tab
    finally:
        report = getattr(request.node, "rep_call", None)
        if report is not None and report.failed:
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            name = request.node.name.replace("/", "_").replace("[", "-").rstrip("]")
            with contextlib.suppress(Exception):
                tab.screenshot(path=str(ARTIFACTS / f"FAILED-{name}.png"), full_page=True)
            (ARTIFACTS / f"FAILED-{name}.console.txt").write_text("\n".join(console))
        tab.close()
        jupyter.shutdown_kernels()


@pytest.fixture
def open_notebook(page: Any, jupyter: JupyterServer, request: pytest.FixtureRequest) -> Any:
    """``open_notebook(cells, name=None)`` writes a notebook and opens it in the browser tab."""

    def open_(cells: list[str], name: str | None = None) -> NotebookPage:
        stem = name or request.node.originalname
        path = write_notebook(jupyter.root, f"{stem}-{jupyter.frontend.name}.ipynb", cells)
        return NotebookPage(page, jupyter, path).open()

    return open_


def pytest_report_header(config: pytest.Config) -> str | None:
    if _MISSING:
        return f"e2e: skipped ({_MISSING})"
    return f"e2e: chromium {os.environ.get('DISPATCH_NB_E2E_CHROMIUM', '/usr/bin/chromium')}"
