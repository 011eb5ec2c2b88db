"""study.allocation (issue 44): the reading on hand-made per-seed tables with known answers (beats both, beats one and
loses to the other, not resolved), the summary of the trainer's allocation columns, the declaration, and a tiny study
end to end: the uniform arms read from a tiny frontier's ledger (never re-run), the allocation arm run into its own."""

import json

import numpy as np
import pandas as pd
import pytest

from brorl_lab.study import allocation as A
from brorl_lab.study import frontier as F

SEEDS = range(10)
BASE = np.linspace(0.40, 0.58, 10)  # seeds differ; the arms' order need not
WOBBLE = np.array([0.02, -0.01] * 5)  # mean +0.005, sd 0.016: a 10-seed interval contains 0


def points(values: dict, mark=1000, branch=None) -> pd.DataFrame:
    rows = pd.DataFrame([{"arm": arm, "seed": s, "mark": mark, "value": float(v[i])}
                         for arm, v in values.items() for i, s in enumerate(SEEDS)])
    return rows if branch is None else rows.assign(branch=branch)


def test_the_reading_says_beats_both_only_when_both_intervals_lie_above_zero():
    t = A.allocation_table(points({"two_stage": BASE + 0.03 + WOBBLE / 4, "n16x64": BASE, "n512x16": BASE + 0.01}),
                           allocation="two_stage", uniform=["n16x64", "n512x16"])
    r = t.iloc[0]
    assert r["reading"] == "two_stage beats both (n16x64, n512x16)" and r["beats_both"]
    assert r["lo_n16x64"] > 0 and r["lo_n512x16"] > 0 and r["n_n16x64"] == 10
    assert r["gap_n512x16"] == pytest.approx(0.02 + 0.005 / 4)


def test_the_reading_names_what_it_beats_what_it_loses_to_and_what_is_not_resolved():
    beats_one = points({"until_signal": BASE + 0.02, "n16x64": BASE - WOBBLE, "n512x16": BASE + 0.05 + WOBBLE / 4})
    open_one = points({"until_signal": BASE + WOBBLE, "n16x64": BASE, "n512x16": BASE - 0.03 + WOBBLE / 4}, mark=2000)
    t = A.allocation_table(pd.concat([beats_one, open_one]), allocation="until_signal", uniform=["n16x64", "n512x16"])
    assert t["mark"].tolist() == [1000, 2000]
    assert t["reading"].tolist() == ["until_signal beats n16x64; loses to n512x16",
                                     "until_signal beats n512x16; not resolved against n16x64"]
    assert t.loc[0, "hi_n512x16"] < 0 and t.loc[1, "lo_n16x64"] < 0 < t.loc[1, "hi_n16x64"]
    assert (t.loc[0, "beats"], t.loc[0, "loses_to"], t.loc[1, "not_resolved"]) == (["n16x64"], ["n512x16"], ["n16x64"])
    assert not t["beats_both"].any()


def test_the_reading_is_per_branch_point_and_one_seed_or_a_censored_arm_is_not_resolved():
    a = points({"two_stage": BASE + 0.05, "n16x64": BASE, "n512x16": BASE}, branch="learned")
    b = points({"two_stage": BASE + 0.05, "n16x64": BASE, "n512x16": [np.nan] * 10}, branch="takeoff")
    t = A.allocation_table(pd.concat([a, b]), allocation="two_stage", uniform=["n16x64", "n512x16"]).set_index("branch")
    assert t.loc["learned", "beats_both"] and t.loc["takeoff", "n_n512x16"] == 0
    assert t.loc["takeoff", "reading"] == "two_stage beats n16x64; not resolved against n512x16"
    one = A.allocation_table(points({"two_stage": BASE + 0.05, "n16x64": BASE}).query("seed == 0"),
                             allocation="two_stage", uniform=["n16x64"])
    assert one.loc[0, "reading"] == "two_stage not resolved against n16x64"
    with pytest.raises(ValueError, match=r"no rows of arm\(s\) \['n512x16'\]"):
        A.allocation_table(a[a["arm"] != "n512x16"], allocation="two_stage", uniform=["n16x64", "n512x16"])


def test_the_summary_reads_the_informative_share_and_the_n_histogram_from_the_metrics():
    rows = []
    for seed, info in ((0, (2, 4)), (1, (3, 3))):  # two steps a seed: 4 groups of 16 samples in total each step
        for step, k in enumerate(info, start=1):
            rows.append({"arm": "two_stage", "seed": seed, "step": step, "samples": 64,
                         "alloc/informative_groups": k, "alloc/informative_sample_share": k * 8 / 64,
                         "alloc/n_max": 40, "alloc/n_le_8": 3, "alloc/n_le_64": 1, "alloc/n_gt_1024": 0})
        rows.append({"arm": "two_stage", "seed": seed, "step": 0, "samples": 0})  # the evaluation row: not counted
    s = A.allocation_summary(pd.DataFrame(rows)).iloc[0]
    assert s["seeds"] == 2 and s["informative_per_sample"] == pytest.approx(6 / 128)
    assert s["informative_sample_share"] == pytest.approx(6 * 8 / 128) and s["n_mean"] == 16 and s["n_max"] == 40
    assert (s["share_n_le_8"], s["share_n_le_64"], s["share_n_gt_1024"]) == (0.75, 0.25, 0.0)



def test_the_signal_gap_pairs_each_seeds_informative_rate_and_its_histogram_renders_the_filled_bins():
    """signal_gaps: allocation minus uniform in informative groups per generated sample, paired by seed (a per-seed
    shift of +1/64 with a spread gives an interval above 0; the reverse below); the page's histogram cell names only
    the bins that hold groups, each with its share."""
    from brorl_lab.lab.stats import paired_t_interval
    from brorl_lab.study.render import _n_histogram

    rows = []
    for seed, (mine, theirs) in enumerate([(5, 3), (4, 3), (6, 4), (5, 4)]):
        for arm, k in (("two_stage", mine), ("n16x64", theirs)):
            rows.append({"branch": "learned", "arm": arm, "seed": seed, "step": 1, "samples": 64,
                         "alloc/informative_groups": k, "alloc/n_max": 16, "alloc/n_le_16": 4})
    m = pd.DataFrame(rows)
    g = A.signal_gaps(m, allocation="two_stage", uniform=["n16x64"]).iloc[0]
    ref = paired_t_interval([5 / 64, 4 / 64, 6 / 64, 5 / 64], [3 / 64, 3 / 64, 4 / 64, 4 / 64])
    assert (g["branch"], g["uniform"], g["n"]) == ("learned", "n16x64", 4)
    assert (g["gap"], g["lo"], g["hi"]) == pytest.approx((ref["mean"], ref["lo"], ref["hi"])) and g["lo"] > 0
    flipped = A.signal_gaps(m.assign(arm=m["arm"].map({"two_stage": "n16x64", "n16x64": "two_stage"})),
                            allocation="two_stage", uniform=["n16x64"]).iloc[0]
    assert flipped["hi"] < 0 and flipped["gap"] == pytest.approx(-g["gap"])
    cell = _n_histogram({"share_n_le_2": 0.0, "share_n_le_4": 0.012, "share_n_le_8": 0.0001, "share_n_le_16": 0.768,
                         "share_n_le_32": 0.2199, "share_n_gt_1024": 0.0, "n_mean": 16.0})
    assert cell == "3-4: 1.2%, 5-8: < 0.1%, 9-16: 76.8%, 17-32: 22.0%"

def test_the_declaration_shares_the_frontiers_uniform_arms_and_names_its_reading():
    decl = A.ALLOCATION.to_declaration()
    assert json.loads(json.dumps(decl)) == decl and decl["status"].startswith("pre-registered")
    assert decl["shared_uniform_arms"]["arms"] == ["n16x64", "n512x16"] and decl["shared_uniform_arms"]["never_rerun"]
    assert decl["reading"]["function"] == "brorl_lab.study.allocation.allocation_table"
    assert decl["seeds"] == list(F.FRONTIER.seeds) and decl["budget"]["marks"] == {
        b: F.FRONTIER.budget_marks(b) for b in F.FRONTIER.branches}
    arms = decl["allocation_arms"]
    assert (arms["prompts_per_step"], arms["rollouts_per_prompt"], arms["allocation_cap"]) == (64, 16, 512)
    picks = {b: {"n16x64": 2e-4, "n64x32": 2e-4, "n512x16": 1e-4} for b in F.FRONTIER.branches}
    cfg = A.ALLOCATION.stage_arms("two_stage", picks)["learned-n16x64-two_stage"]
    shared = F.FRONTIER.stage_arms("ratio", picks=picks)["learned-n16x64"]
    changed = {k for k, v in cfg.to_dict().items() if shared.to_dict()[k] != v}
    assert changed == {"rollout_allocation"} and cfg.samples_per_step == 1024 and cfg.lr == 2e-4
    assert (cfg.allocation_probe, cfg.allocation_cap) == (4, 512)


def test_the_committed_declaration_is_the_studys():
    from pathlib import Path

    path = Path(A.LEDGER) / "declaration.json"
    text = json.dumps(A.ALLOCATION.to_declaration(), indent=1, sort_keys=True, default=str) + "\n"
    assert path.read_text() == text  # a change to the design needs a new, committed declaration before any run


def test_a_tiny_study_reads_the_uniform_arms_from_the_frontier_ledger_and_runs_only_its_own(tmp_path, capsys):
    """End to end at tiny sizes through study.runner.run_grid: a tiny frontier's ratio stage runs its two uniform arms
    into its ledger; the allocation study refuses to start without the frontier's lr picks, then runs only its
    two_stage arm into its own ledger (no uniform run under its folder, the frontier's files untouched), and the
    reading, read from both ledgers, names every uniform arm; the CLI's errors are one line, exit 2."""
    from brorl_lab.study.runner import ledger_file

    fr = F.Frontier(name="tiny", branches=("learned",), ratio_arms={2: 4, 8: 2}, budgets={"learned": 48}, marks=2,
                    seeds=(1,), round_cap=5, eval_prompts=4, eval_samples=2)
    fl = tmp_path / "frontier"
    study = A.AllocationStudy(name="tiny_alloc", frontier=fr, frontier_ledger=fl, probe=1, round_size=1)
    with pytest.raises(ValueError, match="lr_picks.csv is missing"):
        A.run_stage("two_stage", out=tmp_path / "runs", ledger=tmp_path / "alloc", ship=False, study=study, jobs=1,
                    progress=False)
    (fl / "lr_pilot").mkdir(parents=True)
    pd.DataFrame({"branch": "learned", "arm": ["n2x4", "n8x2"], "lr": [1e-3, 1e-3]}).to_csv(
        fl / "lr_pilot" / "lr_picks.csv", index=False)
    ratio = F.run_stage("ratio", out=tmp_path / "runs_frontier", ledger=fl, ship=False, frontier=fr, jobs=1,
                        progress=False)
    assert ratio.finished
    shared = {p: p.stat().st_mtime_ns for p in (fl / "ratio").glob("*.parquet")}
    assert sorted(p.name for p in shared) == ["learned-n2x4_s1.parquet", "learned-n8x2_s1.parquet"]

    grid = A.run_stage("two_stage", out=tmp_path / "runs", ledger=tmp_path / "alloc", ship=False, study=study, jobs=1,
                       progress=False)
    assert grid.finished and set(grid.metrics["arm"]) == {"learned-n2x4-two_stage"}
    runs = (tmp_path / "runs" / "two_stage" / "arms").iterdir()
    assert [d.name for d in runs if d.is_dir()] == ["learned-n2x4-two_stage_s1"]  # its own arm, nothing else
    assert ledger_file(tmp_path / "alloc" / "two_stage", "learned-n2x4-two_stage", 1).is_file()
    assert {p: p.stat().st_mtime_ns for p in (fl / "ratio").glob("*.parquet")} == shared  # read, never re-run
    m = grid.metrics
    assert (m.loc[m["step"] > 0, "samples"] % 8 == 0).all() and m["cum_samples"].max() >= 48
    assert m["alloc/n_max"].max() <= 8 and m["alloc/n_min"].min() >= 1  # the cap: the largest uniform arm's N

    got = A.read_stage("two_stage", ledger=tmp_path / "alloc", study=study)
    assert got.complete and sorted(set(got.points["arm"])) == ["n2x4", "n8x2", "two_stage"]
    assert got.table["mark"].tolist() == fr.budget_marks("learned")
    assert (got.table["reading"] == "two_stage not resolved against n2x4, n8x2").all()  # one seed: no interval
    assert set(got.summary["arm"]) == {"n2x4", "n8x2", "two_stage"}
    assert got.summary.set_index("arm").loc["n8x2", "n_max"] == 8
    # the results page reads the same two ledgers once the branch point is complete
    from brorl_lab.study import render as R

    (tmp_path / R.FIG).mkdir(parents=True)
    fl.rename(tmp_path / R.FRONTIER_LEDGER)
    (tmp_path / "alloc").rename(tmp_path / R.ALLOCATION_LEDGER)
    page = R.allocation_fields(R.Files(tmp_path), study=study)
    assert "| `two_stage` |" in page["allocation_stages"] and "| 1 of 1 | learned n2x4: 1 of 1" in page["allocation_stages"]
    text = page["allocation_readings"]
    assert "### `two_stage` from the learned branch point" in text and "two_stage not resolved against n2x4, n8x2" in text
    assert "| two_stage | 1 |" in text  # the summary: informative groups per generated sample, N per prompt
    capsys.readouterr()
    assert A.main(["run", "two_stage", "--out", str(tmp_path / "cli"), "--exploratory", "--jobs", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ")


def test_the_design_pages_pilot_table_comes_from_the_shipped_pilot_files():
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    steps = pd.read_csv(root / "notebooks/figures/allocation/allocation_pilot_steps.csv")
    summary = pd.read_csv(root / "notebooks/figures/allocation/allocation_pilot.csv")
    pd.testing.assert_frame_equal(A.pilot_summary(steps), summary, check_dtype=False)  # the summary is of these steps
    page = (root / "docs/results/allocation_design.md").read_text()
    block = page.split("<!-- pilot-table -->\n", 1)[1].split("\n<!-- /pilot-table -->", 1)[0]
    assert block == A.pilot_markdown(summary, steps)
