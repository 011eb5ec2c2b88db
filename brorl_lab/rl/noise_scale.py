"""The simple gradient noise scale (McCandlish et al. 2018, "An Empirical Model of Large-Batch Training"): the batch
size beyond which more samples per update stop paying, measured on the policy-gradient loss.

With G the true gradient and Sigma the per-unit gradient covariance, a batch of B independent units has
E|G_B|^2 = |G|^2 + tr(Sigma) / B, so two batch sizes B_small < B_big give unbiased estimates of both pieces
(the paper's appendix A.1)::

    |G|^2     = (B_big E|G_big|^2 - B_small E|G_small|^2) / (B_big - B_small)          (g2)
    tr(Sigma) = (E|G_small|^2 - E|G_big|^2) / (1 / B_small - 1 / B_big)                (trace)
    B_simple  = tr(Sigma) / |G|^2                                                        (b_simple)

Here each *repeat* draws B_big fresh units, splits them into B_big / B_small small batches, and records the mean
|G_small|^2 over those and |G_big|^2 of their union (:func:`two_batch_norms`; the big gradient is the mean of the
small ones, as in data-parallel training). The estimates are ratios of means, so the interval is a **percentile
bootstrap over repeats** (each repeat's pair resampled together, :func:`noise_scale_interval`); when a draw's |G|^2
estimate is <= 0 (noise swamps the signal) its B_simple is +inf, so the upper end may be inf, and the share of such
draws is reported.

The unit. One *unit* is one prompt's group of N rollouts kept by dynamic sampling (an informative group): the
rollouts of a group are not independent (the advantage subtracts the group's mean), prompts are. A unit's gradient
is the gradient of the trainer's policy loss (``cfg.policy_loss``, on-policy so the ratio is 1) averaged over the
group's response tokens (token mean within the group; the batch gradient is the mean over groups, so the per-unit
gradients add exactly; the trainer's token mean over a whole mini-batch weighs groups by their tokens instead). The
KL term is left out: at a branch point the policy is its own reference and that gradient is 0. Advantages are
computed once per repeat over the B_big groups (``cfg.advantage``: REINFORCE++-baseline normalises over the batch;
the scale cancels in the ratio). :func:`noise_scale_units` converts B_simple (in groups) to rollouts (x N) and to
generated samples (x N / q, q the informative-group rate that dynamic sampling kept).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Optional

import numpy as np
import pandas as pd
import torch

from brorl_lab.core.batch import RolloutBatch
from brorl_lab.core.config import Config
from brorl_lab.core.validation import check_int, is_number


# ---- the estimator (pure numbers) ---------------------------------------------------------------------------------
def noise_scale(sq_small: float, sq_big: float, b_small: float, b_big: float) -> dict:
    """|G|^2, tr(Sigma) and B_simple (module docstring) from mean squared gradient norms at two batch sizes. B_simple
    is +inf when the |G|^2 estimate is <= 0. Keys: g2, trace, b_simple."""
    if not (is_number(b_small) and is_number(b_big) and 0 < b_small < b_big):
        raise ValueError(f"b_small, b_big: got {b_small!r}, {b_big!r}; allowed: batch sizes 0 < b_small < b_big")
    g2 = (b_big * sq_big - b_small * sq_small) / (b_big - b_small)
    trace = (sq_small - sq_big) / (1.0 / b_small - 1.0 / b_big)
    return {"g2": float(g2), "trace": float(trace), "b_simple": float(trace / g2) if g2 > 0 else math.inf}


def noise_scale_interval(sq_small: Sequence[float], sq_big: Sequence[float], b_small: float, b_big: float, *,
                         level: float = 0.95, draws: int = 2000, seed: int = 0) -> dict:
    """:func:`noise_scale` of the means over R repeats (``sq_small`` [R]: each repeat's mean |G_small|^2, ``sq_big``
    [R]: its |G_big|^2), with a percentile bootstrap interval over repeats (``draws`` resamples of the R pairs).
    Keys: the point's g2, trace, b_simple; lo, hi (B_simple's interval; hi may be inf), g2_lo, g2_hi, trace_lo,
    trace_hi, nonpositive_g2 (share of draws whose |G|^2 estimate was <= 0), repeats, b_small, b_big, level,
    method."""
    s, b = np.asarray(sq_small, float).ravel(), np.asarray(sq_big, float).ravel()
    if s.shape != b.shape or s.size < 2 or not (np.isfinite(s).all() and np.isfinite(b).all()):
        raise ValueError(f"sq_small, sq_big: got {s.size} and {b.size} values; allowed: one finite pair per repeat, "
                         ">= 2 repeats")
    if not (is_number(level) and 0 < level < 1):
        raise ValueError(f"level: got {level!r}; allowed: a probability in (0, 1)")
    check_int("draws", draws, 1)
    point = noise_scale(float(s.mean()), float(b.mean()), b_small, b_big)
    pick = np.random.default_rng(seed).integers(0, s.size, size=(draws, s.size))  # [draws, R]
    ms, mb = s[pick].mean(1), b[pick].mean(1)  # [draws]
    g2 = (b_big * mb - b_small * ms) / (b_big - b_small)
    trace = (ms - mb) / (1.0 / b_small - 1.0 / b_big)
    with np.errstate(divide="ignore", invalid="ignore"):
        bs = np.where(g2 > 0, trace / np.where(g2 > 0, g2, 1.0), np.inf)  # [draws]
    q = [0.5 - level / 2, 0.5 + level / 2]
    lo, hi = np.quantile(bs, q, method="inverted_cdf")  # no interpolation: inf sorts last and stays inf
    return {**point, "lo": float(lo), "hi": float(hi), "g2_lo": float(np.quantile(g2, q[0])),
            "g2_hi": float(np.quantile(g2, q[1])), "trace_lo": float(np.quantile(trace, q[0])),
            "trace_hi": float(np.quantile(trace, q[1])), "nonpositive_g2": float((g2 <= 0).mean()),
            "repeats": int(s.size), "b_small": b_small, "b_big": b_big, "level": level,
            "method": "percentile bootstrap over repeats"}


def two_batch_norms(unit_grads: Callable[[], torch.Tensor], b_small: int, b_big: int) -> tuple[float, float]:
    """One repeat: ``unit_grads()`` yields B_big per-unit gradients one at a time (each a flat tensor [D]); they are
    summed into B_big / B_small consecutive small batches. Returns (mean over the small batches of |G_small|^2,
    |G_big|^2), G_small and G_big the mean gradients of their units."""
    check_int("b_small", b_small, 1)
    check_int("b_big", b_big, b_small + 1)
    if b_big % b_small:
        raise ValueError(f"b_big: got {b_big} with b_small={b_small}; allowed: a multiple of b_small")
    big, small, sq, k = None, None, [], 0
    for g in unit_grads():
        g = g.detach().double()
        big = g.clone() if big is None else big.add_(g)
        small = g.clone() if small is None else small.add_(g)
        k += 1
        if k % b_small == 0:
            sq.append(float((small / b_small).square().sum()))
            small = None
    if k != b_big:
        raise ValueError(f"unit_grads: yielded {k} gradients; allowed: exactly b_big={b_big}")
    return float(np.mean(sq)), float((big / b_big).square().sum())


# ---- the policy-gradient units --------------------------------------------------------------------------------------
def group_gradients(policy: torch.nn.Module, batch: RolloutBatch, adv: torch.Tensor, cfg: Config):
    """Yield each group's gradient (flat [D] over every parameter): the policy loss ``cfg.policy_loss`` on-policy
    (old = logp detached), token mean within the group, micro-batched by ``cfg.train_micro_batch_tokens``."""
    from brorl_lab.rl import algo
    from brorl_lab.rl.logprobs import plan_micro_batches, token_logprobs

    params = [p for p in policy.parameters() if p.requires_grad]
    device = next(policy.parameters()).device
    loss_fn = algo.POLICY_LOSSES[cfg.policy_loss]
    mask = batch.response_mask  # [P*N, T]
    temperature = float(batch.meta.get("temperature", cfg.temperature))
    for p in range(batch.num_prompts):
        rows = batch.rows_of(torch.tensor([p]))  # [N]
        norm = algo.loss_normalisers([mask[rows]], max_response_len=cfg.max_new_tokens)
        policy.zero_grad(set_to_none=True)
        for mb in plan_micro_batches(policy, batch, rows, cfg.train_micro_batch_tokens, cfg.logprob_layout):
            r = rows[mb]
            logp, _ = token_logprobs(policy, batch, r, temperature=temperature, layout=cfg.logprob_layout)  # [b, T]
            loss, _ = loss_fn(logp, logp.detach(), adv[r].to(device), mask[r].to(device), eps_low=cfg.eps_low,
                              eps_high=cfg.eps_high, loss_agg="token_mean", **norm)
            loss.backward()
        yield torch.cat([(q.grad if q.grad is not None else torch.zeros_like(q)).flatten() for q in params])
    policy.zero_grad(set_to_none=True)


def collect_groups(engine, cfg: Config, groups: int, *, seed: int, template: str, tokenizer=None,
                   task_families=None, max_rounds: int = 64) -> tuple[RolloutBatch, dict]:
    """``groups`` informative groups at N = ``cfg.rollouts_per_prompt``: rounds of ``cfg.prompts_per_step``
    prompts (dynamic sampling, as the trainer's collect) until enough are kept. Returns the batch (exactly
    ``groups`` groups) and counts: generated_groups, kept_groups (over all rounds), rounds."""
    from brorl_lab.core.seeding import derive_seed
    from brorl_lab.rl import steps as S
    from brorl_lab.rollout.engines.base import RolloutSampling

    kept, gen, n_kept = [], 0, 0
    for rnd in range(max_rounds):
        items = S.sample_prompts(cfg.tasks, cfg.prompts_per_step, seed=derive_seed(seed, "noise-prompts", rnd),
                                 task_families=task_families)
        sampling = RolloutSampling(temperature=cfg.temperature, top_p=cfg.top_p, max_new_tokens=cfg.max_new_tokens,
                                   seed=derive_seed(seed, "noise-rollout", rnd))
        batch = S.score(S.rollout(engine, items, cfg.rollouts_per_prompt, sampling, template=template,
                                  tokenizer=tokenizer, task_families=task_families),
                        template=template, reward=cfg.reward, task_families=task_families)
        batch, fs = S.filter_groups(batch)
        gen += fs.generated_groups
        n_kept += fs.kept_groups
        kept.append(batch)
        if sum(b.num_prompts for b in kept) >= groups:
            out = RolloutBatch.concat(kept).select_prompts(range(groups))
            out.meta["temperature"] = cfg.temperature
            return out, {"generated_groups": gen, "kept_groups": n_kept, "rounds": rnd + 1}
    raise RuntimeError(f"collect_groups: fewer than {groups} informative groups in {max_rounds} rounds of "
                       f"{cfg.prompts_per_step} prompts at N={cfg.rollouts_per_prompt}")


def measure_noise_scale(cfg: Config, *, b_small: int, b_big: int, repeats: int, seed: int = 0,
                        policy=None, tokenizer=None) -> pd.DataFrame:
    """The two-batch norms of the policy gradient at ``cfg.model`` (or the given ``policy``/``tokenizer``), N =
    ``cfg.rollouts_per_prompt``, in units of informative groups: per repeat, B_big fresh groups
    (:func:`collect_groups`, prompts drawn ``cfg.prompts_per_step`` a round), advantages over them, and
    :func:`two_batch_norms` of :func:`group_gradients`. One row per repeat: repeat, N, sq_small, sq_big,
    generated_groups, kept_groups (for q)."""
    from brorl_lab.core.models import load_policy
    from brorl_lab.core.seeding import derive_seed
    from brorl_lab.rl import steps as S
    from brorl_lab.rl.spec import resolve
    from brorl_lab.rollout.engines import make_engine

    check_int("repeats", repeats, 2)
    if policy is None:
        policy, tokenizer = load_policy(cfg.model, device=cfg.device)
    spec = resolve(cfg, tokenizer=tokenizer)
    engine = make_engine("torch", policy, tokenizer)
    rows = []
    for r in range(repeats):
        batch, counts = collect_groups(engine, cfg, b_big, seed=derive_seed(seed, "noise", r), template=spec.template,
                                       tokenizer=tokenizer, task_families=spec.families)
        adv = S.advantages(batch, cfg.advantage, **S.advantage_options(cfg))  # [B_big * N]
        sq_small, sq_big = two_batch_norms(lambda: group_gradients(policy, batch, adv, cfg), b_small, b_big)
        rows.append({"repeat": r, "N": cfg.rollouts_per_prompt, "b_small": b_small, "b_big": b_big,
                     "sq_small": sq_small, "sq_big": sq_big, **counts})
    return pd.DataFrame(rows)


def noise_scale_units(result: dict, n: int, q: Optional[float] = None) -> dict:
    """B_simple of :func:`noise_scale_interval` (in informative groups) in three units: groups, rollouts (x N) and,
    with the informative-group rate ``q``, generated samples (x N / q: what dynamic sampling draws to keep them)."""
    check_int("n", n, 1)
    out = {}
    for unit, f in (("groups", 1.0), ("rollouts", float(n)), ("generated", n / q if q else math.nan)):
        out.update({f"b_{unit}": result["b_simple"] * f, f"b_{unit}_lo": result["lo"] * f,
                    f"b_{unit}_hi": result["hi"] * f})
    return out
