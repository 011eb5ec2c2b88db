"""Exact Q_pos by teacher forcing (brorl_lab.rl.answer_mass) against the sampler's pass rate, on the shipped models."""

import numpy as np
import pytest
import torch

from brorl_lab.core.models import load_policy
from brorl_lab.core.paths import PLATEAU_MODEL_DIR
from brorl_lab.rl import answer_mass as AM
from brorl_lab.rl import steps as S
from brorl_lab.rollout.engines import RolloutSampling, make_engine
from brorl_lab.rollout.tasks import TaskItem

DRAWS = 2000


@pytest.fixture(scope="module")
def default_policy():
    torch.set_num_threads(1)
    return load_policy("default", device="cpu")


def test_tokenisations_enumerate_every_spelling(default_policy):
    _, tok = default_policy
    ways = AM.tokenisations(" tac", tok)
    assert sorted(map(tuple, ways)) == sorted([tuple(tok.convert_tokens_to_ids(t) for t in s)
                                               for s in (["Ġ", "t", "a", "c"], ["Ġt", "a", "c"])])
    assert all(tok.decode(w) == "  anoc" for w in AM.tokenisations("  anoc", tok))
    assert len(AM.tokenisations("  anoc", tok)) == 3  # Ġ then (Ġ a | Ġa | Ġan) ...
    assert AM.tokenisations(" 57", tok) == [tok(" 57", add_special_tokens=False)["input_ids"]]  # digits: one way


def test_accepted_answers_are_what_the_verifier_accepts():
    item = S.sample_prompts(["spell_backward"], 1, seed=0)[0]
    forms = AM.accepted_answers(item)
    assert " " + item.answer in forms and item.answer.upper() in forms  # case variants (reasoning-gym lowers)
    assert len(forms) == 3 * 2 ** len(item.answer) or len(set(item.answer.lower())) < len(item.answer)
    gcd = TaskItem("gcd", "gcd:x", "Find the GCD of 4 and 6.", "2", {})
    assert AM.accepted_answers(gcd) == ["2", " 2", "  2"]
    with pytest.raises(ValueError, match="template"):
        AM.accepted_answers(gcd, template="chat")


@pytest.mark.parametrize("model", ["default", str(PLATEAU_MODEL_DIR)])
def test_exact_q_pos_matches_the_sampled_pass_rate(model):
    torch.set_num_threads(1)
    policy, tok = load_policy(model, device="cpu")
    items = S.sample_prompts(["chain_sum", "spell_backward", "gcd", "simple_equations"], 8, seed=11)
    cands = AM.answer_candidates(items, tok)
    q = AM.q_pos(policy, tok, items, temperature=1.0, cands=cands)
    engine = make_engine("torch", policy, tok)
    try:
        batch = S.score(S.rollout(engine, items, DRAWS, RolloutSampling(temperature=1.0, top_p=1.0, seed=5)),
                        reward="correct")
    finally:
        engine.close()
    rate = batch.grouped(batch.correct).double().mean(1).numpy()  # [P]
    se = np.sqrt(np.maximum(q * (1 - q), 1e-4) / DRAWS)
    z = (rate - q) / se
    assert np.all(np.abs(z) < 4), (q, rate, z)  # each prompt within 4 binomial standard errors
    assert abs(z.sum() / np.sqrt(len(z))) < 4  # and no shared bias across prompts
    assert q.std() > 0.05  # prompts of differing difficulty: the check is not passed by a constant
    assert AM.coverage(batch, cands) >= 0.995  # the enumerated forms hold (almost) every correct sample
    assert AM.special_token_mass(policy, tok, cands, temperature=1.0) < 1e-4


def test_q_pos_is_differentiable_and_matches_the_no_grad_value(default_policy):
    policy, tok = default_policy
    items = S.sample_prompts(["gcd", "spell_backward"], 3, seed=2)
    cands = AM.answer_candidates(items, tok)
    qt = AM.q_pos_tensor(policy, cands, temperature=1.0)
    qt.sum().backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in policy.parameters())
    policy.zero_grad(set_to_none=True)
    np.testing.assert_allclose(qt.detach().double().numpy(), AM.q_pos(policy, tok, items, temperature=1.0,
                                                                       cands=cands), rtol=1e-5)


def test_first_token_problem_marks_the_answers_first_token(default_policy):
    policy, tok = default_policy
    item = TaskItem("gcd", "gcd:x", "Find the GCD of 24 and 36.", "12", {})
    d = AM.first_token_problem(policy, tok, item, temperature=1.0)
    assert d["context"] == tok(" ", add_special_tokens=False)["input_ids"]  # after the leading space
    assert set(np.flatnonzero(d["correct"])) == {tok.convert_tokens_to_ids("1")}
    assert 0 < d["q_pos_first"] < 1 and d["logits"].shape == (len(tok),)
