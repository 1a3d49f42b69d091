"""The EHR's id_token keys: read once, not at every launch; read again when the EHR rotates them."""
from __future__ import annotations

import time

import pytest
from joserfc import jwt
from joserfc.jwk import KeySet, RSAKey

from fhir_ingest.connection.registry import Ehr
from fhir_ingest.connection.smart_auth import LaunchError
from smart_app import smart

from .stub_http import QuietHandler, serve


@pytest.fixture()
def issuer():
    state = {"keys": [RSAKey.generate_key(2048, parameters={"kid": "k1"})], "fetches": 0}

    class Handler(QuietHandler):
        def do_GET(self):
            state["fetches"] += 1
            self.send_json(KeySet(state["keys"]).as_dict(private=False))

    server = serve(Handler)
    state["uri"] = f"http://127.0.0.1:{server.server_port}/jwks"
    yield state
    server.shutdown()


def id_token(key, nonce="n1") -> str:
    claims = {"iss": "https://ehr.example", "aud": "client-1", "exp": int(time.time()) + 300, "nonce": nonce,
              "sub": "Practitioner/7"}
    return jwt.encode({"alg": "RS256", "kid": key.kid}, claims, key)


def validate(issuer, token):
    ehr = Ehr(name="e", iss="https://ehr.example", client_id="client-1")
    return smart.validate_id_token(token, ehr, {"jwks_uri": issuer["uri"], "issuer": "https://ehr.example"}, "n1")


def test_launches_read_the_ehrs_keys_once_and_again_after_a_rotation(issuer, monkeypatch):
    monkeypatch.setattr(smart, "ISSUER_KEYS", smart.IssuerKeys(refresh_floor=0))
    for _ in range(3):
        assert validate(issuer, id_token(issuer["keys"][0]))["sub"] == "Practitioner/7"
    assert issuer["fetches"] == 1
    rotated = RSAKey.generate_key(2048, parameters={"kid": "k2"})
    issuer["keys"] = [rotated]
    assert validate(issuer, id_token(rotated))["sub"] == "Practitioner/7"     # the unknown kid is read anew
    assert issuer["fetches"] == 2


def test_tokens_naming_made_up_keys_cannot_make_chartcite_hammer_the_ehr(issuer, monkeypatch):
    monkeypatch.setattr(smart, "ISSUER_KEYS", smart.IssuerKeys(refresh_floor=60))
    validate(issuer, id_token(issuer["keys"][0]))
    stranger = RSAKey.generate_key(2048, parameters={"kid": "forged"})
    for _ in range(5):
        with pytest.raises(LaunchError, match="did not validate"):
            validate(issuer, id_token(stranger))
    assert issuer["fetches"] == 1
