"""The state of Bulk Data rounds, kept in the registry database so every process of a deployment
(`chartcite sync`, Celery workers on any host, beat) sees the same: one cursor per (registration,
group), one lease per (registration, group) so two syncs never run at once, and each round's
manifest, files and parts with their states, so a round survives the process that started it.

- A **cursor** is the transactionTime of the last round of that group that completed: every file
  read and indexed. Nothing else moves it.
- A **lease** expires unless its holder renews it; a holder that dies (SIGKILL, a lost host)
  lets go by itself, and the next sync resumes its round.
- A **round** goes exporting → downloading → indexing → done, or ends abandoned (the EHR dropped
  the export, its files expired, a full round superseded it). Its **files** are downloaded one by
  one and resumed where a transfer broke; its **parts** (groups of patients) are indexed as
  separate tasks on any worker, each claimed by one worker at a time, and the part that finishes
  last finishes the round.
"""
from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass

from sqlalchemy import Float, Integer, String, Text, func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from .registry import MIGRATIONS
from .schema import migrate

OPEN_STATES = ("exporting", "downloading", "indexing", "finishing")
# A round whose files the EHR no longer serves is of no use: started longer ago than this, it is
# abandoned rather than resumed (the Bulk Data files of most EHRs expire within a day).
ROUND_MAX_AGE = 20 * 3600.0


class Base(DeclarativeBase):
    """The round tables, in the registry's database beside the registrations."""


class BulkCursor(Base):
    __tablename__ = "bulk_cursor"
    tenant: Mapped[str] = mapped_column(String(40), primary_key=True)
    group_id: Mapped[str] = mapped_column(String(200), primary_key=True)
    since: Mapped[str] = mapped_column(String(40), default="")        # transactionTime of the last complete round
    reach_back: Mapped[float] = mapped_column(Float, default=0.0)     # seconds the next _since reaches back
    updated_at: Mapped[float] = mapped_column(Float, default=0.0)


class SyncLease(Base):
    __tablename__ = "sync_lease"
    tenant: Mapped[str] = mapped_column(String(40), primary_key=True)
    group_id: Mapped[str] = mapped_column(String(200), primary_key=True)
    holder: Mapped[str] = mapped_column(String(100))
    expires_at: Mapped[float] = mapped_column(Float)
    taken_at: Mapped[float] = mapped_column(Float)


class BulkRound(Base):
    __tablename__ = "bulk_round"
    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    tenant: Mapped[str] = mapped_column(String(40), index=True)
    group_id: Mapped[str] = mapped_column(String(200))
    full: Mapped[bool] = mapped_column(default=False)        # asked without _since: each record whole
    allow_removals: Mapped[bool] = mapped_column(default=False)   # removals over the budget carried out (--allow-removals)
    since: Mapped[str] = mapped_column(String(40), default="")
    state: Mapped[str] = mapped_column(String(20), default="exporting")
    status_url: Mapped[str] = mapped_column(Text, default="")
    transaction_time: Mapped[str] = mapped_column(String(40), default="")
    types: Mapped[str] = mapped_column(Text, default="")
    manifest: Mapped[str] = mapped_column(Text, default="{}")
    deleted: Mapped[str] = mapped_column(Text, default="[]")       # Type/id the EHR lists as deleted
    notes: Mapped[str] = mapped_column(Text, default="[]")         # sentences for the person who runs it
    export_errors: Mapped[str] = mapped_column(Text, default="[]")  # what the EHR could not export, its words
    summary: Mapped[str] = mapped_column(Text, default="{}")
    lease_holder: Mapped[str] = mapped_column(String(100), default="")   # whose lease the round's work renews
    started_at: Mapped[float] = mapped_column(Float, default=time.time)
    updated_at: Mapped[float] = mapped_column(Float, default=time.time)


class BulkFile(Base):
    __tablename__ = "bulk_file"
    round_id: Mapped[str] = mapped_column(String(40), primary_key=True)
    n: Mapped[int] = mapped_column(Integer, primary_key=True)
    kind: Mapped[str] = mapped_column(String(10))             # output | deleted | error
    type: Mapped[str] = mapped_column(String(60), default="")
    url: Mapped[str] = mapped_column(Text)
    state: Mapped[str] = mapped_column(String(10), default="pending")   # pending | done | failed
    lines: Mapped[int] = mapped_column(Integer, default=0)    # lines read and staged so far
    bytes: Mapped[int] = mapped_column(Integer, default=0)    # ... and the bytes they took: where to resume
    validator: Mapped[str] = mapped_column(Text, default="")  # ETag or Last-Modified they came with (If-Range)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    error: Mapped[str] = mapped_column(Text, default="")
    report: Mapped[str] = mapped_column(Text, default="{}")   # what reading the file found (counts, skips)


class BulkPart(Base):
    __tablename__ = "bulk_part"
    round_id: Mapped[str] = mapped_column(String(40), primary_key=True)
    n: Mapped[int] = mapped_column(Integer, primary_key=True)
    patients: Mapped[str] = mapped_column(Text)               # JSON list of patient ids
    state: Mapped[str] = mapped_column(String(10), default="pending")   # pending | running | done | failed
    claimed_by: Mapped[str] = mapped_column(String(100), default="")
    claimed_until: Mapped[float] = mapped_column(Float, default=0.0)
    completions: Mapped[int] = mapped_column(Integer, default=0)
    claimed_at: Mapped[float] = mapped_column(Float, default=0.0)   # when its last claim began
    done_at: Mapped[float] = mapped_column(Float, default=0.0)
    error: Mapped[str] = mapped_column(Text, default="")
    result: Mapped[str] = mapped_column(Text, default="{}")


@dataclass
class LeaseHeld:
    """Someone else holds the (registration, group): who and until when."""
    holder: str
    expires_at: float


def holder_name() -> str:
    """Who holds a lease or a claim: host and process, so a person can tell which sync it is."""
    import os
    import socket

    return f"{socket.gethostname()}:{os.getpid()}"


class Rounds:
    """Leases, cursors, rounds, files and parts, each change one short transaction, atomic across
    processes (compare-and-set updates: on SQLite and PostgreSQL alike)."""

    def __init__(self, engine):
        self.engine = engine
        migrate(engine.url.render_as_string(hide_password=False), MIGRATIONS / "rounds", "alembic_version_rounds")

    # --- leases -------------------------------------------------------------------------------------
    def take_lease(self, tenant: str, group_id: str, holder: str, seconds: float) -> LeaseHeld | None:
        """The lease for (tenant, group) to `holder` for `seconds`, unless another holds it unexpired:
        then who does. A holder may take its own lease again (a resumed round)."""
        now = time.time()
        with Session(self.engine) as s:
            try:
                s.add(SyncLease(tenant=tenant, group_id=group_id, holder=holder, expires_at=now + seconds, taken_at=now))
                s.commit()
                return None
            except IntegrityError:
                s.rollback()
            taken = s.execute(update(SyncLease).where(
                SyncLease.tenant == tenant, SyncLease.group_id == group_id,
                (SyncLease.expires_at < now) | (SyncLease.holder == holder)).values(
                holder=holder, expires_at=now + seconds, taken_at=now)).rowcount
            s.commit()
            if taken:
                return None
            row = s.get(SyncLease, (tenant, group_id))
            return LeaseHeld(row.holder, row.expires_at) if row else None

    def renew_lease(self, tenant: str, group_id: str, holder: str, seconds: float) -> bool:
        """False when the lease is no longer this holder's (it expired and another took it)."""
        with Session(self.engine) as s:
            renewed = s.execute(update(SyncLease).where(
                SyncLease.tenant == tenant, SyncLease.group_id == group_id, SyncLease.holder == holder).values(
                expires_at=time.time() + seconds)).rowcount
            s.commit()
            return bool(renewed)

    def renew_round_lease(self, round_id: str, seconds: float) -> bool:
        """The lease of the round's (registration, group), renewed by whichever worker is working on
        the round for whoever holds it for the round; False when another holder took it over."""
        row = self.round(round_id)
        return row is not None and self.renew_lease(row.tenant, row.group_id, row.lease_holder, seconds)

    def release_lease(self, tenant: str, group_id: str, holder: str) -> None:
        with Session(self.engine) as s:
            s.execute(update(SyncLease).where(
                SyncLease.tenant == tenant, SyncLease.group_id == group_id, SyncLease.holder == holder).values(
                expires_at=0.0))
            s.commit()

    # --- cursors ------------------------------------------------------------------------------------
    def cursor(self, tenant: str, group_id: str) -> BulkCursor | None:
        with Session(self.engine, expire_on_commit=False) as s:
            return s.get(BulkCursor, (tenant, group_id))

    def cursors(self, tenant: str) -> list[BulkCursor]:
        with Session(self.engine, expire_on_commit=False) as s:
            return list(s.scalars(select(BulkCursor).where(BulkCursor.tenant == tenant).order_by(BulkCursor.group_id)))

    def advance_cursor(self, tenant: str, group_id: str, since: str, reach_back: float) -> None:
        with Session(self.engine) as s:
            s.merge(BulkCursor(tenant=tenant, group_id=group_id, since=since, reach_back=reach_back,
                               updated_at=time.time()))
            s.commit()

    # --- rounds -------------------------------------------------------------------------------------
    def open_round(self, tenant: str, group_id: str) -> BulkRound | None:
        with Session(self.engine, expire_on_commit=False) as s:
            return s.scalar(select(BulkRound).where(BulkRound.tenant == tenant, BulkRound.group_id == group_id,
                                                    BulkRound.state.in_(OPEN_STATES))
                            .order_by(BulkRound.started_at.desc()))

    def new_round(self, tenant: str, group_id: str, since: str, notes: list[str], lease_holder: str,
                  allow_removals: bool = False) -> BulkRound:
        """A round from `since` ("" = a full round: each patient's record is the export's)."""
        now = time.time()
        row = BulkRound(id=uuid.uuid4().hex, tenant=tenant, group_id=group_id, full=not since, since=since,
                        allow_removals=allow_removals,
                        state="exporting", notes=json.dumps(notes), started_at=now, updated_at=now,
                        lease_holder=lease_holder)
        with Session(self.engine, expire_on_commit=False) as s:
            s.add(row)
            s.commit()
        return row

    def round(self, round_id: str) -> BulkRound | None:
        with Session(self.engine, expire_on_commit=False) as s:
            return s.get(BulkRound, round_id)

    def rounds(self, tenant: str, limit: int = 20) -> list[BulkRound]:
        with Session(self.engine, expire_on_commit=False) as s:
            return list(s.scalars(select(BulkRound).where(BulkRound.tenant == tenant)
                                  .order_by(BulkRound.started_at.desc()).limit(limit)))

    def update_round(self, round_id: str, **values) -> None:
        with Session(self.engine) as s:
            s.execute(update(BulkRound).where(BulkRound.id == round_id).values(updated_at=time.time(), **values))
            s.commit()

    def move_round(self, round_id: str, from_state: str, to_state: str) -> bool:
        """Compare and set: True for the one caller that moved the round (the finisher)."""
        with Session(self.engine) as s:
            moved = s.execute(update(BulkRound).where(BulkRound.id == round_id, BulkRound.state == from_state)
                              .values(state=to_state, updated_at=time.time())).rowcount
            s.commit()
            return bool(moved)

    def add_note(self, round_id: str, note: str) -> None:
        with Session(self.engine) as s:
            row = s.get(BulkRound, round_id)
            if row is not None and note not in json.loads(row.notes):
                row.notes = json.dumps(json.loads(row.notes) + [note])
                s.commit()

    # --- files --------------------------------------------------------------------------------------
    def add_files(self, round_id: str, files: list[tuple[str, str, str]]) -> None:
        """(kind, type, url) of each file the manifest lists, numbered in its order."""
        with Session(self.engine) as s:
            for n, (kind, rtype, url) in enumerate(files):
                s.merge(BulkFile(round_id=round_id, n=n, kind=kind, type=rtype, url=url, state="pending",
                                 lines=0, bytes=0, validator="", attempts=0, error="", report="{}"))
            s.commit()

    def files(self, round_id: str, kind: str | None = None) -> list[BulkFile]:
        with Session(self.engine, expire_on_commit=False) as s:
            query = select(BulkFile).where(BulkFile.round_id == round_id)
            if kind:
                query = query.where(BulkFile.kind == kind)
            return list(s.scalars(query.order_by(BulkFile.n)))

    def update_file(self, round_id: str, n: int, **values) -> None:
        with Session(self.engine) as s:
            s.execute(update(BulkFile).where(BulkFile.round_id == round_id, BulkFile.n == n).values(**values))
            s.commit()

    # --- parts --------------------------------------------------------------------------------------
    def add_parts(self, round_id: str, groups: list[list[str]]) -> None:
        with Session(self.engine) as s:
            for n, patients in enumerate(groups):
                s.merge(BulkPart(round_id=round_id, n=n, patients=json.dumps(patients), state="pending",
                                 claimed_by="", claimed_until=0.0, completions=0, error="", result="{}"))
            s.commit()

    def parts(self, round_id: str) -> list[BulkPart]:
        with Session(self.engine, expire_on_commit=False) as s:
            return list(s.scalars(select(BulkPart).where(BulkPart.round_id == round_id).order_by(BulkPart.n)))

    def claim_part(self, round_id: str, n: int, holder: str, seconds: float) -> str:
        """"claimed" when this holder may index the part now; else what it is: "done", or
        "busy" (another worker holds an unexpired claim on it)."""
        now = time.time()
        with Session(self.engine) as s:
            claimed = s.execute(update(BulkPart).where(
                BulkPart.round_id == round_id, BulkPart.n == n, BulkPart.state != "done",
                (BulkPart.state != "running") | (BulkPart.claimed_until < now) | (BulkPart.claimed_by == holder))
                .values(state="running", claimed_by=holder, claimed_until=now + seconds, claimed_at=now,
                        error="")).rowcount
            s.commit()
            if claimed:
                return "claimed"
            part = s.get(BulkPart, (round_id, n))
            return "done" if part is None or part.state == "done" else "busy"

    def renew_claim(self, round_id: str, n: int, holder: str, seconds: float) -> bool:
        with Session(self.engine) as s:
            renewed = s.execute(update(BulkPart).where(
                BulkPart.round_id == round_id, BulkPart.n == n, BulkPart.claimed_by == holder,
                BulkPart.state == "running").values(claimed_until=time.time() + seconds)).rowcount
            s.commit()
            return bool(renewed)

    def finish_part(self, round_id: str, n: int, holder: str, result: dict) -> tuple[bool, int]:
        """The part done (by its holder only); (whether it was this call that did it, and how many
        parts of the round are not done yet)."""
        with Session(self.engine) as s:
            done = s.execute(update(BulkPart).where(
                BulkPart.round_id == round_id, BulkPart.n == n, BulkPart.claimed_by == holder,
                BulkPart.state == "running").values(state="done", claimed_until=0.0, result=json.dumps(result),
                                                    done_at=time.time(),
                                                    completions=BulkPart.completions + 1)).rowcount
            s.commit()
            left = s.scalar(select(func.count()).select_from(BulkPart).where(
                BulkPart.round_id == round_id, BulkPart.state != "done"))
            return bool(done), int(left or 0)

    def fail_part(self, round_id: str, n: int, holder: str, error: str, retrying: bool = False) -> None:
        """The part let go with its error: "pending" again when its task will be retried (the EHR or
        the index was briefly unavailable), else "failed" until the next sync of the group."""
        with Session(self.engine) as s:
            s.execute(update(BulkPart).where(BulkPart.round_id == round_id, BulkPart.n == n,
                                             BulkPart.claimed_by == holder)
                      .values(state="pending" if retrying else "failed", claimed_until=0.0, error=error[:500]))
            s.commit()

    def delete_round_rows(self, tenant: str) -> None:
        """A registration removed: its rounds, cursors and lease go with it."""
        from sqlalchemy import delete

        with Session(self.engine) as s:
            ids = [r for r in s.scalars(select(BulkRound.id).where(BulkRound.tenant == tenant))]
            for table in (BulkFile, BulkPart):
                s.execute(delete(table).where(table.round_id.in_(ids)))
            for table in (BulkRound, BulkCursor, SyncLease):
                s.execute(delete(table).where(table.tenant == tenant))
            s.commit()
