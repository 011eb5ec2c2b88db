"""Regenerate the frozen eval sets: ``data/eval/<family>.jsonl``, one :class:`~brorl_lab.rollout.tasks.TaskItem` per line.

    python -m brorl_lab make-data                          # every family of gym.py and math_tasks.py, 200 items each
    python -m brorl_lab make-data --families code --size 100

Eval items are drawn with ``split="eval"``: a seed stream disjoint from training streams, keeping only questions
whose text hashes into the eval partition (see :mod:`brorl_lab.rollout.tasks.gym`), so no training question ever appears
in an eval set. The files are committed; regenerating them with the same reasoning-gym version reproduces them.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from brorl_lab.core.paths import EVAL_DIR
from brorl_lab.core.validation import UserError, check_int
from brorl_lab.rollout.tasks import BUILTIN_FAMILIES, TASKS, TaskItem, write_items

EVAL_SIZE = 200
EVAL_SEED = 0
DEFAULT_EVAL_FAMILIES = BUILTIN_FAMILIES


def make_eval_sets(families: Sequence[str] = DEFAULT_EVAL_FAMILIES, *, size: int = EVAL_SIZE, seed: int = EVAL_SEED,
                   out_dir: Path = EVAL_DIR) -> dict[str, Path]:
    """Write ``size`` eval items per family to ``out_dir/<family>.jsonl``; returns the paths written.

    Items are the first ``size`` distinct questions of the family's eval stream (a repeated question would count
    twice in pass@1 without testing anything new).
    """
    check_int('size', size, 1)
    return {name: write_items(distinct_eval_items(name, size, seed), Path(out_dir) / f"{name}.jsonl")
            for name in families}


def distinct_eval_items(name: str, size: int, seed: int) -> list[TaskItem]:
    """The first ``size`` items of the eval stream with distinct questions (drawing up to 8x ``size``)."""
    seen, items = set(), []
    for item in TASKS.get(name).sample(8 * size, seed=seed, split="eval"):
        if item.question not in seen:
            seen.add(item.question)
            items.append(item)
    if len(items) < size:
        raise UserError(f"size: task {name!r} has only {len(items)} distinct eval questions in {8 * size} draws; "
                         f"allowed: at most {len(items)} (or widen the family's difficulty config)")
    return items[:size]
