"""The local sandbox: each run is a fresh, isolated Python process.

``SandboxExecutor.run`` starts ``python -I -S`` on ``adapters/code/sandbox_child.py``
(isolated mode: no environment variables, no user site, no site-packages; an
empty environment but PATH, LANG and HOME) in a new session, sends it its
settings and the code on stdin and reads one report (marshal) back. Everything that
touches the kernel — namespaces, the read-only file-system view, limits,
dropping privileges, the wall clock, truncating output, collecting files — is
done in that child (see its docstring), so that a flood or a fork bomb costs
the sandbox's CPU and never the service's event loop.

What isolation a host allows is probed once per process (``start``) and
logged: full namespaces as root or with unprivileged user namespaces, else the
weak audit-hook fallback, which the log line calls out.
"""

from __future__ import annotations

import asyncio
import logging
import marshal
import mimetypes
import os
import signal
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

from adapters.code.limits import CodeLimits, cut_note, stopped_note

log = logging.getLogger("turnlog.code")

CHILD = Path(__file__).with_name("sandbox_child.py")
# Imported, not run as a script: its .pyc is reused (compiling it is ~8 ms a
# run). Its folder leaves sys.path at once, so the code cannot import its neighbours.
BOOT = f"import sys; sys.path.insert(0, {str(CHILD.parent)!r}); import sandbox_child; del sys.path[0]; sandbox_child.main()"
#: In every sandbox process's command line, followed by the pid of the service
#: that started it: ``ps``/``pgrep -f`` tell which service a run belongs to
#: (and tests on parallel workers tell their runs from another worker's).
MARKER = "turnlog-sandbox"
PYTHON_LANGS = frozenset({"", "python", "python3", "py"})
# Folders where data and secrets usually live, hidden behind an empty tmpfs in
# the sandbox (the interpreter's own folders are shown again through them).
DEFAULT_HIDDEN = ("/root", "/home", "/run", "/srv", "/mnt", "/media", "/var/lib", "/var/log", "/var/mail", "/var/spool", "/var/backups")
# Folders the sandbox never hides (the system the code's interpreter needs): a
# secret file in one of them is hidden alone.
SYSTEM_FOLDERS = frozenset({"/", "/usr", "/proc", "/sys", "/dev", "/etc", "/bin", "/lib", "/lib64", "/sbin", "/opt", "/var", "/tmp"})
# Beyond the run's own wall clock: what the child may take to set up and report.
GRACE_SECONDS = 10.0

Isolation = Literal["auto", "hooks"]

_probed: dict[tuple[str, bool, Isolation], dict[str, Any]] = {}  # one probe per interpreter, root-ness, mode


class SandboxError(RuntimeError):
    """The sandbox itself failed (not the code it ran)."""


class SandboxExecutor:
    """A ``CodeExecutor`` running Python in a local, isolated child process.

    ``uid_base``: as root, run ``k`` of the ``max_concurrent`` at once runs as
    uid ``uid_base + k`` (no passwd entry needed; those uids must belong to no
    one), so concurrent runs cannot signal each other and RLIMIT_NPROC counts
    one run's processes only. ``hide``: more folders (or files) to hide; the
    service's working directory, its home, and the default folders are always
    hidden. ``isolation="hooks"`` forces the weak fallback (tests)."""

    def __init__(
        self,
        limits: CodeLimits | None = None,
        *,
        python: str | None = None,
        uid_base: int = 700_000,
        hide: Iterable[str] = (),
        max_concurrent: int = 4,
        isolation: Isolation = "auto",
    ) -> None:
        self.limits = limits or CodeLimits()
        self.python = python or sys.executable
        # -S (no site-packages) with the service's own interpreter: its
        # site-packages hold the service, not what code needs, and starting
        # without them is ~20 ms faster. A dedicated interpreter keeps its own.
        self.flags = ["-I", "-S"] if python is None else ["-I"]
        self.uid_base = uid_base
        self.isolation: Isolation = isolation
        home = os.path.expanduser("~")
        paths = [*DEFAULT_HIDDEN, os.getcwd(), *([home] if home not in ("/", "") else []), *hide]
        self.hide = list(dict.fromkeys(os.path.abspath(p) for p in paths))
        self._slots: asyncio.Queue[int] = asyncio.Queue()
        for slot in range(max(1, max_concurrent)):
            self._slots.put_nowait(slot)
        self._reaping: set[asyncio.Task[None]] = set()
        self.report: dict[str, Any] | None = None  # the probe's isolation report

    # -- the port --------------------------------------------------------------------

    async def run(self, code: str, lang: str) -> dict[str, Any]:
        if (lang or "").strip().lower() not in PYTHON_LANGS:
            return {"stdout": "", "stderr": f"the sandbox runs Python only, not {lang!r}", "result": None}
        return self._output(await self._report(code))

    # -- start-up --------------------------------------------------------------------

    async def start(self) -> str:
        """Probe (once per process) what isolation this host gives, and say it:
        the line ``serve`` logs at start."""
        key = (self.python, os.geteuid() == 0, self.isolation)
        if key not in _probed:
            _probed[key] = (await self._report(""))["isolation"]
        self.report = _probed[key]
        text = describe(self.report, self.limits)
        if self.report.get("hooks"):
            log.warning("code executor: sandbox, WEAK isolation: %s", text)
        else:
            log.info("code executor: sandbox: %s", text)
        return text

    # -- internals -------------------------------------------------------------------

    async def _report(self, code: str) -> dict[str, Any]:
        slot = await self._slots.get()  # also what makes uid_base + slot this run's alone
        try:
            return await self._spawn(code, slot)
        finally:
            self._slots.put_nowait(slot)

    async def _spawn(self, code: str, slot: int) -> dict[str, Any]:
        settings = {
            "limits": self.limits.as_dict(),
            "uid": self.uid_base + slot if os.geteuid() == 0 else None,
            "hide": self.hide,
            "isolation": self.isolation,
        }
        header = marshal.dumps(settings, 4)
        payload = len(header).to_bytes(4, "big") + header + code.encode("utf-8", "surrogatepass")
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": "/tmp/sandbox"}
        proc = await asyncio.create_subprocess_exec(
            self.python,
            *self.flags,
            "-c",
            BOOT,
            MARKER,
            str(os.getpid()),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=env,
            cwd="/",
            start_new_session=True,  # its own process group: one killpg ends it
        )
        try:
            out, err = await asyncio.wait_for(proc.communicate(payload), self.limits.wall_seconds + GRACE_SECONDS)
        except TimeoutError:
            self._kill(proc)
            await proc.wait()
            raise SandboxError(f"the sandbox did not report within {self.limits.wall_seconds + GRACE_SECONDS:g} s") from None
        except BaseException:
            # Cancelled (the turn's tool timeout, a cancelled turn): the child's
            # init dies with it (PR_SET_PDEATHSIG), and its namespace with it.
            self._kill(proc)
            task = asyncio.get_running_loop().create_task(self._reap(proc))
            self._reaping.add(task)
            task.add_done_callback(self._reaping.discard)
            raise
        if proc.returncode != 0 or not out:
            tail = err.decode("utf-8", "replace")[-2000:]
            raise SandboxError(f"the sandbox failed (exit status {proc.returncode}): {tail}")
        try:
            report = marshal.loads(out)  # written by the child's supervisor, never by the code
        except (ValueError, EOFError, TypeError) as exc:
            raise SandboxError(f"the sandbox's report is unreadable: {exc}") from None
        if not isinstance(report, dict):
            raise SandboxError("the sandbox's report is not a dict")
        return report

    @staticmethod
    def _kill(proc: asyncio.subprocess.Process) -> None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    @staticmethod
    async def _reap(proc: asyncio.subprocess.Process) -> None:
        await proc.wait()

    def _output(self, report: dict[str, Any]) -> dict[str, Any]:
        stdout = str(report.get("stdout") or "")
        stderr = str(report.get("stderr") or "")
        if report.get("stdout_cut"):
            stdout += cut_note(int(report["stdout_cut"]))
        if report.get("stderr_cut"):
            stderr += cut_note(int(report["stderr_cut"]))
        notes = [stopped_note(str(n)) for n in report.get("notes") or []]
        if report.get("files_skipped"):
            limits = self.limits
            notes.append(f"[{report['files_skipped']} file(s) not returned: the limit is {limits.max_files} files, {limits.files_bytes:,} bytes in total]")
        if notes:
            stderr = (stderr.rstrip("\n") + "\n" if stderr else "") + "\n".join(notes)
        out: dict[str, Any] = {"stdout": stdout, "stderr": stderr, "result": report.get("result")}
        files = [
            {"name": f["name"], "mime": mimetypes.guess_type(f["name"])[0] or "application/octet-stream", "data": f["data"]} for f in report.get("files") or []
        ]
        if files:
            out["files"] = files
        return out


def describe(report: dict[str, Any], limits: CodeLimits) -> str:
    """One line: what the code can and cannot reach on this host."""
    if report.get("hooks"):
        why = report.get("unshare_error") or "namespaces not tried"
        return (
            f"no namespaces ({why}); runs as {report.get('user')}, sockets, ctypes, programs and /proc of other "
            "processes refused by an audit hook only (not a security boundary), host file system visible "
            f"where file permissions allow; limits {_limits(limits)}"
        )
    spaces = ", ".join(report.get("namespaces") or [])
    return (
        f"namespaces: {spaces}; runs as {report.get('user')}; no network; file system read-only "
        f"({report.get('readonly', '?')}), private /tmp, /proc {report.get('proc', '?')}, new user namespaces "
        f"{report.get('nested_userns', '?')}, hidden: "
        f"{', '.join(report.get('hidden') or [])}; limits {_limits(limits)}"
    )


def _limits(limits: CodeLimits) -> str:
    return (
        f"{limits.wall_seconds:g} s wall, {limits.cpu_seconds} s CPU, {limits.memory_mb} MB memory, "
        f"{limits.file_size_mb} MB per file, {limits.disk_mb} MB disk, {limits.max_processes} processes"
    )
