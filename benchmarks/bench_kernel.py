"""Kernel CPU while a ``%%chat`` cell streams 100 events per second into a real Jupyter kernel.

A model streams at tens of events per second; what matters then is not throughput but how much of
a core the kernel burns meanwhile (the notebook must stay responsive, the laptop cool). This starts
a real kernel (jupyter_client), loads the extension, points ``%%chat`` at the benchmark server
streaming a chat.completions answer at 100 events/s, and reads the kernel process's CPU time from
``/proc`` around the cell — on each transport. The idle kernel's own CPU over the same time is
subtracted. The answer shown must be the one streamed.

    python benchmarks/bench_kernel.py [--events 500] [--rate 100]
    python benchmarks/bench_kernel.py --smoke
"""

from __future__ import annotations

import argparse
import os
import queue
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_streaming import start_server  # noqa: E402
from stream_server import expected_text  # noqa: E402

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


class Kernel:
    """A python3 kernel driven with jupyter_client."""

    def __init__(self, env: dict[str, str]) -> None:
        from jupyter_client.manager import KernelManager

        self.km = KernelManager(kernel_name="python3")
        self.km.start_kernel(env=env)
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=60)

    def execute(self, code: str, timeout: float = 120) -> list[dict[str, Any]]:
        msg_id = self.kc.execute(code)
        messages: list[dict[str, Any]] = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                msg = self.kc.get_iopub_msg(timeout=1)
            except queue.Empty:
                continue
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            messages.append(msg)
            if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                return messages
        raise TimeoutError(code)

    def close(self) -> None:
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=True)


def output_text(messages: list[dict[str, Any]]) -> str:
    texts = []
    for msg in messages:
        content = msg["content"]
        if msg["msg_type"] == "stream":
            texts.append(content["text"])
        elif msg["msg_type"] in ("display_data", "update_display_data", "execute_result"):
            data = content["data"]
            texts.append(data.get("text/markdown") or data.get("text/plain") or "")
        elif msg["msg_type"] == "error":
            texts.append("\n".join(content["traceback"]))
    return "\n".join(texts)


def run(server: str, transport: str, events: int, rate: int) -> dict[str, float]:
    home = Path(tempfile.mkdtemp(prefix="bench-kernel-"))
    repo = str(HERE.parent)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "ANTHROPIC_"))}
    env.update(
        DISPATCH_NB_TRANSPORT=transport,
        DISPATCH_NB_MODEL="compatible:bench",
        DISPATCH_NB_COMPATIBLE_BASE_URL=f"{server}/paced{rate}/{events}/v1",
        DISPATCH_NB_HOME=str(home / "dispatch"),
        DISPATCH_NB_CACHE="off",
        HOME=str(home),
        PYTHONPATH=os.pathsep.join([repo, env.get("PYTHONPATH", "")]),
    )
    kernel = Kernel(env)
    try:
        kernel.execute("%load_ext dispatch_nb")
        pid_out = output_text(kernel.execute("import os; print(os.getpid())"))
        pid = int(pid_out.strip().split()[-1])
        kernel.execute("%%chat --no-history\nwarm up")  # imports, the connection pool
        idle_from, idle_t0 = cpu_seconds(pid), time.monotonic()
        time.sleep(1.0)
        idle = (cpu_seconds(pid) - idle_from) / (time.monotonic() - idle_t0)
        c0, t0 = cpu_seconds(pid), time.monotonic()
        messages = kernel.execute("%%chat --no-history\nstream it")
        wall = time.monotonic() - t0
        cpu = cpu_seconds(pid) - c0
        shown = output_text(messages)
        if expected_text(events).strip() not in shown:
            raise AssertionError(f"{transport}: the kernel did not show the streamed answer: "
                                 f"{shown[-300:]!r}")
    finally:
        kernel.close()
        shutil.rmtree(home, ignore_errors=True)
    busy = max(cpu - idle * wall, 0.0)
    return {"wall": wall, "cpu": cpu, "idle_per_s": idle, "cpu_per_s": busy / wall,
            "us_per_event": busy / events * 1e6}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=500)
    ap.add_argument("--rate", type=int, default=100, help="events per second")
    ap.add_argument("--rounds", type=int, default=2,
                    help="kernels per transport, taking turns; the least CPU counts")
    ap.add_argument("--smoke", action="store_true", help="a short answer; check it is shown")
    args = ap.parse_args()
    if args.smoke:
        args.events, args.rounds = 40, 1
    proc, server = start_server()
    results: dict[str, dict[str, float]] = {}
    try:
        for _ in range(args.rounds):
            for transport in ("aiohttp", "httpx"):
                r = run(server, transport, args.events, args.rate)
                if transport not in results or r["cpu_per_s"] < results[transport]["cpu_per_s"]:
                    results[transport] = r
    finally:
        proc.terminate()
        proc.wait(10)
    print(f"\n%%chat streaming {args.events} events at {args.rate}/s into a real kernel "
          f"(best of {args.rounds}):\n")
    for transport, r in results.items():
        print(f"  {transport:8s} transport: {r['cpu_per_s'] * 100:5.1f} % of a core while streaming "
              f"({r['us_per_event']:.0f} us CPU per event; {r['wall']:.1f} s; idle kernel "
              f"{r['idle_per_s'] * 100:.1f} %)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
