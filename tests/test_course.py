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


# ---- the checks of notebooks 00 and 07: stub fails, each common mistake fails naming where, solution passes --------
import torch  # noqa: E402

from brorl_lab.lab import course  # noqa: E402


def _bad_grpo_no_guard(r, eps=1e-6):
    return (r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + eps)


def _bad_rloo_mean(r):
    return r - r.mean(1, keepdim=True)


def _bad_ppo(kind):
    def loss(logp, old, adv, mask, lo, hi):
        ratio, a = torch.exp(logp - old), adv[:, None]
        hi_ = lo if kind == "symmetric" else hi
        clipped = torch.clamp(ratio, 1 - lo, 1 + hi_) * a
        per = (torch.maximum(ratio * a, clipped) if kind == "max" else
               clipped if kind == "clamp only" else torch.minimum(ratio * a, clipped))
        return -per.mean() if kind == "mean over padding" else -(per * mask).sum() / mask.sum()
    return loss


def _bad_kl(kind_wrong):
    def kl(logp, ref, kind):
        d = logp - ref
        if kind == "k1":
            return -d if kind_wrong == "k1 sign" else d
        if kind == "k2":
            return d**2 if kind_wrong == "k2 no half" else 0.5 * d**2
        return torch.exp(d) - d - 1 if kind_wrong == "k3 reversed" else torch.expm1(-d) + d
    return kl


STUB = {"grpo": lambda r, eps=1e-6: torch.zeros_like(r), "logprobs": lambda lg, ids, n: torch.zeros(ids[:, n:].shape),
        "ppo": lambda lp, old, a, m, lo, hi: (lp * 0).sum(), "kl": lambda lp, ref, k: torch.zeros_like(lp),
        "reward": lambda response, item: 0.0, "keep": lambda c: torch.ones(c.shape[0], dtype=torch.bool)}

MISTAKES = [  # (check, kind, wrong function, a phrase the message must hold: where it goes wrong)
    ("advantage", "grpo", STUB["grpo"], "random binary"),
    ("advantage", "grpo", _bad_grpo_no_guard, "a uniform group: all rewards 0.1"),
    ("advantage", "grpo", lambda r, eps=1e-6: (r - r.mean(1, keepdim=True)) / (r.std(1, correction=0, keepdim=True)
                                                                              + eps), "random binary"),
    ("advantage", "rloo", _bad_rloo_mean, "random binary"),
    ("advantage", "rloo", lambda r: r - (r.sum(1, keepdim=True) - r) / (r.shape[1] - 1), "all rewards 0.1"),
    ("response_logprobs", None, STUB["logprobs"], "one position predicts the next"),
    ("response_logprobs", None, lambda lg, ids, n: torch.log_softmax(lg[:, n:], -1).gather(-1, ids[:, n:, None])[..., 0],
     "one position predicts the next"),
    ("response_logprobs", None, lambda lg, ids, n: lg[:, n - 1:-1].gather(-1, ids[:, n:, None])[..., 0],
     "one position predicts the next"),
    ("response_logprobs", None, lambda lg, ids, n: torch.softmax(lg[:, n - 1:-1], -1).gather(-1, ids[:, n:, None])[..., 0],
     "one position predicts the next"),
    ("ppo_clip_loss", None, STUB["ppo"], "gradient"),
    ("ppo_clip_loss", None, _bad_ppo("symmetric"), "between 1 + eps_low and 1 + eps_high"),
    ("ppo_clip_loss", None, _bad_ppo("max"), "A > 0"),
    ("ppo_clip_loss", None, _bad_ppo("clamp only"), "is clipped in yours"),
    ("ppo_clip_loss", None, _bad_ppo("mean over padding"), "padding"),
    ("kl_estimators", None, STUB["kl"], "k1"),
    ("kl_estimators", None, _bad_kl("k1 sign"), "k1"),
    ("kl_estimators", None, _bad_kl("k2 no half"), "k2"),
    ("kl_estimators", None, _bad_kl("k3 reversed"), "k3"),
    ("reward", None, STUB["reward"], "gets 0 from yours"),
    ("reward", None, lambda response, item: float(response == item.answer), "response '  "),
    ("reward", None, lambda response, item: float(response.strip() == item.answer), "response '"),
    ("reward", None, lambda response, item: float(item.answer.lower() in response.lower()), "and more"),
    ("keep_groups", None, STUB["keep"], "group"),
    ("keep_groups", None, lambda c: c.any(1), "all right"),
    ("keep_groups", None, lambda c: c.float().mean(1) > 0.5, "random groups"),
]


@pytest.mark.parametrize("check,kind,wrong,where", MISTAKES,
                         ids=[f"{m[0]}-{i}" for i, m in enumerate(MISTAKES)])
def test_each_common_mistake_fails_its_check_naming_where(check, kind, wrong, where):
    fn = getattr(course, f"check_{check}")
    with pytest.raises(course.NotYet, match="not yet") as err:
        fn(wrong, kind) if kind else fn(wrong)
    assert where in str(err.value), str(err.value)


def test_the_solutions_of_07_and_00_pass_their_checks():
    sol, sol00 = load_solutions("07_write_the_loop"), load_solutions("00_quickstart")
    assert "correct" in course.check_response_logprobs(sol.response_logprobs)
    for fn, kind in ((sol.grpo_advantage, "grpo"), (sol00.grpo_advantage, "grpo"), (sol.rloo_advantage, "rloo")):
        assert "correct" in course.check_advantage(fn, kind)
    assert "correct" in course.check_ppo_clip_loss(sol.ppo_clip_loss)
    assert "correct" in course.check_kl_estimators(sol.kl_estimate)
    assert "correct" in course.check_reward(sol.spell_backward_reward)
    assert "correct" in course.check_keep_groups(sol.keep_groups)
