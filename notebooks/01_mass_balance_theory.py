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
# what the theory does **not** say. Three exercises along the way check your answers with an `assert`.
#
# Run it top to bottom. The `parameters` cell below holds every size; papermill overrides it for quick headless runs.

# %% tags=["parameters"]
# Sizes. The defaults are the paper's; smaller values give a quick run (papermill overrides this cell).
vocab = 128_000                       # V, tokens at the position we study
n_correct = 10_000                    # |P|, how many of them are correct
steps = 1000                          # optimizer steps in the paper's simulation
n_values = [4, 8, 16, 512, 51200]     # rollouts per prompt N compared in Fig. 3
trials = 2000                         # Monte-Carlo draws for the checks
explorer_trials = 300                 # Monte-Carlo streams behind the explorer
budget_draws = 2**16                  # fixed compute: total sampled tokens per run
budget_n_values = [16, 64, 256, 1024, 4096, 16384]
seed = 0

# %%
import numpy as np
import pandas as pd
from IPython.display import display

from brorl_lab import theory
from brorl_lab.lab import plots
from brorl_lab.lab.widgets import mass_balance_explorer

rng = np.random.default_rng(seed)

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
# First check: Theorem 1 against the true softmax change, draw by draw, at a small learning rate.

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
# slider redraws at once. Try:
#
# * the seeded paper vocabulary: the unsampled term is negative until $N$ is large enough to draw most correct tokens;
# * **zipf** with placement **tail** ("the model is confidently wrong"): at small $N$ the update often *loses* correct
#   mass (right panel, $P(\Delta Q_{pos} < 0)$);
# * the rewards: with $R_w = 0$ the batch mood is never negative.
#
# Any logit vector works too: `mass_balance_explorer(logits=z, correct=mask)`.

# %%
explorer = mass_balance_explorer(vocab=vocab, n_correct=n_correct, trials=explorer_trials, seed=seed)
explorer

# %% [markdown]
# ## 5 · In expectation, and Lemma 2
#
# A token of probability $p$ is missed by all $N$ draws with probability $(1-p)^N$. So the expected unsampled second
# moment is
#
# $$\mathbb E\Big[\sum_{U} p_i^2\Big] = \sum_i p_i^2 (1-p_i)^N,$$
#
# which decays geometrically in $N$, token by token (**Lemma 2**). The unsampled term, the only one that can hurt,
# is starved as $N$ grows.
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
# At $N = 512$ about 97% of the correct tokens go undrawn in a step (seeded vocabulary, $V = 128{,}000$): the column
# `undrawn_correct_frac` above gives $0.968$. This is *derived* here, $\frac{1}{|P|}\sum_{i \in P}(1-p_i)^{512}$ from
# the paper's setting; the paper does not report the number.
#
# ### Exercise 1 · The miss probability
#
# A non-anchor correct token of the seeded vocabulary has probability `problem.p[1]`. What is the probability that it
# is drawn **at least once** in $N = 512$ draws? Replace the solution below with your own expression; the next cell
# checks it against a Monte-Carlo count.

# %%
p_c = problem.p[1]
answer_1 = 1 - (1 - p_c) ** 512          # solution; try it yourself first

# %%
batches = rng.multinomial(512, problem.p, size=400)[:, 1:n_correct]    # [400, |P|-1] counts of plain correct tokens
drawn_share = (batches > 0).mean()
se = np.sqrt(drawn_share * (1 - drawn_share) / batches.size)
assert abs(answer_1 - drawn_share) < 5 * se + 1e-4, (answer_1, drawn_share)
print(f"your answer {answer_1:.4f}, Monte Carlo {drawn_share:.4f} ± {se:.4f}: correct")

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
# ### Exercise 2 · The limit by hand
#
# Compute the large-$N$ limit of $N\,\mathbb E[\Delta Q_{pos}]/\eta$ for the confidently-wrong vocabulary `tail`,
# with $R_c = 1$, $R_w = -1$, from `tail.p` and `tail.correct` only (no `theory` functions).

# %%
# solution; try it yourself first
q_pos = tail.p[tail.correct].sum()
q_neg = 1 - q_pos
answer_2 = 2 * (q_neg**2 * (tail.p[tail.correct] ** 2).sum() + q_pos**2 * (tail.p[~tail.correct] ** 2).sum())

# %%
far = theory.expected_total(tail.p, tail.correct, [10**12], normalised=True)[0]   # exact expectation, N = 10^12
assert abs(answer_2 - far) < 1e-6 * abs(far), (answer_2, far)
print(f"your limit {answer_2:.6e}; exact expectation at N = 10^12: {far:.6e}: correct")

# %% [markdown]
# ## 7 · The paper's simulation (Sec. 4.1, Fig. 3)
#
# The paper lets the $V$ logits themselves be the model and trains them: each step draws $N$ tokens (with repeats),
# centres their $\pm1$ rewards by the batch mean, and takes an AdamW step (lr $10^{-3}$) on
# $-\frac1N\sum_j (R_j - \bar R)\,p_{a_j}$, for 1000 steps. It tracks $Q_{pos}$, the share of correct tokens whose
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
display(final)
display(plots.paper_simulation_figure(runs, baselines={"decay only (no gradient)": decay_only},
                                      title="The paper's simulation (Fig. 3), AdamW weight decay 0.01"))
plots.paper_simulation_figure(runs_wd0, title="The same without weight decay (weight_decay=0)")

# %% [markdown]
# What to look for: large $N$ raises $Q_{pos}$ steadily, improves almost every correct token and keeps the worst
# drop near zero; small $N$ is slower and noisier. Read small $N$'s curves against the decay-only line: with weight
# decay part of any loss of $Q_{pos}$ is the decay, not the sampling; the `weight_decay=0` runs show what sampling
# alone does (the column "decay's share of the change" is the difference). What remains there is the unsampled term:
# each step pushes the undrawn tokens down in proportion to $p_j$ (with $S_R > 0$), and the undrawn correct tokens
# are the concentrated ones here. (AdamW's `eps` keeps these tiny gradients in a plain-gradient regime, so they keep
# their $p_j$ weighting.)
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

# %%
budget = theory.budget_sweep(budget_draws, budget_n_values, vocab=vocab, n_correct=n_correct, seed=seed)
display(budget)
print(f"best N at this budget: {int(budget.loc[budget.q_pos.idxmax(), 'n'])} of {budget.n.tolist()}")
plots.budget_figure(budget)

# %% [markdown]
# ### Exercise 3 · Make an update lose correct mass
#
# Build a 4-token vocabulary (probabilities `p_ex`, correct mask `correct_ex`) and a draw (`drawn_ex`, a boolean
# mask of the distinct tokens drawn, with `n_ex` draws) for which Theorem 1's **unsampled term is negative** even
# though the batch found more correct than incorrect mass ($S_R > 0$). Hint: which undrawn tokens should carry
# the concentrated mass?

# %%
p_ex = np.array([0.4, 0.3, 0.1, 0.2])          # solution: tokens 0 and 1 correct, token 1 (p = 0.3) left undrawn
correct_ex = np.array([True, True, False, False])
drawn_ex = np.array([True, False, False, True])
n_ex = 2

# %%
mb = theory.mass_balance(p_ex, correct_ex, drawn_ex, n=n_ex)
mom = theory.moments(p_ex, correct_ex, drawn_ex, n=n_ex)
assert mom.s_r > 0, f"S_R = {mom.s_r:.3f}: the batch should find more correct than incorrect mass"
assert mb.unsampled < 0, f"the unsampled term is {mb.unsampled:+.4f}, not negative"
print(f"S_R = {mom.s_r:+.3f}, unsampled term = {mb.unsampled:+.4f}: correct")
mb.to_frame()

# %% [markdown]
# ## Summary
#
# * One update changes the correct mass by three terms; two can only help, the **unsampled** one can hurt. It does
#   in two mirror cases: a happy batch ($S_R > 0$) while concentrated *correct* tokens go undrawn (pushed down), and an
#   unhappy batch ($S_R < 0$) while concentrated *incorrect* tokens go undrawn (pushed up), which is what the
#   explorer's confidently-wrong **zipf / tail** vocabulary shows at small $N$.
# * Its expected size falls like $\sum_i p_i^2 (1-p_i)^N$ (Lemma 2); as $N \to \infty$ the update can only help.
# * The simulation agrees in spirit once AdamW's weight decay, which alone lowers $Q_{pos}$, is separated out; the
#   theory is one linear step, and under a fixed budget the best $N$ is a trade-off, not "as large as possible".
#   The next notebooks measure it on a real model.
