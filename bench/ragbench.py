"""Scenarios ``rag_ttfc`` and ``rag_tool_loop``: a turn's context assembly with
memories and an attached file (hybrid retrieval), against the bench upstream.

One turnlog of their own (``turnlog-rag``, started once, shared by both):
``TURNLOG_EMBEDDING_ENGINE=openai`` with the bench upstream as the embedding
server (its ``/v1/embeddings``: hashed bag-of-words vectors), the turn's model
as the task model (the bench upstream answers ``### Task:`` prompts with
``{"queries": [the user's question]}``) and ``TURNLOG_TOOLS_DIR`` = a folder
holding ``bench_rag_tools.py`` (``add(a, b)``). Set-up, before any timing:
three memories (``POST /v1/memories``) and one ~4,000-word Markdown file
(``POST /v1/files``, multipart) polled until ``ready``.

``rag_ttfc``: time to the first content chunk of a turn with
``features.memory``, ``params.function_calling: "default"`` and the file, minus
that of a plain turn (same question, same 5-chunk answer), minus the upstream's
own time for the calls the retrieval makes (the memory query's embedding, the
task model's search queries, the queries' embedding). That upstream time is a
floor measured in the same run: the very bodies turnlog sent (recorded by the
bench upstream during a warm-up turn) sent straight to the bench upstream by
the same client, one call after the other, median per call, summed.

``rag_tool_loop``: a 3-round native tool loop (``bench_tool_rounds: 3`` of
``add``) with the file attached and without; the bench upstream records the
size of each of the 4 request bodies. The sources block must be carried once
per request: ``with[k] / (without[k] + sources)`` ≤ 1.10 for every request k,
where ``sources = with[0] - without[0]``.
"""

from __future__ import annotations

import json
import random
import statistics
import time
import urllib.request
import uuid
from typing import TYPE_CHECKING, Any

from bench.procs import BenchError, http_json

if TYPE_CHECKING:
    from bench.scenarios import Ctx

TOOLS_MODULE = '''"""A benchmark tool module (written by bench.ragbench)."""


class Tools:
    def add(self, a: int, b: int) -> str:
        """Adds two numbers.

        :param a: the first number
        :param b: the second number
        """
        return str(a + b)
'''

QUESTION = "How long should the sourdough proof in the fridge before baking?"
MEMORIES = [
    "I bake sourdough bread every weekend in a small electric oven.",
    "My kitchen is cold in winter, about 17 degrees.",
    "I prefer answers in metric units and grams.",
]
EMBEDDING_MODEL = "bench-embed"
_VOCAB = (
    "flour water salt starter levain dough crumb crust oven steam proof fridge hours minutes temperature "
    "hydration gluten knead fold shape bake loaf banneton scoring rise ferment yeast wheat rye spelt bowl "
    "kitchen scale gram percent recipe morning evening overnight warm cold stretch rest bench tension"
).split()


def document(words: int = 4000, seed: int = 11) -> str:
    """A deterministic Markdown guide of about ``words`` words: sections of
    sentences drawn from a baking vocabulary, one of them answering ``QUESTION``."""
    rnd = random.Random(seed)
    out = ["# The bench sourdough guide", ""]
    n = 0
    section = 0
    while n < words:
        section += 1
        out += [f"## Part {section}", ""]
        for _ in range(6):
            sentence = [rnd.choice(_VOCAB) for _ in range(rnd.randint(8, 16))]
            sentence[0] = sentence[0].capitalize()
            para = " ".join(sentence) + "."
            if section == 4:
                para += " Proof the shaped sourdough in the fridge for 12 hours before baking."
            out += [para, ""]
            n += len(para.split())
    return "\n".join(out)


def _multipart(field: str, filename: str, content_type: str, data: bytes) -> tuple[bytes, str]:
    boundary = "bench" + uuid.uuid4().hex
    head = (f'--{boundary}\r\nContent-Disposition: form-data; name="{field}"; filename="{filename}"\r\nContent-Type: {content_type}\r\n\r\n').encode()
    return head + data + f"\r\n--{boundary}--\r\n".encode(), f"multipart/form-data; boundary={boundary}"


def upload(v1: str, filename: str, text: str, timeout: float = 60.0) -> dict[str, Any]:
    """``POST /v1/files`` (multipart), then poll ``GET /v1/files/{id}`` until it is
    no longer ``processing``; a file that is not ``ready`` is a ``BenchError``."""
    payload, ctype = _multipart("file", filename, "text/markdown", text.encode())
    req = urllib.request.Request(v1 + "/files", data=payload, method="POST", headers={"Content-Type": ctype})
    with urllib.request.urlopen(req, timeout=30) as r:
        info = json.loads(r.read())
    deadline = time.monotonic() + timeout
    while info.get("status") == "processing":
        if time.monotonic() > deadline:
            raise BenchError(f"file {info.get('id')} still processing after {timeout:g}s")
        time.sleep(0.05)
        info = http_json("GET", f"{v1}/files/{info['id']}")
    if info.get("status") != "ready":
        raise BenchError(f"file upload failed: {info}")
    return dict(info)


def rag_turnlog(ctx: Ctx) -> dict[str, Any]:
    """The scenarios' turnlog (embeddings from the bench upstream, the tools
    folder), with the memories and the file: started once, reused by both."""
    state: dict[str, Any] | None = ctx.cache.get("rag")
    if state is not None and state["proc"].poll() is None:
        return state
    tools_dir = ctx.workdir / "bench-rag-tools"
    tools_dir.mkdir(exist_ok=True)
    (tools_dir / "bench_rag_tools.py").write_text(TOOLS_MODULE)
    db = ctx.workdir / "turnlog-rag.db"
    db.unlink(missing_ok=True)
    proc, v1 = ctx.procs.start_turnlog(
        "turnlog-rag",
        ctx.upstream_v1,
        db,
        extra_env={
            "TURNLOG_EMBEDDING_ENGINE": "openai",
            "TURNLOG_EMBEDDING_MODEL": EMBEDDING_MODEL,
            "TURNLOG_TOOLS_DIR": str(tools_dir),
        },
    )
    for text in MEMORIES:
        http_json("POST", v1 + "/memories", {"content": text})
    doc = document()
    t0 = time.monotonic()
    info = upload(v1, "sourdough-guide.md", doc)
    state = {
        "proc": proc,
        "v1": v1,
        "file_id": info["id"],
        "file": {
            "bytes": info.get("bytes"),
            "chunks": info.get("chunks"),
            "tokens": info.get("tokens"),
            "embedding_model": info.get("embedding_model"),
            "ingest_s": round(time.monotonic() - t0, 3),
        },
    }
    ctx.cache["rag"] = state
    return state


def _record(ctx: Ctx, on: bool) -> list[dict[str, Any]]:
    return list(http_json("POST", ctx.up_root + "/bench/record", {"on": on})["records"])


def _turn_records(ctx: Ctx, v1: str, b: dict[str, Any], name: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """One turn (its own client run) with the upstream recording; the stream and
    the upstream requests the turn made, in order."""
    from bench.scenarios import failures, phase

    _record(ctx, True)
    try:
        res = ctx.procs.run_client({"phases": [phase(name, v1, b)], "timeout_s": 60}, name=f"c-{name}")
    finally:
        records = _record(ctx, False)
    stream = res["phases"][0]["streams"][0] if res["phases"] else {}
    bad = failures([stream], b.get("bench_chunks"))
    if bad or res.get("error"):
        raise BenchError(f"{name}: turn failed: {bad or res.get('error')}")
    return stream, records


def _user_text(body: dict[str, Any]) -> str:
    users = [m for m in body.get("messages") or [] if m.get("role") == "user"]
    content = users[-1].get("content") if users else ""
    return content if isinstance(content, str) else json.dumps(content)


def _system_text(body: dict[str, Any]) -> str:
    return "\n".join(str(m.get("content")) for m in body.get("messages") or [] if m.get("role") == "system")


def rag_ttfc(ctx: Ctx) -> dict[str, Any]:
    """Time to first chunk, memory + one file (hybrid retrieval) vs a plain turn,
    less the upstream's own embedding and task-model time."""
    from bench.scenarios import body, check, failures, med, phase, spread

    rag = rag_turnlog(ctx)
    v1 = rag["v1"]
    n = 10 if ctx.quick else 30
    rounds = 2
    answer = 5
    messages = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": QUESTION}]
    plain_body = {**body(answer), "messages": messages}
    rag_body = {
        **plain_body,
        "features": {"memory": True},
        "params": {"function_calling": "default"},
        "files": [{"type": "file", "id": rag["file_id"]}],
    }

    # A warm-up turn of each kind; the rag one recorded: the upstream calls it makes.
    _turn_records(ctx, v1, plain_body, "rag-ttfc-plain-probe")
    _, records = _turn_records(ctx, v1, rag_body, "rag-ttfc-probe")
    calls = [r for r in records if r["kind"] != "chat"]
    chats = [r for r in records if r["kind"] == "chat"]
    kinds = sorted(r["kind"] for r in calls)
    if kinds != ["embeddings", "embeddings", "task"] or len(chats) != 1:
        raise BenchError(f"rag turn: expected 2 embedding calls, 1 task call and 1 answer upstream, got {[r['kind'] for r in records]}")
    sent = chats[0]["body"]
    if "<context>" not in _user_text(sent) or "<source" not in _user_text(sent):
        raise BenchError("rag turn: no sources in the last user message sent upstream")
    if "User Context:" not in _system_text(sent):
        raise BenchError("rag turn: no memories in the system message sent upstream")

    def floor_phase(i: int, j: int, rec: dict[str, Any], count: int) -> dict[str, Any]:
        path = "/embeddings" if rec["kind"] == "embeddings" else "/chat/completions"
        return {"name": f"up{i}_c{j}", "url": ctx.upstream_v1 + path, "body": rec["body"], "requests": count}

    phases = [
        *(floor_phase(0, j, rec, 2) | {"name": "_warmup"} for j, rec in enumerate(calls)),
        phase("_warmup", v1, plain_body, requests=3),
        phase("_warmup", v1, rag_body, requests=3),
    ]
    per = n // rounds
    for i in range(rounds):  # interleaved: drift hits all three alike
        phases += [floor_phase(i, j, rec, per) for j, rec in enumerate(calls)]
        phases.append(phase(f"plain{i}", v1, plain_body, requests=per))
        phases.append(phase(f"rag{i}", v1, rag_body, requests=per))
    stats0 = http_json("GET", ctx.up_root + "/bench/stats")
    res = ctx.procs.run_client({"phases": phases, "timeout_s": 300}, name="c-rag-ttfc")
    stats1 = http_json("GET", ctx.up_root + "/bench/stats")
    by = {p["name"]: p["streams"] for p in res["phases"]}
    bad: list[str] = []
    for i in range(rounds):
        bad += failures(by[f"plain{i}"], answer) + failures(by[f"rag{i}"], answer)
        for j in range(len(calls)):
            bad += [str(r.get("error") or r.get("status")) for r in by[f"up{i}_c{j}"] if r.get("status") != 200]
    if bad or res.get("error"):
        raise BenchError(f"rag_ttfc streams failed: {bad[:3] or res.get('error')}")
    rag_turns = 3 + n  # warm-up + measured
    task_calls = stats1["task_calls"] - stats0["task_calls"]
    emb_calls = stats1["embedding_calls"] - stats0["embedding_calls"]
    floor_task = sum(1 for r in calls if r["kind"] == "task") * (2 + n)
    floor_emb = sum(1 for r in calls if r["kind"] == "embeddings") * (2 + n)
    if task_calls != rag_turns + floor_task or emb_calls != 2 * rag_turns + floor_emb:
        raise BenchError(
            f"upstream saw {task_calls} task and {emb_calls} embedding calls, expected "
            f"{rag_turns + floor_task} and {2 * rag_turns + floor_emb}: the retrieval did not run on every turn"
        )

    def call_ms(i: int, j: int) -> float:
        return statistics.median(r["total"] for r in by[f"up{i}_c{j}"]) * 1000

    upstream_ms = [sum(call_ms(i, j) for j in range(len(calls))) for i in range(rounds)]
    plain = [r["ttfc"] * 1000 for i in range(rounds) for r in by[f"plain{i}"]]
    with_rag = [r["ttfc"] * 1000 for i in range(rounds) for r in by[f"rag{i}"]]
    per_round = [
        med([r["ttfc"] * 1000 for r in by[f"rag{i}"]]) - med([r["ttfc"] * 1000 for r in by[f"plain{i}"]]) - upstream_ms[i]  # type: ignore[operator]
        for i in range(rounds)
    ]
    steps = _step_times(v1, [r["turn_id"] for i in range(rounds) for r in by[f"rag{i}"] if r.get("turn_id")])
    rag_p50, plain_p50, up_ms = med(with_rag), med(plain), med(upstream_ms)
    added = rag_p50 - plain_p50 - up_ms  # type: ignore[operator]
    return {
        "status": "ok",
        # Named like ttfc's figure (an added time to first chunk, ms): the guard
        # gives both the same absolute floor (--quick TTFCs on a shared machine).
        "checks": [check("added_ttfc_ms", added, "<=", 15.0)],
        "figures": {
            "turns_each": len(plain),
            "rounds": rounds,
            "rag_ttfc_ms": spread(with_rag),
            "plain_ttfc_ms": spread(plain),
            "rag_ttfc_p50_ms": round(rag_p50, 3),  # type: ignore[arg-type]
            "plain_ttfc_p50_ms": round(plain_p50, 3),  # type: ignore[arg-type]
            "upstream_embedding_and_task_ms": round(up_ms, 3),  # type: ignore[arg-type]
            "added_ms": round(added, 3),
            "upstream_call_ms_round0": {f"{j}:{rec['kind']}": round(call_ms(0, j), 3) for j, rec in enumerate(calls)},
            "upstream_server_ms_probe": {f"{j}:{rec['kind']}": rec["server_ms"] for j, rec in enumerate(calls)},
            "added_ms_per_round": [round(x, 3) for x in per_round],
            "rag_turn_steps_ms": steps,
            "retrieval_queries": [q for r in calls if r["kind"] == "embeddings" for q in r["body"].get("input", [])],
            "answer_request_bytes": chats[0]["bytes"],
            "memories": len(MEMORIES),
            "file": rag["file"],
            "note": "ttfc = request sent -> first delta.content chunk; rag turn = features.memory + "
            "function_calling default + one ready Markdown file (hybrid: BM25 + vectors); upstream time = the rag "
            "turn's embedding and task-model requests (recorded bodies) sent straight to the bench upstream by the "
            "same client, median per call, summed; added = rag p50 - plain p50 - upstream time; rag_turn_steps_ms: "
            "median time from the previous event of the turn's log to each event up to model.requested (the events' "
            "'at' stamps), over the measured rag turns",
        },
    }


def _step_times(v1: str, turn_ids: list[str]) -> dict[str, float]:
    """Where a rag turn's time before the model request goes: per event of its log
    (``assembly.step`` by step name) up to ``model.requested``, the median time
    since the previous event, in ms."""
    gaps: dict[str, list[float]] = {}
    for turn_id in turn_ids:
        events = http_json("GET", f"{v1}/turns/{turn_id}/events")["events"]
        for prev, ev in zip(events, events[1:]):
            step = ev["data"].get("step") if isinstance(ev.get("data"), dict) else None
            key = f"{ev['type']}:{step}" if step else ev["type"]
            gaps.setdefault(key, []).append((ev["at"] - prev["at"]) * 1000)
            if ev["type"] == "model.requested":
                break
    return {k: round(statistics.median(v), 2) for k, v in gaps.items()}


def rag_tool_loop(ctx: Ctx) -> dict[str, Any]:
    """A 3-round tool loop with a file attached vs without: the sources block is
    carried once per upstream request, never piled up across rounds."""
    from bench.scenarios import body, check

    rag = rag_turnlog(ctx)
    v1 = rag["v1"]
    tool_rounds, answer = 3, 5
    runs = 1 if ctx.quick else 2
    loop_body = {
        **body(answer),
        "messages": [{"role": "user", "content": QUESTION + " Also add 2 and 3."}],
        "tool_ids": ["bench_rag_tools"],
        "bench_tool_rounds": tool_rounds,
        "bench_tool": "add",
        "bench_tool_args": '{"a": 2, "b": 3}',
    }
    file_body = {**loop_body, "files": [{"type": "file", "id": rag["file_id"]}]}
    sizes: dict[str, list[list[int]]] = {"with_file": [], "without": []}
    try:
        stats0 = http_json("GET", ctx.up_root + "/bench/stats")
        for i in range(runs):
            for label, b in (("without", loop_body), ("with_file", file_body)):
                sizes[label].append(_loop_sizes(ctx, v1, b, f"rag-loop-{label}{i}", tool_rounds))
        stats1 = http_json("GET", ctx.up_root + "/bench/stats")
    finally:  # the last scenario that uses this turnlog
        ctx.procs.stop(rag["proc"])
        ctx.cache.pop("rag", None)
    calls = stats1["tool_calls"] - stats0["tool_calls"]
    if calls != 2 * runs * tool_rounds:
        raise BenchError(f"upstream answered {calls} tool calls, expected {2 * runs * tool_rounds}")
    with_b, without_b = sizes["with_file"][-1], sizes["without"][-1]
    sources = with_b[0] - without_b[0]
    if sources <= 0:
        raise BenchError(f"the file added no bytes to the first request ({with_b[0]} vs {without_b[0]})")
    ratios = [w / (wo + sources) for w, wo in zip(with_b, without_b)]
    return {
        "status": "ok",
        "checks": [check("max_request_bytes_ratio", max(ratios), "<=", 1.10)],
        "figures": {
            "tool_rounds": tool_rounds,
            "upstream_requests_per_turn": tool_rounds + 1,
            "runs": runs,
            "with_file_bytes": with_b,
            "without_bytes": without_b,
            "sources_bytes": sources,
            "ratio_per_request": [round(r, 4) for r in ratios],
            "sources_copies_per_request": [round((w - wo) / sources, 3) for w, wo in zip(with_b, without_b)],
            "sizes_all_runs": sizes,
            "note": "bytes of each upstream request body (recorded by the bench upstream) of a 3-round native tool "
            "loop (add(2, 3)) + answer, with one ready Markdown file attached and without; sources = with[0] - "
            "without[0]; ratio = with[k] / (without[k] + sources), max over the 4 requests",
        },
    }


def _loop_sizes(ctx: Ctx, v1: str, b: dict[str, Any], name: str, tool_rounds: int) -> list[int]:
    """One tool-loop turn: the byte sizes of its upstream requests (the task
    model's and the embeddings' left out), after checking the loop ran as planned."""
    _, records = _turn_records(ctx, v1, b, name)
    chats = [r for r in records if r["kind"] == "chat"]
    if len(chats) != tool_rounds + 1:
        raise BenchError(f"{name}: {len(chats)} upstream requests, expected {tool_rounds + 1}")
    tool_msgs = [sum(1 for m in r["body"]["messages"] if m.get("role") == "tool") for r in chats]
    if tool_msgs != list(range(tool_rounds + 1)):
        raise BenchError(f"{name}: tool messages per request {tool_msgs}, expected 0..{tool_rounds}")
    last = chats[-1]["body"]
    tool_text = [str(m.get("content")) for m in last["messages"] if m.get("role") == "tool"]
    if tool_text != ["5"] * tool_rounds:
        raise BenchError(f"{name}: tool results {tool_text}, expected add(2, 3) = 5 each time")
    if b.get("files") and "<context>" not in _user_text(last):
        raise BenchError(f"{name}: no sources in the last request's user message")
    return [int(r["bytes"]) for r in chats]
