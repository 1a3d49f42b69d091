"""Flask app factory: configuration is passed in, never read from the environment here. The
factory is wiring; each concern is an `init_*` function."""
from __future__ import annotations

import logging

from flask import Flask, g, jsonify, make_response, render_template, request

from .settings import REPO_ROOT, Settings

log = logging.getLogger(__name__)


def create_app(settings: Settings | None = None, runner=None) -> Flask:
    from search.collector import collect_less_often

    collect_less_often()
    if settings is None:
        settings = Settings.load()
        settings.log_warnings(log)
    settings.apply_tls_trust()
    app = Flask(__name__, template_folder=str(REPO_ROOT / "templates"),
                static_folder=str(REPO_ROOT / "templates" / "static"), static_url_path="/static")
    app.config["CHARTCITE"] = settings
    app.config["SECRET_KEY"] = settings.ensure_secret()
    app.config["MAX_CONTENT_LENGTH"] = 64 * 1024
    init_services(app, settings, runner)
    init_blueprints(app)
    from .limits import apply_rate_limits

    app.extensions["chartcite.limiter"] = apply_rate_limits(app, settings)
    init_security_headers(app, settings)
    init_error_handlers(app)

    @app.template_filter("utc")
    def utc(timestamp: float) -> str:
        from datetime import datetime, timezone

        return datetime.fromtimestamp(timestamp, timezone.utc).strftime("%Y-%m-%d %H:%M UTC")

    # Werkzeug's access log shows paths only; question text travels in POST bodies and is never logged.
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    return app


def init_services(app: Flask, settings: Settings, runner) -> None:
    """The services views read through smart_app/services.py, each made once here."""
    from search.service import SearchService
    from workers.sync import open_registry

    from .audit import open_audit
    from .sessions import SessionStore

    settings.prepare_data_dir()
    if settings.token_key_beside_data and not settings.demo_launch:
        log.warning("the key that encrypts EHR tokens is a file in the data directory, beside the tokens it "
                    "protects; supply it from your secret store as CHARTCITE_TOKEN_KEY (a Fernet key) instead")
    app.extensions["chartcite.search"] = SearchService(**settings.search_options())
    app.extensions["chartcite.sessions"] = SessionStore(settings.state_path, settings.secret_key,
                                                         settings.session_minutes * 60)
    app.extensions["chartcite.registry"] = open_registry(settings)
    app.extensions["chartcite.audit"] = open_audit(settings.audit_db)
    if runner is None:
        from workers.runner import TaskRunner

        runner = TaskRunner(settings)
    app.extensions["chartcite.runner"] = runner


def init_blueprints(app: Flask) -> None:
    from .admin import bp as admin_bp
    from .frame import bp as frame_bp
    from .health import bp as health_bp, warm_up
    from .launch import bp as launch_bp
    from .metrics import Metrics, bp as metrics_bp
    from .reply_routes import bp as reply_bp

    for blueprint in (frame_bp, launch_bp, admin_bp, health_bp, metrics_bp, reply_bp):
        app.register_blueprint(blueprint)
    warm_up(app)
    app.extensions["chartcite.metrics"] = Metrics(app)


def init_security_headers(app: Flask, settings: Settings) -> None:
    registry = app.extensions["chartcite.registry"]

    def framing_origins(response) -> list[str]:
        """A page of one EHR's launch may be framed by that EHR's origins only; an error page by
        any registered EHR's (it carries no patient data, and the clinician must read it in
        whichever EHR it appeared); any other page by chartcite's own and the configured ones."""
        tenant = g.get("frame_tenant")
        if tenant is not None:
            return registry.frame_origins(tenant)
        return registry.frame_origins() if response.status_code >= 400 else []

    @app.after_request
    def security_headers(response):
        # No X-Frame-Options: it cannot name several origins, and DENY would break the EHR's frame.
        ancestors = " ".join(dict.fromkeys(["'self'", *settings.frame_ancestors.split(), *framing_origins(response)]))
        form_action = " ".join(["'self'", response.headers.pop("X-Form-Action", "")]).strip()
        response.headers["Content-Security-Policy"] = (
            f"default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
            f"object-src 'none'; base-uri 'none'; form-action {form_action}; frame-ancestors {ancestors}")
        response.headers["X-Content-Type-Options"] = "nosniff"
        response.headers["Referrer-Policy"] = "no-referrer"
        response.headers.setdefault("Cache-Control", "no-store")
        return response


def init_error_handlers(app: Flask) -> None:
    from search.backends.base import BackendUnavailable

    from .audit import AuditUnavailable

    def api_request() -> bool:
        return request.path.startswith("/api/")

    @app.errorhandler(404)
    def not_found(_):
        return render_template("error.html", message="That page does not exist."), 404

    @app.errorhandler(413)
    def too_large(_):
        return jsonify(error="request too large"), 413

    @app.errorhandler(400)
    def bad_request(error):
        if api_request():
            return jsonify(error=getattr(error, "description", "") or "malformed request"), 400
        return render_template("error.html", message="That request could not be read."), 400

    @app.errorhandler(AuditUnavailable)
    def audit_unavailable(_):
        # Any route that must leave an audit line and cannot (an answer, a draft, an admin page, a
        # refused admin token): a 503 that says why, counted, never a 500 and never unrecorded work.
        from .services import metrics

        metrics().observe_audit_failure()
        message = "The audit trail could not be written, so this was not done. Try again in a moment; if this persists, tell IT."
        if api_request():
            return jsonify(error=message), 503
        return render_template("error.html", message=message), 503

    @app.errorhandler(BackendUnavailable)
    def index_unavailable(error):
        # A failover window (a node left, a replica is being promoted) or an index that is down:
        # a clear 503 the frame shows, never an answer from part of the record.
        log.warning("the index was unavailable: %s", error)
        message = "The record index is unavailable for a moment; ask again in a few seconds."
        response = jsonify(error=message) if api_request() else make_response(
            render_template("error.html", message="The record index is unavailable for a moment; reload in a few "
                                                  "seconds."))
        response.status_code = 503
        response.headers["Retry-After"] = "5"
        return response

    @app.errorhandler(500)
    def server_error(_):
        # The frame reads JSON; a page of HTML would leave it waiting. The cause is in the log.
        if api_request():
            return jsonify(error="chartcite could not answer that request; it has been logged. Try again."), 500
        return render_template("error.html", message="Something went wrong; it has been logged."), 500
