"""The demo's server tool (``tool_ids: ["clock"]``): what time it is on the server."""

from __future__ import annotations

from datetime import UTC, datetime


class Tools:
    # Reading the clock twice does no harm: after a crash between tool.started
    # and tool.completed, the resumed turn may run it again.
    idempotent = True

    def get_time(self) -> str:
        """The current date and time on the server, in UTC (ISO 8601)."""
        return datetime.now(UTC).replace(microsecond=0).isoformat()
