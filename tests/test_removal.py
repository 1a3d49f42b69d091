"""What an input may remove, through real `chartcite index` processes (issue 41): a filtered or
partial `$everything`, an older snapshot of a whole record, and a removal over the budget each
leave the record held as it was, resource by resource, and the report says why in one line."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from .conftest import clean_env
from .test_hostile import B, bundle_of, potassium, run, synthea_resources

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


SEVEN = ("Patient", "Observation")


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
    path.write_text(json.dumps(everything(seven_of_b(synthea_dir), query, links=links)))
    out = run(["index", str(path)], env)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "removed: 0" in out.stdout
    assert f"everything-page.json: patient {B}: {words}: merged, nothing removed" in out.stdout
    assert held(env).keys() == before.keys()


def test_an_everything_holding_fewer_entries_than_its_total_removes_nothing(env, synthea_dir, tmp_path):
    before = held(env)
    path = tmp_path / "short.json"
    path.write_text(json.dumps(everything(seven_of_b(synthea_dir), total=64)))
    out = run(["index", str(path)], env)
    assert out.returncode == 0 and "holding 7 of the 64 entries its total counts" in out.stdout, out.stdout
    assert held(env).keys() == before.keys()


def dated(resource: dict, when: str) -> dict:
    return dict(resource, meta={"lastUpdated": when})


def test_an_older_snapshot_of_the_whole_record_keeps_the_newer_results(env, synthea_dir, tmp_path):
    """Item 2: B indexed with 10 newer results, then B's bundle as it was in 2020. The snapshot
    confirms everything else; the 10 newer results stay, and the report says why."""
    newer = [dated(potassium(f"newer-k-{n}", B, "2026-05-30", 4.0 + n / 10), "2026-06-01T00:00:00Z")
             for n in range(10)]
    extra = tmp_path / "newer.ndjson"
    extra.write_text("".join(json.dumps(r) + "\n" for r in newer))
    assert run(["index", str(extra)], env).returncode == 0
    before = held(env)
    assert all(f"Observation/{r['id']}" in before for r in newer)
    snapshot = tmp_path / "snapshot-2020.json"
    snapshot.write_text(json.dumps(bundle_of(*[dated(r, "2020-01-01T00:00:00Z")
                                               for r in synthea_resources(synthea_dir, B)])))
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
    path.write_text(json.dumps(everything(two)))
    out = run(["index", str(path)], env)
    assert out.returncode == EXIT_HELD_BACK, out.stdout + out.stderr
    assert (f"b-everything.json: would remove {len(before) - 2} of the {len(before)} resources held for patient {B}, "
            f"more than the removal budget of 50% (CHARTCITE_MAX_REMOVAL_SHARE): not carried out") in out.stdout
    assert held(env).keys() == before.keys()
    allowed = run(["index", "--allow-removals", str(path)], env)
    assert allowed.returncode == 0, allowed.stdout + allowed.stderr
    assert held(env).keys() == {f"{r['resourceType']}/{r['id']}" for r in two}
