"""The engine's settings: one object, built once from the configuration and
passed down unchanged to the supervisor and every turn it runs.

The service's configuration (``adapters.config.Settings``) reads environment
variables and TOML; it makes one ``EngineSettings`` (``Settings.engine()``) and
nothing in ``engine/`` ever copies these values into another settings class.
``verify`` makes its own with ``dataclasses.replace``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class EngineSettings:
    # A running turn's owner lease; renewed every third of it.
    lease_seconds: float = 10.0
    # Resume interrupted turns on start and when an expired lease is found.
    auto_resume: bool = True
    # Group commit of token deltas: a window is sealed after this many seconds
    # or chunks, whichever comes first.
    flush_interval: float = 0.2
    flush_max_chunks: int = 512
    # While the event loop runs its timers late (saturated), a window may stay
    # open up to this long instead (``engine.run.flush_clock``): fewer windows
    # give the loop time back. A value at or below flush_interval: never.
    flush_max_interval: float = 1.0
    # ... or once its text reaches this many characters: a window is one
    # event, and one WebSocket ``event`` message to a subscriber, which
    # clients cap (aiohttp at 4 MiB, browsers lower); a fast upstream read
    # can bring 512 large chunks before the timer has a chance to fire.
    flush_max_chars: int = 256 * 1024
    # Off: the plain reference path (each chunk folded and published on its
    # own, no text runs); the shortcuts must give the same output.
    live_fast_paths: bool = True
    # Sealed windows allowed in flight before the model stream waits for the
    # writer (backpressure). 16, not 4: at 2,000 paced streams the store's
    # peak left 4 windows (2 s of a slow stream) too little slack, and every
    # turn then stopped reading its upstream, which is what made the tail.
    max_inflight_flushes: int = 16
    # Agent-loop cap (tool rounds); -1 = unlimited.
    max_tool_call_iterations: int = 256
    tool_timeout: float = 60.0
    direct_tool_timeout: float = 60.0
    responses_stateful: bool = False
    # Event payload strings above this size are stored as blobs and referenced.
    inline_limit: int = 64 * 1024
    # Titles, tags, follow-ups and retrieval queries: this model (None: the turn's).
    task_model: str | None = None
    # Retrieved sources in the system message instead of the last user message.
    rag_system_context: bool = False
    rag_template: str | None = None  # None: the default RAG template
    memory_top_k: int = 3
    # Results kept of each web search query (legacy injection, and search_web's default).
    web_search_count: int = 3
    # Prompt-based image generation: the task model rewrites the prompt first.
    image_prompt_enhance: bool = True
    # A turn naming a file still being processed waits this long for it.
    file_wait_seconds: float = 30.0
    # Tools whose calls wait for a person's approval (tool ids or function names).
    approval_tools: frozenset[str] = frozenset()
