"""Provider batch APIs: OpenAI's Batch API (Files + Batches) and Anthropic's Message Batches
(PROTOCOLS.md §9, docs/batch.md "Deferred"); :mod:`dispatch_nb.batching.deferred` decides which
rows go in which job. A job's state uses OpenAI's names for both providers.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import httpx
import orjson

from ..errors import APITimeoutError, DispatchError, RequestCancelled

if TYPE_CHECKING:
    from ..http_adapter import HTTPAdapter

__all__ = ["DONE_STATES", "AnthropicBatchAPI", "BatchAPI", "JobPart", "OpenAIBatchAPI", "RowOutcome",
           "cancelled_error", "expired_error"]

DONE_STATES = frozenset({"completed", "expired", "cancelled", "failed"})

#: seconds one job-control request (upload, create, poll, download) may take
REQUEST_TIMEOUT = 120.0


def _unix(value: Any) -> float | None:
    """A timestamp as Unix seconds: OpenAI sends integers, Anthropic RFC 3339 strings."""
    if value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value)
    try:
        return _dt.datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


@dataclass
class JobPart:
    """One provider job (a batch splits into several when it is over a provider's limits)."""

    id: str
    provider: str
    state: str
    total: int
    #: requests that got an answer / that ended with an error, as the provider counts them
    completed: int = 0
    failed: int = 0
    created_at: float | None = None
    ended_at: float | None = None
    #: why the whole job failed (a validation error), when it did
    message: str | None = None
    #: the provider's references to the results (output / error file ids, results URL)
    refs: dict[str, Any] = field(default_factory=dict)

    @property
    def done(self) -> bool:
        return self.state in DONE_STATES

    def to_json(self) -> dict[str, Any]:
        """The job as a checkpoint records it (``JobPart(**data)`` reads it back)."""
        return dataclasses.asdict(self)


@dataclass
class RowOutcome:
    """One request's result: the endpoint's JSON answer, or the error it ended with."""

    custom_id: str
    body: Any = None
    error: DispatchError | None = None


def cancelled_error(provider: str, note: str = "") -> RequestCancelled:
    """A request its job's cancelling kept from running (code ``not_sent``)."""
    return RequestCancelled(f"not sent: the batch job was cancelled before this request ran{note}",
                            provider=provider, code="not_sent")


def expired_error(provider: str) -> DispatchError:
    return DispatchError("not run: the batch job expired (24 hours) before this request ran",
                         provider=provider, code="batch_expired")


class BatchAPI:
    """What :mod:`dispatch_nb.batching.deferred` needs of a provider's batch API: one object per
    batch run, whose requests go through its adapter (its client, headers and credentials)."""

    #: the most requests one job may hold
    max_requests: int = 50_000
    #: the most bytes of requests one job may hold
    max_bytes: int = 200 * 1024 * 1024
    provider: str = ""
    #: the path of the provider's jobs (``{jobs}/{id}`` one job, ``{jobs}/{id}/cancel``)
    jobs: str = ""

    def __init__(self, adapter: HTTPAdapter) -> None:
        self.adapter = adapter

    # -- HTTP --------------------------------------------------------------------------------------
    async def send(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """One job request (``path``: under the base URL, or a whole URL) with the adapter's
        headers and credentials; an HTTP error becomes the matching :class:`DispatchError`, a
        transport failure an ``APIConnectionError``."""
        response = await self.adapter._asend(method, path, kwargs.pop("headers", None),
                                             timeout=REQUEST_TIMEOUT, follow_redirects=True,
                                             **kwargs)
        if response.status_code >= 400:
            raise self.adapter.redacted(self.adapter.parse_error(
                response.status_code, response.content, response.headers))
        return response

    async def send_json(self, method: str, path: str, **kwargs: Any) -> Any:
        return self.adapter._json((await self.send(method, path, **kwargs)).content)

    # -- what a provider supplies --------------------------------------------------------------
    def line(self, custom_id: str, body: Mapping[str, Any]) -> bytes:
        """One request as the job's input holds it (its size counts against :attr:`max_bytes`)."""
        raise NotImplementedError

    def _part(self, batch: Mapping[str, Any]) -> JobPart:
        """A job as the provider describes it, in the shared vocabulary."""
        raise NotImplementedError

    async def _create(self, lines: list[bytes], headers: Mapping[str, str]) -> Any:
        """Create a job of ``lines`` whose requests carry ``headers`` (the live request's own,
        e.g. ``anthropic-beta``): the provider's description of it."""
        raise NotImplementedError

    async def submit(self, lines: list[bytes], headers: Mapping[str, str]) -> JobPart:
        part = self._part(await self._create(lines, headers))
        part.total = part.total or len(lines)
        return part

    async def poll(self, part: JobPart) -> JobPart:
        return await self._update("GET", part, "")

    async def cancel(self, part: JobPart) -> JobPart:
        return await self._update("POST", part, "/cancel")

    async def _update(self, method: str, part: JobPart, suffix: str) -> JobPart:
        polled = self._part(await self.send_json(method, f"{self.jobs}/{part.id}{suffix}"))
        polled.total = polled.total or part.total
        return polled

    async def results(self, part: JobPart) -> list[RowOutcome]:
        """The results of a finished job (any order; requests that never ran may be missing)."""
        raise NotImplementedError


def _jsonl(data: bytes) -> list[dict[str, Any]]:
    values = (orjson.loads(raw) for raw in data.splitlines() if raw.strip())
    return [value for value in values if isinstance(value, dict)]


class OpenAIBatchAPI(BatchAPI):
    """OpenAI: upload the JSONL (``POST /files``, purpose ``batch``), create the batch
    (``POST /batches``), poll ``GET /batches/{id}``, download the output and error files."""

    provider = "openai"
    jobs = "batches"

    @property
    def endpoint(self) -> str:
        """The batch's ``endpoint``: the wire format's path under the base URL's (``/v1/responses``
        or ``/v1/chat/completions``)."""
        wire = self.adapter.wire
        assert wire is not None
        prefix = httpx.URL(self.adapter.base_url).path.rstrip("/")
        return f"{prefix}/{wire.path.lstrip('/')}"

    def line(self, custom_id: str, body: Mapping[str, Any]) -> bytes:
        return orjson.dumps({"custom_id": custom_id, "method": "POST", "url": self.endpoint,
                             "body": body})

    def _part(self, batch: Mapping[str, Any]) -> JobPart:
        counts = batch.get("request_counts") or {}
        errors = (batch.get("errors") or {}).get("data") or []
        message = "; ".join(
            f"line {e.get('line')}: {e.get('message')}" if e.get("line") is not None
            else str(e.get("message")) for e in errors
        ) or None
        ended = next((batch.get(k) for k in ("completed_at", "failed_at", "expired_at",
                                              "cancelled_at") if batch.get(k)), None)
        return JobPart(
            id=str(batch["id"]), provider=self.provider, state=str(batch.get("status")),
            total=int(counts.get("total") or 0), completed=int(counts.get("completed") or 0),
            failed=int(counts.get("failed") or 0), created_at=_unix(batch.get("created_at")),
            ended_at=_unix(ended), message=message,
            refs={"input_file_id": batch.get("input_file_id"),
                  "output_file_id": batch.get("output_file_id"),
                  "error_file_id": batch.get("error_file_id")},
        )

    async def _create(self, lines: list[bytes], headers: Mapping[str, str]) -> Any:
        # a Responses / chat.completions request sets no header of its own: nothing to carry
        data = b"\n".join(lines) + b"\n"
        uploaded = await self.send_json(
            "POST", "files", data={"purpose": "batch"},
            files={"file": ("dispatch_nb-batch.jsonl", data, "application/jsonl")},
        )
        return await self.send_json(
            "POST", "batches",
            json={"input_file_id": uploaded["id"], "endpoint": self.endpoint,
                  "completion_window": "24h", "metadata": {"created_by": "dispatch_nb"}},
        )

    async def results(self, part: JobPart) -> list[RowOutcome]:
        outcomes: list[RowOutcome] = []
        for ref in ("output_file_id", "error_file_id"):
            file_id = part.refs.get(ref)
            if not file_id:
                continue
            content = (await self.send("GET", f"files/{file_id}/content",
                                       headers={"accept": "*/*"})).content
            outcomes.extend(self._outcome(line) for line in _jsonl(content))
        return outcomes

    def _outcome(self, line: Mapping[str, Any]) -> RowOutcome:
        custom_id = str(line.get("custom_id"))
        response = line.get("response")
        provider = self.adapter.provider_name
        if isinstance(response, Mapping):
            status = int(response.get("status_code") or 0)
            body = response.get("body")
            if 200 <= status < 300:
                return RowOutcome(custom_id, body=body)
            raw = orjson.dumps(body) if body is not None else b""
            return RowOutcome(custom_id, error=self.adapter.redacted(
                self.adapter.parse_error(status, raw, httpx.Headers())))
        error = line.get("error") or {}
        code = str(error.get("code") or "unknown")
        message = str(error.get("message") or code)
        if code == "batch_cancelled":
            return RowOutcome(custom_id, error=cancelled_error(provider, f" ({message})"))
        if code == "request_timeout":
            return RowOutcome(custom_id, error=APITimeoutError(message, provider=provider))
        return RowOutcome(custom_id, error=DispatchError(message, provider=provider, code=code))


_ANTHROPIC_STATES = {"in_progress": "in_progress", "canceling": "cancelling"}


class AnthropicBatchAPI(BatchAPI):
    """Anthropic: ``POST /v1/messages/batches`` with the requests inline, poll
    ``GET /v1/messages/batches/{id}`` until ``processing_status`` is ``ended``, read the results
    JSONL at ``results_url``."""

    provider = "anthropic"
    jobs = "v1/messages/batches"
    max_requests = 100_000
    max_bytes = 256 * 1024 * 1024

    def line(self, custom_id: str, body: Mapping[str, Any]) -> bytes:
        return orjson.dumps({"custom_id": custom_id, "params": body})

    def _part(self, batch: Mapping[str, Any]) -> JobPart:
        counts = batch.get("request_counts") or {}
        total = sum(int(counts.get(k) or 0) for k in ("processing", "succeeded", "errored",
                                                       "canceled", "expired"))
        status = str(batch.get("processing_status"))
        state = _ANTHROPIC_STATES.get(status)
        if state is None:  # ended: say how, in the shared vocabulary
            if batch.get("cancel_initiated_at"):
                state = "cancelled"
            elif int(counts.get("expired") or 0) and not int(counts.get("succeeded") or 0):
                state = "expired"
            else:
                state = "completed"
        return JobPart(
            id=str(batch["id"]), provider=self.provider, state=state, total=total,
            completed=int(counts.get("succeeded") or 0),
            failed=sum(int(counts.get(k) or 0) for k in ("errored", "canceled", "expired")),
            created_at=_unix(batch.get("created_at")), ended_at=_unix(batch.get("ended_at")),
            refs={"results_url": batch.get("results_url")},
        )

    async def _create(self, lines: list[bytes], headers: Mapping[str, str]) -> Any:
        # the job's anthropic-beta header applies to each of its requests (the SDK's betas=)
        body = b'{"requests":[' + b",".join(lines) + b"]}"
        return await self.send_json("POST", self.jobs, content=body,
                                    headers={**headers, "content-type": "application/json"})

    async def results(self, part: JobPart) -> list[RowOutcome]:
        url = part.refs.get("results_url") or f"{self.jobs}/{part.id}/results"
        content = (await self.send("GET", url,
                                   headers={"accept": "application/binary"})).content
        return [self._outcome(line) for line in _jsonl(content)]

    def _outcome(self, line: Mapping[str, Any]) -> RowOutcome:
        custom_id = str(line.get("custom_id"))
        result = line.get("result") or {}
        kind = result.get("type")
        provider = self.adapter.provider_name
        if kind == "succeeded":
            return RowOutcome(custom_id, body=result.get("message"))
        if kind == "errored":
            from ..wire.anthropic import error_status

            error = result.get("error") or {}
            status = error_status((error.get("error") or {}).get("type"))
            return RowOutcome(custom_id, error=self.adapter.redacted(self.adapter.parse_error(
                status, orjson.dumps(error), httpx.Headers())))
        if kind == "canceled":
            return RowOutcome(custom_id, error=cancelled_error(provider))
        if kind == "expired":
            return RowOutcome(custom_id, error=expired_error(provider))
        return RowOutcome(custom_id, error=DispatchError(
            f"unknown batch result type {kind!r}", provider=provider))
