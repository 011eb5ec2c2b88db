"""Issue 15: what the code and notebooks teach is exactly true, and no run is ever overwritten or lost.

One section per point of the issue: (a) weight decay in the paper simulation, (b) the derived 0.968, (c) the mirror
case, (d) KL estimators as losses and KL in the reward, (e) truncated vs ICE-POP importance weights, (f) one loss
normaliser rule, (g) algo's documented update loop is steps.update's, (h) eval flags from Config, (i) no silent
overwrite of a run directory, (j) a full disk mid-checkpoint keeps the last good checkpoint.
"""

from __future__ import annotations

import copy
import errno
import json
from pathlib import Path

import nbformat
import pytest
import torch
from helpers_models import tiny_qwen2, tiny_tokenizer

from brorl_lab import cli, theory
from brorl_lab.core.batch import RolloutBatch
from brorl_lab.core.config import Config, ConfigError
from brorl_lab.rl import algo, logprobs
from brorl_lab.rl import steps as S

torch.set_num_threads(1)
NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"


def _markdown(name: str) -> str:
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    return "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")


# ---- (a) AdamW weight decay in the paper simulation -----------------------------------------------------------------
def test_decay_only_baseline_reproduces_the_paper_size_drift():
    """No gradient at all: AdamW's decay alone takes Q_pos from 0.6301 to 0.6231 in 1000 steps (paper's sizes)."""
    decay = theory.paper_simulation(4, gradient=False, record_every=1000)
    assert decay.q_pos.iloc[0] == pytest.approx(0.6301, abs=5e-5)
    assert decay.q_pos.iloc[-1] == pytest.approx(0.6231, abs=5e-5)
    assert decay.unsampled_frac.iloc[1:].isna().all()  # nothing was drawn


def test_weight_decay_zero_separates_decay_from_sampling():
    kw = dict(steps=40, vocab=500, n_correct=40, seed=0, record_every=40)
    flat = theory.paper_simulation(4, gradient=False, weight_decay=0.0, **kw)
    assert flat.q_pos.iloc[-1] == pytest.approx(flat.q_pos.iloc[0], abs=1e-12)  # no gradient, no decay: no move
    decayed = theory.paper_simulation(4, gradient=False, **kw)
    assert decayed.q_pos.iloc[-1] < decayed.q_pos.iloc[0]  # decay alone flattens p: correct mass falls
    with_decay, without = theory.paper_simulation(16, **kw), theory.paper_simulation(16, weight_decay=0.0, **kw)
    assert with_decay.q_pos.iloc[-1] < without.q_pos.iloc[-1]
    with pytest.raises(ValueError, match="weight_decay"):
        theory.paper_simulation(4, weight_decay=-1.0, **kw)
    assert "not the paper's" in theory.paper_simulation.__doc__


def test_notebook_01_states_the_decay_choice_and_draws_the_baseline():
    text = _markdown("01_mass_balance_theory.ipynb")
    assert "weight decay is our choice" in text and "0.6231" in text
    source = (NOTEBOOKS / "01_mass_balance_theory.py").read_text()
    assert "gradient=False" in source and "weight_decay=0.0" in source


# ---- (b) 0.968 is derived, not the paper's ----------------------------------------------------------------------
def test_undrawn_share_at_512_is_derived_and_said_so():
    p = theory.paper_problem(128_000, 10_000, seeding=True)
    share = theory.unsampled_second_moment(p.p, p.correct, [512]).undrawn_correct_frac.iloc[0]
    assert round(share, 3) == 0.968
    assert "derived" in theory.unsampled_second_moment.__doc__
    text = _markdown("01_mass_balance_theory.ipynb")
    assert "The paper notes that at $N = 512$" not in text
    assert "0.968" in text and "*derived*" in text and "does not report" in text


# ---- (c) the mirror case in notebook 01's summary -----------------------------------------------------------------
def test_notebook_01_summary_has_the_mirror_case():
    nb = nbformat.read(NOTEBOOKS / "01_mass_balance_theory.ipynb", as_version=4)
    summary = next(c.source for c in nb.cells if c.cell_type == "markdown" and c.source.startswith("## Summary"))
    assert "$S_R < 0$" in summary and "*incorrect* tokens go undrawn" in summary


def test_the_mirror_case_happens_on_the_confidently_wrong_vocabulary():
    tail = theory.zipf_problem(2000, 200, placement="tail")
    d = theory.simulate(tail.p, tail.correct, 4, 100, seed=0)
    mirror = (d.s_r < 0) & (d.unsampled < 0)
    assert mirror.mean() > 0.5


# ---- (d) KL estimators as losses, and KL in the reward -------------------------------------------------------------
def test_kl_estimator_gradients_as_losses():
    g = torch.Generator().manual_seed(1)
    for _ in range(3):
        z, ref = torch.randn(7, generator=g, dtype=torch.float64), torch.randn(7, generator=g, dtype=torch.float64)
        grads = algo.kl_loss_gradients(z, ref)
        assert grads["k1"].abs().max() < 1e-12
        torch.testing.assert_close(grads["k2"], grads["KL(pi||ref)"], atol=1e-12, rtol=0)
        torch.testing.assert_close(grads["k3"], grads["KL(ref||pi)"], atol=1e-12, rtol=0)
        assert (grads["k3"] - grads["KL(pi||ref)"]).abs().max() > 1e-3  # k3 is not the forward KL's gradient


def test_kl_estimator_gradients_by_sampling_agree():
    """The same with sampled tokens (what a trainer does): mean over draws of grad k(a), a ~ pi."""
    g = torch.Generator().manual_seed(2)
    z, ref = torch.randn(5, generator=g, dtype=torch.float64), torch.randn(5, generator=g, dtype=torch.float64)
    exact = algo.kl_loss_gradients(z, ref)
    a = torch.multinomial(torch.softmax(z, 0), 200_000, replacement=True, generator=g)
    ref_lp = torch.log_softmax(ref, 0)
    for name in ("k1", "k2", "k3"):
        zz = z.clone().requires_grad_(True)
        lp = torch.log_softmax(zz, 0)
        algo.kl_penalty(lp[a][None], ref_lp[a][None], name).mean().backward()
        assert (zz.grad - exact[name]).abs().max() < 0.02, name


def test_kl_docs_say_what_each_estimator_does_as_a_loss():
    help_ = Config.__dataclass_fields__["kl_estimator"].metadata["help"]
    assert "k1's is 0" in help_ and "k2's is grad KL(pi || pi_ref)" in help_ and "k3's is grad KL(pi_ref || pi)" in help_
    assert "regularises nothing" in algo.__doc__ and "KL(pi_ref || pi)" in algo.kl_k3.__doc__


def test_kl_placement_is_validated():
    assert Config().kl_placement == "loss"
    with pytest.raises(ConfigError, match=r"config field 'kl_placement': got 'rewards' \(did you mean 'reward'\?\)"):
        Config(kl_placement="rewards")


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


def _batch(tok, lengths, n=2, seed=0, T=None) -> RolloutBatch:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor(lengths)
    B, T = len(lengths), T or int(lengths.max())
    P = B // n
    ids = torch.randint(3, len(tok), (B, T), generator=g)
    ids = torch.where(torch.arange(T)[None] < lengths[:, None], ids, tok.pad_token_id)
    correct = torch.tensor([i % 2 == 0 for i in range(B)])
    batch = RolloutBatch(prompts=[f"q{p}" for p in range(P)], prompt_ids=[tok(f"q{p}?")["input_ids"] for p in range(P)],
                         n=n, response_ids=ids, logprobs=torch.zeros(B, T), lengths=lengths,
                         truncated=lengths == T, texts=[""] * B, pad_id=tok.pad_token_id,
                         rewards=correct.float(), correct=correct)
    batch.meta["temperature"] = 1.0
    return batch.validate()


def _lp(model, batch) -> torch.Tensor:
    return logprobs.compute_logprobs(model, batch, temperature=1.0, micro_batch_tokens=16)


def _cfg(**kw) -> Config:
    base = dict(rollouts_per_prompt=2, prompts_per_step=2, max_new_tokens=4, kl_beta=0.0, lr=1e-3,
                train_micro_batch_tokens=16)
    return Config(**{**base, **kw})


def test_kl_in_reward_lowers_rewards_by_beta_times_the_sequence_kl(tok):
    policy, reference = tiny_qwen2(len(tok), seed=0), tiny_qwen2(len(tok), seed=1)
    batch = _batch(tok, [4, 2, 3, 1])
    cfg = _cfg(kl_beta=0.5, kl_placement="reward", kl_estimator="k1")
    out, kl = S.kl_in_reward(batch, policy, reference, cfg=cfg)
    lp, ref = _lp(policy, batch), _lp(reference, batch)
    per_seq = torch.where(batch.response_mask, lp - ref, 0.0).sum(1)
    torch.testing.assert_close(out.rewards, batch.rewards - 0.5 * per_seq)
    assert kl == pytest.approx(float(per_seq.sum()) / int(batch.lengths.sum()))
    assert torch.equal(out.correct, batch.correct) and torch.equal(batch.rewards, batch.correct.float())  # a copy
    same, none = S.kl_in_reward(batch, policy, reference, cfg=_cfg(kl_beta=0.5))  # kl_placement='loss'
    assert same is batch and none is None
    # with the KL in the reward, update neither needs a reference nor adds a KL term
    report = S.update(policy, torch.optim.AdamW(policy.parameters()), out, S.advantages(out, "grpo"), cfg=cfg)
    assert "kl" not in report.metrics


# ---- (e) truncated IS against the ICE-POP band mask --------------------------------------------------------------
def test_truncate_caps_and_icepop_masks():
    engine = torch.zeros(1, 5)
    trainer = torch.log(torch.tensor([[0.3, 0.5, 1.0, 5.0, 8.0]]))
    trunc = algo.importance_weights("truncate", trainer, engine, cap=2.0)
    torch.testing.assert_close(trunc, torch.tensor([[0.3, 0.5, 1.0, 2.0, 2.0]]))
    ice = algo.importance_weights("icepop_mask", trainer, engine, low=0.5, high=5.0)
    torch.testing.assert_close(ice, torch.tensor([[0.0, 0.5, 1.0, 5.0, 0.0]]))  # outside [0.5, 5]: masked, not capped
    assert algo.importance_weights("none", None, engine) is None
    with pytest.raises(ValueError, match="argument 'mode' got 'tis'"):
        algo.importance_weights("tis", trainer, engine)
    with pytest.raises(ValueError, match="argument 'high'"):
        algo.icepop_mask_weights(trainer, engine, low=2.0, high=1.0)


def test_a_masked_token_gets_no_gradient_and_is_counted():
    logp = torch.log(torch.tensor([[0.2, 0.3, 0.4]], dtype=torch.float64)).requires_grad_(True)
    mask = torch.ones(1, 3, dtype=torch.bool)
    w = algo.icepop_mask_weights(logp.detach(), logp.detach() - torch.tensor([[0.0, 3.0, 0.0]]), 0.5, 5.0)
    loss, m = algo.ppo_clip(logp, logp.detach(), torch.tensor([1.0]), mask, eps_low=0.2, eps_high=0.28,
                            loss_agg="token_mean", is_weights=w)
    loss.backward()
    assert logp.grad[0, 1] == 0 and logp.grad[0, 0] != 0 and logp.grad[0, 2] != 0
    assert m["is_masked_tokens"] == 1 and m["is_masked_frac"] == pytest.approx(1 / 3)


def test_is_correction_knobs_are_validated_and_old_tis_cap_configs_still_load():
    cfg = Config(is_correction="icepop_mask")
    assert (cfg.icepop_low, cfg.icepop_high) == (0.5, 5.0) and not S.is_on_policy(cfg)
    assert S.is_on_policy(Config())
    from brorl_lab.rl.spec import check

    with pytest.raises(ConfigError, match="config field 'is_correction': got 'ice_pop'"):
        check(Config(is_correction="ice_pop"))  # a name of rl.algo.IS_CORRECTIONS: checked at the rl boundary
    with pytest.raises(ConfigError, match=r"config field 'icepop_low': got 2.0; allowed: a float in \(0, 1\]"):
        Config(icepop_low=2.0)
    with pytest.raises(ConfigError, match="config field 'is_cap'"):
        Config(is_cap=0.5)
    old = Config.from_dict({"tis_cap": 3.0})  # a config.yaml written before the rename
    assert (old.is_correction, old.is_cap) == ("truncate", 3.0)
    assert Config.from_dict({"tis_cap": None}).is_correction == "none"


# ---- (f) one loss-normaliser rule, zero-length responses included ------------------------------------------------
@pytest.mark.parametrize("loss_agg", ["seq_mean_token_mean", "seq_mean_token_sum_norm"])
def test_update_normalises_like_loss_normalisers_with_a_zero_length_response(tok, loss_agg):
    policy = tiny_qwen2(len(tok), seed=2)
    batch = _batch(tok, [3, 0, 2, 4])  # row 1: an empty response (RolloutBatch allows it)
    cfg = _cfg(policy_loss="pg", loss_agg=loss_agg)
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5])
    mask = batch.response_mask
    norms = algo.loss_normalisers([mask], max_response_len=cfg.max_new_tokens)
    assert norms["num_seqs"] == 3  # sequences with at least one token
    want, _ = algo.pg(_lp(policy, batch), None, adv, mask, loss_agg=loss_agg, **norms)
    report = S.update(policy, torch.optim.SGD(policy.parameters(), lr=0.0), batch, adv, cfg=cfg)
    assert report.metrics["policy_loss"] == pytest.approx(float(want), rel=1e-5)


# ---- (g) one update loop; a non-finite mini-batch is caught before its optimizer step ----------------------------------
def test_the_update_loop_is_written_once_in_steps_update():
    """algo's docstring points to steps.update instead of holding a copy of its loop (a copy drifts)."""
    import inspect

    assert "brorl_lab.rl.steps.update" in algo.__doc__ and "holds no copy" in algo.__doc__
    assert "optimizer.step()" not in algo.__doc__ and "loss.backward()" not in algo.__doc__
    assert "optimizer.step()" in inspect.getsource(S.update)


def test_a_non_finite_gradient_in_a_later_mini_batch_keeps_the_earlier_steps_and_nothing_else(tok):
    """optimizer_steps_per_step=3: a NaN gradient injected into mini-batch 2 stops the update before its step. The
    weights and AdamW's state are exactly those after mini-batch 1 of the same update run cleanly (no copy of the
    model or optimizer is kept to roll back), the gradients are cleared, and the error says one step was applied."""
    torch.manual_seed(0)
    policy = tiny_qwen2(len(tok), seed=3).train()
    batch = _batch(tok, [4, 2, 3, 1, 4, 3], n=2)
    g = torch.Generator().manual_seed(5)
    batch.logprobs = _lp(policy, batch) + 0.3 * torch.randn(batch.logprobs.shape, generator=g)
    batch.rewards = torch.rand(batch.size, generator=g)
    cfg = _cfg(prompts_per_step=3, optimizer_steps_per_step=3, kl_beta=0.0, entropy_coef=0.01)
    adv = S.advantages(batch, cfg.advantage, std_norm=cfg.adv_std_norm)

    def run(inject_at: int | None):
        p = copy.deepcopy(policy)
        opt = torch.optim.AdamW(p.parameters(), lr=1e-2)
        steps = []  # one entry per optimizer step taken; the first holds the state right after it
        opt.register_step_post_hook(lambda o, *_: steps.append(
            None if steps else ({k: v.clone() for k, v in p.state_dict().items()}, copy.deepcopy(o.state_dict()))))

        def poison(grad):  # every backward of mini-batch `inject_at` (1-based) turns one gradient into NaNs
            return grad * float("nan") if len(steps) + 1 == inject_at else grad

        p.model.norm.weight.register_hook(poison)
        try:
            S.update(p, opt, batch, adv, cfg=cfg)
            err = None
        except S.NonFiniteError as e:
            err = e
        return p, opt, steps[0] if steps else None, err

    clean, _, (want_weights, want_opt), err = run(None)
    assert err is None
    hit, opt, _, err = run(2)
    assert isinstance(err, S.NonFiniteError) and "gradient norm is nan" in str(err) and err.optimizer_steps == 1
    for name, v in hit.state_dict().items():
        assert torch.equal(v, want_weights[name]), name
    got = opt.state_dict()
    assert got["state"].keys() == want_opt["state"].keys() and len(got["state"]) > 0
    for i, st in got["state"].items():
        for k, v in st.items():
            assert torch.equal(v, want_opt["state"][i][k]), (i, k)  # step count 1, moments of mini-batch 1 only
    assert all(p.grad is None for p in hit.parameters())
    assert any(not torch.equal(a, b) for a, b in zip(hit.state_dict().values(), clean.state_dict().values()))
    # in the first mini-batch: nothing applied at all
    first, opt, _, err = run(1)
    assert err.optimizer_steps == 0 and opt.state_dict()["state"] == {}
    assert all(torch.equal(a, b) for a, b in zip(first.state_dict().values(), policy.state_dict().values()))


# ---- (h) eval flags take the config's defaults ----------------------------------------------------------------------
def test_eval_flags_default_to_the_config_fields():
    args = cli.build_parser().parse_args(["eval"])
    c = Config()
    assert (args.temperature, args.top_p, args.samples, args.k, args.prompts, args.max_new_tokens, args.seed,
            args.template, args.model, args.engine) == (
        c.eval_temperature, c.eval_top_p, c.eval_samples, c.eval_k, c.eval_prompts, c.max_new_tokens, c.seed,
        c.template, c.model, c.engine)


def test_bad_eval_flag_names_its_config_field(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["eval", "--temperature", "0"])
    assert e.value.code == 2
    assert "config field 'eval_temperature': got 0.0" in capsys.readouterr().err


# ---- (i) a run directory is never overwritten silently ---------------------------------------------------------------
def _tiny_run_cfg(tmp_path, **kw) -> Config:
    return Config(**{**dict(tasks=["chain_sum"], rollouts_per_prompt=4, prompts_per_step=2, max_new_tokens=4,
                            steps=2, eval_every=0, checkpoint_every=1, dynamic_sampling=False, kl_beta=0.0,
                            run_dir=str(tmp_path), run_name="r", torch_threads=1), **kw})


def test_new_trainer_refuses_an_existing_run_dir(tmp_path):
    from brorl_lab.rl.trainer import RunExistsError, Trainer

    run = tmp_path / "r"
    (run / "checkpoint").mkdir(parents=True)  # a run with a checkpoint is a run to protect (docs/runs.md)
    (run / "checkpoint" / "state.pt").write_bytes(b"old")
    (run / "config.yaml").write_text("seed: 0\n")
    (run / "events.jsonl").write_text('{"event": "old"}\n')
    with pytest.raises(RunExistsError, match=f"run_dir: {run} already holds a run .*Trainer.resume.*overwrite=True"):
        Trainer(_tiny_run_cfg(tmp_path), progress=False)
    with pytest.raises(RunExistsError, match=str(run)):
        Trainer(_tiny_run_cfg(tmp_path, run_name="other"), run_dir=run, progress=False)
    assert (run / "events.jsonl").read_text() == '{"event": "old"}\n'  # untouched
    with Trainer(_tiny_run_cfg(tmp_path, steps=1), progress=False, overwrite=True) as t:
        t.run()
    assert "old" not in (run / "events.jsonl").read_text() if (run / "events.jsonl").exists() else True
    resumed = Trainer.resume(run, progress=False)  # resume is the other way in
    assert resumed.step_idx == 1
    resumed.close()


def test_cli_train_refuses_then_overwrites(tmp_path, capsys):
    run = tmp_path / "r"
    (run / "checkpoint").mkdir(parents=True)  # only a checkpoint makes a run to protect (docs/runs.md, issue 46)
    (run / "checkpoint" / "state.pt").write_bytes(b"old")
    argv = ["train", "--quiet", "--run-dir", str(tmp_path), "--run-name", "r", "--steps", "1", "--eval-every", "0",
            "--rollouts-per-prompt", "2", "--prompts-per-step", "1", "--max-new-tokens", "2", "--kl-beta", "0",
            "--no-dynamic-sampling", "--torch-threads", "1"]
    with pytest.raises(SystemExit):
        cli.main(argv)
    assert f"{run} already holds a run" in capsys.readouterr().err
    assert cli.main([*argv, "--overwrite"]) == 0


def test_sweep_retry_passes_overwrite(tmp_path):
    pytest.importorskip("papermill")
    from helpers_notebooks import write_notebook

    from brorl_lab.lab.sweep import run_sweep

    nb = write_notebook(tmp_path / "nb.ipynb", "run_dir = None\noverwrite = False\nx = 0",
                        "import pathlib\n(pathlib.Path(run_dir) / 'seen.txt').open('a').write(f'{overwrite}\\n')\n"
                        "assert overwrite, 'first attempt fails'")
    out = tmp_path / "sweep"
    first = run_sweep(nb, {"x": [1]}, out=out, progress=False)
    assert first.status.tolist() == ["failed"]
    second = run_sweep(nb, {"x": [1]}, out=out, progress=False)
    assert second.status.tolist() == ["finished"]
    seen = next(out.glob("*/seen.txt")).read_text().split()
    assert seen == ["False", "True"]


# ---- (j) ENOSPC mid-checkpoint keeps the last good checkpoint and says so ------------------------------------------
def test_disk_full_mid_checkpoint_keeps_the_last_good_one(tmp_path, monkeypatch):
    from brorl_lab.rl.trainer import CHECKPOINT_FILE, CheckpointError, Trainer

    real_save, calls = torch.save, []

    def save(obj, f, *a, **kw):
        calls.append(1)
        if len(calls) == 2:  # the second checkpoint: half written, then the disk is full
            f.write(b"\0" * 1024)
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_save(obj, f, *a, **kw)

    monkeypatch.setattr(torch, "save", save)
    trainer = Trainer(_tiny_run_cfg(tmp_path, steps=3), progress=False)
    ckpt = trainer.run_dir.checkpoint_dir / CHECKPOINT_FILE
    with pytest.raises(CheckpointError) as e:
        trainer.run()
    msg = str(e.value)
    assert "checkpoint at step 2 could not be written (ENOSPC: No space left on device)" in msg
    assert f"the last good checkpoint (step 1) is kept, unchanged, at {ckpt}" in msg
    assert e.value.errno == errno.ENOSPC and e.value.kept == ckpt
    monkeypatch.setattr(torch, "save", real_save)
    assert torch.load(ckpt, weights_only=False)["step"] == 1
    assert not list(ckpt.parent.glob(".*.tmp"))  # the torn temp file is gone
    status = json.loads((trainer.run_dir.path / "status.json").read_text())
    assert status["status"] == "failed" and "last good checkpoint (step 1)" in status["error"]
    events = [ev["event"] for ev in trainer.run_dir.read_events()]
    assert "checkpoint_failed" in events
    trainer.close()
    resumed = Trainer.resume(trainer.run_dir.path, progress=False)
    assert resumed.step_idx == 1
    resumed.close()
