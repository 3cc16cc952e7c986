"""Every client the streaming benchmark runs, each reading a stream and returning its text.

A :class:`Client` reads one stream from the benchmark server (``stream_server.py``) whose base URL
it is given, and returns the text it assembled, so the benchmark can check that every client read
the whole answer. Sync clients are plain functions; async ones are coroutines (the benchmark runs
them on one event loop). A peer that is not installed is reported as missing, with the package to
install (``pip install 'dispatch-nb[bench]'`` installs them all).
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PROMPT = [{"role": "user", "content": "hi"}]
#: async SDK clients made on the benchmark's event loop, closed by it at the end
ASYNC_CLIENTS: list[Any] = []


@dataclass
class Client:
    """One way of consuming a stream. ``api``: the wire format it reads (chat, responses,
    anthropic); ``family`` groups the rows in the plots."""

    name: str
    family: str
    api: str
    is_async: bool
    make: Callable[[str], Callable[[], Any]]  # base URL → a function returning text (or a coroutine)
    requires: str = ""  # the package that must be installed
    _run: Callable[[], Any] | None = field(default=None, repr=False)

    def runner(self, base: str) -> Callable[[], Any]:
        return self.make(base)


def _installed(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


# -- the naive loops -----------------------------------------------------------------------------
def naive_sync(base: str) -> Callable[[], str]:
    import httpx

    client = httpx.Client(timeout=60)

    def run() -> str:
        parts: list[str] = []
        with client.stream("POST", f"{base}/v1/chat/completions",
                           json={"model": "bench", "stream": True}) as r:
            for line in r.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    for choice in json.loads(line[6:])["choices"]:
                        if choice["delta"].get("content"):
                            parts.append(choice["delta"]["content"])
        return "".join(parts)

    return run


def naive_async(base: str) -> Callable[[], Awaitable[str]]:
    import httpx

    clients: dict[Any, httpx.AsyncClient] = {}

    async def run() -> str:
        import asyncio

        loop = asyncio.get_running_loop()
        client = clients.get(loop)
        if client is None:
            client = clients[loop] = httpx.AsyncClient(timeout=60)
            ASYNC_CLIENTS.append(client)
        parts: list[str] = []
        async with client.stream("POST", f"{base}/v1/chat/completions",
                                 json={"model": "bench", "stream": True}) as r:
            async for line in r.aiter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    for choice in json.loads(line[6:])["choices"]:
                        if choice["delta"].get("content"):
                            parts.append(choice["delta"]["content"])
        return "".join(parts)

    return run


# -- dispatch_nb ---------------------------------------------------------------------------------
def _adapter(spec: str, base: str, transport: str) -> Any:
    import httpx

    from dispatch_nb import connect
    from dispatch_nb.transport import async_client

    options: dict[str, Any] = {}
    if transport != "aiohttp":  # the default; otherwise hand the adapter clients of that transport
        previous = os.environ.get("DISPATCH_NB_TRANSPORT")
        os.environ["DISPATCH_NB_TRANSPORT"] = transport
        try:
            timeout = httpx.Timeout(300, connect=15)
            options = {"async_http_client": async_client(timeout)}
        finally:
            if previous is None:
                del os.environ["DISPATCH_NB_TRANSPORT"]
            else:
                os.environ["DISPATCH_NB_TRANSPORT"] = previous
    if spec.startswith("anthropic"):
        return connect(spec, base_url=base, api_key="bench", **options)
    if spec.startswith("openai"):
        return connect(spec, base_url=f"{base}/v1", api_key="bench", **options)
    return connect(spec, base_url=f"{base}/v1", **options)


def ours_sync(spec: str, transport: str = "aiohttp") -> Callable[[str], Callable[[], str]]:
    def make(base: str) -> Callable[[], str]:
        adapter = _adapter(spec, base, transport)

        def run() -> str:
            with adapter.stream("hi") as stream:
                return "".join([d.text for d in stream if d.type == "text_delta" and d.text])

        return run

    return make


def ours_async(spec: str, transport: str = "aiohttp") -> Callable[[str], Callable[[], Awaitable[str]]]:
    def make(base: str) -> Callable[[], Awaitable[str]]:
        adapter = _adapter(spec, base, transport)

        async def run() -> str:
            async with adapter.astream("hi") as stream:
                return "".join([d.text async for d in stream if d.type == "text_delta" and d.text])

        return run

    return make


# -- the openai SDK ------------------------------------------------------------------------------
def openai_sync(api: str) -> Callable[[str], Callable[[], str]]:
    def make(base: str) -> Callable[[], str]:
        import openai

        sdk = openai.OpenAI(base_url=f"{base}/v1", api_key="bench")

        def run() -> str:
            if api == "chat":
                stream = sdk.chat.completions.create(model="bench", messages=PROMPT, stream=True)
                return "".join([c.delta.content for chunk in stream for c in chunk.choices
                                if c.delta.content])
            events = sdk.responses.create(model="bench", input="hi", stream=True)
            return "".join([e.delta for e in events if e.type == "response.output_text.delta"])

        return run

    return make


def openai_async(api: str, aiohttp: bool) -> Callable[[str], Callable[[], Awaitable[str]]]:
    def make(base: str) -> Callable[[], Awaitable[str]]:
        import openai

        clients: dict[Any, Any] = {}

        async def run() -> str:
            import asyncio

            loop = asyncio.get_running_loop()
            sdk = clients.get(loop)
            if sdk is None:
                extra = {"http_client": openai.DefaultAioHttpClient()} if aiohttp else {}
                sdk = clients[loop] = openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="bench",
                                                         **extra)
                ASYNC_CLIENTS.append(sdk)
            parts: list[str] = []
            if api == "chat":
                stream = await sdk.chat.completions.create(model="bench", messages=PROMPT,
                                                           stream=True)
                async for chunk in stream:
                    parts.extend(c.delta.content for c in chunk.choices if c.delta.content)
            else:
                events = await sdk.responses.create(model="bench", input="hi", stream=True)
                async for e in events:
                    if e.type == "response.output_text.delta":
                        parts.append(e.delta)
            return "".join(parts)

        return run

    return make


# -- the anthropic SDK ---------------------------------------------------------------------------
def anthropic_sync(base: str) -> Callable[[], str]:
    import anthropic

    sdk = anthropic.Anthropic(base_url=base, api_key="bench")

    def run() -> str:
        with sdk.messages.stream(model="bench", max_tokens=10, messages=PROMPT) as s:
            return "".join(s.text_stream)

    return run


def anthropic_async(aiohttp: bool) -> Callable[[str], Callable[[], Awaitable[str]]]:
    def make(base: str) -> Callable[[], Awaitable[str]]:
        import anthropic

        clients: dict[Any, Any] = {}

        async def run() -> str:
            import asyncio

            loop = asyncio.get_running_loop()
            sdk = clients.get(loop)
            if sdk is None:
                extra = {"http_client": anthropic.DefaultAioHttpClient()} if aiohttp else {}
                sdk = clients[loop] = anthropic.AsyncAnthropic(base_url=base, api_key="bench",
                                                               **extra)
                ASYNC_CLIENTS.append(sdk)
            async with sdk.messages.stream(model="bench", max_tokens=10, messages=PROMPT) as s:
                return "".join([t async for t in s.text_stream])

        return run

    return make


# -- litellm -------------------------------------------------------------------------------------
def _litellm() -> Any:
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no download at import
    os.environ.setdefault("LITELLM_TELEMETRY", "False")
    import litellm

    litellm.telemetry = False
    litellm.suppress_debug_info = True
    return litellm


def litellm_sync(base: str) -> Callable[[], str]:
    litellm = _litellm()

    def run() -> str:
        stream = litellm.completion(model="openai/bench", api_base=f"{base}/v1", api_key="bench",
                                    messages=PROMPT, stream=True)
        return "".join([c.choices[0].delta.content for c in stream
                        if c.choices and c.choices[0].delta.content])

    return run


def litellm_async(base: str) -> Callable[[], Awaitable[str]]:
    litellm = _litellm()

    async def run() -> str:
        stream = await litellm.acompletion(model="openai/bench", api_base=f"{base}/v1",
                                           api_key="bench", messages=PROMPT, stream=True)
        parts: list[str] = []
        async for c in stream:
            if c.choices and c.choices[0].delta.content:
                parts.append(c.choices[0].delta.content)
        return "".join(parts)

    return run


# -- simonw/llm ----------------------------------------------------------------------------------
#: llm's folders (LLM_USER_PATH), removed when this process exits: the models read them meanwhile
_LLM_HOMES: list[tempfile.TemporaryDirectory[str]] = []


def _llm_model(base: str, is_async: bool) -> Any:
    # llm finds OpenAI-compatible models in extra-openai-models.yaml under LLM_USER_PATH.
    _LLM_HOMES.append(tempfile.TemporaryDirectory(prefix="bench-llm-"))
    home = Path(_LLM_HOMES[-1].name)
    (home / "extra-openai-models.yaml").write_text(
        f"- model_id: bench\n  model_name: bench\n  api_base: \"{base}/v1\"\n"
    )
    os.environ["LLM_USER_PATH"] = str(home)
    import llm

    return llm.get_async_model("bench") if is_async else llm.get_model("bench")


def llm_sync(base: str) -> Callable[[], str]:
    model = _llm_model(base, False)

    def run() -> str:
        return "".join(model.prompt("hi", stream=True, key="bench"))

    return run


def llm_async(base: str) -> Callable[[], Awaitable[str]]:
    model = _llm_model(base, True)

    async def run() -> str:
        return "".join([chunk async for chunk in model.prompt("hi", stream=True, key="bench")])

    return run


def all_clients() -> list[Client]:
    """Every client, in the order the report lists them."""
    return [
        Client("naive httpx loop", "naive", "chat", False, naive_sync, "httpx"),
        Client("naive httpx loop (async)", "naive", "chat", True, naive_async, "httpx"),
        Client("dispatch_nb compatible", "dispatch_nb", "chat", False, ours_sync("compatible:bench")),
        Client("dispatch_nb compatible (async)", "dispatch_nb", "chat", True,
               ours_async("compatible:bench")),
        Client("dispatch_nb openai Responses", "dispatch_nb", "responses", False,
               ours_sync("openai:bench")),
        Client("dispatch_nb openai Responses (async)", "dispatch_nb", "responses", True,
               ours_async("openai:bench")),
        Client("dispatch_nb anthropic", "dispatch_nb", "anthropic", False,
               ours_sync("anthropic:bench")),
        Client("dispatch_nb anthropic (async)", "dispatch_nb", "anthropic", True,
               ours_async("anthropic:bench")),
        Client("dispatch_nb compatible, httpx transport", "dispatch_nb (httpx)", "chat", False,
               ours_sync("compatible:bench", "httpx")),
        Client("dispatch_nb compatible, httpx transport (async)", "dispatch_nb (httpx)", "chat", True,
               ours_async("compatible:bench", "httpx")),
        Client("openai SDK chat", "openai SDK", "chat", False, openai_sync("chat"), "openai"),
        Client("openai SDK chat (async)", "openai SDK", "chat", True,
               openai_async("chat", aiohttp=False), "openai"),
        Client("openai SDK chat (async, aiohttp)", "openai SDK", "chat", True,
               openai_async("chat", aiohttp=True), "openai"),
        Client("openai SDK responses", "openai SDK", "responses", False, openai_sync("responses"),
               "openai"),
        Client("openai SDK responses (async)", "openai SDK", "responses", True,
               openai_async("responses", aiohttp=False), "openai"),
        Client("openai SDK responses (async, aiohttp)", "openai SDK", "responses", True,
               openai_async("responses", aiohttp=True), "openai"),
        Client("anthropic SDK", "anthropic SDK", "anthropic", False, anthropic_sync, "anthropic"),
        Client("anthropic SDK (async)", "anthropic SDK", "anthropic", True,
               anthropic_async(aiohttp=False), "anthropic"),
        Client("anthropic SDK (async, aiohttp)", "anthropic SDK", "anthropic", True,
               anthropic_async(aiohttp=True), "anthropic"),
        Client("litellm", "litellm", "chat", False, litellm_sync, "litellm"),
        Client("litellm (async)", "litellm", "chat", True, litellm_async, "litellm"),
        Client("llm (simonw)", "llm", "chat", False, llm_sync, "llm"),
        Client("llm (simonw) (async)", "llm", "chat", True, llm_async, "llm"),
    ]


def available(client: Client) -> bool:
    """Whether the client's package is installed."""
    return not client.requires or _installed(client.requires)
