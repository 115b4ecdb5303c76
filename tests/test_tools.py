"""Tests for engine.tools.calls (parsing, filtering, execution, results, citations) and
the tool-module loader (adapters.tools).

The table-driven parts run the vectors recorded from Open WebUI 0.12.4 (copied
into tests/vectors/). Entries that turnlog does not reproduce on purpose are
listed below with the reason, never skipped silently; where a vector records an
Open WebUI quirk that turnlog fixes (a direct tool's 2-item list read as
``(data, headers)``; unfiltered or invalid arguments replayed), the test asserts turnlog's fixed behaviour and that it
differs from the recording.
"""

from __future__ import annotations

import asyncio
import json
import textwrap
import threading
from pathlib import Path
from typing import Any

import pytest

from adapters.tools import load_tools_dir, merge_tools
from adapters.tools.loader import parse_docstring
from engine.json_types import JsonObject
from engine.ports import code_output
from engine.tools.calls import (
    CITATION_TOOL_NAMES,
    ArgumentError,
    HtmlResult,
    ToolContext,
    ToolResult,
    ToolSpec,
    citation_sources,
    execute_tool_call,
    filter_arguments,
    is_error_result,
    malformed_message,
    normalize_result,
    parse_arguments,
    timeout_result,
)
from tests.vectors_util import load_vectors

# --------------------------------------------------------------------------
# Vector loading
# --------------------------------------------------------------------------


def select(vectors: list[dict[str, Any]], excluded: dict[str, str]) -> list[Any]:
    """The vectors to parametrize with; every excluded name must exist (no stale list)."""
    names = {v["name"] for v in vectors}
    assert set(excluded) <= names, f"excluded vectors that do not exist: {set(excluded) - names}"
    return [pytest.param(v, id=v["name"]) for v in vectors if v["name"] not in excluded]


ARGUMENT_VECTORS = load_vectors("tool_argument_parsing.json")
FILTER_VECTORS = load_vectors("parameter_filtering.json")
RESULT_VECTORS = load_vectors("process_tool_result.json")
STATUS_VECTORS = load_vectors("tool_result_status.json")
CITATION_VECTORS = load_vectors("citation_extraction.json")


def vector(vectors: list[dict[str, Any]], name: str) -> dict[str, Any]:
    return next(v for v in vectors if v["name"] == name)


# --------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------


def make_ctx(**overrides: Any) -> ToolContext:
    values: dict[str, Any] = {"user": {"id": "u1"}, "messages": [], "files": [], "metadata": {}, "emit": None}
    values.update(overrides)
    return ToolContext(**values)


def spec_with(name: str, properties: list[str] | dict[str, Any] | None, *, kind: str = "builtin") -> ToolSpec:
    parameters: dict[str, Any] = {"type": "object"}
    if properties is not None:
        parameters["properties"] = {key: {"type": "string"} for key in properties} if isinstance(properties, list) else properties
    return ToolSpec(name=name, description=name, parameters=parameters, tool_id=f"builtin:{name}", kind=kind)  # type: ignore[arg-type]


class FunctionHandle:
    """A ToolHandle over a plain function; records the arguments it was called with."""

    def __init__(self, spec: ToolSpec, fn: Any) -> None:
        self.spec = spec
        self.fn = fn
        self.calls: list[dict[str, Any]] = []

    async def __call__(self, args: dict[str, Any], ctx: ToolContext) -> Any:
        self.calls.append(dict(args))
        result = self.fn(**args)
        if asyncio.iscoroutine(result):
            result = await result
        return result


async def add(a: int, b: int) -> int:  # module level: the TypeError names it "add()" as in the vectors
    return a + b


async def echo(**kwargs: Any) -> dict[str, Any]:
    return kwargs


async def boom(**kwargs: Any) -> Any:
    raise ValueError("kaboom")


# --------------------------------------------------------------------------
# tool_argument_parsing.json
# --------------------------------------------------------------------------

ARGUMENT_EXCLUDED = {
    # Tool approval (tool_approval_mode "ask" + a browser confirmation) is not modelled by turnlog.
    "approval_mode_ask_without_caller": "tool approval is not modelled",
    # The execute:tool browser round trip belongs to the direct-tool adapter; what engine.tools.calls
    # does for it (filtering, the result) is asserted in test_direct_tool_vector_engine_part.
    "direct_tool_roundtrip": "browser round trip is adapter work; see test_direct_tool_vector_engine_part",
}


#: Open WebUI records the unfiltered arguments (python_literal_dict) or leaves invalid
#: ones as they came (the rest); turnlog records what ran ("{}" when nothing could run).
Q22_DIFFERS = {"python_literal_dict", "garbage", "trailing_garbage", "json_array", "json_null", "json_string"}


@pytest.mark.parametrize("v", select(ARGUMENT_VECTORS, ARGUMENT_EXCLUDED))
async def test_argument_parsing_vectors(v: dict[str, Any]) -> None:
    name = v["input"]["tool"]
    props = v["input"]["tool_spec_properties"]
    expected = v["expected"]
    handles = {
        "echo": FunctionHandle(spec_with("echo", props if name == "echo" else ["q"]), echo),
        "boom": FunctionHandle(spec_with("boom", props if name == "boom" else ["x"]), boom),
    }

    execution = await execute_tool_call(name, v["input"]["arguments"], handles, make_ctx())

    # The recorded/replayed arguments are exactly what ran, always a JSON object.
    assert execution.arguments_json == json.dumps(expected["params_passed_to_tool"])
    assert isinstance(json.loads(execution.arguments_json), dict)
    if expected["arguments_after"] != execution.arguments_json:
        assert v["name"] in Q22_DIFFERS, "only the Q22 cases may differ from Open WebUI's arguments_after"

    raw = expected["raw_result"]
    if expected["tool_found"]:
        assert handles[name].calls == [expected["params_passed_to_tool"]]
        assert execution.arguments == expected["params_passed_to_tool"]
    else:
        assert all(not h.calls for h in handles.values())
    if raw is None:
        assert execution.result.text == malformed_message(name)
        assert execution.arguments is None
    elif isinstance(raw, str):
        assert execution.result.text == raw
    else:
        assert execution.result.text == normalize_result(raw, name).text
    failed = raw is None or (isinstance(raw, str) and raw.startswith("Error")) or (isinstance(raw, dict) and "error" in raw)
    assert execution.result.status == ("failed" if failed else "completed")
    assert (execution.error is not None) == failed


async def test_direct_tool_vector_engine_part() -> None:
    """direct_tool_roundtrip: the params are filtered by the spec and the browser's reply is the result."""
    v = vector(ARGUMENT_VECTORS, "direct_tool_roundtrip")
    handle = FunctionHandle(spec_with("dtool", ["q"], kind="direct"), lambda **kw: v["expected"]["result"])
    execution = await execute_tool_call("dtool", v["input"]["arguments"], {"dtool": handle}, make_ctx())
    assert handle.calls == [v["expected"]["event_sent_to_browser"][0]["data"]["params"]]
    assert json.loads(execution.result.text or "") == v["expected"]["result"]
    assert execution.result.status == "completed"


# --------------------------------------------------------------------------
# parameter_filtering.json
# --------------------------------------------------------------------------

FILTER_EXCLUDED: dict[str, str] = {}


@pytest.mark.parametrize("v", select(FILTER_VECTORS, FILTER_EXCLUDED))
async def test_parameter_filtering_vectors(v: dict[str, Any]) -> None:
    raw_spec = v["input"]["tool_spec"]
    spec = ToolSpec(
        name=raw_spec["name"],
        description=raw_spec.get("description", ""),
        parameters=raw_spec["parameters"],
        tool_id=f"builtin:{raw_spec['name']}",
        kind="builtin",
        filter_parameters=v["input"].get("tool_type") != "mcp",
    )
    handle = FunctionHandle(spec, add if spec.name == "add" else echo)
    expected = v["expected"]

    execution = await execute_tool_call(spec.name, v["input"]["arguments"], {spec.name: handle}, make_ctx())

    assert handle.calls == [expected["params_passed_to_tool"]]
    assert filter_arguments(spec, json.loads(v["input"]["arguments"])) == expected["params_passed_to_tool"]
    assert execution.arguments == expected["params_passed_to_tool"]
    # Open WebUI replays the unfiltered arguments; turnlog replays what ran.
    assert execution.arguments_json == json.dumps(expected["params_passed_to_tool"])
    assert execution.result.text == normalize_result(expected["raw_result"], spec.name).text


# --------------------------------------------------------------------------
# process_tool_result.json
# --------------------------------------------------------------------------

INLINE = {"Content-Disposition": "inline"}

#: Vectors whose input is a description of a Python object: the object built here.
RESULT_INPUTS: dict[str, Any] = {
    "html_response_inline_200": HtmlResult("<b>ui</b>", 200, INLINE),
    "html_response_inline_404": HtmlResult("<b>x</b>", 404, INLINE),
    "html_response_inline_503": HtmlResult("<b>x</b>", 503, INLINE),
    "html_response_not_inline": HtmlResult("<b>body</b>", 200, {}),
    "html_response_with_context_tuple": (HtmlResult("<b>ui</b>", 200, INLINE), "Chart of sales shown"),
    "external_tuple_inline_html": ("<div>x</div>", {"Content-Disposition": "inline", "Content-Type": "text/html"}),
    "external_tuple_inline_location": ({"ok": True}, {"content-disposition": "inline", "location": "https://ui/x"}),
    "external_tuple_plain": ({"temp": 20}, {"Content-Type": "application/json"}),
    "direct_list_of_two_is_data_headers": [{"v": 1}, {"X": "y"}],
}

#: Deliberate differences: vector name -> (reason, turnlog's expected fields).
RESULT_OVERRIDES: dict[str, tuple[str, dict[str, Any]]] = {
    "mcp_text_json_plus_image": (
        "Open WebUI uploads MCP images to its file store; turnlog keeps the data URL",
        {"files": [{"type": "image", "url": "data:image/png;base64,AAAA"}]},
    ),
    "direct_list_of_two_is_data_headers": (
        "Q8: a direct tool's genuine 2-item list stays a list",
        {"result_text": json.dumps({"results": [{"v": 1}, {"X": "y"}]}, indent=2)},
    ),
}


def test_result_inputs_cover_every_described_vector() -> None:
    described = {v["name"] for v in RESULT_VECTORS if isinstance(v["input"]["tool_result"], str) and "(" in v["input"]["tool_result"]}
    assert described <= set(RESULT_INPUTS)


@pytest.mark.parametrize("v", select(RESULT_VECTORS, {}))
def test_process_tool_result_vectors(v: dict[str, Any]) -> None:
    value = RESULT_INPUTS.get(v["name"], v["input"]["tool_result"])
    expected = dict(v["expected"])
    if v["name"] in RESULT_OVERRIDES:
        _reason, changes = RESULT_OVERRIDES[v["name"]]
        for key, new in changes.items():
            assert expected[key] != new, f"{v['name']}: override of {key} no longer differs from the recording"
        expected.update(changes)

    result = normalize_result(value, v["input"]["tool_name"], direct=v["input"]["direct"])

    assert result.text == expected["result_text"]
    assert result.files == expected["files"]
    assert result.embeds == expected["embeds"]
    assert result.images == [f["url"] for f in expected["files"] if f["type"] == "image" and f["url"].startswith("data:")]
    assert result.status == ("failed" if is_error_result(expected["result_text"]) else "completed")


def test_html_status_drives_failed() -> None:
    assert normalize_result(HtmlResult("<b>x</b>", 404, INLINE), "t").status == "failed"
    assert normalize_result(HtmlResult("<b>x</b>", 302, INLINE), "t").text == json.dumps(
        {"status": "error", "code": "ui_component", "message": "t: Unexpected status code 302 from embedded UI result."},
        indent=2,
    )


def test_duck_typed_html_response_with_bytes_body() -> None:
    class Starlettish:
        body = "<p>é</p>".encode()
        status_code = 200
        headers = {"content-disposition": "inline; filename=x.html"}

    result = normalize_result(Starlettish(), "ui")
    assert result.embeds == ["<p>é</p>"]
    assert json.loads(result.text or "")["code"] == "ui_component"


def test_response_envelope_for_json_only_tools() -> None:
    """A direct/client tool that means (body, headers) says so explicitly: a
    genuine 2-item list stays a list."""
    value = {"__turnlog_response__": {"body": "<i>hi</i>", "headers": {"Content-Disposition": "inline", "Content-Type": "text/html"}}}
    result = normalize_result(value, "d", direct=True)
    assert result.embeds == ["<i>hi</i>"]
    assert json.loads(result.text or "")["status"] == "success"
    plain = normalize_result({"__turnlog_response__": {"body": {"a": 1}, "headers": {}}}, "d", direct=True)
    assert plain.text == json.dumps({"a": 1}, indent=2) and plain.embeds == []


def test_nested_html_context_in_data_headers() -> None:
    value = (("<div/>", "a chart"), {"Content-Disposition": "inline", "Content-Type": "text/html"})
    result = normalize_result(value, "t")
    assert result.embeds == ["<div/>"] and result.text == "a chart"


def test_other_shapes() -> None:
    assert normalize_result((1, 2, 3), "t").text == json.dumps({"results": [1, 2, 3]}, indent=2)
    audio = normalize_result([{"type": "audio", "mimeType": "audio/wav", "data": "UklG"}], "t")
    assert audio.files == [{"type": "audio", "url": "data:audio/wav;base64,UklG"}] and audio.images == []
    # A list of dicts that merely has "type" keys is not MCP content.
    plain = normalize_result([{"type": "text", "body": "x"}], "t")
    assert json.loads(plain.text or "") == {"results": [{"type": "text", "body": "x"}]}
    assert normalize_result(b"raw", "t").text == "raw"


# --------------------------------------------------------------------------
# tool_result_status.json
# --------------------------------------------------------------------------


@pytest.mark.parametrize("v", select(STATUS_VECTORS, {}))
def test_tool_result_status_vectors(v: dict[str, Any]) -> None:
    assert is_error_result(v["input"]["content"]) is v["expected"]


@pytest.mark.parametrize(
    ("text", "failed"),
    [
        (None, False),
        ('{"ok": false, "message": "denied"}', True),
        ('{"ok": false, "message": "  "}', False),
        ('{"status": "ERROR"}', True),
        ('{"error": {"code": 1}}', True),
        ('{"error": []}', False),
        ('{"error": true}', False),
        ("[1, 2]", False),
    ],
)
def test_tool_result_status_more(text: str | None, failed: bool) -> None:
    assert is_error_result(text) is failed


# --------------------------------------------------------------------------
# citation_extraction.json
# --------------------------------------------------------------------------

CITATION_EXCLUDED = {
    # 0.12.4 has no search_web branch; turnlog keeps 0.8.12's (the issue wants search_web
    # citations), so this input gives the search_web source. The generic fallback it
    # records is asserted under another tool name in test_generic_citation_fallback.
    "generic_tool_fallback": "search_web is a citation tool in turnlog (0.8.12 branch)",
}


@pytest.mark.parametrize("v", select(CITATION_VECTORS, CITATION_EXCLUDED))
def test_citation_vectors(v: dict[str, Any]) -> None:
    i = v["input"]
    sources = citation_sources(i["tool_name"], i.get("tool_id"), i["tool_result"], params=i["tool_params"])
    assert sources == v["expected"]


def test_generic_citation_fallback() -> None:
    v = vector(CITATION_VECTORS, "generic_tool_fallback")
    i = v["input"]
    recorded = json.loads(json.dumps(v["expected"]).replace('"search_web"', '"my_search"').replace("builtin:search_web", "builtin:my_search"))
    assert citation_sources("my_search", "builtin:my_search", i["tool_result"], params=i["tool_params"]) == []
    got = citation_sources("my_search", "builtin:my_search", i["tool_result"], params=i["tool_params"], fallback=True)
    assert got == recorded
    # ...and search_web itself cites as 0.8.12 did.
    web = citation_sources("search_web", i["tool_id"], i["tool_result"], params=i["tool_params"])
    assert web == [
        {
            "source": {"name": "search_web", "id": "search_web"},
            "document": ["T\nS"],
            "metadata": [{"source": "https://l", "name": "T", "url": "https://l"}],
        }
    ]
    assert CITATION_TOOL_NAMES >= {"search_web", "fetch_url", "query_chat_files", "view_file"}


def test_citation_edge_cases() -> None:
    assert citation_sources("fetch_url", None, None, params={"url": "u"}) == []
    assert citation_sources("view_file", None, "not json") == []
    chat = citation_sources("query_chat_files", None, json.dumps([{"source": "a.txt", "file_id": "f", "content": "c"}]))
    assert chat[0]["source"] == {"id": "f", "name": "a.txt", "type": "file"} and chat[0]["distances"] == []
    broken = citation_sources("query_chat_files", None, "[1]")  # a chunk that is not an object
    assert broken == [{"source": {"name": "query_chat_files", "type": "tool"}, "document": ["[1]"], "metadata": [{"source": "query_chat_files"}]}]


# --------------------------------------------------------------------------
# engine.tools.calls units
# --------------------------------------------------------------------------


def test_parse_arguments_edges() -> None:
    assert parse_arguments(None, "t") == {}
    assert parse_arguments({"a": (1, 2)}, "t") == {"a": [1, 2]}
    assert parse_arguments("{'a': (1, 2)}", "t") == {"a": [1, 2]}
    for bad in ("{'a': {1, 2}}", '{"a": NaN}', "{'a': b'x'}", "[" * 5000):
        error = parse_arguments(bad, "t")
        assert isinstance(error, ArgumentError) and error.reason == "malformed", bad
    not_object = parse_arguments("[1]", "calc")
    assert isinstance(not_object, ArgumentError)
    assert not_object.message == "Error: Tool call arguments for `calc` must be a JSON object. Please try again."


def test_filter_arguments_without_properties() -> None:
    assert filter_arguments(spec_with("t", None), {"a": 1}) == {}
    assert filter_arguments(spec_with("t", ["a"]), {"a": 1, "b": 2}) == {"a": 1}


def test_openai_tool_and_timeout_result() -> None:
    spec = spec_with("t", ["q"])
    assert spec.openai_tool() == {
        "type": "function",
        "function": {"name": "t", "description": "t", "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}},
    }
    result = timeout_result("slow", 2.5)
    assert isinstance(result, ToolResult) and result.status == "failed"
    assert result.text == 'Error: Tool "slow" did not finish within 2.5 seconds and was cancelled.'
    assert is_error_result(result.text)


async def test_exception_without_message_names_its_type() -> None:
    async def raises(**kw: Any) -> Any:
        raise KeyError()

    handle = FunctionHandle(spec_with("k", []), raises)
    execution = await execute_tool_call("k", "{}", {"k": handle}, make_ctx())
    assert execution.result.text == json.dumps({"error": "KeyError"}, indent=2)
    assert execution.result.status == "failed" and execution.error == "KeyError"


async def test_cancellation_propagates() -> None:
    started = asyncio.Event()

    async def slow(**kw: Any) -> Any:
        started.set()
        await asyncio.sleep(60)

    handle = FunctionHandle(spec_with("slow", []), slow)
    task = asyncio.create_task(execute_tool_call("slow", "{}", {"slow": handle}, make_ctx()))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


# --------------------------------------------------------------------------
# The loader, on real tool modules
# --------------------------------------------------------------------------


def write(folder: Path, name: str, source: str) -> Path:
    path = folder / name
    path.write_text(textwrap.dedent(source), encoding="utf-8")
    return path


WEATHER = '''
    """A weather tool, the way Open WebUI tool modules are written."""
    from typing import Literal, Optional
    import threading


    class Tools:
        class Valves:  # a nested class is not a tool
            pass

        citation = True  # a public non-callable attribute is not a tool

        def __init__(self):
            self.valves = self.Valves()

        async def get_weather(
            self,
            city: str,
            days: int = 3,
            unit: Literal["c", "f"] = "c",
            hourly: bool = False,
            tags: list[str] | None = None,
            ratio: Optional[float] = None,
            extra: dict = None,
            __user__: dict = None,
            __event_emitter__=None,
        ) -> str:
            """
            Get the weather forecast
            for a city.

            More details the model does not need.

            :param city: The city name,
                e.g. Paris.
            :param days: How many days.
            :return: The forecast.
            """
            if __event_emitter__:
                await __event_emitter__({"type": "status", "data": {"description": "looking"}})
            return f"{city}:{days}:{unit}:{hourly}:{__user__['id']}"

        def thread_name(self, x: int) -> str:
            """Which thread ran me."""
            return f"{x}:{threading.current_thread().name}"

        def _helper(self):
            return "private"
'''


async def test_schema_from_hints_and_docstring(tmp_path: Path) -> None:
    write(tmp_path, "weather.py", WEATHER)
    modules, errors = load_tools_dir(tmp_path)
    assert errors == []
    tools = modules["weather"].tools
    assert sorted(tools) == ["get_weather", "thread_name"]
    spec = tools["get_weather"].spec
    assert spec.name == "get_weather" and spec.tool_id == "weather" and spec.kind == "server"
    assert spec.description == "Get the weather forecast for a city."
    assert spec.parameters == {
        "type": "object",
        "properties": {
            "city": {"type": "string", "description": "The city name, e.g. Paris."},
            "days": {"type": "integer", "description": "How many days.", "default": 3},
            "unit": {"type": "string", "enum": ["c", "f"], "default": "c"},
            "hourly": {"type": "boolean", "default": False},
            "tags": {"type": "array", "items": {"type": "string"}},
            "ratio": {"type": "number"},
            "extra": {"type": "object"},
        },
        "required": ["city"],
    }
    assert spec.function()["name"] == "get_weather"
    assert spec.idempotent is False and spec.timeout is None


async def test_reserved_params_hidden_and_injected(tmp_path: Path) -> None:
    write(
        tmp_path,
        "ctxtool.py",
        '''
        class Tools:
            async def show(self, q: str, __user__: dict, __messages__: list, __files__: list,
                           __metadata__: dict, __id__: str, __call_id__: str, __event_emitter__=None) -> dict:
                """Echo the injected context."""
                await __event_emitter__({"type": "status", "data": {"q": q}})
                return {"q": q, "user": __user__, "messages": __messages__, "files": __files__,
                        "metadata": __metadata__, "id": __id__, "call_id": __call_id__}
        ''',
    )
    modules, errors = load_tools_dir(tmp_path)
    assert errors == []
    handle = modules["ctxtool"].tools["show"]
    properties = handle.spec.parameters["properties"]
    assert isinstance(properties, dict) and list(properties) == ["q"]
    assert handle.spec.parameters["required"] == ["q"]
    emitted: list[dict[str, Any]] = []

    async def emit(event: dict[str, Any]) -> None:
        emitted.append(event)

    ctx = make_ctx(messages=[{"role": "user", "content": "hi"}], files=[{"id": "f1"}], metadata={"chat_id": "c1"}, emit=emit, call_id="call_1")
    # A model that tries to pass a reserved parameter itself gets it filtered out.
    execution = await execute_tool_call("show", '{"q": "x", "__user__": {"id": "evil"}}', {"show": handle}, ctx)
    assert execution.arguments == {"q": "x"}
    assert json.loads(execution.result.text or "") == {
        "q": "x",
        "user": {"id": "u1"},
        "messages": [{"role": "user", "content": "hi"}],
        "files": [{"id": "f1"}],
        "metadata": {"chat_id": "c1"},
        "id": "ctxtool",
        "call_id": "call_1",
    }
    assert emitted == [{"type": "status", "data": {"q": "x"}}]


async def test_sync_and_async_methods(tmp_path: Path) -> None:
    write(tmp_path, "weather.py", WEATHER)
    modules, _ = load_tools_dir(tmp_path)
    tools, _notes = merge_tools(modules)
    emitted: list[dict[str, Any]] = []

    async def emit(event: dict[str, Any]) -> None:
        emitted.append(event)

    ctx = make_ctx(emit=emit)
    weather = await execute_tool_call("get_weather", '{"city": "Paris"}', tools, ctx)
    assert weather.result.text == "Paris:3:c:False:u1" and weather.result.status == "completed"
    assert emitted and emitted[0]["type"] == "status"

    sync = await execute_tool_call("thread_name", '{"x": 7}', tools, ctx)
    number, thread = (sync.result.text or "").split(":", 1)
    assert number == "7" and thread != threading.current_thread().name  # ran in a worker thread


async def test_casts_str_to_int_and_number_to_str(tmp_path: Path) -> None:
    write(
        tmp_path,
        "calc.py",
        '''
        from typing import Optional

        class Tools:
            def kinds(self, n: int, s: str, m: Optional[int] = None, f: float = 0.0) -> str:
                """Report the Python types received."""
                return ",".join(type(v).__name__ for v in (n, s, m, f))
        ''',
    )
    modules, _ = load_tools_dir(tmp_path)
    handle = modules["calc"].tools["kinds"]
    execution = await execute_tool_call("kinds", {"n": "3", "s": 5, "m": "4", "f": 1.5}, {"kinds": handle}, make_ctx())
    assert execution.result.text == "int,str,int,float"
    bad = await execute_tool_call("kinds", {"n": "three", "s": "x"}, {"kinds": handle}, make_ctx())
    assert bad.result.status == "failed"
    assert json.loads(bad.result.text or "") == {"error": "invalid literal for int() with base 10: 'three'"}


async def test_raising_tool_and_missing_argument(tmp_path: Path) -> None:
    write(
        tmp_path,
        "bad.py",
        '''
        class Tools:
            async def explode(self, x: str = "") -> str:
                """Always fails."""
                raise RuntimeError("kaboom")

            def needs(self, a: int, b: int) -> int:
                """Adds."""
                return a + b
        ''',
    )
    modules, _ = load_tools_dir(tmp_path)
    tools, _ = merge_tools(modules)
    execution = await execute_tool_call("explode", "{}", tools, make_ctx())
    assert execution.result.text == '{\n  "error": "kaboom"\n}'
    assert execution.result.status == "failed" and execution.error == "kaboom"
    missing = await execute_tool_call("needs", '{"a": 1, "zzz": 2}', tools, make_ctx())
    assert missing.arguments_json == '{"a": 1}'
    assert "missing 1 required positional argument: 'b'" in (missing.result.text or "")
    assert missing.result.status == "failed"


def test_import_errors_are_reported_not_raised(tmp_path: Path) -> None:
    write(tmp_path, "good.py", "class Tools:\n    def ping(self) -> str:\n        'Ping.'\n        return 'pong'\n")
    write(tmp_path, "syntax.py", "class Tools:\n    def broken(self:\n")
    write(tmp_path, "missing_dep.py", "import turnlog_no_such_module\nclass Tools:\n    pass\n")
    write(tmp_path, "no_tools.py", "X = 1\n")
    write(tmp_path, "bad_init.py", "class Tools:\n    def __init__(self):\n        raise ValueError('no config')\n")
    write(tmp_path, "_private.py", "raise SystemExit('never imported')\n")
    modules, errors = load_tools_dir(tmp_path)
    assert list(modules) == ["good"]
    by_file = {Path(e.path).name: e.message for e in errors}
    assert set(by_file) == {"syntax.py", "missing_dep.py", "no_tools.py", "bad_init.py"}
    assert "SyntaxError" in by_file["syntax.py"] and "line 2" in by_file["syntax.py"]
    assert "turnlog_no_such_module" in by_file["missing_dep.py"]
    assert "no class Tools" in by_file["no_tools.py"]
    assert "no config" in by_file["bad_init.py"]
    _, missing = load_tools_dir(tmp_path / "nope")
    assert len(missing) == 1


def test_idempotent_and_timeout(tmp_path: Path) -> None:
    write(
        tmp_path,
        "all_idem.py",
        '''
        class Tools:
            idempotent = True
            timeout = 2.5

            def a(self) -> str:
                """A."""
                return "a"
        ''',
    )
    write(
        tmp_path,
        "decorated.py",
        '''
        from engine.tools.calls import idempotent, turnlog_idempotent

        def plain_marker(fn):
            fn.__turnlog_idempotent__ = True  # the contract, no turnlog import needed
            return fn

        class Tools:
            @idempotent
            async def read(self) -> str:
                """Read."""
                return "r"

            @turnlog_idempotent
            def read2(self) -> str:
                """Read too."""
                return "r"

            @plain_marker
            def read3(self) -> str:
                """Read three."""
                return "r"

            def write(self, x: str) -> str:
                """Write."""
                return x
        ''',
    )
    modules, errors = load_tools_dir(tmp_path)
    assert errors == []
    a = modules["all_idem"].tools["a"].spec
    assert a.idempotent is True and a.timeout == 2.5
    flags = {name: h.spec.idempotent for name, h in modules["decorated"].tools.items()}
    assert flags == {"read": True, "read2": True, "read3": True, "write": False}
    assert modules["decorated"].tools["write"].spec.timeout is None


def test_future_annotations_and_collisions(tmp_path: Path) -> None:
    write(
        tmp_path,
        "a_first.py",
        '''
        from __future__ import annotations

        class Tools:
            def ping(self, n: int | None = None, xs: list[int] = []) -> str:
                """Ping."""
                return "a"
        ''',
    )
    write(tmp_path, "b_second.py", "class Tools:\n    def ping(self) -> str:\n        'Ping B.'\n        return 'b'\n")
    modules, errors = load_tools_dir(tmp_path)
    assert errors == []
    assert modules["a_first"].tools["ping"].spec.parameters == {
        "type": "object",
        "properties": {"n": {"type": "integer"}, "xs": {"type": "array", "items": {"type": "integer"}, "default": []}},
    }
    merged, notes = merge_tools(modules)
    assert sorted(merged) == ["b_second_ping", "ping"]
    assert merged["b_second_ping"].spec.name == "b_second_ping" and merged["ping"].spec.tool_id == "a_first"
    assert len(notes) == 1


def test_parse_docstring() -> None:
    description, params = parse_docstring(
        """Summary line
        continues here.

        :param str q: the query
        :param limit: how many
            results at most
        :type limit: int
        :returns: stuff
        """
    )
    assert description == "Summary line continues here."
    assert params == {"q": "the query", "limit": "how many results at most"}
    assert parse_docstring(None) == ("", {})


async def test_unprintable_result_becomes_an_error() -> None:
    class Unprintable:
        def __str__(self) -> str:
            raise RuntimeError("no repr")

    handle = FunctionHandle(spec_with("u", []), lambda: Unprintable())
    execution = await execute_tool_call("u", "", {"u": handle}, make_ctx())
    assert execution.result.status == "failed" and execution.error == "no repr"


def test_a_code_executors_streams_must_be_texts() -> None:
    """An executor's answer is read as texts (``stdout``, ``stderr``); one that
    is not fails the run instead of reaching the log as another shape."""
    answer: JsonObject = {"stdout": "4\n", "result": 4, "files": []}
    assert code_output(answer) == answer
    assert code_output({}) == {}
    bads: list[JsonObject] = [{"stdout": 4}, {"stderr": None}, {"stdout": "", "stderr": ["x"]}]
    for bad in bads:
        with pytest.raises(TypeError):
            code_output(bad)
