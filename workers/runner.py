"""Enqueue indexing for the web app: Celery `.delay` with a broker, or a background thread
running the same task eagerly in the embedded default (so a request never waits on embedding)."""
from __future__ import annotations

import logging
import threading
from concurrent.futures import ThreadPoolExecutor

from .celery_app import make_celery
from .progress import job_store

log = logging.getLogger(__name__)


class TaskRunner:
    def __init__(self, settings):
        self.settings = settings
        self.celery = make_celery(settings)
        self.jobs = job_store(settings)
        # One indexing thread: embedding already uses every core, two would only contend.
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="chartcite-index") if settings.tasks_eager else None

    def enqueue_sync(self, tenant: str, patient_id: str, session_id: str | None = None) -> bool:
        """Queue a sync of the patient unless one is already queued or running; True when newly queued."""
        if not self.jobs.claim(tenant, patient_id):
            return False
        sync_patient = self.task("chartcite.sync_patient")
        if self.pool is not None:
            self.pool.submit(self._run_eagerly, sync_patient, tenant, patient_id, session_id)
        else:
            sync_patient.delay(tenant, patient_id, session_id)
        return True

    def _retry(self, task, tenant, patient_id, session_id):
        if self.jobs.resume(tenant, patient_id):
            self.pool.submit(self._run_eagerly, task, tenant, patient_id, session_id)

    def task(self, name: str):
        """The task bound to this runner's Celery app (its settings, its broker), not whichever app
        was made last in the process."""
        from . import tasks  # noqa: F401  (registers the shared tasks with every app)

        return self.celery.tasks[name]

    def queue_depth(self) -> int | None:
        """Tasks waiting in the broker; 0 when tasks run in-process; None when the broker is down."""
        if self.pool is not None:
            return 0
        try:
            with self.celery.connection_for_read() as conn:
                # One quick try: a status line must not wait out kombu's reconnect schedule
                # (about 20 s) to say the broker is down.
                conn.ensure_connection(max_retries=1, interval_start=0, interval_step=0)
                return conn.default_channel.queue_declare(queue="celery", passive=True).message_count
        except Exception:  # an empty SQLite broker has no queue yet; a down Redis has no depth to give
            return 0 if "sqla" in self.settings.celery_broker else None

    def _run_eagerly(self, task, tenant, patient_id, session_id):
        from fhir_ingest.connection.client import AuthExpired

        from .sync import RetryLater

        try:
            task.apply(args=(tenant, patient_id, session_id), throw=True)
        except RetryLater as later:
            # The same schedule a Celery worker keeps: the job says when; a relaunch or Retry
            # before then takes the job over and this timer finds nothing left to do.
            timer = threading.Timer(later.seconds, self._retry, (task, tenant, patient_id, session_id))
            timer.daemon = True
            timer.start()
        except AuthExpired:
            # Expected: tokens expire. The job says what to do; the log needs one line, no traceback.
            log.warning("indexing stopped: the EHR sign-in expired; the clinician is asked to reopen chartcite")
        except Exception:
            log.exception("indexing task failed")
