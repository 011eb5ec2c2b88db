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
# # 00 · Quickstart: one RL step, one cell per stage
#
# RL with verifiable rewards repeats one step: **rollout** (sample N answers per prompt) -> **score** (check each
# answer) -> **filter** (drop prompts whose answers were all right or all wrong) -> **advantages** (how much better
# than its siblings each answer did) -> **update** (a clipped policy-gradient step with a KL penalty) -> **sync**
# (the sampler gets the new weights). This notebook runs each stage by hand on the tiny shipped model and shows what
# it returns; then the `Trainer` runs the same functions for a few steps. **Run time** at these defaults: 39 s on the
# 2-core CPU shared with other jobs (load 8 to 15; `make book`'s measurement, with `use_solutions = True`).
#
# **One stage you write yourself:** the GRPO advantage (section 5). Its cell holds a `# TODO` stub; the cell after it
# checks your function against `brorl_lab.rl.algo` and stops the notebook with a message until it is right. The
# reference solution is kept apart, in `notebooks/solutions/00_quickstart.py`; `use_solutions = True` below runs
# the notebook with it (the tests and the book do).

# %% tags=["parameters"]
model = "default"                      # the tiny Qwen2 in data/default_model, or a local HF model directory
tasks = ["gcd", "simple_equations"]    # task families (brorl_lab.rollout.tasks.TASKS)
prompts_per_step = 8                   # prompts (groups) per step
rollouts_per_prompt = 8                # N, samples per prompt
trainer_steps = 3
seed = 0
torch_threads = 1
run_dir = None                         # where the Trainer run goes; None: a temporary directory
overwrite = False                      # replace a run already in run_dir/quickstart (sweep retries pass True)
use_solutions = False                  # True: fill the exercise from notebooks/solutions/00_quickstart.py

# %%
import logging
import tempfile

import torch
import transformers
from IPython.display import display

from brorl_lab.core.config import Config
from brorl_lab.core.models import load_policy, make_reference
from brorl_lab.lab import plots
from brorl_lab.lab.course import Exercises, check_advantage
from brorl_lab.rl import algo
from brorl_lab.rl import steps as S
from brorl_lab.rl.spec import resolve
from brorl_lab.rl.trainer import Trainer
from brorl_lab.rollout.engines import RolloutSampling, make_engine
from brorl_lab.rollout.tasks import TASKS

# Quiet: math-verify warns on every call that its signal timeout is off (it must be outside the main thread),
# and transformers draws a bar per model load.
logging.getLogger("math_verify").setLevel(logging.ERROR)
transformers.utils.logging.disable_progress_bar()
torch.set_num_threads(torch_threads)
torch.manual_seed(seed)
cfg = Config(model=model, tasks=tasks, rollouts_per_prompt=rollouts_per_prompt, prompts_per_step=prompts_per_step,
             steps=trainer_steps, eval_every=trainer_steps, eval_prompts=16, eval_samples=4, eval_k=[1, 4],
             lr=3e-4, seed=seed, template="plain", torch_threads=torch_threads,
             run_dir=run_dir or tempfile.mkdtemp(prefix="quickstart_"), run_name="quickstart")
policy, tok = load_policy(cfg.model)            # trainable policy (train mode) and its tokenizer
spec = resolve(cfg, tokenizer=tok)               # names checked, tasks built, template fixed: the Trainer's first step
reference = make_reference(policy)               # frozen copy: the KL term's pi_ref
engine = make_engine("torch", policy, tok)       # the rollout engine keeps its own copy of the weights
optimizer = torch.optim.AdamW(policy.parameters(), lr=cfg.lr)
print(f"{sum(p.numel() for p in policy.parameters()):,} parameters; engine: {type(engine).__name__}")
exercise = Exercises("00_quickstart", use_solutions)   # @exercise: your function, or the kept-apart solution

# %% [markdown]
# ## 1 · Prompts
#
# `sample_prompts` mixes the task families uniformly and is deterministic in the seed. Each item carries its
# question, its reference answer and whatever its verifier needs.

# %%
items = S.sample_prompts(cfg.tasks, cfg.prompts_per_step, seed=seed)
display([(it.family, it.question, it.answer) for it in items[:4]])
print("the exact prompt the model sees:", repr(TASKS[items[0].family].format_prompt(items[0], spec.template)))

# %% [markdown]
# ## 2 · Rollout: N samples per prompt
#
# A `RolloutBatch` holds every sample's tokens, the sampler's log-probabilities, lengths and decoded text,
# prompt-major (sample `p * N + s` is sample `s` of prompt `p`). Displayed, it is an HTML table of a few samples.

# %%
sampling = RolloutSampling(temperature=cfg.temperature, top_p=cfg.top_p, max_new_tokens=cfg.max_new_tokens,
                           seed=seed)
batch = S.rollout(engine, items, n=cfg.rollouts_per_prompt, sampling=sampling, template=spec.template)
batch

# %% [markdown]
# ## 3 · Score
#
# Each family's verifier turns a response into a `reward` and a binary `correct`.

# %%
batch = S.score(batch, template=spec.template)
batch.to_pandas()[["prompt_index", "response", "reward", "correct"]].head(8)

# %% [markdown]
# ## 4 · Filter (dynamic sampling)
#
# A group whose N samples are all correct or all wrong has zero advantage for every sample: no signal. DAPO, ProRL
# and BroRL drop such groups; the share kept is BroRL's *dynamic-sampling pass rate*. The `Trainer` refills with
# fresh prompts; here we simply draw another set of prompts if nothing survived.

# %%
kept, stats = S.filter_groups(batch)
for extra in range(1, 5):
    if kept.num_prompts:
        break
    more = S.score(S.rollout(engine, S.sample_prompts(cfg.tasks, cfg.prompts_per_step, seed=seed + extra),
                             n=cfg.rollouts_per_prompt, sampling=sampling, template=spec.template),
                   template=spec.template)
    kept, stats = S.filter_groups(more)
assert kept.num_prompts, "no informative group: raise rollouts_per_prompt or prompts_per_step"
print(f"pass rate {stats.pass_rate:.0%}: kept {stats.kept_groups} of {stats.generated_groups} groups")
stats

# %% [markdown]
# ## 5 · Advantages
#
# GRPO: each sample's reward minus its group's mean, divided by the group's standard deviation. One number per
# sample.
#
# ### Exercise · The GRPO advantage
#
# Write it for rewards shaped prompts x rollouts, $[P, N]$:
# $A_{p,s} = (r_{p,s} - \bar r_p) / (\sigma_p + \varepsilon)$ with $\bar r_p$ the group's mean and $\sigma_p$ its
# sample standard deviation (divide by $N - 1$, as verl and TRL do), $\varepsilon = 10^{-6}$. A group whose rewards
# are all equal carries no signal: its advantages must be exactly 0. Three or four lines of torch.

# %% tags=["exercise"]
@exercise
def grpo_advantage(rewards, *, eps=1e-6):
    """GRPO advantages [P, N] from rewards [P, N]; a uniform group gets exactly 0."""
    return torch.zeros_like(rewards)          # TODO: centre by the group mean, divide by the group std + eps


# %% tags=["check"]
rewards = kept.grouped(kept.rewards).float()                          # [P, N] this batch's kept groups
mine, ref = grpo_advantage(rewards), algo.grpo(rewards, std_norm=True)
assert torch.allclose(mine, ref, atol=1e-5), "not yet: on this batch's kept groups your advantages differ from algo.grpo"
# then random groups and edge cases: uniform groups at 0.1 and 0, one success among 512, a group of one, ...
print(exercise.said(check_advantage(grpo_advantage, "grpo"), "grpo_advantage"))

# %% [markdown]
# The trainer computes them with the configured estimator (`cfg.advantage`); shown as prompts x rollouts.

# %%
adv = S.advantages(kept, cfg.advantage, std_norm=cfg.adv_std_norm)
assert cfg.advantage != "grpo" or torch.allclose(kept.grouped(adv), grpo_advantage(rewards), atol=1e-5)
kept.grouped(adv).numpy().round(2)

# %% [markdown]
# ## 6 · Update
#
# `update` splits the groups into `optimizer_steps_per_step` mini-batches and takes one AdamW step per mini-batch
# on PPO-clip (the config's `eps_low` / `eps_high`, printed below) plus β·KL to the reference. The behaviour log-probs it clips against are
# recomputed first, except on-policy (one mini-batch, no importance correction: here), where they equal the
# current ones and `update` uses `logp.detach()`. The `UpdateReport` carries the averaged loss, KL, entropy,
# clipped shares and gradient norm.

# %%
print(f"PPO clip range [1 - {cfg.eps_low:g}, 1 + {cfg.eps_high:g}], KL beta {cfg.kl_beta:g} ({cfg.kl_estimator})")
report = S.update(policy, optimizer, kept, adv, cfg=cfg, reference=reference)
report

# %% [markdown]
# ## 7 · Sync
#
# The engine samples from its own copy of the weights; `sync` pushes the new policy into it.

# %%
S.sync(engine, policy)
same = all(torch.equal(a, b) for a, b in zip(engine.model.state_dict().values(), policy.state_dict().values()))
print("engine weights equal the updated policy:", same)

# %% [markdown]
# ## 8 · The same stages in a loop: `Trainer`
#
# `Trainer.run()` calls these functions in this order, times each stage, refills dynamic sampling, evaluates on the
# frozen eval sets (row 0 is the evaluation before training), checkpoints and can resume. One row per step, and the
# same steps as curves: the mean reward and pass@1 on each step's training prompts, and pass@1 on the held-out eval
# sets before and after training (`python -m brorl_lab report RUN_DIR` draws every curve of a run on one page).
#
# **What you should see:** three short curves, one point per step. With so few steps and prompts they move up or
# down by chance; they show the loop runs, not that it learns (notebooks 02 and 03 train longer).

# %%
with Trainer(cfg, policy=policy, tokenizer=tok, engine=engine, overwrite=overwrite) as trainer:
    metrics = trainer.run()
cols = ["step", "samples", "ds_pass_rate", "reward_mean", "loss", "kl", "entropy", "step_wall_s",
        *[c for c in metrics.columns if c.startswith("eval/mean/")]]
print(f"run directory: {trainer.run_dir.path}")
display(metrics[[c for c in cols if c in metrics.columns]])
plots.metrics_grid_figure(metrics.assign(run="quickstart"), ["reward_mean", "pass_at_1", "eval/mean/pass@1"],
                          cols=3, title=f"{trainer_steps} steps of the quickstart run")
