"""brorl_lab: a workbench for rollout scaling (BroRL) and prolonged RL (ProRL) with verifiable rewards.

The RL step as cell-friendly functions (see :mod:`brorl_lab.rl.steps`)::

    import brorl_lab as bl
    cfg    = bl.Config(rollouts_per_prompt=16)
    policy, tok = bl.load_policy("default")
    engine = bl.make_engine("torch", policy, tok)
    batch  = bl.score(bl.steps.rollout(engine, bl.sample_prompts(["chain_sum"], 4, seed=0), n=16))
    batch, stats = bl.filter_groups(batch)

Names are imported lazily so ``import brorl_lab`` stays fast and never imports vllm or ray.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_EXPORTS = {
    "Config": "core.config", "ConfigError": "core.config", "scaled_lr": "core.config",
    "RolloutBatch": "core.batch",
    "load_policy": "core.models", "make_reference": "core.models",
    "RolloutSampling": "rollout.engines.base", "make_engine": "rollout.engines", "ENGINES": "rollout.engines",
    "TASKS": "rollout.tasks", "sample_items": "rollout.tasks", "eval_set": "rollout.tasks",
    "sample_prompts": "rl.steps", "score": "rl.steps", "filter_groups": "rl.steps",
    "advantages": "rl.steps", "update": "rl.steps", "sync": "rl.steps",
    "compute_logprobs": "rl.logprobs",
    "evaluate": "rl.evaluation",
    "RunSpec": "rl.spec", "resolve": "rl.spec",
    "Trainer": "rl.trainer", "TRACKERS": "rl.trackers", "read_tensorboard": "rl.trackers", "read_wandb": "rl.trackers",
    "RunDir": "core.rundir", "load_runs": "lab.tracking", "run_index": "lab.tracking",
    "run_notebook": "lab.sweep", "run_sweep": "lab.sweep", "iso_compute_plan": "lab.sweep",
}

#: Modules exported whole. The stage functions live in ``bl.steps``; ``rollout`` is reached as ``bl.steps.rollout``
#: because ``bl.rollout`` is the ``brorl_lab.rollout`` subpackage (engines, tasks) once anything has imported it.
_MODULES = {"steps": "rl.steps"}

__all__ = sorted([*_EXPORTS, *_MODULES])

#: Public names that were renamed: the old name fails with one error naming the new one (not a silent alias, which
#: would keep shadowing ``vllm.SamplingParams`` in notebooks that import both).
RENAMED = {"SamplingParams": "RolloutSampling"}


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    if name in _MODULES:
        return importlib.import_module(f".{_MODULES[name]}", __name__)
    if name in RENAMED:
        raise AttributeError(f"brorl_lab.{name} was renamed brorl_lab.{RENAMED[name]} (so it no longer shadows "
                             f"vllm.{name}); use bl.{RENAMED[name]}")
    raise AttributeError(f"module 'brorl_lab' has no attribute {name!r}")
