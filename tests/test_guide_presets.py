"""docs/guides/presets.md runs: its ``<!-- config: FILE -->`` block is the
configuration a real ``turnlog serve --demo --config FILE`` starts with, and
every block marked ``<!-- run -->`` runs against it (bash through bash, in
order, in one folder), printing what its ``expect="…"`` names. Every other
block says why it is not run, and every TOML block is a valid configuration."""

from __future__ import annotations

import asyncio
import re
import subprocess
import tomllib
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from adapters.config import Settings, _file_settings
from tests.processes import ROOT, Server

GUIDE = ROOT / "docs" / "guides" / "presets.md"
MARKER = re.compile(r'^<!-- (run(?: expect="([^"]*)")?|config: (\S+)|not run: [^>]+) -->$')
FENCE = re.compile(r"^```(\w*)$")


@dataclass(frozen=True)
class Block:
    line: int
    lang: str
    code: str
    kind: str  # run | config | not run
    expect: str | None = None
    file: str | None = None


def blocks() -> list[Block]:
    lines = GUIDE.read_text().splitlines()
    out: list[Block] = []
    i = 0
    while i < len(lines):
        fence = FENCE.match(lines[i])
        if not fence:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j] == "```")
        marker = MARKER.match(lines[i - 1])
        assert marker is not None, f"presets.md:{i + 1}: a code block needs <!-- run -->, <!-- config: FILE --> or <!-- not run: why -->"
        code = "\n".join(lines[i + 1 : end]) + "\n"
        what = marker.group(1)
        kind = "run" if what.startswith("run") else "config" if what.startswith("config") else "not run"
        out.append(Block(i + 1, fence.group(1), code, kind, marker.group(2), marker.group(3)))
        i = end + 1
    return out


def test_every_toml_block_is_a_valid_configuration() -> None:
    tomls = [b for b in blocks() if b.lang == "toml"]
    assert len(tomls) >= 3
    for block in tomls:
        Settings(**_file_settings(tomllib.loads(block.code), f"presets.md:{block.line}"))


def test_the_guide_runs_against_a_real_server(tmp_path: Path) -> None:
    found = blocks()
    config = next(b for b in found if b.kind == "config")
    assert config.file is not None
    path = tmp_path / config.file
    path.write_text(config.code)
    runs = [b for b in found if b.kind == "run"]
    assert len(runs) >= 4 and all(b.lang == "bash" and b.expect for b in runs)
    server = Server(tmp_path / "turnlog.db", None, auto_resume=True, args=("--demo", "--config", str(path)))

    async def ready() -> None:
        async with aiohttp.ClientSession() as http:
            await server.ready(http)

    try:
        asyncio.run(ready())
        for block in runs:
            code = block.code.replace("127.0.0.1:8080", f"127.0.0.1:{server.port}")
            assert code != block.code, f"presets.md:{block.line} does not talk to the server"
            done = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=90)
            assert done.returncode == 0, f"presets.md:{block.line} exited {done.returncode}:\n{done.stdout}\n{done.stderr}\n{server.log_tail()}"
            assert block.expect is not None and block.expect in done.stdout, f"presets.md:{block.line} did not print {block.expect!r}:\n{done.stdout}"
    finally:
        server.stop()
