"""Job functions for tests/test_jobs.py: module-level, so spawned workers and Ray tasks import them by name."""

from __future__ import annotations

import os
import time
from pathlib import Path

from brorl_lab.core.config import Config


def matmul_job(seed: int, run_dir: str) -> dict:
    """A seeded torch computation whose float sums depend on the thread count, and where it ran."""
    import torch

    g = torch.Generator().manual_seed(seed)
    a = torch.randn(300, 300, generator=g)
    out = (a @ a.T @ a).sum(1)  # [300]
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    (Path(run_dir) / "done").write_text(str(seed))
    return {"seed": seed, "out": out.numpy().tobytes(), "threads": torch.get_num_threads(),
            "omp": os.environ.get("OMP_NUM_THREADS"), "pid": os.getpid()}


def failing_job(seconds: float = 0.0) -> None:
    time.sleep(seconds)
    raise ValueError("this job fails on purpose")


def sleeping_job(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


def train_job(cfg: Config, pause_s: float = 0.0) -> tuple:
    """One Trainer run to cfg.steps, resumed from its checkpoint when it has one: (metrics, finished). ``pause_s``
    sleeps after each step (it changes no number): it paces a test's runs so that a signal sent at step 2 lands
    mid-run however fast the machine, and however far apart the two workers started."""
    from brorl_lab.rl.trainer import CHECKPOINT_FILE, Trainer

    path = Path(cfg.run_dir) / cfg.run_name
    pace = [lambda _trainer, _row: time.sleep(pause_s)] if pause_s else []
    if (path / "checkpoint" / CHECKPOINT_FILE).is_file():
        trainer = Trainer.resume(path, progress=False, callbacks=pace)
    else:
        trainer = Trainer(cfg, progress=False, overwrite=True, callbacks=pace)
    with trainer:
        df = trainer.run()
        return df, trainer.step_idx >= cfg.steps
