"""Record/replay response cache: recorded against a real loopback server, replayed offline."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from dispatch_nb import (
    APIConnectionError,
    APITimeoutError,
    CancelToken,
    Message,
    RequestCancelled,
    RequestError,
    Response,
    ServerError,
    StreamDelta,
    TextBlock,
    ToolDefinition,
)
from dispatch_nb.adapter import ChatRequest
from dispatch_nb.cache import (
    CACHE_MODES,
    CachedAdapter,
    CacheMissError,
    ResponseCache,
    cache_key,
    default_cache_path,
    resolve_cache_mode,
    scrub_secrets,
)
from dispatch_nb.providers.fake import CanonicalAdapter

from ..fakes.canonical import CanonicalFake
from ..fakes.provider import Fail, ToolCall, Turn

WEATHER = ToolDefinition(
    name="get_weather",
    description="Current weather for a city",
    parameters={"type": "object", "properties": {"city": {"type": "string"}}},
)
RICH = Turn(
    text="Let me look that up for you, it will take a second.",
    thinking="The user wants the weather.",
    signature="sig-abc123",
    tool_calls=[ToolCall("call_1", "get_weather", {"city": "Paris"})],
    input_tokens=31,
    output_tokens=17,
    cache_read_tokens=5,
    chunk=4,
)
#: the key of GOLDEN_REQUEST; it must never change (recorded caches would stop matching)
GOLDEN_KEY = "58edf3ab6c52f5dc013b51679133aa4b39c54b49ac9a05f67c2d313f66e859f8"


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "lesson.dispatch-cache.jsonl"


def cached(fake: CanonicalFake, path: Path, mode: str, **kw: Any) -> CachedAdapter:
    pace = kw.pop("pace", "instant")
    label = kw.pop("label", None)
    inner = CanonicalAdapter("echo", base_url=fake.base_url, max_retries=0, **kw)
    return CachedAdapter(inner, ResponseCache(path, mode, pace=pace), label=label)


def offline(url: str, path: Path, mode: str = "replay", **kw: Any) -> CachedAdapter:
    """A cached adapter whose model server is gone: any real request fails to connect."""
    pace = kw.pop("pace", "instant")
    inner = CanonicalAdapter("echo", base_url=url, max_retries=0)
    return CachedAdapter(inner, ResponseCache(path, mode, pace=pace), **kw)


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text("utf-8").splitlines() if line.strip()]


# -- record, then replay offline ------------------------------------------------------------------
def test_replay_offline_gives_identical_response_and_deltas(fake: CanonicalFake,
                                                            path: Path) -> None:
    fake.push(RICH)
    recorder = cached(fake, path, "record", label="cell 1")
    with recorder.stream("Weather in Paris?", tools=[WEATHER], system="Be brief.") as stream:
        recorded_deltas = list(stream)
    recorded = stream.response
    assert recorded.thinking and recorded.tool_calls and recorded.usage.cache_read_tokens == 5
    url = fake.base_url
    fake.close()  # from here on, the model is unreachable

    with pytest.raises(APIConnectionError) as info:
        CanonicalAdapter("echo", base_url=url, max_retries=0).chat("Weather in Paris?")
    assert info.value.code == "network_error"

    player = offline(url, path)
    for _ in range(2):  # replaying twice gives the same
        with player.stream("Weather in Paris?", tools=[WEATHER], system="Be brief.") as replay:
            replayed_deltas = list(replay)
        assert replayed_deltas == recorded_deltas
        assert replay.response == recorded
    plain = player.chat("Weather in Paris?", tools=[WEATHER], system="Be brief.")
    assert plain == recorded
    seen: list[StreamDelta] = []
    assert player.chat("Weather in Paris?", tools=[WEATHER], system="Be brief.", stream=True,
                       on_delta=seen.append) == recorded
    assert seen == recorded_deltas

    async def main() -> tuple[Response, Response, list[StreamDelta]]:
        achat = await player.achat("Weather in Paris?", tools=[WEATHER], system="Be brief.")
        got: list[StreamDelta] = []
        async with player.astream("Weather in Paris?", tools=[WEATHER],
                                  system="Be brief.") as astream:
            async for delta in astream:
                got.append(delta)
        return achat, astream.response, got

    achat, astreamed, adeltas = asyncio.run(main())
    assert achat == astreamed == recorded
    assert adeltas == recorded_deltas

    [entry] = lines(path)
    assert entry["label"] == "cell 1"
    assert entry["provider"] == "fake" and entry["model"] == "echo"
    assert entry["request"] == {"messages": 1, "last_user": "Weather in Paris?",
                                "last_user_sha256": "c80a6b5cbcb65f69"}  # pinned
    assert entry["streamed"] is True
    assert [d["type"] for d in entry["deltas"]] == [d.type for d in recorded_deltas]
    times = [d["t"] for d in entry["deltas"]]
    assert times == sorted(times) and times[0] >= 0


def test_an_unstreamed_recording_replays_as_a_stream(fake: CanonicalFake, path: Path) -> None:
    fake.push(Turn(text="Plain answer.", tool_calls=[ToolCall("c1", "get_weather",
                                                              {"city": "Oslo"})]))
    recorded = cached(fake, path, "record").chat("Oslo?", tools=[WEATHER])
    url = fake.base_url
    fake.close()
    stream = offline(url, path).stream("Oslo?", tools=[WEATHER])
    deltas = list(stream)
    assert stream.response == recorded
    assert [d.type for d in deltas] == ["text_delta", "tool_use_start", "tool_use_delta",
                                        "tool_use_end"]
    assert deltas[-1].arguments == {"city": "Oslo"}
    assert lines(path)[0]["streamed"] is False


def test_a_multi_turn_conversation_replays(fake: CanonicalFake, path: Path) -> None:
    recorder = cached(fake, path, "record")
    history = [Message("user", "first")]
    first = recorder.chat(history)
    history += [first.to_message(), Message("user", "second")]
    second = recorder.chat(history, stream=True)
    url = fake.base_url
    fake.close()
    player = offline(url, path)
    history = [Message("user", "first")]
    again = player.chat(history)
    assert again == first
    history += [again.to_message(), Message("user", "second")]
    assert player.chat(history) == second


def test_recorded_pace_is_respected(fake: CanonicalFake, path: Path) -> None:
    fake.push(Turn(text="abcdefghij", chunk=1, delay=0.04))
    with cached(fake, path, "record").stream("slow please") as stream:
        list(stream)
    recorded_at = [d["t"] for d in lines(path)[0]["deltas"]]
    assert recorded_at[-1] - recorded_at[0] >= 0.3
    url = fake.base_url
    fake.close()

    began = time.monotonic()
    arrived: list[float] = []
    for _ in offline(url, path, pace="recorded").stream("slow please"):
        arrived.append(time.monotonic() - began)
    assert len(arrived) == len(recorded_at)
    for got, want in zip(arrived, recorded_at, strict=True):
        assert want - 0.01 <= got <= want + 0.15
    began = time.monotonic()
    list(offline(url, path).stream("slow please"))
    assert time.monotonic() - began < 0.1  # instant by default


async def test_async_replay_at_recorded_pace(fake: CanonicalFake, path: Path) -> None:
    fake.push(Turn(text="abcdef", chunk=1, delay=0.04))
    recorded = await cached(fake, path, "record").achat("slow", stream=True)
    last = lines(path)[0]["deltas"][-1]["t"]
    url = fake.base_url
    fake.close()
    began = time.monotonic()
    replayed = await offline(url, path, pace="recorded").achat("slow", stream=True)
    assert replayed == recorded
    assert last - 0.01 <= time.monotonic() - began <= last + 0.15


def test_replay_honours_cancel_and_timeout(fake: CanonicalFake, path: Path) -> None:
    fake.push(Turn(text="x" * 40, chunk=1, delay=0.02))
    cached(fake, path, "record").chat("long", stream=True)
    url = fake.base_url
    fake.close()
    player = offline(url, path, pace="recorded")
    token = CancelToken()
    seen: list[str] = []

    def on_delta(d: StreamDelta) -> None:
        seen.append(d.text or "")
        if len(seen) == 5:
            token.cancel()

    with pytest.raises(RequestCancelled) as info:
        player.chat("long", stream=True, on_delta=on_delta, cancel=token)
    assert info.value.code == "cancelled"
    assert info.value.partial is not None and info.value.partial.text == "".join(seen)
    recorded_at = [d["t"] for d in lines(path)[0]["deltas"]]  # 40 deltas, ~0.02 s apart
    midway = (recorded_at[0] + recorded_at[-1]) / 2
    with pytest.raises(APITimeoutError) as timed_out:
        player.chat("long", stream=True, timeout=midway)
    assert timed_out.value.code == "timeout"
    partial = timed_out.value.partial
    # stopped at the deadline, part-way through the recording, keeping what was replayed
    assert partial is not None and partial.text.startswith("x") and len(partial.text) < 40


# -- misses and modes -----------------------------------------------------------------------------
def test_a_miss_in_replay_mode_names_the_cell_and_how_to_record(fake: CanonicalFake,
                                                                path: Path) -> None:
    player = cached(fake, path, "replay", label="cell 3")
    with pytest.raises(CacheMissError) as info:
        player.chat("Summarize the French revolution in one line.")
    err = info.value
    assert isinstance(err, RequestError)
    assert err.code == "cache_miss" and err.label == "cell 3" and err.path == path
    assert "cell 3" in err.message
    assert "Summarize the French revolution" in err.message
    assert "--cache record" in err.message and "DISPATCH_NB_CACHE=record" in err.message
    assert str(path) in err.message
    # nothing is recorded at all: the file is named as missing, with where it was looked for
    assert not path.exists() and f"{path} does not exist" in err.message
    with pytest.raises(CacheMissError, match="this prompt") as raised:
        player.with_label(None).stream("another")
    assert raised.value.code == "cache_miss"
    with pytest.raises(CacheMissError) as raised:
        asyncio.run(player.achat("again"))
    assert raised.value.code == "cache_miss"
    assert fake.chat_requests == []  # nothing was sent


def test_a_miss_whose_prompt_is_recorded_after_another_conversation_says_so(
    fake: CanonicalFake, path: Path
) -> None:
    """The prompt is recorded, but after an earlier turn: the miss says the conversation before
    it differs (and how many messages each had), not only that nothing is recorded."""
    prompt = "Explain recursion in one sentence."
    recorder = cached(fake, path, "record", label="In[3]")
    history = [Message(role="user", content="Hello"), Message(role="assistant", content="Hi!")]
    recorder.chat([*history, Message(role="user", content=prompt)], system="Answer briefly.")
    assert lines(path)[0]["request"] == {"messages": 3, "last_user": prompt,
                                         "last_user_sha256": hashlib.sha256(prompt.encode()).hexdigest()[:16]}
    sent = len(fake.chat_requests)
    player = cached(fake, path, "replay", label="In[10]")
    with pytest.raises(CacheMissError) as info:  # the same prompt alone (a fresh kernel)
        player.chat(prompt, system="Answer briefly.")
    err = info.value
    assert err.code == "cache_miss" and err.label == "In[10]"
    assert err.earlier == 0 and err.recorded_earlier == (2,)
    assert "no recorded answer for In[10]" in err.message and str(path) in err.message
    assert ("The same message to fake:echo is recorded there, but after a different "
            "conversation: 2 earlier messages before it, here no earlier message") in err.message
    assert "run it from the top in a fresh kernel" in err.message
    # recorded alone, replayed after a turn: sending it alone is the way out
    recorder.chat("What is a stack?", system="Answer briefly.")
    with pytest.raises(CacheMissError) as info:
        player.chat([*history, Message(role="user", content="What is a stack?")],
                    system="Answer briefly.")
    assert info.value.code == "cache_miss" and info.value.recorded_earlier == (0,)
    assert "after a different conversation: no earlier message before it, here 2 earlier " \
           "messages" in info.value.message
    assert "or this message alone" in info.value.message
    # as many messages, another system prompt: it says what else may differ
    with pytest.raises(CacheMissError) as info:
        player.chat("What is a stack?", system="Answer at length.")
    assert info.value.code == "cache_miss" and info.value.recorded_earlier == (0,)
    assert "after as many messages, but the conversation before it, the system prompt" \
           in info.value.message
    # a prompt never recorded: the plain miss
    with pytest.raises(CacheMissError) as info:
        player.chat("Never recorded.")
    assert info.value.code == "cache_miss" and info.value.recorded_earlier == ()
    assert "is recorded there" not in info.value.message
    assert len(fake.chat_requests) == sent + 1  # the one recording; replay sent nothing


def test_read_write_replays_hits_and_records_misses(fake: CanonicalFake, path: Path) -> None:
    adapter = cached(fake, path, "read-write")
    first = adapter.chat("one")
    assert len(fake.chat_requests) == 1
    assert adapter.chat("one") == first
    assert adapter.chat("one", stream=True) == first
    assert len(fake.chat_requests) == 1  # hits never reach the model
    adapter.chat("two")
    assert len(fake.chat_requests) == 2
    assert len(lines(path)) == 2
    # another option is another request
    adapter.chat("one", temperature=0.5)
    assert len(fake.chat_requests) == 3


def test_record_mode_always_asks_and_replaces_in_place(fake: CanonicalFake, path: Path) -> None:
    adapter = cached(fake, path, "record")
    fake.push(Turn(text="A1"), Turn(text="B1"), Turn(text="A2"))
    adapter.chat("a")
    adapter.chat("b")
    assert adapter.chat("a").text == "A2"
    assert len(fake.chat_requests) == 3
    entries = lines(path)
    assert [e["response"]["content"][0]["text"] for e in entries] == ["A2", "B1"]
    url = fake.base_url
    fake.close()
    assert offline(url, path).chat("a").text == "A2"


def test_off_mode_is_a_pass_through(fake: CanonicalFake, path: Path) -> None:
    adapter = cached(fake, path, "off")
    adapter.chat("x")
    list(adapter.stream("y"))
    assert len(fake.chat_requests) == 2
    assert not path.exists()


def test_failures_and_abandoned_streams_are_not_recorded(fake: CanonicalFake, path: Path) -> None:
    adapter = cached(fake, path, "read-write")
    fake.push(Fail(500, "boom"))
    with pytest.raises(ServerError) as info:
        adapter.chat("x")
    assert (info.value.status_code, info.value.code) == (500, "server_error")
    fake.push(Turn(text="y" * 50, chunk=1, delay=0.01))
    stream = adapter.stream("x")
    next(iter(stream))
    stream.close()
    assert stream.partial.text == "y"
    assert not path.exists() or lines(path) == []


def test_mode_and_path_resolution(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("DISPATCH_NB_CACHE", raising=False)
    assert resolve_cache_mode() == "off"
    monkeypatch.setenv("DISPATCH_NB_CACHE", "Replay")
    assert resolve_cache_mode() == "replay"
    assert ResponseCache(tmp_path / "c.jsonl").mode == "replay"
    assert resolve_cache_mode("record") == "record"
    monkeypatch.setenv("DISPATCH_NB_CACHE", "sometimes")
    with pytest.raises(ValueError, match="DISPATCH_NB_CACHE") as info:
        resolve_cache_mode()
    assert all(mode in str(info.value) for mode in CACHE_MODES)
    assert default_cache_path({"DISPATCH_NB_CACHE_FILE": "/x/y.jsonl"}) == Path("/x/y.jsonl")
    assert default_cache_path({"JPY_SESSION_NAME": "/home/t/lessons/intro.ipynb"}) == \
        Path("/home/t/lessons/intro.dispatch-cache.jsonl")
    assert default_cache_path({}) == Path("dispatch-cache.jsonl")


# -- keys -----------------------------------------------------------------------------------------
def golden_request() -> ChatRequest:
    return ChatRequest(
        messages=[Message("user", "Hello, wörld"), Message("assistant", "Hi!"),
                  Message("user", [TextBlock("What is 2 + 2?")])],
        system="You are terse.",
        tools=[WEATHER],
        max_tokens=256,
        temperature=0.7,
        options={"stop": ["\n\n"], "top_p": 0.9, "max_retries": 5,
                 "extra_headers": {"x-trace": "1"}},
    )


GOLDEN_SCRIPT = (
    "from tests.core.test_cache import golden_request\n"
    "from dispatch_nb.cache import cache_key\n"
    "print(cache_key('openai', 'gpt-4.1', golden_request()))\n"
)


def test_key_is_stable_across_processes_and_pinned() -> None:
    here = cache_key("openai", "gpt-4.1", golden_request())
    keys = set()
    for seed in ("0", "12345"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        out = subprocess.run([sys.executable, "-c", GOLDEN_SCRIPT], capture_output=True,
                             text=True, timeout=60, env=env, check=True,
                             cwd=Path(__file__).resolve().parents[2]).stdout
        keys.add(out.strip())
    assert keys == {here}
    assert here == GOLDEN_KEY


def test_what_changes_the_key() -> None:
    base = golden_request()
    key = cache_key("openai", "gpt-4.1", base)

    def variant(**changes: Any) -> str:
        data = {**base.__dict__, **changes}
        return cache_key("openai", "gpt-4.1", ChatRequest(**data))

    assert cache_key("anthropic", "gpt-4.1", base) != key
    assert cache_key("openai", "gpt-4o", base) != key
    assert variant(system="You are chatty.") != key
    assert variant(temperature=0.2) != key
    assert variant(max_tokens=100) != key
    assert variant(tools=[]) != key
    assert variant(messages=base.messages[:1]) != key
    assert variant(options={**base.options, "top_p": 0.5}) != key
    # retries, HTTP headers and streaming do not shape the answer
    assert variant(options={**base.options, "max_retries": 0, "extra_headers": {}}) == key
    assert variant(stream=not base.stream) == key
    # a str message and one equal TextBlock are the same request
    as_blocks = [Message(m.role, [TextBlock(m.content)]) if isinstance(m.content, str) else m
                 for m in base.messages]
    assert variant(messages=as_blocks) == key


# -- secrets --------------------------------------------------------------------------------------
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "in-pieces"])
def test_secrets_never_reach_the_file(fake: CanonicalFake, path: Path, stream: bool) -> None:
    """Streamed in 3-character pieces (as a model repeats a key, token by token), no piece holds
    a secret whole: each streamed text is scanned whole, and the deltas still make the answer."""
    key = "k3y-VALUE-never-stored-1234"
    adapter = cached(fake, path, "read-write", api_key=key)
    prompt = (f"my key is {key}, my token ghp_{'A1b2C3d4E5' * 4}, "
              f"header Authorization: Bearer abc.def.ghi-123456 and sk-proj-{'Z9' * 12}")
    if stream:
        fake.push(Turn(text=f"echo: {prompt}", chunk=3))
    response = adapter.chat(prompt, stream=stream)  # the fake echoes the prompt back
    assert key in response.text  # the live answer is untouched...
    assert fake.last_request.header("authorization") == f"Bearer {key}"
    text = path.read_text("utf-8")
    assert key not in text  # ...but nothing secret is written
    assert "ghp_" not in text and "abc.def.ghi" not in text and "sk-proj-" not in text
    assert "[REDACTED]" in text
    [line] = [json.loads(raw) for raw in text.splitlines()]
    streamed = "".join(d["text"] for d in line["deltas"] if d["type"] == "text_delta")
    for secret in (key, "ghp_", "abc.def.ghi", "sk-proj-"):
        assert secret not in streamed, streamed
    assert streamed == line["response"]["content"][0]["text"]  # replayed as it is stored
    # the scrubbed entry replays as stored
    url = fake.base_url
    fake.close()
    replayed = offline(url, path).chat(prompt)
    assert key not in replayed.text and "[REDACTED]" in replayed.text


def test_scrub_secrets() -> None:
    data = {
        "a": "token sk-ant-api03-abcdefghijklmnopqrst and gho_abcdefghijklmnopqrstuvwx",
        "b": ["Bearer eyJhbGciOiJIUzI1NiJ9.payload", "github_pat_11ABCDEFG0123456789_abcdef"],
        "c": "tid=0123456789abcdef;exp=1700000000;sku=free:deadbeef",
        "d": "the word token alone, sk-short, and the custom s3cr3t-value-xyz",
        "e": "A token representation; bearer bonds; Bearer instrument; tokenization matters.",
        "n": 5,
    }
    out = scrub_secrets(data, secrets=["s3cr3t-value-xyz", "short"])
    flat = json.dumps(out)
    for secret in ("sk-ant-api03", "gho_", "eyJhbGci", "github_pat_", "tid=0123", "s3cr3t"):
        assert secret not in flat
    assert out["d"].startswith("the word token alone, sk-short")  # short values are not keys
    assert out["e"] == data["e"]  # prose about tokens is not a secret
    assert out["n"] == 5


def test_a_secret_split_between_pieces_is_redacted_where_it_begins() -> None:
    from dispatch_nb.errors import redact_pieces

    secret = "s3cr3t-value-xyz"
    pieces = ["my key is s", "3cr3t-v", "", "alue-", "xyz, and ", "s3cr3t-value-xyz", " again"]
    out = redact_pieces(pieces, [secret], patterns=False)
    assert out == ["my key is [REDACTED]", "", "", "", ", and ", "[REDACTED]", " again"]
    # patterns too, keeping what a pattern keeps ("Bearer "), across a boundary
    out = redact_pieces(["Authorization: Bea", "rer abc.def", ".ghi-123456 ok"])
    assert "".join(out) == "Authorization: Bearer [REDACTED] ok" and len(out) == 3
    assert redact_pieces(["nothing ", "secret here"]) == ["nothing ", "secret here"]


def test_recorded_deltas_add_up_to_the_stored_answer_after_scrubbing() -> None:
    """A pattern's word boundary differs in a piece ("de" + "sk-lamp-…" is "desk-lamp-…", no
    key): the pieces are not scanned one by one after the whole text; a tool call's argument
    pieces belong to their call's id even when two calls stream interleaved."""
    text = "de" + "sk-lamp-with-long-name-x ok"
    entry = {"deltas": [{"t": 0, "type": "text_delta", "text": "de"},
                        {"t": 0, "type": "text_delta", "text": "sk-lamp-with-long-name-x ok"}],
             "response": {"content": [{"type": "text", "text": text}]}}
    out = scrub_secrets(entry)
    assert "".join(d["text"] for d in out["deltas"]) == out["response"]["content"][0]["text"]
    key = "sk-" + "A" * 20
    calls = [{"type": "tool_use_start", "tool_call_id": "a", "tool_name": "f"},
             {"type": "tool_use_start", "tool_call_id": "b", "tool_name": "g"},
             {"type": "tool_use_delta", "tool_call_id": "a", "argument_delta": '{"k": "' + key[:12]},
             {"type": "tool_use_delta", "tool_call_id": "b", "argument_delta": '{"x": 1}'},
             {"type": "tool_use_delta", "tool_call_id": "a", "argument_delta": key[12:] + '"}'}]
    pieces = [d.get("argument_delta") for d in scrub_secrets({"deltas": calls})["deltas"]]
    assert key[:12] not in "".join(p for p in pieces if p) and '{"x": 1}' in pieces


# -- files: concurrency, damage, compaction -------------------------------------------------------
def test_concurrent_writers_in_threads(fake: CanonicalFake, path: Path) -> None:
    errors: list[BaseException] = []

    def writer(n: int) -> None:
        try:
            adapter = cached(fake, path, "read-write", label=f"thread {n}")
            for i in range(5):
                adapter.chat(f"prompt {n}-{i}", stream=i % 2 == 0)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors
    entries = lines(path)
    assert len(entries) == 40
    assert len({e["key"] for e in entries}) == 40


WRITER_SCRIPT = """
import sys
from dispatch_nb.adapter import ChatRequest
from dispatch_nb.cache import ResponseCache, cache_key
from dispatch_nb.types import Message, Response, StreamDelta, TextBlock
cache = ResponseCache(sys.argv[1], "record")
for i in range(20):
    # even i: a prompt only this process records (appended); odd i: a prompt every process
    # records (the file is rewritten with the line replaced)
    prompt = f"{sys.argv[2]} {i}" if i % 2 == 0 else f"shared {i}"
    request = ChatRequest(messages=[Message("user", prompt)])
    text = f"answer from {sys.argv[2]} " + "x" * 5000
    response = Response(content=[TextBlock(text)], model="m", stop_reason="end_turn")
    cache.record(cache_key("p", "m", request), provider="p", model="m", request=request,
                 deltas=[(0.0, StreamDelta(type="text_delta", text=text))], response=response,
                 streamed=True)
"""


def test_concurrent_writers_in_processes(path: Path) -> None:
    procs = [subprocess.Popen([sys.executable, "-c", WRITER_SCRIPT, str(path), f"w{n}"],
                              cwd=Path(__file__).resolve().parents[2]) for n in range(3)]
    for p in procs:
        assert p.wait(60) == 0
    entries = lines(path)  # every line is whole JSON
    prompts = sorted(e["request"]["last_user"] for e in entries)
    # nothing lost to a rewrite racing an append, no duplicates
    assert prompts == sorted([f"w{n} {i}" for n in range(3) for i in range(0, 20, 2)]
                             + [f"shared {i}" for i in range(1, 20, 2)])


def test_damaged_lines_are_skipped_and_duplicates_resolved(fake: CanonicalFake, path: Path,
                                                           caplog: pytest.LogCaptureFixture
                                                           ) -> None:
    fake.push(Turn(text="good"))
    recorded = cached(fake, path, "record").chat("q")
    [entry] = lines(path)
    older = {**entry, "response": {**entry["response"],
                                   "content": [{"type": "text", "text": "older"}]}}
    with path.open("a", encoding="utf-8") as fh:
        fh.write('{"truncated": tr\n')
    original = path.read_text("utf-8")
    path.write_text(json.dumps(older) + "\n" + original, encoding="utf-8")  # a merge leftover
    url = fake.base_url
    fake.close()
    with caplog.at_level(logging.WARNING, logger="dispatch_nb"):
        assert offline(url, path).chat("q") == recorded  # the last line wins
    assert "not a cache entry" in caplog.text
    cache = ResponseCache(path, "replay")
    assert cache.compact() == 1
    assert len(path.read_text("utf-8").splitlines()) == 1
    assert offline(url, path).chat("q") == recorded


# -- the wrapper is the adapter -------------------------------------------------------------------
def test_cached_adapter_delegates_identity(fake: CanonicalFake, path: Path) -> None:
    adapter = cached(fake, path, "read-write", label="cell 1")
    assert adapter.model_name == "echo"
    assert adapter.provider_name == "fake"
    assert adapter.display_name == adapter.inner.display_name
    assert [m.id for m in adapter.list_models()] == ["echo"]
    assert adapter.base_url == adapter.inner.base_url  # other attributes come from the inner one
    assert adapter.with_label("cell 2").label == "cell 2"
    assert adapter.with_label("cell 2").cache is adapter.cache
    with pytest.raises(TypeError, match="does not understand"):
        adapter.chat("x", frobnicate=True)
    simple = CachedAdapter(adapter.inner, mode="record", path=path)
    assert simple.cache.mode == "record" and simple.cache.path == path


@pytest.mark.local
def test_local_model_record_and_replay(tmp_path: Path) -> None:
    from dispatch_nb.providers.local import LocalAdapter, local_model_available

    if not local_model_available():
        pytest.skip("the local extra is not installed")
    path = tmp_path / "local.dispatch-cache.jsonl"
    recorder = CachedAdapter(LocalAdapter(), ResponseCache(path, "record"), label="cell 1")
    with recorder.stream("Name a planet.", max_tokens=12) as stream:
        recorded_deltas = list(stream)
    player = CachedAdapter(LocalAdapter(), ResponseCache(path, "replay"))
    with player.stream("Name a planet.", max_tokens=12) as replay:
        assert list(replay) == recorded_deltas
    assert replay.response == stream.response


def test_a_session_tool_loop_replays_offline(fake: CanonicalFake, path: Path) -> None:
    from dispatch_nb import Session, tool

    calls: list[str] = []

    @tool
    def get_weather(city: str) -> str:
        """Current weather for a city."""
        calls.append(city)
        return f"21 °C in {city}"

    fake.push(Turn(text="Checking.", tool_calls=[ToolCall("call_1", "get_weather",
                                                          {"city": "Rome"})]),
              Turn(text="It is 21 °C in Rome."))
    recorded = Session(cached(fake, path, "record"), tools=[get_weather]).send("Weather in Rome?")
    assert recorded.text == "It is 21 °C in Rome." and calls == ["Rome"]
    url = fake.base_url
    fake.close()
    session = Session(offline(url, path), tools=[get_weather])
    replayed = session.send("Weather in Rome?")
    assert replayed == recorded
    assert calls == ["Rome", "Rome"]  # the tool really ran again; only the model was replayed
    assert len(lines(path)) == 2


def test_opaque_signatures_are_never_rewritten_by_patterns() -> None:
    from dispatch_nb.cache import scrub_secrets

    blob = "EqQBAB-sk-" + "A" * 30  # base64 that happens to look like a key
    entry = {
        "response": {"content": [{"type": "thinking", "thinking": "hm", "signature": blob,
                                  "provider_data": {"encrypted_content": blob}}],
                     "text": "leaked sk-" + "B" * 30},
    }
    clean = scrub_secrets(entry, secrets={"sk-real-key-12345678"})
    block = clean["response"]["content"][0]
    assert block["signature"] == blob
    assert block["provider_data"]["encrypted_content"] == blob
    assert clean["response"]["text"] == "leaked [REDACTED]"
    # an exact known secret is removed even from opaque fields
    assert scrub_secrets({"signature": "x sk-real-key-12345678"},
                         secrets={"sk-real-key-12345678"}) == {"signature": "x [REDACTED]"}


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_a_retried_call_records_its_answer_not_its_retries(
    fake: CanonicalFake, tmp_path: Path, asynchronous: bool
) -> None:
    fake.push(Fail(503, "busy"), Turn(text="after a retry", chunk=4))
    inner = CanonicalAdapter("echo", base_url=fake.base_url, max_retries=1)
    inner.retry_backoff = 0.01
    model = CachedAdapter(inner, ResponseCache(tmp_path / "c.jsonl", mode="record"))

    async def astreamed() -> list[Any]:
        async with model.astream("q") as stream:
            return [d async for d in stream]

    seen = asyncio.run(astreamed()) if asynchronous else list(model.stream("q"))
    assert seen[0].type == "retry"  # the caller saw the retry...
    entry = json.loads((tmp_path / "c.jsonl").read_text().splitlines()[-1])
    assert "retry" not in {d["type"] for d in entry["deltas"]}  # ...the recording did not keep it
    replayed = CachedAdapter(inner, ResponseCache(tmp_path / "c.jsonl", mode="replay"))
    assert [d.type for d in replayed.stream("q")] == [d.type for d in seen[1:]]
    inner.close()


def test_a_long_prompt_known_only_by_its_start_gets_no_same_prompt_hint(tmp_path: Path) -> None:
    """The file keeps the start of a long message only: two rows that share a long preamble are
    not "the same prompt recorded after another conversation"."""
    cache = ResponseCache(tmp_path / "long.jsonl", mode="read-write")
    short = ChatRequest(messages=[Message("user", "Is it good?")])
    preamble = "Classify the following review. " * 10
    recorded = ChatRequest(messages=[Message("user", preamble + "Loved it.")])
    for request in (short, recorded):
        cache.record(cache_key("p", "m", request), provider="p", model="m", request=request,
                     response=Response(content=[TextBlock(text="ok")], model="m"), streamed=False)
    # a short prompt is known whole: the same one after another conversation is found
    earlier = [Message("user", "Hi"), Message("assistant", "Hello"), Message("user", "Is it good?")]
    assert len(cache.same_prompt("p", "m", earlier)) == 1
    assert cache.same_prompt("p", "m", [Message("user", preamble + "Hated it.")]) == []


def test_a_miss_whose_prompt_differs_only_in_spacing_says_so(fake: CanonicalFake,
                                                              path: Path) -> None:
    """The file keeps a fingerprint of the whole last user message: a prompt recorded with two
    spaces where this one has one is not "the same message after as many messages" (its preview
    reads the same), it is another prompt, and the miss says how it differs."""
    spaced, single = ("What is photosynthesis?  Answer in two sentences.",
                      "What is photosynthesis? Answer in two sentences.")
    recorder = cached(fake, path, "record")
    for prompt in (spaced, "Name one planet.\n\nOnly its name."):
        recorder.chat(prompt, max_tokens=80)
    player = cached(fake, path, "replay", label="In[2]")
    for replayed in (single, "Name one planet. Only its name.", "Name one planet.\nOnly its name."):
        with pytest.raises(CacheMissError) as info:
            player.chat(replayed, max_tokens=80)
        err = info.value
        assert err.code == "cache_miss" and err.spacing and err.recorded_earlier == (), replayed
        assert ("A message to fake:echo that differs from this one only in spaces or line "
                "breaks is recorded there") in err.message
        assert "after as many messages" not in err.message
    # the same prompt with another option: what it said before, now only when it is true
    with pytest.raises(CacheMissError) as info:
        player.chat(spaced, max_tokens=81)
    assert info.value.code == "cache_miss" and info.value.recorded_earlier == (0,)
    assert not info.value.spacing and "after as many messages" in info.value.message
    # a long prompt is known by its fingerprint, not only by its start
    long = "Classify the following review. " * 10 + "Loved it."
    recorder.chat(long)
    with pytest.raises(CacheMissError) as info:
        player.chat([Message("user", "Hi"), Message("assistant", "Hello"), Message("user", long)])
    assert info.value.code == "cache_miss" and info.value.recorded_earlier == (0,)
    assert "after a different conversation" in info.value.message


def test_a_file_recorded_without_fingerprints_still_replays_and_misses_truthfully(
    fake: CanonicalFake, path: Path
) -> None:
    """Lines written before the fingerprint replay as before; after a miss, their prompt (known
    only with its spaces collapsed) counts only where spacing cannot change the diagnosis: a
    different conversation before it."""
    recorder = cached(fake, path, "record")
    recorder.chat("What is photosynthesis?  Answer in two sentences.")
    history = [Message(role="user", content="Hello"), Message(role="assistant", content="Hi!")]
    recorder.chat([*history, Message(role="user", content="What is a stack?")])
    old = lines(path)
    for entry in old:
        del entry["request"]["last_user_sha256"]
    path.write_text("".join(json.dumps(e) + "\n" for e in old), "utf-8")
    player = cached(fake, path, "replay")
    assert player.chat("What is photosynthesis?  Answer in two sentences.").text
    with pytest.raises(CacheMissError) as info:  # as many messages: maybe only the spacing differs
        player.chat("What is photosynthesis? Answer in two sentences.")
    assert info.value.code == "cache_miss" and info.value.recorded_earlier == ()
    assert not info.value.spacing and "is recorded there" not in info.value.message
    with pytest.raises(CacheMissError) as info:  # another conversation: that is true regardless
        player.chat("What is a stack?")
    assert info.value.code == "cache_miss" and info.value.recorded_earlier == (2,)
    assert "after a different conversation" in info.value.message
