"""Runs notebooks/01_mass_balance_theory.ipynb headless under papermill with small parameters."""

from pathlib import Path

import nbformat
import pytest

from helpers_notebooks import assert_notebook_pair_in_sync

papermill = pytest.importorskip("papermill")

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
NOTEBOOK = NOTEBOOKS / "01_mass_balance_theory.ipynb"
SMALL = dict(vocab=3000, n_correct=250, steps=30, n_values=[4, 512], trials=200, explorer_trials=30,
             budget_draws=1024, budget_n_values=[4, 64, 1024], seed=1)
PLOTLY = "application/vnd.plotly.v1+json"
WIDGET = "application/vnd.jupyter.widget-view+json"


def test_notebook_pair_is_in_sync_with_outputs_cleared():
    assert_notebook_pair_in_sync("01_mass_balance_theory", SMALL)


def test_notebook_runs_headless_with_plotly_figures(tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the kernel is a child process; keep it to one core
    out = tmp_path / "01_out.ipynb"
    papermill.execute_notebook(str(NOTEBOOK), str(out), parameters=SMALL, kernel_name="python3", cwd=str(tmp_path),
                               progress_bar=False)
    nb = nbformat.read(out, as_version=4)
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    kinds = [k for o in outputs if o.output_type in ("display_data", "execute_result") for k in o.data]
    assert kinds.count(PLOTLY) >= 7  # first-order check, Lemma 2, two sweeps, Fig. 3 (with and without decay), budget
    assert WIDGET in kinds  # the explorer
    text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    assert text.count(": correct") == 3  # the three exercise checks ran and passed
    figures = [o.data[PLOTLY] for o in outputs if o.output_type in ("display_data", "execute_result")
               and PLOTLY in o.data]
    fig3 = next(f for f in figures if "Fig. 3" in str(f["layout"].get("title", "")))
    assert {t["name"] for t in fig3["data"]} == {"N=4", "N=512", "decay only (no gradient)"}
    no_decay = next(f for f in figures if "without weight decay" in str(f["layout"].get("title", "")))
    assert {t["name"] for t in no_decay["data"]} == {"N=4", "N=512"}
    assert "decay only (no gradient): Q_pos" in text
