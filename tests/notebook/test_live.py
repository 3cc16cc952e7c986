"""The live view: first text at once, coalesced repaints, bytes linear in the answer's length."""

from __future__ import annotations

import time
from typing import Any

import pytest

from dispatch_nb.notebook.live import DisplayView, Pacer, detect_mode, make_view
from dispatch_nb.types import StreamDelta
from tests.fakes.provider import Turn
from tests.notebook.conftest import run


def text(piece: str) -> StreamDelta:
    return StreamDelta(type="text_delta", text=piece)


def test_pacer_allows_the_first_update_at_once_then_at_most_rate_per_second() -> None:
    pacer = Pacer(20)
    assert pacer.wait(100.0) == 0
    pacer.mark(100.0)
    assert pacer.wait(100.01) == pytest.approx(0.04)
    assert pacer.wait(100.05) == 0


def test_first_text_is_shown_at_once_and_later_text_is_coalesced(shell: Any) -> None:
    front = shell.front
    front.reset()
    view = DisplayView(["fake:echo"])
    view.start()
    view.feed(0, text("Hel"))
    assert view.tick() is None  # flushed immediately
    assert front.outputs[-1]["data"]["text/plain"] == "Hel"
    sent = len(front.messages)
    view.feed(0, text("lo"))
    view.feed(0, text(" world"))
    wait = view.tick()
    assert wait is not None and 0 < wait <= 0.05  # within 50 ms of the last repaint: wait
    assert len(front.messages) == sent
    time.sleep(wait)
    assert view.tick() is None
    assert front.outputs[-1]["data"]["text/plain"] == "Hello world"
    assert len(front.messages) == sent + 1  # the two deltas became one update


def test_long_text_is_split_in_segments_so_updates_stay_small(shell: Any) -> None:
    front = shell.front
    front.reset()
    view = DisplayView(["m"], rate=1000, segment_chars=100)
    view.start()
    for _ in range(50):
        view.feed(0, text("x" * 10))
        time.sleep(0.002)
        view.tick()
    view.tick()
    segments = [o for o in front.outputs if "text/markdown" not in o["data"]]
    assert [len(o["data"]["text/plain"]) for o in segments] == [100] * 5
    updates = [b for kind, b in front.messages if kind == "update" and "text/plain" in b["data"]
               and "text/markdown" not in b["data"]]
    assert max(len(b["data"]["text/plain"]) for b in updates) <= 100


@pytest.mark.parametrize("live", ["display", "text"])
def test_bytes_grow_linearly_with_the_answer(shell: Any, fake: Any, live: str, capfd: Any) -> None:
    run(shell, f'%config ChatMagics.live = "{live}"')
    sizes = {}
    for n in (2000, 4000, 8000):
        fake.push(Turn(text="y" * n, chunk=8, delay=0.001))
        started = time.monotonic()
        run(shell, "%%chat --no-history\ngo")
        duration = time.monotonic() - started
        printed = capfd.readouterr().out
        sizes[n] = shell.front.bytes_sent() + len(printed)
        repaints = len([m for m in shell.front.messages if m[0] != "clear"])
        assert repaints <= 20 * duration + 15 + n / 600, (repaints, duration)
    assert sizes[4000] / sizes[2000] < 2.6, sizes
    assert sizes[8000] / sizes[4000] < 2.6, sizes


def test_detect_mode() -> None:
    class Terminal:
        kernel = None

    class Kernel:
        kernel = object()

    assert detect_mode(Terminal(), "auto") == "text"
    assert detect_mode(Kernel(), "auto") == "widget"
    assert detect_mode(Terminal(), "display") == "display"
    with pytest.raises(ValueError, match="live mode"):
        detect_mode(Kernel(), "fancy")
    assert make_view("text", ["a"]).mode == "text"
