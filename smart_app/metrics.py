"""Prometheus metrics at `/metrics`. Labels carry outcomes, stages and HTTP statuses only: never a
patient, a clinician, a tenant's patient count or question text.

Measured in the web process: questions by outcome and their latency per retrieval stage. Read from
the deployment's shared totals at scrape time (workers/progress.py), because Celery workers and
`chartcite sync` do that work in other processes: syncs by outcome, EHR requests by status, jobs
syncing now and the task queue's depth. With several gunicorn workers, prometheus_client's
multiprocess mode (PROMETHEUS_MULTIPROC_DIR, set by `chartcite serve`) sums the workers.
"""
from __future__ import annotations

import os

from flask import Blueprint, Response, current_app
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from .admin import require_admin

bp = Blueprint("metrics", __name__)

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30)


class Metrics:
    """One app's metrics, on its own registry (an app factory may run more than once per process)."""

    def __init__(self, app):
        self.registry = CollectorRegistry()
        self.questions = Counter("chartcite_questions_total", "Questions by outcome: answered, refused (the record "
                                 "does not support an answer) or failed", ["outcome"], registry=self.registry)
        self.seconds = Histogram("chartcite_question_seconds", "Time to answer a question, whole and per retrieval "
                                 "stage", ["stage"], buckets=LATENCY_BUCKETS, registry=self.registry)
        self.audit_failures = Counter("chartcite_audit_failures_total", "Answers and drafts withheld because the "
                                      "audit trail could not be written", registry=self.registry)
        self.scraped = CollectorRegistry()
        if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            # Every worker writes its values to files there; the collector sums them.
            from prometheus_client import multiprocess

            multiprocess.MultiProcessCollector(self.scraped)
        else:
            self.scraped.register(_Own(self.registry))
        self.scraped.register(SharedTotals(app))

    def observe_answer(self, result: dict, seconds: float) -> None:
        self.questions.labels("refused" if result.get("abstained") else "answered").inc()
        self.seconds.labels("total").observe(seconds)
        for stage in result.get("diagnostics", {}).get("stages", []):
            self.seconds.labels(stage["name"]).observe(stage["ms"] / 1000)

    def observe_failure(self) -> None:
        self.questions.labels("failed").inc()

    def observe_audit_failure(self) -> None:
        self.audit_failures.inc()


class _Own:
    """This process's own metrics, as a collector of the scrape registry."""

    def __init__(self, registry: CollectorRegistry):
        self.registry = registry

    def collect(self):
        return self.registry.collect()


class SharedTotals:
    """The deployment's totals, read when Prometheus scrapes."""

    def __init__(self, app):
        self.app = app

    def collect(self):
        runner = self.app.extensions["chartcite.runner"]
        syncs = CounterMetricFamily("chartcite_syncs", "Syncs by kind and outcome", labels=["kind", "outcome"])
        ehr = CounterMetricFamily("chartcite_ehr_requests", "Requests to the EHRs by HTTP status", labels=["status"])
        warnings = CounterMetricFamily("chartcite_bulk_warnings", "Bulk rounds that warned, by kind (future_cursor: "
                                       "a transactionTime after now refused as the cursor; held_back: removals over "
                                       "the budget; not_removed: types not read whole; stalled: no progress)",
                                       labels=["kind"])
        for (name, label), value in sorted(runner.jobs.tallies().items()):
            if name in ("patient_syncs", "bulk_syncs"):
                syncs.add_metric([name.removesuffix("_syncs"), label], value)
            elif name == "ehr_requests":
                ehr.add_metric([label], value)
            elif name == "bulk_warnings":
                warnings.add_metric([label], value)
        jobs = GaugeMetricFamily("chartcite_sync_jobs", "Patient sync jobs by state", labels=["state"])
        states = {"queued": 0, "running": 0, "failed": 0}
        for job in runner.jobs.jobs():
            if job.state in states:
                states[job.state] += 1
        for state, count in states.items():
            jobs.add_metric([state], count)
        yield from (syncs, ehr, warnings, jobs)
        depth = runner.queue_depth()
        if depth is not None:
            yield GaugeMetricFamily("chartcite_queue_depth", "Indexing tasks waiting in the broker", value=depth)


@bp.get("/metrics")
def metrics():
    """For the hospital's Prometheus: a named admin bearer token (CHARTCITE_ADMIN_TOKENS or
    CHARTCITE_ADMIN_TOKEN), like /admin; the audit records which one scraped."""
    require_admin()
    return Response(generate_latest(current_app.extensions["chartcite.metrics"].scraped), content_type=CONTENT_TYPE_LATEST,
                    headers={"Cache-Control": "no-store"})
