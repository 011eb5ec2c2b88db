"""Comparing training runs: arms, iso-samples / iso-time curves and pass@k, as pure functions of DataFrames.

Inputs are the long metrics table of :func:`brorl_lab.lab.tracking.load_runs` (one row per run and step, a ``run``
column, config fields as ``cfg.<field>`` columns). Outputs are DataFrames that :mod:`brorl_lab.lab.plots` turns into
figures (notebook 04, the run browser)::

    df     = load_runs("runs/sweeps/n")
    labels = arm_labels(df)                                     # run -> "rollouts_per_prompt=512"
    curves = curves_on_grid(df, "eval/mean/pass@1", "cum_samples", labels=labels)
    table  = pass_at_k_table(df, labels=labels)                 # initial and final pass@k per run and k

An *arm* is one setting of the knobs a sweep varied; its seeds are pooled. Curves of different runs are compared
on a common grid of the x axis (samples generated, training time), interpolated linearly between each run's
evaluations and never extrapolated: the grid spans only the range every compared run covers.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Optional

import numpy as np
import pandas as pd

from brorl_lab.core.rundir import eval_key
from brorl_lab.core.validation import check_int

PASS1 = "pass@1"
MEAN = "mean"  # the family name of the mean over families in eval/<family>/<metric> columns
# Config fields that name or place a run, or that do not change what is learned: never what tells arms apart.
ARM_IGNORE = ("run_name", "run_dir", "seed", "torch_threads", "checkpoint_every", "device", "ray_address")
PASS_AT_K = re.compile(r"^eval/(?P<family>[^/]+)/pass@(?P<k>\d+)$")


def arm_labels(df: pd.DataFrame, *, fields: Optional[Sequence[str]] = None,
               ignore: tuple = ARM_IGNORE) -> pd.Series:
    """run -> arm label built from the config fields in ``fields``, or by default from the ``cfg.*`` columns whose
    value differs between runs (``ignore`` left out), e.g. ``"kl_beta=0.0, rollouts_per_prompt=512"``. Runs that
    differ only in ignored fields (seeds) share a label; when nothing differs every run is ``"all runs"``; without
    config columns the label is the run name."""
    if df.empty or "run" not in df:
        return pd.Series(dtype=object, name="arm")
    per_run = df.groupby("run", sort=True).first()
    if fields is not None:
        missing = [f for f in fields if f"cfg.{f}" not in per_run]
        if missing or not fields:
            raise ValueError(f"fields: {missing or list(fields)} are not config fields of these runs; allowed: "
                             f"{sorted(c[4:] for c in per_run.columns if c.startswith('cfg.'))}")
    cols = [c for c in per_run.columns if c.startswith("cfg.") and c[4:] not in ignore] if fields is None \
        else [f"cfg.{f}" for f in fields]
    if not cols:
        return pd.Series(per_run.index, index=per_run.index, name="arm")
    varying = cols if fields is not None else [c for c in cols if per_run[c].astype(str).nunique(dropna=False) > 1]
    if not varying:
        return pd.Series("all runs", index=per_run.index, name="arm")
    labels = per_run[varying].astype(str).apply(
        lambda r: ", ".join(f"{c[4:]}={v}" for c, v in r.items()), axis=1)
    return labels.rename("arm")


def _labels(df: pd.DataFrame, labels: Optional[Mapping[str, str] | pd.Series]) -> pd.Series:
    return arm_labels(df) if labels is None else pd.Series(dict(labels) if isinstance(labels, Mapping) else labels)


def curve_points(df: pd.DataFrame, metric: str, x: str = "step") -> tuple[np.ndarray, np.ndarray]:
    """The finite (x, metric) points of one run's rows, sorted by x (eval metrics exist only on eval steps)."""
    if df.empty or metric not in df or x not in df:
        return np.array([]), np.array([])
    xs = pd.to_numeric(df[x], errors="coerce").to_numpy(dtype=float)
    ys = pd.to_numeric(df[metric], errors="coerce").to_numpy(dtype=float)
    ok = np.isfinite(xs) & np.isfinite(ys)
    order = np.argsort(xs[ok], kind="stable")
    return xs[ok][order], ys[ok][order]


def curves_on_grid(df: pd.DataFrame, metric: str, x: str, *, points: int = 41,
                   labels: Optional[Mapping[str, str] | pd.Series] = None) -> pd.DataFrame:
    """Each run's ``metric`` interpolated onto one grid of ``x`` (``points`` values from the largest first x to the
    smallest last x over runs: the range all of them cover). Runs with fewer than two points of the metric are left
    out. Columns: run, arm, x, value; an empty frame when no two-point run exists or the ranges do not overlap."""
    check_int('points', points, 2)
    cols = ["run", "arm", "x", "value"]
    if df.empty or "run" not in df:
        return pd.DataFrame(columns=cols)
    lab = _labels(df, labels)
    runs = {run: curve_points(g, metric, x) for run, g in df.groupby("run", sort=True)}
    runs = {r: xy for r, xy in runs.items() if len(xy[0]) >= 2}
    if not runs:
        return pd.DataFrame(columns=cols)
    lo = max(xy[0][0] for xy in runs.values())
    hi = min(xy[0][-1] for xy in runs.values())
    if not hi > lo:
        return pd.DataFrame(columns=cols)
    grid = np.linspace(lo, hi, points)
    frames = [pd.DataFrame({"run": run, "arm": lab.get(run, run), "x": grid, "value": np.interp(grid, xs, ys)})
              for run, (xs, ys) in runs.items()]
    return pd.concat(frames, ignore_index=True)


def arm_curves(curves: pd.DataFrame) -> pd.DataFrame:
    """Pool the seeds of each arm on the grid: columns arm, x, mean, min, max, runs."""
    if curves.empty:
        return pd.DataFrame(columns=["arm", "x", "mean", "min", "max", "runs"])
    g = curves.groupby(["arm", "x"], sort=True)["value"]
    return g.agg(["mean", "min", "max", "count"]).rename(columns={"count": "runs"}).reset_index()


def at_budget(curves: pd.DataFrame) -> pd.DataFrame:
    """Each arm at the end of the common grid (the largest x every run reached): arm, x, mean, min, max, runs,
    sorted best first."""
    pooled = arm_curves(curves)
    if pooled.empty:
        return pooled
    last = pooled[pooled["x"] == pooled["x"].max()]
    return last.sort_values("mean", ascending=False).reset_index(drop=True)


def pass_at_k_columns(df: pd.DataFrame, family: str = "mean") -> dict[int, str]:
    """{k: column} of the ``eval/<family>/pass@k`` columns present in ``df``, sorted by k."""
    found = {int(m["k"]): c for c in df.columns if (m := PASS_AT_K.match(c)) and m["family"] == family}
    return dict(sorted(found.items()))


def eval_families(df: pd.DataFrame) -> list[str]:
    """Families with pass@k columns, "mean" first when present."""
    fams = sorted({m["family"] for c in df.columns if (m := PASS_AT_K.match(c))})
    return sorted(fams, key=lambda f: f != "mean")


def pass_at_k_table(df: pd.DataFrame, *, family: str = "mean",
                    labels: Optional[Mapping[str, str] | pd.Series] = None) -> pd.DataFrame:
    """Per run and k: pass@k at the run's first evaluation (``initial``) and its last (``final``), their ``gain``,
    and the steps they were measured at. A run with a single evaluation has initial == final. Columns: run, arm,
    k, initial, final, gain, initial_step, final_step."""
    cols = ["run", "arm", "k", "initial", "final", "gain", "initial_step", "final_step"]
    ks = pass_at_k_columns(df, family)
    if df.empty or not ks or "run" not in df:
        return pd.DataFrame(columns=cols)
    lab = _labels(df, labels)
    rows = []
    for run, g in df.groupby("run", sort=True):
        g = g.sort_values("step") if "step" in g else g
        evals = g.dropna(subset=list(ks.values()), how="all")
        if evals.empty:
            continue
        first, last = evals.iloc[0], evals.iloc[-1]
        for k, col in ks.items():
            rows.append({"run": run, "arm": lab.get(run, run), "k": k, "initial": first[col], "final": last[col],
                         "gain": last[col] - first[col], "initial_step": first.get("step"),
                         "final_step": last.get("step")})
    return pd.DataFrame(rows, columns=cols)


def arm_pass_at_k(table: pd.DataFrame) -> pd.DataFrame:
    """:func:`pass_at_k_table` pooled over each arm's runs: arm, k, initial, final, gain (means), runs."""
    if table.empty:
        return pd.DataFrame(columns=["arm", "k", "initial", "final", "gain", "runs"])
    g = table.groupby(["arm", "k"], sort=True)
    out = g[["initial", "final", "gain"]].mean()
    out["runs"] = g.size()
    return out.reset_index()


def boundary_summary(pooled: pd.DataFrame) -> pd.DataFrame:
    """Per arm, from :func:`arm_pass_at_k`: the gain at the smallest and the largest k, and a reading of the two:
    "widens" (the large-k gain is positive: problems never solved before now are), "sharpens only" (pass@1 rose,
    large-k did not), "no gain" otherwise. Small runs are noisy: read it with the run counts and curves."""
    cols = ["arm", "k_small", "gain_small", "k_large", "gain_large", "runs", "reading"]
    if pooled.empty:
        return pd.DataFrame(columns=cols)
    rows = []
    for arm, g in pooled.groupby("arm", sort=True):
        g = g.sort_values("k")
        lo, hi = g.iloc[0], g.iloc[-1]
        if hi["gain"] > 0 and len(g) > 1:
            reading = "widens"
        elif lo["gain"] > 0:
            reading = "sharpens only"
        else:
            reading = "no gain"
        rows.append({"arm": arm, "k_small": int(lo["k"]), "gain_small": lo["gain"], "k_large": int(hi["k"]),
                     "gain_large": hi["gain"], "runs": int(g["runs"].max()), "reading": reading})
    return pd.DataFrame(rows, columns=cols)


def families_of(df: pd.DataFrame) -> list[str]:
    """Families with a held-out pass@1 column (``eval/<family>/pass@1``), the mean over families last."""
    fams = [eval_key(c)[0] for c in df.columns if c.startswith("eval/") and c.endswith(f"/{PASS1}")]
    return [f for f in fams if f != MEAN] + ([MEAN] if MEAN in fams else [])


# ---- iso-compute sweep over N: where larger N stops paying ----------------------------------------------------------
def iso_compute_summary(df: pd.DataFrame, *, family: str = MEAN) -> pd.DataFrame:
    """Per N (``cfg.rollouts_per_prompt``) and k, over the seeds of an iso-compute sweep (the same samples per step
    for every N, :func:`brorl_lab.lab.sweep.iso_compute_plan`): held-out pass@k of ``family`` at the last
    evaluation (``final``, mean and std over seeds), its ``gain`` over the first evaluation (mean, std) and the
    number of seeds. Columns: N, prompts_per_step, k, seeds, final, final_std, gain, gain_std. A gain that grows with
    k says a larger N widens the reasoning boundary; one that shrinks with k says it only sharpens pass@1."""
    need = ("cfg.rollouts_per_prompt", "cfg.prompts_per_step")
    if not isinstance(df, pd.DataFrame) or df.empty or any(c not in df for c in need):
        raise ValueError(f"df: allowed: load_runs() of an iso-compute sweep (columns run, {', '.join(need)}, "
                         "eval/<family>/pass@k)")
    per_run = df.groupby("run")[list(need)].first()
    table = pass_at_k_table(df, family=family, labels=per_run["cfg.rollouts_per_prompt"].astype(int))
    if table.empty:
        raise ValueError(f"df: no eval/{family}/pass@k columns; allowed: runs evaluated with eval_k")
    table = table.rename(columns={"arm": "N"})
    g = table.groupby(["N", "k"], sort=True)
    out = g.agg(seeds=("run", "nunique"), final=("final", "mean"), final_std=("final", "std"),
                gain=("gain", "mean"), gain_std=("gain", "std")).reset_index()
    out.insert(1, "prompts_per_step", out["N"].map(per_run.groupby("cfg.rollouts_per_prompt")
                                                   ["cfg.prompts_per_step"].first()).astype(int))
    return with_intervals(out)


def with_intervals(summary: pd.DataFrame, *, level: float = 0.95) -> pd.DataFrame:
    """:func:`iso_compute_summary` (or its saved CSV) with the ``level`` t interval of each mean gain over its
    seeds: gain_lo, gain_hi = gain -+ t_{(1+level)/2, seeds-1} * gain_std / sqrt(seeds), and ``resolved``
    (the interval excludes 0). With 3 seeds t = 4.30: a gain must exceed 2.5 standard deviations to be resolved."""
    from brorl_lab.lab.stats import t_quantile

    need = {"gain", "gain_std", "seeds"}
    if not isinstance(summary, pd.DataFrame) or not need <= set(summary.columns):
        raise ValueError(f"summary: allowed: an iso_compute_summary table (columns {sorted(need)})")
    out = summary.copy()
    n = out["seeds"].astype(float)
    t = [t_quantile(0.5 + level / 2, int(k) - 1) if k >= 2 else np.nan for k in n]
    half = np.asarray(t) * out["gain_std"] / np.sqrt(n)
    out["gain_lo"], out["gain_hi"] = out["gain"] - half, out["gain"] + half
    out["resolved"] = (out["gain_lo"] > 0) | (out["gain_hi"] < 0)
    return out
