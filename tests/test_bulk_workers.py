"""A Bulk Data round spread over two real Celery workers on Redis, indexing into Elasticsearch, one
of them killed (SIGKILL) while it indexes a part. `chartcite sync --workers` exports and downloads,
then hands each part (a patient, here) to whichever worker takes it; the killed worker's part goes
back to the queue (acks_late), the other worker takes it once the dead worker's claim has lapsed,
and the part that finishes last finishes the round. Every part is completed exactly once, every
patient is in exactly one part, the index agrees with itself, and the cursor moves."""
from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import requests
from cryptography.fernet import Fernet

from .conftest import SYNTHEA, clean_env, es_url, redis_url
from .fhir_servers import (REPO, free_port, load_synthea, published_keys, serve_folder, start_ehr_server,
                           start_sekmet, stop)

CLIENT_ID = "chartcite-workers-client"
GROUP = "workers-group"
REDIS_DB = 5            # a database of its own: no other test's tasks reach these workers


def smallest_patients(count: int, run: str = "synthea_data_california") -> list[str]:
    """The smallest patients of one Synthea run (two runs reuse practitioner identifiers)."""
    with open(SYNTHEA / "MANIFEST.tsv", encoding="utf-8") as fh:
        rows = [line.split("\t") for line in fh.read().splitlines()[1:]]
    return [pid for _, pid in sorted((int(r[2]), r[1]) for r in rows if r[-1].startswith(run))[:count]]


@pytest.fixture(scope="module")
def workers_stack(tmp_path_factory, synthea_dir):
    import redis

    folder = tmp_path_factory.mktemp("bulk-workers")
    own_redis = redis_url().rsplit("/", 1)[0] + f"/{REDIS_DB}"
    redis.Redis.from_url(own_redis).flushdb()
    patients = smallest_patients(10)
    tenant = f"workers{uuid.uuid4().hex[:6]}"
    processes = []
    try:
        sekmet, fhir_base = start_sekmet(folder)
        processes.append(sekmet)
        load_synthea(fhir_base, synthea_dir, patients, GROUP)
        app_url = f"http://localhost:{free_port()}"
        env = clean_env(data_dir=folder / "data", demo_launch="false", public_url=app_url, backend="elasticsearch",
                        es_url=es_url(), redis_url=own_redis, tasks_eager="false", sync_lease_seconds=4,
                        task_visibility_seconds=15, bulk_patients_per_part=1, token_key=Fernet.generate_key().decode())
        ehr, ehr_root = start_ehr_server(folder, fhir_base, CLIENT_ID, app_url, "")
        processes.append(ehr)
        cli = lambda *args: subprocess.run([sys.executable, "-m", "smart_app.cli", *args], cwd=REPO, env=env,  # noqa: E731
                                           capture_output=True, text=True, timeout=600, encoding="utf-8")
        assert cli("keys", "generate").returncode == 0
        # The test server fetches chartcite's JWKS: without `chartcite serve` here, from a plain web server.
        (folder / "jwks.json").write_text(json.dumps({"keys": published_keys(env)}), encoding="utf-8")
        jwks_server = serve_folder(folder)
        requests.post(f"{ehr_root}/_test/client", timeout=30, json={
            "auth": "private_key_jwt", "jwks_url": f"http://127.0.0.1:{jwks_server.server_port}/jwks.json"}
        ).raise_for_status()
        added = cli("ehr", "add", "--name", tenant, "--iss", f"{ehr_root}/fhir", "--client-id", CLIENT_ID,
                    "--group-id", GROUP, "--backend-only")
        assert added.returncode == 0, added.stderr
        yield {"env": env, "cli": cli, "tenant": tenant, "patients": patients, "folder": folder}
    finally:
        for process in reversed(processes):
            stop(process)
        if "jwks_server" in locals():
            jwks_server.shutdown()
        from elasticsearch import Elasticsearch

        Elasticsearch([es_url()]).indices.delete(index=f"chartcite-{tenant}-*", ignore_unavailable=True,
                                                 allow_no_indices=True)


def parts(folder: Path) -> list[dict]:
    """The round's parts as the registry holds them (none before the sync made its tables)."""
    with sqlite3.connect(folder / "data" / "registry.sqlite", timeout=30) as db:
        db.row_factory = sqlite3.Row
        try:
            return [dict(row) for row in db.execute("SELECT * FROM bulk_part")]
        except sqlite3.OperationalError:
            return []


def start_worker(env: dict, log: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "smart_app.cli", "worker"], cwd=REPO, env=env,
                            stdout=log.open("a", encoding="utf-8"), stderr=subprocess.STDOUT, start_new_session=True)


def test_a_round_on_two_workers_indexes_each_patient_once_and_survives_a_killed_worker(workers_stack):
    env, folder = workers_stack["env"], workers_stack["folder"]
    workers = [start_worker(env, folder / f"worker-{n}.log") for n in range(2)]
    sync = subprocess.Popen([sys.executable, "-m", "smart_app.cli", "sync", "--tenant", workers_stack["tenant"],
                             "--workers"], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, encoding="utf-8")
    killed = None
    try:
        deadline = time.time() + 600
        while killed is None and time.time() < deadline:
            rows = parts(folder)
            running = [r for r in rows if r["state"] == "running"]
            if any(r["state"] == "done" for r in rows) and running:
                pids = {int(r["claimed_by"].rsplit(":", 1)[1]) for r in running}
                killed = next((w for w in workers if w.pid in pids), None)
            time.sleep(0.1)
        assert killed is not None, "no part was seen running after another was done"
        victim_part = next(r["n"] for r in parts(folder) if r["state"] == "running"
                           and r["claimed_by"].endswith(f":{killed.pid}"))
        os.killpg(killed.pid, signal.SIGKILL)
        out, err = sync.communicate(timeout=600)
    finally:
        for worker in workers:
            if worker.poll() is None:
                os.killpg(worker.pid, signal.SIGTERM)
                worker.wait(30)
        if sync.poll() is None:
            sync.kill()
    assert sync.returncode == 0, out + err
    assert f"synced {len(workers_stack['patients'])} patients" in out
    rows = parts(folder)
    assert all(r["state"] == "done" and r["completions"] == 1 for r in rows), rows
    members = [pid for r in rows for pid in json.loads(r["patients"])]
    assert sorted(members) == sorted(workers_stack["patients"])          # each in exactly one part
    survivor = next(w for w in workers if w is not killed)
    assert next(r for r in rows if r["n"] == victim_part)["claimed_by"].endswith(f":{survivor.pid}")
    checked = workers_stack["cli"]("check", "--tenant", workers_stack["tenant"], "--json")
    report = json.loads(checked.stdout)
    assert checked.returncode == 0 and report["problems"] == [], checked.stdout
    assert report["counts"]["patients"] == len(workers_stack["patients"])
    listed = json.loads(workers_stack["cli"]("ehr", "list", "--json").stdout)[0]
    assert listed["bulk_cursors"][GROUP]["since"] and listed["last_sync_status"].startswith("ok: 10 patients")
