"""Advantage estimators, loss aggregation, policy losses, KL estimators, entropy and pass@k as pure functions.

Pure torch (and numpy for pass@k): nothing here knows of engines, tasks or widgets. Every function takes explicit
tensors and returns values; bad input raises one ``ValueError`` naming the argument, its value and what is allowed.
Names are string-keyed (:class:`brorl_lab.core.registry.Registry`) so a sweep varies strings, not code, and
:func:`brorl_lab.rl.spec.check` validates a Config's ``advantage``, ``policy_loss``, ``loss_agg``, ``kl_estimator``
and ``is_correction`` against them.

Shapes: ``P`` prompts (groups), ``N`` rollouts per prompt, ``b`` sequences in a (micro-)batch, ``T`` response
tokens, ``V`` vocabulary. Layout is prompt-major (sample ``b = p * N + s``), as in
:class:`brorl_lab.core.batch.RolloutBatch`.

The update loop that calls these pieces lives in one place, :func:`brorl_lab.rl.steps.update` (read it top to
bottom: log-probs once, then per mini-batch of whole groups and per micro-batch the loss
``POLICY_LOSSES[policy_loss] + kl_beta * aggregate(kl_penalty(...)) - entropy_coef * aggregate(H)`` with the
mini-batch's :func:`loss_normalisers`, backward, clip, step). This module holds no copy of it.

With ``kl_placement='reward'`` the KL term is not in the loss: ``steps.kl_in_reward`` lowers each sample's reward by
``kl_beta * kl_reward_penalty(...)`` before the advantages are computed.

What each KL estimator does *as a loss* (samples drawn from pi, gradient taken through log pi only, which is how
every trainer uses them): the expected gradient E_pi[grad k] is 0 for k1 (it regularises nothing), grad
KL(pi || pi_ref) for k2, and grad KL(pi_ref || pi) for k3, although all three estimate KL(pi || pi_ref) by value.
:func:`kl_loss_gradients` computes these exactly on a categorical (notebook 03 shows them).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import Optional

import numpy as np
import torch

from brorl_lab.core.validation import is_int, is_number

# the registries are declared (names only, no torch) in rl.names; the implementations below register into them
from brorl_lab.rl.names import ADVANTAGES, IS_CORRECTIONS, KL_ESTIMATORS, LOSS_AGGREGATIONS, POLICY_LOSSES

#: ProRL v2 clamps the log-ratio of its k2 estimator to [-10, 10].
K2_LOG_RATIO_CLAMP = 10.0
#: A safety net for k3's exp (verl's low_var_kl clamps at 20); inactive for any sane pair of policies.
K3_LOG_RATIO_CLAMP = 20.0
#: Default epsilon of the std normalisations (verl's and TRL's value).
ADV_EPS = 1e-6


# ---- validation helpers -----------------------------------------------------------------------------------------
def _bad(func: str, arg: str, got: str, allowed: str) -> ValueError:
    return ValueError(f"{func}: argument '{arg}' got {got}; allowed: {allowed}")


def _check_tensor(func: str, arg: str, x, *, dims: str, shape: Optional[tuple] = None, kind: str = "float",
                  finite: bool = False) -> None:
    """``x`` must be a tensor with ``len(dims)`` dimensions (and ``shape`` if given) of the given kind."""
    ndim = dims.count(",") + 1
    if not isinstance(x, torch.Tensor):
        raise _bad(func, arg, f"a {type(x).__name__}", f"a torch.Tensor of shape {dims}")
    if x.ndim != ndim or (shape is not None and tuple(x.shape) != tuple(shape)):
        want = f"{dims} = {tuple(shape)}" if shape is not None else dims
        raise _bad(func, arg, f"shape {tuple(x.shape)}", f"a tensor of shape {want}")
    if kind == "bool" and x.dtype != torch.bool:
        raise _bad(func, arg, f"dtype {x.dtype}", "a torch.bool tensor (True on real response tokens)")
    if kind == "float" and not x.is_floating_point():
        raise _bad(func, arg, f"dtype {x.dtype}", "a floating-point tensor")
    if finite and not bool(torch.isfinite(x).all()):
        raise _bad(func, arg, f"non-finite values (e.g. {x[~torch.isfinite(x)][0].item()})", "finite values only")


def _check_number(func: str, arg: str, x, ok: Callable[[float], bool], allowed: str) -> float:
    if isinstance(x, torch.Tensor) and x.numel() == 1:
        x = x.item()
    if not is_number(x) or not math.isfinite(x) or not ok(x):
        raise _bad(func, arg, repr(x), allowed)
    return float(x)


def _check_int(func: str, arg: str, x, lo: int, allowed: str) -> int:
    if not is_int(x) or x < lo:
        raise _bad(func, arg, repr(x), allowed)
    return int(x)


# ---- advantage estimators: rewards [P, N] -> advantages [P, N] ----------------------------------------------------
def _advantage(name: str, needs_group: bool = True, batch_whitened: bool = False):
    """Register an estimator ``fn(rewards [P, N], *, std_norm, eps) -> [P, N]`` behind input checks.

    All estimators share the signature, so a caller passes the same options to any of them; each ignores what it
    does not use (only ``grpo`` reads ``std_norm``). ``needs_group`` (read by config) says N >= 2 is required.
    ``batch_whitened``: the estimator is the group-centred reward whitened over the whole batch (REINFORCE++-baseline),
    so groups of unequal size cannot be computed one size at a time (:func:`ragged_advantages`).
    """

    def register(fn):
        @functools.wraps(fn)
        def checked(rewards: torch.Tensor, *, std_norm: bool = True, eps: float = ADV_EPS) -> torch.Tensor:
            _check_tensor(name, "rewards", rewards, dims="[P, N]", finite=True)
            if rewards.numel() == 0:
                raise _bad(name, "rewards", f"shape {tuple(rewards.shape)}", "at least one group")
            if needs_group and rewards.shape[1] < 2:
                raise _bad(name, "rewards", f"shape {tuple(rewards.shape)} (N = {rewards.shape[1]})",
                           f"groups of N >= 2 rollouts: '{name}' compares samples within a group")
            if not isinstance(std_norm, bool):
                raise _bad(name, "std_norm", repr(std_norm), "True or False")
            eps = _check_number(name, "eps", eps, lambda e: e > 0, "a finite float > 0")
            return fn(rewards.detach(), std_norm=std_norm, eps=eps)

        checked.needs_group = needs_group
        checked.batch_whitened = batch_whitened
        ADVANTAGES.register(name, checked)
        return checked

    return register


def _group_centered(rewards: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """r - mean_g(r) and which groups are uniform; uniform groups are exactly 0 (a float mean may miss by an ulp)."""
    mean = rewards.mean(dim=1, keepdim=True)  # [P, 1]
    uniform = rewards.amax(dim=1, keepdim=True) == rewards.amin(dim=1, keepdim=True)  # [P, 1]
    return torch.where(uniform, 0.0, rewards - mean), uniform  # [P, N], [P, 1]


@_advantage("grpo")
def grpo(rewards: torch.Tensor, *, std_norm: bool = True, eps: float = ADV_EPS) -> torch.Tensor:
    """GRPO (DeepSeekMath; ProRL v1): the group-normalised reward.

        A_{p,s} = (r_{p,s} - mean_s r_{p,.}) / (std_s r_{p,.} + eps)     if std_norm
        A_{p,s} =  r_{p,s} - mean_s r_{p,.}                              otherwise (= dr_grpo)

    The std is the *unbiased* (Bessel-corrected, divide by N-1) sample std, as verl (which trained ProRL and BroRL)
    and TRL compute it with ``torch.std``; it is defined because groups have N >= 2. A uniform group (all rewards
    equal) has advantage exactly 0, never NaN.
    """
    centered, _ = _group_centered(rewards)  # [P, N]
    if not std_norm:
        return centered
    std = rewards.std(dim=1, correction=1, keepdim=True)  # [P, 1]
    return centered / (std + eps)  # [P, N]


@_advantage("dr_grpo")
def dr_grpo(rewards: torch.Tensor, *, std_norm: bool = True, eps: float = ADV_EPS) -> torch.Tensor:
    """Dr.GRPO (Liu et al. 2025): A = r - mean_g(r), with no std division whatever ``std_norm`` says.

    Dividing by the group std up-weights groups that are nearly uniform (too easy or too hard); Dr.GRPO drops it,
    and pairs this estimator with ``loss_agg='seq_mean_token_sum_norm'`` (no per-sequence length normalisation).
    """
    return _group_centered(rewards)[0]  # [P, N]


@_advantage("rloo")
def rloo(rewards: torch.Tensor, *, std_norm: bool = True, eps: float = ADV_EPS) -> torch.Tensor:
    """RLOO (Ahmadian et al. 2024): the leave-one-out baseline, an unbiased baseline independent of the sample.

        A_i = r_i - (1/(N-1)) sum_{j != i} r_j = N/(N-1) * (r_i - mean_g(r))

    The code uses the right-hand form (one mean per group). ``std_norm`` and ``eps`` are ignored.
    """
    n = rewards.shape[1]
    return _group_centered(rewards)[0] * (n / (n - 1))  # [P, N]


@_advantage("reinforce_pp_baseline", batch_whitened=True)
def reinforce_pp_baseline(rewards: torch.Tensor, *, std_norm: bool = True, eps: float = ADV_EPS) -> torch.Tensor:
    """REINFORCE++-baseline (Hu et al. 2025; ProRL v2, BroRL): group mean baseline, then whole-batch whitening.

        c_{p,s} = r_{p,s} - mean_s r_{p,.}                       # [P, N] group baseline
        A_{p,s} = (c_{p,s} - mean(c)) / (std(c) + eps)           # mean and std over all P*N samples

    so the batch, not each group, sets the scale: a nearly uniform group keeps small advantages instead of being
    blown up by its own tiny std. The std is the unbiased one over the P*N sequences (one value per sequence; verl
    whitens the same values over *tokens*, which weighs long responses more). Pass the rewards of the whole step
    (after dynamic sampling), not of one mini-batch. Uniform groups get exactly 0. ``std_norm`` is ignored.
    """
    centered, uniform = _group_centered(rewards)  # [P, N], [P, 1]
    if centered.numel() < 2:
        return centered
    whitened = (centered - centered.mean()) / (centered.std(correction=1) + eps)  # [P, N]
    return torch.where(uniform, 0.0, whitened)


def compute_advantages(name: str, rewards, n, *, std_norm: bool = True, eps: float = ADV_EPS) -> torch.Tensor:
    """Per-sample advantages [P*N] from per-sample rewards [P*N] (prompt-major) with the estimator ``name``.

        A = ADVANTAGES[name](rewards.view(P, N)).view(P*N)

    ``name`` is one of :data:`ADVANTAGES` ('grpo', 'dr_grpo', 'rloo', 'reinforce_pp_baseline'); ``std_norm`` is
    config's ``adv_std_norm`` (read by 'grpo' only). Rewards may be any real dtype (bool and int become float32);
    they must be finite, non-empty and a whole number of groups of ``n``. The result is detached.

    ``n`` may instead be the group sizes [P] (a list or tensor, groups of unequal size, prompt-major rows
    ``sum_p N_p``): see :func:`ragged_advantages`.
    """
    fn = ADVANTAGES.get(name)
    if not isinstance(n, (int, np.integer)) and hasattr(n, "__len__"):
        return ragged_advantages(name, rewards, n, std_norm=std_norm, eps=eps)
    n = _check_int("compute_advantages", "n", n, 1, "an integer >= 1 (rollouts per prompt)")
    if fn.needs_group and n < 2:
        raise _bad("compute_advantages", "n", repr(n), f"an integer >= 2 for the group estimator '{name}'")
    if not isinstance(rewards, torch.Tensor):
        rewards = torch.as_tensor(rewards)
    if not rewards.is_floating_point():
        rewards = rewards.to(torch.float32)
    _check_tensor("compute_advantages", "rewards", rewards, dims="[P*N]", finite=True)
    if rewards.numel() == 0 or rewards.numel() % n:
        raise _bad("compute_advantages", "rewards", f"length {rewards.numel()}",
                   f"a positive multiple of n={n} (P prompts x N rollouts, prompt-major)")
    return fn(rewards.view(-1, n), std_norm=std_norm, eps=eps).reshape(-1)  # [P, N] -> [P*N]


def ragged_advantages(name: str, rewards, sizes, *, std_norm: bool = True, eps: float = ADV_EPS) -> torch.Tensor:
    """Advantages [sum_p N_p] for groups of unequal size N_p (rows prompt-major: prompt p's rows are
    ``o_p .. o_p + N_p - 1``, ``o = [0, cumsum(N)]``), each group by its own N_p:

        grpo:     A_{p,s} = (r_{p,s} - mean_p) / (std_p + eps)    std_p with Bessel's N_p - 1
        dr_grpo:  A_{p,s} =  r_{p,s} - mean_p
        rloo:     A_{p,s} = N_p/(N_p-1) (r_{p,s} - mean_p)       (leave-one-out over the group's own N_p - 1)
        reinforce_pp_baseline: c_{p,s} = r_{p,s} - mean_p, then (c - mean(c)) / (std(c) + eps) over all sum_p N_p

    A group of one sample (N_p = 1) is uniform: its baseline is its own reward, so its advantage is 0 under every
    estimator (the leave-one-out baseline of RLOO is undefined there; 0 is its limit of no signal). Groups of the
    same size are computed together by the registered estimator on their [g, N_p] view, so a batch whose groups
    are all one size gives exactly :func:`compute_advantages`'s numbers; the batch-whitened estimator whitens the
    group-centred values of all groups at once, as its definition says.
    """
    fn = ADVANTAGES.get(name)
    sizes = torch.as_tensor(sizes, dtype=torch.long).reshape(-1)  # [P]
    if sizes.numel() == 0 or int(sizes.min()) < 1:
        raise _bad("compute_advantages", "n", f"group sizes {sizes.tolist()[:8]}",
                   "one integer >= 1 per group (rollouts of each prompt)")
    if not isinstance(rewards, torch.Tensor):
        rewards = torch.as_tensor(rewards)
    if not rewards.is_floating_point():
        rewards = rewards.to(torch.float32)
    _check_tensor("compute_advantages", "rewards", rewards, dims="[B]", finite=True)
    if rewards.numel() != int(sizes.sum()):
        raise _bad("compute_advantages", "rewards", f"length {rewards.numel()}",
                   f"sum of the group sizes = {int(sizes.sum())} (prompt-major rows)")
    rewards = rewards.detach()
    group = torch.arange(sizes.numel()).repeat_interleave(sizes)  # [B] prompt of each row
    starts = torch.cat([torch.zeros(1, dtype=torch.long), sizes.cumsum(0)[:-1]])  # [P]
    out = torch.zeros_like(rewards)  # [B]; groups of one stay 0
    inner = "dr_grpo" if fn.batch_whitened else name  # the per-group part; whitening follows over the batch
    for k in sorted(set(sizes.tolist()) - {1}):
        ps = torch.nonzero(sizes == k).flatten()  # [g] groups of size k
        rows = (starts[ps][:, None] + torch.arange(k)[None, :]).reshape(-1)  # [g*k]
        out[rows] = ADVANTAGES.get(inner)(rewards[rows].view(-1, k), std_norm=std_norm, eps=eps).reshape(-1)
    if fn.batch_whitened and out.numel() >= 2:
        lo = torch.full((sizes.numel(),), float("inf")).scatter_reduce(0, group, rewards, "amin")  # [P]
        hi = torch.full((sizes.numel(),), float("-inf")).scatter_reduce(0, group, rewards, "amax")  # [P]
        uniform = (lo == hi)[group]  # [B]
        out = torch.where(uniform, 0.0, (out - out.mean()) / (out.std(correction=1) + eps))
    return out


# ---- loss aggregation: values [b, T] -> scalar ---------------------------------------------------------------------
def loss_normalisers(masks: Sequence[torch.Tensor], *, max_response_len: Optional[int] = None) -> dict:
    """The global normalisers of a mini-batch split into micro-batches (their masks [b_i, T_i], any T_i).

        num_tokens = sum_i |mask_i|                      (response tokens)
        num_seqs   = number of rows with >= 1 token      (sequences)
        max_response_len = the given constant, else max_i T_i

    Pass them to :func:`aggregate` (and the policy losses) for every micro-batch, and the micro-batch results sum
    to the mini-batch aggregate. For Dr.GRPO pass ``max_response_len=cfg.max_new_tokens`` so the divisor is one
    constant through training (its paper's intent), not the longest response of the moment. Each count is at
    least 1, so an all-padding batch aggregates to 0, not NaN.
    """
    if isinstance(masks, torch.Tensor):
        masks = [masks]
    for i, m in enumerate(masks):
        _check_tensor("loss_normalisers", f"masks[{i}]", m, dims="[b, T]", kind="bool")
    if max_response_len is None:
        max_response_len = max([m.shape[1] for m in masks], default=1)
    max_response_len = _check_int("loss_normalisers", "max_response_len", max_response_len, 1, "an integer >= 1")
    return {"num_tokens": max(1, sum(int(m.sum()) for m in masks)),
            "num_seqs": max(1, sum(int(m.any(dim=1).sum()) for m in masks)),
            "max_response_len": max_response_len}


@LOSS_AGGREGATIONS.register("token_mean")
def _token_mean(masked: torch.Tensor, lengths: torch.Tensor, norms: dict) -> torch.Tensor:
    return masked.sum() / norms["num_tokens"]  # sum_{s,t} m v / num_tokens


@LOSS_AGGREGATIONS.register("seq_mean_token_mean")
def _seq_mean_token_mean(masked: torch.Tensor, lengths: torch.Tensor, norms: dict) -> torch.Tensor:
    per_seq = masked.sum(dim=1) / lengths.clamp(min=1)  # [b] mean over each sequence's own tokens
    return per_seq.sum() / norms["num_seqs"]


@LOSS_AGGREGATIONS.register("seq_mean_token_sum_norm")
def _seq_mean_token_sum_norm(masked: torch.Tensor, lengths: torch.Tensor, norms: dict) -> torch.Tensor:
    return masked.sum() / (norms["max_response_len"] * norms["num_seqs"])


def aggregate(values: torch.Tensor, mask: torch.Tensor, mode: str, *, num_tokens=None, num_seqs=None,
              max_response_len=None) -> torch.Tensor:
    """Reduce per-token values [b, T] (masked) to a scalar, micro-batch friendly.

        token_mean:              sum_{s,t} m_st v_st / num_tokens                          (DAPO, verl default)
        seq_mean_token_mean:     sum_s (sum_t m_st v_st / |m_s|) / num_seqs                (original GRPO)
        seq_mean_token_sum_norm: sum_{s,t} m_st v_st / (max_response_len * num_seqs)       (Dr.GRPO)

    ``token_mean`` weighs every token equally (a long response counts more); ``seq_mean_token_mean`` weighs every
    sequence equally (a token of a short response counts more); ``seq_mean_token_sum_norm`` is ``token_mean``'s
    per-token weighting with a constant divisor. The normalisers default to this batch's own counts (see
    :func:`loss_normalisers`); pass the whole mini-batch's to make the micro-batch results sum to the mini-batch
    aggregate. Masked-out positions never contribute, even if they hold inf or NaN.
    """
    fn = LOSS_AGGREGATIONS.get(mode)
    _check_tensor("aggregate", "values", values, dims="[b, T]")
    _check_tensor("aggregate", "mask", mask, dims="[b, T]", shape=tuple(values.shape), kind="bool")
    norms = loss_normalisers([mask])
    for arg, given in (("num_tokens", num_tokens), ("num_seqs", num_seqs), ("max_response_len", max_response_len)):
        if given is not None:
            norms[arg] = _check_number("aggregate", arg, given, lambda v: v > 0, "None or a finite number > 0")
    masked = torch.where(mask, values, torch.zeros((), dtype=values.dtype, device=values.device))  # [b, T]
    return fn(masked, mask.sum(dim=1), norms)


# ---- policy losses: (logp, old_logp, advantages, mask) -> (loss, metrics) ---------------------------------------
#: Derived means in a metrics dict: ``mean key -> the sum key`` it divides by ``tokens``. Every other key is a sum.
METRIC_MEANS = {"clipfrac_low": "clip_low_tokens", "clipfrac_high": "clip_high_tokens", "ratio_mean": "ratio_sum",
                "approx_kl": "approx_kl_sum", "is_weight_mean": "is_weight_sum",
                "is_masked_frac": "is_masked_tokens"}


def _with_means(sums: dict) -> dict:
    out = dict(sums)
    tokens = sums.get("tokens", 0.0)
    for mean_key, sum_key in METRIC_MEANS.items():
        if sum_key in sums:
            out[mean_key] = sums[sum_key] / tokens if tokens else 0.0
    return out


def merge_metrics(parts: Sequence[dict]) -> dict:
    """Combine the metrics of micro-batches: every sum (and count) adds up, the means are recomputed from them.

        clipfrac_low = sum_i clip_low_tokens_i / sum_i tokens_i      (and likewise for every key in METRIC_MEANS)

    ``loss`` adds up to the mini-batch loss when the micro-batches were given the global normalisers.
    """
    total: dict = {}
    for part in parts:
        for key, value in part.items():
            if key not in METRIC_MEANS:
                total[key] = total.get(key, 0.0) + float(value)
    return _with_means(total)


def _loss_metrics(loss: torch.Tensor, mask: torch.Tensor, log_ratio: Optional[torch.Tensor],
                  is_weights: Optional[torch.Tensor], clip_low: Optional[torch.Tensor] = None,
                  clip_high: Optional[torch.Tensor] = None) -> dict:
    """Sums and counts over the real tokens of one micro-batch, plus the means they give (see merge_metrics)."""
    with torch.no_grad():
        count = lambda x: float(x.sum()) if x is not None else 0.0  # noqa: E731
        wide = lambda x: x.to(torch.promote_types(x.dtype, torch.float32))[mask]  # noqa: E731  [tokens], >= fp32
        sums = {"loss": loss.detach().item(), "tokens": count(mask), "clip_low_tokens": count(clip_low),
                "clip_high_tokens": count(clip_high)}
        if log_ratio is not None:
            log_r = wide(log_ratio)  # [tokens] log pi_theta - log pi_old
            sums["ratio_sum"] = float(log_r.exp().sum())
            # k3 estimate of KL(pi_old || pi_theta) from tokens sampled by pi_old: (r - 1) - log r >= 0
            sums["approx_kl_sum"] = float((torch.expm1(log_r) - log_r).sum())
        if is_weights is not None:
            w = wide(is_weights)  # [tokens]
            sums["is_weight_sum"] = float(w.sum())
            sums["is_masked_tokens"] = float((w == 0).sum())  # tokens an ICE-POP mask removed
        return _with_means(sums)


def _check_loss_inputs(func: str, logp, old_logp, advantages, mask, is_weights, loss_agg, *,
                       old_logp_required: bool) -> None:
    _check_tensor(func, "logp", logp, dims="[b, T]")
    shape = tuple(logp.shape)
    if old_logp is not None or old_logp_required:
        _check_tensor(func, "old_logp", old_logp, dims="[b, T]", shape=shape)
    _check_tensor(func, "advantages", advantages, dims="[b]", shape=shape[:1], finite=True)
    _check_tensor(func, "mask", mask, dims="[b, T]", shape=shape, kind="bool")
    if is_weights is not None:
        _check_tensor(func, "is_weights", is_weights, dims="[b, T]", shape=shape)
    if loss_agg not in LOSS_AGGREGATIONS:
        LOSS_AGGREGATIONS.get(loss_agg)  # raises: unknown loss_agg ..., did you mean ..., allowed ...


def _weighted(per_token: torch.Tensor, is_weights: Optional[torch.Tensor]) -> torch.Tensor:
    return per_token if is_weights is None else per_token * is_weights.detach()  # [b, T]


@POLICY_LOSSES.register("ppo_clip")
def ppo_clip(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, *,
             eps_low: float, eps_high: float, loss_agg: str, is_weights: Optional[torch.Tensor] = None,
             num_tokens=None, num_seqs=None, max_response_len=None) -> tuple[torch.Tensor, dict]:
    """PPO-clip with the decoupled range of DAPO's clip-higher (ProRL: eps_low 0.2, eps_high 0.4 / 0.28).

        r_t = exp(log pi_theta(a_t) - log pi_old(a_t))                           # [b, T]
        l_t = -min(r_t A, clip(r_t, 1 - eps_low, 1 + eps_high) A)  (* w_t)       # [b, T], w = is_weights
        L   = aggregate(l, mask, loss_agg, normalisers)

    A token's gradient is cut when its ratio left the trust region in the direction the advantage pushes:
    A < 0 and r < 1 - eps_low (counted in ``clip_low_tokens``) or A > 0 and r > 1 + eps_high (``clip_high_tokens``).
    On-policy (logp == old_logp) r = 1, nothing is clipped and the gradient equals :func:`pg`'s.
    ``old_logp``, ``advantages`` and ``is_weights`` are treated as constants (detached).

    Metrics (floats, micro-batch friendly; see :func:`merge_metrics`): ``loss``, ``tokens``, ``clip_low_tokens``,
    ``clip_high_tokens``, ``ratio_sum``, ``approx_kl_sum`` (the k3 estimator (r - 1) - log r of KL(pi_old || pi_theta),
    unbiased and >= 0 on tokens drawn from pi_old), ``is_weight_sum`` when weights are given, and the means
    ``clipfrac_low``, ``clipfrac_high``, ``ratio_mean``, ``approx_kl`` (, ``is_weight_mean``) over this batch's tokens.
    """
    _check_loss_inputs("ppo_clip", logp, old_logp, advantages, mask, is_weights, loss_agg, old_logp_required=True)
    eps_low = _check_number("ppo_clip", "eps_low", eps_low, lambda e: 0 <= e < 1, "a float in [0, 1)")
    eps_high = _check_number("ppo_clip", "eps_high", eps_high, lambda e: e >= 0, "a finite float >= 0")
    zero = torch.zeros((), dtype=logp.dtype, device=logp.device)
    log_ratio = torch.where(mask, logp - old_logp.detach(), zero)  # [b, T], 0 on padding so exp stays finite
    ratio = log_ratio.exp()  # [b, T]
    adv = advantages.detach().to(logp.dtype)[:, None]  # [b, 1]
    unclipped = -adv * ratio  # [b, T]
    clipped = -adv * ratio.clamp(1 - eps_low, 1 + eps_high)  # [b, T]
    per_token = _weighted(torch.maximum(unclipped, clipped), is_weights)  # [b, T]  -min(rA, clip(r)A)
    loss = aggregate(per_token, mask, loss_agg, num_tokens=num_tokens, num_seqs=num_seqs,
                     max_response_len=max_response_len)
    with torch.no_grad():
        clip_low = mask & (adv < 0) & (ratio < 1 - eps_low)  # [b, T]
        clip_high = mask & (adv > 0) & (ratio > 1 + eps_high)  # [b, T]
    return loss, _loss_metrics(loss, mask, log_ratio, is_weights, clip_low, clip_high)


@POLICY_LOSSES.register("pg")
def pg(logp: torch.Tensor, old_logp: Optional[torch.Tensor], advantages: torch.Tensor, mask: torch.Tensor, *,
       loss_agg: str, eps_low: Optional[float] = None, eps_high: Optional[float] = None,
       is_weights: Optional[torch.Tensor] = None, num_tokens=None, num_seqs=None,
       max_response_len=None) -> tuple[torch.Tensor, dict]:
    """Plain policy gradient (REINFORCE with the given advantages); ratio-free, no clipping.

        l_t = -A log pi_theta(a_t)  (* w_t)          # [b, T]
        L   = aggregate(l, mask, loss_agg, normalisers)

    Its gradient -A grad log pi is PPO-clip's at r = 1, so it is exact on-policy (one optimizer step per rollout
    batch) and biased once the policy has moved. ``eps_low``/``eps_high`` are accepted and ignored so any
    registered loss takes the same arguments. ``old_logp`` (may be None) is only used for the metrics (the same
    keys as :func:`ppo_clip`, clip counts always 0), which then show how far off-policy the update ran.
    """
    _check_loss_inputs("pg", logp, old_logp, advantages, mask, is_weights, loss_agg, old_logp_required=False)
    adv = advantages.detach().to(logp.dtype)[:, None]  # [b, 1]
    per_token = _weighted(-adv * logp, is_weights)  # [b, T]
    loss = aggregate(per_token, mask, loss_agg, num_tokens=num_tokens, num_seqs=num_seqs,
                     max_response_len=max_response_len)
    log_ratio = None if old_logp is None else (logp - old_logp).detach()  # [b, T]
    return loss, _loss_metrics(loss, mask, log_ratio, is_weights)


def _is_ratio(func: str, trainer_logp: torch.Tensor, engine_logp: torch.Tensor) -> torch.Tensor:
    _check_tensor(func, "trainer_logp", trainer_logp, dims="[b, T]")
    _check_tensor(func, "engine_logp", engine_logp, dims="[b, T]", shape=tuple(trainer_logp.shape))
    return torch.exp(trainer_logp.detach() - engine_logp.detach())  # [b, T]


def truncated_is_weights(trainer_logp: torch.Tensor, engine_logp: torch.Tensor, cap: float) -> torch.Tensor:
    """Truncated importance weights [b, T] (TIS) correcting for the engine's sampler differing from the trainer.

        w_t = min(exp(log pi_trainer(a_t) - log pi_engine(a_t)), cap)      (detached)

    The rollout engine (vllm, a KV-cache sampler, other kernels or precision) samples from pi_engine, but the loss
    assumes pi_old = pi_trainer; w_t reweights each token, truncated at ``cap`` (config ``is_cap`` with
    ``is_correction='truncate'``) to bound the variance. Every token keeps a weight > 0. Pass the result as
    ``is_weights`` to a policy loss. Values on padding do not matter.
    """
    cap = _check_number("truncated_is_weights", "cap", cap, lambda c: c > 0, "a finite float > 0 (config is_cap)")
    with torch.no_grad():
        return torch.clamp(_is_ratio("truncated_is_weights", trainer_logp, engine_logp), max=cap)  # [b, T]


def icepop_mask_weights(trainer_logp: torch.Tensor, engine_logp: torch.Tensor, low: float,
                        high: float) -> torch.Tensor:
    """ICE-POP importance weights [b, T]: the ratio inside a band, and 0 (the token masked out) outside it.

        w_t = r_t  if low <= r_t <= high else 0,     r_t = exp(log pi_trainer(a_t) - log pi_engine(a_t))   (detached)

    Unlike :func:`truncated_is_weights`, a token whose engine and trainer probabilities disagree too much gets no
    gradient at all instead of a capped one (ProRL v2's public config: band [0.5, 5], config ``icepop_low`` /
    ``icepop_high`` with ``is_correction='icepop_mask'``). Masked tokens still count in the loss normalisers.
    """
    low = _check_number("icepop_mask_weights", "low", low, lambda v: v > 0, "a finite float > 0 (config icepop_low)")
    high = _check_number("icepop_mask_weights", "high", high, lambda v: v >= low,
                         f"a finite float >= low={low} (config icepop_high)")
    with torch.no_grad():
        r = _is_ratio("icepop_mask_weights", trainer_logp, engine_logp)  # [b, T]
        return torch.where((r >= low) & (r <= high), r, torch.zeros((), dtype=r.dtype, device=r.device))


#: config ``is_correction`` -> what it does; 'none' gives no weights.


def importance_weights(mode: str, trainer_logp: Optional[torch.Tensor], engine_logp: torch.Tensor, *,
                       cap: float = 2.0, low: float = 0.5, high: float = 5.0) -> Optional[torch.Tensor]:
    """The engine-vs-trainer importance weights [b, T] of config ``is_correction``, or None for 'none'.

    'truncate' -> :func:`truncated_is_weights` (``cap``); 'icepop_mask' -> :func:`icepop_mask_weights`
    (``low``, ``high``). ``trainer_logp`` are the trainer's log-probs of the behaviour policy (the old log-probs).
    """
    if mode not in IS_CORRECTIONS:
        raise _bad("importance_weights", "mode", repr(mode), ", ".join(IS_CORRECTIONS))
    if mode == "none":
        return None
    if trainer_logp is None:
        raise _bad("importance_weights", "trainer_logp", "None", f"the trainer's old log-probs for mode {mode!r}")
    if mode == "truncate":
        return truncated_is_weights(trainer_logp, engine_logp, cap)
    return icepop_mask_weights(trainer_logp, engine_logp, low, high)


# ---- KL to the reference: log pi(a_t), log pi_ref(a_t) [b, T] -> per-token estimate [b, T] ----------------------
# Each estimator is a function of d = log pi(a) - log pi_ref(a) on a token a ~ pi. By VALUE all three estimate
# KL(pi || pi_ref) (k1, k3 unbiased; k2 biased). As a LOSS, differentiated through log pi with the samples fixed,
# their expected gradients differ (g = grad log pi(a), E_pi[g] = 0):
#   k1: grad = g                      E_pi = 0                                  regularises nothing
#   k2: grad = d g                    E_pi = sum_a grad pi(a) d(a) = grad KL(pi || pi_ref)
#   k3: grad = (1 - pi_ref/pi) g      E_pi = -sum_a pi_ref(a) g(a) = grad KL(pi_ref || pi)
# kl_loss_gradients checks this exactly on a categorical. In the reward (kl_placement='reward') the estimate is a
# detached reward, and the score-function gradient of E[-beta k1] is -beta grad KL(pi || pi_ref).
@KL_ESTIMATORS.register("k1")
def kl_k1(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """k1 = log pi - log pi_ref: unbiased for KL(pi || pi_ref) on tokens drawn from pi, high variance, negative on
    some tokens. As a loss its expected gradient is E_pi[grad log pi] = 0: it regularises nothing (use it in the
    reward, ``kl_placement='reward'``, where it is the standard choice)."""
    return logp - ref_logp  # [b, T]


@KL_ESTIMATORS.register("k2")
def kl_k2(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """k2 = 0.5 (clamp(log pi - log pi_ref, -10, 10))^2 (ProRL v2): >= 0, low variance, biased as a value (second
    order in the log-ratio). As a loss it is the only one of the three whose expected gradient is the gradient of
    KL(pi || pi_ref) (while the clamp is inactive)."""
    d = (logp - ref_logp).clamp(-K2_LOG_RATIO_CLAMP, K2_LOG_RATIO_CLAMP)  # [b, T]
    return 0.5 * d * d


@KL_ESTIMATORS.register("k3")
def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """k3 = exp(log pi_ref - log pi) - (log pi_ref - log pi) - 1 (Schulman 2020; verl's default 'low_var_kl').

    With rho = pi_ref / pi: k3 = (rho - 1) - log rho >= 0, and E_pi[rho - 1] = 0, so E_pi[k3] = E_pi[-log rho] =
    KL(pi || pi_ref): as a value unbiased, non-negative and low variance. As a loss, though, its expected gradient
    is E_pi[(1 - rho) grad log pi] = grad KL(pi_ref || pi), the reverse KL's (equal to grad KL(pi || pi_ref) only
    to first order near pi = pi_ref). The log-ratio is clamped to +-20 against overflow.
    Computed as expm1(d) - d: exp(d) - d - 1 cancels catastrophically for small d (the usual regime near the
    reference: in float32 it is pure rounding noise below |d| ~ 1e-4, and can come out negative).
    """
    d = (ref_logp - logp).clamp(-K3_LOG_RATIO_CLAMP, K3_LOG_RATIO_CLAMP)  # [b, T]
    return torch.expm1(d) - d


def kl_penalty(logp: torch.Tensor, ref_logp: torch.Tensor, estimator: str) -> torch.Tensor:
    """Per-token estimate [b, T] of KL(pi_theta || pi_ref) on tokens sampled from pi_theta, by name.

    ``estimator`` is one of :data:`KL_ESTIMATORS` ('k1', 'k2', 'k3'); ``ref_logp`` is detached. Aggregate it with
    :func:`aggregate` and add ``kl_beta`` times it to the policy loss (padding positions are then ignored); what
    the result's gradient regularises depends on the estimator (see the note above :func:`kl_k1`).
    """
    fn = KL_ESTIMATORS.get(estimator)
    _check_tensor("kl_penalty", "logp", logp, dims="[b, T]")
    _check_tensor("kl_penalty", "ref_logp", ref_logp, dims="[b, T]", shape=tuple(logp.shape))
    return fn(logp, ref_logp.detach())


def kl_reward_penalty(logp: torch.Tensor, ref_logp: torch.Tensor, mask: torch.Tensor, estimator: str) -> torch.Tensor:
    """Per-sequence KL estimate [b] = sum_t mask_t KL_est_t, detached: what ``kl_placement='reward'`` subtracts
    (times ``kl_beta``) from each sample's reward before the advantages. ``logp`` are the behaviour policy's."""
    _check_tensor("kl_reward_penalty", "mask", mask, dims="[b, T]", shape=tuple(logp.shape), kind="bool")
    with torch.no_grad():
        est = kl_penalty(logp.detach(), ref_logp, estimator)  # [b, T]
        return torch.where(mask, est, torch.zeros((), dtype=est.dtype, device=est.device)).sum(dim=1)  # [b]


def kl_loss_gradients(logits: torch.Tensor, ref_logits: torch.Tensor) -> dict:
    """Exact expected gradients, w.r.t. the logits [V] of pi = softmax(logits), of each KL estimator used as a loss
    on samples from pi, next to the analytic gradients of both KL directions (float64, [V] each):

        'k1', 'k2', 'k3':  E_{a ~ pi}[grad k(a)] = sum_a pi(a) grad k(a)   (pi(a) held fixed: a sampled loss)
        'KL(pi||ref)', 'KL(ref||pi)':  grad of sum_a pi log(pi / ref) and of sum_a ref log(ref / pi)

    Expected: k1 -> 0, k2 -> KL(pi||ref), k3 -> KL(ref||pi) (see the note above :func:`kl_k1`).
    """
    _check_tensor("kl_loss_gradients", "logits", logits, dims="[V]", finite=True)
    _check_tensor("kl_loss_gradients", "ref_logits", ref_logits, dims="[V]", shape=tuple(logits.shape), finite=True)
    ref_logp = torch.log_softmax(ref_logits.detach().double(), 0)  # [V]

    def grad(fn) -> torch.Tensor:
        z = logits.detach().double().clone().requires_grad_(True)
        (g,) = torch.autograd.grad(fn(torch.log_softmax(z, 0)), z)
        return g  # [V]

    out = {name: grad(lambda lp, f=KL_ESTIMATORS[name]: (lp.detach().exp() * f(lp[None], ref_logp[None])[0]).sum())
           for name in KL_ESTIMATORS.names()}
    out["KL(pi||ref)"] = grad(lambda lp: (lp.exp() * (lp - ref_logp)).sum())
    out["KL(ref||pi)"] = grad(lambda lp: (ref_logp.exp() * (ref_logp - lp)).sum())
    return out


# ---- entropy ---------------------------------------------------------------------------------------------------------
def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy [b, T] of softmax(logits [b, T, V]) over the vocabulary.

        H = -sum_v p_v log p_v,   log p = log_softmax(z) = z - logsumexp(z)

    ``log_softmax`` never overflows; logits of -inf (masked tokens) are replaced by the dtype's most negative finite
    value first, so their p log p is 0 * finite = 0 and the gradient stays finite. Computed in the logits' dtype:
    upcast bf16 logits to float32 if precision matters more than memory.
    """
    _check_tensor("entropy_from_logits", "logits", logits, dims="[b, T, V]")
    z = logits.masked_fill(torch.isneginf(logits), torch.finfo(logits.dtype).min)  # [b, T, V]
    logp = torch.log_softmax(z, dim=-1)  # [b, T, V]
    return -(logp.exp() * logp).sum(dim=-1)  # [b, T]


# ---- pass@k ----------------------------------------------------------------------------------------------------------
def pass_at_k_array(n, c, k) -> np.ndarray:
    """Unbiased pass@k over arrays of (n samples, c correct) per prompt (numpy broadcasting; k scalar or array).

        pass@k = 1 - C(n-c, k) / C(n, k) = 1 - prod_{i=n-c+1}^{n} (1 - k/i)          (Chen et al. 2021)

    The product form never forms a binomial coefficient (C(256, 128) overflows float64's exactness); when
    n - c < k every k-subset holds a correct sample and pass@k = 1. Returns float64 of the broadcast shape.
    """
    n, c, k = (np.asarray(x) for x in (n, c, k))
    for arg, x in (("n", n), ("c", c), ("k", k)):
        if x.dtype.kind not in "iu":
            raise _bad("pass_at_k", arg, f"dtype {x.dtype}", "integers")
    n, c, k = np.broadcast_arrays(n, c, k)
    for arg, x, bad, allowed in (("c", c, (c < 0) | (c > n), "integers with 0 <= c <= n (correct among n samples)"),
                                 ("k", k, (k < 1) | (k > n), "integers with 1 <= k <= n")):
        if np.any(bad):
            pairs = ", ".join(f"{arg}={int(v)} (n={int(m)})" for v, m in list(zip(x[bad], n[bad]))[:3])
            raise _bad("pass_at_k", arg, pairs, allowed)
    if n.size == 0:
        return np.zeros(n.shape, dtype=np.float64)
    j = np.arange(int(c.max()))  # [J] the i = n - j for j < c run over n-c+1 .. n
    valid = j < c[..., None]  # [..., J]
    i = np.where(valid, n[..., None] - j, 1).astype(np.float64)  # [..., J]
    factors = np.where(valid, 1.0 - k[..., None] / i, 1.0)  # [..., J]
    return np.where(n - c < k, 1.0, 1.0 - factors.prod(axis=-1))


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one prompt: n samples, c of them correct (see :func:`pass_at_k_array` for the math)."""
    for arg, x in (("n", n), ("c", c), ("k", k)):
        _check_int("pass_at_k", arg, x, 0, "a non-negative integer")
    return float(pass_at_k_array(n, c, k))
