"""Text extraction in a child process, which a time limit or a stop can kill.

A small PDF can take minutes to extract (pypdf is superlinear in a page's
text: a 14 KB page of compressed text operators is 30 s of CPU) and a worker
thread cannot be stopped: it would hold the service's exit (SIGTERM) until it
is done. So PDF and HTML are extracted by ``python -c …child_main()`` (the
service's interpreter): the document on stdin, the text (``T`` + UTF-8) or
the reason it failed (``E`` + text) on stdout. Past ``timeout`` seconds, or
when the ingestion is cancelled (the service stops), the child is killed at
once; a stopped ingestion leaves its file ``processing``, resumed at the next
start.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

from adapters.knowledge.extract import ExtractionError, extract_text

#: The folder holding the ``adapters`` package, for the child's imports.
ROOT = str(Path(__file__).resolve().parent.parent.parent)
BOOT = f"import sys; sys.path.insert(0, {ROOT!r}); from adapters.knowledge.extract_process import child_main; child_main()"
#: In the child's command line: ``ps`` tells what it is (and tests find it).
MARKER = "turnlog-extract"


async def extract_isolated(data: bytes, content_type: str, max_bytes: int, timeout: float) -> str:
    """``extract_text`` in a child process killed after ``timeout`` seconds
    (an :class:`ExtractionError` saying so) or when the caller is cancelled."""
    header = f"{content_type}\n{max_bytes}\n".encode()
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        BOOT,
        MARKER,
        str(os.getpid()),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"},  # none of the service's secrets
        start_new_session=True,  # a SIGINT at the terminal is the service's to handle
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(header + data), timeout)
    except TimeoutError:
        raise ExtractionError(f"extracting the text took longer than {timeout:g} s (TURNLOG_FILE_EXTRACT_SECONDS)") from None
    finally:
        if proc.returncode is None:  # timed out, or cancelled: the service is stopping
            proc.kill()
            await proc.wait()
    if out[:1] == b"T":
        return out[1:].decode("utf-8")
    if out[:1] == b"E":
        raise ExtractionError(out[1:].decode("utf-8", "replace"))
    tail = err.decode("utf-8", "replace").strip().splitlines()[-1:] or [f"exit status {proc.returncode}"]
    raise ExtractionError(f"the text could not be extracted: {tail[0][:300]}")


def child_main() -> None:
    raw = sys.stdin.buffer.read()
    content_type, limit, data = raw.split(b"\n", 2)
    try:
        text = extract_text(data, content_type.decode(), int(limit))
    except ExtractionError as exc:
        sys.stdout.buffer.write(b"E" + str(exc).encode("utf-8", "replace"))
    else:
        sys.stdout.buffer.write(b"T" + text.encode("utf-8"))
    sys.stdout.flush()
