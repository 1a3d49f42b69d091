"""Liveness and readiness for orchestrators (Docker, Kubernetes).

`/healthz`: the process answers. `/readyz`: it can do its work — the index backend answers, the
registry database answers, the task broker accepts a connection and the embedding model is loaded
(in every gunicorn worker, not only the one answering) — each check named, 503 until all pass.
Neither carries patient data.
"""
from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

from flask import Blueprint, jsonify

from .services import registry, runner, search, settings

bp = Blueprint("health", __name__)
log = logging.getLogger(__name__)
# Set by `chartcite serve` for several gunicorn workers: the folder where each warm worker leaves a file.
READY_DIR_VARIABLE = "CHARTCITE_WORKERS_READY_DIR"


@bp.get("/healthz")
def healthz():
    return jsonify(status="ok")


@bp.get("/readyz")
def readyz():
    checks = {name: run_check(check) for name, check in CHECKS.items()}
    ready = all(result == "ok" for result in checks.values())
    return jsonify(ready=ready, checks=checks), 200 if ready else 503


def run_check(check) -> str:
    try:
        return check() or "ok"
    except Exception as exc:  # a readiness probe reports any failure as a reason, never raises
        return f"failed: {type(exc).__name__}"


def index_backend() -> str:
    search().catalog.list_patients("__readiness__")
    return "ok"


def registry_database() -> str:
    registry().ehrs()
    return "ok"


def task_broker() -> str:
    celery = getattr(runner(), "celery", None)
    if celery is None or settings().tasks_eager:
        return "ok"          # tasks run in-process: there is no broker to reach
    with celery.connection_for_write() as conn:
        conn.ensure_connection(max_retries=1, timeout=3)
    return "ok"


def embedding_model() -> str:
    return "ok" if search().model_loaded else "loading"


def every_worker() -> str:
    """With several gunicorn workers: are all of them warm, not only the one answering?"""
    folder = os.environ.get(READY_DIR_VARIABLE)
    if not folder:
        return "ok"          # one process: its own model check says it all
    expected = int((Path(folder) / "expected").read_text(encoding="utf-8"))
    ready = sum(1 for marker in Path(folder).iterdir() if marker.name.isdigit() and alive(int(marker.name)))
    return "ok" if ready >= expected else f"loading: {ready} of {expected} workers ready"


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def mark_this_worker_ready() -> None:
    folder = os.environ.get(READY_DIR_VARIABLE)
    if folder:
        (Path(folder) / str(os.getpid())).touch()


CHECKS = {"index": index_backend, "registry": registry_database, "broker": task_broker, "model": embedding_model,
          "workers": every_worker}


def warm_up(app) -> None:
    """Load the model and the NLP pipeline when the process starts, not on the first launch: a
    clinician's first question should not wait for them. /readyz says when they are in."""
    service = app.extensions["chartcite.search"]

    def load():
        try:
            service.warm_up()
            mark_this_worker_ready()
        except Exception:
            log.exception("the embedding model could not be loaded; /readyz reports it")

    threading.Thread(target=load, name="chartcite-warm-up", daemon=True).start()
