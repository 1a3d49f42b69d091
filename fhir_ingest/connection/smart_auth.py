"""Talking to an EHR's SMART authorization server, client side: discovery, the scopes chartcite
asks for, how it authenticates at the token endpoint (private_key_jwt, client_secret_basic or
public), and token providers that renew a session's or chartcite's own (Backend Services) tokens.
The interactive launch (authorize, callback, id_token) is the web app's: smart_app/smart.py.

Everything secret stays server-side, encrypted in the registry.
"""
from __future__ import annotations

import logging
import threading
import time

import requests
from authlib.integrations.requests_client import OAuth2Session

from .client import AuthExpired
from .client_auth import ClientAuthError, client_auth_for
from ..record.kinds import PATIENT_SEARCHES, REFERENCED_TYPES
from .registry import DEFAULT_REQUEST_SCOPES, Ehr, Registry

log = logging.getLogger(__name__)

DISCOVERY_TTL = 3600
DISCOVERY_TIMEOUT = 5
SESSION_TOKEN_TTL = 12 * 3600
REFRESH_MARGIN = 60               # refresh this long before the access token expires
SCOPED_TYPES = ("Patient",) + tuple(PATIENT_SEARCHES) + tuple(t for t in REFERENCED_TYPES if t != "Patient")


class LaunchError(RuntimeError):
    """A launch cannot go on; the message is safe to show the clinician."""


# --- discovery ------------------------------------------------------------------------------------

_discovery: dict[str, tuple[float, dict]] = {}
_discovery_lock = threading.Lock()


def discover(iss: str) -> dict:
    """`{iss}/.well-known/smart-configuration`, cached for an hour, with a short timeout."""
    now = time.time()
    with _discovery_lock:
        cached = _discovery.get(iss)
        if cached and cached[0] > now:
            return cached[1]
    url = iss.rstrip("/") + "/.well-known/smart-configuration"
    try:
        response = requests.get(url, headers={"Accept": "application/json"}, timeout=DISCOVERY_TIMEOUT)
        response.raise_for_status()
        config = response.json()
    except (requests.RequestException, ValueError) as exc:
        raise LaunchError(f"the EHR's SMART configuration could not be read ({type(exc).__name__})") from exc
    if not config.get("token_endpoint"):
        raise LaunchError("the EHR's SMART configuration names no token endpoint")
    with _discovery_lock:
        _discovery[iss] = (now + DISCOVERY_TTL, config)
    return config


def forget_discovery() -> None:
    with _discovery_lock:
        _discovery.clear()


# --- scopes ---------------------------------------------------------------------------------------

def resource_scopes(context: str, syntax: str) -> list[str]:
    """`patient/Observation.read` (v1) or `patient/Observation.rs` (v2) for each type chartcite reads."""
    suffix = "read" if syntax == "v1" else "rs"
    return [f"{context}/{t}.{suffix}" for t in SCOPED_TYPES]


def write_scope(syntax: str) -> str:
    return "patient/DocumentReference." + ("write" if syntax == "v1" else "c")


def launch_scopes(syntax: str, standalone: bool, write_back: bool = False,
                  request_scopes: str = DEFAULT_REQUEST_SCOPES) -> str:
    """What a launch asks for: the launch context, the registration's identity and refresh scopes,
    and read access to each type chartcite indexes."""
    return " ".join(["launch/patient" if standalone else "launch", *request_scopes.split(),
                     *resource_scopes("patient", syntax), *([write_scope(syntax)] if write_back else [])])


def scopes_for(ehr: Ehr, standalone: bool) -> str:
    return launch_scopes(ehr.scopes, standalone, ehr.write_back, ehr.request_scopes or DEFAULT_REQUEST_SCOPES)


def can_write_documents(granted: str) -> bool:
    """Did the EHR grant creating DocumentReferences (v1 write, v2 c, or a wildcard)?"""
    for scope in granted.split():
        context, _, rest = scope.partition("/")
        rtype, _, access = rest.partition(".")
        if context in ("patient", "user") and rtype in ("DocumentReference", "*") and \
                (access in ("write", "*") or (access and set(access) <= set("cruds") and "c" in access)):
            return True
    return False


def system_scopes(syntax: str, types: list[str] | tuple[str, ...] | None = None) -> str:
    """Backend Services scopes: for `types` (a Bulk round asks for what it exports), else for every
    type chartcite reads."""
    suffix = "read" if syntax == "v1" else "rs"
    return " ".join(f"system/{t}.{suffix}" for t in (types or SCOPED_TYPES))


# --- the authorization code flow ------------------------------------------------------------------

def token_session(registry: Registry, ehr: Ehr, redirect_uri: str | None = None) -> OAuth2Session:
    """An authlib session that authenticates as the registration's client type says."""
    try:
        return client_auth_for(registry, ehr).session(redirect_uri)
    except ClientAuthError as exc:
        raise LaunchError(str(exc)) from exc


def kept_tokens(tokens: dict, config: dict, requested_at: float) -> dict:
    """The tokens to keep, with when to renew them: a minute before expiry, or at four fifths of a
    short lifetime (Oracle Health's ten minutes, or seconds in a test), never at every request.
    The lifetime counts from `requested_at`, when the token was asked for: the EHR started it
    later than that, and the answer may have taken its time (a busy machine took most of a
    two-second token's margin before, and the EHR refused a request the token had to last for)."""
    expires_in, now = float(tokens.get("expires_in") or 300), requested_at
    return {"access_token": tokens["access_token"], "refresh_token": tokens.get("refresh_token", ""),
            "expires_at": now + expires_in, "refresh_at": now + expires_in - min(REFRESH_MARGIN, expires_in / 5),
            "scope": tokens.get("scope", ""), "token_endpoint": config["token_endpoint"]}


def oauth_reason(exc: Exception) -> str:
    """The token endpoint's error and description (they carry no patient data), else the type."""
    error = getattr(exc, "error", None)
    if not error:
        return type(exc).__name__
    description = str(getattr(exc, "description", "") or "")[:300]
    return f"{error}: {description}" if description else error


# --- token providers ------------------------------------------------------------------------------

class SessionTokens:
    """A launched session's tokens: refreshed shortly before expiry, and once more on a 401."""

    def __init__(self, registry: Registry, session_id: str, ehr: Ehr):
        self.registry, self.session_id, self.ehr = registry, session_id, ehr
        self.lock = threading.Lock()

    @staticmethod
    def store(registry: Registry, session_id: str, tokens: dict) -> None:
        registry.put_secret(session_id, "tokens", tokens, SESSION_TOKEN_TTL)

    def _tokens(self) -> dict:
        tokens = self.registry.get_secret(self.session_id, "tokens")
        if tokens is None:
            raise AuthExpired("this session's EHR sign-in has ended; open chartcite from the EHR again", 401)
        return tokens

    def granted(self) -> str:
        """The scopes the EHR granted this session ("" when it did not say)."""
        return str(self._tokens().get("scope") or "")

    def token(self) -> str:
        tokens = self._tokens()
        if time.time() >= tokens.get("refresh_at", tokens["expires_at"] - REFRESH_MARGIN) and tokens.get("refresh_token"):
            return self.refresh(seen=tokens["access_token"])
        # Without a refresh token the access token is used until the EHR refuses it.
        return tokens["access_token"]

    def refresh(self, seen: str | None = None) -> str:
        """A new access token. `seen` is the token the caller found about to expire: when another
        thread has replaced it meanwhile, that one is used (one refresh, not one per thread)."""
        with self.lock:
            tokens = self._tokens()
            if seen is not None and tokens["access_token"] != seen:
                return tokens["access_token"]
            if not tokens.get("refresh_token"):
                raise AuthExpired("the EHR sign-in ended before chartcite finished reading the record, and this EHR "
                                  "gives apps no way to renew it; what was indexed before is unchanged", 401,
                                  renewable=False)
            config = discover(self.ehr.iss)
            requested_at = time.time()
            try:
                fresh = token_session(self.registry, self.ehr).refresh_token(
                    config["token_endpoint"], refresh_token=tokens["refresh_token"])
            except Exception as exc:
                raise AuthExpired(f"the EHR refused to renew the sign-in ({oauth_reason(exc)}); "
                                  "open chartcite from the EHR again", 401) from exc
            kept = kept_tokens(fresh, config, requested_at)
            kept["refresh_token"] = kept["refresh_token"] or tokens["refresh_token"]
            self.store(self.registry, self.session_id, kept)
            return kept["access_token"]


class BackendSignInRefused(AuthExpired):
    """The EHR's token endpoint refused chartcite's Backend Services sign-in: its error and
    description as it gave them, and what to change for that error."""

    def __init__(self, status: int, error: str, description: str, hint: str):
        words = f"{error}: {description}" if error and description else error or description or "no reason given"
        super().__init__(f"the EHR refused chartcite's Backend Services sign-in ({status}: {words})", status)
        self.error, self.description, self.hint = error, description, hint

    @property
    def fix(self) -> str:
        if self.error == "invalid_scope":
            return ("ask for fewer types (`chartcite ehr update NAME --bulk-types Patient,Condition,...`) or grant "
                    "chartcite these system scopes in the EHR's console (`chartcite registration-info` lists them)")
        if self.error in ("invalid_client", "unauthorized_client") or self.status == 401:
            return self.hint
        return "`chartcite ehr check NAME` checks the registration step by step"


class BackendServicesToken:
    """SMART Backend Services: client_credentials with a private_key_jwt assertion (or, for a
    registration with a client secret, HTTP Basic), as the registration's Backend Services client,
    asking for the system scopes of `types` (every type chartcite reads by default).
    Tokens are short-lived; a new one is requested when the old is about to expire or is refused.
    `granted` holds the scopes the EHR granted (what was asked, when it did not say)."""

    def __init__(self, registry: Registry, ehr: Ehr, types: list[str] | None = None):
        self.registry, self.ehr, self.types = registry, ehr, types
        self.cached: tuple[str, float] | None = None      # (token, when to ask for the next one)
        self.granted = ""
        self.lock = threading.Lock()

    @property
    def scope(self) -> str:
        return system_scopes(self.ehr.scopes, self.types)

    def token(self) -> str:
        if self.cached and self.cached[1] > time.time():
            return self.cached[0]
        return self.refresh()

    def refresh(self) -> str:
        with self.lock:
            config = discover(self.ehr.iss)
            try:
                # Oracle Health's system accounts authenticate with their secret (RFC 6749 4.4);
                # Epic's with a signed assertion (SMART Backend Services).
                auth = client_auth_for(self.registry, self.ehr, backend=True)
                fields, headers = auth.credentials(config["token_endpoint"])
            except ClientAuthError as exc:
                raise AuthExpired(f"{exc}; register the JWKS URL with the EHR") from exc
            requested_at = time.time()       # the lifetime counts from here (kept_tokens says why)
            response = requests.post(config["token_endpoint"], timeout=DISCOVERY_TIMEOUT * 4,
                                     data={"grant_type": "client_credentials", "scope": self.scope} | fields,
                                     headers=headers)
            if response.status_code != 200:
                error, description = _error_parts(response)
                raise BackendSignInRefused(response.status_code, error, description, auth.refusal_hint())
            body = response.json()
            expires_in = float(body.get("expires_in") or 300)
            self.granted = str(body.get("scope") or self.scope)
            self.cached = (body["access_token"], requested_at + expires_in - min(REFRESH_MARGIN, expires_in / 5))
            return self.cached[0]


def _error_parts(response: requests.Response) -> tuple[str, str]:
    """The token endpoint's error and its description, in the EHR's own words."""
    try:
        body = response.json()
    except ValueError:
        return "", response.text[:200]
    if not isinstance(body, dict):
        return "", ""
    return str(body.get("error") or ""), str(body.get("error_description") or "")[:300]
