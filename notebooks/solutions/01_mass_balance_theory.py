"""Reference solutions of notebook 01's exercises (kept apart from the notebook: try them yourself first).

The notebook loads these only when run with ``use_solutions=True`` (the tests and the book do;
``brorl_lab.lab.course.Exercises``). Each function has the name and signature of the notebook's stub.
"""

import numpy as np


def logit_update(p, correct, counts, *, lr=1.0, r_c=1.0, r_w=-1.0):
    """dz [V] of one step of size lr on L = -(1/N) sum_i R_i p_i: dz_j = (lr/N) p_j (R_j - S_R)."""
    n = counts.sum()                                         # N, the number of draws
    reward = np.where(counts > 0, np.where(correct, r_c, r_w), 0.0)   # [V] R_j; an undrawn token gets 0
    s_r = reward @ p                                         # the batch's mood S_R = r_c P_pos + r_w P_neg
    return lr / n * p * (reward - s_r)                       # [V]


def three_terms(p, correct, drawn, n, *, lr=1.0, r_c=1.0, r_w=-1.0):
    """Theorem 1's three terms of dQ_pos (with the lr/N factor) for the distinct drawn tokens ``drawn`` [V]."""
    q_pos = p[correct].sum()
    q_neg = 1.0 - q_pos
    a, b = drawn & correct, drawn & ~correct                 # A: drawn correct, B: drawn incorrect
    u_pos, u_neg = ~drawn & correct, ~drawn & ~correct       # U split by correctness
    s_r = r_c * p[a].sum() + r_w * p[b].sum()
    k = lr / n
    return {"sampled_correct": k * (r_c - s_r) * q_neg * (p[a] ** 2).sum(),
            "sampled_incorrect": k * (s_r - r_w) * q_pos * (p[b] ** 2).sum(),
            "unsampled": k * s_r * (q_pos * (p[u_neg] ** 2).sum() - q_neg * (p[u_pos] ** 2).sum())}


def p_drawn_at_least_once(p_i, n):
    """A token of probability p_i is missed by one draw with probability 1 - p_i, by all n with (1 - p_i)^n."""
    return 1.0 - (1.0 - p_i) ** n


def large_n_limit_by_hand(p, correct, *, r_c=1.0, r_w=-1.0):
    """(r_c - r_w) (Q_neg^2 P_2 + Q_pos^2 N_2): every token drawn, U empty."""
    q_pos = p[correct].sum()
    q_neg = 1.0 - q_pos
    return (r_c - r_w) * (q_neg**2 * (p[correct] ** 2).sum() + q_pos**2 * (p[~correct] ** 2).sum())


def losing_update():
    """Tokens 0 and 1 correct; the concentrated correct token 1 (p = 0.3) goes undrawn while the batch is happy."""
    p = np.array([0.4, 0.3, 0.1, 0.2])
    correct = np.array([True, True, False, False])
    drawn = np.array([True, False, False, True])
    return p, correct, drawn, 2


def losing_vocabulary():
    """A flatter Zipf than the explorer's default (exponent 0.6, correct tokens in the tail): a draw of 4 usually
    finds only incorrect head tokens (S_R < 0), which pushes the undrawn, concentrated incorrect ones up.

    n_vanish is read off panel ③ as a student would, not computed: set the explorer to this vocabulary (Zipf
    exponent 0.6, placement tail) and P(dQ < 0) is 0.69 at N = 4, 0.25 at 16, 0.013 at 64 and 0 from N = 128 on
    (300 trials, seed 0)."""
    from brorl_lab import theory

    return theory.zipf_problem(128_000, 10_000, exponent=0.6, placement="tail"), 128
