"""Helpers every rollout engine shares: loading the engine's model, tokenising prompts, planning chunks, sampling
one step, turning sampled ids into a validated :class:`~brorl_lab.core.batch.RolloutBatch` (:func:`generate_batch`), and
:class:`ModuleEngine`, the base of the engines that sample from an in-process torch copy of the policy.

The log-probability contract (see :class:`~brorl_lab.rollout.engines.base.RolloutSampling`): for each sampled token
``y_t`` an engine returns ``log softmax(z_t / tau)[y_t]`` with ``z_t`` the raw logits and ``tau`` the temperature,
computed before top-p truncation (top-p only restricts *which* tokens may be drawn). That is what the trainer
recomputes (:func:`brorl_lab.rl.logprobs.compute_logprobs`), so the PPO ratio is 1 when the weights agree.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Optional

import torch

from brorl_lab.core.batch import RolloutBatch
from brorl_lab.core.validation import check_int
from brorl_lab.rollout.engines.base import (
    RolloutEngine,
    RolloutSampling,
    check_generate_args,
    is_per_prompt,
    per_prompt_counts,
)


# ---- model and tokenizer ------------------------------------------------------------------------------------------
def load_engine_model(model, tokenizer=None, *, device: str = "auto", dtype: str = "auto", copy_module: bool = True):
    """``(model, tokenizer)`` for an engine, in eval mode on the picked device/dtype.

    ``model`` is ``'default'``, a local HF directory, a hub id (via :func:`brorl_lab.core.models.load_policy`), or an
    ``nn.Module`` (a HF causal LM; deep-copied when ``copy_module`` so the engine's weights change only through
    ``sync_weights``). A module needs ``tokenizer``; a path's own tokenizer is used unless one is given.
    """
    from brorl_lab.core.models import load_policy, pick_device, pick_dtype  # lazy: keeps `import brorl_lab.rollout.engines` light

    dev = pick_device(device)
    dt = pick_dtype(dtype, dev)
    if isinstance(model, torch.nn.Module):
        if tokenizer is None:
            raise ValueError("tokenizer: got None with an nn.Module model; allowed: the model's HF tokenizer")
        module = copy.deepcopy(model) if copy_module else model
    elif isinstance(model, (str, Path)):
        try:
            module, own_tok = load_policy(str(model), device=str(dev), dtype=_dtype_name(dt))
        except OSError as e:  # transformers' "not a valid model identifier / no file named ..." for a bad path
            raise ValueError(f"model: could not load {str(model)!r} ({e}); allowed: 'default', a local HF model "
                             "directory or a hub id") from e
        tokenizer = tokenizer if tokenizer is not None else own_tok
    else:
        raise ValueError(f"model: got {type(model).__name__}; allowed: 'default', a local HF model directory, a hub "
                         "id or a torch nn.Module (HF causal LM)")
    module = module.to(device=dev, dtype=dt).eval()
    module.requires_grad_(False)
    return module, tokenizer


def _dtype_name(dt: torch.dtype) -> str:
    return str(dt).removeprefix("torch.")


def special_ids(tokenizer, generation_config=None) -> tuple[list[int], int]:
    """``(eos_ids, pad_id)``: the tokenizer's EOS plus any the model's generation config adds (chat models often
    stop on several); pad falls back to the first EOS."""
    eos = []
    for c in (tokenizer.eos_token_id, getattr(generation_config, "eos_token_id", None)):
        for i in (c if isinstance(c, (list, tuple)) else [c]):
            if i is not None and int(i) not in eos:
                eos.append(int(i))
    if not eos:
        raise ValueError("tokenizer: has no eos_token_id (and the model's generation_config names none); "
                         "allowed: a tokenizer with an EOS token, which engines stop on")
    pad = tokenizer.pad_token_id
    return eos, int(eos[0] if pad is None else pad)


def encode_prompts(tokenizer, prompts: Sequence[str]) -> list[list[int]]:
    """Prompt token ids as the tokenizer makes them by default (special tokens such as BOS included, like vLLM)."""
    ids = tokenizer(list(prompts))["input_ids"]
    for p, x in zip(prompts, ids):
        if len(x) == 0:
            raise ValueError(f"prompts: {p!r} tokenises to no tokens; allowed: prompts with at least one token")
    return [list(map(int, x)) for x in ids]


def make_generator(seed: Optional[int], device: torch.device | str = "cpu") -> torch.Generator:
    """A private RNG (the global one is left alone): seeded when ``seed`` is given, else from OS entropy."""
    gen = torch.Generator(device=device)
    if seed is None:
        gen.seed()
    else:
        gen.manual_seed(int(seed))
    return gen


def plan_chunks(num_prompts: int, n, chunk_sequences: int) -> list[tuple[list[int], int]]:
    """Split P prompts x N samples into chunks ``(prompt indices, k)`` of at most ``chunk_sequences`` rows, in
    prompt-major order; every prompt of a chunk gets the same ``k`` samples (the shared-prefix layout is [P_c, k]).

    N <= chunk_sequences: chunks of floor(chunk_sequences / N) whole prompts. N > chunk_sequences: each prompt is
    split into ceil(N / chunk_sequences) near-equal one-prompt chunks (its prefix is prefilled once per chunk).
    Per-prompt counts ``n = [N_0, ..., N_{P-1}]``: each run of consecutive prompts with the same N_p is planned as
    above, so the chunks stay prompt-major and a chunk still shares one k.
    """
    if is_per_prompt(n):
        counts, out, start = [int(k) for k in n], [], 0
        while start < num_prompts:
            stop = start
            while stop < num_prompts and counts[stop] == counts[start]:
                stop += 1
            out += [([start + p for p in ps], k) for ps, k in plan_chunks(stop - start, counts[start],
                                                                          chunk_sequences)]
            start = stop
        return out
    if n <= chunk_sequences:
        per = chunk_sequences // n
        return [(list(range(p, min(p + per, num_prompts))), n) for p in range(0, num_prompts, per)]
    pieces = math.ceil(n / chunk_sequences)
    sizes = [n // pieces + (i < n % pieces) for i in range(pieces)]
    return [([p], k) for p in range(num_prompts) for k in sizes]


# ---- one sampling step ----------------------------------------------------------------------------------------------
def sample_next(logits: torch.Tensor, temperature: float, top_p: float, generator: torch.Generator):
    """Draw one token per row and return ``(token [B], logprob [B])``.

        logp = log softmax(z / tau)                          # the returned log-prob, before truncation
        top-p keeps the smallest prefix of tokens sorted by p whose mass reaches top_p (renormalised)

    Drawing is by inverse CDF with one uniform per row, ``y = min{v : F_v > u * F_last}`` (``right=True`` can never
    land on a zero-weight token), ~20x cheaper on CPU than ``torch.multinomial`` or an exponential race, which
    both spend a random number per vocabulary entry.
    """
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)  # [B, V]
    B, V = logp.shape
    if top_p < 1.0:
        sorted_lp, order = logp.sort(dim=-1, descending=True)  # [B, V]
        p = sorted_lp.exp()
        cdf = p.cumsum(-1)  # [B, V]
        last = ((cdf - p) < top_p).sum(-1, keepdim=True) - 1  # [B, 1] last nucleus index (>= 0)
    else:
        order, cdf = None, logp.exp().cumsum(-1)
        last = torch.full((B, 1), V - 1, device=logp.device)
    u = torch.rand((B, 1), generator=generator, device=logp.device) * cdf.gather(-1, last)  # [B, 1]
    idx = torch.searchsorted(cdf, u, right=True).clamp_(max=last)  # [B, 1]
    token = idx if order is None else order.gather(-1, idx)
    return token[:, 0], logp.gather(-1, token)[:, 0]


# ---- building the batch --------------------------------------------------------------------------------------------
def finish_lengths(response_ids: torch.Tensor, eos_ids: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """``(lengths [B], truncated [B])`` from raw sampled ids [B, T]: length runs through the first EOS (included);
    a row with no EOS has length T and is truncated (every row, when ``eos_ids`` is empty)."""
    is_eos = torch.isin(response_ids, torch.as_tensor(list(eos_ids), dtype=response_ids.dtype,
                                                      device=response_ids.device))  # [B, T]
    T = response_ids.shape[1]
    first = torch.where(is_eos.any(1), is_eos.int().argmax(1), torch.full_like(response_ids[:, 0], T))  # [B]
    truncated = first >= T
    lengths = torch.where(truncated, torch.full_like(first, T), first + 1)
    return lengths, truncated


def build_batch(*, engine: str, prompts: Sequence[str], prompt_ids: list[list[int]], n,
                response_ids: torch.Tensor, logprobs: torch.Tensor, lengths: torch.Tensor, truncated: torch.Tensor,
                tokenizer, pad_id: int, sampling: RolloutSampling, seconds: float,
                extra_meta: Optional[dict] = None) -> RolloutBatch:
    """Trim to the longest response, pad past each length (ids -> pad_id, logprobs -> 0), decode, and validate.

    ``response_ids``/``logprobs`` are [P*N, T_max] prompt-major; whatever sits past ``lengths`` is overwritten.
    ``n``: one N, or per-prompt counts (the batch then carries ``sizes``).
    """
    response_ids, logprobs = response_ids.cpu(), logprobs.cpu().float()
    lengths, truncated = lengths.cpu().long(), truncated.cpu().bool()
    T = max(int(lengths.max()), 1)
    valid = torch.arange(T)[None, :] < lengths[:, None]  # [P*N, T]
    response_ids = torch.where(valid, response_ids[:, :T], pad_id)
    logprobs = torch.where(valid, logprobs[:, :T], 0.0)
    rows = [r[:k] for r, k in zip(response_ids.tolist(), lengths.tolist())]
    texts = tokenizer.batch_decode(rows, skip_special_tokens=True)
    tokens = int(lengths.sum())
    meta = {"engine": engine, "sampling": asdict(sampling), "temperature": sampling.temperature,
            "top_p": sampling.top_p, "generation_seconds": seconds, "generated_tokens": tokens,
            "samples_per_second": len(rows) / max(seconds, 1e-9), "tokens_per_second": tokens / max(seconds, 1e-9),
            **(extra_meta or {})}
    sizes = per_prompt_counts(n, len(prompts)) if is_per_prompt(n) else None
    return RolloutBatch(prompts=list(prompts), prompt_ids=prompt_ids, n=max(sizes) if sizes else n,
                        response_ids=response_ids, logprobs=logprobs, lengths=lengths, truncated=truncated,
                        texts=texts, pad_id=pad_id, meta=meta, sizes=sizes).validate()


def generate_batch(engine, prompts: Sequence[str], n, sampling: RolloutSampling, sample) -> RolloutBatch:
    """The generate() every engine shares: validate, tokenise, time ``sample(prompt_ids) -> (ids, logprobs, meta)``
    (raw [P*N, W] rows, prompt-major; what follows a row's first EOS is ignored), and build the batch."""
    check_generate_args(prompts, n)
    engine._check_open()
    prompt_ids = encode_prompts(engine.tokenizer, prompts)
    with Timer() as timer:
        ids, logprobs, extra_meta = sample(prompt_ids)
        lengths, truncated = finish_lengths(ids, () if sampling.ignore_eos else engine.eos_ids)
    return build_batch(engine=engine.name, prompts=prompts, prompt_ids=prompt_ids, n=n, response_ids=ids,
                       logprobs=logprobs, lengths=lengths, truncated=truncated, tokenizer=engine.tokenizer,
                       pad_id=engine.pad_id, sampling=sampling, seconds=timer.seconds, extra_meta=extra_meta)


class Timer:
    """``with Timer() as t: ...; t.seconds``: wall time of a block (generation timings for ``batch.meta``)."""

    def __enter__(self):
        self._t0 = time.perf_counter()
        self.seconds = 0.0
        return self

    def __exit__(self, *exc):
        self.seconds = time.perf_counter() - self._t0


# ---- engines on an in-process torch model -------------------------------------------------------------------------
class ModuleEngine(RolloutEngine):
    """Base of engines that sample from an in-process torch copy of the policy (``torch``, ``hf``): loads it,
    copies the trainer's weights in (:meth:`sync_weights`) and drops it on :meth:`close`."""

    def __init__(self, model="default", tokenizer=None, *, device: str = "auto", dtype: str = "auto",
                 chunk_sequences: int = 1024):
        check_int('chunk_sequences', chunk_sequences, 1)
        self.model, self.tokenizer = load_engine_model(model, tokenizer, device=device, dtype=dtype)
        self.device = next(self.model.parameters()).device
        self.eos_ids, self.pad_id = special_ids(self.tokenizer, getattr(self.model, "generation_config", None))
        self.chunk_sequences = chunk_sequences

    def generate(self, prompts: Sequence[str], n, sampling: RolloutSampling) -> RolloutBatch:
        def sample(prompt_ids):
            chunks = [([prompt_ids[p] for p in ps], k) for ps, k in plan_chunks(len(prompt_ids), n,
                                                                                 self.chunk_sequences)]
            parts = self._sample_chunks(chunks, sampling)
            W = max(p[0].shape[1] for p in parts)  # a chunk whose rows all finished early is narrower
            pad = lambda t, v: torch.nn.functional.pad(t, (0, W - t.shape[1]), value=v)  # noqa: E731
            ids = torch.cat([pad(p[0], self.pad_id) for p in parts])  # [P*N, W]
            logprobs = torch.cat([pad(p[1], 0.0) for p in parts])  # [P*N, W]
            return ids, logprobs, {"chunks": len(chunks), "chunk_sequences": self.chunk_sequences,
                                   **self._extra_meta()}

        return generate_batch(self, prompts, n, sampling, sample)

    def _sample_chunks(self, chunks: list[tuple[list[list[int]], int]],
                       sampling: RolloutSampling) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """For each chunk ``(prompt token ids, k)``: ``(ids, logprobs)`` [P_c*k, T_c] raw sampled rows (what follows
        a row's first EOS is ignored), prompt-major. ``T_c`` may differ across chunks (at most max_new_tokens)."""
        raise NotImplementedError

    def _extra_meta(self) -> dict:
        return {}

    def sync_weights(self, model) -> None:
        """Copy the trainer's parameters and buffers into the engine's own copy (cast to the engine's dtype)."""
        self._check_open()
        try:
            with torch.no_grad():
                self.model.load_state_dict(model.state_dict())
        except (RuntimeError, AttributeError) as e:
            raise ValueError(f"model: its state_dict does not fit the engine's {type(self.model).__name__} "
                             f"({str(e).splitlines()[0]}); allowed: the policy this engine was built from") from e

    def close(self) -> None:
        self.model = None

    def _check_open(self) -> None:
        if self.model is None:
            raise ValueError(f"engine: this {type(self).__name__} was closed; allowed: build a new engine")
