"""CopilotAuth, the httpx.Auth flow of Copilot requests, against the loopback Copilot API and GitHub
fakes: the token on each request, a 401 → one refresh → one resend (sync and async, chats and the
model list, through the adapter and on a bare httpx client), a second 401 is the caller's error,
a 403 asking to authorize is not retried, many threads or tasks after a revocation → one exchange.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest

from dispatch_nb import AuthenticationError
from dispatch_nb.auth import (
    DEFAULT_COPILOT_API_URL,
    CopilotAuth,
    CopilotTokenManager,
    token_rejected,
)
from dispatch_nb.providers.copilot import CopilotAdapter
from tests.fakes.copilot import CopilotFake
from tests.fakes.provider import Fail, Turn
from tests.fakes.server import Reply

EDITOR = {"copilot-integration-id": "vscode-chat", "editor-version": "vscode/1.99.0"}


@pytest.fixture(autouse=True)
def _no_logins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("DISPATCH_NB_GITHUB_TOKEN", "DISPATCH_NB_GITHUB_URL", "DISPATCH_NB_GITHUB_API_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("DISPATCH_NB_HOME", str(tmp_path / "dnb"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))


@pytest.fixture
def copilot() -> Iterator[CopilotFake]:
    with CopilotFake() as fake:
        yield fake


def manager_for(copilot: CopilotFake) -> CopilotTokenManager:
    return CopilotTokenManager(copilot.github.github_token, github_api_url=copilot.github.api_url)


def adapter_for(copilot: CopilotFake, **kw: object) -> CopilotAdapter:
    github = copilot.github
    return CopilotAdapter("gpt-4.1", github_token=github.github_token, github_url=github.github_url,
                          github_api_url=github.api_url, max_retries=2, **kw)  # type: ignore[arg-type]


def models_url(copilot: CopilotFake) -> str:
    return f"{copilot.url}/models"


# -- the flow on a bare httpx client -------------------------------------------------------------
def test_the_flow_sets_the_token_and_refreshes_once_after_a_401_sync(copilot: CopilotFake) -> None:
    manager = manager_for(copilot)
    auth = CopilotAuth(manager)
    with httpx.Client(headers=EDITOR) as client:
        assert client.get(models_url(copilot), auth=auth).status_code == 200
        first = manager.cached
        assert first is not None and copilot.github.copilot_exchanges == 1
        copilot.github.revoke_copilot_tokens()
        response = client.get(models_url(copilot), auth=auth)
    assert response.status_code == 200
    assert copilot.github.copilot_exchanges == 2
    assert len(copilot.rejected) == 1
    assert copilot.requests[-1].header("authorization") == (
        f"Bearer {copilot.github.issued_copilot_tokens[-1]}")
    for secret in (*copilot.github.issued_copilot_tokens, copilot.github.github_token):
        assert secret not in repr(auth)


def test_the_flow_refreshes_once_after_a_401_async(copilot: CopilotFake) -> None:
    manager = manager_for(copilot)
    auth = CopilotAuth(manager)

    async def run() -> list[int]:
        async with httpx.AsyncClient(headers=EDITOR) as client:
            before = (await client.get(models_url(copilot), auth=auth)).status_code
            copilot.github.revoke_copilot_tokens()
            after = (await client.get(models_url(copilot), auth=auth)).status_code
            return [before, after]

    assert asyncio.run(run()) == [200, 200]
    assert copilot.github.copilot_exchanges == 2
    assert len(copilot.rejected) == 1


def test_a_second_401_is_the_answer_the_caller_gets(copilot: CopilotFake) -> None:
    manager = manager_for(copilot)
    copilot.models_reply = Reply(status=401, body=orjson.dumps({"error": {"message": "seat gone"}}))
    with httpx.Client(headers=EDITOR) as client:
        response = client.get(models_url(copilot), auth=CopilotAuth(manager))
    assert response.status_code == 401
    assert copilot.github.copilot_exchanges == 2  # the first token, then exactly one refresh
    assert len([r for r in copilot.requests if r.path == "/models"]) == 2


def test_a_403_that_asks_to_authorize_is_not_retried(copilot: CopilotFake) -> None:
    manager = manager_for(copilot)
    body = {"error": {"message": "accept the terms", "authorize_url": "https://github.com/x"}}
    copilot.models_reply = Reply(status=403, body=orjson.dumps(body))
    with httpx.Client(headers=EDITOR) as client:
        response = client.get(models_url(copilot), auth=CopilotAuth(manager))
    assert response.status_code == 403
    assert copilot.github.copilot_exchanges == 1
    assert not token_rejected(403, orjson.dumps(body))
    assert token_rejected(401, b"not json") and token_rejected(403, b'{"message": "bad token"}')
    assert not token_rejected(500, b"")


def test_a_request_to_the_default_api_goes_to_the_tokens_endpoint(copilot: CopilotFake) -> None:
    """Before the first exchange the adapter only knows the default API; the token names the real
    one (endpoints.api), and the flow sends the request there."""
    manager = manager_for(copilot)
    with httpx.Client(headers=EDITOR) as client:
        response = client.get(f"{DEFAULT_COPILOT_API_URL}/models", auth=CopilotAuth(manager))
    assert response.status_code == 200
    assert copilot.requests[-1].path == "/models"
    assert str(response.request.url) == models_url(copilot)


def test_32_threads_after_a_revocation_cause_one_exchange(copilot: CopilotFake) -> None:
    manager = manager_for(copilot)
    auth = CopilotAuth(manager)
    with httpx.Client(headers=EDITOR, limits=httpx.Limits(max_connections=40)) as client:
        assert client.get(models_url(copilot), auth=auth).status_code == 200
        copilot.github.revoke_copilot_tokens()
        copilot.github.copilot_token_response(endpoints_api=copilot.url, delay=0.3)
        barrier = threading.Barrier(32)
        statuses: list[int] = []
        lock = threading.Lock()

        def worker() -> None:
            barrier.wait()
            status = client.get(models_url(copilot), auth=auth).status_code
            with lock:
                statuses.append(status)

        threads = [threading.Thread(target=worker) for _ in range(32)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
    assert statuses == [200] * 32
    assert copilot.github.copilot_exchanges == 2  # the first token + one refresh for all 32


def test_32_tasks_after_a_revocation_cause_one_exchange(copilot: CopilotFake) -> None:
    manager = manager_for(copilot)
    auth = CopilotAuth(manager)

    async def run() -> list[int]:
        async with httpx.AsyncClient(headers=EDITOR) as client:
            assert (await client.get(models_url(copilot), auth=auth)).status_code == 200
            copilot.github.revoke_copilot_tokens()
            copilot.github.copilot_token_response(endpoints_api=copilot.url, delay=0.3)
            answers = await asyncio.gather(
                *(client.get(models_url(copilot), auth=auth) for _ in range(32)))
            return [a.status_code for a in answers]

    assert asyncio.run(run()) == [200] * 32
    assert copilot.github.copilot_exchanges == 2


# -- through the adapter: chat and list_models, sync and async -----------------------------------
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_the_adapter_chat_refreshes_once_after_a_401(copilot: CopilotFake, mode: str) -> None:
    adapter = adapter_for(copilot)
    try:
        assert adapter.chat("warm up").text == "echo: warm up"
        copilot.github.revoke_copilot_tokens()
        copilot.push(Turn(text="fresh"))
        if mode == "async":
            response = asyncio.run(adapter.achat("again", stream=True))
        else:
            response = adapter.chat("again", stream=True)
        assert response.text == "fresh"
        assert copilot.github.copilot_exchanges == 2
        assert len(copilot.rejected) == 1
    finally:
        adapter.close()


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_the_adapter_model_list_refreshes_once_after_a_401(copilot: CopilotFake, mode: str) -> None:
    adapter = adapter_for(copilot)
    try:
        adapter.list_models()
        copilot.github.revoke_copilot_tokens()
        if mode == "async":
            models = asyncio.run(adapter.alist_models(refresh=True))
        else:
            models = adapter.list_models(refresh=True)
        assert "gpt-4.1" in [m.id for m in models]
        assert copilot.github.copilot_exchanges == 2
        assert [r.path for r in copilot.rejected] == ["/models"]
    finally:
        adapter.close()


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_second_401_is_an_authentication_error(copilot: CopilotFake, mode: str) -> None:
    adapter = adapter_for(copilot)
    try:
        adapter.chat("warm up")
        copilot.push(Fail(401, "unauthorized: your seat was removed"))  # the fake answers twice
        def chat() -> object:
            return asyncio.run(adapter.achat("Hi")) if mode == "async" else adapter.chat("Hi")

        def models() -> object:
            if mode == "async":
                return asyncio.run(adapter.alist_models(refresh=True))
            return adapter.list_models(refresh=True)

        with pytest.raises(AuthenticationError) as info:
            chat()
        assert info.value.status_code == 401 and "seat was removed" in info.value.message
        assert copilot.github.copilot_exchanges == 2
        assert len(copilot.chat_requests) == 3  # warm up, the attempt, its one resend
        copilot.models_reply = Reply(status=401, body=b'{"error": {"message": "models gone"}}')
        with pytest.raises(AuthenticationError, match="models gone") as gone:
            models()
        assert gone.value.status_code == 401
        assert copilot.github.copilot_exchanges == 3
    finally:
        adapter.close()


def test_32_threads_on_one_adapter_after_a_revocation_cause_one_exchange(
    copilot: CopilotFake,
) -> None:
    adapter = adapter_for(copilot)
    try:
        adapter.chat("warm up")
        copilot.github.revoke_copilot_tokens()
        copilot.github.copilot_token_response(endpoints_api=copilot.url, delay=0.3)
        barrier = threading.Barrier(32)
        texts: list[str] = []
        lock = threading.Lock()

        def worker(i: int) -> None:
            barrier.wait()
            text = adapter.chat(f"t{i}").text
            with lock:
                texts.append(text)

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(32)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert sorted(texts) == sorted(f"echo: t{i}" for i in range(32))
        assert copilot.github.copilot_exchanges == 2
    finally:
        adapter.close()
