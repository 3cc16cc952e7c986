"""A loopback SSE server for the streaming benchmarks, run in its own process.

``python benchmarks/stream_server.py PORTFILE`` serves, on 127.0.0.1, pre-rendered streams of N text
deltas in each provider's wire format:

* ``POST .../v1/chat/completions`` — an OpenAI chat.completions stream
* ``POST .../v1/responses`` — an OpenAI Responses stream
* ``POST .../v1/messages`` — an Anthropic Messages stream

How, and how many, comes from a path prefix, so every client (SDKs included) can be pointed at it
with a base URL alone: ``http://127.0.0.1:PORT/<mode>/<N>/v1/chat/completions``, where mode is

* ``event`` — one TCP write (one HTTP chunk) per event: what real APIs do, the worst case for a
  client;
* ``bulk`` — the whole body in one write (``content-length``): the client's own cost alone;
* ``paced<R>`` — one chunk per event, R events per second (a model streaming in real time).

Without a prefix, N comes from the ``x-bench-events`` header (default 1000) and the mode is
``event``. The delta texts are ``tok0 ``, ``tok1 ``, ... ``tok9 ``, ``tok0 ``...: see
:func:`expected_text`. Running the server in another process keeps its work off the client's GIL,
so the numbers measure the client.
"""

from __future__ import annotations

import json
import re
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def expected_text(n: int) -> str:
    """The answer every stream of n deltas spells."""
    return "".join(f"tok{i % 10} " for i in range(n))


def chat_events(n: int) -> list[bytes]:
    head = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "bench"}
    out = [
        json.dumps({**head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                         "finish_reason": None}]})
    ]
    for i in range(n):
        out.append(json.dumps({**head, "choices": [{"index": 0, "delta": {"content": f"tok{i % 10} "},
                                                    "finish_reason": None}]}))
    out.append(json.dumps({**head, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}))
    out.append(json.dumps({**head, "choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": n,
                                                            "total_tokens": n + 5}}))
    return [f"data: {e}\n\n".encode() for e in out] + [b"data: [DONE]\n\n"]


def responses_events(n: int) -> list[bytes]:
    def ev(data: dict) -> bytes:
        return f"event: {data['type']}\ndata: {json.dumps(data)}\n\n".encode()

    resp = {"id": "resp_1", "object": "response", "created_at": 1, "model": "bench", "status": "in_progress",
            "output": []}
    out = [ev({"type": "response.created", "sequence_number": 0, "response": resp}),
           ev({"type": "response.output_item.added", "sequence_number": 1, "output_index": 0,
               "item": {"type": "message", "id": "msg_1", "role": "assistant", "status": "in_progress",
                        "content": []}})]
    for i in range(n):
        out.append(ev({"type": "response.output_text.delta", "sequence_number": i + 2, "item_id": "msg_1",
                       "output_index": 0, "content_index": 0, "delta": f"tok{i % 10} ", "logprobs": []}))
    text = "".join(f"tok{i % 10} " for i in range(n))
    item = {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
            "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]}
    out.append(ev({"type": "response.output_item.done", "sequence_number": n + 2, "output_index": 0,
                   "item": item}))
    done = {**resp, "status": "completed", "output": [item],
            "usage": {"input_tokens": 5, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": n,
                      "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": n + 5}}
    out.append(ev({"type": "response.completed", "sequence_number": n + 3, "response": done}))
    return out


def anthropic_events(n: int) -> list[bytes]:
    def ev(data: dict) -> bytes:
        return f"event: {data['type']}\ndata: {json.dumps(data)}\n\n".encode()

    out = [ev({"type": "message_start", "message": {
        "id": "msg_1", "type": "message", "role": "assistant", "content": [], "model": "bench",
        "stop_reason": None, "stop_sequence": None,
        "usage": {"input_tokens": 5, "output_tokens": 1, "cache_creation_input_tokens": 0,
                  "cache_read_input_tokens": 0}}}),
        ev({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}})]
    for i in range(n):
        out.append(ev({"type": "content_block_delta", "index": 0,
                       "delta": {"type": "text_delta", "text": f"tok{i % 10} "}}))
    out += [ev({"type": "content_block_stop", "index": 0}),
            ev({"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                "usage": {"output_tokens": n}}),
            ev({"type": "message_stop"})]
    return out


CACHE: dict[tuple[str, int], tuple[bytes, list[bytes]]] = {}  # (whole body, HTTP chunks)
RENDER = {"/v1/chat/completions": chat_events, "/v1/responses": responses_events,
          "/v1/messages": anthropic_events}
PREFIX = re.compile(r"^/(event|bulk|paced\d+)/(\d+)(/.*)$")


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: object) -> None:
        pass

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length") or 0))
        path, mode, n = self.path.split("?")[0], "event", int(self.headers.get("x-bench-events") or 1000)
        match = PREFIX.match(path)
        if match:
            mode, n, path = match.group(1), int(match.group(2)), match.group(3)
        render = RENDER.get(path)
        if render is None:
            self.send_error(404)
            return
        key = (path, n)
        if key not in CACHE:
            events = render(n)
            CACHE[key] = (b"".join(events), [b"%x\r\n%s\r\n" % (len(e), e) for e in events])
        body, chunks = CACHE[key]
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        if mode == "bulk":
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            self.wfile.flush()
            return
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()
        self.wfile.flush()
        pause = 1 / int(mode[5:]) if mode.startswith("paced") else 0.0
        write, flush = self.wfile.write, self.wfile.flush
        for chunk in chunks:
            if pause:
                time.sleep(pause)
            write(chunk)
            flush()  # one TCP write (one HTTP chunk) per event
        write(b"0\r\n\r\n")
        flush()


class Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: object, client_address: object) -> None:
        pass  # a client that hangs up early (a closed kernel, a cancelled stream) is no error


def main() -> None:
    server = Server(("127.0.0.1", 0), Handler)
    with open(sys.argv[1], "w") as f:
        f.write(str(server.server_address[1]))
    server.serve_forever()


if __name__ == "__main__":
    main()
