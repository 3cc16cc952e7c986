"""KernelState (notebook/state.py): the kernel's notebook state, without IPython magics.

The state is built here from a plain settings object and a stand-in shell (only
``execution_count`` is read); adapters are real ones talking to the canonical loopback fake.
"""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace
from typing import Any

import pytest
from IPython.core.error import UsageError

from dispatch_nb.cache import CachedAdapter
from dispatch_nb.notebook.state import KernelState
from tests.fakes.canonical import CanonicalFake


def settings(**changes: Any) -> SimpleNamespace:
    """The ChatMagics defaults, as a plain object (KernelState reads traits by name only)."""
    values: dict[str, Any] = {
        "model": "", "system": "", "stream": True, "history_length": 20, "thread": "default",
        "cache": "", "cache_file": "", "format": "markdown", "live": "text", "interpolate": True,
        "max_value_chars": 4000, "max_rows": 10, "max_tokens": None, "temperature": None,
        "timeout": None, "max_tool_rounds": 8, "update_rate": 20.0, "login_on_demand": True,
        "login_min_interval": 1.0,
    }
    values.update(changes)
    return SimpleNamespace(**values)


def cell_info(cell_id: str | None = None, *, store_history: bool = True,
              silent: bool = False) -> SimpleNamespace:
    return SimpleNamespace(cell_id=cell_id, store_history=store_history, silent=silent)


def cell_result(count: int | None, error: BaseException | None = None, *,
                silent: bool = False) -> SimpleNamespace:
    return SimpleNamespace(execution_count=count, error_in_exec=error, error_before_exec=None,
                           info=SimpleNamespace(silent=silent))


@pytest.fixture
def state(fake: CanonicalFake) -> Any:
    made = KernelState(SimpleNamespace(execution_count=1), settings())
    yield made
    made.close_adapters()


# -- the running cell ------------------------------------------------------------------------------


def test_begin_cell_takes_the_cell_id_and_the_number_ipython_already_counted(state: Any) -> None:
    state.shell.execution_count = 8  # IPython counts a stored cell before pre_run_cell
    state.begin_cell(cell_info("abc"))
    assert (state.cell_id, state.execution_count, state.label) == ("abc", 7, "In[7]")
    state.begin_cell(cell_info(None, store_history=False))  # not counted: no number
    assert (state.cell_id, state.execution_count, state.label) == (None, None, "%%chat")


def test_end_cell_records_the_error_and_forgets_the_cell(state: Any) -> None:
    boom = ValueError("boom")
    state.begin_cell(cell_info("abc"))
    state.end_cell(cell_result(3, boom))
    assert state.errors[3] is boom
    assert (state.cell_id, state.execution_count) == (None, None)
    state.end_cell(cell_result(4, KeyError("quiet"), silent=True))  # a silent run leaves no Err
    state.end_cell(cell_result(5))  # no error
    assert list(state.errors) == [3]
    with pytest.raises(KeyError, match="cells with errors: 3"):
        state.errors[4]


def test_next_occurrence_counts_calls_per_identity_and_restarts_with_each_execution(
    state: Any,
) -> None:
    state.shell.execution_count = 2
    state.begin_cell(cell_info())
    assert [state.next_occurrence("a"), state.next_occurrence("a"), state.next_occurrence("b")] == [
        0, 1, 0
    ]
    state.shell.execution_count = 3  # a new execution, even without pre_run_cell
    assert state.next_occurrence("a") == 0


# -- settings read through the state -----------------------------------------------------------------


def test_threads_are_made_on_first_use_and_follow_history_length(state: Any) -> None:
    assert state._threads is None
    store = state.threads
    assert store is state.threads and store.max_turns == 20
    state.settings.history_length = 3
    assert state.threads.max_turns == 3


def test_model_specs_split_check_and_default(state: Any) -> None:
    assert state.model_specs(" fake:echo , fake:other ") == ["fake:echo", "fake:other"]
    assert state.model_specs(None) == ["fake:echo"]  # $DISPATCH_NB_MODEL (the fake fixture)
    state.settings.model = "fake:other"
    assert state.model_specs("") == ["fake:other"]
    assert state.default_model() == ("fake:other", "%config ChatMagics.model", "")
    with pytest.raises(UsageError, match="lists a model twice"):
        state.model_specs("fake:echo,fake:echo")
    with pytest.raises(UsageError, match="needs a model spec"):
        state.model_specs(" , ")


def test_cache_mode_option_then_trait_then_environment(
    state: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert state.cache_mode() == "off"
    monkeypatch.setenv("DISPATCH_NB_CACHE", "replay")
    assert state.cache_mode() == "replay"
    state.settings.cache = "record"
    assert state.cache_mode() == "record"
    assert state.cache_mode("read-write") == "read-write"


def test_needs_login_only_for_copilot_on_demand_and_not_in_replay(state: Any) -> None:
    assert state.needs_login("copilot", "off")
    assert state.needs_login("copilot", "record")
    assert not state.needs_login("copilot", "replay")
    assert not state.needs_login("openai", "off")
    state.settings.login_on_demand = False
    assert not state.needs_login("copilot", "off")


# -- adapters and caches ---------------------------------------------------------------------------


def test_adapters_are_kept_per_spec_and_mode_and_share_one_cache_per_mode(
    state: Any, fake: CanonicalFake
) -> None:
    plain = state.adapter("fake:echo")
    assert state.adapter("fake:echo") is plain
    assert not isinstance(plain, CachedAdapter)
    recorded = state.adapter("fake:echo", "record")
    other = state.adapter("fake:other", "record")
    assert isinstance(recorded, CachedAdapter) and isinstance(other, CachedAdapter)
    assert recorded is not plain
    assert recorded.cache is other.cache is state.response_cache("record")
    assert plain.chat("hi").text == "echo: hi"  # a real adapter, talking to the fake


def test_close_adapters_closes_them_and_the_next_call_reconnects(
    state: Any, fake: CanonicalFake
) -> None:
    first = state.adapter("fake:echo", "record")
    cache = state.response_cache("record")
    state.close_adapters()
    assert state.adapters == {} and state.caches == {}
    second = state.adapter("fake:echo", "record")
    assert second is not first and state.response_cache("record") is not cache
    assert second.chat("again").text == "echo: again"


def test_login_runs_before_a_new_copilot_adapter_only(state: Any) -> None:
    logins: list[str] = []
    state.adapter("fake:echo", login=lambda: logins.append("fake"))
    assert logins == []
    copilot = state.adapter("copilot:gpt-4.1", login=lambda: logins.append("copilot"))
    assert logins == ["copilot"]
    assert state.adapter("copilot:gpt-4.1", login=lambda: logins.append("again")) is copilot
    state.adapter("copilot:gpt-4.1", "replay", login=lambda: logins.append("replay"))
    assert logins == ["copilot"]  # kept adapters and replay need no login


def test_a_failing_login_keeps_no_adapter(state: Any) -> None:
    def refuse() -> None:
        raise RuntimeError("denied")

    with pytest.raises(RuntimeError, match="denied"):
        state.adapter("copilot:gpt-4.1", login=refuse)
    assert state.adapters == {}


# -- %load_ext -------------------------------------------------------------------------------------


def test_the_magics_hold_one_state_and_load_ext_imports_only_it_and_the_constants() -> None:
    code = (
        "import sys\n"
        "from IPython.core.interactiveshell import InteractiveShell\n"
        "ip = InteractiveShell.instance()\n"
        "ip.run_line_magic('load_ext', 'dispatch_nb')\n"
        "m = ip._dispatch_nb_magics\n"
        "assert m.state.settings is m and m.state.shell is ip\n"
        "assert ip.user_ns['Err'] is m.state.errors\n"
        "print(sorted(n for n in sys.modules if n.startswith('dispatch_nb.notebook.')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == (
        "['dispatch_nb.notebook.constants', 'dispatch_nb.notebook.magics', "
        "'dispatch_nb.notebook.state']"
    ), out.stdout + out.stderr
