"""`chartcite serve`: the app under gunicorn (threads per worker, worker count, timeouts and
graceful shutdown from settings); `--dev` keeps Flask's development server for local work.

What is safe to do once happens in the master before the workers fork: the settings are checked,
the data directory, the signing and token keys and the registry's tables are created (two workers
doing it at once would race, and two generated keys would disagree). The embedding model is not
loaded there: torch's thread pools do not survive a fork, so each worker loads it after forking
(threads within a worker share it; one worker with many threads is the default).
"""
from __future__ import annotations

import fcntl
import logging
import os
import shutil
from pathlib import Path

from gunicorn.app.base import BaseApplication
from gunicorn.glogging import Logger

from .health import READY_DIR_VARIABLE
from .logs import one_line
from .settings import Settings, SettingsError

log = logging.getLogger(__name__)

# The path without its query: a callback's query holds the one-time authorization code.
ACCESS_LOG_FORMAT = '%(h)s "%(m)s %(U)s" %(s)s %(B)s %(M)sms'


class GunicornLogger(Logger):
    """gunicorn's error and access logs, one line per record: the access line holds the decoded
    path, where %0A is a newline."""

    def _set_handler(self, log, output, fmt, stream=None):
        super()._set_handler(log, output, one_line(fmt), stream)


class ChartciteServer(BaseApplication):
    def __init__(self, settings: Settings, options: dict):
        self.settings, self.options = settings, options
        super().__init__()

    def load_config(self) -> None:
        for key, value in self.options.items():
            if key in self.cfg.settings:          # options newer than the installed gunicorn are left out
                self.cfg.set(key, value)

    def load(self):
        from .app import create_app

        # Workers build the app one at a time: each opens stores that create their tables on
        # first use, and two doing it at the same moment raced ("table audit already exists",
        # and gunicorn stops when a worker fails to boot). Model loading runs after, in parallel.
        with open(self.settings.data_dir / ".boot.lock", "a", encoding="utf-8") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                return create_app(self.settings)
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)


def gunicorn_options(settings: Settings, host: str, port: int, cert: str | None, key: str | None) -> dict:
    workers, threads = settings.web_workers, settings.web_threads
    if workers < 1 or threads < 1:
        raise SettingsError("CHARTCITE_WEB_WORKERS and CHARTCITE_WEB_THREADS must be at least 1")
    options = {"bind": f"{host}:{port}", "workers": workers, "threads": threads, "worker_class": "gthread",
               "timeout": settings.web_timeout_seconds,
               "graceful_timeout": settings.web_graceful_seconds,
               "accesslog": "-", "access_log_format": ACCESS_LOG_FORMAT, "errorlog": "-",
               "loglevel": settings.log_level.lower(), "logger_class": GunicornLogger,
               "preload_app": False, "proc_name": "chartcite",
               # gunicorn 27's control socket would be a file in $HOME; nothing here uses it.
               "control_socket_disable": True}
    if cert:
        options |= {"certfile": cert, "keyfile": key}
    return options


def prepare_before_fork(settings: Settings) -> None:
    """Everything the workers would otherwise race to create."""
    from fhir_ingest.connection.registry import Registry

    settings.prepare_data_dir()
    settings.ensure_secret()
    # Tables created (and upgraded) once; the engine is closed so no connection crosses the fork.
    Registry(settings.registry_db, settings.ensure_token_key()).engine.dispose()
    if settings.web_workers > 1 and settings.backend == "embedded":
        log.warning("CHARTCITE_WEB_WORKERS > 1 with the embedded index: each worker loads the model and indexes "
                    "in-process; for more than one worker use Elasticsearch and Celery workers")


def share_metrics_between_workers(settings: Settings, options: dict) -> None:
    """Several workers: each writes its metric values to files in one directory (emptied at start)
    and /metrics, whichever worker answers it, sums them; a worker that exits is marked dead."""
    if options["workers"] == 1:
        return
    folder_for_workers(settings, "prometheus", "PROMETHEUS_MULTIPROC_DIR")

    def mark_dead(worker):
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(worker.pid)

    on_child_exit(options, mark_dead)


def share_readiness_between_workers(settings: Settings, options: dict) -> None:
    """Several workers: /readyz, whichever worker answers it, is ready only once every worker has
    loaded the model and the NLP pipeline. Each worker leaves a file named by its pid when it is
    warm; a worker that exits takes its file with it. (Ready as soon as one worker was warm, the
    other's first questions waited for its loading: 2.3 s against 0.16 s in bench/load.py.)"""
    if options["workers"] == 1:
        return
    folder = folder_for_workers(settings, "workers-ready", READY_DIR_VARIABLE)
    (folder / "expected").write_text(str(options["workers"]), encoding="utf-8")
    on_child_exit(options, lambda worker: (folder / str(worker.pid)).unlink(missing_ok=True))


def folder_for_workers(settings: Settings, name: str, variable: str) -> Path:
    """A folder in the data directory the workers share, emptied at start and named to them (they
    inherit the environment at the fork)."""
    folder = settings.data_dir / name
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(mode=0o700)
    os.environ[variable] = str(folder)
    return folder


def on_child_exit(options: dict, action) -> None:
    """Adds `action(worker)` to what gunicorn's master does when a worker exits."""
    before = options.get("child_exit")

    def child_exit(server, worker):
        if before:
            before(server, worker)
        action(worker)

    options["child_exit"] = child_exit


def serve(settings: Settings, host: str, port: int, cert: str | None = None, key: str | None = None) -> None:
    options = gunicorn_options(settings, host, port, cert, key)
    prepare_before_fork(settings)
    share_metrics_between_workers(settings, options)
    share_readiness_between_workers(settings, options)
    ChartciteServer(settings, options).run()
