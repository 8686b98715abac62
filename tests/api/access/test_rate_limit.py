"""Rate limits per key (rate_limit.py), on a clock the test moves: the buckets' refill, the
token reservation and its settlement, the 429s and their headers, the per-worker share, and
the limits written in a key's entry (the live api's answers: test_rate_limit_server.py)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from tritonbox_api.keys import ApiKey, Role, digest
from tritonbox_api.protocol.errors import ApiError
from tritonbox_api.rate_limit import Bucket, RateLimiter, duration
from tritonbox_api.settings import ApiSettings

SETTINGS: Any = ApiSettings


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _key(name: str = "ci", rpm: int | None = None, tpm: int | None = None) -> ApiKey:
    return ApiKey(name, frozenset({Role.USE}), digest(name), rpm, tpm)


def test_a_bucket_starts_full_and_refills_its_limit_a_minute() -> None:
    clock = Clock()
    bucket = Bucket(60, clock)
    assert bucket.remaining == 60 and bucket.reset_s == 0
    assert bucket.take(60) == 0 and bucket.remaining == 0
    assert bucket.take(1) == pytest.approx(1.0)  # one a second; nothing taken
    clock.now += 30
    assert bucket.remaining == 30 and bucket.reset_s == pytest.approx(30)
    clock.now += 300
    assert bucket.remaining == 60  # never past the limit


def test_requests_per_minute_then_429_with_retry_after_and_openai_headers() -> None:
    clock = Clock()
    limiter = RateLimiter(rpm=2, clock=clock)
    key = _key()
    limiter.admit_request(key)
    limiter.admit_request(key)
    with pytest.raises(ApiError) as refused:
        limiter.admit_request(key)
    error = refused.value
    assert error.status_code == 429 and error.type == "rate_limit_error"
    assert "key ci: 2 requests per minute" in error.message
    assert error.headers["Retry-After"] == "30"  # 2 a minute: one more in 30 s
    assert error.headers["x-ratelimit-limit-requests"] == "2"
    assert error.headers["x-ratelimit-remaining-requests"] == "0"
    assert error.headers["x-ratelimit-reset-requests"] == "1m0s"
    assert "x-ratelimit-limit-tokens" not in error.headers  # no token limit: no such headers
    limiter.admit_request(_key("other"))  # each key its own bucket
    clock.now += 30
    limiter.admit_request(key)


def test_tokens_are_reserved_then_settled_with_the_usage() -> None:
    clock = Clock()
    limiter = RateLimiter(tpm=1000, clock=clock)
    key = _key()
    settle = limiter.reserve(key, 600).settle
    with pytest.raises(ApiError) as refused:
        limiter.reserve(key, 600)  # 400 left: the second does not fit yet
    assert refused.value.status_code == 429
    assert refused.value.headers["x-ratelimit-remaining-tokens"] == "400"
    assert refused.value.headers["Retry-After"] == "12"  # 200 more at 1000 a minute
    settle(100)  # it used 100 of its 600: 500 go back
    settle(0)  # once only
    assert limiter.buckets(key).headers()["x-ratelimit-remaining-tokens"] == "900"
    limiter.reserve(key, 600)


def test_a_request_larger_than_the_whole_minute_says_so_without_retry_after() -> None:
    limiter = RateLimiter(tpm=1000, clock=Clock())
    with pytest.raises(ApiError) as refused:
        limiter.reserve(_key(), 1001)
    assert refused.value.status_code == 429
    assert "request too large for key ci: it may use 1001 tokens" in refused.value.message
    assert "Retry-After" not in refused.value.headers


def test_a_keys_own_limits_beat_the_defaults_and_0_is_none() -> None:
    limiter = RateLimiter(rpm=1, tpm=10, clock=Clock())
    free = _key("free", rpm=0, tpm=0)
    for _ in range(5):
        limiter.admit_request(free)
    limiter.reserve(free, 10**6)
    assert limiter.buckets(free).headers() == {}
    own = limiter.buckets(_key("own", rpm=5, tpm=500)).headers()
    assert own["x-ratelimit-limit-requests"] == "5" and own["x-ratelimit-limit-tokens"] == "500"


def test_each_worker_enforces_its_share_rounded_up() -> None:
    limiter = RateLimiter(rpm=10, tpm=1000, workers=3, clock=Clock())
    headers = limiter.buckets(_key()).headers()
    assert headers["x-ratelimit-limit-requests"] == "4"
    assert headers["x-ratelimit-limit-tokens"] == "334"


@pytest.mark.parametrize(
    ("seconds", "shown"), [(0.02, "20ms"), (1, "1s"), (1.5, "1.5s"), (360, "6m0s"), (90, "1m30s")]
)
def test_reset_times_read_as_openai_writes_them(seconds: float, shown: str) -> None:
    assert duration(seconds) == shown


def test_limits_in_key_entries() -> None:
    entries = "a:use:x:y:rpm=60:tpm=20000, b:use:sha256:" + "0" * 64 + ":tpm=5, c:manage:z"
    keys = SETTINGS(_env_file=None, api_keys=entries).keys()
    found = {k.name: (k.rpm, k.tpm) for k in keys}
    assert found == {"a": (60, 20000), "b": (None, 5), "c": (None, None)}
    secret = SETTINGS(_env_file=None, api_keys="a:use:x:y:rpm=60").keys()[0].digest
    assert secret == digest("x:y")  # the limit is not part of the secret; a `:` in it is


@pytest.mark.parametrize("entry", ["a:use:s3cret:rpm=ten", "a:use:s3cret:rpm=1:rpm=2"])
def test_a_malformed_limit_stops_the_start_without_showing_the_secret(entry: str) -> None:
    with pytest.raises(ValidationError) as refused:
        SETTINGS(_env_file=None, api_keys=entry)
    assert "key a has a malformed rpm" in str(refused.value)
    assert "s3cret" not in str(refused.value)
