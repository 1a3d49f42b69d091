"""A standards-faithful stand-in for an EHR's SMART side, in front of a real FHIR server.

The FHIR data, search, paging and Bulk Data come from sekmet-fhir (a real FHIR R4 server from
PyPI, loaded with the shared Synthea bundles). What no installable server offers is the SMART App
Launch authorization server, so this process plays it, following SMART App Launch 2.x, SMART
Backend Services and Bulk Data:

- `/.well-known/smart-configuration` and `openid-configuration` under the FHIR base (the iss);
- `authorize` (GET and POST) with a launch id, `aud` = iss, PKCE S256 only (plain and wrong
  verifiers are rejected), a clinician who is always signed in (Practitioner/ehr-clinician);
- `token`: authorization_code with launch context (patient, encounter, need_patient_banner,
  smart_style_url), refresh_token, and client_credentials whose JWT client assertion is checked
  against the client's JWKS URL (signature, iss/sub, aud, exp at most 5 minutes ahead, jti once);
- id_tokens signed with its own RS256 key, published at `/jwks`;
- the FHIR API proxied to sekmet with the bearer token checked, a patient token confined to its
  patient, Binary content negotiation, and `$export` with a `deleted` output for deletions;
- fault injection (429 with Retry-After, 500, expired tokens, truncated pages) and a request log
  for tests to read, under `/_test/`;
- `/ehr?patient=ID`: an EHR page that embeds chartcite in an iframe and starts an EHR launch.

Run: python -m tests.ehr_server --port P --upstream http://127.0.0.1:S/fhir --client-id ID
     --redirect-prefix http://localhost:C/ [--client-jwks-url URL]
"""
from __future__ import annotations

import argparse
import base64
import hashlib
import json
import secrets
import threading
import time
from datetime import datetime
from urllib.parse import parse_qs, unquote_plus, urlencode, urlsplit

import requests
from flask import Flask, Response, abort, jsonify, redirect, request
from joserfc import jwk, jwt
from joserfc.errors import JoseError

CLINICIAN = "Practitioner/ehr-clinician"
CODE_TTL = 120
MAX_ASSERTION_LIFETIME = 300


def create_server(upstream: str, client_id: str, redirect_prefix: str, client_jwks_url: str = "",
                  token_lifetime: int = 3600) -> Flask:
    app = Flask(__name__)
    upstream = upstream.rstrip("/")
    signing = jwk.RSAKey.generate_key(2048, private=True)
    signing.ensure_kid()
    lock = threading.Lock()
    state = {"launches": {}, "codes": {}, "access": {}, "refresh": {}, "jtis": set(), "faults": [],
             "log": [], "deleted": [], "token_lifetime": token_lifetime,
             "client": {"auth": "any", "secret": "", "grantable": None}}

    def root() -> str:
        return request.host_url.rstrip("/")

    def base() -> str:
        return root() + "/fhir"

    def fail(error: str, description: str, status: int = 400):
        return jsonify(error=error, error_description=description), status

    # --- test controls ----------------------------------------------------------------------------
    @app.post("/_test/launch")
    def new_launch():
        body = request.get_json(force=True)
        launch_id = secrets.token_urlsafe(12)
        state["launches"][launch_id] = {"patient": body["patient"], "encounter": body.get("encounter"),
                                        "need_patient_banner": body.get("need_patient_banner", True),
                                        "smart_style_url": root() + "/style.json" if body.get("style") else None,
                                        "clinician": body.get("clinician", CLINICIAN)}
        return jsonify(launch=launch_id)

    @app.post("/_test/faults")
    def add_fault():
        state["faults"].append(request.get_json(force=True) | {"used": 0})
        return jsonify(ok=True)

    @app.post("/_test/clear-faults")
    def clear_faults():
        state["faults"].clear()
        return jsonify(ok=True)

    @app.post("/_test/expire-tokens")
    def expire_tokens():
        with lock:
            for grant in state["access"].values():
                grant["exp"] = 0
        return jsonify(ok=True)

    @app.post("/_test/revoke-refresh")
    def revoke_refresh():
        state["refresh"].clear()
        return jsonify(ok=True)

    @app.post("/_test/binary-exact")
    def binary_exact():
        state["binary_exact"] = bool(request.get_json(force=True)["on"])
        return jsonify(ok=True)

    @app.post("/_test/client")
    def configure_client():
        """The app registration as an EHR console holds it: how the client authenticates
        ("private_key_jwt", "client_secret_basic" with its secret, or "any" as before), how a
        Basic secret is compared ("form": form-decoded first, as RFC 6749 2.3.1 says; "raw": as
        sent, as the SMART reference launcher and many servers do), and which scopes it may be
        granted (None = all; `grantable_system` the same for Backend Services), the client id
        of a separate Backend Services app (`backend_client_id`), and `registry: false` for a
        server that keeps no client registry, as the SMART reference launcher (smart-launcher-v2)
        does: its codes carry the client's settings, so a code it did not issue is refused as
        `invalid_client` ("jwt malformed") whatever credentials come with it."""
        body = request.get_json(force=True)
        state["client"] = {"auth": body.get("auth", "any"), "secret": body.get("secret", ""),
                           "registry": body.get("registry", True),
                           "grantable": body.get("grantable"), "secret_encoding": body.get("secret_encoding", "form"),
                           "jwks_url": body.get("jwks_url"), "grantable_system": body.get("grantable_system"),
                           "backend_client_id": body.get("backend_client_id")}
        return jsonify(ok=True)

    @app.post("/_test/unsupported")
    def set_unsupported():
        """Resource types this FHIR server does not have: left out of its CapabilityStatement, and
        a search for one answers 404 not-supported, as servers answer an unknown type."""
        state["unsupported"] = set(request.get_json(force=True).get("types") or [])
        return jsonify(ok=True)

    @app.post("/_test/ignore-since")
    def ignore_since():
        state["ignore_since"] = bool(request.get_json(force=True)["on"])
        return jsonify(ok=True)

    @app.post("/_test/latency")
    def set_latency():
        """Every FHIR request answers this much later: a slow EHR, or a long sync in a short test."""
        state["latency"] = float(request.get_json(force=True)["seconds"])
        return jsonify(ok=True)

    @app.post("/_test/bulk")
    def configure_bulk():
        """How this server's Bulk Data export behaves, as EHRs and the reference server do:
        `delay` seconds of 202 answers after a kick-off (with `progress` as X-Progress and
        `retry_after`), `split` output files of that many lines, `fail_types` (or every
        `fail_every`-th file) listed under `error` as files that could not be generated, `backdate`
        every exported resource's meta.lastUpdated to that instant (a clock that disagrees; only
        the resources `backdate_only` names, when it is given),
        `cut` the first `times` downloads of a file whose URL holds `cut` in the middle,
        `unknown_groups: "empty"` exporting nothing for a Group it does not have, `no_range`
        ignoring Range requests, `regenerate` serving a file whose URL holds it in another line
        order once it was cut (as an EHR that regenerated it), `no_validators` serving files
        without an ETag, `broken_line` cutting the first line of a file whose URL holds it short
        (not JSON), `transaction_time` as the manifest's, `file_delay` seconds before each output
        file answers, and `members` serving a Group's members as the reference server does
        (`"urn"`: `urn:uuid:<id>`), as absolute URLs (`"absolute"`) or by the patient's identifier
        alone (`"identifier"`)."""
        state["bulk"] = request.get_json(force=True)
        state["bulk_cut"] = 0
        return jsonify(ok=True)

    @app.post("/_test/smart-config")
    def configure_smart_config():
        """Leave these keys out of the SMART configuration (a Bulk Data server for Backend Services
        only has no authorization endpoint and often no capabilities), or publish other values for
        some (`set`: the reference launcher lists no "none" among its client authentication methods)."""
        body = request.get_json(force=True)
        state["smart_omit"] = set(body.get("omit") or [])
        state["smart_set"] = dict(body.get("set") or {})
        return jsonify(ok=True)

    @app.post("/_test/token-lifetime")
    def set_lifetime():
        state["token_lifetime"] = int(request.get_json(force=True)["seconds"])
        return jsonify(ok=True)

    @app.get("/_test/log")
    def read_log():
        return jsonify(state["log"])

    @app.post("/_test/clear-log")
    def clear_log():
        state["log"].clear()
        return jsonify(ok=True)

    @app.post("/_test/delete")
    def delete_resource():
        ref = request.get_json(force=True)["ref"]
        response = requests.delete(f"{upstream}/{ref}", timeout=30)
        state["deleted"].append((ref, time.time()))
        return jsonify(status=response.status_code)

    @app.put("/_test/resource/<rtype>/<rid>")
    def put_resource(rtype, rid):
        response = requests.put(f"{upstream}/{rtype}/{rid}", json=request.get_json(force=True), timeout=30,
                                headers={"Content-Type": "application/fhir+json"})
        return Response(response.content, response.status_code, content_type="application/json")

    @app.get("/style.json")
    def style():
        return jsonify(color_background="#edeae3", color_highlight="#69b5ce", color_modal_backdrop="",
                       color_error="#9e2d2d", dim_border_radius="6px", font_family_body="Georgia, serif")

    # --- discovery --------------------------------------------------------------------------------
    @app.get("/fhir/.well-known/smart-configuration")
    def smart_configuration():
        response = smart_configuration_body()
        omitted = state.get("smart_omit") or set()
        response |= state.get("smart_set") or {}
        return jsonify({k: v for k, v in response.items() if k not in omitted})

    def smart_configuration_body() -> dict:
        return dict(
            issuer=base(), jwks_uri=root() + "/jwks",
            authorization_endpoint=root() + "/auth/authorize", token_endpoint=root() + "/auth/token",
            grant_types_supported=["authorization_code", "client_credentials", "refresh_token"],
            token_endpoint_auth_methods_supported=["private_key_jwt", "client_secret_basic", "none"],
            token_endpoint_auth_signing_alg_values_supported=["RS384", "ES384"],
            scopes_supported=["openid", "fhirUser", "launch", "launch/patient", "offline_access", "online_access",
                              "patient/*.rs", "patient/*.read", "system/*.rs", "system/*.read"],
            response_types_supported=["code"], code_challenge_methods_supported=["S256"],
            capabilities=["launch-ehr", "launch-standalone", "authorize-post", "client-public",
                          "client-confidential-asymmetric", "client-confidential-symmetric", "context-ehr-patient", "context-standalone-patient",
                          "context-banner", "context-style", "sso-openid-connect", "permission-offline",
                          "permission-patient", "permission-v1", "permission-v2"])

    @app.get("/fhir/.well-known/openid-configuration")
    def openid_configuration():
        return jsonify(issuer=base(), jwks_uri=root() + "/jwks", authorization_endpoint=root() + "/auth/authorize",
                       token_endpoint=root() + "/auth/token", id_token_signing_alg_values_supported=["RS256"])

    @app.get("/jwks")
    def jwks():
        return jsonify(keys=[signing.as_dict(private=False) | {"alg": "RS256", "use": "sig"}])

    # --- authorize --------------------------------------------------------------------------------
    @app.route("/auth/authorize", methods=["GET", "POST"])
    def authorize():
        p = request.values
        redirect_uri = p.get("redirect_uri", "")
        if p.get("client_id") != client_id or not redirect_uri.startswith(redirect_prefix):
            # Never redirect to an unregistered URI: answer here.
            return fail("invalid_client", "unknown client or redirect_uri")

        def back(**params):
            return redirect(f"{redirect_uri}?{urlencode(params | {'state': p.get('state', '')})}")

        if p.get("response_type") != "code":
            return back(error="unsupported_response_type")
        if p.get("aud", "").rstrip("/") != base():
            return back(error="invalid_request", error_description="aud must be this FHIR server")
        if p.get("code_challenge_method") != "S256" or not p.get("code_challenge"):
            return back(error="invalid_request", error_description="PKCE with S256 is required")
        scopes = p.get("scope", "").split()
        grantable = state["client"]["grantable"]
        refused = [s for s in scopes if grantable is not None and s not in grantable]
        if refused:
            # As Epic answers a registration that lacks them: the whole request fails.
            return back(error="invalid_scope",
                        error_description=f"Scopes {' and '.join(refused)} could not be granted to this client")
        if "launch" in scopes:
            context = state["launches"].pop(p.get("launch", ""), None)
            if context is None:
                return back(error="invalid_request", error_description="unknown launch")
        elif "launch/patient" in scopes:
            context = {"patient": app.config["STANDALONE_PATIENT"], "need_patient_banner": True}
        else:
            return back(error="invalid_scope", error_description="launch or launch/patient is required")
        code = secrets.token_urlsafe(24)
        state["codes"][code] = {"redirect_uri": redirect_uri, "challenge": p["code_challenge"], "scope": " ".join(scopes),
                                "nonce": p.get("nonce"), "context": context, "exp": time.time() + CODE_TTL}
        return back(code=code)

    # --- token ------------------------------------------------------------------------------------
    @app.post("/auth/token")
    def token():
        fault = take_fault("token")
        if fault:
            return fault
        form = request.form
        grant = form.get("grant_type")
        presented = "basic" if request.headers.get("Authorization", "").startswith("Basic ") else \
            "assertion" if form.get("client_assertion") else "none"
        state["log"].append({"method": "POST", "path": request.path, "grant": grant, "client_auth": presented,
                             "args": {}, "accept": "", "auth": presented != "none", "scope": form.get("scope", "")})
        if grant == "authorization_code" and not state["client"].get("registry", True) and \
                form.get("code", "") not in state["codes"]:
            return fail("invalid_client", "invalid token: jwt malformed", 401)
        problem = authenticate_client(form)
        if problem:
            return fail("invalid_client", problem, 401)
        if grant == "authorization_code":
            return code_grant(form)
        if grant == "refresh_token":
            return refresh_grant(form)
        if grant == "client_credentials":
            # authenticate_client has checked the secret of a symmetric registration; any other
            # client must prove itself with a JWT (SMART Backend Services).
            if not form.get("client_assertion") and state["client"]["auth"] != "client_secret_basic":
                return fail("invalid_client", "client_credentials needs a JWT client assertion", 401)
            refused = refused_system_scopes(form.get("scope", "").split())
            if refused:
                # As the reference Bulk Data server answers scopes for types it does not hold.
                return fail("invalid_scope", f"Scopes {' and '.join(refused)} could not be granted to this client")
            return issue({"kind": "system", "scope": form.get("scope", "")}, refresh=False)
        return fail("unsupported_grant_type", f"{grant!r}")

    def refused_system_scopes(scopes: list[str]) -> list[str]:
        """System scopes for a type this server does not have, or that the registration may not be
        granted (`grantable_system`, when set)."""
        gone, grantable = state.get("unsupported") or set(), state["client"].get("grantable_system")
        return [scope for scope in scopes if scope.startswith("system/") and (
            scope[7:].split(".")[0] in gone or (grantable is not None and scope not in grantable))]

    def authenticate_client(form) -> str:
        """RFC 6749 2.3 / SMART client authentication, as the registration says: a symmetric client
        must send HTTP Basic (id and secret form-urlencoded first) and nothing else."""
        method = state["client"]["auth"]
        if method == "none":
            if form.get("client_assertion") or form.get("client_secret") or request.headers.get("Authorization"):
                return "this is a public client: it presents no credentials"
            return "" if form.get("client_id") == client_id else "unknown client"
        if method == "client_secret_basic":
            header = request.headers.get("Authorization", "")
            if form.get("client_assertion") or form.get("client_secret"):
                return "this client authenticates with client_secret_basic only"
            if not header.startswith("Basic "):
                return "client authentication is required: HTTP Basic with the client id and secret"
            try:
                user, _, password = base64.b64decode(header[6:]).decode().partition(":")
            except ValueError:
                return "malformed HTTP Basic credentials"
            decode = unquote_plus if state["client"].get("secret_encoding", "form") == "form" else str
            if not header.startswith("Basic ") or decode(user) != client_id or \
                    decode(password) != state["client"]["secret"]:
                return "client_secret_basic credentials do not match"
            return ""
        if form.get("client_assertion") or client_jwks_url or state["client"].get("jwks_url") or \
                method == "private_key_jwt":
            return check_assertion(form)
        return "" if form.get("client_id") == client_id else "unknown client"

    def check_assertion(form) -> str:
        if form.get("client_assertion_type") != "urn:ietf:params:oauth:client-assertion-type:jwt-bearer":
            return "client_assertion_type must be jwt-bearer"
        registered_jwks = state["client"].get("jwks_url") or client_jwks_url
        if not registered_jwks:
            return "this client has no JWKS registered"
        try:
            keys = jwk.KeySet.import_key_set(requests.get(registered_jwks, timeout=10).json())
            decoded = jwt.decode(form["client_assertion"], keys, algorithms=["RS384", "ES384"])
        except (JoseError, ValueError, requests.RequestException) as exc:
            return f"assertion signature does not verify: {type(exc).__name__}"
        claims, now = decoded.claims, time.time()
        # A Backend Services app may be registered apart, with a client id of its own (Epic).
        allowed = {client_id} | ({state["client"]["backend_client_id"]} if state["client"].get("backend_client_id")
                                 and form.get("grant_type") == "client_credentials" else set())
        if claims.get("iss") not in allowed or claims.get("sub") != claims.get("iss"):
            return "assertion iss and sub must be the client_id"
        if claims.get("aud") != root() + "/auth/token":
            return "assertion aud must be the token endpoint"
        exp = claims.get("exp", 0)
        if exp < now:
            return "assertion expired"
        if exp > now + MAX_ASSERTION_LIFETIME:
            return "assertion exp must be at most 5 minutes ahead"
        jti = claims.get("jti")
        with lock:
            if not jti or jti in state["jtis"]:
                return "assertion jti missing or already used"
            state["jtis"].add(jti)
        return ""

    def code_grant(form):
        grant = state["codes"].pop(form.get("code", ""), None)
        if grant is None or grant["exp"] < time.time():
            return fail("invalid_grant", "unknown or expired code")
        if form.get("redirect_uri") != grant["redirect_uri"]:
            return fail("invalid_grant", "redirect_uri differs from the authorization request")
        verifier = form.get("code_verifier", "")
        challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
        if not verifier or challenge != grant["challenge"]:
            return fail("invalid_grant", "PKCE verification failed")
        return issue({"kind": "user", "scope": grant["scope"], "nonce": grant["nonce"], **grant["context"]},
                     refresh="offline_access" in grant["scope"].split() or "online_access" in grant["scope"].split())

    def refresh_grant(form):
        grant = state["refresh"].get(form.get("refresh_token", ""))
        if grant is None:
            return fail("invalid_grant", "unknown refresh token")
        return issue(dict(grant), refresh=True, refresh_token=form["refresh_token"])

    def issue(grant: dict, refresh: bool, refresh_token: str = ""):
        lifetime = state["token_lifetime"]
        access = secrets.token_urlsafe(32)
        with lock:
            state["access"][access] = grant | {"exp": time.time() + lifetime}
        body = {"access_token": access, "token_type": "Bearer", "expires_in": lifetime, "scope": grant["scope"]}
        if refresh:
            refresh_token = refresh_token or secrets.token_urlsafe(32)
            state["refresh"][refresh_token] = grant
            body["refresh_token"] = refresh_token
        if grant["kind"] == "user":
            body.update({k: grant[k] for k in ("patient", "encounter", "need_patient_banner", "smart_style_url")
                         if grant.get(k) is not None})
            if "openid" in grant["scope"].split():
                body["id_token"] = id_token(grant)
        return jsonify(body)

    def id_token(grant: dict) -> str:
        now = int(time.time())
        claims = {"iss": base(), "sub": "ehr-clinician", "aud": app.config.get("ID_TOKEN_AUD") or client_id,
                  "iat": now, "exp": now + app.config.get("ID_TOKEN_LIFETIME", 300),
                  "nonce": app.config.get("ID_TOKEN_NONCE") or grant.get("nonce"),
                  "fhirUser": f"{base()}/{grant.get('clinician') or CLINICIAN}"}
        return jwt.encode({"alg": "RS256", "kid": signing.kid}, claims, signing, algorithms=["RS256"])

    @app.post("/_test/id-token")
    def id_token_mode():
        """Make the next id_tokens wrong: another aud, another nonce or already expired."""
        body = request.get_json(force=True)
        app.config["ID_TOKEN_AUD"] = body.get("aud")
        app.config["ID_TOKEN_NONCE"] = body.get("nonce")
        app.config["ID_TOKEN_LIFETIME"] = body.get("lifetime", 300)
        return jsonify(ok=True)

    # --- FHIR -------------------------------------------------------------------------------------
    def take_fault(where: str):
        for fault in state["faults"]:
            if fault.get("where", "fhir") == where and fault["used"] < fault.get("times", 1) and \
                    fault.get("path", "") in request.full_path:
                fault["used"] += 1
                if fault["kind"] in ("429", "503"):
                    return Response('{"resourceType":"OperationOutcome"}', int(fault["kind"]),
                                    {"Retry-After": str(fault.get("retry_after", 1))}, content_type="application/fhir+json")
                if fault["kind"] == "500":
                    return Response('{"resourceType":"OperationOutcome"}', 500, content_type="application/fhir+json")
                if fault["kind"] == "status":
                    return outcome(int(fault["status"]), "forbidden", "the test server refuses this request")
                if fault["kind"] == "after-store":
                    # The server does the work, then the answer is lost: a gateway's 504, or an
                    # answer slower than the client waits for (a read timeout).
                    forward()
                    time.sleep(float(fault.get("delay", 0)))
                    return outcome(int(fault.get("status", 504)), "timeout", "the gateway gave up waiting")
                if fault["kind"] == "truncate":
                    body = forward().get_data()
                    return Response(body[: len(body) // 2], 200, content_type="application/fhir+json")
        return None

    def bearer() -> dict:
        header = request.headers.get("Authorization", "")
        grant = state["access"].get(header[7:]) if header.startswith("Bearer ") else None
        if grant is None or grant["exp"] < time.time():
            abort(Response('{"resourceType":"OperationOutcome","issue":[{"severity":"error","code":"login"}]}', 401,
                           {"WWW-Authenticate": 'Bearer error="invalid_token"'}, content_type="application/fhir+json"))
        return grant

    def confine(grant: dict, path: str) -> None:
        """A patient token reads only its patient's compartment."""
        if grant["kind"] != "user":
            return
        patient = grant["patient"]
        if request.method == "POST":
            scopes = grant["scope"].split()
            body = request.get_json(force=True, silent=True) or {}
            allowed = {"patient/DocumentReference.c", "patient/DocumentReference.write"} & set(scopes)
            if path != "DocumentReference" or not allowed or (body.get("subject") or {}).get("reference") != f"Patient/{patient}":
                abort(403)
            return
        asked = request.args.get("patient") or request.args.get("subject", "").replace("Patient/", "")
        first = path.split("/")
        if first[0] == "Patient" and len(first) > 1 and first[1] != patient:
            abort(403)
        if first[0] not in ("Patient", "Binary", "Medication", "Practitioner", "Organization", "Location", "metadata") \
                and len(first) == 1 and asked != patient:
            abort(403)

    def without_unsupported(response: Response) -> Response:
        gone = state.get("unsupported")
        if not gone or response.status_code != 200:
            return response
        statement = json.loads(response.get_data())
        for rest in statement.get("rest") or []:
            rest["resource"] = [r for r in rest.get("resource") or [] if r.get("type") not in gone]
        response.set_data(json.dumps(statement))
        return response

    def forward() -> Response:
        path = request.path[len("/fhir/"):]
        headers = {k: v for k, v in request.headers if k.lower() in ("accept", "prefer", "content-type", "if-none-exist")}
        try:
            response = requests.request(request.method, f"{upstream}/{path}", params=list(request.args.items(multi=True)),
                                        headers=headers, data=request.get_data(), timeout=60)
        except requests.ConnectionError:
            return Response("", 502)      # a gateway whose FHIR server is down
        body = response.content.replace(upstream.encode(), base().encode())
        out = Response(body, response.status_code, content_type=response.headers.get("Content-Type"))
        for name in ("Content-Location", "X-Progress", "Retry-After", "Date", "ETag", "Last-Modified"):
            if name in response.headers:
                out.headers[name] = response.headers[name].replace(upstream, base())
        return out

    @app.route("/fhir/<path:path>", methods=["GET", "POST", "DELETE"])
    def fhir(path):
        # How many FHIR requests were being answered when this one arrived (itself included): a
        # client's concurrency as the server sees it.
        with lock:
            state["in_flight"] = state.get("in_flight", 0) + 1
            in_flight = state["in_flight"]
        try:
            state["log"].append({"method": request.method, "path": request.path,
                                 "args": request.args.to_dict(flat=False), "accept": request.headers.get("Accept", ""),
                                 "auth": bool(request.headers.get("Authorization")),
                                 "range": request.headers.get("Range", ""), "at": time.time(), "in_flight": in_flight})
            return answer_fhir(path)
        finally:
            with lock:
                state["in_flight"] -= 1

    def answer_fhir(path):
        if path == "metadata":
            return without_unsupported(forward())
        if path.split("/")[0] in state.get("unsupported", ()):
            return jsonify(resourceType="OperationOutcome", issue=[{"severity": "error", "code": "not-supported",
                                                                    "diagnostics": "Unknown resource type"}]), 404
        # The token is checked as the request arrives, as an EHR does; the latency is its time to answer.
        grant = bearer()
        time.sleep(state.get("latency", 0.0))
        fault = take_fault("fhir")
        if fault:
            return fault
        confine(grant, path)
        if "$export" in path:
            if grant["kind"] != "system":
                abort(403)
            return kickoff()
        if path.startswith("bulk-status/"):
            return bulk_status(path)
        if path.startswith("bulk-files/"):
            return bulk_file(path)
        if path.startswith("Binary/"):
            return binary(path)
        if path == "Group" and "_id" in request.args:
            # As the SMART reference Bulk Data server: `_id` is ignored and every Group answers.
            request.args = request.args.copy()
            request.args.poplist("_id")
        if path.startswith("Group/") and "$export" not in path and (state.get("bulk") or {}).get("members"):
            return members_as(forward(), state["bulk"]["members"])
        return forward()

    def members_as(response: Response, form: str) -> Response:
        """A Group read with its members' references written in another form."""
        if response.status_code != 200:
            return response
        group = json.loads(response.get_data())
        for member in group.get("member") or []:
            pid = member["entity"]["reference"].split("/")[-1]
            if form == "urn":
                member["entity"] = {"reference": f"urn:uuid:{pid}"}
            elif form == "absolute":
                member["entity"] = {"reference": f"{base()}/Patient/{pid}/_history/1"}
            elif form == "identifier":
                patient = requests.get(f"{upstream}/Patient/{pid}", timeout=30).json()
                identifier = next(i for i in patient.get("identifier") or [] if i.get("value"))
                member["entity"] = {"identifier": {"system": identifier.get("system"), "value": identifier["value"]}}
        response.set_data(json.dumps(group))
        return response

    def binary(path: str) -> Response:
        """Strict, like the reference SMART server: a Binary is served only as FHIR JSON; an Accept
        that does not allow application/fhir+json (or */*) gets 406 Not Acceptable."""
        accepted = [part.split(";")[0].strip() for part in request.headers.get("Accept", "*/*").split(",")]
        if not {"application/fhir+json", "application/json", "*/*"} & set(accepted):
            return Response("", 406)
        if state.get("binary_exact") and request.headers.get("Accept") != "application/fhir+json":
            return Response("", 406)      # servers that compare Accept literally
        resource = requests.get(f"{upstream}/{path}", headers={"Accept": "application/fhir+json"}, timeout=30)
        return Response(resource.content, resource.status_code, content_type="application/fhir+json")

    def outcome(status: int, code: str, diagnostics: str) -> Response:
        body = {"resourceType": "OperationOutcome", "issue": [{"severity": "error", "code": code,
                                                               "diagnostics": diagnostics}]}
        return Response(json.dumps(body), status, content_type="application/fhir+json")

    def kickoff() -> Response:
        """The export kick-off, forwarded to sekmet: a type this server does not have is refused as
        the reference server refuses it; a Group it does not have exports nothing when told to
        behave like the reference server; the kick-off's time starts the export's `delay`."""
        if state.get("ignore_since"):
            request.args = request.args.copy()
            request.args.poplist("_since")     # like an EHR whose export is never incremental
        asked = [t for value in request.args.getlist("_type") for t in value.split(",") if t]
        gone = [t for t in asked if t in (state.get("unsupported") or set())]
        if gone:
            return outcome(400, "not-supported", f"Resource type(s) {', '.join(gone)} not supported by this server")
        response = forward()
        bulk = state.get("bulk") or {}
        if response.status_code == 404 and bulk.get("unknown_groups") == "empty":
            job = "empty-" + secrets.token_hex(6)
            response = Response("", 202, {"Content-Location": f"{base()}/bulk-status/{job}"})
        if response.status_code == 202:
            state.setdefault("kickoffs", {})[response.headers["Content-Location"].rsplit("/", 1)[1]] = time.time()
        return response

    def bulk_status(path: str) -> Response:
        job, bulk = path.split("/")[1], state.get("bulk") or {}
        started = state.get("kickoffs", {}).get(job, 0.0)
        if request.method == "GET" and time.time() - started < float(bulk.get("delay", 0)):
            wait = bulk.get("retry_after", 1)          # None: no Retry-After at all
            return Response("", 202, {"X-Progress": bulk.get("progress", "in progress")}
                            | ({"Retry-After": str(wait)} if wait is not None else {}))
        if job.startswith("empty-"):
            return Response(json.dumps({"transactionTime": datetime.utcnow().isoformat() + "Z", "request": "",
                                        "requiresAccessToken": True, "output": [], "error": []}), 200,
                            content_type="application/json")
        response = forward()
        if request.method != "GET" or response.status_code != 200:
            return response
        manifest = json.loads(response.get_data())
        manifest["requiresAccessToken"] = True
        if bulk.get("transaction_time"):
            manifest["transactionTime"] = bulk["transaction_time"]
        manifest["output"] = split_outputs(manifest.get("output") or [], int(bulk.get("split", 0)))
        fail_outputs(manifest, job, bulk)
        since = parse_qs(urlsplit(manifest.get("request", "")).query).get("_since", [""])[0]
        if not since:
            return Response(json.dumps(manifest), 200, content_type="application/json")
        since_ts = datetime.fromisoformat(since.replace("Z", "+00:00")).timestamp()
        gone = [ref for ref, when in state["deleted"] if when >= since_ts]
        if gone:
            app.config.setdefault("DELETED_FILES", {})[job] = gone
            manifest["deleted"] = [{"type": "Bundle", "url": f"{root()}/bulk-deleted/{job}.ndjson"}]
        return Response(json.dumps(manifest), 200, content_type="application/json")

    def split_outputs(outputs: list[dict], lines: int) -> list[dict]:
        """Each type's file as several of `lines` lines each, as large exports come."""
        if not lines:
            return outputs
        split = []
        for output in outputs:
            for part in range(max(1, -(-int(output.get("count", 1)) // lines))):
                split.append(output | {"url": f"{output['url']}?part={part}&lines={lines}",
                                       "count": min(lines, int(output.get("count", 1)) - part * lines)})
        return split

    def fail_outputs(manifest: dict, job: str, bulk: dict) -> None:
        """Files the export could not generate, listed under `error` instead of `output` (the
        reference server's some_file_generation_failed)."""
        kept, every, types = [], int(bulk.get("fail_every", 0)), set(bulk.get("fail_types") or [])
        for n, output in enumerate(manifest["output"]):
            if output.get("type") in types or (every and n % every == every - 1):
                name = f"{n + 1}.{output.get('type')}.ndjson"
                app.config.setdefault("ERROR_FILES", {})[f"{job}-{n}"] = f"Failed to export {name}"
                manifest.setdefault("error", []).append({"type": "OperationOutcome",
                                                         "url": f"{root()}/bulk-error/{job}-{n}.ndjson"})
            else:
                kept.append(output)
        manifest["output"] = kept

    @app.get("/bulk-error/<name>.ndjson")
    def error_file(name):
        bearer()
        words = app.config.get("ERROR_FILES", {}).get(name, "Failed to export a file")
        body = {"resourceType": "OperationOutcome", "issue": [{"severity": "error", "code": "exception",
                                                               "diagnostics": words}]}
        return Response(json.dumps(body) + "\n", 200, content_type="application/fhir+ndjson")

    def bulk_file(path: str) -> Response:
        """An output file: a part of it when split, its resources backdated when asked, resumed
        from a Range, or cut off in the middle to test resuming."""
        time.sleep(float((state.get("bulk") or {}).get("file_delay", 0)))
        upstream_file = requests.get(f"{upstream}/{path}", headers={"Accept": "application/fhir+ndjson"}, timeout=300)
        if upstream_file.status_code != 200:
            return Response(upstream_file.content, upstream_file.status_code, content_type="application/fhir+json")
        bulk, lines = state.get("bulk") or {}, upstream_file.content.splitlines(keepends=True)
        if request.args.get("lines"):
            size, part = int(request.args["lines"]), int(request.args.get("part", 0))
            lines = lines[part * size:(part + 1) * size]
        if bulk.get("backdate"):
            only = set(bulk.get("backdate_only") or [])
            lines = [backdated(line, bulk["backdate"]) if not only or resource_ref(line) in only else line
                     for line in lines]
        if bulk.get("regenerate") and bulk["regenerate"] in request.path and state.get("bulk_cut", 0):
            lines = [line if line.endswith(b"\n") else line + b"\n" for line in reversed(lines)]
        if bulk.get("broken_line") and bulk["broken_line"] in request.path and lines:
            lines[0] = lines[0][: len(lines[0]) // 2] + b"\n"
        body = b"".join(lines)
        # A strong validator of this body, as servers give one, unless told to give none.
        validators = {} if bulk.get("no_validators") else {"ETag": f'"{hashlib.sha256(body).hexdigest()[:16]}"'}
        wanted = request.headers.get("Range", "")
        if_range = request.headers.get("If-Range")
        unchanged = if_range is None or if_range == validators.get("ETag")
        if wanted.startswith("bytes=") and not bulk.get("no_range") and unchanged:
            start = int(wanted[6:].split("-")[0])
            return Response(body[start:], 206, {"Content-Range": f"bytes {start}-{len(body) - 1}/{len(body)}"}
                            | validators, content_type="application/fhir+ndjson")
        if bulk.get("cut") and bulk["cut"] in request.full_path and state.get("bulk_cut", 0) < bulk.get("times", 1):
            state["bulk_cut"] = state.get("bulk_cut", 0) + 1
            return cut_off(body, validators)
        return Response(body, 200, validators, content_type="application/fhir+ndjson")

    def resource_ref(line: bytes) -> str:
        resource = json.loads(line)
        return f"{resource.get('resourceType')}/{resource.get('id')}"

    def backdated(line: bytes, when: str) -> bytes:
        resource = json.loads(line)
        resource.setdefault("meta", {})["lastUpdated"] = when
        return json.dumps(resource).encode() + b"\n"

    def cut_off(body: bytes, validators: dict) -> Response:
        """Half the file, then the connection dropped: the declared length is never reached."""
        def stream():
            yield body[: len(body) // 2]
            raise ConnectionAbortedError("the test server drops the connection mid-file")

        return Response(stream(), 200, {"Content-Length": str(len(body))} | validators,
                        content_type="application/fhir+ndjson")

    @app.get("/bulk-deleted/<job>.ndjson")
    def deleted_file(job):
        bearer()
        gone = app.config.get("DELETED_FILES", {}).get(job, [])
        bundle = {"resourceType": "Bundle", "type": "transaction",
                  "entry": [{"request": {"method": "DELETE", "url": ref}} for ref in gone]}
        return Response(json.dumps(bundle) + "\n", 200, content_type="application/fhir+ndjson")

    @app.get("/ehr")
    def ehr_page():
        """The EHR's chart for a patient: chartcite embedded in an iframe, launched with context."""
        patient = request.args["patient"]
        launch_id = secrets.token_urlsafe(12)
        state["launches"][launch_id] = {"patient": patient, "need_patient_banner": False,
                                        "smart_style_url": root() + "/style.json"}
        chartcite = app.config["CHARTCITE_URL"].rstrip("/")
        # The iss is the FHIR base chartcite registered (this server binds 127.0.0.1), also when
        # the chart page itself is opened by another name (localhost: same-site with chartcite).
        iss = f"http://127.0.0.1:{request.host.rsplit(':', 1)[1]}/fhir"
        src = f"{chartcite}/launch?{urlencode({'iss': iss, 'launch': launch_id})}"
        return (f"<!doctype html><title>EHR chart</title><h1>EHR chart · patient banner</h1>"
                f"<iframe id='app' src='{src}' width='1100' height='800'></iframe>")

    app.config["STANDALONE_PATIENT"] = ""
    app.config["CHARTCITE_URL"] = redirect_prefix
    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True)
    parser.add_argument("--client-id", required=True)
    parser.add_argument("--redirect-prefix", required=True, help="chartcite's origin; redirect URIs must start with it")
    parser.add_argument("--client-jwks-url", default="")
    parser.add_argument("--standalone-patient", default="")
    args = parser.parse_args()
    app = create_server(args.upstream, args.client_id, args.redirect_prefix, args.client_jwks_url)
    app.config["STANDALONE_PATIENT"] = args.standalone_patient
    from werkzeug.serving import run_simple

    run_simple("127.0.0.1", args.port, app, threaded=True)


if __name__ == "__main__":
    main()
