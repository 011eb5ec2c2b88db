"""The flagship's arms compared: their names and colours, each arm's summary, and both arms at an equal budget.

The arms are :func:`brorl_lab.study.arms.arm_configs`' ("prorl", "brorl" and optionally "middle"); the input is
the long table :func:`brorl_lab.study.arms.run_rollout_scaling` returns (columns arm, seed, step, cum_samples,
cum_updates, cum_wall_s, eval/<family>/pass@1, ...)::

    summarize(df)                       # one row per arm: final pass@1, samples, time, pass rate, throughput
    compare_arms(df, "cum_samples")     # per family: both arms at the largest budget every run reached (interpolated)
    collapse_flags(df)                  # COLLAPSE, the rule fixed before every run: seeds whose KL or pass@1 leave it

:func:`compare_arms` describes the runs between their measured points and serves the ablation table; it is not a
verdict. The study's one verdict is :func:`brorl_lab.study.revival.brorl_revives`, the rule fixed before the run,
on the shared grid where both arms are measured.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from brorl_lab.lab.analysis import MEAN, PASS1, curves_on_grid, families_of
from brorl_lab.lab.stats import t_interval

ARMS = ("prorl", "brorl")  # the flagship's two headline arms, in display order
ARM_NAMES = {"prorl": "ProRL", "brorl": "BroRL", "middle": "Middle"}
ARM_COLORS = {"prorl": "#1f77b4", "brorl": "#d62728", "middle": "#2ca02c"}  # one colour per arm in every figure
# The budgets two arms are compared at (labels: brorl_lab.lab.plots.X_AXES): generated samples (every
# dynamic-sampling round counted), optimizer updates, training wall time (evaluation excluded).
BUDGET_AXES = ("cum_samples", "cum_updates", "cum_wall_s")
# The collapse rule, fixed before the run and the same for every study (the flagship paid in samples, the regime
# map): an arm's seed has collapsed when its KL to the reference exceeds kl_max nats/token at any step, or its
# held-out mean pass@1 falls more than pass_drop below its start (the step-0 evaluation) at any evaluation.
# (2026-12-03: the sqrt-lr BroRL arm went to 1-2.5 nats/token within 4 steps; healthy arms stay under 0.1.)
COLLAPSE = dict(kl_max=0.5, pass_drop=0.10)


def check_frame(df: pd.DataFrame, need: Sequence[str] = ("arm", "seed", "step", "cum_samples", "cum_wall_s")
                 ) -> pd.DataFrame:
    """Validate a results table and return it with a ``run`` column (``<arm>_s<seed>``) if it had none."""
    if not isinstance(df, pd.DataFrame):
        raise ValueError(f"df: got {type(df).__name__}; allowed: the DataFrame study.arms.run_rollout_scaling returns")
    missing = [c for c in need if c not in df.columns]
    if missing or not families_of(df):
        raise ValueError(f"df: missing columns {missing or ['eval/<family>/pass@1']}; allowed: the DataFrame "
                         "run_rollout_scaling returns (columns arm, seed, step, cum_samples, cum_wall_s, eval/...)")
    arms = [a for a in ARMS if a in set(df["arm"])]
    if len(arms) < 2:
        raise ValueError(f"df: arms {sorted(set(df['arm']))}; allowed: rows of both arms {', '.join(ARMS)}")
    if "run" not in df.columns:
        df = df.assign(run=df["arm"].astype(str) + "_s" + df["seed"].astype(str))
    return df


def arm_display_names(df: pd.DataFrame) -> dict[str, str]:
    """{arm: display name with its N}, e.g. {"prorl": "ProRL (N=16)", "brorl": "BroRL (N=512)"}."""
    return {a: arm_label(df, a) for a in dict.fromkeys(df["arm"])}


def arm_label(df: pd.DataFrame, arm: str) -> str:
    n = df.loc[df["arm"] == arm, "rollouts_per_prompt"].dropna() if "rollouts_per_prompt" in df else pd.Series([])
    return f"{ARM_NAMES.get(arm, arm)} (N={int(n.iloc[0])})" if len(n) else ARM_NAMES.get(arm, arm)


def compare_arms(df: pd.DataFrame, x: str = "cum_samples") -> pd.DataFrame:
    """Held-out pass@1 of both arms at the same budget of ``x`` (``'cum_samples'`` or ``'cum_wall_s'``): the
    largest value every run (arm x seed) reached, each run's eval curve interpolated there
    (:func:`brorl_lab.lab.analysis.curves_on_grid`, never extrapolated: a description between measured points,
    not the verdict, which reads only measured points: :mod:`.revival`). One row per family and the mean: budget,
    each arm's mean over seeds, gap = BroRL - ProRL, and with paired seeds the spread (std) of the per-seed gaps,
    its standard error, its 95% t interval (gap_lo, gap_hi; t with seeds - 1 degrees of freedom) and whether that
    interval excludes 0 (``exceeds_noise``)."""
    df = check_frame(df)
    if x not in BUDGET_AXES:
        raise ValueError(f"x: got {x!r}; allowed: {', '.join(BUDGET_AXES)}")
    df = df[df["arm"].isin(ARMS)]
    seed_of = df.groupby("run")["seed"].first()
    rows = []
    for fam in families_of(df):
        grid = curves_on_grid(df, f"eval/{fam}/{PASS1}", x, points=2, labels=df.groupby("run")["arm"].first())
        if grid.empty:
            raise ValueError(f"df: the runs' eval/{fam}/{PASS1} curves do not cover a common range of {x}; "
                             "allowed: runs with at least two evaluations each")
        last = grid[grid["x"] == grid["x"].max()].assign(seed=lambda g: g["run"].map(seed_of))
        per = {a: last[last["arm"] == a].set_index("seed")["value"] for a in ARMS}
        common = sorted(set(per["prorl"].index) & set(per["brorl"].index))
        gaps = per["brorl"].loc[common] - per["prorl"].loc[common]
        n = len(common)
        ci = t_interval(gaps.to_numpy(float))
        gap = float(per["brorl"].mean() - per["prorl"].mean())
        rows.append({"family": fam, "x": x, "budget": float(grid["x"].max()), "prorl": float(per["prorl"].mean()),
                     "brorl": float(per["brorl"].mean()), "gap": gap, "seeds": n, "gap_spread": ci["sd"],
                     "gap_se": ci["se"], "gap_lo": ci["lo"], "gap_hi": ci["hi"],
                     "exceeds_noise": ci["excludes_zero"] if n >= 2 else None})
    return pd.DataFrame(rows)


def collapse_flags(df: pd.DataFrame, *, kl_max: float = COLLAPSE["kl_max"], pass_drop: float = COLLAPSE["pass_drop"],
                   metric: str = f"eval/{MEAN}/{PASS1}") -> pd.DataFrame:
    """:data:`COLLAPSE` applied to every arm and seed: columns arm, seed, max_kl, min_change (lowest pass@1 minus
    the start), collapsed and reason. A collapsed seed stays in every table; the report names it."""
    rows = []
    for (arm, seed), g in df.groupby(["arm", "seed"], sort=False):
        kl = float(g["kl"].max()) if "kl" in g and g["kl"].notna().any() else np.nan
        ev = g[g[metric].notna()].sort_values("step") if metric in g else g.iloc[:0]
        low = float(ev[metric].min() - ev[metric].iloc[0]) if len(ev) else np.nan
        reasons = ([f"KL {kl:.3g} > {kl_max}"] if kl == kl and kl > kl_max else []) + \
                  ([f"pass@1 fell {-100 * low:.1f} points > {100 * pass_drop:g}"] if low == low and low < -pass_drop
                   else [])
        rows.append({"arm": arm, "seed": int(seed), "max_kl": kl, "min_change": low, "collapsed": bool(reasons),
                     "reason": "; ".join(reasons)})
    return pd.DataFrame(rows, columns=["arm", "seed", "max_kl", "min_change", "collapsed", "reason"])


def summarize(df: pd.DataFrame) -> pd.DataFrame:
    """One row per arm (means over seeds, ``±`` std columns with >= 2 seeds): N and prompts per step, steps, final
    held-out pass@1 per family and their mean, generated and trained samples, training wall time, mean
    dynamic-sampling pass rate (kept / generated groups), generation samples/s and end-to-end samples/s."""
    df = check_frame(df)
    fams = families_of(df)
    per_run = []
    for (arm, seed), g in df.groupby(["arm", "seed"], sort=False):
        g = g.sort_values("step")
        ev = g[g[f"eval/{fams[0]}/{PASS1}"].notna()]
        steps = g[g["step"] > 0]
        gen_s = (steps["samples"] / steps["samples_per_s"]).sum() if {"samples", "samples_per_s"} <= set(g) else np.nan
        last = g.iloc[-1]
        row = {"arm": arm, "seed": seed,
               "N": g["rollouts_per_prompt"].iloc[0] if "rollouts_per_prompt" in g else np.nan,
               "prompts_per_step": g["prompts_per_step"].iloc[0] if "prompts_per_step" in g else np.nan,
               "steps": int(g["step"].max()),
               **{f"final {PASS1} {f}": float(ev[f"eval/{f}/{PASS1}"].iloc[-1]) for f in fams},
               "samples": float(last["cum_samples"]),
               "trained_samples": float(last["cum_trained_samples"]) if "cum_trained_samples" in g else np.nan,
               "wall_s": float(last["cum_wall_s"]),
               "ds_pass_rate": float(steps["ds_pass_rate"].mean()) if "ds_pass_rate" in g else np.nan,
               "gen_samples_per_s": float(steps["samples"].sum() / gen_s) if gen_s and gen_s > 0 else np.nan,
               "samples_per_s": float(last["cum_samples"] / last["cum_wall_s"]) if last["cum_wall_s"] > 0 else np.nan}
        per_run.append(row)
    runs = pd.DataFrame(per_run)
    numeric = [c for c in runs.columns if c not in ("arm", "seed")]
    order = [a for a in ARMS if a in set(runs["arm"])] + sorted(set(runs["arm"]) - set(ARMS))
    out = runs.groupby("arm")[numeric].mean().reindex(order)
    out.insert(0, "seeds", runs.groupby("arm")["seed"].nunique().reindex(order))
    if out["seeds"].max() >= 2:
        for f in fams:
            out[f"± {PASS1} {f}"] = runs.groupby("arm")[f"final {PASS1} {f}"].std(ddof=1).reindex(order)
    out.index = [arm_label(df, a) for a in order]
    out.index.name = "arm"
    return out
