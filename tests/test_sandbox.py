"""The sandbox code executor, running real code in real child processes.

Nothing is mocked: each test starts the sandbox as the service would
(``SandboxExecutor``, or the service built by ``create_app`` from its
settings) and checks what the code could and could not do. The limits are
small so that the stopping tests take seconds. As root (CI) the runs use
other uids; as a normal user, a user namespace (see docs/guides/code-execution.md
for what each gives).
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import socket
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from adapters.code import CodeLimits, SandboxExecutor
from adapters.code.sandbox import MARKER
from tests.harness import Service, make_settings, start_service, stop_service
from tests.polling import until
from tests.upstream import Reply, ScriptedUpstream

LIMITS = CodeLimits(wall_seconds=4.0, cpu_seconds=2, memory_mb=256, max_processes=16, output_bytes=4096, max_files=4, files_bytes=64 * 1024)
LEGACY = {"params": {"function_calling": "default"}, "features": {"code_interpreter": True}}


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    """A stand-in for the service's data folder: a mode-600 database file with a secret."""
    folder = tmp_path / "data"
    folder.mkdir(mode=0o700)
    db = folder / "turnlog.db"
    db.write_text("sk-secret-in-the-database")
    db.chmod(0o600)
    return folder


@pytest.fixture
async def sandbox(data_dir: Path) -> SandboxExecutor:
    executor = SandboxExecutor(LIMITS, hide=[str(data_dir)])
    await executor.start()
    return executor


def sandbox_processes() -> list[int]:
    """Pids of every sandbox process this test process started: their command
    line carries the marker and our pid (another xdist worker's runs, of any
    test using the default executor, come and go meanwhile)."""
    ours = f"{MARKER}\0{os.getpid()}\0".encode()
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                if ours in fh.read():
                    pids.append(int(entry))
        except OSError:
            continue
    return pids


def stdout_json(out: dict[str, Any]) -> Any:
    assert out["stderr"] == "", out["stderr"]
    return json.loads(out["stdout"])


# -- the basics --------------------------------------------------------------------------


async def test_print_and_the_last_expression(sandbox: SandboxExecutor) -> None:
    assert await sandbox.run("print(1)", "python") == {"stdout": "1\n", "stderr": "", "result": None}
    out = await sandbox.run("x = 6 * 7\nprint('x is', x)\n{'answer': x}", "python")
    assert out["stdout"] == "x is 42\n" and out["result"] == "{'answer': 42}"
    assert (await sandbox.run("if True:\n    y = 1\n", "python"))["result"] is None  # last statement not an expression
    assert (await sandbox.run("None", "python"))["result"] is None  # like a REPL, None shows nothing


async def test_an_exception_shows_the_codes_traceback_only(sandbox: SandboxExecutor) -> None:
    out = await sandbox.run("def f():\n    return 1 / 0\nf()", "python")
    assert out["stdout"] == "" and out["result"] is None
    assert 'File "<code>", line 2, in f' in out["stderr"] and "ZeroDivisionError: division by zero" in out["stderr"]
    assert "sandbox_child" not in out["stderr"]  # the runner's frames are not the code's business
    out = await sandbox.run("print(", "python")
    assert "SyntaxError" in out["stderr"]


async def test_other_languages_are_refused_not_raised(sandbox: SandboxExecutor) -> None:
    out = await sandbox.run("console.log(1)", "javascript")
    assert "Python only" in out["stderr"] and out["stdout"] == ""


async def test_the_environment_is_empty_of_the_services_secrets(sandbox: SandboxExecutor, monkeypatch: pytest.MonkeyPatch, data_dir: Path) -> None:
    monkeypatch.setenv("TURNLOG_OPENAI_API_KEY", "sk-secret")
    code = f"""
import json, os
found = {{"environ": dict(os.environ), "secrets_in_proc": [], "reads": {{}}}}
for pid in os.listdir("/proc"):
    if pid.isdigit():
        for name in ("environ", "cmdline"):
            try:
                if b"sk-secret" in open(f"/proc/{{pid}}/{{name}}", "rb").read():
                    found["secrets_in_proc"].append((pid, name))
            except OSError:
                pass
for path in ("/etc/shadow", {str(data_dir / "turnlog.db")!r}, {str(Path.cwd() / "pyproject.toml")!r}):
    try:
        found["reads"][path] = open(path).read()[:40]
    except OSError as exc:
        found["reads"][path] = type(exc).__name__
print(json.dumps(found))
"""
    found = stdout_json(await sandbox.run(code, "python"))
    assert set(found["environ"]) <= {"PATH", "LANG", "HOME", "TMPDIR"}, found["environ"]
    assert found["secrets_in_proc"] == []
    reads = found["reads"]
    assert reads["/etc/shadow"] in ("PermissionError", "FileNotFoundError")
    assert reads[str(data_dir / "turnlog.db")] in ("PermissionError", "FileNotFoundError")
    assert reads[str(Path.cwd() / "pyproject.toml")] in ("PermissionError", "FileNotFoundError")  # the service's folder
    assert "sk-secret" not in json.dumps(found)


async def test_no_network_not_even_loopback_nor_dns(sandbox: SandboxExecutor) -> None:
    connections: list[int] = []

    async def accepted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(1)
        writer.close()

    server = await asyncio.start_server(accepted, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    code = f"""
import json, socket
tries = {{}}
for name, target in (("loopback", ("127.0.0.1", {port})), ("internet", ("1.1.1.1", 53))):
    try:
        socket.create_connection(target, timeout=2).close()
        tries[name] = "connected"
    except OSError as exc:
        tries[name] = type(exc).__name__
for host in ("example.com", "pypi.org"):
    try:
        socket.getaddrinfo(host, 443)
        tries[host] = "resolved"
    except OSError as exc:
        tries[host] = type(exc).__name__
try:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.sendto(b"x", ("8.8.8.8", 53))
    tries["udp"] = "sent"
except OSError as exc:
    tries["udp"] = type(exc).__name__
print(json.dumps(tries))
"""
    try:
        tries = stdout_json(await sandbox.run(code, "python"))
    finally:
        server.close()
        await server.wait_closed()
    assert "connected" not in tries.values() and "resolved" not in tries.values() and tries["udp"] != "sent", tries
    assert connections == []


# -- the limits ----------------------------------------------------------------------------


async def test_an_infinite_loop_is_stopped(sandbox: SandboxExecutor) -> None:
    started = time.monotonic()
    out = await sandbox.run("print('looping', flush=True)\nwhile True:\n    pass", "python")
    assert time.monotonic() - started < LIMITS.wall_seconds + 3
    assert out["stdout"] == "looping\n"
    assert "[stopped: the CPU time limit of 2 s was reached]" in out["stderr"] or "[stopped: the wall-clock limit" in out["stderr"]


async def test_sleeping_past_the_wall_clock_is_stopped(sandbox: SandboxExecutor) -> None:
    started = time.monotonic()
    out = await sandbox.run("import time\nprint('sleeping', flush=True)\ntime.sleep(3600)", "python")
    assert LIMITS.wall_seconds <= time.monotonic() - started < LIMITS.wall_seconds + 3
    assert out["stdout"] == "sleeping\n"
    assert out["stderr"] == "[stopped: the wall-clock limit of 4 s was reached]"


async def test_a_memory_bomb_is_stopped(sandbox: SandboxExecutor) -> None:
    out = await sandbox.run("blocks = []\nwhile True:\n    blocks.append(bytearray(16 * 1024 * 1024))", "python")
    assert "MemoryError" in out["stderr"] and "[stopped: the memory limit of 256 MB was reached]" in out["stderr"]
    out = await sandbox.run("x = bytearray(10**12)", "python")
    assert "MemoryError" in out["stderr"]


async def test_a_fork_bomb_is_stopped_and_cleaned_up(sandbox: SandboxExecutor) -> None:
    # Children that spin forever, and a parent that keeps forking: capped by
    # the process limit, then everything ends with the run.
    code = """
import os
n = 0
while True:
    try:
        if os.fork() == 0:
            while True:
                try:
                    os.fork()
                except OSError:
                    pass
        n += 1
    except OSError as exc:
        print("fork refused after", n, "children:", exc.strerror, flush=True)
        break
"""
    started = time.monotonic()
    out = await sandbox.run(code, "python")
    assert time.monotonic() - started < LIMITS.wall_seconds + 3
    assert "fork refused after" in out["stdout"] and "Resource temporarily unavailable" in out["stdout"]
    assert sandbox_processes() == []  # nothing left behind
    # A bomb whose first process never ends is stopped by the wall clock, with the same cleanup.
    out = await sandbox.run("import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass", "python")
    assert "[stopped:" in out["stderr"]
    assert sandbox_processes() == []


async def test_a_cancelled_run_leaves_nothing_behind(sandbox: SandboxExecutor) -> None:
    # What the engine does at its tool timeout or when the turn is cancelled.
    code = "import os, time\nfor _ in range(2):\n    os.fork()\nprint('forked', flush=True)\ntime.sleep(3600)"
    run = asyncio.ensure_future(sandbox.run(code, "python"))
    # Its processes are ours to see (the marker and this process's pid): the
    # supervisor and the code's four, plus init in a pid namespace.
    deadline = time.monotonic() + 10
    while len(sandbox_processes()) < 5 and time.monotonic() < deadline and not run.done():
        await asyncio.wait([run], timeout=0.05)
    assert len(sandbox_processes()) >= 5
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    # The supervisor is killed at once; its init follows it (PR_SET_PDEATHSIG)
    # and the kernel empties the pid namespace: wait for that, bounded.
    await until(lambda: not sandbox_processes(), "the sandbox's processes are gone", within=5, every=0.05)
    assert (await sandbox.run("print(2)", "python"))["stdout"] == "2\n"  # its slot is free again


async def test_an_output_flood_is_truncated(sandbox: SandboxExecutor) -> None:
    out = await sandbox.run("import sys\nfor i in range(2000):\n    print('x' * 999)\nsys.stderr.write('e' * 100_000)\n'done'", "python")
    assert out["stdout"].startswith("x" * 999 + "\n")
    head, _, note = out["stdout"].rpartition("\n[… ")
    assert len(head.encode()) == LIMITS.output_bytes and note == f"{2000 * 1000 - LIMITS.output_bytes:,} more bytes of output not shown]"
    assert out["stderr"].endswith(f"[… {100_000 - LIMITS.output_bytes:,} more bytes of output not shown]")
    assert out["result"] == "'done'"  # the run itself was not cut short


async def test_a_big_file_hits_the_file_size_limit(sandbox: SandboxExecutor) -> None:
    out = await sandbox.run(f"open('big.bin', 'wb').write(b'0' * {(LIMITS.file_size_mb + 1) * 1024 * 1024})", "python")
    assert "File too large" in out["stderr"]


# -- files --------------------------------------------------------------------------------------


async def test_files_written_come_back(sandbox: SandboxExecutor) -> None:
    code = """
import os
open("report.csv", "w").write("a,b\\n1,2\\n")
os.mkdir("plots")
open("plots/chart.png", "wb").write(bytes(range(256)))
os.symlink("/etc/passwd", "passwd")  # never followed
os.mkfifo("pipe")                    # never opened
os.getcwd()
"""
    out = await sandbox.run(code, "python")
    assert out["stderr"] == ""
    files = {f["name"]: f for f in out["files"]}
    assert set(files) == {"report.csv", "plots/chart.png"}
    assert base64.b64decode(files["report.csv"]["data"]) == b"a,b\n1,2\n" and files["report.csv"]["mime"] == "text/csv"
    assert base64.b64decode(files["plots/chart.png"]["data"]) == bytes(range(256)) and files["plots/chart.png"]["mime"] == "image/png"
    # The working directory is a fresh one each time.
    assert "files" not in await sandbox.run("import os\nos.listdir('.')", "python")


async def test_files_are_capped_in_count_and_bytes(sandbox: SandboxExecutor) -> None:
    out = await sandbox.run("for i in range(6):\n    open(f'f{i}.txt', 'w').write('x' * 10)", "python")
    assert len(out["files"]) == LIMITS.max_files
    assert "[2 file(s) not returned: the limit is 4 files" in out["stderr"]
    out = await sandbox.run("open('a.bin', 'wb').write(b'1' * 60_000)\nopen('b.bin', 'wb').write(b'2' * 60_000)", "python")
    assert [f["name"] for f in out["files"]] == ["a.bin"] and "1 file(s) not returned" in out["stderr"]


async def test_concurrent_runs_do_not_see_each_other(sandbox: SandboxExecutor) -> None:
    code = """
import json, os, time
open("{name}.txt", "w").write("{name}")
written = time.time()
time.sleep(1.0)  # the other run writes meanwhile
seen = sorted(os.listdir(".")) + sorted(os.listdir("/tmp"))
print(json.dumps({{"written": written, "listed": time.time(), "seen": seen}}))
"""
    a, b = await asyncio.gather(sandbox.run(code.format(name="alpha"), "python"), sandbox.run(code.format(name="beta"), "python"))
    ra, rb = stdout_json(a), stdout_json(b)
    assert ra["written"] < rb["listed"] and rb["written"] < ra["listed"], "the runs did not overlap"
    assert ra["seen"] == ["alpha.txt", "sandbox"] and rb["seen"] == ["beta.txt", "sandbox"]
    assert [f["name"] for f in a["files"]] == ["alpha.txt"] and [f["name"] for f in b["files"]] == ["beta.txt"]


# -- the fallback without namespaces ----------------------------------------------------


async def test_the_hook_fallback_still_blocks_sockets_and_secrets(monkeypatch: pytest.MonkeyPatch, data_dir: Path) -> None:
    monkeypatch.setenv("TURNLOG_OPENAI_API_KEY", "sk-secret")
    weak = SandboxExecutor(LIMITS, hide=[str(data_dir)], isolation="hooks")
    assert "audit hook" in await weak.start()
    code = f"""
import json, os, socket
tries = {{"environ": sorted(os.environ)}}
for name, action in (
    ("socket", lambda: socket.create_connection(("127.0.0.1", 9), timeout=1)),
    ("dns", lambda: socket.getaddrinfo("example.com", 443)),
    ("database", lambda: open({str(data_dir / "turnlog.db")!r}).read()),
    ("shadow", lambda: open("/etc/shadow").read()),
    ("parent", lambda: open(f"/proc/{{os.getppid()}}/environ").read()),
    ("program", lambda: os.system("true")),
):
    try:
        action()
        tries[name] = "allowed"
    except OSError as exc:
        tries[name] = type(exc).__name__
open("out.txt", "w").write("ok")
print(json.dumps(tries))
"""
    out = await weak.run(code, "python")
    tries = stdout_json(out)
    assert "allowed" not in tries.values(), tries
    assert set(tries["environ"]) <= {"PATH", "LANG", "HOME", "TMPDIR"}
    assert [f["name"] for f in out["files"]] == ["out.txt"]
    assert "sk-secret" not in json.dumps(out)


# -- in the service -------------------------------------------------------------------------------


@pytest.fixture
async def service_with_sandbox(tmp_path: Path, upstream: ScriptedUpstream, database_url: str) -> AsyncIterator[Service]:
    # No executor passed: create_app builds the configured one, the sandbox.
    settings = make_settings(tmp_path, upstream.url, database_url=database_url, code_timeout=4.0, code_cpu_seconds=2, code_max_processes=16)
    svc = await start_service(settings, upstream)
    try:
        yield svc
    finally:
        await stop_service(svc)


async def code_turn(svc: Service, code: str) -> dict[str, Any]:
    """A legacy code-interpreter turn running ``code``; the turn's code item."""
    svc.upstream.enqueue(
        Reply(chunks=['Running it.\n<code_interpreter type="code" lang="python">\n', code, "\n</code_interpreter>"]),
        Reply(text="Done."),
    )
    status, body, headers = await svc.post("/v1/chat/completions", {"model": "gpt-test", "messages": [{"role": "user", "content": "run"}], **LEGACY})
    assert status == 200, body
    view = await svc.turn(headers["X-Turn-Id"])
    assert view["status"] == "completed"
    item: dict[str, Any] = [i for i in view["output"] if i["type"] == "code_interpreter"][0]
    return item


@pytest.mark.sqlite_only
async def test_code_turns_run_in_the_sandbox_and_the_service_stays_healthy(service_with_sandbox: Service, monkeypatch: pytest.MonkeyPatch) -> None:
    svc = service_with_sandbox
    monkeypatch.setenv("TURNLOG_OPENAI_API_KEY", "sk-secret")
    db_file = svc.settings.database_url.split("///", 1)[1]
    os.chmod(db_file, 0o600)

    item = await code_turn(svc, "print(6 * 7)\n[n * n for n in range(4)]")
    assert item["output"] == {"stdout": "42\n", "stderr": "", "result": "[0, 1, 4, 9]"} and item["status"] == "completed"
    replayed = svc.upstream.requests[-1]["messages"][-1]["content"]
    assert "<code_interpreter_output>\n42\n" in replayed  # the model saw the output

    snoop = f"""
import os
for path in ({db_file!r}, "/etc/shadow"):
    try:
        print(open(path, "rb").read()[:16])
    except OSError as exc:
        print(type(exc).__name__)
print(sorted(os.environ))
"""
    item = await code_turn(svc, snoop)
    lines = item["output"]["stdout"].splitlines()
    assert lines[0] in ("PermissionError", "FileNotFoundError") and lines[1] in ("PermissionError", "FileNotFoundError")
    assert "TURNLOG" not in lines[2] and "sk-secret" not in json.dumps(item)

    port = int(svc.url.rsplit(":", 1)[1])
    item = await code_turn(svc, f"import socket\nsocket.create_connection(('127.0.0.1', {port}))")  # the service itself
    assert "Network is unreachable" in item["output"]["stderr"]

    # A fork bomb in one turn while the service keeps answering.
    bomb = asyncio.ensure_future(code_turn(svc, "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"))
    answered = 0
    while not bomb.done():
        started = time.monotonic()
        status, body = await asyncio.wait_for(svc.get("/healthz"), 5.0)
        assert status == 200 and body == {"ok": True} and time.monotonic() - started < 2.0
        answered += 1
        await asyncio.wait([bomb], timeout=0.2)  # a health probe every 0.2 s until the turn ends
    item = bomb.result()
    assert "[stopped:" in item["output"]["stderr"] and answered >= 3
    assert sandbox_processes() == []

    item = await code_turn(svc, "open('hello.txt', 'w').write('hi')\nprint('written')")
    [written] = item["output"]["files"]  # the file's bytes went to the blob store, the log keeps its URL
    assert (written["name"], written["mime"], written["data"]["bytes"]) == ("hello.txt", "text/plain", 2)
    status, body = await svc.get(written["data"]["url"])
    assert status == 200 and body == "hi"


def test_socket_module_is_real() -> None:
    # The network tests above are meaningful only if this process can itself connect to loopback.
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        socket.create_connection(server.getsockname(), timeout=2).close()
