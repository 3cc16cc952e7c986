"""Real Jupyter kernels (ipykernel) running ``%%chat`` against the loopback fakes.

* a notebook executed by nbclient: final Markdown outputs, no widget state left, no secret in any
  output, re-running a cell replaces its turn, await cells, the comparison table, short errors,
  and the device login approved / denied;
* a kernel driven with jupyter_client: iopub bytes for answers of 2k, 4k and 8k characters grow
  linearly (widget and display renderings), updates stay under ~20 per second, and interrupting
  the kernel keeps the partial answer.
"""

from __future__ import annotations

import json
import queue
import re
import threading
import time
from collections.abc import Iterator
from typing import Any

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook

from tests.fakes.canonical import CanonicalFake
from tests.fakes.github import FakeGitHub
from tests.fakes.provider import Fail, ToolCall, Turn
from tests.kernels import IPCKernelManager, notebook_client
from tests.notebook.compare_output import sections, table_rows
from tests.notebook.conftest import chat_env

pytestmark = [pytest.mark.kernel, pytest.mark.timeout(180)]

WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
SECRETS = {"OPENAI_API_KEY": "sk-test-secret-000111", "ANTHROPIC_API_KEY": "sk-ant-secret-222333"}


@pytest.fixture(scope="module")
def servers() -> Iterator[tuple[CanonicalFake, FakeGitHub]]:
    with CanonicalFake() as fake, FakeGitHub() as github:
        yield fake, github


@pytest.fixture(autouse=True)
def _nothing_left_scripted(servers: tuple[CanonicalFake, FakeGitHub]) -> Iterator[None]:
    """The module's kernel and fake are shared: a turn one test scripted and did not use (its
    cell was interrupted) must not answer the next test's cell, in whatever order they run."""
    servers[0].script.clear()
    yield
    servers[0].script.clear()


def kernel_env(fake: CanonicalFake, github: FakeGitHub, home: Any) -> dict[str, str]:
    env = chat_env()
    env.update(SECRETS)
    env.update(
        {
            "DISPATCH_NB_FAKE_URL": fake.url,
            "DISPATCH_NB_MODEL": "fake:echo",
            "DISPATCH_NB_HOME": str(home / "dispatch"),
            "DISPATCH_NB_CACHE_FILE": str(home / "cache.jsonl"),
            "DISPATCH_NB_GITHUB_URL": github.github_url,
            "DISPATCH_NB_GITHUB_API_URL": github.api_url,
            "HOME": str(home),
            "XDG_CONFIG_HOME": str(home / ".config"),
        }
    )
    return env


def outputs_text(nb: Any) -> str:
    return json.dumps([cell.get("outputs", []) for cell in nb.cells])


def test_notebook_in_a_real_kernel(servers: tuple[CanonicalFake, FakeGitHub], tmp_path: Any) -> None:
    fake, github = servers
    cells = [
        "%load_ext dispatch_nb\n%config ChatMagics.login_min_interval = 0.05",
        "name = 'Ada'",
        "%%chat\nSay hello to {name}.",                                   # 2
        "import asyncio\nawait asyncio.sleep(0.01)",
        "%%chat\nAnd after an await?",                                   # 4
        "%%chat -m fake:echo,fake:second\nCompare me.",                  # 5
        "%%chat\nThis one fails.",                                        # 6
        "%chat login",                                                    # 7
        "%chat logout\n%chat login",                                      # 8 (denied)
        "magics = get_ipython()._dispatch_nb_magics\n"
        "[t.prompt for t in magics.state.threads.get('default')]",             # 9
    ]
    nb = new_notebook(cells=[new_code_cell(source) for source in cells])
    nb.cells[6].metadata["tags"] = ["raises-exception"]
    nb.cells[8].metadata["tags"] = ["raises-exception"]
    client = notebook_client(nb, timeout=60, allow_errors=False)

    def approve_then_deny() -> None:
        first = github.wait_for_device_code(timeout=60)
        github.wait_for_polls(first.user_code, 2, timeout=30)
        github.approve(first.user_code)
        deadline = time.monotonic() + 60
        while len(github.authorizations) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        github.deny(github.authorizations[-1].user_code)

    with client.setup_kernel(env=kernel_env(fake, github, tmp_path)):
        for index in range(6):
            client.execute_cell(nb.cells[index], index)
        fake.push(Fail(401, "invalid api key", "authentication_error"))
        client.execute_cell(nb.cells[6], 6)
        worker = threading.Thread(target=approve_then_deny, daemon=True)
        worker.start()
        client.execute_cell(nb.cells[7], 7)
        client.execute_cell(nb.cells[8], 8)
        worker.join(10)
        # nbclient sends no cell id: executing cell 2 again is a new input (In[n]) and adds a
        # turn — the text alone never identifies a cell (a front end's re-run with a cell id
        # replaces its turn: test_cell_id_from_the_front_end_identifies_the_turn).
        requests_before = len(fake.chat_requests)
        client.execute_cell(nb.cells[2], 2)
        assert len(fake.chat_requests) == requests_before + 1
        assert len(fake.chat_requests[-1].json["messages"]) == 5  # both earlier turns, then it
        client.execute_cell(nb.cells[9], 9)

    for index in (2, 4):
        outputs = nb.cells[index].outputs
        assert len(outputs) == 1, outputs
        out = outputs[0]
        assert out.output_type == "display_data" and WIDGET_MIME not in out.data
        assert set(out.data) == {"text/markdown", "text/plain"}
        assert "<sub>fake:echo · 12 in / 7 out tokens" in out.data["text/markdown"]
        assert out.metadata["dispatch_nb"]["usage"]["output_tokens"] == 7
    assert "echo: Say hello to Ada." in nb.cells[2].outputs[0].data["text/markdown"]
    assert "echo: And after an await?" in nb.cells[4].outputs[0].data["text/markdown"]

    compare = nb.cells[5].outputs
    assert len(compare) == 1 and "| model | tokens in / out |" in compare[0].data["text/markdown"]
    answers = sections(compare[0].data["text/markdown"])  # each answer under its own model
    assert list(answers) == ["fake:echo", "fake:second"]
    assert answers["fake:echo"].startswith("echo: Compare me.")
    assert answers["fake:second"].startswith("second: Compare me.")
    assert list(table_rows(compare[0].data["text/markdown"])) == ["fake:echo", "fake:second"]

    error = [o for o in nb.cells[6].outputs if o.output_type == "error"]
    assert len(error) == 1 and len(error[0].traceback) <= 3
    assert "AuthenticationError" in error[0].traceback[0]
    assert "OPENAI_API_KEY" in error[0].traceback[1] or "credentials" in error[0].traceback[1]

    login = nb.cells[7].outputs
    assert "Logged in to GitHub Copilot as **@octocat**" in login[-1].data["text/markdown"]
    denied = [o for o in nb.cells[8].outputs if o.output_type == "error"]
    assert len(denied) == 1 and "Login denied" in denied[0].traceback[0]
    # The failed login leaves one static line, no widget, in the saved notebook.
    assert not [o for o in nb.cells[8].outputs if WIDGET_MIME in o.get("data", {})]
    view = [o for o in nb.cells[8].outputs if o.output_type == "display_data"][-1]
    assert "denied" in view.data["text/markdown"] and "%chat login" in view.data["text/markdown"]
    assert set(view.data) == {"text/markdown", "text/plain"}

    prompts = nb.cells[9].outputs[0].data["text/plain"]
    assert prompts == "['Say hello to Ada.', 'And after an await?', 'Say hello to Ada.']"

    text = outputs_text(nb)
    assert WIDGET_MIME not in text
    for secret in [*SECRETS.values(), *github.users]:
        assert secret not in text
    assert not nb.metadata.get("widgets", {}).get("application/vnd.jupyter.widget-state+json", {}).get(
        "state"
    )
    nbformat.validate(nb)


@pytest.mark.parametrize("live", ["widget", "display"])
def test_a_cell_that_fails_before_its_first_token_saves_only_the_error(
    servers: tuple[CanonicalFake, FakeGitHub], tmp_path: Any, live: str
) -> None:
    # nothing arrived: no empty answer, no empty output, no widget; the error alone
    fake, github = servers
    cells = [f"%load_ext dispatch_nb\n%config ChatMagics.live = '{live}'", "%%chat\nThis one fails."]
    nb = new_notebook(cells=[new_code_cell(source) for source in cells])
    nb.cells[1].metadata["tags"] = ["raises-exception"]
    client = notebook_client(nb, timeout=60, allow_errors=False)
    with client.setup_kernel(env=kernel_env(fake, github, tmp_path)):
        client.execute_cell(nb.cells[0], 0)
        fake.push(Fail(401, "invalid api key", "authentication_error"))
        client.execute_cell(nb.cells[1], 1)
    outputs = nb.cells[1].outputs
    assert [o.output_type for o in outputs] == ["error"], outputs
    assert "AuthenticationError" in outputs[0].traceback[0]
    assert not nb.metadata.get("widgets")


# -- bytes on the wire ---------------------------------------------------------------------------


class Kernel:
    """A kernel driven with jupyter_client, collecting every iopub message of an execution."""

    def __init__(self, env: dict[str, str]) -> None:
        self.km = IPCKernelManager(kernel_name="python3")
        self.km.start_kernel(env=env)
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=60)

    def execute(self, code: str, *, timeout: float = 60, during: Any = None) -> list[dict[str, Any]]:
        msg_id = self.kc.execute(code)
        messages: list[dict[str, Any]] = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                msg = self.kc.get_iopub_msg(timeout=1)
            except queue.Empty:
                continue
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            msg["received"] = time.monotonic()
            messages.append(msg)
            if during is not None:
                during(msg)
            if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                return messages
        raise TimeoutError(code)

    def close(self) -> None:
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=True)


def wire_bytes(messages: list[dict[str, Any]]) -> int:
    """What the kernel sent for the view: message contents (and binary buffers)."""
    total = 0
    for msg in messages:
        if msg["msg_type"] in ("status", "execute_input"):
            continue
        total += len(json.dumps(msg["content"], default=str))
        total += sum(len(b) for b in msg.get("buffers") or [])
    return total


def view_updates(messages: list[dict[str, Any]]) -> list[float]:
    """When the view was repainted: messages less than 10 ms apart belong to one repaint."""
    kinds = ("comm_msg", "update_display_data", "display_data", "stream")
    times = [m["received"] for m in messages if m["msg_type"] in kinds]
    repaints: list[float] = []
    for t in times:
        if not repaints or t - repaints[-1] > 0.01:
            repaints.append(t)
    return repaints


@pytest.fixture(scope="module")
def kernel(servers: tuple[CanonicalFake, FakeGitHub], tmp_path_factory: Any) -> Iterator[Kernel]:
    fake, github = servers
    k = Kernel(kernel_env(fake, github, tmp_path_factory.mktemp("kernel-home")))
    try:
        k.execute("%load_ext dispatch_nb")
        yield k
    finally:
        k.close()


@pytest.mark.parametrize("live", ["widget", "display"])
def test_bytes_on_the_wire_grow_linearly(kernel: Kernel, servers: Any, live: str) -> None:
    fake, _ = servers
    kernel.execute(f'%config ChatMagics.live = "{live}"')
    once, largest = {}, {}
    for n in (2000, 4000, 8000):
        # ~4 ms per 8-character delta: about 1 s per 2,000 characters, like a fast model.
        text = ("lorem ipsum " * n)[:n]
        fake.push(Turn(text=text, chunk=8, delay=0.004))
        messages = kernel.execute("%%chat --no-history\nwrite a lot")
        final = [m for m in messages if m["msg_type"] in ("display_data", "update_display_data")
                 and "text/markdown" in m["content"]["data"]]
        assert final, [m["msg_type"] for m in messages]
        assert text.strip() in final[-1]["content"]["data"]["text/markdown"]
        updates = view_updates(messages)
        duration = updates[-1] - updates[0]
        assert len(updates) <= 20 * duration + 10, (len(updates), duration)
        # a repaint shows the answer so far; what is sent once shows all of it
        repaints = [wire_bytes([m]) for m in messages
                    if text.strip() not in json.dumps(m["content"], default=str)]
        largest[n] = max(repaints)
        once[n] = wire_bytes(messages) - sum(repaints)
    # Linear, however long the stream took: no repaint carries the whole answer so far, only the
    # block still growing (a repaint of a 4x longer answer is no larger; a quadratic view's
    # would be 4x), at most 20 a second (above); what is sent once is linear in the answer, a
    # small constant factor over the text itself.
    assert largest[8000] <= 1.3 * largest[2000] + 200, largest
    assert once[4000] / once[2000] < 2.6, once
    assert once[8000] / once[4000] < 2.6, once
    assert once[8000] < 8000 * 16, once


def test_interrupting_the_kernel_keeps_the_partial_answer(kernel: Kernel, servers: Any) -> None:
    fake, _ = servers
    kernel.execute('%config ChatMagics.live = "widget"')
    fake.push(Turn(text="tick " * 2000, chunk=5, delay=0.01))
    interrupted = threading.Event()

    def interrupt_once(msg: dict[str, Any]) -> None:
        # once the live view shows some of the answer (not at its first widget message: on a
        # loaded machine no text had arrived 0.3 s after that, and there was no partial to keep)
        if (msg["msg_type"] == "comm_msg" and "tick" in json.dumps(msg["content"])
                and not interrupted.is_set()):
            interrupted.set()
            threading.Timer(0.3, kernel.km.interrupt_kernel).start()

    started = time.monotonic()
    messages = kernel.execute("%%chat --no-history\ncount forever", during=interrupt_once)
    assert time.monotonic() - started < 10
    errors = [m for m in messages if m["msg_type"] == "error"]
    assert len(errors) == 1 and len(errors[0]["content"]["traceback"]) == 1
    assert "interrupted; the partial answer is kept above" in errors[0]["content"]["traceback"][0]
    finals = [m["content"]["data"]["text/markdown"] for m in messages
              if m["msg_type"] in ("update_display_data", "display_data")
              and "text/markdown" in m["content"]["data"]]
    assert finals and finals[-1].startswith("tick tick") and "interrupted" in finals[-1]
    # The kernel is fine afterwards.
    after = kernel.execute("%%chat --no-history\nstill there?")
    assert not [m for m in after if m["msg_type"] == "error"]


def test_cell_id_from_the_front_end_identifies_the_turn(kernel: Kernel, servers: Any) -> None:
    fake, _ = servers
    kernel.execute("%chat reset --all")

    def execute_with_cell_id(code: str, cell_id: str) -> None:
        msg = kernel.kc.session.msg(
            "execute_request",
            {"code": code, "silent": False, "store_history": True, "user_expressions": {},
             "allow_stdin": False, "stop_on_error": True},
            metadata={"cellId": cell_id},
        )
        kernel.kc.shell_channel.send(msg)
        while True:  # this request's reply (an earlier request's may still be waiting unread)
            reply = kernel.kc.get_shell_msg(timeout=30)
            if reply["parent_header"].get("msg_id") == msg["header"]["msg_id"]:
                break
        assert reply["content"]["status"] == "ok", reply["content"]

    execute_with_cell_id("%%chat\nfirst version", "cell-1")
    execute_with_cell_id("%%chat\nsecond cell", "cell-2")
    execute_with_cell_id("%%chat\nedited first version", "cell-1")
    assert len(fake.chat_requests[-1].json["messages"]) == 1
    messages = kernel.execute(
        "print([t.prompt for t in get_ipython()._dispatch_nb_magics.state.threads.get('default')])"
    )
    printed = "".join(m["content"].get("text", "") for m in messages if m["msg_type"] == "stream")
    assert printed.strip() == "['edited first version', 'second cell']"


#: a model named in a status line or a footer (its HTML tags and Markdown's ** dropped): the word
#: before "· streaming…", "· waiting for the first token…" or "· 12 in / 7 out tokens"
_NAMED = re.compile(r"([\w:./-]+) · (?:streaming…|waiting for the first token…|[\d,]+ in / )")


def _strings(value: Any) -> Iterator[str]:
    """Every string in a message's content (a display's data, a widget's state)."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


@pytest.mark.parametrize("live", ["display", "widget"])
def test_the_live_status_line_and_the_footer_name_the_model_alike(
    kernel: Kernel, servers: Any, live: str
) -> None:
    """One name for one model, the ``provider:model`` spec a comparison and ``%chat status``
    use: the live status line, the status line once done, the final footer, and the footer of
    the stored answer shown in a later cell (it said ``echo`` where the live view said
    ``fake:echo``)."""
    fake, _ = servers
    kernel.execute(f'%config ChatMagics.live = "{live}"')
    fake.push(Turn(text="one two three four five six seven", chunk=4, delay=0.02))
    messages = kernel.execute("%%chat -m fake:echo --no-history -o named\nname yourself")
    assert not [m for m in messages if m["msg_type"] == "error"]
    shown = "\n".join(_strings([m["content"] for m in messages]))
    named = set(_NAMED.findall(re.sub(r"<[^>]*>|\*\*", "", shown)))
    assert named == {"fake:echo"}, named
    assert "streaming…" in shown and "<sub>fake:echo · 12 in / 7 out tokens" in shown
    later = kernel.execute("named")
    [result] = [m["content"]["data"] for m in later if m["msg_type"] == "execute_result"]
    assert result["text/markdown"].endswith("<sub>fake:echo · 12 in / 7 out tokens</sub>")


def test_a_wrong_tools_or_schema_name_reads_the_same_and_names_what_exists(
    kernel: Kernel, servers: Any
) -> None:
    """``--tools nosuch`` and ``--schema Nope`` are the same kind of mistake in the magic's line:
    both are one ``UsageError`` line (no traceback: IPython prints it on stderr) that names
    what exists; nothing is sent."""
    fake, _ = servers
    kernel.execute("from pydantic import BaseModel\n"
                   "class Review(BaseModel):\n    stars: int\n"
                   "def get_weather(city: str) -> str:\n    return 'sunny'")
    before = len(fake.chat_requests)
    said = {}
    for line, name in (("--tools get_wether", "tools"), ("--schema Reviw", "schema")):
        messages = kernel.execute(f"%%chat {line}\nhi")
        assert not [m for m in messages if m["msg_type"] == "error"], line  # no traceback
        [said[name]] = [m["content"]["text"] for m in messages
                        if m["msg_type"] == "stream" and m["content"]["name"] == "stderr"]
    assert said["tools"].startswith("UsageError: --tools get_wether: there is no 'get_wether' in "
                                    "the namespace (did you mean get_weather?). Functions defined "
                                    "here: get_weather."), said["tools"]
    assert said["schema"].startswith("UsageError: --schema Reviw: name 'Reviw' is not defined "
                                     "(did you mean Review?). Schemas defined here: Review."), \
        said["schema"]
    assert len(fake.chat_requests) == before


# -- issue 13, in a real kernel ------------------------------------------------------------------


def test_recorded_notebook_keeps_every_turn_and_every_note(
    servers: tuple[CanonicalFake, FakeGitHub], tmp_path: Any
) -> None:
    """The teacher's record run (nbclient, no cell ids): two cells that both say "continue" are
    two turns, in order; the notes of a cell are in the saved notebook."""
    fake, github = servers
    cells = [
        "%load_ext dispatch_nb",
        "%%chat\nTell me a story about {hero}.",
        "%%chat\ncontinue",
        "%%chat\ncontinue",
        "print([t.prompt for t in get_ipython()._dispatch_nb_magics.state.threads.get('default')])",
    ]
    nb = new_notebook(cells=[new_code_cell(source) for source in cells])
    client = notebook_client(nb, timeout=60, allow_errors=False)
    before = len(fake.chat_requests)
    with client.setup_kernel(env=kernel_env(fake, github, tmp_path)):
        for index in range(len(cells)):
            client.execute_cell(nb.cells[index], index)
    sent = [r.json["messages"] for r in fake.chat_requests[before:]]
    assert [len(m) for m in sent] == [1, 3, 5]  # each "continue" sees every earlier turn
    assert sent[2][-1]["content"] == "continue" and sent[2][2]["content"] == "continue"
    printed = nb.cells[4].outputs[0]["text"]
    assert printed.strip() == "['Tell me a story about {hero}.', 'continue', 'continue']"
    [story] = nb.cells[1].outputs
    assert "{hero} was left as written" in story.data["text/markdown"]
    assert story.metadata["dispatch_nb"]["notes"][0].startswith("{hero} was left as written")
    nbformat.validate(nb)


def test_chat_key_asks_through_stdin_and_keeps_the_key_out_of_every_output(
    kernel: Kernel, servers: Any
) -> None:
    typed = "sk-typed-into-getpass-4242"
    msg_id = kernel.kc.execute("%chat key openai", allow_stdin=True)
    request = kernel.kc.get_stdin_msg(timeout=30)
    assert request["msg_type"] == "input_request" and request["content"]["password"] is True
    assert "OPENAI_API_KEY" in request["content"]["prompt"]
    kernel.kc.input(typed)
    outputs = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        msg = kernel.kc.get_iopub_msg(timeout=5)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        outputs.append(msg)
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            break
    shown = json.dumps([m["content"] for m in outputs])
    assert "is set for this kernel" in shown and typed not in shown
    check = kernel.execute(f"import os; print(os.environ['OPENAI_API_KEY'] == {typed!r})")
    assert "True" in "".join(m["content"].get("text", "") for m in check if m["msg_type"] == "stream")
    kernel.execute(f"import os; os.environ['OPENAI_API_KEY'] = {SECRETS['OPENAI_API_KEY']!r}")


def test_chat_key_says_when_the_default_provider_changes(kernel: Kernel, servers: Any) -> None:
    """With no model, key or login, ``%chat key anthropic`` makes Anthropic the default: the
    output says so in one line, so a bare ``-m`` name is not a surprise."""
    saved = ("DISPATCH_NB_MODEL", "OPENAI_API_KEY", "ANTHROPIC_API_KEY")
    kernel.execute(f"import os; _saved = {{k: os.environ.pop(k, None) for k in {saved!r}}}")
    try:
        msg_id = kernel.kc.execute("%chat key anthropic", allow_stdin=True)
        request = kernel.kc.get_stdin_msg(timeout=30)
        assert "ANTHROPIC_API_KEY" in request["content"]["prompt"]
        kernel.kc.input("sk-ant-typed-for-the-note-0001")
        shown = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            msg = kernel.kc.get_iopub_msg(timeout=5)
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            shown.append(msg["content"])
            if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                break
        text = json.dumps(shown)
        assert "The default model is now anthropic:claude-sonnet-4-5 (ANTHROPIC_API_KEY is set)" \
            in text
        assert "sk-ant-typed-for-the-note" not in text
    finally:
        kernel.execute("import os\nfor _k, _v in _saved.items():\n"
                       "    os.environ.pop(_k, None) if _v is None else os.environ.__setitem__(_k, _v)")
        # the module's kernel takes the restored default as known (later tests expect no note)
        kernel.execute("get_ipython()._dispatch_nb_magics.state.default_note()")


def test_interrupting_a_running_tool_ends_the_cell_at_once(kernel: Kernel, servers: Any) -> None:
    fake, _ = servers
    kernel.execute('%config ChatMagics.live = "widget"')
    kernel.execute(
        "import time\n"
        "def wait_a_while(seconds: int) -> str:\n"
        "    '''Wait.'''\n"
        "    time.sleep(seconds)\n"
        "    return 'waited'\n"
    )
    fake.push(Turn(text="Waiting first.", tool_calls=[ToolCall("w1", "wait_a_while", {"seconds": 6})]),
              Turn(text="never asked"))
    requests = len(fake.chat_requests)
    interrupted: list[float] = []

    def interrupt_when_the_tool_runs(msg: dict[str, Any]) -> None:
        data = json.dumps(msg["content"], default=str, ensure_ascii=False)
        if not interrupted and "wait_a_while" in data and "⏳" in data:
            interrupted.append(time.monotonic())
            threading.Timer(0.3, kernel.km.interrupt_kernel).start()

    messages = kernel.execute(
        "%%chat --no-history --tools wait_a_while\nwait", during=interrupt_when_the_tool_runs
    )
    ended = messages[-1]["received"]
    assert interrupted and ended - interrupted[0] < 2.5, "the cell waited for the tool"
    errors = [m for m in messages if m["msg_type"] == "error"]
    assert len(errors) == 1 and "interrupted" in errors[0]["content"]["traceback"][0]
    finals = [m["content"]["data"]["text/markdown"] for m in messages
              if m["msg_type"] in ("update_display_data", "display_data")
              and "text/markdown" in m["content"]["data"]]
    assert finals[-1].startswith("Waiting first.") and "abandoned" in finals[-1]
    assert "⏹ interrupted" in finals[-1]
    assert len(fake.chat_requests) == requests + 1
    after = kernel.execute("%%chat --no-history\nstill there?")  # the kernel is fine
    assert not [m for m in after if m["msg_type"] == "error"]
