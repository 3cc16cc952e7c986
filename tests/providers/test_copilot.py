"""The GitHub Copilot adapter against a loopback Copilot API fake and a fake GitHub.

Headers, X-Initiator, vision, Copilot's stream quirks, the reasoning round trip, ``/responses``
routing, the model list, token refresh (before expiry, after a 401, 32 threads at once), the
device-flow login, the error table, the ``status --models`` command — and, around every test, a scan
that no GitHub or Copilot token shows up in a repr, a log record or an exception's text.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import logging
import stat
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from dispatch_nb import (
    APIConnectionError,
    AuthenticationError,
    ImageBlock,
    Message,
    ModelUnavailableError,
    RateLimitError,
    RequestError,
    ServerError,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
    connect,
)
from dispatch_nb.__main__ import main
from dispatch_nb.auth import CopilotTokenManager, DeviceCode, TokenStore
from dispatch_nb.providers.copilot import (
    NOT_SIGNED_IN,
    CopilotAdapter,
    copilot_endpoint,
    initiator_for,
    is_picker_model,
)
from tests.fakes.copilot import COPILOT_MODELS, CopilotFake
from tests.fakes.github import FakeGitHub
from tests.fakes.provider import WEATHER, Fail, ToolCall, Turn
from tests.fakes.server import Reply

PICKER_IDS = ["gpt-4.1", "gpt-4o", "claude-sonnet-4", "gpt-5-codex"]
ENV_NAMES = ("DISPATCH_NB_GITHUB_TOKEN", "DISPATCH_NB_GITHUB_URL", "DISPATCH_NB_GITHUB_API_URL",
             "LOCALAPPDATA")


class Clock:
    """A clock the test moves by hand (for the token manager's refresh decisions)."""

    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


# -- the secret scan ---------------------------------------------------------------------------------
class Leaks:
    """Collects what a test produced that users can see, and the secrets that must not be in it."""

    def __init__(self) -> None:
        self.githubs: list[FakeGitHub] = []
        self.objects: list[Any] = []
        self.errors: list[BaseException] = []
        self.texts: list[str] = []

    def github(self, github: FakeGitHub) -> FakeGitHub:
        self.githubs.append(github)
        return github

    def watch(self, obj: Any) -> Any:
        self.objects.append(obj)
        return obj

    def error(self, exc: BaseException) -> BaseException:
        self.errors.append(exc)
        return exc

    def secrets(self) -> list[str]:
        found: list[str] = []
        for github in self.githubs:
            found += list(github.users)  # every GitHub token the fake accepts (approved ones too)
            found += github.issued_copilot_tokens
            for auth in github.authorizations:
                found.append(auth.device_code)
        out: list[str] = []
        for secret in found:
            out.append(secret)
            body = secret.split("_", 1)[-1] if secret.startswith("gh") else secret
            out.append(body[:16])  # a distinctive piece is a leak too
            if ":" in secret:
                out.append(secret.rsplit(":", 1)[-1][:16])  # the Copilot token's MAC
        return [s for s in out if len(s) >= 12]

    def visible(self, records: list[logging.LogRecord]) -> list[str]:
        texts = list(self.texts)
        for record in records:
            texts.append(record.getMessage())
            texts.append(repr(record.args))
        for obj in self.objects:
            texts.append(repr(obj))
            texts.append(str(obj))
        seen: set[int] = set()
        todo = list(self.errors)
        while todo:
            exc = todo.pop()
            if id(exc) in seen:
                continue
            seen.add(id(exc))
            texts += [str(exc), repr(exc), getattr(exc, "message", "") or "", *map(str, exc.args)]
            todo += [e for e in (exc.__cause__, exc.__context__) if e is not None]
        return texts


@pytest.fixture(autouse=True)
def leaks(caplog: pytest.LogCaptureFixture) -> Iterator[Leaks]:
    caplog.set_level(logging.DEBUG)
    found = Leaks()
    yield found
    secrets = found.secrets()
    records = [*caplog.get_records("setup"), *caplog.get_records("call"), *caplog.records]
    if any(github.requests for github in found.githubs):
        assert records, "nothing was logged: is the scan looking at the right records?"
    for text in found.visible(records):
        for secret in secrets:
            assert secret not in text, f"a token leaked into: {text[:300]!r}"


@pytest.fixture(autouse=True)
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No real logins: empty homes, no token variables."""
    for name in ENV_NAMES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("DISPATCH_NB_HOME", str(tmp_path / "dnb"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    return tmp_path


@pytest.fixture
def copilot(leaks: Leaks) -> Iterator[CopilotFake]:
    with CopilotFake() as fake:
        leaks.github(fake.github)
        yield fake


@pytest.fixture
def make(copilot: CopilotFake, leaks: Leaks) -> Iterator[Callable[..., CopilotAdapter]]:
    made: list[CopilotAdapter] = []

    def build(model: str = "gpt-4.1", **kw: Any) -> CopilotAdapter:
        github = copilot.github
        kw.setdefault("max_retries", 0)
        if "token_manager" not in kw:
            kw.setdefault("github_token", github.github_token)
        adapter = CopilotAdapter(model, github_url=github.github_url,
                                 github_api_url=github.api_url, **kw)
        made.append(adapter)
        leaks.watch(adapter)
        return adapter

    yield build
    for adapter in made:
        adapter.close()


def raises(leaks: Leaks, cls: type[BaseException], fn: Callable[..., Any], *args: Any,
           **kw: Any) -> Any:
    with pytest.raises(cls) as info:
        fn(*args, **kw)
    leaks.error(info.value)
    return info.value


def frames(events: list[bytes]) -> list[Any]:
    """The JSON payloads of rendered SSE events."""
    out: list[Any] = []
    for line in b"".join(events).decode().splitlines():
        if line.startswith("data: ") and line != "data: [DONE]":
            out.append(json.loads(line[6:]))
    return out


# -- identity ----------------------------------------------------------------------------------------
def test_identity_repr_and_connect(make: Callable[..., CopilotAdapter],
                                   copilot: CopilotFake, leaks: Leaks) -> None:
    adapter = make("claude-sonnet-4")
    assert (adapter.provider_name, adapter.display_name, adapter.model_name) == (
        "copilot", "GitHub Copilot", "claude-sonnet-4")
    assert "claude-sonnet-4" in repr(adapter)
    github = copilot.github
    via_registry = leaks.watch(connect("copilot:gpt-4o", github_token=github.github_token,
                                       github_api_url=github.api_url))
    assert isinstance(via_registry, CopilotAdapter)
    assert via_registry.model_name == "gpt-4o"
    assert via_registry.chat("hi").text == "echo: hi"
    via_registry.close()


def test_github_urls_environment_and_arguments(monkeypatch: pytest.MonkeyPatch) -> None:
    assert CopilotAdapter().github_url == "https://github.com"
    assert CopilotAdapter().github_api_url == "https://api.github.com"
    monkeypatch.setenv("DISPATCH_NB_GITHUB_URL", "https://octo.ghe.com")
    adapter = CopilotAdapter()
    assert (adapter.github_url, adapter.github_api_url) == (
        "https://octo.ghe.com", "https://api.octo.ghe.com")
    monkeypatch.setenv("DISPATCH_NB_GITHUB_API_URL", "http://127.0.0.1:9/api")
    assert CopilotAdapter().github_api_url == "http://127.0.0.1:9/api"
    explicit = CopilotAdapter(github_url="https://github.com",
                              github_api_url="https://api.github.com")
    assert (explicit.github_url, explicit.github_api_url) == (
        "https://github.com", "https://api.github.com")


# -- headers -----------------------------------------------------------------------------------------
def test_copilot_headers_on_every_request(make: Callable[..., CopilotAdapter],
                                          copilot: CopilotFake) -> None:
    adapter = make()
    adapter.chat("one")
    adapter.chat("two", stream=True)
    models_request = next(r for r in copilot.requests if r.path == "/models")
    first, second = copilot.chat_requests
    token = copilot.github.issued_copilot_tokens[-1]
    for request in (models_request, first, second):
        assert request.header("authorization") == f"Bearer {token}"
        assert request.header("copilot-integration-id") == "vscode-chat"
        assert (request.header("editor-version") or "").startswith("vscode/")
        assert (request.header("editor-plugin-version") or "").startswith("copilot-chat/")
        assert (request.header("user-agent") or "").startswith("GitHubCopilotChat/")
        assert request.header("x-github-api-version") == "2025-05-01"
        uuid.UUID(request.header("x-request-id") or "")
    for request in (first, second):
        assert request.header("openai-intent") == "conversation-panel"
        assert request.header("copilot-vision-request") is None
        assert request.header("content-type") == "application/json"
    assert first.header("x-request-id") != second.header("x-request-id")
    assert first.json["max_tokens"] == 8192  # the default
    assert first.json["stream"] is False and second.json["stream"] is True
    assert copilot.rejected == []


def test_the_default_max_tokens_stays_within_the_model_limit(
    make: Callable[..., CopilotAdapter], copilot: CopilotFake
) -> None:
    adapter = make("gpt-4o")  # max_output_tokens 4096 in the model list
    adapter.chat("Hi")
    assert copilot.last_request.json["max_tokens"] == 4096
    adapter.chat("Hi", max_tokens=5000)  # the caller's choice is sent as is
    assert copilot.last_request.json["max_tokens"] == 5000
    make("gpt-4o", max_tokens=1000).chat("Hi")
    assert copilot.last_request.json["max_tokens"] == 1000
    make("gpt-4.1").chat("Hi")
    assert copilot.last_request.json["max_tokens"] == 8192


def test_requests_without_editor_headers_are_refused_by_the_fake(copilot: CopilotFake) -> None:
    import httpx

    response = httpx.post(f"{copilot.url}/chat/completions", json={"model": "gpt-4.1"})
    assert response.status_code == 400
    assert "Copilot-Integration-Id" in response.text
    response = httpx.post(f"{copilot.url}/chat/completions", json={"model": "gpt-4.1"},
                          headers={"Copilot-Integration-Id": "vscode-chat"})
    assert response.status_code == 400 and "Editor-Version" in response.text
    response = httpx.post(f"{copilot.url}/chat/completions", json={"model": "gpt-4.1"},
                          headers={"Copilot-Integration-Id": "vscode-chat",
                                   "Editor-Version": "vscode/1.0", "Authorization": "Bearer x"})
    assert response.status_code == 401


@pytest.mark.parametrize(
    ("messages", "expected"),
    [
        ([Message(role="user", content="Hi")], "user"),
        ([Message(role="user", content=[TextBlock(text="Look"),
                                         ImageBlock(source="https://x.test/a.png")])], "user"),
        ([Message(role="user", content="Hi"), Message(role="assistant", content="Hel")], "agent"),
        ([Message(role="user", content="Weather?"),
          Message(role="assistant", content=[ToolUseBlock(id="c1", name="get_weather",
                                                          arguments={"city": "Oslo"})]),
          Message(role="user", content=[ToolResultBlock(tool_use_id="c1", content="4 °C")])],
         "agent"),
    ],
    ids=["typed", "typed-with-image", "assistant-last", "tool-results"],
)
def test_x_initiator(make: Callable[..., CopilotAdapter], copilot: CopilotFake,
                     messages: list[Message], expected: str) -> None:
    assert initiator_for(messages) == expected
    make().chat(messages, tools=[WEATHER])
    assert copilot.last_request.header("x-initiator") == expected


def test_x_initiator_option_and_responses_route(make: Callable[..., CopilotAdapter],
                                                copilot: CopilotFake) -> None:
    adapter = make()
    adapter.chat("Hi", initiator="agent")
    assert copilot.last_request.header("x-initiator") == "agent"
    with pytest.raises(ValueError, match="initiator"):
        adapter.chat("Hi", initiator="robot")
    make("gpt-5-codex").chat("Hi")
    assert copilot.last_request.path == "/responses"
    assert copilot.last_request.header("x-initiator") == "user"


def test_vision_header_when_a_message_holds_an_image(make: Callable[..., CopilotAdapter],
                                                     copilot: CopilotFake) -> None:
    image = ImageBlock.from_bytes(b"\x89PNG\r\n\x1a\nfake", "image/png")
    make().chat([Message(role="user", content=[TextBlock(text="What is this?"), image])])
    request = copilot.last_request
    assert request.header("copilot-vision-request") == "true"
    parts = request.json["messages"][-1]["content"]
    assert parts[1]["type"] == "image_url"
    assert parts[1]["image_url"]["url"].startswith("data:image/png;base64,")
    make("gpt-5-codex").chat([Message(role="user", content=[TextBlock(text="And this?"), image])])
    assert copilot.last_request.header("copilot-vision-request") == "true"


# -- stream quirks -----------------------------------------------------------------------------------
def test_the_fake_really_sends_copilots_quirks(copilot: CopilotFake, make: Callable[..., Any]) -> None:
    make("claude-sonnet-4").chat("x", tools=[WEATHER], stream=True)
    turn = Turn(text="Checking.", tool_calls=[ToolCall("call_a", "get_weather", {"city": "A"}),
                                              ToolCall("call_b", "get_weather", {"city": "B"})])
    data = frames(copilot.render_events(turn, copilot.last_request))
    assert data[0]["choices"] == [] and "prompt_filter_results" in data[0]
    assert any(d.get("choices") is None and "copilot_references" in d for d in data)
    calls = [(c["index"], tc) for d in data for c in d.get("choices") or []
             for tc in c["delta"].get("tool_calls") or []]
    assert {tc["index"] for _, tc in calls} == {0}  # Claude: every call on index 0
    assert {i for i, _ in calls} == {1}  # tool calls in choice 1, text in choice 0
    finish = next(d for d in data if d.get("choices") and d["choices"][0].get("finish_reason"))
    assert finish["choices"][0]["finish_reason"] == "stop"  # "stop" although there are calls
    assert "usage" in finish  # usage on the finish chunk


@pytest.mark.parametrize("claude", [True, False], ids=["claude-quirks", "gpt-style"])
@pytest.mark.parametrize("stream", [True, False], ids=["stream", "json"])
def test_stream_quirks_give_the_same_response(leaks: Leaks, claude: bool, stream: bool) -> None:
    with CopilotFake(claude=claude) as fake:
        leaks.github(fake.github)
        adapter = leaks.watch(CopilotAdapter(
            "claude-sonnet-4", github_token=fake.github.github_token,
            github_api_url=fake.github.api_url, max_retries=0))
        fake.push(Turn(text="Let me check both.", chunk=3, input_tokens=30, cache_read_tokens=10,
                       output_tokens=9,
                       tool_calls=[ToolCall("call_a", "get_weather", {"city": "Paris"}),
                                   ToolCall("call_b", "get_weather", {"city": "Oslo"})]))
        deltas: list[Any] = []
        response = adapter.chat("Paris and Oslo?", tools=[WEATHER], stream=stream,
                                on_delta=deltas.append)
        adapter.close()
    assert [b.type for b in response.content] == ["text", "tool_use", "tool_use"]
    assert response.text == "Let me check both."
    assert [(c.id, c.arguments) for c in response.tool_calls] == [
        ("call_a", {"city": "Paris"}), ("call_b", {"city": "Oslo"})]
    assert response.stop_reason == "tool_use"
    assert (response.usage.input_tokens, response.usage.cache_read_tokens,
            response.usage.output_tokens) == (30, 10, 9)
    if stream:
        starts = [d.tool_call_id for d in deltas if d.type == "tool_use_start"]
        assert starts == ["call_a", "call_b"]
        assert "".join(d.text or "" for d in deltas if d.type == "text_delta") == response.text


# -- reasoning ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("stream", [True, False], ids=["stream", "json"])
def test_reasoning_text_and_opaque_round_trip(make: Callable[..., CopilotAdapter],
                                              copilot: CopilotFake, stream: bool) -> None:
    thought, opaque = "The user wants Oslo; call the tool.", "opaque+sig/AAAA=="
    copilot.push(Turn(thinking=thought, signature=opaque,
                      tool_calls=[ToolCall("call_1", "get_weather", {"city": "Oslo"})]),
                 Turn(text="4 °C in Oslo."))
    adapter = make("claude-sonnet-4")
    history = [Message(role="user", content="Weather in Oslo?")]
    first = adapter.chat(history, tools=[WEATHER], stream=stream)
    thinking = first.content[0]
    assert isinstance(thinking, ThinkingBlock)
    assert (thinking.thinking, thinking.signature) == (thought, opaque)
    assert thinking.provider_data == {"openai_chat": {"field": "reasoning_text",
                                                      "provider": "copilot"}}
    # through JSON (a saved session), then back to Copilot on the next turn
    assistant = Message.model_validate_json(first.to_message().model_dump_json())
    history += [assistant, Message(role="user", content=[
        ToolResultBlock(tool_use_id="call_1", content="4 °C")])]
    assert adapter.chat(history, tools=[WEATHER], stream=stream).text == "4 °C in Oslo."
    sent = [m for m in copilot.last_request.json["messages"] if m["role"] == "assistant"]
    assert sent[0]["reasoning_text"] == thought
    assert sent[0]["reasoning_opaque"] == opaque
    assert sent[0]["tool_calls"][0]["id"] == "call_1"


def test_thinking_from_other_providers_is_not_echoed(make: Callable[..., CopilotAdapter],
                                                     copilot: CopilotFake) -> None:
    foreign = [
        ThinkingBlock(thinking="anthropic", signature="sig-anthropic",
                      provider_data={"anthropic": {}}),
        ThinkingBlock(thinking="another server", signature="sig-compatible",
                      provider_data={"openai_chat": {"field": "reasoning_text"}}),
        ThinkingBlock(thinking="unsigned"),
    ]
    history = [Message(role="user", content="Hi"),
               Message(role="assistant", content=[*foreign, TextBlock(text="Hello.")]),
               Message(role="user", content="Again?")]
    make("claude-sonnet-4").chat(history)
    assistant = [m for m in copilot.last_request.json["messages"] if m["role"] == "assistant"]
    assert assistant == [{"role": "assistant", "content": "Hello."}]


# -- /responses routing ------------------------------------------------------------------------------
@pytest.mark.parametrize("stream", [True, False], ids=["stream", "json"])
def test_a_responses_only_model_goes_to_responses(make: Callable[..., CopilotAdapter],
                                                  copilot: CopilotFake, stream: bool) -> None:
    copilot.push(Turn(text="Hi from codex"), Turn(text="Hi from 4.1"))
    assert make("gpt-5-codex").chat("Hi", system="Be brief.", stream=stream).text == "Hi from codex"
    request = copilot.last_request
    assert request.path == "/responses"
    assert request.json["instructions"] == "Be brief."
    assert request.json["store"] is False
    assert request.json["max_output_tokens"] == 8192
    assert request.json["include"] == ["reasoning.encrypted_content"]
    assert make("gpt-4.1").chat("Hi", stream=stream).text == "Hi from 4.1"
    assert copilot.last_request.path == "/chat/completions"


def test_endpoint_choice_rule() -> None:
    entries = {m["id"]: m for m in COPILOT_MODELS}
    assert copilot_endpoint(entries["gpt-5-codex"], "gpt-5-codex") == "responses"
    assert copilot_endpoint(entries["gpt-4.1"], "gpt-4.1") == "chat/completions"
    assert copilot_endpoint(entries["gpt-4o"], "gpt-4o") == "chat/completions"  # none listed
    assert copilot_endpoint(None, "gpt-5.1-codex-mini") == "responses"
    assert copilot_endpoint(None, "claude-sonnet-4") == "chat/completions"


def test_without_a_model_list_models_are_routed_by_name(make: Callable[..., CopilotAdapter],
                                                        copilot: CopilotFake,
                                                        leaks: Leaks) -> None:
    copilot.models_reply = Reply.json({"error": {"message": "upstream"}}, 503)
    assert make("gpt-5-codex").chat("Hi").text == "echo: Hi"
    assert copilot.last_request.path == "/responses"
    assert make("claude-sonnet-4").chat("Hi", stream=True).text == "echo: Hi"
    assert copilot.last_request.path == "/chat/completions"
    adapter = make("gpt-7-imaginary")
    error = raises(leaks, ModelUnavailableError, adapter.chat, "Hi")
    assert error.status_code == 400  # the server said so: no list to check against


# -- models ------------------------------------------------------------------------------------------
def test_list_models_filters_like_the_editors(make: Callable[..., CopilotAdapter]) -> None:
    assert [m["id"] for m in COPILOT_MODELS if is_picker_model(m)] == [*PICKER_IDS, "gpt-4o"]
    models = make().list_models()
    assert [m.id for m in models] == PICKER_IDS  # duplicates dropped
    by_id = {m.id: m for m in models}
    gpt, claude, codex = by_id["gpt-4.1"], by_id["claude-sonnet-4"], by_id["gpt-5-codex"]
    assert (gpt.premium_multiplier, claude.premium_multiplier) == (0.0, 1.0)
    assert (gpt.vendor, claude.vendor) == ("Azure OpenAI", "Anthropic")
    assert (claude.max_context_tokens, claude.max_output_tokens) == (216_000, 16_000)
    assert claude.max_prompt_tokens == 128_000  # type: ignore[attr-defined]
    assert claude.supports_thinking is True  # type: ignore[attr-defined]
    assert gpt.supports_vision and gpt.supports_tool_use and gpt.supports_streaming
    assert codex.endpoints == ["/responses"]
    assert gpt.name == "GPT-4.1"


def test_the_model_list_is_cached_per_adapter(make: Callable[..., CopilotAdapter],
                                              copilot: CopilotFake) -> None:
    def fetches() -> int:
        return len([r for r in copilot.requests if r.path == "/models"])

    adapter = make("claude-sonnet-4")
    adapter.list_models()
    adapter.list_models()
    adapter.chat("a")
    adapter.chat("b", stream=True)
    assert adapter.max_context_tokens == 216_000
    assert fetches() == 1
    assert asyncio.run(adapter.alist_models())[0].id == "gpt-4.1"
    assert fetches() == 1
    adapter.list_models(refresh=True)
    assert fetches() == 2
    other = make("claude-sonnet-4")  # another adapter has its own cache
    assert other.max_context_tokens == 216_000  # fetched on demand
    assert fetches() == 3


def test_an_unknown_model_lists_the_available_ones(make: Callable[..., CopilotAdapter],
                                                   copilot: CopilotFake, leaks: Leaks) -> None:
    adapter = make("gpt-9")
    error = raises(leaks, ModelUnavailableError, adapter.chat, "Hi")
    assert error.available == PICKER_IDS
    for model_id in PICKER_IDS:
        assert model_id in error.message
    assert "gpt-9" in error.message
    assert copilot.chat_requests == []  # nothing was sent
    raises(leaks, ModelUnavailableError, asyncio.run, adapter.achat("Hi"))
    assert len([r for r in copilot.requests if r.path == "/models"]) == 1
    assert not adapter.validate()
    assert "gpt-9" in adapter.validate().reason


def test_a_model_outside_the_picker_still_works(make: Callable[..., CopilotAdapter],
                                                copilot: CopilotFake) -> None:
    adapter = make("o3-mini-paygo")
    assert adapter.chat("Hi").text == "echo: Hi"
    assert adapter.max_context_tokens == 200_000
    assert "o3-mini-paygo" not in [m.id for m in adapter.list_models()]


def test_max_context_tokens_falls_back_to_the_table_offline(leaks: Leaks) -> None:
    github = leaks.github(FakeGitHub().start())
    api_url, token = github.api_url, github.github_token
    github.close()  # nothing listens there now
    adapter = leaks.watch(CopilotAdapter("gpt-4.1", github_token=token, github_api_url=api_url))
    assert adapter.max_context_tokens == 128_000
    unknown = leaks.watch(CopilotAdapter("mystery-1", github_token=token, github_api_url=api_url))
    assert unknown.max_context_tokens is None
    error = raises(leaks, APIConnectionError, adapter.chat, "Hi")
    assert isinstance(error, ConnectionError)


# -- token refresh -----------------------------------------------------------------------------------
def managed(copilot: CopilotFake, clock: Clock) -> CopilotTokenManager:
    return CopilotTokenManager(copilot.github.github_token, github_api_url=copilot.github.api_url,
                               clock=clock)


def test_the_token_is_refreshed_before_it_runs_out(make: Callable[..., CopilotAdapter],
                                                   copilot: CopilotFake) -> None:
    clock = Clock()
    adapter = make(token_manager=managed(copilot, clock))
    adapter.chat("a")
    adapter.chat("b")
    assert copilot.github.copilot_exchanges == 1
    clock.advance(1500 - 60 + 1)  # refresh_in 1500 s, refreshed 60 s early
    adapter.chat("c", stream=True)
    assert copilot.github.copilot_exchanges == 2
    assert copilot.last_request.header("authorization") == (
        f"Bearer {copilot.github.issued_copilot_tokens[-1]}")
    adapter.chat("d")
    assert copilot.github.copilot_exchanges == 2
    assert copilot.rejected == []


@pytest.mark.parametrize("mode", ["json", "stream", "async"])
def test_a_401_gets_one_new_token_then_succeeds(make: Callable[..., CopilotAdapter],
                                                copilot: CopilotFake, mode: str) -> None:
    adapter = make(max_retries=2)
    adapter.chat("warm up")
    assert copilot.github.copilot_exchanges == 1
    copilot.github.revoke_copilot_tokens()  # e.g. expired on the server's clock
    copilot.push(Turn(text="fresh token works"))
    if mode == "async":
        response = asyncio.run(adapter.achat("again", stream=True))
    else:
        response = adapter.chat("again", stream=mode == "stream")
    assert response.text == "fresh token works"
    assert copilot.github.copilot_exchanges == 2  # exactly one re-exchange
    assert len(copilot.rejected) == 1
    assert copilot.last_request.header("authorization") == (
        f"Bearer {copilot.github.issued_copilot_tokens[-1]}")


def test_the_model_list_also_refreshes_after_a_401(make: Callable[..., CopilotAdapter],
                                                   copilot: CopilotFake) -> None:
    adapter = make()
    adapter.validate()
    copilot.github.revoke_copilot_tokens()
    assert [m.id for m in adapter.list_models(refresh=True)] == PICKER_IDS
    assert copilot.github.copilot_exchanges == 2
    assert [r.path for r in copilot.rejected] == ["/models"]


def test_a_401_that_persists_is_refreshed_only_once_per_call(
    make: Callable[..., CopilotAdapter], copilot: CopilotFake, leaks: Leaks
) -> None:
    adapter = make(max_retries=2)
    adapter.chat("warm up")
    copilot.push(Fail(401, "unauthorized: your seat was removed"))  # answers twice
    error = raises(leaks, AuthenticationError, adapter.chat, "Hi")
    assert error.status_code == 401
    assert "seat was removed" in error.message
    assert copilot.github.copilot_exchanges == 2  # one refresh, then the error
    assert len(copilot.chat_requests) == 3  # warm up + the attempt + its one retry
    assert adapter.chat("later").text == "echo: later"  # the next call starts afresh


def test_token_exchange_refusals_are_not_retried(make: Callable[..., CopilotAdapter],
                                                 copilot: CopilotFake, leaks: Leaks) -> None:
    copilot.github.copilot_token_response(notification_id="no_copilot_access")
    error = raises(leaks, AuthenticationError, make(max_retries=2).chat, "Hi")
    assert error.code == "no_copilot_access"
    assert "Copilot access" in error.message
    assert copilot.github.copilot_exchanges == 1
    assert copilot.chat_requests == []


def test_a_bad_github_token_says_to_log_in(make: Callable[..., CopilotAdapter],
                                           copilot: CopilotFake, leaks: Leaks) -> None:
    copilot.github.revoke_github_token(copilot.github.github_token)
    adapter = make()
    error = raises(leaks, AuthenticationError, adapter.chat, "Hi")
    assert "login" in error.message
    result = adapter.validate()
    assert not result and "login" in result.reason
    leaks.texts.append(result.reason)


def test_32_threads_across_a_token_expiry_cause_one_exchange(
    make: Callable[..., CopilotAdapter], copilot: CopilotFake
) -> None:
    clock = Clock()
    adapter = make(token_manager=managed(copilot, clock))
    adapter.chat("warm up")
    assert copilot.github.copilot_exchanges == 1
    clock.advance(3600)
    copilot.github.copilot_token_response(endpoints_api=copilot.url, delay=0.3)  # a slow exchange
    barrier = threading.Barrier(32)
    results: list[str] = []
    errors: list[BaseException] = []

    def worker(i: int) -> None:
        barrier.wait()
        try:
            results.append(adapter.chat(f"thread {i}").text)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert errors == []
    assert sorted(results) == sorted(f"echo: thread {i}" for i in range(32))
    assert copilot.github.copilot_exchanges == 2


def test_32_threads_after_a_server_side_expiry_cause_one_exchange(
    make: Callable[..., CopilotAdapter], copilot: CopilotFake
) -> None:
    adapter = make(max_retries=0)
    adapter.chat("warm up")
    copilot.github.revoke_copilot_tokens()
    copilot.github.copilot_token_response(endpoints_api=copilot.url, delay=0.2)
    barrier = threading.Barrier(32)
    results: list[str] = []
    errors: list[BaseException] = []

    def worker(i: int) -> None:
        barrier.wait()
        try:
            results.append(adapter.chat(f"t{i}", stream=i % 2 == 0).text)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert errors == []
    assert len(results) == 32
    assert copilot.github.copilot_exchanges == 2
    assert 1 <= len(copilot.rejected) <= 32


def test_async_tasks_share_one_exchange(make: Callable[..., CopilotAdapter],
                                        copilot: CopilotFake) -> None:
    clock = Clock()
    adapter = make(token_manager=managed(copilot, clock))
    copilot.github.copilot_token_response(endpoints_api=copilot.url, delay=0.2)

    async def run() -> list[str]:
        answers = await asyncio.gather(*(adapter.achat(f"task {i}") for i in range(16)))
        return [a.text for a in answers]

    assert sorted(asyncio.run(run())) == sorted(f"echo: task {i}" for i in range(16))
    assert copilot.github.copilot_exchanges == 1


# -- login -------------------------------------------------------------------------------------------
def test_not_signed_in_is_a_clear_error_without_network(leaks: Leaks, env: Path) -> None:
    github = leaks.github(FakeGitHub().start())
    try:
        adapter = leaks.watch(CopilotAdapter(github_url=github.github_url,
                                             github_api_url=github.api_url))
        error = raises(leaks, AuthenticationError, adapter.chat, "Hi")
        assert error.message == NOT_SIGNED_IN
        error = raises(leaks, AuthenticationError, asyncio.run, adapter.achat("Hi"))
        assert error.message == NOT_SIGNED_IN
        result = adapter.validate()
        assert not result and NOT_SIGNED_IN in result.reason
        assert adapter.max_context_tokens == 128_000
        assert github.requests == []
    finally:
        github.close()


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_device_flow_login_through_on_device_code(leaks: Leaks, env: Path, mode: str) -> None:
    token_path = env / "login" / "github_token.json"
    with CopilotFake() as copilot:
        github = leaks.github(copilot.github)
        shown: list[DeviceCode] = []

        def on_device_code(code: DeviceCode) -> None:
            shown.append(code)
            # the user opens the page and approves while the adapter polls
            threading.Timer(0.1, github.approve, args=(code.user_code,)).start()

        adapter = leaks.watch(CopilotAdapter(
            token_path=token_path, github_url=github.github_url, github_api_url=github.api_url,
            on_device_code=on_device_code))
        assert not adapter.validate()  # validate never starts a login
        assert github.authorizations == []
        response = asyncio.run(adapter.achat("Hi")) if mode == "async" else adapter.chat("Hi")
        assert response.text == "echo: Hi"
        assert len(shown) == 1
        leaks.watch(shown[0])
        assert shown[0].verification_uri == f"{github.github_url}/login/device"
        approved = github.authorizations[0].access_token
        assert approved is not None
        assert stat.S_IMODE(token_path.stat().st_mode) == 0o600
        record = TokenStore(token_path).load_record()
        assert record is not None
        assert (record.github_token, record.user) == (approved, "octocat")
        assert adapter.token_source == str(token_path)
        assert adapter.validate()
        # a second adapter (no UI) finds the stored token
        again = leaks.watch(CopilotAdapter(token_path=token_path, github_url=github.github_url,
                                           github_api_url=github.api_url))
        assert again.chat("Hello").text == "echo: Hello"
        assert len(github.authorizations) == 1
        adapter.close()
        again.close()


def test_a_denied_device_login_raises(leaks: Leaks, env: Path) -> None:
    with CopilotFake() as copilot:
        github = leaks.github(copilot.github)

        def on_device_code(code: DeviceCode) -> None:
            github.deny(code.user_code)

        adapter = leaks.watch(CopilotAdapter(
            token_path=env / "t.json", github_url=github.github_url,
            github_api_url=github.api_url, on_device_code=on_device_code))
        error = raises(leaks, AuthenticationError, adapter.chat, "Hi")
        assert error.code == "access_denied"
        assert not (env / "t.json").exists()


def test_an_editor_login_is_used(leaks: Leaks, env: Path) -> None:
    with CopilotFake() as copilot:
        github = leaks.github(copilot.github)
        config = env / "xdg" / "github-copilot"
        config.mkdir(parents=True)
        host = github.github_url.split("//", 1)[1].split(":")[0]
        (config / "apps.json").write_text(json.dumps({
            f"{host}:Iv1.b507a08c87ecfe98": {"user": "octocat",
                                             "oauth_token": github.github_token}}))
        adapter = leaks.watch(CopilotAdapter(github_url=github.github_url,
                                             github_api_url=github.api_url))
        assert adapter.chat("Hi").text == "echo: Hi"
        assert adapter.token_source is not None and "apps.json" in adapter.token_source
        adapter.close()


# -- errors ------------------------------------------------------------------------------------------
def test_402_is_a_quota_error_that_says_when_it_resets(make: Callable[..., CopilotAdapter],
                                                       copilot: CopilotFake, leaks: Leaks) -> None:
    adapter = make(max_retries=2)
    copilot.push(Fail(402, "You have exceeded your premium request allowance.",
                      "quota_exceeded", headers={"retry-after": "7200"}))
    error = raises(leaks, RateLimitError, adapter.chat, "Hi")
    assert (error.status_code, error.code) == (402, "quota_exceeded")
    assert error.retryable is False
    assert error.retry_after == 7200
    assert "premium" in error.message and "resets in 2 hours" in error.message
    assert "premium request allowance" in error.message
    assert len(copilot.chat_requests) == 1  # never retried
    date = email.utils.formatdate(time.time() + 3 * 86400, usegmt=True)
    copilot.push(Fail(402, "Free quota used up.", headers={"retry-after": date}))
    error = raises(leaks, RateLimitError, adapter.chat, "Hi", stream=True)
    assert error.code == "quota_exceeded" and "resets in 3 days" in error.message
    copilot.push(Fail(402, "Quota exceeded."))
    error = raises(leaks, RateLimitError, adapter.chat, "Hi")
    assert error.retry_after is None and "resets" not in error.message


def test_429_honours_retry_after(make: Callable[..., CopilotAdapter], copilot: CopilotFake,
                                 leaks: Leaks) -> None:
    copilot.push(Fail(429, "Rate limited", "rate_limited",
                      headers={"retry-after": "7", "x-ratelimit-exceeded": "user_model_rate"}))
    error = raises(leaks, RateLimitError, make(max_retries=0).chat, "Hi")
    assert (error.status_code, error.retry_after, error.code) == (429, 7, "rate_limited")
    assert "user_model_rate" in error.message
    copilot.push(Fail(429, "Rate limited", headers={"retry-after": "0.05"}))
    assert make(max_retries=1).chat("Hi").text == "echo: Hi"
    copilot.push(Fail(429, "This client is blocked", "extension_blocked"))
    error = raises(leaks, RateLimitError, make(max_retries=2).chat, "Hi")
    assert error.retryable is False and "blocked" in error.message


def test_466_says_the_client_is_too_old(make: Callable[..., CopilotAdapter],
                                        copilot: CopilotFake, leaks: Leaks) -> None:
    copilot.push(Fail(466, "client version not supported"))
    error = raises(leaks, RequestError, make(max_retries=2).chat, "Hi")
    assert (error.status_code, error.code) == (466, "client_not_supported")
    assert "vscode/" in error.message and "update dispatch_nb" in error.message
    assert len(copilot.chat_requests) == 1


def test_5xx_is_retried_and_then_raised(make: Callable[..., CopilotAdapter],
                                        copilot: CopilotFake, leaks: Leaks) -> None:
    adapter = make(max_retries=1)
    adapter.retry_backoff = 0.01
    copilot.push(Fail(500, "oops"))
    assert adapter.chat("Hi").text == "echo: Hi"
    copilot.push(Fail(503, "upstream overloaded"), Fail(502, "bad gateway"))
    error = raises(leaks, ServerError, adapter.chat, "Hi")
    assert error.status_code == 502 and error.retryable


@pytest.mark.parametrize(("status", "message"), [(422, "Filtered by Responsible AI Service"),
                                                 (400, "off_topic")])
def test_content_filter_errors(make: Callable[..., CopilotAdapter], copilot: CopilotFake,
                               leaks: Leaks, status: int, message: str) -> None:
    copilot.push(Fail(status, message))
    error = raises(leaks, RequestError, make().chat, "Hi")
    assert (error.status_code, error.code) == (status, "content_filter")


def test_in_stream_errors_keep_the_partial_answer(make: Callable[..., CopilotAdapter],
                                                  copilot: CopilotFake, leaks: Leaks) -> None:
    copilot.push(Turn(text="abcdefgh", chunk=2, error_after=2,
                      error=Fail(500, "upstream failed", "server_error")))
    error = raises(leaks, ServerError, make(max_retries=2).chat, "Hi", stream=True)
    assert error.partial is not None and error.partial.text == "abcd"
    assert len(copilot.chat_requests) == 1  # output had started: no retry
    copilot.push(Turn(text="abcdefgh", chunk=2, error_after=1,
                      error=Fail(402, "premium requests used up", "quota_exceeded")))
    error = raises(leaks, RateLimitError, make().chat, "Hi", stream=True)
    assert error.code == "quota_exceeded"
    copilot.push(Turn(text="abcdefgh", chunk=2, error_after=1,
                      error=Fail(500, "upstream failed", "server_error")))
    error = raises(leaks, ServerError, make("gpt-5-codex").chat, "Hi", stream=True)
    assert error.partial is not None and error.partial.text == "ab"


def test_unknown_options_are_refused(make: Callable[..., CopilotAdapter]) -> None:
    with pytest.raises(TypeError, match="GitHub Copilot does not understand"):
        make().chat("Hi", frobnicate=True)


# -- the status command ------------------------------------------------------------------------------
def test_status_lists_the_models(copilot: CopilotFake, env: Path,
                                 monkeypatch: pytest.MonkeyPatch,
                                 capsys: pytest.CaptureFixture[str], leaks: Leaks) -> None:
    github = copilot.github
    monkeypatch.setenv("DISPATCH_NB_GITHUB_TOKEN", github.github_token)
    args = ["status", "--github-url", github.github_url, "--github-api-url", github.api_url,
            "--token-path", str(env / "none.json")]
    assert main([*args, "--models"]) == 0
    out = capsys.readouterr().out
    leaks.texts.append(out)
    assert "Models:         4" in out
    lines = [line.split() for line in out.splitlines() if line.startswith("    ")]
    assert [line[0] for line in lines] == PICKER_IDS
    assert lines[0][1:3] == ["0x", "128,000"]
    assert lines[2][1:3] == ["1x", "216,000"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "Models:" not in out
