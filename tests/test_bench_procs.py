"""The benchmark's per-thread CPU reading (bench/procs.py), against what a
thread measures of itself."""

from __future__ import annotations

import os
import sys
import threading
import time

import pytest

from bench.procs import thread_cpu_seconds

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def test_each_thread_is_charged_its_own_cpu_not_the_others() -> None:
    measured: dict[str, float] = {}

    def burn() -> None:
        measured["tid"] = threading.get_native_id()
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

    tid = measured["tid"]
    assert tid != os.getpid() and tid not in before and tid in after
    assert after[tid] == pytest.approx(measured["self"], abs=0.05)
    assert after[os.getpid()] - before[os.getpid()] == pytest.approx(main_took, abs=0.05)
    assert after[os.getpid()] - before[os.getpid()] < 0.15  # the burn is not the main thread's


def test_a_gone_process_reads_as_no_threads() -> None:
    with open("/proc/sys/kernel/pid_max") as f:
        beyond = int(f.read()) + 1
    assert thread_cpu_seconds(beyond) == {}
