"""Settings a hospital gets wrong or shares: typos said at start, secrets from mounted files, keys
made once however many processes start together."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from smart_app.settings import Settings, SettingsError

REPO = Path(__file__).resolve().parent.parent


def test_an_unknown_variable_is_named_with_the_closest_setting(tmp_path):
    settings = Settings.load({"CHARTCITE_DATA_DIR": str(tmp_path), "CHARTCITE_FHIR_MAX_CONCURENCY": "8"})
    assert settings.fhir_max_concurrency == 2            # the typo changed nothing...
    assert settings.warnings == ("CHARTCITE_FHIR_MAX_CONCURENCY is not a chartcite setting and is ignored; "
                                 "did you mean CHARTCITE_FHIR_MAX_CONCURRENCY?",)   # ...and is said


def test_a_command_says_the_typo_at_start(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "CHARTCITE_DATA_DIR": str(tmp_path),
           "CHARTCITE_RATE_LIMIT_CLINICAN": "5/minute", "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-m", "smart_app.cli", "config"], env=env, capture_output=True,
                         text=True, timeout=120, encoding="utf-8")
    assert out.returncode == 0, out.stderr
    assert "CHARTCITE_RATE_LIMIT_CLINICAN is not a chartcite setting" in out.stderr
    assert "did you mean CHARTCITE_RATE_LIMIT_CLINICIAN?" in out.stderr


def test_variables_of_the_scripts_and_tests_are_not_warned_about(tmp_path):
    settings = Settings.load({"CHARTCITE_DATA_DIR": str(tmp_path), "CHARTCITE_SHARED": "/x", "CHARTCITE_ES_PORT": "1"})
    assert settings.warnings == ()


def test_secrets_are_read_from_mounted_files(tmp_path):
    (tmp_path / "token").write_text("Zm9vYmFyYmF6cXV4Zm9vYmFyYmF6cXV4Zm9vYmFyMTI=\n", encoding="utf-8")
    (tmp_path / "admins").write_text("ops:s3cret\n", encoding="utf-8")
    settings = Settings.load({"CHARTCITE_DATA_DIR": str(tmp_path / "data"),
                              "CHARTCITE_TOKEN_KEY_FILE": str(tmp_path / "token"),
                              "CHARTCITE_ADMIN_TOKENS_FILE": str(tmp_path / "admins")})
    assert settings.token_key == "Zm9vYmFyYmF6cXV4Zm9vYmFyYmF6cXV4Zm9vYmFyMTI="
    assert settings.admin_credentials() == {"ops": "s3cret"}
    assert settings.warnings == ()
    assert settings.masked()["token_key"] == "****"


def test_a_secret_given_twice_or_unreadable_stops_the_start(tmp_path):
    (tmp_path / "key").write_text("abc", encoding="utf-8")
    with pytest.raises(SettingsError, match="CHARTCITE_SECRET_KEY and CHARTCITE_SECRET_KEY_FILE are both set"):
        Settings.load({"CHARTCITE_SECRET_KEY": "x", "CHARTCITE_SECRET_KEY_FILE": str(tmp_path / "key")})
    with pytest.raises(SettingsError, match="CHARTCITE_LLM_API_KEY_FILE=.*cannot be read"):
        Settings.load({"CHARTCITE_LLM_API_KEY_FILE": str(tmp_path / "absent")})


RACE = """
import sys, time
from smart_app.settings import Settings
start = float(sys.argv[2])
while time.time() < start:
    pass
s = Settings.load({"CHARTCITE_DATA_DIR": sys.argv[1]})
print(s.ensure_secret(), s.ensure_token_key())
"""


def test_processes_starting_together_on_a_fresh_data_dir_share_one_key(tmp_path):
    import time

    start = time.time() + 3          # every process is spinning before any of them makes a key
    procs = [subprocess.Popen([sys.executable, "-c", RACE, str(tmp_path / "data"), str(start)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
                              env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}, encoding="utf-8") for _ in range(6)]
    outputs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err for _, err in outputs]
    keys = {out.strip() for out, _ in outputs}
    assert len(keys) == 1 and all(len(part) > 20 for part in keys.pop().split())
    assert sorted(p.name for p in (tmp_path / "data").iterdir()) == ["secret.key", "token.key"]


def test_an_empty_key_file_is_refused_not_used(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "secret.key").write_text("", encoding="utf-8")
    with pytest.raises(SettingsError, match="secret.key is empty"):
        Settings.load({"CHARTCITE_DATA_DIR": str(data)}).ensure_secret()


def test_a_key_another_process_wrote_after_our_check_is_kept(tmp_path, monkeypatch):
    """The race made deterministic: the other process's key lands between our look and our write."""
    data = tmp_path / "data"
    data.mkdir()
    theirs = "f" * 64
    (data / "secret.key").write_text(theirs, encoding="utf-8")
    monkeypatch.setattr(Path, "exists", lambda self: False if self.name == "secret.key" else Path.is_dir(self) or Path.is_file(self))
    assert Settings.load({"CHARTCITE_DATA_DIR": str(data)}).ensure_secret() == theirs
    assert (data / "secret.key").read_text(encoding="utf-8") == theirs


def self_signed_authority(folder: Path) -> tuple[Path, Path, Path]:
    """A hospital's internal CA and a server certificate for 127.0.0.1 that it signed."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key, server_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "Hospital Internal CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(1).not_valid_before(now).not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                       data_encipherment=False, key_agreement=False, key_cert_sign=True, crl_sign=True,
                                       encipher_only=False, decipher_only=False), critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
          .sign(ca_key, hashes.SHA256()))
    server = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "ehr")]))
              .issuer_name(ca_name).public_key(server_key.public_key()).serial_number(2)
              .not_valid_before(now).not_valid_after(now + datetime.timedelta(days=1))
              .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
              .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
              .sign(ca_key, hashes.SHA256()))
    pem = serialization.Encoding.PEM
    paths = folder / "ca.pem", folder / "server.pem", folder / "server.key"
    paths[0].write_bytes(ca.public_bytes(pem))
    paths[1].write_bytes(server.public_bytes(pem))
    paths[2].write_bytes(server_key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    return paths


DISCOVER = """
import sys
from smart_app.settings import Settings
from fhir_ingest.connection.smart_auth import LaunchError, discover
Settings.load().apply_tls_trust()
try:
    print(discover(sys.argv[1]).get("token_endpoint"))
except LaunchError as exc:
    print("refused:", exc)
"""


def test_an_ehr_behind_the_hospitals_own_authority_is_trusted_only_through_the_setting(tmp_path):
    import ssl

    from .stub_http import QuietHandler, serve

    ca, cert, key = self_signed_authority(tmp_path)

    class Handler(QuietHandler):
        def do_GET(self):
            self.send_json({"token_endpoint": "https://127.0.0.1/token", "authorization_endpoint": "https://127.0.0.1/auth"})

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server = serve(Handler, lambda sock: context.wrap_socket(sock, server_side=True))
    iss = f"https://127.0.0.1:{server.server_port}/fhir"
    env = {"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "CHARTCITE_DATA_DIR": str(tmp_path)}
    try:
        run = lambda extra: subprocess.run([sys.executable, "-c", DISCOVER, iss], env=env | extra, capture_output=True,
                                           text=True, timeout=120, encoding="utf-8")
        untrusted = run({})
        assert "refused:" in untrusted.stdout or untrusted.returncode != 0, untrusted.stdout
        trusted = run({"CHARTCITE_CA_BUNDLE": str(ca)})
        assert trusted.stdout.strip() == "https://127.0.0.1/token", trusted.stdout + trusted.stderr
    finally:
        server.shutdown()
    with pytest.raises(SettingsError, match="no certificate bundle"):
        Settings.load({"CHARTCITE_CA_BUNDLE": str(tmp_path / "absent.pem")})
