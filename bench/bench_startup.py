"""Start-up of the command line (issue 46): time to the first line `train` prints, to a refusal of a bad name, and a
whole 1-step `train` of the default model, each a fresh process as a user starts it.

    python bench/bench_startup.py [--repeats 3] [--out bench/results/startup_<date>.json]

Targets: first line < 1 s, refusal < 2 s, 1-step train < 6 s on the 2-core machine. Medians of interleaved
repetitions; the load average (1 min) before and after is recorded, since other users of the machine slow every
figure (what the JSON says is what was measured, under that load).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import REPO, format_table, median, row  # noqa: E402

ENV = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
CLI = [sys.executable, "-m", "brorl_lab"]


def first_line_s(argv: list[str]) -> tuple[float, float]:
    """(seconds to the first line on stderr or stdout, seconds to exit) of ``python -m brorl_lab argv``."""
    t0 = time.perf_counter()
    p = subprocess.Popen(CLI + argv, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    p.stdout.readline()
    first = time.perf_counter() - t0
    p.communicate(timeout=600)
    if p.returncode not in (0, 2):
        raise RuntimeError(f"{' '.join(argv)} exited {p.returncode}")
    return first, time.perf_counter() - t0


def main(repeats: int = 3, out: str | None = None) -> list[dict]:
    load0 = os.getloadavg()[0]
    first, refusal, train = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(repeats):  # interleaved: a burst of load hits every figure alike
            refusal.append(first_line_s(["train", "--advantage", "grop"])[1])
            f, total = first_line_s(["train", "--steps", "1", "--quiet", "--threads", "2", "--run-dir", tmp,
                                     "--run-name", f"r{i}"])
            first.append(f)
            train.append(total)
    load1 = os.getloadavg()[0]
    note = f"median of {repeats}; load average {load0:.1f} before, {load1:.1f} after; {os.cpu_count()} CPUs"
    rows = [row("startup", "train: first line", median(first), "s", "< 1", note),
            row("startup", "train --advantage grop: refused", median(refusal), "s", "< 2", note),
            row("startup", "train --steps 1 (default model, default config)", median(train), "s", "< 6", note)]
    print(format_table(rows))
    path = Path(out or REPO / "bench" / "results" / f"startup_{time.strftime('%Y-%m-%d')}.json")
    path.write_text(json.dumps({"rows": rows, "runs": {"first": first, "refusal": refusal, "train": train},
                                "load_before": load0, "load_after": load1}, indent=1))
    print(f"written: {path}")
    return rows


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    main(a.repeats, a.out)
