"""The server-tool catalog of a process: the modules of ``TURNLOG_TOOLS_DIR``.

Loaded once at start (a module that fails to import is logged and left out, so
one broken file does not take the others down).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from adapters.tools.loader import LoadError, ModuleTools, load_tools_dir, merge_tools

log = logging.getLogger("turnlog.tools")


class DirToolCatalog:
    """The modules of one or more folders; on a clashing tool id the earlier
    folder wins (an operator's ``TURNLOG_TOOLS_DIR`` over the demo's tools)."""

    def __init__(self, path: str | Path, *more: str | Path) -> None:
        self.modules: dict[str, ModuleTools] = {}
        self.errors: list[LoadError] = []
        for folder in (path, *more):
            modules, errors = load_tools_dir(folder)
            for error in errors:
                log.error("tool module %s not loaded: %s", error.path, error.message)
            self.errors.extend(errors)
            for tool_id, module in modules.items():
                self.modules.setdefault(tool_id, module)

    def known_ids(self) -> set[str]:
        return set(self.modules)

    def handles(self, tool_ids: Sequence[str]) -> dict[str, Any]:
        selected = {tid: self.modules[tid] for tid in tool_ids if tid in self.modules}
        merged, notes = merge_tools(selected)
        for note in notes:
            log.warning("%s: %s", note.path, note.message)
        return dict(merged)
