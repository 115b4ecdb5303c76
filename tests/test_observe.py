"""Seeing the service: ``GET /metrics``, OpenTelemetry traces, JSON logs.

Every oracle is the log (what ``/v1/turns/{id}/events`` returns) or what a
client received, never the instruments' own bookkeeping: the metrics must
count what the log holds, the spans must name the calls the log records, and
the log lines of a turn must name the turn the client was told about.
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
from aiohttp import web
from openai.types.chat import ChatCompletionMessageParam
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest, ExportTraceServiceResponse
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status
from prometheus_client.parser import text_string_to_metric_families

from adapters.observe.observers import Observers
from tests.harness import Service, make_settings, start_service, stop_service
from tests.processes import Server
from tests.upstream import Reply, ScriptedUpstream

USER: list[ChatCompletionMessageParam] = [{"role": "user", "content": "What is the weather in Paris?"}]

# A tool that answers, one that raises, and one that logs (for the JSON log test).
TOOLS = {
    "lookup.py": '''
class Tools:
    async def lookup(self, city: str) -> str:
        """The weather of a city.

        :param city: the city name
        """
        return f"sunny in {city}"
''',
    "boom.py": '''
class Tools:
    async def boom(self) -> str:
        """Always fails."""
        raise RuntimeError("the boom tool broke")
''',
    "noisy.py": '''
import logging


class Tools:
    async def noisy(self, word: str) -> str:
        """Logs while it runs.

        :param word: what to say
        """
        logging.getLogger("tools.noisy").warning("noisy tool says %s", word)
        return word
''',
}


def write_tools(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, source in TOOLS.items():
        (folder / name).write_text(source)
    return folder


def call(name: str, arguments: object, id: str) -> dict[str, Any]:
    return {"name": name, "arguments": arguments, "id": id}


def tool_turn_replies() -> list[Reply]:
    """Two model calls: the first asks for a working and a failing tool, the second answers."""
    return [
        Reply(text="Let me look.", tool_calls=[call("lookup", {"city": "Paris"}, "call_ok"), call("boom", {}, "call_bad")], finish_reason="tool_calls"),
        Reply(text="It is sunny in Paris."),
    ]


def sdk(service: Service, **kw: Any) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=service.v1, api_key=kw.pop("api_key", "unused"), max_retries=0, **kw)


async def streamed_turn(client: openai.AsyncOpenAI, **extra: Any) -> tuple[str, str]:
    """Run a streaming turn with the SDK: its id (the response header) and the text received."""
    stream = await client.chat.completions.create(model="gpt-test", messages=USER, stream=True, extra_body=extra or None)
    assert isinstance(stream, openai.AsyncStream)
    turn_id = stream.response.headers["x-turn-id"]
    text = []
    async for chunk in stream:
        if chunk.choices:
            text.append(chunk.choices[0].delta.content or "")
    return turn_id, "".join(text)


@pytest.fixture
async def observed(tmp_path: Path, upstream: ScriptedUpstream, database_url: str) -> AsyncIterator[Service]:
    tools = write_tools(tmp_path / "tools")
    svc = await start_service(make_settings(tmp_path, upstream.url, tools_dir=str(tools), database_url=database_url), upstream)
    try:
        yield svc
    finally:
        await stop_service(svc)


# -- metrics ---------------------------------------------------------------------------


async def scrape(service: Service, headers: dict[str, str] | None = None) -> dict[str, float]:
    """``GET /metrics`` parsed by prometheus-client's own parser: sample name + labels -> value."""
    async with service.http.get(service.url + "/metrics", headers=headers or {}) as resp:
        assert resp.status == 200, await resp.text()
        assert resp.headers["Content-Type"].startswith("text/plain"), resp.headers["Content-Type"]
        text = await resp.text()
    samples: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
            samples[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return samples


async def scrape_until(service: Service, name: str, value: float, timeout: float = 10.0) -> dict[str, float]:
    """Scrape until ``name`` reads ``value`` (a turn's actor ends just after its last event is durable)."""
    deadline = time.monotonic() + timeout
    while True:
        samples = await scrape(service)
        if samples.get(name) == value:
            return samples
        assert time.monotonic() < deadline, f"{name} stayed {samples.get(name)} (wanted {value})"
        await asyncio.sleep(0.02)


async def test_metrics_count_what_the_log_holds(observed: Service, upstream: ScriptedUpstream) -> None:
    samples = await scrape(observed)
    for name in (
        "turnlog_turns_started_total",
        "turnlog_turns_running",
        "turnlog_time_to_first_token_seconds_count",
        "turnlog_events_appended_total",
        "turnlog_store_commit_seconds_count",
        'turnlog_turns_finished_total{status="completed"}',
        'turnlog_tool_calls_total{status="completed"}',
        'turnlog_upstream_errors_total{kind="upstream_error"}',
    ):
        assert name in samples, f"{name} missing before any turn"
    assert samples["turnlog_turns_started_total"] == 0

    client = sdk(observed)
    upstream.enqueue(*tool_turn_replies())
    tool_turn, tool_text = await streamed_turn(client, tool_ids=["lookup", "boom"])
    assert tool_text.endswith("It is sunny in Paris.")
    upstream.enqueue(Reply(text="Just text."))
    plain_turn, _ = await streamed_turn(client)
    upstream.enqueue(Reply(status=500, error_message="overloaded"))
    failed = await client.chat.completions.with_raw_response.create(model="gpt-test", messages=USER, stream=True)
    failed_turn = failed.headers["x-turn-id"]
    with pytest.raises(openai.APIError, match="HTTP 500"):  # the stream's error chunk
        async for _chunk in failed.parse():
            pass
    turns = [tool_turn, plain_turn, failed_turn]
    for turn_id in turns:
        await observed.wait_status(turn_id, "completed", "failed")

    samples = await scrape_until(observed, "turnlog_turns_running", 0)
    logs = {turn_id: await observed.events(turn_id) for turn_id in turns}
    views = {turn_id: await observed.turn(turn_id) for turn_id in turns}

    assert samples["turnlog_turns_started_total"] == len(turns)
    for status in ("completed", "failed", "cancelled"):
        want = sum(1 for v in views.values() if v["status"] == status)
        assert samples[f'turnlog_turns_finished_total{{status="{status}"}}'] == want, status
    # Every event of every turn was appended once, and nothing else was.
    assert samples["turnlog_events_appended_total"] == sum(len(events) for events in logs.values())
    assert samples["turnlog_store_commit_seconds_count"] >= 1
    assert samples["turnlog_store_commit_seconds_sum"] > 0
    # Tool calls by the status their tool.completed event records.
    completed = [e["data"] for events in logs.values() for e in events if e["type"] == "tool.completed"]
    assert sorted(d["status"] for d in completed) == ["completed", "failed"]
    for status in ("completed", "failed"):
        assert samples[f'turnlog_tool_calls_total{{status="{status}"}}'] == sum(1 for d in completed if d["status"] == status)
    # One first token per turn that streamed text (the failed one never did).
    streamed = [t for t in turns if any(e["type"] == "model.delta" for e in logs[t])]
    assert streamed == [tool_turn, plain_turn]
    assert samples["turnlog_time_to_first_token_seconds_count"] == len(streamed)
    assert 0 < samples["turnlog_time_to_first_token_seconds_sum"] < 10 * len(streamed)
    # The upstream failure, by the kind its turn.failed records.
    failure = next(e["data"]["error"] for e in logs[failed_turn] if e["type"] == "turn.failed")
    assert samples[f'turnlog_upstream_errors_total{{kind="{failure["type"]}"}}'] == 1
    assert sum(v for k, v in samples.items() if k.startswith("turnlog_upstream_errors_total")) == 1
    model_calls = sum(1 for events in logs.values() for e in events if e["type"] == "model.requested")
    assert samples['turnlog_model_calls_total{outcome="completed"}'] + samples['turnlog_model_calls_total{outcome="failed"}'] == model_calls
    assert samples['turnlog_model_calls_total{outcome="failed"}'] == 1
    assert samples["process_resident_memory_bytes"] > 0


async def test_metrics_need_a_key_when_auth_is_on(tmp_path: Path, upstream: ScriptedUpstream, database_url: str) -> None:
    svc = await start_service(make_settings(tmp_path, upstream.url, auth="on", database_url=database_url), upstream)
    try:
        async with svc.http.get(svc.url + "/metrics") as resp:
            assert resp.status == 401
            body = await resp.json()
            assert body["error"]["code"] == "missing_api_key"
        async with svc.http.get(svc.url + "/metrics", headers={"Authorization": "Bearer nope"}) as resp:
            assert resp.status == 401
            assert (await resp.json())["error"]["code"] == "invalid_api_key"
        key = await svc.services.store.create_api_key("ops", "admin")
        samples = await scrape(svc, {"Authorization": f"Bearer {key}"})
        assert samples["turnlog_turns_started_total"] == 0
    finally:
        await stop_service(svc)


@pytest.mark.sqlite_only
async def test_each_app_counts_only_its_own_turns(tmp_path: Path, upstream: ScriptedUpstream, database_url: str) -> None:
    """Two services in one process (as in these tests): one registry each, no collision."""
    one = await start_service(make_settings(tmp_path / "one", upstream.url, database_url=database_url), upstream)
    (tmp_path / "two").mkdir()
    two = await start_service(make_settings(tmp_path / "two", upstream.url), upstream)
    try:
        upstream.enqueue(Reply(text="hello"))
        turn_id, _ = await streamed_turn(sdk(one))
        await one.wait_status(turn_id, "completed")
        first = await scrape_until(one, "turnlog_turns_running", 0)
        second = await scrape(two)
        assert first["turnlog_turns_started_total"] == 1
        assert first["turnlog_events_appended_total"] == len(await one.events(turn_id))
        assert second["turnlog_turns_started_total"] == 0
        assert second["turnlog_events_appended_total"] == 0
    finally:
        await stop_service(two)
        await stop_service(one)


# -- traces ----------------------------------------------------------------------------


class OtlpReceiver:
    """An OTLP/HTTP trace receiver on loopback: ``POST /v1/traces`` with an
    ``ExportTraceServiceRequest`` (protobuf), as a collector accepts it."""

    def __init__(self) -> None:
        self.requests: list[ExportTraceServiceRequest] = []
        self.runner: web.AppRunner | None = None
        self.url = ""

    async def _traces(self, request: web.Request) -> web.Response:
        assert request.content_type == "application/x-protobuf", request.content_type
        body = await request.read()
        if request.headers.get("Content-Encoding") == "gzip":
            import gzip

            body = gzip.decompress(body)
        message = ExportTraceServiceRequest()
        message.ParseFromString(body)
        self.requests.append(message)
        return web.Response(body=ExportTraceServiceResponse().SerializeToString(), content_type="application/x-protobuf")

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/v1/traces", self._traces)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", 0).start()
        self.url = f"http://127.0.0.1:{self.runner.addresses[0][1]}"

    async def close(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()

    def spans(self) -> list[tuple[dict[str, Any], Span]]:
        """Every span received, with its resource's attributes."""
        out: list[tuple[dict[str, Any], Span]] = []
        for message in self.requests:
            for resource_spans in message.resource_spans:
                resource = attributes(resource_spans.resource.attributes)
                for scope_spans in resource_spans.scope_spans:
                    out.extend((resource, span) for span in scope_spans.spans)
        return out


def value(v: AnyValue) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [value(x) for x in v.array_value.values]
    return getattr(v, kind) if kind else None


def attributes(kvs: Any) -> dict[str, Any]:
    return {kv.key: value(kv.value) for kv in kvs}


@pytest.fixture
async def receiver() -> AsyncIterator[OtlpReceiver]:
    r = OtlpReceiver()
    await r.start()
    try:
        yield r
    finally:
        await r.close()


async def test_a_tool_turn_is_one_trace_of_genai_spans(
    tmp_path: Path, upstream: ScriptedUpstream, database_url: str, receiver: OtlpReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.url)
    monkeypatch.setenv("OTEL_SERVICE_NAME", "turnlog-under-test")
    tools = write_tools(tmp_path / "tools")
    svc = await start_service(make_settings(tmp_path, upstream.url, tools_dir=str(tools), database_url=database_url), upstream)
    try:
        upstream.enqueue(*tool_turn_replies())
        turn_id, _ = await streamed_turn(sdk(svc), tool_ids=["lookup", "boom"])
        await svc.wait_status(turn_id, "completed")
        log = await svc.events(turn_id)
    finally:
        await stop_service(svc)  # flushes the exporter: every span is at the receiver now

    spans = receiver.spans()
    assert spans, "no span was exported"
    assert {resource["service.name"] for resource, _ in spans} == {"turnlog-under-test"}
    by_name: dict[str, list[Span]] = {}
    for _, span in spans:
        by_name.setdefault(span.name, []).append(span)
    assert sorted(by_name) == ["chat gpt-test", "execute_tool boom", "execute_tool lookup", "invoke_agent turnlog"], sorted(by_name)

    (root,) = by_name["invoke_agent turnlog"]
    assert root.parent_span_id == b""
    assert root.kind == Span.SPAN_KIND_INTERNAL
    root_attrs = attributes(root.attributes)
    assert root_attrs["gen_ai.operation.name"] == "invoke_agent"
    assert root_attrs["turnlog.turn_id"] == turn_id
    assert root_attrs["gen_ai.request.model"] == "gpt-test"
    assert root_attrs["turnlog.status"] == "completed"
    for _, span in spans:
        assert span.trace_id == root.trace_id, span.name
        if span is not root:
            assert span.parent_span_id == root.span_id, span.name
            assert root.start_time_unix_nano <= span.start_time_unix_nano <= span.end_time_unix_nano <= root.end_time_unix_nano

    # Model calls: one span per model.requested, with what model.completed recorded.
    completions = [e["data"] for e in log if e["type"] == "model.completed"]
    chats = sorted(by_name["chat gpt-test"], key=lambda s: s.start_time_unix_nano)
    assert len(chats) == len([e for e in log if e["type"] == "model.requested"]) == len(completions) == 2
    for span, completed in zip(chats, completions):
        a = attributes(span.attributes)
        assert span.kind == Span.SPAN_KIND_CLIENT
        assert a["gen_ai.operation.name"] == "chat"
        assert a["gen_ai.request.model"] == a["gen_ai.response.model"] == "gpt-test"
        assert a["gen_ai.provider.name"] == a["gen_ai.system"] == "openai"
        assert a["gen_ai.response.finish_reasons"] == [completed["finish_reason"]]
        assert a["gen_ai.usage.input_tokens"] == completed["usage"]["prompt_tokens"]
        assert a["gen_ai.usage.output_tokens"] == completed["usage"]["completion_tokens"]
        assert span.status.code != Status.STATUS_CODE_ERROR
    assert [attributes(s.attributes)["gen_ai.response.finish_reasons"] for s in chats] == [["tool_calls"], ["stop"]]

    # Tool calls: one span per tool.completed, between the two model calls, failed ones in error.
    results = {e["data"]["call_id"]: e["data"] for e in log if e["type"] == "tool.completed"}
    assert set(results) == {"call_ok", "call_bad"}
    for name, call_id in (("lookup", "call_ok"), ("boom", "call_bad")):
        (span,) = by_name[f"execute_tool {name}"]
        a = attributes(span.attributes)
        assert a["gen_ai.operation.name"] == "execute_tool"
        assert a["gen_ai.tool.name"] == name
        assert a["gen_ai.tool.call.id"] == call_id
        assert chats[0].end_time_unix_nano <= span.start_time_unix_nano
        assert span.end_time_unix_nano <= chats[1].start_time_unix_nano
        if results[call_id]["status"] == "failed":
            assert span.status.code == Status.STATUS_CODE_ERROR
            assert a["error.type"] == "tool_error"
        else:
            assert span.status.code != Status.STATUS_CODE_ERROR
    assert results["call_bad"]["status"] == "failed" and results["call_ok"]["status"] == "completed"


async def test_no_endpoint_no_traces(tmp_path: Path, upstream: ScriptedUpstream, receiver: OtlpReceiver, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without an OTLP endpoint (or with the SDK disabled) nothing is exported."""
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", raising=False)
    svc = await start_service(make_settings(tmp_path, upstream.url), upstream)
    try:
        observer = svc.services.supervisor.wiring.observer
        assert isinstance(observer, Observers) and observer.tracing is None
    finally:
        await stop_service(svc)
    from adapters.observe.tracing import tracing_requested

    assert tracing_requested({"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url})
    assert not tracing_requested({"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url, "OTEL_SDK_DISABLED": "true"})
    assert not tracing_requested({"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url, "OTEL_TRACES_EXPORTER": "none"})


# -- JSON logs -------------------------------------------------------------------------


async def test_json_logs_name_the_turn(tmp_path: Path, upstream: ScriptedUpstream) -> None:
    """``turnlog serve`` with TURNLOG_LOG_FORMAT=json: every line of its output is
    one JSON object; the lines written while working on a turn carry its id."""
    tools = write_tools(tmp_path / "tools")
    server = Server(
        tmp_path / "turnlog.db",
        upstream.url,
        auto_resume=False,
        TURNLOG_LOG_FORMAT="json",
        TURNLOG_TOOLS_DIR=str(tools),
    )
    try:
        async with aiohttp.ClientSession() as http:
            await server.ready(http)
            upstream.enqueue(
                Reply(tool_calls=[call("noisy", {"word": "quack"}, "call_n")], finish_reason="tool_calls"),
                Reply(text="done"),
            )
            client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
            raw = await client.chat.completions.with_raw_response.create(model="gpt-test", messages=USER, extra_body={"tool_ids": ["noisy"]})
            turn_id = raw.headers["x-turn-id"]
            assert raw.parse().choices[0].message.content == "done"
    finally:
        server.stop()  # SIGTERM: the process writes its last lines and exits

    lines = [line for line in server.log_path.read_text().splitlines() if line.strip()]
    assert lines
    records = []
    for line in lines:
        record = json.loads(line)  # every line is one JSON object
        assert isinstance(record, dict), line
        assert {"time", "level", "logger", "message"} <= set(record), line
        assert record["time"].endswith("Z") and record["level"] in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
        records.append(record)
    noisy = [r for r in records if r["logger"] == "tools.noisy"]
    assert [r["message"] for r in noisy] == ["noisy tool says quack"]
    assert noisy[0]["turn_id"] == turn_id
    assert noisy[0]["level"] == "WARNING"
    # The banner and the start-up lines (migrations, the upstream's models) are about no turn.
    assert any(r["message"].startswith("turnlog serving on") for r in records)
    assert any(r["logger"] == "turnlog.catalog" for r in records)
    assert [r for r in records if "turn_id" in r] == noisy


async def test_a_cancelled_turn_in_metrics_and_trace(
    tmp_path: Path, upstream: ScriptedUpstream, database_url: str, receiver: OtlpReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While a turn runs it is counted running; cancelled, it is finished as
    ``cancelled`` and its cut-off model call ends in error in the trace."""
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.url)
    svc = await start_service(make_settings(tmp_path, upstream.url, database_url=database_url), upstream)
    try:
        upstream.enqueue(Reply(text="stop me please now", chunk_size=3, pause_after=2))
        resp = await svc.http.post(svc.v1 + "/chat/completions", json={"model": "gpt-test", "messages": USER, "stream": True})
        turn_id = resp.headers["X-Turn-Id"]
        await asyncio.wait_for(upstream.paused.wait(), 5)
        running = await scrape(svc)
        assert running["turnlog_turns_running"] == 1
        assert running['turnlog_turns_finished_total{status="cancelled"}'] == 0
        status, body, _ = await svc.post(f"/v1/turns/{turn_id}/cancel")
        assert status == 202, body
        resp.close()
        view = await svc.wait_status(turn_id, "cancelled")
        samples = await scrape_until(svc, "turnlog_turns_running", 0)
        assert samples['turnlog_turns_finished_total{status="cancelled"}'] == 1
        assert samples['turnlog_turns_finished_total{status="completed"}'] == 0
        assert samples["turnlog_events_appended_total"] == len(await svc.events(turn_id))
    finally:
        upstream.release()
        await stop_service(svc)

    assert view["status"] == "cancelled"
    spans = {span.name: span for _, span in receiver.spans()}
    assert sorted(spans) == ["chat gpt-test", "invoke_agent turnlog"]
    root, chat = spans["invoke_agent turnlog"], spans["chat gpt-test"]
    assert attributes(root.attributes)["turnlog.status"] == "cancelled"
    assert root.status.code != Status.STATUS_CODE_ERROR  # a cancel is not a failure of the turn
    assert chat.parent_span_id == root.span_id
    assert chat.status.code == Status.STATUS_CODE_ERROR
    assert attributes(chat.attributes)["error.type"] == "cancelled"


def test_json_lines_of_records_about_a_turn_outside_its_task() -> None:
    """A line written outside the turn's task (a request handler, the supervisor)
    that names the turn as its first argument gets ``turn_id`` too; an exception
    comes with its traceback; a line about no turn has no ``turn_id``."""
    from adapters.observe.logs import JsonFormatter, TurnIdFilter
    from engine.run.log_context import current_turn

    def line(msg: str, *args: object, exc: Any = None) -> dict[str, Any]:
        record = logging.LogRecord("turnlog.test", logging.ERROR, __file__, 1, msg, args, exc)
        assert TurnIdFilter().filter(record)
        return json.loads(JsonFormatter().format(record))

    turn = "turn_0123456789abcdef01234567"
    assert line("stream of turn %s failed", turn)["turn_id"] == turn
    assert "turn_id" not in line("heartbeat failed")
    assert "turn_id" not in line("user %s did %s", "turn_not_an_id", "x")
    try:
        raise ValueError("bad")
    except ValueError:
        failed = line("turn %s: internal error", turn, exc=sys.exc_info())
    assert failed["turn_id"] == turn and failed["level"] == "ERROR"
    assert "ValueError: bad" in failed["exception"]
    token = current_turn.set("turn_aaaaaaaaaaaaaaaaaaaaaaaa")
    try:
        assert line("working")["turn_id"] == "turn_aaaaaaaaaaaaaaaaaaaaaaaa"
    finally:
        current_turn.reset(token)


async def test_gc_pauses_are_timed_per_generation_and_unhooked_at_stop(database_url: str, tmp_path: Path, upstream: ScriptedUpstream) -> None:
    hooks_before = list(gc.callbacks)
    service = await start_service(make_settings(tmp_path, upstream.url, database_url=database_url), upstream)
    try:
        samples = await scrape(service)
        count0, sum0 = samples['turnlog_gc_pause_seconds_count{generation="2"}'], samples['turnlog_gc_pause_seconds_sum{generation="2"}']
        began = time.perf_counter()
        gc.collect()  # one full collection, timed here too
        took = time.perf_counter() - began
        samples = await scrape(service)
        count = samples['turnlog_gc_pause_seconds_count{generation="2"}'] - count0
        paused = samples['turnlog_gc_pause_seconds_sum{generation="2"}'] - sum0
        assert count >= 1 and paused > 0
        if count == 1:  # only this test's collection: its pause lies inside what the test timed
            assert paused <= took
    finally:
        await stop_service(service)
    assert gc.callbacks == hooks_before  # the stopped app's hook is gone
