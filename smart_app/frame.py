"""The embedded frame and its JSON API. The patient always comes from the launch context."""
from __future__ import annotations

import calendar
import logging
import threading
import time
from contextlib import contextmanager
from datetime import date
from functools import lru_cache, wraps

from flask import Blueprint, abort, g, jsonify, make_response, render_template, request

from fhir_ingest.record.load import BundleDirectorySource
from fhir_ingest.record.normalize import human_name

from .asked_patients import asked_patients
from .bodies import (PIPELINES, AskBody, CohortBody, DraftBody, SaveDraftBody, SimilarBody, SyncBody, WriteBackBody,
                     json_object, parse)
from .render import readable
from .services import audit, metrics, registry, runner, search, sessions, settings
from .sessions import FRAME_COOKIE, PATIENT_HEADER, SESSION_HEADER

bp = Blueprint("frame", __name__)
log = logging.getLogger(__name__)


def reject_other_patient(context, payload: dict) -> None:
    """A patient id in a request is never trusted; one that differs from the launch, however the
    request spells or nests it (smart_app/asked_patients.py), is refused."""
    pairs = [*request.args.items(multi=True), *payload.items()]
    others = [p for p in asked_patients(pairs) if p != context.patient_id]
    if others:
        log.warning("request for a patient outside the launch context was refused")
        audit().record("refused", context.tenant, context.clinician, context.patient_id,
                       request=f"{request.method} {request.path}", asked_patient=others[0][:200],
                       reason="patient outside the launch context")
        abort(make_response(jsonify(error="this session is not launched for that patient"), 403))


def launched(model=None):
    """A view of the launched patient: the launch context on `g.launch` (401 without a launch), the
    request's checked body on `g.body` (400 for a body of the wrong shape), and 403 for a request
    that names another patient. The API never accepts the cookie alone: the handle comes in a
    header, which another site's form cannot attach, so no cross-site request can ask on a
    clinician's behalf."""
    def decorate(view):
        @wraps(view)
        def wrapped(*args, **kwargs):
            handle = request.headers.get(SESSION_HEADER)
            context = sessions().resolve(handle)
            if context is None:
                abort(make_response(jsonify(error="no active launch: open chartcite from the EHR (or the demo "
                                                  "launcher) again"), 401))
            payload = json_object()
            shown = request.headers.get(PATIENT_HEADER)
            if shown is not None and shown != context.patient_id:
                # A frame showing one patient must never get another's answers, whatever it holds.
                abort(make_response(jsonify(error="this frame shows another patient than its launch: open chartcite "
                                                  "from the EHR again"), 409))
            reject_other_patient(context, payload)
            g.handle, g.launch, g.body = handle, context, parse(model, payload) if model else payload
            g.frame_tenant = context.tenant
            return view(*args, **kwargs)
        return wrapped
    return decorate


def age_of(birth: str) -> int | None:
    try:
        b = date.fromisoformat(birth[:10])
    except (TypeError, ValueError):
        return None
    today = date.today()
    return today.year - b.year - ((today.month, today.day) < (b.month, b.day))


@lru_cache(maxsize=256)
def _demo_patient(path: str, mtime: float, patient_id: str) -> dict:
    patient = BundleDirectorySource(path).patient_resource(patient_id) or {}
    return {"patient_id": patient_id, "name": human_name(patient), "gender": patient.get("gender", ""),
            "birth_date": patient.get("birthDate", ""), "age": age_of(patient.get("birthDate", ""))}


def demo_patients() -> list[dict]:
    source = BundleDirectorySource(settings().demo_source)
    rows = []
    for pid, path in zip(source.patient_ids(), source.files()):
        row = dict(_demo_patient(str(settings().demo_source), path.stat().st_mtime, pid))
        row["indexed"] = search().patient(settings().tenant, pid) is not None
        rows.append(row)
    return rows


@bp.get("/")
def launcher():
    if not settings().demo_launch:
        return render_template("error.html", message="Launch chartcite from your EHR."), 400
    return render_template("launch.html", patients=demo_patients())


@bp.post("/demo/launch")
def demo_launch():
    if not settings().demo_launch:
        abort(404)
    patient_id = request.form.get("patient_id", "")
    if patient_id not in BundleDirectorySource(settings().demo_source).patient_ids():
        return render_template("error.html", message="That demo patient does not exist."), 400
    context, handle = sessions().create(settings().tenant, patient_id, clinician="demo-clinician", mode="demo")
    if search().patient(context.tenant, patient_id) is None or sync_must_restart(context.tenant, patient_id):
        runner().enqueue_sync(context.tenant, patient_id)
    # The page is rendered straight from the launch so the session handle never appears in a URL.
    return render_patient(context, handle)


def sync_must_restart(tenant: str, patient_id: str) -> bool:
    """A failure belongs to the launch it happened in, and a sync waiting out an EHR outage need
    not wait once someone opens the patient: the next launch syncs at once."""
    job = runner().jobs.get(tenant, patient_id)
    return job is not None and job.state in ("failed", "waiting")


RELAUNCH = ("This chartcite window is no longer connected to a launch: its session ended, or this browser "
            "keeps no record of it. Open chartcite from the EHR again (it opens on the patient in context).")


def relaunch_page():
    """A frame whose own launch cannot be found shows this, never another launch's patient."""
    return render_template("error.html", message=RELAUNCH, demo=settings().demo_launch), 401


@bp.get("/app")
def frame_without_launch():
    """The address of frames before each had its own: which launch it was cannot be known."""
    return relaunch_page()


@bp.get("/app/<frame>")
def patient_view(frame: str):
    """A reload (or back, or a restored tab) of one frame: its own launch, from the cookie kept for
    this address alone, or the page that says to launch again."""
    handle = request.cookies.get(FRAME_COOKIE)
    context = sessions().resolve(handle)
    if context is None or not context.owns_frame(frame):
        return relaunch_page()
    return render_patient(context, handle)


@bp.post("/api/session/end")
@launched()
def end_session():
    """The clinician signs out of this frame: its handle, cookie and EHR tokens are gone."""
    context = g.launch
    sessions().end(context.session_id)
    registry().pop_secret(context.session_id, "tokens")
    audit().record("session-ended", context.tenant, context.clinician, context.patient_id)
    response = jsonify(ended=True)
    response.delete_cookie(FRAME_COOKIE, path=context.frame_path, secure=True, samesite="None", partitioned=True)
    return response


def read_notes_ahead(context, indexed: dict | None, job) -> None:
    """An opened patient's notes read on a background thread (search/sentence_readings.py), so the
    first question about them finds their sentences split and embedded: once the record is
    indexed and no sync of it is under way, and once per record as it stands (its chunk count)."""
    if indexed and (job is None or job.state not in ("queued", "running")):
        search().warm_notes_soon(context.tenant, context.patient_id, sum(indexed.get("chunk_counts", {}).values()))


def render_patient(context, handle: str):
    g.frame_tenant = context.tenant        # framed only by the EHR this launch came from
    summary = search().patient(context.tenant, context.patient_id) or {}
    read_notes_ahead(context, summary, runner().jobs.get(context.tenant, context.patient_id))
    banner = dict(_demo_patient(str(settings().demo_source), 0, context.patient_id)) if context.mode == "demo" else {}
    banner.update({k: v for k, v in summary.items() if k in ("name", "gender", "birth_date", "age") and v})
    # The EHR shows its own patient banner when it says need_patient_banner is false.
    show_banner = context.details.get("need_patient_banner", True) is not False
    response = make_response(render_template("patient.html", handle=handle, patient=banner,
                                             patient_id=context.patient_id, frame_path=context.frame_path,
                                             pipelines=PIPELINES if settings().show_pipeline else (),
                                             show_banner=show_banner, style=context.details.get("style") or {},
                                             similar_enabled=not similar_refusal(context.tenant)))
    # Kept for this frame's address only, so no other frame's reload can find it. SameSite=None
    # and Partitioned so it survives inside the EHR's cross-site frame where the browser allows
    # it at all; the API never depends on it (the handle travels in a header).
    response.set_cookie(FRAME_COOKIE, handle, max_age=int(settings().session_minutes * 60), path=context.frame_path,
                        httponly=True, samesite="None", secure=True, partitioned=True)
    return response


@bp.get("/api/status")
@launched()
def status():
    context = g.launch
    job = runner().jobs.get(context.tenant, context.patient_id)
    indexed = search().patient(context.tenant, context.patient_id)
    read_notes_ahead(context, indexed, job)     # a first sync just finished: its notes next
    # The banner of a first-time patient fills in as soon as the record's Patient is indexed.
    banner = {k: (indexed or {}).get(k) for k in ("name", "gender", "birth_date", "age")}
    return jsonify(patient_id=context.patient_id, indexed=indexed is not None,
                   chunks=sum((indexed or {}).get("chunk_counts", {}).values()),
                   synced_at=last_synced(context, indexed), job=job.to_dict() if job else None, banner=banner)


def last_synced(context, indexed: dict | None) -> float | None:
    """When the record the clinician is asking about was last read from its source (seconds)."""
    synced = registry().patient_synced(context.tenant, context.patient_id)
    if synced is not None:
        return synced.synced_at
    stamp = (indexed or {}).get("indexed_at")
    return calendar.timegm(time.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ")) if stamp else None


@bp.post("/api/sync")
@launched(SyncBody)
def sync_now():
    """"Refresh from the EHR": queue a sync of the launched patient (incremental after the first).
    A Refresh while a sync of the patient is queued or running joins it; a new one costs the frame
    session one of its syncs a minute (one sync is some 27 requests to the EHR)."""
    from .limits import take

    context = g.launch
    job = runner().jobs.get(context.tenant, context.patient_id)
    if job is not None and job.state in ("queued", "running"):
        return jsonify(queued=False, joined=True), 202
    if not take(settings().rate_limit_syncs, "syncs", context.session_id):
        return jsonify(error=f"This record was refreshed several times in the last minute (at most "
                             f"{settings().rate_limit_syncs.replace('/', ' a ')}). Please wait a moment."), 429
    queued = runner().enqueue_sync(context.tenant, context.patient_id,
                                   context.session_id if context.mode != "demo" else None)
    return jsonify(queued=queued, joined=not queued), 202


@bp.post("/api/ask")
@launched(AskBody)
def ask():
    context = g.launch
    body = g.body
    question = body.question.strip()
    if not question:
        return jsonify(error="type a question about this patient"), 400
    started = time.perf_counter()
    try:
        result = search().ask(context.tenant, context.patient_id, question, k=body.k, pipeline=body.pipeline)
    except Exception:
        metrics().observe_failure()
        raise
    metrics().observe_answer(result, time.perf_counter() - started)
    result["audit_id"] = recorded(lambda: audit().record(
        "ask", context.tenant, context.clinician, context.patient_id, question, pipeline=body.pipeline,
        answer=result["answer"], abstained=result["abstained"], confidence=result.get("confidence"),
        citations=[c["ref"] for c in result["citations"]],
        evidence=[e["ref"] for e in result.get("evidence", [])],
        stages=result["diagnostics"].get("stages", []), removed_statements=result.get("removed_statements", 0),
        removed=result.get("removed", []),
        generator=result.get("generator", "extractive")))
    log.info("answered a question: %s citations, abstained=%s", len(result["citations"]), result["abstained"])
    return jsonify(result)


def recorded(write):
    """The audit ref `write` returns; when the trail cannot be written even after its retries, the
    request ends with 503 and says why, and /metrics counts it: an answer nobody can later account
    for is not shown."""
    from .audit import AuditUnavailable

    try:
        return write()
    except AuditUnavailable:
        metrics().observe_audit_failure()
        abort(make_response(jsonify(error="The answer was found but could not be recorded in the audit trail, so it "
                                          "is not shown. Please ask again in a moment; if this persists, tell IT."),
                            503))


@bp.get("/api/context")
@launched()
def context_bundle():
    """Structured facts only (problems, medications, allergies, labs, vitals, encounters), each with its ref;
    and the similar patients where they are enabled."""
    context = g.launch
    # The frame's Summary asks without them (`?similar=no`): the panel asks for its own, and a
    # summary opened is no look at other patients to audit.
    asked = request.args.get("similar", "yes")
    if asked not in ("yes", "no"):
        return jsonify(error="similar must be yes or no"), 400
    enabled = asked == "yes" and not similar_refusal(context.tenant)
    bundle = search().context(context.tenant, context.patient_id, similar=enabled)
    if enabled:
        audit().record("similar", context.tenant, context.clinician, context.patient_id, via="context",
                       found=len(bundle["similar_patients"]["similar"]))
    return jsonify(bundle)


def similar_refusal(tenant: str) -> str:
    from .similar_access import refusal

    return refusal(settings(), registry(), tenant)


def refuse_when_similar_off(context):
    refused = similar_refusal(context.tenant)
    if refused:
        audit().record("refused", context.tenant, context.clinician, context.patient_id,
                       request=f"{request.method} {request.path}", reason="similar patients off")
        abort(make_response(jsonify(error=refused), 403))


@bp.post("/api/similar")
@launched(SimilarBody)
def similar_patients():
    """The launched patient's most similar patients of the same tenant, de-identified; handles open nothing."""
    context = g.launch
    refuse_when_similar_off(context)
    result = search().similar(context.tenant, context.patient_id, g.body.k)
    audit().record("similar", context.tenant, context.clinician, context.patient_id, k=g.body.k,
                   found=len(result["similar"]))
    return jsonify(result)


@bp.post("/api/cohort")
@launched(CohortBody)
def cohort():
    """Aggregates over the tenant's patients with a condition: per exposure group, count and median change."""
    from search.similar.cohort import CohortError, Comparison

    context = g.launch
    refuse_when_similar_off(context)
    body = g.body
    try:
        result = search().cohort(context.tenant, Comparison(body.condition, tuple(body.exposures), body.outcome,
                                                            body.window_months))
    except CohortError as exc:
        return jsonify(error=str(exc)), 400
    audit().record("cohort", context.tenant, context.clinician, context.patient_id, condition=body.condition,
                   exposures=body.exposures, outcome=body.outcome)
    return jsonify(result)


@bp.post("/api/draft")
@launched(DraftBody)
def draft():
    """A summary draft for the clinician to read and edit. Not saved: saving is an explicit step."""
    context = g.launch
    body = g.body
    from search.answering.drafts import KINDS

    if body.kind not in KINDS:
        return jsonify(error=f"kind must be one of {', '.join(KINDS)}"), 400
    result = search().draft(context.tenant, context.patient_id, body.kind)
    result["can_write_back"] = bool(context.details.get("can_write_back"))
    recorded(lambda: audit().record("draft", context.tenant, context.clinician, context.patient_id,
                                    draft_kind=body.kind, citations=[c["ref"] for c in result["citations"]]))
    return jsonify(result)


@bp.post("/api/draft/save")
@launched(SaveDraftBody)
def save_draft():
    """Store a draft the clinician chose to keep, with who and when. Every citation must be a
    record of this patient; the text is the clinician's (they may have edited it)."""
    context = g.launch
    body = g.body
    from search.answering.drafts import KINDS

    draft = body.draft.model_dump()
    problem = check_draft(draft, KINDS, context)
    if problem:
        return jsonify(error=problem), 400
    entry = recorded(lambda: audit().record(
        "draft-saved", context.tenant, context.clinician, context.patient_id, draft_kind=draft["kind"],
        draft={k: draft[k] for k in ("kind", "title", "sections", "citations")}))
    return jsonify(saved=entry), 201


def check_draft(draft: dict, kinds, context) -> str:
    """What the schema cannot say: a known kind, citations that resolve, records of this patient."""
    if draft["kind"] not in kinds:
        return f"kind must be one of {', '.join(kinds)}"
    numbers = {c["n"] for c in draft["citations"]}
    for section in draft["sections"]:
        for line in section["lines"]:
            if not set(line["citations"]) <= numbers:
                return "every line must cite the record it came from"
    for c in draft["citations"]:
        if search().resource(context.tenant, context.patient_id, c["ref"]) is None:
            return f"{c['ref'][:80]} is not a record of this patient"
    return ""


@bp.post("/api/draft/writeback")
@launched(WriteBackBody)
def write_back_draft():
    """Write a saved draft to the EHR as a preliminary note, only with a granted create scope, only
    by the clinician who saved it, and at most once."""
    context = g.launch
    body = g.body
    if context.mode == "demo" or not context.details.get("can_write_back"):
        return jsonify(error="the EHR did not grant chartcite permission to write notes for this launch"), 403
    entry = audit().get(body.saved)
    if not entry or entry["kind"] != "draft-saved" or entry["patient_id"] != context.patient_id \
            or entry["tenant"] != context.tenant:
        return jsonify(error="save the draft first; only this patient's saved drafts can be written back"), 404
    if entry["clinician"] != context.clinician:
        # The note would go into the legal record under this clinician's name, as the author.
        return jsonify(error="only the clinician who saved this draft can write it to the chart"), 403
    with WRITE_BACKS.held(f"{context.tenant}/{entry['id']}"):
        earlier = written_note(entry)
        if earlier:
            return jsonify(error="this draft is already in the chart", document=earlier), 409
        from fhir_ingest.connection.client import AuthExpired, FhirError
        from fhir_ingest.connection.writeback import create_document, draft_document, draft_identifier

        from workers.sync import ehr_client

        ehr = registry().ehr(context.tenant)
        identifier = draft_identifier(context.tenant, context.patient_id, entry["id"])
        try:
            ref = create_document(ehr_client(settings(), registry(), ehr, context.session_id),
                                  draft_document(entry["draft"], context.patient_id, context.clinician, identifier))
        except AuthExpired as exc:
            return jsonify(error=str(exc)), 401
        except FhirError as exc:
            return jsonify(error=str(exc)), 502
        audit().record("draft-written", context.tenant, context.clinician, context.patient_id, saved=entry["id"],
                       document=ref)
    return jsonify(document=ref, status="preliminary"), 201


def written_note(saved: dict) -> str:
    """The note a saved draft already became, from the audit trail."""
    for entry in audit().entries(kind="draft-written", patient_id=saved["patient_id"], tenant=saved["tenant"],
                                 limit=1000):
        if str(entry.get("saved")) == str(saved["id"]):
            return entry.get("document", "")
    return ""


class KeyedLocks:
    """One lock per key, so two frames pressing "Write to chart" on one draft take turns (the
    EHR's conditional create covers two processes)."""

    def __init__(self):
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()

    @contextmanager
    def held(self, key: str):
        with self._guard:
            lock = self._locks.setdefault(key, threading.Lock())
        with lock:
            yield


WRITE_BACKS = KeyedLocks()


@bp.get("/api/drafts")
@launched()
def saved_drafts():
    context = g.launch
    # Only the asking clinician's: a launch on the patient is not a licence to read colleagues' drafts.
    entries = audit().entries(kind="draft-saved", patient_id=context.patient_id, tenant=context.tenant,
                              clinician=context.clinician, limit=50)
    return jsonify([{"id": e["id"], "when": e["when"], "clinician": e["clinician"], "draft": e["draft"]} for e in entries])


@bp.get("/api/record")
@launched()
def record():
    context = g.launch
    ref = request.args.get("ref", "")
    if ref.count("/") != 1:
        return jsonify(error="ref must look like ResourceType/id"), 400
    resource = search().resource(context.tenant, context.patient_id, ref)
    if resource is None:
        return jsonify(error="no such record for this patient"), 404
    # The records it points at (a drug's Medication, a reason's Condition), of this patient only.
    resolve = lambda other: search().resource(context.tenant, context.patient_id, other) if other else None  # noqa: E731
    return jsonify(ref=ref, readable=readable(resource, resolve), resource=resource)
