"""ipywidgets for the notebooks.

Sections (each self-contained; later dashboards go below their own header):
    1. The mass-balance explorer (theory of BroRL Sec. 2): :func:`mass_balance_explorer`.
"""

from __future__ import annotations

import time
from typing import Optional, Sequence

import ipywidgets as w
import numpy as np
import plotly.graph_objects as go

from . import plots, theory

# =================================================================================================================
# 1. The mass-balance explorer
# =================================================================================================================

EXPLORER_N_DESCRIPTION = "N"  # stable handles for browser tests
EXPLORER_TITLE = plots.TERMS_TITLE
EXPLORER_N_VALUES = tuple(2**k for k in range(17))  # 1 .. 65,536 on a log2 grid
SHAPES = {"paper (seeded)": "paper_seeded", "paper (unseeded)": "paper_unseeded", "zipf": "zipf"}
CUSTOM = "custom logits"


class MassBalanceExplorer(w.VBox):
    """Sliders for N, the vocabulary and the rewards; three live plotly figures of Theorem 1's terms.

    What does not depend on N is computed when the problem changes: ``trials`` nested Monte-Carlo streams of
    max(N) draws (:func:`brorl_lab.theory.draw_sums`, ~1 s at V=128,000) and, when the rewards change, the N-sweep
    table. Moving the N slider only calls :meth:`redraw`, which indexes those arrays and updates traces in place.
    """

    def __init__(self, problem: Optional[theory.Problem] = None, *, n_values: Sequence[int] = EXPLORER_N_VALUES,
                 n: int = 512, vocab: int = 128_000, n_correct: int = 10_000, trials: int = 300, seed: int = 0):
        self.n_values = theory._n_grid(n_values)
        if n not in self.n_values:
            raise ValueError(f"n must be one of n_values {self.n_values.tolist()}, got {n}")
        self.trials, self.seed, self.custom = theory._count(trials, "trials", 2), seed, problem
        style = {"description_width": "90px"}
        self.n_slider = w.SelectionSlider(options=[(f"{x:,}", int(x)) for x in self.n_values], value=int(n),
                                          description=EXPLORER_N_DESCRIPTION, continuous_update=True, style=style,
                                          layout=w.Layout(width="520px"))
        shapes = ([CUSTOM] if problem is not None else []) + list(SHAPES)
        self.shape = w.Dropdown(options=shapes, value=shapes[0], description="vocabulary", style=style)
        self.vocab = w.Dropdown(options=sorted({1_000, 8_000, 32_000, 128_000, int(vocab)}), value=int(vocab),
                                description="V", style=style)
        self.n_correct = w.BoundedIntText(value=int(n_correct), min=1, max=int(vocab) - 1, description="|P| correct",
                                          style=style)
        self.placement = w.Dropdown(options=list(theory.PLACEMENTS), value="head", description="placement",
                                    style=style)
        self.exponent = w.FloatSlider(value=1.0, min=0.0, max=2.0, step=0.05, description="Zipf s",
                                      continuous_update=False, style=style)
        self.r_c = w.FloatSlider(value=1.0, min=0.0, max=2.0, step=0.1, description="R_c", continuous_update=False,
                                 style=style)
        self.r_w = w.FloatSlider(value=-1.0, min=-2.0, max=0.0, step=0.1, description="R_w",
                                 continuous_update=False, style=style)
        self.status = w.HTML()
        self.last_redraw_s = float("nan")
        self._busy = False

        self._build_problem()
        self._price()
        g = self._index(n)
        self.terms_fig = go.FigureWidget(plots.terms_bar_figure(self._bar_values(g), spread=self._bar_spread(g)))
        self.sweep_fig = go.FigureWidget(plots.n_sweep_figure(self.sweep, current_n=int(n)))
        self.hist_fig = go.FigureWidget(plots.dq_histogram_figure(self.draw_terms[:, g, 3]))
        self._update_status()

        self.n_slider.observe(lambda ch: self.redraw(ch["new"]), names="value")
        for c in (self.shape, self.vocab, self.n_correct, self.placement, self.exponent):
            c.observe(self._on_problem, names="value")
        for c in (self.r_c, self.r_w):
            c.observe(self._on_rewards, names="value")
        self._sync_controls()
        controls = w.HBox([w.VBox([self.n_slider, self.shape, self.vocab, self.n_correct]),
                           w.VBox([self.placement, self.exponent, self.r_c, self.r_w])])
        super().__init__([controls, self.status, w.HBox([self.terms_fig, self.hist_fig]), self.sweep_fig])

    # ---- precomputation (everything that does not depend on N) ---------------------------------------------------
    def current_problem(self) -> theory.Problem:
        """The problem the controls describe now."""
        shape = self.shape.value
        if shape == CUSTOM:
            return self.custom
        vocab, n_correct = int(self.vocab.value), min(int(self.n_correct.value), int(self.vocab.value) - 1)
        if shape == "zipf":
            return theory.zipf_problem(vocab, n_correct, exponent=float(self.exponent.value),
                                       placement=self.placement.value, seed=self.seed)
        return theory.paper_problem(vocab, n_correct, seeding=shape == "paper (seeded)")

    def _build_problem(self) -> None:
        self.problem = self.current_problem()
        self.draws = theory.draw_sums(self.problem.p, self.problem.correct, self.n_values, trials=self.trials,
                                      seed=self.seed)

    def _price(self) -> None:
        """Terms of every stored draw for the current rewards, and the N-sweep table."""
        r = {"r_c": float(self.r_c.value), "r_w": float(self.r_w.value)}
        self.draw_terms = self.draws.terms(**r)  # [T, G, 4] normalised
        self.sweep = theory.summarise_sweep(self.draws, **r)
        self._sweep_terms = self.sweep[list(theory.TERMS_AND_TOTAL)].to_numpy()  # [G, 4]
        self._spread = self.draw_terms.std(axis=0)  # [G, 4]

    def _index(self, n: int) -> int:
        hits = np.flatnonzero(self.n_values == int(n))
        if hits.size == 0:
            raise ValueError(f"n must be one of the explorer's N values {self.n_values.tolist()}, got {n}")
        return int(hits[0])

    def _bar_values(self, g: int) -> dict:
        return dict(zip(theory.TERMS_AND_TOTAL, self._sweep_terms[g]))

    def _bar_spread(self, g: int) -> dict:
        return dict(zip(theory.TERMS_AND_TOTAL, self._spread[g]))

    # ---- the redraw a slider move triggers ---------------------------------------------------------------------
    def redraw(self, n: int) -> float:
        """Show N = n (one of ``n_values``) in all three figures; returns the seconds it took."""
        t0 = time.perf_counter()
        g = self._index(n)
        vals = self._sweep_terms[g]  # [4]
        with self.terms_fig.batch_update():
            bar = self.terms_fig.data[0]
            bar.y = vals
            bar.error_y.array = self._spread[g]
        with self.hist_fig.batch_update():
            self.hist_fig.data[0].x = self.draw_terms[:, g, 3]
            self.hist_fig.layout.title.text = f"Monte-Carlo draws of ΔQ_pos at N = {int(n):,}"
        with self.sweep_fig.batch_update():
            mark = self.sweep_fig.select_traces(selector={"name": "current N"})
            mark_neg = self.sweep_fig.select_traces(selector={"name": "current N p_neg"})
            for tr in mark:
                tr.x, tr.y = [int(n)] * 4, vals
            for tr in mark_neg:
                tr.x, tr.y = [int(n)], [float(self.sweep["p_neg"].iloc[g])]
        self.last_redraw_s = time.perf_counter() - t0
        self._update_status()
        return self.last_redraw_s

    def _redraw_all(self) -> None:
        """After a problem or reward change: replace the sweep curves, then the per-N parts."""
        with self.sweep_fig.batch_update():
            for k, label in plots.TERM_LABELS.items():
                for tr in self.sweep_fig.select_traces(selector={"name": label}):
                    tr.y = self.sweep[k].to_numpy()
            for tr in self.sweep_fig.select_traces(selector={"name": "P(ΔQ<0)"}):
                tr.y = self.sweep["p_neg"].to_numpy()
            for tr in self.sweep_fig.select_traces(selector={"name": "±2 s.e."}):
                tr.y = plots.p_neg_band(self.sweep)[1]
        self.redraw(self.n_slider.value)

    def _on_problem(self, change=None) -> None:
        if self._busy:  # a control set below fires this again
            return
        self._busy = True
        try:
            if change is not None and change["owner"] is self.vocab:  # keep the correct share |P| / V
                share = int(self.n_correct.value) / int(change["old"])
                self.n_correct.max = int(change["new"]) - 1
                self.n_correct.value = int(np.clip(round(share * int(change["new"])), 1, int(change["new"]) - 1))
            self._sync_controls()
            self.status.value = "<i>drawing Monte-Carlo samples…</i>"
            self._build_problem()
            self._price()
            self._redraw_all()
        finally:
            self._busy = False

    def _on_rewards(self, _change=None) -> None:
        self._price()
        self._redraw_all()

    def _sync_controls(self) -> None:
        """Grey out controls that do not apply to the chosen vocabulary shape."""
        shape = self.shape.value
        self.placement.disabled = self.exponent.disabled = shape != "zipf"
        self.vocab.disabled = self.n_correct.disabled = shape == CUSTOM
        self.n_correct.max = int(self.vocab.value) - 1

    def _update_status(self) -> None:
        s = self.problem.summary()
        self.status.value = (f"<b>{s['problem']}</b>: Q_pos = {s['q_pos']:.4f}, max p = {s['p_max']:.2e}, "
                             f"{self.trials} Monte-Carlo streams; last redraw {self.last_redraw_s * 1e3:.1f} ms")


def mass_balance_explorer(problem: Optional[theory.Problem] = None, *, logits=None, correct=None,
                          **kwargs) -> MassBalanceExplorer:
    """The mass-balance explorer (an ipywidgets VBox). Pass a :class:`~brorl_lab.theory.Problem`, or ``logits``
    [V] with a ``correct`` mask [V] to explore a user-given vocabulary; without either it starts on the paper's
    seeded vocabulary. Other keywords go to :class:`MassBalanceExplorer` (n_values, n, vocab, n_correct, trials,
    seed)."""
    if logits is not None or correct is not None:
        if problem is not None or logits is None or correct is None:
            raise ValueError("pass either problem, or both logits and correct (a boolean mask like logits)")
        problem = theory.logit_problem(logits, correct)
    return MassBalanceExplorer(problem, **kwargs)
