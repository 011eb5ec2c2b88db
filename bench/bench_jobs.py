"""Seeds per hour: a fixed slice of the full-size flagship run at ``--jobs 1`` and at ``--jobs 2``, side by side in
one run, and how much each run slows down when it shares the cores.

    python -m bench.bench_jobs                                  # seeds 0 1, both headline arms, configs 1x1 2x1
    python -m bench.bench_jobs --configs 1x1 2x1 1x2 --json bench/results/jobs_DATE.json
    python -m bench.bench_jobs --steps 2 --rounds 2             # the first 2 of 8 BroRL-arm steps, twice, alternating
    python -m bench.bench_jobs --smoke                          # tiny sizes (what the test runs)

The slice: the flagship's ProRL (N=16 x 64 prompts, 64 steps) and BroRL (N=512 x 16 prompts, 8 steps) arms for
``--seeds`` (default 0 and 1: 4 of the full-size run's 19 arm runs), with notebook 02's full-size settings (the
plateau checkpoint, prorl_v2, 8 grid points, 64 eval prompts x 64 samples; ``flagship_slice``). Each config
``JxT`` (J jobs at a time, T torch threads each) runs the same slice from scratch in its own directory through
:func:`brorl_lab.study.arms.run_rollout_scaling`; the configs run one after another, in the order given.

Reported per config: the wall time of the whole slice, paired seeds per hour (seeds / wall), the speed-up against
the first config, and per run its own time (training plus evaluation, from its metrics: ``cum_wall_s`` plus the
evaluations' ``time/eval``), whose ratio to the same run in the first config is the slowdown from sharing the
cores. The load average is sampled every 5 s during each config: other processes on the machine take cores too,
and a number measured under load says so in the JSON (``load``) rather than hiding it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Optional

from .common import REPO

TARGET = 1.7  # seeds per hour at --jobs 2 over --jobs 1 (issue 35)
FULL_SIZE = dict(recipe="prorl_v2", model="plateau", steps=8, eval_every=1, optimizer_steps_per_step=2, lr=3e-4,
                 lr_warmup_steps=0, reward="correct", eval_prompts=64, eval_samples=64, eval_k=[1, 8, 64])
FULL_ARMS = dict(n_small=16, n_large=512, prompts_small=64, prompts_large=16, lr_scaling="none")
SMOKE = dict(recipe="prorl_v2", model="default", tasks=["gcd"], steps=2, eval_every=1, optimizer_steps_per_step=1,
             eval_prompts=4, eval_samples=2, eval_k=[1], max_new_tokens=6, max_resample_rounds=1)
SMOKE_ARMS = dict(n_small=2, n_large=8, prompts_small=2, prompts_large=2)


def flagship_slice(smoke: bool = False, steps: Optional[int] = None):
    """``(base config, arm options)``: notebook 02's full-size flagship (or tiny sizes for ``smoke``), its first
    ``steps`` BroRL-arm steps when given (the ProRL arm: 8x as many)."""
    from brorl_lab.study.recipe import recipe_config

    settings = dict(SMOKE if smoke else FULL_SIZE) | ({"steps": steps} if steps else {})
    recipe = settings.pop("recipe")
    base = recipe_config(recipe, checkpoint_every=settings["eval_every"], **settings)
    return base, dict(SMOKE_ARMS if smoke else FULL_ARMS)


class LoadSampler:
    """The 1-minute load average every ``every_s`` seconds while it runs (a daemon thread)."""

    def __init__(self, every_s: float = 5.0):
        self.every_s, self.samples, self._stop = every_s, [], threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append(os.getloadavg()[0])
            self._stop.wait(self.every_s)

    def __enter__(self) -> "LoadSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def summary(self) -> dict:
        s = self.samples or [float("nan")]
        return {"mean_1min": round(statistics.fmean(s), 2), "max_1min": round(max(s), 2),
                "min_1min": round(min(s), 2), "samples": len(s), "end_1_5_15": [round(x, 2) for x in os.getloadavg()]}


def run_config(jobs: int, threads: int, seeds: list[int], root: Path, smoke: bool, steps: Optional[int]) -> dict:
    """The slice at ``jobs`` x ``threads`` from scratch in ``root``: wall time, per-run times, load."""
    from brorl_lab.study.arms import run_rollout_scaling

    base, arms = flagship_slice(smoke, steps)
    shutil.rmtree(root, ignore_errors=True)
    with LoadSampler() as load:
        t0 = time.perf_counter()
        df = run_rollout_scaling(base.replace(run_dir=str(root)), seeds=seeds, root=root, progress=False, jobs=jobs,
                                 threads=threads, **arms)
        wall = time.perf_counter() - t0
    runs = {}
    for run, g in df.groupby("run", sort=False):
        evals = g["time/eval"].fillna(0).sum() if "time/eval" in g else 0.0
        runs[run] = {"steps": int(g["step"].max()), "train_s": round(float(g["cum_wall_s"].max()), 2),
                     "eval_s": round(float(evals), 2), "run_s": round(float(g["cum_wall_s"].max() + evals), 2)}
    return {"config": f"{jobs}x{threads}", "jobs": jobs, "threads": threads, "seeds": len(seeds),
            "wall_s": round(wall, 2), "seeds_per_hour": round(3600 * len(seeds) / wall, 3), "runs": runs,
            "load": load.summary()}


def summarise(name: str, rounds: list[dict]) -> dict:
    """One config over its rounds: median wall time (and the seeds per hour it gives), each run's median own time,
    the mean load; the rounds themselves kept."""
    wall = statistics.median(r["wall_s"] for r in rounds)
    runs = rounds[0]["runs"]
    return {"config": name, "jobs": rounds[0]["jobs"], "threads": rounds[0]["threads"], "seeds": rounds[0]["seeds"],
            "wall_s": round(wall, 2), "seeds_per_hour": round(3600 * rounds[0]["seeds"] / wall, 3),
            "run_s": {run: round(statistics.median(r["runs"][run]["run_s"] for r in rounds), 2) for run in runs},
            "load_mean_1min": round(statistics.fmean(r["load"]["mean_1min"] for r in rounds), 2), "rounds": rounds}


def provenance(argv) -> dict:
    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, timeout=30).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    import torch

    from brorl_lab.lab.jobs import physical_cores

    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").exists() else ""
    return {"command": " ".join(["python -m bench.bench_jobs", *argv]), "commit": git("rev-parse", "--short", "HEAD"),
            "dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
            "date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
            "machine": {"cpu": cpu, "logical_cpus": os.cpu_count(), "physical_cores": physical_cores(),
                        "python": platform.python_version(), "torch": torch.__version__, "platform": platform.platform()},
            "load_at_start_1_5_15": [round(x, 2) for x in os.getloadavg()]}


def main(argv: Optional[list[str]] = None) -> dict:
    ap = argparse.ArgumentParser(prog="python -m bench.bench_jobs", description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1], help="paired seeds of the slice (default 0 1)")
    ap.add_argument("--configs", nargs="+", default=["1x1", "2x1"],
                    help="JOBSxTHREADS, run in this order; the first is the baseline (default 1x1 2x1)")
    ap.add_argument("--json", default=None, help="where to write the result (default: print only)")
    ap.add_argument("--root", default=str(REPO / "runs" / "bench_jobs"), help="scratch directory for the runs")
    ap.add_argument("--steps", type=int, default=None,
                    help="the slice's BroRL-arm steps (default: the full size's 8; the ProRL arm runs 8x as many)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="run the configs this many times, alternating (a drifting load hits every config alike); "
                         "each config's numbers are medians over its rounds")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes (the test)")
    args = ap.parse_args(argv)
    if args.rounds < 1 or (args.steps is not None and args.steps < 1):
        ap.error("--rounds and --steps: allowed: integers >= 1")
    configs = []
    for c in args.configs:
        j, _, t = c.partition("x")
        if not (j.isdigit() and t.isdigit() and int(j) >= 1 and int(t) >= 1):
            ap.error(f"--configs: got {c!r}; allowed: JOBSxTHREADS with both integers >= 1, e.g. 2x1")
        configs.append((int(j), int(t)))
    settings = (SMOKE if args.smoke else FULL_SIZE) | ({"steps": args.steps} if args.steps else {})
    out = {"what": "a fixed slice of the full-size flagship (headline arms x seeds) at each JOBSxTHREADS",
           "slice": {"seeds": args.seeds, "arms": ["prorl", "brorl"], "smoke": args.smoke, "settings": settings,
                     "arm_options": SMOKE_ARMS if args.smoke else FULL_ARMS},
           "target": f"seeds per hour >= {TARGET}x the first config",
           **provenance(sys.argv[1:] if argv is None else argv)}
    rounds: dict[str, list[dict]] = {f"{j}x{t}": [] for j, t in configs}
    for k in range(args.rounds):
        for jobs, threads in configs:
            r = run_config(jobs, threads, args.seeds, Path(args.root) / f"{jobs}x{threads}", args.smoke, args.steps)
            rounds[r["config"]].append(r)
            print(f"round {k + 1}: {r['config']}: {r['wall_s']:.0f} s, {r['seeds_per_hour']:.2f} seeds/h, load "
                  f"{r['load']['mean_1min']}", flush=True)
    results = [summarise(name, rs) for name, rs in rounds.items()]
    first = results[0]
    for r in results:
        r["speedup_vs_first"] = round(r["seeds_per_hour"] / first["seeds_per_hour"], 3)
        r["run_slowdown_vs_first"] = {run: round(v / first["run_s"][run], 3) for run, v in r["run_s"].items()
                                      if first["run_s"].get(run)}
        r["median_run_slowdown"] = round(statistics.median(r["run_slowdown_vs_first"].values()), 3) \
            if r["run_slowdown_vs_first"] else None
    out["results"] = results
    best = max(results[1:], key=lambda r: r["speedup_vs_first"], default=None)
    out["target_met"] = None if best is None else bool(best["speedup_vs_first"] >= TARGET)
    print(f"{'config':>7} {'wall s':>8} {'seeds/h':>8} {'speed-up':>8} {'run slowdown':>12} {'load mean':>9}")
    for r in results:
        print(f"{r['config']:>7} {r['wall_s']:8.0f} {r['seeds_per_hour']:8.2f} {r['speedup_vs_first']:8.2f} "
              f"{r['median_run_slowdown'] or float('nan'):12.2f} {r['load_mean_1min']:9.2f}")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
        print(f"written: {args.json}")
    return out


if __name__ == "__main__":
    main()
