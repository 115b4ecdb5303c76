"""The ``engine.ports.Filters`` port over the filter modules of ``TURNLOG_FILTERS_DIR``.

Each hook runs the filters that define it, in priority order, each on the
previous one's result. A filter always works on a deep copy: the caller's
body is never mutated, ``changed`` is an exact before/after comparison, and a
filter that raises halfway through editing in place leaves nothing behind
when it is skipped.

Returning None is accepted (Open WebUI requires the body back and breaks on
None): the result is then the copy as the hook left it, so a hook that only
edits in place works, and one that does neither leaves it unchanged. Any
other non-dict result is an error of that filter.

Sync ``inlet``/``outlet`` hooks are called on the event loop, as Open WebUI
does: they run once per turn, and calling them directly keeps one filter
instance from running in two threads at once.
"""

from __future__ import annotations

import copy
import inspect
import logging
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from adapters.filters.loader import Hook, LoadedFilter, describe, load_filters_dir
from adapters.tools.loader import LoadError
from engine.ports import FilterError, FilterRun

log = logging.getLogger("turnlog.filters")


def _result(result: Any, work: dict[str, Any], hook: str, data_param: str) -> dict[str, Any]:
    if result is None:
        return work
    if isinstance(result, dict):
        return result
    if inspect.isawaitable(result):
        close = getattr(result, "close", None)
        if callable(close):
            close()  # no "never awaited" warning
        raise TypeError(f"{hook} returned an awaitable, not the {data_param} (a stream hook must be synchronous)")
    raise TypeError(f"{hook} returned {type(result).__name__}, not the {data_param} dict")


class DirFilters:
    """The filters of one folder, loaded once at start (``engine.ports.Filters``)."""

    def __init__(self, path: str | Path, valves: Mapping[str, Mapping[str, Any]] | None = None) -> None:
        # ``global = false`` in a filter's table (not a valve): opt-in, it runs
        # only on the turns that name it (``filter_ids``, a preset's filters).
        tables = {name: dict(table) for name, table in (valves or {}).items()}
        optional = {name for name, table in tables.items() if table.pop("global", True) is False}
        tables = {name: table for name, table in tables.items() if table or name not in (valves or {}) or "global" not in (valves or {})[name]}
        self.loaded: list[LoadedFilter]
        self.errors: list[LoadError]
        self.loaded, self.errors = load_filters_dir(path, tables)
        for error in self.errors:
            log.error("filter %s not loaded: %s", error.path, error.message)
        self._optional = frozenset(f.filter_id for f in self.loaded if f.filter_id in optional)
        self._select(())

    def _select(self, filter_ids: Iterable[str]) -> None:
        chosen = set(filter_ids)
        self.filters = [f for f in self.loaded if f.filter_id not in self._optional or f.filter_id in chosen]
        self._by_hook: dict[str, list[LoadedFilter]] = {hook: [f for f in self.filters if hook in f.hooks] for hook in ("inlet", "stream", "outlet")}
        self._hooks = frozenset(hook for hook, filters in self._by_hook.items() if filters)

    def optional_ids(self) -> frozenset[str]:
        """The opt-in filters (``[filters.NAME] global = false``) that loaded."""
        return self._optional

    def for_turn(self, filter_ids: Iterable[str]) -> DirFilters:
        """The global filters and the opt-in ones ``filter_ids`` names (``engine.ports.Filters``)."""
        wanted = set(filter_ids) & self._optional
        if not wanted:
            return self
        chosen = copy.copy(self)
        chosen._select(wanted)
        return chosen

    def hooks(self) -> frozenset[str]:
        return self._hooks

    # -- calling a hook ---------------------------------------------------------

    @staticmethod
    def _kwargs(f: LoadedFilter, hook: Hook, work: dict[str, Any], body: dict[str, Any] | None, user: dict[str, Any] | None) -> dict[str, Any]:
        kwargs: dict[str, Any] = {hook.data_param: work}
        for name in hook.reserved:
            kwargs[name] = _reserved_value(name, f, body, user)
        return kwargs

    async def _call(self, f: LoadedFilter, name: str, current: dict[str, Any], user: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        """The hook's result on a copy of ``current`` and whether it differs; raises what the hook raises."""
        hook = f.hooks[name]
        work = copy.deepcopy(current)
        kwargs = self._kwargs(f, hook, work, current, user)
        if hook.is_async:
            result = await hook.fn(**kwargs)
        else:
            result = hook.fn(**kwargs)
            if inspect.isawaitable(result):  # a sync def that returns a coroutine
                result = await result
        new = _result(result, work, name, hook.data_param)
        return new, new != current

    async def inlet(self, body: dict[str, Any], user: dict[str, Any]) -> tuple[dict[str, Any], list[FilterRun]]:
        runs: list[FilterRun] = []
        for f in self._by_hook["inlet"]:
            try:
                body, changed = await self._call(f, "inlet", body, user)
            except Exception as exc:
                raise FilterError(f.filter_id, describe(exc)) from exc
            runs.append(FilterRun(f.filter_id, changed=changed, file_handler=f.file_handler))
        return body, runs

    def stream(self, event: dict[str, Any]) -> tuple[dict[str, Any], list[FilterRun]]:
        runs: list[FilterRun] = []
        for f in self._by_hook["stream"]:
            hook = f.hooks["stream"]
            work = copy.deepcopy(event)
            try:
                new = _result(hook.fn(**self._kwargs(f, hook, work, None, None)), work, "stream", "event")
            except Exception as exc:
                runs.append(self._skipped(f, "stream", exc))
                continue
            runs.append(FilterRun(f.filter_id, changed=new != event))
            event = new
        return event, runs

    async def outlet(self, body: dict[str, Any], user: dict[str, Any]) -> tuple[dict[str, Any], list[FilterRun]]:
        runs: list[FilterRun] = []
        for f in self._by_hook["outlet"]:
            try:
                new, changed = await self._call(f, "outlet", body, user)
            except Exception as exc:
                runs.append(self._skipped(f, "outlet", exc))
                continue
            runs.append(FilterRun(f.filter_id, changed=changed))
            body = new
        return body, runs

    @staticmethod
    def _skipped(f: LoadedFilter, hook: str, exc: Exception) -> FilterRun:
        message = describe(exc)
        log.warning("filter %s: %s raised, skipped: %s", f.filter_id, hook, message)
        return FilterRun(f.filter_id, error=message)


def _reserved_value(name: str, f: LoadedFilter, body: dict[str, Any] | None, user: dict[str, Any] | None) -> Any:
    """What turnlog knows of Open WebUI's reserved parameters (None for the rest).

    Fresh values per call: a filter that edits its ``__user__`` or
    ``__metadata__`` does not change what the next filter sees."""
    if name == "__id__":
        return f.filter_id
    if name == "__user__":
        if user is None:
            return None
        given = dict(user)
        if f.user_valves is not None:
            given["valves"] = f.user_valves.model_copy() if hasattr(f.user_valves, "model_copy") else f.user_valves
        return given
    if body is None:
        return None
    model = body.get("model")
    chat_id = body.get("chat_id")
    if name == "__model__":
        return {"id": model} if isinstance(model, str) else None
    if name == "__chat_id__":
        return chat_id
    if name == "__metadata__":
        metadata = {"user_id": (user or {}).get("id"), "chat_id": chat_id, "model": model}
        return {key: value for key, value in metadata.items() if value is not None}
    return None
