"""CI's regression guard over a ``python -m bench --quick`` result.

It fails only on a large slip: a figure beyond its target's large-regression
mark (below half an "at least" target, above twice an "at most" one; noise-
dominated --quick figures have an absolute floor), or any failed turn. A
target that the committed baseline (``bench/baseline-quick.json``, a
``--quick`` run on the reference machine) itself misses by that much — the
long-answer ratio against a byte relay — is judged against the baseline
instead: a third of it for an "at least" figure, 3x for a cost.

    python -m bench --quick --json-out quick.json; python -m bench.guard quick.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

BASELINE = Path(__file__).with_name("baseline-quick.json")
FACTOR = 3.0
# Figures that are noise-dominated at --quick size (single runs, tiny samples).
ABSOLUTE_FLOORS = {
    "added_latency_p50_ms": 10.0,
    "added_latency_p99_ms": 100.0,
    "per_chunk_cost_ratio": 2.5,
    "added_ttfc_ms": 40.0,
    # burst_starts: the TTFC of simultaneous starts is CPU time of a shared core.
    "ttfc_p50_over_floor_ms": 150.0,
    # paced_cpu / burst_cpu: one short round; at 50 streams a start's cost
    # still weighs on the per-chunk figure.
    "paced_cpu_over_relay": 6.0,
    "burst_loop_cpu_over_write_ahead": 6.0,
}


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
        value, op, target = check["value"], check["op"], check["target"]
        if key[1].endswith("failed_turns"):
            if value is None or value > 0:
                problems.append(f"{key[0]}: {value} failed turns")
            continue
        if check.get("informational"):
            print(f"guard: {key[0]}.{key[1]} = {value} (informational, not judged)")
            continue
        if value is None:
            problems.append(f"{key[0]}.{key[1]}: no value")
            continue
        ref = base.get(key)
        floor = ABSOLUTE_FLOORS.get(key[1], 0.0)
        # The target's large-regression mark (half an "at least" target, twice an
        # "at most" one); for a target the baseline itself misses by that much,
        # the baseline's figure with FACTOR instead.
        if op == ">=":
            limit = target / 2
            if ref is not None and ref["value"] is not None and ref["value"] < limit:
                limit = ref["value"] / FACTOR
            bad = value < limit
        else:
            limit = max(2 * target, floor)
            if ref is not None and ref["value"] is not None and ref["value"] > limit:
                limit = max(ref["value"] * FACTOR, floor)
            bad = value > limit
        status = "REGRESSION" if bad else "ok"
        base_txt = f"baseline {ref['value']:g}" if ref is not None and ref["value"] is not None else "no baseline"
        print(f"guard: {key[0]}.{key[1]} = {value:g} ({base_txt}, limit {limit:g}, target {op} {target:g}): {status}")
        if bad:
            problems.append(f"{key[0]}.{key[1]} = {value:g}, beyond {limit:g} ({base_txt}, target {op} {target:g})")
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
