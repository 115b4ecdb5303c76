"""``GET /openapi.json``: a valid OpenAPI 3.1 document of every route the app has."""

from __future__ import annotations

from pathlib import Path

from openapi_spec_validator import validate

from adapters.http.openapi import OPERATIONS, routes, undocumented
from tests.harness import Service, make_settings, start_service, stop_service
from tests.upstream import ScriptedUpstream


async def test_document_is_valid_and_covers_every_route(tmp_path: Path, upstream: ScriptedUpstream) -> None:
    svc = await start_service(make_settings(tmp_path, upstream.url, auth="on"), upstream)
    try:
        await _check_document(svc)
    finally:
        await stop_service(svc)


async def _check_document(svc: Service) -> None:
    app = svc.runner.app
    # No key needed for the document itself, even with auth on.
    status, doc = await svc.get("/openapi.json")
    assert status == 200, doc
    validate(doc)  # OpenAPI 3.1, by openapi-spec-validator
    assert doc["openapi"].startswith("3.1")

    # Every route the router has is an operation with its words, and the
    # table names no route that does not exist.
    assert undocumented(app) == [], "routes without an entry in adapters.http.openapi.OPERATIONS"
    registered = routes(app)
    assert sorted(OPERATIONS) == sorted(registered), "OPERATIONS names routes the app does not register"
    listed = {(method.upper(), path) for path, ops in doc["paths"].items() for method in ops}
    assert listed == set(registered)
    assert not any(op.get("x-undocumented") for ops in doc["paths"].values() for op in ops.values())

    # The bodies come from the models that validate them.
    chat = doc["paths"]["/v1/chat/completions"]["post"]
    body_ref = chat["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    request_schema = doc["components"]["schemas"][body_ref.rsplit("/", 1)[1]]
    assert {"model", "messages", "stream", "chat_id", "features", "tool_ids"} <= set(request_schema["properties"])
    assert set(request_schema["required"]) == {"model", "messages"}
    # Streaming answers are SSE; the JSON ones are models.
    assert set(chat["responses"]["200"]["content"]) == {"application/json", "text/event-stream"}
    stream = doc["paths"]["/v1/turns/{turn_id}/stream"]["get"]
    assert list(stream["responses"]["200"]["content"]) == ["text/event-stream"]
    assert {p["name"] for p in stream["parameters"]} == {"turn_id", "after", "include_usage", "Last-Event-ID"}

    # Errors in the OpenAI shape; bearer auth on everything but the open paths.
    error = doc["components"]["schemas"]["ErrorDetail"]
    assert {"message", "type"} <= set(error["required"])
    assert doc["components"]["securitySchemes"]["bearerAuth"] == {**doc["components"]["securitySchemes"]["bearerAuth"], "type": "http", "scheme": "bearer"}
    assert doc["security"] == [{"bearerAuth": []}]
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            public = op.get("security") == []
            assert public == (path in ("/healthz", "/openapi.json") or path.startswith("/ui")), (method, path)
            if not public:
                assert op["responses"]["401"] == {"$ref": "#/components/responses/Error401"}, (method, path)
            # Every documented error status answers the OpenAI error shape.
            for code, response in op["responses"].items():
                if code.startswith(("4", "5")):
                    ref = response.get("$ref") or response["content"]["application/json"]["schema"]["$ref"]
                    assert ref.endswith(("/Error" + code, "/ErrorResponse")), (method, path, code)
    # Each path parameter of the router is declared.
    turn = doc["paths"]["/v1/turns/{turn_id}"]["get"]
    assert turn["parameters"][0] == {**turn["parameters"][0], "name": "turn_id", "in": "path", "required": True}
