"""A loopback SSE server for the streaming benchmarks, run in its own process.

``python benchmarks/stream_server.py PORTFILE`` serves, on 127.0.0.1, pre-rendered streams with one
HTTP chunk per event (the worst case for a client, and what real APIs do):

* ``POST /v1/chat/completions`` — an OpenAI chat.completions stream of N text chunks
* ``POST /v1/responses`` — an OpenAI Responses stream of N text deltas
* ``POST /v1/messages`` — an Anthropic Messages stream of N text deltas

N comes from the ``x-bench-events`` request header. Running the server in another process keeps its
work off the client's GIL, so the numbers measure the client.
"""

from __future__ import annotations

import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


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


CACHE: dict[tuple[str, int], list[bytes]] = {}
RENDER = {"/v1/chat/completions": chat_events, "/v1/responses": responses_events,
          "/v1/messages": anthropic_events}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: object) -> None:
        pass

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length") or 0))
        n = int(self.headers.get("x-bench-events") or 1000)
        render = RENDER.get(self.path)
        if render is None:
            self.send_error(404)
            return
        key = (self.path, n)
        if key not in CACHE:
            CACHE[key] = [b"%x\r\n%s\r\n" % (len(e), e) for e in render(n)]
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()
        for chunk in CACHE[key]:
            self.wfile.write(chunk)
            self.wfile.flush()  # one TCP write (one HTTP chunk) per event
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()


def main() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    with open(sys.argv[1], "w") as f:
        f.write(str(server.server_address[1]))
    server.serve_forever()


if __name__ == "__main__":
    main()
