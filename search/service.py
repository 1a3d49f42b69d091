"""What the command line, the web app and the workers call: one object over model + backend."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from fhir_ingest.load import LoadReport, PatientRecord, load_resources

from .answer import compose
from .backend import Backend, BackendError
from .charts import trend_chart
from .embed import Embedder, load_embedder
from .indexer import IndexResult, index_record
from .pipeline import retrieve

log = logging.getLogger(__name__)


@dataclass
class IndexSummary:
    load: LoadReport
    result: IndexResult


class SearchService:
    def __init__(self, backend_kind: str, index_path: Path, model_path: str = ""):
        self.backend_kind = backend_kind
        self.index_path = Path(index_path)
        self.model_path = model_path or None
        self._embedder: Embedder | None = None
        self._backend: Backend | None = None
        self._catalog: Backend | None = None

    @property
    def embedder(self) -> Embedder:
        if self._embedder is None:
            self._embedder = load_embedder(self.model_path)
        return self._embedder

    @property
    def backend(self) -> Backend:
        if self._backend is None:
            if self.backend_kind == "embedded":
                from .embedded import EmbeddedBackend

                self._backend = EmbeddedBackend(self.index_path, self.embedder.name, self.embedder.dimension)
            else:
                raise BackendError(f"backend {self.backend_kind!r} is not available in this build; "
                                   "use CHARTCITE_BACKEND=embedded")
        return self._backend

    def index_records(self, tenant: str, records: list[PatientRecord],
                      progress: Callable[[str, int, int], None] | None = None) -> IndexResult:
        total = IndexResult()
        for i, record in enumerate(records):
            def patient_progress(phase, done, count, i=i):
                if progress:
                    progress(phase, done, count)
            total.merge(index_record(self.backend, self.embedder, tenant, record, patient_progress))
        return total

    def index_paths(self, tenant: str, paths: list[str | Path],
                    progress: Callable[[str, int, int], None] | None = None) -> IndexSummary:
        records, report = load_resources(paths)
        result = self.index_records(tenant, records, progress)
        return IndexSummary(report, result)

    def ask(self, tenant: str, patient_id: str, question: str, k: int = 5, pipeline: str = "full",
            question_id: str | None = None, ablate: tuple[str, ...] = ()) -> dict:
        retrieval = retrieve(self.backend, self.embedder, question, tenant, patient_id, k=k, pipeline=pipeline,
                             ablate=ablate)
        result = compose(retrieval, patient_id, question_id)
        result["chart"] = None
        if not result["abstained"]:
            cited = {c["ref"] for c in result["citations"]}
            trend = next((e.chunk for e in retrieval.evidence if e.chunk.category == "trend" and e.chunk.ref in cited), None)
            if trend is not None:
                result["chart"] = trend_chart(self.backend, trend)
        return result

    @property
    def catalog(self) -> Backend:
        """The index opened without loading the model: patient lists and source records."""
        if self._backend is not None:
            return self._backend
        if self._catalog is None:
            if self.backend_kind != "embedded":
                return self.backend
            from .embedded import EmbeddedBackend

            self._catalog = EmbeddedBackend(self.index_path, None)
        return self._catalog

    def patients(self, tenant: str) -> list[dict]:
        return self.catalog.list_patients(tenant)

    def patient(self, tenant: str, patient_id: str) -> dict | None:
        return self.catalog.get_patient(tenant, patient_id)

    def resource(self, tenant: str, patient_id: str, ref: str) -> dict | None:
        return self.catalog.get_resource(tenant, patient_id, ref)

    def close(self) -> None:
        for backend in (self._backend, self._catalog):
            if backend is not None:
                backend.close()
