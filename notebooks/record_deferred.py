"""Record ``deferred.ipynb``: its checkpoint from a real deferred batch, then its saved outputs.

No provider batch API is reachable offline, so the batch goes to a loopback server speaking
OpenAI's Files + Batches API (``tests/fakes/batch_api.py``, the fake the tests run against) on top
of the Responses API fake; every request of the job is answered by the embedded model
(SmolLM2-135M-Instruct, ``local:smollm2``) instead of the fake's echo. The notebook's own call —
``batch(..., model="openai:gpt-4.1-mini", deferred=True)`` with ``OPENAI_BASE_URL`` pointing at
that server — submits the job, sees its states, and collects it in a second call, exactly as a
kernel restarted between submit and collect would; the checkpoint it writes
(``deferred.checkpoint.jsonl``) ships beside the notebook. Then the notebook is executed with no
key and no server (its checkpoint answers every row) and saved with those outputs.

Run from the repository root, with the ``local`` and ``notebook`` extras installed::

    python notebooks/record_deferred.py
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from dispatch_nb import Message, batch, connect  # noqa: E402
from tests.fakes.batch_api import FakeJob, OpenAIBatches  # noqa: E402
from tests.fakes.openai_responses import OpenAIResponsesFake  # noqa: E402
from tests.fakes.provider import Turn  # noqa: E402
from tests.notebooks_support import NOTEBOOKS, execute, kernel_env  # noqa: E402

NOTEBOOK = NOTEBOOKS / "deferred.ipynb"
CHECKPOINT = NOTEBOOKS / "deferred.checkpoint.jsonl"
KEY = "sk-loopback-recording"  # the loopback server's key: not a real one, never written
# What the notebook asks (its cells use the same values, so its rows have the same keys).
MODEL = "openai:gpt-4.1-mini"
TEMPLATE = "Is this review positive or negative? Answer with one word.\n\nReview: {text}"
OPTIONS: dict[str, Any] = {"max_tokens": 16, "temperature": 0.0}


class EmbeddedModelBatches(OpenAIBatches):
    """OpenAI's Batch API whose requests the embedded model answers (its text, usage and name
    in an OpenAI Responses body, rendered by the Responses fake)."""

    def __init__(self, fake: OpenAIResponsesFake, **options: Any) -> None:
        super().__init__(fake, **options)
        self.model = connect("local:smollm2")

    def answer(self, job: FakeJob, line: dict[str, Any]) -> tuple[int, Any]:
        body = line["body"]
        items = body["input"] if isinstance(body["input"], list) else [
            {"role": "user", "content": body["input"]}]
        messages = []
        for item in items:
            content = item["content"]
            text = content if isinstance(content, str) else "".join(
                part.get("text", "") for part in content)
            messages.append(Message(role=item["role"], content=text))
        answer = self.model.chat(messages, system=body.get("instructions"),
                                 max_tokens=body.get("max_output_tokens"),
                                 temperature=body.get("temperature"))
        self.fake.push(Turn(text=answer.text, input_tokens=answer.usage.input_tokens,
                            output_tokens=answer.usage.output_tokens,
                            stop_reason=answer.stop_reason, model=answer.model))
        return super().answer(job, line)


def reviews() -> Any:
    """The notebook's rows (its "The rows" cell)."""
    import nbformat
    import pandas as pd

    namespace: dict[str, Any] = {"pd": pd}

    nb = nbformat.read(NOTEBOOK, as_version=4)
    [cell] = [c for c in nb.cells if c.cell_type == "code" and c.source.startswith("reviews =")]
    exec(cell.source, namespace)  # noqa: S102 - the notebook's own cell
    return namespace["reviews"]


def record_checkpoint() -> None:
    CHECKPOINT.unlink(missing_ok=True)
    with OpenAIResponsesFake(api_key=KEY) as fake:
        batches = EmbeddedModelBatches(fake, in_progress_polls=3)
        os.environ.update({"OPENAI_API_KEY": KEY, "OPENAI_BASE_URL": fake.base_url})
        rows = reviews()
        os.chdir(NOTEBOOKS)  # the checkpoint's name as the notebook gives it
        submitted = batch(TEMPLATE, rows, model=MODEL, deferred=True, wait=False,
                          checkpoint=CHECKPOINT.name, progress=False, **OPTIONS)
        print("submitted:", submitted.job)
        # A second call — as after a kernel restart — finds the job in the checkpoint.
        collected = batch(TEMPLATE, rows, model=MODEL, deferred=True, poll_interval=1,
                          checkpoint=CHECKPOINT.name, progress=False, **OPTIONS)
        print("collected:", collected.job)
        print(collected.summary())
        assert len(batches.created) == 1, "the second call must not submit again"
        assert collected.ok == len(rows), collected.errors
        del os.environ["OPENAI_API_KEY"], os.environ["OPENAI_BASE_URL"]


def record_outputs() -> None:
    """Run the notebook as a reader does — no key, no server — and save its outputs."""
    import nbformat

    before = CHECKPOINT.read_bytes()
    with tempfile.TemporaryDirectory() as home:
        nb = execute(NOTEBOOK, kernel_env(Path(home)), timeout=300)
    nb.metadata.pop("kernel_probe", None)
    nb.metadata.pop("widgets", None)
    assert CHECKPOINT.read_bytes() == before, "the notebook must only read its checkpoint"
    nbformat.write(nb, NOTEBOOK)
    print(f"saved {NOTEBOOK.relative_to(REPO)}")


if __name__ == "__main__":
    record_checkpoint()
    record_outputs()
