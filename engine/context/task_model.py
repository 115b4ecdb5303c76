"""The task model: one non-streamed question (a title, tags, follow-ups, search
queries), answered by ``TURNLOG_TASK_MODEL`` or else the turn's own model.

Its prompts start with ``### Task:`` (as Open WebUI's do), so an upstream's logs
tell task calls from answers at a glance. Whoever asks records the reply (an
``assembly.step`` or a ``background.result``), so a replay never asks again.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

from engine.json_types import JsonObject
from engine.ports import ModelCatalog, ModelClient, ModelRequest, TaskReply, UpstreamError
from engine.protocols.model_events import Finished, StreamFailed, TextDelta, UsageReport

# A task's answer is short JSON; this bounds a model that rambles.
TASK_MAX_TOKENS = 1000


class LiveTaskModel:
    """``engine.ports.TaskModel`` over the model catalog and the live model client."""

    def __init__(self, models: ModelCatalog, client: ModelClient, model: str) -> None:
        self._models = models
        self._client = client
        self._model = model

    async def ask(self, task: str, prompt: str) -> str:
        resolved = await self._models.resolve(self._model)
        if resolved is None:
            raise UpstreamError(f"task model {self._model!r} is not available", "model_not_found")
        request = ModelRequest(messages=[{"role": "user", "content": prompt}], params={"max_tokens": TASK_MAX_TOKENS})
        text: list[str] = []
        usage: JsonObject | None = None
        async for events in self._client.stream(resolved, request, _ids()):
            for event in events:
                if isinstance(event, TextDelta):
                    text.append(event.text)
                elif isinstance(event, UsageReport) or (isinstance(event, Finished) and event.usage):
                    usage = event.usage
                elif isinstance(event, StreamFailed):
                    raise UpstreamError(event.message, "upstream_failed")
        return TaskReply("".join(text), usage)


def _ids() -> Callable[[str], str]:
    """Ids for calls in a task reply (never used: the reply is read as text)."""
    counter = itertools.count(1)
    return lambda prefix: f"{prefix}_task_{next(counter)}"
