"""The ``turnlog`` command (API.md §1)."""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import logging
import sys
from collections.abc import Awaitable, Callable
from typing import Any

from adapters.config import Settings, load_settings
from adapters.store import open_store
from adapters.store.migrate import migrate
from engine.events import TERMINAL_TYPES
from engine.projection import fold


def _print_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, ensure_ascii=False) + "\n")


async def _with_store(settings: Settings, fn: Callable[[Any], Awaitable[int]]) -> int:
    await migrate(settings.database_url)
    store = await open_store(settings.database_url)
    try:
        return await fn(store)
    finally:
        await store.close()


def tune_gc(gen0_threshold: int) -> None:
    """Keep the cyclic garbage collector off the streaming path.

    Measured with 200 concurrent streams (bench ``concurrent_paced``): with the
    defaults, full collections walked every object imported at start and paused
    the event loop for up to 100 ms, and young collections ran ~170 times a
    second. Freezing what exists at start (modules, classes, settings) removes
    it from every later collection. A young collection walks every tracked
    object allocated since the last one and still alive — under load, mostly
    the state of the turns in flight (a few hundred objects each) — so its
    pause grows with the threshold: 20,000 gave 6-11 ms pauses, several per
    200-turn round, and an added p99 latency of 15-35 ms; 100,000 gave none in
    two rounds (p99 2-5 ms) and ~40 ms pauses about every 2.5 s with 1,000 open
    turns. Rare, longer pauses are the better trade for streaming.
    """
    gc.collect()
    gc.freeze()
    if gen0_threshold > 0:
        # Full collections (every turn's live objects walked: 30 ms with 200
        # streams) only every 100 middle ones instead of 10.
        gc.set_threshold(gen0_threshold, 10, 100)


def cmd_serve(settings: Settings, args: argparse.Namespace) -> int:
    from aiohttp import web

    from adapters.http.app import create_app

    try:
        settings.check_startable()
        loop = settings.new_event_loop()
    except ValueError as exc:
        print(f"turnlog: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    loop_name = "uvloop" if type(loop).__module__.startswith("uvloop") else "asyncio"
    print(
        f"turnlog serving on http://{settings.host}:{settings.port} (database {settings.database_url}, "
        f"event loop {loop_name})",
        flush=True,
    )
    if settings.demo:
        print(
            "demo mode: model 'demo' and tool 'clock' are on. Try:\n"
            f"  curl -N http://{settings.host}:{settings.port}/v1/chat/completions -H 'Content-Type: application/json' "
            '-d \'{"model": "demo", "stream": true, "messages": [{"role": "user", "content": "count to 20"}]}\'',
            flush=True,
        )
    app = create_app(settings)

    async def gc_after_startup(_app: web.Application) -> None:
        tune_gc(settings.gc_gen0_threshold)

    app.on_startup.append(gc_after_startup)  # after the store and supervisor are up
    web.run_app(
        app, host=settings.host, port=settings.port, print=None, access_log=None, loop=loop
    )
    return 0


def cmd_migrate(settings: Settings, args: argparse.Namespace) -> int:
    asyncio.run(migrate(settings.database_url))
    print("database is at the latest schema")
    return 0


def cmd_turns(settings: Settings, args: argparse.Namespace) -> int:
    async def run(store: Any) -> int:
        if args.action == "list":
            records = await store.list_turns(chat_id=args.chat, status=args.status, limit=args.limit)
            print(f"{'TURN':<30} {'CHAT':<30} {'STATUS':<12} {'MODEL':<20} CREATED")
            for r in records:
                print(f"{r.id:<30} {r.chat_id:<30} {r.status:<12} {r.model:<20} {r.created_at:.3f}")
            return 0
        record = await store.get_turn(args.turn_id)
        if record is None:
            print(f"turnlog: no turn {args.turn_id}", file=sys.stderr)
            return 1
        if args.action == "show":
            _print_json(fold(record.id, await store.read(record.id)).public())
            return 0
        # events
        after = args.after
        while True:
            events = await store.read(record.id, after=after)
            for event in events:
                _print_json({"seq": event.seq, "type": event.type, "at": event.at, "data": event.data})
                after = event.seq
                if event.type in TERMINAL_TYPES and args.follow:
                    return 0
            if not args.follow:
                return 0
            sys.stdout.flush()
            await asyncio.sleep(0.5)

    return asyncio.run(_with_store(settings, run))


def cmd_replay(settings: Settings, args: argparse.Namespace) -> int:
    """Re-project the turn; exit 1 if the stored view disagrees with the log."""

    async def run(store: Any) -> int:
        record = await store.get_turn(args.turn_id)
        if record is None:
            print(f"turnlog: no turn {args.turn_id}", file=sys.stderr)
            return 1
        view = fold(record.id, await store.read(record.id)).public()
        _print_json(view)
        if record.view is not None and record.view != json.loads(json.dumps(view)):
            diff = [k for k in sorted(set(view) | set(record.view)) if view.get(k) != record.view.get(k)]
            print(f"turnlog: replay differs from the stored view in: {', '.join(diff)}", file=sys.stderr)
            return 1
        return 0

    return asyncio.run(_with_store(settings, run))


async def scratch_store(folder: str) -> Any:
    """An empty SQLite store for ``verify`` runs (a real store, thrown away after)."""
    url = f"sqlite+aiosqlite:///{folder}/verify.db"
    await migrate(url)
    return await open_store(url, synchronous="OFF")


def cmd_verify(settings: Settings, args: argparse.Namespace) -> int:
    """Re-run the engine against the recorded results; exit 1 with a diff on mismatch."""
    import tempfile

    from engine.verify import verify_turn

    async def run(store: Any) -> int:
        events = await store.read(args.turn_id)
        if not events:
            print(f"turnlog: no turn {args.turn_id}", file=sys.stderr)
            return 1
        with tempfile.TemporaryDirectory(prefix="turnlog-verify-") as folder:
            scratch = await scratch_store(folder)
            try:
                result = await verify_turn(events, scratch)
            finally:
                await scratch.close()
        if result.ok:
            print(f"ok: {len(result.expected)} events reproduced")
            return 0
        print(f"turnlog: turn {args.turn_id} does not verify:", file=sys.stderr)
        for line in result.diff:
            print(line, file=sys.stderr)
        return 1

    return asyncio.run(_with_store(settings, run))


def cmd_keys(settings: Settings, args: argparse.Namespace) -> int:
    async def run(store: Any) -> int:
        print(await store.create_api_key(args.user))
        return 0

    return asyncio.run(_with_store(settings, run))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="turnlog", description="Event-sourced chat-turn service")
    parser.add_argument("--config", help="TOML configuration file (environment variables win)")
    parser.add_argument("--database-url", help="override TURNLOG_DATABASE_URL")
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the service (migrates on start)")
    serve.add_argument("--host")
    serve.add_argument("--port", type=int)
    serve.add_argument("--config", dest="config_sub")
    serve.add_argument(
        "--demo", action="store_true", default=None,
        help="also serve the built-in scripted model 'demo' and the 'clock' tool (no key, no network)",
    )
    serve.set_defaults(fn=cmd_serve)

    sub.add_parser("migrate", help="upgrade the database schema").set_defaults(fn=cmd_migrate)

    turns = sub.add_parser("turns", help="inspect turns")
    turns_sub = turns.add_subparsers(dest="action", required=True)
    listing = turns_sub.add_parser("list")
    listing.add_argument("--chat")
    listing.add_argument("--status")
    listing.add_argument("--limit", type=int, default=100)
    show = turns_sub.add_parser("show")
    show.add_argument("turn_id")
    events = turns_sub.add_parser("events")
    events.add_argument("turn_id")
    events.add_argument("--after", type=int, default=0)
    events.add_argument("--follow", action="store_true")
    turns.set_defaults(fn=cmd_turns)

    replay = sub.add_parser("replay", help="re-project a turn from its log")
    replay.add_argument("turn_id")
    replay.set_defaults(fn=cmd_replay)

    verify = sub.add_parser("verify", help="re-run a turn's engine against its recorded results")
    verify.add_argument("turn_id")
    verify.set_defaults(fn=cmd_verify)

    keys = sub.add_parser("keys", help="API keys")
    keys_sub = keys.add_subparsers(dest="action", required=True)
    create = keys_sub.add_parser("create")
    create.add_argument("--user", required=True)
    keys.set_defaults(fn=cmd_keys)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    config = getattr(args, "config_sub", None) or args.config
    try:
        settings = load_settings(
            config,
            database_url=args.database_url,
            host=getattr(args, "host", None),
            port=getattr(args, "port", None),
            demo=getattr(args, "demo", None),
        )
    except Exception as exc:  # a bad config file or variable: say which
        print(f"turnlog: invalid configuration: {exc}", file=sys.stderr)
        return 2
    return int(args.fn(settings, args) or 0)


if __name__ == "__main__":
    sys.exit(main())
