"""The shared-prefix attention kernel and decoder against plain attention and the model's own forward."""

import pytest
import torch
from helpers_models import tiny_qwen2, tiny_tokenizer
from hypothesis import given, settings
from hypothesis import strategies as st

from brorl_lab.core.prefix_attention import (
    PrefixDecoder,
    PrefixGrid,
    padding_bias,
    shared_prefix_attention,
    supports_shared_prefix,
)

torch.set_num_threads(1)


def plain_attention(q, pk, pv, valid, ok, ov, prompt_of, scale):
    """Reference: row r, head h, query j attends to its prompt's real prefix keys and its own keys 0..Wk-W+j, with
    every key written out per row (what a KV cache copied per row computes). Returns [R, W, H*d]."""
    R, H, W, d = q.shape
    Hkv, Wk = pk.shape[1], ok.shape[2]
    out = torch.zeros(R, W, H * d)
    for r in range(R):
        p = prompt_of[r]
        for h in range(H):
            kv = h // (H // Hkv)
            for j in range(W):
                keys = torch.cat([pk[p, kv][valid[p]], ok[r, kv, : Wk - W + j + 1]])
                vals = torch.cat([pv[p, kv][valid[p]], ov[r, kv, : Wk - W + j + 1]])
                out[r, j, h * d:(h + 1) * d] = torch.softmax(keys @ q[r, h, j] * scale, dim=0) @ vals
    return out


def random_case(P, prompt_of, H, Hkv, L, W, Wk, d, seed):
    g = torch.Generator().manual_seed(seed)
    R = len(prompt_of)
    tensors = dict(q=torch.randn(R, H, W, d, generator=g), pk=torch.randn(P, Hkv, L, d, generator=g),
                   pv=torch.randn(P, Hkv, L, d, generator=g), ok=torch.randn(R, Hkv, Wk, d, generator=g),
                   ov=torch.randn(R, Hkv, Wk, d, generator=g))
    valid = torch.ones(P, L, dtype=torch.bool)
    valid[0, : L // 2] = False  # left padding of prompt 0
    return tensors, valid


@pytest.mark.parametrize("W, Wk", [(1, 3), (1, 1), (4, 4), (3, 5)])  # decode step; a whole response; a continuation
@pytest.mark.parametrize("layout", ["dense", "ragged"])
def test_kernel_equals_attention_over_keys_copied_per_row(W, Wk, layout):
    P, H, Hkv, L, d = 3, 4, 2, 5, 8
    prompt_of = [0, 0, 1, 1, 2, 2] if layout == "dense" else [2, 0, 2, 2, 1, 0, 2]  # unequal counts, any order
    t, valid = random_case(P, prompt_of, H, Hkv, L, W, Wk, d, seed=W * 10 + Wk)
    grid = PrefixGrid.of(torch.tensor(prompt_of), P)
    assert (grid.prompt is None) == (layout == "dense")
    out = shared_prefix_attention(t["q"], t["pk"], t["pv"], padding_bias(valid.long()), t["ok"], t["ov"],
                                  d ** -0.5, grid)
    ref = plain_attention(t["q"], t["pk"], t["pv"], valid, t["ok"], t["ov"], prompt_of, d ** -0.5)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=0)


def test_kernel_gradients_equal_those_of_attention_over_copied_keys():
    P, H, Hkv, L, W, d = 2, 4, 2, 4, 3, 8
    prompt_of = [1, 0, 1, 1]
    t, valid = random_case(P, prompt_of, H, Hkv, L, W, W, d, seed=7)
    weights = torch.randn(len(prompt_of), W, H * d, generator=torch.Generator().manual_seed(8))
    grads = []
    for fn in ("kernel", "plain"):
        leaves = {k: v.clone().requires_grad_() for k, v in t.items()}
        if fn == "kernel":
            out = shared_prefix_attention(leaves["q"], leaves["pk"], leaves["pv"], padding_bias(valid.long()),
                                          leaves["ok"], leaves["ov"], d ** -0.5,
                                          PrefixGrid.of(torch.tensor(prompt_of), P))
        else:
            out = plain_attention(leaves["q"], leaves["pk"], leaves["pv"], valid, leaves["ok"], leaves["ov"],
                                  prompt_of, d ** -0.5)
        (out * weights).sum().backward()
        grads.append({k: v.grad for k, v in leaves.items()})
    for k in t:
        torch.testing.assert_close(grads[0][k], grads[1][k], atol=1e-5, rtol=1e-4)
    assert grads[0]["pk"][:, :, : L // 2][0].abs().max() == 0  # padded prefix keys of prompt 0 get no gradient


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 4), min_size=1, max_size=30), st.integers(5, 6))
def test_grid_round_trips_any_assignment_of_rows_to_prompts(prompt_of, P):
    prompt = torch.tensor(prompt_of)
    grid = PrefixGrid.of(prompt, P)
    x = torch.randn(len(prompt_of), 2, 3, 4)  # [R, H_kv, M, e]
    g = grid.to_grid(x)
    assert g.shape == (P, 2, grid.K * 3, 4)
    torch.testing.assert_close(grid.from_grid(g), x, atol=0, rtol=0)
    for r, p in enumerate(prompt_of):  # row r's data sits in its own prompt's block of the grid
        assert any(torch.equal(g[p, :, k * 3:(k + 1) * 3], x[r]) for k in range(grid.K))


def test_decoder_equals_the_models_own_forward_over_prompt_plus_response():
    """PrefixDecoder on the responses, against the prompt's KV from a DynamicCache, gives the logits of a plain
    forward over prompt + response (left-padded prompts, several rows per prompt, grouped-query heads)."""
    from transformers import DynamicCache

    from brorl_lab.core.batch import left_pad

    tok = tiny_tokenizer()
    model = tiny_qwen2(len(tok), seed=11)
    prompts = [tok("12+7=")["input_ids"], tok("hello there")["input_ids"]]
    ids, mask = left_pad(prompts, tok.pad_token_id)  # [2, S]
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        model(input_ids=ids, attention_mask=mask, position_ids=pos, past_key_values=cache, use_cache=True)
        prompt_of = torch.tensor([1, 0, 1])
        responses = torch.randint(3, len(tok), (3, 4), generator=torch.Generator().manual_seed(0))  # [R, W]
        positions = pos[prompt_of, -1:] + 1 + torch.arange(4)[None]
        z = PrefixDecoder(model).logits(responses, positions, [(layer.keys, layer.values) for layer in cache.layers],
                                        padding_bias(mask), PrefixGrid.of(prompt_of, 2))  # [R, W, V]
        for r, p in enumerate(prompt_of.tolist()):
            full = model(torch.tensor([prompts[p] + responses[r].tolist()])).logits[0, len(prompts[p]):]
            torch.testing.assert_close(z[r], full, atol=1e-4, rtol=1e-4)


def test_only_llama_family_full_attention_models_are_supported():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tok = tiny_tokenizer()
    assert supports_shared_prefix(tiny_qwen2(len(tok)))
    windowed = Qwen2ForCausalLM(Qwen2Config(vocab_size=len(tok), hidden_size=32, intermediate_size=64,
                                            num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                                            use_sliding_window=True, sliding_window=4, max_window_layers=0))
    assert not supports_shared_prefix(windowed)
    assert not supports_shared_prefix(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="model: PrefixDecoder supports llama, qwen2, qwen3, mistral"):
        PrefixDecoder(windowed)
