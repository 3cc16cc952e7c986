"""``batch(..., deferred=True)`` against loopback fakes of OpenAI's Batch API and Anthropic's
Message Batches (``tests/fakes/batch_api.py``): the same answers as live calls, jobs recorded in
the checkpoint before polling, resume without re-sending, cancel, expiry, row errors, splitting."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from dispatch_nb import (
    AnthropicAdapter,
    BatchInterrupted,
    BatchPendingError,
    BatchResult,
    CancelToken,
    DispatchError,
    OpenAIAdapter,
    RequestCancelled,
    RequestError,
    Response,
    abatch,
    batch,
)
from dispatch_nb.providers.batch_api import OpenAIBatchAPI
from dispatch_nb.testing import FakeAdapter

from ..fakes.anthropic import AnthropicFake
from ..fakes.batch_api import AnthropicBatches, OpenAIBatches
from ..fakes.openai_chat import OpenAIChatFake
from ..fakes.openai_responses import OpenAIResponsesFake
from ..fakes.openai_schema import problems
from ..fakes.provider import Fail, Turn
from ..fakes.server import wait_for

KEY = "sk-test-deferred"


@pytest.fixture
def openai() -> Iterator[tuple[OpenAIResponsesFake, OpenAIBatches]]:
    with OpenAIResponsesFake(api_key=KEY) as fake:
        yield fake, OpenAIBatches(fake)


@pytest.fixture
def anthropic() -> Iterator[tuple[AnthropicFake, AnthropicBatches]]:
    with AnthropicFake(api_key=KEY) as fake:
        yield fake, AnthropicBatches(fake)


def openai_adapter(fake: OpenAIResponsesFake) -> OpenAIAdapter:
    return OpenAIAdapter("gpt-4.1-mini", api_key=KEY, base_url=fake.base_url)


def anthropic_adapter(fake: AnthropicFake) -> AnthropicAdapter:
    return AnthropicAdapter("claude-sonnet-4-5", api_key=KEY, base_url=fake.url)


def prompts(n: int) -> list[str]:
    return [f"question {i}" for i in range(n)]


def job_lines(batches: OpenAIBatches, index: int = -1) -> list[dict[str, Any]]:
    return batches.created[index].lines


# -- a thousand rows through each provider ----------------------------------------------------
def test_a_thousand_rows_through_openai(openai: Any, tmp_path: Path) -> None:
    fake, batches = openai
    result = batch("{row}", prompts(1000), model=openai_adapter(fake), deferred=True,
                   poll_interval=0, checkpoint=tmp_path / "run.jsonl", progress=False)
    assert [r.text for r in result] == [f"echo: question {i}" for i in range(1000)]
    assert all(r.usage.input_tokens > 0 for r in result)
    assert len(batches.created) == 1 and len(fake.chat_requests) == 1000
    assert result.job.state == "completed" and result.job.completed == 1000
    assert result.job.ids == [batches.created[0].id]
    assert result.sent == 1000 and result.failed == 0
    # every line is what the Responses endpoint takes, and validates against OpenAI's spec
    lines = job_lines(batches)
    assert {line["url"] for line in lines} == {"/v1/responses"}
    assert len({line["custom_id"] for line in lines}) == 1000
    assert [problems("/responses", line["body"]) for line in lines] == [None] * 1000
    assert "stream" not in lines[0]["body"] or lines[0]["body"]["stream"] is False


def test_the_poll_interval_comes_from_the_environment(openai: Any, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    # what %%chat --each --deferred (which takes no poll_interval=) is told through
    fake, batches = openai
    batches.in_progress_polls = 3  # the job answers only after several polls
    monkeypatch.setenv("DISPATCH_NB_POLL_INTERVAL", "0")
    result = batch("{row}", prompts(3), model=openai_adapter(fake), deferred=True,
                   checkpoint=tmp_path / "run.jsonl", progress=False)
    assert result.job.state == "completed" and result[0].text == "echo: question 0"
    for bad in ("soon", "nan", "inf", "-1"):
        monkeypatch.setenv("DISPATCH_NB_POLL_INTERVAL", bad)
        with pytest.raises(ValueError, match="DISPATCH_NB_POLL_INTERVAL must be a number of sec"):
            batch("{row}", prompts(3), model=openai_adapter(fake), deferred=True,
                  checkpoint=tmp_path / "other.jsonl", progress=False)
    with pytest.raises(ValueError, match="poll_interval must be a number of seconds"):
        batch("{row}", prompts(3), model=openai_adapter(fake), deferred=True,
              poll_interval=float("nan"), checkpoint=tmp_path / "other.jsonl", progress=False)


def test_a_thousand_rows_through_anthropic(anthropic: Any, tmp_path: Path) -> None:
    fake, batches = anthropic
    result = batch("{row}", prompts(1000), model=anthropic_adapter(fake), deferred=True,
                   poll_interval=0, checkpoint=tmp_path / "run.jsonl", progress=False)
    assert [r.text for r in result] == [f"echo: question {i}" for i in range(1000)]
    assert len(batches.created) == 1 and len(fake.chat_requests) == 1000
    assert result.job.state == "completed" and result.job.provider == "anthropic"
    assert result.job.ended_at is not None and result.job.created_at is not None


def test_a_job_carries_the_rows_anthropic_beta_header(anthropic: Any, tmp_path: Path) -> None:
    """betas= (the adapter's and the call's) reach the job as its anthropic-beta header, as a
    live request's would: the provider applies it to each of the job's requests."""
    fake, batches = anthropic
    adapter = AnthropicAdapter("claude-sonnet-4-5", api_key=KEY, base_url=fake.url,
                               betas=["interleaved-thinking-2025-05-14"])
    result = batch("{row}", prompts(2), model=adapter, deferred=True, poll_interval=0,
                   betas=["context-1m-2025-08-07"], checkpoint=tmp_path / "run.jsonl",
                   progress=False)
    assert [r.text for r in result] == ["echo: question 0", "echo: question 1"]
    assert batches.created[0].headers["anthropic-beta"] == (
        "interleaved-thinking-2025-05-14,context-1m-2025-08-07")
    assert all("betas" not in line["body"] for line in batches.created[0].lines)


def test_a_compatible_server_has_no_batch_api(tmp_path: Path) -> None:
    with OpenAIChatFake(api_key=KEY) as fake:
        OpenAIBatches(fake)
        adapter = OpenAIAdapter("gpt-4.1-mini", api_key=KEY, base_url=fake.base_url,
                                backend="compatible")
        with pytest.raises(RequestError) as info:
            batch("{row}", prompts(3), model=adapter, deferred=True, progress=False)
        assert info.value.code == "batch_unsupported" and not fake.requests
        assert "deferred=False" in info.value.message and "gpt-4.1-mini" in info.value.message


def test_a_deferred_answer_is_the_live_answer(openai: Any, tmp_path: Path) -> None:
    fake, batches = openai
    adapter = openai_adapter(fake)
    turn = Turn(text="Paris is the capital.", thinking="The user asks about France.")
    fake.push(turn)
    live = adapter.chat("capital of France?", max_tokens=50)
    live_body = fake.last_request.json
    fake.restart_ids()
    fake.push(turn)
    result = batch("{row}", ["capital of France?"], model=adapter, deferred=True,
                   poll_interval=0, max_tokens=50, checkpoint=tmp_path / "c.jsonl",
                   progress=False)
    assert job_lines(batches)[0]["body"] == live_body  # the very body a live call sends
    assert result[0].model_dump(exclude={"cost"}) == live.model_dump(exclude={"cost"})
    # at the batch price: half of the live one, from genai-prices' own batch prices
    assert live.cost is not None and result[0].cost is not None
    assert result[0].cost.usd * 2 == live.cost.usd and "batch price" in result[0].cost.source
    assert result.cost.usd == result[0].cost.usd


def test_output_rows_are_parsed(anthropic: Any, tmp_path: Path) -> None:
    class City(BaseModel):
        name: str
        population: int

    fake, _batches = anthropic
    for i in range(3):
        fake.push(Turn(text=json.dumps({"name": f"city {i}", "population": i * 1000})))
    result = batch("Describe {row}", ["a", "b", "c"], model=anthropic_adapter(fake),
                   output=City, deferred=True, poll_interval=0, checkpoint=tmp_path / "o.jsonl",
                   progress=False)
    assert [r.parsed for r in result] == [City(name=f"city {i}", population=i * 1000)
                                          for i in range(3)]
    assert result.to_pandas()["parsed"].tolist()[0] == City(name="city 0", population=0)


def test_an_invalid_structured_answer_is_that_row_s_error(openai: Any, tmp_path: Path) -> None:
    class Point(BaseModel):
        x: int

    fake, _batches = openai
    fake.push(Turn(text='{"x": 1}'), Turn(text='{"x": "not a number"}'))
    result = batch("{row}", ["p", "q"], model=openai_adapter(fake), output=Point, deferred=True,
                   poll_interval=0, checkpoint=tmp_path / "p.jsonl", progress=False)
    assert result[0].parsed == Point(x=1)
    assert isinstance(result[1], DispatchError) and result[1].code == "output_invalid"
    assert result[1].partial is not None and "not a number" in result[1].partial.text


# -- jobs outlive the kernel ----------------------------------------------------------------------
def test_submit_returns_at_once_and_a_rerun_collects_without_resending(
    openai: Any, tmp_path: Path
) -> None:
    fake, batches = openai
    checkpoint = tmp_path / "later.jsonl"
    adapter = openai_adapter(fake)
    first = batch("{row}", prompts(20), model=adapter, deferred=True, wait=False,
                  checkpoint=checkpoint, progress=False)
    assert all(isinstance(r, BatchPendingError) and r.code == "batch_pending" for r in first)
    assert first.pending == 20 and first.failed == 0 and "20 not answered yet" in repr(first)
    assert first.job.state == "validating" and len(batches.created) == 1
    assert "result.wait()" in first[0].message
    # the job is in the checkpoint before anything was polled
    recorded = [json.loads(line) for line in checkpoint.read_text().splitlines()]
    assert recorded[0]["job"]["id"] == batches.created[0].id and len(recorded[0]["keys"]) == 20
    assert recorded[0]["key"] == f"job:{batches.created[0].id}"
    assert batches.polls == 0
    # the same call again — another kernel, the next morning — collects that job
    again = batch("{row}", prompts(20), model=openai_adapter(fake), deferred=True,
                  poll_interval=0, checkpoint=checkpoint, progress=False)
    assert [r.text for r in again] == [f"echo: question {i}" for i in range(20)]
    assert len(batches.created) == 1 and len(fake.chat_requests) == 20
    # and once more: every row from the checkpoint, nothing sent, no job
    third = batch("{row}", prompts(20), model=openai_adapter(fake), deferred=True,
                  poll_interval=0, checkpoint=checkpoint, progress=False)
    assert third.resumed == 20 and third.sent == 0 and len(batches.created) == 1
    # more rows: only the new ones go in a new job
    more = batch("{row}", prompts(25), model=openai_adapter(fake), deferred=True,
                 poll_interval=0, checkpoint=checkpoint, progress=False)
    assert more.resumed == 20 and len(batches.created) == 2
    assert len(job_lines(batches)) == 5 and more[24].text == "echo: question 24"


def test_a_job_collected_by_a_call_with_fewer_rows_stays_open_for_the_rest(
    openai: Any, tmp_path: Path
) -> None:
    fake, batches = openai
    checkpoint = tmp_path / "shared.jsonl"
    batch("{row}", prompts(6), model=openai_adapter(fake), deferred=True, wait=False,
          checkpoint=checkpoint, progress=False)
    # a call over half the rows collects its half of the job (the job holds the other half too)
    half = batch("{row}", prompts(3), model=openai_adapter(fake), deferred=True,
                 poll_interval=0, checkpoint=checkpoint, progress=False)
    assert [r.text for r in half] == [f"echo: question {i}" for i in range(3)]
    # the whole call, later (another process): its other half comes from the same job
    whole = batch("{row}", prompts(6), model=openai_adapter(fake), deferred=True,
                  poll_interval=0, checkpoint=checkpoint, progress=False, wait=True)
    assert [r.text for r in whole] == [f"echo: question {i}" for i in range(6)]
    assert whole.resumed == 3 and len(batches.created) == 1 and len(fake.chat_requests) == 6


def test_a_finished_checkpoint_needs_no_key_or_server_and_names_its_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    checkpoint = tmp_path / "done.jsonl"
    with OpenAIResponsesFake(api_key=KEY) as fake:
        batches = OpenAIBatches(fake)
        done = batch("{row}", prompts(6), model=openai_adapter(fake), deferred=True,
                     poll_interval=0, checkpoint=checkpoint, progress=False)
        job_id = batches.created[0].id
    # the server is gone and there is no key: the checkpoint file and the model's name only
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    before = checkpoint.read_bytes()
    again = batch("{row}", prompts(6), model="openai:gpt-4.1-mini", deferred=True, wait=False,
                  checkpoint=checkpoint, progress=False)
    assert [r.text for r in again] == [r.text for r in done]
    assert again.resumed == 6 and again.sent == 0 and again.wait() is again
    # result.job: the job that answered these rows, as it ended
    assert again.job.ids == [job_id] and again.job.state == "completed"
    assert (again.job.completed, again.job.total) == (6, 6)
    assert again.job.created_at == done.job.created_at and again.job.ended_at is not None
    assert f"job {job_id}: completed, 6 of 6 answered" in again.summary()
    assert checkpoint.read_bytes() == before  # read, not written


def test_wait_and_refresh_collect_later(anthropic: Any, tmp_path: Path) -> None:
    fake, batches = anthropic
    result = batch("{row}", prompts(4), model=anthropic_adapter(fake), deferred=True,
                   wait=False, poll_interval=0, checkpoint=tmp_path / "w.jsonl", progress=False)
    assert result.job.state == "in_progress"
    batches.stall = True
    result.refresh()
    assert result.job.state == "in_progress" and isinstance(result[0], BatchPendingError)
    assert result[0].code == "batch_pending"
    batches.stall = False
    assert result.wait() is result
    assert result.job.state == "completed" and [r.text for r in result] == [
        f"echo: question {i}" for i in range(4)]


def test_wait_shows_the_bar_and_its_clock_moves_between_polls(
    anthropic: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """result.wait() in a script (a text bar) shows the batch's bar while the job runs, and its
    elapsed time moves between two polls 2 s apart: it did not stay on the last line batch()
    left (at 00:00) for as long as the provider took."""
    fake, batches = anthropic
    batches.in_progress_polls = 2  # half the rows at the first poll, the rest at the second
    result = batch("{row}", prompts(4), model=anthropic_adapter(fake), deferred=True,
                   wait=False, poll_interval=2.0, checkpoint=tmp_path / "w.jsonl",
                   progress="text")
    assert result.pending == 4
    capsys.readouterr()
    assert result.wait() is result and result.ok == 4
    lines = capsys.readouterr().err.split("\r")
    waiting = [line for line in lines if "in_progress" in line]
    assert any("[00:00, anthropic job" in line for line in waiting), lines
    assert any("[00:01, anthropic job" in line for line in waiting), lines  # before the 2nd poll
    assert batches.polls == 2
    assert "4/4" in lines[-1] and "completed, 4 of 4 answered; ok 4" in lines[-1], lines[-1]
    # nothing left to wait for: no bar
    assert result.wait() is result and capsys.readouterr().err == ""


def test_without_a_checkpoint_the_same_call_finds_its_job(
    openai: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DISPATCH_NB_HOME", str(tmp_path / "home"))
    fake, batches = openai
    first = batch("{row}", prompts(5), model=openai_adapter(fake), deferred=True, wait=False,
                  progress=False)
    path = Path(first.job.checkpoint)
    assert path.parent == tmp_path / "home" / "batches" and path.exists()
    again = batch("{row}", prompts(5), model=openai_adapter(fake), deferred=True,
                  poll_interval=0, progress=False)
    assert again.job.checkpoint == str(path) and len(batches.created) == 1
    assert again.ok == 5


def test_ctrl_c_stops_waiting_and_leaves_the_job_running_for_a_rerun(tmp_path: Path) -> None:
    """Ctrl-C (the notebook's stop button) while a deferred batch waits stops the waiting, not the
    job: the rows stay pending, the provider is not asked to cancel, and the same call later
    collects that job instead of submitting again. ``result.cancel()`` cancels it."""
    checkpoint = tmp_path / "ctrl-c.jsonl"
    with OpenAIResponsesFake(api_key=KEY) as fake:
        batches = OpenAIBatches(fake)
        batches.stall = True  # the job runs for hours

        def interrupt_once_polled() -> None:
            wait_for(lambda: batches.polls >= 2, timeout=30)
            os.kill(os.getpid(), signal.SIGINT)  # what the notebook's stop button does

        threading.Thread(target=interrupt_once_polled, daemon=True).start()
        with pytest.raises(BatchInterrupted) as caught:
            batch("{row}", prompts(6), model=openai_adapter(fake), deferred=True,
                  poll_interval=0.01, checkpoint=checkpoint, progress=False)
        job_id = batches.created[0].id
        assert batches.cancels == 0 and batches.jobs[job_id].state == "in_progress"
        result = caught.value.result
        assert result.interrupted and result.pending == 6 and result.not_sent == 0
        assert result.job.ids == [job_id] and result.job.state == "in_progress"
        said = str(caught.value)
        assert f"job {job_id} keeps running" in said and str(checkpoint) in said
        assert ".result.wait()" in said and ".result.cancel()" in said
        # the next morning: the same call collects that job; nothing is submitted again
        batches.stall = False
        again = batch("{row}", prompts(6), model=openai_adapter(fake), deferred=True,
                      poll_interval=0, checkpoint=checkpoint, progress=False)
        assert [r.text for r in again] == [f"echo: question {i}" for i in range(6)]
        assert len(batches.created) == 1 and again.job.ids == [job_id]
        # the interrupted result can still wait for its job, too
        assert result.wait() is result and result.ok == 6 and batches.cancels == 0
        # cancelling is asked for by name
        batches.stall = True
        other = batch("{row} again", prompts(3), model=openai_adapter(fake), deferred=True,
                      wait=False, poll_interval=0, checkpoint=checkpoint, progress=False)
        assert other.cancel() is other
        assert batches.cancels == 1 and other.job.state == "cancelled"
        assert other.not_sent == 3 and other.pending == 0


def test_retry_failed_of_a_deferred_batch_shows_progress_and_ctrl_c_keeps_its_job(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``retry_failed()`` of a deferred batch shows progress as the batch did; Ctrl-C in it stops
    the waiting, not the retry's job (its rows stay not answered yet in the result, and
    BatchInterrupted names that job); ``result.job`` lists both jobs, and the result's own
    ``wait()`` collects the retry's answers into it; its ``cancel()`` reaches the retry's job."""
    checkpoint = tmp_path / "retry.jsonl"
    with OpenAIResponsesFake(api_key=KEY) as fake:
        batches = OpenAIBatches(fake, expire_after=6)
        result = batch("{row}", prompts(10), model=openai_adapter(fake), deferred=True,
                       poll_interval=0.01, checkpoint=checkpoint, progress="text")
        first = batches.created[0].id
        assert result.job.state == "expired" and result.failed == 4
        capsys.readouterr()
        batches.expire_after = None
        batches.stall = True  # the retry's job runs for hours

        def interrupt_once_polled(jobs: int) -> None:
            polls = batches.polls
            wait_for(lambda: len(batches.created) == jobs and batches.polls >= polls + 2,
                     timeout=30)
            os.kill(os.getpid(), signal.SIGINT)  # what the notebook's stop button does

        threading.Thread(target=interrupt_once_polled, args=(2,), daemon=True).start()
        with pytest.raises(BatchInterrupted) as caught:
            result.retry_failed()
        shown = capsys.readouterr().err
        assert f"batch {result.model}" in shown and "in_progress" in shown  # its progress bar
        retry = batches.created[1].id
        assert batches.cancels == 0 and batches.jobs[retry].state == "in_progress"
        assert caught.value.result is result and result.interrupted
        assert result.ok == 6 and result.pending == 4 and result.failed == 0
        assert all(isinstance(r, BatchPendingError) and r.code == "batch_pending" for r in result[6:])
        said = str(caught.value)
        assert f"job {retry} keeps running" in said and first not in said
        assert str(checkpoint) in said and ".result.wait()" in said
        # result.job: both jobs, truthfully; the result's own wait() collects the retry's job
        assert result.job.ids == [first, retry] and result.job.state == "in_progress"
        batches.stall = False
        assert result.wait() is result
        assert [r.text for r in result] == [f"echo: question {i}" for i in range(10)]
        assert result.job.ids == [first, retry] and batches.jobs[retry].state == "completed"
        assert result.model_calls == 10 and len(batches.created) == 2
        # a retry left running is cancelled through the original result, too
        batches.expire_after = 0
        other = batch("{row} more", prompts(2), model=openai_adapter(fake), deferred=True,
                      poll_interval=0.01, checkpoint=checkpoint, progress=False)
        assert other.failed == 2
        batches.expire_after, batches.stall = None, True
        threading.Thread(target=interrupt_once_polled, args=(4,), daemon=True).start()
        with pytest.raises(BatchInterrupted):
            other.retry_failed()
        assert other.pending == 2 and other.cancel() is other
        assert batches.cancels == 1 and batches.created[3].state == "cancelled"
        assert other.not_sent == 2 and other.pending == 0


def _interrupt_when(ready: Any) -> None:
    """Ctrl-C (what the notebook's stop button sends) once ``ready()``, from another thread."""
    def run() -> None:
        if wait_for(ready, timeout=30):
            os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=run, daemon=True).start()


def test_a_later_wait_adds_its_time_to_elapsed_and_ends_the_interruption(tmp_path: Path) -> None:
    """``elapsed`` is the time spent running the batch: a wait() after Ctrl-C adds its own (the
    summary's seconds say so, not the first call's alone); ``interrupted`` says whether the last
    call was stopped, so a wait() that collects every row clears it."""
    with OpenAIResponsesFake(api_key=KEY) as fake:
        batches = OpenAIBatches(fake)
        batches.stall = True
        _interrupt_when(lambda: batches.polls >= 2)
        with pytest.raises(BatchInterrupted) as caught:
            batch("{row}", prompts(4), model=openai_adapter(fake), deferred=True,
                  poll_interval=0.5, checkpoint=tmp_path / "e.jsonl", progress=False)
        result = caught.value.result
        assert result.interrupted and result.pending == 4
        first = result.elapsed
        batches.stall = False
        began = time.monotonic()
        assert result.wait() is result
        took = time.monotonic() - began
    assert result.ok == 4 and not result.interrupted and "interrupted" not in result.summary()
    assert took >= 0.5  # two polls, 0.5 s apart
    assert first + took - 0.25 < result.elapsed <= first + took
    assert result.summary().endswith(f"; {result.elapsed:.1f} s")


def test_ctrl_c_with_one_row_left_says_row_not_rows(tmp_path: Path) -> None:
    """BatchInterrupted counts one row as one row: '1 row not answered yet', '1 finished row is
    kept' (read from the checkpoint: the first run answered it)."""
    checkpoint = tmp_path / "one.jsonl"
    with OpenAIResponsesFake(api_key=KEY) as fake:
        batches = OpenAIBatches(fake)
        batch("{row}", prompts(1), model=openai_adapter(fake), deferred=True, poll_interval=0,
              checkpoint=checkpoint, progress=False)
        batches.stall = True
        _interrupt_when(lambda: batches.polls >= 4)
        with pytest.raises(BatchInterrupted) as caught:
            batch("{row}", prompts(2), model=openai_adapter(fake), deferred=True,
                  poll_interval=0.01, checkpoint=checkpoint, progress=False)
    result = caught.value.result
    assert (result.ok, result.pending) == (1, 1) and result.resumed == 1
    said = str(caught.value)
    assert "running at the provider (1 row not answered yet)" in said, said
    assert "1 finished row is kept in .result" in said, said


def test_after_a_deferred_retry_wait_shows_one_bar_for_the_whole_batch(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A deferred retry was interrupted while the batch's first job still ran: result.wait()
    waits for both jobs behind one bar, the batch's (all its rows, both jobs), not one each."""
    rows: list[dict[str, Any]] = [{"q": f"row {i}"} for i in range(6)]
    rows[2] = {"other": 1}  # names no {q}: this row's template fails; fixed before the retry
    with OpenAIResponsesFake(api_key=KEY) as fake:
        batches = OpenAIBatches(fake)
        batches.stall = True  # every job runs for hours
        result = batch("{q}", rows, model=openai_adapter(fake), deferred=True, wait=False,
                       poll_interval=0.05, checkpoint=tmp_path / "one.jsonl", progress="text")
        assert (result.pending, result.failed) == (5, 1)
        rows[2] = {"q": "row 2"}
        polls = batches.polls
        _interrupt_when(lambda: len(batches.created) == 2 and batches.polls >= polls + 2)
        with pytest.raises(BatchInterrupted):
            result.retry_failed()
        assert result.pending == 6 and result.interrupted
        assert [job.state for job in batches.created] == ["validating", "in_progress"]
        capsys.readouterr()
        batches.stall = False
        assert result.wait() is result
    assert [r.text for r in result] == [f"echo: row {i}" for i in range(6)]
    shown = capsys.readouterr().err
    assert shown.count("\n") == 1, shown  # one bar, closed once
    last = shown.split("\r")[-1]
    assert "6/6" in last and "openai 2 jobs: completed, 6 of 6 answered; ok 6" in last, last
    assert not result.interrupted


# -- the rude world ----------------------------------------------------------------------------------
def test_a_job_in_progress_across_polls_with_results_out_of_order(tmp_path: Path) -> None:
    with OpenAIResponsesFake(api_key=KEY) as fake:
        batches = OpenAIBatches(fake, in_progress_polls=4, shuffle=True)
        result = batch("{row}", prompts(40), model=openai_adapter(fake), deferred=True,
                       poll_interval=0, checkpoint=tmp_path / "s.jsonl", progress=False)
    assert [r.text for r in result] == [f"echo: question {i}" for i in range(40)]
    assert batches.polls >= 6  # validating, 4 × in_progress, finalizing, completed


def test_an_expired_job_keeps_what_finished_and_retry_failed_sends_only_the_rest(
    tmp_path: Path,
) -> None:
    with OpenAIResponsesFake(api_key=KEY) as fake:
        batches = OpenAIBatches(fake, expire_after=6)
        result = batch("{row}", prompts(10), model=openai_adapter(fake), deferred=True,
                       poll_interval=0, checkpoint=tmp_path / "e.jsonl", progress=False)
        assert result.job.state == "expired"
        assert [r.text for r in result[:6]] == [f"echo: question {i}" for i in range(6)]
        assert all(isinstance(r, DispatchError) and r.code == "batch_expired"
                   for r in result[6:])
        assert "expired" in result[6].message
        batches.expire_after = None
        assert result.retry_failed() is result
        assert len(batches.created) == 2 and len(job_lines(batches)) == 4
        assert [r.text for r in result] == [f"echo: question {i}" for i in range(10)]
        assert result.failed == 0


def test_a_live_retry_of_a_deferred_batch_that_stops_says_so_in_the_result(
    tmp_path: Path,
) -> None:
    """retry_failed(deferred=False) of an expired job's rows stops at a rejected key: the
    batch's result says where (stopped_by: the row in the batch) and why its other rows were
    not sent, as a batch that stopped there would."""
    with OpenAIResponsesFake(api_key=KEY) as fake:
        OpenAIBatches(fake, expire_after=6)
        result = batch("{row}", prompts(10), model=openai_adapter(fake), deferred=True,
                       concurrency=1, poll_interval=0, checkpoint=tmp_path / "s.jsonl",
                       progress=False)
        assert result.failed == 4 and result.stopped_by is None
        fake.push(Fail(401, "Incorrect API key provided", "invalid_api_key"))
        assert result.retry_failed(deferred=False) is result
    assert result.stopped_by is not None
    position, error = result.stopped_by
    assert position == 6 and result[6] is error and error.code == "authentication_failed"
    assert all(r.code == "not_sent" and "stopped at row 6's AuthenticationError" in r.message
               for r in result[7:])
    assert (result.ok, result.failed, result.not_sent) == (6, 1, 3)
    assert "stopped at row 6: AuthenticationError (authentication_failed)" in result.summary()


def test_a_later_wait_keeps_what_a_live_retry_since_the_deferred_one_did(
    tmp_path: Path,
) -> None:
    """A deferred retry whose job expired part way, then a live retry of what it left (which
    answers one row and stops at a rejected key before the other), then result.wait(): the wait
    collects the deferred retry's jobs again, but keeps the live retry's rows and stop."""
    with OpenAIResponsesFake(api_key=KEY) as fake:
        batches = OpenAIBatches(fake, expire_after=6)
        result = batch("{row}", prompts(10), model=openai_adapter(fake), deferred=True,
                       concurrency=1, poll_interval=0, checkpoint=tmp_path / "l.jsonl",
                       progress=False)
        assert (result.ok, result.failed) == (6, 4)
        batches.expire_after = 2
        assert result.retry_failed() is result  # deferred: rows 6 and 7 answered, 8 and 9 expire
        assert (result.ok, result.failed) == (8, 2) and result[8].code == "batch_expired"
        fake.push(Turn(text="answered live"), Fail(401, "Incorrect API key provided",
                                                   "invalid_api_key"))
        assert result.retry_failed(deferred=False) is result
        assert result.stopped_by is not None and result.stopped_by[0] == 9
        assert result[8].text == "answered live" and result[9].code == "authentication_failed"
        assert result.wait() is result
    assert result[8].text == "answered live" and result[9].code == "authentication_failed"
    assert (result.ok, result.failed) == (9, 1)
    assert result.stopped_by is not None and result.stopped_by[0] == 9
    assert "stopped at row 9: AuthenticationError" in result.summary()


def test_a_retried_repeated_row_is_submitted_under_its_own_key(tmp_path: Path) -> None:
    """retry_failed() of the second of two identical rows (its job expired before it) submits it
    under the key the whole batch gives it (…#1), not the first row's: a rerun of the batch
    submits nothing."""
    path = tmp_path / "same.jsonl"
    rows = ["same", "other", "same"]
    with OpenAIResponsesFake(api_key=KEY) as fake:
        batches = OpenAIBatches(fake, expire_after=2)
        result = batch("{row}", rows, model=openai_adapter(fake), deferred=True,
                       poll_interval=0, checkpoint=path, progress=False)
        assert result.ok == 2 and isinstance(result[2], DispatchError)
        assert result[2].code == "batch_expired"
        batches.expire_after = None
        assert result.retry_failed() is result
        assert len(batches.created) == 2 and len(job_lines(batches)) == 1  # sent, not read
        assert result.origin(2) == "sent" and len(fake.chat_requests) == 3
        assert [r.text for r in result] == ["echo: same", "echo: other", "echo: same"]
        lines = [json.loads(line) for line in path.read_text().splitlines()]
        answers = [line for line in lines if "response" in line]
        keys = [line["key"] for line in answers]
        assert len(keys) == len(set(keys)) == 3 and keys[2] == f"{keys[0]}#1"
        assert [line["row"] for line in answers] == [0, 1, 2]  # the batch's row 2, not the retry's 0
        again = batch("{row}", rows, model=openai_adapter(fake), deferred=True,
                      poll_interval=0, checkpoint=path, progress=False)
        assert len(batches.created) == 2 and len(fake.chat_requests) == 3
        assert again.resumed == 3 and [r.text for r in again] == [r.text for r in result]


def test_row_errors_carry_the_provider_message_and_code(anthropic: Any, tmp_path: Path) -> None:
    fake, _batches = anthropic
    fake.push(Turn(text="fine"), Fail(400, "prompt is too long: 250000 tokens > 200000 maximum",
                                      "invalid_request_error"), Turn(text="also fine"))
    result = batch("{row}", prompts(3), model=anthropic_adapter(fake), deferred=True,
                   poll_interval=0, checkpoint=tmp_path / "r.jsonl", progress=False)
    assert result[0].text == "fine" and result[2].text == "also fine"
    error = result[1]
    assert isinstance(error, DispatchError) and error.code == "context_length_exceeded"
    assert "prompt is too long" in error.message and error.provider == "anthropic"
    # retry_failed, live this time: only that row is sent
    sent = len(fake.chat_requests)
    result.retry_failed(deferred=False)
    assert len(fake.chat_requests) == sent + 1 and result[1].text == "echo: question 1"


def test_a_job_that_fails_validation_fails_its_rows_with_the_reason(
    openai: Any, tmp_path: Path
) -> None:
    fake, batches = openai
    batches.reject_lines = {2}
    result = batch("{row}", prompts(3), model=openai_adapter(fake), deferred=True,
                   poll_interval=0, checkpoint=tmp_path / "v.jsonl", progress=False)
    assert result.job.state == "failed"
    assert all(isinstance(r, RequestError) and r.code == "batch_failed" for r in result)
    assert "line 2: This line is not a valid request." in result[0].message
    assert not fake.chat_requests


def _cancelled_mid_job(tmp_path: Path, progress: bool | str) -> tuple[BatchResult, Any, Any]:
    """30 rows as one job, cancelled with a ``cancel=`` token once 6 were answered: the result,
    the fake and its batches."""
    with OpenAIResponsesFake(api_key=KEY) as fake:
        batches = OpenAIBatches(fake, per_poll=3, in_progress_polls=100)
        token = CancelToken()
        out: list[BatchResult] = []

        def run() -> None:
            out.append(batch("{row}", prompts(30), model=openai_adapter(fake), deferred=True,
                             poll_interval=0.01, cancel=token, checkpoint=tmp_path / "x.jsonl",
                             progress=progress))

        thread = threading.Thread(target=run)
        thread.start()
        assert wait_for(lambda: len(fake.chat_requests) >= 6, timeout=30)
        batches.stall = True
        token.cancel("enough")
        thread.join(30)
        assert not thread.is_alive()
    return out[0], fake, batches


def test_cancel_mid_job_cancels_at_the_provider_and_keeps_what_finished(tmp_path: Path) -> None:
    result, fake, batches = _cancelled_mid_job(tmp_path, progress=False)
    assert batches.cancels == 1 and result.job.state == "cancelled"
    answered = [r for r in result if isinstance(r, Response)]
    assert len(answered) == len(fake.chat_requests) >= 6
    assert all(isinstance(r, RequestCancelled) and r.code == "not_sent"
               for r in result if not isinstance(r, Response))
    assert result.not_sent == 30 - len(answered) and result.failed == 0
    assert result.interrupted


def test_after_a_cancel_the_progress_bar_says_not_sent_as_the_result_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The provider counts a cancelled job's requests that never ran as failed; the result calls
    those rows not sent, and so do the progress bar and the job's line."""
    result, _fake, _batches = _cancelled_mid_job(tmp_path, progress="text")
    assert result.job.state == "cancelled" and result.failed == 0
    assert result.not_sent == 30 - result.ok and result.not_sent > 0
    shown = capsys.readouterr().err.split("\r")[-1]  # the bar's last line
    assert f"ok {result.ok}, not sent {result.not_sent}" in shown, shown
    assert "failed" not in shown and "failed" not in result.summary()


def test_the_bar_counts_rows_whose_template_failed_or_over_budget_as_a_live_bar_does(
    openai: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Rows that end before the job is submitted — a template that cannot be filled for that row,
    a row over budget= — are on the deferred bar's last line as on a live bar's (and in the
    result): failed, not sent."""
    from dispatch_nb.estimates import worst_case
    from dispatch_nb.types import Message

    fake, _batches = openai
    adapter = openai_adapter(fake)
    rows: list[dict[str, Any]] = [{"q": f"row {i:02d}"} for i in range(10)]
    rows[3] = {"other": 1}  # names no {q}: this row's template fails

    def last_line(**options: Any) -> tuple[BatchResult, str]:
        result = batch("{q}", rows, model=adapter, progress="text", poll_interval=0, **options)
        return result, capsys.readouterr().err.split("\r")[-1]

    live, live_bar = last_line()
    deferred, deferred_bar = last_line(deferred=True, checkpoint=tmp_path / "t.jsonl")
    assert live.ok == deferred.ok == 9 and live.failed == deferred.failed == 1
    assert "10/10" in live_bar and "ok 9, failed 1," in live_bar, live_bar
    assert "10/10" in deferred_bar and "ok 9, failed 1" in deferred_bar, deferred_bar
    # with budget=: 6 rows fit, 3 more are not sent (over budget), the template's row failed
    worst = worst_case(adapter, [Message(role="user", content="row 00")], max_tokens=500,
                       batch=True)
    result, shown = last_line(deferred=True, max_tokens=500, budget=worst * 6 + worst / 2,
                              checkpoint=tmp_path / "b.jsonl")
    assert (result.ok, result.failed, result.not_sent) == (6, 1, 3)
    assert "7/10" in shown and "ok 6, failed 1, not sent 3" in shown, shown


def test_large_sets_split_into_jobs_within_the_limits(
    openai: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake, batches = openai
    monkeypatch.setattr(OpenAIBatchAPI, "max_requests", 40)
    result = batch("{row}", prompts(100), model=openai_adapter(fake), deferred=True,
                   poll_interval=0, checkpoint=tmp_path / "l.jsonl", progress=False)
    assert [len(job.lines) for job in batches.created] == [40, 40, 20]
    assert len(result.job.ids) == 3 and result.ok == 100
    monkeypatch.setattr(OpenAIBatchAPI, "max_requests", 1000)
    monkeypatch.setattr(OpenAIBatchAPI, "max_bytes", 5000)
    batch("{row} again", prompts(100), model=openai_adapter(fake), deferred=True,
          poll_interval=0, checkpoint=tmp_path / "l.jsonl", progress=False)
    sizes = [sum(len(json.dumps(line, separators=(",", ":"))) + 1 for line in job.lines)
             for job in batches.created[3:]]
    assert len(sizes) > 1 and max(sizes) <= 5000


def test_providers_without_a_batch_api_refuse_before_sending(tmp_path: Path) -> None:
    with pytest.raises(RequestError) as info:
        batch("{row}", prompts(2), model=FakeAdapter("echo"), deferred=True, progress=False)
    assert info.value.code == "batch_unsupported" and "deferred=False" in info.value.message
    with pytest.raises(ValueError, match="Python tools"):
        batch("{row}", prompts(2), model=FakeAdapter("echo"), deferred=True,
              tools=[lambda city: city], progress=False)


def test_a_refused_deferred_batch_shows_no_progress_bar(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(RequestError, match="no batch API") as info:
        batch("{row}", prompts(2), model=FakeAdapter("echo"), deferred=True, progress="text")
    assert info.value.code == "batch_unsupported"
    assert capsys.readouterr().err == ""  # no "batch fake:echo: 0/2 …" line before the error


def test_a_wrong_key_fails_at_submission(openai: Any, tmp_path: Path) -> None:
    fake, batches = openai
    adapter = OpenAIAdapter("gpt-4.1-mini", api_key="sk-wrong", base_url=fake.base_url)
    with pytest.raises(DispatchError) as info:
        batch("{row}", prompts(3), model=adapter, deferred=True, progress=False,
              checkpoint=tmp_path / "k.jsonl")
    assert info.value.code == "authentication_failed" and not batches.created
    assert "sk-wrong" not in str(info.value)


async def test_abatch_deferred(anthropic: Any, tmp_path: Path) -> None:
    fake, _batches = anthropic
    result = await abatch("{row}", prompts(5), model=anthropic_adapter(fake), deferred=True,
                          poll_interval=0, checkpoint=tmp_path / "a.jsonl", progress=False)
    assert [r.text for r in result] == [f"echo: question {i}" for i in range(5)]


def test_a_budget_sends_only_the_rows_whose_batch_price_fits(openai: Any, tmp_path: Path) -> None:
    from decimal import Decimal

    from dispatch_nb import BudgetExceededError
    from dispatch_nb.estimates import worst_case
    from dispatch_nb.types import Message

    fake, batches = openai
    adapter = openai_adapter(fake)
    rows = [f"row {i:02d}" for i in range(20)]
    worst = worst_case(adapter, [Message(role="user", content=rows[0])], max_tokens=500,
                       batch=True)
    live = worst_case(adapter, [Message(role="user", content=rows[0])], max_tokens=500)
    assert worst * 2 == live  # reserved at the batch price: half the live one
    budget = worst * 7 + worst / 2
    result = batch("{row}", rows, model=adapter, max_tokens=500, budget=budget, deferred=True,
                   poll_interval=0, checkpoint=tmp_path / "b.jsonl", progress=False)
    assert len(job_lines(batches)) == 7 and len(fake.chat_requests) == 7
    assert [r.text for r in result[:7]] == [f"echo: row {i:02d}" for i in range(7)]
    over = [r for r in result[7:] if isinstance(r, BudgetExceededError)]
    assert len(over) == 13 and all(r.code == "budget_exceeded" for r in over)
    assert result.not_sent == 13 and result.failed == 0
    assert result.cost.usd <= budget and result.budget.spent == result.cost.usd
    assert result.budget.reserved == Decimal(0)
    # a resumed run with a larger budget sends only the rest, in a new job
    more = batch("{row}", rows, model=openai_adapter(fake), max_tokens=500, budget=worst * 20,
                 deferred=True, poll_interval=0, checkpoint=tmp_path / "b.jsonl", progress=False)
    assert more.resumed == 7 and len(batches.created) == 2 and len(job_lines(batches)) == 13
    assert more.ok == 20


def test_rows_cancelled_before_their_job_is_submitted_are_not_sent(
    openai: Any, tmp_path: Path
) -> None:
    fake, batches = openai
    token = CancelToken()
    token.cancel("changed my mind")
    result = batch("{row}", prompts(5), model=openai_adapter(fake), deferred=True,
                   poll_interval=0, cancel=token, checkpoint=tmp_path / "n.jsonl",
                   progress=False)
    assert not batches.created and not fake.requests
    assert result.not_sent == 5 and result.failed == 0 and result.pending == 0
    assert all(isinstance(r, RequestCancelled) and r.code == "not_sent"
               and "changed my mind" in r.message for r in result)
