"""Fuzzing every operation of ``GET /openapi.json`` with schemathesis.

The real service (auth on) runs on loopback with the scripted upstream; the
document it serves drives schemathesis, which sends valid and invalid requests
to each operation: with a valid key, then with no key and a wrong one. The
oracle is what the client receives: never a 5xx, never a hang (every request
has a timeout), every error the OpenAI JSON shape, every answer the shape
and status the document declares. A few real objects (a turn, its chat, a
memory, a file, a collection) are seeded and offered to the path parameters
next to random ids, so the fuzzing reaches past the 404s. The turns it starts
are verified at teardown like every other test's (``stop_service``).
"""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis.core.failures import FailureGroup
from schemathesis.core.result import Ok
from schemathesis.specs.openapi.checks import response_schema_conformance, status_code_conformance

from tests.harness import Service, make_settings, start_service, stop_service
from tests.upstream import Reply, ScriptedUpstream

#: A request that takes longer is a hang (the scripted upstream answers at once).
TIMEOUT = (5.0, 15.0)
#: Cases per operation: valid ones, invalid ones (with the key), and each of
#: no key and a wrong key. About 20 s per backend on a busy 2-core machine.
EXAMPLES_VALID = 4
EXAMPLES_INVALID = 3
EXAMPLES_WITHOUT_KEY = 1
PUBLIC = ("/healthz", "/openapi.json", "/ui")


@pytest.mark.timeout(240)
async def test_fuzz_every_operation(tmp_path: Path, upstream: ScriptedUpstream, database_url: str) -> None:
    svc = await start_service(make_settings(tmp_path, upstream.url, auth="on", database_url=database_url), upstream)
    try:
        key = await svc.services.store.create_api_key("fuzzer")
        svc.headers = {"Authorization": f"Bearer {key}"}
        known = await _seed(svc)
        status, doc = await svc.get("/openapi.json")
        assert status == 200, doc
        doc = _offer_known(doc, known)
        failures, calls = await asyncio.to_thread(_fuzz, doc, svc.url, key)
        assert not failures, f"{len(failures)} of {calls} requests failed:\n\n" + "\n\n".join(failures[:20])
        assert calls > 250  # every operation really was called, several times
        # The fuzzed requests reached past validation: they started turns.
        started = await svc.services.store.list_turns(limit=1000)
        assert len(started) > 2, [t.id for t in started]
    finally:
        await stop_service(svc)


async def _seed(svc: Service) -> dict[str, list[str]]:
    """One of each object the path parameters name."""
    status, body, headers = await svc.post(
        "/v1/chat/completions", {"model": "gpt-test", "chat_id": "fuzz-chat", "messages": [{"role": "user", "content": "hi"}]}
    )
    assert status == 200, body
    status, memory, _ = await svc.post("/v1/memories", {"content": "likes tea"})
    assert status == 200, memory
    status, collection, _ = await svc.post("/v1/knowledge", {"name": "fuzz"})
    assert status == 200, collection
    form = {"file": ("notes.txt", b"turnlog fuzzing notes", "text/plain")}
    async with svc.http.post(svc.v1 + "/files", data=_multipart(form), headers=svc.headers) as resp:
        file = await resp.json()
        assert resp.status == 200, file
    return {
        "turn_id": [headers["X-Turn-Id"]],
        "chat_id": ["fuzz-chat"],
        "memory_id": [memory["id"]],
        "knowledge_id": [collection["id"]],
        "file_id": [file["id"]],
        "filename": ["app.js", "index.html"],
        "model": ["gpt-test"],
    }


def _multipart(files: dict[str, tuple[str, bytes, str]]) -> Any:
    import aiohttp

    form = aiohttp.FormData()
    for name, (filename, data, content_type) in files.items():
        form.add_field(name, data, filename=filename, content_type=content_type)
    return form


def _offer_known(doc: dict[str, Any], known: dict[str, list[str]]) -> dict[str, Any]:
    """The document with the seeded ids offered next to any string for the
    path parameters, and the chat request's ``model`` one the upstream has (a
    test-side copy)."""
    doc = copy.deepcopy(doc)
    for ops in doc["paths"].values():
        for op in ops.values():
            for param in op.get("parameters", []):
                if param["in"] == "path" and param["name"] in known:
                    param["schema"] = {"anyOf": [{"enum": known[param["name"]]}, param["schema"]]}
    # Most random turn requests would stop at a plain 404 or 400: narrow them
    # (within the real schema) so that they start turns. They name a model the
    # upstream has, no unknown server tool, and messages with content.
    schemas = doc["components"]["schemas"]
    schemas["ChatRequest"]["properties"]["model"] = {"enum": known["model"]}
    schemas["ChatRequest"]["properties"]["tool_ids"] = {"type": "array", "maxItems": 0}
    schemas["Message"]["required"] = ["role", "content"]
    return doc


def _fuzz(doc: dict[str, Any], base_url: str, key: str) -> tuple[list[str], int]:
    """Every operation, valid and invalid requests with the key; then without a
    key and with a wrong one. Returns the failures (described) and the number
    of requests made."""
    fuzzer = _Fuzzer(base_url, key)
    for result in schemathesis.openapi.from_dict(doc).get_all_operations():
        assert isinstance(result, Ok), result
        operation = result.ok()
        declared = doc["paths"][operation.path][operation.method.lower()]
        _run(operation.as_strategy(), EXAMPLES_VALID, fuzzer.with_key)
        if "requestBody" in declared or any(p["in"] != "path" for p in declared.get("parameters", ())):
            # (A path parameter is any string: nothing there to break.)
            _run(operation.as_strategy(generation_mode=schemathesis.GenerationMode.NEGATIVE), EXAMPLES_INVALID, fuzzer.with_key)
        _run(operation.as_strategy(), EXAMPLES_WITHOUT_KEY, fuzzer.without_key)
        _run(operation.as_strategy(), EXAMPLES_WITHOUT_KEY, fuzzer.with_wrong_key)
    fuzzer.session.close()
    return fuzzer.failures, fuzzer.calls


class _Fuzzer:
    """Sends cases and judges what comes back."""

    def __init__(self, base_url: str, key: str) -> None:
        self.base_url = base_url
        self.key = key
        self.session = requests.Session()
        self.failures: list[str] = []
        self.calls = 0

    def record(self, case: schemathesis.Case, response: schemathesis.Response | None, problem: str) -> None:
        got = "no response" if response is None else f"{response.status_code} {response.content[:300]!r}"
        self.failures.append(f"{case.operation.label}: {problem}\n  {case.as_curl_command()}\n  -> {got}")

    def call(self, case: schemathesis.Case, headers: dict[str, str]) -> schemathesis.Response | None:
        self.calls += 1
        try:
            return case.call(base_url=self.base_url, session=self.session, headers=headers, timeout=TIMEOUT)
        except requests.Timeout:
            self.record(case, None, f"no answer within {TIMEOUT[1]} s (a hang)")
        except requests.ConnectionError as exc:
            self.record(case, None, f"connection failed: {exc}")
        return None

    def with_key(self, case: schemathesis.Case) -> None:
        response = self.call(case, {"Authorization": f"Bearer {self.key}"})
        if response is None:
            return
        problem = _error_shape(response)
        if problem is None:
            try:  # the status and the body are what the document declares
                case.validate_response(response, checks=[status_code_conformance, response_schema_conformance])
            except FailureGroup as exc:
                problem = "; ".join(f"{f.title}: {f.message}"[:500] for f in exc.exceptions)
            except AssertionError as exc:
                problem = str(exc)[:500]
        if problem is not None:
            self.record(case, response, problem)

    def without_key(self, case: schemathesis.Case, headers: dict[str, str] | None = None) -> None:
        response = self.call(case, headers or {})
        if response is None:
            return
        problem = _error_shape(response)
        path = case.operation.path
        public = path in PUBLIC or path.startswith("/ui")
        if problem is None and not public and response.status_code != 401:
            problem = f"expected 401 without a valid key, got {response.status_code}"
        if problem is not None:
            self.record(case, response, problem)

    def with_wrong_key(self, case: schemathesis.Case) -> None:
        self.without_key(case, {"Authorization": "Bearer tl-wrong"})


def _run(strategy: Any, examples: int, test: Callable[[schemathesis.Case], None]) -> None:
    """``test`` on ``examples`` cases, deterministically (derandomized, no
    example database): the same requests on every run."""

    @settings(
        max_examples=examples,
        derandomize=True,
        database=None,
        deadline=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(case=strategy)
    def run(case: schemathesis.Case) -> None:
        test(case)

    try:
        run()
    except Unsatisfiable:  # negative mode on an operation with nothing to break
        pass


def _error_shape(response: schemathesis.Response) -> str | None:
    """Why the answer is a server error, a hang or an error not in the OpenAI shape (None: fine)."""
    status = response.status_code
    if response.stream_cut_short:
        return f"the event stream did not end within {TIMEOUT[1]} s (a hang)"
    if status >= 500 and status != 502:
        return f"server error {status}"
    if status < 400:
        return None
    content_type = (response.headers.get("content-type") or [""])[0]
    if not content_type.startswith("application/json"):
        return f"error {status} is not JSON ({content_type or 'no Content-Type'})"
    try:
        body = json.loads(response.content)
    except ValueError:
        return f"error {status} is not valid JSON"
    error = body.get("error") if isinstance(body, dict) else None
    if not isinstance(error, dict) or not isinstance(error.get("message"), str) or not error["message"]:
        return f"error {status} has no error.message"
    if not isinstance(error.get("type"), str) or not error["type"]:
        return f"error {status} has no error.type"
    return None


async def test_a_streamed_answer_conforms_to_the_document_event_by_event(service: Service) -> None:
    """The fuzzing found it when one of its valid chat requests streamed: a
    validator applies a ``text/event-stream`` schema to each event of the
    stream, and the document's said ``string``. The same checks as the
    fuzzing's, on a streamed answer."""
    service.upstream.enqueue(Reply(chunks=["Hel", "lo"]))
    status, doc = await service.get("/openapi.json")
    assert status == 200, doc
    found = schemathesis.openapi.from_dict(doc).get_all_operations()
    chat = next(r.ok() for r in found if isinstance(r, Ok) and (r.ok().method.upper(), r.ok().path) == ("POST", "/v1/chat/completions"))
    case = chat.Case(body={"model": "gpt-test", "stream": True, "messages": [{"role": "user", "content": "hi"}]}, media_type="application/json")
    fuzzer = _Fuzzer(service.url, "")
    await asyncio.to_thread(fuzzer.with_key, case)
    assert fuzzer.calls == 1 and not fuzzer.failures, fuzzer.failures


async def test_nul_characters_are_a_400_on_every_backend(service: Service) -> None:
    """Found by the fuzzing on PostgreSQL, whose text type cannot hold a NUL:
    in a URL or in a field stored in a column of its own it is a 400 naming
    the problem, on both backends alike."""
    for path in ("/v1/turns/a%00b", "/v1/chats/a%00b", "/v1/ui/turns?chat_id=%00", "/v1/memories/%00", "/v1/files/x%00"):
        status, body = await service.get(path)
        assert status == 400 and "NUL" in body["error"]["message"], (path, body)
    for path, payload, field in (
        ("/v1/memories", {"content": "a\u0000b"}, "content"),
        ("/v1/memories/query", {"content": "\u0000"}, "content"),
        ("/v1/knowledge", {"name": "a\u0000b"}, "name"),
        ("/v1/knowledge", {"name": "n", "description": "\u0000"}, "description"),
    ):
        status, body, _ = await service.post(path, payload)
        assert status == 400 and body["error"]["param"] == field, (path, body)
    status, body, _ = await service.post("/v1/knowledge", {"name": "n"})
    assert status == 200, body
    status, body, _ = await service.post(f"/v1/knowledge/{body['id']}/files", {"file_id": "\u0000"})
    assert status == 400 and body["error"]["param"] == "file_id", body
    # A chat message may hold one: it is recorded in the log's JSON, not a column.
    status, body, _ = await service.post("/v1/chat/completions", {"model": "gpt-test", "messages": [{"role": "user", "content": "a\u0000b"}]})
    assert status == 200, body


async def test_json_no_store_can_hold_is_a_400(service: Service) -> None:
    """Found by the fuzzing: a lone surrogate was a 500 (no UTF-8 encoder
    takes it), and an integer past 64 bits a turn whose hash chain failed its
    own check (the store read it back as a float). Bodies are strict JSON
    now; ``stop_service`` verifies the turns."""
    head = '{"model": "gpt-test", "messages": [{"role": "user", "content": '
    for raw in (head + '"a\\udaf5b"}]}', head + '"x"}], "temperature": NaN}', head + '"x"}], "temperature": 1e400}'):
        async with service.http.post(service.v1 + "/chat/completions", data=raw, headers={"Content-Type": "application/json"}) as resp:
            body = await resp.json()
            assert resp.status == 400 and body["error"]["code"] == "invalid_json", (raw, body)
    async with service.http.post(service.v1 + "/memories", data='{"content": "\\ud800"}', headers={"Content-Type": "application/json"}) as resp:
        assert resp.status == 400, await resp.text()
    raw = head + '"x"}], "params": {"n": 123456789012345678901234567890}}'
    async with service.http.post(service.v1 + "/chat/completions", data=raw, headers={"Content-Type": "application/json"}) as resp:
        assert resp.status == 200, await resp.text()
        turn_id = resp.headers["X-Turn-Id"]
    status, verdict = await service.get(f"/v1/turns/{turn_id}/verify")
    assert status == 200 and verdict["ok"], verdict
    # Recorded exactly as sent (an integer, not a float), and read back so.
    async with service.http.get(service.v1 + f"/turns/{turn_id}/events") as resp:
        assert "123456789012345678901234567890" in await resp.text()
