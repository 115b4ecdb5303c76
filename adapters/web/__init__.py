"""The web: search engines (``adapters.web.search``), implementing ``engine.ports.WebSearch``."""

from adapters.web.search import BraveSearch, SearxngSearch, open_search

__all__ = ["BraveSearch", "SearxngSearch", "open_search"]
