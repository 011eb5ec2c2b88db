"""BroRL vs ProRL in miniature: a plateaued policy, two arms branched from it, and a verdict computed from the data.

BroRL (arXiv 2510.01180, Sec. 5) starts from a ProRL checkpoint whose progress at N = 16 rollouts per prompt has
slowed, and continues it two ways: the **ProRL arm** keeps N = 16 with 512 prompts per step, the **BroRL arm**
uses N = 512 with 128 prompts per step (8x the samples per step), the same number of optimizer updates per step
and a learning rate scaled by sqrt(samples-per-step ratio). This module does the same at laptop scale:

    cfg = plateau_config()                                  # ProRL recipe at N=16 on the harder families
    res = train_plateau(cfg, out="data/plateau_model")      # train until held-out pass@1 stops improving, save HF dir
    arms = arm_configs(recipe_config(model="plateau"), n_small=16, n_large=512, prompts_small=16)
    df = run_rollout_scaling(recipe_config(model="plateau", steps=8), seeds=[0, 1, 2], root="runs/rs")
    summarize(df)                                           # one row per arm: final pass@1, samples, time, ...
    print(verdict(df))                                      # which arm is ahead, at equal samples and equal time

or from a shell: ``python -m brorl_lab.experiments plateau`` and ``python -m brorl_lab.experiments scaling``.

Budget units: a *sample* is one generated response (prompt x rollout), counted over every dynamic-sampling round
(the metrics' ``cum_samples``); *trained samples* are those that survive the filter (kept groups x N). Wall time is
the Trainer's ``cum_wall_s``: training time with evaluation excluded.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import shutil
import sys
import warnings
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Iterable, Optional, Sequence

import numpy as np
import pandas as pd

from .config import Config
from .models import DEFAULT_MODEL_DIR

REPO = Path(__file__).resolve().parent.parent
PLATEAU_MODEL_DIR = REPO / "data" / "plateau_model"
DEFAULT_ROOT = REPO / "runs" / "rollout_scaling"
ARMS = ("prorl", "brorl")
ARM_NAMES = {"prorl": "ProRL", "brorl": "BroRL"}
MODEL_ALIASES = {"plateau": PLATEAU_MODEL_DIR}
PASS1 = "pass@1"
MEAN = "mean"

# The ProRL recipe at small N (RECIPES.md): GRPO with group-std normalisation, DAPO clip-higher, a k3 KL penalty to
# a reference that is reset (with the optimizer, as in ProRL v1) every `reset_every` steps, dynamic sampling.
# lr and the batch sizes are ours: the tiny default model needs a far larger lr than a 1.5B one.
RECIPE = dict(rollouts_per_prompt=16, prompts_per_step=16, optimizer_steps_per_step=2, advantage="grpo",
              adv_std_norm=True, policy_loss="ppo_clip", loss_agg="token_mean", eps_low=0.2, eps_high=0.28,
              kl_beta=1e-3, kl_estimator="k3", dynamic_sampling=True, max_resample_rounds=4, reset_every=50,
              reset_optimizer=True, temperature=1.0, top_p=1.0, lr=3e-4, template="plain", eval_temperature=0.6,
              eval_top_p=0.95, eval_k=[1], eval_samples=8)


# ---- models and families ---------------------------------------------------------------------------------------------
def resolve_experiment_model(model: str) -> str:
    """``'plateau'`` -> the shipped plateau checkpoint (data/plateau_model, as an absolute path so notebooks running
    in notebooks/ find it); anything else is returned unchanged for :class:`Config` to check."""
    if not isinstance(model, str) or not model.strip():
        raise ValueError(f"model: got {model!r}; allowed: 'plateau', 'default', a local HF model directory or a hub id")
    if model in MODEL_ALIASES:
        path = MODEL_ALIASES[model]
        if not (path / "config.json").is_file():
            raise ValueError(f"model: {model!r} -> {path} has no config.json; build it with "
                             "`python -m brorl_lab.experiments plateau`")
        return str(path)
    return model


def hard_families(report: str | Path | None = None, *, max_pass: float = 0.5, temperature: str = "t1.0") -> list[str]:
    """The families the default model solves only sometimes or rarely: measured pass@1 at the training temperature
    (``training_report.json`` of data/default_model, key ``pass_at_1[temperature]``) in ``(0, max_pass)``.

    Families it never solves give no reward signal even at large N, and those it mostly solves have little left to
    learn; the plateau and the branch experiment train on the ones in between.
    """
    path = Path(report) if report is not None else DEFAULT_MODEL_DIR / "training_report.json"
    if isinstance(max_pass, bool) or not isinstance(max_pass, (int, float)) or not 0 < max_pass <= 1:
        raise ValueError(f"max_pass: got {max_pass!r}; allowed: a float in (0, 1]")
    try:
        table = json.loads(path.read_text())["pass_at_1"]
    except (OSError, ValueError, KeyError) as e:
        raise ValueError(f"report: {path} has no readable pass_at_1 table ({type(e).__name__}: {e}); allowed: a "
                         "training_report.json written by `python -m brorl_lab.train_default`") from e
    if temperature not in table:
        raise ValueError(f"temperature: got {temperature!r}; allowed: {', '.join(table)} (keys of {path})")
    fams = [f for f, p in table[temperature].items() if 0 < p < max_pass]
    if not fams:
        raise ValueError(f"max_pass: no family of {path} has pass@1 in (0, {max_pass}) at {temperature}: "
                         f"{table[temperature]}")
    return fams


def recipe_config(**overrides) -> Config:
    """The ProRL recipe (module constant ``RECIPE``) as a validated Config, with ``overrides`` applied.

    ``model='plateau'`` names the shipped plateau checkpoint; ``tasks`` defaults to the plateau model's families
    (read from its plateau.json) when the model is the plateau checkpoint, else to :func:`hard_families`.
    """
    d = {**RECIPE, **overrides}
    d["model"] = resolve_experiment_model(d.get("model", "default"))
    if "tasks" not in overrides or overrides["tasks"] is None:
        d["tasks"] = plateau_families(d["model"]) or hard_families()
    return Config.from_dict(d)


def plateau_families(model: str) -> Optional[list[str]]:
    """The families a plateau checkpoint was trained on (its plateau.json), or None for any other model."""
    meta = Path(model) / "plateau.json"
    if meta.is_file():
        return list(json.loads(meta.read_text())["families"])
    return None


# ---- the plateau ---------------------------------------------------------------------------------------------------
def plateau_config(**overrides) -> Config:
    """The plateau run: the ProRL recipe on the default model, evaluated on every eval item often enough for the
    plateau rule to see the curve (``steps`` is only a cap; the rule decides when to stop)."""
    base = dict(model="default", steps=400, eval_every=10, eval_prompts=200, checkpoint_every=10,
                run_name="plateau", run_dir=str(REPO / "runs"), torch_threads=1)
    return recipe_config(**{**base, **overrides})


def plateau_reached(curve: Sequence[float], window: int = 5, min_delta: float = 0.01) -> bool:
    """The plateau rule: the last ``window`` evaluations all failed to beat the best earlier one by ``min_delta``.

    ``curve`` is held-out pass@1 at successive evaluations (the first is the starting point). With window 5 and
    min_delta 0.01 (evaluating every 10 steps): no gain of one point or more over the best earlier evaluation in the
    last 50 steps.
    """
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"window: got {window!r}; allowed: an integer >= 1")
    if not (isinstance(min_delta, (int, float)) and math.isfinite(min_delta) and min_delta >= 0):
        raise ValueError(f"min_delta: got {min_delta!r}; allowed: a finite float >= 0")
    curve = [float(c) for c in curve]
    if len(curve) <= window:
        return False
    return max(curve[-window:]) < max(curve[:-window]) + min_delta


@dataclass
class PlateauResult:
    """What :func:`train_plateau` did: the eval curve, where it stopped and why, and where the model went."""

    curve: pd.DataFrame  # one row per evaluation: step, cum_samples, eval/<family>/pass@1, eval/mean/pass@1
    steps: int  # training steps done
    plateaued: bool  # the rule fired (False: the step cap was reached first)
    out: Optional[Path]  # the saved HF model directory
    run_dir: Path  # the Trainer run (metrics, checkpoint)
    rule: dict = field(default_factory=dict)


def eval_curve(metrics: pd.DataFrame) -> pd.DataFrame:
    """The rows of a metrics table that carry an evaluation, with step, samples and the pass@1 columns."""
    cols = [c for c in metrics.columns if c.startswith("eval/") and c.endswith(f"/{PASS1}")]
    if not cols:
        return pd.DataFrame(columns=["step", "cum_samples", f"eval/{MEAN}/{PASS1}"])
    keep = ["step"] + [c for c in ("cum_samples", "cum_wall_s") if c in metrics.columns] + cols
    return metrics.loc[metrics[f"eval/{MEAN}/{PASS1}"].notna(), keep].reset_index(drop=True)


def train_plateau(cfg: Optional[Config] = None, *, out: str | Path | None = PLATEAU_MODEL_DIR, window: int = 5,
                  min_delta: float = 0.01, progress: bool = True, command: Optional[str] = None) -> PlateauResult:
    """Train ``cfg`` (default :func:`plateau_config`) in chunks of ``eval_every`` steps until :func:`plateau_reached`
    fires on held-out mean pass@1 or ``cfg.steps`` is reached, then save the policy as an HF model directory
    (``save_pretrained`` + tokenizer, safetensors) with PLATEAU.md and plateau.json beside it.

    Resumable: the run lives in ``cfg.run_dir/cfg.run_name`` and is checkpointed at every chunk; calling again
    continues from the last checkpoint (Ctrl-C stops after the current step). Deterministic in ``cfg.seed``.
    """
    from tqdm.auto import tqdm

    cfg = plateau_config() if cfg is None else cfg
    if not isinstance(cfg, Config):
        raise ValueError(f"cfg: got {type(cfg).__name__}; allowed: a brorl_lab.Config (see plateau_config)")
    if cfg.eval_every < 1:
        raise ValueError(f"cfg.eval_every: got {cfg.eval_every}; allowed: >= 1 (the plateau rule reads the eval curve)")
    plateau_reached([], window, min_delta)  # validate the rule's arguments before any work
    if out is not None:
        _check_model_out(Path(out))
    trainer = _open_trainer(cfg, progress=False)
    bar = tqdm(total=cfg.steps, initial=trainer.step_idx, desc="plateau", disable=not progress)
    plateaued = False
    try:
        while True:
            curve = eval_curve(trainer.metrics)
            plateaued = plateau_reached(curve[f"eval/{MEAN}/{PASS1}"], window, min_delta)
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
        rule = {"window": window, "min_delta": min_delta, "metric": f"eval/{MEAN}/{PASS1}"}
        res = PlateauResult(curve, trainer.step_idx, plateaued, None, trainer.run_dir.path, rule)
        if out is not None:
            res.out = save_plateau_model(trainer, Path(out), res, command=command)
        return res
    finally:
        bar.close()
        trainer.close()


def _open_trainer(cfg: Config, *, progress: bool):
    """A Trainer for ``cfg``: resumed from its run directory's checkpoint when one exists (same config), else new."""
    from .trainer import CHECKPOINT_FILE, Trainer, default_run_name

    path = Path(cfg.run_dir) / (cfg.run_name or default_run_name(cfg))
    if (path / "checkpoint" / CHECKPOINT_FILE).is_file():
        _check_same_config(path, cfg)
        return Trainer.resume(path, progress=progress)
    partial = (path / "config.yaml").is_file()
    if partial:  # a run of these settings that never checkpointed: nothing to resume, so it starts again
        _check_same_config(path, cfg)
    return Trainer(cfg, progress=progress, overwrite=partial)


# Fields that may differ between a saved run and the request without changing what the run computes.
_IGNORED_FIELDS = ("torch_threads", "run_dir")


def _check_same_config(path: Path, cfg: Config) -> None:
    from .tracking import RunDir

    try:
        saved = RunDir(path).read_config()
    except (OSError, ValueError) as e:
        raise ValueError(f"root: {path} holds a run whose config.yaml cannot be read ({e}); allowed: a fresh root "
                         "or one written by this function") from e
    want = cfg.to_dict()
    diff = sorted(k for k in want if k not in _IGNORED_FIELDS and saved.get(k) != want[k])
    if diff:
        shown = ", ".join(f"{k}: {saved.get(k)!r} there, {want[k]!r} asked" for k in diff[:4])
        raise ValueError(f"root: {path} already holds a run with a different config ({shown}); allowed: the same "
                         "settings (to resume it), another root, or delete that directory")


def _check_model_out(out: Path) -> None:
    if out.exists() and not (out.is_dir() and (not any(out.iterdir()) or (out / "config.json").is_file())):
        raise ValueError(f"out: {out} exists and is not an HF model directory; allowed: a new path, an empty "
                         "directory or a model directory to overwrite")


def save_plateau_model(trainer, out: Path, res: PlateauResult, *, command: Optional[str] = None) -> Path:
    """Write the trainer's policy and tokenizer to ``out`` (via a temp dir, then swapped in), plus PLATEAU.md and
    plateau.json (families, seed, steps, the eval curve, the rule and whether it fired)."""
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
        "command": command, "base_model": _repo_relative(base) if base.exists() else cfg.model,
        "base_model_sha256": hashlib.sha256(weights.read_bytes()).hexdigest() if weights.is_file() else None,
        "families": list(cfg.tasks), "seed": cfg.seed, "steps": res.steps, "plateaued": res.plateaued,
        "rule": res.rule, "config": {k: v for k, v in cfg.to_dict().items() if k not in _IGNORED_FIELDS},
        "curve": res.curve.to_dict(orient="records"),
    }
    (tmp / "plateau.json").write_text(json.dumps(meta, indent=1, default=float))
    (tmp / "PLATEAU.md").write_text(plateau_markdown(meta))
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)
    return out


def _repo_relative(path: Path) -> str:
    path = path.resolve()
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def plateau_markdown(meta: dict) -> str:
    """PLATEAU.md: command, seed, steps, the eval curve as a table and the plateau rule applied to it."""
    curve = pd.DataFrame(meta["curve"])
    fams = [c.split("/")[1] for c in curve.columns if c.startswith("eval/") and c.endswith(PASS1)]
    rule = meta["rule"]
    best = curve[rule["metric"]].cummax().shift(1)
    lines = ["# data/plateau_model: the default model trained with the ProRL recipe until held-out pass@1 stalled", "",
             f"Command: `{meta['command'] or 'python -m brorl_lab.experiments plateau'}` (seed {meta['seed']}).", "",
             f"Base: {meta['base_model']} (model.safetensors sha256 {meta.get('base_model_sha256')}).", "",
             f"Families: {', '.join(meta['families'])}. Steps: {meta['steps']}. Recipe (config fields): "
             + ", ".join(f"{k}={meta['config'][k]}" for k in (
                 "rollouts_per_prompt", "prompts_per_step", "optimizer_steps_per_step", "advantage", "eps_low",
                 "eps_high", "kl_beta", "kl_estimator", "dynamic_sampling", "reset_every", "reset_optimizer", "lr",
                 "temperature", "eval_prompts", "eval_samples", "eval_temperature")) + ".", "",
             "Held-out pass@1 (frozen eval sets, "
             f"{meta['config']['eval_prompts']} prompts x {meta['config']['eval_samples']} samples per family, "
             f"T={meta['config']['eval_temperature']}):", "",
             "| step | samples | " + " | ".join(fams) + " | best before |",
             "|---:|---:|" + "---:|" * len(fams) + "---:|"]
    for i, r in curve.iterrows():
        vals = " | ".join(f"{r[f'eval/{f}/{PASS1}']:.3f}" for f in fams)
        prev = "" if pd.isna(best.iloc[i]) else f"{best.iloc[i]:.3f}"
        lines.append(f"| {int(r['step'])} | {int(r.get('cum_samples', 0)):,} | {vals} | {prev} |")
    w, d = rule["window"], rule["min_delta"]
    first, last = curve.iloc[0], curve.iloc[-1]
    moves = ", ".join(f"{f} {100 * (last[f'eval/{f}/{PASS1}'] - first[f'eval/{f}/{PASS1}']):+.1f}" for f in fams)
    if meta["plateaued"]:
        recent, before = curve[rule["metric"]].iloc[-w:].max(), curve[rule["metric"]].iloc[:-w].max()
        why = (f"Why this counts as a plateau: the rule is \"the last {w} evaluations all stay below the best earlier "
               f"{rule['metric']} + {d}\" and it fired at step {meta['steps']}: the best of the last {w} evaluations "
               f"is {recent:.3f} < {before:.3f} + {d} = {before + d:.3f}.")
    else:
        why = (f"The rule (\"the last {w} evaluations all stay below the best earlier {rule['metric']} + {d}\") did "
               f"NOT fire within the step cap of {meta['steps']} steps: this checkpoint is not a measured plateau.")
    lines += ["", why, "", f"Change from the first to the last evaluation, in points (0.01 pass@1): {moves}.", "",
              "Load it with `Config(model=\"data/plateau_model\")` (from the repository root) or "
              "`brorl_lab.experiments.recipe_config(model=\"plateau\")`.", ""]
    return "\n".join(lines)


# ---- the two arms ------------------------------------------------------------------------------------------------------
def arm_configs(base: Config, *, n_small: int = 16, n_large: int = 512, prompts_small: int = 16,
                prompts_large: Optional[int] = None, samples_ratio: float = 8,
                lr_scaling: str = "sqrt") -> dict[str, Config]:
    """The two arms of BroRL's experiment from one base config, as ``{"prorl": cfg, "brorl": cfg}``.

    ProRL arm: N = ``n_small`` with ``prompts_small`` prompts per step (BroRL: 16 x 512). BroRL arm: N = ``n_large``
    with ``prompts_large`` prompts per step, by default ``samples_ratio`` times the ProRL arm's samples per step
    (BroRL: 512 x 128, 8x). Both keep ``base.optimizer_steps_per_step`` and use ``lr_scaling="sqrt"`` with
    ``lr_reference_samples`` = the ProRL arm's samples per step, so the ProRL arm trains at ``base.lr`` and the BroRL
    arm at ``base.lr * sqrt(ratio)``. ``lr_scaling="none"`` gives both arms ``base.lr`` (an ablation of the rule).

    Budget: ``base.steps``, ``base.eval_every`` and ``base.checkpoint_every`` count BroRL-arm steps; the ProRL arm
    gets ``ratio`` times as many (rounded), so both arms train on the same nominal number of samples and are
    evaluated at the same nominal sample counts.
    """
    if not isinstance(base, Config):
        raise ValueError(f"base: got {type(base).__name__}; allowed: a brorl_lab.Config")
    for name, v in (("n_small", n_small), ("n_large", n_large), ("prompts_small", prompts_small)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name}: got {v!r}; allowed: an integer >= 1")
    if n_large <= n_small:
        raise ValueError(f"n_large: got {n_large} with n_small={n_small}; allowed: an integer > n_small")
    small = n_small * prompts_small
    if prompts_large is None:
        if isinstance(samples_ratio, bool) or not isinstance(samples_ratio, (int, float)) or not samples_ratio > 0:
            raise ValueError(f"samples_ratio: got {samples_ratio!r}; allowed: a number > 0")
        exact = Fraction(samples_ratio).limit_denominator(1000) * small / n_large
        if exact.denominator != 1 or exact < 1:
            raise ValueError(f"prompts_large: samples_ratio={samples_ratio} gives {float(exact):g} prompts per step "
                             f"for N={n_large} (ProRL arm: {prompts_small} x {n_small}); allowed: pass prompts_large "
                             "explicitly or a ratio that makes it a whole number >= 1")
        prompts_large = int(exact)
    elif isinstance(prompts_large, bool) or not isinstance(prompts_large, int) or prompts_large < 1:
        raise ValueError(f"prompts_large: got {prompts_large!r}; allowed: None or an integer >= 1")
    ratio = n_large * prompts_large / small

    def scaled(k: int) -> int:
        return max(1, round(k * ratio)) if k else 0

    if lr_scaling not in ("sqrt", "none"):
        raise ValueError(f"lr_scaling: got {lr_scaling!r}; allowed: 'sqrt' (BroRL's rule) or 'none'")
    common = dict(lr_scaling=lr_scaling, lr_reference_samples=small)
    return {
        "prorl": base.replace(**common, rollouts_per_prompt=n_small, prompts_per_step=prompts_small,
                              steps=scaled(base.steps), eval_every=scaled(base.eval_every),
                              checkpoint_every=scaled(base.checkpoint_every), run_name="prorl"),
        "brorl": base.replace(**common, rollouts_per_prompt=n_large, prompts_per_step=prompts_large,
                              run_name="brorl"),
    }


PAPER_ARMS = {"prorl": dict(rollouts_per_prompt=16, prompts_per_step=512), "brorl": dict(rollouts_per_prompt=512,
                                                                                    prompts_per_step=128)}


def arms_table(arms: dict[str, Config]) -> pd.DataFrame:
    """The arms side by side with BroRL's own values (Sec. 5): N, prompts and samples per step, optimizer updates
    per step, effective lr, steps and the nominal samples each arm will train on."""
    rows = {}
    for arm, c in arms.items():
        paper = PAPER_ARMS.get(arm, {})
        rows[ARM_NAMES.get(arm, arm)] = {
            "N (rollouts_per_prompt)": c.rollouts_per_prompt, "prompts_per_step": c.prompts_per_step,
            "samples_per_step": c.samples_per_step, "optimizer_steps_per_step": c.optimizer_steps_per_step,
            "lr (after sqrt scaling)": f"{c.effective_lr:.3g}", "steps": c.steps, "eval_every": c.eval_every,
            "nominal trained samples": c.samples_per_step * c.steps,
            "paper: N x prompts": f"{paper['rollouts_per_prompt']} x {paper['prompts_per_step']}" if paper else ""}
    return pd.DataFrame(rows)


def experiment_root(base: Config, run_dir: str | Path | None = None, **arm_options) -> Path:
    """Where the arms' runs live: ``run_dir/arms`` when a run directory is given, else a directory under
    ``runs/rollout_scaling`` named by the settings (so different settings never share, and clash in, one root)."""
    if run_dir:
        return Path(run_dir) / "arms"
    settings = {k: v for k, v in base.to_dict().items() if k not in _IGNORED_FIELDS}
    digest = hashlib.sha1(json.dumps([settings, arm_options], sort_keys=True, default=str).encode()).hexdigest()[:8]
    return DEFAULT_ROOT / f"steps{base.steps}_{digest}"


def run_arm(cfg: Config, *, progress: bool = True) -> tuple[pd.DataFrame, bool]:
    """Run one arm to ``cfg.steps``: a finished run in ``cfg.run_dir/cfg.run_name`` is read back, not re-run; a
    partial one resumes from its checkpoint. Returns ``(metrics, finished)``."""
    from .tracking import RunDir

    path = Path(cfg.run_dir) / cfg.run_name
    if (path / "config.yaml").is_file():
        _check_same_config(path, cfg)
        status = RunDir(path).read_status()
        if status.get("status") == "finished" and status.get("step") == cfg.steps:
            return RunDir(path).read_metrics(), True
    with _open_trainer(cfg, progress=progress) as trainer:
        trainer.run()
        done = trainer.step_idx >= cfg.steps
    return RunDir(path).read_metrics(), done  # read back, so a fresh and a finished arm give identical frames


def run_rollout_scaling(base: Config, *, seeds: Iterable[int] = (0,), root: str | Path = DEFAULT_ROOT,
                        progress: bool = True, **arm_options) -> pd.DataFrame:
    """Run both arms of :func:`arm_configs` (``arm_options``: n_small, n_large, prompts_small, ...) for each seed from
    ``base.model``, in run directories ``root/<arm>_s<seed>``; returns one long DataFrame of every metrics row with
    columns ``arm``, ``seed``, ``rollouts_per_prompt``, ``prompts_per_step`` and ``cum_trained_samples`` added.

    Resumable: finished arms are read back, a partial arm continues from its checkpoint, and a root that holds a
    run with different settings is an error rather than a silent mix. Ctrl-C stops after the current step (the
    partial results are returned with a warning; call again to continue).
    """
    from tqdm.auto import tqdm

    seeds = list(seeds) if not isinstance(seeds, (str, bytes)) else seeds
    if (not isinstance(seeds, list) or not seeds
            or any(isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in seeds) or len(set(seeds)) < len(seeds)):
        raise ValueError(f"seeds: got {seeds!r}; allowed: a non-empty list of distinct integers >= 0")
    if not isinstance(root, (str, Path)) or not str(root).strip():
        raise ValueError(f"root: got {root!r}; allowed: a directory path")
    arms = arm_configs(base, **arm_options)
    plan = [(arm, seed, cfg.replace(seed=seed, run_dir=str(root), run_name=f"{arm}_s{seed}"))
            for seed in seeds for arm, cfg in arms.items()]
    frames = []
    bar = tqdm(plan, desc="arms", disable=not progress)
    for arm, seed, cfg in bar:
        bar.set_postfix_str(f"{arm} seed {seed}")
        df, finished = run_arm(cfg, progress=progress)
        frames.append(_label(df, arm, seed, cfg))
        if not finished:
            warnings.warn(f"run_rollout_scaling interrupted in {arm} seed {seed} at step {int(df['step'].max())} of "
                          f"{cfg.steps}; call again with the same arguments to resume", stacklevel=2)
            break
    bar.close()
    return pd.concat(frames, ignore_index=True)


def _label(df: pd.DataFrame, arm: str, seed: int, cfg: Config) -> pd.DataFrame:
    df = df.copy()
    df.insert(0, "seed", seed)
    df.insert(0, "arm", arm)
    df.insert(0, "run", cfg.run_name)
    df["rollouts_per_prompt"] = cfg.rollouts_per_prompt
    df["prompts_per_step"] = cfg.prompts_per_step
    kept = df["kept_groups"].fillna(0) if "kept_groups" in df else pd.Series(0.0, index=df.index)
    skipped = df["skipped"].eq(True) if "skipped" in df else pd.Series(False, index=df.index)
    df["cum_trained_samples"] = (kept * cfg.rollouts_per_prompt).where(~skipped, 0).cumsum()
    return df


# ---- analysis ----------------------------------------------------------------------------------------------------------
X_AXES = {"cum_samples": "generated samples", "cum_wall_s": "training wall time (s)"}


def families_of(df: pd.DataFrame) -> list[str]:
    """Families with a held-out pass@1 column (``eval/<family>/pass@1``), the mean over families last."""
    fams = [c.split("/")[1] for c in df.columns if c.startswith("eval/") and c.endswith(f"/{PASS1}")]
    return [f for f in fams if f != MEAN] + ([MEAN] if MEAN in fams else [])


def _check_frame(df: pd.DataFrame, need: Sequence[str] = ("arm", "seed", "step", "cum_samples", "cum_wall_s")
                 ) -> pd.DataFrame:
    """Validate a results table and return it with a ``run`` column (``<arm>_s<seed>``) if it had none."""
    if not isinstance(df, pd.DataFrame):
        raise ValueError(f"df: got {type(df).__name__}; allowed: the DataFrame run_rollout_scaling returns")
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


def arm_labels(df: pd.DataFrame) -> dict[str, str]:
    """{arm: display name with its N}, e.g. {"prorl": "ProRL (N=16)", "brorl": "BroRL (N=512)"}."""
    return {a: _arm_label(df, a) for a in dict.fromkeys(df["arm"])}


def _arm_label(df: pd.DataFrame, arm: str) -> str:
    n = df.loc[df["arm"] == arm, "rollouts_per_prompt"].dropna() if "rollouts_per_prompt" in df else pd.Series([])
    return f"{ARM_NAMES.get(arm, arm)} (N={int(n.iloc[0])})" if len(n) else ARM_NAMES.get(arm, arm)


def compare_arms(df: pd.DataFrame, x: str = "cum_samples") -> pd.DataFrame:
    """Held-out pass@1 of both arms at the same budget of ``x`` (``'cum_samples'`` or ``'cum_wall_s'``): the
    largest value every run (arm x seed) reached, each run's eval curve interpolated there
    (:func:`brorl_lab.analysis.curves_on_grid`, never extrapolated). One row per family and the mean: budget,
    each arm's mean over seeds, gap = BroRL - ProRL, and with paired seeds the spread (std) of the per-seed gaps,
    its standard error and, with >= 3 seeds, whether |gap| > 2 s.e."""
    from .analysis import curves_on_grid

    df = _check_frame(df)
    if x not in X_AXES:
        raise ValueError(f"x: got {x!r}; allowed: {', '.join(X_AXES)}")
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
        spread = float(gaps.std(ddof=1)) if n >= 2 else float("nan")
        se = spread / math.sqrt(n) if n >= 2 else float("nan")
        gap = float(per["brorl"].mean() - per["prorl"].mean())
        rows.append({"family": fam, "x": x, "budget": float(grid["x"].max()), "prorl": float(per["prorl"].mean()),
                     "brorl": float(per["brorl"].mean()), "gap": gap, "seeds": n, "gap_spread": spread,
                     "gap_se": se, "exceeds_noise": bool(abs(gap) > 2 * se) if n >= 3 else None})
    return pd.DataFrame(rows)


def summarize(df: pd.DataFrame) -> pd.DataFrame:
    """One row per arm (means over seeds, ``±`` std columns with >= 2 seeds): N and prompts per step, steps, final
    held-out pass@1 per family and their mean, generated and trained samples, training wall time, mean
    dynamic-sampling pass rate (kept / generated groups), generation samples/s and end-to-end samples/s."""
    df = _check_frame(df)
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
    out.index = [_arm_label(df, a) for a in order]
    out.index.name = "arm"
    return out


def verdict(df: pd.DataFrame, *, tie_points: float = 0.5) -> str:
    """A plain-words verdict computed from ``df`` (:func:`compare_arms` at equal generated samples and at equal
    training wall time): where BroRL is ahead, behind or level, by how many points (1 point = 0.01 pass@1; gaps
    within ``tie_points`` are level), and with >= 3 paired seeds which gaps exceed twice their standard error over
    seeds. Whatever the data say, the text says."""
    if isinstance(tie_points, bool) or not (isinstance(tie_points, (int, float)) and math.isfinite(tie_points)
                                            and tie_points >= 0):
        raise ValueError(f"tie_points: got {tie_points!r}; allowed: a finite float >= 0")
    df = _check_frame(df)
    bro, pro = _arm_label(df, "brorl"), _arm_label(df, "prorl")
    seeds = int(df[df["arm"].isin(ARMS)].groupby("arm")["seed"].nunique().min())
    heads, body = [], []
    for x, what, unit in (("cum_samples", "equal generated samples", "samples per arm"),
                          ("cum_wall_s", "equal training wall time", "s of training per arm")):
        cmp_ = compare_arms(df, x)
        budget = cmp_["budget"].iloc[0]
        fams = cmp_[cmp_["family"] != MEAN]
        overall = cmp_[cmp_["family"] == MEAN].iloc[0] if (cmp_["family"] == MEAN).any() else None
        gap = overall["gap"] if overall is not None else fams["gap"].mean()
        heads.append(f"{_side_words(gap, tie_points)} at {what}")
        groups = {}
        for r in fams.itertuples():
            groups.setdefault(_side(r.gap, tie_points), []).append(
                f"{r.family} ({100 * r.gap:+.1f}: {r.brorl:.3f} vs {r.prorl:.3f})")
        line = (f"At {what} ({budget:,.{0 if x == 'cum_samples' else 1}f} {unit}), BroRL vs ProRL pass@1: "
                + "; ".join(f"{side} on {', '.join(v)}" for side, v in groups.items()))
        if overall is not None:
            line += (f"; mean over families {_side_words(overall['gap'], tie_points)} "
                     f"({overall['brorl']:.3f} vs {overall['prorl']:.3f})")
        if seeds >= 3:
            sig = [f"{r.family} (gap {100 * r.gap:+.1f}, s.e. {100 * r.gap_se:.1f})"
                   for r in cmp_.itertuples() if r.exceeds_noise]
            line += (f". Gaps larger than twice their standard error over {seeds} seeds: "
                     + (", ".join(sig) if sig else "none; every gap is within seed noise"))
        body.append(line + ".")
    head = (f"Verdict ({bro} vs {pro}, held-out pass@1, {seeds} seed{'s' * (seeds != 1)}): "
            + "on the mean over families BroRL is " + " and ".join(heads) + ".")
    if seeds < 3:
        body.append(f"With {seeds} seed{'s' * (seeds != 1)} these gaps cannot be told apart from seed noise; run "
                    ">= 3 seeds before trusting a difference of a few points.")
    return "\n".join([head, *body])


def _side(gap: float, tie_points: float) -> str:
    pts = 100 * gap
    return "level" if abs(pts) <= tie_points else "ahead" if pts > 0 else "behind"


def _side_words(gap: float, tie_points: float) -> str:
    side = _side(gap, tie_points)
    if side == "level":
        return f"level with ProRL ({100 * gap:+.1f} points, within ±{tie_points:g})"
    return f"{side} by {abs(100 * gap):.1f} points"


def save_outputs(run_dir: str | Path, df: pd.DataFrame, figures: dict, *, summary: Optional[pd.DataFrame] = None,
                 verdict_text: Optional[str] = None, export_png: bool = True) -> dict:
    """Write the experiment's results into ``run_dir``: metrics.parquet (the long table), summary.csv, verdict.txt,
    and each figure of ``figures`` ({name: go.Figure}) as <name>.png with kaleido, all in one batch. PNG export
    needs Chromium; when it fails the reason is returned under "png_note" and nothing else is affected."""
    from .tracking import atomic_write, atomic_write_text

    out = Path(run_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = {"metrics": atomic_write(out / "metrics.parquet", lambda f: df.to_parquet(f, index=False))}
    if summary is not None:
        written["summary"] = atomic_write_text(out / "summary.csv", summary.to_csv())
    if verdict_text is not None:
        written["verdict"] = atomic_write_text(out / "verdict.txt", verdict_text + "\n")
    written["png"], written["png_note"] = [], None
    if export_png and figures:
        import plotly.io as pio

        todo = {out / f"{name}.png": fig for name, fig in figures.items()}
        for path in todo:  # a PNG left by an earlier run must not pass for this run's
            path.unlink(missing_ok=True)
        try:
            for _ in range(2):  # under heavy load kaleido has been seen to drop a figure of a batch: retry those
                pio.write_images(list(todo.values()), list(todo), width=1100)
                todo = {p: f for p, f in todo.items() if not p.is_file()}
                if not todo:
                    break
            if todo:
                written["png_note"] = f"PNG export did not write {', '.join(p.name for p in todo)}"
        except Exception as e:  # noqa: BLE001 - no Chromium, kaleido missing, a browser crash: figures stay inline
            written["png_note"] = f"PNG export skipped ({type(e).__name__}: {str(e).strip().splitlines()[0][:200]})"
        written["png"] = [out / f"{name}.png" for name in figures if (out / f"{name}.png").is_file()]
    elif figures:
        written["png_note"] = "PNG export off (export_png=False)"
    return written


# ---- command line ------------------------------------------------------------------------------------------------------
def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m brorl_lab.experiments", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    a = sub.add_parser("plateau", help="train the default model with the ProRL recipe until held-out pass@1 stalls")
    a.add_argument("--steps", type=int, default=400, help="step cap (the plateau rule usually stops earlier)")
    a.add_argument("--out", default=str(PLATEAU_MODEL_DIR), help="HF model directory to write")
    a.add_argument("--families", nargs="+", default=None, help="default: hard_families() of the default model")
    a.add_argument("--seed", type=int, default=0)
    a.add_argument("--eval-every", type=int, default=10)
    a.add_argument("--window", type=int, default=5, help="plateau rule: evaluations without improvement")
    a.add_argument("--min-delta", type=float, default=0.01, help="plateau rule: the improvement that counts")
    a.add_argument("--lr", type=float, default=RECIPE["lr"])
    a.add_argument("--run-dir", default=str(REPO / "runs"), help="parent of the resumable run directory 'plateau'")
    a.add_argument("--threads", type=int, default=1, help="torch threads")
    s = sub.add_parser("scaling", help="run both arms from the plateau checkpoint and print summary and verdict")
    s.add_argument("--root", default=str(DEFAULT_ROOT))
    s.add_argument("--steps", type=int, default=24, help="BroRL-arm steps (the ProRL arm gets ratio x as many)")
    s.add_argument("--eval-every", type=int, default=4, help="in BroRL-arm steps")
    s.add_argument("--seeds", type=int, nargs="+", default=[0])
    s.add_argument("--n-small", type=int, default=16)
    s.add_argument("--n-large", type=int, default=512)
    s.add_argument("--prompts-small", type=int, default=16)
    s.add_argument("--prompts-large", type=int, default=None)
    s.add_argument("--model", default="plateau")
    s.add_argument("--eval-prompts", type=int, default=64)
    s.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    try:
        if args.command == "plateau":
            cfg = plateau_config(steps=args.steps, tasks=args.families, seed=args.seed, eval_every=args.eval_every,
                                 checkpoint_every=args.eval_every, lr=args.lr, run_dir=args.run_dir,
                                 torch_threads=args.threads)
            command = "python -m brorl_lab.experiments " + " ".join(argv if argv is not None else sys.argv[1:])
            res = train_plateau(cfg, out=args.out, window=args.window, min_delta=args.min_delta, command=command)
            print(res.curve.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
            print(f"{'plateau reached' if res.plateaued else 'NO plateau within the step cap'} at step {res.steps}; "
                  f"model: {res.out}; run: {res.run_dir}")
            return 0 if res.plateaued else 3
        base = recipe_config(model=args.model, steps=args.steps, eval_every=args.eval_every,
                             eval_prompts=args.eval_prompts, checkpoint_every=args.eval_every,
                             torch_threads=args.threads)
        df = run_rollout_scaling(base, seeds=args.seeds, root=args.root, n_small=args.n_small, n_large=args.n_large,
                                 prompts_small=args.prompts_small, prompts_large=args.prompts_large)
        print(summarize(df).T.to_string(float_format=lambda v: f"{v:.4g}"))
        print(verdict(df))
        return 0
    except ValueError as e:
        p.exit(2, f"{p.prog} {args.command}: error: {e}\n")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
