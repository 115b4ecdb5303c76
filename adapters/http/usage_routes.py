"""``GET /v1/usage``: what a user's turns spent, from the usage rollup.

``since`` and ``until`` are UTC days (``YYYY-MM-DD``, both included; either
may be left out); ``group_by`` is ``model``, ``day`` or ``model,day`` (none:
one row of the sums). A caller reads its own usage; an admin adds ``user=``
for another user's.
"""

from __future__ import annotations

from datetime import date
from typing import Any

from aiohttp import web

from adapters.http.auth import USER, require_admin
from adapters.http.context import services
from adapters.http.errors import ApiError
from adapters.store.usage import UsageRow

_COUNTS = ("turns", "input_tokens", "output_tokens", "tool_calls")
_GROUPS = {"": (), "model": ("model",), "day": ("day",), "model,day": ("model", "day"), "day,model": ("model", "day")}


def _day(request: web.Request, name: str) -> str | None:
    value = request.query.get(name)
    if not value:
        return None
    try:
        if len(value) == 10:  # (fromisoformat also reads 20261204)
            return date.fromisoformat(value).isoformat()
    except ValueError:
        pass
    raise ApiError(400, f"'{name}' must be a UTC day, YYYY-MM-DD (got {value[:40]!r})", code="invalid_value", param=name)


def _entry(counts: dict[str, int]) -> dict[str, Any]:
    entry: dict[str, Any] = {c: counts[c] for c in _COUNTS}
    if counts["estimated_turns"]:
        # Some of these tokens turnlog counted itself: the upstream reported none.
        entry["usage_estimated"] = True
        entry["estimated_turns"] = counts["estimated_turns"]
    return entry


def summarize(rows: list[UsageRow], group: tuple[str, ...]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The ``data`` rows grouped by ``group``, and the total."""
    groups: dict[tuple[str, ...], dict[str, int]] = {}
    total = dict.fromkeys((*_COUNTS, "estimated_turns"), 0)
    for row in rows:
        key = tuple(row.model if g == "model" else row.day for g in group)
        sums = groups.setdefault(key, dict.fromkeys(total, 0))
        for name, value in row.counts.items():
            sums[name] += value
            total[name] += value
    data = [{**dict(zip(group, key, strict=True)), **_entry(sums)} for key, sums in sorted(groups.items())]
    return data, _entry(total)


async def get_usage(request: web.Request) -> web.Response:
    svc = services(request)
    group_by = request.query.get("group_by", "")
    if group_by not in _GROUPS:
        raise ApiError(400, f"'group_by' must be model, day or model,day (got {group_by[:40]!r})", code="invalid_value", param="group_by")
    since, until = _day(request, "since"), _day(request, "until")
    if since is not None and until is not None and since > until:
        raise ApiError(400, f"'since' ({since}) is after 'until' ({until})", code="invalid_value", param="since")
    user = request[USER]
    asked = request.query.get("user")
    if asked is not None and asked != user:
        require_admin(request)  # another user's usage: an admin's to read
        user = asked
    if svc.quotas is None:
        raise ApiError(501, "this service keeps no usage", "invalid_request_error", "not_supported")
    data, total = summarize(await svc.quotas.usage.rows(user, since, until), _GROUPS[group_by])
    return web.json_response({"object": "usage", "user": user, "since": since, "until": until, "data": data, "total": total})


def setup(app: web.Application) -> None:
    app.router.add_get("/v1/usage", get_usage)
