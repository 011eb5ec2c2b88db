"""What a user meets in the first minute (issue 46): refusals in a second, before torch loads; no dead end whatever
stopped a run (two Ctrl-C / SIGTERM or kill -9 before the first checkpoint, kill -9 after one, a signal in the last
step, a full disk); every user-side fault one line with exit 2; a sweep over `train` flags whose report pairs seeds.

Real processes, real signals, a real file-size limit (RLIMIT_FSIZE: the kernel refuses the write as a full disk
does); the tiny model of helpers_models and a few steps each."""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from helpers_models import save_tiny

from brorl_lab.core.rundir import RunDir
from brorl_lab.core.runlock import RunLock

ROOT = Path(__file__).resolve().parent.parent
TINY = dict(template="plain", rollouts_per_prompt=4, prompts_per_step=2, max_new_tokens=4, eval_prompts=4,
            eval_samples=4, eval_k=[1], eval_every=0, checkpoint_every=0, threads=1, dynamic_sampling=False, lr=1e-2)
HEAVY = ("torch", "transformers", "pandas", "vllm", "ray", "datasets", "reasoning_gym")


def env() -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> str:
    return str(save_tiny(tmp_path_factory.mktemp("model") / "tiny"))


def train_cmd(model: str, root: Path, name: str, **over) -> list[str]:
    out = []
    for k, v in {**TINY, "model": model, "run_dir": str(root), "run_name": name, **over}.items():
        flag = "--" + k.replace("_", "-")
        out += [flag, *map(str, v)] if isinstance(v, list) else (
            [flag if v else f"--no-{k.replace('_', '-')}"] if isinstance(v, bool) else [flag, str(v)])
    return [sys.executable, "-m", "brorl_lab", "train", "--quiet", *out]


def run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, env=env(), capture_output=True, text=True, timeout=300, **kw)


def cli(argv: list[str], capsys) -> tuple[int, str, str]:
    """``python -m brorl_lab argv`` in this process (torch already loaded: fast): (exit status, stdout, stderr)."""
    from brorl_lab.cli import main

    capsys.readouterr()
    try:
        rc = main([str(a) for a in argv])
    except SystemExit as e:
        rc = e.code
    out, err = capsys.readouterr()
    return rc, out, err


def last_line(err: str) -> str:
    assert "Traceback" not in err, err
    lines = [ln for ln in err.splitlines() if ln.strip() and not ln.startswith(("notice:", "note:"))]
    return lines[-1]


# ---- answers in a second ---------------------------------------------------------------------------------------------
REFUSALS = {
    "advantage": (["train", "--advantage", "grop"], "did you mean 'grpo'"),
    "engine": (["train", "--engine", "trch"], "did you mean 'torch'"),
    "task": (["train", "--tasks", "chain_summ"], "did you mean 'chain_sum'"),
    "model path": (["train", "--model", "./no_such_model"], "config field 'model'"),
    "abbreviated flag": (["train", "--step", "2"], "unrecognized arguments: --step"),
}


@pytest.mark.parametrize("name", list(REFUSALS))
def test_a_bad_name_is_refused_in_one_line_before_torch_loads(name, tmp_path):
    """Checked in-process (no heavy module imported by the refusal) and timed in a process of its own."""
    argv, needle = REFUSALS[name]
    code = ("import sys\nfrom brorl_lab.cli import main\ntry:\n    main(sys.argv[1:])\nexcept SystemExit as e:\n"
            "    print('rc', e.code)\nprint('heavy', sorted(m for m in %r if m in sys.modules))\n" % (HEAVY,))
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-c", code, *argv, "--run-dir", str(tmp_path)], env=env(),
                       capture_output=True, text=True, timeout=120)
    seconds = time.perf_counter() - t0
    assert "rc 2" in p.stdout and "heavy []" in p.stdout, (p.stdout, p.stderr)
    assert needle in last_line(p.stderr)
    assert seconds < 8, f"{seconds:.1f} s"  # about 1 s on an idle 2-core machine; generous for a loaded CI


def test_a_locked_run_is_refused_naming_its_writer_before_torch_loads(tmp_path):
    code = ("import sys\nfrom brorl_lab.cli import main\ntry:\n    main(sys.argv[1:])\nexcept SystemExit as e:\n"
            "    print('rc', e.code)\nprint('torch' in sys.modules)\n")
    with RunLock.acquire(tmp_path / "busy"):
        t0 = time.perf_counter()
        p = subprocess.run([sys.executable, "-c", code, "train", "--run-dir", str(tmp_path), "--run-name", "busy"],
                           env=env(), capture_output=True, text=True, timeout=120)
        seconds = time.perf_counter() - t0
    assert p.stdout.split() == ["rc", "2", "False"], (p.stdout, p.stderr)
    assert f"being written by pid {os.getpid()}" in last_line(p.stderr)
    assert seconds < 8, f"{seconds:.1f} s"


@pytest.mark.parametrize("field, ours", [("save_total_limit", "keep_checkpoints"),
                                         ("gradient_accumulation_steps", "train_micro_batch_tokens")])
def test_trl_names_without_a_one_to_one_value_are_refused_with_our_equivalent(field, ours, tmp_path):
    (tmp_path / "c.yaml").write_text(f"{field}: 2\n")
    p = run([sys.executable, "-m", "brorl_lab", "train", "--config", str(tmp_path / "c.yaml")])
    assert p.returncode == 2 and f"here: {ours}" in last_line(p.stderr)


# ---- no dead ends ----------------------------------------------------------------------------------------------------
def wait_for(pred, proc, what: str, timeout: float = 240) -> None:
    t0 = time.monotonic()
    while not pred():
        if proc.poll() is not None:
            raise AssertionError(f"exited ({proc.returncode}) before {what}: {proc.stderr.read()[-2000:]}")
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def trained_steps(run_dir: Path) -> int:
    try:
        return int(json.loads((run_dir / "status.json").read_text()).get("step", 0))
    except (OSError, ValueError):
        return 0


@pytest.mark.parametrize("way, then", [("SIGINT twice", "same command"), ("SIGTERM twice", "--resume"),
                                       ("kill -9", "--resume")])
def test_stopped_before_the_first_checkpoint_the_advice_restarts_it(way, then, tiny_model, tmp_path, capsys):
    """Steps trained, no checkpoint yet (checkpoint_every 0): nothing can continue it, so the same command and
    --resume both start it again, without --overwrite, and the printed line says so."""
    cmd = train_cmd(tiny_model, tmp_path, "r", steps=400, rollouts_per_prompt=16, max_new_tokens=12)
    p = subprocess.Popen(cmd, env=env(), text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    wait_for(lambda: trained_steps(tmp_path / "r") >= 1, p, "a trained step")
    if way == "kill -9":
        p.kill()
    else:
        sig = signal.SIGINT if way.startswith("SIGINT") else signal.SIGTERM
        p.send_signal(sig)
        time.sleep(0.01)
        p.send_signal(sig)
    _, err = p.communicate(timeout=120)
    assert not (tmp_path / "r" / "checkpoint").exists()
    if way != "kill -9":
        assert p.returncode == 128 + sig, err
        line = last_line(err)
        assert "run the same command again, or train --resume" in line, line
    rc, _, err = cli(cmd[3:cmd.index("--steps") + 1] + ["2"] + cmd[cmd.index("--steps") + 2:]
                     if then == "same command" else ["train", "--quiet", "--resume", tmp_path / "r", "--steps", "2"],
                     capsys)
    assert rc == 0, err
    assert ("cleared what an attempt stopped before its first checkpoint left" if then == "same command"
            else "starting it again from its config.yaml") in err
    assert RunDir(tmp_path / "r").read_status()["status"] == "finished"
    assert (tmp_path / "r" / "checkpoint" / "state.pt").is_file()


def test_killed_after_a_checkpoint_the_same_command_says_resume_and_resume_continues(tiny_model, tmp_path, capsys):
    cmd = train_cmd(tiny_model, tmp_path, "r", steps=400, checkpoint_every=1)
    p = subprocess.Popen(cmd, env=env(), text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    wait_for(lambda: (tmp_path / "r" / "checkpoint" / "state.pt").is_file(), p, "a checkpoint")
    p.kill()
    p.communicate(timeout=60)
    rc, _, err = cli(cmd[3:], capsys)
    line = last_line(err)
    assert rc == 2 and "status interrupted (writer gone)" in line and "--resume" in line, line
    rc, _, err = cli(["train", "--quiet", "--resume", tmp_path / "r", "--steps",
                      max(trained_steps(tmp_path / "r"), 1) + 1], capsys)
    assert rc == 0, err
    assert RunDir(tmp_path / "r").read_status()["status"] == "finished"


def test_a_signal_in_the_last_step_finishes_the_run_and_says_so(tiny_model, tmp_path):
    cmd = train_cmd(tiny_model, tmp_path, "r", steps=1, eval_every=1, rollouts_per_prompt=64, prompts_per_step=4,
                    max_new_tokens=16)
    p = subprocess.Popen(cmd, env=env(), text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    wait_for(lambda: (tmp_path / "r" / "metrics.parquet").is_file(), p, "the first evaluation")  # then the step
    time.sleep(0.5)
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=120)
    status = RunDir(tmp_path / "r").read_status()["status"]
    if p.returncode == 0:  # the signal came in the last step: finished, and the command says so
        assert status == "finished" and "the run finished" in err, err
    else:  # the step had not begun (a loaded machine): interrupted, with the advice that continues it
        assert p.returncode == 130 and status == "interrupted", err
        assert run(cmd).returncode == 0  # no checkpoint before step 1: the same command starts it again
    assert "resume with" not in err or status == "interrupted"


def test_a_full_disk_is_one_line_and_the_same_command_then_runs(tiny_model, tmp_path, capsys):
    """RLIMIT_FSIZE below the weights' size: the kernel refuses the checkpoint's write (EFBIG) as a full disk does
    (ENOSPC), inside safetensors. One line, exit 2, no temp files left after the next start."""
    def small_disk():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, 200_000))

    cmd = train_cmd(tiny_model, tmp_path, "r", steps=1)
    full = run(cmd, preexec_fn=small_disk)
    line = last_line(full.stderr)
    assert full.returncode == 2 and "could not be written" in line and "run the same command again" in line, line
    rc, _, err = cli(cmd[3:], capsys)
    assert rc == 0, err
    assert not [f.name for f in (tmp_path / "r").rglob(".*") if f.name.endswith((".tmp", ".old"))]


# ---- one line for user-side faults ----------------------------------------------------------------------------------
def test_damaged_weights_are_one_line_for_eval_and_train(tiny_model, tmp_path, capsys):
    rc, _, err = cli(train_cmd(tiny_model, tmp_path, "r", steps=1)[3:], capsys)
    assert rc == 0, err
    weights = tmp_path / "r" / "policy" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    for argv in (["eval", "--model", str(tmp_path / "r"), "--eval-samples", "2", "--eval-prompts", "2"],
                 train_cmd(str(tmp_path / "r"), tmp_path, "next", steps=1)[3:]):
        rc, _, err = cli(argv, capsys)
        line = last_line(err)
        assert rc == 2 and "config field 'model'" in line and "safetensors" in line, (argv[0], err[-1500:])


def test_launch_reads_yaml_as_train_does_and_a_bad_file_is_one_line(tmp_path, capsys):
    from brorl_lab.lab.verl_launch import load_config

    (tmp_path / "ok.yaml").write_text("lr: 1e-4\n")
    assert load_config(tmp_path / "ok.yaml").lr == 1e-4
    (tmp_path / "bad.yaml").write_text("lr: [1e-4\nsteps: 2\n")
    rc, _, err = cli(["launch", "--to", "verl", tmp_path / "bad.yaml", tmp_path / "out"], capsys)
    assert rc == 2 and "bad.yaml: line 2" in last_line(err)


# ---- sweeps and reports that compare ----------------------------------------------------------------------------------
def test_a_sweep_over_train_flags_and_its_report_pair_the_seeds(tiny_model, tmp_path, capsys):
    fixed = [x for k, v in TINY.items() if k not in ("threads", "rollouts_per_prompt", "eval_every")
             for x in ("-p", f"{k}={v!r}" if isinstance(v, (list, str)) else f"{k}={v}")]
    argv = [sys.executable, "-m", "brorl_lab", "sweep", "--grid", "rollouts_per_prompt=2,4", "--grid", "seed=0,1",
            "--steps", "1", "--out", str(tmp_path / "sw"), "--parallel", "1", "--threads", "1", "--quiet",
            "-p", f"model={tiny_model}", "-p", "eval_every=1", *fixed]
    rc, first, err = cli(argv[3:], capsys)  # in this process: the sweep runs its points here (--parallel 1)
    assert rc == 0, err[-2000:]
    index = pd.read_parquet(tmp_path / "sw" / "index.parquet")
    assert sorted(index["run"]) == ["rollouts_per_prompt2_seed0", "rollouts_per_prompt2_seed1",
                                    "rollouts_per_prompt4_seed0", "rollouts_per_prompt4_seed1"]
    assert (index["status"] == "finished").all()
    assert "paired by seed" in first and "rollouts_per_prompt=4" in first
    rc, out, _ = cli(["report", tmp_path / "sw"], capsys)
    assert rc == 0 and "seeds" in out and "(n=2, t=12.71" in out, out
    before = (tmp_path / "sw" / "rollouts_per_prompt2_seed0" / "checkpoint" / "state.pt").stat().st_mtime_ns
    rc, out, err = cli(argv[3:], capsys)  # resumable: every point finished, read back, not trained again
    assert rc == 0 and "paired by seed" in out, err
    assert (tmp_path / "sw" / "rollouts_per_prompt2_seed0" / "checkpoint" / "state.pt").stat().st_mtime_ns == before


def test_the_declared_names_are_exactly_the_registered_implementations():
    """A registry's names are known before torch loads (rl.names, rollout.engine_names); once the implementations
    are imported, every declared name has one and the package registers nothing else."""
    import brorl_lab.rl.algo  # noqa: F401 - registers the estimators, losses and KL estimators
    import brorl_lab.rl.trackers  # noqa: F401
    import brorl_lab.rollout.engines  # noqa: F401
    from brorl_lab.rl import names
    from brorl_lab.rollout.engine_names import ENGINES

    for reg in (names.ADVANTAGES, names.POLICY_LOSSES, names.KL_ESTIMATORS, names.LOSS_AGGREGATIONS, names.TRACKERS,
                ENGINES):
        assert reg.declared and set(reg.declared) == set(reg._items), reg.kind
    names.POLICY_LOSSES.register("my_loss", lambda *a, **kw: None)  # a notebook's own: joins the names
    try:
        assert names.POLICY_LOSSES.names() == ["ppo_clip", "pg", "my_loss"]
    finally:
        del names.POLICY_LOSSES._items["my_loss"]


@pytest.mark.parametrize("argv, eval_k", [(["--eval-samples", "2"], [1]), (["--eval-samples", "8"], [1, 4]),
                                          (["--eval-samples", "8", "--eval-k", "2"], [2])])
def test_eval_k_is_cut_to_eval_samples_unless_given(argv, eval_k):
    from brorl_lab.cli import build_parser, config_from_args

    assert config_from_args(build_parser().parse_args(["train", *argv])).eval_k == eval_k


def test_overwrite_says_what_it_removed_naming_the_users_own_files(tiny_model, tmp_path, capsys):
    run_dir = tmp_path / "r"
    (run_dir / "checkpoint").mkdir(parents=True)
    (run_dir / "checkpoint" / "state.pt").write_bytes(b"old")
    (run_dir / "notes.txt").write_text("mine")
    rc, _, err = cli(train_cmd(tiny_model, tmp_path, "r", steps=1)[3:] + ["--overwrite"], capsys)
    assert rc == 0, err
    line = next(ln for ln in err.splitlines() if "--overwrite removed" in ln)
    assert "checkpoint" in line and "notes.txt" in line and "not written by a run: notes.txt" in line, line
    assert not (run_dir / "notes.txt").exists()


def test_a_notebook_is_named_with_or_without_ipynb():
    from brorl_lab.cli import _notebook_path
    from brorl_lab.core.config import ConfigError
    from brorl_lab.core.paths import NOTEBOOK_DIR

    assert _notebook_path("00_quickstart") == _notebook_path("00_quickstart.ipynb") == \
        NOTEBOOK_DIR / "00_quickstart.ipynb"
    with pytest.raises(ConfigError, match="NOTEBOOK: '00_quickstar' .*00_quickstart"):
        _notebook_path("00_quickstar")


@pytest.mark.parametrize("argv, eval_k", [(["--eval-samples", "8"], [1, 8]), (["--eval-samples", "4"], [1]),
                                          (["--eval-samples", "8", "--eval-k", "1", "2"], [1, 2])])
def test_scaling_eval_samples_alone_trims_eval_k_and_eval_k_is_a_flag(argv, eval_k, tmp_path, monkeypatch):
    """Issue 46: `scaling --eval-samples 8` died after 18 s on the floor's eval_k [1, 8, 64]; it now trims eval_k to
    what the samples allow (as train and eval do), and --eval-k sets it. The settings reach the runner, whose Config
    accepts them (the floor's run itself is not started here: its own tests run it)."""
    from brorl_lab import cli
    from brorl_lab.study import runner
    from brorl_lab.study.recipe import recipe_config

    seen = {}

    class Stop(Exception):
        pass

    def capture(out, *, settings, **kw):
        seen.update(settings)
        raise Stop

    monkeypatch.setattr(runner, "run_floor", capture)
    with pytest.raises(Stop):
        cli.main(["scaling", "--out", str(tmp_path / "floor"), *argv])
    assert seen["eval_k"] == eval_k
    cfg = recipe_config(eval_samples=seen["eval_samples"], eval_k=seen["eval_k"])  # a Config the floor can build
    assert cfg.eval_k == eval_k
