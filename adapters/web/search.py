"""Search engines behind ``engine.ports.WebSearch``: SearXNG and the Brave Search API.

Both answer with ``SearchHit(title, url, snippet)``, http(s) URLs only, each URL
once, at most ``count``. Every way a search can fail (an HTTP status, no answer
in time, a connection error, a body that is not the engine's JSON) raises
``WebError`` whose message says which engine and why, in words the model can
pass on ("Brave Search rejected the API key (HTTP 401)"), never the key.

Why Brave as the hosted API: a plain GET with the key in one header, an
independent index, a documented JSON schema (``web.results[]`` with ``title``,
``url``, ``description``), and a free tier; SearXNG covers self-hosting.

The engine's URL is the operator's (it may well be a SearXNG on the private
network), so these requests do not go through ``SafeFetcher``'s address checks.
"""

from __future__ import annotations

import html
import json
import re
from typing import TYPE_CHECKING, Any

import aiohttp

from adapters.client_session import LazySession
from engine.ports import SearchHit, WebError

if TYPE_CHECKING:
    from adapters.config import Settings

__all__ = ["BRAVE_BASE_URL", "BraveSearch", "SearxngSearch", "open_search"]

BRAVE_BASE_URL = "https://api.search.brave.com/res/v1"
_TAGS = re.compile(r"<[^>]+>")


def _plain(text: Any) -> str:
    """A snippet as plain text: engines send highlighting tags (``<strong>``) and entities."""
    if not isinstance(text, str):
        return ""
    return " ".join(html.unescape(_TAGS.sub("", text)).split())


def _hits(items: list[Any], count: int, snippet_key: str) -> list[SearchHit]:
    out: list[SearchHit] = []
    seen: set[str] = set()
    for item in items:
        if not isinstance(item, dict):
            continue
        url = item.get("url")
        if not isinstance(url, str) or not url.startswith(("http://", "https://")) or url in seen:
            continue
        seen.add(url)
        out.append(SearchHit(title=_plain(item.get("title")) or url, url=url, snippet=_plain(item.get(snippet_key))))
        if len(out) >= count:
            break
    return out


class _JsonSearch:
    """The HTTP part both engines share: one lazily made session, a timeout,
    every failure mapped to a ``WebError`` naming the engine."""

    name = "search"

    def __init__(self, *, timeout: float = 10.0, session: aiohttp.ClientSession | None = None) -> None:
        self.timeout = timeout
        self._session = LazySession(aiohttp.ClientTimeout(total=timeout), session)

    def _client(self) -> aiohttp.ClientSession:
        return self._session.get()

    async def close(self) -> None:
        await self._session.close()

    def _status_error(self, status: int, body: str) -> WebError:
        return WebError(f"{self.name} answered HTTP {status}{_detail(body)}")

    async def _get_json(self, url: str, params: dict[str, str], headers: dict[str, str]) -> dict[str, Any]:
        try:
            async with self._client().get(url, params=params, headers=headers, timeout=aiohttp.ClientTimeout(total=self.timeout)) as resp:
                raw = await resp.read()
                text = raw.decode("utf-8", errors="replace")
                if resp.status != 200:
                    raise self._status_error(resp.status, text)
        except TimeoutError:
            raise WebError(f"{self.name} did not answer within {self.timeout:g} s") from None
        except aiohttp.ClientConnectorError as exc:
            raise WebError(f"{self.name} is unreachable: {exc.os_error.strerror or exc.os_error}") from None
        except aiohttp.ClientError as exc:
            raise WebError(f"{self.name} failed: {type(exc).__name__}: {exc}") from None
        try:
            data = json.loads(text)
        except ValueError:
            raise WebError(f"{self.name} answered with something that is not JSON: {text[:120]!r}") from None
        if not isinstance(data, dict):
            raise WebError(f"{self.name} answered with malformed JSON: an object was expected, got {type(data).__name__}")
        return data


def _detail(body: str) -> str:
    """The useful part of an error body: the engine's own message if it sent JSON."""
    try:
        data = json.loads(body)
    except ValueError:
        text = " ".join(_TAGS.sub(" ", body).split())[:200]
        return f": {text}" if text else ""
    if isinstance(data, dict):
        err = data.get("error")
        if isinstance(err, dict):
            msg = err.get("detail") or err.get("message") or err.get("code")
            if msg:
                return f": {msg}"
        if isinstance(err, str):
            return f": {err}"
    return f": {body[:200]}"


class SearxngSearch(_JsonSearch):
    """A SearXNG instance: ``GET {url}/search?q=...&format=json`` → ``results[]``
    with ``title``, ``url``, ``content``.

    The instance must list ``json`` under ``search.formats`` in its
    ``settings.yml``; it answers 403 otherwise, and the error says so.
    SearXNG has no result-count parameter: the first ``count`` are kept.
    """

    name = "SearXNG"

    def __init__(self, url: str, *, timeout: float = 10.0, session: aiohttp.ClientSession | None = None) -> None:
        super().__init__(timeout=timeout, session=session)
        self.url = url.rstrip("/")

    def _status_error(self, status: int, body: str) -> WebError:
        if status == 403:
            return WebError("SearXNG refused the JSON format (HTTP 403): add json to search.formats in its settings.yml")
        if status == 429:
            return WebError("SearXNG is rate limiting this service (HTTP 429): exempt it in SearXNG's limiter settings")
        return super()._status_error(status, body)

    async def search(self, query: str, count: int) -> list[SearchHit]:
        """Raises ``WebError``."""
        data = await self._get_json(f"{self.url}/search", {"q": query, "format": "json"}, {"Accept": "application/json"})
        results = data.get("results")
        if not isinstance(results, list):
            raise WebError("SearXNG answered with malformed JSON: no results list")
        hits = _hits(results, count, "content")
        if not hits:
            failed = data.get("unresponsive_engines")
            if isinstance(failed, list) and failed:
                names = ", ".join(": ".join(str(x) for x in f) if isinstance(f, list) else str(f) for f in failed[:5])
                raise WebError(f"SearXNG found nothing: its engines failed ({names})")
        return hits


class BraveSearch(_JsonSearch):
    """The Brave Search API: ``GET {base}/web/search?q=...&count=N`` with the key
    in ``X-Subscription-Token`` → ``web.results[]`` with ``title``, ``url``,
    ``description``.

    ``base_url`` defaults to ``https://api.search.brave.com/res/v1`` (a proxy or
    a test server otherwise). ``count`` is capped at 20, the API's maximum.
    """

    name = "Brave Search"

    def __init__(self, api_key: str, *, base_url: str | None = None, timeout: float = 10.0, session: aiohttp.ClientSession | None = None) -> None:
        super().__init__(timeout=timeout, session=session)
        self.base_url = (base_url or BRAVE_BASE_URL).rstrip("/")
        self._key = api_key

    def _status_error(self, status: int, body: str) -> WebError:
        detail = _detail(body).replace(self._key, "***") if self._key else _detail(body)
        # Brave answers a missing or wrong key with 422 and the code SUBSCRIPTION_TOKEN_INVALID.
        if status in (401, 403) or "SUBSCRIPTION_TOKEN" in body:
            return WebError(f"Brave Search rejected the API key (HTTP {status}){detail}")
        if status == 429:
            return WebError(f"Brave Search rate limit or quota reached (HTTP 429){detail}")
        return WebError(f"Brave Search answered HTTP {status}{detail}")

    async def search(self, query: str, count: int) -> list[SearchHit]:
        """Raises ``WebError``."""
        n = max(1, min(count, 20))
        params = {"q": query, "count": str(n), "result_filter": "web", "text_decorations": "false"}
        headers = {"Accept": "application/json", "Accept-Encoding": "gzip", "X-Subscription-Token": self._key}
        data = await self._get_json(f"{self.base_url}/web/search", params, headers)
        web = data.get("web")
        if web is None:
            if data.get("type") == "search":
                return []  # a valid answer without web results
            raise WebError("Brave Search answered with malformed JSON: neither web results nor a search response")
        results = web.get("results") if isinstance(web, dict) else None
        if not isinstance(results, list):
            raise WebError("Brave Search answered with malformed JSON: web.results is not a list")
        return _hits(results, n, "description")


def open_search(settings: Settings) -> SearxngSearch | BraveSearch | None:
    """The search engine the settings name (``web_search_engine``), or None.

    Raises ``ValueError`` when the engine is named without what it needs, so a
    misconfiguration stops the service at start instead of failing each search."""
    engine = settings.web_search_engine
    if engine == "none":
        return None
    if engine == "searxng":
        if not settings.searxng_url:
            raise ValueError("TURNLOG_WEB_SEARCH_ENGINE=searxng needs TURNLOG_SEARXNG_URL")
        return SearxngSearch(settings.searxng_url, timeout=settings.fetch_timeout)
    if engine == "brave":
        key = settings.web_search_api_key.get_secret_value() if settings.web_search_api_key else ""
        if not key:
            raise ValueError("TURNLOG_WEB_SEARCH_ENGINE=brave needs TURNLOG_WEB_SEARCH_API_KEY")
        return BraveSearch(key, base_url=settings.web_search_base_url, timeout=settings.fetch_timeout)
    raise ValueError(f"unknown web_search_engine {engine!r}")
