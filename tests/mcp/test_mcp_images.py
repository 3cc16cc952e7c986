"""An MCP tool's image reaches the model as an image in the tool result where the provider's API
takes one (Anthropic's ``tool_result`` content, OpenAI Responses' ``function_call_output``
``input_image``), and as text saying it could not be sent where it does not (chat.completions).
The image comes from the reference ``server-everything`` (``get-tiny-image``); each provider is
its loopback fake, and the tests check what the fake received."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dispatch_nb import ImageBlock, ToolResultBlock, ToolResultEvent
from dispatch_nb.mcp import MCPServer
from dispatch_nb.providers.anthropic import AnthropicAdapter
from dispatch_nb.providers.fake import CanonicalAdapter
from dispatch_nb.providers.openai import OpenAIAdapter
from dispatch_nb.session import Session

from ..fakes.anthropic import AnthropicFake
from ..fakes.canonical import CanonicalFake
from ..fakes.openai_chat import OpenAIChatFake
from ..fakes.openai_responses import OpenAIResponsesFake
from ..fakes.provider import ToolCall, Turn
from .conftest import EVERYTHING, npm_server

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def everything() -> Iterator[MCPServer]:
    server = npm_server(EVERYTHING, "stdio", name="everything")
    yield server
    server.close()


def ask_for_the_image(adapter: Any, fake: Any, server: MCPServer) -> None:
    fake.push(Turn(tool_calls=[ToolCall("call_img", "get-tiny-image", {})]), Turn(text="A logo."))
    with Session(adapter, tools=[server], approve="auto") as session:
        assert session.send("Show me the image.", timeout=120).text == "A logo."


def test_anthropic_gets_the_image_in_the_tool_result(everything: MCPServer) -> None:
    with AnthropicFake(api_key="sk-ant-test") as fake:
        adapter = AnthropicAdapter("claude-sonnet-4-5", api_key="sk-ant-test",
                                   base_url=fake.base_url, max_retries=0)
        ask_for_the_image(adapter, fake, everything)
        adapter.close()
        last = fake.chat_requests[-1].json["messages"][-1]
    (result,) = [b for b in last["content"] if b["type"] == "tool_result"]
    kinds = [part["type"] for part in result["content"]]
    assert kinds == ["text", "image", "text"]
    source = result["content"][1]["source"]
    assert source["type"] == "base64" and source["media_type"] == "image/png"
    assert base64.b64decode(source["data"]).startswith(PNG)


def test_openai_responses_gets_an_input_image(everything: MCPServer) -> None:
    with OpenAIResponsesFake(api_key="sk-proj-test") as fake:
        adapter = OpenAIAdapter("gpt-5", backend="official", base_url=fake.base_url,
                                api_key="sk-proj-test", max_retries=0)
        ask_for_the_image(adapter, fake, everything)
        adapter.close()
        items = fake.chat_requests[-1].json["input"]
    (output,) = [i for i in items if i["type"] == "function_call_output"]
    assert output["call_id"] == "call_img"
    kinds = [part["type"] for part in output["output"]]
    assert kinds == ["input_text", "input_image", "input_text"]
    url = output["output"][1]["image_url"]
    assert url.startswith("data:image/png;base64,")
    assert base64.b64decode(url.split(",", 1)[1]).startswith(PNG)


def test_chat_completions_says_the_image_could_not_be_sent(everything: MCPServer) -> None:
    with OpenAIChatFake() as fake:
        adapter = OpenAIAdapter("smollm2", backend="compatible", base_url=fake.base_url,
                                max_retries=0)
        ask_for_the_image(adapter, fake, everything)
        adapter.close()
        messages = fake.chat_requests[-1].json["messages"]
    (tool,) = [m for m in messages if m["role"] == "tool"]
    assert "Here's the image you requested:" in tool["content"]
    assert "[image image/png," in tool["content"]
    assert "1 image(s) in this tool result could not be sent" in tool["content"]


def test_the_canonical_fake_gets_an_image_block(
    everything: MCPServer, fake: CanonicalFake, adapter: CanonicalAdapter
) -> None:
    ask_for_the_image(adapter, fake, everything)
    last = fake.chat_requests[-1].json["messages"][-1]
    (result,) = [b for b in last["content"] if b["type"] == "tool_result"]
    image = result["content"][1]
    assert image["type"] == "image" and image["media_type"] == "image/png"
    assert base64.b64decode(image["source"]).startswith(PNG)


def test_a_text_only_tool_result_is_unchanged() -> None:
    """The compatible shape: a plain string (or text blocks) stays as it was, no images."""
    block = ToolResultBlock(tool_use_id="t", content="42")
    assert block.text == "42" and block.images == []
    mixed = ToolResultBlock(tool_use_id="t", content=[
        {"type": "text", "text": "see "}, ImageBlock.from_bytes(PNG, "image/png")])
    assert isinstance(mixed.content, list) and isinstance(mixed.content[1], ImageBlock)
    assert mixed.text == "see [image image/png, 8 bytes]" and len(mixed.images) == 1


def test_an_image_result_replays_without_the_server(
    everything: MCPServer, fake: CanonicalFake, adapter: CanonicalAdapter, tmp_path: Path
) -> None:
    """Recorded through a CachedAdapter, the image comes back from the cache file as an image
    (and the model call that carried it replays too) without starting the server."""
    from dispatch_nb.cache import CachedAdapter, ResponseCache

    path = tmp_path / "images.dispatch-cache.jsonl"
    recording = CachedAdapter(adapter, ResponseCache(path, "record"))
    ask_for_the_image(recording, fake, everything)
    recorded = fake.chat_requests[-1].json["messages"][-1]["content"]
    requests = len(fake.chat_requests)

    gone = MCPServer.stdio("/nonexistent/mcp-server", name="everything")
    replaying = CachedAdapter(adapter, ResponseCache(path, "replay"))
    with Session(replaying, tools=[gone], approve="auto") as session:
        stream = session.stream("Show me the image.")
        events = [e for e in stream if isinstance(e, ToolResultEvent)]
    assert stream.response is not None and stream.response.text == "A logo."
    (image,) = events[0].result.images
    assert image.media_type == "image/png" and base64.b64decode(image.source).startswith(PNG)
    assert image.source == recorded[0]["content"][1]["source"]
    assert gone.state == "stopped" and len(fake.chat_requests) == requests  # nothing ran live


def test_an_image_no_model_takes_is_described_in_text() -> None:
    # an SVG, or a PNG over 5 MB, would make the provider refuse the whole request: the model
    # reads what it was instead, and a PNG it takes still comes as an image
    from mcp.types import CallToolResult, ImageContent, TextContent

    from dispatch_nb.mcp import call_result

    def image(data: bytes, mime: str) -> ImageContent:
        return ImageContent(type="image", data=base64.b64encode(data).decode(), mimeType=mime)

    result = call_result("c1", CallToolResult(content=[
        TextContent(type="text", text="Three pictures."),
        image(b"<svg/>", "image/svg+xml"),
        image(PNG + b"\0" * (6 * 1024 * 1024), "image/png"),
        image(PNG, "image/png"),
    ]))
    assert isinstance(result.content, list)
    texts = [b.text for b in result.content if not isinstance(b, ImageBlock)]
    assert texts[0] == "Three pictures."
    assert texts[1].startswith("[image image/svg+xml, 6 bytes: not shown to the model")
    assert texts[2].startswith("[image image/png, 6291464 bytes: not shown to the model")
    assert [b.media_type for b in result.images] == ["image/png"]
    assert result.images[0].as_base64()[1] == base64.b64encode(PNG).decode()


def test_a_results_text_parts_are_separate_lines() -> None:
    """A result of several text parts (a sentence, then resource links: server-everything's
    get-resource-links) reads as lines, in the cell and for the model, as an error's parts do:
    they ran together ("…links:[resource demo://a][resource demo://b]")."""
    from mcp.types import CallToolResult, ResourceLink, TextContent

    from dispatch_nb.mcp import call_result

    result = CallToolResult(content=[
        TextContent(type="text", text="Here are 2 links:"),
        ResourceLink(type="resource_link", uri="demo://a", name="a"),
        ResourceLink(type="resource_link", uri="demo://b", name="b")])
    block = call_result("t", result)
    assert block.content == "Here are 2 links:\n[resource demo://a]\n[resource demo://b]"
