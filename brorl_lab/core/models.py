"""Load a policy and its frozen reference: the shipped tiny default, any local HF directory, or a hub id.

    policy, tok = load_policy("default")        # tiny Qwen2 in data/default_model, train mode, fp32 on CPU
    ref = make_reference(policy)                # frozen deep copy for the KL term  KL(pi || pi_ref)
    resolve_model("default")                    # -> ".../data/default_model"
    resolve_model("runs/chain_sum_N16_P8_s0")   # a run directory -> its policy/ (the last checkpoint, HF format)

Device and dtype follow the house rule: ``"auto"`` is CUDA with bfloat16 when a GPU is present, else CPU float32.
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch

from brorl_lab.core.paths import DEFAULT_MODEL_DIR, looks_local
from brorl_lab.core.rundir import hf_model_dir
from brorl_lab.core.validation import UserError

DEVICES = ("auto", "cpu", "cuda")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_model(model: str) -> str:
    """``'default'`` -> the shipped directory; a local directory must hold ``config.json`` or be a run directory with
    a ``policy/`` (its last checkpoint as a HF model); anything else is a hub id.

    A string that looks like a path (:func:`brorl_lab.core.paths.looks_local`: ``./x``, ``/x``, ``~/x``,
    ``runs/x``, ``a/b/c``, or anything on disk) is treated as a local directory, so a typo in a path fails here
    with a clear message rather than as a hub lookup.
    """
    if not isinstance(model, str) or not model.strip():
        raise UserError(f"model: got {model!r}; allowed: 'default', a local HF model directory or a hub id")
    if model == "default":
        path = DEFAULT_MODEL_DIR
    elif looks_local(model):
        path = Path(model).expanduser()
    else:
        return model  # a hub id such as "Qwen/Qwen2.5-0.5B-Instruct"
    found = hf_model_dir(path)
    if found is None:
        hint = ""
        if (path / "checkpoint").is_dir():
            hint = (f" (a run directory without policy/, written before runs exported one: `python -m brorl_lab "
                    f"export {model} OUT` makes it)")
        raise UserError(f"model: got {model!r} -> {str(path)!r}, which is not a directory containing config.json"
                         f"{hint}; allowed: 'default', a local HF model directory, a run directory or a hub id")
    return str(found.resolve())


def pick_device(device: str = "auto") -> torch.device:
    """``'auto'`` -> CUDA when available, else CPU. ``'cuda'`` without a GPU is an error, not a silent fallback."""
    if device not in DEVICES:
        raise UserError(f"device: got {device!r}; allowed: {', '.join(DEVICES)}")
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise UserError("device: got 'cuda' but torch.cuda.is_available() is False; allowed here: 'auto', 'cpu'")
    return torch.device(device)


def pick_dtype(dtype: str = "auto", device: str | torch.device = "cpu") -> torch.dtype:
    """``'auto'`` -> bfloat16 on CUDA, float32 on CPU (CPU bf16 matmuls are slow and lossy for a tiny model)."""
    if dtype == "auto":
        return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32
    if dtype not in DTYPES:
        raise UserError(f"dtype: got {dtype!r}; allowed: auto, {', '.join(DTYPES)}")
    return DTYPES[dtype]


def load_tokenizer(model: str = "default"):
    """The model's tokenizer with a pad token (falls back to EOS) and left padding (batched generation pads prompts
    on the left so every prompt ends where its response begins)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(resolve_model(model))
    if tok.pad_token is None:
        if tok.eos_token is None:
            raise ValueError(f"model: tokenizer of {model!r} has neither a pad nor an eos token")
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    return tok


def load_policy(model: str = "default", *, device: str = "auto", dtype: str = "auto"):
    """``(model, tokenizer)``: a causal LM in train mode on the picked device/dtype, and its tokenizer.

    Returns the model in ``train()`` mode (dropout is 0 in Qwen2 configs, so train and eval forward agree).
    """
    from transformers import AutoModelForCausalLM

    path = resolve_model(model)
    dev = pick_device(device)
    dt = pick_dtype(dtype, dev)
    tok = load_tokenizer(model)
    policy = AutoModelForCausalLM.from_pretrained(path, dtype=dt).to(dev)
    if policy.config.pad_token_id is None:
        policy.config.pad_token_id = tok.pad_token_id
    policy.train()
    return policy, tok


def make_reference(policy: torch.nn.Module) -> torch.nn.Module:
    """A frozen deep copy of ``policy`` (pi_ref for the KL term): eval mode, ``requires_grad=False`` everywhere.

    A ProRL reference reset is ``ref = make_reference(policy)`` again.
    """
    ref = copy.deepcopy(policy)
    ref.eval()
    ref.requires_grad_(False)
    return ref


__all__ = ["DEFAULT_MODEL_DIR", "resolve_model", "pick_device", "pick_dtype", "load_tokenizer", "load_policy",
           "make_reference"]
