"""SMART launch routes: /launch (EHR and standalone), /callback, and chartcite's public keys.

The iss must be a registered EHR before anything is redirected anywhere; the code, tokens and
state never appear in a page, a log line or a URL chartcite builds after the callback.
"""
from __future__ import annotations

import logging
import re
import time
from urllib.parse import urlencode, urlsplit

import requests
from flask import Blueprint, g, jsonify, make_response, redirect, render_template, request

from fhir_ingest.connection.smart_auth import LaunchError, SessionTokens

from .frame import sync_must_restart, render_patient
from .services import public_url, registry, runner, search, sessions, settings
from .smart import finish_authorization, start_authorization

bp = Blueprint("launch", __name__)
log = logging.getLogger(__name__)

BINDING_COOKIE = "chartcite_launch"
_COLOUR = re.compile(r"^#[0-9a-fA-F]{3,8}$")


def redirect_uri() -> str:
    return public_url() + "/callback"


def launch_error(message: str, status: int = 400):
    # At /callback the address holds the one-time code: the page's script replaces it (error.js).
    return render_template("error.html", message=message, clean_address=request.path == "/callback"), status


@bp.route("/launch", methods=["GET", "POST"])
def launch():
    # A registration changed a moment ago (its frame origins) holds from this launch on.
    registry().forget_frame_origins()
    iss = request.values.get("iss", "")
    launch_id = request.values.get("launch") or None
    ehr = registry().ehr_by_iss(iss) if iss else None
    if ehr is None:
        log.warning("launch refused: the iss is not a registered EHR")
        return launch_error("This EHR is not registered with chartcite. Hospital IT registers it with "
                            "`chartcite ehr add`; until then chartcite cannot be launched from it.")
    g.frame_tenant = ehr.name
    if ehr.backend_only:
        log.warning("launch refused: the registration is for background sync only")
        return launch_error("This EHR is registered with chartcite for background sync only, not for launches. "
                            "Hospital IT can allow launches with `chartcite ehr update NAME --no-backend-only`.")
    try:
        auth = start_authorization(registry(), ehr, redirect_uri(), launch_id)
    except LaunchError as exc:
        return launch_error(str(exc), 502)
    if auth.post:
        response = make_response(render_template("authorize_post.html", action=auth.url, params=auth.params))
        # This one page may post its form to the EHR's authorization endpoint.
        origin = "{0.scheme}://{0.netloc}".format(urlsplit(auth.url))
        response.headers["X-Form-Action"] = origin
    else:
        response = redirect(f"{auth.url}?{urlencode(auth.params)}")
    response.set_cookie(BINDING_COOKIE, auth.binding, max_age=600, httponly=True, secure=True, samesite="None",
                        path="/callback")
    return response


@bp.get("/launch/error")
def launch_error_page():
    """Where a failed callback's address is moved to (the code must not stay in the address bar)."""
    return launch_error("The launch did not complete. Open chartcite from the EHR again.")


@bp.get("/callback")
def callback():
    if request.args.get("error"):
        # The EHR's error and its description say what to fix ("Scopes openid and fhirUser could not
        # be granted"): shown (escaped, bounded) and logged for IT. They carry no patient data.
        error, description = request.args["error"][:60], request.args.get("error_description", "")[:300]
        log.warning("the EHR refused authorization: %s: %s", error, description or "(no description)")
        return launch_error(f"The EHR did not authorize chartcite ({error}"
                            + (f": {description}" if description else "") + "). " + authorization_advice(error), 400)
    registry().forget_frame_origins()       # this worker may not be the one the launch started in
    code, state = request.args.get("code", ""), request.args.get("state", "")
    if not code:
        return launch_error("The EHR sent no authorization code. Open chartcite from the EHR again.")
    try:
        result = finish_authorization(registry(), code, state, request.cookies.get(BINDING_COOKIE))
    except LaunchError as exc:
        # The reasons are chartcite's or the EHR's words about the sign-in, never patient data.
        log.warning("launch failed at the callback: %s", exc)
        return launch_error(str(exc))
    details = dict(result.context)
    details["style"] = fetch_style(details.pop("smart_style_url", ""))
    context, handle = sessions().create(result.ehr.name, result.patient_id, result.clinician, result.mode, details)
    SessionTokens.store(registry(), context.session_id, result.tokens)
    if needs_sync(result.ehr.name, result.patient_id):
        runner().enqueue_sync(result.ehr.name, result.patient_id, context.session_id)
    log.info("SMART launch completed (%s)", result.mode)
    response = render_patient(context, handle)
    response.delete_cookie(BINDING_COOKIE, path="/callback", secure=True, samesite="None")
    return response


# What to do about each error an authorization endpoint may send back (RFC 6749 4.1.2.1, SMART).
AUTHORIZATION_ADVICE = {
    "access_denied": "The sign-in was declined at the EHR. Open chartcite from the EHR again to retry.",
    "invalid_scope": "Open chartcite from the EHR again; if this repeats, hospital IT compares the scopes "
                     "`chartcite registration-info` lists with the EHR's app registration.",
    "unauthorized_client": "Hospital IT: the EHR does not let this client id use this launch; check the app "
                           "registration's client id and launch types (`chartcite ehr check`).",
    "invalid_client": "Hospital IT: the EHR does not recognise chartcite's client id or credentials "
                      "(`chartcite ehr check` tests them and says what to fix).",
    "invalid_request": "Hospital IT: the EHR found the request malformed; check that the redirect URI "
                       "`chartcite registration-info` prints is registered exactly, and the --iss.",
    "server_error": "The EHR had a problem of its own. Open chartcite from the EHR again in a moment.",
    "temporarily_unavailable": "The EHR is busy. Open chartcite from the EHR again in a moment.",
}


def authorization_advice(error: str) -> str:
    return AUTHORIZATION_ADVICE.get(error, "Open chartcite from the EHR again; if this repeats, hospital IT runs "
                                           "`chartcite ehr check` for this EHR.")


def needs_sync(tenant: str, patient_id: str) -> bool:
    """A patient never indexed, last synced too long ago, or whose last sync failed or is waiting
    out an outage: a failure belongs to the launch it happened in, and the next launch retries it."""
    if search().patient(tenant, patient_id) is None or sync_must_restart(tenant, patient_id):
        return True
    synced = registry().patient_synced(tenant, patient_id)
    stale_after = settings().patient_stale_minutes * 60
    return synced is None or time.time() - synced.synced_at > stale_after


def fetch_style(url: str) -> dict:
    """The EHR's smart_style_url: only colours and a radius are taken, and only well-formed ones."""
    if not url:
        return {}
    try:
        style = requests.get(url, timeout=3).json()
    except (requests.RequestException, ValueError):
        return {}
    kept = {k: v for k, v in style.items() if k.startswith("color_") and isinstance(v, str) and _COLOUR.match(v)}
    radius = style.get("dim_border_radius")
    if isinstance(radius, str) and re.match(r"^\d{1,2}px$", radius):
        kept["dim_border_radius"] = radius
    return kept


@bp.get("/.well-known/jwks.json")
def jwks():
    response = jsonify(keys=registry().published_keys())
    response.headers["Cache-Control"] = "public, max-age=300"
    return response

