"""Which tenant a request belongs to, so that what one client's text teaches the drafters (the
index of earlier outputs, SuffixDecoding's global tree) speeds up only that client's requests.

Drafts are lossless, so no tenant can read another's text, but their timing can leak it: an answer
that comes faster than usual says that someone else asked for the same text before. A tenant is an
API key (``Authorization: Bearer KEY``, kept only as a hash); a request without a key drafts from
nothing but its own text. ``specdec serve --shared-index`` lets every client share one index.
"""

from __future__ import annotations

import hashlib

from fastapi import Request

from specdec.loaded import OWN_TEXT


def tenant_of(request: Request) -> str:
    """The tenant of ``request``: a hash of its API key, or :data:`specdec.loaded.OWN_TEXT`."""
    auth = request.headers.get("authorization", "")
    scheme, _, key = auth.partition(" ")
    key = key.strip()
    if scheme.lower() != "bearer" or not key:
        return OWN_TEXT
    return "key-" + hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:32]
