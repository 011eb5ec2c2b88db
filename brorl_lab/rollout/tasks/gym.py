"""Reasoning-gym task families: procedural, seeded generators with their own ``score_answer`` as the reward.

A family is a reasoning-gym dataset name plus a fixed difficulty config (digits, terms, value ranges), chosen so
the tiny default model sees a spread of difficulty (see data/default_model/TRAINING.md for the measured pass@1).

Seeds and splits. Item ``k`` of the stream ``(family, split, seed)`` is reasoning-gym item ``k`` of a dataset whose
seed is unique to that triple (:func:`stream_seed`), so streams never share generator states. On top of that, the
question space is partitioned by a hash of the question text: a question belongs to ``eval`` iff
``sha256(question) mod EVAL_MODULUS == 0`` (:func:`split_of`), and each split keeps only its own questions. So no
training question can ever equal an eval question, even for small question spaces where random collisions are
certain.

Reward: ``reward = dataset.score_answer(extracted, entry)`` in [0, 1] (continuous for some datasets, e.g. partial
credit when the reference appears inside a longer answer), ``correct = reward == 1``.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import zlib
from collections.abc import Iterator
from typing import Any, Optional

from brorl_lab.core.validation import check_int, is_int
from brorl_lab.rollout.tasks.base import RewardResult, TaskFamily, TaskItem, register_task
from brorl_lab.rollout.tasks.templates import CHAT_ANSWER_TAGS, MAX_ANSWER_CHARS, check_template, extract_answer, format_prompt

SPLITS = ("train", "eval")
EVAL_MODULUS = 8  # 1 question in 8 belongs to the eval split
STREAM_LEN = 10**7  # reasoning-gym indices available per (family, split, seed) stream
MAX_SEED = 2**63  # any non-negative 63-bit seed (the trainer derives 31-bit ones)

# name -> (reasoning-gym dataset, difficulty config, description). Difficulty is tuned for the default model.
GYM_FAMILIES: dict[str, tuple[str, dict, str]] = {
    "chain_sum": ("chain_sum", dict(min_terms=2, max_terms=3, min_digits=1, max_digits=1),
                  "a + b (- c): 2-3 one-digit terms"),
    "spell_backward": ("spell_backward", dict(min_word_len=3, max_word_len=4),
                       "spell a 3-4 letter word backward"),
    "gcd": ("gcd", dict(min_numbers=2, max_numbers=2, min_value=1, max_value=60),
            "greatest common divisor of two numbers in 1..60"),
    "products": ("products", dict(min_terms=2, max_terms=2, min_digits=1, max_digits=2),
                 "a * b with 1-2 digit operands"),
}

# Difficulty variants: registered like the families above but not part of the default model's training mix
# (BUILTIN_FAMILIES). Their questions are a subset of their parent's (same generator, same text), so the hash
# partition holds them out exactly as it holds out the parent's eval questions.
VARIANT_FAMILIES: dict[str, tuple[str, dict, str]] = {
    "products_2d": ("products", dict(min_terms=2, max_terms=2, min_digits=2, max_digits=2),
                    "a * b with two 2-digit operands (the hard half of products: the rare-success regime)"),
}


def split_of(question: str) -> str:
    """``'eval'`` for one question in :data:`EVAL_MODULUS` (by a hash of its text), else ``'train'``."""
    h = int.from_bytes(hashlib.sha256(question.encode("utf-8")).digest()[:8], "big")
    return "eval" if h % EVAL_MODULUS == 0 else "train"


def stream_seed(family: str, split: str, seed: int) -> int:
    """A reasoning-gym dataset seed unique to (family, split, seed); streams are STREAM_LEN apart."""
    return ((zlib.crc32(family.encode()) * 2 + SPLITS.index(split)) * MAX_SEED + seed) * STREAM_LEN


def check_sample_args(count: Any, seed: Any, split: Any) -> None:
    check_int('count', count, 0)
    if not is_int(seed) or not 0 <= seed < MAX_SEED:
        raise ValueError(f"seed: got {seed!r}; allowed: an integer in [0, {MAX_SEED})")
    if split not in SPLITS:
        raise ValueError(f"split: got {split!r}; allowed: {', '.join(SPLITS)}")


def _jsonable(entry: dict) -> dict:
    """The entry as it will read back from jsonl (tuples -> lists), so fresh and loaded items score alike."""
    return json.loads(json.dumps(entry, default=str))


class GymFamily(TaskFamily):
    """A reasoning-gym dataset at a fixed difficulty, prompted with :mod:`.templates`, scored by the dataset."""

    chat_instruction = CHAT_ANSWER_TAGS

    stream_len = STREAM_LEN  # dataset size per stream; user-named datasets use fewer (some build eagerly)

    def __init__(self, name: str, dataset: str, config: dict, description: str):
        self.name, self.dataset, self.config, self.description = name, dataset, dict(config), description
        self._scorer = None

    # ---- generation ---------------------------------------------------------------------------------------------
    def _make_dataset(self, seed: int):
        import reasoning_gym  # imported lazily: ~1.5 s, and config validation imports this module

        return reasoning_gym.create_dataset(self.dataset, seed=seed, size=self.stream_len, **self.config)

    def iter_items(self, *, seed: int, split: str = "train") -> Iterator[TaskItem]:
        """The items of stream ``(name, split, seed)`` one by one, in the order :meth:`sample` returns them."""
        check_sample_args(0, seed, split)
        ds = self._make_dataset(stream_seed(self.name, split, seed))
        for idx in range(self.stream_len):
            entry = ds[idx]
            if split_of(entry["question"]) == split:
                yield TaskItem(family=self.name, uid=f"{self.name}:{split}:{seed}:{idx}",
                               question=entry["question"], answer=str(entry["answer"]),
                               meta={"entry": _jsonable(entry)})
        raise RuntimeError(f"task {self.name!r}: question space exhausted after {self.stream_len} draws")

    def sample(self, count: int, *, seed: int, split: str = "train") -> list[TaskItem]:
        check_sample_args(count, seed, split)
        return list(itertools.islice(self.iter_items(seed=seed, split=split), count)) if count else []

    def format_prompt(self, item: TaskItem, template: str = "plain", tokenizer: Any = None) -> str:
        return format_prompt(item.question, template, tokenizer, chat_instruction=self.chat_instruction)

    # ---- scoring ------------------------------------------------------------------------------------------------
    def _entry(self, item: TaskItem) -> dict:
        entry = item.meta.get("entry") if isinstance(item.meta, dict) else None
        return entry or {"question": item.question, "answer": item.answer, "metadata": {}}

    def _extract(self, response: Any, template: str):
        """(answer, None) or (None, RewardResult scoring 0) for missing / oversized answers."""
        check_template(template)
        answer = extract_answer(response, template)
        if answer is None:
            return None, RewardResult(0.0, False, None, "no answer found")
        if len(answer) > MAX_ANSWER_CHARS:
            return None, RewardResult(0.0, False, answer[:MAX_ANSWER_CHARS], "answer too long")
        return answer, None

    def reject(self, answer: str) -> Optional[str]:
        """Why an extracted answer must not reach the verifier (it then scores 0), or None."""
        return None

    def verify(self, answer: str, item: TaskItem) -> float:
        """Score an extracted answer in [0, 1] with the reasoning-gym dataset's own ``score_answer``."""
        if self._scorer is None:
            self._scorer = self._make_dataset(0)
        return float(self._scorer.score_answer(answer, self._entry(item)))

    def score(self, response: str, item: TaskItem, template: str = "plain") -> RewardResult:
        answer, failed = self._extract(response, template)
        if failed is not None:
            return failed
        reason = self.reject(answer)
        if reason is not None:
            return RewardResult(0.0, False, answer, reason)
        try:
            reward = self.verify(answer, item)
        except Exception as e:  # a verifier bug must not kill a training step; it scores 0 and says why
            return RewardResult(0.0, False, answer, f"verifier error: {type(e).__name__}: {e}"[:200])
        if not math.isfinite(reward):
            return RewardResult(0.0, False, answer, f"verifier returned {reward}")
        correct = reward >= 1.0
        return RewardResult(reward, correct, answer, "correct" if correct else "wrong")


for _name, (_dataset, _config, _description) in {**GYM_FAMILIES, **VARIANT_FAMILIES}.items():
    register_task(GymFamily(_name, _dataset, _config, _description))
