"""Rate limits per key: requests and tokens per minute, answered as OpenAI answers them.

Each key has two token buckets, one of requests and one of tokens: a bucket holds at most the
per-minute limit, starts full and refills continuously at limit/60 a second, so a key may burst
its whole minute at once and then goes on at the steady rate (no window edge at which twice the
limit gets through, as with fixed windows). A request takes one request at admission
(`admit_request`, before its body is read). Its tokens are reserved once they are known, after
tokenizing: every prompt's tokens plus `max_tokens` for each of its `n` choices, the most it may
use (`reserve`). When the prediction ends its actual usage replaces the reservation: what it did
not use goes back to the bucket (`Reservation.settle`).

Past a limit the answer is 429 with `Retry-After` (whole seconds until the bucket holds enough)
and OpenAI's `x-ratelimit-*` headers, which successful answers carry too (`RateLimitHeaders`).
A request that needs more tokens than the key's whole minute can never run: 429 without
`Retry-After`, saying so (OpenAI's "Request too large").

The buckets live in this api worker. With API_WORKERS > 1 each worker enforces its share of
every limit (ceil(limit / workers), as MAX_CONCURRENT_REQUESTS; processes.py), and the headers
state that share: a client whose connections all land on one worker gets the share, one spread
over the workers up to the whole limit (docs/deployment.md).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tritonbox_api import metrics
from tritonbox_api.keys import ApiKey
from tritonbox_api.protocol.errors import ApiError

STATE = "rate_limit"  # the request's `Metered`, in the ASGI scope's state, for the headers
Clock = Callable[[], float]


class Bucket:
    """At most `limit`, refilled at `limit` a minute; may go below 0 when actual usage exceeds
    a reservation, which later requests then wait for."""

    def __init__(self, limit: int, clock: Clock) -> None:
        self.limit = limit
        self._rate = limit / 60.0  # per second
        self._clock = clock
        self._level = float(limit)
        self._at = clock()

    def _refill(self) -> None:
        now = self._clock()
        self._level = min(self.limit, self._level + (now - self._at) * self._rate)
        self._at = now

    def take(self, amount: int) -> float:
        """Take `amount` and return 0, or take nothing and return the seconds until it fits."""
        self._refill()
        if self._level >= amount:
            self._level -= amount
            return 0.0
        return (amount - self._level) / self._rate

    def give(self, amount: int) -> None:
        """`amount` back (negative: more taken), never past the limit."""
        self._refill()
        self._level = min(self.limit, self._level + amount)

    @property
    def remaining(self) -> int:
        self._refill()
        return max(0, math.floor(self._level))

    @property
    def reset_s(self) -> float:
        """Seconds until the bucket is full again: OpenAI's `x-ratelimit-reset-*`."""
        self._refill()
        return (self.limit - self._level) / self._rate


def duration(seconds: float) -> str:
    """OpenAI's form of a reset time: `20ms`, `1s`, `1.5s`, `6m0s`."""
    if seconds < 1:
        return f"{math.ceil(seconds * 1000)}ms"
    if seconds < 60:
        return f"{round(seconds, 3):g}s"
    minutes, rest = divmod(seconds, 60)
    return f"{int(minutes)}m{round(rest, 3):g}s"


@dataclass
class KeyBuckets:
    requests: Bucket | None  # None: no limit of that kind
    tokens: Bucket | None

    def headers(self) -> dict[str, str]:
        headers: dict[str, str] = {}
        for kind, bucket in (("requests", self.requests), ("tokens", self.tokens)):
            if bucket is not None:
                headers[f"x-ratelimit-limit-{kind}"] = str(bucket.limit)
                headers[f"x-ratelimit-remaining-{kind}"] = str(bucket.remaining)
                headers[f"x-ratelimit-reset-{kind}"] = duration(bucket.reset_s)
        return headers


class Reservation:
    """Tokens taken for one request; `settle` with what it used, once."""

    def __init__(self, bucket: Bucket | None, reserved: int) -> None:
        self._bucket = bucket
        self._reserved = reserved
        self._settled = False

    def settle(self, used: int) -> None:
        if self._settled or self._bucket is None:
            return
        self._settled = True
        self._bucket.give(self._reserved - used)


class RateLimiter:
    """Every key's buckets, made on its first request from the key's limits or the defaults
    (RATE_LIMIT_RPM, RATE_LIMIT_TPM), each divided among `workers`."""

    def __init__(
        self, *, rpm: int = 0, tpm: int = 0, workers: int = 1, clock: Clock = time.monotonic
    ) -> None:
        self._defaults = (rpm, tpm)
        self._workers = workers
        self._clock = clock
        self._keys: dict[str, KeyBuckets] = {}

    def _bucket(self, limit: int) -> Bucket | None:
        return Bucket(math.ceil(limit / self._workers), self._clock) if limit > 0 else None

    def buckets(self, key: ApiKey) -> KeyBuckets:
        found = self._keys.get(key.name)
        if found is None:
            rpm = key.rpm if key.rpm is not None else self._defaults[0]
            tpm = key.tpm if key.tpm is not None else self._defaults[1]
            found = self._keys[key.name] = KeyBuckets(self._bucket(rpm), self._bucket(tpm))
        return found

    def admit_request(self, key: ApiKey) -> None:
        """Take one request from the key's bucket; 429 when it is empty."""
        buckets = self.buckets(key)
        if buckets.requests is None:
            return
        wait_s = buckets.requests.take(1)
        if wait_s:
            raise _limited(key, buckets, "requests", buckets.requests.limit, wait_s)

    def reserve(self, key: ApiKey, tokens: int) -> Reservation:
        """Take `tokens` (the most a request may use) from the key's bucket; 429 if they do not
        fit now, or never will."""
        buckets = self.buckets(key)
        bucket = buckets.tokens
        if bucket is None:
            return Reservation(None, 0)
        if tokens > bucket.limit:
            refusal = _limited(key, buckets, "tokens", bucket.limit, 0.0)
            refusal.message = (
                f"request too large for key {key.name}: it may use {tokens} tokens (its "
                f"prompts, plus max_tokens for each of its n choices), more than the key's "
                f"limit of {bucket.limit} tokens per minute; lower max_tokens or n"
            )
            raise refusal
        wait_s = bucket.take(tokens)
        if wait_s:
            raise _limited(key, buckets, "tokens", bucket.limit, wait_s, asked=tokens)
        return Reservation(bucket, tokens)


def _limited(
    key: ApiKey, buckets: KeyBuckets, kind: str, limit: int, wait_s: float, asked: int = 1
) -> ApiError:
    """429 naming the key, the limit and when to retry (no `Retry-After` when never)."""
    metrics.REJECTED.labels(f"rate_limit_{kind}").inc()
    headers = buckets.headers()
    message = f"rate limit reached for key {key.name}: {limit} {kind} per minute"
    if kind == "tokens":
        message += f" (this request reserves {asked}: its prompts plus max_tokens x n)"
    if wait_s:
        headers["Retry-After"] = str(max(1, math.ceil(wait_s)))
        message += f"; retry in {headers['Retry-After']}s"
    return ApiError(429, message, type="rate_limit_error", headers=headers)


@dataclass
class Metered:
    """A request under a key's limits: its buckets, for the headers of its answer."""

    limiter: RateLimiter
    key: ApiKey

    def reserve(self, tokens: int) -> Callable[[int], None]:
        """`RateLimiter.reserve` for this key; the function to settle it with the usage."""
        return self.limiter.reserve(self.key, tokens).settle


class RateLimitHeadersMiddleware:
    """Adds the `x-ratelimit-*` headers to every answer of a metered request, as OpenAI does,
    computed when the answer starts (after its tokens were reserved)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        # The dict the route's `request.state` writes to, made here if the server made none,
        # so that a copy of the scope further in still shares it.
        state = scope.setdefault("state", {})

        async def with_headers(message: Message) -> None:
            metered = state.get(STATE)
            if message["type"] == "http.response.start" and isinstance(metered, Metered):
                headers = MutableHeaders(scope=message)
                for name, value in metered.limiter.buckets(metered.key).headers().items():
                    if name not in headers:
                        headers[name] = value
            await send(message)

        await self.app(scope, receive, with_headers)
