"""Processes of a benchmark run: spawn, wait until ready, sample, always clean up.

Every child is started in its own session (a Ctrl-C on the terminal reaches only
the orchestrator, which then stops the children in order) with
``PR_SET_PDEATHSIG = SIGTERM`` (if the orchestrator is killed outright, the
kernel still stops them). ``Procs.close()`` sends SIGTERM, waits a bounded time,
then SIGKILLs; it runs from ``finally`` and ``atexit``.
"""

from __future__ import annotations

import atexit
import ctypes
import json
import os
import queue
import resource
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parent.parent  # the repository (holds engine/, adapters/, bench/)
CLK_TCK = os.sysconf("SC_CLK_TCK")


class BenchError(Exception):
    """The harness could not measure (a process did not start, a client timed out...)."""


def _child_setup() -> None:  # runs in the child between fork and exec
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except Exception:  # noqa: BLE001 - best effort (not Linux/glibc)
        pass


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Lines:
    """Reads a pipe in a thread (so it never fills up) into a queue of lines."""

    def __init__(self, stream: Any) -> None:
        self.q: queue.Queue[str | None] = queue.Queue()
        self.thread = threading.Thread(target=self._run, args=(stream,), daemon=True)
        self.thread.start()

    def _run(self, stream: Any) -> None:
        try:
            for line in stream:
                self.q.put(line.decode("utf-8", "replace").rstrip("\n"))
        except Exception:  # noqa: BLE001
            pass
        finally:
            self.q.put(None)

    def get(self, deadline: float) -> str | None:
        """The next line; None at EOF; raises TimeoutError past ``deadline``."""
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError
        try:
            return self.q.get(timeout=remaining)
        except queue.Empty:
            raise TimeoutError from None


class Procs:
    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.children: list[tuple[str, subprocess.Popen[bytes]]] = []
        self._closed = False
        self.turnlog_env: dict[str, str] = {}
        atexit.register(self.close)

    def env(self, extra: dict[str, str] | None = None, *, drop_prefix: str | None = None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not (drop_prefix and k.startswith(drop_prefix))}
        env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        env["PYTHONUNBUFFERED"] = "1"
        env.update(extra or {})
        return env

    def spawn(
        self,
        name: str,
        argv: list[str],
        *,
        env: dict[str, str] | None = None,
        stdout_pipe: bool = True,
        drop_env_prefix: str | None = None,
    ) -> tuple[subprocess.Popen[bytes], _Lines | None]:
        if self._closed:
            raise BenchError("harness is shutting down")
        log = open(self.workdir / f"{name}.log", "ab")
        try:
            proc = subprocess.Popen(
                argv,
                cwd=str(ROOT),
                env=self.env(env, drop_prefix=drop_env_prefix),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE if stdout_pipe else log,
                stderr=log,
                start_new_session=True,
                preexec_fn=_child_setup,
            )
        finally:
            log.close()
        self.children.append((name, proc))
        return proc, (_Lines(proc.stdout) if stdout_pipe else None)

    def log_tail(self, name: str, n: int = 20) -> str:
        try:
            lines = (self.workdir / f"{name}.log").read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-n:])

    def start_url_server(self, name: str, argv: list[str], timeout: float = 30.0) -> tuple[subprocess.Popen[bytes], str]:
        """A server that prints its base URL as its first stdout line."""
        proc, lines = self.spawn(name, argv)
        assert lines is not None
        try:
            url = lines.get(time.monotonic() + timeout)
        except TimeoutError:
            url = None
        if not url or not url.startswith("http"):
            self.stop(proc)
            raise BenchError(f"{name} did not start: {url!r}\n{self.log_tail(name)}")
        return proc, url

    def start_turnlog(
        self,
        name: str,
        upstream_v1: str,
        db_path: Path,
        timeout: float = 60.0,
        *,
        database_url: str | None = None,
        extra_env: dict[str, str] | None = None,
        port: int | None = None,
        module: str = "adapters.cli",
    ) -> tuple[subprocess.Popen[bytes], str]:
        """``turnlog serve`` (python -m adapters.cli) on a free port (or ``port``), temp SQLite DB, auth off;
        ``module``: another entry point that takes ``serve``'s arguments (``bench.callcount``).

        ``TURNLOG_*`` variables of the caller's environment are NOT passed on (a
        benchmark must not pick up a real deployment's settings); ``turnlog_env``
        (``--turnlog-env KEY=VALUE``) adds settings on purpose, ``extra_env``
        those a scenario needs (e.g. ``TURNLOG_TOOLS_DIR``); ``database_url``
        replaces the SQLite file (e.g. a PostgreSQL URL).
        """
        port = port or free_port()
        env = {
            **self.turnlog_env,
            **(extra_env or {}),
            "TURNLOG_DATABASE_URL": database_url or f"sqlite+aiosqlite:///{db_path}",
            "TURNLOG_OPENAI_BASE_URL": upstream_v1,
            "TURNLOG_OPENAI_API_KEY": "sk-bench",
            "TURNLOG_AUTH": "off",
            "TURNLOG_HOST": "127.0.0.1",
            "TURNLOG_PORT": str(port),
        }
        argv = [sys.executable, "-m", module, "serve", "--host", "127.0.0.1", "--port", str(port)]
        proc, _ = self.spawn(name, argv, env=env, stdout_pipe=False, drop_env_prefix="TURNLOG_")
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise BenchError(f"{name} exited with {proc.returncode}\n{self.log_tail(name)}")
            try:
                with urllib.request.urlopen(url + "/healthz", timeout=2) as r:
                    if r.status == 200:
                        break
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                self.stop(proc)
                raise BenchError(f"{name} not healthy after {timeout:g}s\n{self.log_tail(name)}")
            time.sleep(0.05)
        return proc, url + "/v1"

    def run_client(
        self,
        spec: dict[str, Any],
        *,
        name: str = "client",
        on_event: Callable[[dict[str, Any]], None] | None = None,
        grace: float = 30.0,
        argv: list[str] | None = None,
        env: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        """Run ``bench.client`` (or another client: ``argv``, given ``--spec @FILE``)
        with ``spec``; return its result (events go to ``on_event``)."""
        timeout = float(spec.get("timeout_s", 120))
        spec_file = self.workdir / f"{name}-spec.json"
        spec_file.write_text(json.dumps(spec))
        argv = argv or [sys.executable, "-m", "bench.client"]
        proc, lines = self.spawn(name, [*argv, "--spec", "@" + str(spec_file)], env=env)
        assert lines is not None
        deadline = time.monotonic() + timeout + grace
        result: dict[str, Any] | None = None
        try:
            while True:
                try:
                    line = lines.get(deadline)
                except TimeoutError:
                    raise BenchError(f"client {name} gave no result within {timeout + grace:g}s") from None
                if line is None:
                    break
                try:
                    obj = json.loads(line)
                except ValueError:
                    continue
                if "event" in obj:
                    if on_event is not None:
                        on_event(obj)
                elif "phases" in obj:
                    result = obj
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            raise BenchError(f"client {name} did not exit") from None
        finally:
            self.stop(proc, timeout=3.0)
        if result is None:
            raise BenchError(f"client {name} exited ({proc.returncode}) without a result\n{self.log_tail(name)}")
        return result

    def cpu_used(self) -> float:
        """CPU seconds used so far by this process and every child it started
        (reaped children through RUSAGE_CHILDREN, running ones through /proc)."""
        ru = resource.getrusage(resource.RUSAGE_CHILDREN)
        total = time.process_time() + ru.ru_utime + ru.ru_stime
        for _name, proc in self.children:
            if proc.returncode is not None:  # reaped: already in RUSAGE_CHILDREN
                continue
            try:
                total += cpu_seconds(proc.pid)
            except (OSError, ValueError, IndexError):
                pass
        return total

    def stop(self, proc: subprocess.Popen[bytes], timeout: float = 10.0) -> None:
        if proc.poll() is None:
            try:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                try:
                    proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    pass
            except ProcessLookupError:
                pass
        if proc.stdout is not None:
            try:
                proc.stdout.close()
            except OSError:
                pass
        self.children = [(n, p) for n, p in self.children if p is not proc]

    def close(self) -> None:
        """Stop every child still running (most recently started first)."""
        for _name, proc in reversed(list(self.children)):
            self.stop(proc, timeout=10.0)
        self._closed = True


# -- /proc ------------------------------------------------------------------------


def rss_kb(pid: int) -> int:
    """VmRSS of ``pid`` in kB."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise BenchError(f"no VmRSS for {pid}")


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system) of the whole process so far, in nanosecond steps.

    Read from the process's CPU-time clock (``clock_getcpuclockid`` on Linux:
    the clock id is ``(~pid << 3) | CPUCLOCK_SCHED``), which counts every
    thread, live and exited. The per-thread ``schedstat`` sum misses exited
    threads, and utime + stime from ``/proc/PID/stat`` tick in 1/CLK_TCK s,
    too coarse for the short windows the guard compares: those ticks are the
    fallback only when the clock cannot be read (not Linux, or a zombie).
    """
    try:
        return time.clock_gettime((~pid << 3) | 2)
    except (OSError, OverflowError, ValueError):
        pass
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime, stime (fields 14, 15)


def thread_cpu_seconds(pid: int) -> dict[int, float]:
    """CPU time (user + system) of each live thread of ``pid``, by thread id.

    From the per-thread ``schedstat`` (nanoseconds). The event loop of
    ``turnlog serve`` runs on the main thread (tid == pid): its share is what
    one core's budget per chunk is set against, since the store's writer
    thread runs on another core.
    """
    out: dict[int, float] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                out[int(tid)] = int(f.read().split()[0]) / 1e9
        except (OSError, ValueError, IndexError):
            continue  # the thread exited between the listing and the read
    return out


def histograms(base_v1: str, names: tuple[str, ...], timeout: float = 10.0) -> dict[str, dict[str, Any]] | None:
    """Histograms of turnlog's ``GET /metrics`` so far: per name, per value of
    its one label (``""`` without a label), how many observations, their
    total, and the smallest bucket bounds covering half, 99 % and all of them
    (an upper bound of each: the histogram has nothing finer). None if not served."""
    url = base_v1.rstrip("/").removesuffix("/v1") + "/metrics"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            text = r.read().decode()
    except OSError:
        return None
    out: dict[str, dict[str, Any]] = {}
    for family in text_string_to_metric_families(text):
        if family.name not in names:
            continue
        series = out.setdefault(family.name, {})
        for sample in family.samples:
            labels = {k: v for k, v in sample.labels.items() if k != "le"}
            one = series.setdefault(",".join(labels.values()), {"count": 0, "total_ms": 0.0, "buckets": {}})
            if sample.name.endswith("_count"):
                one["count"] = int(sample.value)
            elif sample.name.endswith("_sum"):
                one["total_ms"] = round(sample.value * 1000, 1)
            elif sample.name.endswith("_bucket"):
                one["buckets"][float(sample.labels["le"])] = sample.value
    for series in out.values():
        for one in series.values():
            buckets = one.pop("buckets")
            for key, share in (("p50_le_ms", 0.5), ("p99_le_ms", 0.99), ("longest_le_ms", 1.0)):
                covering = [bound for bound, n in buckets.items() if n >= share * one["count"]]
                one[key] = min(covering) * 1000 if one["count"] and covering else None
    return out or None


def http_json(method: str, url: str, body: Any = None, timeout: float = 10.0) -> Any:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read() or b"null")


def _cpu_times() -> tuple[float, float]:
    with open("/proc/stat") as f:
        fields = [float(x) for x in f.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0.0)  # idle + iowait
    return sum(fields[:8]) / CLK_TCK, idle / CLK_TCK  # user..steal (guest is already in user)


def host_busy_cores(interval: float = 0.5) -> float:
    """Machine-wide busy CPUs (all processes) over ``interval`` seconds."""
    total0, idle0 = _cpu_times()
    time.sleep(interval)
    total1, idle1 = _cpu_times()
    return max(0.0, ((total1 - total0) - (idle1 - idle0)) / interval)


def wait_quiet(max_wait: float, threshold: float = 0.3) -> dict[str, Any]:
    """Wait (at most ``max_wait`` s) until the host is nearly idle: other work on
    the machine (a test suite...) would be measured as turnlog's slowness."""
    t0 = time.monotonic()
    busy = host_busy_cores(0.5)
    while busy > threshold and time.monotonic() - t0 < max_wait:
        busy = host_busy_cores(0.5)
    return {"busy_cores": round(busy, 2), "waited_s": round(time.monotonic() - t0, 1)}
