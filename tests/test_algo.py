"""brorl_lab.rl.algo: every estimator and loss against a hand computation in plain Python, plus the properties the
trainer relies on (micro-batch sums, on-policy equivalence of ppo_clip and pg, where clipping acts)."""

from __future__ import annotations

import itertools
import math
import statistics
from fractions import Fraction

import numpy as np
import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from brorl_lab.core.config import Config, ConfigError
from brorl_lab.rl import algo
from brorl_lab.rl.algo import (
    ADVANTAGES,
    KL_ESTIMATORS,
    LOSS_AGGREGATIONS,
    POLICY_LOSSES,
    aggregate,
    compute_advantages,
    entropy_from_logits,
    kl_penalty,
    loss_normalisers,
    merge_metrics,
    pass_at_k,
    pass_at_k_array,
    truncated_is_weights,
)

EPS = algo.ADV_EPS
MODES = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm")

# Three groups of N = 4 (prompt-major): binary, continuous, uniform (0.3 is not exact in binary floating point).
GROUPS = [[1.0, 0.0, 0.0, 1.0], [0.5, 0.2, 0.9, 0.1], [0.3, 0.3, 0.3, 0.3]]


def as_list(t: torch.Tensor) -> list:
    return t.detach().double().reshape(-1).tolist()


def assert_close(got, want, tol=1e-5):
    got, want = list(got), list(want)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert math.isclose(g, w, rel_tol=tol, abs_tol=tol), (got, want)


# ---- hand computations (plain Python) ---------------------------------------------------------------------------
def hand_grpo(groups, std_norm=True):
    out = []
    for g in groups:
        m, sd = statistics.fmean(g), statistics.stdev(g)  # stdev: the unbiased (N - 1) sample std
        out += [0.0 if len(set(g)) == 1 else (r - m) / (sd + EPS) if std_norm else r - m for r in g]
    return out


def hand_rloo(groups):
    return [r - statistics.fmean(g[:i] + g[i + 1:]) for g in groups for i, r in enumerate(g)]


def hand_reinforce_pp(groups):
    centered = [0.0 if len(set(g)) == 1 else r - statistics.fmean(g) for g in groups for r in g]
    m, sd = statistics.fmean(centered), statistics.stdev(centered)
    uniform = [len(set(g)) == 1 for g in groups for _ in g]
    return [0.0 if u else (c - m) / (sd + EPS) for c, u in zip(centered, uniform)]


def hand_ppo_token(r, a, eps_low, eps_high):
    clipped_r = min(max(r, 1 - eps_low), 1 + eps_high)
    return -min(r * a, clipped_r * a)


# ---- registries and config -------------------------------------------------------------------------------------
def test_registries_are_the_names_a_config_may_use():
    """Config keeps no copy of these lists: rl.spec.check reads the registries, so every registered name passes
    and a name outside them is one ConfigError naming the field."""
    from brorl_lab.rl.spec import check

    assert ADVANTAGES.names() == ["grpo", "dr_grpo", "rloo", "reinforce_pp_baseline"]
    assert POLICY_LOSSES.names() == ["ppo_clip", "pg"]
    assert all(getattr(ADVANTAGES.get(name), "needs_group", True) is True for name in ADVANTAGES)
    for field, registry_ in (("advantage", ADVANTAGES), ("policy_loss", POLICY_LOSSES),
                             ("kl_estimator", KL_ESTIMATORS), ("loss_agg", LOSS_AGGREGATIONS)):
        for name in registry_.names():
            check(Config(**{field: name}))
        with pytest.raises(ConfigError, match=f"'{field}'.*allowed: {', '.join(registry_.names())}"):
            check(Config(**{field: "nope"}))


def test_config_validates_algo_names_against_the_registries():
    from brorl_lab.rl.spec import check

    for name in ADVANTAGES:
        assert check(Config(advantage=name)).advantage == name
    for name in POLICY_LOSSES:
        assert check(Config(policy_loss=name)).policy_loss == name
    with pytest.raises(ConfigError, match="'grpoo'.*did you mean 'grpo'"):
        check(Config(advantage="grpoo"))
    with pytest.raises(ConfigError, match="policy_loss"):
        check(Config(policy_loss="ppo"))
    with pytest.raises(ConfigError, match="rollouts_per_prompt.*>= 2.*rloo"):
        check(Config(advantage="rloo", rollouts_per_prompt=1))


# ---- advantages --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name, hand", [
    ("grpo", hand_grpo),
    ("dr_grpo", lambda g: hand_grpo(g, std_norm=False)),
    ("rloo", hand_rloo),
    ("reinforce_pp_baseline", hand_reinforce_pp),
])
def test_advantages_equal_hand_computation(name, hand):
    rewards = torch.tensor(GROUPS)  # [P, N]
    adv = ADVANTAGES[name](rewards)  # [P, N]
    assert adv.shape == rewards.shape
    assert_close(as_list(adv), hand(GROUPS))
    assert as_list(adv[2]) == [0.0] * 4  # the uniform group: exactly zero
    flat = compute_advantages(name, rewards.reshape(-1), 4)  # [P*N]
    assert_close(as_list(flat), hand(GROUPS))


def test_grpo_std_norm_switch_and_dr_grpo_ignores_it():
    rewards = torch.tensor(GROUPS)
    assert_close(as_list(ADVANTAGES["grpo"](rewards, std_norm=False)), hand_grpo(GROUPS, std_norm=False))
    assert torch.equal(ADVANTAGES["dr_grpo"](rewards, std_norm=True), ADVANTAGES["dr_grpo"](rewards, std_norm=False))
    # the std division changes the scale of the continuous group but not its signs
    a, b = ADVANTAGES["grpo"](rewards)[1], ADVANTAGES["dr_grpo"](rewards)[1]
    assert torch.equal(a.sign(), b.sign()) and not torch.allclose(a, b)


@pytest.mark.parametrize("name", ADVANTAGES.names())
def test_uniform_groups_and_an_all_uniform_batch_give_zero_not_nan(name):
    rewards = torch.tensor([[0.3] * 5, [1.0] * 5, [0.0] * 5])  # every group uniform: all stds are 0
    adv = ADVANTAGES[name](rewards)
    assert torch.equal(adv, torch.zeros_like(adv))


def test_compute_advantages_groups_prompt_major():
    # sample b = p*N + s: the first three rewards are prompt 0's group, the last three prompt 1's (uniform)
    adv = compute_advantages("dr_grpo", torch.tensor([1.0, 0.0, 0.0, 5.0, 5.0, 5.0]), 3)
    assert_close(as_list(adv), [2 / 3, -1 / 3, -1 / 3, 0.0, 0.0, 0.0])


def test_compute_advantages_accepts_bool_rewards_and_detaches():
    adv = compute_advantages("grpo", torch.tensor([True, False, False, True]), 2)
    assert adv.dtype == torch.float32
    rewards = torch.tensor([1.0, 0.0, 0.5, 0.25], requires_grad=True)
    assert not compute_advantages("rloo", rewards, 2).requires_grad


@settings(max_examples=25, deadline=None)
@given(st.lists(st.lists(st.integers(0, 4), min_size=3, max_size=3), min_size=1, max_size=5))
def test_grpo_groups_are_standardised(groups):
    adv = ADVANTAGES["grpo"](torch.tensor(groups, dtype=torch.float64))  # [P, 3]
    for g, a in zip(groups, adv.tolist()):
        if len(set(g)) == 1:
            assert a == [0.0, 0.0, 0.0]
        else:  # mean 0 and unbiased std std/(std + eps) ~ 1
            assert abs(statistics.fmean(a)) < 1e-9
            assert math.isclose(statistics.stdev(a), 1.0, rel_tol=1e-5)


@pytest.mark.parametrize("kwargs, match", [
    (dict(name="grpoo", rewards=[1.0, 0.0], n=2), r"unknown advantage 'grpoo' \(did you mean 'grpo'\?\)"),
    (dict(name="grpo", rewards=[1.0, 0.0], n=1), r"argument 'n' got 1.*>= 2.*grpo"),
    (dict(name="grpo", rewards=[1.0, 0.0], n=0), r"argument 'n' got 0"),
    (dict(name="grpo", rewards=[1.0, 0.0], n=True), r"argument 'n' got True"),
    (dict(name="grpo", rewards=[1.0, 0.0, 1.0], n=2), r"argument 'rewards' got length 3.*multiple of n=2"),
    (dict(name="grpo", rewards=[], n=2), r"argument 'rewards' got length 0"),
    (dict(name="rloo", rewards=[1.0, float("nan")], n=2), r"argument 'rewards' got non-finite.*finite"),
    (dict(name="rloo", rewards=[[1.0, 0.0]], n=2), r"argument 'rewards' got shape \(1, 2\).*\[P\*N\]"),
    (dict(name="grpo", rewards=[1.0, 0.0], n=2, std_norm="yes"), r"argument 'std_norm' got 'yes'"),
    (dict(name="grpo", rewards=[1.0, 0.0], n=2, eps=0.0), r"argument 'eps' got 0.0"),
])
def test_compute_advantages_rejects_bad_input(kwargs, match):
    with pytest.raises(ValueError, match=match):
        compute_advantages(**kwargs)


def test_estimators_reject_single_rollout_groups():
    with pytest.raises(ValueError, match=r"rloo: argument 'rewards'.*N >= 2"):
        ADVANTAGES["rloo"](torch.ones(3, 1))


# ---- aggregation -------------------------------------------------------------------------------------------------
# A long (4 tokens) and a short (2 tokens) sequence; the padding holds inf, which must never leak in.
VALUES = torch.tensor([[1.0, 2.0, 3.0, 4.0], [10.0, 20.0, float("inf"), float("nan")]])
MASK = torch.tensor([[True, True, True, True], [True, True, False, False]])


@pytest.mark.parametrize("mode, kwargs, want", [
    ("token_mean", {}, (1 + 2 + 3 + 4 + 10 + 20) / 6),
    ("seq_mean_token_mean", {}, ((1 + 2 + 3 + 4) / 4 + (10 + 20) / 2) / 2),
    ("seq_mean_token_sum_norm", {}, 40 / (4 * 2)),
    ("seq_mean_token_sum_norm", {"max_response_len": 16}, 40 / (16 * 2)),
    ("token_mean", {"num_tokens": 10}, 40 / 10),
    ("seq_mean_token_mean", {"num_seqs": 5}, 17.5 / 5),
])
def test_aggregate_equals_hand_computation(mode, kwargs, want):
    assert math.isclose(float(aggregate(VALUES, MASK, mode, **kwargs)), want, rel_tol=1e-6)


def test_aggregation_modes_weigh_long_and_short_sequences_differently():
    """The per-token weight d(aggregate)/d(value): what each mode means."""
    weights = {}
    for mode in MODES:
        values = torch.zeros(2, 4, dtype=torch.float64, requires_grad=True)
        aggregate(values, MASK, mode).backward()
        weights[mode] = values.grad.tolist()
        assert weights[mode][1][2:] == [0.0, 0.0]  # padding gets no weight
    # (weight of a token of the long sequence, of the short one)
    assert_close([weights["token_mean"][0][0], weights["token_mean"][1][0]], [1 / 6, 1 / 6])  # tokens equal
    assert_close([weights["seq_mean_token_mean"][0][0], weights["seq_mean_token_mean"][1][0]], [1 / 8, 1 / 4])
    assert_close([weights["seq_mean_token_sum_norm"][0][0], weights["seq_mean_token_sum_norm"][1][0]], [1 / 8, 1 / 8])


def test_loss_normalisers_count_the_whole_minibatch():
    masks = [MASK, torch.tensor([[True, False, False], [False, False, False]])]  # an all-padding row
    assert loss_normalisers(masks) == {"num_tokens": 7, "num_seqs": 3, "max_response_len": 4}
    assert loss_normalisers(masks, max_response_len=32)["max_response_len"] == 32
    assert loss_normalisers([torch.zeros(2, 3, dtype=torch.bool)]) == {"num_tokens": 1, "num_seqs": 1,
                                                                       "max_response_len": 3}


def random_minibatch(lengths, seed=0):
    """values [b, T], logp/old_logp [b, T], advantages [b], mask [b, T] with T = max(lengths)."""
    g = torch.Generator().manual_seed(seed)
    b, width = len(lengths), max(max(lengths), 1)
    mask = torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]  # [b, T]
    old_logp = -torch.rand(b, width, generator=g, dtype=torch.float64) * 3  # [b, T]
    logp = old_logp + (torch.rand(b, width, generator=g, dtype=torch.float64) - 0.5)  # ratios in [0.6, 1.65]
    advantages = torch.randn(b, generator=g, dtype=torch.float64)  # [b]
    return logp, old_logp, advantages, mask


def split_rows(x: torch.Tensor, mask: torch.Tensor, cuts):
    """Micro-batches of consecutive rows, each trimmed to its own longest response (as a packer would)."""
    bounds = [0, *cuts, x.shape[0]]
    parts = []
    for lo, hi in zip(bounds, bounds[1:]):
        width = max(int(mask[lo:hi].sum(1).max()), 1)
        parts.append((x[lo:hi, :width], mask[lo:hi, :width]))
    return parts


@settings(max_examples=30, deadline=None)
@given(lengths=st.lists(st.integers(0, 6), min_size=2, max_size=7), data=st.data())
def test_aggregate_summed_over_micro_batches_equals_the_whole(lengths, data):
    cuts = sorted(data.draw(st.sets(st.integers(1, len(lengths) - 1), max_size=len(lengths) - 1)))
    values, _, _, mask = random_minibatch(lengths, seed=len(lengths))
    width = mask.shape[1]
    parts = split_rows(values, mask, cuts)
    norms = loss_normalisers([m for _, m in parts], max_response_len=width)
    for mode in MODES:
        whole = float(aggregate(values, mask, mode))  # the whole mini-batch's own counts
        summed = sum(float(aggregate(v, m, mode, **norms)) for v, m in parts)
        assert math.isclose(summed, whole, rel_tol=1e-9, abs_tol=1e-12), mode


@pytest.mark.parametrize("args, kwargs, match", [
    ((VALUES, MASK, "tokenmean"), {}, r"unknown loss_agg 'tokenmean' \(did you mean 'token_mean'\?\)"),
    ((VALUES, MASK.float(), "token_mean"), {}, r"argument 'mask' got dtype torch.float32.*bool"),
    ((VALUES, MASK[:, :3], "token_mean"), {}, r"argument 'mask' got shape \(2, 3\).*\(2, 4\)"),
    ((VALUES[0], MASK[0], "token_mean"), {}, r"argument 'values' got shape \(4,\).*\[b, T\]"),
    ((VALUES, MASK, "token_mean"), {"num_tokens": 0}, r"argument 'num_tokens' got 0"),
    ((VALUES, MASK, "seq_mean_token_mean"), {"num_seqs": -2}, r"argument 'num_seqs' got -2"),
    ((VALUES, MASK, "seq_mean_token_sum_norm"), {"max_response_len": float("inf")}, r"'max_response_len' got inf"),
])
def test_aggregate_rejects_bad_input(args, kwargs, match):
    with pytest.raises(ValueError, match=match):
        aggregate(*args, **kwargs)


# ---- policy losses -----------------------------------------------------------------------------------------------
RATIOS = [[1.5, 1.1, 0.7], [0.5, 0.9, 1.5]]  # row 0 has A = +1, row 1 has A = -2
ADV = [1.0, -2.0]
LOSS_MASK = torch.tensor([[True, True, True], [True, True, False]])


def ratio_batch(ratios=RATIOS, adv=ADV):
    old_logp = torch.full((len(ratios), len(ratios[0])), -1.0, dtype=torch.float64)  # [b, T]
    logp = (old_logp + torch.tensor(ratios, dtype=torch.float64).log()).requires_grad_(True)  # [b, T]
    return logp, old_logp, torch.tensor(adv, dtype=torch.float64)


def test_ppo_clip_equals_hand_computation():
    logp, old_logp, adv = ratio_batch()
    loss, m = POLICY_LOSSES["ppo_clip"](logp, old_logp, adv, LOSS_MASK, eps_low=0.2, eps_high=0.28,
                                        loss_agg="token_mean")
    real = [(r, a) for row, a, mrow in zip(RATIOS, ADV, LOSS_MASK.tolist()) for r, keep in zip(row, mrow) if keep]
    per_token = [hand_ppo_token(r, a, 0.2, 0.28) for r, a in real]
    assert math.isclose(loss.item(), sum(per_token) / 5, rel_tol=1e-9)
    # clip bounds [0.8, 1.28]: high clip at (A=+1, r=1.5), low clip at (A=-2, r=0.5); (A=+1, r=0.7) is not clipped
    assert (m["tokens"], m["clip_low_tokens"], m["clip_high_tokens"]) == (5.0, 1.0, 1.0)
    assert math.isclose(m["clipfrac_low"], 1 / 5) and math.isclose(m["clipfrac_high"], 1 / 5)
    assert math.isclose(m["ratio_mean"], sum(r for r, _ in real) / 5, rel_tol=1e-9)
    assert math.isclose(m["approx_kl"], sum(r - 1 - math.log(r) for r, _ in real) / 5, rel_tol=1e-9)
    assert math.isclose(m["loss"], loss.item())


def test_pg_equals_hand_computation():
    logp, old_logp, adv = ratio_batch()
    loss, m = POLICY_LOSSES["pg"](logp, old_logp, adv, LOSS_MASK, loss_agg="seq_mean_token_mean")
    lp = logp.tolist()
    hand = (sum(-ADV[0] * x for x in lp[0]) / 3 + sum(-ADV[1] * x for x in lp[1][:2]) / 2) / 2
    assert math.isclose(loss.item(), hand, rel_tol=1e-9)
    assert m["clip_low_tokens"] == m["clip_high_tokens"] == 0.0 and m["tokens"] == 5.0
    loss.backward()
    assert_close(as_list(logp.grad), [-1 / 6] * 3 + [2 / 4, 2 / 4, 0.0], tol=1e-9)  # -A / (|m_s| * num_seqs)


@pytest.mark.parametrize("mode", MODES)
def test_on_policy_ppo_clip_has_ratio_one_no_clipping_and_the_pg_gradient(mode):
    logp, _, adv = ratio_batch()
    weights = torch.tensor([[0.5, 2.0, 1.0], [1.5, 0.25, 3.0]], dtype=torch.float64)
    grads = {}
    for name in ("ppo_clip", "pg"):
        x = logp.detach().clone().requires_grad_(True)
        loss, m = POLICY_LOSSES[name](x, x.detach(), adv, LOSS_MASK, eps_low=0.2, eps_high=0.28, loss_agg=mode,
                                      is_weights=weights)
        loss.backward()
        grads[name] = x.grad
        assert m["ratio_mean"] == 1.0 and m["approx_kl"] == 0.0
        assert m["clipfrac_low"] == m["clipfrac_high"] == 0.0
    assert torch.allclose(grads["ppo_clip"], grads["pg"], rtol=1e-12, atol=1e-15)
    assert grads["pg"].abs().sum() > 0


@pytest.mark.parametrize("eps_low, eps_high", [(0.2, 0.28), (0.3, 0.2), (0.0, 0.0)])
def test_clipping_cuts_the_gradient_exactly_where_it_should(eps_low, eps_high):
    """Lower and upper clip separately, asymmetric ranges: a token's gradient is 0 iff its clip is active."""
    ratios = [0.5, 0.65, 0.75, 0.85, 1.0, 1.15, 1.25, 1.35, 2.0]
    for a in (1.5, -0.5):
        logp, old_logp, adv = ratio_batch([ratios], [a])
        mask = torch.ones(1, len(ratios), dtype=torch.bool)
        loss, m = POLICY_LOSSES["ppo_clip"](logp, old_logp, adv, mask, eps_low=eps_low, eps_high=eps_high,
                                            loss_agg="token_mean")
        loss.backward()
        low = [a < 0 and r < 1 - eps_low for r in ratios]
        high = [a > 0 and r > 1 + eps_high for r in ratios]
        for r, g, lo, hi in zip(ratios, logp.grad[0].tolist(), low, high):
            if lo or hi:
                assert g == 0.0, (r, a)
            else:  # d/dlogp of -A r over num_tokens
                assert math.isclose(g, -a * r / len(ratios), rel_tol=1e-9), (r, a)
        assert (m["clip_low_tokens"], m["clip_high_tokens"]) == (sum(low), sum(high))
        assert math.isclose(loss.item(), sum(hand_ppo_token(r, a, eps_low, eps_high) for r in ratios) / len(ratios))


def test_is_weights_multiply_the_per_token_loss():
    logp, old_logp, adv = ratio_batch()
    w = [[0.5, 2.0, 1.0], [1.5, 0.25, 99.0]]  # the last is padding
    loss, m = POLICY_LOSSES["ppo_clip"](logp, old_logp, adv, LOSS_MASK, eps_low=0.2, eps_high=0.28,
                                        loss_agg="token_mean", is_weights=torch.tensor(w, dtype=torch.float64))
    hand = sum(w[i][t] * hand_ppo_token(RATIOS[i][t], ADV[i], 0.2, 0.28) for i, t in
               [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1)])
    assert math.isclose(loss.item(), hand / 5, rel_tol=1e-9)
    assert math.isclose(m["is_weight_mean"], (0.5 + 2.0 + 1.0 + 1.5 + 0.25) / 5)


def test_truncated_is_weights():
    trainer = torch.tensor([[-1.0, -0.5, -3.0]], requires_grad=True)
    engine = torch.tensor([[-1.2, -2.5, -1.0]])
    w = truncated_is_weights(trainer, engine, cap=2.0)
    assert_close(as_list(w), [min(math.exp(a - b), 2.0) for a, b in zip([-1.0, -0.5, -3.0], [-1.2, -2.5, -1.0])])
    assert not w.requires_grad
    with pytest.raises(ValueError, match=r"argument 'cap' got 0"):
        truncated_is_weights(trainer, engine, cap=0)
    with pytest.raises(ValueError, match=r"argument 'engine_logp' got shape \(3,\)"):
        truncated_is_weights(trainer, engine[0], cap=2.0)


@settings(max_examples=20, deadline=None)
@given(lengths=st.lists(st.integers(0, 5), min_size=2, max_size=6), data=st.data())
def test_losses_and_metrics_summed_over_micro_batches_equal_the_whole(lengths, data):
    cuts = sorted(data.draw(st.sets(st.integers(1, len(lengths) - 1), max_size=len(lengths) - 1)))
    mode = data.draw(st.sampled_from(MODES))
    logp, old_logp, adv, mask = random_minibatch(lengths, seed=sum(lengths))
    opts = dict(eps_low=0.1, eps_high=0.15, loss_agg=mode)
    rows = [0, *cuts, len(lengths)]
    for name in POLICY_LOSSES:
        whole, whole_m = POLICY_LOSSES[name](logp, old_logp, adv, mask, max_response_len=mask.shape[1], **opts)
        norms = loss_normalisers([mask[lo:hi] for lo, hi in zip(rows, rows[1:])], max_response_len=mask.shape[1])
        parts = [POLICY_LOSSES[name](logp[lo:hi], old_logp[lo:hi], adv[lo:hi], mask[lo:hi], **opts, **norms)
                 for lo, hi in zip(rows, rows[1:])]
        assert math.isclose(sum(p[0].item() for p in parts), whole.item(), rel_tol=1e-9, abs_tol=1e-12)
        merged = merge_metrics([p[1] for p in parts])
        assert merged.keys() == whole_m.keys()
        for key in whole_m:
            assert math.isclose(merged[key], whole_m[key], rel_tol=1e-9, abs_tol=1e-12), (name, key)


def test_every_loss_takes_the_same_arguments():
    logp, old_logp, adv = ratio_batch()
    same = dict(eps_low=0.2, eps_high=0.28, loss_agg="seq_mean_token_sum_norm", is_weights=None, num_tokens=5,
                num_seqs=2, max_response_len=8)
    for name in POLICY_LOSSES:
        loss, metrics = POLICY_LOSSES[name](logp, old_logp, adv, LOSS_MASK, **same)
        assert loss.ndim == 0 and all(isinstance(v, float) for v in metrics.values())
    loss, metrics = POLICY_LOSSES["pg"](logp, None, adv, LOSS_MASK, loss_agg="token_mean")  # pg needs no old_logp
    assert "ratio_mean" not in metrics


@pytest.mark.parametrize("change, match", [
    (dict(advantages=torch.zeros(2, 1, dtype=torch.float64)), r"argument 'advantages' got shape \(2, 1\).*\(2,\)"),
    (dict(advantages=torch.tensor([1.0, float("nan")], dtype=torch.float64)), r"'advantages' got non-finite"),
    (dict(mask=LOSS_MASK.long()), r"argument 'mask' got dtype torch.int64"),
    (dict(old_logp=None), r"argument 'old_logp' got a NoneType"),
    (dict(old_logp=torch.zeros(2, 4, dtype=torch.float64)), r"argument 'old_logp' got shape \(2, 4\)"),
    (dict(is_weights=torch.ones(2, 2)), r"argument 'is_weights' got shape \(2, 2\)"),
    (dict(eps_low=1.0), r"argument 'eps_low' got 1.0; allowed: a float in \[0, 1\)"),
    (dict(eps_high=-0.1), r"argument 'eps_high' got -0.1"),
    (dict(loss_agg="token-mean"), r"unknown loss_agg 'token-mean' \(did you mean 'token_mean'\?\)"),
])
def test_ppo_clip_rejects_bad_input(change, match):
    logp, old_logp, adv = ratio_batch()
    kwargs = dict(logp=logp, old_logp=old_logp, advantages=adv, mask=LOSS_MASK, eps_low=0.2, eps_high=0.28,
                  loss_agg="token_mean") | change
    with pytest.raises(ValueError, match=match):
        POLICY_LOSSES["ppo_clip"](**kwargs)


# ---- KL estimators -----------------------------------------------------------------------------------------------
PAIRS = [(-1.0, -1.5), (-2.0, -0.3), (-0.1, -0.1), (-0.5, -14.0), (-13.0, -0.2)]  # (log pi, log pi_ref)


@pytest.mark.parametrize("name, hand", [
    ("k1", lambda a, b: a - b),
    ("k2", lambda a, b: 0.5 * max(-10.0, min(10.0, a - b)) ** 2),
    ("k3", lambda a, b: math.exp(b - a) - (b - a) - 1),
])
def test_kl_estimators_match_their_definitions(name, hand):
    logp = torch.tensor([[a for a, _ in PAIRS]], dtype=torch.float64)
    ref = torch.tensor([[b for _, b in PAIRS]], dtype=torch.float64)
    assert_close(as_list(kl_penalty(logp, ref, name)), [hand(a, b) for a, b in PAIRS], tol=1e-9)


def test_k2_clamps_the_log_ratio_at_ten():
    k2 = kl_penalty(torch.tensor([[-0.5, -20.0]]), torch.tensor([[-14.0, -0.5]]), "k2")
    assert as_list(k2) == [50.0, 50.0]


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.floats(-30, 0), st.floats(-30, 0)), min_size=1, max_size=8))
@example([(-2.0966257572231344e-10, 0.0)])  # exp(d) - d - 1 gives -1.1e-16 here
def test_k3_and_k2_are_non_negative(pairs):
    logp = torch.tensor([[a for a, _ in pairs]], dtype=torch.float64)
    ref = torch.tensor([[b for _, b in pairs]], dtype=torch.float64)
    for name in ("k2", "k3"):
        assert bool((kl_penalty(logp, ref, name) >= 0).all())


def test_k3_is_accurate_near_the_reference_in_float32():
    d = [1e-3, 1e-4, -1e-5]  # log pi_ref - log pi
    k3 = kl_penalty(torch.zeros(1, 3), torch.tensor([d]), "k3")  # float32
    # Taylor: k3 = d^2/2 + O(d^3); the naive float32 exp(d) - d - 1 gives 0.0 for the last two and 5% off the first
    assert_close([k / (x * x / 2) for k, x in zip(as_list(k3), d)], [1.0, 1.0, 1.0], tol=2e-3)


def test_k1_and_k3_are_unbiased_for_the_kl_under_sampling_from_pi():
    p = [0.5, 0.2, 0.15, 0.1, 0.05]  # pi
    q = [0.3, 0.3, 0.2, 0.1, 0.1]  # pi_ref
    true_kl = sum(pi * math.log(pi / qi) for pi, qi in zip(p, q))
    draws = torch.multinomial(torch.tensor(p, dtype=torch.float64), 200_000, replacement=True,
                              generator=torch.Generator().manual_seed(0))
    logp = torch.tensor(p, dtype=torch.float64).log()[draws][None, :]  # [1, S]
    ref = torch.tensor(q, dtype=torch.float64).log()[draws][None, :]  # [1, S]
    spread = {}
    for name in ("k1", "k3"):
        k = kl_penalty(logp, ref, name)[0]
        stderr = float(k.std()) / math.sqrt(k.numel())
        assert abs(float(k.mean()) - true_kl) < 4 * stderr, name
        spread[name] = float(k.std())
    assert spread["k3"] < spread["k1"]  # k3's point: lower variance


def test_kl_penalty_detaches_the_reference_and_rejects_bad_input():
    logp, ref = torch.tensor([[-1.0, -2.0]], requires_grad=True), torch.tensor([[-1.5, -1.0]], requires_grad=True)
    kl_penalty(logp, ref, "k3").sum().backward()
    assert logp.grad is not None and ref.grad is None
    with pytest.raises(ValueError, match=r"unknown kl_estimator 'k4'.*allowed: k1, k2, k3"):
        kl_penalty(logp, ref, "k4")
    with pytest.raises(ValueError, match=r"argument 'ref_logp' got shape \(1, 3\)"):
        kl_penalty(logp, torch.zeros(1, 3), "k1")


# ---- entropy -----------------------------------------------------------------------------------------------------
def hand_entropy(z):
    top = max(z)
    e = [math.exp(x - top) for x in z]
    return -sum(x / sum(e) * math.log(x / sum(e)) for x in e if x > 0)


def test_entropy_from_logits_equals_hand_computation():
    rows = [[0.0, 0.0, 0.0, 0.0], [2.0, -1.0, 0.5, 3.0], [1000.0, 0.0, -1000.0, 5.0]]
    h = entropy_from_logits(torch.tensor([rows], dtype=torch.float64))  # [1, 3]
    assert h.shape == (1, 3)
    assert_close(as_list(h), [hand_entropy(z) for z in rows], tol=1e-9)
    assert math.isclose(h[0, 0].item(), math.log(4))


def test_entropy_handles_masked_vocabulary_with_finite_gradient():
    logits = torch.tensor([[[0.0, 0.0, float("-inf")], [80.0, float("-inf"), -80.0]]], requires_grad=True)
    h = entropy_from_logits(logits)
    assert math.isclose(h[0, 0].item(), math.log(2), rel_tol=1e-6) and h[0, 1].item() >= 0
    h.sum().backward()
    assert bool(torch.isfinite(logits.grad).all())
    with pytest.raises(ValueError, match=r"argument 'logits' got shape \(2, 3\).*\[b, T, V\]"):
        entropy_from_logits(torch.zeros(2, 3))


# ---- pass@k ------------------------------------------------------------------------------------------------------
def brute_pass_at_k(n, c, k):
    samples = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(samples, k))
    return sum(any(s) for s in subsets) / len(subsets)


def test_pass_at_k_matches_enumeration_for_small_n():
    cases = [(n, c, k) for n in range(1, 8) for c in range(n + 1) for k in range(1, n + 1)]
    for n, c, k in cases:
        assert math.isclose(pass_at_k(n, c, k), brute_pass_at_k(n, c, k), abs_tol=1e-12), (n, c, k)
    n, c, k = (np.array(col) for col in zip(*cases))
    vec = pass_at_k_array(n, c, k)
    assert vec.shape == (len(cases),)
    assert_close(vec.tolist(), [brute_pass_at_k(*case) for case in cases], tol=1e-12)


def test_pass_at_k_is_stable_for_large_n():
    for n, c, k in [(256, 3, 128), (256, 1, 1), (256, 200, 64), (1000, 7, 500)]:
        exact = 1 - Fraction(math.comb(n - c, k), math.comb(n, k))
        assert math.isclose(pass_at_k(n, c, k), float(exact), rel_tol=1e-12)
    assert pass_at_k_array([256, 256], [0, 256], 128).tolist() == [0.0, 1.0]
    assert pass_at_k_array(np.zeros(0, dtype=int), np.zeros(0, dtype=int), 1).shape == (0,)


@pytest.mark.parametrize("args, match", [
    ((4, 5, 1), r"argument 'c' got c=5 \(n=4\)"),
    ((4, 2, 5), r"argument 'k' got k=5 \(n=4\)"),
    ((4, 2, 0), r"argument 'k' got k=0"),
    ((4.5, 2, 1), r"argument 'n' got 4.5"),
    ((4, True, 1), r"argument 'c' got True"),
])
def test_pass_at_k_rejects_bad_input(args, match):
    with pytest.raises(ValueError, match=match):
        pass_at_k(*args)
    with pytest.raises(ValueError, match="pass_at_k_array|pass_at_k"):
        pass_at_k_array(*args)
