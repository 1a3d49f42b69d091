"""EmbeddedBackend: SQLite FTS5 for BM25 and float32 vectors beside it, in one file.

No server: the index lives in the data directory. Dense search is exact cosine over one
patient's chunks (a few hundred to a few thousand vectors), which is fast and deterministic.
"""
from __future__ import annotations

import json
import logging
import re
import sqlite3
import threading
from collections import OrderedDict
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import orjson

from fhir_ingest.record.compact import gathered
from fhir_ingest.record.contract import Chunk

from search.nlp.annotate import asserted_keys
from search.similar.version import PROFILE_VERSION
from search.backends.base import (PENDING_PROBLEM, VECTOR_PENDING, Backend, BackendError, Hit, IndexCheck,
                                  ModelMismatch, Scope, StoredReading, text_digest,
                                  ProfileGaps, profile_gaps, profile_problems, summary_after_removal)
from search.nlp.lexicon import tokens

# The index's layout, kept in meta as `schema_version`. 1: every index written before versions were
# kept; 2: the full-text table's scope columns (issue 42). An older index is brought forward on
# opening, step by step; a newer one is refused, since this code would misread it.
SCHEMA_VERSION = 2
log = logging.getLogger(__name__)
# Chunks a question read, kept parsed: about 12 kB each in memory, so about 25 MB.
PARSED_KEPT = 2048
# How much of the index file a question's connection reads through a memory map (the OS's page
# cache, shared, no copy per connection).
MAPPED_BYTES = 256 * 2**20
BUSY_WAIT_MS = 30_000          # how long a statement waits for another writer to finish
READING_WAIT_MS = 50           # ...and a sentence reading kept after a question is answered

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS chunks (
    chunk_id TEXT PRIMARY KEY,
    tenant TEXT NOT NULL,
    patient_id TEXT NOT NULL,
    ref TEXT NOT NULL,
    semantic_type TEXT NOT NULL,
    date TEXT NOT NULL,
    text_hash TEXT NOT NULL,
    data TEXT NOT NULL,
    vector BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS chunks_scope ON chunks (tenant, patient_id);
CREATE TABLE IF NOT EXISTS chunk_refs (
    tenant TEXT NOT NULL, ref TEXT NOT NULL, chunk_id TEXT NOT NULL,
    PRIMARY KEY (tenant, ref, chunk_id)
);
-- `scope` holds one word naming the chunk's tenant and patient (scope_word): a text search
-- matches it with AND inside MATCH, so FTS5 reads only the asking patient's rows. `scoped` holds
-- the lexical words each prefixed by that word, for look-ups by prefix, which FTS5 would
-- otherwise expand over every patient's words before the AND (scoped_words).
CREATE VIRTUAL TABLE IF NOT EXISTS chunks_fts USING fts5(
    lexical, scope, scoped, chunk_id UNINDEXED, tenant UNINDEXED, patient_id UNINDEXED,
    tokenize = 'porter unicode61'
);
CREATE TABLE IF NOT EXISTS chunk_concepts (
    tenant TEXT NOT NULL, patient_id TEXT NOT NULL, concept TEXT NOT NULL, chunk_id TEXT NOT NULL,
    PRIMARY KEY (tenant, patient_id, concept, chunk_id)
);
CREATE INDEX IF NOT EXISTS chunk_concepts_chunk ON chunk_concepts (chunk_id);
CREATE TABLE IF NOT EXISTS resources (
    tenant TEXT NOT NULL, patient_id TEXT NOT NULL, ref TEXT NOT NULL, data TEXT NOT NULL,
    PRIMARY KEY (tenant, patient_id, ref)
);
-- Which patients hold a resource (a Bulk `deleted` entry names only Type/id).
CREATE INDEX IF NOT EXISTS resources_ref ON resources (tenant, ref);
CREATE TABLE IF NOT EXISTS patients (
    tenant TEXT NOT NULL, patient_id TEXT NOT NULL, data TEXT NOT NULL,
    PRIMARY KEY (tenant, patient_id)
);
CREATE TABLE IF NOT EXISTS profiles (
    tenant TEXT NOT NULL, patient_id TEXT NOT NULL, data TEXT NOT NULL, vector BLOB NOT NULL,
    PRIMARY KEY (tenant, patient_id)
);
CREATE TABLE IF NOT EXISTS profile_keys (
    tenant TEXT NOT NULL, key TEXT NOT NULL, patient_id TEXT NOT NULL,
    PRIMARY KEY (tenant, key, patient_id)
);
-- How answering read a chunk sentence by sentence (search/sentence_readings.py): the sentence
-- spans of the pieces of its text and its sentences' vectors, kept so no process splits or embeds
-- them again. A row is of the chunk text whose digest it carries; it goes when its chunk goes or
-- its text changes.
CREATE TABLE IF NOT EXISTS chunk_readings (
    chunk_id TEXT PRIMARY KEY, tenant TEXT NOT NULL, text_hash TEXT NOT NULL, model TEXT NOT NULL,
    splits TEXT NOT NULL, texts TEXT NOT NULL, vectors BLOB NOT NULL
);
-- A profile rewritten drops its keys by patient: without this, each write read every key of the
-- tenant (10,000 patients: 151 ms a profile, quadratic in the tenant).
CREATE INDEX IF NOT EXISTS profile_keys_patient ON profile_keys (tenant, patient_id);
"""


def as_json(data) -> str:
    """orjson writes a resource several times faster than `json`; what it refuses (an integer
    beyond 64 bits, a lone surrogate: read as they were) goes through `json`, losing nothing."""
    try:
        return orjson.dumps(data).decode()
    except TypeError:                 # orjson.JSONEncodeError is one
        return json.dumps(data)


def from_json(text: str):
    """orjson reads stored JSON faster than `json`; what as_json wrote through `json` (an integer
    beyond 64 bits, a lone surrogate, NaN) it refuses, and `json` reads as it was written."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return json.loads(text)


def scope_word(tenant: str, patient_id: str) -> str:
    """The one full-text word that names a tenant's patient: "s" and 24 digits of a hash, a token
    unicode61 keeps whole and the porter stemmer leaves alone (it only trims letter endings)."""
    import hashlib

    digest = hashlib.sha256(f"{tenant}\x00{patient_id}".encode()).hexdigest()
    return "s" + str(int(digest[:20], 16)).zfill(25)


_WORD = re.compile(r"[^\W_]+")        # the runs unicode61 keeps as tokens: letters and digits


def scoped_words(tenant: str, patient_id: str, text: str) -> str:
    """`text`'s words, each prefixed by the patient's scope word ("s0123...insulin"): a term or a
    prefix looked up in this column names only this patient's words, so FTS5 reads no posting of
    another patient's (the scope word is letters-then-digits, which the stemmer never changes)."""
    scope = scope_word(tenant, patient_id)
    return " ".join(scope + word for word in _WORD.findall(text.lower()))


def scoped_match(tenant: str, patient_id: str, words: str) -> str:
    """An FTS5 query for `words` in the lexical column of one patient's rows only. FTS5 evaluates
    AND by stepping both posting lists to common rows, so how many rows of other patients hold a
    word changes neither the rows visited nor the time (issue 42: the time said how many chunks of
    other patients, in any tenant, held the word)."""
    return f'scope : "{scope_word(tenant, patient_id)}" AND lexical : ({words})'


def text_hash(chunk: Chunk, lexical: str) -> str:
    """What decides whether an indexed chunk is still current: its text, its BM25 text and its
    annotations, so a vocabulary or annotator change reaches chunks whose text did not change."""
    import hashlib

    concepts = sorted(f"{c['key']}:{int(bool(c.get('negated')))}" for c in chunk.concepts)
    return hashlib.sha256(f"{chunk.text}\x00{lexical}\x00{'|'.join(concepts)}".encode()).hexdigest()[:24]


class EmbeddedBackend(Backend):
    keeps_readings = True

    def __init__(self, path: str | Path, embedding_model: str | None, dimension: int = 0):
        """`embedding_model=None` opens the index for catalogue reads only (patients, resources)."""
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.embedding_model = embedding_model
        self.dimension = dimension
        self._local = threading.local()
        self._parsed = ParsedChunks(PARSED_KEPT)
        found = self._schema_version()
        with self._db() as db:
            db.executescript(SCHEMA)
        self._upgrade_schema(found)
        self._check_model()

    # One connection per thread: the web app answers on several threads, the indexer on another.
    def _db(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = sqlite3.connect(self.path, timeout=BUSY_WAIT_MS / 1000, isolation_level=None,
                                   check_same_thread=False)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.create_function("scope_word", 2, scope_word, deterministic=True)
            conn.create_function("scoped_words", 3, scoped_words, deterministic=True)
            self._local.conn = conn
        return conn

    @contextmanager
    def _transaction(self):
        """All of a write or none of it: the chunk, its FTS row, its refs and concepts move together.
        Inside another (`written_together`) it joins that one, which commits once for all."""
        db = self._db()
        if db.in_transaction:
            yield db
            return
        db.execute("BEGIN")
        try:
            yield db
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise

    def _schema_version(self) -> int:
        """The layout the file holds: SCHEMA_VERSION for a new file, 1 for an index written before
        versions were kept; refused when newer than this code."""
        db = self._db()
        tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if "chunks" not in tables:
            return SCHEMA_VERSION
        row = db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone() if "meta" in tables else None
        found = int(row[0]) if row else 1
        if found > SCHEMA_VERSION:
            raise BackendError(f"{self.path} was written by a newer chartcite (index schema {found}; this one reads up "
                               f"to {SCHEMA_VERSION}): run the newer chartcite, or move the file aside and build the "
                               f"index again with `chartcite index <files>` or a sync of each patient")
        return found

    def _upgrade_schema(self, found: int) -> None:
        steps = {1: self._scope_lexical_rows}        # the step that brings version n to n + 1
        for version in range(found, SCHEMA_VERSION):
            log.info("upgrading the embedded index from schema %d to %d", version, version + 1)
            steps[version]()
        self._db().execute("INSERT OR REPLACE INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))

    def _scope_lexical_rows(self) -> None:
        """An index written before the full-text table had its `scope` and `scoped` columns is
        rebuilt into the new layout on opening, in one transaction, so no query ever runs on rows
        without them (they would match nothing: every lexical answer would silently be empty)."""
        db = self._db()
        if {"scope", "scoped"} <= set(self._lexical_columns(db)):
            return
        db.execute("BEGIN IMMEDIATE")        # two processes opening the old index migrate it once
        try:
            if not {"scope", "scoped"} <= set(self._lexical_columns(db)):
                db.execute("DROP TABLE IF EXISTS chunks_fts_scoped")
                db.execute("CREATE VIRTUAL TABLE chunks_fts_scoped USING fts5(lexical, scope, scoped, chunk_id "
                           "UNINDEXED, tenant UNINDEXED, patient_id UNINDEXED, tokenize = 'porter unicode61')")
                db.execute("INSERT INTO chunks_fts_scoped (lexical, scope, scoped, chunk_id, tenant, patient_id) "
                           "SELECT lexical, scope_word(tenant, patient_id), scoped_words(tenant, patient_id, lexical), "
                           "chunk_id, tenant, patient_id FROM chunks_fts")
                db.execute("DROP TABLE chunks_fts")
                db.execute("ALTER TABLE chunks_fts_scoped RENAME TO chunks_fts")
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise

    @staticmethod
    def _lexical_columns(db) -> list[str]:
        return [row[1] for row in db.execute("PRAGMA table_info(chunks_fts)")]

    def built_with(self) -> set[str]:
        row = self._db().execute("SELECT value FROM meta WHERE key='embedding_model'").fetchone()
        return {row[0]} if row else set()

    def _check_model(self) -> None:
        if self.embedding_model is None:
            return
        db = self._db()
        row = db.execute("SELECT value FROM meta WHERE key='embedding_model'").fetchone()
        if row is None:
            db.execute("INSERT INTO meta VALUES ('embedding_model', ?), ('dimension', ?)",
                       (self.embedding_model, str(self.dimension)))
        elif row[0] != self.embedding_model:
            raise ModelMismatch(
                f"the index at {self.path} was built with embedding model {row[0]!r}, but this process "
                f"uses {self.embedding_model!r}; point CHARTCITE_MODEL at the model that built it, or "
                f"rebuild the index into a new CHARTCITE_DATA_DIR with `chartcite index`")

    # --- writing ----------------------------------------------------------------------------
    def written_together(self):
        return self._transaction()

    def index(self, chunks: list[Chunk], vectors: np.ndarray, lexical_texts: list[str]) -> None:
        if not chunks:
            return
        # One row per chunk id even if a caller passes a chunk twice: the last one wins everywhere.
        unique = {c.chunk_id: (c, v, lx) for c, v, lx in zip(chunks, vectors, lexical_texts)}
        rows, fts, refs, concepts = [], [], [], []
        for chunk, vector, lexical in unique.values():
            chunk.embedding_model = self.embedding_model
            cid = chunk.chunk_id
            pending = vector is None
            rows.append((cid, chunk.tenant, chunk.patient_id, chunk.ref, chunk.semantic_type, chunk.date,
                         VECTOR_PENDING if pending else text_hash(chunk, lexical), as_json(chunk.to_dict()),
                         b"" if pending else np.asarray(vector, dtype=np.float32).tobytes()))
            fts.append((lexical, scope_word(chunk.tenant, chunk.patient_id),
                        scoped_words(chunk.tenant, chunk.patient_id, lexical), cid, chunk.tenant, chunk.patient_id))
            # Every resource a chunk draws on: deleting any of them removes the chunk (a trend, a panel).
            refs.extend((chunk.tenant, ref, cid) for ref in chunk.refs)
            concepts.extend((chunk.tenant, chunk.patient_id, key, cid) for key in asserted_keys(chunk.concepts))
        with self._transaction() as db:
            # Only a chunk indexed before has rows to replace: the full-text table cannot index
            # chunk_id, so deleting by it scans the table, once per chunk (quadratic on a fresh index).
            replaced = self._present(db, [r[0] for r in rows])
            db.executemany("DELETE FROM chunks_fts WHERE chunk_id = ?", replaced)
            db.executemany("INSERT OR REPLACE INTO chunks VALUES (?,?,?,?,?,?,?,?,?)", rows)
            db.executemany("INSERT INTO chunks_fts (lexical, scope, scoped, chunk_id, tenant, patient_id) "
                           "VALUES (?,?,?,?,?,?)", fts)
            db.executemany("INSERT OR IGNORE INTO chunk_refs VALUES (?,?,?)", refs)
            db.executemany("DELETE FROM chunk_concepts WHERE chunk_id = ?", replaced)
            db.executemany("INSERT OR IGNORE INTO chunk_concepts VALUES (?,?,?,?)", concepts)
            # A chunk whose text changed is read again: its kept reading was of the old text.
            db.executemany("DELETE FROM chunk_readings WHERE chunk_id = ? AND text_hash != ?",
                           [(cid, text_digest(unique[cid][0].text)) for (cid,) in replaced])

    def add_vectors(self, chunks: list[Chunk], vectors: np.ndarray, lexical_texts: list[str]) -> None:
        # The row, its full-text entry, refs and concepts were written with the words: only the
        # vector and the hash that says the chunk is complete change (no full-text rewrite).
        rows = [(np.asarray(v, dtype=np.float32).tobytes(), text_hash(c, lx), c.tenant, c.chunk_id)
                for c, v, lx in zip(chunks, vectors, lexical_texts)]
        with self._transaction() as db:
            db.executemany("UPDATE chunks SET vector = ?, text_hash = ? WHERE tenant = ? AND chunk_id = ?", rows)

    @staticmethod
    def _present(db, chunk_ids: list[str]) -> list[tuple[str]]:
        found = []
        for start in range(0, len(chunk_ids), 500):
            batch = chunk_ids[start:start + 500]
            marks = ",".join("?" * len(batch))
            found += db.execute(f"SELECT chunk_id FROM chunks WHERE chunk_id IN ({marks})", batch).fetchall()
        return [(row[0],) for row in found]

    def delete_chunks(self, tenant: str, chunk_ids: list[str]) -> int:
        if not chunk_ids:
            return 0
        ids = [(tenant, c) for c in chunk_ids]
        with self._transaction() as db:
            before = db.total_changes
            db.executemany("DELETE FROM chunks WHERE tenant = ? AND chunk_id = ?", ids)
            removed = db.total_changes - before
            db.executemany("DELETE FROM chunks_fts WHERE tenant = ? AND chunk_id = ?", ids)
            db.executemany("DELETE FROM chunk_refs WHERE tenant = ? AND chunk_id = ?", ids)
            db.executemany("DELETE FROM chunk_concepts WHERE tenant = ? AND chunk_id = ?", ids)
            db.executemany("DELETE FROM chunk_readings WHERE tenant = ? AND chunk_id = ?", ids)
        return removed

    def delete_refs(self, tenant: str, patient_id: str, refs: list[str]) -> int:
        chunks: dict[str, tuple[str, bool]] = {}       # chunk id → (semantic type, waiting for its vector)
        with self._transaction() as db:
            for ref in dict.fromkeys(refs):
                rows = db.execute("SELECT c.chunk_id, c.semantic_type, c.text_hash FROM chunk_refs r JOIN chunks c "
                                  "ON c.chunk_id = r.chunk_id WHERE r.tenant = ? AND r.ref = ? AND c.patient_id = ?",
                                  (tenant, ref, patient_id))
                chunks.update((cid, (semantic_type, digest == VECTOR_PENDING)) for cid, semantic_type, digest in rows)
            stored = [ref for ref in dict.fromkeys(refs) if db.execute(
                "SELECT 1 FROM resources WHERE tenant=? AND patient_id=? AND ref=?",
                (tenant, patient_id, ref)).fetchone()]
            db.executemany("DELETE FROM resources WHERE tenant=? AND patient_id=? AND ref=?",
                           [(tenant, patient_id, ref) for ref in stored])
            removed = self.delete_chunks(tenant, list(chunks))
            summary = self.get_patient(tenant, patient_id)
            if summary is not None and (chunks or stored):
                self.upsert_patient(tenant, patient_id, summary_after_removal(
                    summary, [t for t, _ in chunks.values()], sum(p for _, p in chunks.values()), stored))
        return removed

    def holders(self, tenant: str, refs: list[str]) -> dict[str, set[str]]:
        found: dict[str, set[str]] = {}
        for ref in dict.fromkeys(refs):
            rows = self._db().execute("SELECT patient_id FROM resources WHERE tenant=? AND ref=?", (tenant, ref))
            found[ref] = {row[0] for row in rows}
        return found

    def store_resources(self, tenant: str, patient_id: str, resources: list[dict]) -> None:
        kept = {f"{r['resourceType']}/{r['id']}" for r in resources}
        # Each row's JSON is written as SQLite takes the row, never all at once: a large record's
        # JSON held whole would stand beside its parsed resources at the end of its indexing.
        rows = ((tenant, patient_id, f"{r['resourceType']}/{r['id']}", as_json(r)) for r in resources)
        # One transaction: outside one, SQLite commits each row on its own (a third of writing).
        with self._transaction() as db:
            held = [r[0] for r in db.execute("SELECT ref FROM resources WHERE tenant=? AND patient_id=?",
                                             (tenant, patient_id))]
            db.executemany("DELETE FROM resources WHERE tenant=? AND patient_id=? AND ref=?",
                           [(tenant, patient_id, ref) for ref in held if ref not in kept])
            db.executemany("INSERT OR REPLACE INTO resources VALUES (?,?,?,?)", rows)

    def upsert_patient(self, tenant: str, patient_id: str, summary: dict) -> None:
        self._db().execute("INSERT OR REPLACE INTO patients VALUES (?,?,?)", (tenant, patient_id, as_json(summary)))

    # --- reading ----------------------------------------------------------------------------
    @staticmethod
    def _scope_sql(scope: Scope, alias: str = "c") -> tuple[str, list]:
        sql = f"{alias}.tenant = ? AND {alias}.patient_id = ?"
        args: list = [scope.tenant, scope.patient_id]
        if scope.semantic_types:
            sql += f" AND {alias}.semantic_type IN ({','.join('?' * len(scope.semantic_types))})"
            args += list(scope.semantic_types)
        if scope.date_from:
            sql += f" AND {alias}.date >= ?"
            args.append(scope.date_from)
        if scope.date_to:
            sql += f" AND substr({alias}.date, 1, 10) <= ?"
            args.append(scope.date_to)
        return sql, args

    def search_text(self, scope: Scope, query: str, n: int) -> list[Hit]:
        terms = sorted({t for t in tokens(query)})
        if not terms:
            return []
        match = scoped_match(scope.tenant, scope.patient_id, " OR ".join('"' + t.replace('"', "") + '"' for t in terms))
        where, args = self._scope_sql(scope)
        # Only the lexical column weighs: every row of the patient holds its scope word once.
        sql = (f"SELECT f.chunk_id, bm25(chunks_fts, 1.0, 0.0, 0.0) AS s FROM chunks_fts f JOIN chunks c ON "
               f"c.chunk_id = f.chunk_id WHERE chunks_fts MATCH ? AND f.tenant = ? AND f.patient_id = ? AND {where} "
               f"ORDER BY s LIMIT ?")
        rows = self._db().execute(sql, [match, scope.tenant, scope.patient_id, *args, n]).fetchall()
        return [Hit(cid, -score) for cid, score in rows]   # FTS5 bm25 is "lower is better"

    def search_vector(self, scope: Scope, vector: np.ndarray, n: int) -> list[Hit]:
        where, args = self._scope_sql(scope)
        rows = self._db().execute(f"SELECT chunk_id, vector FROM chunks c WHERE {where} AND length(c.vector) > 0",
                                  args).fetchall()
        if not rows:
            return []
        matrix = np.frombuffer(b"".join(r[1] for r in rows), dtype=np.float32).reshape(len(rows), -1)
        scores = matrix @ np.asarray(vector, dtype=np.float32)
        top = np.argsort(-scores, kind="stable")[:n]
        return [Hit(rows[i][0], float(scores[i])) for i in top]

    def search_concepts(self, scope: Scope, concept_keys: list[str], n: int) -> list[Hit]:
        if not concept_keys:
            return []
        where, args = self._scope_sql(scope)
        marks = ",".join("?" * len(concept_keys))
        sql = (f"SELECT k.chunk_id, count(*) AS hits, c.date FROM chunk_concepts k JOIN chunks c ON c.chunk_id = k.chunk_id "
               f"WHERE k.tenant = ? AND k.patient_id = ? AND k.concept IN ({marks}) AND {where} "
               f"GROUP BY k.chunk_id ORDER BY hits DESC, c.date DESC LIMIT ?")
        rows = self._db().execute(sql, [scope.tenant, scope.patient_id, *concept_keys, *args, n]).fetchall()
        return [Hit(cid, float(hits)) for cid, hits, _ in rows]

    def latest(self, scope: Scope, n: int) -> list[Hit]:
        where, args = self._scope_sql(scope)
        rows = self._db().execute(f"SELECT chunk_id FROM chunks c WHERE {where} ORDER BY date DESC, chunk_id LIMIT ?",
                                  [*args, n]).fetchall()
        return [Hit(r[0], 0.0) for r in rows]

    def has_terms(self, tenant: str, patient_id: str, terms: list[str], prefix: bool = False) -> set[str]:
        found = set()
        sql = "SELECT 1 FROM chunks_fts WHERE chunks_fts MATCH ? AND tenant = ? AND patient_id = ? LIMIT 1"
        for term in terms:
            # In the scoped column: a prefix expands over this patient's words only.
            phrase = scoped_words(tenant, patient_id, term)
            if phrase and self._db().execute(sql, [f'scoped : "{phrase}"' + ("*" if prefix else ""), tenant,
                                                   patient_id]).fetchone():
                found.add(term)
        return found

    def refs_in_scope(self, scope: Scope, refs: list[str]) -> set[str]:
        if not refs:
            return set()
        where, args = self._scope_sql(scope)
        marks = ",".join("?" * len(refs))
        sql = (f"SELECT DISTINCT r.ref FROM chunk_refs r JOIN chunks c ON c.chunk_id = r.chunk_id "
               f"WHERE r.tenant = ? AND r.ref IN ({marks}) AND {where}")
        return {row[0] for row in self._db().execute(sql, [scope.tenant, *refs, *args])}

    def count(self, scope: Scope) -> int:
        where, args = self._scope_sql(scope)
        return self._db().execute(f"SELECT count(*) FROM chunks c WHERE {where}", args).fetchone()[0]

    def get_chunks(self, tenant: str, chunk_ids: list[str]) -> list[Chunk]:
        if not chunk_ids:
            return []
        marks = ",".join("?" * len(chunk_ids))
        if not getattr(self._local, "remember", False):
            rows = self._db().execute(f"SELECT chunk_id, data FROM chunks WHERE tenant = ? AND chunk_id IN ({marks})",
                                      [tenant, *chunk_ids]).fetchall()
            by_id = {cid: Chunk.from_dict(from_json(data)) for cid, data in rows}
            return [by_id[c] for c in chunk_ids if c in by_id]
        # A row is rewritten only whole (INSERT OR REPLACE: a new rowid) or given its vector (a
        # new text hash), so a chunk parsed under the same rowid and hash is the same chunk.
        rows = self._db().execute(f"SELECT chunk_id, rowid, text_hash FROM chunks WHERE tenant = ? AND chunk_id IN "
                                  f"({marks})", [tenant, *chunk_ids]).fetchall()
        by_id = {cid: self._parsed.get((cid, rowid, digest)) for cid, rowid, digest in rows}
        missing = [cid for cid, chunk in by_id.items() if chunk is None]
        if missing:
            marks = ",".join("?" * len(missing))
            for cid, rowid, digest, data in self._db().execute(
                    f"SELECT chunk_id, rowid, text_hash, data FROM chunks WHERE tenant = ? AND chunk_id IN ({marks})",
                    [tenant, *missing]):
                by_id[cid] = Chunk.from_dict(from_json(data))
                self._parsed.put((cid, rowid, digest), by_id[cid])
        # Each caller gets its own Chunk (its lists shared): setting a field changes no other's.
        return [_fresh(by_id[c]) for c in chunk_ids if by_id.get(c) is not None]

    @contextmanager
    def answering(self):
        # Questions read the file through a memory map: a question reads every vector of the
        # patient and hundreds of chunk rows, and SQLite's own 2 MB page cache copied them in by
        # read calls each time. Indexing's connections keep to reads (their memory is measured).
        if not getattr(self._local, "mapped", False):
            self._db().execute(f"PRAGMA mmap_size={MAPPED_BYTES}")
            self._local.mapped = True
        self._local.remember = True
        try:
            yield
        finally:
            self._local.remember = False

    def get_readings(self, tenant: str, chunk_ids: list[str]) -> dict[str, StoredReading]:
        if not chunk_ids:
            return {}
        marks = ",".join("?" * len(chunk_ids))
        rows = self._db().execute(f"SELECT chunk_id, text_hash, model, splits, texts, vectors FROM chunk_readings "
                                  f"WHERE tenant = ? AND chunk_id IN ({marks})", [tenant, *chunk_ids]).fetchall()
        found = {}
        for cid, digest, model, splits, texts, vectors in rows:
            texts = from_json(texts)
            matrix = np.frombuffer(vectors, dtype=np.float32).reshape(len(texts), -1) if texts else \
                np.zeros((0, 0), dtype=np.float32)
            found[cid] = StoredReading(cid, digest, model, from_json(splits), texts, matrix)
        return found

    def put_readings(self, tenant: str, readings: list[StoredReading]) -> bool:
        rows = [(r.chunk_id, tenant, r.text_digest, r.model, as_json(r.splits), as_json(r.texts),
                 np.asarray(r.vectors, dtype=np.float32).tobytes(), r.chunk_id, tenant) for r in readings]
        if not rows:
            return False
        db = self._db()
        # Asked while a question is answered: if an indexing write holds the index, the reading
        # is kept next time rather than the answer waiting for the writer.
        db.execute(f"PRAGMA busy_timeout = {READING_WAIT_MS}")
        try:
            with self._transaction():
                # Only beside a chunk still held: a chunk removed meanwhile leaves no row behind.
                db.executemany("INSERT OR REPLACE INTO chunk_readings SELECT ?, ?, ?, ?, ?, ?, ? WHERE EXISTS "
                               "(SELECT 1 FROM chunks WHERE chunk_id = ? AND tenant = ?)", rows)
            return True
        except sqlite3.OperationalError as exc:
            # Busy: kept by a later question. Anything else (a read-only data directory) costs
            # only the keeping, never the answer.
            (log.debug if "locked" in str(exc) or "busy" in str(exc) else log.warning)(
                "sentence readings not kept this time: %s", exc)
            return False
        finally:
            db.execute(f"PRAGMA busy_timeout = {BUSY_WAIT_MS}")

    def prune_readings(self, tenant: str) -> int:
        # Left by a chartcite that removed chunks without knowing their readings.
        with self._transaction() as db:
            return db.execute("DELETE FROM chunk_readings WHERE tenant = ? AND chunk_id NOT IN "
                              "(SELECT chunk_id FROM chunks WHERE tenant = ?)", (tenant, tenant)).rowcount

    def indexed_texts(self, tenant: str, patient_id: str) -> dict[str, str]:
        rows = self._db().execute("SELECT chunk_id, text_hash FROM chunks WHERE tenant=? AND patient_id=?",
                                  (tenant, patient_id)).fetchall()
        return dict(rows)

    def patient_resources(self, tenant: str, patient_id: str) -> list[dict]:
        # Row by row: a large record's come back compact (fhir_ingest/record/compact.py), never all parsed.
        rows = self._db().execute("SELECT data FROM resources WHERE tenant=? AND patient_id=? ORDER BY ref",
                                  (tenant, patient_id))
        return gathered(json.loads(r[0]) for r in rows)

    def get_resource(self, tenant: str, patient_id: str, ref: str) -> dict | None:
        row = self._db().execute("SELECT data FROM resources WHERE tenant=? AND patient_id=? AND ref=?",
                                 (tenant, patient_id, ref)).fetchone()
        return json.loads(row[0]) if row else None

    def get_patient(self, tenant: str, patient_id: str) -> dict | None:
        row = self._db().execute("SELECT data FROM patients WHERE tenant=? AND patient_id=?",
                                 (tenant, patient_id)).fetchone()
        return json.loads(row[0]) if row else None

    def has_patients(self, tenant: str) -> bool:
        return self._db().execute("SELECT 1 FROM patients WHERE tenant=? LIMIT 1", (tenant,)).fetchone() is not None

    def list_patients(self, tenant: str) -> list[dict]:
        rows = self._db().execute("SELECT data FROM patients WHERE tenant=? ORDER BY patient_id", (tenant,)).fetchall()
        return [json.loads(r[0]) for r in rows]

    # --- patient profiles -------------------------------------------------------------------
    def put_profile(self, tenant: str, patient_id: str, profile: dict, keys: list[str], vector: np.ndarray) -> None:
        blob = np.asarray(vector, dtype=np.float32).tobytes()
        with self._transaction() as db:
            db.execute("INSERT OR REPLACE INTO profiles VALUES (?,?,?,?)", (tenant, patient_id, as_json(profile), blob))
            db.execute("DELETE FROM profile_keys WHERE tenant=? AND patient_id=?", (tenant, patient_id))
            db.executemany("INSERT OR IGNORE INTO profile_keys VALUES (?,?,?)",
                           [(tenant, key, patient_id) for key in keys])

    def nearest_profiles(self, tenant: str, patient_id: str, n: int) -> list[tuple[str, float]]:
        # Exact cosine over the tenant's profile vectors (normalised when embedded): 10,000
        # patients are 15 MB of vectors, one matrix product.
        db = self._db()
        own = db.execute("SELECT vector FROM profiles WHERE tenant=? AND patient_id=?", (tenant, patient_id)).fetchone()
        if own is None:
            return []
        rows = db.execute("SELECT patient_id, vector FROM profiles WHERE tenant=? AND patient_id != ?",
                          (tenant, patient_id)).fetchall()
        rows = [r for r in rows if len(r[1]) == len(own[0])]
        if not rows:
            return []
        matrix = np.frombuffer(b"".join(r[1] for r in rows), dtype=np.float32).reshape(len(rows), -1)
        scores = matrix @ np.frombuffer(own[0], dtype=np.float32)
        top = np.argsort(-scores, kind="stable")[:n]
        return [(rows[i][0], float(scores[i])) for i in top]

    def get_profiles(self, tenant: str, patient_ids: list[str]) -> dict[str, dict]:
        if not patient_ids:
            return {}
        marks = ",".join("?" * len(patient_ids))
        rows = self._db().execute(f"SELECT patient_id, data FROM profiles WHERE tenant=? AND patient_id IN ({marks})",
                                  [tenant, *patient_ids]).fetchall()
        return {pid: json.loads(data) for pid, data in rows}

    def cohort_profiles(self, tenant: str, exposures: list[str], conditions: list[str], measure: str) -> list[dict]:
        if not exposures or not conditions:
            return []
        # Selected by the keys' index, and only the medications and the one series read out of
        # the stored JSON (by SQLite, in C): json.loads of whole profiles was most of the time.
        holding = lambda some: (f"p.patient_id IN (SELECT patient_id FROM profile_keys WHERE tenant=? AND key IN "
                                f"({','.join('?' * len(some))}))")
        series = '$.measures."' + measure.replace('"', "") + '"'
        rows = self._db().execute(
            f"SELECT p.patient_id, json_extract(p.data, '$.medications'), json_extract(p.data, ?) FROM profiles p "
            f"WHERE p.tenant=? AND {holding(exposures)} AND {holding(conditions)} ORDER BY p.patient_id",
            [series, tenant, tenant, *exposures, tenant, *conditions]).fetchall()
        return [{"patient_id": pid, "medications": json.loads(medications or "[]"),
                 "measures": {measure: json.loads(points)} if points else {}} for pid, medications, points in rows]

    def key_frequencies(self, tenant: str, keys: list[str]) -> tuple[int, dict[str, int]]:
        db = self._db()
        total = db.execute("SELECT count(*) FROM profiles WHERE tenant=?", (tenant,)).fetchone()[0]
        if not keys:
            return total, {}
        marks = ",".join("?" * len(keys))
        rows = db.execute(f"SELECT key, count(*) FROM profile_keys WHERE tenant=? AND key IN ({marks}) GROUP BY key",
                          [tenant, *keys])
        return total, dict(rows)

    def delete_profile(self, tenant: str, patient_id: str, keep_dimension: int | None = None) -> None:
        with self._transaction() as db:
            kept = 4 * keep_dimension if keep_dimension else -1
            gone = db.execute("DELETE FROM profiles WHERE tenant=? AND patient_id=? AND length(vector) != ?",
                              (tenant, patient_id, kept)).rowcount
            if gone:
                db.execute("DELETE FROM profile_keys WHERE tenant=? AND patient_id=?", (tenant, patient_id))

    def profile_versions(self, tenant: str) -> dict[str, int]:
        rows = self._db().execute("SELECT patient_id, coalesce(json_extract(data, '$.version'), 0) FROM profiles "
                                  "WHERE tenant=?", (tenant,))
        return {pid: int(version) for pid, version in rows}

    def profile_dimensions(self, tenant: str) -> dict[str, list[int]]:
        rows = self._db().execute("SELECT patient_id, length(vector) / 4 FROM profiles WHERE tenant=?", (tenant,))
        return {pid: [size] for pid, size in rows}

    def check(self, tenant: str) -> IndexCheck:
        """Set-based: each table is read once and joined on its keys. The full-text table cannot be
        looked up by chunk id (FTS5 indexes words, not its UNINDEXED columns), so its chunk ids are
        read once into a temporary table first; asking it once per chunk made this quadratic."""
        db = self._db()
        row = db.execute("SELECT value FROM meta WHERE key='dimension'").fetchone()
        vector_bytes = 4 * int(row[0]) if row else 0
        db.execute("DROP TABLE IF EXISTS temp.check_lexical")
        db.execute("CREATE TEMP TABLE check_lexical AS SELECT chunk_id, count(*) AS n FROM chunks_fts WHERE tenant = ? "
                   "GROUP BY chunk_id", (tenant,))
        db.execute("CREATE INDEX temp.check_lexical_chunk ON check_lexical (chunk_id)")
        try:
            counts, problems = self._check_counts(db, tenant, vector_bytes)
        finally:
            db.execute("DROP TABLE IF EXISTS temp.check_lexical")
        actual = dict(db.execute("SELECT patient_id, count(*) FROM chunks WHERE tenant=? GROUP BY patient_id", (tenant,)))
        summaries = {pid: json.loads(data) for pid, data in
                     db.execute("SELECT patient_id, data FROM patients WHERE tenant=?", (tenant,))}
        for patient_id, summary in summaries.items():
            problems += summary_disagreement(patient_id, summary, actual.get(patient_id, 0))
        profile_counts, profile_said, profile_warnings = profile_problems(self.profile_gaps(tenant))
        readings, orphaned = db.execute(
            "SELECT count(*), coalesce(sum(c.chunk_id IS NULL), 0) FROM chunk_readings r LEFT JOIN chunks c "
            "ON c.chunk_id = r.chunk_id WHERE r.tenant = ?", (tenant,)).fetchone()
        # Never read (a reading is looked up by a held chunk), so worth a line, not a failed check.
        orphans = [f"{orphaned} sentence readings belong to chunks the index no longer holds (left by an earlier "
                   f"chartcite): `chartcite check --repair` removes them"] if orphaned else []
        return IndexCheck({**counts, **profile_counts, "sentence readings": readings}, problems + profile_said,
                          profile_warnings + orphans)

    def profile_gaps(self, tenant: str) -> ProfileGaps:
        db = self._db()
        row = db.execute("SELECT value FROM meta WHERE key='dimension'").fetchone()
        holding = {pid for (pid,) in db.execute("SELECT DISTINCT patient_id FROM resources WHERE tenant=?", (tenant,))}
        return profile_gaps(holding, self.profile_dimensions(tenant), int(row[0]) if row else 0,
                            self.profile_versions(tenant), PROFILE_VERSION)

    @staticmethod
    def _check_counts(db, tenant: str, vector_bytes: int) -> tuple[dict, list[str]]:
        """The counts and the disagreements, each one pass over a table or one join."""
        one = lambda sql, *args: db.execute(sql, (*args, tenant)).fetchone()
        chunks, with_vector, pending, wrong_size = one(
            "SELECT count(*), coalesce(sum(length(vector) = ?), 0), coalesce(sum(length(vector) = 0), 0), "
            "coalesce(sum(length(vector) NOT IN (0, ?)), 0) FROM chunks WHERE tenant = ?", vector_bytes, vector_bytes)
        lexical, several = db.execute("SELECT coalesce(sum(n), 0), coalesce(sum(n > 1), 0) FROM check_lexical").fetchone()
        counts = {"chunks": chunks, "lexical rows": lexical, "vectors": with_vector, "vectors pending": pending,
                  "patients": one("SELECT count(*) FROM patients WHERE tenant=?")[0],
                  "source records": one("SELECT count(*) FROM resources WHERE tenant=?")[0]}
        found = {
            "lexical rows without a chunk": db.execute(
                "SELECT coalesce(sum(l.n), 0) FROM check_lexical l LEFT JOIN chunks c ON c.chunk_id = l.chunk_id "
                "WHERE c.chunk_id IS NULL").fetchone()[0],
            "chunks without a lexical row": one(
                "SELECT count(*) FROM chunks c LEFT JOIN check_lexical l ON l.chunk_id = c.chunk_id "
                "WHERE l.chunk_id IS NULL AND c.tenant = ?")[0],
            "chunks with several lexical rows": several,
            "chunks without a vector of the index's dimension": wrong_size,
            PENDING_PROBLEM: pending,
            "reference rows without a chunk": one(
                "SELECT count(*) FROM chunk_refs r LEFT JOIN chunks c ON c.chunk_id = r.chunk_id "
                "WHERE c.chunk_id IS NULL AND r.tenant = ?")[0],
            "concept rows without a chunk": one(
                "SELECT count(*) FROM chunk_concepts k LEFT JOIN chunks c ON c.chunk_id = k.chunk_id "
                "WHERE c.chunk_id IS NULL AND k.tenant = ?")[0],
            "chunks of a patient with no summary": one(
                "SELECT count(*) FROM chunks c LEFT JOIN patients p ON p.tenant = c.tenant AND "
                "p.patient_id = c.patient_id WHERE p.patient_id IS NULL AND c.tenant = ?")[0],
        }
        return counts, [f"{n} {what}" for what, n in found.items() if n]

    def close(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None
            self._local.mapped = False


class ParsedChunks:
    """Chunks parsed from their stored JSON, by (chunk id, rowid, text hash), the least recently
    used forgotten first: a patient's questions read the same chunks again and again (a class's
    500 entries, the notes), and parsing their JSON was most of reading them."""

    def __init__(self, size: int):
        self.size = size
        self.chunks: OrderedDict = OrderedDict()
        self.lock = threading.Lock()

    def get(self, key) -> Chunk | None:
        with self.lock:
            chunk = self.chunks.get(key)
            if chunk is not None:
                self.chunks.move_to_end(key)
            return chunk

    def put(self, key, chunk: Chunk) -> None:
        with self.lock:
            self.chunks[key] = chunk
            while len(self.chunks) > self.size:
                self.chunks.popitem(last=False)


def _fresh(chunk: Chunk) -> Chunk:
    copy = Chunk.__new__(Chunk)
    copy.__dict__.update(chunk.__dict__)
    return copy


def summary_disagreement(patient_id: str, summary: dict, chunks: int) -> list[str]:
    """A patient summary whose chunk count is not what the index holds for that patient."""
    said = sum((summary.get("chunk_counts") or {}).values())
    if said == chunks:
        return []
    return [f"patient {patient_id}: the summary counts {said} chunks, the index holds {chunks}"]
