"""Where a study's hour goes, and seeds per hour before and after (issue 45).

    python -m bench.bench_study profile --budget 32768 --json bench/results/study_profile_DATE.json
    python -m bench.bench_study speed --before <commit> --budget 8192 --seeds 0 1 --rounds 1 \
        --json bench/results/study_speed_DATE.json

Both run the takeoff study's arms (ProRL 16 x 64 and BroRL 512 x 16) from the takeoff base as
``python -m brorl_lab paid --model takeoff --lr 3e-4 --families spell_backward --eval-prompts 200 --eval-samples 8
--no-middle --threads 1`` runs them (:func:`brorl_lab.study.paid.paid_arm_configs`), at a smaller ``--budget``
(generated samples per arm; the takeoff command's is 131,072).

``profile``: seed 0's two arms, each in a fresh spawned process at 1 torch thread (as a ``--jobs 2`` worker starts
one); per arm the CPU seconds (robust to the load of other users; wall beside) and shares of process start-up
(interpreter, imports, the Trainer built: model load, run directory), prompt sampling, rollout (round 0), refill
rollouts (rounds >= 1), scoring (+ the dynamic-sampling filter), update (logprobs, KL, update, weight sync),
evaluation, checkpoint I/O and the rest, timed by wrapping those calls in the child.

``speed``: ``--seeds`` x both arms through ``run_paid`` at ``--jobs`` (``pair``), by the code of ``--before``
(a temporary git worktree) and by this checkout, interleaved; seeds per hour by wall time and by the CPU seconds
of every process each side started, and whether both sides' metrics (wall times aside) are equal.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

TAKEOFF = dict(model="takeoff", lr=3e-4, tasks=["spell_backward"], eval_prompts=200, eval_samples=8)
STAGES = ("startup", "prompts", "rollout", "refill_rollout", "score", "update", "eval", "checkpoint", "other")


def arm_pair(budget: int, root: Path, **over) -> list:
    """The ProRL and BroRL arm of the takeoff command at ``budget``, seed 0, in ``root``."""
    from brorl_lab.study import paid
    from brorl_lab.study.arms import plan_arms
    from brorl_lab.study.recipe import recipe_config

    base = recipe_config(**{**TAKEOFF, "torch_threads": 1, **over})
    arms = paid.paid_arm_configs(base, budget=budget, middle=False)
    return plan_arms(arms, seeds=[0], root=root)


def _timed(owner, name: str, bucket, key=None):
    """Wrap ``owner.name`` so its wall time adds to ``bucket[key(args) or name]``."""
    fn = getattr(owner, name)

    def wrapper(*a, **kw):
        t0 = time.process_time()
        try:
            return fn(*a, **kw)
        finally:
            k = key(a, kw) if key else name
            bucket[k] = bucket.get(k, 0.0) + time.process_time() - t0

    setattr(owner, name, wrapper)


def _child(cfg, t_spawn: float, profile: bool, out) -> None:
    """One arm in a fresh process, as a new --jobs worker starts it: start-up timed from the parent's spawn call."""
    import torch

    torch.set_num_threads(1)
    from brorl_lab.rl import steps as S
    from brorl_lab.rl import trainer as T
    from brorl_lab.study.recipe import open_trainer

    times: dict = {}
    if profile:
        rounds: dict = {}
        sampling = T.Trainer.sampling

        def tag(self, step, rnd):
            s = sampling(self, step, rnd)
            rounds[s.seed] = rnd
            return s

        T.Trainer.sampling = tag
        _timed(S, "rollout", times, key=lambda a, kw: "refill_rollout" if rounds.get(a[3].seed, 0) else "rollout")
        _timed(S, "sample_prompts", times, key=lambda a, kw: "prompts")
        _timed(S, "score", times)
        _timed(S, "filter_groups", times, key=lambda a, kw: "score")
        for name in ("update", "kl_in_reward", "sync"):
            _timed(S, name, times, key=lambda a, kw: "update")
        _timed(T, "compute_logprobs", times, key=lambda a, kw: "update")
        _timed(T.Trainer, "evaluate", times, key=lambda a, kw: "eval")
        _timed(T.Trainer, "save_checkpoint", times, key=lambda a, kw: "checkpoint")
    with open_trainer(cfg, progress=False) as trainer:
        t_start, cpu_start = time.time(), time.process_time()
        trainer.run()
    df = trainer.metrics
    out.put({"startup_wall": t_start - t_spawn, "startup": cpu_start, "cpu": time.process_time(), "times": times,
             "metrics": df.drop(columns=[c for c in df.columns if "time" in c or "wall" in c or c.endswith("_per_s")])
             .to_dict(orient="list")})


def run_arm_child(cfg, *, profile: bool = False) -> dict:
    """``cfg`` run in a fresh spawned process; its timings and metrics."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    t0 = time.time()
    p = ctx.Process(target=_child, args=(cfg, t0, profile, q))
    p.start()
    res = q.get()
    p.join()
    res["wall"] = time.time() - t0
    return res


def shares(res: dict) -> dict:
    """CPU seconds (the child's, at 1 thread: what the load of other users does not inflate) and shares of
    :data:`STAGES` in one arm's run, and its wall time."""
    t = dict(res["times"])
    secs = {"startup": res["startup"], **{k: t.get(k, 0.0) for k in STAGES[1:-1]}}
    secs["other"] = res["cpu"] - sum(secs.values())
    return {"cpu_seconds": {k: round(v, 3) for k, v in secs.items()},
            "share": {k: round(v / res["cpu"], 4) for k, v in secs.items()}, "cpu_s": round(res["cpu"], 2),
            "wall_s": round(res["wall"], 2)}


def _load() -> float:
    return os.getloadavg()[0]


SHIPPED = "notebooks/figures/paid_takeoff_metrics.parquet"


def shipped_shares() -> dict:
    """The full-size takeoff run's own step timings (its shipped metrics: 131,072 generated samples per arm, 10
    seeds), per arm x seed on average: the stages a Trainer times itself (start-up and checkpoints are not in it)."""
    import pandas as pd

    df = pd.read_parquet(Path(__file__).resolve().parent.parent / SHIPPED)
    cols = {"rollout": ["time/rollout"], "score": ["time/score", "time/filter"], "update": ["time/logprobs",
            "time/update", "time/sync"], "eval": ["time/eval"]}
    per = df.groupby(["arm", "seed"])[[c for v in cols.values() for c in v] + ["step_wall_s"]].sum()
    per["step_wall_s"] += df[df["step"] == 0].groupby(["arm", "seed"])["time/eval"].sum()  # step 0's evaluation
    out = {}
    for arm, g in per.groupby("arm"):
        m = g.mean()
        secs = {k: float(sum(m[c] for c in v)) for k, v in cols.items()}
        secs["other_in_steps"] = float(m["step_wall_s"]) - sum(secs.values())
        out[arm] = {"seconds": {k: round(v, 2) for k, v in secs.items()}, "total_s": round(float(m["step_wall_s"]), 2),
                    "share": {k: round(v / float(m["step_wall_s"]), 4) for k, v in secs.items()},
                    "steps": float(df[df["arm"] == arm].groupby("seed")["step"].max().mean())}
    return {"source": SHIPPED, **out}


def cmd_profile(args) -> dict:
    root = Path(tempfile.mkdtemp(prefix="study_profile_"))
    try:
        out = {}
        for arm, _, cfg in arm_pair(args.budget, root):
            out[arm] = {**shares(run_arm_child(cfg, profile=True)), "steps": cfg.steps,
                        "samples_per_step": cfg.samples_per_step, "checkpoint_every": cfg.checkpoint_every}
        pair = {k: sum(out[a]["cpu_seconds"][k] for a in out) for k in STAGES}
        tot = sum(out[a]["cpu_s"] for a in out)
        out["pair"] = {"cpu_seconds": {k: round(v, 2) for k, v in pair.items()},
                       "share": {k: round(v / tot, 4) for k, v in pair.items()}, "cpu_s": round(tot, 2),
                       "wall_s": round(sum(out[a]["wall_s"] for a in out), 2)}
        out["full_size_takeoff_run"] = shipped_shares()
        return out
    finally:
        shutil.rmtree(root, ignore_errors=True)


def cmd_pair(args) -> dict:
    """The study itself: ``--seeds`` x both arms through :func:`brorl_lab.study.paid.run_paid` at ``--jobs``, 1 torch
    thread each; the metrics (wall times aside) written to ``--out``/metrics.json."""
    from brorl_lab.study import paid
    from brorl_lab.study.recipe import recipe_config

    base = recipe_config(**{**TAKEOFF, "torch_threads": 1})
    arms = paid.paid_arm_configs(base, budget=args.budget, middle=False)
    out = Path(args.out)
    t0 = time.time()
    df = paid.run_paid(arms, seeds=args.seeds, root=out / "arms", jobs=args.jobs, threads=1)
    wall = time.time() - t0
    keep = [c for c in df.columns if not ("time" in c or "wall" in c or c.endswith("_per_s"))]
    (out / "metrics.json").write_text(df[keep].to_json(orient="records"))
    return {"wall_s": wall, "runs": int(df["run"].nunique())}


def cmd_speed(args) -> dict:
    """The study (:func:`cmd_pair`) by the code before (``--before``: a commit, checked out into a temporary
    worktree) and as it is, interleaved (before, after, before, after, ...) so the load from other users of this
    machine hits both alike. Per side: wall seconds and the CPU seconds of every process the run started (what a
    quiet machine's cores would spend); seeds per hour from each."""
    import resource
    import subprocess

    repo = Path(__file__).resolve().parent.parent
    old = Path(tempfile.mkdtemp(prefix="study_before_"))
    subprocess.run(["git", "worktree", "add", "--detach", str(old), args.before], cwd=repo, check=True,
                   capture_output=True)
    sides = {"before": old, "after": repo}
    walls: dict = {k: [] for k in sides}
    cpus: dict = {k: [] for k in sides}
    metrics: dict = {}
    loads = []
    try:
        for r in range(args.rounds):
            for side, code in sides.items():
                out = Path(tempfile.mkdtemp(prefix=f"study_speed_{side}_"))
                cmd = [sys.executable, str(Path(__file__).resolve()), "pair", "--budget", str(args.budget),
                       "--jobs", str(args.jobs), "--out", str(out), "--seeds", *map(str, args.seeds)]
                env = {**os.environ, "PYTHONPATH": str(code), "OMP_NUM_THREADS": "1"}
                loads.append(_load())
                ru0, t0 = resource.getrusage(resource.RUSAGE_CHILDREN), time.time()
                subprocess.run(cmd, cwd=code, env=env, check=True, capture_output=True)
                ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
                walls[side].append(time.time() - t0)
                cpus[side].append((ru1.ru_utime + ru1.ru_stime) - (ru0.ru_utime + ru0.ru_stime))
                metrics.setdefault(side, json.loads((out / "metrics.json").read_text()))
                shutil.rmtree(out, ignore_errors=True)
                print(f"round {r} {side}: {walls[side][-1]:.1f} s wall, {cpus[side][-1]:.1f} s CPU", file=sys.stderr)
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(old)], cwd=repo, capture_output=True)
    seeds = len(args.seeds)
    cores = args.jobs  # a quiet machine runs the jobs side by side: CPU seconds / jobs is its wall time
    sph = {side: {"by_wall": 3600.0 * seeds / statistics.median(walls[side]),
                  "by_cpu": 3600.0 * seeds * cores / statistics.median(cpus[side])} for side in sides}
    return {"before": args.before, "seeds": args.seeds, "jobs": args.jobs, "pair_wall_s": walls, "cpu_s": cpus,
            "seeds_per_hour": sph, "ratio_by_wall": sph["after"]["by_wall"] / sph["before"]["by_wall"],
            "ratio_by_cpu": sph["after"]["by_cpu"] / sph["before"]["by_cpu"],
            "metrics_equal": metrics["before"] == metrics["after"], "load_avg_1min": loads}


def main(argv: Optional[list] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.bench_study", description=__doc__.split("\n\n")[0])
    ap.add_argument("mode", choices=("profile", "speed", "pair"))
    ap.add_argument("--budget", type=int, default=16384, help="generated samples per arm (takeoff command: 131072)")
    ap.add_argument("--rounds", type=int, default=2, help="speed: interleaved repetitions of old and new")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1], help="speed, pair: the seeds")
    ap.add_argument("--jobs", type=int, default=2, help="speed, pair: runs at a time (1 torch thread each)")
    ap.add_argument("--before", default="HEAD", help="speed: the commit of the code before")
    ap.add_argument("--out", help="pair: where the runs go")
    ap.add_argument("--json", help="write the result here")
    args = ap.parse_args(argv)
    res = {"profile": cmd_profile, "speed": cmd_speed, "pair": cmd_pair}[args.mode](args)
    res = {"command": "python -m bench.bench_study " + " ".join(argv if argv is not None else sys.argv[1:]),
           "budget": args.budget, "date": time.strftime("%Y-%m-%d"), "machine": platform.machine(),
           "cpus": os.cpu_count(), "load_avg_end": os.getloadavg(), **res}
    text = json.dumps(res, indent=1, default=float)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
