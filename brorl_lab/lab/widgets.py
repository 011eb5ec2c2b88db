"""ipywidgets for the notebooks.

Sections (each self-contained; later dashboards go below their own header):
    1. The mass-balance explorer (theory of BroRL Sec. 2): :func:`mass_balance_explorer`, and :class:`ProblemPicker`
       (one explorer over a choice of vocabularies, e.g. real prompts' first-token distributions).
    2. The live training dashboard: :class:`TrainingDashboard`, a Trainer callback with a Stop button.
    3. The run browser: :func:`run_browser`, overlay runs under a directory by metric and x axis.
    4. The allocation explorer: :func:`allocation_explorer`, where a per-prompt allocation spends a step's samples.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Optional

import ipywidgets as w
import numpy as np
import pandas as pd
import plotly.graph_objects as go

from brorl_lab.core.validation import is_finite_number
from brorl_lab.lab import plots, tracking
from brorl_lab.theory import balance as theory

# =================================================================================================================
# 1. The mass-balance explorer
# =================================================================================================================

EXPLORER_N_DESCRIPTION = "N"  # stable handles for browser tests
EXPLORER_N_VALUES = tuple(2**k for k in range(17))  # 1 .. 65,536 on a log2 grid
SHAPES = {"paper (seeded)": "paper_seeded", "paper (unseeded)": "paper_unseeded", "zipf": "zipf"}
CUSTOM = "custom logits"
# Teaching views: one click sets the vocabulary controls. On the paper's seeded vocabulary P(dQ<0) is 0 at every N
# (the unsampled bar only grows, then fades past N ~ 1/p); the confidently-wrong Zipf vocabulary (correct tokens in
# the tail) is where an update loses correct mass at small N and stops losing it as N grows.
VIEWS = {"paper, seeded": {"shape": "paper (seeded)"},
         "zipf, tail": {"shape": "zipf", "placement": "tail", "exponent": 1.0}}
# The three panels, named where they are drawn (the notebook's task sheet refers to these names).
PANELS = {"terms": "① Terms at this N",
          "histogram": "② ΔQ_pos of each Monte-Carlo draw",
          "sweep": "③ The N sweep"}
EXPLORER_TITLE = f"{PANELS['terms']}: {plots.TERMS_TITLE}"
PANEL_GUIDE = (
    f"<b>{PANELS['terms']}</b>: the expected value of each of Theorem 1's terms and their total on the "
    "N·ΔQ_pos/lr scale, error bars ±1 standard deviation over draws. "
    f"<b>{PANELS['histogram']}</b>: the total of every draw at this N; draws left of the red line lost correct mass. "
    f"<b>{PANELS['sweep']}</b>: left, the expected terms against N; right, P(ΔQ_pos &lt; 0), the share of draws "
    "that lose correct mass (±2 s.e.); the open circles mark the N of the slider.")


class MassBalanceExplorer(w.VBox):
    """Sliders for N, the vocabulary and the rewards; three live plotly figures of Theorem 1's terms.

    What does not depend on N is computed when the problem changes: ``trials`` nested Monte-Carlo streams of
    max(N) draws (:func:`brorl_lab.theory.draw_sums`, ~1 s at V=128,000) and, when the rewards change, the N-sweep
    table. Moving the N slider only calls :meth:`redraw`, which indexes those arrays and updates traces in place.
    """

    def __init__(self, problem: Optional[theory.Problem] = None, *, n_values: Sequence[int] = EXPLORER_N_VALUES,
                 n: int = 512, vocab: int = 128_000, n_correct: int = 10_000, trials: int = 300, seed: int = 0,
                 view: Optional[str] = None):
        if view is not None and view not in VIEWS:
            raise ValueError(f"view: got {view!r}; allowed: one of {list(VIEWS)} or None")
        if view is not None and problem is not None:
            raise ValueError("view: a teaching view sets the vocabulary; pass either problem or view, not both")
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
        if view is not None:
            self._set_view_controls(view)
        self.views = w.ToggleButtons(options=list(VIEWS), value=view, description="teaching view", style=style,
                                     tooltips=["P(ΔQ<0) = 0 at every N; the unsampled bar grows, then fades",
                                               "confidently wrong: updates lose correct mass at small N"])
        self.guide = w.HTML(f"<div style='max-width:1000px;font-size:90%'>{PANEL_GUIDE}</div>")
        self.status = w.HTML()
        self.last_redraw_s = float("nan")
        self._busy = False

        self._build_problem()
        self._price()
        g = self._index(n)
        self.terms_fig = go.FigureWidget(plots.terms_bar_figure(self._bar_values(g), spread=self._bar_spread(g),
                                                                title=EXPLORER_TITLE))
        sweep_title = f"{PANELS['sweep']}: expected terms and P(ΔQ_pos < 0) across N"
        self.sweep_fig = go.FigureWidget(plots.n_sweep_figure(self.sweep, current_n=int(n), title=sweep_title))
        self.hist_fig = go.FigureWidget(plots.dq_histogram_figure(self.draw_terms[:, g, 3]))
        self.hist_fig.layout.title.text = self._hist_title(n)
        self._update_status()

        self.n_slider.observe(lambda ch: self.redraw(ch["new"]), names="value")
        for c in (self.shape, self.vocab, self.n_correct, self.placement, self.exponent):
            c.observe(self._on_problem, names="value")
        for c in (self.r_c, self.r_w):
            c.observe(self._on_rewards, names="value")
        self.views.observe(lambda ch: ch["new"] is not None and self.apply_view(ch["new"]), names="value")
        self._sync_controls()
        controls = w.HBox([w.VBox([self.n_slider, self.shape, self.vocab, self.n_correct]),
                           w.VBox([self.placement, self.exponent, self.r_c, self.r_w])])
        super().__init__([self.views, controls, self.status, self.guide, w.HBox([self.terms_fig, self.hist_fig]),
                          self.sweep_fig])

    # ---- teaching views ---------------------------------------------------------------------------------------------
    def _set_view_controls(self, view: str) -> None:
        for name, value in VIEWS[view].items():
            getattr(self, name).value = value

    def apply_view(self, view: str) -> None:
        """Set the vocabulary controls to a teaching view (one of :data:`VIEWS`) and recompute once."""
        if view not in VIEWS:
            raise ValueError(f"view: got {view!r}; allowed: one of {list(VIEWS)}")
        self._busy = True  # the controls' observers would recompute once per control
        try:
            self._set_view_controls(view)
        finally:
            self._busy = False
        if self.views.value != view:
            self.views.value = view  # its observer calls apply_view again, which lands here with nothing to do
            return
        self._on_problem()

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
            self.hist_fig.layout.title.text = self._hist_title(n)
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

    def _hist_title(self, n: int) -> str:
        return f"{PANELS['histogram']}: Monte-Carlo draws of ΔQ_pos at N = {int(n):,}"

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
            view = VIEWS.get(self.views.value, {})
            if any(getattr(self, k).value != v for k, v in view.items()):
                self.views.value = None  # the controls left the teaching view: no button stays lit
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


class ProblemPicker(w.VBox):
    """Pick one of several named vocabularies (e.g. a real prompt's first-token distribution, one per prompt) and
    explore it: a dropdown, a line of HTML about the pick, and a :class:`MassBalanceExplorer` rebuilt on each pick.

    ``problems`` maps a label to ``(problem, note_html)``; other keywords go to the explorer (n, n_values, trials,
    seed). ``pick(label)`` does what choosing it in the dropdown does (for scripts and tests)."""

    def __init__(self, problems, **explorer_kwargs):
        if not problems:
            raise ValueError("problems: got none; allowed: a mapping label -> (Problem, note html)")
        self.problems, self.kwargs = dict(problems), explorer_kwargs
        self.picker = w.Dropdown(options=list(self.problems), description="prompt",
                                 layout=w.Layout(width="720px"), style={"description_width": "60px"})
        self.note = w.HTML()
        self.explorer: Optional[MassBalanceExplorer] = None
        self.holder = w.VBox()
        self.picker.observe(lambda ch: self.pick(ch["new"]), names="value")
        super().__init__([self.picker, self.note, self.holder])
        self.pick(self.picker.value)

    def pick(self, label: str) -> MassBalanceExplorer:
        if label not in self.problems:
            raise ValueError(f"label: got {label!r}; allowed: {', '.join(self.problems)}")
        problem, note = self.problems[label]
        if self.picker.value != label:
            self.picker.value = label  # observe calls pick again; that call builds the explorer
            return self.explorer
        self.note.value = note
        self.explorer = MassBalanceExplorer(problem, vocab=max(problem.vocab, 2), n_correct=1, **self.kwargs)
        self.holder.children = [self.explorer]
        return self.explorer


# =================================================================================================================
# 2. The live training dashboard
# =================================================================================================================

DASHBOARD_STOP_LABEL = "Stop after this step"  # stable handles for tests


class TrainingDashboard(w.VBox):
    """Live plotly curves of a training run, and a Stop button. Pass it as a Trainer callback::

        dash = TrainingDashboard(metrics=("reward_mean", "ds_pass_rate", "entropy", "kl", "eval/mean/pass@1"))
        trainer = Trainer(cfg, callbacks=[dash])
        display(dash)
        job = dash.start(trainer)      # trains in a background thread: the kernel stays free for the Stop button
        metrics = job.result()         # waits; a kernel interrupt (■) while waiting also stops after this step

    ``trainer.run()`` works as well (the curves update live), but a busy kernel handles the button's click only
    after the run: stop such a run with the kernel interrupt, which the Trainer also treats as "stop after this
    step". Either way the run stays resumable (``Trainer.resume(run_dir)``).

    Each call appends one point per metric to its figure inside ``batch_update`` (one message per figure; steps
    faster than ``min_interval_s`` are coalesced into one redraw, so the browser keeps up and a click on Stop is
    handled promptly); metrics missing from a row (eval metrics between evaluations, training metrics in the
    step-0 eval row) are skipped, and rows with ``reset`` True add a marker to the figure's "resets" trace, its
    hover text the reason logged in the run's events.jsonl. A new trainer clears the figures and replays its rows
    in one redraw (a resumed run shows its history).
    """

    def __init__(self, metrics: Sequence[str] = plots.DASHBOARD_METRICS, *, x: str = "step", columns: int = 3,
                 width: int = 420, height: int = 240, min_interval_s: float = 0.5):
        metrics = tuple(metrics)
        if not metrics or not all(isinstance(m, str) and m for m in metrics):
            raise ValueError(f"metrics: got {metrics!r}; allowed: a non-empty sequence of metric column names")
        if x not in plots.X_AXES:
            raise ValueError(f"x: got {x!r}; allowed: one of {list(plots.X_AXES)}")
        if not (isinstance(min_interval_s, (int, float)) and 0 <= min_interval_s < float("inf")):
            raise ValueError(f"min_interval_s: got {min_interval_s!r}; allowed: seconds >= 0")
        self.metrics, self.x, self.min_interval_s = metrics, x, float(min_interval_s)
        self.trainer = None
        self.rows: list[dict] = []
        self._pending: list[dict] = []
        self._lock = threading.RLock()  # rows arrive from the training thread, flushes also from a timer
        self._timer: Optional[threading.Timer] = None
        self._last_flush = float("-inf")
        self.stop_requested = False
        self.figures = {m: go.FigureWidget(plots.metric_figure(m, x=x, height=height).update_layout(width=width))
                        for m in metrics}
        self.stop_button = w.Button(description=DASHBOARD_STOP_LABEL, icon="stop", button_style="warning",
                                    disabled=True, tooltip="finish the current step, checkpoint, stop (resumable)",
                                    layout=w.Layout(width="190px", min_width="190px"))
        self.stop_button.on_click(self._on_stop)
        self.status = w.HTML("<i>waiting for the first step…</i>")
        grid = w.GridBox(list(self.figures.values()),
                         layout=w.Layout(grid_template_columns=f"repeat({max(1, int(columns))}, {int(width)}px)"))
        super().__init__([w.HBox([self.stop_button, self.status]), grid])

    # ---- the callback -------------------------------------------------------------------------------------------
    def __call__(self, trainer, row: dict) -> None:
        if trainer is not self.trainer:
            self.attach(trainer)
            with self._lock:  # the whole history in one redraw
                self.rows = list(trainer.rows)  # includes ``row``: the callback runs after the row is stored
                if not self.rows or self.rows[-1] is not row:
                    self.rows.append(row)
                self._pending = list(self.rows)
                self.flush()
        else:
            self.update(row)

    def attach(self, trainer) -> None:
        """Bind the Stop button to ``trainer`` and start from empty figures."""
        self.trainer, self.stop_requested = trainer, False
        self.clear()
        self.stop_button.disabled = False
        self.stop_button.description = DASHBOARD_STOP_LABEL

    def clear(self) -> None:
        with self._lock:
            self.rows, self._pending = [], []
            for fig in self.figures.values():
                with fig.batch_update():
                    for tr in fig.data:
                        tr.x, tr.y, tr.hovertext = (), (), ()

    def update(self, row: dict) -> int:
        """Append ``row``. It is drawn at once when the last redraw is ``min_interval_s`` old, else within
        ``min_interval_s`` (a timer flushes what is pending), so fast steps coalesce into one message per figure.
        Returns the number of points drawn now (0 while buffered)."""
        with self._lock:
            self.rows.append(row)
            self._pending.append(row)
            if time.monotonic() - self._last_flush >= self.min_interval_s:
                return self.flush()
            if self._timer is None:
                self._timer = threading.Timer(self.min_interval_s, self.flush)
                self._timer.daemon = True
                self._timer.start()
            return 0

    def flush(self) -> int:
        """Draw every pending row now: one batch_update per figure. Returns the number of points drawn."""
        with self._lock:
            rows, self._pending = self._pending, []
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            self._last_flush = time.monotonic()
            rows = [r for r in rows if _finite(r.get(self.x))]
            if not rows:
                return 0
            reasons = {r.get("step"): self._reset_reason(r.get("step")) for r in rows if r.get("reset")}
            drawn = 0
            for m, fig in self.figures.items():
                line, marks = fig.data
                lx, ly = list(line.x if _len(line.x) else ()), list(line.y if _len(line.y) else ())
                mx, my = list(marks.x if _len(marks.x) else ()), list(marks.y if _len(marks.y) else ())
                mt = list(marks.hovertext if _len(marks.hovertext) else ())
                for r in rows:
                    xv, v = r[self.x], r.get(m)
                    if _finite(v):
                        lx.append(xv)
                        ly.append(float(v))
                        drawn += 1
                    if r.get("reset"):
                        mx.append(xv)
                        my.append(float(v) if _finite(v) else (ly[-1] if ly else 0.0))
                        mt.append(f"reset at {self.x} {xv}: {reasons[r.get('step')]}")
                with fig.batch_update():
                    line.x, line.y = lx, ly
                    if len(mx) != _len(marks.x):
                        marks.x, marks.y, marks.hovertext = mx, my, mt
                        marks.hovertemplate = "%{hovertext}<extra></extra>"
            self.status.value = self._status_text(rows[-1])
            return drawn

    def _reset_reason(self, step) -> str:
        run_dir = getattr(self.trainer, "run_dir", None)
        events = run_dir.read_events() if run_dir is not None else []
        hits = [e for e in events if e.get("event") == "reset" and e.get("step") == step]
        return str(hits[-1].get("reason", "reset")) if hits else "reset"

    def _status_text(self, row: dict) -> str:
        bits = [f"<b>step {row.get('step')}</b>"]
        total = getattr(getattr(self.trainer, "cfg", None), "steps", None)
        if total:
            bits[0] += f" / {total}"
        run_dir = getattr(self.trainer, "run_dir", None)
        if run_dir is not None:
            bits.insert(0, run_dir.path.name)
        for key, fmt in (("reward_mean", "reward {:.3f}"), ("eval/mean/pass@1", "eval pass@1 {:.3f}"),
                         ("kl", "KL {:.2e}"), ("cum_wall_s", "{:.0f} s")):
            if _finite(row.get(key)):
                bits.append(fmt.format(row[key]))
        if self.stop_requested:
            bits.append("<i>stopping after this step…</i>")
        return " · ".join(bits)

    # ---- stopping and background runs ------------------------------------------------------------------------------
    def _on_stop(self, _button=None) -> None:
        if self.trainer is None:
            return
        self.trainer.stop()
        self.stop_requested = True
        self.stop_button.disabled = True
        self.stop_button.description = "stopping…"
        self.status.value += " · <i>stopping after this step…</i>"

    def start(self, trainer, steps: Optional[int] = None) -> "TrainingJob":
        """Add this dashboard to ``trainer``'s callbacks (once) and run ``trainer.run(steps)`` in a background
        thread; returns the :class:`TrainingJob`."""
        if self not in trainer.callbacks:
            trainer.callbacks.append(self)
        self.attach(trainer)

        def run():
            try:
                return trainer.run(steps)
            finally:
                self.flush()
                self._finished(trainer)

        return TrainingJob(run, on_interrupt=trainer.stop, name=f"train {trainer.run_dir.path.name}")

    def _finished(self, trainer) -> None:
        """After a background run: say how it ended; the button has nothing left to stop."""
        state = trainer.run_dir.read_status()
        how = {"finished": "finished", "interrupted": "stopped (resumable: Trainer.resume(run_dir))"}
        self.stop_button.disabled = True
        self.stop_button.description = DASHBOARD_STOP_LABEL
        self.status.value = (f"<b>{trainer.run_dir.path.name}</b>: {how.get(state.get('status'), 'ended')} "
                             f"at step {trainer.step_idx}")


def _len(seq) -> int:
    return 0 if seq is None or isinstance(seq, str) else len(seq)


def _finite(v) -> bool:
    return is_finite_number(v)


class TrainingJob:
    """``fn()`` in a daemon thread. :meth:`result` waits for it and returns its value (or raises its exception).
    A KeyboardInterrupt (kernel interrupt) while waiting calls ``on_interrupt`` (e.g. ``trainer.stop``) and keeps
    waiting for a clean stop; a second one stops waiting."""

    def __init__(self, fn, *, on_interrupt=None, name: str = "training"):
        self.on_interrupt = on_interrupt
        self._value, self._error = None, None
        # An Event, not Thread.join: a join interrupted by KeyboardInterrupt can leave the thread marked as stopped
        # while it still runs (CPython gh-90882).
        self._finished = threading.Event()
        self._thread = threading.Thread(target=self._target, args=(fn,), name=name, daemon=True)
        self._thread.start()

    def _target(self, fn) -> None:
        try:
            self._value = fn()
        except BaseException as e:  # noqa: BLE001 - handed to whoever calls result()
            self._error = e
        finally:
            self._finished.set()

    @property
    def done(self) -> bool:
        return self._finished.is_set()

    def result(self, timeout: Optional[float] = None):
        try:
            self._finished.wait(timeout)
        except KeyboardInterrupt:
            if self.on_interrupt is None:
                raise
            self.on_interrupt()
            self._finished.wait(timeout)  # a second interrupt propagates
        if not self._finished.is_set():
            raise TimeoutError(f"{self._thread.name} still running after {timeout} s")
        if self._error is not None:
            raise self._error
        return self._value


# =================================================================================================================
# 3. The run browser
# =================================================================================================================

BROWSER_DEFAULT_METRICS = ("eval/mean/pass@1", "reward_mean")


class RunBrowser(w.VBox):
    """Pick runs under ``root`` (from :func:`brorl_lab.lab.tracking.run_index`), a metric and an x axis (step, samples
    generated, training time), and overlay their curves (:func:`brorl_lab.lab.plots.run_curves_figure`). "Refresh"
    re-reads the directory (runs still training grow)."""

    def __init__(self, root: str | Path = "runs", *, metric: Optional[str] = None, x: str = "step",
                 runs: Optional[Sequence[str]] = None, max_initial: int = 6, height: int = 420):
        if x not in plots.X_AXES:
            raise ValueError(f"x: got {x!r}; allowed: one of {list(plots.X_AXES)}")
        self.root, self.height = Path(root), height
        self.run_select = w.SelectMultiple(description="runs", rows=8, layout=w.Layout(width="420px"))
        self.metric = w.Dropdown(description="metric", layout=w.Layout(width="360px"))
        self.x_axis = w.ToggleButtons(options=[(label, key) for key, label in plots.X_AXES.items()], value=x,
                                      description="x axis")
        self.refresh_button = w.Button(description="Refresh", icon="refresh")
        self.message = w.HTML()
        self.table = w.HTML()
        self.figure = go.FigureWidget(plots.empty_figure("loading…", height=height))
        self.index, self.data = pd.DataFrame(), pd.DataFrame()
        self.refresh(metric=metric, runs=runs, max_initial=max_initial)
        for c in (self.run_select, self.metric, self.x_axis):
            c.observe(lambda _ch: self.redraw(), names="value")
        self.refresh_button.on_click(lambda _b: self.refresh())
        controls = w.HBox([self.run_select, w.VBox([self.metric, self.x_axis, self.refresh_button, self.message])])
        super().__init__([controls, self.figure, self.table])

    @property
    def selected(self) -> tuple:
        return tuple(self.run_select.value)

    def refresh(self, *, metric: Optional[str] = None, runs: Optional[Sequence[str]] = None,
                max_initial: int = 6) -> pd.DataFrame:
        """Re-read the run index and metrics under ``root``; keeps the selection where the runs still exist.
        Returns the index."""
        self.index, self.data = tracking.run_index(self.root), tracking.load_runs(self.root)
        names = list(self.index["run"]) if not self.index.empty else []
        keep = [r for r in (runs if runs is not None else self.selected) if r in names] or names[:max_initial]
        metrics = plots.metric_columns(self.data) if not self.data.empty else []
        current = metric or self.metric.value
        default = next((m for m in (current, *BROWSER_DEFAULT_METRICS) if m in metrics),
                       metrics[0] if metrics else None)
        with self._muted_redraw():
            self.run_select.options = names
            self.run_select.value = tuple(keep)
            self.metric.options = metrics
            self.metric.value = default
        if self.index.empty:
            self.message.value = f"<b>No runs under {self.root}</b>: train one (Trainer, notebooks 02-04) first."
        else:
            self.message.value = f"{len(names)} run(s) under <code>{self.root}</code>"
        self.table.value = _index_html(self.index)
        self.redraw()
        return self.index

    def redraw(self) -> go.FigureWidget:
        """Rebuild the overlay for the current selection; returns the FigureWidget."""
        if self._muted:
            return self.figure
        if self.data.empty or self.metric.value is None:
            fig = plots.empty_figure(f"no runs with metrics under {self.root}", height=self.height)
        else:
            fig = plots.run_curves_figure(self.data, self.metric.value, x=self.x_axis.value, runs=self.selected,
                                          height=self.height)
        replace_figure(self.figure, fig)
        return self.figure

    _muted = False

    @contextmanager
    def _muted_redraw(self):
        """Set several controls without one redraw per change."""
        self._muted = True
        try:
            yield
        finally:
            self._muted = False


def replace_figure(widget: go.FigureWidget, fig: go.Figure) -> None:
    """Make ``widget`` show ``fig``: its traces and layout (old traces, annotations and shapes go), in one update.

    The synced ``_widget_data`` / ``_widget_layout`` are set to the new figure too, as plotly does when a
    FigureWidget is displayed by itself: inside a container they would keep the figure it was built with, and a
    notebook's saved widget state (the book's still picture of a widget, docs/book/build_book.py) would hold that
    (plotly.js's widget model ignores their changes: the live view is drawn by the add-traces message)."""
    from copy import deepcopy

    with widget.batch_update():
        widget.data = ()
        widget.layout.annotations, widget.layout.shapes = (), ()
        widget.add_traces(list(fig.data))
        widget.update_layout(fig.layout.to_plotly_json())
    widget._widget_data, widget._widget_layout = deepcopy(widget._data), deepcopy(widget._layout_obj._props)


def _index_html(index: pd.DataFrame) -> str:
    if index.empty:
        return ""
    cols = [c for c in ("run", "status", "steps_done", "final.eval/mean/pass@1", "final.reward_mean",
                        "final.cum_samples", "final.cum_wall_s") if c in index]
    return index[cols].to_html(index=False, float_format=lambda v: f"{v:.3g}", border=0)


def run_browser(root: str | Path = "runs", **kwargs) -> RunBrowser:
    """The run browser (an ipywidgets VBox) over the runs under ``root``; keywords go to :class:`RunBrowser`
    (metric, x, runs, max_initial, height)."""
    return RunBrowser(root, **kwargs)


# =================================================================================================================
# 4. The allocation explorer (issue 44): a population of prompts' p, a budget, each strategy's N_p
# =================================================================================================================

ALLOCATION_BUDGETS = (4, 8, 16, 32, 64, 128, 256, 512)  # samples per prompt, the step's budget / P


def allocation_figure(p: np.ndarray, sizes: dict) -> go.Figure:
    """N_p against p for each strategy (log y): where each one spends a step's samples."""
    fig = go.Figure()
    for name, n in sizes.items():
        fig.add_trace(go.Scatter(x=p, y=n, mode="markers" if name in ("two_stage", "until_signal") else "lines",
                                 name=name))
    fig.update_layout(title="Samples per prompt N_p against the prompt's success rate p", height=380,
                      xaxis_title="p (the prompt's success rate)", yaxis_title="N_p (mean over repeats)",
                      yaxis_type="log", margin=dict(t=50, b=40, l=60, r=20))
    return fig


class AllocationExplorer(w.VBox):
    """Pick a population of success rates p over prompts (Beta(a, b), or a mixture with solved and unsolved shares)
    and a budget of samples per prompt; see where ``two_stage`` and ``until_signal`` put the samples, and each
    strategy's expected informative groups and Theorem 1 gain per generated sample beside uniform N=16 and N=512
    (:func:`brorl_lab.rl.allocation.compare`; Monte-Carlo means over ``reps`` repeats, the uniform arms exact)."""

    def __init__(self, *, prompts: int = 64, reps: int = 10, seed: int = 0, kind: str = "mixture", a: float = 0.3,
                 b: float = 3.0, solved: float = 0.3, unsolved: float = 0.2, budget: int = 16, probe: int = 4,
                 cap: int = 512):
        from brorl_lab.theory import allocation as A

        self.prompts, self.reps, self.seed = prompts, reps, seed
        style = {"description_width": "initial"}
        self.kind = w.Dropdown(options=list(A.P_POPULATIONS), value=kind, description="population")
        self.a = w.FloatLogSlider(value=a, base=10, min=-1.5, max=1, step=0.05, description="a", style=style)
        self.b = w.FloatLogSlider(value=b, base=10, min=-1.5, max=1, step=0.05, description="b", style=style)
        self.solved = w.FloatSlider(value=solved, min=0, max=1, step=0.05, description="solved share")
        self.unsolved = w.FloatSlider(value=unsolved, min=0, max=1, step=0.05, description="unsolved share")
        self.budget = w.SelectionSlider(options=ALLOCATION_BUDGETS, value=budget, description="budget / prompt")
        self.probe = w.IntSlider(value=probe, min=1, max=16, description="probe n0")
        self.cap = w.SelectionSlider(options=ALLOCATION_BUDGETS[1:] + (1024,), value=cap, description="cap")
        self.figure = go.FigureWidget()
        self.table = w.HTML()
        for c in (self.kind, self.a, self.b, self.solved, self.unsolved, self.budget, self.probe, self.cap):
            c.observe(lambda _: self.redraw(), names="value")
        super().__init__([w.HBox([self.kind, self.a, self.b]), w.HBox([self.solved, self.unsolved]),
                          w.HBox([self.budget, self.probe, self.cap]), self.figure, self.table])
        self.redraw()

    def population(self) -> np.ndarray:
        from brorl_lab.theory import allocation as A

        solved = min(self.solved.value, 1.0)
        return A.p_population(self.kind.value, self.prompts, a=self.a.value, b=self.b.value, solved=solved,
                              unsolved=min(self.unsolved.value, 1.0 - solved), seed=self.seed)

    def redraw(self) -> None:
        from brorl_lab.rl.allocation import compare

        p = self.population()
        probe = min(self.probe.value, self.budget.value)
        cap = max(self.cap.value, self.budget.value)
        self.result, sizes = compare(p, self.budget.value, reps=self.reps, seed=self.seed, probe=probe, cap=cap)
        replace_figure(self.figure, allocation_figure(p, sizes))
        self.table.value = self.result.to_html(float_format=lambda v: f"{v:.4g}", border=0)


def allocation_explorer(**kwargs) -> AllocationExplorer:
    """The allocation explorer (an ipywidgets VBox); keywords go to :class:`AllocationExplorer`."""
    return AllocationExplorer(**kwargs)
