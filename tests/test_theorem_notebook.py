"""Runs notebooks/01b_theorem_on_the_model.ipynb headless under papermill at a tiny size."""

from pathlib import Path

import nbformat
import pytest

from helpers_notebooks import assert_notebook_pair_in_sync

papermill = pytest.importorskip("papermill")

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
NOTEBOOK = NOTEBOOKS / "01b_theorem_on_the_model.ipynb"
SMALL = dict(models=["default"], n_values=[4, 16], seeds=2, prompts=3, held_out=1, trials=20, check_draws=400,
             check_prompts=3, explorer_trials=10, root="")
PLOTLY = "application/vnd.plotly.v1+json"
WIDGET = "application/vnd.jupyter.widget-view+json"


def test_notebook_pair_is_in_sync_with_outputs_cleared():
    assert_notebook_pair_in_sync("01b_theorem_on_the_model", SMALL)


def test_notebook_runs_headless(tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the kernel is a child process; keep it to one core
    out = tmp_path / "01b_out.ipynb"
    papermill.execute_notebook(str(NOTEBOOK), str(out), parameters={**SMALL, "root": str(tmp_path / "theorem")},
                               kernel_name="python3", cwd=str(tmp_path), progress_bar=False)
    nb = nbformat.read(out, as_version=4)
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    kinds = [k for o in outputs if o.output_type in ("display_data", "execute_result") for k in o.data]
    assert WIDGET in kinds  # the explorer on a real prompt's first token
    figures = [o.data[PLOTLY] for o in outputs if o.output_type in ("display_data", "execute_result")
               and PLOTLY in o.data]
    assert any("measured vs predicted" in str(f["layout"].get("title", "")) for f in figures)
    text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    assert "largest |z|" in text and "[default] share of in-batch prompts with dQ<0" in text
    assert sorted(p.name for p in (tmp_path / "theorem" / "default_adamw").glob("n*_s*.csv")) == \
        ["n16_s0.csv", "n16_s1.csv", "n4_s0.csv", "n4_s1.csv"]
