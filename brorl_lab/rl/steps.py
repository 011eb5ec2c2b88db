"""The stages of one RL step as cell-friendly functions. The `Trainer` calls exactly these, in this order:

    items  = sample_prompts(["chain_sum"], count=8, seed=0)          # tasks -> list[TaskItem]
    batch  = rollout(engine, items, n=16)                            # engine -> RolloutBatch (tokens, logprobs)
    batch  = score(batch)                                            # verifiers -> rewards, correct
      (or, with a per-prompt allocation of the same budget, both at once:
    batch  = rollout_allocated(engine, items, make_allocator("two_stage"), budget=8 * 16)   # groups of unequal N)
    batch, stats = filter_groups(batch)                              # dynamic sampling (DAPO)
    batch, kl = kl_in_reward(batch, policy, ref, cfg=cfg)              # only with kl_placement='reward'
    adv    = advantages(batch, "grpo")                               # [P*N] one scalar per sample
    report = update(policy, optimizer, batch, adv, reference=ref, cfg=cfg)   # micro-batched PPO-clip + KL
    sync(engine, policy)                                             # engine samples from the new weights

Each returns a plain value a notebook can display (RolloutBatch renders as an HTML table).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Optional

import torch

from brorl_lab.core.batch import RolloutBatch
from brorl_lab.core.config import Config
from brorl_lab.core.seeding import derive_seed
from brorl_lab.rl import algo
from brorl_lab.rl.allocation import ALLOCATORS, Allocator, allocation_metrics, make_allocator
from brorl_lab.rl.logprobs import compute_logprobs, plan_micro_batches, token_logprobs
from brorl_lab.rollout.engines.base import RolloutEngine, RolloutSampling
from brorl_lab.rollout.rewards import score
from brorl_lab.rollout.tasks import TaskFamily, TaskItem, family_of, sample_items

__all__ = ["sample_prompts", "rollout", "rollout_allocated", "make_allocator", "ALLOCATORS", "group_metrics",
           "score", "filter_groups", "kl_in_reward", "advantages", "advantage_options",
           "make_optimizer", "update", "sync", "is_on_policy", "kl_in_loss", "UpdateReport", "NonFiniteError"]


def sample_prompts(tasks: Sequence[str], count: int, *, seed: int, split: str = "train",
                   task_families: Optional[Mapping[str, TaskFamily]] = None) -> list[TaskItem]:
    """``count`` task items mixed uniformly over ``tasks``, deterministic in ``seed``. ``task_families`` are a run's
    own families (``RunSpec.families``: user-named tasks built with the run's task_configs); names it lacks come
    from the registry.

    >>> items = sample_prompts(["chain_sum"], count=4, seed=0)
    >>> items[0].question
    """
    return sample_items(list(tasks), count, seed=seed, split=split, task_families=task_families)


def rollout(engine: RolloutEngine, items: Sequence[TaskItem], n, sampling: Optional[RolloutSampling] = None,
            *, template: str = "plain", tokenizer=None,
            task_families: Optional[Mapping[str, TaskFamily]] = None) -> RolloutBatch:
    """N samples for each task item: formats each item's prompt with ``template`` (by the item's family, from
    ``task_families`` where it names it) and calls the engine. ``n`` may be one N_p per item (groups of unequal
    size, ``batch.sizes``).

    >>> engine = make_engine("torch", "default")
    >>> batch = rollout(engine, sample_prompts(["chain_sum"], 4, seed=0), n=16)
    >>> batch            # HTML table of a few samples per prompt
    """
    if not items:
        raise ValueError("items: got an empty list; allowed: a non-empty list of TaskItem (see sample_prompts)")
    tok = tokenizer if tokenizer is not None else getattr(engine, "tokenizer", None)
    prompts = [family_of(it.family, task_families).format_prompt(it, template, tok) for it in items]
    batch = engine.generate(prompts, n, sampling or RolloutSampling())
    batch.items = list(items)
    batch.meta["template"] = template
    return batch


def rollout_allocated(engine: RolloutEngine, items: Sequence[TaskItem], allocator: Allocator | str, *, budget: int,
                      sampling: Optional[RolloutSampling] = None, template: str = "plain", tokenizer=None,
                      reward: str = "score", task_families: Optional[Mapping[str, TaskFamily]] = None,
                      **allocator_options) -> RolloutBatch:
    """Roll out and score ``budget`` samples spread over ``items`` by a per-prompt allocator
    (:mod:`brorl_lab.rl.allocation`; a name builds one with ``allocator_options``): each round the allocator asks
    for N_r,p more samples of some prompts, this draws them (:func:`rollout` with per-prompt counts, round r's seed
    ``derive_seed(sampling.seed, 'allocation', r)``) and scores them, and the allocator reads their correctness.

    Returns ONE scored batch whose group p holds all N_p = sum_r N_r,p samples of prompt p (rounds in order), with
    ``batch.sizes`` set when the N_p differ and ``meta['allocation']`` = the rounds' per-prompt draws and the
    allocator's estimates. Exactly ``budget`` samples are generated.

    >>> batch = rollout_allocated(engine, items, "two_stage", budget=8 * 16, probe=4, cap=512)
    """
    if not items:
        raise ValueError("items: got an empty list; allowed: a non-empty list of TaskItem (see sample_prompts)")
    if isinstance(allocator, str):
        allocator = make_allocator(allocator, **allocator_options)
    sampling = sampling or RolloutSampling()
    parts: list[tuple[list, RolloutBatch]] = []

    def draw(idx: list, counts: list) -> list:
        seed = None if sampling.seed is None else derive_seed(sampling.seed, "allocation", len(parts))
        b = rollout(engine, [items[i] for i in idx], counts, replace(sampling, seed=seed), template=template,
                    tokenizer=tokenizer, task_families=task_families)
        b = score(b, template=template, reward=reward, task_families=task_families)
        parts.append((idx, b))
        return [b.correct[b.rows_of([j])] for j in range(len(idx))]

    alloc = allocator.allocate(draw, num_prompts=len(items), budget=budget,
                               keys=[getattr(it, "question", None) for it in items])
    where = [[(b, j) for idx, b in parts for j in range(len(idx)) if idx[j] == p] for p in range(len(items))]
    joined = RolloutBatch.concat([b.select_prompts([j]) for pieces in where for b, j in pieces])  # prompt-major
    merged = replace(joined, prompts=[pieces[0][0].prompts[pieces[0][1]] for pieces in where],
                     prompt_ids=[pieces[0][0].prompt_ids[pieces[0][1]] for pieces in where], items=list(items),
                     sizes=torch.tensor(alloc.sizes), n=max(alloc.sizes))
    gen_s = sum(b.meta.get("generation_seconds", 0.0) for _, b in parts)
    merged.meta.update(generation_seconds=gen_s, generated_tokens=int(merged.lengths.sum()), rounds=len(parts),
                       allocation={"allocator": allocator.name, "rounds": alloc.rounds, "p_hat": alloc.p_hat})
    return merged.validate()


def group_metrics(batch: RolloutBatch) -> dict:
    """The allocation columns of a step (:func:`brorl_lab.rl.allocation.allocation_metrics`) from every group it
    generated: N per prompt (mean, min, max, histogram) and the informative share per generated sample."""
    if batch.correct is None or batch.num_prompts == 0:
        return {}
    return allocation_metrics(batch.group_sizes, batch.group_sum(batch.correct.long()))


@dataclass
class FilterStats:
    generated_groups: int
    kept_groups: int
    all_correct_groups: int
    all_wrong_groups: int

    @property
    def pass_rate(self) -> float:
        """Kept / generated groups: BroRL's "dynamic-sampling pass rate" (41% at N=16, 62% at N=512)."""
        return self.kept_groups / self.generated_groups if self.generated_groups else 0.0


def filter_groups(batch: RolloutBatch) -> tuple[RolloutBatch, FilterStats]:
    """Dynamic sampling (DAPO): drop the groups whose N samples are all correct or all wrong.

    Such groups have zero advantage under any group baseline, so they add no gradient, only noise in the
    normaliser. Returns the informative groups and the counts.
    """
    if batch.correct is None:
        raise ValueError("batch.correct: missing; call score(batch) before filter_groups")
    frac = batch.group_mean(batch.correct.float())  # [P] group accuracy (any group sizes)
    keep = torch.nonzero((frac > 0) & (frac < 1)).flatten()
    stats = FilterStats(batch.num_prompts, int(keep.numel()), int((frac == 1).sum()), int((frac == 0).sum()))
    return batch.select_prompts(keep), stats


def advantages(batch: RolloutBatch, estimator: str = "grpo", **options) -> torch.Tensor:
    """Per-sample advantages [P*N] from ``batch.rewards`` with a registered estimator (see algo.ADVANTAGES); groups
    of unequal size are each normalised by their own N_p (:func:`brorl_lab.rl.algo.ragged_advantages`)."""
    if batch.rewards is None:
        raise ValueError("batch.rewards: missing; call score(batch) first")
    return algo.compute_advantages(estimator, batch.rewards, batch.sizes if batch.is_ragged else batch.n, **options)


def advantage_options(cfg: Config) -> dict:
    """The estimator options a run's config implies: ``std_norm=cfg.adv_std_norm`` for GRPO (its group-std
    normalisation, ProRL v1), none for the others. The trainer and every one-update study pass these to
    :func:`advantages`: ``advantages(batch, cfg.advantage, **advantage_options(cfg))``."""
    return {"std_norm": cfg.adv_std_norm} if cfg.advantage == "grpo" else {}


def make_optimizer(policy: torch.nn.Module, cfg: Config) -> torch.optim.Optimizer:
    """The run's optimizer, fresh: AdamW over every parameter at ``cfg.effective_lr`` (the lr after the arm's lr
    scaling) with ``cfg.adam_betas`` and ``cfg.weight_decay``. The trainer builds it here at start and at each
    optimizer reset; a one-update experiment (study.theorem) builds the same one."""
    return torch.optim.AdamW(policy.parameters(), lr=cfg.effective_lr, betas=tuple(cfg.adam_betas),
                             weight_decay=cfg.weight_decay)


class NonFiniteError(RuntimeError):
    """A loss or gradient was NaN/inf. Its mini-batch was not applied, nor any after it; ``optimizer_steps`` says
    how many earlier mini-batches of the same update were (their weights and optimizer state stand)."""

    def __init__(self, message: str, *, optimizer_steps: int = 0):
        super().__init__(message)
        self.optimizer_steps = optimizer_steps


@dataclass
class UpdateReport:
    """What one update did: averaged metrics plus the pieces the trainer logs."""

    metrics: dict = field(default_factory=dict)
    optimizer_steps: int = 0

    def __repr__(self) -> str:
        keys = ("loss", "kl", "entropy", "clipfrac_low", "clipfrac_high", "grad_norm")
        return "UpdateReport(" + ", ".join(f"{k}={self.metrics[k]:.4g}" for k in keys if k in self.metrics) + ")"


def update(policy: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: RolloutBatch,  # noqa: C901
           adv: torch.Tensor, *, cfg: Config, reference: Optional[torch.nn.Module] = None,
           old_logprobs: Optional[torch.Tensor] = None) -> UpdateReport:
    """One RL update on a scored, filtered batch: ``cfg.optimizer_steps_per_step`` PPO mini-batches (whole groups),
    each accumulated over micro-batches of at most ``cfg.train_micro_batch_tokens`` tokens. This is the project's
    one update loop (the trainer calls it; :mod:`brorl_lab.rl.algo` documents the pieces it calls), written top to
    bottom in four stages; it reads whole on purpose, so it is exempt from the complexity limit.

    Loss per mini-batch (aggregated with ``cfg.loss_agg`` over the mini-batch's tokens, so the micro-batches'
    gradients add up to the mini-batch's):

        L = L_policy(ratio, A; eps_low, eps_high) + beta * KL_est - c_ent * H(pi)

    (the KL term only with ``cfg.kl_placement == 'loss'``; what its gradient regularises depends on
    ``cfg.kl_estimator``, see :mod:`brorl_lab.rl.algo`).

    ``old_logprobs`` [P*N, T] are the behaviour policy's log-probs recomputed by the trainer (``compute_logprobs``);
    when not given they are computed here, or, if :func:`is_on_policy`, taken as each micro-batch's ``logp.detach()``
    (the same numbers, one no-grad forward fewer). With ``cfg.is_correction`` ('truncate' or 'icepop_mask') the
    engine's own log-probs give importance weights (:func:`brorl_lab.rl.algo.importance_weights`).

    A non-finite loss or gradient norm is caught before its ``optimizer.step``: that mini-batch and the ones after
    it are not applied, the gradients are cleared, and :class:`NonFiniteError` says how many mini-batches before it
    were (no copy of the model or optimizer is kept to roll those back).
    """
    if batch.size == 0:
        raise ValueError("batch: no samples to update on (all groups filtered?)")
    device = next(policy.parameters()).device
    lp_options = dict(temperature=float(batch.meta.get("temperature", cfg.temperature)), layout=cfg.logprob_layout,
                      fused=cfg.compile_step)
    mask = batch.response_mask  # [P*N, T]
    loss_fn = algo.POLICY_LOSSES[cfg.policy_loss]

    # ---- 1. behaviour, reference and importance log-probs: once, before any weight moves ----------------------------
    if old_logprobs is None and not is_on_policy(cfg):
        old_logprobs = compute_logprobs(policy, batch, micro_batch_tokens=cfg.train_micro_batch_tokens, **lp_options)
    ref_logprobs = None  # [P*N, T]
    if kl_in_loss(cfg):
        if reference is None:
            raise ValueError("reference: kl_beta > 0 needs a reference policy (see models.make_reference)")
        ref_logprobs = compute_logprobs(reference, batch, micro_batch_tokens=cfg.train_micro_batch_tokens,
                                        **lp_options)
    isw = algo.importance_weights(cfg.is_correction, old_logprobs, batch.logprobs, cap=cfg.is_cap,
                                  low=cfg.icepop_low, high=cfg.icepop_high)  # [P*N, T] or None

    per_minibatch: list[dict] = []
    for g in torch.arange(batch.num_prompts).chunk(cfg.optimizer_steps_per_step):  # mini-batches of whole groups
        rows = batch.rows_of(g)  # [|g|*N]
        norm = algo.loss_normalisers([mask[rows]], max_response_len=cfg.max_new_tokens)  # the mini-batch's counts
        optimizer.zero_grad(set_to_none=True)
        parts: list[dict] = []
        for mb in plan_micro_batches(policy, batch, rows, cfg.train_micro_batch_tokens, cfg.logprob_layout):
            # ---- 2. loss of one micro-batch -------------------------------------------------------------------------
            r = rows[mb]
            logp, ent = token_logprobs(policy, batch, r, with_entropy=True, entropy_grad=bool(cfg.entropy_coef),
                                       **lp_options)  # [b, T]; H only logged (no graph) unless it is in the loss
            m = mask[r].to(device)
            old = logp.detach() if old_logprobs is None else old_logprobs[r].to(device)  # [b, T]
            loss, met = loss_fn(logp, old, adv[r].to(device), m, eps_low=cfg.eps_low, eps_high=cfg.eps_high,
                                loss_agg=cfg.loss_agg, is_weights=None if isw is None else isw[r].to(device), **norm)
            met = {**met, "policy_loss": met["loss"]}
            if ref_logprobs is not None:  # L += beta * KL_est (kl_placement='loss')
                kl = algo.aggregate(algo.kl_penalty(logp, ref_logprobs[r].to(device), cfg.kl_estimator), m,
                                    cfg.loss_agg, **norm)
                loss = loss + cfg.kl_beta * kl
                met["kl"] = kl.item()
            ent_agg = algo.aggregate(ent, m, cfg.loss_agg, **norm)  # H of the full distribution, not the NLL
            if cfg.entropy_coef:  # L -= c * H (an entropy bonus)
                loss = loss - cfg.entropy_coef * ent_agg
            met.update(loss=loss.item(), entropy=ent_agg.item())
            # ---- 3. backward: micro-batch gradients add up to the mini-batch's --------------------------------------
            if not torch.isfinite(loss):
                optimizer.zero_grad(set_to_none=True)
                raise NonFiniteError(f"loss is {loss.item()} (policy loss {met['policy_loss']})",
                                     optimizer_steps=len(per_minibatch))
            loss.backward()
            parts.append(met)
        # ---- 4. clip and step, only a finite gradient ---------------------------------------------------------------
        grad_norm = torch.nn.utils.clip_grad_norm_(policy.parameters(), cfg.grad_clip)
        if not torch.isfinite(grad_norm):
            optimizer.zero_grad(set_to_none=True)
            raise NonFiniteError(f"gradient norm is {grad_norm.item()}", optimizer_steps=len(per_minibatch))
        optimizer.step()
        per_minibatch.append({**algo.merge_metrics(parts), "grad_norm": grad_norm.item()})

    k = len(per_minibatch)
    keys = [key for key in per_minibatch[0] if key not in ("tokens",) and not key.endswith(("_tokens", "_sum"))]
    metrics = {key: sum(mb.get(key, 0.0) for mb in per_minibatch) / k for key in keys}  # mean over mini-batches
    metrics["train_tokens"] = sum(mb.get("tokens", 0.0) for mb in per_minibatch)
    return UpdateReport(metrics, optimizer_steps=k)


def is_on_policy(cfg: Config) -> bool:
    """Whether the update's behaviour policy is the policy being differentiated: one optimizer step per RL step
    and no importance correction. Then old_logp == logp (the engine sampled from these weights and nothing has
    stepped), so ``update`` uses ``logp.detach()`` and skips a forward, as TRL's GRPOTrainer does with
    ``num_iterations=1``."""
    return cfg.optimizer_steps_per_step == 1 and cfg.is_correction == "none"


def kl_in_loss(cfg: Config) -> bool:
    """Whether ``update`` adds ``kl_beta * KL_est`` to the loss (``kl_placement='loss'`` with ``kl_beta > 0``)."""
    return cfg.kl_beta > 0 and cfg.kl_placement == "loss"


def kl_in_reward(batch: RolloutBatch, policy: torch.nn.Module, reference: Optional[torch.nn.Module], *, cfg: Config,
                 logprobs: Optional[torch.Tensor] = None) -> tuple[RolloutBatch, Optional[float]]:
    """KL as a reward penalty (``cfg.kl_placement == 'reward'``): a copy of the scored batch whose rewards are

        r_s - kl_beta * sum_t KL_est(log pi(a_t), log pi_ref(a_t))          (detached, per sample s)

    with ``logprobs`` [P*N, T] the behaviour policy's (computed from ``policy`` when not given). Advantages are
    then computed from these rewards; ``correct`` (and so dynamic sampling) is unchanged. Returns the batch
    unchanged and None when the KL is not in the reward; else the new batch and the token-mean KL estimate.
    """
    if not (cfg.kl_beta > 0 and cfg.kl_placement == "reward") or batch.size == 0:
        return batch, None
    if batch.rewards is None:
        raise ValueError("batch.rewards: missing; call score(batch) before kl_in_reward")
    if reference is None:
        raise ValueError("reference: kl_placement='reward' with kl_beta > 0 needs a reference policy "
                         "(see models.make_reference)")
    lp = dict(temperature=float(batch.meta.get("temperature", cfg.temperature)),
              micro_batch_tokens=cfg.train_micro_batch_tokens, layout=cfg.logprob_layout, fused=cfg.compile_step)
    if logprobs is None:
        logprobs = compute_logprobs(policy, batch, **lp)
    ref = compute_logprobs(reference, batch, **lp)  # [P*N, T]
    mask = batch.response_mask
    per_seq = algo.kl_reward_penalty(logprobs, ref, mask, cfg.kl_estimator)  # [P*N]
    out = copy.copy(batch)
    out.rewards = batch.rewards - cfg.kl_beta * per_seq.to(batch.rewards.dtype)
    out.meta = {**batch.meta, "kl_in_reward": True}
    return out, float(per_seq.sum()) / max(1, int(mask.sum()))


def sync(engine: RolloutEngine, policy: torch.nn.Module) -> None:
    """Push the trainer's weights into the rollout engine, so the next rollout samples from the new policy."""
    engine.sync_weights(policy)
