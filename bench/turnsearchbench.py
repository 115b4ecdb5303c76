"""Finding a turn among many: ``GET /v1/turns`` over 100,000 seeded turns.

* Scenario ``turn_search``: seeds a fresh SQLite database (``python -m
  bench.turnsearchbench seed``, a subprocess) with N turns of the one local
  user (quick: N = 20,000), starts ``turnlog serve`` on it, and asks it for
  filtered pages over HTTP: by status, by model, by date range, "failed",
  "used tools", full text (a common, a rare and a mid word, alone and with a
  model), and a deep keyset page. p50/p95 per query and over all filtered
  pages together; the target is a filtered page's p95 ≤ 100 ms.
* Seeding goes through the database, as the service writes: turn rows (their
  final view holds the answer and title) and ``assembly.completed`` /
  ``tool.started`` / ``tool.completed`` events, each insert firing the
  search index's triggers, so the index is built the way a live service
  builds it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
import urllib.parse
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

from bench.procs import BenchError
from bench.scenarios import Ctx, _storebench, check

USER = "local"  # the caller when auth is off
MODELS = ("gpt-a", "gpt-b", "gpt-c", "gpt-d", "gpt-e")
T0 = 1_790_000_000.0  # the oldest seeded turn
SPAN = 100 * 86_400.0  # seeded over 100 days
BATCH = 2_000


def _vocabulary(rng: random.Random, n: int = 5_000) -> list[str]:
    letters = "abcdefghijklmnopqrstuvwxyz"
    return sorted({"".join(rng.choice(letters) for _ in range(rng.randint(3, 9))) for _ in range(n)})


def _text(rng: random.Random, vocab: list[str], words: int) -> str:
    # Zipf-like: low ranks are common words, high ranks rare ones.
    return " ".join(vocab[min(int(rng.paretovariate(1.1)) - 1, len(vocab) - 1)] for _ in range(words)).capitalize() + "."


def _turn(i: int, n: int, rng: random.Random, vocab: list[str]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    turn_id = f"turn_seed{i:07d}"
    roll = rng.random()
    status = "completed" if roll < 0.90 else "failed" if roll < 0.96 else "cancelled" if roll < 0.99 else "running"
    created = T0 + SPAN * i / n + rng.random() / 1000
    question, answer = _text(rng, vocab, rng.randint(8, 20)), _text(rng, vocab, rng.randint(30, 80))
    view = {"content": answer if status != "failed" else None, "status": status}
    if i % 5 == 0:  # a chat's first turn gets a title
        view["title"] = " ".join(question.split()[:4])
    turn = {
        "id": turn_id,
        "chat_id": f"chat_seed{i // 5:07d}",
        "user_id": USER,
        "model": MODELS[i % len(MODELS)],
        "status": status,
        "created_at": created,
        "updated_at": created + 2.0,
        "view": None if status == "running" else json.dumps(view, separators=(",", ":")),
    }
    assembled = {"messages": [], "new_messages": [{"role": "user", "content": question}], "history_len": 0}
    events = [{"turn_id": turn_id, "seq": 2, "type": "assembly.completed", "at": created, "data": json.dumps(assembled)}]
    if rng.random() < 0.10:
        tool_status = "failed" if rng.random() < 0.2 else "completed"
        events.append(
            {"turn_id": turn_id, "seq": 3, "type": "tool.started", "at": created, "data": json.dumps({"call_id": "c", "name": "t", "arguments": "{}"})}
        )
        events.append(
            {
                "turn_id": turn_id,
                "seq": 4,
                "type": "tool.completed",
                "at": created,
                "data": json.dumps({"call_id": "c", "name": "t", "output": "x", "status": tool_status}),
            }
        )
    return turn, events


async def seed(url: str, n: int) -> dict[str, Any]:
    from sqlalchemy import insert

    from adapters.store import create_engine, migrate
    from adapters.store.schema import chats, events, turns

    await migrate(url)
    engine = create_engine(url)
    rng = random.Random(44)
    vocab = _vocabulary(rng)
    began = time.perf_counter()
    df: Counter[str] = Counter()  # in how many turns each word is
    try:
        for start in range(0, n, BATCH):
            made = [_turn(i, n, rng, vocab) for i in range(start, min(start + BATCH, n))]
            rows = [t for t, _ in made]
            for t, evs in made:
                said = json.loads(evs[0]["data"])["new_messages"][0]["content"] + " " + (json.loads(t["view"] or "{}").get("content") or "")
                df.update(set(said.lower().replace(".", "").split()))
            chat_rows = [
                {"id": t["chat_id"], "user_id": USER, "title": None, "created_at": t["created_at"], "updated_at": t["created_at"]}
                for i, t in enumerate(rows, start)
                if i % 5 == 0
            ]
            async with engine.begin() as conn:
                await conn.execute(insert(turns), rows)
                if chat_rows:
                    await conn.execute(insert(chats), chat_rows)
                await conn.execute(insert(events), [e for _, evs in made for e in evs])
    finally:
        await engine.dispose()
    by_df = sorted(df.items(), key=lambda item: (item[1], item[0]))

    def near(turns: int) -> tuple[str, int]:
        return min(by_df, key=lambda item: (abs(item[1] - turns), item[0]))

    # the most common word, one in about 1 % of the turns, one in a handful
    common, mid, rare = by_df[-1], near(n // 100), near(5)
    return {"turns": n, "seed_s": round(time.perf_counter() - began, 2), "words": len(df), "common": common, "mid": mid, "rare": rare}


# ---------------------------------------------------------------------- scenario


def _get(url: str) -> tuple[float, Any]:
    began = time.perf_counter()
    with urllib.request.urlopen(url, timeout=30) as r:
        body = json.loads(r.read())
    return (time.perf_counter() - began) * 1000, body


def _pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(p * len(ordered)))], 2)


def _queries(seeded: dict[str, Any], deep_cursor: str) -> dict[str, dict[str, str]]:
    day = 86_400.0
    return {
        "status_failed": {"status": "failed"},
        "model": {"model": "gpt-c"},
        "model_and_status": {"model": "gpt-b", "status": "cancelled"},
        "date_range": {"since": str(T0 + 20 * day), "until": str(T0 + 30 * day)},
        "failed": {"failed": "true"},
        "used_tools": {"tools": "true"},
        "q_common": {"q": seeded["common"][0]},
        "q_mid_and_model": {"q": seeded["mid"][0], "model": "gpt-d"},
        "q_rare": {"q": seeded["rare"][0]},
        "q_prefix": {"q": seeded["mid"][0][:3] + "*"},
        "deep_page": {"before": deep_cursor, "status": "completed"},
    }


def turn_search(ctx: Ctx) -> dict[str, Any]:
    n = 20_000 if ctx.quick else 100_000
    rounds = 10 if ctx.quick else 30
    db = ctx.workdir / "turnsearch.db"
    for old in ctx.workdir.glob("turnsearch.db*"):
        old.unlink()
    seeded = _storebench(ctx, ["seed", "--turns", str(n), "--url", f"sqlite+aiosqlite:///{db}"], 900, name="turnsearch-seed", module="bench.turnsearchbench")
    proc, v1 = ctx.procs.start_turnlog("turnlog-search", ctx.upstream_v1, db)
    try:
        base = v1 + "/turns?limit=25&"
        # a cursor 2,000 turns deep: the page after it is as cheap as the first
        cursor = ""
        for _ in range(80):
            _, page = _get(base + urllib.parse.urlencode({"before": cursor} if cursor else {}))
            cursor = page["next_before"] or cursor
        queries = _queries(seeded, cursor)
        for params in queries.values():  # warm: the first of each reads cold pages
            _get(base + urllib.parse.urlencode(params))
        took: dict[str, list[float]] = {name: [] for name in queries}
        rows: dict[str, int] = {}
        for _ in range(rounds):
            for name, params in queries.items():
                ms, page = _get(base + urllib.parse.urlencode(params))
                took[name].append(ms)
                rows[name] = len(page["data"])
        counts_ms = [_get(v1 + "/ui/turns/counts?" + urllib.parse.urlencode(p))[0] for p in queries.values() if "before" not in p]
        first_page_ms = [_get(base)[0] for _ in range(rounds)]
    finally:
        ctx.procs.stop(proc)
    if min(rows.values()) == 0:
        raise BenchError(f"turn_search: a query found nothing: {rows}")
    every = [ms for values in took.values() for ms in values]
    return {
        "status": "ok",
        "checks": [check("filtered_page_p95_ms", _pct(every, 0.95), "<=", 100.0)],
        "figures": {
            "turns": n,
            "seed_s": seeded["seed_s"],
            "words": {k: seeded[k] for k in ("common", "mid", "rare")},  # [word, turns holding it]
            "rounds": rounds,
            "page": 25,
            "filtered_page_p50_ms": _pct(every, 0.50),
            "filtered_page_p95_ms": _pct(every, 0.95),
            "first_page_p95_ms": _pct(first_page_ms, 0.95),
            "counts_p50_ms": _pct(counts_ms, 0.50),
            "counts_max_ms": round(max(counts_ms), 2),
            "by_query": {name: {"p50_ms": _pct(v, 0.5), "p95_ms": _pct(v, 0.95), "rows": rows[name]} for name, v in took.items()},
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("command", choices=["seed"])
    parser.add_argument("--turns", type=int, default=100_000)
    parser.add_argument("--url", required=True)
    parser.add_argument("--dir", default=".")
    args = parser.parse_args()
    Path(args.dir).mkdir(parents=True, exist_ok=True)
    print(json.dumps(asyncio.run(seed(args.url, args.turns))), flush=True)


if __name__ == "__main__":
    main()
