"""POSTing JSON to an outbound model API (an embedding model, a reranker):
its key as a bearer header and never in a message, connect and read
timeouts on every request (a caller's session may carry others), one lazy
session, and every failure (HTTP status, timeout, lost connection) as one
error naming where it happened."""

from __future__ import annotations

from collections.abc import Callable

import aiohttp
import orjson

from adapters.client_session import LazySession
from adapters.providers.http_base import MAX_ERROR_BODY, error_text_from_obj, truncate

MAX_MESSAGE = 300  # chars of a server's error text kept in a message


class JsonApi:
    def __init__(
        self,
        *,
        api_key: str | None,
        connect_timeout: float,
        read_timeout: float,
        session: aiohttp.ClientSession | None,
        error: Callable[[str], Exception],
    ) -> None:
        self.api_key = api_key or None
        self._make_error = error
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self._timeout = aiohttp.ClientTimeout(total=None, connect=None, sock_connect=connect_timeout, sock_read=read_timeout)
        self._session = LazySession(self._timeout, session)
        self._headers = {"Accept": "application/json", "Content-Type": "application/json"}
        if self.api_key:
            self._headers["Authorization"] = f"Bearer {self.api_key}"

    async def close(self) -> None:
        """Close the session made here (a caller's stays open)."""
        await self._session.close()

    def error(self, message: str) -> Exception:
        """The caller's error for ``message``, the key masked."""
        if self.api_key and self.api_key in message:
            message = message.replace(self.api_key, "***")
        return self._make_error(message)

    async def post(self, url: str, body: object, where: str) -> bytes:
        """The answer body of a 2xx; anything else raises the caller's error,
        prefixed with ``where``."""
        try:
            session = self._session.get()
        except RuntimeError as exc:
            raise self.error(f"{where}: {exc}") from None
        stage = "waiting for the answer"
        try:
            async with session.post(url, data=orjson.dumps(body), headers=self._headers, timeout=self._timeout) as resp:
                stage = "reading the answer"
                if resp.status >= 400:
                    raise self.error(f"{where}: HTTP {resp.status}{await _error_detail(resp)}")
                return await resp.read()
        except aiohttp.ClientConnectorError as exc:
            if isinstance(exc.os_error, TimeoutError):
                raise self.error(f"{where}: connect timed out after {self.connect_timeout:g}s") from None
            raise self.error(f"{where}: cannot connect: {exc}") from None
        except TimeoutError as exc:  # aiohttp's timeouts are TimeoutErrors too
            if isinstance(exc, aiohttp.ConnectionTimeoutError):
                raise self.error(f"{where}: connect timed out after {self.connect_timeout:g}s") from None
            raise self.error(f"{where}: timed out: nothing received for {self.read_timeout:g}s ({stage})") from None
        except (aiohttp.ClientError, OSError) as exc:
            raise self.error(f"{where}: connection lost ({stage}): {str(exc) or type(exc).__name__}") from None


async def _error_detail(resp: aiohttp.ClientResponse) -> str:
    """``": <the error's message>"`` from an error answer, or ``""``."""
    try:
        raw = await resp.content.read(MAX_ERROR_BODY)
    except (TimeoutError, aiohttp.ClientError, OSError):
        raw = b""
    text: str | None = None
    try:
        text = error_text_from_obj(orjson.loads(raw)) if raw else None
    except ValueError:
        text = None
    if text is None:
        text = raw.decode("utf-8", "replace").strip() or (resp.reason or "")
    text = " ".join(text.split())
    return f": {truncate(text, MAX_MESSAGE)}" if text else ""
