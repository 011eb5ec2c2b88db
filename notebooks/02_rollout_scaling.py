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
# **The miniature.** The same experiment on a laptop. First the tiny shipped model is trained with the ProRL recipe
# at N = 16 until its held-out pass@1 has **learned, then stalled** (`data/plateau_model`, see its PLATEAU.md: +7.9
# points, then 100 steps without a new best: `brorl_lab.study.plateau.plateau_rule`). From there two arms branch with
# the same recipe (ProRL v2 by default: REINFORCE++-baseline advantages, k2 KL, clip 0.2 / 0.27, binary reward,
# reference resets at the same sample counts in both arms) and differ only in how each step's samples are spent:
# the ProRL arm N = 16 x 16 prompts, the BroRL arm N = 512 x 4 prompts (8x the samples per step), with the same
# optimizer updates per step. Both train on the same nominal number of samples, and we compare them at equal
# *generated* samples, at equal *optimizer updates* and at equal *wall time*, over **three seeds** (the bands are the
# range over seeds).
#
# Then the notebook explains what it found: **ablations** (lr rule x prompts per step, advantage estimator), and
# the **mechanism** measured directly: which training prompts carry a learning signal at N = 16 and at N = 512, and
# whether those that only N = 512 reaches are the ones the BroRL arm improves.
#
# **What it cannot show:** a 1.5B reasoning model with 16k-token answers, a 3,000-step plateau, or GPU economics.
# Here the responses are a few tokens, so generation is cheap and the *update* dominates each step's time, the
# opposite of a GPU cluster; and a 1-million parameter model may lack the capacity that exploration could unlock.

# %% tags=["parameters"]
# Sizes (papermill overrides this cell; no "=" in these comments: papermill skips such lines). `steps` and
# `eval_every` count BroRL-arm steps; the ProRL arm gets (samples-per-step ratio) times as many, so both train on
# the same number of samples and are evaluated at the same sample counts.
model = "plateau"               # "plateau" is data/plateau_model (shipped); or "default", or an HF model directory
families = None                 # None: the families the plateau model was trained on (its plateau.json)
recipe = "prorl_v2"             # the arms' recipe (study.plateau.RECIPES): "prorl_v2" (BroRL's base) or "prorl_v1"
steps = 12                      # BroRL-arm steps (the ProRL arm: 96)
eval_every = 4                  # BroRL-arm steps between held-out evaluations
seeds = [0, 1, 2]
n_small = 16                    # ProRL arm: rollouts per prompt
n_large = 512                   # BroRL arm: rollouts per prompt
prompts_small = 16              # ProRL arm: prompts per step
prompts_large = 4               # BroRL arm: prompts per step (16 x 16 -> 256 vs 512 x 4 -> 2048 samples: 8x)
optimizer_steps_per_step = 2    # the same in both arms (BroRL keeps the number of PPO mini-batches)
lr = 3e-4                       # the ProRL arm's learning rate (the tiny model needs far more than a 1.5B one)
lr_scaling = "none"             # the BroRL arm's lr rule: "none", "sqrt_samples" (x sqrt 8), "sqrt_prompts" (x 1/2)
lr_warmup_steps = 0             # linear lr warm-up (steps of each arm)
reward = "correct"              # the training reward: "correct" (binary, what pass@1 counts) or "score" (partial)
eval_prompts = 64               # per family, from the frozen eval sets
eval_samples = 8                # samples per eval prompt (pass@1 is their mean)
run_ablations = True            # run the ablations (section 5)
ablation_seeds = [0]            # seeds of each ablation (the main comparison above uses `seeds`)
ablation_lr_rules = ["none", "sqrt_samples"]    # crossed with ablation_prompts: the 2x2 of lr rule x prompts
ablation_prompts = [4, 8]                       # BroRL-arm prompts per step (its steps shrink to keep the samples)
ablation_advantages = ["grpo"]                  # estimators tried on both arms of the main setting
measure_mechanism = True        # measure which prompts carry a signal at each N (section 6)
mechanism_prompts = 64          # training prompts measured (mixed over the families)
mechanism_draws = 512           # samples per measured prompt (groups of n_small are read off the same draws)
full_size = False               # True: 3x the steps and 3 seeds for the ablations too (about an hour)
run_dir = None                  # metrics, figures, summary and the arm runs go here; None: runs/rollout_scaling/
torch_threads = 1               # 2 is faster on an idle 2-core machine, but two threads thrash when others compete
export_png = True               # write the figures as PNG into run_dir (needs Chromium; skipped with a note if absent)

# %%
import logging

import pandas as pd
import transformers
from IPython.display import display

from brorl_lab.core.models import load_policy
from brorl_lab.study import ablations as A
from brorl_lab.lab import plots
from brorl_lab.study import experiments, mechanism
from brorl_lab.rl.steps import sample_prompts

# Quiet: math-verify warns on every call that its signal timeout is off (it must be outside the main thread),
# and transformers draws a bar per model load.
logging.getLogger("math_verify").setLevel(logging.ERROR)
transformers.utils.logging.disable_progress_bar()

if full_size:
    steps, eval_every = 3 * steps, 3 * eval_every
    ablation_seeds = sorted(set(ablation_seeds) | {0, 1, 2})
base = experiments.recipe_config(recipe, model=model, tasks=families, steps=steps, eval_every=eval_every,
                                 checkpoint_every=eval_every, optimizer_steps_per_step=optimizer_steps_per_step,
                                 lr=lr, lr_warmup_steps=lr_warmup_steps, reward=reward, eval_prompts=eval_prompts,
                                 eval_samples=eval_samples, torch_threads=torch_threads)
arm_options = dict(n_small=n_small, n_large=n_large, prompts_small=prompts_small, prompts_large=prompts_large,
                   lr_scaling=lr_scaling)
arms = experiments.arm_configs(base, **arm_options)
root = experiments.experiment_root(base, run_dir, **arm_options)
print(f"model: {base.model}\nfamilies: {base.tasks}\nrecipe: {recipe}\nseeds: {seeds}\narm runs: {root}")
experiments.arms_table(arms)

# %% [markdown]
# ## 1 · The recipe, side by side
#
# Both arms start from the same checkpoint with the same recipe: advantages, PPO clipping with clip-higher, a small
# KL penalty to a reference policy, dynamic sampling (groups whose samples are all right or all wrong are dropped
# and refilled, up to 4 extra rounds) and reference resets **at the same numbers of trained samples** in both arms.
# They differ only in how each step's sample budget is spent: many prompts with few rollouts, or few prompts with
# many. Note the last rows: at equal samples the BroRL arm takes 8x fewer optimizer updates.
#
# Each arm is an ordinary `Trainer` run with its own directory and checkpoints: interrupting the kernel stops after
# the current step, and running the cell again resumes; a finished arm is read back, not re-run.

# %%
df = experiments.run_rollout_scaling(base, seeds=seeds, root=root, **arm_options)
labels = experiments.arm_display_names(df)
print(f"{len(df)} metrics rows from {df['run'].nunique()} runs")
df.groupby("arm")[["step", "cum_samples", "cum_trained_samples", "cum_updates", "cum_wall_s"]].max()

# %% [markdown]
# ## 2 · Held-out pass@1 at equal samples, equal updates and equal time
#
# BroRL's Fig. 1 plots accuracy against training progress. Here the x axis is, in turn, the number of **generated
# samples** (every rollout, including those dynamic sampling threw away), the number of **optimizer updates**, and
# **training wall time** (evaluation excluded; on a shared machine time is noisier than a count). Each panel is one
# task family's frozen eval set; the last is their mean. The shaded band is the range over seeds.

# %%
fig_samples = plots.arm_pass_at_1_figure(df, x="cum_samples", labels=labels)
fig_samples

# %%
fig_updates = plots.arm_pass_at_1_figure(df, x="cum_updates", labels=labels)
fig_updates

# %%
fig_time = plots.arm_pass_at_1_figure(df, x="cum_wall_s", labels=labels)
fig_time

# %% [markdown]
# ## 3 · What each arm's steps looked like: pass rate, entropy, KL, length, throughput
#
# * **Dynamic-sampling pass rate**: informative groups / generated groups. BroRL reports 41% at N = 16 and 62% at
#   N = 512. With N samples a prompt that the model solves with probability p is informative with probability
#   1 - p^N - (1-p)^N: for a hard prompt (small p) that is close to N·p at N = 16 and close to 1 at N = 512.
# * **Entropy** of the policy's next-token distribution, **KL to the reference policy** (reset at the same sample
#   counts in both arms), **response length** in tokens.
# * **Generation samples/s**: the rollout engine's throughput (BroRL: 36.5 -> 72.4 samples/s).

# %%
fig_diag = plots.arm_diagnostics_figure(df, x="cum_samples", labels=labels)
fig_diag

# %% [markdown]
# ## 4 · Summary and verdict
#
# `compare_arms` reads both arms at the same budget (the largest one every run reached), interpolating each run's
# eval curve; with three seeds it pairs them and says whether a gap exceeds twice its standard error over seeds.
# The verdict below is computed from those numbers, whatever they say. One point is 0.01 pass@1.

# %%
for x in experiments.X_AXES:
    display(experiments.compare_arms(df, x).round(4))

# %%
summary = experiments.summarize(df)
text = experiments.verdict(df)
display(summary.T)
print(text)

# %% [markdown]
# ## 5 · Ablations: which knob explains the gap
#
# The same branch, re-run with one change at a time (`brorl_lab.study.ablations`): the BroRL arm's **lr rule**
# crossed with its **prompts per step** (more prompts means fewer steps at the same samples, so the ProRL arm and
# the sample budget stay exactly as above), and the **advantage estimator** (GRPO's per-group std instead of
# REINFORCE++-baseline) on both arms. Every variant is compared with its own ProRL arm at equal samples, equal
# updates and equal time; runs with identical configs are shared, so the ProRL arm above is not re-run. In the
# default size each ablation has one seed (`ablation_seeds`): read its gap against the seed spread of `main`.

# %%
if run_ablations:
    variants = A.ablation_grid(lr_rules=ablation_lr_rules, prompts=ablation_prompts,
                               advantages=ablation_advantages, main_lr=lr_scaling, main_prompts=prompts_large)
    abl = pd.concat([  # main with every seed (its runs are the ones above, read back), the rest with ablation_seeds
        A.run_ablations(base, {A.MAIN: {}}, seeds=seeds, root=root, **arm_options),
        A.run_ablations(base, {k: v for k, v in variants.items() if k != A.MAIN}, seeds=ablation_seeds,
                        root=root, **arm_options)], ignore_index=True)
    ablation_table = A.ablation_table(abl)
    fig_ablations = plots.ablation_figure(ablation_table)
    display(ablation_table.round(3))
    display(fig_ablations)

# %% [markdown]
# ## 6 · The mechanism: which prompts carry a signal at N = 16 and at N = 512
#
# BroRL's Table 2 (dynamic-sampling pass rate 41% -> 62%) in miniature, measured per prompt instead of assumed:
# `mechanism.prompt_pass_rates` draws 512 samples of each of `mechanism_prompts` training prompts from the branch
# point (the plateau checkpoint) and reads both group sizes off the same draws. A prompt is **"only N=512"** when
# a typical group of 16 is all right or all wrong (no signal) but the group of 512 is mixed. Then the same prompts
# are measured again under each arm's final policy (seed `seeds[0]`): if broadening exploration works as BroRL
# says, the BroRL arm should gain most on exactly the "only N=512" prompts.

# %%
if measure_mechanism:
    items = sample_prompts(base.tasks, mechanism_prompts, seed=12345)  # training distribution, fixed set
    policy0, tok0 = load_policy(base.model)
    before = mechanism.prompt_pass_rates(policy0, tok0, items, base, n_draws=mechanism_draws, n_small=n_small)
    after = {}
    for arm in ("prorl", "brorl"):
        pol, tok = load_policy(str(root / f"{arm}_s{seeds[0]}"))  # a run directory: its last checkpoint's policy/
        after[labels[arm]] = mechanism.prompt_pass_rates(pol, tok, items, base, n_draws=mechanism_draws,
                                                         n_small=n_small)
    reach = mechanism.reach_summary(before)
    change = mechanism.reach_change(before, after)
    fig_mechanism = mechanism.reach_figure(before, change, n_small=n_small, n_large=mechanism_draws)
    display(reach.round(3))
    display(change.round(4))
    display(fig_mechanism)

# %% [markdown]
# ## 7 · What the study says
#
# The reading below is computed from the tables above (`ablations.findings`): the main gap on each budget with its
# seed spread, what each ablation changed, the setting where the BroRL arm did best, and whether the prompts only
# N = 512 reaches are where it gained. The README records the last `make demo` and what we concluded from it.

# %%
findings = A.findings(ablation_table if run_ablations else pd.DataFrame(),
                      reach if measure_mechanism else None, change if measure_mechanism else None)
print(findings)

# %% [markdown]
# ## 8 · Saved outputs
#
# The long metrics table, the summary, the verdict, the ablation and mechanism tables and the figures (PNG) go into
# `run_dir` when one is given (`make demo` gives `runs/demo`).

# %%
if run_dir:
    figures = {"pass_at_1_vs_samples": fig_samples, "pass_at_1_vs_updates": fig_updates,
               "pass_at_1_vs_time": fig_time, "diagnostics": fig_diag}
    tables = {}
    if run_ablations:
        figures["ablations"] = fig_ablations
        tables["ablations"] = ablation_table
    if measure_mechanism:
        figures["mechanism"] = fig_mechanism
        prompts_table = before.merge(pd.concat([a[["uid", "p"]].rename(columns={"p": f"p after {arm}"}).set_index("uid")
                                                for arm, a in after.items()], axis=1), on="uid")
        tables.update(mechanism_reach=reach, mechanism_change=change, mechanism_prompts=prompts_table)
    written = experiments.save_outputs(run_dir, df, figures, summary=summary, verdict_text=text + "\n\n" + findings,
                                       export_png=export_png, tables=tables)
    print("wrote:", ", ".join(str(p) for p in [written["metrics"], written["summary"], written["verdict"],
                                                  *written["tables"], *written["png"]]))
    if written["png_note"]:
        print(written["png_note"])
