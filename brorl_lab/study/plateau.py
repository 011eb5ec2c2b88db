"""The plateau: the ProRL recipe at N=16 trained on the default model until held-out pass@1 stops improving, saved as
the HF checkpoint the BroRL-vs-ProRL branch starts from (``data/plateau_model``, with ``plateau.json`` and
``PLATEAU.md``). ``python -m brorl_lab plateau`` runs it.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import pandas as pd

from brorl_lab.core.config import Config
from brorl_lab.core.paths import DEFAULT_MODEL_DIR, PLATEAU_MODEL_DIR, RUNS_DIR, repo_relative
from brorl_lab.core.rundir import eval_key
from brorl_lab.core.validation import UserError, check_int, is_finite_number, is_number

MODEL_ALIASES = {"plateau": PLATEAU_MODEL_DIR}
PASS1 = "pass@1"
MEAN = "mean"

# The ProRL recipes at small N (docs/RECIPES.md). lr and the batch sizes are ours: the tiny default model needs a far
# larger lr than a 1.5B one. v1 (ProRL paper): GRPO with group-std normalisation, DAPO clip-higher 0.2/0.28, a k3 KL
# penalty to a reference reset with the optimizer every `reset_every` steps, verifier scores as reward. v2 (ProRL v2,
# what BroRL continues): REINFORCE++-baseline advantages (group mean removed, then normalised over the global
# batch), k2 KL, clip 0.2/0.27, optimizer state kept on reset, binary `correct` reward.
RECIPE = dict(rollouts_per_prompt=16, prompts_per_step=16, optimizer_steps_per_step=2, advantage="grpo",
              adv_std_norm=True, policy_loss="ppo_clip", loss_agg="token_mean", eps_low=0.2, eps_high=0.28,
              kl_beta=1e-3, kl_estimator="k3", dynamic_sampling=True, max_resample_rounds=4, reset_every=50,
              reset_optimizer=True, temperature=1.0, top_p=1.0, lr=3e-4, template="plain", eval_temperature=0.6,
              eval_top_p=0.95, eval_k=[1], eval_samples=8, reward="score")
RECIPES = {"prorl_v1": RECIPE,
           "prorl_v2": {**RECIPE, "advantage": "reinforce_pp_baseline", "kl_estimator": "k2", "eps_high": 0.27,
                        "reset_optimizer": False, "reward": "correct"}}
FLAGSHIP_RECIPE = "prorl_v2"  # the branch's default; "prorl_v1" is one knob away
PLATEAU_RECIPE = "prorl_v1"  # the plateau run: the ProRL paper's recipe (what the shipped checkpoint was trained with)
# RL learns on these with the default model (+7.9 points by step 120, then 100 steps without a new best); on
# chain_sum, gcd, products and simple_equations together it moved mean held-out pass@1 by under 1 point in 50 steps.
PLATEAU_FAMILIES = ["spell_backward", "gcd"]
PLATEAU_TRIED = (  # written into PLATEAU.md when the plateau run uses PLATEAU_FAMILIES
    "the previous build trained the default model with the same ProRL v1 recipe on chain_sum, gcd, produc"
    "ts and simple_equations (the families where the default model's pass@1 was below 0.5); held-out mean"
    " pass@1 went 0.251 -> 0.246 over 50 steps and the old rule (5 evaluations without +1 point) fired ag"
    "ainst step 0 alone: a run that never learned, not a plateau. RL on this model learns clearly on spel"
    "l_backward (the end-to-end test: +8 points in 20 steps) and, more slowly, on gcd, so the plateau run"
    " uses those two; the rule now demands a gain of >= 5 points before a stall counts.")


# ---- models and families ---------------------------------------------------------------------------------------------
def resolve_experiment_model(model: str) -> str:
    """``'plateau'`` -> the shipped plateau checkpoint (data/plateau_model, as an absolute path so notebooks running
    in notebooks/ find it); anything else is returned unchanged for :class:`Config` to check."""
    if not isinstance(model, str) or not model.strip():
        raise UserError(f"model: got {model!r}; allowed: 'plateau', 'default', a local HF model directory or a hub id")
    if model in MODEL_ALIASES:
        path = MODEL_ALIASES[model]
        if not (path / "config.json").is_file():
            raise UserError(f"model: {model!r} -> {path} has no config.json; build it with "
                             "`python -m brorl_lab.study.experiments plateau`")
        return str(path)
    return model


def hard_families(report: str | Path | None = None, *, max_pass: float = 0.5, temperature: str = "t1.0") -> list[str]:
    """The families the default model solves only sometimes or rarely: measured pass@1 at the training temperature
    (``training_report.json`` of data/default_model, key ``pass_at_1[temperature]``) in ``(0, max_pass)``.

    Families it never solves give no reward signal even at large N, and those it mostly solves have little left to
    learn; the plateau and the branch experiment train on the ones in between.
    """
    path = Path(report) if report is not None else DEFAULT_MODEL_DIR / "training_report.json"
    if not is_number(max_pass) or not 0 < max_pass <= 1:
        raise ValueError(f"max_pass: got {max_pass!r}; allowed: a float in (0, 1]")
    try:
        table = json.loads(path.read_text())["pass_at_1"]
    except (OSError, ValueError, KeyError) as e:
        raise ValueError(f"report: {path} has no readable pass_at_1 table ({type(e).__name__}: {e}); allowed: a "
                         "training_report.json written by `python -m brorl_lab.rl.train_default`") from e
    if temperature not in table:
        raise ValueError(f"temperature: got {temperature!r}; allowed: {', '.join(table)} (keys of {path})")
    fams = [f for f, p in table[temperature].items() if 0 < p < max_pass]
    if not fams:
        raise ValueError(f"max_pass: no family of {path} has pass@1 in (0, {max_pass}) at {temperature}: "
                         f"{table[temperature]}")
    return fams


def recipe_config(recipe: str = FLAGSHIP_RECIPE, **overrides) -> Config:
    """A ProRL recipe (``RECIPES[recipe]``: 'prorl_v2' or 'prorl_v1') as a validated Config, ``overrides`` applied.

    ``model='plateau'`` names the shipped plateau checkpoint; ``tasks`` defaults to the plateau model's families
    (read from its plateau.json) when the model is the plateau checkpoint, else to :func:`hard_families`.
    """
    if recipe not in RECIPES:
        raise UserError(f"recipe: got {recipe!r}; allowed: {', '.join(RECIPES)}")
    d = {**RECIPES[recipe], **overrides}
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
    base = dict(model="default", steps=800, eval_every=10, eval_prompts=200, eval_samples=32, checkpoint_every=10,
                run_name="plateau", run_dir=str(RUNS_DIR), torch_threads=1, tasks=PLATEAU_FAMILIES)
    overrides = {k: v for k, v in overrides.items() if not (k == "tasks" and v is None)}
    return recipe_config(PLATEAU_RECIPE, **{**base, **overrides})


PLATEAU_RULE = dict(gain=0.05, min_delta=0.01, patience=100)  # issue 14: +5 points, then 100 steps without +1 point


def plateau_rule(steps: Sequence[int], curve: Sequence[float], *, gain: float = 0.05, min_delta: float = 0.01,
                 patience: int = 100) -> dict:
    """The plateau rule, "learned, then stalled", on held-out pass@1 ``curve`` at training ``steps`` (the first entry
    is the starting checkpoint): an evaluation is a *new best* when it beats every earlier one by >= ``min_delta``;
    the rule fires once the best is >= start + ``gain`` and no new best came for >= ``patience`` steps since.

    With the defaults (0.05, 0.01, 100): the run gained at least 5 points of pass@1, then went 100 steps without
    beating its best by 1 point. Returns the rule's numbers: fired, start, best, best_step (the last new best),
    gained, stalled_steps (steps since the last new best), and the arguments.
    """
    for name, v in (("gain", gain), ("min_delta", min_delta)):
        if not (is_finite_number(v) and v >= 0):
            raise ValueError(f"{name}: got {v!r}; allowed: a finite float >= 0")
    check_int("patience", patience, 1)
    steps, curve = [int(s) for s in steps], [float(c) for c in curve]
    if len(steps) != len(curve):
        raise ValueError(f"steps: got {len(steps)} steps for {len(curve)} evaluations; allowed: one step per evaluation")
    out = dict(gain=gain, min_delta=min_delta, patience=patience, fired=False, start=None, best=None, best_step=None,
               gained=None, stalled_steps=None)
    if not curve:
        return out
    best, best_step, top = curve[0], steps[0], curve[0]
    for s, c in zip(steps[1:], curve[1:]):
        if c >= top + min_delta:
            best, best_step = c, s
        top = max(top, c)
    stalled = steps[-1] - best_step
    out.update(start=curve[0], best=best, best_step=best_step, gained=best - curve[0], stalled_steps=stalled,
               fired=bool(best - curve[0] >= gain - 1e-12 and stalled >= patience))
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
    rule: dict = field(default_factory=dict)


def eval_curve(metrics: pd.DataFrame) -> pd.DataFrame:
    """The rows of a metrics table that carry an evaluation, with step, samples and the pass@1 columns."""
    cols = [c for c in metrics.columns if c.startswith("eval/") and c.endswith(f"/{PASS1}")]
    if not cols:
        return pd.DataFrame(columns=["step", "cum_samples", f"eval/{MEAN}/{PASS1}"])
    keep = ["step"] + [c for c in ("cum_samples", "cum_wall_s") if c in metrics.columns] + cols
    return metrics.loc[metrics[f"eval/{MEAN}/{PASS1}"].notna(), keep].reset_index(drop=True)


def train_plateau(cfg: Optional[Config] = None, *, out: str | Path | None = PLATEAU_MODEL_DIR, gain: float = 0.05,
                  min_delta: float = 0.01, patience: int = 100, progress: bool = True,
                  command: Optional[str] = None) -> PlateauResult:
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
        raise UserError(f"cfg.eval_every: got {cfg.eval_every}; allowed: >= 1 (the plateau rule reads the eval curve)")
    rule = dict(gain=gain, min_delta=min_delta, patience=patience)
    plateau_rule([], [], **rule)  # validate the rule's arguments before any work
    if out is not None:
        _check_model_out(Path(out))
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
        if out is not None:
            res.out = save_plateau_model(trainer, Path(out), res, command=command)
        return res
    finally:
        bar.close()
        trainer.close()


def open_trainer(cfg: Config, *, progress: bool):
    """A Trainer for ``cfg``: resumed from its run directory's checkpoint when one exists (same config), else new."""
    from brorl_lab.rl.trainer import CHECKPOINT_FILE, Trainer, default_run_name

    path = Path(cfg.run_dir) / (cfg.run_name or default_run_name(cfg))
    if (path / "checkpoint" / CHECKPOINT_FILE).is_file():
        check_same_config(path, cfg)
        return Trainer.resume(path, progress=progress)
    partial = (path / "config.yaml").is_file()
    if partial:  # a run of these settings that never checkpointed: nothing to resume, so it starts again
        check_same_config(path, cfg)
    return Trainer(cfg, progress=progress, overwrite=partial)


# Fields that may differ between a saved run and the request without changing what the run computes.
IGNORED_FIELDS = ("torch_threads", "run_dir")


def check_same_config(path: Path, cfg: Config) -> None:
    from brorl_lab.core.rundir import RunDir

    try:
        saved = RunDir(path).read_config()
    except (OSError, ValueError) as e:
        raise UserError(f"root: {path} holds a run whose config.yaml cannot be read ({e}); allowed: a fresh root "
                         "or one written by this function") from e
    want = cfg.to_dict()
    diff = sorted(k for k in want if k not in IGNORED_FIELDS and saved.get(k) != want[k])
    if diff:
        shown = ", ".join(f"{k}: {saved.get(k)!r} there, {want[k]!r} asked" for k in diff[:4])
        raise UserError(f"root: {path} already holds a run with a different config ({shown}); allowed: the same "
                         "settings (to resume it), another root, or delete that directory")


def _check_model_out(out: Path) -> None:
    if out.exists() and not (out.is_dir() and (not any(out.iterdir()) or (out / "config.json").is_file())):
        raise UserError(f"out: {out} exists and is not an HF model directory; allowed: a new path, an empty "
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
        "command": command, "base_model": repo_relative(base) if base.exists() else cfg.model,
        "base_model_sha256": hashlib.sha256(weights.read_bytes()).hexdigest() if weights.is_file() else None,
        "families": list(cfg.tasks), "seed": cfg.seed, "steps": res.steps, "plateaued": res.plateaued,
        "rule": res.rule, "config": {k: v for k, v in cfg.to_dict().items() if k not in IGNORED_FIELDS},
        "curve": res.curve.to_dict(orient="records"),
        **({"tried": PLATEAU_TRIED} if list(cfg.tasks) == PLATEAU_FAMILIES else {}),
    }
    (tmp / "plateau.json").write_text(json.dumps(meta, indent=1, default=float))
    (tmp / "PLATEAU.md").write_text(plateau_markdown(meta))
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)
    return out


def plateau_markdown(meta: dict) -> str:
    """PLATEAU.md: command, seed, steps, the eval curve as a table and the plateau rule applied to it."""
    curve = pd.DataFrame(meta["curve"])
    fams = [eval_key(c)[0] for c in curve.columns if c.startswith("eval/") and c.endswith(PASS1)]
    rule = meta["rule"]
    best = curve[rule["metric"]].cummax().shift(1)  # the "best before" column
    lines = ["# data/plateau_model: the default model trained with the ProRL recipe until held-out pass@1 stalled", "",
             f"Command: `{meta['command'] or 'python -m brorl_lab plateau'}` (seed {meta['seed']}).", "",
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
    first, last = curve.iloc[0], curve.iloc[-1]
    moves = ", ".join(f"{f} {100 * (last[f'eval/{f}/{PASS1}'] - first[f'eval/{f}/{PASS1}']):+.1f}" for f in fams)
    g, d, k = rule["gain"], rule["min_delta"], rule["patience"]
    text = (f"\"gained >= {100 * g:g} points of {rule['metric']} over the start, then no new best (an evaluation "
            f"beating every earlier one by >= {100 * d:g} point) for >= {k} steps\"")
    if meta["plateaued"]:
        why = (f"Why this counts as a plateau: the rule is {text} (brorl_lab.study.plateau.plateau_rule). It fired at "
               f"step {meta['steps']}: start {rule['start']:.3f}, last new best {rule['best']:.3f} at step "
               f"{rule['best_step']} (+{100 * rule['gained']:.1f} points), then {rule['stalled_steps']} steps "
               f"without a new best.")
    else:
        why = (f"The rule ({text}) did NOT fire within the step cap of {meta['steps']} steps: this checkpoint is not "
               "a measured plateau.")
    tried = meta.get("tried")
    lines += ["", why, "", *([f"What was tried before this recipe: {tried}", ""] if tried else []),
              f"Change from the first to the last evaluation, in points (0.01 pass@1): {moves}.", "",
              "Load it with `Config(model=\"data/plateau_model\")` (from the repository root) or "
              "`brorl_lab.study.experiments.recipe_config(model=\"plateau\")`.", ""]
    return "\n".join(lines)
