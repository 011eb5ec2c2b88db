"""Runs notebooks/01c_allocation.ipynb headless under papermill with small parameters: the widget, the tables and
one real allocated rollout on the shipped model."""

from pathlib import Path

import pytest
from helpers_notebooks import PLOTLY, WIDGET, assert_notebook_pair_in_sync, executed_in_book, tiny_preset

pytest.importorskip("papermill")

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "01c_allocation.ipynb"
SMALL = tiny_preset(NOTEBOOK.stem)  # the tiny book's size (docs/book/presets.yml)


def test_notebook_pair_is_in_sync_with_outputs_cleared():
    assert_notebook_pair_in_sync("01c_allocation", SMALL)


def test_notebook_runs_headless_with_its_widget(tiny_book_out):
    """The run the tiny book shows (executed once per session: helpers_notebooks.executed_in_book)."""
    run = executed_in_book(tiny_book_out, NOTEBOOK.stem)
    assert WIDGET in run["kinds"]  # the allocation explorer
    assert run["kinds"].count(PLOTLY) >= 3  # s_N(p), N_p against p, the budget sweep
    sweep = next(f for f in run["figures"] if "per 1,000" in str(f["layout"].get("title", "")))
    assert {t["name"] for t in sweep["data"]} == {"two_stage", "until_signal", "uniform N = budget"}
    lines = [ln for ln in run["text"].splitlines() if ln.startswith("p=")]
    assert len(lines) == 3 and all(ln.split("= ")[1].split(",")[0] == ln.rsplit("= ", 1)[1] for ln in lines)
    assert "N per prompt: [" in run["text"] and "alloc/informative_per_sample" in run["text"]
