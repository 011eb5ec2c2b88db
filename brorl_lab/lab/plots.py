"""Plotly figure builders: pure functions of DataFrames / arrays -> ``go.Figure``.

Used alike by the widgets (which wrap them in ``go.FigureWidget`` and update traces in place), the notebooks and
reports. Each builder names its traces so a caller can find and update one (``fig.select_traces(selector=name)``).

Theory figures (the mass balance of :mod:`brorl_lab.theory`):
    terms_bar_figure      the three Theorem 1 terms and their total at one N, as bars (normalised N dQ / lr)
    n_sweep_figure        expected terms and P(dQ_pos < 0) across N, the current N marked
    dq_histogram_figure   Monte-Carlo histogram of dQ_pos at one N
    first_order_figure    Theorem 1 (first order) against the exact softmax change, draw by draw
    lemma2_figure         the unsampled second moment sum p^2 (1-p)^N across N
    paper_simulation_figure  Fig. 3 of the paper: Q_pos, share of correct tokens improved, worst drop, per N
    budget_figure         final Q_pos against N at a fixed budget of draws

Dashboard figures (section "# ---- dashboard": training runs, the live dashboard, the run browser, notebooks 03/04):
    metric_figure, run_curves_figure, metrics_grid_figure, arm_band_figure, pass_at_k_figure, empty_figure

Figures that survive an HTML export (section "# ---- exportable figures"): importing this module in a Jupyter kernel
calls :func:`exportable_figures`, so every notebook that imports it (all of notebooks/) shows its figures
interactively in JupyterLab *and* in the HTML nbconvert writes (``make demo``, sweeps), offline.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Optional

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import plotly.io as pio
from plotly.io.base_renderers import NotebookRenderer
from plotly.subplots import make_subplots

from brorl_lab.core.console import in_kernel
from brorl_lab.core.rundir import eval_key

TERM_LABELS = {"sampled_correct": "sampled correct", "sampled_incorrect": "sampled incorrect",
               "unsampled": "unsampled", "total": "total"}
TERM_COLORS = {"sampled_correct": "#2ca02c", "sampled_incorrect": "#1f77b4", "unsampled": "#d62728",
               "total": "#444444"}
TERMS_TITLE = "Mass balance terms at the current N"
NORMALISED = "N·ΔQ<sub>pos</sub> / lr"


def _n_axis(fig: go.Figure, **where) -> None:
    fig.update_xaxes(type="log", title_text="N (rollouts per prompt)", **where)


def terms_bar_figure(terms: Mapping[str, float], *, spread: Optional[Mapping[str, float]] = None,
                     n: Optional[int] = None, title: str = TERMS_TITLE) -> go.Figure:
    """Bars of the normalised terms {sampled_correct, sampled_incorrect, unsampled, total} (keys of ``terms``),
    with optional error bars ``spread`` (e.g. one standard deviation over draws). Trace name: "terms"."""
    keys = [k for k in TERM_LABELS if k in terms]
    err = None
    if spread is not None:
        err = dict(type="data", array=[float(spread.get(k, 0.0)) for k in keys], visible=True)
    fig = go.Figure(go.Bar(name="terms", x=[TERM_LABELS[k] for k in keys], y=[float(terms[k]) for k in keys],
                           marker_color=[TERM_COLORS[k] for k in keys], error_y=err))
    fig.update_layout(title_text=title, yaxis_title=f"expected {NORMALISED}", showlegend=False,
                      margin=dict(t=60, b=40, l=60, r=20), height=340)
    if n is not None:
        fig.add_annotation(text=f"N = {n:,}", name="n_label", xref="paper", yref="paper", x=1, y=1.08,
                           showarrow=False, xanchor="right")
    fig.add_hline(y=0, line_color="black", line_width=1)
    return fig


def n_sweep_figure(sweep: pd.DataFrame, *, current_n: Optional[int] = None,
                   title: str = "Expected terms and P(ΔQ_pos < 0) across N") -> go.Figure:
    """Two panels from an N-sweep table (:func:`brorl_lab.theory.summarise_sweep`): left, the expected normalised
    terms and total against N; right, P(dQ_pos < 0) with a standard-error band. Markers "current N" (left, one per
    term) and "current N p_neg" (right) sit at ``current_n``."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=(f"expected {NORMALISED}", "P(ΔQ<sub>pos</sub> < 0)"))
    n = sweep["n"].to_numpy()
    for k, label in TERM_LABELS.items():
        fig.add_trace(go.Scatter(name=label, x=n, y=sweep[k], mode="lines+markers", marker_size=4,
                                 line=dict(color=TERM_COLORS[k], width=3 if k == "total" else 2)), row=1, col=1)
    band_x, band_y = p_neg_band(sweep)
    fig.add_trace(go.Scatter(name="±2 s.e.", x=band_x, y=band_y, fill="toself",
                             line_width=0, fillcolor="rgba(214,39,40,0.15)", showlegend=False), row=1, col=2)
    fig.add_trace(go.Scatter(name="P(ΔQ<0)", x=n, y=sweep["p_neg"], mode="lines+markers",
                             line_color=TERM_COLORS["unsampled"], showlegend=False), row=1, col=2)
    g = _row_of(sweep, current_n)
    fig.add_trace(go.Scatter(name="current N", x=[n[g]] * 4, y=[sweep[k].iloc[g] for k in TERM_LABELS],
                             mode="markers", marker=dict(size=13, symbol="circle-open", color="black",
                                                         line_width=2)), row=1, col=1)
    fig.add_trace(go.Scatter(name="current N p_neg", x=[n[g]], y=[sweep["p_neg"].iloc[g]], mode="markers",
                             showlegend=False, marker=dict(size=13, symbol="circle-open", color="black",
                                                           line_width=2)), row=1, col=2)
    _n_axis(fig)
    fig.update_yaxes(range=[-0.02, 1.02], row=1, col=2)
    fig.update_layout(title_text=title, height=360, margin=dict(t=70, b=40, l=60, r=20),
                      legend=dict(orientation="h", y=-0.25))
    return fig


def p_neg_band(sweep: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Closed polygon (x, y) of P(dQ_pos < 0) +- 2 standard errors, clipped to [0, 1], for a filled trace."""
    n = sweep["n"].to_numpy()
    lo = np.clip(sweep["p_neg"] - 2 * sweep["p_neg_se"], 0, 1).to_numpy()
    hi = np.clip(sweep["p_neg"] + 2 * sweep["p_neg_se"], 0, 1).to_numpy()
    return np.r_[n, n[::-1]], np.r_[hi, lo[::-1]]


def _row_of(sweep: pd.DataFrame, n: Optional[int]) -> int:
    """Index of the sweep row at N = n (the first row when n is None)."""
    if n is None:
        return 0
    hits = np.flatnonzero(sweep["n"].to_numpy() == n)
    if hits.size == 0:
        raise ValueError(f"current_n must be one of the sweep's N values {sweep['n'].tolist()}, got {n}")
    return int(hits[0])


def dq_histogram_figure(values: Sequence[float], *, n: Optional[int] = None, nbins: int = 40,
                        title: str = "Monte-Carlo draws of ΔQ_pos at the current N") -> go.Figure:
    """Histogram (trace "draws") of normalised dQ_pos values over Monte-Carlo draws, a line at 0."""
    fig = go.Figure(go.Histogram(name="draws", x=np.asarray(values, dtype=float), nbinsx=nbins,
                                 marker_color=TERM_COLORS["total"]))
    fig.add_vline(x=0, line_color=TERM_COLORS["unsampled"], line_dash="dash")
    fig.update_layout(title_text=title + ("" if n is None else f" (N = {n:,})"), height=300,
                      xaxis_title=NORMALISED, yaxis_title="draws", margin=dict(t=60, b=40, l=60, r=20))
    return fig


def first_order_figure(sim: pd.DataFrame, *, title: str = "Theorem 1 against the exact softmax change") -> go.Figure:
    """Scatter of the first-order total against ``exact_total`` (a :func:`brorl_lab.theory.simulate` table)."""
    lo, hi = float(min(sim.total.min(), sim.exact_total.min())), float(max(sim.total.max(), sim.exact_total.max()))
    fig = go.Figure([go.Scatter(name="draws", x=sim.exact_total, y=sim.total, mode="markers", marker_size=5),
                     go.Scatter(name="y = x", x=[lo, hi], y=[lo, hi], mode="lines", line_dash="dot")])
    fig.update_layout(title_text=title, xaxis_title="exact ΔQ_pos", yaxis_title="Theorem 1 (first order)",
                      height=360)
    return fig


def lemma2_figure(moments: pd.DataFrame, *, title: str = "Lemma 2: the unsampled second moment decays") -> go.Figure:
    """log-log lines of E[U_pos2], E[U_neg2] and their sum against N (:func:`unsampled_second_moment`)."""
    fig = go.Figure([go.Scatter(name=label, x=moments.n, y=moments[c], mode="lines+markers")
                     for c, label in (("u2", "Σ p² (1-p)^N"), ("u_pos2", "correct"), ("u_neg2", "incorrect"))])
    _n_axis(fig)
    fig.update_yaxes(type="log", title_text="expected unsampled Σ p²")
    fig.update_layout(title_text=title, height=360)
    return fig


PAPER_PANELS = (("q_pos", "Q_pos (correct mass)"), ("frac_correct_improved", "share of correct tokens improved"),
                ("worst_correct_drop", "worst drop of a correct token"))


def paper_simulation_figure(runs: pd.DataFrame, *, title: str = "The paper's simulation (Fig. 3)",
                            baselines: Optional[dict] = None) -> go.Figure:
    """Fig. 3's three panels against step, one line per N, from a :func:`paper_simulations` table; each of
    ``baselines`` ({label: a paper_simulation table}, e.g. the decay-only run) adds a dashed grey line."""
    fig = make_subplots(rows=1, cols=3, subplot_titles=[t for _, t in PAPER_PANELS])
    colors = ["#636efa", "#ef553b", "#00cc96", "#ab63fa", "#ffa15a", "#19d3f3", "#ff6692", "#b6e880"]
    lines = [(f"N={n:,}", run, dict(color=colors[i % len(colors)]))
             for i, (n, run) in enumerate(runs.groupby("n", sort=True))]
    lines += [(label, run, dict(color="#555555", dash="dash")) for label, run in (baselines or {}).items()]
    for name, run, line in lines:
        for col, (key, _) in enumerate(PAPER_PANELS, start=1):
            fig.add_trace(go.Scatter(name=name, legendgroup=name, showlegend=col == 1, x=run.step,
                                     y=run[key], mode="lines", line=line), row=1, col=col)
    fig.update_xaxes(title_text="step")
    fig.update_layout(title_text=title, height=380, margin=dict(t=80, b=40, l=60, r=20))
    return fig


def budget_figure(budget: pd.DataFrame, *, title: str = "Fixed budget of draws: final Q_pos against N") -> go.Figure:
    """Final ``q_pos`` (columns n, steps, q_pos) against N when N x steps is held fixed."""
    fig = go.Figure(go.Scatter(name="final Q_pos", x=budget.n, y=budget.q_pos, mode="lines+markers",
                               text=[f"{s} steps" for s in budget.steps]))
    _n_axis(fig)
    fig.update_layout(title_text=title, yaxis_title="Q_pos after the budget", height=340)
    return fig


# ---- dashboard ------------------------------------------------------------------------------------------------------
# Training-run figures: the live dashboard and the run browser (widgets.py sections 2-3), notebooks 03 and 04.
# Inputs are metrics DataFrames as the Trainer writes them (one row per step; ``reset`` is True on the steps where
# the reference was reset) or as tracking.load_runs stacks them (a ``run`` column). Every builder returns a figure,
# with a message drawn in it when there is nothing to plot, so a notebook on an empty or partial runs root renders.

DASHBOARD_METRICS = ("reward_mean", "ds_pass_rate", "entropy", "kl", "eval/mean/pass@1")
X_AXES = {"step": "step", "cum_samples": "samples generated", "cum_updates": "optimizer updates",
          "cum_wall_s": "training time (s, eval excluded)",
          "cum_nominal_samples": "samples (steps x prompts x N)",
          "cum_nominal_updates": "optimizer updates (steps x updates per step)"}
METRIC_LABELS = {"reward_mean": "mean reward", "pass_at_1": "train pass@1", "ds_pass_rate": "dynamic-sampling pass rate",
                 "entropy": "entropy (nats/token)", "kl": "KL to reference", "approx_kl": "KL to rollout policy",
                 "clipfrac_high": "clipped share (upper)", "clipfrac_low": "clipped share (lower)",
                 "response_length_mean": "mean response length", "grad_norm": "grad norm",
                 "samples_per_s": "generation samples/s"}
RESETS = "resets"
RESET_MARKER = dict(symbol="x-thin", size=11, color="#d62728", line=dict(width=2, color="#d62728"))
PALETTE = ("#636efa", "#ef553b", "#00cc96", "#ab63fa", "#ffa15a", "#19d3f3", "#ff6692", "#b6e880", "#ff97ff",
           "#fecb52")
# Columns of a metrics table that are bookkeeping, not curves worth choosing in a browser.
NOT_METRICS = ("step", "run", "skipped", "reset", "samples", "tokens", "kept_groups", "rollout_rounds", "refill_rounds",
               "ds_round_cap", "ds_sample_cap", "ds_cap_hit", "surplus_groups", "trained_samples", "updates",
               "ds_generated_groups")


def metric_label(metric: str) -> str:
    """A readable axis title: "eval/chain_sum/pass@4" -> "chain_sum pass@4 (eval)"."""
    parts = eval_key(metric)
    if parts is not None:
        return f"{parts[0]} {parts[1]} (eval)"
    return METRIC_LABELS.get(metric, metric)


def metric_columns(df: pd.DataFrame) -> list[str]:
    """Numeric curve columns of a metrics table (no config, bookkeeping or cumulative-x columns), eval first."""
    cols = [c for c in df.columns if not c.startswith("cfg.") and c not in NOT_METRICS and c not in X_AXES
            and pd.api.types.is_numeric_dtype(df[c]) and not pd.api.types.is_bool_dtype(df[c])]
    return sorted(cols, key=lambda c: (not c.startswith("eval/"), c.startswith("time/"), c))


def empty_figure(message: str, *, title: Optional[str] = None, height: int = 300) -> go.Figure:
    """A figure that says why there is nothing to plot (annotation "message")."""
    fig = go.Figure()
    fig.add_annotation(text=message, name="message", xref="paper", yref="paper", x=0.5, y=0.5, showarrow=False,
                       font=dict(size=14, color="#666666"))
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    fig.update_layout(title_text=title, height=height)
    return fig


def reset_points(df: pd.DataFrame, metric: str, x: str = "step") -> tuple[np.ndarray, np.ndarray]:
    """(x, y) of the reset steps, y the metric there (or its last value before, for metrics not logged on that
    step, like eval metrics)."""
    if df.empty or "reset" not in df or metric not in df or x not in df:
        return np.array([]), np.array([])
    d = df.sort_values(x) if x in df else df
    y = pd.to_numeric(d[metric], errors="coerce").ffill().bfill()
    mask = d["reset"].fillna(False).astype(bool).to_numpy()
    return d[x].to_numpy(dtype=float)[mask], y.to_numpy(dtype=float)[mask]


def _curve(df: pd.DataFrame, metric: str, x: str) -> tuple[np.ndarray, np.ndarray]:
    from brorl_lab.lab.analysis import curve_points

    return curve_points(df, metric, x)


def metric_figure(metric: str, df: Optional[pd.DataFrame] = None, *, x: str = "step", height: int = 240,
                  color: str = PALETTE[0]) -> go.Figure:
    """One metric of one run against ``x``: trace "metric" (line) and trace "resets" (markers at reset steps).
    The live dashboard starts from ``df=None`` (empty traces) and appends to both."""
    df = pd.DataFrame() if df is None else df
    xs, ys = _curve(df, metric, x)
    rx, ry = reset_points(df, metric, x)
    fig = go.Figure([go.Scatter(name="metric", x=xs, y=ys, mode="lines+markers", marker_size=5, line_color=color),
                     go.Scatter(name=RESETS, x=rx, y=ry, mode="markers", marker=RESET_MARKER,
                                hovertemplate="reference reset at %{x}<extra></extra>")])
    fig.update_layout(title_text=metric_label(metric), height=height, showlegend=False,
                      margin=dict(t=40, b=40, l=50, r=10))
    fig.update_xaxes(title_text=X_AXES.get(x, x))
    return fig


def _add_run_traces(fig: go.Figure, df: pd.DataFrame, metric: str, x: str, runs: Sequence[str],
                    names: Mapping[str, str], mark_resets: bool, **where) -> int:
    """Add one line (and its reset markers) per run to ``fig``; returns how many runs had points."""
    drawn = 0
    for i, run in enumerate(runs):
        g = df[df["run"] == run]
        xs, ys = _curve(g, metric, x)
        if not len(xs):
            continue
        drawn += 1
        color, name = PALETTE[i % len(PALETTE)], names.get(run, run)
        first = not where or where.get("row", 1) == 1 and where.get("col", 1) == 1
        fig.add_trace(go.Scatter(name=name, legendgroup=run, showlegend=first, x=xs, y=ys, mode="lines+markers",
                                 marker_size=4, line_color=color), **where)
        rx, ry = reset_points(g, metric, x)
        if mark_resets and len(rx):
            fig.add_trace(go.Scatter(name=f"{name} · {RESETS}", legendgroup=run, showlegend=False, x=rx, y=ry,
                                     mode="markers", marker={**RESET_MARKER, "color": color,
                                                             "line": {"width": 2, "color": color}},
                                     hovertemplate=f"{name}: reference reset at %{{x}}<extra></extra>"), **where)
    return drawn


def _runs_of(df: pd.DataFrame, runs: Optional[Sequence[str]]) -> list[str]:
    if df.empty or "run" not in df:
        return []
    present = list(dict.fromkeys(df["run"]))
    return present if runs is None else [r for r in runs if r in set(present)]


def run_curves_figure(df: pd.DataFrame, metric: str, *, x: str = "step", runs: Optional[Sequence[str]] = None,
                      names: Optional[Mapping[str, str]] = None, mark_resets: bool = True,
                      title: Optional[str] = None, height: int = 380) -> go.Figure:
    """Overlay ``metric`` against ``x`` for ``runs`` (default: all) of a stacked table (column ``run``): one line
    per run, named by ``names[run]`` or the run, reset steps as x markers (trace "<name> · resets")."""
    runs = _runs_of(df, runs)
    title = title or f"{metric_label(metric)} against {X_AXES.get(x, x)}"
    if not runs:
        return empty_figure("no runs selected" if not df.empty else "no runs found", title=title, height=height)
    fig = go.Figure()
    if not _add_run_traces(fig, df, metric, x, runs, names or {}, mark_resets):
        return empty_figure(f"no values of {metric} against {x} in the selected runs", title=title, height=height)
    fig.update_layout(title_text=title, height=height, legend=dict(orientation="h", y=-0.2),
                      margin=dict(t=50, b=40, l=60, r=20))
    fig.update_xaxes(title_text=X_AXES.get(x, x))
    fig.update_yaxes(title_text=metric_label(metric))
    return fig


def metrics_grid_figure(df: pd.DataFrame, metrics: Sequence[str], *, x: str = "step",
                        runs: Optional[Sequence[str]] = None, names: Optional[Mapping[str, str]] = None,
                        cols: int = 2, title: Optional[str] = None, height_per_row: int = 260) -> go.Figure:
    """Several metrics, one panel each, runs overlaid with the same colour in every panel (an ablation at a
    glance: e.g. entropy, KL, reward and eval pass@1 of each arm)."""
    runs = _runs_of(df, runs)
    if not runs or not metrics:
        return empty_figure("no runs found" if not runs else "no metrics chosen", title=title)
    rows = -(-len(metrics) // cols)
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=[metric_label(m) for m in metrics])
    for i, m in enumerate(metrics):
        _add_run_traces(fig, df, m, x, runs, names or {}, True, row=i // cols + 1, col=i % cols + 1)
    fig.update_xaxes(title_text=X_AXES.get(x, x))
    fig.update_layout(title_text=title, height=rows * height_per_row + 80, legend=dict(orientation="h", y=-0.12),
                      margin=dict(t=80, b=40, l=60, r=20))
    return fig


def arm_band_figure(pooled: pd.DataFrame, *, metric: str, x: str, title: Optional[str] = None,
                    height: int = 380, **where) -> go.Figure:
    """Mean curve per arm with its min-max band over seeds, from :func:`brorl_lab.lab.analysis.arm_curves`."""
    title = title or f"{metric_label(metric)} at equal {X_AXES.get(x, x)}"
    if pooled.empty:
        return empty_figure(f"no runs with two or more values of {metric} over a common range of {x}",
                            title=title, height=height)
    fig = go.Figure()
    for i, (arm, g) in enumerate(pooled.groupby("arm", sort=True)):
        color = PALETTE[i % len(PALETTE)]
        if (g["runs"] > 1).any():
            fig.add_trace(go.Scatter(name=f"{arm} · range", legendgroup=arm, showlegend=False,
                                     x=np.r_[g["x"], g["x"][::-1]], y=np.r_[g["max"], g["min"][::-1]],
                                     fill="toself", line_width=0, fillcolor=_rgba(color, 0.18), hoverinfo="skip"))
        n = int(g["runs"].max())
        fig.add_trace(go.Scatter(name=f"{arm} ({n} run{'s' if n > 1 else ''})", legendgroup=arm, x=g["x"],
                                 y=g["mean"], mode="lines", line_color=color))
    fig.update_layout(title_text=title, height=height, legend=dict(orientation="h", y=-0.25),
                      margin=dict(t=50, b=40, l=60, r=20))
    fig.update_xaxes(title_text=X_AXES.get(x, x))
    fig.update_yaxes(title_text=metric_label(metric))
    return fig


def _rgba(hex_color: str, alpha: float) -> str:
    r, g, b = (int(hex_color[i:i + 2], 16) for i in (1, 3, 5))
    return f"rgba({r},{g},{b},{alpha})"


def pass_at_k_figure(pooled: pd.DataFrame, *, family: str = "mean",
                     title: str = "pass@k before and after training, per arm") -> go.Figure:
    """Two panels from :func:`brorl_lab.lab.analysis.arm_pass_at_k`: left, pass@k against k at the first (dashed) and
    last (solid) evaluation of each arm; right, the gain against k. A gain that stays at large k widens the
    reasoning boundary; one that fades as k grows only sharpens pass@1."""
    if pooled.empty:
        return empty_figure(f"no eval/{family}/pass@k columns in these runs", title=title)
    fig = make_subplots(rows=1, cols=2, subplot_titles=(f"{family} pass@k", "gain (last − first evaluation)"))
    for i, (arm, g) in enumerate(pooled.groupby("arm", sort=True)):
        color = PALETTE[i % len(PALETTE)]
        fig.add_trace(go.Scatter(name=f"{arm} · first eval", legendgroup=arm, showlegend=False, x=g["k"],
                                 y=g["initial"], mode="lines+markers", line=dict(color=color, dash="dash")),
                      row=1, col=1)
        fig.add_trace(go.Scatter(name=arm, legendgroup=arm, x=g["k"], y=g["final"], mode="lines+markers",
                                 line_color=color), row=1, col=1)
        fig.add_trace(go.Scatter(name=f"{arm} · gain", legendgroup=arm, showlegend=False, x=g["k"], y=g["gain"],
                                 mode="lines+markers", line_color=color), row=1, col=2)
    fig.add_hline(y=0, line_color="black", line_width=1, row=1, col=2)
    ks = sorted(pooled["k"].unique())
    fig.update_xaxes(type="log", tickvals=ks, ticktext=[str(k) for k in ks], title_text="k")
    fig.update_layout(title_text=title, height=380, legend=dict(orientation="h", y=-0.25),
                      margin=dict(t=80, b=40, l=60, r=20))
    return fig


# ---- training curves -------------------------------------------------------------------------------------------------
# Runs grouped into arms (BroRL's Fig. 1 in miniature, notebook 02: brorl_lab.study.arms.run_rollout_scaling): a long
# table with columns arm, seed, run and the Trainer's metrics; the caller may name each arm's colour. One panel per
# metric; each arm's seeds are put on a grid of x that they all cover (analysis.curves_on_grid, per arm so the longer
# arm is not cut) and pooled (analysis.arm_curves): the mean line, and with >= 2 seeds the min-max band over seeds.

ARM_DIAGNOSTICS = (("ds_pass_rate", "dynamic-sampling pass rate"), ("entropy", "entropy (nats/token)"),
                   ("kl", "KL to the reference policy"), ("response_length_mean", "mean response length (tokens)"),
                   ("samples_per_s", "generation samples/s"))


def arm_panels_figure(df: pd.DataFrame, metrics: Sequence[str], *, x: str = "cum_samples",
                      titles: Optional[Sequence[str]] = None, labels: Optional[Mapping[str, str]] = None,
                      cols: int = 2, title: Optional[str] = None, points: int = 41,
                      height_per_row: int = 300, colors: Optional[Mapping[str, str]] = None) -> go.Figure:
    """One panel per metric against ``x``, one line per arm (trace name ``labels[arm]``, legend group ``arm``,
    colour ``colors[arm]`` or the palette's) and a band trace "<label> · seed range" when the arm has >= 2 seeds."""
    from brorl_lab.lab.analysis import arm_curves, curves_on_grid

    if df.empty or not metrics or "arm" not in df:
        return empty_figure("no arms to plot", title=title)
    labels, colors = dict(labels or {}), dict(colors or {})
    arms = list(dict.fromkeys(df["arm"]))
    rows = -(-len(metrics) // cols)
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=list(titles or [metric_label(m) for m in metrics]),
                        vertical_spacing=min(0.3 / rows, 0.15))
    for i, m in enumerate(metrics):
        where = dict(row=i // cols + 1, col=i % cols + 1)
        for j, arm in enumerate(arms):
            sub = df[df["arm"] == arm]
            pooled = arm_curves(curves_on_grid(sub, m, x, points=points, labels={r: arm for r in sub["run"]}))
            if pooled.empty:
                continue
            color, name = colors.get(arm, PALETTE[j % len(PALETTE)]), labels.get(arm, arm)
            if (pooled["runs"] > 1).any():
                fig.add_trace(go.Scatter(name=f"{name} · seed range", legendgroup=arm, showlegend=False,
                                         x=np.r_[pooled["x"], pooled["x"][::-1]],
                                         y=np.r_[pooled["max"], pooled["min"][::-1]], fill="toself", line_width=0,
                                         fillcolor=_rgba(color, 0.18), hoverinfo="skip"), **where)
            fig.add_trace(go.Scatter(name=name, legendgroup=arm, showlegend=i == 0, x=pooled["x"], y=pooled["mean"],
                                     mode="lines", line_color=color), **where)
        if i + cols >= len(metrics):  # x title only under the lowest panel of each column
            fig.update_xaxes(title_text=X_AXES.get(x, x), **where)
    fig.update_layout(title_text=title, height=rows * height_per_row + 90, legend=dict(orientation="h", y=-0.12),
                      margin=dict(t=80, b=40, l=60, r=20))
    return fig


def arm_pass_at_1_figure(df: pd.DataFrame, *, x: str = "cum_samples", labels: Optional[Mapping[str, str]] = None,
                         title: Optional[str] = None, colors: Optional[Mapping[str, str]] = None) -> go.Figure:
    """Held-out pass@1 of each family (and their mean) against ``x`` for both arms: BroRL's Fig. 1 in miniature."""
    fams = sorted({eval_key(c)[0] for c in df.columns if c.startswith("eval/") and c.endswith("/pass@1")},
                  key=lambda f: (f == "mean", f))
    return arm_panels_figure(df, [f"eval/{f}/pass@1" for f in fams], x=x, titles=[f"{f} pass@1" for f in fams],
                             labels=labels, title=title or f"Held-out pass@1 against {X_AXES.get(x, x)}",
                             colors=colors)


def arm_diagnostics_figure(df: pd.DataFrame, *, x: str = "cum_samples", labels: Optional[Mapping[str, str]] = None,
                           title: str = "What each arm's steps looked like",
                           colors: Optional[Mapping[str, str]] = None) -> go.Figure:
    """Dynamic-sampling pass rate, entropy, KL to the reference, response length and generation samples/s of both
    arms against ``x``."""
    present = [(m, t) for m, t in ARM_DIAGNOSTICS if m in df]
    return arm_panels_figure(df, [m for m, _ in present], x=x, titles=[t for _, t in present], labels=labels,
                             title=title, colors=colors)


# ---- iso-compute sweeps over N (lab.sweep.iso_compute_plan, notebook 05) ---------------------------------------
def iso_compute_figure(summary: pd.DataFrame, *, title: str = "Equal samples per step: held-out pass@k against N"
                       ) -> go.Figure:
    """From :func:`brorl_lab.lab.analysis.iso_compute_summary`: left, final pass@k against N (one line per k, std
    over seeds as error bars); right, its gain over the starting checkpoint. Where the lines flatten or fall, a
    larger N stopped paying."""
    if summary.empty:
        return empty_figure("no iso-compute runs", title=title)
    fig = make_subplots(rows=1, cols=2, subplot_titles=("final pass@k", "gain over the start"))
    for i, (k, g) in enumerate(summary.groupby("k", sort=True)):
        color = PALETTE[i % len(PALETTE)]
        for col, (y, err) in enumerate((("final", "final_std"), ("gain", "gain_std")), start=1):
            fig.add_trace(go.Scatter(name=f"pass@{k}", legendgroup=str(k), showlegend=col == 1, x=g["N"], y=g[y],
                                     error_y=dict(type="data", array=g[err].fillna(0).tolist(), visible=True),
                                     mode="lines+markers", line_color=color), row=1, col=col)
    ns = sorted(summary["N"].unique())
    fig.update_xaxes(type="log", tickvals=ns, ticktext=[str(n) for n in ns], title_text="N (rollouts per prompt)")
    fig.add_hline(y=0, line_color="black", line_width=1, row=1, col=2)
    fig.update_layout(title_text=title, height=400, legend=dict(orientation="h", y=-0.3),
                      margin=dict(t=80, b=40, l=60, r=20))
    return fig
# ---- exportable figures --------------------------------------------------------------------------------------------
# In a Jupyter kernel plotly's default renderer is "plotly_mimetype": JupyterLab draws it, but nbconvert's HTML drops
# it (no HTML exporter knows that mimetype), so an exported notebook shows the code and no figure. A second renderer
# gives every figure a text/html twin that nbconvert keeps and that needs no network. plotly.js travels once per
# notebook, in the output of the cell that imports this module, as an inert <script type="text/plain">: JupyterLab,
# which draws the mimetype with its own plotly, never executes that 4.8 MB bundle; in an exported page the first
# figure that finds no window.Plotly evaluates it.

NOTEBOOK_RENDERER = "brorl_notebook"
EXPORTABLE_RENDERER = f"plotly_mimetype+{NOTEBOOK_RENDERER}"
PLAIN_KERNEL_RENDERER = "plotly_mimetype"  # what plotly picks by itself in a plain Jupyter kernel
PLOTLYJS_ID = "brorl-lab-plotly-js"
LOAD_PLOTLYJS = (f'<script>if (!window.Plotly) {{ var js = document.getElementById("{PLOTLYJS_ID}"); '
                 "if (js) { (0, eval)(js.textContent); } }</script>")


class OfflineNotebookRenderer(NotebookRenderer):
    """plotly's "notebook" renderer, changed in two ways: plotly.js is embedded inert (see above) rather than run in
    the live notebook, and figures carry no MathJax script tag (it points at a CDN; these figures use no LaTeX)."""

    def activate(self):
        from IPython.display import display_html
        from plotly.offline import get_plotlyjs

        display_html(f'<script type="text/plain" id="{PLOTLYJS_ID}">{get_plotlyjs()}</script>', raw=True)

    def to_mimebundle(self, fig_dict):
        html = pio.to_html(fig_dict, config=self.config, include_plotlyjs=False, include_mathjax=False,
                           full_html=False, default_width="100%", default_height=525, validate=False)
        return {"text/html": LOAD_PLOTLYJS + html}


def exportable_figures(*, force: bool = False) -> bool:
    """Make the figures a Jupyter kernel displays survive an HTML export: renderer ``plotly_mimetype+brorl_notebook``
    (interactive mimetype for JupyterLab, self-contained HTML for nbconvert), plotly.js embedded into the current
    cell's output once. Runs at import of this module; returns whether it switched the renderer.

    Only plotly's plain-kernel default is replaced: outside a kernel, under ``PLOTLY_RENDERER``, in VS Code or Colab
    (their own defaults), or after a notebook chose a renderer, nothing changes unless ``force``. Calling it again
    with ``force=True`` embeds plotly.js again (e.g. after the cell that first embedded it was re-run or cleared)."""
    if not in_kernel():
        return False
    if not force and (os.environ.get("PLOTLY_RENDERER") or pio.renderers.default != PLAIN_KERNEL_RENDERER):
        return False
    if NOTEBOOK_RENDERER not in pio.renderers:
        pio.renderers[NOTEBOOK_RENDERER] = OfflineNotebookRenderer()
    pio.renderers.default = EXPORTABLE_RENDERER  # queues plotly.js for the first figure shown...
    activate = getattr(pio.renderers, "_activate_pending_renderers", None)
    if activate is not None:  # ... or embeds it now, in the importing cell, where re-running a figure cell keeps it
        activate()
    return True


exportable_figures()


# ---- benchmarks ---------------------------------------------------------------------------------------------------
THROUGHPUT_DASH = {"short": "dot", "long": "solid"}
THROUGHPUT_COLOR = {"torch": "#1f77b4", "hf": "#ff7f0e", "vllm": "#2ca02c"}


def throughput_vs_n_figure(points: Sequence[Mapping], *, title: Optional[str] = None) -> go.Figure:
    """Rollout samples/s against N (log axis) at a fixed total of samples per call, one line per (regime, engine):
    how much of BroRL's "larger N is faster in wall time" a machine gives at short and at long responses.

    ``points``: mappings with ``regime`` ("short" / "long" / any label), ``engine``, ``n`` and ``samples_per_s``
    (the ``point`` rows of ``python -m brorl_lab bench``)."""
    df = pd.DataFrame(list(points))
    missing = {"regime", "engine", "n", "samples_per_s"} - set(df.columns)
    if df.empty or missing:
        raise ValueError(f"points: need regime, engine, n and samples_per_s in every point; missing "
                         f"{sorted(missing) or 'all (no points)'}")
    fig = go.Figure()
    for (regime, engine), part in df.groupby(["regime", "engine"], sort=False):
        part = part.sort_values("n")
        fig.add_trace(go.Scatter(x=part["n"], y=part["samples_per_s"], mode="lines+markers",
                                 name=f"{engine}, {regime} responses",
                                 line=dict(dash=THROUGHPUT_DASH.get(regime, "dash"),
                                           color=THROUGHPUT_COLOR.get(engine))))
    fig.update_layout(title=title or "Rollout samples/s against N, fixed samples per call", height=420,
                      legend=dict(orientation="v"), margin=dict(l=60, r=20, t=50, b=50))
    fig.update_xaxes(type="log", title="N (rollouts per prompt)", tickvals=sorted(df["n"].unique()))
    fig.update_yaxes(type="log", title="samples/s")
    return fig
