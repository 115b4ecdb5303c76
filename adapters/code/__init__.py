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

from pydantic import SecretStr
from sqlalchemy.engine import make_url

from adapters.code.jupyter import JupyterExecutor
from adapters.code.limits import CodeLimits
from adapters.code.sandbox import SYSTEM_FOLDERS, SandboxExecutor
from adapters.config import Settings
from engine.ports import CodeExecutor, NoCodeExecutor

log = logging.getLogger("turnlog.code")

__all__ = ["CodeLimits", "JupyterExecutor", "SandboxExecutor", "WeakSandboxRefused", "build_code_executor", "start_code_executor"]


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
    """Every path the service reads secrets or code from, hidden from the
    sandbox: the SQLite database's folder, the tools, filters and pipes folders, the
    ``--config`` file and the receipt key (each file, and its folder unless
    that is a system one such as ``/etc``, where the file alone is hidden)."""
    paths: list[str] = []
    url = make_url(settings.database_url)
    if url.get_backend_name() == "sqlite" and url.database and url.database != ":memory:":
        paths.append(os.path.dirname(os.path.abspath(url.database)))
    paths += [os.path.abspath(p) for p in (settings.tools_dir, settings.filters_dir, settings.pipes_dir) if p]
    for secret_file in (settings.config_path, settings.receipt_key):
        if secret_file:
            path = os.path.abspath(secret_file)
            paths.append(path)
            folder = os.path.dirname(path)
            if folder not in SYSTEM_FOLDERS:
                paths.append(folder)
    return paths


def secrets_held(settings: Settings) -> list[str]:
    """What this deployment keeps that the audit-hook fallback cannot hide from
    native code: the names of the settings holding secrets."""
    held = [name for name in ("config_path", "receipt_key") if getattr(settings, name)]
    held += [name for name, value in settings if isinstance(value, SecretStr) and value.get_secret_value()]
    if make_url(settings.database_url).password:
        held.append("database_url (a password)")
    if any(server.headers for server in settings.mcp_servers.values()):
        held.append("mcp_servers (headers)")
    if any(server.headers for server in settings.tool_servers.values()):
        held.append("tool_servers (headers)")
    return held


class WeakSandboxRefused(RuntimeError):
    """The sandbox fell back to the audit hook in a deployment with secrets."""


async def start_code_executor(executor: Any, settings: Settings | None = None) -> None:
    """Let an executor that has a ``start`` probe its isolation or server and
    log it. A sandbox on the audit-hook fallback in a deployment that holds
    secrets raises ``WeakSandboxRefused`` unless the operator opted in."""
    start = getattr(executor, "start", None)
    if start is None:
        return
    try:
        await start()
    except Exception as exc:  # noqa: BLE001 - the service runs on; code runs will report the failure
        log.error("code executor: cannot start: %s: %s", type(exc).__name__, exc)
        return
    report = getattr(executor, "report", None) or {}
    if settings is None or not report.get("hooks"):
        return
    held = secrets_held(settings)
    if not held:
        return
    if settings.code_allow_weak_sandbox:
        log.warning("code executor: the weak sandbox may reach %s (TURNLOG_CODE_ALLOW_WEAK_SANDBOX is set)", ", ".join(held))
        return
    raise WeakSandboxRefused(
        "the code sandbox has no namespaces on this host (only an audit hook, which native code gets past) "
        f"and this deployment holds secrets ({', '.join(held)}): give the service user namespaces or "
        "CAP_SYS_ADMIN, set TURNLOG_CODE_EXECUTOR=off or jupyter, or accept the risk with "
        "TURNLOG_CODE_ALLOW_WEAK_SANDBOX=1"
    )
