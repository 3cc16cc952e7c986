"""Fixtures for the notebook layer: a real IPython shell, a recording front end, loopback fakes.

``FrontEnd`` stands in for what a notebook front end does with display messages: it keeps the
cell's outputs, applies ``update_display_data`` by display id and ``clear_output(wait=...)``, and
records every message with its JSON size so tests can measure bytes on the wire.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import pytest
from IPython.core.displaypub import DisplayPublisher
from IPython.core.interactiveshell import InteractiveShell

from tests.fakes.canonical import CanonicalFake


class FrontEnd(DisplayPublisher):
    """A display publisher that behaves like a notebook's output area (see module docstring)."""

    def __init__(self, shell: Any = None) -> None:
        super().__init__(shell=shell)
        self.outputs: list[dict[str, Any]] = []
        self.messages: list[tuple[str, Any]] = []
        self._clear_on_next = False

    def publish(  # type: ignore[override]
        self,
        data: dict[str, Any],
        metadata: dict[str, Any] | None = None,
        source: Any = None,
        *,
        transient: dict[str, Any] | None = None,
        update: bool = False,
        **kwargs: Any,
    ) -> None:
        display_id = (transient or {}).get("display_id")
        self.messages.append(
            ("update" if update else "display", {"data": data, "metadata": metadata or {},
                                                 "transient": transient or {}})
        )
        if update:
            for output in self.outputs:
                if output["display_id"] == display_id:
                    output["data"] = data
                    output["metadata"] = metadata or {}
            return
        if self._clear_on_next:
            self.outputs.clear()
            self._clear_on_next = False
        self.outputs.append({"data": data, "metadata": metadata or {}, "display_id": display_id})

    def clear_output(self, wait: bool = False) -> None:
        self.messages.append(("clear", {"wait": wait}))
        if wait:
            self._clear_on_next = True
        else:
            self.outputs.clear()

    def bytes_sent(self) -> int:
        """Total JSON size of every display message."""
        return sum(len(json.dumps(body, default=str)) for _, body in self.messages)

    def reset(self) -> None:
        self.outputs.clear()
        self.messages.clear()
        self._clear_on_next = False

    @property
    def markdown(self) -> list[str]:
        return [o["data"]["text/markdown"] for o in self.outputs if "text/markdown" in o["data"]]


def serve_fake(server: CanonicalFake, monkeypatch: pytest.MonkeyPatch, tmp_path: Any,
               live: str | None = None) -> Iterator[CanonicalFake]:
    """Start ``server`` with the environment pointing ``fake:echo`` at it (a fresh home, cache
    file and user folder under ``tmp_path``; ``DISPATCH_NB_LIVE`` = ``live``, unset for None),
    yield it, close it."""
    server.start()
    monkeypatch.setenv("DISPATCH_NB_FAKE_URL", server.url)
    monkeypatch.setenv("DISPATCH_NB_MODEL", "fake:echo")
    monkeypatch.setenv("DISPATCH_NB_HOME", str(tmp_path / "home"))
    if live is None:
        monkeypatch.delenv("DISPATCH_NB_LIVE", raising=False)
    else:
        monkeypatch.setenv("DISPATCH_NB_LIVE", live)
    monkeypatch.delenv("DISPATCH_NB_CACHE", raising=False)
    monkeypatch.setenv("DISPATCH_NB_CACHE_FILE", str(tmp_path / "answers.dispatch-cache.jsonl"))
    monkeypatch.delenv("DISPATCH_NB_GITHUB_TOKEN", raising=False)
    (tmp_path / "user").mkdir()
    monkeypatch.setenv("HOME", str(tmp_path / "user"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "user" / ".config"))
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> Iterator[CanonicalFake]:
    """The canonical-protocol fake, with the environment pointing ``fake:echo`` at it."""
    yield from serve_fake(CanonicalFake(), monkeypatch, tmp_path)


@pytest.fixture
def shell(fake: CanonicalFake) -> Iterator[InteractiveShell]:
    """IPython's shell with ``dispatch_nb`` loaded and a recording :class:`FrontEnd`."""
    ip = InteractiveShell.instance()
    saved_pub = ip.display_pub
    front = FrontEnd(shell=ip)
    ip.display_pub = front
    ip.front = front  # type: ignore[attr-defined]
    names = set(ip.user_ns)
    ip.run_line_magic("load_ext", "dispatch_nb")
    try:
        yield ip
    finally:
        ip.run_line_magic("unload_ext", "dispatch_nb")
        ip.config.pop("ChatMagics", None)
        ip.display_pub = saved_pub
        for name in set(ip.user_ns) - names:  # (cheaper than ip.reset(), which collects garbage)
            del ip.user_ns[name]
        ip.extension_manager.loaded.discard("dispatch_nb")


def run(ip: InteractiveShell, source: str, **kwargs: Any) -> Any:
    """Run one cell like a front end would (hooks, execution count, ``Err``)."""
    ip.front.reset()  # type: ignore[attr-defined]
    return ip.run_cell(source, store_history=True, **kwargs)


@pytest.fixture
def magics(shell: InteractiveShell) -> Any:
    return shell._dispatch_nb_magics  # type: ignore[attr-defined]


def chat_env() -> dict[str, str]:
    """Environment for a kernel that must find nothing of the developer's own setup."""
    env = dict(os.environ)
    for key in ("DISPATCH_NB_GITHUB_TOKEN", "OPENAI_API_KEY", "ANTHROPIC_API_KEY", "DISPATCH_NB_LIVE",
                "DISPATCH_NB_CACHE", "DISPATCH_NB_COMPATIBLE_API_KEY"):
        env.pop(key, None)
    return env


def fake_kernel_env(fake_url: str, home: Any, cache_file: str, **extra: str) -> dict[str, str]:
    """A kernel's environment with ``fake:echo`` at ``fake_url`` as the default model, a fresh
    home under ``home`` and the response cache in ``home/cache_file``."""
    env = chat_env()
    env.update({
        "DISPATCH_NB_FAKE_URL": fake_url,
        "DISPATCH_NB_MODEL": "fake:echo",
        "DISPATCH_NB_HOME": str(home / "dispatch"),
        "DISPATCH_NB_CACHE_FILE": str(home / cache_file),
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(home / ".config"),
        "PYTHONPATH": os.environ.get("PYTHONPATH", ""),
        **extra,
    })
    return env
