"""Verifiable rewards: each response is scored by the verifier of the family its prompt came from.

For sample ``b`` of a prompt-major batch (``b = p * N + s``), the item is ``batch.items[b // N]`` and

    reward_b  = family(item).score(text_b).reward     # float in [0, 1] (reasoning-gym scores may be partial)
    correct_b = family(item).score(text_b).correct    # bool, what dynamic sampling and pass@k use

Notebook use:

    batch = engine.generate([TASKS[i.family].format_prompt(i) for i in items], n=16, sampling=sp)
    batch = score(dataclasses.replace(batch, items=items))      # new batch with rewards [P*N] and correct [P*N]
    batch.to_pandas()[["response", "reward", "correct"]]
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Optional

import torch

from brorl_lab.core.batch import RolloutBatch
from brorl_lab.rollout.tasks import RewardResult, TaskFamily, TaskItem, family_of
from brorl_lab.rollout.tasks.templates import check_template


def score_response(response: str, item: TaskItem, template: str = "plain",
                   task_families: Optional[Mapping[str, TaskFamily]] = None) -> RewardResult:
    """Score one response with the verifier of ``item.family`` (from ``task_families``, a run's own, where it names
    it; else from ``TASKS``). Malformed output scores 0; it never raises."""
    if not isinstance(item, TaskItem):
        raise ValueError(f"item: got {type(item).__name__}; allowed: a brorl_lab.rollout.tasks.TaskItem")
    check_template(template)
    return family_of(item.family, task_families).score(response, item, template)


def score(batch: RolloutBatch, *, template: str = "plain", reward: str = "score",
          task_families: Optional[Mapping[str, TaskFamily]] = None) -> RolloutBatch:
    """A copy of ``batch`` with ``rewards`` [P*N] float32 and ``correct`` [P*N] bool filled from ``batch.items``.

    The input batch is not modified (``dataclasses.replace``); ``meta['reward_template']`` records the template.
    ``reward='score'`` trains on the verifier's score (partial credit where a family gives it); ``reward='correct'``
    on the binary exact answer (``rewards = correct``), what pass@k counts.
    For per-sample verifier notes ("wrong", "no answer found", ...) call :func:`score_response` directly.
    """
    if batch.items is None or len(batch.items) == 0:
        raise ValueError("batch.items: got None or empty; allowed: one TaskItem per prompt "
                         "(set it with dataclasses.replace(batch, items=items) before scoring)")
    if len(batch.items) != batch.num_prompts:
        raise ValueError(f"batch.items: got {len(batch.items)} items for {batch.num_prompts} prompts; "
                         "allowed: exactly one TaskItem per prompt")
    check_template(template)
    if reward not in ("score", "correct"):
        raise ValueError(f"reward: got {reward!r}; allowed: 'score' or 'correct'")
    results = [score_response(text, batch.items[p], template, task_families)
               for p, text in zip(batch.prompt_index.tolist(), batch.texts)]  # any group sizes
    rewards = torch.tensor([float(r.correct) if reward == "correct" else r.reward for r in results],
                           dtype=torch.float32)  # [P*N]
    correct = torch.tensor([r.correct for r in results], dtype=torch.bool)  # [P*N]
    return replace(batch, rewards=rewards, correct=correct, meta={**batch.meta, "reward_template": template})


__all__ = ["score", "score_response"]
