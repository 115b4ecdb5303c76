"""The generated figures in bench/README.md and README.md against the committed
results file (bench/results/latest.json): a table edited by hand, or a results
file replaced without ``python -m bench.report``, fails here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import report


def test_the_committed_tables_are_generated_from_the_committed_results() -> None:
    results = json.loads(report.RESULTS.read_text())
    for path, text in report.targets(results).items():
        assert path.read_text() == text, f"{path.name} is stale: run python -m bench.report"
    assert report.main(["--check"]) == 0


def test_a_new_figure_in_the_results_makes_the_tables_stale(tmp_path: Path) -> None:
    results = json.loads(report.RESULTS.read_text())
    checks = results["scenarios"]["ttfc"]["checks"]
    checks[0].update(value=123.456, **{"pass": False})
    changed = tmp_path / "latest.json"
    changed.write_text(json.dumps(results))
    before = {p: p.read_text() for p in (report.README, report.BENCH_README)}
    assert report.main(["--check", "--results", str(changed)]) == 1
    assert {p: p.read_text() for p in before} == before  # --check writes nothing
    tables = report.targets(results)
    assert "| `ttfc` | `added_ttfc_ms` | 123 |" in tables[report.BENCH_README]
    assert "| 123 (missed) |" in tables[report.README]


def test_every_figure_of_the_results_is_in_the_bench_table() -> None:
    results = json.loads(report.RESULTS.read_text())
    table = report.bench_table(results)
    for name, scenario in results["scenarios"].items():
        assert f"| `{name}` |" in table
        for check in scenario.get("checks", []):
            assert f"| `{check['metric']}` |" in table


def test_a_document_without_its_markers_is_refused() -> None:
    with pytest.raises(ValueError, match="bench:figures"):
        report.splice("no markers here", "figures", "x")
