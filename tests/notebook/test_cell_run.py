"""CellRun (notebook/cell.py): one %%chat execution as plan / run / finish / record steps.

Each step is called on its own against a real IPython shell and the canonical loopback fake, and
checked for doing its part and nothing of the next one (nothing is sent while planning; nothing
recorded before ``record``).
"""

from __future__ import annotations

from typing import Any

import pytest
from IPython.core.error import UsageError

from dispatch_nb.notebook.cell import CellRun
from dispatch_nb.notebook.display import ChatError
from dispatch_nb.notebook.magics import parse_magic_line
from tests.fakes.canonical import CanonicalFake
from tests.fakes.provider import Fail


def cell_run(magics: Any, line: str, cell: str) -> CellRun:
    args = parse_magic_line(magics.chat_cell.parser, line)
    return CellRun(magics.state, args, cell)


def test_plan_decides_everything_and_sends_nothing(
    shell: Any, fake: CanonicalFake, magics: Any
) -> None:
    shell.user_ns["name"] = "Ada"
    run = cell_run(magics, "-m fake:echo,fake:other -t notes --max-tokens 50 -s 'Be terse.'",
                   "\n\nSay hi to {name}.\n\n")
    plan = run.plan()
    assert fake.chat_requests == []
    assert plan.specs == ["fake:echo", "fake:other"] and plan.compare
    assert plan.prompt.text == "Say hi to Ada."
    assert plan.thread.name == "notes" and plan.use_history and plan.fmt == "markdown"
    assert (plan.system, plan.max_tokens, plan.stream, plan.tools) == ("Be terse.", 50, True, [])
    assert plan.user.content == "Say hi to Ada." and plan.history == []
    assert len(plan.adapters) == 2 and plan.adapters[0] is not plan.adapters[1]
    assert run.view is None and run.outcomes == []


def test_plan_refuses_bad_options_before_any_adapter_is_made(
    shell: Any, fake: CanonicalFake, magics: Any
) -> None:
    with pytest.raises(UsageError, match="--temperature must be between 0 and 2"):
        cell_run(magics, "--temperature 3", "hi").plan()
    with pytest.raises(UsageError, match="the %%chat cell is empty"):
        cell_run(magics, "", "\n   \n").plan()
    with pytest.raises(UsageError, match="there is no 'nope' in the namespace"):
        cell_run(magics, "--tools nope", "hi").plan()
    assert magics.state.adapters == {}
    assert fake.chat_requests == []


def test_the_steps_one_by_one(shell: Any, fake: CanonicalFake, magics: Any) -> None:
    magics.live = "display"  # display updates (a terminal shell would print)
    run = cell_run(magics, "-o answer", "hi")
    plan = run.plan()
    thread = plan.thread

    run.run()
    assert len(fake.chat_requests) == 1
    assert not run.interrupted and run.outcomes[0].error is None
    assert len(thread) == 0 and "answer" not in shell.user_ns  # nothing recorded yet

    final = run.finish()
    assert final is run.final and "echo: hi" in final.data["text/markdown"]
    assert shell.front.markdown[-1] == final.data["text/markdown"]  # the view shows it
    assert len(thread) == 0

    run.record()
    assert [turn.prompt for turn in thread] == ["hi"]
    assert shell.user_ns["answer"].text == "echo: hi"
    run.raise_failure()  # nothing failed: nothing raised


def test_the_next_cell_in_a_thread_plans_with_the_recorded_history(
    shell: Any, fake: CanonicalFake, magics: Any
) -> None:
    cell_run(magics, "", "first").execute()
    plan = cell_run(magics, "", "second").plan()
    assert [m.text for m in plan.history] == ["first", "echo: first"]
    no_history = cell_run(magics, "--no-history", "third").plan()
    assert no_history.history == [] and not no_history.use_history


def test_raise_failure_after_the_output_is_shown(
    shell: Any, fake: CanonicalFake, magics: Any
) -> None:
    fake.push(Fail(401, "bad key", "authentication_error"))
    run = cell_run(magics, "-o answer", "hi")
    plan = run.plan()
    run.run()
    run.finish()
    run.record()
    assert run.outcomes[0].error is not None
    assert len(plan.thread) == 0  # a failed turn is not recorded
    assert shell.user_ns["answer"] is run.outcomes[0].error  # -o keeps the error
    with pytest.raises(ChatError, match="bad key"):
        run.raise_failure()


def test_steps_out_of_order_say_which_step_is_missing(
    shell: Any, fake: CanonicalFake, magics: Any
) -> None:
    run = cell_run(magics, "", "hi")
    with pytest.raises(RuntimeError, match=r"plan\(\) has not run"):
        run.run()
    run.plan()
    with pytest.raises(RuntimeError, match=r"run\(\) has not run"):
        run.finish()
