"""Careless and hostile input through real `chartcite index` processes: a bad file, line, entry or
byte costs only itself and is reported with its position; no input removes or rewrites another
patient's record; the exit code says when something was skipped; the index stays consistent."""
from __future__ import annotations

import gzip
import json
import os
import stat
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

from .conftest import clean_env

REPO = Path(__file__).resolve().parent.parent
A = "936988e9-d587-ef42-ebdf-541238540ff3"      # the smallest shared record
B = "8ef99ca1-5615-7aa6-d383-47fe931a1f14"      # has a recorded aspirin allergy
EXIT_SKIPPED = 3


def run(args, env, umask: int | None = None):
    return subprocess.run([sys.executable, "-m", "smart_app.cli", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=600, preexec_fn=(lambda: os.umask(umask)) if umask is not None else None, encoding="utf-8")


def potassium(oid: str, patient: str, day: str, value: float, version: str = "", text: str = "Potassium") -> dict:
    resource = {"resourceType": "Observation", "id": oid, "status": "final",
                "category": [{"coding": [{"system": "http://terminology.hl7.org/CodeSystem/observation-category",
                                          "code": "laboratory"}]}],
                "code": {"coding": [{"system": "http://loinc.org", "code": "2823-3", "display": "Potassium"}],
                         "text": text},
                "subject": {"reference": f"Patient/{patient}"}, "effectiveDateTime": f"{day}T09:00:00Z",
                "valueQuantity": {"value": value, "unit": "mmol/L", "system": "http://unitsofmeasure.org",
                                  "code": "mmol/L"}}
    if version:
        resource["meta"] = {"versionId": version}
    return resource


def collection(*resources) -> dict:
    return {"resourceType": "Bundle", "type": "collection", "entry": [{"resource": r} for r in resources]}


def chunk_counts(env) -> dict[str, int]:
    out = run(["patients", "--json"], env)
    assert out.returncode == 0, out.stderr
    rows = [json.loads(line) for line in out.stdout.splitlines() if line.strip()]
    return {r["patient_id"]: sum(r["chunk_counts"].values()) for r in rows}


def catalog(env):
    from search.backends.embedded import EmbeddedBackend

    return EmbeddedBackend(Path(env["CHARTCITE_DATA_DIR"]) / "index.sqlite", None)


def ask_all(env, questions: list[tuple[str, str]], tmp: Path) -> list[dict]:
    batch = tmp / "questions.jsonl"
    batch.write_text("".join(json.dumps({"patient_id": pid, "question": q}) + "\n" for pid, q in questions), encoding="utf-8")
    out = run(["ask", "--batch", str(batch)], env)
    assert out.returncode == 0, out.stderr
    return [json.loads(line) for line in out.stdout.splitlines()]


@pytest.fixture(scope="module")
def env(tmp_path_factory, synthea_dir):
    env = clean_env(data_dir=tmp_path_factory.mktemp("hostile-data"))
    out = run(["index", str(synthea_dir / f"{A}.json.gz"), str(synthea_dir / f"{B}.json.gz")], env)
    assert out.returncode == 0, out.stdout + out.stderr
    return env


def test_a_stray_resource_adds_to_the_patient_it_names_and_removes_nothing(env, synthea_dir, tmp_path):
    """A's bundle plus one Observation of B: B's record is added to, never replaced."""
    before = chunk_counts(env)
    bundle = json.loads(gzip.open(synthea_dir / f"{A}.json.gz").read())
    bundle["entry"].append({"fullUrl": "urn:uuid:0d1f8a36-6d6e-4f6a-9a57-3f7e7d0c0b01",
                            "resource": potassium("stray-k", B, "2024-03-12", 5.9)})
    path = tmp_path / "a-plus-stray.json"
    path.write_text(json.dumps(bundle), encoding="utf-8")
    out = run(["index", str(path)], env)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "removed: 0" in out.stdout
    assert B in out.stdout.split("added to the records held")[1]
    after = chunk_counts(env)
    assert after[A] == before[A] and after[B] > before[B]
    allergy, stray = ask_all(env, [(B, "Does he have any allergies?"), (B, "K+ on March 12, 2024?")], tmp_path)
    assert not allergy["abstained"] and any(c["resource_type"] == "AllergyIntolerance" for c in allergy["citations"])
    assert "5.9" in stray["answer"]
    assert run(["check"], env).returncode == 0


def bundle_of(*resources, **fields) -> dict:
    """A collection Bundle whose entries carry the `urn:uuid` fullUrls Synthea's references use."""
    return {"resourceType": "Bundle", "type": "collection", **fields,
            "entry": [{"fullUrl": f"urn:uuid:{r['id']}", "resource": r} for r in resources]}


def synthea_resources(synthea_dir: Path, pid: str) -> list[dict]:
    return [e["resource"] for e in json.loads(gzip.open(synthea_dir / f"{pid}.json.gz").read())["entry"]]


def patient_of_record(synthea_dir: Path, pid: str) -> dict:
    return next(r for r in synthea_resources(synthea_dir, pid) if r["resourceType"] == "Patient")


def held_refs(env, pid: str) -> set[str]:
    return {f"{r['resourceType']}/{r['id']}" for r in catalog(env).patient_resources("default", pid)}


def test_a_patient_only_ndjson_export_removes_nothing(env, synthea_dir, tmp_path):
    """Patient.ndjson as a Bulk export writes it: each line is its own document, never a record."""
    before = chunk_counts(env)
    path = tmp_path / "Patient.ndjson"
    path.write_text("".join(json.dumps(patient_of_record(synthea_dir, pid)) + "\n" for pid in (A, B)), encoding="utf-8")
    out = run(["index", str(path)], env)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "removed: 0" in out.stdout
    added = out.stdout.split("added to the records held")[1].split("\n")[0]
    assert A in added and B in added
    assert chunk_counts(env) == before
    allergy, = ask_all(env, [(B, "Does he have any allergies?")], tmp_path)
    assert not allergy["abstained"] and any(c["resource_type"] == "AllergyIntolerance" for c in allergy["citations"])
    assert run(["check"], env).returncode == 0


@pytest.mark.parametrize("shape", ["bundle", "bare resource"])
def test_a_document_holding_only_the_patient_removes_nothing(env, synthea_dir, tmp_path, shape):
    before, held = chunk_counts(env), held_refs(env, B)
    patient = patient_of_record(synthea_dir, B)
    path = tmp_path / "only-the-patient.json"
    path.write_text(json.dumps(bundle_of(patient) if shape == "bundle" else patient), encoding="utf-8")
    out = run(["index", str(path)], env)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "removed: 0" in out.stdout and B in out.stdout.split("added to the records held")[1]
    assert chunk_counts(env) == before and held_refs(env, B) == held
    assert run(["check"], env).returncode == 0


def test_the_patient_with_one_new_result_is_merged_and_the_report_says_why(env, synthea_dir, tmp_path):
    before, held = chunk_counts(env), held_refs(env, B)
    path = tmp_path / "patient-and-a-result.json"
    path.write_text(json.dumps(bundle_of(patient_of_record(synthea_dir, B), potassium("new-k", B, "2024-06-02", 3.2))), encoding="utf-8")
    out = run(["index", str(path)], env)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "removed: 0" in out.stdout
    assert (f"patient-and-a-result.json: holds only 1 of the {len(held)} resources held for patient {B}: merged "
            f"into the record held, nothing removed") in out.stdout
    assert held_refs(env, B) == held | {"Observation/new-k"}
    assert chunk_counts(env)[B] > before[B]
    assert run(["check"], env).returncode == 0


def test_a_bundle_replaces_the_record_only_when_it_confirms_what_it_removes(env, synthea_dir, tmp_path):
    """The patient's whole bundle less one result replaces the record (that result leaves); a
    bundle of the Patient and a few results is merged; the patient's own `$everything` searchset
    replaces whatever it holds."""
    C = "d5d42b99-0256-5ee0-e4b8-3b6237a806d5"
    assert run(["index", str(synthea_dir / f"{C}.json.gz")], env).returncode == 0
    resources = synthea_resources(synthea_dir, C)
    results = [r for r in resources if r["resourceType"] == "Observation"]
    less_one = tmp_path / "less-one.json"
    less_one.write_text(json.dumps(bundle_of(*[r for r in resources if r is not results[0]])), encoding="utf-8")
    out = run(["index", str(less_one)], env)
    assert out.returncode == 0 and "removed: 0" not in out.stdout, out.stdout + out.stderr
    held = held_refs(env, C)
    assert f"Observation/{results[0]['id']}" not in held and len(held) > 20

    few = [r for r in resources if r["resourceType"] == "Patient"] + results[1:4]
    (tmp_path / "few.json").write_text(json.dumps(bundle_of(*few)), encoding="utf-8")
    out = run(["index", str(tmp_path / "few.json")], env)
    assert "removed: 0" in out.stdout and "merged into the record held" in out.stdout, out.stdout
    assert held_refs(env, C) == held

    everything = bundle_of(*few, type="searchset",
                           link=[{"relation": "self", "url": f"https://ehr.example/fhir/Patient/{C}/$everything"}])
    (tmp_path / "everything.json").write_text(json.dumps(everything), encoding="utf-8")
    out = run(["index", str(tmp_path / "everything.json")], env)
    assert out.returncode == 4 and "more than the removal budget of 50%" in out.stdout, out.stdout
    assert held_refs(env, C) == held
    out = run(["index", "--allow-removals", str(tmp_path / "everything.json")], env)
    assert out.returncode == 0 and "removed: 0" not in out.stdout, out.stdout + out.stderr
    assert held_refs(env, C) == {f"{r['resourceType']}/{r['id']}" for r in few}
    assert run(["check"], env).returncode == 0


def a_bundle_with_a_stray(synthea_dir: Path, stray: dict, path: Path) -> str:
    """A's bundle with one resource of B's appended; returns the stray's position."""
    bundle = json.loads(gzip.open(synthea_dir / f"{A}.json.gz").read())
    bundle["entry"].append({"fullUrl": f"urn:uuid:{stray['id']}", "resource": stray})
    path.write_text(json.dumps(bundle), encoding="utf-8")
    return f"{path.name}#entry[{len(bundle['entry']) - 1}]"


def b_allergies(synthea_dir: Path) -> list[dict]:
    """B's allergies, their patient named as outside B's bundle (where `urn:uuid:` resolves)."""
    return [dict(r, patient={"reference": f"Patient/{B}"}) for r in synthea_resources(synthea_dir, B)
            if r["resourceType"] == "AllergyIntolerance"]


def refuted(allergy: dict) -> dict:
    return dict(allergy, verificationStatus={"coding": [{
        "system": "http://terminology.hl7.org/CodeSystem/allergyintolerance-verification", "code": "refuted"}]})


@pytest.mark.parametrize("held_meta, stray_meta, words", [
    ({"versionId": "3"}, {"versionId": "1"}, "is older (version 1) than the version held for patient {B} (version 3)"),
    ({"lastUpdated": "2024-05-01T10:00:00Z"}, {"lastUpdated": "2023-01-01T10:00:00+00:00"},
     "is older (last updated 2023-01-01T10:00:00+00:00) than the version held for patient {B} "
     "(last updated 2024-05-01T10:00:00Z)"),
])
def test_a_stale_stray_never_rewrites_the_record_held(env, synthea_dir, tmp_path, held_meta, stray_meta, words):
    """B's allergy held at a version; an older copy saying "refuted" inside A's file keeps out."""
    allergies = b_allergies(synthea_dir)
    allergy = dict(allergies[0] if "versionId" in held_meta else allergies[1], meta=held_meta)
    ref = f"AllergyIntolerance/{allergy['id']}"
    (tmp_path / "held.ndjson").write_text(json.dumps(allergy) + "\n", encoding="utf-8")
    assert run(["index", str(tmp_path / "held.ndjson")], env).returncode == 0
    position = a_bundle_with_a_stray(synthea_dir, refuted(dict(allergy, meta=stray_meta)), tmp_path / "a-stale.json")
    out = run(["index", str(tmp_path / "a-stale.json")], env)
    assert out.returncode == 0, out.stdout + out.stderr
    assert (f"{position}: {ref}, read in a document that is not patient {B}'s own, "
            f"{words.format(B=B)}, which stays") in out.stdout
    held = catalog(env).get_resource("default", B, ref)
    assert held["meta"] == held_meta and held["verificationStatus"]["coding"][0]["code"] == "confirmed"
    answer, = ask_all(env, [(B, "Does he have any allergies?")], tmp_path)
    assert "refuted" not in answer["answer"].lower()
    assert run(["check"], env).returncode == 0


def test_a_newer_stray_that_changes_a_record_held_is_indexed_and_reported(env, synthea_dir, tmp_path):
    allergy = b_allergies(synthea_dir)[0]
    ref = f"AllergyIntolerance/{allergy['id']}"
    position = a_bundle_with_a_stray(synthea_dir, refuted(dict(allergy, meta={"versionId": "7"})),
                                     tmp_path / "a-newer.json")
    held = catalog(env).get_resource("default", B, ref)
    out = run(["index", str(tmp_path / "a-newer.json")], env)
    assert out.returncode == 0, out.stdout + out.stderr
    assert (f"{position}: {ref}, read in a document that is not patient {B}'s own, changes the record held for "
            f"patient {B} (") in out.stdout and "→ version 7): indexed as the newer version" in out.stdout
    assert catalog(env).get_resource("default", B, ref)["verificationStatus"]["coding"][0]["code"] == "refuted"
    # A later version puts it back as it was for the tests after this one.
    (tmp_path / "restore.ndjson").write_text(json.dumps(dict(held, meta={"versionId": "8"})) + "\n", encoding="utf-8")
    assert run(["index", str(tmp_path / "restore.ndjson")], env).returncode == 0
    assert catalog(env).get_resource("default", B, ref)["verificationStatus"] == held["verificationStatus"]


def test_duplicate_ids_keep_the_newest_version_and_say_so(env, tmp_path):
    path = tmp_path / "dupes.ndjson"
    newer, older = potassium("dup-k", A, "2024-04-01", 4.8, "2"), potassium("dup-k", A, "2024-04-01", 3.1, "1")
    path.write_text(json.dumps(newer) + "\n" + json.dumps(older) + "\n" + json.dumps(newer) + "\n", encoding="utf-8")
    out = run(["index", str(path)], env)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "dupes.ndjson:2: Observation/dup-k appears again" in out.stdout
    held = catalog(env).get_resource("default", A, "Observation/dup-k")
    assert held["valueQuantity"]["value"] == 4.8
    checked = run(["check", "--json"], env)
    assert checked.returncode == 0 and json.loads(checked.stdout)["problems"] == []


def test_the_same_id_under_two_patients_is_two_records(env, tmp_path):
    path = tmp_path / "shared-id.ndjson"
    path.write_text(json.dumps(potassium("same-id", A, "2024-05-01", 4.1)) + "\n"
                    + json.dumps(potassium("same-id", B, "2024-05-01", 5.2)) + "\n", encoding="utf-8")
    assert run(["index", str(path)], env).returncode == 0
    index = catalog(env)
    assert index.get_resource("default", A, "Observation/same-id")["valueQuantity"]["value"] == 4.1
    assert index.get_resource("default", B, "Observation/same-id")["valueQuantity"]["value"] == 5.2
    assert run(["check"], env).returncode == 0


def hostile_folder(folder: Path) -> dict[str, str]:
    """Bad files, lines, entries and bytes, each beside good resources. Returns the good ids and
    the value each one carries."""
    good = {f"good-{i}": (f"2023-0{1 + i // 9}-{1 + i % 9:02d}", round(4.0 + i / 100, 2)) for i in range(12)}
    obs = {oid: potassium(oid, A, day, value) for oid, (day, value) in good.items()}
    line = lambda resource: json.dumps(resource) + "\n"
    (folder / "deep.json").write_text('{"resourceType": "Observation", "id": "deep", "note": ' + "[" * 10_000
                                      + "]" * 10_000 + "}", encoding="utf-8")
    inner = json.dumps(obs["good-0"])
    (folder / "nested600.json").write_text('{"resourceType": "Bundle", "type": "collection", "entry": [{"resource": ' * 600
                                           + inner + "}]}" * 600, encoding="utf-8")
    (folder / "nested20.json").write_text('{"resourceType": "Bundle", "type": "collection", "entry": [{"resource": ' * 20
                                          + inner + "}]}" * 20, encoding="utf-8")
    (folder / "entries.json").write_text(json.dumps({"resourceType": "Bundle", "type": "collection", "entry": [
        {"resource": obs["good-1"]}, "a string", {"fullUrl": "urn:uuid:nothing-here"},
        {"resource": {"resourceType": ["Observation"], "id": "listed"}}, {"request": "DELETE"},
        {"resource": obs["good-2"]}]}), encoding="utf-8")
    (folder / "types.ndjson").write_text(
        line(obs["good-3"]) + '{"resourceType": ["Observation"], "id": "t1"}\n'
        + line(dict(obs["good-4"], resourceType="Obsrvation")) + line(dict(obs["good-4"], resourceType=123))
        + line(dict(obs["good-4"], id=5)) + line(dict(obs["good-4"], subject="Patient/" + A)) + line(obs["good-4"]), encoding="utf-8")
    whole = gzip.compress(json.dumps(collection(obs["good-5"])).encode())
    (folder / "corrupt.json.gz").write_bytes(whole[:20] + bytes(b ^ 0x5A for b in whole[20:60]) + whole[60:])
    lines = "".join(line(potassium(f"run-{i}", A, "2022-06-01", 4.5)) for i in range(400)).encode()
    (folder / "truncated.ndjson.gz").write_bytes(gzip.compress(line(obs["good-6"]).encode() + lines)[:-400])
    latin = json.dumps(collection(obs["good-7"])).encode().replace(b'"text": "Potassium"', b'"text": "Potassium caf\xe9"')
    (folder / "latin1.json").write_bytes(latin)
    bad_line = line(obs["good-9"]).encode().replace(b'"text": "Potassium"', b'"text": "K\xe9"')
    (folder / "badbyte.ndjson").write_bytes(line(obs["good-8"]).encode() + bad_line + line(obs["good-10"]).encode())
    (folder / "future.ndjson").write_text(line(dict(obs["good-11"], effectiveDateTime="2099-01-01T00:00:00Z")), encoding="utf-8")
    return {oid: str(value) for oid, (_, value) in good.items()}


def test_bad_files_lines_entries_and_bytes_cost_only_themselves(env, tmp_path):
    folder = tmp_path / "hostile"
    folder.mkdir()
    good = hostile_folder(folder)
    out = run(["index", str(folder)], env)
    report = out.stdout
    assert out.returncode == EXIT_SKIPPED, report + out.stderr
    expected = {
        "deep.json: JSON nested too deeply to read",
        "nested600.json: JSON nested too deeply to read",
        "nested20.json#entry[0]#entry[0]#entry[0]#entry[0]#entry[0]#entry[0]#entry[0]#entry[0]: Bundles nested more than 8 deep",
        "entries.json#entry[1]: bundle entry without a resource",
        "entries.json#entry[2]: bundle entry without a resource",
        "entries.json#entry[3]: invalid resourceType",
        "entries.json#entry[4]: bundle entry without a resource",
        "types.ndjson:2: invalid resourceType",
        "types.ndjson:3: unknown resource type 'Obsrvation'",
        "types.ndjson:4: invalid resourceType 123",
        "types.ndjson:5: Observation id 5 is not a FHIR id",
        "types.ndjson:6: Observation/good-4: subject",
        "corrupt.json.gz: unreadable file",
        "truncated.ndjson.gz:",
        "latin1.json: bytes that are not UTF-8 (first: 0xe9 at byte offset",
        "badbyte.ndjson:2: bytes that are not UTF-8 (first: 0xe9 at byte offset",
        "future.ndjson:1: Observation/good-11 is dated 2099-01-01, in the future",
    }
    missing = [want for want in expected if want not in report]
    assert not missing, f"not reported: {missing}\n{report}"
    assert "the lines before it were read" in report
    index = catalog(env)
    # good-0 sat inside the unreadable nests, good-5 inside the corrupt archive: those files cost themselves.
    indexed = {oid for oid in good if index.get_resource("default", A, f"Observation/{oid}")}
    assert indexed == set(good) - {"good-0", "good-5"}
    assert index.get_resource("default", A, "Observation/run-0") is not None   # lines before the damage
    assert index.get_resource("default", A, "Observation/good-9")["code"]["text"] == "K\ufffd"   # one character, not the line
    answer, = ask_all(env, [(A, "K+ on Jan 4, 2023?")], tmp_path)
    assert good["good-3"] in answer["answer"]
    assert run(["check"], env).returncode == 0


HOSTILE_IDS = {"10,000 characters": "x" * 10_000, "a NUL": "a\x00b", "a right-to-left override": "abc\u202efdp.exe",
               "SQL": "x' OR '1'='1", "a dot-segment": "..", "a final newline": "abc\n"}


def test_hostile_ids_from_references_or_resources_are_reported_and_skipped(env, tmp_path):
    """FHIR's id rule holds for every id chartcite stores: a resource's own and the patient's taken
    from `subject`, `patient` or `beneficiary`. Each such resource costs only itself."""
    lines = [potassium("good-beside-hostile-ids", A, "2021-03-01", 4.2)]
    for hostile in HOSTILE_IDS.values():
        lines.append(potassium("names-a-hostile-patient", hostile, "2021-03-02", 4.3))
        lines.append(potassium(hostile, A, "2021-03-03", 4.4))
    allergy = {"resourceType": "AllergyIntolerance", "id": "hostile-patient-field",
               "patient": {"reference": "Patient/.."}, "code": {"text": "peanut"}}
    coverage = {"resourceType": "Coverage", "id": "hostile-beneficiary", "status": "active",
                "beneficiary": {"reference": "Patient/x' OR '1'='1"}, "payor": [{"display": "Payer"}]}
    path = tmp_path / "ids.ndjson"
    path.write_text("".join(json.dumps(r) + "\n" for r in [*lines, allergy, coverage]), encoding="utf-8")
    before = set(chunk_counts(env))
    out = run(["index", str(path)], env)
    assert out.returncode == EXIT_SKIPPED, out.stdout + out.stderr
    for number, (what, hostile) in enumerate(HOSTILE_IDS.items()):
        quoted = json.dumps(hostile)[:80]
        assert (f"ids.ndjson:{2 + 2 * number}: Observation/names-a-hostile-patient: the patient it names, {quoted}, "
                f"is not a FHIR id") in out.stdout, what
        assert f"ids.ndjson:{3 + 2 * number}: Observation id {quoted} is not a FHIR id" in out.stdout, what
    assert f"ids.ndjson:{len(lines) + 1}: AllergyIntolerance/hostile-patient-field: the patient it names" in out.stdout
    assert f"ids.ndjson:{len(lines) + 2}: Coverage/hostile-beneficiary: the patient it names" in out.stdout
    assert "\x00" not in out.stdout and "\u202e" not in out.stdout
    assert set(chunk_counts(env)) == before
    index = catalog(env)
    assert index.get_resource("default", A, "Observation/good-beside-hostile-ids") is not None
    assert not any(index.get_resource("default", A, f"Observation/{hostile}") for hostile in HOSTILE_IDS.values())
    assert run(["check"], env).returncode == 0


def gzip_bomb(path: Path, head: bytes, filler_mb: int, tail: bytes) -> None:
    """A gzip file of `head`, `filler_mb` MB of spaces and `tail`, written a megabyte at a time."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)       # 31: the gzip container
    with path.open("wb") as out:
        out.write(packer.compress(head))
        for _ in range(filler_mb):
            out.write(packer.compress(b" " * 2**20))
        out.write(packer.compress(tail) + packer.flush())


def test_a_decompression_bomb_is_reported_with_its_position_and_skipped(env, tmp_path):
    """A few kilobytes of gzip holding tens of megabytes: read no further than the ratio allows,
    when one is set (none is by default: memory does not depend on it)."""
    folder = tmp_path / "bombs"
    folder.mkdir()
    inside = potassium("in-the-bomb", A, "2021-01-05", 4.4)
    first_line = potassium("before-the-bomb", A, "2021-01-06", 4.6)
    gzip_bomb(folder / "bomb.json.gz", b'{"resourceType": "Bundle", "type": "collection", "entry": [{"resource": '
              + json.dumps(inside).encode() + b'}], "padding": "', 40, b'"}')
    gzip_bomb(folder / "bomb.ndjson.gz", json.dumps(first_line).encode() + b'\n{"resourceType": "Observation", '
              b'"id": "x", "note": "', 40, b'"}\n')
    (folder / "good.ndjson").write_text(json.dumps(potassium("beside-the-bombs", A, "2021-01-07", 4.7)) + "\n", encoding="utf-8")
    out = run(["index", str(folder)], env | {"CHARTCITE_MAX_EXPANSION_RATIO": "200"})
    assert out.returncode == EXIT_SKIPPED, out.stdout + out.stderr
    size = (folder / "bomb.json.gz").stat().st_size
    assert (f"bomb.json.gz: the file expands more than 200 times its compressed size of {size:,} bytes "
            f"(CHARTCITE_MAX_EXPANSION_RATIO): the file is skipped") in out.stdout
    assert "bomb.ndjson.gz:2: the file expands more than 200 times" in out.stdout
    assert "the rest of the file is skipped; the lines before it were read" in out.stdout
    index = catalog(env)
    assert index.get_resource("default", A, "Observation/in-the-bomb") is None
    assert index.get_resource("default", A, "Observation/before-the-bomb") is not None
    assert index.get_resource("default", A, "Observation/beside-the-bombs") is not None
    assert run(["check"], env).returncode == 0


def test_the_expanded_size_limit_is_a_setting(env, tmp_path):
    path = tmp_path / "large.json.gz"
    gzip_bomb(path, b'{"resourceType": "Bundle", "type": "collection", "entry": [{"resource": '
              + json.dumps(potassium("in-the-large-file", A, "2021-02-05", 4.1)).encode() + b'}], "padding": "', 3,
              b'"}')
    settings = {"CHARTCITE_MAX_EXPANDED_MB": "2", "CHARTCITE_MAX_EXPANSION_RATIO": "1000000"}
    out = run(["index", str(path)], env | settings)
    assert out.returncode == EXIT_SKIPPED, out.stdout + out.stderr
    assert "large.json.gz: the file expands to more than 2 MB (CHARTCITE_MAX_EXPANDED_MB): the file is skipped" \
        in out.stdout
    assert catalog(env).get_resource("default", A, "Observation/in-the-large-file") is None
    assert run(["index", str(path)], env | settings | {"CHARTCITE_MAX_EXPANDED_MB": "8"}).returncode == 0
    assert catalog(env).get_resource("default", A, "Observation/in-the-large-file") is not None
    refused = run(["index", str(path)], env | {"CHARTCITE_MAX_EXPANSION_RATIO": "-1"})
    assert refused.returncode == 2 and "CHARTCITE_MAX_EXPANSION_RATIO must be 0 (no ratio limit) or more" \
        in refused.stderr


def test_a_file_that_does_not_exist_is_a_usage_error(env):
    out = run(["index", "/nonexistent/bundle.json"], env)
    assert out.returncode == 2 and "no such file" in out.stderr


def test_ask_batch_answers_every_line_and_reports_the_ones_it_cannot(env, tmp_path):
    batch = tmp_path / "batch.jsonl"
    batch.write_text("\n".join([
        json.dumps({"patient_id": A, "question": "labs on 2023-02-30"}),
        "not json at all",
        json.dumps(["a", "list"]),
        json.dumps({"patient_id": A, "question": "since 0000-01-01 any visits? \ud800"}),
        json.dumps({"patient_id": A}),
        json.dumps({"patient_id": A, "question": "on 2024-13-45 what meds?"}),
    ]) + "\n", encoding="utf-8")
    out = run(["ask", "--batch", str(batch)], env)
    assert out.returncode == EXIT_SKIPPED, out.stderr
    results = [json.loads(line) for line in out.stdout.splitlines()]
    assert len(results) == 6
    assert ["error" in r for r in results] == [False, True, True, False, True, False]
    assert all("answer" in r for r in results if "error" not in r)


def test_config_masks_every_credential(tmp_path):
    env = clean_env(data_dir=tmp_path / "data", llm_url="https://llm-user:llm/pa@ss@llm.example/v1",
                    broker_url="redis://:s3cr/et@redis.example:6379/0",
                    audit_url="postgresql+psycopg://audit:p@ss:w/rd@db.example/audit",
                    es_url="https://es:one@n1:9200,https://es:two@n2:9200", llm_api_key="sk-123")
    out = run(["config"], env)
    assert out.returncode == 0, out.stderr
    for secret in ("llm/pa@ss", "s3cr/et", "p@ss:w/rd", "one@", "two@", "sk-123"):
        assert secret not in out.stdout
    settings = json.loads(out.stdout)
    assert settings["llm_url"] == "https://llm-user:****@llm.example/v1"
    assert settings["broker_url"] == "redis://:****@redis.example:6379/0"


def test_config_masks_credentials_in_queries_and_odd_passwords(tmp_path):
    env = clean_env(data_dir=tmp_path / "data", redis_url="redis://:pa?ss#w0rd@redis.example:6379/0",
                    llm_url="https://llm.example/v1?auth=abc123xyz&client_secret=cs-999",
                    audit_url="postgresql+psycopg://audit:pw@db.example/audit?sslpassword=keypass77",
                    es_url="https://elastic:pa,ss@n1:9200,https://elastic:pa,ss@n2:9200")
    out = run(["config"], env)
    assert out.returncode == 0, out.stderr
    for secret in ("pa?ss#w0rd", "w0rd", "abc123xyz", "cs-999", "keypass77", "pa,ss", "ss@"):
        assert secret not in out.stdout, secret
    settings = json.loads(out.stdout)
    assert settings["es_url"] == "https://elastic:****@n1:9200,https://elastic:****@n2:9200"
    assert settings["celery_broker"] == "redis://:****@redis.example:6379/0"


def test_the_data_directory_is_private_whatever_the_umask(tmp_path, synthea_dir):
    env = clean_env(data_dir=tmp_path / "private")
    out = run(["index", str(synthea_dir / f"{A}.json.gz")], env, umask=0o022)
    assert out.returncode == 0, out.stderr
    data = tmp_path / "private"
    assert stat.S_IMODE(data.stat().st_mode) == 0o700
    files = [p for p in data.rglob("*") if p.is_file()]
    assert any(p.name == "index.sqlite" for p in files)
    assert {p.name: oct(stat.S_IMODE(p.stat().st_mode)) for p in files} == {p.name: "0o600" for p in files}


def test_a_10_mb_note_is_capped_reported_and_cut_within_the_window(embedder):
    """Cut in one pass (the old word-by-word cut re-tokenised half the note per word: minutes at
    2 GB for 10 MB); what is left out is in the report. Time and memory: bench/hostile_size.py."""
    import base64

    from fhir_ingest.record.chunk import MAX_NOTE_CHARS, PatientChunker

    text = "Patient seen today feeling well " * 320_000            # about 10 MB, one endless sentence
    note = {"resourceType": "DocumentReference", "id": "huge", "status": "current", "type": {"text": "Progress note"},
            "subject": {"reference": f"Patient/{A}"}, "date": "2024-05-01",
            "content": [{"attachment": {"contentType": "text/plain", "data": base64.b64encode(text.encode()).decode()}}]}
    budget = embedder.budget()
    chunker = PatientChunker("t", A, [{"resourceType": "Patient", "id": A}, note], budget)
    chunks = chunker.chunks()
    assert 0 < len(chunks) <= MAX_NOTE_CHARS // 400 and all(budget.fits(c.text) for c in chunks)
    assert [p.reason for p in chunker.problems] == [f"a note of {len(text):,} characters: the first 200,000 are "
                                                    f"indexed, the rest is not"]
