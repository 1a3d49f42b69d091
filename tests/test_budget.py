"""The EHR request budget holds for the whole deployment: separate processes, each with its own
FHIR client, together keep within the concurrency and per-second limits when Redis holds the
budget (and, without Redis, each process only keeps its own)."""
from __future__ import annotations

import bisect
import multiprocessing
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import pytest

from fhir_ingest.connection.budget import LocalBudget

from .conftest import redis_url
from .stub_http import QuietHandler, serve


class CountingEhr(QuietHandler):
    """Answers every GET after 60 ms, noting how many requests were in flight and when each began."""
    lock = threading.Lock()
    in_flight = 0
    peak = 0
    starts: list[float] = []

    def do_GET(self):
        cls = type(self)
        with cls.lock:
            cls.in_flight += 1
            cls.peak = max(cls.peak, cls.in_flight)
            cls.starts.append(time.time())
        time.sleep(0.06)
        with cls.lock:
            cls.in_flight -= 1
        self.send_json({"resourceType": "Patient", "id": "x"}, "application/fhir+json")


def client_process(base: str, redis: str, requests_each: int, concurrency: int, per_second: float, out) -> None:
    """One chartcite process (a web worker or a Celery worker): three threads reading the EHR."""
    from fhir_ingest.connection.budget import budget_for
    from fhir_ingest.connection.client import FhirClient

    budget = budget_for(base.split("//")[1].rstrip("/"), concurrency, per_second, redis)
    client = FhirClient(base, budget=budget)
    with ThreadPoolExecutor(3) as pool:
        statuses = list(pool.map(lambda _: client.request("GET", "Patient/x").status_code, range(requests_each)))
    out.put(statuses)


@pytest.fixture()
def ehr():
    CountingEhr.in_flight, CountingEhr.peak, CountingEhr.starts = 0, 0, []
    server = serve(CountingEhr)
    yield f"http://127.0.0.1:{server.server_port}/fhir/"
    server.shutdown()


def run_processes(base: str, redis: str, concurrency: int, per_second: float, processes: int = 3,
                  requests_each: int = 12) -> list[int]:
    context = multiprocessing.get_context("spawn")
    out = context.Queue()
    workers = [context.Process(target=client_process, args=(base, redis, requests_each, concurrency, per_second, out))
               for _ in range(processes)]
    for worker in workers:
        worker.start()
    statuses = [s for _ in workers for s in out.get(timeout=120)]
    for worker in workers:
        worker.join(30)
    return statuses


# How close together two starts may be seen and still count as a second apart: requests leave the
# client when their slot is taken and reach the server a few milliseconds later, not all equally late.
SPAN = 0.95


def most_starts_within(starts: list[float], span: float) -> int:
    """The most starts any interval of `span` seconds holds."""
    ordered = sorted(starts)
    return max(bisect.bisect_left(ordered, t + span) - i for i, t in enumerate(ordered))


def test_processes_share_one_budget_through_redis(ehr):
    # A fresh origin name per run: the budget's keys in Redis are per EHR origin.
    base = ehr.replace("/fhir/", f"/fhir-{uuid.uuid4().hex[:6]}/")
    with starts_granted(base) as granted:
        statuses = run_processes(base, redis_url(), concurrency=2, per_second=12)
    assert statuses == [200] * 36
    assert CountingEhr.peak <= 2
    # The rate is judged on the instants Redis itself granted (its own clock, in the budget's
    # window), not on arrivals at the server, which a loaded machine delays unevenly.
    assert len(granted) >= 24, len(granted)
    assert most_starts_within(sorted(granted.values()), 1.0) <= 12


@contextmanager
def starts_granted(base: str):
    """Every start the Redis budget records for this origin, read while the processes run (a
    start stays in the budget's window for a second, and is read every 50 ms)."""
    import redis

    client = redis.Redis.from_url(redis_url())
    key = f"chartcite:ehr-budget:{base.split('//')[1].rstrip('/')}:starts"
    seen: dict[bytes, float] = {}
    done = threading.Event()

    def watch():
        while not done.is_set():
            seen.update(client.zrange(key, 0, -1, withscores=True))
            time.sleep(0.05)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        yield seen
    finally:
        done.set()
        watcher.join(10)
        seen.update(client.zrange(key, 0, -1, withscores=True))


def test_a_process_budget_spreads_its_rate_over_any_second():
    """No burst at a window's edge: a counter per calendar second would let a second's requests go
    at its end and the next second's at once after, twice the rate within a few milliseconds."""
    budget = LocalBudget(concurrency=12, per_second=6)
    starts: list[float] = []

    def request(_):
        with budget.slot():
            starts.append(time.monotonic())

    with ThreadPoolExecutor(12) as pool:
        list(pool.map(request, range(18)))
    assert most_starts_within(starts, SPAN) <= 6
    assert max(starts) - min(starts) >= 2.0      # 18 starts at 6 a second: three windows


def test_a_rate_below_one_a_second_waits_its_whole_interval():
    slow = LocalBudget(concurrency=2, per_second=0.5)
    assert slow._take_rate() == 0.0
    assert slow._take_rate() > 1.9              # one request per two seconds


def test_without_redis_each_process_keeps_only_its_own_budget(ehr):
    statuses = run_processes(ehr, "", concurrency=2, per_second=0)
    assert statuses == [200] * 36
    assert CountingEhr.peak > 2          # three processes, two each: what the shared budget prevents


class StreamingEhr(QuietHandler):
    """A Bulk output file that streams until the client hangs up, and a small resource; notes the
    paths asked, in order."""
    asked: list[str] = []

    def do_GET(self):
        type(self).asked.append(self.path)
        if self.path.startswith("/file"):
            self.send_response(200)
            self.send_header("Content-Type", "application/fhir+ndjson")
            self.end_headers()
            try:
                for _ in range(600):
                    self.wfile.write(b'{"resourceType":"Observation"}\n')
                    self.wfile.flush()
                    time.sleep(0.05)
            except (BrokenPipeError, ConnectionResetError):
                pass
            return
        self.send_json({"resourceType": "Patient", "id": "x"}, "application/fhir+json")


def test_a_streamed_download_counts_against_the_budget_until_it_is_closed():
    """A Bulk file streams outside the moment its headers arrive: with a budget of one request in
    flight, nothing else reaches the EHR while it is still being read."""
    from fhir_ingest.connection.client import FhirClient

    StreamingEhr.asked = []
    server = serve(StreamingEhr)
    client = FhirClient(f"http://127.0.0.1:{server.server_port}/", budget=LocalBudget(1), retries=0)
    try:
        download = client.request("GET", "file", stream=True)
        next(download.iter_lines())                                   # the body is flowing
        other = threading.Thread(target=lambda: client.request("GET", "Patient/x"), daemon=True)
        other.start()
        other.join(1.0)
        assert StreamingEhr.asked == ["/file"], StreamingEhr.asked  # held back while the file streams
        download.close()
        other.join(60)
        assert not other.is_alive() and StreamingEhr.asked == ["/file", "/Patient/x"]
    finally:
        server.shutdown()
