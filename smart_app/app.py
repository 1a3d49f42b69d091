"""Flask app factory: configuration is passed in, never read from the environment here."""
from __future__ import annotations

import logging

from flask import Flask, jsonify, render_template

from .settings import REPO_ROOT, Settings


def create_app(settings: Settings | None = None, runner=None) -> Flask:
    settings = settings or Settings.load()
    app = Flask(__name__, template_folder=str(REPO_ROOT / "templates"),
                static_folder=str(REPO_ROOT / "templates" / "static"), static_url_path="/static")
    app.config["CHARTCITE"] = settings
    app.config["SECRET_KEY"] = settings.ensure_secret()
    app.config["MAX_CONTENT_LENGTH"] = 64 * 1024

    from search.service import SearchService

    from .audit import open_audit
    from .sessions import SessionStore
    from .sources import open_registry

    settings.data_dir.mkdir(parents=True, exist_ok=True)
    app.extensions["chartcite.search"] = SearchService(**settings.search_options())
    app.extensions["chartcite.sessions"] = SessionStore(settings.state_path, settings.secret_key)
    registry = open_registry(settings)
    app.extensions["chartcite.registry"] = registry
    app.extensions["chartcite.audit"] = open_audit(settings.audit_db)
    if runner is None:
        from workers.runner import TaskRunner

        runner = TaskRunner(settings)
    app.extensions["chartcite.runner"] = runner

    from .admin import bp as admin_bp
    from .frame import bp as frame_bp
    from .launch import bp as launch_bp

    app.register_blueprint(frame_bp)
    app.register_blueprint(launch_bp)
    app.register_blueprint(admin_bp)

    from .limits import apply_rate_limits

    app.extensions["chartcite.limiter"] = apply_rate_limits(app, settings)

    @app.after_request
    def security_headers(response):
        # Framing is allowed for the registered EHRs' origins only (no X-Frame-Options: it
        # cannot name several origins, and DENY would break the EHR's frame).
        ancestors = " ".join(dict.fromkeys(["'self'", *settings.frame_ancestors.split(), *registry.frame_origins()]))
        form_action = " ".join(["'self'", response.headers.pop("X-Form-Action", "")]).strip()
        response.headers["Content-Security-Policy"] = (
            f"default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
            f"object-src 'none'; base-uri 'none'; form-action {form_action}; frame-ancestors {ancestors}")
        response.headers["X-Content-Type-Options"] = "nosniff"
        response.headers["Referrer-Policy"] = "no-referrer"
        response.headers.setdefault("Cache-Control", "no-store")
        return response

    @app.template_filter("utc")
    def utc(timestamp: float) -> str:
        from datetime import datetime, timezone

        return datetime.fromtimestamp(timestamp, timezone.utc).strftime("%Y-%m-%d %H:%M UTC")

    @app.errorhandler(404)
    def not_found(_):
        return render_template("error.html", message="That page does not exist."), 404

    @app.errorhandler(413)
    def too_large(_):
        return jsonify(error="request too large"), 413

    # Werkzeug's access log shows paths only; question text travels in POST bodies and is never logged.
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    return app
