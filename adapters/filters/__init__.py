"""Filter adapters: Open WebUI-style ``class Filter`` modules from ``TURNLOG_FILTERS_DIR``."""

from __future__ import annotations

import logging

from adapters.config import Settings
from adapters.filters.loader import LoadedFilter, load_filters_dir
from adapters.filters.pipeline import DirFilters
from engine.ports import Filters, NoFilters

log = logging.getLogger("turnlog.filters")


def load_filters(settings: Settings) -> Filters:
    """The process's filters: the modules of ``settings.filters_dir`` with the
    valves of ``settings.filters``, or ``NoFilters`` when no folder is set.

    Loaded once, at start; a module that fails to load is logged (and kept in
    ``DirFilters.errors``) and the others still run."""
    if not settings.filters_dir:
        if settings.filters:
            log.warning("[filters.*] tables are configured but TURNLOG_FILTERS_DIR is not set: ignored")
        return NoFilters()
    return DirFilters(settings.filters_dir, settings.filters)


__all__ = ["DirFilters", "LoadedFilter", "load_filters", "load_filters_dir"]
