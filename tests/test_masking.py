"""What `chartcite config` (and `chartcite status`) show of settings URLs: no credential survives,
whatever characters it holds or whatever its query parameter is called. A generated battery of
URLs, plus the cases a security review found."""
from __future__ import annotations

from urllib.parse import quote

import pytest
from hypothesis import assume, given, settings as hsettings, strategies as st

from smart_app.settings import Settings, mask_url_password, mask_urls, split_urls

# Anything a password may hold, '*' aside (the mask itself is made of it).
SECRET_CHARS = st.characters(min_codepoint=33, max_codepoint=0x2FF, exclude_characters="*")
SECRETS = st.text(SECRET_CHARS, min_size=4, max_size=24)
LABELS = st.from_regex(r"[a-z][a-z0-9-]{0,8}[a-z0-9]", fullmatch=True)
HOSTS = st.one_of(st.lists(LABELS, min_size=1, max_size=3).map(".".join), st.just("127.0.0.1"), st.just("[::1]"))
PORTS = st.one_of(st.just(""), st.integers(1, 65535).map(lambda p: f":{p}"))
PATHS = st.sampled_from(["", "/", "/0", "/v1", "/audit", "/api/FHIR/R4"])
PLAIN_QUERIES = st.sampled_from(["", "?ssl=true", "?sslmode=require&connect_timeout=5", "#top"])
SCHEMES = st.sampled_from(["https", "http", "redis", "rediss", "postgresql+psycopg", "sqla+redis"])
CREDENTIAL_NAMES = ["client_secret", "auth", "code", "X-Amz-Signature", "X-Amz-Credential", "X-Amz-Security-Token",
                    "sslpassword", "password", "PASSWD", "pwd", "api_key", "apiKey", "api-key", "access_token",
                    "refresh_token", "id_token", "token", "secret", "sig", "signature", "Authorization",
                    "private_key", "session_id", "client%5Fsecret", "sslkey_password", "key"]


def leaked(secret: str, masked: str) -> bool:
    return secret in masked or quote(secret, safe="") in masked


@hsettings(max_examples=400, deadline=None)
@given(scheme=SCHEMES, user=st.from_regex(r"[a-z]{0,8}", fullmatch=True), password=SECRETS, host=HOSTS, port=PORTS,
       path=PATHS, query=PLAIN_QUERIES)
def test_no_password_survives_whatever_it_holds(scheme, user, password, host, port, path, query):
    url = f"{scheme}://{user}:{password}@{host}{port}{path}{query}"
    assume(password not in f"{scheme}://{user}:@{host}{port}{path}{query}****")
    masked = mask_url_password(url)
    assert not leaked(password, masked), (url, masked)
    assert f"{host}{port}{path}" in masked        # the rest of the address is still readable


@hsettings(max_examples=400, deadline=None)
@given(scheme=SCHEMES, host=HOSTS, path=PATHS, before=PLAIN_QUERIES, name=st.sampled_from(CREDENTIAL_NAMES),
       secret=SECRETS, encoded=st.booleans(), in_fragment=st.booleans())
def test_no_credential_parameter_survives(scheme, host, path, before, name, secret, encoded, in_fragment):
    value = quote(secret, safe="") if encoded else secret
    assume(encoded or not set(value) & set("&;="))      # a raw '&' or '=' starts the next parameter
    separator = "#" if in_fragment else ("&" if before.startswith("?") else "?")
    url = f"{scheme}://{host}{path}{before}{separator}{name}={value}&scope=openid"
    assume(secret not in f"{scheme}://{host}{path}{before}{separator}{name}=****&scope=openid")
    masked = mask_url_password(url)
    assert not leaked(secret, masked), (url, masked)
    assert masked.endswith("&scope=openid")       # a parameter after it is still shown


@hsettings(max_examples=200, deadline=None)
@given(nodes=st.lists(st.tuples(HOSTS, PORTS, SECRETS), min_size=1, max_size=3))
def test_several_node_urls_split_by_their_grammar_not_by_every_comma(nodes):
    urls = [f"https://elastic:{password}@{host}{port}" for host, port, password in nodes]
    assume(all("://" not in password for _, _, password in nodes))
    assume(all(password not in f"https://elastic:@{host}{port}****" for host, port, password in nodes))
    value = ",".join(urls)
    assert split_urls(value) == urls           # what the Elasticsearch client is given
    masked = mask_urls(value)
    assert not any(leaked(password, masked) for _, _, password in nodes), (value, masked)


@pytest.mark.parametrize("url,secret,shown", [
    ("https://fhir.example/token?client_secret=s3cret-value&grant_type=x", "s3cret-value",
     "https://fhir.example/token?client_secret=****&grant_type=x"),
    ("https://llm.example/v1?auth=abc123xyz", "abc123xyz", "https://llm.example/v1?auth=****"),
    ("https://app.example/callback?code=one-time-code&state=s", "one-time-code",
     "https://app.example/callback?code=****&state=s"),
    ("https://bucket.s3.example/o?X-Amz-Signature=deadbeef99&X-Amz-Expires=60", "deadbeef99",
     "https://bucket.s3.example/o?X-Amz-Signature=****&X-Amz-Expires=60"),
    ("postgresql+psycopg://audit@db.example/audit?sslpassword=keypass77", "keypass77",
     "postgresql+psycopg://****@db.example/audit?sslpassword=****"),
    ("redis://:pa?ss#w0rd@redis.example:6379/0", "pa?ss#w0rd", "redis://:****@redis.example:6379/0"),
    ("postgresql://audit:p#ss?word@db.example/audit", "p#ss?word", "postgresql://audit:****@db.example/audit"),
    ("https://es:pass,word@n1:9200", "pass,word", "https://es:****@n1:9200"),
])
def test_the_credentials_a_review_found_are_masked(url, secret, shown):
    masked = mask_url_password(url)
    assert secret not in masked and masked == shown


def test_an_elasticsearch_password_with_a_comma_stays_in_its_url():
    value = "https://elastic:pa,ss@n1:9200,https://elastic:pa,ss@n2:9200"
    assert split_urls(value) == ["https://elastic:pa,ss@n1:9200", "https://elastic:pa,ss@n2:9200"]
    settings = Settings.load({"CHARTCITE_ES_URL": value, "CHARTCITE_BACKEND": "elasticsearch"})
    assert settings.search_options()["es"].urls == ("https://elastic:pa,ss@n1:9200", "https://elastic:pa,ss@n2:9200")
    assert settings.masked()["es_url"] == "https://elastic:****@n1:9200,https://elastic:****@n2:9200"
