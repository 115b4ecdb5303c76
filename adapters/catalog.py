"""The model catalog: which upstream serves which model id.

Upstream model lists are cached briefly (a turn should not pay a ``/models``
round trip); an unknown id triggers one refresh before it is refused, so a model
added upstream is usable at once.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from adapters.config import Settings
from engine.ports import ChatProvider, ResolvedModel, UpstreamError

log = logging.getLogger("turnlog.catalog")


class Catalog:
    def __init__(self, settings: Settings, providers: dict[str, ChatProvider], *, ttl: float = 30.0) -> None:
        self.settings = settings
        self.providers = providers
        self.ttl = ttl
        self._models: dict[str, tuple[str, dict[str, Any]]] = {}  # public id -> (provider name, entry)
        self._fetched_at = 0.0
        self._reachable = False

    async def _refresh(self) -> None:
        models: dict[str, tuple[str, dict[str, Any]]] = {}
        reachable = False
        for name, provider in self.providers.items():
            try:
                entries = await provider.list_models()
                reachable = True
            except UpstreamError as exc:
                log.warning("listing models of %s failed: %s", name, exc)
                continue
            for entry in entries:
                model_id = str(entry.get("id", ""))
                if not model_id:
                    continue
                if model_id in models:
                    # Two upstreams serve the same id: the later one is prefixed.
                    model_id = f"{name}/{model_id}"
                models[model_id] = (name, entry)
        self._models = models
        self._reachable = reachable
        self._fetched_at = time.monotonic()

    async def list_models(self) -> list[dict[str, Any]]:
        if time.monotonic() - self._fetched_at > self.ttl:
            await self._refresh()
        out = []
        for model_id, (name, entry) in self._models.items():
            out.append({"id": model_id, "object": "model", "created": entry.get("created", 0), "owned_by": entry.get("owned_by", name)})
        return out

    async def resolve(self, model: str) -> ResolvedModel | None:
        if not self.providers:
            return None
        if model not in self._models or time.monotonic() - self._fetched_at > self.ttl:
            await self._refresh()
        found = self._models.get(model)
        if found is None:
            if self._reachable:
                return None
            # No upstream answered the listing: let the upstream judge the id
            # rather than refuse every model while it is down.
            name, upstream_model = next(iter(self.providers)), model
        else:
            name, upstream_model = found[0], str(found[1].get("id", model))
        provider = self.providers[name]
        profile = self.settings.models.get(model)
        return ResolvedModel(
            provider=provider,
            upstream_model=upstream_model,
            api=getattr(provider, "api", "chat"),
            system=profile.system if profile else None,
            params=dict(profile.params) if profile else {},
        )
