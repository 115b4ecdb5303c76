"""The web: search engines (``adapters.web.search``) and page fetching with SSRF
protection (``adapters.web.fetch``), implementing ``engine.ports.WebSearch`` and
``engine.ports.PageFetcher``."""

from adapters.web.fetch import SafeFetcher, open_fetcher
from adapters.web.search import BraveSearch, SearxngSearch, open_search

__all__ = ["BraveSearch", "SafeFetcher", "SearxngSearch", "open_fetcher", "open_search"]
