"""The documentation site's reference pages are generated from the code
(scripts/gen_reference.py): settings, event types, the CLI and the HTTP
endpoints. A change to any of them without regenerating fails here."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from adapters.config import Settings
from engine.events import EVENT_TYPES

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = ROOT / "docs" / "reference"


def test_the_generated_reference_pages_are_current() -> None:
    done = subprocess.run([sys.executable, "scripts/gen_reference.py", "--check"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_setting_is_described_and_listed() -> None:
    page = (REFERENCE / "settings.md").read_text()
    for name, field in Settings.model_fields.items():
        assert field.description, f"Settings.{name} has no description"
        assert f"`TURNLOG_{name.upper()}`" in page


def test_every_event_type_is_listed() -> None:
    page = (REFERENCE / "events.md").read_text()
    for type_name in EVENT_TYPES:
        assert f"## `{type_name}`" in page
