"""The token file (atomic, 0600, loud when corrupt) and which GitHub token wins."""

from __future__ import annotations

import json
import logging
import os
import stat
import sys
from pathlib import Path

import pytest

from dispatch_nb.auth import (
    FoundToken,
    TokenStore,
    TokenStoreError,
    copilot_config_dir,
    default_token_path,
    dispatch_nb_home,
    find_github_token,
    mask_token,
)
from dispatch_nb.errors import AuthenticationError

posix_only = pytest.mark.skipif(sys.platform == "win32", reason="POSIX file modes")

TOKEN = "ghu_" + "s3cr3t" * 6
ENV_TOKEN = "gho_" + "envtok" * 6
APPS_TOKEN = "ghu_" + "appsjs" * 6
HOSTS_TOKEN = "ghu_" + "hostsj" * 6
ALL_SECRETS = (TOKEN, ENV_TOKEN, APPS_TOKEN, HOSTS_TOKEN)


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty HOME, XDG_CONFIG_HOME and DISPATCH_NB_HOME, and no token in the environment."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("DISPATCH_NB_HOME", str(tmp_path / "dnb"))
    for name in ("DISPATCH_NB_GITHUB_TOKEN", "DISPATCH_NB_GITHUB_URL", "LOCALAPPDATA"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path


def write_apps(directory: Path, entries: dict[str, dict[str, str]], name: str = "apps.json") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(json.dumps(entries))
    return path


# -- where -----------------------------------------------------------------------------------------
def test_default_path_is_under_dispatch_nb_home(home: Path) -> None:
    assert dispatch_nb_home() == home / "dnb"
    assert default_token_path() == home / "dnb" / "github_token.json"
    assert TokenStore().path == home / "dnb" / "github_token.json"


def test_without_dispatch_nb_home_the_platform_config_dir_is_used(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import platformdirs

    monkeypatch.delenv("DISPATCH_NB_HOME")
    expected = Path(platformdirs.user_config_dir("dispatch_nb", appauthor=False))
    assert dispatch_nb_home() == expected
    if sys.platform.startswith("linux"):
        assert expected == home / "xdg" / "dispatch_nb"


# -- save / load / delete --------------------------------------------------------------------------
@posix_only
def test_save_writes_json_with_mode_0600_in_a_0700_directory(home: Path) -> None:
    store = TokenStore()
    path = store.save(TOKEN, user="octocat", github_url="https://github.com/")
    assert path == home / "dnb" / "github_token.json"
    data = json.loads(path.read_text())
    assert data["github_token"] == TOKEN
    assert data["user"] == "octocat"
    assert data["github_url"] == "https://github.com"
    assert data["created_at"].endswith("+00:00")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert sorted(p.name for p in path.parent.iterdir()) == ["github_token.json"]


@posix_only
def test_save_is_0600_even_with_a_permissive_umask(home: Path) -> None:
    old = os.umask(0)
    try:
        path = TokenStore(home / "deep" / "er" / "t.json").save(TOKEN)
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700


@posix_only
def test_save_replaces_the_file_atomically(home: Path) -> None:
    store = TokenStore()
    store.save("ghu_first")
    before = store.path.stat().st_ino
    os.chmod(store.path, 0o644)  # someone loosened it: a new file gets 0600 again
    store.save(TOKEN, user="hubot")
    assert store.path.stat().st_ino != before  # a new file was renamed over the old one
    assert stat.S_IMODE(store.path.stat().st_mode) == 0o600
    assert store.load() == TOKEN
    assert [p.name for p in store.path.parent.iterdir()] == ["github_token.json"]


@posix_only
def test_an_existing_directory_keeps_its_mode(home: Path) -> None:
    directory = home / "shared"
    directory.mkdir(mode=0o755)
    os.chmod(directory, 0o755)
    TokenStore(directory / "t.json").save(TOKEN)
    assert stat.S_IMODE(directory.stat().st_mode) == 0o755


def test_load_returns_none_without_a_file_and_the_token_after_save(home: Path) -> None:
    store = TokenStore()
    assert store.load() is None
    assert store.load_record() is None
    assert not store.exists()
    store.save(TOKEN, user="octocat", github_url="https://ghe.example.com")
    assert store.load() == TOKEN
    record = store.load_record()
    assert record is not None
    assert (record.user, record.github_url) == ("octocat", "https://ghe.example.com")
    assert TOKEN not in repr(record)
    assert TOKEN not in repr(store)


def test_tilde_paths_are_expanded(home: Path) -> None:
    store = TokenStore("~/tokens/t.json")
    assert store.path == home / "home" / "tokens" / "t.json"


CORRUPT = {
    "not-json": (b"{not json", "not valid JSON"),
    "empty": (b"", "not valid JSON"),
    "a-list": (b"[1, 2]", "JSON object"),
    "no-token": (b'{"user": "octocat"}', '"github_token"'),
    "token-not-a-string": (b'{"github_token": 42}', '"github_token"'),
    "binary": (b"\xff\xfe\x00garbage", "not valid JSON"),
}


@pytest.mark.parametrize("case", CORRUPT, ids=list(CORRUPT))
def test_a_corrupt_file_raises_naming_the_path_and_is_left_alone(home: Path, case: str) -> None:
    content, words = CORRUPT[case]
    store = TokenStore()
    store.path.parent.mkdir(parents=True)
    store.path.write_bytes(content)
    with pytest.raises(TokenStoreError) as info:
        store.load()
    assert info.value.code == "token_store_error"
    error = info.value
    assert isinstance(error, AuthenticationError) and error.status_code is None
    assert error.path == store.path
    assert str(store.path) in str(error)
    assert words in str(error)
    assert "Delete it" in str(error)
    assert "login" in str(error)
    with pytest.raises(TokenStoreError) as raised:
        find_github_token()
    assert raised.value.code == "token_store_error"
    assert store.path.read_bytes() == content


def test_a_directory_where_the_file_should_be_is_reported(home: Path) -> None:
    store = TokenStore()
    store.path.mkdir(parents=True)
    with pytest.raises(TokenStoreError, match="is a directory") as info:
        store.load()
    assert info.value.code == "token_store_error"


def test_delete_removes_only_our_file(home: Path) -> None:
    apps = write_apps(home / "xdg" / "github-copilot", {"github.com:x": {"oauth_token": APPS_TOKEN}})
    store = TokenStore()
    store.save(TOKEN)
    assert store.delete() is True
    assert not store.path.exists()
    assert store.delete() is False
    assert apps.exists()
    assert store.path.parent.exists()


def test_logout_can_remove_a_corrupt_file(home: Path) -> None:
    store = TokenStore()
    store.path.parent.mkdir(parents=True)
    store.path.write_text("garbage")
    assert store.delete() is True


def test_save_rejects_an_empty_token(home: Path) -> None:
    with pytest.raises(ValueError, match="empty"):
        TokenStore().save("")


# -- resolution ------------------------------------------------------------------------------------
def test_resolution_order(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    directory = home / "xdg" / "github-copilot"
    apps = write_apps(directory, {"github.com:Iv1.b507a08c87ecfe98": {"oauth_token": APPS_TOKEN}})
    hosts = write_apps(directory, {"github.com": {"oauth_token": HOSTS_TOKEN}}, "hosts.json")
    store = TokenStore()
    store.save(TOKEN, github_url="https://github.com")
    monkeypatch.setenv("DISPATCH_NB_GITHUB_TOKEN", ENV_TOKEN)

    assert find_github_token("ghu_explicit") == FoundToken("ghu_explicit", "argument")
    assert find_github_token() == FoundToken(ENV_TOKEN, "DISPATCH_NB_GITHUB_TOKEN")
    monkeypatch.delenv("DISPATCH_NB_GITHUB_TOKEN")
    assert find_github_token() == FoundToken(TOKEN, str(store.path))
    store.delete()
    assert find_github_token() == FoundToken(APPS_TOKEN, f"Copilot editor login ({apps})")
    apps.unlink()
    assert find_github_token() == FoundToken(HOSTS_TOKEN, f"Copilot editor login ({hosts})")
    hosts.unlink()
    assert find_github_token() is None


def test_token_path_argument_is_used(home: Path) -> None:
    custom = TokenStore(home / "custom.json")
    custom.save(TOKEN)
    assert find_github_token() is None
    assert find_github_token(token_path=custom.path) == FoundToken(TOKEN, str(custom.path))


def test_editor_logins_default_to_home_dot_config(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("XDG_CONFIG_HOME")
    directory = home / "home" / ".config" / "github-copilot"
    assert copilot_config_dir() == directory
    write_apps(directory, {"github.com": {"oauth_token": HOSTS_TOKEN}}, "hosts.json")
    found = find_github_token()
    assert found is not None
    assert found.token == HOSTS_TOKEN
    assert str(directory / "hosts.json") in found.source


def test_editor_logins_on_windows_live_in_localappdata(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "platform", "win32")
    monkeypatch.setenv("LOCALAPPDATA", str(home / "appdata"))
    assert copilot_config_dir() == home / "appdata" / "github-copilot"


def test_editor_logins_match_the_github_host(home: Path) -> None:
    directory = home / "xdg" / "github-copilot"
    write_apps(
        directory,
        {
            "github.com:Iv1.b507a08c87ecfe98": {"oauth_token": APPS_TOKEN},
            "ghe.example.com:Iv1.other": {"oauth_token": "ghu_other_app", "githubAppId": "x"},
            "ghe.example.com:Iv1.b507a08c87ecfe98": {"oauth_token": HOSTS_TOKEN},
            "broken": "not an object",  # type: ignore[dict-item]
        },
    )
    found = find_github_token(github_url="https://GHE.example.com/")
    assert found is not None
    assert found.token == HOSTS_TOKEN  # our client id is preferred
    assert find_github_token(github_url="https://elsewhere.example.org") is None
    found = find_github_token()
    assert found is not None
    assert found.token == APPS_TOKEN


def test_the_github_url_environment_variable_picks_the_host(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_apps(
        home / "xdg" / "github-copilot", {"ghe.example.com": {"oauth_token": HOSTS_TOKEN}}, "hosts.json"
    )
    assert find_github_token() is None
    monkeypatch.setenv("DISPATCH_NB_GITHUB_URL", "https://ghe.example.com")
    found = find_github_token()
    assert found is not None
    assert found.token == HOSTS_TOKEN


def test_a_stored_token_for_another_host_is_skipped(home: Path) -> None:
    TokenStore().save(TOKEN, github_url="https://ghe.example.com")
    assert find_github_token() is None
    found = find_github_token(github_url="https://ghe.example.com")
    assert found is not None
    assert found.token == TOKEN


def test_corrupt_editor_files_are_skipped(home: Path) -> None:
    directory = home / "xdg" / "github-copilot"
    directory.mkdir(parents=True)
    (directory / "apps.json").write_text("{broken")
    write_apps(directory, {"github.com": {"oauth_token": HOSTS_TOKEN}}, "hosts.json")
    found = find_github_token()
    assert found is not None
    assert found.token == HOSTS_TOKEN
    assert (directory / "apps.json").read_text() == "{broken"


def test_a_blank_environment_variable_is_ignored(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DISPATCH_NB_GITHUB_TOKEN", "  ")
    assert find_github_token() is None


# -- secrets ---------------------------------------------------------------------------------------
def test_mask_token_reveals_only_the_kind_and_length() -> None:
    assert mask_token(TOKEN) == f"ghu_… ({len(TOKEN)} characters)"
    assert mask_token("github_pat_" + "x" * 30).startswith("github_…")
    assert mask_token("plainsecretvalue") == "… (16 characters)"
    assert mask_token(None) == "(none)"
    for secret in ALL_SECRETS:
        masked = mask_token(secret)
        assert secret[4:8] not in masked
        assert secret[-4:] not in masked


def test_no_secret_in_reprs_or_logs(
    home: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    directory = home / "xdg" / "github-copilot"
    write_apps(directory, {"github.com:Iv1.b507a08c87ecfe98": {"oauth_token": APPS_TOKEN}})
    write_apps(directory, {"github.com": {"oauth_token": HOSTS_TOKEN}}, "hosts.json")
    store = TokenStore()
    store.save(TOKEN, github_url="https://ghe.example.com")
    texts = [repr(store), repr(store.load_record())]
    for found in (find_github_token(), find_github_token(github_url="https://ghe.example.com")):
        assert found is not None
        texts += [repr(found), found.source]
    monkeypatch.setenv("DISPATCH_NB_GITHUB_TOKEN", ENV_TOKEN)
    texts.append(repr(find_github_token()))
    store.path.write_text("{corrupt " + TOKEN)
    with pytest.raises(TokenStoreError) as info:
        store.load()
    assert info.value.code == "token_store_error"
    texts += [str(info.value), repr(info.value)]
    store.delete()
    texts += [r.getMessage() for r in caplog.records] + [repr(r.args) for r in caplog.records]
    assert caplog.records
    for text in texts:
        for secret in ALL_SECRETS:
            assert secret not in text, text
