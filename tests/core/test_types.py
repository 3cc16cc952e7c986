"""Canonical types: shapes, helpers and lossless JSON round trips."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from dispatch_nb import (
    ImageBlock,
    Message,
    ModelInfo,
    RedactedThinkingBlock,
    Response,
    StreamDelta,
    TextBlock,
    ThinkingBlock,
    ToolDefinition,
    ToolResultBlock,
    ToolUseBlock,
    Usage,
)

OPAQUE = {"openai_responses": {"id": "rs_1", "encrypted_content": "gAAAA==", "summary": []}}


def full_response() -> Response:
    call = ToolUseBlock(id="call_1", name="f", arguments={"x": [1, {"y": None}]},
                        provider_data={"item_id": "fc_1"})
    return Response(
        content=[
            ThinkingBlock(thinking="hmm", signature="EqQB\x00sig==", provider_data=OPAQUE),
            RedactedThinkingBlock(data="ENCRYPTED"),
            TextBlock("Hello ✓", provider_data={"message_id": "msg_1"}),
            ImageBlock(source="https://example.invalid/cat.png"),
            call,
        ],
        tool_calls=[call],
        model="m",
        stop_reason="tool_use",
        usage=Usage(input_tokens=3, output_tokens=4, cache_read_tokens=5, cache_creation_tokens=6),
        provider_data={"response_id": "resp_1"},
    )


def test_json_round_trip_is_lossless_for_every_block() -> None:
    r = full_response()
    again = Response.model_validate_json(r.model_dump_json())
    assert again == r
    assert again.content[0].provider_data == OPAQUE
    assert Response.model_validate(r.model_dump()) == r


def test_text_and_to_message() -> None:
    r = full_response()
    assert r.text == "Hello ✓"
    assert r.thinking == "hmm"
    message = r.to_message()
    assert message.role == "assistant"
    assert message.content == r.content
    assert message.content[0] is not r.content[0]  # a copy, not shared state


def test_empty_response_has_list_content_and_empty_text() -> None:
    r = Response()
    assert r.content == [] and r.tool_calls == [] and r.text == ""


def test_message_forms() -> None:
    assert Message("user", "hi").content == "hi"
    assert Message(role="user", content="hi").blocks == [TextBlock("hi")]
    m = Message.model_validate(
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "c", "content": "ok"}]}
    )
    assert isinstance(m.content[0], ToolResultBlock)
    with pytest.raises(ValidationError):
        Message(role="system", content="no system role in messages")


def test_tool_definition_validates_names() -> None:
    ToolDefinition(name="get_weather", description="d", parameters={"type": "object"})
    with pytest.raises(ValidationError):
        ToolDefinition(name="bad name!", description="", parameters={})


def test_image_block_helpers() -> None:
    inline = ImageBlock.from_bytes(b"\x89PNG", "image/png")
    assert inline.as_data_url().startswith("data:image/png;base64,")
    assert inline.as_base64() == ("image/png", "iVBORw==")
    data_url = ImageBlock(source="data:image/jpeg;base64,AAAA")
    assert data_url.as_base64() == ("image/jpeg", "AAAA")
    with pytest.raises(ValueError):
        ImageBlock(source="https://x.invalid/a.png").as_base64()


def test_usage_adds_and_totals() -> None:
    total = Usage(input_tokens=1, output_tokens=2) + Usage(input_tokens=3, cache_read_tokens=4)
    assert total == Usage(input_tokens=4, output_tokens=2, cache_read_tokens=4)
    assert total.total_tokens == 10


def test_stream_delta_and_model_info() -> None:
    d = StreamDelta(type="tool_use_end", tool_call_id="c", tool_name="f", arguments={"a": 1})
    assert d.arguments == {"a": 1}
    with pytest.raises(ValidationError):
        StreamDelta(type="not_a_delta")
    info = ModelInfo(id="gpt-4.1", max_context_tokens=128000, supports_vision=True, vendor="openai")
    assert ModelInfo.model_validate_json(info.model_dump_json()) == info


def test_rich_reprs() -> None:
    r = full_response()
    bundle = r._repr_mimebundle_()
    assert "Hello ✓" in bundle["text/markdown"]
    assert bundle["text/plain"] == "Hello ✓"
    assert "<details>" in r._repr_markdown_()
    html = r._repr_html_()
    try:
        import markdown_it  # noqa: F401
    except ImportError:
        assert html is None  # no raw <pre> that would outrank the Markdown in JupyterLab
    else:
        assert html is not None and "Hello" in html and "<pre" not in html


def test_ipython_shows_markdown_not_a_raw_html_fallback() -> None:
    from IPython.core.formatters import DisplayFormatter

    data, _ = DisplayFormatter().format(full_response())
    assert data["text/markdown"].startswith("<details>")
    assert "<pre style" not in data.get("text/html", "")
