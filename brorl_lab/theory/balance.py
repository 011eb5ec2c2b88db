"""The mass balance of one RL step on one token position (BroRL, arXiv 2510.01180, Sec. 2 and App. C).

Setting (see ``docs/THEORY.md`` in the repository): a vocabulary of V tokens with probabilities ``p = softmax(z)``,
split into correct tokens P (reward ``r_c >= 0``) and incorrect tokens (reward ``r_w <= 0``). N tokens are drawn
i.i.d. from p; the *distinct* drawn tokens are A (correct) and B (incorrect), the never-drawn ones U (reward 0).
The linear surrogate ``L = -(1/N) sum_i R_i p_i`` gives, after one gradient step of size ``lr`` on the logits,

    dz_j = (lr/N) p_j (R_j - S_R),          S_R = r_c P_pos + r_w P_neg                (the batch's "mood")

and, to first order, Theorem 1 splits the change of the correct mass ``Q_pos`` into three terms

    dQ_pos = (lr/N) [ (r_c - S_R) Q_neg A_2                       sampled_correct    >= 0
                    + (S_R - r_w) Q_pos B_2                       sampled_incorrect  >= 0
                    + S_R (Q_pos U_neg2 - Q_neg U_pos2) ]         unsampled          either sign

with ``A_2 = sum_A p^2``, ``B_2 = sum_B p^2``, ``U_pos2 = sum_{U and P} p^2``, ``U_neg2 = sum_{U, incorrect} p^2``.

How the code is organised. Every term is *linear* in eight per-draw features

    f = [A_2, B_2, P_pos A_2, P_neg A_2, P_pos B_2, P_neg B_2, P_pos, P_neg]

(because ``U_pos2 = P_2 - A_2`` and ``U_neg2 = N_2 - B_2`` with constants ``P_2 = sum_P p^2``, ``N_2``), so
``terms = f @ K(r_c, r_w)`` for one [8, 4] matrix K (three terms and their total). One draw, a batch of Monte-Carlo
draws ``[T, 8]`` and the exact expectation ``E[f]`` all go through the same K. The total only needs the four linear
features, whose expectations are closed form with ``q_i = 1 - (1 - p_i)^N`` (O(V)); the three terms need the cross
features, i.e. pair probabilities ``E[I_i I_j]`` (O(V^2), small V) or Monte Carlo.

Everything here is numpy (float64) except :func:`paper_simulation`, which trains logits with ``torch.optim``.
No module here knows about engines, widgets or notebooks.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Optional

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from brorl_lab.core.registry import Registry
from brorl_lab.core.validation import is_finite_number

TERMS = ("sampled_correct", "sampled_incorrect", "unsampled")
TERMS_AND_TOTAL = TERMS + ("total",)
FEATURES = ("a2", "b2", "p_pos_a2", "p_neg_a2", "p_pos_b2", "p_neg_b2", "p_pos", "p_neg")
_SUM_TOL = 1e-6  # how far sum(p) may be from 1 before we refuse it (float32 softmax outputs pass)


# ---------------------------------------------------------------------------------------------------------------
# Validation: one clear ValueError per bad argument, naming it, its value and what is allowed.
# ---------------------------------------------------------------------------------------------------------------


def _probs(p, name: str = "p") -> np.ndarray:
    """Validate a probability vector and return it as float64 [V], renormalised to sum to exactly 1."""
    a = np.asarray(p, dtype=np.float64)
    if a.ndim != 1 or a.size < 2:
        raise ValueError(f"{name} must be a 1-D probability vector of length >= 2, got shape {a.shape}")
    if not np.all(np.isfinite(a)):
        raise ValueError(f"{name} must be finite, got {int((~np.isfinite(a)).sum())} NaN/inf entries")
    if a.min() < 0:
        raise ValueError(f"{name} must be non-negative, got min {a.min():.3g} at index {int(a.argmin())}")
    s = a.sum()
    if abs(s - 1.0) > _SUM_TOL:
        raise ValueError(f"{name} must sum to 1 (within {_SUM_TOL:g}), got sum {s:.9g}; pass softmax(logits)")
    return a / s


def _mask(correct, v: int, name: str = "correct") -> np.ndarray:
    a = np.asarray(correct)
    if a.shape != (v,):
        raise ValueError(f"{name} must be a boolean mask of shape ({v},) like p, got shape {a.shape}")
    if a.dtype != np.bool_:
        if not np.isin(a, (0, 1)).all():
            raise ValueError(f"{name} must be a boolean mask (True = correct token), got values outside {{0, 1}}")
        a = a.astype(bool)
    return a


def _count(n, name: str = "n", low: int = 1) -> int:
    if not (is_finite_number(n) and float(n).is_integer() and n >= low):
        raise ValueError(f"{name} must be an integer >= {low}, got {n!r}")
    return int(n)


def _n_grid(n_values, name: str = "n_values") -> np.ndarray:
    if np.ndim(n_values) == 0:
        n_values = [n_values]
    grid = np.array([_count(x, name) for x in n_values], dtype=np.int64)
    if grid.size == 0 or np.any(np.diff(grid) <= 0):
        raise ValueError(f"{name} must be a non-empty, strictly increasing list of integers >= 1, got {list(grid)}")
    return grid


def _rewards(r_c: float, r_w: float) -> tuple[float, float]:
    for name, val in (("r_c", r_c), ("r_w", r_w)):
        if not is_finite_number(val):
            raise ValueError(f"{name} must be a finite number, got {val!r}")
    if r_c < 0:
        raise ValueError(f"r_c (reward of a correct token) must be >= 0, got {r_c}")
    if r_w > 0:
        raise ValueError(f"r_w (reward of an incorrect token) must be <= 0, got {r_w}")
    return float(r_c), float(r_w)


def _positive(x: float, name: str) -> float:
    if not (is_finite_number(x) and x > 0):
        raise ValueError(f"{name} must be a finite number > 0, got {x!r}")
    return float(x)


def softmax(logits) -> np.ndarray:
    """p = softmax(z) in float64, shifted by max(z) so that large logits do not overflow."""
    z = np.asarray(logits, dtype=np.float64)
    if z.ndim != 1 or z.size < 2 or not np.all(np.isfinite(z)):
        raise ValueError(f"logits must be a finite 1-D vector of length >= 2, got shape {z.shape}")
    e = np.exp(z - z.max())
    return e / e.sum()


# ---------------------------------------------------------------------------------------------------------------
# Problems: a vocabulary (logits) and its correct set.
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class Problem:
    """One token position: logits z [V], the correct mask [V] and a name. ``p`` is softmax(z) in float64."""

    name: str
    logits: np.ndarray
    correct: np.ndarray
    p: np.ndarray = field(init=False, repr=False)

    def __post_init__(self):
        z = np.asarray(self.logits, dtype=np.float64)
        object.__setattr__(self, "logits", z)
        object.__setattr__(self, "p", softmax(z))
        object.__setattr__(self, "correct", _mask(self.correct, z.size))
        if not self.correct.any() or self.correct.all():
            raise ValueError(f"correct must mark at least one correct and one incorrect token, "
                             f"got {int(self.correct.sum())} correct of {z.size}")

    @property
    def vocab(self) -> int:
        return self.p.size

    @property
    def q_pos(self) -> float:
        return float(self.p[self.correct].sum())

    def summary(self) -> dict:
        """Plain numbers for a table: V, |P|, Q_pos, P_2 = sum_P p^2, N_2 = sum_N p^2, max p."""
        p2 = self.p**2
        return {"problem": self.name, "vocab": self.vocab, "n_correct": int(self.correct.sum()),
                "q_pos": self.q_pos, "p2_pos": float(p2[self.correct].sum()),
                "p2_neg": float(p2[~self.correct].sum()), "p_max": float(self.p.max())}


PROBLEMS = Registry("theory problem")


@PROBLEMS.register("paper")
def paper_problem(vocab: int = 128_000, n_correct: int = 10_000, *, seeding: bool = True,
                  correct_logit: float = 3.0, anchor_logit: float = 5.0, anchor_correct: bool = True) -> Problem:
    """The vocabulary of the paper's simulation (Sec. 4.1): V tokens, the first ``n_correct`` correct.

    Unseeded, all logits are 0 (Q_pos = n_correct / V ~ 0.078). Seeded, correct tokens get ``correct_logit`` = 3 and
    one anchor token gets ``anchor_logit`` = 5 (Q_pos ~ 0.630 at the paper's sizes). Whether the anchor is a correct
    token is not reported; ``anchor_correct`` picks (index 0 if correct, else index ``n_correct``).
    """
    vocab, n_correct = _count(vocab, "vocab", 2), _count(n_correct, "n_correct")
    if n_correct >= vocab:
        raise ValueError(f"n_correct must be < vocab ({vocab}), got {n_correct}")
    correct = np.zeros(vocab, dtype=bool)
    correct[:n_correct] = True
    z = np.zeros(vocab)
    if seeding:
        z[:n_correct] = correct_logit
        z[0 if anchor_correct else n_correct] = anchor_logit
    return Problem(f"paper({'seeded' if seeding else 'unseeded'}, V={vocab}, |P|={n_correct})", z, correct)


PLACEMENTS = ("head", "tail", "random")


@PROBLEMS.register("zipf")
def zipf_problem(vocab: int = 128_000, n_correct: int = 10_000, *, exponent: float = 1.0, placement: str = "head",
                 seed: int = 0) -> Problem:
    """A Zipf-like vocabulary, p_rank ~ rank^(-exponent) (exponent 0 is uniform).

    ``placement`` puts the correct tokens among the most likely ("head": the model is mostly right), the least
    likely ("tail": the model is confidently wrong, correct answers hide in the unexplored tail) or at random ranks.
    """
    vocab, n_correct = _count(vocab, "vocab", 2), _count(n_correct, "n_correct")
    if n_correct >= vocab:
        raise ValueError(f"n_correct must be < vocab ({vocab}), got {n_correct}")
    if not (math.isfinite(exponent) and exponent >= 0):
        raise ValueError(f"exponent must be a finite number >= 0, got {exponent!r}")
    z = -float(exponent) * np.log(np.arange(1, vocab + 1, dtype=np.float64))  # ranks 1..V, most likely first
    correct = np.zeros(vocab, dtype=bool)
    if placement == "head":
        correct[:n_correct] = True
    elif placement == "tail":
        correct[vocab - n_correct:] = True
    elif placement == "random":
        correct[np.random.default_rng(seed).choice(vocab, n_correct, replace=False)] = True
    else:
        raise ValueError(f"placement must be one of {PLACEMENTS}, got {placement!r}")
    return Problem(f"zipf(s={exponent:g}, {placement}, V={vocab}, |P|={n_correct})", z, correct)


@PROBLEMS.register("logits")
def logit_problem(logits, correct, *, name: str = "custom logits") -> Problem:
    """A user-given logit vector [V] and correct mask [V] (e.g. one position of a real model's output)."""
    return Problem(name, np.asarray(logits, dtype=np.float64), correct)


# ---------------------------------------------------------------------------------------------------------------
# Results and the shared linear map features -> terms.
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MassBalance:
    """The three Theorem 1 terms of dQ_pos and their total, *including* the lr/N prefactor.

    ``method`` says where the numbers come from: "draw" (one draw), "exact" (exact expectation, pair
    probabilities), "monte_carlo" (terms are means over ``trials`` draws, ``*_se`` their standard errors; the total
    is still the exact closed form) or "total" (closed-form total only, terms NaN).
    """

    sampled_correct: float
    sampled_incorrect: float
    unsampled: float
    total: float
    n: int
    lr: float
    method: str = "draw"
    trials: int = 0
    sampled_correct_se: float = 0.0
    sampled_incorrect_se: float = 0.0
    unsampled_se: float = 0.0
    total_se: float = 0.0

    def normalised(self) -> dict:
        """The terms as N * dQ / lr (the bracket of Theorem 1), comparable across N and lr."""
        k = self.n / self.lr
        return {t: getattr(self, t) * k for t in TERMS_AND_TOTAL}

    def as_dict(self) -> dict:
        return asdict(self)

    def to_frame(self) -> pd.DataFrame:
        return pd.DataFrame([self.as_dict()])


class _Vocab:
    """What every computation on one (p, correct) pair reuses. Shapes: [V] unless noted."""

    __slots__ = ("p", "correct", "q_pos", "q_neg", "p2_pos", "p2_neg", "weights", "_cdf")

    def __init__(self, p, correct):
        self.p = _probs(p)
        self.correct = _mask(correct, self.p.size)
        pos, neg = self.p * self.correct, self.p * ~self.correct
        # [4, V] rows p*P, p*N, p^2*P, p^2*N: a drawn set's (P_pos, P_neg, A_2, B_2) is a column sum. Row-major
        # [4, V] keeps `weights @ x` a fast BLAS call (a [V, 4] layout is ~50x slower here).
        self.weights = np.stack([pos, neg, pos * self.p, neg * self.p])
        self.q_pos, self.q_neg = float(pos.sum()), float(neg.sum())
        self.p2_pos, self.p2_neg = float(self.weights[2].sum()), float(self.weights[3].sum())
        self._cdf = None

    @property
    def cdf(self) -> np.ndarray:
        """cumsum(p) with the last entry exactly 1, built on first use (only samplers need it)."""
        if self._cdf is None:
            self._cdf = np.cumsum(self.p)
            self._cdf /= self._cdf[-1]
        return self._cdf


def _term_matrix(v: _Vocab, r_c: float, r_w: float) -> np.ndarray:
    """K [8, 4] with [sampled_correct, sampled_incorrect, unsampled, total] = f @ K (bracket, no lr/N).

    T1 = (r_c - S) Q_neg A_2            = Q_neg (r_c A_2 - r_c P_pos A_2 - r_w P_neg A_2)
    T2 = (S - r_w) Q_pos B_2            = Q_pos (r_c P_pos B_2 + r_w P_neg B_2 - r_w B_2)
    T3 = S (Q_pos (N_2 - B_2) - Q_neg (P_2 - A_2))
       = S (Q_pos N_2 - Q_neg P_2) - Q_pos S B_2 + Q_neg S A_2,   S = r_c P_pos + r_w P_neg
    """
    qp, qn, c = v.q_pos, v.q_neg, v.q_pos * v.p2_neg - v.q_neg * v.p2_pos
    k = np.zeros((len(FEATURES), 4))
    a2, b2, pa, na, pb, nb, pp, pn = range(8)
    k[a2, 0], k[pa, 0], k[na, 0] = qn * r_c, -qn * r_c, -qn * r_w
    k[b2, 1], k[pb, 1], k[nb, 1] = -qp * r_w, qp * r_c, qp * r_w
    k[pp, 2], k[pn, 2] = c * r_c, c * r_w
    k[pb, 2], k[nb, 2], k[pa, 2], k[na, 2] = -qp * r_c, -qp * r_w, qn * r_c, qn * r_w
    k[:, 3] = k[:, :3].sum(axis=1)  # the cross features cancel here: the total is linear in the draw
    return k


def _features(sums: np.ndarray) -> np.ndarray:
    """[..., 4] drawn-set sums (P_pos, P_neg, A_2, B_2) -> [..., 8] features in the order of FEATURES."""
    pp, pn, a2, b2 = np.moveaxis(sums, -1, 0)
    return np.stack([a2, b2, pp * a2, pn * a2, pp * b2, pn * b2, pp, pn], axis=-1)


# ---------------------------------------------------------------------------------------------------------------
# One draw: Theorem 1, the logit update and the exact softmax change.
# ---------------------------------------------------------------------------------------------------------------


def _drawn_mask(sampled, v: int, n: Optional[int]) -> tuple[np.ndarray, int]:
    """A bool mask of distinct drawn tokens (needs ``n``) or integer counts (``n`` inferred) -> (mask [V], N)."""
    s = np.asarray(sampled)
    if s.shape != (v,):
        raise ValueError(f"sampled must have shape ({v},) like p (a bool mask or integer counts), got {s.shape}")
    if s.dtype == np.bool_:
        if n is None:
            raise ValueError("n (the number of draws N) is required when sampled is a boolean mask")
        n = _count(n)
        if n < s.sum():
            raise ValueError(f"n must be >= the number of distinct drawn tokens ({int(s.sum())}), got {n}")
        return s, n
    if not np.issubdtype(s.dtype, np.integer):
        raise ValueError(f"sampled must be a boolean mask or an integer count vector, got dtype {s.dtype}")
    if s.min() < 0:
        raise ValueError(f"sampled counts must be >= 0, got min {int(s.min())}")
    total = int(s.sum())
    if n is not None and _count(n) != total:
        raise ValueError(f"n must equal sampled.sum() = {total} when sampled holds counts, got {n}")
    return s > 0, _count(total, "sampled.sum()")


def mass_balance(p, correct, sampled, *, r_c: float = 1.0, r_w: float = -1.0, lr: float = 1.0,
                 n: Optional[int] = None) -> MassBalance:
    """Theorem 1 for one draw: the three terms of dQ_pos (with the lr/N factor) and their total.

    ``sampled`` is the bool mask of the distinct tokens drawn (then ``n`` = N is required) or the integer count
    vector of the N draws (N = counts.sum()). Only *which* tokens were drawn matters: the update
    dz_j = (lr/N) p_j (R_j - S_R) rewards a distinct token once, however often it was drawn.
    """
    v = _Vocab(p, correct)
    r_c, r_w, lr = *_rewards(r_c, r_w), _positive(lr, "lr")
    drawn, n = _drawn_mask(sampled, v.p.size, n)
    terms = _features(v.weights @ drawn) @ _term_matrix(v, r_c, r_w) * (lr / n)  # [4]
    return MassBalance(*map(float, terms), n=n, lr=lr, method="draw")


@dataclass(frozen=True)
class Moments:
    """The masses and second moments Theorem 1 is written in, for one draw (see THEORY.md)."""

    q_pos: float
    q_neg: float
    p_pos: float
    p_neg: float
    a2: float
    b2: float
    u_pos2: float
    u_neg2: float
    s_r: float


def moments(p, correct, sampled, *, r_c: float = 1.0, r_w: float = -1.0, n: Optional[int] = None) -> Moments:
    """Q_pos, Q_neg, P_pos, P_neg, A_2, B_2, U_pos2, U_neg2 and S_R = r_c P_pos + r_w P_neg of one draw."""
    v = _Vocab(p, correct)
    r_c, r_w = _rewards(r_c, r_w)
    drawn, _ = _drawn_mask(sampled, v.p.size, n)
    pp, pn, a2, b2 = v.weights @ drawn
    return Moments(v.q_pos, v.q_neg, float(pp), float(pn), float(a2), float(b2), v.p2_pos - a2, v.p2_neg - b2,
                   r_c * pp + r_w * pn)


def logit_update(p, correct, sampled, *, r_c: float = 1.0, r_w: float = -1.0, lr: float = 1.0,
                 n: Optional[int] = None) -> np.ndarray:
    """dz [V] of one gradient step on L = -(1/N) sum_i R_i p_i: dz_j = (lr/N) p_j (R_j - S_R), R = 0 off the draw."""
    v = _Vocab(p, correct)
    r_c, r_w, lr = *_rewards(r_c, r_w), _positive(lr, "lr")
    drawn, n = _drawn_mask(sampled, v.p.size, n)
    reward = np.where(drawn, np.where(v.correct, r_c, r_w), 0.0)  # [V]
    return (lr / n) * v.p * (reward - reward @ v.p)


def softmax_delta_q(p, correct, dz) -> float:
    """The exact change of Q_pos when the logits move by dz [V]: Q_pos(softmax(z + dz)) - Q_pos(softmax(z)).

    Written without cancellation: with a = sum_P p (e^dz - 1), b = sum_N p (e^dz - 1),
    dQ = (Q_neg a - Q_pos b) / (1 + a + b), so a change of 1e-12 is still accurate to many digits.
    """
    v = _Vocab(p, correct)
    dz = np.asarray(dz, dtype=np.float64)
    if dz.shape != v.p.shape or not np.all(np.isfinite(dz)):
        raise ValueError(f"dz must be a finite vector of shape {v.p.shape}, got shape {dz.shape}")
    g = v.p * np.expm1(dz)  # [V]
    a, b = g[v.correct].sum(), g[~v.correct].sum()
    return float((v.q_neg * a - v.q_pos * b) / (1.0 + a + b))


# ---------------------------------------------------------------------------------------------------------------
# Sampling: nested draws on a grid of N, one trial at a time (Python loops over trials and grid points only).
# ---------------------------------------------------------------------------------------------------------------


def _draw(rng: np.random.Generator, p: np.ndarray, cdf: np.ndarray, m: int) -> tuple[np.ndarray, np.ndarray]:
    """m i.i.d. draws from p [V] (cdf [V] = cumsum(p), last entry 1) -> (sorted distinct token ids, their counts).

    Small m: m sorted uniforms (normalised exponential spacings, O(m)) looked up in the cdf in order, which is
    cache friendly. Large m (> V): numpy's multinomial, O(V).
    """
    if m > p.size:
        counts = rng.multinomial(m, p)  # [V]
        idx = np.flatnonzero(counts)
        return idx, counts[idx]
    gaps = np.cumsum(rng.standard_exponential(m + 1))  # [m + 1]
    tok = np.searchsorted(cdf, gaps[:-1] / gaps[-1], side="right")  # [m], sorted
    starts = np.flatnonzero(np.diff(tok, prepend=-1))
    return tok[starts], np.diff(starts, append=m)


def _nested_sums(v: _Vocab, grid: np.ndarray, trials: int, seed, progress: bool = False) -> np.ndarray:
    """[T, G, 4] sums (P_pos, P_neg, A_2, B_2) over the distinct tokens among the first grid[g] draws of a stream.

    The grid points of one trial share their draws (the draws for N=8 are the first 8 of those for N=16), so each
    N has the right marginal law while a whole sweep costs the draws of its largest N.
    """
    rng = np.random.default_rng(seed)
    seen = np.zeros(v.p.size, dtype=bool)
    out = np.zeros((trials, grid.size, 4))
    steps = np.diff(grid, prepend=0)
    for t in tqdm(range(trials), desc="draws", disable=not progress, leave=False):
        touched = []
        for g, m in enumerate(steps):
            idx, _ = _draw(rng, v.p, v.cdf, int(m))
            new = idx[~seen[idx]]
            seen[new] = True
            touched.append(new)
            out[t, g] = v.weights[:, new].sum(axis=1)
        seen[np.concatenate(touched)] = False
    return np.cumsum(out, axis=1)


# ---------------------------------------------------------------------------------------------------------------
# Expectations: closed-form total, exact pair terms, Monte Carlo.
# ---------------------------------------------------------------------------------------------------------------


def _miss(p: np.ndarray, n) -> np.ndarray:
    """(1 - p)^N, the chance a token is never drawn, as exp(N log1p(-p)); broadcasts n [G, 1] against p [V]."""
    with np.errstate(divide="ignore"):
        return np.exp(np.asarray(n, dtype=np.float64) * np.log1p(-p))


def _linear_expectations(v: _Vocab, grid: np.ndarray) -> np.ndarray:
    """[G, 4] exact E[(P_pos, P_neg, A_2, B_2)] with q_i = 1 - (1 - p_i)^N = -expm1(N log1p(-p_i))."""
    with np.errstate(divide="ignore"):
        q = -np.expm1(grid[:, None].astype(np.float64) * np.log1p(-v.p))  # [G, V]
    return q @ v.weights.T  # [G, 4]


def expected_total(p, correct, n_values, *, r_c: float = 1.0, r_w: float = -1.0, lr: float = 1.0,
                   normalised: bool = False) -> np.ndarray:
    """Exact E[dQ_pos] on a grid of N, O(V) per N (THEORY.md, "Exact expectation"):

        E[dQ_pos] = (lr/N) [ r_c Q_neg sum_P p^2 q - r_w Q_pos sum_N p^2 q
                             - (r_c sum_P p q + r_w sum_N p q)(Q_neg P_2 - Q_pos N_2) ],   q = 1 - (1-p)^N

    Returns [G] (a float array even for one N); ``normalised`` returns N E[dQ_pos] / lr instead.
    """
    v = _Vocab(p, correct)
    r_c, r_w, lr = *_rewards(r_c, r_w), _positive(lr, "lr")
    grid = _n_grid(n_values)
    bracket = _features(_linear_expectations(v, grid)) @ _term_matrix(v, r_c, r_w)[:, 3]  # [G]
    return bracket if normalised else bracket * lr / grid


def _exact_features(v: _Vocab, n: int, chunk: int = 256) -> np.ndarray:
    """[8] exact E[f] at one N from pair probabilities, O(V^2) time in [chunk, V] blocks.

    E[I_i I_j] = q_i q_j + C_ij with the covariance of the "drawn" indicators written without cancellation,
    C_ij = (1-p_i-p_j)^N - (1-p_i)^N (1-p_j)^N = -(1-p_i-p_j)^N expm1(N log1p(p_i p_j / (1-p_i-p_j)))  (i != j)
    and C_ii = q_i (1 - q_i). The cross features need m = E[I I^T] @ [p*P, p*N]  [V, 2].
    """
    p = v.p
    with np.errstate(divide="ignore"):
        log_miss = n * np.log1p(-p)  # [V]
    a, q = np.exp(log_miss), -np.expm1(log_miss)  # missed / drawn probabilities, q accurate for N p << 1
    rhs = v.weights[:2].T  # [V, 2]
    m = np.outer(q, q @ rhs)  # [V, 2], the independent part q q^T rhs
    for s in range(0, p.size, chunk):
        pi = p[s:s + chunk, None]  # [c, 1]
        rest = np.clip(1.0 - pi - p[None, :], 0.0, 1.0)  # [c, V]
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            log_rest, y = n * np.log(rest), n * np.log1p(pi * p[None, :] / rest)
            # expm1 keeps small y accurate; for y >= 1 there is no cancellation and e^(log_rest + y) stays finite
            cov = -np.where(y < 1, np.exp(log_rest) * np.expm1(np.minimum(y, 1)),
                            np.exp(log_rest + y) - np.exp(log_rest))
        # rest == 0 (p_i + p_j = 1): the pair can never both be missed, C_ij = -(1-p_i)^N (1-p_j)^N
        cov = np.where(rest > 0, cov, -a[s:s + chunk, None] * a[None, :])
        rows = np.arange(s, min(s + chunk, p.size))
        cov[rows - s, rows] = q[rows] * a[rows]
        m[rows] += cov @ rhs
    pp, pn = m[:, 0], m[:, 1]
    a2w, b2w = v.weights[2], v.weights[3]
    lin = v.weights @ q  # E[P_pos], E[P_neg], E[A_2], E[B_2]
    return np.array([lin[2], lin[3], a2w @ pp, a2w @ pn, b2w @ pp, b2w @ pn, lin[0], lin[1]])


TERM_METHODS = ("auto", "exact", "monte_carlo", "total")


def expected_mass_balance(p, correct, n: int, *, r_c: float = 1.0, r_w: float = -1.0, lr: float = 1.0,
                          terms: str = "auto", exact_max_vocab: int = 2048, trials: int = 1000,
                          seed: int = 0) -> MassBalance:
    """E[dQ_pos] and its three terms over the N draws, with the lr/N factor.

    The total is always exact and closed form (O(V): V=128,000, N=10^6 takes 1.5-6 ms on one shared core).
    ``terms`` picks how the three terms are computed: "exact" (pair probabilities, O(V^2)), "monte_carlo"
    (``trials`` draws, with ``*_se``), "total" (skip them: NaN) or "auto" (exact when V <= ``exact_max_vocab``,
    else Monte Carlo).
    """
    v = _Vocab(p, correct)
    r_c, r_w, lr, n = *_rewards(r_c, r_w), _positive(lr, "lr"), _count(n)
    if terms not in TERM_METHODS:
        raise ValueError(f"terms must be one of {TERM_METHODS}, got {terms!r}")
    if terms == "auto":
        terms = "exact" if v.p.size <= exact_max_vocab else "monte_carlo"
    k = _term_matrix(v, r_c, r_w) * (lr / n)  # [8, 4]
    total = float(_features(_linear_expectations(v, np.array([n])))[0] @ k[:, 3])
    if terms == "total":
        return MassBalance(math.nan, math.nan, math.nan, total, n=n, lr=lr, method="total")
    if terms == "exact":
        t = _exact_features(v, n) @ k
        return MassBalance(*map(float, t[:3]), total, n=n, lr=lr, method="exact")
    trials = _count(trials, "trials", 2)
    per_trial = _features(_nested_sums(v, np.array([n]), trials, seed)[:, 0]) @ k  # [T, 4]
    mean, se = per_trial.mean(axis=0), per_trial.std(axis=0, ddof=1) / math.sqrt(trials)
    return MassBalance(*map(float, mean[:3]), total, n=n, lr=lr, method="monte_carlo", trials=trials,
                       **{f"{t}_se": float(s) for t, s in zip(TERMS, se[:3])})


def large_n_limit(p, correct, *, r_c: float = 1.0, r_w: float = -1.0) -> float:
    """lim_{N -> inf} N dQ_pos / lr = (r_c - r_w)(Q_neg^2 P_2 + Q_pos^2 N_2) >= 0 (Lemma 2: every token drawn)."""
    v = _Vocab(p, correct)
    r_c, r_w = _rewards(r_c, r_w)
    return (r_c - r_w) * (v.q_neg**2 * v.p2_pos + v.q_pos**2 * v.p2_neg)


def unsampled_second_moment(p, correct, n_values) -> pd.DataFrame:
    """Lemma 2: E[sum_U p^2] = sum_i p_i^2 (1 - p_i)^N per N, split into correct and incorrect tokens.

    Also the expected fraction of correct tokens left undrawn, mean_P (1 - p_i)^N. For the seeded paper vocabulary
    at N=512 it is 0.968: derived here from the paper's setting, not a number the paper reports.
    """
    v = _Vocab(p, correct)
    grid = _n_grid(n_values)
    miss = _miss(v.p, grid[:, None])  # [G, V]
    u = miss @ v.weights[2:].T  # [G, 2]
    return pd.DataFrame({"n": grid, "u2": u.sum(axis=1), "u_pos2": u[:, 0], "u_neg2": u[:, 1],
                         "undrawn_correct_frac": miss[:, v.correct].mean(axis=1)})


# ---------------------------------------------------------------------------------------------------------------
# Monte Carlo over a grid of N: the draws are kept (rewards can change without redrawing).
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class DrawSums:
    """Nested Monte-Carlo draws of one problem on a grid of N: ``sums`` [T, G, 4] = (P_pos, P_neg, A_2, B_2).

    They do not depend on rewards or lr, so :meth:`terms` re-prices them for any (r_c, r_w) in O(T G).
    """

    vocab: _Vocab = field(repr=False)
    n_values: np.ndarray
    sums: np.ndarray = field(repr=False)

    @property
    def trials(self) -> int:
        return self.sums.shape[0]

    def terms(self, *, r_c: float = 1.0, r_w: float = -1.0) -> np.ndarray:
        """[T, G, 4] normalised terms N dQ / lr: sampled_correct, sampled_incorrect, unsampled, total."""
        return _features(self.sums) @ _term_matrix(self.vocab, *_rewards(r_c, r_w))

    def to_frame(self, *, r_c: float = 1.0, r_w: float = -1.0) -> pd.DataFrame:
        """Long table, one row per (n, trial), columns n, trial and the four normalised terms."""
        t = self.terms(r_c=r_c, r_w=r_w)
        n_t, n_g = t.shape[:2]
        df = pd.DataFrame(t.reshape(-1, 4), columns=list(TERMS_AND_TOTAL))
        df.insert(0, "trial", np.repeat(np.arange(n_t), n_g))
        df.insert(0, "n", np.tile(self.n_values, n_t))
        return df


def draw_sums(p, correct, n_values, *, trials: int = 400, seed: int = 0, progress: bool = False) -> DrawSums:
    """Draw ``trials`` nested streams of max(n_values) tokens and keep each N's drawn-set sums."""
    v = _Vocab(p, correct)
    grid = _n_grid(n_values)
    return DrawSums(v, grid, _nested_sums(v, grid, _count(trials, "trials", 2), seed, progress))


def summarise_sweep(draws: DrawSums, *, r_c: float = 1.0, r_w: float = -1.0,
                    exact_max_vocab: int = 0) -> pd.DataFrame:
    """One row per N: expected normalised terms (N E[dQ]/lr) with standard errors, P(dQ_pos < 0) with its standard
    error, the Lemma 2 second moments and the expected undrawn share of correct tokens.

    The total is exact (closed form); the three terms are Monte-Carlo means unless V <= ``exact_max_vocab``, where
    they are exact (pair probabilities, then ``*_se`` = 0). ``p_neg`` is the share of draws with dQ_pos < 0.
    """
    v, grid = draws.vocab, draws.n_values
    r_c, r_w = _rewards(r_c, r_w)
    k = _term_matrix(v, r_c, r_w)
    t = _features(draws.sums) @ k  # [T, G, 4]
    mean, se = t.mean(axis=0), t.std(axis=0, ddof=1) / math.sqrt(draws.trials)  # [G, 4]
    if v.p.size <= exact_max_vocab:
        mean = np.stack([_exact_features(v, int(n)) for n in grid]) @ k
        se = np.zeros_like(se)
    mean[:, 3] = _features(_linear_expectations(v, grid)) @ k[:, 3]
    se[:, 3] = 0.0
    neg = (t[..., 3] < 0).mean(axis=0)  # [G]
    df = pd.DataFrame({"n": grid, **{c: mean[:, i] for i, c in enumerate(TERMS_AND_TOTAL)},
                       **{f"{c}_se": se[:, i] for i, c in enumerate(TERMS)},
                       "p_neg": neg, "p_neg_se": np.sqrt(neg * (1 - neg) / draws.trials)})
    lemma = unsampled_second_moment(v.p, v.correct, grid)
    return df.merge(lemma, on="n")


def n_sweep(p, correct, n_values, *, r_c: float = 1.0, r_w: float = -1.0, trials: int = 400, seed: int = 0,
            exact_max_vocab: int = 0, progress: bool = False) -> pd.DataFrame:
    """The N-sweep table (see :func:`summarise_sweep`) for one problem, drawing fresh Monte-Carlo samples."""
    draws = draw_sums(p, correct, n_values, trials=trials, seed=seed, progress=progress)
    return summarise_sweep(draws, r_c=r_c, r_w=r_w, exact_max_vocab=exact_max_vocab)


# ---------------------------------------------------------------------------------------------------------------
# simulate: first order vs exact, draw by draw.
# ---------------------------------------------------------------------------------------------------------------


def simulate(p, correct, n: int, trials: int, *, seed: int, r_c: float = 1.0, r_w: float = -1.0,
             lr: float = 1.0, progress: bool = False) -> pd.DataFrame:
    """``trials`` independent draws of N tokens, one row each: the Theorem 1 terms (with lr/N), their total, and
    ``exact_total``, the true change of Q_pos after the step dz_j = (lr/N) p_j (R_j - S_R).

    Also ``s_r`` (S_R), ``p_pos``, ``p_neg`` and ``n_distinct`` (how many distinct tokens were drawn).
    """
    v = _Vocab(p, correct)
    r_c, r_w, lr = *_rewards(r_c, r_w), _positive(lr, "lr")
    n, trials = _count(n), _count(trials, "trials")
    rng = np.random.default_rng(seed)
    k = _term_matrix(v, r_c, r_w) * (lr / n)
    reward = np.where(v.correct, r_c, r_w)  # [V], reward if drawn
    rows = []
    for t in tqdm(range(trials), desc="simulate", disable=not progress, leave=False):
        idx, _ = _draw(rng, v.p, v.cdf, n)
        sums = v.weights[:, idx].sum(axis=1)  # P_pos, P_neg, A_2, B_2
        s_r = r_c * sums[0] + r_w * sums[1]
        dz = -(lr / n) * s_r * v.p  # [V], unsampled tokens
        dz[idx] = (lr / n) * v.p[idx] * (reward[idx] - s_r)
        g = v.p * np.expm1(dz)  # [V], same cancellation-free form as softmax_delta_q
        a, b = g[v.correct].sum(), g[~v.correct].sum()
        rows.append([t, *(_features(sums) @ k), (v.q_neg * a - v.q_pos * b) / (1 + a + b), s_r, *sums[:2],
                     idx.size])
    return pd.DataFrame(rows, columns=["trial", *TERMS_AND_TOTAL, "exact_total", "s_r", "p_pos", "p_neg",
                                       "n_distinct"]).astype({"trial": int, "n_distinct": int})


# ---------------------------------------------------------------------------------------------------------------
# The paper's simulation (Sec. 4.1, Fig. 3): many AdamW steps on the logits of the seeded vocabulary.
# ---------------------------------------------------------------------------------------------------------------

OPTIMIZERS = Registry("theory optimizer")
OPTIMIZERS.register("adamw", "AdamW")
OPTIMIZERS.register("adam", "Adam")
OPTIMIZERS.register("sgd", "SGD")


def paper_simulation(n: int, *, steps: int = 1000, vocab: int = 128_000, n_correct: int = 10_000,
                     seeding: bool = True, lr: float = 1e-3, seed: int = 0, optimizer: str = "adamw",
                     betas: tuple[float, float] = (0.9, 0.999), weight_decay: float = 0.01, eps: float = 1e-8,
                     anchor_correct: bool = True, r_c: float = 1.0, r_w: float = -1.0,
                     problem: Optional[Problem] = None, gradient: bool = True,
                     record_every: int = 1, progress: bool = False) -> pd.DataFrame:
    """Reproduce the paper's "relaxed" simulation: train V free logits by RL on one token position.

    Each step draws N tokens a_1..a_N i.i.d. (with repeats) from p = softmax(z), centres their rewards by the batch
    mean and takes one optimizer step on the surrogate

        L(z) = -(1/N) sum_j (R_{a_j} - mean R) p_{a_j}(z)                                     (a scalar)

    Defaults are the paper's (V=128,000, |P|=10,000, rewards +-1, AdamW lr 1e-3, 1000 steps). Not reported there,
    so parameters here: ``seed``; AdamW ``betas``/``weight_decay``/``eps`` (PyTorch's defaults); whether the z=5
    anchor is correct (``anchor_correct``). ``problem`` replaces the seeded vocabulary by any :class:`Problem`.

    ``weight_decay=0.01`` is a choice, not the paper's: it is torch's AdamW default (so probably what the paper
    ran), but the paper does not report it, and it moves Q_pos on its own: AdamW's decoupled decay multiplies the
    logits by (1 - lr * weight_decay) every step, flattening p towards uniform. On the seeded vocabulary that alone
    takes Q_pos from 0.6301 to 0.6231 in 1000 steps, as large as the effects of Fig. 3. ``gradient=False`` runs
    that baseline (the same optimizer on a zero gradient, no draws; the ``unsampled_*`` columns are NaN), and
    ``weight_decay=0`` removes the decay, so the drift due to sampling and the drift due to decay separate.

    Returns one row per recorded step (step 0 = the start): ``q_pos``; ``frac_correct_improved``, the share of
    correct tokens whose probability is above its step-0 value; ``worst_correct_drop``, max over correct tokens of
    p_i(0) - p_i(t) clipped at 0 ("knowledge shrinkage"); and this step's unsampled shares: ``unsampled_frac`` (of
    the vocabulary), ``unsampled_correct_frac`` (of the correct tokens) and ``unsampled_mass`` (probability mass).
    """
    import torch  # only this function needs torch

    n, steps = _count(n), _count(steps, "steps")
    record_every = _count(record_every, "record_every")
    if not isinstance(gradient, bool):
        raise ValueError(f"gradient: got {gradient!r}; allowed: True (RL steps) or False (the decay-only baseline)")
    if isinstance(weight_decay, bool) or not (isinstance(weight_decay, (int, float, np.number))
                                              and math.isfinite(weight_decay) and weight_decay >= 0):
        raise ValueError(f"weight_decay must be a finite number >= 0, got {weight_decay!r}")
    r_c, r_w, lr = *_rewards(r_c, r_w), _positive(lr, "lr")
    if problem is None:
        problem = paper_problem(vocab, n_correct, seeding=seeding, anchor_correct=anchor_correct)
    opt_cls = getattr(torch.optim, OPTIMIZERS.get(optimizer))
    hyper = {"lr": lr} if optimizer == "sgd" else {"lr": lr, "betas": tuple(betas), "eps": eps}
    if optimizer == "adamw":
        hyper["weight_decay"] = weight_decay
    correct = problem.correct
    correct_t = torch.from_numpy(correct)
    reward = np.where(correct, r_c, r_w)  # [V]
    z = torch.tensor(problem.logits, dtype=torch.float64, requires_grad=True)  # [V]
    opt = opt_cls([z], **hyper)
    rng = np.random.default_rng(seed)
    p0 = torch.softmax(z.detach(), 0)[correct_t]  # [|P|], step-0 probabilities of the correct tokens
    rows = [(0, problem.q_pos, 0.0, 0.0, math.nan, math.nan, math.nan)]
    for step in tqdm(range(1, steps + 1), desc=f"N={n}", disable=not progress, leave=False):
        if not gradient:  # the decay-only baseline: the optimizer steps on a zero gradient
            opt.zero_grad(set_to_none=False)
            z.grad = torch.zeros_like(z)
            opt.step()
            if step % record_every == 0 or step == steps:
                with torch.no_grad():
                    pc = torch.softmax(z, 0)[correct_t]
                    rows.append((step, float(pc.sum()), float((pc > p0).double().mean()),
                                 max(0.0, float((p0 - pc).max())), math.nan, math.nan, math.nan))
            continue
        probs = torch.softmax(z, 0)  # [V], in the graph
        p_now = probs.detach().numpy()
        cdf = np.cumsum(p_now)
        idx, counts = _draw(rng, p_now, cdf / cdf[-1], n)  # distinct drawn tokens and their multiplicities
        centred = reward[idx] - (counts @ reward[idx]) / n  # [|drawn|]
        w = torch.zeros_like(z)
        w[idx] = torch.from_numpy(counts * centred)  # [V], sum over draws of centred reward, per token
        loss = -(w * probs).sum() / n
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step % record_every == 0 or step == steps:
            with torch.no_grad():
                pc = torch.softmax(z, 0)[correct_t]
                rows.append((step, float(pc.sum()), float((pc > p0).double().mean()),
                             max(0.0, float((p0 - pc).max())), 1 - idx.size / p_now.size,
                             1 - int(correct[idx].sum()) / int(correct.sum()), 1.0 - float(p_now[idx].sum())))
    df = pd.DataFrame(rows, columns=["step", "q_pos", "frac_correct_improved", "worst_correct_drop",
                                     "unsampled_frac", "unsampled_correct_frac", "unsampled_mass"])
    df.insert(0, "n", n)
    return df


def paper_simulations(n_values: Sequence[int] = (4, 8, 16, 512, 51200), *, progress: bool = True,
                      **kwargs) -> pd.DataFrame:
    """:func:`paper_simulation` for each N (same seed and vocabulary), stacked into one long DataFrame."""
    ns = list(n_values)
    return pd.concat([paper_simulation(n, progress=progress, **kwargs)
                      for n in tqdm(ns, desc="N sweep", disable=not progress)], ignore_index=True)


def budget_sweep(budget_draws: int, n_values: Sequence[int], *, progress: bool = True, **kwargs) -> pd.DataFrame:
    """Fixed compute: for each N run :func:`paper_simulation` for budget_draws // N steps (the same number of
    sampled tokens in total) and report the final Q_pos. One row per N: n, steps, q_pos, q_pos_gain."""
    budget = _count(budget_draws, "budget_draws")
    grid = _n_grid(n_values)
    if grid[-1] > budget:
        raise ValueError(f"n_values must not exceed budget_draws ({budget}), got {grid[-1]}")
    rows = []
    for n in tqdm(grid, desc="budget", disable=not progress):
        run = paper_simulation(int(n), steps=budget // int(n), record_every=budget, progress=False, **kwargs)
        rows.append((int(n), budget // int(n), run.q_pos.iloc[-1], run.q_pos.iloc[-1] - run.q_pos.iloc[0]))
    return pd.DataFrame(rows, columns=["n", "steps", "q_pos", "q_pos_gain"])


__all__ = ["TERMS", "TERMS_AND_TOTAL", "FEATURES", "TERM_METHODS", "PROBLEMS", "PLACEMENTS", "OPTIMIZERS", "softmax",
           "Problem", "paper_problem", "zipf_problem", "logit_problem", "MassBalance", "mass_balance", "Moments",
           "moments", "logit_update", "softmax_delta_q", "expected_total", "expected_mass_balance", "large_n_limit",
           "unsampled_second_moment", "DrawSums", "draw_sums", "summarise_sweep", "n_sweep", "simulate",
           "paper_simulation", "paper_simulations", "budget_sweep"]
