"""The notebooks' exercise mechanism (brorl_lab.lab.course) and the explorer's teaching views."""

from pathlib import Path

import numpy as np
import pytest

from brorl_lab import theory
from brorl_lab.lab.course import Exercises, load_solutions


def test_exercises_swap_in_solutions_only_when_asked(tmp_path):
    (tmp_path / "nb.py").write_text("def square(x):\n    return x * x\n\ndef cube(x):\n    return x ** 3\n")

    def square(x):
        return 0  # a stub

    def cube(x):
        return 0

    assert Exercises("nb", False, solutions_dir=tmp_path)(square)(3) == 0
    both = Exercises("nb", True, solutions_dir=tmp_path)
    assert both(square)(3) == 9 and both(cube)(2) == 8 and both.solved == ["square", "cube"]
    some = Exercises("nb", ["cube"], solutions_dir=tmp_path)
    assert some(square)(3) == 0 and some(cube)(2) == 8 and some.names == ["square", "cube"]


def test_exercises_bad_input_names_the_field(tmp_path):
    (tmp_path / "nb.py").write_text("x = 1\n")
    with pytest.raises(ValueError, match="use_solutions"):
        Exercises("nb", "yes", solutions_dir=tmp_path)

    def missing():
        return None

    with pytest.raises(ValueError, match="no function 'missing'"):
        Exercises("nb", True, solutions_dir=tmp_path)(missing)
    with pytest.raises(FileNotFoundError, match="no solutions file"):
        load_solutions("absent", tmp_path)


def test_the_shipped_solutions_agree_with_the_library():
    """notebooks/solutions/01: the logit update and the three terms equal brorl_lab.theory on random draws."""
    sol = load_solutions("01_mass_balance_theory")
    rng = np.random.default_rng(0)
    prob = theory.zipf_problem(40, 9, placement="random", seed=3)
    for _ in range(5):
        counts = rng.multinomial(5, prob.p)
        np.testing.assert_allclose(sol.logit_update(prob.p, prob.correct, counts, r_c=2.0, r_w=-0.5),
                                   theory.logit_update(prob.p, prob.correct, counts, r_c=2.0, r_w=-0.5), rtol=1e-12)
        terms = sol.three_terms(prob.p, prob.correct, counts > 0, 5)
        ref = theory.mass_balance(prob.p, prob.correct, counts)
        assert all(np.isclose(terms[t], getattr(ref, t), rtol=1e-10, atol=1e-18) for t in theory.TERMS)
    assert Path(sol.__file__).parent.name == "solutions"


def test_explorer_teaching_views_and_named_panels():
    from brorl_lab.lab.widgets import PANELS, mass_balance_explorer

    kw = dict(vocab=8_000, n_correct=600, trials=40, n=4, n_values=[2**k for k in range(9)])
    ex = mass_balance_explorer(**kw)
    assert (ex.sweep["p_neg"] == 0).all()  # the paper's seeded vocabulary never loses correct mass
    assert ex.terms_fig.layout.title.text.startswith(PANELS["terms"])
    assert ex.hist_fig.layout.title.text.startswith(PANELS["histogram"])
    assert ex.sweep_fig.layout.title.text.startswith(PANELS["sweep"])
    assert all(name in ex.guide.value for name in PANELS.values())
    ex.views.value = "zipf, tail"  # one click
    assert "tail" in ex.problem.name and ex.sweep.set_index("n")["p_neg"][1] > 0.5
    ex.shape.value = "paper (unseeded)"  # leaving the view unlights its button
    assert ex.views.value is None and "unseeded" in ex.problem.name
    assert "tail" in mass_balance_explorer(view="zipf, tail", **kw).problem.name
    with pytest.raises(ValueError, match="view"):
        mass_balance_explorer(view="nope", **kw)
