"""The rate limits' counters in a SQLite file of the data directory, for deployments without Redis.

flask-limiter's "memory://" store is one per process: with two gunicorn workers a clinician got
twice the questions a minute. The `limits` library offers Redis, Memcached and MongoDB stores but
none on a file, so this implements its storage interface (`limits.storage.Storage`) for the
fixed-window strategy chartcite uses: one row per counter, bumped by a single UPSERT that SQLite
runs atomically however many processes on the host share the file.
"""
from __future__ import annotations

import os
import sqlite3
import threading
import time
from pathlib import Path
from urllib.parse import quote, unquote, urlsplit

from limits.storage import Storage

SCHEME = "chartcite+sqlite"
# Expired counters are swept now and then rather than on every question.
SWEEP_EVERY_SECONDS = 60.0


def rate_store_uri(path: Path) -> str:
    return f"{SCHEME}://{quote(str(path))}"


class SqliteRateStorage(Storage):
    STORAGE_SCHEME = [SCHEME]

    def __init__(self, uri: str | None = None, wrap_exceptions: bool = False, **_):
        super().__init__(uri, wrap_exceptions=wrap_exceptions)
        self.path = unquote(urlsplit(uri or "").path)
        if not self.path:
            raise ValueError(f"{SCHEME}:// needs the path of its database file")
        self._local = threading.local()
        self._swept_at = 0.0
        with self._db() as db:
            db.execute("CREATE TABLE IF NOT EXISTS rate_counters "
                       "(key TEXT PRIMARY KEY, hits INTEGER NOT NULL, expires REAL NOT NULL)")

    @property
    def base_exceptions(self) -> type[Exception]:
        return sqlite3.Error

    def _db(self) -> sqlite3.Connection:
        """One connection per thread and process (gunicorn forks; a connection must not cross)."""
        db = getattr(self._local, "db", None)
        if db is None or self._local.pid != os.getpid():
            db = sqlite3.connect(self.path, timeout=10, isolation_level=None, check_same_thread=False)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            self._local.db, self._local.pid = db, os.getpid()
        return db

    def incr(self, key: str, expiry: int, amount: int = 1) -> int:
        """The counter after adding `amount`; a counter whose window has passed starts again."""
        now = time.time()
        self._sweep(now)
        row = self._db().execute(
            "INSERT INTO rate_counters (key, hits, expires) VALUES (?, ?, ?) ON CONFLICT(key) DO UPDATE SET "
            "hits = CASE WHEN expires <= ? THEN excluded.hits ELSE hits + excluded.hits END, "
            "expires = CASE WHEN expires <= ? THEN excluded.expires ELSE expires END RETURNING hits",
            (key, amount, now + expiry, now, now)).fetchone()
        return int(row[0])

    def get(self, key: str) -> int:
        row = self._db().execute("SELECT hits FROM rate_counters WHERE key = ? AND expires > ?",
                                 (key, time.time())).fetchone()
        return int(row[0]) if row else 0

    def get_expiry(self, key: str) -> float:
        row = self._db().execute("SELECT expires FROM rate_counters WHERE key = ? AND expires > ?",
                                 (key, time.time())).fetchone()
        return float(row[0]) if row else time.time()

    def check(self) -> bool:
        try:
            self._db().execute("SELECT 1").fetchone()
            return True
        except sqlite3.Error:
            return False

    def reset(self) -> int | None:
        return self._db().execute("DELETE FROM rate_counters").rowcount

    def clear(self, key: str) -> None:
        self._db().execute("DELETE FROM rate_counters WHERE key = ?", (key,))

    def _sweep(self, now: float) -> None:
        if now - self._swept_at >= SWEEP_EVERY_SECONDS:
            self._swept_at = now
            self._db().execute("DELETE FROM rate_counters WHERE expires <= ?", (now,))
