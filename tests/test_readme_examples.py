"""Every README.md code block marked ``<!-- run -->`` runs against a real
``turnlog serve --demo``: bash blocks through bash, Python blocks through this
interpreter, with the README's ``127.0.0.1:8080`` rewritten to the server's
port. Each must exit 0 and print what its marker's ``expect="…"`` names.
Every other code block must say why it is not run (``<!-- not run: … -->``),
so a new example cannot slip past unclassified."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest

from tests.processes import ROOT, Server

README = ROOT / "README.md"
MARKER = re.compile(r'^<!-- (run(?: expect="((?:[^"\\]|\\.)*)")?|not run: [^>]+) -->$')
FENCE = re.compile(r"^```(\w*)$")


@dataclass(frozen=True)
class Block:
    line: int  # 1-based line of the opening fence
    lang: str
    code: str
    run: bool
    expect: str | None

    def __str__(self) -> str:
        return f"README.md:{self.line} ({self.lang})"


def parse(text: str) -> tuple[list[Block], list[int]]:
    """The fenced blocks and their markers; also the lines of fences with no
    marker right above them."""
    lines = text.splitlines()
    blocks: list[Block] = []
    unmarked: list[int] = []
    i = 0
    while i < len(lines):
        fence = FENCE.match(lines[i])
        if not fence:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j] == "```")
        marker = MARKER.match(lines[i - 1]) if i > 0 else None
        lang = fence.group(1)
        if marker is None:
            if lang != "text":  # diagrams are not code
                unmarked.append(i + 1)
        else:
            expect = marker.group(2)
            blocks.append(
                Block(
                    line=i + 1,
                    lang=lang,
                    code="\n".join(lines[i + 1 : end]) + "\n",
                    run=marker.group(1).startswith("run"),
                    expect=expect.replace('\\"', '"') if expect is not None else None,
                )
            )
        i = end + 1
    return blocks, unmarked


def runnable(text: str) -> list[Block]:
    return [b for b in parse(text)[0] if b.run]


BLOCKS = runnable(README.read_text())


def test_every_code_block_is_marked_run_or_not_run() -> None:
    blocks, unmarked = parse(README.read_text())
    assert unmarked == [], f"README code blocks at lines {unmarked} need <!-- run --> or <!-- not run: why -->"
    assert {b.lang for b in blocks if b.run} == {"bash", "python"}, "the README shows both curl and the SDK"
    assert all(b.lang in ("bash", "python") for b in BLOCKS)
    assert len(BLOCKS) >= 6


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("readme")
    server = Server(tmp / "turnlog.db", None, auto_resume=True, args=("--demo",))

    async def ready() -> None:
        async with aiohttp.ClientSession() as http:
            await server.ready(http)

    try:
        asyncio.run(ready())
        yield server
    finally:
        server.stop()


def execute(block: Block, port: int, cwd: Path) -> subprocess.CompletedProcess[str]:
    code = block.code.replace("127.0.0.1:8080", f"127.0.0.1:{port}")
    command = ["bash", "-e", "-o", "pipefail", "-c", code] if block.lang == "bash" else [sys.executable, "-c", code]
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=90)


@pytest.mark.parametrize("block", BLOCKS, ids=str)
def test_readme_example_runs(block: Block, demo: Server, tmp_path: Path) -> None:
    assert "127.0.0.1:8080" in block.code, "an example that does not talk to the server tests nothing"
    done = execute(block, demo.port, tmp_path)
    assert done.returncode == 0, f"{block} exited {done.returncode}:\n{done.stdout}\n{done.stderr}\n{demo.log_tail()}"
    if block.expect is not None:
        assert block.expect in done.stdout, f"{block} did not print {block.expect!r}:\n{done.stdout}\n{done.stderr}"
