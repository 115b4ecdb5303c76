"""Code executors: the ``CodeExecutor`` port's adapters.

* ``sandbox`` (default): a local, isolated Python process per run
  (``adapters.code.sandbox``).
* ``jupyter``: a kernel per run on a Jupyter server (``adapters.code.jupyter``).
* ``off``: the engine's ``NoCodeExecutor`` (the model is told none is configured).
"""

from __future__ import annotations

import logging
import os
from typing import Any

from sqlalchemy.engine import make_url

from adapters.code.jupyter import JupyterExecutor
from adapters.code.limits import CodeLimits
from adapters.code.sandbox import SandboxExecutor
from adapters.config import Settings
from engine.ports import CodeExecutor, NoCodeExecutor

log = logging.getLogger("turnlog.code")

__all__ = ["CodeLimits", "JupyterExecutor", "SandboxExecutor", "build_code_executor", "start_code_executor"]


def build_code_executor(settings: Settings) -> CodeExecutor:
    """The executor ``TURNLOG_CODE_EXECUTOR`` names, with the configured limits."""
    limits = CodeLimits.from_settings(settings)
    if settings.code_executor == "off":
        return NoCodeExecutor()
    if settings.code_executor == "jupyter":
        if not settings.jupyter_url:
            raise ValueError("TURNLOG_CODE_EXECUTOR=jupyter needs TURNLOG_JUPYTER_URL")
        token = settings.jupyter_token.get_secret_value() if settings.jupyter_token else None
        return JupyterExecutor(settings.jupyter_url, token, limits)
    return SandboxExecutor(
        limits,
        python=settings.code_sandbox_python,
        uid_base=settings.code_sandbox_uid,
        hide=[*service_paths(settings), *settings.code_hide_paths],
        max_concurrent=settings.code_max_concurrent,
    )


def service_paths(settings: Settings) -> list[str]:
    """The service's own data and code folders, hidden from the sandbox: the
    SQLite database's folder, the tools and filters folders."""
    paths: list[str] = []
    url = make_url(settings.database_url)
    if url.get_backend_name() == "sqlite" and url.database and url.database != ":memory:":
        paths.append(os.path.dirname(os.path.abspath(url.database)))
    paths += [p for p in (settings.tools_dir, settings.filters_dir) if p]
    return paths


async def start_code_executor(executor: Any) -> None:
    """Let an executor that has a ``start`` probe its isolation or server and log it."""
    start = getattr(executor, "start", None)
    if start is None:
        return
    try:
        await start()
    except Exception as exc:  # noqa: BLE001 - the service runs on; code runs will report the failure
        log.error("code executor: cannot start: %s: %s", type(exc).__name__, exc)
