"""The kernel as context: read-only tools over allowed names, bounded bytes (with the canonical
fake as the model)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

from dispatch_nb.context import context_tools
from dispatch_nb.providers.fake import CanonicalAdapter
from dispatch_nb.session import Session

from ..fakes.canonical import CanonicalFake
from ..fakes.provider import ToolCall, Turn


def test_only_allowed_names_and_bounded_bytes(fake: CanonicalFake, adapter: CanonicalAdapter) -> None:

    class Loud:
        def __repr__(self) -> str:
            return "x" * 100_000

    namespace: dict[str, Any] = {"grid": np.zeros((3, 4), dtype="float32"), "big": Loud(),
                                 "token": "sk-hidden"}
    fake.push(Turn(tool_calls=[ToolCall("c1", "describe", {"name": "grid"}),
                               ToolCall("c2", "describe", {"name": "big"}),
                               ToolCall("c3", "describe", {"name": "token"}),
                               ToolCall("c4", "list_variables", {})]), Turn(text="ok"))
    tools = context_tools(namespace, ["grid", "big", "missing"], max_bytes=500)
    Session(adapter, tools=tools).send("look")
    body = fake.chat_requests[-1].json
    grid, big, token, listed = [b["content"] for b in body["messages"][-1]["content"]]
    assert "shape: (3, 4)" in grid and "dtype: float32" in grid
    assert len(big.encode()) <= 500 and big.endswith("(cut)")
    assert "not shared with you" in token and "sk-hidden" not in str(body)
    assert listed == "grid: ndarray\nbig: Loud"  # a name that does not exist is not listed


def test_session_context_with_a_mapping(fake: CanonicalFake, adapter: CanonicalAdapter) -> None:
    """``Session(context={name: value})``: the model reads those values through the same two
    tools, next to the session's own tools."""
    import pytest

    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    fake.push(Turn(tool_calls=[ToolCall("m1", "describe", {"name": "grid"}),
                               ToolCall("m2", "describe", {"name": "other"}),
                               ToolCall("m3", "add", {"a": 1, "b": 2})]), Turn(text="ok"))
    session = Session(adapter, tools=[add], context={"grid": np.ones((2, 5))})
    session.send("look")
    assert fake.tool_names_of(fake.chat_requests[0]) == ["add", "list_variables", "describe"]
    grid, other, total = [b["content"] for b in fake.chat_requests[-1].json["messages"][-1]["content"]]
    assert "shape: (2, 5)" in grid and "not shared with you" in other and total == "3"
    # names need a notebook's variables: outside IPython (a fresh process: this one may have
    # made an IPython shell for another test) they are refused, saying what to pass instead
    outside = subprocess.run(
        [sys.executable, "-c", "from dispatch_nb import Session\n"
         "try:\n    Session('fake:echo', context='df')\n"
         "except ValueError as exc:\n    print(exc)\n"],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [
            str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH")]))})
    assert "outside IPython pass the values: context={'df': df}" in outside.stdout, outside
    with pytest.raises(TypeError, match="context= takes the names of variables"):
        Session(adapter, context=42)
    with pytest.raises(TypeError, match="context= takes the names of variables"):
        Session(adapter, context=iter(["df", 3]))
    with pytest.raises(ValueError, match=r"needs the names of variables the model may read"):
        Session(adapter, context={})
