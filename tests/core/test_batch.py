"""``batch`` / ``abatch`` against loopback servers: order, templates, failures, rate limits, dropped
connections, deadlines, cancellation and Ctrl-C, checkpoints and resume, the response cache."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

import dispatch_nb
from dispatch_nb import (
    APITimeoutError,
    BatchInterrupted,
    BatchResult,
    CancelToken,
    RequestCancelled,
    RequestError,
    Response,
    abatch,
    batch,
)
from dispatch_nb.batching.limiter import AdaptiveLimiter
from dispatch_nb.batching.rows import TemplateError
from dispatch_nb.cache import CacheMissError, ResponseCache
from dispatch_nb.providers.fake import CanonicalAdapter

from ..fakes.batching import BatchFake
from ..fakes.canonical import CanonicalFake
from ..fakes.provider import Fail, Turn
from ..fakes.server import RecordedRequest

REPO = Path(__file__).resolve().parents[2]


def adapter_for(fake: BatchFake) -> CanonicalAdapter:
    return CanonicalAdapter("echo", base_url=fake.base_url)


def reviews(n: int) -> list[dict[str, Any]]:
    return [{"review": f"review {i}", "stars": i % 5} for i in range(n)]


# -- the basics ------------------------------------------------------------------------------------
def test_rows_come_back_in_input_order_with_totals() -> None:
    with BatchFake(events=5, delay=0.005) as fake:
        result = batch("Classify: {review} ({stars} stars)", reviews(40), model=adapter_for(fake),
                       concurrency=8, progress=False)
    assert isinstance(result, BatchResult) and len(result) == 40
    assert [r.text for r in result] == [f"echo: Classify: review {i} ({i % 5} stars)"
                                        for i in range(40)]
    assert result.ok == 40 and result.failed == 0 and result.sent == 40
    assert result.model_calls == 40 and result.retries == 0
    assert result.usage.output_tokens == 40 * 5
    assert result.usage.input_tokens == sum(r.usage.input_tokens for r in result)
    assert result.model == "fake:echo"
    assert fake.max_active <= 8
    assert all(result.latency(i) > 0 and result.origin(i) == "sent" for i in range(40))
    assert "40 rows: 40 ok" in repr(result)


def test_a_one_row_batch_says_one_row() -> None:
    with BatchFake(events=2) as fake:
        result = batch("Classify: {review}", reviews(1), model=adapter_for(fake), progress=False)
    assert result.summary().startswith("1 row: 1 ok")


def test_a_wide_batch_runs_all_its_streams_at_once_on_reused_connections() -> None:
    # httpx's and aiohttp's default pools stop at 100 connections: a batch asking for 200 at once
    # must get 200, and its 400 rows must reuse them (a stream's connection goes back to the pool).
    with BatchFake(events=4, delay=0.4) as fake:  # a stream lasts 1.2 s: time to open them all
        result = batch("{review}", reviews(400), model=adapter_for(fake), concurrency=200,
                       progress=False)
        connections = fake.server.connections_made
    assert result.ok == 400
    assert fake.max_active > 180, f"at most {fake.max_active} streams ran at once"
    assert connections <= 260, f"{connections} connections for 400 rows at concurrency 200"


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
@pytest.mark.parametrize("concurrency", [8, 64, 256])
def test_every_answer_arrives_whole_at_any_concurrency(concurrency: int, stream: bool) -> None:
    # (kept from the paced-reads tests: whatever the concurrency, sync or async, every answer whole)
    with BatchFake(events=6, delay=0.005) as fake:
        adapter = adapter_for(fake)
        result = batch("row {row}", list(range(12)), model=adapter, concurrency=concurrency,
                       stream=stream, progress=False)

        async def main() -> list[str]:
            answers = await abatch("row {row}", list(range(6)), model=adapter,
                                   concurrency=concurrency, stream=stream, progress=False)
            return [r.text for r in answers]

        texts = asyncio.run(main())
        adapter.close()
    assert [r.text for r in result] == [f"echo: row {i}" for i in range(12)]
    assert texts == [f"echo: row {i}" for i in range(6)]
    assert all(r.usage.output_tokens == 6 for r in result)


class _WordFake(CanonicalFake):
    """Answers every request with JSON about the prompt's last word (``{"word", "length"}``)."""

    def default_turn(self, request: RecordedRequest) -> Any:
        word = self.last_user_text(request).split()[-1]
        return Turn(text=json.dumps({"word": word, "length": len(word)}))


class Word(BaseModel):
    word: str
    length: int


def test_output_validates_every_row_into_parsed_and_a_parsed_column() -> None:
    pd = pytest.importorskip("pandas")
    frame = pd.DataFrame({"w": ["alpha", "be", "gamma"]})
    with _WordFake() as fake:
        result = batch("Describe {w}", frame, model=CanonicalAdapter("echo", base_url=fake.base_url),
                       output=Word, concurrency=2, progress=False)
        assert all(r.json["output"]["schema"]["properties"].keys() == {"word", "length"}
                   for r in fake.chat_requests)
        plain = batch("Describe {w}", frame, model=CanonicalAdapter("echo", base_url=fake.base_url),
                      progress=False)
    assert [r.parsed for r in result] == [Word(word="alpha", length=5), Word(word="be", length=2),
                                          Word(word="gamma", length=5)]
    table = result.to_pandas()
    assert list(table["w"]) == ["alpha", "be", "gamma"]
    assert list(table["parsed"]) == [r.parsed for r in result]
    assert list(pd.json_normalize([p.model_dump() for p in table["parsed"]])["length"]) == [5, 2, 5]
    assert "parsed" not in plain.to_pandas().columns  # no output=: answers are text


def test_str_rows_series_and_dataframe_fill_the_template() -> None:
    pd = pytest.importorskip("pandas")
    frame = pd.DataFrame({"text": ["good", "bad", "fine"], "id": [7, 8, 9]},
                         index=["a", "b", "c"])
    with BatchFake() as fake:
        adapter = adapter_for(fake)
        plain = batch("Rate {row}", ["good", "bad"], model=adapter, progress=False)
        series = batch("Rate {text}!", frame["text"], model=adapter, progress=False)
        table = batch("{id}: {text.upper()}", frame, model=adapter, progress=False)
        expr = batch("{len(row)} chars; literal {{braces}} and {'a': 1}", ["abc"], model=adapter,
                     progress=False)
        function = batch(lambda row: f"custom {row['id']}", frame, model=adapter, progress=False)
        clash = batch("{text}", frame.assign(answer=1), model=adapter, progress=False)
    assert plain.texts == ["echo: Rate good", "echo: Rate bad"]
    assert series.texts == ["echo: Rate good!", "echo: Rate bad!", "echo: Rate fine!"]
    assert table.texts == ["echo: 7: GOOD", "echo: 8: BAD", "echo: 9: FINE"]
    assert expr.texts == ["echo: 3 chars; literal {braces} and {'a': 1}"]
    assert function.texts == ["echo: custom 7", "echo: custom 8", "echo: custom 9"]
    out = table.to_pandas()
    assert list(out.index) == ["a", "b", "c"]
    assert list(out["text"]) == ["good", "bad", "fine"]
    assert list(out["answer"]) == table.texts and list(out["error"]) == [None] * 3
    assert list(out["output_tokens"]) == [4, 4, 4]
    assert list(series.to_pandas()["text"]) == ["good", "bad", "fine"]
    with pytest.raises(ValueError, match="prefix="):
        clash.to_pandas()
    assert list(clash.to_pandas(prefix="llm_")["llm_answer"]) == clash.texts == [
        "echo: good", "echo: bad", "echo: fine"]


def test_dict_rows_that_clash_with_the_added_columns_name_their_keys() -> None:
    pytest.importorskip("pandas")
    with BatchFake() as fake:
        result = batch("{text}", [{"text": "good", "status": 1}], model=adapter_for(fake),
                       progress=False)
    # the words of the error before the batching refactor: dict rows have keys, not columns
    with pytest.raises(ValueError, match=r"^the rows already have key\(s\) status; call "
                       r"to_pandas\(prefix='llm_'\)"):
        result.to_pandas()
    assert list(result.to_pandas(prefix="llm_")["status"]) == [1]


def test_a_generator_is_read_as_slots_free_up_not_loaded_whole() -> None:
    produced = 0
    ahead: list[int] = []

    def rows() -> Iterator[str]:
        nonlocal produced
        for i in range(200):
            produced += 1
            yield f"row {i}"

    class Watching(BatchFake):
        def _dispatch(self, request: Any) -> Any:
            if self.is_chat(request):
                with self._state:
                    ahead.append(produced - sum(self.answered.values()))
            return super()._dispatch(request)

    with Watching(events=3, delay=0.002) as fake:
        result = batch("{row}", rows(), model=adapter_for(fake), concurrency=4, progress=False)
    assert len(result) == 200 and result.ok == 200
    # never more than the slots in flight (+ the row waiting for one, + rows just finishing)
    assert max(ahead) <= 4 + 2, max(ahead)


def test_a_template_naming_a_missing_column_fails_before_anything_is_sent() -> None:
    with BatchFake() as fake:
        with pytest.raises(TemplateError, match=r"\{revew\} names nothing in this row.*review"):
            batch("Classify: {revew}", reviews(5), model=adapter_for(fake), progress=False)
        assert fake.chat_requests == []
        # a later row lacking the name fails alone
        rows: list[dict[str, Any]] = [{"a": 1}, {"b": 2}, {"a": 3}]
        result = batch("value {a}", rows, model=adapter_for(fake), progress=False)
    assert result.texts == ["echo: value 1", None, "echo: value 3"]
    assert isinstance(result[1], RequestError) and "row 1" in result[1].message
    assert (result[1].status_code, result[1].code) == (None, "invalid_request")
    assert result.origin(1) == "not sent" and result.failed == 1 and result.not_sent == 0


def test_bad_arguments_are_clear_errors() -> None:
    with BatchFake() as fake:
        adapter = adapter_for(fake)
        with pytest.raises(TypeError, match="single string"):
            batch("{row}", "abc", model=adapter)
        with pytest.raises(ValueError, match="concurrency"):
            batch("{row}", ["a"], model=adapter, concurrency=0)
        with pytest.raises(ValueError, match="timeout"):
            batch("{row}", ["a"], model=adapter, timeout=0)
        with pytest.raises(TypeError, match="does not understand option"):
            batch("{row}", ["a"], model=adapter, progress=False, bogus=1)
        with pytest.raises(ValueError, match="temperature"):
            batch("{row}", ["a"], model=adapter, progress=False, temperature=7)
        with pytest.raises(TypeError, match="model must be"):
            batch("{row}", ["a"], model=42)  # type: ignore[arg-type]
        assert fake.chat_requests == []


def test_options_reach_every_call() -> None:
    with BatchFake() as fake:
        batch("{row}", ["a", "b"], model=adapter_for(fake), system="Be brief.", max_tokens=33,
              temperature=0.5, tools=[{"name": "lookup", "description": "Look up",
                                       "parameters": {"type": "object", "properties": {}}}],
              progress=False)
    for request in fake.chat_requests:
        body = request.json
        assert body["system"] == "Be brief." and body["max_tokens"] == 33
        assert body["temperature"] == 0.5 and body["stream"] is False  # rows are not streamed
        assert [t["name"] for t in body["tools"]] == ["lookup"]


def test_a_batch_checks_its_tools_once_not_once_per_row(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tools and options every row shares are checked for the batch, not again for each
    of its rows (a thousand rows need not check the same tools a thousand times)."""
    import dispatch_nb.adapter
    import dispatch_nb.batching.run
    from dispatch_nb.validation import check_tools

    checked: list[object] = []

    def counting(tools: object) -> None:
        checked.append(tools)
        check_tools(tools)

    monkeypatch.setattr(dispatch_nb.adapter, "check_tools", counting)
    monkeypatch.setattr(dispatch_nb.batching.run, "check_tools", counting)
    lookup = {"name": "lookup", "description": "Look up",
              "parameters": {"type": "object", "properties": {}}}
    counts = []
    with BatchFake() as fake:
        for rows in (1, 30):
            checked.clear()
            result = batch("{row}", list(range(rows)), model=adapter_for(fake), tools=[lookup],
                           concurrency=4, progress=False)
            assert result.ok == rows
            counts.append(len(checked))
    assert counts[0] == counts[1] <= 3
    assert [t["name"] for r in fake.chat_requests for t in r.json["tools"]] == ["lookup"] * 31


def test_rows_stream_only_when_asked_and_the_answers_are_the_same(tmp_path: Path) -> None:
    rows = [f"row {i}" for i in range(6)]
    with BatchFake(events=5, delay=0.002) as fake:
        plain = batch("{row}", rows, model=adapter_for(fake), progress=False)
        streamed = batch("{row}", rows, model=adapter_for(fake), stream=True, progress=False)
        assert [r.json["stream"] for r in fake.chat_requests] == [False] * 6 + [True] * 6
        # streaming is not part of what was asked: a streamed run resumes a plain one's checkpoint
        path = tmp_path / "run.jsonl"
        batch("{row}", rows[:3], model=adapter_for(fake), checkpoint=path, progress=False)
        resumed = batch("{row}", rows, model=adapter_for(fake), checkpoint=path, stream=True,
                        progress=False)
        assert sum(fake.asked.values()) == 6 + 6 + 3 + 3
    assert plain.texts == streamed.texts == resumed.texts == [f"echo: {r}" for r in rows]
    assert [r.usage.output_tokens for r in plain] == [r.usage.output_tokens for r in streamed]
    assert resumed.resumed == 3 and resumed.sent == 3
    with pytest.raises(TypeError, match="stream must be True or False"):
        batch("{row}", rows, model=adapter_for(fake), stream="yes", progress=False)  # type: ignore[arg-type]


# -- failures -----------------------------------------------------------------------------------
def test_one_failure_never_loses_the_rest() -> None:
    fail = {"row 3": Fail(400, "this one is malformed", "invalid_request_error"),
            "row 7": Fail(401, "no", "authentication_error")}
    with BatchFake(fail=fail) as fake:
        result = batch("row {row}", list(range(10)), model=adapter_for(fake), progress=False)
    assert result.ok == 8 and result.failed == 2
    assert isinstance(result[3], RequestError) and result[3].status_code == 400
    assert isinstance(result[7], dispatch_nb.AuthenticationError) and result[7].status_code == 401
    assert [i for i, _ in result.errors] == [3, 7]
    assert fake.asked["row 3"] == 1 and fake.asked["row 7"] == 1  # not retryable: asked once
    assert result.texts[4] == "echo: row 4"
    with pytest.raises(RequestError, match="2 of 10 rows failed; row 3") as info:
        result.raise_for_errors()
    assert (info.value.status_code, info.value.code) == (400, "invalid_request")


@pytest.mark.parametrize("retry_after", [None, 0.05], ids=["no-retry-after", "retry-after"])
def test_a_429_storm_slows_the_whole_batch_and_every_row_arrives(retry_after: float | None) -> None:
    rows = [f"row {i}" for i in range(80)]
    with BatchFake(capacity=4, retry_after=retry_after, events=4, delay=0.01) as fake:
        adapter = adapter_for(fake)
        adapter.retry_backoff = 0.02  # the batch's backoff follows the adapter's rules...
        result = batch("{row}", rows, model=adapter, concurrency=32, max_retries=30,
                       progress=False)
    assert result.ok == 80, result.errors[:3]
    assert result.texts == [f"echo: {r}" for r in rows]
    assert fake.rate_limited > 0 and result.rate_limited == fake.rate_limited
    assert result.retries == fake.rate_limited
    # the whole batch backed off: concurrency went from 32 to about the server's capacity
    assert result.lowest_concurrency is not None and result.lowest_concurrency <= 8
    assert all(fake.answered[r] == 1 for r in rows)
    # far fewer 429s than 32 rows hammering a 4-slot server with fixed concurrency would get
    assert fake.rate_limited < 200


def test_the_limiter_halves_once_per_burst_and_grows_back() -> None:
    async def scenario() -> None:
        limiter = AdaptiveLimiter(16)
        epochs = [await limiter.acquire() for _ in range(10)]
        for epoch in epochs[:5]:  # five 429s from one burst: one decrease
            limiter.on_rate_limited(epoch, None)
        assert limiter.limit == 8 and limiter.decreases == 1
        later = limiter.epoch
        limiter.on_rate_limited(later, 0.2)  # a request started after the decrease: again
        assert limiter.limit == 4 and limiter.paused_for > 0.1
        for _ in range(10):
            limiter.release()
        started = time.monotonic()
        await limiter.acquire()  # held until retry-after has passed
        assert time.monotonic() - started >= 0.15
        for _ in range(200):
            limiter.on_success()
        assert limiter.limit == 16  # back to the ceiling, never above

    asyncio.run(scenario())


def test_the_batch_backs_off_by_the_adapters_retry_backoff() -> None:
    with BatchFake(drop_every_first=True, events=2) as fake:
        adapter = adapter_for(fake)
        adapter.retry_backoff = 60.0  # the first wait (8 s capped, 6 s at least) passes the deadline
        result = batch("{row}", ["a"], model=adapter, timeout=5, progress=False)
    assert result.ok == 0 and fake.asked["a"] == 1  # not retried: it could not finish in time
    assert result.errors[0][1].code == "network_error"


def test_dropped_connections_are_retried_and_no_row_is_lost() -> None:
    with BatchFake(drop_every_first=True, events=6, delay=0.002) as fake:
        adapter = adapter_for(fake)
        adapter.retry_backoff = 0.01
        result = batch("{row}", [f"row {i}" for i in range(20)], model=adapter, concurrency=5,
                       progress=False)
    assert result.ok == 20 and result.retries == 20
    assert all(fake.asked[f"row {i}"] == 2 for i in range(20))
    assert all(result.attempts(i) == 2 for i in range(20))
    assert result.texts == [f"echo: row {i}" for i in range(20)]


def test_without_retries_a_dropped_stream_is_the_rows_error_with_its_partial() -> None:
    with BatchFake(drop_first={"row 1"}, events=8) as fake:
        result = batch("{row}", ["row 0", "row 1"], model=adapter_for(fake), max_retries=0,
                       stream=True, progress=False)
    assert result.texts[0] == "echo: row 0"
    error = result[1]
    assert isinstance(error, dispatch_nb.APIConnectionError) and error.code == "network_error"
    assert error.partial is not None and "echo:".startswith(error.partial.text[:5])


def test_the_timeout_is_a_deadline_per_row() -> None:
    with BatchFake(stall={"slow": 30.0}, events=3) as fake:
        started = time.monotonic()
        result = batch("{row}", ["fast", "slow", "fast too"], model=adapter_for(fake), timeout=1.0,
                       progress=False)
        took = time.monotonic() - started
    assert took < 5
    assert result.texts[0] == "echo: fast" and result.texts[2] == "echo: fast too"
    assert isinstance(result[1], APITimeoutError) and "1 s timeout" in result[1].message
    assert result[1].code == "timeout"


# -- stopping ---------------------------------------------------------------------------------------
def test_a_cancel_token_stops_the_batch_promptly_keeping_finished_rows(tmp_path: Path) -> None:
    token = CancelToken()
    rows = ["quick"] + [f"row {i}" for i in range(29)]
    path = tmp_path / "run.jsonl"

    cancelled: list[float] = []

    def cancel_after_the_first_row() -> None:
        for _ in range(1000):
            if path.exists() and path.read_text():
                break
            time.sleep(0.01)
        time.sleep(0.3)  # rows 1 and 2 have had their first piece since they were asked
        cancelled.append(time.monotonic())
        token.cancel("enough")

    # every row but the quick one sends the first of its 4 pieces at once, then nothing (until
    # the client hangs up): a row in flight holds a partial answer whenever the cancel comes
    with BatchFake(events=4, fast={"quick"}, stall={row: 60.0 for row in rows[1:]}) as fake:
        threading.Thread(target=cancel_after_the_first_row, daemon=True).start()
        result = batch("{row}", rows, model=adapter_for(fake), concurrency=3, cancel=token,
                       checkpoint=path, stream=True, progress=False)  # streamed: partials kept
        took = time.monotonic() - cancelled[0]
    assert took < 1.0  # rows in flight (each a minute long) stopped at once
    assert result.interrupted and len(result) == 30
    assert isinstance(result[0], Response)  # finished before the cancel: kept
    in_flight = [i for i in range(30) if result.attempts(i) > 0 and i > 0]
    assert in_flight and all(isinstance(result[i], RequestCancelled) for i in in_flight)
    assert all(result[i].code == "cancelled" for i in in_flight)
    assert any(result[i].partial is not None and result[i].partial.text for i in in_flight)
    never = [i for i in range(30) if result.attempts(i) == 0]
    assert never and all(result.origin(i) == "not sent" and result[i].code == "not_sent" for i in never)
    assert result.not_sent == len(never) and result.cancelled == len(in_flight)
    assert result.failed == 0 and result.errors == []  # cancelled is not failed
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [e["row"] for e in lines] == [0]  # cancelled rows are not written


def test_a_retry_adds_its_time_to_elapsed_and_ends_the_interruption() -> None:
    """A batch stopped by its cancel token (``interrupted``), then ``retry_failed()``, which
    answers every row: ``interrupted`` is the last call's (False) and ``elapsed`` — the time spent
    running the batch, in the summary — adds the retry's to the first call's."""
    token = CancelToken()
    token.cancel("enough")
    rows = [f"row {i}" for i in range(4)]
    with BatchFake(events=6, delay=0.1) as fake:  # each row: 6 pieces 0.1 s apart
        result = batch("{row}", rows, model=adapter_for(fake), cancel=token, stream=True,
                       progress=False)
        assert result.interrupted and result.not_sent == 4 and "interrupted" in result.summary()
        first = result.elapsed
        began = time.monotonic()
        assert result.retry_failed() is result
        took = time.monotonic() - began
    assert result.ok == 4 and not result.interrupted and "interrupted" not in result.summary()
    assert took >= 0.5
    assert first + took - 0.25 < result.elapsed <= first + took
    assert result.summary().endswith(f"; {result.elapsed:.1f} s")


def test_ctrl_c_stops_promptly_and_keeps_every_finished_row(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    signalled: list[float] = []

    def interrupt_after_the_first_row() -> None:
        for _ in range(1000):
            if path.exists() and path.read_text():
                break
            time.sleep(0.01)
        signalled.append(time.monotonic())
        os.kill(os.getpid(), signal.SIGINT)  # what the notebook's stop button does

    with BatchFake(events=30, delay=0.05, fast={"row 0"}) as fake:
        adapter = adapter_for(fake)
        threading.Thread(target=interrupt_after_the_first_row, daemon=True).start()
        with pytest.raises(BatchInterrupted) as caught:
            batch("{row}", [f"row {i}" for i in range(40)], model=adapter, concurrency=4,
                  checkpoint=path, stream=True, progress=False)
        took = time.monotonic() - signalled[0]
    assert isinstance(caught.value, KeyboardInterrupt)
    assert took < 1.0  # rows in flight (each ~1.5 s long) stopped within a second of Ctrl-C
    result = caught.value.result
    assert result.interrupted and len(result) == 40
    finished = [i for i, item in enumerate(result) if isinstance(item, Response)]
    assert 0 in finished
    assert any(isinstance(item, RequestCancelled) and item.code == "cancelled" and item.partial is not None
               for item in result)
    written = {e["row"] for e in map(json.loads, path.read_text().splitlines())}
    assert written == set(finished)
    assert "run the batch again to send only the rest" in str(caught.value)


async def test_abatch_runs_on_the_callers_loop_and_task_cancel_keeps_the_checkpoint(
    tmp_path: Path,
) -> None:
    with BatchFake(events=3) as fake:
        result = await abatch("{row}", ["a", "b", "c"], model=adapter_for(fake), progress=False)
        assert result.texts == ["echo: a", "echo: b", "echo: c"]

    path = tmp_path / "run.jsonl"
    with BatchFake(events=20, delay=0.05) as fake:
        task = asyncio.create_task(
            abatch("{row}", ["x"] * 1 + [f"r{i}" for i in range(10)], model=adapter_for(fake),
                   concurrency=2, checkpoint=path, progress=False))
        for _ in range(400):  # until the first row is in the checkpoint (~1 s; more under load)
            if path.exists() and path.read_text():
                break
            await asyncio.sleep(0.025)
        started = time.monotonic()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert time.monotonic() - started < 1.0
    rows = {e["row"] for e in map(json.loads, path.read_text().splitlines())}
    assert rows and rows <= {0, 1}  # the first rows finished (~1 s each); the rest never did


# -- checkpoints and resume -------------------------------------------------------------------------
def test_a_resumed_run_sends_exactly_the_missing_rows(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    first = [f"row {i}" for i in range(10)]
    fail = {"row 3": Fail(400, "bad"), "row 7": Fail(400, "bad")}
    with BatchFake(fail=fail) as fake:
        result = batch("{row}", first, model=adapter_for(fake), checkpoint=path, progress=False)
    assert result.ok == 8 and result.failed == 2
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    # the checkpoint is a response cache of the answered rows, keyed by row; failures are in the
    # result (and sent again next time), not in the file
    assert sorted(e["row"] for e in lines) == [0, 1, 2, 4, 5, 6, 8, 9]
    assert all(e["label"] == f"row {e['row']}" and e["streamed"] is False for e in lines)
    stored = ResponseCache(path, mode="replay")
    assert [Response.model_validate(stored.get(e["key"])["response"]).text  # type: ignore[index]
            for e in lines] == [f"echo: row {e['row']}" for e in lines]

    # Again: the rows reordered, five new ones, and the server fixed: only 3, 7 and the new ones.
    second = list(reversed(first)) + [f"row {i}" for i in range(10, 15)]
    with BatchFake() as fake:
        result = batch("{row}", second, model=adapter_for(fake), checkpoint=path, progress=False)
        assert sorted(fake.asked) == sorted(["row 3", "row 7"] + [f"row {i}" for i in range(10, 15)])
        assert sum(fake.asked.values()) == 7
    assert result.ok == 15 and result.resumed == 8 and result.sent == 7
    assert result.texts == [f"echo: {r}" for r in second]
    assert "8 from the checkpoint, 7 sent" in result.summary()
    assert [result.origin(i) for i in range(3)] == ["checkpoint", "checkpoint", "sent"]

    # A third time: nothing left to send.
    with BatchFake() as fake:
        result = batch("{row}", second, model=adapter_for(fake), checkpoint=path, progress=False)
        assert fake.chat_requests == []
    assert result.resumed == 15 and result.sent == 0

    # What was asked is the key: another system prompt or model is another request.
    with BatchFake() as fake:
        batch("{row}", first[:2], model=adapter_for(fake), checkpoint=path, system="Other.",
              progress=False)
        assert sum(fake.asked.values()) == 2


def test_a_checkpoint_written_in_the_earlier_format_resumes(tmp_path: Path) -> None:
    # One line per finished row, failed rows too (with no response): the answered lines are read
    # as cache entries, the failed one is sent again.
    from dispatch_nb.batching.rows import RowCall, row_key

    material = RowCall().key_material()
    old = []
    for i, ok in ((0, True), (1, False), (2, True)):
        line: dict[str, Any] = {"key": row_key("fake:echo", f"row {i}", material), "v": 1,
                                "row": i, "ok": ok, "created": "2026-11-20T10:00:00Z",
                                "latency": 1.5, "attempts": 1, "usage": {"input_tokens": 2,
                                                                         "output_tokens": 4}}
        if ok:
            line["response"] = {"model": "echo", "content": [{"type": "text",
                                                              "text": f"old answer {i}"}]}
        else:
            line["error"] = {"type": "RequestError", "message": "bad", "status_code": 400,
                             "code": "invalid_request"}
        old.append(json.dumps(line))
    path = tmp_path / "old.jsonl"
    path.write_text("\n".join(old) + "\n")
    with BatchFake() as fake:
        result = batch("{row}", [f"row {i}" for i in range(4)], model=adapter_for(fake),
                       checkpoint=path, progress=False)
        assert sorted(fake.asked) == ["row 1", "row 3"]
    assert result.texts == ["old answer 0", "echo: row 1", "old answer 2", "echo: row 3"]
    assert result.resumed == 2 and result.usage_of(0) == (2, 4) and result.latency(0) == 1.5


def test_a_checkpoint_line_being_written_is_read_once_whole(
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    # Another process appends a row in two writes: the half line is not an answer yet (and no
    # warning), the whole one is, and the lines read before are not read again.
    from dispatch_nb.batching.checkpoint import Checkpoint

    path = tmp_path / "run.jsonl"
    with BatchFake() as fake:
        batch("{row}", ["a"], model=adapter_for(fake), checkpoint=path, progress=False)
    first = path.read_text()
    checkpoint = Checkpoint(path)
    key_a = json.loads(first)["key"]
    assert checkpoint.answer(key_a) is not None
    line = first.replace(key_a, "k2").replace("echo: a", "echo: b")
    with open(path, "a") as fh:
        fh.write(line[:40])
    with caplog.at_level("WARNING", logger="dispatch_nb"):
        assert checkpoint.answer("k2") is None
    assert "not a cache entry" not in caplog.text
    with open(path, "a") as fh:
        fh.write(line[40:])
    answer = checkpoint.answer("k2")
    assert answer is not None and answer[0].text == "echo: b"
    assert checkpoint.answer(key_a) is not None


def test_a_batch_reads_each_checkpoint_line_once_while_it_appends(
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    # A line cut short by a crash starts the file: it is reported once, not once per row appended
    # (the store reads only what was appended since it last looked).
    path = tmp_path / "run.jsonl"
    path.write_text('{"key": "cut short\n')
    with BatchFake() as fake, caplog.at_level("WARNING", logger="dispatch_nb"):
        result = batch("{row}", [f"row {i}" for i in range(30)], model=adapter_for(fake),
                       concurrency=4, checkpoint=path, progress=False)
    assert result.ok == 30 and len(path.read_text().splitlines()) == 31
    assert caplog.text.count("line 1 is not a cache entry") == 1, caplog.text


def test_repeated_rows_each_get_an_answer_and_resume(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    with BatchFake() as fake:
        result = batch("{row}", ["same", "same", "other"], model=adapter_for(fake),
                       checkpoint=path, progress=False)
        assert fake.asked["same"] == 2
    keys = [json.loads(line)["key"] for line in path.read_text().splitlines()]
    assert len(set(keys)) == 3
    with BatchFake() as fake:
        again = batch("{row}", ["same", "same", "same", "other"], model=adapter_for(fake),
                      checkpoint=path, progress=False)
        assert fake.asked == {"same": 1}  # only the third "same" is new
    assert result.ok == 3 and again.resumed == 3 and again.sent == 1


def test_a_retried_repeated_row_is_recorded_under_its_own_key(tmp_path: Path) -> None:
    """retry_failed() of the second of two identical rows sends it and records it under the key
    the whole batch gives it (…#1), not the first row's: a rerun of the batch sends nothing."""
    path = tmp_path / "run.jsonl"
    rows = ["same", "other", "same"]
    with BatchFake() as fake:  # the first "same" answered earlier, in this checkpoint
        batch("{row}", rows[:1], model=adapter_for(fake), checkpoint=path, progress=False)
    with BatchFake(fail={"same": Fail(500, "down", "api_error")}) as fake:
        result = batch("{row}", rows, model=adapter_for(fake), checkpoint=path, max_retries=0,
                       progress=False)
        assert [result.origin(i) for i in range(3)] == ["checkpoint", "sent", "sent"]
        assert result.ok == 2 and isinstance(result[2], dispatch_nb.ServerError)
        assert result[2].status_code == 500
        fake.fail.clear()
        fake.asked.clear()
        assert result.retry_failed() is result
        assert fake.asked == {"same": 1}  # sent, not read from the first row's answer
    assert result.ok == 3 and result.texts == ["echo: same", "echo: other", "echo: same"]
    assert result.origin(2) == "sent"
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    keys = [line["key"] for line in lines]
    assert len(keys) == len(set(keys)) == 3 and keys[2] == f"{keys[0]}#1"
    # the retried row's line names it as the batch's row 2 (not the retry's first row)
    assert [(line["row"], line["label"]) for line in lines] == [(i, f"row {i}") for i in range(3)]
    with BatchFake() as fake:
        again = batch("{row}", rows, model=adapter_for(fake), checkpoint=path, progress=False)
        assert fake.chat_requests == []
    assert again.resumed == 3 and again.sent == 0 and again.texts == result.texts


def test_a_killed_kernel_loses_at_most_the_rows_in_flight(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    rows = [f"row {i}" for i in range(30)]
    # rows 9 and on wait until their client hangs up: the kill lands with three rows in flight
    # however busy the machine is (a kill timed by the clock could land after the last row)
    with BatchFake(events=10, delay=0.03, stall={row: 60.0 for row in rows[9:]}) as fake:
        script = (
            "import sys; from dispatch_nb import batch; from dispatch_nb.providers.fake import "
            "CanonicalAdapter\n"
            f"batch('{{row}}', {rows!r}, model=CanonicalAdapter('echo', base_url={fake.base_url!r}), "
            f"concurrency=3, checkpoint={str(path)!r}, progress=False)\n"
        )
        kernel = subprocess.Popen([sys.executable, "-c", script], env={**os.environ,
                                  "PYTHONPATH": str(REPO)})
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if (path.exists() and len(path.read_text().splitlines()) >= 9
                    and sum(fake.asked.values()) >= 12):
                break
            time.sleep(0.02)
        kernel.kill()  # SIGKILL: no cleanup, no flush of anything we did not write already
        kernel.wait(10)
        done_before = {json.loads(line)["row"] for line in path.read_text().splitlines()}
        asked_before = sum(fake.asked.values())
        assert 9 <= len(done_before) < 30
        assert asked_before - len(done_before) <= 3  # in flight when killed: at most concurrency
        fake.stall.clear()
        result = batch("{row}", rows, model=adapter_for(fake), checkpoint=path, progress=False)
        resent = sum(fake.asked.values()) - asked_before
    assert result.ok == 30 and result.texts == [f"echo: {r}" for r in rows]
    assert result.resumed == len(done_before) and resent == 30 - len(done_before)
    assert all(fake.answered[f"row {i}"] == 1 for i in done_before)


def test_the_checkpoint_never_holds_a_secret(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    secret = "sk-test-" + "Z" * 30
    monkeypatch.setenv("OPENAI_API_KEY", secret)
    path = tmp_path / "run.jsonl"
    with BatchFake() as fake:
        result = batch("my key is {row}", [secret], model=adapter_for(fake), checkpoint=path,
                       progress=False)
    assert secret in result[0].text  # the live answer is untouched
    text = path.read_text()
    assert secret not in text and "[REDACTED]" in text


# -- the response cache -------------------------------------------------------------------------------
def test_batches_record_and_replay_through_the_response_cache(tmp_path: Path) -> None:
    path = tmp_path / "answers.dispatch-cache.jsonl"
    rows = [f"row {i}" for i in range(6)]
    with BatchFake() as fake:
        recorded = batch("{row}", rows, model=adapter_for(fake),
                         cache=ResponseCache(path, mode="record"), progress=False)
        assert sum(fake.asked.values()) == 6
    labels = [json.loads(line)["label"] for line in path.read_text().splitlines()]
    assert sorted(labels) == sorted(f"row {i}" for i in range(6))
    with BatchFake() as fake:  # replay: nothing reaches the server
        replayed = batch("{row}", rows, model=adapter_for(fake),
                         cache=ResponseCache(path, mode="replay"), progress=False)
        missing = batch("{row}", ["row 0", "new row"], model=adapter_for(fake),
                        cache=ResponseCache(path, mode="replay"), progress=False)
        assert fake.chat_requests == []
    assert replayed.texts == recorded.texts and replayed.replayed == 6 and replayed.model_calls == 0
    assert [replayed.origin(i) for i in range(6)] == ["replayed"] * 6
    assert missing.texts[0] == "echo: row 0"
    assert isinstance(missing[1], CacheMissError) and "row 1" in missing[1].message
    assert missing[1].code == "cache_miss"


# -- progress -----------------------------------------------------------------------------------------
def test_the_text_progress_bar_shows_counts_tokens_rate_and_eta(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with BatchFake(events=4, delay=0.05, fail={"row 2": Fail(400, "bad")}) as fake:
        batch("{row}", [f"row {i}" for i in range(12)], model=adapter_for(fake), concurrency=2,
              progress=True)
    err = capsys.readouterr().err
    last = err.replace("\r", "\n").strip().splitlines()[-1]
    assert "12/12" in last and "ok 11" in last and "failed 1" in last and "in flight 0" in last
    assert "tokens" in last and "rows/s" in last
    assert "ETA" in err  # while it ran
    assert "in flight 2" in err
    quiet = capsys.readouterr()
    assert quiet.err == ""


def test_progress_off_prints_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    with BatchFake() as fake:
        batch("{row}", ["a"], model=adapter_for(fake), progress=False)
    assert capsys.readouterr().err == ""


def test_extra_names_reach_every_row_and_the_row_wins() -> None:
    with BatchFake() as fake:
        result = batch("{prefix}: {text}", [{"text": "a"}, {"text": "b", "prefix": "own"}],
                       model=adapter_for(fake), namespace={"prefix": "Q", "text": "ignored"},
                       progress=False)
    assert result.texts == ["echo: Q: a", "echo: own: b"]


def test_a_labelled_cached_adapter_names_each_row_in_the_cache(tmp_path: Path) -> None:
    from dispatch_nb.cache import CachedAdapter

    path = tmp_path / "c.jsonl"
    with BatchFake() as fake:
        model = CachedAdapter(adapter_for(fake), ResponseCache(path, mode="record"), label="cell 3")
        batch("{row}", ["a", "b"], model=model, progress=False)
    labels = sorted(json.loads(line)["label"] for line in path.read_text().splitlines())
    assert labels == ["cell 3, row 0", "cell 3, row 1"]


def test_the_bar_appears_once_a_row_is_in_flight(capsys: pytest.CaptureFixture[str]) -> None:
    """Not before anything starts (a batch refused before sending shows none), but as soon as a
    row is in flight: a Dask batch learns of its first sent row only when a partition ends."""
    from dispatch_nb.batching.progress import BatchProgress
    from dispatch_nb.batching.result import Stats

    bar = BatchProgress("text", description="batch test")
    bar.update(Stats(total=4))
    assert not bar.shown and capsys.readouterr().err == ""
    bar.update(Stats(total=4, in_flight=2))
    assert bar.shown and "batch test" in capsys.readouterr().err
    bar.close(Stats(total=4, ok=4), "4 rows: 4 ok")
