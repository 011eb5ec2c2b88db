"""What a new user meets in the first hour: lr schedules by TRL's names, kept checkpoints, files readable under the
user's umask, a train.log in every run, a loud warning for a run that trained on nothing, honest step counts in the
report, and sweep directories named by what was swept."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from helpers_notebooks import write_notebook
from helpers_runs import tiny_config

from brorl_lab.core.config import Config
from brorl_lab.core.rundir import atomic_write_text
from brorl_lab.lab import report, tracking
from brorl_lab.lab.sweep import run_id
from brorl_lab.rl.trainer import Trainer

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("kind, expected", [
    ("constant", [0.5, 1.0, 1.0, 1.0, 1.0]),
    ("linear", [0.5, 1.0, 1.0, 2 / 3, 1 / 3]),
    ("cosine", [0.5, 1.0, 1.0, 0.75, 0.25]),
])
def test_lr_schedules_follow_trl_after_the_warm_up(kind, expected):
    cfg = Config(lr=1e-3, steps=5, lr_warmup_steps=2, lr_scheduler_type=kind)
    assert [cfg.lr_at(s) / 1e-3 for s in range(1, 6)] == pytest.approx(expected)


def test_an_unknown_lr_schedule_names_the_field():
    with pytest.raises(ValueError, match="lr_scheduler_type.*allowed: constant, linear, cosine"):
        Config(lr_scheduler_type="cosine_with_restarts")


def test_the_trainer_applies_the_schedule_and_keeps_the_last_and_the_best_checkpoints(tmp_path):
    cfg = tiny_config(tmp_path, "kept", steps=4, checkpoint_every=1, keep_checkpoints=1, lr_scheduler_type="linear",
                      dynamic_sampling=False)
    with Trainer(cfg, progress=False) as t:
        m = t.run()
    assert m.loc[m["step"] >= 1, "lr"].tolist() == pytest.approx([3e-3 * f for f in (1, 0.75, 0.5, 0.25)])
    kept = sorted(p.name for p in (t.run_dir.path / "checkpoints").glob("step_*"))
    evals = m[m["step"] >= 1].set_index("step")["eval/mean/pass@1"]
    best = int(max(evals.index, key=lambda s: (evals[s], s)))
    assert kept == sorted({"step_000004", f"step_{best:06d}"})
    assert all((t.run_dir.path / "checkpoints" / k / "config.json").is_file() for k in kept)


@pytest.mark.parametrize("mask, mode", [(0o022, 0o644), (0o077, 0o600)])
def test_outputs_are_as_readable_as_the_umask_says(tmp_path, mask, mode):
    old = os.umask(mask)
    try:
        path = atomic_write_text(tmp_path / "out.txt", "x")
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == mode


def test_a_runs_policy_and_its_export_are_as_readable_as_the_umask_says(tmp_path):
    """safetensors writes model.safetensors 0600 through its own temp file: policy/, kept checkpoints and exports
    (what others load) must still follow the umask."""
    from brorl_lab.rl.trainer import export_policy

    old = os.umask(0o022)
    try:
        cfg = tiny_config(tmp_path, "shared", steps=1, checkpoint_every=1, keep_checkpoints=1, dynamic_sampling=False)
        with Trainer(cfg, progress=False) as t:
            t.run()
        out = export_policy(t.run_dir.path, tmp_path / "exported")
    finally:
        os.umask(old)
    dirs = [t.run_dir.path / "policy", t.run_dir.path / "checkpoints" / "step_000001", out]
    modes = {str(f.relative_to(tmp_path)): oct(stat.S_IMODE(f.stat().st_mode)) for d in dirs for f in d.rglob("*")}
    assert "model.safetensors" in " ".join(modes) and set(modes.values()) == {"0o644"}, modes
    assert {oct(stat.S_IMODE(d.stat().st_mode)) for d in dirs} == {"0o755"}


def test_a_run_that_trained_on_nothing_says_so_and_logs_every_step(tmp_path):
    # one prompt whose 2 samples all agree under greedy-ish sampling is not guaranteed; a zero-reward-variance run
    # is: top_p tiny makes every group's samples identical, so dynamic sampling keeps no group.
    cfg = tiny_config(tmp_path, "idle", steps=2, top_p=1e-6, max_resample_rounds=0)
    with Trainer(cfg, progress=False) as t, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        t.run()
    assert any("trained on nothing" in str(w.message) for w in caught)
    log = (t.run_dir.path / "train.log").read_text()
    assert "step 1/2" in log and "step 2/2" in log and "trained on nothing" in log and "finished at step 2" in log
    row = tracking.run_summary(t.run_dir.path, "idle")
    assert row["steps_done"] == 2 and row["steps_trained"] == 0
    page = report.report_html([t.run_dir.path])
    assert "trained on nothing" in page


def test_sweep_directories_lead_with_the_swept_parameter():
    base = {f"long_parameter_name_{i}": 1000 + i for i in range(6)}
    a, b = (run_id({**base, "seed": s}, first=["seed"]) for s in (0, 1))
    assert a.startswith("seed=0_") and b.startswith("seed=1_")
    assert run_id({**base, "seed": 0})[:80] == run_id({**base, "seed": 1})[:80]  # why: sorted, seed was cut off


def test_a_bar_where_it_renders_plain_lines_in_a_batch_job(tmp_path):
    """A kernel's stderr is no tty, yet tqdm.auto draws a widget there: the trainer's bar must not be dropped in a
    notebook (a bare isatty() test did), while a batch job (stderr a pipe or file) gets plain lines."""
    import papermill as pm

    code = "import sys\nfrom brorl_lab.core.console import live_bars\nprint(live_bars(), sys.stderr.isatty())"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    batch = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert batch.stdout.split() == ["False", "False"]
    nb = write_notebook(tmp_path / "bars.ipynb", "x = 1", code)
    out = pm.execute_notebook(str(nb), str(tmp_path / "out.ipynb"), kernel_name="python3", progress_bar=False,
                              cwd=str(REPO))
    assert out.cells[-1].outputs[0]["text"].split() == ["True", "False"]


def test_papermill_commands_stream_what_cells_print_and_a_batch_log_gets_no_carriage_returns(tmp_path):
    """`sweep` in a batch job (stderr a file): each run's cell output reaches the console as lines prefixed with
    the run (its kernels print plain progress lines: live_bars() is False there), the sweep's own progress is
    plain lines, and nothing holds a carriage return."""
    nb = write_notebook(tmp_path / "slow.ipynb", "steps = 2\nrun_dir = ''\ntorch_threads = 1",
                        "import sys, time\nfrom brorl_lab.core.console import live_bars\n"
                        "print('live bars', live_bars(), flush=True)\n"
                        "for i in range(steps):\n"
                        "    print(f'cell step {i + 1}/{steps}', file=sys.stderr, flush=True)\n"
                        "    time.sleep(0.3)")
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    err = tmp_path / "batch.log"
    with open(err, "w") as f:
        done = subprocess.run([sys.executable, "-m", "brorl_lab", "sweep", str(nb), "-g", "steps=2,3", "--out",
                               str(tmp_path / "sw"), "--threads", "1"], stderr=f, stdout=subprocess.PIPE, text=True,
                              env=env, timeout=600)
    log = err.read_text()
    assert done.returncode == 0, log[-2000:]
    assert "\r" not in log
    runs = sorted(d.name for d in (tmp_path / "sw").iterdir() if d.is_dir())
    assert len(runs) == 2
    for name, steps in zip(runs, (2, 3)):
        assert f"[{name[:24]}] live bars False" in log
        assert f"[{name[:24]}] cell step {steps}/{steps}" in log
    assert "sweep sw: 2/2 runs done" in log


def test_a_papermill_command_run_in_process_leaves_the_plain_progress_flag_as_it_was(tmp_path, monkeypatch):
    """`demo`/`sweep` set BRORL_PLAIN_PROGRESS for the kernels they start; main() called in-process (a test, a
    notebook) must put it back, or every later kernel of that process prints plain lines instead of its widget bar
    (the full suite's demo test made the bar test above fail)."""
    from brorl_lab import cli
    from brorl_lab.core.console import PLAIN_PROGRESS_ENV
    from brorl_lab.lab import sweep

    monkeypatch.delenv(PLAIN_PROGRESS_ENV, raising=False)
    seen = {}

    def fake_run(nb, out, params, *, progress, stream):  # records what the kernels would see; runs nothing
        seen["flag"] = os.environ.get(PLAIN_PROGRESS_ENV)
        return {"status": "finished"}

    monkeypatch.setattr(sweep, "run_notebook", fake_run)
    cli.main(["demo", "--out", str(tmp_path / "demo")])
    assert seen["flag"] == "1"  # the kernels got plain lines
    assert PLAIN_PROGRESS_ENV not in os.environ  # and the process is as it was
