"""A test whose real part (PostgreSQL, a browser, a model server) is missing
is skipped on a developer machine that left it out on purpose, and fails in
CI, which installs everything: nothing passes there by not running."""

from __future__ import annotations

import pytest

from tests.pg import unavailable


@pytest.mark.parametrize("ci", ["true", None])
def test_a_missing_real_part_fails_in_ci_and_skips_elsewhere(ci: str | None, monkeypatch: pytest.MonkeyPatch) -> None:
    if ci is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", ci)
    with pytest.raises((pytest.fail.Exception, pytest.skip.Exception), match="no server here") as outcome:
        unavailable("no server here")
    assert outcome.type is (pytest.fail.Exception if ci else pytest.skip.Exception)
