"""Server-side launch sessions. The browser holds only a signed, opaque handle.

The handle travels in a header set by the frame's script (so the app works inside an EHR iframe
that blocks third-party cookies) and, where cookies work, in an HttpOnly cookie as well.
"""
from __future__ import annotations

import json
import secrets
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path

from itsdangerous import BadSignature, URLSafeTimedSerializer

SESSION_HEADER = "X-Chartcite-Session"
COOKIE_NAME = "chartcite_session"
MAX_AGE = 12 * 3600


@dataclass
class LaunchContext:
    session_id: str
    tenant: str
    patient_id: str
    clinician: str
    mode: str            # "demo", "ehr" or "standalone"
    created_at: float
    details: dict = field(default_factory=dict)   # launch context: encounter, need_patient_banner, style


class SessionStore:
    def __init__(self, path: str | Path, secret: str):
        self.path = Path(path)
        self.signer = URLSafeTimedSerializer(secret, salt="chartcite-session")
        with self._connect() as db:
            db.execute("CREATE TABLE IF NOT EXISTS sessions (session_id TEXT PRIMARY KEY, data TEXT NOT NULL, "
                       "created_at REAL NOT NULL)")

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, timeout=30)
        db.execute("PRAGMA journal_mode=WAL")
        return db

    def create(self, tenant: str, patient_id: str, clinician: str, mode: str,
               details: dict | None = None) -> tuple[LaunchContext, str]:
        session_id = secrets.token_urlsafe(32)
        context = LaunchContext(session_id, tenant, patient_id, clinician, mode, time.time(), details or {})
        with self._connect() as db:
            db.execute("INSERT INTO sessions VALUES (?,?,?)", (session_id, json.dumps(context.__dict__), context.created_at))
        return context, self.signer.dumps(session_id)

    def resolve(self, handle: str | None) -> LaunchContext | None:
        if not handle:
            return None
        try:
            session_id = self.signer.loads(handle, max_age=MAX_AGE)
        except BadSignature:
            return None
        with self._connect() as db:
            row = db.execute("SELECT data FROM sessions WHERE session_id=?", (session_id,)).fetchone()
        return LaunchContext(**json.loads(row[0])) if row else None
