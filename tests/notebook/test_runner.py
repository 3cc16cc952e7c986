"""The worker-thread runner behind %%chat: a failing display must stop the workers."""

from __future__ import annotations

import threading
import time

import pytest

from dispatch_nb.cancel import CancelToken
from dispatch_nb.notebook.runner import Job, run_jobs


def test_a_display_failure_cancels_every_worker() -> None:
    stopped = threading.Event()

    def work(emit, cancel: CancelToken) -> str:  # type: ignore[no-untyped-def]
        for i in range(10_000):
            if cancel.cancelled:
                stopped.set()
                cancel.raise_if_cancelled()
            emit(i)
            time.sleep(0.005)
        return "finished"  # pragma: no cover - would mean the worker was never stopped

    jobs = [Job("a", work), Job("b", work)]

    def on_event(index: int, event: object) -> None:
        raise ValueError("the widget could not render")

    with pytest.raises(ValueError, match="could not render"):
        run_jobs(jobs, on_event)
    assert stopped.wait(2)
    assert all(job.cancel.cancelled for job in jobs)
    assert "cell failed" in (jobs[0].cancel.reason or "")


def test_results_come_back_in_job_order() -> None:
    jobs = [Job(name, lambda emit, cancel, name=name: (emit(name), name.upper())[1])
            for name in ("x", "y", "z")]
    seen: list[tuple[int, object]] = []
    outcomes = run_jobs(jobs, lambda i, e: seen.append((i, e)))
    assert [o.result for o in outcomes] == ["X", "Y", "Z"]
    assert sorted(seen) == [(0, "x"), (1, "y"), (2, "z")]
