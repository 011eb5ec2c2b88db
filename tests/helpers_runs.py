"""Tiny real training runs for the widget and analysis tests: a Trainer with steps=2 on the shipped default model."""

from __future__ import annotations

from pathlib import Path

from brorl_lab.core.config import Config
from brorl_lab.rl.trainer import Trainer

# Columns that time a run (wall clock): everything else in a run's metrics is a function of its seed and settings.
TIMING = ("time/", "step_wall_s", "cum_wall_s", "samples_per_s", "tokens_per_s")


def without_timing(df):
    """``df`` without its :data:`TIMING` columns and with a fresh index: what two runs of one seed must share."""
    return df[[c for c in df.columns if not c.startswith(TIMING)]].reset_index(drop=True)


def run_names(root: Path) -> list[str]:
    """The run directories under ``root``, sorted, without their one-writer locks (``.<run>.lock`` beside each run,
    brorl_lab.core.runlock)."""
    return sorted(p.name for p in Path(root).iterdir() if not p.name.startswith("."))


def tiny_config(root: Path, name: str, **kw) -> Config:
    base = dict(tasks=["gcd"], rollouts_per_prompt=4, prompts_per_step=2, max_new_tokens=8, steps=2, eval_every=1,
                eval_prompts=8, eval_samples=4, eval_k=[1, 2, 4], checkpoint_every=0, max_resample_rounds=1,
                lr=3e-3, torch_threads=1, run_dir=str(root), run_name=name)
    base.update(kw)
    return Config(**base)


def make_tiny_runs(root: Path) -> dict[str, Path]:
    """Two finished two-step runs that differ in N (one with a reference reset every step) and one run directory
    that has only its config (a run that never logged a step): what a partial sweep leaves behind."""
    runs = {"n4": dict(rollouts_per_prompt=4, reset_every=1), "n8": dict(rollouts_per_prompt=8)}
    out = {}
    for name, kw in runs.items():
        with Trainer(tiny_config(root, name, **kw), progress=False) as t:
            t.run()
        out[name] = t.run_dir.path
    partial = Path(root) / "partial"
    partial.mkdir(parents=True, exist_ok=True)
    (partial / "config.yaml").write_text("rollouts_per_prompt: 16\n")
    out["partial"] = partial
    return out
