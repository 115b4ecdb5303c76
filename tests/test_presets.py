"""Model presets and several connections, over HTTP against two scripted
upstreams on two ports: the single-upstream settings are the connection
``openai``, a second connection has its own key and a prefix; presets (from
the settings and from ``/v1/presets``) send their base model with their
system prompt, params, tools, shared collections and opt-in filters; the
turn records the resolution, and replays and verifies from it alone."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from adapters.config import ConnectionSettings
from engine.events import TurnStarted
from engine.fold.turn_view import fold
from engine.run.loop_state import run_model
from tests.documents import upload, wait_file
from tests.harness import UPSTREAM_KEY, Service, make_settings, start_service, stop_service
from tests.processes import Server, cli, wait_for
from tests.upstream import Reply, ScriptedUpstream

SECOND_KEY = "sk-second-SECRET-91c2"

FILTER = """
class Filter:
    def inlet(self, body, __user__=None):
        body["messages"][-1]["content"] += " [{mark}]"
        return body
"""


@pytest.fixture
async def second() -> AsyncIterator[ScriptedUpstream]:
    up = ScriptedUpstream(models=["llama-b", "gpt-test"])
    await up.start()
    try:
        yield up
    finally:
        await up.close()


def _settings(tmp_path: Path, first: ScriptedUpstream, second: ScriptedUpstream, **overrides: Any) -> Any:
    filters = tmp_path / "filters"
    filters.mkdir()
    (filters / "always.py").write_text(FILTER.replace("{mark}", "always"))
    (filters / "tagger.py").write_text(FILTER.replace("{mark}", "tagger"))
    values: dict[str, Any] = {
        "connections": {"second": {"type": "openai", "base_url": second.url, "api_key": SECOND_KEY, "prefix": "b"}},
        "models": {
            "support": {
                "base_model": "b/llama-b",
                "name": "Support",
                "system": "You help {{USER_NAME}} on {{CURRENT_DATE}} ({{CURRENT_WEEKDAY}}) in {{USER_LANGUAGE}}.",
                "params": {"temperature": 0.2, "max_tokens": 77},
                "filters": ["tagger"],
            },
            "gpt-test": {"system": "a base model's own profile"},
        },
        "filters_dir": str(filters),
        "filters": {"tagger": {"global": False}},
        **overrides,
    }
    return make_settings(tmp_path, first.url, **values)


async def _post(svc: Service, path: str, body: Any, headers: dict[str, str] | None = None) -> tuple[int, Any, dict[str, str]]:
    async with svc.http.post(svc.url + path, json=body, headers=headers or {}) as resp:
        return resp.status, await resp.json(), dict(resp.headers)


async def _chat(svc: Service, body: dict[str, Any], headers: dict[str, str] | None = None) -> tuple[int, Any, dict[str, str]]:
    return await _post(svc, "/v1/chat/completions", body, headers)


def _system(request: dict[str, Any]) -> str:
    return next(str(m["content"]) for m in request["messages"] if m["role"] == "system")


async def test_models_list_presets_and_both_connections(tmp_path: Path, upstream: ScriptedUpstream, second: ScriptedUpstream) -> None:
    fixed = {"type": "ollama", "base_url": "http://127.0.0.1:9", "models": ["fixed-1"], "prefix": "f"}
    second_connection = {"type": "openai", "base_url": second.url, "api_key": SECOND_KEY, "prefix": "b"}
    models = {
        "support": {"base_model": "b/llama-b", "name": "Support"},
        "gpt-other": {"base_model": "b/llama-b", "function_calling": "default"},  # shadows the first upstream's gpt-other
    }
    settings = _settings(tmp_path, upstream, second, connections={"second": second_connection, "fixed": fixed}, models=models)
    svc = await start_service(settings, upstream)
    try:
        status, body = await svc.get("/v1/models")
        assert status == 200, body
        by_id = {m["id"]: m for m in body["data"]}
        # the first upstream's models as they are, the second's under its prefix (no clash then)
        assert {"gpt-test", "gpt-other", "b/llama-b", "b/gpt-test", "support"} <= set(by_id)
        assert by_id["support"]["owned_by"] == "turnlog"
        assert by_id["support"]["turnlog"] == {"base_model": "b/llama-b", "name": "Support"}
        assert "turnlog" not in by_id["gpt-test"]
        # a connection with a fixed model list is never asked for its models (nothing listens there)
        assert by_id["f/fixed-1"]["owned_by"] == "fixed" and "turnlog" not in body
        # a preset shadows the upstream model of its id, in the list and in turns
        assert [m["owned_by"] for m in body["data"] if m["id"] == "gpt-other"] == ["turnlog"]
        status, answer, headers = await _chat(svc, {"model": "gpt-other", "messages": [{"role": "user", "content": "hi"}]})
        assert status == 200, answer
        assert upstream.requests == [] and second.requests[0]["model"] == "llama-b"
        started = (await svc.events(headers["X-Turn-Id"]))[0]["data"]
        assert started["preset"]["params"] == {"function_calling": "default"}
    finally:
        await stop_service(svc)


async def test_a_preset_turn_goes_to_its_base_model_on_its_connection(tmp_path: Path, upstream: ScriptedUpstream, second: ScriptedUpstream) -> None:
    svc = await start_service(_settings(tmp_path, upstream, second), upstream)
    try:
        second.enqueue(Reply(text="first"), Reply(text="second"))
        messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
        status, body, headers = await _chat(svc, {"model": "support", "messages": messages}, {"Accept-Language": "de-DE,de;q=0.9"})
        assert status == 200, body
        assert body["choices"][0]["message"]["content"] == "first"
        assert body["model"] == "support"
        assert upstream.requests == []  # the first upstream never heard of it
        sent = second.requests[0]
        assert sent["model"] == "llama-b"  # the upstream's own id, without the prefix
        assert second.request_headers[0]["Authorization"] == f"Bearer {SECOND_KEY}"
        today = dt.datetime.now()
        expected = f"You help local on {today:%Y-%m-%d} ({today:%A}) in de-DE."
        system = _system(sent)
        assert system.startswith(expected) and system.endswith("Be brief."), system
        assert sent["temperature"] == 0.2 and sent["max_tokens"] == 77
        # the opt-in filter the preset names ran, with the global one
        assert sent["messages"][-1]["content"].endswith("[always] [tagger]") or sent["messages"][-1]["content"].endswith("[tagger] [always]")

        # the request's own params win over the preset's
        status, body, _ = await _chat(svc, {"model": "support", "messages": [{"role": "user", "content": "again"}], "temperature": 0.9})
        assert status == 200, body
        assert second.requests[1]["temperature"] == 0.9 and second.requests[1]["max_tokens"] == 77
        assert _system(second.requests[1]).endswith("in en-US.")  # no Accept-Language

        # the turn records the preset and what it resolved to
        events = await svc.events(headers["X-Turn-Id"])
        started = events[0]["data"]
        assert started["model"] == "support"
        assert started["preset"] == {
            "id": "support",
            "base_model": "b/llama-b",
            "system": expected,
            "params": {"temperature": 0.2, "max_tokens": 77},
            "filters": ["tagger"],
        }
        # it replays to the stored view from the log alone
        turn_id = headers["X-Turn-Id"]
        view = fold(turn_id, await svc.services.store.read(turn_id))
        assert view.model == "support" and view.content == "first"
        assert view.public() == await svc.turn(turn_id)
    finally:
        await stop_service(svc)  # verifies every turn: the engine re-run from the log emits the same events


async def test_global_filters_run_everywhere_opt_in_ones_only_where_named(tmp_path: Path, upstream: ScriptedUpstream, second: ScriptedUpstream) -> None:
    svc = await start_service(_settings(tmp_path, upstream, second), upstream)
    try:
        status, body, _ = await _chat(svc, {"model": "gpt-test", "messages": [{"role": "user", "content": "plain"}]})
        assert status == 200, body
        assert upstream.requests[0]["messages"][-1]["content"] == "plain [always]"
        # the single-upstream settings are the connection "openai", with their own key
        assert upstream.request_headers[0]["Authorization"] == f"Bearer {UPSTREAM_KEY}"
        # a client may opt in by filter_ids, as Open WebUI's client does
        status, body, _ = await _chat(svc, {"model": "gpt-test", "messages": [{"role": "user", "content": "x"}], "filter_ids": ["tagger"]})
        assert status == 200, body
        assert "[tagger]" in upstream.requests[1]["messages"][-1]["content"]
    finally:
        await stop_service(svc)


async def test_presets_over_http_need_an_admin_and_are_checked(tmp_path: Path, upstream: ScriptedUpstream, second: ScriptedUpstream, database_url: str) -> None:
    svc = await start_service(_settings(tmp_path, upstream, second, auth="on", database_url=database_url), upstream)
    try:
        store = svc.services.store
        user, admin = await store.create_api_key("alice"), await store.create_api_key("root", "admin")
        as_user, as_admin = {"Authorization": f"Bearer {user}"}, {"Authorization": f"Bearer {admin}"}
        preset = {"id": "tutor", "base_model": "gpt-test", "system": "Tutor {{USER_NAME}}.", "params": {"top_p": 0.5}, "features": {"memory": False}}
        status, body, _ = await _post(svc, "/v1/presets", preset, as_user)
        assert status == 403 and body["error"]["code"] == "admin_required"
        status, body, _ = await _post(svc, "/v1/presets", preset, as_admin)
        assert status == 201, body
        assert (await _post(svc, "/v1/presets", preset, as_admin))[0] == 409
        # checked: an unknown base model, a preset as base (no nesting), a private collection, a global filter
        for bad, code in (
            ({"base_model": "no-such-model"}, "invalid_base_model"),
            ({"base_model": "support"}, "invalid_base_model"),
            ({"filters": ["always"]}, "unknown_filter"),
            ({"tool_ids": ["nope"]}, "unknown_tool"),
        ):
            status, body, _ = await _post(svc, "/v1/presets", {**preset, "id": "bad", **bad}, as_admin)
            assert status == 400 and body["error"]["code"] == code, (bad, body)
        status, body, _ = await _post(svc, "/v1/knowledge", {"name": "private"}, as_admin)
        status, body, _ = await _post(svc, "/v1/presets", {**preset, "id": "bad", "files": [{"type": "collection", "id": body["id"]}]}, as_admin)
        assert status == 400 and body["error"]["code"] == "not_shared"

        # a user sees it as a model, and a turn with the user's key renders the user's name
        status, models = await svc.get("/v1/models", headers=as_user)
        assert {"id": "tutor", "owned_by": "turnlog"}.items() <= next(m for m in models["data"] if m["id"] == "tutor").items()
        status, body, headers = await _chat(svc, {"model": "tutor", "messages": [{"role": "user", "content": "hi"}]}, as_user)
        assert status == 200, body
        sent = upstream.requests[-1]
        assert sent["model"] == "gpt-test" and sent["top_p"] == 0.5
        async with svc.http.get(f"{svc.v1}/turns/{headers['X-Turn-Id']}/events", headers=as_user) as resp:
            recorded = (await resp.json())["events"][0]["data"]
        assert recorded["request"]["features"] == {"memory": False} and recorded["preset"]["features"] == {"memory": False}
        # the preset's system prompt replaces the base model's own profile prompt
        assert _system(sent) == "Tutor alice."

        # PATCH changes later turns only; the earlier turn keeps its recorded resolution
        async with svc.http.patch(f"{svc.v1}/presets/tutor", json={"system": "Changed."}, headers=as_admin) as resp:
            assert resp.status == 200, await resp.text()
        status, listed = await svc.get("/v1/presets", headers=as_admin)
        assert {p["id"]: p["source"] for p in listed["data"]} == {"support": "settings", "tutor": "api"}
        async with svc.http.get(f"{svc.v1}/turns/{headers['X-Turn-Id']}/events", headers=as_user) as resp:
            events = (await resp.json())["events"]
        assert events[0]["data"]["preset"]["system"] == "Tutor alice."
        status, body, _ = await _chat(svc, {"model": "tutor", "messages": [{"role": "user", "content": "hi"}]}, as_user)
        assert _system(upstream.requests[-1]) == "Changed."

        # a settings preset is changed in the settings
        async with svc.http.delete(f"{svc.v1}/presets/support", headers=as_admin) as resp:
            assert resp.status == 409
        async with svc.http.delete(f"{svc.v1}/presets/tutor", headers=as_admin) as resp:
            assert resp.status == 200
        async with svc.http.get(f"{svc.v1}/presets/tutor", headers=as_admin) as resp:
            assert resp.status == 404
    finally:
        await stop_service(svc)


async def test_shared_collections_are_read_by_all_and_changed_by_their_admin(
    tmp_path: Path, upstream: ScriptedUpstream, second: ScriptedUpstream, database_url: str
) -> None:
    svc = await start_service(_settings(tmp_path, upstream, second, auth="on", database_url=database_url), upstream)
    try:
        store = svc.services.store
        user, admin = await store.create_api_key("alice"), await store.create_api_key("root", "admin")
        as_user, as_admin = {"Authorization": f"Bearer {user}"}, {"Authorization": f"Bearer {admin}"}
        status, body, _ = await _post(svc, "/v1/knowledge", {"name": "handbook", "shared": True}, as_user)
        assert status == 403
        status, kb, _ = await _post(svc, "/v1/knowledge", {"name": "handbook", "shared": True}, as_admin)
        assert status == 200 and kb["shared"] is True
        status, doc = await upload(svc.http, svc.url, "handbook.txt", b"The lighthouse office opens at nine sharp.", "text/plain", as_admin)
        assert status == 200, doc
        assert (await wait_file(svc.http, svc.url, doc["id"], headers=as_admin))["status"] == "ready"
        status, kb, _ = await _post(svc, f"/v1/knowledge/{kb['id']}/files", {"file_id": doc["id"]}, as_admin)
        assert status == 200, kb
        status, seen = await svc.get(f"/v1/knowledge/{kb['id']}", headers=as_user)
        assert status == 200 and seen["name"] == "handbook"
        status, listed = await svc.get("/v1/knowledge", headers=as_user)
        assert [c["id"] for c in listed["data"]] == [kb["id"]]
        async with svc.http.delete(f"{svc.v1}/knowledge/{kb['id']}", headers=as_user) as resp:
            assert resp.status == 404  # readable, not the user's to delete
        preset = {"id": "hb", "base_model": "gpt-test", "files": [{"type": "collection", "id": kb["id"]}]}
        status, body, _ = await _post(svc, "/v1/presets", preset, as_admin)
        assert status == 201, body
        status, body, headers = await _chat(svc, {"model": "hb", "messages": [{"role": "user", "content": "When does the lighthouse office open?"}]}, as_user)
        assert status == 200, body
        # the admin's document reached the model in the user's turn
        assert "opens at nine sharp" in json.dumps(upstream.requests[-1]["messages"])
        events = [e for e in (await svc.get(f"/v1/turns/{headers['X-Turn-Id']}/events", headers=as_user))[1]["events"]]
        assert events[0]["data"]["request"]["files"] == preset["files"]
        # the user's turn found the shared collection (no "missing" warning about it)
        assert not any("no such collection" in json.dumps(e["data"]) for e in events)
    finally:
        await stop_service(svc)


def test_a_fork_to_another_model_leaves_the_preset_behind() -> None:
    preset = {"id": "support", "base_model": "b/llama-b"}

    def started(model: str, preset: dict[str, Any] | None = None) -> TurnStarted:
        return TurnStarted(chat_id="c", user_id="u", model=model, request={}, preset=preset)

    assert run_model(started("support", preset)) == "b/llama-b"
    assert run_model(started("gpt-test", preset)) == "gpt-test"
    assert run_model(started("gpt-test")) == "gpt-test"


def test_connections_resume_and_defaults(tmp_path: Path) -> None:
    settings = make_settings(
        tmp_path,
        "http://127.0.0.1:9/v1",
        connections={
            "vllm": {"type": "openai", "base_url": "http://127.0.0.1:10/v1", "resume": "continue", "resume_params": {"continue_final_message": True}},
            "other": {"type": "responses", "base_url": "http://127.0.0.1:11/v1", "api_key": "sk-other"},
        },
        resume={"responses": "continue"},
        images_connection="other",
        embedding_connection="vllm",
        embedding_engine="openai",
    )
    assert settings.resume_of("vllm", "chat") == ("continue", {"continue_final_message": True})
    assert settings.resume_of("other", "responses") == ("continue", {})  # its type's built-in default
    assert settings.resume_of("openai", "chat") == ("restart", {})  # the single-upstream settings as before
    assert list(settings.all_connections()) == ["openai", "vllm", "other"]
    from adapters.embeddings import OpenAIEmbedder, open_embedder
    from adapters.images import open_images

    images = open_images(settings)
    assert images is not None and images.base_url.startswith("http://127.0.0.1:11")
    embedder = open_embedder(settings)
    assert isinstance(embedder, OpenAIEmbedder) and embedder.base_url.startswith("http://127.0.0.1:10")
    with pytest.raises(ValueError, match="set twice"):
        make_settings(tmp_path, "http://127.0.0.1:9/v1", connections={"openai": {"base_url": "http://127.0.0.1:12/v1"}})
    with pytest.raises(ValueError, match="preset ids"):
        make_settings(tmp_path, None, models={"team/support": {"base_model": "gpt-test"}})
    make_settings(tmp_path, None, models={"team/model": {"system": "an upstream model's settings keep any id"}})
    with pytest.raises(ValueError, match="resume_params"):
        ConnectionSettings(base_url="http://x/v1", resume_params={"model": "m"})


WORDS = [f" w{i}" for i in range(40)]


async def test_a_resumed_preset_turn_keeps_the_base_model_it_recorded(
    http: aiohttp.ClientSession, tmp_path: Path, upstream: ScriptedUpstream, second: ScriptedUpstream
) -> None:
    """Killed mid-answer, the turn resumes on a server whose preset of that id
    now wraps another model on another connection: it goes on with the base
    model it recorded, on the first upstream."""
    env = {"TURNLOG_FLUSH_INTERVAL": "60", "TURNLOG_FLUSH_MAX_CHUNKS": "10", "TURNLOG_RESUME": json.dumps({"openai": "continue"})}
    upstream.enqueue(Reply(chunks=WORDS, delay=0.002, pause_after=25), Reply(chunks=WORDS))
    db = tmp_path / "turnlog.db"
    first = Server(db, upstream.url, auto_resume=False, env={**env, "TURNLOG_MODELS": json.dumps({"swap": {"base_model": "gpt-test", "system": "v1"}})})
    try:
        await first.ready(http)
        resp = await http.post(first.url + "/v1/chat/completions", json={"model": "swap", "messages": [{"role": "user", "content": "count"}], "stream": True})
        assert resp.status == 200
        turn_id = resp.headers["X-Turn-Id"]
        await asyncio.wait_for(upstream.paused.wait(), 20)
        await wait_for(http, f"{first.url}/v1/turns/{turn_id}", lambda v: len(v["content"] or "") > 0)
        first.kill9()
        upstream.release()
        resp.close()
    finally:
        first.stop()
    changed = {"swap": {"base_model": "b/gpt-test", "system": "v2"}}
    connections = {"second": {"base_url": second.url, "prefix": "b"}}
    again = Server(db, upstream.url, auto_resume=True, env={**env, "TURNLOG_MODELS": json.dumps(changed), "TURNLOG_CONNECTIONS": json.dumps(connections)})
    try:
        await again.ready(http)
        turn = await wait_for(http, f"{again.url}/v1/turns/{turn_id}", lambda v: v["status"] == "completed")
        assert turn["model"] == "swap" and turn["content"] == "".join(WORDS)
        assert second.requests == []  # the preset as it is now was never asked
        assert [r["model"] for r in upstream.requests] == ["gpt-test", "gpt-test"]
        assert _system(upstream.requests[1]) == "v1"
        assert cli(db, "verify", turn_id).returncode == 0
        assert cli(db, "replay", turn_id).returncode == 0
    finally:
        again.stop()


async def test_a_settings_preset_whose_base_model_is_unknown_is_logged_and_refused(
    tmp_path: Path, upstream: ScriptedUpstream, second: ScriptedUpstream, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="turnlog.catalog")
    svc = await start_service(_settings(tmp_path, upstream, second, models={"ghost": {"base_model": "no-such-model"}}), upstream)
    try:
        status, _ = await svc.get("/v1/models")  # waits for the listing
        assert status == 200
        assert "preset ghost: its base model no-such-model is no model of the upstreams" in caplog.text
        status, body, _ = await _chat(svc, {"model": "ghost", "messages": [{"role": "user", "content": "hi"}]})
        assert status == 404 and body["error"]["code"] == "model_not_found"
        assert "no-such-model" in body["error"]["message"] and "ghost" in body["error"]["message"]
        assert upstream.requests == [] and second.requests == []
    finally:
        await stop_service(svc)


async def test_while_no_upstream_answers_a_prefixed_id_goes_to_its_connection(tmp_path: Path) -> None:
    from adapters.bootstrap import open_providers
    from adapters.catalog import Catalog

    closed = "http://127.0.0.1:9/v1"  # nothing listens: every listing fails
    lab = {"type": "ollama", "base_url": "http://127.0.0.1:9", "prefix": "lab", "resume": "restart", "resume_params": {"keep_alive": "5m"}}
    settings = make_settings(tmp_path, closed, connections={"lab": lab})
    providers = open_providers(settings)
    catalog = Catalog(settings, providers)
    try:
        resolved = await catalog.resolve("lab/llama3")
        assert resolved is not None and resolved.provider is providers["lab"] and resolved.upstream_model == "llama3"
        # the connection's own resume mode and params (Ollama's built-in default is continue)
        assert resolved.api == "ollama" and (resolved.resume, resolved.resume_params) == ("restart", {"keep_alive": "5m"})
        other = await catalog.resolve("gpt-x")
        assert other is not None and other.provider is providers["openai"] and other.upstream_model == "gpt-x"
        assert (other.resume, other.resume_params) == ("restart", {})
    finally:
        await catalog.close()
        for provider in providers.values():
            await provider.close()


async def test_a_preset_turn_over_the_websocket_takes_the_upgrades_language(tmp_path: Path, upstream: ScriptedUpstream, second: ScriptedUpstream) -> None:
    svc = await start_service(_settings(tmp_path, upstream, second), upstream)
    try:
        async with svc.http.ws_connect(svc.v1 + "/ws", headers={"Accept-Language": "fr-CA, fr;q=0.8"}) as ws:
            await ws.send_json({"type": "chat", "request": {"model": "support", "messages": [{"role": "user", "content": "salut"}]}})
            turn_id = (await ws.receive_json())["turn_id"]
        view = await svc.wait_status(turn_id, "completed")
        assert view["model"] == "support"
        assert _system(second.requests[0]).endswith("in fr-CA.")
    finally:
        await stop_service(svc)


async def test_the_responses_api_serves_a_preset(tmp_path: Path, upstream: ScriptedUpstream, second: ScriptedUpstream) -> None:
    svc = await start_service(_settings(tmp_path, upstream, second), upstream)
    try:
        second.enqueue(Reply(text="bonjour"))
        status, body, headers = await _post(svc, "/v1/responses", {"model": "support", "input": "hi"}, {"Accept-Language": "it"})
        assert status == 200, body
        assert body["model"] == "support" and body["output"][0]["content"][0]["text"] == "bonjour"
        assert second.requests[0]["model"] == "llama-b" and _system(second.requests[0]).endswith("in it.")
    finally:
        await stop_service(svc)


async def test_a_burst_of_starts_reads_the_stored_presets_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every start asks whether its model is a preset: a burst shares one read
    of the table; this process's changes are seen at once, another's once the
    read is older than STALE_SECONDS."""
    from sqlalchemy import event

    from adapters import presets as presets_module
    from adapters.presets import Presets, PresetSpec
    from adapters.store import create_engine, migrate

    url = f"sqlite+aiosqlite:///{tmp_path / 'presets.db'}"
    await migrate(url)
    engine = create_engine(url)
    queries: list[str] = []
    event.listen(engine.sync_engine, "before_cursor_execute", lambda *args: queries.append(str(args[2])))
    try:
        mine, other = Presets({}, engine), Presets({}, engine)
        assert await asyncio.gather(*(mine.get("support") for _ in range(50))) == [None] * 50
        assert len([q for q in queries if "FROM presets" in q]) == 1
        await other.get("support")  # the other process has read the table too
        await mine.create(PresetSpec(id="support", base_model="gpt-test"))
        assert (await mine.get("support")) is not None  # its own change: at once
        assert (await other.get("support")) is None  # another's: not before its read is stale
        monkeypatch.setattr(presets_module, "STALE_SECONDS", 0.0)
        assert (await other.get("support")) is not None
    finally:
        await engine.dispose()
