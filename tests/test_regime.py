"""The regime map: s_N(p) shares, the measured and predicted crossover, and notebook 06 headless (tiny sizes)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from helpers_notebooks import assert_notebook_pair_in_sync, execute_small
from helpers_runs import run_names

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


def _table(gaps, rhos, half=0.005, se=0.002, n=8):
    gaps = np.asarray(gaps, float)
    return pd.DataFrame({"rho": rhos, "rho_run": rhos, "gap": gaps, "lo": gaps - half, "hi": gaps + half, "se": se,
                         "n": n}, index=[f"s{i}" for i in range(len(gaps))])


def test_the_reading_can_say_supported_refuted_unresolved_and_not_tested():
    """broadening_pays, fixed before the run: the same rule gives each verdict on the table that earns it."""
    rhos = [1.0, 2.0, 4.0, 8.0, 16.0, 32.0]
    up = G.broadening_pays(_table([-0.04, -0.03, -0.01, 0.01, 0.02, 0.04], rhos))  # gap rises, ahead above 8
    assert up["verdict"] == "supported" and set(up["above"]) == {"s3", "s4", "s5"}
    fits = pd.DataFrame(up["fits"])
    assert len(fits) == 2 * (1 + 6) and fits["resolved"].all()  # unweighted and weighted, all + each left out
    assert up["crossover"]["rho0"] == pytest.approx(5.66, abs=0.5)  # between 4 and 8
    # products_2d-like: a setting past the rule whose interval rules out a 1-point gain refutes it
    flat = G.broadening_pays(_table([-0.04, -0.03, -0.01, -0.02, 0.03, 0.04], rhos))
    assert flat["verdict"] == "refuted" and "s3" in flat["why"][0] and "rules out a gain of 1 point" in flat["why"][0]
    noisy = G.broadening_pays(_table([-0.01, 0.0, 0.01, 0.005, 0.0, 0.01], rhos, half=0.05, se=0.02))
    assert noisy["verdict"] == "unresolved" and noisy["crossover"] is None
    low = G.broadening_pays(_table([-0.01, 0.0, 0.01, 0.02], [1.0, 1.5, 2.0, 4.0]))
    assert low["verdict"] == "not tested" and "highest 4.00" in low["why"][0]
    # one setting drives the trend: leaving it out breaks a fit, so no crossover is reported
    lever = G.broadening_pays(_table([0.0, 0.0, 0.0, 0.0, 0.0, 0.2], rhos, half=0.01, se=0.005))
    assert lever["crossover"] is None
    with pytest.raises(ValueError, match="axis"):
        G.broadening_pays(_table([0.0] * 4, rhos[:4]), "rare_success")


def test_fit_line_recovers_a_known_line_weighted_and_unweighted():
    x = np.array([0.0, 1.0, 2.0, 3.0, 4.0])
    y = -0.02 + 0.01 * x + np.array([0.001, -0.001, 0.0, 0.001, -0.001])
    for se in (None, np.full(5, 0.001)):
        f = G.fit_line(x, y, se)
        assert f["b"] == pytest.approx(0.01, abs=1e-3) and f["x0"] == pytest.approx(2.0, abs=0.2)
        assert f["b_lo"] > 0 and f["resolved"]
    assert not G.fit_line(x[:2], y[:2])["resolved"]  # two points: no interval


def test_bands_filter_the_measured_p_and_reject_a_bad_band():
    p = [0.0, 1 / 512, 1 / 64, 0.02, 1 / 16, 0.3, 1.0]
    assert G.in_band(p, "(0,1/64]").tolist() == [False, True, True, False, False, False, False]
    assert G.in_band(p, "(1/64,1/16]").tolist() == [False, False, False, True, True, False, False]
    assert G.in_band(p, "(1/4,1)").tolist() == [False, False, False, False, False, True, False]  # p = 1 never
    assert G.in_band(p, [0.0, 1.0]).sum() == 5
    for bad in ("p<1/64", [0.5, 0.1], [0, 2], "x"):
        with pytest.raises(ValueError, match="band: got"):
            G.check_band(bad)
    assert G.check_setting("s", {"tasks": ["gcd"], "band": "(0,1/64]", "candidates": 1536})["candidates"] == 1536
    for bad, needle in (({"tasks": "gcd"}, "'tasks'"), ({"tasks": ["gcd"], "bnad": "x"}, "unknown key 'bnad'"),
                        ({"tasks": ["gcd"], "candidates": 8}, "with a band"),
                        ({"tasks": ["gcd"], "band": "(0,1/64]", "candidates": 0}, "integer >= 1")):
        with pytest.raises(ValueError, match=needle):
            G.check_setting("s", bad)
    # the bands' rho runs from ~1 to past the rule's 8 (what the constructed settings are for)
    assert rare.informative_share([1 / 256], 512) / rare.informative_share([1 / 256], 16) > G.RHO_RULE
    assert rare.informative_share([0.5], 512) / rare.informative_share([0.5], 16) == pytest.approx(1.0, abs=1e-4)


def test_power_table_sizes_seeds_from_the_per_setting_sd():
    table = pd.DataFrame({"n": [8, 8], "sd": [0.008, 0.12]}, index=["gcd", "simple_equations"])
    power = G.power_table(table)
    assert power.loc["gcd", "enough"] and power.loc["gcd", "seeds_needed"] <= 8
    assert not power.loc["simple_equations", "enough"] and power.loc["simple_equations", "seeds_needed"] > 100
    wild = G.power_table(pd.DataFrame({"n": [2], "sd": [0.53]}, index=["chain_sum"]))  # no feasible design: inf
    assert wild.loc["chain_sum", "seeds_needed"] == np.inf and not wild.loc["chain_sum", "enough"]


def test_regime_map_notebook_pair_is_in_sync():
    assert_notebook_pair_in_sync("06_regime_map", ["quick", "model", "settings", "seeds", "steps", "run_dir"])


def test_the_shipped_map_reads_the_same_through_the_cli_the_notebook_function_and_its_files(capsys):
    """One reading (study.regime.regime_reading): the CLI's `regime-map --read` and notebook 06's
    reading_of_files give the verdicts the shipped regime.json holds, from the shipped per-seed files."""
    from brorl_lab.cli import main
    from brorl_lab.core.paths import NOTEBOOK_DIR

    shipped = NOTEBOOK_DIR / "figures"
    reading = G.reading_of_files(shipped)
    assert main(["regime-map", "--read", str(shipped)]) == 0
    assert capsys.readouterr().out.strip() == G.reading_line(reading)
    recorded = json.loads((shipped / "regime.json").read_text())
    assert {a: r["verdict"] for a, r in reading.items()} == {a: r["verdict"] for a, r in recorded.items()}
    assert G.PRESETS["full"].declaration()["reading"]["function"] == "brorl_lab.study.regime.regime_reading"


def test_the_reading_of_files_follows_a_changed_per_seed_value(tmp_path, capsys):
    """Perturb one setting's per-seed gaps in a copy of the shipped files: the CLI and the function move together."""
    from brorl_lab.cli import main
    from brorl_lab.core.paths import NOTEBOOK_DIR

    for key in ("per_seed", "branch", "drift"):
        (tmp_path / G.OUTPUT_FILES[key]).write_bytes((NOTEBOOK_DIR / "figures" / G.OUTPUT_FILES[key]).read_bytes())
    before = G.reading_of_files(tmp_path)
    seeds = pd.read_csv(tmp_path / G.OUTPUT_FILES["per_seed"])
    branch = pd.read_csv(tmp_path / G.OUTPUT_FILES["branch"], index_col=0)
    top = branch["rho"].idxmax()  # the setting furthest past the rule: lift its BroRL arm by 20 points every seed
    seeds.loc[seeds["setting"] == top, "brorl"] += 0.2
    seeds["gap"] = seeds["brorl"] - seeds["prorl"]
    seeds.to_csv(tmp_path / G.OUTPUT_FILES["per_seed"], index=False)
    after = G.reading_of_files(tmp_path)
    assert after["rho"]["above"][top]["gap"] == pytest.approx(before["rho"]["above"][top]["gap"] + 0.2)
    assert main(["regime-map", "--read", str(tmp_path)]) == 0
    assert capsys.readouterr().out.strip() == G.reading_line(after)
    with pytest.raises(SystemExit) as stop:  # one line, exit 2
        main(["regime-map", "--read", str(tmp_path / "nowhere")])
    assert stop.value.code == 2
    assert "regime_seeds.csv does not exist" in capsys.readouterr().err


def test_a_changed_design_is_exploratory_and_a_bad_setting_is_named():
    from brorl_lab.core.validation import UserError

    assert G.PRESETS["full"].full_size and not G.preset("full", seeds=[0, 1]).full_size
    assert G.preset("full", seeds=[0, 1], full_size=True).full_size
    with pytest.raises(UserError, match="no_such"):
        G.preset("full", no_such=1)
    with pytest.raises(UserError, match="settings"):
        G.preset("quick", settings={"x": {"tasks": []}})
    decl = G.preset("quick").declaration()
    assert decl["arms"]["brorl"]["rollouts_per_prompt"] == 8 and decl["seeds"] == [0, 1]


@pytest.mark.notebook
@pytest.mark.slow
def test_regime_map_quick_preset_runs_through_the_cli_and_the_notebook_reads_the_same(tmp_path, monkeypatch, capsys):
    """The quick preset end to end through the CLI (two named settings and one constructed pool, 2 paired seeds):
    the declaration before the run, provenance with its start, one setting's interval recomputed by hand from the
    per-seed file, the map redone from its files; then notebook 06 on the same folder (everything read back) prints
    the reading the CLI's --read gives."""
    from brorl_lab.cli import main
    from brorl_lab.core.paths import NOTEBOOK_DIR
    from brorl_lab.lab.stats import t_interval
    from brorl_lab.rollout.tasks.user import pool_eval_path

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    out = tmp_path / "map"
    assert main(["regime-map", "--quick", "--jobs", "1", "--threads", "1", "--out", str(out),
                 "--figures", str(tmp_path / "figures")]) == 0
    decl = json.loads((out / "declaration.json").read_text())
    assert decl["reading"]["function"] == "brorl_lab.study.regime.regime_reading" and decl["seeds"] == [0, 1]
    seeds = pd.read_csv(out / "regime_seeds.csv")
    table = pd.read_csv(out / "regime_map.csv", index_col=0)
    assert set(table.index) == {"gcd", "chain_sum", "gcd (1/4,1)"} and (table["n"] == 2).all()
    for name, g in seeds.groupby("setting"):  # the shipped interval, recomputed from the per-seed values
        ci = t_interval((g["brorl"] - g["prorl"]).to_numpy())
        assert table.loc[name, ["gap", "lo", "hi"]].tolist() == pytest.approx([ci["mean"], ci["lo"], ci["hi"]])
    assert seeds[["prorl_0", "brorl_0"]].notna().all().all()  # a step-0 evaluation in every arm
    assert (seeds["prorl_0"] == seeds["brorl_0"]).all()  # the branch point, same eval draws in both arms
    assert {"collapsed_prorl", "collapsed_brorl", "all_correct_prorl", "all_wrong_brorl"} <= set(seeds.columns)
    shares = seeds["all_correct_prorl"] + seeds["all_wrong_prorl"]
    assert np.allclose(shares, 1 - seeds["ds_prorl"], atol=0.35)  # dropped + kept groups cover what was generated
    assert table["rho_run"].tolist() == pytest.approx((table["ds_brorl"] / table["ds_prorl"]).tolist())
    assert seeds["prorl_at_updates"].notna().all() and (seeds["generated_prorl_at_updates"]
                                                         < seeds["generated_prorl"]).all()  # ProRL at BroRL's updates
    md = G.markdown_table(table)  # the results page's table: a row per setting
    assert md.count("\n") == len(table) + 1 and all(f"| {name} | floor |" in md for name in table.index)
    pool = json.loads((out / "pools" / "gcd_1_4_1.pool.json").read_text())
    assert pool["band_p"] == [0.25, 1.0] and pool["train_prompts"] >= 1 and pool["eval_prompts"] >= 1
    branch = pd.read_csv(out / "branch" / "gcd_1_4_1.csv")  # the pool re-drawn: fresh samples of its own prompts
    train = [json.loads(line)["uid"] for line in (out / "pools" / "gcd_1_4_1.jsonl").read_text().splitlines()]
    held = [json.loads(line)["uid"] for line in pool_eval_path(out / "pools" / "gcd_1_4_1.jsonl").read_text()
            .splitlines()]
    assert branch["uid"].tolist() == train and not set(train) & set(held)
    from brorl_lab.study.results import SHIPPED_KEYS, read_provenance

    for folder in (out, tmp_path / "figures"):  # beside every results file, in the run and in --figures alike
        record = read_provenance(folder / "regime_seeds.csv")
        assert set(SHIPPED_KEYS) <= set(record) and record["command"].startswith("python -m brorl_lab regime-map")
        assert record["declaration"]["path"].endswith("declaration.json") and record["started_at"] <= record["date"]
        assert set(record["checkpoints"]) == {"floor"} and (folder / "regime_map.csv.provenance.json").is_file()
    reading = json.loads((out / "regime.json").read_text())
    assert set(reading) == {"rho", "rho_run"} and reading["rho"]["verdict"] in G.VERDICTS
    assert json.loads((out / "verdict.json").read_text())["readings"] == reading
    (out / "regime.txt").unlink()
    assert main(["regime-map", "--out", str(out), "--summarize"]) == 0  # the map again, from the files alone
    assert (out / "regime.txt").read_text().startswith(table.index[0] + ": rho")
    runs = run_names(out / "arms")  # every setting's arms in one root, named by the setting's slug
    assert runs == sorted(f"{s}__{a}_s{k}" for s in ("chain_sum", "gcd", "gcd_1_4_1") for a in ("brorl", "prorl")
                          for k in (0, 1))
    capsys.readouterr()
    assert main(["regime-map", "--read", str(out)]) == 0
    cli_reading = capsys.readouterr().out.strip()
    assert cli_reading == G.reading_line(G.reading_of_files(out))
    nb = execute_small(NOTEBOOK_DIR / "06_regime_map.ipynb", tmp_path,
                       {"quick": True, "run_dir": str(out), "jobs": 1, "torch_threads": 1}, monkeypatch)
    assert f"reading: {cli_reading}" in nb["text"]  # the notebook's run_regime_map read everything back
    assert run_names(out / "arms") == runs  # and trained nothing new


def _arm_frame(arm, seed, *, steps, per_step, start, end, correct_share, redraw=1.0):
    """One arm's metrics rows: evaluated at step 0 and at the end; dropped groups drifting to all-correct; ``redraw``
    generated samples per nominal one (dynamic sampling's re-draws)."""
    rows = []
    for step in range(steps + 1):
        row = {"arm": arm, "seed": seed, "step": step, "cum_nominal_samples": step * per_step,
               "cum_nominal_updates": 2 * step, "cum_samples": step * per_step * redraw, "cum_wall_s": 3.0 * step,
               "kl": 0.01}
        if step in (0, 1, steps):  # step 1: the shared grid's equal-updates point (BroRL's one step)
            row["eval/mean/pass@1"] = start if step == 0 else end if step == steps else start + 0.01
        if step:
            ac = correct_share * step / steps  # all-correct share grows over training
            row.update(ds_pass_rate=1 - ac - 0.1, ds_generated_groups=100, ds_all_correct_groups=round(100 * ac),
                       ds_all_wrong_groups=10)
        rows.append(row)
    return rows


def test_per_seed_rows_drift_and_the_setting_interval_recomputed_from_them():
    rows = []
    for seed, (pro, bro) in enumerate([(0.30, 0.33), (0.31, 0.32), (0.29, 0.35)]):
        rows += _arm_frame("prorl", seed, steps=8, per_step=100, start=0.3, end=pro, correct_share=0.4, redraw=1.5)
        rows += _arm_frame("brorl", seed, steps=1, per_step=800, start=0.3, end=bro, correct_share=0.0, redraw=1.2)
    df = pd.DataFrame(rows)
    df.loc[(df["arm"] == "brorl") & (df["seed"] == 2) & (df["step"] == 1), "kl"] = 0.9  # one collapsed seed
    per = G.per_seed_rows(df, "s")
    assert per["gap"].round(6).tolist() == [0.03, 0.01, 0.06] and (per[["prorl_0", "brorl_0"]] == 0.3).all().all()
    assert per["collapsed_brorl"].tolist() == [False, False, True] and "KL 0.9" in per["collapse_reason_brorl"][2]
    table = G.setting_table(per)
    from brorl_lab.lab.stats import t_interval

    ci = t_interval([0.03, 0.01, 0.06])
    assert table.loc["s", ["gap", "lo", "hi"]].tolist() == pytest.approx([ci["mean"], ci["lo"], ci["hi"]])
    assert per["generated_prorl"].tolist() == [1200.0] * 3 and per["generated_brorl"].tolist() == [960.0] * 3
    assert table.loc["s", "generated_ratio"] == pytest.approx(0.8)  # the nominal basis paid ProRL 25% more
    assert table.loc["s", "wall_ratio"] == pytest.approx(3 / 24)  # 1 BroRL step against 8 ProRL steps
    assert per["gap_updates"].round(6).tolist() == [0.02, 0.01, 0.04]  # BroRL's end against ProRL's step 1
    ci_u = t_interval([0.02, 0.01, 0.04])
    assert table.loc["s", ["gap_updates", "lo_updates", "hi_updates"]].tolist() == pytest.approx(
        [ci_u["mean"], ci_u["lo"], ci_u["hi"]])
    assert table.loc["s", "generated_ratio_updates"] == pytest.approx(960 / 150)
    assert table.loc["s", "collapsed_brorl"] == 1 and table.loc["s", "rho_run"] == pytest.approx(
        per["ds_brorl"].mean() / per["ds_prorl"].mean())
    drift = G.drift_table(df, "s").set_index(["arm", "part"])
    assert drift.loc[("prorl", 2), "all_correct"] > drift.loc[("prorl", 1), "all_correct"]  # drifts to all-correct
    assert drift.loc[("prorl", 1), "all_wrong"] == pytest.approx(0.1)


def test_publish_writes_the_shipped_names_each_with_its_provenance_and_skips_what_the_run_lacks(tmp_path):
    """What a study command's --figures does (study.results.publish): no shipped results file copied by hand."""
    from brorl_lab.study.results import provenance, publish, read_provenance

    out = tmp_path / "run"
    out.mkdir()
    (out / "points.csv").write_text("arm,seed\nprorl,0\n")
    record = provenance("python -m brorl_lab paid --out runs/paid_x --figures F", {}, 1.0, commit="abc1234")
    written = publish(out, tmp_path / "F", {"points.csv": "paid_x_points.csv", "mechanism.csv": "paid_x_m.csv"},
                      record)
    assert [p.name for p in written] == ["paid_x_points.csv", "paid_x_points.csv.provenance.json"]
    assert (tmp_path / "F" / "paid_x_points.csv").read_text() == "arm,seed\nprorl,0\n"
    assert read_provenance(tmp_path / "F" / "paid_x_points.csv")["command"].endswith("--figures F")
