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
# 41% to 62%, and generation **throughput** rises from 36.5 to 72.4 samples/s. Notebook 01 explains the theory:
# with more rollouts per prompt, fewer likely tokens go unsampled, and the update's harmful "unsampled" term
# shrinks; for a prompt solved with probability p a group of N carries a signal with probability
# s_N(p) = 1 - p^N - (1-p)^N, which N = 512 lifts most on *rare-success* prompts (small p).
#
# **The miniature.** The same experiment on a laptop, from the plateau checkpoint `data/plateau_model` (its
# PLATEAU.md says how it was built and how the plateau was measured). Two arms branch from it with the same recipe
# (ProRL v2 by default: REINFORCE++-baseline advantages, k2 KL, clip 0.2 / 0.27, binary reward), the same
# optimizer updates per step and the same lr, and differ only in how each step's samples are spent: the **ProRL
# arm N = 16 x 64 prompts**, the **BroRL arm N = 512 x 16 prompts** (8x the samples per step; the paper's 4:1
# prompt ratio), and optionally a **middle arm N = 64 x 32**. Both train on the same number of samples (steps x
# prompts x N) and are evaluated on **one shared grid**: at the same sample counts and at the same optimizer-update
# counts, so every comparison is a measurement of both arms, paired by seed. Reference resets are **off in both
# arms** (ProRL v2 resets every 200-500 steps, longer than this branch).
#
# **The question, fixed before the run** (`brorl_lab.study.revival.brorl_revives`): BroRL "revives" the plateau
# only if the ProRL arm's slope interval contains 0, the BroRL arm's lies above 0, the paired gap at equal samples
# has an interval above 0, and the gain sits on the prompts only N = 512 reaches, on their low-p side (p < 0.5). All
# intervals are 95% t intervals over paired seeds with t_{0.975, n-1}; the notebook prints the smallest effect the
# run can detect. `make demo` runs 3 seeds (t = 4.30: it can only see large effects, and says how large);
# `python -m brorl_lab scaling --full-size` runs 8.
#
# **What it cannot show:** a 1.5B reasoning model with 16k-token answers, a 3,000-step plateau, or GPU economics.
# Here the responses are a few tokens, so generation is cheap and the *update* dominates each step's time, the
# opposite of a GPU cluster; and a 1-million parameter model may lack the capacity that exploration could unlock.

# %% tags=["parameters"]
# Sizes (papermill overrides this cell; no "=" in these comments: papermill skips such lines). `steps` and
# `eval_every` count BroRL-arm steps; an arm with r times fewer samples per step trains r times as many steps.
model = "plateau"               # "plateau" is data/plateau_model (shipped); or "default", or an HF model directory
families = None                 # None: the families the plateau model was trained on (its plateau.json)
recipe = "prorl_v2"             # the arms' recipe (study.recipe.RECIPES): "prorl_v2" (BroRL's base) or "prorl_v1"
steps = 8                       # BroRL-arm steps (the ProRL arm: 64)
eval_every = 1                  # BroRL-arm steps between points of the shared grid (8 points)
seeds = [0, 1, 2]               # paired seeds (make demo: 3; full_size: 8)
n_small = 16                    # ProRL arm: rollouts per prompt
n_large = 512                   # BroRL arm: rollouts per prompt
prompts_small = 64              # ProRL arm: prompts per step
prompts_large = 16              # BroRL arm: prompts per step (16 x 64 -> 1024 vs 512 x 16 -> 8192 samples: 8x)
n_mid = 0                       # middle arm's rollouts per prompt (0: no middle arm; full_size: 64)
prompts_mid = 32                # middle arm's prompts per step (64 x 32 -> 2048 samples)
middle_seeds = None             # seeds of the middle arm (None: the same as seeds)
optimizer_steps_per_step = 2    # the same in every arm (BroRL keeps the number of PPO mini-batches)
lr = 3e-4                       # every arm's learning rate (the tiny model needs far more than a 1.5B one)
lr_scaling = "none"             # the BroRL arm's lr rule: "none", "sqrt_samples" (x sqrt 8), "sqrt_prompts" (x 1/2)
lr_warmup_steps = 0             # linear lr warm-up (steps of each arm)
reward = "correct"              # the training reward: "correct" (binary, what pass@1 counts) or "score" (partial)
eval_prompts = 64               # per family, from the frozen eval sets
eval_samples = 64               # samples per eval prompt (pass@1 is their mean; pass@k up to k of 64)
eval_k = [1, 8, 64]             # pass@k reported at every grid point
measure_mechanism = True        # measure which prompts carry a signal at each N, and the rule's condition 4
mechanism_prompts = 64          # training prompts measured (mixed over the families)
mechanism_draws = 512           # samples per measured prompt (groups of n_small are read off the same draws)
run_ablations = False           # also run the ablations (section 7; about 4 more BroRL arms per seed)
ablation_seeds = [0]            # seeds of each ablation (the main comparison above uses `seeds`)
ablation_lr_rules = ["none", "sqrt_samples"]    # crossed with ablation_prompts: the 2x2 of lr rule x prompts
ablation_prompts = [8, 16]                      # BroRL-arm prompts per step (its steps grow to keep the samples)
ablation_advantages = ["grpo"]                  # estimators tried on both arms of the main setting
full_size = False               # True: 8 paired seeds and the middle arm N 64 (python -m brorl_lab scaling --full-size)
run_dir = None                  # metrics, figures, verdict and the arm runs go here; None: runs/rollout_scaling/
jobs = None                     # arm runs side by side (None: one per physical core; 1: one after another here)
ray = None                      # a Ray cluster address (host:port): the arm runs go there as tasks (docs/study-jobs.md)
torch_threads = None            # torch threads per arm run (None: physical cores // jobs; 1 per Ray task)
export_png = True               # write the figures as PNG into run_dir (needs Chromium; skipped with a note if absent)

# %%
import json
import logging

import pandas as pd
import transformers
from IPython.display import display

from brorl_lab.core.models import load_policy
from brorl_lab.lab import plots
from brorl_lab.lab.jobs import plan_workers
from brorl_lab.rl.steps import sample_prompts
from brorl_lab.study import ablations as A
from brorl_lab.study import arms as arms_
from brorl_lab.study import compare as C
from brorl_lab.study import mechanism
from brorl_lab.study import revival as R
from brorl_lab.study.recipe import recipe_config

# Quiet: math-verify warns on every call that its signal timeout is off (it must be outside the main thread),
# and transformers draws a bar per model load.
logging.getLogger("math_verify").setLevel(logging.ERROR)
transformers.utils.logging.disable_progress_bar()

jobs, torch_threads = plan_workers(jobs, torch_threads, ray)
if full_size:
    seeds = sorted(set(seeds) | set(range(8)))
    n_mid = n_mid or 64
base = recipe_config(recipe, model=model, tasks=families, steps=steps, eval_every=eval_every,
                     checkpoint_every=eval_every, optimizer_steps_per_step=optimizer_steps_per_step, lr=lr,
                     lr_warmup_steps=lr_warmup_steps, reward=reward, eval_prompts=eval_prompts,
                     eval_samples=eval_samples, eval_k=eval_k, torch_threads=torch_threads)
arm_options = dict(n_small=n_small, n_large=n_large, prompts_small=prompts_small, prompts_large=prompts_large,
                   lr_scaling=lr_scaling, **(dict(n_mid=n_mid, prompts_mid=prompts_mid) if n_mid else {}))
arms = arms_.arm_configs(base, **arm_options)
root = arms_.experiment_root(base, run_dir, **arm_options)
print(f"model: {base.model}\nfamilies: {base.tasks}\nrecipe: {recipe}\nseeds: {seeds}\narm runs: {root}")
print(f"\nThe rule, fixed before the run:\n{R.REVIVES_RULE}")
arms_.arms_table(arms)

# %% [markdown]
# ## 1 · The arms, side by side
#
# Every arm starts from the same checkpoint with the same recipe: advantages, PPO clipping with clip-higher, a small
# KL penalty to the branch point, dynamic sampling (groups whose samples are all right or all wrong are dropped and
# refilled, up to 4 extra rounds). They differ only in how each step's sample budget is spent. The row "evaluated
# after steps" is the shared grid: the ProRL arm is measured at the BroRL arm's sample counts (every 8th step) and
# at its update counts (its first steps).
#
# Each arm is an ordinary `Trainer` run with its own directory and checkpoints: interrupting the kernel stops after
# the current step, and running the cell again resumes; a finished arm is read back, not re-run. The headline arms
# run first for every seed, the middle arm after them.

# %%
df = arms_.run_rollout_scaling(base, seeds=seeds, root=root, middle_seeds=middle_seeds, jobs=jobs, ray=ray,
                               threads=torch_threads, **arm_options)
labels = C.arm_display_names(df)
print(f"{len(df)} metrics rows from {df['run'].nunique()} runs")
df.groupby("arm")[["step", "cum_nominal_samples", "cum_samples", "cum_trained_samples", "cum_updates",
                   "cum_wall_s"]].max()

# %% [markdown]
# ## 2 · Held-out pass@1 at equal samples, equal updates and equal time
#
# The x axis is, in turn, the **samples** each arm's steps were sized for (steps x prompts x N: the budget unit of
# BroRL's Sec. 5), the **optimizer updates**, and **training wall time** (evaluation excluded; on a shared machine
# time is noisier than a count). Each panel is one task family's frozen eval set; the last is their mean. The
# shaded band is the range over seeds.

# %%
fig_samples = plots.arm_pass_at_1_figure(df, x="cum_nominal_samples", labels=labels, colors=C.ARM_COLORS)
fig_samples

# %%
fig_updates = plots.arm_pass_at_1_figure(df, x="cum_nominal_updates", labels=labels, colors=C.ARM_COLORS)
fig_updates

# %%
fig_time = plots.arm_pass_at_1_figure(df, x="cum_wall_s", labels=labels, colors=C.ARM_COLORS)
fig_time

# %% [markdown]
# ## 3 · What each arm's steps looked like: pass rate, entropy, KL, length, throughput
#
# * **Dynamic-sampling pass rate**: informative groups / generated groups. BroRL reports 41% at N = 16 and 62% at
#   N = 512; s_N(p) = 1 - p^N - (1-p)^N predicts it from the per-prompt p (section 5 measures p).
# * **Entropy** of the policy's next-token distribution, **KL to the reference** (the branch point), **response
#   length** in tokens, and the rollout engine's **generation samples/s** (BroRL: 36.5 -> 72.4 samples/s).
#
# The samples each step *generated* include the dynamic-sampling refills, so they differ between arms at the same
# budget; the table after the figure shows both counts.

# %%
fig_diag = plots.arm_diagnostics_figure(df, x="cum_nominal_samples", labels=labels, colors=C.ARM_COLORS)
fig_diag

# %% [markdown]
# ## 4 · The paired comparison on the shared grid
#
# At every grid point both arms were measured; each seed's gap BroRL - ProRL is one paired observation, and the
# table gives the mean gap with its 95% t interval (t_{0.975, n-1}), the spread of the per-seed gaps, and the
# smallest gap this many seeds can tell from zero (**MDE**: t · sd / sqrt(n)) and the one they detect with 80%
# power. The figure draws the same intervals. The middle arm, when run, is compared with the ProRL arm the same
# way. Below the grid, for description only (the verdict, section 6, reads the grid): the same arms at equal
# *generated* samples and equal wall time, which no grid can hit exactly (each run's curve is interpolated between
# its measured points).

# %%
grids = {f"{labels['brorl']} - {labels['prorl']}": {x: R.grid_comparison(df, x) for x in R.GRID_AXES}}
if "middle" in labels:
    grids[f"{labels['middle']} - {labels['prorl']}"] = {
        x: R.grid_comparison(df, x, arm="middle") for x in R.GRID_AXES}
for name, per_axis in grids.items():
    for x, g in per_axis.items():
        print(f"{name}, at equal {plots.X_AXES[x]}:")
        display(R.in_points(g).round(2))
fig_gaps = R.grid_gap_figure(grids)
fig_gaps

# %%
headline = df[df["arm"].isin(C.ARMS)]
for x in ("cum_samples", "cum_wall_s"):
    display(C.compare_arms(headline, x).round(4))
summary = C.summarize(df)
display(summary.T)

# %% [markdown]
# ## 5 · The mechanism: which prompts carry a signal at N = 16 and at N = 512
#
# BroRL's Table 2 (dynamic-sampling pass rate 41% -> 62%) in miniature, measured per prompt instead of assumed:
# `mechanism.prompt_pass_rates` draws 512 samples of each of `mechanism_prompts` training prompts at the branch
# point and reads both group sizes off the same draws. A prompt is **"only N=512"** when a typical group of 16 is
# all right or all wrong (no signal) but the group of 512 is mixed; those with p < 0.5 are the *rare-success* side
# the theory is about. The same prompts are measured again under each headline arm's final policy, for every seed:
# the rule's condition 4 is the paired difference of the change of p on that class (BroRL arm - ProRL arm).

# %%
if measure_mechanism:
    items = sample_prompts(base.tasks, mechanism_prompts, seed=12345)  # training distribution, fixed set
    policy0, tok0 = load_policy(base.model)
    before = mechanism.prompt_pass_rates(policy0, tok0, items, base, n_draws=mechanism_draws, n_small=n_small)
    after = {}
    for seed in seeds:
        after[seed] = {}
        for arm in C.ARMS:
            pol, tok = load_policy(str(root / f"{arm}_s{seed}"))  # a run directory: its last checkpoint's policy/
            after[seed][arm] = mechanism.prompt_pass_rates(pol, tok, items, base, n_draws=mechanism_draws,
                                                           n_small=n_small)
    reach = mechanism.reach_summary(before)
    change = mechanism.reach_change(before, {labels[a]: after[seeds[0]][a] for a in C.ARMS})
    mech = R.mechanism_gaps(before, after)
    fig_mechanism = mechanism.reach_figure(before, change, n_small=n_small, n_large=mechanism_draws)
    display(reach.round(3))
    display(change.round(4))
    print(f"'{R.RARE_SIDE}': {mech['prompts']} of {len(before)} prompts; change of p, BroRL arm - ProRL arm, per seed: "
          + ", ".join(f"{s}: {100 * r['diff']:+.2f}" for s, r in mech["per_seed"].items()) + " points")
    display(fig_mechanism)

# %% [markdown]
# ## 6 · The verdict
#
# `revival.revival_report` computes every number of the rule from the tables above and `revival_text` says the
# outcome, whatever it is, with each condition's interval. This is the study's one verdict; one point is 0.01
# pass@1.

# %%
report = R.revival_report(df, mechanism=mech if measure_mechanism else None)
text = R.revival_text(report)
print(text)

# %% [markdown]
# ## 7 · Ablations: which knob explains the gap (optional: `run_ablations`)
#
# The same branch, re-run with one change at a time (`brorl_lab.study.ablations`): the BroRL arm's **lr rule**
# crossed with its **prompts per step** (fewer prompts means more steps at the same samples, so the ProRL arm and
# the sample budget stay exactly as above), and the **advantage estimator** (GRPO's per-group std instead of
# REINFORCE++-baseline) on both arms. Runs with identical configs are shared, so the ProRL arm above is not re-run.
# Each ablation has `ablation_seeds` seeds: read its gap against the seed spread of `main`.

# %%
if run_ablations:
    variants = A.ablation_grid(lr_rules=ablation_lr_rules, prompts=ablation_prompts,
                               advantages=ablation_advantages, main_lr=lr_scaling, main_prompts=prompts_large)
    opts = {k: v for k, v in arm_options.items() if k not in ("n_mid", "prompts_mid")}
    abl = pd.concat([  # main with every seed (its runs are the ones above, read back), the rest with ablation_seeds
        A.run_ablations(base, {A.MAIN: {}}, seeds=seeds, root=root, **opts),
        A.run_ablations(base, {k: v for k, v in variants.items() if k != A.MAIN}, seeds=ablation_seeds,
                        root=root, **opts)], ignore_index=True)
    ablation_table = A.ablation_table(abl)
    fig_ablations = A.ablation_figure(ablation_table)
    display(ablation_table.round(3))
    display(fig_ablations)
    findings = A.findings(ablation_table, reach if measure_mechanism else None,
                          change if measure_mechanism else None)
    print(findings)
    text += "\n\n" + findings

# %% [markdown]
# ## 8 · Saved outputs
#
# The long metrics table, the summary, `verdict.txt` (the text above) and `verdict.json` (every number of the rule,
# the grids and the intervals), the grid, mechanism and ablation tables and the figures (PNG) go into `run_dir`
# when one is given (`make demo` gives `runs/demo`).

# %%
if run_dir:
    figures = {"pass_at_1_vs_samples": fig_samples, "pass_at_1_vs_updates": fig_updates,
               "pass_at_1_vs_time": fig_time, "diagnostics": fig_diag, "grid_gaps": fig_gaps}
    tables = {f"grid_{x.replace('cum_nominal_', '')}": grids[next(iter(grids))][x] for x in R.GRID_AXES}
    if run_ablations:
        figures["ablations"] = fig_ablations
        tables["ablations"] = ablation_table
    if measure_mechanism:
        figures["mechanism"] = fig_mechanism
        prompts_table = before.merge(pd.concat(
            [a[["uid", "p"]].rename(columns={"p": f"p after {labels[arm]} s{seed}"}).set_index("uid")
             for seed, arms_after in after.items() for arm, a in arms_after.items()], axis=1), on="uid")
        tables.update(mechanism_reach=reach, mechanism_change=change, mechanism_prompts=prompts_table)
    written = arms_.save_outputs(run_dir, df, figures, summary=summary, verdict_text=text, export_png=export_png,
                                 tables=tables)
    (written["verdict"].parent / "verdict.json").write_text(json.dumps(report, indent=1, default=float))
    print("wrote:", ", ".join(str(p) for p in [written["metrics"], written["summary"], written["verdict"],
                                                  *written["tables"], *written["png"]]), "and verdict.json")
    if written["png_note"]:
        print(written["png_note"])
