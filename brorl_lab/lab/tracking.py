"""Reading runs back: every run's metrics in one DataFrame, and the index of runs (what notebooks and widgets read).

The writing side (run directories, atomic writes, environment info) is :mod:`brorl_lab.core.rundir`, re-exported
here so a notebook needs one import.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from brorl_lab.core.rundir import RunDir, atomic_write, atomic_write_text, environment_info  # noqa: F401


def load_runs(root: str | os.PathLike = "runs") -> pd.DataFrame:
    """Every run's metrics under ``root`` in one long DataFrame, with a ``run`` column and the run's config
    fields prefixed ``cfg.`` (so a sweep's arms can be grouped by any knob)."""
    return load_run_dirs({str(m.parent.relative_to(root)): m.parent
                          for m in sorted(Path(root).glob("**/metrics.parquet"))})


def load_run_dirs(runs: Mapping[str, str | os.PathLike]) -> pd.DataFrame:
    """The metrics of the run directories ``runs`` ({name: directory}) stacked as :func:`load_runs` does, so runs
    from different roots (a report's command line) are compared like runs under one."""
    frames = [f for name, path in runs.items() if not (f := run_frame(path, name)).empty]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def run_frame(path: str | os.PathLike, name: str) -> pd.DataFrame:
    """One run's metrics with its ``run`` name and ``cfg.*`` config columns (empty when it has no metrics). A table
    that already names its runs (a notebook's combined arms table) keeps them, prefixed ``<name>/``."""
    df = RunDir(path).read_metrics()
    if df.empty:
        return df
    runs = name + "/" + df.pop("run").astype(str) if "run" in df else name
    df.insert(0, "run", runs)
    for k, v in _config_of(path).items():
        df[f"cfg.{k}"] = v
    return df


def _config_of(path: str | os.PathLike) -> dict:
    """A run's config.yaml, lists and dicts as strings (one cell each); {} when it is missing or unreadable."""
    try:
        cfg = RunDir(path).read_config() or {}
    except (OSError, ValueError):
        cfg = {}
    return {k: str(v) if isinstance(v, (list, dict)) else v for k, v in cfg.items()}


def run_index(root: str | os.PathLike = "runs") -> pd.DataFrame:
    """One row per run under ``root``: name, status ("interrupted (writer gone)" for a run whose process died while
    its status said running), steps done, final metrics, config fields."""
    return pd.DataFrame([run_summary(c.parent, str(c.parent.relative_to(root)))
                         for c in sorted(Path(root).glob("**/config.yaml"))])


def run_summary(path: str | os.PathLike, name: str) -> dict[str, Any]:
    """One run as a row of :func:`run_index`: name, status, steps done, final metrics, config fields."""
    from brorl_lab.core.rundir import RunFileError

    run = RunDir(path)
    row: dict[str, Any] = {"run": name, **run.read_status()}
    try:
        m = run.read_metrics()
    except RunFileError as e:  # the index lists the run and says why it has no numbers
        m = pd.DataFrame()
        row["error"] = str(e)
    if not m.empty:
        # steps are 1-based; row 0 is the evaluation before training, not a step
        row["steps_done"] = int(m["step"].max()) if "step" in m else len(m)
        trained = m[m["step"] >= 1] if "step" in m else m
        if "skipped" in trained:
            row["steps_trained"] = int((~trained["skipped"].astype(bool)).sum())
        last = m.iloc[-1]
        for col in m.columns:
            if col.startswith("eval/") or col in ("reward_mean", "pass_at_1", "cum_samples", "cum_wall_s"):
                row[f"final.{col}"] = last[col]
    row.update({f"cfg.{k}": v for k, v in _config_of(path).items()})
    return row


def find_run_dirs(path: str | os.PathLike) -> list[Path]:
    """The Trainer runs at or below ``path``: directories holding both config.yaml and metrics.parquet (a
    notebook's combined metrics table, with no config of its own, is not one). Sorted; [] when there are none."""
    return [m.parent for m in sorted(Path(path).glob("**/metrics.parquet")) if (m.parent / "config.yaml").is_file()]
