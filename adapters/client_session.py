"""One ``aiohttp.ClientSession`` per outbound client (search engine, image API,
embedding model), made on first use so a client can be built outside a
running loop, and closed only by whoever made it: a session a caller passes
in (a shared one, a test's) stays open."""

from __future__ import annotations

import aiohttp


class LazySession:
    def __init__(self, timeout: aiohttp.ClientTimeout, session: aiohttp.ClientSession | None = None) -> None:
        self._timeout = timeout
        self._session = session
        self.owned = session is None

    def get(self) -> aiohttp.ClientSession:
        """The session (a new one if ours was closed; a caller's closed one is an error)."""
        if self._session is None or self._session.closed:
            if not self.owned:
                raise RuntimeError("the aiohttp session passed in is closed")
            self._session = aiohttp.ClientSession(timeout=self._timeout)
        return self._session

    async def close(self) -> None:
        if self.owned and self._session is not None:
            session, self._session = self._session, None
            if not session.closed:
                await session.close()
