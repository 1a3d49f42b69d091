"""Hospital IT's registry: EHR registrations, key rotation with overlap, secrets encrypted at rest,
and upgrades that keep existing registrations."""
from __future__ import annotations

import sqlite3
import time

import pytest
from cryptography.fernet import Fernet

from fhir_ingest.connection.keys import generate_pair
from fhir_ingest.connection.registry import Registry, RegistryError


@pytest.fixture()
def registry(tmp_path):
    return Registry(f"sqlite:///{tmp_path / 'registry.sqlite'}", Fernet.generate_key().decode())


def test_registrations_are_checked(registry):
    registry.add_ehr("epic-prod", "https://fhir.example.org/R4/", "client-1", "v1", ["https://ehr.example.org"])
    assert registry.ehr_by_iss("https://fhir.example.org/R4").name == "epic-prod"     # trailing slash normalised
    assert registry.frame_origins() == ["https://ehr.example.org"]
    for bad, message in [(("Epic Prod", "https://a/fhir", "c"), "lower-case"), (("x", "not a url", "c"), "FHIR base URL"),
                         (("y", "https://fhir.example.org/R4", "c"), "already registered"), (("z", "https://b/fhir", " "), "client-id")]:
        with pytest.raises(RegistryError, match=message):
            registry.add_ehr(*bad)
    with pytest.raises(RegistryError, match="frame origin"):
        registry.add_ehr("w", "https://c/fhir", "c", frame_origins=["https://ehr.example.org/path"])
    assert registry.remove_ehr("epic-prod") and registry.ehr("epic-prod") is None


def test_key_rotation_keeps_the_old_key_published_for_the_overlap(registry):
    first, second = generate_pair("ES384"), generate_pair("ES384")
    registry.add_key(first, overlap_seconds=3600)
    registry.add_key(second, overlap_seconds=0.2)
    assert registry.current_key("ES384").kid == second.kid
    assert {k["kid"] for k in registry.published_keys()} == {first.kid, second.kid}
    time.sleep(0.3)
    assert [k["kid"] for k in registry.published_keys()] == [second.kid]
    assert registry.prune_keys() == 1


def test_secrets_are_encrypted_at_rest_and_read_once(registry, tmp_path):
    registry.add_key(generate_pair("RS384"), 60)
    registry.put_secret("state-1", "launch", {"verifier": "very-secret-verifier"}, ttl=60)
    raw = (tmp_path / "registry.sqlite").read_bytes()
    assert b"very-secret-verifier" not in raw and b'"d"' not in raw
    assert registry.pop_secret("state-1", "launch") == {"verifier": "very-secret-verifier"}
    assert registry.pop_secret("state-1", "launch") is None               # a state cannot be replayed
    other = Registry(f"sqlite:///{tmp_path / 'registry.sqlite'}", Fernet.generate_key().decode())
    with pytest.raises(RegistryError, match="TOKEN_KEY"):
        other.current_key()


def test_an_older_registry_database_is_upgraded_in_place(tmp_path):
    path = tmp_path / "old.sqlite"
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE ehr (name VARCHAR(40) PRIMARY KEY, iss VARCHAR(500) UNIQUE, client_id VARCHAR(200), "
               "scopes VARCHAR(4), frame_origins TEXT, group_id VARCHAR(200), created_at FLOAT, last_sync_at FLOAT, "
               "last_sync_status TEXT, bulk_since VARCHAR(40))")
    db.execute("INSERT INTO ehr VALUES ('old', 'https://x/fhir', 'cid', 'v2', '', '', 0, 0, 'never', '')")
    db.commit()
    db.close()
    registry = Registry(f"sqlite:///{path}", Fernet.generate_key().decode())
    [ehr] = registry.ehrs()
    assert ehr.name == "old" and ehr.write_back is False


def open_stores_together(folder: str, key: str, barrier) -> None:
    from fhir_ingest.connection.registry import Registry
    from smart_app.audit import AuditTrail

    barrier.wait()           # every process creates the tables at the same moment
    Registry(f"sqlite:///{folder}/registry.sqlite", key)
    AuditTrail(f"sqlite:///{folder}/audit.sqlite")


def test_processes_starting_together_all_open_the_stores(tmp_path):
    """Found in CI: two gunicorn workers creating the audit table at once, one failed to boot
    ("table audit already exists") and gunicorn stopped."""
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    barrier, key = context.Barrier(6), Fernet.generate_key().decode()
    processes = [context.Process(target=open_stores_together, args=(str(tmp_path), key, barrier)) for _ in range(6)]
    for process in processes:
        process.start()
    for process in processes:
        process.join(120)
    assert [p.exitcode for p in processes] == [0] * 6


HOSTILE_ORIGINS = ["https://x.example *", "*", "https://*.example.org", "https://x; script-src 'unsafe-inline'",
                   "https://x.example,https://y.example", "https://x.example/path", "https://x.example?q=1",
                   "https://x.example#top", "https://user:pw@x.example", "'self'", "'unsafe-inline'",
                   "ftp://x.example", "javascript:alert(1)", "https:x.example", "https://x.example:99999",
                   "https://x.example\n", "https://x\tevil", "https://bad_host.example", "https://\"x\"",
                   "https://x.example:0", "https://[::1"]


@pytest.mark.parametrize("origin", HOSTILE_ORIGINS)
def test_only_an_origin_can_frame_the_app(registry, origin):
    """A frame origin is written into the CSP header: a wildcard, a path, or a `;` starting another
    directive would change the policy itself, so each is refused with a sentence naming it."""
    with pytest.raises(RegistryError, match="frame origin .* is not an origin") as refused:
        registry.add_ehr("w", "https://c/fhir", "c", frame_origins=["https://ok.example.org", origin])
    assert repr(origin) in str(refused.value)
    assert registry.ehr("w") is None


def test_origins_are_kept_in_one_spelling(registry):
    registry.add_ehr("w", "https://c/fhir", "c", frame_origins=["HTTPS://EHR.Example.org/", "http://127.0.0.1:8080",
                                                                  "https://[::1]:8443"])
    assert registry.frame_origins("w") == ["https://ehr.example.org", "http://127.0.0.1:8080", "https://[::1]:8443"]


def test_origins_stored_before_they_were_checked_never_reach_the_policy(registry):
    from sqlalchemy import update
    from sqlalchemy.orm import Session

    from fhir_ingest.connection.registry import Ehr

    registry.add_ehr("w", "https://c/fhir", "c", frame_origins=["https://ok.example.org"])
    with Session(registry.engine) as s:
        s.execute(update(Ehr).values(frame_origins="https://x.example * https://y; script-src 'unsafe-inline'"))
        s.commit()
    registry._frame_origins = None
    assert registry.frame_origins() == ["https://x.example"]
