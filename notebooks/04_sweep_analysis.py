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
# # 04 · Sweep analysis: arms at equal samples, equal time, and pass@k
#
# A sweep (`python -m brorl_lab sweep`, `brorl_lab.lab.sweep.run_sweep`, or notebooks 02/03 run with several settings)
# leaves one run directory per setting and seed. This notebook reads **every run under `runs_root`** into one
# DataFrame and asks the questions BroRL's comparison is about:
#
# 1. **Iso-samples.** Is an arm better *for the same number of generated samples*? Large N spends its samples on
#    few prompts; the fair comparison is at equal rollout budget, not at equal step.
# 2. **Iso-time.** Is it better *for the same training time*? BroRL's argument is also about throughput: large N
#    batches generate faster (72.4 vs 36.5 samples/s in its Table 2).
# 3. **pass@k.** Does large N **widen the reasoning boundary** (pass@k at large k: problems the model could not
#    solve before) or only **sharpen** pass@1 (the same problems, solved more reliably)?
#
# It works on any runs root: an empty one or runs still training only show what is there, with a note.

# %% tags=["parameters"]
runs_root = "../runs"              # every run directory below this is read
metric = "eval/mean/pass@1"        # the held-out metric compared across arms
family = "mean"                    # eval family for the pass@k curves; "mean" averages over families
arm_fields = None                  # config fields that define an arm, e.g. ["rollouts_per_prompt"]; None: all that vary
points = 41                        # grid points of the iso-samples / iso-time comparison

# %%
from pathlib import Path

import pandas as pd
from IPython.display import Markdown, display

from brorl_lab.lab import analysis, plots, tracking

df = tracking.load_runs(runs_root)
index = tracking.run_index(runs_root)
if df.empty:
    display(Markdown(f"**No runs with metrics under `{Path(runs_root).resolve()}`** "
                     f"({len(index)} run directories without metrics). Train some first, e.g. notebook 03, "
                     "`python -m brorl_lab train`, or a sweep, then point `runs_root` at their directory. "
                     "The cells below show empty figures until then."))
else:
    display(Markdown(f"**{df['run'].nunique()} runs**, {len(df)} metric rows under `{runs_root}`."))
index

# %% [markdown]
# ## Arms
#
# An arm is one setting of the knobs that differ between runs; runs differing only in seed (or name, or threads) are
# the seeds of one arm and get pooled: the curves show the arm's mean and the band its range over seeds.

# %%
labels = analysis.arm_labels(df, fields=arm_fields)
arms = labels.rename_axis("run").reset_index()
if not arms.empty:
    arms = arms.merge(df.groupby("run").agg(steps=("step", "max"), samples=("cum_samples", "max"),
                                            train_s=("cum_wall_s", "max")).reset_index(), on="run")
arms

# %% [markdown]
# ## Training curves against step
#
# Every run's curve as logged (× marks reference resets). Steps are not a fair unit across arms with different
# samples per step; the next two sections fix the unit.

# %%
plots.run_curves_figure(df, metric, x="step", names=labels.to_dict())

# %% [markdown]
# ## Iso-samples and iso-time
#
# Each run's evaluations are interpolated linearly onto one grid of **samples generated** (`cum_samples`) and one of
# **training time** (`cum_wall_s`, evaluation excluded). The grid covers only the range *every* run reached, so no
# curve is extrapolated; a run that stopped early shortens everyone's comparison (leave it out of `runs_root` if that
# hurts). Wall time depends on the machine and on what else ran on it: compare runs timed on the same hardware.

# %%
iso_samples = analysis.curves_on_grid(df, metric, "cum_samples", points=points, labels=labels)
plots.arm_band_figure(analysis.arm_curves(iso_samples), metric=metric, x="cum_samples")

# %%
iso_time = analysis.curves_on_grid(df, metric, "cum_wall_s", points=points, labels=labels)
plots.arm_band_figure(analysis.arm_curves(iso_time), metric=metric, x="cum_wall_s")

# %% [markdown]
# At the end of the common range (the largest budget every run reached), best arm first:

# %%
budget = pd.concat([analysis.at_budget(iso_samples).assign(budget="samples"),
                    analysis.at_budget(iso_time).assign(budget="seconds")], ignore_index=True)
budget if len(budget) else Markdown(f"No two runs share a range of evaluations of `{metric}` to compare.")

# %% [markdown]
# ## pass@k: wider boundary or sharper pass@1?
#
# Each evaluation logs the unbiased pass@k (`eval/<family>/pass@k`, from `eval_samples` samples per problem) for the
# run's `eval_k`. For each arm we compare the **first** evaluation (before training: dashed) with the **last**
# (solid), and plot the gain against k.
#
# * If training only *sharpens*, the gain is largest at k = 1 and shrinks towards 0 as k grows: the model solves the
#   problems it already could solve sometimes, more reliably, but nothing new.
# * If it *widens the reasoning boundary*, the gain persists (or grows) at large k: problems with almost no correct
#   sample before now have some. ProRL reports this for prolonged training, strongest where the base model was weak;
#   BroRL argues large N helps here because rare correct answers actually get sampled and reinforced.
#
# Large k needs many samples (ProRL: pass@128 from 256); with `eval_k=[1, 4]` the picture is coarse. Log more k
# (e.g. `eval_samples=32`, `eval_k=[1, 2, 4, 8, 16, 32]`) to draw the curve.

# %%
families = analysis.eval_families(df)
if family not in families:
    display(Markdown(f"No `eval/{family}/pass@k` columns (families with pass@k: {families or 'none'})."))
pak = analysis.arm_pass_at_k(analysis.pass_at_k_table(df, family=family, labels=labels))
plots.pass_at_k_figure(pak, family=family)

# %%
boundary = analysis.boundary_summary(pak)
boundary if len(boundary) else Markdown("No pass@k to summarise.")

# %% [markdown]
# Read the *reading* column with the run counts and the curves above: with a handful of eval problems and one seed,
# a difference of one problem flips it. A trustworthy answer needs several seeds per arm, a few hundred eval
# problems, and the large-k end of the curve.
