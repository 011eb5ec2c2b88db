"""brorl_lab: a workbench for rollout scaling (BroRL) and prolonged RL (ProRL) with verifiable rewards.

The RL step as cell-friendly functions (see :mod:`brorl_lab.steps`)::

    import brorl_lab as bl
    cfg    = bl.Config(rollouts_per_prompt=16)
    policy, tok = bl.load_policy("default")
    engine = bl.make_engine("torch", policy, tok)
    batch  = bl.score(bl.rollout(engine, bl.sample_prompts(["chain_sum"], 4, seed=0), n=16))
    batch, stats = bl.filter_groups(batch)

Names are imported lazily so ``import brorl_lab`` stays fast and never imports vllm or ray.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_EXPORTS = {
    "Config": "config", "ConfigError": "config", "scaled_lr": "config",
    "RolloutBatch": "batch",
    "SamplingParams": "engines.base", "make_engine": "engines", "ENGINES": "engines",
    "load_policy": "models", "make_reference": "models",
    "TASKS": "tasks", "sample_items": "tasks", "eval_set": "tasks",
    "sample_prompts": "steps", "rollout": "steps", "score": "steps", "filter_groups": "steps",
    "advantages": "steps", "update": "steps", "sync": "steps",
    "compute_logprobs": "logprobs",
    "evaluate": "evaluation",
    "Trainer": "trainer",
    "RunDir": "tracking", "load_runs": "tracking", "run_index": "tracking",
    "run_notebook": "sweep", "run_sweep": "sweep", "iso_compute_plan": "sweep",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module 'brorl_lab' has no attribute {name!r}")
