"""study.frontier: the frontier's readings on synthetic per-seed tables with known answers, the lr rule, the refill
pilot's cap-binding table, budgets and marks, and the declaration."""

import json
import math

import numpy as np
import pandas as pd
import pytest

from brorl_lab.lab.stats import seeds_for_power
from brorl_lab.study import frontier as F

SEEDS = range(10)
WOBBLE = np.array([0.02, -0.01] * 5)  # per-seed: mean +0.005, sd 0.016 -> a 10-seed interval contains 0


def points(values: dict, mark=1000) -> pd.DataFrame:
    """grid_points' shape: one row per arm and seed at ``mark``."""
    return pd.DataFrame([{"arm": arm, "seed": s, "mark": mark, "value": float(v[i])}
                         for arm, v in values.items() for i, s in enumerate(SEEDS)])


def test_best_n_reads_n16_best_when_every_interval_clears_zero():
    base = np.linspace(0.5, 0.6, 10)  # seeds differ; the arms' order does not
    b = F.best_n(points({"n16x64": base + 0.03 + WOBBLE / 4, "n64x32": base, "n512x16": base - 0.05}), 1000)
    assert b["reading"] == "N=16 best" and b["resolved"] and b["leader_n"] == 16
    assert all(g["lo"] > 0 for g in b["gaps"]) and [g["other"] for g in b["gaps"]] == ["n64x32", "n512x16"]


def test_best_n_reads_not_resolved_and_names_the_tied_arms():
    base = np.linspace(0.5, 0.6, 10)
    b = F.best_n(points({"n16x64": base + WOBBLE, "n64x32": base, "n512x16": base - 0.05}), 1000)
    assert b["reading"] == "not resolved: N=16, N=64" and not b["resolved"]
    gap = next(g for g in b["gaps"] if g["other"] == "n64x32")
    assert gap["lo"] < 0 < gap["hi"] and gap["gap"] == pytest.approx(0.005)


def test_frontier_table_reads_every_mark_and_skips_marks_one_arm_reached():
    base = np.linspace(0.5, 0.6, 10)
    early = points({"n16x64": base + WOBBLE, "n64x32": base, "n512x16": base - 0.05}, mark=100)
    late = points({"n16x64": base, "n64x32": base - 0.01, "n512x16": base + 0.04 + WOBBLE / 4}, mark=800)
    lone = points({"n16x64": base, "n64x32": [np.nan] * 10, "n512x16": [np.nan] * 10}, mark=1600)
    t = F.frontier_table(pd.concat([early, late, lone]))
    assert t["mark"].tolist() == [100, 800]
    assert t["reading"].tolist() == ["not resolved: N=16, N=64", "N=512 best"]
    assert t.loc[1, "lo_n16x64"] > 0


def test_pick_lr_takes_the_best_lr_within_the_kl_bound():
    rows = []
    for seed in range(3):
        for lr, value, within in ((1e-4, 0.50, 100), (2e-4, 0.55, 100), (4e-4, 0.60, 96), (8e-4, 0.70, 50)):
            rows.append({"arm": "n16x64", "lr": lr, "seed": seed, "value": value, "steps": 100, "kl_within": within})
            rows.append({"arm": "n512x16", "lr": lr, "seed": seed, "value": value, "steps": 100, "kl_within": 90})
    out = F.pick_lr(pd.DataFrame(rows)).set_index("arm")
    assert out.loc["n16x64", "lr"] == 4e-4 and out.loc["n16x64", "qualified"] == [1e-4, 2e-4, 4e-4]
    assert math.isnan(out.loc["n512x16", "lr"])  # no lr kept KL within the bound on 95% of steps
    assert F.sqrt_rule_lr(4e-4, (16, 64), (512, 16)) == pytest.approx(4e-4 * math.sqrt(8))


def test_lr_pilot_rows_count_kl_steps_and_read_the_mark():
    df = pd.DataFrame({"arm": "a", "lr": 1e-4, "seed": 0, "step": [0, 1, 2, 3], "kl": [np.nan, 0.1, 0.7, 0.2],
                       "cum_samples": [0, 100, 200, 300], "m": [0.5, np.nan, 0.6, 0.7]})
    r = F.lr_pilot_rows(df, mark=150, metric="m").iloc[0]
    assert (r["steps"], r["kl_within"], r["value"]) == (3, 2, 0.6)


def test_takeoff_races_resolve_only_when_the_reference_mostly_reached_the_level():
    rows = []
    for seed in SEEDS:
        for arm, reach_at in (("n16x64", 300 if seed < 9 else None), ("n512x16", 200)):
            for step, x in enumerate((0, 100, 200, 300, 400)):
                v = 0.3 + (0.15 if reach_at is not None and x >= reach_at else 0.0)
                rows.append({"arm": arm, "seed": seed, "step": step, "cum_samples": x, "m": v})
    r = F.takeoff_races(pd.DataFrame(rows), reference="n16x64", budget=400, metric="m").iloc[0]
    assert r["reference_share"] == 0.9 and r["resolved"] and r["reached_arm"] == 10 and r["first_arm"] == 10
    assert r["hi"] < 0  # N=512 got there sooner, by 100 samples (200 in the censored seed)


def test_seeds_for_gap_is_the_power_rule_at_half_a_point():
    gaps = [0.004, -0.006, 0.011, 0.001, -0.003]
    r = F.seeds_for_gap(gaps)
    assert r["seeds"] == seeds_for_power(float(np.std(gaps, ddof=1)), 0.005) and r["effect"] == 0.005


def test_cap_binding_counts_steps_that_needed_more_refills_than_the_cap():
    steps = pd.DataFrame({"branch": "learned", "arm": "n16x64", "N": 16, "prompts_per_step": 64,
                          "refill_rounds": [3, 9, 17, 63], "ds_cap_hit": [False, False, False, True],
                          "samples": [4096, 10240, 18432, 65536], "updates": 2, "kept_groups": [64, 64, 64, 40],
                          "ds_generated_groups": [256, 640, 1152, 4096], "step_wall_s": 1.0})
    t = F.cap_binding(steps, caps=(4, 8, 16, 32)).set_index("cap")
    assert t["bound"].tolist() == [3, 3, 2, 1]  # the step that hit the pilot's own cap binds at every cap
    assert t.loc[4, "samples_per_update"] == pytest.approx(98304 / 8) and t.loc[4, "refills_max"] == 63
    assert t.loc[32, "lo"] > 0 and t.loc[32, "share"] == 0.25


def test_arms_budgets_and_marks():
    assert [F.ratio_prompts(n) for n in (4, 16, 64, 128, 512)] == [128, 64, 32, 32, 16]
    assert {n * p for n, p in F.FIXED_BATCH_ARMS.items()} == {F.FIXED_BATCH_SAMPLES}
    assert F.log_marks(1024, 4) == [128, 256, 512, 1024]
    assert F.size_budget(10_000, updates=64, margin=1.25) == 851_968  # 800k rounded up to 13 x 65,536
    assert F.size_budget(1, at_least=1_000_000) == 1_048_576


def test_declaration_and_configs():
    fr = F.Frontier(budgets={"takeoff": 131_072, "learned": 65_536}, round_cap=32)
    decl = fr.to_declaration()
    assert json.loads(json.dumps(decl)) == decl and decl["status"].startswith("pre-registered")
    assert decl["designs"]["ratio"] == {"n16x64": {"rollouts_per_prompt": 16, "prompts_per_step": 64},
                                        "n64x32": {"rollouts_per_prompt": 64, "prompts_per_step": 32},
                                        "n512x16": {"rollouts_per_prompt": 512, "prompts_per_step": 16}}
    assert decl["budget"]["marks"]["learned"][-1] == 65_536 and decl["lr"]["rule"].endswith("pick_lr")
    cfgs = fr.configs("takeoff", "fixed", lrs={"n512x16": 2e-4})
    assert {a: (c.rollouts_per_prompt, c.prompts_per_step) for a, c in cfgs.items()} == {
        "n16x512": (16, 512), "n64x128": (64, 128), "n512x16": (512, 16)}
    c = cfgs["n512x16"]
    assert (c.lr, c.max_resample_rounds, c.max_samples, c.tasks) == (2e-4, 32, 131_072, ["spell_backward"])
    assert c.eval_at_samples == F.log_marks(131_072) and cfgs["n16x512"].lr == 3e-4
    assert fr.configs("learned", capped=True)["n16x64"].max_resample_rounds == 4
    assert decl["stages"]["lr_pilot"]["seeds"] == [0, 1, 2] and decl["stages"]["ratio"]["seeds"] == list(range(10))
    pilot = F.FRONTIER.stage_arms("lr_pilot")  # every 4:1 arm x lr x branch point, at the pilot budget
    assert len(pilot) == 2 * 3 * 4 and pilot["takeoff-n512x16-lr0.0008"].lr == 8e-4
    assert pilot["learned-n16x64-lr0.0001"].max_samples == 114_688
    picks = {b: {"n16x64": 4e-4, "n64x32": 2e-4, "n512x16": 1e-4} for b in ("takeoff", "learned")}
    fixed = F.FRONTIER.stage_arms("fixed", picks=picks)  # every fixed-batch arm at the n512x16 pick
    assert {c.lr for c in fixed.values()} == {1e-4} and len(fixed) == 4  # n512x16 is the ratio stage's run
    ratio = F.FRONTIER.stage_arms("ratio", picks=picks)
    assert F.FRONTIER.shared_fixed_arms() == ("n512x16",) and "takeoff-n512x16" not in fixed
    assert F.FRONTIER.configs("takeoff", "fixed", lrs={"n512x16": 1e-4}, race_evals=True)["n512x16"] \
        == ratio["takeoff-n512x16"]
    assert F.FRONTIER.stage_arms("capped", picks=picks)["takeoff-n16x64"].max_resample_rounds == 4
    with pytest.raises(ValueError, match="picks: no lr picks"):
        F.FRONTIER.stage_arms("ratio")
    # the amendment: the takeoff pilot again at 5x its budget, read at its end; one branch point at a time
    long = F.FRONTIER.stage_arms("lr_pilot_long")
    assert len(long) == 3 * 4 and {a.split("-")[0] for a in long} == {"takeoff"}
    assert {c.max_samples for c in long.values()} == {5 * F.FRONTIER.lr_pilot_budget["takeoff"]}
    assert long["takeoff-n512x16-lr0.0001"].eval_at_samples[-2:] == [524_288, 655_360]
    assert F.FRONTIER.to_declaration()["lr"]["amendment"]["pilot_long_budget"] == {"takeoff": 655_360}
    assert {a.split("-")[0] for a in F.FRONTIER.stage_arms("ratio", picks=picks, branches=["learned"])} == {"learned"}
    with pytest.raises(ValueError, match="branches: got \\['somewhere'\\]; allowed: one or more of takeoff, learned"):
        F.FRONTIER.stage_arms("ratio", picks=picks, branches=["somewhere"])
    with pytest.raises(ValueError, match="round_cap"):
        F.Frontier(round_cap=4)
    # the seed amendment: the two ablations on the first 5 of the primary's paired seeds, the primary on all 10
    shipped = F.FRONTIER.to_declaration()
    assert [shipped["stages"][st]["seeds"] for st in ("ratio", "fixed", "capped")] == [list(range(10)), [0, 1, 2, 3, 4],
                                                                                     [0, 1, 2, 3, 4]]
    assert shipped["seed_amendment"]["stages"] == ["fixed", "capped"] and "seed_amendment" not in decl
    with pytest.raises(ValueError, match=r"ablation_seeds: got \[10\]; allowed: a non-empty subset of seeds"):
        F.Frontier(ablation_seeds=(10,))
    with pytest.raises(ValueError, match=r"race_eval_every\['takeoff'\]"):
        F.Frontier(race_eval_every={"takeoff": 0})
    with pytest.raises(ValueError, match="race_eval_every: got branch 'moon'; allowed: takeoff, learned"):
        F.Frontier(race_eval_every={"moon": 4096})
    # the race amendment: from takeoff the main stages also evaluate every 32,768 samples; the marks stay, the
    # learned branch point and the pilots are unchanged (their ledgers' configs still match)
    dense = ratio["takeoff-n16x64"].eval_at_samples
    assert set(F.FRONTIER.budget_marks("takeoff")) <= set(dense) and len(dense) == 2 + 32
    assert ratio["learned-n16x64"].eval_at_samples == F.FRONTIER.budget_marks("learned")
    assert long["takeoff-n16x64-lr0.0001"].eval_at_samples == F.log_marks(655_360 * 8 // 5)[:-1] + [655_360]
    assert shipped["evaluation"]["race_every"]["samples"] == {"takeoff": 32_768}


def test_budgets_from_pilot_and_its_table():
    rows = [{"branch": b, "arm": a, "N": F.arm_n(a), "prompts_per_step": 64, "cap": c, "steps": 5, "bound": 5 - i,
             "share": 0.0, "lo": 0.0, "hi": 0.43, "samples_per_update": spu, "q": 0.1, "refills_mean": 3.0,
             "refills_max": 4}
            for b in ("takeoff", "learned") for a, spu in (("n16x64", 8000.0), ("n512x16", 12000.0))
            for i, c in enumerate((4, 8))]
    t = pd.DataFrame(rows)
    b = F.budgets_from_pilot(t)
    assert b["learned"] == F.size_budget(12000.0) == 983_040  # 64 updates x 12,000 x 1.25 = 960,000 -> 15 x 65,536
    assert b["takeoff"] == F.size_budget(12000.0, at_least=1_000_000) == 1_048_576  # 100 x 8,000 x 1.25 < 1M
    md = F.pilot_markdown(t).splitlines()
    assert len(md) == 2 + 4 and md[2].startswith("| takeoff | n16x64 | 5 | 3.0 (4) | 0.100 | 8,000 | 5/5 [0.00, 0.43] |")


def test_the_declared_budgets_and_the_design_pages_pilot_table_come_from_the_shipped_pilot():
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    refill = pd.read_csv(root / "notebooks/figures/frontier_pilot_refill.csv")
    assert F.FRONTIER.budgets == F.budgets_from_pilot(refill)
    assert F.FRONTIER.round_cap > 2 * refill["refills_max"].max()
    assert {b: v // 8 for b, v in F.FRONTIER.budgets.items()} == F.FRONTIER.lr_pilot_budget
    page = (root / "docs/results/frontier_design.md").read_text()
    block = page.split("<!-- pilot-table -->\n", 1)[1].split("\n<!-- /pilot-table -->", 1)[0]
    assert block == F.pilot_markdown(refill)
    noise = pd.read_csv(root / "notebooks/figures/noise_scale.csv")
    block = page.split("<!-- noise-table -->\n", 1)[1].split("\n<!-- /noise-table -->", 1)[0]
    assert block == F.noise_markdown(noise)



def test_the_stages_run_through_the_study_runner_into_a_ledger_and_the_pilot_picks_feed_the_frontier(tmp_path):
    """A tiny frontier, end to end through study.runner.run_grid: the lr pilot runs every arm x lr x seed into its
    ledger and writes lr_picks.csv by the declared rule; the primary stage takes each arm's pick from that file and
    refuses to start without it; a second call reads every run from the ledger."""
    import pandas as pd

    from brorl_lab.study import frontier as F
    from brorl_lab.study import render as R
    from brorl_lab.study.results import read_provenance

    fr = F.Frontier(name="tiny", branches=("learned",), ratio_arms={2: 4, 8: 2}, budgets={"learned": 64}, marks=2,
                    seeds=(1,), lr_grid=(1e-4, 1e-3), lr_seeds=(1,), lr_pilot_budget={"learned": 32},
                    round_cap=5, eval_prompts=4, eval_samples=2)
    with pytest.raises(ValueError, match="needs the lr picks"):
        F.run_stage("ratio", out=tmp_path / "runs", ledger=tmp_path / "ledger", ship=False, frontier=fr, jobs=1,
                    progress=False)
    pilot = F.run_stage("lr_pilot", out=tmp_path / "runs", ledger=tmp_path / "ledger", ship=False, frontier=fr,
                        jobs=1, progress=False)
    assert pilot.finished and len(list((tmp_path / "ledger" / "lr_pilot").glob("*_s*.parquet"))) == 4
    picks = pd.read_csv(tmp_path / "ledger" / "lr_pilot" / "lr_picks.csv")
    assert list(picks["arm"]) == ["n2x4", "n8x2"] and picks["lr"].isin([1e-4, 1e-3]).all()
    # the results page reads the same ledger: one row per arm x lr with each seed's value, and the picks
    (tmp_path / R.FRONTIER_LEDGER).parent.mkdir(parents=True)
    (tmp_path / "ledger").rename(tmp_path / R.FRONTIER_LEDGER)
    page = R.frontier_fields(R.Files(tmp_path))
    assert "| `lr_pilot` | learned | n8x2 | 0.001 | 1 |" in page["frontier_lr_pilot"]
    assert "| 4 of 4 |" in page["frontier_stages"]
    assert f"| `lr_pilot` | learned | n8x2 | {picks.set_index('arm').loc['n8x2', 'lr']:g} |" in page["frontier_picks"]
    (tmp_path / R.FRONTIER_LEDGER).rename(tmp_path / "ledger")
    ratio = F.run_stage("ratio", out=tmp_path / "runs", ledger=tmp_path / "ledger", ship=False, frontier=fr, jobs=1,
                        progress=False)
    assert ratio.finished and ratio.metrics["cum_samples"].groupby(ratio.metrics["run"]).max().ge(64).all()
    assert read_provenance(tmp_path / "ledger" / "ratio" / "learned-n8x2_s1.parquet")["lr"] == float(
        picks.set_index("arm").loc["n8x2", "lr"])
    # the page reads the complete branch point: the best N per mark on each axis, the protocol's checks, a figure
    (tmp_path / "ledger").rename(tmp_path / R.FRONTIER_LEDGER)
    assert R.frontier_complete(tmp_path) == ["learned"]
    files = R.Files(tmp_path)
    text = R.frontier_fields(files)["frontier_ratio"]
    assert "### From the learned branch point" in text and "| n8x2 | 1 |" in text
    assert "At equal generated samples (N=" in text and "| best N |" in text
    assert R.frontier_png(files, "learned")[:8] == b"\x89PNG\r\n\x1a\n"
    row = R.frontier_headline(files)  # the README's row for a complete branch point, with the reading at the budget
    assert row.startswith("| which N wins") and "from the learned branch point: N in 2, 8" in row and row.endswith("|\n")
    (tmp_path / R.FRONTIER_LEDGER).rename(tmp_path / "ledger")
    again = F.run_stage("lr_pilot", out=tmp_path / "runs2", ledger=tmp_path / "ledger", ship=False, frontier=fr,
                        jobs=1, progress=False)
    assert again.finished and not (tmp_path / "runs2" / "lr_pilot" / "arms").exists()
    # an amendment naming the branch point: its picks come from the longer pilot, which must finish first
    import dataclasses

    amended = dataclasses.replace(fr, lr_pilot_long_budget={"learned": 48})
    with pytest.raises(ValueError, match="needs the lr picks of stage 'lr_pilot_long'"):
        F.run_stage("ratio", out=tmp_path / "runs", ledger=tmp_path / "ledger", ship=False, frontier=amended, jobs=1,
                    progress=False)
    long = F.run_stage("lr_pilot_long", out=tmp_path / "runs", ledger=tmp_path / "ledger", ship=False,
                       frontier=amended, jobs=1, progress=False)
    assert long.finished and long.metrics["cum_samples"].groupby(long.metrics["run"]).max().ge(48).all()
    long_picks = pd.read_csv(tmp_path / "ledger" / "lr_pilot_long" / "lr_picks.csv")
    assert F.stage_picks(tmp_path / "ledger", amended) == F.picks_of(long_picks)
    assert F.stage_picks(tmp_path / "ledger", fr) == F.picks_of(picks)


def test_the_per_update_reading_pairs_the_largest_n_with_the_smallest_at_each_mark_and_sizes_the_seeds():
    """per_update_reading: at each updates mark the largest-N arm minus the smallest on paired seeds (a middle arm is
    ignored), a mark with fewer than 2 pairs left out, and seeds_for_gap of the per-seed gaps at the last mark."""
    from brorl_lab.lab.stats import paired_t_interval

    rows = []
    gaps = {2: [-0.010, -0.012, -0.008], 4: [-0.020, -0.015, -0.025]}
    for mark, g in gaps.items():
        for seed, d in enumerate(g):
            rows += [{"arm": "n16x64", "seed": seed, "mark": mark, "value": 0.5},
                     {"arm": "n64x32", "seed": seed, "mark": mark, "value": 0.9},
                     {"arm": "n512x16", "seed": seed, "mark": mark, "value": 0.5 + d}]
    rows += [{"arm": "n16x64", "seed": 0, "mark": 8, "value": 0.5}, {"arm": "n512x16", "seed": 0, "mark": 8, "value": 0.4}]
    t, sized = F.per_update_reading(pd.DataFrame(rows), level=0.95, effect=0.005)
    assert t["mark"].tolist() == [2.0, 4.0] and t["n"].tolist() == [3, 3]  # mark 8: one pair, not read
    for r in t.itertuples():
        ref = paired_t_interval([0.5 + d for d in gaps[int(r.mark)]], [0.5] * 3)
        assert (r.gap, r.lo, r.hi) == pytest.approx((ref["mean"], ref["lo"], ref["hi"]))
    ref = F.seeds_for_gap(gaps[4], 0.005)
    assert sized["seeds"] == ref["seeds"] >= 2 and sized["sd"] == pytest.approx(ref["sd"]) and sized["from_seeds"] == 3
    with pytest.raises(ValueError, match="allowed: points holding n512x16 and n4x128"):
        F.per_update_reading(pd.DataFrame(rows), small="n4x128")



def test_the_noise_clause_says_below_only_when_every_point_of_the_branch_is_below(monkeypatch):
    """render.noise_clause: all of a branch point's points below B_simple's interval -> the 'below its critical
    batch' sentence; any point inside or above -> a tally and no such sentence; points without a matching update
    ("-") and other branch points are not counted."""
    from brorl_lab.study import render as R

    def frame(sides):
        return pd.DataFrame({"branch": ["learned"] * len(sides) + ["takeoff"], "side": [*sides, "above its interval"]})

    monkeypatch.setattr(R, "_noise_points", lambda f: frame(["below its interval"] * 3 + ["-"]))
    text = R.noise_clause(None, "learned")
    assert "at every one of its 3 points" in text and "below its critical batch" in text
    monkeypatch.setattr(R, "_noise_points", lambda f: frame(["below its interval", "inside its interval"]))
    text = R.noise_clause(None, "learned")
    assert "over 2 points: below at 1, inside at 1" in text and "critical batch" not in text
    monkeypatch.setattr(R, "_noise_points", lambda f: frame(["-"]))
    assert R.noise_clause(None, "learned") == ""


def test_race_table_censors_each_axis_at_its_horizon_and_counts_who_got_there_first():
    """The takeoff race on three axes, on a table with known answers: N=16 reaches +10 points at 200 samples (seeds
    0-2), N=512 at 100 samples in seed 0 only; on updates the horizon is the shortest run's end (N=512's 4 updates),
    so N=16's hit at update 8 lies past it and counts as censored there."""
    rows = []
    for seed in range(3):
        for arm, hit_at, per_update in (("n16x64", 200, 25), ("n512x16", 100 if seed == 0 else None, 100)):
            for s in range(0, 401, 100 if arm == "n512x16" else 50):
                up = s // per_update
                v = 0.02 + (0.11 if hit_at is not None and s >= hit_at else 0.0)
                rows.append({"arm": arm, "seed": seed, "step": s, "cum_samples": s, "cum_updates": up,
                             "cum_wall_s": s / 10, "eval/spell_backward/pass@1": v})
    table, times = F.race_table(pd.DataFrame(rows), reference="n16x64", level=0.10, budget=400,
                                metric="eval/spell_backward/pass@1")
    by = table.set_index("x")
    s = by.loc["cum_samples"]
    assert (s.reached_arm, s.reached_reference, s.first_arm, s.first_reference, s.ties) == (1, 3, 1, 2, 0)
    assert s.horizon == 400 and s.resolved  # N=16 reached it in 3 of 3 seeds
    assert s.restricted_mean_gap == pytest.approx(((100 - 200) + (400 - 200) * 2) / 3)
    u = by.loc["cum_updates"]
    assert u.horizon == 4 and u.reached_reference == 0 and not u.resolved  # N=16 hits at update 8 > 4
    samples = times[times["axis"] == "cum_samples"].set_index(["arm", "seed"])
    assert samples.loc[("n512x16", 1), "time"] == 400 and not samples.loc[("n512x16", 1), "reached"]


def test_capped_reading_pairs_each_arm_with_its_fill_to_full_run_of_the_same_seed():
    """capped - fill-to-full per arm and mark, paired by seed, on tables with known answers: the capped n16x64 runs
    sit 1 point below theirs at every evaluation (seeds 0-2; the primary's seed 3 has no capped pair), and the cap
    bound on half the capped steps, on none of fill-to-full's."""
    def runs(arm, seeds, shift, hit):
        return pd.DataFrame([{"arm": f"takeoff-{arm}", "seed": s, "step": k, "cum_samples": 100 * k,
                              "eval/mean/pass@1": 0.1 + 0.01 * k + 0.001 * s + shift, "ds_cap_hit": hit and k % 2 == 1}
                             for s in seeds for k in range(5)])
    capped = runs("n16x64", range(3), -0.01, True)
    primary = runs("n16x64", range(4), 0.0, False)
    t = F.capped_reading(capped, primary, marks=[200, 400])
    assert list(t["mark"]) == [200, 400] and set(t["arm"]) == {"n16x64"} and (t["n"] == 3).all()
    assert t["gap"].tolist() == pytest.approx([-0.01, -0.01])
    assert t["cap_bound_capped"].iloc[0] == pytest.approx(0.5) and t["cap_bound_fill"].iloc[0] == 0
