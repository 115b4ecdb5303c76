"""The benchmark's readings (bench/procs.py): per-thread CPU against what a
thread measures of itself; a process's CPU, exited threads included, against
what the process measures of itself; the histograms of a ``/metrics`` page against the
observations the test made."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from bench.procs import cpu_seconds, histograms, thread_cpu_seconds

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def test_each_thread_is_charged_its_own_cpu_not_the_others() -> None:
    measured: dict[str, float] = {}
    tids: list[int] = []

    def burn() -> None:
        tids.append(threading.get_native_id())
        start = time.thread_time()
        while time.thread_time() - start < 0.3:
            sum(range(1000))
        measured["self"] = time.thread_time() - start
        burned.set()
        done.wait()  # alive (listed in /proc) until read

    burned, done = threading.Event(), threading.Event()
    worker = threading.Thread(target=burn)
    before = thread_cpu_seconds(os.getpid())
    main_before = time.thread_time()
    worker.start()
    assert burned.wait(10)  # the main thread blocks: next to no CPU of its own
    after = thread_cpu_seconds(os.getpid())
    main_took = time.thread_time() - main_before
    done.set()
    worker.join()

    (tid,) = tids
    assert tid != os.getpid() and tid not in before and tid in after
    assert after[tid] == pytest.approx(measured["self"], abs=0.05)
    assert after[os.getpid()] - before[os.getpid()] == pytest.approx(main_took, abs=0.05)
    assert after[os.getpid()] - before[os.getpid()] < 0.15  # the burn is not the main thread's


def test_a_gone_process_reads_as_no_threads() -> None:
    with open("/proc/sys/kernel/pid_max") as f:
        beyond = int(f.read()) + 1
    assert thread_cpu_seconds(beyond) == {}


CHILD = """
import sys, threading, time

def burn() -> None:
    start = time.thread_time()
    while time.thread_time() - start < 0.137:
        sum(range(1000))

for _ in range(3):  # threads that burn CPU, then exit before the parent reads
    t = threading.Thread(target=burn)
    t.start()
    t.join()
print(repr(time.process_time()), flush=True)
sys.stdin.readline()  # blocked (no CPU) while the parent reads
"""


def test_a_process_cpu_counts_exited_threads_to_the_microsecond() -> None:
    """The guard compares CPU over short windows: a reading that misses
    exited threads, or ticks in 10 ms steps, turns those ratios into noise."""
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdin is not None
        own = float(child.stdout.readline())
        read = cpu_seconds(child.pid)
        child.stdin.write("\n")
        child.stdin.flush()
        assert child.wait(10) == 0
    finally:
        child.kill()
    assert own > 3 * 0.137  # the exited threads' CPU is in the process's own figure
    # Between its own reading and ours the child only prints and blocks.
    assert own <= read < own + 0.002


@pytest.fixture
def metrics_page() -> Iterator[tuple[str, CollectorRegistry]]:
    """A loopback server answering ``GET /metrics`` from a registry the test fills."""
    registry = CollectorRegistry()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = generate_latest(registry) if self.path == "/metrics" else b""
            self.send_response(200 if body else 404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1", registry
    finally:
        server.shutdown()
        server.server_close()


def test_histograms_of_a_metrics_page(metrics_page: tuple[str, CollectorRegistry]) -> None:
    v1, registry = metrics_page
    buckets = (0.001, 0.01, 0.1, 1.0)
    waits = Histogram("turnlog_store_wait_seconds", "w", buckets=buckets, registry=registry)
    pauses = Histogram("turnlog_gc_pause_seconds", "g", ["generation"], buckets=buckets, registry=registry)
    Histogram("other_seconds", "o", registry=registry).observe(1.0)
    for seconds in [0.0005] * 60 + [0.05] * 39 + [0.5]:  # 100: half in the first bucket, 99 within 0.1, one up to 1
        waits.observe(seconds)
    pauses.labels("0").observe(0.005)
    pauses.labels("0").observe(0.005)
    pauses.labels("2").observe(0.2)
    seen = histograms(v1, ("turnlog_store_wait_seconds", "turnlog_gc_pause_seconds", "turnlog_absent_seconds"))
    assert seen is not None and set(seen) == {"turnlog_store_wait_seconds", "turnlog_gc_pause_seconds"}
    assert seen["turnlog_store_wait_seconds"] == {
        "": {"count": 100, "total_ms": pytest.approx(60 * 0.5 + 39 * 50 + 500, abs=0.1), "p50_le_ms": 1.0, "p99_le_ms": 100.0, "longest_le_ms": 1000.0}
    }
    gc = seen["turnlog_gc_pause_seconds"]
    assert (gc["0"]["count"], gc["0"]["longest_le_ms"], gc["2"]["count"], gc["2"]["longest_le_ms"]) == (2, 10.0, 1, 1000.0)


def test_histograms_of_no_page_is_none() -> None:
    with socket.socket() as s:  # a loopback port nobody listens on once closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert histograms(f"http://127.0.0.1:{port}/v1", ("turnlog_gc_pause_seconds",), timeout=2.0) is None
