"""A finished turn's state is freed by reference counting alone.

A reference cycle anywhere in a turn's state (its actor, view, ports) makes
all of it, a hundred objects or more per turn, garbage that only a pass of
the cyclic collector frees. ``serve`` runs that collector rarely (a young
generation of 100,000 objects), so under load those turns' memory piles up
until a pass, and each pass walks all of it on the event loop.

The oracle is the collector itself: with ``gc.DEBUG_SAVEALL`` everything it
finds unreachable is kept in ``gc.garbage`` instead of freed, so after the
turns have ended a collection shows any of turnlog's objects that only a
cycle kept.
"""

from __future__ import annotations

import gc
from collections.abc import Mapping
from pathlib import Path

from tests.harness import Service, make_settings, retired, sse_text, start_service, stop_service
from tests.upstream import Reply, ScriptedUpstream

TOOLS = '''
class Tools:
    def lookup(self, key: str) -> str:
        """Look a key up.

        :param key: the key
        """
        return f"value of {key}"
'''

OURS = ("engine.", "adapters.")


async def stream(service: Service, body: Mapping[str, object]) -> tuple[str, str]:
    async with service.http.post(service.v1 + "/chat/completions", json={**body, "stream": True}) as resp:
        assert resp.status == 200, await resp.text()
        return resp.headers["X-Turn-Id"], sse_text(await resp.text())


async def test_finished_turns_leave_none_of_their_state_to_the_cyclic_collector(tmp_path: Path, upstream: ScriptedUpstream, database_url: str) -> None:
    tools = tmp_path / "tools"
    tools.mkdir()
    (tools / "lookup.py").write_text(TOOLS)
    settings = make_settings(tmp_path, upstream.url, database_url=database_url, tools_dir=str(tools))
    svc = await start_service(settings, upstream)
    try:
        ask = {"model": "gpt-test", "messages": [{"role": "user", "content": "hi"}]}
        # First a turn of each kind outside the check: caches filled on first
        # use (compiled templates, pooled connections) are not a turn's state.
        upstream.enqueue(Reply(chunks=["warm"]))
        await retired(svc, (await stream(svc, ask))[0])

        garbage, _alive = _saved()
        # Streamed text in several windows.
        upstream.enqueue(Reply(chunks=[f"w{i} " for i in range(6)], delay=0.02))
        text_turn, text = await stream(svc, {**ask, "params": {}})
        assert text == "w0 w1 w2 w3 w4 w5 "
        # A tool round, then the answer.
        upstream.enqueue(
            Reply(tool_calls=[{"id": "c1", "name": "lookup", "arguments": {"key": "k"}}], finish_reason="tool_calls"),
            Reply(text="done"),
        )
        tool_turn, text = await stream(svc, {**ask, "tool_ids": ["lookup"]})
        assert text.endswith("done")
        # A turn that waits for approval (no actor while it waits), then goes on.
        upstream.enqueue(
            Reply(tool_calls=[{"id": "c2", "name": "lookup", "arguments": {"key": "k"}}], finish_reason="tool_calls"),
            Reply(text="approved"),
        )
        status, answer, headers = await svc.post("/v1/chat/completions", {**ask, "tool_ids": ["lookup"], "params": {"tool_approval": "ask"}})
        assert status == 200 and answer["turnlog"]["status"] == "waiting", answer
        waiting_turn = headers["X-Turn-Id"]
        await retired(svc, waiting_turn)
        status, body, _ = await svc.post(f"/v1/turns/{waiting_turn}/approvals", {"call_id": "c2", "approve": True})
        assert status == 202, body
        # A turn over a WebSocket, the connection closed after it.
        upstream.enqueue(Reply(chunks=["over ", "a socket"], delay=0.02))
        async with svc.http.ws_connect(svc.v1 + "/ws") as ws:
            await ws.send_json({"type": "chat", "request": {**ask, "stream": True}})
            ws_turn = ""
            while True:
                msg = await ws.receive_json(timeout=10)
                if msg["type"] == "turn":
                    ws_turn = msg["turn_id"]
                elif msg["type"] == "event" and msg["event"]["type"] == "turn.completed":
                    break
        for turn_id in (text_turn, tool_turn, waiting_turn, ws_turn):
            await retired(svc, turn_id)
            assert (await svc.wait_status(turn_id, "completed"))["status"] == "completed"

        gc.collect()
        ours = sorted({f"{type(o).__module__}.{type(o).__qualname__}" for o in garbage if _ours(o)})
        assert ours == [], f"only the cyclic collector frees these: {ours}"
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        await stop_service(svc)


def _saved() -> tuple[list[object], list[object]]:
    """From here on the collector keeps what it finds unreachable; and every
    object of ours alive now, held, so that none of them can be among it (an
    earlier test's service let go meanwhile is not this test's turns)."""
    gc.collect()
    alive = [o for o in gc.get_objects() if _ours(o)]
    gc.set_debug(gc.DEBUG_SAVEALL)
    gc.garbage.clear()
    return gc.garbage, alive


def _ours(o: object) -> bool:
    module = type(o).__dict__.get("__module__")
    return isinstance(module, str) and module.startswith(OURS)
