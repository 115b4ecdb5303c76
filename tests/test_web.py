"""Web search against real servers on loopback.

* a SearXNG-compatible server (``GET /search?q=&format=json``, SearXNG's JSON);
* a Brave-Search-API-compatible server (``GET /res/v1/web/search``, the key in
  ``X-Subscription-Token``, ``web.results[]``, Brave's error bodies).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web

from adapters.config import load_settings
from adapters.web import BraveSearch, SearxngSearch, open_search
from engine.ports import SearchHit, WebError


async def _start(app: web.Application) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}"


@dataclass
class Servers:
    """The servers' base URLs, what they saw, and the event that frees the held requests."""

    base: str = ""
    port: int = 0
    release: asyncio.Event = field(default_factory=asyncio.Event)
    seen: list[web.Request] = field(default_factory=list)
    hosts: list[str] = field(default_factory=list)
    barrier_waiting: int = 0
    barrier: asyncio.Event = field(default_factory=asyncio.Event)


# -- search: a SearXNG-compatible server ------------------------------------------------------


SEARXNG_RESULTS = [
    {
        "url": "https://turnlog.example/docs",
        "title": "turnlog docs",
        "content": "An <b>event-sourced</b> chat-turn service &amp; more",
        "engine": "duckduckgo",
        "parsed_url": ["https", "turnlog.example", "/docs", "", "", ""],
        "template": "default.html",
        "engines": ["duckduckgo", "brave"],
        "positions": [1, 2],
        "score": 3.0,
        "category": "general",
    },
    {"url": "https://turnlog.example/docs", "title": "duplicate", "content": "", "engine": "brave", "score": 1.0},
    {"url": "magnet:?xt=urn:btih:abc", "title": "not a page", "content": "", "engine": "torrents", "score": 1.0},
    {"url": "http://other.example/a", "title": "Other", "content": "second", "engine": "google", "score": 0.5},
    {"url": "https://third.example/", "title": "", "content": "third", "engine": "google", "score": 0.4},
]


@pytest.fixture
async def searxng() -> AsyncIterator[Servers]:
    state = Servers()

    async def search(request: web.Request) -> web.Response:
        state.seen.append(request)
        q = request.query.get("q", "")
        if request.query.get("format") != "json":
            return web.Response(status=403, text="<html><body>403 Forbidden</body></html>", content_type="text/html")
        if q == "boom":
            return web.Response(status=500, text="Internal Server Error")
        if q == "slow":
            await state.release.wait()
        if q == "garbage":
            return web.Response(text="<html>not json</html>", content_type="text/html")
        if q == "nothing":
            return web.json_response({"query": q, "number_of_results": 0, "results": [], "answers": [], "corrections": [],
                                      "infoboxes": [], "suggestions": [], "unresponsive_engines": [["google", "timeout"], ["brave", "HTTP error"]]})
        return web.json_response({"query": q, "number_of_results": 5, "results": SEARXNG_RESULTS, "answers": [], "corrections": [],
                                  "infoboxes": [], "suggestions": ["turnlog events"], "unresponsive_engines": []})

    app = web.Application()
    app.router.add_get("/search", search)
    runner, state.base = await _start(app)
    try:
        yield state
    finally:
        state.release.set()
        await runner.cleanup()


async def test_searxng_search(searxng: Servers) -> None:
    s = SearxngSearch(searxng.base + "/")
    try:
        hits = await s.search("turnlog events", 5)
        assert hits == [
            SearchHit("turnlog docs", "https://turnlog.example/docs", "An event-sourced chat-turn service & more"),
            SearchHit("Other", "http://other.example/a", "second"),
            SearchHit("https://third.example/", "https://third.example/", "third"),
        ]
        assert await s.search("turnlog", 2) == hits[:2]
        assert {k: searxng.seen[0].query[k] for k in ("q", "format")} == {"q": "turnlog events", "format": "json"}
        assert searxng.seen[0].path == "/search"
    finally:
        await s.close()


async def test_searxng_errors(searxng: Servers) -> None:
    s = SearxngSearch(searxng.base, timeout=0.3)
    try:
        with pytest.raises(WebError, match="SearXNG answered HTTP 500: Internal Server Error"):
            await s.search("boom", 3)
        with pytest.raises(WebError, match="SearXNG did not answer within 0.3 s"):
            await s.search("slow", 3)
        with pytest.raises(WebError, match="SearXNG answered with something that is not JSON"):
            await s.search("garbage", 3)
        with pytest.raises(WebError, match=r"SearXNG found nothing: its engines failed \(google: timeout, brave: HTTP error\)"):
            await s.search("nothing", 3)
    finally:
        await s.close()
    unreachable = SearxngSearch("http://127.0.0.1:1")
    try:
        with pytest.raises(WebError, match="SearXNG is unreachable"):
            await unreachable.search("x", 3)
    finally:
        await unreachable.close()


async def test_searxng_without_the_json_format(searxng: Servers) -> None:
    """A SearXNG whose settings.yml lacks ``json`` answers 403 to every JSON request."""
    app = web.Application()

    async def forbidden(request: web.Request) -> web.Response:
        return web.Response(status=403, text="403 Forbidden", content_type="text/html")

    app.router.add_get("/search", forbidden)
    runner, base = await _start(app)
    s = SearxngSearch(base)
    try:
        with pytest.raises(WebError, match="add json to search.formats in its settings.yml"):
            await s.search("x", 3)
    finally:
        await s.close()
        await runner.cleanup()


# -- search: a Brave-Search-API-compatible server ---------------------------------------------

BRAVE_KEY = "brave-test-key"


def _brave_result(title: str, url: str, description: str) -> dict[str, Any]:
    return {
        "type": "search_result",
        "subtype": "generic",
        "title": title,
        "url": url,
        "description": description,
        "is_source_local": False,
        "is_source_both": False,
        "language": "en",
        "family_friendly": True,
        "profile": {"name": "Example", "url": url, "long_name": "example.com", "img": ""},
        "meta_url": {"scheme": "https", "netloc": "example.com", "hostname": "example.com", "favicon": "", "path": ""},
    }


@pytest.fixture
async def brave() -> AsyncIterator[Servers]:
    state = Servers()

    async def web_search(request: web.Request) -> web.Response:
        state.seen.append(request)
        if request.headers.get("X-Subscription-Token") != BRAVE_KEY:
            return web.json_response(
                {"type": "ErrorResponse", "error": {"id": "e1", "status": 422, "code": "SUBSCRIPTION_TOKEN_INVALID",
                                                    "detail": "The provided subscription token is invalid.", "meta": {}}, "time": 1},
                status=422,
            )
        q = request.query["q"]
        if q == "limited":
            return web.json_response(
                {"type": "ErrorResponse", "error": {"id": "e2", "status": 429, "code": "RATE_LIMITED",
                                                    "detail": "Request rate limit exceeded for plan.", "meta": {}}, "time": 1},
                status=429,
            )
        if q == "empty":
            return web.json_response({"type": "search", "query": {"original": q}, "mixed": {"type": "mixed", "main": []}})
        if q == "broken":
            return web.json_response({"web": {"type": "search", "results": "nope"}})
        decorate = request.query.get("text_decorations", "true") not in ("false", "0")
        em = ("<strong>", "</strong>") if decorate else ("", "")
        results = [_brave_result(f"Result {i}", f"https://example.com/{i}", f"About {em[0]}{q}{em[1]} &#x27;{i}&#x27;") for i in range(20)]
        n = int(request.query.get("count", "20"))
        return web.json_response({
            "type": "search",
            "query": {"original": q, "more_results_available": True},
            "mixed": {"type": "mixed", "main": [{"type": "web", "index": i, "all": False} for i in range(n)]},
            "web": {"type": "search", "results": results[:n], "family_friendly": True},
        })

    app = web.Application()
    app.router.add_get("/res/v1/web/search", web_search)
    runner, state.base = await _start(app)
    try:
        yield state
    finally:
        state.release.set()
        await runner.cleanup()


async def test_brave_search(brave: Servers) -> None:
    s = BraveSearch(BRAVE_KEY, base_url=brave.base + "/res/v1")
    try:
        hits = await s.search("turnlog", 3)
        assert hits == [SearchHit(f"Result {i}", f"https://example.com/{i}", f"About turnlog '{i}'") for i in range(3)]
        req = brave.seen[0]
        assert req.path == "/res/v1/web/search"
        assert dict(req.query) == {"q": "turnlog", "count": "3", "result_filter": "web", "text_decorations": "false"}
        assert req.headers["Accept"] == "application/json"
        assert len(await s.search("many", 50)) == 20 and brave.seen[-1].query["count"] == "20"  # the API's maximum
        assert await s.search("empty", 3) == []
    finally:
        await s.close()


async def test_brave_errors(brave: Servers) -> None:
    wrong = BraveSearch("wrong-key", base_url=brave.base + "/res/v1")
    s = BraveSearch(BRAVE_KEY, base_url=brave.base + "/res/v1")
    try:
        with pytest.raises(WebError, match=r"Brave Search rejected the API key \(HTTP 422\): The provided subscription token is invalid") as info:
            await wrong.search("x", 3)
        assert "wrong-key" not in str(info.value)
        with pytest.raises(WebError, match=r"rate limit or quota reached \(HTTP 429\): Request rate limit exceeded"):
            await s.search("limited", 3)
        with pytest.raises(WebError, match="malformed JSON: web.results is not a list"):
            await s.search("broken", 3)
    finally:
        await wrong.close()
        await s.close()


def test_open_search(monkeypatch: pytest.MonkeyPatch) -> None:
    assert open_search(load_settings()) is None
    monkeypatch.setenv("TURNLOG_WEB_SEARCH_ENGINE", "searxng")
    with pytest.raises(ValueError, match="needs TURNLOG_SEARXNG_URL"):
        open_search(load_settings())
    monkeypatch.setenv("TURNLOG_SEARXNG_URL", "http://127.0.0.1:8888/")
    s = open_search(load_settings())
    assert isinstance(s, SearxngSearch) and s.url == "http://127.0.0.1:8888"
    monkeypatch.setenv("TURNLOG_WEB_SEARCH_ENGINE", "brave")
    with pytest.raises(ValueError, match="needs TURNLOG_WEB_SEARCH_API_KEY"):
        open_search(load_settings())
    monkeypatch.setenv("TURNLOG_WEB_SEARCH_API_KEY", "k")
    b = open_search(load_settings())
    assert isinstance(b, BraveSearch) and b.base_url == "https://api.search.brave.com/res/v1"
    monkeypatch.setenv("TURNLOG_WEB_SEARCH_BASE_URL", "http://127.0.0.1:9/res/v1")
    b = open_search(load_settings())
    assert isinstance(b, BraveSearch) and b.base_url == "http://127.0.0.1:9/res/v1"
