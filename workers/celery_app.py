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
    if settings.celery_broker.startswith(("redis://", "rediss://")):
        # A task whose worker died unacknowledged goes to another worker after the visibility
        # timeout (a Bulk part is idempotent and claimed, so one that merely ran long is not
        # indexed twice); the broker is asked every few seconds which ones have waited that long.
        visibility = float(settings.task_visibility_seconds)
        app.conf.broker_transport_options = {"visibility_timeout": visibility,
                                             "unacked_restore_interval": max(1.0, min(10.0, visibility / 10)),
                                             "unacked_restore_throttle": 1}
    if settings.redis_url.startswith("rediss://"):
        app.conf.broker_use_ssl = {"ssl_cert_reqs": "required"}
    # Celery beat: every registered EHR and the demo tenant are re-synced on an interval.
    app.conf.beat_schedule = {
        "sync-all": {"task": "chartcite.sync_all", "schedule": 60.0 * float(settings.sync_interval_minutes)},
    }
    return app
