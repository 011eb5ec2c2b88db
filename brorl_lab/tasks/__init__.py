"""Verifiable task families, registered by name in ``TASKS``, plus mixing and the frozen eval sets.

    from brorl_lab.tasks import TASKS, sample_items, eval_set
    items = sample_items(["chain_sum", "gcd"], count=8, seed=0)   # list[TaskItem], families mixed uniformly
    TASKS["chain_sum"].format_prompt(items[0])                    # the exact prompt string the model sees
    evals = eval_set("gcd", limit=64)                             # the first 64 items of data/eval/gcd.jsonl

Each family module calls :func:`register_task` at import; the imports at the bottom of this file register them all.
Templates and answer extraction live in :mod:`brorl_lab.tasks.templates`.
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict
from pathlib import Path
from typing import Optional, Sequence

from ..registry import Registry
from .base import RewardResult, TaskFamily, TaskItem

TASKS = Registry("task")
EVAL_DIR = Path(__file__).resolve().parent.parent.parent / "data" / "eval"


def register_task(family: TaskFamily) -> TaskFamily:
    TASKS.register(family.name, family)
    return family


def get_task(name: str) -> TaskFamily:
    return TASKS.get(name)


def _check_names(names: str | Sequence[str]) -> list[str]:
    names = [names] if isinstance(names, str) else list(names)
    if not names:
        raise ValueError(f"names: got an empty list; allowed: task names from {', '.join(TASKS)}")
    for name in names:
        TASKS.get(name)  # unknown name -> ValueError naming it and the nearest valid one
        if names.count(name) > 1:
            raise ValueError(f"names: got {names!r} (task {name!r} listed {names.count(name)} times); "
                             "allowed: each task name at most once")
    return names


def sample_items(names: str | Sequence[str], count: int, *, seed: int, split: str = "train") -> list[TaskItem]:
    """``count`` items mixing the families ``names`` uniformly, deterministic in ``(names, count, seed, split)``.

    Family counts differ by at most one (``count // k`` each, the remainder to families picked by the seed), and
    the positions of the families are shuffled with ``random.Random(seed)``; each family draws its share from its
    own seeded stream (``TASKS[name].sample(share, seed=seed, split=split)``).
    """
    names = _check_names(names)
    from .gym import check_sample_args

    check_sample_args(count, seed, split)
    rng = random.Random(seed)
    shuffled = rng.sample(names, len(names))
    order = [shuffled[i % len(names)] for i in range(count)]  # [count] family per position
    rng.shuffle(order)
    streams = {name: iter(TASKS[name].sample(order.count(name), seed=seed, split=split)) for name in names}
    return [next(streams[name]) for name in order]


def eval_path(name: str) -> Path:
    TASKS.get(name)
    return EVAL_DIR / f"{name}.jsonl"


def eval_set(name: str, limit: Optional[int] = None) -> list[TaskItem]:
    """The frozen eval items of family ``name`` (``data/eval/<name>.jsonl``), the first ``limit`` of them if given."""
    path = eval_path(name)
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
        raise ValueError(f"limit: got {limit!r}; allowed: None or an integer >= 0")
    if not path.is_file():
        raise ValueError(f"eval set for task {name!r}: {path} does not exist; generate it with "
                         f"`python -m brorl_lab.make_data --families {name}`")
    items = []
    with path.open(encoding="utf-8") as f:
        for line in f:
            if limit is not None and len(items) >= limit:
                break
            if line.strip():
                items.append(TaskItem(**json.loads(line)))
    return items


def write_items(items: Sequence[TaskItem], path: Path) -> Path:
    """Write items as jsonl (one ``TaskItem`` per line), the format :func:`eval_set` reads."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for item in items:
            f.write(json.dumps(asdict(item), sort_keys=True) + "\n")
    return path


# Family modules register themselves (kept at the bottom: they import register_task from here).
from . import gym, math_tasks, code  # noqa: E402,F401
# The families defined in gym.py and math_tasks.py: what the default model is trained on and make_data freezes.
BUILTIN_FAMILIES = (*gym.GYM_FAMILIES, *math_tasks.MATH_FAMILIES)
from .templates import resolve_template  # noqa: E402,F401
