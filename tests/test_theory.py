"""Tests of brorl_lab.theory (the mass balance), its figures and the mass-balance explorer widget.

Every check compares against something computed another way: torch autograd and softmax for Theorem 1, brute-force
enumeration of all draw sequences or Monte Carlo for the expectations, the closed-form limit for large N.
"""

import itertools
import math

import numpy as np
import pytest
import torch

from brorl_lab import theory
from brorl_lab.lab import plots
from brorl_lab.theory import TERMS, TERMS_AND_TOTAL

torch.set_num_threads(1)


def random_problem(seed: int, vocab: int = 200, share: float = 0.3, scale: float = 1.0):
    """Logits ~ N(0, scale^2) [V] and a random correct mask with both classes present."""
    rng = np.random.default_rng(seed)
    z = rng.normal(size=vocab) * scale
    correct = rng.random(vocab) < share
    correct[:2] = (True, False)
    return z, theory.softmax(z), correct


def autograd_update(z, correct, counts, n, r_c, r_w, lr):
    """dz from torch autograd of the linear surrogate L = -(1/N) sum_i R_i p_i (R = 0 for undrawn tokens)."""
    zt = torch.tensor(z, dtype=torch.float64, requires_grad=True)
    reward = torch.tensor(np.where(counts > 0, np.where(correct, r_c, r_w), 0.0))
    loss = -(reward * torch.softmax(zt, 0)).sum() / n
    loss.backward()
    return -lr * zt.grad.numpy()


def q_pos_after(z, correct, dz):
    return float(torch.softmax(torch.tensor(z + dz, dtype=torch.float64), 0)[torch.tensor(correct)].sum())


# ---- Theorem 1 ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("n", [1, 4, 16, 512])
def test_theorem1_matches_softmax_change_to_first_order(seed, n):
    z, p, correct = random_problem(seed, vocab=[60, 400][seed % 2])
    r_c, r_w = [(1.0, -1.0), (1.0, -0.25), (0.5, -2.0)][seed % 3]
    counts = np.random.default_rng(100 + seed).multinomial(n, p)
    lr = 1e-4
    dz = theory.logit_update(p, correct, counts, r_c=r_c, r_w=r_w, lr=lr)
    np.testing.assert_allclose(dz, autograd_update(z, correct, counts, n, r_c, r_w, lr), rtol=1e-10, atol=1e-20)

    mb = theory.mass_balance(p, correct, counts, r_c=r_c, r_w=r_w, lr=lr)
    assert mb.n == n and mb.method == "draw"
    assert mb.sampled_correct >= 0 and mb.sampled_incorrect >= 0  # the two sampled terms never hurt
    assert math.isclose(mb.total, mb.sampled_correct + mb.sampled_incorrect + mb.unsampled, rel_tol=1e-12)
    exact = theory.softmax_delta_q(p, correct, dz)
    assert abs(mb.total - exact) < 1e-5 * abs(exact)
    # first order means the error is quadratic in lr: 10x smaller lr, ~100x smaller error
    err_small = abs(theory.mass_balance(p, correct, counts, r_c=r_c, r_w=r_w, lr=lr / 10).total
                    - theory.softmax_delta_q(p, correct, dz / 10))
    assert err_small < abs(mb.total - exact) / 30


def test_softmax_delta_q_agrees_with_plain_softmax():
    z, p, correct = random_problem(7)
    dz = np.random.default_rng(1).normal(size=z.size) * 0.05
    assert math.isclose(theory.softmax_delta_q(p, correct, dz), q_pos_after(z, correct, dz) - p[correct].sum(),
                        rel_tol=1e-9)


def test_moments_and_signs_of_the_unsampled_term():
    """S_R > 0 pushes every unsampled logit down: that helps iff the unsampled incorrect mass is the concentrated
    one; S_R < 0 pushes them up and helps when the unsampled tokens are correct."""
    correct = np.array([True, True, False, False])
    p = np.array([0.4, 0.1, 0.3, 0.2])
    drawn = np.array([True, False, False, True])  # A = {0}, B = {3}, U = {1 (correct), 2 (incorrect)}
    m = theory.moments(p, correct, drawn, n=2)
    assert (m.s_r, m.u_pos2, m.u_neg2) == pytest.approx((0.2, 0.01, 0.09))
    mb = theory.mass_balance(p, correct, drawn, n=2)
    assert mb.unsampled == pytest.approx(0.5 * 0.2 * (0.5 * 0.09 - 0.5 * 0.01)) and mb.unsampled > 0
    p = np.array([0.4, 0.3, 0.1, 0.2])  # now the unsampled correct token carries the concentrated mass
    assert theory.moments(p, correct, drawn, n=2).s_r > 0
    assert theory.mass_balance(p, correct, drawn, n=2).unsampled < 0
    only_wrong = np.array([False, False, True, True])  # S_R < 0 and U = the two correct tokens
    assert theory.moments(p, correct, only_wrong, n=2).s_r < 0
    assert theory.mass_balance(p, correct, only_wrong, n=2).unsampled > 0


def test_counts_and_masks_agree():
    _, p, correct = random_problem(3)
    counts = np.random.default_rng(0).multinomial(37, p)
    a = theory.mass_balance(p, correct, counts, lr=0.3, r_w=-0.5)
    b = theory.mass_balance(p, correct, counts > 0, n=37, lr=0.3, r_w=-0.5)
    c = theory.mass_balance(p, correct, counts, n=37, lr=0.3, r_w=-0.5)
    assert a == b == c
    assert a.normalised()["total"] == pytest.approx(a.total * 37 / 0.3)
    # a different N with the same distinct set changes the lr/N factor only
    d = theory.mass_balance(p, correct, counts > 0, n=74, lr=0.3, r_w=-0.5)
    assert d.total == pytest.approx(a.total / 2)


# ---- expectations -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 2, 3])
def test_exact_expectation_equals_enumeration_of_all_draws(n):
    """E over all V^N ordered draw sequences, weighted by their probability, equals the exact pair formula."""
    p = np.array([0.5, 0.25, 0.15, 0.1])
    correct = np.array([False, True, True, False])
    want = np.zeros(4)
    for seq in itertools.product(range(4), repeat=n):
        counts = np.bincount(seq, minlength=4)
        mb = theory.mass_balance(p, correct, counts, r_c=1.0, r_w=-0.7, lr=0.1)
        want += np.prod(p[list(seq)]) * np.array([getattr(mb, t) for t in TERMS_AND_TOTAL])
    got = theory.expected_mass_balance(p, correct, n, r_c=1.0, r_w=-0.7, lr=0.1, terms="exact")
    np.testing.assert_allclose([getattr(got, t) for t in TERMS_AND_TOTAL], want, rtol=1e-12, atol=1e-16)
    assert theory.expected_total(p, correct, [n], r_c=1.0, r_w=-0.7, lr=0.1)[0] == pytest.approx(want[3], rel=1e-12)


@pytest.mark.parametrize("n", [1, 4, 16, 512])
def test_closed_form_and_exact_terms_match_monte_carlo(n):
    _, p, correct = random_problem(11, vocab=150, scale=1.5)
    trials = 3000
    sim = theory.simulate(p, correct, n, trials, seed=n, lr=1.0)
    exact = theory.expected_mass_balance(p, correct, n, terms="exact")
    mc = theory.expected_mass_balance(p, correct, n, terms="monte_carlo", trials=trials, seed=10_000 + n)
    assert exact.method == "exact" and mc.method == "monte_carlo" and mc.trials == trials
    assert mc.total == exact.total  # the total is always the closed form
    for t in TERMS_AND_TOTAL:
        se = sim[t].std(ddof=1) / math.sqrt(trials)
        assert abs(sim[t].mean() - getattr(exact, t)) < 4 * se + 1e-15, t
    for t in TERMS:
        se = getattr(mc, f"{t}_se")
        assert se > 0
        assert abs(getattr(mc, t) - getattr(exact, t)) < 4 * se + 1e-15, t
    # Monte Carlo must be able to fail: shifting the expectation by 6 standard errors is detected
    se = sim["total"].std(ddof=1) / math.sqrt(trials)
    assert abs(sim["total"].mean() - (exact.total + 6 * se)) > 4 * se


def test_terms_auto_switches_to_monte_carlo_for_large_vocabularies():
    prob = theory.paper_problem(20_000, 1_500)
    mb = theory.expected_mass_balance(prob.p, prob.correct, 64, trials=200, exact_max_vocab=2048)
    assert mb.method == "monte_carlo" and mb.unsampled_se > 0
    only = theory.expected_mass_balance(prob.p, prob.correct, 64, terms="total")
    assert only.method == "total" and math.isnan(only.unsampled) and only.total == mb.total


def test_large_n_limit():
    _, p, correct = random_problem(5, vocab=120, scale=2.0)
    limit = theory.large_n_limit(p, correct, r_c=1.0, r_w=-1.0)
    assert limit > 0
    big = theory.expected_mass_balance(p, correct, 10**8, terms="exact")
    norm = big.normalised()
    assert norm["total"] == pytest.approx(limit, rel=1e-9)
    assert abs(norm["unsampled"]) < 1e-12 * limit  # nothing is left unsampled
    q_pos, q_neg = p[correct].sum(), p[~correct].sum()
    s_inf = q_pos - q_neg  # S_R once every token is drawn
    assert norm["sampled_correct"] == pytest.approx((1 - s_inf) * q_neg * (p[correct] ** 2).sum(), rel=1e-9)
    # at small N the normalised total is still far from the limit (the check can fail)
    assert theory.expected_total(p, correct, [1], normalised=True)[0] < 0.9 * limit


def test_expected_total_on_the_paper_vocabulary_at_huge_n():
    prob = theory.paper_problem()  # V = 128,000
    grid = [1, 512, 51_200, 10**6, 10**9]
    norm = theory.expected_total(prob.p, prob.correct, grid, normalised=True)
    raw = theory.expected_total(prob.p, prob.correct, grid, lr=1e-3)
    np.testing.assert_allclose(raw, norm * 1e-3 / np.array(grid, float), rtol=1e-12)
    assert np.all(np.diff(norm) > 0)  # more rollouts, larger normalised expected gain here
    assert norm[-1] == pytest.approx(theory.large_n_limit(prob.p, prob.correct), rel=1e-6)


def test_lemma2_second_moment_matches_monte_carlo_and_decays():
    _, p, correct = random_problem(2, vocab=300, scale=1.5)
    grid = [1, 8, 64, 512, 4096]
    lemma = theory.unsampled_second_moment(p, correct, grid)
    assert np.all(np.diff(lemma.u2) < 0)
    draws = theory.draw_sums(p, correct, grid, trials=2000, seed=1)
    a2 = draws.sums[..., 2]  # [T, G], sampled correct second moment
    u_pos2 = (p[correct] ** 2).sum() - a2
    se = u_pos2.std(axis=0, ddof=1) / math.sqrt(draws.trials)
    assert np.all(np.abs(u_pos2.mean(axis=0) - lemma.u_pos2) < 4 * se + 1e-15)
    # ~97% (0.968) of correct tokens stay undrawn at N = 512 on the paper's vocabulary (derived, not the paper's)
    prob = theory.paper_problem()
    share = theory.unsampled_second_moment(prob.p, prob.correct, [512]).undrawn_correct_frac[0]
    assert 0.96 < share < 0.975


def test_n_sweep_and_rewards_repricing():
    prob = theory.zipf_problem(3_000, 300, placement="tail")
    grid = [1, 4, 16, 64, 256]
    sweep = theory.n_sweep(prob.p, prob.correct, grid, trials=300, seed=0)
    assert list(sweep.n) == grid
    assert sweep.p_neg.iloc[0] > 0.3 and sweep.p_neg.iloc[-1] < 0.05  # confidently wrong: small N often hurts
    np.testing.assert_allclose(sweep.total, theory.expected_total(prob.p, prob.correct, grid, normalised=True))
    draws = theory.draw_sums(prob.p, prob.correct, grid, trials=300, seed=0)
    again = theory.summarise_sweep(draws, r_c=0.5, r_w=-1.5)
    np.testing.assert_allclose(again.total, theory.expected_total(prob.p, prob.correct, grid, r_c=0.5, r_w=-1.5,
                                                                  normalised=True))
    assert not np.allclose(again.sampled_correct, sweep.sampled_correct, rtol=0.05, atol=0)
    long = draws.to_frame()
    assert len(long) == 300 * len(grid) and set(TERMS_AND_TOTAL) <= set(long.columns)


# ---- problems and bad inputs --------------------------------------------------------------------------------


def test_problems():
    seeded, unseeded = theory.paper_problem(), theory.paper_problem(seeding=False)
    assert seeded.q_pos == pytest.approx(0.630, abs=1e-3) and unseeded.q_pos == pytest.approx(10_000 / 128_000)
    assert theory.paper_problem(anchor_correct=False).q_pos == pytest.approx(0.6296, abs=1e-4)
    tail = theory.zipf_problem(1000, 50, placement="tail")
    head = theory.zipf_problem(1000, 50, placement="head")
    assert tail.p[tail.correct].max() < tail.p[~tail.correct].min() and head.q_pos > 0.5 > tail.q_pos
    custom = theory.logit_problem([0.0, 1.0, 2.0], [True, False, False])
    assert custom.q_pos == pytest.approx(1 / (1 + math.e + math.e**2))
    assert theory.PROBLEMS.get("zipf") is theory.zipf_problem


P3 = np.array([0.2, 0.3, 0.5])
C3 = np.array([True, False, False])


@pytest.mark.parametrize("call, name", [
    (lambda: theory.mass_balance([0.2, 0.3, 0.6], C3, np.array([1, 0, 0])), "p"),
    (lambda: theory.mass_balance([0.2, np.nan, 0.8], C3, np.array([1, 0, 0])), "p"),
    (lambda: theory.mass_balance([-0.2, 0.4, 0.8], C3, np.array([1, 0, 0])), "p"),
    (lambda: theory.mass_balance(P3, C3[:2], np.array([1, 0, 0])), "correct"),
    (lambda: theory.mass_balance(P3, C3, np.array([1, 0])), "sampled"),
    (lambda: theory.mass_balance(P3, C3, np.array([True, False, False])), "n"),
    (lambda: theory.mass_balance(P3, C3, np.array([0, 0, 0])), "sampled.sum()"),
    (lambda: theory.mass_balance(P3, C3, np.array([2, 0, 0]), n=3), "n"),
    (lambda: theory.mass_balance(P3, C3, np.array([1, 0, 0]), r_c=-1.0), "r_c"),
    (lambda: theory.mass_balance(P3, C3, np.array([1, 0, 0]), lr=0.0), "lr"),
    (lambda: theory.expected_mass_balance(P3, C3, 0), "n"),
    (lambda: theory.expected_mass_balance(P3, C3, 2.5), "n"),
    (lambda: theory.expected_mass_balance(P3, C3, 4, terms="pairs"), "terms"),
    (lambda: theory.expected_total(P3, C3, [4, 2]), "n_values"),
    (lambda: theory.simulate(P3, C3, 4, 0, seed=0), "trials"),
    (lambda: theory.zipf_problem(100, 10, placement="middle"), "placement"),
    (lambda: theory.paper_problem(100, 100), "n_correct"),
    (lambda: theory.paper_simulation(4, steps=1, vocab=100, n_correct=10, optimizer="lion"), "theory optimizer"),
    (lambda: theory.softmax_delta_q(P3, C3, np.zeros(2)), "dz"),
])
def test_bad_inputs_raise_one_clear_value_error(call, name):
    with pytest.raises(ValueError) as info:
        call()
    msg = str(info.value)
    assert msg.startswith(name) or f" {name} " in msg, msg


# ---- the paper's simulation ----------------------------------------------------------------------------------


def test_paper_simulation_large_n_raises_q_pos_more_than_n4():
    kw = dict(steps=120, vocab=2000, n_correct=160, seed=0)
    small, large = theory.paper_simulation(4, **kw), theory.paper_simulation(512, **kw)
    for df in (small, large):
        assert list(df.step) == list(range(121)) and df.q_pos.iloc[0] == pytest.approx(small.q_pos.iloc[0])
        assert df.frac_correct_improved.between(0, 1).all() and (df.worst_correct_drop >= 0).all()
    gain_small = small.q_pos.iloc[-1] - small.q_pos.iloc[0]
    gain_large = large.q_pos.iloc[-1] - large.q_pos.iloc[0]
    assert gain_large > 1.5 * gain_small and gain_large > 0
    assert large.frac_correct_improved.iloc[-1] > small.frac_correct_improved.iloc[-1]
    # N = 4 leaves almost every correct token undrawn each step; N = 512 far fewer
    assert small.unsampled_correct_frac.iloc[1:].mean() > 0.95 > large.unsampled_correct_frac.iloc[1:].mean()


def test_paper_simulation_options():
    kw = dict(steps=20, vocab=500, n_correct=40, seed=3, record_every=5)
    a = theory.paper_simulation(64, **kw)
    assert list(a.step) == [0, 5, 10, 15, 20]
    assert a.equals(theory.paper_simulation(64, **kw))  # seeded: reproducible
    sgd = theory.paper_simulation(64, optimizer="sgd", lr=50.0, **kw)
    assert not np.allclose(sgd.q_pos, a.q_pos)
    both = theory.paper_simulations([4, 64], progress=False, **kw)
    assert sorted(both.n.unique()) == [4, 64]


# ---- figures and the explorer widget ---------------------------------------------------------------------------


def test_figures_build_from_theory_tables():
    _, p, correct = random_problem(4)
    sweep = theory.n_sweep(p, correct, [1, 4, 16], trials=50, seed=0)
    fig = plots.n_sweep_figure(sweep, current_n=4)
    mark = next(fig.select_traces(selector={"name": "current N"}))
    assert list(mark.x) == [4] * 4 and mark.y[3] == pytest.approx(sweep.total[1])
    with pytest.raises(ValueError, match="current_n"):
        plots.n_sweep_figure(sweep, current_n=5)
    sim = theory.simulate(p, correct, 8, 20, seed=0, lr=1e-3)
    assert len(plots.first_order_figure(sim).data[0].x) == 20
    runs = theory.paper_simulations([4, 16], steps=5, vocab=200, n_correct=20, progress=False)
    assert len(plots.paper_simulation_figure(runs).data) == 6


@pytest.fixture(scope="module")
def explorer():
    from brorl_lab.lab.widgets import mass_balance_explorer

    return mass_balance_explorer(vocab=8_000, n_correct=600, trials=60, n=16, n_values=[2**k for k in range(11)])


def test_explorer_redraw_changes_the_figures(explorer):
    from brorl_lab.lab.widgets import EXPLORER_N_DESCRIPTION, EXPLORER_TITLE

    assert explorer.n_slider.description == EXPLORER_N_DESCRIPTION == "N"
    assert explorer.terms_fig.layout.title.text == EXPLORER_TITLE
    before_bars = np.array(explorer.terms_fig.data[0].y)
    before_hist = np.array(explorer.hist_fig.data[0].x)
    explorer.redraw(1024)  # its time is a benchmark figure (bench/bench_theory.py), not a test assertion
    after_bars = np.array(explorer.terms_fig.data[0].y)
    assert not np.allclose(before_bars, after_bars, rtol=1e-3, atol=0)
    assert not np.allclose(before_hist, explorer.hist_fig.data[0].x, rtol=1e-3, atol=0)
    assert after_bars[3] == pytest.approx(explorer.sweep.total.iloc[-1])
    mark = next(explorer.sweep_fig.select_traces(selector={"name": "current N"}))
    assert list(mark.x) == [1024] * 4
    explorer.n_slider.value = 2  # a slider move redraws through the observer
    assert list(next(explorer.sweep_fig.select_traces(selector={"name": "current N"})).x) == [2] * 4
    with pytest.raises(ValueError, match="n must be one of"):
        explorer.redraw(3)


def test_explorer_controls_change_problem_and_rewards(explorer):
    total_before = np.array(next(explorer.sweep_fig.select_traces(selector={"name": "total"})).y)
    explorer.r_w.value = -0.2
    total_after = np.array(next(explorer.sweep_fig.select_traces(selector={"name": "total"})).y)
    assert not np.allclose(total_before, total_after, rtol=1e-3, atol=0)
    explorer.shape.value = "zipf"
    explorer.placement.value = "tail"
    assert "tail" in explorer.problem.name and not explorer.placement.disabled
    explorer.vocab.value = 1_000  # keeps the correct share |P| / V = 600 / 8000
    assert explorer.problem.vocab == 1_000 and int(explorer.problem.correct.sum()) == 75


def test_explorer_with_user_logits():
    from brorl_lab.lab.widgets import mass_balance_explorer

    z, _, correct = random_problem(9, vocab=500)
    ex = mass_balance_explorer(logits=z, correct=correct, trials=40, n=4, n_values=[1, 4, 16])
    assert ex.problem.name == "custom logits" and ex.shape.value == "custom logits" and ex.vocab.disabled
    np.testing.assert_allclose(ex.sweep.total, theory.expected_total(theory.softmax(z), correct, [1, 4, 16],
                                                                     normalised=True))
    with pytest.raises(ValueError, match="logits and correct"):
        mass_balance_explorer(logits=z)
