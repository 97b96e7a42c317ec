"""How the dashboard shows an identity without giving away what it must not.

With an ``identity_secret`` the limiter keys identities by their keyed hash,
and the dashboard shows that same hash (``!`` and 32 hex digits, as in the
Redis keys), so a row can be matched with its keys but not traced back to the
client. Without one, an identity is shown as it is, except an API key (the
default identity's ``apikey:<value>``), which is shown by a hash of its value:
the dashboard never serves a raw API key.
"""

from __future__ import annotations

import hashlib
from typing import Optional, Union

from .. import _accel

API_KEY_PREFIX = "apikey:"
"""The default identity's prefix for an API key (integrations/identity.py)."""
API_KEY_SHOWN_DIGITS = 16
MAX_SHOWN_CHARS = 200


def shown_identity(identity: Union[str, bytes], secret: Optional[bytes]) -> str:
    """The identity as the dashboard serves it (see the module docstring)."""
    if secret is not None:
        return _keyed_hash(identity, secret)
    text = identity if isinstance(identity, str) else identity.decode("utf-8", "replace")
    if text.startswith(API_KEY_PREFIX):
        value = text[len(API_KEY_PREFIX) :].encode("utf-8", "surrogatepass")
        digest = hashlib.sha256(value).hexdigest()[:API_KEY_SHOWN_DIGITS]
        return f"{API_KEY_PREFIX}sha256:{digest}"
    if len(text) > MAX_SHOWN_CHARS:
        return text[:MAX_SHOWN_CHARS] + "…"
    return text


def _keyed_hash(identity: Union[str, bytes], secret: bytes) -> str:
    """The identity component of its Redis keys: ``!`` and its HMAC's first 16 bytes in hex."""
    # key_pattern encodes the identity as every key of it does; the component
    # sits between the last ':' inside the braces and the closing brace.
    pattern: bytes = _accel.key_pattern("d", "", "", identity, secret)
    inside = pattern[pattern.index(b"{") + 1 : pattern.index(b"}")]
    return inside.rsplit(b":", 1)[1].decode("ascii")
