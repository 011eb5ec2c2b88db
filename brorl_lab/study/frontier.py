"""The rollout frontier (issue 43): which N wins as the budget grows, under the paper's protocol. Declared here as
data, before any full-size run, with every reading as a function on per-seed tables::

    FRONTIER                                   # the study as data (arms, branch points, marks, protocol, lr rule)
    FRONTIER.to_declaration()                  # the dict study.results.write_declaration commits before the run
    frontier_arm_configs(base, FRONTIER.arms)  # {arm: Config}: each arm's N, prompts per step, lr, budget, marks
    best_n(points, mark)                       # the best N at one budget mark, paired intervals against each other N
    frontier_table(points)                     # best_n at every mark, on one axis
    pick_lr(pilot)                             # the lr rule fixed now: best pass@1 among settings within the KL bound
    takeoff_race(df, a, b)                     # study.paid.time_to_level + race, per pair of arms
    seeds_for_gap(per_seed_gaps)               # seeds for a 0.5-point gap at 80% power (lab.stats.seeds_for_power)
    refill_pilot(...) / cap_binding(steps)     # the refill protocol measured: how often a round cap binds
    budgets_from_pilot(cap_binding(steps))     # the budgets FRONTIER declares (>= 64 BroRL updates at fill-to-full)
    noise_table(...)                           # rl.noise_scale's B_simple per branch point and N
    continue_plateau(...)                      # the learned plateau's own recipe continued: its slope (item 7)

The pilots run as ``python -m brorl_lab.study.frontier pilot|noise|continue`` (:func:`main`); each writes its tables
with a provenance record marked exploratory.

Units. A *generated sample* is one response (prompt x rollout), every dynamic-sampling round counted (BroRL's unit,
``cum_samples``); a *trained sample* one that survived the filter (``cum_trained_samples``); an *optimizer update*
one AdamW step (``cum_updates``: ``optimizer_steps_per_step`` = 2 per RL step); wall time is training time with
evaluation excluded (``cum_wall_s``). Arms are named ``n<N>x<P>``: N rollouts per prompt, P prompts per step.

The arms (4:1 design, the paper's: ProRL 16 x 512 -> BroRL 512 x 128, N x 32 with prompts / 4, so samples per step
x 8; ours from :data:`brorl_lab.study.paid.ARM_SHAPES`: 16 x 64 -> 512 x 16). Between and beside them the prompts
follow the same power law, P(N) = 64 (N / 16)^(-log 4 / log 32) = 64 (N / 16)^(-0.4), rounded to the nearest power
of two: 4 x 128 (111 -> 128), 64 x 32 (36.8 -> 32, the paid study's middle arm), 128 x 32 (27.9 -> 32). The
fixed-batch design (IsoCompute's) holds samples per step at 8,192 and the updates per step at 2 in every arm and
moves only the split: 16 x 512, 64 x 128, 512 x 16.

The protocol. Primary: dynamic sampling refilled until the batch is full, with a round cap (``max_resample_rounds``)
set high enough that it binds on under 5% of steps (every binding logged by the trainer: ``ds_cap_hit`` and a
``refill`` event). The capped protocol (``max_resample_rounds = 4``, the recipe's) stays as an ablation.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np
import pandas as pd

from brorl_lab.core.config import Config
from brorl_lab.core.validation import check_int, is_number
from brorl_lab.study.paid import METRIC  # held-out pass@1, the mean over the branch point's families
from brorl_lab.study.recipe import ARM_TABLE

# ---- the arms --------------------------------------------------------------------------------------------------------
#: The 4:1 design: {N: prompts per step}, the recipe's arm table (ProRL 16 x 64, middle 64 x 32, BroRL 512 x 16);
#: N = 4 and 128 are optional, their prompts from the same power law (module docstring).
_ROWS = [ARM_TABLE[a] for a in ("prorl", "middle", "brorl")]
RATIO_ARMS = {r["rollouts_per_prompt"]: r["prompts_per_step"] for r in _ROWS}
PRORL_SHAPE = (ARM_TABLE["prorl"]["rollouts_per_prompt"], ARM_TABLE["prorl"]["prompts_per_step"])
BRORL_SHAPE = (ARM_TABLE["brorl"]["rollouts_per_prompt"], ARM_TABLE["brorl"]["prompts_per_step"])
#: The fixed-batch design: {N: prompts per step} at BroRL's samples per step (8,192) in every arm.
FIXED_BATCH_SAMPLES = BRORL_SHAPE[0] * BRORL_SHAPE[1]
FIXED_BATCH_ARMS = {n: FIXED_BATCH_SAMPLES // n for n in RATIO_ARMS}
#: The paper's exponent: prompts fall 4x while N grows 32x.
PROMPT_EXPONENT = math.log(4) / math.log(32)


def arm_name(n: int, prompts: int) -> str:
    """``n<N>x<P>``: the arm of N rollouts per prompt and P prompts per step."""
    return f"n{n}x{prompts}"


def ratio_prompts(n: int, *, n_ref: int = PRORL_SHAPE[0], prompts_ref: int = PRORL_SHAPE[1]) -> int:
    """Prompts per step of the 4:1 design at N = ``n``: prompts_ref (n / n_ref)^(-0.4), rounded to the nearest power
    of two (in log2: the power-law's own scale)."""
    check_int("n", n, 1)
    exact = prompts_ref * (n / n_ref) ** (-PROMPT_EXPONENT)
    return 2 ** round(math.log2(exact))


OPTIONAL_RATIO_ARMS = {n: ratio_prompts(n) for n in (4, 128)}  # 4 x 128 (111 -> 128), 128 x 32 (27.9 -> 32)


# ---- the readings (functions on per-seed tables; fixed before the run) -------------------------------------------
def arm_n(arm: str) -> int:
    """N of an arm named by :func:`arm_name` (``'n512x16'`` -> 512)."""
    if not (isinstance(arm, str) and arm.startswith("n") and "x" in arm and arm[1:arm.index("x")].isdigit()):
        raise ValueError(f"arm: got {arm!r}; allowed: a name n<N>x<P> (frontier.arm_name)")
    return int(arm[1:arm.index("x")])


def best_n(points: pd.DataFrame, mark: float, *, level: float = 0.95) -> dict:
    """The best N at one budget mark, on :func:`brorl_lab.study.paid.grid_points`' per-seed table (columns arm,
    seed, mark, value; arms named n<N>x<P>). The arm with the highest mean over its measured seeds leads; it is
    compared with every other arm on their paired seeds (paired t interval of leader - other). The reading, fixed
    now: ``"N=<n> best"`` when every paired interval lies above 0; else ``"not resolved: N=<n>, N=<m> ..."`` naming
    the leader and every arm whose interval contains 0 (or lies below: a censored or mis-ordered leader never reads as
    best). Keys: mark, leader, leader_n, means {arm: mean}, seeds {arm: n measured}, gaps [{other, n, gap, lo, hi}],
    resolved, reading."""
    from brorl_lab.lab.stats import paired_t_interval

    g = points[(points["mark"] == mark) & points["value"].notna()]
    if g["arm"].nunique() < 2:
        raise ValueError(f"points: {g['arm'].nunique()} arm(s) measured at mark {mark!r}; allowed: >= 2 arms")
    w = g.pivot_table(index="seed", columns="arm", values="value")  # [seeds, arms]
    means = w.mean().sort_values(ascending=False, kind="stable")
    lead = str(means.index[0])
    gaps, tied = [], [lead]
    for other in means.index[1:]:
        pair = w[[lead, other]].dropna()
        r = paired_t_interval(pair[lead].to_numpy(), pair[other].to_numpy(), level=level)
        gaps.append({"other": str(other), "n": r["n"], "gap": r["mean"], "lo": r["lo"], "hi": r["hi"]})
        if not (r["n"] >= 2 and r["lo"] > 0):
            tied.append(str(other))
    resolved = len(tied) == 1
    names = ", ".join(f"N={arm_n(a)}" for a in tied)
    return {"mark": mark, "leader": lead, "leader_n": arm_n(lead), "means": means.to_dict(),
            "seeds": w.notna().sum().to_dict(), "gaps": gaps, "resolved": resolved,
            "reading": f"N={arm_n(lead)} best" if resolved else f"not resolved: {names}"}


def frontier_table(points: pd.DataFrame) -> pd.DataFrame:
    """:func:`best_n` at every mark of ``points`` (one axis): mark, leader_n, resolved, reading, and per other arm
    the leader's paired gap with its interval (``gap_<arm>``, ``lo_<arm>``, ``hi_<arm>``)."""
    rows = []
    for m in sorted(points["mark"].unique()):
        if points.loc[(points["mark"] == m) & points["value"].notna(), "arm"].nunique() < 2:
            continue  # fewer than two arms reached this mark: no comparison
        b = best_n(points, m)
        row = {"mark": m, "leader": b["leader"], "leader_n": b["leader_n"], "resolved": b["resolved"],
               "reading": b["reading"]}
        for gp in b["gaps"]:
            row.update({f"gap_{gp['other']}": gp["gap"], f"lo_{gp['other']}": gp["lo"], f"hi_{gp['other']}": gp["hi"]})
        rows.append(row)
    return pd.DataFrame(rows)


AXES = ("cum_samples", "cum_trained_samples", "cum_updates", "cum_wall_s")  # the four axes


def axis_marks(df: pd.DataFrame, axis: str) -> list[float]:
    """Powers of 2 on ``axis`` that every run of ``df`` (one branch point) passed at an evaluation: from the first
    power at or above the latest first evaluation after step 0 to the last power at or below the earliest final
    one. The generated-samples axis uses the declared marks instead (:meth:`Frontier.budget_marks`)."""
    ev = df[df[METRIC].notna() & (df["step"] > 0)]
    first = ev.groupby("run")[axis].min().max()
    last = ev.groupby("run")[axis].max().min()
    if not (first > 0 and last >= first):
        return []
    return [float(2 ** k) for k in range(math.ceil(math.log2(first)), math.floor(math.log2(last)) + 1)]


def ratio_reading(df: pd.DataFrame, marks: Sequence[float], *, metric: str = METRIC) -> dict:
    """The frontier at one branch point, the declared reading of stage ``ratio`` (or ``capped``/``fixed``) once its
    runs are complete: on each of :data:`AXES` the per-seed points (:func:`brorl_lab.study.paid.grid_points`, the
    first evaluation at or past each mark; ``marks`` on generated samples, :func:`axis_marks` on the others) and
    :func:`frontier_table` (the best N per mark with paired intervals). ``checks``: per arm, the protocol's facts
    the issue asks for: seeds, optimizer updates at the end of each run (min, max), the share of steps on which the
    refill cap bound (``ds_cap_hit``) and on which KL stayed within the collapse bound. ``df``: the ledger's long
    table (arm names ``<branch>-<arm>``)."""
    from brorl_lab.study.compare import COLLAPSE
    from brorl_lab.study.paid import grid_points

    t = split_arm(df)
    t = t.assign(run=t["run_arm"] + "_s" + t["seed"].astype(str))
    axes = {}
    for axis in AXES:
        m = list(marks) if axis == "cum_samples" else axis_marks(t, axis)
        pts = grid_points(t, m, x=axis, metric=metric) if m else pd.DataFrame()
        axes[axis] = {"points": pts, "table": frontier_table(pts) if len(pts) else pd.DataFrame()}
    steps = t[t["step"] > 0]
    ends = t.groupby(["arm", "seed"])["cum_updates"].max()
    checks = pd.DataFrame([{
        "arm": arm, "n": arm_n(arm), "seeds": int(ends[arm].size),
        "updates_min": int(ends[arm].min()), "updates_max": int(ends[arm].max()),
        "samples_per_update": float(g.groupby("seed")["cum_samples"].max().sum()
                                    / g.groupby("seed")["cum_updates"].max().sum()),
        "cap_hit_share": float(g["ds_cap_hit"].astype(float).mean()),
        "kl_within_share": float((g["kl"].dropna() <= COLLAPSE["kl_max"]).mean()),
        "steps": int(len(g))} for arm, g in steps.groupby("arm", sort=False)]).sort_values("n", ignore_index=True)
    return {"axes": axes, "checks": checks}


def takeoff_races(df: pd.DataFrame, *, reference: str, level: float = 0.10, budget: float,
                  metric: str, x: str = "cum_samples") -> pd.DataFrame:
    """The takeoff race of every arm against ``reference`` (:func:`brorl_lab.study.paid.time_to_level` and
    :func:`~brorl_lab.study.paid.race`: censored at the budget, restricted mean, who got there first), on axis
    ``x``. One row per arm: the race's keys, each arm's share of seeds that reached the level and ``resolved``
    (the issue's rule: the reference reached the level in >= 80% of seeds, :data:`RACE_RESOLVED_SHARE`)."""
    from brorl_lab.study.paid import time_to_level

    return races_of(time_to_level(df, level, budget=budget, metric=metric, x=x), reference=reference, level=level,
                    budget=budget, x=x)


def races_of(times: pd.DataFrame, *, reference: str, level: float, budget: float, x: str) -> pd.DataFrame:
    """:func:`takeoff_races` on a :func:`brorl_lab.study.paid.time_to_level` table already made (the rows it
    returns)."""
    from brorl_lab.study.paid import race

    ref_share = float(times.loc[times["arm"] == reference, "reached"].mean())
    rows = []
    for arm in [a for a in dict.fromkeys(times["arm"]) if a != reference]:
        r = race(times[times["arm"].isin([arm, reference])], budget=budget, a=arm, b=reference)
        rows.append({"arm": arm, "reference": reference, "x": x, "level": level, "n": r["n"],
                     "restricted_mean_gap": r["restricted_mean_gap"], "lo": r["lo"], "hi": r["hi"],
                     "reached_arm": r[f"reached_{arm}"], "reached_reference": r[f"reached_{reference}"],
                     "first_arm": r[f"first_{arm}"], "first_reference": r[f"first_{reference}"], "ties": r["ties"],
                     "reference_share": ref_share, "resolved": ref_share >= RACE_RESOLVED_SHARE})
    return pd.DataFrame(rows)


RACE_RESOLVED_SHARE = 0.8  # the race reads only when the reference arm reached the level in >= 80% of seeds
GAP_EFFECT = 0.005  # the per-update question is powered for a 0.5-point gap (80% power, 95% two-sided)


def capped_reading(capped: pd.DataFrame, primary: pd.DataFrame, *, marks: Sequence[float],
                   metric: str = METRIC) -> pd.DataFrame:
    """The refill cap's ablation (stage 'capped'): per arm and budget mark, the capped protocol minus fill-to-full
    (the primary 'ratio' runs of the same arm and seed) in held-out pass@1, paired over the seeds both ran
    (:func:`brorl_lab.study.paid.paired_at_grid` on each run's first evaluation at or past the mark), with each
    protocol's share of steps on which its refill cap bound. ``capped``, ``primary``: ledger tables (arm names
    ``<branch>-<arm>``). One row per arm and mark."""
    from brorl_lab.study.paid import grid_points, paired_at_grid

    both = pd.concat([split_arm(capped).assign(protocol="capped"), split_arm(primary).assign(protocol="fill")])
    rows = []
    for arm, g in both.groupby("arm", sort=False):
        pts = grid_points(g.assign(arm=g["protocol"]), list(marks), metric=metric)
        bound = g[g["step"] > 0].groupby("protocol")["ds_cap_hit"].apply(lambda s: float(s.astype(float).mean()))
        t = paired_at_grid(pts, a="capped", b="fill")
        rows.append(t.assign(arm=arm, n_arm=arm_n(arm), cap_bound_capped=bound.get("capped", np.nan),
                             cap_bound_fill=bound.get("fill", np.nan)))
    return pd.concat(rows, ignore_index=True).sort_values(["n_arm", "mark"], ignore_index=True)


RACE_AXES = ("cum_samples", "cum_updates", "cum_wall_s")  # the issue's: generated samples, updates, wall time


def race_table(df: pd.DataFrame, *, reference: str, level: float, budget: float, metric: str
               ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The takeoff race (:func:`takeoff_races`) on each of :data:`RACE_AXES`: generated samples censored at the
    declared ``budget``; optimizer updates and wall time censored at the common horizon, the shortest run's end on
    that axis (every run was observed up to it; an evaluation past it is not counted). ``df``: per-run metrics
    with ``arm`` and ``seed``. Returns (one row per axis and arm against ``reference`` with ``horizon``; per axis,
    arm and seed the time to the level and whether it was reached, :func:`brorl_lab.study.paid.time_to_level`)."""
    from brorl_lab.study.paid import time_to_level

    races, times = [], []
    for axis in RACE_AXES:
        horizon = float(budget) if axis == "cum_samples" else float(df.groupby(["arm", "seed"])[axis].max().min())
        seen = df if axis == "cum_samples" else df[df[axis] <= horizon]
        t = time_to_level(seen, level, budget=horizon, metric=metric, x=axis)
        races.append(races_of(t, reference=reference, level=level, budget=horizon, x=axis).assign(horizon=horizon))
        times.append(t.assign(axis=axis))
    return pd.concat(races, ignore_index=True), pd.concat(times, ignore_index=True)


def seeds_for_gap(per_seed_gaps: Sequence[float], effect: float = GAP_EFFECT) -> dict:
    """Seeds for the per-update gap: the sd of a pilot's per-seed gaps (at equal optimizer updates) and
    :func:`brorl_lab.lab.stats.seeds_for_power` at ``effect`` (80% power, 95% two-sided, t at every n). Keys: sd,
    from_seeds, effect, seeds."""
    from brorl_lab.lab.stats import seeds_for_power, t_interval

    r = t_interval(per_seed_gaps)
    if not (r["n"] >= 2 and r["sd"] > 0):
        raise ValueError(f"per_seed_gaps: got {r['n']} values; allowed: >= 2 gaps with a spread")
    return {"sd": r["sd"], "from_seeds": r["n"], "effect": effect, "seeds": seeds_for_power(r["sd"], effect)}


def per_update_reading(points: pd.DataFrame, *, large: Optional[str] = None, small: Optional[str] = None,
                       level: float = 0.95, effect: float = GAP_EFFECT) -> tuple[pd.DataFrame, dict]:
    """Issue 43's item 5, Theorem 1's per-update claim carried to many steps: at each optimizer-updates mark of
    ``points`` (the ``cum_updates`` axis of :func:`ratio_reading`: arm, seed, mark, value), the large-N arm minus the
    small-N arm (default the largest N minus the smallest: BroRL's shape minus ProRL's) on their paired seeds with a
    ``level`` t interval (columns
    mark, gap, lo, hi, n), and :func:`seeds_for_gap` of the per-seed gaps at the last mark (the seeds a gap of
    ``effect`` needs at 80% power, from this spread)."""
    from brorl_lab.lab.stats import paired_t_interval

    arms = sorted(points["arm"].unique(), key=arm_n)
    large, small = large or (arms[-1] if arms else None), small or (arms[0] if arms else None)
    w = points.pivot_table(index=["mark", "seed"], columns="arm", values="value")
    if not {large, small} <= set(w.columns):
        raise ValueError(f"points: arms {sorted(w.columns)}; allowed: points holding {large} and {small}")
    rows, last = [], None
    for mark, g in w.groupby(level="mark"):
        pair = g[[large, small]].dropna()
        if len(pair) < 2:
            continue
        r = paired_t_interval(pair[large].to_numpy(), pair[small].to_numpy(), level=level)
        rows.append({"mark": float(mark), "gap": r["mean"], "lo": r["lo"], "hi": r["hi"], "n": len(pair)})
        last = (pair[large] - pair[small]).to_numpy()
    sized = seeds_for_gap(last, effect) if last is not None else {}
    return pd.DataFrame(rows, columns=["mark", "gap", "lo", "hi", "n"]), sized


# ---- the lr procedure (pilot grid and the rule fixed before it) ----------------------------------------------------
LR_GRID = (1e-4, 2e-4, 4e-4, 8e-4)
LR_PILOT_SEEDS = (0, 1, 2)
LR_KL_SHARE = 0.95  # a setting qualifies when its KL stays within the collapse rule's bound on >= 95% of its steps


def lr_pilot_rows(df: pd.DataFrame, *, mark: float, metric: str, kl_bound: Optional[float] = None,
                  x: str = "cum_samples") -> pd.DataFrame:
    """Per (arm, lr, seed) of an lr pilot's long metrics table (columns arm, lr, seed, step, kl, ``x``,
    ``metric``): held-out ``metric`` at the first evaluation reaching ``mark`` (``value``, NaN when never reached),
    the training steps, and those whose KL stayed within ``kl_bound`` (default: the collapse rule's,
    :data:`brorl_lab.study.compare.COLLAPSE` kl_max), and the optimizer updates the run made (``updates``: its last
    ``cum_updates``, NaN when the table has no such column; what the pilot budget bought)."""
    from brorl_lab.study.compare import COLLAPSE
    from brorl_lab.study.paid import grid_points

    bound = COLLAPSE["kl_max"] if kl_bound is None else kl_bound
    rows = []
    for (arm, lr), g in df.groupby(["arm", "lr"], sort=False):
        pts = grid_points(g, [mark], x=x, metric=metric).set_index("seed")["value"]
        for seed, s in g[g["step"] > 0].groupby("seed"):
            kl = s["kl"].dropna()
            updates = int(s["cum_updates"].max()) if "cum_updates" in s else np.nan  # not a step count
            rows.append({"arm": arm, "lr": float(lr), "seed": int(seed), "value": float(pts.get(seed, np.nan)),
                         "steps": len(kl), "kl_within": int((kl <= bound).sum()), "updates": updates})
    return pd.DataFrame(rows)


def pick_lr(rows: pd.DataFrame, *, kl_share: float = LR_KL_SHARE) -> pd.DataFrame:
    """The lr rule, fixed before the pilot: per arm, among the lrs whose KL stayed within the bound on at least
    ``kl_share`` of all their steps (pooled over seeds), the one with the best mean held-out pass@1 at the pilot
    budget (ties: the smaller lr); when no lr qualifies, none is picked (``lr`` NaN: the arm's grid must move down).
    Input: :func:`lr_pilot_rows`. One row per arm: lr, value (its mean), qualified (the lrs that qualified),
    kl_share_by_lr, value_by_lr."""
    out = []
    for arm, g in rows.groupby("arm", sort=False):
        per = g.groupby("lr").agg(value=("value", "mean"), steps=("steps", "sum"), within=("kl_within", "sum"))
        per["share"] = per["within"] / per["steps"].where(per["steps"] > 0)
        ok = per[(per["share"] >= kl_share) & per["value"].notna()]
        best = ok.sort_index().loc[lambda t: t["value"] == t["value"].max()] if len(ok) else ok
        out.append({"arm": arm, "lr": float(best.index[0]) if len(best) else np.nan,
                    "value": float(best["value"].iloc[0]) if len(best) else np.nan,
                    "qualified": [float(x) for x in ok.index], "kl_share_by_lr": per["share"].round(4).to_dict(),
                    "value_by_lr": per["value"].round(6).to_dict()})
    return pd.DataFrame(out)


def sqrt_rule_lr(reference_lr: float, reference: tuple[int, int], arm: tuple[int, int]) -> float:
    """BroRL's sqrt rule applied to the reference arm's lr: lr x sqrt(samples per step of ``arm`` / of
    ``reference``), each a (N, prompts per step) pair. The 4:1 design's 512 x 16 against 16 x 64: x sqrt(8)."""
    if not (is_number(reference_lr) and reference_lr > 0):
        raise ValueError(f"reference_lr: got {reference_lr!r}; allowed: an lr > 0")
    return float(reference_lr * math.sqrt((arm[0] * arm[1]) / (reference[0] * reference[1])))


# ---- budgets and marks --------------------------------------------------------------------------------------------
MIN_BRORL_UPDATES = 64  # the longest run gives the BroRL arm at least this many optimizer updates
MARKS = 8  # log-spaced budget marks: budget / 2^(MARKS-1), ..., budget / 2, budget


def log_marks(budget: int, marks: int = MARKS) -> list[int]:
    """``marks`` budget marks spaced by factors of 2 up to ``budget`` (generated samples): ceil(budget / 2^k)."""
    check_int("budget", budget, 1)
    check_int("marks", marks, 1)
    return sorted({math.ceil(budget / 2 ** k) for k in range(marks)})


def size_budget(samples_per_update: float, *, updates: int = MIN_BRORL_UPDATES, margin: float = 1.25,
                at_least: int = 0, unit: int = 65_536) -> int:
    """A budget of generated samples giving an arm ``updates`` optimizer updates at its measured generated samples
    per update (fill-to-full: the pilot's :func:`cap_binding`), times ``margin`` (pass rates drift as the arm
    learns), at least ``at_least``, rounded up to a multiple of ``unit``."""
    if not (is_number(samples_per_update) and samples_per_update > 0) or not (is_number(margin) and margin >= 1):
        raise ValueError(f"samples_per_update, margin: got {samples_per_update!r}, {margin!r}; allowed: > 0, >= 1")
    need = max(samples_per_update * updates * margin, at_least)
    return int(math.ceil(need / unit) * unit)


# ---- the study as data ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Frontier:
    """The frontier study, declared as data (issue 43). Its declaration (:meth:`to_declaration`, written by
    :func:`brorl_lab.study.results.write_declaration` to ``notebooks/figures/frontier/declaration.json``) is
    committed before the first full-size run; :func:`run_stage` refuses to run a stage otherwise.

    ``budgets`` are generated samples per arm and branch point (:func:`size_budget` from the refill pilot);
    ``round_cap`` is the primary protocol's ``max_resample_rounds`` (fill-to-full: binds on < 5% of steps in the
    pilot), ``capped_round_cap`` the ablation's (the recipe's 4). ``seeds`` the main runs' paired seeds (>= 10: the
    race's rule), ``lr_grid`` / ``lr_seeds`` / ``lr_pilot_budget`` the lr pilot's, whose rule is :func:`pick_lr`;
    ``lr_pilot_long_budget`` the amendment's (stage 'lr_pilot_long': the same grid, seeds and rule at a longer budget
    for the branch points it names, whose picks replace the first pilot's there); ``ablation_seeds`` the seed
    amendment's (:data:`SEED_AMENDMENT`: the ablation stages 'fixed' and 'capped' on the first of the paired seeds);
    ``race_eval_every`` the race amendment's (:data:`RACE_AMENDMENT`: at these branch points the main stages also
    evaluate every that many generated samples, so a time to the race's level is read to that resolution)."""

    name: str = "frontier"
    branches: tuple = ("takeoff", "learned")
    ratio_arms: Mapping = field(default_factory=lambda: dict(RATIO_ARMS))
    optional_arms: Mapping = field(default_factory=lambda: dict(OPTIONAL_RATIO_ARMS))
    fixed_batch_arms: Mapping = field(default_factory=lambda: dict(FIXED_BATCH_ARMS))
    budgets: Mapping = field(default_factory=dict)
    marks: int = MARKS
    round_cap: int = 32
    capped_round_cap: int = 4
    seeds: tuple = tuple(range(10))
    lr_grid: tuple = LR_GRID
    lr_seeds: tuple = LR_PILOT_SEEDS
    ablation_seeds: Optional[tuple] = None  # the seed amendment: the ablation stages' seeds (None: :attr:`seeds`)
    race_eval_every: Mapping = field(default_factory=dict)  # the race amendment: branch -> samples between evals
    lr_pilot_budget: Mapping = field(default_factory=dict)
    lr_pilot_long_budget: Mapping = field(default_factory=dict)  # the amendment: branch -> a longer pilot's budget
    race_level: float = 0.10
    race_family: str = "spell_backward"
    gap_effect: float = GAP_EFFECT
    eval_prompts: int = 200  # held-out prompts per family at each mark (the paid takeoff study's 200 x 8)
    eval_samples: int = 8

    def __post_init__(self):
        unknown = [b for b in (*self.branches, *self.budgets) if b not in BRANCH_POINTS]
        if unknown:
            raise ValueError(f"branches: got {unknown}; allowed: {', '.join(BRANCH_POINTS)}")
        for b, v in self.budgets.items():
            check_int(f"budgets[{b!r}]", v, 1)
        check_int("round_cap", self.round_cap, self.capped_round_cap + 1)
        for b, v in self.race_eval_every.items():
            if b not in BRANCH_POINTS:
                raise ValueError(f"race_eval_every: got branch {b!r}; allowed: {', '.join(BRANCH_POINTS)}")
            check_int(f"race_eval_every[{b!r}]", v, 1)
        if self.ablation_seeds is not None and not (self.ablation_seeds and set(self.ablation_seeds) <= set(self.seeds)):
            raise ValueError(f"ablation_seeds: got {list(self.ablation_seeds)}; allowed: a non-empty subset of seeds "
                             f"{list(self.seeds)} (each ablation run is paired with the primary run of its seed)")

    def arms(self, design: str = "ratio", *, optional: bool = False) -> dict[str, tuple[int, int]]:
        """{arm name: (N, prompts per step)} of ``design`` ('ratio': the 4:1 design, with ``optional`` its N = 4
        and 128 arms; 'fixed': the fixed-batch design)."""
        table = {"ratio": {**self.ratio_arms, **(self.optional_arms if optional else {})},
                 "fixed": self.fixed_batch_arms}
        if design not in table:
            raise ValueError(f"design: got {design!r}; allowed: 'ratio', 'fixed'")
        return {arm_name(n, p): (n, p) for n, p in sorted(table[design].items())}

    def budget_marks(self, branch: str) -> list[int]:
        """The log-spaced budget marks of ``branch`` (:func:`log_marks` of its budget)."""
        if branch not in self.budgets:
            raise ValueError(f"branch: {branch!r} has no budget; allowed: {', '.join(self.budgets) or 'none sized'}")
        return log_marks(self.budgets[branch], self.marks)

    def configs(self, branch: str, design: str = "ratio", *, lrs: Optional[Mapping[str, float]] = None,
                capped: bool = False, optional: bool = False, budget: Optional[int] = None,
                race_evals: bool = False) -> dict[str, Config]:
        """{arm: Config} from ``branch``: the flagship recipe, each arm's N and prompts per step, its lr (``lrs``
        {arm: lr} from :func:`pick_lr`, default the branch point's own), paid the branch's budget in generated
        samples (``budget``: a shorter one, e.g. the lr pilot's) and evaluated at its marks up to that budget
        (:attr:`eval_prompts` prompts x :attr:`eval_samples` samples per family; ``race_evals``: also every
        :attr:`race_eval_every` samples where it names the branch point); dynamic sampling refilled up to
        :attr:`round_cap` rounds (``capped``: :attr:`capped_round_cap`); no reset (the paid study's arms)."""
        from brorl_lab.study.recipe import recipe_config

        model, families, lr0 = BRANCH_POINTS[branch]
        budget = budget or self.budgets.get(branch)
        marks = {m for m in self.budget_marks(branch) if m <= budget} | {budget}  # the pilot reads its end
        every = self.race_eval_every.get(branch) if race_evals else None
        marks = sorted(marks | (set(range(every, budget + 1, every)) if every else set()))
        out = {}
        for arm, (n, p) in self.arms(design, optional=optional).items():
            out[arm] = recipe_config(
                model=model, tasks=families, lr=(lrs or {}).get(arm, lr0), rollouts_per_prompt=n,
                prompts_per_step=p, max_resample_rounds=self.capped_round_cap if capped else self.round_cap,
                max_samples=budget, eval_at_samples=marks, eval_at_steps=[], eval_every=0, reset_every=0,
                reset_every_samples=0, steps=math.ceil(budget / (n * p)), checkpoint_every=1, run_name=arm,
                eval_prompts=self.eval_prompts, eval_samples=self.eval_samples)
        return out

    # ---- the stages, run by the study runner (study.runner.run_grid), each arm x seed into the ledger ---------------
    def stage_seeds(self, stage: str) -> tuple:
        """The paired seeds of ``stage``: the lr pilots' :attr:`lr_seeds`, the ablations' :attr:`ablation_seeds`
        (when the seed amendment sets them), every other stage's :attr:`seeds`."""
        check_stage(stage)
        if stage in PILOT_STAGES:
            return tuple(self.lr_seeds)
        if stage in ABLATION_STAGES and self.ablation_seeds is not None:
            return tuple(self.ablation_seeds)
        return tuple(self.seeds)

    def pilot_budgets(self, stage: str) -> Mapping:
        """{branch: budget} of an lr pilot stage: 'lr_pilot' every branch point, 'lr_pilot_long' the amendment's."""
        return self.lr_pilot_long_budget if stage == "lr_pilot_long" else self.lr_pilot_budget

    def stage_arms(self, stage: str, *, picks: Optional[Mapping[str, Mapping[str, float]]] = None,
                   branches: Optional[Sequence[str]] = None) -> dict[str, Config]:
        """{"<branch>-<arm>[-lr<lr>]": Config} of ``stage`` (:data:`STAGES`) over every branch point. The lr pilot:
        each 4:1 arm at every lr of :attr:`lr_grid`, paid :attr:`lr_pilot_budget`. 'ratio' (the primary frontier)
        and 'capped' (its ablation): each arm at its pick (``picks`` {branch: {arm: lr}}, :func:`lr_picks` of the
        pilot). 'fixed' (IsoCompute's fixed batch): every arm at the pick of the largest-N 4:1 arm (n512x16), whose
        samples and updates per step they all share. 'lr_pilot_long' (the amendment): the lr pilot again, only at
        the branch points of :attr:`lr_pilot_long_budget`, paid that budget. ``branches``: only these branch points
        (a stage may run one branch point at a time; its ledger files are per run)."""
        check_stage(stage)
        chosen = self.branches if branches is None else tuple(branches)
        unknown = [b for b in chosen if b not in self.branches]
        if unknown or not chosen:
            raise ValueError(f"branches: got {list(chosen)}; allowed: one or more of {', '.join(self.branches)}")
        out = {}
        for b in chosen:
            if stage in PILOT_STAGES:
                if b not in self.pilot_budgets(stage):
                    continue  # the longer pilot runs only where the amendment names a budget
                for lr in self.lr_grid:
                    arms = self.configs(b, "ratio", lrs={a: lr for a in self.arms("ratio")},
                                        budget=self.pilot_budgets(stage)[b])
                    out.update({f"{b}-{a}-lr{lr:g}": c for a, c in arms.items()})
                continue
            if not picks or b not in picks:
                raise ValueError(f"picks: no lr picks for {b!r}; allowed: lr_picks() of a finished lr pilot "
                                 "(run stage lr_pilot first)")
            design = "fixed" if stage == "fixed" else "ratio"
            large = max(self.arms("ratio"), key=arm_n)  # BroRL's shape (n512x16), shared by both designs
            lrs = ({a: picks[b][large] for a in self.arms("fixed")} if design == "fixed" else dict(picks[b]))
            arms = self.configs(b, design, lrs=lrs, capped=stage == "capped", race_evals=True)
            shared = self.shared_fixed_arms() if design == "fixed" else ()
            out.update({f"{b}-{a}": c for a, c in arms.items() if a not in shared})
        return out

    def shared_fixed_arms(self) -> tuple:
        """The fixed-batch arms that are also 4:1 arms (n512x16: same N, prompts, lr pick, protocol and budget, so
        the same run): the 'fixed' stage does not run them again; its reading takes them from the 'ratio' ledger."""
        return tuple(a for a in self.arms("fixed") if a in self.arms("ratio"))

    def to_declaration(self) -> dict:
        """The study as declared before the run, plain JSON (what :func:`brorl_lab.study.results.write_declaration`
        commits): design, seeds, budgets and marks, protocol, the lr rule, and the readings by dotted name."""
        here = __name__
        return {
            "study": self.name,
            "status": ("pre-registered: this file is committed before the first full-size run of any stage; every "
                       "ledger file's provenance names the commit that added it"),
            "stages": {st: {"what": STAGES[st], "seeds": list(self.stage_seeds(st)),
                            "ledger": f"notebooks/figures/frontier/{st}/<branch>-<arm>[-lr<lr>]_s<seed>.parquet"}
                       for st in STAGES},
            "evaluation": {"prompts_per_family": self.eval_prompts, "samples_per_prompt": self.eval_samples,
                           "at": "every budget mark up to the run's budget", "metric": METRIC,
                           **({"race_every": {"samples": dict(self.race_eval_every),
                                              "stages": ["ratio", "fixed", "capped"], **RACE_AMENDMENT}}
                              if self.race_eval_every else {})},
            "fixed_batch_lr": ("every fixed-batch arm at the pick of the largest-N 4:1 arm (n512x16: the samples and "
                               "updates per step they all share)"),
            "fixed_batch_shared": {"arms": list(self.shared_fixed_arms()),
                                   "from": "the ratio stage's runs (the same config: not run again by stage fixed)"},
            "branch_points": {b: {"model": BRANCH_POINTS[b][0], "families": BRANCH_POINTS[b][1],
                                  "lr": BRANCH_POINTS[b][2]} for b in self.branches},
            "designs": {"ratio": {a: {"rollouts_per_prompt": n, "prompts_per_step": p}
                                  for a, (n, p) in self.arms("ratio").items()},
                        "ratio_optional": {a: {"rollouts_per_prompt": n, "prompts_per_step": p}
                                           for a, (n, p) in self.arms("ratio", optional=True).items()
                                           if a not in self.arms("ratio")},
                        "fixed_batch": {a: {"rollouts_per_prompt": n, "prompts_per_step": p}
                                        for a, (n, p) in self.arms("fixed").items()}},
            "budget": {"unit": "generated samples per arm (every dynamic-sampling round counted)",
                       "per_branch": dict(self.budgets), "marks": {b: self.budget_marks(b) for b in self.budgets},
                       "min_brorl_updates": MIN_BRORL_UPDATES},
            "protocol": {"primary": {"dynamic_sampling": "refill until the batch is full",
                                     "max_resample_rounds": self.round_cap, "cap_binding_bound": 0.05,
                                     "cap_binding_logged_as": "metrics ds_cap_hit, events.jsonl 'refill'"},
                         "ablation": {"dynamic_sampling": "capped", "max_resample_rounds": self.capped_round_cap}},
            "lr": {"grid": list(self.lr_grid), "seeds": list(self.lr_seeds), "pilot_budget": dict(self.lr_pilot_budget),
                   "rule": f"{here}.pick_lr", "kl_share": LR_KL_SHARE,
                   "amendment": {"declared": LR_AMENDMENT["declared"], "why": LR_AMENDMENT["why"],
                                 "pilot_long_budget": dict(self.lr_pilot_long_budget),
                                 "picks": LR_AMENDMENT["picks"]},
                   "kl_bound": "study.compare.COLLAPSE kl_max (nats/token)",
                   "sqrt_rule_reported": f"{here}.sqrt_rule_lr"},
            "seeds": list(self.seeds),
            **({"seed_amendment": {**SEED_AMENDMENT, "seeds": list(self.ablation_seeds)}}
               if self.ablation_seeds is not None else {}),
            "readings": {"best_n_per_mark": f"{here}.best_n", "frontier": f"{here}.frontier_table",
                         "axes": ["cum_samples", "cum_trained_samples", "cum_updates", "cum_wall_s"],
                         "race": {"reading": f"{here}.takeoff_races", "level": self.race_level,
                                  "family": self.race_family, "resolved_share": RACE_RESOLVED_SHARE},
                         "per_update_gap": {"reading": "study.paid.paired_at_grid on cum_updates",
                                            "seeds_rule": f"{here}.seeds_for_gap", "effect": self.gap_effect,
                                            "power": 0.8, "level": 0.95},
                         "noise_scale": f"{here}.noise_table",
                         "fixed_batch": (f"{here}.ratio_reading on the fixed stage's runs with the shared arms' "
                                         "ratio runs of the same seeds: the best N per mark at equal samples per update"),
                         "capped": f"{here}.capped_reading (capped minus fill-to-full, paired by arm and seed)"},
            "noise_scale": {
                "declared": NOISE_DECLARED, "estimator": "rl.noise_scale (McCandlish et al. 2018, B_simple, two batch "
                "sizes in informative groups)", "b_small": NOISE_DESIGN["b_small"], "b_big": NOISE_DESIGN["b_big"],
                "repeats": NOISE_DESIGN["repeats"], "seed": 0, "interval": "95% percentile bootstrap over repeats",
                "at": ["each branch point at N of the 4:1 ProRL and BroRL arms, each at its arm's prompts per step",
                       "each 4:1 arm's final policy of the ratio stage (seed 0) at its own N and prompts: along each "
                       "arm"],
                "ledger": "notebooks/figures/frontier/noise/<where>-n<N>.csv (per repeat; the summary is computed "
                          "from these)", "reading": f"{here}.noise_summary"},
        }


# ---- the refill protocol measured (the pilot that sizes the budget) ------------------------------------------------
#: The branch points: {name: (model alias, families, lr)}; the lr is each checkpoint's own (the paid study's).
BRANCH_POINTS = {"takeoff": ("takeoff", ["spell_backward"], 3e-4),
                 "learned": ("learned", ["spell_backward", "gcd"], 3e-4)}
#: Round caps (``max_resample_rounds``: refills after round 0) whose binding the pilot reads.
PILOT_CAPS = (4, 8, 16, 32)
#: The pilot's own cap: high enough that no step of the pilot should reach it (a step that does is counted as
#: binding at every cap of :data:`PILOT_CAPS`).
PILOT_ROUND_CAP = 63


def pilot_config(branch: str, n: int, prompts: int, *, steps: int, seed: int = 0, root: str | Path,
                 max_resample_rounds: int = PILOT_ROUND_CAP, lr: Optional[float] = None, threads: int = 1) -> Config:
    """One pilot run from ``branch`` (:data:`BRANCH_POINTS`): the flagship recipe at N = ``n`` x ``prompts`` per
    step, refilled up to ``max_resample_rounds`` rounds, no evaluation, no reset (the paid study's arms)."""
    from brorl_lab.study.recipe import recipe_config

    if branch not in BRANCH_POINTS:
        raise ValueError(f"branch: got {branch!r}; allowed: {', '.join(BRANCH_POINTS)}")
    model, families, lr0 = BRANCH_POINTS[branch]
    return recipe_config(model=model, tasks=families, lr=lr0 if lr is None else lr, rollouts_per_prompt=n,
                         prompts_per_step=prompts, max_resample_rounds=max_resample_rounds, steps=steps,
                         eval_every=0, reset_every=0, reset_every_samples=0, torch_threads=threads, seed=seed,
                         run_dir=str(root), run_name=f"{branch}_{arm_name(n, prompts)}_s{seed}",
                         checkpoint_every=steps)


def refill_pilot(branches: Sequence[str], arms: Mapping[int, int], *, steps: int, root: str | Path, seed: int = 0,
                 threads: int = 1) -> pd.DataFrame:
    """Run :func:`pilot_config` for every branch point and arm ({N: prompts per step}), one after another, and
    return one row per training step: branch, arm, N, prompts_per_step, step, refill_rounds, ds_cap_hit, samples
    (generated), kept_groups, ds_generated_groups, updates, kl, step_wall_s (the trainer's metrics)."""
    from brorl_lab.rl.trainer import Trainer

    check_int("steps", steps, 1)
    keep = ("step", "refill_rounds", "rollout_rounds", "ds_cap_hit", "samples", "kept_groups", "ds_generated_groups",
            "ds_pass_rate", "trained_samples", "updates", "kl", "step_wall_s")
    rows = []
    for branch in branches:
        for n, prompts in arms.items():
            cfg = pilot_config(branch, n, prompts, steps=steps, seed=seed, root=root, threads=threads)
            with Trainer(cfg, progress=False, overwrite=True) as trainer:
                df = trainer.run()
            df = df[df["step"] > 0][[k for k in keep if k in df.columns]]
            rows.append(df.assign(branch=branch, arm=arm_name(n, prompts), N=n, prompts_per_step=prompts,
                                  round_cap=cfg.max_resample_rounds))
    return pd.concat(rows, ignore_index=True)


def cap_binding(steps: pd.DataFrame, caps: Sequence[int] = PILOT_CAPS) -> pd.DataFrame:
    """How often a round cap would have bound, per branch point, arm and cap, read from a pilot refilled up to its
    own high cap (:func:`refill_pilot`'s rows): a step binds at cap c (``max_resample_rounds`` = c refills) when it
    needed more than c refills, or hit the pilot's own cap. Columns branch, arm, N, prompts_per_step, cap, steps,
    bound, share, lo, hi (Wilson 95%: the steps of one run are treated as independent draws, which they are only
    approximately), and the fill-to-full sizing: generated samples per step and per optimizer update, the mean
    informative-group rate q (kept / generated groups: a step of P prompts needs about P / (q P) = 1 / q rounds)."""
    from brorl_lab.lab.stats import wilson_interval

    out = []
    for (branch, arm), g in steps.groupby(["branch", "arm"], sort=False):
        needed = g["refill_rounds"].to_numpy()
        hit = g["ds_cap_hit"].astype(bool).to_numpy()
        gen = float(g["ds_generated_groups"].sum())
        sizing = {"samples_per_step": float(g["samples"].mean()),
                  "samples_per_update": float(g["samples"].sum() / max(g["updates"].sum(), 1)),
                  "q": float(g["kept_groups"].sum() / gen) if gen else np.nan,
                  "refills_mean": float(needed.mean()), "refills_max": int(needed.max()),
                  "pilot_cap_hit": int(hit.sum()), "step_wall_s": float(g["step_wall_s"].mean())}
        for c in caps:
            bound = int(((needed > c) | hit).sum())
            w = wilson_interval(bound, len(g))
            out.append({"branch": branch, "arm": arm, "N": int(g["N"].iloc[0]),
                        "prompts_per_step": int(g["prompts_per_step"].iloc[0]), "cap": int(c), "steps": len(g),
                        "bound": bound, "share": w["share"], "lo": w["lo"], "hi": w["hi"], **sizing})
    return pd.DataFrame(out)


def fill_samples_per_step(n: int, prompts: int, q: float) -> float:
    """Expected generated samples of a fill-to-full step: rounds of ``prompts`` x ``n`` until ``prompts`` groups are
    kept, each group kept with probability ``q`` (the measured informative-group rate at this N): about
    n * prompts / q (the round count's mean, 1 / q, ignoring the last round's surplus)."""
    if not (is_number(q) and 0 < q <= 1):
        raise ValueError(f"q: got {q!r}; allowed: a rate in (0, 1]")
    return n * prompts / q


#: The takeoff race needs the N=16 arm to reach +10 points: a pilot on the takeoff base crossed it near optimizer
#: update 100 (issue 43; the capped protocol). The budget from the takeoff base covers that many N=16 updates too.
RACE_UPDATES = 100
MIN_TAKEOFF_BUDGET = 1_000_000  # the floor for the takeoff base


def budgets_from_pilot(refill: pd.DataFrame, *, brorl_arm: str = arm_name(*BRORL_SHAPE),
                       prorl_arm: str = arm_name(*PRORL_SHAPE)) -> dict:
    """Each branch point's budget (generated samples per arm) from the refill pilot's :func:`cap_binding` table:
    :func:`size_budget` of the BroRL arm's generated samples per update for :data:`MIN_BRORL_UPDATES` updates; from
    the takeoff base at least :data:`MIN_TAKEOFF_BUDGET` and :data:`RACE_UPDATES` of the N=16 arm's updates (same
    margin). Returns {branch: budget}."""
    per = refill.drop_duplicates(["branch", "arm"]).set_index(["branch", "arm"])["samples_per_update"]
    out = {}
    for branch in dict.fromkeys(refill["branch"]):
        floor = 0
        if branch == "takeoff":
            floor = max(MIN_TAKEOFF_BUDGET, int(math.ceil(per[(branch, prorl_arm)] * RACE_UPDATES * 1.25)))
        out[branch] = size_budget(per[(branch, brorl_arm)], at_least=floor)
    return out


def pilot_markdown(refill: pd.DataFrame) -> str:
    """The refill pilot as a markdown table (the design page's block is this function of the shipped
    frontier_pilot_refill.csv; a test rebuilds it): per branch point and arm, the steps, refills per step (mean,
    max), the informative-group rate q, generated samples per optimizer update at fill-to-full, and per cap the
    steps it would have bound on (Wilson 95%)."""
    caps = sorted(refill["cap"].unique())
    head = ["| branch | arm | steps | refills per step, mean (max) | q | generated samples per update |"
            + "".join(f" binds at cap {c} |" for c in caps),
            "|---|---|---:|---:|---:|---:|" + "---:|" * len(caps)]
    for (branch, arm), g in refill.groupby(["branch", "arm"], sort=False):
        r = g.iloc[0]
        cells = "".join(f" {int(x['bound'])}/{int(x['steps'])} [{x['lo']:.2f}, {x['hi']:.2f}] |"
                        for _, x in g.sort_values("cap").iterrows())
        head.append(f"| {branch} | {arm} | {int(r['steps'])} | {r['refills_mean']:.1f} ({int(r['refills_max'])}) | "
                    f"{r['q']:.3f} | {r['samples_per_update']:,.0f} |{cells}")
    return "\n".join(head)


def noise_markdown(noise: pd.DataFrame) -> str:
    """:func:`noise_table`'s summary as the design page's markdown table (a test rebuilds the page's block from the
    shipped noise_scale.csv): per branch point and N, q and B_simple with its bootstrap interval in groups, rollouts
    and generated samples."""
    rows = ["| branch point | N | q (kept groups) | B_simple, groups | in rollouts (x N) | in generated samples (x N / q) |",
            "|---|---:|---:|---:|---:|---:|"]
    for _, r in noise.iterrows():
        cells = " | ".join(f"{r[f'b_{u}']:,.0f} [{r[f'b_{u}_lo']:,.0f}, {r[f'b_{u}_hi']:,.0f}]"
                           for u in ("groups", "rollouts", "generated"))
        rows.append(f"| {r['branch']} | {int(r['N'])} | {r['q']:.3f} | {cells} |")
    return "\n".join(rows)


# ---- the critical batch size at each branch point (rl.noise_scale) ----------------------------------------------------
#: The noise-scale measurement's design: two batch sizes in informative groups, repeats per (branch, N), and the
#: prompts drawn per collection round at each N (the 4:1 arms' own).
NOISE_DESIGN = dict(b_small=1, b_big=16, repeats=8, prompts=dict([PRORL_SHAPE, BRORL_SHAPE]))
NOISE_DECLARED = "2026-12-07"  # the pre-registered noise stage (declaration's noise_scale), before its first run


def noise_table(branches: Sequence[str], ns: Sequence[int], *, b_small: int = NOISE_DESIGN["b_small"],
                b_big: int = NOISE_DESIGN["b_big"], repeats: int = NOISE_DESIGN["repeats"], seed: int = 0,
                prompts: Optional[Mapping[int, int]] = None, draws: int = 2000) -> tuple[pd.DataFrame, pd.DataFrame]:
    """B_simple (:mod:`brorl_lab.rl.noise_scale`) at each branch point (:data:`BRANCH_POINTS`: its families, the
    flagship recipe's loss) and N: :func:`measure_noise_point` at each, read by :func:`noise_summary`. Returns
    (per-repeat rows, summary): the summary has one row per (branch, N): the estimate in groups with its bootstrap
    interval, |G|^2 and tr(Sigma) with theirs, the share of bootstrap draws with |G|^2 <= 0, the informative-group
    rate q over every collection round, and B in rollouts (x N) and in generated samples (x N / q)."""
    prompts = {**NOISE_DESIGN["prompts"], **(prompts or {})}
    reps = pd.concat([measure_noise_point(branch, branch, BRANCH_POINTS[branch][0], n,
                                          prompts.get(n, ratio_prompts(n)), seed=seed, b_small=b_small, b_big=b_big,
                                          repeats=repeats) for branch in branches for n in ns], ignore_index=True)
    summary = noise_summary(reps, draws=draws, seed=seed)
    return reps.drop(columns="where"), summary.drop(columns="where")


def noise_points(runs: Optional[str | Path] = None, *, branches: Optional[Sequence[str]] = None
                 ) -> list[tuple[str, str, str | Path, int, int]]:
    """Where the pre-registered noise stage measures (the declaration's ``noise_scale.at``): (where, branch point,
    model, N, prompts per step) for each branch point at the ProRL and BroRL arms' N, then, for each 4:1 arm whose
    ratio run of seed 0 left its final policy under ``runs`` (``<runs>/ratio/arms/<branch>-<arm>_s0/policy``, what
    ``run ratio`` writes), that policy at the arm's own N and prompts. A missing policy is left out (its point is
    measured once the run is there)."""
    chosen = list(branches or BRANCH_POINTS)
    unknown = [b for b in chosen if b not in BRANCH_POINTS]
    if unknown:
        raise ValueError(f"branches: got {unknown}; allowed: one or more of {', '.join(BRANCH_POINTS)}")
    out = [(b, b, BRANCH_POINTS[b][0], n, NOISE_DESIGN["prompts"][n]) for b in chosen for n in NOISE_DESIGN["prompts"]]
    if runs is not None:
        for b in chosen:
            for arm, (n, p) in FRONTIER.arms("ratio").items():
                policy = Path(runs) / "ratio" / "arms" / f"{b}-{arm}_s0" / "policy"
                if policy.is_dir():
                    out.append((f"{b}-{arm}_s0", b, policy, n, p))
    return out


def measure_noise_point(where: str, branch: str, model: str | Path, n: int, prompts: int, *, seed: int = 0,
                        b_small: Optional[int] = None, b_big: Optional[int] = None, repeats: Optional[int] = None
                        ) -> pd.DataFrame:
    """One point of the noise stage: :func:`brorl_lab.rl.noise_scale.measure_noise_scale` at ``model`` (the branch
    point's families and lr, the flagship recipe's loss) with N = ``n`` and ``prompts`` per collection round, at two
    batch sizes and ``repeats`` (None: :data:`NOISE_DESIGN`'s, the declared ones, read at the call). One row per
    repeat, with ``where`` and ``branch``."""
    from brorl_lab.core.models import load_policy
    from brorl_lab.rl.noise_scale import measure_noise_scale
    from brorl_lab.study.recipe import recipe_config

    _, families, lr = BRANCH_POINTS[branch]
    cfg = recipe_config(model=str(model), tasks=families, lr=lr, rollouts_per_prompt=n, prompts_per_step=prompts)
    policy, tok = load_policy(cfg.model, device=cfg.device)
    df = measure_noise_scale(cfg, b_small=b_small or NOISE_DESIGN["b_small"], b_big=b_big or NOISE_DESIGN["b_big"],
                             repeats=repeats or NOISE_DESIGN["repeats"], seed=seed, policy=policy, tokenizer=tok)
    return df.assign(where=where, branch=branch)


def noise_summary(repeats: pd.DataFrame, *, draws: int = 2000, seed: int = 0) -> pd.DataFrame:
    """The declared reading of the noise stage: per (where, N) of the per-repeat rows, B_simple with its bootstrap
    interval in groups (:func:`brorl_lab.rl.noise_scale.noise_scale_interval`), |G|^2 and tr(Sigma) with theirs, q
    (kept over generated groups, every collection round) and B in rollouts (x N) and generated samples (x N / q)."""
    from brorl_lab.rl.noise_scale import noise_scale_interval, noise_scale_units

    rows = []
    for (where, n), g in repeats.groupby(["where", "N"], sort=False):
        b_small, b_big = int(g["b_small"].iloc[0]), int(g["b_big"].iloc[0])
        r = noise_scale_interval(g["sq_small"], g["sq_big"], b_small, b_big, draws=draws, seed=seed)
        q = float(g["kept_groups"].sum() / g["generated_groups"].sum())
        rows.append({"where": where, "branch": g["branch"].iloc[0], "N": int(n), "q": q, **{k: r[k] for k in (
            "b_simple", "lo", "hi", "g2", "g2_lo", "g2_hi", "trace", "trace_lo", "trace_hi", "nonpositive_g2",
            "repeats", "b_small", "b_big", "method")}, **noise_scale_units(r, int(n), q)})
    return pd.DataFrame(rows)


def run_noise_stage(*, runs: str | Path = "runs/frontier", ledger: Optional[str | Path] = None, ship: bool = True,
                    branches: Optional[Sequence[str]] = None, command: Optional[str] = None, threads: int = 1,
                    progress: bool = True) -> list[Path]:
    """The pre-registered noise stage: each of :func:`noise_points` not yet in the ledger is measured and written
    as its own file (``<where>-n<N>.csv``, one row per repeat, with its provenance: the run's clean commit, its
    start and the committed declaration when ``ship``), so the stage resumes point by point. Returns the ledger's
    files of these points."""
    import time

    import torch
    from tqdm.auto import tqdm

    from brorl_lab.study.recipe import resolve_experiment_model
    from brorl_lab.study.results import provenance, read_provenance, require_preregistered, start_of_run, write_provenance

    root = Path(ledger) if ledger else LEDGER / "noise"
    declared = require_preregistered(LEDGER / "declaration.json") if ship else None
    torch.set_num_threads(threads)
    points = noise_points(runs, branches=branches)
    files = [root / f"{where}-n{n}.csv" for where, _, _, n, _ in points]
    todo = [(pt, f) for pt, f in zip(points, files) if not (f.is_file() and read_provenance(f))]
    root.mkdir(parents=True, exist_ok=True)
    for (where, branch, model, n, prompts), f in tqdm(todo, desc="noise points", disable=not progress):
        start, t0 = start_of_run(), time.perf_counter()
        df = measure_noise_point(where, branch, model, n, prompts)
        df.to_csv(f, index=False)
        extra = dict(started_at=start["started_at"], declaration=declared, reading=f"{__name__}.noise_summary") \
            if ship else dict(status="exploratory", note="not pre-registered (--exploratory)")
        write_provenance(f, provenance(command or f"{__name__}.run_noise_stage()",
                                       {where: resolve_experiment_model(str(model))},
                                       time.perf_counter() - t0, commit=start["commit"], **extra))
    return [f for f in files if f.is_file()]


# ---- a plateau where the compared recipe really stalls? (issue 43, item 7) -----------------------------------------
def continue_plateau(*, steps: int, eval_every: int, seed: int = 1, root: str | Path, threads: int = 1
                     ) -> tuple[pd.DataFrame, dict]:
    """Continue the recipe that made data/learned_plateau (its plateau.json config: ProRL v2 at N = 16 x 16 prompts,
    lr 3e-4, evaluation 200 prompts x 32 samples at T = 0.6) for ``steps`` more steps with a fresh Adam (as every
    arm starts) and seed ``seed`` (seed 0 would replay the plateau run's first prompts), evaluated every
    ``eval_every`` steps. Returns (the evaluations: step, cum_samples, pass@1 per family and mean) and the OLS slope
    of mean pass@1 per 100 steps with its t interval (:func:`brorl_lab.lab.stats.ols_slope_interval`, one curve:
    n - 2 degrees of freedom; evaluations share the eval set, so its noise is the sampling of 32 draws per prompt)."""
    import json

    from brorl_lab.lab.stats import ols_slope_interval
    from brorl_lab.rl.trainer import Trainer
    from brorl_lab.study.paid import METRIC
    from brorl_lab.study.recipe import recipe_config, resolve_experiment_model

    meta = json.loads((Path(resolve_experiment_model("learned")) / "plateau.json").read_text())
    keep = ("rollouts_per_prompt", "prompts_per_step", "optimizer_steps_per_step", "advantage", "eps_low",
            "eps_high", "kl_beta", "kl_estimator", "reward", "dynamic_sampling", "max_resample_rounds", "lr",
            "temperature", "eval_prompts", "eval_samples", "eval_temperature", "eval_top_p", "max_new_tokens")
    over = {k: meta["config"][k] for k in keep if k in meta["config"]}
    cfg = recipe_config(model="learned", tasks=meta["families"], **over, steps=steps, eval_every=eval_every,
                        reset_every=0, reset_every_samples=0, seed=seed, torch_threads=threads, run_dir=str(root),
                        run_name=f"learned_continued_s{seed}", checkpoint_every=steps)
    with Trainer(cfg, progress=False, overwrite=True) as trainer:
        df = trainer.run()
    ev = df[df[METRIC].notna()]
    cols = ["step", "cum_samples"] + [c for c in ev.columns if c.startswith("eval/") and c.endswith("pass@1")]
    ev = ev[cols].reset_index(drop=True)
    r = ols_slope_interval(ev["step"] / 100, ev[METRIC])
    from brorl_lab.study.compare import COLLAPSE

    trained = df[df["step"] > 0]
    health = {"kl_max": float(trained["kl"].max()), "kl_steps_over_bound": int((trained["kl"] > COLLAPSE["kl_max"]).sum()),
              "cap_hit_steps": int(trained["ds_cap_hit"].astype(bool).sum()), "trained_steps": len(trained)}
    return ev, {**{k: r[k] for k in ("n", "slope", "lo", "hi", "se")}, **health, "unit": "mean pass@1 per 100 steps",
                "start": float(ev[METRIC].iloc[0]), "end": float(ev[METRIC].iloc[-1]), "steps": steps, "seed": seed,
                "config": over}


#: The frontier as pre-registered (notebooks/figures/frontier/declaration.json). Budgets: :func:`budgets_from_pilot`
#: of the shipped
#: refill pilot (notebooks/figures/frontier_pilot_refill.csv; a test recomputes them): takeoff 1,048,576 (the 1M
#: floor binds: BroRL's 64 updates need 721k, N=16's 100 race updates 1.01M), learned 917,504 (64 x 11,469 x 1.25).
#: Round cap 63 refills: 3 times the pilot's largest need (21 refills; a cap of 32 bound on 0 of its 40 steps).
#: The lr amendment (declared 2026-12-07, after the lr pilot and before any full-size stage; evidence in
#: docs/results/frontier_design.md): the takeoff pilot's budget bought 10-26 updates, where the audit's pilot from the
#: same checkpoint needed about 100 to rise 10 points, so its picks were made on noise. The takeoff pilot runs again
#: at 5 times that budget (655,360 generated samples: about 66 updates for n512x16 at the pilot's 9.9k samples per
#: update), same grid, seeds and rule; its picks replace the first pilot's at takeoff. The learned picks stand.
LR_AMENDMENT = {"declared": "2026-12-07",
                "why": ("the first takeoff pilot bought 10-26 optimizer updates per run and every arm x lr ended at "
                        "0.4-3.1% held-out pass@1: too short for the rule to see an lr's effect from takeoff"),
                "picks": ("a branch point in pilot_long_budget takes its picks from lr_pilot_long/lr_picks.csv, "
                          "every other from lr_pilot/lr_picks.csv")}
#: The seed amendment (declared 2026-12-07, before the first run of either ablation stage; evidence and costs in
#: docs/results/frontier_design.md): what is still to run as declared is about 19 h of `--jobs 2` on the 2-core
#: machine, beyond the issue's 6-hour envelope, whose rule is to cut seeds before the budget. The primary stage keeps
#: its 10 paired seeds (the race's rule); the two ablations run on the first 5 of them, paired with the primary's.
SEED_AMENDMENT = {"declared": "2026-12-07", "stages": ["fixed", "capped"],
                  "why": ("the two ablations at 10 seeds and both branch points are about 12 h of --jobs 2 (learned "
                          "runs measured at 405 s each, takeoff runs estimated at 864 s from the longer lr pilot's); at "
                          "5 paired seeds a per-seed gap sd of 0.47 points (learned ratio stage, n512x16 - n16x64 at "
                          "its budget) gives a 95% interval of about +-0.58 points, and the takeoff paid rerun's sd "
                          "of about 1.2 points about +-1.5")}
#: The race amendment (declared 2026-12-07 after the first 2 of the takeoff ratio stage's 30 runs, which are
#: discarded and run again; docs/results/frontier_design.md): the declared evaluations sit at the log-spaced budget
#: marks only, so a time to +10 points is known only to the mark after it (between 524,288 and 1,048,576, the last
#: two, lies half the budget), and a crossing at the last mark ties with a run censored there. From the takeoff base
#: the main stages also evaluate every 32,768 generated samples (32 evaluations of 200 x 8, about 3% of a run's
#: time); the marks, the readings and the budget are unchanged.
RACE_AMENDMENT = {"declared": "2026-12-07",
                  "why": ("evaluations only at the log-spaced marks read a time to the race's level to the next mark "
                          "(the last interval is half the budget), and a crossing at the last mark ties with a run "
                          "censored there: the first two takeoff ratio runs (n16x64 and n64x32, seed 0) crossed "
                          "between 524,288 and 1,048,576; they are discarded and run again")}
FRONTIER = Frontier(budgets={"takeoff": 1_048_576, "learned": 917_504}, round_cap=63,
                    lr_pilot_budget={"takeoff": 131_072, "learned": 114_688},
                    lr_pilot_long_budget={"takeoff": 655_360}, ablation_seeds=tuple(range(5)),
                    race_eval_every={"takeoff": 32_768})


#: The stages of the frontier, in the order they run (``python -m brorl_lab.study.frontier run STAGE``).
STAGES = {"lr_pilot": "each 4:1 arm at each lr of the grid, lr_seeds, the pilot budget: the lr rule's input",
          "lr_pilot_long": ("the amendment: the lr pilot again at 5 times the budget, takeoff only; its picks replace "
                            "lr_pilot's there"),
          "ratio": "the primary frontier: the 4:1 arms at their picked lr, fill-to-full, the full budget",
          "fixed": "IsoCompute's fixed-batch design: 8,192 samples and 2 updates per step in every arm",
          "capped": "the ablation: the 4:1 arms with the recipe's round cap of 4"}
PILOT_STAGES = ("lr_pilot", "lr_pilot_long")
ABLATION_STAGES = ("fixed", "capped")
LEDGER = Path(__file__).resolve().parents[2] / "notebooks" / "figures" / "frontier"  # committed, one file per run


def check_stage(stage: str) -> str:
    if stage not in STAGES:
        raise ValueError(f"stage: got {stage!r}; allowed: {', '.join(STAGES)}")
    return stage


def split_arm(df: pd.DataFrame) -> pd.DataFrame:
    """The grid's arm names ``<branch>-<arm>[-lr<lr>]`` split into columns branch, arm (n<N>x<P>) and lr (NaN when
    the name carries none); ``run_arm`` keeps the full name."""
    parts = df["arm"].str.split("-", expand=True)
    out = df.assign(run_arm=df["arm"], branch=parts[0], arm=parts[1])
    out["lr"] = parts[2].str.removeprefix("lr").astype(float) if parts.shape[1] > 2 else np.nan
    return out


def lr_picks(df: pd.DataFrame, frontier: Optional["Frontier"] = None, stage: str = "lr_pilot") -> pd.DataFrame:
    """The lr rule (:func:`pick_lr`, fixed before the pilot) applied to the lr pilot's ledger table, per branch
    point at its pilot budget: one row per branch and arm (lr NaN: no lr qualified, the arm's grid moves down), with
    where BroRL's sqrt rule applied to the n16x64 pick lands (``sqrt_rule_lr``)."""
    fr = frontier or FRONTIER
    t = split_arm(df)
    rows = []
    for b, g in t.groupby("branch", sort=False):
        picked = pick_lr(lr_pilot_rows(g, mark=fr.pilot_budgets(stage)[b], metric=METRIC))
        shapes = fr.arms("ratio")
        small = min(shapes, key=arm_n)  # ProRL's shape: the smallest N
        ref = picked.set_index("arm")["lr"].get(small, np.nan)
        picked["sqrt_rule_lr"] = [sqrt_rule_lr(ref, shapes[small], shapes[a]) if np.isfinite(ref) else np.nan
                                  for a in picked["arm"]]
        rows.append(picked.assign(branch=b))
    return pd.concat(rows, ignore_index=True)[["branch", "arm", "lr", "value", "sqrt_rule_lr", "qualified",
                                               "kl_share_by_lr", "value_by_lr"]]


def stage_picks(root: str | Path, frontier: Optional["Frontier"] = None) -> dict:
    """{branch: {arm: lr}} for the main stages: each branch point's picks from ``root/lr_pilot/lr_picks.csv``,
    replaced by ``root/lr_pilot_long/lr_picks.csv`` at the branch points the amendment names. A branch point whose
    pilot has not finished has no entry (a stage asked to run it refuses, naming the pilot)."""
    fr = frontier or FRONTIER
    picks = {}
    for stage in PILOT_STAGES:
        path = Path(root) / stage / "lr_picks.csv"
        if path.is_file():
            got = picks_of(pd.read_csv(path))
            picks.update({b: v for b, v in got.items() if stage == "lr_pilot_long"
                          or b not in fr.lr_pilot_long_budget})
    return picks


def picks_of(table: pd.DataFrame) -> dict:
    """{branch: {arm: lr}} from :func:`lr_picks`; an arm with no pick is an error naming it (its grid moves down)."""
    missing = table[table["lr"].isna()]
    if len(missing):
        raise ValueError("lr picks: no lr qualified for " + ", ".join(f"{b}/{a}" for b, a in
                                                                      zip(missing["branch"], missing["arm"]))
                         + "; allowed: the pilot rerun with that arm's grid halved (the declared rule)")
    return {b: dict(zip(g["arm"], g["lr"].astype(float))) for b, g in table.groupby("branch", sort=False)}


def run_stage(stage: str, *, out: str | Path = "runs/frontier", ledger: Optional[str | Path] = None,
              ship: bool = True, frontier: Optional["Frontier"] = None, jobs: Optional[int] = 2,
              threads: Optional[int] = 1, ray: Optional[str] = None, progress: bool = True,
              command: Optional[str] = None, branches: Optional[Sequence[str]] = None):
    """Run one stage of the frontier through the study runner (:func:`brorl_lab.study.runner.run_grid`): the
    declaration (:meth:`Frontier.to_declaration`) must be committed in the ledger's parent (``ship``), every
    finished arm x seed lands in ``ledger/<stage>/`` at once (commit them as they come), runs already there are
    read back. The main stages take their lrs from the pilots' ledgers (:func:`stage_picks`). ``branches``: run
    only these branch points. Returns the :class:`~brorl_lab.study.runner.GridRun`; after a finished lr pilot
    stage, ``lr_picks.csv`` is written beside its runs."""
    from brorl_lab.study.recipe import resolve_experiment_model
    from brorl_lab.study.results import provenance, write_provenance
    from brorl_lab.study.runner import run_grid

    fr = frontier or FRONTIER
    check_stage(stage)
    root = Path(ledger) if ledger else LEDGER
    chosen = tuple(branches) if branches else fr.branches
    picks = None
    if stage not in PILOT_STAGES:
        picks = stage_picks(root, fr)
        for b in chosen:
            if b not in picks:
                pilot = "lr_pilot_long" if b in fr.lr_pilot_long_budget else "lr_pilot"
                raise ValueError(f"stage: {stage!r} at {b!r} needs the lr picks of stage {pilot!r} "
                                 f"({pilot}/lr_picks.csv); allowed: run that stage to its end first, or --branches "
                                 f"{' '.join(x for x in chosen if x in picks) or '<a branch point with picks>'}")
    arms = fr.stage_arms(stage, picks=picks, branches=chosen)
    cks = {b: resolve_experiment_model(BRANCH_POINTS[b][0]) for b in chosen}
    grid = run_grid(f"{fr.name}_{stage}", arms, seeds=fr.stage_seeds(stage), out=Path(out) / stage,
                    declaration=fr.to_declaration(), declare_in=root, ledger=root / stage, ship=ship,
                    checkpoints=cks, jobs=jobs, ray=ray, threads=threads, progress=progress, command=command)
    if stage in PILOT_STAGES and grid.finished and set(chosen) >= set(fr.pilot_budgets(stage)):
        table = lr_picks(grid.metrics, fr, stage)
        path = root / stage / "lr_picks.csv"
        table.to_csv(path, index=False)
        write_provenance(path, provenance(command or f"{__name__}.run_stage({stage!r})", cks, grid.wall_s,
                                          commit=grid.start["commit"], started_at=grid.start["started_at"],
                                          declaration=grid.declared, reading=f"{__name__}.lr_picks"))
    return grid


# ---- the command: python -m brorl_lab.study.frontier pilot ... -------------------------------------------------------
def main(argv: Optional[Sequence[str]] = None) -> int:
    """Two exploratory measurements (1 torch thread; neither pre-registered, each record says so):

    ``python -m brorl_lab.study.frontier pilot --steps 5 --out runs/frontier_pilot [--figures notebooks/figures]``:
    the refill pilot (:func:`refill_pilot` on both branch points, arms 16x64, 64x32, 128x32, 512x16, 1 seed) ->
    ``frontier_pilot_refill_steps.csv`` (per step) and ``frontier_pilot_refill.csv`` (:func:`cap_binding`).

    ``python -m brorl_lab.study.frontier noise --out runs/frontier_noise [--figures notebooks/figures]``: the noise
    scale (:func:`noise_table`, both branch points, N = 16 and 512) -> ``noise_scale_repeats.csv`` and
    ``noise_scale.csv``.

    Each table goes to ``--out`` and, with ``--figures``, there too, each with its provenance record.

    Pre-registered (the committed declaration's ``noise_scale``; a clean tree): ``python -m brorl_lab.study.frontier
    noise-stage [--runs runs/frontier]`` (:func:`run_noise_stage`): the noise scale at each branch point and at each
    4:1 arm's final policy of the ratio stage (seed 0), one ledger file per point under
    ``notebooks/figures/frontier/noise/``, resumable point by point; and ``... run <stage>`` (:func:`run_stage`)."""
    import argparse
    import shlex
    import sys

    import torch

    from brorl_lab.study.recipe import resolve_experiment_model
    from brorl_lab.study.results import git_commit, provenance, write_provenance

    ap = argparse.ArgumentParser(prog="python -m brorl_lab.study.frontier")
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("pilot", help="the refill pilot: how often a round cap binds, samples per update at fill-to-full")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--arms", nargs="+", default=[f"{n}x{ratio_prompts(n)}" for n in sorted({*RATIO_ARMS, 128})],
                   help="NxP")
    p.add_argument("--out", default="runs/frontier_pilot")
    q = sub.add_parser("noise", help="the gradient noise scale at each branch point and N")
    q.add_argument("--ns", type=int, nargs="+", default=[PRORL_SHAPE[0], BRORL_SHAPE[0]])
    q.add_argument("--b-small", type=int, default=NOISE_DESIGN["b_small"])
    q.add_argument("--b-big", type=int, default=NOISE_DESIGN["b_big"])
    q.add_argument("--repeats", type=int, default=NOISE_DESIGN["repeats"])
    q.add_argument("--out", default="runs/frontier_noise")
    c = sub.add_parser("continue", help="continue the learned plateau's own recipe and read its slope (item 7)")
    c.add_argument("--steps", type=int, default=100)
    c.add_argument("--eval-every", type=int, default=10)
    c.add_argument("--out", default="runs/frontier_continue")
    c.add_argument("--seed", type=int, default=1, help="1: seed 0 would replay the plateau run's first prompts")
    for x in (p, q):
        x.add_argument("--seed", type=int, default=0)
        x.add_argument("--branches", nargs="+", default=list(BRANCH_POINTS))
    for x in (p, q, c):
        x.add_argument("--figures", default=None, help="also write the tables here with provenance")
    ns = sub.add_parser("noise-stage", help="the pre-registered noise scale: branch points and each arm's end")
    ns.add_argument("--runs", default="runs/frontier", help="where `run ratio` left the arms' final policies")
    ns.add_argument("--branches", nargs="+", default=None, help="only these branch points (default: all)")
    ns.add_argument("--exploratory", action="store_true",
                    help="no pre-registration: the files go under --runs/noise_ledger, records say so")
    r = sub.add_parser("run", help="one stage of the pre-registered frontier, through the study runner")
    r.add_argument("stage", choices=list(STAGES), help="; ".join(f"{k}: {v}" for k, v in STAGES.items()))
    r.add_argument("--jobs", type=int, default=2, help="runs side by side (default 2: one per core)")
    r.add_argument("--threads", type=int, default=1, help="torch threads per run (default 1)")
    r.add_argument("--out", default="runs/frontier", help="the runs' checkpoints (not committed)")
    r.add_argument("--branches", nargs="+", default=None, help="only these branch points (default: all)")
    r.add_argument("--exploratory", action="store_true",
                   help="no pre-registration: the ledger goes under --out, records say so")
    args = ap.parse_args(argv)
    command = "python -m brorl_lab.study.frontier " + shlex.join(sys.argv[1:] if argv is None else list(argv))
    if args.cmd in ("noise-stage", "run"):
        from brorl_lab.core.validation import UserError

        try:
            return (_cmd_noise_stage if args.cmd == "noise-stage" else _cmd_run)(args, command)
        except (UserError, ValueError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    torch.set_num_threads(1)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    commit, t0 = git_commit(), time.perf_counter()
    if args.cmd == "pilot":
        arms = {int(a.split("x")[0]): int(a.split("x")[1]) for a in args.arms}
        steps = refill_pilot(args.branches, arms, steps=args.steps, root=out / "runs", seed=args.seed)
        written = {"frontier_pilot_refill_steps.csv": steps, "frontier_pilot_refill.csv": cap_binding(steps)}
        note = "exploratory pilot, not pre-registered: sizes the frontier's budget and round cap (issue 43)"
    elif args.cmd == "continue":
        ev, slope = continue_plateau(steps=args.steps, eval_every=args.eval_every, seed=args.seed,
                                     root=out / "runs")
        written = {"frontier_pilot_plateau_continued.csv": ev,
                   "frontier_pilot_plateau_slope.csv": pd.DataFrame([{k: v for k, v in slope.items() if k != "config"}])}
        note = ("exploratory, not pre-registered: the learned plateau's own recipe continued (issue 43, item 7); "
                "recipe fields " + ", ".join(f"{k}={v}" for k, v in slope["config"].items()))
    else:
        reps, summary = noise_table(args.branches, args.ns, b_small=args.b_small, b_big=args.b_big,
                                    repeats=args.repeats, seed=args.seed)
        written = {"noise_scale_repeats.csv": reps, "noise_scale.csv": summary}
        note = "exploratory, not pre-registered: the simple noise scale at each branch point (issue 43, item 6)"
    wall = time.perf_counter() - t0
    command = "python -m brorl_lab.study.frontier " + shlex.join(sys.argv[1:] if argv is None else list(argv))
    cks = {b: resolve_experiment_model(BRANCH_POINTS[b][0]) for b in getattr(args, "branches", ["learned"])}
    for d in [out] + ([Path(args.figures)] if args.figures else []):
        for name, t in written.items():
            t.to_csv(d / name, index=False)
            write_provenance(d / name, provenance(command, cks, wall, commit=commit, status="exploratory", note=note))
    print(list(written.values())[-1].to_string(index=False))
    return 0


def _cmd_noise_stage(args, command: str) -> int:
    """``noise-stage``: :func:`run_noise_stage`, then the summary of the points measured so far."""
    files = run_noise_stage(runs=args.runs, ship=not args.exploratory, branches=args.branches, command=command,
                            ledger=Path(args.runs) / "noise_ledger" if args.exploratory else None)
    print(noise_summary(pd.concat([pd.read_csv(f) for f in files], ignore_index=True))
          [["where", "N", "q", "b_simple", "lo", "hi"]].to_string(index=False))
    return 0


def _cmd_run(args, command: str) -> int:
    """``run <stage>``: :func:`run_stage` through the study runner; exit 130 when stopped before the end."""
    grid = run_stage(args.stage, out=args.out, ledger=Path(args.out) / "ledger" if args.exploratory else None,
                     ship=not args.exploratory, jobs=args.jobs, threads=args.threads, command=command,
                     branches=args.branches)
    print(f"{args.stage}: {'finished' if grid.finished else 'stopped: run the same command again to resume'}; "
          f"{grid.metrics['run'].nunique() if len(grid.metrics) else 0} arm x seed runs in {grid.ledger}")
    if args.stage in PILOT_STAGES and (grid.ledger / "lr_picks.csv").is_file() and grid.finished:
        print(pd.read_csv(grid.ledger / "lr_picks.csv")[["branch", "arm", "lr", "value", "sqrt_rule_lr"]]
              .to_string(index=False))
    return 0 if grid.finished else 130


if __name__ == "__main__":  # run as the package's module, so every dotted name it records is brorl_lab.study.frontier
    from brorl_lab.study.frontier import main as _main

    raise SystemExit(_main())
