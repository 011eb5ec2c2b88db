"""Runs notebooks/01_mass_balance_theory.ipynb headless under papermill with small parameters."""

from pathlib import Path

import pytest
from helpers_notebooks import PLOTLY, WIDGET, assert_notebook_pair_in_sync, execute_small

pytest.importorskip("papermill")

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
NOTEBOOK = NOTEBOOKS / "01_mass_balance_theory.ipynb"
SMALL = dict(vocab=3000, n_correct=250, steps=30, n_values=[4, 512], trials=200, explorer_trials=30,
             budget_draws=1024, budget_n_values=[4, 64, 1024], seed=1)


def test_notebook_pair_is_in_sync_with_outputs_cleared():
    assert_notebook_pair_in_sync("01_mass_balance_theory", SMALL)


def test_notebook_runs_headless_with_plotly_figures(tmp_path, monkeypatch):
    run = execute_small(NOTEBOOK, tmp_path, SMALL, monkeypatch)
    kinds, text, figures = run["kinds"], run["text"], run["figures"]
    assert kinds.count(PLOTLY) >= 7  # first-order check, Lemma 2, two sweeps, Fig. 3 (with and without decay), budget
    assert WIDGET in kinds  # the explorer
    assert text.count(": correct") == 3  # the three exercise checks ran and passed
    fig3 = next(f for f in figures if "Fig. 3" in str(f["layout"].get("title", "")))
    assert {t["name"] for t in fig3["data"]} == {"N=4", "N=512", "decay only (no gradient)"}
    no_decay = next(f for f in figures if "without weight decay" in str(f["layout"].get("title", "")))
    assert {t["name"] for t in no_decay["data"]} == {"N=4", "N=512"}
    assert "decay only (no gradient): Q_pos" in text
