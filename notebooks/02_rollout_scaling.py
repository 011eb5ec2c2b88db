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
# # 02 · The flagship: does N = 512 revive a learned plateau, paid in generated samples? (BroRL's Fig. 1 in miniature)
#
# **The claim.** BroRL (arXiv 2510.01180) takes a model whose RL training at the usual **N = 16 rollouts per
# prompt** has stalled (a ProRL v2 checkpoint after 3,000 steps) and continues it two ways: the **ProRL arm** at
# N = 16 x 512 prompts per step, the **BroRL arm** at N = 512 x 128 (8x the samples per step). It reports that the
# BroRL arm keeps improving where the ProRL arm stalls, at equal *generated* samples (Table 1), and explains why with
# a one-step mass balance (Theorem 1, notebook 01): more rollouts per prompt leave fewer likely tokens unsampled.
#
# **What this notebook runs: the study as the README reports it** (docs/results/flagship.md), through the study's one
# runner (`brorl_lab.study.runner.run_study`; the CLI's `paid` and `make demo` call the same function). Two branch
# points, both shipped in `data/`:
#
# * **the learned plateau** (`data/learned_plateau`: ProRL v2 at N = 16 raised the default model +12.5 points on
#   spell_backward and gcd, then it stalled), the headline;
# * **the takeoff base** (`data/takeoff_base`: a less-trained model where spell_backward sits in the rare-success
#   regime, BroRL's best case).
#
# From each, the arms of the recipe's arm table (`study.recipe.ARM_TABLE`: **ProRL N = 16 x 64 prompts, BroRL
# N = 512 x 16**, the paper's 4:1 prompt ratio at 8x the samples per step) continue at the branch point's own lr and
# are **paid in generated samples** (every dynamic-sampling refill counted): each arm stops when its generated
# samples reach the budget and is evaluated on a shared grid of thresholds.
#
# **The reading, fixed before the run** (`study.paid.headline_reading`, declared in each run's `declaration.json`):
# the paired 95% t interval over seeds of BroRL - ProRL held-out pass@1 at the budget lies above 0 ("BroRL ahead"),
# below 0 ("BroRL behind") or contains 0 ("not resolved").
#
# **Two sizes.** By default (what `make demo` runs) a **miniature**: the same arms, recipe and branch points at an
# eighth of the budget (16,384 generated samples, 2 grid marks), 3 paired seeds and a lighter evaluation, about 3
# minutes on 2 CPU cores. Three seeds can only see large gaps; the notebook puts each live seed beside the shipped
# full-size seeds (131,072 samples; 20 seeds from the learned plateau, 10 from the takeoff base). `full_size=True`
# (`papermill -p full_size True`) runs the shipped design itself (`study.runner.PRESETS`), which refuses to start
# until its declaration is committed and the tree is clean (pre-registration, `study.results`).
#
# **What it cannot show:** a 1.5B reasoning model with 16k-token answers, a 3,000-step plateau, or GPU economics.

# %% tags=["parameters"]
# Sizes (papermill overrides this cell; no "=" in these comments: papermill skips such lines).
full_size = False               # True: the shipped full-size designs (study.runner.PRESETS), pre-registered
studies = ["learned", "takeoff"]  # the branch points: "learned" (the headline) and "takeoff"
seeds = None                    # paired seeds (None: the miniature's 0 1 2, or the preset's)
budget = None                   # generated samples per arm (None: the miniature's 16384, or 131072)
points = None                   # grid thresholds budget x k / points (None: 2 in the miniature, 8 at full size)
eval_prompts = None             # per family (None: 32 in the miniature, the preset's at full size)
eval_samples = None             # samples per eval prompt (None: 4 in the miniature)
arm_table = None                # None: study.recipe.ARM_TABLE (a test passes a smaller one)
run_dir = None                  # each study's files go to run_dir/<study> (None: runs/flagship)
jobs = None                     # arm runs side by side (None: one per physical core; 1: one after another here)
ray = None                      # a Ray cluster address: the arm runs go there as tasks (docs/study-jobs.md)
torch_threads = None            # torch threads per arm run (None: physical cores // jobs)

# %%
import logging
from pathlib import Path

import pandas as pd
import transformers
from IPython.display import display

from brorl_lab.core.paths import RUNS_DIR
from brorl_lab.lab import plots
from brorl_lab.lab.jobs import plan_workers
from brorl_lab.study import arms as arms_
from brorl_lab.study import compare as C
from brorl_lab.study import paid
from brorl_lab.study import runner as S

logging.getLogger("math_verify").setLevel(logging.ERROR)
transformers.utils.logging.disable_progress_bar()

jobs, torch_threads = plan_workers(jobs, torch_threads, ray)
changes = {k: v for k, v in dict(seeds=seeds, budget=budget, points=points, eval_prompts=eval_prompts,
                                  eval_samples=eval_samples, arm_table=arm_table).items() if v is not None}
if full_size:
    chosen = {name: S.preset(name) for name in studies}
else:
    chosen = {name: S.miniature(name, **changes) for name in studies}
root = Path(run_dir) if run_dir else RUNS_DIR / "flagship"
for name, study in chosen.items():
    print(f"{study.name}: branch point {study.model}, seeds {list(study.seeds)}, budget {study.budget:,} generated "
          f"samples per arm, reading {study.reading.__module__}.{study.reading.__name__} -> {root / name}")
arms_.arms_table(chosen[studies[0]].configs())

# %% [markdown]
# ## 1 · The runs
#
# Each study is one call of the runner: it writes `declaration.json`, runs the arm x seed grid (`jobs` side by
# side; interrupt and run the cell again to resume: finished arms are read back), writes the per-seed files
# (`points.csv`, `metrics.parquet`, `verdict.json`, `verdict.txt`) with their provenance, and reads them. The text
# below each is every reading declared before the run.

# %%
results = {}
for name, study in chosen.items():
    results[name] = S.run_study(study, root / name, jobs=jobs, ray=ray, threads=torch_threads)
    print(f"== {study.name} ==\n{results[name].text}\n")

# %% [markdown]
# ## 2 · Held-out pass@1 against generated samples, and the paired gap on every axis
#
# Each arm's held-out pass@1 (the band is the range over seeds) against the samples it *generated*; then the
# paired gap BroRL - ProRL at every mark of each axis (generated samples, samples trained on, optimizer updates,
# training wall time), with its 95% t interval and a dot per seed.

# %%
for name, res in results.items():
    df = pd.read_parquet(res.out / "metrics.parquet")
    display(plots.arm_pass_at_1_figure(df, x="cum_samples", labels=C.arm_display_names(df), colors=C.ARM_COLORS,
                                       title=f"{res.study.name}: held-out pass@1 against generated samples"))
    display(paid.paid_figure(res.report, title=f"{res.study.name}: BroRL - ProRL per seed and its interval"))

# %% [markdown]
# ## 3 · The live run beside the shipped full-size runs
#
# A dot per seed: BroRL - ProRL held-out pass@1 at the budget, from this run's `points.csv` (**live**) and from the
# shipped full-size per-seed files `notebooks/figures/paid_<study>_points.csv` (**shipped**, 131,072 generated
# samples). Both are read by the same function (`study.runner.headline_of_points`), the one the CLI's
# `paid --read` uses.

# %%
live = {name: res.out / "points.csv" for name, res in results.items()}
shipped = {name: S.shipped_points(name) for name in results}
table = S.live_and_shipped(live, shipped)
display(table.groupby(["study", "source"])["gap_points"].describe().round(2))
S.live_and_shipped_figure(table)

# %% [markdown]
# ## 4 · The reading

# %%
print("Reading (study.paid.headline_reading, fixed before the run): "
      + "; ".join(f"{name}: live {'full size' if full_size else 'miniature'} {S.headline_line(live[name])}, "
                  f"shipped full size {S.headline_line(shipped[name])}" for name in results))
