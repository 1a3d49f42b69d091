"""Web origins (scheme, host, optional port), as the CSP `frame-ancestors` directive receives them.

An origin is written into a security header, so anything else it might carry (a path, a
wildcard, whitespace, a `;` that starts another directive, a quote that makes a keyword) would
change the policy itself. The grammar is checked here, in one place, for `chartcite ehr add
--frame-origin` and for CHARTCITE_FRAME_ANCESTORS alike.
"""
from __future__ import annotations

import ipaddress
import re
from urllib.parse import urlsplit

# One DNS label: letters, digits and inner hyphens (RFC 1123).
_LABEL = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?")
_PRINTABLE_ASCII = re.compile(r"[!-~]+")
_NEVER_IN_AN_ORIGIN = set("*;,'\"`\\<>{}|^ ")


class OriginError(ValueError):
    pass


def normalised_origin(text: str) -> str:
    """`https://ehr.example.org[:port]` in lower case, or OriginError with a sentence naming the
    value and what is wrong with it."""
    problem = _origin_problem(text)
    if problem:
        raise OriginError(f"{text!r} is not an origin like https://ehr.example.org: {problem}")
    parts = urlsplit(text)
    port = f":{parts.port}" if parts.port is not None else ""
    return f"{parts.scheme.lower()}://{_host_text(parts.hostname)}{port}"


def is_origin(text: str) -> bool:
    return not _origin_problem(text)


def _origin_problem(text: str) -> str:
    if not isinstance(text, str) or not text:
        return "it is empty"
    if not _PRINTABLE_ASCII.fullmatch(text):
        return "it holds whitespace, control or non-ASCII characters (write a non-ASCII host in its xn-- form)"
    bad = sorted(set(text) & _NEVER_IN_AN_ORIGIN)
    if bad:
        return f"it holds {' '.join(bad)}"
    try:
        parts = urlsplit(text)
    except ValueError:
        return "the host must be a DNS name or an IP address"
    if parts.scheme.lower() not in ("http", "https") or not text.lower().startswith(f"{parts.scheme.lower()}://"):
        return "the scheme must be https:// (or http://)"
    if "@" in parts.netloc:
        return "an origin has no user name or password"
    if parts.path not in ("", "/") or "?" in text or "#" in text:
        return "an origin has no path, query or fragment"
    try:
        port = parts.port
    except ValueError:
        return "the port must be a number from 1 to 65535"
    if port == 0:
        return "the port must be a number from 1 to 65535"
    if not _valid_host(parts.hostname or ""):
        return "the host must be a DNS name or an IP address"
    return ""


def _valid_host(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        pass
    labels = host.split(".")
    return 0 < len(host) <= 253 and all(_LABEL.fullmatch(label) for label in labels)


def _host_text(host: str) -> str:
    """An IPv6 address goes back into its brackets."""
    return f"[{host}]" if ":" in host else host
