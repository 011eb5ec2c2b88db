"""Per-prompt allocation of the rollout budget (issue 44): the allocators, groups of unequal size through every
stage of the step (engines, dynamic sampling, advantages, log-probs, loss, metrics), and `uniform` left bit for bit.

Every ragged computation is checked against an independent one written here: advantages group by group, the
knapsack against exhaustive search, Theorem 1's per-prompt gain against the mass balance of one draw.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pandas as pd
import pytest
import torch
from helpers_models import save_tiny

from brorl_lab.core.batch import RolloutBatch
from brorl_lab.core.config import Config, ConfigError
from brorl_lab.rl import algo
from brorl_lab.rl import steps as S
from brorl_lab.rl.allocation import ALLOCATORS, allocation_metrics, binomial_draw, make_allocator, simulate
from brorl_lab.rl.logprobs import compute_logprobs
from brorl_lab.rl.spec import check
from brorl_lab.rl.trainer import Trainer
from brorl_lab.rollout.engines import RolloutSampling, make_engine
from brorl_lab.rollout.engines.common import plan_chunks
from brorl_lab.rollout.engines.ray_engine import generate_sharded, plan_shards
from brorl_lab.theory import allocation as T
from brorl_lab.theory import balance

PROMPTS = ["What is 12+7?", "Add 3 and 4:", "Count 1 2 3 4 5 6 7 8 9", "x"]
SP = RolloutSampling(temperature=1.0, max_new_tokens=6, seed=11)
TIMING = ("time/", "step_wall_s", "cum_wall_s", "samples_per_s", "tokens_per_s")


# ---- the allocators -----------------------------------------------------------------------------------------------
P_CASES = [np.array([0.0, 0.02, 0.5, 0.97, 1.0, 0.3]), np.zeros(5), np.ones(4), np.linspace(0.01, 0.99, 7)]


@pytest.mark.parametrize("name", ["two_stage", "until_signal"])
@pytest.mark.parametrize("case", range(len(P_CASES)))
@pytest.mark.parametrize("per_prompt,cap", [(4, 4), (8, 16), (16, 512), (40, 50)])
def test_allocators_spend_exactly_the_budget_within_one_and_the_cap(name, case, per_prompt, cap):
    p = P_CASES[case]
    budget = per_prompt * len(p)
    alloc = make_allocator(name, probe=4, cap=cap, round_size=3).allocate(
        binomial_draw(p, np.random.default_rng(case)), num_prompts=len(p), budget=budget)
    assert sum(alloc.sizes) == budget
    assert all(1 <= n <= cap for n in alloc.sizes)
    assert [sum(r[i] for r in alloc.rounds) for i in range(len(p))] == alloc.sizes  # rounds add up per prompt
    assert all(0 <= k <= n for k, n in zip(alloc.successes, alloc.sizes))


def test_a_budget_outside_probe_and_cap_is_refused_in_one_line():
    a = make_allocator("two_stage", probe=4, cap=8)
    for budget in (3 * 4 - 1, 3 * 8 + 1):
        with pytest.raises(ValueError, match=r"^budget: got .*allowed: 12 \.\. 24"):
            a.allocate(binomial_draw([0.5] * 3, np.random.default_rng(0)), num_prompts=3, budget=budget)
    with pytest.raises(ValueError, match="rollout_allocation.*'two_stage'"):
        make_allocator("two_stages")


def _brute_force(gain, P: int, extra: int, room: int) -> float:
    best = -1.0
    for m in itertools.product(range(room + 1), repeat=P):
        if sum(m) == extra:
            best = max(best, sum(gain(p, m[p]) for p in range(P)))
    return best


def test_two_stage_greedy_equals_the_exhaustive_knapsack():
    """The greedy stage 2 maximises sum_p g_p(m_p) exactly (concave gains, unit costs): checked against all
    allocations of the same extra draws on a small case with probes all-wrong, all-right and mixed."""
    p = [0.05, 0.9, 0.5, 0.2]
    outcomes = {0: [0, 0, 0], 1: [1, 1, 1], 2: [1, 0, 0], 3: [0, 0, 0]}
    a = make_allocator("two_stage", probe=3, cap=9)
    answers = iter([[torch.tensor(outcomes[i], dtype=torch.bool) for i in range(4)]])

    def draw(idx, counts):
        if len(idx) == 4 and counts == [3] * 4:
            return next(answers)
        return binomial_draw(p, np.random.default_rng(0))(idx, counts)

    alloc = a.allocate(draw, num_prompts=4, budget=4 * 3 + 7)
    extra = [n - 3 for n in alloc.sizes]
    post = [(1 + k, 1 + 3 - k) for k in (0, 3, 1, 0)]

    def gain(i, m):
        pa, pb = post[i]
        pbar = pa / (pa + pb)
        return (T.informative_given_probe(pa, pb, (0, 3, 1, 0)[i], 3, m)
                + 1e-3 * pbar * (1 - pbar) * (1 / 3 - 1 / (3 + m)))

    assert sum(gain(i, m) for i, m in enumerate(extra)) == pytest.approx(_brute_force(gain, 4, 7, 6), abs=1e-12)
    assert extra[2] <= 1  # the mixed probe is already informative: its extra draws only break ties


def test_two_stage_remembers_prompts_and_spends_on_the_unsolved_ones():
    a = make_allocator("two_stage", probe=2, cap=64)
    rng = np.random.default_rng(0)
    p = [0.0, 1.0, 0.5, 0.05]
    keys = ["never", "always", "half", "rare"]
    for _ in range(3):
        alloc = a.allocate(binomial_draw(p, rng), num_prompts=4, budget=4 * 16, keys=keys)
    assert a.history["never"][0] == 0 and a.history["always"][0] == a.history["always"][1] > 0
    assert sum(d for _, d in a.history.values()) == 3 * 4 * 16  # every draw of the three steps remembered
    assert a.prior("never")[1] > a.prior("never")[0]  # a prior from earlier draws, at most prior_draws of them
    assert sum(a.prior("never")) <= 2 + 16 + 1e-9
    # the half-solved prompt's probe is (almost surely) mixed already; the rare and unsolved ones get the draws
    assert alloc.sizes[2] < min(alloc.sizes[0], alloc.sizes[3])


def test_until_signal_stops_a_group_once_it_holds_both_outcomes():
    def draw(idx, counts):  # prompt 0 alternates, prompt 1 never succeeds, prompt 2 succeeds on its 6th draw
        out = []
        for i, k in zip(idx, counts):
            seen = drawn[i]
            out.append(torch.tensor([(i == 0 and (seen + j) % 2 == 1) or (i == 2 and seen + j == 5)
                                     for j in range(k)]))
            drawn[i] += k
        return out

    drawn = [0, 0, 0]
    alloc = make_allocator("until_signal", probe=2, cap=12, round_size=2).allocate(draw, num_prompts=3, budget=3 * 8)
    assert alloc.rounds[0] == [2, 2, 2] and alloc.rounds[1] == [0, 2, 2]  # prompt 0 had signal after its probe
    assert alloc.rounds[2] == [0, 2, 2] and alloc.rounds[3] == [0, 2, 0]  # prompt 2 got its success at draw 6
    assert alloc.sizes[1] == 12 and sum(alloc.sizes) == 24 and alloc.informative == [True, False, True]


# ---- theory -------------------------------------------------------------------------------------------------------
def test_informative_probability_and_theorem1_gain_of_one_prompt():
    p = np.array([0.0, 0.01, 0.3, 0.5, 1.0])
    for n in (1, 2, 16, 512):
        k = np.arange(n + 1)
        binom = np.array([[math.comb(n, j) * q ** j * (1 - q) ** (n - j) for j in k] for q in p])
        assert T.informative_probability(p, n) == pytest.approx(binom[:, 1:n].sum(1), abs=1e-12)
    s = T.informative_probability(0.03, np.arange(1, 200))
    assert np.all(np.diff(np.diff(s)) <= 1e-15)  # concave in N: the greedy is exact
    # Theorem 1 on two outcomes with group-centred rewards: every mixed draw gives N dQ/lr = 2 p^2 (1-p)^2
    for q, n, k in ((0.3, 8, 1), (0.3, 8, 5), (0.9, 4, 3)):
        mb = balance.mass_balance([q, 1 - q], [True, False], np.array([True, True]), r_c=1 - k / n, r_w=-k / n,
                                  lr=1.0, n=n)
        assert n * mb.total == pytest.approx(2 * q ** 2 * (1 - q) ** 2, rel=1e-9)
    assert T.theorem1_gain(0.3, 8) == pytest.approx(2 * 0.09 * 0.49 * (1 - 0.3 ** 8 - 0.7 ** 8))


def test_beta_power_mean_and_the_simulated_uniform_arm():
    a, b, m = 2.0, 5.0, 7
    grid = np.linspace(0, 1, 200_001)
    dens = grid ** (a - 1) * (1 - grid) ** (b - 1)
    assert T.beta_power_mean(a, b, m) == pytest.approx(np.trapezoid(dens * grid ** m, grid) / np.trapezoid(dens, grid),
                                                       rel=1e-6)
    p = T.p_population("mixture", 64, a=0.3, b=3.0, solved=0.3, unsolved=0.2, seed=1)
    exact = simulate(p, 64 * 16, "uniform:16")
    mc = simulate(p, 64 * 16, "uniform", reps=200, seed=0)
    assert mc["informative"] == pytest.approx(exact["informative"], rel=0.05)
    two = simulate(p, 64 * 16, "two_stage", reps=20, seed=0, probe=4, cap=512)
    assert two["informative_per_sample"] > exact["informative_per_sample"]  # the point of allocating


# ---- groups of unequal size ---------------------------------------------------------------------------------------
def _reference_advantages(name: str, rewards: list[list[float]], eps: float = algo.ADV_EPS) -> list[float]:
    """Group by group, by the textbook formulas (no torch reductions shared with the code)."""
    out, centred = [], []
    for g in rewards:
        n = len(g)
        mean = sum(g) / n
        uniform = max(g) == min(g)
        c = [0.0 if uniform else r - mean for r in g]
        if name == "grpo":
            std = math.sqrt(sum((r - mean) ** 2 for r in g) / (n - 1)) if n > 1 else 0.0
            out += [0.0 if uniform else (r - mean) / (std + eps) for r in g]
        elif name == "dr_grpo":
            out += c
        elif name == "rloo":
            out += [0.0 if uniform else r - (sum(g) - r) / (n - 1) for r in g]
        centred.append((c, uniform))
    if name == "reinforce_pp_baseline":
        flat = [x for c, _ in centred for x in c]
        mu = sum(flat) / len(flat)
        sd = math.sqrt(sum((x - mu) ** 2 for x in flat) / (len(flat) - 1))
        out = [0.0 if u else (x - mu) / (sd + eps) for c, u in centred for x in c]
    return out


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo", "reinforce_pp_baseline"])
def test_unequal_group_advantages_match_a_per_group_reference(name):
    cap = 9
    groups = [[1.0], [0.0, 1.0, 1.0], [0.2, 0.2, 0.2, 0.2], [0.0, 0.5, 1.0, 0.25, 0.0],
              [float(i % 3 == 0) for i in range(cap)], [0.0]]  # a group of 1, ..., a group at the cap
    rewards = torch.tensor([r for g in groups for r in g])
    got = algo.compute_advantages(name, rewards, [len(g) for g in groups])
    assert got.tolist() == pytest.approx(_reference_advantages(name, groups), abs=1e-5)
    uniform = torch.rand(12)  # equal sizes through the ragged path: the uniform path's numbers exactly
    assert torch.equal(algo.ragged_advantages(name, uniform, [4, 4, 4]), algo.compute_advantages(name, uniform, 4))


def toy_ragged(sizes: list[int], correct: list[int]) -> RolloutBatch:
    B = sum(sizes)
    c = torch.tensor(correct, dtype=torch.bool)
    return RolloutBatch(prompts=[f"q{p}" for p in range(len(sizes))], prompt_ids=[[1, 2 + p] for p in range(len(sizes))],
                        n=max(sizes), response_ids=torch.arange(B).reshape(B, 1) % 50 + 3,
                        logprobs=torch.zeros(B, 1), lengths=torch.ones(B, dtype=torch.long),
                        truncated=torch.zeros(B, dtype=torch.bool), texts=[str(i) for i in range(B)],
                        rewards=c.float(), correct=c, sizes=sizes)


def test_ragged_batch_rows_select_concat_and_dynamic_sampling():
    b = toy_ragged([1, 3, 2, 4], [1, 0, 1, 1, 0, 0, 1, 1, 1, 1])
    assert b.is_ragged and b.n == 4 and b.size == 10
    assert b.prompt_index.tolist() == [0, 1, 1, 1, 2, 2, 3, 3, 3, 3]
    assert b.sample_index.tolist() == [0, 0, 1, 2, 0, 1, 0, 1, 2, 3]
    assert b.rows_of([2, 0]).tolist() == [4, 5, 0]
    assert b.group_mean(b.correct.float()).tolist() == pytest.approx([1.0, 2 / 3, 0.0, 1.0])
    kept, stats = S.filter_groups(b)  # only prompt 1 holds both outcomes
    assert kept.prompts == ["q1"] and kept.texts == ["1", "2", "3"] and not kept.is_ragged and kept.n == 3
    assert (stats.kept_groups, stats.all_correct_groups, stats.all_wrong_groups) == (1, 2, 1)
    joined = RolloutBatch.concat([b.select_prompts([3]), kept])
    assert joined.group_sizes.tolist() == [4, 3] and joined.texts == ["6", "7", "8", "9", "1", "2", "3"]
    with pytest.raises(ValueError, match="grouped"):
        b.grouped(b.rewards)
    m = S.group_metrics(b)
    assert (m["alloc/n_mean"], m["alloc/n_max"], m["alloc/n_min"], m["alloc/informative_groups"]) == (2.5, 4, 1, 1)
    assert m["alloc/informative_sample_share"] == pytest.approx(3 / 10) and m["alloc/n_le_4"] == 2
    assert allocation_metrics(torch.tensor([3]), torch.tensor([1]))["alloc/informative_per_sample"] == pytest.approx(1 / 3)


# ---- engines ------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from brorl_lab.core.models import load_policy

    path = save_tiny(tmp_path_factory.mktemp("tiny_alloc"), seed=0, eos_shift=3.5)
    model, tok = load_policy(str(path), device="cpu")
    return model.eval(), tok, path


def test_plan_chunks_per_prompt_counts_stay_prompt_major():
    assert plan_chunks(5, [2, 2, 7, 1, 1], 4) == [([0, 1], 2), ([2], 4), ([2], 3), ([3, 4], 1)]
    assert plan_chunks(3, [4, 4, 4], 8) == plan_chunks(3, 4, 8)


@pytest.mark.parametrize("kind", ["torch", "hf"])
def test_engines_draw_a_per_prompt_n(tiny, kind):
    model, tok, _ = tiny
    engine = make_engine(kind, model, tok, device="cpu", chunk_sequences=4)
    counts = [1, 5, 2, 3]
    b = engine.generate(PROMPTS, counts, SP)
    assert b.group_sizes.tolist() == counts and b.size == 11 and b.is_ragged
    assert b.prompt_ids == [tok(p)["input_ids"] for p in PROMPTS]
    # each row's log-probs are the trainer's for that row's own prompt (the ragged prompt_index through logprobs)
    for layout in ("packed", "shared_prefix"):
        ref = compute_logprobs(model, b, temperature=1.0, micro_batch_tokens=64, layout=layout)
        assert (ref - b.logprobs).abs()[b.response_mask].max() < 1e-4
    same = engine.generate(PROMPTS, [3, 3, 3, 3], SP)  # equal counts: exactly the uniform call's batch
    uni = engine.generate(PROMPTS, 3, SP)
    assert not same.is_ragged and torch.equal(same.response_ids, uni.response_ids) and same.texts == uni.texts
    with pytest.raises(ValueError, match=r"n \(rollouts_per_prompt\): got 2 per-prompt counts for 4 prompts"):
        engine.generate(PROMPTS, [1, 2], SP)
    with pytest.raises(ValueError, match=r"n\[1\]"):
        engine.generate(PROMPTS, [1, 0, 1, 1], SP)
    engine.close()


def test_ray_split_of_a_per_prompt_n_balances_samples(tiny):
    shards = plan_shards(4, [1, 9, 2, 3], 3)  # 15 samples, target 5 a shard: prompt 1 cut in two
    assert [(s.prompts, s.n) for s in shards] == [(range(0, 1), 1), (range(1, 2), 5), (range(1, 2), 4),
                                                  (range(2, 4), [2, 3])]
    assert sum(s.rows for s in shards) == 15
    model, tok, _ = tiny
    engine = make_engine("torch", model, tok, device="cpu")
    b = generate_sharded(engine, PROMPTS, [1, 9, 2, 3], SP, workers=3)
    assert b.group_sizes.tolist() == [1, 9, 2, 3] and b.meta["shards"][3]["counts"] == [2, 3]
    ref = compute_logprobs(model, b, temperature=1.0, micro_batch_tokens=64)
    assert (ref - b.logprobs).abs()[b.response_mask].max() < 1e-4
    engine.close()


def test_update_on_unequal_groups_equals_the_rows_laid_out_one_prompt_each(tiny):
    """The loss over a ragged batch is the token mean over its rows, whatever the grouping: the same rows as a
    batch of one-sample groups with the same advantages give the same gradient step."""
    model, tok, _ = tiny
    engine = make_engine("torch", model, tok, device="cpu")
    b = engine.generate(PROMPTS, [1, 4, 2, 3], SP)
    b.rewards = (torch.arange(b.size) % 3 == 0).float()
    adv = S.advantages(b, "grpo")
    flat = RolloutBatch(prompts=[b.prompts[p] for p in b.prompt_index.tolist()],
                        prompt_ids=[b.prompt_ids[p] for p in b.prompt_index.tolist()], n=1,
                        response_ids=b.response_ids, logprobs=b.logprobs, lengths=b.lengths, truncated=b.truncated,
                        texts=b.texts, pad_id=b.pad_id, rewards=b.rewards, meta=dict(b.meta))
    cfg = Config(kl_beta=0.0, rollouts_per_prompt=4, prompts_per_step=4, lr=1e-2, max_new_tokens=6)
    after = []
    for batch in (b, flat):
        policy = __import__("copy").deepcopy(model).train()
        opt = torch.optim.SGD(policy.parameters(), lr=1.0)  # the step is the gradient (Adam's sign-like step is not)
        S.update(policy, opt, batch, adv, cfg=cfg)
        after.append(torch.cat([q.detach().reshape(-1) for q in policy.parameters()]))
    assert torch.allclose(after[0], after[1], atol=1e-6)
    assert not torch.allclose(after[0], torch.cat([q.detach().reshape(-1) for q in model.parameters()]), atol=1e-4)
    assert adv[0] == 0  # the group of one has no signal
    engine.close()


def test_rollout_allocated_scores_one_batch_of_exactly_the_budget(tiny):
    from brorl_lab.rl.steps import sample_prompts

    model, tok, _ = tiny
    engine = make_engine("torch", model, tok, device="cpu")
    items = sample_prompts(["chain_sum"], 4, seed=0)
    for name in ("two_stage", "until_signal"):
        b = S.rollout_allocated(engine, items, name, budget=4 * 6, sampling=SP, tokenizer=tok, probe=2, cap=12,
                                round_size=2)
        assert b.size == 24 and b.items == items and b.rewards is not None and b.correct is not None
        assert b.group_sizes.tolist() == [sum(r[p] for r in b.meta["allocation"]["rounds"]) for p in range(4)]
        rescored = S.score(b, template="plain")
        assert torch.equal(rescored.correct, b.correct)  # every row scored against its own prompt's item
    engine.close()


# ---- the trainer: uniform untouched, allocation end to end --------------------------------------------------------
#: a 2-step spell_backward run (seed 3, N=4, 4 prompts, one refill round) recorded from commit 17704c5, before
#: per-prompt allocation existed (a scratch `git worktree` of that commit; OMP_NUM_THREADS=1)
RECORDED = {"samples": [32, 32], "tokens": [150, 158], "kept_groups": [4, 4], "reward_mean": [0.875, 0.9453125],
            "pass_at_1": [0.6875, 0.8125], "loss": [-0.03085586428642273, -0.012720621190965176],
            "grad_norm": [3.538334608078003, 5.725953102111816],
            "entropy": [0.32352930307388306, 0.31791603565216064]}
RECORDED_WEIGHT_SUM = 1332.5327925356441


def _recorded_cfg(tmp_path, **kw) -> Config:
    base = dict(tasks=["spell_backward"], rollouts_per_prompt=4, prompts_per_step=4, max_new_tokens=8, steps=2,
                eval_every=0, checkpoint_every=0, run_dir=str(tmp_path), lr=1e-3, max_resample_rounds=1, seed=3,
                torch_threads=1)
    return Config(**{**base, **kw})


def test_uniform_reproduces_the_runs_from_before_allocation_bit_for_bit(tmp_path):
    frames, sums = [], []
    for name, kw in (("default", {}), ("explicit", {"rollout_allocation": "uniform"})):
        with Trainer(_recorded_cfg(tmp_path, run_name=name, **kw), progress=False) as t:
            frames.append(t.run())
            sums.append(sum(float(q.detach().double().sum()) for q in t.policy.parameters()))
    keep = [c for c in frames[0].columns if not c.startswith(TIMING)]
    pd.testing.assert_frame_equal(frames[0][keep], frames[1][keep])
    assert sums[0] == sums[1]
    for col, values in RECORDED.items():
        assert frames[0][col].tolist() == values, col
    assert sums[0] == RECORDED_WEIGHT_SUM
    assert frames[0]["alloc/n_mean"].tolist() == [4.0, 4.0]  # the allocation columns, on every run


@pytest.mark.parametrize("name", ["two_stage", "until_signal"])
def test_a_run_with_allocation_spends_the_budget_and_logs_the_allocation(tmp_path, name):
    cfg = _recorded_cfg(tmp_path, rollout_allocation=name, rollouts_per_prompt=6, allocation_probe=2,
                        allocation_cap=16, steps=1, dynamic_sampling=False, run_name=name)
    with Trainer(cfg, progress=False) as t:
        row = t.run().iloc[-1]
    assert row["samples"] == 24 and row["alloc/n_mean"] == 6.0 and 2 <= row["alloc/n_min"] <= row["alloc/n_max"] <= 16
    assert row["trained_samples"] == 24 and np.isfinite(row["loss"])


def test_a_resumed_two_stage_run_keeps_its_prior_and_equals_the_uninterrupted_run(tmp_path, monkeypatch):
    """The two_stage prior (each prompt's earlier draws) is part of the checkpoint: a run stopped after step 2 and
    resumed allocates steps 3-4 as the uninterrupted run does. Six training prompts, four a step: steps 3-4 meet
    prompts steps 1-2 drew, so a resume that forgot them would allocate differently (checked: it does)."""
    import json

    monkeypatch.setenv("BRORL_LAB_CACHE", str(tmp_path / "cache"))
    qa = tmp_path / "qa.jsonl"
    qa.write_text("".join(json.dumps({"question": f"State the final answer to the following arithmetic problem: "
                                                  f"{x} + {y} =", "answer": str(x + y)}) + "\n"
                          for x, y in ((1, 2), (3, 4), (2, 2), (5, 1), (6, 3), (4, 4), (7, 1), (2, 5))))
    kw = dict(tasks=[f"local:{qa}"], rollout_allocation="two_stage", rollouts_per_prompt=6, allocation_probe=2, allocation_cap=16,
              dynamic_sampling=False, steps=4, checkpoint_every=2)
    with Trainer(_recorded_cfg(tmp_path, run_name="full", **kw), progress=False) as t:
        full = t.run()
        memory = t.allocator.state_dict()
    with Trainer(_recorded_cfg(tmp_path, run_name="split", **kw), progress=False) as t:
        t.run(steps=2)
        halfway = t.allocator.state_dict()
    assert 0 < len(halfway["history"]) < len(memory["history"])
    with Trainer.resume(tmp_path / "split", progress=False) as t:
        assert t.allocator.state_dict() == halfway  # restored from the checkpoint, not started afresh
        resumed = t.run()
        assert t.allocator.state_dict() == memory
    keep = [c for c in full.columns if not c.startswith(TIMING)]
    pd.testing.assert_frame_equal(full[keep], resumed[keep])
    with pytest.raises(ValueError, match="allocator state of 'two_stage'"):
        make_allocator("until_signal").load_state_dict(memory)


def test_config_names_and_bounds_of_the_allocation():
    assert "two_stage" in ALLOCATORS.names() and Config().rollout_allocation == "uniform"
    with pytest.raises(ConfigError, match="rollout_allocation"):
        check(Config(rollout_allocation="knapsack"))
    with pytest.raises(ConfigError, match="allocation_probe.*at most rollouts_per_prompt=4"):
        Config(rollout_allocation="two_stage", rollouts_per_prompt=4, allocation_probe=8)
    with pytest.raises(ConfigError, match="allocation_cap.*at least rollouts_per_prompt=16"):
        Config(rollout_allocation="until_signal", rollouts_per_prompt=16, allocation_cap=8)


def test_launch_to_verl_refuses_a_per_prompt_allocation_in_one_line(tmp_path):
    from brorl_lab.lab.verl_launch import launch_verl

    cfg = Config(rollout_allocation="two_stage", rollouts_per_prompt=16, prompts_per_step=4)
    with pytest.raises(ConfigError, match=r"^rollout_allocation: 'two_stage' cannot run on verl .*no per-prompt N.*"
                                          r"allowed: uniform"):
        launch_verl(cfg, tmp_path / "out")
    assert not (tmp_path / "out").exists()


# (the same per-prompt n on the real backends: tests/test_vllm_engine.py and tests/test_ray_engine.py, on their engines)


