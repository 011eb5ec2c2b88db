"""The flagship as a study: ablations (shared runs, rescaled steps, a table at three budgets), the per-prompt
mechanism (signal at N = 16 vs N = 512), and the iso-compute sweep over N (planner + sweep runner + summary)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from helpers_runs import run_names

from brorl_lab.core.config import Config
from brorl_lab.lab.analysis import iso_compute_summary
from brorl_lab.rl.steps import sample_prompts
from brorl_lab.study import ablations as A
from brorl_lab.study import arms as AR
from brorl_lab.study import mechanism as M
from brorl_lab.study.recipe import recipe_config

TABLE = {"prorl": dict(rollouts_per_prompt=4, prompts_per_step=4), "brorl": dict(rollouts_per_prompt=16, prompts_per_step=2)}
ARMS = dict(arm_table=TABLE)  # 16 vs 32 samples per step


def tiny_base(tmp_path, **kw):
    d = dict(model="default", tasks=["gcd"], steps=2, eval_every=1, checkpoint_every=1, eval_prompts=4,
             eval_samples=2, optimizer_steps_per_step=1, max_new_tokens=6, max_resample_rounds=1, torch_threads=1,
             run_dir=str(tmp_path))
    d.update(kw)
    return recipe_config(**d)


# ---- ablations -------------------------------------------------------------------------------------------------------
def test_ablation_grid_is_a_2x2_plus_estimators():
    v = A.ablation_grid(lr_rules=("none", "sqrt_samples"), prompts=(4, 8), advantages=("grpo",))
    assert list(v) == ["main", "brorl.prompts_per_step=8", "lr_scaling=sqrt_samples",
                       "lr_scaling=sqrt_samples, brorl.prompts_per_step=8", "advantage=grpo"]
    assert v["main"] == {} and v["advantage=grpo"] == {"advantage": "grpo"}
    assert v["brorl.prompts_per_step=8"] == {"lr_scaling": "none", "brorl.prompts_per_step": 8}


def test_variant_arms_keep_the_prorl_arm_and_the_sample_budget(tmp_path):
    base = tiny_base(tmp_path, steps=4, eval_every=2, checkpoint_every=2)
    main = A.variant_arms(base, {}, **ARMS)
    wide = A.variant_arms(base, {"brorl.prompts_per_step": 4, "lr_scaling": "sqrt_samples"}, **ARMS)
    # On the shared grid the ProRL arm is evaluated where its BroRL arm is: a variant that moves the BroRL grid gets
    # a ProRL run of its own, trained alike and differing only in where it is evaluated.
    differ = {k for k, v in main["prorl"].to_dict().items() if wide["prorl"].to_dict()[k] != v}
    assert differ == {"eval_at_steps"}
    assert A._config_key(main["prorl"]) != A._config_key(wide["prorl"])
    assert A._config_key(A.variant_arms(base, {}, **ARMS)["prorl"]) == A._config_key(main["prorl"])
    assert (main["brorl"].steps, wide["brorl"].steps) == (4, 2)
    assert wide["brorl"].eval_at_steps and max(wide["brorl"].eval_at_steps) == 2  # its grid ends where it ends
    for arms in (main, wide):
        assert arms["brorl"].samples_per_step * arms["brorl"].steps == arms["prorl"].samples_per_step * arms["prorl"].steps
    assert wide["brorl"].effective_lr == pytest.approx(base.lr * 2)  # sqrt(16 x 4 / (4 x 4))
    grpo = A.variant_arms(base, {"advantage": "grpo"}, **ARMS)
    assert grpo["prorl"].advantage == grpo["brorl"].advantage == "grpo" != main["prorl"].advantage


@pytest.mark.parametrize("variant, name", [({"no_such_knob": 1}, "variant"), ({"brorl.prompts_per_step": 3}, "steps")])
def test_variant_arms_bad_input(tmp_path, variant, name):
    with pytest.raises(ValueError, match=name):
        A.variant_arms(tiny_base(tmp_path, steps=2, eval_every=1), variant, **ARMS)


def test_run_ablations_shares_identical_runs_and_tables_three_budgets(tmp_path):
    base = tiny_base(tmp_path, steps=2, eval_every=2, checkpoint_every=2)  # the wider variant: 1 step, eval every 1
    root = tmp_path / "arms"
    main = AR.run_rollout_scaling(base, seeds=[0], root=root, progress=False, **ARMS)
    variants = A.ablation_grid(lr_rules=("none",), prompts=(2, 4), advantages=(), main_prompts=2)
    df = A.run_ablations(base, variants, seeds=[0], root=root, progress=False, **ARMS)
    runs = run_names(root)
    assert {"prorl_s0", "brorl_s0"} <= set(runs)
    assert len(runs) == 4  # the main arms were reused; the wider variant's two arms (its own grid) are new
    assert set(df["variant"]) == {"main", "brorl.prompts_per_step=4"}
    pd.testing.assert_series_equal(  # the main variant's ProRL rows are the run the main experiment wrote
        df[(df["variant"] == "main") & (df["arm"] == "prorl")]["eval/mean/pass@1"].reset_index(drop=True),
        main[main["arm"] == "prorl"]["eval/mean/pass@1"].reset_index(drop=True))
    table = A.ablation_table(df)
    assert list(table.index) == ["main", "brorl.prompts_per_step=4"]
    assert table.loc["brorl.prompts_per_step=4", "prompts_per_step"] == 4 and table.loc["main", "prompts_per_step"] == 2
    for ax in ("samples", "updates", "wall_s"):
        gap = table[f"{ax}: gap (points)"]
        assert gap.notna().all()
        assert gap.tolist() == pytest.approx((100 * (table[f"{ax}: brorl"] - table[f"{ax}: prorl"])).tolist())
    # resumable: a second call runs nothing new and returns the same numbers
    again = A.run_ablations(base, variants, seeds=[0], root=root, progress=False, **ARMS)
    assert run_names(root) == runs
    pd.testing.assert_frame_equal(A.ablation_table(again), table)


# ---- mechanism -------------------------------------------------------------------------------------------------------
def test_reach_classes_and_summary_by_hand():
    assert [M.reach_class(s, big) for s, big in ((0.5, True), (0.4, True), (0.0, False), (0.9, True))] == [
        "both", "only N=512", "neither", "both"]
    rates = pd.DataFrame({"family": ["a", "a", "b", "b"], "uid": ["1", "2", "3", "4"], "p": [0.0, 0.5, 0.01, 1.0],
                          "signal_small": [0.0, 1.0, 0.125, 0.0], "signal_large": [False, True, True, False]})
    rates["reach"] = [M.reach_class(s, b) for s, b in zip(rates["signal_small"], rates["signal_large"])]
    s = M.reach_summary(rates).set_index("family")
    assert s.loc["all", "pass_rate_small"] == pytest.approx(1.125 / 4) and s.loc["all", "pass_rate_large"] == 0.5
    assert s.loc["all", ["share both", "share only N=512", "share neither"]].tolist() == [0.25, 0.25, 0.5]
    assert s.loc["all", ["share rare successes", "share rare failures"]].tolist() == [0.25, 0.0]  # p = 0.01
    after = rates.assign(p=[0.0, 0.5, 0.2, 1.0])
    ch = M.reach_change(rates, {"BroRL": after}).set_index("reach")
    assert ch.loc["only N=512", "change"] == pytest.approx(0.19) and ch.loc["both", "change"] == 0
    with pytest.raises(ValueError, match="after"):
        M.reach_change(rates, {"BroRL": after.iloc[:2]})
    table = {"prorl": {"rollouts_per_prompt": 4}, "brorl": {"rollouts_per_prompt": 32}}
    fig = M.reach_figure(rates, M.reach_change(rates, {"BroRL": after}), arm_table=table)
    hist = [t for t in fig.data if t.type == "histogram"]
    assert [t.name for t in hist] == ["both (1 prompts)", "only N=512 (1 prompts)", "neither (2 prompts)"]
    assert [t.name for t in fig.data if t.type == "bar"] == ["BroRL: change of p"]


def test_prompt_pass_rates_on_the_real_model_are_consistent(tmp_path):
    from brorl_lab.core.models import load_policy

    cfg = tiny_base(tmp_path, tasks=["spell_backward", "gcd"])
    policy, tok = load_policy("default")
    items = sample_prompts(cfg.tasks, 4, seed=3)
    rates = M.prompt_pass_rates(policy, tok, items, cfg, draws=32, rollouts_per_prompt=4, chunk_prompts=3)
    assert list(rates["uid"]) == [it.uid for it in items] and (rates["p"] == rates["correct"] / 32).all()
    assert (rates["signal_large"] == rates["correct"].between(1, 31)).all()
    assert (rates.loc[~rates["signal_large"], "signal_small"] == 0).all()  # all right or all wrong: no group mixed
    assert rates["signal_small"].between(0, 1).all() and ((rates["signal_small"] * 8) % 1 == 0).all()  # 8 groups of 4
    again = M.prompt_pass_rates(policy, tok, items, cfg, draws=32, rollouts_per_prompt=4, chunk_prompts=3)
    pd.testing.assert_frame_equal(rates, again)  # seeded: the same draws
    # a default Config (template='auto') goes through rl.spec.resolve: the default tokenizer has no chat
    # template, so 'auto' is 'plain' and the draws are the ones template='plain' gives
    auto = M.prompt_pass_rates(policy, tok, items[:2], Config(max_new_tokens=6), draws=8, rollouts_per_prompt=4)
    plain = M.prompt_pass_rates(policy, tok, items[:2], Config(max_new_tokens=6, template="plain"), draws=8,
                                rollouts_per_prompt=4)
    assert Config().template == "auto" and len(auto) == 2
    pd.testing.assert_frame_equal(auto, plain)
    with pytest.raises(ValueError, match="rollouts_per_prompt"):
        M.prompt_pass_rates(policy, tok, items, cfg, draws=32, rollouts_per_prompt=5)
    default = Config(tasks=cfg.tasks)  # template='auto' is resolved as the Trainer does, not an error
    auto = M.prompt_pass_rates(policy, tok, items, default, draws=32, rollouts_per_prompt=4, chunk_prompts=3)
    plain = M.prompt_pass_rates(policy, tok, items, default.replace(template="plain"), draws=32, rollouts_per_prompt=4,
                                chunk_prompts=3)
    pd.testing.assert_frame_equal(auto, plain)  # the default model has no chat template: 'auto' means 'plain'


# ---- iso-compute -----------------------------------------------------------------------------------------------------
def test_iso_compute_summary_by_hand():
    rows = []
    for n, p, seed, first, last in ((4, 8, 0, 0.5, 0.6), (4, 8, 1, 0.5, 0.7), (16, 2, 0, 0.5, 0.55)):
        for step, v in ((0, first), (2, last)):
            rows.append({"run": f"n{n}_s{seed}/run", "step": step, "cfg.rollouts_per_prompt": n,
                         "cfg.prompts_per_step": p, "eval/mean/pass@1": v, "eval/mean/pass@4": min(1, v + 0.2)})
    s = iso_compute_summary(pd.DataFrame(rows)).set_index(["N", "k"])
    assert s.loc[(4, 1), "seeds"] == 2 and s.loc[(4, 1), "final"] == pytest.approx(0.65)
    assert s.loc[(4, 1), "gain"] == pytest.approx(0.15) and s.loc[(16, 1), "prompts_per_step"] == 2
    assert s.loc[(4, 4), "final"] == pytest.approx(0.85) and pd.isna(s.loc[(16, 4), "final_std"])
    # gains 0.1 and 0.2 over 2 seeds: 0.15 +- t_(0.975, 1) * 0.0707 / sqrt(2) = 0.15 +- 0.635, not resolved
    assert s.loc[(4, 1), "gain_lo"] == pytest.approx(0.15 - 12.7062 * 0.05, abs=1e-4) and not s.loc[(4, 1), "resolved"]
    assert pd.isna(s.loc[(16, 1), "gain_lo"])  # one seed: no interval


@pytest.mark.notebook
def test_iso_compute_sweep_runs_resumes_and_summarises(tmp_path):
    from brorl_lab.lab.sweep import run_iso_compute
    from brorl_lab.lab.tracking import load_runs

    params = dict(steps=1, eval_every=1, eval_prompts=4, eval_samples=4, eval_k=[1, 4])
    with pytest.raises(ValueError, match="n_values"):
        run_iso_compute(8, [3], seeds=[0], out=tmp_path, params=params, progress=False)
    index = run_iso_compute(8, [2, 8], seeds=[0], out=tmp_path / "iso", params=params, progress=False)
    assert (index["status"] == "finished").all() and len(index) == 2
    s = iso_compute_summary(load_runs(tmp_path / "iso"))
    assert sorted(s["N"].unique()) == [2, 8] and sorted(s["k"].unique()) == [1, 4]
    assert dict(zip(s["N"], s["prompts_per_step"])) == {2: 4, 8: 1}
    mtimes = {p: p.stat().st_mtime for p in Path(tmp_path / "iso").glob("*/run/metrics.parquet")}
    again = run_iso_compute(8, [2, 8], seeds=[0], out=tmp_path / "iso", params=params, progress=False)
    assert (again["status"] == "finished").all()
    assert {p: p.stat().st_mtime for p in mtimes} == mtimes  # finished runs are skipped, not re-run


def test_iso_compute_notebook_pair_is_in_sync():
    from helpers_notebooks import assert_notebook_pair_in_sync

    assert_notebook_pair_in_sync("05_iso_compute", ["rollouts_per_prompt", "prompts_per_step", "steps", "seed",
                                                    "eval_k", "run_dir", "optimizer_steps_per_step"])


# ---- pre-registration (study.results, issue 42) -----------------------------------------------------------------
def test_a_shipped_run_needs_its_declaration_committed_and_a_clean_tree(tmp_path):
    """require_preregistered refuses (one line naming what to commit) an uncommitted or edited declaration and a dirty
    tree, and passes once both are committed; is_shippable names what a record lacks."""
    import subprocess

    from brorl_lab.core.validation import UserError
    from brorl_lab.study import results as RS

    def git(*args):
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    git("init", "-q")
    git("config", "user.email", "t@t")
    git("config", "user.name", "t")
    (tmp_path / "code.py").write_text("x = 1\n")
    git("add", "code.py")
    git("commit", "-qm", "code")
    path = RS.write_declaration(tmp_path / "out", {"study": "s", "seeds": [0, 1]})
    with pytest.raises(UserError, match="declaration: .* is not committed as written.*git add -f"):
        RS.require_preregistered(path)
    git("add", "out/declaration.json")
    git("commit", "-qm", "declare s")
    rec = RS.require_preregistered(path)
    assert rec["commit"] and rec["path"].endswith("declaration.json")
    assert RS.write_declaration(tmp_path / "out", {"seeds": [0, 1], "study": "s"}) == path  # same data, same bytes
    assert RS.require_preregistered(path) == rec
    (tmp_path / "code.py").write_text("x = 2\n")  # a tracked change: the tree is dirty
    with pytest.raises(UserError, match="tree: uncommitted changes \\(code.py\\)"):
        RS.require_preregistered(path)
    RS.write_declaration(tmp_path / "out", {"study": "s", "seeds": [0, 1, 2]})  # the declaration edited after commit
    with pytest.raises(UserError, match="not committed as written"):
        RS.require_preregistered(path)
    start = RS.start_of_run(tmp_path)
    assert start["commit"].endswith("-dirty") and start["started_at"].endswith("Z")
    assert "no committed declaration" in RS.is_shippable({**start, "declaration": None})
    assert any("not a clean commit" in w for w in RS.is_shippable({**start, "declaration": rec}))
