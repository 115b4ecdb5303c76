"""The child side of the sandbox, run by ``adapters.code.sandbox`` as
``python -I -S -c "…import sandbox_child…; sandbox_child.main()" turnlog-sandbox``.

Never imported by the service; the standard library only, so that it works
under ``-I -S`` and in any interpreter the operator points the sandbox at.
Imported (not run as a script) so that its compiled ``.pyc`` is reused, and
frugal with imports (no json, typing, ast module, re): every millisecond of
start-up is paid by every run. It reads its settings (a length-prefixed
``marshal`` dict) and then the code from stdin, and writes the run's outcome
(a ``marshal`` dict) to stdout.

Three processes, each with one job:

* the **supervisor** (this process, started by the service): creates the
  namespaces (``unshare``: mount, network, pid, IPC, UTS, and a user namespace
  when it is not root), keeps the wall clock, reads the run's stdout/stderr
  (keeping the first ``output_bytes`` and counting the rest, so a flood costs
  the sandbox's CPU, not the service's event loop), collects the files left
  in the working directory, reports. It never runs the user's code.
* **init** (pid 1 of the new pid namespace): builds the private file-system
  view (everything read-only; private tmpfs over ``/tmp``, ``/run``, homes and
  the service's data folders; a fresh ``/proc``), forks the code's process and
  reaps. When init dies, the kernel kills everything left in the namespace:
  that is what makes a fork bomb's cleanup complete. It keeps its privileges
  (root, or capabilities inside the user namespace) so that the code can
  neither signal nor trace it, and ``PR_SET_PDEATHSIG`` ties it to the
  supervisor: a supervisor killed by the service takes the whole run with it.
* the **code's process**: limits (``setrlimit``), a nice value of 19, no
  privileges (another uid when the service runs as root; no capabilities in a
  user namespace; ``PR_SET_NO_NEW_PRIVS``), a seccomp filter refusing new
  user namespaces (``unshare -r`` would give the code a root of its own, and
  the kernel's user-namespace attack surface), then the code, REPL-style:
  the value of a final expression is the result.

When no namespace can be created (a container without ``CAP_SYS_ADMIN`` and
without unprivileged user namespaces) the run is **weaker**: same file system
(a fresh host temp folder as working directory), same network namespace, and
an audit hook (PEP 578) that refuses sockets, ``ctypes``, starting programs,
links and opening ``/proc`` of other processes or the hidden paths. Audit hooks
are not a security boundary against determined native code; the report says
``"hooks"`` and the service logs it at start.
"""

from __future__ import annotations

import marshal
import os
import select
import signal
import sys
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MOUNT_ATTR_RDONLY, MOUNT_ATTR_NOSUID = 0x1, 0x2
AT_FDCWD, AT_RECURSIVE = -100, 0x8000
SYS_MOUNT_SETATTR = 442  # the same number on every architecture (a post-5.x syscall)
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP = 1, 4, 38, 22
SECCOMP_MODE_FILTER = 2
# The seccomp filter's view of each architecture: its AUDIT_ARCH value and the
# numbers of unshare, clone and clone3 (little-endian only: the filter reads
# the flags as the low 32 bits of the first argument).
SECCOMP_ARCHES = {
    "x86_64": (0xC000003E, 272, 56, 435),
    "aarch64": (0xC00000B7, 97, 220, 435),
}

WORKDIR_IN_NAMESPACE = "/tmp/sandbox"
INIT_SIGNAL_BASE = 128  # init's exit code: the code's exit code, or 128 + the signal that ended it

_libc: Any = None


def libc() -> Any:
    """libc through ctypes, loaded only when namespaces are wanted (ctypes costs ~6 ms)."""
    global _libc
    if _libc is None:
        import ctypes

        _libc = ctypes.CDLL(None, use_errno=True)
    return _libc


def _check(ret: int, what: str) -> None:
    if ret != 0:
        import ctypes

        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    enc = os.fsencode
    _check(
        libc().mount(enc(source) if source else None, enc(target), enc(fstype) if fstype else None, flags, enc(data) if data else None),
        f"mount {target}",
    )


def prctl(option: int, arg: int) -> None:
    import ctypes

    _check(libc().prctl(option, ctypes.c_ulong(arg), 0, 0, 0), f"prctl {option}")


def try_prctl(option: int, arg: int) -> bool:
    """``prctl`` where it is a hardening only (the weak mode, another OS)."""
    try:
        prctl(option, arg)
    except (OSError, AttributeError):
        return False
    return True


def drop_capabilities() -> None:
    """Empty effective, permitted and inheritable sets (capset v3): in a user
    namespace this is what stops the code from unmounting the hiding tmpfs."""
    import ctypes

    header = (ctypes.c_uint32 * 2)(0x20080522, 0)
    data = (ctypes.c_uint32 * 6)()
    _check(libc().capset(header, data), "capset")


def user_namespace_filter() -> list[tuple[int, int, int, int]] | None:
    """A seccomp BPF program refusing new user namespaces (``unshare`` or
    ``clone`` with ``CLONE_NEWUSER``: EPERM) and ``clone3``, whose flags sit
    behind a pointer the filter cannot read (ENOSYS: the C library then falls
    back to ``clone``); syscalls of another ABI (i386 or x32 on x86_64) fail
    too. None on an architecture it does not know."""
    arch = SECCOMP_ARCHES.get(os.uname().machine) if sys.byteorder == "little" else None
    if arch is None:
        return None
    audit_arch, nr_unshare, nr_clone, nr_clone3 = arch
    ld, jeq, jset, ret = 0x20, 0x15, 0x45, 0x06
    allow, eperm, enosys = 0x7FFF0000, 0x00050000 | 1, 0x00050000 | 38
    # Jumps are forward only, counted from the next instruction.
    return [
        (ld, 0, 0, 4),  # 0: arch
        (jeq, 0, 10, audit_arch),  # 1: another ABI -> 12
        (ld, 0, 0, 0),  # 2: the syscall's number
        (jset, 8, 0, 0x40000000),  # 3: x32 -> 12
        (jeq, 7, 0, nr_clone3),  # 4: -> 12
        (jeq, 2, 0, nr_unshare),  # 5: -> 8
        (jeq, 1, 0, nr_clone),  # 6: -> 8
        (ret, 0, 0, allow),  # 7
        (ld, 0, 0, 16),  # 8: the flags, the low 32 bits of the first argument
        (jset, 0, 1, CLONE_NEWUSER),  # 9: -> 10, else 11
        (ret, 0, 0, eperm),  # 10
        (ret, 0, 0, allow),  # 11
        (ret, 0, 0, enosys),  # 12
    ]


def deny_user_namespaces() -> bool:
    """Install ``user_namespace_filter`` on this process and its children
    (needs ``no_new_privs``, already set). False where there is no filter for
    this architecture."""
    import ctypes

    program = user_namespace_filter()
    if program is None:
        return False

    class SockFilter(ctypes.Structure):
        _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(SockFilter))]

    filters = (SockFilter * len(program))(*(SockFilter(*insn) for insn in program))
    prog = SockFprog(len(program), filters)
    _check(libc().prctl(PR_SET_SECCOMP, ctypes.c_ulong(SECCOMP_MODE_FILTER), ctypes.byref(prog), 0, 0), "seccomp")
    return True


# -- the supervisor -------------------------------------------------------------------


class Run:
    """One run's settings (from the service) and what was learnt setting it up."""

    def __init__(self, cfg: dict, code: str) -> None:
        self.cfg = cfg
        self.code = code
        self.limits: dict = cfg["limits"]
        self.uid: int | None = cfg.get("uid")  # set when the service runs as root
        self.isolation: dict = {"namespaces": [], "user": "same uid", "hooks": False}
        self.namespaces = False
        self.userns = False
        self.workdir = WORKDIR_IN_NAMESPACE  # a host temp folder without namespaces
        self.notes: list[str] = []
        self.parent = os.getppid()

    # The paths the code's interpreter needs, shown again inside a hidden folder.
    def keep_paths(self) -> list[str]:
        paths = {sys.base_prefix, sys.prefix, os.path.dirname(os.path.realpath(sys.executable))}
        paths |= {os.path.realpath(p) for p in paths}  # (hidden paths are compared resolved)
        return sorted(p for p in paths if p and p != "/")


def unshare(run: Run) -> None:
    """New namespaces for this process (mount, net, IPC, UTS) and its next child
    (pid). Root needs no user namespace; anyone else does, and then maps only
    its own uid and gid, so nothing else is reachable from inside."""
    flags = CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS
    names = ["mount", "net", "pid", "ipc", "uts"]
    if os.geteuid() != 0:
        uid, gid = os.geteuid(), os.getegid()
        _check(libc().unshare(flags | CLONE_NEWUSER), "unshare")
        with open("/proc/self/setgroups", "w") as fh:
            fh.write("deny")
        with open("/proc/self/uid_map", "w") as fh:
            fh.write(f"{uid} {uid} 1")
        with open("/proc/self/gid_map", "w") as fh:
            fh.write(f"{gid} {gid} 1")
        run.userns = True
        names.insert(0, "user")
        run.isolation["user"] = "same uid, no capabilities (user namespace)"
    else:
        _check(libc().unshare(flags), "unshare")
        if run.uid is not None:
            run.isolation["user"] = f"uid {run.uid}"
    run.namespaces = True
    run.isolation["namespaces"] = names
    arch = os.uname().machine
    run.isolation["nested_userns"] = "refused" if user_namespace_filter() else f"not refused (no seccomp filter for {arch})"


def supervise(run: Run) -> dict:
    limits = run.limits
    if run.cfg.get("isolation") != "hooks":
        try:
            unshare(run)
        except OSError as exc:
            run.isolation["unshare_error"] = str(exc)
    if not run.namespaces:
        import tempfile

        run.isolation["hooks"] = True
        if run.uid is not None:
            run.isolation["user"] = f"uid {run.uid}"
        run.workdir = tempfile.mkdtemp(prefix="turnlog-sandbox-")  # mode 700
        if run.uid is not None and os.geteuid() == 0:
            os.chown(run.workdir, run.uid, run.uid)
    if try_prctl(PR_SET_PDEATHSIG, signal.SIGKILL) and os.getppid() != run.parent:
        os._exit(1)  # the service died before the prctl

    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    res_r, res_w = os.pipe()  # the code's result (the code can write there too: it only fools itself)
    status_r, status_w = os.pipe()  # init's report (the code never has this one)
    sys.stdout.flush()
    started = time.monotonic()
    child = os.fork()
    if child == 0:
        try:
            for fd in (out_r, err_r, res_r, status_r):
                os.close(fd)
            if run.namespaces:
                init(run, out_w, err_w, res_w, status_w)
            else:
                code_process(run, out_w, err_w, res_w)
        except BaseException as exc:  # noqa: BLE001 - a set-up failure: report it on the run's stderr
            message = f"sandbox set-up failed: {type(exc).__name__}: {exc}\n".encode()
            try:
                os.write(err_w, message)
            except OSError:
                os.write(2, message)  # err_w was already moved to fd 2
            finally:
                os._exit(INIT_SIGNAL_BASE - 1)
        os._exit(0)
    for fd in (out_w, err_w, res_w, status_w):
        os.close(fd)

    stopped: list[str] = []

    def on_term(signum: int, frame: object) -> None:
        # The service gave up on the run (its own deadline, a cancelled turn).
        _kill(child)
        stopped.append("the run was cancelled")

    signal.signal(signal.SIGTERM, on_term)

    out_limit = int(limits["output_bytes"])
    streams = {out_r: Stream(), err_r: Stream()}
    res_buf = bytearray()
    res_cap = 4 * out_limit + 65536
    status_buf = bytearray()
    deadline = started + float(limits["wall_seconds"])
    status: int | None = None
    try:
        pidfd: int | None = os.pidfd_open(child)
    except (AttributeError, OSError):
        pidfd = None
    fds = [out_r, err_r, res_r, status_r] + ([pidfd] if pidfd is not None else [])
    drain_until: float | None = None
    while True:
        if status is None:
            status = _reap(child)
            if status is not None:
                if not run.namespaces:
                    _kill_leftovers(run, child)
                drain_until = time.monotonic() + (1.0 if not run.namespaces else 5.0)
        open_pipes = [fd for fd in (out_r, err_r, res_r, status_r) if fd in fds]
        if status is not None and not open_pipes:
            break
        now = time.monotonic()
        if status is None and now >= deadline and not stopped:
            _kill(child)
            stopped.append(f"the wall-clock limit of {limits['wall_seconds']:g} s was reached")
        if drain_until is not None and now >= drain_until:
            break  # something outside a namespace keeps a pipe open: stop reading
        wait = (drain_until or deadline) - now
        if pidfd is None and status is None:
            wait = min(wait, 0.05)
        try:
            ready, _, _ = select.select(fds, [], [], max(0.0, wait))
        except InterruptedError:
            continue
        for fd in ready:
            if fd == pidfd:
                fds.remove(fd)
                os.close(fd)
                pidfd = None
                continue
            data = os.read(fd, 65536)
            if not data:
                fds.remove(fd)
                continue
            if fd == res_r:
                if len(res_buf) < res_cap:
                    res_buf += data[: res_cap - len(res_buf)]
                continue
            if fd == status_r:
                status_buf += data[:65536]
                continue
            streams[fd].add(data, out_limit)
    if status is None:
        status = _reap(child, block=True)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)

    result, memory = _parse_result(bytes(res_buf))
    code_status: dict = {}
    if status_buf:
        try:
            code_status = marshal.loads(bytes(status_buf))  # written by init, which the code cannot reach
        except (ValueError, EOFError, TypeError):
            pass
    if isinstance(code_status.get("fs"), dict):
        run.isolation.update(code_status["fs"])
    notes = list(stopped)
    if not stopped and status is not None:
        notes += _explain(status, code_status, memory, limits, run.namespaces)
    files, skipped = collect_files(run, int(limits["max_files"]), int(limits["files_bytes"]))
    if not run.namespaces:
        import shutil

        shutil.rmtree(run.workdir, ignore_errors=True)  # (with namespaces, the tmpfs goes with them)
    return {
        "stdout": streams[out_r].text(),
        "stdout_cut": streams[out_r].cut,
        "stderr": streams[err_r].text(),
        "stderr_cut": streams[err_r].cut,
        "result": result,
        "notes": notes + run.notes,
        "files": files,
        "files_skipped": skipped,
        "isolation": run.isolation,
        "seconds": round(time.monotonic() - started, 4),
    }


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _reap(pid: int, block: bool = False) -> int | None:
    try:
        done, status = os.waitpid(pid, 0 if block else os.WNOHANG)
    except ChildProcessError:
        return 0
    return status if done else None


def _kill_leftovers(run: Run, child: int) -> None:
    """Without a pid namespace: the code's process group, and as root every
    process of the run's uid (a helper that becomes that uid and kills -1)."""
    try:
        os.killpg(child, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    if run.uid is not None and os.geteuid() == 0:
        helper = os.fork()
        if helper == 0:
            try:
                os.setresgid(run.uid, run.uid, run.uid)
                os.setresuid(run.uid, run.uid, run.uid)
                os.kill(-1, signal.SIGKILL)
            finally:
                os._exit(0)
        os.waitpid(helper, 0)


RESULT_MARK = b"\x00turnlog-result\x00"


def _parse_result(raw: bytes) -> tuple[str | None, bool]:
    """The code process's last frame: MARK, memory flag (0/1), R + the repr or N."""
    at = raw.rfind(RESULT_MARK)
    if at < 0:
        return None, False
    frame = raw[at + len(RESULT_MARK) :]
    memory = frame[:1] == b"1"
    if frame[1:2] != b"R":
        return None, memory
    return frame[2:].decode("utf-8", "replace"), memory


def _explain(status: int, code_status: dict, memory: bool, limits: dict, namespaces: bool) -> list[str]:
    """What stopped the code, in words, from its wait status (directly, or as
    init encoded it in its exit code)."""
    sig = None
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
    elif os.WIFEXITED(status) and os.WEXITSTATUS(status) > INIT_SIGNAL_BASE and namespaces:
        sig = os.WEXITSTATUS(status) - INIT_SIGNAL_BASE  # init's encoding of the code's end
    notes = []
    if memory:
        notes.append(f"the memory limit of {limits['memory_mb']} MB was reached")
    if sig is None:
        return notes
    cpu = float(code_status.get("cpu") or 0.0)
    if sig == signal.SIGXCPU or (sig == signal.SIGKILL and cpu >= float(limits["cpu_seconds"]) - 0.05):
        notes.append(f"the CPU time limit of {limits['cpu_seconds']} s was reached")
    elif sig == signal.SIGXFSZ:
        notes.append(f"the file size limit of {limits['file_size_mb']} MB was reached")
    else:
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = str(sig)
        notes.append(f"the code was ended by signal {name}")
    return notes


class Stream:
    """The first ``limit`` bytes of a stream, and how many more came."""

    def __init__(self) -> None:
        self.head = bytearray()
        self.cut = 0

    def add(self, data: bytes, limit: int) -> None:
        room = max(0, limit - len(self.head))
        self.head += data[:room]
        self.cut += max(0, len(data) - room)

    def text(self) -> str:
        import codecs

        # A character cut in two at the limit is dropped, not shown as garbage.
        return codecs.getincrementaldecoder("utf-8")("replace").decode(bytes(self.head), final=not self.cut)


def collect_files(run: Run, max_files: int, max_bytes: int) -> tuple[list[dict], int]:
    """Regular files under the working directory, walked through directory fds
    with ``O_NOFOLLOW`` (a symlink or a hard link to something else is never
    followed: this runs with more rights than the code had), capped in count
    and total bytes. Returns (files, how many were left out)."""
    import base64
    import stat

    files: list[dict] = []
    skipped = 0
    total = 0
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        root = os.open(run.workdir, flags | os.O_DIRECTORY)
    except OSError:
        return files, 0
    stack: list[tuple[int, str]] = [(root, "")]
    seen = 0
    while stack:
        dfd, prefix = stack.pop()
        try:
            with os.scandir(dfd) as it:
                names = sorted(e.name for e in it)
        except OSError:
            names = []
        for name in names:
            seen += 1
            if seen > 10_000:
                break
            try:
                fd = os.open(name, flags, dir_fd=dfd)
            except OSError:
                continue
            try:
                st = os.fstat(fd)
                if stat.S_ISDIR(st.st_mode):
                    if len(stack) < 32:
                        stack.append((os.dup(fd), prefix + name + "/"))
                    continue
                if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1 or (run.uid is not None and st.st_uid != run.uid):
                    continue
                if len(files) >= max_files or total + st.st_size > max_bytes:
                    skipped += 1
                    continue
                data = b""
                while len(data) < st.st_size:
                    chunk = os.read(fd, st.st_size - len(data))
                    if not chunk:
                        break
                    data += chunk
                total += len(data)
                files.append({"name": prefix + name, "data": base64.b64encode(data).decode("ascii")})
            finally:
                os.close(fd)
        os.close(dfd)
    return files, skipped


# -- init: pid 1 of the run's pid namespace ---------------------------------------------


def init(run: Run, out_w: int, err_w: int, res_w: int, status_w: int) -> None:
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # the supervisor's death ends the namespace
    prctl(PR_SET_DUMPABLE, 0)  # the code may not trace or read its init
    null = os.open("/dev/null", os.O_RDWR)
    for fd in (0, 1, 2):  # not the supervisor's report channel: the service reads it to EOF
        os.dup2(null, fd)
    os.close(null)
    build_filesystem(run)
    child = os.fork()
    if child == 0:
        code_process(run, out_w, err_w, res_w)
        os._exit(0)
    os.close(out_w)
    os.close(err_w)
    os.close(res_w)
    status = 0
    usage = None
    while True:  # reap everything (orphans are re-parented to us) until the code's process ends
        try:
            pid, st, ru = os.wait4(-1, 0)
        except ChildProcessError:
            break
        except InterruptedError:
            continue
        if pid == child:
            status, usage = st, ru
            break
    report: dict = {"fs": {k: run.isolation[k] for k in ("readonly", "proc", "hidden") if k in run.isolation}}
    if usage is not None:
        report["cpu"] = round(usage.ru_utime + usage.ru_stime, 3)
    if os.WIFSIGNALED(status):
        report["signal"] = os.WTERMSIG(status)
        code = INIT_SIGNAL_BASE + os.WTERMSIG(status)
    else:
        code = min(os.WEXITSTATUS(status), INIT_SIGNAL_BASE - 1)
    try:
        os.write(status_w, marshal.dumps(report, 4))
    except OSError:
        pass
    os._exit(code)


def build_filesystem(run: Run) -> None:
    """The code's view: the host's tree read-only, no setuid;
    private tmpfs over the places where data and secrets live (the service's
    folders, homes, /tmp, /run), the interpreter's folders shown again through
    them; the working directory on a size-capped tmpfs; a /proc of this pid
    namespace only."""
    mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing we mount may reach the host
    readonly_root(run)
    keep = run.keep_paths()
    hidden: list[str] = []
    tmp_size = f"size={int(run.limits['disk_mb'])}m"
    plan = [("/tmp", f"mode=1777,{tmp_size}")]
    for path in ("/var/tmp", "/dev/shm"):
        plan.append((path, "mode=1777,size=8m"))
    for path in run.cfg.get("hide") or []:
        plan.append((path, "mode=755,size=1m"))
    plan.sort(key=lambda p: len(p[0]))
    for path, options in plan:
        path = os.path.realpath(path)
        if path in ("/", "/usr", "/proc", "/sys", "/dev", "/etc", "/bin", "/lib", "/lib64", "/sbin"):
            continue
        if any(path == h or path.startswith(h + "/") for h in hidden):
            continue
        if not os.path.isdir(path):
            if os.path.isfile(path):
                mount("/dev/null", path, None, MS_BIND)
                hidden.append(path)
            continue
        shown = [k for k in keep if k.startswith(path + "/") or k == path]
        if path in shown:
            continue  # never hide the interpreter itself
        fds = {k: os.open(k, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC) for k in shown if os.path.isdir(k)}
        mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, options)
        for k, fd in fds.items():
            os.makedirs(k, mode=0o755, exist_ok=True)
            mount(f"/proc/self/fd/{fd}", k, None, MS_BIND | MS_REC)
            os.close(fd)
        hidden.append(path)
    run.isolation["hidden"] = hidden
    os.mkdir(run.workdir, 0o700)
    if run.uid is not None and os.geteuid() == 0:
        os.chown(run.workdir, run.uid, run.uid)
    try:
        mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
        run.isolation["proc"] = "private"
    except OSError:
        mount("tmpfs", "/proc", "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=4k,mode=555")
        run.isolation["proc"] = "hidden"


def readonly_root(run: Run) -> None:
    """Every inherited mount read-only and nosuid (mount_setattr, Linux 5.12+;
    else a remount per mount point, best effort)."""
    import ctypes

    class MountAttr(ctypes.Structure):
        _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64), ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]

    attr = MountAttr(MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID, 0, 0, 0)  # (not nodev: /dev/null is a device)
    ret = libc().syscall(SYS_MOUNT_SETATTR, AT_FDCWD, b"/", AT_RECURSIVE, ctypes.byref(attr), ctypes.sizeof(attr))
    if ret == 0:
        run.isolation["readonly"] = "all"
        return
    failed = 0
    with open("/proc/self/mountinfo") as fh:
        lines = fh.read().splitlines()
    for line in lines:
        fields = line.split()
        target = fields[4].encode().decode("unicode_escape")
        opts = fields[5].split(",")
        flags = MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | (MS_NODEV if "nodev" in opts else 0) | (MS_NOEXEC if "noexec" in opts else 0)
        try:
            mount(None, target, None, flags)
        except OSError:
            failed += 1
    run.isolation["readonly"] = "all" if not failed else f"all but {failed} mounts"


# -- the code's process ---------------------------------------------------------------


def code_process(run: Run, out_w: int, err_w: int, res_w: int) -> None:
    import resource

    limits = run.limits
    os.dup2(out_w, 1)
    os.dup2(err_w, 2)
    os.dup2(res_w, 3)
    null = os.open("/dev/null", os.O_RDONLY)
    os.dup2(null, 0)
    os.closerange(4, 1 << 16)
    if not run.namespaces:
        os.setpgid(0, 0)  # its own group, for the kill at the end
    os.chdir(run.workdir)
    try:
        os.nice(19)  # the service first, always
    except OSError:
        pass
    mb = 1024 * 1024
    cpu = max(1, int(limits["cpu_seconds"]))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    resource.setrlimit(resource.RLIMIT_FSIZE, (int(limits["file_size_mb"]) * mb,) * 2)
    resource.setrlimit(resource.RLIMIT_NOFILE, (int(limits["max_open_files"]),) * 2)
    resource.setrlimit(resource.RLIMIT_NPROC, (int(limits["max_processes"]),) * 2)
    if not run.namespaces and run.uid is not None and not _readable_by_others(sys.base_prefix):
        _preimport()  # the stdlib is behind a folder the run's uid cannot enter
    if run.uid is not None and os.geteuid() == 0:
        os.setgroups([])
        os.setresgid(run.uid, run.uid, run.uid)
        os.setresuid(run.uid, run.uid, run.uid)
    elif run.userns:
        drop_capabilities()
    if run.namespaces or run.uid is not None:
        prctl(PR_SET_NO_NEW_PRIVS, 1)  # no setuid program gives anything back
    if run.namespaces:
        deny_user_namespaces()  # a failure fails the run: never run the code without it
    elif try_prctl(PR_SET_NO_NEW_PRIVS, 1):
        try:
            deny_user_namespaces()  # the weak mode: a hardening where the host allows it
        except OSError:
            pass
    try_prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # (set*uid cleared the inherited one)
    os.environ["HOME"] = run.workdir
    os.environ["TMPDIR"] = "/tmp" if run.namespaces else run.workdir
    # Address space last: everything above may allocate.
    resource.setrlimit(resource.RLIMIT_AS, (int(limits["memory_mb"]) * mb,) * 2)
    if not run.namespaces:
        install_hooks(run)
    execute(run.code, int(limits["output_bytes"]))


def _readable_by_others(path: str) -> bool:
    import stat

    path = os.path.realpath(path)
    while True:
        try:
            mode = os.stat(path).st_mode
        except OSError:
            return False
        if not mode & stat.S_IXOTH:
            return False
        if path == "/":
            return True
        path = os.path.dirname(path)


def _preimport() -> None:
    """Without a mount namespace the stdlib may sit behind a folder only the
    service's user can enter (/root/.pyenv): import the common modules first."""
    for name in (
        "json math cmath random statistics decimal fractions datetime time calendar re string textwrap "
        "collections itertools functools operator heapq bisect copy pprint csv io base64 hashlib hmac "
        "struct array enum dataclasses typing unicodedata zlib gzip zipfile tarfile pathlib tempfile shutil "
        "traceback uuid secrets locale glob fnmatch difflib inspect numbers contextlib abc socket subprocess urllib.request "
        "encodings.idna encodings.ascii encodings.latin_1 encodings.utf_16"
    ).split():
        try:
            __import__(name)
        except ImportError:
            pass


def install_hooks(run: Run) -> None:
    """The weak fallback (no namespaces): an audit hook refusing the network,
    ctypes, starting programs, links, and opening other processes' /proc files
    or the hidden paths. Hooks cannot be removed once added."""
    workdir = os.path.realpath(run.workdir)
    hidden = [h for h in (os.path.realpath(p) for p in run.cfg.get("hide") or []) if not workdir.startswith(h + "/")]
    me = str(os.getpid())
    refused_prefixes = ("socket.", "ctypes.", "subprocess.", "os.exec", "os.posix_spawn", "os.spawn", "_posixsubprocess")
    refused = {"os.system", "os.link", "os.symlink", "pty.spawn", "os.startfile", "sys.remote_exec"}

    def hook(event: str, args: tuple) -> None:
        if event.startswith(refused_prefixes) or event in refused:
            raise PermissionError(f"sandbox: {event} is not allowed")
        if event == "open" and args and isinstance(args[0], (str, bytes)):
            path = os.path.realpath(os.fsdecode(args[0]))
            if path.startswith("/proc/"):
                first = path.split("/")[2]
                if first.isdigit() and first != me and first != str(os.getpid()):
                    raise PermissionError(f"sandbox: {path} is not allowed")
            if any(path == h or path.startswith(h + "/") for h in hidden):
                raise PermissionError(f"sandbox: {path} is not allowed")

    sys.addaudithook(hook)


def execute(code: str, result_limit: int) -> None:
    """Run ``code`` as ``__main__``; a final expression's value (its repr,
    truncated) is the result, like a REPL cell. Exceptions print their
    traceback without this runner's frames."""
    import _ast  # (the C module: ``ast`` costs ~4 ms of imports)

    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    filename = "<code>"
    module = type(sys)("__main__")
    module.__dict__["__builtins__"] = __builtins__
    sys.modules["__main__"] = module
    env = module.__dict__
    result: str | None = None
    memory = False
    exit_code = 0
    try:
        tree = compile(code, filename, "exec", _ast.PyCF_ONLY_AST)
        assert isinstance(tree, _ast.Module)
        last = None
        final = tree.body[-1] if tree.body else None
        if isinstance(final, _ast.Expr):
            tree.body.pop()
            last = _ast.Expression(final.value)
        exec(compile(tree, filename, "exec"), env)  # noqa: S102 - running the code is the point
        if last is not None:
            value = eval(compile(last, filename, "eval"), env)  # noqa: S307
            if value is not None:
                result = repr(value)
                if len(result) > result_limit:
                    result = result[:result_limit] + f"… [{len(result) - result_limit} more characters]"
    except SystemExit as exc:
        exit_code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if exc.code is not None and not isinstance(exc.code, int):
            print(exc.code, file=sys.stderr)
    except BaseException as exc:  # noqa: BLE001 - the code's own error, shown to it
        memory = isinstance(exc, MemoryError)
        exit_code = 1
        try:
            import linecache
            import traceback

            linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
            traceback.print_exception(type(exc), exc, exc.__traceback__.tb_next if exc.__traceback__ else None)
        except MemoryError:
            os.write(2, b"MemoryError\n")
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except Exception:  # noqa: BLE001 - a closed stdout is the code's business
        pass
    try:
        frame = RESULT_MARK + (b"1" if memory else b"0") + (b"N" if result is None else b"R" + result.encode("utf-8", "surrogatepass"))
        os.write(3, frame)
    except (OSError, MemoryError):
        pass
    os._exit(exit_code & 0xFF)


def main() -> None:
    raw = sys.stdin.buffer.read()
    size = int.from_bytes(raw[:4], "big")
    run = Run(marshal.loads(raw[4 : 4 + size]), raw[4 + size :].decode("utf-8", "replace"))
    report = supervise(run)
    sys.stdout.buffer.write(marshal.dumps(report, 4))
    sys.stdout.flush()
