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
"""

from __future__ import annotations

from typing import Mapping, Optional, Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

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


def paper_simulation_figure(runs: pd.DataFrame, *, title: str = "The paper's simulation (Fig. 3)") -> go.Figure:
    """Fig. 3's three panels against step, one line per N, from a :func:`paper_simulations` table."""
    fig = make_subplots(rows=1, cols=3, subplot_titles=[t for _, t in PAPER_PANELS])
    colors = ["#636efa", "#ef553b", "#00cc96", "#ab63fa", "#ffa15a", "#19d3f3", "#ff6692", "#b6e880"]
    for i, (n, run) in enumerate(runs.groupby("n", sort=True)):
        for col, (key, _) in enumerate(PAPER_PANELS, start=1):
            fig.add_trace(go.Scatter(name=f"N={n:,}", legendgroup=str(n), showlegend=col == 1, x=run.step,
                                     y=run[key], mode="lines", line_color=colors[i % len(colors)]), row=1, col=col)
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
