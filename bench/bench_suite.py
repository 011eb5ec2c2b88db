"""The test suite's wall time from its measured durations: the table the scheduler reads, and its estimate (issue 45).

    pytest -q -n 2 -p no:cacheprovider --durations=0 > durations.txt      # a profile of the whole suite
    python -m bench.bench_suite table durations.txt                     # -> tests/durations.json
    python -m bench.bench_suite estimate [--workers 2]                   # the schedule's wall time from that table
    python -m bench.bench_suite fresh [--workers 2]                      # time the suite in a fresh clone of HEAD

``table``: each test's setup + call + teardown seconds (pytest's ``--durations`` lines, ``12.34s call nodeid``)
summed into the units tests/conftest.py's :func:`scope_of` hands out (a module, a SPLIT module's parts, the serial
unit). A unit whose module-scoped fixture was built on both workers of a ``--dist load`` profile shows two setups:
each unit's seconds are what one worker would spend, so a repeated fixture (the same setup seconds, to 15%, in two
tests of one unit) counts once. Tests below the profile's cut (``--durations=N`` lists only the N slowest) are
given ``other_test_s``: the seconds left of both workers' time over the run (2 x its wall time, idle included:
an upper bound) spread over them, at most the shortest listed test.

``fresh``: the suite as CI runs it, timed: a fresh clone of HEAD, the tests run there by the same pytest command
``make test`` runs (``-n WORKERS --dist loadgroup``), with this checkout's venv and ``PYTHONPATH`` at the clone (as
``bench.bench_demo`` does: every process the tests start imports the clone's package). Writes
``bench/results/suite_<date>.json``: the wall time, pytest's own seconds and counts, the load average before and
after, the commit and the machine. The environment's build (``make env``, minutes of pip) is not in the figure.

``estimate``: longest-processing-time-first on ``--workers`` (what LongestFirstScheduling does): each unit, longest
first, to the worker that frees first; prints the makespan (the estimated wall time of the tests, start-up and
collection aside), each worker's units, and the lower bounds (the longest unit; all the work / workers).
"""

from __future__ import annotations

import argparse
import heapq
import importlib.util
import json
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TABLE = REPO / "tests" / "durations.json"
LINE = re.compile(r"^\s*([\d.]+)s (setup|call|teardown) +(\S.*?)\s*$")
WALL = re.compile(r" in ([\d.]+)s")


def conftest():
    """tests/conftest.py as a module (its :func:`scope_of` and :func:`unit_estimate`)."""
    spec = importlib.util.spec_from_file_location("suite_conftest", REPO / "tests" / "conftest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def collected() -> list[str]:
    """Every test id of the suite (``pytest --collect-only -q``), in collection order."""
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"], cwd=REPO,
                         capture_output=True, text=True).stdout
    return [ln.strip() for ln in out.splitlines() if "::" in ln]


def parse_profile(text: str) -> tuple[dict[str, dict[str, float]], float]:
    """({test id: {phase: seconds}}, the run's wall seconds or 0) from pytest's ``--durations`` output."""
    tests: dict[str, dict[str, float]] = defaultdict(dict)
    for ln in text.splitlines():
        m = LINE.match(ln)
        if m:
            tests[m.group(3)][m.group(2)] = float(m.group(1))
    walls = [float(w) for ln in text.splitlines() if (" passed" in ln or " failed" in ln) for w in WALL.findall(ln)]
    return dict(tests), (walls[-1] if walls else 0.0)


def unit_table(profile: dict[str, dict[str, float]], wall: float, ids: list[str], scope_of, workers: int = 2) -> dict:
    """The durations table: {"units": {unit: seconds}, "other_test_s": s, "source": ...} (see the module doc)."""
    units: dict[str, float] = defaultdict(float)
    setups: dict[str, list[float]] = defaultdict(list)
    listed = 0
    for test, phases in profile.items():
        unit = scope_of(test)
        setup = phases.get("setup", 0.0)
        if setup > 5 and any(abs(setup - s) <= 0.15 * s for s in setups[unit]):
            setup = 0.0  # the same module fixture built again on the other worker: one worker builds it once
        setups[unit].append(phases.get("setup", 0.0))
        units[unit] += setup + phases.get("call", 0.0) + phases.get("teardown", 0.0)
        listed += 1
    others = [t for t in ids if t not in profile]
    shortest = min((sum(p.values()) for p in profile.values()), default=0.0)
    spare = max(workers * wall - sum(units.values()), 0.0)
    other_s = min(spare / max(len(others), 1), shortest) if others else 0.0
    for t in others:
        units[scope_of(t)] += other_s
    return {"units": {u: round(s, 1) for u, s in sorted(units.items(), key=lambda kv: -kv[1])},
            "other_test_s": round(other_s, 3), "tests": len(ids), "tests_profiled": listed}


def lpt(units: dict[str, float], workers: int = 2) -> tuple[float, list[list[str]]]:
    """Longest-processing-time-first: (makespan, each worker's units in order)."""
    heap = [(0.0, w) for w in range(workers)]
    plan: list[list[str]] = [[] for _ in range(workers)]
    for unit, seconds in sorted(units.items(), key=lambda kv: -kv[1]):
        free_at, w = heapq.heappop(heap)
        plan[w].append(unit)
        heapq.heappush(heap, (free_at + seconds, w))
    return max(t for t, _ in heap), plan


def estimate(table: dict, ids: list[str], scope_of, unit_estimate, workers: int = 2) -> dict:
    """The LPT makespan of the suite's units at the table's seconds, and its two lower bounds."""
    counts: dict[str, int] = defaultdict(int)
    for t in ids:
        counts[scope_of(t)] += 1
    units = {u: unit_estimate(table, u, n) for u, n in counts.items()}
    makespan, plan = lpt(units, workers)
    return {"makespan_s": round(makespan, 1), "longest_unit_s": round(max(units.values()), 1),
            "work_per_worker_s": round(sum(units.values()) / workers, 1), "units": len(units),
            "plan": [[(u, round(units[u], 1)) for u in p] for p in plan]}


SUMMARY = re.compile(r"^=*\s*(.*?\b(?:passed|failed|error|errors)\b.*?) in ([\d.]+)s")


def scrub(lines: list[str], paths: dict[str, str]) -> list[str]:
    """``lines`` with each of this machine's ``paths`` replaced by its label (results files are committed: no
    machine's paths in them), the longest path first."""
    for path in sorted(paths, key=len, reverse=True):
        lines = [x.replace(path, paths[path]) for x in lines]
    return lines


def fresh(workers: int, out: Path | None = None) -> dict:
    """Time the suite in a fresh clone of HEAD (see the module's docstring); returns what it writes."""
    import os
    import time

    sys.path.insert(0, str(REPO))
    from bench.common import format_table, fresh_clone, row
    from brorl_lab.study.results import machine_info

    argv = [sys.executable, "-m", "pytest", "-q", "-n", str(workers), "--dist", "loadgroup", "-p", "no:cacheprovider",
            "--durations=25"]
    load0 = os.getloadavg()[0]
    with fresh_clone() as (clone, env, commit):
        t0 = time.perf_counter()
        proc = subprocess.run(argv, cwd=clone, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - t0
    load1 = os.getloadavg()[0]
    lines = scrub(proc.stdout.splitlines() + proc.stderr.splitlines()[-10:], {sys.prefix: "<venv>", str(clone): "<clone>",
                                                                               str(REPO): "<repo>"})
    found = [SUMMARY.match(x) for x in lines]
    summary = next((m for m in reversed(found) if m), None)
    counts = dict((k, int(v)) for v, k in re.findall(r"(\d+) (passed|failed|errors?|skipped)", summary.group(1))) \
        if summary else {}
    note = f"commit {commit}; {workers} workers; load average {load0:.1f} before, {load1:.1f} after; {os.cpu_count()} CPUs"
    rows = [row("suite", f"the test suite from a fresh clone (env built), {workers} workers: wall", wall, "s", "<= 720",
                note)]
    print(format_table(rows))
    result = {"command": f"python -m bench.bench_suite fresh --workers {workers}", "machine": machine_info(),
              "rows": rows, "rc": proc.returncode, "commit": commit, "pytest_argv": argv[1:],
              "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "load_before": load0, "load_after": load1,
              "wall_s": round(wall, 1), "wall_min": round(wall / 60, 1),
              "pytest_s": float(summary.group(2)) if summary else None, "counts": counts,
              "tail": lines[-50:]}
    path = out or REPO / "bench" / "results" / f"suite_{time.strftime('%Y-%m-%d')}.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(f"written: {path}; pytest: {summary.group(0) if summary else 'no summary line'}")
    return result


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.bench_suite", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("table", help="write tests/durations.json from a --durations profile")
    t.add_argument("profile", type=Path, help="pytest's output with --durations=N (N=0: every test)")
    t.add_argument("--workers", type=int, default=2, help="the profile run's -n (default 2)")
    t.add_argument("--out", type=Path, default=TABLE)
    e = sub.add_parser("estimate", help="the LPT schedule's wall time from tests/durations.json")
    e.add_argument("--workers", type=int, default=2)
    e.add_argument("--table", type=Path, default=TABLE)
    f = sub.add_parser("fresh", help="time the suite in a fresh clone of HEAD; writes bench/results/suite_<date>.json")
    f.add_argument("--workers", type=int, default=2, help="pytest-xdist workers, as make test's TEST_WORKERS")
    f.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.cmd == "fresh":
        if args.workers < 1:
            ap.error(f"--workers: got {args.workers}; allowed: 1 or more pytest-xdist workers")
        return 0 if fresh(args.workers, args.out)["rc"] == 0 else 1
    c, ids = conftest(), collected()
    if args.cmd == "table":
        profile, wall = parse_profile(args.profile.read_text())
        if not profile:
            print(f"error: no '<seconds>s call <test id>' lines in {args.profile} (run pytest with --durations=N)",
                  file=sys.stderr)
            return 2
        table = unit_table(profile, wall, ids, c.scope_of, args.workers)
        table["source"] = f"python -m bench.bench_suite table <profile> from a {args.workers}-worker run of {wall:.0f} s"
        args.out.write_text(json.dumps(table, indent=1) + "\n")
        print(f"{args.out.name}: {len(table['units'])} units, {table['tests_profiled']} of {len(ids)} tests profiled, "
              f"other tests {table['other_test_s']} s each")
        return 0
    res = estimate(json.loads(args.table.read_text()), ids, c.scope_of, c.unit_estimate, args.workers)
    for w, p in enumerate(res["plan"]):
        head = ", ".join(f"{u.removeprefix('tests/')} {s:.0f}" for u, s in p[:6])
        print(f"worker {w}: {sum(s for _, s in p):.0f} s in {len(p)} units ({head}, ...)")
    print(f"estimated wall time of the tests on {args.workers} workers: {res['makespan_s']:.0f} s "
          f"({res['makespan_s'] / 60:.1f} min); bounds: longest unit {res['longest_unit_s']:.0f} s, "
          f"work / workers {res['work_per_worker_s']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
