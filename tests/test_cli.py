"""The ``turnlog`` command line, run as a real process against a real database."""

from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from adapters.config import load_settings
from tests import chain_oracle
from tests.harness import Service, make_settings, start_service, stop_service
from tests.pg import unavailable
from tests.processes import Server
from tests.upstream import Reply

ROOT = Path(__file__).resolve().parents[1]


def turnlog(db: Path, *args: str, **env_extra: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TURNLOG_DATABASE_URL": f"sqlite+aiosqlite:///{db}", **env_extra}
    return subprocess.run([sys.executable, "-m", "adapters.cli", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)


def test_migrate_and_keys_create(tmp_path: Path) -> None:
    db = tmp_path / "fresh.db"
    assert turnlog(db, "migrate").returncode == 0
    assert turnlog(db, "migrate").returncode == 0  # idempotent
    out = turnlog(db, "keys", "create", "--user", "alice")
    assert out.returncode == 0
    lines = out.stdout.splitlines()
    assert len(lines) == 1 and lines[0].startswith("tl-")
    with sqlite3.connect(db) as conn:
        assert conn.execute("select user_id from api_keys").fetchall() == [("alice",)]
        assert lines[0] not in json.dumps(conn.execute("select * from api_keys").fetchall())


READ_ONLY = [("turns", "list"), ("turns", "show", "turn_x"), ("turns", "events", "turn_x"), ("replay", "turn_x"), ("verify", "turn_x"), ("export", "turn_x")]


@pytest.mark.parametrize("command", READ_ONLY, ids=lambda c: " ".join(c[:2]))
def test_a_read_only_command_never_creates_the_database(tmp_path: Path, command: tuple[str, ...]) -> None:
    db = tmp_path / "elsewhere" / "turnlog.db"
    db.parent.mkdir()
    out = turnlog(db, *command)
    assert out.returncode == 1 and out.stdout == ""
    assert out.stderr.strip() == (
        f"turnlog: database sqlite+aiosqlite:///{db} does not exist (no file {db}); set TURNLOG_DATABASE_URL or --database-url to the service's database"
    )
    assert list(db.parent.iterdir()) == []


def test_a_read_only_command_names_a_missing_postgres_database() -> None:
    base = os.environ.get("TURNLOG_TEST_POSTGRES_URL")
    if not base:
        unavailable("TURNLOG_TEST_POSTGRES_URL is not set")
    url = base.rsplit("/", 1)[0] + "/turnlog_no_such_database"
    env = {**os.environ, "TURNLOG_DATABASE_URL": url}
    out = subprocess.run([sys.executable, "-m", "adapters.cli", "turns", "list"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert out.stderr.startswith(f"turnlog: database {url} does not exist"), out.stderr


@pytest.mark.sqlite_only
async def test_turns_commands_and_replay(service: Service, tmp_path: Path) -> None:
    service.upstream.enqueue(Reply(text="cli answer"))
    status, _, headers = await service.post(
        "/v1/chat/completions", {"model": "gpt-test", "messages": [{"role": "user", "content": "q"}], "chat_id": "chat-cli"}
    )
    assert status == 200
    turn_id = headers["X-Turn-Id"]
    db = tmp_path / "turnlog.db"

    # The answer came back before the chat's background tasks (title, tags,
    # follow-ups) ran: the turn completes after them.
    view = await service.wait_status(turn_id, "completed")
    listing = turnlog(db, "turns", "list", "--chat", "chat-cli")
    assert listing.returncode == 0, listing.stderr
    header, row = listing.stdout.splitlines()
    assert header.split() == ["TURN", "CHAT", "STATUS", "MODEL", "CREATED", "UPDATED"]
    assert row.split()[0] == turn_id  # scripts cut the id from the second line
    created = datetime.fromtimestamp(view["created_at"]).strftime("%Y-%m-%d %H:%M:%S")
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", created)
    # aligned: every value starts under its column's title
    for title, value in (("CHAT", "chat-cli"), ("STATUS", "completed"), ("MODEL", "gpt-test"), ("CREATED", created)):
        assert row.index(value) == header.index(title), (title, listing.stdout)
    assert turn_id not in turnlog(db, "turns", "list", "--status", "failed").stdout
    as_json = json.loads(turnlog(db, "turns", "list", "--chat", "chat-cli", "--json").stdout)
    assert [(t["id"], t["status"], t["created_at"]) for t in as_json["turns"]] == [(turn_id, "completed", view["created_at"])]

    shown = turnlog(db, "turns", "show", turn_id)
    assert shown.returncode == 0, shown.stderr
    summary = shown.stdout.splitlines()
    assert f"turn     {turn_id}" in summary and "status   completed (state done, finish_reason stop)" in summary
    assert f"created  {created}" in summary and "chat     chat-cli" in summary
    assert summary[summary.index("content:") + 1] == "  cli answer"
    assert "output: 1 item" in summary and "  1. message: 'cli answer' [completed]" in summary
    assert any(line.startswith("usage    prompt ") and line.endswith(" tokens") for line in summary)
    raw = turnlog(db, "turns", "show", turn_id, "--json")
    assert raw.returncode == 0 and json.loads(raw.stdout) == view

    events = turnlog(db, "turns", "events", turn_id)
    lines = [json.loads(line) for line in events.stdout.splitlines()]
    assert [e["seq"] for e in lines] == list(range(1, len(lines) + 1))
    after = turnlog(db, "turns", "events", turn_id, "--after", "3")
    assert [json.loads(line)["seq"] for line in after.stdout.splitlines()][0] == 4

    replay = turnlog(db, "replay", turn_id)
    assert replay.returncode == 0, replay.stderr
    n_events = len(lines)
    assert replay.stdout.splitlines() == [
        f"turn     {turn_id}: {n_events} events replayed",
        "status   completed (state done, finish_reason stop)",
        "answer:",
        "  cli answer",
        "tool calls: none",
        "verdict  the log replays to the stored view",
    ]
    as_json = turnlog(db, "replay", turn_id, "--json")
    assert as_json.returncode == 0 and json.loads(as_json.stdout) == view

    # tamper with the stored view: replay must notice
    with sqlite3.connect(db) as conn:
        view = json.loads(conn.execute("select view from turns where id = ?", (turn_id,)).fetchone()[0])
        view["content"] = "forged"
        conn.execute("update turns set view = ? where id = ?", (json.dumps(view), turn_id))
    tampered = turnlog(db, "replay", turn_id)
    assert tampered.returncode == 1 and "content" in tampered.stderr
    assert tampered.stdout.splitlines()[-1] == "verdict  DIFFERS from the stored view in: content"
    assert "  cli answer" in tampered.stdout.splitlines()  # what the log says, not the forged view
    tampered_json = turnlog(db, "replay", turn_id, "--json")
    assert tampered_json.returncode == 1 and json.loads(tampered_json.stdout)["content"] == "cli answer"

    missing = turnlog(db, "turns", "show", "turn_nope")
    assert missing.returncode == 1 and "no turn" in missing.stderr


def test_serve_refuses_insecure_non_loopback(tmp_path: Path) -> None:
    out = turnlog(tmp_path / "x.db", "serve", "--host", "0.0.0.0", "--port", "1", TURNLOG_AUTH="off")
    assert out.returncode == 2 and "TURNLOG_AUTH=on" in out.stderr


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
async def test_serve_runs_on_the_configured_event_loop(loop: str, upstream: Any, tmp_path: Path) -> None:
    if loop == "uvloop":
        pytest.importorskip("uvloop")
    server = Server(tmp_path / "loop.db", upstream.url, auto_resume=False, TURNLOG_EVENT_LOOP=loop)
    try:
        async with aiohttp.ClientSession() as http:
            await server.ready(http)
            body = {"model": "gpt-test", "messages": [{"role": "user", "content": "hi"}]}
            upstream.enqueue(Reply(text="on " + loop))
            async with http.post(server.url + "/v1/chat/completions", json=body) as resp:
                assert resp.status == 200
                assert (await resp.json())["choices"][0]["message"]["content"] == "on " + loop
    finally:
        server.stop()
    assert f"event loop {loop}" in server.log_path.read_text()


def test_a_config_file_takes_tables_beside_its_turnlog_table_and_names_mistakes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TURNLOG_PORT", raising=False)
    good = tmp_path / "good.toml"
    good.write_text('[turnlog]\nport = 9001\n\n[models."gpt-x"]\nsystem = "Be brief."\n\n[filters.shout]\nsuffix = "?!"\n')
    settings = load_settings(good)
    assert settings.port == 9001 and settings.models["gpt-x"].system == "Be brief." and settings.filters == {"shout": {"suffix": "?!"}}

    twice = tmp_path / "twice.toml"
    twice.write_text("port = 1\n[turnlog]\nport = 2\n")
    typo = tmp_path / "typo.toml"
    typo.write_text("[turnlog]\nprot = 9001\n")
    for path, said in ((twice, "port set both at the top level and under [turnlog]"), (typo, "unknown setting(s) prot")):
        out = turnlog(tmp_path / "x.db", "--config", str(path), "migrate")
        assert out.returncode == 2 and said in out.stderr, out.stderr


def test_serve_refuses_an_unknown_event_loop(tmp_path: Path) -> None:
    out = turnlog(tmp_path / "x.db", "serve", "--port", "1", TURNLOG_EVENT_LOOP="trio")
    assert out.returncode != 0 and "event_loop" in (out.stderr + out.stdout)


def test_serve_refuses_a_negative_window_bound(tmp_path: Path) -> None:
    out = turnlog(tmp_path / "x.db", "serve", "--port", "1", TURNLOG_FLUSH_MAX_INTERVAL="-1")
    assert out.returncode != 0 and "flush_max_interval" in (out.stderr + out.stdout)


@pytest.mark.sqlite_only
async def test_verify_reproduces_a_turn_and_catches_a_forged_log(service: Service, tmp_path: Path) -> None:
    service.upstream.enqueue(Reply(chunks=["<think>", "plan", "</think>", "Verified ", "answer"]))
    status, _, headers = await service.post("/v1/chat/completions", {"model": "gpt-test", "messages": [{"role": "user", "content": "q"}]})
    assert status == 200
    turn_id = headers["X-Turn-Id"]
    db = tmp_path / "turnlog.db"
    ok = turnlog(db, "verify", turn_id)
    assert ok.returncode == 0 and ok.stdout.startswith("ok:"), ok.stderr
    recorded = len(turnlog(db, "turns", "events", turn_id).stdout.splitlines())
    assert f"ok: turn {turn_id} reproduced: {recorded} events recorded" in ok.stdout
    # forge the log: the engine would never have finalized with this finish reason
    with sqlite3.connect(db) as conn:
        row = conn.execute("select id, data, seq from events where turn_id = ? and type = 'turn.finalized'", (turn_id,)).fetchone()
        data = json.loads(row[1])
        data["finish_reason"] = "length"
        conn.execute("update events set data = ? where id = ?", (json.dumps(data), row[0]))
    edited = turnlog(db, "verify", turn_id)  # the hash chain sees it first
    assert edited.returncode == 1
    assert edited.stderr == f"turnlog: turn {turn_id} does not verify: edited: seq {row[2]} (turn.finalized) was edited: its content does not match its hash\n"
    # someone with write access re-chains the forged log: consistent, so the re-run has to catch it
    rechain(db, turn_id)
    forged = turnlog(db, "verify", turn_id)
    assert forged.returncode == 1 and "turn.finalized" in forged.stderr
    forged_json = turnlog(db, "verify", turn_id, "--json")
    assert forged_json.returncode == 1
    report = json.loads(forged_json.stdout)
    assert report["ok"] is False and any("turn.finalized" in line for line in report["diff"])
    with sqlite3.connect(db) as conn:  # put the truth back for the teardown's verify
        conn.execute("update events set data = ? where id = ?", (row[1], row[0]))
    rechain(db, turn_id)
    assert turnlog(db, "verify", "turn_missing").returncode == 1


def rechain(db: Path, turn_id: str) -> None:
    """Rewrite a turn's hashes from its rows (what a DB writer can do to an unsigned chain)."""
    with sqlite3.connect(db) as conn:
        rows = conn.execute("select id, turn_id, seq, type, at, data from events where turn_id = ? order by seq", (turn_id,)).fetchall()
        hashes = chain_oracle.chain((t, s, ty, at, json.loads(d)) for _, t, s, ty, at, d in rows)
        conn.executemany("update events set hash = ? where id = ?", [(bytes.fromhex(h), r[0]) for h, r in zip(hashes, rows)])


@pytest.mark.sqlite_only
async def test_verify_explains_the_merged_delta_windows(upstream: Any, database_url: str, tmp_path: Path) -> None:
    """A turn written in several delta windows is compared after merging them:
    the report gives both counts and says why they differ."""
    service = await start_service(make_settings(tmp_path, upstream.url, database_url=database_url, flush_max_chunks=2), upstream)
    try:
        upstream.enqueue(Reply(chunks=["a", "b", "c", "d", "e", "f", "g"]))
        status, _, headers = await service.post("/v1/chat/completions", {"model": "gpt-test", "messages": [{"role": "user", "content": "q"}]})
        assert status == 200
        turn_id = headers["X-Turn-Id"]
        deltas = [e for e in await service.events(turn_id) if e["type"] == "model.delta"]
        recorded = len(await service.events(turn_id))
    finally:
        await stop_service(service)
    assert len(deltas) == 4  # windows of 2 chunks: the seven chunks took four events
    db = tmp_path / "turnlog.db"
    ok = turnlog(db, "verify", turn_id)
    assert ok.returncode == 0, ok.stderr
    compared = recorded - 3
    with sqlite3.connect(db) as conn:
        rows = conn.execute("select turn_id, seq, type, at, data from events where turn_id = ? order by seq", (turn_id,)).fetchall()
    head = chain_oracle.chain((t, s, ty, at, json.loads(d)) for t, s, ty, at, d in rows)[-1]
    assert ok.stdout.strip() == (
        f"ok: turn {turn_id} reproduced: {recorded} events recorded, compared as {compared} after merging "
        "consecutive model.delta windows (group-commit batching depends on timing, so the windows may differ); "
        f"hash chain intact, head {head}"
    )
    report = json.loads(turnlog(db, "verify", turn_id, "--json").stdout)
    assert report == {"turn_id": turn_id, "ok": True, "events_recorded": recorded, "events_compared": compared, "head": head, "diff": []}
