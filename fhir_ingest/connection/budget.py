"""How much of an EHR chartcite may use: requests in flight and requests per second, per EHR.

Epic asks apps to stay within a small share of its capacity and publishes no 429 contract, so the
limit must hold for the whole deployment, not per process: with Redis configured every web worker,
Celery worker and `chartcite sync` draws on one budget kept there; without it (the embedded
default, one process) the budget lives in the process.

The rate is a sliding window, not a counter per calendar second: a counter lets a whole second's
requests go in the last millisecond of one second and again in the first of the next, twice the
limit in an instant, which is what a rate limit exists to prevent.

Redis keeps, per EHR origin, a sorted set of leases (a request in flight, expiring after a lease
time so a crashed process cannot hold a slot for ever) and a sorted set of the last window's
starts. Taking a slot is one Lua script reading Redis's own clock, so two processes cannot both
take the last slot and workers on different hosts agree on what "the last second" is.
"""
from __future__ import annotations

import threading
import time
import uuid
from collections import deque
from contextlib import contextmanager
from typing import ContextManager, Iterator, Protocol

POLL_SECONDS = 0.02


class RequestBudget(Protocol):
    def slot(self) -> ContextManager[None]: ...


def rate_window(per_second: float) -> tuple[float, int]:
    """(window in seconds, starts allowed in it) for a rate: a second and its whole number of
    requests, or for a rate below one a second a longer window holding one request."""
    if per_second >= 1:
        return 1.0, int(per_second)
    return 1.0 / per_second, 1


class LocalBudget:
    """One process's budget: a semaphore for concurrency and a sliding window for the rate."""

    def __init__(self, concurrency: int, per_second: float = 0.0):
        self.semaphore = threading.BoundedSemaphore(max(1, concurrency))
        self.window, self.allowed = rate_window(per_second) if per_second > 0 else (1.0, 0)
        self.lock = threading.Lock()
        self.starts: deque[float] = deque()

    def _take_rate(self) -> float:
        """0 when this request may go now, else how long to wait."""
        if not self.allowed:
            return 0.0
        with self.lock:
            now = time.monotonic()
            while self.starts and self.starts[0] <= now - self.window:
                self.starts.popleft()
            if len(self.starts) < self.allowed:
                self.starts.append(now)
                return 0.0
            return self.starts[0] + self.window - now

    @contextmanager
    def slot(self) -> Iterator[None]:
        with self.semaphore:
            while (wait := self._take_rate()) > 0:
                time.sleep(wait)
            yield


# KEYS[1] leases (sorted set: lease -> expiry), KEYS[2] the window's starts (lease -> start time).
# ARGV: lease id, lease seconds, concurrency, window seconds, starts allowed in it (0 = no limit).
# Returns {1, 0} when the slot is taken, {0, 0} when the deployment is at its concurrency, and
# {-1, microseconds} at its rate: how long until the window's oldest start leaves it.
_TAKE = """
local clock = redis.call('TIME')
local now = tonumber(clock[1]) + tonumber(clock[2]) / 1000000
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[3]) then return {0, 0} end
local window, allowed = tonumber(ARGV[4]), tonumber(ARGV[5])
if allowed > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now - window)
  if redis.call('ZCARD', KEYS[2]) >= allowed then
    local oldest = tonumber(redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')[2])
    return {-1, math.ceil((oldest + window - now) * 1000000)}
  end
  redis.call('ZADD', KEYS[2], now, ARGV[1])
  redis.call('PEXPIRE', KEYS[2], math.ceil(window * 1000) + 1000)
end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
return {1, 0}
"""


class RedisBudget:
    """The deployment's budget for one EHR origin, kept in Redis."""

    def __init__(self, redis_url: str, origin: str, concurrency: int, per_second: float = 0.0,
                 lease_seconds: float = 120.0):
        import redis

        self.redis = redis.Redis.from_url(redis_url)
        self.take = self.redis.register_script(_TAKE)
        self.leases = f"chartcite:ehr-budget:{origin}:leases"
        self.starts = f"chartcite:ehr-budget:{origin}:starts"
        self.concurrency, self.lease_seconds = max(1, concurrency), lease_seconds
        self.window, self.allowed = rate_window(per_second) if per_second > 0 else (1.0, 0)

    @contextmanager
    def slot(self) -> Iterator[None]:
        lease = uuid.uuid4().hex
        while True:
            taken, wait_us = self.take(keys=[self.leases, self.starts],
                                       args=[lease, self.lease_seconds, self.concurrency, self.window, self.allowed])
            if taken == 1:
                break
            time.sleep(max(POLL_SECONDS, wait_us / 1e6))
        try:
            yield
        finally:
            self.redis.zrem(self.leases, lease)


_local: dict[tuple[str, int, float], LocalBudget] = {}
_local_lock = threading.Lock()


def budget_for(origin: str, concurrency: int, per_second: float = 0.0, redis_url: str = "") -> RequestBudget:
    """The deployment-wide budget when Redis is configured, else this process's (one per origin,
    shared by every client of that EHR in the process)."""
    if redis_url:
        return RedisBudget(redis_url, origin, concurrency, per_second)
    with _local_lock:
        key = (origin, concurrency, per_second)
        if key not in _local:
            _local[key] = LocalBudget(concurrency, per_second)
        return _local[key]
