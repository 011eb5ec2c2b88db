"""The regime map: s_N(p) shares, the measured and predicted crossover, and notebook 06 headless (tiny sizes)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from helpers_notebooks import assert_notebook_pair_in_sync

from brorl_lab.study import rare
from brorl_lab.study import regime as G


def test_informative_share_is_the_mean_of_s_n():
    p = [0.0, 0.01, 0.5, 1.0]
    assert G.informative_share(p, 16) == pytest.approx(np.mean([0, 1 - 0.01 ** 16 - 0.99 ** 16, 1 - 2 * 0.5 ** 16, 0]))
    rates = pd.DataFrame({"p": [0.01, 0.02, 0.95, 0.5], "reach": ["only N=512", "only N=512", "only N=512", "both"]})
    row = G.branch_point_row(rates)
    assert row["rare_success"] == 0.5 and row["rare_failure"] == 0.25 and row["only_large"] == 0.75
    assert row["rho"] == pytest.approx(row["E_s512"] / row["E_s16"]) and row["rho"] > 1
    with pytest.raises(ValueError, match="p"):
        G.informative_share([1.5], 16)


def test_rare_success_has_one_definition_at_one_over_sixteen():
    """study.rare is the one definition: 0 < p <= 1/16 (1/N at the ProRL arm's N = 16), its mirror 15/16 <= p < 1;
    the plateau's gate, the mechanism's summary and the regime map all read it."""
    from brorl_lab.study import mechanism, plateau

    p = [0.0, 1 / 16, 0.0626, 0.1, 0.5, 15 / 16, 0.999, 1.0]
    assert rare.rare_success(p).tolist() == [False, True, False, False, False, False, False, False]
    assert rare.rare_failure(p).tolist() == [False, False, False, False, False, True, True, False]
    assert (1 - rare.RARE_SUCCESS_MAX_P) ** 16 == pytest.approx(0.3561, abs=1e-4)  # an N=16 group all wrong
    assert rare.s_n(np.array([0.5, 0.0]), 2).tolist() == [0.5, 0.0] and rare.s_n(0.1, 1) == pytest.approx(0.0)
    assert plateau.GATE["max_p"] == rare.RARE_SUCCESS_MAX_P
    rates = pd.DataFrame({"family": "f", "uid": list("abcd"), "p": [0.05, 0.08, 0.95, 0.5],
                          "signal_small": 0.0, "signal_large": True, "reach": "only N=512"})
    summary = mechanism.reach_summary(rates).set_index("family")
    assert summary.loc["all", ["share rare successes", "share rare failures"]].tolist() == [0.25, 0.25]
    assert G.branch_point_row(rates)["rare_success"] == 0.25  # 0.08 is above 1/16 in both
    with pytest.raises(ValueError, match="n: got 0"):
        rare.s_n(0.5, 0)


def test_crossover_measured_by_weighted_fit_and_predicted_from_rho():
    table = pd.DataFrame({"rare_success": [0.05, 0.2, 0.4, 0.6], "gap": [-0.025, -0.01, 0.01, 0.03],
                          "se": [0.005] * 4, "rho": [2.0, 4.0, 12.0, 20.0]}, index=list("abcd"))
    c = G.crossover(table)
    assert c["measured"] == pytest.approx(0.3) and c["b"] == pytest.approx(0.1)  # gap = -0.03 + 0.1 x exactly
    assert c["b_lo"] > 0 and c["measured_lo"] < 0.3 < c["measured_hi"]
    assert c["predicted"] == pytest.approx(0.2 + (8 - 4) / (12 - 4) * 0.2)  # rho = 8 between b and c: 0.3
    text = G.regime_text(table.assign(lo=table["gap"] - 0.01, hi=table["gap"] + 0.01, n=8), c)
    assert "gap grows with the rare-success share" in text and "inside the measured one's interval" in text
    assert "ahead (interval above 0) on 1 of 4 settings, behind (interval below 0) on 1" in text
    assert "Spearman +1.00" in text
    wide = G.crossover(table.assign(se=0.05))  # noisy gaps: the fit cannot place the crossover
    text = G.regime_text(table.assign(lo=table["gap"] - 0.1, hi=table["gap"] + 0.1, n=3), wide)
    assert "uninformative" in text
    flat = G.crossover(table.assign(rho=2.0))
    assert flat["predicted"] is None  # rho never reaches the update ratio in the measured range
    assert G.crossover(table.iloc[:2])["b"] is None  # two settings: no line


def test_regime_map_notebook_pair_is_in_sync():
    assert_notebook_pair_in_sync("06_regime_map", ["model", "settings", "seeds", "steps", "run_dir"])


@pytest.mark.notebook
@pytest.mark.slow
def test_regime_map_notebook_runs_small_through_the_cli(tmp_path, monkeypatch):
    from brorl_lab.cli import main

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    settings = {"gcd": {"tasks": ["gcd"]}, "chain_sum": {"tasks": ["chain_sum"]},
                "spell_backward": {"tasks": ["spell_backward"]}}
    small = dict(settings=settings, steps=1, eval_every=1, seeds=[0, 1], n_small=2, n_large=8, prompts_small=4,
                 prompts_large=2, optimizer_steps_per_step=1, eval_prompts=4, eval_samples=2, reach_prompts=4,
                 reach_draws=16)
    out = tmp_path / "map"
    assert main(["regime-map", "--out", str(out), *[x for k, v in small.items() for x in ("-p", f"{k}={v!r}")]]) == 0
    table = pd.read_csv(out / "regime_map.csv", index_col=0)
    assert set(table.index) == set(settings) and (table["n"] == 2).all() and (table["prompts"] == 4).all()
    assert table["rare_success"].is_monotonic_increasing  # sorted by the share the map is drawn against
    assert ((table["lo"] <= table["gap"]) & (table["gap"] <= table["hi"])).all()
    assert {"E_s2", "E_s8", "rho", "ds measured N=2", "ds measured N=8"} <= set(table.columns)
    (out / "regime.txt").unlink()
    assert main(["regime-map", "--out", str(out), "--summarize"]) == 0  # the reading again, from the table alone
    cross = json.loads((out / "regime.json").read_text())
    assert cross["settings"] <= 3 and cross["ratio"] == 8.0
    assert (out / "regime.txt").read_text().startswith(table.index[0] + ": rare-success share")
    for name in settings:  # each setting's arms ran on the shared grid in its own root
        assert sorted(p.name for p in (out / name / "arms").iterdir()) == ["brorl_s0", "brorl_s1", "prorl_s0",
                                                                             "prorl_s1"]
