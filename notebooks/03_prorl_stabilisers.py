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
# # 03 · ProRL's stabilisers: KL, reference resets, clip-higher
#
# ProRL (arXiv 2505.24864) trains one model with RL for more than 2,000 steps. Long runs fail in two typical ways:
# the policy's **entropy collapses** (it stops exploring: every rollout of a prompt says the same thing, groups become
# uniform, and GRPO's advantage, hence the gradient, vanishes), or the policy **drifts** far from where it started and
# training becomes unstable. ProRL keeps such runs alive with three stabilisers, each a field of `brorl_lab.Config`:
#
# | stabiliser | knob | ProRL's value | what it is for |
# | --- | --- | --- | --- |
# | KL penalty to a reference policy | `kl_beta`, `kl_estimator` | v1: not reported (verl 1e-3, k3); v2: 1e-4, k2 | limits drift from the reference |
# | reference reset | `reset_every`, `reset_on_kl`, `reset_optimizer` | v1: on stalls, optimizer reset; v2: every 200-500 steps or on KL spikes | lets KL-regularised training continue |
# | clip-higher (decoupled PPO clip) | `eps_low`, `eps_high` | 0.2 / 0.4 (v1), 0.2 / 0.28 (v2, DAPO) | keeps entropy up |
#
# This notebook trains one small **baseline** (all three on) and one **ablation** per stabiliser, and compares their
# entropy, KL, reward and held-out pass@1. Run interactively it shows a live dashboard while training (with a
# *Stop* button); under papermill it only draws the figures at the end.
#
# **Read the numbers as a demonstration of the mechanics, not as evidence.** The defaults train a 2M-parameter model
# for a dozen steps on a few prompts so the notebook finishes in about three minutes on two CPU cores. ProRL's effects
# show over hundreds to thousands of steps; at this size one seed's noise is as large as any difference between arms.
# Raise `steps`, `prompts` and `seeds` (and read the curves, not single numbers) to see them clearly.

# %% tags=["parameters"]
# Sizes and knobs (papermill overrides this cell).
steps = 12                       # training steps per arm
N = 8                            # rollouts per prompt
prompts = 4                      # informative prompts per step (two PPO mini-batches of 2)
seeds = [0]                      # one run per arm and seed
tasks = ["gcd"]                  # the default model solves ~30% of gcd: groups are often informative
lr = 3e-3                        # large for RL, so that a dozen steps visibly move the tiny model
kl_beta = 1e-2                   # "small" KL coefficient of the baseline (ProRL v2: 1e-4 on a 1.5B model)
reset_every = 4                  # the "reset every K steps" arm
reset_kl_threshold = 0.5         # the "reset on KL spike" arm: reset when the step's KL exceeds this
eval_every = 4
eval_prompts = 8
run_dir = "../runs/03_prorl_stabilisers"
torch_threads = 1
live = True                      # live dashboard while training; headless runs (papermill, tests) pass False

# %%
import threading
import time

import pandas as pd
import transformers
from IPython.display import Markdown, display

from brorl_lab.core.config import Config
from brorl_lab.lab import plots, tracking
from brorl_lab.lab.widgets import TrainingDashboard, TrainingJob
from brorl_lab.rl.trainer import Trainer

transformers.logging.disable_progress_bar()  # no "Loading weights" bar per arm
base = Config(tasks=list(tasks), rollouts_per_prompt=N, prompts_per_step=prompts, optimizer_steps_per_step=2,
              max_new_tokens=8, temperature=1.2, lr=lr, kl_beta=kl_beta, kl_estimator="k3", eps_low=0.2,
              eps_high=0.28, reset_every=0, reset_on_kl=0.0, reset_optimizer=True, steps=steps,
              eval_every=eval_every, eval_prompts=eval_prompts, eval_samples=4, eval_k=[1, 4],
              checkpoint_every=0, max_resample_rounds=2, run_dir=run_dir, torch_threads=torch_threads)
STABILISER_FIELDS = ["kl_beta", "kl_estimator", "reset_every", "reset_on_kl", "reset_optimizer", "eps_low",
                     "eps_high", "optimizer_steps_per_step", "temperature"]
pd.DataFrame([{"field": f, "baseline": getattr(base, f), "help": Config.__dataclass_fields__[f].metadata["help"]}
              for f in STABILISER_FIELDS]).style.hide(axis="index")

# %% [markdown]
# Two settings matter for what follows. `temperature = 1.2` is ProRL v1's rollout temperature. And
# `optimizer_steps_per_step = 2`: every batch is split into two mini-batches, so the second update runs on a policy
# that has already moved. Only then does the PPO ratio $\pi_\theta / \pi_{old}$ leave 1 and the clip range matter at
# all: with a single update per batch the ratio is exactly 1 and clip-higher has nothing to do (ProRL v1 uses four
# mini-batches per step).
#
# ## The arms
#
# Each arm changes one thing in the baseline:

# %%
ARMS = {
    "baseline":        {},                                     # KL beta, clip 0.2/0.28, no resets
    "no KL":           {"kl_beta": 0.0},                       # beta = 0: no reference at all
    "reset every K":   {"reset_every": reset_every},
    "reset on KL":     {"reset_on_kl": reset_kl_threshold},
    "symmetric clip":  {"eps_high": 0.2},                      # PPO's 0.2 / 0.2 instead of 0.2 / 0.28
}
RUNS = {f"{arm.replace(' ', '_')}-seed{s}": (arm, s) for arm in ARMS for s in seeds}
NAMES = {run: arm if len(seeds) == 1 else f"{arm} (seed {s})" for run, (arm, s) in RUNS.items()}
pd.DataFrame([{"run": run, "arm": arm, "seed": s,
               "changes from the baseline": ", ".join(f"{k}={v}" for k, v in ARMS[arm].items()) or "-"}
              for run, (arm, s) in RUNS.items()])


# %% [markdown]
# ## Training
#
# `train_arm` builds the arm's config and runs a `Trainer`; every run writes its metrics, events (resets) and a
# resumable checkpoint under `run_dir` (re-running this cell starts the arms afresh: `overwrite=True`). Interactively the runs go one after another in a background thread with a
# live dashboard: the curves grow step by step, reset steps are marked with a red ×, and **Stop after this step**
# ends the current arm cleanly (the next one starts; `Trainer.resume(run_dir)` continues a stopped one). A kernel
# interrupt (■) stops the current arm and skips the rest.

# %%
def train_arm(run: str, arm: str, seed: int, callbacks=()) -> pd.DataFrame:
    cfg = base.replace(run_name=run, seed=seed, **ARMS[arm])
    # overwrite=True: a re-run trains the arm afresh, replacing its earlier run (without it the Trainer refuses)
    with Trainer(cfg, callbacks=list(callbacks), progress=False, overwrite=True) as trainer:
        return trainer.run()


halt = threading.Event()


def train_all(callbacks=()) -> dict:
    done = {}
    for run, (arm, seed) in RUNS.items():
        if halt.is_set():
            break
        t0 = time.perf_counter()
        done[run] = train_arm(run, arm, seed, callbacks)
        done[run].attrs["wall_s"] = time.perf_counter() - t0
    return done


if live:
    dashboard = TrainingDashboard(metrics=("reward_mean", "entropy", "kl", "clipfrac_high", "ds_pass_rate",
                                           "eval/mean/pass@1"))
    display(dashboard)

    def _halt():
        halt.set()
        if dashboard.trainer is not None:
            dashboard.trainer.stop()

    job = TrainingJob(lambda: train_all([dashboard]), on_interrupt=_halt, name="03 arms")
else:
    results = train_all()

# %%
if live:
    results = job.result()  # waits for the background runs
summary = pd.DataFrame([{"run": run, "steps": len(df) - 1, "train s": round(df.attrs["wall_s"], 1)}
                        for run, df in results.items()])
summary

# %% [markdown]
# All runs in one table (`tracking.load_runs` reads what the Trainer wrote; `cfg.*` columns carry each run's config):

# %%
df = tracking.load_runs(run_dir)
df = df[df["run"].isin(list(results))]
runs = [r for r in RUNS if r in set(df["run"])]
print(f"{len(runs)} runs, {len(df)} rows, columns like {', '.join(c for c in df.columns[:8])} ...")

# %% [markdown]
# ## 1 · KL to a reference (β = 0 vs small)
#
# The loss adds $\beta$ times a per-token KL estimate (estimator k3 here: an unbiased estimate of
# $\mathrm{KL}(\pi_\theta \,\|\, \pi_{ref})$ by value, whose gradient as a loss is that of the *reverse* KL; see the
# check below). Without it
# nothing pulls the policy back: RL sharpens the distribution onto whatever got rewarded, entropy falls, and the
# policy can wander far from the model it started as. ProRL keeps a small β because a moderate anchor *stabilises*
# long training; it also argues that the usual reason to drop KL (it slows learning) matters less when the model
# starts from a good, already-distilled checkpoint.
#
# With β = 0 no reference model is kept at all, so the no-KL arm logs no KL: its drift shows in the entropy curve.

# %%
kl_runs = [r for r in runs if RUNS[r][0] in ("baseline", "no KL")]
plots.metrics_grid_figure(df, ["entropy", "kl", "reward_mean", "eval/mean/pass@1"], runs=kl_runs, names=NAMES,
                          title="KL penalty: baseline (β > 0) against β = 0")

# %% [markdown]
# ### What each KL estimator does as a loss
#
# With $d = \log\pi(a) - \log\pi_{ref}(a)$ on a token $a \sim \pi$, the three estimators are $k_1 = d$,
# $k_2 = d^2/2$ and $k_3 = e^{-d} - 1 + d$. By *value* all three estimate $\mathrm{KL}(\pi\,\|\,\pi_{ref})$. But a trainer
# adds them to the loss and differentiates through $\log\pi$ with the samples held fixed, and then (with
# $g = \nabla\log\pi(a)$, $\mathbb E_\pi[g] = 0$):
#
# * $k_1$: $\nabla k_1 = g$, so $\mathbb E_\pi[\nabla k_1] = 0$: **as a loss it regularises nothing**;
# * $k_2$: $\nabla k_2 = d\,g$, and $\mathbb E_\pi[d\,g] = \nabla\,\mathrm{KL}(\pi\,\|\,\pi_{ref})$: the only one whose
#   gradient is that of the KL it estimates;
# * $k_3$: $\nabla k_3 = (1 - \pi_{ref}/\pi)\,g$, and its expectation is $\nabla\,\mathrm{KL}(\pi_{ref}\,\|\,\pi)$, the
#   reverse direction (the two agree only to first order near $\pi = \pi_{ref}$).
#
# The cell below checks this exactly on a small categorical ($V = 6$ random logits): `algo.kl_loss_gradients` sums
# $\pi(a)\nabla k(a)$ over all $a$ (the expected gradient of the sampled loss) and compares it with the analytic
# gradients of both KL directions. The other common placement, KL as a *reward* penalty (`kl_placement="reward"`,
# with $k_1$ the usual choice), subtracts $\beta\sum_t k_t$ from each sample's reward before the advantages; its
# policy gradient is then $-\beta\nabla\mathrm{KL}(\pi\,\|\,\pi_{ref})$ for $k_1$.

# %%
import torch

from brorl_lab.rl import algo

g = torch.Generator().manual_seed(0)
logits, ref_logits = torch.randn(6, generator=g, dtype=torch.float64), torch.randn(6, generator=g, dtype=torch.float64)
grads = algo.kl_loss_gradients(logits, ref_logits)
dist = lambda a, b: float((grads[a] - grads[b]).norm())   # noqa: E731
check = pd.DataFrame([{"estimator as a loss": k, "|E grad|": float(grads[k].norm()),
                       "distance to grad KL(pi||ref)": dist(k, "KL(pi||ref)"),
                       "distance to grad KL(ref||pi)": dist(k, "KL(ref||pi)")} for k in ("k1", "k2", "k3")])
assert check.loc[0, "|E grad|"] < 1e-12                       # k1: zero
assert check.loc[1, "distance to grad KL(pi||ref)"] < 1e-12  # k2: the forward KL's gradient
assert check.loc[2, "distance to grad KL(ref||pi)"] < 1e-12  # k3: the reverse KL's gradient
check.style.format(precision=3).hide(axis="index")

# %% [markdown]
# ## 2 · Reference resets (none / every K steps / on a KL threshold)
#
# A KL penalty to a *fixed* reference eventually fights the progress it should only regularise: as the policy
# improves, KL to the starting point grows, the penalty dominates the loss, and learning stalls. ProRL's answer is
# the **hard reset**: every so often set $\pi_{ref} :=$ the current policy (v1 also re-initialises the optimizer
# state, `reset_optimizer=True`; v2 keeps it). KL drops to zero at each reset (the red ×) and regularisation starts
# again from where the policy is now, so KL-regularised training can continue for thousands of steps. v1 reset when
# validation stalled; v2 every 200-500 steps or on a KL spike, the two triggers compared here.

# %%
reset_runs = [r for r in runs if RUNS[r][0] in ("baseline", "reset every K", "reset on KL")]
plots.metrics_grid_figure(df, ["kl", "entropy", "reward_mean", "eval/mean/pass@1"], runs=reset_runs, names=NAMES,
                          title="Reference resets: none, every K steps, on a KL threshold (× = reset)")

# %%
events = {r: tracking.RunDir(f"{run_dir}/{r}").read_events() for r in reset_runs}
resets = pd.DataFrame([{"run": r, "step": e["step"], "reason": e["reason"], "optimizer reset": e["optimizer_reset"]}
                       for r, evs in events.items() for e in evs if e["event"] == "reset"])
resets if len(resets) else Markdown(f"No resets in {steps} steps (reset_every={reset_every}, "
                                    f"reset_kl_threshold={reset_kl_threshold}).")

# %% [markdown]
# **A jolt after each reset, in this tiny setting.** With `reset_optimizer=True` (ProRL v1) a reset also starts a
# fresh AdamW. Its moment estimates start at zero, so its first updates move *every* parameter by about `lr`, much
# more than the damped steps of a warmed-up optimizer: the KL right after a reset (and at step 1) jumps. Here, with
# `lr=3e-3` and a reset every 4 steps (seed 0, 12 steps), the KL one step after the first reset was 3.1 with a fresh
# optimizer and 0.11 with the optimizer kept. ProRL v2 keeps it (`reset_optimizer=False`), and at ProRL's learning
# rates (1e-6 to 2e-6) the jolt is small. The k3 estimator also grows exponentially in the log-ratio, so single large
# values are expected when the policy moves far in one update.

# %% [markdown]
# ## 3 · Clip-higher (symmetric 0.2 / 0.2 against decoupled 0.2 / 0.28)
#
# PPO clips the ratio $r = \pi_\theta / \pi_{old}$ to $[1-\varepsilon_{low}, 1+\varepsilon_{high}]$. With a symmetric
# 0.2 a token sampled at probability 0.01 may only rise to 0.012 per update, while one at 0.9 can take all the room
# it likes: the clip throttles exactly the *unlikely* tokens exploration depends on, and entropy collapses. DAPO's
# clip-higher raises only the upper bound (0.28; ProRL v1 used 0.4), which ProRL credits with retaining entropy.
# `clipfrac_high` is the share of tokens that hit the upper bound: the tokens clip-higher sets free.

# %%
clip_runs = [r for r in runs if RUNS[r][0] in ("baseline", "symmetric clip")]
plots.metrics_grid_figure(df, ["entropy", "clipfrac_high", "reward_mean", "eval/mean/pass@1"], runs=clip_runs,
                          names=NAMES, title="Clip-higher: 0.2 / 0.28 (baseline) against symmetric 0.2 / 0.2")


# %% [markdown]
# ## Summary
#
# Per arm: mean entropy over the last third of training, the largest KL, the number of resets and the last held-out
# pass@1. Remember the caveat at the top: a dozen steps on one seed do not separate these arms reliably.

# %%
def arm_row(run: str, g: pd.DataFrame) -> dict:
    train = g[g["step"] > 0]
    tail = train[train["step"] > train["step"].max() * 2 / 3]
    evals = g.dropna(subset=["eval/mean/pass@1"]) if "eval/mean/pass@1" in g else g.iloc[:0]
    return {"arm": NAMES[run], "late entropy": tail["entropy"].mean() if "entropy" in tail else float("nan"),
            "max KL": train["kl"].max() if "kl" in train else float("nan"),
            "resets": int(train["reset"].fillna(False).astype(bool).sum()) if "reset" in train else 0,
            "first eval pass@1": evals["eval/mean/pass@1"].iloc[0] if len(evals) else float("nan"),
            "last eval pass@1": evals["eval/mean/pass@1"].iloc[-1] if len(evals) else float("nan")}


pd.DataFrame([arm_row(r, df[df["run"] == r]) for r in runs]).round(4)

# %% [markdown]
# ## Where to go from here
#
# * Longer runs: `steps=200` with `eval_every=20` shows the entropy of the symmetric-clip and no-KL arms falling
#   below the baseline's on most seeds, and KL to a fixed reference growing until the reset arms pull it back.
# * More seeds (`seeds=[0, 1, 2]`) and `python -m brorl_lab sweep` over this notebook; compare the arms with
#   notebook 04 (`runs_root` = this `run_dir`).
# * ProRL v2 semantics: `reset_optimizer=False`, `kl_estimator="k2"`, `kl_beta=1e-4`.
