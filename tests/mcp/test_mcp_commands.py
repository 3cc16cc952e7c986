"""``%chat mcp add|list|remove`` as a person types them (no server is started here)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from IPython.core.error import UsageError

from dispatch_nb.notebook import mcp_servers
from dispatch_nb.notebook.mcp_servers import mcp_command


@pytest.fixture(autouse=True)
def no_servers(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(mcp_servers, "_servers", {})
    monkeypatch.chdir(tmp_path)


def test_an_unbalanced_quote_is_a_usage_error() -> None:
    # it was shlex's ValueError, with a traceback through the library
    with pytest.raises(UsageError, match="No closing quotation"):
        mcp_command('add files -- npx -y "server-filesystem /data')
    assert mcp_servers._servers == {}


def test_list_shows_the_servers_of_mcp_json(capsys: pytest.CaptureFixture[str]) -> None:
    """A server that mcp.json names is usable with --mcp NAME without %chat mcp add, so the list
    shows it too (it said "no MCP servers: add one with %chat mcp add")."""
    Path("mcp.json").write_text(json.dumps({"mcpServers": {
        "files": {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-filesystem"]},
        "search": {"url": "http://127.0.0.1:9/mcp", "headers": {"Authorization": "Bearer hush"}},
    }}))
    mcp_command("list")
    out = capsys.readouterr().out
    assert "files: stopped" in out and "search: stopped" in out, out
    assert "no MCP servers" not in out and "hush" not in out
    Path("mcp.json").write_text("{not json")
    with pytest.raises(UsageError, match=r"mcp\.json: not an mcpServers JSON file"):
        mcp_command("list")


def test_remove_says_where_a_server_of_mcp_json_stays(capsys: pytest.CaptureFixture[str]) -> None:
    """A server mcp.json names comes back at the next list or --mcp NAME: remove stops it and
    says so (it said "removed", and the next list showed it again)."""
    Path("mcp.json").write_text(json.dumps({"mcpServers": {"files": {"command": "npx"}}}))
    mcp_command("list")
    mcp_command("remove files")
    assert capsys.readouterr().out.endswith(
        "stopped MCP server files; mcp.json still names it (--mcp files starts it again): "
        "delete it there to remove it\n")
    assert mcp_servers._servers == {}
    mcp_command("remove files")  # not started: the same answer, no error
    assert "mcp.json still names it" in capsys.readouterr().out
    mcp_command("add mine -- python -m server")
    mcp_command("remove mine")
    assert capsys.readouterr().out.endswith("removed MCP server mine\n")
    with pytest.raises(UsageError, match="no MCP server named 'mine'"):
        mcp_command("remove mine")


def test_one_unusable_entry_of_mcp_json_does_not_hide_the_others(
    capsys: pytest.CaptureFixture[str]
) -> None:
    """An entry without a command or url (or not an object) is named with its problem; the
    others are listed (the whole list was a UsageError), and --mcp NAME says what is wrong."""
    Path("mcp.json").write_text(json.dumps({"mcpServers": {
        "good": {"command": "echo"}, "disabled": {"disabled": True}, "odd": "echo"}}))
    mcp_command("list")
    out = capsys.readouterr().out
    assert "good: stopped" in out, out
    assert "disabled: ⚠ mcp.json: server 'disabled' needs a command or a url" in out
    assert "odd: ⚠ mcp.json: server 'odd' needs a command or a url" in out
    with pytest.raises(UsageError, match="server 'odd' needs a command or a url"):
        mcp_servers.resolve_servers("odd")


def test_remove_with_a_malformed_mcp_json_keeps_the_server_it_cannot_stop() -> None:
    mcp_command("add mine -- python -m server")
    Path("mcp.json").write_text("{not json")
    with pytest.raises(UsageError, match="not an mcpServers JSON file"):
        mcp_command("remove mine")
    assert "mine" in mcp_servers._servers  # still known, so a later remove stops it
