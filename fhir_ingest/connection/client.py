"""A FHIR R4 REST client for one EHR: bearer token, paged searches, Binary attachments, and
polite retries.

Polite means: every request draws on the EHR's request budget (requests in flight and per
second, for the whole deployment when Redis holds it: fhir_ingest/budget.py), a 429/503 waits for the server's Retry-After (else exponential backoff), and a 401 refreshes the
token once before giving up, so chartcite never becomes "excessive or unexpected load".
"""
from __future__ import annotations

import json
import logging
import random
import sys
import threading
import time
from email.utils import parsedate_to_datetime
from typing import Callable, Iterator, Protocol
from urllib.parse import urljoin, urlsplit

import requests
from urllib3.exceptions import NewConnectionError

from .budget import RequestBudget, budget_for

log = logging.getLogger(__name__)

RETRY_STATUSES = {429, 500, 502, 503, 504}


class FhirError(RuntimeError):
    """The EHR answered with an error chartcite cannot retry away."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


class FhirUnavailable(FhirError):
    """Still failing after the retries (429/5xx, timeouts, truncated pages): try again later."""


class AuthExpired(FhirError):
    """The token was refused and could not be refreshed: the clinician must relaunch. `renewable`
    is False when the EHR gave no way to renew it at all (a public client without a refresh token)."""

    def __init__(self, message: str, status: int | None = None, renewable: bool = True):
        super().__init__(message, status)
        self.renewable = renewable


class TokenProvider(Protocol):
    def token(self) -> str: ...

    def refresh(self) -> str: ...


class StaticToken:
    def __init__(self, value: str = ""):
        self.value = value

    def token(self) -> str:
        return self.value

    def refresh(self) -> str:
        raise AuthExpired("the access token was refused and there is no way to refresh it", 401)


def retry_after_seconds(value: str | None, default: float) -> float:
    """Retry-After is seconds or an HTTP date; anything else means the default."""
    if not value:
        return default
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        return max(0.0, parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError):
        return default


def never_sent(exc: Exception) -> bool:
    """The connection was never made, so the request cannot have reached the EHR."""
    if isinstance(exc, requests.ConnectTimeout):
        return True
    reason = getattr(exc.args[0], "reason", None) if exc.args else None
    return isinstance(reason, NewConnectionError)


def release_on_close(response: requests.Response, slot) -> None:
    """The budget slot goes back when the streamed response is closed (once, however often)."""
    close, lock, released = response.close, threading.Lock(), []

    def closing() -> None:
        try:
            close()
        finally:
            with lock:
                if not released:
                    released.append(True)
                    slot.__exit__(None, None, None)

    response.close = closing


def asked_to_retry(response: requests.Response) -> bool:
    """429 or 503 with Retry-After: the EHR did nothing and says when to come back."""
    return response.status_code in (429, 503) and bool(response.headers.get("Retry-After"))


class FhirClient:
    def __init__(self, base_url: str, auth: TokenProvider | None = None, timeout: float = 20.0,
                 max_concurrency: int = 2, retries: int = 5, backoff: float = 0.5, max_wait: float = 60.0,
                 budget: RequestBudget | None = None, on_status: Callable[[str], None] | None = None,
                 unreachable_retries: int = 5):
        self.base_url = base_url.rstrip("/") + "/"
        # A refused connection or a timeout may mean the EHR is down rather than busy: a caller
        # with a clinician waiting gives up after fewer retries and schedules the sync again.
        self.unreachable_retries = min(unreachable_retries, retries)
        self.auth = auth or StaticToken()
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        self.max_wait = max_wait
        self.budget = budget or budget_for(urlsplit(self.base_url).netloc, max_concurrency)
        self.on_status = on_status or (lambda status: None)   # each answer's status, for the metrics
        self.http = requests.Session()
        self.requests_made = 0
        # A Retry-After holds every later request to the EHR until it has passed, whichever series
        # of retries (a file read again, a status poll, another file) asks next.
        self.not_before = 0.0

    def url(self, path_or_url: str) -> str:
        return path_or_url if "://" in path_or_url else urljoin(self.base_url, path_or_url.lstrip("/"))

    def request(self, method: str, path_or_url: str, params: dict | None = None, accept: str = "application/fhir+json",
                headers: dict | None = None, authorized: bool = True, json_body: dict | None = None,
                stream: bool = False, retry_statuses: set[int] = RETRY_STATUSES,
                idempotent: bool = True) -> requests.Response:
        """One request, retried while the EHR answers one of `retry_statuses` (waiting as its
        Retry-After says) or cannot be reached; a 401 renews the token once.

        A request that is not `idempotent` (a POST that creates) is sent again only when it
        certainly had no effect: the connection was never made, or the EHR asked to be asked again
        later (429/503 with Retry-After). After a read timeout or a 5xx the EHR may have done it
        already, so the caller finds out before trying again (as urllib3's Retry does by default)."""
        url = self.url(path_or_url)
        # The token goes only to the EHR's own origin: an attachment or a next link pointing
        # elsewhere must not receive it.
        authorized = authorized and urlsplit(url).netloc == urlsplit(self.base_url).netloc
        refreshed, unreachable = False, 0
        for attempt in range(self.retries + 1):
            self._wait_for_retry_after()
            try:
                response = self._send(method, url, params, lambda: self._headers(accept, headers, authorized),
                                      json_body, stream)
                self.on_status(str(response.status_code))
            except (requests.ConnectionError, requests.Timeout) as exc:
                self.on_status("unreachable")
                if not idempotent and not never_sent(exc):
                    raise FhirUnavailable(f"{method} {_path(url)}: {type(exc).__name__} after the request was "
                                          f"sent; the EHR may have received it") from exc
                if unreachable == self.unreachable_retries or attempt == self.retries:
                    raise FhirUnavailable(f"{method} {_path(url)}: {type(exc).__name__}") from exc
                unreachable += 1
                self._sleep(attempt, None)
                continue
            if response.status_code == 401 and authorized and not refreshed:
                response.close()
                refreshed = True
                self.auth.refresh()      # raises AuthExpired when it cannot
                continue
            if response.status_code == 401:
                response.close()
                raise AuthExpired(f"{method} {_path(url)} refused the refreshed token", 401)
            if response.status_code in retry_statuses and (idempotent or asked_to_retry(response)):
                response.close()
                self._hold_off(attempt, response.headers.get("Retry-After"))
                if attempt == self.retries:
                    raise FhirUnavailable(f"{method} {_path(url)} still answers {response.status_code} after "
                                          f"{self.retries} retries", response.status_code)
                continue
            return response
        raise FhirUnavailable(f"{method} {_path(url)} failed")   # not reached

    def _headers(self, accept: str, headers: dict | None, authorized: bool) -> dict:
        sent = {"Accept": accept, **(headers or {})}
        if authorized:
            token = self.auth.token()
            if token:
                sent["Authorization"] = f"Bearer {token}"
        return sent

    def _send(self, method: str, url: str, params, headers_now: Callable[[], dict], json_body,
              stream: bool) -> requests.Response:
        """One request within the EHR's budget. The headers (the token) are made once the slot is
        ours: a token read before a wait for a slot may expire during it (a short-lived token,
        several searches side by side). A streamed body (a Bulk output file) holds its slot until
        the response is closed: a download in flight is a request in flight, and the budget is what
        keeps chartcite's load on the EHR what hospital IT set."""
        slot = self.budget.slot()
        slot.__enter__()
        try:
            self.requests_made += 1
            response = self.http.request(method, url, params=params, headers=headers_now(), timeout=self.timeout,
                                         json=json_body, stream=stream)
        except BaseException:
            slot.__exit__(*sys.exc_info())
            raise
        if not stream:
            slot.__exit__(None, None, None)
        else:
            release_on_close(response, slot)
        return response

    def _sleep(self, attempt: int, retry_after: str | None) -> None:
        time.sleep(self._wait_seconds(attempt, retry_after))

    def _wait_seconds(self, attempt: int, retry_after: str | None) -> float:
        default = self.backoff * (2 ** attempt) * (1 + random.random() / 4)
        wait = min(self.max_wait, retry_after_seconds(retry_after, default))
        log.info("EHR asked to wait: retrying in %.1f s", wait)
        return wait

    def _hold_off(self, attempt: int, retry_after: str | None) -> None:
        """No request to the EHR before its Retry-After (else the back-off) has passed."""
        self.not_before = max(self.not_before, time.monotonic() + self._wait_seconds(attempt, retry_after))

    def _wait_for_retry_after(self) -> None:
        wait = self.not_before - time.monotonic()
        if wait > 0:
            time.sleep(wait)

    def get_json(self, path_or_url: str, params: dict | None = None) -> dict:
        """GET a JSON resource; a truncated or garbled body is retried like a 503."""
        for attempt in range(self.retries + 1):
            response = self.request("GET", path_or_url, params)
            if response.status_code >= 400:
                raise FhirError(f"GET {_path(response.url)} answered {response.status_code}: {outcome_words(response)}",
                                response.status_code)
            try:
                return response.json()
            except ValueError:
                if attempt == self.retries:
                    raise FhirUnavailable(f"GET {_path(response.url)} keeps returning unreadable JSON")
                self._sleep(attempt, None)
        raise FhirUnavailable("unreachable")

    def search(self, resource_type: str, params: dict) -> Iterator[dict]:
        """Every resource of a search, following the Bundle's `next` links."""
        page = self.get_json(resource_type, params)
        while True:
            if page.get("resourceType") != "Bundle":
                raise FhirError(f"search {resource_type} did not return a Bundle")
            for entry in page.get("entry") or []:
                resource = entry.get("resource")
                if isinstance(resource, dict) and (entry.get("search") or {}).get("mode", "match") == "match":
                    yield resource
            next_url = next((link.get("url") for link in page.get("link") or [] if link.get("relation") == "next"), None)
            if not next_url:
                return
            page = self.get_json(next_url)

    def binary(self, url: str, content_type: str) -> bytes:
        """An attachment's bytes. Asks for its own content type and accepts the Binary resource as
        `application/fhir+json` (base64 data) instead; a server that answers 406 to that is asked
        for the resource alone. Some servers serve a Binary only as FHIR JSON."""
        own = content_type or "application/octet-stream"
        response = self.request("GET", url, accept=f"{own}, application/fhir+json;q=0.9")
        if response.status_code == 406:
            response = self.request("GET", url, accept="application/fhir+json")
        if response.status_code >= 400:
            raise FhirError(f"GET {_path(response.url)} answered {response.status_code}: {outcome_words(response)}",
                            response.status_code)
        if response.headers.get("Content-Type", "").startswith("application/fhir+json"):
            # A server that ignores Accept sends the Binary resource with base64 data.
            import base64

            return base64.b64decode(response.json().get("data", ""))
        return response.content

    def server_time(self) -> str:
        """The EHR's clock (from the Date header of /metadata) for the next `_lastUpdated`."""
        response = self.request("GET", "metadata", params={"_summary": "true"})
        try:
            when = parsedate_to_datetime(response.headers["Date"])
        except (KeyError, TypeError, ValueError):
            from datetime import datetime, timezone

            when = datetime.now(timezone.utc)
        return when.strftime("%Y-%m-%dT%H:%M:%SZ")


def _path(url: str) -> str:
    """The URL without its query: search parameters can carry patient ids, logs must not."""
    return urlsplit(url).path


def outcome_words(response: requests.Response) -> str:
    """What the EHR said about a refusal, in its own words: the OperationOutcome's diagnostics (or
    codes), an OAuth error and its description, else the start of the body. They carry no patient
    data, and a person needs them to fix anything."""
    try:
        body = response.json()
    except ValueError:
        return response.text[:200]
    if not isinstance(body, dict):
        return json.dumps(body)[:200]
    if body.get("error"):
        description = str(body.get("error_description") or "")[:300]
        return f"{body['error']}: {description}" if description else str(body["error"])
    issues = [i for i in body.get("issue") or [] if isinstance(i, dict)] if isinstance(body.get("issue"), list) else []
    return "; ".join(issue_words(i) for i in issues)[:300] or json.dumps(body)[:200]


def issue_words(issue: dict) -> str:
    details = issue.get("details") if isinstance(issue.get("details"), dict) else {}
    return str(issue.get("diagnostics") or details.get("text") or issue.get("code") or "an unnamed issue")
