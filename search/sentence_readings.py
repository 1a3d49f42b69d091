"""Chunks read once: the sentence splits of a chunk's text and the vectors of its sentences,
computed the first time a question (or the warm-up of an opened patient) needs them, then kept in
this process's memory (bounded) and in the index beside the chunk.

Answering reads the evidence's notes sentence by sentence (search/answering/notes.py): PyRuSH
splits each piece of a chunk's text and the embedder compares each sentence with the question;
the sentences an answer quotes are found in every record it cites (a care plan's own words) the
same way. Both depend on the chunk's text alone, not on the question, so neither is done twice
for one text: a question loads what the index keeps of the chunks it reads before answering, and
afterwards keeps what it had to compute. A kept reading is of the chunk text whose digest it
carries: a changed text is read again, and the rows go with their chunk
(EmbeddedBackend.delete_chunks). Splitting every note when it is indexed would cost indexing about
40% more CPU, so a chunk is read when a question (or an opened patient's warm-up) first meets it.
Elasticsearch keeps no readings: there they stay in each process's memory.
"""
from __future__ import annotations

import logging
import queue
import threading
from collections import OrderedDict
from contextlib import contextmanager
from typing import Callable, Iterable

import numpy as np

from fhir_ingest.record.notes import NotRemembered, note_sentences, only_remembered, remember_splits, \
    remembered_splits, splits_made
from search.answering.notes import EMBEDDED_TEXTS, split_texts
from search.backends.base import Backend, Scope, StoredReading, text_digest

log = logging.getLogger(__name__)

# Sentence vectors remembered by a process: 384 float32 each, about 15 MB (a patient with 100 note
# chunks has some 1,200 sentences).
VECTORS_KEPT = 10_000
# Chunks whose kept reading this process knows (loaded or written), so it asks the index once:
# with the texts it split and embedded, about 3 kB each, so about 12 MB.
CHUNKS_KNOWN = 4096
# Note chunks an opened patient's warm-up reads: the newest (class answers read the newest 50). At
# most about 5 s of one core for a patient with many notes, on a background thread.
WARM_NOTE_CHUNKS = 100
WARM_BATCH = 10                 # chunks embedded (and kept) together


class _Lru:
    """A bounded map, the least recently used forgotten first; safe across answering threads."""

    def __init__(self, size: int):
        self.size = size
        self.items: OrderedDict = OrderedDict()
        self.lock = threading.Lock()

    def get(self, key):
        with self.lock:
            value = self.items.get(key)
            if value is not None:
                self.items.move_to_end(key)
            return value

    def put(self, key, value) -> None:
        with self.lock:
            self.items[key] = value
            self.items.move_to_end(key)
            while len(self.items) > self.size:
                self.items.popitem(last=False)


def _distinct(chunks: Iterable) -> list:
    return list({c.chunk_id: c for c in chunks}.values())


class SentenceReadings:
    """One per service: its embedder's sentence vectors, and what its index keeps of its chunks'
    readings."""

    def __init__(self, backend: Callable[[], Backend], embedder: Callable[[], object]):
        self._backend, self._embedder = backend, embedder
        self.vectors = _Lru(VECTORS_KEPT)
        self.embedded = 0           # texts embedded so far (with splits_made: has anything new been computed?)
        # chunk id -> (digest of its text, texts split, texts embedded) as the index keeps them.
        self.known = _Lru(CHUNKS_KNOWN)
        self.looked_at = _Lru(CHUNKS_KNOWN)     # (chunk id, text digest) whose reading keep() has looked at

    # --- the question's side ----------------------------------------------------------------
    def similarity(self, question_vector: np.ndarray) -> Callable[[list[str]], list[float]]:
        """Cosine similarity of texts to the question: texts met before are not embedded again."""
        question = _unit(np.asarray(question_vector, dtype=np.float32))

        def similarity(texts: list[str]) -> list[float]:
            vectors = self.vectors_of(texts)
            if not texts:
                return []
            return (np.stack([vectors[t] for t in texts]) @ question).tolist()
        return similarity

    def vectors_of(self, texts: list[str]) -> dict[str, np.ndarray]:
        """Each text's unit vector, embedding (in one call) only those not remembered."""
        found = {t: v for t in dict.fromkeys(texts) for v in (self.vectors.get(t),) if v is not None}
        missing = [t for t in dict.fromkeys(texts) if t not in found]
        if missing:
            with self.known.lock:
                self.embedded += len(missing)
            for text, vector in zip(missing, self._embedder().encode(missing)):
                found[text] = _unit(vector)
                self.vectors.put(text, found[text])
        return found

    def load(self, tenant: str, chunks: Iterable) -> None:
        """What the index keeps of these chunks' readings, into memory: asked once per chunk text
        and process."""
        unread = [c for c in _distinct(chunks) if not self._in_memory(c)]
        if not unread or not self._backend().keeps_readings:
            return
        model = self._embedder().name
        kept = self._backend().get_readings(tenant, [c.chunk_id for c in unread])
        for chunk in unread:
            digest, row = text_digest(chunk.text), kept.get(chunk.chunk_id)
            if row is None or row.text_digest != digest:
                self.known.put(chunk.chunk_id, (digest, frozenset(), frozenset()))
                continue
            remember_splits(row.splits)
            texts = row.texts if row.model == model else []
            for text, vector in zip(texts, row.vectors):
                self.vectors.put(text, vector)
            self.known.put(chunk.chunk_id, (digest, frozenset(row.splits), frozenset(texts)))

    def _in_memory(self, chunk) -> bool:
        """What the index keeps of the chunk is in this process's memory still (none forgotten)."""
        known = self.known.get(chunk.chunk_id)
        if known is None or known[0] != text_digest(chunk.text):
            return False
        return len(remembered_splits(known[1])) == len(known[1]) and all(self.vectors.get(t) is not None
                                                                          for t in known[2])

    def computed(self) -> tuple[int, int]:
        """How much this process has split and embedded so far: compare before and after a question."""
        return splits_made(), self.embedded

    def keep(self, tenant: str, chunks: Iterable, since: tuple[int, int] | None = None) -> int:
        """What this process has computed of these chunks' readings and the index does not
        yet keep, written beside them (nothing is split or embedded for it); `since`: computed()
        before the question, when nothing new since means nothing to look for. Returns the chunks
        written."""
        if not self._backend().keeps_readings:
            return 0
        chunks = _distinct(chunks)
        if since is not None and since == self.computed():
            # Nothing new computed: only a chunk met for the first time may have something to
            # keep (its text read for another chunk: templated notes share their sections).
            chunks = [c for c in chunks if self.looked_at.get((c.chunk_id, text_digest(c.text))) is None]
        for chunk in chunks:
            self.looked_at.put((chunk.chunk_id, text_digest(chunk.text)), True)
        rows = [row for row in (self._reading(chunk) for chunk in chunks) if row is not None]
        if rows and self._backend().put_readings(tenant, rows):
            for row in rows:
                self.known.put(row.chunk_id, (row.text_digest, frozenset(row.splits), frozenset(row.texts)))
            return len(rows)
        return 0

    def _reading(self, chunk) -> StoredReading | None:
        """The chunk's reading as this process holds it, when it holds more than the index keeps."""
        digest = text_digest(chunk.text)
        splits = remembered_splits(split_texts(chunk))
        vectors: dict[str, np.ndarray] = {}
        for texts_of in EMBEDDED_TEXTS:
            try:
                with only_remembered():        # the sentences this process has split, no others
                    texts = texts_of(chunk)
            except NotRemembered:
                continue
            vectors.update((t, v) for t in texts for v in (self.vectors.get(t),) if v is not None)
        known = self.known.get(chunk.chunk_id)
        if known and known[0] == digest and set(splits) <= known[1] and set(vectors) <= known[2]:
            return None
        if not splits and not vectors:
            return None
        matrix = np.stack(list(vectors.values())) if vectors else np.zeros((0, 0), dtype=np.float32)
        return StoredReading(chunk.chunk_id, digest, self._embedder().name,
                             {text: [list(span) for span in spans] for text, spans in splits.items()},
                             list(vectors), matrix)

    # --- an opened patient ------------------------------------------------------------------
    def warm(self, tenant: str, patient_id: str, pause: Callable[[], None] = lambda: None) -> int:
        """The patient's newest note chunks read now (kept readings loaded, the rest split and
        embedded, and kept), so a first question about the notes finds them ready; `pause` is
        called before each piece of work (it waits while a question is answered). Returns the
        note chunks read."""
        backend = self._backend()
        hits = backend.latest(Scope(tenant, patient_id, semantic_types=("note",)), WARM_NOTE_CHUNKS)
        chunks = backend.get_chunks(tenant, [h.chunk_id for h in hits])
        for start in range(0, len(chunks), WARM_BATCH):
            batch = chunks[start:start + WARM_BATCH]
            self.load(tenant, batch)
            for chunk in batch:
                pause()
                for text in split_texts(chunk):
                    note_sentences(text)
            pause()
            self.vectors_of([t for chunk in batch for texts_of in EMBEDDED_TEXTS for t in texts_of(chunk)])
            self.keep(tenant, batch)
        return len(chunks)


def _unit(vector: np.ndarray) -> np.ndarray:
    vector = np.asarray(vector, dtype=np.float32)
    return vector / max(float(np.linalg.norm(vector)), 1e-9)


class Warmer:
    """Reads opened patients' notes on one background thread, one patient at a time, each record
    once as it stands (`key`: what it was read as, e.g. its chunk count): opening the same patient
    again, or a second frame, queues nothing more."""

    def __init__(self, warm: Callable[[str, str], int]):
        self._warm = warm
        self._queue: queue.Queue = queue.Queue()
        self._seen = _Lru(CHUNKS_KNOWN)       # patients queued, by the record as it stood
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def soon(self, tenant: str, patient_id: str, key: object) -> bool:
        """Queued unless this record, as `key` says it stands, was queued before."""
        with self._lock:
            if self._seen.get((tenant, patient_id)) == key:
                return False
            self._seen.put((tenant, patient_id), key)
            if self._thread is None:
                # A daemon: a process that stops does not wait for a warm-up nobody asked for.
                self._thread = threading.Thread(target=self._work, name="chartcite-notes", daemon=True)
                self._thread.start()
        self._queue.put((tenant, patient_id))
        return True

    def wait(self) -> None:
        """Until everything queued is read (tests)."""
        self._queue.join()

    def _work(self) -> None:
        while True:
            tenant, patient_id = self._queue.get()
            try:
                self._warm(tenant, patient_id)
            except Exception:       # a warm-up is an optimisation: the question reads the notes itself
                log.exception("reading an opened patient's notes ahead failed")
            finally:
                self._queue.task_done()


class QuestionsUnderWay:
    """How many questions are being answered, so background reading can wait for none."""

    def __init__(self):
        self.count = 0
        self.idle = threading.Condition()

    @contextmanager
    def one(self):
        with self.idle:
            self.count += 1
        try:
            yield
        finally:
            with self.idle:
                self.count -= 1
                self.idle.notify_all()

    def wait_for_none(self) -> None:
        with self.idle:
            self.idle.wait_for(lambda: self.count == 0)

