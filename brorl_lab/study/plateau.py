"""The plateau: the arms' recipe (ProRL v2) at N=16 trained on the default model until held-out pass@1 is flat by a
slope test (:func:`plateau_rule`), gated on the regime BroRL is about (:func:`reach_gate`: >= 30% of training
prompts with 0 < p <= 1/16), saved as the HF checkpoint the BroRL-vs-ProRL branch starts from
(``data/plateau_model``, with ``plateau.json`` and ``PLATEAU.md``). ``python -m brorl_lab plateau`` runs it;
``python -m brorl_lab reach`` measures the rare-success share that chose its family.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import pandas as pd

from brorl_lab.core.config import Config
from brorl_lab.core.paths import DEFAULT_MODEL_DIR, PLATEAU_MODEL_DIR, RUNS_DIR, repo_relative
from brorl_lab.core.rundir import eval_key
from brorl_lab.core.validation import UserError, check_int, is_finite_number, is_int
from brorl_lab.lab.analysis import MEAN, PASS1
from brorl_lab.study.rare import DRAWS, RARE_SUCCESS_MAX_P
from brorl_lab.study.recipe import (
    IGNORED_FIELDS,
    MODEL_ALIASES,
    open_trainer,
    recipe_config,
    resolve_experiment_model,
)

PLATEAU_RECIPE = "prorl_v2"  # the plateau run uses the arms' recipe, so the branch changes nothing but N and prompts
# The rare-success regime at the default model (128 training prompts x 512 draws at T=1, share with 0 < p <= 1/16):
# products_2d 66%, products 29% (its 2-digit half), chain_sum 6%, simple_equations 9%, gcd 7%, spell_backward 8%.
PLATEAU_FAMILIES = ["products_2d"]
# What was tried before this recipe, in words: written into PLATEAU.md when the plateau run uses PLATEAU_FAMILIES.
# The research log lives beside this module as markdown (packaged with it), not in code.
PLATEAU_TRIED = " ".join(re.sub(r"<!--.*?-->", "", Path(__file__).with_name("PLATEAU_TRIED.md").read_text(
    encoding="utf-8"), flags=re.S).split())
# Settings the plateau run overrides in the recipe: resets off, as in every arm (study.arms.arm_configs), and the lr.
# lr 3e-5: at the recipe's 3e-4 (and at 1e-4) 100 steps at N=16 leave under 30% rare-success prompts (PLATEAU_TRIED).
PLATEAU_SETTINGS = dict(reset_every=0, reset_every_samples=0, lr=3e-5)


# ---- the plateau ---------------------------------------------------------------------------------------------------
def plateau_config(**overrides) -> Config:
    """The plateau run: the ProRL recipe on the default model, evaluated on every eval item often enough for the
    plateau rule to see the curve (``steps`` is only a cap; the rule decides when to stop)."""
    base = dict(model="default", steps=800, eval_every=10, eval_prompts=200, eval_samples=32, checkpoint_every=10,
                run_name="plateau", run_dir=str(RUNS_DIR), torch_threads=1, tasks=PLATEAU_FAMILIES,
                **PLATEAU_SETTINGS)
    overrides = {k: v for k, v in overrides.items() if not (k == "tasks" and v is None)}
    return recipe_config(PLATEAU_RECIPE, **{**base, **overrides})


# The plateau rule, fixed before the run (issue 25): over the last WINDOW steps of held-out mean pass@1, the upper
# end of the 95% t interval of the OLS slope is under 0.5 points per 100 steps, and the window's mean is >= start +
# gain. Slopes are in pass@1 per SLOPE_PER steps.
SLOPE_PER = 100
PLATEAU_RULE = dict(window=100, max_slope=0.005, gain=None, level=0.95)


def plateau_rule(steps: Sequence[int], curve: Sequence[float], *, window: int = 100, max_slope: float = 0.005,
                 gain: Optional[float] = None, level: float = 0.95) -> dict:
    """The plateau rule on held-out pass@1 ``curve`` at training ``steps`` (the first entry is the starting
    checkpoint): fit ``curve = a + b * step`` by least squares on the evaluations of the last ``window`` steps
    (step >= last - window) and take the two-sided ``level`` t interval of the slope b with n - 2 degrees of
    freedom (:func:`brorl_lab.lab.stats.ols_slope_interval`, n = evaluations in the window). It fires when

        the curve spans the window (last - first step >= window) and has >= 3 evaluations in it,
        hi(b) * SLOPE_PER < max_slope       (no climb of max_slope pass@1 per 100 steps is compatible with the data)
        mean(window) - curve[0] >= gain      (what was gained first; gain=None: no requirement, a curve stalled
                                             from the start counts: the shipped rule, see PLATEAU.md)

    With the defaults: the 95% interval of the last 100 steps' slope lies below +0.5 points per 100 steps. A slow
    steady climb (the old rule's blind spot: +1.8 points per 100 steps with 1.1-point eval noise) keeps the upper
    end above it. A flat but very noisy curve does not fire either: the interval must be narrow enough to exclude
    the climb, so the evaluation must be precise (many prompts x samples) or frequent. Returns the rule's numbers:
    fired, n, slope, se, t, lo, hi (per SLOPE_PER steps), start, window_mean, gained, window_start, and the arguments.
    """
    from brorl_lab.lab.stats import ols_slope_interval

    check_int("window", window, 1)
    for name, v in (("max_slope", max_slope), ("gain", 0.0 if gain is None else gain)):
        if not is_finite_number(v):
            raise ValueError(f"{name}: got {v!r}; allowed: a finite float (pass@1 units)")
    if not (is_finite_number(level) and 0 < level < 1):
        raise ValueError(f"level: got {level!r}; allowed: a probability in (0, 1)")
    steps, curve = [int(s) for s in steps], [float(c) for c in curve]
    if len(steps) != len(curve):
        raise ValueError(f"steps: got {len(steps)} steps for {len(curve)} evaluations; allowed: one step per evaluation")
    out = dict(window=window, max_slope=max_slope, gain=gain, level=level, per_steps=SLOPE_PER, fired=False, n=0,
               slope=None, se=None, t=None, lo=None, hi=None, start=None, window_mean=None, gained=None,
               window_start=None)
    if not curve:
        return out
    first = steps[-1] - window
    idx = [i for i, s in enumerate(steps) if s >= first]
    fit = ols_slope_interval([steps[i] for i in idx], [curve[i] for i in idx], level=level)
    mean = sum(curve[i] for i in idx) / len(idx)
    out.update(n=fit["n"], t=fit["t"], start=curve[0], window_mean=mean, gained=mean - curve[0],
               window_start=steps[idx[0]],
               **{k: fit[k] * SLOPE_PER for k in ("slope", "se", "lo", "hi")})
    spans = steps[-1] - steps[0] >= window and fit["n"] >= 3
    gained = gain is None or mean - curve[0] >= gain - 1e-12
    out["fired"] = bool(spans and fit["hi"] * SLOPE_PER < max_slope and gained)
    return out


def plateau_reached(steps: Sequence[int], curve: Sequence[float], **rule) -> bool:
    """Whether :func:`plateau_rule` fires on this curve."""
    return plateau_rule(steps, curve, **rule)["fired"]


@dataclass
class PlateauResult:
    """What :func:`train_plateau` did: the eval curve, where it stopped and why, and where the model went."""

    curve: pd.DataFrame  # one row per evaluation: step, cum_samples, eval/<family>/pass@1, eval/mean/pass@1
    steps: int  # training steps done
    plateaued: bool  # the rule fired (False: the step cap was reached first)
    out: Optional[Path]  # the saved HF model directory
    run_dir: Path  # the Trainer run (metrics, checkpoint)
    rule: dict = field(default_factory=dict)  # plateau_rule's numbers at the last evaluation
    gate: dict = field(default_factory=dict)  # reach_gate at the last checkpoint ({} when skipped)
    reach: Optional[pd.DataFrame] = None  # mechanism.reach_summary at the last checkpoint
    rates: Optional[pd.DataFrame] = None  # mechanism.prompt_pass_rates at the last checkpoint (the gate's prompts)
    wall_s: float = 0.0  # this call's wall time (a resumed run counts only its own part)

    @property
    def passed(self) -> bool:
        """The rule fired and the reach gate passed (or was skipped)."""
        return self.plateaued and self.gate.get("passed", True)


def eval_curve(metrics: pd.DataFrame) -> pd.DataFrame:
    """The rows of a metrics table that carry an evaluation, with step, samples and the pass@1 columns."""
    cols = [c for c in metrics.columns if c.startswith("eval/") and c.endswith(f"/{PASS1}")]
    if not cols:
        return pd.DataFrame(columns=["step", "cum_samples", f"eval/{MEAN}/{PASS1}"])
    keep = ["step"] + [c for c in ("cum_samples", "cum_wall_s") if c in metrics.columns] + cols
    return metrics.loc[metrics[f"eval/{MEAN}/{PASS1}"].notna(), keep].reset_index(drop=True)


# The reach gate (issue 25): the branch point must sit in the regime BroRL is about. Measured on GATE_PROMPTS training
# prompts (drawn as training draws them, seed GATE_SEED) x GATE_DRAWS samples at the training sampler.
GATE = dict(min_share=0.30, max_p=RARE_SUCCESS_MAX_P)
GATE_PROMPTS, GATE_DRAWS, GATE_SEED = 128, DRAWS, 12345  # DRAWS: study.rare's (the BroRL arm's N)


def reach_gate(rates: pd.DataFrame, *, min_share: float = 0.30, max_p: float = RARE_SUCCESS_MAX_P) -> dict:
    """The reach gate on a :func:`brorl_lab.study.mechanism.prompt_pass_rates` table: the share of prompts with
    *rare successes*, 0 < p <= ``max_p`` (default :data:`brorl_lab.study.rare.RARE_SUCCESS_MAX_P` = 1/16: an N=16
    group of such a prompt is all-wrong with probability (1 - p)^16 >= 0.36), must be >= ``min_share``. Returns
    prompts, share, passed and the arguments."""
    for name, v in (("min_share", min_share), ("max_p", max_p)):
        if not (is_finite_number(v) and 0 <= v <= 1):
            raise ValueError(f"{name}: got {v!r}; allowed: a float in [0, 1]")
    if not isinstance(rates, pd.DataFrame) or "p" not in rates.columns or rates.empty:
        raise ValueError("rates: allowed: a non-empty prompt_pass_rates table (column 'p')")
    share = float(((rates["p"] > 0) & (rates["p"] <= max_p)).mean())
    return dict(prompts=len(rates), share=share, passed=share >= min_share, min_share=min_share, max_p=max_p)


def measure_reach(policy, tokenizer, cfg: Config, *, prompts: int = GATE_PROMPTS, draws: int = GATE_DRAWS,
                  seed: int = GATE_SEED) -> pd.DataFrame:
    """Per-prompt pass rates of ``prompts`` training prompts of ``cfg.tasks`` (mixed as training mixes them) under
    ``policy``, ``draws`` samples each at the training sampler (:func:`~brorl_lab.study.mechanism.prompt_pass_rates`)."""
    from brorl_lab.rl.steps import sample_prompts
    from brorl_lab.study.mechanism import prompt_pass_rates

    check_int("prompts", prompts, 1)
    items = sample_prompts(cfg.tasks, prompts, seed=seed)
    return prompt_pass_rates(policy, tokenizer, items, cfg, draws=draws,
                             chunk_prompts=16)  # not an N: prompts per sampling chunk (it seeds the draws)


def reach_table(model: str, families: Sequence[str], *, prompts: int = GATE_PROMPTS, draws: int = GATE_DRAWS,
                max_p: float = GATE["max_p"]) -> pd.DataFrame:
    """Where ``model`` stands on each family's training prompts: :func:`brorl_lab.study.mechanism.reach_summary` of
    ``prompts`` prompts per family (each family measured alone, as :func:`measure_reach` draws them) x ``draws``
    samples at the plateau recipe's sampler, with the gate's share (``share 0<p<=max_p``) added. What chose the
    plateau's family (``python -m brorl_lab reach``)."""
    return reach_table_of(reach_rates(model, families, prompts=prompts, draws=draws), max_p=max_p)


def reach_rates(model: str, families: Sequence[str], *, prompts: int = GATE_PROMPTS,
                draws: int = GATE_DRAWS) -> pd.DataFrame:
    """The per-prompt pass rates under ``model`` (:func:`~brorl_lab.study.mechanism.prompt_pass_rates`) of
    ``prompts`` training prompts per family, each family measured alone (as :func:`measure_reach` draws them)."""
    from brorl_lab.core.models import load_policy
    from brorl_lab.rollout.tasks import TASKS

    if not is_int(prompts) or prompts < 1:
        raise UserError(f"prompts: got {prompts!r}; allowed: an integer >= 1")
    for fam in families:  # every name checked before any work
        try:
            TASKS.get(fam)
        except ValueError as e:
            raise UserError(f"families: {e}") from None
    cfgs = [plateau_config(model=model, tasks=[fam]) for fam in families]
    policy, tok = load_policy(resolve_experiment_model(model))
    return pd.concat([measure_reach(policy, tok, cfg, prompts=prompts, draws=draws) for cfg in cfgs],
                     ignore_index=True)


def save_reach(out: str | Path, model: str, rates: pd.DataFrame, *, command: Optional[str] = None,
               draws: int = GATE_DRAWS) -> dict:
    """Write where ``model`` stands (its per-prompt ``rates``) into ``out``: branch_rates.csv (every prompt) and
    reach.json (command, model and its weights' sha256, draws, the reach table and the per-prompt p histogram);
    returns the JSON's dict. The record of a branch point that is not a plateau run's (e.g. the takeoff base)."""
    from brorl_lab.study.mechanism import p_histogram

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    path = DEFAULT_MODEL_DIR if model == "default" else Path(resolve_experiment_model(model))
    weights = path / "model.safetensors"
    meta = {"command": command, "model": repo_relative(path) if path.exists() else model,
            "model_sha256": hashlib.sha256(weights.read_bytes()).hexdigest() if weights.is_file() else None,
            "draws": draws, "seed": GATE_SEED, "prompts": len(rates),
            "reach": reach_table_of(rates).to_dict(orient="records"),
            "p_histogram": p_histogram(rates).to_dict(orient="records")}
    rates.to_csv(out / BRANCH_RATES, index=False)
    (out / "reach.json").write_text(json.dumps(meta, indent=1, default=float))
    return meta


def reach_table_of(rates: pd.DataFrame, *, max_p: float = GATE["max_p"]) -> pd.DataFrame:
    """One :func:`~brorl_lab.study.mechanism.reach_summary` row per family of ``rates`` (in their order), with the
    gate's share (``share 0<p<=max_p``) added."""
    from brorl_lab.study.mechanism import reach_summary

    rows = []
    for fam in dict.fromkeys(rates["family"]):
        fam_rates = rates[rates["family"] == fam]
        row = reach_summary(fam_rates).iloc[0].to_dict()
        row[f"share 0<p<={max_p:.4g}"] = reach_gate(fam_rates, max_p=max_p)["share"]
        rows.append(row)
    return pd.DataFrame(rows)


def train_plateau(cfg: Optional[Config] = None, *, out: str | Path | None = PLATEAU_MODEL_DIR,
                  rule: Optional[dict] = None, gate: Optional[dict] = None, gate_prompts: int = GATE_PROMPTS,
                  gate_draws: int = GATE_DRAWS, progress: bool = True, command: Optional[str] = None,
                  tried: Optional[str] = None) -> PlateauResult:
    """Train ``cfg`` (default :func:`plateau_config`) in chunks of ``eval_every`` steps until :func:`plateau_rule`
    (arguments ``rule``, default :data:`PLATEAU_RULE`) fires on held-out mean pass@1 or ``cfg.steps`` is reached,
    then measure the reach gate at that checkpoint (:func:`reach_gate` with ``gate``, default :data:`GATE`, on
    ``gate_prompts`` training prompts x ``gate_draws`` draws; ``gate_prompts=0`` skips it) and save the policy as an HF model
    directory (``save_pretrained`` + tokenizer, safetensors) with PLATEAU.md and plateau.json beside it.

    Resumable: the run lives in ``cfg.run_dir/cfg.run_name`` and is checkpointed at every chunk; calling again
    continues from the last checkpoint (Ctrl-C stops after the current step). Deterministic in ``cfg.seed``.
    """
    import time

    from tqdm.auto import tqdm

    from brorl_lab.study.mechanism import reach_summary

    cfg = plateau_config() if cfg is None else cfg
    if not isinstance(cfg, Config):
        raise ValueError(f"cfg: got {type(cfg).__name__}; allowed: a brorl_lab.Config (see plateau_config)")
    if cfg.eval_every < 1:
        raise UserError(f"cfg.eval_every: got {cfg.eval_every}; allowed: >= 1 (the plateau rule reads the eval curve)")
    rule = {**PLATEAU_RULE, **(rule or {})}
    gate = {**GATE, **(gate or {})}
    plateau_rule([], [], **rule)  # validate the rule's arguments before any work
    check_int("gate_prompts", gate_prompts, 0)
    if out is not None:
        _check_model_out(Path(out))
    t0 = time.perf_counter()
    trainer = open_trainer(cfg, progress=False)
    bar = tqdm(total=cfg.steps, initial=trainer.step_idx, desc="plateau", disable=not progress)
    plateaued = False
    try:
        while True:
            curve = eval_curve(trainer.metrics)
            plateaued = plateau_reached(curve["step"], curve[f"eval/{MEAN}/{PASS1}"], **rule)
            if plateaued or trainer.step_idx >= cfg.steps:
                break
            before = trainer.step_idx
            trainer.run(steps=min(cfg.steps, (before // cfg.eval_every + 1) * cfg.eval_every))
            bar.update(trainer.step_idx - before)
            last = eval_curve(trainer.metrics).iloc[-1]
            bar.set_postfix({"mean pass@1": f"{last[f'eval/{MEAN}/{PASS1}']:.3f}"})
            if trainer.run_dir.read_status().get("status") == "interrupted":  # Ctrl-C: the checkpoint stays
                raise KeyboardInterrupt(f"plateau run interrupted at step {trainer.step_idx}; run again to resume "
                                        f"from {trainer.run_dir.checkpoint_dir}")
        curve = eval_curve(trainer.metrics)
        numbers = plateau_rule(curve["step"], curve[f"eval/{MEAN}/{PASS1}"], **rule)
        res = PlateauResult(curve, trainer.step_idx, plateaued, None, trainer.run_dir.path,
                            {**numbers, "metric": f"eval/{MEAN}/{PASS1}"})
        if gate_prompts:
            rates = measure_reach(trainer.policy, trainer.tokenizer, cfg, prompts=gate_prompts, draws=gate_draws)
            res.gate = {**reach_gate(rates, **gate), "draws": gate_draws, "seed": GATE_SEED}
            res.reach, res.rates = reach_summary(rates), rates
        res.wall_s = time.perf_counter() - t0
        if out is not None:
            if tried is None and list(cfg.tasks) == PLATEAU_FAMILIES:
                tried = PLATEAU_TRIED
            res.out = save_plateau_model(trainer, Path(out), res, command=command, tried=tried)
        return res
    finally:
        bar.close()
        trainer.close()


def _check_model_out(out: Path) -> None:
    if out.exists() and not (out.is_dir() and (not any(out.iterdir()) or (out / "config.json").is_file())):
        raise UserError(f"out: {out} exists and is not an HF model directory; allowed: a new path, an empty "
                         "directory or a model directory to overwrite")


def save_plateau_model(trainer, out: Path, res: PlateauResult, *, command: Optional[str] = None,
                       tried: Optional[str] = None) -> Path:
    """Write the trainer's policy and tokenizer to ``out`` (via a temp dir, then swapped in), plus PLATEAU.md and
    plateau.json (families, seed, steps, the eval curve, the rule's numbers, the reach gate and summary, wall time,
    and ``tried``: what was tried before this recipe, in words)."""
    from brorl_lab.study.mechanism import p_histogram

    _check_model_out(out)
    tmp = out.with_name(out.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    trainer.policy.save_pretrained(tmp, safe_serialization=True)
    trainer.tokenizer.save_pretrained(tmp)
    cfg = trainer.cfg
    base = Path(cfg.model) if cfg.model != "default" else DEFAULT_MODEL_DIR
    weights = base / "model.safetensors"
    meta = {
        "command": command, "out": repo_relative(out),
        "base_model": repo_relative(base) if base.exists() else cfg.model,
        "base_model_sha256": hashlib.sha256(weights.read_bytes()).hexdigest() if weights.is_file() else None,
        "families": list(cfg.tasks), "seed": cfg.seed, "steps": res.steps, "plateaued": res.plateaued,
        "gate_passed": res.passed, "rule": res.rule, "gate": res.gate,
        "reach": [] if res.reach is None else res.reach.to_dict(orient="records"), "wall_s": res.wall_s,
        "optimizer": OPTIMIZER_NOTE, "tried": tried,
        "config": {k: v for k, v in cfg.to_dict().items() if k not in IGNORED_FIELDS},
        "curve": res.curve.to_dict(orient="records"),
    }
    if res.rates is not None:  # the branch point's per-prompt p: histogram in the JSON, every prompt in the CSV
        meta["p_histogram"] = p_histogram(res.rates).to_dict(orient="records")
        res.rates.to_csv(tmp / BRANCH_RATES, index=False)
    (tmp / "plateau.json").write_text(json.dumps(meta, indent=1, default=float))
    (tmp / "PLATEAU.md").write_text(plateau_markdown(meta))
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)
    return out


BRANCH_RATES = "branch_rates.csv"  # per training prompt at the branch point: family, uid, correct (K of 512), p, reach
OPTIMIZER_NOTE = ("The HF checkpoint carries weights only: every run that starts from it (each arm of the branch) "
                  "starts a fresh Adam, so the optimizer is reset in both arms alike; within the plateau run one Adam "
                  "is kept throughout (ProRL v2: no reference/optimizer reset, reset_every=0 as in the arms).")


def plateau_markdown(meta: dict) -> str:
    """PLATEAU.md: command, recipe, the eval curve as a table, the slope rule applied to it, the reach gate and
    summary at the branch point, what was tried, and the wall time."""
    curve = pd.DataFrame(meta["curve"])
    fams = [eval_key(c)[0] for c in curve.columns if c.startswith("eval/") and c.endswith(PASS1)]
    rule, cfg = meta["rule"], meta["config"]
    where = meta.get("out") or "data/plateau_model"
    lines = [f"# {where}: {meta['base_model']} trained with the ProRL v2 recipe until held-out pass@1 stalled",
             "", f"Command: `{meta['command'] or 'python -m brorl_lab plateau'}` (seed {meta['seed']}); wall time "
             f"{meta.get('wall_s', 0) / 60:.1f} min (this call's part, gate measurement included).", "",
             f"Base: {meta['base_model']} (model.safetensors sha256 {meta.get('base_model_sha256')}).", "",
             f"Families: {', '.join(meta['families'])}. Steps: {meta['steps']}. Recipe (config fields): "
             + ", ".join(f"{k}={cfg[k]}" for k in (
                 "rollouts_per_prompt", "prompts_per_step", "optimizer_steps_per_step", "advantage", "eps_low",
                 "eps_high", "kl_beta", "kl_estimator", "reward", "dynamic_sampling", "reset_every",
                 "reset_optimizer", "lr", "temperature", "eval_prompts", "eval_samples", "eval_temperature")) + ".",
             "", f"Optimizer: {meta.get('optimizer') or OPTIMIZER_NOTE}", "",
             f"Held-out pass@1 (frozen eval sets drawn like training, data/eval/README.md; {cfg['eval_prompts']} "
             f"prompts x {cfg['eval_samples']} samples per family, T={cfg['eval_temperature']}):", "",
             "| step | samples | " + " | ".join(fams) + " |", "|---:|---:|" + "---:|" * len(fams)]
    for _, r in curve.iterrows():
        vals = " | ".join(f"{r[f'eval/{f}/{PASS1}']:.4f}" for f in fams)
        lines.append(f"| {int(r['step'])} | {int(r.get('cum_samples', 0)):,} | {vals} |")
    text = (f"\"over the last {rule['window']} steps, the upper end of the {100 * rule['level']:g}% t interval of the "
            f"OLS slope of {rule['metric']} on step is under {100 * rule['max_slope']:g} points per "
            f"{rule['per_steps']} steps" + ("" if rule["gain"] is None else f", and the window's mean is >= the start + "
            f"{100 * rule['gain']:g} points") + "\"")
    if rule.get("slope") is not None and rule.get("hi") is not None and rule["hi"] == rule["hi"]:
        fit = (f"slope {100 * rule['slope']:+.2f} points per {rule['per_steps']} steps, 95% interval "
               f"[{100 * rule['lo']:+.2f}, {100 * rule['hi']:+.2f}] (n={rule['n']} evaluations from step "
               f"{rule['window_start']}, t={rule['t']:.3f} with {rule['n'] - 2} df); window mean "
               f"{rule['window_mean']:.3f} against {rule['start']:.3f} at the start ({100 * rule['gained']:+.1f} points)")
    else:
        fit = "too few evaluations for a slope interval"
    head = ("Why this counts as a plateau" if meta["plateaued"] else "The rule did NOT fire within the step cap: "
            "this checkpoint is not a measured plateau")
    lines += ["", f"{head}. The rule (brorl_lab.study.plateau.plateau_rule) is {text}. At step {meta['steps']}: "
              f"{fit}."]
    gate = meta.get("gate") or {}
    if gate:
        lines += ["", f"Reach gate (brorl_lab.study.plateau.reach_gate): {100 * gate['share']:.1f}% of {gate['prompts']} "
                  f"training prompts ({gate['draws']} draws each at the training sampler, T={cfg['temperature']}) have "
                  f"0 < p <= {gate['max_p']:.4g}; required >= {100 * gate['min_share']:g}%: "
                  f"{'PASSED' if gate['passed'] else 'FAILED'}."]
    if meta.get("reach"):
        rows = pd.DataFrame(meta["reach"])
        cols = [c for c in rows.columns if c != "family"]
        lines += ["", "Reach summary at the branch point (brorl_lab.study.mechanism.reach_summary; shares of prompts):",
                  "", "| family | " + " | ".join(cols) + " |", "|---|" + "---:|" * len(cols)]
        for _, r in rows.iterrows():
            lines.append(f"| {r['family']} | " + " | ".join(
                f"{int(r[c])}" if c == "prompts" else f"{r[c]:.3f}" for c in cols) + " |")
    if meta.get("p_histogram"):
        hist = pd.DataFrame(meta["p_histogram"])
        fam_order = list(dict.fromkeys(hist["family"]))
        wide = hist.pivot(index="bin", columns="family", values="prompts").reindex(
            list(dict.fromkeys(hist["bin"])))[fam_order]
        lines += ["", f"Per-prompt pass rate p at the branch point ({gate.get('draws', GATE_DRAWS)} draws per prompt; "
                  f"every prompt in {BRANCH_RATES}; prompts per bin):", "",
                  "| p | " + " | ".join(fam_order) + " |", "|---|" + "---:|" * len(fam_order)]
        lines += [f"| {b} | " + " | ".join(str(int(v)) for v in r) + " |" for b, r in wide.iterrows()]
    first, last = curve.iloc[0], curve.iloc[-1]
    moves = ", ".join(f"{f} {100 * (last[f'eval/{f}/{PASS1}'] - first[f'eval/{f}/{PASS1}']):+.1f}" for f in fams)
    lines += ["", *([f"What was tried: {meta['tried']}", ""] if meta.get("tried") else []),
              f"Change from the first to the last evaluation, in points (0.01 pass@1): {moves}.", "",
              f"Load it with `Config(model=\"{where}\")` (from the repository root)"
              + "".join(f" or `brorl_lab.study.recipe.recipe_config(model=\"{a}\")`"
                        for a, d in MODEL_ALIASES.items() if repo_relative(d) == where) + ".", ""]
    return "\n".join(lines)
