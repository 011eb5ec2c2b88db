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
# 4. **The reading, fixed before the run** (`study.regime.broadening_pays`): supported / refuted / unresolved on
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
# Run headless: `python -m brorl_lab regime-map` (resumable: pools, branch-point rates and each setting's arm runs
# are read back when finished, a partial run resumes). `-p quick=True` is the tiny preset the test suite runs.

# %% tags=["parameters"]
quick = False                   # True: a tiny preset (3 settings, tiny sizes) that runs in minutes
model = "floor"                 # the default branch point: "floor" is data/plateau_model; a setting may name its own
settings = {                    # name -> tasks, optional model (its branch point), band and candidates (a constructed pool)
    "gcd": {"tasks": ["gcd"]},
    "chain_sum": {"tasks": ["chain_sum"]},
    "simple_equations": {"tasks": ["simple_equations"]},
    "spell_backward": {"tasks": ["spell_backward"]},
    "products": {"tasks": ["products"]},
    "products_2d": {"tasks": ["products_2d"]},
    "spell_backward@takeoff": {"tasks": ["spell_backward"], "model": "takeoff"},
    "gcd (1/4,1)": {"tasks": ["gcd"], "band": "(1/4,1)"},
    "gcd@takeoff (1/16,1/4]": {"tasks": ["gcd"], "model": "takeoff", "band": "(1/16,1/4]"},
    "gcd@takeoff (1/64,1/16]": {"tasks": ["gcd"], "model": "takeoff", "band": "(1/64,1/16]"},
    "products_2d (0,1/64]": {"tasks": ["products_2d"], "band": "(0,1/64]"},
    "spell_backward@takeoff (0,1/64]": {"tasks": ["spell_backward"], "model": "takeoff", "band": "(0,1/64]"},
    "spell_backward+gcd@learned": {"tasks": ["spell_backward", "gcd"], "model": "learned"},  # the learned plateau
}
recipe = "prorl_v2"             # the arms' recipe (study.recipe.RECIPES)
steps = 4                       # BroRL-arm steps (the ProRL arm: 8x as many)
eval_every = 4                  # BroRL-arm steps between shared-grid points (step 0 is always evaluated)
seeds = list(range(8))          # paired seeds per setting (study.regime.power_table says when a setting needs more)
n_small = 16                    # ProRL arm: rollouts per prompt
n_large = 512                   # BroRL arm: rollouts per prompt
prompts_small = 64              # ProRL arm: prompts per step
prompts_large = 16              # BroRL arm: prompts per step (8x the samples per step)
optimizer_steps_per_step = 2    # the same in both arms
lr = 3e-4
eval_prompts = 64               # per setting, from its frozen eval set (a constructed setting: its held-out pool)
eval_samples = 16               # samples per eval prompt
reach_prompts = 64              # named settings: training prompts measured at the branch point
reach_draws = 512               # samples per measured prompt (branch point and pool filtering alike)
pool_candidates = 512           # constructed settings: training prompts measured, those in the band kept (a setting's
eval_candidates = 256           # "candidates" / "eval_candidates" override); held-out prompts measured, likewise
run_dir = None                  # tables, figure, pools and each setting's arm runs go here; None: runs/regime_map/
jobs = None                     # arm runs side by side, over all settings (None: one per physical core; 1: one at a time)
ray = None                      # a Ray cluster address (host:port): the arm runs go there as tasks (docs/study-jobs.md)
torch_threads = None            # torch threads per arm run (None: physical cores // jobs; 1 per Ray task)
export_png = True               # write the figure as PNG into run_dir (needs Chromium)

# %%
import json
import logging
import re
from pathlib import Path

import pandas as pd
import transformers

from brorl_lab.core.models import load_policy
from brorl_lab.core.paths import RUNS_DIR
from brorl_lab.lab.jobs import plan_workers
from brorl_lab.rl.steps import sample_prompts
from brorl_lab.study import arms as arms_
from brorl_lab.study import mechanism, regime
from brorl_lab.study.recipe import recipe_config

logging.getLogger("math_verify").setLevel(logging.ERROR)
transformers.utils.logging.disable_progress_bar()

if quick:  # the tiny preset: every size shrunk, three settings (two named, one constructed)
    settings = {"gcd": {"tasks": ["gcd"]}, "chain_sum": {"tasks": ["chain_sum"]},
                "gcd (1/4,1)": {"tasks": ["gcd"], "band": "(1/4,1)"}}
    steps, eval_every, seeds, n_small, n_large, prompts_small, prompts_large = 1, 1, [0, 1], 2, 8, 4, 2
    optimizer_steps_per_step, eval_prompts, eval_samples, reach_prompts, reach_draws = 1, 4, 2, 4, 16
    pool_candidates, eval_candidates = 12, 12
out = Path(run_dir) if run_dir else RUNS_DIR / "regime_map"
jobs, torch_threads = plan_workers(jobs, torch_threads, ray)
arm_options = dict(n_small=n_small, n_large=n_large, prompts_small=prompts_small, prompts_large=prompts_large)
common = dict(steps=steps, eval_every=eval_every, checkpoint_every=eval_every, lr=lr, reward="correct",
              optimizer_steps_per_step=optimizer_steps_per_step, eval_prompts=eval_prompts,
              eval_samples=eval_samples, eval_k=[1], torch_threads=torch_threads)
for name, s in settings.items():  # every setting validated before anything runs
    regime.check_setting(name, s)
    recipe_config(recipe, model=s.get("model", model), tasks=s["tasks"], task_configs=s.get("task_configs", {}),
                  **common)
print(f"settings: {list(settings)}\nseeds: {seeds}\nout: {out}")

# %% [markdown]
# ## 1 · Settings and their branch points
#
# A named setting measures `reach_prompts` training prompts x `reach_draws` draws. A constructed setting measures
# `pool_candidates` training and `eval_candidates` held-out prompts, keeps those whose p is in its band (the pool
# and its eval set), then re-draws the pool with fresh samples for its E[s_N] and rho. Everything measured is
# written below `run_dir` and read back on a rerun.

# %%
policies: dict = {}


def policy_of(m):
    if m not in policies:
        policies[m] = load_policy(recipe_config(recipe, model=m).model)
    return policies[m]


def slug(name):
    return re.sub(r"[^A-Za-z0-9_.@-]+", "_", name).strip("_")


bases, branch = {}, {}
for name, s in settings.items():
    m = s.get("model", model)
    cfg = recipe_config(recipe, model=m, tasks=s["tasks"], task_configs=s.get("task_configs", {}), **common)
    rates_path = out / "branch" / f"{slug(name)}.csv"
    record = {"setting": name, "model": m, "tasks": s["tasks"], "band": s.get("band"), "draws": reach_draws}
    if "band" in s:
        pool = out / "pools" / f"{slug(name)}.pool.json"
        cands, eval_cands = s.get("candidates", pool_candidates), s.get("eval_candidates", eval_candidates)
        record.update(band_p=list(regime.check_band(s["band"])), train_candidates=cands, train_seed=12345,
                      eval_candidates=eval_cands, eval_seed=54321, redraw_seed=1)
        if not pool.is_file() or {k: v for k, v in json.loads(pool.read_text()).items() if k in record} != record:
            train, _ = regime.draw_pool(*policy_of(m), cfg, s["band"], candidates=cands, draws=reach_draws,
                                        seed=12345, split="train", n_small=n_small)
            held, _ = regime.draw_pool(*policy_of(m), cfg, s["band"], candidates=eval_cands, draws=reach_draws,
                                       seed=54321, split="eval", n_small=n_small)
            regime.write_pool(out / "pools", slug(name), train, held[:eval_prompts], record)
            rates_path.unlink(missing_ok=True)
        task = f"pool:{(out / 'pools' / f'{slug(name)}.jsonl').resolve()}"
        cfg = recipe_config(recipe, model=m, tasks=[task], **common)
    if not rates_path.is_file():
        # a pool's prompts re-drawn with fresh samples (seed 1): an unbiased p for E[s_N]
        items = regime.pool_items(task) if "band" in s else sample_prompts(cfg.tasks, reach_prompts, seed=12345)
        rates = mechanism.prompt_pass_rates(*policy_of(m), items, cfg, n_draws=reach_draws, n_small=n_small,
                                            seed=1 if "band" in s else 0)
        rates_path.parent.mkdir(parents=True, exist_ok=True)
        rates.to_csv(rates_path, index=False)
    rates = pd.read_csv(rates_path)
    branch[name] = {**regime.branch_point_row(rates, n_small=n_small, n_large=n_large),
                    "model": m, "band": s.get("band") or "", "drawn": "pool re-drawn" if "band" in s else "named"}
    bases[name] = cfg
branch = pd.DataFrame.from_dict(branch, orient="index")
branch.index.name = "setting"
branch.round(3)

# %% [markdown]
# ## 2 · The branch on every setting, per seed
#
# The same arms as notebook 02 (resets off in both, same lr and updates per step), evaluated at step 0 and on the
# shared grid. Per seed: both arms at step 0 and at the last shared sample count, the paired gap, each arm's
# dynamic-sampling pass rate, its dropped groups by kind and the collapse rule's flag.

# %%
# each setting's runs under its slug, as its pool and branch files: "gcd (1/4,1)" -> gcd_1_4_1, not nested folders
plans = {name: arms_.plan_rollout_scaling(base, seeds=seeds, **arm_options,
                                         root=arms_.experiment_root(base, out / slug(name), **arm_options))
         for name, base in bases.items()}
frames = arms_.run_plans(plans, jobs=jobs, ray=ray, threads=torch_threads)  # every setting's runs share the cores
per_seed = pd.concat([regime.per_seed_rows(df, name) for name, df in frames.items()], ignore_index=True)
drift = pd.concat([regime.drift_table(df, name) for name, df in frames.items()], ignore_index=True)
per_seed.round(3)

# %% [markdown]
# ## 3 · The map and its reading
#
# `study.regime.write_outputs` writes the per-seed rows (`regime_seeds.csv`), the branch points
# (`regime_branch.csv`), the drift of dropped groups (`regime_drift.csv`), the per-setting table recomputed from the
# per-seed rows (`regime_map.csv`), the seeds each setting's sd needs (`regime_power.csv`), the reading on both axes
# (`regime.json`, `regime.txt`) and the figure (`regime_map.png`) into `run_dir`
# (`python -m brorl_lab regime-map --summarize OUT` redoes this step from the written files).

# %%
result = regime.write_outputs(out, per_seed, branch, drift, export_png=export_png and bool(run_dir))
print(result["text"])
if result["png_note"]:
    print(result["png_note"])
result["table"].round(3)

# %%
fig_map = result["figure"]
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
    shipped_seeds = pd.read_csv(shipped / regime.OUTPUT_FILES["per_seed"])
    shipped_map = pd.read_csv(shipped / regime.OUTPUT_FILES["table"], index_col="setting")
    fig_shipped = regime.regime_figure(shipped_map, shipped_seeds, title="The shipped run: gap at equal samples")
else:
    fig_shipped = None
    print(f"no shipped run in {shipped} (an installed package carries none)")
fig_shipped
