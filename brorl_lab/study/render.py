"""Results pages rendered from the shipped per-seed files (issue 42): ``python -m brorl_lab render``.

Every docs/results page, every figure those pages show and the README's headline block (between ``<!-- headline -->``
and ``<!-- /headline -->``) are built here from the results files under ``notebooks/figures/`` and ``data/``::

    pages = render()                    # {repo path: bytes}: each page, figure and the README, as rendered
    differences(pages)                  # [] when every shipped file equals its render; else "path:line: ..." lines
    write(pages)                        # rewrite the shipped files (what ``render`` without --check does)

Prose lives in templates (``brorl_lab/study/templates/*.md.tmpl``, beside the code that fills them; the ``.tmpl``
suffix keeps them out of the docs' link check and the book). A template names each number as a field ``{{name}}``;
:func:`fill` refuses a template with a field the page's function does not compute, or a field it computes but the
template does not use. Fields are computed from the files by the study modules' own functions
(:func:`~brorl_lab.study.paid.paired_at_grid`, :func:`~brorl_lab.study.paid.grid_table`,
:func:`~brorl_lab.study.regime.markdown_table`, :func:`~brorl_lab.study.theorem.theorem_table`, :mod:`lab.stats`):
nothing here re-implements a statistic. Figures are drawn with matplotlib's Agg backend and saved without a date or
software stamp, so two renders of the same files give the same bytes.

Provenance. A page is built only from results files whose provenance record passes
:func:`~brorl_lab.study.results.is_shippable` (a clean commit, a start time, a committed declaration older than
the run), unless the file is named in :data:`LEGACY` with the reason it predates those rules; a page built from a
legacy file carries a rendered banner saying so and naming the records whose commit was dirty.
"""

from __future__ import annotations

import dataclasses
import io
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np
import pandas as pd

from brorl_lab.study.results import DECLARATION, is_shippable, read_provenance

ROOT = Path(__file__).resolve().parents[2]
TEMPLATES = Path(__file__).resolve().with_name("templates")
FIG = "notebooks/figures"
README = "README.md"
HEADLINE = ("<!-- headline -->\n", "<!-- /headline -->")
FIELD = re.compile(r"\{\{\s*(\w+)\s*\}\}")

_PREDATES = "run before pre-registration was enforced (issue 42): no start time, no committed declaration"
_DIRTY = "; its commit is -dirty (the tree had uncommitted changes when it ran)"
# Results files whose provenance predates the rules of study.results.is_shippable, each with why. A page built from
# one of them carries the legacy banner; a file not named here must pass is_shippable or the page is not built.
# tests/test_render.py checks every name exists and still fails is_shippable (a rerun that passes leaves the list).
LEGACY: dict[str, str] = {
    "data/learned_plateau/plateau.json": _PREDATES + "; its commit is the one that shipped it, not the run's",
    "data/plateau_model/plateau.json": _PREDATES + "; the run's own commit was not recorded",
    "data/takeoff_base/reach.json": _PREDATES + _DIRTY,
    f"{FIG}/flagship_verdict.json": _PREDATES + "; the run's own commit was not recorded; per-seed values not shipped",
    f"{FIG}/paid_learned_points.csv": _PREDATES + _DIRTY,
    f"{FIG}/paid_learned_metrics.parquet": _PREDATES + _DIRTY,
    f"{FIG}/paid_learned_mechanism.csv": _PREDATES + _DIRTY,
    f"{FIG}/paid_learned_lr_sqrt8_points.csv": _PREDATES + _DIRTY,
    f"{FIG}/paid_learned_lr_half_points.csv": _PREDATES + _DIRTY,
    f"{FIG}/paid_learned_pilot_points.csv": _PREDATES,
    f"{FIG}/paid_takeoff_pilot_points.csv": _PREDATES,
    f"{FIG}/regime_map.csv": _PREDATES + _DIRTY,
    f"{FIG}/regime_seeds.csv": _PREDATES + _DIRTY,
    f"{FIG}/regime_branch.csv": _PREDATES + _DIRTY,
    f"{FIG}/regime_drift.csv": _PREDATES + _DIRTY,
    f"{FIG}/regime_power.csv": _PREDATES + _DIRTY,
    f"{FIG}/regime.json": _PREDATES + _DIRTY,
    # shipped beside the per-seed files, read by no page (each run's summary, and the lr ablations' step metrics)
    f"{FIG}/paid_learned_verdict.json": _PREDATES + _DIRTY,
    f"{FIG}/paid_learned_lr_sqrt8_verdict.json": _PREDATES + _DIRTY,
    f"{FIG}/paid_learned_lr_half_verdict.json": _PREDATES + _DIRTY,
    f"{FIG}/paid_learned_lr_sqrt8_metrics.parquet": _PREDATES + _DIRTY,
    f"{FIG}/paid_learned_lr_half_metrics.parquet": _PREDATES + _DIRTY,
    f"{FIG}/paid_learned_pilot_verdict.json": _PREDATES,
    f"{FIG}/paid_takeoff_pilot_verdict.json": _PREDATES,
}
# Figures a page shows that no shipped file can redraw (the run's per-seed curves were not shipped): kept as shipped,
# checked to exist, and allowed only on a page built from legacy files.
FROZEN_FIGURES: dict[str, str] = {
    f"{FIG}/flagship_pass_at_1_vs_samples.png": "the floor run's per-seed curves (its summary.csv) were not shipped",
    f"{FIG}/flagship_mechanism.png": "the floor run's per-prompt rates (seed 0) were not shipped",
}

# Pages under docs/results that are not results (no numbers measured): left out of the render, rendered as given.
DRAFTS: dict[str, str] = {"docs/results/frontier_design.md": "a design draft (issue 43), not a results page",
                          "docs/results/allocation_design.md": "a design draft (issue 44), not a results page"}


class RenderError(ValueError):
    """A page cannot be rendered: a template field without a value, or a results file that may not back it."""


# ---- templates ---------------------------------------------------------------------------------------------------------
def fill(template: str, fields: Mapping[str, object], *, name: str = "template") -> str:
    """``template`` with each ``{{field}}`` replaced by ``str(fields[field])``; every field of the template must be
    given and every given field used."""
    used = set(FIELD.findall(template))
    missing, unused = sorted(used - set(fields)), sorted(set(fields) - used)
    if missing or unused:
        raise RenderError(f"{name}: fields without a value {missing}; values without a field {unused}")
    return FIELD.sub(lambda m: str(fields[m.group(1)]), template)


# ---- number formats (one place, so every page writes a number the same way) ---------------------------------------------
def pts(v: float, d: int = 2, sign: bool = True) -> str:
    """A fraction of pass@1 as points: 0.0063 -> '+0.63'."""
    return f"{100 * v:{'+' if sign else ''}.{d}f}"


def iv(r: Mapping, d: int = 2, mean: str = "gap") -> str:
    """'mean [lo, hi]' in points from a record with ``mean``, lo and hi (fractions)."""
    return f"{pts(r[mean], d)} [{pts(r['lo'], d)}, {pts(r['hi'], d)}]"


def count(v: float) -> str:
    return f"{v:,.0f}"


# ---- reading the files ---------------------------------------------------------------------------------------------------
class Files:
    """The results files under ``root``, each read once; remembers which were read (their provenance is checked)."""

    def __init__(self, root: Path):
        self.root, self.read, self._cache = Path(root), [], {}

    def __call__(self, name: str):
        if name not in self._cache:
            path = self.root / name
            if not path.is_file():
                raise RenderError(f"{name}: results file not found under {self.root}")
            if path.suffix == ".json":
                data = json.loads(path.read_text())
            elif path.suffix == ".parquet":
                data = pd.read_parquet(path)
            else:
                data = pd.read_csv(path)
            self._cache[name] = data
            self.read.append(name)
        return self._cache[name]

    def provenance(self, name: str) -> dict:
        return read_provenance(self.root / name)


_PAIRED: dict[tuple[int, str], tuple[pd.DataFrame, pd.DataFrame]] = {}  # one render's paired grids, by table and axis


def _paired(points: pd.DataFrame, axis: str) -> pd.DataFrame:
    """:func:`~brorl_lab.study.paid.paired_at_grid` of one axis of a per-seed points table (computed once a render)."""
    from brorl_lab.study.paid import paired_at_grid

    key = (id(points), axis)
    if key not in _PAIRED:
        _PAIRED[key] = (points, paired_at_grid(points[points["axis"] == axis]))
    return _PAIRED[key][1]


def _bounds(points: pd.DataFrame) -> dict:
    from brorl_lab.study.paid import change_bounds

    return {r["arm"]: r for r in change_bounds(points[points["axis"] == "cum_samples"]).to_dict(orient="records")}


def _runs(metrics: pd.DataFrame) -> pd.DataFrame:
    """Per arm: the mean dynamic-sampling pass rate over training steps, and the means over seeds of each run's last
    step, optimizer updates and trained samples, and the largest per-step KL."""
    last = metrics.sort_values("step").groupby(["arm", "seed"]).tail(1).groupby("arm")
    return pd.DataFrame({"ds": metrics[metrics["step"] > 0].groupby("arm")["ds_pass_rate"].mean(),
                         "steps": last["step"].mean(), "updates": last["cum_updates"].mean(),
                         "trained": last["cum_trained_samples"].mean(), "kl": metrics.groupby("arm")["kl"].max()})


def _seeds_needed(sd: float) -> int:
    from brorl_lab.lab.stats import seeds_for_power
    from brorl_lab.study.paid import SIZING_EFFECT

    return seeds_for_power(sd, SIZING_EFFECT)


def _span(values, fmt: Callable[[float], str]) -> str:
    return f"{fmt(min(values))} to {fmt(max(values))}"


_WORDS = ["none", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"]


def word(n: int) -> str:
    return _WORDS[n] if 0 <= n < len(_WORDS) else str(n)


# ---- the flagship (docs/results/flagship.md) -------------------------------------------------------------------------------
def flagship_fields(f: Files) -> dict:
    from brorl_lab.study.compare import COLLAPSE, collapse_flags
    from brorl_lab.study.paid import TAKEOFF_LEVEL, control_summary, grid_table, race, time_to_level

    out: dict[str, object] = {}
    plateau = f("data/learned_plateau/plateau.json")["rule"]
    lp = f(f"{FIG}/paid_learned_points.csv")
    tp = f(f"{FIG}/paid_takeoff_points.csv")
    lm, tm = f(f"{FIG}/paid_learned_metrics.parquet"), f(f"{FIG}/paid_takeoff_metrics.parquet")
    prov = f.provenance(f"{FIG}/paid_learned_points.csv")
    out["date"] = str(prov["date"])[:10]
    out["plateau_gain"] = pts(plateau["gained"], 1)
    out["plateau_step"] = f("data/learned_plateau/plateau.json")["steps"]
    grid = _paired(lp, "cum_samples")
    budget = float(grid["mark"].max())
    out["budget"] = count(budget)
    out["kl_max"] = COLLAPSE["kl_max"]
    out["pass_drop"] = f"{100 * COLLAPSE['pass_drop']:g}"
    head = grid.iloc[-1]
    pilot = _paired(f(f"{FIG}/paid_learned_pilot_points.csv"), "cum_samples").iloc[-1]
    out["pilot_seeds"] = _seeds_needed(pilot["sd"])
    out["learned_seeds"] = int(head["n"])
    out["learned_sd"] = pts(head["sd"], sign=False)
    out["learned_seeds_needed"] = _seeds_needed(head["sd"])
    out["learned_mde"] = pts(head["mde"], sign=False)
    out["wall_learned"] = count(f.provenance(f"{FIG}/paid_learned_points.csv")["wall_s"])
    out["wall_takeoff"] = count(f.provenance(f"{FIG}/paid_takeoff_points.csv")["wall_s"])
    tk = f.provenance(f"{FIG}/paid_takeoff_points.csv")
    out["takeoff_command"] = tk["command"]
    out["takeoff_machine"] = (f"{tk['machine']['cpu']}, {tk['machine']['cpu_count']} cores, "
                              f"{'started ' + tk['started_at'] if tk.get('started_at') else 'start not recorded'}")
    ablations = {k: f(f"{FIG}/paid_learned_lr_{k}_points.csv") for k in ("sqrt8", "half")}
    walls = [f.provenance(f"{FIG}/paid_learned_lr_{k}_points.csv")["wall_s"] / 60 for k in ablations]
    out["wall_ablation"] = f"{np.mean(walls):.0f} minutes"
    out["learned_table"] = grid_table(lp, "cum_samples")
    out["learned_head"] = iv(head)
    out["learned_every_mark"] = "behind at every grid point" if (grid["hi"] < 0).all() else \
        f"behind at {int((grid['hi'] < 0).sum())} of {len(grid)} grid points"
    b = _bounds(lp)
    out["change_prorl"], out["change_middle"], out["change_brorl"] = (iv(b[a], mean="change")
                                                                      for a in ("prorl", "middle", "brorl"))
    out["bound_brorl"] = pts(b["brorl"]["bound"], sign=False)
    trained = _paired(lp, "cum_trained_samples").iloc[-1]
    out["trained_gap"] = iv(trained)
    out["trained_x_brorl"], out["trained_x_prorl"] = count(trained["x_brorl"]), count(trained["x_prorl"])
    upd = _paired(lp, "cum_updates")
    same = upd[upd["x_brorl"].round() == upd["x_prorl"].round()].iloc[-1]
    out["updates_same"], out["updates_same_gap"] = f"{same['x_brorl']:.0f}", iv(same)
    last = upd.iloc[-1]
    out["updates_last_gap"] = iv(last)
    out["updates_last_brorl"], out["updates_last_prorl"] = f"{last['x_brorl']:.0f}", f"{last['x_prorl']:.0f}"
    out["wall_gap"] = iv(_paired(lp, "cum_wall_s").iloc[-1])
    runs = _runs(lm)
    out["ds_16"], out["ds_64"], out["ds_512"] = (f"{runs.loc[a, 'ds']:.3f}" for a in ("prorl", "middle", "brorl"))
    out["steps_prorl"], out["updates_prorl"] = f"{runs.loc['prorl', 'steps']:.1f}", f"{runs.loc['prorl', 'updates']:.1f}"
    out["steps_brorl"], out["updates_brorl"] = f"{runs.loc['brorl', 'steps']:.1f}", f"{runs.loc['brorl', 'updates']:.1f}"
    out["trained_brorl"], out["trained_prorl"] = count(runs.loc["brorl", "trained"]), count(runs.loc["prorl", "trained"])
    flags = collapse_flags(lm)
    fired = flags.groupby("arm")["collapsed"].sum()
    by_kl, by_pass = flags["reason"].str.contains("KL"), flags["collapsed"] & flags["reason"].str.contains("pass")
    out["collapse_prorl"] = (f"all {int(head['n'])} ProRL seeds" if fired["prorl"] == head["n"] else
                             f"{int(fired['prorl'])} ProRL seeds")
    out["collapse_brorl"], out["collapse_middle"] = int(fired["brorl"]), int(fired["middle"])
    out["collapse_by"] = ("each by the KL bound" if (by_kl == flags["collapsed"]).all() else
                          f"{int((flags['collapsed'] & by_kl).sum())} by the KL bound")
    out["collapse_pass"] = word(int(by_pass.sum()))
    out["kl_prorl"], out["kl_brorl"], out["kl_middle"] = (f"{runs.loc[a, 'kl']:.2f}" for a in ("prorl", "brorl", "middle"))
    mech = control_summary(f(f"{FIG}/paid_learned_mechanism.csv")).set_index("arm")
    out["mech_prorl"] = iv(mech.loc["prorl"], mean="beyond_control")
    out["mech_brorl"] = iv(mech.loc["brorl"], mean="beyond_control")
    out["rare_share"] = f"{100 * f('data/learned_plateau/plateau.json')['gate']['share']:.1f}%"
    for k, p in ablations.items():
        g, ch = _paired(p, "cum_samples").iloc[-1], _bounds(p)["brorl"]
        out[f"lr_{k}_gap"], out[f"lr_{k}_change"] = iv(g), iv(ch, mean="change")
        out[f"lr_{k}_seeds"] = int(g["n"])
    per = [-100 * v for v in _paired(ablations["sqrt8"], "cum_samples").iloc[-1]["per_seed"].values()]
    out["lr_sqrt8_fell"] = _span(per, lambda v: f"{v:.2f}")
    # the takeoff base
    tgrid = _paired(tp, "cum_samples")
    thead = tgrid.iloc[-1]
    out["takeoff_seeds"] = int(thead["n"])
    out["takeoff_start"] = f"{tp['start'].mean():.4f}"
    out["takeoff_table"] = grid_table(tp, "cum_samples")
    times = time_to_level(tm[tm["arm"].isin(["prorl", "brorl"])], TAKEOFF_LEVEL, budget=budget)
    r = race(times, budget=budget)
    out["race"] = ("not resolved. Neither arm\n  reached +10 points in any of the "
                   f"{r['n']} seeds within {count(budget)} generated samples: every time is censored, so the race\n"
                   "  cannot order the arms") if r["reached_brorl"] == r["reached_prorl"] == 0 else \
        f"BroRL reached it in {r['reached_brorl']} and ProRL in {r['reached_prorl']} of {r['n']} seeds"
    out["takeoff_head"] = iv(thead)
    tb = _bounds(tp)
    out["takeoff_prorl"], out["takeoff_brorl"] = iv(tb["prorl"], mean="change"), iv(tb["brorl"], mean="change")
    out["takeoff_bound_brorl"] = pts(tb["brorl"]["bound"], sign=False)
    tu = _paired(tp, "cum_updates")
    tsame = tu[tu["x_brorl"].round() == tu["x_prorl"].round()].iloc[-1]
    out["takeoff_updates"], out["takeoff_updates_gap"] = f"{tsame['x_brorl']:.0f}", iv(tsame)
    out["takeoff_updates_ahead"] = pts(tsame["hi"], sign=False)
    out["takeoff_trained_gap"] = iv(_paired(tp, "cum_trained_samples").iloc[-1])
    out["takeoff_wall_gap"] = iv(_paired(tp, "cum_wall_s").iloc[-1])
    truns = _runs(tm)
    out["takeoff_ds_16"], out["takeoff_ds_512"] = f"{truns.loc['prorl', 'ds']:.3f}", f"{truns.loc['brorl', 'ds']:.3f}"
    out["takeoff_updates_prorl"] = f"{truns.loc['prorl', 'updates']:.1f}"
    out["takeoff_updates_brorl"] = f"{truns.loc['brorl', 'updates']:.1f}"
    tfired = int(collapse_flags(tm)["collapsed"].sum())
    out["takeoff_collapse"] = "No seed collapsed." if tfired == 0 else f"{tfired} seed runs collapsed."
    out["updates_ratio"] = f"{runs.loc['prorl', 'updates'] / runs.loc['brorl', 'updates']:.0f}"
    out["updates_per_step"] = f"{runs.loc['brorl', 'updates'] / runs.loc['brorl', 'steps']:.0f}"
    return out


# ---- the regime map (docs/results/regime_map.md) ------------------------------------------------------------------------
def regime_fields(f: Files) -> dict:
    from brorl_lab.study.regime import RHO_RULE, markdown_table

    t = f(f"{FIG}/regime_map.csv").set_index("setting")
    reading = f(f"{FIG}/regime.json")
    above = t[t["rho"] >= RHO_RULE].sort_values("rho")
    built = int((above["drawn"] != "named").sum())
    out = {"regime_date": str(f.provenance(f"{FIG}/regime_map.csv")["date"])[:10],
           "regime_table": markdown_table(t), "regime_settings": len(t),
           "regime_above": word(len(above)), "regime_above_built": word(built),
           "regime_above_chosen": word(len(above) - built),
           "regime_behind": int((t["hi"] < 0).sum()), "regime_ahead": word(int((t["lo"] > 0).sum())),
           "regime_unresolved": int(((t["lo"] <= 0) & (t["hi"] >= 0)).sum()),
           "regime_ahead_updates": word(int((t["lo_updates"] > 0).sum())),
           "regime_verdict": reading["rho"]["verdict"], "regime_verdict_run": reading["rho_run"]["verdict"]}
    fits = pd.DataFrame(reading["rho"]["fits"])
    out["regime_fits"] = len(fits)
    out["regime_fits_crossing"] = int(fits["resolved"].sum())
    below1 = int((above["hi"] < 0.01).sum())
    out["regime_above_below1"] = ("Each interval lies" if below1 == len(above) else
                                  f"{word(below1).capitalize()} of the intervals lie")
    out["regime_above_below0"] = word(int((above["hi"] < 0).sum()))
    out["regime_above_list"] = ", ".join(f"{name} ({r['rho']:.2f}) {iv(r)}" for name, r in above.iterrows())
    out.update(_regime_reading(f, t, above))
    out.update(_regime_drift(f, t))
    out.update(_regime_power(f, t, above))
    return out


def _pct(v: float) -> str:
    return f"{100 * v:.1f}%"


def _names(index) -> str:
    names = list(index)
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def _upd(r) -> str:
    """A regime row's gap at equal optimizer updates with its interval, in points."""
    return f"{pts(r['gap_updates'])} [{pts(r['lo_updates'])}, {pts(r['hi_updates'])}]"


def _regime_reading(f: Files, t: pd.DataFrame, above: pd.DataFrame) -> dict:
    """The reading's fits and the comparison bases (nominal samples, updates, wall time) of the regime map."""
    from brorl_lab.study.regime import RHO_RULE

    reading, out = f(f"{FIG}/regime.json"), {}
    for axis, key in (("rho", "b"), ("rho_run", "r")):
        fits = pd.DataFrame(reading[axis]["fits"])
        up, down, cross = fits[fits["b_lo"] > 0], int((fits["b_hi"] < 0).sum()), int(fits["resolved"].sum())
        loo = up["fit"].str.startswith("without").all()
        said = (f"none of {len(fits)} resolved either way" if up.empty and not down else
                f"{len(up)} of {len(fits)}{f' ({word(len(up))} leave-one-out fits)' if loo else ''} resolve the gap "
                f"rising, {word(down)} falling")
        out[f"regime_{key}_fits"] = (f"slopes {100 * fits['b'].min():+.1f} to {100 * fits['b'].max():+.1f} points per "
                                     f"doubling; {said}; {'no' if not cross else cross} crossover ({cross} of "
                                     f"{len(fits)})")
    run_above = t[t["rho_run"] >= RHO_RULE]
    out["regime_run_above"] = (f"{word(len(run_above)).capitalize()} setting{' reaches' if len(run_above) == 1 else 's reach'}"
                               if len(run_above) else "No setting reaches")
    out["regime_run_above_list"] = ", ".join(f"{n} ({r['rho_run']:.2f}), {iv(r)}" for n, r in run_above.iterrows())
    out["regime_generated"] = _span(t["generated_ratio"], lambda v: f"{v:.2f}")
    out["regime_prorl_generated"] = _span(1 / t["generated_ratio"], lambda v: f"{v:.2f}")
    out["regime_generated_updates"] = _span(t["generated_ratio_updates"], lambda v: f"{v:.2f}")
    behind = t[t["hi_updates"] < 0]
    out["regime_updates_ahead"] = "nowhere" if not (t["lo_updates"] > 0).any() else \
        _names(t.index[t["lo_updates"] > 0])
    out["regime_updates_behind"] = _names([f"{n} {_upd(r)}" for n, r in behind.iterrows()])
    out["regime_above_updates"] = _names([_upd(r) for _, r in above.iterrows()])
    out["regime_above_generated_updates"] = _span(above["generated_ratio_updates"], lambda v: f"{v:.2f}")
    out["regime_above_prorl_generated"] = _span(1 / above["generated_ratio"], lambda v: f"{v:.2f}")
    out["regime_above_prorl_ahead"] = word(int((above["hi"] < 0).sum()))
    out["regime_above_count"] = word(len(above))
    out["regime_above_lead"] = _names([pts(v) for v in above["hi_updates"]])
    out["regime_wall"] = _span(t["wall_ratio"], lambda v: f"{v:.2f}")
    big = t.loc[t["gap"].idxmin()]
    out["regime_largest"] = t["gap"].idxmin()
    out["regime_largest_path"] = f"{big['prorl_0']:.3f} to {big['prorl']:.3f}, BroRL to {big['brorl']:.3f}"
    out["regime_largest_updates"] = _upd(big)
    out["regime_largest_resolved"] = "not resolved" if big["lo_updates"] <= 0 <= big["hi_updates"] else "resolved"
    return out


SCARCE_S16 = 0.1  # the regime page's "rare-success settings": E[s_16] at the branch point below this


def _regime_drift(f: Files, t: pd.DataFrame) -> dict:
    """The N=16 arm's drift (first half of training -> second half) in the settings the page names."""
    d = f(f"{FIG}/regime_drift.csv").set_index(["setting", "arm", "part"])
    b = f(f"{FIG}/regime_branch.csv").set_index("setting")

    def move(setting: str, col: str, arm: str = "prorl", fmt=_pct) -> str:
        return f"{fmt(d.loc[(setting, arm, 1), col])} -> {fmt(d.loc[(setting, arm, 2), col])}"

    learned, rare = "spell_backward+gcd@learned", "spell_backward@takeoff (0,1/64]"
    out = {"drift_gcd": move("gcd", "all_correct"), "drift_gcd_ds": move("gcd", "ds_pass_rate", fmt=lambda v: f"{v:.3f}"),
           "drift_gcd_s16": f"{t.loc['gcd', 'E_s16']:.3f}", "drift_gcd_band": move("gcd (1/4,1)", "all_correct"),
           "drift_spell": move("spell_backward", "all_correct"), "drift_gcd_rho_run": f"{t.loc['gcd', 'rho_run']:.2f}",
           "drift_gcd_rho": f"{t.loc['gcd', 'rho']:.2f}", "drift_learned_correct": move(learned, "all_correct"),
           "drift_learned_wrong": move(learned, "all_wrong"), "drift_learned_s16": f"{t.loc[learned, 'E_s16']:.3f}",
           "drift_learned_rho_run": f"{t.loc[learned, 'rho_run']:.2f}",
           "drift_learned_rare": f"{b.loc[learned, 'rare_success']:g}",
           "drift_learned_failures": _pct(b.loc[learned, "rare_failure"]), "drift_rare_wrong": move(rare, "all_wrong"),
           "drift_rare_ds": f"{t.loc[rare, 'ds_prorl']:.3f}", "drift_rare_s16": f"{t.loc[rare, 'E_s16']:.3f}",
           "drift_rare_rho_run": f"{t.loc[rare, 'rho_run']:.2f}", "drift_rare_rho": f"{t.loc[rare, 'rho']:.2f}"}
    br = d.xs("brorl", level="arm").groupby(level="setting")[["all_correct", "all_wrong"]].max()
    easy = br[(br["all_correct"] == 0) & (br["all_wrong"] <= 0.1)]
    scarce = t.index[t["E_s16"] < SCARCE_S16]
    out["drift_easy"] = _names([n for n in t.index if n in easy.index])
    out["drift_easy_wrong"] = _pct(easy["all_wrong"].max())
    wrong = d.xs("brorl", level="arm").loc[list(scarce), "all_wrong"]
    out["drift_scarce_wrong"] = _span(wrong, _pct)
    out["drift_scarce"] = _names(list(scarce))
    out["drift_scarce_bound"] = f"{SCARCE_S16:g}"
    return out


def _regime_power(f: Files, t: pd.DataFrame, above: pd.DataFrame) -> dict:
    """Collapse counts, the per-setting sd and seeds a 1-point gap needs, and the arms' training hours."""
    s, w = f(f"{FIG}/regime_seeds.csv"), f(f"{FIG}/regime_power.csv").set_index("setting")
    reasons = {a: s[f"collapse_reason_{a}"].fillna("") for a in ("prorl", "brorl")}
    by_kl = all((reasons[a][s[f"collapsed_{a}"]].str.contains("KL")).all() for a in reasons)
    lo, hi = w["sd"].idxmin(), w["sd"].idxmax()
    short = w[~w["enough"]]
    open_above = above[above["hi"] >= 0]
    hours = {a: s[f"wall_{a}"].sum() / 3600 for a in ("prorl", "brorl")}
    return {"collapse_prorl": int(s["collapsed_prorl"].sum()), "collapse_runs": len(s),
            "collapse_brorl": int(s["collapsed_brorl"].sum()),
            "collapse_by": "every one by KL" if by_kl else "not every one by KL",
            "collapse_fell_brorl": word(int(reasons["brorl"].str.contains("pass").sum())),
            "collapse_fell_prorl": (lambda k: "no ProRL seed" if k == 0 else f"{word(k)} ProRL seeds")(
                int(reasons["prorl"].str.contains("pass").sum())),
            "power_seeds": int(w["seeds"].min()), "power_sd_lo": pts(w.loc[lo, "sd"], sign=False),
            "power_lo": lo, "power_lo_needs": int(w.loc[lo, "seeds_needed"]),
            "power_sd_hi": pts(w.loc[hi, "sd"], sign=False), "power_hi": hi,
            "power_hi_needs": int(w.loc[hi, "seeds_needed"]), "power_enough": _names(list(w.index[w["enough"]])),
            "power_rest": _span(short["seeds_needed"], str),
            "power_open": ", ".join(f"{n}, which needs {int(w.loc[n, 'seeds_needed'])}, included: its interval's "
                                    f"upper end is {pts(r['hi'])}" for n, r in open_above.iterrows()),
            "hours": f"{sum(hours.values()):.2f}", "hours_prorl": f"{hours['prorl']:.2f}",
            "hours_brorl": f"{hours['brorl']:.2f}"}


# ---- Theorem 1 on the model (docs/results/theorem.md) ----------------------------------------------------------------------
def theorem_fields(f: Files) -> dict:
    from brorl_lab.study.theorem import theorem_table

    s = f(f"{FIG}/theorem_on_the_model_summary.csv")
    th = f(f"{FIG}/theorem_on_the_model_theory.csv")

    def rows(model: str, split: str) -> pd.DataFrame:
        return s[(s["model"] == model) & (s["split"] == split)].set_index("n").sort_index()

    ib, ho, dib, dho = rows("plateau", "in_batch"), rows("plateau", "held_out"), rows("default", "in_batch"), \
        rows("default", "held_out")
    ns = list(ib.index)

    def one(r, col: str, fmt: str) -> str:
        return f"{r[col]:{fmt}} [{r[col + '_lo']:{fmt}}, {r[col + '_hi']:{fmt}}]"

    mid = list(ib.index[1:-1])
    resolved = [n for n in ho.index if ho.loc[n, "dq_per_lr_lo"] > 0 or ho.loc[n, "dq_per_lr_hi"] < 0]
    dth = th[th["model"] == "default"].set_index("n").sort_index()
    rest = dth["share_neg"].iloc[1:]
    return {"theorem_table": theorem_table(s, th), "theorem_seeds": int(s["seeds"].max()),
            "theorem_ns": ", ".join(str(n) for n in ns),
            "theorem_wall": f"{f.provenance(f'{FIG}/theorem_on_the_model_summary.csv')['wall_s'] / 60:.0f}",
            "theorem_n_lo": int(ns[0]), "theorem_n_hi": int(ns[-1]),
            "theorem_dq_lo": one(ib.loc[ns[0]], "dq_per_lr", "+.1f"), "theorem_dq_hi": one(ib.loc[ns[-1]], "dq_per_lr", "+.1f"),
            "theorem_dq_mid": ", ".join([one(ib.loc[mid[0]], "dq_per_lr", "+.1f")] +
                                        [f"{ib.loc[n, 'dq_per_lr']:+.1f}" for n in mid[1:]]),
            "theorem_mid_ns": ", ".join(str(n) for n in mid),
            "theorem_share_lo": one(ib.loc[ns[0]], "share_neg", ".2f"),
            "theorem_share_mid": ", ".join(f"{ib.loc[n, 'share_neg']:.2f}" for n in ns[1:-1]),
            "theorem_share_hi": one(ib.loc[ns[-1]], "share_neg", ".2f"),
            "theorem_ho_span": f"{ho['dq_per_lr'].min():+.1f} and {ho['dq_per_lr'].max():+.1f}",
            "theorem_ho_resolved": "; ".join(f"N={n} ({one(ho.loc[n], 'dq_per_lr', '+.1f')})" for n in resolved) or "none",
            "theorem_ho_share": one(ho.loc[ns[0]], "share_neg", ".2f"),
            "theorem_def_ib": f"{dib.loc[ns[0], 'dq_per_lr']:+.0f} at N={ns[0]} to "
                              f"{dib.loc[ns[-1], 'dq_per_lr']:+.0f} at N={ns[-1]}",
            "theorem_def_ho": f"{one(dho.loc[ns[0]], 'dq_per_lr', '+.1f')} to {one(dho.loc[ns[-1]], 'dq_per_lr', '+.1f')}",
            "theorem_def_below": ("every" if (s[s["model"] == "default"]["dq_per_lr_hi"] < 0).all() else "not every")
                                 + " interval\n  below 0",
            "theorem_def_share": f"{dib.loc[ns[0], 'share_neg']:.2f} to {dib.loc[ns[-1], 'share_neg']:.2f}",
            "theorem_theory": f"{dth['share_neg'].iloc[0]:.2g} on the default model at N={dth.index[0]}, "
                              + ("0 elsewhere" if (rest == 0).all() and (th[th["model"] != "default"]["share_neg"] == 0).all()
                                 else "above 0 elsewhere too")}


# ---- the README's headline block ---------------------------------------------------------------------------------------------
def readme_fields(f: Files) -> dict:
    from brorl_lab.study.paid import headline_reading

    fl, rg, th = flagship_fields(f), regime_fields(f), theorem_fields(f)
    lp = _paired(f(f"{FIG}/paid_learned_points.csv"), "cum_samples").iloc[-1]
    tp = _paired(f(f"{FIG}/paid_takeoff_points.csv"), "cum_samples").iloc[-1]
    reading = headline_reading(lp.to_dict()).split(":")[0]
    treading = headline_reading(tp.to_dict()).split(":")[0]
    keep = ("budget", "plateau_gain", "learned_seeds", "learned_head", "takeoff_seeds", "takeoff_head",
            "takeoff_updates", "takeoff_updates_gap", "updates_ratio", "mech_brorl", "rare_share", "wall_learned",
            "wall_takeoff", "takeoff_command", "takeoff_machine", "pilot_seeds", "learned_sd", "learned_seeds_needed")
    out = {k: fl[k] for k in keep}
    out["learned_reading"], out["takeoff_reading"] = reading, treading
    out.update({k: th[k] for k in ("theorem_seeds", "theorem_n_lo", "theorem_n_hi", "theorem_dq_lo", "theorem_dq_hi")})
    out.update({k: rg[k] for k in ("regime_above", "regime_above_built", "regime_above_chosen",
                                   "regime_verdict", "regime_ahead", "regime_behind", "regime_settings", "hours")})
    out["regime_runs"] = 2 * len(f(f"{FIG}/regime_seeds.csv"))
    out["frontier_rows"] = frontier_headline(f) + frontier_per_update_headline(f) + frontier_race_headline(f)
    out["allocation_rows"] = allocation_headline(f)
    from brorl_lab.study.regime import RHO_RULE

    t = f(f"{FIG}/regime_map.csv")
    above = t[t["rho"] >= RHO_RULE].sort_values("rho")
    out["regime_seeds"] = int(t["n"].min())
    out["regime_rho_span"] = _span(t["rho"], lambda v: f"{v:.2f}")
    out["regime_prorl_generated"] = _span(1 / t["generated_ratio"], lambda v: f"{v:.2f}")
    out["regime_above_gaps"] = ", ".join(iv(r) for _, r in above.iterrows())
    out["regime_above_rhos"] = ", ".join(f"{v:.2f}" for v in above["rho"])
    return out


# ---- figures (matplotlib, Agg, no date or software stamp: the same files give the same bytes) -------------------------------
def _png(draw: Callable[[object], None], size: tuple[float, float]) -> bytes:
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    with matplotlib.rc_context({"font.size": 9, "axes.spines.top": False, "axes.spines.right": False}):
        fig = plt.figure(figsize=size, dpi=100)
        try:
            draw(fig)
            buf = io.BytesIO()
            fig.savefig(buf, format="png", dpi=100, metadata={"Software": None})
        finally:
            plt.close(fig)
    return buf.getvalue()


def _dots(ax, xs, grid: pd.DataFrame, offset: float, label: bool) -> None:
    """At each x: a dot per seed (its paired gap, points) and the mean with its 95% t interval."""
    for x, (_, r) in zip(xs, grid.iterrows()):
        seeds = [100 * v for v in dict(r["per_seed"]).values()]
        ax.scatter([x + offset] * len(seeds), seeds, s=9, color="tab:blue", alpha=0.55,
                   label="one seed" if label and x == xs[0] else None)
    ax.errorbar(xs, 100 * grid["gap"], yerr=[100 * (grid["gap"] - grid["lo"]), 100 * (grid["hi"] - grid["gap"])],
                fmt="o", color="black", ms=5, capsize=3, label="mean, 95% t interval" if label else None)
    ax.axhline(0, color="grey", lw=0.8)


AXIS_NAMES = {"cum_samples": "generated samples", "cum_trained_samples": "samples trained on",
              "cum_updates": "optimizer updates", "cum_wall_s": "training wall time (s)"}


def gaps_png(points: pd.DataFrame, title: str) -> bytes:
    """One panel per axis of the per-seed points: BroRL - ProRL at each mark, a dot per seed, the mean's interval."""
    axes = [a for a in AXIS_NAMES if a in set(points["axis"])]

    def draw(fig):
        for j, a in enumerate(axes):
            ax = fig.add_subplot(1, len(axes), j + 1)
            g = _paired(points, a)
            xs = list(range(1, len(g) + 1))
            _dots(ax, xs, g, 0.22, j == 0)
            ax.set_xticks(xs, [f"{m:,.0f}" if m >= 100 else f"{m:.3g}" for m in g["mark"]], rotation=60, fontsize=7)
            ax.set_title(f"at equal {AXIS_NAMES[a]}")
            ax.set_xlabel(AXIS_NAMES[a] + " (mark)")
        fig.axes[0].set_ylabel("BroRL - ProRL (points of pass@1)")
        fig.legend(loc="lower center", ncol=2, frameon=False)
        fig.suptitle(title)
        fig.tight_layout(rect=(0, 0.06, 1, 1))

    return _png(draw, (3.2 * len(axes), 3.8))


def headline_png(f: Files) -> bytes:
    """The README's figure: the headline gap at the budget of generated samples, a dot per paired seed and the mean
    with its 95% t interval, from the learned plateau and from the takeoff base."""
    runs = {"learned plateau": f(f"{FIG}/paid_learned_points.csv"), "takeoff base": f(f"{FIG}/paid_takeoff_points.csv")}

    def draw(fig):
        ax = fig.add_subplot(1, 1, 1)
        grids = [_paired(p, "cum_samples").iloc[[-1]] for p in runs.values()]
        for i, g in enumerate(grids):
            _dots(ax, [i], g, 0.15, i == 0)
        ax.set_xticks(range(len(runs)), [f"{k}\n({int(g['n'].iloc[0])} seeds)" for k, g in zip(runs, grids)])
        ax.set_xlim(-0.5, len(runs) - 0.5)
        ax.set_ylabel("BroRL - ProRL (points of held-out pass@1)")
        ax.set_title(f"At equal generated samples ({grids[0]['mark'].iloc[0]:,.0f})")
        ax.legend(loc="lower left", frameon=False)
        fig.tight_layout()

    return _png(draw, (5.0, 3.6))


def regime_png(f: Files) -> bytes:
    """The regime map: the gap at equal nominal samples against branch-point rho and in-run rho, a dot per paired
    seed and each setting's mean with its interval, the rule's rho as a line."""
    from brorl_lab.study.regime import RHO_RULE

    t = f(f"{FIG}/regime_map.csv").set_index("setting")
    seeds = f(f"{FIG}/regime_seeds.csv")

    def draw(fig):
        for j, (col, name) in enumerate((("rho", "branch-point rho"), ("rho_run", "in-run rho"))):
            ax = fig.add_subplot(1, 2, j + 1)
            for s, g in seeds.groupby("setting"):
                ax.scatter([t.loc[s, col]] * len(g), 100 * g["gap"], s=7, color="tab:blue", alpha=0.4,
                           label="one seed" if (j == 0 and s == seeds["setting"].iloc[0]) else None)
            ax.errorbar(t[col], 100 * t["gap"], yerr=[100 * (t["gap"] - t["lo"]), 100 * (t["hi"] - t["gap"])],
                        fmt="o", color="black", ms=4, capsize=2, label="setting: mean, 95% t interval" if j == 0 else None)
            ax.axhline(0, color="grey", lw=0.8)
            ax.axvline(RHO_RULE, color="tab:red", lw=0.8, ls="--", label=f"rule: rho = {RHO_RULE:g}" if j == 0 else None)
            ax.set_xscale("log", base=2)
            ax.set_xlabel(name)
            ax.set_title(f"gap at equal nominal samples vs {name}")
        fig.axes[0].set_ylabel("BroRL - ProRL (points of pass@1)")
        fig.legend(loc="lower center", ncol=3, frameon=False)
        fig.tight_layout(rect=(0, 0.07, 1, 1))

    return _png(draw, (10.0, 4.2))


def theorem_png(f: Files) -> bytes:
    """Theorem 1 on the model: mean dQ/lr of one update against N, per checkpoint and prompt split, 95% intervals."""
    s = f(f"{FIG}/theorem_on_the_model_summary.csv")

    def draw(fig):
        for j, (model, g) in enumerate(s.groupby("model", sort=True)):
            ax = fig.add_subplot(1, s["model"].nunique(), j + 1)
            for split, h in g.groupby("split", sort=True):
                h = h.sort_values("n")
                ax.errorbar(h["n"], h["dq_per_lr"], yerr=[h["dq_per_lr"] - h["dq_per_lr_lo"],
                                                         h["dq_per_lr_hi"] - h["dq_per_lr"]],
                            fmt="o-", ms=4, capsize=2, label=split.replace("_", "-"))
            ax.axhline(0, color="grey", lw=0.8)
            ax.set_xscale("log", base=2)
            ax.set_xlabel("N (rollouts per prompt)")
            ax.set_title(f"{model} checkpoint")
            ax.legend(frameon=False)
        fig.axes[0].set_ylabel("mean dQ_pos / lr (one update, 95% t interval)")
        fig.tight_layout()

    return _png(draw, (9.0, 3.8))


def floor_grid_png(f: Files) -> bytes:
    """The floor run's paired gap on its shared grid, mean and 95% t interval (its per-seed values were not shipped)."""
    v = f(f"{FIG}/flagship_verdict.json")

    def draw(fig):
        for j, (axis, name) in enumerate((("cum_nominal_samples", "nominal samples"),
                                          ("cum_nominal_updates", "optimizer updates"))):
            ax = fig.add_subplot(1, 2, j + 1)
            g = pd.DataFrame(v["grids"][axis])
            ax.errorbar(g["budget"], 100 * g["gap"], yerr=[100 * (g["gap"] - g["lo"]), 100 * (g["hi"] - g["gap"])],
                        fmt="o", color="black", ms=4, capsize=3)
            ax.axhline(0, color="grey", lw=0.8)
            ax.set_xlabel(name)
            ax.set_title(f"at equal {name}")
        fig.axes[0].set_ylabel("BroRL - ProRL (points of pass@1)")
        fig.tight_layout()

    return _png(draw, (8.0, 3.4))


# ---- the branch points and the pilots (docs/results/paid.md) ----------------------------------------------------------------
def _pilot(f: Files, run: str) -> dict:
    """A 3-seed pilot's readings from its per-seed points (and its per-seed collapse records in verdict.json)."""
    from brorl_lab.study.paid import headline_reading

    name = f"{FIG}/paid_{run}_pilot_points.csv"
    pts_ = f(name)
    grid = _paired(pts_, "cum_samples")
    head = grid.iloc[-1]
    b = _bounds(pts_)
    flags = pd.DataFrame(f(f"{FIG}/paid_{run}_pilot_verdict.json")["collapse"])
    reading = headline_reading(head.to_dict())
    out = {"wall": count(f.provenance(name)["wall_s"]), "budget": count(head["mark"]),
           "marks": ", ".join(count(m) for m in grid["mark"][:-1]) + " and " + count(head["mark"]),
           "x_brorl": count(head["x_brorl"]), "x_prorl": count(head["x_prorl"]), "gap": iv(head),
           "per_seed": ", ".join(pts(v) for v in dict(head["per_seed"]).values()),
           "reading": reading.split(":")[0], "sd": pts(head["sd"], sign=False), "n": int(head["n"]),
           "seeds": _seeds_needed(head["sd"]),
           "prorl": iv(b["prorl"], mean="change"), "prorl_bound": pts(b["prorl"]["bound"], sign=False),
           "brorl": iv(b["brorl"], mean="change"), "brorl_bound": pts(b["brorl"]["bound"], sign=False),
           "collapsed": flags[flags["collapsed"]], "flags": flags}
    return out


def paid_fields(f: Files) -> dict:
    from brorl_lab.study.compare import COLLAPSE

    v = f("data/learned_plateau/plateau.json")
    rule, first, last = v["rule"], v["curve"][0], v["curve"][-1]
    fams = v["families"]
    out = {"lp_start": f"{first[rule['metric']]:.3f}",
           "lp_start_families": ", ".join(f"{fam} {first[f'eval/{fam}/pass@1']:.3f}" for fam in fams),
           "lp_window": f"{rule['window_mean']:.3f}", "lp_gain": pts(rule["gained"], 1),
           "lp_step": v["steps"], "lp_slope": f"{100 * rule['slope']:+.2f} [{100 * rule['lo']:+.2f}, "
                                                f"{100 * rule['hi']:+.2f}]",
           "lp_n": rule["n"], "lp_window_start": rule["window_start"], "lp_t": f"{rule['t']:.3f}",
           "lp_df": rule["n"] - 2, "lp_end": f"{last[rule['metric']]:.3f}",
           "lp_end_families": ", ".join(f"{fam} {last[f'eval/{fam}/pass@1']:.3f}" for fam in fams),
           "lp_wall": count(v["wall_s"]), "lp_rare": f"{100 * v['gate']['share']:.1f}%"}
    every = {r["family"]: r for r in v["reach"]}["all"]
    hist = pd.DataFrame(v["p_histogram"]).query("family == 'all'").set_index("bin")["prompts"]
    out.update({"lp_mean_p": f"{every['mean_p']:.3f}", "lp_prompts": every["prompts"],
                "lp_p1": int(hist["p=1"]), "lp_high": int(hist["(0.75,1)"]), "lp_p0": int(hist["p=0"]),
                "lp_only": f"{100 * every['share only N=512']:.1f}%", "lp_neither": f"{100 * every['share neither']:.1f}%"})
    rows = ["| family | mean p | share 0 < p <= 1/16 | share p = 0 | share 'only N=512' |", "|---|---:|---:|---:|---:|"]
    for r in f("data/takeoff_base/reach.json")["reach"]:
        rows.append(f"| {r['family']} | {r['mean_p']:.3f} | {100 * r['share rare successes']:.1f}% | "
                    f"{100 * r['share neither']:.1f}% | {100 * r['share only N=512']:.1f}% |")
    out["reach_table"] = "\n".join(rows)
    for run in ("learned", "takeoff"):
        p = _pilot(f, run)
        for k in ("wall", "budget", "x_brorl", "x_prorl", "gap", "per_seed", "reading", "sd", "n", "seeds", "prorl",
                  "prorl_bound", "brorl", "brorl_bound"):
            out[f"{run}_{k}"] = p[k]
        if run == "takeoff":
            out["takeoff_marks"] = p["marks"]
            out["takeoff_collapse"] = ("No seed met the collapse rule." if p["collapsed"].empty else
                                       f"The collapse rule fired on {len(p['collapsed'])} seed runs.")
            r = f(f"{FIG}/paid_takeoff_pilot_verdict.json")["race"]
            out["takeoff_race"] = (f"{r['reached_brorl']} of {r['n']}" if r["reached_brorl"] == r["reached_prorl"]
                                   else f"BroRL {r['reached_brorl']}, ProRL {r['reached_prorl']} of {r['n']}")
        else:
            c, flags = p["collapsed"], p["flags"]
            fired = ", ".join(f"{a} seed {s}" for a, s in zip(c["arm"].str.replace("prorl", "ProRL")
                                                                .str.replace("brorl", "BroRL"), c["seed"]))
            out["learned_collapse"] = fired or "no seed"
            out["learned_collapse_kl"] = ", ".join(f"{k:.3f}" for k in c["max_kl"])
            out["kl_max"] = COLLAPSE["kl_max"]
            rest = flags[(flags["arm"] == "prorl") & ~flags["collapsed"]]["max_kl"]
            out["learned_kl_rest"] = " and ".join(f"{k:.3f}" for k in rest)
    return out


# ---- the floor's branch point (docs/results/plateau.md) -----------------------------------------------------------------------
def plateau_fields(f: Files) -> dict:
    v = f("data/plateau_model/plateau.json")
    rule, gate, reach = v["rule"], v["gate"], {r["family"]: r for r in v["reach"]}["all"]
    last = v["curve"][-1][rule["metric"]]

    def pct(x: float) -> str:
        return f"{100 * x:.{0 if abs(100 * x - round(100 * x)) < 0.05 else 1}f}%"

    return {"steps": v["steps"], "wall": f"{v['wall_s']:.1f}", "window": rule["window"], "n": rule["n"],
            "slope": f"{100 * rule['slope']:+.2f} [{100 * rule['lo']:+.2f}, {100 * rule['hi']:+.2f}]",
            "t": f"{rule['t']:.2f}", "start": f"{rule['start']:.4f}", "end": f"{last:.4f}",
            "window_mean": f"{rule['window_mean']:.4f}", "gate_share": f"{100 * gate['share']:.1f}%",
            "gate_prompts": gate["prompts"], "gate_draws": gate["draws"],
            "gate": "passed" if gate["passed"] else "not passed",
            "only": f"{100 * reach['share only N=512']:.0f}%", "neither": f"{100 * reach['share neither']:.0f}%",
            "both": f"{100 * reach['share both']:.0f}%", "mean_p": f"{reach['mean_p']:.3f}",
            "ds_small": pct(reach["pass_rate_small"]), "ds_large": pct(reach["pass_rate_large"])}


# ---- the floor (docs/results/floor.md): its tables from its one file -----------------------------------------------------
def floor_fields(f: Files) -> dict:
    v = f(f"{FIG}/flagship_verdict.json")

    def gap(r, d=2):
        return f"{100 * r['gap']:+.{d}f} [{100 * r['lo']:+.{d}f}, {100 * r['hi']:+.{d}f}]"

    grid = ["| nominal samples | BroRL | ProRL | gap [95% interval] | | optimizer updates | BroRL | ProRL | "
            "gap [95% interval] |", "|---:|---:|---:|---:|---|---:|---:|---:|---:|"]
    for s, u in zip(v["grids"]["cum_nominal_samples"], v["grids"]["cum_nominal_updates"]):
        grid.append(f"| {s['budget']:,.0f} | {s['brorl']:.4f} | {s['prorl']:.4f} | {gap(s)} | | {u['budget']:.0f} | "
                    f"{u['brorl']:.4f} | {u['prorl']:.4f} | {gap(u)} |")
    pak = ["| k | BroRL | ProRL | gap [95% interval] (points) |", "|---:|---:|---:|---:|"]
    for k, r in v["pass_at_k_at_equal_samples"].items():
        pak.append(f"| {k} | {r['brorl']:.3f} | {r['prorl']:.3f} | {gap(r, 1)} |")
    sl, head, mech = v["slopes"], v["gap_at_equal_samples"], v["mechanism"]
    per = sl["prorl"]["per_samples"]

    def slope(r):
        return f"{100 * r['mean']:+.2f} [{100 * r['lo']:+.2f}, {100 * r['hi']:+.2f}]"

    met = {k: "yes" if c["met"] else "no" for k, c in v["conditions"].items()}
    upd = v["grids"]["cum_nominal_updates"][-1]
    arms = {a: float(np.mean([r[a] for r in mech["per_seed"].values()])) for a in ("brorl", "prorl")}
    return {"floor_grid_table": "\n".join(grid), "floor_pass_at_k_table": "\n".join(pak),
            "floor_seeds": v["seeds"], "floor_t": f"{head['t']:.2f}", "floor_df": head["n"] - 1,
            "floor_per": count(per), "floor_budget": count(head["budget"]),
            "floor_slope_prorl": slope(sl["prorl"]), "floor_slope_brorl": slope(sl["brorl"]),
            "floor_gap": iv(head, mean="mean"), "floor_mech": iv(mech, mean="mean"),
            "floor_met_1": met["prorl_stalled"], "floor_met_2": met["brorl_rising"],
            "floor_met_3": met["ahead_at_equal_samples"], "floor_met_4": met["gain_on_rare_side"],
            "floor_outcome": "YES" if v["revives"] else "NO",
            "floor_prorl_hi": pts(sl["prorl"]["hi"]), "floor_prorl_climb": pts(sl["prorl"]["hi"] * head["budget"] / per,
                                                                            sign=False),
            "floor_brorl_hi": pts(sl["brorl"]["hi"]), "floor_brorl_climb": pts(sl["brorl"]["hi"] * head["budget"] / per,
                                                                            sign=False),
            "floor_brorl_mean": pts(sl["brorl"]["mean"]), "floor_mde": pts(head["mde"], sign=False),
            "floor_mde_power": pts(head["mde_power"], sign=False), "floor_updates": f"{upd['budget']:.0f}",
            "floor_updates_gap": iv(upd), "floor_prompts": mech["prompts"],
            "floor_lowered_brorl": pts(-arms["brorl"], sign=False), "floor_lowered_prorl": pts(-arms["prorl"], sign=False),
            "floor_sd": pts(head["sd"], sign=False), "floor_seeds_needed": _seeds_needed(head["sd"])}


# ---- the frontier (docs/results/frontier.md): the pre-registered study's ledger, as far as it has run -----------------
FRONTIER_LEDGER = f"{FIG}/frontier"


def frontier_files(root: Path = ROOT) -> tuple[str, ...]:
    """The frontier's declaration and every ledger file committed so far (one per finished arm x seed), plus the lr
    picks once the pilot is complete."""
    ledger = Path(root) / FRONTIER_LEDGER
    runs = sorted(str(q.relative_to(root)) for q in ledger.glob("*/*_s*.parquet"))
    picks = [str(q.relative_to(root)) for q in sorted(ledger.glob("*/lr_picks.csv"))]
    noise = sorted(str(q.relative_to(root)) for q in (ledger / "noise").glob("*-n*.csv"))
    return (f"{FRONTIER_LEDGER}/declaration.json", *runs, *picks, *noise)


def frontier_complete(root: Path = ROOT, stage: str = "ratio") -> list[str]:
    """The branch points whose ``stage`` runs are all in the ledger (every arm x seed of the declaration): only these
    are read (the reading is declared for a complete stage)."""
    decl = json.loads((Path(root) / FRONTIER_LEDGER / "declaration.json").read_text())
    design = decl["designs"]["fixed_batch" if stage == "fixed" else "ratio"]
    shared = decl.get("fixed_batch_shared", {}).get("arms", []) if stage == "fixed" else []

    def have(a: str) -> set:  # a shared fixed-batch arm's runs are the ratio stage's
        return {q.name for q in (Path(root) / FRONTIER_LEDGER / ("ratio" if a in shared else stage)).glob("*_s*.parquet")}

    return [b for b in decl["branch_points"] if all(f"{b}-{a}_s{s}.parquet" in have(a) for a in design
                                                     for s in decl["stages"][stage]["seeds"])]


def _frontier_runs(f: Files, stage: str, branch: str) -> pd.DataFrame:
    names = [n for n in frontier_files(f.root) if n.split("/")[-2] == stage and Path(n).name.startswith(f"{branch}-")
             and n.endswith(".parquet")]
    return pd.concat([f(n) for n in names], ignore_index=True)


_READINGS: dict[tuple[int, str], object] = {}  # one render's frontier readings, by Files and what is read


def _frontier_reading(f: Files, branch: str) -> dict:
    """:func:`~brorl_lab.study.frontier.ratio_reading` of one complete branch point, computed once a render (the
    page's tables, its figure and the README's row all read it)."""
    from brorl_lab.study import frontier as FR

    key = (id(f), branch)
    if key not in _READINGS:
        decl = f(f"{FRONTIER_LEDGER}/declaration.json")
        _READINGS[key] = FR.ratio_reading(_frontier_runs(f, "ratio", branch), decl["budget"]["marks"][branch],
                                          metric=decl["evaluation"]["metric"])
    return _READINGS[key]


def _best_n_rows(points: pd.DataFrame, table: pd.DataFrame, axis: str) -> list[str]:
    """One markdown row per mark: where the runs' evaluations that read it lay (the first at or past the mark), each
    arm's mean held-out pass@1 (%), the best N's reading, and the leader minus each other arm in points with its
    paired 95% t interval."""
    from brorl_lab.study import frontier as FR

    arms = sorted(points["arm"].unique(), key=FR.arm_n)
    head = (f"| {AXIS_NAMES[axis]} (mark) | measured at (runs' range) | "
            + " | ".join(f"N={FR.arm_n(a)} (%)" for a in arms) + " | best N | leader - other, points [95% t] |")
    rows = [head, "|---:|---:|" + "---:|" * len(arms) + "---|---|"]
    num = lambda v: count(v) if v >= 100 else f"{v:.3g}"  # noqa: E731 - one format for this table
    for r in table.itertuples():
        g = points[(points["mark"] == r.mark) & points["value"].notna()]
        means = g.groupby("arm")["value"].mean()
        gaps = "; ".join(f"- N={FR.arm_n(o)}: {pts(getattr(r, f'gap_{o}'))} [{pts(getattr(r, f'lo_{o}'))}, "
                         f"{pts(getattr(r, f'hi_{o}'))}]" for o in arms if o != r.leader and hasattr(r, f"gap_{o}"))
        cells = " | ".join(f"{100 * means[a]:.1f}" if a in means else "-" for a in arms)
        rows.append(f"| {num(r.mark)} | {num(g['x'].min())}-{num(g['x'].max())} | {cells}"
                    + f" | {r.reading} | {gaps} |")
    return rows


def frontier_ratio_text(f: Files) -> str:
    """The frontier section: per branch point whose ratio runs are complete, the best N at every mark on each of the
    four axes and the protocol's checks; a line saying what is still running otherwise."""
    from brorl_lab.study import frontier as FR

    done = frontier_complete(f.root)
    if not done:
        return ("No branch point has all its `ratio` runs yet: the frontier is read per branch point once every arm x "
                "seed of it is in the ledger (the stages table above counts them).")
    out = []
    for b in done:
        r = _frontier_reading(f, b)
        c = r["checks"]
        out += [f"### From the {b} branch point", "",
                f"![{b}: held-out pass@1 against generated samples, a dot per seed; the best N per budget]"
                f"(../../{FIG}/frontier_{b}.png)", "",
                "The protocol as run (per arm, over its seeds: optimizer updates at the end of the run, generated "
                "samples per update pooled, the share of steps on which the refill cap bound and on which the KL to "
                "the reference stayed within the collapse rule's bound):", "",
                "| arm | seeds | updates at the budget (min-max) | generated samples per update | cap bound on | KL "
                "within bound on |", "|---|---:|---:|---:|---:|---:|"]
        out += [f"| {a.arm} | {a.seeds} | {a.updates_min}-{a.updates_max} | {count(a.samples_per_update)} | "
                f"{100 * a.cap_hit_share:.1f}% of {a.steps} steps | {100 * a.kl_within_share:.0f}% |"
                for a in c.itertuples()]
        for axis in FR.AXES:
            ax = r["axes"][axis]
            if not len(ax["table"]):
                continue
            out += ["", f"At equal {AXIS_NAMES[axis]} ({frontier_summary(ax['table'], ax['points']['arm'].unique())}):",
                    ""] + _best_n_rows(ax["points"], ax["table"], axis)
        out.append("")
    return "\n".join(out).rstrip("\n")


def frontier_summary(table: pd.DataFrame, arms: Sequence[str]) -> str:
    """In words, from one axis's :func:`~brorl_lab.study.frontier.frontier_table`: which N led at how many marks,
    and per other arm at how many marks its paired interval against the leader lay wholly behind (resolved) or
    contained 0 (not separated). Every clause is a count of intervals."""
    from brorl_lab.study import frontier as FR

    led = table["leader_n"].value_counts()
    parts = [f"N={n} led at {k} of {len(table)} marks" for n, k in sorted(led.items(), key=lambda x: -x[1])]
    for a in sorted(arms, key=FR.arm_n):
        col = table.get(f"lo_{a}")
        if col is None:
            continue
        behind, tied = int((col > 0).sum()), int((col <= 0).sum())
        parts.append(f"N={FR.arm_n(a)} behind the leader at {behind} (leader - N={FR.arm_n(a)} interval above 0), "
                     f"not separated at {tied}")
        if col.notna().sum() < len(table):
            parts[-1] += f", itself leading at {len(table) - int(col.notna().sum())}"
    return "; ".join(parts)


def frontier_headline(f: Files) -> str:
    """The README's frontier rows, one per branch point whose ratio runs are complete ("" while none is): where the
    best N was resolved along the declared budget marks of generated samples, and the reading at the budget."""
    from brorl_lab.study import frontier as FR

    rows = []
    for b in frontier_complete(f.root):
        r = _frontier_reading(f, b)
        t, pts_ = r["axes"]["cum_samples"]["table"], r["axes"]["cum_samples"]["points"]
        won = {}
        for x in t[t["resolved"]].itertuples():
            won.setdefault(x.leader_n, []).append(count(x.mark))
        where = "; ".join(f"N={n} best at {len(m)} of {len(t)} marks ({', '.join(m)})" for n, m in sorted(won.items()))
        last = t.iloc[-1]
        gaps = "; ".join(f"N={last['leader_n']} - N={FR.arm_n(o)}: {pts(last[f'gap_{o}'])} [{pts(last[f'lo_{o}'])}, "
                         f"{pts(last[f'hi_{o}'])}]" for o in sorted(pts_["arm"].unique(), key=FR.arm_n)
                         if o != last["leader"])
        rows.append(f"| which N wins as the budget grows (BroRL's N=512 over ProRL's N=16, read as IsoCompute's frontier) | "
                    f"the rollout frontier from the {b} branch point: N in "
                    f"{', '.join(str(n) for n in sorted(FR.arm_n(a) for a in pts_['arm'].unique()))}, fill-to-full "
                    f"refills, each arm at its piloted lr, {int(pts_['seed'].nunique())} paired seeds, "
                    f"{len(t)} budget marks of generated samples ({frontier_summary(t, pts_['arm'].unique())}); "
                    f"the declared reading: {where or 'no mark resolved'}; at the budget ({count(last['mark'])}): "
                    f"**{last['reading']}**{''.join('; ' + c for c in [noise_clause(f, b)] if c)} | "
                    f"{gaps} points | [frontier](docs/results/frontier.md) |\n")
    return "".join(rows)


def _per_update(f: Files, branch: str) -> tuple[str, str, pd.DataFrame, dict]:
    """(largest-N arm, smallest-N arm, :func:`brorl_lab.study.frontier.per_update_reading`'s table and sizing) on a
    complete branch point's optimizer-updates axis, at the declared per_update_gap's level and effect."""
    from brorl_lab.study import frontier as FR

    gap = f(f"{FRONTIER_LEDGER}/declaration.json")["readings"]["per_update_gap"]
    pts_ = _frontier_reading(f, branch)["axes"]["cum_updates"]["points"]
    large, small = max(pts_["arm"].unique(), key=FR.arm_n), min(pts_["arm"].unique(), key=FR.arm_n)
    t, sized = FR.per_update_reading(pts_, large=large, small=small, level=gap["level"], effect=gap["effect"])
    return large, small, t, sized


SIDES = ("ahead", "behind", "not resolved")  # an interval [lo, hi] above 0, below 0, holding it


def _side(lo: float, hi: float, words: Sequence[str] = SIDES) -> str:
    """Where one interval [lo, hi] lies: ``words[0]`` above 0, ``words[1]`` below 0, ``words[2]`` holding it."""
    return words[0] if lo > 0 else words[1] if hi < 0 else words[2]


def _tally(lo: pd.Series, hi: pd.Series, words: Sequence[str] = SIDES) -> str:
    """How many intervals [lo, hi] lie above 0, below 0, or hold it, as "ahead at 3, not resolved at 5" (empty
    counts left out)."""
    counts = (int((lo > 0).sum()), int((hi < 0).sum()), int(((lo <= 0) & (hi >= 0)).sum()))
    return ", ".join(f"{w} at {n}" for w, n in zip(words, counts) if n)


def frontier_per_update_headline(f: Files) -> str:
    """The README's per-update rows, one per complete branch point ("" while none is): the declared per_update_gap
    reading (:func:`brorl_lab.study.frontier.per_update_reading`) tallied over the updates marks, and the gap at the
    last one."""
    from brorl_lab.study import frontier as FR

    rows = []
    for b in frontier_complete(f.root):
        large, small, t, _ = _per_update(f, b)
        if t.empty:
            continue
        tally = _tally(t["lo"], t["hi"])
        last = t.iloc[-1]
        rows.append(f"| each update gains more at large N (Theorem 1), carried to many steps | the rollout frontier from "
                    f"the {b} branch point at equal optimizer updates, N={FR.arm_n(large)} against N={FR.arm_n(small)}"
                    f", each at its piloted lr, {int(last['n'])} paired seeds, {len(t)} updates marks: "
                    f"N={FR.arm_n(large)} {tally} | {pts(last['gap'])} [{pts(last['lo'])}, {pts(last['hi'])}] points "
                    f"at {count(last['mark'])} updates | [frontier](docs/results/frontier.md#the-per-update-question-"
                    f"item-5-theorem-1s-claim-carried-to-many-steps) |\n")
    return "".join(rows)


def frontier_png(f: Files, branch: str) -> bytes:
    """Left: held-out pass@1 against generated samples, per arm the mean over seeds and a dot per seed at each
    mark. Right: the leading N at each mark, filled where the reading resolved it (every paired interval above 0)."""
    from brorl_lab.study import frontier as FR

    r = _frontier_reading(f, branch)
    pts_, table = r["axes"]["cum_samples"]["points"], r["axes"]["cum_samples"]["table"]
    arms = sorted(pts_["arm"].unique(), key=FR.arm_n)

    def draw(fig):
        ax = fig.add_subplot(1, 2, 1)
        for k, a in enumerate(arms):
            g = pts_[(pts_["arm"] == a) & pts_["value"].notna()]
            shift = 1 + 0.06 * (k - (len(arms) - 1) / 2)
            ax.scatter(g["mark"] * shift, 100 * g["value"], s=7, alpha=0.45, color=f"C{k}")
            m = g.groupby("mark")["value"].mean()
            ax.plot(m.index * shift, 100 * m.values, "-o", ms=3, color=f"C{k}", label=f"N={FR.arm_n(a)}")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("generated samples (mark)")
        ax.set_ylabel("held-out pass@1 (%)")
        ax.legend(frameon=False, fontsize=8)
        bx = fig.add_subplot(1, 2, 2)
        for resolved, face in ((True, "black"), (False, "none")):
            t = table[table["resolved"] == resolved]
            bx.scatter(t["mark"], t["leader_n"], s=30, facecolors=face, edgecolors="black",
                       label="resolved" if resolved else "leader, not resolved")
        bx.set_xscale("log", base=2)
        bx.set_yscale("log", base=2)
        ns = [FR.arm_n(a) for a in arms]
        bx.set_yticks(ns, [str(n) for n in ns])
        bx.set_ylim(min(ns) / 1.6, max(ns) * 1.6)
        bx.set_xlabel("generated samples (mark)")
        bx.set_ylabel("best N")
        bx.legend(frameon=False, fontsize=8)
        fig.suptitle(f"The rollout frontier from the {branch} branch point ({int(pts_['seed'].nunique())} seeds)")
        fig.tight_layout()

    return _png(draw, (9.0, 3.6))


def frontier_per_update_text(f: Files) -> str:
    """The per-update question per complete branch point (:func:`brorl_lab.study.frontier.per_update_reading` on the
    reading's optimizer-updates axis): BroRL's shape minus ProRL's at each updates mark, and the seeds its spread
    needs for the declared gap at 80% power."""
    from brorl_lab.study import frontier as FR

    gap = f(f"{FRONTIER_LEDGER}/declaration.json")["readings"]["per_update_gap"]
    out = []
    for b in frontier_complete(f.root):
        large, small, t, sized = _per_update(f, b)
        if t.empty:
            out += [f"### From the {b} branch point", "", "Fewer than 2 paired seeds at every updates mark: not read.",
                    ""]
            continue
        out += [f"### From the {b} branch point", "",
                f"| optimizer updates (mark) | N={FR.arm_n(large)} - N={FR.arm_n(small)}, points [95% t] | pairs | "
                f"N={FR.arm_n(large)} per update |", "|---:|---:|---:|---|"]
        out += [f"| {count(r.mark)} | {pts(r.gap)} [{pts(r.lo)}, {pts(r.hi)}] | {r.n} | {_side(r.lo, r.hi)} |"
                for r in t.itertuples()]
        out += ["", f"The per-seed gaps at the last mark ({count(t['mark'].iloc[-1])} updates) have an sd of "
                    f"{100 * sized['sd']:.2f} points over {sized['from_seeds']} seeds: a gap of "
                    f"{100 * gap['effect']:.1f} points at {100 * gap['power']:.0f}% power needs {sized['seeds']} seeds "
                    f"(`{gap['seeds_rule'].rsplit('.', 1)[-1]}`).", ""]
    return "\n".join(out).rstrip("\n") or "No branch point has all its `ratio` runs yet."


def _stage_runs(f: Files, stage: str, branch: str, arms: Sequence[str] = (), seeds: Sequence[int] = ()) -> pd.DataFrame:
    """The ledger runs of ``stage`` at ``branch``; with ``arms``/``seeds``, only those (a shared arm's or the paired
    primary runs of an ablation's seeds)."""
    df = _frontier_runs(f, stage, branch)
    if arms:
        df = df[df["arm"].isin([f"{branch}-{a}" for a in arms])]
    return df[df["seed"].isin(seeds)] if seeds else df


def frontier_fixed_text(f: Files) -> str:
    """The fixed-batch design (stage 'fixed') per complete branch point: the declared ``fixed_batch`` reading
    (:func:`brorl_lab.study.frontier.ratio_reading` on its runs and the shared arms' ratio runs of its seeds), the
    best N at each budget mark of generated samples."""
    from brorl_lab.study import frontier as FR

    decl = f(f"{FRONTIER_LEDGER}/declaration.json")
    seeds, shared = decl["stages"]["fixed"]["seeds"], decl.get("fixed_batch_shared", {}).get("arms", [])
    out = []
    for b in frontier_complete(f.root, "fixed"):
        df = pd.concat([_stage_runs(f, "fixed", b, seeds=seeds), _stage_runs(f, "ratio", b, shared, seeds)],
                       ignore_index=True)
        ax = FR.ratio_reading(df, decl["budget"]["marks"][b], metric=decl["evaluation"]["metric"])["axes"]["cum_samples"]
        out += [f"### From the {b} branch point", "",
                f"At equal generated samples ({frontier_summary(ax['table'], ax['points']['arm'].unique())}):", ""]
        out += _best_n_rows(ax["points"], ax["table"], "cum_samples") + [""]
    return "\n".join(out).rstrip("\n") or "No branch point has all its `fixed` runs yet."


def frontier_capped_text(f: Files) -> str:
    """The refill cap's ablation (stage 'capped') per complete branch point: the declared ``capped`` reading
    (:func:`brorl_lab.study.frontier.capped_reading`), per arm and budget mark capped minus fill-to-full with its
    paired interval, and the share of steps on which each protocol's cap bound."""
    from brorl_lab.study import frontier as FR

    decl = f(f"{FRONTIER_LEDGER}/declaration.json")
    seeds = decl["stages"]["capped"]["seeds"]
    out = []
    for b in frontier_complete(f.root, "capped"):
        t = FR.capped_reading(_stage_runs(f, "capped", b), _stage_runs(f, "ratio", b, seeds=seeds),
                              marks=decl["budget"]["marks"][b], metric=decl["evaluation"]["metric"])
        out += [f"### From the {b} branch point", "",
                "| arm | generated samples (mark) | capped - fill-to-full, points [95% t] | pairs | reading | cap bound "
                "on: capped / fill-to-full |", "|---|---:|---:|---:|---|---:|"]
        out += [f"| {r.arm} | {count(r.mark)} | {pts(r.gap)} [{pts(r.lo)}, {pts(r.hi)}] | {r.n} | "
                f"{_side(r.lo, r.hi, ('capped ahead', 'capped behind', 'not resolved'))} | "
                f"{100 * r.cap_bound_capped:.1f}% / {100 * r.cap_bound_fill:.1f}% |" for r in t.itertuples()]
        out.append("")
    return "\n".join(out).rstrip("\n") or "No branch point has all its `capped` runs yet."


RACE_UNITS = {"cum_samples": ("generated samples", count), "cum_updates": ("optimizer updates", count),
              "cum_wall_s": ("wall seconds", lambda v: f"{v:,.0f}")}


def _race(f: Files) -> Optional[tuple]:
    """(the declared race, the reference arm, :func:`brorl_lab.study.frontier.race_table`'s two tables) of the
    complete takeoff ratio stage, once a render (kept in :data:`_READINGS`, cleared by every render; the page's
    section and the README's row read it); None before."""
    from brorl_lab.study import frontier as FR

    key = (id(f), "race")
    if key not in _READINGS:
        _READINGS[key] = None
        if "takeoff" in frontier_complete(f.root):
            decl = f(f"{FRONTIER_LEDGER}/declaration.json")
            race = decl["readings"]["race"]
            t = FR.split_arm(_frontier_runs(f, "ratio", "takeoff"))
            reference = min(t["arm"].unique(), key=FR.arm_n)
            _READINGS[key] = (race, reference, *FR.race_table(
                t, reference=reference, level=race["level"], budget=decl["budget"]["per_branch"]["takeoff"],
                metric=f"eval/{race['family']}/pass@1"))
    return _READINGS[key]


def frontier_race_headline(f: Files) -> str:
    """The README's takeoff race row once the takeoff ratio stage is complete ("" before): on generated samples, the
    seeds each arm reached the level in and each arm's restricted mean gap to N=16 with its interval, or that the race
    does not read (N=16 short of the declared share)."""
    from brorl_lab.study import frontier as FR

    got = _race(f)
    if got is None:
        return ""
    race, reference, table, _ = got
    s = table[table["x"] == "cum_samples"].assign(n_arm=lambda d: d["arm"].map(FR.arm_n)).sort_values("n_arm")
    first = s.iloc[0]
    n_ref, level = FR.arm_n(reference), f"+{100 * race['level']:.0f}"
    reached = ", ".join([f"N={n_ref} {int(first['reached_reference'])} of {int(first['n'])}"]
                        + [f"N={r.n_arm} {r.reached_arm} of {r.n}" for r in s.itertuples()])
    if not first["resolved"]:
        verdict = (f"not read: N={n_ref} reached it in {100 * first['reference_share']:.0f}% of seeds, short of the "
                   f"declared {100 * race['resolved_share']:.0f}%")
    else:
        verdict = "; ".join(f"N={r.n_arm} {_side(r.lo, r.hi, ('later', 'sooner', 'not separated'))}"
                            for r in s.itertuples())
    gaps = "; ".join(f"N={r.n_arm} - N={n_ref}: {count(r.restricted_mean_gap)} [{count(r.lo)}, {count(r.hi)}]"
                     for r in s.itertuples())
    return (f"| how fast each N takes off from a base that rarely solves the task | the takeoff race from the takeoff "
            f"branch point: generated samples until held-out pass@1 on {race['family']} rose {level} points, censored "
            f"at the budget ({count(first['horizon'])}), {int(first['n'])} paired seeds; seeds that reached it: "
            f"{reached}; against N={n_ref}: **{verdict}** | "
            f"{gaps} generated samples (restricted mean) | [frontier](docs/results/frontier.md#the-takeoff-race-item-4) |\n")


def frontier_race_text(f: Files) -> str:
    """The takeoff race (item 4; the declaration's ``race`` reading) once every takeoff ``ratio`` run is in the
    ledger: per axis (:func:`brorl_lab.study.frontier.race_table`) each arm against N=16, the seeds that reached the
    level, who got there first, the restricted mean time gap with its paired t interval and whether the race reads
    (N=16 reached it in the declared share of seeds); then each seed's time on every axis, censored ones marked."""
    from brorl_lab.study import frontier as FR

    got = _race(f)
    if got is None:
        return "Read once every takeoff `ratio` run is in the ledger (the stages table above counts them)."
    race, reference, table, times = got
    n_ref = FR.arm_n(reference)

    def reads(r) -> str:
        return "yes" if r.resolved else f"no: N={n_ref} reached it in {100 * r.reference_share:.0f}% of seeds"

    out = [f"| axis (censored at) | arm | reached +{100 * race['level']:.0f} points: arm / N={n_ref} | first: arm / "
           f"N={n_ref} / ties | restricted mean time, arm - N={n_ref} [95% t] | reads |", "|---|---|---:|---:|---:|---|"]
    table = table.assign(order=table["x"].map(FR.RACE_AXES.index), n_arm=table["arm"].map(FR.arm_n))
    for r in table.sort_values(["order", "n_arm"]).itertuples():
        name, fmt = RACE_UNITS[r.x]
        out.append(f"| {name} ({fmt(r.horizon)}) | N={FR.arm_n(r.arm)} | {r.reached_arm} / {r.reached_reference} of "
                   f"{r.n} | {r.first_arm} / {r.first_reference} / {r.ties} | {fmt(r.restricted_mean_gap)} "
                   f"[{fmt(r.lo)}, {fmt(r.hi)}] | {reads(r)} |")
    arms = sorted(times["arm"].unique(), key=FR.arm_n)
    out += ["", f"Each seed's time to +{100 * race['level']:.0f} points (censored: `>` the horizon, never reached "
                "within it):", "", "| axis | seed | " + " | ".join(f"N={FR.arm_n(a)}" for a in arms) + " |",
            "|---|---:|" + "---:|" * len(arms)]
    times = times.assign(order=times["axis"].map(FR.RACE_AXES.index)).sort_values(["order", "seed"])
    for (axis, seed), g in times.groupby(["axis", "seed"], sort=False):
        fmt = RACE_UNITS[axis][1]
        cell = {r.arm: (fmt(r.time) if r.reached else f"> {fmt(r.time)}") for r in g.itertuples()}
        out.append(f"| {RACE_UNITS[axis][0]} | {seed} | " + " | ".join(cell.get(a, "-") for a in arms) + " |")
    return "\n".join(out)


def _groups_per_update(f: Files, branch: str) -> dict[str, float]:
    """{arm: informative groups in one optimizer update} of a complete ratio branch point, pooled over its runs
    (samples trained on per update over N)."""
    from brorl_lab.study import frontier as FR

    t = FR.split_arm(_frontier_runs(f, "ratio", branch))
    ends = t.groupby(["arm", "seed"])[["cum_trained_samples", "cum_updates"]].max().groupby("arm").sum()
    return {a: float(r.cum_trained_samples / r.cum_updates / FR.arm_n(a)) for a, r in ends.iterrows()}


def _noise_files(root: Path) -> list[str]:
    """The noise stage's ledger files among the frontier's files."""
    return [n for n in frontier_files(root) if n.split("/")[-2] == "noise"]


def _noise_points(f: Files) -> pd.DataFrame:
    """:func:`brorl_lab.study.frontier.noise_summary` of the noise ledger's files, with per point ``arm`` (the arm
    measured, or at a branch point the 4:1 arm of that N), ``held`` (the informative groups one update of that arm
    holds, once its branch point's ratio runs are complete, else NaN) and ``side`` (the update below, inside or
    above B_simple's interval, or "-"). Empty without files. Computed once a render (its bootstrap is the costly
    part): the page's table, its clause and the README's row read it."""
    from brorl_lab.study import frontier as FR

    key = (id(f), "noise")
    if key in _READINGS:
        return _READINGS[key]
    names = _noise_files(f.root)
    if not names:
        _READINGS[key] = pd.DataFrame()
        return _READINGS[key]
    summary = FR.noise_summary(pd.concat([f(n) for n in names], ignore_index=True))
    per_update = {b: _groups_per_update(f, b) for b in frontier_complete(f.root)}
    arms, held, side = [], [], []
    for r in summary.itertuples():
        arm = r.where.split("-", 1)[1].rsplit("_s", 1)[0] if "-" in r.where else \
            next((a for a in FR.FRONTIER.arms("ratio") if FR.arm_n(a) == r.N), None)
        h = per_update.get(r.branch, {}).get(arm, np.nan)
        arms.append(arm)
        held.append(h)
        side.append("-" if np.isnan(h) else "below its interval" if h < r.lo else "above its interval" if h > r.hi
                    else "inside its interval")
    _READINGS[key] = summary.assign(arm=arms, held=held, side=side)
    return _READINGS[key]


def frontier_noise_text(f: Files) -> str:
    """The pre-registered noise stage (:func:`_noise_points`): B_simple per point with its interval, and beside it
    the groups one optimizer update of the matching arm holds and where that lies against the interval."""
    from brorl_lab.study import frontier as FR

    summary = _noise_points(f)
    if summary.empty:
        return "No point of the noise stage has been measured yet."
    rows = ["| where | N | q (kept groups) | B_simple, groups [95%] | in rollouts (x N) | in generated samples (x N / q) "
            "| groups in one update of that arm | the update against B_simple |", "|---|---:|---:|---:|---:|---:|---:|---|"]
    for r in summary.itertuples():
        cells = " | ".join(f"{getattr(r, f'b_{u}'):,.0f} [{getattr(r, f'b_{u}_lo'):,.0f}, {getattr(r, f'b_{u}_hi'):,.0f}]"
                           for u in ("groups", "rollouts", "generated"))
        rows.append(f"| {r.where} | {r.N} | {r.q:.3f} | {cells} | {'-' if np.isnan(r.held) else f'{r.held:.0f}'} | "
                    f"{r.side} |")
    missing = len(FR.noise_points(None)) - len(summary[~summary["where"].str.contains("-")])
    note = "" if missing <= 0 else f"\n\n{missing} branch-point point(s) of the stage not measured yet."
    verdicts = [v for b in frontier_complete(f.root) if (v := noise_clause(f, b))]
    return "\n".join(rows) + note + "".join(f"\n\n{v[0].upper()}{v[1:]}." for v in verdicts)


def noise_clause(f: Files, branch: str) -> str:
    """One clause on a complete branch point's noise points ("" without them): how many of its points (the branch
    point and the arms' ends) had the matching arm's update below B_simple's interval, inside it, above it."""
    t = _noise_points(f)
    if t.empty:
        return ""
    t = t[(t["branch"] == branch) & (t["side"] != "-")]
    if t.empty:
        return ""
    tally = ", ".join(f"{w} at {n}" for w, n in (("below", int((t["side"] == "below its interval").sum())),
                                                  ("inside", int((t["side"] == "inside its interval").sum())),
                                                  ("above", int((t["side"] == "above its interval").sum()))) if n)
    below = bool((t["side"] == "below its interval").all())
    return (f"the noise scale from the {branch} branch point: one update of the matching arm held fewer informative "
            f"groups than the lower end of B_simple's 95% interval at every one of its {len(t)} points (branch point "
            f"and arms' ends)"
            if below else f"the noise scale from the {branch} branch point, the matching arm's update against "
            f"B_simple's interval over {len(t)} points: {tally}") + (
        ": in McCandlish et al.'s model (applied by us) every arm trained below its critical batch, where a larger "
        "update batch buys no gain per sample" if below else "")


def frontier_fields(f: Files) -> dict:
    """Per stage: finished of planned arm x seed runs; the lr pilot per branch point, arm and lr at its pilot budget
    (each seed's held-out pass@1, the mean, the share of steps within the KL bound); the picks once made."""
    from brorl_lab.study import frontier as FR

    decl = f(f"{FRONTIER_LEDGER}/declaration.json")
    names = [n for n in frontier_files(f.root) if n.endswith(".parquet")]
    by_stage = {st: [n for n in names if n.split("/")[-2] == st] for st in decl["stages"]}
    pilot_budgets = {"lr_pilot": decl["lr"]["pilot_budget"],
                     "lr_pilot_long": decl["lr"].get("amendment", {}).get("pilot_long_budget", {})}
    pilot_arms = len(decl["designs"]["ratio"]) * len(decl["lr"]["grid"])
    arms_per_design = {"lr_pilot": pilot_arms, "lr_pilot_long": pilot_arms,
                       "ratio": len(decl["designs"]["ratio"]), "capped": len(decl["designs"]["ratio"]),
                       "fixed": len(decl["designs"]["fixed_batch"]) - len(decl.get("fixed_batch_shared", {}).get("arms", []))}
    stages = ["| stage | what | arm x seed runs finished | seeds | their wall time, summed over runs (h) |",
              "|---|---|---:|---|---:|"]
    for st in [st for st in FR.STAGES if st in decl["stages"]]:
        d = decl["stages"][st]
        planned = arms_per_design[st] * len(pilot_budgets.get(st, decl["branch_points"])) * len(d["seeds"])
        hours = sum(float(f.provenance(n).get("wall_s", 0.0)) for n in by_stage[st]) / 3600
        stages.append(f"| `{st}` | {d['what']} | {len(by_stage[st])} of {planned} | {d['seeds'][0]}-{d['seeds'][-1]} "
                      f"| {hours:.2f} |")
    noise = _noise_files(f.root)
    planned_noise = len(FR.noise_points(None)) + len(decl["designs"]["ratio"]) * len(decl["branch_points"])
    noise_h = sum(float(f.provenance(n).get("wall_s", 0.0)) for n in noise) / 3600
    stages.append(f"| `noise-stage` | the noise scale (declared {decl['noise_scale']['declared']}): each branch point at "
                  f"two N, each 4:1 arm's end | {len(noise)} of {planned_noise} points | {decl['noise_scale']['seed']} | "
                  f"{noise_h:.2f} |")
    total_h = sum(float(f.provenance(n).get("wall_s", 0.0)) for n in names + noise) / 3600
    stages.append(f"| all | | | | {total_h:.2f} |")
    pilots = [st for st in FR.PILOT_STAGES if by_stage.get(st)]
    pilot = "No lr pilot run has finished yet." if not pilots else ""
    if pilots:
        rows = ["| stage | branch point | arm | lr | seeds | held-out pass@1 per seed (%) | mean (%) | steps within the "
                "KL bound | optimizer updates per seed |", "|---|---|---|---:|---:|---|---:|---:|---|"]
    for st in pilots:
        df = FR.split_arm(pd.concat([f(n) for n in by_stage[st]], ignore_index=True))
        for b, g in df.groupby("branch", sort=False):
            t = FR.lr_pilot_rows(g, mark=pilot_budgets[st][b], metric=decl["evaluation"]["metric"])
            for (arm, lr), r in t.groupby(["arm", "lr"], sort=False):
                per = ", ".join("-" if np.isnan(v) else f"{100 * v:.1f}" for v in r.sort_values("seed")["value"])
                share = r["kl_within"].sum() / max(r["steps"].sum(), 1)
                updates = ", ".join(str(u) for u in r.sort_values("seed")["updates"])
                rows.append(f"| `{st}` | {b} | {arm} | {lr:g} | {len(r)} | {per} | {100 * r['value'].mean():.1f} | "
                            f"{100 * share:.0f}% of {r['steps'].sum()} | {updates} |")
    if pilots:
        pilot = "\n".join(rows)
    pick_files = [n for n in frontier_files(f.root) if n.endswith("lr_picks.csv")]
    if pick_files:
        picks = ["| stage | branch point | arm | picked lr | its mean pass@1 (%) | BroRL's sqrt rule from the N = 16 "
                 "pick | used by the main stages |", "|---|---|---|---:|---:|---:|---|"]
        for name in pick_files:
            st = name.split("/")[-2]
            for r in f(name).itertuples():
                used = st == "lr_pilot_long" or r.branch not in pilot_budgets["lr_pilot_long"]
                picks.append(f"| `{st}` | {r.branch} | {r.arm} | {r.lr:g} | {100 * r.value:.1f} | "
                             f"{r.sqrt_rule_lr:.2g} | {'yes' if used else 'no: replaced by lr_pilot_long'} |")
        picks = "\n".join(picks)
    else:
        picks = ("Not made yet: `pick_lr` reads the pilot once every run of it has finished (the later stages refuse "
                 "to start before).")
    return {"frontier_stages": "\n".join(stages), "frontier_lr_pilot": pilot, "frontier_picks": picks,
            "frontier_ratio": frontier_ratio_text(f), "frontier_per_update": frontier_per_update_text(f),
            "frontier_race": frontier_race_text(f), "frontier_fixed": frontier_fixed_text(f),
            "frontier_capped": frontier_capped_text(f),
            "frontier_noise": frontier_noise_text(f),
            "frontier_eval": f"{decl['evaluation']['prompts_per_family']} prompts x "
                             f"{decl['evaluation']['samples_per_prompt']} samples per family",
            "frontier_kl_share": f"{100 * decl['lr']['kl_share']:.0f}%"}


# ---- the allocation study (docs/results/allocation.md): its ledger beside the frontier's uniform arms ------------------
ALLOCATION_LEDGER = f"{FIG}/allocation"


def allocation_files(root: Path = ROOT) -> tuple[str, ...]:
    """The allocation study's declaration and every ledger file committed so far (one per finished arm x seed)."""
    ledger = Path(root) / ALLOCATION_LEDGER
    return (f"{ALLOCATION_LEDGER}/declaration.json",
            *sorted(str(q.relative_to(root)) for q in ledger.glob("*/*_s*.parquet")))


def _allocation_complete(f: Files, study=None) -> list[tuple[str, str, object]]:
    """(stage, branch point, its :class:`~brorl_lab.study.allocation.StageReading`) for every stage and branch point
    whose allocation runs and shared uniform runs are all in the ledgers, each stage read once a render (the page's
    tables and the README's row read it)."""
    from brorl_lab.study import allocation as AL

    key = (id(f), "allocation", id(study))
    if key in _READINGS:
        return _READINGS[key]
    decl = f(f"{ALLOCATION_LEDGER}/declaration.json")
    st = dataclasses.replace(study or AL.ALLOCATION, frontier_ledger=str(f.root / FRONTIER_LEDGER))
    seeds = decl["seeds"]
    names = [n for n in allocation_files(f.root) if n.endswith(".parquet")]
    ratio = {Path(n).name for n in frontier_files(f.root) if n.split("/")[-2] == AL.FRONTIER_STAGE}
    out = []
    for stage in AL.STAGES:
        mine = [n for n in names if n.split("/")[-2] == stage]
        finished = {Path(n).name for n in mine}
        done = [b for b in st.frontier.branches
                if all(f"{b}-{st.base_arm}-{stage}_s{s}.parquet" in finished for s in seeds)
                and all(f"{b}-{a}_s{s}.parquet" in ratio for a in st.uniform_arms for s in seeds)]
        if not done:
            continue
        for n in mine:
            f(n)  # read through Files: its provenance is checked with the page's
        r = AL.read_stage(stage, ledger=f.root / ALLOCATION_LEDGER, study=st)
        out += [(stage, b, r) for b in done]
    _READINGS[key] = out
    return out


def allocation_fields(f: Files, study=None) -> dict:
    """Per stage: the allocation arm's finished runs and the shared uniform arms' (from the frontier's ratio ledger);
    per stage and branch point whose runs are all there, THE reading (:func:`brorl_lab.study.allocation.
    allocation_table`: allocation - each uniform arm per mark, paired 95% t) and the allocation summary. ``study``:
    the :class:`~brorl_lab.study.allocation.AllocationStudy` (default the declared one), its frontier ledger under
    ``f.root``."""
    from brorl_lab.study import allocation as AL

    decl = f(f"{ALLOCATION_LEDGER}/declaration.json")
    st = study or AL.ALLOCATION
    seeds = decl["seeds"]
    names = [n for n in allocation_files(f.root) if n.endswith(".parquet")]
    ratio = {Path(n).name for n in frontier_files(f.root) if n.split("/")[-2] == AL.FRONTIER_STAGE}
    table = ["| stage | what | allocation runs finished | uniform runs in the frontier's ledger |", "|---|---|---:|---|"]
    uniform = ", ".join(f"{b} {a}: {sum(f'{b}-{a}_s{s}.parquet' in ratio for s in seeds)} of {len(seeds)}"
                        for b in st.frontier.branches for a in st.uniform_arms)
    for stage in AL.STAGES:
        mine = [n for n in names if n.split("/")[-2] == stage]
        table.append(f"| `{stage}` | {AL.STAGES[stage]} | {len(mine)} of {len(st.frontier.branches) * len(seeds)} | "
                     f"{uniform} |")
    readings = [line for stage, b, r in _allocation_complete(f, study)
                for line in _allocation_branch(r, stage, b, st.uniform_arms)]
    if not readings:
        readings = ["No stage has all its runs at any branch point yet: a stage is read per branch point once its "
                    "allocation arm and both uniform arms have every seed."]
    return {"allocation_stages": "\n".join(table), "allocation_readings": "\n".join(readings).rstrip("\n")}


def allocation_headline(f: Files) -> str:
    """The README's allocation rows, one per branch point where the declared headline stage (``two_stage``) has all
    its runs ("" while none has): how often it beat, lost to or was not resolved against each uniform arm over the
    budget marks, and the declared reading at the budget."""
    from brorl_lab.study import allocation as AL
    from brorl_lab.study import frontier as FR

    rows = []
    for stage, b, r in _allocation_complete(f):
        if stage != AL.HEADLINE_STAGE:
            continue
        t = r.table[r.table["branch"] == b]
        seeds = int(r.points[(r.points["branch"] == b) & (r.points["arm"] == stage)]["seed"].nunique())
        tally = "; ".join(f"against N={FR.arm_n(u)}: {_tally(t[f'lo_{u}'], t[f'hi_{u}'])}"
                          for u in AL.ALLOCATION.uniform_arms)
        last = t.iloc[-1]
        gaps = "; ".join(f"{stage} - N={FR.arm_n(u)}: {pts(last[f'gap_{u}'])} [{pts(last[f'lo_{u}'])}, "
                         f"{pts(last[f'hi_{u}'])}]" for u in AL.ALLOCATION.uniform_arms)
        rows.append(f"| (not BroRL's: the field's next step) spending the step's rollouts per prompt beats uniform N | "
                    f"`{stage}`, Theorem 1's allocator (a probe, a Beta posterior per prompt, the rest placed where it "
                    f"adds the most informative groups) against uniform N at equal generated samples from the {b} "
                    f"branch point, {seeds} paired seeds, {len(t)} budget marks ({tally}); the declared reading at "
                    f"the budget ({count(last['mark'])}): **{last['reading']}** | {gaps} points | "
                    f"[allocation](docs/results/allocation.md) |\n")
    return "".join(rows)


def _allocation_branch(r, stage: str, branch: str, uniform: Sequence[str]) -> list[str]:
    from brorl_lab.study import frontier as FR

    t = r.table[r.table["branch"] == branch]
    p = r.points[r.points["branch"] == branch]
    means = p.groupby(["mark", "arm"])["value"].mean()
    head = ("| generated samples (mark) | " + f"`{stage}` (%) | "
            + " | ".join(f"N={FR.arm_n(u)} (%)" for u in uniform) + " | "
            + " | ".join(f"{stage} - N={FR.arm_n(u)}, points [95% t] (pairs)" for u in uniform) + " | reading |")
    out = [f"### `{stage}` from the {branch} branch point", "", head, "|---:|" + "---:|" * (1 + 2 * len(uniform)) + "---|"]
    for x in t.itertuples():
        cells = [f"{100 * means.get((x.mark, a), float('nan')):.1f}" for a in (stage, *uniform)]
        gaps = [f"{pts(getattr(x, f'gap_{u}'))} [{pts(getattr(x, f'lo_{u}'))}, {pts(getattr(x, f'hi_{u}'))}] "
                f"({getattr(x, f'n_{u}')})" for u in uniform]
        out.append(f"| {count(x.mark)} | " + " | ".join(cells + gaps) + f" | {x.reading} |")
    sm = r.summary[(r.summary["branch"] == branch)] if "branch" in r.summary.columns else r.summary
    out += ["", "What each arm spent its samples on (training steps; every generated group counts, refills included):",
            "", "| arm | seeds | informative groups per 1,000 generated samples [95% t] | N per prompt: mean, max | "
            "groups by the N they were drawn at |", "|---|---:|---:|---:|---|"]
    out += [f"| {a.arm} | {a.seeds} | {1000 * a.informative_per_sample:.2f} [{1000 * a.informative_per_sample_lo:.2f}, "
            f"{1000 * a.informative_per_sample_hi:.2f}] | {a.n_mean:.1f}, {a.n_max} | {_n_histogram(a._asdict())} |"
            for a in sm.itertuples(index=False)]
    from brorl_lab.study.allocation import signal_gaps

    gaps = signal_gaps(r.metrics[r.metrics["branch"] == branch], allocation=stage, uniform=uniform)
    out += ["", "The mechanism the allocator is built for, on the same runs (added after the runs, not in the "
            "declaration): its informative groups per 1,000 generated samples minus each uniform arm's, paired over "
            "seeds, 95% t: " + "; ".join(
                f"{stage} - N={FR.arm_n(g.uniform)}: {1000 * g.gap:+.2f} [{1000 * g.lo:+.2f}, {1000 * g.hi:+.2f}] "
                f"({g.n} pairs: {'more than' if g.lo > 0 else 'fewer than' if g.hi < 0 else 'not resolved against'} "
                f"N={FR.arm_n(g.uniform)}'s)" for g in gaps.itertuples()) + "."]
    return out + [""]


def _n_histogram(row: Mapping) -> str:
    """The non-empty bins of an arm's N-per-prompt histogram (:func:`brorl_lab.study.allocation.allocation_summary`'s
    ``share_n_le_<edge>`` / ``share_n_gt_<edge>``, shares of groups) as "<= 4: 1.2%, 9-16: 77.0%, ..."."""
    edges, cells, lo = [], [], 1
    for key in row:
        if key.startswith("share_n_le_"):
            edges.append((key, int(key.removeprefix("share_n_le_"))))
    for key, edge in sorted(edges, key=lambda e: e[1]):
        share = row[key]
        if share and share > 0:
            pct = f"{100 * share:.1f}%" if share >= 0.0005 else "< 0.1%"
            cells.append(f"{'<= ' + str(edge) if lo == 1 else f'{lo}-{edge}'}: {pct}")
        lo = edge + 1
    tail = [k for k in row if k.startswith("share_n_gt_") and row[k] and row[k] > 0]
    cells += [f"> {k.removeprefix('share_n_gt_')}: {100 * row[k]:.1f}%" for k in tail]
    return ", ".join(cells)


def no_fields(f: Files) -> dict:
    return {}


# ---- the pages ----------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Page:
    """A rendered file: ``path`` (repo-relative), its template, the results files it is built from (named in the
    page's ``<!-- results: -->`` comment and provenance-checked), its fields, the figures it shows (repo path ->
    drawing function) and figures kept as shipped (:data:`FROZEN_FIGURES`)."""

    path: str
    template: str
    files: tuple[str, ...]
    fields: Callable[[Files], dict]
    figures: Mapping[str, Callable[[Files], bytes]] = None
    frozen: tuple[str, ...] = ()


def _paid_png(run: str, title: str) -> Callable[[Files], bytes]:
    return lambda f: gaps_png(f(f"{FIG}/paid_{run}_points.csv"), title)


FLAGSHIP_FILES = tuple(f"{FIG}/{n}" for n in (
    "paid_learned_points.csv", "paid_learned_metrics.parquet", "paid_learned_mechanism.csv",
    "paid_learned_lr_sqrt8_points.csv", "paid_learned_lr_half_points.csv", "paid_learned_pilot_points.csv",
    "paid_takeoff_points.csv", "paid_takeoff_metrics.parquet")) + ("data/learned_plateau/plateau.json",)
REGIME_FILES = tuple(f"{FIG}/regime_{n}" for n in ("map.csv", "seeds.csv", "branch.csv", "drift.csv", "power.csv")
                     ) + (f"{FIG}/regime.json",)
THEOREM_FILES = tuple(f"{FIG}/theorem_on_the_model_{n}.csv" for n in ("summary", "per_seed", "theory"))

PAGES: tuple[Page, ...] = (
    Page("docs/results/flagship.md", "flagship.md.tmpl", FLAGSHIP_FILES, flagship_fields, {
        f"{FIG}/paid_learned_gaps.png": _paid_png("learned", "From the learned plateau: BroRL - ProRL per seed"),
        f"{FIG}/paid_takeoff_gaps.png": _paid_png("takeoff", "From the takeoff base: BroRL - ProRL per seed")}),
    Page("docs/results/regime_map.md", "regime_map.md.tmpl", REGIME_FILES, regime_fields,
         {f"{FIG}/regime_map.png": regime_png}),
    Page("docs/results/theorem.md", "theorem.md.tmpl", THEOREM_FILES, theorem_fields,
         {f"{FIG}/theorem_on_the_model.png": theorem_png}),
    Page("docs/results/paid.md", "paid.md.tmpl", ("data/learned_plateau/plateau.json", "data/takeoff_base/reach.json",
                                                  f"{FIG}/paid_learned_pilot_points.csv",
                                                  f"{FIG}/paid_learned_pilot_verdict.json",
                                                  f"{FIG}/paid_takeoff_pilot_points.csv",
                                                  f"{FIG}/paid_takeoff_pilot_verdict.json"), paid_fields),
    Page("docs/results/plateau.md", "plateau.md.tmpl", ("data/plateau_model/plateau.json",), plateau_fields),
    Page("docs/results/floor.md", "floor.md.tmpl", (f"{FIG}/flagship_verdict.json",), floor_fields,
         {f"{FIG}/flagship_grid_gaps.png": floor_grid_png}, tuple(FROZEN_FIGURES)),
    Page("docs/results/allocation.md", "allocation.md.tmpl", allocation_files(), allocation_fields),
    Page("docs/results/frontier.md", "frontier.md.tmpl", frontier_files(), frontier_fields,
         {f"{FIG}/frontier_{b}.png": (lambda f, b=b: frontier_png(f, b)) for b in frontier_complete()}),
)
README_FILES = FLAGSHIP_FILES + REGIME_FILES + THEOREM_FILES + frontier_files() + allocation_files()


# ---- provenance ---------------------------------------------------------------------------------------------------------------
def check_files(f: Files, names: tuple[str, ...], where: str) -> list[str]:
    """The legacy files among ``names``; raises RenderError for a file that is neither shippable nor in LEGACY."""
    legacy = []
    for n in names:
        if Path(n).name == DECLARATION:
            continue  # the design, not a result: each result's own record names the commit that holds it
        why = is_shippable(f.provenance(n))
        if why and n not in LEGACY:
            raise RenderError(f"{where}: {n} cannot back a shipped page ({'; '.join(why)}); allowed: a record from a "
                              "pre-registered run (study.results.is_shippable), or the file named in render.LEGACY")
        if n in LEGACY:
            legacy.append(n)
    return legacy


def banner(f: Files, legacy: list[str]) -> str:
    """The rendered note on a page built from legacy files: they predate enforced pre-registration; which are dirty."""
    dirty = [n for n in legacy if "-dirty" in str(f.provenance(n).get("commit", ""))]
    text = ("> **Legacy results.** The runs behind this page predate enforced pre-registration (issue 42): their "
            "provenance records carry no start time and no committed declaration, so this page is built from them "
            "only because `brorl_lab/study/render.py` names them in `LEGACY`. ")
    text += ("Records whose commit is `-dirty` (the tree had uncommitted changes when the run wrote them): "
             + ", ".join(f"`{Path(n).name}`" for n in dirty) + ".") if dirty else "No record's commit is `-dirty`."
    return text + "\n"


def _with_banner(text: str, note: str) -> str:
    lines = text.splitlines(keepends=True)
    i = next(k for k, line in enumerate(lines) if line.startswith("# "))
    return "".join(lines[:i + 1]) + "\n" + note + "".join(lines[i + 1:])


# ---- rendering ---------------------------------------------------------------------------------------------------------------
def render_page(f: Files, page: Page) -> dict[str, bytes]:
    """One page and its figures, from the files ``f`` reads (provenance checked first)."""
    legacy = check_files(f, page.files, page.path)
    text = fill((TEMPLATES / page.template).read_text(), page.fields(f), name=page.template)
    text = f"<!-- results: {' '.join(page.files)} -->\n" + text
    if legacy:
        text = _with_banner(text, banner(f, legacy))
    elif page.frozen:
        raise RenderError(f"{page.path}: figures {list(page.frozen)} cannot be redrawn from shipped files; "
                          "allowed only on a legacy page")
    missing = [name for name in page.frozen if not (f.root / name).is_file()]
    if missing:
        raise RenderError(f"{page.path}: frozen figures not found: {missing}")
    return {page.path: text.encode(), **{name: draw(f) for name, draw in (page.figures or {}).items()}}


def render_readme(f: Files) -> dict[str, bytes]:
    """The README with its headline block rendered (the rest of it as it is on disk), and the headline's figure."""
    legacy = check_files(f, README_FILES, README)
    block = fill((TEMPLATES / "readme_headline.md.tmpl").read_text(), readme_fields(f), name="readme_headline.md.tmpl")
    if legacy:
        dirty = sum("-dirty" in str(f.provenance(n).get("commit", "")) for n in legacy)
        block += (f"\n*Legacy results: the runs behind this table predate enforced pre-registration (issue 42); "
                  f"{dirty} of its {len(legacy)} results files carry a `-dirty` commit. Each page names them.*\n")
    readme = (f.root / README).read_text()
    start, end = readme.index(HEADLINE[0]) + len(HEADLINE[0]), readme.index(HEADLINE[1])
    return {README: (readme[:start] + block + readme[end:]).encode(), f"{FIG}/headline.png": headline_png(f)}


def render(root: Optional[Path] = None, only: Optional[set[str]] = None) -> dict[str, bytes]:
    """Every page, figure and the README as rendered from the results files under ``root`` (default: this
    checkout): {repo-relative path: bytes}; ``only``: the pages (and/or README.md) to render, with their figures.
    Reads files only; writes nothing."""
    f = Files(Path(root) if root is not None else ROOT)
    _PAIRED.clear()
    _READINGS.clear()
    out: dict[str, bytes] = {}
    for page in PAGES:
        if only is None or page.path in only:
            out.update(render_page(f, page))
    if only is None or README in only:
        out.update(render_readme(f))
    unread = sorted(set(f.read) - set(README_FILES) - {n for p in PAGES for n in p.files})
    if unread:
        raise RenderError(f"files read but named by no page: {unread}")
    return out


def _changed(rendered: Mapping[str, bytes], root: Optional[Path]):
    """(repo path, rendered bytes, bytes on disk or None) of each rendered file that differs from the one on disk."""
    root = Path(root) if root is not None else ROOT
    for name, data in rendered.items():
        path = root / name
        have = path.read_bytes() if path.is_file() else None
        if have != data:
            yield name, data, have


def differences(rendered: Mapping[str, bytes], root: Optional[Path] = None) -> list[str]:
    """One line per rendered file that differs from the one on disk: for text, its first differing line."""
    out = []
    for name, data, have in _changed(rendered, root):
        if have is None:
            out.append(f"{name}: missing (render writes it)")
        elif name.endswith(".png"):
            out.append(f"{name}: the figure differs from its render ({len(have)} bytes on disk, {len(data)} rendered)")
        else:
            a, b = have.decode().splitlines(), data.decode().splitlines()
            k = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            shipped = a[k] if k < len(a) else "<end of file>"
            want = b[k] if k < len(b) else "<end of file>"
            out.append(f"{name}:{k + 1}: shipped {shipped[:120]!r}; rendered {want[:120]!r}")
    return out


def write(rendered: Mapping[str, bytes], root: Optional[Path] = None) -> list[str]:
    """Write each rendered file that differs from the one on disk; returns the paths written."""
    written = []
    for name, data, _ in list(_changed(rendered, root)):
        path = (Path(root) if root is not None else ROOT) / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        written.append(name)
    return written
