"""What one uploaded file may cost: its text, its chunks, its extraction time,
and a stop (SIGTERM) that does not wait for it.

The "bomb" is a PDF of a few KB whose one page is a compressed stream of
text operators: pypdf's time grows faster than linearly with a page's text
(about 3 s for 10,000 lines, 30 s for 40,000 on an idle core), which is what
made a 60 KB PDF cost minutes of CPU before anything was capped.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
import zlib
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from adapters.knowledge.extract_process import MARKER
from tests.documents import _assemble, pdf, prose, upload, wait_file
from tests.harness import Service, make_settings, start_service, stop_service
from tests.processes import Server
from tests.upstream import ScriptedUpstream

LINE = "(" + "All work and no play makes Jack a dull boy. " * 2 + ") Tj T*\n"


def pdf_bomb(lines: int) -> bytes:
    """One page: ``lines`` lines of 90 characters, in a Flate stream (~0.35 bytes a line)."""
    packed = zlib.compress(("BT /F1 11 Tf 14 TL 72 740 Td\n" + LINE * lines + "ET").encode(), 9)
    return _assemble(
        [
            b"<< /Type /Catalog /Pages 2 0 R >>",
            b"<< /Type /Pages /Kids [4 0 R] /Count 1 >>",
            b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica /Encoding /WinAnsiEncoding >>",
            b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources << /Font << /F1 3 0 R >> >> /Contents 5 0 R >>",
            f"<< /Length {len(packed)} /Filter /FlateDecode >>\nstream\n".encode() + packed + b"\nendstream",
        ]
    )


def extraction_children(server_pid: int) -> list[int]:
    """Pids of the extraction processes the service ``server_pid`` started."""
    ours = f"{MARKER}\0{server_pid}\0".encode()
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as fh:
                    if ours in fh.read():
                        found.append(int(entry))
            except OSError:
                continue
    return found


@pytest.fixture
async def capped(tmp_path: Path, upstream: ScriptedUpstream, database_url: str) -> AsyncIterator[Service]:
    settings = make_settings(tmp_path, upstream.url, database_url=database_url, file_max_text_bytes=40_000, file_max_chunks=5)
    svc = await start_service(settings, upstream)
    try:
        yield svc
    finally:
        await stop_service(svc)


@pytest.fixture
async def hurried(tmp_path: Path, upstream: ScriptedUpstream, database_url: str) -> AsyncIterator[Service]:
    # 3 s: a normal PDF's child start and pypdf import fit even on a loaded machine.
    svc = await start_service(make_settings(tmp_path, upstream.url, database_url=database_url, file_extract_seconds=3.0), upstream)
    try:
        yield svc
    finally:
        await stop_service(svc)


async def test_a_files_text_over_the_cap_fails_with_the_reason(capped: Service) -> None:
    http, base = capped.http, capped.url
    # 8 pages of ~9 KB each: extraction stops at the fifth page, the file fails.
    pages = [[f"page {p} line {i} " + "x" * 80 for i in range(100)] for p in range(8)]
    status, body = await upload(http, base, "long.pdf", pdf(pages), "application/pdf")
    assert status == 200
    done = await wait_file(http, base, body["id"])
    assert done["status"] == "failed" and "over the limit of 40,000 bytes" in done["error"], done
    assert done["chunks"] is None
    status, body = await upload(http, base, "long.txt", ("word " * 9000).encode(), "text/plain")
    done = await wait_file(http, base, body["id"])
    assert done["status"] == "failed" and "TURNLOG_FILE_MAX_TEXT_BYTES" in done["error"], done
    # Within the cap: ready.
    status, body = await upload(http, base, "short.pdf", pdf([["a short page"]]), "application/pdf")
    assert (await wait_file(http, base, body["id"]))["status"] == "ready"


async def test_a_file_over_the_chunk_cap_fails_with_the_reason(capped: Service) -> None:
    http, base = capped.http, capped.url
    status, body = await upload(http, base, "many.md", prose(3000).encode(), "text/markdown")  # ~10 chunks of 400 tokens
    done = await wait_file(http, base, body["id"])
    assert done["status"] == "failed" and "over the limit of 5 (TURNLOG_FILE_MAX_CHUNKS)" in done["error"], done
    status, body = await upload(http, base, "few.md", prose(300).encode(), "text/markdown")
    done = await wait_file(http, base, body["id"])
    assert done["status"] == "ready" and done["chunks"] <= 5, done


async def test_an_extraction_past_its_time_is_killed_and_the_file_fails(hurried: Service) -> None:
    http, base = hurried.http, hurried.url
    started = time.monotonic()
    status, body = await upload(http, base, "bomb.pdf", pdf_bomb(40_000), "application/pdf")  # ~30 s of extraction
    assert status == 200 and body["bytes"] < 20_000, body
    done = await wait_file(http, base, body["id"])
    assert done["status"] == "failed" and "took longer than 3 s (TURNLOG_FILE_EXTRACT_SECONDS)" in done["error"], done
    assert time.monotonic() - started < 15  # not the 30 s the extraction would have taken
    status, body = await upload(http, base, "small.pdf", pdf([["a short page"]]), "application/pdf")
    assert (await wait_file(http, base, body["id"]))["status"] == "ready"  # the next one is not held up
    assert extraction_children(os.getpid()) == []  # killed, not left running


async def test_sigterm_stops_an_ingestion_within_the_drain_time_and_the_restart_resumes_it(tmp_path: Path) -> None:
    drain = 2.0
    db = tmp_path / "turnlog.db"
    bomb = pdf_bomb(20_000)  # ~10 s of extraction on an idle core, 1.8 MB of text
    async with aiohttp.ClientSession() as http:
        first = Server(db, None, auto_resume=True, log_dir=tmp_path, TURNLOG_DRAIN_SECONDS=str(drain))
        try:
            await first.ready(http)
            status, body = await upload(http, first.url, "bomb.pdf", bomb, "application/pdf")
            assert status == 200
            file_id = body["id"]
            deadline = time.monotonic() + 20
            while not extraction_children(first.proc.pid):  # polled: another process's children
                assert time.monotonic() < deadline, f"the extraction never started:\n{first.log_tail()}"
                await asyncio.sleep(0.05)
            stopped_at = time.monotonic()
            first.proc.send_signal(signal.SIGTERM)
            code = await asyncio.get_running_loop().run_in_executor(None, first.proc.wait, 30)
            stop_seconds = time.monotonic() - stopped_at
        finally:
            first.stop()
        print(f"SIGTERM to exit with an ingestion running: {stop_seconds:.2f} s (drain {drain:g} s)")
        assert code == 0, first.log_tail()
        assert stop_seconds < drain + 1.0, f"took {stop_seconds:.2f} s to stop"
        assert extraction_children(first.proc.pid) == []

        second = Server(db, None, auto_resume=True, log_dir=tmp_path, TURNLOG_DRAIN_SECONDS=str(drain))
        try:
            await second.ready(http)
            done = await wait_file(http, second.url, file_id, timeout=120)
        finally:
            second.stop()
    assert done["status"] == "ready" and done["chars"] > 1_000_000 and done["chunks"] > 100, done
