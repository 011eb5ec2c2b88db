"""The regime map: where does broadening pay? The same branch on task settings with different shares of
rare-success prompts, the BroRL - ProRL gap against that share, and what s_N(p) predicts.

For each setting (a list of tasks and their task_configs) the branch point is measured first
(:func:`brorl_lab.study.mechanism.prompt_pass_rates`, 512 draws per prompt): the share of *rare-success* prompts
(:func:`brorl_lab.study.rare.rare_success`, 0 < p <= 1/16; the shipped map, notebooks/figures/regime_map.csv, was
measured with 0 < p <= 0.1 before that constant) and, from the measured per-prompt p, the expected share of
informative groups of each arm (:func:`brorl_lab.study.rare.informative_share`),

    E[s_N] = mean over prompts of s_N(p) = 1 - p^N - (1 - p)^N        (N = 16 and N = 512),

whose ratio rho = E[s_512] / E[s_16] is how many more of its generated samples the BroRL arm can learn from. Then
both arms run (:func:`brorl_lab.study.arms.run_rollout_scaling`) and the paired gap at equal samples, with its 95%
t interval over seeds, is read on the shared grid (:func:`brorl_lab.study.revival.grid_comparison`).

**The prediction we test.** At equal samples the BroRL arm takes ``samples_ratio`` (8) times fewer optimizer
updates; under Adam each update has about the same size whatever its batch, so what BroRL gains is the quality of
each update. If that quality is the share of samples that carry a signal, broadening pays where rho exceeds the
update ratio it gives up: the predicted crossover is the rare-success share at which rho = 8 (interpolated over the
settings). The measured crossover is where a line fitted to the gaps (weighted by 1 / s.e.^2) crosses 0.
:func:`crossover` reports both; whichever way they fall, the map says so.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Optional

import numpy as np
import pandas as pd

from brorl_lab.lab.stats import t_quantile
from brorl_lab.study.rare import informative_share, rare_failure, rare_success


def branch_point_row(rates: pd.DataFrame, *, n_small: int = 16, n_large: int = 512) -> dict:
    """What the branch point predicts for one setting, from its :func:`prompt_pass_rates` table: prompts, the
    share of rare-success and rare-failure prompts (:mod:`brorl_lab.study.rare`), the 'only N=512' share,
    E[s_16], E[s_512] and their ratio rho."""
    p = rates["p"].to_numpy(float)
    small, large = informative_share(p, n_small), informative_share(p, n_large)
    return {"prompts": int(p.size), "mean_p": float(p.mean()), "rare_success": float(rare_success(p).mean()),
            "rare_failure": float(rare_failure(p).mean()),
            "only_large": float((rates["reach"] == "only N=512").mean()),
            f"E_s{n_small}": small, f"E_s{n_large}": large, "rho": large / small if small > 0 else float("inf")}


def crossover(table: pd.DataFrame, *, x: str = "rare_success", ratio: float = 8.0) -> dict:
    """Where the gap changes sign, measured and predicted, from the regime table (one row per setting with ``x``,
    ``gap``, ``se`` and ``rho``).

    Measured: weighted least squares gap = a + b x (weights 1 / se^2, settings with se > 0), the crossover
    x* = -a / b with a delta-method 95% interval (t with settings - 2 degrees of freedom), and b's interval (does
    the gap grow with ``x``?). Predicted: the ``x`` at which rho crosses ``ratio``, interpolated linearly between
    the settings sorted by ``x`` (None when rho never crosses it in the measured range)."""
    need = {x, "gap", "se", "rho"}
    if not isinstance(table, pd.DataFrame) or not need <= set(table.columns):
        raise ValueError(f"table: allowed: a regime table with columns {sorted(need)}")
    t = table[np.isfinite(table["se"]) & (table["se"] > 0)].sort_values(x)
    out: dict = {"x": x, "ratio": ratio, "settings": int(len(t)), "a": None, "b": None, "b_lo": None, "b_hi": None,
                 "measured": None, "measured_lo": None, "measured_hi": None, "predicted": None}
    rho = table.sort_values(x)
    xs, rs = rho[x].to_numpy(float), np.minimum(rho["rho"].to_numpy(float), 1e9)
    for i in range(len(xs) - 1):
        if (rs[i] - ratio) * (rs[i + 1] - ratio) <= 0 and rs[i] != rs[i + 1]:
            out["predicted"] = float(xs[i] + (ratio - rs[i]) * (xs[i + 1] - xs[i]) / (rs[i + 1] - rs[i]))
            break
    if len(t) < 3:
        return out
    X = np.c_[np.ones(len(t)), t[x].to_numpy(float)]
    w = 1 / t["se"].to_numpy(float) ** 2
    y = t["gap"].to_numpy(float)
    cov = np.linalg.inv(X.T @ (w[:, None] * X))
    a, b = cov @ X.T @ (w * y)
    resid = y - X @ [a, b]
    scale = float((w * resid ** 2).sum() / (len(t) - 2))  # residual variance beyond the seeds' s.e.
    cov = cov * max(scale, 1.0)
    q = t_quantile(0.975, len(t) - 2)
    out.update(a=float(a), b=float(b), b_lo=float(b - q * math.sqrt(cov[1, 1])),
               b_hi=float(b + q * math.sqrt(cov[1, 1])))
    if b != 0:
        xs_star = -a / b
        grad = np.array([-1 / b, a / b ** 2])
        se = math.sqrt(float(grad @ cov @ grad))
        out.update(measured=float(xs_star), measured_lo=float(xs_star - q * se), measured_hi=float(xs_star + q * se))
    return out


def regime_text(table: pd.DataFrame, cross: dict) -> str:
    """The map in plain words: per setting the gap with its interval, how many settings resolve a sign, the rank
    correlation of the gap with rho, then the fit and the two crossovers (and whether the fit can place one)."""
    from scipy import stats

    lines = []
    for name, r in table.iterrows():
        lines.append(f"{name}: rare-success share {r['rare_success']:.0%}, rho {r['rho']:.2f}; gap BroRL - ProRL at "
                     f"equal samples {100 * r['gap']:+.1f} [{100 * r['lo']:+.1f}, {100 * r['hi']:+.1f}] points "
                     f"({int(r['n'])} paired seeds)")
    above, below = int((table["lo"] > 0).sum()), int((table["hi"] < 0).sum())
    lines.append(f"BroRL ahead (interval above 0) on {above} of {len(table)} settings, behind (interval below 0) on "
                 f"{below}, unresolved on {len(table) - above - below}.")
    if len(table) >= 3:
        rs = stats.spearmanr(table["rho"], table["gap"])
        lines.append(f"Rank correlation of the gap with rho (what s_N predicts orders the settings): Spearman "
                     f"{rs.statistic:+.2f} (p = {rs.pvalue:.2f}, {len(table)} settings).")
    if cross["b"] is None:
        lines.append(f"Fewer than 3 settings with an interval: no line fitted (predicted crossover at rare-success "
                     f"share {_pct(cross['predicted'])}).")
        return "\n".join(lines)
    grows = ("grows" if cross["b_lo"] > 0 else "shrinks" if cross["b_hi"] < 0 else
             "neither grows nor shrinks resolvably")
    lines.append(f"Fitted: the gap {grows} with the rare-success share (slope {100 * cross['b']:+.1f} points per unit "
                 f"share, 95% interval [{100 * cross['b_lo']:+.1f}, {100 * cross['b_hi']:+.1f}]).")
    meas = (f"{_pct(cross['measured'])} (95% interval {_pct(cross['measured_lo'])} to {_pct(cross['measured_hi'])})"
            if cross["measured"] is not None else "none (flat fit)")
    pred = _pct(cross["predicted"]) if cross["predicted"] is not None else \
        f"outside the measured range (rho never crosses {cross['ratio']:g})"
    verdict = ""
    span = float(table[cross["x"]].max() - table[cross["x"]].min())
    if cross["measured"] is not None and (cross["measured_hi"] - cross["measured_lo"]) >= span:
        verdict = (" The measured crossover's interval is wider than the range of settings: the fit cannot place a "
                   "crossover, so this test of the prediction is uninformative.")
    elif cross["measured"] is not None and cross["predicted"] is not None:
        inside = cross["measured_lo"] <= cross["predicted"] <= cross["measured_hi"]
        verdict = (" The predicted crossover lies inside the measured one's interval." if inside else
                   " The predicted crossover lies outside the measured one's interval.")
    lines.append(f"Crossover (gap = 0): measured at rare-success share {meas}; predicted by s_N (rho = "
                 f"{cross['ratio']:g}) at {pred}.{verdict}")
    return "\n".join(lines)


def write_outputs(out: Path, table: pd.DataFrame, *, export_png: bool = True) -> dict:
    """The map's outputs from its table (one row per setting, as notebook 06 builds it): regime_map.csv,
    regime.txt (:func:`regime_text`), regime.json (:func:`crossover`) and regime_map.png (needs Chromium; skipped
    with a note). Returns {"text", "cross", "figure", "png_note"}."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    table.to_csv(out / "regime_map.csv")
    cross = crossover(table)
    text = regime_text(table, cross)
    (out / "regime.txt").write_text(text + "\n")
    (out / "regime.json").write_text(json.dumps(cross, indent=1, default=float))
    fig, note = regime_figure(table, cross), None
    if export_png:
        try:
            fig.write_image(out / "regime_map.png", width=1100)
        except Exception as e:  # noqa: BLE001 - no Chromium / kaleido: the figure stays inline
            note = f"PNG export skipped ({type(e).__name__})"
    return {"text": text, "cross": cross, "figure": fig, "png_note": note}


def read_table(out: Path) -> pd.DataFrame:
    """The regime_map.csv a run of notebook 06 wrote into ``out``."""
    path = Path(out) / "regime_map.csv"
    if not path.is_file():
        raise ValueError(f"out: {path} does not exist; allowed: a directory notebook 06 (regime-map) wrote into")
    return pd.read_csv(path, index_col=0)


def _pct(v: Optional[float]) -> str:
    return "n/a" if v is None or not np.isfinite(v) else f"{v:.0%}"


def regime_figure(table: pd.DataFrame, cross: Optional[Mapping] = None, *, title: Optional[str] = None):
    """Left: the gap (points) against the rare-success share, one marker per setting with its 95% interval, the
    fitted line and both crossovers. Right: rho = E[s_512] / E[s_16] against the same share, with the update ratio
    the prediction compares it to."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=2, subplot_titles=["BroRL - ProRL at equal samples",
                                                        "rho = E[s_512(p)] / E[s_16(p)] at the branch point"])
    x = 100 * table["rare_success"]
    fig.add_trace(go.Scatter(x=x, y=100 * table["gap"], mode="markers+text", text=list(table.index),
                             textposition="top center", name="measured gap (95% t interval)",
                             error_y=dict(type="data", symmetric=False, array=100 * (table["hi"] - table["gap"]),
                                          arrayminus=100 * (table["gap"] - table["lo"]))), row=1, col=1)
    fig.add_hline(y=0, line_color="black", line_width=1, row=1, col=1)
    if cross and cross.get("b") is not None:
        xs = np.linspace(0, max(0.01, float(table["rare_success"].max())), 50)
        fig.add_trace(go.Scatter(x=100 * xs, y=100 * (cross["a"] + cross["b"] * xs), mode="lines",
                                 name="weighted fit", line=dict(dash="dot")), row=1, col=1)
    for key, name, dash, where in (("measured", "measured crossover", "dash", "top left"),
                                   ("predicted", "predicted crossover", "dot", "bottom right")):
        if cross and cross.get(key) is not None and np.isfinite(cross[key]):
            fig.add_vline(x=100 * cross[key], line_dash=dash, annotation_text=name, annotation_position=where,
                          row=1, col=1)
    fig.add_trace(go.Scatter(x=x, y=table["rho"], mode="markers+text", text=list(table.index),
                             textposition="top center", name="rho (from the measured p)"), row=1, col=2)
    if cross:
        fig.add_hline(y=cross["ratio"], line_dash="dot", annotation_text="update ratio", row=1, col=2)
    fig.update_xaxes(title_text="rare-success prompts at the branch point (%)")
    fig.update_yaxes(title_text="gap (points of mean pass@1)", row=1, col=1)
    fig.update_layout(title_text=title or "The regime map: where broadening pays", height=460,
                      legend=dict(orientation="h", y=-0.25), margin=dict(t=80, b=40, l=60, r=20))
    return fig
