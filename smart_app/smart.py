"""SMART App Launch 2.x and Backend Services, client side: discovery, scopes, the authorization
code flow with PKCE (through authlib), id_token validation, and token providers that refresh.

Everything secret stays server-side: the verifier and nonce of a pending authorization and the
tokens of a session are kept encrypted in the registry, keyed by the opaque `state` or session id.
"""
from __future__ import annotations

import base64
import logging
import secrets
import threading
import time
from dataclasses import dataclass, field
from urllib.parse import quote_plus

import requests
from authlib.integrations.requests_client import OAuth2Session
from authlib.oauth2.rfc7636 import create_s256_code_challenge
from joserfc import jwt
from joserfc.errors import JoseError
from joserfc.jwk import KeySet

from fhir_ingest.client import AuthExpired
from fhir_ingest.fhir_source import PATIENT_SEARCHES, REFERENCED_TYPES

from .keys import client_assertion
from .registry import DEFAULT_REQUEST_SCOPES, Ehr, Registry

log = logging.getLogger(__name__)

DISCOVERY_TTL = 3600
DISCOVERY_TIMEOUT = 5
PENDING_TTL = 600                 # seconds an authorization may take at the EHR
SESSION_TOKEN_TTL = 12 * 3600
REFRESH_MARGIN = 60               # refresh this long before the access token expires
ASSERTION_TYPE = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer"
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


def system_scopes(syntax: str) -> str:
    return " ".join(resource_scopes("system", syntax))


# --- the authorization code flow ------------------------------------------------------------------

@dataclass
class AuthorizationRequest:
    url: str                   # the authorize endpoint
    params: dict
    post: bool                 # the EHR advertises authorize-post
    state: str
    binding: str               # goes into a cookie where the browser keeps one


def start_authorization(registry: Registry, ehr: Ehr, redirect_uri: str, launch: str | None) -> AuthorizationRequest:
    config = discover(ehr.iss)
    endpoint = config.get("authorization_endpoint")
    if not endpoint:
        raise LaunchError("the EHR's SMART configuration names no authorization endpoint")
    state, nonce, verifier, binding = (secrets.token_urlsafe(32), secrets.token_urlsafe(24),
                                       secrets.token_urlsafe(64), secrets.token_urlsafe(16))
    standalone = not launch
    params = {"response_type": "code", "client_id": ehr.client_id, "redirect_uri": redirect_uri,
              "scope": scopes_for(ehr, standalone), "state": state, "aud": ehr.iss, "nonce": nonce,
              "code_challenge": create_s256_code_challenge(verifier), "code_challenge_method": "S256"}
    if launch:
        params["launch"] = launch
    registry.put_secret(state, "launch", {"ehr": ehr.name, "verifier": verifier, "nonce": nonce, "binding": binding,
                                          "redirect_uri": redirect_uri, "mode": "standalone" if standalone else "ehr"},
                        PENDING_TTL)
    post = "authorize-post" in (config.get("capabilities") or [])
    return AuthorizationRequest(endpoint, params, post, state, binding)


@dataclass
class LaunchResult:
    ehr: Ehr
    mode: str
    patient_id: str
    clinician: str
    tokens: dict
    context: dict = field(default_factory=dict)


def finish_authorization(registry: Registry, code: str, state: str, binding: str | None) -> LaunchResult:
    pending = registry.pop_secret(state, "launch") if state else None
    if pending is None:
        raise LaunchError("this sign-in is unknown or expired (state mismatch); open chartcite from the EHR again")
    # The state is bound to the browser that started the launch. A browser that keeps no cookie in
    # the EHR's frame sends none; one that sends a different binding is someone else's browser.
    if binding is not None and binding != pending["binding"]:
        raise LaunchError("this sign-in was started in another browser (state mismatch); open chartcite again")
    ehr = registry.ehr(pending["ehr"])
    if ehr is None:
        raise LaunchError("this EHR is no longer registered with chartcite")
    config = discover(ehr.iss)
    session, authentication = _oauth_session(registry, ehr, pending["redirect_uri"]), _client_auth(registry, ehr, config)
    try:
        tokens = session.fetch_token(config["token_endpoint"], grant_type="authorization_code", code=code,
                                     code_verifier=pending["verifier"], **authentication)
    except Exception as exc:   # authlib raises OAuthError; requests its own
        raise LaunchError(f"the EHR refused the sign-in ({_oauth_reason(exc)})") from exc
    patient = tokens.get("patient")
    if not patient:
        raise LaunchError("the EHR did not say which patient this launch is for")
    clinician = "unknown"
    if "openid" in tokens.get("scope", "openid") and tokens.get("id_token"):
        claims = validate_id_token(tokens["id_token"], ehr, config, pending["nonce"])
        clinician = claims.get("fhirUser") or claims.get("sub") or "unknown"
    elif tokens.get("id_token") is None and "openid" in tokens.get("scope", ""):
        raise LaunchError("the EHR granted openid but sent no id_token")
    context = {k: tokens[k] for k in ("encounter", "need_patient_banner", "smart_style_url", "tenant", "fhirContext",
                                      "intent") if k in tokens}
    context["can_write_back"] = can_write_documents(tokens.get("scope", ""))
    return LaunchResult(ehr, pending["mode"], patient, clinician, _kept_tokens(tokens, config), context)


def _oauth_session(registry: Registry, ehr: Ehr, redirect_uri: str | None = None) -> OAuth2Session:
    """A symmetric client authenticates with HTTP Basic; otherwise authlib sends the client_id in the body and _client_auth adds a JWT assertion
    for an asymmetric client."""
    if ehr.client_auth == "client_secret_basic":
        return OAuth2Session(client_id=ehr.client_id, client_secret=registry.client_secret(ehr),
                             redirect_uri=redirect_uri, token_endpoint_auth_method=_basic_credentials,
                             default_timeout=DISCOVERY_TIMEOUT * 4)
    return OAuth2Session(client_id=ehr.client_id, redirect_uri=redirect_uri, token_endpoint_auth_method="none",
                         default_timeout=DISCOVERY_TIMEOUT * 4)


def _basic_credentials(client, method, uri, headers, body):
    """HTTP Basic as RFC 6749 section 2.3.1 asks: id and secret form-urlencoded before base64
    (authlib joins them raw, which changes the meaning of a secret holding '+', '%' or ':'). For
    the letters, digits and '-._~' secrets usually hold, both encodings are the same."""
    pair = f"{quote_plus(client.client_id, safe='')}:{quote_plus(client.client_secret, safe='')}"
    headers["Authorization"] = "Basic " + base64.b64encode(pair.encode()).decode()
    return uri, headers, body


def _client_auth(registry: Registry, ehr: Ehr, config: dict) -> dict:
    if ehr.client_auth in ("client_secret_basic", "none"):
        return {}
    pair = registry.current_key()
    if pair is None:
        if ehr.client_auth == "private_key_jwt":
            raise LaunchError("chartcite has no signing key for its private_key_jwt registration; "
                              "hospital IT runs `chartcite keys generate`")
        return {}
    return {"client_assertion_type": ASSERTION_TYPE,
            "client_assertion": client_assertion(pair, ehr.client_id, config["token_endpoint"])}


def _kept_tokens(tokens: dict, config: dict) -> dict:
    """The tokens to keep, with when to renew them: a minute before expiry, or at four fifths of a
    short lifetime (Oracle Health's ten minutes, or seconds in a test), never at every request."""
    expires_in, now = float(tokens.get("expires_in") or 300), time.time()
    return {"access_token": tokens["access_token"], "refresh_token": tokens.get("refresh_token", ""),
            "expires_at": now + expires_in, "refresh_at": now + expires_in - min(REFRESH_MARGIN, expires_in / 5),
            "scope": tokens.get("scope", ""), "token_endpoint": config["token_endpoint"]}


def _oauth_reason(exc: Exception) -> str:
    """The token endpoint's error and description (they carry no patient data), else the type."""
    error = getattr(exc, "error", None)
    if not error:
        return type(exc).__name__
    description = str(getattr(exc, "description", "") or "")[:300]
    return f"{error}: {description}" if description else error


def validate_id_token(id_token: str, ehr: Ehr, config: dict, nonce: str) -> dict:
    """Signature against the issuer's JWKS, then iss, aud, exp and nonce."""
    jwks_uri = config.get("jwks_uri") or _openid_config(ehr.iss).get("jwks_uri")
    if not jwks_uri:
        raise LaunchError("the EHR publishes no JWKS to check its id_token against")
    try:
        keys = KeySet.import_key_set(requests.get(jwks_uri, timeout=DISCOVERY_TIMEOUT).json())
        token = jwt.decode(id_token, keys, algorithms=["RS256", "RS384", "ES256", "ES384"])
        issuer = config.get("issuer") or _openid_config(ehr.iss).get("issuer") or ehr.iss
        jwt.JWTClaimsRegistry(iss={"essential": True, "value": issuer}, aud={"essential": True, "value": ehr.client_id},
                              exp={"essential": True}, nonce={"essential": True, "value": nonce},
                              leeway=60).validate(token.claims)
    except (JoseError, ValueError, requests.RequestException) as exc:
        raise LaunchError(f"the EHR's id_token did not validate ({type(exc).__name__}: {exc})") from exc
    return token.claims


def _openid_config(iss: str) -> dict:
    try:
        return requests.get(iss.rstrip("/") + "/.well-known/openid-configuration", timeout=DISCOVERY_TIMEOUT).json()
    except (requests.RequestException, ValueError):
        return {}


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
            try:
                fresh = _oauth_session(self.registry, self.ehr).refresh_token(
                    config["token_endpoint"], refresh_token=tokens["refresh_token"],
                    **_client_auth(self.registry, self.ehr, config))
            except Exception as exc:
                raise AuthExpired(f"the EHR refused to renew the sign-in ({_oauth_reason(exc)}); "
                                  "open chartcite from the EHR again", 401) from exc
            kept = _kept_tokens(fresh, config)
            kept["refresh_token"] = kept["refresh_token"] or tokens["refresh_token"]
            self.store(self.registry, self.session_id, kept)
            return kept["access_token"]


class BackendServicesToken:
    """SMART Backend Services: client_credentials with a private_key_jwt assertion (or, for a
    registration with a client secret, HTTP Basic), system scopes.
    Tokens are short-lived; a new one is requested when the old is about to expire or is refused."""

    def __init__(self, registry: Registry, ehr: Ehr):
        self.registry, self.ehr = registry, ehr
        self.cached: tuple[str, float] | None = None      # (token, when to ask for the next one)
        self.lock = threading.Lock()

    def token(self) -> str:
        if self.cached and self.cached[1] > time.time():
            return self.cached[0]
        return self.refresh()

    def refresh(self) -> str:
        with self.lock:
            config = discover(self.ehr.iss)
            form = {"grant_type": "client_credentials", "scope": system_scopes(self.ehr.scopes)}
            if self.ehr.client_auth == "client_secret_basic":
                # Oracle Health's system accounts authenticate with their secret (RFC 6749 4.4).
                credentials = (quote_plus(self.ehr.client_id, safe=""), quote_plus(self.registry.client_secret(self.ehr), safe=""))
                response = requests.post(config["token_endpoint"], timeout=DISCOVERY_TIMEOUT * 4, data=form,
                                         auth=credentials)
            else:
                pair = self.registry.current_key()
                if pair is None:
                    raise AuthExpired("no signing key: run `chartcite keys generate` and register the JWKS URL with the EHR")
                form |= {"client_assertion_type": ASSERTION_TYPE,
                         "client_assertion": client_assertion(pair, self.ehr.client_id, config["token_endpoint"])}
                response = requests.post(config["token_endpoint"], timeout=DISCOVERY_TIMEOUT * 4, data=form)
            if response.status_code != 200:
                raise AuthExpired(f"the EHR refused chartcite's backend sign-in ({response.status_code}: "
                                  f"{_error_of(response)})", response.status_code)
            body = response.json()
            expires_in = float(body.get("expires_in") or 300)
            self.cached = (body["access_token"], time.time() + expires_in - min(REFRESH_MARGIN, expires_in / 5))
            return self.cached[0]


def _error_of(response: requests.Response) -> str:
    try:
        return response.json().get("error", "")
    except ValueError:
        return ""
