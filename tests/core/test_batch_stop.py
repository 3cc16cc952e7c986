"""A batch stops sending at an error every row would get (a rejected key, an exhausted quota, an
unknown model), and rows it never sent — after such an error, Ctrl-C or the cancel token — are
"not sent", counted apart from "failed". Against the provider fakes, counting requests."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from dispatch_nb import (
    APIConnectionError,
    AuthenticationError,
    CancelToken,
    DispatchError,
    ModelUnavailableError,
    RateLimitError,
    RequestCancelled,
    Response,
    batch,
)
from dispatch_nb.providers.fake import CanonicalAdapter
from dispatch_nb.providers.openai import OpenAIAdapter

from ..fakes.batching import BatchFake
from ..fakes.openai_chat import OpenAIChatFake
from ..fakes.provider import Fail

ROWS = 300
CONCURRENCY = 16
KEY = "sk-right-" + "R" * 30

QUOTA = Fail(429, "You exceeded your current quota, please check your plan and billing details.",
             "insufficient_quota")
NO_MODEL = Fail(404, "The model `gpt-nope` does not exist or you do not have access to it.",
                "model_not_found")


def openai(fake: OpenAIChatFake, key: str = KEY) -> OpenAIAdapter:
    return OpenAIAdapter("gpt-4.1-mini", backend="compatible", base_url=fake.base_url,
                         api_key=key)


@pytest.mark.parametrize(
    ("kind", "error_class", "code"),
    [("wrong key", AuthenticationError, "authentication_failed"),
     ("exhausted quota", RateLimitError, "quota_exceeded"),
     ("unknown model", ModelUnavailableError, "model_unavailable")],
)
def test_an_error_every_row_would_get_stops_the_batch(
    kind: str, error_class: type[DispatchError], code: str, capsys: pytest.CaptureFixture[str],
) -> None:
    with OpenAIChatFake(api_key=KEY) as fake:
        if kind == "exhausted quota":
            fake.push(*[QUOTA] * ROWS)
        elif kind == "unknown model":
            fake.push(*[NO_MODEL] * ROWS)
        adapter = openai(fake, key="sk-wrong-" + "W" * 30 if kind == "wrong key" else KEY)
        result = batch("row {row}", list(range(ROWS)), model=adapter, concurrency=CONCURRENCY,
                       progress=True)
        requests = len(fake.chat_requests)
    # only the rows already in flight were sent; no retry, nothing after
    assert requests == CONCURRENCY, f"{requests} requests for a {kind}"
    assert result.ok == 0 and result.failed == CONCURRENCY
    assert result.not_sent == ROWS - CONCURRENCY and len(result) == ROWS
    assert result.stopped_by is not None
    position, error = result.stopped_by
    assert isinstance(error, error_class) and error.code == code and position < CONCURRENCY
    sent = [i for i in range(ROWS) if result.attempts(i) == 1]
    assert len(sent) == CONCURRENCY
    assert all(isinstance(result[i], error_class) for i in sent)
    unsent = [i for i in range(ROWS) if i not in set(sent)]
    for i in unsent:
        item = result[i]
        assert type(item) is DispatchError and item.code == "not_sent"
        assert result.origin(i) == "not sent" and result.attempts(i) == 0
        assert item.__cause__ is error and f"row {position}" in item.message
    summary = repr(result)
    assert f"{CONCURRENCY} failed, {ROWS - CONCURRENCY} not sent" in summary
    assert f"stopped at row {position}: {error_class.__name__} ({code})" in summary
    assert [i for i, _ in result.errors] == sent  # .errors: the failed rows, not the unsent ones
    bar = capsys.readouterr().err  # the progress bar: the unsent rows are not done
    assert f"not sent {ROWS - CONCURRENCY}" in bar
    assert f"{CONCURRENCY}/{ROWS}" in bar.splitlines()[-1] and "100%" not in bar
    with pytest.raises(error_class, match=f"{CONCURRENCY} of {ROWS} rows failed, "
                                          f"{ROWS - CONCURRENCY} not sent"):
        result.raise_for_errors()


@pytest.mark.parametrize(
    ("fail", "error_class", "code"),
    [(Fail(402, "Your credit balance is too low to access the Anthropic API.", "billing_error"),
      RateLimitError, "quota_exceeded"),
     (Fail(404, "model: claude-nope", "not_found_error"), ModelUnavailableError,
      "model_unavailable"),
     (Fail(401, "invalid x-api-key", "authentication_error"), AuthenticationError,
      "authentication_failed")],
    ids=["billing", "unknown model", "wrong key"],
)
def test_anthropic_errors_every_row_would_get_stop_the_batch(
    fail: Fail, error_class: type[DispatchError], code: str,
) -> None:
    from dispatch_nb.providers.anthropic import AnthropicAdapter

    from ..fakes.anthropic import AnthropicFake

    with AnthropicFake() as fake:
        fake.push(*[fail] * 100)
        adapter = AnthropicAdapter("claude-nope", base_url=fake.base_url, api_key="sk-ant-test")
        result = batch("row {row}", list(range(100)), model=adapter, concurrency=8,
                       progress=False)
        assert len(fake.chat_requests) == 8
    assert (result.failed, result.not_sent) == (8, 92)
    assert result.stopped_by is not None
    assert isinstance(result.stopped_by[1], error_class) and result.stopped_by[1].code == code


def test_an_option_the_provider_refuses_before_sending_stops_the_batch_at_once() -> None:
    """``max_tokens=10`` on the Responses API (its minimum is 16) is refused before anything is
    sent, for every row alike: the batch stops at the first row instead of refusing 300."""
    from ..fakes.openai_responses import OpenAIResponsesFake

    with OpenAIResponsesFake(api_key=KEY) as fake:
        adapter = OpenAIAdapter("gpt-4.1", backend="official", base_url=fake.base_url,
                                api_key=KEY)
        result = batch("row {row}", list(range(ROWS)), model=adapter, max_tokens=10,
                       concurrency=CONCURRENCY, progress=False)
        assert fake.chat_requests == []
    assert result.stopped_by is not None
    position, error = result.stopped_by
    assert error.code == "invalid_request" and error.option_refused
    assert "max_tokens >= 16" in error.message
    assert result.failed <= CONCURRENCY and result.not_sent >= ROWS - CONCURRENCY
    assert f"stopped at row {position}: RequestError (invalid_request)" in repr(result)
    # a server's own 400 for one row's content is that row's: the batch goes on
    with OpenAIChatFake(api_key=KEY) as fake:
        fake.push(Fail(400, "this row's content was refused", "invalid_request_error"))
        result = batch("row {row}", list(range(20)), model=openai(fake), progress=False,
                       concurrency=1)
        assert result.stopped_by is None and result.failed == 1 and result.ok == 19
        # and so is one row refused before sending for its own content (nothing to send)
        result = batch(lambda row: [] if row == 3 else f"row {row}", list(range(10)),
                       model=openai(fake), progress=False, concurrency=1)
    assert result.stopped_by is None and result.failed == 1 and result.ok == 9
    assert result[3].code == "invalid_request"


def test_the_table_counts_not_sent_rows_apart() -> None:
    pd = pytest.importorskip("pandas")
    frame = pd.DataFrame({"text": [f"t{i}" for i in range(40)]})
    with OpenAIChatFake(api_key=KEY) as fake:
        result = batch("{text}", frame, model=openai(fake, key="sk-wrong-" + "W" * 30),
                       concurrency=4, progress=False)
        assert len(fake.chat_requests) == 4
    table = result.to_pandas()
    assert table["status"].value_counts().to_dict() == {"not sent": 36, "failed": 4}
    assert list(table["text"]) == list(frame["text"])
    assert table.loc[table["status"] == "not sent", "error"].str.startswith(
        "DispatchError: not sent: the batch stopped at row").all()


def test_rows_marked_before_the_stopping_row_was_known_say_why_at_the_end() -> None:
    """On Dask, a partition that saw the batch's stop event can be collected before the partition
    whose 401 set it (a run beside a CPU hog did so): its unsent rows were marked while
    ``stopped_by`` was still unknown. The batch's end says why for them too."""
    from dispatch_nb.batching.plan import finish
    from dispatch_nb.batching.result import BatchResult, RowOrigin, mark_not_sent
    from dispatch_nb.batching.run import _job
    from dispatch_nb.types import Usage

    plan = _job("{row}", ["a", "b", "c"], model="fake:echo", concurrency=2, max_retries=0,
                progress=False).plan
    result = BatchResult(plan.source, model=plan.model_key)
    cancel = CancelToken()
    mark_not_sent(result, 2, cancel)  # collected first: nothing known yet
    assert result[2].message == "not sent: the batch was stopped"
    rejected = AuthenticationError("the key was rejected", code="authentication_failed")
    result.stopped_by = (0, rejected)  # then the partition that stopped the batch
    result._set(0, rejected, usage=Usage(), latency=0.1, attempts=1,
                origin=RowOrigin.SENT)
    mark_not_sent(result, 1, cancel)
    finish(plan, result, cancel)
    for position in (1, 2):
        assert result[position].code == "not_sent"
        assert result[position].message.startswith("not sent: the batch stopped at row 0's "
                                                    "AuthenticationError (authentication_failed)")
        assert result[position].__cause__ is rejected
    assert result.not_sent == 2 and result.failed == 1


def closed_port() -> int:
    """A loopback port nothing listens on: connecting to it is refused."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_a_server_that_cannot_be_reached_stops_the_batch() -> None:
    # Every connection is refused and no row was ever answered: a server that is down, or a wrong
    # base URL. Each row used to be retried 6 times (300 rows: 23 s); now the batch stops as it
    # does at a rejected key, after the first few refusals, saying what to check.
    url = f"http://127.0.0.1:{closed_port()}/v1"
    adapter = OpenAIAdapter("gpt-4.1-mini", backend="compatible", base_url=url, api_key=KEY)
    started = time.monotonic()
    result = batch("row {row}", list(range(ROWS)), model=adapter, concurrency=CONCURRENCY,
                   progress=False)
    took = time.monotonic() - started
    assert took < 5, f"{took:.1f} s against a closed port"
    sent = [i for i in range(ROWS) if result.attempts(i)]
    assert len(sent) == CONCURRENCY and all(result.attempts(i) == 1 for i in sent)  # no retry
    assert (result.ok, result.failed, result.not_sent) == (0, CONCURRENCY, ROWS - CONCURRENCY)
    assert result.stopped_by is not None
    position, error = result.stopped_by
    assert isinstance(error, APIConnectionError) and error.code == "network_error"
    assert result[position] is error
    assert error.message.startswith("the server could not be reached: 3 requests in a row "
                                    "failed to connect and no row was answered (could not "
                                    f"connect to {url}/chat/completions")
    assert error.message.endswith("Check that the server is running and that the base URL is "
                                  "right (the model's base_url=, or "
                                  "DISPATCH_NB_COMPATIBLE_BASE_URL)")
    cause = error.__cause__
    assert isinstance(cause, APIConnectionError) and cause.code == "network_error"
    assert cause.connect_failed and error.connect_failed
    assert all(result[i].code == "not_sent" and result[i].__cause__ is error
               for i in range(ROWS) if i not in set(sent))
    assert f"stopped at row {position}: APIConnectionError (network_error)" in result.summary()


def test_once_a_row_was_answered_connection_failures_do_not_stop_the_batch() -> None:
    # The server answers 3 rows, then goes away: every later row fails to connect, each on its
    # own (retried, then failed); nothing is "not sent", the batch does not stop. (One row at a
    # time: the first 2 answers were read before the third row was asked; the third may be cut.)
    rows = [f"row {i}" for i in range(10)]
    with BatchFake(events=2, delay=0.05) as fake:
        adapter = CanonicalAdapter("echo", base_url=fake.base_url)
        adapter.retry_backoff = 0.01

        def close_after_three_answers() -> None:
            deadline = time.monotonic() + 30
            while sum(fake.answered.values()) < 3 and time.monotonic() < deadline:
                time.sleep(0.005)
            fake.close()

        threading.Thread(target=close_after_three_answers, daemon=True).start()
        result = batch("{row}", rows, model=adapter, concurrency=1, max_retries=1,
                       progress=False)
    assert result.stopped_by is None and result.not_sent == 0
    assert result.ok >= 2 and result.ok + result.failed == 10
    refused = [i for i, error in result.errors if isinstance(error, APIConnectionError)
               and error.code == "network_error" and error.connect_failed]
    assert len(refused) >= 5 and all(result.attempts(i) == 2 for i in refused)


def test_a_dask_partition_stops_at_an_unreachable_server_only_if_no_row_was_answered(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A partition submitted after another one's rows were answered knows the server can be
    reached: its failed connections are its rows' errors, not a reason to stop the batch."""
    from dispatch_nb.batching.cluster import PartitionTask, run_partition
    from dispatch_nb.batching.engine import BatchSettings, Pending
    from dispatch_nb.batching.rows import RowCall

    monkeypatch.setenv("DISPATCH_NB_FAKE_URL", f"http://127.0.0.1:{closed_port()}")
    rows = [Pending(i, f"row {i}", f"key {i}") for i in range(20)]

    def partition(answered: bool) -> Any:
        return run_partition(PartitionTask(
            model="fake:echo", rows=rows, call=RowCall(),
            settings=BatchSettings(concurrency=4, max_retries=0), checkpoint=None, cache=None,
            cancel_event=None, answered=answered))

    first = partition(answered=False)
    assert first.stopped_by is not None
    assert isinstance(first.stopped_by[1], APIConnectionError)
    assert first.stopped_by[1].code == "network_error"
    assert (first.failed, first.not_sent) == (4, 16)
    later = partition(answered=True)
    assert later.stopped_by is None and (later.failed, later.not_sent) == (20, 0)


def test_an_ordinary_rate_limit_is_retried_and_does_not_stop_the_batch() -> None:
    with OpenAIChatFake(api_key=KEY) as fake:
        fake.push(*[Fail(429, "Rate limit reached", "rate_limit_exceeded",
                         headers={"retry-after": "0.05"})] * 3)
        result = batch("row {row}", list(range(20)), model=openai(fake), concurrency=4,
                       progress=False)
        requests = len(fake.chat_requests)
    assert result.ok == 20 and result.stopped_by is None and result.not_sent == 0
    assert result.rate_limited == 3 and requests == 23


def test_a_stopped_batch_reads_no_more_of_a_generator() -> None:
    read = 0

    def rows() -> Iterator[str]:
        nonlocal read
        for i in range(ROWS):
            read += 1
            yield f"row {i}"

    with OpenAIChatFake(api_key=KEY) as fake:
        result = batch("{row}", rows(), model=openai(fake, key="sk-wrong-" + "W" * 30),
                       concurrency=8, progress=False)
        assert len(fake.chat_requests) == 8
    assert read <= 8 + 1 and len(result) == read  # the row waiting for a slot: not sent
    assert result.failed == 8 and result.not_sent == read - 8


def test_a_cancelled_batch_counts_rows_never_sent_apart_from_failed(
    capsys: pytest.CaptureFixture[str],
) -> None:
    token = CancelToken()
    # plain (not streamed) rows, 16 at a time: the first 32 are answered at once, the others not
    # until the client hangs up. A row is asked only when another has ended, so once 48 were
    # asked, 32 are answered and 16 are in flight, waiting: the cancel comes then.
    answered = 2 * CONCURRENCY
    rows = [f"row {i}" for i in range(ROWS)]
    with BatchFake(events=4, fast=set(rows[:answered]),
                   stall={row: 60.0 for row in rows[answered:]}) as fake:
        adapter = CanonicalAdapter("echo", base_url=fake.base_url)

        def cancel_after_two_rounds() -> None:
            deadline = time.monotonic() + 60
            while sum(fake.asked.values()) < answered + CONCURRENCY and time.monotonic() < deadline:
                time.sleep(0.01)
            token.cancel("enough")

        threading.Thread(target=cancel_after_two_rounds, daemon=True).start()
        started = time.monotonic()
        result = batch("{row}", rows, model=adapter,
                       concurrency=CONCURRENCY, cancel=token, progress=True)
        took = time.monotonic() - started
        asked = sum(fake.asked.values())
    assert took < 30 and result.interrupted and len(result) == ROWS
    assert result.ok >= 32 and result.cancelled == CONCURRENCY and result.failed == 0
    # every row sent is ok or cancelled in flight; every other one is "not sent"
    assert result.ok + result.cancelled == asked
    assert 0 < result.cancelled <= CONCURRENCY
    assert result.not_sent == ROWS - asked and result.not_sent >= ROWS - 32 - 2 * CONCURRENCY
    in_flight = [i for i in range(ROWS) if isinstance(result[i], RequestCancelled)
                 and result[i].code == "cancelled"]
    assert len(in_flight) == result.cancelled and all(result.attempts(i) == 1 for i in in_flight)
    unsent = [i for i in range(ROWS) if result.origin(i) == "not sent"]
    assert len(unsent) == result.not_sent
    assert all(isinstance(result[i], RequestCancelled) and result.origin(i) == "not sent"
               and "not sent: enough" in result[i].message for i in unsent)
    assert f"{result.ok} ok, {result.cancelled} cancelled, {result.not_sent} not sent" \
        in result.summary()
    assert "failed" not in result.summary() and "interrupted" in result.summary()
    bar = capsys.readouterr().err  # the progress bar counts them the same way
    assert f"cancelled {CONCURRENCY}" in bar and "failed" not in bar
    assert result.errors == []  # the rows that failed: none did
    # one wording for the rows never sent, wherever the batch marked them (it named the provider
    # for some: "fake: not sent: enough", not for the others)
    assert {str(result[i]) for i in unsent} == {"not sent: enough"}
    assert {str(result[i]) for i in in_flight} == {"fake: enough"}
    table = result.to_pandas()
    assert table["status"].value_counts().to_dict() == {
        "ok": result.ok, "not sent": result.not_sent, "cancelled": result.cancelled}
    assert isinstance(result[0], Response)
    with pytest.raises(RequestCancelled) as info:
        result.raise_for_errors()
    # no row failed: the first row cancelled in flight, saying how many were not sent
    assert info.value.code == "cancelled"
    assert str(info.value).startswith(f"fake: {CONCURRENCY} of {ROWS} rows were cancelled, "
                                      f"{result.not_sent} not sent; row {in_flight[0]}: enough")


def test_a_rerun_after_the_stop_sends_the_failed_and_the_unsent_rows(tmp_path: Any) -> None:
    path = tmp_path / "run.jsonl"
    with BatchFake(api_key="good-key", events=2) as fake:
        first = batch("{row}", [f"row {i}" for i in range(50)],
                      model=CanonicalAdapter("echo", base_url=fake.base_url, api_key="bad-key"),
                      concurrency=5, checkpoint=path, progress=False)
        assert sum(fake.asked.values()) == 5
        again = batch("{row}", [f"row {i}" for i in range(50)],
                      model=CanonicalAdapter("echo", base_url=fake.base_url, api_key="good-key"),
                      concurrency=5, checkpoint=path, progress=False)
    assert (first.failed, first.not_sent) == (5, 45)
    assert again.ok == 50 and again.sent == 50 and again.resumed == 0


def test_a_retry_that_stops_says_so_in_the_batch_s_result() -> None:
    """retry_failed() that stops at an error every row would get: the batch's result says where
    (``stopped_by``, its row numbered in the batch) and its unsent rows say why, as if the batch
    itself had stopped there; a later retry that does not stop leaves no stop behind."""
    rows = [f"row {i}" for i in range(6)]
    down = Fail(500, "down", "api_error")
    with BatchFake(fail={"row 1": down, "row 3": down, "row 4": down}) as fake:
        result = batch("{row}", rows, model=CanonicalAdapter("echo", base_url=fake.base_url),
                       concurrency=1, max_retries=0, progress=False)
        assert [i for i, _ in result.errors] == [1, 3, 4] and result.stopped_by is None
        fake.fail = {"row 1": Fail(401, "bad key", "authentication_error")}
        assert result.retry_failed() is result
        assert result.stopped_by is not None
        position, error = result.stopped_by
        assert position == 1 and isinstance(error, AuthenticationError)
        assert error.code == "authentication_failed" and result[1] is error
        for i in (3, 4):  # never sent: why, in the batch's own numbers
            assert result[i].code == "not_sent" and result[i].__cause__ is error
            assert "the batch stopped at row 1's AuthenticationError" in result[i].message
        assert "stopped at row 1: AuthenticationError (authentication_failed)" in repr(result)
        assert (result.ok, result.failed, result.not_sent) == (3, 1, 2)
        fake.fail.clear()
        assert result.retry_failed() is result
    assert result.ok == 6 and result.stopped_by is None and "stopped at" not in repr(result)
