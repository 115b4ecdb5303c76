"""Roles: a key is ``user`` (the default) or ``admin``; with auth on the
operator's endpoints (``/metrics``) answer a user key 403, and a scraper reads
``/metrics`` with ``TURNLOG_METRICS_TOKEN`` instead of an admin key."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from adapters.store import create_engine, open_store
from adapters.store.common import hash_api_key
from adapters.store.migrate import migrate
from tests.backends import POSTGRES, SQLITE
from tests.harness import make_settings, start_service, stop_service
from tests.pg import pg_empty_database  # noqa: F401  (fixture)
from tests.upstream import ScriptedUpstream

ROOT = Path(__file__).resolve().parent.parent
METRICS_TOKEN = "scrape-me-0123456789"


async def _get(svc: Any, path: str, token: str | None) -> tuple[int, str, str]:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    async with svc.http.get(svc.url + path, headers=headers) as resp:
        return resp.status, resp.headers.get("Content-Type", ""), await resp.text()


async def test_metrics_need_an_admin_key_or_the_metrics_token(tmp_path: Path, upstream: ScriptedUpstream, database_url: str) -> None:
    settings = make_settings(tmp_path, upstream.url, auth="on", database_url=database_url, metrics_token=METRICS_TOKEN)
    svc = await start_service(settings, upstream)
    try:
        store = svc.services.store
        user, admin = await store.create_api_key("alice"), await store.create_api_key("root", "admin")
        status, ctype, body = await _get(svc, "/metrics", user)
        assert status == 403 and ctype.startswith("application/json"), body
        assert '"code": "admin_required"' in body and "turnlog_turns_started_total" not in body
        for token in (admin, METRICS_TOKEN):
            status, _, body = await _get(svc, "/metrics", token)
            assert status == 200 and "turnlog_turns_started_total" in body
        # the token reads /metrics only: elsewhere it is no key at all
        status, _, body = await _get(svc, "/v1/chats", METRICS_TOKEN)
        assert status == 401 and "invalid_api_key" in body
        status, _, _ = await _get(svc, "/metrics", METRICS_TOKEN + "x")
        assert status == 401
        # a user key still reaches its own endpoints
        status, _, _ = await _get(svc, "/v1/chats", user)
        assert status == 200
    finally:
        await stop_service(svc)


async def test_without_a_metrics_token_only_an_admin_key_reads_metrics(tmp_path: Path, upstream: ScriptedUpstream, database_url: str) -> None:
    svc = await start_service(make_settings(tmp_path, upstream.url, auth="on", database_url=database_url), upstream)
    try:
        user = await svc.services.store.create_api_key("alice")
        assert (await _get(svc, "/metrics", user))[0] == 403
        assert (await _get(svc, "/metrics", None))[0] == 401
    finally:
        await stop_service(svc)


async def test_with_auth_off_the_caller_is_an_admin(tmp_path: Path, upstream: ScriptedUpstream, database_url: str) -> None:
    svc = await start_service(make_settings(tmp_path, upstream.url, auth="off", database_url=database_url), upstream)
    try:
        status, _, body = await _get(svc, "/metrics", None)
        assert status == 200 and "turnlog_turns_started_total" in body
    finally:
        await stop_service(svc)


def _turnlog(db: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TURNLOG_DATABASE_URL": f"sqlite+aiosqlite:///{db}"}
    return subprocess.run([sys.executable, "-m", "adapters.cli", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)


@pytest.mark.backends(SQLITE)
def test_keys_create_takes_a_role_default_user(tmp_path: Path) -> None:
    db = tmp_path / "keys.db"
    plain = _turnlog(db, "keys", "create", "--user", "alice")
    admin = _turnlog(db, "keys", "create", "--user", "root", "--role", "admin")
    wrong = _turnlog(db, "keys", "create", "--user", "eve", "--role", "root")
    assert plain.returncode == 0 and admin.returncode == 0, (plain.stderr, admin.stderr)
    assert wrong.returncode == 2 and "--role" in wrong.stderr
    with sqlite3.connect(db) as conn:
        rows = dict(conn.execute("select key_hash, role from api_keys").fetchall())
    assert rows == {hash_api_key(plain.stdout.strip()): "user", hash_api_key(admin.stdout.strip()): "admin"}


@pytest.mark.backends(SQLITE, POSTGRES)
async def test_keys_from_before_roles_become_user_keys(db_backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    if db_backend == POSTGRES:
        url = request.getfixturevalue("pg_empty_database")()
    else:
        url = f"sqlite+aiosqlite:///{tmp_path / 'old.db'}"
    await migrate(url, "0008")  # the schema before roles
    engine = create_engine(url)
    try:
        async with engine.begin() as conn:
            await conn.execute(
                text("INSERT INTO api_keys (key_hash, user_id, created_at) VALUES (:h, 'old-user', 1.0)"),
                {"h": hash_api_key("tl-old-key")},
            )
    finally:
        await engine.dispose()
    await migrate(url)
    store = await open_store(url)
    try:
        holder = await store.key_holder("tl-old-key")
        assert holder is not None and (holder.user_id, holder.role) == ("old-user", "user")
        new_admin = await store.create_api_key("root", "admin")
        holder = await store.key_holder(new_admin)
        assert holder is not None and holder.role == "admin"
    finally:
        await store.close()
    # and back: the column goes, the keys stay
    await _downgrade(url, "0008")
    engine = create_engine(url)
    try:
        async with engine.connect() as conn:
            rows = (await conn.execute(text("SELECT * FROM api_keys ORDER BY user_id"))).mappings().all()
    finally:
        await engine.dispose()
    assert [sorted(str(k) for k in r.keys()) for r in rows] == [["created_at", "key_hash", "user_id"]] * 2
    assert [r["user_id"] for r in rows] == ["old-user", "root"]


async def _downgrade(url: str, revision: str) -> None:
    from alembic import command

    from adapters.store.migrate import alembic_config

    cfg = alembic_config(url)
    engine = create_engine(url)
    try:
        async with engine.begin() as conn:

            def down(sync: Any) -> None:
                cfg.attributes["connection"] = sync
                command.downgrade(cfg, revision)

            await conn.run_sync(down)
    finally:
        await engine.dispose()
