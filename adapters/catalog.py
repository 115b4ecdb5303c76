"""The model catalog: which upstream serves which model id.

Upstream model lists are cached briefly (a turn should not pay a ``/models``
round trip); an unknown id triggers one refresh before it is refused, so a model
added upstream is usable at once.

A service whose upstreams are missing or down looks healthy and answers every
chat "model not found", which is hard to tell from a typo. So the catalog says
so: at start it logs each upstream with its model count (or a warning that
there is none, or that one is unreachable), it logs again whenever an
upstream's state changes, and ``problems()`` gives ``GET /v1/models`` the same
facts as an extension field.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from adapters.config import Settings
from adapters.presets import Presets
from engine.ports import ChatProvider, ModelApi, ResolvedModel, ResumeMode, UpstreamError

log = logging.getLogger("turnlog.catalog")

NO_UPSTREAM = (
    "no upstream is configured: every chat request will be answered 'model not found'. "
    "Set TURNLOG_OPENAI_BASE_URL (and TURNLOG_OPENAI_API_KEY), TURNLOG_OLLAMA_BASE_URL or TURNLOG_CONNECTIONS, "
    "or run `turnlog serve --demo` for a built-in scripted model"
)
SHOWN_IDS = 5  # model ids named in the start-up log line


def describe(name: str, provider: ChatProvider) -> str:
    """An upstream as an operator recognizes it (never its key)."""
    return f"{name} ({getattr(provider, 'base_url', 'built-in')}, {getattr(provider, 'api', 'chat')} API)"


class Catalog:
    def __init__(self, settings: Settings, providers: dict[str, ChatProvider], *, ttl: float = 30.0, presets: Presets | None = None) -> None:
        self.settings = settings
        self.providers = providers
        self.presets = presets
        self.ttl = ttl
        self._models: dict[str, tuple[str, dict[str, Any]]] = {}  # public id -> (provider name, entry)
        self._fetched_at = 0.0
        self._reachable = False
        self._errors: dict[str, str] = {}  # upstream -> why its last listing failed
        self._states: dict[str, str] = {}  # upstream -> last logged state, to log changes only
        self._inflight: asyncio.Future[None] | None = None
        self._warned: set[str] = set()  # presets whose unknown base model was logged

    def start(self) -> None:
        """Report the upstreams: at once if there is none, else after a first
        listing in the background (an upstream that times out must not hold up
        the start, nor the resumption of interrupted turns)."""
        if not self.providers:
            log.warning(NO_UPSTREAM)
            return
        self._refresh_soon()

    async def close(self) -> None:
        if self._inflight is not None and not self._inflight.done():
            self._inflight.cancel()
            try:
                await self._inflight
            except (asyncio.CancelledError, Exception):
                pass

    def _refresh_soon(self) -> asyncio.Future[None]:
        """The listing in progress, or a new one: concurrent callers share it."""
        if self._inflight is None or self._inflight.done():
            self._inflight = asyncio.ensure_future(self._fetch())
        return self._inflight

    async def _refresh(self) -> None:
        # Shielded: a client that goes away does not cancel the shared listing.
        await asyncio.shield(self._refresh_soon())

    async def _fetch(self) -> None:
        models: dict[str, tuple[str, dict[str, Any]]] = {}
        reachable = False
        errors: dict[str, str] = {}
        for name, provider in self.providers.items():
            try:
                entries = await self._listing(name, provider)
                reachable = reachable or not getattr(provider, "local", False)
            except UpstreamError as exc:
                errors[name] = str(exc)
                self._log_state(name, provider, "unreachable", None, str(exc))
                continue
            ids: list[str] = []
            prefix = self._prefix(name)
            for entry in entries:
                model_id = str(entry.get("id", ""))
                if not model_id:
                    continue
                if prefix:
                    # A connection with a prefix: listed and addressed as PREFIX/MODEL.
                    model_id = f"{prefix}/{model_id}"
                if model_id in models:
                    # Two upstreams serve the same id: the later one is prefixed.
                    model_id = f"{name}/{model_id}"
                models[model_id] = (name, entry)
                ids.append(model_id)
            self._log_state(name, provider, f"models:{len(ids)}", ids)
        self._models = models
        self._reachable = reachable
        self._errors = errors
        self._fetched_at = time.monotonic()
        if reachable:
            self._check_presets()

    def _check_presets(self) -> None:
        """Warn, once each, about a preset of the settings whose base model no
        upstream lists (its turns answer 404 until one does)."""
        configured = self.presets.configured if self.presets is not None else {}
        for spec in configured.values():
            if spec.base_model in self._models or spec.id in self._warned:
                continue
            self._warned.add(spec.id)
            nested = " (a preset: presets do not nest)" if spec.base_model in configured else ""
            log.warning("preset %s: its base model %s is no model of the upstreams%s; its turns are refused until it is", spec.id, spec.base_model, nested)

    def _by_prefix(self, model: str) -> tuple[str, str] | None:
        """The connection whose prefix ``model`` starts with, and the id without it."""
        for name in self.providers:
            prefix = self._prefix(name)
            if prefix and model.startswith(prefix + "/"):
                return name, model[len(prefix) + 1 :]
        return None

    def _prefix(self, name: str) -> str | None:
        connection = self.settings.connections.get(name)
        return connection.prefix if connection is not None else None

    async def _listing(self, name: str, provider: ChatProvider) -> list[dict[str, Any]]:
        """A connection's models: its fixed ``models`` list if it has one (its
        ``/models`` is then never asked), else the upstream's listing."""
        connection = self.settings.connections.get(name)
        if connection is not None and connection.models is not None:
            return [{"id": model_id, "owned_by": name} for model_id in connection.models]
        return await provider.list_models()

    def _log_state(self, name: str, provider: ChatProvider, state: str, ids: list[str] | None, error: str = "") -> None:
        """Log an upstream's state when it differs from the last one logged."""
        previous = self._states.get(name)
        self._states[name] = state
        if previous == state:
            return
        what = describe(name, provider)
        if ids is None:
            log.warning(
                "upstream %s is unreachable: %s. GET /v1/models reports it; requests for its models fail until it answers",
                what,
                error,
            )
        elif not ids:
            log.warning("upstream %s lists no models: every chat request for it will be answered 'model not found'", what)
        else:
            shown = ", ".join(ids[:SHOWN_IDS]) + (", …" if len(ids) > SHOWN_IDS else "")
            again = " (reachable again)" if previous == "unreachable" else ""
            log.info("upstream %s%s: %d model%s: %s", what, again, len(ids), "" if len(ids) == 1 else "s", shown)

    async def list_models(self) -> list[dict[str, Any]]:
        """The presets (``owned_by: "turnlog"``), then every upstream model
        that no preset shadows."""
        if time.monotonic() - self._fetched_at > self.ttl:
            await self._refresh()
        out: list[dict[str, Any]] = []
        for spec in await self.presets.all() if self.presets is not None else []:
            extra = {k: v for k, v in (("name", spec.name), ("description", spec.description)) if v}
            out.append({"id": spec.id, "object": "model", "created": 0, "owned_by": "turnlog", "turnlog": {"base_model": spec.base_model, **extra}})
        shadowed = {entry["id"] for entry in out}
        for model_id, (name, entry) in self._models.items():
            if model_id not in shadowed:
                out.append({"id": model_id, "object": "model", "created": entry.get("created", 0), "owned_by": entry.get("owned_by", name)})
        return out

    async def upstream_ids(self) -> set[str]:
        """The model ids the upstreams list (no preset), after a listing."""
        if not self._fetched_at:
            await self._refresh()
        return set(self._models)

    def problems(self) -> dict[str, Any] | None:
        """Why the model list may be short, for ``GET /v1/models`` (None: nothing wrong).

        ``unreachable``: the upstreams whose listing failed at the last refresh;
        ``warning``: no upstream is configured at all."""
        if not self.providers:
            return {"warning": NO_UPSTREAM}
        if self._errors:
            return {"unreachable": [{"upstream": name, "error": error} for name, error in self._errors.items()]}
        return None

    async def resolve(self, model: str) -> ResolvedModel | None:
        """Where a model id goes; a preset's id goes to its base model (a
        turn resolves a preset once, when it starts: ``adapters.presets``;
        this serves the task model and forks that name one)."""
        if self.presets is not None:
            spec = await self.presets.get(model)
            if spec is not None:
                return await self._resolve_upstream(spec.base_model)
        return await self._resolve_upstream(model)

    async def _resolve_upstream(self, model: str) -> ResolvedModel | None:
        if not self.providers:
            return None
        if model not in self._models or time.monotonic() - self._fetched_at > self.ttl:
            await self._refresh()
        found = self._models.get(model)
        if found is None:
            # Models served in this process (pipes) are always listed: only an upstream is asked.
            remote = [name for name, provider in self.providers.items() if not getattr(provider, "local", False)]
            if self._reachable or not remote:
                return None
            # No upstream answered the listing: let the upstream judge the id
            # rather than refuse every model while it is down (a prefixed id
            # goes to its connection).
            name, upstream_model = self._by_prefix(model) or (remote[0], model)
        else:
            name, upstream_model = found[0], str(found[1].get("id", model))
        provider = self.providers[name]
        profile = self.settings.models.get(model)
        api: ModelApi = getattr(provider, "api", "chat")
        resume, resume_params = self.settings.resume_of(name, api)
        own: ResumeMode | None = getattr(provider, "resume", None)
        if own is not None:  # a provider that can resume only one way (pipes restart)
            resume, resume_params = own, {}
        return ResolvedModel(
            provider=provider,
            upstream_model=upstream_model,
            api=api,
            resume=resume,
            resume_params=resume_params,
            system=profile.system if profile else None,
            params=dict(profile.params) if profile else {},
            function_calling=profile.function_calling if profile else None,
            capabilities=dict(profile.capabilities) if profile else {},
            knowledge=tuple(profile.knowledge) if profile else (),
        )
