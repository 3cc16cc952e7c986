"""What proxies and web servers answer instead of the API, through every adapter.

Between a notebook and a provider there is often an nginx, a corporate proxy or a captive portal,
and base URLs get mistyped: the answer is then an HTML page, a plain-text line or nothing at all.
Each becomes one short line of the body (an HTML page's title — never markup), the error class its
status calls for, and a retry only where one can help (a 502/503 may pass; a 413, or a page in place
of the API's JSON, will come back the same).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pytest

from dispatch_nb import APIConnectionError, DispatchError, RequestError, ServerError
from dispatch_nb.adapter import Adapter

from ..fakes.provider import ProviderFake
from ..fakes.server import RecordedRequest, Reply
from .targets import Target

NGINX_502 = (
    b"<html>\r\n<head><title>502 Bad Gateway</title></head>\r\n<body>\r\n"
    b"<center><h1>502 Bad Gateway</h1></center>\r\n<hr><center>nginx/1.25.3</center>\r\n"
    b"</body>\r\n</html>\r\n"
)
PROXY_503 = (
    b"<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
    b"<title>Service Unavailable &ndash; Example Corp Web Gateway</title>\n"
    b"<style>body { font-family: sans-serif; } .box { border: 1px solid #ccc; }</style>\n"
    b"<script>window.location.hash = 'retry';</script>\n</head>\n<body>\n<div class=\"box\">\n"
    b"<h1>The site you requested is temporarily unavailable</h1>\n"
    + b"<p>Please try again later. Reference #" + b"0123456789" * 30 + b"</p>\n</div>\n</body>\n</html>\n"
)
LOGIN_PAGE = (
    b"<!doctype html><html><head><title>Sign in to continue | Example Corp</title></head>"
    b"<body><form action=\"/login\"><input name=\"user\"><input type=\"password\"></form>"
    b"</body></html>"
)
TOO_LARGE = b"413 Request Entity Too Large\n\nThe request body exceeds the 1 MB limit of this proxy.\n"


@dataclass
class Page:
    reply: Reply
    error: type[DispatchError]
    status: int | None
    code: str
    says: str  # what the message must contain (from the body)
    retried: bool


PAGES = {
    "nginx-502": Page(Reply(502, {"content-type": "text/html"}, NGINX_502), ServerError, 502,
                      "server_error", "502 Bad Gateway", retried=True),
    "proxy-503": Page(Reply(503, {"content-type": "text/html; charset=utf-8"}, PROXY_503),
                      ServerError, 503, "server_error",
                      "Service Unavailable – Example Corp Web Gateway", retried=True),
    "html-200": Page(Reply(200, {"content-type": "text/html"}, LOGIN_PAGE), APIConnectionError,
                     None, "unexpected_response", "Sign in to continue | Example Corp",
                     retried=False),
    "empty-200": Page(Reply(200, {"content-type": "application/json"}, b""), APIConnectionError,
                      None, "unexpected_response", "empty body", retried=False),
    "text-413": Page(Reply(413, {"content-type": "text/plain"}, TOO_LARGE), RequestError, 413,
                     "invalid_request", "413 Request Entity Too Large", retried=False),
}


def answer_chats_with(fake: ProviderFake, reply: Reply) -> None:
    """Every chat request gets ``reply`` (token exchanges and model lists still work)."""
    routed = fake.server.handler

    def handler(request: RecordedRequest) -> Reply:
        return reply if fake.is_chat(request) else routed(request)

    fake.server.handler = handler


def chats(fake: ProviderFake) -> int:
    return sum(fake.is_chat(r) for r in fake.requests)


def call(adapter: Adapter, mode: str) -> DispatchError:
    try:
        if mode == "json":
            adapter.chat("Hi", stream=False)
        elif mode == "stream":
            adapter.chat("Hi", stream=True)
        else:
            asyncio.run(adapter.achat("Hi", stream=True))
    except DispatchError as exc:
        return exc
    raise AssertionError("the call succeeded")


def check(error: DispatchError, page: Page) -> None:
    assert type(error) is page.error, repr(error)
    assert (error.status_code, error.code) == (page.status, page.code)
    assert page.says in error.message
    for text in (error.message, str(error)):
        assert "<" not in text and ">" not in text, text  # no markup
        assert "\n" not in text and len(text) < 300, text  # one short line


@pytest.mark.parametrize("mode", ["json", "stream"])
@pytest.mark.parametrize("name", PAGES)
def test_a_proxy_page_is_one_clear_line(target: Target, fake: ProviderFake, name: str,
                                        mode: str) -> None:
    page = PAGES[name]
    answer_chats_with(fake, page.reply)
    adapter = target.make_adapter(fake, max_retries=1)
    adapter.retry_backoff = 0.01
    try:
        error = call(adapter, mode)
    finally:
        adapter.close()
    check(error, page)
    assert error.retryable is page.retried
    assert chats(fake) == (2 if page.retried else 1)


@pytest.mark.parametrize("name", PAGES)
def test_async_calls_see_the_same(target: Target, fake: ProviderFake, name: str) -> None:
    if target.name != "fake":
        return  # the async path shares every function above; one adapter shows it
    page = PAGES[name]
    answer_chats_with(fake, page.reply)
    adapter = target.make_adapter(fake, max_retries=1)
    adapter.retry_backoff = 0.01
    check(call(adapter, "async"), page)
    assert chats(fake) == (2 if page.retried else 1)


def test_a_model_list_behind_a_login_page(target: Target, fake: ProviderFake) -> None:
    routed = fake.server.handler

    def handler(request: RecordedRequest) -> Reply:
        if request.method == "GET" and "models" in request.path:
            return PAGES["html-200"].reply
        return routed(request)

    fake.server.handler = handler
    adapter = target.make_adapter(fake, max_retries=1)
    try:
        with pytest.raises(APIConnectionError) as info:
            adapter.list_models()
    finally:
        adapter.close()
    assert info.value.code == "unexpected_response"
    check(info.value, PAGES["html-200"])
