"""Clients for the fault tests: a streaming client that keeps what it was
shown, and the answer such a client shows (``turnlog.resumed`` notices applied)."""

from __future__ import annotations

import json

from tests.harness import Service, sse_messages

USER = [{"role": "user", "content": "count"}]


async def stream_into(service: Service, ids: list[str], seen: dict[str, bytes]) -> None:
    """A streaming client: its turn id goes to ``ids``, what it was shown to
    ``seen`` as it arrives (the caller cancels it when it is done waiting)."""
    resp = await service.http.post(service.v1 + "/chat/completions", json={"model": "gpt-test", "messages": USER, "stream": True})
    try:
        assert resp.status == 200
        turn_id = resp.headers["X-Turn-Id"]
        ids.append(turn_id)
        seen[turn_id] = b""
        try:
            async for data in resp.content.iter_any():
                seen[turn_id] += data
        except Exception:
            pass
    finally:
        resp.close()


def kept_text(raw: str) -> str:
    """The answer a client shows after reading ``raw`` (an SSE body), applying
    the ``turnlog.resumed`` notices as docs/reconnecting.md says: text a lost
    owner showed but never made durable is cut back to ``content_length``."""
    text = ""
    for _ident, data in sse_messages(raw[: raw.rfind("\n\n") + 2]):
        if data == "[DONE]":
            continue
        chunk = json.loads(data)
        resumed = (chunk.get("turnlog") or {}).get("resumed")
        if resumed:
            text = text[: resumed["content_length"]]
        for choice in chunk.get("choices") or []:
            text += (choice.get("delta") or {}).get("content") or ""
    return text
