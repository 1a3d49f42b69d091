"""The answer layer around retrieval: identifier scrubbing, claim verification, general questions,
the context bundle, summary drafts, rate limits and the audit trail (no language model here;
tests/test_llm.py runs the same guarantees against a real local model server)."""
from __future__ import annotations

import gzip
import json
import re
import shutil

import pytest

from search.answering.phi import Identifiers, scrub
from search.answering.verify import verify_statement
from smart_app.app import create_app
from smart_app.settings import Settings

from .conftest import InlineRunner, clean_env

PID = "8ef99ca1-5615-7aa6-d383-47fe931a1f14"      # two medications, an EpiPen, allergies
NEW = "936988e9-d587-ef42-ebdf-541238540ff3"


def bundle_resources(path) -> list[dict]:
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        return [e["resource"] for e in json.load(fh)["entry"]]


# --- identifiers never leave ----------------------------------------------------------------------------

def test_scrub_removes_the_patients_identifiers_from_synthea_notes(synthea_dir):
    resources = bundle_resources(synthea_dir / f"{PID}.json.gz")
    patient = next(r for r in resources if r["resourceType"] == "Patient")
    ids = Identifiers.from_patient(patient)
    import base64

    notes = [base64.b64decode(c["attachment"]["data"]).decode() for r in resources if r["resourceType"] == "DocumentReference"
             for c in r["content"] if c["attachment"].get("data")]
    assert notes
    family, given = patient["name"][0]["family"], patient["name"][0]["given"][0]
    assert any(given in n for n in notes)             # Synthea notes do name the patient
    for note in notes:
        clean = scrub(note, ids)
        for secret in (family, given, re.sub(r"\d+$", "", family), patient["birthDate"],
                       *(i["value"] for i in patient.get("identifier", [])),
                       *(a.get("city", "") for a in patient.get("address", [])),
                       *(t["value"] for t in patient.get("telecom", []))):
            assert secret not in clean, secret
    assert "epinephrine" in scrub("Prescribed epinephrine on 2019-05-01 for (555) 123-4567", ids)
    assert "(555) 123-4567" not in scrub("Call (555) 123-4567", ids)


# --- verification ----------------------------------------------------------------------------------------

def make_chunk(text: str, concepts: list[dict], date: str = "2024-03-01"):
    from fhir_ingest.record.contract import Chunk

    return Chunk(tenant="t", patient_id="p", resource_type="Observation", resource_id="x", part="0", text=text,
                 label="label", date=date, semantic_type="lab", concepts=concepts)


def test_verification_checks_numbers_dates_concepts_and_negation():
    a1c = {"key": "lex:hemoglobin a1c", "display": "hemoglobin a1c", "semantic_type": "lab", "negated": False}
    chunk = make_chunk("Lab result on 2024-03-01: Hemoglobin A1c/Hemoglobin.total in Blood = 7.4 %.", [a1c])
    assert verify_statement("Her A1c was 7.4% on 2024-03-01.", [chunk], []).supported
    assert verify_statement("Her A1c was 7.4% on March 1, 2024.", [chunk], []).supported
    assert "number" in verify_statement("Her A1c was 8.1%.", [chunk], []).reason
    assert "date" in verify_statement("Her A1c was 7.4% on 2023-01-05.", [chunk], []).reason
    assert "does not" in verify_statement("She has hypertension.", [chunk], []).reason
    assert not verify_statement("Her A1c was 7.4%.", [], []).supported
    assert "sentence" in verify_statement("Yes.", [chunk], []).reason       # cites, but states nothing
    assert "sentence" in verify_statement("1", [chunk], []).reason
    nka = {"key": "lex:allergy", "display": "allergy", "semantic_type": "allergy", "negated": True}
    note = make_chunk("No Known Allergies.", [nka])
    assert verify_statement("The note records no known allergies.", [note], []).supported
    assert "opposite" in verify_statement("She has a drug allergy.", [note], []).reason


# --- the app ---------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def app_and_data(tmp_path_factory, synthea_dir, embedder):
    source = tmp_path_factory.mktemp("source")
    for pid in (PID, NEW):
        shutil.copy(synthea_dir / f"{pid}.json.gz", source)
    data = tmp_path_factory.mktemp("data")
    settings = Settings.load({"CHARTCITE_DATA_DIR": str(data), "CHARTCITE_DEMO_SOURCE": str(source), "CHARTCITE_DEMO_LAUNCH": "true",
                              "CHARTCITE_RATE_LIMIT_CLINICIAN": "1000/minute"})
    app = create_app(settings, runner=InlineRunner(settings))
    return app, data, source


@pytest.fixture(scope="module")
def client(app_and_data):
    return app_and_data[0].test_client()


@pytest.fixture(scope="module")
def handle(client):
    page = client.post("/demo/launch", data={"patient_id": PID})
    return re.search(r'name="chartcite-session" content="([^"]+)"', page.get_data(as_text=True)).group(1)


def post(client, handle, path, body):
    return client.post(path, json=body, headers={"X-Chartcite-Session": handle})


def test_context_bundle_has_every_section_and_every_item_its_ref(client, handle):
    bundle = client.get("/api/context", headers={"X-Chartcite-Session": handle}).get_json()
    assert set(bundle) == {"problems", "medications", "allergies", "labs", "vitals", "encounters"}
    assert bundle["medications"] and bundle["allergies"] and bundle["vitals"] and bundle["encounters"]
    for items in bundle.values():
        for item in items:
            assert re.fullmatch(r"[A-Za-z]+/[\w.-]+", item["ref"])
    assert any("pinephrine" in m["name"] for m in bundle["medications"])
    assert all(m["status"] in ("active", "on-hold") for m in bundle["medications"])


def test_context_on_the_command_line(app_and_data, handle):
    import subprocess
    import sys

    _, data, source = app_and_data
    env = clean_env(data_dir=data, demo_source=source, demo_launch="true")
    out = subprocess.run([sys.executable, "-m", "smart_app.cli", "context", "--patient", PID, "--json"], env=env,
                         capture_output=True, text=True, timeout=120, encoding="utf-8")
    assert out.returncode == 0, out.stderr
    assert set(json.loads(out.stdout)) == {"problems", "medications", "allergies", "labs", "vitals", "encounters"}
    text = subprocess.run([sys.executable, "-m", "smart_app.cli", "context", "--patient", PID], env=env,
                          capture_output=True, text=True, timeout=120, encoding="utf-8").stdout
    assert "MEDICATIONS" in text and "[MedicationRequest/" in text


@pytest.mark.parametrize("kind", ["pre-visit", "medication-review"])
def test_drafts_cite_every_line_and_are_saved_only_when_asked(client, handle, app_and_data, kind):
    draft = post(client, handle, "/api/draft", {"kind": kind}).get_json()
    assert [s["title"] for s in draft["sections"]] == ["FINDINGS", "ASSESSMENT", "ITEMS TO REVIEW"]
    lines = [line for s in draft["sections"] for line in s["lines"]]
    assert lines and all(line["citations"] for line in lines)
    numbers = {c["n"] for c in draft["citations"]}
    assert all(set(line["citations"]) <= numbers for line in lines)
    listed = client.get("/api/drafts", headers={"X-Chartcite-Session": handle}).get_json()
    assert not [d for d in listed if d["draft"]["kind"] == kind]          # drafting saved nothing
    saved = post(client, handle, "/api/draft/save", {"draft": draft})
    assert saved.status_code == 201
    listed = client.get("/api/drafts", headers={"X-Chartcite-Session": handle}).get_json()
    [mine] = [d for d in listed if d["id"] == saved.get_json()["saved"]]
    assert mine["clinician"] == "demo-clinician" and mine["draft"]["sections"] == draft["sections"]


def test_a_draft_citing_another_patients_record_is_not_saved(client, handle):
    draft = post(client, handle, "/api/draft", {"kind": "medication-review"}).get_json()
    draft["citations"][0]["ref"] = "Observation/not-this-patients"
    refused = post(client, handle, "/api/draft/save", {"draft": draft})
    assert refused.status_code == 400 and "not a record of this patient" in refused.get_json()["error"]
    # A reference to another patient is refused before that, like any parameter naming one.
    draft["citations"][0]["ref"] = f"Patient/{NEW}"
    refused = post(client, handle, "/api/draft/save", {"draft": draft})
    assert refused.status_code == 403 and "not launched for that patient" in refused.get_json()["error"]


def test_general_questions_are_refused_without_a_model(client, handle):
    result = post(client, handle, "/api/ask", {"question": "What are the side effects of metformin?"}).get_json()
    assert result["abstained"] and result["general"] and not result["citations"] and not result["evidence"]
    assert "language model" in result["answer"]


@pytest.mark.parametrize("question, general", [
    ("What is hypertension?", True), ("What are the symptoms of sepsis?", True),
    ("What's A1c?", False), ("What is the potassium?", False), ("What is his blood pressure?", False)])
def test_a_measurement_in_the_chart_asks_for_the_patients_value(client, handle, question, general):
    result = post(client, handle, "/api/ask", {"question": question}).get_json()
    assert bool(result.get("general")) is general


def test_a_new_patient_says_so(client):
    from search.answering.answer import NEW_PATIENT

    page = client.post("/demo/launch", data={"patient_id": NEW})
    handle = re.search(r'name="chartcite-session" content="([^"]+)"', page.get_data(as_text=True)).group(1)
    app_search = client.application.extensions["chartcite.search"]
    result = app_search.ask("default", "never-indexed-patient", "any allergies?")
    assert result["answer"] == NEW_PATIENT and result["abstained"]
    assert post(client, handle, "/api/ask", {"question": "any allergies?"}).status_code == 200


def test_the_audit_trail_keeps_questions_apart_from_the_log(client, handle, app_and_data, caplog):
    question = "Does he carry an EpiPen for anaphylaxis?"
    with caplog.at_level("DEBUG"):
        result = post(client, handle, "/api/ask", {"question": question}).get_json()
    assert question not in caplog.text and PID not in caplog.text
    trail = client.application.extensions["chartcite.audit"]
    [entry] = trail.entries(kind="ask", limit=1)
    assert entry["question"] == question and entry["patient_id"] == PID and entry["clinician"] == "demo-clinician"
    assert entry["citations"] == [c["ref"] for c in result["citations"]] and entry["evidence"]
    assert [s["name"] for s in entry["stages"]][:2] == ["scope", "analyse"] and entry["answer"] == result["answer"]
    import subprocess
    import sys

    _, data, source = app_and_data
    out = subprocess.run([sys.executable, "-m", "smart_app.cli", "audit", "--jsonl", "--kind", "ask"],
                         env=clean_env(data_dir=data), capture_output=True, text=True, timeout=60, encoding="utf-8")
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    assert rows and rows[-1]["question"] == question
    admin = client.get("/admin/audit")
    assert admin.status_code == 200 and "EpiPen" in admin.get_data(as_text=True)


def test_asking_is_rate_limited_per_clinician_with_a_clear_message(tmp_path, synthea_dir, embedder):
    source = tmp_path / "source"
    source.mkdir()
    shutil.copy(synthea_dir / f"{NEW}.json.gz", source)
    settings = Settings.load({"CHARTCITE_DATA_DIR": str(tmp_path / "data"), "CHARTCITE_DEMO_SOURCE": str(source), "CHARTCITE_DEMO_LAUNCH": "true",
                              "CHARTCITE_RATE_LIMIT_CLINICIAN": "2/minute"})
    client = create_app(settings, runner=InlineRunner(settings)).test_client()
    page = client.post("/demo/launch", data={"patient_id": NEW})
    handle = re.search(r'name="chartcite-session" content="([^"]+)"', page.get_data(as_text=True)).group(1)
    codes = [post(client, handle, "/api/ask", {"question": "any allergies?"}).status_code for _ in range(3)]
    assert codes == [200, 200, 429]
    refused = post(client, handle, "/api/ask", {"question": "any allergies?"})
    assert "Too many questions" in refused.get_json()["error"] and "2 per 1 minute" in refused.get_json()["error"]


def test_rate_limits_are_shared_through_redis_across_app_processes(tmp_path, synthea_dir, embedder):
    """Production: every app process counts against the same Redis, so a clinician cannot get
    around the limit by landing on another worker."""
    import uuid

    from .conftest import redis_url as configured_redis

    redis_url = configured_redis()
    source = tmp_path / "source"
    source.mkdir()
    shutil.copy(synthea_dir / f"{NEW}.json.gz", source)
    tenant = f"limits-{uuid.uuid4().hex[:8]}"          # fresh counters for this run
    clients = []
    for name in ("a", "b"):
        settings = Settings.load({"CHARTCITE_DATA_DIR": str(tmp_path / "data"), "CHARTCITE_DEMO_SOURCE": str(source), "CHARTCITE_DEMO_LAUNCH": "true",
                                  "CHARTCITE_RATE_LIMIT_CLINICIAN": "2/minute", "CHARTCITE_REDIS_URL": redis_url,
                                  "CHARTCITE_TASKS_EAGER": "true", "CHARTCITE_TENANT": tenant})
        clients.append(create_app(settings, runner=InlineRunner(settings)).test_client())
    page = clients[0].post("/demo/launch", data={"patient_id": NEW})
    handle = re.search(r'name="chartcite-session" content="([^"]+)"', page.get_data(as_text=True)).group(1)
    codes = [post(c, handle, "/api/ask", {"question": "any allergies?"}).status_code for c in (clients[0], clients[1], clients[0])]
    assert codes == [200, 200, 429]


@pytest.mark.parametrize("question, empty", [
    ("drug allergies?", "No allergies are coded in this patient's record, and its notes state:"),
    ("any statins?", "I don't have evidence for that in this patient's record. No medications are coded in this "
                     "patient's record, and its notes state:")])
def test_an_empty_class_said_by_a_note_is_one_cited_claim(tmp_path, embedder, small_bundle, question, empty):
    """A record with no coded entries of the asked class whose notes say so ("No Active
    Medications."): the answer says none are coded and quotes the notes that state it, each cited,
    every clause carrying its [n] (issue 34: a note's statement of the class is itself evidence)."""
    from search.evaluate import uncited_clauses
    from search.service import SearchService

    service = SearchService("embedded", tmp_path / "index.sqlite")
    service.index_paths("t", [small_bundle])
    result = service.ask("t", small_bundle.name.split(".")[0], question)
    service.close()
    assert result["answer"].startswith(empty) and "[1]" in result["answer"], result["answer"]
    assert any(e["ref"].startswith("DocumentReference/") for e in result["evidence"])      # the note cited
    assert uncited_clauses(result) == 0, result["answer"]


# --- one drug's orders fold together, never with another drug's -----------------------------------------

LARGEST = "3458d2d7-2b13-ee85-cd49-4ab409c1af5d"     # the largest shared record: five drugs, three opioids with acetaminophen or not


@pytest.fixture(scope="module")
def largest_record(tmp_path_factory, synthea_dir, embedder):
    from search.service import SearchService

    path = synthea_dir / f"{LARGEST}.json.gz"
    service = SearchService("embedded", tmp_path_factory.mktemp("largest") / "index.sqlite")
    service.index_paths("t", [path])
    orders = {f"MedicationRequest/{r['id']}": r for r in bundle_resources(path) if r["resourceType"] == "MedicationRequest"}
    yield service, orders
    service.close()


def drug_code(order: dict) -> str:
    return ((order.get("medicationCodeableConcept") or {}).get("coding") or [{}])[0].get("code", "")


def lead_of(result: dict) -> tuple[str, list[str]]:
    lead = next(s for s in result["statements"] if s.get("lead"))
    refs = {c["n"]: c["ref"] for c in result["citations"]}
    return lead["text"], [refs[n] for n in map(int, re.findall(r"\[(\d+)\]", lead["text"]))]


def test_a_drugs_orders_fold_with_their_own_drug_only(largest_record):
    """Percocet (acetaminophen with oxycodone) and an acetaminophen with hydrocodone order share an
    ingredient: the Percocet clause counts and cites Percocet's orders only, its first date theirs."""
    service, orders = largest_record
    result = service.ask("t", LARGEST, "Is she on Percocet?")
    text, _ = lead_of(result)
    percocet = {ref: o for ref, o in orders.items()
                if "percocet" in json.dumps(o.get("medicationCodeableConcept")).lower()}
    code = drug_code(next(iter(percocet.values())))
    first = min(o["authoredOn"][:10] for o in percocet.values())
    clause = next(c for c in text.split("; ") if "Percocet" in c)
    assert f"the latest of {len(percocet)} orders, the first on {first}" in clause, text
    refs = {c["n"]: c["ref"] for c in result["citations"]}
    clause_refs = [refs[int(n)] for n in re.findall(r"\[(\d+)\]", clause)]
    assert clause_refs and all(drug_code(orders[ref]) == code for ref in clause_refs), (clause, clause_refs)


def test_the_medication_list_names_every_active_order(largest_record):
    """Asked for her medications, the direct answer cites an active order of every drug the record
    has active orders of, not only the orders that ranked."""
    service, orders = largest_record
    active = {drug_code(o) for o in orders.values() if o["status"] == "active"}
    for question in ("What medications is she on?", "current meds?"):
        text, cited = lead_of(service.ask("t", LARGEST, question))
        named = {drug_code(orders[ref]) for ref in cited if ref in orders and orders[ref]["status"] == "active"}
        assert named == active, (question, text)
