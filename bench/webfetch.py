"""Scenario ``web_fetch``: fetching one search's pages concurrently (``SafeFetcher.fetch_many``).

    python -m bench.webfetch serve [--port 0]          # the page server; prints its base URL
    python -m bench.webfetch drive --url URL [--pages 5] [--delay 0.3] [--kb 30] [--rounds 5]

The page server (its own process) answers ``/page/{i}?delay=S&kb=N`` after S
seconds with an N KB HTML article (headings, paragraphs, links, a list), each
page different. The driver (another process) fetches through ``SafeFetcher``
(``fetch_allow=["127.0.0.1"]``, the server is on loopback) and, per round:

* each page alone, one after another: its own time;
* all pages with ``fetch_many``: the time until the last is text.

The figure is ``fetch_many``'s time minus the slowest page's own time in the
same round: what fetching N pages adds over waiting for the slowest one
(median of the rounds). Sequential fetching would add (N-1) x delay; the target
is <= 50 ms. What is left is the per-page CPU (HTML to text runs in threads, but
under one GIL: the conversions of pages that arrive together queue up), so
``html_to_text_ms`` is reported beside it. Prints ONE JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from typing import TYPE_CHECKING, Any

from aiohttp import web

from bench.procs import BenchError

if TYPE_CHECKING:
    from bench.scenarios import Ctx

WORDS = "event log turn model stream tool result chunk replay fold cancel resume lease durable commit".split()


def article(i: int, kb: int) -> str:
    """About ``kb`` KB of article-like HTML, different for each ``i``."""
    parts = [
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>Page {i}</title>"
        "<style>body{font:14px sans-serif}</style><script>var analytics = {};</script></head><body>"
    ]
    n = 0
    while sum(map(len, parts)) < kb * 1024:
        words = " ".join(WORDS[(i + n + k) % len(WORDS)] for k in range(60))
        parts.append(f"<h2>Section {n}</h2><p>{words} <a href='/page/{n}'>more</a></p><ul><li>{WORDS[n % len(WORDS)]}</li><li><b>{i}</b>.{n}</li></ul>")
        n += 1
    parts.append("</body></html>")
    return "".join(parts)


async def serve(port: int) -> None:
    cache: dict[tuple[int, int], str] = {}

    async def page(request: web.Request) -> web.Response:
        i, kb = int(request.match_info["i"]), int(request.query.get("kb", "30"))
        await asyncio.sleep(float(request.query.get("delay", "0")))  # the page's own latency (what is measured)
        body = cache.setdefault((i, kb), article(i, kb))
        return web.Response(text=body, content_type="text/html")

    app = web.Application()
    app.router.add_get("/page/{i}", page)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    print(f"http://127.0.0.1:{runner.addresses[0][1]}", flush=True)
    await asyncio.Event().wait()  # until the harness stops the process


async def drive(url: str, pages: int, delay: float, kb: int, rounds: int) -> dict[str, Any]:
    from adapters.web.fetch import SafeFetcher, html_to_text
    from engine.ports import Page

    fetcher = SafeFetcher(allow=["127.0.0.1"], timeout=30, total_timeout=60)
    urls = [f"{url}/page/{i}?delay={delay}&kb={kb}" for i in range(pages)]
    await fetcher.fetch_many(urls)  # warm-up: imports, the server's page cache
    added, many_s, slowest_s = [], [], []
    for _ in range(rounds):
        alone = []
        for u in urls:
            t0 = time.perf_counter()
            await fetcher.fetch(u)
            alone.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        results = await fetcher.fetch_many(urls)
        many = time.perf_counter() - t0
        failed = [str(r) for r in results if not isinstance(r, Page)]
        if failed:
            raise RuntimeError(f"fetch_many failed: {failed[:2]}")
        many_s.append(many)
        slowest_s.append(max(alone))
        added.append(many - max(alone))
    html = article(0, kb)
    conv = []
    for _ in range(10):
        t0 = time.perf_counter()
        html_to_text(html)
        conv.append(time.perf_counter() - t0)
    return {
        "pages": pages,
        "delay_s": delay,
        "page_kb": kb,
        "rounds": rounds,
        "added_ms": [round(a * 1000, 2) for a in added],
        "added_ms_median": round(statistics.median(added) * 1000, 2),
        "fetch_many_ms_median": round(statistics.median(many_s) * 1000, 2),
        "slowest_alone_ms_median": round(statistics.median(slowest_s) * 1000, 2),
        "sequential_would_take_ms": round(pages * statistics.median(slowest_s) * 1000, 1),
        "html_to_text_ms": round(statistics.median(conv) * 1000, 2),
    }


def web_fetch(ctx: Ctx) -> dict[str, Any]:
    """The scenario: the page server and the driver, each in its own process."""
    from bench import scenarios as sc  # here, not at import: bench.scenarios imports this module

    rounds = 3 if ctx.quick else 7
    server, url = ctx.procs.start_url_server("webfetch-pages", [sys.executable, "-m", "bench.webfetch", "serve"])
    try:
        proc, lines = ctx.procs.spawn("webfetch-drive", [sys.executable, "-m", "bench.webfetch", "drive", "--url", url, "--rounds", str(rounds)])
        assert lines is not None
        deadline = time.monotonic() + 120
        result = None
        try:
            while (line := lines.get(deadline)) is not None:
                if line.startswith("{"):
                    result = json.loads(line)
        except TimeoutError:
            raise BenchError("webfetch driver took more than 120 s") from None
        finally:
            ctx.procs.stop(proc)
    finally:
        ctx.procs.stop(server)
    if result is None:
        raise BenchError(f"webfetch driver failed:\n{ctx.procs.log_tail('webfetch-drive')}")
    return {
        "status": "ok",
        "checks": [sc.check("added_ms_for_5_pages", result["added_ms_median"], "<=", 50.0)],
        "figures": result,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.webfetch", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve")
    s.add_argument("--port", type=int, default=0)
    d = sub.add_parser("drive")
    d.add_argument("--url", required=True)
    d.add_argument("--pages", type=int, default=5)
    d.add_argument("--delay", type=float, default=0.3)
    d.add_argument("--kb", type=int, default=30)
    d.add_argument("--rounds", type=int, default=5)
    args = p.parse_args(argv)
    if args.cmd == "serve":
        asyncio.run(serve(args.port))
        return 0
    print(json.dumps(asyncio.run(drive(args.url, args.pages, args.delay, args.kb, args.rounds))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
