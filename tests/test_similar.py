"""Similar patients and cohort comparisons (issue 37): likeness, de-identification, tenants, opt-in,
cohort numbers against a direct computation, and the profile store on both backends."""
from __future__ import annotations

import gzip
import json
import re
import shutil
import uuid
from datetime import date, timedelta
from statistics import median

import numpy as np
import pytest

from .conftest import BACKENDS, InlineRunner, clean_env, demo_launch, drop_tenants, es_url, make_service

SUBSET = 10          # shared Synthea patients fully indexed in the clinic's tenant: fast on a loaded machine
CONDITIONS = {"diabetes": "lex:diabetes", "hypertension": "lex:hypertension",
              "chronic kidney disease": "lex:chronic kidney disease"}
ISO_DATE = re.compile(r"\b\d{4}-\d{2}-\d{2}\b|\b\d{4}-\d{2}\b")


def bundle(path) -> list[dict]:
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        return [e["resource"] for e in json.load(fh)["entry"]]


@pytest.fixture(scope="module")
def files(patient_files):
    return patient_files[:SUBSET + 1]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory, files):
    """The subset indexed in tenant "clinic"; the first patient's own record also in tenant
    "other" (a twin there would be the most similar patient of all if tenants leaked), and one
    patient alone in tenant "solo"."""
    from search.service import SearchService

    data = tmp_path_factory.mktemp("similar")
    svc = SearchService("embedded", data / "index.sqlite")
    assert not svc.index_paths("clinic", files[:SUBSET]).load.skipped
    svc.index_paths("other", [files[0], files[SUBSET]])
    svc.index_paths("solo", [files[1]])
    svc.close()
    return data


@pytest.fixture(scope="module")
def svc(data_dir):
    from search.service import SearchService

    service = SearchService("embedded", data_dir / "index.sqlite")
    yield service
    service.close()


@pytest.fixture(scope="module")
def shared(svc, patient_files, tmp_path_factory):
    """Every shared Synthea patient's profile in tenant "shared", built as indexing builds it
    (chunked and annotated, the profile text embedded) without embedding every chunk: likeness
    needs a workspace of some size, and the whole index of 60 patients is minutes here."""
    from fhir_ingest.record.load import LoadReport, assembled
    from fhir_ingest.record.reader import read_path
    from search.indexer import prepare_record
    from search.similar.profile import profile_keys, profile_text

    items = (item for path in patient_files for item in read_path(path))
    with assembled(items, LoadReport(), tmp_path_factory.mktemp("staging")) as assembler:
        built = [prepare_record("shared", assembler.record(pid), svc.embedder.budget()).profile
                 for pid in assembler.patient_ids()]
    for profile, vector in zip(built, svc.embedder.encode([profile_text(p) for p in built])):
        svc.backend.put_profile("shared", profile["patient_id"], profile, profile_keys(profile), vector)
    return {p["patient_id"]: p for p in built}


def profiles(svc, tenant: str) -> dict[str, dict]:
    ids = [p["patient_id"] for p in svc.patients(tenant)]
    return svc.catalog.get_profiles(tenant, ids)


def has_concept(profile: dict, concept: str) -> bool:
    return any(concept in p["concepts"] for p in profile["problems"])


def test_every_indexed_patient_has_a_profile_rebuilt_when_indexed(svc, files):
    held = profiles(svc, "clinic")
    assert len(held) == SUBSET
    assert all(re.fullmatch(r"\d{1,2}-\d{1,2}|90\+", p["age_band"]) for p in held.values())
    pid = files[2].name.split(".")[0]
    before = held[pid]
    resources = svc.held_resources("clinic", pid)
    conditions = [r for r in resources if r["resourceType"] == "Condition"]
    assert conditions
    # The patient indexed again without their problem list: the profile follows the record.
    from fhir_ingest.record.load import PatientRecord

    record = PatientRecord(pid, [r for r in resources if r["resourceType"] != "Condition"])
    svc.index_record("clinic", record)
    assert before["problems"] and not svc.catalog.get_profiles("clinic", [pid])[pid]["problems"]
    svc.index_record("clinic", PatientRecord(pid, resources))
    assert svc.catalog.get_profiles("clinic", [pid])[pid]["problems"] == before["problems"]


@pytest.mark.parametrize("condition", CONDITIONS)
def test_similar_patients_share_the_condition_far_more_often_than_chance(svc, shared, condition):
    concept = CONDITIONS[condition]
    held = shared
    holders = [pid for pid, p in held.items() if has_concept(p, concept)]
    if len(holders) < 2:
        pytest.fail(f"the subset holds fewer than two patients with {condition}: widen SUBSET")
    names = {pid: [p["name"] for p in held[pid]["problems"] if concept in p["concepts"]] for pid in holders}
    shares, chance = [], (len(holders) - 1) / (len(held) - 1)
    for pid in holders:
        top = svc.similar("shared", pid, 5)["similar"]
        sharing = sum(any(item == f"condition: {name}" for item in peer["shared"] for name in names[pid]) for peer in top)
        shares.append(sharing / min(5, len(holders) - 1))
    # At least twice as often as chance, and over three fifths of what could share it on average
    # (measured: hypertension 0.95, chance 0.31; diabetes 0.84, chance 0.15; CKD 0.85, chance 0.07).
    assert sum(shares) / len(shares) >= max(2 * chance, 0.6), (condition, shares, chance)


def test_a_patient_with_no_comparable_peer_gets_the_contracts_answer(svc, files):
    pid = files[1].name.split(".")[0]
    result = svc.similar("solo", pid, 5)
    assert result == {"similar": [], "message": "No comparable patients found in this workspace. Manual review "
                                                "recommended.", "confidence": "low", "source": result["source"]}


def identifiers(resources: list[dict]) -> set[str]:
    """Every name, id, birth date and address string of a patient record."""
    found = set()
    for r in resources:
        found.add(r["id"])
        if r["resourceType"] == "Patient":
            found.add(r.get("birthDate", ""))
            for name in r.get("name", []):
                found.update([name.get("family", ""), *name.get("given", [])])
            for address in r.get("address", []):
                found.update([*address.get("line", []), address.get("postalCode", "")])
            found.update(i.get("value", "") for i in r.get("identifier", []))
    return {text for text in found if len(text) >= 4}


def test_no_result_names_dates_or_identifies_another_patient(svc, shared, patient_files):
    held = {f.name.split(".")[0]: identifiers(bundle(f)) for f in patient_files}
    for pid in held:
        text = json.dumps(svc.similar("shared", pid, 10))
        others = set().union(*(ids for other, ids in held.items() if other != pid))
        leaked = [word for word in others if word in text]
        assert not leaked and not ISO_DATE.search(text), (pid, leaked, ISO_DATE.findall(text)[:3])
    from search.similar.cohort import Comparison

    text = json.dumps(svc.cohort("shared", Comparison("hypertension", ("hydrochlorothiazide", "amlodipine"),
                                                     "systolic BP", 24, minimum=1)))
    assert not ISO_DATE.search(text) and not any(word in text for ids in held.values() for word in ids)


def test_handles_are_opaque_and_new_in_every_response(svc, shared):
    pid = max(shared, key=lambda p: len(svc.similar("shared", p, 5)["similar"]))
    first, second = svc.similar("shared", pid, 5), svc.similar("shared", pid, 5)
    assert first["similar"]
    handles = [p["handle"] for p in first["similar"]]
    assert len(set(handles)) == len(handles) and not set(handles) & {p["handle"] for p in second["similar"]}
    assert [p["similarity"] for p in first["similar"]] == [p["similarity"] for p in second["similar"]]
    assert all(0 <= p["similarity"] <= 1 for p in first["similar"])


def test_another_tenants_patients_never_appear(svc, files):
    """The first patient's own record is in tenant "other": were tenants crossed, it would be
    this patient's most similar patient, at similarity 1."""
    pid = files[0].name.split(".")[0]
    assert all(p["similarity"] < 0.95 for p in svc.similar("clinic", pid, 19)["similar"])
    assert {p for p, _ in svc.catalog.nearest_profiles("clinic", pid, 100)} <= set(profiles(svc, "clinic"))
    twin = svc.similar("other", pid, 5)["similar"]
    assert len(twin) <= 1


def direct_change(resources: list[dict], drug: str, window_months: int) -> tuple[bool, float | None]:
    """The cohort's arithmetic done again on the raw FHIR: exposure = the first order naming the
    drug; change = the last systolic reading within the window after it minus the last in the
    year before it."""
    orders = sorted(r.get("authoredOn", "")[:10] for r in resources if r["resourceType"] == "MedicationRequest"
                    and drug in json.dumps(r.get("medicationCodeableConcept", {})).lower()
                    and r.get("status") != "entered-in-error")
    if not orders:
        return False, None
    start = date.fromisoformat(orders[0])
    readings = sorted((r["effectiveDateTime"][:10], c["valueQuantity"]["value"]) for r in resources
                      if r["resourceType"] == "Observation" and "effectiveDateTime" in r
                      for c in r.get("component", []) if c["code"]["coding"][0]["code"] == "8480-6"
                      and "valueQuantity" in c)
    before = [v for d, v in readings if (start - timedelta(days=365)).isoformat() <= d <= start.isoformat()]
    after = [v for d, v in readings if start.isoformat() < d <= (start + timedelta(days=round(window_months * 30.44))).isoformat()]
    return True, (after[-1] - before[-1]) if before and after else None


def test_cohort_numbers_equal_a_direct_computation_and_small_groups_are_suppressed(svc, shared, patient_files):
    from search.similar.cohort import NOT_EVIDENCE, Comparison

    drugs = ("hydrochlorothiazide", "amlodipine")
    expected = {drug: [] for drug in drugs}
    for path in patient_files:
        resources = bundle(path)
        if not any("hypertension" in json.dumps(r.get("code", {})).lower() for r in resources
                   if r["resourceType"] == "Condition"):
            continue
        exposed = {drug: direct_change(resources, drug, 24) for drug in drugs}
        taken = [drug for drug in drugs if exposed[drug][0]]
        if len(taken) == 1:
            expected[taken[0]].append(exposed[taken[0]][1])
    result = svc.cohort("shared", Comparison("hypertension", drugs, "systolic BP", 24, minimum=1))
    for group in result["groups"]:
        changes = [c for c in expected[group["exposure"]] if c is not None]
        assert group["patients"] == len(expected[group["exposure"]]), group
        assert group["with_measure"] == (len(changes) or None)
        assert group["median_change"] == (round(median(changes), 2) if changes else None)
    assert result["statement"] == NOT_EVIDENCE and result["unit"] == "mm[Hg]"
    assert any(expected[drug] for drug in drugs)
    small = svc.cohort("shared", Comparison("hypertension", drugs, "systolic BP", 24))     # at least 11 a group
    assert all(g["suppressed"] for g in small["groups"]) and small["suppressed"] == list(drugs)
    assert all(g["median_change"] is None and g["with_measure"] is None and "fewer than 11" in g["note"]
               and (g["patients"] is None or g["patients"] >= 11) for g in small["groups"])


def cli(args, env):
    import subprocess
    import sys

    from .conftest import REPO

    return subprocess.run([sys.executable, "-m", "smart_app.cli", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300, encoding="utf-8")


def test_off_by_default_and_per_registration_with_a_sentence_saying_how(svc, data_dir):
    pid = max((p["patient_id"] for p in svc.patients("clinic")), key=lambda p: len(svc.similar("clinic", p, 5)["similar"]))
    off = cli(["similar", "--patient", pid, "--tenant", "clinic", "--json"], clean_env(data_dir=data_dir))
    assert off.returncode != 0 and "CHARTCITE_SIMILAR_PATIENTS=on" in off.stderr and not off.stdout
    refused = cli(["cohort", "--condition", "hypertension", "--exposure", "losartan", "--exposure", "lisinopril",
                   "--outcome", "systolic BP", "--tenant", "clinic"], clean_env(data_dir=data_dir))
    assert refused.returncode != 0 and "CHARTCITE_SIMILAR_PATIENTS=on" in refused.stderr
    env = clean_env(data_dir=data_dir, similar_patients="on")
    on = cli(["similar", "--patient", pid, "--tenant", "clinic", "--json"], env)
    assert on.returncode == 0, on.stderr
    result = json.loads(on.stdout)
    assert result["message"] and all(set(peer) == {"handle", "similarity", "age_band", "sex", "shared", "followed"}
                                     for peer in result["similar"])
    # An EHR's tenant needs its registration's consent too.
    assert cli(["ehr", "add", "--name", "clinic", "--iss", "https://ehr.example.org/fhir", "--client-id", "c"],
               env).returncode == 0
    per_ehr = cli(["similar", "--patient", pid, "--tenant", "clinic"], env)
    assert per_ehr.returncode != 0 and "chartcite ehr update clinic --similar-patients on" in per_ehr.stderr
    assert cli(["ehr", "update", "clinic", "--similar-patients", "on"], env).returncode == 0
    assert cli(["similar", "--patient", pid, "--tenant", "clinic"], env).returncode == 0
    audit = cli(["audit", "--kind", "similar", "--jsonl"], env)
    entries = [json.loads(line) for line in audit.stdout.splitlines()]
    assert len(entries) == 2 and {e["patient_id"] for e in entries} == {pid}


@pytest.fixture(scope="module")
def frame(tmp_path_factory, synthea_dir, files, embedder):
    from smart_app.app import create_app
    from smart_app.settings import Settings

    source = tmp_path_factory.mktemp("frame-source")
    for path in files[:3]:
        shutil.copy(path, source)
    settings = Settings.load({"CHARTCITE_DATA_DIR": str(tmp_path_factory.mktemp("frame-data")),
                              "CHARTCITE_DEMO_SOURCE": str(source), "CHARTCITE_DEMO_LAUNCH": "true",
                              "CHARTCITE_SIMILAR_PATIENTS": "on"})
    app = create_app(settings, runner=InlineRunner(settings))
    client = app.test_client()
    handles = {path.name.split(".")[0]: {"X-Chartcite-Session": demo_launch(client, path.name.split(".")[0])}
               for path in files[:3]}
    return app, client, handles


def test_the_route_the_bundle_and_the_audit(frame, files):
    app, client, handles = frame
    pid = files[0].name.split(".")[0]
    response = client.post("/api/similar", json={"k": 2}, headers=handles[pid])
    assert response.status_code == 200, response.get_data(as_text=True)
    result = response.get_json()
    assert len(result["similar"]) <= 2 and result["source"].startswith("Other patients of this workspace")
    bundle = client.get("/api/context", headers=handles[pid]).get_json()
    assert set(bundle["similar_patients"]) >= {"similar", "message"}
    # A handle opens nothing: not as a patient, not as a record.
    for handle in [p["handle"] for p in result["similar"]]:
        for asked in (client.get(f"/api/record?ref=Patient/{handle}", headers=handles[pid]),
                      client.post("/api/similar", json={"patient_id": handle}, headers=handles[pid])):
            assert asked.status_code in (403, 404), asked.get_data(as_text=True)
    assert client.post("/api/similar", json={"k": 0}, headers=handles[pid]).status_code == 400
    assert client.post("/api/cohort", json={"condition": "hypertension", "exposures": ["losartan"], "outcome": "BP"},
                       headers=handles[pid]).status_code == 400
    audit = app.extensions["chartcite.audit"].entries(kind="similar")
    assert audit and all(e["patient_id"] == pid for e in audit)


def test_the_route_refuses_with_a_sentence_when_off(frame, files):
    app, client, handles = frame
    pid = files[0].name.split(".")[0]
    app.config["CHARTCITE"].similar_patients = False
    try:
        response = client.post("/api/similar", json={}, headers=handles[pid])
        assert response.status_code == 403 and "CHARTCITE_SIMILAR_PATIENTS=on" in response.get_json()["error"]
        assert "similar_patients" not in client.get("/api/context", headers=handles[pid]).get_json()
    finally:
        app.config["CHARTCITE"].similar_patients = True


def test_the_frame_shows_the_panel_only_where_it_is_turned_on(frame, files):
    app, client, _ = frame
    pid = files[1].name.split(".")[0]
    page = client.post("/demo/launch", data={"patient_id": pid}).get_data(as_text=True)
    assert 'id="similar"' in page and 'id="cohort-form"' in page and "(de-identified)" in page
    # The Summary's bundle comes without them, and is no use of them to audit.
    handle = {"X-Chartcite-Session": re.search(r'name="chartcite-session" content="([^"]+)"', page).group(1)}
    audited = len(app.extensions["chartcite.audit"].entries(kind="similar"))
    assert "similar_patients" not in client.get("/api/context?similar=no", headers=handle).get_json()
    assert len(app.extensions["chartcite.audit"].entries(kind="similar")) == audited
    assert client.get("/api/context?similar=maybe", headers=handle).status_code == 400
    app.config["CHARTCITE"].similar_patients = False
    try:
        page = client.post("/demo/launch", data={"patient_id": pid}).get_data(as_text=True)
        assert 'id="similar"' not in page and 'id="cohort-form"' not in page
    finally:
        app.config["CHARTCITE"].similar_patients = True


@pytest.fixture(params=BACKENDS)
def backend(request, tmp_path):
    if request.param == "embedded":
        from search.backends.embedded import EmbeddedBackend

        store = EmbeddedBackend(tmp_path / "index.sqlite", "test-model", 4)
    else:
        from search.backends.elastic import ElasticsearchBackend

        store = ElasticsearchBackend([es_url()], "test-model", 4)
    yield store
    store.close()


def test_the_profile_store_keeps_tenants_apart_on_both_backends(backend):
    run = uuid.uuid4().hex[:8]
    mine, theirs = f"a{run}", f"b{run}"
    series = {"systolic BP": [["2024-01-01", 150.0], ["2024-06-01", 132.0]], "LDL": [["2024-01-01", 130.0]]}

    def put(tenant, pid, vector, keys):
        profile = {"patient_id": pid, "medications": [{"ingredient": keys[0].split(":")[1]}], "measures": series}
        backend.put_profile(tenant, pid, profile, keys, np.asarray(vector, dtype=np.float32))

    cohort = lambda tenant, drugs: backend.cohort_profiles(tenant, drugs, ["concept:htn"], "systolic BP")
    put(mine, "p1", [1, 0, 0, 0], ["drug:losartan", "concept:htn"])
    put(mine, "p2", [0.8, 0.6, 0, 0], ["drug:lisinopril", "concept:htn"])
    put(mine, "p3", [0, 0, 1, 0], ["drug:losartan", "concept:htn"])
    put(mine, "p4", [0, 1, 0, 0], ["drug:losartan"])                       # the drug, not the condition
    put(theirs, "p9", [1, 0, 0, 0], ["drug:losartan", "concept:htn"])      # identical to p1, in another tenant
    nearest = backend.nearest_profiles(mine, "p1", 5)
    assert nearest[0][0] == "p2" and nearest[0][1] == pytest.approx(0.8, abs=1e-3)
    assert sorted(pid for pid, _ in nearest) == ["p2", "p3", "p4"]
    # A cohort reads only the medications and the outcome's series, of its tenant's patients with both keys.
    assert cohort(mine, ["drug:losartan"]) == [
        {"patient_id": pid, "medications": [{"ingredient": "losartan"}], "measures": {"systolic BP": series["systolic BP"]}}
        for pid in ("p1", "p3")]
    assert [p["patient_id"] for p in cohort(mine, ["drug:losartan", "drug:lisinopril"])] == ["p1", "p2", "p3"]
    assert backend.cohort_profiles(mine, ["drug:losartan"], ["concept:htn"], "HbA1c")[0]["measures"] == {}
    assert set(backend.get_profiles(mine, ["p1", "p9"])) == {"p1"}
    assert backend.nearest_profiles(mine, "p9", 5) == []
    # How rare a key is, counted in the tenant only (p9 holds losartan in the other).
    assert backend.key_frequencies(mine, ["drug:losartan", "drug:lisinopril", "drug:none"]) == \
        (4, {"drug:losartan": 3, "drug:lisinopril": 1})
    put(mine, "p1", [0, 0, 1, 0], ["drug:lisinopril", "concept:htn"])     # rebuilt: replaced, keys and all
    assert [pid for pid, _ in backend.nearest_profiles(mine, "p1", 1)] == ["p3"]
    assert [p["patient_id"] for p in cohort(mine, ["drug:losartan"])] == ["p3"]


def test_a_record_indexed_before_profiles_is_said_not_compared_rather_than_alone(tmp_path):
    from search.backends.embedded import EmbeddedBackend
    from search.similar.peers import NO_PEERS, NO_PROFILE, similar_patients

    backend = EmbeddedBackend(tmp_path / "index.sqlite", "test-model", 4)
    backend.put_profile("t", "peer", {"patient_id": "peer"}, [], np.asarray([1, 0, 0, 0], dtype=np.float32))
    result = similar_patients(backend, "t", "indexed-long-ago", 5)
    assert result["message"] == NO_PROFILE != NO_PEERS and not result["similar"]


@pytest.fixture(params=BACKENDS)
def one_patient(request, tmp_path, embedder, small_bundle):
    """The smallest shared record indexed alone in a fresh tenant of either backend."""
    svc = make_service(request.param, tmp_path)
    tenant = f"prof{uuid.uuid4().hex[:8]}"
    svc.index_paths(tenant, [small_bundle])
    yield svc, tenant, small_bundle.name.split(".")[0]
    for pid in svc.backend.profile_dimensions(tenant):
        svc.backend.delete_profile(tenant, pid)
    drop_tenants(svc, [tenant])
    svc.close()


def problems_of(svc, tenant: str) -> list[str]:
    return svc.catalog.check(tenant).problems


def test_a_removal_rebuilds_the_profile_and_a_record_removed_whole_takes_it_along(one_patient):
    svc, tenant, pid = one_patient
    resources = svc.held_resources(tenant, pid)
    conditions = [f"Condition/{r['id']}" for r in resources if r["resourceType"] == "Condition"]
    assert conditions and svc.catalog.get_profiles(tenant, [pid])[pid]["problems"]
    svc.delete_resources(tenant, pid, conditions)            # a Bulk round's `deleted` list
    assert svc.catalog.get_profiles(tenant, [pid])[pid]["problems"] == []
    assert problems_of(svc, tenant) == []
    svc.delete_resources(tenant, pid, [f"{r['resourceType']}/{r['id']}" for r in svc.held_resources(tenant, pid)])
    assert svc.catalog.get_profiles(tenant, [pid]) == {} and svc.catalog.profile_dimensions(tenant) == {}
    assert problems_of(svc, tenant) == []


def test_check_warns_of_missing_profiles_fails_on_stale_ones_and_repair_mends_them(one_patient):
    svc, tenant, pid = one_patient
    check = svc.catalog.check(tenant)
    assert check.problems == [] == check.warnings and check.counts["profiles"] == 1
    held = svc.catalog.get_profiles(tenant, [pid])[pid]
    svc.backend.delete_profile(tenant, pid)                   # as if indexed before profiles existed
    check = svc.catalog.check(tenant)
    assert check.problems == [] and len(check.warnings) == 1
    assert check.warnings[0].startswith("1 patients have no similarity profile yet") and "--repair" in check.warnings[0]
    svc.backend.put_profile(tenant, "gone-patient", {"patient_id": "gone-patient"}, [],
                            np.ones(svc.embedder.dimension, dtype=np.float32))
    assert "1 similarity profiles belong to patients" in " | ".join(problems_of(svc, tenant))
    assert svc.repair_profiles(tenant) == {"built": 1, "removed": 1}
    check = svc.catalog.check(tenant)
    assert check.problems == [] == check.warnings
    assert svc.catalog.get_profiles(tenant, [pid])[pid]["problems"] == held["problems"]
    svc.backend.put_profile(tenant, pid, held, [], np.ones(4, dtype=np.float32))    # another model's vector
    assert problems_of(svc, tenant) == ["1 similarity profiles were embedded by another model than the index's: "
                                        "`chartcite check --repair` (or `chartcite reindex`) rebuilds them"]
    assert svc.repair_profiles(tenant) == {"built": 1, "removed": 0} and problems_of(svc, tenant) == []
    assert svc.catalog.profile_dimensions(tenant) == {pid: [svc.embedder.dimension]}


def test_a_profile_of_an_earlier_version_is_warned_of_and_rebuilt_by_repair(one_patient):
    from search.similar.version import PROFILE_VERSION

    svc, tenant, pid = one_patient
    held = svc.catalog.get_profiles(tenant, [pid])[pid]
    assert held["version"] == PROFILE_VERSION
    vector = np.ones(svc.embedder.dimension, dtype=np.float32)
    svc.backend.put_profile(tenant, pid, dict(held, version=PROFILE_VERSION - 1), [], vector)   # an upgrade's
    check = svc.catalog.check(tenant)
    assert check.problems == [] and len(check.warnings) == 1
    assert check.warnings[0].startswith("1 similarity profiles were built by an earlier chartcite")
    assert svc.repair_profiles(tenant) == {"built": 1, "removed": 0}
    assert svc.catalog.check(tenant).warnings == []
    assert svc.catalog.get_profiles(tenant, [pid])[pid] == held


def test_the_check_command_warns_then_repairs_with_exit_0(tmp_path, small_bundle):
    """What the on-call operator sees after upgrading an index built before profiles existed."""
    from search.backends.embedded import EmbeddedBackend

    env = clean_env(data_dir=tmp_path)
    assert cli(["index", str(small_bundle)], env).returncode == 0
    pid = small_bundle.name.split(".")[0]
    store = EmbeddedBackend(tmp_path / "index.sqlite", None)
    store.delete_profile("default", pid)
    store.close()
    warned = cli(["check"], env)
    assert warned.returncode == 0, warned.stdout + warned.stderr
    assert "consistent" in warned.stdout and "warning: 1 patients have no similarity profile yet" in warned.stdout
    repaired = cli(["check", "--repair", "--json"], env)
    assert repaired.returncode == 0, repaired.stdout + repaired.stderr
    said = json.loads(repaired.stdout)
    assert said["repaired"] == {"built": 1, "removed": 0} and said["warnings"] == [] and said["counts"]["profiles"] == 1


def test_reindex_rebuilds_the_profiles_and_drops_stale_ones(tmp_path, embedder, small_bundle):
    svc = make_service("elasticsearch", tmp_path)
    tenant = f"reprof{uuid.uuid4().hex[:8]}"
    pid = small_bundle.name.split(".")[0]
    try:
        svc.index_paths(tenant, [small_bundle])
        built = svc.catalog.get_profiles(tenant, [pid])[pid]
        svc.backend.delete_profile(tenant, pid)                                   # indexed before profiles
        svc.backend.put_profile(tenant, pid, built, [], np.ones(4, dtype=np.float32))   # and an old model's
        svc.backend.put_profile(tenant, "gone-patient", {"patient_id": "gone-patient"}, [],
                                np.ones(embedder.dimension, dtype=np.float32))
        assert len(problems_of(svc, tenant)) == 2
        svc.reindex(tenant)
        assert problems_of(svc, tenant) == []
        assert svc.catalog.profile_dimensions(tenant) == {pid: [embedder.dimension]}
        assert svc.catalog.get_profiles(tenant, [pid])[pid]["problems"] == built["problems"]
    finally:
        for patient in svc.backend.profile_dimensions(tenant):
            svc.backend.delete_profile(tenant, patient)
        drop_tenants(svc, [tenant])
        svc.close()


def lab_reading(rid: str, loinc: str, value: float, unit: str, when: str = "2024-03-01", **extra) -> dict:
    return {"resourceType": "Observation", "id": rid, "status": "final", "subject": {"reference": "Patient/p"},
            "category": [{"coding": [{"system": "http://terminology.hl7.org/CodeSystem/observation-category",
                                      "code": "laboratory"}]}],
            "code": {"coding": [{"system": "http://loinc.org", "code": loinc}]}, "effectiveDateTime": when,
            "valueQuantity": {"value": value, "unit": unit, "system": "http://unitsofmeasure.org", "code": unit},
            **extra}


def test_labs_out_of_range_are_read_from_the_records_own_word_first_then_the_adult_table():
    from search.similar.profile import build_profile, profile_keys

    adult = {"resourceType": "Patient", "id": "p", "gender": "female", "birthDate": "1960-05-01"}
    resources = [
        adult,
        lab_reading("c1", "2160-0", 0.9, "mg/dL", when="2023-01-01"),
        lab_reading("c2", "2160-0", 1.9, "mg/dL"),                     # newest: above the table's 1.3
        lab_reading("g1", "33914-3", 45, "mL/min/{1.73_m2}",           # below 60, but the lab says normal
                    interpretation=[{"coding": [{"code": "N", "display": "Normal"}]}]),
        lab_reading("k1", "2823-3", 5.6, "mmol/L",                     # above the table's 5.2, within its own range
                    referenceRange=[{"low": {"value": 3.5}, "high": {"value": 6.0}}]),
        lab_reading("n1", "2951-2", 150, "mmol/L",
                    interpretation=[{"coding": [{"code": "H", "display": "High"}]}]),
    ]
    profile = build_profile("p", resources)
    assert profile["lab_states"] == {"Na+": "high", "creatinine": "high"}
    assert {"lab:creatinine high", "lab:Na+ high"} <= set(profile_keys(profile))
    # Another unit than the table's is converted to it (150 umol/L is 1.7 mg/dL; 80 is 0.9); a unit
    # that cannot be converted is not compared, nor is a child's reading.
    micromoles = build_profile("p", [adult, lab_reading("c3", "2160-0", 150, "umol/L")])
    normal = build_profile("p", [adult, lab_reading("c3", "2160-0", 80, "umol/L")])
    unconvertible = build_profile("p", [adult, lab_reading("c3", "2160-0", 150, "mg/g")])
    child = build_profile("p", [dict(adult, birthDate="2015-01-01"), lab_reading("c4", "2160-0", 1.9, "mg/dL")])
    assert micromoles["lab_states"] == {"creatinine": "high"}
    assert normal["lab_states"] == {} == unconvertible["lab_states"] == child["lab_states"]


def test_a_measures_series_is_kept_in_one_unit_and_what_cannot_be_converted_is_counted():
    from search.similar.profile import build_profile

    adult = {"resourceType": "Patient", "id": "p", "gender": "male", "birthDate": "1960-05-01"}
    profile = build_profile("p", [
        adult,
        lab_reading("w1", "29463-7", 80, "kg", when="2023-01-01"),
        lab_reading("w2", "29463-7", 170, "[lb_av]", when="2024-01-01"),     # 77.1 kg: a fall, not a rise
        lab_reading("w3", "29463-7", 12, "{beats}", when="2024-06-01"),      # no weight: left out, counted
        lab_reading("a1", "4548-4", 53, "mmol/mol", when="2024-01-01"),      # IFCC is not NGSP's percent / 10
        lab_reading("a2", "4548-4", 7.0, "%", when="2024-06-01"),
    ])
    assert profile["measures"]["weight"] == [["2023-01-01", 80.0], ["2024-01-01", pytest.approx(77.11, abs=0.01)]]
    assert profile["measures"]["HbA1c"] == [["2024-06-01", 7.0]]
    assert profile["measures_left_out"] == {"HbA1c": 1, "weight": 1}


def test_a_lab_out_of_range_in_both_patients_is_shared_and_weighs_likeness():
    from search.similar.peers import shared, similarity
    from search.similar.profile import build_profile

    def patient(pid: str, creatinine: float) -> dict:
        return build_profile(pid, [{"resourceType": "Patient", "id": pid, "gender": "male", "birthDate": "1950-01-01"},
                                   lab_reading(f"{pid}-c", "2160-0", creatinine, "mg/dL")])

    own, raised, normal = patient("a", 2.4), patient("b", 2.1), patient("c", 1.0)
    assert "lab: creatinine high" in shared(own, raised) and "lab: creatinine high" not in shared(own, normal)
    assert similarity(own, raised, 0.5, {}) > similarity(own, normal, 0.5, {})


def test_a_finding_weighs_half_a_disorder_and_an_untagged_problem_weighs_whole():
    from search.similar.peers import FINDING_WEIGHT, problem_units
    from search.similar.profile import build_profile

    def condition(rid: str, code: str, display: str) -> dict:
        return {"resourceType": "Condition", "id": rid, "subject": {"reference": "Patient/p"},
                "clinicalStatus": {"coding": [{"code": "active"}]}, "onsetDateTime": "2020-01-01",
                "code": {"coding": [{"system": "http://snomed.info/sct", "code": code, "display": display}],
                         "text": display}}

    profile = build_profile("p", [{"resourceType": "Patient", "id": "p", "gender": "male", "birthDate": "1950-01-01"},
                                  condition("a", "44054006", "Diabetes mellitus type 2 (disorder)"),
                                  condition("b", "162864005", "Body mass index 30+ - obesity (finding)"),
                                  condition("c", "", "Gout")])
    assert {p["name"]: p["tag"] for p in profile["problems"]} == {
        "Diabetes mellitus type 2": "disorder", "Body mass index 30+ - obesity": "finding", "Gout": ""}
    weights = {units: weight for units, weight in ((frozenset(k), w) for k, w in problem_units(profile, {}))}
    assert sorted(weights.values()) == [FINDING_WEIGHT, 1.0, 1.0] and FINDING_WEIGHT < 1.0
