"""What the code sandbox hides of the service's own secrets and code, and what
it refuses to do, with real sandbox runs (as tests/test_sandbox.py).

The secret files live in a folder outside every folder the sandbox hides by
default (/tmp, homes, the working directory ...): otherwise a test could pass
because the file sits under one of those, not because it was hidden for what
it is. That needs a folder root can write (/opt, /var/cache); without one the
namespace tests skip.
"""

from __future__ import annotations

import asyncio
import json
import marshal
import os
import shutil
import stat
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from adapters.code import CodeLimits, SandboxExecutor, WeakSandboxRefused, build_code_executor, secrets_held, service_paths, start_code_executor
from adapters.code.sandbox import BOOT, MARKER
from adapters.config import Settings
from tests.harness import make_settings, start_service
from tests.pg import unavailable
from tests.processes import free_port, turnlog_command
from tests.upstream import ScriptedUpstream

LIMITS = CodeLimits(wall_seconds=6.0, cpu_seconds=3, memory_mb=256, max_processes=16, output_bytes=16384)
SECRET = "sk-operator-secret-0042"
REPO = Path(__file__).resolve().parent.parent
NOBODY = 65534


def _writable_outside_hidden() -> str | None:
    for parent in ("/opt", "/var/cache", "/usr/local/share"):
        if os.access(parent, os.W_OK):
            return parent
    return None


@pytest.fixture
def secrets_dir(tmp_path: Path) -> Iterator[Path]:
    """A deployment's files, none under a folder hidden by default: a config
    file, a receipt key, a tools and a filters folder, each holding SECRET."""
    parent = _writable_outside_hidden()
    if parent is None:
        unavailable("no folder outside the sandbox's default hidden ones is writable")
    root = Path(tempfile.mkdtemp(prefix="turnlog-secrets-", dir=parent))
    try:
        yield _populate(root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _populate(root: Path) -> Path:
    root.chmod(0o755)  # readable by anyone, like /etc/turnlog: only the hiding protects it
    for sub in ("conf", "keys", "tools", "filters", "pipes"):
        (root / sub).mkdir(mode=0o755)
    (root / "conf" / "turnlog.toml").write_text(f'openai_api_key = "{SECRET}"\n')
    pem = Ed25519PrivateKey.generate().private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    (root / "keys" / "receipt.pem").write_bytes(pem)
    (root / "keys" / "notes.txt").write_text(SECRET)  # the key's folder is hidden too
    (root / "tools" / "weather.py").write_text(f"API_KEY = {SECRET!r}\n")
    (root / "filters" / "redact.py").write_text(f"TOKEN = {SECRET!r}\n")
    (root / "pipes" / "vendor.py").write_text(f"KEY = {SECRET!r}\n")
    for path in root.rglob("*"):
        if path.is_file():
            path.chmod(0o644)
    return root


def deployment(tmp_path: Path, root: Path, **overrides: Any) -> Settings:
    (tmp_path / "db").mkdir(exist_ok=True)  # the database's folder (hidden) apart from the secrets' one
    return make_settings(
        tmp_path,
        None,
        database_url=f"sqlite+aiosqlite:///{tmp_path / 'db' / 'turnlog.db'}",
        config_path=str(root / "conf" / "turnlog.toml"),
        receipt_key=str(root / "keys" / "receipt.pem"),
        tools_dir=str(root / "tools"),
        filters_dir=str(root / "filters"),
        pipes_dir=str(root / "pipes"),
        **overrides,
    )


def secret_files(root: Path) -> list[str]:
    return [str(root / p) for p in ("conf/turnlog.toml", "keys/receipt.pem", "keys/notes.txt", "tools/weather.py", "filters/redact.py", "pipes/vendor.py")]


def snoop_code(root: Path) -> str:
    """Code reading each secret file and listing each folder: what it saw, as JSON."""
    return f"""
import json, os
seen = {{}}
for path in {secret_files(root)!r}:
    try:
        seen[path] = open(path, "rb").read().decode("latin-1")
    except OSError as exc:
        seen[path] = type(exc).__name__
for folder in {[str(root / s) for s in ("conf", "keys", "tools", "filters", "pipes")]!r}:
    try:
        seen[folder] = sorted(os.listdir(folder))
    except OSError as exc:
        seen[folder] = type(exc).__name__
print(json.dumps(seen))
"""


def assert_nothing_seen(out: dict[str, Any], root: Path) -> None:
    assert out["stderr"] == "", out["stderr"]
    seen = json.loads(out["stdout"])
    for path in secret_files(root):
        assert seen[path] in ("", "PermissionError", "FileNotFoundError"), (path, seen[path])
    assert "PRIVATE KEY" not in out["stdout"] and SECRET not in out["stdout"]


def test_the_secret_paths_are_the_services_hidden_paths(tmp_path: Path) -> None:
    settings = make_settings(
        tmp_path,
        None,
        config_path="/etc/turnlog.toml",
        receipt_key="/srv/keys/receipt.pem",
        tools_dir="tools",
        filters_dir="/opt/filters",
        pipes_dir="/opt/pipes",
    )
    paths = service_paths(settings)
    # A file in a system folder is hidden alone, never the whole of /etc.
    assert "/etc/turnlog.toml" in paths and "/etc" not in paths
    assert {"/srv/keys/receipt.pem", "/srv/keys", str(Path("tools").resolve()), "/opt/filters", "/opt/pipes", str(tmp_path)} <= set(paths)


def test_tool_server_headers_are_secrets_held(tmp_path: Path) -> None:
    """Headers of MCP and OpenAPI tool servers may carry keys: a weak sandbox must be refused for them."""
    plain = make_settings(tmp_path, None, openai_api_key=None, tool_servers={"api": {"url": "http://a"}})
    assert "tool_servers (headers)" not in secrets_held(plain)
    keyed = make_settings(tmp_path, None, openai_api_key=None, tool_servers={"api": {"url": "http://a", "headers": {"Authorization": "Bearer k"}}})
    assert "tool_servers (headers)" in secrets_held(keyed)


async def test_sandboxed_code_cannot_read_the_config_key_tools_or_filters(tmp_path: Path, secrets_dir: Path) -> None:
    executor = build_code_executor(deployment(tmp_path, secrets_dir, code_timeout=LIMITS.wall_seconds))
    assert isinstance(executor, SandboxExecutor)
    await executor.start()
    assert executor.report is not None and not executor.report.get("hooks"), executor.report
    out = await executor.run(snoop_code(secrets_dir), "python")
    assert_nothing_seen(out, secrets_dir)


def _interpreter_for_nobody() -> str | None:
    """A Python that another user can run (ours may sit under /root)."""
    for candidate in (sys.executable, "/usr/bin/python3", "/usr/local/bin/python3"):
        real = os.path.realpath(candidate)
        folders = [Path(real), *Path(real).parents]
        if os.path.exists(real) and all(os.stat(f).st_mode & stat.S_IXOTH for f in folders):
            return candidate
    return None


async def run_as_nobody(hide: list[str], code: str) -> dict[str, Any]:
    """The non-root mode: the sandbox of a service running as an ordinary
    user (nobody) is an unprivileged user namespace. The service's side (the
    hidden paths, the child's settings) is built by the caller; the sandbox's
    child runs as nobody, as that service would start it. Its report."""
    python = _interpreter_for_nobody()
    if os.geteuid() != 0 or python is None:
        unavailable("needs root (to become nobody) and a Python nobody can run")
    header = marshal.dumps({"limits": LIMITS.as_dict(), "uid": None, "hide": hide, "isolation": "auto"}, 4)
    proc = await asyncio.create_subprocess_exec(
        python,
        "-I",
        "-S",
        "-c",
        BOOT,
        MARKER,
        str(os.getpid()),
        cwd="/",
        user=NOBODY,
        group=NOBODY,
        extra_groups=[],
        env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": "/tmp/sandbox"},
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    stdout, stderr = await asyncio.wait_for(proc.communicate(len(header).to_bytes(4, "big") + header + code.encode()), 60)
    assert proc.returncode == 0, stderr.decode()
    report: dict[str, Any] = marshal.loads(stdout)
    if report["isolation"].get("hooks"):
        unavailable(f"no unprivileged user namespaces here: {report['isolation'].get('unshare_error')}")
    assert "user" in report["isolation"]["namespaces"]
    return report


async def test_in_a_user_namespace_too(tmp_path: Path, secrets_dir: Path) -> None:
    executor = build_code_executor(deployment(tmp_path, secrets_dir))
    assert isinstance(executor, SandboxExecutor)
    assert_nothing_seen(await run_as_nobody(executor.hide, snoop_code(secrets_dir)), secrets_dir)


# -- no user namespaces of its own ----------------------------------------------------------

USERNS_CODE = """
import ctypes, json, os, shutil, subprocess
tries = {}
libc = ctypes.CDLL(None, use_errno=True)
pid = os.fork()  # unshare(CLONE_NEWUSER) in a child: its success must not change this process
if pid == 0:
    ok = libc.unshare(0x10000000) == 0
    os._exit(0 if ok else 1)
tries["unshare"] = "allowed" if os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0 else "refused"
if shutil.which("unshare"):
    done = subprocess.run(["unshare", "-r", "id", "-u"], capture_output=True, text=True)
    tries["unshare -r"] = "allowed" if done.returncode == 0 else done.stderr.strip()
import threading
seen = []
worker = threading.Thread(target=seen.append, args=(1,))  # (clone3 refused, threads still start)
worker.start()
worker.join()
tries["thread"] = seen
print(json.dumps(tries))
"""


def assert_no_user_namespaces(stdout: str) -> None:
    tries = json.loads(stdout)
    assert tries["unshare"] == "refused", tries
    assert tries.get("unshare -r", "Operation not permitted").endswith("Operation not permitted"), tries
    assert tries["thread"] == [1]


async def test_code_cannot_create_user_namespaces() -> None:
    executor = SandboxExecutor(LIMITS)
    text = await executor.start()
    assert executor.report is not None and not executor.report.get("hooks"), executor.report
    if executor.report.get("nested_userns") != "refused":
        unavailable(f"new user namespaces are not refused on this machine: {executor.report.get('nested_userns')}")
    assert "new user namespaces refused" in text
    out = await executor.run(USERNS_CODE, "python")
    assert out["stderr"] == "", out["stderr"]
    assert_no_user_namespaces(out["stdout"])


async def test_code_cannot_create_user_namespaces_in_a_user_namespace_either() -> None:
    report = await run_as_nobody([], USERNS_CODE)
    assert report["stderr"] == "", report["stderr"]
    assert_no_user_namespaces(report["stdout"])


async def test_the_hook_fallback_hides_them_from_python_code(tmp_path: Path) -> None:
    # /tmp is visible without namespaces; not tmp_path, whose mode 700 would
    # stop the run's other uid (as root) before the hook had anything to do.
    root = _populate(Path(tempfile.mkdtemp(prefix="turnlog-secrets-")))
    try:
        weak = SandboxExecutor(LIMITS, hide=service_paths(deployment(tmp_path, root)), isolation="hooks")
        await weak.start()
        assert_nothing_seen(await weak.run(snoop_code(root), "python"), root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


async def test_a_deployment_with_secrets_refuses_the_hook_fallback(tmp_path: Path, upstream: ScriptedUpstream) -> None:
    root = _populate(Path(tempfile.mkdtemp(dir=tmp_path)))
    weak = SandboxExecutor(LIMITS, isolation="hooks")
    with pytest.raises(WeakSandboxRefused, match=r"config_path, receipt_key.*TURNLOG_CODE_ALLOW_WEAK_SANDBOX"):
        await start_code_executor(weak, deployment(tmp_path, root))
    # An upstream key alone is a secret too (the service's environment is one
    # /proc read away for native code running as the service's user).
    with pytest.raises(WeakSandboxRefused, match="openai_api_key"):
        await start_code_executor(weak, make_settings(tmp_path, upstream.url))
    # The served app does not start on it.
    with pytest.raises(WeakSandboxRefused):
        await start_service(make_settings(tmp_path, upstream.url), upstream, code_executor=weak)
    # Opted in, or nothing secret to reach: it starts (with the warning).
    await start_code_executor(weak, deployment(tmp_path, root, code_allow_weak_sandbox=True))
    await start_code_executor(weak, make_settings(tmp_path, upstream.url, openai_api_key=None))


async def test_serve_without_namespaces_refuses_to_start_with_secrets_unless_told(tmp_path: Path) -> None:
    """``turnlog serve`` where the sandbox cannot create namespaces (root
    without CAP_SYS_ADMIN, as in a container) and an upstream key is set:
    exit status 2 naming the secret, or a start with the opt-in."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        unavailable("needs root and setpriv (util-linux) to drop CAP_SYS_ADMIN")
    port = free_port()
    command = ["setpriv", "--bounding-set=-sys_admin", *turnlog_command("serve", "--port", str(port))]
    env = {**os.environ, "TURNLOG_DATABASE_URL": f"sqlite+aiosqlite:///{tmp_path / 'turnlog.db'}", "TURNLOG_OPENAI_API_KEY": "sk-test"}
    env.pop("TURNLOG_CODE_ALLOW_WEAK_SANDBOX", None)
    proc = await asyncio.create_subprocess_exec(*command, cwd=REPO, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    _, stderr = await asyncio.wait_for(proc.communicate(), 60)
    text = stderr.decode()
    assert proc.returncode == 2, text
    assert "WEAK isolation" in text and "holds secrets (openai_api_key)" in text and "TURNLOG_CODE_ALLOW_WEAK_SANDBOX=1" in text, text

    env["TURNLOG_CODE_ALLOW_WEAK_SANDBOX"] = "1"
    proc = await asyncio.create_subprocess_exec(*command, cwd=REPO, env=env, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    try:
        async with aiohttp.ClientSession() as http:
            deadline = time.monotonic() + 30
            while True:  # polled: another process
                assert proc.returncode is None, "serve exited although the weak sandbox was allowed"
                try:
                    async with http.get(f"http://127.0.0.1:{port}/healthz") as resp:
                        if resp.status == 200:
                            break
                except aiohttp.ClientError:
                    pass
                assert time.monotonic() < deadline, "serve did not start with TURNLOG_CODE_ALLOW_WEAK_SANDBOX=1"
                await asyncio.sleep(0.1)
    finally:
        if proc.returncode is None:
            proc.terminate()
        _, stderr = await asyncio.wait_for(proc.communicate(), 30)
    assert "the weak sandbox may reach openai_api_key" in stderr.decode()
