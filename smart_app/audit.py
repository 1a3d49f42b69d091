"""The audit trail: who asked what about which patient, what evidence and answer they got, and
what was refused. Kept in its own database (CHARTCITE_AUDIT_URL; SQLite in the data dir by
default), apart from the application log, which never carries names, MRNs or question text.
Readable from /admin/audit and `chartcite audit`, exportable as JSON lines.
"""
from __future__ import annotations

import json
import time
from functools import lru_cache
from pathlib import Path

from sqlalchemy import Float, String, Text, create_engine, select
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from fhir_ingest.connection.schema import migrate


MIGRATIONS = Path(__file__).resolve().parent / "migrations" / "audit"


class Base(DeclarativeBase):
    pass


class AuditEntry(Base):
    __tablename__ = "audit"
    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=True)
    at: Mapped[float] = mapped_column(Float, index=True)
    kind: Mapped[str] = mapped_column(String(30))              # ask | refused | draft | draft-saved | launch
    tenant: Mapped[str] = mapped_column(String(40))
    clinician: Mapped[str] = mapped_column(String(300))          # fhirUser
    patient_id: Mapped[str] = mapped_column(String(200), index=True)   # the launch context's patient
    question: Mapped[str] = mapped_column(Text, default="")
    data: Mapped[str] = mapped_column(Text, default="{}")      # evidence refs, stages, answer, removed statements...

    def to_dict(self) -> dict:
        return {"id": self.id, "at": self.at, "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.at)),
                "kind": self.kind, "tenant": self.tenant, "clinician": self.clinician, "patient_id": self.patient_id,
                "question": self.question, **json.loads(self.data)}


class AuditTrail:
    def __init__(self, url: str):
        migrate(url, MIGRATIONS, "alembic_version_audit")
        self.engine = create_engine(url, future=True)

    def record(self, kind: str, tenant: str, clinician: str, patient_id: str, question: str = "", **data) -> int:
        with Session(self.engine) as s:
            entry = AuditEntry(at=time.time(), kind=kind, tenant=tenant, clinician=clinician, patient_id=patient_id,
                               question=question, data=json.dumps(data, default=str))
            s.add(entry)
            s.commit()
            return entry.id

    def entries(self, limit: int = 100, kind: str = "", patient_id: str = "", tenant: str = "",
                since: float = 0.0) -> list[dict]:
        with Session(self.engine) as s:
            query = select(AuditEntry).where(AuditEntry.at >= since)
            if kind:
                query = query.where(AuditEntry.kind == kind)
            if patient_id:
                query = query.where(AuditEntry.patient_id == patient_id)
            if tenant:
                query = query.where(AuditEntry.tenant == tenant)
            return [e.to_dict() for e in s.scalars(query.order_by(AuditEntry.id.desc()).limit(limit))]

    def get(self, entry_id: int) -> dict | None:
        with Session(self.engine) as s:
            entry = s.get(AuditEntry, entry_id)
            return entry.to_dict() if entry else None


@lru_cache(maxsize=4)
def open_audit(url: str) -> AuditTrail:
    return AuditTrail(url)
