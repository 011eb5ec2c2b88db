"""Does BroRL revive the plateau? The study's one verdict: the rule fixed before the run, on the shared grid.

The arms of :func:`brorl_lab.study.arms.arm_configs` are evaluated at the same sample counts (steps x prompts x N)
and the same optimizer-update counts, so every budget below is a measured point of both arms, paired by seed:

    grid_comparison(df, "cum_nominal_samples")   # per grid point: each arm's mean, the paired gap, its t interval
    arm_slope(df, "prorl")                       # per-seed OLS slope of pass@1 over samples, t interval over seeds
    mechanism_gaps(before, after)                # per seed: BroRL - ProRL change of p on the prompts N=512 adds
    report = revival_report(df, mechanism=...)   # everything, with the rule's outcome: a JSON-able dict
    print(revival_text(report))

**The rule** (:data:`REVIVES_RULE`, :func:`brorl_revives`), on held-out mean pass@1 with 95% t intervals over the
paired seeds; BroRL "revives" the run only when all four hold:

1. the ProRL arm has stalled: the interval of its slope over the branch contains 0;
2. the BroRL arm has not: the interval of its slope lies above 0;
3. BroRL is ahead at equal samples: the interval of the paired gap BroRL - ProRL at the last shared sample count
   lies above 0;
4. the gain is where the theory puts it: on the training prompts that only N = 512 reaches, on their low-p side
   ('only N=512' with p < 0.5 at the branch point, :mod:`brorl_lab.study.mechanism`; a wider class than rare success,
   :mod:`brorl_lab.study.rare`), the interval of the paired difference (BroRL arm's change of p) - (ProRL arm's change
   of p) lies above 0.

A condition whose numbers are missing (too few seeds, the mechanism not measured) counts as not met, and says so.

This is the only verdict in the package: notebook 02, ``make demo``'s verdict.txt and the docs all print
:func:`revival_text` of :func:`revival_report`. (:func:`brorl_lab.study.compare.compare_arms` describes both arms at an
interpolated budget; it judges nothing.)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Optional

import numpy as np
import pandas as pd

from brorl_lab.lab.analysis import MEAN, PASS1, pass_at_k_columns
from brorl_lab.lab.stats import format_interval, ols_slope, paired_t_interval, t_interval
from brorl_lab.study.compare import ARM_NAMES
from brorl_lab.study.rare import ONLY_LARGE

# The shared grid's axes (study.arms.label_arm adds the columns; labels: brorl_lab.lab.plots.X_AXES): samples as
# planned (steps x prompts x N) and optimizer updates as planned (steps x updates per step).
GRID_AXES = ("cum_nominal_samples", "cum_nominal_updates")
SLOPE_PER = 10_000  # slopes are in pass@1 per 10,000 samples
METRIC = f"eval/{MEAN}/{PASS1}"
RARE_SIDE = f"{ONLY_LARGE}, p < 0.5"

REVIVES_RULE = (
    "BroRL revives the plateau iff, on held-out mean pass@1 with 95% t intervals over paired seeds: (1) the ProRL "
    "arm's slope over the branch has an interval containing 0; (2) the BroRL arm's slope has an interval above 0; "
    "(3) the paired gap BroRL - ProRL at the last shared sample count has an interval above 0; (4) on the training "
    f"prompts '{RARE_SIDE}' at the branch point, the paired difference of the change in p (BroRL arm - ProRL arm) "
    "has an interval above 0. A condition without numbers is not met.")


def _evals(df: pd.DataFrame, arm: str, metric: str) -> pd.DataFrame:
    rows = df[(df["arm"] == arm) & df[metric].notna()] if metric in df else df.iloc[:0]
    if rows.empty:
        raise ValueError(f"df: no {metric} evaluations of arm {arm!r}; allowed: the DataFrame run_rollout_scaling "
                         f"returns, with arms {sorted(set(df['arm']))}")
    return rows


def grid_values(df: pd.DataFrame, x: str = "cum_nominal_samples", *, arm: str = "brorl",
                metric: str = METRIC) -> list[float]:
    """The budgets of the shared grid: the values of ``x`` at which ``arm`` was evaluated (0, the branch point,
    included), the same for every one of its seeds."""
    if x not in GRID_AXES:
        raise ValueError(f"x: got {x!r}; allowed: {', '.join(GRID_AXES)}")
    ev = _evals(df, arm, metric)
    per_seed = {s: tuple(sorted(g[x])) for s, g in ev.groupby("seed")}
    if len(set(per_seed.values())) != 1:
        raise ValueError(f"df: the {arm} arm's seeds were evaluated at different {x}: {per_seed}; allowed: runs of one "
                         "arm_configs plan")
    return [float(v) for v in next(iter(per_seed.values()))]


def grid_comparison(df: pd.DataFrame, x: str = "cum_nominal_samples", *, arm: str = "brorl",
                    against: str = "prorl", metric: str = METRIC, grid_arm: str = "brorl") -> pd.DataFrame:
    """At every point of the shared grid of ``x`` (:func:`grid_values`), both arms' measured ``metric`` paired by
    seed: one row per budget with n (paired seeds), each arm's mean, the gap ``arm - against`` and its 95% t
    interval (lo, hi), the sd of the per-seed gaps, and the smallest detectable gap (mde; mde_power at 80%).
    Every seed of both arms must have an evaluation at exactly that budget: a grid point one of them lacks is an
    error, not an interpolation. The grid is ``grid_arm``'s (the BroRL arm's: every arm is measured there; a middle
    arm's own extra points are not the ProRL arm's)."""
    grid = grid_values(df, x, arm=grid_arm, metric=metric)
    a, b = _evals(df, arm, metric), _evals(df, against, metric)
    seeds = sorted(set(a["seed"]) & set(b["seed"]))
    if not seeds:
        raise ValueError(f"df: arms {arm!r} and {against!r} share no seed; allowed: paired seeds")
    rows = []
    for v in grid:
        vals = {}
        for name, ev in ((arm, a), (against, b)):
            at = ev[(ev[x] == v) & ev["seed"].isin(seeds)].drop_duplicates("seed").set_index("seed")[metric]
            missing = sorted(set(seeds) - set(at.index))
            if missing:
                raise ValueError(f"df: the {name} arm has no {metric} at {x} = {v:g} for seeds {missing}; allowed: "
                                 "arms of one arm_configs plan (evaluated on the shared grid)")
            vals[name] = at.loc[seeds].to_numpy(float)
        ci = paired_t_interval(vals[arm], vals[against])
        rows.append({"x": x, "budget": v, "n": len(seeds), arm: vals[arm].mean(), against: vals[against].mean(),
                     "gap": ci["mean"], "lo": ci["lo"], "hi": ci["hi"], "sd": ci["sd"], "t": ci["t"],
                     "mde": ci["mde"], "mde_power": ci["mde_power"]})
    return pd.DataFrame(rows)


def in_points(grid: pd.DataFrame) -> pd.DataFrame:
    """A :func:`grid_comparison` table for reading: indexed by budget, the gap, its interval, sd and MDEs in points
    (0.01 pass@1), the arms' means as pass@1."""
    out = grid.drop(columns="x").set_index("budget")
    cols = ["gap", "lo", "hi", "sd", "mde", "mde_power"]
    out[cols] = 100 * out[cols]
    return out


def arm_slope(df: pd.DataFrame, arm: str, *, metric: str = METRIC, x: str = "cum_nominal_samples",
              per: float = SLOPE_PER) -> dict:
    """The arm's trend over the branch: for each seed the least-squares slope of ``metric`` against ``x`` over its
    evaluations on the shared sample grid (branch point included), in ``metric`` per ``per`` samples; then the
    mean over seeds with its 95% t interval (:func:`brorl_lab.lab.stats.t_interval`; ``slopes`` lists them)."""
    grid = set(grid_values(df, x, metric=metric))
    ev = _evals(df, arm, metric)
    slopes = []
    for _, g in ev.groupby("seed", sort=True):
        g = g[g[x].isin(grid)].drop_duplicates(x)
        slopes.append(ols_slope(g[x].to_numpy(float) / per, g[metric].to_numpy(float)))
    slopes = [s for s in slopes if np.isfinite(s)]
    return {**t_interval(slopes), "slopes": slopes, "per_samples": per}


def mechanism_gaps(before: pd.DataFrame, after: Mapping[int, Mapping[str, pd.DataFrame]], *,
                   arm: str = "brorl", against: str = "prorl") -> dict:
    """Condition 4's numbers: for each seed, the mean change of p from the branch point (``before``, one
    :func:`brorl_lab.study.mechanism.prompt_pass_rates` table) to each arm's final policy (``after[seed][arm]``, the
    same prompts) on the prompts of class 'only N=512' with p < 0.5 at the branch point, and the difference
    ``arm - against``; then its 95% t interval over seeds. Keys: prompts (how many are in the class), per_seed
    ({seed: {arm: change, against: change, "diff": ...}}) and the t_interval keys."""
    need = {"uid", "p", "reach"}
    if not isinstance(before, pd.DataFrame) or not need <= set(before.columns):
        raise ValueError(f"before: allowed: a prompt_pass_rates table (columns {sorted(need)})")
    cls = before[(before["reach"] == ONLY_LARGE) & (before["p"] < 0.5)]
    per_seed = {}
    for seed, arms in sorted(after.items()):
        row = {}
        for name in (arm, against):
            if name not in arms:
                raise ValueError(f"after[{seed}]: no {name!r} table; allowed: {{arm: prompt_pass_rates}} per seed")
            m = cls[["uid", "p"]].merge(arms[name][["uid", "p"]], on="uid", suffixes=("", "_after"),
                                        validate="one_to_one")
            if len(m) != len(cls):
                raise ValueError(f"after[{seed}][{name!r}]: covers {len(m)} of the {len(cls)} class prompts; allowed: "
                                 "the same items as before")
            row[name] = float((m["p_after"] - m["p"]).mean()) if len(m) else float("nan")
        row["diff"] = row[arm] - row[against]
        per_seed[int(seed)] = row
    diffs = [r["diff"] for r in per_seed.values() if np.isfinite(r["diff"])]
    return {**t_interval(diffs), "prompts": int(len(cls)), "per_seed": per_seed}


def brorl_revives(prorl_slope: dict, brorl_slope: dict, gap: dict, mechanism: Optional[dict]) -> dict:
    """The rule (:data:`REVIVES_RULE`) on its four inputs, each a t-interval dict (keys n, lo, hi; ``mechanism``
    may be None: not measured). Returns {"rule", "conditions": {name: {"met", "why"}}, "revives"}."""
    def has(ci: Optional[dict]) -> bool:
        return ci is not None and ci.get("n", 0) >= 2 and np.isfinite(ci.get("lo", np.nan)) \
            and np.isfinite(ci.get("hi", np.nan))

    def cond(ci, test, what: str) -> dict:
        if not has(ci):
            return {"met": False, "why": f"{what}: no interval (fewer than 2 paired seeds, or not measured)"}
        ok = bool(test(ci["lo"], ci["hi"]))
        return {"met": ok, "why": f"{what}: [{ci['lo']:+.4f}, {ci['hi']:+.4f}] (n={ci['n']})"}

    conditions = {
        "prorl_stalled": cond(prorl_slope, lambda lo, hi: lo <= 0 <= hi, "ProRL slope interval contains 0"),
        "brorl_rising": cond(brorl_slope, lambda lo, hi: lo > 0, "BroRL slope interval above 0"),
        "ahead_at_equal_samples": cond(gap, lambda lo, hi: lo > 0, "gap at equal samples above 0"),
        "gain_on_rare_side": cond(mechanism, lambda lo, hi: lo > 0, f"gain on '{RARE_SIDE}' prompts above 0"),
    }
    return {"rule": REVIVES_RULE, "conditions": conditions, "revives": all(c["met"] for c in conditions.values())}


def revival_report(df: pd.DataFrame, *, mechanism: Optional[dict] = None, arm: str = "brorl",
                   against: str = "prorl") -> dict:
    """Every number of the flagship's verdict from the long results table ``df`` (and condition 4's
    :func:`mechanism_gaps`): the shared grids with the paired gaps, both arms' slopes, pass@k at every k at the last
    shared sample count, the smallest detectable effect, and the rule's outcome. JSON-able."""
    grids = {x: grid_comparison(df, x, arm=arm, against=against) for x in GRID_AXES}
    slopes = {name: arm_slope(df, name) for name in (against, arm)}
    final = grids["cum_nominal_samples"].iloc[-1]
    gap = {"n": int(final["n"]), "mean": final["gap"], "lo": final["lo"], "hi": final["hi"], "sd": final["sd"],
           "t": final["t"], "mde": final["mde"], "mde_power": final["mde_power"], "budget": final["budget"]}
    pass_at_k = {}
    for k, col in pass_at_k_columns(df).items():
        g = grid_comparison(df, "cum_nominal_samples", arm=arm, against=against, metric=col).iloc[-1]
        pass_at_k[int(k)] = {kk: float(g[kk]) for kk in (arm, against, "gap", "lo", "hi", "mde")} | {"n": int(g["n"])}
    outcome = brorl_revives(slopes[against], slopes[arm], gap, mechanism)
    clean = {k: v for k, v in (mechanism or {}).items() if k != "per_seed"}
    return {"arms": {against: ARM_NAMES.get(against, against), arm: ARM_NAMES.get(arm, arm)},
            "seeds": int(final["n"]), "metric": METRIC,
            "grids": {x: g.drop(columns="x").to_dict(orient="records") for x, g in grids.items()},
            "slopes": {k: {kk: v for kk, v in s.items()} for k, s in slopes.items()},
            "gap_at_equal_samples": gap, "pass_at_k_at_equal_samples": pass_at_k,
            "mechanism": ({**clean, "per_seed": {str(s): r for s, r in mechanism["per_seed"].items()}}
                          if mechanism else None),
            **outcome}


def revival_text(report: dict) -> str:
    """The report in plain words, every number with its interval; the outcome said whatever it is."""
    a, b = report["arms"]["brorl"], report["arms"]["prorl"]
    n = report["seeds"]
    gap = report["gap_at_equal_samples"]
    lines = [f"Does {a} revive the plateau? {'YES' if report['revives'] else 'NO'}: by the rule fixed before the "
             f"run ({n} paired seed{'s' * (n != 1)}; 95% t intervals, t_(0.975, {n - 1})"
             + (f" = {gap['t']:.2f}" if np.isfinite(gap["t"]) else "") + ").",
             f"Rule: {report['rule']}"]
    for name, c in report["conditions"].items():
        lines.append(f"  [{'x' if c['met'] else ' '}] {name}: {c['why']}")
    for arm, s in report["slopes"].items():
        lines.append(f"Slope of {report['arms'][arm]} over the branch (pass@1 per {s['per_samples']:,.0f} samples): "
                     + format_interval(s))
    lines.append(f"Gap {a} - {b} at equal samples ({gap['budget']:,.0f}): " + format_interval(gap)
                 + ". The smallest gap this run can tell from 0 is the MDE; a true gap needs the 80%-power size to "
                   "be detected reliably.")
    ups = report["grids"]["cum_nominal_updates"][-1]
    lines.append(f"Gap at equal optimizer updates ({ups['budget']:,.0f}): {100 * ups['gap']:+.2f} "
                 f"[{100 * ups['lo']:+.2f}, {100 * ups['hi']:+.2f}] points.")
    for k, r in report["pass_at_k_at_equal_samples"].items():
        lines.append(f"pass@{k} at equal samples: {a} {r['brorl']:.3f}, {b} {r['prorl']:.3f}, gap "
                     f"{100 * r['gap']:+.2f} [{100 * r['lo']:+.2f}, {100 * r['hi']:+.2f}] points.")
    m = report["mechanism"]
    if m:
        lines.append(f"On the {m['prompts']} measured training prompts '{RARE_SIDE}' at the branch point, change of p "
                     f"({a} arm - {b} arm): " + format_interval(m))
    else:
        lines.append("The mechanism was not measured: condition 4 is not met by default.")
    return "\n".join(lines)


def grid_gap_figure(tables: Mapping[str, pd.DataFrame], *, title: Optional[str] = None):
    """One panel per shared-grid axis: the paired gap (points of pass@1) at every measured budget with its 95% t
    interval as error bars, one trace per comparison (``tables``: {name: {x: grid_comparison(...)}}), a line at 0."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    from brorl_lab.lab.plots import PALETTE, X_AXES

    axes = list(GRID_AXES)
    fig = make_subplots(rows=1, cols=len(axes), subplot_titles=[f"at equal {X_AXES[x]}" for x in axes])
    for i, (name, per_axis) in enumerate(tables.items()):
        for j, x in enumerate(axes):
            g = per_axis[x]
            fig.add_trace(go.Scatter(
                name=name, legendgroup=name, showlegend=j == 0, x=g["budget"], y=100 * g["gap"], mode="lines+markers",
                line_color=PALETTE[i % len(PALETTE)],
                error_y=dict(type="data", symmetric=False, array=100 * (g["hi"] - g["gap"]).fillna(0),
                             arrayminus=100 * (g["gap"] - g["lo"]).fillna(0), visible=True)), row=1, col=j + 1)
            fig.update_xaxes(title_text=X_AXES[x], row=1, col=j + 1)
    for j in range(len(axes)):
        fig.add_hline(y=0, line_color="black", line_width=1, row=1, col=j + 1)
    fig.update_yaxes(title_text="gap (points of mean pass@1)", row=1, col=1)
    fig.update_layout(title_text=title or "Paired gap on the shared grid, with 95% t intervals over seeds",
                      height=420, legend=dict(orientation="h", y=-0.25), margin=dict(t=80, b=40, l=60, r=20))
    return fig
