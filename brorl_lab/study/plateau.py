"""The plateau: the arms' recipe (ProRL v2) at N=16 trained on the default model until held-out pass@1 is flat by a
slope test (:func:`plateau_rule`), gated on the regime BroRL is about (:func:`reach_gate`: >= 30% of training
prompts with 0 < p <= 1/16), saved as the HF checkpoint the BroRL-vs-ProRL branch starts from
(``data/plateau_model``, with ``plateau.json`` and ``PLATEAU.md``). ``python -m brorl_lab plateau`` runs it;
``python -m brorl_lab reach`` measures the rare-success share that chose its family.
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
from brorl_lab.core.validation import UserError, check_int, is_finite_number, is_int, is_number

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
PLATEAU_RECIPE = "prorl_v2"  # the plateau run uses the arms' recipe, so the branch changes nothing but N and prompts
# The rare-success regime at the default model (128 training prompts x 512 draws at T=1, share with 0 < p <= 1/16):
# products_2d 66%, products 29% (its 2-digit half), chain_sum 6%, simple_equations 9%, gcd 7%, spell_backward 8%.
PLATEAU_FAMILIES = ["products_2d"]
PLATEAU_TRIED = (  # written into PLATEAU.md when the plateau run uses PLATEAU_FAMILIES
    "The earlier plateau (ProRL v1 on spell_backward and gcd, 220 steps) was not flat by this rule (+1.8 points "
    "per 100 steps after its last 'new best') and sat outside the rare-success regime: 9% of spell_backward and 3% "
    "of gcd training prompts had 0 < p <= 0.1. Its chain_sum (53%) and simple_equations (47%) shares were high "
    "only because RL on the other two families had degraded them (mean p on training prompts 0.41 -> 0.15 and "
    "0.27 -> 0.19 against the default model, `python -m brorl_lab reach --model M --families chain_sum "
    "simple_equations` with M that checkpoint, `git show 2b34bff:data/plateau_model`): forgetting, not the families' "
    "own regime. At the default model (`python -m brorl_lab reach --model default --families products_2d products "
    "chain_sum simple_equations gcd spell_backward`: 128 training prompts x 512 draws at T=1, 80 s) the share with "
    "0 < p <= 1/16 is chain_sum 6%, simple_equations 9%, gcd 7%, spell_backward 8%, products 29%: all under the 30% "
    "gate, and products' rare successes are its 2-digit half, products_2d: 68%, mean p 0.006 (its questions are "
    "products questions, so the same hash partition holds its eval set out). ProRL v2 on products itself "
    "(`python -m brorl_lab plateau --families products --steps 60 --lr X`) moved held-out pass@1 0.191 -> 0.178 at "
    "lr 3e-4 and 0.191 -> 0.170 at lr 1e-3 and left 28.9% of 256 training prompts in 0 < p <= 1/16. On products_2d "
    "(`python -m brorl_lab plateau --lr X`) 100 steps of ProRL v2 at N=16 fired the slope rule at every lr tried, "
    "but at the recipe's lr 3e-4 (held-out 0.0083 -> 0.0061, slope -0.30 [-0.74, +0.13] points per 100 steps) and "
    "at 1e-4 (0.0083 -> 0.0083, slope +0.07 [-0.35, +0.48]) the gate failed: 28.9% and 26.6% of training prompts "
    "left in 0 < p <= 1/16, the rest mostly at p = 0 ('neither' 31% -> 70%) while mean p held (0.006 -> 0.008 at "
    "1e-4): N=16 concentrates the successes on fewer prompts. lr 3e-5 is the largest tried that keeps the branch "
    "point in the regime, so the plateau uses it; no lr made held-out pass@1 rise by a point, so the rule asks no "
    "gain first (a plateau from the start).")
# Settings the plateau run overrides in the recipe: resets off, as in every arm (study.arms.arm_configs), and the lr.
# lr 3e-5: at the recipe's 3e-4 (and at 1e-4) 100 steps at N=16 leave under 30% rare-success prompts (PLATEAU_TRIED).
PLATEAU_SETTINGS = dict(reset_every=0, reset_every_samples=0, lr=3e-5)


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
GATE = dict(min_share=0.30, max_p=1 / 16)
GATE_PROMPTS, GATE_DRAWS, GATE_SEED = 128, 512, 12345


def reach_gate(rates: pd.DataFrame, *, min_share: float = 0.30, max_p: float = 1 / 16) -> dict:
    """The reach gate on a :func:`brorl_lab.study.mechanism.prompt_pass_rates` table: the share of prompts with
    *rare successes*, 0 < p <= ``max_p`` (an N=16 group of such a prompt is all-wrong with probability
    (1 - p)^16 >= 0.36), must be >= ``min_share``. Returns prompts, share, passed and the arguments."""
    for name, v in (("min_share", min_share), ("max_p", max_p)):
        if not (is_finite_number(v) and 0 <= v <= 1):
            raise ValueError(f"{name}: got {v!r}; allowed: a float in [0, 1]")
    if not isinstance(rates, pd.DataFrame) or "p" not in rates.columns or rates.empty:
        raise ValueError("rates: allowed: a non-empty prompt_pass_rates table (column 'p')")
    share = float(((rates["p"] > 0) & (rates["p"] <= max_p)).mean())
    return dict(prompts=len(rates), share=share, passed=share >= min_share, min_share=min_share, max_p=max_p)


def measure_reach(policy, tokenizer, cfg: Config, *, prompts: int = GATE_PROMPTS, n_draws: int = GATE_DRAWS,
                  seed: int = GATE_SEED) -> pd.DataFrame:
    """Per-prompt pass rates of ``prompts`` training prompts of ``cfg.tasks`` (mixed as training mixes them) under
    ``policy``, ``n_draws`` samples each at the training sampler (:func:`~brorl_lab.study.mechanism.prompt_pass_rates`)."""
    from brorl_lab.rl.steps import sample_prompts
    from brorl_lab.study.mechanism import prompt_pass_rates

    check_int("prompts", prompts, 1)
    items = sample_prompts(cfg.tasks, prompts, seed=seed)
    return prompt_pass_rates(policy, tokenizer, items, cfg, n_draws=n_draws, chunk_prompts=16)


def reach_table(model: str, families: Sequence[str], *, prompts: int = GATE_PROMPTS, n_draws: int = GATE_DRAWS,
                max_p: float = GATE["max_p"]) -> pd.DataFrame:
    """Where ``model`` stands on each family's training prompts: :func:`brorl_lab.study.mechanism.reach_summary` of
    ``prompts`` prompts per family (each family measured alone, as :func:`measure_reach` draws them) x ``n_draws``
    samples at the plateau recipe's sampler, with the gate's share (``share 0<p<=max_p``) added. What chose the
    plateau's family (``python -m brorl_lab reach``)."""
    from brorl_lab.core.models import load_policy
    from brorl_lab.rollout.tasks import TASKS
    from brorl_lab.study.mechanism import reach_summary

    if not is_int(prompts) or prompts < 1:
        raise UserError(f"prompts: got {prompts!r}; allowed: an integer >= 1")
    for fam in families:  # every name checked before any work
        try:
            TASKS.get(fam)
        except ValueError as e:
            raise UserError(f"families: {e}") from None
    cfgs = [plateau_config(model=model, tasks=[fam]) for fam in families]
    policy, tok = load_policy(resolve_experiment_model(model))
    rows = []
    for cfg in cfgs:
        rates = measure_reach(policy, tok, cfg, prompts=prompts, n_draws=n_draws)
        row = reach_summary(rates).iloc[0].to_dict()
        row[f"share 0<p<={max_p:.4g}"] = reach_gate(rates, max_p=max_p)["share"]
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
            rates = measure_reach(trainer.policy, trainer.tokenizer, cfg, prompts=gate_prompts, n_draws=gate_draws)
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
              + "".join(f" or `brorl_lab.study.experiments.recipe_config(model=\"{a}\")`" for a, d in MODEL_ALIASES.items()
                        if repo_relative(d) == where) + ".", ""]
    return "\n".join(lines)
