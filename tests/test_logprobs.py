"""The trainer's log-prob recomputation against a plain per-row forward of a real (tiny) transformers Qwen2."""

import pytest
import torch
from helpers_models import tiny_qwen2, tiny_tokenizer
from hypothesis import given, settings
from hypothesis import strategies as st

from brorl_lab.core.batch import RolloutBatch
from brorl_lab.rl.logprobs import (
    EXPLICIT_MAX_KEYS,
    compute_logprobs,
    micro_batches,
    pack,
    plan_micro_batches,
    row_token_counts,
    token_logprobs,
)

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


@pytest.fixture(scope="module")
def model(tok):
    return tiny_qwen2(len(tok), seed=3)


def hand_batch(tok, prompts, n, T, seed=0):
    """A RolloutBatch built directly (not by an engine): random response tokens, ragged lengths incl. 1 and T."""
    g = torch.Generator().manual_seed(seed)
    prompt_ids = [tok(p)["input_ids"] for p in prompts]
    B = len(prompts) * n
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    lengths[0], lengths[-1] = T, 1
    ids = torch.randint(3, len(tok), (B, T), generator=g)
    ids = torch.where(torch.arange(T)[None] < lengths[:, None], ids, tok.pad_token_id)
    return RolloutBatch(prompts=list(prompts), prompt_ids=prompt_ids, n=n, response_ids=ids,
                        logprobs=torch.zeros(B, T), lengths=lengths, truncated=lengths == T,
                        texts=[""] * B, pad_id=tok.pad_token_id).validate()


def naive_row(model, batch, b, temperature):
    """Reference: one unpadded forward of prompt + response for row b; full log-softmax over all positions."""
    x = batch.prompt_ids[b // batch.n]
    L = int(batch.lengths[b])
    y = batch.response_ids[b, :L].tolist()
    z = model(torch.tensor([x + y])).logits[0].float() / temperature  # [len(x)+L, V]
    logp_all = torch.log_softmax(z[len(x) - 1: len(x) - 1 + L], dim=-1)  # [L, V]
    logp = logp_all.gather(-1, torch.tensor(y)[:, None])[:, 0]
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logp, entropy


PROMPTS = ["What is 12+7?", "hi", "Count: 1 2 3 4 5 6 7 8"]


# ---- micro_batches ---------------------------------------------------------------------------------------------------
@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 50), max_size=40), st.integers(1, 120))
def test_micro_batches_cover_in_order_within_budget_and_greedy(counts, budget):
    groups = micro_batches(torch.tensor(counts, dtype=torch.long), budget)
    assert [i for g in groups for i in g.tolist()] == list(range(len(counts)))
    for j, g in enumerate(groups):
        total = sum(counts[i] for i in g.tolist())
        assert total <= budget or len(g) == 1
        if j + 1 < len(groups):  # greedy: the next row would not have fitted
            assert total + counts[groups[j + 1][0]] > budget


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(1, 9)), max_size=40), st.integers(1, 60),
       st.lists(st.integers(0, 30), min_size=4, max_size=4))
def test_micro_batches_charge_each_prompt_once_per_group(rows, budget, prompt_tokens):
    prompt_of = torch.tensor([p for p, _ in rows], dtype=torch.long)
    counts = torch.tensor([c for _, c in rows], dtype=torch.long)
    groups = micro_batches(counts, budget, prompt_of=prompt_of, prompt_tokens=prompt_tokens)

    def cost(idx):
        return int(counts[idx].sum()) + sum(prompt_tokens[p] for p in set(prompt_of[idx].tolist()))

    assert [i for g in groups for i in g.tolist()] == list(range(len(rows)))
    for j, g in enumerate(groups):
        assert cost(g) <= budget or len(g) == 1
        if j + 1 < len(groups):  # greedy: the next row would not have fitted
            assert cost(torch.cat([g, groups[j + 1][:1]])) > budget


def test_plan_counts_tokens_as_the_layout_holds_them(model, tok):
    """Shared prefix through the decoder: each prompt once per micro-batch plus each response token at 1 + H*K/D.
    Packed, a model without the decoder, or rows past EXPLICIT_MAX_KEYS: prompt + response per row."""
    from transformers import GPT2Config, GPT2LMHeadModel

    batch = hand_batch(tok, PROMPTS, n=8, T=6, seed=3)
    rows = torch.arange(batch.size)
    per_row = micro_batches(row_token_counts(batch), 60)
    assert [g.tolist() for g in plan_micro_batches(model, batch, rows, 60, "packed")] == [g.tolist() for g in per_row]
    shared = plan_micro_batches(model, batch, rows, 60, "auto")
    K = max(len(x) for x in batch.prompt_ids) + 6
    per_token = 1 + model.config.num_attention_heads * K / model.config.hidden_size
    for g in shared:
        cost = sum(len(batch.prompt_ids[p]) for p in set((g // batch.n).tolist())) + \
            int(torch.ceil(batch.lengths[g] * per_token).sum())
        assert cost <= 60 or len(g) == 1
    assert len(shared) < len(per_row)
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=len(tok), n_embd=32, n_layer=1, n_head=2, n_positions=64,
                                      bos_token_id=1, eos_token_id=1))
    assert [g.tolist() for g in plan_micro_batches(gpt2, batch, rows, 60)] == [g.tolist() for g in per_row]
    long = hand_batch(tok, PROMPTS, n=8, T=EXPLICIT_MAX_KEYS, seed=3)
    assert [g.tolist() for g in plan_micro_batches(model, long, torch.arange(long.size), 600)] == \
        [g.tolist() for g in micro_batches(row_token_counts(long), 600)]
    sub = torch.tensor([9, 10, 11, 20])  # positions into the rows given, not row ids
    assert sorted(i for g in plan_micro_batches(model, batch, sub, 60) for i in g.tolist()) == [0, 1, 2, 3]


def test_micro_batches_reject_bad_arguments():
    with pytest.raises(ValueError, match="token_budget"):
        micro_batches(torch.tensor([1, 2]), 0)
    with pytest.raises(ValueError, match="token_budget"):
        micro_batches(torch.tensor([1, 2]), 2.5)
    with pytest.raises(ValueError, match="token_counts"):
        micro_batches(torch.ones(2, 2), 10)
    for prompt_of, prompt_tokens in (([0], [5]), ([0, 1], [5]), ([0, -1], [5]), ([0, 0], None)):
        with pytest.raises(ValueError, match="prompt_of: got .* one prompt index per row"):
            micro_batches(torch.tensor([1, 2]), 10, prompt_of=torch.tensor(prompt_of), prompt_tokens=prompt_tokens)


# ---- pack --------------------------------------------------------------------------------------------------------------
def test_pack_aligns_every_response_at_one_column(tok):
    batch = hand_batch(tok, PROMPTS, n=2, T=5)
    rows = torch.tensor([0, 3, 5])
    p = pack(batch, rows)
    S = max(len(x) for x in batch.prompt_ids)
    assert p.start == S and p.width == int(batch.lengths[rows].max())
    assert p.input_ids.shape == p.attention_mask.shape == p.position_ids.shape == (3, S + p.width)
    for i, b in enumerate(rows.tolist()):
        x = batch.prompt_ids[b // batch.n]
        L = int(batch.lengths[b])
        real = p.input_ids[i][p.attention_mask[i].bool()].tolist()
        assert real == x + batch.response_ids[b, :L].tolist()
        assert p.input_ids[i, S - len(x): S].tolist() == x  # prompt ends right before the response column
        assert p.position_ids[i][p.attention_mask[i].bool()].tolist() == list(range(len(x) + L))
    assert row_token_counts(batch).tolist() == [len(batch.prompt_ids[b // 2]) + int(batch.lengths[b])
                                                for b in range(batch.size)]


def test_pack_rejects_out_of_range_rows(tok):
    batch = hand_batch(tok, PROMPTS, n=2, T=5)
    with pytest.raises(ValueError, match="rows"):
        pack(batch, [0, 6])
    with pytest.raises(ValueError, match="rows"):
        pack(batch, [])


# ---- token_logprobs / compute_logprobs ---------------------------------------------------------------------------------
LAYOUTS = ["shared_prefix", "packed"]


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_token_logprobs_match_a_plain_forward_per_row(model, tok, temperature, layout):
    batch = hand_batch(tok, PROMPTS, n=3, T=7, seed=1)
    rows = torch.arange(batch.size)
    with torch.no_grad():
        logp, ent = token_logprobs(model, batch, rows, temperature=temperature, with_entropy=True, layout=layout)
    assert logp.shape == ent.shape == batch.response_ids.shape
    mask = batch.response_mask
    assert (logp[~mask] == 0).all() and (ent[~mask] == 0).all()
    for b in range(batch.size):
        ref_lp, ref_ent = naive_row(model, batch, b, temperature)
        L = int(batch.lengths[b])
        torch.testing.assert_close(logp[b, :L], ref_lp, atol=1e-5, rtol=0)
        torch.testing.assert_close(ent[b, :L], ref_ent, atol=1e-5, rtol=0)
    # the entropy is of the whole distribution, not the sampled token's surprisal
    assert (ent[mask] - (-logp[mask])).abs().max() > 0.1
    assert (ent[mask] <= torch.log(torch.tensor(float(len(tok)))) + 1e-4).all()


@pytest.mark.parametrize("layout", LAYOUTS)
def test_token_logprobs_is_differentiable(tok, layout):
    model = tiny_qwen2(len(tok), seed=4).train()
    batch = hand_batch(tok, PROMPTS, n=2, T=4)
    logp, ent = token_logprobs(model, batch, [1, 2, 4], temperature=1.0, with_entropy=True, layout=layout)
    assert logp.requires_grad and ent.requires_grad
    (logp.sum() + 0.1 * ent.sum()).backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert len(grads) == len(list(model.parameters()))
    assert all(torch.isfinite(g).all() for g in grads)
    assert sum(float(g.abs().sum()) for g in grads) > 0


@pytest.mark.parametrize("layout", LAYOUTS)
def test_entropy_as_a_metric_has_the_same_values_and_no_graph(tok, layout):
    model = tiny_qwen2(len(tok), seed=4).train()
    batch = hand_batch(tok, PROMPTS, n=3, T=5, seed=6)
    logp, ent = token_logprobs(model, batch, torch.arange(batch.size), temperature=0.8, with_entropy=True,
                               layout=layout)
    logp2, ent2 = token_logprobs(model, batch, torch.arange(batch.size), temperature=0.8, with_entropy=True,
                                 entropy_grad=False, layout=layout)
    assert ent.requires_grad and not ent2.requires_grad and logp2.requires_grad
    torch.testing.assert_close(ent2, ent.detach(), atol=0, rtol=0)
    torch.testing.assert_close(logp2, logp, atol=0, rtol=0)


def test_compute_logprobs_is_invariant_to_the_micro_batch_budget(model, tok):
    batch = hand_batch(tok, PROMPTS, n=4, T=6, seed=2)
    one_per_row = compute_logprobs(model, batch, temperature=0.8, micro_batch_tokens=1)
    all_at_once, ent = compute_logprobs(model, batch, temperature=0.8, micro_batch_tokens=10_000, with_entropy=True)
    assert one_per_row.shape == all_at_once.shape == ent.shape == (batch.size, 6)
    assert not one_per_row.requires_grad
    torch.testing.assert_close(one_per_row, all_at_once, atol=1e-5, rtol=0)
    for b in (0, 5, batch.size - 1):
        ref_lp, _ = naive_row(model, batch, b, 0.8)
        torch.testing.assert_close(all_at_once[b, : len(ref_lp)], ref_lp, atol=1e-5, rtol=0)


@pytest.mark.parametrize("n, T, rows", [(3, 7, None), (4, 1, None), (5, 6, [7, 2, 3, 4, 5, 6]), (1, 5, None)])
def test_the_two_layouts_give_the_same_logprobs_entropies_and_gradients(tok, n, T, rows):
    """shared_prefix (one prefix pass, KV indexed out to the rows) against packed (one pass per row), incl. rows out
    of order, width-1 responses (no suffix pass) and N=1 (nothing to share)."""
    model = tiny_qwen2(len(tok), seed=5).train()
    batch = hand_batch(tok, PROMPTS, n=n, T=T, seed=n)
    rows = torch.arange(batch.size) if rows is None else torch.tensor(rows)
    out = {}
    for layout in LAYOUTS:
        model.zero_grad()
        logp, ent = token_logprobs(model, batch, rows, temperature=0.7, with_entropy=True, layout=layout)
        (logp.sum() + 0.3 * ent.sum()).backward()
        out[layout] = (logp.detach(), ent.detach(), [p.grad.clone() for p in model.parameters()])
    shared, packed = out["shared_prefix"], out["packed"]
    torch.testing.assert_close(shared[0], packed[0], atol=1e-5, rtol=0)
    torch.testing.assert_close(shared[1], packed[1], atol=1e-5, rtol=0)
    for a, b in zip(shared[2], packed[2]):
        torch.testing.assert_close(a, b, atol=5e-5, rtol=1e-4)  # fp32 sums in a different order


def _forward_log(model, batch, budget, layout):
    """Run compute_logprobs and record, per pass through the model's token embedding (the HF forward and the
    shared-prefix decoder both start there), (real tokens, input shape), and the LM head's input widths."""
    forwards, head_widths = [], []
    pad = batch.pad_id  # hand_batch's prompts and responses hold no pad token but padding

    h1 = model.get_decoder().embed_tokens.register_forward_pre_hook(
        lambda m, args: forwards.append((int((args[0] != pad).sum()), tuple(args[0].shape))))
    h2 = model.lm_head.register_forward_pre_hook(lambda m, args: head_widths.append(args[0].shape[1]))
    try:
        compute_logprobs(model, batch, temperature=1.0, micro_batch_tokens=budget, layout=layout)
    finally:
        h1.remove()
        h2.remove()
    return forwards, head_widths


def test_packed_memory_is_set_by_the_token_budget_and_only_response_logits_are_built(model, tok):
    """Every packed forward carries at most `budget` real tokens, and the LM head only sees the response columns."""
    batch = hand_batch(tok, PROMPTS, n=8, T=6, seed=5)
    budget = 60
    forwards, head_widths = _forward_log(model, batch, budget, "packed")
    counts = row_token_counts(batch)
    assert len(forwards) == len(micro_batches(counts, budget)) > 1
    real = [t for t, _ in forwards]
    assert max(real) <= budget and sum(real) == int(counts.sum())
    assert all(w <= 6 + 1 for w in head_widths)  # [b, W+1, H], never the prompt columns


def test_shared_prefix_runs_each_prompt_once_per_micro_batch(model, tok):
    """Per micro-batch: one prefix pass over its distinct prompts (LM head on 1 column), then suffix passes over the
    responses, grouped by width so padding stays under 2x: far fewer tokens than packed, within the budget."""
    batch = hand_batch(tok, PROMPTS, n=8, T=9, seed=5)
    budget = 80
    forwards, head_widths = _forward_log(model, batch, budget, "shared_prefix")
    calls = iter(zip(forwards, head_widths))
    groups = plan_micro_batches(model, batch, torch.arange(batch.size), budget, "shared_prefix")
    for g in groups:
        prompts = sorted(set((g // batch.n).tolist()))
        (real, shape), width = next(calls)
        assert real == sum(len(batch.prompt_ids[p]) for p in prompts) and shape[0] == len(prompts) and width == 1
        needs = (batch.lengths[g] - 1).clamp(min=0)  # tokens each row needs from a suffix pass
        seen_rows, fed = 0, real
        for _ in range(len({int(x).bit_length() for x in (needs[needs > 0] - 1)})):  # one pass per width bucket
            (real_suffix, (c, w)), width = next(calls)
            assert width == w and real_suffix <= c * w
            seen_rows, fed = seen_rows + c, fed + c * w
        assert seen_rows == int((needs > 0).sum())
        assert fed - real <= 2 * int(needs.sum())  # padding under 2x
        assert fed <= budget
    assert next(calls, None) is None
    packed_tokens = sum(t for t, _ in _forward_log(model, batch, budget, "packed")[0])
    assert sum(t for t, _ in forwards) < 0.6 * packed_tokens


def test_auto_shares_a_prefix_only_when_rows_share_prompts_and_the_cache_allows(tok):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    def passes(model, batch):
        seen = []
        h = model.register_forward_pre_hook(lambda m, a, kw: seen.append("past_key_values" in kw
                                                                          and kw["past_key_values"] is not None),
                                            with_kwargs=True)
        try:
            with torch.no_grad():
                token_logprobs(model, batch, torch.arange(batch.size), temperature=1.0)
        finally:
            h.remove()
        return seen

    full = tiny_qwen2(len(tok), seed=6)
    shared = passes(full, hand_batch(tok, PROMPTS, n=4, T=5))
    assert shared == [True]  # shared prefix: one prefix pass into a cache; suffix passes run in PrefixDecoder
    assert passes(full, hand_batch(tok, PROMPTS, n=1, T=5)) == [False]  # nothing to share: packed
    cfg = Qwen2Config(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, use_sliding_window=True, sliding_window=4,
                      max_window_layers=0, pad_token_id=0)
    windowed = Qwen2ForCausalLM(cfg).eval()  # sliding-window layers: their cache drops rows' old keys
    assert passes(windowed, hand_batch(tok, PROMPTS, n=4, T=5)) == [False]
    with pytest.raises(ValueError, match="layout: 'shared_prefix' needs a plain full-attention KV cache"):
        token_logprobs(windowed, hand_batch(tok, PROMPTS, n=4, T=5), [0, 1], temperature=1.0, layout="shared_prefix")
    with pytest.raises(ValueError, match="layout: got 'tiled'; allowed: auto, shared_prefix, packed"):
        token_logprobs(full, hand_batch(tok, PROMPTS, n=4, T=5), [0, 1], temperature=1.0, layout="tiled")


def test_token_logprobs_rejects_bad_temperature(model, tok):
    batch = hand_batch(tok, PROMPTS, n=1, T=3)
    for bad in (0, -1.0, float("inf"), True):
        with pytest.raises(ValueError, match="temperature"):
            token_logprobs(model, batch, [0], temperature=bad)


def _layouts_agree_with_a_plain_forward(model, batch):
    """shared_prefix equals packed and a plain per-row forward in values and gradients; returns the model forwards
    the shared layout made (True where it passed a KV cache)."""
    seen = []
    h = model.register_forward_pre_hook(lambda m, a, kw: seen.append(kw.get("past_key_values") is not None),
                                        with_kwargs=True)
    out = {}
    for layout in LAYOUTS:
        model.zero_grad()
        logp, ent = token_logprobs(model, batch, torch.arange(batch.size), temperature=0.9, with_entropy=True,
                                   layout=layout)
        (logp.sum() + 0.2 * ent.sum()).backward()
        out[layout] = (logp.detach(), [p.grad.clone() for p in model.parameters()])
        if layout == "shared_prefix":
            h.remove()
    torch.testing.assert_close(out["shared_prefix"][0], out["packed"][0], atol=1e-5, rtol=0)
    for a, b in zip(out["shared_prefix"][1], out["packed"][1]):
        torch.testing.assert_close(a, b, atol=5e-5, rtol=1e-4)
    with torch.no_grad():
        for b in range(batch.size):
            ref, _ = naive_row(model, batch, b, 0.9)
            torch.testing.assert_close(out["shared_prefix"][0][b, : len(ref)], ref, atol=1e-5, rtol=0)
    return seen


def test_shared_prefix_on_a_non_llama_model_runs_the_models_own_forward_against_the_cache(tok):
    """GPT-2 has a plain KV cache but no PrefixDecoder: its suffix passes are its own forward on the gathered KV."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=len(tok), n_embd=32, n_layer=2, n_head=2, n_positions=64,
                                      bos_token_id=1, eos_token_id=1, resid_pdrop=0.0, embd_pdrop=0.0,
                                      attn_pdrop=0.0)).train()
    seen = _layouts_agree_with_a_plain_forward(gpt2, hand_batch(tok, PROMPTS, n=3, T=6, seed=1))
    assert len(seen) >= 2 and all(seen)  # a prefix pass, then suffix passes on its KV


@pytest.mark.parametrize("limit", [("EXPLICIT_MAX_KEYS", 0), ("DECODER_MAX_RESPONSE", 5)])
def test_shared_prefix_past_the_decoders_limits_uses_the_models_attention(tok, monkeypatch, limit):
    """Rows with more keys than EXPLICIT_MAX_KEYS (the decoder would build [rows, H, W, keys] scores), or responses
    longer than DECODER_MAX_RESPONSE (where SDPA, never building the scores, is faster), go through the model's own
    forward: same numbers, and micro-batches counted as that forward holds them (prompt + response per row)."""
    import brorl_lab.rl.logprobs as lp

    model = tiny_qwen2(len(tok), seed=8).train()
    batch = hand_batch(tok, PROMPTS, n=3, T=6, seed=2)
    assert lp.suffix_in_decoder(model, batch)
    assert _layouts_agree_with_a_plain_forward(model, batch) == [True]  # under the limits: the decoder
    monkeypatch.setattr(lp, *limit)
    assert not lp.suffix_in_decoder(model, batch)
    seen = _layouts_agree_with_a_plain_forward(model, batch)
    assert len(seen) >= 2 and all(seen)
    rows = torch.arange(batch.size)
    assert [g.tolist() for g in plan_micro_batches(model, batch, rows, 40)] == \
        [g.tolist() for g in micro_batches(row_token_counts(batch), 40)]
