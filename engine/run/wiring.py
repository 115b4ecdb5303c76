"""What a turn runs with: the process's services, put together per turn.

The supervisor decides which turns run here and when (start, resume, cancel,
adoption); this module decides what each one runs *with*: its tools (the
turn's own, its tool servers', turnlog's builtins), its assembler, its task
model, its payload store. Built once per process by the service's bootstrap.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.blobs import Blobs
from engine.context.live import LiveAssembler
from engine.context.task_model import LiveTaskModel
from engine.fold.turn_view import TurnView
from engine.json_types import JsonObject, JsonValue
from engine.ports import (
    BlobStore,
    CodeExecutor,
    EventStore,
    Filters,
    ImageGenerator,
    Knowledge,
    MemorySearch,
    ModelCatalog,
    ModelClient,
    NoCodeExecutor,
    NoFilters,
    NoObserver,
    NoTools,
    NoToolServers,
    NoTurnToolServers,
    PageFetcher,
    TokenCounter,
    ToolCatalog,
    ToolServers,
    TurnObserver,
    TurnToolServers,
    WebSearch,
    turn_filters,
)
from engine.protocols.client import LiveModelClient
from engine.run.client_channel import ClientRequests
from engine.run.context import TurnPorts
from engine.settings import EngineSettings
from engine.tools.builtin import BuiltinPorts
from engine.tools.calls import LiveToolRunner, ToolHandle
from engine.tools.direct import DirectToolHandle, direct_tool_specs
from engine.tools.lazy import LazyBuiltins
from engine.tools.servers import TurnTools


@dataclass
class TurnWiring:
    """The process's services a turn may use; ``ports`` puts them together for one turn."""

    store: EventStore
    blobs: BlobStore
    models: ModelCatalog
    settings: EngineSettings
    tools: ToolCatalog = field(default_factory=NoTools)
    model_client: ModelClient = field(default_factory=LiveModelClient)
    code: CodeExecutor = field(default_factory=NoCodeExecutor)
    filters: Filters = field(default_factory=NoFilters)
    memories: MemorySearch | None = None
    knowledge: Knowledge | None = None
    search: WebSearch | None = None
    fetcher: PageFetcher | None = None
    images: ImageGenerator | None = None
    observer: TurnObserver = field(default_factory=NoObserver)
    # MCP: each turn opens its own connections (``open_servers``).
    tool_servers: ToolServers = field(default_factory=NoToolServers)
    tokens: TokenCounter | None = None  # usage for upstreams that report none

    def open_servers(self, request: JsonObject) -> TurnToolServers:
        """The turn's tool server connections (closed when its actor is done)."""
        return self.tool_servers.open(_tool_ids(request))

    def ports(self, view: TurnView, channel: ClientRequests, servers: TurnToolServers | None = None) -> TurnPorts:
        payloads = Blobs(self.blobs, view.user_id or "")
        code = None if isinstance(self.code, NoCodeExecutor) else self.code
        builtin = BuiltinPorts(
            search=self.search,
            fetcher=self.fetcher,
            knowledge=self.knowledge,
            memories=self.memories,
            images=self.images,
            payloads=payloads,
            code=code,
            search_count=self.settings.web_search_count,
        )
        # The turn's own tools win: a builtin never shadows them (nor a tool server's).
        tools = TurnTools(LazyBuiltins(builtin), servers or NoTurnToolServers(), self.tool_handles(view.request, channel))
        runner = LiveToolRunner()
        filters = turn_filters(self.filters, view.request)  # the global ones and the opt-in ones it names
        task_model = LiveTaskModel(self.models, self.model_client, self.settings.task_model or view.model or "")
        return TurnPorts(
            models=self.models,
            model_client=self.model_client,
            assembler=LiveAssembler(
                store=self.store,
                models=self.models,
                model_client=self.model_client,
                tool_runner=runner,
                tools=tools,
                settings=self.settings,
                filters=filters,
                task_model=task_model,
                memories=self.memories,
                knowledge=self.knowledge,
                search=self.search,
                fetcher=self.fetcher,
                images=self.images,
                payloads=payloads,
                code_available=code is not None,
                search_count=self.settings.web_search_count,
                tool_servers=servers,
            ),
            tools=tools,
            tool_runner=runner,
            code=self.code,
            payloads=payloads,
            filters=filters,
            task_model=task_model,
            observer=self.observer,
            tokens=self.tokens,
        )

    def tool_handles(self, request: JsonObject, channel: ClientRequests) -> dict[str, ToolHandle]:
        """The tools this turn may run: its server tools, then its direct tools."""
        handles: dict[str, ToolHandle] = dict(self.tools.handles(_tool_ids(request)))
        declared = request.get("direct_tools")
        for spec in direct_tool_specs([d for d in declared if isinstance(d, dict)] if isinstance(declared, list) else None):
            handles[spec.name] = DirectToolHandle(spec, channel, self.settings.direct_tool_timeout)
        return handles


def _tool_ids(request: JsonObject) -> list[str]:
    """The request's ``tool_ids`` (the server tools it selects)."""
    ids: JsonValue = request.get("tool_ids")
    return [i for i in ids if isinstance(i, str)] if isinstance(ids, list) else []
