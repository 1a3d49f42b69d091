"""What an input may remove, through real `chartcite index` processes (issue 41): a filtered or
partial `$everything`, an older snapshot of a whole record, and a removal over the budget each
leave the record held as it was, resource by resource, and the report says why in one line."""
from __future__ import annotations

import base64
import gzip
import json
from pathlib import Path

import pytest

from .conftest import clean_env
from .test_hostile import A, B, bundle_of, potassium, run, synthea_resources

EXIT_HELD_BACK = 4
EHR = "https://ehr.example/fhir"


@pytest.fixture
def env(tmp_path, synthea_dir):
    """B's whole record indexed in a data directory of the test's own."""
    env = clean_env(data_dir=tmp_path / "data")
    out = run(["index", str(synthea_dir / f"{B}.json.gz")], env)
    assert out.returncode == 0, out.stdout + out.stderr
    return env


def held(env, pid: str = B) -> dict[str, dict]:
    from search.backends.embedded import EmbeddedBackend

    index = EmbeddedBackend(Path(env["CHARTCITE_DATA_DIR"]) / "index.sqlite", None)
    try:
        return {f"{r['resourceType']}/{r['id']}": r for r in index.patient_resources("default", pid)}
    finally:
        index.close()


def everything(resources: list[dict], query: str = "", **fields) -> dict:
    url = f"{EHR}/Patient/{B}/$everything" + (f"?{query}" if query else "")
    links = [{"relation": "self", "url": url}] + fields.pop("links", [])
    return bundle_of(*resources, type="searchset", link=links, **fields)



def seven_of_b(synthea_dir: Path) -> list[dict]:
    resources = synthea_resources(synthea_dir, B)
    return [r for r in resources if r["resourceType"] == "Patient"] + \
        [r for r in resources if r["resourceType"] == "Observation"][:6]


@pytest.mark.parametrize("query, links, words", [
    ("_since=2024-01-01T00:00:00Z", [], "a `$everything` filtered by `_since`"),
    ("_type=Patient,Observation", [], "a `$everything` filtered by `_type`"),
    ("start=2024-01-01&end=2024-12-31", [], "a `$everything` filtered by `end`, `start`"),
    ("_count=7", [], "a `$everything` filtered by `_count`"),
    ("", [{"relation": "previous", "url": f"{EHR}/Patient/{B}/$everything?_page=3"}],
     "a `$everything` page that links to a previous page"),
])
def test_a_filtered_or_partial_everything_removes_nothing(env, synthea_dir, tmp_path, query, links, words):
    """Item 1: a page holding 7 of B's resources, its self link a filtered `$everything` or its
    last page, cut B to 7. Now B keeps every resource it held, and the report says why."""
    before = held(env)
    path = tmp_path / "everything-page.json"
    path.write_text(json.dumps(everything(seven_of_b(synthea_dir), query, links=links)), encoding="utf-8")
    out = run(["index", str(path)], env)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "removed: 0" in out.stdout
    assert f"everything-page.json: patient {B}: {words}: merged, nothing removed" in out.stdout
    assert held(env).keys() == before.keys()


def test_an_everything_holding_fewer_entries_than_its_total_removes_nothing(env, synthea_dir, tmp_path):
    before = held(env)
    path = tmp_path / "short.json"
    path.write_text(json.dumps(everything(seven_of_b(synthea_dir), total=64)), encoding="utf-8")
    out = run(["index", str(path)], env)
    assert out.returncode == 0 and "holding 7 of the 64 entries its total counts" in out.stdout, out.stdout
    assert held(env).keys() == before.keys()


def test_a_whole_bundle_with_an_entry_it_could_not_read_removes_nothing(env, synthea_dir, tmp_path):
    """Items 1 and 3 for files: B's whole bundle whose allergy entry cannot be read (its
    resourceType a list) removed the good copy held. A document that could not be read whole is
    no whole record: B keeps every resource, and the report says why."""
    before = held(env)
    damaged = [dict(r, resourceType=[r["resourceType"]]) if r["resourceType"] == "AllergyIntolerance" else r
               for r in synthea_resources(synthea_dir, B)]
    path = tmp_path / "damaged.json"
    path.write_text(json.dumps(bundle_of(*damaged)), encoding="utf-8")
    out = run(["index", str(path)], env)
    assert out.returncode == 3, out.stdout + out.stderr
    assert f"damaged.json: patient {B}: a Bundle with an entry that could not be read: merged, nothing removed" \
        in out.stdout
    assert held(env).keys() == before.keys()
    assert any(ref.startswith("AllergyIntolerance/") for ref in before)


def dated(resource: dict, when: str) -> dict:
    return dict(resource, meta={"lastUpdated": when})


def test_an_older_snapshot_of_the_whole_record_keeps_the_newer_results(env, synthea_dir, tmp_path):
    """Item 2: B indexed with 10 newer results, then B's bundle as it was in 2020. The snapshot
    confirms everything else; the 10 newer results stay, and the report says why."""
    newer = [dated(potassium(f"newer-k-{n}", B, "2026-05-30", 4.0 + n / 10), "2026-06-01T00:00:00Z")
             for n in range(10)]
    extra = tmp_path / "newer.ndjson"
    extra.write_text("".join(json.dumps(r) + "\n" for r in newer), encoding="utf-8")
    assert run(["index", str(extra)], env).returncode == 0
    before = held(env)
    assert all(f"Observation/{r['id']}" in before for r in newer)
    snapshot = tmp_path / "snapshot-2020.json"
    snapshot.write_text(json.dumps(bundle_of(*[dated(r, "2020-01-01T00:00:00Z")
                                               for r in synthea_resources(synthea_dir, B)])), encoding="utf-8")
    out = run(["index", str(snapshot)], env)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "removed: 0" in out.stdout
    assert (f"snapshot-2020.json: patient {B}: older than the record held (2020-01-01 vs 2026-06-01): merged, "
            f"10 held resource(s) kept") in out.stdout
    assert held(env).keys() == before.keys()


def test_an_everything_that_would_remove_most_of_the_record_is_held_back_unless_allowed(env, synthea_dir, tmp_path):
    """The removal budget: B's Patient and one result as B's unfiltered `$everything` would remove
    all the rest. It is not carried out, the report says how many and from which file, and the
    exit status says so; `--allow-removals` carries it out."""
    before = held(env)
    resources = synthea_resources(synthea_dir, B)
    two = [r for r in resources if r["resourceType"] == "Patient"] + \
        [next(r for r in resources if r["resourceType"] == "Observation")]
    path = tmp_path / "b-everything.json"
    path.write_text(json.dumps(everything(two)), encoding="utf-8")
    out = run(["index", str(path)], env)
    assert out.returncode == EXIT_HELD_BACK, out.stdout + out.stderr
    assert (f"b-everything.json: would remove {len(before) - 2} of the {len(before)} resources held for patient {B}, "
            f"more than the removal budget of 50% (CHARTCITE_MAX_REMOVAL_SHARE): not carried out") in out.stdout
    assert held(env).keys() == before.keys()
    checked = run(["check"], env)
    assert checked.returncode == 0 and "removals held back" in checked.stdout, checked.stdout
    assert f"b-everything.json: would remove {len(before) - 2} of the {len(before)}" in checked.stdout
    allowed = run(["index", "--allow-removals", str(path)], env)
    assert allowed.returncode == 0, allowed.stdout + allowed.stderr
    assert held(env).keys() == {f"{r['resourceType']}/{r['id']}" for r in two}
    assert "removals held back" not in run(["check"], env).stdout


# --- memory bounded by design, not by a ratio (items 6 and 7) -------------------------------------------

def blank_scan(pid: str, megabytes: int) -> dict:
    """A DocumentReference holding a blank scan inline: `megabytes` of zeros, base64 (compresses ~300 times)."""
    data = base64.b64encode(b"%PDF-1.4\n" + bytes(megabytes * 2**20)).decode()
    return {"resourceType": "DocumentReference", "id": f"scan-{megabytes}", "status": "current",
            "type": {"text": "Scanned document"}, "subject": {"reference": f"Patient/{pid}"},
            "date": "2024-05-01T09:00:00Z",
            "description": f"Referral letter scan {megabytes}",
            "content": [{"attachment": {"contentType": "application/pdf", "data": data}}]}


def a_bundle_with(synthea_dir: Path, path: Path, *extra: dict, **fields) -> set[str]:
    """A's bundle with `extra` entries and top-level `fields`, gzipped; returns A's refs in it."""
    bundle = json.loads(gzip.open(synthea_dir / f"{A}.json.gz").read()) | fields
    bundle["entry"] += [{"fullUrl": f"urn:uuid:{r['id']}", "resource": r} for r in extra]
    with gzip.open(path, "wt", encoding="utf-8") as out:
        json.dump(bundle, out)
    return {f"{e['resource']['resourceType']}/{e['resource']['id']}" for e in bundle["entry"]
            if e["resource"]["resourceType"] not in ("Claim", "ExplanationOfBenefit", "Provenance")}


def test_a_record_with_a_blank_scan_is_indexed_whole(tmp_path, synthea_dir):
    """Item 7: A's bundle with a blank 4 MB scan inline expands about 280 times its gzip size, and
    the ratio limit skipped the whole file: none of A's resources were indexed. Now all are."""
    env = clean_env(data_dir=tmp_path / "data")
    path = tmp_path / "a-with-a-scan.json.gz"
    refs = a_bundle_with(synthea_dir, path, blank_scan(A, 4))
    out = run(["index", str(path)], env)
    assert out.returncode in (0, 3) and "the file is skipped" not in out.stdout, out.stdout + out.stderr
    assert refs <= held(env, A).keys()


def test_an_attachment_over_the_cap_is_reported_and_the_rest_of_its_resource_indexed(tmp_path, synthea_dir):
    """Item 7: an attachment over the cap costs only itself: the file is read, the resource is
    indexed without it (its description is searchable) and the report names it."""
    from fhir_ingest.record.reader import MAX_ATTACHMENT_BYTES

    env = clean_env(data_dir=tmp_path / "data")
    megabytes = MAX_ATTACHMENT_BYTES * 3 // 4 // 2**20 + 1
    path = tmp_path / "a-with-a-large-scan.json.gz"
    refs = a_bundle_with(synthea_dir, path, blank_scan(A, megabytes))
    out = run(["index", str(path)], env)
    assert out.returncode in (0, 3), out.stdout + out.stderr
    assert f"DocumentReference/scan-{megabytes}: an attachment of" in out.stdout
    assert "MB an attachment may hold: left out; the rest of the resource is indexed" in out.stdout
    index = held(env, A)
    assert refs <= index.keys()
    scan = index[f"DocumentReference/scan-{megabytes}"]
    assert scan["description"] == f"Referral letter scan {megabytes}" and "data" not in scan["content"][0]["attachment"]


def test_a_bundle_larger_than_memory_would_like_is_read_as_a_stream(tmp_path, synthea_dir):
    """Item 7: a bundle over STREAM_OVER (here padded with spaces) is parsed entry by entry, its
    references resolved as in a small one, and every one of A's resources indexed. The same
    padding made the ratio limit skip the file."""
    from fhir_ingest.record.reader import STREAM_OVER

    env = clean_env(data_dir=tmp_path / "data")
    path = tmp_path / "a-padded.json.gz"
    refs = a_bundle_with(synthea_dir, path, padding=" " * (STREAM_OVER + 2**20))
    out = run(["index", str(path)], env)
    assert out.returncode == 0, out.stdout + out.stderr
    index = held(env, A)
    assert refs <= index.keys()
    small = tmp_path / "small"
    small_env = clean_env(data_dir=small)
    assert run(["index", str(synthea_dir / f"{A}.json.gz")], small_env).returncode == 0
    assert held(small_env, A) == index


def test_a_streamed_bundles_references_are_kept_on_disk_not_in_memory():
    """Item 7: the first pass over a streamed bundle noted every entry's fullUrl in a dict, about
    100 bytes an entry (50 MB of a 630 MB bundle); the table is now a temporary SQLite file, so the
    Python heap after outlining 60,000 entries holds none of it, and every reference still resolves."""
    import io
    import tracemalloc

    from fhir_ingest.record.reader import bundle_outline
    from fhir_ingest.record.reference_table import ReferenceTable

    ids = [f"{n:08d}-0000-4000-8000-000000000000" for n in range(60_000)]
    entries = ",".join(f'{{"fullUrl": "urn:uuid:{i}", "resource": {{"resourceType": "Observation", "id": "{i}"}}}}'
                       for i in ids)
    document = f'{{"resourceType": "Bundle", "type": "collection", "entry": [{entries}]}}'.encode()
    refs = ReferenceTable()
    tracemalloc.start()
    try:
        head, count = bundle_outline(io.BytesIO(document), refs)
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert (head["resourceType"], count, len(refs)) == ("Bundle", 60_000, 60_000)
    assert held < 2 * 2**20, held              # a dict of the same 60,000 pairs: about 12 MB
    assert refs[f"urn:uuid:{ids[-1]}"] == f"Observation/{ids[-1]}" and f"urn:uuid:{ids[0]}" in refs
    assert "urn:uuid:not-in-this-bundle" not in refs and 7 not in refs
    with pytest.raises(KeyError):
        refs["urn:uuid:not-in-this-bundle"]
    refs.close()


def test_the_reference_table_keeps_the_later_of_two_entries_as_a_dict_does():
    from fhir_ingest.record.reference_table import ReferenceTable

    refs = ReferenceTable()
    refs.add("urn:uuid:1", "Observation/a")
    refs.add("urn:uuid:1", "Observation/b")
    refs.add("http://ehr.example/fhir/Patient/p", "Patient/p")
    refs.flush()
    assert dict(refs) == {"urn:uuid:1": "Observation/b", "http://ehr.example/fhir/Patient/p": "Patient/p"}
    refs.close()


def test_a_line_over_the_cap_costs_only_itself(tmp_path):
    """Items 6 and 7: one NDJSON line over the cap is passed over without being held, reported with
    its size, and the lines around it are read."""
    from fhir_ingest.record.reader import MAX_LINE_BYTES

    env = clean_env(data_dir=tmp_path / "data")
    path = tmp_path / "Observation.ndjson.gz"
    padding = b" " * (MAX_LINE_BYTES + 10)
    with gzip.open(path, "wb") as out:
        out.write(json.dumps(potassium("before-the-line", A, "2024-01-02", 4.1)).encode() + b"\n")
        out.write(b'{"resourceType": "Observation", "id": "long", "note": "' + padding + b'"}\n')
        out.write(json.dumps(potassium("after-the-line", A, "2024-01-03", 4.2)).encode() + b"\n")
    out = run(["index", str(path)], env)
    assert out.returncode == 3, out.stdout + out.stderr
    length = len(padding) + len('{"resourceType": "Observation", "id": "long", "note": ""}')
    assert f"Observation.ndjson.gz:2: a line of {length:,} bytes, over the 64 MB a line may hold: not read" \
        in out.stdout
    assert {"Observation/before-the-line", "Observation/after-the-line"} <= held(env, A).keys()


def test_lines_split_from_chunks_keep_their_sizes_and_cap_the_long_one():
    """Item 6: the splitter behind Bulk downloads and NDJSON files keeps each line's byte count
    (where a resumed download starts), reads a line spread over many chunks whole, and passes one
    over the cap over without holding it."""
    from fhir_ingest.record.reader import LineTooLong, split_lines

    body = b'{"a": 1}\n' + b"x" * 50 + b"\n" + b"y" * 500 + b"\n" + b'{"b": 2}'
    chunks = [body[i:i + 7] for i in range(0, len(body), 7)]
    lines = list(split_lines(iter(chunks), max_line=100))
    assert [size for size, _ in lines] == [9, 51, 501, 8] and sum(size for size, _ in lines) == len(body)
    assert [line for _, line in lines][:2] == [b'{"a": 1}', b"x" * 50] and lines[3][1] == b'{"b": 2}'
    assert isinstance(lines[2][1], LineTooLong) and lines[2][1].skipped == 500
