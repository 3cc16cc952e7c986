"""``dispatch_nb.testing`` as a user testing their own code meets it: only public names, no
repository fixtures, no server (the canonical protocol is answered in-process)."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest

from dispatch_nb import DispatchError, Session, tool
from dispatch_nb.testing import CanonicalHandler, Fail, FakeAdapter, ToolCall, Turn


def test_chat_scripted_then_echo() -> None:
    model = FakeAdapter(Turn(text="Paris.", input_tokens=5, output_tokens=2))
    answer = model.chat("Capital of France?", system="Be brief.")
    assert answer.text == "Paris."
    assert (answer.usage.input_tokens, answer.usage.output_tokens) == (5, 2)
    assert model.requests[-1]["system"] == "Be brief."
    assert model.requests[-1]["messages"][-1]["content"] == "Capital of France?"
    assert model.chat("hi").text == "echo: hi"  # nothing scripted: the model name and the message
    assert FakeAdapter(model="other").chat("hi").text == "other: hi"


def test_stream_deltas_in_pieces() -> None:
    model = FakeAdapter(Turn(text="Hello there", chunk=3, thinking="Greet back."))
    stream = model.stream("hi")
    texts = [d.text for d in stream if d.type == "text_delta"]
    assert texts == ["Hel", "lo ", "the", "re"]
    final = stream.response
    assert final.text == "Hello there"
    assert final.thinking == "Greet back."
    assert model.requests[-1]["stream"] is True


def test_async_chat_and_stream() -> None:
    model = FakeAdapter(Turn(text="one"), Turn(text="two", chunk=1))

    async def main() -> tuple[str, list[str]]:
        first = await model.achat("a")
        pieces = []
        async for delta in model.astream("b"):
            if delta.type == "text_delta":
                pieces.append(delta.text)
        return first.text, pieces

    assert asyncio.run(main()) == ("one", ["t", "w", "o"])


def test_tools_in_a_session() -> None:
    calls: list[str] = []

    @tool
    def get_weather(city: str) -> dict[str, object]:
        """Current weather for a city.

        Args:
            city: The city name.
        """
        calls.append(city)
        return {"city": city, "temp": 24}

    model = FakeAdapter(
        Turn(tool_calls=[ToolCall("c1", "get_weather", {"city": "Lima"})]),
        Turn(text="Sunny in Lima, 24 °C."),
    )
    session = Session(model, tools=[get_weather])
    assert session.send("Weather in Lima?").text == "Sunny in Lima, 24 °C."
    assert calls == ["Lima"]
    first, second = model.requests
    assert [t["name"] for t in first["tools"]] == ["get_weather"]
    results = [b for m in second["messages"] if isinstance(m["content"], list)
               for b in m["content"] if b["type"] == "tool_result"]
    assert [r["tool_use_id"] for r in results] == ["c1"]
    assert "24" in str(results[0])


def test_error_mid_stream_keeps_partial() -> None:
    model = FakeAdapter(
        Turn(text="Half an answer", chunk=5, error_after=2,
             error=Fail(400, "content policy", "invalid_request_error")),
        max_retries=0,
    )
    with pytest.raises(DispatchError) as info:
        model.chat("go", stream=True)
    assert "content policy" in info.value.message
    assert (info.value.status_code, info.value.code) == (400, "invalid_request")
    assert info.value.partial is not None
    assert info.value.partial.text == "Half an an"


def test_http_error_is_mapped() -> None:
    from dispatch_nb import AuthenticationError

    model = FakeAdapter(Fail(401, "bad key", "authentication_error"))
    with pytest.raises(AuthenticationError, match="bad key") as info:
        model.chat("hi")
    assert (info.value.status_code, info.value.code) == (401, "authentication_failed")


def test_handler_with_a_plain_httpx_client() -> None:
    import httpx

    handler = CanonicalHandler(Turn(text="hi there"))
    with httpx.Client(transport=httpx.MockTransport(handler), base_url="http://x.test") as client:
        body = client.post("/chat", json={"model": "m", "messages": [], "stream": False}).json()
        assert body["content"] == [{"type": "text", "text": "hi there"}]
        assert client.get("/models").json()["data"][0]["id"] == "echo"
    assert handler.last_body["model"] == "m"


def test_import_dispatch_nb_does_not_import_testing() -> None:
    code = "import sys, dispatch_nb; print('dispatch_nb.testing' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
