"""POST /api/reply: a reply draft to a patient's portal message, for the launched patient only.

The same rules as /api/ask: the launch's session handle in its header, the patient from the launch
(never the request), a body of the wrong shape answered 400 with a sentence, an audit line for every
draft (or 503 when the trail cannot be written). The draft is returned, never sent or saved here:
Save draft keeps it in the browser's own storage for this launch.
"""
from __future__ import annotations

import logging
import re
import time
from typing import Annotated

from flask import Blueprint, g, jsonify
from pydantic import BeforeValidator, Field

from .bodies import Body, _clean_if_text
from .frame import launched, recorded
from .services import audit, metrics, registry, search, settings

bp = Blueprint("reply", __name__)
log = logging.getLogger(__name__)
MESSAGE_CHARS = 4000


class ReplyBody(Body):
    message: Annotated[str, BeforeValidator(_clean_if_text)] = Field(min_length=1, max_length=MESSAGE_CHARS)


@bp.post("/api/reply")
@launched(ReplyBody)
def reply():
    context = g.launch
    message = g.body.message.strip()
    if not message:
        return jsonify(error="paste the patient's message first"), 400
    started = time.perf_counter()
    try:
        result = search().reply(context.tenant, context.patient_id, message, settings().reply_urgent_text,
                                settings().reply_words)
    except Exception:
        metrics().observe_failure()
        raise
    result["audit_id"] = recorded(lambda: audit().record(
        "reply", context.tenant, context.clinician, context.patient_id, message, draft=result["draft"],
        urgent=result["urgent"], unanswered=len(result["unanswered"]),
        evidence=[e["ref"] for e in result["evidence"]], generator=result["generator"]))
    # Counts only: no message, name or draft text in the application log.
    log.info("drafted a reply: %s evidence sentences, %s unanswered, urgent=%s in %.2fs", len(result["evidence"]),
             len(result["unanswered"]), result["urgent"], time.perf_counter() - started)
    return jsonify(result)


NO_MESSAGE = "this launch carries no patient message: paste it"


def communication_ref(details: dict) -> str:
    """The Communication the EHR launched chartcite with ("fhirContext": [{"reference":
    "Communication/123"}]), or ""."""
    for item in details.get("fhirContext") or []:
        ref = item.get("reference", "") if isinstance(item, dict) else ""
        if isinstance(ref, str) and re.fullmatch(r"Communication/[A-Za-z0-9\-.]{1,64}", ref):
            return ref
    return ""


def message_of(resource: dict, patient_id: str) -> str:
    """The text of a Communication about or from the launched patient ("" for another patient's,
    or one with no text: nothing is shown rather than someone else's words)."""
    if not isinstance(resource, dict) or resource.get("resourceType") != "Communication":
        return ""
    own = f"Patient/{patient_id}"
    people = [(resource.get("subject") or {}).get("reference"), (resource.get("sender") or {}).get("reference")]
    if own not in people:
        return ""
    parts = [p.get("contentString", "") for p in resource.get("payload") or [] if isinstance(p, dict)]
    return "\n".join(p.strip() for p in parts if isinstance(p, str) and p.strip())[:MESSAGE_CHARS]


@bp.get("/api/reply/launch-message")
@launched()
def launch_message():
    """The patient's message the EHR launched chartcite with, read from the EHR on this launch's
    token, for the panel to fill in; 404 when the launch names none."""
    context = g.launch
    ref = communication_ref(context.details)
    if not ref or context.mode == "demo":
        return jsonify(error=NO_MESSAGE), 404
    from fhir_ingest.connection.client import AuthExpired, FhirError

    from workers.sync import ehr_client

    try:
        resource = ehr_client(settings(), registry(), registry().ehr(context.tenant), context.session_id,
                              interactive=True).get_json(ref)
    except AuthExpired as exc:
        return jsonify(error=str(exc)), 401
    except FhirError as exc:
        return jsonify(error=str(exc)), 502
    message = message_of(resource, context.patient_id)
    if not message:
        return jsonify(error="the launch's message is not this patient's, or has no text: paste it"), 404
    return jsonify(ref=ref, message=message, sent=resource.get("sent", ""))
