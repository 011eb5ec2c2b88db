"""The reward module ``launch --to verl`` writes as ``OUT/reward.py``: verl's ``custom_reward_function`` scoring each
response with brorl_lab's verifiers (the machines running verl need ``pip install brorl_lab``).

verl's reward manager calls ``compute_score(data_source=..., solution_str=..., ground_truth=..., extra_info=...)``
once per response, in a worker thread. Each data row carries in ``extra_info`` what our verifier needs: the task
item (``item``, JSON of a TaskItem), the prompt ``template``, the training ``reward`` ('score' or 'correct') and,
for user-named tasks (``rg:``/``local:``), their ``task_config``; a ``local:`` task's file travels with the folder
and the row names it relative to this file (``task_file``: ``data/qa.jsonl``), so the folder works wherever it is
copied. The result is verl's dict form:

    score = RewardResult.reward   (reward='score': partial credit where the family gives it)
          = RewardResult.correct  (reward='correct')
    acc   = RewardResult.correct  (what algorithm.filter_groups.metric='acc' and the validation pass@1 read)

This file is copied verbatim (it has no settings of its own), so it stays importable on its own: verl loads it by
path, not as part of the brorl_lab package.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any, Optional

_configured: dict[str, Any] = {}
_lock = threading.Lock()


def _family(name: str, task_config: Optional[dict], task_file: str = ""):
    """The task family ``name``, a user-named one built once with its ``task_config`` (thread-safe); a ``local:``
    task from ``task_file``, its copy beside this module, when the row names one."""
    from brorl_lab.rollout.tasks import TASKS

    if ":" not in name:
        return TASKS.get(name)
    with _lock:
        if name not in _configured:
            spec = f"local:{Path(__file__).resolve().parent / task_file}" if task_file else name
            _configured[name] = TASKS.build(spec, task_config)  # this module's own, built once
        return _configured[name]


def compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info: Optional[dict] = None,
                  **kwargs: Any) -> dict:
    """``{"score": reward, "acc": correct}`` of ``solution_str`` for the row's task item; a row not written by
    ``launch --to verl`` (no ``extra_info.item``) or one whose item disagrees with ``data_source`` /
    ``ground_truth`` is a ValueError naming what is wrong."""
    from brorl_lab.rollout.tasks import TaskItem

    info = extra_info or {}
    if "item" not in info:
        raise ValueError(f"extra_info: got keys {sorted(info)} for data_source={data_source!r}; allowed: rows written by "
                         "`python -m brorl_lab launch --to verl` (extra_info.item holds the task item)")
    item = TaskItem(**json.loads(info["item"]))
    if item.family != data_source or item.answer != ground_truth:
        raise ValueError(f"row: data_source={data_source!r}, ground_truth={ground_truth!r} but extra_info.item is "
                         f"{item.family!r} with answer {item.answer!r}; allowed: the row as launch wrote it")
    task_config = json.loads(info["task_config"]) if info.get("task_config") else None
    family = _family(item.family, task_config, info.get("task_file") or "")
    result = family.score(solution_str, item, info.get("template", "plain"))
    score = float(result.correct) if info.get("reward") == "correct" else float(result.reward)
    return {"score": score, "acc": float(result.correct)}
