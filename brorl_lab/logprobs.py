"""The trainer's recomputation of response-token log-probabilities (and entropies) for a RolloutBatch.

For row b (prompt x_p, response y with length |y|) and response position t:

    logp[b, t]    = log softmax(z_t / tau)[y_t] = z_t[y_t] / tau - logsumexp(z_t / tau)
    entropy[b, t] = H(softmax(z_t / tau)) = logsumexp(z_t / tau) - sum_v softmax(z_t / tau)_v * z_t[v] / tau

with z_t = f(x_p, y_<t) the model's logits; both are 0 on padding (t >= |y|). The engines return the same
``logp`` for the tokens they sampled, so ``exp(logp_trainer - logp_engine)`` is 1 when the weights agree.

Rows are packed so that every row's response starts at the same column S (prompts left-padded to S, responses
right-padded), hence the logits needed are the last T+1 columns for all rows: the model's ``logits_to_keep``
projects only those through the LM head, and the [b, L, V] log-softmax over prompt positions is never built.
Memory per forward is set by the micro-batch token budget (:func:`micro_batches`), not by P*N.

    logp = compute_logprobs(policy, batch, temperature=1.0, micro_batch_tokens=8192)       # [P*N, T], no grad
    for mb in micro_batches(token_counts, 8192):
        logp, ent = token_logprobs(policy, batch, mb, temperature=1.0, with_entropy=True)  # [b, T], grads flow
"""

from __future__ import annotations

from typing import NamedTuple, Optional, Sequence

import torch

from .batch import RolloutBatch


def micro_batches(token_counts: torch.Tensor, token_budget: int) -> list[torch.Tensor]:
    """Split rows ``0..B-1`` in order into consecutive groups whose token counts sum to at most ``token_budget``
    (a single row above the budget forms its own group). Returns a list of index tensors (long)."""
    if isinstance(token_budget, bool) or not isinstance(token_budget, int) or token_budget < 1:
        raise ValueError(f"token_budget: got {token_budget!r}; allowed: an integer >= 1")
    counts = torch.as_tensor(token_counts)
    if counts.ndim != 1:
        raise ValueError(f"token_counts: got shape {tuple(counts.shape)}; allowed: a 1-D tensor [B] of token counts")
    groups, start, total = [], 0, 0
    for i, c in enumerate(counts.tolist()):
        if i > start and total + c > token_budget:
            groups.append(torch.arange(start, i))
            start, total = i, 0
        total += c
    if len(counts):
        groups.append(torch.arange(start, len(counts)))
    return groups


def row_token_counts(batch: RolloutBatch) -> torch.Tensor:
    """[P*N] prompt + response tokens of each row (what a micro-batch budget counts)."""
    prompt_lens = torch.tensor([len(x) for x in batch.prompt_ids], dtype=torch.long)  # [P]
    return prompt_lens.repeat_interleave(batch.n) + batch.lengths


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
    prompt_of = (rows // batch.n).tolist()
    prompts = [batch.prompt_ids[p] for p in prompt_of]
    lengths = batch.lengths[rows]  # [b]
    S = max(len(x) for x in prompts)
    W = max(int(lengths.max()), 1)
    b = len(rows)
    ids = torch.full((b, S + W), batch.pad_id, dtype=torch.long)
    mask = torch.zeros((b, S + W), dtype=torch.long)
    for i, x in enumerate(prompts):  # Python over rows only for the ragged prompts; responses are one copy
        ids[i, S - len(x): S] = torch.as_tensor(x, dtype=torch.long)
        mask[i, S - len(x): S] = 1
    ids[:, S:] = batch.response_ids[rows, :W]
    mask[:, S:] = (torch.arange(W)[None, :] < lengths[:, None]).long()
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    return Packed(ids, mask, positions, S, W)


def token_logprobs(model: torch.nn.Module, batch: RolloutBatch, rows: Sequence[int] | torch.Tensor, *,
                   temperature: float, with_entropy: bool = False) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """``(logp [b, T], entropy [b, T] | None)`` for ``rows`` of ``batch`` (T = batch.response_ids.shape[1]),
    float32 on the model's device, 0 on padding. Differentiable: gradients flow when called outside ``no_grad``.
    """
    _check_temperature(temperature)
    rows = _as_rows(batch, rows)
    packed = pack(batch, rows)
    device = next(model.parameters()).device
    S, W = packed.start, packed.width
    out = model(input_ids=packed.input_ids.to(device), attention_mask=packed.attention_mask.to(device),
                position_ids=packed.position_ids.to(device), use_cache=False, logits_to_keep=W + 1)
    z = out.logits[:, :W].float() / temperature  # [b, W, V]: column S-1+t predicts response token t
    targets = packed.input_ids[:, S:].to(device)  # [b, W]
    lse = torch.logsumexp(z, dim=-1)  # [b, W]
    logp = z.gather(-1, targets[..., None]).squeeze(-1) - lse  # [b, W]
    valid = packed.attention_mask[:, S:].to(device).bool()  # [b, W]
    T = batch.response_ids.shape[1]
    logp = _pad_to(logp.masked_fill(~valid, 0.0), T)
    entropy = None
    if with_entropy:
        ent = lse - (torch.softmax(z, dim=-1) * z).sum(-1)  # [b, W]
        entropy = _pad_to(ent.masked_fill(~valid, 0.0), T)
    return logp, entropy


@torch.no_grad()
def compute_logprobs(model: torch.nn.Module, batch: RolloutBatch, *, temperature: float, micro_batch_tokens: int,
                     with_entropy: bool = False):
    """Log-probs [P*N, T] (and entropies [P*N, T] when ``with_entropy``) of every row, on CPU, without grad,
    one forward per micro-batch of at most ``micro_batch_tokens`` prompt+response tokens."""
    T = batch.response_ids.shape[1]
    logp = torch.zeros((batch.size, T), dtype=torch.float32)
    entropy = torch.zeros((batch.size, T), dtype=torch.float32) if with_entropy else None
    for rows in micro_batches(row_token_counts(batch), micro_batch_tokens):
        lp, ent = token_logprobs(model, batch, rows, temperature=temperature, with_entropy=with_entropy)
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
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not temperature > 0 \
            or temperature == float("inf"):
        raise ValueError(f"temperature: got {temperature!r}; allowed: a finite float > 0")


def _pad_to(x: torch.Tensor, T: int) -> torch.Tensor:
    return torch.nn.functional.pad(x, (0, T - x.shape[1]))


__all__ = ["micro_batches", "row_token_counts", "Packed", "pack", "token_logprobs", "compute_logprobs"]
