"""Rate limits on asking, per clinician and per tenant (flask-limiter), counted for the whole
deployment: in Redis when CHARTCITE_REDIS_URL is set, else in a SQLite file of the data directory
that every worker on the host shares (a count per process gave each worker its own allowance)."""
from __future__ import annotations

from flask import Flask, jsonify, request
from flask_limiter import Limiter

from .rate_store import rate_store_uri
from .sessions import SESSION_HEADER


def _context(app: Flask):
    return app.extensions["chartcite.sessions"].resolve(request.headers.get(SESSION_HEADER))


def apply_rate_limits(app: Flask, settings) -> Limiter:
    def clinician_key() -> str:
        context = _context(app)
        return f"clinician:{context.tenant}:{context.clinician}" if context else f"address:{request.remote_addr}"

    def tenant_key() -> str:
        context = _context(app)
        return f"tenant:{context.tenant}" if context else f"address:{request.remote_addr}"

    storage = settings.redis_url or rate_store_uri(settings.data_dir / "rate-limits.sqlite")
    limiter = Limiter(clinician_key, app=app, storage_uri=storage, strategy="fixed-window", headers_enabled=True)
    for endpoint in ("frame.ask", "frame.draft", "frame.similar_patients", "frame.cohort"):
        view = app.view_functions[endpoint]
        view = limiter.limit(settings.rate_limit_tenant, key_func=tenant_key, scope="tenant")(view)
        view = limiter.limit(settings.rate_limit_clinician, key_func=clinician_key, scope="clinician")(view)
        app.view_functions[endpoint] = view

    @app.errorhandler(429)
    def too_many(error):
        limit = str(getattr(error, "description", "") or "")
        response = jsonify(error=f"Too many questions right now ({limit}). Please wait a moment and ask again.")
        response.status_code = 429
        return response

    return limiter
