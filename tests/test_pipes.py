"""Pipes: Open WebUI Pipe modules from ``TURNLOG_PIPES_DIR`` served as models.

The pipes are written as Open WebUI's are (``class Pipe``, ``pipe(body,
__user__, __event_emitter__, ...)``, ``pipes()``, ``Valves``); the oracle is
what the pipe itself saw and did (its module's own records, a file it
writes), the client's stream checked against the log's fold, and
``verify`` re-running every finished turn from its log (the harness does it
at teardown; a pipe is never run by it).
"""

from __future__ import annotations

import json
import sys
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from adapters.pipes import load_pipes_dir
from tests.harness import Service, make_settings, start_service, stop_service
from tests.oracle import check_stream_against_log
from tests.polling import until
from tests.processes import Server, free_port, wait_for
from tests.upstream import ScriptedUpstream

USER = [{"role": "user", "content": "hello pipe"}]

PIPES = {
    "echo": """
        from pydantic import BaseModel

        class Pipe:
            class Valves(BaseModel):
                prefix: str = "echo: "

            def __init__(self):
                self.valves = self.Valves()
                self.name = "Echo"

            async def pipe(self, body: dict, __user__: dict, __chat_id__=None, __metadata__: dict = None, __task__=None) -> str:
                last = body["messages"][-1]["content"]
                chat = __metadata__["chat_id"] if __metadata__["chat_id"] == __chat_id__ else "?"
                return f"{self.valves.prefix}{last} (model {body['model']}, user {__user__['id']}, chat {chat}, task {__task__})"
    """,
    "multi": """
        import json

        class Pipe:
            def pipes(self):
                return [{"id": "small", "name": " small"}, {"id": "large", "name": " large"}]

            async def pipe(self, body, __event_emitter__=None):
                yield "one "
                await __event_emitter__({"type": "status", "data": {"description": "thinking", "done": False}})
                await __event_emitter__({"type": "message", "data": {"content": "two "}})
                chunk = {"choices": [{"index": 0, "delta": {"content": "three "}, "finish_reason": None}]}
                yield "data: " + json.dumps(chunk)
                yield {"choices": [{"index": 0, "delta": {"content": body["model"]}, "finish_reason": None}]}
                yield {"event": {"type": "status", "data": {}}}  # a UI event: dropped
                yield "data: [DONE]"
    """,
    "whole": """
        def _usage():
            return {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}

        class Pipe:
            def pipe(self, body):
                return {
                    "id": "x",
                    "object": "chat.completion",
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": "a whole answer"}, "finish_reason": "stop"}],
                    "usage": _usage(),
                }
    """,
    "words": """
        class Pipe:
            def pipe(self, body):
                for word in ["sync ", "generator ", "words"]:
                    yield word
    """,
    "gated": """
        import threading

        GATE = threading.Event()
        STEPS = []
        THREADS = set()
        CLOSED = threading.Event()

        class Pipe:
            def pipe(self, body):
                try:
                    for i in range(1000):
                        THREADS.add(threading.current_thread().name)
                        if i and not GATE.wait(10):  # blocks its thread until the test opens the gate
                            raise RuntimeError("the gate never opened")
                        STEPS.append(i)
                        yield f"item{i} "
                finally:
                    CLOSED.set()
    """,
    "boom": """
        class Pipe:
            async def pipe(self, body):
                raise ValueError("kaboom")
    """,
    "halfway": """
        class Pipe:
            def pipe(self, body):
                yield "partial "
                raise RuntimeError("broke halfway")
    """,
    "badvalves": """
        from pydantic import BaseModel

        class Pipe:
            class Valves(BaseModel):
                count: int = 1

            def pipe(self, body):
                return "never"
    """,
}


def write_pipes(folder: Path, pipes: dict[str, str]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, source in pipes.items():
        (folder / f"{name}.py").write_text(textwrap.dedent(source))
    return folder


@pytest.fixture
async def pipes_service(tmp_path: Path, upstream: ScriptedUpstream, database_url: str) -> AsyncIterator[Service]:
    folder = write_pipes(tmp_path / "pipes", PIPES)
    valves = {"echo": {"prefix": ">> "}, "badvalves": {"count": "many"}}
    svc = await start_service(make_settings(tmp_path, upstream.url, database_url=database_url, pipes_dir=str(folder), pipes=valves), upstream)
    try:
        yield svc
    finally:
        gated = sys.modules.get("turnlog_pipe_gated")
        if gated is not None:
            gated.GATE.set()  # a pipe thread left waiting must not outlive the test
        await stop_service(svc)


async def chat(svc: Service, model: str, *, stream: bool) -> tuple[str, Any]:
    body = {"model": model, "messages": USER, "stream": stream}
    async with svc.http.post(svc.v1 + "/chat/completions", json=body) as resp:
        turn_id = resp.headers.get("X-Turn-Id", "")
        return turn_id, (await resp.text() if stream else (resp.status, await resp.json()))


async def test_pipes_are_models_and_their_output_is_the_models_stream(pipes_service: Service) -> None:
    svc = pipes_service
    status, listed = await svc.get("/v1/models")
    assert status == 200
    models = {m["id"]: m for m in listed["data"]}
    assert {"echo", "multi.small", "multi.large", "whole", "words", "boom"} <= set(models)
    assert "multi" not in models and "badvalves" not in models  # invalid valves: not loaded
    assert models["echo"]["owned_by"] == "pipe"
    assert "gpt-test" in models  # the upstream's models are still there

    turn_id, (status, body) = await chat(svc, "echo", stream=False)
    assert status == 200, body
    chat_id = (await svc.turn(turn_id))["chat_id"]
    # The pipe saw the turn's user (auth off: "local") and chat, its valves from the configuration.
    assert body["choices"][0]["message"]["content"] == f">> hello pipe (model echo, user local, chat {chat_id}, task None)"

    for model, expected in [("multi.large", "one two three multi.large"), ("whole", "a whole answer"), ("words", "sync generator words")]:
        turn_id, raw = await chat(svc, model, stream=True)
        view = await svc.turn(turn_id)
        assert (view["status"], view["content"]) == ("completed", expected), view
        await check_stream_against_log(svc, turn_id, raw)
        status, verified = await svc.get(f"/v1/turns/{turn_id}/verify")
        assert status == 200 and verified["ok"], verified
    # A dict answer's usage is the pipe's own.
    assert view["usage"]["total_tokens"] > 0
    turn_id, _ = await chat(svc, "whole", stream=True)
    assert (await svc.turn(turn_id))["usage"]["total_tokens"] == 5
    assert svc.upstream.requests == []  # no turn reached the upstream


async def test_a_sync_generator_runs_off_the_loop_and_a_cancel_stops_it_between_items(pipes_service: Service) -> None:
    svc = pipes_service
    body = {"model": "gated", "messages": USER, "stream": True}
    async with svc.http.post(svc.v1 + "/chat/completions", json=body) as resp:
        turn_id = resp.headers["X-Turn-Id"]
        await until(lambda: "turnlog_pipe_gated" in sys.modules and sys.modules["turnlog_pipe_gated"].STEPS == [0], "the first item")
        gated = sys.modules["turnlog_pipe_gated"]
        # The pipe's thread is blocked at the gate: the event loop still answers.
        await until(lambda: gated.STEPS == [0] and len(gated.THREADS) == 1, "the pipe waiting at its gate")
        async with svc.http.get(svc.url + "/healthz") as health:
            assert health.status == 200
        assert all(name.startswith("turnlog-pipe-gated") for name in gated.THREADS), gated.THREADS
        status, _, _ = await svc.post(f"/v1/turns/{turn_id}/cancel")
        assert status == 202
        await resp.text()
    view = await svc.wait_status(turn_id, "cancelled")
    assert view["content"] == "item0 "
    assert not gated.CLOSED.is_set()  # still computing its item: a thread is not interrupted
    gated.GATE.set()
    await until(gated.CLOSED.is_set, "the generator closed after the item in flight")
    assert gated.STEPS == [0, 1]  # the item in flight finished, no other was asked for
    assert (await svc.turn(turn_id))["content"] == "item0 "


async def test_a_raising_pipe_is_a_recorded_failure(pipes_service: Service) -> None:
    svc = pipes_service
    turn_id, (status, body) = await chat(svc, "boom", stream=False)
    assert status == 502, body
    assert body["error"]["type"] == "pipe_error" and "ValueError: kaboom" in body["error"]["message"]
    view = await svc.turn(turn_id)
    assert view["status"] == "failed" and view["error"]["type"] == "pipe_error"

    turn_id, raw = await chat(svc, "halfway", stream=True)
    view = await svc.turn(turn_id)
    assert view["status"] == "failed" and "RuntimeError: broke halfway" in view["error"]["message"]
    assert view["content"] == "partial "
    await check_stream_against_log(svc, turn_id, raw)


def test_valves_and_load_errors(tmp_path: Path) -> None:
    folder = write_pipes(tmp_path / "pipes", {k: PIPES[k] for k in ("echo", "badvalves")})
    (folder / "nopipe.py").write_text("class Tools:\n    pass\n")
    (folder / "needs.py").write_text("class Pipe:\n    def pipe(self, body, api_key):\n        return ''\n")
    pipes, errors = load_pipes_dir(folder, {"echo": {"prefix": "> "}, "badvalves": {"count": "many"}, "ghost": {}})
    assert set(pipes) == {"echo"} and pipes["echo"].instance.valves.prefix == "> "
    messages = {Path(e.path).name: e.message for e in errors}
    assert "invalid valves in [pipes.badvalves]: count" in messages["badvalves.py"]
    assert messages["nopipe.py"] == "module defines no class Pipe"
    assert "requires parameter 'api_key'" in messages["needs.py"]
    assert "no pipe module ghost.py" in messages["[pipes.ghost]"]


CRASHY = """
    import time
    from pathlib import Path
    from pydantic import BaseModel

    class Pipe:
        class Valves(BaseModel):
            state: str = ""

        def pipe(self, body):
            state = Path(self.valves.state)
            with state.open("a") as f:
                f.write("start\\n")
            first = state.read_text().count("start") == 1
            for i in range(40):
                if first and i == 20:
                    while True:  # the first run never finishes: its process is killed here
                        time.sleep(0.05)
                yield f"w{i} "
"""


async def test_a_crash_resumes_a_pipe_by_running_it_again(tmp_path: Path) -> None:
    folder = write_pipes(tmp_path / "pipes", {"crashy": CRASHY})
    state = tmp_path / "state.txt"
    env = {
        "TURNLOG_PIPES_DIR": str(folder),
        "TURNLOG_PIPES": json.dumps({"crashy": {"state": str(state)}}),
        "TURNLOG_FLUSH_INTERVAL": "60",
        "TURNLOG_FLUSH_MAX_CHUNKS": "5",
    }
    db = tmp_path / "turnlog.db"
    text = "".join(f"w{i} " for i in range(40))
    async with aiohttp.ClientSession() as http:
        first = Server(db, None, auto_resume=False, env=env)
        try:
            await first.ready(http)
            resp = await http.post(first.url + "/v1/chat/completions", json={"model": "crashy", "messages": USER, "stream": True})
            assert resp.status == 200
            turn_id = resp.headers["X-Turn-Id"]
            durable = "".join(f"w{i} " for i in range(20))
            await wait_for(http, f"{first.url}/v1/turns/{turn_id}", lambda v: v["content"] == durable)
            first.kill9()
            resp.close()
        finally:
            first.stop()
        second = Server(db, None, auto_resume=True, env=env)
        try:
            await second.ready(http)
            view = await wait_for(http, f"{second.url}/v1/turns/{turn_id}", lambda v: v["status"] == "completed")
            assert view["content"] == text  # the pipe's second run, whole: not appended to the first's part
            assert state.read_text() == "start\nstart\n"
            async with http.get(f"{second.url}/v1/turns/{turn_id}/verify") as verified:
                assert verified.status == 200 and (await verified.json())["ok"]
        finally:
            second.stop()


async def test_an_upstream_down_is_still_asked_beside_the_pipes(tmp_path: Path, database_url: str) -> None:
    """The pipes always list their models: that must not make the catalog
    believe the upstream answered and refuse its models as unknown."""
    folder = write_pipes(tmp_path / "pipes", {"words": PIPES["words"]})
    down = f"http://127.0.0.1:{free_port()}/v1"
    svc = await start_service(make_settings(tmp_path, down, database_url=database_url, pipes_dir=str(folder)), None)
    try:
        _, (status, body) = await chat(svc, "gpt-test", stream=False)
        assert status == 503 and body["error"]["code"] == "upstream_unavailable", body
        _, (status, body) = await chat(svc, "words", stream=False)
        assert status == 200 and body["choices"][0]["message"]["content"] == "sync generator words"
    finally:
        await stop_service(svc)
