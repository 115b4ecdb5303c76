"""Bearer-key authentication and per-user isolation.

With auth on, every request names its user through an API key (``turnlog keys
create``); a user sees only their own turns and chats, and someone else's are
answered exactly like missing ones (404), so ids leak nothing.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from adapters.http.errors import ApiError, refuse_nul_in_url

LOCAL_USER = "local"
USER = web.RequestKey("turnlog_user", str)
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


def auth_middleware(enabled: bool, lookup: Any) -> Any:
    @web.middleware
    async def middleware(request: web.Request, handler: Any) -> web.StreamResponse:
        if not enabled or request.path in OPEN_PATHS or request.path.startswith(OPEN_PREFIX):
            request[USER] = LOCAL_USER
            refuse_nul_in_url(request)
            return await handler(request)
        token = bearer_token(request)
        if token is None:
            raise ApiError(401, "missing API key: send 'Authorization: Bearer KEY'", "authentication_error", "missing_api_key")
        user = await lookup(token)
        if user is None:
            raise ApiError(401, "invalid API key", "authentication_error", "invalid_api_key")
        request[USER] = user
        refuse_nul_in_url(request)  # (after the key: a caller without one learns nothing)
        return await handler(request)

    return middleware
