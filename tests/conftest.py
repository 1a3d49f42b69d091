"""Shared fixtures: the real model (loaded once), the shared Synthea records, a built dev index."""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

REPO = Path(__file__).resolve().parent.parent
SHARED = Path(os.environ.get("CHARTCITE_SHARED", REPO.parent / "shared"))
SYNTHEA = SHARED / "data" / "synthea"
DEV_QUESTIONS = SHARED / "data" / "questions" / "dev.jsonl"
EXAMPLES = REPO / "examples" / "synthea"


def require_shared() -> None:
    if not SYNTHEA.is_dir():
        pytest.fail(f"the shared Synthea records are missing at {SYNTHEA}; "
                    f"set CHARTCITE_SHARED to the folder that holds data/synthea")


@pytest.fixture(scope="session")
def synthea_dir() -> Path:
    require_shared()
    return SYNTHEA


@pytest.fixture(scope="session")
def patient_files(synthea_dir) -> list[Path]:
    return sorted(synthea_dir.glob("*.json.gz"))


@pytest.fixture(scope="session")
def dev_questions() -> list[dict]:
    require_shared()
    if not DEV_QUESTIONS.exists():
        return []
    return [json.loads(line) for line in DEV_QUESTIONS.read_text(encoding="utf-8").splitlines() if line.strip()]


@pytest.fixture(scope="session")
def embedder():
    from search.models.embedders import load_embedder

    return load_embedder(None)


@pytest.fixture(scope="session")
def dev_service(tmp_path_factory, embedder, dev_questions, synthea_dir):
    """The patients of the dev questions (plus two small others) indexed once for the session."""
    from search.service import SearchService

    ids = sorted({q["patient_id"] for q in dev_questions}) or [p.name.split(".")[0] for p in sorted(synthea_dir.glob("*.json.gz"))[:4]]
    data = tmp_path_factory.mktemp("dev-index")
    svc = SearchService("embedded", data / "index.sqlite")
    summary = svc.index_paths("default", [synthea_dir / f"{pid}.json.gz" for pid in ids])
    assert not summary.load.skipped and not summary.result.problems
    yield svc
    svc.close()


class InlineRunner:
    """Runs the real indexing task at once, so the test does not wait on a thread."""

    def __init__(self, settings):
        from workers.runner import TaskRunner

        self.inner = TaskRunner(settings)
        self.jobs = self.inner.jobs

    def enqueue_sync(self, tenant, patient_id, session_id=None):
        self.jobs.claim(tenant, patient_id)
        self.inner.task("chartcite.sync_patient").apply(args=(tenant, patient_id, session_id), throw=True)
        return True

    def queue_depth(self):
        return self.inner.queue_depth()


BACKENDS = ("embedded", "elasticsearch")


def clean_env(**settings) -> dict:
    """The environment for a chartcite subprocess: this one without any CHARTCITE_ setting the
    suite was started with (make test exports the service URLs), plus the given ones."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHARTCITE_")}
    env["HF_HUB_OFFLINE"] = "1"
    env.update({f"CHARTCITE_{k.upper()}": str(v) for k, v in settings.items()})
    return env


def configured(variable: str, what: str) -> str:
    """A service URL `make test` exports, or a loud failure saying how to start the service."""
    url = os.environ.get(variable, "")
    if not url:
        pytest.fail(f"{what} is not configured: run the suite with `make test` (it starts one), "
                    "or `eval $(scripts/services.sh up)` first")
    return url


def es_url() -> str:
    return configured("CHARTCITE_ES_URL", "Elasticsearch")


def redis_url() -> str:
    return configured("CHARTCITE_REDIS_URL", "Redis")


def make_service(kind: str, data_dir: Path):
    """A SearchService on the embedded index or on the real test Elasticsearch node."""
    from search.backends.elastic import ElasticOptions
    from search.service import SearchService

    if kind == "embedded":
        return SearchService("embedded", data_dir / "index.sqlite")
    return SearchService("elasticsearch", data_dir / "unused.sqlite", es=ElasticOptions((es_url(),)))


def drop_tenants(service, tenants) -> None:
    """Remove a test's Elasticsearch indices so runs do not see each other's data."""
    if service.backend_kind != "elasticsearch":
        return
    es = service.backend.es
    for tenant in tenants:
        es.indices.delete(index=f"chartcite-{tenant}-*", ignore_unavailable=True, allow_no_indices=True)


def indexed_record(folder: Path, resources: list[dict], tenant: str = "t"):
    """A hand-written record written as NDJSON and indexed on the embedded backend (nothing skipped)."""
    from search.service import SearchService

    path = folder / "record.ndjson"
    path.write_text("\n".join(json.dumps(r) for r in resources) + "\n", encoding="utf-8")
    service = SearchService("embedded", folder / "index.sqlite")
    assert not service.index_paths(tenant, [path]).load.skipped
    return service


def question_set_report(service, tenant: str, path, label: str) -> dict:
    """`full` on one question set, its figures printed for the test log."""
    from search.evaluate import evaluate

    report = evaluate(service, tenant, str(path), [5], ["full"])["pipelines"]["full"]
    print(f"\n{label}: recall@5 {report['recall']['5']:.3f}, facts {report['facts']:.3f}, abstention "
          f"{report['abstention_accuracy']:.2f}, false abstention {report['false_abstention']:.3f}, class-present "
          f"no evidence {report['class_present_no_evidence']}; missed {report['misses_at_5']}, "
          f"facts missed {report['facts_missed']}, wrong {report['wrong_abstentions']}")
    return report


@pytest.fixture()
def small_bundle(synthea_dir) -> Path:
    """The smallest shared record (46 resources)."""
    return synthea_dir / "936988e9-d587-ef42-ebdf-541238540ff3.json.gz"


def demo_launch(client, patient_id: str) -> str:
    """A demo launch through the Flask test client, as the launcher's form posts it: the session
    handle the frame's script sends with every API request."""
    page = client.post("/demo/launch", data={"patient_id": patient_id})
    assert page.status_code == 200
    return re.search(r'name="chartcite-session" content="([^"]+)"', page.get_data(as_text=True)).group(1)


def metric(text: str, name: str, **labels) -> float:
    """The value of one sample in Prometheus' text format (0 when absent)."""
    wanted = ",".join(f'{k}="{v}"' for k, v in labels.items())
    for line in text.splitlines():
        sample, _, value = line.rpartition(" ")
        if sample == (f"{name}{{{wanted}}}" if labels else name):
            return float(value)
    return 0.0


def pytest_terminal_summary(terminalreporter):
    """The files that cost the suite most (setup, call and teardown together): where to look when
    the suite grows slow, beside pytest's 25 slowest single steps."""
    per_file: dict[str, float] = {}
    for reports in terminalreporter.stats.values():
        for report in reports:
            if isinstance(report, pytest.TestReport):
                path = report.nodeid.split("::", 1)[0]
                per_file[path] = per_file.get(path, 0.0) + report.duration
    if len(per_file) > 1:
        terminalreporter.write_sep("=", "slowest 12 test files")
        for path, seconds in sorted(per_file.items(), key=lambda item: -item[1])[:12]:
            terminalreporter.write_line(f"{seconds:8.1f}s {path}")
