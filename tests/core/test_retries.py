"""Retries in the adapter layer, against the canonical loopback fake with injected faults.

What is retried: 408/409/429/5xx/529 and broken connections, with exponential backoff and jitter,
honouring ``retry-after`` (up to 60 s) and ``x-should-retry``. What is not: quota / spend limits,
other 4xx, and anything once output reached the caller. Every retry logs a WARNING; every request
logs one INFO line (never a secret). ``adapter.retry_backoff`` keeps these tests fast.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Iterator
from typing import Any

import pytest

from dispatch_nb import (
    APIConnectionError,
    APITimeoutError,
    AuthenticationError,
    RateLimitError,
    RequestError,
    RetryEvent,
    ServerError,
)
from dispatch_nb.adapter import BACKOFF_CAP, RETRY_AFTER_CAP, backoff_delay
from dispatch_nb.providers.fake import CanonicalAdapter
from dispatch_nb.session import Session

from ..fakes.canonical import CanonicalFake
from ..fakes.provider import Drop, Fail, Stall, Turn

SECRET = "sk-test-SECRET-value-0123456789"


@pytest.fixture
def make(fake: CanonicalFake) -> Iterator[Any]:
    made: list[CanonicalAdapter] = []

    def build(**kw: Any) -> CanonicalAdapter:
        adapter = CanonicalAdapter("echo", base_url=fake.base_url, api_key=SECRET, **kw)
        adapter.retry_backoff = 0.01
        made.append(adapter)
        return adapter

    yield build
    for adapter in made:
        adapter.close()


def retry_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records
            if r.name == "dispatch_nb" and r.levelno == logging.WARNING
            and r.getMessage().startswith("retrying")]


def request_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "dispatch_nb" and r.levelno == logging.INFO
            and r.getMessage().startswith("request ")]


# -- what is retried -----------------------------------------------------------------------------
@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_429_then_success_honours_retry_after(
    make: Any, fake: CanonicalFake, caplog: pytest.LogCaptureFixture, stream: bool
) -> None:
    fake.push(Fail(429, "slow down", "rate_limit_error", headers={"retry-after": "0.3"}),
              Turn(text="finally"))
    started = time.monotonic()
    response = make().chat("x", stream=stream)
    elapsed = time.monotonic() - started
    assert response.text == "finally"
    assert len(fake.chat_requests) == 2
    assert 0.3 <= elapsed < 2.0
    (record,) = retry_records(caplog)
    assert "RateLimitError" in record.getMessage() and "waiting 0.30s" in record.getMessage()


def test_500_twice_then_success(make: Any, fake: CanonicalFake,
                                caplog: pytest.LogCaptureFixture) -> None:
    fake.push(Fail(500, "oops"), Fail(500, "oops again"), Turn(text="third time lucky"))
    caplog.set_level(logging.INFO, logger="dispatch_nb")
    assert make().chat("x", stream=True).text == "third time lucky"
    assert len(fake.chat_requests) == 3
    assert [r.getMessage().split(" (attempt")[0].endswith("[HTTP 500]")
            for r in retry_records(caplog)] == [True, True]
    (line,) = request_lines(caplog)
    assert "status=ok" in line and "retries=2" in line


def test_retries_are_limited(make: Any, fake: CanonicalFake) -> None:
    fake.push(*[Fail(503, "unavailable")] * 4)
    with pytest.raises(ServerError) as info:
        make().chat("x")
    assert info.value.status_code == 503
    assert len(fake.chat_requests) == 3  # the default: 2 retries


def test_max_retries_per_adapter_and_per_call(make: Any, fake: CanonicalFake) -> None:
    fake.push(*[Fail(500, "down")] * 10)
    with pytest.raises(ServerError) as info:
        make(max_retries=0).chat("x")
    assert (info.value.status_code, info.value.code) == (500, "server_error")
    assert len(fake.chat_requests) == 1
    with pytest.raises(ServerError) as info:
        make(max_retries=5).chat("x", max_retries=1)
    assert (info.value.status_code, info.value.code) == (500, "server_error")
    assert len(fake.chat_requests) == 3
    with pytest.raises(ValueError, match="max_retries"):
        make().chat("x", max_retries=-1)
    with pytest.raises(ValueError, match="max_retries"):
        CanonicalAdapter("echo", base_url=fake.base_url, max_retries=-1)


@pytest.mark.parametrize("status", [408, 409, 502, 503, 504, 529])
def test_transient_statuses_are_retried(make: Any, fake: CanonicalFake, status: int) -> None:
    fake.push(Fail(status, "transient"), Turn(text="ok"))
    assert make().chat("x").text == "ok"
    assert len(fake.chat_requests) == 2


@pytest.mark.parametrize(
    ("fail", "error"),
    [
        (Fail(400, "bad"), RequestError),
        (Fail(401, "who are you"), AuthenticationError),
        (Fail(404, "no such model", "model_not_found"), RequestError),
        (Fail(429, "out of credit", "insufficient_quota"), RateLimitError),
        (Fail(429, "spend limit", "billing_error", headers={"x-should-retry": "true"}),
         RateLimitError),
        (Fail(500, "do not", headers={"x-should-retry": "false"}), ServerError),
    ],
    ids=["400", "401", "404", "quota", "spend-limit-even-if-told-to-retry", "x-should-retry-false"],
)
def test_not_retried(make: Any, fake: CanonicalFake, fail: Fail, error: type) -> None:
    fake.push(fail, Turn(text="never reached"))
    with pytest.raises(error) as info:
        make().chat("x")
    assert len(fake.chat_requests) == 1
    if fail.error_type in ("insufficient_quota", "billing_error"):
        assert info.value.code == "quota_exceeded"


def test_x_should_retry_true_retries_a_400(make: Any, fake: CanonicalFake) -> None:
    fake.push(Fail(400, "flaky", headers={"x-should-retry": "true"}), Turn(text="ok"))
    assert make().chat("x").text == "ok"
    assert len(fake.chat_requests) == 2


def test_retry_after_beyond_the_cap_is_not_waited_for(make: Any, fake: CanonicalFake) -> None:
    fake.push(Fail(429, "come back later", headers={"retry-after": "120"}), Turn(text="no"))
    started = time.monotonic()
    with pytest.raises(RateLimitError) as info:
        make().chat("x")
    assert (info.value.status_code, info.value.code) == (429, "rate_limited")
    assert time.monotonic() - started < 1.0
    assert info.value.retry_after == 120 and len(fake.chat_requests) == 1


def test_retry_after_on_a_503_is_honoured(make: Any, fake: CanonicalFake) -> None:
    fake.push(Fail(503, "maintenance", headers={"retry-after-ms": "250"}), Turn(text="back"))
    started = time.monotonic()
    assert make().chat("x").text == "back"
    assert time.monotonic() - started >= 0.25


def test_backoff_grows_exponentially(make: Any, fake: CanonicalFake,
                                     caplog: pytest.LogCaptureFixture) -> None:
    fake.push(*[Fail(500, "down")] * 4, Turn(text="up"))
    adapter = make(max_retries=4)
    adapter.retry_backoff = 0.04
    assert adapter.chat("x").text == "up"
    waits = [float(re.search(r"waiting ([\d.]+)s", r.getMessage()).group(1))  # type: ignore[union-attr]
             for r in retry_records(caplog)]
    assert len(waits) == 4
    for n, wait in enumerate(waits):
        nominal = 0.04 * 2**n
        assert 0.75 * nominal - 0.01 <= wait <= nominal + 0.01, (n, wait)


def test_backoff_delay_rules() -> None:
    assert backoff_delay(0, 2.5) == 2.5
    assert backoff_delay(3, RETRY_AFTER_CAP + 1) is None
    assert 0.375 <= backoff_delay(0, None) <= 0.5  # type: ignore[operator]
    assert 0.75 * BACKOFF_CAP <= backoff_delay(20, None, base=1.0) <= BACKOFF_CAP  # type: ignore[operator]
    assert 0.75 <= backoff_delay(1, 0.0, base=0.5) <= 1.0  # type: ignore[operator]


def test_the_deadline_stops_retrying(make: Any, fake: CanonicalFake) -> None:
    fake.push(Fail(503, "busy", headers={"retry-after": "30"}), Turn(text="too late"))
    started = time.monotonic()
    with pytest.raises(ServerError) as info:
        make().chat("x", timeout=4.0)
    assert (info.value.status_code, info.value.code) == (503, "server_error")
    # no point waiting 30 s for a 4 s deadline: it gave up at once, not when the deadline came
    assert time.monotonic() - started < 3.0
    assert len(fake.chat_requests) == 1


# -- connections ---------------------------------------------------------------------------------
@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_connection_reset_before_headers_is_retried(
    make: Any, fake: CanonicalFake, stream: bool
) -> None:
    fake.push(Drop(), Turn(text="reconnected"))
    assert make().chat("x", stream=stream).text == "reconnected"
    assert len(fake.chat_requests) == 2


def test_reset_after_headers_but_before_output_is_retried(make: Any, fake: CanonicalFake) -> None:
    fake.push(Turn(text="lost", reset_after=0), Turn(text="second try"))
    assert make().chat("x", stream=True).text == "second try"
    assert len(fake.chat_requests) == 2


def test_reset_mid_stream_is_not_retried_and_keeps_partial(
    make: Any, fake: CanonicalFake
) -> None:
    fake.push(Turn(text="abcdefghijkl", chunk=2, reset_after=3), Turn(text="never"))
    seen: list[str] = []
    with pytest.raises(APIConnectionError) as info:
        make().chat("x", stream=True, on_delta=lambda d: seen.append(d.text or ""))
    assert info.value.code == "network_error"
    assert len(fake.chat_requests) == 1
    assert info.value.partial is not None and info.value.partial.text == "abcdef"
    assert "".join(seen) == "abcdef"


def test_in_stream_overload_after_output_is_not_retried(make: Any, fake: CanonicalFake) -> None:
    fake.push(Turn(text="abcdefgh", chunk=2, error_after=1, error=Fail(529, "Overloaded",
                                                                      "overloaded_error")))
    with pytest.raises(ServerError) as info:
        make().chat("x", stream=True)
    assert (info.value.status_code, info.value.code) == (529, "server_error")
    assert len(fake.chat_requests) == 1 and info.value.partial.text == "ab"  # type: ignore[union-attr]


def test_a_stalling_server_hits_the_deadline(make: Any, fake: CanonicalFake) -> None:
    fake.push(Stall(5.0), Turn(text="never"))
    started = time.monotonic()
    with pytest.raises(APITimeoutError,
                       match=r"within the 0.3 s timeout \(waited \d+\.\d s\)") as info:
        make().chat("x", stream=True, timeout=0.3)
    assert info.value.code == "timeout"
    assert time.monotonic() - started < 2.5  # the deadline, not the 5 s stall
    assert len(fake.chat_requests) == 1  # a deadline is never retried


def test_async_retries(make: Any, fake: CanonicalFake) -> None:
    fake.push(Drop(), Fail(429, "wait", headers={"retry-after": "0.1"}), Turn(text="async ok"),
              Fail(500, "x"), Turn(text="streamed ok", chunk=3))
    adapter = make()

    async def main() -> tuple[str, str]:
        plain = await adapter.achat("x")
        async with adapter.astream("y") as stream:
            async for _ in stream:
                pass
        return plain.text, stream.response.text

    assert asyncio.run(main()) == ("async ok", "streamed ok")
    assert len(fake.chat_requests) == 5


def test_sessions_get_retries_too(make: Any, fake: CanonicalFake) -> None:
    fake.push(Fail(502, "bad gateway"), Drop())
    session = Session(make())
    assert session.send("hello").text == "echo: hello"
    assert [m.role for m in session.history] == ["user", "assistant"]


# -- logging -------------------------------------------------------------------------------------
def test_one_info_line_per_request_and_never_a_secret(
    make: Any, fake: CanonicalFake, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    fake.push(Turn(text="fine", input_tokens=31, output_tokens=9, cache_read_tokens=4),
              Fail(500, "boom"), Fail(401, f"invalid key {SECRET[:6]}…"))
    adapter = make(max_retries=1)
    adapter.chat("one", stream=True)
    with pytest.raises(AuthenticationError) as info:
        adapter.chat("two")
    assert (info.value.status_code, info.value.code) == (401, "authentication_failed")
    lines = request_lines(caplog)
    assert len(lines) == 2
    ok, failed = lines
    for field in ("provider=fake", "backend=-", "model=echo", "stream=True", "status=ok",
                  "retries=0", "input_tokens=31", "output_tokens=9", "cache_read_tokens=4"):
        assert field in ok
    assert re.search(r"latency=\d+\.\d{3}s", ok)
    assert "status=AuthenticationError/401" in failed and "retries=1" in failed
    assert fake.chat_requests[0].header("authorization") == f"Bearer {SECRET}"
    for record in caplog.records:
        rendered = record.getMessage() + repr(record.args) + str(record.exc_text or "")
        assert SECRET not in rendered
    assert SECRET not in caplog.text


# -- retries are events of the stream ------------------------------------------------------------
def test_a_retry_is_an_event_among_the_stream_s_deltas(make: Any, fake: CanonicalFake) -> None:
    fake.push(Fail(429, "slow down", "rate_limit_error", headers={"retry-after": "0.1"}),
              Fail(503, "unavailable"), Turn(text="ok"))
    with make().stream("x") as stream:
        events = list(stream)
    retries = [e for e in events if isinstance(e, RetryEvent)]
    assert [(r.type, r.attempt, r.reason) for r in retries] == [
        ("retry", 1, "rate limited, HTTP 429"), ("retry", 2, "the server failed, HTTP 503")]
    assert retries[0].wait == 0.1 and retries[1].wait > 0
    assert events.index(retries[-1]) < next(i for i, e in enumerate(events)
                                             if e.type == "text_delta")
    assert stream.response.text == "ok"


async def test_an_async_stream_has_its_retries_as_events(make: Any, fake: CanonicalFake) -> None:
    fake.push(Fail(500, "oops"), Turn(text="ok"))
    seen: list[Any] = []
    response = await make().achat("x", stream=True, on_delta=seen.append)
    assert response.text == "ok"
    assert [(e.attempt, e.reason) for e in seen if isinstance(e, RetryEvent)] == [
        (1, "the server failed, HTTP 500")]


def test_an_adapter_refuses_max_retries_none_when_made(make: Any, fake: CanonicalFake) -> None:
    """A call's ``max_retries=None`` means the adapter's own; the adapter's own must be a number,
    refused when it is made, not at the first retry."""
    with pytest.raises(TypeError, match="max_retries must be a whole number, 0 or more — not None"):
        make(max_retries=None)
