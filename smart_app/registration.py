"""What hospital IT types into the Epic / Oracle Health app registration consoles."""
from __future__ import annotations

from fhir_ingest.connection.smart_auth import launch_scopes, system_scopes, write_scope

CAPABILITIES = [
    "launch-ehr", "launch-standalone", "client-confidential-asymmetric", "client-confidential-symmetric",
    "client-public",
    "context-ehr-patient", "context-standalone-patient", "context-banner", "context-style",
    "sso-openid-connect", "permission-offline", "permission-patient", "permission-v1", "permission-v2",
    "authorize-post",
]


def registration_info(public_url: str, registry) -> dict:
    base = public_url.rstrip("/")
    return {
        "launch_url": f"{base}/launch",
        "redirect_uris": [f"{base}/callback"],
        "jwks_url": f"{base}/.well-known/jwks.json",
        "token_endpoint_auth": "per registration (`ehr add --client-auth`): private_key_jwt (RS384 or ES384, "
                               "JWKS URL below), client_secret_basic (the console's client secret) or none (public)",
        "scopes": {
            "ehr_launch_v2": launch_scopes("v2", standalone=False),
            "ehr_launch_v1": launch_scopes("v1", standalone=False),
            "standalone_launch_v2": launch_scopes("v2", standalone=True),
            "standalone_launch_v1": launch_scopes("v1", standalone=True),
            "write_back_extra_v2": write_scope("v2") + "  (only with `ehr add --write-back`)",
            "write_back_extra_v1": write_scope("v1") + "  (only with `ehr add --write-back`)",
            "backend_services_v2": system_scopes("v2"),
            "backend_services_v1": system_scopes("v1"),
        },
        "smart_capabilities_used": CAPABILITIES,
        "signing_keys": [{"kid": k["kid"], "alg": k["alg"], "retiring": bool(k["retire_after"])} for k in registry.key_rows()],
        "frame_origins": registry.frame_origins(),
        "ehrs": [e.to_dict() for e in registry.ehrs()],
    }


def format_info(info: dict) -> str:
    lines = ["Register chartcite with your EHR (Epic App Orchard / Oracle Health code console):", "",
             f"  Launch URL        {info['launch_url']}",
             f"  Redirect URI      {info['redirect_uris'][0]}",
             f"  JWKS URL          {info['jwks_url']}",
             f"  Client auth       {info['token_endpoint_auth']}", "", "  Scopes:"]
    for name, scopes in info["scopes"].items():
        lines.append(f"    {name}:")
        lines.append(f"      {scopes}")
    lines += ["", "  SMART capabilities used: " + ", ".join(info["smart_capabilities_used"]), ""]
    keys = info["signing_keys"]
    lines.append("  Signing keys: " + (", ".join(f"{k['alg']} {k['kid'][:12]}…{' (retiring)' if k['retiring'] else ''}"
                                                 for k in keys) or "none yet: run `chartcite keys generate`"))
    lines.append("  Registered EHRs: " + (", ".join(f"{e['name']} ({e['iss']})" for e in info["ehrs"]) or "none"))
    return "\n".join(lines)
