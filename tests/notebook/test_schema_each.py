"""``%%chat --schema NAME`` and ``%%chat --each NAME``: through IPython's shell and a real kernel.

The loopback canonical fake answers a structured request with JSON naming the model it was asked
of and the prompt it got (:class:`JsonEchoFake`), so a table cell under the wrong model column or
the wrong input row cannot pass.
"""

from __future__ import annotations

import _thread
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import nbformat
import pytest
from IPython.core.error import UsageError
from nbformat.v4 import new_code_cell, new_notebook

from dispatch_nb.notebook.display import ChatInterrupted
from tests.fakes.batching import BatchFake
from tests.fakes.canonical import CanonicalFake
from tests.fakes.provider import Fail, Turn
from tests.fakes.server import RecordedRequest, wait_for
from tests.kernels import notebook_client
from tests.notebook.conftest import fake_kernel_env, run, serve_fake

WIDGET_MIME = "application/vnd.jupyter.widget-view+json"

SETUP = (
    "from pydantic import BaseModel\n"
    "class Echo(BaseModel):\n"
    "    model: str\n"
    "    prompt: str\n"
)


class JsonEchoFake(CanonicalFake):
    """The canonical fake; a request with a schema is answered ``{"model", "prompt"}`` (two items,
    the second's prompt ``"second"``, when the schema's root is wrapped as ``{"result": [...]}``)."""

    def default_turn(self, request: RecordedRequest) -> Any:
        body = request.json or {}
        output = body.get("output")
        with self._lock:
            scripted = bool(self.script) or bool(self.scripts_by_model.get(str(body.get("model"))))
        if output is None or scripted:
            return super().default_turn(request)
        item = {"model": body.get("model"), "prompt": self.last_user_text(request)}
        if "result" in output["schema"].get("properties", {}):
            return Turn(text=json.dumps({"result": [item, {**item, "prompt": "second"}]}))
        return Turn(text=json.dumps(item))


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> Iterator[CanonicalFake]:
    """(conftest's ``fake``, answering structured requests with JSON: :class:`JsonEchoFake`)"""
    # the notebook's rendering, not a terminal's
    yield from serve_fake(JsonEchoFake(), monkeypatch, tmp_path, live="display")


def table(markdown: str, first: int = 0) -> list[list[str]]:
    """The ``first``-th Markdown table in ``markdown``: header row, then the body rows (cells
    stripped; the ``|---|`` line dropped)."""
    tables: list[list[list[str]]] = []
    current: list[list[str]] | None = None
    for line in markdown.splitlines():
        if line.startswith("|"):
            if current is None:
                current = []
                tables.append(current)
            if not line.startswith("|---"):
                current.append([c.strip() for c in line.strip().strip("|").split(" | ")])
        else:
            current = None
    return tables[first]


def final_markdown(shell: Any) -> str:
    outputs = [o for o in shell.front.outputs if "text/markdown" in o["data"]]
    assert outputs, shell.front.outputs
    return str(outputs[-1]["data"]["text/markdown"])


# -- --schema ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("live", ["display", "widget"])
def test_schema_list_is_a_table_with_the_raw_json_folded(shell: Any, fake: Any, live: str) -> None:
    run(shell, f'%config ChatMagics.live = "{live}"')
    run(shell, SETUP)
    result = run(shell, "%%chat --schema list[Echo] -o answer\nTwo items, please.")
    assert result.success, result.error_in_exec
    body = fake.chat_requests[-1].json
    assert body["output"]["schema"]["properties"]["result"]["type"] == "array"
    md = final_markdown(shell)
    assert table(md) == [["#", "model", "prompt"], ["1", "echo", "Two items, please."],
                         ["2", "echo", "second"]]
    assert "<details><summary>JSON</summary>" in md and '"prompt": "second"' in md
    assert "<sub>fake:echo · 12 in / 7 out tokens" in md
    assert len(shell.front.outputs) == 1  # the live view was replaced
    output = shell.front.outputs[-1]
    assert set(output["data"]) == {"text/markdown", "text/plain"}
    assert output["metadata"]["dispatch_nb"]["schema"] == "list[Echo]"
    answer = shell.user_ns["answer"]
    echo = shell.user_ns["Echo"]
    assert answer.parsed == [echo(model="echo", prompt="Two items, please."),
                             echo(model="echo", prompt="second")]
    assert json.loads(answer.text)  # the raw JSON
    # the list asked for, not the {"result": [...]} object it travelled in
    shown = json.loads(output["data"]["text/plain"].rsplit("\n\n[", 1)[0])
    assert shown == [{"model": "echo", "prompt": "Two items, please."},
                     {"model": "echo", "prompt": "second"}]
    assert '"result"' not in md


def test_a_terminal_prints_a_schema_answer_once(shell: Any, fake: Any,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    """Terminal IPython: the JSON streams as the model writes it (the live progress, and the
    answer), then one line says it matched the schema, then the footer; the same values are
    not printed again as a table."""
    run(shell, '%config ChatMagics.live = "auto"')  # no kernel here: the terminal's text view
    run(shell, SETUP)
    assert run(shell, "%%chat --schema list[Echo]\nTwo items, please.").success
    printed = capsys.readouterr().out
    assert printed.count("second") == 1, printed  # the answer once
    assert "| # | model | prompt |" not in printed
    json_line, matched, footer = printed.strip().splitlines()
    assert json.loads(json_line)["result"][1] == {"model": "echo", "prompt": "second"}
    assert matched == "✓ the JSON matches list[Echo] (2 items)"
    assert footer.startswith("[fake:echo · 12 in / 7 out tokens")
    assert run(shell, "%%chat --schema Echo\nOne item.").success
    assert "✓ the JSON matches Echo\n[fake:echo · " in capsys.readouterr().out
    # a comparison: each model's JSON as it ends, then what adds to them: one table, a column
    # per model
    assert run(shell, "%%chat --schema Echo -m fake:echo,fake:second\nOne item.").success
    printed = capsys.readouterr().out
    assert "| field | fake:echo | fake:second |" in printed
    assert "| model | echo | second |" in printed


def test_schema_object_and_json_schema_dict(shell: Any, fake: Any) -> None:
    run(shell, SETUP)
    assert run(shell, "%%chat --schema Echo -o one -m fake:solo\nOne.").success
    assert table(final_markdown(shell)) == [["model", "prompt"], ["solo", "One."]]
    assert shell.user_ns["one"].parsed == shell.user_ns["Echo"](model="solo", prompt="One.")
    run(shell, "city = {'type': 'object', 'properties': {'model': {'type': 'string'}, "
               "'prompt': {'type': 'string'}}, 'required': ['model', 'prompt']}")
    assert run(shell, "%%chat --schema city -o two\nA dict schema.").success
    assert table(final_markdown(shell)) == [["model", "prompt"], ["echo", "A dict schema."]]
    assert shell.user_ns["two"].parsed == {"model": "echo", "prompt": "A dict schema."}


def test_schema_compare_is_one_table_with_a_column_per_model(shell: Any, fake: Any) -> None:
    run(shell, SETUP)
    result = run(shell, "%%chat --schema Echo -m fake:echo,fake:other -o both\nCompare.")
    assert result.success, result.error_in_exec
    md = final_markdown(shell)
    fields = table(md, 1)
    assert fields == [["field", "fake:echo", "fake:other"], ["model", "echo", "other"],
                      ["prompt", "Compare.", "Compare."]]
    assert "JSON: fake:echo" in md and "JSON: fake:other" in md
    both = shell.user_ns["both"]
    assert both["fake:echo"].parsed.model == "echo" and both["fake:other"].parsed.model == "other"


def test_schema_compare_shows_a_failed_model_beside_the_table(shell: Any, fake: Any) -> None:
    run(shell, SETUP)
    fake.push_for("broken", Fail(400, "schema not supported", "invalid_request_error"))
    result = run(shell, "%%chat --schema Echo -m fake:echo,fake:broken\nCompare.")
    assert result.success  # one model answered
    md = final_markdown(shell)
    assert table(md, 1) == [["field", "fake:echo"], ["model", "echo"], ["prompt", "Compare."]]
    assert "#### fake:broken" in md and "schema not supported" in md


def test_schema_record_then_replay_sends_nothing(shell: Any, fake: Any) -> None:
    run(shell, SETUP)
    assert run(shell, "%%chat --schema list[Echo] --cache record --no-history -o a\nRecorded.").success
    recorded = final_markdown(shell)
    sent = len(fake.chat_requests)
    assert run(shell, "%%chat --schema list[Echo] --cache replay --no-history -o b\nRecorded.").success
    assert len(fake.chat_requests) == sent
    assert table(final_markdown(shell)) == table(recorded)
    assert shell.user_ns["b"].parsed == shell.user_ns["a"].parsed
    # the schema is part of the key: another schema is not answered from the recording
    result = run(shell, "%%chat --schema Echo --cache replay --no-history\nRecorded.")
    assert not result.success and len(fake.chat_requests) == sent


def test_schema_bad_name_is_a_usage_error_saying_what_is_accepted(shell: Any, fake: Any) -> None:
    accepted = "pydantic model class, a type such as list\\[Review\\]"
    with pytest.raises(UsageError, match=f"name 'Missing' is not defined.*{accepted}"):
        shell.run_cell_magic("chat", "--schema Missing", "hi")
    with pytest.raises(UsageError, match=f"name 'Missing' is not defined.*{accepted}") as info:
        shell.run_cell_magic("chat", "--schema list[Missing]", "hi")
    assert "quotes" not in str(info.value)  # a missing class, not a key whose quotes went
    shell.user_ns["number"] = 42
    with pytest.raises(UsageError, match=f"number is an int, not a schema.*{accepted}"):
        shell.run_cell_magic("chat", "--schema number", "hi")
    shell.user_ns["bad"] = {"type": "no-such-type"}
    with pytest.raises(UsageError, match=f"--schema bad: .*{accepted}"):
        shell.run_cell_magic("chat", "--schema bad", "hi")
    with pytest.raises(UsageError, match="-f code does not apply"):
        shell.run_cell_magic("chat", "--schema dict -f code", "hi")
    assert fake.chat_requests == []


def test_schema_answer_that_does_not_validate_is_a_short_error(shell: Any, fake: Any) -> None:
    run(shell, SETUP)
    fake.push(Turn(text="not json at all"), Turn(text="still not json"))
    result = run(shell, "%%chat --schema Echo -o bad\nBreak it.")
    assert not result.success
    assert str(result.error_in_exec).startswith(
        "OutputValidationError: fake: the answer does not match the Echo schema")
    assert len(fake.chat_requests) == 2  # one retry with the errors
    md = final_markdown(shell)  # both attempts are kept, apart, and the retry is counted
    assert md.startswith("not json at all\n\nstill not json")
    assert "retried once (the answer did not match the schema)" in md
    assert "⚠ OutputValidationError" in md
    assert shell.user_ns["bad"].code == "output_invalid"


# -- --each -----------------------------------------------------------------------------------------


def test_each_over_a_dataframe_answers_every_row(shell: Any, fake: Any) -> None:
    run(shell, "import pandas as pd\ndf = pd.DataFrame({'city': ['Paris', 'Rome', 'Oslo'], "
               "'n': [1, 2, 3]})\ntone = 'briefly'")
    result = run(shell, "%%chat --each df -m fake:other -s Geo --max-tokens 50 "
                        "--temperature 0.2 -o res\nTell me about {city} ({n}), {tone}.")
    assert result.success, result.error_in_exec
    assert table(final_markdown(shell)) == [
        ["#", "city", "n", "answer"],
        ["0", "Paris", "1", "other: Tell me about Paris (1), briefly."],
        ["1", "Rome", "2", "other: Tell me about Rome (2), briefly."],
        ["2", "Oslo", "3", "other: Tell me about Oslo (3), briefly."],
    ]
    bodies = [r.json for r in fake.chat_requests]
    assert len(bodies) == 3
    assert {b["system"] for b in bodies} == {"Geo"} and {b["max_tokens"] for b in bodies} == {50}
    assert {b["temperature"] for b in bodies} == {0.2} and {b["model"] for b in bodies} == {"other"}
    res = shell.user_ns["res"]
    assert type(res).__name__ == "BatchResult" and res.ok == 3
    assert list(res.to_pandas()["answer"]) == [
        f"other: Tell me about {c} ({n}), briefly." for c, n in (("Paris", 1), ("Rome", 2),
                                                                  ("Oslo", 3))]
    assert "fake:other · --each df · 3 rows: 3 ok" in final_markdown(shell)


def test_each_over_a_list_and_a_series(shell: Any, fake: Any) -> None:
    run(shell, "import pandas as pd\nwords = ['alpha', 'beta']\n"
               "s = pd.Series(['x1', 'y2'], name='code')")
    assert run(shell, "%%chat --each words\nSay {row}").success
    assert table(final_markdown(shell)) == [["#", "row", "answer"], ["0", "alpha", "echo: Say alpha"],
                                            ["1", "beta", "echo: Say beta"]]
    assert run(shell, "%%chat --each s\nCode {code}").success
    assert table(final_markdown(shell)) == [["#", "code", "answer"], ["0", "x1", "echo: Code x1"],
                                            ["1", "y2", "echo: Code y2"]]
    assert run(shell, "%%chat --each words[:1]\nOnly {row}").success  # an expression
    assert table(final_markdown(shell))[1:] == [["0", "alpha", "echo: Only alpha"]]


def test_each_with_a_schema_has_the_parsed_fields_as_columns(shell: Any, fake: Any) -> None:
    run(shell, SETUP + "rows = [{'id': 1, 'text': 'first'}, {'id': 2, 'text': 'second one'}]")
    result = run(shell, "%%chat --each rows --schema Echo -m fake:parse -o res\nRead {text}")
    assert result.success, result.error_in_exec
    assert table(final_markdown(shell)) == [
        ["#", "id", "text", "model", "prompt"],
        ["0", "1", "first", "parse", "Read first"],
        ["1", "2", "second one", "parse", "Read second one"],
    ]
    res = shell.user_ns["res"]
    assert [r.parsed.prompt for r in res] == ["Read first", "Read second one"]
    assert all("output" in r.json for r in fake.chat_requests)


def test_each_shows_failed_rows_in_an_error_column(shell: Any, fake: Any) -> None:
    fake.push(Fail(400, "row rejected", "invalid_request_error"))
    run(shell, "words = ['only']")
    result = run(shell, "%%chat --each words -o res\nSay {row}")
    assert not result.success  # every row failed: the error follows the table
    rows = table(final_markdown(shell))
    assert rows[0] == ["#", "row", "error"] and "row rejected" in rows[1][2]
    assert shell.user_ns["res"].failed == 1


def test_each_record_then_replay_sends_nothing(shell: Any, fake: Any) -> None:
    run(shell, "words = ['alpha', 'beta']")
    assert run(shell, "%%chat --each words --cache record\nSay {row}").success
    recorded = table(final_markdown(shell))
    sent = len(fake.chat_requests)
    assert run(shell, "%%chat --each words --cache replay -o res\nSay {row}").success
    assert len(fake.chat_requests) == sent
    assert table(final_markdown(shell)) == recorded
    assert shell.user_ns["res"].replayed == 2


def test_each_refusals_are_usage_errors_and_send_nothing(shell: Any, fake: Any) -> None:
    shell.user_ns.update(words=["a"], text="just a string", f=lambda x: x)
    with pytest.raises(UsageError, match="one model"):
        shell.run_cell_magic("chat", "--each words -m fake:a,fake:b", "Say {row}")
    with pytest.raises(UsageError, match="does not run tools"):
        shell.run_cell_magic("chat", "--each words --tools f", "Say {row}")
    with pytest.raises(UsageError, match=r"text is a str\. --each takes a list"):
        shell.run_cell_magic("chat", "--each text", "Say {row}")
    with pytest.raises(UsageError, match="name 'nowhere' is not defined"):
        shell.run_cell_magic("chat", "--each nowhere", "Say {row}")
    shell.user_ns["table"] = {"review": ["good"]}  # the shell-like split drops the quotes:
    quoted = r"""name 'review' is not defined\. .*drops quotes.*\(--each "df\['name'\]"\)"""
    with pytest.raises(UsageError, match=quoted):
        shell.run_cell_magic("chat", "--each table['review']", "Say {row}")
    with pytest.raises(UsageError, match=r"\{typo\} names nothing in this row"):
        shell.run_cell_magic("chat", "--each words", "Say {typo}")
    shell.user_ns["empty"] = []
    with pytest.raises(UsageError, match="empty"):
        shell.run_cell_magic("chat", "--each empty", "Say {row}")
    assert fake.chat_requests == []
    shell.run_cell_magic("chat", """--each "table['review']" -m fake:a""", "Say {row}")  # quoted: fine
    assert len(fake.chat_requests) == 1


def test_ctrl_c_during_each_stops_promptly_and_keeps_the_finished_rows(
    shell: Any, fake: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two rows answer at once, four take 6 s each: Ctrl-C while those four stream ends the cell at
    # once, with the two answers in the table, the four marked unanswered, and -o holding them.
    with BatchFake(events=4, delay=2.0, fast={"Say alpha", "Say beta"}) as slow:
        monkeypatch.setenv("DISPATCH_NB_FAKE_URL", slow.base_url)
        run(shell, "words = ['alpha', 'beta', 'gamma', 'delta', 'epsilon', 'zeta']")

        def interrupt_when_the_slow_rows_stream() -> None:
            if wait_for(lambda: sum(slow.asked.values()) == 6, timeout=20):
                time.sleep(0.5)
                _thread.interrupt_main()

        threading.Thread(target=interrupt_when_the_slow_rows_stream, daemon=True).start()
        started = time.monotonic()
        result = run(shell, "%%chat --each words -o res\nSay {row}")
        took = time.monotonic() - started
    assert isinstance(result.error_in_exec, ChatInterrupted)
    assert "interrupted; the finished rows are in the table above and in res" in str(
        result.error_in_exec)
    assert took < 3, f"the cell took {took:.1f} s to stop"
    rows = table(final_markdown(shell))
    assert rows[0] == ["#", "row", "answer", "error"]
    assert rows[1][:3] == ["0", "alpha", "echo: Say alpha"]
    assert rows[2][:3] == ["1", "beta", "echo: Say beta"]
    assert all(row[2] == "" and row[3] == "cancelled" for row in rows[3:]), rows  # the footer says why
    res = shell.user_ns["res"]
    assert type(res).__name__ == "BatchResult" and res.ok == 2 and len(res) == 6
    assert [r.text for r in res[:2]] == ["echo: Say alpha", "echo: Say beta"]
    # the four rows in flight were cancelled, not failed: the result and the footer agree
    assert (res.cancelled, res.failed, res.not_sent) == (4, 0, 0)
    assert "6 rows: 2 ok, 4 cancelled;" in final_markdown(shell)
    assert list(res.to_pandas()["status"]) == ["ok"] * 2 + ["cancelled"] * 4


# -- a real kernel ----------------------------------------------------------------------------------


@pytest.mark.kernel
@pytest.mark.timeout(180)
def test_schema_and_each_in_a_real_kernel(tmp_path: Any) -> None:
    cells = [
        "%load_ext dispatch_nb\n" + SETUP
        + "import pandas as pd\ndf = pd.DataFrame({'city': ['Paris', 'Rome']})",
        "%%chat --schema list[Echo] -o answer\nTwo, please.",                       # 1
        "%%chat --schema Echo -m fake:echo,fake:other\nCompare.",                    # 2
        "%%chat --each df -o res\nAbout {city}",                                     # 3
        "%%chat --each df --schema Echo -m fake:parse\nParse {city}",                # 4
        "print(answer.parsed[1].prompt, res.ok, list(res.to_pandas()['answer']))",  # 5
    ]
    nb = new_notebook(cells=[new_code_cell(source) for source in cells])
    with JsonEchoFake() as fake:
        env = fake_kernel_env(fake.url, tmp_path, "cache.jsonl")
        client = notebook_client(nb, timeout=60, allow_errors=False)
        client.execute(env=env)
    path = tmp_path / "saved.ipynb"
    nbformat.write(nb, path)
    nb = nbformat.read(path, as_version=4)

    def final(index: int) -> str:
        shown = [o for o in nb.cells[index].outputs if o.output_type == "display_data"
                 and "text/markdown" in o.data]
        assert len(shown) == 1, nb.cells[index].outputs
        out = shown[0]
        assert WIDGET_MIME not in out.data and set(out.data) == {"text/markdown", "text/plain"}
        return str(out.data["text/markdown"])

    for index in range(1, 5):
        assert not any(WIDGET_MIME in o.get("data", {}) for o in nb.cells[index].outputs)
    assert table(final(1)) == [["#", "model", "prompt"], ["1", "echo", "Two, please."],
                               ["2", "echo", "second"]]
    assert table(final(2), 1) == [["field", "fake:echo", "fake:other"],
                                  ["model", "echo", "other"], ["prompt", "Compare.", "Compare."]]
    assert table(final(3)) == [["#", "city", "answer"], ["0", "Paris", "echo: About Paris"],
                               ["1", "Rome", "echo: About Rome"]]
    assert table(final(4)) == [["#", "city", "model", "prompt"], ["0", "Paris", "parse", "Parse Paris"],
                               ["1", "Rome", "parse", "Parse Rome"]]
    printed = "".join(o.get("text", "") for o in nb.cells[5].outputs)
    assert printed.strip() == "second 2 ['echo: About Paris', 'echo: About Rome']"


def test_each_with_a_list_schema_or_a_scalar_type_has_one_answer_cell(shell: Any, fake: Any) -> None:
    run(shell, SETUP + "words = ['one']")
    assert run(shell, "%%chat --each words --schema list[Echo]\nList {row}").success
    rows = table(final_markdown(shell))
    assert rows[0] == ["#", "row", "answer"]
    assert json.loads(rows[1][2].replace("\\|", "|")) == [
        {"model": "echo", "prompt": "List one"}, {"model": "echo", "prompt": "second"}]
    fake.push(Turn(text='{"result": 7}'))
    assert run(shell, "%%chat --each words --schema int\nCount {row}").success
    assert table(final_markdown(shell)) == [["#", "row", "answer"], ["0", "one", "7"]]


def test_each_table_shows_the_first_hundred_rows_and_says_so(shell: Any, fake: Any) -> None:
    run(shell, "words = [f'w{i}' for i in range(103)]")
    assert run(shell, "%%chat --each words -o res\nSay {row}").success
    md = final_markdown(shell)
    rows = table(md)
    assert len(rows) == 101 and rows[100] == ["99", "w99", "echo: Say w99"]
    assert "The first 100 of 103 rows are shown" in md and "103 rows: 103 ok" in md
    # the cell kept them with -o res: the note names res, not "-o VAR" to add
    assert "see them all with res.to_pandas()" in md and "-o VAR" not in md
    assert run(shell, "%%chat --each words\nSay {row}").success
    assert "keep the result with -o VAR and see them all with VAR.to_pandas()" in final_markdown(
        shell)
    assert len(shell.user_ns["res"]) == 103 and shell.user_ns["res"][102].text == "echo: Say w102"


def test_each_says_which_rows_had_an_empty_value_in_a_placeholder(shell: Any, fake: Any) -> None:
    """NaN / None in a column the template uses reached the model as 'nan' / 'None' without a
    word (the table showed NaN, the prompt said "Classify nan"): a note names those rows. A
    column the template does not use says nothing; duplicate index labels do not matter."""
    run(shell, "import pandas as pd, numpy as np\n"
               "df = pd.DataFrame({'text': ['a', None, np.nan, 'b'], 'n': [1, 2, None, 4],\n"
               "                   'unused': [None, None, None, None]}, index=[0, 0, 1, 1])")
    result = run(shell, "%%chat --each df\nClassify {text} (n={n})")
    assert result.success, result.error_in_exec
    prompts = [r.json["messages"][-1]["content"] for r in fake.chat_requests]
    assert sorted(prompts) == ["Classify a (n=1.0)", "Classify b (n=4.0)",
                               "Classify nan (n=2.0)", "Classify nan (n=nan)"]
    output = [o for o in shell.front.outputs if "text/markdown" in o["data"]][-1]
    plain = output["data"]["text/plain"]
    assert "{text} is empty (NaN or None) in 2 rows (1, 2): the prompt said 'nan' there" in plain
    assert "{n} is empty (NaN or None) in row 2: the prompt said 'nan' there" in plain
    assert "unused" not in plain.split("[")[-1] and "{unused}" not in plain
    assert "{text} is empty" in output["data"]["text/markdown"]
