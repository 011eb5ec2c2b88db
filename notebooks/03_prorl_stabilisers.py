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
# training becomes unstable. ProRL keeps such runs alive with three stabilisers, each a field of `brorl_lab.Config`.
# The table below is built in the first code cell: the papers' values as docs/RECIPES.md records them (v1: arXiv
# 2505.24864; v2: the ProRL v2 post and configs), beside this workbench's two recipes as the code defines them
# (`brorl_lab.study.recipe.RECIPES`; their lr and batch sizes are ours, for the tiny model).
#
# This notebook trains one small **baseline** (all three on) and one **ablation** per stabiliser, and compares their
# entropy, KL, reward and held-out pass@1. Run interactively it shows a live dashboard while training (with a
# *Stop* button); under papermill it only draws the figures at the end.
#
# **Read the numbers as a demonstration of the mechanics, not as evidence.** The defaults train the tiny shipped
# model (its parameter count is printed below) for a dozen steps on a few prompts, so the notebook finishes in about
# a minute and a half on two CPU cores, with one seed (86 s measured at these defaults on the 2-core machine, shared
# with other jobs). ProRL's effects show over hundreds to thousands of steps; at this size
# one seed's noise is as large as most differences between arms. Each section ends with what *this* run shows,
# computed from it, including where a stabiliser had no effect at all.

# %% tags=["parameters"]
# Sizes and knobs (papermill overrides this cell).
steps = 12                       # training steps per arm
N = 8                            # rollouts per prompt
prompts = 4                      # informative prompts per step (two PPO mini-batches of 2)
seeds = [0]                      # one run per arm and seed
tasks = ["gcd"]                  # the default model solves ~30% of gcd: groups are often informative
lr = 3e-4                        # large for RL on a 1.5B model (ProRL: 1e-6 to 2e-6), moves the tiny one in 12 steps
kl_beta = 1e-2                   # "small" KL coefficient of the baseline (ProRL v2: 1e-4 on a 1.5B model)
reset_every = 4                  # the "reset every K steps" arm
reset_kl_threshold = 0.0         # the "reset on KL spike" arm: reset above this KL; 0: scaled to the baseline's KL
reset_kl_scale = 2.0             # with reset_kl_threshold 0: the threshold is this times the baseline's median step KL
eval_every = 4
eval_prompts = 8
run_dir = "../runs/03_prorl_stabilisers"
torch_threads = 1
live = True                      # live dashboard while training; headless runs (papermill, tests) pass False

# %%
import threading
import time

import numpy as np
import pandas as pd
import transformers
from IPython.display import Markdown, display

from brorl_lab.core.config import Config
from brorl_lab.core.models import load_policy
from brorl_lab.lab import plots, tracking
from brorl_lab.lab.stats import format_share, wilson_interval
from brorl_lab.lab.widgets import TrainingDashboard, TrainingJob
from brorl_lab.rl.trainer import Trainer
from brorl_lab.study.recipe import RECIPES

transformers.logging.disable_progress_bar()  # no "Loading weights" bar per arm
V1, V2 = RECIPES["prorl_v1"], RECIPES["prorl_v2"]
base = Config(tasks=list(tasks), rollouts_per_prompt=N, prompts_per_step=prompts, optimizer_steps_per_step=2,
              max_new_tokens=8, temperature=1.2, lr=lr, kl_beta=kl_beta, kl_estimator="k3", eps_low=V2["eps_low"],
              eps_high=V2["eps_high"], reset_every=0, reset_on_kl=0.0, reset_optimizer=True, steps=steps,
              eval_every=eval_every, eval_prompts=eval_prompts, eval_samples=4, eval_k=[1, 4],
              checkpoint_every=0, max_resample_rounds=2, run_dir=run_dir, torch_threads=torch_threads)
start_policy, _ = load_policy(base.model)
print(f"the model: {base.model}, {sum(t.numel() for t in start_policy.parameters()):,} parameters")
display(Markdown("\n".join([
    "| stabiliser | knob | ProRL v1 (paper) | ProRL v2 (post) | workbench `prorl_v1` | workbench `prorl_v2` | for |",
    "| --- | --- | --- | --- | --- | --- | --- |",
    f"| KL penalty | `kl_beta`, `kl_estimator` | not reported (verl: 1e-3, k3) | 1e-4, k2 | {V1['kl_beta']:g}, "
    f"{V1['kl_estimator']} | {V2['kl_beta']:g}, {V2['kl_estimator']} | limits drift from the reference |",
    f"| reference reset | `reset_every`, `reset_on_kl`, `reset_optimizer` | on stalls, optimizer reset | every "
    f"200-500 steps or on KL spikes, optimizer kept | every {V1['reset_every']}, reset_optimizer="
    f"{V1['reset_optimizer']} | every {V2['reset_every']}, reset_optimizer={V2['reset_optimizer']} | lets "
    "KL-regularised training continue |",
    f"| clip-higher | `eps_low`, `eps_high` | 0.2 / 0.4 | 0.2 / 0.27-0.28 | {V1['eps_low']:g} / {V1['eps_high']:g} "
    f"| {V2['eps_low']:g} / {V2['eps_high']:g} | keeps entropy up |"])))
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
# Each arm changes one thing in the baseline. The baseline's clip is the workbench's ProRL v2 recipe
# (`eps_high` read from `RECIPES["prorl_v2"]`). The reset-on-KL arm's threshold is scaled to the KL this setting
# actually produces: a fixed number means nothing across learning rates (at `lr=3e-3` the first step alone gives a
# KL in the units, at `3e-4` a hundredth of that), so by default it is `reset_kl_scale` times the median per-step KL
# of the baseline run (same seed), which trains first.

# %%
ARMS = {
    "baseline":        {},                                     # KL beta, clip-higher, no resets
    "no KL":           {"kl_beta": 0.0},                       # beta = 0: no reference at all
    "reset every K":   {"reset_every": reset_every},
    "reset on KL":     {"reset_on_kl": reset_kl_threshold},    # 0: set from the baseline run in train_arm
    "symmetric clip":  {"eps_high": base.eps_low},             # PPO's symmetric clip, eps_high = eps_low
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
KL_THRESHOLDS = {}  # seed -> the reset-on-KL threshold used


def kl_threshold(seed: int, done: dict) -> float:
    """reset_kl_threshold, or (when 0) reset_kl_scale x the median per-step KL of this seed's baseline run."""
    if reset_kl_threshold > 0:
        return float(reset_kl_threshold)
    kl = done[f"baseline-seed{seed}"]["kl"].dropna()
    return float(f"{reset_kl_scale * kl.median():.3g}")


def train_arm(run: str, arm: str, seed: int, callbacks=(), done=None) -> pd.DataFrame:
    changes = dict(ARMS[arm])
    if arm == "reset on KL":
        changes["reset_on_kl"] = KL_THRESHOLDS[seed] = kl_threshold(seed, done or {})
    cfg = base.replace(run_name=run, seed=seed, **changes)
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
        done[run] = train_arm(run, arm, seed, callbacks, done)
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
print("reset-on-KL threshold per seed:", {s: round(t, 4) for s, t in KL_THRESHOLDS.items()})
summary

# %% [markdown]
# All runs in one table (`tracking.load_runs` reads what the Trainer wrote; `cfg.*` columns carry each run's config):

# %%
df = tracking.load_runs(run_dir)
df = df[df["run"].isin(list(results))]
runs = [r for r in RUNS if r in set(df["run"])]
print(f"{len(runs)} runs, {len(df)} rows, columns like {', '.join(c for c in df.columns[:8])} ...")

# %% [markdown]
# The sections below compare each ablation with the baseline *of the same seed*. With one seed and the same prompts,
# two arms run the very same computation until the stabiliser first acts, so their curves overlap exactly up to that
# step: `first_difference` finds it (None: the arm never differed from the baseline). An update is a step that was
# not skipped (a step is skipped when dynamic sampling finds no group with both right and wrong answers; such a step
# logs no entropy, KL or loss).

# %%
TRACKED = ["reward_mean", "loss", "entropy", "clipfrac_low", "clipfrac_high", "grad_norm"]


def rows(run: str) -> pd.DataFrame:
    return df[(df["run"] == run) & (df["step"] > 0)].set_index("step").sort_index()


def baseline_of(run: str) -> str:
    return f"baseline-seed{RUNS[run][1]}"


def first_difference(run: str):
    """The first step whose logged metrics differ from the same seed's baseline; None if identical throughout."""
    a, b = rows(run), rows(baseline_of(run))
    cols = [c for c in TRACKED if c in a and c in b]
    for step in a.index.intersection(b.index):
        if not np.array_equal(a.loc[step, cols].to_numpy(float), b.loc[step, cols].to_numpy(float), equal_nan=True):
            return int(step)
    return None


def updates(run: str) -> pd.DataFrame:
    g = rows(run)
    return g[~g["skipped"].fillna(False).astype(bool)] if "skipped" in g else g


def late_entropy(run: str) -> float:
    """Mean entropy over the updates of the last third of training (NaN: no update there)."""
    u = updates(run)
    return float(u.loc[u.index > steps * 2 / 3, "entropy"].mean())


def mean_of(run: str, col: str) -> float:
    g = rows(run)
    return float(g[col].mean()) if col in g else float("nan")

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
# **What you should see, and what this run shows** (computed): the two arms overlap until the first step where the
# penalty changed a gradient; after that, does β = 0 lower the entropy? The penalty matters only if $\beta \cdot$ KL
# is not negligible next to the policy loss, so the line compares the two.

# %%
for r in (r for r in runs if RUNS[r][0] == "no KL"):
    b = baseline_of(r)
    penalty, loss_size = kl_beta * rows(b)["kl"], rows(b)["policy_loss"].abs().mean()
    weak = penalty.mean() < 0.25 * loss_size
    print(f"{NAMES[r]}: first differs from the baseline at step {first_difference(r)}; late entropy "
          f"{late_entropy(r):.3f} (β = 0) vs {late_entropy(b):.3f} (β = {kl_beta:g}); the baseline's penalty β·KL "
          f"averaged {penalty.mean():.2g} (at most {penalty.max():.2g}) against a policy loss of mean size "
          f"{loss_size:.2g}" + ("; at this scale the penalty barely acts" if weak else ""))

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
# **What you should see:** the baseline's KL to its fixed reference creeps up over the steps; each × makes the
# current policy the reference, so the reset arm's KL starts again from near zero (never exactly zero in the log:
# a step's KL is averaged over its mini-batches, and the second one comes after an update) and grows from there.
# **A possible jolt after each reset:** with `reset_optimizer=True` (ProRL v1) a reset also starts a fresh AdamW.
# Its moment estimates start at zero, so its first updates move *every* parameter by about `lr`, more than the damped
# steps of a warmed-up optimizer, and the KL one step after a reset *can* jump above the baseline's (ProRL v2 keeps
# the optimizer, `reset_optimizer=False`); whether it does here depends on how far the baseline has drifted by then.
# The k3 estimator also grows exponentially in the log-ratio, so single large values are expected when the policy
# moves far in one update. This run (each line says which way it went):

# %%
for r in (r for r in runs if RUNS[r][0] == "baseline"):
    kl = rows(r)["kl"].dropna()                     # the baseline's KL to its fixed reference, per logged step
    half = len(kl) // 2
    if half:
        early, late = kl.iloc[:half].mean(), kl.iloc[-half:].mean()
        print(f"{NAMES[r]}: KL {early:.3g} over its first {half} logged step(s), {late:.3g} over its last {half}: "
              + ("it crept up, as described" if late > early else
                 f"this run went the other way (it fell): a step's KL is estimated on that step's own samples "
                 f"({prompts} prompts x {N}), and k3's single large values (a token one update moved far) outweigh "
                 f"a drift as short as {steps} steps"))
for r in (r for r in runs if RUNS[r][0] in ("reset every K", "reset on KL")):
    g, b = rows(r), rows(baseline_of(r))
    at = g.index[g["reset"].fillna(False).astype(bool)].tolist()
    after = [s for s in at if s + 1 in g.index]
    line = f"{NAMES[r]}: {len(at)} reset(s) at steps {at}"
    if RUNS[r][0] == "reset on KL":
        line += f" (threshold {KL_THRESHOLDS.get(RUNS[r][1], reset_kl_threshold):.3g})"
    if at:
        line += (f"; mean KL after the first reset {g.loc[g.index > at[0], 'kl'].mean():.3g} vs the baseline's "
                 f"{b.loc[b.index > at[0], 'kl'].mean():.3g} over the same steps")
    if after:
        k_r, k_b = g.loc[after[0] + 1, "kl"], b.loc[after[0] + 1, "kl"]
        line += (f"; KL one step after the first reset {k_r:.3g} vs the baseline's {k_b:.3g}: "
                 + ("higher, the fresh optimizer's jolt outweighed starting from the reference" if k_r > k_b else
                    "lower, no jolt showed here: starting again from the reference outweighed the fresh optimizer's "
                    "larger first steps (at this lr and size the baseline had drifted further than one jolt moves)"))
    skipped = len(g) - len(updates(r))
    if skipped:
        line += f"; {skipped} step(s) skipped (no informative group: no update, no entropy)"
    print(line)

# %% [markdown]
# ## 3 · Clip-higher (symmetric against decoupled)
#
# PPO clips the ratio $r = \pi_\theta / \pi_{old}$ to $[1-\varepsilon_{low}, 1+\varepsilon_{high}]$. With a symmetric
# 0.2 a token sampled at probability 0.01 may only rise to 0.012 per update, while one at 0.9 can take all the room
# it likes: the clip throttles exactly the *unlikely* tokens exploration depends on, and entropy collapses. DAPO's
# clip-higher raises only the upper bound (the table at the top gives the papers' and the recipes' values; the
# baseline here uses `prorl_v2`'s), which ProRL credits with retaining entropy.
# `clipfrac_high` is the share of tokens with a positive advantage whose ratio is still above the upper bound, so
# their gradient is cut: the tokens clip-higher did *not* set free. The symmetric arm's curve counts those above
# $1+\varepsilon_{low}$; the tokens clip-higher sets free are the ones between the two bounds, roughly the gap
# between the two curves.

# %%
clip_runs = [r for r in runs if RUNS[r][0] in ("baseline", "symmetric clip")]
plots.metrics_grid_figure(df, ["entropy", "clipfrac_high", "reward_mean", "eval/mean/pass@1"], runs=clip_runs,
                          names=NAMES, title=f"Clip-higher: {base.eps_low:g} / {base.eps_high:g} (baseline) against "
                          f"symmetric {base.eps_low:g} / {base.eps_low:g}")

# %% [markdown]
# **What you should see, and what this run shows.** The two arms can only differ once some token with a positive
# advantage reaches a ratio between $1 + \varepsilon_{low}$ and $1 + \varepsilon_{high}$: below that band neither clip
# binds, above it both do (and such a token gets no gradient in either arm). The ratio leaves 1 only in the second
# mini-batch of a step, after one update, so the band is reached only when an update moves single tokens' probabilities
# by 20-27% but not more. At a small learning rate that is rare; at a large one the ratios jump past the whole band.

# %%
for r in (r for r in runs if RUNS[r][0] == "symmetric clip"):
    b, d = baseline_of(r), first_difference(r)
    share = rows(b)["clipfrac_high"].mean()
    if d is None:
        print(f"{NAMES[r]}: identical to the baseline at every step (every logged metric equal): no token with a "
              f"positive advantage had its ratio in ({1 + base.eps_low:g}, {1 + base.eps_high:g}], so both arms "
              f"clipped the same tokens; at this scale clip-higher did nothing (baseline's clipfrac_high averaged "
              f"{share:.3f}, the tokens above {1 + base.eps_high:g})")
    else:
        e_sym, e_base = late_entropy(r), late_entropy(b)
        print(f"{NAMES[r]}: first differs from the baseline at step {d}; late entropy {e_sym:.3f} "
              f"(symmetric) vs {e_base:.3f} (clip-higher); mean clipfrac_high {mean_of(r, 'clipfrac_high'):.3f}"
              f" (tokens still clipped above {1 + base.eps_low:g}) vs {share:.3f} (above {1 + base.eps_high:g})")
        if e_sym >= e_base:
            print("  this run went the other way: the symmetric arm kept as much entropy or more. Over a dozen steps "
                  "of one seed the arms' entropies differ by noise of this size; clip-higher's effect on entropy is "
                  "a drift over hundreds of steps (ProRL), not something one short run can show")
        else:
            print("  as ProRL reports: clip-higher kept more entropy (one seed, a dozen steps: a direction, not "
                  "evidence)")


# %% [markdown]
# ## Summary
#
# Per arm, computed from the runs: the updates it made (skipped steps made none), the first step at which it differed
# from the same seed's baseline, the mean entropy over the updates of the last third of training, the largest KL, the
# resets, and held-out pass@1 before and after training with a 95% Wilson interval over the eval samples (samples of
# one prompt are not independent, so the true interval is wider). Remember the caveat at the top: a dozen steps on
# one seed do not separate these arms reliably.

# %%
EVAL_SAMPLES = base.eval_prompts * base.eval_samples * len(base.tasks)   # pass@1 = correct eval samples / this


def pass_at_1(value: float) -> str:
    return format_share(wilson_interval(int(round(value * EVAL_SAMPLES)), EVAL_SAMPLES))


def arm_row(run: str) -> dict:
    g = df[df["run"] == run]
    evals = g.dropna(subset=["eval/mean/pass@1"]).sort_values("step")
    ent = late_entropy(run)
    return {"arm": NAMES[run], "updates": len(updates(run)), "skipped steps": len(rows(run)) - len(updates(run)),
            "first step differing from baseline": "-" if RUNS[run][0] == "baseline" else first_difference(run),
            "late entropy": "no update" if np.isnan(ent) else round(ent, 4),
            "max KL": round(float(rows(run)["kl"].max()), 4) if rows(run)["kl"].notna().any() else "not computed",
            "resets": int(rows(run)["reset"].fillna(False).astype(bool).sum()),
            "held-out pass@1 first": pass_at_1(evals["eval/mean/pass@1"].iloc[0]) if len(evals) else "-",
            "held-out pass@1 last": pass_at_1(evals["eval/mean/pass@1"].iloc[-1]) if len(evals) else "-"}


table = pd.DataFrame([arm_row(r) for r in runs])
table

# %% [markdown]
# **Why held-out pass@1 tends to move the same way in every arm.** The reset arms run exactly the baseline's steps
# until their first reset, and the others differ from it only slightly at first (the table's "first step differing"
# column), so a fall that happens early is largely one event, seen once per arm; the last line below says whether
# this run's arms did move together. What the policies learned shows in their answers: below, each arm's final policy (and the starting model) answers
# fresh prompts of the same families at the eval temperature; a policy that has collapsed onto a few frequent answers
# (for `gcd`, small numbers such as 1 and 2 are right on many training prompts) gains training reward while it loses
# the prompts whose answer is anything else.

# %%
from brorl_lab.rl import steps as S  # noqa: E402
from brorl_lab.rl.spec import resolve  # noqa: E402
from brorl_lab.rollout.engines import RolloutSampling, make_engine  # noqa: E402

probe = S.sample_prompts(list(tasks), eval_prompts, seed=10_000)
probe_sampling = RolloutSampling(temperature=base.eval_temperature, top_p=base.eval_top_p,
                                 max_new_tokens=base.max_new_tokens, seed=0)


def answer_profile(label: str, policy_dir) -> dict:
    policy, tok = load_policy(policy_dir)
    template = resolve(base, tokenizer=tok).template
    with make_engine("torch", policy, tok) as engine:
        batch = S.score(S.rollout(engine, probe, n=8, sampling=probe_sampling, template=template), template=template)
    answers = batch.to_pandas()["response"].str.strip()
    top = answers.value_counts()
    return {"policy": label, "correct": round(float(batch.correct.float().mean()), 3),
            "distinct answers": int(top.size), "two most common": ", ".join(repr(a) for a in top.index[:2]),
            "their share": round(float(top.iloc[:2].sum() / len(answers)), 3),
            "empty answers": round(float((answers == "").mean()), 3)}


profiles = pd.DataFrame([answer_profile("start", base.model)]
                        + [answer_profile(NAMES[r], f"{run_dir}/{r}/policy") for r in runs])
profiles

# %%
start = profiles.iloc[0]
for _, row in profiles.iloc[1:].iterrows():
    print(f"{row['policy']}: {row['their share']:.0%} of answers are {row['two most common']} (start: "
          f"{start['their share']:.0%}), {row['distinct answers']} distinct answers (start: {start['distinct answers']})"
          f", {row['empty answers']:.0%} empty, {row['correct']:.0%} correct (start: {start['correct']:.0%})")
moved = {}  # arm -> held-out pass@1, last eval minus first
for r in runs:
    evals = df[df["run"] == r].dropna(subset=["eval/mean/pass@1"]).sort_values("step")["eval/mean/pass@1"]
    if len(evals) > 1:
        moved[NAMES[r]] = float(evals.iloc[-1] - evals.iloc[0])
ways = {int(np.sign(round(v, 9))) for v in moved.values()}
print("held-out pass@1, last eval minus first: " + ", ".join(f"{a} {v:+.3f}" for a, v in moved.items()) + ": "
      + ("every arm moved the same way" if len(ways) == 1 else
         "this run's arms went different ways: from the first step where an arm differs (the table's column) its "
         "own updates and resets act on it alone" + (" (each reset also starts a fresh AdamW)" if base.reset_optimizer
                                                     else "")
         + f", and with one seed and {EVAL_SAMPLES} eval samples a change of a few answers is within the noise"))

# %% [markdown]
# ## Where to go from here
#
# * Longer runs: `steps=200` with `eval_every=20` is where ProRL's effects (entropy kept up by clip-higher and the
#   KL anchor; KL pulled back by the resets) have room to show; this notebook has not run them, so read the curves.
# * More seeds (`seeds=[0, 1, 2]`) and `python -m brorl_lab sweep` over this notebook; compare the arms with
#   notebook 04 (`runs_root` = this `run_dir`).
# * A larger `lr` (e.g. `3e-3`) moves the tiny model so far per step that the ratios jump past the whole clip band
#   and a fresh optimizer after a reset can knock the policy into answers that are never right, after which every
#   step is skipped (no informative group): try it and read the summary's "updates" column.
# * ProRL v2 semantics: `reset_optimizer=False`, `kl_estimator="k2"`, `kl_beta=1e-4`.
