"""A sweep over ``train`` flags, with no notebook: a grid of Config fields (seeds included), each point a run trained
as a job of :mod:`brorl_lab.lab.jobs`, resumable, with an index (``python -m brorl_lab sweep --grid
rollouts_per_prompt=4,32 --grid seed=0,1 --steps N``: docs/CLI.md, "Sweeps"). Notebook sweeps (papermill) are
:mod:`brorl_lab.lab.sweep`."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Optional

import pandas as pd

from brorl_lab.core.config import Config, ConfigError
from brorl_lab.core.rundir import RunDir, atomic_write
from brorl_lab.core.runlock import RunLock
from brorl_lab.lab.jobs import Job, plan_workers, run_jobs
from brorl_lab.lab.sweep import expand_grid
from brorl_lab.rl.names import check_names


def train_point(cfg: dict, run_dir: str) -> str:
    """One point of :func:`run_train_sweep` (a job: module level, picklable arguments): a finished run is read
    back, a run with a checkpoint resumes, anything else starts (what a stopped attempt left is cleared). Returns
    the status the run ends with: ``finished`` or ``interrupted``."""
    from brorl_lab.rl.trainer import Trainer

    path = Path(run_dir)
    if path.is_dir() and RunDir.holds_run(path):
        if RunDir(path).read_status()["status"] == "finished":
            return "finished"
        trainer = Trainer.resume(path, progress=False)
    else:
        trainer = Trainer(Config.from_dict(cfg), run_dir=path, progress=False)
    with trainer:
        trainer.run()
    return "interrupted" if trainer.interrupted else "finished"


def point_name(params: Mapping[str, Any]) -> str:
    """``rollouts_per_prompt4_seed0``: the run directory of one grid point, from its swept values."""
    text = "_".join(f"{k}{v}" for k, v in params.items()) or "run"
    return "".join(c if c.isalnum() or c in "._-" else "-" for c in text)[:150]


def run_train_sweep(grid: Mapping[str, Sequence[Any]], *, out: str | os.PathLike, base: Optional[dict] = None,
                    jobs: Optional[int] = None, threads: Optional[int] = None, progress: bool = True) -> pd.DataFrame:
    """``train`` over a grid of Config fields (seeds included), as TRL and verl users sweep: every point is a
    Config (``base`` fields, then the point's), checked as a whole before anything runs; each runs as a job of
    :func:`brorl_lab.lab.jobs.run_jobs` (``jobs`` side by side, ``threads`` torch threads each) into
    ``out/<point name>/``. Resumable: run it again and finished points are read back, stopped ones continue from
    their checkpoints. Writes ``out/index.parquet`` (one row per point: run, status, its values, the final held-out
    mean pass@1) and returns it. The sweep holds ``out``'s sweep lock."""
    points = expand_grid(grid)
    cfgs = []
    for p in points:
        try:
            cfgs.append(check_names(Config.from_dict({**(base or {}), **p})))
        except ConfigError as e:
            raise ConfigError(f"--grid point {p}: {e}") from None
    workers, per_job = plan_workers(jobs, threads, None)
    out = Path(out).absolute()
    with RunLock.acquire(out, "sweep", what="out"):
        todo = [Job(train_point, (c.replace(torch_threads=per_job).to_dict(), str(out / point_name(p))),
                    name=point_name(p), run_dir=out / point_name(p)) for p, c in zip(points, cfgs)]
        res = run_jobs(todo, workers=workers, threads=per_job, progress=progress, desc="sweep",
                       stop_if=lambda status: status == "interrupted")
        rows = []
        for p, job, status in zip(points, todo, res):
            metrics = RunDir(job.run_dir).read_metrics() if (job.run_dir / "metrics.parquet").exists() else None
            final = (metrics["eval/mean/pass@1"].dropna() if metrics is not None and "eval/mean/pass@1" in metrics
                     else pd.Series(dtype=float))
            rows.append({"run": job.name, "status": status if isinstance(status, str) else "not run", **p,
                         "eval/mean/pass@1": float(final.iloc[-1]) if len(final) else float("nan")})
        index = pd.DataFrame(rows)
        atomic_write(out / "index.parquet", lambda f: index.to_parquet(f, index=False))
    return index
