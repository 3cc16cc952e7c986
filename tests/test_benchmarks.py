"""The benchmarks do not rot: each runs once with a small N, and every client must read its stream
right (speed is printed by the benchmarks, never judged here).

Each benchmark runs with ``--smoke``, as ``benchmarks/run_all.py --smoke`` runs them all: the
streaming comparison (every client: dispatch_nb on both transports, the naive loops, the openai
and anthropic SDKs, litellm, llm — a missing peer fails),
the real-kernel CPU benchmark, the ``%load_ext`` benchmark (which fails if heavy modules load) and
the batch benchmark (``abatch`` and the openai SDK over the same rows: every answer's text checked).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

pytestmark = [pytest.mark.kernel, pytest.mark.slow, pytest.mark.timeout(900)]


#: each benchmark and what its smoke run must print (each test is its own unit: they run in parallel)
EXPECTED = {
    "bench_streaming.py": ["all 23 clients read every stream correctly"],
    "bench_kernel.py": ["%%chat streaming 40 events at 100/s into a real kernel"],
    "bench_load_ext.py": ["heavy modules imported by %load_ext:       none"],
    "bench_batch.py": ["40 rows, each a 10-token answer", "every client read every answer right"],
}


def test_run_all_runs_every_benchmark() -> None:
    from benchmarks.run_all import BENCHMARKS

    assert sorted(BENCHMARKS) == sorted(EXPECTED)


@pytest.mark.parametrize("name", list(EXPECTED))
def test_every_benchmark_runs_and_every_client_reads_the_right_text(name: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "DISPATCH_NB_TRANSPORT"}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    run = subprocess.run([sys.executable, str(REPO / "benchmarks" / name), "--smoke"],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=850)
    report = run.stdout + run.stderr
    assert run.returncode == 0, report[-6000:]
    for line in EXPECTED[name]:
        assert line in run.stdout, report[-3000:]
