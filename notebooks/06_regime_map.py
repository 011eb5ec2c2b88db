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
# group of N samples a learning signal with probability s_N(p) = 1 - p^N - (1-p)^N, which is about 16p at N = 16
# but close to 1 at N = 512 when p is small. So the same branch (notebook 02's arms, ProRL N = 16 x 64 prompts
# against BroRL N = 512 x 16, equal samples, one shared grid) should favour BroRL more on task settings with more
# rare-success prompts. This notebook runs that branch on several task settings (families and difficulties) from
# one checkpoint and draws the map:
#
# 1. **At the branch point**, for each setting: 512 draws of `reach_prompts` training prompts
#    (`study.mechanism.prompt_pass_rates`): the share of rare-success prompts (`study.rare.rare_success`:
#    0 < p <= 1/16; the map shipped in notebooks/figures was measured with 0 < p <= 0.1, before that constant) and,
#    from the measured p, each arm's expected share of informative groups E[s_16], E[s_512] and their ratio rho.
# 2. **The branch**, for each setting and seed: both arms on the shared grid; the paired gap BroRL - ProRL at equal
#    samples with its 95% t interval over seeds.
# 3. **The map**: the gap against the rare-success share, a weighted line through it, and its crossover against
#    the one s_N predicts (`study.regime`: broadening pays where rho exceeds the 8x fewer optimizer updates the
#    BroRL arm takes at equal samples).
#
# Run headless by the sweep runner: `python -m brorl_lab regime-map` (`lab.sweep.run_notebook`; resumable: each
# setting's arm runs are read back when finished, a partial one resumes).

# %% tags=["parameters"]
model = "plateau"               # the branch point: "plateau" is data/plateau_model; or an HF model directory
settings = {                    # name -> tasks and their task_configs (reasoning-gym settings for rg: tasks)
    "gcd": {"tasks": ["gcd"]},
    "spell_backward": {"tasks": ["spell_backward"]},
    "products": {"tasks": ["products"]},
    "products_2d": {"tasks": ["products_2d"]},
    "simple_equations": {"tasks": ["simple_equations"]},
    "chain_sum": {"tasks": ["chain_sum"]},
}
recipe = "prorl_v2"             # the arms' recipe (study.recipe.RECIPES)
steps = 4                       # BroRL-arm steps (the ProRL arm: 8x as many)
eval_every = 4                  # BroRL-arm steps between shared-grid points
seeds = [0, 1, 2]               # paired seeds per setting
n_small = 16                    # ProRL arm: rollouts per prompt
n_large = 512                   # BroRL arm: rollouts per prompt
prompts_small = 64              # ProRL arm: prompts per step
prompts_large = 16              # BroRL arm: prompts per step (8x the samples per step)
optimizer_steps_per_step = 2    # the same in both arms
lr = 3e-4
eval_prompts = 64               # per family, from the frozen eval sets
eval_samples = 16               # samples per eval prompt
reach_prompts = 64              # training prompts measured at the branch point, per setting
reach_draws = 512               # samples per measured prompt
run_dir = None                  # tables, figure and each setting's arm runs go here; None: runs/regime_map/
torch_threads = 1
export_png = True               # write the figure as PNG into run_dir (needs Chromium)

# %%
import logging
import math
from pathlib import Path

import pandas as pd
import transformers

from brorl_lab.core.models import load_policy
from brorl_lab.core.paths import RUNS_DIR
from brorl_lab.rl.steps import sample_prompts
from brorl_lab.study import arms as arms_
from brorl_lab.study import mechanism, regime
from brorl_lab.study import revival as R
from brorl_lab.study.recipe import recipe_config

logging.getLogger("math_verify").setLevel(logging.ERROR)
transformers.utils.logging.disable_progress_bar()

out = Path(run_dir) if run_dir else RUNS_DIR / "regime_map"
arm_options = dict(n_small=n_small, n_large=n_large, prompts_small=prompts_small, prompts_large=prompts_large)
bases = {name: recipe_config(recipe, model=model, tasks=s["tasks"], task_configs=s.get("task_configs", {}),
                             steps=steps, eval_every=eval_every, checkpoint_every=eval_every,
                             optimizer_steps_per_step=optimizer_steps_per_step, lr=lr, reward="correct",
                             eval_prompts=eval_prompts, eval_samples=eval_samples, eval_k=[1],
                             torch_threads=torch_threads)
         for name, s in settings.items()}  # every setting validated before anything runs
print(f"branch point: {next(iter(bases.values())).model}\nsettings: {list(settings)}\nseeds: {seeds}\nout: {out}")
arms_.arms_table(arms_.arm_configs(next(iter(bases.values())), **arm_options))

# %% [markdown]
# ## 1 · The branch point: rare-success share and what s_N(p) predicts, per setting

# %%
policy0, tok0 = load_policy(next(iter(bases.values())).model)
rates, predicted = {}, {}
for name, base in bases.items():
    items = sample_prompts(base.tasks, reach_prompts, seed=12345)
    rates[name] = mechanism.prompt_pass_rates(policy0, tok0, items, base, n_draws=reach_draws, n_small=n_small)
    predicted[name] = regime.branch_point_row(rates[name], n_small=n_small, n_large=n_large)
predicted = pd.DataFrame.from_dict(predicted, orient="index")
predicted.round(3)

# %% [markdown]
# ## 2 · The branch on every setting: the paired gap at equal samples
#
# The same arms as notebook 02 (resets off in both, same lr and updates per step), evaluated on the shared grid;
# the gap is read at the last shared sample count, paired by seed. The measured dynamic-sampling pass rates of
# each arm sit beside the E[s_N] predicted from the branch point's p.

# %%
rows = {}
for name, base in bases.items():
    root = arms_.experiment_root(base, out / name, **arm_options)
    df = arms_.run_rollout_scaling(base, seeds=seeds, root=root, **arm_options)
    g = R.grid_comparison(df, "cum_nominal_samples").iloc[-1]
    ds = df[df["step"] > 0].groupby("arm")["ds_pass_rate"].mean()
    rows[name] = {"gap": g["gap"], "lo": g["lo"], "hi": g["hi"], "se": g["sd"] / math.sqrt(g["n"]), "n": g["n"],
                  "prorl": g["prorl"], "brorl": g["brorl"], "budget": g["budget"],
                  f"ds measured N={n_small}": ds.get("prorl"), f"ds measured N={n_large}": ds.get("brorl")}
table = predicted.join(pd.DataFrame.from_dict(rows, orient="index")).sort_values("rare_success")
table.round(3)

# %% [markdown]
# ## 3 · The map
#
# Left: the gap (points of mean pass@1) against the rare-success share, with 95% t intervals, a line weighted by
# 1 / s.e.², the crossover it implies (dashed) and the one s_N predicts (dotted). Right: rho against the same share.
# `study.regime.write_outputs` writes `regime_map.csv` (the table), `regime.txt` (the reading below),
# `regime.json` (the crossover numbers) and the figure as PNG into `run_dir`
# (`python -m brorl_lab regime-map --summarize OUT` redoes this step from a written table).

# %%
result = regime.write_outputs(out, table, export_png=export_png and bool(run_dir))
print(result["text"])
if result["png_note"]:
    print(result["png_note"])
fig_map = result["figure"]
fig_map
