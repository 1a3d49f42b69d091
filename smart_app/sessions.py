"""Server-side launch sessions. The browser holds only a signed, opaque handle.

One launch, one frame, one patient. Each launch gets a frame id of its own; the page it renders
moves its address to `/app/<frame id>`, and where the browser keeps cookies, the handle is kept
in a cookie whose path is that address, so only a reload of that very frame sends it back. A
reload, a second tab, the back button or a restored tab therefore shows the patient that frame
was launched on, or a page asking to open chartcite from the EHR again; never the browser's
latest launch. The API never reads a cookie: the handle travels in a header set by the frame's
script (which also works where the EHR's embedded browser refuses cookies).
"""
from __future__ import annotations

import hmac
import json
import secrets
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path

from itsdangerous import BadSignature, URLSafeTimedSerializer

SESSION_HEADER = "X-Chartcite-Session"
PATIENT_HEADER = "X-Chartcite-Patient"      # the patient the frame shows, checked against its session
FRAME_COOKIE = "chartcite_frame"


@dataclass
class LaunchContext:
    session_id: str
    tenant: str
    patient_id: str
    clinician: str
    mode: str            # "demo", "ehr" or "standalone"
    created_at: float
    details: dict = field(default_factory=dict)   # launch context: encounter, need_patient_banner, style
    frame: str = ""      # the frame's own id: its address is /app/<frame>

    @property
    def frame_path(self) -> str:
        return f"/app/{self.frame}"

    def owns_frame(self, frame: str) -> bool:
        return bool(self.frame) and hmac.compare_digest(self.frame.encode(), frame.encode())


class SessionStore:
    def __init__(self, path: str | Path, secret: str, lifetime_seconds: float = 2 * 3600):
        self.path = Path(path)
        self.lifetime = lifetime_seconds
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
        context = LaunchContext(session_id, tenant, patient_id, clinician, mode, time.time(), details or {},
                                frame=secrets.token_urlsafe(16))
        with self._connect() as db:
            db.execute("DELETE FROM sessions WHERE created_at < ?", (time.time() - self.lifetime,))
            db.execute("INSERT INTO sessions VALUES (?,?,?)", (session_id, json.dumps(context.__dict__), context.created_at))
        return context, self.signer.dumps(session_id)

    def resolve(self, handle: str | None) -> LaunchContext | None:
        """The live session a handle names; None for a forged, expired or ended one."""
        if not handle:
            return None
        try:
            session_id = self.signer.loads(handle, max_age=self.lifetime)
        except BadSignature:
            return None
        with self._connect() as db:
            row = db.execute("SELECT data, created_at FROM sessions WHERE session_id=?", (session_id,)).fetchone()
        if row is None or time.time() - row[1] > self.lifetime:
            return None
        return LaunchContext(**json.loads(row[0]))

    def end(self, session_id: str) -> None:
        """Sign out: the handle is refused from now on, in every process."""
        with self._connect() as db:
            db.execute("DELETE FROM sessions WHERE session_id=?", (session_id,))
