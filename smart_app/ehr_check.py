"""`chartcite ehr check NAME`: is this EHR registration ready for launches and background sync?

Each check says what it found and, when it fails, what to fix. The checks read the EHR's public
discovery documents, probe the token endpoint with a made-up authorization code (which tells a
wrong client id, secret or key apart from a right one, where the EHR keeps a client registry: the
same probe with deliberately wrong credentials shows whether it does; skipped for a registration
without launches), sign in as chartcite's Backend Services client asking for what a Bulk round asks for,
and read the registered Group (it must exist and have members); they read no patient's record and
print no patient data.
"""
from __future__ import annotations

import secrets
from dataclasses import asdict, dataclass
from typing import Callable

import requests

from fhir_ingest.connection.bulk import GroupMembers, bulk_types, read_group_members
from fhir_ingest.connection.client import FhirError
from fhir_ingest.connection.client_auth import ClientAuthError, ClientSecretBasic, client_auth_for
from fhir_ingest.record.kinds import PATIENT_SEARCHES
from fhir_ingest.connection.registry import Ehr, Registry
from fhir_ingest.connection.smart_auth import BackendServicesToken, BackendSignInRefused, forget_discovery

from .terminal import shown

TIMEOUT = 10


@dataclass
class Check:
    name: str
    status: str          # ok | fail | warn | skip
    detail: str
    fix: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


def ok(name: str, detail: str) -> Check:
    return Check(name, "ok", detail)


def fail(name: str, detail: str, fix: str) -> Check:
    return Check(name, "fail", detail, fix)


class EhrChecker:
    def __init__(self, registry: Registry, ehr: Ehr, public_url: str, fhir_client_for: Callable):
        self.registry, self.ehr, self.public_url = registry, ehr, public_url.rstrip("/")
        self.fhir_client_for = fhir_client_for
        self.config: dict = {}
        self.statement: dict = {}
        self.token: str = ""
        self.auth = None

    def run(self) -> list[Check]:
        forget_discovery()          # what the EHR publishes now, not what this process cached
        checks = [self.discovery()]
        if checks[0].status == "ok":
            checks += [self.capabilities(), self.fhir_metadata()]
        checks.append(self.published_keys())
        if self.ehr.backend_only:
            checks.append(Check("client", "skip", "a registration for background sync only: no clinician signs in "
                                              "through it (the backend sign-in below proves its credentials)"))
        elif checks[0].status == "ok":
            checks.append(self.client_credentials())
        checks.append(self.backend_token())
        checks.append(self.group())
        return checks

    def discovery(self) -> Check:
        url = f"{self.ehr.iss}/.well-known/smart-configuration"
        try:
            response = requests.get(url, headers={"Accept": "application/json"}, timeout=TIMEOUT)
            response.raise_for_status()
            self.config = response.json()
        except (requests.RequestException, ValueError) as exc:
            return fail("discovery", f"{url} could not be read ({type(exc).__name__})",
                        "check --iss is the EHR's FHIR base URL and that this host can reach it (proxy, firewall)")
        # A server for Backend Services only (a Bulk Data server) has no authorization endpoint:
        # a registration without launches does not need one.
        needed = ("token_endpoint",) if self.ehr.backend_only else ("authorization_endpoint", "token_endpoint")
        missing = [k for k in needed if not self.config.get(k)]
        if missing:
            return fail("discovery", f"the SMART configuration lacks {', '.join(missing)}",
                        "the EHR's SMART configuration is incomplete: ask the EHR vendor" if self.ehr.backend_only else
                        "the EHR offers no clinician sign-in here; a registration for background sync only needs "
                        "none (`chartcite ehr update NAME --backend-only`), otherwise ask the EHR vendor")
        return ok("discovery", f"token endpoint {self.config['token_endpoint']}")

    def capabilities(self) -> Check:
        if self.ehr.backend_only:
            return self.backend_capabilities()
        declared = set(self.config.get("capabilities") or [])
        needed = {"launch-ehr", "context-ehr-patient", client_auth_for(self.registry, self.ehr).capability,
                  f"permission-{self.ehr.scopes}"}
        scopes = (self.ehr.request_scopes or "").split()
        if "offline_access" in scopes:
            needed.add("permission-offline")
        if "openid" in scopes:
            needed.add("sso-openid-connect")
        missing = sorted(needed - declared)
        methods = self.config.get("token_endpoint_auth_methods_supported")
        method = client_auth_for(self.registry, self.ehr).method
        # A public client authenticates with nothing, and many servers (the SMART reference
        # launcher among them) leave "none" out of that list while public launches work.
        unlisted_public = bool(methods) and method == "none" and "none" not in methods
        if methods and method not in methods and not unlisted_public:
            missing.append(f"token_endpoint_auth_methods_supported: {method}")
        if "S256" not in (self.config.get("code_challenge_methods_supported") or ["S256"]):
            missing.append("code_challenge_methods_supported: S256")
        if missing:
            return fail("capabilities", f"not declared: {', '.join(missing)}",
                        "register the client type and scopes the EHR offers (`chartcite ehr update` --client-auth, "
                        "--scopes v1|v2, --request-scopes) or ask the EHR to enable them")
        if unlisted_public:
            return Check("capabilities", "warn", f"{len(needed)} needed capabilities declared; "
                         "token_endpoint_auth_methods_supported does not list \"none\" (public clients), which "
                         "many EHRs leave out while public launches work", "the first launch will tell")
        return ok("capabilities", f"{len(needed)} needed capabilities declared")

    def fhir_metadata(self) -> Check:
        try:
            response = requests.get(f"{self.ehr.iss}/metadata", headers={"Accept": "application/fhir+json"},
                                    timeout=TIMEOUT)
            response.raise_for_status()
            statement = self.statement = response.json()
        except (requests.RequestException, ValueError) as exc:
            return fail("fhir", f"the CapabilityStatement could not be read ({type(exc).__name__})",
                        "check the iss is a FHIR R4 base URL")
        version = str(statement.get("fhirVersion", ""))
        offered = {r.get("type") for rest in statement.get("rest") or [] for r in rest.get("resource") or []}
        missing = sorted(set(PATIENT_SEARCHES) - offered) if offered else []
        if not version.startswith("4."):
            return fail("fhir", f"FHIR version {version or 'unknown'}", "chartcite reads FHIR R4 (4.0.1) endpoints")
        if missing:
            return Check("fhir", "warn", f"R4; not offered: {', '.join(missing)} (those parts of the record stay "
                         "unindexed)", "ask the EHR to expose them to this app, if it can")
        return ok("fhir", f"FHIR {version}; every resource type chartcite reads is offered")

    def published_keys(self) -> Check:
        if (self.ehr.client_auth or "private_key_jwt") != "private_key_jwt":
            return Check("jwks", "skip", f"a {self.ehr.client_auth} client signs nothing")
        current = [k["kid"] for k in self.registry.published_keys()]
        if not current:
            return fail("jwks", "chartcite has no signing key", "run `chartcite keys generate`")
        url = f"{self.public_url}/.well-known/jwks.json"
        try:
            served = {k.get("kid") for k in requests.get(url, timeout=TIMEOUT).json().get("keys", [])}
        except (requests.RequestException, ValueError, AttributeError) as exc:
            return fail("jwks", f"{url} could not be read ({type(exc).__name__})",
                        "set CHARTCITE_PUBLIC_URL to the address EHRs reach chartcite at, and check the TLS proxy "
                        "forwards /.well-known/jwks.json")
        if not set(current) <= served:
            return fail("jwks", f"{url} does not serve the current keys",
                        "the address serves another chartcite or an old copy: check CHARTCITE_PUBLIC_URL and caches")
        return ok("jwks", f"{len(current)} keys published at {url}")

    def client_credentials(self) -> Check:
        """Does the token endpoint accept chartcite as this client? A made-up authorization code
        earns `invalid_grant` from an EHR that authenticated the client first, and
        `invalid_client` from one that did not (wrong id, wrong secret, a key it cannot verify).
        Deliberately wrong credentials are probed too: an EHR that answers them exactly as it
        answers chartcite's own cannot tell right from wrong here, and that proves nothing. A
        secret is probed in both encodings and the registration keeps the one the EHR accepts."""
        jwks_url = f"{self.public_url}/.well-known/jwks.json"
        try:
            auth = client_auth_for(self.registry, self.ehr)
            probe = self.probe(auth)
            decoys = [self.probe(decoy) for decoy in auth.decoys()]
        except ClientAuthError as exc:
            return fail("client", str(exc), "see above")
        if all(decoy.same_answer(probe) for decoy in decoys):
            return Check("client", "warn", f"the token endpoint answers chartcite's {auth.method} credentials and "
                         f"deliberately wrong ones alike ({probe.words}): they could not be verified here; the first "
                         "launch will tell", "" if probe.accepted else "if the first launch is refused: "
                         + auth.refusal_hint(jwks_url))
        if isinstance(auth, ClientSecretBasic):
            return self.secret_encoding(auth, probe, jwks_url)
        if probe.refused:
            return fail("client", f"the token endpoint refused chartcite's {auth.method} credentials "
                                  f"({probe.words})", auth.refusal_hint(jwks_url))
        if probe.accepted:
            return ok("client", f"the token endpoint accepts chartcite's {auth.method} credentials "
                                f"(a made-up code earned {probe.words}, as it should)")
        return Check("client", "warn", f"a probe of the token endpoint answered {probe.words}: chartcite's "
                                       "credentials could not be confirmed", "a clinician's first launch will tell")

    def secret_encoding(self, auth: ClientSecretBasic, probe: "Probe", jwks_url: str) -> Check:
        """Which encoding of the secret the EHR accepts, recorded in the registration: RFC 6749's
        form-encoding and the raw secret differ for a secret with characters such as `+ % / =`."""
        other = auth.other_encoding()
        other_probe = self.probe(other) if other else None
        if probe.accepted and other_probe and other_probe.accepted:
            return ok("client", f"the token endpoint accepts chartcite's secret in either encoding; it stays "
                                f"{auth.encoding}-encoded")
        if probe.accepted:
            return ok("client", f"the token endpoint accepts chartcite's client_secret_basic credentials "
                                f"{auth.encoding}-encoded" + (f" and refuses them {other.encoding}-encoded"
                                                              if other_probe else "")
                                + f" (a made-up code earned {probe.words}, as it should)")
        if other_probe and other_probe.accepted:
            self.ehr = self.registry.update_ehr(self.ehr.name, secret_encoding=other.encoding)
            return ok("client", f"the EHR refused the secret {auth.encoding}-encoded and accepts it "
                                f"{other.encoding}: the registration now sends it {other.encoding} "
                                f"(--secret-encoding {other.encoding})")
        if probe.refused and other_probe and not other_probe.refused:
            # Only an answer that authenticated the client proves the other encoding: a 503 or a
            # timeout says nothing about it, and switching on one would break a working registration.
            return Check("client", "warn", f"the EHR refused the secret {auth.encoding}-encoded ({probe.words}); "
                         f"{other.encoding}-encoded could not be verified ({other_probe.words}), so the registration "
                         "is unchanged", "run `chartcite ehr check` again when the EHR answers")
        if probe.refused:
            return fail("client", f"the token endpoint refused chartcite's client_secret_basic credentials in "
                                  f"{'either encoding' if other_probe else 'its encoding'} ({probe.words})",
                        auth.refusal_hint(jwks_url))
        return Check("client", "warn", f"a probe of the token endpoint answered {probe.words}: chartcite's "
                                       "credentials could not be confirmed", "a clinician's first launch will tell")

    def probe(self, auth) -> "Probe":
        form = {"grant_type": "authorization_code", "code": "chartcite-ehr-check-" + secrets.token_urlsafe(16),
                "redirect_uri": f"{self.public_url}/callback", "code_verifier": secrets.token_urlsafe(48)}
        fields, headers = auth.credentials(self.config["token_endpoint"])
        try:
            response = requests.post(self.config["token_endpoint"], data=form | fields, headers=headers,
                                     timeout=TIMEOUT)
        except requests.RequestException as exc:
            return Probe(None, "", f"no answer ({type(exc).__name__})")
        try:
            body = response.json()
        except ValueError:
            body = {}
        body = body if isinstance(body, dict) else {}
        error, description = str(body.get("error") or ""), str(body.get("error_description") or "")[:200]
        return Probe(response.status_code, error,
                     f"HTTP {response.status_code} {error}" + (f": {description}" if description else ""))

    def backend_capabilities(self) -> Check:
        """A registration for background sync only needs its sign-in method, where the server lists them."""
        auth = client_auth_for(self.registry, self.ehr, backend=True)
        methods = self.config.get("token_endpoint_auth_methods_supported")
        if methods and auth.method not in methods:
            return fail("capabilities", f"not declared: token_endpoint_auth_methods_supported: {auth.method}",
                        "register the client type the EHR offers (`chartcite ehr update NAME --client-auth`, or a "
                        "--backend-client-secret-env for a system account that signs in with a secret)")
        return ok("capabilities", f"Backend Services sign-in by {auth.method}" + (" declared" if methods else ""))

    def backend_token(self) -> Check:
        """Chartcite's Backend Services sign-in, asking for exactly what a Bulk round will ask for."""
        if "token_endpoint" not in self.config:
            return fail("backend", "no token endpoint to ask", "fix discovery first")
        types, _ = bulk_types(self.statement, self.ehr.bulk_types)
        if self.ehr.group_id:
            types = types + ["Group"]
        self.auth = BackendServicesToken(self.registry, self.ehr, types)
        try:
            self.token = self.auth.refresh()
        except BackendSignInRefused as exc:
            switched = self.backend_token_in_the_other_encoding(types)
            if switched:
                return switched
            return fail("backend", f"no Backend Services token: {exc}", exc.fix.replace("NAME", self.ehr.name))
        except Exception as exc:   # every refusal is a finding to print, not a crash
            return fail("backend", f"no Backend Services token: {exc}",
                        "register chartcite's JWKS URL and system scopes (`chartcite registration-info`) for this "
                        "client id in the EHR's console")
        client = self.ehr.backend_client_id or self.ehr.client_id
        return ok("backend", f"Backend Services token granted to {client} for {len(types)} types")

    def backend_token_in_the_other_encoding(self, types: list[str]) -> Check | None:
        """A client secret refused in one encoding at the Backend Services sign-in, accepted in the
        other: a sign-in that authenticates the client for real, so the registration keeps that one."""
        auth = client_auth_for(self.registry, self.ehr, backend=True)
        other = auth.other_encoding() if isinstance(auth, ClientSecretBasic) else None
        if other is None:
            return None
        trial = BackendServicesToken(self.registry, self.registry.update_ehr(self.ehr.name, secret_encoding=other.encoding),
                                     types)
        try:
            self.token = trial.refresh()
        except Exception:
            self.ehr = self.registry.update_ehr(self.ehr.name, secret_encoding=auth.encoding)
            return None
        self.auth, self.ehr = trial, self.registry.ehr(self.ehr.name)
        client = self.ehr.backend_client_id or self.ehr.client_id
        return ok("backend", f"Backend Services token granted to {client} for {len(types)} types with the secret "
                             f"{other.encoding}-encoded (refused {auth.encoding}-encoded): the registration now sends it "
                             f"{other.encoding} (--secret-encoding {other.encoding})")

    def group(self) -> Check:
        """The registered Bulk Data group exists and has members: a round of a Group that does not
        exist is an error, and one of an empty Group indexes nobody."""
        if not self.ehr.group_id:
            return Check("group", "warn", "no Bulk Data group registered: background sync (`chartcite sync`, "
                                          "`chartcite beat`) does not run for this registration",
                         "register the group the EHR defines for chartcite: `chartcite ehr update NAME --group-id ID`")
        if not self.token:
            return Check("group", "skip", "needs a Backend Services token")
        # Read by its id, not searched: a server may ignore `_id` in a search and answer every Group.
        client = self.fhir_client_for(self.ehr, self.auth)
        try:
            group = client.get_json(f"Group/{self.ehr.group_id}")
            members = read_group_members(client, group)
        except Exception as exc:   # every failure is a finding to print, not a crash
            if isinstance(exc, FhirError) and exc.status in (404, 410):
                return fail("group", f"the EHR has no Group {self.ehr.group_id}",
                            "check --group-id against the EHR's Bulk Data group (`chartcite ehr update NAME --group-id`)")
            return fail("group", f"reading the registered Group {self.ehr.group_id} failed: {exc}",
                        "check the --group-id and that the system scopes let chartcite read Group")
        if group.get("resourceType") != "Group" or group.get("id") != self.ehr.group_id:
            return fail("group", f"the EHR answered Group/{self.ehr.group_id} with another resource "
                                 f"({group.get('resourceType')}/{group.get('id')})",
                        "check --group-id against the EHR's Bulk Data group (`chartcite ehr update NAME --group-id`)")
        quantity = group.get("quantity") if isinstance(group.get("quantity"), int) else 0
        return group_members_check(self.ehr.group_id, members, quantity)


def group_members_check(group_id: str, members: GroupMembers, quantity: int) -> Check:
    """A Group of no one fails; members chartcite cannot read as patients are a warning, named."""
    if not members.patients and not members.unread and not quantity:
        return fail("group", f"the Group {group_id} has no members: a round would index nobody",
                    "ask the EHR's team to add the patients chartcite serves to the Group, or register the "
                    "right one (`chartcite ehr update NAME --group-id`)")
    if members.unread:
        return Check("group", "warn", f"the registered Group was found ({len(members.patients)} members); "
                                      f"{len(members.unread)} member(s) chartcite cannot read as a patient: "
                                      + "; ".join(members.unread[:5]),
                     "ask the EHR's team to list each member as a Patient reference or an identifier the EHR's "
                     "patients carry; deletions of these members' records are not applied meanwhile")
    count = len(members.patients) or quantity
    return ok("group", f"the registered Group was found ({count} members)")


@dataclass
class Probe:
    status: int | None
    error: str
    words: str

    @property
    def refused(self) -> bool:
        return self.error in ("invalid_client", "unauthorized_client") or (self.status == 401 and not self.error)

    @property
    def accepted(self) -> bool:
        return self.error == "invalid_grant"

    def same_answer(self, other: "Probe") -> bool:
        return (self.status, self.error, self.words) == (other.status, other.error, other.words)


def format_checks(checks: list[Check]) -> str:
    marks = {"ok": "ok  ", "fail": "FAIL", "warn": "warn", "skip": "skip"}
    lines = []
    for check in checks:
        lines.append(f"[{marks[check.status]}] {check.name:13} {shown(check.detail)}")
        if check.fix:
            lines.append(f"       {'':13} fix: {shown(check.fix)}")
    return "\n".join(lines)
