"""The figures tables of bench/README.md and README.md, generated from a results file.

    python -m bench --json-out bench/results/latest.json   # a full run, on a quiet machine
    python -m bench.report                                 # rewrites both tables from it
    python -m bench.report --check                         # exit 1 when a table is stale

Each table sits between two marker comments (``<!-- bench:NAME:start -->`` and
``<!-- bench:NAME:end -->``); everything between them is replaced, so figures
are never edited by hand and one figure never appears with two values.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "latest.json"
BENCH_README = ROOT / "bench" / "README.md"
README = ROOT / "README.md"

# The few checks the top-level README shows (scenario, metric, what it means).
SUMMARY_ROWS = [
    ("ttfc", "added_ttfc_ms", "time to first chunk added over a plain relay (ms)"),
    ("long_answer", "chunks_per_s_ratio_vs_parsing_relay", "long answer: chunks/s ÷ a parsing relay's"),
    ("cpu_per_chunk", "cpu_us_per_chunk", "CPU per relayed chunk (µs)"),
    ("concurrent_paced", "added_latency_p99_ms", "paced turns at once: added latency p99 (ms)"),
    ("append_throughput", "durable_events_per_s", "durable events/s, SQLite group commit"),
    ("replay_fold", "fold_ms", "replay of a 10,000-event turn (ms)"),
    ("tool_loop", "added_ms_per_iteration", "tool loop: added ms per iteration"),
    ("log_size", "log_bytes_per_answer_byte", "log bytes ÷ answer bytes, 1,000-token answer"),
]


def _value(v: float | None) -> str:
    if v is None:
        return "n/a"
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    return f"{v:.3g}"


def _verdict(check: dict[str, Any]) -> str:
    verdict = "met" if check.get("pass") else "missed"
    return verdict + " (informational)" if check.get("informational") else verdict


def _provenance(results: dict[str, Any]) -> str:
    host = results.get("host") or {}
    git = host.get("git") or {}
    commit = git.get("commit", "?") + (" (uncommitted changes)" if git.get("dirty") else "")
    text = (
        f"From `bench/results/latest.json`: a `{results.get('mode', '?')}` run started "
        f"{results.get('started_at', '?')}, commit {commit}, {host.get('cpus', '?')} CPUs, "
        f"Python {host.get('python', '?')}, SQLite {host.get('sqlite', '?')}, {results.get('duration_s', '?')} s."
    )
    if results.get("note"):
        text += f" Note: {results['note']}."
    return text


def bench_table(results: dict[str, Any]) -> str:
    """Every scenario's checks, and why a scenario has none."""
    lines = [_provenance(results), "", "| scenario | check | value | target | |", "|---|---|---|---|---|"]
    for name, scenario in results.get("scenarios", {}).items():
        if scenario.get("status") != "ok":
            reason = (scenario.get("reason") or scenario.get("error") or "").splitlines()
            why = reason[0] if reason else ""
            lines.append(f"| `{name}` | {scenario.get('status')} | – | – | {why} |")
            continue
        for check in scenario.get("checks", []):
            lines.append(f"| `{name}` | `{check['metric']}` | {_value(check['value'])} | {check['op']} {check['target']:g} | {_verdict(check)} |")
    return "\n".join(lines)


def summary_table(results: dict[str, Any]) -> str:
    """The README's few rows, from the same results."""
    checks = {(name, c["metric"]): c for name, s in results.get("scenarios", {}).items() for c in s.get("checks", [])}
    lines = ["| figure | target | measured |", "|---|---|---|"]
    for name, metric, label in SUMMARY_ROWS:
        c = checks.get((name, metric))
        if c is None:
            lines.append(f"| {label} | | not measured |")
        else:
            lines.append(f"| {label} | {c['op']} {c['target']:g} | {_value(c['value'])} ({_verdict(c)}) |")
    mode = results.get("mode", "?")
    commit = ((results.get("host") or {}).get("git") or {}).get("commit", "?")
    lines += ["", f"A `{mode}` run, commit {commit} ([every figure](bench/README.md#latest-figures))."]
    return "\n".join(lines)


def _markers(name: str) -> tuple[str, str]:
    return f"<!-- bench:{name}:start -->", f"<!-- bench:{name}:end -->"


def splice(text: str, name: str, body: str) -> str:
    """``text`` with the block between NAME's markers replaced by ``body``."""
    start, end = _markers(name)
    pattern = re.compile(re.escape(start) + r"\n.*?" + re.escape(end), re.DOTALL)
    if len(pattern.findall(text)) != 1:
        raise ValueError(f"expected one {start} … {end} block")
    return pattern.sub(lambda _: f"{start}\n{body}\n{end}", text)


def targets(results: dict[str, Any]) -> dict[Path, str]:
    """Each document's text as it must be, generated from ``results``."""
    out = {}
    for path, name, body in ((BENCH_README, "figures", bench_table(results)), (README, "summary", summary_table(results))):
        out[path] = splice(path.read_text(), name, body)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.report", description=__doc__.splitlines()[0])
    p.add_argument("--results", type=Path, default=RESULTS, help="the JSON of python -m bench --json-out")
    p.add_argument("--check", action="store_true", help="change nothing; exit 1 if a table differs from the results")
    args = p.parse_args(argv)
    results = json.loads(args.results.read_text())
    stale = []
    for path, text in targets(results).items():
        if path.read_text() == text:
            continue
        stale.append(path)
        if not args.check:
            path.write_text(text)
    if args.check and stale:
        for path in stale:
            print(f"{path.relative_to(ROOT)}: figures differ from {args.results}; run python -m bench.report", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
