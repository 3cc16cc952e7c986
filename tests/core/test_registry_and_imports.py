"""Registry, model specs, the public surface, and a light ``import dispatch_nb``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import dispatch_nb
from dispatch_nb import (
    Adapter,
    RequestError,
    connect,
    get_provider,
    list_providers,
    register_provider,
)
from dispatch_nb.providers.fake import CanonicalAdapter
from dispatch_nb.registry import parse_model_spec

REPO = Path(__file__).resolve().parents[2]

DESIGN_NAMES = {
    "TextBlock", "ImageBlock", "ToolUseBlock", "ToolResultBlock", "ThinkingBlock",
    "RedactedThinkingBlock", "Message", "ToolDefinition", "Usage", "Response", "StreamDelta",
    "StreamEvent", "ModelInfo", "Adapter", "CopilotAdapter", "OpenAIAdapter", "AnthropicAdapter",
    "LocalAdapter", "connect", "register_provider", "get_provider", "list_providers", "Session",
    "tool", "CancelToken", "DispatchError", "AuthenticationError", "RateLimitError", "ServerError",
    "RequestError", "ContextLengthError", "ModelUnavailableError", "APIConnectionError",
    "APITimeoutError", "RequestCancelled", "load_ipython_extension",
}


def test_public_surface_contains_the_design_names() -> None:
    assert set(dispatch_nb.__all__) >= DESIGN_NAMES
    assert sorted(dispatch_nb.__all__) == dispatch_nb.__all__


def test_type_checkers_see_every_lazy_public_name() -> None:
    # the names __getattr__ imports on first use are Any to a type checker unless the
    # ``if TYPE_CHECKING:`` block of __init__.py imports them from the same module
    import ast

    tree = ast.parse(Path(dispatch_nb.__file__).read_text())
    block = next(n for n in tree.body if isinstance(n, ast.If) and ast.unparse(n.test) == "TYPE_CHECKING")
    seen = {
        alias.name: (node.module or "").lstrip(".")
        for node in block.body if isinstance(node, ast.ImportFrom) for alias in node.names
    }
    assert seen == dispatch_nb._EXPORTS


def test_every_public_core_name_resolves() -> None:
    for name in ["Response", "connect", "CancelToken", "DispatchError", "Adapter"]:
        assert getattr(dispatch_nb, name) is not None
    with pytest.raises(AttributeError):
        dispatch_nb.NotAName  # noqa: B018


def test_import_is_light() -> None:
    code = (
        "import sys, json, dispatch_nb; "
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('IPython','ipywidgets','httpx','pydantic','llama_cpp') or m.startswith('dispatch_nb.'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == []


def test_an_error_s_missing_attribute_imports_nothing() -> None:
    # traceback asks every exception for __notes__, callers getattr(err, "x", None): an error's
    # helpful message for Response attributes (errors.DispatchError.__getattr__) loads no module
    code = (
        "import sys, json, traceback; from dispatch_nb.errors import DispatchError; "
        "before = set(sys.modules); err = DispatchError('x'); traceback.format_exception(err); "
        "getattr(err, 'alternatives', None); getattr(err, 'parsed', None); "
        "print(json.dumps(sorted(set(sys.modules) - before)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == []


@pytest.fixture
def nothing_set_up(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No model, key or login of the developer's own setup."""
    for name in ("DISPATCH_NB_MODEL", "OPENAI_API_KEY", "ANTHROPIC_API_KEY", "OPENAI_BACKEND",
                 "DISPATCH_NB_GITHUB_TOKEN", "DISPATCH_NB_COMPATIBLE_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("DISPATCH_NB_HOME", str(tmp_path / "dnb"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    return tmp_path


def test_parse_model_spec(nothing_set_up: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert parse_model_spec("openai:gpt-4.1") == ("openai", "gpt-4.1")
    assert parse_model_spec("compatible:llama3:8b") == ("compatible", "llama3:8b")
    monkeypatch.setenv("DISPATCH_NB_GITHUB_TOKEN", "ghu_" + "a1B2c3D4e5" * 4)
    assert parse_model_spec("gpt-4.1") == ("copilot", "gpt-4.1")
    assert parse_model_spec("llama3:8b") == ("copilot", "llama3:8b")
    monkeypatch.setenv("DISPATCH_NB_MODEL", "anthropic:claude-sonnet-4-5")
    assert parse_model_spec("claude-haiku-4-5") == ("anthropic", "claude-haiku-4-5")
    assert parse_model_spec("gpt-4.1", "openai:gpt-4.1") == ("openai", "gpt-4.1")
    with pytest.raises(RequestError, match=r"available providers: .*anthropic.*openai") as info:
        parse_model_spec("nosuch:model")
    assert info.value.code == "unknown_provider"
    # a provider name with a hyphen, not registered (register_provider was not run): said so, not
    # taken for a model named "local-tools:smollm2" of the default provider
    with pytest.raises(RequestError, match=r"unknown provider 'local-tools'") as info:
        parse_model_spec("local-tools:smollm2")
    assert info.value.code == "unknown_provider"
    assert parse_model_spec("deepseek-r1:8b") == ("anthropic", "deepseek-r1:8b")  # a size tag
    with pytest.raises(RequestError, match="no model") as info:
        parse_model_spec("openai:")
    assert info.value.code == "invalid_request"
    with pytest.raises(RequestError) as info:
        parse_model_spec("   ")
    assert info.value.code == "invalid_request"


def test_a_spec_written_with_spaces_or_capitals_reads_as_meant(
    nothing_set_up: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``-m "openai: gpt-4.1"`` (a space after the colon, as in prose) is openai's gpt-4.1: the
    model is not sent as " gpt-4.1" (unknown to the server, and unpriced); ``OpenAI:...`` is
    refused with the guess that fits."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-spaces-0000000000")
    assert parse_model_spec("openai: gpt-4.1") == ("openai", "gpt-4.1")
    assert parse_model_spec(" openai : gpt-4.1 ") == ("openai", "gpt-4.1")
    assert parse_model_spec("compatible: llama3:8b") == ("compatible", "llama3:8b")
    adapter = connect("openai: gpt-4.1-mini")
    try:
        assert (adapter.provider_name, adapter.model_name) == ("openai", "gpt-4.1-mini")
    finally:
        adapter.close()
    with pytest.raises(RequestError, match="no model") as info:
        parse_model_spec("openai:   ")
    assert info.value.code == "invalid_request"
    with pytest.raises(RequestError, match=r"unknown provider 'OpenAI' .*\(did you mean openai\?\)") \
            as info:
        parse_model_spec("OpenAI:gpt-4.1")
    assert info.value.code == "unknown_provider"


def test_a_bare_name_goes_to_the_default_provider_status_shows(
    nothing_set_up: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With only OPENAI_API_KEY set, OpenAI is the default: a bare name is an OpenAI model, not
    a Copilot one that needs a GitHub login."""
    from dispatch_nb.defaults import resolve_default_model

    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-bare-name-000000")
    assert resolve_default_model().spec == "openai:gpt-4.1"
    assert parse_model_spec("gpt-4.1-mini") == ("openai", "gpt-4.1-mini")
    adapter = connect("gpt-4.1-mini")
    try:
        assert (adapter.provider_name, adapter.model_name) == ("openai", "gpt-4.1-mini")
    finally:
        adapter.close()
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test-0000")
    monkeypatch.delenv("OPENAI_API_KEY")
    assert parse_model_spec("claude-haiku-4-5") == ("anthropic", "claude-haiku-4-5")
    # connect() without a spec takes the same default
    default = connect()
    try:
        assert default.provider_name == "anthropic"
    finally:
        default.close()


def test_a_bare_name_with_nothing_set_up_is_refused_with_the_choices(nothing_set_up: Path) -> None:
    """No login, key or embedded model: ``connect("gpt4")`` must not make a Copilot adapter that
    starts a GitHub login; it says how to write the spec."""
    code = (
        "import sys; sys.modules['llama_cpp'] = None\n"
        "from dispatch_nb import connect, RequestError\n"
        "try:\n"
        "    adapter = connect('gpt4')\n"
        "except RequestError as exc:\n"
        "    print('refused:', exc.message)\n"
        "else:\n"
        "    print('made:', adapter.provider_name)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    assert out.startswith("refused: model 'gpt4': no provider is set up here"), out
    for choice in ("'copilot:MODEL' (after `%chat login`)", "'openai:MODEL' (OPENAI_API_KEY)",
                   "'anthropic:MODEL' (ANTHROPIC_API_KEY)", "'local:MODEL'"):
        assert choice in out


def test_a_vendors_bare_name_goes_to_its_vendor_never_to_another(
    nothing_set_up: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With only OPENAI_API_KEY set, ``connect("claude-sonnet-4-5")`` must not make an OpenAI
    adapter: a Claude name is Anthropic's, refused (before anything is sent) with the provider
    to use and how to give it a key; once that key is set, it is Anthropic's adapter."""
    from dispatch_nb import AuthenticationError
    from dispatch_nb.registry import ProviderNotSetUpError

    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-vendor-name-0000")
    with pytest.raises(ProviderNotSetUpError) as info:
        connect("claude-sonnet-4-5")
    error = info.value
    assert isinstance(error, AuthenticationError) and error.provider == "anthropic"
    assert error.code == "authentication_failed"
    assert error.spec == "anthropic:claude-sonnet-4-5"
    assert error.alternatives == ("copilot:claude-sonnet-4-5",)
    assert "'anthropic:claude-sonnet-4-5'" in error.message and "nothing was sent" in error.message
    assert ("connect('anthropic:claude-sonnet-4-5', api_key=...) or set ANTHROPIC_API_KEY"
            in error.message)
    assert "gguf" not in error.message.lower()
    # the default provider's own names still go to it
    assert parse_model_spec("gpt-4.1-mini") == ("openai", "gpt-4.1-mini")
    assert parse_model_spec("o3-mini") == ("openai", "o3-mini")
    assert parse_model_spec("o1") == ("openai", "o1")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test-vendor-0000")
    adapter = connect("claude-sonnet-4-5")  # OpenAI is still the default
    try:
        assert (adapter.provider_name, adapter.model_name) == ("anthropic", "claude-sonnet-4-5")
    finally:
        adapter.close()
    # ... and the other way round: with only Anthropic's key, a GPT name is OpenAI's
    monkeypatch.delenv("OPENAI_API_KEY")
    assert parse_model_spec("claude-haiku-4-5") == ("anthropic", "claude-haiku-4-5")
    with pytest.raises(ProviderNotSetUpError, match=r"'openai:chatgpt-4o-latest'.*OPENAI_API_KEY"
                       ) as info:
        parse_model_spec("chatgpt-4o-latest")
    assert info.value.code == "authentication_failed"
    # a name of no known vendor keeps going to the default provider
    assert parse_model_spec("llama3:8b") == ("anthropic", "llama3:8b")
    # a default pointed at another server (a gateway) may serve any vendor's names: kept there
    monkeypatch.setenv("ANTHROPIC_BASE_URL", "http://127.0.0.1:9/gateway")
    assert parse_model_spec("gpt-4.1") == ("anthropic", "gpt-4.1")


def test_a_default_provider_that_does_not_say_what_it_serves_keeps_every_bare_name(
    nothing_set_up: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A provider registered with a factory (a plugin, a company gateway) declares no names: a
    vendor's bare name stays with it, never goes to that vendor because its key is set."""
    from dispatch_nb import registry

    register_provider("gateway-test", lambda model, **kw: CanonicalAdapter(
        model, base_url="http://127.0.0.1:9"))
    try:
        monkeypatch.setenv("DISPATCH_NB_MODEL", "gateway-test:gpt-4o")
        monkeypatch.setenv("OPENAI_API_KEY", "sk-test-gateway-0000")
        assert parse_model_spec("gpt-4.1") == ("gateway-test", "gpt-4.1")
        assert parse_model_spec("claude-sonnet-4-5") == ("gateway-test", "claude-sonnet-4-5")
    finally:
        registry._providers.pop("gateway-test", None)


def test_a_vendors_bare_name_with_the_embedded_model_as_default(
    nothing_set_up: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No key and no login, the embedded model the default: ``connect("gpt-4.1")`` says OpenAI
    (and GitHub Copilot) instead of asking for a GGUF file; a name of no vendor is unchanged."""
    from dispatch_nb.registry import ProviderNotSetUpError

    monkeypatch.setenv("DISPATCH_NB_MODEL", "local:smollm2")
    with pytest.raises(ProviderNotSetUpError) as info:
        connect("gpt-4.1")
    assert info.value.provider == "openai" and info.value.spec == "openai:gpt-4.1"
    assert info.value.code == "authentication_failed"
    assert "GitHub Copilot serves it too ('copilot:gpt-4.1', after a login)" in info.value.message
    assert "model_path" not in info.value.message
    # the default explicitly given (ChatMagics.model) is the same rule
    with pytest.raises(ProviderNotSetUpError, match="'anthropic:claude-opus-4-1'") as info:
        parse_model_spec("claude-opus-4-1", "local:smollm2")
    assert info.value.code == "authentication_failed"
    assert parse_model_spec("qwen2.5-0.5b") == ("local", "qwen2.5-0.5b")
    # a replay sends nothing: it needs no key, and the name keeps its vendor
    assert parse_model_spec("gpt-4.1", sends=False) == ("openai", "gpt-4.1")


def test_a_vendors_bare_name_with_nothing_set_up(
    nothing_set_up: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing set up at all: a GPT name is refused naming OpenAI, not "no provider"."""
    from dispatch_nb.registry import ProviderNotSetUpError

    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # the local extra is not installed
    with pytest.raises(ProviderNotSetUpError, match=r"'openai:gpt-4\.1'.*OPENAI_API_KEY") as info:
        connect("gpt-4.1")
    assert info.value.code == "authentication_failed"
    assert parse_model_spec("claude-sonnet-4-5", sends=False) == ("anthropic", "claude-sonnet-4-5")


def test_a_provider_serving_a_vendors_models_keeps_its_bare_names(
    nothing_set_up: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """GitHub Copilot serves OpenAI's and Anthropic's models: with a GitHub login as the
    default, bare GPT and Claude names stay Copilot's (as before), keys or not."""
    monkeypatch.setenv("DISPATCH_NB_GITHUB_TOKEN", "ghu_" + "a1B2c3D4e5" * 4)
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test-served-0000")
    assert parse_model_spec("claude-sonnet-4-5") == ("copilot", "claude-sonnet-4-5")
    assert parse_model_spec("gpt-4.1") == ("copilot", "gpt-4.1")
    # an OpenAI-compatible server chosen as the default serves whatever it is asked for
    assert parse_model_spec("gpt-4o", "compatible:llama3") == ("compatible", "gpt-4o")


def test_register_get_list_and_connect(monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[tuple[str, dict[str, object]]] = []

    def factory(model: str, **options: object) -> Adapter:
        made.append((model, options))
        return CanonicalAdapter(model, base_url="http://127.0.0.1:9")

    register_provider("unit-test-provider", factory)
    try:
        assert "unit-test-provider" in list_providers()
        assert get_provider("unit-test-provider") is factory
        adapter = connect("unit-test-provider:m1", max_tokens=5)
        assert isinstance(adapter, CanonicalAdapter) and made == [("m1", {"max_tokens": 5})]
        with pytest.raises(ValueError, match="already registered"):
            register_provider("unit-test-provider", factory)
        register_provider("unit-test-provider", factory, replace=True)
        monkeypatch.setenv("DISPATCH_NB_MODEL", "unit-test-provider:default-model")
        connect()
        assert made[-1][0] == "default-model"
    finally:
        from dispatch_nb import registry

        registry._providers.pop("unit-test-provider", None)
    with pytest.raises(RequestError, match="available providers") as info:
        get_provider("unit-test-provider")
    assert info.value.code == "unknown_provider"


def test_base_adapter_defaults() -> None:
    class Minimal(Adapter):
        pass

    a = Minimal()
    assert a.provider_name == "Minimal"
    assert a.max_context_tokens is None
    assert a.count_tokens("hi") == -1
    with pytest.raises(NotImplementedError):
        _ = a.model_name
    with pytest.raises(NotImplementedError):
        a.chat("hi")


def test_bad_arguments_are_clear() -> None:
    adapter = CanonicalAdapter("echo", base_url="http://127.0.0.1:9")
    with pytest.raises(TypeError, match=r"does not understand option.*bogus"):
        adapter.chat("hi", bogus=1)
    with pytest.raises(TypeError) as typo:  # a typo gets a suggestion; named parameters count
        adapter.chat("hi", temprature=0.2)
    assert "temprature (did you mean temperature?)" in str(typo.value)
    assert "temperature" in str(typo.value).partition("supported: ")[2].split(", ")
    with pytest.raises(ValueError, match="temperature"):
        adapter.chat("hi", temperature=7)
    with pytest.raises(RequestError, match="nothing to send") as info:
        adapter.chat([])
    assert info.value.code == "invalid_request"
    with pytest.raises(TypeError, match="a tool must be"):
        adapter.chat("hi", tools=[42])
    # count_tokens checks what a call checks, then says -1: this provider cannot count
    assert adapter.count_tokens("hi", system="Be brief.", tools=[{"type": "web_search"}]) == -1
    with pytest.raises(RequestError, match="nothing to send") as counted:
        adapter.count_tokens([])
    assert counted.value.code == "invalid_request"
    with pytest.raises(TypeError, match="a tool must be"):
        adapter.count_tokens("hi", tools=[42])


def _run_with_plugins(site: Path, dist: str, entry_points: str, code: str
                      ) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter where ``site`` holds an installed distribution
    ``dist`` (its dist-info) whose ``[dispatch_nb.providers]`` are ``entry_points``."""
    info = site / f"{dist.replace('-', '_')}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[dispatch_nb.providers]\n{entry_points}")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(REPO)])}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, env=env, check=True)


def test_installed_distributions_register_providers_through_the_entry_point_group(
    tmp_path: Path,
) -> None:
    """A real distribution (a dist-info on sys.path) declaring ``[dispatch_nb.providers]``: its
    provider is found the first time the registry is asked, not at ``import dispatch_nb``; a
    plug-in that cannot be loaded is logged and leaves the others working, and asking for it, a
    factory that cannot be imported, or one that makes no adapter say which plug-in and why."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "plugged_dnb.py").write_text(
        "from dispatch_nb.registry import ProviderDescriptor\n"
        "DESCRIPTOR = ProviderDescriptor('plugged', 'plugged_dnb_adapter:make',\n"
        "    display_name='Plugged', key_env='PLUGGED_API_KEY', default_model='p-1', free=True)\n"
        "GONE = ProviderDescriptor('gone', 'no_such_module_for_dispatch_nb:make')\n"
        "def nothing(model, **options):\n"
        "    return None\n"
    )
    (site / "plugged_dnb_adapter.py").write_text(
        "from dispatch_nb.providers.fake import CanonicalAdapter\n"
        "def make(model, **options):\n"
        "    return CanonicalAdapter(model, base_url='http://127.0.0.1:9', **options)\n"
    )
    code = (
        "import sys, dispatch_nb\n"
        "print('imported at import:', 'plugged_dnb' in sys.modules)\n"
        "from dispatch_nb import connect, list_providers\n"
        "from dispatch_nb.registry import get_descriptor\n"
        "adapter = connect('plugged:p-1', max_tokens=7)\n"
        "print('adapter:', type(adapter).__name__, adapter.model_name, adapter.default_max_tokens)\n"
        "print('label:', get_descriptor('plugged').label)\n"
        "from dispatch_nb.cost import price\n"
        "print('priced as declared:', price('plugged', 'p-1', dispatch_nb.Usage()).usd)\n"
        "print('listed:', 'plugged' in list_providers(), 'broken' in list_providers())\n"
        "print('adapter module imported:', 'plugged_dnb_adapter' in sys.modules)\n"
        "for spec in ('broken:m', 'gone:m', 'nothing:m'):\n"
        "    try:\n"
        "        connect(spec)\n"
        "    except Exception as exc:\n"
        "        print(type(exc).__name__, exc)\n"
    )
    done = _run_with_plugins(site, "plugged-dnb", "plugged = plugged_dnb:DESCRIPTOR\n"
                             "broken = no_such_module_for_dispatch_nb:DESCRIPTOR\n"
                             "gone = plugged_dnb:GONE\nnothing = plugged_dnb:nothing\n", code)
    assert done.stdout.splitlines() == [
        "imported at import: False",
        "adapter: CanonicalAdapter p-1 7",
        "label: Plugged",
        "priced as declared: 0",
        "listed: True False",
        "adapter module imported: True",
        "UnknownProviderError provider plug-in 'broken' (no_such_module_for_dispatch_nb:DESCRIPTOR)"
        " cannot be loaded: ModuleNotFoundError: No module named 'no_such_module_for_dispatch_nb'; "
        "update or reinstall the package plugged-dnb, or uninstall it",
        "ImportError provider 'gone': its factory 'no_such_module_for_dispatch_nb:make' cannot be "
        "imported: No module named 'no_such_module_for_dispatch_nb'",
        "TypeError the factory of provider 'nothing' returned None, not an Adapter",
    ]
    assert "provider plug-in 'broken'" in done.stderr and "ModuleNotFoundError" in done.stderr


def test_threads_asking_at_once_all_see_the_plug_ins(tmp_path: Path) -> None:
    """Threads that ask the registry first at the same moment (a thread pool, a Dask worker's
    threads) wait while another loads the plug-ins: none is told the provider is unknown. A
    plug-in module that also registers its descriptor itself is loaded once, without a warning."""
    (tmp_path / "slow_dnb.py").write_text(
        "import time\n"
        "from dispatch_nb.registry import ProviderDescriptor, register_provider\n"
        "time.sleep(0.5)  # a plug-in whose module takes a while to import\n"
        "DESCRIPTOR = ProviderDescriptor('slow', 'dispatch_nb.providers.fake:CanonicalAdapter')\n"
        "register_provider(DESCRIPTOR)\n"
    )
    code = (
        "import threading\n"
        "from dispatch_nb.registry import find_descriptor\n"
        "found = []\n"
        "threads = [threading.Thread(target=lambda: found.append(find_descriptor('slow')))\n"
        "           for _ in range(6)]\n"
        "[t.start() for t in threads]\n"
        "[t.join() for t in threads]\n"
        "print(sum(d is not None for d in found))\n"
    )
    done = _run_with_plugins(tmp_path, "slow-dnb", "slow = slow_dnb:DESCRIPTOR\n", code)
    assert done.stdout.strip() == "6" and "not used" not in done.stderr


def test_ctrl_c_while_the_plug_ins_load_leaves_them_to_the_next_call(tmp_path: Path) -> None:
    """Ctrl-C during a slow plug-in's import (the first %%chat of a kernel) interrupts that call
    only: the next one loads the plug-ins (they stayed unknown for the kernel's life)."""
    (tmp_path / "late_dnb.py").write_text(
        "import pathlib\n"
        "marker = pathlib.Path(__file__).with_name('interrupted-once')\n"
        "if not marker.exists():\n"
        "    marker.write_text('')\n"
        "    raise KeyboardInterrupt\n"
        "from dispatch_nb.registry import ProviderDescriptor\n"
        "DESCRIPTOR = ProviderDescriptor('late', 'dispatch_nb.providers.fake:CanonicalAdapter')\n"
    )
    code = (
        "from dispatch_nb.registry import find_descriptor\n"
        "try:\n"
        "    find_descriptor('late')\n"
        "except KeyboardInterrupt:\n"
        "    print('interrupted')\n"
        "print(find_descriptor('late') is not None)\n"
    )
    done = _run_with_plugins(tmp_path, "late-dnb", "late = late_dnb:DESCRIPTOR\n", code)
    assert done.stdout.splitlines() == ["interrupted", "True"], done.stderr
