"""The CI benchmark guard's verdicts (bench/guard.py), on synthetic results."""

from __future__ import annotations

from typing import Any

from bench.guard import judge


def result(**checks: tuple[float | None, str, float]) -> dict[str, Any]:
    return {
        "scenarios": {
            "s": {
                "status": "ok",
                "checks": [{"metric": m, "value": v, "op": op, "target": t} for m, (v, op, t) in checks.items()],
            }
        }
    }


def test_met_targets_are_judged_against_their_large_regression_mark() -> None:
    base = result(rate=(10.0, ">=", 8.0), cost=(4.0, "<=", 5.0))
    assert judge(result(rate=(4.5, ">=", 8.0), cost=(9.0, "<=", 5.0)), base) == []  # slower, not halved
    problems = judge(result(rate=(3.9, ">=", 8.0), cost=(10.5, "<=", 5.0)), base)
    assert len(problems) == 2 and "s.rate" in problems[0] and "s.cost" in problems[1]


def test_a_target_the_baseline_misses_is_judged_against_the_baseline() -> None:
    base = result(ratio=(0.06, ">=", 0.6))
    assert judge(result(ratio=(0.03, ">=", 0.6)), base) == []  # far from 0.6, as the baseline
    assert judge(result(ratio=(0.019, ">=", 0.6)), base) != []  # a third of the baseline: a slip


def test_failed_turns_missing_values_and_errors_fail() -> None:
    base = result(failed_turns=(0.0, "<=", 0.0))
    assert judge(result(failed_turns=(1.0, "<=", 0.0)), base) == ["s: 1.0 failed turns"]
    assert judge(result(cost=(None, "<=", 5.0)), base) != []
    broken = {"scenarios": {"s": {"status": "error", "reason": "boom", "checks": []}}}
    assert judge(broken, base) == ["s: could not be measured (boom)"]


def test_informational_checks_are_not_judged() -> None:
    current = result(ratio=(0.01, ">=", 0.6))
    current["scenarios"]["s"]["checks"][0]["informational"] = True
    assert judge(current, result()) == []


def test_a_scenario_without_baseline_is_judged_against_its_target() -> None:
    """rag_ttfc and rag_tool_loop have no baseline entry: their large-regression
    marks come from the targets (the --quick TTFC with the guard's absolute floor)."""
    base = result()
    ok = result(added_ttfc_ms=(35.0, "<=", 15.0), max_request_bytes_ratio=(2.1, "<=", 1.10))
    assert judge(ok, base) == []  # 35 ms is within the 40 ms floor; 2.1 within 2 x 1.10
    bad = result(added_ttfc_ms=(41.0, "<=", 15.0), max_request_bytes_ratio=(2.3, "<=", 1.10))
    problems = judge(bad, base)
    assert len(problems) == 2 and "no baseline" in problems[0] and "no baseline" in problems[1]
