"""``TorchEngine``: our own batched sampler on a HF causal LM, with each prompt's prefix computed once for N samples.

For a chunk of prompts (at most ``chunk_sequences`` sampled sequences), the work is::

    prefill   the chunk's P_c distinct prompts once, left-padded (the HF forward):   prefix KV [P_c, H_kv, L, d]
    decode    y_t ~ top_p(softmax(z_t / tau)) for all P_c*K rows at once;  logp_t = log softmax(z_t / tau)[y_t]
              rows that emitted EOS are masked, and compacted away once enough have finished

so a prompt's prefix costs one forward pass instead of N (transformers ``generate`` with
``num_return_sequences=N`` runs the prompt N times and then attends over N copies of its KV).

Two decode kernels:

- ``"shared_prefix"`` (Llama-family models: Llama, Qwen2, Qwen3, Mistral without sliding window): our own decode
  step over the model's own modules. The prefix KV is stored once per prompt, never copied per sample; generated
  KV lives in preallocated [rows, H_kv, T, d] buffers; attention joins the two (:func:`shared_prefix_attention`).
- ``"hf_cache"`` (any HF causal LM): the model's forward with a ``DynamicCache`` whose prefix rows are gathered to
  the N samples; the generic fallback.
"""

from __future__ import annotations

import importlib

import torch

from ..batch import left_pad
from .base import SamplingParams
from .common import ModuleEngine, make_generator, sample_next

KERNELS = ("auto", "shared_prefix", "hf_cache")
SHARED_PREFIX_MODEL_TYPES = ("llama", "qwen2", "qwen3", "mistral")


def shared_prefix_attention(q: torch.Tensor, prefix_k: torch.Tensor, prefix_v: torch.Tensor,
                            prefix_bias: torch.Tensor, gen_k: torch.Tensor, gen_v: torch.Tensor,
                            scale: float) -> torch.Tensor:
    """One decode step of attention for rows laid out [P, K] (row r = p*K + k reads prompt p's prefix).

        a_r = softmax([q_r . K_p^T + bias_p, q_r . G_r^T] * scale) [V_p ; W_r]

    with K_p, V_p the prompt's prefix keys/values (shared by its K rows) and G_r, W_r the row's own generated ones.
    Query head h reads KV head h // g (grouped-query attention, g = H / H_kv), as HF's ``repeat_kv`` does.

    q [P*K, H, d]; prefix_k/v [P, H_kv, L, d]; prefix_bias [P, 1, 1, 1, L] (0 or -inf on left padding);
    gen_k/v [P*K, H_kv, t, d]. Returns [P*K, H*d].
    """
    R, H, d = q.shape
    P, Hkv, L, _ = prefix_k.shape
    K, g, t = R // P, H // Hkv, gen_k.shape[2]
    qg = q.view(P, K, Hkv, g, d).transpose(1, 2)  # [P, H_kv, K, g, d]
    s_pre = (qg.reshape(P, Hkv, K * g, d) @ prefix_k.transpose(-1, -2)).view(P, Hkv, K, g, L)
    s_pre = s_pre * scale + prefix_bias  # [P, H_kv, K, g, L]
    s_gen = (q.view(R, Hkv, g, d) @ gen_k.transpose(-1, -2)) * scale  # [R, H_kv, g, t]
    s_gen = s_gen.view(P, K, Hkv, g, t).transpose(1, 2)  # [P, H_kv, K, g, t]
    w = torch.cat([s_pre, s_gen], dim=-1).softmax(dim=-1)  # [P, H_kv, K, g, L + t]
    o_pre = w[..., :L].reshape(P, Hkv, K * g, L) @ prefix_v  # [P, H_kv, K*g, d]
    o_pre = o_pre.view(P, Hkv, K, g, d).transpose(1, 2).reshape(R, Hkv, g, d)
    o_gen = w[..., L:].transpose(1, 2).reshape(R, Hkv, g, t) @ gen_v  # [R, H_kv, g, d]
    return (o_pre + o_gen).reshape(R, H * d)


def supports_shared_prefix(model) -> bool:
    """Whether :class:`_SharedPrefixDecoder` can run ``model``: a Llama-family decoder, full attention only."""
    cfg = model.config
    types = getattr(cfg, "layer_types", None) or ["full_attention"]
    if cfg.model_type not in SHARED_PREFIX_MODEL_TYPES or any(t != "full_attention" for t in types):
        return False
    if cfg.model_type == "mistral" and getattr(cfg, "sliding_window", None):
        return False
    return hasattr(model.get_decoder(), "rotary_emb")


class _SharedPrefixDecoder:
    """The decode step of a Llama-family model, written out over its own modules (weights are never copied):

        h = embed(y);  per layer:  h += o_proj(attn(rope(q), rope(k), v));  h += mlp(post_norm(h))
        z = lm_head(norm(h))

    with q/k/v = proj(input_norm(h)) (Qwen3 also RMS-normalises q and k per head), and attention over the shared
    prefix plus this row's generated tokens.
    """

    def __init__(self, model):
        self.core = model.get_decoder()
        self.head = model.get_output_embeddings()
        attn = self.core.layers[0].self_attn
        self.head_dim = attn.head_dim
        self.scale = attn.scaling
        self.rope = importlib.import_module(type(attn).__module__).apply_rotary_pos_emb

    def start(self, cache, prefix_mask: torch.Tensor, rows: int, T: int) -> None:
        """Take the prefill's KV (post-RoPE keys) as the shared prefix and allocate the generated-KV buffers.

        Attention runs in float32 whatever the model dtype (as SDPA accumulates internally): bf16 attention scores
        would carry ~0.4% relative error into the softmax and the returned log-probs."""
        self.prefix = [(layer.keys.float(), layer.values.float()) for layer in cache.layers]  # [P_c, H_kv, L, d]
        bias = torch.zeros(prefix_mask.shape, dtype=torch.float32, device=prefix_mask.device)
        self.prefix_bias = bias.masked_fill(prefix_mask == 0, float("-inf"))[:, None, None, None, :]
        k0 = self.prefix[0][0]
        shape = (rows, k0.shape[1], T, k0.shape[3])  # [R, H_kv, T, d]; column t is written before it is read
        self.gen = [(k0.new_empty(shape), k0.new_empty(shape)) for _ in self.prefix]

    def compact(self, index: torch.Tensor) -> None:
        """Keep generated-KV rows ``index`` (the prefix is per prompt and never moves)."""
        self.gen = [(k[index], v[index]) for k, v in self.gen]

    def step(self, tok: torch.Tensor, pos: torch.Tensor, t: int) -> torch.Tensor:
        """Logits [R, V] after feeding token ``tok`` [R] at positions ``pos`` [R] as generated token ``t``."""
        h = self.core.embed_tokens(tok)[:, None]  # [R, 1, D]
        cos, sin = self.core.rotary_emb(h, pos[:, None])  # [R, 1, d]
        R, d = tok.shape[0], self.head_dim
        for layer, (pk, pv), (gk, gv) in zip(self.core.layers, self.prefix, self.gen):
            attn = layer.self_attn
            x = layer.input_layernorm(h)  # [R, 1, D]
            q = attn.q_proj(x).view(R, 1, -1, d)  # [R, 1, H, d]
            k = attn.k_proj(x).view(R, 1, -1, d)  # [R, 1, H_kv, d]
            if hasattr(attn, "q_norm"):  # Qwen3
                q, k = attn.q_norm(q), attn.k_norm(k)
            q, k = self.rope(q.transpose(1, 2), k.transpose(1, 2), cos, sin)  # [R, H, 1, d], [R, H_kv, 1, d]
            gk[:, :, t] = k[:, :, 0]
            gv[:, :, t] = attn.v_proj(x).view(R, -1, d)
            o = shared_prefix_attention(q[:, :, 0].float(), pk, pv, self.prefix_bias, gk[:, :, : t + 1],
                                        gv[:, :, : t + 1], self.scale)  # [R, H*d] float32
            h = h + attn.o_proj(o.to(h.dtype))[:, None]
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        return self.head(self.core.norm(h))[:, 0]  # [R, V]


class TorchEngine(ModuleEngine):
    """Batched KV-cache sampler.

    ``TorchEngine(model, tokenizer=None, *, device="auto", dtype="auto", chunk_sequences=1024, kernel="auto")``.
    ``model``: ``'default'``, a local HF directory, a hub id or a HF causal-LM ``nn.Module`` (copied: the engine
    keeps its own eval-mode weights, and :meth:`sync_weights` copies the trainer's in). ``kernel``: ``"auto"``
    picks ``"shared_prefix"`` when the architecture allows it, else ``"hf_cache"``. ``drop_finished_fraction``:
    finished rows are compacted away once they are at least this share of the rows still decoded (compaction
    copies the generated KV, so doing it for every finished row would cost more than it saves).
    """

    name = "torch"

    def __init__(self, model="default", tokenizer=None, *, device: str = "auto", dtype: str = "auto",
                 chunk_sequences: int = 1024, kernel: str = "auto", drop_finished_fraction: float = 0.25):
        if kernel not in KERNELS:
            raise ValueError(f"kernel: got {kernel!r}; allowed: {', '.join(KERNELS)}")
        if not (isinstance(drop_finished_fraction, (int, float)) and 0 < drop_finished_fraction <= 1):
            raise ValueError(f"drop_finished_fraction: got {drop_finished_fraction!r}; allowed: a float in (0, 1]")
        super().__init__(model, tokenizer, device=device, dtype=dtype, chunk_sequences=chunk_sequences)
        if kernel == "auto":
            kernel = "shared_prefix" if supports_shared_prefix(self.model) else "hf_cache"
        elif kernel == "shared_prefix" and not supports_shared_prefix(self.model):
            raise ValueError(f"kernel: 'shared_prefix' does not support model_type {self.model.config.model_type!r} "
                             f"(allowed: {', '.join(SHARED_PREFIX_MODEL_TYPES)} with full attention); use 'hf_cache'")
        self.kernel = kernel
        self.drop_finished_fraction = float(drop_finished_fraction)

    def _sample_chunks(self, chunks, sampling):
        gen = make_generator(sampling.seed, self.device)
        return [self._generate_chunk(seqs, k, sampling, gen) for seqs, k in chunks]

    def _extra_meta(self) -> dict:
        return {"kernel": self.kernel}

    # ---- the sampler --------------------------------------------------------------------------------------------
    @torch.inference_mode()
    def _generate_chunk(self, seqs: list[list[int]], k: int, sampling: SamplingParams,
                        gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """``k`` samples of each prompt in ``seqs``; returns ``(ids, logprobs)`` [P_c*k, max_new_tokens] on CPU,
        rows prompt-major, EOS-finished rows padded (ids -> pad, logprobs -> 0)."""
        from transformers import DynamicCache

        model, dev, T, pad = self.model, self.device, sampling.max_new_tokens, self.pad_id
        ids, mask = left_pad(seqs, pad)  # [P_c, L]
        padded = bool((mask == 0).any())
        ids, mask = ids.to(dev), mask.to(dev)
        pos = (mask.cumsum(-1) - 1).clamp(min=0)  # [P_c, L] positions restart at each prompt's first real token
        cache = DynamicCache(config=model.config)
        logits = model(input_ids=ids, attention_mask=mask if padded else None, position_ids=pos,
                       past_key_values=cache, use_cache=True, logits_to_keep=1).logits[:, -1]  # [P_c, V]
        P, R = len(seqs), len(seqs) * k
        row_prompt = torch.arange(P, device=dev).repeat_interleave(k)  # [R]
        logits, next_pos = logits[row_prompt], pos[row_prompt, -1] + 1  # [R, V], [R]
        if self.kernel == "shared_prefix":
            decoder = _SharedPrefixDecoder(model)
            decoder.start(cache, mask, R, T)
        else:
            cache.batch_select_indices(row_prompt)  # every sample row gets a copy of its prompt's prefix KV
            mask = mask[row_prompt] if padded else None  # [R, L]

        out_ids = torch.full((R, T), pad, dtype=torch.long, device=dev)  # [R, T]
        out_lp = torch.zeros((R, T), dtype=torch.float32, device=dev)  # [R, T]
        rows = torch.arange(R, device=dev)  # [A] output row of each decoded row (A = P_c*K in the shared layout)
        alive = torch.ones(R, dtype=torch.bool, device=dev)  # [A] not yet finished
        eos = torch.tensor(self.eos_ids, device=dev)
        K = k  # rows per prompt in the shared-prefix layout
        for t in range(T):
            tok, lp = sample_next(logits, sampling.temperature, sampling.top_p, gen)  # [A], [A]
            out_ids[rows, t] = torch.where(alive, tok, pad)
            out_lp[rows, t] = torch.where(alive, lp, 0.0)
            alive &= ~torch.isin(tok, eos)
            if t == T - 1 or not bool(alive.any()):
                break
            if self.kernel == "shared_prefix":
                # Compact each prompt's live rows to the front of a narrower [P_c, K'] layout.
                K_new = int(alive.view(P, K).sum(1).max())
                if (K - K_new) * P >= self.drop_finished_fraction * P * K:
                    order = (~alive.view(P, K)).to(torch.int8).argsort(dim=1, stable=True)[:, :K_new]
                    keep = (order + torch.arange(P, device=dev)[:, None] * K).reshape(-1)  # [P_c*K']
                    decoder.compact(keep)
                    rows, alive, tok, next_pos, K = rows[keep], alive[keep], tok[keep], next_pos[keep], K_new
                logits = decoder.step(tok, next_pos, t)
            else:
                if (~alive).sum() >= self.drop_finished_fraction * len(alive):
                    keep = alive.nonzero().squeeze(1)  # [A']
                    cache.batch_select_indices(keep)
                    rows, alive, tok, next_pos = rows[keep], alive[keep], tok[keep], next_pos[keep]
                    mask = None if mask is None else mask[keep]
                if mask is not None:
                    mask = torch.cat([mask, mask.new_ones(len(rows), 1)], dim=1)  # [A, L + t + 1]
                logits = model(input_ids=tok[:, None], attention_mask=mask, position_ids=next_pos[:, None],
                               past_key_values=cache, use_cache=True).logits[:, -1]  # [A, V]
            next_pos = next_pos + 1
        return out_ids.cpu(), out_lp.cpu()
