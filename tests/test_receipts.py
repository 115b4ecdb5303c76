"""The hash chain of every turn, end to end, on a real SQLite file and a real
PostgreSQL: logs damaged by raw SQL in each of four ways get a verdict naming
the first bad seq (CLI as a process, HTTP), never a traceback, a 500 or a hang;
exports verify offline; signed receipts verify with their public key only; the
migration chains the events stored before it.

The oracle (``tests.chain_oracle``) computes hashes with hashlib and json from
the documented canonical form, not with ``engine.chain``.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat, load_pem_public_key
from sqlalchemy import text

from adapters.store import create_engine, migrate
from tests import chain_oracle
from tests.backends import POSTGRES, SQLITE
from tests.harness import Service, make_settings, start_service, stop_service
from tests.pg import pg_empty_database  # noqa: F401  (fixture)
from tests.upstream import Reply, ScriptedUpstream

ROOT = Path(__file__).resolve().parents[1]
TAMPERED_SEQ = 3


def turnlog(url: str, *args: str, stdin: bytes | None = None, **env_extra: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TURNLOG_DATABASE_URL": url}
    env.pop("TURNLOG_RECEIPT_KEY", None)
    env.update(env_extra)
    return subprocess.run([sys.executable, "-m", "adapters.cli", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)


async def turnlog_async(url: str, *args: str, **env_extra: str) -> subprocess.CompletedProcess[str]:
    """:func:`turnlog` without blocking the loop, so that several run at once
    (each is a fresh Python: ~1 s of imports, most of these tests' time when
    they run one after another)."""
    env = {**os.environ, "TURNLOG_DATABASE_URL": url}
    env.pop("TURNLOG_RECEIPT_KEY", None)
    env.update(env_extra)
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "adapters.cli",
        *args,
        cwd=ROOT,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return subprocess.CompletedProcess(list(args), proc.returncode, out.decode(), err.decode())


async def turnlog_all(url: str, *commands: tuple[str, ...]) -> list[subprocess.CompletedProcess[str]]:
    """``turnlog`` once per command, all at once."""
    return list(await asyncio.gather(*(turnlog_async(url, *args) for args in commands)))


async def sql(url: str, *statements: tuple[str, dict[str, Any]] | str) -> list[Any]:
    """Raw SQL on the service's database (one transaction); the last statement's rows."""
    engine = create_engine(url)
    rows: list[Any] = []
    try:
        async with engine.begin() as conn:
            for st in statements:
                query, params = (st, {}) if isinstance(st, str) else st
                result = await conn.execute(text(query), params)
                rows = list(result.all()) if result.returns_rows else []
    finally:
        await engine.dispose()
    return rows


async def stored_rows(url: str, turn_id: str) -> list[Any]:
    """The turn's rows, the hash (32 bytes in the table) as hex."""
    rows = await sql(url, ("SELECT turn_id, seq, type, at, data, hash FROM events WHERE turn_id = :t ORDER BY seq", {"t": turn_id}))
    return [(*row[:5], None if row[5] is None else bytes(row[5]).hex()) for row in rows]


chat_of: dict[str, str] = {}


async def run_turn(service: Service, text_: str = "receipts are chained") -> str:
    service.upstream.enqueue(Reply(chunks=[w + " " for w in text_.split()]))
    status, body, headers = await service.post("/v1/chat/completions", {"model": "gpt-test", "messages": [{"role": "user", "content": "q"}]})
    assert status == 200, body
    turn_id = headers["X-Turn-Id"]
    chat_of[turn_id] = headers["X-Chat-Id"]
    await service.wait_status(turn_id, "completed")
    return turn_id


# -- the four ways of damaging a log, by raw SQL -------------------------------------------


async def edit(url: str, turn_id: str, seq: int) -> None:
    (data,) = (await sql(url, ("SELECT data FROM events WHERE turn_id = :t AND seq = :s", {"t": turn_id, "s": seq})))[0]
    forged = json.loads(data) | {"forged": True}
    await sql(url, ("UPDATE events SET data = :d WHERE turn_id = :t AND seq = :s", {"d": json.dumps(forged), "t": turn_id, "s": seq}))


async def delete(url: str, turn_id: str, seq: int) -> None:
    await sql(url, ("DELETE FROM events WHERE turn_id = :t AND seq = :s", {"t": turn_id, "s": seq}))


async def insert(url: str, turn_id: str, seq: int) -> None:
    """A forged event at ``seq``, the later ones moved one seq up."""
    p = {"t": turn_id, "s": seq}
    await sql(
        url,
        ("UPDATE events SET seq = seq + 100000 WHERE turn_id = :t AND seq >= :s", p),
        ("UPDATE events SET seq = seq - 99999 WHERE turn_id = :t AND seq >= 100000", p),
        (
            "INSERT INTO events (turn_id, seq, type, at, data, hash) VALUES (:t, :s, 'model.warning', 1800000000.5, :d, :h)",
            p | {"h": b"\xab" * 32, "d": json.dumps({"v": 1, "message": "forged"})},
        ),
    )


async def reorder(url: str, turn_id: str, seq: int) -> None:
    """Swap two events' seqs (their content and hashes stay)."""
    p = {"t": turn_id, "s": seq, "n": seq + 1}
    await sql(
        url,
        ("UPDATE events SET seq = -1 WHERE turn_id = :t AND seq = :s", p),
        ("UPDATE events SET seq = :s WHERE turn_id = :t AND seq = :n", p),
        ("UPDATE events SET seq = :n WHERE turn_id = :t AND seq = -1", p),
    )


TAMPERS = {"edited": edit, "deleted": delete, "inserted": insert, "reordered": reorder}


@pytest.mark.backends(SQLITE, POSTGRES)
async def test_every_event_is_chained_as_documented(service: Service, database_url: str) -> None:
    turn_id = await run_turn(service)
    rows = await stored_rows(database_url, turn_id)
    assert len(rows) >= 6
    expected = chain_oracle.chain((t, s, ty, at, json.loads(d)) for t, s, ty, at, d, _ in rows)
    assert [row[5] for row in rows] == expected
    status, body = await service.get(f"/v1/turns/{turn_id}/receipt")
    assert status == 200, body
    assert body == {"turn_id": turn_id, "events": len(rows), "head": expected[-1], "algorithm": "sha256-chain"}
    status, body = await service.get(f"/v1/turns/{turn_id}/verify")
    assert status == 200 and body["ok"] is True and body["diff"] == [], body


@pytest.mark.backends(SQLITE, POSTGRES)
@pytest.mark.parametrize("kind", list(TAMPERS))
async def test_a_damaged_log_gets_a_verdict_naming_its_first_bad_seq(kind: str, upstream: ScriptedUpstream, database_url: str, tmp_path: Path) -> None:
    service = await start_service(make_settings(tmp_path, upstream.url, database_url=database_url), upstream)
    try:
        turn_id = await run_turn(service, "one two three four five six")
        intact = await run_turn(service, "an intact turn")
        await TAMPERS[kind](database_url, turn_id, TAMPERED_SEQ)

        # CLI: one line naming the seq and the kind, exit 1
        reads = [("turns", "show", turn_id), ("turns", "events", turn_id), ("replay", turn_id), ("export", turn_id)]
        verify, as_json, intact_verify, *outs = await turnlog_all(database_url, ("verify", turn_id), ("verify", turn_id, "--json"), ("verify", intact), *reads)
        assert verify.returncode == 1 and verify.stdout == ""
        assert verify.stderr.startswith(f"turnlog: turn {turn_id} does not verify: {kind}: seq {TAMPERED_SEQ}"), verify.stderr
        assert len(verify.stderr.splitlines()) == 1
        report = json.loads(as_json.stdout)
        assert report["ok"] is False and report["damage"]["seq"] == TAMPERED_SEQ and report["damage"]["kind"] == kind
        for args, out in zip(reads, outs):
            assert out.returncode == 1, (args, out)
            assert "Traceback" not in out.stderr and len(out.stderr.splitlines()) == 1, (args, out.stderr)
            assert "damaged log" in out.stderr and f"seq {TAMPERED_SEQ}" in out.stderr, (args, out.stderr)
        assert intact_verify.returncode == 0, intact_verify.stderr

        # HTTP: verify says the same; the reads answer 409 damaged_log
        status, body = await service.get(f"/v1/turns/{turn_id}/verify")
        assert status == 200 and body["ok"] is False, body
        assert body["damage"]["seq"] == TAMPERED_SEQ and body["damage"]["kind"] == kind
        assert body["diff"] == [report["damage"]["message"]]
        for path in ("", "/events", "/replay", "/replay?upto=2", "/receipt"):
            status, body = await service.get(f"/v1/turns/{turn_id}{path}")
            assert status == 409, (path, status, body)
            assert body["error"]["code"] == "damaged_log" and f"seq {TAMPERED_SEQ}" in body["error"]["message"], (path, body)
            assert body["error"]["damage"]["kind"] == kind
        # a page is checked from the event before it: one past the damage is
        # served, unless every seq after the damage moved (an insertion: the
        # page does not chain, and the log from seq 1 names where it broke)
        last = max(row[1] for row in await stored_rows(database_url, turn_id))
        assert last - 1 > TAMPERED_SEQ + 1
        status, body = await service.get(f"/v1/turns/{turn_id}/events?after={last - 1}")
        if kind == "inserted":
            assert status == 409 and body["error"]["damage"]["seq"] == TAMPERED_SEQ, body
        else:
            assert status == 200 and [e["seq"] for e in body["events"]] == [last], body
        status, body = await service.get(f"/v1/turns/{intact}")
        assert status == 200 and body["status"] == "completed"
        # the inspector's summary and a fork of it: the same 409, never a 500
        status, body = await service.get(f"/v1/ui/turns/{turn_id}/summary")
        assert status == 409 and body["error"]["code"] == "damaged_log", body
        status, body, _ = await service.post(f"/v1/turns/{turn_id}/fork", {"at": 3})
        assert status == 409 and body["error"]["damage"]["seq"] == TAMPERED_SEQ, body
        # streams of it: 409 before any byte over SSE, an error message over the WebSocket
        status, body = await service.get(f"/v1/turns/{turn_id}/stream")
        assert status == 409 and body["error"]["code"] == "damaged_log" and body["error"]["damage"]["seq"] == TAMPERED_SEQ, body
        async with service.http.ws_connect(service.v1 + "/ws") as ws:
            await ws.send_json({"type": "subscribe", "turn_id": turn_id})
            said = await asyncio.wait_for(ws.receive_json(), 10)
            assert said["type"] == "error" and said["code"] == "damaged_log", said
            assert said["damage"] == {"seq": TAMPERED_SEQ, "kind": kind, "message": report["damage"]["message"]}
            await ws.send_json({"type": "subscribe", "turn_id": intact})  # the same socket still serves an intact turn
            first = await asyncio.wait_for(ws.receive_json(), 10)
            assert first["type"] == "event" and first["seq"] == 1, first
        if kind == "deleted":  # a chat holding a turn whose log does not fold: a 409 too, never a 500
            status, body = await service.get(f"/v1/chats/{chat_of[turn_id]}")
            assert status == 409 and body["error"]["code"] == "damaged_log", body
    finally:
        await stop_service(service, verify=False)


async def test_verify_of_a_running_turn_is_a_conflict_not_a_wait(service: Service) -> None:
    service.upstream.enqueue(Reply(text="still streaming when asked", chunk_size=4, pause_after=2))
    async with service.http.post(
        service.v1 + "/chat/completions", json={"model": "gpt-test", "messages": [{"role": "user", "content": "q"}], "stream": True}
    ) as resp:
        turn_id = resp.headers["X-Turn-Id"]
        await asyncio.wait_for(service.upstream.paused.wait(), 5)
        status, body = await service.get(f"/v1/turns/{turn_id}/verify")
        assert status == 409 and body["error"]["code"] == "turn_not_ended", body
        status, body = await service.get(f"/v1/turns/{turn_id}/receipt")  # a receipt of the log so far
        assert status == 200 and body["events"] >= 3, body
        service.upstream.release()
        await resp.text()
    await service.wait_status(turn_id, "completed")
    status, body = await service.get(f"/v1/turns/{turn_id}/verify")
    assert status == 200 and body["ok"] is True, body


@pytest.mark.backends(SQLITE, POSTGRES)
async def test_another_users_turn_is_not_found(upstream: ScriptedUpstream, database_url: str, tmp_path: Path) -> None:
    from aiohttp import ClientSession

    service = await start_service(make_settings(tmp_path, upstream.url, database_url=database_url, auth="on"), upstream)
    try:
        store = service.services.store
        alice, bob = await store.create_api_key("alice"), await store.create_api_key("bob")
        upstream.enqueue(Reply(text="alice's answer"))
        async with ClientSession() as http:
            body = {"model": "gpt-test", "messages": [{"role": "user", "content": "q"}]}
            async with http.post(service.url + "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {alice}"}) as resp:
                assert resp.status == 200
                turn_id = resp.headers["X-Turn-Id"]
            for path in ("verify", "receipt"):
                async with http.get(f"{service.url}/v1/turns/{turn_id}/{path}", headers={"Authorization": f"Bearer {bob}"}) as resp:
                    assert resp.status == 404 and (await resp.json())["error"]["code"] == "not_found"
                async with http.get(f"{service.url}/v1/turns/{turn_id}/{path}", headers={"Authorization": f"Bearer {alice}"}) as resp:
                    assert resp.status == 200
                async with http.get(f"{service.url}/v1/turns/{turn_id}/{path}") as resp:
                    assert resp.status == 401
    finally:
        await stop_service(service)


def _key_file(path: Path) -> tuple[Path, Ed25519PrivateKey]:
    key = Ed25519PrivateKey.generate()
    path.write_bytes(key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()))
    return path, key


@pytest.mark.backends(SQLITE, POSTGRES)
async def test_export_verifies_offline_and_fails_after_a_one_byte_change(upstream: ScriptedUpstream, database_url: str, tmp_path: Path) -> None:
    key_path, key = _key_file(tmp_path / "receipt.pem")
    other_path, _ = _key_file(tmp_path / "other.pem")
    service = await start_service(make_settings(tmp_path, upstream.url, database_url=database_url, receipt_key=str(key_path)), upstream)
    try:
        turn_id = await run_turn(service, "an answer worth a receipt ✓")
        status, receipt = await service.get(f"/v1/turns/{turn_id}/receipt")
        assert status == 200, receipt
    finally:
        await stop_service(service)
    rows = await stored_rows(database_url, turn_id)
    head = chain_oracle.chain((t, s, ty, at, json.loads(d)) for t, s, ty, at, d, _ in rows)[-1]
    assert receipt["head"] == head and receipt["events"] == len(rows)
    key.public_key().verify(base64.b64decode(receipt["signature"]), bytes.fromhex(head))  # raises if wrong

    # the public key, as the CLI prints it; the export
    public, other, exported = await asyncio.gather(
        turnlog_async(database_url, "keys", "receipt-public", TURNLOG_RECEIPT_KEY=str(key_path)),
        turnlog_async(database_url, "keys", "receipt-public", TURNLOG_RECEIPT_KEY=str(other_path)),
        turnlog_async(database_url, "export", turn_id, TURNLOG_RECEIPT_KEY=str(key_path)),
    )
    assert public.returncode == 0 and public.stdout.startswith("-----BEGIN PUBLIC KEY-----")
    loaded = load_pem_public_key(public.stdout.encode())
    assert isinstance(loaded, Ed25519PublicKey) and loaded.public_bytes_raw() == key.public_key().public_bytes_raw()
    pub_path = tmp_path / "receipt.pub"
    pub_path.write_text(public.stdout)
    other_pub = tmp_path / "other.pub"
    other_pub.write_text(other.stdout)

    assert exported.returncode == 0, exported.stderr
    lines = exported.stdout.splitlines()
    assert json.loads(lines[0]) == {"receipt": receipt}
    events = [json.loads(line) for line in lines[1:]]
    assert [(e["seq"], e["hash"]) for e in events] == [(r[1], r[5]) for r in rows]
    file = tmp_path / "turn.jsonl"
    file.write_text(exported.stdout, encoding="utf-8")

    # offline (no database at all): intact, then one byte changed anywhere (in
    # an event's data, its hash, the receipt, the layout), then the last
    # event dropped (the receipt names what is missing); each its own file
    raw = file.read_bytes()
    data_at = raw.index(b"worth")
    changes = [
        (data_at, f"line {next(i for i, line in enumerate(lines, 1) if 'worth' in line)}"),
        (raw.index(rows[2][5].encode()) + 5, "line 4"),  # the hash of seq 3
        (raw.index(b'"head":"') + 8, "line 1"),
        (len(raw) - 1, f"line {len(lines)}"),  # the last newline
    ]
    changed_files = []
    for n, (position, _) in enumerate(changes):
        changed = bytearray(raw)
        changed[position] = ord("0") if changed[position] != ord("0") else ord("1")
        changed_files.append(tmp_path / f"changed-{n}.jsonl")
        changed_files[-1].write_bytes(bytes(changed))
    cut_file = tmp_path / "cut.jsonl"
    cut_file.write_text("\n".join(lines[:-1]) + "\n", encoding="utf-8")
    nodb = f"sqlite+aiosqlite:///{tmp_path / 'absent' / 'none.db'}"
    ok, unsigned_ok, wrong, cut, *bad = await turnlog_all(
        nodb,
        ("verify", "--file", str(file), "--public-key", str(pub_path)),
        ("verify", "--file", str(file)),
        ("verify", "--file", str(file), "--public-key", str(other_pub)),
        ("verify", "--file", str(cut_file), "--json"),
        *(("verify", "--file", str(f)) for f in changed_files),
    )
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.startswith(f"ok: {file}: turn {turn_id}, {len(rows)} events, hash chain intact, head {head}")
    assert "signature verified" in ok.stdout
    assert not (tmp_path / "absent").exists()
    assert unsigned_ok.returncode == 0, unsigned_ok.stderr
    assert wrong.returncode == 1 and "signature does not match" in wrong.stderr
    for (position, expect), out in zip(changes, bad):
        assert out.returncode == 1, (position, out.stdout)
        assert expect in out.stderr and "Traceback" not in out.stderr, (position, out.stderr)
    assert cut.returncode == 1 and json.loads(cut.stdout)["damage"] == {
        "seq": len(rows),
        "kind": "deleted",
        "message": f"seq {len(rows)} missing: the receipt covers {len(rows)} events, the file has {len(rows) - 1}",
    }


@pytest.mark.backends(SQLITE, POSTGRES)
async def test_migration_chains_the_events_stored_before_it(db_backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    if db_backend == POSTGRES:
        url = request.getfixturevalue("pg_empty_database")()
    else:
        url = f"sqlite+aiosqlite:///{tmp_path / 'old.db'}"
    await migrate(url, "0006")
    old = [
        ("old-a", 1, "turn.started", 1_700_000_000.25, {"v": 1, "chat_id": "c", "user_id": "u", "model": "m", "request": {"é": [1, 2.5]}}),
        ("old-a", 2, "model.requested", 1_700_000_001.0, {"v": 1, "provider": "openai", "iteration": 0}),
        ("old-a", 3, "turn.completed", 1_700_000_002.5, {"v": 1}),
        ("old-b", 1, "turn.started", 1_700_000_003.0, {"v": 1, "z": 1, "a": {"y": None, "b": True}}),
    ]
    await sql(
        url,
        *[
            ("INSERT INTO events (turn_id, seq, type, at, data) VALUES (:t, :s, :ty, :at, :d)", {"t": t, "s": s, "ty": ty, "at": at, "d": json.dumps(d)})
            for t, s, ty, at, d in reversed(old)  # not in seq order: the back-fill orders them
        ],
    )
    await migrate(url)
    rows = await sql(url, "SELECT turn_id, seq, hash FROM events ORDER BY turn_id, seq")
    expected = chain_oracle.chain(old[:3]) + chain_oracle.chain(old[3:])
    assert [(t, s, bytes(h).hex()) for t, s, h in rows] == [(t, s, h) for (t, s, *_), h in zip(old, expected)]
    # the store goes on from the back-filled head
    from adapters.store import open_store
    from engine.chain import check
    from engine.events import Event

    store = await open_store(url)
    try:
        await store.append([Event(turn_id="old-a", seq=4, type="test.event", at=1_700_000_003.0, data={"k": "after"})])
        chained = await store.read_chain("old-a")
        assert check("old-a", chained).ok
        assert chained[-1].hash == chain_oracle.chain([*old[:3], ("old-a", 4, "test.event", 1_700_000_003.0, {"k": "after"})])[-1]
    finally:
        await store.close()


@pytest.mark.backends(SQLITE, POSTGRES)
async def test_a_page_after_an_event_whose_hash_was_changed_names_that_event(service: Service, database_url: str) -> None:
    turn_id = await run_turn(service, "one two three four five six")
    where = {"t": turn_id, "s": TAMPERED_SEQ}
    ((intact,),) = await sql(database_url, ("SELECT hash FROM events WHERE turn_id = :t AND seq = :s", where))
    await sql(database_url, ("UPDATE events SET hash = :h WHERE turn_id = :t AND seq = :s", {"h": b"\xcd" * 32} | where))
    status, body = await service.get(f"/v1/turns/{turn_id}/verify")
    assert body["damage"]["seq"] == TAMPERED_SEQ and body["damage"]["kind"] == "edited", body
    # the page after it does not chain from the changed hash: the damage is
    # at that event, not at the page's first one
    status, body = await service.get(f"/v1/turns/{turn_id}/events?after={TAMPERED_SEQ}&limit=2")
    assert status == 409 and body["error"]["damage"]["seq"] == TAMPERED_SEQ, body
    # a page that starts at it is checked from the intact hash before it
    status, body = await service.get(f"/v1/turns/{turn_id}/events?after={TAMPERED_SEQ - 1}&limit=1")
    assert status == 409 and body["error"]["damage"]["seq"] == TAMPERED_SEQ, body
    # pages before it are served
    status, body = await service.get(f"/v1/turns/{turn_id}/events?after=1&limit={TAMPERED_SEQ - 2}")
    assert status == 200 and [e["seq"] for e in body["events"]] == list(range(2, TAMPERED_SEQ)), body
    # the hash put back: the log holds again (and verifies at teardown)
    await sql(database_url, ("UPDATE events SET hash = :h WHERE turn_id = :t AND seq = :s", {"h": bytes(intact)} | where))
    status, body = await service.get(f"/v1/turns/{turn_id}/events?after={TAMPERED_SEQ}&limit=2")
    assert status == 200 and [e["seq"] for e in body["events"]] == [TAMPERED_SEQ + 1, TAMPERED_SEQ + 2], body


@pytest.mark.backends(SQLITE, POSTGRES)
async def test_migration_back_fills_page_by_page(db_backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """More rows than one page of the back-fill (1,000), a turn across each page boundary."""
    if db_backend == POSTGRES:
        url = request.getfixturevalue("pg_empty_database")()
    else:
        url = f"sqlite+aiosqlite:///{tmp_path / 'old.db'}"
    await migrate(url, "0006")
    old = [
        (turn, seq, "model.delta", 1_700_000_000.0 + seq / 8, {"v": 1, "kind": "text", "pos": seq, "text": f"{turn} {seq}"})
        for turn, n in (("page-a", 1_100), ("page-b", 950), ("page-c", 10))
        for seq in range(1, n + 1)
    ]
    insert = "INSERT INTO events (turn_id, seq, type, at, data) VALUES (:t, :s, :ty, :at, :d)"
    await sql(url, (insert, [{"t": t, "s": s, "ty": ty, "at": at, "d": json.dumps(d)} for t, s, ty, at, d in old]))  # type: ignore[arg-type]
    await migrate(url)
    rows = await sql(url, "SELECT turn_id, seq, hash FROM events ORDER BY turn_id, seq")
    expected = [h for turn in ("page-a", "page-b", "page-c") for h in chain_oracle.chain(e for e in old if e[0] == turn)]
    assert [(t, s) for t, s, _ in rows] == [(t, s) for t, s, *_ in old]
    assert [bytes(h).hex() for _, _, h in rows] == expected
