"""The ports the engine talks through; adapters implement them.

The engine never imports an adapter. Everything with I/O — the event store, the
upstream model, the live fan-out, tools, code execution, blob storage — is
reached through these protocols, and each declares exactly what its callers in
``engine/`` use: a real adapter and a recorded one (``verify``) are both checked
against the same declaration by the type checker, so neither can need a method
the other lacks.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, TypedDict, cast

from engine.chain import StoredEvent
from engine.events import Event, EventData
from engine.json_types import JsonObject, JsonValue
from engine.pieces import Piece, PieceKind
from engine.protocols.model_events import ModelEvent
from engine.tools.calls import ToolContext, ToolHandle, ToolResult

# -- the event store -------------------------------------------------------------


class ConcurrencyError(Exception):
    """A second writer tried to append an event at an existing ``(turn_id, seq)``."""


class LeaseLost(Exception):
    """The writer's fencing token is no longer the turn's current one."""


@dataclass(frozen=True)
class TurnRecord:
    """The index row of a turn: what listing and ownership need without a fold."""

    id: str
    chat_id: str
    user_id: str
    model: str
    status: str  # running | completed | cancelled | failed | interrupted
    created_at: float
    updated_at: float
    owner: str | None = None
    lease_until: float | None = None
    fencing: int = 0
    view: JsonObject | None = None  # the last stored projection (for `replay` to compare)


@dataclass(frozen=True)
class ChatRecord:
    id: str
    user_id: str
    title: str | None
    created_at: float
    updated_at: float
    tags: list[str] = field(default_factory=list)


#: What an API key may do: ``admin`` also reaches the operator's endpoints
#: (``/metrics``); ``user``, the default, only its own turns, chats and files.
ROLES = ("admin", "user")


@dataclass(frozen=True)
class KeyHolder:
    """Whom an API key names, and the key's role (one of ``ROLES``)."""

    user_id: str
    role: str = "user"

    @property
    def admin(self) -> bool:
        return self.role == "admin"


@dataclass(frozen=True)
class IndexUpdate:
    """Changes to the turn's index row, written in the same transaction as events."""

    status: str | None = None
    view: JsonObject | None = None
    #: This owner's lease is released in the same transaction (if the turn is
    #: still its): a turn's terminal event and its release in one commit.
    release: str | None = None


class EventStore(Protocol):
    """Durable, per-turn ordered log plus the small index tables around it.

    Events come back from ``read`` upcast to the current version of their data
    (``engine.events.upcast``): readers never see an old shape.
    """

    async def start_turn(self, turn: TurnRecord, events: Sequence[Event], *, lease_seconds: float) -> int:
        """Create the turn row (and its chat if new) and append its first events.

        Returns the fencing token the owner must present on later appends.
        """
        ...

    async def append(
        self,
        events: Sequence[Event],
        *,
        fencing: int | None = None,
        index: IndexUpdate | None = None,
    ) -> None:
        """Append atomically. Raises ``ConcurrencyError`` on a taken ``(turn_id, seq)``
        and ``LeaseLost`` if ``fencing`` is given and no longer current."""
        ...

    def append_nowait(
        self,
        events: Sequence[Event],
        *,
        fencing: int | None = None,
        index: IndexUpdate | None = None,
        lazy: bool = False,
    ) -> asyncio.Future[None]:
        """``append`` without a coroutine: queue the write now and return a future
        that resolves (or fails the same way) once it is durable. For the
        per-window delta path, where a task per write is measurable.

        ``lazy``: no caller waits on this write, so the store may hold it
        briefly (its gather) to commit it with others; order is kept, and a
        later write that is not lazy takes it along at once."""
        ...

    async def read(self, turn_id: str, after: int = 0, limit: int | None = None) -> list[Event]: ...

    async def read_chain(self, turn_id: str, after: int = 0, limit: int | None = None) -> list[StoredEvent]:
        """Events as stored (data not upcast) with their hashes, by seq: what
        ``engine.chain.check`` checks and ``turnlog export`` writes."""
        ...

    async def get_turn(self, turn_id: str) -> TurnRecord | None: ...

    async def list_turns(
        self,
        *,
        user_id: str | None = None,
        chat_id: str | None = None,
        status: str | None = None,
        limit: int = 100,
    ) -> list[TurnRecord]: ...

    async def get_chat(self, chat_id: str) -> ChatRecord | None: ...

    async def list_chats(self, user_id: str, *, limit: int = 50, before: float | None = None) -> list[ChatRecord]: ...

    async def claim_turn(self, turn_id: str, owner: str, *, lease_seconds: float, dead_owner: str | None = None) -> int | None:
        """Take ownership of a turn whose lease has expired (or that we own, or,
        lease or not, whose owner is ``dead_owner``: a process known to be gone).

        Returns the new fencing token, or None if someone else holds a live lease."""
        ...

    async def renew_leases(self, owner: str, turn_ids: Sequence[str], *, lease_seconds: float) -> None: ...

    async def release_turn(self, turn_id: str, owner: str) -> None: ...

    async def orphaned_turns(self, now: float) -> list[TurnRecord]:
        """Turns still marked running whose lease has expired."""
        ...

    async def set_chat_meta(self, chat_id: str, *, title: str | None = None, tags: Sequence[str] | None = None) -> None:
        """A chat's title and/or tags (None leaves a field as it is): the index
        the chat listing reads, kept in step with the background tasks' results."""
        ...

    async def create_api_key(self, user_id: str, role: str = "user") -> str: ...

    async def user_for_api_key(self, key: str) -> str | None: ...

    async def key_holder(self, key: str) -> KeyHolder | None:
        """The user and role an API key names; None for an unknown key."""
        ...

    async def close(self) -> None: ...


class BlobStore(Protocol):
    """Content-addressed binary payloads, per user (big base64 taken out of events)."""

    async def put_blob(self, user_id: str, data: bytes, mime: str) -> str:
        """Store ``data`` once per user; returns its id (``engine.blobs.blob_id``)."""
        ...

    async def get_blob(self, user_id: str, blob_id: str) -> tuple[str, bytes] | None:
        """``(mime, data)``, or None if unknown or another user's."""
        ...


# -- the upstream model ------------------------------------------------------------


@dataclass(frozen=True)
class UpstreamErrorDetail:
    """An upstream's HTTP error as it gave it: the error object's ``message``,
    ``param`` and ``code``, and its ``Retry-After`` (seconds) if it sent one."""

    message: str
    param: str | None = None
    code: str | None = None
    retry_after: float | None = None


class UpstreamError(Exception):
    """The upstream failed: HTTP error status, transport error, timeout, truncation.

    A plain exception class (not a frozen dataclass): Python sets
    ``__traceback__`` and ``__context__`` on what it raises."""

    def __init__(
        self,
        message: str,
        kind: str = "upstream_error",
        status: int | None = None,
        *,
        upstream: UpstreamErrorDetail | None = None,
        unreachable: bool = False,
    ) -> None:
        super().__init__(message)
        self.message = message
        # upstream_http_error | upstream_disconnected | upstream_timeout | upstream_truncated | ...
        self.kind = kind
        self.status = status
        # What an HTTP error's body and headers said (its message, param, code, Retry-After).
        self.upstream = upstream
        # No connection could be made (refused, unresolvable, connect timeout):
        # the upstream could not be asked at all.
        self.unreachable = unreachable

    def __str__(self) -> str:
        return self.message

    def __repr__(self) -> str:
        return f"UpstreamError({self.message!r}, {self.kind!r}, {self.status!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, UpstreamError) and (self.message, self.kind, self.status) == (other.message, other.kind, other.status)

    def __hash__(self) -> int:
        return hash((self.message, self.kind, self.status))


@dataclass(slots=True)  # per chunk: not frozen (its init is 4x slower); never mutated
class RawChunk:
    """One parsed ``data:`` payload of the upstream stream."""

    data: dict[str, Any]


@dataclass(slots=True)
class RawRun:
    """Consecutive ``data:`` payloads of one read that are ``template`` but for
    ``choices[0]["delta"]``, which is ``{"content": text}`` (a non-empty
    string) for each of ``texts``, in order.

    A transport may give these instead of a ``RawChunk`` each (``stream_runs``):
    the per-token chunk of a fast stream is the same bytes every time but its
    text, and parsing only the part that differs saves most of what a chunk
    costs. What the chunks *mean* is still for the normalizer to say.
    """

    template: dict[str, Any]
    texts: list[str]


@dataclass(frozen=True)
class RawWarning:
    """A ``data:`` line that was not JSON: skipped, but recorded."""

    message: str
    raw: str


ModelApi = Literal["chat", "responses", "ollama"]
#: How an upstream resumes a generation cut off by a crash: ``continue`` sends
#: the partial answer back as a final assistant message for the model to go
#: on from; ``restart`` drops it (kept in the log as superseded) and asks again.
ResumeMode = Literal["continue", "restart"]


class ChatProvider(Protocol):
    """An upstream's transport: bytes in, parsed payloads out.

    Semantics (what a chunk means) live in the protocol modules
    (``engine.protocols.chat``, ``responses``, ``ollama``); the adapter only
    frames the stream, decodes JSON and turns transport faults into
    ``UpstreamError``. The iterator ends normally only after the protocol's
    terminator; anything else raises ``UpstreamError``. It yields the payloads
    of each network read as one list (never empty): the engine then takes one
    async step per read, not per chunk.
    """

    api: ModelApi

    def stream_batches(self, body: JsonObject) -> AsyncGenerator[list[RawChunk | RawWarning], None]: ...

    def stream_runs(self, body: JsonObject) -> AsyncGenerator[list[RawChunk | RawWarning | RawRun], None]:
        """``stream_batches``, where the transport can tell, with the chunks of
        a read that differ only in their text as one ``RawRun`` (what the live
        path reads); a transport that cannot gives ``stream_batches``."""
        ...

    async def list_models(self) -> list[JsonObject]: ...

    async def close(self) -> None: ...


@dataclass(frozen=True)
class ResolvedModel:
    """Where a model id goes: its provider, the upstream's own name, the operator's profile."""

    provider: ChatProvider | None  # None only for a re-run that never calls the upstream (verify)
    upstream_model: str
    api: ModelApi = "chat"
    system: str | None = None
    params: JsonObject = field(default_factory=dict)
    # The operator's profile of the model: its default function calling,
    # capabilities (``file_context``, ``builtin_tools``, ...: absent means on)
    # and attached knowledge collections.
    function_calling: Literal["native", "default"] | None = None
    capabilities: JsonObject = field(default_factory=dict)
    knowledge: tuple[str, ...] = ()
    # How its upstream resumes a cut-off generation, and what a ``continue``
    # request adds to its body (e.g. vLLM's ``continue_final_message``).
    resume: ResumeMode = "continue"
    resume_params: JsonObject = field(default_factory=dict)


class ModelCatalog(Protocol):
    """The models of every configured upstream."""

    async def resolve(self, model: str) -> ResolvedModel | None: ...

    async def list_models(self) -> list[JsonObject]: ...


@dataclass(frozen=True)
class ModelRequest:
    """One model call of a turn, protocol-neutral (Chat Completions messages)."""

    messages: list[JsonObject]
    params: JsonObject
    prefill: str | None = None
    # Stateful Responses API continuation: only ``input_items`` are sent.
    previous_response_id: str | None = None
    input_items: list[JsonObject] = field(default_factory=list)


IdFactory = Callable[[str], str]


class TokenCounter(Protocol):
    """Counts a text's tokens in some fixed encoding (the adapters' is OpenAI's
    ``cl100k_base``): usage for upstreams that report none."""

    def count(self, text: str) -> int: ...


class ModelClient(Protocol):
    """Calls a model: the live one goes to the upstream, ``verify``'s replays the log."""

    def stream(self, resolved: ResolvedModel, request: ModelRequest, id_factory: IdFactory, *, runs: bool = False) -> AsyncGenerator[list[ModelEvent], None]:
        """The response's events, in order, a list per network read (never empty):
        a fast stream's reads carry hundreds of chunks, and the consumer then
        pays one async step per read instead of one per chunk. With ``runs``,
        consecutive text chunks may come as one ``TextRun`` (no object per chunk)."""
        ...


# -- tools and code -----------------------------------------------------------------


class ToolCatalog(Protocol):
    """Server tools (modules in ``TURNLOG_TOOLS_DIR``) by tool id."""

    def known_ids(self) -> set[str]: ...

    def handles(self, tool_ids: Sequence[str]) -> dict[str, ToolHandle]:
        """Function name -> handle, for the selected modules."""
        ...


class NoTools:
    """The catalog of a deployment without a tools folder."""

    def known_ids(self) -> set[str]:
        return set()

    def handles(self, tool_ids: Sequence[str]) -> dict[str, ToolHandle]:
        return {}


class ToolRunner(Protocol):
    """Runs one call of a tool within its timeout (``verify``'s answers from the log)."""

    async def run(self, name: str, args: JsonObject, handle: ToolHandle, ctx: ToolContext, timeout: float) -> tuple[ToolResult, str | None]:
        """The result and, if the call failed, the error text."""
        ...


class CodeOutput(TypedDict, total=False):
    """What a ``CodeExecutor`` run gives (any key may be missing)."""

    stdout: str
    stderr: str
    result: JsonValue
    files: JsonValue


def code_output(output: JsonObject) -> CodeOutput:
    """An executor's answer as a ``CodeOutput``: its streams must be texts."""
    for key in ("stdout", "stderr"):
        if not isinstance(output.get(key, ""), str):
            raise TypeError(f"the code executor's {key} is not a text")
    return cast(CodeOutput, output)


class CodeExecutor(Protocol):
    """Runs code: the legacy ``<code_interpreter>`` blocks and the native
    ``execute_code`` tool."""

    async def run(self, code: str, lang: str) -> JsonObject:
        """``{"stdout", "stderr", "result", "files"?}`` (any may be missing):
        streams and the value of the last expression as text (truncated by the
        executor), ``files`` the files the code wrote in its working directory
        as ``[{"name", "mime", "data": base64}]``. A run the executor stopped (time,
        memory, processes) says so in ``stderr``; only the executor's own failure
        raises."""
        ...


class NoCodeExecutor:
    async def run(self, code: str, lang: str) -> JsonObject:
        return {"stdout": "Code interpreter engine not configured."}


class PayloadStore(Protocol):
    """Where a turn puts big base64 payloads before they enter an event."""

    async def externalize(self, payload: object, *, limit: int) -> Any:
        """A copy of ``payload`` with every big base64 string replaced by a blob reference."""
        ...

    async def data_uri(self, url: str) -> str | None:
        """The ``data:`` URI of one of this user's blob URLs (``/v1/blobs/ID``), for
        an upstream that cannot fetch it; None if it is not such a blob."""
        ...


class InlinePayloads:
    """No blob store: payloads stay inline."""

    async def externalize(self, payload: object, *, limit: int) -> Any:
        return payload

    async def data_uri(self, url: str) -> str | None:
        return None


# -- the web and images --------------------------------------------------------------------


class WebError(Exception):
    """A search or a fetch failed (the reason is its message, as the model sees it)."""


class FetchRefused(WebError):
    """A fetch the service will not make: a private, loopback, link-local or
    metadata address (after resolving), a scheme other than http(s), too many
    redirects."""


@dataclass(frozen=True)
class SearchHit:
    title: str
    url: str
    snippet: str = ""


class WebSearch(Protocol):
    """A search engine (SearXNG, a hosted search API)."""

    async def search(self, query: str, count: int) -> list[SearchHit]:
        """Raises ``WebError``."""
        ...


@dataclass(frozen=True)
class Page:
    """A fetched page as text."""

    url: str  # as asked
    final_url: str  # after redirects
    status: int
    content_type: str
    title: str
    text: str  # HTML converted to text; truncated by the fetcher's limit
    truncated: bool = False


class PageFetcher(Protocol):
    """Fetches pages for search results and ``fetch_url``, refusing private addresses."""

    async def fetch(self, url: str) -> Page:
        """Raises ``FetchRefused`` or ``WebError``."""
        ...

    async def fetch_many(self, urls: Sequence[str]) -> list[Page | WebError]:
        """One search's pages, fetched concurrently within a total time limit;
        each a page or why it is missing, in the order of ``urls``."""
        ...


@dataclass(frozen=True)
class GeneratedImage:
    data: bytes
    mime: str
    revised_prompt: str | None = None


class ImageGenerator(Protocol):
    """An OpenAI Images-compatible endpoint."""

    async def generate(self, prompt: str, *, n: int = 1, size: str | None = None) -> list[GeneratedImage]:
        """Raises ``WebError``."""
        ...

    async def edit(self, prompt: str, images: Sequence[tuple[bytes, str]], *, size: str | None = None) -> list[GeneratedImage]:
        """``images``: (bytes, mime) of the images to edit. Raises ``WebError``."""
        ...


# -- memories, files and knowledge --------------------------------------------------------


class EmbeddingError(Exception):
    """The embedding model failed (transport, HTTP status, an answer that is not vectors)."""


class Embedder(Protocol):
    """Text to vectors: an OpenAI-compatible ``/v1/embeddings``, or a local model."""

    @property
    def model(self) -> str:
        """The model's name (recorded with what it embedded)."""
        ...

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """One vector per text, in order (the adapter batches). Raises ``EmbeddingError``."""
        ...


class RetrievalError(Exception):
    """A search over memories or documents could not be made (the reason is its message)."""


@dataclass(frozen=True)
class MemoryHit:
    id: str
    content: str
    created_at: float
    score: float  # higher is closer


class MemorySearch(Protocol):
    """A user's memories: searched (nearest first) and added (the model's
    ``add_memory`` tool)."""

    async def search(self, user_id: str, query: str, k: int) -> list[MemoryHit]:
        """Raises ``RetrievalError``."""
        ...

    async def remember(self, user_id: str, content: str) -> str:
        """Store a memory; its id. Raises ``RetrievalError`` when it cannot be stored."""
        ...


@dataclass(frozen=True)
class FileRef:
    """A file or a knowledge collection a request (or a model profile) names."""

    type: Literal["file", "collection"]
    id: str
    full: bool = False  # ``context: "full"``: the whole documents, no retrieval


@dataclass(frozen=True)
class FileInfo:
    """What a reference is at the moment of asking."""

    ref: FileRef
    name: str
    status: Literal["processing", "ready", "failed", "missing"]
    reason: str | None = None  # why it is failed or missing


class Knowledge(Protocol):
    """The user's files and collections, and retrieval over them."""

    async def describe(self, user_id: str, refs: Sequence[FileRef], *, wait: float) -> list[FileInfo]:
        """Each reference's state, after waiting up to ``wait`` seconds for those
        still processing. Unknown or someone else's: ``missing``."""
        ...

    async def retrieve(self, user_id: str, refs: Sequence[FileRef], queries: Sequence[str]) -> list[dict[str, Any]]:
        """Sources for the queries over the ready references, best first:
        ``{"source": {"id", "name", "type"}, "document": [text...],
        "metadata": [{"source", "name", "file_id", ...}...], "distances"?: [...]}``.
        A ``full`` reference gives its whole text. Raises ``RetrievalError``."""
        ...

    async def passages(self, documents: Sequence[str], queries: Sequence[str]) -> list[list[tuple[str, float]]]:
        """Texts that are not stored (fetched web pages) searched as files are:
        for each text, its passages chosen for the queries ``(text, score)``,
        best first (none for a text without a relevant one). Raises ``RetrievalError``."""
        ...


class FilterError(Exception):
    """An inlet filter raised: the turn fails with this (``filter`` names it)."""

    def __init__(self, filter: str, message: str) -> None:
        super().__init__(f"filter {filter}: {message}")
        self.filter = filter
        self.message = message


@dataclass(frozen=True)
class FilterRun:
    """One filter's part in a hook: what it did, or the error it was skipped for."""

    filter: str
    changed: bool = False
    error: str | None = None
    # An inlet filter with ``file_handler = True`` handles files itself: the
    # turn then retrieves none.
    file_handler: bool = False


class Filters(Protocol):
    """Open WebUI-style ``class Filter`` modules, in priority order. Some may
    be opt-in: they run only on the turns that name them."""

    def hooks(self) -> frozenset[str]:
        """Which of ``inlet``, ``stream``, ``outlet`` some filter defines."""
        ...

    def optional_ids(self) -> frozenset[str]:
        """The opt-in filters' ids."""
        ...

    def for_turn(self, filter_ids: Iterable[str]) -> Filters:
        """The filters of a turn whose request names ``filter_ids``: the
        global ones and the opt-in ones named."""
        ...

    async def inlet(self, body: JsonObject, user: JsonObject) -> tuple[JsonObject, list[FilterRun]]:
        """The request body after every ``inlet``. Raises ``FilterError``."""
        ...

    def stream(self, event: JsonObject) -> tuple[JsonObject, list[FilterRun]]:
        """A delta, shaped as Open WebUI's stream filters expect it — a
        ``chat.completion.chunk``: ``{"choices": [{"index": 0, "delta":
        {"content" | "reasoning_content": text}}]}`` — after every ``stream``; a
        filter that raises is skipped (its run says why)."""
        ...

    async def outlet(self, body: JsonObject, user: JsonObject) -> tuple[JsonObject, list[FilterRun]]:
        """The finished body (``{"model", "chat_id", "messages": [..., the
        assistant message with content and output]}``) after every ``outlet``;
        a filter that raises is skipped."""
        ...


def turn_filters(filters: Filters, request: Mapping[str, object]) -> Filters:
    """The filters that run on a turn: the global ones, and the opt-in ones its
    request names in ``filter_ids`` (a preset's filters are recorded there)."""
    ids = request.get("filter_ids")
    if not isinstance(ids, list):
        return filters
    return filters.for_turn(str(i) for i in ids)


class NoFilters:
    def hooks(self) -> frozenset[str]:
        return frozenset()

    def optional_ids(self) -> frozenset[str]:
        return frozenset()

    def for_turn(self, filter_ids: Iterable[str]) -> Filters:
        return self

    async def inlet(self, body: JsonObject, user: JsonObject) -> tuple[JsonObject, list[FilterRun]]:
        return body, []

    def stream(self, event: JsonObject) -> tuple[JsonObject, list[FilterRun]]:
        return event, []

    async def outlet(self, body: JsonObject, user: JsonObject) -> tuple[JsonObject, list[FilterRun]]:
        return body, []


# -- assembly --------------------------------------------------------------------------


@dataclass(frozen=True)
class TurnInput:
    """What the client asked for, as ``turn.started`` recorded it."""

    id: str
    chat_id: str
    user_id: str
    model: str
    request: JsonObject
    created_at: float


class AssemblyError(Exception):
    """Assembly cannot go on (an inlet filter raised): the turn fails with this,
    after the steps that ran are recorded (``steps``)."""

    def __init__(self, message: str, type: str, steps: Sequence[EventData]) -> None:
        super().__init__(message)
        self.message = message
        self.type = type
        self.steps = list(steps)


class TaskReply(str):
    """A task model's reply: its text, with the usage the upstream reported
    for the call (None: none), which the turn records and counts."""

    usage: JsonObject | None

    def __new__(cls, text: str, usage: JsonObject | None = None) -> TaskReply:
        reply = super().__new__(cls, text)
        reply.usage = usage
        return reply


class TaskModel(Protocol):
    """The model that writes titles, tags, follow-ups and retrieval queries
    (``verify``'s answers from the log)."""

    async def ask(self, task: str, prompt: str) -> str:
        """The reply's text (a :class:`TaskReply` carries the call's usage).
        Raises ``UpstreamError``."""
        ...


class Assembler(Protocol):
    """Builds the upstream request of a turn: the live one from the request and
    the chat; ``verify``'s returns the recorded assembly."""

    def assemble(self, turn: TurnInput) -> AsyncIterator[EventData]:
        """The ``assembly.step`` events as each step ends, then
        ``assembly.completed``. A step whose detail has a ``status`` (progress a
        client should see now: "Searching the web") is recorded at once; the
        rest is committed with the model request. Raises ``AssemblyError``
        after the failing step's event."""
        ...


# -- live fan-out -------------------------------------------------------------------------


class LiveChunks:
    """Chunks of one upstream read that fall in one delta window, shown live:
    the one message shape from the read to the renderer (a fast upstream
    brings hundreds per read, and each message costs every subscriber a
    mailbox put, a wake-up or a direct delivery, and a socket write).

    ``seq`` is the durable ``model.delta`` event they will belong to; the
    chunks take positions ``pos, pos + 1, …``; ``texts`` are the raw chunks
    (what that event will hold). ``pieces`` is what the sender's fold made
    of each chunk (what clients are shown). Plain chunks (the per-token case:
    no tag can start, nothing held back) are each one piece of their own text;
    such a message holds no object per chunk, and a renderer that knows it is
    ``plain`` renders the texts directly.
    """

    __slots__ = ("seq", "pos", "kind", "texts", "_pieces")

    def __init__(self, seq: int, pos: int, kind: str, texts: list[str], pieces: list[tuple[Piece, ...]] | None = None) -> None:
        self.seq, self.pos, self.kind, self.texts, self._pieces = seq, pos, kind, texts, pieces

    @property
    def plain(self) -> bool:
        return self._pieces is None

    @property
    def pieces(self) -> list[tuple[Piece, ...]]:
        """Each chunk's pieces (made once for a plain message, shared by every subscriber)."""
        pieces = self._pieces
        if pieces is None:
            shown: PieceKind = "reasoning" if self.kind == "reasoning" else "text"
            pieces = self._pieces = [(Piece(shown, t),) for t in self.texts]
        return pieces

    @property
    def end(self) -> int:
        """The position after the last chunk."""
        return self.pos + len(self.texts)

    def since(self, pos: int) -> LiveChunks | None:
        """The chunks at position ``pos`` and after (None: there are none)."""
        skip = pos - self.pos
        if skip <= 0:
            return self
        if skip >= len(self.texts):
            return None
        pieces = self._pieces
        return LiveChunks(self.seq, pos, self.kind, self.texts[skip:], None if pieces is None else pieces[skip:])

    def __len__(self) -> int:
        return len(self.texts)

    def __repr__(self) -> str:
        return f"LiveChunks(seq={self.seq}, pos={self.pos}, n={len(self.texts)}, plain={self._pieces is None})"


@dataclass(slots=True)
class LiveEvent:
    """A committed event, published in seq order after its commit."""

    event: Event


@dataclass(frozen=True)
class LiveRequest:
    """Something the turn asks of a client (e.g. ``execute:tool``)."""

    payload: JsonObject


class Wake:
    """Another process appended to the turn: re-read the log after your cursor."""

    def __repr__(self) -> str:
        return "WAKE"


WAKE = Wake()

LiveMessage = LiveChunks | LiveEvent | LiveRequest | Wake


class Subscription(Protocol):
    """A bounded mailbox for one subscriber of one turn (``engine.run.live``)."""

    lagged: bool
    closed: bool
    # Messages put so far (queued or taken by ``sink``): whether the turn moved.
    received: int
    # A synchronous consumer tried while the reader waits with nothing queued:
    # returning True means it took the message (see ``engine.run.follow``).
    sink: Callable[[LiveMessage], bool] | None

    async def get(self, timeout: float | None = None) -> LiveMessage | None: ...

    def drain(self) -> list[LiveMessage]: ...

    def reset(self) -> None: ...

    def close(self) -> None: ...


class LiveSink(Protocol):
    """A client's output that takes live messages inside the publisher's call,
    one event-loop hop and task switch sooner than waking the client's task
    (``engine.run.follow.tail`` offers a message only while that task waits
    with everything before it sent, so the order stays). SSE streams and
    WebSocket subscriptions implement it; a client without one reads every
    message from its subscription (the plain path)."""

    def chunks(self, message: LiveChunks) -> bool:
        """Take live chunks now; False: not taken (the client's task gets them)."""
        ...

    def durable(self, event: Event) -> bool:
        """Take the next durable event now, a ``model.delta`` whose chunks
        this client showed live (it renders nothing new); False: not taken."""
        ...


class LiveBus(Protocol):
    """Live fan-out of a turn's deltas and committed events to subscribers."""

    def publish(self, turn_id: str, message: LiveMessage) -> None: ...

    def subscribe(self, turn_id: str, *, runs_tools: bool = False) -> Subscription: ...

    def has_client(self, turn_id: str) -> bool:
        """Whether a subscriber that runs direct tools follows this turn."""
        ...

    def close_turn(self, turn_id: str) -> None:
        """Wake every subscriber of a turn that will publish no more (shutdown)."""
        ...


class OwnerLocks(Protocol):
    """Whether the process that owns a turn is alive, without waiting for its lease.

    Each process that runs turns holds a lock named by its owner token for as
    long as it lives (the operating system or the database frees it when the
    process dies, kill -9 included); a turn whose owner's lock is free can be
    adopted at once."""

    async def hold(self, owner: str) -> None:
        """Take (or take again, after a lost connection) this process's lock."""
        ...

    async def is_free(self, owner: str) -> bool:
        """True only when ``owner`` held a lock and no live process holds it now;
        False for a live owner and for one that never held a lock (an older
        version: its lease decides)."""
        ...

    async def forget(self, owner: str) -> None:
        """A dead owner's turns are adopted: remove what its lock left behind."""
        ...

    async def release(self, owner: str) -> None:
        """This process stops: give its lock up."""
        ...


class RemoteControl(Protocol):
    """Asks the process that owns a turn to act on it (several processes, one database)."""

    async def request_cancel(self, turn_id: str, by: str) -> None: ...

    async def turns_released(self, turn_ids: Sequence[str]) -> None:
        """Tell the other processes that these turns have no owner now (a drain)."""
        ...


# -- observation: metrics and traces -------------------------------------------------


class TurnObserver(Protocol):
    """What the engine tells the operator's instruments (metrics, traces) as a turn runs.

    Called per turn, per model or tool call and per group commit, never per
    streamed chunk (the relay's hot path stays as it is). An observer only
    watches: it never changes a turn, must not block the loop, and whatever it
    raises is the observer's bug, so callers go through :func:`observe`.
    ``verify`` runs turns with :class:`NoObserver`: a re-run is not traffic.
    """

    def turn_started(self, turn_id: str, *, model: str, chat_id: str | None, started_at: float | None, resumed: bool) -> None:
        """This process starts (or resumes) running the turn."""
        ...

    def turn_ended(self, turn_id: str, status: str) -> None:
        """This process stops running the turn: ``status`` is the turn's status
        then, ``running`` when it stopped without a terminal event (shutdown, a
        lost lease: another process resumes it)."""
        ...

    def first_token(self, turn_id: str, seconds: float) -> None:
        """The first streamed chunk of a new turn, ``seconds`` after it started."""
        ...

    def model_call_started(self, turn_id: str, *, model: str, resolved: ResolvedModel, iteration: int) -> None: ...

    def model_call_ended(
        self,
        turn_id: str,
        *,
        finish_reason: str | None = None,
        usage: JsonObject | None = None,
        response_id: str | None = None,
        error: str | None = None,
    ) -> None:
        """The call's response finished (``error`` None) or failed (``error``: its kind)."""
        ...

    def tool_call_started(self, turn_id: str, *, call_id: str, name: str) -> None: ...

    def tool_call_ended(self, turn_id: str, *, call_id: str, name: str, status: str, error: str | None = None) -> None:
        """A tool call's result is recorded (also for a call refused before it ran)."""
        ...

    def upstream_error(self, turn_id: str, kind: str) -> None:
        """A model call failed at the upstream (``UpstreamError.kind`` or a stream failure)."""
        ...

    def events_committed(self, count: int, seconds: float) -> None:
        """One group commit of the event store made ``count`` events durable in ``seconds``."""
        ...

    def store_waited(self, turn_id: str, seconds: float) -> None:
        """The turn had too many delta windows waiting for the store and stopped
        reading the upstream for ``seconds`` (backpressure: its stream's
        latency grows by that). Once per such wait, only while the store is behind."""
        ...


class NoObserver:
    """Observes nothing: the default, and what ``verify`` runs with."""

    def turn_started(self, turn_id: str, *, model: str, chat_id: str | None, started_at: float | None, resumed: bool) -> None:
        pass

    def turn_ended(self, turn_id: str, status: str) -> None:
        pass

    def first_token(self, turn_id: str, seconds: float) -> None:
        pass

    def model_call_started(self, turn_id: str, *, model: str, resolved: ResolvedModel, iteration: int) -> None:
        pass

    def model_call_ended(
        self,
        turn_id: str,
        *,
        finish_reason: str | None = None,
        usage: JsonObject | None = None,
        response_id: str | None = None,
        error: str | None = None,
    ) -> None:
        pass

    def tool_call_started(self, turn_id: str, *, call_id: str, name: str) -> None:
        pass

    def tool_call_ended(self, turn_id: str, *, call_id: str, name: str, status: str, error: str | None = None) -> None:
        pass

    def upstream_error(self, turn_id: str, kind: str) -> None:
        pass

    def events_committed(self, count: int, seconds: float) -> None:
        pass

    def store_waited(self, turn_id: str, seconds: float) -> None:
        pass


def observe(call: Callable[..., None], *args: object, **kwargs: object) -> None:
    """Call an observer method; a failing observer is logged, never the turn's failure."""
    try:
        call(*args, **kwargs)
    except Exception:
        logging.getLogger("turnlog.observe").exception("observer %s failed", getattr(call, "__qualname__", call))


# -- tool servers (MCP) -----------------------------------------------------------


@dataclass(frozen=True)
class ToolServerListing:
    """What a turn's tool servers offered when it assembled: the tool names of
    each server that answered, a warning for each that did not (the turn goes
    on without its tools), and the instructions the servers sent."""

    tools: dict[str, list[str]]  # tool id (``mcp:NAME``) -> the function names offered
    warnings: list[str]
    instructions: list[str]


class TurnToolServers(Protocol):
    """One turn's connections to its tool servers: listed while it assembles,
    reused by every call of the turn, closed when it ends."""

    async def connect(self) -> ToolServerListing:
        """Connect and list; never raises (a server that fails is a warning)."""
        ...

    def handle(self, name: str) -> ToolHandle | None:
        """The tool of this name, also before ``connect`` (a turn resumed by
        another process calls tools its assembly listed)."""
        ...

    def listed(self) -> Mapping[str, ToolHandle]:
        """The tools ``connect`` listed, by function name."""
        ...

    async def close(self) -> None: ...


class ToolServers(Protocol):
    """The tool servers a deployment knows (``mcp:NAME`` tool ids)."""

    def known_ids(self) -> set[str]: ...

    def open(self, tool_ids: Sequence[str]) -> TurnToolServers:
        """A turn's servers, not yet connected (no I/O)."""
        ...


class NoTurnToolServers:
    """A turn that asks for no tool server."""

    async def connect(self) -> ToolServerListing:
        return ToolServerListing({}, [], [])

    def handle(self, name: str) -> ToolHandle | None:
        return None

    def listed(self) -> Mapping[str, ToolHandle]:
        return {}

    async def close(self) -> None:
        return None


class NoToolServers:
    """A deployment without tool servers."""

    def known_ids(self) -> set[str]:
        return set()

    def open(self, tool_ids: Sequence[str]) -> TurnToolServers:
        return NoTurnToolServers()
