"""Runs notebooks/01b_theorem_on_the_model.ipynb headless under papermill at a tiny size."""

from pathlib import Path

import pytest
from helpers_notebooks import WIDGET, assert_notebook_pair_in_sync, execute_small

pytest.importorskip("papermill")

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
NOTEBOOK = NOTEBOOKS / "01b_theorem_on_the_model.ipynb"
SMALL = dict(models=["default"], n_values=[4, 16], seeds=2, prompts=3, held_out=1, trials=20, check_draws=400,
             check_prompts=3, explorer_trials=10, root="")


def test_notebook_pair_is_in_sync_with_outputs_cleared():
    assert_notebook_pair_in_sync("01b_theorem_on_the_model", SMALL)


def test_notebook_runs_headless(tmp_path, monkeypatch):
    run = execute_small(NOTEBOOK, tmp_path, {**SMALL, "root": str(tmp_path / "theorem")}, monkeypatch)
    assert WIDGET in run["kinds"]  # the explorer on a real prompt's first token
    assert any("measured vs predicted" in str(f["layout"].get("title", "")) for f in run["figures"])
    assert "largest |z|" in run["text"] and "[default] share of in-batch prompts with dQ<0" in run["text"]
    assert sorted(p.name for p in (tmp_path / "theorem" / "default_adamw").glob("n*_s*.csv")) == \
        ["n16_s0.csv", "n16_s1.csv", "n4_s0.csv", "n4_s1.csv"]
