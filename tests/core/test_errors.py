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
from dispatch_nb.errors import error_for_status, looks_like_html, parse_retry_after, summarize_body
from dispatch_nb.http_adapter import error_details
from dispatch_nb.types import Response, TextBlock


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
    typed = error_for_status(400, "x", error_type="context_length_exceeded")
    assert isinstance(typed, ContextLengthError)
    assert (typed.status_code, typed.code) == (400, "context_length_exceeded")
    worded = error_for_status(400, "This model's maximum context length is 8192 tokens")
    assert isinstance(worded, ContextLengthError)
    assert (worded.status_code, worded.code) == (400, "context_length_exceeded")
    missing = error_for_status(404, "The model `gpt-9` does not exist")
    assert isinstance(missing, ModelUnavailableError)
    assert (missing.status_code, missing.code) == (404, "model_unavailable")
    quota = error_for_status(429, "x", error_type="insufficient_quota")
    assert isinstance(quota, RateLimitError) and quota.code == "quota_exceeded"
    assert not quota.retryable
    spend = error_for_status(429, "x", error_type="enforced_spend_limit_reached")
    assert not spend.retryable
    assert error_for_status(429, "x").retryable
    overloaded = error_for_status(529, "Overloaded", error_type="overloaded_error")
    assert isinstance(overloaded, ServerError) and overloaded.retryable
    assert (overloaded.status_code, overloaded.code) == (529, "server_error")
    # a client-error type never turns a 5xx into a client error
    server = error_for_status(500, "x", error_type="invalid_request_error")
    assert isinstance(server, ServerError) and (server.status_code, server.code) == (500, "server_error")


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
    assert (err.status_code, err.code) == (429, "rate_limited")


def test_str_repr_and_pickle() -> None:
    err = error_for_status(401, "bad key", provider="openai")
    assert str(err) == "openai: bad key (HTTP 401)"
    assert "AuthenticationError" in repr(err)
    again = pickle.loads(pickle.dumps(err))
    assert type(again) is AuthenticationError and again.status_code == 401


@pytest.mark.parametrize(
    ("body", "summary"),
    [
        (b"<html><head><title>502 Bad Gateway</title></head><body><h1>502</h1></body></html>",
         "502 Bad Gateway"),
        (b"<!-- generated -->\n<!DOCTYPE html><html><head><style>h1{}</style></head>"
         b"<body><h1>Access  &amp; <b>denied</b></h1><p>more</p></body></html>", "Access & denied"),
        (b"<html><body><script>var a = '<b>';</script>\n<p>Blocked by policy</p></body></html>",
         "Blocked by policy"),
        (b"<HTML><TITLE></TITLE><BODY>\n\n  Upstream timed out \n</BODY></HTML>", "Upstream timed out"),
        (b"413 Request Entity Too Large\nsecond line\n", "413 Request Entity Too Large"),
        (b"\n\n   \n  upstream connect error  \n", "upstream connect error"),
        (b"", ""),
        (b"caf\xc3\xa9 \xff", "café \ufffd"),
    ],
)
def test_summarize_body_gives_one_line_without_markup(body: bytes, summary: str) -> None:
    assert summarize_body(body) == summary


def test_summarize_body_is_short_and_html_is_recognised() -> None:
    assert summarize_body(b"x" * 1000) == "x" * 199 + "…"
    assert len(summarize_body(b"<title>" + b"y " * 500 + b"</title>", limit=50)) == 50
    assert looks_like_html(b"  <!DOCTYPE html><html>") and looks_like_html(b"<HTML>")
    assert not looks_like_html(b'{"error": "<b>"}') and not looks_like_html(b"a < b")


def test_error_details_reads_json_and_what_proxies_send() -> None:
    assert error_details(b'{"error": {"message": "bad", "type": "invalid_request_error"}}') == (
        "bad", "invalid_request_error")
    assert error_details(b'{"error": "plain"}') == ("plain", None)
    assert error_details(b'{"detail": "x"}') == ('{"detail": "x"}', None)
    message, etype = error_details(b"<html><title>503 Service Unavailable</title></html>")
    assert etype is None and message.endswith(": 503 Service Unavailable") and "HTML page" in message
    assert error_details(b"too big\nreally") == ("too big", None)
    assert error_details(b"") == ("the server returned an error with no message", None)


def test_an_error_used_as_a_response_says_what_it_is() -> None:
    # `%%chat -o review` stores the error a failed cell ended with: `review.parsed` in the next
    # cell names the error and what to do, not just "no attribute 'parsed'"
    error = RateLimitError("slow down", code="rate_limited")
    with pytest.raises(AttributeError, match=r"'parsed': this is the error a call ended with "
                                             r"\(slow down\), not a Response\. Fix what it says"):
        _ = error.parsed
    cut = APIConnectionError("the connection dropped", partial=Response(
        content=[TextBlock(text="half an answer")]))
    with pytest.raises(AttributeError, match=r"Its \.partial holds what arrived \(\.partial\.text\)"):
        _ = cut.text
    assert cut.partial is not None and cut.partial.text == "half an answer"
    with pytest.raises(AttributeError, match=r"^'RateLimitError' object has no attribute 'nope'$"):
        _ = error.nope
    refused = APIConnectionError("could not connect", partial=Response())  # nothing arrived
    with pytest.raises(AttributeError, match=r"not a Response\. Fix what it says"):
        _ = refused.parsed
    assert not hasattr(error, "_repr_html_") and getattr(error, "usage", None) is None
    assert pickle.loads(pickle.dumps(cut)).partial.text == "half an answer"
