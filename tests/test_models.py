"""The shipped default model and the loaders (real transformers Qwen2 and tokenizer from data/default_model)."""

from __future__ import annotations

import time

import pytest
import torch

from brorl_lab.core import models
from brorl_lab.rl import train_default
from brorl_lab.rollout.rewards import score_response
from brorl_lab.rollout.tasks import BUILTIN_FAMILIES, TASKS, eval_set, sample_items


def test_resolve_model():
    assert models.resolve_model("default") == str(models.DEFAULT_MODEL_DIR)
    assert models.resolve_model("Qwen/Qwen2.5-0.5B-Instruct") == "Qwen/Qwen2.5-0.5B-Instruct"  # hub id: untouched


@pytest.mark.parametrize("bad", ["./no/such/model", "/definitely/missing", "", "  "])
def test_resolve_model_rejects_missing_directories_naming_model(bad):
    with pytest.raises(ValueError, match=r"^model: got"):
        models.resolve_model(bad)


def test_resolve_model_rejects_a_directory_without_config_json(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(ValueError, match=r"^model: got .*not a directory containing config.json"):
        models.load_policy(str(tmp_path))


def test_pick_device_and_dtype():
    cuda = torch.cuda.is_available()
    assert models.pick_device("auto").type == ("cuda" if cuda else "cpu")
    assert models.pick_device("cpu").type == "cpu"
    if not cuda:
        with pytest.raises(ValueError, match=r"^device: got 'cuda'"):
            models.pick_device("cuda")
    with pytest.raises(ValueError, match=r"^device: got 'tpu'"):
        models.pick_device("tpu")
    assert models.pick_dtype("auto", "cpu") == torch.float32
    assert models.pick_dtype("auto", "cuda") == torch.bfloat16
    assert models.pick_dtype("float16", "cpu") == torch.float16
    with pytest.raises(ValueError, match=r"^dtype: got 'fp8'"):
        models.pick_dtype("fp8")


def test_shipped_model_is_small_float32_safetensors():
    files = {p.name: p.stat().st_size for p in models.DEFAULT_MODEL_DIR.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "TRAINING.md"} <= set(files)
    assert sum(files.values()) <= 20 * 2**20


@pytest.fixture(scope="module")
def default():
    t0 = time.perf_counter()
    policy, tok = models.load_policy("default", device="cpu")
    return policy, tok, time.perf_counter() - t0


def test_default_model_loads_fast_in_train_mode(default):
    policy, tok, seconds = default
    assert seconds < 5.0
    assert type(policy).__name__ == "Qwen2ForCausalLM" and policy.training
    assert next(policy.parameters()).dtype == torch.float32
    assert tok.pad_token_id is not None and tok.eos_token_id is not None and tok.pad_token_id != tok.eos_token_id
    assert tok.padding_side == "left" and policy.config.pad_token_id == tok.pad_token_id


def test_tokenizer_keeps_prompts_short_and_digits_single(default):
    _, tok, _ = default
    for fam in BUILTIN_FAMILIES:
        for item in eval_set(fam, limit=20):
            prompt = TASKS[fam].format_prompt(item)
            ids = tok(prompt, add_special_tokens=False)["input_ids"]
            assert len(ids) < 64 and tok.decode(ids) == prompt
            answer = tok(" " + item.answer, add_special_tokens=False)["input_ids"]
            assert len(answer) < 10
            if item.answer.lstrip("-").isdigit():  # numbers: " " then one token per digit
                assert tok.convert_ids_to_tokens(answer)[-len(item.answer.lstrip("-")):] == list(
                    item.answer.lstrip("-"))
    assert tok.decode(tok("Ünïcode ✓ still encodes")["input_ids"]) == "Ünïcode ✓ still encodes"  # byte-level


def test_shipped_tokenizer_is_what_train_default_builds(default):
    """AutoTokenizer rebuilds any qwen2 tokenizer with Qwen2's pipeline; the shipped one must survive that intact."""
    _, tok, _ = default
    built = train_default.build_tokenizer(train_default.tokenizer_corpus(list(BUILTIN_FAMILIES), seed=0))
    assert type(tok).__name__ == type(built).__name__ == "Qwen2Tokenizer"
    assert tok.get_vocab() == built.get_vocab()
    for fam in BUILTIN_FAMILIES:
        for item in eval_set(fam, limit=10):
            prompt = TASKS[fam].format_prompt(item)
            assert tok(prompt)["input_ids"] == built(prompt)["input_ids"]


def test_make_reference_is_a_frozen_independent_copy(default):
    policy, _, _ = default
    ref = models.make_reference(policy)
    assert not ref.training and not any(p.requires_grad for p in ref.parameters())
    assert all(p.requires_grad for p in policy.parameters()) and policy.training
    p0, r0 = next(policy.parameters()), next(ref.parameters())
    assert torch.equal(p0, r0) and p0.data_ptr() != r0.data_ptr()
    with torch.no_grad():
        p0.add_(1.0)
    try:
        assert not torch.equal(p0, r0)
    finally:
        with torch.no_grad():
            p0.sub_(1.0)


def test_greedy_answers_are_scored_by_the_family_verifier(default):
    policy, tok, _ = default
    acc = train_default.measure_pass_at_1(policy, tok, ["spell_backward", "chain_sum"], prompts=16, samples=1,
                                          temperature=None, progress=False)
    assert acc["spell_backward"] > 0.4  # the easy family: the shipped model solves most greedily
    assert 0.0 <= acc["chain_sum"] <= 1.0
    item = eval_set("spell_backward", limit=1)[0]
    enc = tok([TASKS["spell_backward"].format_prompt(item)], return_tensors="pt", add_special_tokens=False)
    out = policy.generate(**enc, do_sample=False, max_new_tokens=10, pad_token_id=tok.pad_token_id)
    text = tok.decode(out[0, enc["input_ids"].shape[1]:], skip_special_tokens=True)
    assert out[0, -1].item() == tok.eos_token_id or len(text) >= 10  # answers end with EOS
    assert score_response(text, item).correct == (text.strip() == item.answer)


def test_training_is_deterministic_and_learns(tmp_path):
    items = sample_items(["chain_sum"], 8 * 12, seed=5)
    corpus = [p + a for p, a in map(train_default.prompt_and_answer, items)]
    tok = train_default.build_tokenizer(corpus, min_count=2)
    assert tok.get_vocab() == train_default.build_tokenizer(corpus, min_count=2).get_vocab()
    examples = train_default.encode(items, tok)
    runs = []
    for _ in range(2):
        model = train_default.build_model(tok, seed=3, hidden_size=32, num_hidden_layers=1, intermediate_size=64,
                                          num_attention_heads=2, num_key_value_heads=2)
        losses = train_default.train(model, examples, steps=12, sequences_per_step=8, lr=3e-3, warmup=2,
                                     pad_id=tok.pad_token_id, progress=False)
        runs.append((losses, [p.detach().clone() for p in model.parameters()]))
    assert runs[0][0] == runs[1][0]
    assert all(torch.equal(a, b) for a, b in zip(runs[0][1], runs[1][1]))
    assert sum(runs[0][0][-3:]) < sum(runs[0][0][:3])  # the answer loss goes down
    with pytest.raises(ValueError, match=r"^examples: got 96; need"):
        train_default.train(model, examples, steps=13, sequences_per_step=8, lr=1e-3, progress=False)
