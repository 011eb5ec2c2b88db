"""Reference solution of notebook 00's exercise (kept apart from the notebook: try it yourself first).

Loaded only when the notebook runs with ``use_solutions=True`` (the tests and the book do).
"""

import torch


def grpo_advantage(rewards, *, eps=1e-6):
    """GRPO: A = (r - group mean) / (group std + eps), std with N - 1; a uniform group gets exactly 0. [P, N]."""
    centered = rewards - rewards.mean(dim=1, keepdim=True)            # [P, N]
    std = rewards.std(dim=1, correction=min(1, rewards.shape[1] - 1), keepdim=True)   # [P, 1]
    uniform = rewards.amax(dim=1, keepdim=True) == rewards.amin(dim=1, keepdim=True)
    return torch.where(uniform, 0.0, centered / (std + eps))          # [P, N]
