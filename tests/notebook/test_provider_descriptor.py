"""The notebook reads a provider's descriptor: a provider added by one module
(``tests/providers/acme.py``) gets its ``%chat status`` row, its ``%chat key`` / ``%chat login``
answer, its ``%chat models`` listing and its error advice with nothing else written."""

from __future__ import annotations

from typing import Any

import pytest

from dispatch_nb.notebook.display import ChatError
from tests.fakes.provider import Fail
from tests.notebook.conftest import run
from tests.providers import acme  # importing it registers the provider


@pytest.fixture
def acme_env(fake: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("ACME_BASE_URL", fake.url)
    monkeypatch.setenv("ACME_API_KEY", "acme-notebook-key-42")
    return fake


def test_status_has_its_row_without_the_key(shell: Any, acme_env: Any) -> None:
    run(shell, "%chat status")
    md = shell.front.markdown[0]
    assert "Acme" in md and "`ACME_API_KEY` set" in md
    assert "acme-notebook-key-42" not in str(shell.front.messages)


def test_auth_error_advice_names_its_key(shell: Any, acme_env: Any) -> None:
    acme_env.push(Fail(401, "bad key", "authentication_error"))
    error = run(shell, "%%chat -m acme:acme-1\nhi").error_in_exec
    assert isinstance(error, ChatError)
    text = "\n".join(error._render_traceback_())
    assert "%chat key acme" in text and "ACME_API_KEY" in text
    assert "acme-notebook-key-42" not in text


def test_models_and_login_and_key_know_it(shell: Any, acme_env: Any) -> None:
    run(shell, "%chat models acme")  # listed without naming a model: the descriptor's default
    assert "`acme:echo`" in shell.front.markdown[0]
    run(shell, "%chat login acme")
    assert "ACME_API_KEY" in shell.front.markdown[0] and "%chat key acme" in shell.front.markdown[0]


def test_status_says_which_check_failed(shell: Any, acme_env: Any) -> None:
    """A plug-in's find_login that fails shows its exception's type, not a bare "'HOME'"."""
    from dispatch_nb import register_provider, registry

    def broken(env: Any) -> None:
        raise KeyError("HOME")

    register_provider(registry.ProviderDescriptor("acme-login-broken", acme.AcmeAdapter,
                                                  login_flow="github-device", find_login=broken))
    try:
        run(shell, "%chat status")
    finally:
        registry._providers.pop("acme-login-broken", None)
    assert "| acme-login-broken | ⚠ cannot be checked (KeyError: 'HOME') |" in shell.front.markdown[0]


def test_a_plug_in_that_cannot_be_loaded_is_said_with_its_own_fix(
    shell: Any, acme_env: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dispatch_nb import registry

    why = ("provider plug-in 'acme-gone' (acme_gone:DESCRIPTOR) cannot be loaded: "
           "ModuleNotFoundError: No module named 'acme_gone'; update or reinstall the package "
           "acme-gone, or uninstall it")
    monkeypatch.setitem(registry._broken_plugins, "acme-gone", why)  # as an entry point leaves it
    error = run(shell, "%%chat -m acme-gone:m1\nhi").error_in_exec
    assert isinstance(error, ChatError)
    text = "\n".join(error._render_traceback_())
    assert why in text and "provider:model" not in text  # not "write the model as provider:model"
