"""Rollout engines behind one interface (see :mod:`brorl_lab.rollout.engines.base`).

Engines are registered as import strings so naming one (in a config, a sweep) never imports its backend;
:func:`make_engine` imports and builds it.
"""

from __future__ import annotations

import importlib

from brorl_lab.rollout.engine_names import ENGINES  # declared there (no torch); registered here
from brorl_lab.rollout.engines.base import RolloutEngine, RolloutSampling, check_generate_args

ENGINES.register("torch", "brorl_lab.rollout.engines.torch_engine:TorchEngine")
ENGINES.register("hf", "brorl_lab.rollout.engines.hf_engine:HFEngine")
ENGINES.register("vllm", "brorl_lab.rollout.engines.vllm_engine:VLLMEngine")
ENGINES.register("ray", "brorl_lab.rollout.engines.ray_engine:RayEngine")


def engine_class(name: str) -> type:
    module, _, cls = ENGINES.get(name).partition(":")
    return getattr(importlib.import_module(module), cls)


def make_engine(name: str, *args, **kwargs) -> RolloutEngine:
    """Build the engine registered as ``name`` (``'torch'``, ``'hf'``, ``'vllm'``, ``'ray'``)."""
    return engine_class(name)(*args, **kwargs)


__all__ = ["ENGINES", "RolloutEngine", "RolloutSampling", "check_generate_args", "engine_class", "make_engine"]
