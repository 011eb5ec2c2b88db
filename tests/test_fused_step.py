"""The fused (``torch.compile``) decode step of the torch engine against the eager step, on a real tiny Qwen2.

The fused path is an option (``TorchEngine(compile_decode=True)``) whose only job is speed (measured in
bench/bench_fusion.py, never asserted here); what it must not change is the numbers: the same sampled tokens and
lengths (compaction of finished rows included) and log-probs within 1e-5, and greedy tokens identical.
"""

import pytest
import torch
from helpers_models import save_tiny

from brorl_lab.rollout.engines import RolloutSampling, torch_engine
from brorl_lab.rollout.engines.torch_engine import TorchEngine

torch.set_num_threads(1)
PROMPTS = ["What is 12+7?", "Add 3 and 4:", "Count 1 2 3 4 5 6 7 8 9"]  # different lengths: left padding


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from brorl_lab.core.models import load_policy

    path = save_tiny(tmp_path_factory.mktemp("tiny_fused"), seed=0, eos_shift=3.5)  # some rows finish early
    model, tok = load_policy(str(path), device="cpu")
    return model.eval(), tok


def _compiled_graphs() -> int:
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def test_fused_decode_samples_as_the_eager_step(tiny):
    """Sampled at temperature 0.9 with finished rows compacted away mid-call, and near-greedy (top_p = 1e-6 keeps
    only the argmax token): the compiled step gives the eager step's tokens and lengths, log-probs to 1e-5, and it
    really ran compiled (dynamo made at least one graph)."""
    model, tok = tiny
    eager = TorchEngine(model, tok, device="cpu")
    fused = TorchEngine(model, tok, device="cpu", compile_decode=True)
    before = _compiled_graphs()
    for sp in (RolloutSampling(temperature=0.9, max_new_tokens=10, seed=5),
               RolloutSampling(temperature=1.0, top_p=1e-6, max_new_tokens=10, seed=1, ignore_eos=True)):
        a, b = eager.generate(PROMPTS, 8, sp), fused.generate(PROMPTS, 8, sp)
        assert a.meta["compile_decode"] is False and b.meta["compile_decode"] is True
        assert torch.equal(a.response_ids, b.response_ids) and torch.equal(a.lengths, b.lengths)
        assert float((a.logprobs - b.logprobs).abs().max()) < 1e-5
    assert bool((a.lengths == 10).all())  # the near-greedy call ran all 10 steps
    assert _compiled_graphs() > before and torch_engine._FUSED_STEP is not None


def test_compile_decode_bad_input(tiny):
    model, tok = tiny
    with pytest.raises(ValueError, match="compile_decode: got 'yes'; allowed: True or False"):
        TorchEngine(model, tok, device="cpu", compile_decode="yes")
    with pytest.raises(ValueError, match="compile_decode: True needs kernel='shared_prefix'"):
        TorchEngine(model, tok, device="cpu", kernel="hf_cache", compile_decode=True)
    with pytest.raises(ValueError, match="compile_decode: True needs kernel='shared_prefix' and decode_graphs='off'"):
        TorchEngine(model, tok, device="cpu", decode_graphs="static", compile_decode=True)


def test_fused_logprobs_match_eager_values_entropies_and_gradients(tiny):
    """The trainer's recomputation with the norms and MLPs compiled (``fused=True``): log-probs to 1e-5, entropies
    likewise, parameter gradients to 1e-4 relative; afterwards the modules are eager again (no compiled call left
    on them for a deepcopy to carry)."""
    from brorl_lab.rl.logprobs import fusable_modules, token_logprobs

    model, tok = tiny
    model = model.train()  # the update's mode
    batch = TorchEngine(model, tok, device="cpu").generate(
        PROMPTS, 4, RolloutSampling(temperature=1.0, max_new_tokens=8, seed=3))
    rows = torch.arange(batch.size)
    grads = {}
    for fused in (False, True):
        logp, ent = token_logprobs(model, batch, rows, temperature=1.0, with_entropy=True, fused=fused)
        model.zero_grad()
        (logp.sum() + 0.1 * ent.sum()).backward()
        grads[fused] = (logp.detach(), ent.detach(), [p.grad.clone() for p in model.parameters()])
    (la, ea, ga), (lb, eb, gb) = grads[False], grads[True]
    assert float((la - lb).abs().max()) < 1e-5 and float((ea - eb).abs().max()) < 1e-5
    for a, b in zip(ga, gb):
        assert float((a - b).abs().max()) <= 1e-4 * float(a.abs().max()) + 1e-7
    mods = fusable_modules(model)
    assert len(mods) == 3 * len(model.get_decoder().layers) + 1
    assert all(m._compiled_call_impl is None for m in mods)
    model.zero_grad()
    model.eval()


def test_config_compile_step_reaches_the_engine(tmp_path):
    """Config.compile_step=True builds the trainer's torch engine with the fused decode step (and False without)."""
    from brorl_lab.core.config import Config
    from brorl_lab.rl.trainer import Trainer

    small = dict(tasks=["chain_sum"], rollouts_per_prompt=2, prompts_per_step=1, max_new_tokens=4, eval_every=0,
                 torch_threads=1)
    for on in (False, True):
        with Trainer(Config(**small, compile_step=on, run_dir=str(tmp_path / str(on))), progress=False) as t:
            assert t.engine.compile_decode is on
