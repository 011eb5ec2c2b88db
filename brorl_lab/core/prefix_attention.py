"""Attention of many rows over a shared prompt prefix, each prompt's keys and values held once, never per row.

A prompt's N rollouts share its prefix x. A plain KV cache copies x's keys and values to every row and attends row
by row; here a prompt's rows are stacked so their queries meet the prefix in one matmul per prompt and KV head,

    [K * g * W, d] x [d, L]      (K rows of the prompt, g query heads per KV head, W queries per row, L = |x|)

and each row's own tokens join through a second, per-row term of the same softmax (Hydragen, Juravsky et al. 2024).

Two users, one kernel:
- the torch rollout engine: decode, W = 1 new token per row, generated keys kept in the engine's buffers;
- the trainer's shared-prefix log-probs (``brorl_lab.rl.logprobs``): a row's whole response at once (W tokens,
  causal among themselves), with gradients flowing back into the prompt's one prefix pass.

:class:`PrefixDecoder` runs a Llama-family decoder (Llama, Qwen2, Qwen3, Mistral; full attention) written out over
the model's own modules, so the attention in the middle can be this one; other models take their callers' generic
paths (a transformers ``DynamicCache`` with the prefix copied per row).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import NamedTuple, Optional

import torch

SHARED_PREFIX_MODEL_TYPES = ("llama", "qwen2", "qwen3", "mistral")


def supports_shared_prefix(model) -> bool:
    """Whether :class:`PrefixDecoder` can run ``model``: a Llama-family decoder, full attention only."""
    cfg = getattr(model, "config", None)
    if cfg is None or getattr(cfg, "model_type", None) not in SHARED_PREFIX_MODEL_TYPES:
        return False
    types = getattr(cfg, "layer_types", None) or ["full_attention"]
    if any(t != "full_attention" for t in types):
        return False
    if cfg.model_type == "mistral" and getattr(cfg, "sliding_window", None):
        return False
    return hasattr(model.get_decoder(), "rotary_emb")


class PrefixGrid(NamedTuple):
    """Where each of R rows sits in a [P, K] grid: row r is the ``within[r]``-th row of prompt ``prompt[r]``.

    Dense (``prompt is None``) when the rows are exactly the grid in order, r = p*K + k (the engine's layout, and a
    micro-batch holding one prompt's rows): moving to and from the grid is then a view and a transpose. Otherwise
    rows are scattered into a zero-padded grid, so prompts with fewer rows cost padding only in the prefix matmuls.
    """

    P: int
    K: int
    prompt: Optional[torch.Tensor] = None  # [R] long, or None (dense)
    within: Optional[torch.Tensor] = None  # [R] long, or None (dense)

    @classmethod
    def of(cls, prompt: torch.Tensor, P: int) -> "PrefixGrid":
        """The grid for rows whose prompts (in 0..P-1) are ``prompt`` [R], in any order."""
        counts = torch.bincount(prompt, minlength=P)  # [P]
        K = int(counts.max())
        in_order = torch.arange(P, device=prompt.device).repeat_interleave(K)  # rows p*K .. p*K+K-1 are prompt p's
        if bool((counts == K).all()) and torch.equal(prompt, in_order):
            return cls(P, K)
        order = torch.argsort(prompt, stable=True)  # rows sorted by prompt, in their order within a prompt
        first = torch.cumsum(counts, 0) - counts  # [P] sorted position of each prompt's first row
        within = torch.empty_like(prompt)
        within[order] = torch.arange(len(prompt), device=prompt.device) - first[prompt[order]]
        return cls(P, K, prompt, within)

    def to_grid(self, x: torch.Tensor) -> torch.Tensor:
        """[R, H_kv, M, e] -> [P, H_kv, K*M, e]: each prompt's rows stacked along the matmul's M dimension."""
        R, Hkv, M, e = x.shape
        if self.prompt is None:
            grid = x.reshape(self.P, self.K, Hkv, M, e)
        else:
            grid = x.new_zeros(self.P, self.K, Hkv, M, e).index_put((self.prompt, self.within), x)
        return grid.transpose(1, 2).reshape(self.P, Hkv, self.K * M, e)

    def from_grid(self, y: torch.Tensor) -> torch.Tensor:
        """[P, H_kv, K*M, e] -> [R, H_kv, M, e], the inverse of :meth:`to_grid` (padding rows dropped)."""
        P, Hkv, KM, e = y.shape
        grid = y.reshape(P, Hkv, self.K, KM // self.K, e).transpose(1, 2)  # [P, K, H_kv, M, e]
        if self.prompt is None:
            return grid.reshape(P * self.K, Hkv, KM // self.K, e)
        return grid[self.prompt, self.within]


def shared_prefix_attention(q: torch.Tensor, prefix_k: torch.Tensor, prefix_v: torch.Tensor,
                            prefix_bias: torch.Tensor, own_k: torch.Tensor, own_v: torch.Tensor, scale: float,
                            grid: PrefixGrid, own_bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Attention of each row's W queries over its prompt's prefix and, causally, over its own tokens:

        a_{r,j} = softmax([q_{r,j} . K_p^T + bias_p,  q_{r,j} . G_r^T + causal_j] * scale) [V_p ; U_r]

    K_p, V_p: prompt p's prefix keys and values, shared by its rows; G_r, U_r: the row's own keys and values, of
    which the last W are the queries' own (query j sees own keys 0 .. Wk-W+j). Query head h reads KV head h // g
    (grouped-query attention, g = H / H_kv), as HF's ``repeat_kv`` does.

    q [R, H, W, d]; prefix_k/v [P, H_kv, L, d]; prefix_bias [P, L] (0, or -inf on left padding);
    own_k/v [R, H_kv, Wk, d]; grid: each row's place under its prompt; ``own_bias`` [Wk] (optional: 0, or -inf
    on own keys not yet written, for a decode step over a fixed-width buffer). Returns [R, W, H*d].
    """
    R, H, W, d = q.shape
    Hkv, L, Wk = prefix_k.shape[1], prefix_k.shape[2], own_k.shape[2]
    g = H // Hkv
    qg = q.reshape(R, Hkv, g * W, d)  # [R, H_kv, g*W, d], row m*W + j = query j of head (kv head)*g + m
    s_pre = grid.to_grid(qg) @ prefix_k.transpose(-1, -2)  # [P, H_kv, K*g*W, L]: one matmul per prompt, KV head
    s_pre = grid.from_grid(s_pre * scale + prefix_bias[:, None, None, :])  # [R, H_kv, g*W, L]
    s_own = (qg @ own_k.transpose(-1, -2)) * scale  # [R, H_kv, g*W, Wk]
    if W > 1:
        future = torch.ones(W, Wk, dtype=torch.bool, device=q.device).triu(Wk - W + 1)  # [W, Wk] keys after query j
        s_own = s_own.masked_fill(future.repeat(g, 1), float("-inf"))
    if own_bias is not None:
        s_own = s_own + own_bias
    w = torch.cat([s_pre, s_own], dim=-1).softmax(dim=-1)  # [R, H_kv, g*W, L + Wk]
    o = grid.from_grid(grid.to_grid(w[..., :L]) @ prefix_v) + w[..., L:] @ own_v  # [R, H_kv, g*W, d]
    return o.reshape(R, H, W, d).transpose(1, 2).reshape(R, W, H * d)


OwnKV = Callable[[int, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


class PrefixDecoder:
    """A Llama-family decoder written out over the model's own modules (weights are never copied), for tokens that
    attend to a shared prompt prefix plus their row's own tokens:

        h = embed(y);  per layer:  h += o_proj(attn(rope(q), rope(k), v));  h += mlp(post_norm(h))
        z = lm_head(norm(h))

    with q/k/v = proj(input_norm(h)) (Qwen3 also RMS-normalises q and k per head) and ``attn`` =
    :func:`shared_prefix_attention`. Attention runs in float32 whatever the model dtype (as SDPA accumulates
    internally): bf16 scores would carry ~0.4% relative error into the softmax and the log-probs.
    """

    def __init__(self, model):
        if not supports_shared_prefix(model):
            raise ValueError(f"model: PrefixDecoder supports {', '.join(SHARED_PREFIX_MODEL_TYPES)} with full "
                             f"attention; got {getattr(model.config, 'model_type', type(model).__name__)!r}")
        self.core = model.get_decoder()
        self.head = model.get_output_embeddings()
        attn = self.core.layers[0].self_attn
        self.head_dim = attn.head_dim
        self.scale = attn.scaling
        self.rope = importlib.import_module(type(attn).__module__).apply_rotary_pos_emb

    def logits(self, tokens: torch.Tensor, positions: torch.Tensor, prefix: list, prefix_bias: torch.Tensor,
               grid: PrefixGrid, own_kv: Optional[OwnKV] = None,
               own_bias: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Logits [R, W, V] after ``tokens`` [R, W] at ``positions`` [R, W].

        ``prefix``: per layer ``(keys, values)`` [P, H_kv, L, d] in float32, post-RoPE (the layers of a
        ``DynamicCache`` after the prompts' forward); ``prefix_bias`` [P, L]; ``grid``: each row's prompt.
        ``own_kv(layer, k, v)`` maps this call's keys and values [R, H_kv, W, d] to the row's own keys and values
        so far; by default they are just these (the W tokens are the first after the prefix). The engine passes
        one that appends them to its decode buffers; ``own_bias`` [Wk] masks own keys not yet written (see
        :func:`shared_prefix_attention`).
        """
        R, W = tokens.shape
        d = self.head_dim
        h = self.core.embed_tokens(tokens)  # [R, W, D]
        cos, sin = self.core.rotary_emb(h, positions)  # [R, W, d]
        for i, (layer, (pk, pv)) in enumerate(zip(self.core.layers, prefix)):
            attn = layer.self_attn
            x = layer.input_layernorm(h)  # [R, W, D]
            q = attn.q_proj(x).view(R, W, -1, d)  # [R, W, H, d]
            k = attn.k_proj(x).view(R, W, -1, d)  # [R, W, H_kv, d]
            v = attn.v_proj(x).view(R, W, -1, d).transpose(1, 2).float()  # [R, H_kv, W, d]
            if hasattr(attn, "q_norm"):  # Qwen3
                q, k = attn.q_norm(q), attn.k_norm(k)
            q, k = self.rope(q.transpose(1, 2), k.transpose(1, 2), cos, sin)  # [R, H, W, d], [R, H_kv, W, d]
            own_k, own_v = (k.float(), v) if own_kv is None else own_kv(i, k.float(), v)
            o = shared_prefix_attention(q.float(), pk, pv, prefix_bias, own_k, own_v, self.scale, grid,
                                        own_bias)  # [R, W, H*d]
            h = h + attn.o_proj(o.to(h.dtype))
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        return self.head(self.core.norm(h))  # [R, W, V]


def padding_bias(mask: torch.Tensor) -> torch.Tensor:
    """[P, L] attention bias of left-padded prompts: 0 on real tokens, -inf on padding (``mask`` [P, L], 1 = real)."""
    return torch.zeros(mask.shape, dtype=torch.float32, device=mask.device).masked_fill(mask == 0, float("-inf"))


__all__ = ["SHARED_PREFIX_MODEL_TYPES", "supports_shared_prefix", "PrefixGrid", "shared_prefix_attention",
           "PrefixDecoder", "padding_bias"]
