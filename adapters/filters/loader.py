"""Load Open WebUI-style filter modules: ``class Filter`` with ``inlet`` / ``stream`` / ``outlet`` hooks.

Open WebUI's conventions, so that its filters run unchanged:

- each ``*.py`` file of the folder is one filter, its id the file stem (files
  starting with ``_`` or ``.`` are skipped); the module's ``Filter`` class is
  instantiated once, at load;
- an optional nested ``class Valves(BaseModel)`` holds the operator's settings.
  Its values come from the TOML table ``[filters.ID]``, validated here: a bad
  value makes the filter a load error (reported, the filter skipped), never a
  crash at the first turn. Open WebUI filters do ``self.valves = self.Valves()``
  in ``__init__``, so the validated valves replace ``instance.valves`` *after*
  construction (and a filter without a table keeps what ``__init__`` made, or
  gets ``Valves()`` if it made none). ``UserValves`` have no per-user store
  here: a hook declaring ``__user__`` gets ``__user__["valves"] = UserValves()``
  (its defaults) when they validate, as Open WebUI would for a user who never
  changed them;
- order: ``valves.priority`` (else a ``priority`` attribute of the filter,
  else 0) ascending, then the id — Open WebUI's ``(priority, id)`` sort;
- each hook is optional. ``inlet(self, body, ...)`` and ``outlet(self, body,
  ...)`` may be sync or async; ``stream(self, event, ...)`` must be sync: the
  engine calls it once per delta on the streaming path, where it cannot await,
  so an ``async def stream`` is rejected at load with an error saying so;
- a hook gets the data by keyword (``body=`` / ``event=``, as Open WebUI calls
  it) and, of the reserved parameters (``RESERVED_PARAMS``), those it declares.
  Any other parameter must have a default, else the filter is a load error:
  it would fail on every call otherwise.

A module that fails to import, has no ``Filter`` class, raises in
``Filter()`` or has invalid valves is reported in the returned error list and
skipped: one broken filter must not take the others down.
"""

from __future__ import annotations

import inspect
import logging
import sys
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from adapters.tools.loader import LoadError, import_file

log = logging.getLogger("turnlog.filters")

#: The hooks a filter may define, and the keyword its data is passed as.
HOOKS: dict[str, str] = {"inlet": "body", "stream": "event", "outlet": "body"}

#: Open WebUI's injected parameters for filters. turnlog fills ``__user__``,
#: ``__id__``, ``__metadata__``, ``__model__`` and ``__chat_id__`` (inlet and
#: outlet; the port gives ``stream`` only the event); the others exist only
#: inside Open WebUI (its request, its UI's event channel, OAuth tokens) and are
#: passed as None, so a filter that tests them before use still runs.
RESERVED_PARAMS = frozenset(
    {
        "__user__",
        "__id__",
        "__metadata__",
        "__model__",
        "__chat_id__",
        "__message_id__",
        "__event_emitter__",
        "__event_call__",
        "__oauth_token__",
        "__request__",
        "__selected_option__",
    }
)


class InvalidFilter(Exception):
    """A filter module that loaded but cannot be used (its message says why)."""


@dataclass(frozen=True)
class Hook:
    """One hook of a filter instance and how to call it."""

    fn: Callable[..., Any]
    data_param: str  # "body" or "event"
    reserved: tuple[str, ...]  # the reserved parameters it declares
    is_async: bool


@dataclass
class LoadedFilter:
    """One filter module, instantiated, with its valves applied."""

    filter_id: str
    path: str
    instance: Any
    priority: float
    hooks: dict[str, Hook]
    file_handler: bool  # ``file_handler = True``: it handles the request's files itself
    user_valves: Any = None  # ``UserValves()`` with its defaults, if it has one that validates


def describe(exc: BaseException) -> str:
    """One message for a load error or a failed hook (the exception's type and text)."""
    if isinstance(exc, InvalidFilter):
        return str(exc)
    return "".join(traceback.format_exception_only(type(exc), exc)).strip()


def _validation_message(exc: ValidationError) -> str:
    parts = []
    for error in exc.errors():
        where = ".".join(str(p) for p in error.get("loc", ())) or "(valves)"
        got = f" (got {error['input']!r})" if "input" in error and error.get("type") != "missing" else ""
        parts.append(f"{where}: {error.get('msg', 'invalid')}{got}")
    return "; ".join(parts)


def build_valves(cls: type, filter_id: str, table: Mapping[str, Any] | None, section: str = "filters") -> Any:
    """``cls.Valves`` built from the TOML table ``[section.ID]`` (or its
    defaults); raises ``InvalidFilter``. Pipes' valves are built the same way."""
    valves_cls = cls.Valves  # type: ignore[attr-defined]
    values = dict(table or {})
    fields = getattr(valves_cls, "model_fields", None)
    if isinstance(fields, dict):
        known = set(fields) | {f.alias for f in fields.values() if getattr(f, "alias", None)}
        unknown = sorted(set(values) - known)
        if unknown:
            # Pydantic ignores them; say so, since a misspelt valve otherwise keeps its default silently.
            log.warning("[%s.%s]: unknown valves %s ignored (its Valves has %s)", section, filter_id, unknown, sorted(fields))
    try:
        if hasattr(valves_cls, "model_validate"):
            return valves_cls.model_validate(values)
        return valves_cls(**values)
    except ValidationError as exc:
        raise InvalidFilter(f"invalid valves in [{section}.{filter_id}]: {_validation_message(exc)}") from exc
    except Exception as exc:
        raise InvalidFilter(f"invalid valves in [{section}.{filter_id}]: {describe(exc)}") from exc


def _priority(instance: Any) -> float:
    """Open WebUI reads ``valves.priority``; a plain ``priority`` attribute is the fallback."""
    valves = getattr(instance, "valves", None)
    value = getattr(valves, "priority", None) if valves is not None else None
    if value is None:
        value = getattr(instance, "priority", 0)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidFilter(f"priority must be a number, not {value!r}")
    return float(value)


def _hook(name: str, fn: Any) -> Hook:
    """Check a hook's signature now rather than fail on every turn; raises ``InvalidFilter``."""
    if not callable(fn):
        raise InvalidFilter(f"Filter.{name} is not a method")
    data_param = HOOKS[name]
    if inspect.isasyncgenfunction(fn):
        raise InvalidFilter(f"Filter.{name} is an async generator; it must return the {data_param}")
    is_async = inspect.iscoroutinefunction(fn)
    if name == "stream" and is_async:
        raise InvalidFilter(
            "Filter.stream is async: stream hooks run once per delta on the streaming path and must be synchronous (def stream(self, event): ...)"
        )
    params = inspect.signature(fn).parameters
    var_keyword = any(p.kind is p.VAR_KEYWORD for p in params.values())
    data = params.get(data_param)
    if (data is None and not var_keyword) or (data is not None and data.kind is data.POSITIONAL_ONLY):
        raise InvalidFilter(f"Filter.{name} must take a parameter named {data_param!r} (it is passed by keyword)")
    reserved: list[str] = []
    for param in params.values():
        if param.name == data_param or param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        if param.name in RESERVED_PARAMS:
            reserved.append(param.name)
        elif param.default is param.empty:
            raise InvalidFilter(f"Filter.{name} requires parameter {param.name!r}, which turnlog does not provide")
    return Hook(fn=fn, data_param=data_param, reserved=tuple(reserved), is_async=is_async)


def user_valves(cls: type) -> Any:
    user_valves_cls = getattr(cls, "UserValves", None)
    if not isinstance(user_valves_cls, type):
        return None
    try:
        return user_valves_cls()
    except Exception:
        return None  # required user valves: there is no per-user store to fill them from


def load_filter_module(path: Path, valves: Mapping[str, Any] | None = None) -> LoadedFilter:
    """Import one filter file, instantiate its ``Filter`` and apply its valves; raises on any failure."""
    filter_id = path.stem
    module_name = f"turnlog_filter_{filter_id}"
    module = import_file(path, module_name)
    try:
        cls = getattr(module, "Filter", None)
        if not isinstance(cls, type):
            raise InvalidFilter("module defines no class Filter")
        has_valves = isinstance(getattr(cls, "Valves", None), type)
        configured = build_valves(cls, filter_id, valves) if has_valves and valves is not None else None
        if valves is not None and not has_valves:
            log.warning("[filters.%s]: the filter has no Valves class; the table is ignored", filter_id)
        instance = cls()
        if configured is not None:
            instance.valves = configured
        elif has_valves and getattr(instance, "valves", None) is None:
            instance.valves = build_valves(cls, filter_id, None)
        hooks = {name: _hook(name, getattr(instance, name)) for name in HOOKS if getattr(instance, name, None) is not None}
        return LoadedFilter(
            filter_id=filter_id,
            path=str(path),
            instance=instance,
            priority=_priority(instance),
            hooks=hooks,
            file_handler=bool(getattr(instance, "file_handler", False)),
            user_valves=user_valves(cls),
        )
    except BaseException:
        sys.modules.pop(module_name, None)
        raise


def load_filters_dir(path: str | Path, valves: Mapping[str, Mapping[str, Any]] | None = None) -> tuple[list[LoadedFilter], list[LoadError]]:
    """Every filter module of a directory, in run order (priority, then id).

    ``valves`` are the ``[filters.ID]`` tables of the configuration. Returns the
    filters and the errors of those that could not be loaded (and of tables
    naming no module, a likely typo); it never raises for a bad module.
    """
    folder = Path(path)
    valves = valves or {}
    if not folder.is_dir():
        return [], [LoadError(str(folder), "filters directory does not exist")]
    filters: list[LoadedFilter] = []
    errors: list[LoadError] = []
    seen: set[str] = set()
    for file in sorted(folder.glob("*.py")):
        if file.name.startswith(("_", ".")):
            continue
        seen.add(file.stem)
        try:
            filters.append(load_filter_module(file, valves.get(file.stem)))
        except Exception as exc:  # SyntaxError, ImportError, invalid valves, errors in Filter() ...
            errors.append(LoadError(str(file), describe(exc)))
    for name in sorted(set(valves) - seen):
        errors.append(LoadError(f"[filters.{name}]", f"no filter module {name}.py in {folder}"))
    filters.sort(key=lambda f: (f.priority, f.filter_id))
    return filters, errors
