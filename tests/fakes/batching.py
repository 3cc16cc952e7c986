"""A loopback server for batch tests: the canonical protocol, answering by what each row asks.

The scripted fakes answer in request order, which concurrency scrambles; a batch test needs the
answer to depend on the row instead. :class:`BatchFake` echoes each prompt and can behave like a
busy provider:

* ``capacity=K``: at most K streams at once (a stream occupies the server for its whole length);
  a request beyond that gets HTTP 429 — with ``retry-after: <retry_after>`` when that is set;
* ``drop_first={prompt, ...}`` (or ``drop_every_first=True``): the first attempt at those
  prompts drops the connection half way through the stream;
* ``fail={prompt: Fail(...)}``: those prompts always fail;
* ``stall={prompt: seconds}``: those prompts get their headers, then nothing for that long;
* ``events`` / ``delay``: the answer is that many text deltas, ``delay`` seconds apart
  (``fast={prompt, ...}``: those prompts are answered without delay).

A request that does not ask for a stream (a batch's default) gets the same answer as one JSON body,
after as long as the stream would have taken; a dropped one gets half the body after half that
time, then the connection is reset; a stalled one gets nothing for that long.

It counts what it was asked (``asked[prompt]``), the 429s it sent, and the most streams it served
at once.
"""

from __future__ import annotations

import collections
import threading
import time

from .canonical import CanonicalFake
from .provider import Fail, Turn
from .server import RecordedRequest, Reply

__all__ = ["BatchFake"]


class _Pieces(Turn):
    """A turn streamed as exactly ``events`` text deltas (short answers get empty ones)."""

    events: int = 4

    def text_pieces(self) -> list[str]:
        n = max(1, self.events)
        bounds = [len(self.text) * i // n for i in range(n + 1)]
        return [self.text[bounds[i]:bounds[i + 1]] for i in range(n)]


class BatchFake(CanonicalFake):
    """See the module docstring."""

    def __init__(
        self,
        *,
        capacity: int | None = None,
        retry_after: float | None = None,
        drop_first: set[str] | None = None,
        drop_every_first: bool = False,
        fail: dict[str, Fail] | None = None,
        stall: dict[str, float] | None = None,
        fast: set[str] | None = None,
        events: int = 4,
        delay: float = 0.0,
        api_key: str | None = None,
    ) -> None:
        super().__init__()
        self.capacity = capacity
        self.retry_after = retry_after
        self.drop_first = set(drop_first or ())
        self.drop_every_first = drop_every_first
        self.fail = dict(fail or {})
        self.stall = dict(stall or {})
        self.fast = set(fast or ())
        self.events = events
        self.delay = delay
        self.api_key = api_key
        #: how many times each prompt was asked (429s included)
        self.asked: collections.Counter[str] = collections.Counter()
        #: how many times each prompt was answered in full (not 429, not dropped, not failed)
        self.answered: collections.Counter[str] = collections.Counter()
        self.rate_limited = 0
        self.max_active = 0
        self.auth_seen: set[str] = set()
        self._busy_until: list[float] = []
        self._state = threading.Lock()

    def _dispatch(self, request: RecordedRequest) -> Reply:
        if not self.is_chat(request):
            return super()._dispatch(request)
        text = self.last_user_text(request)
        auth = request.header("authorization")
        with self._state:
            self.chat_requests.append(request)
            if auth:
                self.auth_seen.add(auth)
            self.asked[text] += 1
            attempt = self.asked[text]
            if self.api_key is not None and auth != f"Bearer {self.api_key}":
                return self.render_error(Fail(401, "bad key", "authentication_error"))
            if text in self.fail:
                return self.render_error(self.fail[text])
            now = time.monotonic()
            delay = 0.0 if text in self.fast else self.delay
            duration = delay * max(self.events - 1, 0) + 0.005
            self._busy_until = [t for t in self._busy_until if t > now]
            if self.capacity is not None and len(self._busy_until) >= self.capacity:
                self.rate_limited += 1
                headers = {} if self.retry_after is None else {"retry-after": f"{self.retry_after:g}"}
                return self.render_error(Fail(429, "Rate limit reached; slow down",
                                              "rate_limit_error", headers=headers))
            self._busy_until.append(now + duration)
            self.max_active = max(self.max_active, len(self._busy_until))
            dropping = attempt == 1 and (self.drop_every_first or text in self.drop_first)
            if not dropping:
                self.answered[text] += 1
        answer = f"echo: {text}"
        turn = _Pieces(text=answer, delay=delay,
                    input_tokens=len(text.split()), output_tokens=self.events,
                    reset_after=max(1, self.events // 2) if dropping else None,
                    stall_after=1 if text in self.stall else None, stall=self.stall.get(text, 0.0))
        turn.events = self.events
        reply = self.render(turn, request)
        if not self.wants_stream(request):  # one JSON body, as late as the stream would end
            reply.stall = self.stall.get(text, duration / 2 if dropping else duration)
            if dropping:
                reply.chunks = [reply.body[: len(reply.body) // 2], reply.body[len(reply.body) // 2:]]
                reply.reset_after = 1
        return reply
