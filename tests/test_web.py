"""Web search and page fetching against real servers on loopback.

* a SearXNG-compatible server (``GET /search?q=&format=json``, SearXNG's JSON);
* a Brave-Search-API-compatible server (``GET /res/v1/web/search``, the key in
  ``X-Subscription-Token``, ``web.results[]``, Brave's error bodies);
* a page server: HTML, text, JSON, a redirect chain, redirects to private
  targets, a page that never answers, a huge page, binary files.

The page server is on 127.0.0.1, which ``SafeFetcher`` refuses by default: the
tests that read it say so with ``allow=["127.0.0.1"]``, and the SSRF tests
check that without it the same URLs are refused. Requests to the private
addresses under test (169.254.169.254, ::1) are refused before any connection;
names other than ``localhost`` resolve through resolvers written here, to
loopback addresses only.
"""

from __future__ import annotations

import asyncio
import gzip
import ipaddress
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web
from aiohttp.abc import AbstractResolver, ResolveResult

from adapters.config import load_settings
from adapters.web import BraveSearch, SafeFetcher, SearxngSearch, open_fetcher, open_search
from adapters.web.fetch import AllowList, blocked_reason
from engine.ports import FetchRefused, Page, SearchHit, WebError

HUGE_BYTES = 3 * 1024 * 1024
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


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


# -- the page server --------------------------------------------------------------------

PAGE = """<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>The  Turnlog
 Page</title><style>body { color: red }</style><script>var secret = 1;</script></head>
<body><h1>Event sourcing</h1><p>Every step of a turn is an event.</p>
<ul><li>durable</li><li>replayable</li></ul>
<table><tr><th>name</th><th>value</th></tr><tr><td>seq</td><td>42</td></tr></table>
<p>Caf\u00e9 cr\u00e8me</p></body></html>"""


@pytest.fixture
async def pages() -> AsyncIterator[Servers]:
    state = Servers()

    async def page(request: web.Request) -> web.Response:
        state.hosts.append(request.headers.get("Host", ""))
        return web.Response(text=PAGE, content_type="text/html")

    async def plain(request: web.Request) -> web.Response:
        return web.Response(text="just text\nline two", content_type="text/plain")

    async def json_doc(request: web.Request) -> web.Response:
        return web.json_response({"a": 1})

    async def latin1(request: web.Request) -> web.Response:
        return web.Response(
            body="<html><title>Gr\u00fc\u00dfe</title><p>\u00e0 bient\u00f4t</p></html>".encode("latin-1"),
            headers={"Content-Type": "text/html; charset=ISO-8859-1"},
        )

    async def gzipped(request: web.Request) -> web.Response:
        return web.Response(body=gzip.compress(PAGE.encode()), headers={"Content-Type": "text/html; charset=utf-8", "Content-Encoding": "gzip"})

    async def redirect(request: web.Request) -> web.Response:
        n = int(request.match_info["n"])
        if n == 0:
            return web.Response(text=PAGE, content_type="text/html")
        # relative Locations, as most servers send them
        raise web.HTTPFound(f"/redirect/{n - 1}")

    async def to(request: web.Request) -> web.Response:
        raise web.HTTPFound(request.query["loc"])

    async def never(request: web.Request) -> web.Response:
        await state.release.wait()
        return web.Response(text="late", content_type="text/plain")

    async def together(request: web.Request) -> web.Response:
        # Answers only once 5 requests are here at the same time: a fetcher
        # that fetched one page after another would time out on the first.
        state.barrier_waiting += 1
        if state.barrier_waiting >= 5:
            state.barrier.set()
        await state.barrier.wait()
        return web.Response(text=f"<title>page {request.match_info['i']}</title>", content_type="text/html")

    async def huge(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/html; charset=utf-8"})
        await resp.prepare(request)
        block = b"<p>" + b"x" * 1020 + b"</p>"
        try:
            for _ in range(HUGE_BYTES // len(block)):
                await resp.write(block)
        except (ConnectionResetError, ConnectionError):
            pass  # the fetcher stopped reading: that is the point
        return resp

    async def exact(request: web.Request) -> web.Response:
        return web.Response(body=b"y" * int(request.query["n"]), content_type="text/plain")

    async def binary(request: web.Request) -> web.Response:
        return web.Response(body=PNG_MAGIC + b"\x00" * 64, content_type="image/png")

    async def octets(request: web.Request) -> web.Response:
        return web.Response(body=b"\x00\x01\x02", content_type="application/octet-stream")

    async def missing(request: web.Request) -> web.Response:
        raise web.HTTPNotFound()

    app = web.Application()
    app.router.add_get("/page", page)
    app.router.add_get("/plain", plain)
    app.router.add_get("/json", json_doc)
    app.router.add_get("/latin1", latin1)
    app.router.add_get("/gzip", gzipped)
    app.router.add_get("/redirect/{n}", redirect)
    app.router.add_get("/to", to)
    app.router.add_get("/never", never)
    app.router.add_get("/together/{i}", together)
    app.router.add_get("/huge", huge)
    app.router.add_get("/exact", exact)
    app.router.add_get("/binary.png", binary)
    app.router.add_get("/octets", octets)
    app.router.add_get("/missing", missing)
    runner, state.base = await _start(app)
    state.port = runner.addresses[0][1]
    try:
        yield state
    finally:
        state.release.set()
        await runner.cleanup()


def allowed(**kw: Any) -> SafeFetcher:
    """A fetcher that may reach the loopback page server (and nothing else private)."""
    return SafeFetcher(allow=["127.0.0.1"], **kw)


class MapResolver(AbstractResolver):
    """A DNS of our own: each name's answers in turn (the last one repeats), loopback only."""

    def __init__(self, answers: dict[str, list[list[str]]]) -> None:
        self.answers = answers
        self.calls: list[str] = []

    async def resolve(self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET) -> list[ResolveResult]:
        if host not in self.answers:
            raise OSError(socket.EAI_NONAME, "Name or service not known")
        turns = self.answers[host]
        answer = turns[min(self.calls.count(host), len(turns) - 1)]
        self.calls.append(host)
        for a in answer:
            assert ipaddress.ip_address(a).is_loopback  # this test DNS never points off the machine
        return [{"hostname": host, "host": a, "port": port, "family": socket.AF_INET6 if ":" in a else socket.AF_INET, "proto": 0, "flags": 0} for a in answer]

    async def close(self) -> None:
        return None


# -- fetching -----------------------------------------------------------------------------


async def test_html_page_becomes_text_with_its_title(pages: Servers) -> None:
    page = await allowed().fetch(f"{pages.base}/page")
    assert isinstance(page, Page)
    assert (page.status, page.content_type, page.title, page.truncated) == (200, "text/html", "The Turnlog Page", False)
    assert page.url == page.final_url == f"{pages.base}/page"
    assert "Event sourcing" in page.text and "Every step of a turn is an event." in page.text
    assert "* durable" in page.text and "seq" in page.text and "42" in page.text
    assert "Caf\u00e9 cr\u00e8me" in page.text
    assert "secret" not in page.text and "color" not in page.text  # script and style are not text


async def test_text_types_as_they_are_and_charsets_and_gzip(pages: Servers) -> None:
    f = allowed()
    plain = await f.fetch(f"{pages.base}/plain")
    assert (plain.content_type, plain.title, plain.text) == ("text/plain", "", "just text\nline two")
    assert (await f.fetch(f"{pages.base}/json")).text == '{"a": 1}'
    latin = await f.fetch(f"{pages.base}/latin1")
    assert latin.title == "Gr\u00fc\u00dfe" and "\u00e0 bient\u00f4t" in latin.text
    assert (await f.fetch(f"{pages.base}/gzip")).title == "The Turnlog Page"


async def test_binary_is_refused_as_unsupported(pages: Servers) -> None:
    for path, ctype in (("/binary.png", "image/png"), ("/octets", "application/octet-stream")):
        with pytest.raises(WebError, match=f"unsupported content type {ctype}") as info:
            await allowed().fetch(pages.base + path)
        assert not isinstance(info.value, FetchRefused)


async def test_no_content_type_is_sniffed() -> None:
    """A server that sends no Content-Type (aiohttp always adds one, so a raw socket)."""
    bodies = {b"/html": b"<!doctype html><title>sniffed</title><p>hi</p>", b"/bin": b"\x00\x01\x02\x03binary"}

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        line = await reader.readline()
        while (await reader.readline()) not in (b"\r\n", b""):
            pass
        body = bodies[line.split()[1]]
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body))
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        page = await allowed().fetch(f"http://127.0.0.1:{port}/html")
        assert (page.content_type, page.title, page.text) == ("text/html", "sniffed", "hi")
        with pytest.raises(WebError, match="no content type, and the body is binary"):
            await allowed().fetch(f"http://127.0.0.1:{port}/bin")
    finally:
        server.close()
        await server.wait_closed()


async def test_http_error_status_is_a_web_error(pages: Servers) -> None:
    with pytest.raises(WebError, match="HTTP 404"):
        await allowed().fetch(f"{pages.base}/missing")


async def test_huge_page_is_cut_at_max_bytes(pages: Servers) -> None:
    page = await allowed(max_bytes=100_000).fetch(f"{pages.base}/huge")
    assert page.truncated
    assert 90_000 < len(page.text) <= 100_000
    # exactly the limit is not truncated; one byte more is
    assert not (await allowed(max_bytes=5000).fetch(f"{pages.base}/exact?n=5000")).truncated
    cut = await allowed(max_bytes=5000).fetch(f"{pages.base}/exact?n=5001")
    assert cut.truncated and cut.text == "y" * 5000


async def test_redirect_chain_is_followed_up_to_five(pages: Servers) -> None:
    page = await allowed().fetch(f"{pages.base}/redirect/5")
    assert page.final_url == f"{pages.base}/redirect/0" and page.url == f"{pages.base}/redirect/5"
    assert page.title == "The Turnlog Page"
    with pytest.raises(FetchRefused, match=r"too many redirects \(more than 5\)"):
        await allowed().fetch(f"{pages.base}/redirect/6")


async def test_a_page_that_never_answers_times_out(pages: Servers) -> None:
    with pytest.raises(WebError, match="no complete answer within 0.3 s"):
        await allowed(timeout=0.3).fetch(f"{pages.base}/never")


async def test_fetch_many_keeps_the_fast_pages_when_one_hangs(pages: Servers) -> None:
    urls = [f"{pages.base}/page", f"{pages.base}/never", f"{pages.base}/plain", "http://127.0.0.1:1/refused", f"{pages.base}/binary.png"]
    out = await allowed(timeout=30).fetch_many(urls, total_timeout=0.5)
    assert isinstance(out[0], Page) and out[0].title == "The Turnlog Page"
    assert isinstance(out[1], WebError) and "not fetched within the total 0.5 s" in str(out[1])
    assert isinstance(out[2], Page) and out[2].text.startswith("just text")
    assert isinstance(out[3], WebError) and "cannot connect" in str(out[3])
    assert isinstance(out[4], WebError) and "unsupported content type" in str(out[4])
    # the per-page limit applies inside fetch_many as well
    slow = await allowed(timeout=0.3).fetch_many([f"{pages.base}/never", f"{pages.base}/page"], total_timeout=30)
    assert isinstance(slow[0], WebError) and "within 0.3 s" in str(slow[0]) and isinstance(slow[1], Page)
    assert await allowed().fetch_many([]) == []


async def test_fetch_many_fetches_concurrently(pages: Servers) -> None:
    """The server answers none of the 5 until all 5 are waiting: only a concurrent fetcher finishes."""
    out = await allowed(timeout=20).fetch_many([f"{pages.base}/together/{i}" for i in range(5)])
    assert [p.title for p in out if isinstance(p, Page)] == [f"page {i}" for i in range(5)]


# -- SSRF -----------------------------------------------------------------------------------


async def test_private_targets_are_refused_by_default(pages: Servers) -> None:
    f = SafeFetcher()
    port = pages.port
    cases = {
        f"http://127.0.0.1:{port}/page": "127.0.0.1 is a loopback address",
        "http://169.254.169.254/latest/meta-data/": "169.254.169.254 is a link-local address (the cloud metadata service)",
        f"http://[::1]:{port}/page": "::1 is a loopback address",
        f"http://2130706433:{port}/page": "2130706433 resolves to 127.0.0.1, a loopback address",
        f"http://0x7f.1:{port}/page": "0x7f.1 resolves to 127.0.0.1, a loopback address",
        f"http://017700000001:{port}/page": "resolves to 127.0.0.1, a loopback address",
        f"http://localhost:{port}/page": "localhost resolves to 127.0.0.1, a loopback address",
        f"http://[::ffff:127.0.0.1]:{port}/page": "a loopback address (127.0.0.1 inside ::ffff:7f00:1)",
        "http://10.1.2.3/": "a private address (RFC 1918)",
        "http://100.64.0.1/": "carrier-grade NAT",
        "http://0.0.0.0/": "an unspecified address",
        "http://[fd00::1]/": "unique local",
    }
    for url, reason in cases.items():
        with pytest.raises(FetchRefused, match="refused to fetch") as info:
            await f.fetch(url)
        assert reason in str(info.value), (url, str(info.value))
        assert url in str(info.value)
    assert pages.hosts == []  # nothing reached the page server


async def test_allowing_is_explicit(pages: Servers) -> None:
    url = f"{pages.base}/page"
    with pytest.raises(FetchRefused):
        await SafeFetcher().fetch(url)
    with pytest.raises(FetchRefused):  # allowing another address does not allow this one
        await SafeFetcher(allow=["127.0.0.2", "10.0.0.0/8"]).fetch(url)
    for allow in (["127.0.0.1"], ["127.0.0.0/8"], ["localhost"]):
        target = url.replace("127.0.0.1", "localhost") if allow == ["localhost"] else url
        assert (await SafeFetcher(allow=allow).fetch(target)).title == "The Turnlog Page"


async def test_redirect_from_an_allowed_host_to_a_private_address_is_refused(pages: Servers) -> None:
    f = allowed()
    for loc, reason in (
        ("http://169.254.169.254/latest/meta-data/iam/", "169.254.169.254 is a link-local address (the cloud metadata service)"),
        (f"http://[::1]:{pages.port}/page", "::1 is a loopback address"),
        ("http://10.0.0.1/admin", "10.0.0.1 is a private address (RFC 1918)"),
    ):
        with pytest.raises(FetchRefused, match="redirected to") as info:
            await f.fetch(f"{pages.base}/to?loc={loc}")
        assert reason in str(info.value)
    with pytest.raises(FetchRefused, match="only http and https URLs are fetched, not 'file'"):
        await f.fetch(f"{pages.base}/to?loc=file:///etc/passwd")
    assert pages.hosts == []


async def test_schemes_other_than_http_are_refused() -> None:
    for url in ("file:///etc/passwd", "ftp://example.com/x", "gopher://127.0.0.1:6379/_INFO"):
        with pytest.raises(FetchRefused, match="only http and https"):
            await SafeFetcher().fetch(url)


async def test_a_name_with_any_private_address_is_refused(pages: Servers) -> None:
    resolver = MapResolver({"mixed.test": [["127.0.0.1", "127.0.0.2"]]})
    f = SafeFetcher(allow=["127.0.0.1/32"], resolver=resolver)
    with pytest.raises(FetchRefused, match="mixed.test resolves to 127.0.0.2, a loopback address"):
        await f.fetch(f"http://mixed.test:{pages.port}/page")
    assert pages.hosts == []


async def test_connects_to_the_checked_address_only(pages: Servers) -> None:
    """DNS rebinding: the name's first answer is the allowed address, every later
    one another. The fetch asks once and connects to that answer, with the name
    in the Host header; a second lookup (by aiohttp or the system) would either
    land on 127.0.0.2, where nothing listens, or not resolve the name at all."""
    resolver = MapResolver({"rebind.test": [["127.0.0.1"], ["127.0.0.2"]]})
    page = await SafeFetcher(allow=["127.0.0.1"], resolver=resolver).fetch(f"http://rebind.test:{pages.port}/page")
    assert page.title == "The Turnlog Page" and page.final_url == f"http://rebind.test:{pages.port}/page"
    assert resolver.calls == ["rebind.test"]
    assert pages.hosts == [f"rebind.test:{pages.port}"]


async def test_a_host_name_in_the_allow_list_is_allowed_whatever_it_resolves_to(pages: Servers) -> None:
    resolver = MapResolver({"intranet.test": [["127.0.0.1"]], "other.test": [["127.0.0.1"]]})
    f = SafeFetcher(allow=["intranet.test"], resolver=resolver)
    assert (await f.fetch(f"http://intranet.test:{pages.port}/page")).title == "The Turnlog Page"
    with pytest.raises(FetchRefused, match="other.test resolves to 127.0.0.1"):
        await f.fetch(f"http://other.test:{pages.port}/page")
    with pytest.raises(WebError, match="cannot resolve nowhere.test"):
        await f.fetch("http://nowhere.test/")


@pytest.mark.parametrize(
    ("address", "reason"),
    [
        ("127.0.0.1", "a loopback address"),
        ("::1", "a loopback address"),
        ("169.254.169.254", "a link-local address (the cloud metadata service)"),
        ("169.254.1.1", "a link-local address"),
        ("fe80::1", "a link-local address"),
        ("10.0.0.1", "a private address (RFC 1918)"),
        ("172.16.5.4", "a private address (RFC 1918)"),
        ("192.168.1.1", "a private address (RFC 1918)"),
        ("fc00::1", "a private address (unique local, fc00::/7)"),
        ("100.64.0.1", "a shared address (carrier-grade NAT, 100.64.0.0/10)"),
        ("0.0.0.0", "an unspecified address"),
        ("::", "an unspecified address"),
        ("224.0.0.251", "a multicast address"),
        ("ff02::1", "a multicast address"),
        ("240.0.0.1", "a reserved address"),
        ("192.0.2.1", "an address that is not globally routable"),
        ("::ffff:10.0.0.1", "a private address (RFC 1918) (10.0.0.1 inside ::ffff:a00:1)"),
        ("::ffff:169.254.169.254", "the cloud metadata service"),
        ("2002:7f00:1::", "a loopback address (127.0.0.1 inside 2002:7f00:1::)"),
        ("64:ff9b::a9fe:a9fe", "the cloud metadata service"),
        ("8.8.8.8", None),
        ("2606:4700:4700::1111", None),
        ("::ffff:8.8.8.8", None),
        ("64:ff9b::808:808", None),
    ],
)
def test_blocked_reason(address: str, reason: str | None) -> None:
    got = blocked_reason(ipaddress.ip_address(address))
    assert (got is None) if reason is None else (got is not None and reason in got), got


def test_allow_list_entries() -> None:
    allow = AllowList(["127.0.0.1", "10.0.0.0/8", "[fd00::1]", "*.corp.test", "Intranet.Test."])
    assert allow.allows_address(ipaddress.ip_address("10.9.9.9"))
    assert allow.allows_address(ipaddress.ip_address("::ffff:127.0.0.1"))  # the same socket
    assert allow.allows_address(ipaddress.ip_address("fd00::1"))
    assert not allow.allows_address(ipaddress.ip_address("127.0.0.2"))
    assert allow.allows_host("a.corp.test") and not allow.allows_host("corp.test")
    assert allow.allows_host("intranet.test")
    assert not AllowList()
    with pytest.raises(ValueError, match="neither a host name"):
        AllowList(["http://x/"])


def test_fetch_settings_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TURNLOG_FETCH_ALLOW", "127.0.0.1, intranet.test,10.0.0.0/8")
    monkeypatch.setenv("TURNLOG_FETCH_MAX_BYTES", "1234")
    settings = load_settings()
    assert settings.fetch_allow == ["127.0.0.1", "intranet.test", "10.0.0.0/8"]
    f = open_fetcher(settings)
    assert f.allow.allows_host("intranet.test") and f.max_bytes == 1234
    assert (f.timeout, f.total_timeout) == (settings.fetch_timeout, settings.fetch_total_timeout)
    monkeypatch.setenv("TURNLOG_FETCH_ALLOW", "")
    assert not open_fetcher(load_settings()).allow


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
            return web.json_response(
                {
                    "query": q,
                    "number_of_results": 0,
                    "results": [],
                    "answers": [],
                    "corrections": [],
                    "infoboxes": [],
                    "suggestions": [],
                    "unresponsive_engines": [["google", "timeout"], ["brave", "HTTP error"]],
                }
            )
        return web.json_response(
            {
                "query": q,
                "number_of_results": 5,
                "results": SEARXNG_RESULTS,
                "answers": [],
                "corrections": [],
                "infoboxes": [],
                "suggestions": ["turnlog events"],
                "unresponsive_engines": [],
            }
        )

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
                {
                    "type": "ErrorResponse",
                    "error": {
                        "id": "e1",
                        "status": 422,
                        "code": "SUBSCRIPTION_TOKEN_INVALID",
                        "detail": "The provided subscription token is invalid.",
                        "meta": {},
                    },
                    "time": 1,
                },
                status=422,
            )
        q = request.query["q"]
        if q == "limited":
            return web.json_response(
                {
                    "type": "ErrorResponse",
                    "error": {"id": "e2", "status": 429, "code": "RATE_LIMITED", "detail": "Request rate limit exceeded for plan.", "meta": {}},
                    "time": 1,
                },
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
        return web.json_response(
            {
                "type": "search",
                "query": {"original": q, "more_results_available": True},
                "mixed": {"type": "mixed", "main": [{"type": "web", "index": i, "all": False} for i in range(n)]},
                "web": {"type": "search", "results": results[:n], "family_friendly": True},
            }
        )

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
