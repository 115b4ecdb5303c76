"""The Jupyter code executor against a real ``jupyter_server`` with ipykernel.

The server is started once for the module, on a free loopback port, with a
token and a temp root folder (the ``test`` extras install it). Without
``jupyter_server`` the module is skipped, except under CI (``CI`` set), where
it must run; a server that is installed but cannot start is a failure.
"""

from __future__ import annotations

import base64
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from adapters.code import CodeLimits, JupyterExecutor
from adapters.code.jupyter import JupyterError
from tests.harness import Service, make_settings, start_service, stop_service
from tests.upstream import Reply, ScriptedUpstream

if not os.environ.get("CI"):
    pytest.importorskip("jupyter_server")
    pytest.importorskip("ipykernel")

TOKEN = "jupyter-test-token-5b1e"
LIMITS = CodeLimits(wall_seconds=3.0, output_bytes=2048, max_files=2)
# A 1x1 PNG.
PNG = base64.b64decode("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==")


class JupyterServer:
    """A ``jupyter_server`` process; ``url`` once it says it is running."""

    def __init__(self, folder: Path) -> None:
        for sub in ("root", "runtime", "config", "data", "ipython"):
            (folder / sub).mkdir()
        env = {
            **os.environ,
            "HOME": str(folder),
            "JUPYTER_RUNTIME_DIR": str(folder / "runtime"),
            "JUPYTER_CONFIG_DIR": str(folder / "config"),
            "JUPYTER_DATA_DIR": str(folder / "data"),
            "IPYTHONDIR": str(folder / "ipython"),
        }
        args = [
            sys.executable,
            "-m",
            "jupyter_server",
            f"--IdentityProvider.token={TOKEN}",
            "--ServerApp.ip=127.0.0.1",
            "--ServerApp.port=0",
            "--ServerApp.port_retries=0",
            f"--ServerApp.root_dir={folder / 'root'}",
            "--ServerApp.open_browser=False",
            "--ServerApp.terminals_enabled=False",
        ]
        if os.geteuid() == 0:
            args.append("--allow-root")
        self.proc = subprocess.Popen(args, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.log: list[str] = []
        self.url = ""
        assert self.proc.stderr is not None
        # Its log says where it listens; read it line by line until then (or until it exits).
        for line in self.proc.stderr:
            self.log.append(line)
            found = re.search(r"(http://127\.0\.0\.1:\d+)/", line)
            if found:
                self.url = found.group(1)
                break
        if not self.url:
            self.stop()
            raise RuntimeError("jupyter_server did not start:\n" + "".join(self.log[-30:]))
        # Keep draining its log, or it blocks on a full pipe.
        self.drain = threading.Thread(target=self._drain, daemon=True)
        self.drain.start()
        self._wait_listening(time.monotonic() + 30)

    def _wait_listening(self, deadline: float) -> None:
        """jupyter_server logs its URL one event-loop callback before it
        listens: connection refused until then (a retry on that condition,
        bounded, while the process lives)."""
        port = int(self.url.rsplit(":", 1)[1])
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=5).close()
                return
            except ConnectionRefusedError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError("jupyter_server never listened:\n" + "".join(self.log[-30:])) from None
                time.sleep(0.02)

    def _drain(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.log.append(line)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture(scope="module")
def jupyter(tmp_path_factory: pytest.TempPathFactory) -> Iterator[JupyterServer]:
    server = JupyterServer(tmp_path_factory.mktemp("jupyter"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def executor(jupyter: JupyterServer) -> JupyterExecutor:
    return JupyterExecutor(jupyter.url, TOKEN, LIMITS)


async def kernels(jupyter: JupyterServer) -> list[dict[str, Any]]:
    async with aiohttp.ClientSession() as http, http.get(f"{jupyter.url}/api/kernels", headers={"Authorization": f"token {TOKEN}"}) as resp:
        assert resp.status == 200
        listed: list[dict[str, Any]] = await resp.json()
        return listed


async def test_output_result_and_errors(executor: JupyterExecutor, jupyter: JupyterServer) -> None:
    assert "one kernel per run" in await executor.start()
    out = await executor.run("print(1)\nimport sys\nprint('warn', file=sys.stderr)\n6 * 7", "python")
    assert out == {"stdout": "1\n", "stderr": "warn\n", "result": "42"}
    out = await executor.run("def f():\n    return 1 / 0\nf()", "python")
    assert out["stdout"] == "" and out["result"] is None
    assert "ZeroDivisionError" in out["stderr"] and "\x1b[" not in out["stderr"]  # colours stripped
    assert await kernels(jupyter) == []  # each run's kernel is deleted after it


async def test_runs_do_not_share_a_kernel(executor: JupyterExecutor) -> None:
    await executor.run("secret = 'from the first run'", "python")
    out = await executor.run("secret", "python")
    assert "NameError" in out["stderr"]


async def test_images_come_back_as_files(executor: JupyterExecutor) -> None:
    code = f"""
import base64
from IPython.display import Image, display
png = base64.b64decode({base64.b64encode(PNG).decode()!r})
display(Image(data=png, format="png"))
display(Image(data=png, format="png"))
display(Image(data=png, format="png"))
print("shown")
"""
    out = await executor.run(code, "python")
    assert out["stdout"] == "shown\n"
    assert [f["name"] for f in out["files"]] == ["output-1.png", "output-2.png"]  # capped at max_files
    assert all(f["mime"] == "image/png" and base64.b64decode(f["data"]) == PNG for f in out["files"])
    assert "[1 file(s) not returned" in out["stderr"]


async def test_the_wall_clock_interrupts_the_kernel(executor: JupyterExecutor, jupyter: JupyterServer) -> None:
    out = await executor.run("import time\nprint('sleeping', flush=True)\ntime.sleep(3600)", "python")
    assert out["stdout"] == "sleeping\n"
    assert "KeyboardInterrupt" in out["stderr"]  # the interrupt reached the code
    assert out["stderr"].endswith("[stopped: the wall-clock limit of 3 s was reached]")
    assert await kernels(jupyter) == []


async def test_an_output_flood_is_truncated(executor: JupyterExecutor) -> None:
    out = await executor.run("for i in range(1000):\n    print('y' * 99)", "python")
    head, _, note = out["stdout"].rpartition("\n[… ")
    assert len(head.encode()) == LIMITS.output_bytes and note == f"{100_000 - LIMITS.output_bytes:,} more bytes of output not shown]"


async def test_a_server_that_refuses_is_the_executors_failure(jupyter: JupyterServer) -> None:
    with pytest.raises(JupyterError, match="403"):
        await JupyterExecutor(jupyter.url, "wrong-token", LIMITS).run("1", "python")
    with socket_closed_port() as port, pytest.raises(JupyterError, match="cannot reach"):
        await JupyterExecutor(f"http://127.0.0.1:{port}", TOKEN, LIMITS).run("1", "python")


class socket_closed_port:
    """A loopback port nothing listens on (bound, never listening, while in use)."""

    def __enter__(self) -> int:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        port: int = self.sock.getsockname()[1]
        return port

    def __exit__(self, *exc: object) -> None:
        self.sock.close()


@pytest.fixture
async def service_with_jupyter(tmp_path: Path, upstream: ScriptedUpstream, jupyter: JupyterServer) -> AsyncIterator[Service]:
    settings = make_settings(tmp_path, upstream.url, code_executor="jupyter", jupyter_url=jupyter.url, jupyter_token=TOKEN, code_timeout=5.0)
    svc = await start_service(settings, upstream)
    try:
        yield svc
    finally:
        await stop_service(svc)


async def test_a_code_turn_runs_on_the_kernel(service_with_jupyter: Service) -> None:
    svc = service_with_jupyter
    svc.upstream.enqueue(
        Reply(chunks=['<code_interpreter type="code" lang="python">\nimport sys\nprint(sys.version_info[0])\n</code_interpreter>']),
        Reply(text="Python 3."),
    )
    body = {
        "model": "gpt-test",
        "messages": [{"role": "user", "content": "which python?"}],
        "params": {"function_calling": "default"},
        "features": {"code_interpreter": True},
    }
    status, answer, headers = await svc.post("/v1/chat/completions", body)
    assert status == 200, answer
    view = await svc.turn(headers["X-Turn-Id"])
    item = [i for i in view["output"] if i["type"] == "code_interpreter"][0]
    assert item["output"] == {"stdout": "3\n", "stderr": "", "result": None} and item["status"] == "completed"
