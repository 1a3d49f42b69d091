"""chartcite's own signing keys (RS384 and ES384) and the client assertions it signs with them.

SMART Backend Services: the assertion is a JWT with iss = sub = client_id, aud = the token
endpoint, a fresh jti every time and an exp at most five minutes ahead. authlib's PrivateKeyJWT
signs for an hour and, given fixed claims, repeats its jti, so the assertion is built here.
"""
from __future__ import annotations

import time
import uuid

from joserfc import jwk, jwt

from .registry import KeyPair

ALGORITHMS = ("RS384", "ES384")
ASSERTION_LIFETIME = 240          # seconds; SMART allows at most 300


def generate_pair(alg: str) -> KeyPair:
    if alg == "RS384":
        key = jwk.RSAKey.generate_key(3072, private=True)
    elif alg == "ES384":
        key = jwk.ECKey.generate_key("P-384", private=True)
    else:
        raise ValueError(f"key algorithm must be one of {', '.join(ALGORITHMS)}")
    key.ensure_kid()
    public = key.as_dict(private=False) | {"alg": alg, "use": "sig", "key_ops": ["verify"]}
    return KeyPair(key.kid, alg, key.as_dict(private=True), public)


def client_assertion(pair: KeyPair, client_id: str, token_url: str, now: float | None = None) -> str:
    issued = int(now if now is not None else time.time())
    claims = {"iss": client_id, "sub": client_id, "aud": token_url, "jti": uuid.uuid4().hex,
              "iat": issued, "exp": issued + ASSERTION_LIFETIME}
    header = {"alg": pair.alg, "kid": pair.kid, "typ": "JWT"}
    return jwt.encode(header, claims, jwk.import_key(pair.private), algorithms=[pair.alg])
