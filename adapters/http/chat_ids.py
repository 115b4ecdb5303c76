"""Chat ids scoped per user, at the HTTP and WebSocket edge.

A client chooses its chat ids (``chat_id`` in a turn request). With auth on,
users must not share one namespace of them: a user would learn from a 404 that
another's id exists, and could take an id first. So the id stored — in the
log, the turn and chat rows — is the client's id behind a prefix derived from
the user's id (``u`` + 16 hex digits of its sha256 + ``:``), and every surface
shows its owner the id it chose: the prefix is taken off again. Nothing inside
the service knows about it; only the edge translates.

Chats created before the scoping keep their stored ids: a client id resolves
to the scoped chat if there is one, else to a chat of that exact id that the
caller owns, else to a new scoped chat. Ids the service made itself
(``chat_…``, forks) are not prefixed and show as stored. With auth off there
is one user and no prefix. The operator's tools (the CLI) show stored ids.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from adapters.http.auth import SCOPED, USER
from engine.ports import EventStore


def user_prefix(user_id: str) -> str:
    """The prefix of ``user_id``'s chat ids (within the id syntax clients use)."""
    return "u" + hashlib.sha256(user_id.encode()).hexdigest()[:16] + ":"


@dataclass(frozen=True)
class ChatIds:
    """One caller's view of chat ids: ``stored`` on the way in, ``shown`` out."""

    user_id: str
    prefix: str = ""

    @classmethod
    def of(cls, request: web.Request) -> ChatIds:
        user = request[USER]
        return cls(user, user_prefix(user) if request.get(SCOPED) else "")

    def shown(self, chat_id: str | None) -> str | None:
        """The id the client knows for a stored ``chat_id``."""
        if chat_id and self.prefix and chat_id.startswith(self.prefix):
            return chat_id[len(self.prefix) :]
        return chat_id

    def candidates(self, chat_id: str) -> list[str]:
        """The stored ids a client's ``chat_id`` may name (scoped first)."""
        return [self.prefix + chat_id, chat_id] if self.prefix else [chat_id]

    async def stored(self, store: EventStore, chat_id: str) -> str:
        """The stored id of the client's ``chat_id``: its scoped chat, an older
        unscoped chat of the caller's, or (neither exists) a new scoped id."""
        if not self.prefix:
            return chat_id
        scoped = self.prefix + chat_id
        if await store.get_chat(scoped) is not None:
            return scoped
        older = await store.get_chat(chat_id)
        if older is not None and older.user_id == self.user_id:
            return chat_id
        return scoped

    def event(self, event: dict[str, Any]) -> dict[str, Any]:
        """A public event (``{"type", "data", …}``) with the chat ids its data
        holds shown (``turn.started`` names the chat, and its request may)."""
        data = event.get("data")
        if event.get("type") != "turn.started" or not self.prefix or not isinstance(data, dict):
            return event
        data = {**data, "chat_id": self.shown(data.get("chat_id"))}
        request = data.get("request")
        if isinstance(request, dict) and request.get("chat_id"):
            data["request"] = {**request, "chat_id": self.shown(request["chat_id"])}
        return {**event, "data": data}

    def view(self, public: dict[str, Any]) -> dict[str, Any]:
        """A public turn view (or any object with a ``chat_id``), chat id shown."""
        if self.prefix and public.get("chat_id"):
            return {**public, "chat_id": self.shown(public["chat_id"])}
        return public
