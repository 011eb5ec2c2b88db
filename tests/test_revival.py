"""The flagship's statistics: t intervals and the smallest detectable effect against scipy, the shared grid, and the
pre-declared "BroRL revives" rule on inputs where it must and must not fire."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats as sps

from brorl_lab.lab.stats import ols_slope, paired_t_interval, t_interval
from brorl_lab.study import revival as R

A = [0.61, 0.64, 0.58, 0.66, 0.63, 0.60, 0.65, 0.62]  # 8 paired seeds
B = [0.60, 0.61, 0.59, 0.62, 0.60, 0.61, 0.60, 0.63]


def test_paired_t_interval_and_mde_match_scipy():
    r = paired_t_interval(A, B)
    d = np.subtract(A, B)
    ci = sps.ttest_rel(A, B).confidence_interval(0.95)
    assert (r["lo"], r["hi"]) == pytest.approx((ci.low, ci.high), abs=1e-12)
    t = sps.t.ppf(0.975, 7)
    assert r["t"] == pytest.approx(t) and r["n"] == 8
    se = d.std(ddof=1) / math.sqrt(8)
    assert r["mde"] == pytest.approx(t * se)
    assert r["mde_power"] == pytest.approx((t + sps.t.ppf(0.8, 7)) * se)
    assert r["excludes_zero"] == (ci.low > 0 or ci.high < 0)
    three = t_interval([1.0, 2.0, 4.0])  # 3 seeds: t_{0.975, 2} = 4.30, not 1.96 or 2
    assert three["t"] == pytest.approx(4.302652729911275)
    assert math.isnan(t_interval([1.0])["lo"]) and not t_interval([1.0])["excludes_zero"]
    with pytest.raises(ValueError, match="a, b"):
        paired_t_interval([1, 2], [1])


def test_ols_slope_matches_numpy():
    x, y = [0, 1, 2, 4], [0.1, 0.3, 0.2, 0.6]
    assert ols_slope(x, y) == pytest.approx(np.polyfit(x, y, 1)[0])
    assert math.isnan(ols_slope([1, 1], [0, 1]))


def ci(lo, hi, n=8):
    return {"n": n, "lo": lo, "hi": hi}


FIRES = dict(prorl_slope=ci(-0.1, 0.2), brorl_slope=ci(0.05, 0.4), gap=ci(0.01, 0.05), mechanism=ci(0.02, 0.1))


@pytest.mark.parametrize("change, failed", [
    ({}, None),                                         # every condition holds: it fires
    ({"prorl_slope": ci(0.01, 0.3)}, "prorl_stalled"),  # ProRL still climbing: no plateau to revive
    ({"brorl_slope": ci(-0.01, 0.4)}, "brorl_rising"),
    ({"gap": ci(-0.01, 0.05)}, "ahead_at_equal_samples"),
    ({"mechanism": ci(-0.02, 0.1)}, "gain_on_rare_side"),
    ({"mechanism": None}, "gain_on_rare_side"),         # not measured: not met
    ({"gap": ci(0.01, 0.05, n=1)}, "ahead_at_equal_samples"),  # one seed: no interval, not met
])
def test_the_revives_rule_fires_only_when_all_four_hold(change, failed):
    out = R.brorl_revives(**{**FIRES, **change})
    assert out["revives"] is (failed is None)
    assert [k for k, c in out["conditions"].items() if not c["met"]] == ([failed] if failed else [])
    assert out["rule"] == R.REVIVES_RULE


def synthetic(seeds: int = 8, brorl_gain: float = 0.04, noise: float = 0.005) -> pd.DataFrame:
    """Arms on the shared grid: ProRL flat at 0.5, BroRL climbing to +brorl_gain at the last point."""
    rng = np.random.default_rng(1)
    rows = []
    for seed in range(seeds):
        for arm, steps, per_step, grid in (("prorl", 8, 1024, [0, 1, 2, 4, 6, 8]), ("brorl", 2, 4096, [0, 1, 2])):
            for step in grid:
                v = 0.5 + (brorl_gain * step / 2 if arm == "brorl" else 0.0) + noise * rng.standard_normal()
                rows.append({"arm": arm, "seed": seed, "step": step, "cum_nominal_samples": step * per_step,
                             "cum_nominal_updates": step, "eval/mean/pass@1": v, "eval/mean/pass@64": v + 0.2})
    return pd.DataFrame(rows)


def test_grid_comparison_pairs_measured_points_and_refuses_interpolation():
    df = synthetic()
    g = R.grid_comparison(df, "cum_nominal_samples")
    assert list(g["budget"]) == [0, 4096, 8192] and (g["n"] == 8).all()
    assert g["gap"].iloc[-1] == pytest.approx(0.04, abs=0.01) and g["lo"].iloc[-1] > 0
    u = R.grid_comparison(df, "cum_nominal_updates")
    assert list(u["budget"]) == [0, 1, 2]  # the ProRL arm's steps 1 and 2: the same update counts
    mid = df[df["arm"] == "prorl"].assign(arm="middle")  # its own extra points (steps 1, 2) are not ProRL's grid
    mid = pd.concat([mid, mid[mid["step"] == 1].assign(step=3, cum_nominal_samples=3072, cum_nominal_updates=3)])
    m = R.grid_comparison(pd.concat([df, mid]), "cum_nominal_samples", arm="middle")
    assert list(m["budget"]) == [0, 4096, 8192]  # read on the BroRL arm's grid
    gappy = df[~((df["arm"] == "prorl") & (df["step"] == 4) & (df["seed"] == 3))]
    with pytest.raises(ValueError, match="seeds \\[3\\]"):  # a missing point is an error, not an interpolation
        R.grid_comparison(gappy, "cum_nominal_samples")


def test_revival_report_fires_on_a_clear_revival_and_not_on_a_tie():
    mech = {**t_interval([0.03, 0.05, 0.04, 0.02, 0.06, 0.04, 0.03, 0.05]), "prompts": 12, "per_seed": {}}
    rep = R.revival_report(synthetic(), mechanism=mech)
    assert rep["revives"] and rep["seeds"] == 8
    assert rep["slopes"]["brorl"]["lo"] > 0 and rep["slopes"]["prorl"]["lo"] <= 0 <= rep["slopes"]["prorl"]["hi"]
    assert set(rep["pass_at_k_at_equal_samples"]) == {1, 64}
    json.dumps(rep)  # verdict.json
    text = R.revival_text(rep)
    assert text.startswith("Does BroRL revive the plateau? YES") and "MDE" in text
    tie = R.revival_report(synthetic(brorl_gain=0.0), mechanism=mech)
    assert not tie["revives"] and not tie["conditions"]["ahead_at_equal_samples"]["met"]
    assert R.revival_text(tie).startswith("Does BroRL revive the plateau? NO")


def test_mechanism_gaps_read_the_rare_side_class():
    before = pd.DataFrame({"uid": list("abcd"), "p": [0.05, 0.02, 0.95, 0.5], "family": "x",
                           "reach": ["only N=512", "only N=512", "only N=512", "both"],
                           "signal_small": 0.0, "signal_large": True})
    after = {s: {"brorl": before.assign(p=before["p"] + 0.1 + 0.01 * s), "prorl": before.assign(p=before["p"])}
             for s in range(3)}
    m = R.mechanism_gaps(before, after)
    assert m["prompts"] == 2 and m["mean"] == pytest.approx(0.11) and m["lo"] > 0


def test_the_floor_runs_through_the_library_and_reads_its_own_rule(tmp_path, capsys, monkeypatch):
    """`python -m brorl_lab scaling` (docs/results/floor.md's command) is one call of study.runner.run_floor: both
    arms on the shared grid, the mechanism, the floor's rule in verdict.txt/json with provenance; a setting it does
    not know is one line, exit 2."""
    import json

    from brorl_lab.cli import main

    out = tmp_path / "floor"
    argv = ["scaling", "--out", str(out), "--model", "default", "--steps", "1", "--eval-every", "1", "--seeds", "0",
            "1", "--eval-prompts", "4", "--eval-samples", "2", "--jobs", "1", "--threads", "1",
            "-p", "tasks=['gcd']", "-p", "mechanism_prompts=4", "-p", "mechanism_draws=16", "-p", "eval_k=[1]"]
    from brorl_lab.study import runner

    table = {"prorl": dict(rollouts_per_prompt=2, prompts_per_step=4), "brorl": dict(rollouts_per_prompt=8,
                                                                                       prompts_per_step=2)}
    monkeypatch.setattr(runner, "ARM_TABLE", table)  # the recipe's arm table, shrunk for the test
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "\nDoes BroRL revive the plateau?" in "\n" + text and "gain_on_rare_side" in text
    verdict = json.loads((out / "verdict.json").read_text())
    assert verdict["seeds"] == 2 and verdict["revives"] == all(c["met"] for c in verdict["conditions"].values())
    assert verdict["provenance"]["started_at"] and verdict["provenance"]["arms"] == {"prorl": "2 x 4", "brorl": "8 x 2"}
    try:
        main(["scaling", "--out", str(tmp_path / "x"), "-p", "budget=3"])
    except SystemExit as e:
        assert e.code == 2
    else:
        raise AssertionError("an unknown setting must be refused")
