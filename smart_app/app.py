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

    from .sessions import SessionStore

    settings.data_dir.mkdir(parents=True, exist_ok=True)
    app.extensions["chartcite.search"] = SearchService(**settings.search_options())
    app.extensions["chartcite.sessions"] = SessionStore(settings.state_path, settings.secret_key)
    if runner is None:
        from workers.runner import TaskRunner

        runner = TaskRunner(settings)
    app.extensions["chartcite.runner"] = runner

    from .frame import bp as frame_bp

    app.register_blueprint(frame_bp)

    @app.after_request
    def security_headers(response):
        ancestors = " ".join(["'self'", *settings.frame_ancestors.split()])
        response.headers["Content-Security-Policy"] = (
            f"default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
            f"object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors {ancestors}")
        response.headers["X-Content-Type-Options"] = "nosniff"
        response.headers["Referrer-Policy"] = "no-referrer"
        response.headers["Cache-Control"] = "no-store"
        return response

    @app.errorhandler(404)
    def not_found(_):
        return render_template("error.html", message="That page does not exist."), 404

    @app.errorhandler(413)
    def too_large(_):
        return jsonify(error="request too large"), 413

    # Werkzeug's access log shows paths only; question text travels in POST bodies and is never logged.
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    return app
