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
# # 05 · One point of an iso-compute sweep over N
#
# BroRL compares N = 16 with N = 512. Between and beyond them lies a question the paper leaves unswept: at a fixed
# number of **samples per step** (prompts x N), where does a larger N stop paying? This notebook trains **one**
# setting, from the flagship's branch point (`data/learned_plateau`: ProRL v2 at N = 16 raised it, then it stalled;
# the headline of docs/results/flagship.md) with the flagship's recipe, and evaluates pass@k at several k. (Until
# issue 42 it started from the products_2d floor, `data/plateau_model`, which the flagship has left: `model="floor"`
# still runs from there.) The sweep runs it once per (N, prompts per step) pair of the iso-compute planner and per seed:
#
#     python -m brorl_lab iso-compute --samples-per-step 512 --n 4 16 64 256 512 --seeds 0 1 2
#
# which calls `brorl_lab.lab.sweep.run_iso_compute` (papermill, resumable: a finished run is skipped, a partial
# one resumes from its checkpoint) and then `analysis.iso_compute_summary` over the runs: final pass@1 and pass@k
# against N, and whether a larger N widens the boundary (pass@k at large k) or only sharpens pass@1.

# %% tags=["parameters"]
model = "learned"              # "learned" is data/learned_plateau; "floor" data/plateau_model; or "default", a directory
families = None                # None: the families the branch point was trained on (its plateau.json)
rollouts_per_prompt = 16       # N
prompts_per_step = 32          # prompts x N is the fixed samples per step of the sweep
steps = 20
optimizer_steps_per_step = 1   # the same for every N (512 samples of 1 prompt cannot split into more mini-batches)
eval_every = 10
seed = 0
eval_prompts = 64              # per family, from the frozen eval sets
eval_samples = 16              # samples per eval prompt; pass@k for every k in eval_k up to this
eval_k = [1, 4, 16]
torch_threads = 1
run_dir = None                 # the Trainer run goes to run_dir/run; None: runs/iso_compute/one

# %%
import logging

import transformers
from IPython.display import display

from brorl_lab.study.recipe import open_trainer, recipe_config

logging.getLogger("math_verify").setLevel(logging.ERROR)
transformers.utils.logging.disable_progress_bar()

cfg = recipe_config(model=model, tasks=families, rollouts_per_prompt=rollouts_per_prompt,
                    prompts_per_step=prompts_per_step, steps=steps, eval_every=eval_every,
                    optimizer_steps_per_step=optimizer_steps_per_step, checkpoint_every=eval_every, seed=seed,
                    eval_prompts=eval_prompts, eval_samples=eval_samples, eval_k=eval_k,
                    torch_threads=torch_threads, run_dir=run_dir or "../runs/iso_compute/one", run_name="run")
print(f"N={cfg.rollouts_per_prompt} x {cfg.prompts_per_step} prompts = {cfg.samples_per_step} samples per step; "
      f"{cfg.steps} steps; families {cfg.tasks}; seed {cfg.seed}")

# %% [markdown]
# Train (resumes from the run's checkpoint when there is one), then read pass@k at the first and the last
# evaluation.

# %%
with open_trainer(cfg, progress=True) as trainer:
    trainer.run()
    metrics = trainer.metrics
cols = [c for c in metrics.columns if c.startswith("eval/mean/pass@")]
display(metrics.dropna(subset=cols)[["step", "cum_samples", *cols]].round(4))
