"""Fetching pages for the model, without letting it reach our own network.

A URL the model picks (``fetch_url``, a search result) is attacker-controlled: a
naive fetch of ``http://169.254.169.254/latest/meta-data/`` hands it the cloud
credentials of the host, and ``http://localhost:5432`` probes the database.
``SafeFetcher`` therefore, for the first request and for every redirect hop:

1. accepts ``http`` and ``https`` only;
2. resolves the host itself, **all** its addresses (a name with one public and
   one private address is refused: the connection could go to either);
3. refuses if any address is loopback, private (RFC 1918, ULA ``fc00::/7``),
   link-local (``169.254/16`` with the metadata address, ``fe80::/10``),
   unspecified, multicast, reserved, shared (CGNAT ``100.64/10``) or otherwise
   not globally routable, judging an IPv6 address that embeds an IPv4 one
   (``::ffff:a.b.c.d``, 6to4, NAT64) by that IPv4 address; unless the host name
   or the address is in the operator's ``fetch_allow`` list;
4. connects to exactly the addresses it checked: a resolver handed to aiohttp
   answers with them, so a rebinding DNS server cannot give the connection a
   second, different answer. The URL keeps the host name, so the ``Host``
   header and the TLS SNI / certificate check use the name.

Numeric spellings of addresses (``http://2130706433/``, ``http://0x7f.1/``)
need no special parsing: the resolver turns them into the address they mean
(here ``127.0.0.1``), which step 3 refuses.

Redirects are followed by hand (at most ``max_redirects``), each hop checked
as above. The body is read up to ``max_bytes`` (decompressed: a gzip bomb stops
there too) and the page marked ``truncated`` beyond; a page has ``timeout``
seconds for everything (redirects included), and ``fetch_many`` a total.

HTML becomes text with `inscriptis <https://github.com/weblyzard/inscriptis>`_:
it renders the layout a reader sees (paragraphs, lists, tables as aligned
columns) instead of stripping tags into a run-on line, keeps every part of the
page (no "main content" guess that drops what the model asked about, unlike
trafilatura), is Apache-2.0 (html2text is GPL-3.0, which this Apache-2.0
project cannot ship), maintained, and pure Python over lxml, which parses
broken real-world HTML. Other text types are returned as they are; binary types
are refused before their body is read.
"""

from __future__ import annotations

import asyncio
import codecs
import ipaddress
import re
import socket
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import aiohttp
from aiohttp import hdrs
from aiohttp.abc import AbstractResolver, ResolveResult
from inscriptis import Inscriptis
from lxml.etree import ParserError  # type: ignore[import-untyped]
from lxml.html import document_fromstring  # type: ignore[import-untyped]
from yarl import URL

from engine.ports import FetchRefused, Page, WebError

if TYPE_CHECKING:
    from adapters.config import Settings

__all__ = ["AllowList", "SafeFetcher", "blocked_reason", "html_to_text", "open_fetcher"]

Address = ipaddress.IPv4Address | ipaddress.IPv6Address

REDIRECTS = frozenset({301, 302, 303, 307, 308})
USER_AGENT = "turnlog-fetch/0.1 (+https://github.com/turnlog)"
ACCEPT = "text/html,application/xhtml+xml,text/plain;q=0.9,*/*;q=0.5"

_RFC1918 = tuple(ipaddress.ip_network(n) for n in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"))
_CGNAT = ipaddress.ip_network("100.64.0.0/10")
_METADATA = frozenset(ipaddress.ip_address(a) for a in ("169.254.169.254", "fd00:ec2::254"))
_NAT64 = ipaddress.ip_network("64:ff9b::/96")


# -- which addresses ------------------------------------------------------------------


def _embedded_v4(addr: Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address stands for, where the packets would
    really go: IPv4-mapped (``::ffff:127.0.0.1`` is a socket to 127.0.0.1 on a
    dual-stack host), 6to4 (``2002:7f00:1::``) and NAT64 (``64:ff9b::7f00:1``)."""
    if not isinstance(addr, ipaddress.IPv6Address):
        return None
    if addr.ipv4_mapped is not None:
        return addr.ipv4_mapped
    if addr.sixtofour is not None:
        return addr.sixtofour
    if addr in _NAT64:
        return ipaddress.IPv4Address(int(addr) & 0xFFFFFFFF)
    return None


def blocked_reason(addr: Address) -> str | None:
    """Why a fetch may not connect to ``addr`` (None: it is a public address).

    Named categories first, so the model and the operator read a precise
    reason; then anything Python does not call globally routable (benchmark,
    documentation and other special-purpose ranges)."""
    inner = _embedded_v4(addr)
    if inner is not None:
        why = blocked_reason(inner)
        if why is not None:
            return f"{why} ({inner} inside {addr})"
        if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
            return None  # a mapped public IPv4 address is that address
        if addr in _NAT64:
            return None  # NAT64 of a public IPv4 address: a normal IPv6-only network
    if addr.is_unspecified:
        return "an unspecified address"
    if addr.is_loopback:
        return "a loopback address"
    if addr in _METADATA:
        return "a link-local address (the cloud metadata service)"
    if addr.is_link_local:
        return "a link-local address"
    if addr.is_multicast:
        return "a multicast address"
    if isinstance(addr, ipaddress.IPv4Address):
        if addr in _CGNAT:
            return "a shared address (carrier-grade NAT, 100.64.0.0/10)"
        if any(addr in net for net in _RFC1918):
            return "a private address (RFC 1918)"
    else:
        if addr in ipaddress.IPv6Network("fc00::/7"):
            return "a private address (unique local, fc00::/7)"
        if addr.is_site_local:
            return "a private address (site-local, fec0::/10)"
    if addr.is_reserved:
        return "a reserved address"
    if addr.is_private or not addr.is_global:
        return "an address that is not globally routable"
    return None


def _parse_address(text: str) -> Address | None:
    try:
        return ipaddress.ip_address(text.split("%", 1)[0])  # drop an IPv6 zone (fe80::1%eth0)
    except ValueError:
        return None


def _normal_host(host: str) -> str:
    """A host name as compared with the allow list: lower case, ASCII (IDNA), no final dot."""
    host = host.strip().rstrip(".").lower()
    try:
        return host.encode("idna").decode("ascii")
    except UnicodeError:
        return host


class AllowList:
    """The operator's exceptions (``fetch_allow``): host names, addresses, networks.

    A host name entry allows that exact name (``*.example.com`` also its
    subdomains, not the bare name) whatever it resolves to; an address or CIDR
    entry allows those addresses whatever name led to them. Nothing is allowed
    by default: reaching a private service must be a decision someone wrote down.
    """

    def __init__(self, entries: Iterable[str] = ()) -> None:
        self.hosts: set[str] = set()
        self.suffixes: list[str] = []
        self.networks: list[ipaddress.IPv4Network | ipaddress.IPv6Network] = []
        for raw in entries:
            entry = raw.strip()
            if not entry:
                continue
            if entry.startswith("[") and entry.endswith("]"):
                entry = entry[1:-1]
            try:
                self.networks.append(ipaddress.ip_network(entry, strict=False))
                continue
            except ValueError:
                pass
            name = entry[2:] if entry.startswith("*.") else entry
            if not name or "/" in name or ":" in name or " " in name:
                raise ValueError(f"fetch_allow: {raw!r} is neither a host name, an address nor a CIDR network")
            if entry.startswith("*."):
                self.suffixes.append("." + _normal_host(name))
            else:
                self.hosts.add(_normal_host(name))

    def __bool__(self) -> bool:
        return bool(self.hosts or self.suffixes or self.networks)

    def allows_host(self, host: str) -> bool:
        host = _normal_host(host)
        return host in self.hosts or any(host.endswith(s) for s in self.suffixes)

    def allows_address(self, addr: Address) -> bool:
        candidates: list[Address] = [addr]
        inner = _embedded_v4(addr)
        if inner is not None:
            candidates.append(inner)
        return any(a.version == net.version and a in net for a in candidates for net in self.networks)


# -- connecting to what was checked ---------------------------------------------------


class _PinnedResolver(AbstractResolver):
    """aiohttp's resolver for one fetch: answers with the addresses ``SafeFetcher``
    checked for a host, and refuses any host it did not check, so the
    connection never depends on a second DNS answer."""

    def __init__(self) -> None:
        self._pins: dict[str, list[str]] = {}

    def pin(self, host: str, addresses: Sequence[str]) -> None:
        self._pins[host.lower()] = list(addresses)

    async def resolve(self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET) -> list[ResolveResult]:
        addresses = self._pins.get(host.lower())
        if not addresses:
            raise OSError(f"{host} was not checked before connecting")
        out: list[ResolveResult] = []
        for text in addresses:
            addr = _parse_address(text)
            fam = socket.AF_INET6 if addr is not None and addr.version == 6 else socket.AF_INET
            if family not in (socket.AF_UNSPEC, fam):
                continue
            out.append({"hostname": host, "host": text, "port": port, "family": fam, "proto": 0, "flags": socket.AI_NUMERICHOST | socket.AI_NUMERICSERV})
        if not out:
            raise OSError(f"{host}: no checked address of the family asked for")
        return out

    async def close(self) -> None:
        return None


# -- HTML and text ----------------------------------------------------------------------

_HTML_TYPES = frozenset({"text/html", "application/xhtml+xml"})
_TEXT_TYPES = frozenset(
    {
        "application/json",
        "application/xml",
        "application/javascript",
        "application/x-javascript",
        "application/ecmascript",
        "application/x-ndjson",
        "application/yaml",
        "application/x-yaml",
        "application/toml",
        "application/x-sh",
        "application/sql",
        "application/graphql",
    }
)
_META_CHARSET = re.compile(rb"""<meta[^>]+charset\s*=\s*["']?\s*([A-Za-z0-9._:-]+)""", re.IGNORECASE)
_XML_DECL = re.compile(r"^\s*<\?xml[^>]*\?>")
_BLANK_RUNS = re.compile(r"\n{3,}")


def _kind(content_type: str) -> str | None:
    """``html``, ``text`` or None (binary) for a MIME type."""
    if content_type in _HTML_TYPES:
        return "html"
    if content_type.startswith("text/") or content_type in _TEXT_TYPES:
        return "text"
    if content_type.endswith("+xml") or content_type.endswith("+json"):
        return "text"
    return None


def _sniff(body: bytes) -> str | None:
    """The kind of a body sent without a Content-Type (as a browser would guess)."""
    head = body[:1024].lstrip(b"\xef\xbb\xbf \t\r\n").lower()
    if head.startswith((b"<!doctype html", b"<html", b"<head", b"<body")):
        return "html"
    if b"\x00" in body[:4096]:
        return None
    try:
        body[:4096].decode("utf-8")
    except UnicodeDecodeError as exc:
        if exc.start < 4090:  # not merely a character cut at the sample's end
            return None
    return "text"


def _decode(body: bytes, charset: str | None, html: bool) -> str:
    """Bytes to text: the header's charset, else an HTML ``<meta charset>``, else
    UTF-8 (falling back to Windows-1252, what untagged legacy pages mostly are)."""
    if charset is None and html:
        match = _META_CHARSET.search(body[:4096])
        if match:
            charset = match.group(1).decode("ascii")
    if charset is not None:
        try:
            codecs.lookup(charset)
        except LookupError:
            charset = None
    if charset is not None:
        return body.decode(charset, errors="replace")
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError as exc:
        if exc.start >= len(body) - 3:  # a character cut by the byte limit
            return body.decode("utf-8", errors="replace")
        return body.decode("cp1252", errors="replace")


def html_to_text(html: str) -> tuple[str, str]:
    """``(title, text)`` of an HTML document: the ``<title>``, and the page as
    inscriptis lays it out (scripts and styles dropped, blank runs squeezed)."""
    html = _XML_DECL.sub("", html, count=1).strip()
    if not html:
        return "", ""
    try:
        tree = document_fromstring(html)
    except ParserError:
        tree = document_fromstring("<pre>" + html + "</pre>")
    title_el = tree.find(".//title")
    title = " ".join((title_el.text_content() if title_el is not None else "").split())
    text = Inscriptis(tree).get_text()
    lines = [line.rstrip() for line in text.splitlines()]
    return title, _BLANK_RUNS.sub("\n\n", "\n".join(lines)).strip()


def _to_text(body: bytes, kind: str, charset: str | None) -> tuple[str, str]:
    text = _decode(body, charset, kind == "html")
    if kind == "html":
        return html_to_text(text)
    return "", text


# -- the fetcher ---------------------------------------------------------------------------


@dataclass(frozen=True)
class _Target:
    url: URL
    host: str  # as the connection will ask for it (ASCII)
    addresses: list[str]


class SafeFetcher:
    """``engine.ports.PageFetcher`` with SSRF protection (see the module docstring).

    ``allow``: ``fetch_allow`` entries (host names, addresses, CIDRs).
    ``timeout``: seconds for one page, redirects and body included.
    ``total_timeout``: the default for ``fetch_many``.
    ``max_bytes``: bytes of body read per page (the rest is cut: ``truncated``).
    ``resolver``: how host names are resolved for the check (default: the
    system's ``getaddrinfo`` in a thread); the connection itself always uses
    the checked answer.

    Each ``fetch`` uses a session of its own, whose connector can only reach
    the addresses that fetch checked: nothing is shared between fetches that a
    later check would have to trust.
    """

    def __init__(
        self,
        *,
        allow: Iterable[str] = (),
        timeout: float = 10.0,
        total_timeout: float = 20.0,
        max_bytes: int = 2 * 1024 * 1024,
        max_redirects: int = 5,
        resolver: AbstractResolver | None = None,
        user_agent: str = USER_AGENT,
    ) -> None:
        self.allow = allow if isinstance(allow, AllowList) else AllowList(allow)
        self.timeout = timeout
        self.total_timeout = total_timeout
        self.max_bytes = max_bytes
        self.max_redirects = max_redirects
        self._resolver = resolver
        self._headers = {hdrs.USER_AGENT: user_agent, hdrs.ACCEPT: ACCEPT, hdrs.ACCEPT_LANGUAGE: "en;q=1.0, *;q=0.5"}

    # -- the port ---------------------------------------------------------------------

    async def fetch(self, url: str) -> Page:
        """The page at ``url`` as text. Raises ``FetchRefused`` (a target it will
        not reach) or ``WebError`` (the page could not be had), each naming the URL."""
        try:
            async with asyncio.timeout(self.timeout):
                return await self._fetch(url)
        except TimeoutError:
            raise WebError(f"{url}: no complete answer within {self.timeout:g} s") from None

    async def fetch_many(self, urls: Sequence[str], total_timeout: float | None = None) -> list[Page | WebError]:
        """Every URL's page (or why not), in the order given, fetched concurrently.

        Each page has its own ``timeout``; all together have ``total_timeout``
        (default: the fetcher's), after which the pages still loading are
        given up and the finished ones kept: one slow site never holds the
        others back."""
        total = self.total_timeout if total_timeout is None else total_timeout
        tasks = [asyncio.ensure_future(self.fetch(u)) for u in urls]
        if not tasks:
            return []
        try:
            _, pending = await asyncio.wait(tasks, timeout=total)
        finally:
            for task in tasks:
                if not task.done():
                    task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        out: list[Page | WebError] = []
        for url, task in zip(urls, tasks):
            if task in pending:
                out.append(WebError(f"{url}: not fetched within the total {total:g} s of this search"))
                continue
            exc = task.exception()
            if exc is None:
                out.append(task.result())
            elif isinstance(exc, WebError):
                out.append(exc)
            else:
                raise exc
        return out

    # -- the work ----------------------------------------------------------------------

    async def _fetch(self, url: str) -> Page:
        pinned = _PinnedResolver()
        connector = aiohttp.TCPConnector(resolver=pinned, use_dns_cache=False, force_close=True)
        async with aiohttp.ClientSession(connector=connector, headers=self._headers, trust_env=False) as session:
            current = self._parse(url, url)
            for hop in range(self.max_redirects + 1):
                target = await self._check(current, url)
                pinned.pin(target.host, target.addresses)
                try:
                    async with session.get(target.url, allow_redirects=False) as resp:
                        location = resp.headers.get(hdrs.LOCATION)
                        if resp.status in REDIRECTS and location:
                            if hop == self.max_redirects:
                                raise FetchRefused(f"refused to fetch {url}: too many redirects (more than {self.max_redirects})")
                            current = self._parse(location, url, base=target.url)
                            continue
                        if resp.status >= 400:
                            raise WebError(f"{url}: HTTP {resp.status} {resp.reason or ''}".rstrip())
                        return await self._read(url, target.url, resp)
                except aiohttp.ClientConnectorCertificateError as exc:
                    raise WebError(f"{url}: TLS certificate of {target.host} not valid ({exc.certificate_error})") from None
                except aiohttp.ClientConnectorError as exc:
                    raise WebError(f"{url}: cannot connect to {target.host}: {exc.os_error.strerror or exc.os_error}") from None
                except aiohttp.ClientPayloadError:
                    raise WebError(f"{url}: the server broke off the body") from None
                except aiohttp.ClientError as exc:
                    raise WebError(f"{url}: {type(exc).__name__}: {exc}") from None
        raise AssertionError("unreachable")  # the loop returns or raises

    def _parse(self, text: str, asked: str, base: URL | None = None) -> URL:
        """An absolute http(s) URL (a redirect's ``Location`` joined to its page), without its fragment."""
        try:
            url = URL(text)
            if base is not None:
                url = base.join(url)
        except (ValueError, TypeError):
            raise WebError(f"{asked}: not a valid URL ({text!r})") from None
        if url.scheme not in ("http", "https"):
            where = "" if base is None else f" (redirect to {text})"
            raise FetchRefused(f"refused to fetch {asked}: only http and https URLs are fetched, not {url.scheme or 'no scheme'!r}{where}")
        if not url.raw_host:
            raise WebError(f"{asked}: the URL has no host")
        return url.with_fragment(None)

    async def _check(self, url: URL, asked: str) -> _Target:
        """Resolve ``url``'s host, refuse it if any address is off limits, and
        return the addresses to connect to."""
        host = url.raw_host or ""
        port = url.port or (443 if url.scheme == "https" else 80)
        hop = "" if str(url) == asked else f" (redirected to {url})"
        literal = _parse_address(host)
        if literal is not None:
            texts = [host]
        else:
            try:
                # aiohttp's ThreadedResolver binds the running loop: one per lookup.
                resolver = self._resolver or aiohttp.ThreadedResolver()
                results = await resolver.resolve(host, port, family=socket.AF_UNSPEC)
            except OSError as exc:
                raise WebError(f"{asked}: cannot resolve {host}{hop}: {exc.strerror or exc}") from None
            texts = list(dict.fromkeys(r["host"] for r in results))
            if not texts:
                raise WebError(f"{asked}: {host} has no address{hop}")
        if not self.allow.allows_host(host):
            for text in texts:
                addr = _parse_address(text)
                if addr is None:
                    raise FetchRefused(f"{asked}: {host} resolved to {text!r}, which is not an address{hop}")
                why = blocked_reason(addr)
                if why is not None and not self.allow.allows_address(addr):
                    what = f"{host} is {why}" if literal is not None else f"{host} resolves to {addr}, {why}"
                    raise FetchRefused(f"refused to fetch {asked}{hop}: {what}")
        return _Target(url, host, texts)

    async def _read(self, asked: str, final: URL, resp: aiohttp.ClientResponse) -> Page:
        has_type = hdrs.CONTENT_TYPE in resp.headers
        content_type = resp.content_type.lower() if has_type else ""
        kind = _kind(content_type) if has_type else None
        if has_type and kind is None:
            raise WebError(f"{asked}: unsupported content type {content_type} (only HTML and text pages are read)")
        chunks: list[bytes] = []
        size = 0
        truncated = False
        while True:
            chunk = await resp.content.readany()
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
            if size > self.max_bytes:
                truncated = True
                break
        body = b"".join(chunks)[: self.max_bytes]
        if not has_type:
            kind = _sniff(body)
            if kind is None:
                raise WebError(f"{asked}: unsupported content (no content type, and the body is binary)")
            content_type = "text/html" if kind == "html" else "text/plain"
        assert kind is not None
        # Converting a big page takes tens of milliseconds of CPU: off the event loop.
        title, text = await asyncio.to_thread(_to_text, body, kind, resp.charset)
        return Page(
            url=asked,
            final_url=str(final),
            status=resp.status,
            content_type=content_type,
            title=title,
            text=text,
            truncated=truncated,
        )


def open_fetcher(settings: Settings) -> SafeFetcher:
    """The page fetcher the settings describe (``fetch_*``). Raises ``ValueError``
    for a ``fetch_allow`` entry that is not a host, an address or a network."""
    return SafeFetcher(
        allow=settings.fetch_allow,
        timeout=settings.fetch_timeout,
        total_timeout=settings.fetch_total_timeout,
        max_bytes=settings.fetch_max_bytes,
    )
