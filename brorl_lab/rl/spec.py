"""A Config resolved at the rl boundary: names checked against their registries, tasks built, template fixed.

A :class:`~brorl_lab.core.config.Config` is plain data (types and ranges). What it *names* is checked here, once,
against the registries that hold the implementations, so no list of names is kept twice:

    spec = resolve(cfg)                        # ConfigError naming the field, before any model loads
    spec.families["local:qa.jsonl"]            # this run's own family, built with cfg.task_configs
    spec.template                              # 'plain' or 'chat' ('auto' resolved; pass tokenizer= to use its)
    sample_prompts(cfg.tasks, 8, seed=0, task_families=spec.families)

``resolve`` writes no global state: two Configs with different ``task_configs`` for one ``local:`` file each get
their own family, and building or resolving one never changes what the other samples. The Trainer, the ``eval``
command and :mod:`brorl_lab.study.mechanism` all go through it.

    check(cfg)        names only: engine, ray_worker_engine, advantage (and N >= 2 for a group estimator),
                      policy_loss, loss_agg, kl_estimator, is_correction, template, tasks / eval_tasks (user-named
                      ones: the dataset or file exists), report_to, and a model given as a path exists
    resolve(cfg)      check(cfg), then each task of tasks / eval_tasks built with its entry of task_configs
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from brorl_lab.core.config import Config, ConfigError, check_choice, require_field
from brorl_lab.rl import algo, allocation
from brorl_lab.rl.names import check_names
from brorl_lab.rollout.tasks import TaskFamily, build_tasks
from brorl_lab.rollout.tasks.templates import resolve_template
from brorl_lab.rollout.tasks.user import TaskFileError

__all__ = ["RunSpec", "check", "resolve"]


@dataclass(frozen=True)
class RunSpec:
    """What a run needs beyond its Config's plain values, owned by the run (nothing here is registered globally)."""

    cfg: Config
    families: Mapping[str, TaskFamily]  # every task of cfg.tasks and cfg.eval_tasks, built with cfg.task_configs
    template: str  # 'plain' or 'chat': cfg.template with 'auto' resolved

    def with_tokenizer(self, tokenizer: Any) -> "RunSpec":
        """The spec with ``template='auto'`` resolved against ``tokenizer`` (chat iff it has a chat template)."""
        return replace(self, template=resolve_template(self.cfg.template, self.cfg.model, tokenizer))

    @property
    def eval_tasks(self) -> list[str]:
        return list(self.cfg.eval_tasks or self.cfg.tasks)


def check(cfg: Config) -> Config:
    """Validate ``cfg`` (again: a notebook may have edited fields since it was built) and every name it holds
    against the registry that defines it. Raises one-line :class:`ConfigError` s naming the field; builds nothing."""
    if not isinstance(cfg, Config):
        raise ValueError(f"cfg: got {type(cfg).__name__}; allowed: a brorl_lab.Config")
    cfg.validate()
    check_names(cfg)  # every registry name and the model path (rl.names: what the CLI checks before torch loads)
    check_choice("rollout_allocation", cfg.rollout_allocation, allocation.ALLOCATORS.names())
    if getattr(algo.ADVANTAGES.get(cfg.advantage), "needs_group", True):
        require_field("rollouts_per_prompt", cfg.rollouts_per_prompt >= 2,
                      f"an integer >= 2 for the group estimator advantage='{cfg.advantage}'", cfg.rollouts_per_prompt)
    return cfg


def resolve(cfg: Config, *, tokenizer: Any = None) -> RunSpec:
    """:func:`check` ``cfg``, then build every task it names with its ``task_configs`` (a bad dataset kwarg, a
    missing column or an unreadable file fails here, naming 'task_configs') into a :class:`RunSpec` the caller owns.
    ``template='auto'`` is resolved against ``tokenizer`` when given, else by the model name
    (:func:`~brorl_lab.rollout.tasks.templates.resolve_template`)."""
    check(cfg)
    try:
        families = build_tasks(cfg.task_names(), cfg.task_configs)
    except TaskFileError as e:  # the file itself is at fault: name the task, not the (maybe empty) settings
        raise ConfigError(f"config field 'tasks': {e}") from None
    except ValueError as e:
        raise ConfigError(f"config field 'task_configs': got {cfg.task_configs!r}; {e}") from None
    return RunSpec(cfg, families, resolve_template(cfg.template, cfg.model, tokenizer))
