# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 01 · The mass balance: why more rollouts per prompt help (BroRL, Sec. 2)
#
# RL with verifiable rewards samples **N rollouts per prompt**, scores them, and nudges the model towards the
# rewarded ones. BroRL (arXiv 2510.01180) asks what happens when N grows from the usual 16 to 512 or more, and answers
# with a small piece of theory: a *mass balance* for the probability of correct answers after one update.
#
# This notebook builds that theory up one step at a time, checks each claim numerically with `brorl_lab.theory`,
# lets you play with it in an interactive explorer, reproduces the paper's simulation (its Fig. 3), and ends with
# what the theory does **not** say.
#
# **You write the core of it.** Six exercises ask for code: the logit update, Theorem 1's three-term split (about 20
# lines of numpy together), the miss probability, the large-$N$ limit, an update that loses correct mass, and a
# vocabulary for the explorer. Each is a function whose body says `# TODO` and returns a placeholder; the cell after
# it checks your function against the library (`theory.logit_update`, `theory.mass_balance`, the exact softmax
# change) and stops the notebook with a message until it is right. The reference solutions are kept apart, in
# `notebooks/solutions/01_mass_balance_theory.py`; `use_solutions = True` below runs the notebook with them (the
# tests and the book do).
#
# Run it top to bottom. The `parameters` cell below holds every size; papermill overrides it for quick headless runs.
#
# **Run time.** At these defaults 47 s on a quiet 2-core machine (the book's build of 2026-12-07,
# `bench/results/book_2026-12-07.json`); 308 s there when other jobs kept its load near 20. `paper_sizes = True` runs
# the paper's Fig. 3 (1000 steps, five N) and a 4x larger budget: 34.5 minutes at that load (17 minutes of CPU).

# %% tags=["parameters"]
# Sizes. The vocabulary is the paper's; the simulation's steps and the budget are cut so the notebook runs in a few
# minutes; paper_sizes True restores the paper's (papermill overrides this cell).
paper_sizes = False                   # True: 1000 steps, N up to 51,200 in 5 values, 2^16 budget draws (~35 min)
vocab = 128_000                       # V, tokens at the position we study
n_correct = 10_000                    # |P|, how many of them are correct
steps = 200                           # optimizer steps in the paper's simulation (the paper: 1000)
n_values = [4, 16, 512, 51200]        # rollouts per prompt N compared in Fig. 3 (the paper adds 8)
trials = 2000                         # Monte-Carlo draws for the checks
explorer_trials = 300                 # Monte-Carlo streams behind the explorer
budget_draws = 2**14                  # fixed compute: total sampled tokens per run (paper_sizes: 2^16)
budget_n_values = [16, 64, 256, 1024, 4096, 16384]
seed = 0
use_solutions = False                 # True: fill every exercise from notebooks/solutions/ (or a list of names)

# %%
import numpy as np
import pandas as pd
from IPython.display import display

from brorl_lab import theory
from brorl_lab.lab import plots
from brorl_lab.lab.course import Exercises
from brorl_lab.lab.widgets import mass_balance_explorer

if paper_sizes:  # the paper's Fig. 3 run and a 4x larger budget: about 35 minutes on the shared 2-core machine
    steps, n_values, budget_draws = 1000, [4, 8, 16, 512, 51200], 2**16
rng = np.random.default_rng(seed)
exercise = Exercises("01_mass_balance_theory", use_solutions)   # @exercise: yours, or the kept-apart solution

# %% [markdown]
# ## 1 · The setting: one prompt, one token position, one update
#
# Forget sequences for a moment and look at a single position where the model picks one of $V$ tokens with
# probabilities $p = \mathrm{softmax}(z)$. Some tokens are **correct** (set $P$, reward $R_c \ge 0$), the rest are
# **incorrect** (reward $R_w \le 0$). The number we care about is the **correct mass**
#
# $$Q_{pos} = \sum_{i \in P} p_i, \qquad Q_{neg} = 1 - Q_{pos}.$$
#
# We use the paper's vocabulary: $V$ tokens, $|P|$ of them correct; "seeded" means correct tokens start at logit 3
# and one *anchor* token at logit 5, everything else at 0.

# %%
problem = theory.paper_problem(vocab, n_correct, seeding=True)
pd.DataFrame([problem.summary(), theory.paper_problem(vocab, n_correct, seeding=False).summary()])

# %% [markdown]
# ## 2 · One draw, and the update it causes
#
# Draw $N$ tokens i.i.d. from $p$. Each **distinct** token falls in one of three groups:
#
# * $A$: drawn and correct, reward $R_c$;
# * $B$: drawn and incorrect, reward $R_w$;
# * $U$: never drawn ("unexplored"), reward $0$.
#
# Call $P_{pos} = \sum_A p_i$, $P_{neg} = \sum_B p_i$ the drawn masses and $S_R = R_c P_{pos} + R_w P_{neg}$ the
# batch's net reward, its *mood*: positive when the draw found a lot of correct mass.
#
# Take one gradient step of size $\eta$ (`lr`) on the linear surrogate $L = -\frac1N\sum_i R_i p_i$. The gradient
# of $p_i$ with respect to $z_j$ is $p_i(\delta_{ij} - p_j)$, so
#
# $$\Delta z_j = \frac{\eta}{N}\, p_j\,(R_j - S_R).$$
#
# Read it: a drawn token moves by how much better it did than the batch's mood; an undrawn token ($R_j = 0$) moves
# by $-\frac{\eta}{N} S_R\, p_j$, **down** when the batch was happy, and by more the more probable it is.

# %%
n_demo = 16
counts = rng.multinomial(n_demo, problem.p)            # [V] how often each token was drawn
m = theory.moments(problem.p, problem.correct, counts)
dz = theory.logit_update(problem.p, problem.correct, counts, lr=1.0)
print(f"{int((counts > 0).sum())} distinct tokens drawn; S_R = {m.s_r:+.3e}")
pd.DataFrame([m.__dict__])

# %% [markdown]
# ### Exercise 1 · The logit update
#
# Write $\Delta z$ for a draw given as integer `counts` [V] (how often each token was drawn; $N$ = `counts.sum()`).
# A drawn token's reward is $R_c$ if it is correct and $R_w$ if not, however often it was drawn; an undrawn token's
# is 0. About four lines of numpy: the reward vector, $S_R$, then the formula above.

# %% tags=["exercise"]
@exercise
def logit_update(p, correct, counts, *, lr=1.0, r_c=1.0, r_w=-1.0):
    """dz [V] of one step of size lr on L = -(1/N) sum_i R_i p_i: dz_j = (lr/N) p_j (R_j - S_R)."""
    dz = np.zeros_like(p)   # TODO: N = counts.sum(); R_j; S_R = sum_j R_j p_j; then dz
    return dz


# %% tags=["check"]
small = theory.zipf_problem(50, 12, placement="random", seed=seed)      # a vocabulary small enough to read
repeated = np.zeros(50, dtype=int)
repeated[np.flatnonzero(small.correct)[0]], repeated[np.flatnonzero(~small.correct)[:2]] = 3, (2, 1)   # N = 6, 3 tokens
draws = {"this section's draw": (problem, counts), "a draw of 8 on a small vocabulary": (small, rng.multinomial(8, small.p)),
         "a draw with repeats (a correct token 3 times, an incorrect one twice)": (small, repeated)}
for case, (prob, cnt) in draws.items():
    for r_c, r_w in ((1.0, -1.0), (2.0, -0.5), (1.0, 0.0)):
        mine = logit_update(prob.p, prob.correct, cnt, lr=1.0, r_c=r_c, r_w=r_w)
        ref = theory.logit_update(prob.p, prob.correct, cnt, lr=1.0, r_c=r_c, r_w=r_w)
        off = ~np.isclose(mine, ref, rtol=1e-9, atol=0)                   # [V] where yours differs
        groups = {"drawn correct": (cnt > 0) & prob.correct, "drawn incorrect": (cnt > 0) & ~prob.correct,
                  "undrawn": cnt == 0}
        assert not off.any(), f"not yet ({case}, R_c={r_c}, R_w={r_w}): dz is off on " + ", ".join(
            f"{int((off & m).sum())} of {int(m.sum())} {g} tokens" for g, m in groups.items() if (off & m).any())
dz_small = logit_update(small.p, small.correct, cnt, lr=1e-4)
exact = theory.softmax_delta_q(small.p, small.correct, dz_small)      # Q_pos(softmax(z + dz)) - Q_pos(softmax(z))
first_order = theory.mass_balance(small.p, small.correct, cnt, lr=1e-4).total
assert abs(exact - first_order) < 1e-3 * abs(first_order), f"not yet: your dz moves Q_pos by {exact:+.3e}, " \
    f"Theorem 1 says {first_order:+.3e}"
print(exercise.said(f"your update moves Q_pos by {exact:+.3e} (exact softmax change, lr 1e-4; Theorem 1: "
                    f"{first_order:+.3e}): correct", "logit_update"))

# %% [markdown]
# ## 3 · Theorem 1: the change of correct mass has three terms
#
# To first order $\Delta p_i = p_i(\Delta z_i - \sum_j p_j \Delta z_j)$. Summing over correct tokens and sorting the
# result by group gives (with $A_2 = \sum_A p_i^2$, $B_2 = \sum_B p_i^2$, $U_{pos2}$ and $U_{neg2}$ the sums of
# $p_i^2$ over undrawn correct and incorrect tokens):
#
# $$\Delta Q_{pos} = \frac{\eta}{N}\Big[\underbrace{(R_c - S_R)\,Q_{neg}\,A_2}_{\text{sampled correct}\ \ge 0}
#  + \underbrace{(S_R - R_w)\,Q_{pos}\,B_2}_{\text{sampled incorrect}\ \ge 0}
#  + \underbrace{S_R\,(Q_{pos}U_{neg2} - Q_{neg}U_{pos2})}_{\text{unsampled: either sign}}\Big].$$
#
# Why these signs?
#
# * **Sampled correct.** $S_R \le R_c$ always (the mood is an average that includes zeros), so rewarding drawn
#   correct tokens can only add correct mass. It takes mass from the incorrect side, hence the factor $Q_{neg}$.
# * **Sampled incorrect.** $S_R \ge R_w$, so drawn incorrect tokens are pushed down; the freed mass flows mostly to
#   where the mass is, a share $Q_{pos}$ of it to correct tokens.
# * **Unsampled.** Every undrawn logit moves by $-\frac{\eta}{N}S_R p_j$, proportional to $p_j$, so the move hits
#   the *concentrated* (high $p^2$) undrawn tokens hardest. With $S_R > 0$ it helps if the undrawn incorrect tokens
#   are the concentrated ones ($Q_{pos}U_{neg2} > Q_{neg}U_{pos2}$) and hurts if undrawn correct tokens are. With
#   $S_R < 0$ (an unhappy batch) the signs flip: every undrawn token is pushed *up*, and it hurts when the undrawn
#   *incorrect* tokens are the concentrated ones ($Q_{pos}U_{neg2} > Q_{neg}U_{pos2}$ again). This is the only term
#   that can make an update *lose* correct mass.
#
# The factor $\eta/N$ shrinks every term as $N$ grows, so we compare $N\,\Delta Q_{pos}/\eta$ across $N$.
#
# ### Exercise 2 · The three-term split
#
# Write Theorem 1's three terms for the distinct drawn tokens `drawn` (a boolean mask [V]) of `n` draws, each
# with its factor $\eta/N$. About a dozen lines: $Q_{pos}$, the four groups $A$, $B$, $U_{pos}$, $U_{neg}$ as masks,
# $S_R$, then the three brackets.

# %% tags=["exercise"]
@exercise
def three_terms(p, correct, drawn, n, *, lr=1.0, r_c=1.0, r_w=-1.0):
    """Theorem 1's terms of dQ_pos, each with the lr/N factor: {sampled_correct, sampled_incorrect, unsampled}."""
    # TODO: Q_pos, Q_neg; masks A, B, U_pos, U_neg; S_R; the three terms
    return {"sampled_correct": 0.0, "sampled_incorrect": 0.0, "unsampled": 0.0}


# %% tags=["check"]
for r_c, r_w in ((1.0, -1.0), (2.0, -0.5)):
    for cnt in rng.multinomial(6, small.p, size=20):                     # 20 draws of N = 6 on the small vocabulary
        drawn, ref = cnt > 0, theory.mass_balance(small.p, small.correct, cnt, r_c=r_c, r_w=r_w, lr=1e-4)
        mine = three_terms(small.p, small.correct, drawn, 6, lr=1e-4, r_c=r_c, r_w=r_w)
        for term in theory.TERMS:
            assert np.isclose(mine[term], getattr(ref, term), rtol=1e-9, atol=1e-15), \
                f"not yet: {term} = {mine[term]:+.4e}, theory.mass_balance says {getattr(ref, term):+.4e}"
    # and their sum is, to first order, the exact change your own logit update causes
    exact = theory.softmax_delta_q(small.p, small.correct, logit_update(small.p, small.correct, cnt, lr=1e-4,
                                                                        r_c=r_c, r_w=r_w))
    assert abs(sum(mine.values()) - exact) < 1e-3 * abs(exact), (sum(mine.values()), exact)
print(exercise.said("your three terms match theory.mass_balance on 40 draws and sum to the exact softmax change: correct",
                    "three_terms"))

# %% [markdown]
# Now the library's version on the big vocabulary: Theorem 1 against the true softmax change, draw by draw, at a
# small learning rate. **What you should see:** every point on the diagonal (first order is exact at this lr).

# %%
check = theory.simulate(problem.p, problem.correct, n_demo, 200, seed=seed, lr=1e-4)
rel = ((check.total - check.exact_total).abs() / check.exact_total.abs()).max()
print(f"largest relative error of the first-order formula over 200 draws: {rel:.1e}")
assert rel < 1e-5
plots.first_order_figure(check)

# %% [markdown]
# ## 4 · Interactive: explore the terms yourself
#
# The explorer below precomputes Monte-Carlo draws for every $N$ on a log grid (1 to 65,536), so moving the **N**
# slider redraws at once. It has three panels:
#
# * **① Terms at this N**: the expected value of each of Theorem 1's terms, and their total, on the
#   $N\,\Delta Q_{pos}/\eta$ scale, with error bars of $\pm 1$ standard deviation over draws;
# * **② $\Delta Q_{pos}$ of each Monte-Carlo draw**: a histogram of the total over the draws at this $N$; a draw left
#   of the red line lost correct mass;
# * **③ The N sweep**: left, the expected terms against $N$; right, $P(\Delta Q_{pos} < 0)$, the share of draws that
#   lose correct mass, with a $\pm 2$ s.e. band. The open circles mark the slider's $N$.
#
# The **teaching view** buttons set the vocabulary in one click: *paper, seeded* (where this notebook starts) and
# *zipf, tail* (a confidently wrong model: Zipf-distributed logits, the correct tokens in the unlikely tail).
#
# **Task sheet.**
#
# 1. On *paper, seeded*, move $N$ from 1 to 65,536. What does ③'s right panel show at every $N$? Watch ①'s
#    unsampled bar: it *grows* (more negative) for a long while before it fades. Why? (Hint: the term is $S_R$
#    times a difference of undrawn second moments; which of the two factors changes first as $N$ grows? Section 5
#    answers it.)
# 2. Click *zipf, tail*. At which $N$ does ② put most draws left of the red line?
# 3. Find a vocabulary where $P(\Delta Q_{pos} < 0) > 0.5$ at $N = 4$ (try the Zipf exponent and the placement),
#    and the $N$ from which it vanishes (is 0 in ③ from there on). Enter both in Exercise 3 below; its check
#    recomputes the sweep.
# 4. Set $R_w = 0$: why can no draw lose mass any more? (The batch mood $S_R$ is then never negative.)
#
# Any logit vector works too: `mass_balance_explorer(logits=z, correct=mask)`.

# %%
explorer = mass_balance_explorer(vocab=vocab, n_correct=n_correct, trials=explorer_trials, seed=seed)
explorer

# %% [markdown]
# ### Exercise 3 · A vocabulary that loses correct mass at small N
#
# Return a `theory.Problem` of any size (e.g. `theory.zipf_problem(128_000, 10_000, exponent=..., placement=...)`),
# with $P(\Delta Q_{pos} < 0) > 0.5$ at $N = 4$, and the $N$ of the explorer's grid (a power of 2) from which
# $P(\Delta Q_{pos} < 0)$ stays at 0 in ③ (below 1%; the check allows one grid step either way, the Monte Carlo is
# noisy).

# %% tags=["exercise"]
@exercise
def losing_vocabulary():
    """(problem, n_vanish): a vocabulary that loses correct mass at N = 4 more often than not, and the N from which
    it (almost) never does."""
    return theory.paper_problem(), 1      # TODO: your vocabulary and your N from ③


# %% tags=["check"]
task_problem, n_vanish = losing_vocabulary()
task_sweep = theory.n_sweep(task_problem.p, task_problem.correct, [2**k for k in range(17)],
                            trials=max(explorer_trials, 300), seed=seed).set_index("n")["p_neg"]
assert task_sweep[4] > 0.5, f"not yet: P(dQ<0) at N=4 is {task_sweep[4]:.2f} on {task_problem.name}"
above = task_sweep.index[task_sweep > 0.01]
first = 2 * int(above.max()) if len(above) else 1       # the first N from which P(dQ<0) stays below 1%
assert n_vanish <= 2 * first, f"not yet: P(dQ<0) already stays below 1% from an N more than one grid step below " \
    f"your {n_vanish:,}: read panel ③ further left"
assert n_vanish >= first / 2, f"not yet: P(dQ<0) is still above 1% at an N of the grid above your {n_vanish:,} " \
    "(more than one grid step): read panel ③ further right"
print(exercise.said(f"{task_problem.name}: P(dQ<0) = {task_sweep[4]:.2f} at N=4, below 1% from N = {first:,} on: "
                    "correct", "losing_vocabulary"))

# %% [markdown]
# ## 5 · In expectation, and Lemma 2
#
# A token of probability $p$ is missed by all $N$ draws with probability $(1-p)^N$. So the expected unsampled second
# moment is
#
# $$\mathbb E\Big[\sum_{U} p_i^2\Big] = \sum_i p_i^2 (1-p_i)^N,$$
#
# which decays geometrically in $N$, token by token (**Lemma 2**): a token of probability $p$ leaves it once $N$
# passes about $1/p$. That does **not** make the unsampled term shrink from the first extra rollout. The term is
# $S_R$ times a difference of undrawn second moments, and $S_R = R_c P_{pos} + R_w P_{neg}$ is a *drawn* mass: at
# $N = 1$ one token is drawn and $S_R$ is tiny, and it grows with every distinct token drawn. So on the
# $N\,\Delta Q_{pos}/\eta$ scale the expected unsampled term first *grows* with $N$ (the push on the undrawn tokens
# gets stronger while they are still there) and only fades once $N$ passes about $1/p$ of the typical correct token,
# when the undrawn correct tokens themselves run out. Section 6 prints both regimes for the paper's vocabulary.
#
# Because $A_2 + U_{pos2}$ and $B_2 + U_{neg2}$ are constants, the bracket is *linear* in the indicators "token $i$
# was drawn", whose expectations are $q_i = 1 - (1-p_i)^N$; `theory.expected_total` evaluates that closed form in
# $O(V)$. The split into three terms needs pairs of tokens (`terms="exact"` for small $V$) or Monte Carlo.

# %%
grid = [1, 4, 16, 64, 256, 1024, 4096, 16384, 65536]
lemma = theory.unsampled_second_moment(problem.p, problem.correct, grid)
display(lemma)
plots.lemma2_figure(lemma)

# %% [markdown]
# **What you should see:** both curves flat while $N$ is far below $1/p$ of their tokens, then falling steeply (log
# scale) once $N$ passes it; the incorrect tokens, each far less likely, leave last.
#
# How many correct tokens go undrawn in one step at $N = 512$? The expected share is
# $\frac{1}{|P|}\sum_{i \in P}(1-p_i)^{512}$; the cell below computes it for this notebook's sizes. At the paper's
# sizes (seeded vocabulary, $V = 128{,}000$, $|P| = 10{,}000$) it is $0.968$: about 97% of the correct tokens go
# undrawn in a step. This is *derived* here from the paper's setting; the paper does not report the number.

# %%
undrawn_512 = theory.unsampled_second_moment(problem.p, problem.correct, [512]).undrawn_correct_frac.iloc[0]
print(f"V = {vocab:,}, |P| = {n_correct:,}: expected share of correct tokens undrawn at N = 512: {undrawn_512:.3f}")

# %% [markdown]
# ### Exercise 4 · The miss probability
#
# A non-anchor correct token of the seeded vocabulary has probability `problem.p[1]`. What is the probability that it
# is drawn **at least once** in $N$ draws? The next cell checks your function at $N = 512$ against a Monte-Carlo count.

# %% tags=["exercise"]
@exercise
def p_drawn_at_least_once(p_i, n):
    """The probability that a token of probability p_i is drawn at least once in n i.i.d. draws."""
    return 0.0              # TODO


# %% tags=["check"]
answer_4 = p_drawn_at_least_once(problem.p[1], 512)
batches = rng.multinomial(512, problem.p, size=400)[:, 1:n_correct]    # [400, |P|-1] counts of plain correct tokens
drawn_share = (batches > 0).mean()
se = np.sqrt(drawn_share * (1 - drawn_share) / batches.size)
assert abs(answer_4 - drawn_share) < 5 * se + 1e-4, f"not yet: yours {answer_4:.4f}, Monte Carlo {drawn_share:.4f}"
print(exercise.said(f"your answer {answer_4:.4f}, Monte Carlo {drawn_share:.4f} ± {se:.4f}: correct",
                    "p_drawn_at_least_once"))

# %% [markdown]
# ## 6 · The large-N limit
#
# When every token is drawn, $A = P$, $B = $ everything else, $U = \varnothing$, and $S_R = R_c Q_{pos} + R_w Q_{neg}$.
# The unsampled term vanishes and the bracket becomes
#
# $$\lim_{N\to\infty} \frac{N\,\Delta Q_{pos}}{\eta} = (R_c - R_w)\,\big(Q_{neg}^2 P_2 + Q_{pos}^2 N_2\big) \ \ge 0,$$
#
# with $P_2 = \sum_P p_i^2$, $N_2 = \sum_{\text{incorrect}} p_i^2$: with enough rollouts the correct mass can only grow.
# Below, the expected terms across $N$ for the paper's vocabulary and for a confidently-wrong one.

# %%
sweep_grid = [2**k for k in range(0, 17, 2)]
tail = theory.zipf_problem(vocab, n_correct, placement="tail")
sweeps = {}
for prob in (problem, tail):
    sweeps[prob.name] = theory.n_sweep(prob.p, prob.correct, sweep_grid, trials=max(50, trials // 10), seed=seed)
    display(plots.n_sweep_figure(sweeps[prob.name], current_n=sweep_grid[-1], title=prob.name))

# %% [markdown]
# **What you should see:** on the paper's vocabulary $P(\Delta Q_{pos} < 0)$ is 0 at every $N$ and the total only
# grows; the unsampled term (negative) grows in size before it fades. On the confidently-wrong vocabulary
# $P(\Delta Q_{pos} < 0)$ starts high and falls to 0 within a few dozen rollouts. The unsampled term of the paper's
# vocabulary, from the sweep above:

# %%
unsampled = sweeps[problem.name].set_index("n")["unsampled"]
print(f"expected unsampled term (N dQ/lr): N=1 {unsampled.iloc[0]:+.2g}; most negative {unsampled.min():+.2g} at "
      f"N={unsampled.idxmin():,}; N={unsampled.index[-1]:,} {unsampled.iloc[-1]:+.2g}. 1/p of a plain correct token: "
      f"{1 / problem.p[1]:,.0f}")

# %% [markdown]
# ### Exercise 5 · The limit by hand
#
# Compute the large-$N$ limit of $N\,\mathbb E[\Delta Q_{pos}]/\eta$ for a vocabulary, with rewards $R_c$, $R_w$,
# from `p` and `correct` only (no `theory` functions).

# %% tags=["exercise"]
@exercise
def large_n_limit_by_hand(p, correct, *, r_c=1.0, r_w=-1.0):
    """lim_{N -> inf} N E[dQ_pos] / lr."""
    return 0.0              # TODO


# %% tags=["check"]
far = theory.expected_total(tail.p, tail.correct, [10**12], normalised=True)[0]   # exact expectation, N = 10^12
answer_5 = large_n_limit_by_hand(tail.p, tail.correct)
assert abs(answer_5 - far) < 1e-6 * abs(far), f"not yet: yours {answer_5:.6e}, exact at N = 10^12 {far:.6e}"
assert np.isclose(large_n_limit_by_hand(small.p, small.correct, r_c=2.0, r_w=-0.5),
                  theory.large_n_limit(small.p, small.correct, r_c=2.0, r_w=-0.5), rtol=1e-9), "not yet: other rewards"
print(exercise.said(f"your limit {answer_5:.6e}; exact expectation at N = 10^12: {far:.6e}: correct",
                    "large_n_limit_by_hand"))

# %% [markdown]
# ## 7 · The paper's simulation (Sec. 4.1, Fig. 3)
#
# The paper lets the $V$ logits themselves be the model and trains them: each step draws $N$ tokens (with repeats),
# centres their $\pm1$ rewards by the batch mean, and takes an AdamW step (lr $10^{-3}$) on
# $-\frac1N\sum_j (R_j - \bar R)\,p_{a_j}$, for 1000 steps (here `steps`: 200 by default, 1000 with
# `paper_sizes = True`). It tracks $Q_{pos}$, the share of correct tokens whose
# probability went up, and the worst drop of any correct token ("knowledge shrinkage").
#
# The paper does not report the seeds, AdamW's betas / weight decay / eps, or whether the anchor token is correct.
# `paper_simulation` makes them parameters; the defaults are PyTorch's AdamW defaults (betas 0.9/0.999, eps 1e-8,
# weight decay 0.01), one seed, and a correct anchor.
#
# **The weight decay is our choice, and it matters.** $0.01$ is torch's AdamW default, so probably what the paper
# ran, but it is not reported, and it moves $Q_{pos}$ *by itself*: AdamW's decoupled decay multiplies every logit by
# $(1 - \eta\lambda)$ each step, flattening $p$ towards uniform, and with 128,000 tokens of which 10,000 are
# correct, flatter means less correct mass. The dashed **decay only** line below runs the same optimizer on a zero
# gradient (no draws at all); at the paper's size it takes $Q_{pos}$ from 0.6301 to 0.6231 in 1000 steps, as large
# as the differences Fig. 3 shows. So we run the simulation twice: with weight decay 0.01 next to that baseline,
# and with `weight_decay=0`, where every change of $Q_{pos}$ comes from the sampled updates.

# %%
runs = theory.paper_simulations(n_values, steps=steps, vocab=vocab, n_correct=n_correct, seed=seed)
decay_only = theory.paper_simulation(n_values[0], steps=steps, vocab=vocab, n_correct=n_correct, seed=seed,
                                     gradient=False)
runs_wd0 = theory.paper_simulations(n_values, steps=steps, vocab=vocab, n_correct=n_correct, seed=seed,
                                    weight_decay=0.0)
last = lambda df: df.groupby("n").tail(1).set_index("n")           # noqa: E731  the final row of each N
final = pd.DataFrame({"q_pos (wd 0.01)": last(runs).q_pos, "q_pos (wd 0)": last(runs_wd0).q_pos,
                      "frac_correct_improved (wd 0)": last(runs_wd0).frac_correct_improved,
                      "worst_correct_drop (wd 0)": last(runs_wd0).worst_correct_drop})
final["decay's share of the change"] = last(runs).q_pos - last(runs_wd0).q_pos
print(f"decay only (no gradient): Q_pos {decay_only.q_pos.iloc[0]:.4f} -> {decay_only.q_pos.iloc[-1]:.4f} "
      f"after {steps} steps")
final["steps Q_pos fell (wd 0)"] = runs_wd0.groupby("n").q_pos.apply(lambda q: int((q.diff() < 0).sum()))
display(final)
display(plots.paper_simulation_figure(runs, baselines={"decay only (no gradient)": decay_only},
                                      title="The paper's simulation (Fig. 3), AdamW weight decay 0.01"))
plots.paper_simulation_figure(runs_wd0, title="The same without weight decay (weight_decay=0)")

# %% [markdown]
# **What you should see** (at the defaults' 200 steps and at the paper's 1000 alike): large $N$ raises $Q_{pos}$ steadily, improves almost
# every correct token and keeps the worst drop near zero. Small $N$ ($4$ to $16$) does not learn slowly and noisily:
# its $Q_{pos}$ *falls*, smoothly, on nearly every step (the column "steps Q_pos fell" counts them), with weight
# decay and without it. Read small $N$'s curves against the decay-only line: with weight decay part of the fall is
# the decay, not the sampling; the `weight_decay=0` runs show what sampling alone does (the column "decay's share of
# the change" is the difference). What remains there is the unsampled term, and it is systematic, not noise: each
# step pushes the undrawn tokens down in proportion to $p_j$ (with $S_R > 0$), and at small $N$ the undrawn tokens
# are mostly the concentrated correct ones. (AdamW's `eps` keeps these tiny gradients in a plain-gradient regime, so
# they keep their $p_j$ weighting.) This run:

# %%
lo, hi = min(n_values), max(n_values)
fell, q0 = int(final.loc[lo, "steps Q_pos fell (wd 0)"]), runs_wd0.q_pos.iloc[0]
as_said = fell >= 0.8 * steps and final.loc[hi, "q_pos (wd 0)"] > q0 > final.loc[lo, "q_pos (wd 0)"]
print(f"weight_decay=0, from Q_pos {q0:.4f}: N={hi} ends at {final.loc[hi, 'q_pos (wd 0)']:.4f}, N={lo} at "
      f"{final.loc[lo, 'q_pos (wd 0)']:.4f}, falling on {fell} of {steps} steps: "
      + ("as described" if as_said else
         f"this run went the other way for N={lo}: the fall is the unsampled term outweighing the sampled ones, which "
         f"needs most of the correct mass on tokens a draw of {lo} misses (the paper's V = 128,000 with 10,000 correct "
         f"tokens); this run's V = {vocab:,} with {n_correct:,} correct did not get there"))
#
# ## 8 · What the theory does not say
#
# **It is one step of a linear surrogate.** Theorem 1 is exact only to first order in $\eta$, for one plain gradient
# step on $\sum_i R_i p_i$ (not the log-probabilities PPO uses), at one token position. Training takes thousands of
# steps with Adam, whose per-coordinate scaling is not a plain gradient step, over sequences whose positions
# interact. The simulation above already goes beyond the theorem; real LLM training goes much further.
#
# **Bigger N is not free.** With a fixed compute budget, $N$ rollouts per prompt means fewer prompts or fewer steps.
# Below, every run samples the same total number of tokens (`budget_draws`), split as $N$ per step times
# `budget_draws // N` steps. Follow-up work (IsoCompute, F-GRPO, DARS, Knapsack RL) likewise finds that the best
# $N$ grows with compute and then saturates, or is not monotone at all.
#
# The comparison runs with `weight_decay=0`: with decay, the runs of small $N$ take thousands of steps and the decay
# alone lowers their $Q_{pos}$ (section 7), so "best $N$" would partly rank how few steps a run took. The column
# `q_pos (wd 0.01)` shows what the decay adds.

# %%
budget = theory.budget_sweep(budget_draws, budget_n_values, vocab=vocab, n_correct=n_correct, seed=seed,
                             weight_decay=0.0)
with_decay = theory.budget_sweep(budget_draws, budget_n_values, vocab=vocab, n_correct=n_correct, seed=seed)
display(budget.assign(**{"q_pos (wd 0.01)": with_decay.q_pos}))
print(f"best N at this budget (weight_decay=0): {int(budget.loc[budget.q_pos.idxmax(), 'n'])} of {budget.n.tolist()}"
      f"; with weight decay 0.01 it would read {int(with_decay.loc[with_decay.q_pos.idxmax(), 'n'])}")
plots.budget_figure(budget, title="Fixed budget of draws: final Q_pos against N (weight_decay=0)")

# %% [markdown]
# **What you should see:** $Q_{pos}$ falls at the smallest $N$ (many steps, each losing mass through the unsampled
# term), rises towards an interior best $N$, and flattens or falls again at the largest $N$ (too few steps to move).
# This run:

# %%
best = int(budget.loc[budget.q_pos.idxmax(), "n"])
interior = best not in (budget.n.min(), budget.n.max()) and budget.q_pos_gain.iloc[0] < 0
print(f"best N {best} of {budget.n.tolist()}; the smallest N's gain {budget.q_pos_gain.iloc[0]:+.4f}: "
      + ("as described" if interior else
         "this run went the other way: the smallest N did not lose mass or the best N sits at an end of the grid; the "
         "shape needs the paper's vocabulary (most correct mass on tokens small draws miss) and a budget that gives the "
         f"large N a few steps; this run has V = {vocab:,} and {budget_draws:,} draws"))

# %% [markdown]
# ### Exercise 6 · Make an update lose correct mass
#
# Build a 4-token vocabulary (probabilities `p`, correct mask `correct`) and a draw (`drawn`, a boolean mask of the
# distinct tokens drawn, with `n` draws) for which Theorem 1's **unsampled term is negative** even though the batch
# found more correct than incorrect mass ($S_R > 0$). Hint: which undrawn tokens should carry the concentrated mass?

# %% tags=["exercise"]
@exercise
def losing_update():
    """(p [4], correct [4], drawn [4], n): S_R > 0 and a negative unsampled term."""
    p = np.array([0.25, 0.25, 0.25, 0.25])      # TODO: your vocabulary and draw
    correct = np.array([True, True, False, False])
    drawn = np.array([True, True, True, True])
    return p, correct, drawn, 4


# %% tags=["check"]
p_ex, correct_ex, drawn_ex, n_ex = losing_update()
mb = theory.mass_balance(p_ex, correct_ex, drawn_ex, n=n_ex)
mom = theory.moments(p_ex, correct_ex, drawn_ex, n=n_ex)
assert mom.s_r > 0, f"not yet: S_R = {mom.s_r:.3f}; the batch should find more correct than incorrect mass"
assert mb.unsampled < 0, f"not yet: the unsampled term is {mb.unsampled:+.4f}, not negative"
print(exercise.said(f"S_R = {mom.s_r:+.3f}, unsampled term = {mb.unsampled:+.4f}: correct", "losing_update"))
mb.to_frame()

# %% [markdown]
# ## Summary
#
# * One update changes the correct mass by three terms; two can only help, the **unsampled** one can hurt. It does
#   in two mirror cases: a happy batch ($S_R > 0$) while concentrated *correct* tokens go undrawn (pushed down), and an
#   unhappy batch ($S_R < 0$) while concentrated *incorrect* tokens go undrawn (pushed up), which is what the
#   explorer's confidently-wrong **zipf / tail** vocabulary shows at small $N$.
# * Its expected second moment falls like $\sum_i p_i^2 (1-p_i)^N$ (Lemma 2), but the term itself, scaled by the
#   drawn mass $S_R$, first grows with $N$ and fades only once $N$ passes about $1/p$ of the correct tokens; as
#   $N \to \infty$ the update can only help.
# * The simulation agrees in spirit once AdamW's weight decay, which alone lowers $Q_{pos}$, is separated out; the
#   theory is one linear step, and under a fixed budget the best $N$ is a trade-off, not "as large as possible".
#   The next notebooks measure it on a real model.
