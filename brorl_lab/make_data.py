"""Regenerate the frozen eval sets: ``data/eval/<family>.jsonl``, one :class:`~brorl_lab.tasks.TaskItem` per line.

    python -m brorl_lab.make_data                          # every family of gym.py and math_tasks.py, 200 items each
    python -m brorl_lab.make_data --families code --size 100

Eval items are drawn with ``split="eval"``: a seed stream disjoint from training streams, keeping only questions
whose text hashes into the eval partition (see :mod:`brorl_lab.tasks.gym`), so no training question ever appears
in an eval set. The files are committed; regenerating them with the same reasoning-gym version reproduces them.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Optional, Sequence

from .tasks import BUILTIN_FAMILIES, EVAL_DIR, TASKS, TaskItem, write_items

EVAL_SIZE = 200
EVAL_SEED = 0
DEFAULT_EVAL_FAMILIES = BUILTIN_FAMILIES


def make_eval_sets(families: Sequence[str] = DEFAULT_EVAL_FAMILIES, *, size: int = EVAL_SIZE, seed: int = EVAL_SEED,
                   out_dir: Path = EVAL_DIR) -> dict[str, Path]:
    """Write ``size`` eval items per family to ``out_dir/<family>.jsonl``; returns the paths written.

    Items are the first ``size`` distinct questions of the family's eval stream (a repeated question would count
    twice in pass@1 without testing anything new).
    """
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ValueError(f"size: got {size!r}; allowed: an integer >= 1")
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
        raise ValueError(f"size: task {name!r} has only {len(items)} distinct eval questions in {8 * size} draws; "
                         f"allowed: at most {len(items)} (or widen the family's difficulty config)")
    return items[:size]


def main(argv: Optional[Sequence[str]] = None) -> dict[str, Path]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--families", nargs="+", default=list(DEFAULT_EVAL_FAMILIES))
    ap.add_argument("--size", type=int, default=EVAL_SIZE)
    ap.add_argument("--seed", type=int, default=EVAL_SEED)
    ap.add_argument("--out-dir", default=str(EVAL_DIR))
    args = ap.parse_args(argv)
    return make_eval_sets(args.families, size=args.size, seed=args.seed, out_dir=Path(args.out_dir))


if __name__ == "__main__":
    for name, path in main().items():
        print(f"{name}: {path}")
