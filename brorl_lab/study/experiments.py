"""BroRL vs ProRL in miniature: a plateaued policy, two arms branched from it, and a verdict computed from the data.

BroRL (arXiv 2510.01180, Sec. 5) starts from a ProRL checkpoint whose progress at N = 16 rollouts per prompt has
slowed, and continues it two ways: the **ProRL arm** keeps N = 16 with 512 prompts per step, the **BroRL arm**
uses N = 512 with 128 prompts per step (8x the samples per step), the same number of optimizer updates per step
and a learning rate scaled by sqrt(samples-per-step ratio). This module does the same at laptop scale:

    cfg = plateau_config()                                  # ProRL v2 at N=16 on the rare-success family
    res = train_plateau(cfg, out="data/plateau_model")      # train until the slope rule fires, gate, save HF dir
    arms = arm_configs(recipe_config(model="plateau"), n_small=16, n_large=512, prompts_small=16)
    df = run_rollout_scaling(recipe_config(model="plateau", steps=8), seeds=[0, 1, 2], root="runs/rs")
    summarize(df)                                           # one row per arm: final pass@1, samples, time, ...
    print(verdict(df))                                      # which arm is ahead, at equal samples and equal time

or from a shell: ``python -m brorl_lab plateau`` and ``python -m brorl_lab scaling``.

Budget units: a *sample* is one generated response (prompt x rollout), counted over every dynamic-sampling round
(the metrics' ``cum_samples``); *trained samples* are those that survive the filter (kept groups x N). Wall time is
the Trainer's ``cum_wall_s``: training time with evaluation excluded.

One import for the flagship notebook: the plateau (:mod:`brorl_lab.study.plateau`), the arms
(:mod:`brorl_lab.study.arms`) and their comparison (:mod:`brorl_lab.lab.analysis`).
"""

from __future__ import annotations

# Importing plots makes figures survive a notebook's HTML export (plots.exportable_figures) for a notebook that
# imports only this facade.
from brorl_lab.lab import plots
from brorl_lab.lab.analysis import ARM_NAMES, ARMS, X_AXES, arm_display_names, compare_arms, families_of, summarize, verdict
from brorl_lab.study.arms import (
    DEFAULT_ROOT,
    PAPER_ARMS,
    arm_configs,
    arms_table,
    experiment_root,
    run_arm,
    run_rollout_scaling,
    save_outputs,
)
from brorl_lab.study.plateau import (
    FLAGSHIP_RECIPE,
    GATE,
    MODEL_ALIASES,
    PLATEAU_FAMILIES,
    PLATEAU_RULE,
    RECIPE,
    RECIPES,
    PlateauResult,
    eval_curve,
    hard_families,
    measure_reach,
    plateau_config,
    plateau_families,
    plateau_markdown,
    plateau_reached,
    plateau_rule,
    reach_gate,
    reach_table,
    recipe_config,
    resolve_experiment_model,
    save_plateau_model,
    train_plateau,
)

__all__ = [  # the facade: every name above
    "plots", "ARM_NAMES", "ARMS", "X_AXES", "arm_display_names", "compare_arms", "families_of", "summarize",
    "verdict", "DEFAULT_ROOT", "PAPER_ARMS", "arm_configs", "arms_table", "experiment_root", "run_arm",
    "run_rollout_scaling", "save_outputs", "FLAGSHIP_RECIPE", "GATE", "MODEL_ALIASES", "PLATEAU_FAMILIES",
    "PLATEAU_RULE", "RECIPE", "RECIPES", "PlateauResult", "eval_curve", "hard_families", "measure_reach",
    "plateau_config", "plateau_families", "plateau_markdown", "plateau_reached", "plateau_rule", "reach_gate",
    "reach_table", "recipe_config", "resolve_experiment_model", "save_plateau_model", "train_plateau"
]
