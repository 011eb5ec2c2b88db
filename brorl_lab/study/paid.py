"""The flagship paid like the paper (issue 38): arms continuing a learned plateau at its lr, each arm paid in
*generated* samples (every dynamic-sampling refill counted, BroRL's compute unit), and every reading of the run
declared here, in code, before the run:

    arms = paid_arm_configs(recipe_config(model="learned", lr=plateau_lr("learned")), budget=B)
    pts  = grid_points(df, thresholds(B))                 # each arm at the first evaluation reaching each threshold
    paired_at_grid(pts)                                   # BroRL - ProRL per threshold: per-seed gaps + t interval
    collapse_flags(df)                                    # COLLAPSE: seeds whose KL or pass@1 leaves the band
    change_bounds(pts)                                    # each arm's own change, with its equivalence bound
    control_gaps(before, redraw, after)                   # the mechanism against a no-training re-draw
    race(time_to_level(df, LEVEL, budget=B), budget=B)    # the takeoff race: generated samples to a fixed level

Budgets and the shared grid. Each arm stops once its generated samples reach ``budget`` (Config.max_samples) and is
evaluated at the step whose generated samples first reach each threshold ``budget * k / points``
(Config.eval_at_samples). Refills make each arm's crossing land a little past the threshold: the point records the
actual count (``x``), never an interpolation. The same rows give the comparisons at equal trained samples, equal
optimizer updates and equal wall time (:func:`grid_points` with ``x=`` those columns; the measured x of each arm is
reported beside the value, since the arms' evaluations need not line up on those axes).

The takeoff race is a time-to-event comparison: per seed and arm, the generated samples at the first evaluation
where the family's pass@1 is at least ``start + level``; an arm that never gets there within the budget is
*censored* at the budget (kept, never dropped). Compared by the restricted mean (each time capped at the budget, a
fair summary because both arms share the same censoring point) with a paired t interval over seeds, and by who got
there first, seed by seed.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Optional

import numpy as np
import pandas as pd

from brorl_lab.core.config import Config
from brorl_lab.core.validation import check_int, is_number
from brorl_lab.lab.analysis import MEAN, PASS1
from brorl_lab.lab.stats import change_bound, paired_t_interval, seeds_for_power, t_interval
from brorl_lab.study.arms import arm_configs, plan_arms, run_plans
from brorl_lab.study.compare import COLLAPSE, collapse_flags  # noqa: F401 (COLLAPSE: part of this module's readings)
from brorl_lab.study.recipe import ARM_TABLE, arm_options, resolve_experiment_model

METRIC = f"eval/{MEAN}/{PASS1}"
GRID_POINTS = 8  # thresholds per budget: budget * k / GRID_POINTS, k = 1..8
# The collapse rule (COLLAPSE, collapse_flags) is study.compare's: one definition for the flagship and the regime map.
# The lr ablation (BroRL's sqrt rule read two ways): the BroRL arm at sqrt(8)x (8x the samples per step) and at
# 0.5x the plateau's lr (sqrt(16/64): a quarter of the prompts per step).
LR_ABLATION = {"brorl_lr_sqrt8": math.sqrt(8), "brorl_lr_half": 0.5}
# The takeoff race's level, fixed before the run: +10 points of held-out pass@1 on the takeoff family.
TAKEOFF_LEVEL = 0.10
ARM_SHAPES = arm_options(ARM_TABLE, middle=True)  # the arms (study.recipe.ARM_TABLE) as arm_configs' options


def plateau_lr(model: str) -> float:
    """The lr the plateau checkpoint ``model`` (an alias or a directory with plateau.json) was trained at: the arms
    continue at it, so the branch changes N and prompts only."""
    meta = Path(resolve_experiment_model(model)) / "plateau.json"
    if not meta.is_file():
        raise ValueError(f"model: {model!r} has no plateau.json; allowed: a plateau checkpoint ('learned', 'floor')")
    return float(json.loads(meta.read_text())["config"]["lr"])


def thresholds(budget: int, points: int = GRID_POINTS) -> list[int]:
    """The shared grid in generated samples: ``budget * k / points`` for k = 1..points (rounded up)."""
    check_int("budget", budget, 1)
    check_int("points", points, 1)
    return sorted({math.ceil(budget * k / points) for k in range(1, points + 1)})


def paid_arm_configs(base: Config, *, budget: int, points: int = GRID_POINTS, lr_factor: float = 1.0,
                     middle: bool = True, **shapes) -> dict[str, Config]:
    """The arms (:func:`brorl_lab.study.arms.arm_configs`' shapes; default :data:`ARM_SHAPES`: ProRL 16 x 64,
    BroRL 512 x 16, middle 64 x 32) at ``base.lr``, each paid ``budget`` generated samples (``max_samples``) and
    evaluated at :func:`thresholds` (``eval_at_samples``; no step grid). ``steps`` is only a cap: an arm needs at
    most ceil(budget / samples_per_step) steps, since refills only add samples. ``lr_factor`` scales the BroRL
    arm's lr (the ablation, :data:`LR_ABLATION`)."""
    if not (is_number(lr_factor) and lr_factor > 0):
        raise ValueError(f"lr_factor: got {lr_factor!r}; allowed: a number > 0")
    check_int("budget", budget, 1)
    shapes = {**ARM_SHAPES, **shapes}
    if not middle:
        shapes.pop("n_mid", None)
        shapes.pop("prompts_mid", None)
    arms = arm_configs(base.replace(steps=1, eval_every=1), **shapes)
    grid = thresholds(budget, points)
    out = {}
    for arm, c in arms.items():
        lr = c.lr * (lr_factor if arm == "brorl" else 1.0)
        out[arm] = c.replace(lr=lr, max_samples=budget, eval_at_samples=grid, eval_at_steps=[], eval_every=0,
                             steps=math.ceil(budget / c.samples_per_step), checkpoint_every=1)
    return out


def run_paid(arms: Mapping[str, Config], *, seeds: Sequence[int], root: str | Path, progress: bool = False,
             jobs: Optional[int] = 1, ray: Optional[str] = None, threads: Optional[int] = None) -> pd.DataFrame:
    """Run every arm of :func:`paid_arm_configs` for each seed (headline arms first, every seed; then the middle
    arm) in ``root/<arm>_s<seed>``, resumably (:func:`brorl_lab.study.arms.run_arm`: finished arms are read back);
    returns the long table (:func:`brorl_lab.study.arms.label_arm`'s columns). The runs are independent jobs
    (:func:`brorl_lab.study.arms.run_plans`): ``jobs`` at a time here (default 1: one after another) or Ray tasks
    at ``ray``, at ``threads`` torch threads each; a run's numbers depend on its seed and threads only."""
    plan = plan_arms(arms, seeds=seeds, root=root)
    return run_plans({None: plan}, jobs=jobs, ray=ray, threads=threads, progress=progress)[None]


# ---- the shared grid --------------------------------------------------------------------------------------------------
def grid_points(df: pd.DataFrame, marks: Sequence[float], *, x: str = "cum_samples",
                metric: str = METRIC) -> pd.DataFrame:
    """Per arm, seed and mark: the first evaluated row whose ``x`` reaches the mark. Columns arm, seed, mark, x (the
    measured count), value (``metric`` there, NaN when the run never reached the mark: censored), start (``metric``
    at step 0) and change (value - start)."""
    need = {"arm", "seed", "step", x, metric}
    if not isinstance(df, pd.DataFrame) or not need <= set(df.columns):
        raise ValueError(f"df: allowed: a long arm table with columns {sorted(need)}")
    rows = []
    for (arm, seed), g in df[df[metric].notna()].sort_values("step").groupby(["arm", "seed"], sort=False):
        start = float(g.loc[g["step"] == 0, metric].iloc[0]) if (g["step"] == 0).any() else np.nan
        for m in marks:
            hit = g[g[x] >= m]
            got = hit.iloc[0] if len(hit) else None
            rows.append({"arm": arm, "seed": int(seed), "mark": m, "x": float(got[x]) if got is not None else np.nan,
                         "value": float(got[metric]) if got is not None else np.nan, "start": start})
    out = pd.DataFrame(rows)
    out["change"] = out["value"] - out["start"]
    return out


def paired_at_grid(points: pd.DataFrame, a: str = "brorl", b: str = "prorl") -> pd.DataFrame:
    """Per mark: arm ``a`` minus arm ``b`` on the seeds where both were measured (each seed's gap listed in
    ``per_seed``, so every interval comes with its dots), the paired t interval (n, mean, lo, hi, mde), both arms'
    mean measured x (how far past the mark each crossing landed) and both arms' mean value on the paired seeds."""
    rows = []
    for m, g in points.groupby("mark", sort=True):
        w = g.pivot_table(index="seed", columns="arm", values="value")
        if a not in w or b not in w:
            continue
        w = w.dropna(subset=[a, b])
        xs = g.groupby("arm")["x"].mean()
        r = paired_t_interval(w[a].to_numpy(), w[b].to_numpy())
        rows.append({"mark": m, "n": r["n"], "gap": r["mean"], "lo": r["lo"], "hi": r["hi"], "mde": r["mde"],
                     "sd": r["sd"], f"x_{a}": xs.get(a, np.nan), f"x_{b}": xs.get(b, np.nan),
                     f"value_{a}": float(w[a].mean()), f"value_{b}": float(w[b].mean()),
                     "per_seed": (w[a] - w[b]).round(6).to_dict()})
    return pd.DataFrame(rows)


# ---- the rules declared before the run ------------------------------------------------------------------------------
def change_bounds(points: pd.DataFrame, *, mark: Optional[float] = None) -> pd.DataFrame:
    """Each arm's own change (value - start) at ``mark`` (default: the last mark), over seeds: the t interval and
    the equivalence bound ("held-out pass@1 changed by at most ``bound``", :func:`brorl_lab.lab.stats.change_bound`)."""
    m = points["mark"].max() if mark is None else mark
    rows = []
    for arm, g in points[points["mark"] == m].groupby("arm", sort=False):
        r = change_bound(g["change"].dropna().to_numpy())
        rows.append({"arm": arm, "mark": m, "n": r["n"], "change": r["mean"], "lo": r["lo"], "hi": r["hi"],
                     "bound": r["bound"], "per_seed": g.set_index("seed")["change"].round(6).to_dict()})
    return pd.DataFrame(rows)


def control_gaps(before: pd.DataFrame, redraw: pd.DataFrame, after: Mapping[int, Mapping[str, pd.DataFrame]], *,
                 reach: str = "only N=512") -> pd.DataFrame:
    """The mechanism against its no-training control. ``before``: per-prompt rates at the branch point
    (:func:`~brorl_lab.study.mechanism.prompt_pass_rates`); ``redraw``: the same prompts re-drawn with fresh draws
    and no training (the regression-to-the-mean control: prompts chosen for K >= 1 of 512 fall back on a re-draw);
    ``after[seed][arm]``: the same prompts after each arm. Per seed and arm, on the ``reach`` prompts of ``before``:
    the mean change of p, the control's change, and their difference (the arm's effect beyond regression)."""
    sel = before.loc[before["reach"] == reach, "uid"]
    if sel.empty:
        raise ValueError(f"before: no prompt in the {reach!r} class; allowed: rates with such prompts")
    base = before.set_index("uid").loc[sel, "p"]
    control = float((redraw.set_index("uid").loc[sel, "p"] - base).mean())
    rows = []
    for seed, arms in after.items():
        for arm, rates in arms.items():
            change = float((rates.set_index("uid").loc[sel, "p"] - base).mean())
            rows.append({"seed": int(seed), "arm": arm, "prompts": len(sel), "change": change, "control": control,
                         "beyond_control": change - control})
    return pd.DataFrame(rows)


# The mechanism's prompts: the plateau gate's (128 training prompts drawn with item seed 12345, 512 draws each, at the
# training sampler); the branch record (branch_rates.csv) drew them with sampling seed 0, the control re-draws them
# with fresh draws (CONTROL_DRAW_SEED) and no training.
MECHANISM_PROMPTS, MECHANISM_DRAWS, MECHANISM_ITEM_SEED, CONTROL_DRAW_SEED = 128, 512, 12345, 1


def mechanism_rates(model_dir: str | Path, cfg: Config, *, draw_seed: int = 0, prompts: int = MECHANISM_PROMPTS,
                    n_draws: int = MECHANISM_DRAWS) -> pd.DataFrame:
    """Per-prompt pass rates (:func:`~brorl_lab.study.mechanism.prompt_pass_rates`) of the mechanism's prompts
    under the HF model in ``model_dir`` (a branch point, or a run's ``policy/``), sampled with ``draw_seed``."""
    from brorl_lab.core.models import load_policy
    from brorl_lab.rl.steps import sample_prompts
    from brorl_lab.study.mechanism import prompt_pass_rates

    items = sample_prompts(cfg.tasks, prompts, seed=MECHANISM_ITEM_SEED)
    policy, tok = load_policy(str(model_dir))
    return prompt_pass_rates(policy, tok, items, cfg, n_draws=n_draws, seed=draw_seed, chunk_prompts=16)


def measure_mechanism(arms: Mapping[str, Config], *, seeds: Sequence[int], root: str | Path, branch: str | Path,
                      prompts: int = MECHANISM_PROMPTS, n_draws: int = MECHANISM_DRAWS,
                      reach: str = "only N=512") -> pd.DataFrame:
    """:func:`control_gaps` of the headline arms of a finished :func:`run_paid`: the branch point's rates (its
    shipped branch_rates.csv when it holds these prompts and draws, else measured), the no-training re-draw, and
    every seed's final ProRL and BroRL policies (``root/<arm>_s<seed>/policy``)."""
    cfg = arms["brorl"]
    shipped = Path(branch) / "branch_rates.csv"
    before = pd.read_csv(shipped) if shipped.is_file() else None
    if before is None or len(before) != prompts or not (before["correct"] <= n_draws).all() or \
            not np.allclose(before["p"], before["correct"] / n_draws):
        before = mechanism_rates(branch, cfg, prompts=prompts, n_draws=n_draws)
    redraw = mechanism_rates(branch, cfg, draw_seed=CONTROL_DRAW_SEED, prompts=prompts, n_draws=n_draws)
    after = {s: {a: mechanism_rates(Path(root) / f"{a}_s{s}" / "policy", cfg, prompts=prompts, n_draws=n_draws)
                 for a in ("prorl", "brorl")} for s in seeds}
    return control_gaps(before, redraw, after, reach=reach)


def control_summary(gaps: pd.DataFrame) -> pd.DataFrame:
    """Per arm: the t interval over seeds of the change beyond the control (with the per-seed values)."""
    rows = []
    for arm, g in gaps.groupby("arm", sort=False):
        r = t_interval(g["beyond_control"].to_numpy())
        rows.append({"arm": arm, "n": r["n"], "beyond_control": r["mean"], "lo": r["lo"], "hi": r["hi"],
                     "per_seed": g.set_index("seed")["beyond_control"].round(6).to_dict()})
    return pd.DataFrame(rows)


# ---- the takeoff race ------------------------------------------------------------------------------------------------
def time_to_level(df: pd.DataFrame, level: float = TAKEOFF_LEVEL, *, budget: float, metric: str = METRIC,
                  x: str = "cum_samples") -> pd.DataFrame:
    """Per arm and seed: ``time`` = ``x`` at the first evaluation where ``metric`` >= its step-0 value + ``level``
    (``reached``), else the budget (censored: ``reached`` False). Columns arm, seed, start, time, reached."""
    if not (is_number(level) and level > 0) or not (is_number(budget) and budget > 0):
        raise ValueError(f"level, budget: got {level!r}, {budget!r}; allowed: numbers > 0")
    rows = []
    for (arm, seed), g in df[df[metric].notna()].sort_values("step").groupby(["arm", "seed"], sort=False):
        start = float(g[metric].iloc[0])
        hit = g[g[metric] >= start + level]  # a run stops at the step that reaches the budget: all its evaluations
        reached = len(hit) > 0
        rows.append({"arm": arm, "seed": int(seed), "start": start,
                     "time": float(hit[x].iloc[0]) if reached else float(budget), "reached": bool(reached)})
    return pd.DataFrame(rows)


def race(times: pd.DataFrame, *, budget: float, a: str = "brorl", b: str = "prorl") -> dict:
    """The takeoff race on :func:`time_to_level`'s table: the paired t interval over seeds of the restricted mean
    difference (min(time, budget), ``a`` - ``b``: negative = ``a`` reaches the level sooner), how many seeds each
    arm reached it in, and who got there first seed by seed (ties: both censored, or the same time)."""
    w = times.pivot_table(index="seed", columns="arm", values="time").dropna()
    got = times.pivot_table(index="seed", columns="arm", values="reached").reindex(w.index)
    ta, tb = w[a].clip(upper=budget), w[b].clip(upper=budget)
    r = paired_t_interval(ta.to_numpy(), tb.to_numpy())
    first_a = int(((ta < tb) & got[a].astype(bool)).sum())
    first_b = int(((tb < ta) & got[b].astype(bool)).sum())
    return {"n": r["n"], "restricted_mean_gap": r["mean"], "lo": r["lo"], "hi": r["hi"], "budget": budget,
            f"reached_{a}": int(got[a].sum()), f"reached_{b}": int(got[b].sum()), f"first_{a}": first_a,
            f"first_{b}": first_b, "ties": int(r["n"] - first_a - first_b),
            "per_seed": (ta - tb).round(3).to_dict()}


def write_per_seed(out: str | Path, tables: Mapping[str, pd.DataFrame]) -> list[Path]:
    """Every table as ``out/<name>.csv`` (one row per arm, seed and point: what every interval is recomputed from)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, t in tables.items():
        p = out / f"{name}.csv"
        t.to_csv(p, index=False)
        paths.append(p)
    return paths


# ---- the report ------------------------------------------------------------------------------------------------------
# The comparisons, primary first: equal generated samples (BroRL's basis), then equal trained samples, equal optimizer
# updates and equal training wall time (each a measured point of both arms; the x each arm was measured at is kept).
AXES = ("cum_samples", "cum_trained_samples", "cum_updates", "cum_wall_s")
SIZING_EFFECT = 0.01  # seed sizing: the paired design detecting a 1-point gap with 80% power at 95%


def axis_marks(df: pd.DataFrame, x: str, points: int = GRID_POINTS, arms: Sequence[str] = ("prorl", "brorl")
               ) -> list[float]:
    """Marks on a budget axis both arms reached in every seed: k / points of the smallest final ``x`` of any run."""
    runs = df[df["arm"].isin(arms)].groupby(["arm", "seed"])[x].max()
    top = float(runs.min())
    return [top * k / points for k in range(1, points + 1)]


def paid_report(df: pd.DataFrame, *, budget: int, points: int = GRID_POINTS, metric: str = METRIC,
                takeoff_level: Optional[float] = None) -> dict:
    """Every pre-declared reading of a :func:`run_paid` table: per axis of :data:`AXES`, the paired BroRL - ProRL
    gap at each mark (generated samples: :func:`thresholds`; other axes: :func:`axis_marks`), the collapse flags,
    each arm's change bound at the budget, and the seeds the headline gap (generated samples, last mark) needs for
    80% power at :data:`SIZING_EFFECT` (from this run's sd of the per-seed gap). Keys: grids ({axis: records}),
    headline, collapse, bounds, sizing, race (the takeoff race on ``metric`` when ``takeoff_level`` is given:
    :func:`race` of :func:`time_to_level`, its per-seed times under ``times``), points (the long per-seed table)."""
    grids, long = {}, []
    for x in AXES:
        if x not in df.columns:
            continue
        marks = thresholds(budget, points) if x == "cum_samples" else axis_marks(df, x, points)
        pts = grid_points(df, marks, x=x, metric=metric).assign(axis=x)
        long.append(pts)
        grids[x] = paired_at_grid(pts)
    head = grids["cum_samples"].iloc[-1].to_dict() if len(grids.get("cum_samples", [])) else {}
    sd = head.get("sd", np.nan)
    sizing = {"effect": SIZING_EFFECT, "sd": sd, "seeds": seeds_for_power(sd, SIZING_EFFECT)
              if sd == sd and sd > 0 else None, "from_seeds": head.get("n")}
    pts_samples = long[0] if long else pd.DataFrame()
    race_out = None
    if takeoff_level is not None:
        times = time_to_level(df[df["arm"].isin(["prorl", "brorl"])], takeoff_level, budget=budget, metric=metric)
        race_out = {**race(times, budget=budget), "level": takeoff_level, "metric": metric,
                    "times": times.to_dict(orient="records")}
    return {"race": race_out, "grids": {x: g.to_dict(orient="records") for x, g in grids.items()}, "headline": head,
            "collapse": collapse_flags(df, metric=metric).to_dict(orient="records"),
            "bounds": change_bounds(pts_samples).to_dict(orient="records") if len(pts_samples) else [],
            "sizing": sizing, "points": pd.concat(long, ignore_index=True) if long else pd.DataFrame()}


def headline_reading(head: Mapping) -> str:
    """The headline's reading, fixed before the run: the paired 95% interval of BroRL - ProRL at the budget either
    lies above 0 ("BroRL ahead": BroRL revives the plateau at equal generated samples), below 0 ("BroRL behind"), or
    contains 0 ("not resolved", with the largest gap in either direction the interval allows)."""
    if not head or not (head.get("n", 0) >= 2):
        return "no reading: fewer than 2 paired seeds"
    lo, hi = 100 * head["lo"], 100 * head["hi"]
    if lo > 0:
        return f"BroRL ahead: the interval lies above 0 (at least {lo:+.2f} points)"
    if hi < 0:
        return f"BroRL behind: the interval lies below 0 (at least {-hi:.2f} points behind)"
    return f"not resolved: the gap is between {lo:+.2f} and {hi:+.2f} points"


def paid_text(report: dict) -> str:
    """The report in words: only what each interval supports."""
    h, lines = report["headline"], []
    if h:
        lines.append(f"At equal generated samples ({h['mark']:,.0f}; measured at {h.get('x_brorl', np.nan):,.0f} "
                     f"BroRL, {h.get('x_prorl', np.nan):,.0f} ProRL): BroRL - ProRL held-out pass@1 "
                     f"{100 * h['gap']:+.2f} [{100 * h['lo']:+.2f}, {100 * h['hi']:+.2f}] points over {h['n']} seeds "
                     f"(per seed: {', '.join(f'{100 * v:+.2f}' for v in h['per_seed'].values())}).")
        lines.append(f"Reading (fixed before the run, study.paid.headline_reading): {headline_reading(h)}.")
    for b in report["bounds"]:
        lines.append(f"{b['arm']}: held-out pass@1 changed {100 * b['change']:+.2f} [{100 * b['lo']:+.2f}, "
                     f"{100 * b['hi']:+.2f}] points: by at most {100 * b['bound']:.2f} points either way.")
    bad = [f"{c['arm']} seed {c['seed']} ({c['reason']})" for c in report["collapse"] if c["collapsed"]]
    lines.append("Collapsed (COLLAPSE rule, kept in every table): " + ("; ".join(bad) if bad else "none") + ".")
    r = report.get("race")
    if r and r["reached_brorl"] == 0 and r["reached_prorl"] == 0:
        lines.append(f"Takeoff race (+{100 * r['level']:g} points of {r['metric']}, budget {r['budget']:,.0f} generated "
                     f"samples): not resolved: neither arm reached the level in any of {r['n']} seeds (all censored "
                     "at the budget), so the race cannot order them.")
    elif r:
        lines.append(f"Takeoff race (+{100 * r['level']:g} points of {r['metric']}, budget {r['budget']:,.0f} generated "
                     f"samples): reached by BroRL in {r['reached_brorl']} and ProRL in {r['reached_prorl']} of {r['n']} "
                     f"seeds (the rest censored at the budget); first: BroRL {r['first_brorl']}, ProRL {r['first_prorl']}, "
                     f"ties {r['ties']}; restricted-mean samples to the level, BroRL - ProRL {r['restricted_mean_gap']:+,.0f} "
                     f"[{r['lo']:+,.0f}, {r['hi']:+,.0f}].")
    for m in report.get("mechanism") or []:
        lines.append(f"Mechanism ({m['arm']}): mean p on the 'only N=512' prompts changed {100 * m['beyond_control']:+.2f} "
                     f"[{100 * m['lo']:+.2f}, {100 * m['hi']:+.2f}] points beyond the no-training re-draw over {m['n']} "
                     "seeds.")
    z = report["sizing"]
    if z["seeds"]:
        lines.append(f"Seed sizing: sd of the per-seed gap {100 * z['sd']:.2f} points from {z['from_seeds']} seeds -> "
                     f"{z['seeds']} paired seeds detect a {100 * z['effect']:g}-point gap with 80% power "
                     "(lab.stats.seeds_for_power, t at every n).")
    return "\n".join(lines)


# ---- the report's table and figure (the results page and the test build them from the shipped files) -------------
def grid_table(points: pd.DataFrame, axis: str = "cum_samples", a: str = "brorl", b: str = "prorl") -> str:
    """A markdown table of one axis of the shipped per-seed points (:func:`paid_report`'s ``points``): per mark, the
    paired seeds, each arm's mean measured x and mean held-out pass@1, and the paired gap (points) with its 95% t
    interval, recomputed from the per-seed values (:func:`paired_at_grid`)."""
    pts = points[points["axis"] == axis] if "axis" in points else points
    rows = ["| mark | seeds | x BroRL | x ProRL | BroRL | ProRL | gap [95% interval] (points) |",
            "|---:|---:|---:|---:|---:|---:|---:|"]
    for r in paired_at_grid(pts, a, b).to_dict(orient="records"):
        m = r["mark"]
        mark = f"{m:,.0f}" if m >= 100 else f"{m:.3g}"  # updates and seconds: small marks keep their digits
        rows.append(f"| {mark} | {r['n']} | {r[f'x_{a}']:,.0f} | {r[f'x_{b}']:,.0f} | {r[f'value_{a}']:.4f} | "
                    f"{r[f'value_{b}']:.4f} | {100 * r['gap']:+.2f} [{100 * r['lo']:+.2f}, {100 * r['hi']:+.2f}] |")
    return "\n".join(rows)


def paid_figure(report: Mapping, *, title: Optional[str] = None):
    """One panel per comparison axis: the paired gap BroRL - ProRL (points of held-out pass@1) at every mark, its 95%
    t interval as an error bar and a dot per seed beside it, a line at 0."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    from brorl_lab.lab.plots import X_AXES

    names = {**X_AXES, "cum_trained_samples": "samples trained on"}
    axes = [x for x in AXES if x in report["grids"]]
    fig = make_subplots(rows=1, cols=len(axes), subplot_titles=[f"at equal {names[x]}" for x in axes])
    for j, x in enumerate(axes):
        g = pd.DataFrame(report["grids"][x])
        fig.add_trace(go.Scatter(
            name="mean gap, 95% t interval", legendgroup="mean", showlegend=j == 0, x=g["mark"], y=100 * g["gap"],
            mode="markers", marker=dict(color="black", size=9),
            error_y=dict(type="data", symmetric=False, array=100 * (g["hi"] - g["gap"]),
                         arrayminus=100 * (g["gap"] - g["lo"]))), row=1, col=j + 1)
        span = float(g["mark"].max()) / max(len(g), 1)
        dots = [(m + 0.18 * span, 100 * v) for m, ps in zip(g["mark"], g["per_seed"]) for v in dict(ps).values()]
        fig.add_trace(go.Scatter(name="one seed", legendgroup="seed", showlegend=j == 0, x=[d[0] for d in dots],
                                 y=[d[1] for d in dots], mode="markers",
                                 marker=dict(color="rgba(31,119,180,0.55)", size=5)), row=1, col=j + 1)
        fig.add_hline(y=0, line_color="grey", line_width=1, row=1, col=j + 1)
        fig.update_xaxes(title_text=names[x], row=1, col=j + 1)
    fig.update_yaxes(title_text="BroRL - ProRL (points of pass@1)", row=1, col=1)
    fig.update_layout(title_text=title or "Paid in generated samples: the paired gap per seed and its interval",
                      height=420, width=360 * len(axes), legend=dict(orientation="h", y=-0.25),
                      margin=dict(t=80, b=40, l=60, r=20))
    return fig
