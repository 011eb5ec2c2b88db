"""Runs that leave the workbench (issue 16): Hugging Face checkpoints opened by plain transformers and vLLM, the
`export` command, trackers whose files are read back, TRL's names, and progress bars.

Run the vLLM part with ``pytest tests/test_ecosystem.py -m vllm``.
"""

from __future__ import annotations

import errno
import json
import math
import os
import shutil
from pathlib import Path

import pytest
import torch

from brorl_lab import cli
from brorl_lab.core.config import Config, ConfigError
from brorl_lab.rl.trainer import CHECKPOINT_FILE, CheckpointError, Trainer

torch.set_num_threads(1)
os.environ.setdefault("WANDB_MODE", "offline")  # the wandb tracker's own default; never the network in tests


def small_cfg(root: Path, name: str, **kw) -> Config:
    base = dict(tasks=["chain_sum"], rollouts_per_prompt=4, prompts_per_step=2, max_new_tokens=6, steps=2,
                eval_every=1, eval_prompts=4, eval_samples=2, eval_k=[1, 2], checkpoint_every=1, lr=3e-3,
                max_resample_rounds=1, torch_threads=1, run_dir=str(root), run_name=name)
    base.update(kw)
    return Config(**base)


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Trainer:
    """A finished two-step run on the shipped default model (its policy moved away from the default), reporting to
    TensorBoard and W&B (offline)."""
    import importlib.util

    wandb = ["wandb"] if importlib.util.find_spec("wandb") else []  # the `track` extra
    cfg = small_cfg(tmp_path_factory.mktemp("runs"), "hf", report_to=["tensorboard", *wandb])
    with Trainer(cfg, progress=False) as t:
        t.run()
    return t


# ---- 1. Hugging Face checkpoints ----------------------------------------------------------------------------------
def test_checkpoint_writes_a_policy_dir_plain_transformers_opens(run):
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    from brorl_lab.core.models import resolve_model

    policy_dir = run.run_dir.policy_dir
    files = {p.name for p in policy_dir.iterdir()}
    assert {"config.json", "model.safetensors", "generation_config.json", "tokenizer.json", "brorl_lab.json"} <= files
    assert not list(run.run_dir.path.glob(".policy*"))  # no staged or old directory left behind
    info = json.loads((policy_dir / "brorl_lab.json").read_text())
    assert info["step"] == 2 == run.step_idx and info["config"]["rollouts_per_prompt"] == 4
    model = AutoModelForCausalLM.from_pretrained(policy_dir).eval()
    tok = AutoTokenizer.from_pretrained(policy_dir)
    ids = tok(["Q: 1+2 A:", "3 + 4 ="], return_tensors="pt", padding=True)
    run.policy.eval()
    with torch.no_grad():
        got, want = model(**ids).logits, run.policy(**ids).logits
    assert torch.equal(got, want)  # the trained weights, not the base model's
    base = AutoModelForCausalLM.from_pretrained(resolve_model(run.cfg.model))
    with torch.no_grad():
        assert not torch.equal(base.eval()(**ids).logits, got)
    gen = GenerationConfig.from_pretrained(policy_dir)
    assert (gen.do_sample, gen.temperature, gen.top_p, gen.max_new_tokens) == (True, 0.6, 0.95, 6)
    assert gen.pad_token_id == tok.pad_token_id is not None
    out = model.generate(**ids, max_new_tokens=3, do_sample=False)
    assert out.shape == (2, ids["input_ids"].shape[1] + 3)


def test_config_eval_and_load_policy_accept_the_run_dir(run, capsys):
    from brorl_lab.core.models import load_policy, resolve_model

    path = run.run_dir.path
    assert resolve_model(str(path)) == resolve_model(str(path / "policy")) == str(run.run_dir.policy_dir.resolve())
    Config(model=str(path))
    Config(model=str(path / "policy"))
    policy, _ = load_policy(str(path), device="cpu")
    assert torch.equal(policy.state_dict()["model.norm.weight"], run.policy.state_dict()["model.norm.weight"])
    assert cli.main(["eval", "--model", str(path), "--tasks", "chain_sum", "--prompts", "2", "--samples", "2",
                     "--k", "1", "2"]) == 0
    assert f"model={path}" in capsys.readouterr().out


def test_a_run_dir_without_policy_fails_naming_export(tmp_path):
    from brorl_lab.core.models import resolve_model

    (tmp_path / "old" / "checkpoint").mkdir(parents=True)
    from brorl_lab.rl.spec import check

    with pytest.raises(ConfigError, match="config field 'model'.*run directory with policy/"):
        check(Config(model=str(tmp_path / "old")))
    with pytest.raises(ValueError, match="without policy/.*brorl_lab export"):
        resolve_model(str(tmp_path / "old"))


def test_save_pretrained_and_export(run, tmp_path, capsys):
    from transformers import AutoModelForCausalLM

    direct = run.save_pretrained(tmp_path / "direct")
    assert (direct / "model.safetensors").is_file() and (direct / "tokenizer.json").is_file()
    assert cli.main(["export", str(run.run_dir.path), str(tmp_path / "exported")]) == 0
    assert "Hugging Face model directory" in capsys.readouterr().out
    a = AutoModelForCausalLM.from_pretrained(tmp_path / "exported").state_dict()
    b = AutoModelForCausalLM.from_pretrained(direct).state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    with pytest.raises(SystemExit):  # never over an existing model directory
        cli.main(["export", str(run.run_dir.path), str(tmp_path / "exported")])
    assert "out: " in capsys.readouterr().err


def test_export_rebuilds_policy_of_a_run_written_before_policy_dirs(run, tmp_path):
    """A run from before this feature has checkpoint/state.pt only: export loads the base model and its weights."""
    from transformers import AutoModelForCausalLM

    old = tmp_path / "old_run"
    shutil.copytree(run.run_dir.path, old)
    shutil.rmtree(old / "policy")
    out = cli.main(["export", str(old), str(tmp_path / "rebuilt")])
    assert out == 0
    rebuilt = AutoModelForCausalLM.from_pretrained(tmp_path / "rebuilt").state_dict()
    trained = run.policy.state_dict()
    assert all(torch.equal(rebuilt[k], trained[k]) for k in rebuilt)


def test_disk_full_while_staging_the_policy_keeps_the_last_good_checkpoint(tmp_path, monkeypatch):
    """ENOSPC inside the policy/ write (safetensors, not torch.save) leaves state.pt and policy/ at the last good
    step, and no staged directory behind."""
    import transformers.modeling_utils as mu

    real, calls = mu.safe_save_file, []

    def save_file(*a, **kw):
        calls.append(1)
        if len(calls) == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(*a, **kw)

    monkeypatch.setattr(mu, "safe_save_file", save_file)
    trainer = Trainer(small_cfg(tmp_path, "full", steps=3, eval_every=0), progress=False)
    with pytest.raises(CheckpointError, match=r"checkpoint at step 2 could not be written \(ENOSPC.*step 1\)"):
        trainer.run()
    assert len(calls) == 2, "the policy is written with safetensors' save_file"
    run = trainer.run_dir
    assert torch.load(run.checkpoint_dir / CHECKPOINT_FILE, weights_only=False)["step"] == 1
    assert json.loads((run.policy_dir / "brorl_lab.json").read_text())["step"] == 1
    assert not list(run.path.glob(".policy*"))
    trainer.close()


@pytest.mark.vllm
def test_vllm_cpu_engine_serves_the_run_dir(run):
    """vLLM opens the run directory (its policy/) by path, and its sampled-token logprobs are the trained policy's."""
    from brorl_lab.rl.logprobs import compute_logprobs
    from brorl_lab.rollout.engines import RolloutSampling, make_engine

    engine = make_engine("vllm", str(run.run_dir.path), device="cpu", max_model_len=128, kv_cache_gib=0.25, seed=0)
    try:
        batch = engine.generate(["Q: 1+2 A:", "3 + 4 ="], 8, RolloutSampling(max_new_tokens=6, seed=1))
    finally:
        engine.close()
    batch.validate()
    assert batch.meta["engine"] == "vllm" and batch.size == 16
    ref = compute_logprobs(run.policy, batch, temperature=1.0, micro_batch_tokens=512)
    diff = (ref - batch.logprobs).abs()[batch.response_mask]
    assert float(diff.max()) < 1e-2 and float(diff.mean()) < 1e-3


# ---- 2. trackers ---------------------------------------------------------------------------------------------------
def _expected(metrics, tag=lambda k: k) -> dict:
    """(tag, step) -> value for every finite number of metrics.parquet, as the trackers log them."""
    out = {}
    for row in metrics.to_dict("records"):
        for k, v in row.items():
            if k != "step" and not isinstance(v, str) and v is not None and math.isfinite(float(v)):
                out[(tag(k), int(row["step"]))] = float(v)
    return out


def test_tensorboard_and_wandb_hold_the_metrics_rows(run):
    from brorl_lab.rl.trackers import read_tensorboard, read_wandb, tensorboard_tag

    metrics = run.run_dir.read_metrics()
    want = _expected(metrics, tensorboard_tag)
    assert ("eval/chain_sum/pass_1", 0) in want and ("reward_mean", 2) in want and ("time/rollout", 1) in want
    tb = read_tensorboard(run.run_dir.path)
    got = {(r.tag, int(r.step)): r.value for r in tb.itertuples()}
    assert got.keys() == want.keys() and len(tb) == len(got)  # each value once
    assert all(got[k] == pytest.approx(v, rel=1e-6) for k, v in want.items())  # float32 in event files
    pytest.importorskip("wandb")
    wb = read_wandb(run.run_dir.path)
    assert wb["_step"].tolist() == [0, 1, 2]
    for (tag, step), v in _expected(metrics).items():  # W&B keeps the column names as they are
        assert wb.loc[wb["_step"] == step, tag].item() == pytest.approx(v)


def test_tensorboard_command_converts_existing_runs(run, tmp_path, capsys):
    from brorl_lab.rl.trackers import read_tensorboard, tensorboard_tag

    old = tmp_path / "old"
    shutil.copytree(run.run_dir.path, old, ignore=shutil.ignore_patterns("tensorboard", "wandb"))
    assert cli.main(["tensorboard", str(old)]) == 0
    assert f"tensorboard --logdir {tmp_path}" in capsys.readouterr().out
    got = {(r.tag, int(r.step)): r.value for r in read_tensorboard(old).itertuples()}
    want = _expected(run.run_dir.read_metrics(), tensorboard_tag)
    assert got.keys() == want.keys() and all(got[k] == pytest.approx(v, rel=1e-6) for k, v in want.items())
    assert cli.main(["tensorboard", str(old)]) == 0  # again: replaces, never doubles
    assert len(read_tensorboard(old)) == len(want)
    with pytest.raises(SystemExit):
        cli.main(["tensorboard", str(old), str(tmp_path / "nothing")])
    assert "hold no metrics.parquet" in capsys.readouterr().err


def test_report_to_names_are_checked_before_anything_runs():
    from brorl_lab.rl.spec import check

    with pytest.raises(ConfigError, match="config field 'report_to': got 'tensorbord'.*did you mean 'tensorboard'"):
        check(Config(report_to=["tensorbord"]))
    with pytest.raises(ConfigError, match="config field 'report_to'.*distinct"):
        Config(report_to=["wandb", "wandb"])
    assert cli.config_from_args(cli.build_parser().parse_args(["train", "--report-to", "tensorboard"])).report_to == [
        "tensorboard"]


def test_a_tracker_without_its_package_fails_before_the_run_starts(tmp_path, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    with pytest.raises(ConfigError, match=r"'report_to': 'wandb' needs the wandb package.*brorl_lab\[track\]"):
        Trainer(small_cfg(tmp_path, "no_wandb", report_to=["wandb"]), progress=False)
    assert not (tmp_path / "no_wandb").exists()


def test_a_resumed_run_replaces_the_steps_its_crashed_process_logged(tmp_path):
    """A process that logged past its last checkpoint: the resumed run logs those steps again, and TensorBoard
    (purge_step) keeps only the new values."""
    from brorl_lab.rl.trackers import read_tensorboard

    def crash_at_3(trainer, row):  # after the trackers logged step 3, before any checkpoint of it
        if row["step"] == 3:
            raise RuntimeError("crash")

    cfg = small_cfg(tmp_path, "resume", steps=4, eval_every=0, checkpoint_every=2, report_to=["tensorboard"])
    with Trainer(cfg, progress=False, callbacks=[crash_at_3]) as t:
        with pytest.raises(RuntimeError, match="crash"):
            t.run()
    resumed = Trainer.resume(t.run_dir.path, progress=False)
    assert resumed.step_idx == 2
    with resumed:
        resumed.run()
    tb = read_tensorboard(t.run_dir.path)
    steps = tb[tb.tag == "reward_mean"].step.tolist()
    assert steps == [1, 2, 3, 4]  # step 3 once: the crashed process's value purged
    final = resumed.run_dir.read_metrics().set_index("step")
    for step in (3, 4):
        assert tb[(tb.tag == "reward_mean") & (tb.step == step)].value.item() == pytest.approx(
            final.loc[step, "reward_mean"])


# ---- 5. TRL's names ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def trl():
    return pytest.importorskip("trl")


def test_from_trl_maps_grpo_config_fields(trl, tmp_path):
    g = trl.GRPOConfig(use_cpu=True, num_generations=4, beta=1e-3, epsilon=0.2, epsilon_high=0.28, learning_rate=1e-4,
                       temperature=0.9, top_p=0.95, max_completion_length=8, loss_type="grpo", scale_rewards="none",
                       per_device_train_batch_size=8, steps_per_generation=2, max_steps=3, warmup_steps=1,
                       max_grad_norm=0.5, report_to=["tensorboard"], output_dir=str(tmp_path / "grpo_run"))
    cfg = Config.from_trl(g, tasks=["gcd"])
    assert (cfg.rollouts_per_prompt, cfg.kl_beta, cfg.eps_low, cfg.eps_high, cfg.lr) == (4, 1e-3, 0.2, 0.28, 1e-4)
    assert (cfg.temperature, cfg.top_p, cfg.max_new_tokens, cfg.steps, cfg.lr_warmup_steps) == (0.9, 0.95, 8, 3, 1)
    assert cfg.loss_agg == "seq_mean_token_mean" and cfg.adv_std_norm is False and cfg.grad_clip == 0.5
    # 8 completions per device step x 2 steps per generation = 16 completions = 4 prompts x 4, in 2 optimizer steps
    assert (cfg.prompts_per_step, cfg.optimizer_steps_per_step) == (4, 2)
    assert cfg.dynamic_sampling is False and cfg.kl_estimator == "k3" and cfg.report_to == ["tensorboard"]
    assert (cfg.run_dir, cfg.run_name, cfg.tasks, cfg.dtype) == (str(tmp_path), "grpo_run", ["gcd"], "auto")
    d = Config.from_trl(trl.GRPOConfig(use_cpu=True))
    assert (d.eps_high, d.loss_agg, d.adv_std_norm, d.kl_beta) == (0.2, "token_mean", True, 0.0)  # TRL's defaults


def test_from_trl_refuses_what_has_no_equivalent_in_one_error(trl):
    g = trl.GRPOConfig(use_cpu=True, top_k=5, mask_truncated_completions=True, loss_type="cispo", num_iterations=2)
    with pytest.raises(ConfigError) as e:
        Config.from_trl(g)
    msg = str(e.value)
    for part in ("top_k=5", "mask_truncated_completions=True", "loss_type='cispo'", "num_iterations=2", "allowed"):
        assert part in msg, msg
    assert len(msg.splitlines()) == 1
    with pytest.raises(ConfigError, match="from_trl: got dict"):
        Config.from_trl({"num_generations": 4})


# ---- 6. progress -----------------------------------------------------------------------------------------------------
class RecordingBar:
    """Stands in for tqdm.auto.tqdm: records total, updates and postfixes (the real bar writes to a terminal)."""

    made: list = []

    def __init__(self, *a, total=None, disable=False, **kw):
        self.total, self.disable, self.n, self.postfixes = total, disable, 0, []
        RecordingBar.made.append(self)

    def update(self, n=1):
        self.n += n

    def set_postfix(self, d=None, refresh=True, **kw):
        self.postfixes.append(dict(d or {}, **kw))

    def set_postfix_str(self, s="", refresh=True):
        self.postfixes.append(s)

    def close(self):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


@pytest.fixture
def bars(monkeypatch):
    import tqdm.auto

    RecordingBar.made = []
    monkeypatch.setattr(tqdm.auto, "tqdm", RecordingBar)
    return RecordingBar.made


def test_evaluation_bar_counts_families_x_chunks_with_pass_at_1_so_far(run, bars):
    from brorl_lab.rl.evaluation import evaluate
    from brorl_lab.rollout.engines import make_engine

    engine = make_engine("torch", run.policy, run.tokenizer, device="cpu")
    res = evaluate(engine, ["chain_sum", "gcd"], samples=2, k=(1,), prompts=5, chunk_prompts=2)
    (bar,) = bars
    assert bar.total == bar.n == 6 and not bar.disable  # 2 families x ceil(5 / 2) chunks
    assert len(bar.postfixes) == 6 and "gcd/pass@1" in bar.postfixes[-1] and "chain_sum/pass@1" in bar.postfixes[2]
    items = res.per_item
    assert float(bar.postfixes[-1]["pass@1"]) == pytest.approx(items.correct.sum() / (2 * len(items)), abs=5e-4)
    assert float(bar.postfixes[-1]["gcd/pass@1"]) == pytest.approx(res.metrics["eval/gcd/pass@1"], abs=5e-4)
    evaluate(engine, ["gcd"], samples=2, prompts=2, progress=False)
    assert bars[-1].disable


def test_sweep_bar_shows_each_running_runs_step(tmp_path, bars):
    pytest.importorskip("papermill")
    from helpers_notebooks import write_notebook

    from brorl_lab.lab.sweep import progress_text, run_progress, run_sweep

    nb = write_notebook(tmp_path / "nb.ipynb", "run_dir = None\nsteps = 3",
                        "import time\nfrom brorl_lab.core.rundir import RunDir\n"
                        "for step in range(steps + 1):\n"
                        "    RunDir(run_dir).write_status('running', step=step, steps=steps)\n"
                        "    time.sleep(1.0)")
    df = run_sweep(nb, {"steps": [3]}, out=tmp_path / "sweep", poll_s=0.2)
    assert df.status.tolist() == ["finished"]
    texts = [p for p in bars[0].postfixes if isinstance(p, str)]
    assert any("step 2/3" in t for t in texts), texts
    assert bars[0].n == bars[0].total == 1
    # a run that names its own directory inside the sweep's run_dir (as Trainer(cfg) with run_dir=... does)
    (tmp_path / "r" / "inner").mkdir(parents=True)
    assert run_progress(tmp_path / "r") is None and progress_text([tmp_path / "r"]) == "r: starting"
    (tmp_path / "r" / "inner" / "status.json").write_text('{"status": "running", "step": 4, "steps": 9}')
    assert run_progress(tmp_path / "r") == (4, 9)


def test_trainer_status_counts_steps_for_the_sweep(run):
    status = json.loads((run.run_dir.path / "status.json").read_text())
    assert status["status"] == "finished" and status["step"] == 2
    seen = []

    def record(trainer, row):
        seen.append(json.loads((trainer.run_dir.path / "status.json").read_text()))

    with Trainer(small_cfg(run.run_dir.path.parent, "status", steps=2, eval_every=0, checkpoint_every=0),
                 progress=False, callbacks=[record]) as t:
        t.run()
    # the status a callback sees after step k says step k-1 (it is written after the row is emitted)
    assert [(s["status"], s["step"], s["steps"]) for s in seen] == [("running", 0, 2), ("running", 1, 2)]
