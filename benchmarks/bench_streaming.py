"""Per-event cost of consuming a streamed answer: dispatch_nb vs naive loops vs peer libraries.

Every client (``clients.py``: dispatch_nb's three HTTP adapters sync and async, on the aiohttp and
the httpx transport; the naive httpx loop; the openai SDK with its default and its aiohttp client;
the anthropic SDK; litellm; simonw/llm) reads the same streams from one loopback server running in
another process, in two modes: one TCP write per event (what real APIs do) and the whole body in
one write. Each client's text is checked against the answer the server spelled. Clients take turns
in every round, so load from elsewhere spreads over all of them; the best round counts. The
server gets a core of its own, the clients the others (``--shared-cores``: not; see ``isolate``).

Reported per event: the client process's CPU time (``time.process_time``: every thread, the
dispatch_nb HTTP thread included — the fair measure on a shared machine) and the wall time. Ratios
are CPU ratios measured side by side in this one run. Then peak memory while one 100,000-event
answer streams.

    python benchmarks/bench_streaming.py [--events 5000] [--repeats 5] [--plots docs/benchmarks]
    python benchmarks/bench_streaming.py --smoke      # every client once, small N: checks texts

Targets (issue 16): every dispatch_nb adapter, sync and async, ≥ 20x faster per event than the
openai SDK's default client and ≥ 15x faster than the SDK with its aiohttp client on the
one-write-per-event stream, and at most 0.5x the naive httpx loop's cost. Issue 25 (one path: sync
calls over the async core) asks, sync and async: at least 15x the openai SDK's default client and
at most 0.45x the naive loop; each ratio line says both verdicts.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import gc
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from clients import Client, all_clients, available  # noqa: E402
from stream_server import expected_text  # noqa: E402

MODES = {"event": "one write per event", "bulk": "one bulk body"}
SDK_DEFAULT = {"chat": "openai SDK chat", "responses": "openai SDK responses",
               "anthropic": "openai SDK chat"}
TARGET_SDK, TARGET_SDK_AIOHTTP, TARGET_NAIVE = 20.0, 15.0, 0.5
#: issue 25's targets: at least this many times the SDK's default client, at most this x naive
ONE_PATH_SDK, ONE_PATH_NAIVE = 15.0, 0.45


def start_server(*, own_core: bool = False) -> tuple[subprocess.Popen[bytes], str]:
    """Start the loopback server in a process of its own; ``own_core``: see :func:`isolate`."""
    portfile = Path(tempfile.mkdtemp()) / "port"
    proc = subprocess.Popen([sys.executable, str(HERE / "stream_server.py"), str(portfile)])
    if own_core:
        print(isolate(proc.pid))
    for _ in range(400):
        if portfile.exists() and portfile.read_text().strip():
            break
        time.sleep(0.05)
    port = portfile.read_text().strip()
    shutil.rmtree(portfile.parent)
    return proc, f"http://127.0.0.1:{port}"


def isolate(server_pid: int) -> str:
    """Give the server (which stands for a remote API) a core of its own and this process the
    others, when there are two or more (Linux). Sharing cores, the server takes turns with the
    client's threads, and how fast it writes decides how many events each read of the client
    brings: on a 2-core machine that moved a two-thread client (dispatch_nb's sync calls) by up to
    2 µs per event from run to run. Returns a line saying what it did."""
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_setaffinity") else []
    if len(cores) < 2:
        return "(the server shares the cores with the clients: fewer than 2 here)"
    server, clients = {cores[-1]}, set(cores[:-1])
    os.sched_setaffinity(server_pid, server)
    for thread in os.listdir("/proc/self/task"):  # this process's threads now and to come
        os.sched_setaffinity(int(thread), clients)
    return f"(the server runs on core {cores[-1]}, the clients on {sorted(clients)})"


class Runner:
    """Calls sync and async clients alike (async ones on one event loop)."""

    def __init__(self, *, collect: bool = True) -> None:
        self.loop = asyncio.new_event_loop()
        #: a full garbage collection before each timed run (0.4 s each with every peer imported:
        #: most of a smoke run, which times nothing)
        self.collect = collect

    def call(self, client: Client, run: Callable[[], Any]) -> str:
        if client.is_async:
            return str(self.loop.run_until_complete(run()))
        return str(run())

    def timed(self, client: Client, run: Callable[[], Any]) -> tuple[float, float, str]:
        if self.collect:
            gc.collect()
        c0, t0 = time.process_time(), time.perf_counter()
        text = self.call(client, run)
        return time.process_time() - c0, time.perf_counter() - t0, text

    def close(self) -> None:
        from clients import ASYNC_CLIENTS

        for client in ASYNC_CLIENTS:
            close = getattr(client, "close", None) or client.aclose
            self.loop.run_until_complete(close())
        self.loop.run_until_complete(self.loop.shutdown_asyncgens())
        self.loop.close()


def measure(
    clients: list[Client], server: str, mode: str, n: int, repeats: int, runner: Runner,
    failures: list[str],
) -> dict[str, tuple[float, float]]:
    """Best CPU and wall seconds per event for each client (their texts checked)."""
    base = f"{server}/{mode}/{n}"
    want = expected_text(n)
    runs: dict[str, Callable[[], Any]] = {}
    for client in clients:
        try:
            runs[client.name] = client.make(base)
            text = runner.call(client, runs[client.name])  # warm-up: imports, connections
        except Exception as exc:
            failures.append(f"{client.name} ({mode}): failed: {exc!r}")
            runs.pop(client.name, None)
            continue
        if text != want:
            failures.append(f"{client.name} ({mode}): wrong text ({len(text)} chars, "
                            f"{len(want)} expected; starts {text[:40]!r})")
            runs.pop(client.name)
    best: dict[str, tuple[float, float]] = {}
    for _ in range(repeats):
        for client in clients:
            if client.name not in runs:
                continue
            cpu, wall, text = runner.timed(client, runs[client.name])
            if text != want:
                failures.append(f"{client.name} ({mode}): wrong text in a timed run")
            old = best.get(client.name, (float("inf"), float("inf")))
            best[client.name] = (min(old[0], cpu / n), min(old[1], wall / n))
    return best


def memory(server: str, n: int, runner: Runner) -> list[tuple[str, int, int]]:
    """(client, peak bytes traced while streaming, text bytes) for one n-event answer.

    The deltas are consumed and dropped (as a live view does); the text is read from the final
    ``Response``, so the peak is what dispatch_nb itself holds."""
    from dispatch_nb import connect

    base = f"{server}/event/{n}"
    adapter = connect("compatible:bench", base_url=f"{base}/v1")

    def sync() -> str:
        with adapter.stream("hi") as stream:
            for _ in stream:
                pass
            return stream.response.text

    async def asynchronous() -> str:
        async with adapter.astream("hi") as stream:
            async for _ in stream:
                pass
            return stream.response.text

    out = []
    for name, run, is_async in [("dispatch_nb compatible", sync, False),
                                ("dispatch_nb compatible (async)", asynchronous, True)]:
        client = Client(name, "dispatch_nb", "chat", is_async, lambda base, run=run: run)
        runner.call(client, run)  # warm-up outside the measurement
        gc.collect()
        tracemalloc.start()
        try:
            baseline = tracemalloc.get_traced_memory()[0]
            text = runner.call(client, run)
            peak = tracemalloc.get_traced_memory()[1] - baseline
        finally:
            tracemalloc.stop()
        assert text == expected_text(n), f"{name}: wrong text"
        out.append((name, peak, len(text)))
    adapter.close()
    return out


def ratios(results: dict[str, tuple[float, float]], clients: list[Client]) -> list[str]:
    """The target checks (printed, never asserted)."""
    lines = []
    for client in clients:
        if client.family != "dispatch_nb" or client.name not in results:
            continue
        ours = results[client.name][0]
        sdk = SDK_DEFAULT[client.api] + (" (async)" if client.is_async else "")
        sdk_aiohttp = SDK_DEFAULT[client.api] + " (async, aiohttp)"
        naive = "naive httpx loop" + (" (async)" if client.is_async else "")
        parts = []
        if sdk in results:
            r = results[sdk][0] / ours
            parts.append(f"{r:5.1f}x faster than {sdk} ({'met' if r >= TARGET_SDK else 'MISSED'} "
                         f"{TARGET_SDK:g}x; issue 25: {'met' if r >= ONE_PATH_SDK else 'MISSED'} "
                         f"{ONE_PATH_SDK:g}x)")
        if sdk_aiohttp in results:
            r = results[sdk_aiohttp][0] / ours
            parts.append(f"{r:5.1f}x faster than the SDK's aiohttp client "
                         f"({'met' if r >= TARGET_SDK_AIOHTTP else 'MISSED'} {TARGET_SDK_AIOHTTP:g}x)")
        if naive in results:
            r = ours / results[naive][0]
            parts.append(f"{r:4.2f}x the naive loop's cost "
                         f"({'met' if r <= TARGET_NAIVE else 'MISSED'} <= {TARGET_NAIVE:g}x; issue 25: "
                         f"{'met' if r <= ONE_PATH_NAIVE else 'MISSED'} <= {ONE_PATH_NAIVE:g}x)")
        lines.append(f"  {client.name}:\n      " + "\n      ".join(parts))
    return lines


def plot(results: dict[str, dict[str, tuple[float, float]]], clients: list[Client], n: int,
         folder: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"dispatch_nb": "#1b7f3b", "dispatch_nb (httpx)": "#8fcf9f", "naive": "#7f7f7f",
              "openai SDK": "#1f5fbf", "anthropic SDK": "#c0632b", "litellm": "#8a4fbf",
              "llm": "#bf3f6f"}
    family = {c.name: c.family for c in clients}
    written = []
    for mode, rows in results.items():
        items = sorted(rows.items(), key=lambda kv: kv[1][0])
        fig, ax = plt.subplots(figsize=(9, 0.32 * len(items) + 1.4), dpi=110)
        names = [k for k, _ in items]
        values = [v[0] * 1e6 for _, v in items]
        ax.barh(names, values, color=[colors.get(family.get(k, ""), "#999999") for k in names])
        ax.set_xscale("log")
        ax.invert_yaxis()
        for y, value in enumerate(values):
            ax.text(value * 1.04, y, f"{value:.1f}", va="center", fontsize=8)
        ax.set_xlabel("client CPU µs per streamed event (log scale; lower is better)")
        ax.set_title(f"{n:,} events, {MODES[mode]} — best of several rounds, side by side",
                     fontsize=10)
        ax.tick_params(axis="y", labelsize=8)
        ax.set_xlim(right=max(values) * 2.2)
        fig.tight_layout()
        path = folder / f"streaming-{mode}.png"
        fig.savefig(path)
        plt.close(fig)
        written.append(path)
    return written


def markdown(results: dict[str, dict[str, tuple[float, float]]], clients: list[Client], n: int,
             repeats: int, mem: list[tuple[str, int, int]], mem_n: int) -> str:
    lines = [f"Measured {datetime.date.today()} on {platform.machine()} ({os.cpu_count()} cores), "
             f"Python {platform.python_version()}; {n:,} events per stream, best of {repeats} "
             "rounds, clients taking turns in each round.", ""]
    for mode, rows in results.items():
        lines += [f"### {MODES[mode]}", "",
                  "| client | CPU µs/event | wall µs/event | openai SDK ÷ this (CPU) |",
                  "|---|---:|---:|---:|"]
        for client in clients:
            if client.name not in rows:
                continue
            cpu, wall = rows[client.name]
            sdk = SDK_DEFAULT[client.api] + (" (async)" if client.is_async else "")
            ratio = f"{rows[sdk][0] / cpu:.1f}x" if sdk in rows else "–"
            lines.append(f"| {client.name} | {cpu * 1e6:.2f} | {wall * 1e6:.2f} | {ratio} |")
        lines.append("")
    if mem:
        lines += [f"### Peak memory, one {mem_n:,}-event answer", "",
                  "| client | peak traced | text | beyond 2× the text, per delta |",
                  "|---|---:|---:|---:|"]
        for name, peak, text in mem:
            lines.append(f"| {name} | {peak / 1024:.0f} KiB | {text / 1024:.0f} KiB | "
                         f"{(peak - 2 * text) / mem_n:.1f} bytes |")
        lines.append("")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=5000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--modes", default="event,bulk")
    ap.add_argument("--only", default="", help="run only clients whose name contains this")
    ap.add_argument("--memory-events", type=int, default=100_000)
    ap.add_argument("--plots", type=Path, help="write PNG plots (and results.md) to this folder")
    ap.add_argument("--shared-cores", action="store_true",
                    help="let the server share the cores with the clients (see isolate())")
    ap.add_argument("--smoke", action="store_true",
                    help="every client once with a small N; fail if any is missing or wrong")
    args = ap.parse_args()
    if args.smoke:
        args.events, args.repeats, args.memory_events = 200, 1, 2000
    clients = [c for c in all_clients() if args.only in c.name]
    missing = [c for c in clients if not available(c)]
    for c in missing:
        print(f"({c.name}: not installed — pip install {c.requires})")
    clients = [c for c in clients if available(c)]
    failures = [f"{c.name}: not installed" for c in missing] if args.smoke else []

    proc, server = start_server(own_core=not (args.shared_cores or args.smoke))
    runner = Runner(collect=not args.smoke)
    results: dict[str, dict[str, tuple[float, float]]] = {}
    mem: list[tuple[str, int, int]] = []
    try:
        for mode in args.modes.split(","):
            results[mode] = measure(clients, server, mode, args.events, args.repeats, runner,
                                    failures)
        if args.memory_events and not args.only:
            mem = memory(server, args.memory_events, runner)
    finally:
        runner.close()
        proc.terminate()
        proc.wait(10)

    for mode, rows in results.items():
        print(f"\n{args.events:,} events, {MODES[mode]}; best of {args.repeats} "
              "(client CPU | wall, us per event):\n")
        width = max((len(k) for k in rows), default=10)
        for client in clients:
            if client.name in rows:
                cpu, wall = rows[client.name]
                print(f"  {client.name:<{width}}  {cpu * 1e6:8.2f} | {wall * 1e6:8.2f}")
        print("\n  targets (CPU ratios, this run):")
        print("\n".join(ratios(rows, clients)))
    for name, peak, text in mem:
        print(f"\n  memory: {name}: peak {peak / 1024:.0f} KiB traced while streaming "
              f"{args.memory_events:,} deltas ({text / 1024:.0f} KiB of text): "
              f"{(peak - 2 * text) / args.memory_events:.1f} bytes/delta beyond twice the text")
    if args.plots:
        args.plots.mkdir(parents=True, exist_ok=True)
        for path in plot(results, clients, args.events, args.plots):
            print(f"  wrote {path}")
        report = args.plots / "results.md"
        report.write_text(markdown(results, clients, args.events, args.repeats, mem,
                                   args.memory_events))
        print(f"  wrote {report}")
    if failures:
        print("\nFAILED:\n  " + "\n  ".join(failures))
        return 1
    print(f"\nall {len(clients)} clients read every stream correctly")
    return 0


if __name__ == "__main__":
    sys.exit(main())
