"""Running the example notebooks (``notebooks/``) in a real kernel, and comparing their outputs.

Used by the replay tests (tests/test_notebooks.py) and, as a standalone script, inside the fresh
virtualenv of the binder test (tests/test_binder.py): ``python notebooks_support.py OUT.json
NOTEBOOK...`` executes each notebook with nbclient and writes their normalized outputs as JSON.
Only the standard library, nbformat, nbclient and kernels.py (beside it) are imported.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
NOTEBOOKS = REPO / "notebooks"
NOTEBOOK_NAMES = ("quickstart", "prompt-engineering", "tools", "teaching", "structured-output", "mcp")
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"

#: a wall-clock measurement in an output ("2.4 s", "0.00 s"), or the word a replayed answer shows
#: in its place: this run's timing, not the answer (a fresh recording has timings, its replay not)
_SECONDS = re.compile(r"\b\d+\.\d+ s\b|\breplayed\b")
#: a footer's wall clock ("· 2.4 s", or "· replayed" in its place), which a Python answer's footer
#: shows only when replayed (a live one has no latency to show): left out altogether
_FOOTER_TIME = re.compile(r"(\S) · (?:\d+\.\d+ s|replayed)\b")
#: metadata keys that describe this run rather than the answer (timings, the live rendering used)
_RUN_KEYS = frozenset({"latency_s", "time_to_first_token_s", "live", "replayed"})
_CREDENTIALS = ("DISPATCH_NB_GITHUB_TOKEN", "GITHUB_TOKEN", "GH_TOKEN", "OPENAI_API_KEY",
                "ANTHROPIC_API_KEY", "DISPATCH_NB_COMPATIBLE_API_KEY", "DISPATCH_NB_MODEL",
                "DISPATCH_NB_CACHE", "DISPATCH_NB_CACHE_FILE", "DISPATCH_NB_LIVE")


def kernel_env(home: Path, **extra: str) -> dict[str, str]:
    """This process's environment without credentials or dispatch_nb settings, HOME at ``home``."""
    env = {k: v for k, v in os.environ.items() if k not in _CREDENTIALS}
    env.update({"HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config"),
                "DISPATCH_NB_HOME": str(home / "dispatch_nb")})
    env.update(extra)
    return env


def _strip_timings(value: Any) -> Any:
    if isinstance(value, str):
        return _SECONDS.sub("<t> s", _FOOTER_TIME.sub(r"\1", value))
    if isinstance(value, list):
        return [_strip_timings(v) for v in value]
    if isinstance(value, dict):
        return {k: _strip_timings(v) for k, v in value.items() if k not in _RUN_KEYS}
    return value


def normalized_outputs(nb: Any) -> list[list[dict[str, Any]]]:
    """Every code cell's outputs, without execution counts, with timings masked and consecutive
    printed text joined."""
    cells = []
    for cell in nb["cells"]:
        if cell["cell_type"] != "code":
            continue
        outputs = []
        for output in cell.get("outputs", []):
            kind = output["output_type"]
            if kind == "stream":
                text = _strip_timings(output["text"])
                if outputs and outputs[-1].get("stream") == output["name"]:
                    # How printed text is split into outputs depends on when the kernel flushed.
                    outputs[-1]["text"] += text
                else:
                    outputs.append({"stream": output["name"], "text": text})
            elif kind == "error":
                outputs.append({"error": output["ename"], "value": output["evalue"]})
            else:
                outputs.append({"data": _strip_timings(dict(output.get("data", {}))),
                                "metadata": _strip_timings(dict(output.get("metadata", {})))})
        cells.append(outputs)
    return cells


def execute(path: Path, env: dict[str, str], timeout: float = 120.0) -> Any:
    """Run the notebook at ``path`` in a fresh kernel (working directory: its folder)."""
    import nbformat

    try:
        from tests.kernels import notebook_client
    except ModuleNotFoundError:  # run as a script: its own folder is first on sys.path
        from kernels import notebook_client  # type: ignore[no-redef]

    nb = nbformat.read(path, as_version=4)
    client = notebook_client(nb, timeout=timeout, allow_errors=False,
                             resources={"metadata": {"path": str(path.parent)}})
    with client.setup_kernel(env=env):
        for index, cell in enumerate(nb.cells):
            if cell.cell_type == "code":
                client.execute_cell(cell, index)
        probe = nbformat.v4.new_code_cell(
            "import importlib.util, sys\n"
            "print(sys.prefix)\n"
            "print(importlib.util.find_spec('llama_cpp') is not None)"
        )
        nb.cells.append(probe)
        client.execute_cell(probe, len(nb.cells) - 1)
    # the two lines may come as one stream output or two (a busy kernel flushes in between)
    printed = "".join(o.get("text", "") for o in probe.outputs if o.get("name") == "stdout")
    prefix, has_llama = printed.split()
    nb.cells.pop()
    nb.metadata["kernel_probe"] = {"prefix": prefix, "llama_cpp": has_llama == "True"}
    return nb


def main(argv: list[str]) -> int:
    """``notebooks_support.py OUT.json NOTEBOOK...``: execute each notebook with this process's
    environment; write ``{name: {"outputs": ..., "probe": ...}}`` to OUT.json."""
    out, *paths = argv
    result = {}
    for name in paths:
        nb = execute(Path(name).resolve(), dict(os.environ))
        result[Path(name).stem] = {"outputs": normalized_outputs(nb),
                                   "probe": nb.metadata["kernel_probe"]}
    Path(out).write_text(json.dumps(result), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
