"""Model presets: model ids of turnlog's own that wrap a base model.

A preset is what Open WebUI calls a workspace model: a base model with a
system prompt, default params, tools, shared collections, features and opt-in
filters, named by one id so that any client (a plain SDK call too) gets it by
naming that id. Presets come from the settings (a ``[models.ID]`` entry with a
``base_model``) or from ``/v1/presets`` (stored in the ``presets`` table).

A turn naming a preset records its resolution in ``turn.started``
(``preset``: the base model and everything the preset added, the system
prompt rendered) and the request it resolved to: a resume, a replay or a
``verify`` never resolves it again, whatever the preset has become since.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import logging
import re
import time
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import Column, Float, MetaData, Table, Text, delete, insert, select, update
from sqlalchemy.ext.asyncio import AsyncEngine

from adapters.config import ModelSettings
from adapters.store.sqlite import SQLITE_BEGIN

log = logging.getLogger("turnlog.presets")
metadata = MetaData()

# One row per preset created over HTTP; ``body`` is its JSON (``PresetSpec``).
presets_table = Table(
    "presets",
    metadata,
    Column("id", Text, primary_key=True),
    Column("body", Text, nullable=False),
    Column("created_at", Float, nullable=False),
    Column("updated_at", Float, nullable=False),
)

PRESET_ID = r"^[A-Za-z0-9_.:\-]{1,128}$"


class PresetSpec(BaseModel):
    """A preset as ``/v1/presets`` takes and shows it."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(pattern=PRESET_ID)
    name: str | None = None
    description: str | None = None
    base_model: str = Field(min_length=1)
    system: str | None = None
    params: dict[str, Any] = Field(default_factory=dict)
    tool_ids: list[str] = Field(default_factory=list)
    files: list[dict[str, Any]] = Field(default_factory=list)
    features: dict[str, bool] = Field(default_factory=dict)
    filters: list[str] = Field(default_factory=list)

    @classmethod
    def of_settings(cls, model_id: str, entry: ModelSettings) -> PresetSpec:
        fields = entry.model_dump(include={"name", "description", "base_model", "system", "params", "tool_ids", "files", "features", "filters"})
        if entry.function_calling and "function_calling" not in fields["params"]:
            # A preset's function calling is a default of its turns' params.
            fields["params"] = {**fields["params"], "function_calling": entry.function_calling}
        ignored = [key for key in ("capabilities", "knowledge") if getattr(entry, key)]
        if ignored:
            log.warning("preset %s: %s ignored (a preset takes its base model's capabilities; it binds collections with files)", model_id, ", ".join(ignored))
        return cls(id=model_id, **fields)


class PresetPatch(BaseModel):
    """``PATCH /v1/presets/{id}``: the fields to replace."""

    model_config = ConfigDict(extra="forbid")

    name: str | None = None
    description: str | None = None
    base_model: str | None = Field(default=None, min_length=1)
    system: str | None = None
    params: dict[str, Any] | None = None
    tool_ids: list[str] | None = None
    files: list[dict[str, Any]] | None = None
    features: dict[str, bool] | None = None
    filters: list[str] | None = None


class PresetConflict(Exception):
    """The id is taken (by a stored preset or a settings one)."""


class ReadOnlyPreset(Exception):
    """A preset of the settings: changed in the settings, not over HTTP."""


#: How old the stored presets a turn's start reads may be (another process's changes).
STALE_SECONDS = 2.0


class Presets:
    """The presets of the settings and of the ``presets`` table."""

    def __init__(self, settings_models: dict[str, ModelSettings], engine: AsyncEngine, *, clock: Callable[[], float] = time.time) -> None:
        self.configured = {model_id: PresetSpec.of_settings(model_id, entry) for model_id, entry in settings_models.items() if entry.base_model}
        self._write = engine.execution_options(**{SQLITE_BEGIN: "BEGIN IMMEDIATE"})
        self._read = engine.execution_options(**{SQLITE_BEGIN: None})
        self._clock = clock
        # Every turn's start asks for its model id: the stored presets are read
        # once per ``STALE_SECONDS`` (one query for all, shared by the starts
        # waiting on it), not once per start (a burst of starts queued on the
        # database for it). This process's own changes are seen at once; another
        # process's within ``STALE_SECONDS``.
        self._stored: dict[str, PresetSpec] | None = None
        self._read_at = 0.0
        self._loading: asyncio.Task[dict[str, PresetSpec]] | None = None
        self._generation = 0  # bumped by this process's changes: a read begun before one is not kept

    async def get(self, preset_id: str) -> PresetSpec | None:
        if preset_id in self.configured:
            return self.configured[preset_id]
        return (await self._snapshot()).get(preset_id)

    async def _snapshot(self) -> dict[str, PresetSpec]:
        if self._stored is not None and time.monotonic() - self._read_at < STALE_SECONDS:
            return self._stored
        if self._loading is None:
            self._loading = asyncio.ensure_future(self._load())
        loading = self._loading
        try:
            return await asyncio.shield(loading)
        finally:
            if self._loading is loading and loading.done():
                self._loading = None

    async def _load(self) -> dict[str, PresetSpec]:
        began, generation = time.monotonic(), self._generation
        async with self._read.connect() as conn:
            rows = (await conn.execute(select(presets_table.c.body))).all()
        stored = {spec.id: spec for spec in (PresetSpec.model_validate_json(row[0]) for row in rows)}
        if generation == self._generation:
            self._stored, self._read_at = stored, began
        return stored

    def _changed(self) -> None:
        self._stored, self._loading = None, None
        self._generation += 1

    async def all(self) -> list[PresetSpec]:
        async with self._read.connect() as conn:
            rows = (await conn.execute(select(presets_table.c.body).order_by(presets_table.c.created_at, presets_table.c.id))).all()
        stored = [PresetSpec.model_validate_json(row[0]) for row in rows]
        return [*self.configured.values(), *(p for p in stored if p.id not in self.configured)]

    async def create(self, spec: PresetSpec) -> None:
        if spec.id in self.configured:
            raise PresetConflict(spec.id)
        now = self._clock()
        async with self._write.begin() as conn:
            if (await conn.execute(select(presets_table.c.id).where(presets_table.c.id == spec.id))).first():
                raise PresetConflict(spec.id)
            await conn.execute(insert(presets_table).values(id=spec.id, body=spec.model_dump_json(), created_at=now, updated_at=now))
        self._changed()

    async def replace(self, spec: PresetSpec) -> bool:
        if spec.id in self.configured:
            raise ReadOnlyPreset(spec.id)
        async with self._write.begin() as conn:
            result = await conn.execute(
                update(presets_table).where(presets_table.c.id == spec.id).values(body=spec.model_dump_json(), updated_at=self._clock())
            )
        self._changed()
        return bool(result.rowcount)

    async def delete(self, preset_id: str) -> bool:
        if preset_id in self.configured:
            raise ReadOnlyPreset(preset_id)
        async with self._write.begin() as conn:
            result = await conn.execute(delete(presets_table).where(presets_table.c.id == preset_id))
        self._changed()
        return bool(result.rowcount)


# -- resolution -------------------------------------------------------------------

_VARIABLE = re.compile(r"\{\{\s*(CURRENT_DATE|CURRENT_TIME|CURRENT_DATETIME|CURRENT_WEEKDAY|USER_NAME|USER_LANGUAGE)\s*\}\}")


def render_system(template: str, *, now: dt.datetime, user_name: str, language: str) -> str:
    """The system prompt with Open WebUI's variables replaced (unknown ones stay as written)."""
    values = {
        "CURRENT_DATE": now.strftime("%Y-%m-%d"),
        "CURRENT_TIME": now.strftime("%H:%M:%S"),
        "CURRENT_DATETIME": now.strftime("%Y-%m-%d %H:%M:%S"),
        "CURRENT_WEEKDAY": now.strftime("%A"),
        "USER_NAME": user_name,
        "USER_LANGUAGE": language,
    }
    return _VARIABLE.sub(lambda m: values[m.group(1)], template)


def user_language(accept_language: str | None) -> str:
    """The first language of an ``Accept-Language`` header, else ``en-US``."""
    for part in (accept_language or "").split(","):
        tag = part.split(";")[0].strip()
        if tag and tag != "*" and re.fullmatch(r"[A-Za-z]{1,8}(-[A-Za-z0-9]{1,8})*", tag):
            return tag
    return "en-US"


def resolution(spec: PresetSpec, *, now: dt.datetime, user_name: str, language: str) -> dict[str, Any]:
    """What a turn records of the preset it names (``turn.started.preset``)."""
    out: dict[str, Any] = {"id": spec.id, "base_model": spec.base_model}
    if spec.system:
        out["system"] = render_system(spec.system, now=now, user_name=user_name, language=language)
    for key in ("params", "tool_ids", "files", "features", "filters"):
        value = getattr(spec, key)
        if value:
            out[key] = json.loads(json.dumps(value))  # a plain copy
    return out


def _unique(items: list[Any]) -> list[Any]:
    seen: list[Any] = []
    for item in items:
        if item not in seen:
            seen.append(item)
    return seen


def apply_preset(request: dict[str, Any], resolved: dict[str, Any]) -> dict[str, Any]:
    """The request a preset turn runs: the preset's system prompt before the
    client's own (``params.system``, which the assembly puts first in the
    system message), its params as defaults (the request's own win), its
    tools, files, features and opt-in filters added to the request's."""
    out = dict(request)
    params = dict(out.get("params") or {})
    merged = {**(resolved.get("params") or {}), **params}
    system = resolved.get("system")
    if system:
        own = params.get("system")
        merged["system"] = f"{system}\n{own}" if own else system
    if merged:
        out["params"] = merged
    if resolved.get("tool_ids"):
        out["tool_ids"] = _unique([*resolved["tool_ids"], *(out.get("tool_ids") or [])])
    if resolved.get("files"):
        out["files"] = _unique([*resolved["files"], *(out.get("files") or [])])
    if resolved.get("features"):
        out["features"] = {**resolved["features"], **(out.get("features") or {})}
    if resolved.get("filters"):
        out["filter_ids"] = _unique([*resolved["filters"], *(out.get("filter_ids") or [])])
    return out
