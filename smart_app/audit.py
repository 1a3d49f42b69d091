"""The audit trail: who asked what about which patient, what evidence and answer they got, and
what was refused. Kept in its own database (CHARTCITE_AUDIT_URL; SQLite in the data dir by
default), apart from the application log, which never carries names, MRNs or question text.
Readable from /admin/audit and `chartcite audit`, exportable as JSON lines.

Several processes write it at once (gunicorn workers, a second server on the same data dir): on
SQLite it runs in WAL mode with a busy timeout, as the registry does, and a write that still fails
is tried again. An entry is named outside by a random `ref`, never by its row number, which told
anyone how many questions had been asked and let them guess the next.
"""
from __future__ import annotations

import json
import logging
import secrets
import time
from functools import lru_cache
from pathlib import Path

from sqlalchemy import Float, String, Text, select
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from fhir_ingest.connection.registry import shared_engine
from fhir_ingest.connection.schema import migrate

log = logging.getLogger(__name__)
# Waits between the attempts of a write SQLite still refused after its own busy timeout.
RETRY_SECONDS = (0.2, 1.0, 3.0)
BUSY_SECONDS = 15


class AuditUnavailable(RuntimeError):
    """The trail could not be written: what it was to record must not be shown unrecorded."""

MIGRATIONS = Path(__file__).resolve().parent / "migrations" / "audit"


class Base(DeclarativeBase):
    pass


class AuditEntry(Base):
    __tablename__ = "audit"
    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=True)
    ref: Mapped[str | None] = mapped_column(String(40), unique=True, nullable=True)   # the entry's public name
    at: Mapped[float] = mapped_column(Float, index=True)
    kind: Mapped[str] = mapped_column(String(30))              # ask | refused | draft | draft-saved | launch
    tenant: Mapped[str] = mapped_column(String(40))
    clinician: Mapped[str] = mapped_column(String(300))          # fhirUser
    patient_id: Mapped[str] = mapped_column(String(200), index=True)   # the launch context's patient
    question: Mapped[str] = mapped_column(Text, default="")
    data: Mapped[str] = mapped_column(Text, default="{}")      # evidence refs, stages, answer, removed statements...

    def to_dict(self) -> dict:
        return {"id": self.ref, "at": self.at, "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.at)),
                "kind": self.kind, "tenant": self.tenant, "clinician": self.clinician, "patient_id": self.patient_id,
                "question": self.question, **json.loads(self.data)}


class AuditTrail:
    def __init__(self, url: str):
        migrate(url, MIGRATIONS, "alembic_version_audit")
        self.engine = shared_engine(url, busy_seconds=BUSY_SECONDS)

    def record(self, kind: str, tenant: str, clinician: str, patient_id: str, question: str = "", **data) -> str:
        """The new entry's ref; AuditUnavailable when the trail refused it after every retry."""
        entry = dict(ref=secrets.token_urlsafe(16), at=time.time(), kind=kind, tenant=tenant, clinician=clinician,
                     patient_id=patient_id, question=question, data=json.dumps(data, default=str))
        for wait in (*RETRY_SECONDS, None):
            try:
                self._insert(entry)
                return entry["ref"]
            except OperationalError as exc:
                if wait is None:
                    log.error("the audit trail could not be written: %s", type(exc.orig).__name__)
                    raise AuditUnavailable("the audit trail could not be written") from exc
                time.sleep(wait)
        raise AssertionError("unreachable")

    def _insert(self, entry: dict) -> None:
        with Session(self.engine) as s:
            s.add(AuditEntry(**entry))
            s.commit()

    def entries(self, limit: int = 100, kind: str = "", patient_id: str = "", tenant: str = "",
                since: float = 0.0, clinician: str = "") -> list[dict]:
        with Session(self.engine) as s:
            query = select(AuditEntry).where(AuditEntry.at >= since)
            if clinician:
                query = query.where(AuditEntry.clinician == clinician)
            if kind:
                query = query.where(AuditEntry.kind == kind)
            if patient_id:
                query = query.where(AuditEntry.patient_id == patient_id)
            if tenant:
                query = query.where(AuditEntry.tenant == tenant)
            return [e.to_dict() for e in s.scalars(query.order_by(AuditEntry.id.desc()).limit(limit))]

    def get(self, ref: str) -> dict | None:
        with Session(self.engine) as s:
            entry = s.scalars(select(AuditEntry).where(AuditEntry.ref == ref)).first()
            return entry.to_dict() if entry else None


@lru_cache(maxsize=4)
def open_audit(url: str) -> AuditTrail:
    return AuditTrail(url)
