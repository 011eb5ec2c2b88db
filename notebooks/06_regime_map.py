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
# # 06 · The regime map: where does broadening pay?
#
# BroRL's theory says a larger N helps most on **rare-success prompts**: a prompt solved with probability p gives a
# group of N samples a learning signal with probability s_N(p) = 1 - p^N - (1-p)^N, about 16p at N = 16 but close
# to 1 at N = 512 when p is small. At equal samples the BroRL arm (N = 512 x 16 prompts) takes 8x fewer optimizer
# updates than the ProRL arm (N = 16 x 64), so the project's rule (`study.regime`, derived here, not the paper's)
# says broadening pays where **rho = E[s_512] / E[s_16] >= 8**. This notebook tests that rule on settings built to
# span rho from ~1 to past 8:
#
# 1. **Settings.** Named settings: a family at a branch point (`model` per setting: `"floor"`, the products_2d
#    floor; `"takeoff"`, the less-trained base of the takeoff race). Constructed settings: a family's training
#    prompts filtered at the branch point by their measured p (512 draws each) into a band of `study.regime.P_BANDS`
#    and written as a `pool:` task (training draws only those prompts, each scored by its own family); its held-out
#    set is drawn the same way, from the family's held-out prompts filtered by the same band. Each pool's
#    `<name>.pool.json` says how it was drawn.
# 2. **The branch point** of every setting: E[s_16], E[s_512] and rho from the measured p (for a constructed
#    setting, on a fresh re-draw of its pool: the draws that chose a prompt would bias its p toward the band).
# 3. **The branch**, both arms for every paired seed, evaluated at step 0 and on the shared grid
#    (`study.arms`); per seed the gap at the last shared sample count, each arm's dynamic-sampling pass rate and
#    its dropped groups by kind, and the collapse rule (`study.compare.COLLAPSE`, the flagship's).
# 4. **The reading, fixed before the run** (`study.regime.regime_reading`, named in the declaration: the rule
#    `broadening_pays` on each axis): supported / refuted / unresolved on
#    branch-point rho and on the in-run rho (the measured DS pass rates' ratio), with unweighted, weighted and
#    leave-one-out fits, the crossover only when every fit resolves it.
#
# **Branch points.** The flagship now branches from the learned plateau and the takeoff base (notebook 02). The
# map keeps the products_2d floor (`data/plateau_model`) as its default branch point because its constructed
# settings filter a family's prompts into bands of p at the branch point, and the learned plateau's prompts were
# polarised by learning (0.8% of them with rare successes, docs/results/paid.md), which leaves its low-p bands
# nearly empty. The learned plateau and the takeoff base enter as named settings of their own
# (`spell_backward+gcd@learned`, the `@takeoff` settings), so the map covers the flagship's branch points too.
#
# Run headless: `python -m brorl_lab regime-map` calls the same function this notebook calls,
# `study.regime.run_regime_map`, on the same declared design (`study.regime.RegimeMap`; `regime.PRESETS["full"]` is
# the shipped one). It writes the declaration first (`declaration.json`: design, seeds, the reading and its
# thresholds), measures, runs and reads; every results file gets its provenance. Resumable: pools, branch-point
# rates and each setting's arm runs are read back when finished, a partial run resumes. `-p quick=True` is the tiny
# preset the test suite runs.

# %% tags=["parameters"]
quick = False                   # True: the tiny preset (3 settings, tiny sizes) that runs in minutes
model = None                    # the default branch point (None: the preset, floor: data/plateau_model)
settings = None                 # name -> tasks, optional model, band, candidates (None: study.regime.SETTINGS)
seeds = None                    # paired seeds per setting (None: the preset, 8)
steps = None                    # BroRL-arm steps (None: the preset, 4); the ProRL arm takes 8x as many
eval_every = None               # BroRL-arm steps between shared-grid points (None: the preset)
arm_table = None                # arm -> rollouts_per_prompt (N) and prompts_per_step (None: study.recipe.ARM_TABLE)
run_dir = None                  # declaration, tables, figure, pools and the arm runs go here; None: runs/regime_map/
ship = False                    # True: a run meant for shipped results (declaration committed, tree clean)
jobs = None                     # arm runs side by side, over all settings (None: one per physical core; 1: one at a time)
ray = None                      # a Ray cluster address (host:port): the arm runs go there as tasks (docs/study-jobs.md)
torch_threads = None            # torch threads per arm run (None: physical cores // jobs; 1 per Ray task)
export_png = True               # write the figure as PNG into run_dir (needs Chromium)

# %%
import logging
from pathlib import Path

import pandas as pd
import transformers
from IPython.display import display

from brorl_lab.core.paths import RUNS_DIR
from brorl_lab.study import regime

logging.getLogger("math_verify").setLevel(logging.ERROR)
transformers.utils.logging.disable_progress_bar()

given = dict(model=model, settings=settings, seeds=seeds, steps=steps, eval_every=eval_every, arm_table=arm_table)
study = regime.preset("quick" if quick else "full", full_size=ship, **{k: v for k, v in given.items() if v is not None})
out = Path(run_dir) if run_dir else RUNS_DIR / "regime_map"
print(f"settings: {list(study.settings)}\nseeds: {list(study.seeds)}\narms: {study.arm_table}\nout: {out}")

# %% [markdown]
# ## 1 · The run: branch points, the branch on every setting, the reading
#
# `run_regime_map` measures every setting's branch point (a named setting: `reach_prompts` training prompts x
# `draws` draws; a constructed setting: its pool drawn from `pool_candidates` training and `eval_candidates`
# held-out prompts by their p, then re-drawn with fresh samples for its E[s_N] and rho), runs both arms of every
# setting for every paired seed as one set of jobs (resets off in both, same lr and updates per step, evaluated at
# step 0 and on the shared grid), and reads the map with its one reading, `study.regime.regime_reading`.

# %%
result = regime.run_regime_map(study, out, jobs=jobs, ray=ray, threads=torch_threads, ship=ship,
                               export_png=export_png and bool(run_dir))
print(result.text)
print(f"reading: {result.reading}")

# %% [markdown]
# ## 2 · The map, from the files the run wrote
#
# The per-seed rows (`regime_seeds.csv`), the branch points (`regime_branch.csv`), the drift of dropped groups
# (`regime_drift.csv`), the per-setting table recomputed from the per-seed rows (`regime_map.csv`), the seeds each
# setting's sd needs (`regime_power.csv`), the reading on both axes (`regime.json`, `regime.txt`) and the figure
# (`regime_map.png`), each with its provenance (`python -m brorl_lab regime-map --summarize --out OUT` redoes them
# from the per-seed files; `--read OUT` prints the reading).

# %%
if result.finished:
    per_seed, branch, drift = regime.read_outputs(out)
    table = regime.setting_table(per_seed, branch)
    fig_map = regime.regime_figure(table, per_seed)
    display(table.round(3))
else:
    fig_map = None
fig_map

# %% [markdown]
# ## 4 · The shipped run, read back
#
# The run behind [docs/results/regime_map.md](../docs/results/regime_map.md) shipped its outputs in
# `notebooks/figures/regime_*` (each file with its provenance beside it: command, commit, checkpoints, machine,
# wall time). The cell reads them back: the reading as the run wrote it, and the map with one grey dot per paired
# seed beside each setting's interval. It reads the files; it runs nothing.

# %%
from brorl_lab.core.paths import NOTEBOOK_DIR

shipped = NOTEBOOK_DIR / "figures"
if (shipped / regime.OUTPUT_FILES["table"]).is_file():
    print((shipped / regime.OUTPUT_FILES["text"]).read_text())
    print(f"reading (study.regime.reading_of_files): {regime.reading_line(regime.reading_of_files(shipped))}")
    shipped_seeds = pd.read_csv(shipped / regime.OUTPUT_FILES["per_seed"])
    shipped_map = pd.read_csv(shipped / regime.OUTPUT_FILES["table"], index_col="setting")
    fig_shipped = regime.regime_figure(shipped_map, shipped_seeds, title="The shipped run: gap at equal samples")
else:
    fig_shipped = None
    print(f"no shipped run in {shipped} (an installed package carries none)")
fig_shipped
