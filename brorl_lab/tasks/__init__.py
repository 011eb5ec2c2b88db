"""Verifiable task families, registered by name in ``TASKS``.

    from brorl_lab.tasks import TASKS, sample_items
    items = sample_items(["chain_sum"], count=8, seed=0)     # list[TaskItem]
    TASKS["chain_sum"].format_prompt(items[0])              # the exact prompt string the model sees

Each family module calls :func:`register_task` at import; the imports at the bottom of this file register them all.
"""

from __future__ import annotations

from ..registry import Registry
from .base import RewardResult, TaskFamily, TaskItem

TASKS = Registry("task")


def register_task(family: TaskFamily) -> TaskFamily:
    TASKS.register(family.name, family)
    return family


def get_task(name: str) -> TaskFamily:
    return TASKS.get(name)


# Family modules register themselves (kept at the bottom: they import register_task from here).
from . import gym, math_tasks, code  # noqa: E402,F401
