"""The error tree and the status → error table."""

from __future__ import annotations

import email.utils
import pickle
import time

import pytest

from dispatch_nb import (
    APIConnectionError,
    APITimeoutError,
    AuthenticationError,
    ContextLengthError,
    DispatchError,
    ModelUnavailableError,
    RateLimitError,
    RequestCancelled,
    RequestError,
    ServerError,
)
from dispatch_nb.errors import error_for_status, parse_retry_after


def test_tree() -> None:
    assert issubclass(ContextLengthError, RequestError)
    assert issubclass(ModelUnavailableError, RequestError)
    assert issubclass(APITimeoutError, APIConnectionError)
    assert issubclass(APIConnectionError, ConnectionError)
    assert issubclass(APITimeoutError, TimeoutError)
    for cls in (AuthenticationError, RateLimitError, ServerError, RequestError,
                APIConnectionError, RequestCancelled):
        assert issubclass(cls, DispatchError)


@pytest.mark.parametrize(
    ("status", "cls", "code"),
    [
        (400, RequestError, "invalid_request"),
        (401, AuthenticationError, "authentication_failed"),
        (403, AuthenticationError, "authentication_failed"),
        (404, RequestError, "invalid_request"),
        (413, RequestError, "invalid_request"),
        (422, RequestError, "invalid_request"),
        (429, RateLimitError, "rate_limited"),
        (500, ServerError, "server_error"),
        (502, ServerError, "server_error"),
        (529, ServerError, "server_error"),
        (402, RateLimitError, "quota_exceeded"),
    ],
)
def test_status_table(status: int, cls: type, code: str) -> None:
    err = error_for_status(status, "msg", provider="p")
    assert type(err) is cls
    assert err.code == code
    assert err.status_code == status and err.provider == "p"


def test_provider_types_refine_the_status() -> None:
    assert isinstance(error_for_status(400, "x", error_type="context_length_exceeded"),
                      ContextLengthError)
    assert isinstance(error_for_status(400, "This model's maximum context length is 8192 tokens"),
                      ContextLengthError)
    assert isinstance(error_for_status(404, "The model `gpt-9` does not exist"),
                      ModelUnavailableError)
    quota = error_for_status(429, "x", error_type="insufficient_quota")
    assert isinstance(quota, RateLimitError) and quota.code == "quota_exceeded"
    assert not quota.retryable
    spend = error_for_status(429, "x", error_type="enforced_spend_limit_reached")
    assert not spend.retryable
    assert error_for_status(429, "x").retryable
    overloaded = error_for_status(529, "Overloaded", error_type="overloaded_error")
    assert isinstance(overloaded, ServerError) and overloaded.retryable
    # a client-error type never turns a 5xx into a client error
    assert isinstance(error_for_status(500, "x", error_type="invalid_request_error"), ServerError)


def test_x_should_retry_overrides() -> None:
    assert not error_for_status(500, "x", headers={"x-should-retry": "false"}).retryable
    assert error_for_status(400, "x", headers={"x-should-retry": "true"}).retryable


def test_retry_after_forms() -> None:
    assert parse_retry_after({"retry-after-ms": "1500"}) == 1.5
    assert parse_retry_after({"retry-after": "2"}) == 2.0
    assert parse_retry_after({"retry-after": "0.25"}) == 0.25
    now = time.time()
    date = email.utils.formatdate(now + 30, usegmt=True)
    assert 28 <= (parse_retry_after({"retry-after": date}, now=now) or 0) <= 31
    assert parse_retry_after({"retry-after": "soon"}) is None
    assert parse_retry_after({}) is None
    err = error_for_status(429, "slow down", headers={"retry-after": "7"})
    assert isinstance(err, RateLimitError) and err.retry_after == 7


def test_str_repr_and_pickle() -> None:
    err = error_for_status(401, "bad key", provider="openai")
    assert str(err) == "openai: bad key (HTTP 401)"
    assert "AuthenticationError" in repr(err)
    again = pickle.loads(pickle.dumps(err))
    assert type(again) is AuthenticationError and again.status_code == 401
