"""SMART App Launch 2.x, the interactive part: the authorization code flow with PKCE (through
authlib) and id_token validation. Discovery, scopes, client authentication and token renewal are
fhir_ingest/connection/smart_auth.py (syncs need them too).

The verifier and nonce of a pending authorization are kept encrypted in the registry, keyed by the
opaque `state`.
"""
from __future__ import annotations

import json
import logging
import secrets
import threading
import time
from base64 import urlsafe_b64decode
from dataclasses import dataclass, field

import requests
from authlib.oauth2.rfc7636 import create_s256_code_challenge
from joserfc import jwt
from joserfc.errors import JoseError
from joserfc.jwk import KeySet

from fhir_ingest.connection.registry import Ehr, Registry
from fhir_ingest.connection.client_auth import ClientSecretBasic, client_auth_for
from fhir_ingest.record.validate import ID_RULE, is_fhir_id
from fhir_ingest.connection.smart_auth import (DISCOVERY_TIMEOUT, LaunchError, can_write_documents, discover, kept_tokens,
                                    oauth_reason, scopes_for, token_session)

PENDING_TTL = 600                 # seconds an authorization may take at the EHR
JWKS_TTL = 3600                   # an EHR's signing keys are read again after this long...
JWKS_REFRESH_FLOOR = 60           # ...or when a token names a key not held, at most this often

log = logging.getLogger(__name__)


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

    def exchange(session) -> dict:
        return session.fetch_token(config["token_endpoint"], grant_type="authorization_code", code=code,
                                   code_verifier=pending["verifier"])

    session = token_session(registry, ehr, pending["redirect_uri"])
    requested_at = time.time()
    try:
        tokens = exchange(session)
    except Exception as exc:   # authlib raises OAuthError; requests its own
        tokens = with_the_other_secret_encoding(registry, ehr, exc, exchange, pending["redirect_uri"])
        if tokens is None:
            raise LaunchError(f"the EHR refused the sign-in ({oauth_reason(exc)})"
                              + refusal_advice(getattr(exc, "error", ""), registry, ehr)) from exc
    patient = tokens.get("patient")
    if not patient:
        raise LaunchError("the EHR did not say which patient this launch is for")
    if not is_fhir_id(patient):
        # Checked before a session exists: every file and index refuses such an id, so its sync
        # could only fail later, with the clinician already looking at an empty frame.
        raise LaunchError(f"the EHR named a patient whose id is not a FHIR id {ID_RULE}")
    clinician = "unknown"
    if "openid" in tokens.get("scope", "openid") and tokens.get("id_token"):
        claims = validate_id_token(tokens["id_token"], ehr, config, pending["nonce"])
        clinician = claims.get("fhirUser") or claims.get("sub") or "unknown"
    elif tokens.get("id_token") is None and "openid" in tokens.get("scope", ""):
        raise LaunchError("the EHR granted openid but sent no id_token")
    context = {k: tokens[k] for k in ("encounter", "need_patient_banner", "smart_style_url", "tenant", "fhirContext",
                                      "intent") if k in tokens}
    context["can_write_back"] = can_write_documents(tokens.get("scope", ""))
    return LaunchResult(ehr, pending["mode"], patient, clinician, kept_tokens(tokens, config, requested_at), context)

def with_the_other_secret_encoding(registry: Registry, ehr: Ehr, refusal: Exception, exchange, redirect_uri: str):
    """A client secret refused as invalid_client in one encoding is tried once in the other (the
    EHR authenticates the client before it looks at the code, so the code is still good); the one
    it accepts is recorded, so `ehr check` on an EHR that could not tell is settled by a launch."""
    auth = client_auth_for(registry, ehr)
    other = auth.other_encoding() if isinstance(auth, ClientSecretBasic) else None
    if other is None or getattr(refusal, "error", "") != "invalid_client":
        return None
    try:
        tokens = exchange(other.session(redirect_uri))
    except Exception:
        return None
    registry.update_ehr(ehr.name, secret_encoding=other.encoding)
    log.warning("the EHR accepts the client secret %s-encoded: the registration now sends it so", other.encoding)
    return tokens


def refusal_advice(error: str, registry: Registry, ehr: Ehr) -> str:
    """What hospital IT should check, by the OAuth error the token endpoint gave."""
    if error in ("invalid_client", "unauthorized_client"):
        return ". Hospital IT: " + client_auth_for(registry, ehr).refusal_hint() + "; `chartcite ehr check` tests it"
    if error == "invalid_scope":
        return ". Hospital IT: compare the scopes `chartcite registration-info` lists with the EHR's app registration"
    return ""


def validate_id_token(id_token: str, ehr: Ehr, config: dict, nonce: str) -> dict:
    """Signature against the issuer's JWKS, then iss, aud, exp and nonce."""
    jwks_uri = config.get("jwks_uri") or _openid_config(ehr.iss).get("jwks_uri")
    if not jwks_uri:
        raise LaunchError("the EHR publishes no JWKS to check its id_token against")
    try:
        keys = ISSUER_KEYS.keys_for(jwks_uri, token_kid(id_token))
        token = jwt.decode(id_token, keys, algorithms=["RS256", "RS384", "ES256", "ES384"])
        issuer = config.get("issuer") or _openid_config(ehr.iss).get("issuer") or ehr.iss
        jwt.JWTClaimsRegistry(iss={"essential": True, "value": issuer}, aud={"essential": True, "value": ehr.client_id},
                              exp={"essential": True}, nonce={"essential": True, "value": nonce},
                              leeway=60).validate(token.claims)
    except (JoseError, ValueError, requests.RequestException) as exc:
        raise LaunchError(f"the EHR's id_token did not validate ({type(exc).__name__}: {exc})") from exc
    return token.claims


def token_kid(id_token: str) -> str:
    """The `kid` of a JWS's protected header, read before its signature is checked only to pick the key."""
    header = id_token.split(".", 1)[0]
    try:
        return str(json.loads(urlsafe_b64decode(header + "=" * (-len(header) % 4))).get("kid") or "")
    except ValueError:
        return ""


class IssuerKeys:
    """The EHRs' published signing keys, read once an hour rather than at every launch, and again
    at once when a token names a key not held (the EHR rotated its keys), but not more often than
    once a minute per EHR, so tokens naming made-up keys cannot make chartcite hammer the EHR."""

    def __init__(self, ttl: float = JWKS_TTL, refresh_floor: float = JWKS_REFRESH_FLOOR):
        self.ttl, self.refresh_floor = ttl, refresh_floor
        self._held: dict[str, tuple[float, KeySet]] = {}
        self._lock = threading.Lock()

    def keys_for(self, jwks_uri: str, kid: str) -> KeySet:
        with self._lock:
            fetched, keys = self._held.get(jwks_uri, (0.0, None))
            age = time.monotonic() - fetched
            unknown_kid = keys is not None and bool(kid) and kid not in {key.kid for key in keys.keys}
            if keys is None or age > self.ttl or (unknown_kid and age > self.refresh_floor):
                keys = KeySet.import_key_set(requests.get(jwks_uri, timeout=DISCOVERY_TIMEOUT).json())
                self._held[jwks_uri] = (time.monotonic(), keys)
            return keys


ISSUER_KEYS = IssuerKeys()


def _openid_config(iss: str) -> dict:
    try:
        return requests.get(iss.rstrip("/") + "/.well-known/openid-configuration", timeout=DISCOVERY_TIMEOUT).json()
    except (requests.RequestException, ValueError):
        return {}


