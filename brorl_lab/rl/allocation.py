"""Per-prompt allocation of a step's rollout budget: groups of unequal size, each prompt's N_p chosen from its draws.

A step has P prompts and a budget of B = P * rollouts_per_prompt generated samples. An allocator decides, in
rounds, how many samples each prompt gets, and spends exactly B with 1 <= N_p <= cap:

    allocator = make_allocator("two_stage", probe=4, cap=512)
    alloc = allocator.allocate(draw, num_prompts=P, budget=B, keys=prompts)  # draw(prompts, counts) -> outcomes
    alloc.sizes                                                              # [P] N_p, sum = B

``draw(indices, counts)`` samples ``counts[j]`` more rollouts of prompt ``indices[j]`` and returns each one's
correctness (a bool tensor per prompt): :func:`brorl_lab.rl.steps.rollout_allocated` passes the engine and the
verifier, :func:`simulate` passes Binomial draws at known p (notebook 01c's widget). Registered by name
(:data:`ALLOCATORS`, config ``rollout_allocation``) so a sweep varies a string:

- ``uniform``: N_p = B / P in one round (today's behaviour; the trainer keeps its old path for it, bit for bit).
- ``two_stage`` (:class:`TwoStage`, from Theorem 1): a probe, then a knapsack on the expected informative groups.
- ``until_signal`` (:class:`UntilSignal`, Reinforce-Ada's idea): rounds until each group holds both outcomes.

The expected values (s_N(p), Theorem 1's G_N(p), Beta posterior moments) are in :mod:`brorl_lab.theory.allocation`.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Optional

import numpy as np
import torch

from brorl_lab.core.registry import Registry
from brorl_lab.core.validation import check_int
from brorl_lab.theory import allocation as T

ALLOCATORS = Registry("rollout_allocation")

#: weight of the tie-breaking variance-reduction term of :class:`TwoStage` (small: it only orders equal gains)
VARIANCE_TIE_BREAK = 1e-3

Draw = Callable[[list, list], list]  # (prompt indices, counts) -> [one bool tensor of new outcomes per prompt]


@dataclass
class Allocation:
    """What an allocator did in one step: ``sizes`` [P] final N_p, ``rounds`` (per round, the [P] draws it added),
    ``successes`` [P] correct samples, ``p_hat`` [P] the estimates the allocator used (nan where none)."""

    sizes: list
    rounds: list
    successes: list
    p_hat: list = field(default_factory=list)

    @property
    def informative(self) -> list:
        """[P] whether each final group holds both outcomes."""
        return [0 < k < n for k, n in zip(self.successes, self.sizes)]


class Allocator:
    """Base: holds the options and a per-prompt history ``{key: [successes, draws]}`` of earlier steps (what
    :class:`TwoStage` takes its prior from). Subclasses implement :meth:`plan`."""

    name = "base"

    def __init__(self, *, probe: int = 4, cap: int = 512, round_size: int = 4, prior_draws: int = 16):
        for arg, v, lo in (("probe", probe, 1), ("cap", cap, 1), ("round_size", round_size, 1),
                           ("prior_draws", prior_draws, 0)):
            check_int(arg, v, lo)
        if probe > cap:
            raise ValueError(f"probe: got {probe}; allowed: at most cap={cap}")
        self.probe, self.cap, self.round_size, self.prior_draws = probe, cap, round_size, prior_draws
        self.history: dict = {}

    def check_budget(self, num_prompts: int, budget: int) -> None:
        check_int("num_prompts", num_prompts, 1)
        check_int("budget", budget, 1)
        lo, hi = num_prompts * self.first_round(), num_prompts * self.cap
        if not lo <= budget <= hi:
            raise ValueError(f"budget: got {budget} samples for {num_prompts} prompts; allowed: {lo} .. {hi} "
                             f"(every prompt's first round of {self.first_round()} and at most cap={self.cap} each)")

    def first_round(self) -> int:
        return self.probe

    def allocate(self, draw: Draw, *, num_prompts: int, budget: int, keys: Optional[Sequence] = None) -> Allocation:
        """Run the rounds, spending exactly ``budget``; remembers each prompt's outcomes under its key."""
        self.check_budget(num_prompts, budget)
        keys = list(keys) if keys is not None else [None] * num_prompts
        alloc = self.plan(draw, num_prompts, budget, keys)
        assert sum(alloc.sizes) == budget and all(1 <= n <= self.cap for n in alloc.sizes), alloc.sizes
        for key, k, n in zip(keys, alloc.successes, alloc.sizes):
            if key is not None:
                s, d = self.history.get(key, (0, 0))
                self.history[key] = (s + k, d + n)
        return alloc

    def plan(self, draw: Draw, num_prompts: int, budget: int, keys: list) -> Allocation:
        raise NotImplementedError

    def state_dict(self) -> dict:
        """The allocator's memory as plain data for a checkpoint: its name and each prompt's earlier outcomes,
        ``history`` [[key, successes, draws], ...] in the order first seen (what :class:`TwoStage`'s prior reads), so
        a resumed run allocates as the uninterrupted one would."""
        return {"name": self.name, "history": [[k, int(s), int(d)] for k, (s, d) in self.history.items()]}

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict`'s memory (replacing this allocator's own); a state of another allocator is an
        error naming both."""
        if state.get("name") != self.name:
            raise ValueError(f"state: an allocator state of {state.get('name')!r}; allowed: one of {self.name!r}")
        self.history = {k: (int(s), int(d)) for k, s, d in state["history"]}

    @staticmethod
    def _round(draw: Draw, counts: list, sizes: list, successes: list, rounds: list) -> None:
        """Draw ``counts[p]`` more of each prompt with counts > 0 and record them."""
        idx = [p for p, c in enumerate(counts) if c > 0]
        if not idx:
            return
        outs = draw(idx, [counts[p] for p in idx])
        for p, o in zip(idx, outs):
            o = torch.as_tensor(o).reshape(-1)
            if o.numel() != counts[p]:
                raise ValueError(f"draw: returned {o.numel()} outcomes for prompt {p}, asked {counts[p]}")
            sizes[p] += counts[p]
            successes[p] += int(o.sum())
        rounds.append(list(counts))


def _registered(name: str):
    def add(cls):
        cls.name = name
        ALLOCATORS.register(name, cls)
        return cls

    return add


@_registered("uniform")
class Uniform(Allocator):
    """N_p = B / P for every prompt, one round: the papers' allocation (B must be a multiple of P)."""

    def first_round(self) -> int:
        return 1

    def plan(self, draw, num_prompts, budget, keys):
        if budget % num_prompts:
            raise ValueError(f"budget: got {budget} for {num_prompts} prompts; allowed: a multiple of the prompts "
                             "for 'uniform'")
        sizes, succ, rounds = [0] * num_prompts, [0] * num_prompts, []
        self._round(draw, [budget // num_prompts] * num_prompts, sizes, succ, rounds)
        return Allocation(sizes, rounds, succ, [float("nan")] * num_prompts)


@_registered("two_stage")
class TwoStage(Allocator):
    """Theorem 1's allocation in two stages: a probe, then a knapsack on the expected informative groups.

    Stage 1: n0 = ``probe`` draws per prompt, k_p successes. Prior p_p ~ Beta(a_p, b_p) with a_p = 1 + w s_p,
    b_p = 1 + w f_p from the prompt's earlier steps (s_p successes, f_p failures, scaled by w so at most
    ``prior_draws`` pseudo-draws count: the policy has moved since); posterior Beta(a_p + k_p, b_p + n0 - k_p).

    Stage 2: the remaining R = B - P n0 draws go to maximise

        sum_p  g_p(m_p)     s.t.  sum_p m_p = R,   0 <= m_p <= cap - n0
        g_p(m) = P(group p informative | probe, m more)  +  lambda * pbar_p (1 - pbar_p) (1/n0 - 1/(n0 + m))

    The objective is the expected number of informative groups (:func:`brorl_lab.theory.allocation.
    informative_given_probe`): the groups dynamic sampling keeps, each a non-zero gradient, which is the quantity
    BroRL's mechanism turns on (s_N(p) rises with N only where 0 < p << 1 or p ~ 1). We do not weight it by
    Theorem 1's 2 p^2 (1-p)^2 (:func:`~brorl_lab.theory.allocation.theorem1_gain`): that factor vanishes like p^2
    and would steer the budget away from the rare-success prompts BroRL is about; and VIP's variance reduction
    p(1-p)/N alone would feed the prompts near p = 1/2 that already hold both outcomes. It serves here only as a
    tie-break (lambda = :data:`VARIANCE_TIE_BREAK`), spending the draws informativeness cannot use (every probe
    mixed, or every unsolved prompt at its cap) where they cut the most gradient variance.

    Both terms are concave in m (the first's increments E[(1-p)^m p] or E[p^m (1-p)] fall with m, the second's
    pbar(1-pbar)/((n0+m)(n0+m+1)) too), and every draw costs one sample: for a separable concave objective under
    one budget of unit costs, the greedy that repeatedly gives one draw to the largest marginal gain is exact (a
    knapsack that needs no dynamic programme). The code keeps a heap of marginal gains.
    """

    def prior(self, key) -> tuple[float, float]:
        s, d = self.history.get(key, (0, 0)) if key is not None else (0, 0)
        w = min(1.0, self.prior_draws / d) if d else 0.0
        return 1.0 + w * s, 1.0 + w * (d - s)

    def plan(self, draw, num_prompts, budget, keys):
        P, n0 = num_prompts, self.probe
        sizes, succ, rounds = [0] * P, [0] * P, []
        self._round(draw, [n0] * P, sizes, succ, rounds)  # stage 1: the probe
        post = []
        for p in range(P):
            a, b = self.prior(keys[p])
            post.append((a + succ[p], b + n0 - succ[p]))
        pbar = [a / (a + b) for a, b in post]

        def gain(p: int, m: int) -> float:
            a, b = post[p]
            info = T.informative_given_probe(a, b, succ[p], n0, m)
            return info + VARIANCE_TIE_BREAK * pbar[p] * (1 - pbar[p]) * (1 / n0 - 1 / (n0 + m))

        extra = [0] * P
        heap = [(-(gain(p, 1) - gain(p, 0)), p) for p in range(P) if n0 < self.cap]
        heapq.heapify(heap)
        for _ in range(budget - P * n0):  # stage 2: greedy on marginal gains (exact: concave, unit costs)
            _, p = heapq.heappop(heap)
            extra[p] += 1
            if n0 + extra[p] < self.cap:
                heapq.heappush(heap, (-(gain(p, extra[p] + 1) - gain(p, extra[p])), p))
        self._round(draw, extra, sizes, succ, rounds)
        return Allocation(sizes, rounds, succ, pbar)


@_registered("until_signal")
class UntilSignal(Allocator):
    """Sample until signal (Reinforce-Ada, arXiv 2510.04996): draw in rounds until a group holds both outcomes.

        round 0:   n0 = ``probe`` draws for every prompt
        round r:   ``round_size`` more for each prompt p with k_p in {0, N_p} (no signal yet) and N_p < cap,
                   while budget remains (the last round's draws go one at a time to the smallest such groups)
        leftover:  once every group has signal or is capped, the rest of B goes one draw at a time to the
                   smallest groups below the cap

    so each step spends exactly B, as the uniform arms do, and arms compare at equal generated samples. The
    leftover rule is ours (Reinforce-Ada stops sampling instead, spending less): it adds samples to groups that
    already have signal, which lowers their gradient variance.
    """

    def plan(self, draw, num_prompts, budget, keys):
        P = num_prompts
        sizes, succ, rounds = [0] * P, [0] * P, []
        self._round(draw, [self.probe] * P, sizes, succ, rounds)
        left = budget - P * self.probe
        while left > 0:
            active = [p for p in range(P) if succ[p] in (0, sizes[p]) and sizes[p] < self.cap]
            want = {p: min(self.round_size, self.cap - sizes[p]) for p in active}
            if not active:  # every group has signal or is capped: spread the rest over the smallest groups
                active = [p for p in range(P) if sizes[p] < self.cap]
                want = {p: self.cap - sizes[p] for p in active}
            counts = _fill(left, sizes, want)
            self._round(draw, counts, sizes, succ, rounds)
            left -= sum(counts)
        return Allocation(sizes, rounds, succ, [k / n for k, n in zip(succ, sizes)])


def _fill(left: int, sizes: list, want: dict) -> list:
    """Counts [P]: ``want[p]`` for each listed prompt if ``left`` covers them all, else ``left`` draws one at a time
    to the smallest group (then the lowest index) that still wants one."""
    counts = [0] * len(sizes)
    if sum(want.values()) <= left:
        for p, k in want.items():
            counts[p] = k
        return counts
    heap = [(sizes[p], p) for p in want]
    heapq.heapify(heap)
    for _ in range(left):
        n, p = heapq.heappop(heap)
        counts[p] += 1
        if counts[p] < want[p]:
            heapq.heappush(heap, (n + 1, p))
    return counts


def make_allocator(name: str, **options) -> Allocator:
    """The allocator registered as ``name`` with ``probe``, ``cap``, ``round_size``, ``prior_draws``."""
    return ALLOCATORS.get(name)(**options)


def allocator_options(cfg) -> dict:
    """The allocator options of a run's config (``allocation_*`` fields)."""
    return {"probe": cfg.allocation_probe, "cap": cfg.allocation_cap, "round_size": cfg.allocation_round,
            "prior_draws": cfg.allocation_prior_draws}


# ---- the allocation on known p: expected values for the notebook and the tests ----------------------------------
def binomial_draw(p_values: Sequence[float], rng: np.random.Generator) -> Draw:
    """A ``draw`` that samples Bernoulli(p) outcomes at known success rates ``p_values`` [P]."""
    p_values = np.asarray(p_values, dtype=np.float64)

    def draw(idx, counts):
        return [torch.from_numpy(rng.random(k) < p_values[i]) for i, k in zip(idx, counts)]

    return draw


def simulate(p_values: Sequence[float], budget: int, strategy: str, *, reps: int = 20, seed: int = 0,
             **options) -> dict:
    """Run allocator ``strategy`` ``reps`` times on prompts of known success rates ``p_values`` [P] with ``budget``
    samples a step (fresh allocator each time: no history), and return its mean outcome:

        sizes            [P] mean N_p
        informative      expected informative groups a step (mean count of groups with both outcomes)
        gain             expected Theorem 1 gain a step, sum_p 2 p^2 (1-p)^2 1[group p informative] (N dQ/lr units)
        per_sample       informative / budget and gain / budget

    ``'uniform:<N>'`` is the uniform allocation at N samples per prompt whatever ``budget`` says (exact, no
    sampling: sum_p s_N(p), sum_p G_N(p)), so 16 and 512 compare with an allocator per generated sample.
    """
    p = np.asarray(p_values, dtype=np.float64)
    P = len(p)
    if strategy.startswith("uniform:"):
        n = int(strategy.split(":", 1)[1])
        info, gain = float(T.informative_probability(p, n).sum()), float(T.theorem1_gain(p, n).sum())
        return {"strategy": strategy, "sizes": np.full(P, float(n)), "samples": n * P, "informative": info,
                "gain": gain, "informative_per_sample": info / (n * P), "gain_per_sample": gain / (n * P)}
    rng = np.random.default_rng(seed)
    weight = 2 * p ** 2 * (1 - p) ** 2  # [P] Theorem 1's gain of one informative group
    sizes, info, gain = np.zeros(P), 0.0, 0.0
    for _ in range(reps):
        alloc = make_allocator(strategy, **options).allocate(binomial_draw(p, rng), num_prompts=P, budget=budget)
        mixed = np.asarray(alloc.informative, dtype=np.float64)
        sizes += np.asarray(alloc.sizes) / reps
        info += mixed.sum() / reps
        gain += float((weight * mixed).sum()) / reps
    return {"strategy": strategy, "sizes": sizes, "samples": budget, "informative": info, "gain": gain,
            "informative_per_sample": info / budget, "gain_per_sample": gain / budget}


# ---- metrics of a step -------------------------------------------------------------------------------------------------
#: upper edges of the N-per-prompt histogram bins (N <= edge, above the previous edge)
HIST_EDGES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


def allocation_metrics(sizes: torch.Tensor, correct_per_group: torch.Tensor) -> dict:
    """A step's allocation as metric columns, from the group sizes [P] and correct counts [P] of every group it
    generated: N per prompt (mean, min, max, histogram ``alloc/n_le_<edge>``), informative groups, and the
    informative share per generated sample: informative groups / samples, and the share of samples that sit in an
    informative group."""
    sizes = torch.as_tensor(sizes, dtype=torch.long)
    k = torch.as_tensor(correct_per_group, dtype=torch.long)
    if sizes.numel() == 0:
        return {}
    mixed = (k > 0) & (k < sizes)  # [P]
    samples = int(sizes.sum())
    out = {"alloc/n_mean": float(sizes.float().mean()), "alloc/n_min": int(sizes.min()),
           "alloc/n_max": int(sizes.max()), "alloc/informative_groups": int(mixed.sum()),
           "alloc/informative_per_sample": int(mixed.sum()) / samples,
           "alloc/informative_sample_share": int(sizes[mixed].sum()) / samples}
    lo = 0
    for edge in HIST_EDGES:
        out[f"alloc/n_le_{edge}"] = int(((sizes > lo) & (sizes <= edge)).sum())
        lo = edge
    out[f"alloc/n_gt_{lo}"] = int((sizes > lo).sum())
    return out




#: the strategies notebook 01c compares: the papers' two uniform arms and the two allocators
COMPARED = ("uniform:16", "uniform:512", "two_stage", "until_signal")


def compare(p_values: Sequence[float], budget_per_prompt: int, strategies: Sequence[str] = COMPARED, *,
            reps: int = 20, seed: int = 0, **options) -> tuple:
    """Each strategy on prompts of known p [P] (:func:`simulate`): the allocators at ``budget_per_prompt * P``
    samples, ``uniform:<N>`` at its own N. Returns ``(table, sizes)``: one row per strategy (samples per prompt,
    informative groups per prompt and per 1,000 samples, Theorem 1 gain per sample, both relative to
    'uniform:16' where it is compared) and {strategy: mean N_p [P]}."""
    import pandas as pd

    P = len(p_values)
    rows, sizes = [], {}
    for s in strategies:
        r = simulate(p_values, budget_per_prompt * P, s, reps=reps, seed=seed, **options)
        sizes[s] = r["sizes"]
        rows.append({"strategy": s, "samples_per_prompt": r["samples"] / P, "informative_per_prompt":
                     r["informative"] / P, "informative_per_1k_samples": 1000 * r["informative_per_sample"],
                     "gain_per_sample": r["gain_per_sample"]})
    table = pd.DataFrame(rows).set_index("strategy")
    if "uniform:16" in table.index:
        for col in ("informative_per_1k_samples", "gain_per_sample"):
            base = table.loc["uniform:16", col]
            table[f"{col}_vs_uniform16"] = table[col] / base if base > 0 else float("nan")
    return table, sizes


__all__ = ["ALLOCATORS", "Allocation", "Allocator", "Uniform", "TwoStage", "UntilSignal", "make_allocator",
           "allocator_options", "simulate", "binomial_draw", "allocation_metrics", "compare", "COMPARED",
           "VARIANCE_TIE_BREAK"]
