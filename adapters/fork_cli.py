"""``turnlog fork``: the command-line form of ``POST /v1/turns/{id}/fork``.

The fork runs in this process, with the service's configuration (upstreams,
tools, filters...), to its end; then its ids and status are printed."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

from adapters.config import Settings


def register(sub: Any) -> None:
    fork = sub.add_parser("fork", help="continue a finished turn from one of its events, as a new turn in a new chat")
    fork.add_argument("turn_id", help="the finished turn to fork")
    fork.add_argument("--at", type=int, required=True, help="the seq of the parent's model.requested or tools.batch to start from")
    fork.add_argument("--model", help="the model the fork calls (an id of GET /v1/models); default: the parent's")
    fork.add_argument(
        "--tool-result",
        nargs=2,
        action="append",
        metavar=("CALL_ID", "OUTPUT"),
        default=[],
        help="record OUTPUT as the result of the call CALL_ID of the batch at --at instead of running it (repeatable)",
    )
    fork.add_argument(
        "--demo",
        action="store_true",
        default=None,
        help="also offer the built-in scripted model 'demo' and the 'clock' tool, as serve --demo (to fork a demo turn)",
    )
    fork.set_defaults(fn=cmd_fork)


def cmd_fork(settings: Settings, args: argparse.Namespace) -> int:
    from aiohttp import web

    from adapters.http.app import create_app
    from adapters.http.context import SERVICES
    from engine.run.fork import ForkError
    from engine.run.supervisor import TurnConflict

    async def run() -> int:
        # This process runs the fork only: interrupted turns are left to the service.
        app = create_app(settings.model_copy(update={"auto_resume": False}))
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        try:
            svc = app[SERVICES]
            if args.model is not None and await svc.catalog.resolve(args.model) is None:
                print(f"turnlog: model '{args.model}' not found (GET /v1/models lists the models)", file=sys.stderr)
                return 1
            try:
                actor = await svc.supervisor.fork(args.turn_id, at=args.at, model=args.model, tool_results=dict(args.tool_result))
            except KeyError:
                print(f"turnlog: no turn {args.turn_id}", file=sys.stderr)
                return 1
            except (TurnConflict, ForkError) as exc:
                print(f"turnlog: cannot fork turn {args.turn_id}: {exc}", file=sys.stderr)
                return 1
            await asyncio.shield(actor.done)
            status = actor.view.status
            sys.stdout.write(json.dumps({"turn_id": actor.turn_id, "chat_id": actor.view.chat_id, "status": status}) + "\n")
            if status != "completed":
                error = str((actor.view.error or {}).get("message") or "")
                print(f"turnlog: the fork {actor.turn_id} ended {status}{': ' + error if error else ''}", file=sys.stderr)
                return 1
            return 0
        finally:
            await runner.cleanup()

    return asyncio.run(run())
