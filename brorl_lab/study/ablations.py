"""The ablations that explain the flagship's result: the BroRL-vs-ProRL branch re-run with one knob changed.

A *variant* is a dict of overrides on the main experiment. Arm keys (:data:`ARM_OPTIONS`: ``lr_scaling``,
``samples_ratio`` and ``<arm>.<field>`` for a cell of the arm table, e.g. ``brorl.prompts_per_step``) change the
arms; any other key is a Config field applied to the base (so to both arms), e.g. ``{"advantage": "grpo"}``. When a
variant changes the BroRL arm's samples per step (``brorl.prompts_per_step``), its BroRL-arm steps and eval interval
are rescaled so that the ProRL arm, and the nominal number of trained samples, stay exactly those of the main
experiment.

Every distinct arm config runs once: a run in ``root`` with the same config (whatever its name, e.g. the main
experiment's ``prorl_s0``) is read back instead of re-run, so the ablations of the BroRL arm share the ProRL arm of
the main experiment. Each variant is then compared to its own ProRL arm at equal generated samples, equal optimizer
updates and equal training wall time (:func:`brorl_lab.study.compare.compare_arms`)::

    variants = ablation_grid(lr_rules=("none", "sqrt_samples"), prompts=(4, 8), advantages=("grpo",))
    df = run_ablations(base, variants, seeds=[0], root="runs/demo/arms", arm_table=table, lr_scaling="none")
    ablation_table(df)            # one row per variant: BroRL - ProRL mean pass@1 at each budget
"""

from __future__ import annotations

import hashlib
import json
import warnings
from collections.abc import Iterable, Mapping, Sequence
from fractions import Fraction
from pathlib import Path

import pandas as pd

from brorl_lab.core.config import Config
from brorl_lab.core.rundir import RunDir
from brorl_lab.core.validation import check_seeds
from brorl_lab.lab.analysis import MEAN
from brorl_lab.study.arms import ARM_FIELDS, HEADLINE_ARMS, arm_configs, label_arm, run_arm
from brorl_lab.study.compare import BUDGET_AXES, compare_arms
from brorl_lab.study.rare import ONLY_LARGE, RARE_FAILURE_MIN_P, RARE_SUCCESS_MAX_P
from brorl_lab.study.recipe import ARM_TABLE, IGNORED_FIELDS

ARM_CELLS = tuple(f"{arm}.{name}" for arm in HEADLINE_ARMS for name in ARM_FIELDS)  # "brorl.prompts_per_step", ...
ARM_OPTIONS = (*ARM_CELLS, "samples_ratio", "lr_scaling")
MAIN = "main"


def ablation_grid(*, lr_rules: Sequence[str] = ("none", "sqrt_samples"), prompts: Sequence[int] = (4, 8),
                  advantages: Sequence[str] = ("grpo",), main_lr: str = "none", main_prompts: int = 4
                  ) -> dict[str, dict]:
    """Variants for :func:`run_ablations`: ``main`` (no overrides: the flagship as configured, whose BroRL arm has
    lr rule ``main_lr`` and ``main_prompts`` prompts per step), every other cell of the grid lr rule x BroRL-arm
    prompts per step, and each estimator in ``advantages`` on both arms of the main setting. Names read as what
    differs from main, e.g. ``"lr_scaling=sqrt_samples, brorl.prompts_per_step=8"``."""
    main = {"lr_scaling": main_lr, "brorl.prompts_per_step": main_prompts}
    out: dict[str, dict] = {MAIN: {}}
    for rule in lr_rules:
        for p in prompts:
            cell = {"lr_scaling": rule, "brorl.prompts_per_step": p}
            if cell != main:
                out[", ".join(f"{k}={v}" for k, v in cell.items() if v != main[k])] = cell
    for adv in advantages:
        out[f"advantage={adv}"] = {"advantage": adv}
    return out


def variant_arms(base: Config, variant: Mapping, **arm_options) -> dict[str, Config]:
    """The two arm configs of one variant (module docstring): ``arm_options`` are the main experiment's
    (:func:`brorl_lab.study.arms.arm_configs`' ``arm_table``, ``samples_ratio``, ``lr_scaling``), the variant's arm
    keys override them (``<arm>.<field>`` a cell of the table), its other keys override ``base``; BroRL-arm steps
    are rescaled when the variant changes the samples-per-step ratio, so the ProRL arm keeps the main experiment's
    steps."""
    unknown = [k for k in variant if k not in ARM_OPTIONS and k not in Config.field_names()]
    if unknown:
        raise ValueError(f"variant: unknown keys {unknown}; allowed: arm options {', '.join(ARM_OPTIONS)} or Config "
                         "fields")
    main = arm_configs(base, **arm_options)
    table = {arm: dict(row) for arm, row in (arm_options.get("arm_table") or ARM_TABLE).items()}
    for key in (k for k in variant if k in ARM_CELLS):
        arm, name = key.split(".")
        table[arm][name] = variant[key]
    opts = {**arm_options, "arm_table": table, **{k: v for k, v in variant.items() if k in ARM_OPTIONS and
                                                  k not in ARM_CELLS}}
    vbase = base.replace(**{k: v for k, v in variant.items() if k not in ARM_OPTIONS})
    arms = arm_configs(vbase, **opts)
    factor = Fraction(main["prorl"].steps, arms["prorl"].steps) if arms["prorl"].steps else Fraction(1)
    if factor != 1:
        fields = {}
        for name in ("steps", "eval_every", "checkpoint_every"):
            v = getattr(vbase, name) * factor
            if v.denominator != 1:
                raise ValueError(f"variant {dict(variant)}: {name}={getattr(vbase, name)} rescaled by {factor} is not "
                                 f"a whole number of BroRL-arm steps; allowed: a base {name} divisible accordingly")
            fields[name] = int(v)
        arms = arm_configs(vbase.replace(**fields), **opts)
    return arms


def _config_key(cfg: Config) -> str:
    d = {k: v for k, v in cfg.to_dict().items() if k not in (*IGNORED_FIELDS, "run_name")}
    return hashlib.sha1(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:10]


def _finished_runs(root: Path) -> dict[str, Path]:
    """{config key: run dir} of the finished runs directly under ``root``."""
    out = {}
    for cfg_path in sorted(root.glob("*/config.yaml")) if root.is_dir() else []:
        run = RunDir(cfg_path.parent)
        try:
            cfg = Config.from_dict(run.read_config())
        except Exception:  # noqa: BLE001 - a foreign or damaged directory is not a run to reuse
            continue
        st = run.read_status()
        if st.get("status") == "finished" and st.get("step") == cfg.steps:
            out.setdefault(_config_key(cfg), cfg_path.parent)
    return out


def run_ablations(base: Config, variants: Mapping[str, Mapping], *, seeds: Iterable[int] = (0,),
                  root: str | Path, progress: bool = True, **arm_options) -> pd.DataFrame:
    """Run both arms of every variant for each seed in ``root`` (resumable; identical configs run once, see the
    module docstring) and return the long metrics table of :func:`brorl_lab.study.arms.run_rollout_scaling` with a
    ``variant`` column (a run shared by several variants appears once per variant)."""
    from tqdm.auto import tqdm

    from brorl_lab.rl.spec import check  # imports torch: only when ablations run

    if not isinstance(variants, Mapping) or not variants:
        raise ValueError("variants: got nothing; allowed: a mapping name -> overrides (see ablation_grid)")
    seeds = check_seeds(seeds)
    root = Path(root)
    plan = []  # (variant, arm, seed, cfg), every config validated before anything runs
    for name, variant in variants.items():
        for arm, cfg in variant_arms(base, variant, **arm_options).items():
            for seed in seeds:
                plan.append((name, arm, seed, check(cfg.replace(seed=seed, run_dir=str(root)))))
    existing = _finished_runs(root)  # read once: runs this call finishes are kept in `done`
    done: dict[str, pd.DataFrame] = {}
    frames = []
    bar = tqdm(plan, desc="ablations", disable=not progress)
    for name, arm, seed, cfg in bar:
        key = _config_key(cfg)
        bar.set_postfix_str(f"{name}: {arm} seed {seed}")
        if key not in done:
            found = existing.get(key)
            cfg = cfg.replace(run_name=found.name if found else f"{arm}_{key}")
            df, finished = run_arm(cfg, progress=progress)
            if not finished:
                warnings.warn(f"run_ablations interrupted in {name} ({arm} seed {seed}); call again to resume",
                              stacklevel=2)
                break
            done[key] = label_arm(df, arm, seed, cfg)
        frames.append(done[key].assign(variant=name))
    bar.close()
    return pd.concat(frames, ignore_index=True)


def ablation_table(df: pd.DataFrame) -> pd.DataFrame:
    """One row per variant: the BroRL arm's settings (N, prompts per step, lr), then for each budget axis
    (generated samples, optimizer updates, training wall time) the mean-over-families pass@1 of each arm at the
    largest budget both reached, the gap BroRL - ProRL in points (0.01 pass@1), and with >= 2 seeds the spread (std)
    of the per-seed gaps. Read a variant against ``main``: which knob closes or opens the gap, and on which axis."""
    if "variant" not in df.columns:
        raise ValueError("df: no 'variant' column; allowed: the DataFrame run_ablations returns")
    rows = []
    for name, g in df.groupby("variant", sort=False):
        bro = g[g["arm"] == "brorl"]
        row = {"variant": name, "N": int(bro["rollouts_per_prompt"].iloc[0]),
               "prompts_per_step": int(bro["prompts_per_step"].iloc[0]), "seeds": int(g["seed"].nunique())}
        if "lr" in bro:
            row["brorl_lr"] = f"{bro['lr'].dropna().max():.3g}"  # a string: tables round floats to 0.0
        for x in BUDGET_AXES:
            if x not in g:
                continue
            m = compare_arms(g.drop(columns="variant"), x)
            m = m[m["family"] == MEAN].iloc[0] if (m["family"] == MEAN).any() else m.mean(numeric_only=True)
            short = x.replace("cum_", "")
            row.update({f"{short}: budget": m["budget"], f"{short}: brorl": m["brorl"], f"{short}: prorl": m["prorl"],
                        f"{short}: gap (points)": 100 * m["gap"], f"{short}: seed spread": 100 * m["gap_spread"]})
        rows.append(row)
    return pd.DataFrame(rows).set_index("variant")


def ablation_figure(table: pd.DataFrame, *, title: str = "Ablations: BroRL − ProRL mean pass@1 at equal budgets"
                    ):
    """Grouped bars from :func:`ablation_table`: per variant, the gap in points at equal generated samples,
    optimizer updates and wall time, with the seed spread as error bars where >= 2 seeds."""
    import plotly.graph_objects as go

    from brorl_lab.lab.plots import PALETTE, X_AXES, empty_figure

    axes = [c[:-len(": gap (points)")] for c in table.columns if c.endswith(": gap (points)")]
    if table.empty or not axes:
        return empty_figure("no ablation results", title=title)
    fig = go.Figure()
    for i, ax in enumerate(axes):
        spread = table.get(f"{ax}: seed spread")
        err = dict(type="data", array=spread.fillna(0).tolist(), visible=True) if spread is not None else None
        fig.add_trace(go.Bar(name=f"equal {X_AXES.get('cum_' + ax, ax)}", x=list(table.index),
                             y=table[f"{ax}: gap (points)"], error_y=err, marker_color=PALETTE[i % len(PALETTE)]))
    fig.add_hline(y=0, line_color="black", line_width=1)
    fig.update_layout(title_text=title, barmode="group", height=420, yaxis_title="gap (points of pass@1)",
                      legend=dict(orientation="h", y=-0.35), margin=dict(t=60, b=40, l=60, r=20))
    return fig


def findings(table: pd.DataFrame, reach: pd.DataFrame | None = None, change: pd.DataFrame | None = None) -> str:
    """Plain-words reading of the ablation table (and, when given, of the mechanism's ``reach_summary`` and
    ``reach_change``), computed from the numbers: each variant's gap against main at equal samples, the setting
    where the BroRL arm does best on each budget, the share of prompts only the large N reaches, and whether
    those prompts are where the BroRL arm gained. Single-seed variants are read against main's seed spread."""
    lines = []
    if MAIN in table.index:
        m = table.loc[MAIN]
        spread = m.get("samples: seed spread")
        noise = f" (main's seed spread {spread:.1f})" if spread is not None and pd.notna(spread) else ""
        lines.append(f"Main setting: BroRL - ProRL = {m['samples: gap (points)']:+.1f} points at equal samples, "
                     f"{m['updates: gap (points)']:+.1f} at equal updates, {m['wall_s: gap (points)']:+.1f} at equal "
                     f"wall time{noise}.")
        for name, r in table.drop(index=MAIN).iterrows():
            d = r["samples: gap (points)"] - m["samples: gap (points)"]
            lines.append(f"{name} ({r['seeds']} seed{'s' * (r['seeds'] != 1)}): {r['samples: gap (points)']:+.1f} "
                         f"points at equal samples ({d:+.1f} vs main), {r['updates: gap (points)']:+.1f} at equal "
                         f"updates.")
    for ax, what in (("samples", "equal samples"), ("updates", "equal updates"), ("wall_s", "equal wall time")):
        col = f"{ax}: gap (points)"
        if col in table and table[col].notna().any():
            best = table[col].idxmax()
            lines.append(f"Best BroRL setting at {what}: {best} ({table.loc[best, col]:+.1f} points).")
    if reach is not None and not reach.empty:
        a = reach[reach["family"] == "all"].iloc[0]
        lines.append(f"Signal: {a['pass_rate_small']:.0%} of groups informative at the small N vs "
                     f"{a['pass_rate_large']:.0%} at the large N; {a[f'share {ONLY_LARGE}']:.0%} of the measured "
                     f"prompts are reached only by the large N, {a['share neither']:.0%} by neither. "
                     f"{a['share rare successes']:.0%} of the prompts have rare successes (0 < p <= "
                     f"{RARE_SUCCESS_MAX_P:.4g}) and {a['share rare failures']:.0%} rare failures "
                     f"({RARE_FAILURE_MIN_P:.4g} <= p < 1).")
    if change is not None and not change.empty:
        only = change[change["reach"] == ONLY_LARGE].set_index("arm")["change"]
        both = change[change["reach"] == "both"].set_index("arm")["change"]
        parts = [f"{arm}: {only.get(arm, float('nan')):+.3f} on '{ONLY_LARGE}' prompts, {both.get(arm, float('nan')):+.3f} "
                 "on prompts both reach" for arm in only.index]
        lines.append("Change of per-prompt pass rate by the end of each arm (seed 0): " + "; ".join(parts) + ".")
    return "\n".join(f"- {line}" for line in lines)
