"""Prompts over data: ``dispatch_nb.abatch`` against the openai SDK's ``AsyncOpenAI`` plus an
``asyncio.Semaphore``, on the same rows, from the same paced loopback server, in one run.

Each row is one chat.completions answer of 200 tokens produced at 50 tokens per second — about 4 s
per row, like a real model. As a batch asks (rows are not streamed), the answer is one JSON body
sent when its last token would have been; with ``--stream`` both clients stream the rows instead,
200 text events (plus the role, finish and usage chunks) at 50 events per second. The server is an
asyncio process of its own that advances every active answer on one shared clock, so hundreds of
concurrent answers cost it little. Every client run is a fresh subprocess, so its wall
time, CPU (user + system: the "kernel CPU" a notebook would spend) and peak RSS are its own. Wall
time and CPU are the batch call's: each client first imports what its first call would load (a
notebook kernel running a batch has its library loaded already); that import time is shown apart.

Reported per concurrency (32 and 256): wall time against the ideal (ceil(rows / concurrency) ×
one answer's duration), CPU cores used (CPU seconds / wall seconds), peak memory. Then memory
flatness: 10,000 vs 100,000 rows from a generator (short answers sent at once).

Targets (issue 18; ratios printed, not asserted): within 1.15× the ideal at concurrency 256, under
half a core, memory flat in the number of rows.

    python benchmarks/bench_batch.py            # the full run (~6 minutes)
    python benchmarks/bench_batch.py --stream   # the same with every row streamed
    python benchmarks/bench_batch.py --quick    # 200 rows, 40 events (~1 minute)
    python benchmarks/bench_batch.py --smoke    # 40 rows, 10 events: every client once (~20 s)

Every run checks every answer's text; the exit status is non-zero when a client read a wrong one.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from stream_server import chat_events  # noqa: E402

# -- the paced server ----------------------------------------------------------------------------


async def serve(portfile: str, rate: float) -> None:
    """chat.completions answers of ``x-bench-events`` tokens, one token per tick of a shared
    clock at ``rate`` ticks per second: streamed, one event per tick (the first at once); else one
    JSON body when the stream's last event would have been sent."""
    rendered: dict[int, list[bytes]] = {}
    active: list[list[Any]] = []  # [writer, chunks, next index, done future]
    waiting: list[list[Any]] = []  # [ticks left, done future]: answers not streamed
    ticks = [0]  # ticks so far: GET /stats tells the driver the pace the server really kept

    def chunks_for(n: int) -> list[bytes]:
        if n not in rendered:
            rendered[n] = [b"%x\r\n%s\r\n" % (len(e), e) for e in chat_events(n)] + [b"0\r\n\r\n"]
        return rendered[n]

    async def ticker() -> None:
        loop = asyncio.get_running_loop()
        period = 1.0 / rate
        next_tick = loop.time()
        while True:
            next_tick += period
            await asyncio.sleep(max(0.0, next_tick - loop.time()))
            ticks[0] += 1
            still = []
            for stream in active:
                writer, chunks, index, done = stream
                if writer.is_closing():
                    done.set_result(None)
                    continue
                writer.write(chunks[index])
                index += 1
                if index >= len(chunks) - 1:  # the last event and the terminating chunk together
                    writer.write(chunks[-1])
                    done.set_result(None)
                else:
                    stream[2] = index
                    still.append(stream)
            active[:] = still
            for answer in waiting:
                answer[0] -= 1
                if answer[0] <= 0:
                    answer[1].set_result(None)
            waiting[:] = [answer for answer in waiting if answer[0] > 0]

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                headers = {}
                for line in head.decode("latin-1").split("\r\n")[1:]:
                    if ":" in line:
                        name, value = line.split(":", 1)
                        headers[name.strip().lower()] = value.strip()
                length = int(headers.get("content-length", "0"))
                request = await reader.readexactly(length) if length else b""
                if head.startswith(b"GET /stats"):
                    body = json.dumps({"ticks": ticks[0],
                                       "clock": asyncio.get_running_loop().time()}).encode()
                    writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                                 b"content-length: %d\r\n\r\n%s" % (len(body), body))
                    await writer.drain()
                    continue
                events = int(headers.get("x-bench-events", "200"))
                chunks = chunks_for(events)
                if not json.loads(request or b"{}").get("stream"):  # one JSON body
                    if not headers.get("x-bench-unpaced"):
                        done = asyncio.get_running_loop().create_future()
                        waiting.append([len(chunks) - 2, done])  # the stream's ticks
                        await done
                    body = completion(events)
                    writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                                 b"content-length: %d\r\n\r\n%s" % (len(body), body))
                    await writer.drain()
                    continue
                head = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                        b"transfer-encoding: chunked\r\n\r\n")
                if headers.get("x-bench-unpaced"):  # the whole answer at once
                    writer.write(head + b"".join(chunks))
                    await writer.drain()
                    continue
                writer.write(head + chunks[0])
                done = asyncio.get_running_loop().create_future()
                active.append([writer, chunks, 1, done])
                await done
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0, backlog=1024)
    await asyncio.to_thread(Path(portfile).write_text, str(server.sockets[0].getsockname()[1]))
    clock = asyncio.get_running_loop().create_task(ticker())
    async with server:
        await server.serve_forever()
    clock.cancel()


def completion(events: int) -> bytes:
    """The answer not streamed: one chat.completion with the text the stream would carry."""
    return json.dumps({
        "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "bench",
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": expected_text(events)}}],
        "usage": {"prompt_tokens": 5, "completion_tokens": events, "total_tokens": events + 5},
    }).encode()


# -- the clients (each in its own process) ----------------------------------------------------------


def _rows(n: int) -> Any:
    return (f"row {i}" for i in range(n))  # a generator: never a list in memory


def expected_text(events: int) -> str:
    """What every row's answer must read (the paced server streams the same tokens to all)."""
    return "".join(f"tok{i % 10} " for i in range(abs(events)))


def _headers(events: int) -> dict[str, str]:
    headers = {"x-bench-events": str(abs(events))}
    if events < 0:  # negative: the same number of events, unpaced (the memory runs)
        headers["x-bench-unpaced"] = "1"
    return headers


async def run_dispatch(url: str, rows: int, concurrency: int, events: int,
                       pool: int | None, stream: bool) -> int:
    """Rows answered with the right text."""
    import httpx

    from dispatch_nb import Response, abatch
    from dispatch_nb.providers.openai import OpenAIAdapter

    client = None
    if pool is not None:
        client = httpx.AsyncClient(limits=httpx.Limits(max_connections=pool,
                                                       max_keepalive_connections=pool),
                                   timeout=httpx.Timeout(300, connect=15))
    adapter = OpenAIAdapter("bench", backend="compatible", base_url=url, api_key="bench",
                            async_http_client=client)
    result = await abatch("{row}", _rows(rows), model=adapter, concurrency=concurrency,
                          progress=False, stream=stream, extra_headers=_headers(events))
    if client is not None:
        await client.aclose()
    await adapter.aclose()
    want = expected_text(events)
    return sum(isinstance(r, Response) and r.text == want for r in result)


async def run_openai(url: str, rows: int, concurrency: int, events: int, stream: bool) -> int:
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=url, api_key="bench", max_retries=2)
    semaphore = asyncio.Semaphore(concurrency)

    async def one(prompt: str) -> str:
        async with semaphore:
            if not stream:
                answer = await client.chat.completions.create(
                    model="bench", messages=[{"role": "user", "content": prompt}],
                    extra_headers=_headers(events))
                return answer.choices[0].message.content or ""
            chunks = await client.chat.completions.create(
                model="bench", messages=[{"role": "user", "content": prompt}], stream=True,
                stream_options={"include_usage": True},
                extra_headers=_headers(events))
            parts = []
            async for chunk in chunks:
                if chunk.choices and chunk.choices[0].delta.content:
                    parts.append(chunk.choices[0].delta.content)
            return "".join(parts)

    # The usual hand-written loop: one task per row, gathered (it does not stream the input).
    answers = await asyncio.gather(*(one(p) for p in _rows(rows)), return_exceptions=True)
    await client.close()
    want = expected_text(events)
    return sum(a == want for a in answers)


def load_client(client: str) -> None:
    """Import what the client's first call would: a notebook kernel that runs a batch has its
    library loaded already, so the batch's wall time and CPU are measured without the imports
    (reported apart, as ``import s``)."""
    if client == "openai":
        import openai  # noqa: F401  (httpx, pydantic, anyio)
    else:
        import aiohttp  # noqa: F401  (the default transport, imported by the first client)

        import dispatch_nb.batching.engine
        import dispatch_nb.providers.openai
        import dispatch_nb.transport  # noqa: F401


def client_main(args: argparse.Namespace) -> None:
    began = time.perf_counter()
    load_client(args.client)
    imported = time.perf_counter() - began
    usage0 = resource.getrusage(resource.RUSAGE_SELF)
    started = time.perf_counter()
    if args.client == "openai":
        ok = asyncio.run(run_openai(args.url, args.rows, args.concurrency, args.events,
                                    args.stream))
    else:
        ok = asyncio.run(run_dispatch(args.url, args.rows, args.concurrency, args.events,
                                      args.pool, args.stream))
    wall = time.perf_counter() - started
    usage = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (usage.ru_utime - usage0.ru_utime) + (usage.ru_stime - usage0.ru_stime)
    print(json.dumps({"ok": ok, "wall": wall, "cpu": cpu, "rss_mb": usage.ru_maxrss / 1024,
                      "import": imported}))


# -- the driver --------------------------------------------------------------------------------


def server_stats(url: str) -> tuple[int, float]:
    """(ticks, server clock) from the paced server."""
    import urllib.request

    with urllib.request.urlopen(url.rsplit("/v1", 1)[0] + "/stats", timeout=30) as answer:
        data = json.loads(answer.read())
    return int(data["ticks"]), float(data["clock"])


def measure(url: str, client: str, rows: int, concurrency: int, events: int,
            pool: int | None = None, stream: bool = False) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--client", client, "--url", url, "--rows", str(rows),
           "--concurrency", str(concurrency), "--events", str(events)]
    if stream:
        cmd.append("--stream")
    if pool is not None:
        cmd += ["--pool", str(pool)]
    ticks0, clock0 = server_stats(url)
    out = subprocess.run(cmd, check=True, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(HERE.parent)}).stdout
    ticks1, clock1 = server_stats(url)
    result = dict(json.loads(out.strip().splitlines()[-1]))
    result["server_rate"] = (ticks1 - ticks0) / max(clock1 - clock0, 1e-9)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--serve")
    parser.add_argument("--client")
    parser.add_argument("--url")
    parser.add_argument("--rows", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--events", type=int, default=200)
    parser.add_argument("--rate", type=float, default=50.0)
    parser.add_argument("--pool", type=int)
    parser.add_argument("--stream", action="store_true",
                        help="stream every row (both clients); default: plain answers, as batch()")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--levels", default="32,256",
                        help="the concurrencies to compare (comma-separated)")
    parser.add_argument("--no-memory", action="store_true", help="skip the memory runs")
    parser.add_argument("--smoke", action="store_true",
                        help="every client once with a small N; fail if any answer is wrong")
    args = parser.parse_args()
    if args.serve:
        asyncio.run(serve(args.serve, args.rate))
        return 0
    if args.client:
        client_main(args)
        return 0

    rows, events = (200, 40) if args.quick else (args.rows, args.events)
    concurrencies = tuple(int(c) for c in args.levels.split(","))
    small, large = (2_000, 20_000) if args.quick else (10_000, 100_000)
    if args.smoke:
        rows, events, args.rate, concurrencies, small, large = 40, 10, 100.0, (8, 32), 200, 800
    wrong: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        portfile = Path(tmp) / "port"
        server = subprocess.Popen([sys.executable, __file__, "--serve", str(portfile),
                                   "--rate", str(args.rate)])
        try:
            while not portfile.exists() or not portfile.read_text():
                time.sleep(0.05)
            url = f"http://127.0.0.1:{portfile.read_text()}/v1"
            stream_s = (len(chat_events(events)) - 1) / args.rate
            how = "streamed" if args.stream else "not streamed: one JSON body when done"
            print(f"{rows:,} rows, each a {events}-token answer at {args.rate:g} tokens/s "
                  f"({stream_s:.2f} s a row, {how}); every client in a fresh process\n",
                  flush=True)
            print("× ideal: against the nominal pace; × paced: against the pace the server really "
                  "kept (it shares the machine)\n", flush=True)
            print(f"{'client':<44} {'conc':>5} {'wall s':>8} {'× ideal':>8} {'× paced':>8} "
                  f"{'cores':>6} {'peak MB':>8} {'ok':>6} {'import s':>9}", flush=True)
            for concurrency in concurrencies:
                ideal = math.ceil(rows / concurrency) * stream_s
                runs = [("dispatch_nb abatch", "dispatch"),
                        ("openai SDK AsyncOpenAI + Semaphore + gather", "openai")]
                for label, client in runs:
                    m = measure(url, client, rows, concurrency, events, stream=args.stream)
                    if m["ok"] != rows:
                        wrong.append(f"{label} at concurrency {concurrency}: {m['ok']} of {rows} "
                                     "answers read right")
                    paced = ideal * args.rate / min(args.rate, m["server_rate"])
                    print(f"{label:<44} {concurrency:>5} {m['wall']:>8.2f} "
                          f"{m['wall'] / ideal:>8.3f} {m['wall'] / paced:>8.3f} "
                          f"{m['cpu'] / m['wall']:>6.2f} {m['rss_mb']:>8.1f} {m['ok']:>6} "
                          f"{m['import']:>9.2f}", flush=True)
                print(f"{'ideal':<44} {concurrency:>5} {ideal:>8.2f}", flush=True)
            if not args.no_memory:
                print("\nMemory against the number of rows (rows from a generator, 5-token answers "
                      "sent at once, concurrency 256):", flush=True)
                peaks = {}
                for n in (small, large):
                    m = measure(url, "dispatch", n, 256, -5)
                    peaks[n] = m["rss_mb"]
                    if m["ok"] != n:
                        wrong.append(f"dispatch_nb, {n} rows: {m['ok']} answers read right")
                    print(f"  dispatch_nb {n:>8,} rows: peak {m['rss_mb']:7.1f} MB, {m['wall']:6.1f} s, "
                          f"{m['cpu'] / m['wall']:.2f} cores, ok {m['ok']:,}", flush=True)
                m = measure(url, "openai", small, 256, -5)
                if m["ok"] != small:
                    wrong.append(f"openai SDK, {small} rows: {m['ok']} answers read right")
                print(f"  openai SDK  {small:>8,} rows: peak {m['rss_mb']:7.1f} MB, {m['wall']:6.1f} s, "
                      f"{m['cpu'] / m['wall']:.2f} cores, ok {m['ok']:,} (one task per row, gathered)",
                      flush=True)
                per_row = (peaks[large] - peaks[small]) * 1024 * 1024 / (large - small)
                print(f"  dispatch_nb: {per_row:,.0f} bytes per extra row — the answers the BatchResult "
                      "keeps (a Response each); the engine itself holds only the rows in flight")
        finally:
            server.terminate()
            server.wait(10)
    if wrong:
        print("\nWRONG ANSWERS:\n  " + "\n  ".join(wrong), flush=True)
        return 1
    print("\nevery client read every answer right", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
