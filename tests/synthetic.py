"""Synthetic chunks written straight into an index, for measuring what does not depend on their
text (`chartcite check`): no model, no records, any number of patients and chunks."""
from __future__ import annotations

import numpy as np

from fhir_ingest.record.contract import Chunk

DIMENSION = 384
MODEL = "synthetic@384"


def synthetic_chunks(tenant: str, patient_id: str, count: int) -> list[Chunk]:
    words = ("potassium", "metformin", "hypertension", "visit", "allergy", "note", "statin", "glucose")
    return [Chunk(tenant, patient_id, "Observation", f"{patient_id}-{n}", "0",
                  f"{words[n % len(words)]} result {n} of {patient_id}", f"2024-01-01 · Lab · result {n}",
                  date="2024-01-01", semantic_type="lab", refs=[f"Observation/{patient_id}-{n}"],
                  concepts=[{"key": f"C{n % 50}", "display": "x", "semantic_type": "lab", "negated": False}])
            for n in range(count)]


def fill_embedded(backend, tenant: str, patients: int, per_patient: int, seed: int = 7) -> int:
    """`patients` patients of `per_patient` chunks each, with their summaries: a consistent index."""
    from search.indexer import lexical_text

    rng = np.random.default_rng(seed)
    for p in range(patients):
        patient_id = f"p{p:06d}"
        chunks = synthetic_chunks(tenant, patient_id, per_patient)
        vectors = rng.standard_normal((len(chunks), DIMENSION)).astype(np.float32)
        with backend.written_together():
            backend.index(chunks, vectors, [lexical_text(c) for c in chunks])
            backend.upsert_patient(tenant, patient_id, {"patient_id": patient_id, "chunk_counts": {"lab": per_patient},
                                                        "resource_counts": {"Observation": per_patient}})
    return patients * per_patient


def vm_steps(backend, call, every: int = 1) -> int:
    """How many SQLite virtual-machine steps `call` takes on the embedded backend's connection
    (counted every `every` steps): work counted, not timed, so a loaded machine cannot change it."""
    counted = [0]

    def count():
        counted[0] += 1
        return 0

    db = backend._db()
    db.set_progress_handler(count, every)
    try:
        call()
    finally:
        db.set_progress_handler(None, every)
    return counted[0] * every
