"""The torch engine (both kernels) and the transformers-generate engine on real tiny Qwen2 models.

Every engine is checked against an independent computation: logprobs against the trainer's recomputation, the
first-token distribution against softmax(z / tau) from a plain forward, near-greedy samples against an argmax
decode by full forwards, and sync_weights against a model edited so one token dominates.
"""

import copy

import pytest
import torch
from helpers_models import bias_token, save_tiny, tiny_qwen2
from hypothesis import given, settings
from hypothesis import strategies as st

from brorl_lab.core.models import DEFAULT_MODEL_DIR
from brorl_lab.rl.logprobs import compute_logprobs
from brorl_lab.rollout.engines import RolloutSampling, make_engine
from brorl_lab.rollout.engines.common import plan_chunks
from brorl_lab.rollout.engines.torch_engine import TorchEngine

torch.set_num_threads(1)

ENGINES = {"torch": dict(name="torch"), "torch-hf_cache": dict(name="torch", kernel="hf_cache"),
           "hf": dict(name="hf")}
SOURCES = ["tiny"] + (["default"] if (DEFAULT_MODEL_DIR / "config.json").is_file() else [])
PROMPTS = ["What is 12+7?", "Add 3 and 4:", "Count 1 2 3 4 5 6 7 8 9"]  # different lengths: left padding is used


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    # EOS raised so that within 8 tokens some rows finish and some are truncated.
    return save_tiny(tmp_path_factory.mktemp("tiny_qwen2"), seed=0, eos_shift=3.5)


@pytest.fixture(scope="session")
def tiny(tiny_dir):
    from brorl_lab.core.models import load_policy

    model, tok = load_policy(str(tiny_dir), device="cpu")
    return model.eval(), tok


def build(kind, model, tok=None, **kw):
    spec = dict(ENGINES[kind])
    return make_engine(spec.pop("name"), model, tok, device="cpu", **spec, **kw)


@pytest.fixture(scope="module", params=SOURCES)
def source(request, tiny, tiny_dir):
    """``(model, tokenizer, path)`` of the model under test."""
    if request.param == "tiny":
        return tiny[0], tiny[1], str(tiny_dir)
    from brorl_lab.core.models import load_policy

    model, tok = load_policy("default", device="cpu")
    return model.eval(), tok, "default"


@pytest.fixture(scope="module")
def engines(source):
    model, tok, path = source
    built = {"torch": build("torch", path), "torch-hf_cache": build("torch-hf_cache", model, tok),
             "hf": build("hf", model, tok)}
    yield built
    for e in built.values():
        e.close()


def assert_well_formed(batch, engine, prompts, n, max_new):
    tok, eos = engine.tokenizer, engine.eos_ids
    B = len(prompts) * n
    batch.validate()
    assert batch.n == n and batch.prompts == prompts and batch.size == B
    assert batch.prompt_ids == [tok(p)["input_ids"] for p in prompts]
    T = batch.response_ids.shape[1]
    assert batch.logprobs.shape == (B, T) and batch.logprobs.dtype == torch.float32
    assert T == int(batch.lengths.max()) <= max_new and int(batch.lengths.min()) >= 1
    assert batch.pad_id == engine.pad_id
    mask = batch.response_mask
    assert (batch.response_ids[~mask] == batch.pad_id).all() and (batch.logprobs[~mask] == 0).all()
    assert torch.isfinite(batch.logprobs).all() and (batch.logprobs[mask] <= 0).all()
    for b in range(B):
        L = int(batch.lengths[b])
        ids = batch.response_ids[b, :L].tolist()
        is_eos = [i in eos for i in ids]
        assert not any(is_eos[:-1])  # stops at the first EOS
        assert bool(batch.truncated[b]) == (not is_eos[-1])
        assert not batch.truncated[b] or L == max_new
        assert batch.texts[b] == tok.decode(ids, skip_special_tokens=True)
    for name in ("engine", "generation_seconds", "generated_tokens", "sampling", "temperature"):
        assert name in batch.meta
    assert batch.meta["engine"] == engine.name and batch.meta["generated_tokens"] == int(batch.lengths.sum())
    assert not batch.logprobs.is_inference() and not batch.response_ids.is_inference()


# ---- well-formed batches --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", list(ENGINES))
@pytest.mark.parametrize("n", [1, 16, 512])
def test_batches_are_well_formed(engines, source, kind, n):
    prompts = PROMPTS if n < 512 else PROMPTS[:2]
    eng = engines[kind]
    batch = eng.generate(prompts, n, RolloutSampling(max_new_tokens=8, seed=n))
    assert_well_formed(batch, eng, prompts, n, max_new=8)
    if n == 512 and source[2] != "default":
        assert batch.truncated.any() and (~batch.truncated).any() and (batch.lengths < 8).any()


@pytest.mark.parametrize("kind", list(ENGINES))
def test_eos_first_gives_length_one_untruncated_rows(tiny, kind):
    model, tok = copy.deepcopy(tiny[0]), tiny[1]
    bias_token(model, tok.eos_token_id, 40.0)
    eng = build(kind, model, tok)
    batch = eng.generate(PROMPTS, 8, RolloutSampling(max_new_tokens=6, seed=0))
    assert_well_formed(batch, eng, PROMPTS, 8, max_new=6)
    assert batch.response_ids.shape == (24, 1) and (batch.response_ids[:, 0] == tok.eos_token_id).all()
    assert (batch.lengths == 1).all() and not batch.truncated.any() and batch.texts == [""] * 24


@pytest.mark.parametrize("kind", list(ENGINES))
def test_every_eos_of_the_generation_config_stops_a_row(tiny, kind):
    """Chat models stop on several tokens (generation_config.eos_token_id is a list): each one ends a row."""
    model, tok = copy.deepcopy(tiny[0]), tiny[1]
    z_id = tok.convert_tokens_to_ids("Z")
    model.generation_config.eos_token_id = [tok.eos_token_id, z_id]
    bias_token(model, z_id, 40.0)
    eng = build(kind, model, tok)
    assert eng.eos_ids == [tok.eos_token_id, z_id]
    batch = eng.generate(PROMPTS, 4, RolloutSampling(max_new_tokens=5, seed=0))
    assert_well_formed(batch, eng, PROMPTS, 4, max_new=5)
    assert (batch.lengths == 1).all() and (batch.response_ids[:, 0] == z_id).all() and not batch.truncated.any()
    assert batch.texts == ["Z"] * 12  # "Z" is an ordinary char token: it is a stop token here, not special


# ---- log-probs and the sampling distribution -----------------------------------------------------------------------
@pytest.mark.parametrize("kind", list(ENGINES))
@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.7, 0.9)])
def test_logprobs_match_the_trainer_recomputation(engines, source, kind, temperature, top_p):
    eng = engines[kind]
    batch = eng.generate(PROMPTS, 16, RolloutSampling(temperature=temperature, top_p=top_p, max_new_tokens=10, seed=3))
    ref = compute_logprobs(source[0], batch, temperature=temperature, micro_batch_tokens=256)
    diff = (ref - batch.logprobs).abs()[batch.response_mask]
    assert float(diff.max()) < 1e-4, f"max abs diff {float(diff.max()):.2e}"


@pytest.mark.parametrize("kind", list(ENGINES))
def test_bfloat16_engines_stay_close_to_a_bfloat16_trainer(tiny, kind):
    """bf16 rounding differs between a decode step and a full forward, so only closeness is asserted here."""
    model, tok = tiny
    eng = build(kind, model, tok, dtype="bfloat16")
    batch = eng.generate(PROMPTS, 16, RolloutSampling(temperature=0.8, max_new_tokens=8, seed=0))
    assert eng.model.dtype == torch.bfloat16 and batch.logprobs.dtype == torch.float32
    ref = compute_logprobs(copy.deepcopy(model).to(torch.bfloat16), batch, temperature=0.8, micro_batch_tokens=256)
    diff = (ref - batch.logprobs).abs()[batch.response_mask]
    assert float(diff.mean()) < 0.05 and float(diff.max()) < 0.3


@pytest.mark.parametrize("kind", list(ENGINES))
def test_chunked_generation_keeps_prompt_major_rows(source, kind):
    """Tiny chunks (a prompt's 16 samples over 4 chunks): rows must still line up with their prompts."""
    model, tok, _ = source
    eng = build(kind, model, tok, chunk_sequences=5)
    batch = eng.generate(PROMPTS, 16, RolloutSampling(max_new_tokens=6, seed=1))
    assert batch.meta["chunks"] == 3 * 4
    assert_well_formed(batch, eng, PROMPTS, 16, max_new=6)
    ref = compute_logprobs(model, batch, temperature=1.0, micro_batch_tokens=128)
    assert float((ref - batch.logprobs).abs()[batch.response_mask].max()) < 1e-4


@pytest.mark.parametrize("kind", list(ENGINES))
@pytest.mark.parametrize("temperature,top_p", [(0.8, 1.0), (1.0, 0.6)])
def test_first_token_frequencies_follow_the_tempered_nucleus(tiny, kind, temperature, top_p):
    """2048 one-token samples against softmax(z / tau) restricted to the top-p nucleus (z from a plain forward)."""
    model, tok = tiny
    eng = build(kind, model, tok, chunk_sequences=1024)
    prompt = "What is 12+7?"
    n = 2048
    batch = eng.generate([prompt], n, RolloutSampling(temperature=temperature, top_p=top_p, max_new_tokens=1, seed=7))
    with torch.no_grad():
        z = model(torch.tensor([tok(prompt)["input_ids"]])).logits[0, -1] / temperature
    p = torch.softmax(z, -1)
    order = p.argsort(descending=True)
    before = p[order].cumsum(0) - p[order]
    nucleus = order[before < top_p]  # tokens whose preceding mass is below top_p
    q = torch.zeros_like(p)
    q[nucleus] = p[nucleus] / p[nucleus].sum()
    freq = torch.bincount(batch.response_ids[:, 0], minlength=len(p)).double() / n
    assert float(freq[q == 0].sum()) == 0.0  # nothing outside the nucleus is ever drawn
    sigma = (q * (1 - q) / n).sqrt()
    big = q > 0.01
    assert ((freq[big] - q[big]).abs() <= 4.5 * sigma[big] + 1e-3).all()
    assert float((freq - q).abs().sum() / 2) < 0.08  # total variation


@pytest.mark.parametrize("kind", list(ENGINES))
def test_tiny_top_p_decodes_greedily(source, kind):
    """top_p -> 0 keeps only the argmax: every sample equals a greedy decode done by full forwards."""
    model, tok, _ = source
    eng = build(kind, model, tok)
    batch = eng.generate(PROMPTS, 4, RolloutSampling(top_p=1e-6, max_new_tokens=8, seed=0))
    for p, prompt in enumerate(PROMPTS):
        x = tok(prompt)["input_ids"]
        greedy = []
        with torch.no_grad():
            for _ in range(8):
                nxt = int(model(torch.tensor([x + greedy])).logits[0, -1].argmax())
                greedy.append(nxt)
                if nxt in eng.eos_ids:
                    break
        for s in range(4):
            b = p * 4 + s
            assert batch.response_ids[b, : batch.lengths[b]].tolist() == greedy


# ---- seeds, weights, lifecycle -------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", list(ENGINES))
def test_seed_reproduces_samples(engines, kind):
    eng = engines[kind]
    a = eng.generate(PROMPTS, 8, RolloutSampling(max_new_tokens=8, seed=11))
    b = eng.generate(PROMPTS, 8, RolloutSampling(max_new_tokens=8, seed=11))
    c = eng.generate(PROMPTS, 8, RolloutSampling(max_new_tokens=8, seed=12))
    d = eng.generate(PROMPTS, 8, RolloutSampling(max_new_tokens=8))
    assert torch.equal(a.response_ids, b.response_ids) and torch.equal(a.logprobs, b.logprobs) and a.texts == b.texts
    assert not torch.equal(a.response_ids, c.response_ids)
    assert a.texts != d.texts


@pytest.mark.parametrize("kind", list(ENGINES))
def test_sync_weights_switches_the_sampled_policy(tiny, kind):
    model, tok = tiny
    trainer = copy.deepcopy(model)
    eng = build(kind, trainer, tok)
    z_id = tok.convert_tokens_to_ids("Z")
    sp = RolloutSampling(max_new_tokens=6, seed=5)
    before = eng.generate(PROMPTS, 16, sp)
    bias_token(trainer, z_id, 30.0)  # the trainer's weights change; the engine holds its own copy
    unsynced = eng.generate(PROMPTS, 16, sp)
    assert torch.equal(before.response_ids, unsynced.response_ids)
    assert float((before.response_ids[before.response_mask] == z_id).float().mean()) < 0.2
    eng.sync_weights(trainer)
    after = eng.generate(PROMPTS, 16, sp)
    assert float((after.response_ids[after.response_mask] == z_id).float().mean()) > 0.95
    assert sum(t.count("Z") for t in after.texts) > 0.95 * int(after.lengths.sum())
    ref = compute_logprobs(trainer, after, temperature=1.0, micro_batch_tokens=256)
    assert float((ref - after.logprobs).abs()[after.response_mask].max()) < 1e-4
    with pytest.raises(ValueError, match="state_dict"):
        eng.sync_weights(tiny_qwen2(len(tok), hidden=32))


@pytest.mark.parametrize("kind", list(ENGINES))
def test_bad_inputs_raise_one_clear_value_error(engines, tiny, kind, tmp_path):
    eng = engines[kind]
    sp = RolloutSampling(max_new_tokens=2)
    for prompts, n, match in [([], 2, "empty list"), ("What is 1+1?", 2, "single string"), (["ok", ""], 2, "non-empty"),
                              (PROMPTS, 0, "n \\(rollouts_per_prompt\\)"), (PROMPTS, -3, "n "), (PROMPTS, 1.5, "n "),
                              (PROMPTS, True, "n ")]:
        with pytest.raises(ValueError, match=match):
            eng.generate(prompts, n, sp)
    name = ENGINES[kind]["name"]
    with pytest.raises(ValueError, match="model"):
        make_engine(name, str(tmp_path / "no_such_model"), device="cpu")
    with pytest.raises(ValueError, match="model"):
        make_engine(name, 42, device="cpu")
    with pytest.raises(ValueError, match="tokenizer"):
        make_engine(name, tiny[0], None, device="cpu")
    with pytest.raises(ValueError, match="chunk_sequences"):
        make_engine(name, tiny[0], tiny[1], device="cpu", chunk_sequences=0)


def test_torch_engine_rejects_bad_kernel_settings(tiny):
    with pytest.raises(ValueError, match="kernel"):
        TorchEngine(tiny[0], tiny[1], device="cpu", kernel="flash")
    with pytest.raises(ValueError, match="drop_finished_fraction"):
        TorchEngine(tiny[0], tiny[1], device="cpu", drop_finished_fraction=0)
    with pytest.raises(ValueError, match="decode_graphs: got 'on'; allowed: off, cuda, static"):
        TorchEngine(tiny[0], tiny[1], device="cpu", decode_graphs="on")
    with pytest.raises(ValueError, match="decode_graphs: 'cuda' needs a CUDA device, this engine is on cpu"):
        TorchEngine(tiny[0], tiny[1], device="cpu", decode_graphs="cuda")
    with pytest.raises(ValueError, match="decode_graphs: 'static' needs kernel='shared_prefix'"):
        TorchEngine(tiny[0], tiny[1], device="cpu", kernel="hf_cache", decode_graphs="static")


@pytest.mark.parametrize("kind", list(ENGINES))
def test_close_is_idempotent_and_final(tiny, kind):
    eng = build(kind, *tiny)
    eng.generate(PROMPTS[:1], 2, RolloutSampling(max_new_tokens=2))
    eng.close()
    eng.close()
    assert eng.model is None
    with pytest.raises(ValueError, match="closed"):
        eng.generate(PROMPTS[:1], 2, RolloutSampling(max_new_tokens=2))
    with pytest.raises(ValueError, match="closed"):
        eng.sync_weights(tiny[0])
    with build(kind, *tiny) as ctx:
        assert ctx.generate(PROMPTS[:1], 1, RolloutSampling(max_new_tokens=1)).size == 1
    assert ctx.model is None


# ---- the torch engine's own machinery ------------------------------------------------------------------------------
def test_torch_engine_prefills_each_prompt_once(tiny):
    """The torch engine embeds each prompt once for its N samples; HF generate embeds it N times."""
    model, tok = tiny
    seen = {}
    for kind in ("torch", "torch-hf_cache", "hf"):
        eng = build(kind, model, tok)
        shapes = []
        hook = eng.model.get_decoder().embed_tokens.register_forward_hook(
            lambda m, args, out: shapes.append(tuple(args[0].shape)))
        eng.generate(PROMPTS, 16, RolloutSampling(max_new_tokens=4, seed=0))
        hook.remove()
        seen[kind] = [s for s in shapes if len(s) == 2 and s[1] > 1]  # prompt-length calls
    longest = max(len(tok(p)["input_ids"]) for p in PROMPTS)
    assert seen["torch"] == seen["torch-hf_cache"] == [(3, longest)]
    assert seen["hf"] == [(48, longest)]


def test_kernels_sample_identically_without_compaction(tiny):
    model, tok = tiny
    sp = RolloutSampling(temperature=0.9, max_new_tokens=8, seed=21)
    a = build("torch", model, tok, drop_finished_fraction=1.0).generate(PROMPTS, 16, sp)
    b = build("torch-hf_cache", model, tok, drop_finished_fraction=1.0).generate(PROMPTS, 16, sp)
    assert a.meta["kernel"] == "shared_prefix" and b.meta["kernel"] == "hf_cache"
    assert torch.equal(a.response_ids, b.response_ids)
    assert float((a.logprobs - b.logprobs).abs().max()) < 1e-4


@pytest.mark.parametrize("ignore_eos", [False, True])
def test_static_shape_decode_samples_as_the_dynamic_step(tiny, monkeypatch, ignore_eos):
    """The CUDA-graph step (fixed-width windows over the generated-KV buffers, columns not yet written masked,
    the new column written at a device index), run eagerly on the CPU: same tokens and log-probs as the dynamic
    step, across window edges (width 3 over 11 tokens) and across compactions of finished rows."""
    from brorl_lab.rollout.engines import torch_engine

    monkeypatch.setattr(torch_engine, "GRAPH_WIDTH", 3)
    model, tok = tiny
    sp = RolloutSampling(temperature=0.9, max_new_tokens=11, seed=5, ignore_eos=ignore_eos)
    a = build("torch", model, tok).generate(PROMPTS, 16, sp)  # decode_graphs="off", the default
    b = build("torch", model, tok, decode_graphs="static").generate(PROMPTS, 16, sp)
    assert b.meta["decode_graphs"] == "static" and a.meta["decode_graphs"] == "off"
    assert ignore_eos or bool((a.lengths < 11).any())  # some rows finished: the compaction path ran
    assert torch.equal(a.response_ids, b.response_ids) and torch.equal(a.lengths, b.lengths)
    assert float((a.logprobs - b.logprobs).abs().max()) < 1e-5


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 6), st.integers(1, 40), st.integers(1, 24))
def test_plan_chunks_cover_prompt_major_rows(P, n, chunk):
    chunks = plan_chunks(P, n, chunk)
    rows = [p for ps, k in chunks for p in ps for _ in range(k)]
    assert rows == [p for p in range(P) for _ in range(n)]  # prompt-major, every sample exactly once
    assert all(len(ps) * k <= chunk for ps, k in chunks)


@pytest.mark.parametrize("kind", list(ENGINES))
def test_ignore_eos_runs_every_row_to_max_new_tokens(kind, tiny):
    """The EOS-raised tiny model finishes some rows early; with ``ignore_eos`` no row stops, EOS tokens sampled
    mid-response stay in it, and the logprobs are still the trainer's."""
    model, tok = tiny
    engine = build(kind, model, tok)
    try:
        plain = engine.generate(PROMPTS, 8, RolloutSampling(max_new_tokens=8, seed=1))
        fixed = engine.generate(PROMPTS, 8, RolloutSampling(max_new_tokens=8, seed=1, ignore_eos=True))
    finally:
        engine.close()
    assert bool((plain.lengths < 8).any())  # the model does stop when allowed to
    assert (fixed.lengths == 8).all() and fixed.truncated.all() and fixed.response_ids.shape == (24, 8)
    assert bool((fixed.response_ids[:, :-1] == tok.eos_token_id).any())  # EOS was sampled and did not stop a row
    diff = (compute_logprobs(model, fixed, temperature=1.0, micro_batch_tokens=512) - fixed.logprobs).abs()
    assert float(diff.max()) < 1e-4


def test_ignore_eos_must_be_a_bool():
    with pytest.raises(ValueError, match="sampling.ignore_eos"):
        RolloutSampling(ignore_eos="yes")
