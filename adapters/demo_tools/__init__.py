"""Tool modules offered by ``turnlog serve --demo``.

Each ``*.py`` file here is an ordinary tool module (``class Tools``, loaded
like those of ``TURNLOG_TOOLS_DIR``; files starting with ``_`` are skipped), so
the demo shows the real tool path: a request with ``tool_ids: ["clock"]``
offers ``get_time`` to the model, the turn records ``tool.started`` before it
runs and ``tool.completed`` with its result.
"""

from pathlib import Path

DEMO_TOOLS_DIR = Path(__file__).resolve().parent
