"""Loopback fakes of the providers' batch APIs (PROTOCOLS.md §9), on top of a provider fake.

:class:`OpenAIBatches` adds OpenAI's Files and Batches endpoints to an OpenAI fake
(``POST /files`` multipart, ``POST /batches``, ``GET /batches/{id}``, ``POST /batches/{id}/cancel``,
``GET /files/{id}/content``); :class:`AnthropicBatches` adds Anthropic's Message Batches to an
:class:`~tests.fakes.anthropic.AnthropicFake`. Each request of a job is answered by the provider
fake itself — its script (``fake.push(Turn(...))``) or its echo — exactly as a live request with the
same body would be, so a deferred answer can be compared with a live one.

A job follows the documented lifecycle, one step per poll: OpenAI ``validating`` →
``in_progress`` (for ``in_progress_polls`` polls, answering ``per_poll`` requests each) →
``finalizing`` → ``completed``; Anthropic ``in_progress`` → ``ended`` (counts stay 0 until the end,
as the real API's do). Rude options: ``shuffle`` (results out of order), ``expire_after`` (the job
expires after that many answers, the rest ``batch_expired`` / ``expired``), ``stall`` (the job stays
``in_progress`` however often it is polled until set back), and validation: a line whose ``url`` is
not the batch's endpoint, a duplicate ``custom_id`` or a body without ``model`` fails the OpenAI job.
"""

from __future__ import annotations

import datetime as _dt
import itertools
import json
import random
import threading
import time
from dataclasses import dataclass, field
from email.parser import BytesParser
from email.policy import HTTP
from typing import Any

from .provider import ProviderFake
from .server import RecordedRequest, Reply

__all__ = ["AnthropicBatches", "FakeJob", "OpenAIBatches"]


@dataclass
class FakeJob:
    id: str
    lines: list[dict[str, Any]]  # custom_id + body
    headers: dict[str, str]
    created_at: float
    state: str = "validating"
    polls: int = 0
    answered: dict[str, tuple[int, Any]] = field(default_factory=dict)  # custom_id -> (status, body)
    errors: list[dict[str, Any]] = field(default_factory=list)
    cancel_asked: bool = False
    ended_at: float | None = None
    output_file: str | None = None
    error_file: str | None = None


class _Batches:
    """What both batch fakes share: jobs, their lifecycle, answering lines through the fake."""

    def __init__(self, fake: ProviderFake, *, in_progress_polls: int = 1, per_poll: int | None = None,
                 shuffle: bool = False, expire_after: int | None = None) -> None:
        self.fake = fake
        self.in_progress_polls = in_progress_polls
        self.per_poll = per_poll
        self.shuffle = shuffle
        self.expire_after = expire_after
        #: while True, jobs stay in_progress (and answer nothing) however often they are polled
        self.stall = False
        self.jobs: dict[str, FakeJob] = {}
        self.created: list[FakeJob] = []  # in creation order
        self.polls = 0
        self.cancels = 0
        self._ids = itertools.count(1)
        self._lock = threading.RLock()
        self._other = fake.route_other
        fake.route_other = self._route  # type: ignore[method-assign]

    def next_id(self, prefix: str) -> str:
        return f"{prefix}{next(self._ids):05d}"

    # -- answering requests --------------------------------------------------------------------
    def answer(self, job: FakeJob, line: dict[str, Any]) -> tuple[int, Any]:
        """The provider fake's own answer to a live request with this body."""
        request = RecordedRequest(method="POST", path=self.chat_path, query={},
                                  headers=dict(job.headers),
                                  body=json.dumps(line["body"]).encode())
        reply = self.fake._dispatch(request)
        return reply.status, json.loads(reply.body) if reply.body else None

    def advance(self, job: FakeJob) -> None:
        """One poll's worth of the lifecycle."""
        job.polls += 1
        if job.state in ("completed", "failed", "expired", "cancelled"):
            return
        if job.state == "validating":
            job.state = "failed" if job.errors else "in_progress"
            if job.errors:
                job.ended_at = time.time()
            return
        if job.state == "cancelling":
            self.end(job, "cancelled")
            return
        if job.state == "finalizing":
            self.end(job, "completed")
            return
        if self.stall:
            return
        todo = [line for line in job.lines if line["custom_id"] not in job.answered]
        rounds_left = max(1, self.in_progress_polls - (job.polls - 2))
        take = self.per_poll if self.per_poll is not None else -(-len(todo) // rounds_left)
        for line in todo[:take]:
            if self.expire_after is not None and len(job.answered) >= self.expire_after:
                self.end(job, "expired")
                return
            job.answered[line["custom_id"]] = self.answer(job, line)
        if len(job.answered) == len(job.lines):
            self.finish(job)

    def finish(self, job: FakeJob) -> None:
        job.state = "finalizing"

    def end(self, job: FakeJob, state: str) -> None:
        job.state = state
        job.ended_at = time.time()

    def _route(self, request: RecordedRequest) -> Reply:
        with self._lock:
            reply = self.route(request)
        return reply if reply is not None else self._other(request)

    def route(self, request: RecordedRequest) -> Reply | None:
        raise NotImplementedError

    @property
    def chat_path(self) -> str:
        raise NotImplementedError


class OpenAIBatches(_Batches):
    """OpenAI's Files + Batches on an OpenAI fake (Responses or chat.completions)."""

    def __init__(self, fake: Any, **options: Any) -> None:
        super().__init__(fake, **options)
        #: line numbers (1-based) the next job's validation rejects, as a bad line would be
        self.reject_lines: set[int] = set()
        self.files: dict[str, bytes] = {}
        self.file_purposes: dict[str, str] = {}

    @property
    def chat_path(self) -> str:
        return str(self.fake.prefix + self.fake.chat_path)

    @property
    def endpoint(self) -> str:
        return self.chat_path

    def _error(self, status: int, message: str, etype: str = "invalid_request_error") -> Reply:
        return Reply.json({"error": {"message": message, "type": etype, "param": None,
                                     "code": None}}, status)

    def route(self, request: RecordedRequest) -> Reply | None:
        prefix = self.fake.prefix
        path = request.path
        if not path.startswith(prefix + "/files") and not path.startswith(prefix + "/batches"):
            return None
        problem = self.fake.auth_failure(request)
        if problem is not None:
            return self.fake.render_error(problem)
        rest = path[len(prefix):]
        parts = rest.strip("/").split("/")
        if request.method == "POST" and rest == "/files":
            return self.upload(request)
        if request.method == "GET" and len(parts) == 3 and parts[0] == "files" \
                and parts[2] == "content":
            data = self.files.get(parts[1])
            if data is None:
                return self._error(404, f"No such File object: {parts[1]}")
            return Reply(status=200, headers={"content-type": "application/octet-stream"},
                         body=data)
        if request.method == "POST" and rest == "/batches":
            return self.create(request)
        if len(parts) >= 2 and parts[0] == "batches":
            job = self.jobs.get(parts[1])
            if job is None:
                return self._error(404, f"No batch found with id '{parts[1]}'.")
            if request.method == "GET" and len(parts) == 2:
                self.polls += 1
                self.advance(job)
                return Reply.json(self.batch_object(job))
            if request.method == "POST" and len(parts) == 3 and parts[2] == "cancel":
                self.cancels += 1
                if job.state in ("validating", "in_progress", "finalizing"):
                    job.cancel_asked = True
                    job.state = "cancelling"
                return Reply.json(self.batch_object(job))
        return self._error(404, f"Invalid URL ({request.method} {path})")

    def upload(self, request: RecordedRequest) -> Reply:
        content_type = request.header("content-type") or ""
        if not content_type.startswith("multipart/form-data"):
            return self._error(400, "Content-Type must be multipart/form-data")
        message = BytesParser(policy=HTTP).parsebytes(
            b"Content-Type: " + content_type.encode() + b"\r\n\r\n" + request.body)
        fields: dict[str, Any] = {}
        filename = None
        for part in message.iter_parts():
            name = part.get_param("name", header="content-disposition")
            data = part.get_payload(decode=True)
            if name == "file":
                filename = part.get_filename()
            fields[str(name)] = data
        if fields.get("purpose") != b"batch" or "file" not in fields or not filename:
            return self._error(400, "upload a 'file' part (with a filename) and purpose=batch")
        file_id = self.next_id("file-")
        self.files[file_id] = fields["file"]
        self.file_purposes[file_id] = "batch"
        return Reply.json({"id": file_id, "object": "file", "bytes": len(fields["file"]),
                           "created_at": int(time.time()), "expires_at": None,
                           "filename": filename, "purpose": "batch", "status": "processed",
                           "status_details": None})

    def create(self, request: RecordedRequest) -> Reply:
        body = request.json or {}
        file_id = body.get("input_file_id")
        if file_id not in self.files:
            return self._error(400, f"Invalid 'input_file_id': '{file_id}'.")
        if body.get("completion_window") != "24h":
            return self._error(400, "completion_window must be '24h'")
        if body.get("endpoint") != self.endpoint:
            return self._error(400, f"this fake serves endpoint {self.endpoint}, "
                                    f"not {body.get('endpoint')}")
        lines: list[dict[str, Any]] = []
        errors: list[dict[str, Any]] = []
        seen: set[str] = set()
        for number, raw in enumerate(self.files[file_id].splitlines(), 1):
            if not raw.strip():
                continue
            line = json.loads(raw)
            if line.get("url") != body["endpoint"] or line.get("method") != "POST":
                errors.append({"code": "invalid_url", "message": "The URL provided for this "
                               "request does not match the batch endpoint.", "param": "url",
                               "line": number})
            if line.get("custom_id") in seen:
                errors.append({"code": "duplicate_custom_id", "message": "The custom_id for "
                               "this request is a duplicate of another request.",
                               "param": "custom_id", "line": number})
            if not isinstance((line.get("body") or {}).get("model"), str):
                errors.append({"code": "missing_required_parameter", "message": "Missing "
                               "required parameter: 'body.model'.", "param": "body.model",
                               "line": number})
            if number in self.reject_lines:
                errors.append({"code": "invalid_request", "message": "This line is not a valid "
                               "request.", "param": "body", "line": number})
            seen.add(line.get("custom_id"))
            lines.append(line)
        job = FakeJob(self.next_id("batch_"), lines, dict(request.headers), time.time(),
                      errors=errors)
        job.input_file = file_id  # type: ignore[attr-defined]
        self.jobs[job.id] = job
        self.created.append(job)
        return Reply.json(self.batch_object(job))

    def end(self, job: FakeJob, state: str) -> None:
        super().end(job, state)
        if state in ("completed", "expired", "cancelled"):
            self._write_files(job)

    def _write_files(self, job: FakeJob) -> None:
        ok, bad = [], []
        order = list(job.lines)
        if self.shuffle:
            random.Random(len(order)).shuffle(order)
        for line in order:
            cid = line["custom_id"]
            answered = job.answered.get(cid)
            if answered is None:
                code = "batch_expired" if job.state == "expired" else "batch_cancelled"
                bad.append({"id": self.next_id("batch_req_"), "custom_id": cid,
                            "response": None, "error": {"code": code, "message":
                                                        f"This request was not run ({code})."}})
                continue
            status, body = answered
            entry = {"id": self.next_id("batch_req_"), "custom_id": cid,
                     "response": {"status_code": status, "request_id": self.next_id("req_"),
                                  "body": body}, "error": None}
            (ok if status < 400 else bad).append(entry)
        for name, entries in (("output_file", ok), ("error_file", bad)):
            if entries:
                file_id = self.next_id("file-")
                self.files[file_id] = "".join(json.dumps(e) + "\n" for e in entries).encode()
                setattr(job, name, file_id)

    def batch_object(self, job: FakeJob) -> dict[str, Any]:
        completed = sum(1 for s, _b in job.answered.values() if s < 400)
        failed = len(job.answered) - completed
        if job.state in ("expired", "cancelled"):
            failed = len(job.lines) - completed
        when = int(job.created_at)
        ended = int(job.ended_at) if job.ended_at else None
        return {
            "id": job.id, "object": "batch", "endpoint": self.endpoint,
            "model": (job.lines[0].get("body") or {}).get("model") if job.lines else None,
            "errors": {"object": "list", "data": job.errors} if job.errors else None,
            "input_file_id": getattr(job, "input_file", None), "completion_window": "24h",
            "status": job.state, "output_file_id": job.output_file,
            "error_file_id": job.error_file, "created_at": when,
            "in_progress_at": when if job.state != "validating" else None,
            "expires_at": when + 86400,
            "finalizing_at": ended if job.state == "completed" else None,
            "completed_at": ended if job.state == "completed" else None,
            "failed_at": ended if job.state == "failed" else None,
            "expired_at": ended if job.state == "expired" else None,
            "cancelling_at": when if job.cancel_asked else None,
            "cancelled_at": ended if job.state == "cancelled" else None,
            "request_counts": {"total": len(job.lines), "completed": completed,
                               "failed": failed},
            "metadata": {},
        }


def _rfc3339(t: float | None) -> str | None:
    if t is None:
        return None
    return _dt.datetime.fromtimestamp(t, _dt.timezone.utc).isoformat().replace("+00:00", "Z")


class AnthropicBatches(_Batches):
    """Anthropic's Message Batches on an :class:`~tests.fakes.anthropic.AnthropicFake`."""

    @property
    def chat_path(self) -> str:
        return "/v1/messages"

    def route(self, request: RecordedRequest) -> Reply | None:
        base = "/v1/messages/batches"
        if not request.path.startswith(base):
            return None
        problem = self.fake._check_headers(request)  # x-api-key, anthropic-version
        if problem is not None:
            return self.fake.render_error(problem)
        rest = request.path[len(base):].strip("/").split("/") if request.path != base else []
        if request.method == "POST" and not rest:
            return self.create(request)
        job = self.jobs.get(rest[0]) if rest else None
        if job is None:
            return self.fake.render_error(_not_found(rest[0] if rest else ""))
        if request.method == "GET" and len(rest) == 1:
            self.polls += 1
            self.advance(job)
            return Reply.json(self.batch_object(job))
        if request.method == "POST" and rest[1:] == ["cancel"]:
            self.cancels += 1
            if job.state == "in_progress":
                job.cancel_asked = True
                job.state = "cancelling"
            return Reply.json(self.batch_object(job))
        if request.method == "GET" and rest[1:] == ["results"]:
            if job.ended_at is None:
                return self.fake.render_error(_not_found(job.id, "has not ended yet"))
            return Reply(status=200, headers={"content-type": "application/binary"},
                         body=self.results(job))
        return self.fake.render_error(_not_found(request.path))

    def create(self, request: RecordedRequest) -> Reply:
        body = request.json or {}
        requests = body.get("requests")
        if not isinstance(requests, list) or not requests:
            from dispatch_nb.testing import Fail

            return self.fake.render_error(Fail(400, "requests: field required",
                                               "invalid_request_error"))
        lines = [{"custom_id": r.get("custom_id"), "body": r.get("params")} for r in requests]
        job = FakeJob(self.next_id("msgbatch_"), lines, dict(request.headers), time.time(),
                      state="in_progress")
        job.polls = 1  # no validating step: the next poll answers
        self.jobs[job.id] = job
        self.created.append(job)
        return Reply.json(self.batch_object(job))

    def finish(self, job: FakeJob) -> None:
        self.end(job, "completed")

    def advance(self, job: FakeJob) -> None:
        if job.state == "cancelling":
            job.polls += 1
            self.end(job, "cancelled")
            return
        super().advance(job)

    def batch_object(self, job: FakeJob) -> dict[str, Any]:
        ended = job.ended_at is not None
        counts = {"processing": 0 if ended else len(job.lines), "succeeded": 0, "errored": 0,
                  "canceled": 0, "expired": 0}
        if ended:
            for line in job.lines:
                answered = job.answered.get(line["custom_id"])
                if answered is None:
                    counts["expired" if job.state == "expired" else "canceled"] += 1
                elif answered[0] < 400:
                    counts["succeeded"] += 1
                else:
                    counts["errored"] += 1
        status = {"in_progress": "in_progress", "cancelling": "canceling"}.get(job.state, "ended")
        url = self.fake.server.url
        return {
            "id": job.id, "type": "message_batch", "processing_status": status,
            "request_counts": counts, "ended_at": _rfc3339(job.ended_at),
            "created_at": _rfc3339(job.created_at),
            "expires_at": _rfc3339(job.created_at + 86400), "archived_at": None,
            "cancel_initiated_at": _rfc3339(job.created_at) if job.cancel_asked else None,
            "results_url": f"{url}/v1/messages/batches/{job.id}/results" if ended else None,
        }

    def results(self, job: FakeJob) -> bytes:
        order = list(job.lines)
        if self.shuffle:
            random.Random(len(order)).shuffle(order)
        out = []
        for line in order:
            cid = line["custom_id"]
            answered = job.answered.get(cid)
            if answered is None:
                result: dict[str, Any] = {"type": "expired" if job.state == "expired"
                                          else "canceled"}
            elif answered[0] < 400:
                result = {"type": "succeeded", "message": answered[1]}
            else:
                result = {"type": "errored", "error": answered[1]}
            out.append(json.dumps({"custom_id": cid, "result": result}) + "\n")
        return "".join(out).encode()


def _not_found(what: str, why: str = "not found") -> Any:
    from dispatch_nb.testing import Fail

    return Fail(404, f"{what} {why}", "not_found_error")
