"""Pipes: Open WebUI *Pipe* modules from ``TURNLOG_PIPES_DIR``, served as models."""

from __future__ import annotations

import logging

from adapters.config import Settings
from adapters.pipes.loader import LoadedPipe, load_pipes_dir
from adapters.pipes.provider import PipeProvider

log = logging.getLogger("turnlog.pipes")


def load_pipes(settings: Settings) -> PipeProvider | None:
    """The process's pipes as a model provider, or None when no folder is set.

    Loaded once, at start; a module that fails to load is logged and the
    others are still served."""
    if not settings.pipes_dir:
        if settings.pipes:
            log.warning("[pipes.*] tables are configured but TURNLOG_PIPES_DIR is not set: ignored")
        return None
    pipes, errors = load_pipes_dir(settings.pipes_dir, settings.pipes)
    for error in errors:
        log.error("pipe %s not loaded: %s", error.path, error.message)
    return PipeProvider(pipes, settings.pipes_dir)


__all__ = ["LoadedPipe", "PipeProvider", "load_pipes", "load_pipes_dir"]
