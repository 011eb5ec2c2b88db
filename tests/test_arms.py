"""The BroRL-vs-ProRL experiment: recipes (study.recipe), the plateau rule and training (study.plateau), the arms and
their resumable runs (study.arms), and the arms compared (study.compare). The verdict is tested in test_revival.py."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
import torch
from helpers_runs import TIMING

from brorl_lab.core.config import Config, ConfigError
from brorl_lab.core.validation import UserError
from brorl_lab.study import arms as AR
from brorl_lab.study import compare as C
from brorl_lab.study import plateau as P
from brorl_lab.study import recipe as RC


def tiny_base(tmp_path, **kw) -> Config:
    d = dict(model="default", tasks=["gcd"], steps=2, eval_every=1, checkpoint_every=1, eval_prompts=4,
             eval_samples=2, optimizer_steps_per_step=1, max_new_tokens=6, max_resample_rounds=1, torch_threads=1,
             run_dir=str(tmp_path))
    d.update(kw)
    return RC.recipe_config(**d)


def R(rollouts_per_prompt, prompts_per_step):
    """One row of an arm table (study.recipe.ARM_TABLE's shape)."""
    return {"rollouts_per_prompt": rollouts_per_prompt, "prompts_per_step": prompts_per_step}


# ---- arm_configs ---------------------------------------------------------------------------------------------------
def test_arm_configs_follow_brorls_recipe(tmp_path):
    base = tiny_base(tmp_path, steps=3, eval_every=1, optimizer_steps_per_step=2, lr=2e-4)
    table = {"prorl": R(16, 16), "brorl": R(512, None)}  # BroRL's prompts: 8x the ProRL arm's samples per step
    arms = AR.arm_configs(base, table, lr_scaling="sqrt_samples")
    pro, bro = arms["prorl"], arms["brorl"]
    assert (pro.rollouts_per_prompt, pro.prompts_per_step) == (16, 16)
    assert (bro.rollouts_per_prompt, bro.prompts_per_step) == (512, 4)  # 8x the samples: 2048 vs 256
    assert bro.samples_per_step == 8 * pro.samples_per_step
    assert pro.optimizer_steps_per_step == bro.optimizer_steps_per_step == 2
    assert pro.effective_lr == pytest.approx(2e-4)  # the reference arm trains at the base lr
    assert bro.effective_lr / pro.effective_lr == pytest.approx(math.sqrt(8))
    assert (bro.steps, pro.steps) == (3, 24) and bro.eval_every == pro.eval_every == 0
    # one shared grid: the BroRL arm's steps 1..3; the ProRL arm at the same samples (8, 16, 24) and updates (1..3)
    assert bro.eval_at_steps == [1, 2, 3] and pro.eval_at_steps == [1, 2, 3, 8, 16, 24]
    assert bro.samples_per_step * bro.steps == pro.samples_per_step * pro.steps  # same nominal samples per arm
    assert {pro.seed, bro.seed} == {base.seed} and pro.tasks == bro.tasks == base.tasks
    by_prompts = AR.arm_configs(base, table, lr_scaling="sqrt_prompts")
    assert by_prompts["brorl"].effective_lr == pytest.approx(2e-4 * math.sqrt(4 / 16))  # 4x fewer prompts: lr / 2
    assert AR.arm_configs(base, table)["brorl"].effective_lr == pytest.approx(2e-4)


def test_arms_reset_in_neither_arm_and_the_middle_arm_sits_on_the_grid(tmp_path):
    arms = AR.arm_configs(tiny_base(tmp_path, steps=4, eval_every=2, reset_every=8), arms=("prorl", "middle", "brorl"))
    pro, mid, bro = arms["prorl"], arms["middle"], arms["brorl"]  # 16 x 64, 64 x 32, 512 x 16 by default
    assert list(arms) == ["prorl", "middle", "brorl"]
    assert (mid.rollouts_per_prompt, mid.prompts_per_step, bro.prompts_per_step) == (64, 32, 16)
    assert all(c.reset_every == c.reset_every_samples == 0 for c in arms.values())  # resets off in both, not nominal
    assert not any(c.reset_due(s) for c in arms.values() for s in range(1, c.steps + 1))
    assert (pro.steps, mid.steps, bro.steps) == (32, 16, 4)
    assert bro.eval_at_steps == [2, 4] and mid.eval_at_steps == [2, 4, 8, 16] and pro.eval_at_steps == [2, 4, 16, 32]
    with pytest.raises(ValueError, match=r"arm_table\['middle'\]\['prompts_per_step'\]"):  # 64 x 24: not 512 x 16's
        AR.arm_configs(tiny_base(tmp_path), {**RC.ARM_TABLE, "middle": R(64, 24)}, arms=("prorl", "middle", "brorl"))


def test_arm_configs_at_the_papers_sizes_and_explicit_prompts(tmp_path):
    base = tiny_base(tmp_path, optimizer_steps_per_step=4)
    arms = AR.arm_configs(base, {"prorl": RC.PAPER_ARMS["prorl"], "brorl": R(512, None)})
    assert arms["brorl"].prompts_per_step == RC.PAPER_ARMS["brorl"]["prompts_per_step"]  # 512 x 128 vs 16 x 512
    arms = AR.arm_configs(base, {"prorl": R(4, 8), "brorl": R(64, 4)}, lr_scaling="sqrt_samples")
    assert arms["brorl"].samples_per_step / arms["prorl"].samples_per_step == 8
    assert arms["brorl"].effective_lr / arms["prorl"].effective_lr == pytest.approx(math.sqrt(8))


@pytest.mark.parametrize("kwargs, name", [
    (dict(arm_table={"prorl": R(16, 64), "brorl": R(16, 16)}), r"\['brorl'\]\['rollouts_per_prompt'\]"),
    (dict(arm_table={"prorl": R(16, 3), "brorl": R(512, None)}), r"\['brorl'\]\['prompts_per_step'\]"),  # not whole
    (dict(arm_table={"prorl": R(16, 64), "brorl": R(512, 0)}), r"\['brorl'\]\['prompts_per_step'\]"),
    (dict(arm_table={"prorl": R(0, 64), "brorl": R(512, 16)}), r"\['prorl'\]\['rollouts_per_prompt'\]"),
    (dict(arm_table={"prorl": R(16, 64), "brorl": R(512, None)}, samples_ratio=-1), "samples_ratio"),
    (dict(arms=("brorl",)), "arms"),
    (dict(n_large=16), r"\['brorl'\]\['rollouts_per_prompt'\]"),  # an old name: named as the cell it sets
    (dict(n_small=16, arm_table=RC.ARM_TABLE), "n_small"),  # old names and a table: one or the other
    (dict(rollouts=16), "rollouts"),
])
def test_arm_configs_bad_input_names_the_argument(tmp_path, kwargs, name):
    with pytest.raises(ValueError, match=name):
        AR.arm_configs(tiny_base(tmp_path), **kwargs)


def test_the_old_arm_keywords_read_as_the_table_they_stand_for(tmp_path):
    """study.paid and study.runner still pass n_small, ... (study.recipe.arm_options): the same configs as the table."""
    base = tiny_base(tmp_path, steps=2, eval_every=1)
    table = {**RC.ARM_TABLE, "brorl": R(512, None)}
    assert AR.arm_configs(base, **RC.arm_options(RC.ARM_TABLE, middle=True)) == \
        AR.arm_configs(base, RC.ARM_TABLE, arms=("prorl", "middle", "brorl"))
    assert AR.arm_configs(base, n_small=16, prompts_small=16) == AR.arm_configs(base, {**table, "prorl": R(16, 16)})
    assert AR.arm_configs(base) == AR.arm_configs(base, RC.ARM_TABLE)  # the recipe's arms by default


def test_arm_configs_without_the_sqrt_rule_keeps_one_lr(tmp_path):
    arms = AR.arm_configs(tiny_base(tmp_path, lr=2e-4), lr_scaling="none")
    assert arms["brorl"].effective_lr == arms["prorl"].effective_lr == pytest.approx(2e-4)
    with pytest.raises(ValueError, match="lr_scaling"):
        AR.arm_configs(tiny_base(tmp_path), lr_scaling="linear")


def test_arm_configs_rejects_mini_batches_that_do_not_split_both_arms(tmp_path):
    with pytest.raises(ConfigError, match="optimizer_steps_per_step"):
        AR.arm_configs(tiny_base(tmp_path, optimizer_steps_per_step=8), {"prorl": R(16, 16), "brorl": R(512, None)})


# ---- plateau rule, reach gate and training -------------------------------------------------------------------------
def noisy_curve(slope_per_100: float, noise: float, seed: int, steps: int = 220, every: int = 10, start: float = 0.7):
    rng = np.random.default_rng(seed)
    x = np.arange(0, steps + 1, every)
    return x, start + slope_per_100 * x / 100 + rng.normal(0, noise, x.size)


def test_slope_rule_does_not_call_a_slow_steady_climb_a_plateau():
    # the old shipped curve's blind spot: +1.8 points per 100 steps under 1.1-point eval noise, evaluated every 10
    fired = [P.plateau_reached(*noisy_curve(0.018, 0.011, seed)) for seed in range(20)]
    assert not any(fired)
    # the old shipped curve itself (steps 120..220, eval/mean/pass@1), which the "new best by 1 point" rule accepted
    old = [0.757, 0.744, 0.757, 0.759, 0.734, 0.750, 0.759, 0.762, 0.764, 0.763, 0.770]
    r = P.plateau_rule(range(120, 221, 10), old, window=100)
    assert not r["fired"] and r["hi"] > 0.005 and r["slope"] > 0


def test_slope_rule_fires_on_flat_and_falling_curves_with_a_precise_evaluation():
    for seed in range(10):  # 0.2-point noise (many prompts x samples), 21 evaluations in the window
        assert P.plateau_reached(*noisy_curve(0.0, 0.002, seed, steps=200, every=5))
        assert P.plateau_reached(*noisy_curve(-0.01, 0.002, seed, steps=200, every=5))
    x, y = noisy_curve(0.0, 0.0, 0, steps=100)
    assert P.plateau_rule(x, y)["fired"] and P.plateau_rule(x, y)["hi"] == pytest.approx(0, abs=1e-12)
    assert not P.plateau_reached(x[:-1], y[:-1])  # 90 steps: the window is not covered yet
    assert not P.plateau_reached(*noisy_curve(0.0, 0.011, 0))  # flat but too noisy to exclude +0.5 points / 100


def test_slope_rule_uses_the_t_interval_of_the_ols_slope():
    from scipy import stats

    x, y = noisy_curve(0.004, 0.003, 3, steps=300, every=10)
    r = P.plateau_rule(x, y, window=100)
    keep = x >= 200
    fit = stats.linregress(x[keep], y[keep])
    t = stats.t.ppf(0.975, keep.sum() - 2)  # n - 2 degrees of freedom, not 1.96
    assert r["n"] == keep.sum() == 11 and r["window_start"] == 200 and r["t"] == pytest.approx(t)
    assert r["slope"] == pytest.approx(100 * fit.slope) and r["se"] == pytest.approx(100 * fit.stderr)
    assert r["hi"] == pytest.approx(100 * (fit.slope + t * fit.stderr))
    assert r["fired"] is (r["hi"] < 0.005)


def test_slope_rule_gain_first():
    x = np.arange(0, 201, 5)
    rose = np.where(x < 100, 0.60 + 0.0006 * x, 0.66)  # +6 points in 100 steps, then flat
    assert P.plateau_reached(x, rose, gain=0.05)
    assert not P.plateau_reached(x, np.full(x.size, 0.6), gain=0.05)  # flat from the start: no gain
    assert P.plateau_reached(x, np.full(x.size, 0.6))  # the shipped rule asks no gain (gain=None)
    assert P.plateau_rule(x, rose, gain=0.05)["gained"] == pytest.approx(0.06)


@pytest.mark.parametrize("kwargs, name", [(dict(window=0), "window"), (dict(max_slope=float("nan")), "max_slope"),
                                          (dict(gain=True), "gain"), (dict(level=1.5), "level")])
def test_plateau_rule_bad_input(kwargs, name):
    with pytest.raises(ValueError, match=name):
        P.plateau_reached([0, 10], [0.1, 0.2], **kwargs)


def test_reach_gate_counts_rare_successes():
    rates = pd.DataFrame({"p": [0.0, 1 / 512, 1 / 16, 1 / 16 + 1e-9, 0.5, 1.0, 0.01, 0.9, 0.0, 0.03]})
    g = P.reach_gate(rates)  # rare: 1/512, 1/16 (inclusive), 0.01, 0.03 -> 4 of 10; p = 0 is not a success
    assert g["share"] == pytest.approx(0.4) and g["passed"] and g["prompts"] == 10
    assert not P.reach_gate(rates, min_share=0.41)["passed"]
    assert P.reach_gate(rates, max_p=0.5)["share"] == pytest.approx(0.6)
    with pytest.raises(ValueError, match="rates"):
        P.reach_gate(pd.DataFrame({"p": []}))
    with pytest.raises(ValueError, match="min_share"):
        P.reach_gate(rates, min_share=2)


def test_p_histogram_bins_every_prompt_once_with_p0_and_p1_apart():
    from brorl_lab.study.mechanism import p_histogram

    p = [0.0, 1 / 512, 1 / 64, 1 / 64 + 1e-9, 1 / 16, 0.2, 0.5, 0.75, 0.99, 1.0]
    rates = pd.DataFrame({"family": ["a"] * 5 + ["b"] * 5, "uid": range(10), "p": p, "signal_small": 0.0,
                          "signal_large": False, "reach": "neither"})
    h = p_histogram(rates)
    allp = h[h["family"] == "all"].set_index("bin")["prompts"]
    assert allp.to_dict() == {"p=0": 1, "(0,0.01562]": 2, "(0.01562,0.0625]": 2, "(0.0625,0.25]": 1,
                              "(0.25,0.5]": 1, "(0.5,0.75]": 1, "(0.75,1)": 1, "p=1": 1}
    assert h.groupby("family")["share"].sum().round(9).to_dict() == {"a": 1.0, "all": 1.0, "b": 1.0}
    with pytest.raises(ValueError, match="edges"):
        p_histogram(rates, edges=(0.1, 1.0))


def test_save_reach_writes_every_prompt_and_the_histogram(tmp_path):
    from brorl_lab.study.plateau import reach_rates, save_reach

    rates = reach_rates("default", ["gcd", "chain_sum"], prompts=2, draws=16)
    meta = save_reach(tmp_path / "rec", "default", rates, command="python -m brorl_lab reach ...", draws=16)
    back = pd.read_csv(tmp_path / "rec" / "branch_rates.csv")
    assert back["family"].tolist() == ["gcd", "gcd", "chain_sum", "chain_sum"] and (back["p"] == back["correct"] / 16).all()
    assert json.loads((tmp_path / "rec" / "reach.json").read_text()) == json.loads(json.dumps(meta, default=float))
    assert [r["family"] for r in meta["reach"]] == ["gcd", "chain_sum"] and len(meta["model_sha256"]) == 64
    hist = pd.DataFrame(meta["p_histogram"])
    assert hist.groupby("family")["prompts"].sum().to_dict() == {"all": 4, "chain_sum": 2, "gcd": 2}


def test_model_aliases_name_the_shipped_branch_points():
    from brorl_lab.core.paths import PLATEAU_MODEL_DIR, TAKEOFF_BASE_DIR

    assert RC.resolve_experiment_model("floor") == RC.resolve_experiment_model("plateau") == str(PLATEAU_MODEL_DIR)
    assert RC.resolve_experiment_model("takeoff") == str(TAKEOFF_BASE_DIR)
    with pytest.raises(UserError, match="'floor'"):
        RC.resolve_experiment_model(" ")


def test_reach_table_measures_each_family_alone():
    t = P.reach_table("default", ["gcd", "chain_sum"], prompts=3, draws=32)
    assert list(t["family"]) == ["gcd", "chain_sum"] and (t["prompts"] == 3).all()
    assert t["share 0<p<=0.0625"].between(0, 1).all() and ((t["share 0<p<=0.0625"] * 3) % 1 == 0).all()
    assert (t["share 0<p<=0.0625"] <= t["share rare successes"]).all()  # 1/16 <= 0.1
    with pytest.raises(UserError, match=r"families: unknown task 'gcdd'"):
        P.reach_table("default", ["gcd", "gcdd"])


def tiny_plateau_config(tmp_path, name="runs", **kw):
    return P.plateau_config(**{**dict(tasks=["gcd"], steps=6, eval_every=1, checkpoint_every=1, eval_prompts=4,
                                      eval_samples=2, prompts_per_step=4, rollouts_per_prompt=4,
                                      optimizer_steps_per_step=1, max_new_tokens=6, max_resample_rounds=1,
                                      run_dir=str(tmp_path / name)), **kw})


def test_train_plateau_saves_a_loadable_deterministic_hf_model(tmp_path):
    from brorl_lab.core.models import load_policy

    outs = []
    for k in range(2):
        cfg = tiny_plateau_config(tmp_path, f"runs{k}")
        # a 2-step window and a bound no slope can miss: the rule fires at step 2 (three evaluations)
        res = P.train_plateau(cfg, out=tmp_path / f"model{k}", rule=dict(window=2, max_slope=1e9), gate_prompts=3,
                              gate_draws=32, progress=False)
        assert res.plateaued and res.steps == 2 and list(res.curve["step"]) == [0, 1, 2]
        assert res.gate["prompts"] == 3 and res.passed is res.gate["passed"]
        outs.append(res.out)
    files = {p.name for p in outs[0].iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "PLATEAU.md", "plateau.json"} <= files
    meta = json.loads((outs[0] / "plateau.json").read_text())
    assert meta["families"] == ["gcd"] and meta["plateaued"] and meta["steps"] == 2
    assert meta["rule"]["n"] == 3 and meta["gate"]["draws"] == 32 and meta["reach"][-1]["family"] == "all"
    assert meta["config"]["advantage"] == "reinforce_pp_baseline" and meta["config"]["reset_every"] == 0
    md = (outs[0] / "PLATEAU.md").read_text()
    assert "| 2 |" in md and "counts as a plateau" in md and "Reach gate" in md and "t interval" in md
    # the branch point's per-prompt p: every prompt in the CSV, its histogram in the JSON and the markdown
    rates = pd.read_csv(outs[0] / "branch_rates.csv")
    assert len(rates) == 3 and (rates["p"] == rates["correct"] / 32).all()
    hist = pd.DataFrame(meta["p_histogram"])
    assert hist.groupby("family")["prompts"].sum().to_dict() == {"all": 3, "gcd": 3}
    assert "Per-prompt pass rate p at the branch point" in md and "| p=0 |" in md
    p0, _ = load_policy(str(outs[0]))
    p1, _ = load_policy(str(outs[1]))
    assert all(torch.equal(a, b) for a, b in zip(p0.state_dict().values(), p1.state_dict().values()))
    base, _ = load_policy("default")
    assert any(not torch.equal(a, b) for a, b in zip(p0.state_dict().values(), base.state_dict().values()))
    assert RC.recipe_config(model=str(outs[0])).tasks == ["gcd"]  # the plateau's families come with it


def test_train_plateau_reports_a_missing_plateau_honestly(tmp_path):
    cfg = tiny_plateau_config(tmp_path, steps=2)
    res = P.train_plateau(cfg, out=tmp_path / "model", rule=dict(window=50), gate_prompts=0, progress=False)
    assert not res.plateaued and not res.passed and res.steps == 2 and res.gate == {}
    assert "did NOT fire" in (tmp_path / "model" / "PLATEAU.md").read_text()


def test_train_plateau_refuses_to_overwrite_a_non_model_directory(tmp_path):
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "a.txt").write_text("keep me")
    with pytest.raises(ValueError, match="out"):
        P.train_plateau(P.plateau_config(tasks=["gcd"], run_dir=str(tmp_path)), out=tmp_path / "notes")
    assert (tmp_path / "notes" / "a.txt").read_text() == "keep me"


def test_hard_families_reads_the_report(tmp_path):
    report = tmp_path / "training_report.json"
    report.write_text(json.dumps({"pass_at_1": {"t1.0": {"a": 0.0, "b": 0.05, "c": 0.3, "d": 0.9}}}))
    assert RC.hard_families(report) == ["b", "c"]
    assert RC.hard_families(report, max_pass=0.1) == ["b"]
    with pytest.raises(ValueError, match="temperature"):
        RC.hard_families(report, temperature="t9")
    with pytest.raises(ValueError, match="report"):
        RC.hard_families(tmp_path / "missing.json")


# ---- run_rollout_scaling -------------------------------------------------------------------------------------------
def _comparable(df: pd.DataFrame) -> pd.DataFrame:
    return df[[c for c in df.columns if not c.startswith(TIMING)]].reset_index(drop=True)


def test_run_rollout_scaling_runs_both_arms_and_never_reruns_a_finished_one(tmp_path, monkeypatch):
    base = tiny_base(tmp_path)
    opts = dict(arm_table={"prorl": R(2, 2), "brorl": R(8, 2)})  # 4 vs 16 samples per step: ratio 4
    root = tmp_path / "rs"
    df = AR.run_rollout_scaling(base, seeds=[0], root=root, progress=False, **opts)
    assert set(df["arm"]) == {"prorl", "brorl"} and set(df["seed"]) == {0}
    last = df.groupby("arm")["step"].max()
    assert (last["brorl"], last["prorl"]) == (2, 8)
    evals = df[df["eval/gcd/pass@1"].notna()].groupby("arm")["step"].apply(list)
    assert evals["brorl"] == [0, 1, 2] and evals["prorl"] == [0, 1, 2, 4, 8]  # the shared grid
    grid = df[df["eval/gcd/pass@1"].notna()]
    for x in ("cum_nominal_samples", "cum_nominal_updates"):  # both arms measured at every BroRL-arm budget
        assert set(grid.loc[grid["arm"] == "brorl", x]) <= set(grid.loc[grid["arm"] == "prorl", x])
    assert sorted(grid.loc[grid["arm"] == "brorl", "cum_nominal_samples"]) == [0, 16, 32]
    nominal = df.groupby("arm")["cum_trained_samples"].max()
    assert nominal["brorl"] <= 32 and nominal["prorl"] <= 32  # kept groups x N, at most 2 steps x 16

    import brorl_lab.rl.trainer as T

    def no_training(*a, **k):
        raise AssertionError("a finished arm was trained again")

    monkeypatch.setattr(T.Trainer, "__init__", no_training)
    again = AR.run_rollout_scaling(base, seeds=[0], root=root, progress=False, **opts)
    pd.testing.assert_frame_equal(_comparable(df), _comparable(again))
    monkeypatch.undo()

    # a partial arm resumes from its checkpoint and ends where an uninterrupted one does
    partial_root = tmp_path / "partial"
    cfg = AR.arm_configs(base, **opts)["prorl"].replace(run_dir=str(partial_root), run_name="prorl_s0")
    with T.Trainer(cfg, progress=False) as t:
        t.run(steps=3)
    resumed = AR.run_rollout_scaling(base, seeds=[0], root=partial_root, progress=False, **opts)
    events = [json.loads(line) for line in (partial_root / "prorl_s0" / "events.jsonl").read_text().splitlines()]
    assert [e["step"] for e in events if e["event"] == "resumed"] == [3]
    pd.testing.assert_frame_equal(_comparable(df), _comparable(resumed))

    with pytest.raises(ValueError, match="root"):  # other settings in the same root: an error, not a mix
        AR.run_rollout_scaling(base.replace(lr=1e-3), seeds=[0], root=root, progress=False, **opts)


@pytest.mark.parametrize("seeds", [[], [0, 0], [-1], "0"])
def test_run_rollout_scaling_bad_seeds(tmp_path, seeds):
    with pytest.raises(ValueError, match="seeds"):
        AR.run_rollout_scaling(tiny_base(tmp_path), seeds=seeds, root=tmp_path / "rs", progress=False)


# ---- summarize / compare_arms on synthetic results ------------------------------------------------------------------------
FAMS = ("gcd", "products")


def synthetic_run(arm: str, seed: int, *, slope: dict, samples_per_step: int, seconds_per_sample: float,
                  steps: int, start: float = 0.2, offset: float = 0.0, ds_pass_rate: float = 0.5) -> pd.DataFrame:
    """An arm whose pass@1 rises linearly in samples: start + slope[family] * samples, plus this seed's ``offset``
    after the start (what another seed would change)."""
    n = 512 if arm == "brorl" else 16
    rows = []
    for step in range(steps + 1):
        samples = step * samples_per_step
        row = {"arm": arm, "seed": seed, "step": step, "cum_samples": samples,
               "cum_wall_s": samples * seconds_per_sample, "rollouts_per_prompt": n,
               "cum_trained_samples": samples // 2}
        if step:
            row.update(samples=samples_per_step, samples_per_s=1 / seconds_per_sample, ds_pass_rate=ds_pass_rate,
                       entropy=0.5, response_length_mean=3.0)
        vals = {f: start + slope[f] * samples + (offset if step else 0.0) for f in FAMS}
        row.update({f"eval/{f}/pass@1": v for f, v in vals.items()})
        row["eval/mean/pass@1"] = float(np.mean(list(vals.values())))
        rows.append(row)
    return pd.DataFrame(rows)


def results(bro_slope, pro_slope, *, seeds=(0,), bro_sps=1e-3, pro_sps=1e-3, bro_offsets=None):
    frames = []
    for i, s in enumerate(seeds):
        frames.append(synthetic_run("prorl", s, slope=pro_slope, samples_per_step=100, seconds_per_sample=pro_sps,
                                    steps=10, ds_pass_rate=0.4))
        frames.append(synthetic_run("brorl", s, slope=bro_slope, samples_per_step=500, seconds_per_sample=bro_sps,
                                    steps=2, offset=bro_offsets[i] if bro_offsets else 0.0, ds_pass_rate=0.6))
    return pd.concat(frames, ignore_index=True)


def test_compare_and_summarize_on_known_curves():
    df = results({"gcd": 2e-4, "products": 0.0}, {"gcd": 1e-4, "products": 5e-5})
    cmp_ = C.compare_arms(df, "cum_samples").set_index("family")
    assert cmp_["budget"].iloc[0] == 1000
    assert cmp_.loc["gcd", "gap"] == pytest.approx(0.1)  # (2e-4 - 1e-4) * 1000
    assert cmp_.loc["products", "gap"] == pytest.approx(-0.05)
    s = C.summarize(df)
    assert list(s.index) == ["ProRL (N=16)", "BroRL (N=512)"]
    assert s.loc["BroRL (N=512)", "final pass@1 gcd"] == pytest.approx(0.4)
    assert s.loc["ProRL (N=16)", "final pass@1 products"] == pytest.approx(0.25)
    assert s.loc["ProRL (N=16)", "samples"] == 1000 and s.loc["BroRL (N=512)", "wall_s"] == pytest.approx(1.0)
    assert s.loc["BroRL (N=512)", "ds_pass_rate"] == pytest.approx(0.6)
    assert s.loc["ProRL (N=16)", "gen_samples_per_s"] == pytest.approx(1000)
    assert s.loc["BroRL (N=512)", "steps"] == 2 and s.loc["ProRL (N=16)", "steps"] == 10


def test_compare_arms_separates_equal_samples_from_equal_time():
    # BroRL learns more per sample but each of its samples costs 4x the time
    df = results({"gcd": 2e-4, "products": 2e-4}, {"gcd": 1e-4, "products": 1e-4}, bro_sps=4e-3)
    at_samples = C.compare_arms(df, "cum_samples").set_index("family")
    at_time = C.compare_arms(df, "cum_wall_s").set_index("family")
    assert at_samples.loc["mean", "budget"] == 1000 and at_samples.loc["mean", "gap"] == pytest.approx(0.1)
    assert at_time.loc["mean", "budget"] == pytest.approx(1.0)  # 250 BroRL samples against 1000 ProRL ones
    assert at_time.loc["mean", "gap"] == pytest.approx(2e-4 * 250 - 1e-4 * 1000)  # behind at equal time
    with pytest.raises(ValueError, match="x: got 'step'"):
        C.compare_arms(df, "step")


def test_compare_arms_with_three_seeds_tests_the_gap_against_seed_noise():
    # per-seed gaps on gcd: 0.1 + (0.002, -0.002, 0): mean 0.1, s.e. 0.0012; on products: (0.002, -0.002, 0)
    clear = C.compare_arms(results({"gcd": 2e-4, "products": 1e-4}, {"gcd": 1e-4, "products": 1e-4}, seeds=(0, 1, 2),
                                   bro_offsets=[0.002, -0.002, 0.0]), "cum_samples").set_index("family")
    assert clear.loc["gcd", "seeds"] == 3 and bool(clear.loc["gcd", "exceeds_noise"])
    assert (clear.loc["gcd", "gap_lo"], clear.loc["gcd", "gap_hi"]) == (pytest.approx(0.095, abs=1e-3),
                                                                        pytest.approx(0.105, abs=1e-3))
    assert not bool(clear.loc["products", "exceeds_noise"])
    # per-seed gaps on gcd: 0.01 + (0.08, -0.08, 0.01): mean 0.0133 against an s.e. of 0.047
    noisy = C.compare_arms(results({"gcd": 1.1e-4, "products": 1e-4}, {"gcd": 1e-4, "products": 1e-4},
                                   seeds=(0, 1, 2), bro_offsets=[0.08, -0.08, 0.01]), "cum_samples")
    assert not noisy["exceeds_noise"].any()
    one_seed = C.compare_arms(results({"gcd": 1e-4, "products": 1e-4}, {"gcd": 1e-4, "products": 1e-4}))
    assert one_seed["exceeds_noise"].isna().all() and one_seed["gap"].abs().max() < 1e-12  # level, no interval


@pytest.mark.parametrize("bad", [pd.DataFrame({"arm": ["prorl"]}), "not a frame",
                                 results({"gcd": 0, "products": 0}, {"gcd": 0, "products": 0}).query("arm == 'brorl'")])
def test_summarize_and_compare_arms_reject_bad_frames(bad):
    for fn in (C.summarize, C.compare_arms):
        with pytest.raises(ValueError, match="df"):
            fn(bad)


def test_save_outputs_survives_a_missing_browser(tmp_path, monkeypatch):
    import plotly.graph_objects as go

    monkeypatch.setenv("BROWSER_PATH", str(tmp_path / "no-chromium"))
    df = results({"gcd": 1e-4, "products": 1e-4}, {"gcd": 1e-4, "products": 1e-4})
    written = AR.save_outputs(tmp_path / "out", df, {"fig": go.Figure(go.Scatter(x=[0, 1], y=[0, 1]))},
                              summary=C.summarize(df), verdict_text="Does BroRL revive the plateau? NO")
    assert written["png"] == [] and written["png_note"].startswith("PNG export skipped")
    assert pd.read_parquet(tmp_path / "out" / "metrics.parquet").shape == df.shape
    assert (tmp_path / "out" / "verdict.txt").read_text() == "Does BroRL revive the plateau? NO\n"
    assert "final pass@1 gcd" in (tmp_path / "out" / "summary.csv").read_text()


def test_collapse_rule_flags_a_seed_whose_kl_or_pass_at_1_leaves_the_band():
    """COLLAPSE (study.compare), fixed before every run: KL above 0.5 nats/token at any step, or held-out mean
    pass@1 more than 10 points below its step-0 start at any evaluation; each seed flagged with its reason."""
    df = results({"gcd": 1e-4, "products": 1e-4}, {"gcd": 1e-4, "products": 1e-4}, seeds=(0, 1, 2),
                 bro_offsets=[0.0, -0.25, 0.0]).assign(kl=0.01)
    df.loc[(df["arm"] == "prorl") & (df["seed"] == 2) & (df["step"] == 3), "kl"] = 0.9
    flags = C.collapse_flags(df).set_index(["arm", "seed"])
    assert flags["collapsed"].sum() == 2
    assert "pass@1 fell" in flags.loc[("brorl", 1), "reason"] and flags.loc[("brorl", 1), "min_change"] < -0.1
    assert flags.loc[("prorl", 2), "reason"] == "KL 0.9 > 0.5" and not flags.loc[("brorl", 0), "collapsed"]
    assert C.COLLAPSE == {"kl_max": 0.5, "pass_drop": 0.10}
