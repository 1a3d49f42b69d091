"""POST /api/reply: a reply draft to a patient's portal message, for the launched patient only.

The same rules as /api/ask: the launch's session handle in its header, the patient from the launch
(never the request), a body of the wrong shape answered 400 with a sentence, an audit line for every
draft (or 503 when the trail cannot be written). The draft is returned, never sent or saved here:
Save draft keeps it in the browser's own storage for this launch.
"""
from __future__ import annotations

import logging
import time
from typing import Annotated

from flask import Blueprint, g, jsonify
from pydantic import BeforeValidator, Field

from .bodies import Body, _clean_if_text
from .frame import launched, recorded
from .services import audit, metrics, search, settings

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
