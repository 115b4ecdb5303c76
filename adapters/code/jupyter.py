"""Code on a Jupyter server's kernel (REST + the channels WebSocket, messaging v5).

One kernel per run, deleted after it: the simplest correct choice. A run never
sees another run's variables, files in the kernel's memory or a half-finished
interrupt, and nothing is left running on the server when a turn is cancelled.
It costs a kernel start (~1 s for ipykernel) per run; reusing a kernel across
the runs of one turn would need the turn's id at this port, which it does not
carry.

The isolation is the Jupyter server's, not ours: its kernels run as its user,
with its network and files. Point ``TURNLOG_JUPYTER_URL`` at a server you run
for this (in a container, say), never at someone's notebook server.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import re
import time
import uuid
from datetime import UTC, datetime
from typing import Any

import aiohttp

from adapters.code.limits import CodeLimits, cut_note, stopped_note

log = logging.getLogger("turnlog.code")

IMAGE_TYPES = {"image/png": "png", "image/jpeg": "jpg", "image/gif": "gif", "image/svg+xml": "svg"}
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
KERNEL_START_SECONDS = 60.0  # a kernel that is not answering kernel_info by then is a failure
INTERRUPT_GRACE_SECONDS = 5.0


class JupyterError(RuntimeError):
    """The Jupyter server failed us (unreachable, refused, a kernel that never came up)."""


class _Capped:
    """A text stream kept up to a byte limit, with a count of what was cut."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.parts: list[str] = []
        self.size = 0
        self.cut = 0

    def add(self, text: str) -> None:
        data = text.encode("utf-8", "surrogatepass")
        room = self.limit - self.size
        if room >= len(data):
            self.parts.append(text)
            self.size += len(data)
            return
        if room > 0:
            self.parts.append(data[:room].decode("utf-8", "ignore"))
            self.size = self.limit
        self.cut += len(data) - max(room, 0)

    def text(self) -> str:
        return "".join(self.parts) + (cut_note(self.cut) if self.cut else "")


class JupyterExecutor:
    """A ``CodeExecutor`` on a Jupyter server's kernels. ``kernel_name``: a
    kernelspec of that server (None: its default)."""

    def __init__(self, url: str, token: str | None, limits: CodeLimits | None = None, *, kernel_name: str | None = None) -> None:
        self.url = url.rstrip("/")
        self.token = token
        self.limits = limits or CodeLimits()
        self.kernel_name = kernel_name

    async def start(self) -> str:
        """Check the server answers (``GET /api/status``) and say so; an
        unreachable server is logged, not fatal: runs fail until it is up."""
        try:
            async with self._session() as http, http.get(f"{self.url}/api/status") as resp:
                if resp.status != 200:
                    raise JupyterError(f"GET /api/status answered {resp.status}")
        except (aiohttp.ClientError, TimeoutError, JupyterError) as exc:
            log.warning("code executor: jupyter at %s is not reachable: %s", self.url, exc)
            return f"jupyter at {self.url} (not reachable)"
        text = f"jupyter at {self.url}: one kernel per run, deleted after; isolation is the server's"
        log.info("code executor: %s", text)
        return text

    async def run(self, code: str, lang: str) -> dict[str, Any]:
        async with self._session() as http:
            kernel_id = await self._start_kernel(http)
            try:
                return await self._execute(http, kernel_id, code)
            finally:
                await asyncio.shield(self._delete_kernel(http, kernel_id))

    # -- REST ------------------------------------------------------------------------

    def _session(self) -> aiohttp.ClientSession:
        headers = {"Authorization": f"token {self.token}"} if self.token else {}
        return aiohttp.ClientSession(headers=headers, timeout=aiohttp.ClientTimeout(total=None, connect=10, sock_read=None))

    async def _start_kernel(self, http: aiohttp.ClientSession) -> str:
        body = {"name": self.kernel_name} if self.kernel_name else {}
        try:
            async with http.post(f"{self.url}/api/kernels", json=body) as resp:
                if resp.status >= 300:
                    raise JupyterError(f"POST /api/kernels answered {resp.status}: {(await resp.text())[:300]}")
                return str((await resp.json())["id"])
        except aiohttp.ClientError as exc:
            raise JupyterError(f"cannot reach the Jupyter server at {self.url}: {exc}") from exc

    async def _delete_kernel(self, http: aiohttp.ClientSession, kernel_id: str) -> None:
        try:
            async with http.delete(f"{self.url}/api/kernels/{kernel_id}") as resp:
                if resp.status not in (204, 404):
                    log.warning("jupyter: deleting kernel %s answered %s", kernel_id, resp.status)
        except aiohttp.ClientError as exc:
            log.warning("jupyter: cannot delete kernel %s: %s", kernel_id, exc)

    async def _interrupt(self, http: aiohttp.ClientSession, kernel_id: str) -> None:
        try:
            async with http.post(f"{self.url}/api/kernels/{kernel_id}/interrupt") as resp:
                await resp.read()
        except aiohttp.ClientError as exc:
            log.warning("jupyter: cannot interrupt kernel %s: %s", kernel_id, exc)

    # -- the channels WebSocket ---------------------------------------------------------

    async def _execute(self, http: aiohttp.ClientSession, kernel_id: str, code: str) -> dict[str, Any]:
        session = uuid.uuid4().hex
        ws_url = re.sub(r"^http", "ws", self.url) + f"/api/kernels/{kernel_id}/channels?session_id={session}"
        limits = self.limits
        try:
            ws = await http.ws_connect(ws_url, max_msg_size=0, heartbeat=30)
        except (aiohttp.ClientError, aiohttp.WSServerHandshakeError) as exc:
            raise JupyterError(f"cannot open the kernel's channels: {exc}") from exc
        async with ws:
            # The kernel is ready when it answers kernel_info.
            info_id = await _send(ws, session, "kernel_info_request", {})
            start_deadline = time.monotonic() + KERNEL_START_SECONDS
            while True:
                msg = await _receive(ws, start_deadline)
                if msg is None:
                    raise JupyterError(f"the kernel did not answer within {KERNEL_START_SECONDS:g} s")
                if msg["parent_header"].get("msg_id") == info_id and msg["msg_type"] == "kernel_info_reply":
                    break
            content = {"code": code, "silent": False, "store_history": False, "user_expressions": {}, "allow_stdin": False, "stop_on_error": True}
            msg_id = await _send(ws, session, "execute_request", content)
            stdout, stderr = _Capped(limits.output_bytes), _Capped(limits.output_bytes)
            result: str | None = None
            files: list[dict[str, Any]] = []
            skipped = 0
            total = 0
            notes: list[str] = []
            idle = replied = False
            deadline = time.monotonic() + limits.wall_seconds
            interrupted = False
            while not (idle and replied):
                msg = await _receive(ws, deadline)
                if msg is None:
                    if interrupted:
                        break  # it did not even come back from the interrupt: deleting it ends it
                    interrupted = True
                    notes.append(stopped_note(f"the wall-clock limit of {limits.wall_seconds:g} s was reached"))
                    await self._interrupt(http, kernel_id)
                    deadline = time.monotonic() + INTERRUPT_GRACE_SECONDS
                    continue
                if msg["parent_header"].get("msg_id") != msg_id:
                    continue
                kind, body = msg["msg_type"], msg["content"]
                if kind == "stream":
                    (stderr if body.get("name") == "stderr" else stdout).add(body.get("text", ""))
                elif kind in ("execute_result", "display_data"):
                    data = body.get("data") or {}
                    images = [(mime, data[mime]) for mime in IMAGE_TYPES if mime in data]
                    for mime, value in images:
                        raw = value.encode() if mime == "image/svg+xml" else base64.b64decode("".join(str(value).split()))
                        if len(files) >= limits.max_files or total + len(raw) > limits.files_bytes:
                            skipped += 1
                            continue
                        total += len(raw)
                        name = f"output-{len(files) + 1}.{IMAGE_TYPES[mime]}"
                        files.append({"name": name, "mime": mime, "data": base64.b64encode(raw).decode("ascii")})
                    text = data.get("text/plain")
                    if kind == "execute_result" and text is not None:
                        result = str(text)
                        if len(result) > limits.output_bytes:
                            result = result[: limits.output_bytes] + f"… [{len(result) - limits.output_bytes} more characters]"
                    elif kind == "display_data" and text is not None and not images:
                        stdout.add(str(text) + "\n")
                elif kind == "error":
                    stderr.add(ANSI.sub("", "\n".join(body.get("traceback") or [f"{body.get('ename')}: {body.get('evalue')}"])) + "\n")
                elif kind == "status" and body.get("execution_state") == "idle":
                    idle = True
                elif kind == "execute_reply":
                    replied = True
        if skipped:
            notes.append(f"[{skipped} file(s) not returned: the limit is {limits.max_files} files, {limits.files_bytes:,} bytes in total]")
        err = stderr.text()
        if notes:
            err = (err.rstrip("\n") + "\n" if err else "") + "\n".join(notes)
        out: dict[str, Any] = {"stdout": stdout.text(), "stderr": err, "result": result}
        if files:
            out["files"] = files
        return out


async def _send(ws: aiohttp.ClientWebSocketResponse, session: str, msg_type: str, content: dict[str, Any]) -> str:
    msg_id = uuid.uuid4().hex
    header = {
        "msg_id": msg_id,
        "username": "turnlog",
        "session": session,
        "date": datetime.now(UTC).isoformat(),
        "msg_type": msg_type,
        "version": "5.3",
    }
    await ws.send_json({"header": header, "parent_header": {}, "metadata": {}, "content": content, "channel": "shell", "buffers": []})
    return msg_id


async def _receive(ws: aiohttp.ClientWebSocketResponse, deadline: float) -> dict[str, Any] | None:
    """The next JSON message, or None at the deadline. A closed socket is the
    server's failure."""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        try:
            frame = await ws.receive(timeout=left)
        except TimeoutError:
            return None
        if frame.type == aiohttp.WSMsgType.TEXT:
            msg: dict[str, Any] = frame.json()
            msg.setdefault("parent_header", {})
            msg.setdefault("content", {})
            msg["msg_type"] = msg.get("msg_type") or (msg.get("header") or {}).get("msg_type")
            return msg
        if frame.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.CLOSING, aiohttp.WSMsgType.ERROR):
            raise JupyterError(f"the kernel's channels closed ({frame.type.name})")
