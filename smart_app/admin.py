"""A read-only page for hospital IT: the registration facts and each EHR's last sync."""
from __future__ import annotations

import hashlib
import hmac
import ipaddress

from flask import Blueprint, abort, jsonify, make_response, render_template, request

from .limits import spent, take
from .registration import registration_info
from .services import audit, public_url, registry, settings

bp = Blueprint("admin", __name__)


def require_admin() -> str:
    """The name of the bearer token the request carries (CHARTCITE_ADMIN_TOKENS, or
    CHARTCITE_ADMIN_TOKEN as "default"), recorded in the audit; 403 without a matching one. Only the
    demo, which holds no real patient, lets loopback in without one: behind a TLS proxy on the same
    host every client is loopback."""
    limit, address = settings().rate_limit_admin_refusals, request.remote_addr or ""
    if spent(limit, "admin-refusals", address):
        # Guessing stops here: while the address is locked out even the right token is refused.
        abort(make_response(jsonify(error=f"Too many refused admin requests from this address (at most {limit}); "
                                          "wait and try again."), 429))
    credentials = settings().admin_credentials()
    if credentials:
        name = token_name(request.headers.get("Authorization", ""), credentials)
    elif settings().demo_launch and ipaddress.ip_address(address or "0.0.0.0").is_loopback:
        name = "loopback (demo)"
    else:
        name = None
    if name is None:
        take(limit, "admin-refusals", address)
        audit().record("admin-refused", "", f"address {address}", "", request=f"{request.method} {request.path}",
                       sent_token=bool(request.headers.get("Authorization")))
        abort(403)
    audit().record("admin", "", f"admin token {name}", "", token=name, request=f"{request.method} {request.path}")
    return name


def token_name(authorization: str, credentials: dict[str, str]) -> str | None:
    """Which named token `Authorization: Bearer <secret>` holds. Every token is compared, each in
    constant time over digests of equal length, so the time taken says neither which token
    matched nor how long the secrets are."""
    sent = _digest(authorization)
    matched = None
    for name, secret in credentials.items():
        if hmac.compare_digest(sent, _digest(f"Bearer {secret}")):
            matched = name
    return matched


def _digest(text: str) -> bytes:
    return hashlib.sha256(text.encode("utf-8", "replace")).digest()


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
