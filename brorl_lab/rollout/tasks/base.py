"""The task-family contract: prompts from a verifiable family, and a verifier for its answers.

A family turns seeds into :class:`TaskItem` s (a question and what is needed to check an answer), formats them
into prompts with an explicit template, and scores a model's response into a :class:`RewardResult` with a float
``reward`` and a binary ``correct`` (dynamic sampling filters on ``correct``). Scoring never raises: malformed
output scores 0.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from brorl_lab.core.paths import EVAL_DIR
from brorl_lab.core.registry import Registry


@dataclass
class TaskItem:
    family: str  # registry name of the family that made it
    uid: str  # stable id (family:split:index or a hash of the question); train/eval disjointness is checked on it
    question: str  # the task text, before any template
    answer: str  # the reference answer (for display and verifiers)
    meta: dict = field(default_factory=dict)  # whatever the verifier needs (a reasoning-gym entry, unit tests, ...)


@dataclass
class RewardResult:
    reward: float  # what the policy is trained on
    correct: bool  # binary success, used by dynamic sampling and pass@k
    extracted: Optional[str] = None  # the answer the extractor found, None if it found none
    info: str = ""  # why (e.g. "no answer found", "timeout", "3/4 tests passed")


class TaskFamily(ABC):
    """One verifiable task family. Subclasses set ``name`` and ``description`` and implement the methods."""

    name: str = "base"
    description: str = ""

    @abstractmethod
    def sample(self, count: int, *, seed: int, split: str = "train") -> list[TaskItem]:
        """``count`` items, deterministic in (seed, split). Eval items come from a disjoint seed space."""

    @abstractmethod
    def format_prompt(self, item: TaskItem, template: str = "plain", tokenizer: Any = None) -> str:
        """The exact prompt string the model sees (templates are shown to the user, never hidden)."""

    @abstractmethod
    def score(self, response: str, item: TaskItem, template: str = "plain") -> RewardResult:
        """Verify one response. Never raises; malformed output gets reward 0 and correct False."""

    def eval_file(self) -> Path:
        """The family's frozen eval set (jsonl of TaskItems). Built-in families ship theirs in ``data/eval/`` (made
        by ``make-data``, so a missing file is an error to fix there); user-named families build theirs into the
        cache on first use and return that path."""
        return EVAL_DIR / f"{self.name}.jsonl"

    def __repr__(self) -> str:
        return f"<task family {self.name!r}: {self.description}>"


# Every family, by name; filled when the family modules are imported. Prefixed names (``rg:<dataset>``,
# ``local:<file>``) are built on demand by :mod:`.user`.
TASKS = Registry("task")


def register_task(family: TaskFamily) -> TaskFamily:
    TASKS.register(family.name, family)
    return family


def get_task(name: str) -> TaskFamily:
    return TASKS.get(name)


def family_of(name: str, task_families: Optional[Mapping[str, TaskFamily]] = None) -> TaskFamily:
    """The family called ``name``: from ``task_families`` (a run's own, built from its config:
    ``RunSpec.families``) when it holds the name, else from ``TASKS`` (user-named tasks with their default config)."""
    if task_families is not None and name in task_families:
        return task_families[name]
    return TASKS.get(name)


def build_tasks(names, task_configs: Optional[Mapping[str, dict]] = None) -> dict[str, TaskFamily]:
    """A family for each name, user-named ones (``rg:``, ``local:``) built fresh with their entry of
    ``task_configs``; built-in names as registered. The caller owns the result: nothing global changes, so two
    configs of one name each keep their own. Raises one-line ``ValueError`` s naming the task."""
    task_configs = task_configs or {}
    return {name: TASKS.build(name, task_configs.get(name)) for name in dict.fromkeys(names)}
