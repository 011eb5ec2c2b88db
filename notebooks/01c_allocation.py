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
# # 01c · Rollouts where they pay: allocating the sample budget per prompt
#
# BroRL raises the rollouts per prompt from N = 16 to N = 512 **for every prompt**. Its mechanism (notebook 01)
# concerns prompts whose successes are rare: a group of N samples carries a learning signal only when it holds both
# a success and a failure, which happens with probability
#
# $$s_N(p) = 1 - p^N - (1-p)^N$$
#
# for a prompt the policy solves with probability $p$. Raising $N$ lifts $s_N(p)$ only where $p$ is small but not
# zero (or close to, but not at, 1); a prompt at $p = 1/2$ is informative at $N = 4$ already, and a prompt at
# $p = 0$ never is. Spending 512 draws on every prompt pays for the few that need them with the many that do not.
#
# This notebook asks what a **per-prompt** allocation of the same budget buys, in expectation, on a population of
# prompts whose $p$ you choose:
#
# - `uniform:16` and `uniform:512`: the papers' two arms;
# - `two_stage` (from Theorem 1): a probe of $n_0$ draws per prompt, a Beta posterior on each $p$, then the rest of the
#   budget placed greedily where it raises the expected number of informative groups most (a knapsack; the greedy
#   is exact because the objective is concave in $N$);
# - `until_signal` (Reinforce-Ada's idea): rounds of draws until a group holds both outcomes or reaches its cap.
#
# The same allocators run in training (`Config(rollout_allocation="two_stage")`, `python -m brorl_lab train
# --rollout-allocation two_stage`); here they run on Bernoulli draws at known $p$, so every number is an expectation
# (a Monte-Carlo mean), not a training result.
#
# **Run time.** At these defaults 38 s on the 2-core machine while other jobs kept its load near 13 (measured
# 2026-12-07 by `make book`, whose preset runs them; the one real rollout included).

# %% tags=["parameters"]
prompts = 64                  # prompts in the simulated population
reps = 20                     # Monte-Carlo repeats of each adaptive allocator
budget = 16                   # samples per prompt a step may spend (the step's budget / prompts)
probe = 4                     # n0, the first round's draws per prompt
cap = 512                     # the most samples one prompt may get
kind = "beta"                 # population of p: 'beta' or 'mixture'
a = 0.3                       # Beta(a, b) shape: a small a puts mass near zero (rare successes)
b = 3.0
solved = 0.0                  # mixture only: share of prompts always solved
unsolved = 0.0                # mixture only: share of prompts never solved
budgets = [4, 16, 64, 256]    # the budget sweep at the end
live_prompts = 4              # prompts in the one real allocated rollout on the shipped model (0 skips it)
seed = 0

# %%
import numpy as np
import plotly.graph_objects as go

from brorl_lab.lab import plots  # noqa: F401 - figures keep an HTML copy (the book and HTML exports draw it)
from brorl_lab.rl.allocation import compare
from brorl_lab.theory import allocation as A
from brorl_lab.theory import balance

# %% [markdown]
# ## 1. The value of one more sample, by prompt
#
# The increments $s_{N+1}(p) - s_N(p) = p^N (1-p) + (1-p)^N p$ fall with $N$: every prompt's curve is concave.
# Rare-success prompts ($p = 0.01$) keep gaining up to $N \approx 1/p$; a half-solved prompt stops gaining after a
# handful of draws.

# %%
grid = np.unique(np.round(np.logspace(0, np.log10(1024), 60)).astype(int))
fig = go.Figure([go.Scatter(x=grid, y=A.informative_probability(q, grid), name=f"p={q}")
                 for q in (0.002, 0.01, 0.05, 0.5, 0.95, 0.999)])
fig.update_layout(title="s_N(p): the chance a group of N holds both outcomes", xaxis_type="log",
                  xaxis_title="N", yaxis_title="s_N(p)", height=350)
fig

# %% [markdown]
# ## 2. Theorem 1 on one prompt
#
# With two outcomes (a correct answer of mass $p$, a wrong one of mass $1-p$) and group-centred rewards
# $r - k/N$, every draw that holds both outcomes gives the same Theorem 1 bracket, $2p^2(1-p)^2$, so the expected
# $N\,\Delta Q_{pos}/\mathrm{lr}$ of a group is
#
# $$G_N(p) = 2p^2(1-p)^2\, s_N(p).$$
#
# The cell checks it against the mass balance of one draw (`theory.mass_balance`) for a few $(p, N, k)$.

# %%
for q, n, k in ((0.3, 8, 1), (0.3, 8, 6), (0.05, 64, 2)):
    draw = balance.mass_balance([q, 1 - q], [True, False], np.array([True, True]), r_c=1 - k / n, r_w=-k / n, n=n)
    print(f"p={q}, N={n}, k={k}: N dQ/lr = {n * draw.total:.6f}, 2p^2(1-p)^2 = {2 * q**2 * (1 - q)**2:.6f}")

# %% [markdown]
# The allocators maximise the expected number of **informative groups**, not $G_N$: the factor $2p^2(1-p)^2$
# vanishes like $p^2$ and would steer the budget away from exactly the rare-success prompts BroRL is about. The
# table below reports both per generated sample.
#
# ## 3. One population, one budget

# %%
p = A.p_population(kind, prompts, a=a, b=b, solved=solved, unsolved=unsolved, seed=seed)
table, sizes = compare(p, budget, reps=reps, seed=seed, probe=min(probe, budget), cap=max(cap, budget))
print(f"{prompts} prompts, mean p {p.mean():.3f}, share with 0 < p <= 1/16: {np.mean((p > 0) & (p <= 1 / 16)):.2f}")
table.round(4)

# %%
from brorl_lab.lab.widgets import allocation_figure

allocation_figure(p, sizes)

# %% [markdown]
# ## 4. Move it yourself
#
# Pick the population (a Beta, or a mixture with solved and unsolved shares), the budget per prompt, the probe and
# the cap. The table's last two columns are each strategy's informative groups and Theorem 1 gain per generated
# sample relative to uniform N = 16.

# %%
from brorl_lab.lab.widgets import allocation_explorer

explorer = allocation_explorer(prompts=prompts, reps=max(2, reps // 4), seed=seed, kind=kind, a=a, b=b,
                               solved=solved, unsolved=unsolved, budget=budget, probe=min(probe, budget),
                               cap=max(cap, budget))
explorer

# %% [markdown]
# ## 5. The budget sweep: informative groups per 1,000 generated samples

# %%
rows = {}
for per_prompt in budgets:
    t, _ = compare(p, per_prompt, strategies=("two_stage", "until_signal"), reps=max(2, reps // 2), seed=seed,
                   probe=min(probe, per_prompt), cap=max(cap, per_prompt))
    rows[per_prompt] = t["informative_per_1k_samples"]
uniform = {n: 1000 * A.informative_probability(p, n).mean() / n for n in budgets}
fig = go.Figure([go.Scatter(x=budgets, y=[rows[n][s] for n in budgets], name=s) for s in ("two_stage", "until_signal")]
                + [go.Scatter(x=budgets, y=[uniform[n] for n in budgets], name="uniform N = budget")])
fig.update_layout(title="Informative groups per 1,000 generated samples", xaxis_type="log", yaxis_type="log",
                  xaxis_title="samples per prompt (budget / P)", yaxis_title="informative groups / 1k samples",
                  height=350)
fig

# %% [markdown]
# ## 6. The same allocator on the shipped model
#
# One step's rollout with `two_stage` on the default model: a probe, then the rest of the budget where the probe
# found no signal. The batch that comes back holds groups of unequal size (`batch.sizes`); dynamic sampling, the
# advantages and the loss take it as it is.

# %%
if live_prompts:
    import brorl_lab as bl
    from brorl_lab import steps as S

    policy, tok = bl.load_policy("default")
    engine = bl.make_engine("torch", policy, tok)
    items = S.sample_prompts(["spell_backward"], live_prompts, seed=seed)
    batch = S.rollout_allocated(engine, items, "two_stage", budget=live_prompts * 8, tokenizer=tok, probe=2, cap=32,
                                sampling=bl.RolloutSampling(max_new_tokens=12, seed=seed))
    print("N per prompt:", batch.group_sizes.tolist(), "rounds:", batch.meta["allocation"]["rounds"])
    print("correct per group:", batch.group_sum(batch.correct.long()).tolist())
    print(S.group_metrics(batch))
    engine.close()

# %% [markdown]
# ## What this does not say
#
# - Every number above is an expectation on Bernoulli draws at a **known, fixed** $p$. In training $p$ moves with
#   the policy, the probe's estimate is noisy, and an informative group is not a guaranteed improvement.
# - More informative groups per sample is the allocators' objective by construction; whether it buys held-out
#   pass@1 at equal generated samples is the study's question (issue 44, item 4), not this notebook's.
# - The leftover rule of `until_signal` (once every group has signal, the rest goes to the smallest groups) is ours:
#   Reinforce-Ada stops early and spends less. We spend the whole budget so that arms compare at equal samples.
