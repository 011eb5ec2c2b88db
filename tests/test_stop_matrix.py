"""No dead ends (issue 46): every way to stop a run x every phase it can be stopped in. For each cell, the line the
command printed, ``train --resume`` and the same command again agree, and the one the line names continues the run
(or starts it again) without ``--overwrite``.

Ways: Ctrl-C (SIGINT) once, Ctrl-C twice, SIGTERM, ``kill -9`` (what the out-of-memory killer sends), a full disk.
Phases of a 5-step run that checkpoints every 2 steps: before the first step (the model loaded, nothing run),
before the first checkpoint (step 1 trained, step 2 in flight), mid-run (step 3 in flight, the checkpoint of step 2
on disk), the last step (step 5 in flight, the checkpoint of step 4 on disk).

Real processes, real signals, a real file-size limit: the stopped command is a real ``python -m brorl_lab train``
process, forked from one preloaded interpreter (so each cell costs a fork, not 10-20 s of imports), held at the
phase by the trainer's own hook (``BRORL_PAUSE_AT``, :func:`brorl_lab.rl.trainer._pause_at`) until the test has
signalled it, killed it or cut its file-size limit (``prlimit``: the kernel then refuses the next large write with
EFBIG, as a full disk refuses it with ENOSPC). What follows runs in this process (torch already loaded)."""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers_models import save_tiny

from brorl_lab.core.rundir import RunDir
from brorl_lab.rl.trainer import CHECKPOINT_FILE, PAUSE_ENV, PAUSE_FILE_ENV

ROOT = Path(__file__).resolve().parent.parent
STEPS, EVERY = 5, 2  # checkpoints at steps 2 and 4, and at the end
TINY = dict(template="plain", rollouts_per_prompt=4, prompts_per_step=2, max_new_tokens=4, eval_prompts=4,
            eval_samples=4, eval_k=[1], eval_every=0, checkpoint_every=EVERY, threads=1, dynamic_sampling=False,
            lr=1e-2, steps=STEPS)
PHASES = {"before the first step": "start", "before the first checkpoint": "step 2", "mid-run": "step 3",
          "the last step": f"step {STEPS}"}
WAYS = ("Ctrl-C", "Ctrl-C twice", "SIGTERM", "kill -9", "disk full")
FULL_DISK = 200_000  # bytes a file may grow to: config, status, metrics fit; the tiny policy's weights do not
SMALL_FILE = 8_000  # ... and before the first step: the status and the console's lines fit, the metrics do not
RESTART, RESUME, FINISHED = "run the same command again", "--resume", "the run finished"
# (way, phase) -> (exit status, what the stop leaves: RESTART / RESUME / FINISHED, the step --resume continues from)
EXPECTED = {
    ("Ctrl-C", "before the first step"): (130, RESTART, None),
    ("Ctrl-C twice", "before the first step"): (130, RESTART, None),
    ("SIGTERM", "before the first step"): (143, RESTART, None),
    ("kill -9", "before the first step"): (-9, RESTART, None),
    ("disk full", "before the first step"): (2, RESTART, None),  # the first metrics row cannot be written
    ("Ctrl-C", "before the first checkpoint"): (130, RESUME, 2),  # step 2 finishes and checkpoints
    ("Ctrl-C twice", "before the first checkpoint"): (130, RESTART, None),
    ("SIGTERM", "before the first checkpoint"): (143, RESUME, 2),
    ("kill -9", "before the first checkpoint"): (-9, RESTART, None),
    ("disk full", "before the first checkpoint"): (2, RESTART, None),  # the first checkpoint fails
    ("Ctrl-C", "mid-run"): (130, RESUME, 3),
    ("Ctrl-C twice", "mid-run"): (130, RESUME, 2),
    ("SIGTERM", "mid-run"): (143, RESUME, 3),
    ("kill -9", "mid-run"): (-9, RESUME, 2),
    ("disk full", "mid-run"): (2, RESUME, 2),  # step 4's checkpoint fails; step 2's stays
    ("Ctrl-C", "the last step"): (0, FINISHED, None),
    ("Ctrl-C twice", "the last step"): (130, RESUME, 4),
    ("SIGTERM", "the last step"): (0, FINISHED, None),
    ("kill -9", "the last step"): (-9, RESUME, 4),
    ("disk full", "the last step"): (2, RESUME, 4),  # the final checkpoint fails; step 4's stays
}

# The preloaded interpreter: a job is a line of JSON (argv, env, stderr file); it forks a child that runs
# `python -m brorl_lab <argv>` as that process would (stdout to /dev/null, stderr to the file, exit status as the
# command's) and prints its pid; the next line it reads asks it to reap the child, and it prints the exit status
# (-N: killed by signal N). Until then the child, even once exited, keeps its pid: a signal never hits another.
FORKER = """
import json, os, signal, sys, traceback
os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"  # as cli.quiet_third_party sets it before transformers loads
import torch, transformers, reasoning_gym  # noqa: F401  (what `python -m brorl_lab train` imports)
from brorl_lab import cli
import brorl_lab.rl.trainer, brorl_lab.rollout.engines.torch_engine  # noqa: F401
print("ready", flush=True)
for line in sys.stdin:
    job = json.loads(line)
    pid = os.fork()
    if pid == 0:
        os.environ.update(job["env"])
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a file-size limit refuses the write (EFBIG), as a full disk
        os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
        os.dup2(os.open(job["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC), 2)
        try:
            rc = cli.main(job["argv"])
        except SystemExit as e:
            rc = e.code
        except BaseException:
            traceback.print_exc()
            rc = 1
        sys.stderr.flush()
        os._exit(rc or 0)
    print(pid, flush=True)
    sys.stdin.readline()
    print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), flush=True)
"""


def env() -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> str:
    return str(save_tiny(tmp_path_factory.mktemp("model") / "tiny"))


@pytest.fixture(scope="module")
def forker():
    p = subprocess.Popen([sys.executable, "-c", FORKER], env=env(), text=True, stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert p.stdout.readline().strip() == "ready"
    yield p
    p.stdin.close()
    p.wait(timeout=60)


def train_argv(model: str, root: Path) -> list[str]:
    out = ["train", "--quiet"]
    for k, v in {**TINY, "model": model, "run_dir": str(root), "run_name": "r"}.items():
        flag = "--" + k.replace("_", "-")
        out += [flag, *map(str, v)] if isinstance(v, list) else (
            [flag if v else f"--no-{k.replace('_', '-')}"] if isinstance(v, bool) else [flag, str(v)])
    return out


def cli(argv: list, capsys) -> tuple[int, str]:
    """``python -m brorl_lab argv`` in this process: (exit status, stderr)."""
    from brorl_lab.cli import main

    capsys.readouterr()
    try:
        rc = main([str(a) for a in argv])
    except SystemExit as e:
        rc = e.code
    return rc, capsys.readouterr().err


def last_line(err: str) -> str:
    assert "Traceback" not in err, err
    lines = [ln for ln in err.splitlines() if ln.strip() and not ln.startswith(("notice:", "note:"))]
    return lines[-1] if lines else ""


def exited(pid: int) -> bool:
    """The forked child has exited (a zombie until the forker reaps it: its pid stays ours)."""
    return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"


def handled(done, what: str, timeout: float = 120) -> None:
    t0 = time.monotonic()
    while not done():
        assert time.monotonic() - t0 < timeout, f"{what} was not handled in {timeout} s"
        time.sleep(0.01)


def stop(forker, argv: list[str], phase: str, way: str, tmp: Path) -> tuple[int, str]:
    """Run `train argv` in a forked child, hold it at ``phase``, stop it ``way``: (exit status, stderr)."""
    hold, err = tmp / "hold", tmp / "stderr.txt"
    forker.stdin.write(json.dumps({"argv": argv, "stderr": str(err),
                                   "env": {PAUSE_ENV: phase, PAUSE_FILE_ENV: str(hold)}}) + "\n")
    forker.stdin.flush()
    pid = int(forker.stdout.readline())
    try:
        t0 = time.monotonic()
        while not hold.exists():  # the child reached the phase (or failed before it: it never writes the file)
            assert not exited(pid) and time.monotonic() - t0 < 240, f"never reached {phase}: {err.read_text()}"
            time.sleep(0.02)
        if way == "disk full":  # no file may grow past FULL_DISK bytes (before the first step: SMALL_FILE)
            limit = SMALL_FILE if phase == "start" else FULL_DISK
            resource.prlimit(pid, resource.RLIMIT_FSIZE, (limit, limit))
        elif way == "kill -9":
            os.kill(pid, signal.SIGKILL)
            handled(lambda: exited(pid), "the kill")
        else:  # each signal handled while the run is held at the phase (a loaded machine may take its time)
            sig = signal.SIGTERM if way == "SIGTERM" else signal.SIGINT
            os.kill(pid, sig)
            if phase == "start":  # before the loop a signal stops the command at once; a second lands as it stops
                if way == "Ctrl-C twice":
                    os.kill(pid, sig)
                handled(lambda: exited(pid), "the signal")
            else:  # in a step: the first one asks the loop to stop after it (the hold says it saw that)
                handled(Path(f"{hold}.stopping").exists, "the first signal")
                if way == "Ctrl-C twice":  # the second stops at once
                    os.kill(pid, sig)
                    handled(lambda: exited(pid), "the second signal")
    except BaseException:
        os.kill(pid, signal.SIGKILL)
        raise
    finally:
        hold.unlink(missing_ok=True)
        forker.stdin.write("reap\n")
        forker.stdin.flush()
        status = int(forker.stdout.readline())
    return status, err.read_text()


def checkpoint_step(run: Path):
    f = run / "checkpoint" / CHECKPOINT_FILE
    return torch.load(f, weights_only=False)["step"] if f.is_file() else None


def finished_all_steps(run: Path) -> None:
    status = RunDir(run).read_status()
    assert status["status"] == "finished" and status["step"] == STEPS, status
    steps = list(RunDir(run).read_metrics()["step"])
    assert steps == list(range(1, STEPS + 1)), steps  # every step once: nothing lost, nothing trained twice


@pytest.mark.parametrize("phase", list(PHASES))
@pytest.mark.parametrize("way", WAYS)
def test_every_way_to_stop_at_every_phase_leaves_a_run_the_printed_line_continues(way, phase, forker, tiny_model,
                                                                                 tmp_path, capsys):
    rc, leaves, ckpt = EXPECTED[way, phase]
    argv, run = train_argv(tiny_model, tmp_path), tmp_path / "r"
    got, err = stop(forker, argv, PHASES[phase], way, tmp_path)
    line = last_line(err)
    assert got == rc, err
    if way == "kill -9":  # no handler runs: no line
        assert "python -m brorl_lab train:" not in err and "resume with" not in err, err
    else:
        assert leaves in line, line
    assert checkpoint_step(run) == (STEPS if leaves == FINISHED else ckpt)

    if leaves == RESTART:  # nothing to continue from: the same command and --resume both start it again
        copy = tmp_path / "copy"
        shutil.copytree(run, copy / "r")
        again, err = cli(train_argv(tiny_model, copy), capsys)
        assert again == 0 and "cleared what an attempt stopped before its first checkpoint left" in err, err
        finished_all_steps(copy / "r")
        again, err = cli(["train", "--quiet", "--resume", run], capsys)
        assert again == 0 and "starting it again from its config.yaml" in err, err
    elif leaves == RESUME:  # a checkpoint: the same command is refused naming --resume, which continues the run
        before = (run / "status.json").read_bytes()
        again, err = cli(argv, capsys)
        assert again == 2 and "--resume" in last_line(err), err
        assert (run / "status.json").read_bytes() == before, "the refused command changed nothing"
        again, err = cli(["train", "--quiet", "--resume", run], capsys)
        assert again == 0, err
    else:  # finished: the same command says so (extend with --resume --steps); --resume has nothing left to do
        again, err = cli(argv, capsys)
        assert again == 2 and "finished" in last_line(err) and "--resume" in last_line(err), err
        again, err = cli(["train", "--quiet", "--resume", run], capsys)
        assert again == 0, err
    finished_all_steps(run)
    assert not [f.name for f in run.rglob(".*") if f.name.endswith((".tmp", ".old"))], "temp files left behind"
