"""The kinds of client a registration may be and the scopes it may ask for, apart from the
registry's database code: the command line builds its options from these without importing
SQLAlchemy."""
from __future__ import annotations

# How chartcite authenticates at the EHR's token endpoint: a JWT signed with its own key (SMART's
# confidential asymmetric client), a client secret in HTTP Basic (confidential symmetric; Epic and
# Oracle Health both offer it), or nothing (a public client: PKCE only). "" is a registration made
# before client types existed: private_key_jwt when chartcite holds a key, public otherwise.
CLIENT_AUTH_METHODS = ("private_key_jwt", "client_secret_basic", "none")
# The scopes besides resource access that a registration may ask for; which ones an EHR grants is
# its app registration's business, so the set is part of chartcite's registration too.
REQUESTABLE_SCOPES = ("openid", "fhirUser", "profile", "offline_access", "online_access")
DEFAULT_REQUEST_SCOPES = "openid fhirUser offline_access"
