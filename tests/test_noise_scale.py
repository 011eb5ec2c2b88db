"""rl.noise_scale: the two-batch estimator of B_simple = tr(Sigma) / |G|^2 recovers a known noise scale, its interval
covers it, and the policy-gradient measurement runs on the shipped tiny model."""

import math

import numpy as np
import pytest
import torch

from brorl_lab.rl.noise_scale import noise_scale, noise_scale_interval, noise_scale_units, two_batch_norms

# Linear regression y = x.w* + e, x ~ N(0, I_D), e ~ N(0, s^2), squared loss at w = w* + d: a unit's gradient is
# g = 2 x (x.d - e), so G = 2 d and E[g g^T] = 4 (|d|^2 I + 2 d d^T + s^2 I), hence
# tr(Sigma) = 4 ((D + 1) |d|^2 + D s^2) and B_simple = (D + 1) + D s^2 / |d|^2.
D, SIGMA = 8, 1.0
DELTA = np.full(D, 1 / math.sqrt(D))  # |d| = 1
TRUE_B = (D + 1) + D * SIGMA ** 2  # 17


def linear_unit_grads(rng, count):
    def gen():
        for _ in range(count):
            x = rng.standard_normal(D)
            e = SIGMA * rng.standard_normal()
            yield torch.from_numpy(2 * x * (x @ DELTA - e))
    return gen


def test_estimator_is_exact_on_exact_moments():
    g2, trace = 4.0, 68.0  # |G|^2 and tr(Sigma) of the linear problem: B = 17
    sq = {b: g2 + trace / b for b in (2, 32)}
    r = noise_scale(sq[2], sq[32], 2, 32)
    assert r["g2"] == pytest.approx(g2) and r["trace"] == pytest.approx(trace) and r["b_simple"] == pytest.approx(17)
    assert noise_scale(20 * sq[32], sq[32], 2, 32)["b_simple"] == math.inf  # |G|^2 estimate <= 0: noise only


def test_two_batch_norms_recover_the_linear_models_noise_scale():
    covered = 0
    for seed in range(4):  # a 95% interval misses 1 time in 20: count coverage over independent problems
        rng = np.random.default_rng(seed)
        s, b = zip(*[two_batch_norms(linear_unit_grads(rng, 64), 4, 64) for _ in range(200)])
        r = noise_scale_interval(s, b, 4, 64, draws=500)
        covered += r["lo"] < TRUE_B < r["hi"]
        assert r["b_simple"] == pytest.approx(TRUE_B, rel=0.15) and r["g2"] == pytest.approx(4.0, rel=0.15)
        assert r["hi"] / r["lo"] < 1.3  # 200 repeats pin it down
    assert covered >= 3
    units = noise_scale_units(r, n=16, q=0.5)
    assert units["b_rollouts"] == pytest.approx(16 * r["b_simple"])
    assert units["b_generated"] == pytest.approx(32 * r["b_simple"])


def test_pure_noise_gives_an_open_interval():
    rng = np.random.default_rng(1)
    noise = [two_batch_norms(lambda: (torch.from_numpy(rng.standard_normal(D)) for _ in range(16)), 1, 16)
             for _ in range(20)]
    r = noise_scale_interval(*zip(*noise), 1, 16, draws=500)
    assert r["hi"] == math.inf and r["nonpositive_g2"] > 0.1  # no signal: nothing bounds the batch size


def test_two_batch_norms_checks_its_sizes():
    with pytest.raises(ValueError, match="multiple"):
        two_batch_norms(lambda: iter([]), 3, 8)
    with pytest.raises(ValueError, match="exactly"):
        two_batch_norms(lambda: (torch.ones(2) for _ in range(3)), 1, 4)


def test_measure_noise_scale_runs_on_the_tiny_model():
    from brorl_lab.core.config import Config
    from brorl_lab.core.models import load_policy
    from brorl_lab.rl.noise_scale import measure_noise_scale

    torch.manual_seed(0)
    policy, tok = load_policy("default", device="cpu")
    cfg = Config(tasks=["chain_sum"], rollouts_per_prompt=4, prompts_per_step=8, max_new_tokens=6)
    before = [p.detach().clone() for p in policy.parameters()]
    df = measure_noise_scale(cfg, b_small=1, b_big=2, repeats=2, policy=policy, tokenizer=tok)
    assert list(df["repeat"]) == [0, 1] and (df["sq_small"] > 0).all() and (df["sq_big"] > 0).all()
    assert (df["kept_groups"] >= 2).all() and (df["generated_groups"] >= df["kept_groups"]).all()
    assert all(torch.equal(a, p) for a, p in zip(before, policy.parameters()))  # measuring moves no weight
    assert all(p.grad is None for p in policy.parameters())


def test_the_noise_stage_writes_one_file_per_point_resumes_and_reads_its_summary(tmp_path, monkeypatch):
    """study.frontier.run_noise_stage at a tiny size (the shipped default model as the branch point, 2 repeats of
    B 1 vs 2 groups, N 4 and 8): one per-repeat file per point with its provenance, an arm's final policy found
    under --runs measured as a point of its own, a second call measures nothing, and noise_summary reads the files."""
    from brorl_lab.study import frontier as F
    from brorl_lab.study.results import read_provenance

    monkeypatch.setitem(F.BRANCH_POINTS, "learned", ("default", ["gcd"], 1e-3))
    monkeypatch.setattr(F, "NOISE_DESIGN", dict(b_small=1, b_big=2, repeats=2, prompts={4: 4, 8: 2}))
    import shutil

    import pandas as pd

    from brorl_lab.core.paths import DEFAULT_MODEL_DIR

    runs = tmp_path / "runs"
    arm = next(iter(F.FRONTIER.arms("ratio")))  # its policy stands in for a finished ratio run's final one
    shutil.copytree(DEFAULT_MODEL_DIR, runs / "ratio" / "arms" / f"learned-{arm}_s0" / "policy")
    points = F.noise_points(runs, branches=["learned"])
    assert [p[0] for p in points] == ["learned", "learned", f"learned-{arm}_s0"]
    with pytest.raises(ValueError, match="branches: got \\['nowhere'\\]; allowed: one or more of"):
        F.noise_points(runs, branches=["nowhere"])
    monkeypatch.setattr(F, "noise_points", lambda runs, branches=None: [p[:3] + (4, 4) if p[0] != "learned" else p
                                                                        for p in points])
    files = F.run_noise_stage(runs=runs, ledger=tmp_path / "ledger", ship=False, progress=False)
    assert sorted(f.name for f in files) == sorted(["learned-n4.csv", "learned-n8.csv", f"learned-{arm}_s0-n4.csv"])
    for f in files:
        rec = read_provenance(f)
        assert rec["status"] == "exploratory" and rec["wall_s"] > 0 and rec["commit"]
    stamp = {f: f.stat().st_mtime_ns for f in files}
    assert F.run_noise_stage(runs=runs, ledger=tmp_path / "ledger", ship=False, progress=False) == files
    assert {f: f.stat().st_mtime_ns for f in files} == stamp  # resumed: nothing measured again
    summary = F.noise_summary(pd.concat([pd.read_csv(f) for f in files], ignore_index=True), draws=50)
    assert set(summary["where"]) == {"learned", f"learned-{arm}_s0"} and summary["repeats"].eq(2).all()
    assert (summary["q"].between(0, 1)).all() and {"b_simple", "lo", "hi", "b_generated"} <= set(summary.columns)
