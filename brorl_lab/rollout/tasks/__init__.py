"""Verifiable task families, registered by name in ``TASKS``, plus mixing and the frozen eval sets.

    from brorl_lab.rollout.tasks import TASKS, sample_items, eval_set
    items = sample_items(["chain_sum", "gcd"], count=8, seed=0)   # list[TaskItem], families mixed uniformly
    TASKS["chain_sum"].format_prompt(items[0])                    # the exact prompt string the model sees
    evals = eval_set("gcd", limit=64)                             # the first 64 items of data/eval/gcd.jsonl
    TASKS.configure("rg:knights_knaves", {"n_people": 2})         # any reasoning-gym dataset, with its config
    TASKS["local:qa.jsonl"]                                       # a question/answer file, scored by math-verify

Each family module calls :func:`~brorl_lab.rollout.tasks.base.register_task` at import (the registry lives in
:mod:`.base`); importing this package imports every family module, so ``TASKS`` is complete.
User-named tasks (``rg:<dataset>``, ``local:<file>``) are built on first use by :mod:`.user`.
Templates and answer extraction live in :mod:`brorl_lab.rollout.tasks.templates`.
"""

from brorl_lab.rollout.tasks import code, gym, math_tasks
from brorl_lab.rollout.tasks.base import TASKS, RewardResult, TaskFamily, TaskItem, get_task, register_task
from brorl_lab.rollout.tasks import sets
from brorl_lab.rollout.tasks.sets import eval_path, eval_set, sample_items, write_items
from brorl_lab.rollout.tasks import user  # the rg:<dataset> and local:<file> prefixes
from brorl_lab.rollout.tasks.templates import resolve_template

# The families defined in gym.py and math_tasks.py: what the default model is trained on and make_data freezes.
BUILTIN_FAMILIES = (*gym.GYM_FAMILIES, *math_tasks.MATH_FAMILIES)

__all__ = ["TASKS", "BUILTIN_FAMILIES", "RewardResult", "TaskFamily", "TaskItem", "code", "eval_path", "eval_set",
           "get_task", "gym", "math_tasks", "register_task", "resolve_template", "sample_items", "sets",
           "configure_tasks", "user", "write_items"]


def configure_tasks(names, task_configs: dict | None = None) -> list[TaskFamily]:
    """Build each user-named task of ``names`` with its entry of ``task_configs`` (Config.task_configs) and make
    it the family ``TASKS`` returns; built-in names are returned as registered. What a Trainer and ``eval`` call
    before sampling, so a run uses its own config even after another Config reconfigured a name."""
    task_configs = task_configs or {}
    return [TASKS.configure(name, task_configs.get(name)) for name in names]
