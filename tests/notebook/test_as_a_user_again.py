"""Issue 23, "the notebook as people use it" (points 9 and 10): what a user reads when something
goes wrong, through a real IPython shell (the recording front end of conftest.py) against the
loopback canonical fake. What needs a browser (the layout, the progress widget, the compare
headers) is in tests/e2e/test_notebook_ui.py.
"""

from __future__ import annotations

import re
import socket
from typing import Any

import pytest
from IPython.core.error import UsageError

from dispatch_nb.notebook.display import ChatError
from tests.fakes.provider import Turn
from tests.notebook.conftest import run

REVIEW = (
    "from pydantic import BaseModel\n"
    "class Review(BaseModel):\n"
    "    product: str\n"
    "    stars: int\n"
)
CUT = Turn(text='{"product": "a kettle that boils water fast and', stop_reason="max_tokens")


def shown(error: BaseException) -> str:
    """What IPython shows of ``error`` (its ``_render_traceback_``), without the colours."""
    render = getattr(error, "_render_traceback_", None)
    text = "\n".join(render()) if render else str(error)
    return re.sub(r"\x1b\[[0-9;]*m", "", text)


def test_a_cut_structured_answer_suggests_bounding_the_schema(shell: Any, fake: Any) -> None:
    """9. Cut at max_tokens: bound strings and lists (Field(max_length=…)); the magic names
    --max-tokens, the Python API max_tokens=."""
    run(shell, REVIEW)
    fake.push(CUT)
    error = run(shell, "%%chat --schema Review\nReview: a great kettle.").error_in_exec
    assert isinstance(error, ChatError) and error.original is not None
    assert error.original.code == "output_truncated"  # type: ignore[attr-defined]
    text = shown(error)
    assert "cut off at max_tokens" in text and "Field(max_length=" in text
    assert "--max-tokens" in text and "max_tokens=" not in text and "`" not in text
    assert len(text.splitlines()) == 2, text

    from dispatch_nb import OutputValidationError, connect

    fake.push(CUT)
    with pytest.raises(OutputValidationError) as info:
        connect("fake:echo").chat("Review: a great kettle.", output=shell.user_ns["Review"])
    assert info.value.code == "output_truncated"
    assert "Field(max_length=" in info.value.message and "pass a larger" not in info.value.message


def test_magic_errors_speak_the_magics_language(
    shell: Any, fake: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """9. No Python-API advice (api_key=, output=) in a magic's error, no Markdown backticks in
    what the terminal shows."""
    for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    for spec, provider in (("openai:gpt-4.1", "openai"), ("anthropic:claude-sonnet-4-5",
                                                           "anthropic")):
        error = run(shell, f"%%chat -m {spec}\nhello").error_in_exec
        assert isinstance(error, ChatError), error
        text = shown(error)
        assert "API key" in text and f"%chat key {provider}" in text, text
        assert "api_key=" not in text and "`" not in text, text
    run(shell, "empty = {}")
    with pytest.raises(UsageError) as info:
        shell.run_cell_magic("chat", "--schema empty", "hello")
    assert "--schema empty: the schema is an empty dict" in str(info.value)
    assert "output=" not in str(info.value)
    assert fake.chat_requests == []


def test_a_replay_miss_is_two_lines_pointing_at_cache_off(shell: Any, fake: Any) -> None:
    """10. A replay miss says what is missing, then the fix once: --cache off. (The cache file
    exists: a file that does not is named as missing, test_magics.py.)"""
    assert run(shell, "%%chat --cache record --no-history\nSomething else.").success
    sent = len(fake.chat_requests)
    error = run(shell, "%%chat --cache replay\nNever recorded.").error_in_exec
    assert isinstance(error, ChatError) and error.title == "CacheMissError"
    text = shown(error)
    lines = text.splitlines()
    assert len(lines) == 2, text
    assert "Never recorded." in lines[0] and "fake:echo" in lines[0]
    assert "--cache off" in lines[1]
    assert text.count("--cache read-write") <= 1 and "--cache record" not in text, text
    assert len(fake.chat_requests) == sent


def test_an_expression_that_raises_stops_the_cell(shell: Any, fake: Any) -> None:
    """10. {1/0}, the docs' example, stops the cell with one line; constants stay as written and
    a computation is evaluated like any expression."""
    error = run(shell, "%%chat\nWhat is {1/0}?").error_in_exec
    assert isinstance(error, ChatError) and error.title == "Prompt error"
    assert "{1/0} in the prompt raised ZeroDivisionError" in shown(error)
    assert fake.chat_requests == []
    assert run(shell, '%%chat\nKeep {"a": 1}, {1, 2} and {} but compute {2**10}.').success
    assert fake.chat_requests[-1].json["messages"][-1]["content"] == (
        'Keep {"a": 1}, {1, 2} and {} but compute 1024.'
    )


def test_a_misspelt_option_gets_a_did_you_mean(shell: Any, fake: Any) -> None:
    """10. --temprature → did you mean --temperature? (in %%chat and %chat alike)."""
    with pytest.raises(UsageError, match=r"--temprature 0\.5 \(did you mean --temperature\?\)"):
        shell.run_cell_magic("chat", "--temprature 0.5", "hello")
    with pytest.raises(UsageError, match=r"\(did you mean --max-tokens\?\)\nusage: %%chat"):
        shell.run_cell_magic("chat", "--max-tokns 5", "hello")
    with pytest.raises(UsageError, match=r"\(did you mean --force\?\)"):
        shell.run_line_magic("chat", "login --forse")
    with pytest.raises(UsageError, match=r"--modle gpt \(did you mean --model\?\)"):
        shell.run_cell_magic("chat", "--modle gpt", "hello")  # a long name the usage line omits
    with pytest.raises(UsageError) as info:
        shell.run_cell_magic("chat", "--zzz", "hello")
    assert "did you mean" not in str(info.value)
    # a misspelt choice: a %chat command, a format
    with pytest.raises(UsageError, match=r"invalid choice: 'sttus' .*\(did you mean status\?\)"):
        shell.run_line_magic("chat", "sttus")
    with pytest.raises(UsageError, match=r"\(did you mean markdown\?\)\nusage: %%chat"):
        shell.run_cell_magic("chat", "-f mrkdown", "hello")
    with pytest.raises(UsageError) as info:
        shell.run_line_magic("chat", "xyz")
    assert "did you mean" not in str(info.value)
    assert fake.chat_requests == []


def test_a_refused_port_names_the_url_plainly(
    shell: Any, fake: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """10. Nothing listens at the URL: the error names that URL as written (http://...), not
    aiohttp's "Cannot connect to host ... ssl:default"."""
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("DISPATCH_NB_FAKE_URL", f"http://127.0.0.1:{port}")
    error = run(shell, "%%chat\nhello").error_in_exec
    assert isinstance(error, ChatError) and error.title == "APIConnectionError"
    text = shown(error)
    assert f"could not connect to http://127.0.0.1:{port}/" in text, text
    assert "ssl" not in text and "Cannot connect to host" not in text, text


def test_the_python_recipe_replays_and_says_so(
    shell: Any, fake: Any, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """10. One recipe for replaying from Python (``cached_model``, docs/record-replay.md): a
    replayed answer is the recorded one (``==``) and its footer says "replayed" as %%chat's
    does; nothing is sent."""
    path = tmp_path / "lesson.dispatch-cache.jsonl"
    shell.user_ns["path"] = str(path)
    run(shell, REVIEW + "from dispatch_nb.cache import cached_model")
    monkeypatch.setenv("DISPATCH_NB_CACHE", "record")
    fake.push(Turn(text='{"product": "kettle", "stars": 5}'))
    result = run(shell, "llm = cached_model('fake:echo', path)\n"
                        "first = llm.chat('Review: a great kettle.', output=Review)")
    assert result.success, result.error_in_exec
    recorded = shell.user_ns["first"]._repr_markdown_()  # what Out shows
    assert "replayed" not in recorded and "kettle" in recorded
    sent = len(fake.chat_requests)
    monkeypatch.setenv("DISPATCH_NB_CACHE", "replay")
    result = run(shell, "llm = cached_model('fake:echo', path)\n"
                        "again = llm.chat('Review: a great kettle.', output=Review)")
    assert result.success, result.error_in_exec
    assert len(fake.chat_requests) == sent
    shown_md = shell.user_ns["again"]._repr_markdown_()
    assert re.search(r"<sub>fake:echo · .*replayed</sub>", shown_md), shown_md
    assert shell.user_ns["again"] == shell.user_ns["first"]
    assert shell.user_ns["again"].parsed.stars == 5
    run(shell, "with llm.stream('Review: a great kettle.', output=Review) as s:\n"
               "    list(s)\nstreamed = s.response")
    assert "replayed" in shell.user_ns["streamed"]._repr_markdown_()
