"""The rl layer's registries, declared where no torch is imported, and the check of every name a Config holds.

Each registry lists its names here; the implementations register themselves when their module is imported
(``rl.algo`` the estimators, losses and KL estimators, ``rl.trackers`` the trackers). So the CLI checks
``--advantage``, ``--policy-loss``, ``--engine``, ``--tasks``, ``--report-to`` and a model path in a fraction of a
second, before torch, transformers or pandas load (issue 46), and :func:`brorl_lab.rl.spec.check` says the same
thing in the same words once they have.
"""

from __future__ import annotations

from brorl_lab.core.config import Config, ConfigError, check_choice, require_field
from brorl_lab.core.paths import looks_local
from brorl_lab.core.registry import Registry
from brorl_lab.core.rundir import hf_model_dir
from brorl_lab.core.validation import did_you_mean
from brorl_lab.rollout.engine_names import ENGINES
from brorl_lab.rollout.tasks import TASKS
from brorl_lab.rollout.tasks.templates import TEMPLATES

__all__ = ["ADVANTAGES", "POLICY_LOSSES", "KL_ESTIMATORS", "LOSS_AGGREGATIONS", "IS_CORRECTIONS", "TRACKERS",
           "check_names"]

ADVANTAGES = Registry("advantage", names=("grpo", "dr_grpo", "rloo", "reinforce_pp_baseline"))
POLICY_LOSSES = Registry("policy_loss", names=("ppo_clip", "pg"))
KL_ESTIMATORS = Registry("kl_estimator", names=("k1", "k2", "k3"))
LOSS_AGGREGATIONS = Registry("loss_agg", names=("token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"))
#: importance-sampling corrections of rl.algo.importance_weights
IS_CORRECTIONS = ("none", "truncate", "icepop_mask")
TRACKERS = Registry("tracker", names=("tensorboard", "wandb"))


def check_names(cfg: Config) -> Config:
    """Every name ``cfg`` holds against its registry (engine, ray_worker_engine, advantage, policy_loss, loss_agg,
    kl_estimator, is_correction, template, tasks / eval_tasks, report_to) and a model given as a path: one
    :class:`ConfigError` naming the field. Imports no implementation (no torch)."""
    engines = ENGINES.names()
    check_choice("engine", cfg.engine, engines)
    check_choice("ray_worker_engine", cfg.ray_worker_engine, [e for e in engines if e != "ray"])
    check_choice("advantage", cfg.advantage, ADVANTAGES.names())
    check_choice("policy_loss", cfg.policy_loss, POLICY_LOSSES.names())
    check_choice("loss_agg", cfg.loss_agg, LOSS_AGGREGATIONS.names())
    check_choice("kl_estimator", cfg.kl_estimator, KL_ESTIMATORS.names())
    check_choice("is_correction", cfg.is_correction, IS_CORRECTIONS)
    check_choice("template", cfg.template, ("auto", *TEMPLATES))
    for t in cfg.report_to:
        check_choice("report_to", t, TRACKERS.names())
    known = TASKS.names()
    for name, value in (("tasks", cfg.tasks), ("eval_tasks", cfg.eval_tasks or [])):
        for t in value:
            if ":" in t:
                try:
                    TASKS.check_name(t)
                except ValueError as e:
                    raise ConfigError(f"config field '{name}': {e}") from None  # e names the value
            elif t not in known:
                raise ConfigError(f"config field '{name}': got {t!r}{did_you_mean(t, known)}; "
                                  f"allowed: {TASKS.allowed()}")
    if cfg.model != "default" and looks_local(cfg.model):
        require_field("model", hf_model_dir(cfg.model) is not None,
                      "an existing HF model directory (with config.json), a run directory with policy/, 'default' "
                      "or a hub id", cfg.model)
    return cfg
