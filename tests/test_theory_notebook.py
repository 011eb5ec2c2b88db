"""Runs notebooks/01_mass_balance_theory.ipynb headless under papermill with small parameters: with the exercises'
reference solutions filled in (notebooks/solutions/), every check passes; with a stub left in, its check fails."""

from pathlib import Path

import pytest
from helpers_notebooks import (
    PLOTLY,
    WIDGET,
    assert_notebook_pair_in_sync,
    execute_small,
    executed_in_book,
    exercise_names,
    tiny_preset,
)

pytest.importorskip("papermill")

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
NOTEBOOK = NOTEBOOKS / "01_mass_balance_theory.ipynb"
SMALL = tiny_preset(NOTEBOOK.stem)  # the tiny book's size (docs/book/presets.yml), solutions filled in
EXERCISES = ["logit_update", "three_terms", "losing_vocabulary", "p_drawn_at_least_once", "large_n_limit_by_hand",
             "losing_update"]


def test_notebook_pair_is_in_sync_with_outputs_cleared():
    assert_notebook_pair_in_sync("01_mass_balance_theory", SMALL)
    assert exercise_names(NOTEBOOK) == EXERCISES


def test_notebook_runs_headless_with_plotly_figures(tiny_book_out):
    """The run the tiny book shows (executed once per session: helpers_notebooks.executed_in_book)."""
    run = executed_in_book(tiny_book_out, NOTEBOOK.stem)
    kinds, text, figures = run["kinds"], run["text"], run["figures"]
    assert kinds.count(PLOTLY) >= 7  # first-order check, Lemma 2, two sweeps, Fig. 3 (with and without decay), budget
    assert WIDGET in kinds  # the explorer
    assert text.count(": correct") == len(EXERCISES)  # every exercise's check ran and passed
    fig3 = next(f for f in figures if "Fig. 3" in str(f["layout"].get("title", "")))
    assert {t["name"] for t in fig3["data"]} == {"N=4", "N=512", "decay only (no gradient)"}
    no_decay = next(f for f in figures if "without weight decay" in str(f["layout"].get("title", "")))
    assert {t["name"] for t in no_decay["data"]} == {"N=4", "N=512"}
    assert "decay only (no gradient): Q_pos" in text
    assert "best N at this budget (weight_decay=0):" in text
    assert "expected share of correct tokens undrawn at N = 512:" in text
    assert "expected unsampled term (N dQ/lr): N=1" in text


@pytest.mark.parametrize("stub", ["logit_update", "three_terms"])
def test_a_stub_fails_its_check(tmp_path, monkeypatch, stub):
    """Every solution but one filled in: the notebook stops at that exercise's check, with its "not yet" message."""
    import papermill

    solved = [e for e in EXERCISES if e != stub]
    with pytest.raises(papermill.PapermillExecutionError) as err:
        execute_small(NOTEBOOK, tmp_path, {**SMALL, "use_solutions": solved}, monkeypatch)
    assert err.value.ename == "AssertionError" and "not yet" in err.value.evalue
    assert err.value.cell_index == exercise_check_index(NOTEBOOK, stub)


def exercise_check_index(notebook: Path, name: str) -> int:
    """The index (in the executed notebook, one injected-parameters cell after the parameters cell) of the check
    cell after exercise ``name``."""
    import nbformat

    cells = nbformat.read(notebook, as_version=4).cells
    at = next(i for i, c in enumerate(cells) if "exercise" in c.metadata.get("tags", [])
              and f"def {name}(" in c.source)
    check = next(i for i in range(at + 1, len(cells)) if "check" in cells[i].metadata.get("tags", []))
    return check + 1
