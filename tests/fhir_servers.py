"""Starting the EHR side for tests, as real processes on loopback: sekmet-fhir (a FHIR R4 server
from PyPI) loaded with Synthea bundles, and tests/ehr_server.py (the SMART authorization server)
in front of it."""
from __future__ import annotations

import gzip
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import requests

REPO = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(url: str, process: subprocess.Popen, log: Path, seconds: float = 60) -> None:
    deadline = time.time() + seconds
    while time.time() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{process.args[0]} exited with {process.returncode}:\n{log.read_text(encoding='utf-8')[-3000:]}")
        try:
            if requests.get(url, timeout=2).status_code < 500:
                return
        except requests.RequestException:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"{url} did not come up in {seconds}s:\n{log.read_text(encoding='utf-8')[-3000:]}")


def stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()


def start_sekmet(folder: Path, port: int | None = None) -> tuple[subprocess.Popen, str]:
    """sekmet-fhir on a free loopback port (or `port`: a restart after an outage), SQLite store in
    `folder`, no inbound validation (the Synthea bundles use US Core profiles it would look up)
    and no simulator."""
    executable = shutil.which("sekmet", path=str(Path(sys.executable).parent)) or shutil.which("sekmet")
    if not executable:
        raise RuntimeError("sekmet-fhir is not installed: run `make install-test`")
    port = port or free_port()
    base = f"http://127.0.0.1:{port}/fhir"
    config = folder / "sekmet.yaml"
    config.write_text(json.dumps({
        "base_url": base, "host": "127.0.0.1", "port": port, "data_dir": str(folder / "sekmet-data"),
        "validation": {"inbound": "off"}, "simulator": {"enabled": False}, "log_inbound": False}), encoding="utf-8")
    log = folder / "sekmet.log"
    process = subprocess.Popen([executable, "serve"], cwd=folder, stdout=log.open("a", encoding="utf-8"), stderr=subprocess.STDOUT,
                               env=os.environ | {"SEKMET_CONFIG": str(config)})
    wait_for(f"{base}/metadata", process, log)
    return process, base


def as_put_transaction(bundle: dict) -> dict:
    """Synthea posts its resources; PUT keeps the bundle's ids as the server's ids."""
    for entry in bundle.get("entry", []):
        resource, request = entry.get("resource", {}), entry.get("request", {})
        if request.get("method") == "POST" and resource.get("id"):
            entry["request"] = {"method": "PUT", "url": f"{resource['resourceType']}/{resource['id']}"}
    return bundle


def load_bundle(base: str, path: Path) -> None:
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as fh:
        bundle = as_put_transaction(json.load(fh))
    response = requests.post(base, json=bundle, headers={"Content-Type": "application/fhir+json"}, timeout=300)
    if response.status_code >= 300:
        raise RuntimeError(f"sekmet refused {path.name}: {response.status_code} {response.text[:300]}")


def support_bundles(synthea: Path, patient_ids: list[str]) -> list[Path]:
    """The hospital and practitioner bundles of the Synthea run(s) the patients came from. Each
    run's support files carry its start time in milliseconds, its metadata file the same time and
    the state; the two runs reuse NPIs, so loading the other run's would make references ambiguous."""
    import csv
    from datetime import datetime, timezone

    with open(synthea / "MANIFEST.tsv", encoding="utf-8") as fh:
        states = {row["patient_id"]: row["source_path"].split("/")[0].replace("synthea_data_", "")
                  for row in csv.DictReader(fh, delimiter="\t")}
    wanted = {states[pid] for pid in patient_ids}
    stamps = set()
    for meta in (synthea / "support").glob("*Z_*_*.json"):
        when, rest = meta.name[:20], meta.name[21:].lower()
        if any(f"_{state}_" in rest for state in wanted):
            stamps.add(int(datetime.strptime(when, "%Y_%m_%dT%H_%M_%SZ").replace(tzinfo=timezone.utc).timestamp()))
    return sorted(p for p in (synthea / "support").glob("*Information*.json*")
                  if int(p.name.split("Information")[1][:13]) // 1000 in stamps)


def load_uscore(base: str, uscore: Path) -> None:
    """HL7's US Core example resources, each at its own id (one transaction of PUTs)."""
    entries = []
    for path in sorted(uscore.glob("*.json")):
        resource = json.loads(path.read_text(encoding="utf-8"))
        if resource.get("resourceType") != "Bundle":
            entries.append({"resource": resource, "request": {"method": "PUT",
                                                              "url": f"{resource['resourceType']}/{resource['id']}"}})
    response = requests.post(base, json={"resourceType": "Bundle", "type": "transaction", "entry": entries},
                             headers={"Content-Type": "application/fhir+json"}, timeout=300)
    if response.status_code >= 300:
        raise RuntimeError(f"sekmet refused the US Core examples: {response.status_code} {response.text[:300]}")


def load_synthea(base: str, synthea: Path, patient_ids: list[str], group_id: str = "chartcite-test-group") -> None:
    """Support bundles first (they resolve the Practitioner?identifier= references), then patients,
    then a Group of them for Bulk Data."""
    for support in support_bundles(synthea, patient_ids):
        load_bundle(base, support)
    for pid in patient_ids:
        load_bundle(base, synthea / f"{pid}.json.gz")
    group = {"resourceType": "Group", "id": group_id, "type": "person", "actual": True,
             "member": [{"entity": {"reference": f"Patient/{pid}"}} for pid in patient_ids]}
    requests.put(f"{base}/Group/{group_id}", json=group, headers={"Content-Type": "application/fhir+json"},
                 timeout=30).raise_for_status()


def start_ehr_server(folder: Path, upstream: str, client_id: str, chartcite_url: str, jwks_url: str,
                     standalone_patient: str = "") -> tuple[subprocess.Popen, str]:
    port = free_port()
    log = folder / "ehr-server.log"
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.ehr_server", "--port", str(port), "--upstream", upstream,
         "--client-id", client_id, "--redirect-prefix", chartcite_url, "--client-jwks-url", jwks_url,
         "--standalone-patient", standalone_patient],
        cwd=REPO, stdout=log.open("w", encoding="utf-8"), stderr=subprocess.STDOUT)
    root = f"http://127.0.0.1:{port}"
    wait_for(f"{root}/fhir/.well-known/smart-configuration", process, log)
    return process, root


def serve_folder(folder: Path):
    """A plain web server for a folder on a free loopback port, on a thread (a JWKS file for the
    test server to fetch when no `chartcite serve` runs). Stop it with .shutdown()."""
    from functools import partial
    from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
    from threading import Thread

    class Quiet(SimpleHTTPRequestHandler):
        def log_message(self, *args):
            return None

    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(Quiet, directory=str(folder)))
    Thread(target=server.serve_forever, daemon=True).start()
    return server


def published_keys(env: dict) -> list[dict]:
    """chartcite's published signing keys (its JWKS), read from the registry the environment names."""
    code = ("from smart_app.settings import Settings; from workers.sync import open_registry; import json; "
            "print(json.dumps(open_registry(Settings.load()).published_keys()))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=120, encoding="utf-8")
    return json.loads(out.stdout)
