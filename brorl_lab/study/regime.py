"""The regime map: where does broadening pay? The same branch on settings whose branch-point rho runs from ~1 to
past the update ratio, the BroRL - ProRL gap per seed, and a reading of the rho rule declared before the run.

**The rule under test** (the project's own, derived here, not the paper's). At equal samples the BroRL arm takes
``samples_ratio`` = 8 times fewer optimizer updates; under Adam each update has about the same size whatever its
batch, so what BroRL gains is the quality of each update. If that quality is the share of samples that carry a
signal, broadening pays where

    rho = E[s_512(p)] / E[s_16(p)]  >=  8 = :data:`RHO_RULE`,     s_N(p) = 1 - p^N - (1 - p)^N   (:mod:`.rare`)

(the mean over the setting's training prompts of the chance that a group is informative). Two x-axes read it:

- **branch-point rho** (``rho``): from the per-prompt p measured at the branch point, 512 draws per prompt
  (:func:`branch_point_row`), on a *fresh* re-draw of the prompts for the constructed settings (the draws that
  chose a prompt for a band would bias its p toward the band);
- **in-run rho** (``rho_run``): the ratio of the arms' measured dynamic-sampling pass rates (kept / generated
  groups, mean over steps and seeds), BroRL over ProRL: what the arms actually learned from as p moved.

**Settings** (notebook 06): named settings from branch points (a family at a checkpoint: the products_2d floor
``"floor"``, the takeoff base ``"takeoff"``, ...) and *constructed* settings: a family's training prompts filtered
at the branch point by their measured p into one of the bands :data:`P_BANDS` (:func:`draw_pool`), written as a
``pool:`` task (:func:`write_pool`; training draws only pool prompts, each scored by its own family), with its
held-out set drawn the same way: held-out prompts of the family filtered by the same band, measured the same way.

**Per seed** (:func:`per_seed_rows`): each arm's held-out mean pass@1 at step 0 (the branch point, same eval draws)
and at the last shared sample count, the paired gap, each arm's dynamic-sampling pass rate and its dropped groups
by kind (all-correct vs all-wrong, :func:`drift_table`: which way the N = 16 arm drifts), and the collapse rule
(:data:`brorl_lab.study.compare.COLLAPSE`, the flagship's, applied the same way: a collapsed seed stays in every
table and is named). :func:`setting_table` recomputes every setting's interval from the per-seed rows, and
:func:`power_table` sizes the seeds from the per-setting sd (:func:`brorl_lab.lab.stats.seeds_for_power`).

**The reading, fixed before the run** (:func:`broadening_pays`, :data:`BROADENING_RULE`), on each axis:

- *refuted* when some setting at or above the rule's rho has a gap interval whose upper end is below
  :data:`PAYS_MIN` (the run rules out that broadening pays there), or when a fit resolves the gap *falling* as rho
  grows;
- *supported* when there is a setting at or above the rule's rho, every such setting has its gap interval above 0,
  and every fit (unweighted and weighted by 1 / s.e.^2, with all settings and without each one) resolves the gap
  rising with log2 rho;
- *unresolved* otherwise (and "not tested" when no setting reaches the rule's rho).

The crossover rho* (where the fitted gap is 0) is reported only when every one of those fits resolves it: the
slope's interval excludes 0 and the crossover's interval lies inside the fitted settings' range.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np
import pandas as pd

from brorl_lab.lab.stats import seeds_for_power, t_interval, t_quantile
from brorl_lab.study.arms import SAMPLES_RATIO
from brorl_lab.study.compare import COLLAPSE, collapse_flags
from brorl_lab.study.rare import DRAWS, ONLY_LARGE, RARE_SUCCESS_MAX_P, informative_share, rare_failure, rare_success
from brorl_lab.study.recipe import ARM_TABLE, FLAGSHIP_RECIPE

METRIC = "eval/mean/pass@1"
#: The map's two arms: the recipe's table (each arm's N = rollouts_per_prompt and prompts_per_step).
REGIME_ARMS = {arm: dict(ARM_TABLE[arm]) for arm in ("prorl", "brorl")}
RHO_RULE = float(SAMPLES_RATIO)  # the update ratio at equal samples: BroRL's samples per step over ProRL's (8)
PAYS_MIN = 0.01  # 1 point of held-out mean pass@1: the smallest gap that counts as "broadening pays"
VERDICTS = ("supported", "refuted", "unresolved", "not tested")
_N = {arm: row["rollouts_per_prompt"] for arm, row in REGIME_ARMS.items()}
AXES = {"rho": f"branch-point rho = E[s_{_N['brorl']}] / E[s_{_N['prorl']}]",
        "rho_run": "in-run rho = measured DS pass rate, BroRL / ProRL"}
# The constructed settings' bands of the measured p at the branch point: a prompt is in (lo, hi] when
# lo < p <= hi and p < 1 (a prompt solved in every draw gives no arm a signal). Branch-point rho of a band's prompts
# runs from ~1 (p > 1/4: s_16 and s_512 both near 1) to past 8 (p <= 1/64: s_16 ~ 16p, s_512 ~ 1 - e^(-512p)).
P_BANDS = {"(0,1/64]": (0.0, 1 / 64), "(1/64,1/16]": (1 / 64, RARE_SUCCESS_MAX_P),
           "(1/16,1/4]": (RARE_SUCCESS_MAX_P, 1 / 4), "(1/4,1)": (1 / 4, 1.0)}
BROADENING_RULE = (
    f"Broadening pays above rho* = {RHO_RULE:g} (on each axis: branch-point rho and in-run rho). Refuted iff a "
    f"setting with rho >= {RHO_RULE:g} has a 95% gap interval (BroRL - ProRL, held-out mean pass@1 at equal samples, "
    f"paired seeds) entirely below +{100 * PAYS_MIN:g} point, or a fit resolves the gap falling with log2 rho. "
    f"Supported iff at least one setting has rho >= {RHO_RULE:g}, every such setting's interval lies above 0, and "
    "every fit (unweighted and 1/se^2-weighted, all settings and leaving each one out) resolves the gap rising with "
    "log2 rho. Unresolved otherwise. The crossover rho* is reported only when every fit resolves it.")


def branch_point_row(rates: pd.DataFrame, *, arm_table: Mapping = REGIME_ARMS) -> dict:
    """What the branch point predicts for one setting, from its :func:`prompt_pass_rates` table: prompts, the
    share of rare-success and rare-failure prompts (:mod:`brorl_lab.study.rare`), the :data:`ONLY_LARGE` share,
    E[s_N] at the ProRL and the BroRL arm's N (``arm_table``; columns ``E_s<N>``) and their ratio rho."""
    p = rates["p"].to_numpy(float)
    n_pro, n_bro = (arm_table[a]["rollouts_per_prompt"] for a in ("prorl", "brorl"))
    small, large = informative_share(p, n_pro), informative_share(p, n_bro)
    return {"prompts": int(p.size), "mean_p": float(p.mean()), "rare_success": float(rare_success(p).mean()),
            "rare_failure": float(rare_failure(p).mean()),
            "only_large": float((rates["reach"] == ONLY_LARGE).mean()),
            f"E_s{n_pro}": small, f"E_s{n_bro}": large, "rho": large / small if small > 0 else float("inf")}


# ---- constructed settings: prompts filtered by their measured p -----------------------------------------------------
def check_band(band) -> tuple[float, float]:
    """A band name of :data:`P_BANDS` or a pair (lo, hi) with 0 <= lo < hi <= 1, as (lo, hi)."""
    if isinstance(band, str) and band in P_BANDS:
        return P_BANDS[band]
    ok = isinstance(band, (list, tuple)) and len(band) == 2 and all(isinstance(v, (int, float)) for v in band)
    if not ok or not 0 <= band[0] < band[1] <= 1:
        raise ValueError(f"band: got {band!r}; allowed: one of {', '.join(P_BANDS)} or [lo, hi] with "
                         "0 <= lo < hi <= 1 (prompts with lo < p <= hi and p < 1)")
    return float(band[0]), float(band[1])


SETTING_KEYS = ("tasks", "task_configs", "model", "band", "candidates", "eval_candidates")


def check_setting(name: str, setting) -> dict:
    """One regime-map setting (notebook 06's ``settings[name]``): ``tasks`` (a list of task names) and optionally
    ``task_configs``, ``model`` (its branch point), ``band`` (a constructed pool, :func:`check_band`) and, for a
    band, ``candidates`` / ``eval_candidates`` (training / held-out prompts measured, integers >= 1)."""
    if not isinstance(setting, Mapping) or not isinstance(setting.get("tasks"), list) or not setting["tasks"]:
        raise ValueError(f"settings[{name!r}]: got {setting!r}; allowed: a dict with 'tasks' (a non-empty list) and "
                         f"optionally {', '.join(SETTING_KEYS[1:])}")
    bad = [k for k in setting if k not in SETTING_KEYS]
    if bad:
        raise ValueError(f"settings[{name!r}]: unknown key {bad[0]!r}; allowed: {', '.join(SETTING_KEYS)}")
    if "band" in setting:
        check_band(setting["band"])
    for key in ("candidates", "eval_candidates"):
        v = setting.get(key, 1)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1 or (key in setting and "band" not in setting):
            raise ValueError(f"settings[{name!r}][{key!r}]: got {v!r}; allowed: an integer >= 1, with a band")
    return dict(setting)


def in_band(p: Sequence[float], band) -> np.ndarray:
    """Per prompt: lo < p <= hi and p < 1 (a bool array shaped like ``p``)."""
    lo, hi = check_band(band)
    p = np.asarray(p, dtype=float)
    return (p > lo) & (p <= hi) & (p < 1)


def draw_pool(policy, tokenizer, cfg, band, *, candidates: int, draws: int = DRAWS, seed: int = 0,
              split: str = "train", rollouts_per_prompt: int = _N["prorl"]):
    """``candidates`` prompts of ``cfg.tasks`` (``split``), each drawn ``draws`` times at the branch point
    (:func:`brorl_lab.study.mechanism.prompt_pass_rates`), kept when their measured p is in ``band``. Returns
    (kept items, the rates of every candidate with an ``in_band`` column)."""
    from brorl_lab.rl.steps import sample_prompts
    from brorl_lab.study.mechanism import prompt_pass_rates

    items = sample_prompts(cfg.tasks, candidates, seed=seed, split=split)
    rates = prompt_pass_rates(policy, tokenizer, items, cfg, draws=draws, rollouts_per_prompt=rollouts_per_prompt,
                              seed=seed)
    keep = in_band(rates["p"], band)
    return [it for it, k in zip(items, keep) if k], rates.assign(in_band=keep)


def write_pool(directory: str | Path, name: str, train, held, record: Mapping) -> str:
    """Write a constructed setting's pool: ``<name>.jsonl`` (training prompts), ``<name>.eval.jsonl`` (held-out
    prompts) and ``<name>.pool.json`` (``record``: how both were drawn). Returns the task name ``pool:<path>``."""
    from brorl_lab.rollout.tasks.sets import write_items
    from brorl_lab.rollout.tasks.user import pool_eval_path

    if not train or not held:
        raise ValueError(f"pool {name!r}: {len(train)} training and {len(held)} held-out prompts in the band; "
                         "allowed: at least one of each (draw more candidates, or widen the band)")
    path = Path(directory).resolve() / f"{name}.jsonl"
    write_items(train, path)
    write_items(held, pool_eval_path(path))
    path.with_name(f"{name}.pool.json").write_text(json.dumps({**record, "train_prompts": len(train),
                                                                "eval_prompts": len(held)}, indent=1))
    return f"pool:{path}"


def pool_items(task: str) -> list:
    """The training prompts of a ``pool:`` task (:func:`write_pool`), in file order."""
    from brorl_lab.rollout.tasks import TASKS

    if not isinstance(task, str) or not task.startswith("pool:"):
        raise ValueError(f"task: got {task!r}; allowed: a pool:<path> task name (write_pool)")
    return list(TASKS.build(task, {}).items)


# ---- per seed, per setting -----------------------------------------------------------------------------------------
def per_seed_rows(df: pd.DataFrame, setting: str, *, x: str = "cum_nominal_samples") -> pd.DataFrame:
    """One row per paired seed of one setting's arms (the long table of
    :func:`brorl_lab.study.arms.run_rollout_scaling`): held-out mean pass@1 of each arm at step 0 (``prorl_0``,
    ``brorl_0``) and at the last budget of the shared grid both reached (``prorl``, ``brorl``), the gap; per arm
    the samples it had generated by then (``generated_prorl``, ...: dynamic sampling's re-draws included, so an arm
    that drops more groups pays more for the same budget), its training wall time (``wall_prorl``, ...), its mean
    DS pass rate over its steps (``ds_prorl``, ``ds_brorl``), the share of its generated groups dropped as
    all-correct and all-wrong (``all_correct_prorl``, ...), the collapse rule's flag and reason; and ProRL at
    BroRL's optimizer updates (``prorl_at_updates``, its generated samples there, ``gap_updates``)."""
    from brorl_lab.study.revival import grid_values

    budget = max(grid_values(df, x))
    updates = max(grid_values(df, "cum_nominal_updates")) if "cum_nominal_updates" in df else np.nan
    flags = collapse_flags(df).set_index(["arm", "seed"])
    rows = []
    for seed in sorted(set(df.loc[df["arm"] == "prorl", "seed"]) & set(df.loc[df["arm"] == "brorl", "seed"])):
        row = {"setting": setting, "seed": int(seed), "budget": budget}
        evals = {}
        for arm in ("prorl", "brorl"):
            g = df[(df["arm"] == arm) & (df["seed"] == seed)]
            ev = evals[arm] = g[g[METRIC].notna()]
            start, end = ev[ev[x] == 0], ev[ev[x] == budget]
            if start.empty or end.empty:
                raise ValueError(f"df: the {arm} arm of seed {seed} ({setting}) has no {METRIC} at {x} = 0 or "
                                 f"{budget:g}; allowed: arms of one arm_configs plan, evaluated at step 0")
            end = end.iloc[0]
            steps = g[g["step"] > 0]
            gen = steps["ds_generated_groups"].sum() if "ds_generated_groups" in g else np.nan
            row.update({f"{arm}_0": float(start[METRIC].iloc[0]), arm: float(end[METRIC]),
                        f"generated_{arm}": float(end["cum_samples"]),
                        f"wall_{arm}": float(end["cum_wall_s"]) if "cum_wall_s" in ev else np.nan,
                        f"ds_{arm}": float(steps["ds_pass_rate"].mean()),
                        f"all_correct_{arm}": float(steps["ds_all_correct_groups"].sum() / gen) if gen else np.nan,
                        f"all_wrong_{arm}": float(steps["ds_all_wrong_groups"].sum() / gen) if gen else np.nan,
                        f"collapsed_{arm}": bool(flags.loc[(arm, seed), "collapsed"]),
                        f"collapse_reason_{arm}": flags.loc[(arm, seed), "reason"]})
        row["gap"] = row["brorl"] - row["prorl"]
        # ProRL where it had taken BroRL's updates (8x fewer samples): with the budget's ProRL point, it brackets
        # ProRL at BroRL's generated samples, which lie between the two (the arms' grid evaluates no point there)
        ev = evals["prorl"]
        at = ev[ev["cum_nominal_updates"] == updates] if "cum_nominal_updates" in ev else ev.iloc[:0]
        row["prorl_at_updates"] = float(at[METRIC].iloc[0]) if len(at) else np.nan
        row["generated_prorl_at_updates"] = float(at["cum_samples"].iloc[0]) if len(at) else np.nan
        row["gap_updates"] = row["brorl"] - row["prorl_at_updates"]
        rows.append(row)
    return pd.DataFrame(rows)


def drift_table(df: pd.DataFrame, setting: str, *, parts: int = 2) -> pd.DataFrame:
    """Which way each arm's dropped groups drift over training: its steps cut into ``parts`` equal spans of its own
    training (first half, second half), and per span the share of generated groups dropped all-correct and
    all-wrong (summed over seeds) and the DS pass rate. One row per (setting, arm, part)."""
    rows = []
    for arm, g in df[df["step"] > 0].groupby("arm", sort=False):
        if "ds_generated_groups" not in g or not g["ds_generated_groups"].notna().any():
            continue
        part = np.minimum((parts * (g["step"] - 1) // g["step"].max()).astype(int), parts - 1)
        for k, h in g.groupby(part):
            gen = float(h["ds_generated_groups"].sum())
            rows.append({"setting": setting, "arm": arm, "part": int(k) + 1, "parts": parts,
                         "steps": f"{int(h['step'].min())}-{int(h['step'].max())}", "generated_groups": gen,
                         "all_correct": float(h["ds_all_correct_groups"].sum()) / gen if gen else np.nan,
                         "all_wrong": float(h["ds_all_wrong_groups"].sum()) / gen if gen else np.nan,
                         "ds_pass_rate": float(h["ds_pass_rate"].mean())})
    return pd.DataFrame(rows)


def setting_table(per_seed: pd.DataFrame, branch: Optional[pd.DataFrame] = None) -> pd.DataFrame:
    """One row per setting from the per-seed rows (:func:`per_seed_rows`): the gap's mean with its 95% t interval
    over the paired seeds (n, sd, se, lo, hi), each arm's mean at step 0 and at the budget, the mean DS pass rates
    and the in-run rho = ds_brorl / ds_prorl, BroRL's generated samples over ProRL's at the budget
    (``generated_ratio``, mean over seeds) and its training wall time over ProRL's (``wall_ratio``), the collapsed
    seeds per arm, and the branch point's columns
    (``branch``: one :func:`branch_point_row` per setting, indexed by setting) when given."""
    rows = {}
    for name, g in per_seed.groupby("setting", sort=False):
        ci = t_interval(g["gap"].to_numpy(float))
        ds_p, ds_b = float(g["ds_prorl"].mean()), float(g["ds_brorl"].mean())
        rows[name] = {"n": ci["n"], "gap": ci["mean"], "sd": ci["sd"], "se": ci["se"], "lo": ci["lo"],
                      "hi": ci["hi"], "budget": float(g["budget"].iloc[0]),
                      **{c: float(g[c].mean()) for c in ("prorl_0", "brorl_0", "prorl", "brorl")},
                      "ds_prorl": ds_p, "ds_brorl": ds_b, "rho_run": ds_b / ds_p if ds_p > 0 else np.inf,
                      # generated samples BroRL / ProRL at the budget: < 1 means the nominal basis favoured ProRL
                      "generated_ratio": float((g["generated_brorl"] / g["generated_prorl"]).mean()),
                      "wall_ratio": float((g["wall_brorl"] / g["wall_prorl"]).mean()) if "wall_prorl" in g else np.nan,
                      **_gap_at_updates(g),
                      **{c: float(g[c].mean()) for c in ("all_correct_prorl", "all_wrong_prorl",
                                                          "all_correct_brorl", "all_wrong_brorl") if c in g},
                      "collapsed_prorl": int(g["collapsed_prorl"].sum()),
                      "collapsed_brorl": int(g["collapsed_brorl"].sum())}
    table = pd.DataFrame.from_dict(rows, orient="index")
    table.index.name = "setting"
    if branch is not None:
        table = branch.join(table, how="right")
    return table.sort_values("rho") if "rho" in table else table


def _gap_at_updates(per_seed: pd.DataFrame) -> dict:
    """The gap at equal optimizer updates (BroRL's budget against ProRL where it had taken as many) with its 95% t
    interval, and BroRL's generated samples over ProRL's there; empty for rows without it."""
    if "gap_updates" not in per_seed or per_seed["gap_updates"].isna().all():
        return {}
    ci = t_interval(per_seed["gap_updates"].to_numpy(float))
    return {"gap_updates": ci["mean"], "lo_updates": ci["lo"], "hi_updates": ci["hi"],
            "prorl_at_updates": float(per_seed["prorl_at_updates"].mean()),
            "generated_ratio_updates": float((per_seed["generated_brorl"]
                                              / per_seed["generated_prorl_at_updates"]).mean())}


def power_table(table: pd.DataFrame, *, effect: float = PAYS_MIN, power: float = 0.8) -> pd.DataFrame:
    """Per setting: the paired seeds it ran, the sd of its per-seed gaps, the seeds that sd needs to detect a true
    gap of ``effect`` with probability ``power`` (:func:`brorl_lab.lab.stats.seeds_for_power`) and whether it has
    them (``enough``). A setting without a spread (fewer than 2 seeds) needs a pilot first (NaN)."""
    rows = []
    for name, r in table.iterrows():
        sd = float(r["sd"])
        try:
            need = seeds_for_power(sd, effect, power=power) if np.isfinite(sd) and sd > 0 else np.nan
        except ValueError:  # more than seeds_for_power's max_n: no feasible design at this sd
            need = np.inf
        rows.append({"setting": name, "seeds": int(r["n"]), "sd": sd, "effect": effect, "seeds_needed": need,
                     "enough": bool(np.isfinite(need) and r["n"] >= need)})
    return pd.DataFrame(rows).set_index("setting")


# ---- the reading -----------------------------------------------------------------------------------------------------
def fit_line(x: Sequence[float], y: Sequence[float], se: Optional[Sequence[float]] = None) -> dict:
    """gap = a + b x by least squares (weights 1 / se^2 when ``se`` is given; then the covariance is scaled by the
    residual variance when it exceeds the seeds' own), b's 95% t interval (points - 2 degrees of freedom), and the
    crossing x0 = -a / b with a delta-method interval. Keys: points, a, b, b_lo, b_hi, x0, x0_lo, x0_hi, resolved
    (b's interval excludes 0 and x0's interval lies inside the range of x)."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    w = np.ones_like(x) if se is None else 1 / np.asarray(se, float) ** 2
    nan = float("nan")
    out = {"points": int(x.size), "a": nan, "b": nan, "b_lo": nan, "b_hi": nan, "x0": nan, "x0_lo": nan,
           "x0_hi": nan, "resolved": False}
    if x.size < 3 or np.ptp(x) == 0:
        return out
    X = np.c_[np.ones_like(x), x]  # [settings, 2]
    cov = np.linalg.inv(X.T @ (w[:, None] * X))
    a, b = cov @ X.T @ (w * y)
    scale = float((w * (y - a - b * x) ** 2).sum() / (x.size - 2))
    cov = cov * (max(scale, 1.0) if se is not None else scale)
    q = t_quantile(0.975, x.size - 2)
    half = q * math.sqrt(cov[1, 1])
    out.update(a=float(a), b=float(b), b_lo=float(b - half), b_hi=float(b + half))
    if b != 0:
        x0 = -a / b
        grad = np.array([-1 / b, a / b ** 2])
        h0 = q * math.sqrt(float(grad @ cov @ grad))
        out.update(x0=float(x0), x0_lo=float(x0 - h0), x0_hi=float(x0 + h0))
    out["resolved"] = bool((out["b_lo"] > 0 or out["b_hi"] < 0) and np.isfinite(out["x0"])
                           and x.min() <= out["x0_lo"] and out["x0_hi"] <= x.max())
    return out


def all_fits(table: pd.DataFrame, axis: str = "rho") -> pd.DataFrame:
    """The gap against log2 of ``axis`` fitted unweighted and weighted (1 / se^2), with all settings and without
    each single setting (leave-one-out). One row per fit: fit ("all" or "without <setting>"), weights, the
    :func:`fit_line` keys, and the crossing as a rho (``rho0`` = 2^x0 with its interval)."""
    t = table[np.isfinite(table[axis]) & (table[axis] > 0) & np.isfinite(table["gap"])]
    subsets = {"all": t, **{f"without {s}": t.drop(index=s) for s in t.index}} if len(t) >= 4 else {"all": t}
    rows = []
    for name, sub in subsets.items():
        for weights in ("unweighted", "weighted"):
            ok = sub if weights == "unweighted" else sub[np.isfinite(sub["se"]) & (sub["se"] > 0)]
            f = fit_line(np.log2(ok[axis].to_numpy(float)), ok["gap"].to_numpy(float),
                         None if weights == "unweighted" else ok["se"].to_numpy(float))
            rows.append({"axis": axis, "fit": name, "weights": weights, **f,
                         **{f"rho0{s}": (2 ** f[f"x0{s}"] if np.isfinite(f[f"x0{s}"]) and abs(f[f"x0{s}"]) < 1000
                                         else np.nan) for s in ("", "_lo", "_hi")}})
    return pd.DataFrame(rows)


def broadening_pays(table: pd.DataFrame, axis: str = "rho", *, rule: float = RHO_RULE,
                    pays_min: float = PAYS_MIN) -> dict:
    """:data:`BROADENING_RULE` on one axis (``"rho"`` or ``"rho_run"``) of a :func:`setting_table`. Returns a
    JSON-able dict: rule, axis, verdict ("supported", "refuted", "unresolved", "not tested"), why (one line per
    reason), the settings at or above the rule's rho with their intervals, every fit (:func:`all_fits`) and the
    crossover rho* (None unless every fit resolves it)."""
    if axis not in AXES:
        raise ValueError(f"axis: got {axis!r}; allowed: {', '.join(AXES)}")
    need = {axis, "gap", "lo", "hi", "se"}
    if not isinstance(table, pd.DataFrame) or not need <= set(table.columns):
        raise ValueError(f"table: allowed: a setting_table with columns {sorted(need)}")
    above = table[table[axis] >= rule]
    fits = all_fits(table, axis)
    why = []
    ruled_out = above[above["hi"] < pays_min]
    for name, r in ruled_out.iterrows():
        why.append(f"{name} ({axis} {r[axis]:.2f}): gap {100 * r['gap']:+.1f} [{100 * r['lo']:+.1f}, "
                   f"{100 * r['hi']:+.1f}] points rules out a gain of {100 * pays_min:g} point")
    falling = fits[fits["b_hi"] < 0]
    if len(falling):
        why.append(f"{len(falling)} of {len(fits)} fits resolve the gap falling with log2 {axis}")
    rising = bool(len(fits)) and bool((fits["b_lo"] > 0).all())
    if len(ruled_out) or len(falling):
        verdict = "refuted"
    elif above.empty:
        verdict = "not tested"
        why.append(f"no setting reaches {axis} >= {rule:g} (highest {table[axis].max():.2f})")
    elif (above["lo"] > 0).all() and rising:
        verdict = "supported"
        why.append(f"all {len(above)} settings with {axis} >= {rule:g} have BroRL ahead, and all {len(fits)} fits "
                   "resolve the gap rising")
    else:
        verdict = "unresolved"
        behind = int((above["lo"] <= 0).sum())
        why.append(f"{behind} of {len(above)} settings with {axis} >= {rule:g} do not resolve BroRL ahead; "
                   f"{int((fits['b_lo'] > 0).sum())} of {len(fits)} fits resolve the gap rising")
    cross = None
    if len(fits) and fits["resolved"].all():
        main = fits[(fits["fit"] == "all") & (fits["weights"] == "weighted")].iloc[0]
        cross = {"rho0": float(main["rho0"]), "rho0_lo": float(main["rho0_lo"]), "rho0_hi": float(main["rho0_hi"]),
                 "range_over_fits": [float(fits["rho0"].min()), float(fits["rho0"].max())]}
    return {"rule": BROADENING_RULE, "axis": axis, "axis_label": AXES[axis], "rho_rule": rule, "pays_min": pays_min,
            "verdict": verdict, "why": why, "settings": int(len(table)),
            "above": {str(k): {axis: float(r[axis]), "gap": float(r["gap"]), "lo": float(r["lo"]),
                               "hi": float(r["hi"])} for k, r in above.iterrows()},
            "fits": fits.to_dict(orient="records"), "crossover": cross}


def regime_reading(table: pd.DataFrame) -> dict:
    """The map's ONE reading (named in its declaration, :meth:`RegimeMap.declaration`): :data:`BROADENING_RULE`
    (:func:`broadening_pays`) on each axis of :data:`AXES`, from a :func:`setting_table`. ``{axis: reading}``."""
    return {axis: broadening_pays(table, axis) for axis in AXES}


def reading_line(readings: Mapping[str, dict]) -> str:
    """The reading in one line: each axis's verdict."""
    return "; ".join(f"on {r['axis_label']}: {r['verdict'].upper()}" for r in readings.values())


def reading_of_files(folder: str | Path) -> dict:
    """The map's reading (:func:`regime_reading`) from the per-seed and branch-point files a run wrote in
    ``folder`` (regime_seeds.csv, regime_branch.csv: a run's folder or the shipped notebooks/figures): the one path
    by which the CLI (``regime-map --read``) and notebook 06 read a folder."""
    per_seed, branch, _ = read_outputs(Path(folder))
    return regime_reading(setting_table(per_seed, branch))


def regime_text(table: pd.DataFrame, readings: Mapping[str, dict], power: Optional[pd.DataFrame] = None,
                drift: Optional[pd.DataFrame] = None) -> str:
    """The map in plain words: per setting the gap with its interval and seeds (collapsed seeds named), both rho,
    the seeds its sd needs, which way each arm's dropped groups drift, and on each axis the reading's verdict with
    its reasons, the fits and the crossover (or why none is reported)."""
    lines = []
    for name, r in table.iterrows():
        coll = [f"{int(r[f'collapsed_{a}'])} {a} seed(s) collapsed" for a in ("prorl", "brorl")
                if r.get(f"collapsed_{a}", 0)]
        lines.append(f"{name}: rho {r.get('rho', np.nan):.2f} at the branch point, {r['rho_run']:.2f} in the run; gap "
                     f"BroRL - ProRL at equal samples {100 * r['gap']:+.1f} [{100 * r['lo']:+.1f}, "
                     f"{100 * r['hi']:+.1f}] points ({int(r['n'])} paired seeds; step 0: ProRL {r['prorl_0']:.3f}, "
                     f"BroRL {r['brorl_0']:.3f})" + (f"; {', '.join(coll)} (COLLAPSE {COLLAPSE})" if coll else ""))
    if power is not None:
        short = power[~power["enough"]]
        lines.append("Power (a true gap of 1 point at 80%): " + ("every setting has the seeds its sd needs." if
                     short.empty else "; ".join(
                         f"{s} needs {v['seeds_needed']:.0f} seeds (sd {100 * v['sd']:.2f} points), has {v['seeds']}"
                         if np.isfinite(v["seeds_needed"]) else
                         f"{s} needs more than 10,000 seeds (sd {100 * v['sd']:.2f} points), has {v['seeds']}"
                         if v["seeds_needed"] == np.inf else f"{s}: no spread over its {v['seeds']} seeds to size"
                         for s, v in short.iterrows())))
    if drift is not None and len(drift):
        for (name, arm), g in drift.groupby(["setting", "arm"], sort=False):
            first, last = g.iloc[0], g.iloc[-1]
            lines.append(f"{name} {arm}: dropped all-correct {first['all_correct']:.0%} -> {last['all_correct']:.0%}, "
                         f"all-wrong {first['all_wrong']:.0%} -> {last['all_wrong']:.0%} of generated groups "
                         f"(first -> last {last['parts']} of training)")
    for axis, rd in readings.items():
        lines.append(f"Reading on {rd['axis_label']}: {rd['verdict'].upper()}. " + " ".join(
            f"{w}." for w in rd["why"]))
        fits = pd.DataFrame(rd["fits"])
        if len(fits):
            res = int(fits["resolved"].sum())
            lines.append(f"  fits (gap on log2 {axis}; unweighted and weighted, all and leave-one-out): {res} of "
                         f"{len(fits)} resolve a crossover; slopes {100 * fits['b'].min():+.1f} to "
                         f"{100 * fits['b'].max():+.1f} points per doubling.")
        c = rd["crossover"]
        lines.append(f"  crossover: rho* = {c['rho0']:.2f} [{c['rho0_lo']:.2f}, {c['rho0_hi']:.2f}] (over fits "
                     f"{c['range_over_fits'][0]:.2f}-{c['range_over_fits'][1]:.2f})" if c else
                     "  crossover: not reported (not every fit resolves it)")
    return "\n".join(lines)


def markdown_table(table: pd.DataFrame) -> str:
    """The map as a results page shows it, one row per setting of a :func:`setting_table` (with its branch point's
    columns): both rho, the held-out mean pass@1 at step 0 and each arm's at the budget, the gap (points, 95% t
    interval) at equal nominal samples with BroRL's generated samples over ProRL's there, the same at equal
    optimizer updates, the paired seeds and the collapsed seeds per arm."""
    def gap(r, sfx=""):
        return f"{100 * r['gap' + sfx]:+.2f} [{100 * r['lo' + sfx]:+.2f}, {100 * r['hi' + sfx]:+.2f}]"

    rows = ["| setting | branch point | rho (branch point) | rho (in run) | step 0 | ProRL | BroRL | gap at equal "
            "samples | generated B/P | gap at equal updates | generated B/P | seeds | collapsed P, B |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, r in table.iterrows():
        rows.append(f"| {name} | {r['model']} | {r['rho']:.2f} | {r['rho_run']:.2f} | {r['prorl_0']:.3f} | "
                    f"{r['prorl']:.3f} | {r['brorl']:.3f} | {gap(r)} | {r['generated_ratio']:.2f} | "
                    f"{gap(r, '_updates')} | {r['generated_ratio_updates']:.2f} | {int(r['n'])} | "
                    f"{int(r['collapsed_prorl'])}, {int(r['collapsed_brorl'])} |")
    return "\n".join(rows)


# ---- outputs ---------------------------------------------------------------------------------------------------------
OUTPUT_FILES = {"per_seed": "regime_seeds.csv", "branch": "regime_branch.csv", "drift": "regime_drift.csv",
                "table": "regime_map.csv", "power": "regime_power.csv", "reading": "regime.json",
                "text": "regime.txt"}


def write_outputs(out: Path, per_seed: pd.DataFrame, branch: pd.DataFrame, drift: Optional[pd.DataFrame] = None,
                  *, export_png: bool = True) -> dict:
    """Every output of the map from its per-seed rows and the branch points (one :func:`branch_point_row` per
    setting, indexed by setting, with how its prompts were drawn): regime_seeds.csv (per seed), regime_branch.csv,
    regime_drift.csv, regime_map.csv (:func:`setting_table`, recomputed from the per-seed rows), regime_power.csv,
    regime.json (both axes' :func:`broadening_pays`), regime.txt and regime_map.png (needs Chromium; skipped with a
    note). Returns {"table", "readings", "power", "text", "figure", "png_note"}."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    drift = drift if drift is not None else pd.DataFrame()
    per_seed.to_csv(out / OUTPUT_FILES["per_seed"], index=False)
    branch.to_csv(out / OUTPUT_FILES["branch"])
    drift.to_csv(out / OUTPUT_FILES["drift"], index=False)
    table = setting_table(per_seed, branch)
    table.to_csv(out / OUTPUT_FILES["table"])
    power = power_table(table)
    power.to_csv(out / OUTPUT_FILES["power"])
    readings = regime_reading(table)
    (out / OUTPUT_FILES["reading"]).write_text(json.dumps(readings, indent=1, default=float))
    text = regime_text(table, readings, power, drift)
    (out / OUTPUT_FILES["text"]).write_text(text + "\n")
    fig, note = regime_figure(table, per_seed), None
    if export_png:
        try:
            fig.write_image(out / "regime_map.png", width=1100)
        except Exception as e:  # noqa: BLE001 - no Chromium / kaleido: the figure stays inline
            note = f"PNG export skipped ({type(e).__name__})"
    return {"table": table, "readings": readings, "power": power, "text": text, "figure": fig, "png_note": note}


def read_outputs(out: Path) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(per_seed, branch, drift) as a run (:func:`run_regime_map`) wrote them into ``out``: what
    :func:`write_outputs` needs to redo the map."""
    from brorl_lab.core.validation import UserError

    paths = {k: Path(out) / OUTPUT_FILES[k] for k in ("per_seed", "branch", "drift")}
    for p in paths.values():
        if not p.is_file():
            raise UserError(f"out: {p} does not exist; allowed: a folder `python -m brorl_lab regime-map` wrote "
                            "(or the shipped notebooks/figures)")
    drift = pd.read_csv(paths["drift"]) if paths["drift"].stat().st_size > 1 else pd.DataFrame()
    return pd.read_csv(paths["per_seed"]), pd.read_csv(paths["branch"], index_col=0), drift


def regime_figure(table: pd.DataFrame, per_seed: Optional[pd.DataFrame] = None, *, title: Optional[str] = None):
    """The gap (points, 95% t interval over paired seeds) against each axis on a log scale: branch-point rho
    (left) and in-run rho (right), one colour per setting (named in the legend), each paired seed's gap as a dot of
    its colour beside it (``per_seed``, spread a little to the right so they do not hide each other), the rule's
    rho as a dotted line."""
    import plotly.graph_objects as go
    from plotly.colors import qualitative
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=2, subplot_titles=list(AXES.values()), shared_yaxes=True)
    colours = qualitative.Dark24
    for j, axis in enumerate(AXES, start=1):
        if axis not in table:
            continue
        for k, (name, r) in enumerate(table.iterrows()):
            colour = colours[k % len(colours)]
            if per_seed is not None and len(per_seed):
                g = per_seed[per_seed["setting"] == name]
                jitter = 1.05 + 0.03 * (np.arange(len(g)) % 4)  # to the interval's right, multiplicative on log x
                fig.add_trace(go.Scatter(x=r[axis] * jitter, y=100 * g["gap"], mode="markers", legendgroup=name,
                                         showlegend=False, marker=dict(color=colour, size=4, opacity=0.45),
                                         hovertext=[f"{name}, seed {s}" for s in g["seed"]]), row=1, col=j)
            fig.add_trace(go.Scatter(x=[r[axis]], y=[100 * r["gap"]], mode="markers", name=str(name),
                                     legendgroup=name, showlegend=j == 1, marker=dict(color=colour, size=9),
                                     error_y=dict(type="data", symmetric=False, array=[100 * (r["hi"] - r["gap"])],
                                                  arrayminus=[100 * (r["gap"] - r["lo"])])), row=1, col=j)
        fig.add_vline(x=RHO_RULE, line_dash="dot", row=1, col=j)
        fig.add_hline(y=0, line_color="black", line_width=1, row=1, col=j)
        fig.update_xaxes(type="log", title_text=f"{axis} (dotted: the rule's {RHO_RULE:g})", row=1, col=j)
    fig.update_yaxes(title_text="BroRL - ProRL (points of mean pass@1)", row=1, col=1)
    fig.update_layout(title_text=title or "The regime map: where broadening pays (a dot per paired seed)",
                      height=520, legend=dict(orientation="h", y=-0.2, font=dict(size=10)),
                      margin=dict(t=80, b=40, l=60, r=20))
    return fig


# ---- the study as data, and its one run (on the runner's machinery) ----------------------------------------------------
#: The shipped map's settings (docs/results/regime_map.md): named settings (a family at a branch point) and
#: constructed pools (a band of p at the branch point). The learned plateau and the takeoff base enter as named
#: settings; the default branch point stays the products_2d floor (notebook 06's first cell says why).
SETTINGS = {
    "gcd": {"tasks": ["gcd"]},
    "chain_sum": {"tasks": ["chain_sum"]},
    "simple_equations": {"tasks": ["simple_equations"]},
    "spell_backward": {"tasks": ["spell_backward"]},
    "products": {"tasks": ["products"]},
    "products_2d": {"tasks": ["products_2d"]},
    "spell_backward@takeoff": {"tasks": ["spell_backward"], "model": "takeoff"},
    "gcd (1/4,1)": {"tasks": ["gcd"], "band": "(1/4,1)"},
    "gcd@takeoff (1/16,1/4]": {"tasks": ["gcd"], "model": "takeoff", "band": "(1/16,1/4]"},
    "gcd@takeoff (1/64,1/16]": {"tasks": ["gcd"], "model": "takeoff", "band": "(1/64,1/16]"},
    "products_2d (0,1/64]": {"tasks": ["products_2d"], "band": "(0,1/64]"},
    "spell_backward@takeoff (0,1/64]": {"tasks": ["spell_backward"], "model": "takeoff", "band": "(0,1/64]"},
    "spell_backward+gcd@learned": {"tasks": ["spell_backward", "gcd"], "model": "learned"},
}
POOL_SEEDS = {"train": 12345, "eval": 54321, "redraw": 1}  # a pool's candidates, its held-out set, its re-draw


@dataclass(frozen=True)
class RegimeMap:
    """The regime map as data (module docstring): ``settings`` (name -> :func:`check_setting`), the default branch
    point ``model``, the arms (``arm_table``: each arm's ``rollouts_per_prompt`` and ``prompts_per_step``, default
    the recipe's), the branch's budget (``steps`` BroRL-arm steps, a shared-grid point every ``eval_every``),
    ``seeds`` (paired), the evaluation, and how each branch point is measured: ``reach_prompts`` training prompts
    of a named setting x ``draws`` samples; a constructed pool's ``pool_candidates`` training and
    ``eval_candidates`` held-out prompts filtered by its band. ``full_size`` marks the design meant for shipped
    results (pre-registration enforced). Its one reading is :func:`regime_reading`."""

    settings: Mapping = field(default_factory=lambda: dict(SETTINGS))
    model: str = "floor"
    recipe: str = FLAGSHIP_RECIPE
    steps: int = 4
    eval_every: int = 4
    seeds: tuple = tuple(range(8))
    arm_table: Mapping = field(default_factory=lambda: {a: dict(r) for a, r in REGIME_ARMS.items()})
    optimizer_steps_per_step: int = 2
    lr: float = 3e-4
    eval_prompts: int = 64
    eval_samples: int = 16  # not an N: samples per eval prompt
    reach_prompts: int = 64
    draws: int = DRAWS
    pool_candidates: int = 512  # not an N: training prompts measured for a pool
    eval_candidates: int = 256
    full_size: bool = False
    name: str = "regime_map"

    def __post_init__(self):
        from brorl_lab.core.validation import UserError, check_seeds

        object.__setattr__(self, "seeds", tuple(check_seeds(list(self.seeds))))
        if not isinstance(self.settings, Mapping) or not self.settings:
            raise UserError(f"settings: got {self.settings!r}; allowed: a dict name -> setting (study.regime.SETTINGS)")
        try:
            for name, setting in self.settings.items():
                check_setting(name, setting)
        except ValueError as e:
            raise UserError(str(e)) from None

    def config(self, name: str, *, tasks: Optional[list] = None, threads: Optional[int] = None):
        """Setting ``name``'s base Config: the recipe at its branch point, the map's budget and evaluation; ``tasks``
        replaces its tasks (a pool's ``pool:`` task)."""
        from brorl_lab.study.recipe import recipe_config

        s = self.settings[name]
        return recipe_config(self.recipe, model=s.get("model", self.model), tasks=tasks or s["tasks"],
                             task_configs={} if tasks else s.get("task_configs", {}), steps=self.steps,
                             eval_every=self.eval_every, checkpoint_every=self.eval_every, lr=self.lr,
                             reward="correct", optimizer_steps_per_step=self.optimizer_steps_per_step,
                             eval_prompts=self.eval_prompts, eval_samples=self.eval_samples, eval_k=[1],
                             **({"torch_threads": threads} if threads else {}))

    def declaration(self) -> dict:
        """The map as declared before its run (:func:`brorl_lab.study.results.write_declaration`): plain JSON."""
        return {"study": self.name, "branch_point": self.model, "recipe": self.recipe,
                "settings": {k: dict(v) for k, v in self.settings.items()},
                "arms": {a: dict(r) for a, r in self.arm_table.items()},
                "budget": {"brorl_steps": self.steps, "eval_every": self.eval_every,
                           "optimizer_steps_per_step": self.optimizer_steps_per_step, "lr": self.lr},
                "seeds": list(self.seeds), "evaluation": {"eval_prompts": self.eval_prompts,
                                                          "eval_samples": self.eval_samples, "metric": METRIC},
                "branch_points": {"reach_prompts": self.reach_prompts, "draws": self.draws,
                                  "pool_candidates": self.pool_candidates, "eval_candidates": self.eval_candidates,
                                  "seeds": POOL_SEEDS},
                "reading": {"function": f"{regime_reading.__module__}.{regime_reading.__qualname__}",
                            "rule": BROADENING_RULE, "thresholds": {"rho_rule": RHO_RULE, "pays_min": PAYS_MIN,
                                                                    "level": 0.95, "axes": list(AXES)}},
                "collapse_rule": dict(COLLAPSE), "full_size": self.full_size}


#: The shipped design (what ``python -m brorl_lab regime-map`` runs) and the tiny one the test suite runs.
PRESETS = {"full": RegimeMap(full_size=True),
           "quick": RegimeMap(settings={"gcd": {"tasks": ["gcd"]}, "chain_sum": {"tasks": ["chain_sum"]},
                                        "gcd (1/4,1)": {"tasks": ["gcd"], "band": "(1/4,1)"}},
                              steps=1, eval_every=1, seeds=(0, 1), optimizer_steps_per_step=1,
                              arm_table={"prorl": {"rollouts_per_prompt": 2, "prompts_per_step": 4},
                                         "brorl": {"rollouts_per_prompt": 8, "prompts_per_step": 2}},
                              eval_prompts=4, eval_samples=2, reach_prompts=4, pool_candidates=12, eval_candidates=12,
                              draws=16,  # not an N: the quick preset's samples per measured prompt
                              name="regime_map_quick")}


def preset(name: str = "full", **changes) -> RegimeMap:
    """The map ``name`` of :data:`PRESETS` ('full': the shipped design; 'quick': tiny) with ``changes`` (any
    :class:`RegimeMap` field). A changed full-size design is exploratory (``full_size=False``) unless
    ``full_size`` is among the changes."""
    import dataclasses

    from brorl_lab.core.validation import UserError

    if name not in PRESETS:
        raise UserError(f"preset: got {name!r}; allowed: {', '.join(PRESETS)}")
    fields = [f.name for f in dataclasses.fields(RegimeMap)]
    bad = sorted(set(changes) - set(fields))
    if bad:
        raise UserError(f"{bad[0]}: not a setting of the regime map; allowed: {', '.join(fields)}")
    if changes and "full_size" not in changes:
        changes["full_size"] = False
    if "seeds" in changes:
        changes["seeds"] = tuple(changes["seeds"])
    return dataclasses.replace(PRESETS[name], **changes)


def slug(name: str) -> str:
    """A setting's name as a file name: "gcd (1/4,1)" -> "gcd_1_4_1"."""
    import re

    return re.sub(r"[^A-Za-z0-9_.@-]+", "_", name).strip("_")


def branch_points(study: RegimeMap, out: Path, *, progress: bool = True) -> tuple[pd.DataFrame, dict]:
    """Every setting's branch point measured into ``out`` (read back when there): a constructed setting's pool
    (``out/pools/<slug>.jsonl`` + its held-out set and ``.pool.json``: :func:`draw_pool`, :func:`write_pool`) and
    per-prompt pass rates (``out/branch/<slug>.csv``; a pool re-drawn with fresh samples, seed
    ``POOL_SEEDS['redraw']``: the draws that chose a prompt would bias its p toward the band). Returns (the
    :func:`branch_point_row` of each setting, indexed by setting; {setting: its base Config})."""
    from brorl_lab.core.models import load_policy
    from brorl_lab.rl.steps import sample_prompts
    from brorl_lab.study.mechanism import prompt_pass_rates

    policies: dict = {}

    def policy_of(cfg):
        if cfg.model not in policies:
            policies[cfg.model] = load_policy(cfg.model)
        return policies[cfg.model]

    n_pro = study.arm_table["prorl"]["rollouts_per_prompt"]
    bases, rows = {}, {}
    for name, s in study.settings.items():
        cfg, m = study.config(name), s.get("model", study.model)
        rates_path = out / "branch" / f"{slug(name)}.csv"
        record = {"setting": name, "model": m, "tasks": s["tasks"], "band": s.get("band"), "draws": study.draws}
        if "band" in s:
            pool = out / "pools" / f"{slug(name)}.pool.json"
            cands = s.get("candidates", study.pool_candidates)
            eval_cands = s.get("eval_candidates", study.eval_candidates)
            record.update(band_p=list(check_band(s["band"])), train_candidates=cands,
                          train_seed=POOL_SEEDS["train"], eval_candidates=eval_cands, eval_seed=POOL_SEEDS["eval"],
                          redraw_seed=POOL_SEEDS["redraw"])
            if not pool.is_file() or {k: v for k, v in json.loads(pool.read_text()).items() if k in record} != record:
                if progress:
                    print(f"{name}: drawing its pool ({cands} + {eval_cands} prompts x {study.draws} draws)", flush=True)
                train, _ = draw_pool(*policy_of(cfg), cfg, s["band"], candidates=cands, draws=study.draws,
                                     seed=POOL_SEEDS["train"], split="train", rollouts_per_prompt=n_pro)
                held, _ = draw_pool(*policy_of(cfg), cfg, s["band"], candidates=eval_cands, draws=study.draws,
                                    seed=POOL_SEEDS["eval"], split="eval", rollouts_per_prompt=n_pro)
                write_pool(out / "pools", slug(name), train, held[:study.eval_prompts], record)
                rates_path.unlink(missing_ok=True)
            task = f"pool:{(out / 'pools' / f'{slug(name)}.jsonl').resolve()}"
            cfg = study.config(name, tasks=[task])
        if not rates_path.is_file():
            if progress:
                print(f"{name}: measuring its branch point ({m}, {study.draws} draws per prompt)", flush=True)
            items = (pool_items(task) if "band" in s else
                     sample_prompts(cfg.tasks, study.reach_prompts, seed=POOL_SEEDS["train"]))
            rates = prompt_pass_rates(*policy_of(cfg), items, cfg, draws=study.draws, rollouts_per_prompt=n_pro,
                                      seed=POOL_SEEDS["redraw"] if "band" in s else 0)
            rates_path.parent.mkdir(parents=True, exist_ok=True)
            rates.to_csv(rates_path, index=False)
        rows[name] = {**branch_point_row(pd.read_csv(rates_path), arm_table=study.arm_table), "model": m,
                      "band": s.get("band") or "", "drawn": "pool re-drawn" if "band" in s else "named"}
        bases[name] = cfg
    branch = pd.DataFrame.from_dict(rows, orient="index")
    branch.index.name = "setting"
    return branch, bases


def run_regime_map(study: RegimeMap, out: str | Path, *, jobs: Optional[int] = 1, ray: Optional[str] = None,
                   threads: Optional[int] = None, progress: bool = True, ship: bool = False,
                   figures: Optional[str | Path] = None, export_png: bool = True, command: Optional[str] = None):
    """Run the map ``study`` into ``out`` on the runner's machinery (:mod:`brorl_lab.study.runner`), in order: the
    start (:func:`~brorl_lab.study.results.start_of_run`) and the declaration (``out/declaration.json``; enforced
    by :func:`~brorl_lab.study.results.require_preregistered` for ``study.full_size`` or ``ship``); every setting's
    branch point (:func:`branch_points`); both arms of every setting for every paired seed as one set of jobs
    (``out/arms/<slug>__<arm>_s<seed>``, resumable; ``jobs`` side by side or Ray tasks at ``ray``, ``threads``
    torch threads each) under the runner's :func:`~brorl_lab.study.runner.heartbeat`; the per-seed rows and every
    output (:func:`write_outputs`), each file with its provenance and verdict.json / verdict.txt
    (:func:`~brorl_lab.study.runner.write_study_files`); with ``figures`` (e.g. notebooks/figures) the shipped set
    (:data:`OUTPUT_FILES`) written there too, with the same provenance (:func:`~brorl_lab.study.results.publish`;
    the page's figure there is drawn by ``python -m brorl_lab render``, not copied). Returns a
    :class:`~brorl_lab.study.runner.StudyResult` whose
    ``reading`` is :func:`reading_line` of the one reading :func:`regime_reading`. An unfinished grid (Ctrl-C, a
    stop) returns ``finished=False``: the same call resumes."""
    import time

    from brorl_lab.core.console import live_bars
    from brorl_lab.lab.jobs import plan_workers
    from brorl_lab.study.arms import arm_configs, plan_arms, run_plans
    from brorl_lab.study.results import (
        declaration_record,
        provenance,
        publish,
        require_preregistered,
        start_of_run,
        write_declaration,
    )
    from brorl_lab.study.runner import StudyResult, heartbeat, write_study_files

    out = Path(out)
    start, t0 = start_of_run(), time.perf_counter()
    decl_path = write_declaration(out, study.declaration())
    declared = require_preregistered(decl_path) if (ship or study.full_size) else declaration_record(decl_path)
    jobs, threads = plan_workers(jobs, threads, ray)
    branch, bases = branch_points(study, out, progress=progress)
    plans = {name: plan_arms(arm_configs(base.replace(torch_threads=threads), study.arm_table), seeds=study.seeds,
                             root=out / "arms", prefix=f"{slug(name)}__") for name, base in bases.items()}
    runs = sum(len(p) for p in plans.values())
    with heartbeat(out / "arms", study.name, runs=runs, enabled=progress and not live_bars()):
        frames = run_plans(plans, jobs=jobs, ray=ray, threads=threads, progress=progress)
    reached = {(name, run): step for name, f in frames.items() if len(f)
               for run, step in f.groupby("run")["step"].max().items()}
    if any(reached.get((name, cfg.run_name)) != cfg.steps for name, plan in plans.items() for _, _, cfg in plan):
        return StudyResult(study, out, False, {}, "stopped before every arm finished: run the same command again "
                           "to resume", "not read: unfinished", [], {})
    per_seed = pd.concat([per_seed_rows(df, name) for name, df in frames.items()], ignore_index=True)
    drift = pd.concat([drift_table(df, name) for name, df in frames.items()], ignore_index=True)
    res = write_outputs(out, per_seed, branch, drift, export_png=export_png)
    files = [out / name for key, name in OUTPUT_FILES.items() if key != "text"]
    record = provenance(command or f"brorl_lab.study.regime.run_regime_map({study.name!r})",
                        {m: cfg.model for m, cfg in {s.get("model", study.model): bases[n] for n, s in
                                                     study.settings.items()}.items()},
                        time.perf_counter() - t0, commit=start["commit"], started_at=start["started_at"],
                        declaration=declared, seeds=list(study.seeds),
                        arms={a: f"{r['rollouts_per_prompt']} x {r['prompts_per_step']}"
                              for a, r in study.arm_table.items()})
    report = {"readings": res["readings"], "settings": list(study.settings)}
    written = write_study_files(out, files, record, report, res["text"])
    if figures is not None:
        written += publish(out, figures, {name: name for name in OUTPUT_FILES.values()}, record)
    return StudyResult(study, out, True, report, res["text"], reading_line(res["readings"]), written, record)
