"""The memory store's usage tables read as the SQL stores' are (``UsageStore``)."""

from __future__ import annotations

from adapters.store.memory import MemoryDatabase
from adapters.store.usage import COUNTS, Limits, LocalCounters, UsageRow


class MemoryUsage:
    """:class:`UsageStore` over a :class:`~adapters.store.memory.MemoryDatabase`."""

    def __init__(self, database: MemoryDatabase) -> None:
        self._db = database
        self._local = LocalCounters()

    async def rows(self, user_id: str, since: str | None, until: str | None) -> list[UsageRow]:
        out: dict[tuple[str, str], UsageRow] = {}
        for (user, _key, day, model), counts in self._db.usage_rollup.items():
            if user != user_id or (since is not None and day < since) or (until is not None and day > until):
                continue
            row = out.setdefault((day, model), UsageRow(day, model))
            for c in COUNTS:
                row.counts[c] += counts[c]
        return [out[k] for k in sorted(out)]

    async def tokens_on(self, day: str, key_hash: str | None) -> int:
        return sum(
            c["input_tokens"] + c["output_tokens"]
            for (_user, key, d, _model), c in self._db.usage_rollup.items()
            if d == day and (key_hash is None or key == key_hash)
        )

    async def count_request(self, scope: str, minute: int) -> int:
        return self._local.bump(scope, minute)

    async def key_limits(self, key_hash: str) -> Limits:
        return self._db.key_quotas.get(key_hash, Limits())

    async def set_key_limits(self, key_hash: str, limits: Limits) -> None:
        self._db.key_quotas[key_hash] = limits
