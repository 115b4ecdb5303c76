"""Every failure has a defined, recorded outcome (upstream faults)."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from tests.harness import Service, sse_messages, sse_text
from tests.upstream import Reply

USER = [{"role": "user", "content": "go"}]


async def stream_raw(service: Service, body: dict) -> tuple[str, str]:
    async with service.http.post(service.v1 + "/chat/completions", json={"stream": True, **body}) as resp:
        assert resp.status == 200
        return resp.headers["X-Turn-Id"], await resp.text()


async def test_upstream_http_500_fails_the_turn_and_the_server_stays_healthy(service: Service) -> None:
    service.upstream.enqueue(Reply(status=500, error_message="model exploded"), Reply(text="fine again"))
    turn_id, raw = await stream_raw(service, {"model": "gpt-test", "messages": USER})
    errors = [json.loads(d) for _, d in sse_messages(raw) if d.startswith('{"error"')]
    assert errors and "model exploded" in errors[0]["error"]["message"]
    assert raw.rstrip().endswith("data: [DONE]")
    view = await service.turn(turn_id)
    assert view["status"] == "failed" and view["state"] == "failed"
    assert view["error"]["type"] == "upstream_http_error" and view["error"]["status"] == 500
    # the next turn works
    turn2, raw2 = await stream_raw(service, {"model": "gpt-test", "messages": USER})
    assert sse_text(raw2) == "fine again"
    assert (await service.turn(turn2))["status"] == "completed"


async def test_non_streaming_upstream_failure_is_a_502_with_the_turn_id(service: Service) -> None:
    service.upstream.enqueue(Reply(status=503, error_message="overloaded"))
    status, body, headers = await service.post("/v1/chat/completions", {"model": "gpt-test", "messages": USER})
    assert status == 502 and "overloaded" in body["error"]["message"]
    assert (await service.turn(headers["X-Turn-Id"]))["status"] == "failed"


async def test_disconnect_mid_stream_keeps_the_partial_output(service: Service) -> None:
    service.upstream.enqueue(Reply(chunks=["par", "tial ", "answer", " lost"], fault="disconnect", fault_after=3))
    turn_id, raw = await stream_raw(service, {"model": "gpt-test", "messages": USER})
    assert sse_text(raw) == "partial answer"
    view = await service.turn(turn_id)
    assert view["status"] == "failed"
    assert view["error"]["type"] == "upstream_disconnected"
    assert view["content"] == "partial answer"
    assert view["output"][0]["status"] == "incomplete"  # not pretended complete


async def test_truncated_stream_fails(service: Service) -> None:
    service.upstream.enqueue(Reply(chunks=["a", "b", "c"], fault="truncate", fault_after=2))
    turn_id, _ = await stream_raw(service, {"model": "gpt-test", "messages": USER})
    view = await service.turn(turn_id)
    assert view["status"] == "failed" and view["error"]["type"] == "upstream_truncated"
    assert view["content"] == "ab"


async def test_malformed_chunk_is_skipped_and_recorded(service: Service) -> None:
    service.upstream.enqueue(Reply(chunks=["good ", "and ", "well"], fault="malformed", fault_after=1, comments=True))
    turn_id, raw = await stream_raw(service, {"model": "gpt-test", "messages": USER})
    assert sse_text(raw) == "good and well"
    view = await service.turn(turn_id)
    assert view["status"] == "completed" and view["content"] == "good and well"
    warnings = [e for e in await service.events(turn_id) if e["type"] == "model.warning"]
    assert len(warnings) == 1 and "not json" in warnings[0]["data"]["raw"]
    assert "not json" not in view["content"]


async def test_idle_upstream_times_out_into_failed(service: Service, tmp_path) -> None:
    from tests.harness import make_settings, start_service, stop_service

    (tmp_path / "t").mkdir()
    svc = await start_service(make_settings(tmp_path / "t", service.upstream.url, upstream_idle_timeout=0.3), service.upstream)
    try:
        svc.upstream.enqueue(Reply(chunks=["slow", "er"], fault="hang", fault_after=1))
        turn_id, _ = await stream_raw(svc, {"model": "gpt-test", "messages": USER})
        view = await svc.turn(turn_id)
        assert view["status"] == "failed" and view["error"]["type"] == "upstream_timeout"
        assert view["content"] == "slow"
    finally:
        await stop_service(svc)


async def test_cancel_mid_stream_saves_the_prefix_before_acknowledging(service: Service) -> None:
    service.upstream.enqueue(Reply(text="one two three four five six", chunk_size=4, pause_after=3))
    async with service.http.post(service.v1 + "/chat/completions", json={"model": "gpt-test", "messages": USER, "stream": True}) as resp:
        turn_id = resp.headers["X-Turn-Id"]
        await asyncio.wait_for(service.upstream.paused.wait(), 5)
        status, body, _ = await service.post(f"/v1/turns/{turn_id}/cancel")
        assert status == 202 and body["status"] == "cancelled"
        # acknowledged => durable: the log already ends with turn.cancelled
        events = await service.events(turn_id)
        assert [e["type"] for e in events][-2:] == ["turn.cancel_requested", "turn.cancelled"]
        raw = await resp.text()
    service.upstream.release()
    view = await service.turn(turn_id)
    assert view["status"] == "cancelled" and view["state"] == "cancelled"
    assert view["content"] == "one two thre"
    assert all(item["status"] == "incomplete" for item in view["output"])
    assert '"status":"cancelled"' in raw and raw.rstrip().endswith("[DONE]")
    assert sse_text(raw) == "one two thre"
    # cancelling again is a conflict, not a 500
    status, body, _ = await service.post(f"/v1/turns/{turn_id}/cancel")
    assert status == 409 and body["error"]["type"] == "conflict_error"


async def test_client_disconnect_never_cancels_the_turn(service: Service) -> None:
    service.upstream.enqueue(Reply(text="keeps going after the client left", chunk_size=5, pause_after=2))
    resp = await service.http.post(service.v1 + "/chat/completions", json={"model": "gpt-test", "messages": USER, "stream": True})
    turn_id = resp.headers["X-Turn-Id"]
    await asyncio.wait_for(service.upstream.paused.wait(), 5)
    resp.close()  # the client goes away mid-stream
    service.upstream.release()
    view = await service.wait_status(turn_id, "completed")
    assert view["content"] == "keeps going after the client left"


async def test_database_connections_dropped_mid_stream_the_turn_resumes_without_a_gap(upstream: Any, pg_url: str, tmp_path: Any) -> None:
    # A real fault: PostgreSQL ends every session of the service while a turn
    # streams. The delta window in flight fails; later windows of that owner
    # must not land after it (a gap). The owner stops, and the turn is
    # interrupted and resumed from what is durable, and completes.
    import asyncpg

    from engine.fold.turn_view import fold
    from tests.harness import make_settings, start_service, stop_service

    service = await start_service(make_settings(tmp_path, upstream.url, database_url=pg_url), upstream)
    try:
        service.upstream.enqueue(Reply(text="first part of the answer, " * 8, chunk_size=4, pause_after=12))
        service.upstream.enqueue(Reply(text="and the resumed rest."))
        resp = await service.http.post(service.v1 + "/chat/completions", json={"model": "gpt-test", "messages": USER, "stream": True})
        turn_id = resp.headers["X-Turn-Id"]
        await asyncio.wait_for(service.upstream.paused.wait(), 5)
        # The 12 chunks sent before the pause are durable (their windows committed).
        deadline = time.monotonic() + 10
        while sum(len(e.data["lens"]) for e in await service.services.store.read(turn_id) if e.type == "model.delta") < 12:
            assert time.monotonic() < deadline, "the chunks before the pause never became durable"
            await asyncio.sleep(0.01)
        admin = await asyncpg.connect(pg_url.replace("postgresql+asyncpg://", "postgresql://"))
        try:
            ended = await admin.fetchval(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
        finally:
            await admin.close()
        assert ended >= 1
        service.upstream.release()
        resp.close()
        view = await service.wait_status(turn_id, "completed", timeout=20.0)
        events = await service.services.store.read(turn_id)
        assert [e.seq for e in events] == list(range(1, len(events) + 1)), "no gap in the log"
        assert "turn.resumed" in [e.type for e in events]
        assert fold(turn_id, events).content == view["content"]
        assert view["content"].endswith("and the resumed rest.")
    finally:
        await stop_service(service)
