"""Loading the behaviour vectors recorded from Open WebUI (``tests/vectors/``)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def vector_dirs() -> list[Path]:
    """Where vector files are looked up: ``TURNLOG_VECTORS_DIR``, then ``tests/vectors/``."""
    dirs: list[Path] = []
    env = os.environ.get("TURNLOG_VECTORS_DIR")
    if env:
        dirs.append(Path(env))
    dirs.append(Path(__file__).parent / "vectors")
    return dirs


def load_vectors(name: str) -> list[dict[str, Any]]:
    for folder in vector_dirs():
        path = folder / name
        if path.is_file():
            return json.loads(path.read_text(encoding="utf-8"))
    raise FileNotFoundError(f"vector file {name} not found in {vector_dirs()}")
