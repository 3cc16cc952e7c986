"""``fake``: an adapter for dispatch_nb's own canonical wire protocol, for tests and demos.

The protocol is the canonical types on the wire, so a test server for it is a few lines, and the
adapter exercises the whole shared HTTP machinery (SSE, errors, retries, deadlines, cancellation)::

    POST {base_url}/chat   {"model", "messages": [Message...], "system", "tools": [ToolDefinition...],
                            "max_tokens", "temperature", "stream", "options"}
                            (+ "output": {"name", "description", "schema"} for structured output)
      stream=false → 200  Response JSON
      stream=true  → 200  text/event-stream of {"type": ...} events:
          text {text} | thinking {text} | signature {signature} | block {block}
          tool_start {id, name} | tool_delta {id, fragment} | tool_end {id}
          done {stop_reason, usage, model} | error {status, message, error_type}
      errors       → 4xx/5xx  {"error": {"message", "type"}}
    GET  {base_url}/models → {"data": [ModelInfo...]}

``connect("fake:echo", base_url=...)``; ``base_url`` defaults to ``DISPATCH_NB_FAKE_URL``.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

import httpx

from ..adapter import ChatRequest
from ..errors import APIConnectionError, RequestError, error_for_status
from ..http_adapter import HTTPAdapter, WireRequest
from ..sse import ServerSentEvent
from ..stream import Accumulator
from ..structured import output_tool_choice, requested_mode, unsupported_mode
from ..types import ModelInfo, Response, StreamDelta, ToolDefinition, Usage

__all__ = ["FakeAdapter"]


class _Parser:
    __slots__ = ("acc", "complete")

    def __init__(self, acc: Accumulator) -> None:
        self.acc = acc
        self.complete = False

    def feed(self, event: ServerSentEvent) -> Iterable[StreamDelta]:
        data = event.json()
        kind = data.get("type")
        acc = self.acc
        if kind == "text":
            return (acc.text(data["text"]),)
        if kind == "thinking":
            return (acc.thinking(data["text"]),)
        if kind == "signature":
            acc.signature(data["signature"])
            return ()
        if kind == "tool_start":
            return (acc.tool_start(data["id"], data["id"], data["name"]),)
        if kind == "tool_delta":
            return (acc.tool_delta(data["id"], data["fragment"]),)
        if kind == "tool_end":
            return (acc.tool_end(data["id"]),)
        if kind == "block":
            acc.add_block(Response.model_validate({"content": [data["block"]]}).content[0])
            return ()
        if kind == "done":
            acc.stop_reason = data.get("stop_reason")
            acc.usage = Usage.model_validate(data.get("usage") or {})
            if data.get("model"):
                acc.model = data["model"]
            self.complete = True
            return ()
        if kind == "error":
            raise error_for_status(
                int(data.get("status") or 500),
                str(data.get("message") or "error in stream"),
                provider="fake",
                error_type=data.get("error_type"),
            )
        return ()  # unknown event types are ignored, as every provider may add some

    def end(self) -> Iterable[StreamDelta]:
        if not self.complete:
            raise APIConnectionError(
                "the stream ended before the answer was complete", provider="fake"
            )
        return ()


class FakeAdapter(HTTPAdapter):
    """Talks to a server speaking the canonical protocol (see the module docstring)."""

    provider_options = frozenset({"echo"})

    def __init__(
        self,
        model: str = "echo",
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        max_tokens: int | None = 1024,
        http_client: httpx.Client | None = None,
        async_http_client: httpx.AsyncClient | None = None,
        timeout: float | None = None,
        max_retries: int = 2,
    ) -> None:
        url = base_url or os.environ.get("DISPATCH_NB_FAKE_URL")
        if not url:
            raise RequestError(
                "the fake provider needs base_url= (or DISPATCH_NB_FAKE_URL) pointing at a server "
                "that speaks dispatch_nb's canonical protocol",
                provider="fake",
            )
        super().__init__(
            base_url=url,
            http_client=http_client,
            async_http_client=async_http_client,
            max_tokens=max_tokens,
            timeout=timeout,
            max_retries=max_retries,
        )
        self._model = model
        self._api_key = api_key

    @property
    def model_name(self) -> str:
        return self._model

    @property
    def provider_name(self) -> str:
        return "fake"

    @property
    def display_name(self) -> str:
        return "Fake (canonical protocol)"

    def auth_headers(self) -> dict[str, str]:
        return {"authorization": f"Bearer {self._api_key}"} if self._api_key else {}

    def output_mode(self, request: ChatRequest) -> str | None:
        """Structured output: ``canonical`` (the body's ``output``: name, description, schema),
        ``tool`` or ``prompt``."""
        if request.output is None:
            return None
        mode = requested_mode(self, request)
        if mode in ("auto", "native"):
            return "canonical"
        if mode in ("tool", "prompt"):
            return mode
        raise unsupported_mode(self, mode, ("auto", "native", "tool", "prompt"))

    def build_request(self, request: ChatRequest) -> WireRequest:
        options = {
            k: v
            for k, v in request.options.items()
            if k not in ("extra_body", "extra_headers", "max_retries")
        }
        mode = self.output_mode(request)
        tools = list(request.tools)
        if request.output is not None and mode == "tool":
            options["tool_choice"] = output_tool_choice(request)
            tools.append(request.output.tool_definition())
        body: dict[str, Any] = {
            "model": self._model,
            "messages": [m.model_dump(mode="json", exclude_none=True) for m in request.messages],
            "system": request.system,
            "tools": [
                t.model_dump(mode="json") if isinstance(t, ToolDefinition) else t for t in tools
            ],
            "max_tokens": request.max_tokens,
            "temperature": request.temperature,
            "stream": request.stream,
            "options": options,
        }
        if request.output is not None and mode == "canonical":
            output = request.output
            body["output"] = {"name": output.name, "description": output.description,
                              "schema": output.schema}
        return WireRequest("POST", "chat", json=body)

    def stream_parser(self, request: ChatRequest, acc: Accumulator) -> _Parser:
        return _Parser(acc)

    def parse_body(self, request: ChatRequest, body: Any, acc: Accumulator) -> None:
        response = Response.model_validate(body)
        for block in response.content:
            if block.type == "text":
                acc.text(block.text)
            elif block.type == "tool_use":
                acc.tool_start(block.id, block.id, block.name)
                acc.tool_end(block.id, arguments=block.arguments)
            else:
                acc.add_block(block)
        acc.stop_reason = response.stop_reason
        acc.usage = response.usage
        if response.model:
            acc.model = response.model

    def list_models(self) -> list[ModelInfo]:
        data = self.get_json("models")
        return [ModelInfo.model_validate(m) for m in data.get("data", [])]
