"""Run every benchmark in this folder, one after the other, and print their reports.

    python benchmarks/run_all.py            # the full comparison (``make bench``); plots and
                                            # results.md go to docs/benchmarks/
    python benchmarks/run_all.py --smoke    # each once with a small N: checks every client's text

Extra arguments go to every benchmark (each understands ``--smoke``). The exit status is non-zero
when a benchmark failed (a client read a wrong text, or a peer is missing in smoke mode).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
BENCHMARKS = ["bench_streaming.py", "bench_kernel.py", "bench_load_ext.py", "bench_batch.py"]


def main(argv: list[str]) -> int:
    status = 0
    for name in BENCHMARKS:
        print(f"\n=== {name} ===", flush=True)
        extra = []
        if name == "bench_streaming.py" and "--smoke" not in argv:
            extra = ["--plots", str(HERE.parent / "docs" / "benchmarks")]  # the published results
        status |= subprocess.run([sys.executable, str(HERE / name), *argv, *extra]).returncode
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
