"""Per-event cost of consuming a streamed answer: dispatch_nb vs the naive loop vs the vendor SDKs.

All clients read the same stream from one loopback server running in another process (one HTTP
chunk per SSE event). Prints microseconds per event (best of several runs) and ratios.

    python benchmarks/bench_streaming.py [--events 5000] [--repeats 5]

Target (DESIGN.md): dispatch_nb at least 10x faster than the openai SDK on the same stream, which
means beating the naive ``iter_lines`` + ``json.loads`` loop; memory flat in the number of deltas.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent


def start_server() -> tuple[subprocess.Popen[bytes], str]:
    portfile = Path(tempfile.mkdtemp()) / "port"
    proc = subprocess.Popen([sys.executable, str(HERE / "stream_server.py"), str(portfile)])
    for _ in range(200):
        if portfile.exists() and portfile.read_text().strip():
            break
        time.sleep(0.05)
    port = portfile.read_text().strip()
    portfile.unlink()
    return proc, f"http://127.0.0.1:{port}"


def best_of(fn: Callable[[], int], repeats: int, events: int) -> float:
    fn()  # warm-up: connections, imports, caches
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        got = fn()
        elapsed = time.perf_counter() - t0
        assert got >= events, f"consumed {got} events, expected {events}"
        best = min(best, elapsed)
    return best / events * 1e6


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=5000)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    n, headers = args.events, {"x-bench-events": str(args.events)}
    proc, base = start_server()
    results: dict[str, float] = {}
    try:
        client = httpx.Client(timeout=60)

        def naive() -> int:
            count = 0
            with client.stream("POST", f"{base}/v1/chat/completions", headers=headers,
                               json={"model": "bench", "stream": True}) as r:
                for line in r.iter_lines():
                    if line.startswith("data: ") and line != "data: [DONE]":
                        chunk = json.loads(line[6:])
                        for choice in chunk["choices"]:
                            if choice["delta"].get("content"):
                                count += 1
            return count

        results["naive httpx iter_lines + json.loads"] = best_of(naive, args.repeats, n)

        from dispatch_nb import connect

        compat = connect("compatible:bench", base_url=f"{base}/v1", headers=headers)

        def ours_chat() -> int:
            with compat.stream("hi") as s:
                return sum(1 for d in s if d.type == "text_delta")

        results["dispatch_nb compatible (chat.completions)"] = best_of(ours_chat, args.repeats, n)

        official = connect("openai:bench", base_url=f"{base}/v1", api_key="bench", headers=headers)

        def ours_responses() -> int:
            with official.stream("hi") as s:
                return sum(1 for d in s if d.type == "text_delta")

        results["dispatch_nb openai (Responses)"] = best_of(ours_responses, args.repeats, n)

        anth = connect("anthropic:bench", base_url=base, api_key="bench", headers=headers)

        def ours_anthropic() -> int:
            with anth.stream("hi") as s:
                return sum(1 for d in s if d.type == "text_delta")

        results["dispatch_nb anthropic"] = best_of(ours_anthropic, args.repeats, n)

        try:
            import openai
        except ImportError:
            print("(openai SDK not installed: pip install openai)")
        else:
            sdk = openai.OpenAI(base_url=f"{base}/v1", api_key="bench", default_headers=headers)

            def sdk_chat() -> int:
                stream = sdk.chat.completions.create(
                    model="bench", messages=[{"role": "user", "content": "hi"}], stream=True)
                return sum(1 for c in stream for ch in c.choices if ch.delta.content)

            def sdk_responses() -> int:
                stream = sdk.responses.create(model="bench", input="hi", stream=True)
                return sum(1 for e in stream if e.type == "response.output_text.delta")

            results["openai SDK chat.completions"] = best_of(sdk_chat, args.repeats, n)
            results["openai SDK responses"] = best_of(sdk_responses, args.repeats, n)
        try:
            import anthropic
        except ImportError:
            print("(anthropic SDK not installed: pip install anthropic)")
        else:
            asdk = anthropic.Anthropic(base_url=base, api_key="bench", default_headers=headers)

            def sdk_anthropic() -> int:
                with asdk.messages.stream(model="bench", max_tokens=10,
                                          messages=[{"role": "user", "content": "hi"}]) as s:
                    return sum(1 for _ in s.text_stream)

            results["anthropic SDK messages.stream"] = best_of(sdk_anthropic, args.repeats, n)

        # memory: bytes retained per delta beyond the text itself
        big = n * 10
        big_headers = {"x-bench-events": str(big)}
        tracemalloc.start()
        with compat.stream("hi", extra_headers=big_headers) as s:
            for _ in s:
                pass
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        text_bytes = len(s.response.text)
    finally:
        proc.terminate()
        proc.wait(10)

    width = max(len(k) for k in results)
    print(f"\nStreaming {n} events, one HTTP chunk each; best of {args.repeats} (us per event):\n")
    for name, us in results.items():
        print(f"  {name:<{width}}  {us:8.2f} us")
    naive_us = results["naive httpx iter_lines + json.loads"]
    print()
    for ours, sdk in [("dispatch_nb compatible (chat.completions)", "openai SDK chat.completions"),
                      ("dispatch_nb openai (Responses)", "openai SDK responses"),
                      ("dispatch_nb anthropic", "anthropic SDK messages.stream")]:
        if sdk in results:
            print(f"  {ours}: {results[sdk] / results[ours]:.1f}x faster than {sdk}")
        print(f"  {ours}: {naive_us / results[ours]:.2f}x the speed of the naive loop")
    print(f"\n  memory: peak {peak / 1024:.0f} KiB while streaming {big} deltas "
          f"({text_bytes} bytes of text): {(peak - text_bytes) / big:.1f} bytes/delta beyond the text")
    return 0


if __name__ == "__main__":
    sys.exit(main())
