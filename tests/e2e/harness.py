"""The end-to-end harness: a real Jupyter server per front end, Debian's chromium, page helpers.

:class:`JupyterServer` starts JupyterLab (``python -m jupyterlab``) or Notebook 7
(``python -m notebook``) on 127.0.0.1 with a random token, its own config and runtime directories
and a kernelspec that runs this interpreter, waits for ``/api/status`` and stops everything at the
end (SIGTERM to the server, then SIGKILL to its process group). :func:`launch_browser` drives
``/usr/bin/chromium`` through Playwright (no browser download). :class:`NotebookPage` opens a
notebook in either front end and runs, edits, samples and screenshots its cells through the DOM,
the way a user would (click the cell, Shift+Enter).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple
from urllib.parse import quote

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "test-artifacts" / "e2e"
DOC_IMAGES = REPO / "docs" / "images"

#: Debian's chromium (``apt-get install chromium``); override with DISPATCH_NB_E2E_CHROMIUM.
CHROMIUM = os.environ.get("DISPATCH_NB_E2E_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
    "--no-proxy-server",
]

#: Environment variables that could point a kernel at a real service; never passed on.
_SCRUBBED_ENV = (
    "OPENAI_API_KEY", "OPENAI_BASE_URL", "OPENAI_BACKEND", "ANTHROPIC_API_KEY",
    "ANTHROPIC_BASE_URL", "DISPATCH_NB_COMPATIBLE_API_KEY", "DISPATCH_NB_COMPATIBLE_BASE_URL",
    "DISPATCH_NB_GITHUB_TOKEN", "GITHUB_TOKEN", "GH_TOKEN",
    "DISPATCH_NB_CACHE", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy",
    "all_proxy", "JUPYTER_PATH", "JUPYTER_CONFIG_PATH", "JUPYTERLAB_SETTINGS_DIR",
    "JUPYTERLAB_WORKSPACES_DIR", "PYTHONSTARTUP",
)


def missing_requirements() -> str | None:
    """Why the browser tests cannot run here, or None when they can."""
    if importlib.util.find_spec("playwright") is None:
        return "playwright is not installed (pip install -e '.[e2e]')"
    for module in ("jupyterlab", "notebook", "jupyter_server", "ipykernel"):
        if importlib.util.find_spec(module) is None:
            return f"{module} is not installed (pip install -e '.[e2e]')"
    if not (os.path.isfile(CHROMIUM) and os.access(CHROMIUM, os.X_OK)):
        return f"no chromium at {CHROMIUM} (apt-get install chromium; never `playwright install`)"
    return None


@dataclass(frozen=True)
class Frontend:
    """One Jupyter front end: how to start its server and where a notebook opens."""

    name: str
    module: str
    args: tuple[str, ...] = ()

    def notebook_path_url(self, path: str) -> str:
        if self.name == "lab":
            # a workspace of its own: JupyterLab would otherwise reopen (and start kernels for)
            # every notebook an earlier test opened
            workspace = re.sub(r"[^A-Za-z0-9-]", "-", path.rsplit(".", 1)[0])
            return f"/lab/workspaces/{workspace}/tree/{quote(path)}"
        return f"/notebooks/{quote(path)}"


FRONTENDS = {
    "lab": Frontend(
        "lab",
        "jupyterlab",
        (
            "--LabApp.news_url=",
            "--LabApp.check_for_updates_class=jupyterlab.handlers.announcements.NeverCheckForUpdate",
            "--LabApp.extension_manager=readonly",
        ),
    ),
    "notebook": Frontend("notebook", "notebook"),
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(
    predicate: Callable[[], Any], timeout: float, interval: float = 0.1, what: str = "condition"
) -> Any:
    """Poll ``predicate`` until it returns something truthy; raise TimeoutError naming ``what``."""
    end = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > end:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def _write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1))


#: JupyterLab / Notebook 7 user settings: no news or update pop-ups over the cells.
_USER_SETTINGS = {
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {
        "checkForUpdates": False,
        "fetchNews": "false",
    },
}


@dataclass
class JupyterServer:
    """A Jupyter server for one front end, isolated from the user's Jupyter setup."""

    frontend: Frontend
    workdir: Path
    env: dict[str, str] = field(default_factory=dict)
    log_path: Path | None = None
    port: int = 0
    token: str = ""
    proc: subprocess.Popen[bytes] | None = None

    @property
    def root(self) -> Path:
        return self.workdir / "root"

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 120.0) -> JupyterServer:
        self.port = free_port()
        self.token = secrets.token_hex(16)
        config_dir = self.workdir / "config"
        runtime_dir = self.workdir / "runtime"
        data_dir = self.workdir / "data"
        for d in (self.root, config_dir, runtime_dir, data_dir, self.workdir / "ipython"):
            d.mkdir(parents=True, exist_ok=True)
        # The kernel runs this interpreter (the project's venv), found before any other python3.
        _write_json(
            data_dir / "kernels" / "python3" / "kernel.json",
            {
                "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                "display_name": "Python 3 (ipykernel)",
                "language": "python",
                "metadata": {"debugger": False},
            },
        )
        for rel, settings in _USER_SETTINGS.items():
            _write_json(config_dir / "lab" / "user-settings" / rel, settings)
        env = {k: v for k, v in os.environ.items() if k not in _SCRUBBED_ENV}
        env.update(
            JUPYTER_CONFIG_DIR=str(config_dir),
            JUPYTER_RUNTIME_DIR=str(runtime_dir),
            # JUPYTER_PATH is searched first and is additive: the venv's lab extensions
            # (ipywidgets) stay visible, and our python3 kernelspec wins.
            JUPYTER_PATH=str(data_dir),
            JUPYTER_PLATFORM_DIRS="1",
            IPYTHONDIR=str(self.workdir / "ipython"),
            NO_PROXY="127.0.0.1,localhost",
            no_proxy="127.0.0.1,localhost",
            PYTHONUNBUFFERED="1",
        )
        env.update(self.env)
        cmd = [
            sys.executable, "-m", self.frontend.module,
            "--no-browser",
            "--ServerApp.ip=127.0.0.1",
            f"--ServerApp.port={self.port}",
            "--ServerApp.port_retries=0",
            f"--IdentityProvider.token={self.token}",
            f"--ServerApp.root_dir={self.root}",
            "--ServerApp.terminals_enabled=False",
            *self.frontend.args,
        ]
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            cmd.append("--allow-root")  # CI containers run as root
        log = (
            open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
            if self.log_path
            else subprocess.DEVNULL
        )
        self._log = log
        self.proc = subprocess.Popen(
            cmd, env=env, cwd=self.root, stdout=log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True,
        )
        try:
            wait_until(self._ready, timeout, 0.2, f"{self.frontend.module} on {self.base_url}")
        except BaseException:
            self.stop()
            raise
        return self

    def _ready(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise RuntimeError(
                f"{self.frontend.module} exited with {self.proc.returncode} before it was ready; "
                f"see {self.log_path}"
            )
        try:
            return bool(self.api("GET", "/api/status").get("started"))
        except (OSError, urllib.error.URLError):
            return False

    def stop(self) -> None:
        """Terminate the server (it shuts its kernels down), then kill what is left of it."""
        proc = self.proc
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        if proc is not None:
            # Kernels are started in the server's process group; none may outlive the test run.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
        log = getattr(self, "_log", None)
        if log not in (None, subprocess.DEVNULL):
            log.close()
        self.proc = None

    # -- REST API --------------------------------------------------------------------------------
    def url(self, path: str) -> str:
        sep = "&" if "?" in path else "?"
        return f"{self.base_url}{path}{sep}token={self.token}"

    def api(self, method: str, path: str, body: Any = None, timeout: float = 10.0) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(
            self.base_url + path,
            data=data,
            method=method,
            headers={"Authorization": f"token {self.token}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            raw = resp.read()
        return json.loads(raw) if raw else None

    def listing(self, path: str, attempts: int = 20) -> list[dict[str, Any]]:
        """GET a list endpoint (``/api/kernels``, ``/api/sessions``), retrying server errors:
        jupyter_server answers 500 while a kernel it lists is still starting."""
        for attempt in range(attempts):
            try:
                result: list[dict[str, Any]] = self.api("GET", path)
                return result
            except urllib.error.HTTPError as exc:
                if exc.code < 500 or attempt == attempts - 1:
                    raise
                time.sleep(0.25)
        raise AssertionError("unreachable")

    def session_for(self, path: str) -> dict[str, Any] | None:
        for session in self.listing("/api/sessions"):
            if session.get("path") == path:
                return dict(session)
        return None

    def wait_kernel_idle(self, path: str, timeout: float = 60.0) -> dict[str, Any]:
        """Wait until the notebook at ``path`` has a kernel whose state is idle."""

        def idle() -> dict[str, Any] | None:
            session = self.session_for(path)
            if session and (session.get("kernel") or {}).get("execution_state") == "idle":
                return session
            return None

        result: dict[str, Any] = wait_until(idle, timeout, 0.2, f"an idle kernel for {path}")
        return result

    def shutdown_kernels(self) -> None:
        """Stop every kernel and session (between tests, so kernels do not pile up)."""
        for session in self.listing("/api/sessions"):
            with contextlib.suppress(urllib.error.HTTPError):
                self.api("DELETE", f"/api/sessions/{session['id']}")
        for kernel in self.listing("/api/kernels"):
            with contextlib.suppress(urllib.error.HTTPError):
                self.api("DELETE", f"/api/kernels/{kernel['id']}")

    def read_notebook(self, path: str) -> dict[str, Any]:
        """The notebook as saved on disk."""
        content: dict[str, Any] = json.loads((self.root / path).read_text())
        return content


def write_notebook(root: Path, name: str, cells: list[str]) -> str:
    """Write a notebook of code cells (with a python3 kernelspec) under ``root``; returns its path."""
    nb = {
        "cells": [
            {
                "cell_type": "code",
                "execution_count": None,
                "id": f"cell-{i}",
                "metadata": {},
                "outputs": [],
                "source": source,
            }
            for i, source in enumerate(cells)
        ],
        "metadata": {
            "kernelspec": {"display_name": "Python 3 (ipykernel)", "language": "python",
                           "name": "python3"},
            "language_info": {"name": "python"},
        },
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    _write_json(root / name, nb)
    return name


@contextlib.contextmanager
def launch_browser(user_data_dir: Path) -> Iterator[Any]:
    """Debian's chromium, headless, with a fresh profile; yields a Playwright BrowserContext."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            str(user_data_dir),
            executable_path=CHROMIUM,
            headless=True,
            args=CHROMIUM_ARGS,
            viewport={"width": 1200, "height": 900},
            device_scale_factor=1,
        )
        try:
            yield context
        finally:
            context.close()


#: the notebook on screen (hidden tabs keep their DOM)
_NOTEBOOK = ".jp-Notebook:visible"
_PROMPT_DONE = re.compile(r"\[\s*(\d+)\s*\]")

#: In-page sampler: every ``interval`` ms, record (time, output text length, cell still running).
_SAMPLER_JS = """
([index, interval]) => {
  window.__dnbSamples = [];
  const started = performance.now();
  window.__dnbSampler = setInterval(() => {
    const notebook = [...document.querySelectorAll('.jp-Notebook')]
      .find((el) => el.offsetParent !== null);
    const cells = notebook ? notebook.querySelectorAll('.jp-Cell') : [];
    const cell = cells[index];
    const out = cell ? cell.querySelector('.jp-OutputArea') : null;
    const prompt = cell ? cell.querySelector('.jp-InputPrompt') : null;
    const text = out ? out.innerText : '';
    const running = prompt ? prompt.innerText.includes('*') : false;
    window.__dnbSamples.push([performance.now() - started, text.length, running]);
  }, interval);
}
"""


#: In-page watcher: on every DOM change in the notebook, record what of the cell's output text
#: matches a pattern (catches states that are on screen for only a moment).
_WATCH_JS = """
([index, pattern]) => {
  const re = new RegExp(pattern, 'i');
  const notebook = [...document.querySelectorAll('.jp-Notebook')]
    .find((el) => el.offsetParent !== null);
  window.__dnbSeen = [];
  const check = () => {
    const cell = notebook.querySelectorAll('.jp-Cell')[index];
    const out = cell ? cell.querySelector('.jp-OutputArea') : null;
    const match = out ? out.innerText.match(re) : null;
    if (match && !window.__dnbSeen.includes(match[0])) window.__dnbSeen.push(match[0]);
  };
  window.__dnbWatcher = new MutationObserver(check);
  window.__dnbWatcher.observe(notebook, {subtree: true, childList: true, characterData: true});
}
"""


#: In-page sampler of the *answer's visible text*: every ``interval`` ms, record (time, the text of
#: the cell's rendered Markdown without footers, notes and math, cell still running, which
#: rendered elements are on screen, the top of the answer's first heading within its cell, and the
#: tag and top of every block of the answer — headings, paragraphs, lists, code, tables — and
#: whether the live view's widgets are still on screen). Math is
#: left out because it is typeset a moment after its block appears (raw ``$x^2$`` first).
_ANSWER_SAMPLER_JS = """
([index, interval]) => {
  window.__dnbAnswer = [];
  const started = performance.now();
  const BLOCKS = ['h1', 'h2', 'h3', 'p', 'pre', 'ol', 'ul', 'table', 'blockquote', 'hr']
    .map((tag) => '.jp-RenderedMarkdown ' + tag + ':not(li ' + tag + '):not(td ' + tag + ')')
    .join(', ');
  const answerText = (out) => {
    const parts = [];
    for (const md of out.querySelectorAll('.jp-RenderedMarkdown')) {
      const clone = md.cloneNode(true);
      clone.querySelectorAll('sub, mjx-container, .MathJax, .MathJax_Preview, script, '
        + 'mjx-assistive-mml, .jp-InternalAnchorLink').forEach((el) => el.remove());
      const holder = document.createElement('div');
      holder.style.position = 'absolute';
      holder.style.left = '-10000px';
      holder.appendChild(clone);
      document.body.appendChild(holder);
      parts.push(clone.innerText);
      holder.remove();
    }
    return parts.join('\\n').replace(/\\$\\$[^$]*\\$\\$|\\$[^$\\n]*\\$/g, ' ');
  };
  window.__dnbAnswerSampler = setInterval(() => {
    const notebook = [...document.querySelectorAll('.jp-Notebook')]
      .find((el) => el.offsetParent !== null);
    const cells = notebook ? notebook.querySelectorAll('.jp-Cell') : [];
    const cell = cells[index];
    const out = cell ? cell.querySelector('.jp-OutputArea') : null;
    const prompt = cell ? cell.querySelector('.jp-InputPrompt') : null;
    const running = prompt ? prompt.innerText.includes('*') : false;
    const has = {};
    let top = null;
    const blocks = [];
    if (out) {
      for (const tag of ['h1', 'h2', 'pre', 'table', 'li', 'strong', 'code', 'mjx-container']) {
        has[tag] = out.querySelector('.jp-RenderedMarkdown ' + tag) !== null;
      }
      // relative to the cell, so scrolling (the front end keeps the next cell in view) is not
      // mistaken for the answer moving
      const h1 = out.querySelector('.jp-RenderedMarkdown h1');
      const cellTop = cell.getBoundingClientRect().top;
      top = h1 ? h1.getBoundingClientRect().top - cellTop : null;
      // every block of the answer (headings, paragraphs, lists, code, tables), in order
      for (const el of out.querySelectorAll(BLOCKS)) {
        blocks.push([el.tagName.toLowerCase(), el.getBoundingClientRect().top - cellTop]);
      }
    }
    const widget = out ? out.querySelector('.dnb-live') !== null : false;
    window.__dnbAnswer.push([performance.now() - started, out ? answerText(out) : '', running,
                             has, top, blocks, widget]);
  }, interval);
}
"""


class AnswerSample(NamedTuple):
    """One sample of ``start_answer_sampling``: what the cell's answer showed at ``ms``."""

    ms: float
    text: str
    running: bool
    #: which rendered elements are on screen (``h1``, ``pre``, ``table``, ...)
    has: dict[str, bool]
    #: the top of the answer's first heading, in px from the top of its cell
    top: float | None
    #: ``(tag, top)`` of every block of the answer, in order (tops in px from the top of the cell)
    blocks: list[tuple[str, float]]
    #: the live view (its widgets) is on screen, not yet the final output
    live: bool


class NotebookPage:
    """A notebook opened in a browser tab, in JupyterLab or Notebook 7."""

    def __init__(self, page: Any, server: JupyterServer, path: str) -> None:
        self.page = page
        self.server = server
        self.path = path

    @property
    def frontend(self) -> str:
        return self.server.frontend.name

    def open(self, timeout: float = 60.0) -> NotebookPage:
        self.page.goto(self.server.url(self.server.frontend.notebook_path_url(self.path)))
        self.page.locator(f"{_NOTEBOOK} .jp-Cell").first.wait_for(timeout=timeout * 1000)
        self.server.wait_kernel_idle(self.path, timeout)
        self.wait_connected(timeout)
        return self

    def wait_connected(self, timeout: float = 60.0) -> None:
        """Wait until the page itself sees its kernel idle (the toolbar's execution indicator):
        the server can report the kernel idle before the page's connection to it is up, and a
        Shift+Enter meanwhile moves to the next cell without running this one."""
        self.panel().locator('.jp-Notebook-ExecutionIndicator[data-status="idle"]').first.wait_for(
            timeout=timeout * 1000)

    def reload(self, timeout: float = 60.0) -> NotebookPage:
        self.page.reload()
        self.page.locator(f"{_NOTEBOOK} .jp-Cell").first.wait_for(timeout=timeout * 1000)
        return self

    def panel(self) -> Any:
        """The notebook's panel (toolbar and cells, without the front end's side bars)."""
        return self.page.locator(".jp-NotebookPanel:visible").first

    # -- cells -----------------------------------------------------------------------------------
    def cell(self, index: int) -> Any:
        return self.page.locator(f"{_NOTEBOOK} .jp-Cell").nth(index)

    def prompt(self, index: int) -> str:
        text: str = self.cell(index).locator(".jp-InputPrompt").first.inner_text()
        return text.strip()

    def set_source(self, index: int, source: str) -> None:
        """Replace a cell's source by typing into its editor (select all, then insert)."""
        editor = self.cell(index).locator(".jp-InputArea-editor .cm-content")
        editor.click()
        self.page.keyboard.press("ControlOrMeta+a")
        self.page.keyboard.insert_text(source)

    def source(self, index: int) -> str:
        text: str = self.cell(index).locator(".jp-InputArea-editor .cm-content").inner_text()
        return text

    def start(self, index: int) -> str:
        """Run a cell with Shift+Enter and return its prompt from before the run."""
        before = self.prompt(index)
        self.cell(index).locator(".jp-InputArea-editor .cm-content").click()
        self.page.keyboard.press("Shift+Enter")
        return before

    def wait_done(self, index: int, before: str, timeout: float = 60.0) -> str:
        """Wait until the cell shows a new execution count (not ``[*]``, not ``before``)."""

        def done() -> str | None:
            prompt = self.prompt(index)
            if _PROMPT_DONE.search(prompt) and prompt != before:
                return prompt
            return None

        result: str = wait_until(done, timeout, 0.05, f"cell {index} of {self.path} to finish")
        return result

    def run(self, index: int, timeout: float = 60.0) -> str:
        """Run a cell and wait for it to finish; returns its output text."""
        before = self.start(index)
        self.wait_done(index, before, timeout)
        return self.output_text(index)

    def output(self, index: int) -> Any:
        return self.cell(index).locator(".jp-OutputArea").first

    def output_text(self, index: int) -> str:
        out = self.cell(index).locator(".jp-OutputArea")
        if out.count() == 0:
            return ""
        text: str = out.first.inner_text()
        return text

    def wait_output(
        self, index: int, predicate: Callable[[str], bool], timeout: float = 30.0,
        what: str = "output",
    ) -> str:
        """Wait until the cell's output text satisfies ``predicate``; returns the text."""

        def check() -> str | None:
            text = self.output_text(index)
            return text if predicate(text) else None

        result: str = wait_until(check, timeout, 0.05, f"{what} in cell {index}")
        return result

    # -- sampling --------------------------------------------------------------------------------
    def start_sampling(self, index: int, interval_ms: int = 30) -> None:
        """Sample the cell's output text length in the page every ``interval_ms``."""
        self.page.evaluate(_SAMPLER_JS, [index, interval_ms])

    def stop_sampling(self) -> list[tuple[float, int, bool]]:
        """Stop sampling; returns ``(ms since start, output text length, cell running)``."""
        samples: list[list[Any]] = self.page.evaluate(
            "() => { clearInterval(window.__dnbSampler); return window.__dnbSamples; }"
        )
        return [(float(t), int(n), bool(r)) for t, n, r in samples]

    def start_answer_sampling(self, index: int, interval_ms: int = 40) -> None:
        """Sample the visible text of the cell's answer (see ``_ANSWER_SAMPLER_JS``)."""
        self.page.evaluate(_ANSWER_SAMPLER_JS, [index, interval_ms])

    def stop_answer_sampling(self) -> list[AnswerSample]:
        """Stop; returns the samples (see :class:`AnswerSample`)."""
        return self._answer_samples("clearInterval(window.__dnbAnswerSampler); ")

    def answer_sampled(self, predicate: Callable[[AnswerSample], bool]) -> bool:
        """Whether a sample taken so far (sampling goes on) satisfies ``predicate``."""
        return any(predicate(sample) for sample in self._answer_samples())

    def _answer_samples(self, stop: str = "") -> list[AnswerSample]:
        samples: list[list[Any]] = self.page.evaluate(f"() => {{ {stop}return window.__dnbAnswer; }}")
        return [
            AnswerSample(float(t), str(x), bool(r), dict(h), top,
                         [(str(tag), float(y)) for tag, y in blocks], bool(widget))
            for t, x, r, h, top, blocks, widget in samples
        ]

    def start_watching(self, index: int, pattern: str) -> None:
        """Record every distinct match of ``pattern`` (a JS regex, case-insensitive) that
        appears in the cell's output text, however briefly."""
        self.page.evaluate(_WATCH_JS, [index, pattern])

    def stop_watching(self) -> list[str]:
        """Stop watching; returns the matches seen, in order."""
        seen: list[str] = self.page.evaluate(
            "() => { window.__dnbWatcher.disconnect(); return window.__dnbSeen; }"
        )
        return seen

    # -- files and pictures ----------------------------------------------------------------------
    def save(self, timeout: float = 20.0) -> dict[str, Any]:
        """Save with Ctrl+S and wait until the file on disk has the cells' outputs."""
        path = self.server.root / self.path
        before = path.stat().st_mtime_ns
        self.cell(0).locator(".jp-InputArea-editor .cm-content").click()
        self.page.keyboard.press("Escape")
        self.page.keyboard.press("ControlOrMeta+s")
        def saved() -> dict[str, Any] | None:
            if path.stat().st_mtime_ns == before:
                return None
            try:
                return self.server.read_notebook(self.path)
            except json.JSONDecodeError:  # caught while the server writes it: look again
                return None

        content: dict[str, Any] = wait_until(saved, timeout, 0.1, f"{self.path} to be saved")
        return content

    def screenshot(self, scenario: str, *, element: Any = None, upto_cell: int | None = None
                   ) -> Path:
        """Save ``test-artifacts/e2e/<scenario>-<frontend>.png``; returns its path.

        The whole page by default; ``element`` alone; or, with ``upto_cell``, the notebook panel
        from its toolbar down to the bottom of that cell.
        """
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        target = ARTIFACTS / f"{scenario}-{self.frontend}.png"
        if upto_cell is not None:
            panel = self.panel().bounding_box()
            cell = self.cell(upto_cell).bounding_box()
            assert panel is not None and cell is not None
            bottom = min(cell["y"] + cell["height"] + 4, panel["y"] + panel["height"])
            clip = {"x": panel["x"], "y": panel["y"], "width": panel["width"],
                    "height": bottom - panel["y"]}
            self.page.screenshot(path=str(target), clip=clip)
        else:
            (element or self.page).screenshot(path=str(target))
        return target


def update_doc_image(source: Path, name: str) -> Path | None:
    """Copy a screenshot to ``docs/images/<name>`` when DISPATCH_NB_UPDATE_DOC_IMAGES=1."""
    if os.environ.get("DISPATCH_NB_UPDATE_DOC_IMAGES") != "1":
        return None
    DOC_IMAGES.mkdir(parents=True, exist_ok=True)
    target = DOC_IMAGES / name
    shutil.copyfile(source, target)
    return target
