"""Benchmarks of brorl_lab.theory and the mass-balance explorer (timings, not tests).

    .venv/bin/python bench/bench_theory.py [--smoke] [--threads 1] [--json runs/bench/theory.json]

``run(smoke)`` returns rows {"figure", "value", "unit", "target", ...}: the closed-form E[dQ_pos] at V=128,000 for
N up to 10^6, the paper's simulation at N=51,200 x 1000 steps (smoke: 20 steps at V=8,000) and the explorer's redraw
after an N-slider move (median over moves across the whole grid).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path


def _median_seconds(fn: Callable[[], object], repeats: int) -> float:
    fn()  # warm caches and lazy imports
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def run(smoke: bool = False, threads: int = 1) -> list[dict]:
    import torch

    from brorl_lab import theory
    from brorl_lab.lab.widgets import mass_balance_explorer

    torch.set_num_threads(threads)
    rows = []
    prob = theory.paper_problem()  # V = 128,000 even in smoke: the target is stated for this size
    for n in (512, 51_200, 10**6):
        s = _median_seconds(lambda: theory.expected_mass_balance(prob.p, prob.correct, n, terms="total"),
                            3 if smoke else 20)
        rows.append({"figure": f"expected_mass_balance total, V=128000, N={n}", "value": s * 1e3, "unit": "ms",
                     "target": "< 10 ms"})
    grid = [2**k for k in range(21)]
    s = _median_seconds(lambda: theory.expected_total(prob.p, prob.correct, grid), 3 if smoke else 10)
    rows.append({"figure": "expected_total on 21 N values (1 .. 2^20), V=128000", "value": s * 1e3, "unit": "ms",
                 "target": None})

    steps, vocab, n_correct = (20, 8_000, 600) if smoke else (1000, 128_000, 10_000)
    t0 = time.perf_counter()
    df = theory.paper_simulation(51_200, steps=steps, vocab=vocab, n_correct=n_correct)
    rows.append({"figure": f"paper_simulation N=51200 x {steps} steps, V={vocab}", "value": time.perf_counter() - t0,
                 "unit": "s", "target": "< 60 s" if not smoke else None,
                 "q_pos_gain": float(df.q_pos.iloc[-1] - df.q_pos.iloc[0])})

    vocab, n_correct, trials = (8_000, 600, 40) if smoke else (128_000, 10_000, 300)
    t0 = time.perf_counter()
    ex = mass_balance_explorer(vocab=vocab, n_correct=n_correct, trials=trials)
    rows.append({"figure": f"explorer build (precompute, {trials} streams), V={vocab}",
                 "value": time.perf_counter() - t0, "unit": "s", "target": None})
    moves = []
    for n in list(ex.n_values) + list(ex.n_values[::-1]):
        t0 = time.perf_counter()
        ex.n_slider.value = int(n)  # the observer calls redraw, as a browser slider move would
        moves.append(time.perf_counter() - t0)
    rows.append({"figure": f"explorer redraw after an N-slider move, V={vocab}",
                 "value": statistics.median(moves) * 1e3, "unit": "ms", "target": "< 100 ms",
                 "max_ms": max(moves) * 1e3})
    for r in rows:
        r["threads"] = threads
    return rows


def _table(rows: list[dict]) -> str:
    lines = [f"{'figure':<62} {'value':>10} {'unit':<4} target"]
    for r in rows:
        lines.append(f"{r['figure']:<62} {r['value']:>10.3f} {r['unit']:<4} {r['target'] or ''}")
    return "\n".join(lines)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="tiny sizes, seconds instead of a minute")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1 on a shared machine)")
    ap.add_argument("--json", type=Path, default=None, help="also write the rows here")
    args = ap.parse_args()
    result = run(smoke=args.smoke, threads=args.threads)
    print(_table(result))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2))
