"""`make demo` as a newcomer meets it (issue 42): the flagship in miniature, run from a fresh clone of HEAD with the
environment already built, timed as a whole, with the longest silence between two of its console lines.

    python -m bench.bench_demo [--out bench/results/demo_<date>.json]

The clone runs with this checkout's venv (``sys.executable``) and ``PYTHONPATH`` pointing at the clone, so the
notebook kernel papermill starts imports the clone's package, not the editable install's. Targets (issue 42): rc 0
in at most 5 minutes on a quiet 2-core machine; a console line at least every 30 s. The load average before and
after is recorded: a loaded machine makes every figure slower, and the JSON says what was measured, under that load.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import REPO, format_table, fresh_clone, row  # noqa: E402


def timed_lines(argv: list[str], cwd: Path, env: dict) -> tuple[int, float, list[float], list[str]]:
    """(exit code, wall seconds, the time of each console line since start, the lines) of one command."""
    t0 = time.perf_counter()
    p = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    times, lines = [], []
    for line in p.stdout:
        times.append(time.perf_counter() - t0)
        lines.append(line.rstrip("\n"))
        print(f"[{times[-1]:6.1f} s] {lines[-1]}", flush=True)
    rc = p.wait()
    return rc, time.perf_counter() - t0, times, lines


def main(out: str | None = None) -> dict:
    load0 = os.getloadavg()[0]
    with fresh_clone() as (clone, env, commit):
        env.pop("BRORL_PLAIN_PROGRESS", None)
        rc, wall, times, lines = timed_lines([sys.executable, "-m", "brorl_lab", "demo", "--out", "runs/demo"],
                                             clone, env)
    load1 = os.getloadavg()[0]
    gaps = [b - a for a, b in zip([0.0, *times], [*times, wall])]  # start -> first line ... last line -> exit
    note = f"commit {commit}; load average {load0:.1f} before, {load1:.1f} after; {os.cpu_count()} CPUs"
    rows = [row("demo", "make demo from a fresh clone (env built): wall", wall, "s", "<= 300", note),
            row("demo", "longest silence between console lines", max(gaps), "s", "<= 30", note)]
    print(format_table(rows))
    from brorl_lab.study.results import machine_info

    result = {"command": "python -m bench.bench_demo", "machine": machine_info(), "rows": rows, "rc": rc,
              "commit": commit, "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "load_before": load0, "load_after": load1, "lines": len(lines), "line_times_s": times,
              "tail": lines[-15:]}
    path = Path(out or REPO / "bench" / "results" / f"demo_{time.strftime('%Y-%m-%d')}.json")
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(f"written: {path}")
    if rc != 0:
        raise SystemExit(f"the demo exited {rc}")
    return result


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    ap.add_argument("--out", default=None)
    main(ap.parse_args().out)
