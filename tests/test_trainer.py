"""The loop: dynamic sampling, resets, checkpoint/resume, memory bounded by the micro-batch."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pandas as pd
import pytest
import torch

from brorl_lab.core.batch import RolloutBatch
from brorl_lab.core.config import Config
from brorl_lab.rl import steps as S
from brorl_lab.rl.trainer import Trainer

# Columns that measure time differ between two runs of the same computation; everything else must match exactly.
TIMING = ("time/", "step_wall_s", "cum_wall_s", "samples_per_s", "tokens_per_s", "lr_")


def tiny_cfg(tmp_path, **kw) -> Config:
    base = dict(tasks=["chain_sum"], rollouts_per_prompt=8, prompts_per_step=4, max_new_tokens=8, steps=4,
                eval_every=2, eval_prompts=8, eval_samples=4, eval_k=[1, 4], checkpoint_every=2,
                run_dir=str(tmp_path), lr=1e-3, max_resample_rounds=1)
    base.update(kw)
    return Config(**base)


def toy_batch(correct_groups: list[list[int]]) -> RolloutBatch:
    P, N = len(correct_groups), len(correct_groups[0])
    B = P * N
    correct = torch.tensor(correct_groups, dtype=torch.bool).reshape(-1)
    return RolloutBatch(prompts=[f"q{p}" for p in range(P)], prompt_ids=[[1, 2]] * P, n=N,
                        response_ids=torch.arange(B).reshape(B, 1), logprobs=torch.zeros(B, 1),
                        lengths=torch.ones(B, dtype=torch.long), truncated=torch.zeros(B, dtype=torch.bool),
                        texts=[str(i) for i in range(B)], rewards=correct.float(), correct=correct)


def test_dynamic_sampling_drops_exactly_the_uniform_groups():
    batch = toy_batch([[1, 1, 1], [0, 1, 0], [0, 0, 0], [1, 0, 1], [1, 1, 1]])
    kept, stats = S.filter_groups(batch)
    assert kept.prompts == ["q1", "q3"]
    assert kept.texts == ["3", "4", "5", "9", "10", "11"]  # the samples of groups 1 and 3, in order
    assert (stats.generated_groups, stats.kept_groups, stats.all_correct_groups, stats.all_wrong_groups) == (5, 2, 2, 1)
    assert stats.pass_rate == pytest.approx(0.4)


def _comparable(df: pd.DataFrame) -> pd.DataFrame:
    keep = [c for c in df.columns if not c.startswith(TIMING) and c not in TIMING]
    return df[keep].reset_index(drop=True)


def test_resume_equals_uninterrupted(tmp_path):
    torch.manual_seed(0)
    with Trainer(tiny_cfg(tmp_path, run_name="full"), progress=False) as t:
        full = t.run()
    with Trainer(tiny_cfg(tmp_path, run_name="split"), progress=False) as t:
        t.run(steps=2)
    with Trainer.resume(tmp_path / "split", progress=False) as t:
        assert t.step_idx == 2
        resumed = t.run()
    assert len(full) == len(resumed) == 5  # row 0 (initial eval) + 4 steps
    pd.testing.assert_frame_equal(_comparable(full), _comparable(resumed))
    assert full["eval/chain_sum/pass@1"].notna().sum() == 3  # steps 0, 2, 4


def test_reset_resets_reference_and_optimizer(tmp_path):
    with Trainer(tiny_cfg(tmp_path, steps=1, eval_every=0, kl_beta=0.1), progress=False) as t:
        t.run()
        assert t.optimizer.state, "AdamW has moments after a step"
        ref0 = {k: v.clone() for k, v in t.reference.state_dict().items()}
        pol = t.policy.state_dict()
        assert any(not torch.equal(ref0[k], pol[k]) for k in pol), "one update must move the policy off the reference"
        old_opt = t.optimizer
        t.reset_reference("test")
        assert all(torch.equal(t.reference.state_dict()[k], pol[k]) for k in pol)
        assert t.optimizer is not old_opt and not t.optimizer.state
        assert not any(p.requires_grad for p in t.reference.parameters())
        events = [e["event"] for e in t.run_dir.read_events()]
        assert "reset" in events


def test_reset_every_k_steps_is_logged_and_keeps_optimizer_when_asked(tmp_path):
    cfg = tiny_cfg(tmp_path, steps=2, eval_every=0, kl_beta=0.1, reset_every=1, reset_optimizer=False)
    with Trainer(cfg, progress=False) as t:
        df = t.run()
        assert df["reset"].tolist() == [True, True]
        assert t.optimizer.state, "reset_optimizer=False (ProRL v2) keeps the AdamW moments"
        pol = t.policy.state_dict()
        assert all(torch.equal(t.reference.state_dict()[k], pol[k]) for k in pol)


def test_metrics_row_has_the_documented_columns(tmp_path):
    with Trainer(tiny_cfg(tmp_path, steps=1, eval_every=1, kl_beta=0.01), progress=False) as t:
        df = t.run()
    row = df.iloc[-1]
    for col in ("reward_mean", "pass_at_1", "ds_pass_rate", "entropy", "kl", "clipfrac_low", "clipfrac_high",
                "response_length_mean", "response_length_max", "truncation_rate", "samples", "tokens",
                "samples_per_s", "tokens_per_s", "time/rollout", "time/score", "time/logprobs", "time/update",
                "time/sync", "cum_samples", "cum_trained_samples", "cum_updates", "cum_wall_s", "trained_samples",
                "updates", "rollout_rounds", "refill_rounds", "ds_round_cap", "ds_sample_cap", "ds_cap_hit",
                "kept_groups", "surplus_groups", "ds_generated_groups", "ds_all_correct_groups",
                "ds_all_wrong_groups", "eval/chain_sum/pass@1", "eval/chain_sum/pass@4"):
        assert col in df.columns, col
    assert 0 <= row["ds_pass_rate"] <= 1
    assert row["entropy"] > 0
    assert row["eval/chain_sum/pass@4"] >= row["eval/chain_sum/pass@1"]
    # on-policy with a single mini-batch: the PPO ratio is exactly 1, nothing is clipped
    assert row["clipfrac_low"] == 0 and row["clipfrac_high"] == 0
    assert len(pd.read_parquet(t.run_dir.metrics_path)) == len(df)


def test_dynamic_sampling_refills_up_to_the_declared_cap_and_counts_every_generated_sample(tmp_path):
    """N=2 leaves many groups uniform (both right or both wrong), so steps refill; every round's samples count in
    ``samples`` / ``cum_samples`` (generated), only the kept groups in ``trained_samples``, and each refill is logged."""
    P, N, cap = 4, 2, 3
    cfg = tiny_cfg(tmp_path, rollouts_per_prompt=N, prompts_per_step=P, max_resample_rounds=cap - 1, steps=4,
                   eval_every=0, optimizer_steps_per_step=2)
    with Trainer(cfg, progress=False) as t:
        df = t.run()
        events = [e for e in t.run_dir.read_events() if e["event"] == "refill"]
    assert (df["ds_round_cap"] == cap).all() and (df["ds_sample_cap"] == cap * P * N).all()
    assert (df["samples"] == df["rollout_rounds"] * P * N).all()
    assert (df["rollout_rounds"] <= cap).all() and (df["refill_rounds"] == df["rollout_rounds"] - 1).all()
    assert df["refill_rounds"].sum() > 0, "N=2 should leave some first rounds short of P informative groups"
    assert (df["ds_cap_hit"] == (df["kept_groups"] < P)).all()
    dropped = df["ds_all_correct_groups"] + df["ds_all_wrong_groups"]  # every generated group: kept or dropped by kind
    assert (df["ds_generated_groups"] == df["rollout_rounds"] * P).all()
    assert np.allclose(df["ds_pass_rate"], 1 - dropped / df["ds_generated_groups"]) and dropped.sum() > 0
    assert (df.loc[~df["ds_cap_hit"], "rollout_rounds"] >= 1).all()
    trained = ~df["skipped"]
    assert (df.loc[trained, "trained_samples"] == df.loc[trained, "kept_groups"] * N).all()
    assert (df.loc[~trained, "trained_samples"] == 0).all()
    # updates: one per mini-batch of whole groups (fewer when fewer groups were kept than mini-batches)
    assert (df.loc[trained, "updates"] == df.loc[trained, "kept_groups"].clip(upper=2)).all()
    for col in ("samples", "trained_samples", "updates"):
        assert df[f"cum_{col}"].tolist() == df[col].cumsum().tolist(), col
    assert df["cum_samples"].iloc[-1] > df["cum_trained_samples"].iloc[-1]  # refills generated more than was kept
    logged = df[(df["refill_rounds"] > 0) | df["ds_cap_hit"]]
    assert [e["step"] for e in events] == logged["step"].tolist()
    for e, (_, row) in zip(events, logged.iterrows()):
        assert e["rounds"] == row["rollout_rounds"] and e["round_cap"] == cap
        assert sum(e["generated_samples_by_round"]) == row["samples"]
        assert sum(e["kept_groups_by_round"]) - row["kept_groups"] == row["surplus_groups"] >= 0


def test_without_dynamic_sampling_every_generated_sample_is_trained_on(tmp_path):
    with Trainer(tiny_cfg(tmp_path, dynamic_sampling=False, steps=2, eval_every=0), progress=False) as t:
        df = t.run()
        assert not [e for e in t.run_dir.read_events() if e["event"] == "refill"]
    assert (df["ds_round_cap"] == 1).all() and (df["rollout_rounds"] == 1).all() and not df["ds_cap_hit"].any()
    assert df["cum_trained_samples"].tolist() == df["cum_samples"].tolist() == [32, 64]


def test_a_budget_of_generated_samples_stops_the_run_and_thresholds_place_the_evaluations(tmp_path):
    """max_samples stops the run at the step whose cum_samples reaches it (that step evaluates); eval_at_samples
    evaluates at the first step reaching each threshold; refills make the steps' sample counts differ."""
    cfg = tiny_cfg(tmp_path, rollouts_per_prompt=2, prompts_per_step=4, max_resample_rounds=2, steps=50,
                   eval_every=0, eval_at_samples=[20, 45], max_samples=70, eval_prompts=2, eval_samples=2, eval_k=[1])
    assert cfg.evaluates and cfg.eval_due_samples(10, 20) and not cfg.eval_due_samples(20, 30)
    assert cfg.eval_due_samples(60, 70) and cfg.budget_spent(70) and not cfg.budget_spent(69)
    with Trainer(cfg, progress=False) as t:
        df = t.run()
        assert t.run_dir.read_status()["status"] == "finished"
    cum = df["cum_samples"].tolist()
    assert cum[-1] >= 70 and cum[-2] < 70, "the step that reaches the budget is the last"
    evaluated = df.loc[df["eval/chain_sum/pass@1"].notna(), "cum_samples"].tolist()
    expected = [0] + [next(c for c in cum if c >= m) for m in (20, 45, 70)]
    assert evaluated == sorted(set(expected))


def test_a_bad_eval_at_samples_names_the_field(tmp_path):
    from brorl_lab.core.config import ConfigError

    with pytest.raises(ConfigError, match="eval_at_samples"):
        tiny_cfg(tmp_path, eval_at_samples=[0])
    with pytest.raises(ConfigError, match="max_samples"):
        tiny_cfg(tmp_path, max_samples=-1)


MEMORY_PROBE = textwrap.dedent("""
    import json, resource, sys, torch
    torch.set_num_threads(1)
    from brorl_lab.core.batch import RolloutBatch
    from brorl_lab.core.config import Config
    from brorl_lab.core.models import load_policy
    from brorl_lab.rl import steps as S
    n, prompts, T, budget = int(sys.argv[1]), int(sys.argv[2]), 16, 2048
    policy, tok = load_policy("default")
    cfg = Config(rollouts_per_prompt=n, prompts_per_step=prompts, max_new_tokens=T, kl_beta=0.0,
                 train_micro_batch_tokens=budget)
    g = torch.Generator().manual_seed(0)
    B = prompts * n
    prompt_ids = [torch.randint(3, len(tok), (40,), generator=g).tolist() for _ in range(prompts)]
    batch = RolloutBatch(prompts=["x"] * prompts, prompt_ids=prompt_ids, n=n,
                         response_ids=torch.randint(3, len(tok), (B, T), generator=g), logprobs=torch.zeros(B, T),
                         lengths=torch.full((B,), T), truncated=torch.ones(B, dtype=torch.bool), texts=[""] * B,
                         rewards=torch.rand(B, generator=g), correct=torch.zeros(B, dtype=torch.bool))
    batch.meta["temperature"] = 1.0
    opt = torch.optim.AdamW(policy.parameters(), lr=1e-5)
    adv = S.advantages(batch, "grpo")
    base = int(open("/proc/self/statm").read().split()[1]) * 4096 // 1024  # resident KB: model + batch loaded
    for _ in range(2):  # the first update also allocates the AdamW moments
        S.update(policy, opt, batch, adv, cfg=cfg)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"n": n, "base_kb": base, "peak_kb": peak, "growth_kb": peak - base}))
""")


def _peak(n: int, prompts: int) -> dict:
    out = subprocess.run([sys.executable, "-c", MEMORY_PROBE, str(n), str(prompts)], capture_output=True, text=True,
                         check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_update_peak_memory_is_set_by_the_micro_batch_not_by_n():
    small, large = _peak(16, 2), _peak(512, 2)  # 32 vs 1024 sequences, the same 2048-token micro-batches
    assert large["peak_kb"] <= 1.5 * small["peak_kb"], (small, large)
    # the stronger form: what the update itself adds on top of the loaded model stays within 1.5x too
    assert large["growth_kb"] <= 1.5 * small["growth_kb"], (small, large)


@pytest.mark.slow
def test_short_run_raises_held_out_pass_at_1_on_the_easiest_family(tmp_path):
    """End to end on the shipped model: 20 steps of GRPO (16 prompts x N=8, lr 3e-4, seed 0) on spell_backward,
    the family the default model solves most often. Measured when written: held-out pass@1 (100 eval prompts x 4
    samples, T=1.0) 0.650 -> 0.728. The assertion asks for +3 points, about one standard error of the difference
    below what was measured, so a broken update (wrong sign, wrong positions, no sync) fails it."""
    cfg = Config(tasks=["spell_backward"], rollouts_per_prompt=8, prompts_per_step=16, max_new_tokens=8, steps=20,
                 eval_every=20, eval_prompts=100, eval_samples=4, eval_k=[1], eval_temperature=1.0, eval_top_p=1.0,
                 lr=3e-4, kl_beta=0.0, checkpoint_every=0, run_dir=str(tmp_path), seed=0)
    with Trainer(cfg, progress=False) as t:
        df = t.run()
    before, after = df["eval/spell_backward/pass@1"].dropna().tolist()
    assert after - before >= 0.03, (before, after)
