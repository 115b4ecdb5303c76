"""Open WebUI as a peer (``python -m bench --openwebui VENV``): the same streams of
the bench upstream through Open WebUI, measured beside turnlog in the same run.

``VENV`` is a virtualenv with the ``open-webui`` package (see ``bench/README.md``).
Open WebUI runs as ``VENV/bin/open-webui serve`` on loopback with a temp
``DATA_DIR``, the bench upstream as its only (OpenAI) connection, offline, no
embedding model loaded, no background tasks (title, tags, follow-ups,
autocomplete). Its client is ``bench/owui_client.py``, run by ``VENV``'s python
(it needs ``aiohttp``); turnlog and the floor are read by the same client in the
same run, interleaved, so both sides of each ratio are measured by the same code.

Two Open WebUI paths:

* plain API: ``POST /api/chat/completions`` with the bearer token and no
  ``chat_id``: Open WebUI proxies the upstream's OpenAI-format SSE;
* full path (what its browser does): a socket.io connection joined with the
  token (``user-join``), a chat made with ``POST /api/v1/chats/new``, then
  ``POST /api/chat/completions`` with ``chat_id``, ``id``, ``session_id``; the
  deltas arrive as socket.io ``events`` and the turn ends with the
  ``chat:completion`` event holding ``done: true``.

Open WebUI forwards unknown top-level body fields upstream, so the bench
steering fields (``bench_chunks``, ``bench_rate``, ``bench_stamp``,
``bench_tool_rounds``) work as for turnlog; a probe checks it at the start.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.client import percentiles
from bench.procs import ROOT, BenchError, free_port, http_json

if TYPE_CHECKING:
    from bench.scenarios import Ctx

CLIENT = ROOT / "bench" / "owui_client.py"
ADMIN = {"name": "bench", "email": "bench@example.com", "password": "bench-password-1"}
TOOL_ID = "bench_tools"
MODEL = "bench"


def owui_env(data_dir: Path, upstream_v1: str) -> dict[str, str]:
    """Open WebUI's environment: loopback, temp data, the bench upstream, offline,
    nothing that would load a model or start work besides the turn itself."""
    return {
        "PYTHONPATH": "",  # not the repository's packages
        "DATA_DIR": str(data_dir),
        "STATIC_DIR": str(data_dir / "static"),  # it copies its static files there at start
        "DATABASE_URL": f"sqlite:///{data_dir}/webui.db",
        "REDIS_URL": "",
        "NO_PROXY": "127.0.0.1,localhost",  # the upstream is on loopback, whatever proxy the caller has
        "no_proxy": "127.0.0.1,localhost",
        "WEBSOCKET_MANAGER": "",
        "ENABLE_WEBSOCKET_SUPPORT": "true",
        "UVICORN_WORKERS": "1",
        "WEBUI_SECRET_KEY": "turnlog-bench-fixed-secret-0123456789abcdef",  # >= 32 bytes (HS256)
        "WEBUI_AUTH": "true",
        "ENABLE_SIGNUP": "true",
        "OPENAI_API_BASE_URL": upstream_v1,
        "OPENAI_API_BASE_URLS": upstream_v1,
        "OPENAI_API_KEY": "x",
        "OPENAI_API_KEYS": "x",
        "ENABLE_OPENAI_API": "true",
        "ENABLE_OLLAMA_API": "false",
        "ENABLE_BASE_MODELS_CACHE": "false",
        # offline: no Hugging Face downloads, no version check, no pip installs for tools
        "OFFLINE_MODE": "true",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "ENABLE_VERSION_UPDATE_CHECK": "false",
        "ANONYMIZED_TELEMETRY": "false",
        "DO_NOT_TRACK": "true",
        "SCARF_NO_ANALYTICS": "true",
        # RAG: an API embedding engine (never called) instead of loading sentence-transformers
        "RAG_EMBEDDING_ENGINE": "openai",
        "BYPASS_EMBEDDING_AND_RETRIEVAL": "true",
        "RAG_RERANKING_MODEL": "",
        "ENABLE_WEB_SEARCH": "false",
        # background tasks off: measure the turn only (the bench client asks for none anyway)
        "ENABLE_TITLE_GENERATION": "false",
        "ENABLE_TAGS_GENERATION": "false",
        "ENABLE_FOLLOW_UP_GENERATION": "false",
        "ENABLE_AUTOCOMPLETE_GENERATION": "false",
        "ENABLE_SEARCH_QUERY_GENERATION": "false",
        "ENABLE_RETRIEVAL_QUERY_GENERATION": "false",
        "ENABLE_MEMORY_BACKGROUND_REVIEW": "false",
        "ENABLE_IMAGE_GENERATION": "false",
        "ENABLE_CODE_INTERPRETER": "false",
        "ENABLE_OTEL": "false",
        "ENABLE_AUDIT_STDOUT": "false",
        "ENABLE_AUDIT_LOGS_FILE": "false",
    }


class OpenWebUI:
    """An Open WebUI process with its admin user and the bench tool."""

    def __init__(self, ctx: Ctx, venv: Path) -> None:
        self.ctx = ctx
        self.venv = venv
        self.python = str(venv / "bin" / "python")
        self.proc: subprocess.Popen[bytes] | None = None
        self.base = ""
        self.token = ""
        self.start_s = 0.0
        self.version = ""

    def start(self, timeout: float = 300.0) -> None:
        exe = self.venv / "bin" / "open-webui"
        data = self.ctx.workdir / "openwebui"
        data.mkdir(parents=True, exist_ok=True)
        port = free_port()
        self.base = f"http://127.0.0.1:{port}"
        t0 = time.monotonic()
        self.proc, _ = self.ctx.procs.spawn(
            "openwebui",
            [str(exe), "serve", "--host", "127.0.0.1", "--port", str(port)],
            env=owui_env(data, self.ctx.upstream_v1),
            stdout_pipe=False,
        )
        deadline = t0 + timeout
        while True:  # /ready: 200 once its startup (migrations, config, ...) is complete
            if self.proc.poll() is not None:
                raise BenchError(f"Open WebUI exited with {self.proc.returncode}\n{self.ctx.procs.log_tail('openwebui', 30)}")
            try:
                with urllib.request.urlopen(self.base + "/ready", timeout=2) as r:
                    if r.status == 200:
                        break
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                raise BenchError(f"Open WebUI not ready after {timeout:g}s\n{self.ctx.procs.log_tail('openwebui', 30)}")
            time.sleep(0.25)
        self.start_s = time.monotonic() - t0
        try:
            self.version = str(self.api("GET", "/api/version", auth=False).get("version", ""))
        except BenchError:
            self.version = ""

    def stop(self) -> None:
        if self.proc is not None:
            self.ctx.procs.stop(self.proc, timeout=15.0)
            self.proc = None

    def api(self, method: str, path: str, body: Any = None, *, auth: bool = True, timeout: float = 30.0) -> Any:
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if auth:
            headers["Authorization"] = f"Bearer {self.token}"
        req = urllib.request.Request(self.base + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return json.loads(r.read() or b"null")
        except urllib.error.HTTPError as exc:
            detail = exc.read()[:300].decode("utf-8", "replace")
            raise BenchError(f"Open WebUI {method} {path}: HTTP {exc.code}: {detail}") from None
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise BenchError(f"Open WebUI {method} {path}: {exc}") from None

    def setup(self, tools_module: str) -> None:
        """The first sign-up becomes the admin (its token drives everything); the
        model list is loaded (the upstream's ``/v1/models``); the bench tool is a
        Workspace tool (``class Tools`` with ``noop() -> "ok"``), like turnlog's."""
        self.token = self.api("POST", "/api/v1/auths/signup", ADMIN, auth=False)["token"]
        models = self.api("GET", "/api/models")
        ids = [m.get("id") for m in (models.get("data") or [])] if isinstance(models, dict) else []
        if MODEL not in ids:
            raise BenchError(f"Open WebUI does not list the bench upstream's model {MODEL!r}: {ids[:10]}")
        tool = {"id": TOOL_ID, "name": "bench tools", "content": tools_module, "meta": {"description": "benchmark tool: noop() returns ok at once"}}
        created = self.api("POST", "/api/v1/tools/create", tool)
        if not isinstance(created, dict) or created.get("id") != TOOL_ID:
            raise BenchError(f"Open WebUI did not create the bench tool: {str(created)[:300]}")


def run_owui_client(
    ctx: Ctx,
    python: str,
    spec: dict[str, Any],
    *,
    name: str,
    on_event: Callable[[dict[str, Any]], None] | None = None,
    grace: float = 30.0,
) -> dict[str, Any]:
    """``bench/owui_client.py`` under Open WebUI's python (``Procs.run_client``)."""
    return ctx.procs.run_client(spec, name=name, on_event=on_event, grace=grace, argv=[python, str(CLIENT)], env={"PYTHONPATH": ""})


def _meters(*meters: Any) -> Callable[[dict[str, Any]], None]:
    def on_event(ev: dict[str, Any]) -> None:
        for m in meters:
            try:
                m.on_event(ev)
            except (OSError, ValueError, IndexError):  # a process gone: no CPU figure
                pass

    return on_event


def _r(v: float | None, digits: int = 3) -> float | None:
    return None if v is None or v != v else round(v, digits)


# --------------------------------------------------------------------------- the scenario


def openwebui(ctx: Ctx) -> dict[str, Any]:
    """Open WebUI peer modes: long answer (full path and plain API), tool loop
    (full path, native function calling), concurrent paced turns (TTFC)."""
    venv_arg = ctx.cache.get("openwebui_venv")
    if not venv_arg:
        return {"status": "skipped", "reason": "needs --openwebui VENV (a virtualenv with the open-webui package)"}
    venv = Path(venv_arg).expanduser().resolve()
    for exe in ("python", "open-webui"):
        if not (venv / "bin" / exe).exists():
            raise BenchError(f"--openwebui {venv}: no bin/{exe} (pip install open-webui into that virtualenv)")

    from bench import scenarios as sc  # here, not at import: bench.scenarios imports this module

    owui = OpenWebUI(ctx, venv)
    figures: dict[str, Any] = {"venv": str(venv)}
    checks: list[dict[str, Any]] = []
    try:
        owui.start()
        owui.setup(sc.TOOLS_MODULE)
        figures["open_webui"] = {"version": owui.version, "start_s": round(owui.start_s, 1)}
        _probe(ctx, owui)
        parts: list[tuple[str, Callable[[], tuple[dict[str, Any], list[dict[str, Any]]]]]] = [
            ("long_answer", lambda: _long_answer(ctx, owui, sc)),
            ("tool_loop", lambda: _tool_loop(ctx, owui, sc)),
            ("concurrent_paced", lambda: _concurrent(ctx, owui, sc)),
        ]
        failed_checks = {
            "long_answer": [("full_path_chunks_per_s_ratio", ">=", 5.0), ("plain_api_chunks_per_s_ratio", ">=", 1.0)],
            "tool_loop": [("tool_loop_added_per_iteration_ratio", ">=", 2.0)],
            "concurrent_paced": [("concurrent_ttfc_p50_ratio", ">=", 5.0), ("turnlog_failed_turns", "<=", 0.0)],
        }
        for name, fn in parts:
            if owui.proc is None or owui.proc.poll() is not None:
                raise BenchError(f"Open WebUI is gone before {name}\n{ctx.procs.log_tail('openwebui', 30)}")
            try:
                figs, cks = fn()
            except BenchError as exc:  # one part failing must not hide the others' figures
                figs = {"error": str(exc)[:2000]}
                cks = [sc.check(m, None, op, target) for m, op, target in failed_checks[name]]
            figures[name] = figs
            checks.extend(cks)
    finally:
        owui.stop()
    return {"status": "ok", "checks": checks, "figures": figures}


def _probe(ctx: Ctx, owui: OpenWebUI) -> None:
    """Both paths, 7 chunks: checks that Open WebUI forwards the bench fields upstream
    (the counts would be the default 20 otherwise) and that the full path works."""
    n = 7
    spec = {
        "timeout_s": 60,
        "phases": [
            _plain(owui, "plain", {**_body(n)}),
            _full(owui, "full", {"bench_chunks": n}),
        ],
    }
    res = run_owui_client(ctx, owui.python, spec, name="c-owui-probe")
    by = {p["name"]: p["streams"][0] for p in res["phases"]}
    if res.get("error") or len(by) != 2:
        raise BenchError(f"Open WebUI probe failed: {res.get('error')}")
    for name, s in by.items():
        if s.get("error") or not s.get("done") or s.get("n") != n:
            raise BenchError(
                f"Open WebUI probe ({name} path): {s.get('n')} content chunks, expected {n} "
                f"(does it still forward the bench_* fields upstream?): {s.get('error')}"
            )


def _body(n: int, **kw: Any) -> dict[str, Any]:
    from bench import scenarios as sc

    return sc.body(n, **kw)


def _plain(owui: OpenWebUI, name: str, body: dict[str, Any], **kw: Any) -> dict[str, Any]:
    return {"name": name, "kind": "sse", "url": owui.base + "/api/chat/completions", "headers": {"Authorization": f"Bearer {owui.token}"}, "body": body, **kw}


def _full(owui: OpenWebUI, name: str, fields: dict[str, Any], **kw: Any) -> dict[str, Any]:
    return {"name": name, "kind": "owui", "base": owui.base, "token": owui.token, "model": MODEL, "body": fields, **kw}


def _full_fields(b: dict[str, Any]) -> dict[str, Any]:
    """The bench steering fields of an API body, for the full path's request."""
    return {k: v for k, v in b.items() if k.startswith("bench_")}


# --------------------------------------------------------------------------- long answer


def _long_answer(ctx: Ctx, owui: OpenWebUI, sc: Any) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """One long answer (20,000 chunks; quick 5,000), fast upstream, through the floor,
    turnlog, Open WebUI's plain API and its full path, interleaved; client chunks/s
    between the first and the last content chunk, medians."""
    n = 5_000 if ctx.quick else 20_000
    runs = 1 if ctx.quick else 3
    b = sc.body(n)
    phases: list[dict[str, Any]] = [
        sc.phase("_warmup", ctx.floor_v1, sc.body(2000)),
        sc.phase("_warmup", ctx.turnlog_v1, sc.body(2000)),
        _plain(owui, "_warmup", sc.body(2000)),
        _full(owui, "_warmup", {"bench_chunks": 2000}),
    ]
    for i in range(runs):
        phases.append(sc.phase(f"floor{i}", ctx.floor_v1, b))
        phases.append(sc.phase(f"turnlog{i}", ctx.turnlog_v1, b, announce=True))
        phases.append(_plain(owui, f"plain{i}", b, announce=True))
        phases.append(_full(owui, f"full{i}", _full_fields(b), announce=True))
    assert owui.proc is not None
    m_owui, m_turn = sc.CpuMeter(owui.proc.pid), sc.CpuMeter(ctx.turnlog_pid)
    res = run_owui_client(ctx, owui.python, {"phases": phases, "timeout_s": 600}, name="c-owui-long", on_event=_meters(m_owui, m_turn))
    if res.get("error"):
        raise BenchError(f"long answer: {res['error']}")
    by = {p["name"]: p["streams"][0] for p in res["phases"]}
    bad = {k: sc.failures([v], n) for k, v in by.items()}
    bad = {k: v for k, v in bad.items() if v}
    who = ("floor", "turnlog", "plain", "full")
    rate = {w: [sc.stream_rate(by[f"{w}{i}"]) if f"{w}{i}" not in bad else None for i in range(runs)] for w in who}
    for w in ("floor", "turnlog"):
        if any(f"{w}{i}" in bad for i in range(runs)):
            raise BenchError(f"long answer: {w} streams failed: {bad}")
    t, full, plain = sc.med(rate["turnlog"]), sc.med(rate["full"]), sc.med(rate["plain"])
    full_ratio = t / full if t and full else None
    plain_ratio = t / plain if t and plain else None
    cpu = {
        "turnlog": [m_turn.spent.get(f"turnlog{i}", float("nan")) / n * 1e6 for i in range(runs)],
        "plain": [m_owui.spent.get(f"plain{i}", float("nan")) / n * 1e6 for i in range(runs)],
        "full": [m_owui.spent.get(f"full{i}", float("nan")) / n * 1e6 for i in range(runs)],
    }
    floor = sc.med(rate["floor"])
    figs: dict[str, Any] = {
        "chunks": n,
        "runs": runs,
        "chunks_per_s": {w: sc.spread(rate[w], digits=0) for w in who},
        "turnlog_over_full_path": _r(full_ratio, 3),
        "turnlog_over_plain_api": _r(plain_ratio, 3),
        "turnlog_over_full_path_per_run": [_r(a / b_, 3) if a and b_ else None for a, b_ in zip(rate["turnlog"], rate["full"])],
        "turnlog_over_plain_api_per_run": [_r(a / b_, 3) if a and b_ else None for a, b_ in zip(rate["turnlog"], rate["plain"])],
        "over_floor": {w: _r(sc.med(rate[w]) / floor, 4) if floor and sc.med(rate[w]) else None for w in who[1:]},
        "ttfc_ms": {w: sc.spread([by[f"{w}{i}"].get("ttfc") for i in range(runs)], 1000) for w in who},
        "total_s": {w: sc.spread([by[f"{w}{i}"].get("total") for i in range(runs)]) for w in who},
        "cpu_us_per_chunk": {w: sc.spread([c for c in v if c == c], digits=2) for w, v in cpu.items()},
        "full_path_events_per_turn": sc.spread([by[f"full{i}"].get("events") for i in range(runs)], digits=0),
        "open_webui_failed": {k: v for k, v in bad.items()},
        "note": "chunks/s = (content chunks - 1) / (last - first content chunk) at the client; plain = Open WebUI "
        "POST /api/chat/completions SSE (bearer token, no chat_id); full = socket.io path (deltas as "
        "response.output_text.delta events, end = chat:completion done); cpu = server process CPU "
        "(Open WebUI for plain/full) per chunk",
    }
    checks = [
        sc.check("full_path_chunks_per_s_ratio", full_ratio, ">=", 5.0),
        sc.check("plain_api_chunks_per_s_ratio", plain_ratio, ">=", 1.0),
    ]
    return figs, checks


# --------------------------------------------------------------------------- tool loop


def _tool_loop(ctx: Ctx, owui: OpenWebUI, sc: Any) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """10-iteration tool loop with an instant tool (the upstream's ``bench_tool_rounds``
    mode: a call of ``noop`` with ``{}``), through turnlog (``TURNLOG_TOOLS_DIR``,
    like scenario 10) and Open WebUI's full path (Workspace tool ``bench_tools``,
    ``tool_ids``, ``params.function_calling = "native"``: Open WebUI runs the tool
    and calls the upstream again). Added time per iteration = (turn time - the
    floor relay's time for the loop's 11 upstream calls) / 10, for each."""
    rounds_n, answer = 10, 5
    runs, rounds = (3, 1) if ctx.quick else (5, 2)
    per_k = 3
    tools_dir = ctx.workdir / "bench-tools-owui"
    tools_dir.mkdir(exist_ok=True)
    (tools_dir / "bench_tools.py").write_text(sc.TOOLS_MODULE)
    proc, v1 = ctx.procs.start_turnlog(
        "turnlog-tools-owui",
        ctx.upstream_v1,
        ctx.workdir / "turnlog-tools-owui.db",
        extra_env={"TURNLOG_TOOLS_DIR": str(tools_dir)},
    )
    try:
        turn_body = {**sc.body(answer), "bench_tool_rounds": rounds_n, "tool_ids": [TOOL_ID]}
        owui_fields = {"bench_chunks": answer, "bench_tool_rounds": rounds_n, "tool_ids": [TOOL_ID], "params": {"function_calling": "native"}}

        def floor_body(k: int) -> dict[str, Any]:
            return {**sc.body(answer), "bench_tool_rounds": rounds_n, "messages": sc._tool_history(k), "tools": [sc.NOOP_SPEC]}

        phases = [
            sc.phase("_warmup", ctx.floor_v1, floor_body(0), requests=2),
            sc.phase("_warmup", ctx.floor_v1, floor_body(rounds_n), requests=1),
            sc.phase("_warmup", v1, turn_body, requests=2),
            _full(owui, "_warmup", owui_fields, requests=2),
        ]
        for i in range(rounds):
            for k in range(rounds_n + 1):
                phases.append(sc.phase(f"floor{i}_k{k}", ctx.floor_v1, floor_body(k), requests=per_k))
            phases.append(sc.phase(f"turnlog{i}", v1, turn_body, requests=runs))
            phases.append(_full(owui, f"owui{i}", owui_fields, requests=runs, announce=True))
        stats0 = http_json("GET", ctx.up_root + "/bench/stats")
        assert owui.proc is not None
        m_owui = sc.CpuMeter(owui.proc.pid)
        res = run_owui_client(ctx, owui.python, {"phases": phases, "timeout_s": 300}, name="c-owui-tools", on_event=_meters(m_owui))
        stats1 = http_json("GET", ctx.up_root + "/bench/stats")
    finally:
        ctx.procs.stop(proc)
    if res.get("error"):
        raise BenchError(f"tool loop: {res['error']}")
    by = {p["name"]: p["streams"] for p in res["phases"]}
    bad: list[str] = []
    for name, streams in by.items():
        if name.startswith("floor"):
            bad += sc.failures(streams, answer if name.endswith(f"_k{rounds_n}") else 0)
        elif name.startswith("turnlog"):
            bad += sc.failures(streams, answer)
    if bad:
        raise BenchError(f"tool loop: floor/turnlog streams failed: {bad[:3]}")
    owui_streams = [r for i in range(rounds) for r in by[f"owui{i}"]]
    owui_bad = sc.failures(owui_streams, answer) + [
        f"{r.get('tool_calls')} tool calls, expected {rounds_n}" for r in owui_streams if r.get("tool_calls") != rounds_n
    ]
    # Upstream tool-call answers: the floor's (k < 10), turnlog's and Open WebUI's turns (warm-ups included).
    turns = 2 + rounds * runs
    expected = 2 + rounds * rounds_n * per_k + 2 * turns * rounds_n
    got = stats1.get("tool_calls", 0) - stats0.get("tool_calls", 0)

    def floor_sum_ms(i: int) -> float:
        return sum(statistics.median(r["total"] for r in by[f"floor{i}_k{k}"]) for k in range(rounds_n + 1)) * 1000

    floor_ms = [floor_sum_ms(i) for i in range(rounds)]
    turn_ms = [r["total"] * 1000 for i in range(rounds) for r in by[f"turnlog{i}"]]
    owui_ms = [r["total"] * 1000 for r in owui_streams if not sc.failures([r], answer)]
    t_added = (sc.med(turn_ms) - sc.med(floor_ms)) / rounds_n
    o_added = (sc.med(owui_ms) - sc.med(floor_ms)) / rounds_n if owui_ms else None
    # turnlog's added time can be ~0 (or below, by noise): divide by at least 0.1 ms
    ratio = o_added / max(t_added, 0.1) if o_added is not None and got == expected else None
    cpu_ms = [m_owui.spent.get(f"owui{i}", float("nan")) / runs * 1000 for i in range(rounds)]
    figs = {
        "iterations": rounds_n,
        "turns_each": rounds * runs,
        "floor_upstream_work_ms": sc.spread(floor_ms, digits=2),
        "turnlog_turn_ms": sc.spread(turn_ms, digits=2),
        "open_webui_turn_ms": sc.spread(owui_ms, digits=2),
        "turnlog_added_ms_per_iteration": _r(t_added, 3),
        "open_webui_added_ms_per_iteration": _r(o_added, 3),
        "ratio": _r(ratio, 3),
        "turnlog_added_clamped": t_added < 0.1,
        "open_webui_ttfc_ms": sc.spread([r.get("ttfc") for r in owui_streams], 1000, 2),
        "open_webui_post_ms": sc.spread([r.get("post_ms") for r in owui_streams], digits=2),
        "open_webui_cpu_ms_per_turn": sc.spread([c for c in cpu_ms if c == c], digits=2),
        "open_webui_tool_calls_per_turn": sorted({r.get("tool_calls") for r in owui_streams}, key=str),
        "open_webui_failed": len(owui_bad),
        "open_webui_failures_sample": owui_bad[:3],
        "upstream_tool_calls": got,
        "upstream_tool_calls_expected": expected,
        "note": "turn = request sent -> end ([DONE] for turnlog; the chat:completion done event for Open WebUI's "
        "full path), 10 tool calls (instant tool) + a 5-chunk answer; added = (turn - floor work) / 10; "
        "ratio = Open WebUI's added / turnlog's (turnlog's taken as >= 0.1 ms)",
    }
    if got != expected:
        figs["error"] = f"upstream answered {got} tool calls, expected {expected}: a loop did not run as planned"
    return figs, [sc.check("tool_loop_added_per_iteration_ratio", ratio, ">=", 2.0)]


# --------------------------------------------------------------------------- concurrent paced turns


def _concurrent(ctx: Ctx, owui: OpenWebUI, sc: Any) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Concurrent turns paced at 50 chunks/s (200 x 250 chunks; quick 50 x 100),
    random starts within the ramp: TTFC (request sent -> first content chunk),
    one-way chunk latency (stamps), failed turns; turnlog, then Open WebUI's full
    path, then its plain API (informational)."""
    if ctx.quick:
        turns, chunks, rate, ramp = 50, 100, 50.0, 0.5
    else:
        turns, chunks, rate, ramp = 200, 250, 50.0, 1.0
    b = sc.body(chunks, rate=rate, stamp=True)
    warm = sc.body(5, rate=200.0, stamp=True)
    timeout = 120 + 4 * chunks / rate
    kw = {"requests": turns, "concurrency": turns, "ramp_s": ramp, "stamps": True, "announce": True}
    plans = [
        ("turnlog", [sc.phase("_warmup", ctx.turnlog_v1, warm, requests=20, concurrency=20), sc.phase("turnlog", ctx.turnlog_v1, b, **kw)]),
        ("full", [_full(owui, "_warmup", _full_fields(warm), requests=20, concurrency=20), _full(owui, "full", _full_fields(b), **kw)]),
        ("plain", [_plain(owui, "_warmup", warm, requests=20, concurrency=20), _plain(owui, "plain", b, **kw)]),
    ]
    out: dict[str, dict[str, Any]] = {}
    cpu: dict[str, float] = {}
    assert owui.proc is not None
    for who, phases in plans:
        pid = ctx.turnlog_pid if who == "turnlog" else owui.proc.pid
        meter = sc.CpuMeter(pid)
        try:
            res = run_owui_client(ctx, owui.python, {"phases": phases, "timeout_s": timeout}, name=f"c-owui-paced-{who}", on_event=_meters(meter))
        finally:
            try:  # end whatever a timed-out phase left streaming upstream
                http_json("POST", ctx.up_root + "/bench/release", {})
            except (OSError, ValueError):
                pass
        out[who] = sc.last_phase(res)
        cpu[who] = meter.spent.get(who, float("nan"))
        time.sleep(1.0)

    def summary(who: str) -> dict[str, Any]:
        ph = out[who]
        streams = ph["streams"]
        failed = sc.failures(streams, chunks)
        ttfc = [r["ttfc"] for r in streams if r.get("ttfc") is not None]
        wall = ph["agg"].get("wall")
        s: dict[str, Any] = {
            "ttfc_s": {k: _r(v, 4) for k, v in percentiles(ttfc, (0.5, 0.9, 0.99)).items()},
            "latency_ms": {k: _r(v, 3) for k, v in (ph["agg"].get("latency_ms") or {}).items()},
            "failed": len(failed),
            "failures_sample": failed[:3],
            "wall_s": _r(wall, 2),
            "cpu_cores_busy": _r(cpu[who] / wall, 3) if wall else None,
        }
        if ph["agg"].get("client_error"):
            s["client_error"] = ph["agg"]["client_error"]
        if who == "full":
            s["post_ms"] = {k: _r(v, 2) for k, v in percentiles([r["post_ms"] for r in streams if r.get("post_ms") is not None], (0.5, 0.99)).items()}
        return s

    figs: dict[str, Any] = {"turns": turns, "chunks_per_turn": chunks, "rate_chunks_per_s": rate, "ramp_s": ramp}
    for who in out:
        figs[who] = summary(who)
    t50 = figs["turnlog"]["ttfc_s"].get("p50")
    f50 = figs["full"]["ttfc_s"].get("p50")
    p50 = figs["plain"]["ttfc_s"].get("p50")
    ratio = f50 / t50 if f50 and t50 else None
    figs["ttfc_p50_ratio_full_path"] = _r(ratio, 3)
    figs["ttfc_p50_ratio_plain_api"] = _r(p50 / t50, 3) if p50 and t50 else None
    figs["note"] = (
        "ttfc = request sent -> first content chunk (full path: the completion POST -> first "
        "response.output_text.delta event; its chats are made before the timed part), percentiles "
        "over the turns that got one (a failed turn is counted in failed, not in ttfc_s); "
        "latency = client arrival - upstream write time (stamp in the chunk); one socket.io "
        "connection (one user) carries every full-path turn; ratios = Open WebUI / turnlog"
    )
    return figs, [
        sc.check("concurrent_ttfc_p50_ratio", ratio, ">=", 5.0),
        sc.check("turnlog_failed_turns", float(figs["turnlog"]["failed"]), "<=", 0.0),
    ]
