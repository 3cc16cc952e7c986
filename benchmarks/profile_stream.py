"""Profile the whole streaming path (pyinstrument): where a streamed event's CPU time goes.

Streams one long chat.completions answer (one write per event) through dispatch_nb's sync and
async API on the default transport, under pyinstrument, and writes the call trees as text:

    python benchmarks/profile_stream.py [--events 40000] [--out docs/benchmarks]

Also prints a breakdown measured without a profiler, layer by layer, on the same stream: aiohttp
reading the bytes, + SSE decoding, + JSON parsing, and the whole adapter (sync and async).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from bench_streaming import start_server  # noqa: E402
from stream_server import expected_text  # noqa: E402


def best_cpu(fn: Callable[[], Any], n: int, repeats: int = 5) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        c0 = time.process_time()
        fn()
        best = min(best, time.process_time() - c0)
    return best / n * 1e6


def layers(base: str, n: int) -> list[tuple[str, float]]:
    import httpx
    import orjson

    from dispatch_nb import connect
    from dispatch_nb.sse import SSEDecoder
    from dispatch_nb.transport import async_client

    loop = asyncio.new_event_loop()
    client = async_client(httpx.Timeout(60))
    url = f"{base}/v1/chat/completions"

    async def read(level: int) -> None:
        decoder = SSEDecoder()
        async with client.stream("POST", url, content=b"{}") as r:
            async for chunk in r.aiter_raw():
                if level:
                    for event in decoder.feed(chunk):
                        if level > 1 and event.raw != b"[DONE]":
                            orjson.loads(event.raw)

    adapter = connect("compatible:bench", base_url=f"{base}/v1")

    def sync_adapter() -> None:
        with adapter.stream("hi") as stream:
            for _ in stream:
                pass

    async def async_adapter() -> None:
        async with adapter.astream("hi") as stream:
            async for _ in stream:
                pass

    def on_loop(make: Callable[[], Any]) -> Callable[[], Any]:
        return lambda: loop.run_until_complete(make())

    out = [
        ("aiohttp transport, bytes only (async)", best_cpu(on_loop(lambda: read(0)), n)),
        ("  + SSE decoding", best_cpu(on_loop(lambda: read(1)), n)),
        ("  + orjson.loads of every event", best_cpu(on_loop(lambda: read(2)), n)),
        ("dispatch_nb compatible, async (the whole path)", best_cpu(on_loop(async_adapter), n)),
        ("dispatch_nb compatible, sync (the whole path)", best_cpu(sync_adapter, n)),
    ]
    loop.run_until_complete(client.aclose())
    loop.run_until_complete(loop.shutdown_asyncgens())  # closes the adapter's pool for this loop
    loop.close()
    adapter.close()
    return out


def profile(base: str, n: int, out: Path) -> list[Path]:
    from pyinstrument import Profiler

    from dispatch_nb import connect

    adapter = connect("compatible:bench", base_url=f"{base}/v1")
    written = []

    def sync() -> str:
        with adapter.stream("hi") as stream:
            return "".join(d.text or "" for d in stream)

    async def asynchronous() -> str:
        async with adapter.astream("hi") as stream:
            return "".join([d.text or "" async for d in stream])

    for name, call in [("sync", sync), ("async", lambda: asyncio.run(asynchronous()))]:
        assert call() == expected_text(n)  # warm: imports, pools
        profiler = Profiler(interval=0.0005, async_mode="disabled")
        profiler.start()
        text = call()
        profiler.stop()
        assert text == expected_text(n)
        path = out / f"profile-{name}.txt"
        path.write_text(profiler.output_text(unicode=True, color=False, show_all=False))
        written.append(path)
    adapter.close()
    return written


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=40_000)
    ap.add_argument("--out", type=Path, default=HERE.parent / "docs" / "benchmarks")
    args = ap.parse_args()
    proc, server = start_server(own_core=True)
    base = f"{server}/event/{args.events}"
    try:
        print(f"CPU us per event, {args.events:,} events, one write per event (best of 5):")
        for name, us in layers(base, args.events):
            print(f"  {name:<50s} {us:6.2f}")
        args.out.mkdir(parents=True, exist_ok=True)
        for path in profile(base, args.events, args.out):
            print(f"  wrote {path}")
    finally:
        proc.terminate()
        proc.wait(10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
