"""The study's two definitions of where BroRL's signal sits: *rare success* and s_N(p).

For a prompt the policy solves with probability p, a group of N samples is *informative* (some right, some wrong,
so dynamic sampling keeps it and its advantages are not all zero) with probability

    s_N(p) = 1 - p^N - (1 - p)^N                                           (:func:`s_n`)

and the expected dynamic-sampling pass rate over a set of prompts is the mean of s_N(p) (:func:`informative_share`;
BroRL Table 2: 41% at N = 16, 62% at N = 512).

A prompt has a **rare success** when 0 < p <= :data:`RARE_SUCCESS_MAX_P` = 1/16 (:func:`rare_success`). Why 1/16:
it is 1/N for the ProRL arm's N = 16, so such a prompt yields on average at most one correct sample per group of 16,
and a group of 16 is all wrong with probability (1 - p)^16 >= (15/16)^16 = 0.36: the correct answers a small N
often misses and a large N (512: all-wrong with probability <= 4e-15 at p = 1/16) does draw. The plateau's reach
gate, which chose the shipped checkpoint (data/plateau_model/PLATEAU.md), used this threshold. Before this constant
existed two study tables used 0.1 instead (the regime map's ``rare_success`` column, notebooks/figures/regime_map.csv,
and the mechanism summary's "share rare successes"); docs quoting those numbers say so.

Torch-free: imported by the plateau's gate, the mechanism's summary and the regime map alike.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from brorl_lab.study.recipe import ARM_TABLE

RARE_SUCCESS_MAX_P = 1 / ARM_TABLE["prorl"]["rollouts_per_prompt"]  # 1/N at the ProRL arm's N = 16 (module docstring)
RARE_FAILURE_MIN_P = 1 - RARE_SUCCESS_MAX_P  # the mirror case: near-solved prompts, 15/16 <= p < 1
#: Samples drawn per prompt to measure its pass rate p (study.mechanism.prompt_pass_rates): the BroRL arm's N, so
#: the whole draw is one BroRL group and its groups of the ProRL arm's N are ProRL groups.
DRAWS = ARM_TABLE["brorl"]["rollouts_per_prompt"]
ONLY_LARGE = f"only N={DRAWS}"  # the reach class a ProRL group mostly misses and a BroRL group keeps


def _rates(p, name: str = "p") -> np.ndarray:
    p = np.asarray(p, dtype=float)
    if p.size == 0 or not np.isfinite(p).all() or (p < 0).any() or (p > 1).any():
        raise ValueError(f"{name}: got {p.size} values; allowed: a non-empty list of pass rates in [0, 1]")
    return p


def rare_success(p: Sequence[float]) -> np.ndarray:
    """Per prompt: 0 < p <= :data:`RARE_SUCCESS_MAX_P` (a bool array shaped like ``p``)."""
    p = _rates(p)
    return (p > 0) & (p <= RARE_SUCCESS_MAX_P)


def rare_failure(p: Sequence[float]) -> np.ndarray:
    """Per prompt: :data:`RARE_FAILURE_MIN_P` <= p < 1, the near-solved mirror of :func:`rare_success`."""
    p = _rates(p)
    return (p >= RARE_FAILURE_MIN_P) & (p < 1)


def s_n(p, n: int):
    """s_N(p) = 1 - p^N - (1 - p)^N: the probability that a group of ``n`` samples of a prompt with pass rate ``p``
    is informative (element-wise on an array of p)."""
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"n: got {n!r}; allowed: an integer >= 1 (samples per group)")
    p = np.asarray(p, dtype=float)
    return 1 - p ** n - (1 - p) ** n


def informative_share(p: Sequence[float], n: int) -> float:
    """E[s_N(p)] = the mean of :func:`s_n` over the prompts' pass rates ``p``: the expected share of groups of ``n``
    samples that are neither all right nor all wrong."""
    return float(np.mean(s_n(_rates(p), n)))
