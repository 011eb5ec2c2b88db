"""The rollout-engine interface: ``generate(prompts, n, sampling) -> RolloutBatch``, ``sync_weights(model)``,
``close()``. Engines know nothing of losses or rewards; they turn prompts into sampled tokens and logprobs.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Optional

from brorl_lab.core.batch import RolloutBatch
from brorl_lab.core.validation import check_int


@dataclass(frozen=True)
class RolloutSampling:
    """How to sample (named apart from ``vllm.SamplingParams``, which the vllm engine builds from it, so a notebook
    that imports both never shadows one with the other). ``logprobs`` returned by every engine are log-probabilities
    of the sampled token under the temperature-scaled distribution ``softmax(logits / temperature)`` (before top-p
    truncation), which is what the trainer recomputes for the PPO ratio.

    ``ignore_eos``: sampling does not stop at EOS (an EOS sampled mid-response is kept as an ordinary token), so every
    response runs to ``max_new_tokens``: fixed-length responses for benchmarks (vLLM's ``ignore_eos``)."""

    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 16
    seed: Optional[int] = None
    ignore_eos: bool = False

    def __post_init__(self):
        if not (isinstance(self.temperature, (int, float)) and math.isfinite(self.temperature) and self.temperature > 0):
            raise ValueError(f"sampling.temperature: got {self.temperature!r}; allowed: a finite float > 0")
        if not (isinstance(self.top_p, (int, float)) and 0 < self.top_p <= 1):
            raise ValueError(f"sampling.top_p: got {self.top_p!r}; allowed: a probability in (0, 1]")
        if not (isinstance(self.max_new_tokens, int) and self.max_new_tokens >= 1):
            raise ValueError(f"sampling.max_new_tokens: got {self.max_new_tokens!r}; allowed: an integer >= 1")
        if not isinstance(self.ignore_eos, bool):
            raise ValueError(f"sampling.ignore_eos: got {self.ignore_eos!r}; allowed: True or False")


def check_generate_args(prompts: Sequence[str], n) -> None:
    """The one place engines validate their inputs, so every engine rejects the same nonsense the same way.

    ``n`` is the rollouts per prompt: one integer for every prompt, or a sequence of one integer >= 1 per prompt
    (a per-prompt allocation, :mod:`brorl_lab.rl.allocation`; the batch then has groups of unequal size)."""
    if isinstance(prompts, str):
        raise ValueError("prompts: got a single string; allowed: a non-empty list of prompt strings")
    if len(prompts) == 0:
        raise ValueError("prompts: got an empty list; allowed: a non-empty list of prompt strings")
    if not all(isinstance(p, str) and p for p in prompts):
        raise ValueError("prompts: every prompt must be a non-empty string")
    if is_per_prompt(n):
        if len(n) != len(prompts):
            raise ValueError(f"n (rollouts_per_prompt): got {len(n)} per-prompt counts for {len(prompts)} prompts; "
                             "allowed: one integer, or one integer >= 1 per prompt")
        for p, k in enumerate(n):
            check_int(f"n[{p}] (rollouts of prompt {p})", k, 1)
        return
    check_int('n (rollouts_per_prompt)', n, 1)


def is_per_prompt(n) -> bool:
    """Whether ``n`` gives a count per prompt (a list, tuple or 1-d tensor) rather than one N for all."""
    return not isinstance(n, (int, str)) and hasattr(n, "__len__")


def per_prompt_counts(n, num_prompts: int) -> list[int]:
    """``[N_0, ..., N_{P-1}]`` from one N or per-prompt counts (validated by :func:`check_generate_args`)."""
    return [int(k) for k in n] if is_per_prompt(n) else [int(n)] * num_prompts


class RolloutEngine(ABC):
    """Base class. Subclasses set ``name`` and implement the three methods; ``close()`` must be idempotent."""

    name: str = "base"

    @abstractmethod
    def generate(self, prompts: Sequence[str], n, sampling: RolloutSampling) -> RolloutBatch:
        """N samples for each prompt, prompt-major (sample b = p*n + s); ``n`` may give each prompt its own N_p
        (rows then prompt-major with ``batch.sizes`` = the N_p)."""

    @abstractmethod
    def sync_weights(self, model) -> None:
        """Load the trainer's current weights (a torch nn.Module with HF parameter names) into the engine."""

    def close(self) -> None:
        """Free the engine's resources. Safe to call twice."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
