"""Crashes and faults: SIGKILL at random points (and mid-checkpoint-write), NaN/inf in loss, gradients and rewards,
sweeps whose runs fail or whose kernel dies, and engines that are closed.

Faults are injected, never faked: the training runs are real (a tiny random Qwen2 saved as a local HF directory),
the NaN comes from a test-only loss registered in ``algo.POLICY_LOSSES`` and a test-only task family registered in
``tasks.TASKS`` (both removed again), kills are real SIGKILLs of real ``python -m brorl_lab train`` processes.
"""

from __future__ import annotations

import copy
import json
import math
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import torch
from helpers_models import save_tiny
from helpers_notebooks import write_notebook
from helpers_runs import TIMING

from brorl_lab.core.config import Config
from brorl_lab.lab import sweep
from brorl_lab.lab.tracking import RunDir
from brorl_lab.rl import algo
from brorl_lab.rl.trainer import CHECKPOINT_FILE, Trainer
from brorl_lab.rollout.tasks import TASKS
from brorl_lab.rollout.tasks.base import RewardResult
from brorl_lab.rollout.tasks.gym import GYM_FAMILIES, GymFamily

ROOT = Path(__file__).resolve().parent.parent
# Columns that measure time differ between two runs of the same computation; everything else must match exactly.
# A tiny run whose every step changes the weights (entropy bonus and KL give gradients even when the random model
# earns no reward), so resuming from the wrong state would show in the metrics.
TINY = dict(tasks=["chain_sum"], template="plain", rollouts_per_prompt=4, prompts_per_step=2, max_new_tokens=4,
            eval_prompts=4, eval_samples=4, eval_k=[1], eval_every=5, checkpoint_every=1, torch_threads=1,
            dynamic_sampling=False, entropy_coef=0.05, kl_beta=0.01, lr=1e-2, max_resample_rounds=0)
STEPS = 24  # the random kills below land at different steps, all before the end


def cli_args(cfg: dict) -> list[str]:
    out = []
    for k, v in cfg.items():
        flag = "--" + k.replace("_", "-")
        if isinstance(v, bool):
            out.append(flag if v else "--no-" + k.replace("_", "-"))
        elif isinstance(v, list):
            out += [flag, *map(str, v)]
        else:
            out += [flag, str(v)]
    return out


def comparable(df: pd.DataFrame) -> pd.DataFrame:
    return df[[c for c in df.columns if not c.startswith(TIMING)]].reset_index(drop=True)


def env() -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> str:
    return str(save_tiny(tmp_path_factory.mktemp("model") / "tiny"))


@pytest.fixture(autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def load_checkpoint(run: Path) -> dict:
    """The checkpoint a resume would read. It must always load: atomic writes never leave a torn one in place."""
    return torch.load(run / "checkpoint" / CHECKPOINT_FILE, weights_only=False)


# ---- SIGKILL at random points, resume, compare with an uninterrupted run -----------------------------------------
# A preloaded interpreter that forks `cli.main(["train", "--resume", RUN])` children on request, so each kill costs a
# fork instead of a fresh interpreter start (10-30 s of imports on these shared cores). A child asked to tear its
# checkpoint writes half of its 2nd checkpoint inside atomic_write, leaves a marker and hangs until it is killed.
FORKER = """
import io, json, os, sys, time
import torch, transformers, reasoning_gym  # noqa: F401  (what `python -m brorl_lab train` imports)
from brorl_lab import cli  # noqa: F401
from brorl_lab.rl import trainer
import brorl_lab.rollout.engines.torch_engine  # noqa: F401
print("ready", flush=True)
for line in sys.stdin:
    job = json.loads(line)
    pid = os.fork()
    if pid == 0:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 1)
        os.dup2(null, 2)
        if job["tear_at"]:
            real_save, calls = torch.save, []

            def torn_save(obj, f, *a, **kw):
                calls.append(1)
                if len(calls) < job["tear_at"]:
                    return real_save(obj, f, *a, **kw)
                buf = io.BytesIO()
                real_save(obj, buf, *a, **kw)
                data = buf.getvalue()
                f.write(data[: len(data) // 2])
                f.flush()
                open(job["marker"], "w").write(str(len(data)))
                time.sleep(600)

            torch.save = torn_save
        try:
            rc = cli.main(job["argv"])
        except SystemExit as e:
            rc = e.code
        os._exit(rc or 0)
    print(pid, flush=True)
    print(os.waitpid(pid, 0)[1], flush=True)
"""


def wait_for(pred, timeout: float, proc=None, what: str = "") -> None:
    t0 = time.monotonic()
    while not pred():
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"process exited ({proc.returncode}) before {what}: {proc.stderr.read()[-2000:]}")
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def started_training(run: Path, since: float):
    status = run / "status.json"
    return lambda: status.exists() and status.stat().st_mtime > since and json.loads(status.read_text())[
        "status"] == "running"


def check_after_kill(run: Path) -> int:
    """The checkpoint a resume will read loads, is consistent, and the metrics file reads too. Returns its step."""
    state = load_checkpoint(run)
    assert len(state["rows"]) == state["step"] + 1  # row 0 + one row per completed step
    assert len(pd.read_parquet(run / "metrics.parquet")) >= len(state["rows"])  # never torn either
    return state["step"]


def test_sigkill_at_random_points_and_mid_write_then_resume_matches_an_uninterrupted_run(tiny_model, tmp_path):
    cfg = dict(TINY, model=tiny_model, steps=STEPS, run_dir=str(tmp_path))
    run = tmp_path / "killed"
    cmd = [sys.executable, "-m", "brorl_lab", "train", "--quiet"]
    rng = random.Random(int(os.environ.get("FAULT_SEED", "0")) or None)
    # Both interpreters start (import) while the uninterrupted reference runs in this process.
    first = subprocess.Popen(cmd + cli_args({**cfg, "run_name": "killed"}), env=env(), cwd=tmp_path,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    forker = subprocess.Popen([sys.executable, "-c", FORKER], env=env(), cwd=tmp_path, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        t0 = time.perf_counter()
        with Trainer(Config(**cfg, run_name="reference"), progress=False) as t:
            reference = t.run()
            reference_policy = {k: v.clone() for k, v in t.policy.state_dict().items()}
        # each random kill waits up to ~2 steps, so the five of them land at different steps but before the end
        max_wait = min(0.4, 2 * (time.perf_counter() - t0) / STEPS)
        assert len(reference) == STEPS + 1 and not reference["skipped"].iloc[1:].any()

        # 1. a real `python -m brorl_lab train`, killed at a random moment after its first checkpoint
        try:
            wait_for((run / "checkpoint" / CHECKPOINT_FILE).exists, 300, first, "the first checkpoint")
            time.sleep(rng.uniform(0.0, max_wait))
        finally:
            first.send_signal(signal.SIGKILL)
            first.wait()
            first.stderr.close()
        steps_seen = [check_after_kill(run)]

        # 2-5. resumed runs killed at random moments, and one killed inside atomic_write
        assert forker.stdout.readline().strip() == "ready", forker.stderr.read()[-2000:]
        for kill in ["random", "mid-write", "random", "random"]:
            marker = tmp_path / f"marker_{len(steps_seen)}"
            job = {"argv": ["train", "--quiet", "--resume", str(run)], "marker": str(marker),
                   "tear_at": 2 if kill == "mid-write" else 0}  # the 2nd checkpoint of that process
            since = time.time()
            forker.stdin.write(json.dumps(job) + "\n")
            forker.stdin.flush()
            pid = int(forker.stdout.readline())
            try:
                if kill == "mid-write":
                    # the injector creates the marker, then writes the size into it: wait for the size itself
                    wait_for(lambda: marker.exists() and marker.read_text().strip(), 120,
                             what="the torn checkpoint write")
                else:
                    wait_for(started_training(run, since), 120, what="the resumed run to start")
                    time.sleep(rng.uniform(0.0, max_wait))
            finally:
                os.kill(pid, signal.SIGKILL)
            status = int(forker.stdout.readline())
            assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, \
                f"the {kill} kill came after the resumed run had already ended (status {status})"
            steps_seen.append(check_after_kill(run))
            if kill == "mid-write":
                torn = list((run / "checkpoint").glob(f".{CHECKPOINT_FILE}.*.tmp"))
                size = int(marker.read_text())
                assert any(0 < p.stat().st_size < size for p in torn), \
                    "the kill landed inside atomic_write, so half a checkpoint is left in its temp file"
                assert steps_seen[-1] == steps_seen[-2] + 1, \
                    "the torn write was that process's 2nd checkpoint: its 1st one is what is on disk"
    finally:
        forker.kill()
        forker.wait()
        for f in (forker.stdin, forker.stdout, forker.stderr):
            f.close()
    assert steps_seen == sorted(steps_seen), f"checkpoints never go back: {steps_seen}"
    assert steps_seen[-1] < STEPS, f"every kill landed before the end: {steps_seen}"

    # 6. a real `python -m brorl_lab train --resume` to the end
    out = subprocess.run(cmd + ["--resume", str(run)], env=env(), cwd=tmp_path, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert [e["event"] for e in RunDir(run).read_events()].count("resumed") == 5
    resumed = pd.read_parquet(run / "metrics.parquet")
    uninterrupted = pd.read_parquet(tmp_path / "reference" / "metrics.parquet")
    pd.testing.assert_frame_equal(comparable(resumed), comparable(uninterrupted))
    final = load_checkpoint(run)
    assert final["step"] == STEPS
    for k, v in reference_policy.items():
        assert torch.equal(final["policy"][k], v), f"final weights differ from the uninterrupted run at {k}"
    assert RunDir(run).read_status()["status"] == "finished"


WRITER = """
import sys, os
from brorl_lab.lab.tracking import atomic_write
path, size = sys.argv[1], int(sys.argv[2])
v = 0
while True:
    v += 1
    block = (v % 251).to_bytes(1, "little") * size
    def write(f):
        f.write(v.to_bytes(8, "little"))
        for i in range(0, size, 1 << 16):
            f.write(block[i:i + (1 << 16)])
        f.write(b"END")
    atomic_write(path, write)
    print(v, flush=True)
"""


def test_atomic_write_under_sigkill_at_random_delays_leaves_the_old_or_the_new_file(tmp_path):
    """A writer rewrites an 8 MB file in 64 KB pieces in a loop; killed at random moments (mostly mid-write), the
    file is always one complete version, never a mix or a prefix."""
    path, size = tmp_path / "big.bin", 8 << 20
    rng = random.Random(1)
    versions = []
    for _ in range(4):
        proc = subprocess.Popen([sys.executable, "-c", WRITER, str(path), str(size)], env=env(),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            assert proc.stdout.readline().strip() == "1", proc.stderr.read()  # one complete version exists
            time.sleep(rng.uniform(0.0, 0.5))
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            proc.stdout.close()
            proc.stderr.close()
        data = path.read_bytes()
        assert len(data) == 8 + size + 3 and data.endswith(b"END")
        v = int.from_bytes(data[:8], "little")
        assert data[8:-3] == (v % 251).to_bytes(1, "little") * size, "a mix of two versions"
        versions.append(v)
    leftovers = list(tmp_path.glob(".big.bin.*.tmp"))
    assert all(p.stat().st_size <= 8 + size + 3 for p in leftovers)  # torn temp files are never at `path`


# ---- NaN / inf in loss, gradients and rewards ----------------------------------------------------------------------
class Fault:
    """What the injected loss does on its next calls: 'ok', 'nan_loss', 'inf_loss' or 'nan_grad'."""

    def __init__(self):
        self.plan: list[str] = []
        self.calls = 0

    def next(self) -> str:
        self.calls += 1
        return self.plan.pop(0) if self.plan else "ok"


class _NanGrad(torch.autograd.Function):
    """Identity forward, NaN backward: a finite loss whose gradient is not."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return g * float("nan")


@pytest.fixture
def faulty_loss():
    fault = Fault()

    def loss(logp, old_logp, advantages, mask, **kw):
        mode = fault.next()
        if mode == "nan_grad":
            logp = _NanGrad.apply(logp)
        value, metrics = algo.POLICY_LOSSES["ppo_clip"](logp, old_logp, advantages, mask, **kw)
        if mode in ("nan_loss", "inf_loss"):
            value = value + (math.nan if mode == "nan_loss" else math.inf)
        return value, metrics

    algo.POLICY_LOSSES.register("test_faulty", loss)
    try:
        yield fault
    finally:
        del algo.POLICY_LOSSES._items["test_faulty"]


def state_copy(t: Trainer) -> tuple[dict, dict]:
    return ({k: v.detach().clone() for k, v in t.policy.state_dict().items()}, copy.deepcopy(t.optimizer.state_dict()))


def assert_same_state(a, b) -> None:
    (pa, oa), (pb, ob) = a, b
    assert pa.keys() == pb.keys() and all(torch.equal(pa[k], pb[k]) for k in pa), "weights changed"
    assert oa["param_groups"] == ob["param_groups"]
    assert oa["state"].keys() == ob["state"].keys(), "optimizer state gained or lost entries"
    for i in oa["state"]:
        for k, v in oa["state"][i].items():
            assert torch.equal(v, ob["state"][i][k]), f"optimizer state {i}/{k} changed"


def skipped_events(t: Trainer) -> list[dict]:
    return [e for e in t.run_dir.read_events() if e["event"] == "skipped_step"]


def test_nan_and_inf_loss_and_nan_grads_skip_the_step_leave_state_alone_and_stop_after_max_bad_steps(
        faulty_loss, tiny_model, tmp_path):
    cfg = Config(**dict(TINY, eval_every=0, steps=20, max_bad_steps=3), model=tiny_model, policy_loss="test_faulty",
                 run_dir=str(tmp_path), run_name="nan")
    with Trainer(cfg, progress=False) as t:
        before = state_copy(t)
        row = t.step()  # a good step moves the weights (so "unchanged" below is not vacuous)
        assert not row["skipped"]
        with pytest.raises(AssertionError, match="weights changed"):
            assert_same_state(before, state_copy(t))
        for n, mode in enumerate(["nan_loss", "nan_grad", "ok", "inf_loss", "nan_grad"]):
            faulty_loss.plan = [mode]
            before = state_copy(t)
            row = t.step()
            if mode == "ok":
                assert not row["skipped"] and t.bad_steps == 0, "a good step resets the bad-step count"
                continue
            assert row["skipped"], mode
            assert_same_state(before, state_copy(t))
            ev = skipped_events(t)[-1]
            assert ev["step"] == row["step"] and ev["reason"].startswith("non-finite update"), ev
            assert ("gradient" in ev["reason"]) == (mode == "nan_grad"), ev
            path = t.save_checkpoint()  # checkpoints written after a skip hold the untouched state
            saved = torch.load(path, weights_only=False)
            assert all(torch.equal(saved["policy"][k], v) for k, v in before[0].items())
        assert t.bad_steps == 2
        last_good = state_copy(t)
        faulty_loss.plan = ["nan_loss"] * 10
        with pytest.raises(RuntimeError, match=r"3 consecutive non-finite steps \(max_bad_steps=3\)"):
            t.run()
        assert_same_state(last_good, state_copy(t))
        assert t.step_idx == 7  # 1 + 5 above, then one more bad step reaches 3 in a row
    saved = load_checkpoint(tmp_path / "nan")
    assert saved["step"] == 7 and saved["bad_steps"] == 3
    assert all(torch.equal(saved["policy"][k], v) for k, v in last_good[0].items())
    status = RunDir(tmp_path / "nan").read_status()
    assert status["status"] == "failed" and "max_bad_steps=3" in status["error"]
    assert [e["step"] for e in skipped_events(t)] == [2, 3, 5, 6, 7]


def test_a_nan_in_the_second_mini_batch_keeps_the_first_and_the_engine_follows(faulty_loss, tiny_model, tmp_path):
    """The update stops before the NaN mini-batch's optimizer step (no copy is kept to undo mini-batch 1, which was
    a finite step on its own groups): the step is a skipped, bad step, mini-batch 1 stands, and the engine is synced
    to the weights it left (steps.update's test checks those weights and AdamW's state exactly)."""
    cfg = Config(**dict(TINY, eval_every=0, optimizer_steps_per_step=2), model=tiny_model,
                 policy_loss="test_faulty", run_dir=str(tmp_path), run_name="partial")
    with Trainer(cfg, progress=False) as t:
        t.step()  # AdamW now has moments
        before = state_copy(t)
        faulty_loss.plan = ["ok", "nan_loss"]  # mini-batch 1 steps the optimizer, mini-batch 2 is NaN
        calls = faulty_loss.calls
        row = t.step()
        assert faulty_loss.calls - calls == 2 and row["skipped"] and t.bad_steps == 1
        with pytest.raises(AssertionError, match="weights changed"):
            assert_same_state(before, state_copy(t))
        assert all(int(s["step"]) == 3 for s in t.optimizer.state_dict()["state"].values())  # 2 + 1 steps, not 2 + 2
        ev = skipped_events(t)[-1]
        assert ev["optimizer_steps"] == 1 and ev["reason"].startswith("non-finite update: loss is nan"), ev
        assert all(torch.equal(a, b) for a, b in zip(t.engine.model.state_dict().values(),
                                                     t.policy.state_dict().values())), "engine not synced"


class NonFiniteRewards(GymFamily):
    """chain_sum whose verifier returns NaN or inf rewards on demand (a broken verifier, injected)."""

    def __init__(self):
        super().__init__("test_nan_reward", *GYM_FAMILIES["chain_sum"][:2], "chain_sum with injected NaN rewards")
        self.bad_now = None

    def score(self, response, item, template="plain"):
        r = super().score(response, item, template)
        return RewardResult(self.bad_now, r.correct, r.extracted, "injected") if self.bad_now is not None else r


@pytest.fixture
def nan_family():
    family = NonFiniteRewards()
    TASKS.register(family.name, family)
    try:
        yield family
    finally:
        del TASKS._items[family.name]


def test_non_finite_rewards_skip_the_step_and_stop_the_run(nan_family, tiny_model, tmp_path):
    cfg = Config(**dict(TINY, tasks=[nan_family.name], eval_every=0, steps=10, max_bad_steps=2),
                 model=tiny_model, run_dir=str(tmp_path), run_name="rewards")
    with Trainer(cfg, progress=False) as t:
        assert not t.step()["skipped"]
        for bad in (math.nan, math.inf):
            nan_family.bad_now = bad
            before = state_copy(t)
            row = t.step()
            assert row["skipped"] and skipped_events(t)[-1]["reason"] == "non-finite rewards"
            assert_same_state(before, state_copy(t))
            if bad is math.nan:
                nan_family.bad_now = None
                assert not t.step()["skipped"] and t.bad_steps == 0
        nan_family.bad_now = -math.inf
        with pytest.raises(RuntimeError, match="max_bad_steps=2"):
            t.run()
    saved = load_checkpoint(tmp_path / "rewards")
    assert saved["bad_steps"] == 2 and saved["step"] == 5


# ---- sweeps whose runs fail ------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def failing_notebook(tmp_path_factory) -> Path:
    return write_notebook(tmp_path_factory.mktemp("nb") / "faulty.ipynb", 'mode = "ok"\nx = 1\nrun_dir = ""',
                          "import os, pathlib\n"
                          "d = pathlib.Path(run_dir)\n"
                          "with open(d / 'executions.txt', 'a') as f:\n"
                          "    f.write('1\\n')\n"
                          "if mode not in ('ok', 'raise', 'kill'):\n"
                          "    raise ValueError(f'mode: got {mode!r}; allowed: ok, raise, kill')\n"
                          "if mode == 'raise':\n"
                          "    raise RuntimeError(f'cell failed on purpose (x={x})')\n"
                          "if mode == 'kill':\n"
                          "    os.kill(os.getpid(), 9)\n"
                          "(d / 'result.txt').write_text(str(2 * x))\n")


def test_a_sweep_records_each_failure_completes_the_rest_and_a_rerun_skips_finished_runs(failing_notebook,
                                                                                        tmp_path):
    out = tmp_path / "sweep"
    grid = [{"mode": "raise", "x": 1}, {"mode": "kill", "x": 2}, {"mode": "bogus", "x": 3}, {"mode": "ok", "x": 4}]
    df = sweep.run_sweep(failing_notebook, grid, out=out, progress=False)
    index = pd.read_parquet(out / "index.parquet")
    pd.testing.assert_frame_equal(index, df)
    by_mode = {row["param.x"]: row for _, row in index.iterrows()}
    assert [by_mode[x]["status"] for x in (1, 2, 3, 4)] == ["failed"] * 3 + ["finished"]
    assert "cell failed on purpose (x=1)" in by_mode[1]["error"]
    assert "DeadKernelError" in by_mode[2]["error"] or "died" in by_mode[2]["error"].lower()
    assert "mode: got 'bogus'" in by_mode[3]["error"]
    assert (out / by_mode[4]["run"] / "result.txt").read_text() == "8"
    for x in (1, 2, 3):
        st = RunDir(out / by_mode[x]["run"]).read_status()
        assert st["status"] == "failed" and st["error"] == by_mode[x]["error"] and st["parameters"]["x"] == x
        assert (out / by_mode[x]["run"] / "faulty.ipynb").exists(), "the executed notebook shows where it failed"

    finished_status = (out / by_mode[4]["run"] / "status.json").read_bytes()
    df2 = sweep.run_sweep(failing_notebook, grid, out=out, progress=False)
    runs = {x: out / by_mode[x]["run"] for x in by_mode}
    executions = {x: len((runs[x] / "executions.txt").read_text().splitlines()) for x in runs}
    assert executions == {1: 2, 2: 2, 3: 2, 4: 1}, "finished runs are skipped, failed ones run again"
    assert (runs[4] / "status.json").read_bytes() == finished_status
    assert list(df2["status"]) == list(df["status"]) and len(pd.read_parquet(out / "index.parquet")) == 4


# ---- engines that are closed -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["torch", "hf"])
def test_engine_close_is_idempotent_use_after_close_is_one_clear_error_and_it_can_be_recreated(name, tiny_model):
    from brorl_lab.core.models import load_policy
    from brorl_lab.rollout.engines import RolloutSampling, make_engine

    policy, tok = load_policy(tiny_model, device="cpu")
    sp = RolloutSampling(max_new_tokens=4, seed=3)
    engine = make_engine(name, policy, tok, device="cpu")
    first = engine.generate(["1 + 2 =\nAnswer:"], 2, sp)
    engine.close()
    engine.close()  # idempotent
    for call in (lambda: engine.generate(["1 + 2 =\nAnswer:"], 2, sp), lambda: engine.sync_weights(policy)):
        with pytest.raises(ValueError, match="closed") as e:
            call()
        assert len(str(e.value).splitlines()) == 1
    again = make_engine(name, policy, tok, device="cpu")  # a notebook re-runs its engine cell in the same kernel
    try:
        second = again.generate(["1 + 2 =\nAnswer:"], 2, sp)
        assert second.texts == first.texts, "a re-created engine samples exactly as the first one did"
    finally:
        again.close()


def test_trainer_close_is_idempotent(tiny_model, tmp_path):
    t = Trainer(Config(**dict(TINY, eval_every=0), model=tiny_model, run_dir=str(tmp_path)), progress=False)
    t.close()
    t.close()
    with pytest.raises(ValueError, match="closed"):
        t.step()


# ---- one writer, honest status, overwrite, early interrupts (issue 37) -----------------------------------------------
def train_cmd(tiny_model: str, root: Path, name: str, **over) -> list[str]:
    cfg = dict(TINY, model=tiny_model, run_dir=str(root), run_name=name, **over)
    return [sys.executable, "-m", "brorl_lab", "train", "--quiet", *cli_args(cfg)]


def one_line_error(err: str) -> str:
    """The last line of stderr, after asserting there is no traceback and it is a single error/interrupt line."""
    assert "Traceback" not in err, err
    lines = [ln for ln in err.splitlines() if ln.strip() and not ln.startswith(("notice:", "note:"))]
    assert lines, err
    return lines[-1]


def test_a_second_writer_is_refused_naming_the_first_and_kill_9_reads_as_writer_gone(tiny_model, tmp_path):
    """Two `train` into one run name: the second (a new run with another seed, an --overwrite, a --resume) is
    refused in one line naming the first's pid and host, and nothing of the first's run changes. After kill -9
    the status reads "interrupted (writer gone)" (RunDir, run index, report), and --resume takes the lock over."""
    from brorl_lab.lab.tracking import run_index

    run = tmp_path / "shared"
    first = subprocess.Popen(train_cmd(tiny_model, tmp_path, "shared", steps=400), env=env(), text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_for(lambda: (run / "checkpoint" / CHECKPOINT_FILE).is_file(), 300, first, "the first checkpoint")
        config_before = (run / "config.yaml").read_bytes()
        for extra in (["--seed", "1"], ["--seed", "1", "--overwrite"]):
            second = subprocess.run(train_cmd(tiny_model, tmp_path, "shared", steps=2) + extra, env=env(),
                                    capture_output=True, text=True, timeout=300)
            assert second.returncode == 2, second.stderr
            line = one_line_error(second.stderr)
            assert f"is being written by pid {first.pid} on host" in line, line
        resumed = subprocess.run([sys.executable, "-m", "brorl_lab", "train", "--resume", str(run)], env=env(),
                                 capture_output=True, text=True, timeout=300)
        assert resumed.returncode == 2 and f"pid {first.pid}" in one_line_error(resumed.stderr)
        from brorl_lab.rl.trainer import export_policy

        with pytest.raises(ValueError, match=f"being written by pid {first.pid}"):  # export reads under the lock too
            export_policy(run, tmp_path / "exported")
        assert not (tmp_path / "exported").exists()
        assert (run / "config.yaml").read_bytes() == config_before, "the refused writers changed nothing"
        assert RunDir(run).read_status()["status"] == "running"
        status = json.loads((run / "status.json").read_text())
        assert status["pid"] == first.pid and status["host"] and status["heartbeat"] > 0
    finally:
        first.kill()  # SIGKILL: no handler runs, the status file still says "running"
        first.wait()
    assert json.loads((run / "status.json").read_text())["status"] == "running"
    assert RunDir(run).read_status()["status"] == "interrupted (writer gone)"
    index = run_index(tmp_path)
    assert index.set_index("run").loc["shared", "status"] == "interrupted (writer gone)"
    from brorl_lab.lab.report import report_html

    assert "interrupted (writer gone)" in report_html([run])
    resumed = subprocess.run([sys.executable, "-m", "brorl_lab", "train", "--quiet", "--resume", str(run),
                              "--steps", str(check_after_kill(run) + 1)], env=env(), capture_output=True, text=True,
                             timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    assert f"its last writer (pid {first.pid}" in resumed.stderr and "is gone" in resumed.stderr
    assert RunDir(run).read_status()["status"] == "finished"
    assert any(e["event"] == "lock_taken_over" for e in RunDir(run).read_events())


# Ctrl-C / SIGTERM / kill -9 / a full disk at each phase of a run, and what the printed line then says:
# tests/test_stop_matrix.py


def test_overwrite_leaves_no_file_of_the_old_run(tiny_model, tmp_path):
    old = Config(**dict(TINY, steps=6, keep_checkpoints=2, eval_every=2, lr=1e-4), model=tiny_model,
                 run_dir=str(tmp_path), run_name="r")
    with Trainer(old, progress=False) as t:
        t.run()
    run = tmp_path / "r"
    assert {d.name for d in (run / "checkpoints").iterdir()} >= {"step_000006", "best.json"}
    old_log = (run / "train.log").read_text()
    with pytest.raises(ValueError, match="already holds a run"):
        Trainer(old.replace(lr=1e-3, steps=2), progress=False)
    new = old.replace(lr=1e-3, steps=2, keep_checkpoints=1)
    with Trainer(new, progress=False, overwrite=True) as t:
        t.run()
    kept = {d.name for d in (run / "checkpoints").iterdir()}
    assert "step_000006" not in kept and "step_000004" not in kept and "step_000002" in kept, kept
    assert not (run / "checkpoints" / "best.json").exists() or json.loads(
        (run / "checkpoints" / "best.json").read_text())["step"] <= 2
    log = (run / "train.log").read_text()
    assert "step 6/6" in old_log and "step 6/6" not in log and log.count("start: step 0 of 2") == 1
    assert int(pd.read_parquet(run / "metrics.parquet")["step"].max()) == 2
    assert torch.load(run / "checkpoint" / CHECKPOINT_FILE, weights_only=False)["config"]["lr"] == 1e-3
    assert not [p for p in run.iterdir() if p.name.startswith(".overwritten-")]
    assert [e["event"] for e in RunDir(run).read_events()][0] == "overwritten"


def test_resume_from_a_kept_checkpoint_matches_and_more_steps_extend_a_finished_run(tiny_model, tmp_path):
    cfg = Config(**dict(TINY, steps=4, keep_checkpoints=4, eval_every=2), model=tiny_model, run_dir=str(tmp_path),
                 run_name="k")
    with Trainer(cfg, progress=False) as t:
        reference = comparable(t.run())
    run = tmp_path / "k"
    with Trainer.resume(run / "checkpoints" / "step_000002", progress=False) as t:
        assert t.step_idx == 2 and any("resuming from the kept checkpoint of step 2" in n for n in t.notices)
        assert not (run / "checkpoints" / "step_000003").exists(), "the abandoned branch's checkpoints go"
        again = comparable(t.run())
    pd.testing.assert_frame_equal(again, reference)  # bit-identical to the uninterrupted run
    with Trainer.resume(run, steps=6, progress=False) as t:
        assert t.cfg.steps == 6 and any("steps 4 -> 6" in n for n in t.notices)
        assert len(t.run()) == 7
    assert RunDir(run).read_config()["steps"] == 6
    assert {"event": "config_changed"}.items() <= next(
        e for e in RunDir(run).read_events() if e["event"] == "config_changed").items()
    with pytest.raises(ValueError, match="steps: got 3; allowed: more than the 6 steps"):
        Trainer.resume(run, steps=3, progress=False)
    with pytest.raises(ValueError, match="holds no state.pt"):
        Trainer.resume(run, checkpoint=1, progress=False)


def test_a_second_trainer_in_this_process_is_refused_while_the_first_trains(tiny_model, tmp_path):
    """A notebook: a busy Trainer keeps its directory; an idle (finished, not closed) one hands it over."""
    cfg = Config(**dict(TINY, steps=2, eval_every=0), model=tiny_model, run_dir=str(tmp_path), run_name="nb")
    seen = []

    def second_writer(trainer, row):
        if row["step"] < 2:  # step 1's checkpoint exists from step 2 on
            return
        with pytest.raises(ValueError, match="being written in this process") as e:
            Trainer.resume(tmp_path / "nb", progress=False)
        seen.append(str(e.value))

    first = Trainer(cfg, progress=False, callbacks=[second_writer])
    first.run()
    assert seen
    with Trainer.resume(tmp_path / "nb", steps=3, progress=False) as t:  # the idle first one hands over
        t.run()
    assert not first._lock.held


def test_a_second_sweep_into_the_same_directory_is_refused(failing_notebook, tmp_path):
    from brorl_lab.core.runlock import RunLock

    out = tmp_path / "sweep"
    with RunLock.acquire(out, "sweep"):  # a sweep in flight (here: in this process, as a notebook would run one)
        with pytest.raises(ValueError, match=r"out: .*sweep is being written in this process \(pid"):
            sweep.run_sweep(failing_notebook, [{"mode": "ok", "x": 1}], out=out, progress=False)
    assert not out.exists() or not any(out.iterdir())
    assert sweep.run_sweep(failing_notebook, [{"mode": "ok", "x": 1}], out=out, progress=False).status.tolist() == [
        "finished"]


def test_metrics_read_while_a_live_run_replaces_them_is_never_torn(tmp_path):
    """A reader polling metrics.parquet (report, the runs index, a notebook) while the Trainer replaces it
    atomically must see one whole version. pyarrow's path reader opens the file twice (footer, then pages) and mixed
    two versions ("Page was smaller than expected", ~1% of reads under a busy writer); RunDir reads it once."""
    import threading

    from brorl_lab.core.rundir import atomic_write

    run = RunDir(tmp_path / "run")
    stop = threading.Event()

    def writer():
        rows = 1
        while not stop.is_set():
            df = pd.DataFrame({"step": range(rows), "loss": [float(i) for i in range(rows)]})
            atomic_write(run.metrics_path, lambda f, df=df: df.to_parquet(f, index=False))
            rows = rows % 50 + 1

    atomic_write(run.metrics_path, lambda f: pd.DataFrame({"step": [0], "loss": [0.0]}).to_parquet(f, index=False))
    thread = threading.Thread(target=writer)
    thread.start()
    try:
        reads, t0 = 0, time.monotonic()
        while time.monotonic() - t0 < 3:
            df = run.read_metrics()  # raises RunFileError on a torn read
            assert list(df["step"]) == list(range(len(df)))
            reads += 1
    finally:
        stop.set()
        thread.join()
    assert reads > 100
