"""``/v1/presets``: model presets, managed with an admin key (docs/guides/presets.md).

A preset is checked when it is created or changed: its base model must be an
upstream model (not another preset: presets do not nest), its tools known,
its files shared collections, its filters opt-in ones. A preset of the
settings is shown here too, and changed only in the settings (409).
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from adapters.http.auth import require_admin
from adapters.http.context import Services, services
from adapters.http.errors import ApiError
from adapters.http.schemas import read_body, validate_body
from adapters.presets import PresetConflict, PresetPatch, PresetSpec, ReadOnlyPreset


def _public(spec: PresetSpec, source: str) -> dict[str, Any]:
    return {**spec.model_dump(exclude_none=True), "object": "preset", "source": source}


def _source(svc: Services, preset_id: str) -> str:
    return "settings" if preset_id in svc.presets.configured else "api"


async def check_preset(svc: Services, spec: PresetSpec) -> None:
    """400 naming what a preset refers to that does not exist or may not be bound."""
    if await svc.presets.get(spec.base_model) is not None:
        raise ApiError(400, f"base_model '{spec.base_model}' is a preset: presets do not nest", code="invalid_base_model", param="base_model")
    if spec.base_model not in await svc.catalog.upstream_ids():
        raise ApiError(400, f"base_model '{spec.base_model}' is no model of the upstreams (GET /v1/models)", code="invalid_base_model", param="base_model")
    unknown = sorted(set(spec.tool_ids) - svc.supervisor.wiring.tools.known_ids())
    if unknown:
        raise ApiError(400, f"unknown tool_ids: {', '.join(unknown)}", code="unknown_tool", param="tool_ids")
    for i, ref in enumerate(spec.files):
        if ref.get("type") != "collection" or not isinstance(ref.get("id"), str):
            raise ApiError(400, f"files[{i}]: a preset binds shared collections only ({{'type': 'collection', 'id'}})", code="invalid_value", param="files")
        if not await svc.knowledge.is_shared(ref["id"]):
            raise ApiError(400, f"files[{i}]: collection '{ref['id']}' is not a shared collection", code="not_shared", param="files")
    bad = sorted(set(spec.filters) - svc.supervisor.wiring.filters.optional_ids())
    if bad:
        raise ApiError(400, f"filters {', '.join(bad)} are no opt-in filters ([filters.NAME] global = false)", code="unknown_filter", param="filters")


async def create_preset(request: web.Request) -> web.Response:
    require_admin(request)
    svc = services(request)
    spec: PresetSpec = await read_body(request, PresetSpec)
    await check_preset(svc, spec)
    try:
        await svc.presets.create(spec)
    except PresetConflict:
        raise ApiError(409, f"preset '{spec.id}' exists", "invalid_request_error", "preset_exists", "id") from None
    return web.json_response(_public(spec, "api"), status=201)


async def list_presets(request: web.Request) -> web.Response:
    require_admin(request)
    svc = services(request)
    return web.json_response({"object": "list", "data": [_public(p, _source(svc, p.id)) for p in await svc.presets.all()]})


async def _existing(svc: Services, preset_id: str) -> PresetSpec:
    spec = await svc.presets.get(preset_id)
    if spec is None:
        raise ApiError(404, f"preset '{preset_id}' not found", "not_found_error", "not_found", "id")
    return spec


async def get_preset(request: web.Request) -> web.Response:
    require_admin(request)
    svc = services(request)
    preset_id = request.match_info["preset_id"]
    return web.json_response(_public(await _existing(svc, preset_id), _source(svc, preset_id)))


def _read_only(preset_id: str) -> ApiError:
    return ApiError(409, f"preset '{preset_id}' comes from the settings ([models.\"{preset_id}\"]): change it there", code="preset_read_only")


async def patch_preset(request: web.Request) -> web.Response:
    require_admin(request)
    svc = services(request)
    preset_id = request.match_info["preset_id"]
    current = await _existing(svc, preset_id)
    if preset_id in svc.presets.configured:
        raise _read_only(preset_id)
    patch: PresetPatch = await read_body(request, PresetPatch)
    spec = validate_body(PresetSpec, {**current.model_dump(), **patch.model_dump(exclude_unset=True)})
    await check_preset(svc, spec)
    try:
        if not await svc.presets.replace(spec):
            raise ApiError(404, f"preset '{preset_id}' not found", "not_found_error", "not_found", "id")
    except ReadOnlyPreset:
        raise _read_only(preset_id) from None
    return web.json_response(_public(spec, "api"))


async def delete_preset(request: web.Request) -> web.Response:
    require_admin(request)
    svc = services(request)
    preset_id = request.match_info["preset_id"]
    try:
        deleted = await svc.presets.delete(preset_id)
    except ReadOnlyPreset:
        raise _read_only(preset_id) from None
    if not deleted:
        raise ApiError(404, f"preset '{preset_id}' not found", "not_found_error", "not_found", "id")
    return web.json_response({"id": preset_id, "object": "preset", "deleted": True})


def setup(app: web.Application) -> None:
    app.router.add_post("/v1/presets", create_preset)
    app.router.add_get("/v1/presets", list_presets)
    app.router.add_get("/v1/presets/{preset_id}", get_preset)
    app.router.add_patch("/v1/presets/{preset_id}", patch_preset)
    app.router.add_delete("/v1/presets/{preset_id}", delete_preset)
