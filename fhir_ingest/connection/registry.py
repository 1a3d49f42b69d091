"""What hospital IT registers, and what a launch leaves behind: EHRs, signing keys, encrypted
tokens, pending authorizations and sync cursors. One small database through SQLAlchemy (SQLite in
the data dir by default; CHARTCITE_REGISTRY_URL for PostgreSQL).

Secrets (private keys, access and refresh tokens, PKCE verifiers) are encrypted with Fernet under
the token key from settings before they reach the database.
"""
from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from cryptography.fernet import Fernet, InvalidToken
from sqlalchemy import Float, String, Text, create_engine, delete, select
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from .client_types import CLIENT_AUTH_METHODS, DEFAULT_REQUEST_SCOPES, REQUESTABLE_SCOPES
from .origins import OriginError, is_origin, normalised_origin

NAME_PATTERN = re.compile(r"^[a-z0-9][a-z0-9-]{0,39}$")   # becomes the tenant (and an index name)


class RegistryError(ValueError):
    pass


class Base(DeclarativeBase):
    pass


class Ehr(Base):
    __tablename__ = "ehr"
    name: Mapped[str] = mapped_column(String(40), primary_key=True)
    iss: Mapped[str] = mapped_column(String(500), unique=True)
    client_id: Mapped[str] = mapped_column(String(200))
    scopes: Mapped[str] = mapped_column(String(4), default="v2")          # v1 | v2 scope syntax
    frame_origins: Mapped[str] = mapped_column(Text, default="")         # space separated
    group_id: Mapped[str] = mapped_column(String(200), default="")       # Bulk Data group for background sync
    write_back: Mapped[bool] = mapped_column(default=False)              # ask to write saved drafts back
    created_at: Mapped[float] = mapped_column(Float, default=time.time)
    last_sync_at: Mapped[float] = mapped_column(Float, default=0.0)
    last_sync_status: Mapped[str] = mapped_column(Text, default="never")
    # Before Bulk rounds kept a cursor per (registration, group) in bulk_cursors: kept so that old
    # registries open, neither read nor written (a group's first round after the upgrade is full).
    bulk_since: Mapped[str] = mapped_column(String(40), default="")
    client_auth: Mapped[str] = mapped_column(String(30), default="")     # one of CLIENT_AUTH_METHODS ("" = legacy)
    client_secret: Mapped[str] = mapped_column(Text, default="")         # encrypted; client_secret_basic only
    request_scopes: Mapped[str] = mapped_column(Text, default=DEFAULT_REQUEST_SCOPES)
    secret_encoding: Mapped[str] = mapped_column(String(10), default="form")   # form (RFC 6749) | raw: HTTP Basic
    # Epic sites register background sync as a separate "Backend Systems" app with its own client
    # id; "" = the launch client's id. Its secret, when that app signs in with one (else it signs
    # with chartcite's key, as SMART Backend Services asks).
    backend_client_id: Mapped[str] = mapped_column(String(200), default="")
    backend_client_secret: Mapped[str] = mapped_column(Text, default="")      # encrypted
    # A registration used for background sync only: no clinician launches from it, so its EHR
    # need not offer an authorization endpoint (a Bulk Data server often does not).
    backend_only: Mapped[bool] = mapped_column(default=False)
    # The Bulk export's types, comma separated, when hospital IT narrows them; "" = every kind
    # chartcite reads that the EHR's CapabilityStatement offers.
    bulk_types: Mapped[str] = mapped_column(Text, default="")
    # Similar patients and cohort comparisons over this EHR's tenant (also needs the deployment's
    # CHARTCITE_SIMILAR_PATIENTS): off until hospital IT turns it on.
    similar_patients: Mapped[bool] = mapped_column(default=False)

    @property
    def auth_method(self) -> str:
        return self.client_auth or "private_key_jwt or none (registered before client types)"

    def to_dict(self) -> dict:
        return {"name": self.name, "iss": self.iss, "client_id": self.client_id, "scopes": self.scopes,
                "frame_origins": self.frame_origins.split(), "group_id": self.group_id, "write_back": self.write_back, "similar_patients": self.similar_patients,
                "last_sync_at": self.last_sync_at, "last_sync_status": self.last_sync_status,
                "client_auth": self.auth_method,
                "secret_encoding": self.secret_encoding or "form", "request_scopes": self.request_scopes.split(),
                "backend_client_id": self.backend_client_id or self.client_id, "backend_only": bool(self.backend_only),
                "bulk_types": self.bulk_types.split(",") if self.bulk_types else "derived from the EHR's offer"}


class SigningKey(Base):
    __tablename__ = "signing_key"
    kid: Mapped[str] = mapped_column(String(100), primary_key=True)
    alg: Mapped[str] = mapped_column(String(10))
    private_jwk: Mapped[str] = mapped_column(Text)      # encrypted
    public_jwk: Mapped[str] = mapped_column(Text)
    created_at: Mapped[float] = mapped_column(Float)
    retire_after: Mapped[float] = mapped_column(Float, default=0.0)   # 0 = current; else published until then


class StoredSecret(Base):
    """Encrypted blobs by key: a session's tokens, a pending authorization's verifier."""
    __tablename__ = "secret"
    key: Mapped[str] = mapped_column(String(120), primary_key=True)
    kind: Mapped[str] = mapped_column(String(20))
    data: Mapped[str] = mapped_column(Text)
    expires_at: Mapped[float] = mapped_column(Float)


class PatientSync(Base):
    __tablename__ = "patient_sync"
    tenant: Mapped[str] = mapped_column(String(40), primary_key=True)
    patient_id: Mapped[str] = mapped_column(String(200), primary_key=True)
    synced_at: Mapped[float] = mapped_column(Float)
    server_time: Mapped[str] = mapped_column(String(40))   # the EHR's clock at the start of that sync


@dataclass
class KeyPair:
    kid: str
    alg: str
    private: dict
    public: dict


def normalise_iss(iss: str) -> str:
    return iss.strip().rstrip("/")


def check_origin(origin: str) -> str:
    try:
        return normalised_origin(origin)
    except OriginError as exc:
        raise RegistryError(f"frame origin {exc}") from None


def stored_origins(text: str) -> list[str]:
    """A registration's frame origins as the CSP may use them: one stored before origins were
    checked ("https://x *", "https://x; script-src ...") loses whatever is not an origin."""
    return [o for o in text.split() if is_origin(o)]


def checked_iss(iss: str) -> str:
    parts = urlsplit(iss.strip())
    if parts.scheme not in ("https", "http") or not parts.netloc:
        raise RegistryError(f"--iss must be the EHR's FHIR base URL, not {iss!r}")
    return normalise_iss(iss)


def checked_bulk_types(text: str) -> str:
    """IT's list of Bulk export types ("" or "auto": derived from the EHR's offer), each a kind of
    record chartcite reads; the Patient is always exported (each record hangs on it)."""
    from ..record.kinds import KINDS

    asked = [t.strip() for t in text.replace(" ", ",").split(",") if t.strip()]
    if asked in ([], ["auto"]):
        return ""
    unknown = [t for t in asked if t not in KINDS]
    if unknown:
        raise RegistryError(f"--bulk-types: chartcite does not read {', '.join(unknown)}; it reads "
                            f"{', '.join(sorted(KINDS))} (or 'auto': every one the EHR offers)")
    return ",".join(dict.fromkeys(["Patient", *asked]))


def check_request_scopes(text: str) -> str:
    scopes = text.split()
    unknown = [s for s in scopes if s not in REQUESTABLE_SCOPES]
    if unknown:
        raise RegistryError(f"--request-scopes may hold {', '.join(REQUESTABLE_SCOPES)}; not {', '.join(unknown)} "
                            "(resource scopes follow from --scopes v1/v2)")
    return " ".join(dict.fromkeys(scopes))


def create_tables(engine, metadata) -> None:
    """The tables, created if missing by however many processes start at once (gunicorn workers,
    Celery workers): one that loses the race ("table ... already exists") finds them made."""
    from sqlalchemy.exc import OperationalError, ProgrammingError

    for attempt in range(3):
        try:
            metadata.create_all(engine)
            return
        except (OperationalError, ProgrammingError) as exc:
            if "already exists" not in str(exc) or attempt == 2:
                raise


def shared_engine(url: str, busy_seconds: float = 60):
    """An engine several processes write through at once (web workers, Celery workers, `chartcite
    sync`, a Bulk round's parts): on SQLite, in WAL mode so readers never wait for the writer, and
    a writer waits its turn for up to a minute rather than failing with "database is locked"."""
    from sqlalchemy import event

    if not url.startswith("sqlite"):
        return create_engine(url, future=True, pool_pre_ping=True)
    engine = create_engine(url, future=True, connect_args={"timeout": busy_seconds})

    @event.listens_for(engine, "connect")
    def _wal(connection, _record):
        cursor = connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()

    return engine


MIGRATIONS = Path(__file__).resolve().parent / "migrations"


class Registry:
    def __init__(self, url: str, token_key: str, frame_origins_ttl: float = 30.0):
        from .schema import migrate

        migrate(url, MIGRATIONS / "registry", "alembic_version_registry")
        self.engine = shared_engine(url)
        self.fernet = Fernet(token_key.encode())
        self._frame_origins: tuple[float, dict[str, list[str]]] | None = None
        self.frame_origins_ttl = frame_origins_ttl

    # --- EHRs -------------------------------------------------------------------------------------
    def add_ehr(self, name: str, iss: str, client_id: str, scopes: str = "v2", frame_origins: list[str] = (),
                group_id: str = "", write_back: bool = False, client_auth: str = "private_key_jwt",
                client_secret: str = "", request_scopes: str = DEFAULT_REQUEST_SCOPES,
                secret_encoding: str = "form", **backend) -> Ehr:
        """`backend`: the Backend Services options of `_apply` (backend_client_id,
        backend_client_secret, backend_only, bulk_types)."""
        if not NAME_PATTERN.match(name):
            raise RegistryError("EHR name: lower-case letters, digits and dashes, up to 40 (it names the tenant)")
        if not client_id.strip():
            raise RegistryError("--client-id is required")
        ehr = Ehr(name=name, iss=checked_iss(iss), client_id=client_id.strip(), group_id=group_id,
                  write_back=write_back, created_at=time.time(), last_sync_at=0.0, last_sync_status="never",
                  bulk_since="")
        self._apply(ehr, scopes=scopes, frame_origins=frame_origins, client_auth=client_auth,
                    client_secret=client_secret, request_scopes=request_scopes, secret_encoding=secret_encoding,
                    **backend)
        with Session(self.engine) as s:
            if s.get(Ehr, name) or s.scalar(select(Ehr).where(Ehr.iss == normalise_iss(iss))):
                raise RegistryError(f"an EHR named {name!r} or with that iss is already registered")
            s.add(ehr)
            s.commit()
            s.refresh(ehr)
            s.expunge(ehr)
        self._frame_origins = None
        return ehr

    def update_ehr(self, name: str, **changes) -> Ehr:
        """Change a registration in place (its iss, client type, secret, scopes, frames, group,
        write-back, Backend Services client and types): the EHR's console changes, the tenant and
        its index stay."""
        with Session(self.engine, expire_on_commit=False) as s:
            ehr = s.get(Ehr, name)
            if ehr is None:
                raise RegistryError(f"no EHR named {name!r} (chartcite ehr list)")
            if changes.get("iss") is not None:
                ehr.iss = self._unused_iss(s, name, changes.pop("iss"))
            for plain in ("client_id", "group_id", "write_back", "similar_patients"):
                if changes.get(plain) is not None:
                    setattr(ehr, plain, changes.pop(plain))
            self._apply(ehr, **{k: v for k, v in changes.items() if v is not None})
            s.commit()
        self._frame_origins = None
        return ehr

    def _apply(self, ehr: Ehr, scopes: str | None = None, frame_origins: list[str] | None = None,
               client_auth: str | None = None, client_secret: str | None = None,
               request_scopes: str | None = None, secret_encoding: str | None = None,
               backend_client_id: str | None = None, backend_client_secret: str | None = None,
               backend_only: bool | None = None, bulk_types: str | None = None) -> None:
        """The checked settings of a registration, shared by add and update."""
        self._apply_backend(ehr, backend_client_id, backend_client_secret, backend_only, bulk_types)
        if secret_encoding is not None:
            if secret_encoding not in ("form", "raw"):
                raise RegistryError("--secret-encoding must be form (RFC 6749) or raw")
            ehr.secret_encoding = secret_encoding
        if scopes is not None:
            if scopes not in ("v1", "v2"):
                raise RegistryError("--scopes must be v1 or v2")
            ehr.scopes = scopes
        if frame_origins is not None:
            ehr.frame_origins = " ".join(check_origin(o) for o in frame_origins)
        if request_scopes is not None:
            ehr.request_scopes = check_request_scopes(request_scopes)
        if client_secret:
            ehr.client_secret = self.encrypt({"secret": client_secret})
        if client_auth is not None:
            if client_auth not in CLIENT_AUTH_METHODS:
                raise RegistryError(f"--client-auth must be one of {', '.join(CLIENT_AUTH_METHODS)}")
            ehr.client_auth = client_auth
            if client_auth != "client_secret_basic":
                ehr.client_secret = ""
        if ehr.client_auth == "client_secret_basic" and not ehr.client_secret:
            raise RegistryError("client_secret_basic needs the client secret the EHR issued "
                                "(--client-secret-env NAME_OF_A_VARIABLE_HOLDING_IT)")

    def _apply_backend(self, ehr: Ehr, client_id: str | None, secret: str | None, backend_only: bool | None,
                       bulk_types: str | None) -> None:
        """The Backend Services side of a registration: its own client (id, and secret when it signs
        in with one), whether it serves launches at all, and the Bulk types IT narrowed it to."""
        if client_id is not None:
            ehr.backend_client_id = client_id.strip()
            if not ehr.backend_client_id or ehr.backend_client_id == ehr.client_id:
                ehr.backend_client_id, ehr.backend_client_secret = "", ""
        if secret:
            ehr.backend_client_secret = self.encrypt({"secret": secret})
        if backend_only is not None:
            ehr.backend_only = backend_only
        if bulk_types is not None:
            ehr.bulk_types = checked_bulk_types(bulk_types)

    def client_secret(self, ehr: Ehr) -> str:
        return self.decrypt(ehr.client_secret)["secret"] if ehr.client_secret else ""

    def backend_client_secret(self, ehr: Ehr) -> str:
        return self.decrypt(ehr.backend_client_secret)["secret"] if ehr.backend_client_secret else ""

    @staticmethod
    def _unused_iss(s: Session, name: str, iss: str) -> str:
        checked = checked_iss(iss)
        other = s.scalar(select(Ehr).where(Ehr.iss == checked, Ehr.name != name))
        if other is not None:
            raise RegistryError(f"{checked} is already registered as {other.name!r}")
        return checked

    def remove_ehr(self, name: str) -> bool:
        with Session(self.engine) as s:
            ehr = s.get(Ehr, name)
            if ehr is None:
                return False
            s.delete(ehr)
            s.commit()
        self._frame_origins = None
        return True

    def ehrs(self) -> list[Ehr]:
        with Session(self.engine, expire_on_commit=False) as s:
            return list(s.scalars(select(Ehr).order_by(Ehr.name)))

    def ehr(self, name: str) -> Ehr | None:
        with Session(self.engine, expire_on_commit=False) as s:
            return s.get(Ehr, name)

    def ehr_by_iss(self, iss: str) -> Ehr | None:
        with Session(self.engine, expire_on_commit=False) as s:
            return s.scalar(select(Ehr).where(Ehr.iss == normalise_iss(iss)))

    def frame_origins_by_ehr(self) -> dict[str, list[str]]:
        """Each registered EHR's frame origins. Read on every response (the CSP header), so kept
        for `frame_origins_ttl` seconds (CHARTCITE_FRAME_ORIGINS_CACHE_SECONDS, 30 by default): a
        change made by another process (`chartcite ehr update`) reaches the pages of launches
        already open within that time; a new launch reads them afresh (`forget_frame_origins`), so
        it honours the change at once."""
        if self._frame_origins is None or self._frame_origins[0] < time.monotonic():
            self._frame_origins = (time.monotonic() + self.frame_origins_ttl,
                                   {e.name: stored_origins(e.frame_origins) for e in self.ehrs()})
        return self._frame_origins[1]

    def forget_frame_origins(self) -> None:
        """The next read of the frame origins goes to the registry (a launch starts)."""
        self._frame_origins = None

    def frame_origins(self, name: str | None = None) -> list[str]:
        """The origins that may frame a page of EHR `name`'s launch; every EHR's without a name."""
        by_ehr = self.frame_origins_by_ehr()
        if name is not None:
            return list(by_ehr.get(name, []))
        return sorted({o for origins in by_ehr.values() for o in origins})

    def record_sync(self, name: str, status: str) -> None:
        with Session(self.engine) as s:
            ehr = s.get(Ehr, name)
            if ehr is None:
                return
            ehr.last_sync_at, ehr.last_sync_status = time.time(), status
            s.commit()

    # --- per-patient sync cursors ------------------------------------------------------------------
    def patient_synced(self, tenant: str, patient_id: str) -> PatientSync | None:
        with Session(self.engine, expire_on_commit=False) as s:
            return s.get(PatientSync, (tenant, patient_id))

    def patient_sync_summary(self, tenant: str) -> dict:
        """How many of the tenant's patients were synced one by one (launches), and when last."""
        from sqlalchemy import func

        with Session(self.engine) as s:
            count, last = s.execute(select(func.count(), func.max(PatientSync.synced_at))
                                    .where(PatientSync.tenant == tenant)).one()
        return {"patients": count, "last": last}

    def mark_patient_synced(self, tenant: str, patient_id: str, server_time: str) -> None:
        with Session(self.engine) as s:
            s.merge(PatientSync(tenant=tenant, patient_id=patient_id, synced_at=time.time(), server_time=server_time))
            s.commit()

    # --- signing keys -----------------------------------------------------------------------------
    def add_key(self, pair: KeyPair, overlap_seconds: float) -> None:
        """A new current key; the previous current keys stay published for `overlap_seconds` so
        tokens the EHR cached against them keep verifying."""
        now = time.time()
        with Session(self.engine) as s:
            for old in s.scalars(select(SigningKey).where(SigningKey.alg == pair.alg, SigningKey.retire_after == 0)):
                old.retire_after = now + overlap_seconds
            s.add(SigningKey(kid=pair.kid, alg=pair.alg, private_jwk=self.encrypt(pair.private),
                             public_jwk=json.dumps(pair.public), created_at=now))
            s.commit()

    def prune_keys(self) -> int:
        with Session(self.engine) as s:
            gone = s.execute(delete(SigningKey).where(SigningKey.retire_after > 0,
                                                      SigningKey.retire_after < time.time())).rowcount
            s.commit()
            return gone

    def published_keys(self) -> list[dict]:
        now = time.time()
        with Session(self.engine) as s:
            rows = s.scalars(select(SigningKey).order_by(SigningKey.created_at))
            return [json.loads(k.public_jwk) for k in rows if k.retire_after == 0 or k.retire_after > now]

    def key_rows(self) -> list[dict]:
        with Session(self.engine) as s:
            return [{"kid": k.kid, "alg": k.alg, "created_at": k.created_at, "retire_after": k.retire_after}
                    for k in s.scalars(select(SigningKey).order_by(SigningKey.created_at))]

    def current_key(self, alg: str | None = None) -> KeyPair | None:
        """The newest current key (of `alg` when given)."""
        with Session(self.engine) as s:
            query = select(SigningKey).where(SigningKey.retire_after == 0)
            if alg:
                query = query.where(SigningKey.alg == alg)
            row = s.scalar(query.order_by(SigningKey.created_at.desc()))
            if row is None:
                return None
            return KeyPair(row.kid, row.alg, self.decrypt(row.private_jwk), json.loads(row.public_jwk))

    # --- encrypted secrets ------------------------------------------------------------------------
    def encrypt(self, value: dict) -> str:
        return self.fernet.encrypt(json.dumps(value).encode()).decode()

    def decrypt(self, blob: str) -> dict:
        try:
            return json.loads(self.fernet.decrypt(blob.encode()))
        except InvalidToken as exc:
            raise RegistryError("stored secret cannot be decrypted: was CHARTCITE_TOKEN_KEY changed?") from exc

    def put_secret(self, key: str, kind: str, value: dict, ttl: float) -> None:
        with Session(self.engine) as s:
            s.merge(StoredSecret(key=key, kind=kind, data=self.encrypt(value), expires_at=time.time() + ttl))
            s.commit()

    def get_secret(self, key: str, kind: str) -> dict | None:
        with Session(self.engine) as s:
            row = s.get(StoredSecret, key)
            if row is None or row.kind != kind or row.expires_at < time.time():
                return None
            return self.decrypt(row.data)

    def pop_secret(self, key: str, kind: str) -> dict | None:
        """Read once: an authorization `state` cannot be replayed."""
        with Session(self.engine) as s:
            row = s.get(StoredSecret, key)
            if row is None:
                return None
            s.delete(row)
            s.commit()
            if row.kind != kind or row.expires_at < time.time():
                return None
            return self.decrypt(row.data)
