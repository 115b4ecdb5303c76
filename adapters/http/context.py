"""What every handler reaches through the application: the services of the process."""

from __future__ import annotations

from dataclasses import dataclass

from aiohttp import web

from adapters.catalog import Catalog
from adapters.config import Settings
from adapters.knowledge.files import FileKnowledge
from adapters.knowledge.memories import Memories
from adapters.presets import Presets
from engine.ports import ChatProvider, EventStore
from engine.run.supervisor import Supervisor


@dataclass
class Services:
    settings: Settings
    store: EventStore
    catalog: Catalog
    supervisor: Supervisor
    providers: dict[str, ChatProvider]
    memories: Memories
    knowledge: FileKnowledge  # files, collections, retrieval (engine.ports.Knowledge)
    presets: Presets  # model presets (settings and /v1/presets)


SERVICES = web.AppKey("turnlog_services", Services)


def services(request: web.Request) -> Services:
    return request.app[SERVICES]
