"""Real ``turnlog serve`` processes for tests that kill, pause or run several of them."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parents[1]


def cli(db: Path | str, *args: str) -> subprocess.CompletedProcess[str]:
    """The ``turnlog`` CLI on a SQLite file or a database URL."""
    url = db if isinstance(db, str) else f"sqlite+aiosqlite:///{db}"
    env = {**os.environ, "TURNLOG_DATABASE_URL": url}
    return subprocess.run([sys.executable, "-m", "adapters.cli", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """``turnlog serve`` on a free port; ``db`` is a SQLite file or a database URL.

    ``upstream_url`` None: no upstream configured (not even one inherited from
    the environment); ``args``: more ``serve`` arguments (e.g. ``--demo``)."""

    def __init__(
        self,
        db: Path | str,
        upstream_url: str | None,
        *,
        auto_resume: bool,
        log_dir: Path | None = None,
        args: tuple[str, ...] = (),
        **env_extra: str,
    ) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        database_url = db if isinstance(db, str) else f"sqlite+aiosqlite:///{db}"
        log_dir = log_dir or (db.parent if isinstance(db, Path) else Path("."))
        env = {
            **os.environ,
            **env_extra,
            "TURNLOG_DATABASE_URL": database_url,
            "TURNLOG_OPENAI_API_KEY": "sk-test",
            "TURNLOG_LEASE_SECONDS": "1",
            "TURNLOG_AUTO_RESUME": "true" if auto_resume else "false",
        }
        if upstream_url is None:
            env.pop("TURNLOG_OPENAI_BASE_URL", None)
            env.pop("TURNLOG_OLLAMA_BASE_URL", None)
        else:
            env["TURNLOG_OPENAI_BASE_URL"] = upstream_url
        self.log_path = log_dir / f"serve-{self.port}.log"
        self.log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "adapters.cli", "serve", "--port", str(self.port), *args],
            cwd=ROOT, env=env, stdout=self.log, stderr=subprocess.STDOUT,
        )

    async def ready(self, http: aiohttp.ClientSession) -> None:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, "turnlog serve exited"
            try:
                async with http.get(self.url + "/healthz") as resp:
                    if resp.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.05)
        raise AssertionError("turnlog serve did not become ready")

    def kill9(self) -> None:
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.log.close()


async def get_json(http: aiohttp.ClientSession, url: str) -> dict:
    async with http.get(url) as resp:
        assert resp.status == 200, await resp.text()
        return await resp.json()


async def wait_for(http: aiohttp.ClientSession, url: str, predicate, timeout: float = 20.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        body = await get_json(http, url)
        if predicate(body):
            return body
        assert time.monotonic() < deadline, f"timed out; last: {body.get('status')}"
        await asyncio.sleep(0.05)


