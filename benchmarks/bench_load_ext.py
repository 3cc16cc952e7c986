"""How much ``%load_ext dispatch_nb`` adds to an IPython shell, and what it imports.

Each measurement is a fresh interpreter (``python -X importtime`` would also work); we time
``InteractiveShell.instance()`` alone, then with ``%load_ext dispatch_nb``, and report the median
difference. Target (DESIGN.md): under 50 ms; jupyter-ai's magics add about 1.45 s.

    python benchmarks/bench_load_ext.py [--runs 15]
    python benchmarks/bench_load_ext.py --smoke      # one run: fails only if heavy modules load
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

SNIPPET = """
import time, json, sys
t0 = time.perf_counter()
from IPython.core.interactiveshell import InteractiveShell
shell = InteractiveShell.instance()
t1 = time.perf_counter()
if {load}:
    shell.run_line_magic("load_ext", "dispatch_nb")
t2 = time.perf_counter()
heavy = sorted(m for m in ("httpx", "aiohttp", "pydantic", "ipywidgets", "orjson", "llama_cpp",
                           "dispatch_nb.providers", "dispatch_nb.session") if m in sys.modules)
print(json.dumps({{"shell": t1 - t0, "load": t2 - t1, "heavy": heavy}}))
"""


def run(load: bool) -> dict[str, object]:
    out = subprocess.run(
        [sys.executable, "-c", SNIPPET.format(load=load)], capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--smoke", action="store_true", help="one run; time printed, not judged")
    args = ap.parse_args()
    if args.smoke:
        args.runs = 1
    run(True)  # warm the OS file cache
    base = [run(False)["shell"] for _ in range(args.runs)]
    loads = [run(True) for _ in range(args.runs)]
    added = statistics.median(float(r["load"]) for r in loads) * 1000  # type: ignore[arg-type]
    shell_ms = statistics.median(base) * 1000  # type: ignore[type-var]
    print(f"IPython shell start (median of {args.runs}): {shell_ms:.1f} ms")
    print(f"%load_ext dispatch_nb adds (median):       {added:.1f} ms  (target < 50 ms; "
          f"jupyter-ai ~1450 ms → {1450 / max(added, 0.01):.0f}x less)")
    print(f"heavy modules imported by %load_ext:       {loads[-1]['heavy'] or 'none'}")
    if loads[-1]["heavy"]:
        return 1
    return 0 if args.smoke or added < 50 else 1


if __name__ == "__main__":
    sys.exit(main())
