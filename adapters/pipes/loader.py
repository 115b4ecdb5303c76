"""Load Open WebUI *Pipe* modules: ``class Pipe`` with ``pipe(self, body, ...)``.

The conventions are Open WebUI's, so that its pipes run unchanged, and the
loading is the filters folder's (``adapters.filters.loader``):

- each ``*.py`` file of the folder is one pipe, its id the file stem (files
  starting with ``_`` or ``.`` are skipped); ``Pipe`` is instantiated once;
- an optional nested ``class Valves(BaseModel)`` gets its values from the
  TOML table ``[pipes.ID]`` (or ``TURNLOG_PIPES`` JSON), validated at load:
  a bad value makes the pipe a load error, never a failure at its first turn;
- ``pipes`` (a method, sync or async, or a list) makes the module several
  models, ``ID.SUB_ID`` each; without it the pipe is the one model ``ID``.
  Its ``name`` attribute is the model's name;
- ``pipe`` may be sync or async, and return a string, a dict, or a sync or
  async generator; it gets ``body`` by keyword and, of the reserved
  parameters (``RESERVED_PARAMS``), those it declares. Any other parameter
  must have a default, else the pipe is a load error.

A module that fails to import, has no ``Pipe`` class, raises in ``Pipe()``
or has invalid valves is reported in the returned error list and skipped.
"""

from __future__ import annotations

import inspect
import logging
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from adapters.filters.loader import InvalidFilter, build_valves, describe, user_valves
from adapters.tools.loader import LoadError, import_file

log = logging.getLogger("turnlog.pipes")

#: Open WebUI's injected parameters for pipes. turnlog fills ``__user__``,
#: ``__metadata__``, ``__messages__``, ``__model__``, ``__chat_id__``,
#: ``__message_id__``, ``__files__``, ``__event_emitter__`` and ``__id__``;
#: the others exist only inside Open WebUI (its UI's questions, tasks run by
#: a pipe, its request, OAuth tokens, its tools) and are passed as None, so a
#: pipe that tests them before use still runs.
RESERVED_PARAMS = frozenset(
    {
        "__user__",
        "__id__",
        "__metadata__",
        "__messages__",
        "__model__",
        "__chat_id__",
        "__session_id__",
        "__message_id__",
        "__files__",
        "__event_emitter__",
        "__event_call__",
        "__task__",
        "__task_body__",
        "__tools__",
        "__oauth_token__",
        "__request__",
    }
)


@dataclass
class LoadedPipe:
    """One pipe module, instantiated, with its valves applied."""

    pipe_id: str
    path: str
    instance: Any
    fn: Callable[..., Any]
    reserved: tuple[str, ...]  # the reserved parameters ``pipe`` declares
    user_valves: Any = None  # ``UserValves()`` with its defaults, if it has one that validates

    @property
    def name(self) -> str:
        name = getattr(self.instance, "name", None)
        return name if isinstance(name, str) and name else self.pipe_id


def _signature(fn: Any) -> tuple[str, ...]:
    """Check ``pipe``'s signature now rather than fail on every turn; its reserved parameters."""
    if not callable(fn):
        raise InvalidFilter("Pipe.pipe is not a method")
    params = inspect.signature(fn).parameters
    var_keyword = any(p.kind is p.VAR_KEYWORD for p in params.values())
    body = params.get("body")
    if (body is None and not var_keyword) or (body is not None and body.kind is body.POSITIONAL_ONLY):
        raise InvalidFilter("Pipe.pipe must take a parameter named 'body' (it is passed by keyword)")
    reserved: list[str] = []
    for param in params.values():
        if param.name == "body" or param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        if param.name in RESERVED_PARAMS:
            reserved.append(param.name)
        elif param.default is param.empty:
            raise InvalidFilter(f"Pipe.pipe requires parameter {param.name!r}, which turnlog does not provide")
    return tuple(reserved)


def load_pipe_module(path: Path, valves: Mapping[str, Any] | None = None) -> LoadedPipe:
    """Import one pipe file, instantiate its ``Pipe`` and apply its valves; raises on any failure."""
    pipe_id = path.stem
    module_name = f"turnlog_pipe_{pipe_id}"
    module = import_file(path, module_name)
    try:
        cls = getattr(module, "Pipe", None)
        if not isinstance(cls, type):
            raise InvalidFilter("module defines no class Pipe")
        has_valves = isinstance(getattr(cls, "Valves", None), type)
        if valves is not None and not has_valves:
            log.warning("[pipes.%s]: the pipe has no Valves class; the table is ignored", pipe_id)
        configured = build_valves(cls, pipe_id, valves, "pipes") if has_valves and valves is not None else None
        instance = cls()
        if configured is not None:
            instance.valves = configured
        elif has_valves and getattr(instance, "valves", None) is None:
            instance.valves = build_valves(cls, pipe_id, None, "pipes")
        fn: Any = getattr(instance, "pipe", None)
        return LoadedPipe(pipe_id=pipe_id, path=str(path), instance=instance, fn=fn, reserved=_signature(fn), user_valves=user_valves(cls))
    except BaseException:
        sys.modules.pop(module_name, None)
        raise


def load_pipes_dir(path: str | Path, valves: Mapping[str, Mapping[str, Any]] | None = None) -> tuple[dict[str, LoadedPipe], list[LoadError]]:
    """Every pipe module of a directory by id, and the errors of those that
    could not be loaded (and of tables naming no module); never raises for a bad module."""
    folder = Path(path)
    valves = valves or {}
    if not folder.is_dir():
        return {}, [LoadError(str(folder), "pipes directory does not exist")]
    pipes: dict[str, LoadedPipe] = {}
    errors: list[LoadError] = []
    for file in sorted(folder.glob("*.py")):
        if file.name.startswith(("_", ".")):
            continue
        try:
            pipes[file.stem] = load_pipe_module(file, valves.get(file.stem))
        except Exception as exc:  # SyntaxError, ImportError, invalid valves, errors in Pipe() ...
            errors.append(LoadError(str(file), describe(exc)))
    seen = {f.stem for f in folder.glob("*.py")}
    for name in sorted(set(valves) - seen):
        errors.append(LoadError(f"[pipes.{name}]", f"no pipe module {name}.py in {folder}"))
    return pipes, errors
