"""The study's recipes and how a run's config is built and opened: the base every experiment of the study starts from.

A run's config travels one way, ``arms -> recipe -> trainer``::

    base = recipe_config("prorl_v2", model="plateau", steps=8)    # RECIPES[...] + overrides -> a validated Config
    trainer = open_trainer(base.replace(run_dir="runs/x"), progress=True)   # resumed when its checkpoint exists

- :data:`RECIPES`: the ProRL recipes at small N (docs/RECIPES.md); :data:`FLAGSHIP_RECIPE` is the branch's.
- :data:`MODEL_ALIASES`: short model names (``"plateau"`` -> data/plateau_model) that :func:`resolve_experiment_model`
  turns into directories.
- The families a run trains on when none are named: those of a plateau checkpoint (:func:`plateau_families`, read
  from its plateau.json) or else :func:`hard_families` (the default model solves them only sometimes).
- :func:`open_trainer` / :func:`check_same_config`: a run directory is resumed only by the settings that made it.

Every study module that builds or opens a run imports this one; none of them goes through :mod:`.plateau` for it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from brorl_lab.core.config import Config
from brorl_lab.core.paths import DEFAULT_MODEL_DIR, LEARNED_PLATEAU_DIR, PLATEAU_MODEL_DIR, TAKEOFF_BASE_DIR
from brorl_lab.core.validation import UserError, is_number

#: Short model names a study config accepts; each points at a shipped HF model directory: 'floor' (= 'plateau', the
#: products_2d floor the regime map and the earlier flagship results use), 'learned' (a plateau ProRL v2 first
#: raised, issue 38) and 'takeoff' (a less-trained base whose learnable family sits in the rare-success regime
#: before learning: the takeoff race).
MODEL_ALIASES = {"plateau": PLATEAU_MODEL_DIR, "floor": PLATEAU_MODEL_DIR, "learned": LEARNED_PLATEAU_DIR,
                 "takeoff": TAKEOFF_BASE_DIR}
#: How each alias's directory is built when it is missing (the error names it).
MODEL_BUILDERS = {"plateau": "python -m brorl_lab plateau", "floor": "python -m brorl_lab plateau",
                  "learned": "python -m brorl_lab plateau --families spell_backward gcd --lr 3e-4 --gain 0.05 "
                             "--out data/learned_plateau",
                  "takeoff": "python -m brorl_lab train-default --steps 400 --out data/takeoff_base"}

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

#: The recipe's arm table: each arm's N (``rollouts_per_prompt``) and ``prompts_per_step`` (BroRL Sec. 5's 4:1
#: design at a laptop's scale: 8x the samples per step at a quarter of the prompts; the paper's own values are
#: study.arms.PAPER_ARMS). The one place the study writes these numbers: every arm's Config takes them from here.
ARM_TABLE = {"prorl": dict(rollouts_per_prompt=16, prompts_per_step=64),
             "brorl": dict(rollouts_per_prompt=512, prompts_per_step=16),
             "middle": dict(rollouts_per_prompt=64, prompts_per_step=32)}
#: BroRL Sec. 5's own arms (the paper's constants, shown beside ours by study.arms.arms_table).
PAPER_ARMS = {"prorl": dict(rollouts_per_prompt=16, prompts_per_step=512),
              "brorl": dict(rollouts_per_prompt=512, prompts_per_step=128)}


def arm_options(table: dict, middle: bool) -> dict:
    """An arm table's rows ({arm: {rollouts_per_prompt, prompts_per_step}}) as
    :func:`brorl_lab.study.arms.arm_configs`' options (n_small, prompts_small, n_large, prompts_large, and the
    middle arm's when ``middle``)."""
    names = {"prorl": "small", "brorl": "large", **({"middle": "mid"} if middle else {})}
    return {k: v for arm, tag in names.items() for k, v in (
        (f"n_{tag}", table[arm]["rollouts_per_prompt"]), (f"prompts_{tag}", table[arm]["prompts_per_step"]))}


# Fields that may differ between a saved run and the request without changing what the run computes.
IGNORED_FIELDS = ("torch_threads", "run_dir")


def resolve_experiment_model(model: str) -> str:
    """An alias of :data:`MODEL_ALIASES` (``'plateau'``) -> its shipped checkpoint directory (absolute, so notebooks
    running in notebooks/ find it); anything else is returned unchanged for :class:`Config` to check."""
    if not isinstance(model, str) or not model.strip():
        raise UserError(f"model: got {model!r}; allowed: {', '.join(repr(a) for a in MODEL_ALIASES)}, 'default', a "
                        "local HF model directory or a hub id")
    if model in MODEL_ALIASES:
        path = MODEL_ALIASES[model]
        if not (path / "config.json").is_file():
            raise UserError(f"model: {model!r} -> {path} has no config.json; build it with "
                            f"`{MODEL_BUILDERS.get(model, 'python -m brorl_lab plateau')}`")
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


def plateau_families(model: str) -> Optional[list[str]]:
    """The families a plateau checkpoint was trained on (its plateau.json), or None for any other model."""
    meta = Path(model) / "plateau.json"
    if meta.is_file():
        return list(json.loads(meta.read_text())["families"])
    return None


def recipe_config(recipe: str = FLAGSHIP_RECIPE, **overrides) -> Config:
    """A ProRL recipe (``RECIPES[recipe]``: 'prorl_v2' or 'prorl_v1') as a validated Config, ``overrides`` applied.

    ``model='plateau'`` names the shipped plateau checkpoint; ``tasks`` defaults to the plateau model's families
    (read from its plateau.json) when the model is a plateau checkpoint, else to :func:`hard_families`.
    """
    if recipe not in RECIPES:
        raise UserError(f"recipe: got {recipe!r}; allowed: {', '.join(RECIPES)}")
    d = {**RECIPES[recipe], **overrides}
    d["model"] = resolve_experiment_model(d.get("model", "default"))
    if "tasks" not in overrides or overrides["tasks"] is None:
        d["tasks"] = plateau_families(d["model"]) or hard_families()
    return Config.from_dict(d)


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


def check_same_config(path: Path, cfg: Config) -> None:
    """Raise a :class:`UserError` naming the differing fields when ``path`` holds a run whose config differs from
    ``cfg`` in anything but :data:`IGNORED_FIELDS`."""
    from brorl_lab.core.rundir import RunDir

    try:
        saved = RunDir(path).read_config()
    except (OSError, ValueError) as e:
        raise UserError(f"root: {path} holds a run whose config.yaml cannot be read ({e}); allowed: a fresh root "
                        "or one written by this function") from e
    want = cfg.to_dict()
    saved = {**Config().to_dict(), **saved}  # a field added since the run was written reads as its default
    diff = sorted(k for k in want if k not in IGNORED_FIELDS and saved.get(k) != want[k])
    if diff:
        shown = ", ".join(f"{k}: {saved.get(k)!r} there, {want[k]!r} asked" for k in diff[:4])
        raise UserError(f"root: {path} already holds a run with a different config ({shown}); allowed: the same "
                        "settings (to resume it), another root, or delete that directory")
