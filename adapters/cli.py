"""The ``turnlog`` command (docs/reference/cli.md)."""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import logging
import sys
from collections.abc import Awaitable, Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError

from adapters import fork_cli
from adapters.checked_log import DamagedTurn, checked_chain
from adapters.checked_log import checked_events as _checked_events
from adapters.checked_log import checked_fold as _checked_fold
from adapters.config import Settings, load_settings
from adapters.observe.logs import configure_logging
from adapters.store import hash_api_key, open_store
from adapters.store.migrate import migrate
from adapters.store.usage import Limits, SqlUsage
from engine.chain import GENESIS, check
from engine.events import TERMINAL_TYPES, Event
from engine.fold.turn_view import TurnView
from engine.ports import ROLES

#: PostgreSQL's SQLSTATE for a database that does not exist (invalid_catalog_name).
_NO_SUCH_DATABASE = "3D000"

#: How long ``verify`` lets the re-run of a turn take before it says it did not finish.
VERIFY_TIMEOUT = 60.0


def _print_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, ensure_ascii=False) + "\n")


def local_time(ts: float | None) -> str:
    """An epoch timestamp as the reader's local time, to the second."""
    if not ts:
        return "-"
    return datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S")


def table(header: list[str], rows: list[list[str]]) -> str:
    """Columns padded to their widest cell (the last one left unpadded)."""
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = []
    for row in [header, *rows]:
        cells = [cell.ljust(widths[i]) for i, cell in enumerate(row[:-1])] + [row[-1]]
        lines.append("  ".join(cells))
    return "\n".join(lines)


def _short(text: Any, limit: int = 100) -> str:
    """One line of at most ``limit`` characters."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def _item_line(item: dict[str, Any]) -> str:
    """One output item, summarized for ``turns show``."""
    kind = item.get("type", "?")
    status = f" [{item['status']}]" if item.get("status") else ""
    if kind == "message":
        text = "".join(p.get("text") or "" for p in item.get("content") or [] if isinstance(p, dict))
        return f"message: {_short(text)!r}{status}"
    if kind == "reasoning":
        text = "".join(p.get("text") or "" for p in (item.get("content") or item.get("summary") or []) if isinstance(p, dict))
        return f"reasoning: {_short(text)!r}{status}"
    if kind == "function_call":
        return f"function_call {item.get('name')}({_short(item.get('arguments') or '', 60)}) call {item.get('call_id')}{status}"
    if kind == "function_call_output":
        return f"function_call_output for {item.get('call_id')}: {_short(item.get('output') or '', 80)!r}{status}"
    if kind == "code_interpreter":
        return f"code_interpreter: {_short(item.get('code') or '', 60)!r}{status}"
    return f"{kind}{status}"


def turn_summary(view: dict[str, Any], events: int) -> str:
    """A projected turn for a person: the facts first, then the answer and its items."""
    usage = view.get("usage") or {}
    took = ""
    if view.get("created_at") and view.get("updated_at"):
        took = f" ({view['updated_at'] - view['created_at']:.1f} s after start)"
    error = view.get("error")
    rows = [
        ["turn", view["id"]],
        ["status", f"{view['status']} (state {view['state']}, finish_reason {view.get('finish_reason') or '-'})"],
        ["model", str(view.get("model"))],
        ["chat", str(view.get("chat_id"))],
        ["created", local_time(view.get("created_at"))],
        ["updated", local_time(view.get("updated_at")) + took],
        ["events", f"{events} (turnlog turns events {view['id']})"],
        [
            "usage",
            ", ".join(f"{k.removesuffix('_tokens')} {usage[k]}" for k in ("prompt_tokens", "completion_tokens", "total_tokens") if k in usage) + " tokens"
            if usage
            else "-",
        ],
        ["error", f"{error.get('message')} ({error.get('type')})" if error else "-"],
    ]
    for key in ("title", "tags", "follow_ups"):
        if view.get(key) is not None:
            rows.append([key, json.dumps(view[key], ensure_ascii=False)])
    lines = [f"{k:<8} {v}" for k, v in rows]
    for warning in view.get("warnings") or []:
        lines.append(f"warning  {warning}")
    if view.get("reasoning_content"):
        lines.append("reasoning:")
        lines.extend("  " + line for line in view["reasoning_content"].splitlines())
    lines.append("content:" if view.get("content") else "content: (none)")
    lines.extend("  " + line for line in (view.get("content") or "").splitlines())
    output = view.get("output") or []
    lines.append(f"output: {len(output)} item{'' if len(output) == 1 else 's'}")
    lines.extend(f"  {i}. {_item_line(item)}" for i, item in enumerate(output, 1))
    return "\n".join(lines)


class Damaged(Exception):
    """A turn's log does not hold: the one line the CLI prints (exit 1)."""


def _damaged(exc: DamagedTurn) -> Damaged:
    return Damaged(f"{exc} (turnlog verify {exc.turn_id})")


async def checked_events(store: Any, turn_id: str) -> list[Event]:
    """``adapters.checked_log.checked_events``, its verdict as the CLI words it."""
    try:
        return await _checked_events(store, turn_id)
    except DamagedTurn as exc:
        raise _damaged(exc) from None


def checked_fold(turn_id: str, events: list[Event]) -> TurnView:
    try:
        return _checked_fold(turn_id, events)
    except DamagedTurn as exc:
        raise _damaged(exc) from None


def missing_database(url: str) -> str | None:
    """Why a command that only reads cannot use ``url``: its SQLite file does not
    exist (opening it would create an empty one). None when it does (or for
    other databases, whose server says so itself)."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:") or parsed.database.startswith("file:"):
        return None
    path = Path(parsed.database).resolve()
    if path.exists():
        return None
    return (
        f"database {parsed.render_as_string(hide_password=True)} does not exist (no file {path}); "
        "set TURNLOG_DATABASE_URL or --database-url to the service's database"
    )


async def _with_store(settings: Settings, fn: Callable[[Any], Awaitable[int]], *, read_only: bool = True) -> int:
    """Run ``fn`` on the configured store; a command that only reads never
    creates the database (it says which one it looked for, exit 1)."""
    url = settings.database_url
    if read_only and (missing := missing_database(url)) is not None:
        print(f"turnlog: {missing}", file=sys.stderr)
        return 1
    try:
        await migrate(url)
    except DBAPIError as exc:
        if read_only and getattr(exc.orig, "sqlstate", None) == _NO_SUCH_DATABASE:
            shown = make_url(url).render_as_string(hide_password=True)
            print(f"turnlog: database {shown} does not exist ({exc.orig})", file=sys.stderr)
            return 1
        raise
    store = await open_store(url)
    try:
        return await fn(store)
    except Damaged as exc:
        print(f"turnlog: {exc}", file=sys.stderr)
        return 1
    finally:
        await store.close()


def tune_gc(gen0_threshold: int) -> None:
    """Keep the cyclic garbage collector off the streaming path.

    With the defaults, under many concurrent streams, full collections walk
    every object imported at start and pause the event loop, and young
    collections run many times a second. Freezing what exists at start (modules, classes, settings) removes
    it from every later collection. A young collection walks every tracked
    object allocated since the last one and still alive — under load, mostly
    the state of the turns in flight (a few hundred objects each) — so its
    pause grows with the threshold, but a threshold too low to give long pauses
    gives frequent ones that add to every stream's tail latency. Rare, longer
    pauses are the better trade for streaming.
    """
    gc.collect()
    gc.freeze()
    if gen0_threshold > 0:
        # Full collections (every turn's live objects walked) only every 100
        # middle ones instead of 10.
        gc.set_threshold(gen0_threshold, 10, 100)


def cmd_serve(settings: Settings, args: argparse.Namespace) -> int:
    from aiohttp import web

    from adapters.code import WeakSandboxRefused
    from adapters.http.app import create_app
    from adapters.http.serving import serve

    try:
        settings.check_startable()
        loop = settings.new_event_loop()
    except ValueError as exc:
        print(f"turnlog: {exc}", file=sys.stderr)
        return 2
    configure_logging(settings.log_format)

    def announce(text: str) -> None:
        """The start-up banner: a log line in JSON mode (every line of output parses)."""
        if settings.log_format == "json":
            logging.getLogger("turnlog").info("%s", text)
        else:
            print(text, flush=True)

    loop_name = "uvloop" if type(loop).__module__.startswith("uvloop") else "asyncio"
    announce(f"turnlog serving on http://{settings.host}:{settings.port} (database {settings.database_url}, event loop {loop_name})")
    if settings.demo:
        announce(
            "demo mode: model 'demo' and tool 'clock' are on. Try:\n"
            f"  curl -N http://{settings.host}:{settings.port}/v1/chat/completions -H 'Content-Type: application/json' "
            '-d \'{"model": "demo", "stream": true, "messages": [{"role": "user", "content": "count to 20"}]}\''
        )
    app = create_app(settings)

    async def gc_after_startup(_app: web.Application) -> None:
        tune_gc(settings.gc_gen0_threshold)

    app.on_startup.append(gc_after_startup)  # after the store and supervisor are up
    # SIGTERM drains: adapters.http.serving. The backlog: aiohttp's
    # default (128) overflows under a burst of connections and the kernel resets
    # them (bench thousands_sse).
    try:
        serve(
            app,
            host=settings.host,
            port=settings.port,
            loop=loop,
            drain_seconds=settings.drain_seconds,
            backlog=4096,
            reuse_port=settings.reuse_port,
        )
    except WeakSandboxRefused as exc:
        print(f"turnlog: {exc}", file=sys.stderr)
        return 2
    return 0


def cmd_migrate(settings: Settings, args: argparse.Namespace) -> int:
    asyncio.run(migrate(settings.database_url))
    print("database is at the latest schema")
    return 0


def cmd_turns(settings: Settings, args: argparse.Namespace) -> int:
    async def run(store: Any) -> int:
        if args.action == "list":
            records = await store.list_turns(chat_id=args.chat, status=args.status, limit=args.limit)
            if args.json:
                fields = ("id", "chat_id", "user_id", "model", "status", "created_at", "updated_at")
                _print_json({"turns": [{f: getattr(r, f) for f in fields} for r in records]})
                return 0
            if not records:
                print("turnlog: no turns match", file=sys.stderr)
                return 0
            # The turn id stays the first column of each row after the header (scripts cut it).
            rows = [[r.id, r.chat_id, r.status, r.model, local_time(r.created_at), local_time(r.updated_at)] for r in records]
            print(table(["TURN", "CHAT", "STATUS", "MODEL", "CREATED", "UPDATED"], rows))
            return 0
        record = await store.get_turn(args.turn_id)
        if record is None:
            print(f"turnlog: no turn {args.turn_id}", file=sys.stderr)
            return 1
        if args.action == "show":
            events = await checked_events(store, record.id)
            view = checked_fold(record.id, events).public()
            if args.json:
                _print_json(view)
            else:
                print(turn_summary(view, len(events)))
            return 0
        # events: the whole log is checked, then the events after --after printed
        last, previous = 0, GENESIS
        while True:
            stored = await store.read_chain(record.id, after=last)
            result = check(record.id, stored, previous=previous, first_seq=last + 1)
            if result.damage is not None:
                raise Damaged(f"turn {record.id}: damaged log: {result.damage.message} (turnlog verify {record.id})")
            if stored:
                last, previous = stored[-1].seq, bytes.fromhex(result.head)
            for event in (e.event() for e in stored if e.seq > args.after):
                _print_json({"seq": event.seq, "type": event.type, "at": event.at, "data": event.data})
                if event.type in TERMINAL_TYPES and args.follow:
                    return 0
            if not args.follow:
                return 0
            sys.stdout.flush()
            await asyncio.sleep(0.5)

    return asyncio.run(_with_store(settings, run))


def _tool_calls(output: list[dict[str, Any]]) -> list[str]:
    """Each tool call of the output with its result, one line each."""
    results = {i.get("call_id"): i for i in output if i.get("type") == "function_call_output"}
    lines = []
    for item in output:
        if item.get("type") == "function_call":
            done = results.get(item.get("call_id"))
            result = f" -> {_short(done.get('output') or '', 80)!r}" if done else " (no result)"
            lines.append(f"{item.get('name')}({_short(item.get('arguments') or '', 60)}){result}")
        elif item.get("type") == "code_interpreter":
            lines.append(f"code_interpreter: {_short(item.get('code') or '', 60)!r}")
    return lines


def replay_summary(view: dict[str, Any], events: int, differs: list[str] | None) -> str:
    """What ``replay`` tells a person: the projected state, the answer, the tool
    calls and whether the stored view agrees (``differs``: None when there is
    no stored view, else the fields that disagree)."""
    lines = [
        f"turn     {view['id']}: {events} events replayed",
        f"status   {view['status']} (state {view['state']}, finish_reason {view.get('finish_reason') or '-'})",
    ]
    if view.get("error"):
        lines.append(f"error    {view['error'].get('message')} ({view['error'].get('type')})")
    lines.append("answer:" if view.get("content") else "answer: (none)")
    lines.extend("  " + line for line in (view.get("content") or "").splitlines())
    calls = _tool_calls(view.get("output") or [])
    lines.append(f"tool calls: {len(calls) or 'none'}")
    lines.extend(f"  {i}. {line}" for i, line in enumerate(calls, 1))
    if differs is None:
        verdict = "nothing to compare: no view is stored for this turn yet"
    elif differs:
        verdict = f"DIFFERS from the stored view in: {', '.join(differs)}"
    else:
        verdict = "the log replays to the stored view"
    lines.append(f"verdict  {verdict}")
    return "\n".join(lines)


def cmd_replay(settings: Settings, args: argparse.Namespace) -> int:
    """Re-project the turn; exit 1 if the stored view disagrees with the log."""

    async def run(store: Any) -> int:
        record = await store.get_turn(args.turn_id)
        if record is None:
            print(f"turnlog: no turn {args.turn_id}", file=sys.stderr)
            return 1
        events = await checked_events(store, record.id)
        view = checked_fold(record.id, events).public()
        differs: list[str] | None = None
        if record.view is not None:
            plain = json.loads(json.dumps(view))
            differs = [k for k in sorted(set(plain) | set(record.view)) if plain.get(k) != record.view.get(k)]
        if args.json:
            _print_json(view)
        else:
            print(replay_summary(view, len(events), differs))
        if differs:
            print(f"turnlog: replay differs from the stored view in: {', '.join(differs)}", file=sys.stderr)
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

    from engine.run.verify import verify_turn

    if args.file:
        return verify_file_command(args)
    if not args.turn_id:
        print("turnlog: verify needs a TURN_ID or --file FILE", file=sys.stderr)
        return 2

    async def run(store: Any) -> int:
        stored, chain = await checked_chain(store, args.turn_id)
        if not stored:
            print(f"turnlog: no turn {args.turn_id}", file=sys.stderr)
            return 1
        if chain.damage is not None:
            damage = chain.damage
            if args.json:
                _print_json({"turn_id": args.turn_id, "ok": False, "events_recorded": len(stored), "diff": [damage.message], "damage": damage.public()})
            else:
                print(f"turnlog: turn {args.turn_id} does not verify: {damage.kind}: {damage.message}", file=sys.stderr)
            return 1
        events = [e.event() for e in stored]
        with tempfile.TemporaryDirectory(prefix="turnlog-verify-") as folder:
            scratch = await scratch_store(folder)
            try:
                result = await asyncio.wait_for(verify_turn(events, scratch), VERIFY_TIMEOUT)
            except TimeoutError:
                print(f"turnlog: turn {args.turn_id} does not verify: the re-run did not finish within {VERIFY_TIMEOUT:g} s", file=sys.stderr)
                return 1
            finally:
                await scratch.close()
        recorded, compared = len(events), len(result.expected)
        if args.json:
            _print_json(
                {"turn_id": args.turn_id, "ok": result.ok, "events_recorded": recorded, "events_compared": compared, "head": chain.head, "diff": result.diff}
            )
            return 0 if result.ok else 1
        if result.ok:
            if compared < recorded:
                how = (
                    f"compared as {compared} after merging consecutive model.delta windows (group-commit batching depends on timing, so the windows may differ)"
                )
            else:
                how = "compared one by one"
            print(f"ok: turn {args.turn_id} reproduced: {recorded} events recorded, {how}; hash chain intact, head {chain.head}")
            return 0
        print(f"turnlog: turn {args.turn_id} does not verify:", file=sys.stderr)
        for line in result.diff:
            print(line, file=sys.stderr)
        return 1

    return asyncio.run(_with_store(settings, run))


def verify_file_command(args: argparse.Namespace) -> int:
    """``turnlog verify --file FILE [--public-key KEY]``: no database."""
    from adapters.receipts import ReceiptKeyError, load_public_key, verify_file

    try:
        key = load_public_key(args.public_key) if args.public_key else None
        data = sys.stdin.buffer.read() if args.file == "-" else open(args.file, "rb").read()
    except (ReceiptKeyError, OSError) as exc:
        print(f"turnlog: {exc}", file=sys.stderr)
        return 2
    verdict = verify_file(data, key)
    if args.json:
        _print_json(verdict.public())
        return 0 if verdict.ok else 1
    if not verdict.ok:
        print(f"turnlog: {args.file} does not verify: {verdict.problem}", file=sys.stderr)
        return 1
    notes = "".join(f"; {note}" for note in verdict.notes)
    print(f"ok: {args.file}: turn {verdict.turn_id}, {verdict.events} events, hash chain intact, head {verdict.head}{notes}")
    return 0


def cmd_export(settings: Settings, args: argparse.Namespace) -> int:
    """The turn's events with their hashes as JSON lines, its receipt first."""
    from adapters.receipts import ReceiptKeyError, export_lines, load_private_key

    try:
        key = load_private_key(settings.receipt_key) if settings.receipt_key else None
    except ReceiptKeyError as exc:
        print(f"turnlog: {exc}", file=sys.stderr)
        return 2

    async def run(store: Any) -> int:
        stored, chain = await checked_chain(store, args.turn_id)
        if not stored:
            print(f"turnlog: no turn {args.turn_id}", file=sys.stderr)
            return 1
        if chain.damage is not None:
            raise Damaged(f"turn {args.turn_id}: damaged log, not exported: {chain.damage.message} (turnlog verify {args.turn_id})")
        out = sys.stdout
        for line in export_lines(args.turn_id, stored, chain, key):
            out.write(line + "\n")
        out.flush()
        return 0

    return asyncio.run(_with_store(settings, run))


def cmd_keys(settings: Settings, args: argparse.Namespace) -> int:
    if args.action == "receipt-public":
        from adapters.receipts import ReceiptKeyError, load_private_key, public_pem

        if not settings.receipt_key:
            print("turnlog: TURNLOG_RECEIPT_KEY is not set (a PEM file with an Ed25519 private key)", file=sys.stderr)
            return 2
        try:
            sys.stdout.write(public_pem(load_private_key(settings.receipt_key)))
        except ReceiptKeyError as exc:
            print(f"turnlog: {exc}", file=sys.stderr)
            return 2
        return 0

    async def run(store: Any) -> int:
        key = await store.create_api_key(args.user, args.role)
        limits = Limits(args.requests_per_minute, args.tokens_per_day)
        if limits != Limits():
            # Before the key is printed: nobody can use it without its quotas.
            await SqlUsage(store.engine).set_key_limits(hash_api_key(key), limits)
        print(key)
        return 0

    return asyncio.run(_with_store(settings, run, read_only=False))


def _positive(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, not {value!r}")
    return number


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="turnlog", description="Event-sourced chat-turn service")
    parser.add_argument("--config", help="TOML configuration file (environment variables win)")
    parser.add_argument("--database-url", help="override TURNLOG_DATABASE_URL")
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the service (migrates on start)")
    serve.add_argument("--host", help="the address to listen on (TURNLOG_HOST)")
    serve.add_argument("--port", type=int, help="the port to listen on (TURNLOG_PORT)")
    serve.add_argument("--config", dest="config_sub", help="TOML configuration file (as turnlog --config)")
    serve.add_argument(
        "--demo",
        action="store_true",
        default=None,
        help="also serve the built-in scripted model 'demo' and the 'clock' tool (no key, no network)",
    )
    serve.set_defaults(fn=cmd_serve)

    sub.add_parser("migrate", help="upgrade the database schema").set_defaults(fn=cmd_migrate)

    turns = sub.add_parser("turns", help="inspect turns")
    turns_sub = turns.add_subparsers(dest="action", required=True)
    listing = turns_sub.add_parser("list")
    listing.add_argument("--chat", help="only the turns of this chat (its stored id)")
    listing.add_argument("--status", help="only turns with this status (running, waiting, completed, failed, cancelled, interrupted)")
    listing.add_argument("--limit", type=int, default=100, help="at most this many turns, newest first")
    listing.add_argument("--json", action="store_true", help='one JSON document {"turns": [...]} (epoch seconds)')
    show = turns_sub.add_parser("show")
    show.add_argument("turn_id", help="the turn (turn_…)")
    show.add_argument("--json", action="store_true", help="the projected turn as JSON (as GET /v1/turns/ID)")
    events = turns_sub.add_parser("events")
    events.add_argument("turn_id", help="the turn (turn_…)")
    events.add_argument("--after", type=int, default=0, help="only the events after this seq")
    events.add_argument("--follow", action="store_true", help="keep printing new events until the turn ends")
    turns.set_defaults(fn=cmd_turns)

    replay = sub.add_parser("replay", help="re-project a turn from its log and compare it with the stored view")
    replay.add_argument("turn_id", help="the turn (turn_…)")
    replay.add_argument("--json", action="store_true", help="the re-projected turn as one JSON document (as GET /v1/turns/ID)")
    replay.set_defaults(fn=cmd_replay)

    verify = sub.add_parser("verify", help="check a turn's hash chain and re-run its engine against its recorded results; or check an exported file")
    verify.add_argument("turn_id", nargs="?")
    verify.add_argument("--file", help="an exported turn (turnlog export) to check offline, no database ('-': stdin)")
    verify.add_argument("--public-key", help="with --file: a PEM Ed25519 public key the receipt's signature must match")
    verify.add_argument("--json", action="store_true", help="one JSON document: ok, event counts, diff")
    verify.set_defaults(fn=cmd_verify)

    fork_cli.register(sub)
    export = sub.add_parser("export", help="a turn's events with their hashes as JSON lines (its receipt first)")
    export.add_argument("turn_id", help="the turn (turn_…)")
    export.set_defaults(fn=cmd_export)

    keys = sub.add_parser("keys", help="API keys")
    keys_sub = keys.add_subparsers(dest="action", required=True)
    create = keys_sub.add_parser("create")
    create.add_argument("--user", required=True, help="the user the key acts as")
    create.add_argument("--role", choices=ROLES, default="user", help="admin: also the operator's endpoints (/metrics); default: user")
    create.add_argument("--requests-per-minute", type=_positive, default=None, metavar="N", help="turns this key may start per UTC minute (default: no limit)")
    create.add_argument("--tokens-per-day", type=_positive, default=None, metavar="N", help="tokens this key's turns may spend per UTC day (default: no limit)")
    keys_sub.add_parser("receipt-public", help="the public key (PEM) of TURNLOG_RECEIPT_KEY, to check signed receipts")
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
