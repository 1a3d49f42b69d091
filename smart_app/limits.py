"""Rate limits (flask-limiter), counted for the whole deployment: in Redis when
CHARTCITE_REDIS_URL is set, else in a SQLite file of the data directory that every worker on the
host shares (a count per process gave each worker its own allowance).

- asking and drafting: per clinician and per tenant;
- every frame API request: per frame session, so one frame, or a stolen handle, cannot spend the
  deployment's budget on reads;
- Refresh: syncs started per frame session (a Refresh while one runs joins it and costs nothing);
- wrong admin tokens: per client address, after which every admin request from it is refused.
"""
from __future__ import annotations

from flask import Flask, current_app, jsonify, request
from flask_limiter import Limiter
from limits import parse

from .rate_store import rate_store_uri
from .sessions import SESSION_HEADER

MESSAGES = {
    "frame.ask": "Too many questions right now ({limit}). Please wait a moment and ask again.",
    "frame.draft": "Too many questions right now ({limit}). Please wait a moment and ask again.",
}
READS = "Too many requests from this window right now ({limit}). Please wait a moment."


def _context(app: Flask):
    return app.extensions["chartcite.sessions"].resolve(request.headers.get(SESSION_HEADER))


def apply_rate_limits(app: Flask, settings) -> Limiter:
    def clinician_key() -> str:
        context = _context(app)
        return f"clinician:{context.tenant}:{context.clinician}" if context else f"address:{request.remote_addr}"

    def tenant_key() -> str:
        context = _context(app)
        return f"tenant:{context.tenant}" if context else f"address:{request.remote_addr}"

    def session_key() -> str:
        context = _context(app)
        return f"session:{context.session_id}" if context else f"address:{request.remote_addr}"

    storage = settings.redis_url or rate_store_uri(settings.data_dir / "rate-limits.sqlite")
    limiter = Limiter(clinician_key, app=app, storage_uri=storage, strategy="fixed-window", headers_enabled=True)
    for endpoint in ("frame.ask", "frame.draft", "frame.similar_patients", "frame.cohort"):
        view = app.view_functions[endpoint]
        view = limiter.limit(settings.rate_limit_tenant, key_func=tenant_key, scope="tenant")(view)
        view = limiter.limit(settings.rate_limit_clinician, key_func=clinician_key, scope="clinician")(view)
        app.view_functions[endpoint] = view
    for endpoint in frame_api_endpoints(app):
        app.view_functions[endpoint] = limiter.limit(settings.rate_limit_reads, key_func=session_key,
                                                     scope="session")(app.view_functions[endpoint])

    @app.errorhandler(429)
    def too_many(error):
        limit = str(getattr(error, "description", "") or "")
        response = jsonify(error=MESSAGES.get(request.endpoint, READS).format(limit=limit))
        response.status_code = 429
        return response

    return limiter


def frame_api_endpoints(app: Flask) -> list[str]:
    """Every route of the frame's JSON API (each one, whatever a later change adds)."""
    return sorted({rule.endpoint for rule in app.url_map.iter_rules()
                   if rule.rule.startswith("/api/") and rule.endpoint.startswith("frame.")})


def take(limit: str, *key: str) -> bool:
    """Count one against `limit` for `key` in the deployment's shared store; False when spent."""
    return current_app.extensions["chartcite.limiter"].limiter.hit(parse(limit), *key)


def spent(limit: str, *key: str) -> bool:
    """Whether `limit` for `key` is used up, without counting against it."""
    return not current_app.extensions["chartcite.limiter"].limiter.test(parse(limit), *key)
