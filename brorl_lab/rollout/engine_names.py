"""The rollout engines' registry, declared where no torch is imported (``rollout.engines`` registers each engine's
import string into it): naming an engine in a config or on the command line is checked before anything loads."""

from __future__ import annotations

from brorl_lab.core.registry import Registry

ENGINES = Registry("engine", names=("torch", "hf", "vllm", "ray"))
