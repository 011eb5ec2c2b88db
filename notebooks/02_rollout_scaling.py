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
# # 02 · Rollout scaling: BroRL vs ProRL in miniature (BroRL's Fig. 1)
#
# **The claim.** BroRL (arXiv 2510.01180) takes a model whose RL training at the usual **N = 16 rollouts per
# prompt** has slowed down (a ProRL v2 checkpoint after 3,000 steps) and continues it two ways:
#
# | arm | rollouts per prompt N | prompts per step | samples per step | optimizer updates per step | lr |
# |---|---:|---:|---:|---:|---|
# | ProRL | 16 | 512 | 8,192 | same | lr₀ |
# | BroRL | 512 | 128 | 65,536 (8x) | same | lr₀ · √8 |
#
# It reports (Table 1, pass@1 Math / Code / Reasoning Gym): the start 61.69 / 52.00 / 61.29; ProRL after 535 more
# steps (133.8 h) 62.02 / 52.74 / 61.45; BroRL after 107 steps (98.1 h) 62.62 / 53.31 / 62.71 and after 191 steps
# (173.8 h) 63.03 / 54.20 / 63.09. Two mechanisms are credited (Table 2): the **dynamic-sampling pass rate** (the
# share of prompts whose N samples are neither all right nor all wrong, so they carry a learning signal) rises from
# 41% to 62%, and generation **throughput** rises from 36.5 to 72.4 samples/s, because large batches of samples of
# the same prompt use the hardware better. Notebook 01 explains the theory: with more rollouts per prompt, fewer
# likely tokens go unsampled, and the update's harmful "unsampled" term shrinks.
#
# **The miniature.** The same experiment on a laptop: the tiny shipped model, first trained with the ProRL recipe
# until its held-out pass@1 stopped improving (`data/plateau_model`, see its PLATEAU.md), then branched into a ProRL
# arm and a BroRL arm with BroRL's recipe: the same optimizer updates per step, 8x the samples per step for BroRL
# (4x fewer prompts, 32x more rollouts each), lr scaled by √8. Both arms train on the same nominal number of
# samples (prompts x N x steps); since dynamic sampling discards and regenerates a different share in each arm, we
# compare them at equal *generated* samples and at equal wall time, reading each arm's curve where both have data.
#
# **What it can show:** the mechanics: how the dynamic-sampling pass rate and samples/s change with N, and whether,
# on this model, the BroRL arm's held-out pass@1 is ahead at equal samples or equal time. **What it cannot:** a 1.5B
# reasoning model with 16k-token answers, a 3,000-step plateau, or GPU economics. Here the responses are a few tokens,
# so generation is cheap and the *update* dominates each step's time, the opposite of a GPU cluster; a 1-million
# parameter model may be stuck because it lacks capacity, which no amount of exploration fixes; and a default run
# with one seed cannot separate a gap of a point or two from noise (set `full_size = True` for 3 seeds).

# %% tags=["parameters"]
# Sizes (papermill overrides this cell; no "=" in these comments: papermill skips such lines). `steps` and
# `eval_every` count BroRL-arm steps; the ProRL arm gets
# (samples-per-step ratio) times as many, so both train on the same number of samples and are evaluated at the
# same sample counts.
model = "plateau"               # "plateau" is data/plateau_model (shipped); or "default", or an HF model directory
families = None                 # None: the families the plateau model was trained on (its plateau.json)
steps = 24                      # BroRL-arm steps (the ProRL arm: 192)
eval_every = 4                  # BroRL-arm steps between held-out evaluations
seeds = [0]
n_small = 16                    # ProRL arm: rollouts per prompt
n_large = 512                   # BroRL arm: rollouts per prompt
prompts_small = 16              # ProRL arm: prompts per step
prompts_large = 4               # BroRL arm: prompts per step (16 x 16 -> 256 vs 512 x 4 -> 2048 samples: 8x)
optimizer_steps_per_step = 2    # the same in both arms (BroRL keeps the number of PPO mini-batches)
lr = 3e-4                       # the ProRL arm's learning rate; BroRL's is lr * sqrt(2048 / 256)
lr_scaling = "sqrt"             # BroRL's rule; "none" gives the BroRL arm the same lr (an ablation)
eval_prompts = 64               # per family, from the frozen eval sets
eval_samples = 8                # samples per eval prompt (pass@1 is their mean)
full_size = False               # True: 3 seeds and 3x the steps, for a result one can trust (an hour or more)
run_dir = None                  # metrics, figures, summary and the arm runs go here; None: runs/rollout_scaling/
torch_threads = 1               # 2 is faster on an idle 2-core machine, but two threads thrash when others compete
export_png = True               # write the figures as PNG into run_dir (needs Chromium; skipped with a note if absent)

# %%
import logging

import transformers
from IPython.display import display

from brorl_lab.lab import experiments, plots

# Quiet: math-verify warns on every call that its signal timeout is off (it must be outside the main thread),
# and transformers draws a bar per model load.
logging.getLogger("math_verify").setLevel(logging.ERROR)
transformers.utils.logging.disable_progress_bar()

if full_size:
    seeds = sorted(set(seeds) | {0, 1, 2})
    steps, eval_every = 3 * steps, 3 * eval_every
base = experiments.recipe_config(model=model, tasks=families, steps=steps, eval_every=eval_every,
                                 checkpoint_every=eval_every, optimizer_steps_per_step=optimizer_steps_per_step,
                                 lr=lr, eval_prompts=eval_prompts, eval_samples=eval_samples,
                                 torch_threads=torch_threads)
arm_options = dict(n_small=n_small, n_large=n_large, prompts_small=prompts_small, prompts_large=prompts_large,
                   lr_scaling=lr_scaling)
arms = experiments.arm_configs(base, **arm_options)
root = experiments.experiment_root(base, run_dir, **arm_options)
print(f"model: {base.model}\nfamilies: {base.tasks}\nseeds: {seeds}\narm runs: {root}")
experiments.arms_table(arms)

# %% [markdown]
# ## 1 · The recipe, side by side
#
# Both arms start from the same checkpoint and use ProRL's recipe: GRPO advantages, PPO clipping with DAPO's
# clip-higher (ε 0.2 / 0.28), a small k3 KL penalty to a reference policy that is reset every 50 steps, and dynamic
# sampling (groups whose samples are all right or all wrong are dropped and refilled, up to 4 extra rounds). They
# differ only in how each step's sample budget is spent: many prompts with few rollouts, or few prompts with many.
#
# Next, both arms train (for each seed). Each arm is an ordinary `Trainer` run with its own directory and
# checkpoints: interrupting the kernel stops after the current step, and running the cell again resumes; a finished
# arm is read back, not re-run.

# %%
df = experiments.run_rollout_scaling(base, seeds=seeds, root=root, **arm_options)
labels = experiments.arm_display_names(df)
print(f"{len(df)} metrics rows from {df['run'].nunique()} runs")
df.groupby("arm")[["step", "cum_samples", "cum_trained_samples", "cum_wall_s"]].max()

# %% [markdown]
# ## 2 · Held-out pass@1 at equal samples
#
# BroRL's Fig. 1 plots accuracy against training progress. Here the x axis is the number of **generated samples**
# (every rollout, including those dynamic sampling threw away). Each panel is one task family's frozen eval set; the
# last is their mean. With two or more seeds the shaded band is the range over seeds.

# %%
fig_samples = plots.arm_pass_at_1_figure(df, x="cum_samples", labels=labels)
fig_samples

# %% [markdown]
# ## 3 · ... and at equal wall time
#
# The same curves against **training wall time** (evaluation excluded). On a GPU, large N mostly buys cheaper
# generation; on this CPU the backward pass over every kept sample dominates, so compare with care: time measured on
# a shared machine is also noisier than a sample count.

# %%
fig_time = plots.arm_pass_at_1_figure(df, x="cum_wall_s", labels=labels)
fig_time

# %% [markdown]
# ## 4 · Why the arms differ: pass rate, entropy, KL, length, throughput
#
# * **Dynamic-sampling pass rate**: informative groups / generated groups. BroRL reports 41% at N = 16 and 62% at
#   N = 512. With N samples a prompt that the model solves with probability p is informative with probability
#   1 - p^N - (1-p)^N: for a hard prompt (small p) that is close to N·p at N = 16 and close to 1 at N = 512.
# * **Entropy** of the policy's next-token distribution: clip-higher and the KL term are there to keep it from
#   collapsing.
# * **KL to the reference policy** (k3 estimate; the reference is reset every 50 steps): how far each arm moves per
#   step. BroRL scales the learning rate by √(samples ratio), a heuristic from large-batch training; if one arm's KL
#   runs far above the other's, its steps are too large for this model, and its held-out pass@1 usually shows it.
#   Try the `lr` parameter, or `lr_scaling = "none"`.
# * **Response length** in tokens.
# * **Generation samples/s**: the rollout engine's throughput (BroRL: 36.5 -> 72.4 samples/s). The per-arm means
#   are in the summary table below (`gen_samples_per_s`; `samples_per_s` there is end to end, update included).

# %%
fig_diag = plots.arm_diagnostics_figure(df, x="cum_samples", labels=labels)
fig_diag

# %% [markdown]
# ## 5 · Summary and verdict
#
# `compare_arms` reads both arms at the same budget (the largest one every run reached), interpolating each run's
# eval curve; the verdict below is computed from those numbers, whatever they say. One point is 0.01 pass@1.

# %%
display(experiments.compare_arms(df, "cum_samples").round(4))
experiments.compare_arms(df, "cum_wall_s").round(4)

# %%
summary = experiments.summarize(df)
text = experiments.verdict(df)
if run_dir:
    figures = {"pass_at_1_vs_samples": fig_samples, "pass_at_1_vs_time": fig_time, "diagnostics": fig_diag}
    written = experiments.save_outputs(run_dir, df, figures, summary=summary, verdict_text=text,
                                       export_png=export_png)
    print("wrote:", ", ".join(str(p) for p in [written["metrics"], written["summary"], written["verdict"],
                                                  *written["png"]]))
    if written["png_note"]:
        print(written["png_note"])
display(summary.T)
print(text)
