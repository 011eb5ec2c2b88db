"""The flagship paid in generated samples (study.paid): the arms' budgets and grid, and every pre-declared reading on
curves whose answer is known."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from helpers_runs import without_timing

from brorl_lab.lab.stats import change_bound, seeds_for_power, t_quantile
from brorl_lab.study import paid as PD
from brorl_lab.study.recipe import recipe_config

M = PD.METRIC


def curves(spec: dict) -> pd.DataFrame:
    """A long arm table from {(arm, seed): [(cum_samples, pass@1, kl), ...]} (row 0 is step 0)."""
    rows = []
    for (arm, seed), pts in spec.items():
        for step, (x, v, kl) in enumerate(pts):
            rows.append({"arm": arm, "seed": seed, "step": step, "cum_samples": x, M: v, "kl": kl})
    return pd.DataFrame(rows)


def test_seed_sizing_uses_t_at_every_n():
    # the arithmetic: an 8-seed MDE_95 of 1.19 points means sd = 1.19 sqrt(8) / t_{.975,7}; 1 point at 80%
    sd = 1.19 * math.sqrt(8) / t_quantile(0.975, 7)
    n = seeds_for_power(sd, 1.0)
    assert n == 18
    for k, ok in ((n, True), (n - 1, False)):  # the defining inequality holds at n and fails at n - 1
        mde = (t_quantile(0.975, k - 1) + t_quantile(0.8, k - 1)) * sd / math.sqrt(k)
        assert (mde <= 1.0) is ok
    with pytest.raises(ValueError, match="effect"):
        seeds_for_power(1.0, 0)


def test_change_bound_is_the_far_end_of_the_interval():
    r = change_bound([0.01, -0.02, 0.03, 0.0])
    assert r["bound"] == pytest.approx(max(abs(r["lo"]), abs(r["hi"])))
    assert r["lo"] < 0 < r["hi"] and r["bound"] > abs(r["mean"])


def test_paid_arms_stop_on_the_budget_and_share_the_threshold_grid(tmp_path):
    base = recipe_config(model="floor", run_dir=str(tmp_path), lr=3e-5)
    arms = PD.paid_arm_configs(base, budget=131_072)
    assert set(arms) == {"prorl", "brorl", "middle"}
    grid = PD.thresholds(131_072)
    assert grid == [16_384 * k for k in range(1, 9)]
    for arm, (n, p) in {"prorl": (16, 64), "brorl": (512, 16), "middle": (64, 32)}.items():
        c = arms[arm]
        assert (c.rollouts_per_prompt, c.prompts_per_step) == (n, p)
        assert c.max_samples == 131_072 and c.eval_at_samples == grid and c.eval_every == 0 and not c.eval_at_steps
        assert c.lr == 3e-5 and c.reset_every == 0  # the plateau's lr; resets off
        assert c.steps * c.samples_per_step >= 131_072  # the cap never binds before the budget
    assert PD.paid_arm_configs(base, budget=131_072, lr_factor=0.5, middle=False)["brorl"].lr == pytest.approx(1.5e-5)
    with pytest.raises(ValueError, match="lr_factor"):
        PD.paid_arm_configs(base, budget=10, lr_factor=0)


def test_grid_points_take_the_first_measured_crossing_and_keep_censored_runs():
    df = curves({("prorl", 0): [(0, 0.5, 0), (900, 0.52, 0.01), (2100, 0.55, 0.02)],
                 ("brorl", 0): [(0, 0.5, 0), (1200, 0.60, 0.01)]})
    pts = PD.grid_points(df, [1000, 2000])
    got = pts.set_index(["arm", "mark"])
    assert got.loc[("prorl", 1000), "x"] == 2100 and got.loc[("prorl", 1000), "value"] == 0.55  # 900 < 1000
    assert got.loc[("brorl", 1000), "x"] == 1200 and got.loc[("brorl", 1000), "change"] == pytest.approx(0.10)
    assert np.isnan(got.loc[("brorl", 2000), "value"])  # never reached 2000: censored, kept as NaN


def test_paired_gap_and_change_bounds_on_known_curves():
    spec = {}
    for s, gap in enumerate([0.02, 0.03, 0.01, 0.02]):
        spec[("prorl", s)] = [(0, 0.5, 0), (1000, 0.5, 0)]
        spec[("brorl", s)] = [(0, 0.5, 0), (1000, 0.5 + gap, 0)]
    pts = PD.grid_points(curves(spec), [1000])
    g = PD.paired_at_grid(pts).iloc[0]
    assert g["n"] == 4 and g["gap"] == pytest.approx(0.02) and g["lo"] > 0
    assert g["per_seed"] == pytest.approx({0: 0.02, 1: 0.03, 2: 0.01, 3: 0.02})
    b = PD.change_bounds(pts).set_index("arm")
    assert b.loc["prorl", "change"] == 0 and b.loc["brorl", "change"] == pytest.approx(0.02)
    assert b.loc["brorl", "bound"] >= 0.02


def test_collapse_rule_flags_kl_and_a_fall_and_keeps_healthy_seeds():
    df = curves({("brorl", 0): [(0, 0.5, 0.0), (100, 0.5, 0.9)],       # KL out of the band
                 ("brorl", 1): [(0, 0.5, 0.0), (100, 0.38, 0.05)],     # fell 12 points
                 ("prorl", 0): [(0, 0.5, 0.0), (100, 0.45, 0.05)]})    # fell 5: inside the band
    f = PD.collapse_flags(df).set_index(["arm", "seed"])
    assert f.loc[("brorl", 0), "collapsed"] and "KL" in f.loc[("brorl", 0), "reason"]
    assert f.loc[("brorl", 1), "collapsed"] and "fell 12.0 points" in f.loc[("brorl", 1), "reason"]
    assert not f.loc[("prorl", 0), "collapsed"]


def test_the_mechanism_is_read_against_the_no_training_redraw():
    def rates(ps):
        return pd.DataFrame({"uid": list(range(4)), "p": ps, "reach": ["only N=512"] * 3 + ["both"]})

    before = rates([0.01, 0.02, 0.03, 0.5])
    redraw = rates([0.005, 0.015, 0.02, 0.5])  # regression to the mean: -0.0067 on the selected prompts
    after = {0: {"brorl": rates([0.02, 0.03, 0.03, 0.9]), "prorl": rates([0.0, 0.02, 0.02, 0.9])}}
    g = PD.control_gaps(before, redraw, after).set_index("arm")
    assert g.loc["brorl", "prompts"] == 3 and g.loc["brorl", "control"] == pytest.approx(-0.02 / 3)
    assert g.loc["brorl", "beyond_control"] == pytest.approx(0.02 / 3 + 0.02 / 3)
    assert g.loc["prorl", "beyond_control"] == pytest.approx(0.0)  # fell exactly as far as the re-draw did


def test_takeoff_race_censors_arms_that_never_reach_the_level():
    spec = {}
    for s in range(3):
        spec[("brorl", s)] = [(0, 0.02, 0), (4000, 0.08, 0), (8000, 0.15, 0)]   # +10 points at 8000
        spec[("prorl", s)] = [(0, 0.02, 0), (4000, 0.05, 0), (8000, 0.06, 0)]   # never: censored at the budget
    spec[("prorl", 2)] = [(0, 0.02, 0), (4000, 0.13, 0), (8000, 0.2, 0)]       # seed 2: ProRL first, at 4000
    t = PD.time_to_level(curves(spec), 0.10, budget=8000)
    tt = t.set_index(["arm", "seed"])
    assert tt.loc[("brorl", 0), "time"] == 8000 and tt.loc[("brorl", 0), "reached"]
    assert tt.loc[("prorl", 0), "time"] == 8000 and not tt.loc[("prorl", 0), "reached"]
    r = PD.race(t, budget=8000)
    assert (r["reached_brorl"], r["reached_prorl"], r["first_brorl"], r["first_prorl"], r["ties"]) == (3, 1, 0, 1, 2)
    assert r["restricted_mean_gap"] == pytest.approx(4000 / 3) and r["per_seed"] == {0: 0.0, 1: 0.0, 2: 4000.0}


def test_per_seed_tables_are_written_and_read_back(tmp_path):
    pts = PD.grid_points(curves({("prorl", 0): [(0, 0.5, 0), (10, 0.6, 0)], ("brorl", 0): [(0, 0.5, 0), (12, 0.7, 0)]}),
                         [10])
    (path,) = PD.write_per_seed(tmp_path / "r", {"grid_samples": pts})
    pd.testing.assert_frame_equal(pd.read_csv(path), pts, check_dtype=False)


def test_paid_arms_run_to_their_budget_and_are_measured_at_every_threshold(tmp_path):
    base = recipe_config(model="default", tasks=["gcd"], eval_prompts=4, eval_samples=2, max_new_tokens=6,
                         max_resample_rounds=1, optimizer_steps_per_step=1, torch_threads=1, run_dir=str(tmp_path))
    arms = PD.paid_arm_configs(base, budget=64, points=2, middle=False, n_small=2, prompts_small=4, n_large=8,
                               prompts_large=2)
    df = PD.run_paid(arms, seeds=[0], root=tmp_path / "paid")
    last = df.groupby("arm")["cum_samples"].max()
    assert (last >= 64).all()
    for arm, g in df.groupby("arm"):  # the step that reached the budget was the last
        assert (g["cum_samples"].iloc[:-1] < 64).all(), arm
    pts = PD.grid_points(df, PD.thresholds(64, 2))
    assert pts["value"].notna().all() and (pts["x"] >= pts["mark"]).all()
    assert (df["cum_trained_samples"] <= df["cum_samples"]).all()
    again = PD.run_paid(arms, seeds=[0, 1], root=tmp_path / "paid", jobs=2, threads=1)  # seed 0 read back, not re-run
    assert again[again["seed"] == 0]["cum_samples"].tolist() == df["cum_samples"].tolist()
    assert list(again["run"].unique()) == ["prorl_s0", "brorl_s0", "prorl_s1", "brorl_s1"]
    alone = PD.run_paid(arms, seeds=[1], root=tmp_path / "alone")  # the same seed one after another: the same numbers
    pd.testing.assert_frame_equal(without_timing(again[again["seed"] == 1]), without_timing(alone))
    rep = PD.paid_report(again, budget=64, points=2, takeoff_level=0.5)
    assert rep["race"]["n"] == 2 and rep["race"]["reached_prorl"] + rep["race"]["reached_brorl"] <= 4
    assert "Takeoff race (+50 points" in PD.paid_text(rep)
    assert set(rep["grids"]) == set(PD.AXES) and rep["headline"]["n"] == 2 and rep["headline"]["mark"] == 64
    pts = rep["points"]
    assert set(pts["axis"]) == set(PD.AXES) and len(pts[pts["axis"] == "cum_samples"]) == 2 * 2 * 2  # arms x seeds x marks
    assert {c["arm"] for c in rep["collapse"]} == {"prorl", "brorl"} and len(rep["bounds"]) == 2
    from brorl_lab.core.paths import DEFAULT_MODEL_DIR

    gaps = PD.measure_mechanism(arms, seeds=[0, 1], root=tmp_path / "paid", branch=DEFAULT_MODEL_DIR, prompts=4,
                                n_draws=32, reach="both")
    assert len(gaps) == 4 and set(gaps["arm"]) == {"prorl", "brorl"} and gaps["control"].nunique() == 1
    assert np.allclose(gaps["beyond_control"], gaps["change"] - gaps["control"])
    rep["mechanism"] = PD.control_summary(gaps).to_dict(orient="records")
    text = PD.paid_text(rep)
    assert "beyond the no-training re-draw over 2 seeds" in text
    assert "At equal generated samples (64;" in text and "Collapsed (COLLAPSE rule" in text


def test_a_run_written_before_a_config_field_existed_still_resumes(tmp_path):
    """check_same_config reads a field missing from an older run's config.yaml as its default (e.g. max_samples,
    added with the paid arms), and still refuses a real difference."""
    import yaml

    from brorl_lab.core.validation import UserError
    from brorl_lab.study.recipe import check_same_config

    cfg = recipe_config(model="default", tasks=["gcd"], run_dir=str(tmp_path))
    run = tmp_path / "old"
    run.mkdir()
    old = {k: v for k, v in cfg.to_dict().items() if k not in ("max_samples", "eval_at_samples")}
    (run / "config.yaml").write_text(yaml.safe_dump(old))
    check_same_config(run, cfg)
    with pytest.raises(UserError, match="max_samples"):
        check_same_config(run, cfg.replace(max_samples=10))


@pytest.mark.parametrize("pilot", ["takeoff", "learned"])
def test_the_shipped_pilots_headline_is_recomputed_from_its_per_seed_file(pilot):
    """docs/results/paid.md's interval at equal generated samples, from notebooks/figures/paid_takeoff_pilot_points.csv
    alone (every arm, seed, axis and mark), equals the verdict the run wrote."""
    import json
    from pathlib import Path

    figs = Path(__file__).resolve().parent.parent / "notebooks" / "figures"
    pts = pd.read_csv(figs / f"paid_{pilot}_pilot_points.csv")
    verdict = json.loads((figs / f"paid_{pilot}_pilot_verdict.json").read_text())
    head = verdict["headline"]
    got = PD.paired_at_grid(pts[pts["axis"] == "cum_samples"]).set_index("mark").loc[head["mark"]]
    for k in ("n", "gap", "lo", "hi", "sd"):
        assert got[k] == pytest.approx(head[k]), k
    assert verdict["sizing"]["seeds"] == seeds_for_power(got["sd"], PD.SIZING_EFFECT)


@pytest.mark.parametrize("lo, hi, word", [(0.001, 0.02, "BroRL ahead"), (-0.02, -0.001, "BroRL behind"),
                                          (-0.01, 0.02, "not resolved: the gap is between -1.00 and +2.00 points")])
def test_the_headline_reading_follows_the_interval_only(lo, hi, word):
    assert PD.headline_reading({"n": 10, "gap": (lo + hi) / 2, "lo": lo, "hi": hi}).startswith(word)
    assert PD.headline_reading({"n": 1, "gap": 0.0, "lo": lo, "hi": hi}).startswith("no reading")


def test_the_grid_table_and_figure_rebuild_the_shipped_pilot_from_its_per_seed_file():
    """From the shipped per-seed points alone: the table's last row at equal generated samples is the verdict's
    headline interval, and the figure carries a dot per seed beside each interval."""
    import json
    from pathlib import Path

    figures = Path(__file__).resolve().parent.parent / "notebooks" / "figures"
    points = pd.read_csv(figures / "paid_learned_pilot_points.csv")
    verdict = json.loads((figures / "paid_learned_pilot_verdict.json").read_text())
    h = verdict["headline"]
    last = PD.grid_table(points, "cum_samples").splitlines()[-1]
    assert last.startswith(f"| {h['mark']:,.0f} | {h['n']} |")
    assert last.endswith(f"{100 * h['gap']:+.2f} [{100 * h['lo']:+.2f}, {100 * h['hi']:+.2f}] |")
    fig = PD.paid_figure(verdict)
    dots = [t for t in fig.data if t.name == "one seed"]
    assert len(dots) == len(verdict["grids"]) and all(len(t.y) == h["n"] * len(verdict["grids"][x])
                                                      for t, x in zip(dots, verdict["grids"]))


def test_a_race_where_every_seed_is_censored_is_reported_as_not_resolved():
    rep = {"headline": {}, "bounds": [], "collapse": [], "sizing": {"seeds": None},
           "race": {"level": 0.1, "metric": "eval/x/pass@1", "budget": 100, "n": 3, "reached_brorl": 0,
                    "reached_prorl": 0, "first_brorl": 0, "first_prorl": 0, "ties": 3, "restricted_mean_gap": 0.0,
                    "lo": 0.0, "hi": 0.0}}
    text = PD.paid_text(rep)
    assert "not resolved: neither arm reached the level in any of 3 seeds" in text and "+0 [+0, +0]" not in text


# ---- the one runner (study.runner, issue 42) -----------------------------------------------------------------------
TINY_TABLE = {"prorl": dict(rollouts_per_prompt=2, prompts_per_step=4), "brorl": dict(rollouts_per_prompt=8,
                                                                                      prompts_per_step=2)}


def tiny_study(**changes):
    from brorl_lab.study import runner

    over = dict(lr=3e-4, tasks=["gcd"], eval_prompts=4, eval_samples=2, max_new_tokens=6, max_resample_rounds=1,
                optimizer_steps_per_step=1)
    return runner.Study(**{"name": "tiny", "model": "default", "seeds": (0, 1), "budget": 64, "points": 2,
                           "arms": ("prorl", "brorl"), "overrides": over, "arm_table": TINY_TABLE, **changes})


def test_run_study_writes_the_declaration_the_per_seed_files_and_their_provenance_and_the_cli_reads_them(
        tmp_path, capsys):
    """One runner: the arms' N and prompts per step come from the study's arm table, the per-seed files carry a
    provenance with the start and the declaration, and the CLI's ``paid --read`` gives the runner's reading of the
    same file (the CLI, the notebook and the demo read a folder through study.runner.reading_of_points)."""
    import json

    from brorl_lab.cli import main
    from brorl_lab.study import runner
    from brorl_lab.study.results import SHIPPED_KEYS, read_provenance

    study = tiny_study()
    arms = study.configs()
    assert {a: (c.rollouts_per_prompt, c.prompts_per_step) for a, c in arms.items()} == {"prorl": (2, 4),
                                                                                        "brorl": (8, 2)}
    res = runner.run_study(study, tmp_path / "s", jobs=1, threads=1, progress=False)
    assert res.finished and res.reading == PD.headline_reading(res.report["headline"])
    decl = json.loads((tmp_path / "s" / "declaration.json").read_text())
    assert decl["reading"]["function"] == "brorl_lab.study.paid.headline_reading" and decl["seeds"] == [0, 1]
    assert decl["arms"]["brorl"]["rollouts_per_prompt"] == 8 and decl["budget"]["generated_samples_per_arm"] == 64
    rec = read_provenance(tmp_path / "s" / "points.csv")
    assert set(SHIPPED_KEYS) <= set(rec) and rec["started_at"] <= rec["date"]
    assert rec["declaration"]["path"].endswith("declaration.json") and rec["declaration"]["commit"] is None
    assert runner.reading_of_points(tmp_path / "s" / "points.csv") == res.reading
    capsys.readouterr()
    assert main(["paid", "--read", str(tmp_path / "s" / "points.csv")]) == 0
    assert res.reading in capsys.readouterr().out
    again = runner.run_study(study, tmp_path / "s", jobs=1, threads=1, progress=False)  # read back, not re-run
    assert again.report["headline"]["per_seed"] == res.report["headline"]["per_seed"]



def test_a_study_with_a_ledger_declares_there_writes_a_file_per_run_and_resumes_from_it_alone(tmp_path):
    """run_study(ledger=DIR): the declaration goes to DIR (the folder a shipped run commits), each finished arm x
    seed writes DIR/<arm>_s<seed>.parquet with its provenance, and a second run into a fresh ``out`` (another
    clone: no checkpoints) reads every run back from DIR, trains nothing, and reads the same per-seed values."""
    from brorl_lab.study import runner
    from brorl_lab.study.results import read_provenance

    study, ledger = tiny_study(), tmp_path / "ledger"
    res = runner.run_study(study, tmp_path / "one", jobs=1, threads=1, progress=False, ledger=ledger)
    assert (ledger / "declaration.json").is_file() and not (tmp_path / "one" / "declaration.json").exists()
    files = sorted(p.name for p in ledger.glob("*_s*.parquet"))
    assert files == ["brorl_s0.parquet", "brorl_s1.parquet", "prorl_s0.parquet", "prorl_s1.parquet"]
    assert all(read_provenance(ledger / f)["started_at"] for f in files)
    again = runner.run_study(study, tmp_path / "two", jobs=1, threads=1, progress=False, ledger=ledger)
    assert not (tmp_path / "two" / "arms").exists() or not any((tmp_path / "two" / "arms").iterdir())
    assert again.report["headline"]["per_seed"] == res.report["headline"]["per_seed"]

def test_a_run_meant_for_shipping_refuses_an_uncommitted_declaration_in_one_line(tmp_path):
    from brorl_lab.cli import main

    rc = None
    try:
        main(["paid", "--model", "default", "--ship", "--out", str(tmp_path / "x"), "--seeds", "0", "1",
              "--budget", "64", "--no-middle", "--lr", "3e-4", "--families", "gcd"])
    except SystemExit as e:
        rc = e.code
    assert rc == 2 and (tmp_path / "x" / "declaration.json").is_file()  # written, so it can be committed
    assert not (tmp_path / "x" / "arms").exists()  # nothing ran


def test_the_shipped_readings_through_the_runner_equal_the_shipped_verdicts():
    """The runner's reading of each shipped per-seed file equals the reading the run wrote into its verdict."""
    import json

    from brorl_lab.study import runner

    for name in ("learned", "takeoff"):
        verdict = json.loads(runner.shipped_points(name).with_name(f"paid_{name}_verdict.json").read_text())
        assert runner.reading_of_points(runner.shipped_points(name)) == PD.headline_reading(verdict["headline"])


def test_run_grid_writes_one_ledger_file_per_arm_and_seed_and_reads_them_back_instead_of_running(tmp_path):
    """The grid every whole-Config study shares (frontier, allocation): each finished arm x seed lands in the ledger
    at once with its provenance (config fingerprint, start, declaration); a second call in a fresh output folder (a
    new machine without runs/) reads every run from the ledger and runs nothing; a ledger file of another config is
    refused in one line, never overwritten."""
    from brorl_lab.core.validation import UserError
    from brorl_lab.study import runner
    from brorl_lab.study.results import SHIPPED_KEYS, read_provenance

    arms = tiny_study().configs(threads=1)
    arms = {"a": arms["prorl"], "b": arms["brorl"].replace(lr=1e-4)}  # arms given whole: their own lr
    ledger = tmp_path / "ledger"
    first = runner.run_grid("g", arms, seeds=[0], out=tmp_path / "run1", declaration={"study": "g"},
                            ledger=ledger, threads=1, progress=False)
    assert first.finished and sorted(p.name for p in ledger.glob("*.parquet")) == ["a_s0.parquet", "b_s0.parquet"]
    rec = read_provenance(ledger / "b_s0.parquet")
    assert set(SHIPPED_KEYS) <= set(rec) and rec["lr"] == 1e-4 and rec["config"] == runner.config_fingerprint(arms["b"])
    again = runner.run_grid("g", arms, seeds=[0], out=tmp_path / "run2", declaration={"study": "g"},
                            ledger=ledger, threads=1, progress=False)
    assert again.finished and not (tmp_path / "run2" / "arms").exists()  # nothing ran: all read from the ledger
    pd.testing.assert_frame_equal(again.metrics, first.metrics)
    with pytest.raises(UserError, match="ledger: .*b_s0.parquet holds a run of another config"):
        runner.run_grid("g", {**arms, "b": arms["b"].replace(lr=2e-4)}, seeds=[0], out=tmp_path / "run3",
                        declaration={"study": "g"}, ledger=ledger, threads=1, progress=False)


def test_the_heartbeat_prints_a_line_on_time_with_run_directories_or_a_count(tmp_path, capsys):
    """The runner's plain progress line (papermill, a log file): from the run directories under its root by default,
    from a counting function for a study whose units are not run directories (the theorem: models done)."""
    import time

    from brorl_lab.study import runner

    done = []
    with runner.heartbeat(tmp_path, "t", runs=3, enabled=True, every_s=0.05, count=lambda: len(done), unit="models"):
        done.append(1)
        time.sleep(0.3)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].endswith("t: 3 models to run or read back (a line every 0.05 s)")
    assert any(line.endswith("1 of 3 models finished") for line in lines[1:])
    with runner.heartbeat(tmp_path, "t", runs=2, enabled=True, every_s=0.05):
        time.sleep(0.3)
    assert any(line.endswith("0 of 2 arm runs finished") for line in capsys.readouterr().out.splitlines())


def test_a_config_fingerprints_alike_from_any_checkout(monkeypatch, tmp_path):
    """A ledger written in one clone (a study run from /tmp/study) must resume in another (a fresh machine's
    checkout): the model counts by its repo-relative path; a different model still changes the fingerprint."""
    from brorl_lab.core import paths
    from brorl_lab.study import runner

    cfg = recipe_config(model="takeoff", tasks=["spell_backward"], lr=2e-4, rollouts_per_prompt=4,
                        prompts_per_step=2, steps=1)
    here = runner.config_fingerprint(cfg)
    other_root = tmp_path / "elsewhere"
    monkeypatch.setattr(paths, "REPO_ROOT", other_root)
    moved = cfg.replace(model=str(other_root / Path(cfg.model).relative_to(Path(__file__).resolve().parents[1])))
    assert moved.model != cfg.model and runner.config_fingerprint(moved) == here
    assert runner.config_fingerprint(moved.replace(model=str(other_root / "data" / "learned_plateau"))) != here
