"""The expected value of a group of N rollouts of one prompt, as a function of the prompt's success rate p: what a
per-prompt allocation of the rollout budget (:mod:`brorl_lab.rl.allocation`) maximises, and what notebook 01c plots.

A prompt is solved by one sample with probability p; its group of N samples holds k ~ Binomial(N, p) successes.

**Informative groups.** Dynamic sampling keeps a group only when it holds both outcomes (0 < k < N); under any group
baseline an all-correct or all-wrong group has zero advantage. So

    s_N(p) = P(0 < k < N) = 1 - p^N - (1 - p)^N                                   (:func:`informative_probability`)

Its increments s_{N+1}(p) - s_N(p) = p^N (1 - p) + (1 - p)^N p fall with N (each term is geometric in N), so s_N is
concave in N: a greedy allocation on marginal gains is exact for sum_p s_{N_p}(p_p) under sum_p N_p = B.

**Theorem 1 on one prompt.** Take BroRL's mass balance (docs/THEORY.md) with two "tokens", the correct answer
(mass p) and the wrong one (mass 1 - p), and group-centred rewards R_i = r_i - k/N (the mean baseline of Dr.GRPO).
When 0 < k < N both are drawn, S_R = p - k/N, and the bracket of Theorem 1 is

    (R_c - S_R) Q_neg A_2 + (S_R - R_w) Q_pos B_2 = (1 - p) (1-p) p^2 + p p (1-p)^2 = 2 p^2 (1 - p)^2

for every k (the unsampled term is 0: nothing is unsampled); when k is 0 or N every centred reward is 0. So the
expected N * dQ_pos / lr of one group (the scale Theorem 1 is compared on: with a loss averaged over the step's
samples, a group of N samples weighs N times one sample) is

    G_N(p) = 2 p^2 (1 - p)^2 s_N(p)                                                  (:func:`theorem1_gain`)

the informative probability weighted by how far one informative group moves that prompt's correct mass (largest at
p = 1/2, vanishing like p^2 for rare successes).

**Posterior expectations.** With p ~ Beta(a, b) (a prompt's probe and earlier draws), m further draws all fail with
probability E[(1 - p)^m] = B(a, b + m) / B(a, b) and all succeed with E[p^m] = B(a + m, b) / B(a, b)
(:func:`beta_power_mean`); both are convex and falling in m, so the conditional informative probability below is
concave in m too.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["informative_probability", "theorem1_gain", "beta_power_mean", "informative_given_probe",
           "p_population", "P_POPULATIONS"]


def _p(p) -> np.ndarray:
    p = np.asarray(p, dtype=np.float64)
    if np.any(~np.isfinite(p)) or np.any((p < 0) | (p > 1)):
        raise ValueError("p: got values outside [0, 1]; allowed: success probabilities in [0, 1]")
    return p


def _n(n) -> np.ndarray:
    n = np.asarray(n)
    if n.dtype.kind not in "iu" or np.any(n < 1):
        raise ValueError(f"n: got {n!r}; allowed: integers >= 1 (samples in the group)")
    return n


def informative_probability(p, n) -> np.ndarray:
    """s_N(p) = 1 - p^N - (1-p)^N [broadcast shape]: the chance that a group of N holds both outcomes."""
    p, n = _p(p), _n(n)
    return 1.0 - p ** n - (1.0 - p) ** n


def theorem1_gain(p, n) -> np.ndarray:
    """G_N(p) = 2 p^2 (1-p)^2 s_N(p): expected N * dQ_pos / lr of one group of N with mean-centred binary rewards
    (Theorem 1 with a correct and a wrong outcome; see the module docstring)."""
    p = _p(p)
    return 2.0 * p ** 2 * (1.0 - p) ** 2 * informative_probability(p, n)


def beta_power_mean(a: float, b: float, m: int) -> float:
    """E[p^m] for p ~ Beta(a, b): B(a + m, b) / B(a, b), through log-gamma (exact to float rounding for any m).
    E[(1 - p)^m] is ``beta_power_mean(b, a, m)``."""
    if not (a > 0 and b > 0):
        raise ValueError(f"a, b: got {a!r}, {b!r}; allowed: Beta parameters > 0")
    if m == 0:
        return 1.0
    return math.exp(math.lgamma(a + m) - math.lgamma(a) + math.lgamma(a + b) - math.lgamma(a + b + m))


def informative_given_probe(a: float, b: float, k: int, n0: int, m: int) -> float:
    """P(the group is informative after m more draws | k successes among the n0 probe draws), p ~ Beta(a, b) the
    posterior (probe included):

        0 < k < n0:  1                       (the probe already holds both outcomes)
        k = 0:       1 - E[(1 - p)^m]        (some later draw succeeds)
        k = n0:      1 - E[p^m]              (some later draw fails)
    """
    if 0 < k < n0:
        return 1.0
    return 1.0 - (beta_power_mean(b, a, m) if k == 0 else beta_power_mean(a, b, m))


#: populations of p over prompts for the notebook's widget: name -> what its parameters mean
P_POPULATIONS = {"beta": "p ~ Beta(a, b)",
                 "mixture": "a share `solved` at p = 1, a share `unsolved` at p = 0, the rest ~ Beta(a, b)"}


def p_population(kind: str, size: int, *, a: float = 0.5, b: float = 2.0, solved: float = 0.0,
                 unsolved: float = 0.0, seed: int = 0) -> np.ndarray:
    """``size`` prompt success rates [size] drawn from a population (:data:`P_POPULATIONS`), sorted ascending."""
    if kind not in P_POPULATIONS:
        raise ValueError(f"kind: got {kind!r}; allowed: {', '.join(P_POPULATIONS)}")
    if not (0 <= solved and 0 <= unsolved and solved + unsolved <= 1):
        raise ValueError(f"solved, unsolved: got {solved!r}, {unsolved!r}; allowed: shares >= 0 summing to <= 1")
    rng = np.random.default_rng(seed)
    p = rng.beta(a, b, size)
    if kind == "mixture":
        u = rng.random(size)
        p = np.where(u < solved, 1.0, np.where(u < solved + unsolved, 0.0, p))
    return np.sort(p)
