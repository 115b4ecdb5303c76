"""What every handler reaches through the application: the services of the process."""

from __future__ import annotations

from dataclasses import dataclass

from aiohttp import web

from adapters.catalog import Catalog
from adapters.config import Settings
from adapters.knowledge.files import FileKnowledge
from adapters.knowledge.memories import Memories
from adapters.store.usage import Quotas
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
    quotas: Quotas | None = None  # usage and the quotas a turn's start must pass


SERVICES = web.AppKey("turnlog_services", Services)


def services(request: web.Request) -> Services:
    return request.app[SERVICES]
