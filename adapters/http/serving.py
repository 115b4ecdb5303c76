"""``turnlog serve``'s process loop: listen, then drain on SIGTERM (docs/guides/drain-and-faults.md).

``aiohttp.web.run_app`` stops listening at the first SIGTERM, so a client that
starts a turn during a restart gets a refused connection and the running turns
are cut at once. Here the signal starts a *drain* instead: the socket stays
open and every request that would start a turn is answered 503 with
``Retry-After`` (``/healthz`` too, so a load balancer moves on), the running
turns get ``drain_seconds`` to finish, and the supervisor then releases the
rest so that another instance resumes them at once. A second signal cuts the
wait short. Only then does the server stop.

With ``TURNLOG_REUSE_PORT`` the other processes on the port are that other
instance, and the kernel spreads new connections over every socket listening
on it: this one stops listening when the drain begins, so that new
connections go to them rather than to a 503 here. (Connections this process
accepted stay open; their next request to start a turn gets the 503, which
closes the connection.)
"""

from __future__ import annotations

import asyncio
import logging
import signal

from aiohttp import web

from adapters.http.context import SERVICES

log = logging.getLogger("turnlog")

#: Seconds the server waits, after the drain, for the handlers still streaming.
SHUTDOWN_SECONDS = 5.0


async def drain(app: web.Application, seconds: float, hurry: asyncio.Event | None = None) -> list[str]:
    """Drain the app's supervisor; ``hurry`` set (a second signal) ends the wait early.
    Returns the ids of the turns released unfinished."""
    services = app.get(SERVICES)
    if services is None:
        return []
    supervisor = services.supervisor
    supervisor.draining = True
    running = len(supervisor.actors)
    log.info("draining: %d running turns get up to %g s to finish", running, seconds)
    wait = asyncio.ensure_future(supervisor.drain(seconds))
    if hurry is not None:
        hurried = asyncio.ensure_future(hurry.wait())
        await asyncio.wait((wait, hurried), return_when=asyncio.FIRST_COMPLETED)
        if not wait.done():
            log.info("draining cut short by a second signal")
            wait.cancel()
            try:
                await wait
            except asyncio.CancelledError:
                pass
            hurried.cancel()
            return await supervisor.release_all()
        hurried.cancel()
    released = await wait
    log.info("drained: %d turns finished here, %d released to another instance", running - len(released), len(released))
    return released


async def _serve(app: web.Application, host: str, port: int, drain_seconds: float, backlog: int, reuse_port: bool) -> None:
    runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=SHUTDOWN_SECONDS)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port, backlog=backlog, reuse_port=reuse_port or None)
        await site.start()
        loop = asyncio.get_running_loop()
        stop, hurry = asyncio.Event(), asyncio.Event()

        def on_signal() -> None:
            (hurry if stop.is_set() else stop).set()

        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, on_signal)
        await stop.wait()
        if reuse_port:
            await site.stop()
            log.info("stopped listening: the other processes on port %d take the new connections", port)
        await drain(app, drain_seconds, hurry)
    finally:
        await runner.cleanup()


def serve(
    app: web.Application,
    *,
    host: str,
    port: int,
    loop: asyncio.AbstractEventLoop,
    drain_seconds: float,
    backlog: int = 128,
    reuse_port: bool = False,
) -> None:
    """Run ``app`` on ``loop`` until SIGTERM/SIGINT, then drain and stop."""
    asyncio.set_event_loop(loop)
    try:
        loop.run_until_complete(_serve(app, host, port, drain_seconds, backlog, reuse_port))
    finally:
        try:
            tasks = [t for t in asyncio.all_tasks(loop) if not t.done()]
            for task in tasks:
                task.cancel()
            if tasks:
                loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            asyncio.set_event_loop(None)
            loop.close()
