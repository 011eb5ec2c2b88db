"""Verifiable task families, registered by name in ``TASKS``, plus mixing and the frozen eval sets.

    from brorl_lab.rollout.tasks import TASKS, sample_items, eval_set
    items = sample_items(["chain_sum", "gcd"], count=8, seed=0)   # list[TaskItem], families mixed uniformly
    TASKS["chain_sum"].format_prompt(items[0])                    # the exact prompt string the model sees
    evals = eval_set("gcd", limit=64)                             # the first 64 items of data/eval/gcd.jsonl
    own = build_tasks(["rg:knights_knaves"], {"rg:knights_knaves": {"n_people": 2}})  # a dataset with its config
    sample_items(["rg:knights_knaves"], 8, seed=0, task_families=own)             # ... sampled with that config
    TASKS["local:qa.jsonl"]                                       # a question/answer file, scored by math-verify

Each family module calls :func:`~brorl_lab.rollout.tasks.base.register_task` at import (the registry lives in
:mod:`.base`); importing this package imports every family module, so ``TASKS`` is complete.
User-named tasks (``rg:<dataset>``, ``local:<file>``) are built on first use by :mod:`.user`.
Templates and answer extraction live in :mod:`brorl_lab.rollout.tasks.templates`.
"""

from brorl_lab.rollout.tasks import (
    code,
    gym,
    math_tasks,
    sets,
    user,  # the rg:<dataset> and local:<file> prefixes
)
from brorl_lab.rollout.tasks.base import (
    TASKS,
    RewardResult,
    TaskFamily,
    TaskItem,
    build_tasks,
    family_of,
    get_task,
    register_task,
)
from brorl_lab.rollout.tasks.sets import eval_path, eval_set, sample_items, write_items
from brorl_lab.rollout.tasks.templates import resolve_template

# The families defined in gym.py and math_tasks.py: what the default model is trained on and make_data freezes.
BUILTIN_FAMILIES = (*gym.GYM_FAMILIES, *math_tasks.MATH_FAMILIES)

__all__ = ["TASKS", "BUILTIN_FAMILIES", "RewardResult", "TaskFamily", "TaskItem", "build_tasks", "code", "eval_path",
           "eval_set", "family_of", "get_task", "gym", "math_tasks", "register_task", "resolve_template",
           "sample_items", "sets", "user", "write_items"]
