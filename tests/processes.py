"""Real ``turnlog serve`` processes for tests that kill, pause or run several of them.

``gate=True`` (``Server``, ``CliRun``) starts the command behind ``tests.gate``:
it imports everything, then waits; :func:`release_together` opens the gates of
several processes at once, so that they really do start together.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Protocol

import aiohttp

from tests.gate import WAITING
from tests.polling import until

ROOT = Path(__file__).resolve().parents[1]


def turnlog_command(*args: str, gate: bool = False, module: str = "adapters.cli") -> list[str]:
    """``python -m adapters.cli ARGS`` (or another entry point taking the
    same arguments, ``module``), or the same behind ``tests.gate``."""
    return [sys.executable, "-m", "tests.gate" if gate else module, *args]


def _tail(path: Path, lines: int = 30) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


class Gated(Protocol):
    proc: subprocess.Popen[bytes]
    log_path: Path


async def release_together(processes: Sequence[Gated], timeout: float = 30.0) -> None:
    """Wait until every process (started with ``gate=True``) is at its gate,
    then open all the gates, one right after the other."""
    deadline = time.monotonic() + timeout
    for p in processes:
        while True:
            if WAITING in p.log_path.read_text(errors="replace"):
                break
            assert p.proc.poll() is None, f"exited before the gate ({p.proc.returncode}):\n{_tail(p.log_path)}"
            assert time.monotonic() < deadline, f"not at the gate after {timeout} s:\n{_tail(p.log_path)}"
            await asyncio.sleep(0.02)
    for p in processes:
        assert p.proc.stdin is not None, "not started with gate=True"
        p.proc.stdin.write(b"go\n")
        p.proc.stdin.close()  # flushes


class CliRun:
    """``turnlog ARGS`` in the background on a SQLite file or a database URL,
    its output in ``log_path``."""

    def __init__(self, db: Path | str, *args: str, log_path: Path, gate: bool = False) -> None:
        url = db if isinstance(db, str) else f"sqlite+aiosqlite:///{db}"
        env = {**os.environ, "TURNLOG_DATABASE_URL": url}
        self.log_path = log_path
        self.log = open(log_path, "wb")
        self.proc = subprocess.Popen(
            turnlog_command(*args, gate=gate),
            cwd=ROOT,
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.PIPE if gate else subprocess.DEVNULL,
        )

    async def wait(self, timeout: float = 60.0) -> tuple[int, str]:
        """The exit code and the output (the process is killed after ``timeout``)."""
        try:
            code = await asyncio.to_thread(self.proc.wait, timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
            raise AssertionError(f"turnlog did not finish in {timeout} s:\n{_tail(self.log_path)}") from None
        finally:
            self.log.close()
        return code, self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.log.close()


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
    the environment); ``args``: more ``serve`` arguments (e.g. ``--demo``);
    ``gate``: the process waits on stdin before it starts (``tests.gate``)."""

    def __init__(
        self,
        db: Path | str,
        upstream_url: str | None,
        *,
        auto_resume: bool,
        log_dir: Path | None = None,
        args: tuple[str, ...] = (),
        gate: bool = False,
        env: Mapping[str, str] | None = None,
        module: str = "adapters.cli",
        **env_extra: str,
    ) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        database_url = db if isinstance(db, str) else f"sqlite+aiosqlite:///{db}"
        log_dir = log_dir or (db.parent if isinstance(db, Path) else Path("."))
        env = {
            **os.environ,
            "TURNLOG_DATABASE_URL": database_url,
            "TURNLOG_OPENAI_API_KEY": "sk-test",
            "TURNLOG_LEASE_SECONDS": "1",
            "TURNLOG_AUTO_RESUME": "true" if auto_resume else "false",
            "TURNLOG_DRAIN_SECONDS": "0",  # stop() releases running turns at once
            **(env or {}),
            **env_extra,  # wins: e.g. a long lease for a test that must not wait for one
        }
        if upstream_url is None:
            env.pop("TURNLOG_OPENAI_BASE_URL", None)
            env.pop("TURNLOG_OLLAMA_BASE_URL", None)
        else:
            env["TURNLOG_OPENAI_BASE_URL"] = upstream_url
        self.log_path = log_dir / f"serve-{self.port}.log"
        self.log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            turnlog_command("serve", "--port", str(self.port), *args, gate=gate, module=module),
            cwd=ROOT,
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.PIPE if gate else None,
        )

    async def ready(self, http: aiohttp.ClientSession) -> None:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"turnlog serve exited ({self.proc.returncode}):\n{self.log_tail()}"
            try:
                async with http.get(self.url + "/healthz") as resp:
                    if resp.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.05)
        raise AssertionError(f"turnlog serve did not become ready:\n{self.log_tail()}")

    def log_tail(self, lines: int = 30) -> str:
        """The end of the process's output, for failure messages."""
        self.log.flush()
        return _tail(self.log_path, lines)

    def kill9(self) -> None:
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            self.proc.stdin.close()  # a gate never opened: it exits
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


async def wait_for_output(path: Path, what: str, timeout: float = 20.0) -> str:
    """The text another process wrote to ``path`` once it is there (polled:
    the writer is a separate process with no other signal to wait on)."""
    await until(lambda: path.exists() and path.read_text(), what, within=timeout, every=0.05)
    return await asyncio.to_thread(path.read_text)
