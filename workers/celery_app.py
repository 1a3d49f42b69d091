"""The Celery app. In the embedded default tasks run in-process (eagerly, off the request thread)
or in `chartcite worker` on an SQLite broker; production points the broker at Redis."""
from __future__ import annotations

from celery import Celery


def make_celery(settings) -> Celery:
    app = Celery("chartcite", broker=settings.celery_broker, include=["workers.tasks"])
    app.conf.update(
        task_always_eager=settings.tasks_eager,
        task_eager_propagates=True,
        task_serializer="json",
        accept_content=["json"],
        task_acks_late=True,              # a task killed mid-way is redelivered, and tasks are idempotent
        worker_prefetch_multiplier=1,
        task_ignore_result=True,
        broker_connection_retry_on_startup=True,
    )
    app.conf.chartcite_settings = settings
    if settings.redis_url.startswith("rediss://"):
        app.conf.broker_use_ssl = {"ssl_cert_reqs": "required"}
    # Celery beat: every registered EHR and the demo tenant are re-synced on an interval.
    app.conf.beat_schedule = {
        "sync-all": {"task": "chartcite.sync_all", "schedule": 60.0 * float(settings.sync_interval_minutes)},
    }
    return app
