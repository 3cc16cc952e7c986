"""``batch(..., executor=distributed.Client(...))`` on a real LocalCluster of two worker processes:
against loopback servers (results in order, checkpoint across workers, a worker killed mid-batch,
credentials that never travel in the task graph) and against the embedded model."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

distributed = pytest.importorskip("distributed")

import dask  # noqa: E402
from distributed import Client, LocalCluster  # noqa: E402
from distributed.diagnostics.plugin import SchedulerPlugin  # noqa: E402

from dispatch_nb import AuthenticationError, Response, abatch, batch  # noqa: E402
from dispatch_nb.providers.fake import CanonicalAdapter  # noqa: E402
from dispatch_nb.providers.local import local_model_available  # noqa: E402

from ..fakes.batching import BatchFake  # noqa: E402
from ..fakes.openai_chat import OpenAIChatFake  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

REPO = Path(__file__).resolve().parents[2]
WORKER_KEY = "sk-worker-" + "W" * 32
CLIENT_KEY = "sk-client-" + "C" * 32


@pytest.fixture(scope="module")
def fake() -> Iterator[BatchFake]:
    with BatchFake() as server:
        yield server


@pytest.fixture(scope="module")
def openai_fake() -> Iterator[OpenAIChatFake]:
    with OpenAIChatFake(api_key=WORKER_KEY) as server:
        yield server


@pytest.fixture(scope="module")
def client(fake: BatchFake, openai_fake: OpenAIChatFake,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[Client]:
    # The workers' environment holds the credentials and endpoints; the client's never does.
    env = {"DISPATCH_NB_FAKE_URL": fake.base_url,
           "DISPATCH_NB_COMPATIBLE_BASE_URL": openai_fake.base_url,
           "DISPATCH_NB_COMPATIBLE_API_KEY": WORKER_KEY, "PYTHONPATH": str(REPO)}
    # (dask's scratch space in a temporary folder of the test's, not /tmp/dask-scratch-space)
    scratch = str(tmp_path_factory.mktemp("dask"))
    with dask.config.set({"temporary-directory": scratch}), \
            LocalCluster(n_workers=2, processes=True, threads_per_worker=2, env=env,
                         dashboard_address=None) as cluster, Client(cluster) as dask_client:
        yield dask_client


@pytest.fixture(autouse=True)
def fresh(fake: BatchFake) -> None:
    fake.asked, fake.answered = Counter(), Counter()
    fake.events, fake.delay = 4, 0.0
    fake.chat_requests.clear()


def test_rows_run_on_the_workers_and_come_back_in_order(client: Client, fake: BatchFake,
                                                       tmp_path: Path) -> None:
    fake.events, fake.delay = 4, 0.01
    path = tmp_path / "run.jsonl"
    rows = [{"id": i, "text": f"text {i}"} for i in range(60)]
    result = batch("{id}: {text}", rows, model="fake:echo", executor=client, concurrency=4,
                   partition_size=7, checkpoint=path, progress=False)
    assert len(result) == 60 and result.ok == 60
    assert result.texts == [f"echo: {i}: text {i}" for i in range(60)]
    assert result.usage.output_tokens == 60 * 4 and result.sent == 60
    # Only the workers know where the server is: the client could not have built the adapter.
    assert "DISPATCH_NB_FAKE_URL" not in os.environ
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert sorted(e["row"] for e in lines) == list(range(60))  # written by the workers

    # Resumed across workers: more rows, only the new ones are sent.
    more = rows + [{"id": i, "text": f"text {i}"} for i in range(60, 70)]
    again = batch("{id}: {text}", more, model="fake:echo", executor=client, concurrency=4,
                  partition_size=7, checkpoint=path, progress=False)
    assert again.ok == 70 and again.resumed == 60 and again.sent == 10
    assert sum(fake.asked.values()) == 70


class GraphSpy(SchedulerPlugin):
    """Keeps the pickled run_spec of every task the scheduler is given."""

    name = "graph-spy"

    def __init__(self) -> None:
        self.blobs: list[bytes] = []

    def update_graph(self, scheduler: Any, *, keys: Any = (), **kwargs: Any) -> None:
        import cloudpickle

        for key in keys:
            task = scheduler.tasks.get(key)
            if task is not None and task.run_spec is not None:
                self.blobs.append(cloudpickle.dumps(task.run_spec))


def test_credentials_come_from_the_workers_and_never_enter_the_task_graph(
    client: Client, openai_fake: OpenAIChatFake, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DISPATCH_NB_COMPATIBLE_API_KEY", CLIENT_KEY)  # the client's: must not travel
    client.register_plugin(GraphSpy())
    rows = [f"graph check {i}" for i in range(12)]
    result = batch("{row}", rows, model="compatible:gpt-4.1", executor=client, concurrency=3,
                   partition_size=4, progress=False)
    assert result.texts == [f"echo: {r}" for r in rows]
    assert {r.header("authorization") for r in openai_fake.chat_requests} == {
        f"Bearer {WORKER_KEY}"}
    blobs: list[bytes] = client.run_on_scheduler(
        lambda dask_scheduler: dask_scheduler.plugins["graph-spy"].blobs)
    graph = b"".join(blobs)
    assert b"graph check 0" in graph and b"compatible:gpt-4.1" in graph  # we see the real tasks
    assert CLIENT_KEY.encode() not in graph and WORKER_KEY.encode() not in graph
    assert b"sk-" not in graph

    with pytest.raises(TypeError, match="spec string"):
        batch("{row}", rows, model=CanonicalAdapter("echo", base_url="http://127.0.0.1:9"),
              executor=client)


def test_a_worker_killed_mid_batch_loses_and_duplicates_no_row(client: Client, fake: BatchFake,
                                                              tmp_path: Path) -> None:
    fake.events, fake.delay = 10, 0.03  # ~0.3 s a row
    path = tmp_path / "run.jsonl"
    rows = [f"row {i}" for i in range(60)]
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["result"] = batch("{row}", rows, model="fake:echo", executor=client,
                                      concurrency=3, partition_size=6, checkpoint=path,
                                      progress=False)
        except BaseException as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (
        path.exists() and len(path.read_text().splitlines()) >= 12
    ):
        time.sleep(0.02)
    victim = next(iter(client.run(os.getpid).values()))
    os.kill(victim, signal.SIGKILL)
    thread.join(120)
    assert "error" not in outcome, outcome.get("error")
    result = outcome["result"]
    assert len(result) == 60 and result.ok == 60
    assert result.texts == [f"echo: {r}" for r in rows]  # every row once, in order
    assert all(isinstance(item, Response) for item in result)
    # Rows the dead worker finished were not sent again; only its rows in flight were
    # (2 partitions × 3 rows at most).
    resent = sum(fake.answered.values()) - 60
    assert 0 <= resent <= 6, resent
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    keys = [e["key"] for e in lines]  # every line is an answered row
    assert len(keys) == len(set(keys)) == 60
    assert victim not in set(client.run(os.getpid).values())  # it really died


def test_a_rejected_key_stops_every_partition(client: Client, fake: BatchFake) -> None:
    # Every request gets 401. Each partition sends its first rows (concurrency 4), stops at the
    # first 401 and sets the batch's event: partitions started after it send nothing, and the
    # client submits no more. At most 4 partitions run at once (2 workers x 2 threads); rows
    # another partition had in flight when the event was set are cancelled there (cancelled).
    fake.api_key = "a key the workers do not have"
    try:
        result = batch("{row}", [f"row {i}" for i in range(300)], model="fake:echo",
                       executor=client, concurrency=4, partition_size=8, progress=False)
    finally:
        fake.api_key = None
    asked = sum(fake.asked.values())
    assert 4 <= asked <= 4 * 4, f"{asked} requests with a rejected key"
    assert len(result) == 300 and result.ok == 0
    sent = result.failed + result.cancelled  # rows in flight elsewhere were cancelled there
    assert asked <= sent <= 4 * 4 and result.not_sent == 300 - sent
    assert result.failed >= 1
    assert result.stopped_by is not None and isinstance(result.stopped_by[1], AuthenticationError)
    assert result.stopped_by[1].code == "authentication_failed"
    unsent = [i for i in range(300) if result.origin(i) == "not sent"]
    assert len(unsent) == result.not_sent
    assert all(result[i].code == "not_sent" and "the batch stopped at row" in result[i].message
               for i in unsent)
    assert "not sent" in repr(result) and "stopped at row" in repr(result)


@pytest.mark.local
@pytest.mark.skipif(not local_model_available(), reason="the local extra is not installed")
def test_the_embedded_model_runs_on_every_worker(client: Client) -> None:
    questions = ["What is 2 + 2?", "Name a colour.", "Say hello.", "Name a fruit."]
    result = batch("{row} Answer in a few words.", questions, model="local:smollm2",
                   executor=client, concurrency=1, partition_size=1, max_tokens=12,
                   temperature=0, progress=False)
    assert result.ok == 4, result.errors
    assert all(text and text.strip() for text in result.texts)
    assert result.usage.output_tokens > 0


def test_setup_mistakes_fail_the_batch_with_a_clear_error(client: Client, tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="does not understand option"):
        batch("{row}", ["a", "b"], model="fake:echo", executor=client, progress=False, bogus=1)


@pytest.mark.parametrize("run", ["batch", "abatch"])
def test_a_setup_mistake_found_on_a_worker_closes_the_bar(
        client: Client, run: str, capsys: pytest.CaptureFixture[str]) -> None:
    # the worker's TypeError comes after the bar showed the rows in flight: it ends counted
    def go() -> Any:
        kwargs: dict[str, Any] = {"model": "fake:echo", "executor": client, "progress": True,
                                  "bogus": 1}
        if run == "batch":
            return batch("{row}", ["a", "b"], **kwargs)
        return asyncio.run(abatch("{row}", ["a", "b"], **kwargs))

    with pytest.raises(TypeError, match="does not understand option"):
        go()
    last = capsys.readouterr().err.replace("\r", "\n").strip().splitlines()[-1]
    assert "2/2" in last and "in flight 0" in last, last


def test_a_worker_that_cannot_see_the_checkpoint_says_so(fake: BatchFake, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from dispatch_nb.batching.cluster import PartitionTask, run_partition
    from dispatch_nb.batching.engine import BatchSettings, Pending
    from dispatch_nb.batching.rows import RowCall

    monkeypatch.setenv("DISPATCH_NB_FAKE_URL", fake.base_url)
    task = PartitionTask(model="fake:echo", rows=[Pending(0, "a", "k0")], call=RowCall(),
                         settings=BatchSettings(), checkpoint=str(tmp_path / "elsewhere.jsonl"),
                         cache=None, cancel_event=None)
    with pytest.raises(FileNotFoundError, match="not reachable from this Dask worker"):
        run_partition(task)
    assert fake.chat_requests == []
