"""The rollout frontier (issue 43): which N wins as the budget grows, under the paper's protocol. Declared here as
data, before any full-size run, with every reading as a function on per-seed tables::

    FRONTIER                                   # the study as data (arms, branch points, marks, protocol, lr rule)
    FRONTIER.to_declaration()                  # the dict study.results.write_declaration commits before the run
    frontier_arm_configs(base, FRONTIER.arms)  # {arm: Config}: each arm's N, prompts per step, lr, budget, marks
    best_n(points, mark)                       # the best N at one budget mark, paired intervals against each other N
    frontier_table(points)                     # best_n at every mark, on one axis
    pick_lr(pilot)                             # the lr rule fixed now: best pass@1 among settings within the KL bound
    takeoff_race(df, a, b)                     # study.paid.time_to_level + race, per pair of arms
    seeds_for_gap(per_seed_gaps)               # seeds for a 0.5-point gap at 80% power (lab.stats.seeds_for_power)
    refill_pilot(...) / cap_binding(steps)     # the refill protocol measured: how often a round cap binds

Units. A *generated sample* is one response (prompt x rollout), every dynamic-sampling round counted (BroRL's unit,
``cum_samples``); a *trained sample* one that survived the filter (``cum_trained_samples``); an *optimizer update*
one AdamW step (``cum_updates``: ``optimizer_steps_per_step`` = 2 per RL step); wall time is training time with
evaluation excluded (``cum_wall_s``). Arms are named ``n<N>x<P>``: N rollouts per prompt, P prompts per step.

The arms (4:1 design, the paper's: ProRL 16 x 512 -> BroRL 512 x 128, N x 32 with prompts / 4, so samples per step
x 8; ours from :data:`brorl_lab.study.paid.ARM_SHAPES`: 16 x 64 -> 512 x 16). Between and beside them the prompts
follow the same power law, P(N) = 64 (N / 16)^(-log 4 / log 32) = 64 (N / 16)^(-0.4), rounded to the nearest power
of two: 4 x 128 (111 -> 128), 64 x 32 (36.8 -> 32, the paid study's middle arm), 128 x 32 (27.9 -> 32). The
fixed-batch design (IsoCompute's) holds samples per step at 8,192 and the updates per step at 2 in every arm and
moves only the split: 16 x 512, 64 x 128, 512 x 16.

The protocol. Primary: dynamic sampling refilled until the batch is full, with a round cap (``max_resample_rounds``)
set high enough that it binds on under 5% of steps (every binding logged by the trainer: ``ds_cap_hit`` and a
``refill`` event). The capped protocol (``max_resample_rounds = 4``, the recipe's) stays as an ablation.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Optional

import numpy as np
import pandas as pd

from brorl_lab.core.config import Config
from brorl_lab.core.validation import check_int, is_number

# ---- the arms --------------------------------------------------------------------------------------------------------
#: The 4:1 design: {N: prompts per step}. 16, 64 and 512 are the frontier's; 4 and 128 are optional (module docstring).
RATIO_ARMS = {16: 64, 64: 32, 512: 16}
OPTIONAL_RATIO_ARMS = {4: 128, 128: 32}
#: The fixed-batch design: {N: prompts per step} at 8,192 samples per step in every arm.
FIXED_BATCH_ARMS = {16: 512, 64: 128, 512: 16}
FIXED_BATCH_SAMPLES = 8192
#: The paper's exponent: prompts fall 4x while N grows 32x.
PROMPT_EXPONENT = math.log(4) / math.log(32)


def arm_name(n: int, prompts: int) -> str:
    """``n<N>x<P>``: the arm of N rollouts per prompt and P prompts per step."""
    return f"n{n}x{prompts}"


def ratio_prompts(n: int, *, n_ref: int = 16, prompts_ref: int = 64) -> int:
    """Prompts per step of the 4:1 design at N = ``n``: prompts_ref (n / n_ref)^(-0.4), rounded to the nearest power
    of two (in log2: the power-law's own scale)."""
    check_int("n", n, 1)
    exact = prompts_ref * (n / n_ref) ** (-PROMPT_EXPONENT)
    return 2 ** round(math.log2(exact))


# ---- the refill protocol measured (the pilot that sizes the budget) ------------------------------------------------
#: The branch points: {name: (model alias, families, lr)}; the lr is each checkpoint's own (the paid study's).
BRANCH_POINTS = {"takeoff": ("takeoff", ["spell_backward"], 3e-4),
                 "learned": ("learned", ["spell_backward", "gcd"], 3e-4)}
#: Round caps (``max_resample_rounds``: refills after round 0) whose binding the pilot reads.
PILOT_CAPS = (4, 8, 16, 32)
#: The pilot's own cap: high enough that no step of the pilot should reach it (a step that does is counted as
#: binding at every cap of :data:`PILOT_CAPS`).
PILOT_ROUND_CAP = 63


def pilot_config(branch: str, n: int, prompts: int, *, steps: int, seed: int = 0, root: str | Path,
                 max_resample_rounds: int = PILOT_ROUND_CAP, lr: Optional[float] = None, threads: int = 1) -> Config:
    """One pilot run from ``branch`` (:data:`BRANCH_POINTS`): the flagship recipe at N = ``n`` x ``prompts`` per
    step, refilled up to ``max_resample_rounds`` rounds, no evaluation, no reset (the paid study's arms)."""
    from brorl_lab.study.recipe import recipe_config

    if branch not in BRANCH_POINTS:
        raise ValueError(f"branch: got {branch!r}; allowed: {', '.join(BRANCH_POINTS)}")
    model, families, lr0 = BRANCH_POINTS[branch]
    return recipe_config(model=model, tasks=families, lr=lr0 if lr is None else lr, rollouts_per_prompt=n,
                         prompts_per_step=prompts, max_resample_rounds=max_resample_rounds, steps=steps,
                         eval_every=0, reset_every=0, reset_every_samples=0, torch_threads=threads, seed=seed,
                         run_dir=str(root), run_name=f"{branch}_{arm_name(n, prompts)}_s{seed}",
                         checkpoint_every=steps)


def refill_pilot(branches: Sequence[str], arms: Mapping[int, int], *, steps: int, root: str | Path, seed: int = 0,
                 threads: int = 1) -> pd.DataFrame:
    """Run :func:`pilot_config` for every branch point and arm ({N: prompts per step}), one after another, and
    return one row per training step: branch, arm, N, prompts_per_step, step, refill_rounds, ds_cap_hit, samples
    (generated), kept_groups, ds_generated_groups, updates, kl, step_wall_s (the trainer's metrics)."""
    from brorl_lab.rl.trainer import Trainer

    check_int("steps", steps, 1)
    keep = ("step", "refill_rounds", "rollout_rounds", "ds_cap_hit", "samples", "kept_groups", "ds_generated_groups",
            "ds_pass_rate", "trained_samples", "updates", "kl", "step_wall_s")
    rows = []
    for branch in branches:
        for n, prompts in arms.items():
            cfg = pilot_config(branch, n, prompts, steps=steps, seed=seed, root=root, threads=threads)
            with Trainer(cfg, progress=False, overwrite=True) as trainer:
                df = trainer.run()
            df = df[df["step"] > 0][[k for k in keep if k in df.columns]]
            rows.append(df.assign(branch=branch, arm=arm_name(n, prompts), N=n, prompts_per_step=prompts,
                                  round_cap=cfg.max_resample_rounds))
    return pd.concat(rows, ignore_index=True)


def cap_binding(steps: pd.DataFrame, caps: Sequence[int] = PILOT_CAPS) -> pd.DataFrame:
    """How often a round cap would have bound, per branch point, arm and cap, read from a pilot refilled up to its
    own high cap (:func:`refill_pilot`'s rows): a step binds at cap c (``max_resample_rounds`` = c refills) when it
    needed more than c refills, or hit the pilot's own cap. Columns branch, arm, N, prompts_per_step, cap, steps,
    bound, share, lo, hi (Wilson 95%: the steps of one run are treated as independent draws, which they are only
    approximately), and the fill-to-full sizing: generated samples per step and per optimizer update, the mean
    informative-group rate q (kept / generated groups: a step of P prompts needs about P / (q P) = 1 / q rounds)."""
    from brorl_lab.lab.stats import wilson_interval

    out = []
    for (branch, arm), g in steps.groupby(["branch", "arm"], sort=False):
        needed = g["refill_rounds"].to_numpy()
        hit = g["ds_cap_hit"].astype(bool).to_numpy()
        gen = float(g["ds_generated_groups"].sum())
        sizing = {"samples_per_step": float(g["samples"].mean()),
                  "samples_per_update": float(g["samples"].sum() / max(g["updates"].sum(), 1)),
                  "q": float(g["kept_groups"].sum() / gen) if gen else np.nan,
                  "refills_mean": float(needed.mean()), "refills_max": int(needed.max()),
                  "pilot_cap_hit": int(hit.sum()), "step_wall_s": float(g["step_wall_s"].mean())}
        for c in caps:
            bound = int(((needed > c) | hit).sum())
            w = wilson_interval(bound, len(g))
            out.append({"branch": branch, "arm": arm, "N": int(g["N"].iloc[0]),
                        "prompts_per_step": int(g["prompts_per_step"].iloc[0]), "cap": int(c), "steps": len(g),
                        "bound": bound, "share": w["share"], "lo": w["lo"], "hi": w["hi"], **sizing})
    return pd.DataFrame(out)


def fill_samples_per_step(n: int, prompts: int, q: float) -> float:
    """Expected generated samples of a fill-to-full step: rounds of ``prompts`` x ``n`` until ``prompts`` groups are
    kept, each group kept with probability ``q`` (the measured informative-group rate at this N): about
    n * prompts / q (the round count's mean, 1 / q, ignoring the last round's surplus)."""
    if not (is_number(q) and 0 < q <= 1):
        raise ValueError(f"q: got {q!r}; allowed: a rate in (0, 1]")
    return n * prompts / q


# ---- the critical batch size at each branch point (rl.noise_scale) ----------------------------------------------------
#: The noise-scale measurement's design: two batch sizes in informative groups, repeats per (branch, N), and the
#: prompts drawn per collection round at each N (the 4:1 arms' own).
NOISE_DESIGN = dict(b_small=1, b_big=32, repeats=10, prompts={16: 64, 512: 16})


def noise_table(branches: Sequence[str], ns: Sequence[int], *, b_small: int = NOISE_DESIGN["b_small"],
                b_big: int = NOISE_DESIGN["b_big"], repeats: int = NOISE_DESIGN["repeats"], seed: int = 0,
                prompts: Optional[Mapping[int, int]] = None, draws: int = 2000) -> tuple[pd.DataFrame, pd.DataFrame]:
    """B_simple (:mod:`brorl_lab.rl.noise_scale`) at each branch point (:data:`BRANCH_POINTS`: its families, the
    flagship recipe's loss) and N. Returns (per-repeat rows, summary): the summary has one row per (branch, N): the
    estimate in groups with its bootstrap interval, |G|^2 and tr(Sigma) with theirs, the share of bootstrap draws
    with |G|^2 <= 0, the informative-group rate q over every collection round, and B in rollouts (x N) and in
    generated samples (x N / q)."""
    from brorl_lab.core.models import load_policy
    from brorl_lab.rl.noise_scale import measure_noise_scale, noise_scale_interval, noise_scale_units
    from brorl_lab.study.recipe import recipe_config

    prompts = {**NOISE_DESIGN["prompts"], **(prompts or {})}
    reps, summary = [], []
    for branch in branches:
        model, families, lr = BRANCH_POINTS[branch]
        for n in ns:
            cfg = recipe_config(model=model, tasks=families, lr=lr, rollouts_per_prompt=n,
                                prompts_per_step=prompts.get(n, ratio_prompts(n)))
            policy, tok = load_policy(cfg.model, device=cfg.device)
            df = measure_noise_scale(cfg, b_small=b_small, b_big=b_big, repeats=repeats, seed=seed, policy=policy,
                                     tokenizer=tok).assign(branch=branch)
            reps.append(df)
            r = noise_scale_interval(df["sq_small"], df["sq_big"], b_small, b_big, draws=draws, seed=seed)
            q = float(df["kept_groups"].sum() / df["generated_groups"].sum())
            summary.append({"branch": branch, "N": n, "q": q, **{k: r[k] for k in (
                "b_simple", "lo", "hi", "g2", "g2_lo", "g2_hi", "trace", "trace_lo", "trace_hi", "nonpositive_g2",
                "repeats", "b_small", "b_big", "method")}, **noise_scale_units(r, n, q)})
    return pd.concat(reps, ignore_index=True), pd.DataFrame(summary)


# ---- the command: python -m brorl_lab.study.frontier pilot ... -------------------------------------------------------
def main(argv: Optional[Sequence[str]] = None) -> int:
    """Two exploratory measurements (1 torch thread; neither pre-registered, each record says so):

    ``python -m brorl_lab.study.frontier pilot --steps 5 --out runs/frontier_pilot [--figures notebooks/figures]``:
    the refill pilot (:func:`refill_pilot` on both branch points, arms 16x64, 64x32, 128x32, 512x16, 1 seed) ->
    ``frontier_pilot_refill_steps.csv`` (per step) and ``frontier_pilot_refill.csv`` (:func:`cap_binding`).

    ``python -m brorl_lab.study.frontier noise --out runs/frontier_noise [--figures notebooks/figures]``: the noise
    scale (:func:`noise_table`, both branch points, N = 16 and 512) -> ``noise_scale_repeats.csv`` and
    ``noise_scale.csv``.

    Each table goes to ``--out`` and, with ``--figures``, there too, each with its provenance record."""
    import argparse
    import shlex
    import sys

    import torch

    from brorl_lab.study.recipe import resolve_experiment_model
    from brorl_lab.study.results import git_commit, provenance, write_provenance

    ap = argparse.ArgumentParser(prog="python -m brorl_lab.study.frontier")
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("pilot", help="the refill pilot: how often a round cap binds, samples per update at fill-to-full")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--arms", nargs="+", default=["16x64", "64x32", "128x32", "512x16"], help="NxP")
    p.add_argument("--out", default="runs/frontier_pilot")
    q = sub.add_parser("noise", help="the gradient noise scale at each branch point and N")
    q.add_argument("--ns", type=int, nargs="+", default=[16, 512])
    q.add_argument("--b-small", type=int, default=NOISE_DESIGN["b_small"])
    q.add_argument("--b-big", type=int, default=NOISE_DESIGN["b_big"])
    q.add_argument("--repeats", type=int, default=NOISE_DESIGN["repeats"])
    q.add_argument("--out", default="runs/frontier_noise")
    for x in (p, q):
        x.add_argument("--seed", type=int, default=0)
        x.add_argument("--branches", nargs="+", default=list(BRANCH_POINTS))
        x.add_argument("--figures", default=None, help="also write the tables here with provenance")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    commit, t0 = git_commit(), time.perf_counter()
    if args.cmd == "pilot":
        arms = {int(a.split("x")[0]): int(a.split("x")[1]) for a in args.arms}
        steps = refill_pilot(args.branches, arms, steps=args.steps, root=out / "runs", seed=args.seed)
        written = {"frontier_pilot_refill_steps.csv": steps, "frontier_pilot_refill.csv": cap_binding(steps)}
        note = "exploratory pilot, not pre-registered: sizes the frontier's budget and round cap (issue 43)"
    else:
        reps, summary = noise_table(args.branches, args.ns, b_small=args.b_small, b_big=args.b_big,
                                    repeats=args.repeats, seed=args.seed)
        written = {"noise_scale_repeats.csv": reps, "noise_scale.csv": summary}
        note = "exploratory, not pre-registered: the simple noise scale at each branch point (issue 43, item 6)"
    wall = time.perf_counter() - t0
    command = "python -m brorl_lab.study.frontier " + shlex.join(sys.argv[1:] if argv is None else list(argv))
    cks = {b: resolve_experiment_model(BRANCH_POINTS[b][0]) for b in args.branches}
    for d in [out] + ([Path(args.figures)] if args.figures else []):
        for name, t in written.items():
            t.to_csv(d / name, index=False)
            write_provenance(d / name, provenance(command, cks, wall, commit=commit, status="exploratory", note=note))
    print(list(written.values())[-1].to_string(index=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
