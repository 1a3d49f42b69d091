"""A streamed Bundle's own references (fullUrl → `Type/id`), kept on disk rather than in memory.

A Bundle too large to parse whole is read in two passes (fhir_ingest/record/reader.py): the first
notes every entry's fullUrl, so that the second can rewrite the `urn:uuid:` references between
entries as they stream by. Held as a dict, that table grew with the file: about 100 bytes an entry,
some 50 MB of a 630 MB bundle's 276,051 entries and half of what reading it took. Here it is a
temporary SQLite database (SQLite removes it when it is closed) with a page cache of a few MB, so
reading a bundle of any size takes the same memory.
"""
from __future__ import annotations

import sqlite3
from collections.abc import Iterator, Mapping

# Rows inserted together: one statement per this many entries while the first pass runs.
INSERT_EVERY = 10_000


class ReferenceTable(Mapping):
    """fullUrl → `Type/id`, the later of two entries with one fullUrl winning (as in a dict)."""

    def __init__(self):
        # "" opens a private temporary database on disk, deleted when the connection closes.
        self._db = sqlite3.connect("", check_same_thread=False)
        self._db.execute("CREATE TABLE refs (full_url TEXT PRIMARY KEY, ref TEXT NOT NULL) WITHOUT ROWID")
        self._pending: dict[str, str] = {}
        self._count = 0

    def add(self, full_url: str, ref: str) -> None:
        self._pending[full_url] = ref
        if len(self._pending) >= INSERT_EVERY:
            self.flush()

    def flush(self) -> None:
        """What `add` holds, written (looking up reads only what is written)."""
        if self._pending:
            with self._db:
                self._db.executemany("INSERT OR REPLACE INTO refs VALUES (?, ?)", self._pending.items())
            self._pending.clear()
            self._count = self._db.execute("SELECT count(*) FROM refs").fetchone()[0]

    def __getitem__(self, full_url: str) -> str:
        row = self._db.execute("SELECT ref FROM refs WHERE full_url = ?", (full_url,)).fetchone()
        if row is None:
            raise KeyError(full_url)
        return row[0]

    def __contains__(self, full_url: object) -> bool:
        return isinstance(full_url, str) and self._db.execute(
            "SELECT 1 FROM refs WHERE full_url = ?", (full_url,)).fetchone() is not None

    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> Iterator[str]:
        return (row[0] for row in self._db.execute("SELECT full_url FROM refs ORDER BY full_url"))

    def close(self) -> None:
        self._db.close()
