"""BroRL's mechanism made visible: which training prompts carry a learning signal at N = 16 and at N = 512.

Dynamic sampling keeps a prompt's group of N samples only when it is *informative*: some samples right and some
wrong (0 < K < N correct). For a prompt the policy solves with probability p, a group of N is informative with
probability

    s_N(p) = 1 - p^N - (1 - p)^N,

so the expected dynamic-sampling pass rate at N is the mean of s_N(p) over the training distribution (BroRL Table 2:
41% at N = 16, 62% at N = 512; s_N and *rare success* are defined once, in :mod:`brorl_lab.study.rare`). This
module measures it per prompt instead of assuming p: it draws :data:`~brorl_lab.study.rare.DRAWS` (the BroRL arm's N,
512) samples of each prompt once, counts the correct ones (K of 512), and reads both sizes off the same draws:

    signal at N = 512   = 1[0 < K < 512]                               (the one group of 512)
    signal at N = 16    = share of the 32 disjoint groups of 16 with 0 < k < 16
    reach               = "both" if signal16 >= 1/2, "only N=512" if signal16 < 1/2 and signal512,
                          "neither" otherwise (all 512 right, or all wrong)

"Only N=512" prompts are the ones a typical N = 16 group throws away but an N = 512 group keeps: the prompts
broadening exploration adds to the update. :func:`reach_change` then asks whether *those* prompts are the ones whose
pass rate rises in the BroRL arm (pass rates of the same prompts before and after each arm's training).

    rates  = prompt_pass_rates(policy, tok, items, cfg)            # one row per prompt: K, p, signal16, ...
    reach_summary(rates)                                           # share of prompts in each reach class
    after  = {arm: prompt_pass_rates(*load_policy(run_dir), ...) for arm, run_dir in runs.items()}
    reach_change(rates, after)                                     # mean change of p per reach class and arm
    reach_figure(rates, reach_change(rates, after))                # both, as one figure
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Optional

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from brorl_lab.core.config import Config
from brorl_lab.core.validation import check_int
from brorl_lab.lab.plots import PALETTE, empty_figure
from brorl_lab.rl import steps as S
from brorl_lab.rl.spec import resolve
from brorl_lab.rollout.engines import RolloutSampling, make_engine
from brorl_lab.rollout.tasks import TaskItem
from brorl_lab.study.compare import ARM_COLORS
from brorl_lab.study.rare import DRAWS, ONLY_LARGE, RARE_SUCCESS_MAX_P, rare_failure, rare_success, s_n
from brorl_lab.study.recipe import ARM_TABLE

SMALL_N = ARM_TABLE["prorl"]["rollouts_per_prompt"]  # the ProRL arm's N: the groups the draws are cut into
REACH = ("both", ONLY_LARGE, "neither")  # display order of the reach classes
#: Old keyword names of prompt_pass_rates (study.paid, study.runner still pass them) -> the names it takes.
LEGACY_NAMES = {"n_draws": "draws", "n_small": "rollouts_per_prompt"}


def prompt_pass_rates(policy: torch.nn.Module, tokenizer, items: Sequence[TaskItem], cfg: Config, *,
                      draws: int = DRAWS, rollouts_per_prompt: int = SMALL_N, seed: int = 0, chunk_prompts: int = 8,
                      **legacy) -> pd.DataFrame:
    """Draw ``draws`` samples of each item with the training sampler (``cfg.temperature``, ``top_p``,
    ``max_new_tokens``; ``template`` and the user-named tasks' configs through :func:`brorl_lab.rl.spec.resolve`,
    so ``template='auto'`` means the tokenizer's) and return one row per item: family, uid, correct (K),
    p = K / draws, ``signal_small`` (share of the draws / rollouts_per_prompt disjoint groups of
    ``rollouts_per_prompt``, the ProRL arm's N, that are informative), ``signal_large`` (whether the whole draw, one
    group of ``draws``, is informative) and ``reach`` (module docstring). :data:`LEGACY_NAMES` are read as theirs."""
    bad = sorted(set(legacy) - set(LEGACY_NAMES))
    if bad:
        raise TypeError(f"prompt_pass_rates() got an unexpected keyword argument {bad[0]!r}")
    named = {LEGACY_NAMES[k]: v for k, v in legacy.items()}
    draws, rollouts_per_prompt = named.get("draws", draws), named.get("rollouts_per_prompt", rollouts_per_prompt)
    check_int("draws", draws, 2)
    check_int("rollouts_per_prompt", rollouts_per_prompt, 1)
    if draws % rollouts_per_prompt:
        raise ValueError(f"rollouts_per_prompt: got {rollouts_per_prompt} for draws={draws}; allowed: a divisor of "
                         "draws")
    if not items:
        raise ValueError("items: got no items; allowed: a non-empty list of TaskItem (steps.sample_prompts)")
    spec = resolve(cfg, tokenizer=tokenizer)
    engine = make_engine("torch", policy, tokenizer)
    rows = []
    try:
        for start in range(0, len(items), chunk_prompts):
            chunk = list(items[start:start + chunk_prompts])
            sampling = RolloutSampling(temperature=cfg.temperature, top_p=cfg.top_p, max_new_tokens=cfg.max_new_tokens,
                                      seed=seed + start)
            batch = S.score(S.rollout(engine, chunk, draws, sampling, template=spec.template, tokenizer=tokenizer,
                                      task_families=spec.families), template=spec.template, task_families=spec.families)
            correct = batch.grouped(batch.correct).to(torch.int64)  # [P, draws]
            k_small = correct.view(len(chunk), -1, rollouts_per_prompt).sum(-1)  # [P, draws / N] correct per group
            informative_small = ((k_small > 0) & (k_small < rollouts_per_prompt)).double().mean(1)  # [P]
            k = correct.sum(1)  # [P]
            for item, kk, sig in zip(chunk, k.tolist(), informative_small.tolist()):
                rows.append({"family": item.family, "uid": item.uid, "correct": kk, "p": kk / draws,
                             "signal_small": sig, "signal_large": 0 < kk < draws})
    finally:
        engine.close()
    df = pd.DataFrame(rows)
    df["reach"] = [reach_class(s, big) for s, big in zip(df["signal_small"], df["signal_large"])]
    return df


def reach_class(signal_small: float, signal_large: bool) -> str:
    """The reach class of one prompt (module docstring): 'both', :data:`ONLY_LARGE` or 'neither'."""
    if signal_small >= 0.5:
        return "both"
    return ONLY_LARGE if signal_large else "neither"


def reach_summary(rates: pd.DataFrame) -> pd.DataFrame:
    """Per family and over all prompts: number of prompts, the expected dynamic-sampling pass rate at the small N
    (mean ``signal_small``) and at the large N (share with ``signal_large``), the share in each reach class, and
    where the signal sits: the share of prompts with *rare successes* (:func:`brorl_lab.study.rare.rare_success`,
    0 < p <= 1/16: the theory's case, correct tokens a small N rarely draws) and with *rare failures*
    (:func:`brorl_lab.study.rare.rare_failure`, 15/16 <= p < 1: near-solved prompts)."""
    _check_rates(rates, "rates")
    out = []
    for fam, g in [*rates.groupby("family", sort=True), ("all", rates)]:
        row = {"family": fam, "prompts": len(g), "pass_rate_small": g["signal_small"].mean(),
               "pass_rate_large": g["signal_large"].mean(), "mean_p": g["p"].mean()}
        row.update({f"share {r}": (g["reach"] == r).mean() for r in REACH})
        row.update({"share rare successes": rare_success(g["p"]).mean(),
                    "share rare failures": rare_failure(g["p"]).mean()})
        out.append(row)
    return pd.DataFrame(out)


# Edges of the per-prompt pass-rate histogram at a branch point: p = 0 and p = 1 are bins of their own (no signal at
# any N), (0, 1/16] is the reach gate's rare-success band (an N=16 group is all-wrong with probability >= 0.36).
P_EDGES = (0.0, 1 / 64, RARE_SUCCESS_MAX_P, 1 / 4, 1 / 2, 3 / 4, 1.0)


def p_histogram(rates: pd.DataFrame, edges: Sequence[float] = P_EDGES) -> pd.DataFrame:
    """Per family and over all prompts: how many prompts of a :func:`prompt_pass_rates` table sit at p = 0, in each
    half-open bin (lo, hi] of ``edges`` (the last one (lo, 1) open at 1) and at p = 1. Columns family, bin, lo, hi,
    prompts, share (of the family's prompts); one row per bin, so the table is the histogram a reader re-plots."""
    _check_rates(rates, "rates")
    edges = [float(e) for e in edges]
    if edges[0] != 0 or edges[-1] != 1 or any(b <= a for a, b in zip(edges, edges[1:])):
        raise ValueError(f"edges: got {edges}; allowed: increasing floats from 0 to 1")
    out = []
    for fam, g in [*rates.groupby("family", sort=True), ("all", rates)]:
        p = g["p"].to_numpy()
        bins = [("p=0", 0.0, 0.0, p == 0)]
        bins += [(f"({lo:.4g},{hi:.4g}" + (")" if hi == 1 else "]"), lo, hi,
                  (p > lo) & ((p < hi) if hi == 1 else (p <= hi))) for lo, hi in zip(edges, edges[1:])]
        bins.append(("p=1", 1.0, 1.0, p == 1))
        out += [{"family": fam, "bin": name, "lo": lo, "hi": hi, "prompts": int(m.sum()), "share": float(m.mean())}
                for name, lo, hi, m in bins]
    return pd.DataFrame(out)


def reach_change(before: pd.DataFrame, after: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
    """Mean change of each prompt's pass rate p from ``before`` (the branch point) to ``after[arm]`` (the same
    prompts under each arm's final policy), per reach class of the *branch point*, with the prompt count. A
    mechanism that works as BroRL says shows the BroRL arm gaining most on the :data:`ONLY_LARGE` class."""
    _check_rates(before, "before")
    if not isinstance(after, Mapping) or not after:
        raise ValueError("after: got nothing; allowed: a mapping arm -> prompt_pass_rates of the same items")
    rows = []
    for arm, a in after.items():
        _check_rates(a, f"after[{arm!r}]")
        merged = before.merge(a[["uid", "p"]], on="uid", suffixes=("", "_after"), validate="one_to_one")
        if len(merged) != len(before):
            raise ValueError(f"after[{arm!r}]: covers {len(merged)} of {len(before)} prompts; allowed: the same items")
        merged["dp"] = merged["p_after"] - merged["p"]
        for r in REACH:
            g = merged[merged["reach"] == r]
            rows.append({"arm": arm, "reach": r, "prompts": len(g), "p_before": g["p"].mean(),
                         "p_after": g["p_after"].mean(), "change": g["dp"].mean()})
    return pd.DataFrame(rows)


def _check_rates(df, name: str) -> None:
    need = {"family", "uid", "p", "signal_small", "signal_large", "reach"}
    if not isinstance(df, pd.DataFrame) or not need <= set(df.columns):
        raise ValueError(f"{name}: allowed: the DataFrame prompt_pass_rates returns (columns {sorted(need)})")


def reach_figure(rates: pd.DataFrame, change: Optional[pd.DataFrame] = None, *, arm_table: Mapping = ARM_TABLE,
                 title: str = "Which training prompts carry a signal at each N") -> go.Figure:
    """Left: per-prompt pass rate p at the branch point (:func:`prompt_pass_rates`) as a
    histogram coloured by reach class, with the curves s_N(p) = 1 - p^N - (1-p)^N at the ProRL and the BroRL arm's
    N (``arm_table``'s ``rollouts_per_prompt``) on a second axis.
    Right (with ``change`` from :func:`reach_change`): each arm's mean change of p per
    reach class."""
    if rates.empty:
        return empty_figure("no prompts measured", title=title)
    cols = 2 if change is not None and not change.empty else 1
    fig = make_subplots(rows=1, cols=cols, specs=[[{"secondary_y": True}] + [{}] * (cols - 1)],
                        subplot_titles=("per-prompt pass rate p at the branch point",
                                        "change of p by each arm's end, per reach class")[:cols])
    for i, r in enumerate(REACH):
        fig.add_trace(go.Histogram(name=f"{r} ({(rates['reach'] == r).sum()} prompts)",
                                   x=rates.loc[rates["reach"] == r, "p"], xbins=dict(start=0, end=1.0001, size=0.05),
                                   marker_color=PALETTE[i % len(PALETTE)], opacity=0.8), row=1, col=1)
    p = np.linspace(0, 1, 201)
    for n, dash in ((arm_table["prorl"]["rollouts_per_prompt"], "dash"), (arm_table["brorl"]["rollouts_per_prompt"],
                                                                          "dot")):
        fig.add_trace(go.Scatter(name=f"P(group of N={n} informative)", x=p, y=s_n(p, n),
                                 mode="lines", line=dict(color="black", dash=dash)), row=1, col=1, secondary_y=True)
    fig.update_layout(barmode="group")  # histograms side by side per bin; the arms' bars side by side per class
    fig.update_xaxes(title_text=f"p (share of {DRAWS} draws correct)", row=1, col=1)
    fig.update_yaxes(title_text="prompts", row=1, col=1)
    fig.update_yaxes(title_text="informative probability", range=[0, 1.05], row=1, col=1, secondary_y=True)
    if cols == 2:
        for j, (arm, g) in enumerate(change.groupby("arm", sort=False)):
            fig.add_trace(go.Bar(name=f"{arm}: change of p", x=list(g["reach"]), y=g["change"],
                                 marker_color=ARM_COLORS.get(arm, PALETTE[(j + 3) % len(PALETTE)])), row=1, col=2)
        fig.update_yaxes(title_text="mean change of p", row=1, col=2)
    fig.update_layout(title_text=title, height=420, legend=dict(orientation="h", y=-0.3),
                      margin=dict(t=80, b=40, l=60, r=60))
    return fig
