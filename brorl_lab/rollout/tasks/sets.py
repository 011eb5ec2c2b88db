"""Task sets: uniform mixing of families for training prompts, and the frozen eval sets in ``data/eval/``."""


from __future__ import annotations

import json
import os
import random
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Optional

from brorl_lab.core.validation import UserError, is_int
from brorl_lab.rollout.tasks.base import TASKS, TaskFamily, TaskItem, family_of
from brorl_lab.rollout.tasks.gym import check_sample_args


def _check_names(names: str | Sequence[str], task_families: Optional[Mapping[str, TaskFamily]]) -> list[str]:
    names = [names] if isinstance(names, str) else list(names)
    if not names:
        raise UserError(f"names: got an empty list; allowed: task names from {', '.join(TASKS)}")
    for name in names:
        family_of(name, task_families)  # unknown name -> ValueError naming it and the nearest valid one
        if names.count(name) > 1:
            raise UserError(f"names: got {names!r} (task {name!r} listed {names.count(name)} times); "
                             "allowed: each task name at most once")
    return names


def sample_items(names: str | Sequence[str], count: int, *, seed: int, split: str = "train",
                 task_families: Optional[Mapping[str, TaskFamily]] = None) -> list[TaskItem]:
    """``count`` items mixing the families ``names`` uniformly, deterministic in ``(names, count, seed, split)``.
    Families come from ``task_families`` (a run's own, ``RunSpec.families``) where it names them, else from ``TASKS``.

    Family counts differ by at most one (``count // k`` each, the remainder to families picked by the seed), and
    the positions of the families are shuffled with ``random.Random(seed)``; each family draws its share from its
    own seeded stream (``TASKS[name].sample(share, seed=seed, split=split)``).
    """
    names = _check_names(names, task_families)
    check_sample_args(count, seed, split)
    rng = random.Random(seed)
    shuffled = rng.sample(names, len(names))
    order = [shuffled[i % len(names)] for i in range(count)]  # [count] family per position
    rng.shuffle(order)
    streams = {name: iter(family_of(name, task_families).sample(order.count(name), seed=seed, split=split))
               for name in names}
    return [next(streams[name]) for name in order]


def eval_path(name: str, task_families: Optional[Mapping[str, TaskFamily]] = None) -> Path:
    """The frozen eval set of family ``name``: ``data/eval/<name>.jsonl`` for the built-in families; for
    ``rg:``/``local:`` tasks a file in the cache, built on first use (see :mod:`.user`), for the config of the
    family in ``task_families`` when given."""
    return family_of(name, task_families).eval_file()


def eval_set(name: str, limit: Optional[int] = None,
             task_families: Optional[Mapping[str, TaskFamily]] = None) -> list[TaskItem]:
    """The frozen eval items of family ``name`` (see :func:`eval_path`), the first ``limit`` of them if given."""
    if limit is not None and (not is_int(limit) or limit < 0):
        raise ValueError(f"limit: got {limit!r}; allowed: None or an integer >= 0")
    path = eval_path(name, task_families)
    if not path.is_file():
        raise UserError(f"eval set for task {name!r}: {path} does not exist; generate it with "
                         f"`python -m brorl_lab make-data --families {name}`")
    items = []
    with path.open(encoding="utf-8") as f:
        for line in f:
            if limit is not None and len(items) >= limit:
                break
            if line.strip():
                items.append(TaskItem(**json.loads(line)))
    return items


def write_items(items: Sequence[TaskItem], path: Path) -> Path:
    """Write items as jsonl (one ``TaskItem`` per line), the format :func:`eval_set` reads. The file appears
    whole (written beside it, then renamed), so a reader in a parallel sweep never sees half an eval set."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with tmp.open("w", encoding="utf-8") as f:
        for item in items:
            f.write(json.dumps(asdict(item), sort_keys=True) + "\n")
    os.replace(tmp, path)
    return path

