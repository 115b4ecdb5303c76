"""Load Open WebUI-style tool modules: ``class Tools`` whose public methods are tools.

Each ``*.py`` file of the tools directory is imported by path; its ``Tools``
class is instantiated once and every public method (sync or async) becomes a
``ToolSpec`` plus a ``MethodTool`` handle. The JSON schema comes from the type
hints, the descriptions from the docstring (first paragraph; ``:param x:``
lines). Parameters named like ``__user__`` are Open WebUI's injected
parameters: they never appear in the schema and are filled from the
``ToolContext``, so a model cannot spoof them.

A module that fails to import (or to instantiate) is reported in the returned
error list and skipped: one broken tool must not take the others down.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import importlib.util
import inspect
import json
import re
import sys
import traceback
import types
import typing
from collections import abc
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.tools.calls import IDEMPOTENT_ATTR, ToolContext, ToolHandle, ToolSpec

#: Injected parameters turnlog fills from the ToolContext.
RESERVED_PARAMS = frozenset({"__user__", "__messages__", "__files__", "__event_emitter__", "__metadata__", "__id__", "__call_id__"})


@dataclass(frozen=True)
class LoadError:
    path: str
    message: str


@dataclass
class MethodTool:
    """A ``ToolHandle`` over one method of a ``Tools`` instance."""

    spec: ToolSpec
    fn: Callable[..., Any]
    reserved: tuple[str, ...] = ()  # dunder parameters the method declares
    casts: dict[str, type] = field(default_factory=dict)  # parameter -> int | str

    async def __call__(self, args: dict[str, Any], ctx: ToolContext) -> Any:
        kwargs = {key: _cast(value, self.casts[key]) if key in self.casts else value for key, value in args.items()}
        for name in self.reserved:
            kwargs[name] = _reserved_value(name, ctx, self.spec.tool_id)
        if inspect.iscoroutinefunction(self.fn):
            return await self.fn(**kwargs)
        result = await asyncio.to_thread(self.fn, **kwargs)
        if inspect.isawaitable(result):
            result = await result
        return result


@dataclass
class ModuleTools:
    """The tools of one module file; ``tool_id`` is the file's stem."""

    tool_id: str
    path: str
    instance: Any
    tools: dict[str, MethodTool]


def _cast(value: Any, target: type) -> Any:
    """Open WebUI's casts: a str for an int parameter, a number for a str one."""
    if target is int and isinstance(value, str):
        return int(value)
    if target is str and isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    return value


def _reserved_value(name: str, ctx: ToolContext, tool_id: str) -> Any:
    return {
        "__user__": ctx.user,
        "__messages__": ctx.messages,
        "__files__": ctx.files,
        "__event_emitter__": ctx.emit,
        "__metadata__": ctx.metadata,
        "__id__": tool_id,
        "__call_id__": ctx.call_id,
    }.get(name)


# --------------------------------------------------------------------------
# Docstrings and type hints → JSON schema
# --------------------------------------------------------------------------

_PARAM_LINE = re.compile(r"^:param\s+(?:[^:]*\s)?(\w+)\s*:\s*(.*)$")


def parse_docstring(doc: str | None) -> tuple[str, dict[str, str]]:
    """The first paragraph and the ``:param name: text`` descriptions (continuation lines joined)."""
    if not doc:
        return "", {}
    lines = inspect.cleandoc(doc).splitlines()
    summary: list[str] = []
    for line in lines:
        if not line.strip() or line.lstrip().startswith(":"):
            break
        summary.append(line.strip())
    params: dict[str, str] = {}
    current: str | None = None
    for line in lines:
        stripped = line.strip()
        match = _PARAM_LINE.match(stripped)
        if match:
            current = match.group(1)
            params[current] = match.group(2).strip()
        elif current is not None and stripped and not stripped.startswith(":") and line[:1].isspace():
            params[current] = f"{params[current]} {stripped}".strip()
        else:
            current = None
    return " ".join(summary), params


_SCALARS: dict[Any, str] = {str: "string", int: "integer", float: "number", bool: "boolean", bytes: "string"}
_ARRAYS = (list, tuple, set, frozenset, abc.Sequence, abc.Set)


def _literal_type(values: tuple[Any, ...]) -> str | None:
    kinds = {_SCALARS.get(type(v)) for v in values}
    return kinds.pop() if len(kinds) == 1 and None not in kinds else None


def type_schema(tp: Any) -> tuple[dict[str, Any], bool]:
    """JSON schema of a type hint, and whether it admits ``None`` (→ not required)."""
    if tp is inspect.Parameter.empty or tp is Any:
        return {}, False
    if tp is None or tp is type(None):
        return {"type": "null"}, True
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is typing.Annotated:
        schema, nullable = type_schema(args[0])
        notes = [a for a in args[1:] if isinstance(a, str)]
        if notes:
            schema = {**schema, "description": " ".join(notes)}
        return schema, nullable
    if origin is typing.Union or origin is types.UnionType:
        rest = [a for a in args if a is not type(None)]
        nullable = len(rest) < len(args)
        if len(rest) == 1:
            schema, inner_nullable = type_schema(rest[0])
            return schema, nullable or inner_nullable
        return {"anyOf": [type_schema(a)[0] for a in rest]}, nullable
    if origin is typing.Literal:
        enum_schema: dict[str, Any] = {"enum": list(args)}
        kind = _literal_type(args)
        if kind:
            enum_schema = {"type": kind, **enum_schema}
        return enum_schema, None in args
    if tp in _SCALARS:
        return {"type": _SCALARS[tp]}, False
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        values = tuple(member.value for member in tp)
        schema = {"enum": list(values)}
        kind = _literal_type(values)
        return ({"type": kind, **schema} if kind else schema), False
    container = origin or tp
    if isinstance(container, type) and issubclass(container, _ARRAYS):
        schema = {"type": "array"}
        items = [a for a in args if a is not Ellipsis]
        if len(items) == 1 or (items and all(a == items[0] for a in items)):
            item_schema = type_schema(items[0])[0]
            if item_schema:
                schema["items"] = item_schema
        return schema, False
    if isinstance(container, type) and issubclass(container, abc.Mapping):
        schema = {"type": "object"}
        if len(args) == 2:
            value_schema = type_schema(args[1])[0]
            if value_schema:
                schema["additionalProperties"] = value_schema
        return schema, False
    model_schema = getattr(tp, "model_json_schema", None)  # a pydantic model
    if callable(model_schema):
        try:
            return model_schema(), False
        except Exception:
            return {"type": "object"}, False
    if dataclasses.is_dataclass(tp) or typing.is_typeddict(tp):
        return {"type": "object"}, False
    return {}, False


def _base_type(tp: Any) -> Any:
    """``Optional[int]`` / ``Annotated[int, …]`` → ``int`` (for the casts)."""
    origin = typing.get_origin(tp)
    if origin is typing.Annotated:
        return _base_type(typing.get_args(tp)[0])
    if origin is typing.Union or origin is types.UnionType:
        rest = [a for a in typing.get_args(tp) if a is not type(None)]
        return _base_type(rest[0]) if len(rest) == 1 else tp
    return tp


def _hints(fn: Callable[..., Any]) -> dict[str, Any]:
    """Resolved type hints; annotations that do not resolve count as missing."""
    try:
        return typing.get_type_hints(fn, include_extras=True)
    except Exception:
        pass
    resolved: dict[str, Any] = {}
    namespace = getattr(fn, "__globals__", {})
    for name, annotation in getattr(fn, "__annotations__", {}).items():
        if isinstance(annotation, str):
            try:
                annotation = eval(annotation, namespace)  # noqa: S307 - the operator's own tool code
            except Exception:
                continue
        resolved[name] = annotation
    return resolved


def _json_default(value: Any) -> tuple[bool, Any]:
    if value is None or value is inspect.Parameter.empty:
        return False, None
    if isinstance(value, enum.Enum):
        value = value.value
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False, None
    return True, value


def method_tool(fn: Callable[..., Any], *, name: str, tool_id: str, idempotent: bool = False, timeout: float | None = None) -> MethodTool:
    """A handle (and its spec) for one callable."""
    signature = inspect.signature(fn)
    hints = _hints(fn)
    description, param_docs = parse_docstring(inspect.getdoc(fn))
    properties: dict[str, Any] = {}
    required: list[str] = []
    reserved: list[str] = []
    casts: dict[str, type] = {}
    for param in signature.parameters.values():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        if param.name.startswith("__") and param.name.endswith("__"):
            if param.name in RESERVED_PARAMS:
                reserved.append(param.name)
            continue  # other dunders keep their defaults (or fail loudly when they have none)
        hint = hints.get(param.name, param.annotation)
        schema, nullable = type_schema(hint)
        schema = dict(schema)
        if param.name in param_docs and param_docs[param.name]:
            schema["description"] = param_docs[param.name]
        has_default, default = _json_default(param.default)
        if has_default:
            schema["default"] = default
        properties[param.name] = schema
        if param.default is param.empty and not nullable:
            required.append(param.name)
        base = _base_type(hint)
        if base is int or base is str:
            casts[param.name] = base
    parameters: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        parameters["required"] = required
    spec = ToolSpec(
        name=name,
        description=description or name,
        parameters=parameters,
        tool_id=tool_id,
        kind="server",
        idempotent=idempotent or getattr(fn, IDEMPOTENT_ATTR, False) is True,
        timeout=timeout,
    )
    return MethodTool(spec=spec, fn=fn, reserved=tuple(reserved), casts=casts)


# --------------------------------------------------------------------------
# Modules
# --------------------------------------------------------------------------


def _public_methods(cls: type) -> list[str]:
    names: list[str] = []
    for klass in cls.__mro__:
        if klass is object:
            continue
        for name, attr in vars(klass).items():
            if name.startswith("_") or name in names:
                continue
            if isinstance(attr, (staticmethod, classmethod)) or inspect.isfunction(attr):
                names.append(name)
    return names


def _timeout(cls: type) -> float | None:
    value = getattr(cls, "timeout", None)
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
        return float(value)
    return None


def _describe(exc: BaseException) -> str:
    return "".join(traceback.format_exception_only(type(exc), exc)).strip()


def import_file(path: Path, module_name: str) -> types.ModuleType:
    """Import a Python file as ``module_name`` (registered in ``sys.modules``,
    where dataclasses and pydantic look it up; unregistered if it fails)."""
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(module_name, None)
        raise
    return module


def load_module_tools(path: Path) -> ModuleTools:
    """Import one tool file and build its handles; raises on any failure."""
    tool_id = path.stem
    module = import_file(path, f"turnlog_tool_{tool_id}")
    cls = getattr(module, "Tools", None)
    if not isinstance(cls, type):
        raise LookupError("module defines no class Tools")
    instance = cls()
    all_idempotent = getattr(cls, "idempotent", False) is True
    timeout = _timeout(cls)
    tools: dict[str, MethodTool] = {}
    for name in _public_methods(cls):
        tools[name] = method_tool(getattr(instance, name), name=name, tool_id=tool_id, idempotent=all_idempotent, timeout=timeout)
    return ModuleTools(tool_id=tool_id, path=str(path), instance=instance, tools=tools)


def load_tools_dir(path: str | Path) -> tuple[dict[str, ModuleTools], list[LoadError]]:
    """Every ``*.py`` tool module of a directory (files starting with ``_`` or ``.`` skipped).

    Returns the modules by tool id and the errors of those that could not be
    loaded; it never raises for a bad module.
    """
    folder = Path(path)
    if not folder.is_dir():
        return {}, [LoadError(str(folder), "tools directory does not exist")]
    modules: dict[str, ModuleTools] = {}
    errors: list[LoadError] = []
    for file in sorted(folder.glob("*.py")):
        if file.name.startswith(("_", ".")):
            continue
        try:
            modules[file.stem] = load_module_tools(file)
        except Exception as exc:  # SyntaxError, ImportError, errors in Tools() ...
            errors.append(LoadError(str(file), _describe(exc)))
    return modules, errors


def merge_tools(modules: Mapping[str, ModuleTools]) -> tuple[dict[str, ToolHandle], list[LoadError]]:
    """One name → handle table for the model. A name already taken by an earlier
    module (by tool id order) is renamed ``<tool_id>_<name>`` and reported."""
    merged: dict[str, ToolHandle] = {}
    notes: list[LoadError] = []
    for tool_id in sorted(modules):
        for name, handle in modules[tool_id].tools.items():
            if name in merged:
                renamed = f"{tool_id}_{name}"
                notes.append(LoadError(modules[tool_id].path, f"tool {name!r} already defined; exposed as {renamed!r}"))
                handle = dataclasses.replace(handle, spec=dataclasses.replace(handle.spec, name=renamed))
                name = renamed
            merged[name] = handle
    return merged, notes
