"""The app's services, for views (like flaskr's `get_db`): each is made once by the app factory
and read here, so no blueprint reaches into another for them."""
from __future__ import annotations

from flask import current_app, request


def settings():
    return current_app.config["CHARTCITE"]


def search():
    return current_app.extensions["chartcite.search"]


def sessions():
    return current_app.extensions["chartcite.sessions"]


def audit():
    return current_app.extensions["chartcite.audit"]


def runner():
    return current_app.extensions["chartcite.runner"]


def registry():
    return current_app.extensions["chartcite.registry"]


def metrics():
    return current_app.extensions["chartcite.metrics"]


def public_url() -> str:
    """How EHRs reach chartcite: the configured public URL, else the request's host."""
    return (settings().public_url or request.host_url).rstrip("/")
