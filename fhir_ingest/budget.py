"""How much of an EHR chartcite may use: requests in flight and requests per second, per EHR.

Epic asks apps to stay within a small share of its capacity and publishes no 429 contract, so the
limit must hold for the whole deployment, not per process: with Redis configured every web worker,
Celery worker and `chartcite sync` draws on one budget kept there; without it (the embedded
default, one process) the budget lives in the process.

Redis keeps, per EHR origin, a sorted set of leases (a request in flight, expiring after a lease
time so a crashed process cannot hold a slot for ever) and a counter per one-second window.
Taking a slot is one Lua script, so two processes cannot both take the last one.
"""
from __future__ import annotations

import threading
import time
import uuid
from contextlib import contextmanager
from typing import ContextManager, Iterator, Protocol

POLL_SECONDS = 0.02


class RequestBudget(Protocol):
    def slot(self) -> ContextManager[None]: ...


class LocalBudget:
    """One process's budget: a semaphore for concurrency and a one-second window for the rate."""

    def __init__(self, concurrency: int, per_second: float = 0.0):
        self.semaphore = threading.BoundedSemaphore(max(1, concurrency))
        self.per_second = per_second
        self.lock = threading.Lock()
        self.window, self.used = 0, 0

    def _take_rate(self) -> float:
        """0 when this request may go now, else how long to wait."""
        if self.per_second <= 0:
            return 0.0
        with self.lock:
            now = time.time()
            if int(now) != self.window:
                self.window, self.used = int(now), 0
            if self.used < self.per_second:
                self.used += 1
                return 0.0
            return self.window + 1 - now

    @contextmanager
    def slot(self) -> Iterator[None]:
        with self.semaphore:
            while (wait := self._take_rate()) > 0:
                time.sleep(wait)
            yield


# KEYS[1] leases (sorted set: member -> expiry), KEYS[2] the current second's counter.
# ARGV: now, lease id, lease expiry, concurrency, per-second limit (0 = none).
# Returns 1 when the slot is taken, 0 when the deployment is at its concurrency, -1 at its rate.
_TAKE = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[4]) then return 0 end
if tonumber(ARGV[5]) > 0 then
  local used = tonumber(redis.call('GET', KEYS[2]) or '0')
  if used >= tonumber(ARGV[5]) then return -1 end
  redis.call('INCR', KEYS[2])
  redis.call('EXPIRE', KEYS[2], 2)
end
redis.call('ZADD', KEYS[1], ARGV[3], ARGV[2])
return 1
"""


class RedisBudget:
    """The deployment's budget for one EHR origin, kept in Redis."""

    def __init__(self, redis_url: str, origin: str, concurrency: int, per_second: float = 0.0,
                 lease_seconds: float = 120.0):
        import redis

        self.redis = redis.Redis.from_url(redis_url)
        self.take = self.redis.register_script(_TAKE)
        self.leases = f"chartcite:ehr-budget:{origin}:leases"
        self.rate_prefix = f"chartcite:ehr-budget:{origin}:second:"
        self.concurrency, self.per_second, self.lease_seconds = max(1, concurrency), per_second, lease_seconds

    @contextmanager
    def slot(self) -> Iterator[None]:
        lease = uuid.uuid4().hex
        while True:
            now = time.time()
            taken = self.take(keys=[self.leases, f"{self.rate_prefix}{int(now)}"],
                              args=[now, lease, now + self.lease_seconds, self.concurrency, self.per_second])
            if taken == 1:
                break
            time.sleep(POLL_SECONDS if taken == 0 else max(POLL_SECONDS, int(now) + 1 - now))
        try:
            yield
        finally:
            self.redis.zrem(self.leases, lease)

    def in_flight(self) -> int:
        self.redis.zremrangebyscore(self.leases, "-inf", time.time())
        return self.redis.zcard(self.leases)


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
