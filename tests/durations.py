"""Summarize a ``pytest --durations=0`` log into the tables of docs/testing.md.

::

    pytest -n auto -q --durations=0 > durations.txt
    python tests/durations.py durations.txt

prints each folder's total (setup + call + teardown of its tests), the 30 slowest tests and the
15 costliest setups and teardowns (what a fixture costs: the first test of a module or session pays
for its module- and session-scoped fixtures).
"""

from __future__ import annotations

import re
import sys
from collections import defaultdict

_LINE = re.compile(r"^(\d+\.\d+)s (setup|call|teardown)\s+(\S.*)$")


def _folder(nodeid: str) -> str:
    parts = nodeid.split("::")[0].split("/")
    if parts[0] == "notebooks":
        return "notebooks/ (nbval)"
    return "/".join(parts[:2]) + "/" if len(parts) > 2 else "tests/ (top)"


def main(path: str) -> None:
    per_test: dict[str, float] = defaultdict(float)
    phases: list[tuple[float, str, str]] = []
    with open(path, encoding="utf-8", errors="replace") as log:
        for raw in log:
            match = _LINE.match(raw.strip())
            if match:
                seconds, phase, nodeid = float(match[1]), match[2], match[3]
                per_test[nodeid] += seconds
                phases.append((seconds, phase, nodeid))
    folders: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for nodeid, seconds in per_test.items():
        folders[_folder(nodeid)][0] += seconds
        folders[_folder(nodeid)][1] += 1
    print(f"{sum(per_test.values()):.0f} s of test time over {len(per_test)} tests\n")
    print("| folder | tests | seconds |\n|---|---:|---:|")
    for name, (seconds, count) in sorted(folders.items(), key=lambda kv: -kv[1][0]):
        print(f"| `{name}` | {count:.0f} | {seconds:.0f} |")
    print("\n| # | test (setup + call + teardown) | seconds |\n|---:|---|---:|")
    slowest = sorted(per_test.items(), key=lambda kv: -kv[1])[:30]
    for rank, (nodeid, seconds) in enumerate(slowest, 1):
        print(f"| {rank} | `{nodeid}` | {seconds:.1f} |")
    print("\n| setup or teardown (a fixture's cost) | seconds |\n|---|---:|")
    for seconds, phase, nodeid in sorted((p for p in phases if p[1] != "call"), reverse=True)[:15]:
        print(f"| {phase} of `{nodeid}` | {seconds:.1f} |")


if __name__ == "__main__":
    main(sys.argv[1])
