"""The trainer's recomputation of response-token log-probabilities (and entropies) for a RolloutBatch.

For row b (prompt x_p, response y with length |y|) and response position t:

    logp[b, t]    = log softmax(z_t / tau)[y_t] = z_t[y_t] / tau - logsumexp(z_t / tau)
    entropy[b, t] = H(softmax(z_t / tau)) = logsumexp(z_t / tau) - sum_v softmax(z_t / tau)_v * z_t[v] / tau

with z_t = f(x_p, y_<t) the model's logits; both are 0 on padding (t >= |y|). The engines return the same
``logp`` for the tokens they sampled, so ``exp(logp_trainer - logp_engine)`` is 1 when the weights agree.

Two layouts give the same numbers (fp32: values to ~3e-6, gradients to ~2e-5 relative) at different cost:

- ``"shared_prefix"``: each distinct prompt of a micro-batch goes through the model once (``use_cache=True``);
  its KV cache is indexed out to the prompt's rows and the responses go through a second forward that attends
  to it. Autograd carries every row's gradient back into the one prefix pass. At N=512 with ~31 prompt and ~3
  response tokens a row this puts ~10x fewer tokens through the model (the profile behind issue 7: ~91% of the
  packed layout's tokens were the same prompt recomputed for each row).
- ``"packed"``: one forward of prompt + response per row, prompts left-padded to a common column S so every
  response starts at S; the model's ``logits_to_keep`` projects only the last W+1 columns through the LM head.
  Needs no KV cache, so it runs any causal LM.

``"auto"`` (the default) takes ``"shared_prefix"`` when the rows hold fewer distinct prompts than rows and the
model's KV cache is a plain full-attention one, else ``"packed"``. Either way the [b, L, V] log-softmax over prompt
positions is never built, and memory per forward is set by the micro-batch token budget
(:func:`plan_micro_batches` counts tokens as the layout holds them), not by P*N.

    logp = compute_logprobs(policy, batch, temperature=1.0, micro_batch_tokens=8192)       # [P*N, T], no grad
    for mb in plan_micro_batches(policy, batch, rows, 8192):
        logp, ent = token_logprobs(policy, batch, rows[mb], temperature=1.0, with_entropy=True)  # [b, T], grads

``fused=True`` (either layout) runs the model's RMSNorms and SwiGLU MLPs through ``torch.compile`` for the call
(:func:`fused_elementwise`): the same numbers to ~1e-6, fewer passes over memory in the forward and the backward.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import contextmanager
from typing import NamedTuple, Optional

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from brorl_lab.core.batch import RolloutBatch, left_pad
from brorl_lab.core.config import LOGPROB_LAYOUTS
from brorl_lab.core.prefix_attention import PrefixDecoder, PrefixGrid, padding_bias, supports_shared_prefix
from brorl_lab.core.validation import check_int, is_number

# The explicit shared-prefix kernel builds its attention scores ([rows, H, W, keys]); past this many keys per row the
# suffix pass uses the model's own attention instead (SDPA never materialises scores), so memory stays set by tokens.
EXPLICIT_MAX_KEYS = 1024
# Past this many response tokens the suffix pass uses the model's own attention (see suffix_in_decoder).
DECODER_MAX_RESPONSE = 32


def suffix_in_decoder(model: torch.nn.Module, batch: RolloutBatch) -> bool:
    """Whether the shared-prefix layout's suffix passes over ``batch`` run in
    :class:`~brorl_lab.core.prefix_attention.PrefixDecoder` (explicit scores, each prompt's KV read once by one matmul
    per prompt) rather than the model's own attention (SDPA over the prompt's KV copied to each row).

    The decoder wins at short responses: it never copies the prompt's KV, and its [rows, H, W, L + W] scores are
    small. At long ones the O(W^2) scores decide: on 24-token prompts the model's own SDPA (which never builds them)
    ran a 64-row forward and backward in 0.78x the decoder's CPU time at 256 response tokens, 0.88x at 64, and the
    same at 16 (interleaved on one core, loaded machine). So the decoder runs while no response is longer than
    :data:`DECODER_MAX_RESPONSE` tokens and a row has at most :data:`EXPLICIT_MAX_KEYS` keys (memory). Either way
    the numbers are the same."""
    if not supports_shared_prefix(model):
        return False
    keys = max(len(x) for x in batch.prompt_ids) + batch.response_ids.shape[1]
    return keys <= EXPLICIT_MAX_KEYS and int(batch.lengths.max()) <= DECODER_MAX_RESPONSE


def micro_batches(token_counts: torch.Tensor, token_budget: int, *, prompt_of: Optional[torch.Tensor] = None,
                  prompt_tokens: Optional[Sequence[int]] = None) -> list[torch.Tensor]:
    """Split rows ``0..B-1`` in order into consecutive groups whose token counts sum to at most ``token_budget``
    (a single row above the budget forms its own group). Returns a list of index tensors (long).

    With ``prompt_of`` [B] (each row's prompt) and ``prompt_tokens`` (per prompt), a group also pays each of its
    prompts' tokens once, at its first row of that prompt: the shared-prefix layout's cost."""
    check_int('token_budget', token_budget, 1)
    counts = torch.as_tensor(token_counts)
    if counts.ndim != 1:
        raise ValueError(f"token_counts: got shape {tuple(counts.shape)}; allowed: a 1-D tensor [B] of token counts")
    if prompt_of is None:
        prompts = [None] * len(counts)
    else:
        prompts = torch.as_tensor(prompt_of).reshape(-1).tolist()
        if len(prompts) != len(counts) or prompt_tokens is None \
                or not all(isinstance(p, int) and 0 <= p < len(prompt_tokens) for p in prompts):
            raise ValueError(f"prompt_of: got {len(prompts)} entries; allowed: one prompt index per row "
                             f"({len(counts)}), each an index into prompt_tokens (needed with prompt_of)")
    groups, start, total, paid = [], 0, 0, set()  # paid: prompts already charged in the open group
    for i, (c, p) in enumerate(zip(counts.tolist(), prompts)):
        prompt = 0 if p is None else prompt_tokens[p]
        if i > start and total + c + (0 if p in paid else prompt) > token_budget:
            groups.append(torch.arange(start, i))
            start, total, paid = i, 0, set()
        total += c + (0 if p in paid else prompt)
        paid.add(p)
    if len(counts):
        groups.append(torch.arange(start, len(counts)))
    return groups


def plan_micro_batches(model: torch.nn.Module, batch: RolloutBatch, rows: Sequence[int] | torch.Tensor,
                       token_budget: int, layout: str = "auto") -> list[torch.Tensor]:
    """Positions in ``rows`` split into micro-batches whose tokens, as ``layout`` holds them, fit ``token_budget``.

    Counted per micro-batch: every row's prompt + response tokens (packed, and shared prefix on the model's own
    attention, which copies each prompt's KV to its rows), or, when every suffix pass of ``batch`` runs in
    :class:`~brorl_lab.core.prefix_attention.PrefixDecoder`, each distinct prompt once plus each response token at
    ``1 + H * K / D``: its activations and its attention scores over at most K = longest prompt + T keys, in units
    of the D-wide hidden state. So the budget bounds what a forward holds, whichever layout runs."""
    rows = _as_rows(batch, rows)
    if layout not in LOGPROB_LAYOUTS:
        raise ValueError(f"layout: got {layout!r}; allowed: {', '.join(LOGPROB_LAYOUTS)}")
    if layout == "packed" or _plain_kv_cache(model) is None or not suffix_in_decoder(model, batch):
        return micro_batches(row_token_counts(batch)[rows], token_budget)
    keys = max(len(x) for x in batch.prompt_ids) + batch.response_ids.shape[1]
    per_token = 1 + model.config.num_attention_heads * keys / model.config.hidden_size
    costs = torch.ceil(batch.lengths[rows] * per_token).long()  # [b]
    return micro_batches(costs, token_budget, prompt_of=batch.prompt_index[rows],
                         prompt_tokens=[len(x) for x in batch.prompt_ids])


def row_token_counts(batch: RolloutBatch) -> torch.Tensor:
    """[P*N] prompt + response tokens of each row (what a micro-batch budget counts in the packed layout)."""
    prompt_lens = torch.tensor([len(x) for x in batch.prompt_ids], dtype=torch.long)  # [P]
    return prompt_lens.repeat_interleave(batch.group_sizes) + batch.lengths


class Packed(NamedTuple):
    """Rows laid out for one forward: prompt left-padded to ``start`` columns, then the response."""

    input_ids: torch.Tensor  # [b, start + width] long
    attention_mask: torch.Tensor  # [b, start + width] long, 1 on real tokens
    position_ids: torch.Tensor  # [b, start + width] long, 0 at each prompt's first token
    start: int  # column of the first response token (= the longest prompt among the rows)
    width: int  # response columns (= the longest response among the rows, >= 1)


def pack(batch: RolloutBatch, rows: Sequence[int] | torch.Tensor) -> Packed:
    """Prompt + response of each row in ``rows``, aligned so all responses start at column ``start``."""
    rows = _as_rows(batch, rows)
    prompt_ids, prompt_mask = left_pad([batch.prompt_ids[p] for p in batch.prompt_index[rows].tolist()], batch.pad_id)
    lengths = batch.lengths[rows]  # [b]
    W = max(int(lengths.max()), 1)
    ids = torch.cat([prompt_ids, batch.response_ids[rows, :W]], dim=1)  # [b, S + W]
    mask = torch.cat([prompt_mask, (torch.arange(W)[None, :] < lengths[:, None]).long()], dim=1)
    S = prompt_ids.shape[1]
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    return Packed(ids, mask, positions, S, W)


def token_logprobs(model: torch.nn.Module, batch: RolloutBatch, rows: Sequence[int] | torch.Tensor, *,
                   temperature: float, with_entropy: bool = False, entropy_grad: bool = True,
                   layout: str = "auto", fused: bool = False) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """``(logp [b, T], entropy [b, T] | None)`` for ``rows`` of ``batch`` (T = batch.response_ids.shape[1]),
    float32 on the model's device, 0 on padding. Differentiable: gradients flow when called outside ``no_grad``;
    ``entropy_grad=False`` returns the entropy as a value only (a metric), which saves its graph.
    ``layout``: one of :data:`LOGPROB_LAYOUTS` (module docstring); it changes the cost, not the result.
    ``fused``: the model's norms and MLPs run compiled for this call (:func:`fused_elementwise`); same result.
    """
    _check_temperature(temperature)
    rows = _as_rows(batch, rows)
    if layout not in LOGPROB_LAYOUTS:
        raise ValueError(f"layout: got {layout!r}; allowed: {', '.join(LOGPROB_LAYOUTS)}")
    cache = None
    if layout == "shared_prefix" or (layout == "auto" and len(torch.unique(batch.prompt_index[rows])) < len(rows)):
        cache = _plain_kv_cache(model)
        if cache is None and layout == "shared_prefix":
            raise ValueError(f"layout: 'shared_prefix' needs a plain full-attention KV cache; model_type "
                             f"{getattr(model.config, 'model_type', type(model).__name__)!r} has none; use 'packed'")
    stats = dict(temperature=temperature, with_entropy=with_entropy, entropy_grad=entropy_grad)
    with fused_elementwise(model, fused):
        if cache is None:
            return _packed(model, batch, rows, **stats)
        return _shared_prefix(model, batch, rows, cache, **stats)


def fusable_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The modules :func:`fused_elementwise` compiles: each decoder layer's two RMSNorms and its MLP (SwiGLU:
    ``down(silu(gate(x)) * up(x))``) and the final norm, for decoders laid out as Llama's (``get_decoder().layers``
    with ``input_layernorm``, ``post_attention_layernorm``, ``mlp``); [] for any other model."""
    core = model.get_decoder() if hasattr(model, "get_decoder") else None
    layers = getattr(core, "layers", None)
    names = ("input_layernorm", "post_attention_layernorm", "mlp")
    if layers is None or not all(hasattr(layer, n) for layer in layers for n in names):
        return []
    mods = [getattr(layer, n) for layer in layers for n in names]
    return mods + ([core.norm] if hasattr(core, "norm") else [])


@contextmanager
def fused_elementwise(model: torch.nn.Module, enabled: bool = True):
    """Within the block, :func:`fusable_modules` of ``model`` run through ``torch.compile`` (inductor, dynamic
    shapes): an RMSNorm, ``w * x / sqrt(mean(x^2) + eps)``, becomes one pass over x instead of five ops' worth, the
    SwiGLU product one instead of two, in the forward and in the backward that autograd records for them (which
    runs later, after the block, as compiled). Outside the block the modules are eager again: a compiled call is
    bound to its module, so one left in place would survive a ``copy.deepcopy`` (the engine's and the reference's
    copies of the policy) still pointing at the original's weights. Compiled graphs are cached by torch, so only
    the first block per shape family compiles (seconds to a minute on a CPU; inductor needs a C++ compiler there).
    """
    mods = fusable_modules(model) if enabled else []
    for m in mods:
        m.compile(dynamic=True)
    try:
        yield
    finally:
        for m in mods:
            m._compiled_call_impl = None  # what nn.Module.compile set: the module's own eager call again


def _log_softmax(z: torch.Tensor, temperature: float) -> torch.Tensor:
    """log softmax(z / temperature) over the vocabulary, in float32 (no division at temperature 1)."""
    z = z.float()
    return torch.log_softmax(z if temperature == 1 else z / temperature, dim=-1)


def _entropy(log_probs: torch.Tensor, grad: bool) -> torch.Tensor:
    """H = -sum_v p_v log p_v of each distribution [..., V] -> [...] (entr(0) = 0, so -inf logits are safe)."""
    with torch.set_grad_enabled(grad and torch.is_grad_enabled()):
        return torch.special.entr(log_probs.exp()).sum(-1)


def _token_stats(log_probs: torch.Tensor, targets: torch.Tensor, valid: torch.Tensor, *, with_entropy: bool,
                 entropy_grad: bool):
    """log-softmax [b, W, V] (row t predicts targets[:, t]) -> (logp [b, W], entropy [b, W] | None), 0 off
    ``valid``."""
    logp = log_probs.gather(-1, targets[..., None]).squeeze(-1).masked_fill(~valid, 0.0)
    if not with_entropy:
        return logp, None
    return logp, _entropy(log_probs, entropy_grad).masked_fill(~valid, 0.0)


def _packed(model, batch: RolloutBatch, rows: torch.Tensor, *, temperature: float, **stats):
    """One forward over prompt + response per row; the LM head sees only the last W+1 columns."""
    device = next(model.parameters()).device
    packed = pack(batch, rows)
    S, W = packed.start, packed.width
    out = model(input_ids=packed.input_ids.to(device), attention_mask=packed.attention_mask.to(device),
                position_ids=packed.position_ids.to(device), use_cache=False, logits_to_keep=W + 1)
    valid = packed.attention_mask[:, S:].to(device).bool()  # [b, W]
    targets = packed.input_ids[:, S:].to(device)  # [b, W]: column S-1+t predicts response token t
    logp, ent = _token_stats(_log_softmax(out.logits[:, :W], temperature), targets, valid, **stats)
    T = batch.response_ids.shape[1]
    return _pad_to(logp, T), None if ent is None else _pad_to(ent, T)


def _shared_prefix(model, batch: RolloutBatch, rows: torch.Tensor, cache, *, temperature: float, with_entropy: bool,
                   entropy_grad: bool):
    """One forward over the rows' distinct prompts (KV kept in ``cache``), then the responses against that KV.

    Response token 0 is predicted by the prefix pass itself; tokens 1.. need a suffix pass over y_<t. Rows go into
    suffix passes by width bucket ((1], (1, 2], (2, 4], (4, 8], ...), so padding stays under 2x the real tokens
    even when a few truncated rows are much longer than the rest (at most log2(T) + 1 passes).

    A suffix pass runs through :class:`~brorl_lab.core.prefix_attention.PrefixDecoder` for Llama-family models (each
    prompt's KV read once by one matmul per prompt) while :func:`suffix_in_decoder` (short responses, at most
    :data:`EXPLICIT_MAX_KEYS` keys a row), and otherwise through the model's own forward, against
    the prompt's KV gathered to every row."""
    device = next(model.parameters()).device
    prompts, slot = torch.unique(batch.prompt_index[rows], return_inverse=True)  # [p] distinct prompts, [b] row -> prompt
    ids, mask = left_pad([batch.prompt_ids[i] for i in prompts.tolist()], batch.pad_id)  # [p, S]
    ids, mask, slot = ids.to(device), mask.to(device), slot.to(device)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)  # [p, S]
    first = model(input_ids=ids, attention_mask=mask, position_ids=pos, past_key_values=cache, use_cache=True,
                  logits_to_keep=1).logits[:, 0]  # [p, V]: each prompt's prediction of response token 0
    first = _log_softmax(first, temperature)  # [p, V], shared by the prompt's rows (indexed, never copied to them)
    first_entropy = _entropy(first, entropy_grad) if with_entropy else None  # [p]
    decoder = PrefixDecoder(model) if suffix_in_decoder(model, batch) else None
    if decoder is not None:  # the decoder's inputs: per layer [p, H_kv, S, d] float32 KV, and [p, S] padding bias
        prefix, bias = [(layer.keys.float(), layer.values.float()) for layer in cache.layers], padding_bias(mask)
    lengths, T = batch.lengths[rows], batch.response_ids.shape[1]  # [b]
    suffix = (lengths - 1).clamp(min=0)  # [b] response tokens that need the suffix pass
    bucket = torch.where(suffix > 0, 1 + torch.ceil(torch.log2(suffix.clamp(min=1).double())).long(), 0)
    order, parts = [], []
    for k in bucket.unique().tolist():
        idx = (bucket == k).nonzero().squeeze(1)  # [c] positions (in `rows`) of this bucket
        W = max(int(lengths[idx].max()), 1)
        targets = batch.response_ids[rows[idx], :W].to(device)  # [c, W]
        valid = (torch.arange(W)[None, :] < lengths[idx][:, None]).to(device)  # [c, W]
        s = slot[idx.to(device)]
        logp = first[s, targets[:, 0]][:, None]  # [c, 1]
        ent = None if first_entropy is None else first_entropy[s][:, None]
        if W > 1:  # grads flow back into the prefix pass through `prefix` / the cache's layers
            inputs = targets[:, : W - 1]  # [c, W-1]: y_<t for t = 1 .. W-1
            positions = pos[s, -1:] + 1 + torch.arange(W - 1, device=device)[None]  # [c, W-1]
            if decoder is not None:
                rest = decoder.logits(inputs, positions, prefix, bias, PrefixGrid.of(s, len(prompts)))
            else:
                kv = _cache_of(model, [(_take_rows(layer.keys, s), _take_rows(layer.values, s))  # [c, H_kv, S, d]
                                       for layer in cache.layers])
                rest = model(input_ids=inputs, attention_mask=torch.cat([mask[s], valid[:, : W - 1]], 1),
                             position_ids=positions, past_key_values=kv, use_cache=True).logits
            lp, en = _token_stats(_log_softmax(rest, temperature), targets[:, 1:], valid[:, 1:],
                                  with_entropy=with_entropy, entropy_grad=entropy_grad)  # [c, W-1]
            logp = torch.cat([logp, lp], dim=1)  # [c, W]
            ent = None if en is None else torch.cat([ent, en], dim=1)
        order.append(idx)
        parts.append((_pad_to(logp.masked_fill(~valid, 0.0), T),
                      None if ent is None else _pad_to(ent.masked_fill(~valid, 0.0), T)))
    back = torch.argsort(torch.cat(order)).to(device)  # bucket order -> the order of `rows`
    logp = torch.cat([lp for lp, _ in parts])[back]
    entropy = torch.cat([ent for _, ent in parts])[back] if with_entropy else None
    return logp, entropy


def _take_rows(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``x[index]`` along dim 0, possibly as an expanded view (its users only read it, and concatenate it with the
    suffix's own KV, which copies it once anyway). Runs of equal indices (the usual micro-batch holds one or a few
    prompts) become expanded views, whose backward is a sum; an index's backward is a scatter_add, which the
    profile at N=512 showed as ~14% of the update."""
    ids, counts = torch.unique_consecutive(index, return_counts=True)
    if len(ids) > 16:
        return x.index_select(0, index)
    runs = [x[j: j + 1].expand(c, *x.shape[1:]) for j, c in zip(ids.tolist(), counts.tolist())]
    return runs[0] if len(runs) == 1 else torch.cat(runs)


def _cache_of(model, layers: list) -> "DynamicCache":
    """A DynamicCache holding ``layers`` = [(keys, values)] as they are (``update`` would copy them once more)."""
    cache = DynamicCache(config=model.config)
    for layer, (k, v) in zip(cache.layers, layers):
        layer.lazy_initialization(k, v)
        layer.keys, layer.values = k, v
    return cache


def _plain_kv_cache(model):
    """An empty transformers ``DynamicCache`` for ``model`` if every layer is full attention (its rows can be
    re-indexed freely), else None (sliding-window or hybrid caches, non-transformers modules)."""
    try:
        cache = DynamicCache(config=model.config)
    except Exception:  # no transformers config: the packed layout still works
        return None
    return cache if cache.layers and all(type(layer) is DynamicLayer for layer in cache.layers) else None


@torch.no_grad()
def compute_logprobs(model: torch.nn.Module, batch: RolloutBatch, *, temperature: float, micro_batch_tokens: int,
                     with_entropy: bool = False, layout: str = "auto", fused: bool = False):
    """Log-probs [P*N, T] (and entropies [P*N, T] when ``with_entropy``) of every row, on CPU, without grad,
    one forward per micro-batch of at most ``micro_batch_tokens`` tokens (:func:`plan_micro_batches`)."""
    T = batch.response_ids.shape[1]
    logp = torch.zeros((batch.size, T), dtype=torch.float32)
    entropy = torch.zeros((batch.size, T), dtype=torch.float32) if with_entropy else None
    for rows in plan_micro_batches(model, batch, torch.arange(batch.size), micro_batch_tokens, layout):
        lp, ent = token_logprobs(model, batch, rows, temperature=temperature, with_entropy=with_entropy,
                                 layout=layout, fused=fused)
        logp[rows] = lp.cpu()
        if with_entropy:
            entropy[rows] = ent.cpu()
    return (logp, entropy) if with_entropy else logp


# ---- helpers -------------------------------------------------------------------------------------------------------
def _as_rows(batch: RolloutBatch, rows) -> torch.Tensor:
    rows = torch.as_tensor(rows, dtype=torch.long).reshape(-1)
    if len(rows) == 0:
        raise ValueError("rows: got no rows; allowed: a non-empty list of sample indices")
    if int(rows.min()) < 0 or int(rows.max()) >= batch.size:
        raise ValueError(f"rows: indices must be in [0, {batch.size}); got min {int(rows.min())}, "
                         f"max {int(rows.max())}")
    return rows


def _check_temperature(temperature) -> None:
    if not is_number(temperature) or not temperature > 0 \
            or temperature == float("inf"):
        raise ValueError(f"temperature: got {temperature!r}; allowed: a finite float > 0")


def _pad_to(x: torch.Tensor, T: int) -> torch.Tensor:
    return torch.nn.functional.pad(x, (0, T - x.shape[1]))


__all__ = ["micro_batches", "plan_micro_batches", "row_token_counts", "Packed", "pack", "token_logprobs",
           "compute_logprobs", "EXPLICIT_MAX_KEYS", "DECODER_MAX_RESPONSE",
           "suffix_in_decoder", "fusable_modules", "fused_elementwise"]
