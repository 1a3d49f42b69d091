"""A read-only page for hospital IT: the registration facts and each EHR's last sync."""
from __future__ import annotations

import hmac
import ipaddress

from flask import Blueprint, abort, render_template, request

from .registration import registration_info
from .services import audit, public_url, registry, settings

bp = Blueprint("admin", __name__)


def require_admin() -> None:
    """A matching bearer token (CHARTCITE_ADMIN_TOKEN). Only the demo, which holds no real patient,
    lets loopback in without one: behind a TLS proxy on the same host every client is loopback."""
    token = settings().admin_token
    if token:
        sent = request.headers.get("Authorization", "")
        if not hmac.compare_digest(sent.encode(), f"Bearer {token}".encode()):
            abort(403)
        return
    if not settings().demo_launch or not ipaddress.ip_address(request.remote_addr or "0.0.0.0").is_loopback:
        abort(403)


@bp.get("/admin")
def admin():
    require_admin()
    return render_template("admin.html", info=registration_info(public_url(), registry()))


@bp.get("/admin/audit")
def audit_view():
    require_admin()
    entries = audit().entries(limit=200, kind=request.args.get("kind", ""),
                                                                patient_id=request.args.get("patient", ""))
    return render_template("audit.html", entries=entries)
