"""Bearer-key authentication, per-user isolation and roles.

With auth on, every request names its user through an API key (``turnlog keys
create``); a user sees only their own turns and chats, and someone else's are
answered exactly like missing ones (404), so ids leak nothing. A key's role is
``user`` or ``admin``: the operator's endpoints (``/metrics``) answer a user
key 403. With auth off the caller is the one local user, an admin.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from adapters.http.errors import ApiError, refuse_nul_in_url
from adapters.store.common import hash_api_key
from engine.ports import KeyHolder

LOCAL_USER = "local"
USER = web.RequestKey("turnlog_user", str)
ROLE = web.RequestKey("turnlog_role", str)
#: Whether the caller's chat ids are scoped to it (auth on: users share no
#: namespace of chat ids; auth off: one user, the ids are its own).
SCOPED = web.RequestKey("turnlog_scoped", bool)
#: The sha256 (hex) of the caller's API key, as ``api_keys`` keeps it; None
#: with auth off (or the metrics token). A turn records it: usage per key.
KEY_HASH: web.RequestKey[str | None] = web.RequestKey("turnlog_key_hash", str)
OPEN_PATHS = frozenset({"/healthz", "/ui", "/openapi.json"})
# The inspector's page and its static files (the page sends a key on its API calls).
OPEN_PREFIX = "/ui/"


def bearer_token(request: web.Request) -> str | None:
    header = request.headers.get("Authorization", "")
    if header[:7].lower() == "bearer ":
        return header[7:].strip() or None
    # Browsers cannot set headers on a WebSocket upgrade.
    if request.path == "/v1/ws":
        return request.query.get("access_token") or None
    return None


#: What only an admin key (or, for ``/metrics``, the metrics token) may read.
ADMIN_PATHS = frozenset({"/metrics"})
METRICS_PATH = "/metrics"


def require_admin(request: web.Request) -> None:
    """403 unless the caller is an admin (every caller is one with auth off)."""
    if request.get(ROLE) != "admin":
        raise ApiError(403, f"{request.path} needs an admin key", "permission_error", "admin_required")


def auth_middleware(enabled: bool, lookup: Callable[[str], Awaitable[KeyHolder | None]], metrics_token: str | None = None) -> Any:
    """``lookup`` names a key's holder; ``metrics_token`` (with auth on) reads
    ``/metrics`` as an admin would, and nothing else."""

    @web.middleware
    async def middleware(request: web.Request, handler: Any) -> web.StreamResponse:
        if not enabled or request.path in OPEN_PATHS or request.path.startswith(OPEN_PREFIX):
            request[USER], request[ROLE], request[SCOPED] = LOCAL_USER, "admin", False
            request[KEY_HASH] = None
            refuse_nul_in_url(request)
            return await handler(request)
        token = bearer_token(request)
        if token is None:
            raise ApiError(401, "missing API key: send 'Authorization: Bearer KEY'", "authentication_error", "missing_api_key")
        key_hash: str | None = None
        if metrics_token and request.path == METRICS_PATH and hmac.compare_digest(token.encode(), metrics_token.encode()):
            holder: KeyHolder | None = KeyHolder("metrics", "admin")
        else:
            holder = await lookup(token)
            key_hash = hash_api_key(token)
        if holder is None:
            raise ApiError(401, "invalid API key", "authentication_error", "invalid_api_key")
        request[USER], request[ROLE], request[SCOPED] = holder.user_id, holder.role, True
        request[KEY_HASH] = key_hash
        refuse_nul_in_url(request)  # (after the key: a caller without one learns nothing)
        if request.path in ADMIN_PATHS:
            require_admin(request)
        return await handler(request)

    return middleware
