"""Reading runs back: every run's metrics in one DataFrame, and the index of runs (what notebooks and widgets read).

The writing side (run directories, atomic writes, environment info) is :mod:`brorl_lab.core.rundir`, re-exported
here so a notebook needs one import.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pandas as pd

from brorl_lab.core.rundir import RunDir, atomic_write, atomic_write_text, environment_info  # noqa: F401


def load_runs(root: str | os.PathLike = "runs") -> pd.DataFrame:
    """Every run's metrics under ``root`` in one long DataFrame, with a ``run`` column and the run's config
    fields prefixed ``cfg.`` (so a sweep's arms can be grouped by any knob)."""
    frames = []
    for metrics in sorted(Path(root).glob("**/metrics.parquet")):
        run = RunDir(metrics.parent)
        df = pd.read_parquet(metrics)
        if df.empty:
            continue
        df.insert(0, "run", str(metrics.parent.relative_to(root)))
        try:
            cfg = run.read_config()
        except (OSError, ValueError):
            cfg = {}
        for k, v in cfg.items():
            df[f"cfg.{k}"] = str(v) if isinstance(v, (list, dict)) else v
        frames.append(df)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def run_index(root: str | os.PathLike = "runs") -> pd.DataFrame:
    """One row per run under ``root``: name, status, steps done, final metrics, config fields."""
    rows = []
    for cfg_path in sorted(Path(root).glob("**/config.yaml")):
        run = RunDir(cfg_path.parent)
        row: dict[str, Any] = {"run": str(cfg_path.parent.relative_to(root)), **run.read_status()}
        m = run.read_metrics()
        if not m.empty:
            row["steps_done"] = int(m["step"].max()) + 1 if "step" in m else len(m)
            last = m.iloc[-1]
            for col in m.columns:
                if col.startswith("eval/") or col in ("reward_mean", "pass_at_1", "cum_samples", "cum_wall_s"):
                    row[f"final.{col}"] = last[col]
        try:
            for k, v in run.read_config().items():
                row[f"cfg.{k}"] = str(v) if isinstance(v, (list, dict)) else v
        except (OSError, ValueError):
            pass
        rows.append(row)
    return pd.DataFrame(rows)
