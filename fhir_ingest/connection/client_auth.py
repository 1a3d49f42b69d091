"""How chartcite proves itself at an EHR's token endpoint: one strategy per SMART client type.

- `PrivateKeyJwt` (confidential asymmetric): a JWT signed with chartcite's current key, which the
  EHR checks against chartcite's JWKS URL.
- `ClientSecretBasic` (confidential symmetric): the client id and secret in HTTP Basic. RFC 6749
  section 2.3.1 says to form-urlencode both before base64 (`form`); many servers, the SMART
  reference launcher among them, compare them as typed (`raw`). For a secret of letters, digits
  and `-._~` both are the same; `chartcite ehr check` finds which one an EHR accepts.
- `PublicClient`: nothing but the client id (PKCE protects the code).

Every token request (authorization code, refresh, client credentials, `ehr check`'s probe)
authenticates through `credentials()`, so the three grants cannot disagree about it.
"""
from __future__ import annotations

import base64
import secrets
from urllib.parse import quote_plus

from authlib.common.urls import add_params_to_qs
from authlib.integrations.requests_client import OAuth2Session

from .keys import client_assertion, generate_pair
from .registry import Ehr, Registry

ASSERTION_TYPE = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer"
TOKEN_TIMEOUT = 20
SECRET_ENCODINGS = ("form", "raw")


class ClientAuthError(RuntimeError):
    """chartcite cannot authenticate as this registration (no key, no secret)."""


class ClientAuth:
    method = ""
    capability = ""               # what the EHR's SMART configuration must declare for this client type

    def __init__(self, client_id: str):
        self.client_id = client_id

    def credentials(self, token_endpoint: str) -> tuple[dict, dict]:
        """The form fields and headers that authenticate one token request."""
        raise NotImplementedError

    def session(self, redirect_uri: str | None = None) -> OAuth2Session:
        """An authlib session for the code, refresh and client-credentials grants, authenticating
        each token request with `credentials()`."""
        def authenticate(client, method, uri, headers, body):
            fields, extra = self.credentials(uri)
            headers.update(extra)
            body = add_params_to_qs(body or "", list(fields.items()))
            if "Content-Length" in headers:
                headers["Content-Length"] = str(len(body))
            return uri, headers, body

        return OAuth2Session(client_id=self.client_id, redirect_uri=redirect_uri,
                             token_endpoint_auth_method=authenticate, default_timeout=TOKEN_TIMEOUT)

    def refusal_hint(self, jwks_url: str = "") -> str:
        """What to check when the EHR answers invalid_client."""
        raise NotImplementedError

    def decoys(self) -> list["ClientAuth"]:
        """Deliberately wrong credentials of the same client: an EHR that answers them exactly as
        it answers the real ones cannot tell right from wrong (a server keeping no client registry,
        such as the SMART reference launcher), so its answer proves nothing either way."""
        raise NotImplementedError


class PrivateKeyJwt(ClientAuth):
    method, capability = "private_key_jwt", "client-confidential-asymmetric"

    def __init__(self, client_id: str, registry: Registry):
        super().__init__(client_id)
        self.registry = registry

    def credentials(self, token_endpoint: str) -> tuple[dict, dict]:
        pair = self.registry.current_key()
        if pair is None:
            raise ClientAuthError("chartcite has no signing key for its private_key_jwt registration; hospital IT "
                                  "runs `chartcite keys generate`")
        return {"client_id": self.client_id, "client_assertion_type": ASSERTION_TYPE,
                "client_assertion": client_assertion(pair, self.client_id, token_endpoint)}, {}

    def refusal_hint(self, jwks_url: str = "") -> str:
        return ("check the client id (`chartcite ehr update NAME --client-id`) and that the EHR's app registration "
                f"holds chartcite's JWKS URL{' ' + jwks_url if jwks_url else ''} and can reach it (the EHR fetches "
                "it to check the signed assertion); after `chartcite keys generate`, give EHRs that copy keys the "
                "new ones")

    def decoys(self) -> list[ClientAuth]:
        return [SignedByUnknownKey(self.client_id), PublicClient(self.client_id)]


class SignedByUnknownKey(ClientAuth):
    """A decoy: the client id with an assertion signed by a key no EHR has ever seen."""
    method = "private_key_jwt"

    def __init__(self, client_id: str):
        super().__init__(client_id)
        self.pair = generate_pair("ES384")     # quick to make; never published

    def credentials(self, token_endpoint: str) -> tuple[dict, dict]:
        return {"client_id": self.client_id, "client_assertion_type": ASSERTION_TYPE,
                "client_assertion": client_assertion(self.pair, self.client_id, token_endpoint)}, {}


class ClientSecretBasic(ClientAuth):
    method, capability = "client_secret_basic", "client-confidential-symmetric"

    def __init__(self, client_id: str, secret: str, encoding: str = "form"):
        super().__init__(client_id)
        if not secret:
            raise ClientAuthError("client_secret_basic needs the client secret the EHR issued "
                                  "(`chartcite ehr update NAME --client-secret-env VARIABLE`)")
        self.secret, self.encoding = secret, encoding

    def credentials(self, token_endpoint: str) -> tuple[dict, dict]:
        def encoded(text: str) -> str:
            return quote_plus(text, safe="") if self.encoding == "form" else text

        pair = f"{encoded(self.client_id)}:{encoded(self.secret)}"
        return {}, {"Authorization": "Basic " + base64.b64encode(pair.encode()).decode()}

    def refusal_hint(self, jwks_url: str = "") -> str:
        other = "raw" if self.encoding == "form" else "form"
        return ("check the client id and secret against the EHR's app registration (`chartcite ehr update NAME "
                f"--client-id ... --client-secret-env VARIABLE`); the secret is sent {self.encoding}-encoded, and an EHR "
                f"that compares it the other way needs `--secret-encoding {other}` (`chartcite ehr check NAME` finds "
                "which one the EHR accepts)")

    def other_encoding(self) -> "ClientSecretBasic | None":
        """The same secret sent the other way, when that makes a different header (a secret of
        letters, digits and `-._~` reads the same both ways)."""
        other = ClientSecretBasic(self.client_id, self.secret, "raw" if self.encoding == "form" else "form")
        return other if other.credentials("")[1] != self.credentials("")[1] else None

    def decoys(self) -> list[ClientAuth]:
        return [ClientSecretBasic(self.client_id, "chartcite-wrong-" + secrets.token_urlsafe(12), self.encoding),
                PublicClient(self.client_id)]


class PublicClient(ClientAuth):
    method, capability = "none", "client-public"

    def credentials(self, token_endpoint: str) -> tuple[dict, dict]:
        return {"client_id": self.client_id}, {}

    def refusal_hint(self, jwks_url: str = "") -> str:
        return ("check the client id (`chartcite ehr update NAME --client-id`) and that the EHR registered chartcite "
                "as a public client (else register the client type it has: --client-auth)")

    def decoys(self) -> list[ClientAuth]:
        return [PublicClient("chartcite-wrong-" + secrets.token_urlsafe(12))]


def client_auth_for(registry: Registry, ehr: Ehr, encoding: str | None = None, backend: bool = False) -> ClientAuth:
    """The registration's strategy. A registration made before client types existed ("") signs
    with chartcite's key when it has one and is public otherwise. `backend`: as its Backend
    Services client, which, when registered apart (Epic's "Backend Systems" app), has its own id
    and signs with chartcite's key unless it was given a secret of its own."""
    if backend and ehr.backend_client_id:
        secret = registry.backend_client_secret(ehr)
        if secret:
            return ClientSecretBasic(ehr.backend_client_id, secret, encoding or ehr.secret_encoding or "form")
        return PrivateKeyJwt(ehr.backend_client_id, registry)
    method = ehr.client_auth or ("private_key_jwt" if registry.current_key() else "none")
    if method == "client_secret_basic":
        return ClientSecretBasic(ehr.client_id, registry.client_secret(ehr),
                                 encoding or ehr.secret_encoding or "form")
    if method == "private_key_jwt":
        return PrivateKeyJwt(ehr.client_id, registry)
    return PublicClient(ehr.client_id)
