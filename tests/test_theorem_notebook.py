"""Runs notebooks/01b_theorem_on_the_model.ipynb headless under papermill with its quick preset."""

import re
from pathlib import Path

import pytest
from helpers_notebooks import WIDGET, assert_notebook_pair_in_sync, executed_in_book, tiny_preset

pytest.importorskip("papermill")

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
NOTEBOOK = NOTEBOOKS / "01b_theorem_on_the_model.ipynb"
SMALL = tiny_preset(NOTEBOOK.stem)  # its quick preset (the default model, N = 4 and 16, 3 seeds), as the book


def test_notebook_pair_is_in_sync_with_outputs_cleared():
    assert_notebook_pair_in_sync("01b_theorem_on_the_model", SMALL)


def test_notebook_runs_headless(tiny_book_out):
    """The run the tiny book shows (executed once per session: helpers_notebooks.executed_in_book)."""
    run = executed_in_book(tiny_book_out, NOTEBOOK.stem)
    assert WIDGET in run["kinds"]  # the explorer on a real prompt's first token
    assert any("measured vs predicted" in str(f["layout"].get("title", "")) for f in run["figures"])
    text = run["text"]
    assert "largest |z|" in text and "[default] N=4:" in text and "share losing mass: kept" in text
    assert "RuntimeWarning" not in text and not re.search(r"\bnan\b", text.lower())
    for share in re.findall(r"(\d\.\d\d) \[(-?\d\.\d\d), (-?\d\.\d\d)\] of", text):  # every interval in [0, 1]
        lo, mid, hi = float(share[1]), float(share[0]), float(share[2])
        assert 0 <= lo <= mid <= hi <= 1, share
    summary = [o for o in run["outputs"] if o.output_type == "display_data" and "text/markdown" in o.get("data", {})]
    assert "Exact $Q_{pos}$ by teacher forcing matches" in summary[-1].data["text/markdown"]
    assert sorted(p.name for p in (run["work"] / SMALL["root"] / "default_adamw").glob("n*_s*.csv")) == \
        ["n16_s0.csv", "n16_s1.csv", "n16_s2.csv", "n4_s0.csv", "n4_s1.csv", "n4_s2.csv"]
