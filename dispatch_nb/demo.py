"""``python -m dispatch_nb demo``: run the quickstart notebook end to end in a real Jupyter kernel,
printing each ``%%chat`` prompt and its answer (docs/teaching.md, "The demo"). Exit status: 0 when
every cell ran, 1 when a cell failed or nothing can answer, 2 for usage errors.
"""

from __future__ import annotations

import functools
import os
import re
import subprocess
import time
from pathlib import Path
from typing import Any

__all__ = ["default_notebook", "run_demo"]

#: the notebook the demo runs, relative to a clone of the repository
QUICKSTART = Path("notebooks") / "quickstart.ipynb"


def default_notebook() -> Path | None:
    """``notebooks/quickstart.ipynb`` of the checkout this package runs from, else of the working
    directory; None when neither exists (e.g. an installed wheel run outside a clone)."""
    for root in (Path(__file__).resolve().parent.parent, Path.cwd()):
        candidate = root / QUICKSTART
        if candidate.is_file():
            return candidate
    return None


def _chat_prompt(source: str) -> tuple[str, str] | None:
    """``(magic line, prompt)`` of a ``%%chat`` cell, else None."""
    first, _, body = source.partition("\n")
    if not first.lstrip().startswith("%%chat"):
        return None
    return first.strip(), body.strip()


def _indent(text: str, prefix: str = "    ") -> str:
    return "\n".join(prefix + line if line else line for line in text.rstrip().splitlines())


def _answer_text(outputs: list[Any]) -> str:
    """The final output of a ``%%chat`` cell as a terminal shows it: its ``text/plain`` and
    ``[footer]`` (the Markdown one holds HTML for the footer and ``\\$`` escapes for the front
    ends' math)."""
    for output in reversed(outputs):
        data = output.get("data", {}) if isinstance(output, dict) else {}
        if "text/plain" in data:
            text = str(data["text/plain"]).strip()
            footer = output.get("metadata", {}).get("dispatch_nb", {}).get("footer")
            return f"{text}\n\n[{footer}]" if footer and footer not in text else text
    return ""


def _error_text(outputs: list[Any]) -> str:
    for output in outputs:
        if output.get("output_type") == "error":
            lines = [re.sub(r"\x1b\[[0-9;]*m", "", line) for line in output.get("traceback", [])]
            short = [line for line in lines if line.strip()][-3:]
            return "\n".join(short) or f"{output.get('ename')}: {output.get('evalue')}"
    return ""


def run_demo(
    notebook: str | os.PathLike[str] | None = None,
    *,
    model: str | None = None,
    cache: str = "off",
    timeout: float = 600.0,
) -> int:
    """Execute ``notebook`` (default: the quickstart) and print each ``%%chat`` prompt and answer;
    return the exit status (0 or 1).

    ``model`` overrides the notebook's model for every ``%%chat`` cell (default: the best model
    available here; in ``replay``, the notebook's own, which its answers were recorded with);
    ``cache`` is the response-cache mode of the run (``off``: the model answers); ``timeout``
    bounds each cell in seconds.
    """

    say = functools.partial(print, flush=True)
    path = Path(notebook) if notebook is not None else default_notebook()
    if path is None or not path.is_file():
        where = path if path is not None else QUICKSTART
        say(f"error: no notebook at {where}; run the demo from a clone of the repository, or pass "
            "--notebook PATH")
        return 1
    try:
        import nbformat
        from nbclient import NotebookClient
        from nbclient.exceptions import CellExecutionError, DeadKernelError
    except ImportError as exc:
        say(f"error: the demo needs nbclient and ipykernel ({exc.name} is missing): "
            "pip install 'dispatch-nb[notebook]'")
        return 1

    spec, reason, usable = model or "", "--model", True
    if not model and cache == "replay":  # the model the notebook was recorded with, its own
        reason = "the notebook's own: the one its answers were recorded with"
    elif not model:
        from .defaults import resolve_default_model

        resolved = resolve_default_model()
        spec, reason, usable = resolved.spec, resolved.reason, not resolved.needs_login
    if not usable:
        say("error: no model can answer here: install the embedded model with "
            "pip install 'dispatch-nb[local]', log in to GitHub Copilot with "
            "`python -m dispatch_nb login`, or set OPENAI_API_KEY / ANTHROPIC_API_KEY")
        return 1
    say(f"Running {path} in a Jupyter kernel")
    say(f"Model: {spec or 'as in the notebook'} ({reason}); response cache: {cache}")
    if spec.startswith("local:"):
        say("(the embedded model loads in a second or two on first use; answers take a few seconds)")
    say()

    nb: Any = nbformat.read(path, as_version=4)  # type: ignore[no-untyped-call]
    env = {**os.environ, "DISPATCH_NB_CACHE": cache, "DISPATCH_NB_LIVE": "display"}
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent.resolve())}})
    overrides = (f'%config ChatMagics.model = "{spec}"\n' if spec else "") \
        + f'%config ChatMagics.cache = "{cache}"'
    started = time.monotonic()
    answers = 0
    configured = False
    try:
        # The kernel's own stderr (e.g. ipykernel's transport warning) stays out of the transcript.
        with client.setup_kernel(env=env, stderr=subprocess.DEVNULL):
            for index, cell in enumerate(list(nb.cells)):
                if cell.cell_type != "code" or not cell.source.strip():
                    continue
                chat = _chat_prompt(cell.source)
                if chat is not None:
                    if not configured:
                        raise RuntimeError("the notebook runs %%chat before %load_ext dispatch_nb")
                    line, prompt = chat
                    say(f"── {line}")
                    say(_indent(prompt, "  > "))
                    say()
                try:
                    client.execute_cell(cell, index)
                except CellExecutionError:
                    say("error: this cell failed:")
                    say(_indent(_error_text(cell.outputs) or "(no error output)"))
                    return 1
                if not configured and "%load_ext dispatch_nb" in cell.source:
                    # Every %%chat below uses the chosen model and cache mode.
                    extra = nbformat.v4.new_code_cell(overrides)  # type: ignore[no-untyped-call]
                    nb.cells.append(extra)
                    client.execute_cell(extra, len(nb.cells) - 1)
                    configured = True
                if chat is not None:
                    answers += 1
                    say(_indent(_answer_text(cell.outputs) or "(no answer)"))
                    say()
                else:
                    printed = "".join(o.get("text", "") for o in cell.outputs
                                      if o.get("output_type") == "stream")
                    if printed.strip():
                        say(_indent(printed))
                        say()
    except (DeadKernelError, TimeoutError, RuntimeError) as exc:
        say(f"error: {type(exc).__name__}: {exc}")
        return 1
    source = spec or "the recording"
    say(f"Done: {answers} answers from {source} in {time.monotonic() - started:.0f} s.")
    return 0
