"""CI's regression guard over a ``python -m bench --quick`` result.

Until every target is met, "below half the target" would fail CI on figures we
already know about; so the guard compares with a committed baseline
(``bench/baseline-quick.json``, a ``--quick`` run on the reference machine)
and fails only on a large slip: a figure worse than the baseline by more than
the allowed factor (3x for costs and times — these shared machines are noisy —
or a third of an "at least" figure), or a check that fails both its target and
the baseline's large-regression mark. A new scenario without a baseline is
reported, not judged.

    python -m bench --quick --json-out quick.json; python -m bench.guard quick.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

BASELINE = Path(__file__).with_name("baseline-quick.json")
FACTOR = 3.0
# Figures that are noise-dominated at --quick size (single runs, tiny samples).
ABSOLUTE_FLOORS = {"added_latency_p50_ms": 10.0, "added_latency_p99_ms": 100.0, "per_chunk_cost_ratio": 2.5, "added_ttfc_ms": 40.0}


def _checks(result: dict) -> dict[tuple[str, str], dict]:
    out = {}
    for name, scenario in result.get("scenarios", {}).items():
        for check in scenario.get("checks", []):
            out[(name, check["metric"])] = check
    return out


def judge(current: dict, baseline: dict) -> list[str]:
    problems = []
    base = _checks(baseline)
    for name, scenario in current.get("scenarios", {}).items():
        if scenario.get("status") == "error":
            problems.append(f"{name}: could not be measured ({scenario.get('reason', 'error')})")
    for key, check in _checks(current).items():
        value, op = check["value"], check["op"]
        if key[1].endswith("failed_turns"):
            if value > 0:
                problems.append(f"{key[0]}: {value:g} failed turns")
            continue
        ref = base.get(key)
        if ref is None:
            print(f"guard: {key[0]}.{key[1]} = {value:g} (no baseline yet)")
            continue
        if op == ">=":
            limit = ref["value"] / FACTOR
            bad = value < limit
        else:
            limit = max(ref["value"] * FACTOR, ABSOLUTE_FLOORS.get(key[1], 0.0))
            bad = value > limit
        status = "REGRESSION" if bad else "ok"
        print(f"guard: {key[0]}.{key[1]} = {value:g} (baseline {ref['value']:g}, limit {limit:g}, target {op} {check['target']:g}): {status}")
        if bad:
            problems.append(f"{key[0]}.{key[1]} = {value:g}, beyond {limit:g} (baseline {ref['value']:g})")
    return problems


def main(argv: list[str] | None = None) -> int:
    args = argv if argv is not None else sys.argv[1:]
    if len(args) != 1:
        print("usage: python -m bench.guard QUICK_RESULT.json", file=sys.stderr)
        return 2
    problems = judge(json.loads(Path(args[0]).read_text()), json.loads(BASELINE.read_text()))
    for problem in problems:
        print(f"guard: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
