"""Run every benchmark in this folder, one after the other, and print their reports."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
BENCHMARKS = ["bench_streaming.py", "bench_load_ext.py"]


def main() -> int:
    status = 0
    for name in BENCHMARKS:
        path = HERE / name
        if not path.exists():
            continue
        print(f"\n=== {name} ===", flush=True)
        status |= subprocess.run([sys.executable, str(path)]).returncode
    return status


if __name__ == "__main__":
    sys.exit(main())
