"""The floor apps' shared parts: the bare app's routes plus one trivial script call.

Any exact limiter that asks Redis per request pays at least the bare app's
work plus one script round trip. The floor apps pay exactly that: their
``/allowed`` awaits one ``EVALSHA`` of a script that does nothing but return
a reply shaped like a decision's (five integers), with one key and the same
arguments a fixed-window check sends. ``/limited`` is not served: a floor has
no limited path.
"""

from __future__ import annotations

import hashlib

# One key and the arguments of a fixed-window decision (cost, apply, limit, window).
SCRIPT_SOURCE = b"return {1, 0, 999999000, 0, 60000}"
SCRIPT_SHA = hashlib.sha1(SCRIPT_SOURCE).hexdigest()
SCRIPT_KEY = b"bench-e2e-floor:{127.0.0.1}:60"
SCRIPT_ARGS = (1000, 1, 1_000_000_000, 60)
