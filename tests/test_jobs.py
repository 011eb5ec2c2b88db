"""brorl_lab.lab.jobs: independent runs side by side in spawned processes or as Ray tasks; the same numbers as one
after another at the same thread count; Ctrl-C, a failing job and a job that asks to stop all stop the rest cleanly;
a stopped study resumes."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pandas as pd
import pytest
from helpers_jobs import failing_job, matmul_job, sleeping_job, train_job
from helpers_runs import TIMING, tiny_config, without_timing

from brorl_lab.core.validation import UserError
from brorl_lab.lab.jobs import NOT_RUN, Job, JobError, physical_cores, run_jobs, split_threads

REPO = Path(__file__).resolve().parents[1]


def matmul_jobs(root: Path, seeds=(0, 1, 2, 3)) -> list[Job]:
    return [Job(matmul_job, (s, str(root / f"s{s}")), name=f"s{s}", run_dir=root / f"s{s}") for s in seeds]


def test_two_processes_give_the_sequential_results_at_equal_threads(tmp_path):
    here = run_jobs(matmul_jobs(tmp_path / "one"), workers=1, threads=1, progress=False)
    side = run_jobs(matmul_jobs(tmp_path / "two"), workers=2, threads=1, progress=False)
    assert here.complete and side.complete and side.workers == 2
    assert [r["out"] for r in here] == [r["out"] for r in side]  # bit-equal, job by job
    assert {r["threads"] for r in side} == {1} and {r["omp"] for r in side} == {"1"}
    pids = [r["pid"] for r in side]
    assert len(set(pids)) == 2 and os.getpid() not in pids  # two worker processes, each kept for its next job
    assert here[0]["pid"] == os.getpid()  # workers=1 runs here
    assert all(w > 0 for w in side.wall_s)


def test_threads_are_split_over_the_cores(monkeypatch):
    assert split_threads(1, cores=16) == 16 and split_threads(2, cores=16) == 8 and split_threads(3, cores=2) == 1
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # a process started at one thread starts its jobs at one
    assert split_threads(1) == 1
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert split_threads(1) == physical_cores()


@pytest.mark.parametrize("workers", [1, 2])
def test_a_failing_job_is_named_and_nothing_after_it_starts(tmp_path, workers):
    # "first" is still running when fail_me fails at once: a warm worker would take the next job within ms
    jobs = [Job(sleeping_job, (1.0,), name="first"), Job(failing_job, (0.0,), name="fail_me"),
            *matmul_jobs(tmp_path, seeds=(5, 6, 7))]
    with pytest.raises(JobError, match="fail_me.*ValueError: this job fails on purpose") as e:
        run_jobs(jobs, workers=workers, threads=1, progress=False)
    assert e.value.job == "fail_me" and isinstance(e.value.__cause__, ValueError)
    started = [s for s in (5, 6, 7) if (tmp_path / f"s{s}" / "done").exists()]
    assert len(started) <= workers - 1  # at most the one that was already running beside it


def test_bad_arguments_are_one_clear_error():
    with pytest.raises(UserError, match="jobs: got 0"):
        run_jobs([Job(sleeping_job, (0,))], workers=0)
    with pytest.raises(UserError, match="threads: got -1"):
        run_jobs([Job(sleeping_job, (0,))], workers=2, threads=-1)
    with pytest.raises(UserError, match="allowed: a list of brorl_lab.lab.jobs.Job"):
        run_jobs([sleeping_job])
    with pytest.raises(UserError, match="run_dir: .*absolute"):
        run_jobs([Job(sleeping_job, (0,), name="x", run_dir=Path("relative"))], ray="127.0.0.1:1")


def _train_jobs(root: Path, names=("a", "b", "c"), steps: int = 12, pause_s: float = 0.0) -> list[Job]:
    cfgs = [tiny_config(root, name, seed=i, steps=steps, eval_every=0, checkpoint_every=1)
            for i, name in enumerate(names)]
    return [Job(train_job, (c, pause_s), name=c.run_name, run_dir=root / c.run_name) for c in cfgs]


STUDY_SCRIPT = """
import json, sys
sys.path[:0] = {paths!r}
from pathlib import Path
from test_jobs import _train_jobs
from brorl_lab.lab.jobs import NOT_RUN, run_jobs

res = run_jobs(_train_jobs(Path({root!r}), pause_s={pause_s!r}), workers=2, threads=1, progress=False,
               stop_if=lambda r: not r[1])
print(json.dumps({{"stopped": res.stopped,
                   "finished": [None if r is NOT_RUN else bool(r[1]) for r in res]}}))
"""


def _study(root: Path, pause_s: float) -> subprocess.Popen:
    """The study of STUDY_SCRIPT in a process of its own, each step paced by ``pause_s`` (a pause changes no number:
    it lets a signal sent at step 2 land mid-run however fast the machine; a resume needs none)."""
    script = STUDY_SCRIPT.format(paths=[str(REPO), str(REPO / "tests")], root=str(root), pause_s=pause_s)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")])}
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(script)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=str(root.parent))


def _step(run: Path) -> int:
    try:
        return int(json.loads((run / "status.json").read_text()).get("step") or 0)
    except (OSError, ValueError):
        return 0


@pytest.mark.timeout(600)
def test_ctrl_c_stops_every_job_at_a_checkpoint_and_the_study_resumes(tmp_path):
    """SIGINT to the runner (what a terminal's Ctrl-C or a kernel interrupt delivers) is passed on once to each
    worker: both running Trainers checkpoint and return unfinished, the third job never starts. Run again: the
    partial runs resume from their checkpoints and every run ends bit-equal to an uninterrupted one."""
    root = tmp_path / "study"
    proc = _study(root, pause_s=0.5)
    deadline = time.monotonic() + 300
    while not all(_step(root / n) >= 2 for n in ("a", "b")):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the jobs never reached step 2"
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, err
    first = json.loads(out.strip().splitlines()[-1])
    assert first == {"stopped": "SIGINT", "finished": [False, False, None]}, first
    for n in ("a", "b"):
        assert (root / n / "checkpoint").is_dir()
        assert json.loads((root / n / "status.json").read_text())["status"] == "interrupted"
        assert 2 <= _step(root / n) < 12
    assert not (root / "c").exists()

    again = _study(root, pause_s=0.0)
    out, err = again.communicate(timeout=400)
    assert again.returncode == 0, err
    assert json.loads(out.strip().splitlines()[-1]) == {"stopped": None, "finished": [True, True, True]}
    for n in ("a", "b"):
        events = [json.loads(line) for line in (root / n / "events.jsonl").read_text().splitlines()]
        assert [e["event"] for e in events].count("resumed") == 1

    fresh = run_jobs(_train_jobs(tmp_path / "fresh", names=("a", "b")), workers=1, threads=1, progress=False)
    for (df, _), n in zip(fresh, ("a", "b")):
        resumed = pd.read_parquet(root / n / "metrics.parquet")
        keep = [c for c in df.columns if not c.startswith(TIMING)]
        pd.testing.assert_frame_equal(df[keep].reset_index(drop=True), resumed[keep].reset_index(drop=True))


# ---- Ray: a local two-node cluster -----------------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stop_group(proc: subprocess.Popen, grace_s: float = 5) -> None:
    """SIGTERM to the node's process group, then SIGKILL to what is left of it after ``grace_s``: a test cluster's
    state is thrown away with its temp dir, and `ray start --block`'s own clean stop took 15-20 s per node."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        pass
    except ProcessLookupError:  # the command (and its group) already exited
        return
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the GCS, raylet and workers the command left in its group
    except ProcessLookupError:
        pass
    proc.wait(timeout=30)


def _ray_logs(log: Path, temp_dir: Path) -> str:
    """The start command's output and the tail of the GCS and raylet logs: what a failed start leaves to read."""
    parts = [f"--- {log.name}\n{log.read_text()[-1500:] if log.is_file() else '(none)'}"]
    for name in ("gcs_server.out", "gcs_server.err", "raylet.out", "raylet.err"):
        for f in sorted(temp_dir.glob(f"session_*/logs/{name}"))[-1:]:
            parts.append(f"--- {name}\n{f.read_text(errors='replace')[-1000:]}")
    return "\n".join(parts)


def _ray_node(cmd: list[str], env: dict, log: Path, ready, temp_dir: Path, attempts: int = 2,
              wait_s: float = 120) -> subprocess.Popen:
    """``ray start ... --block`` in its own process group, until ``ready()``; a start that dies or is not ready in
    ``wait_s`` (under load Ray's raylet can miss its agents' start-up deadline and abort) is stopped and retried, up
    to ``attempts`` times, so a cluster that cannot start fails in minutes with Ray's own logs, never at the timeout."""
    for attempt in range(1, attempts + 1):
        proc = subprocess.Popen(cmd, env=env, start_new_session=True, stdout=open(log, "w"), stderr=subprocess.STDOUT)
        deadline = time.monotonic() + wait_s
        while proc.poll() is None and time.monotonic() < deadline:
            if ready():
                return proc
            time.sleep(1)
        _stop_group(proc)
        if attempt == attempts:
            raise AssertionError(f"{' '.join(cmd[1:3])} did not start {attempts} times:\n{_ray_logs(log, temp_dir)}")
    raise AssertionError("unreachable")


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


@pytest.fixture(scope="module")
def two_node_cluster(tmp_path_factory):
    """``ray start --head`` and a second ``ray start --address`` node, one CPU each, in their own process groups
    (``--block``: stopping the command stops what it started), stopped by group id in teardown."""
    import shutil

    ray_bin = Path(sys.executable).with_name("ray")
    if not ray_bin.exists():
        pytest.skip("Ray is not installed (the ray extra; `make env` installs it)")
    import ray

    tmp = tmp_path_factory.mktemp("ray")
    temp_dir = Path("/tmp") / f"ray-jobs-{os.getpid()}"  # Ray's socket paths must stay short
    port = _free_port()
    address = f"127.0.0.1:{port}"
    # Token auth off on both sides (conftest sets RAY_AUTH_MODE=disabled for the session): `ray start` turns it on
    # by itself once ~/.ray/auth_token exists (any local ray.init() writes it), while ray.init(address=...) never
    # does, so the driver was refused ("Authentication token is missing") and the fixture waited until it timed out.
    assert os.environ.get("RAY_AUTH_MODE") == "disabled", "tests/conftest.py sets RAY_AUTH_MODE for the session"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")]),
           "RAY_USAGE_STATS_ENABLED": "0", "OMP_NUM_THREADS": "1"}
    common = ["--num-cpus", "1", "--block", "--disable-usage-stats", "--node-ip-address", "127.0.0.1"]

    def connected() -> bool:
        if not _listening(port):  # ray.init against a GCS that is not up retries for ~20 s per call
            return False
        try:
            ray.init(address=address, log_to_driver=False, _node_ip_address="127.0.0.1")
            return True
        except Exception:  # noqa: BLE001 - the head is still starting
            ray.shutdown()  # a failed init can leave a half-connected driver behind; the next try starts clean
            return False

    procs = []
    try:
        procs.append(_ray_node([str(ray_bin), "start", "--head", "--port", str(port), "--include-dashboard=false",
                                f"--temp-dir={temp_dir}", *common], env, tmp / "head.log", connected, temp_dir))
        procs.append(_ray_node([str(ray_bin), "start", "--address", address, *common], env, tmp / "node.log",
                               lambda: len([n for n in ray.nodes() if n.get("Alive")]) >= 2, temp_dir))
        ray.shutdown()
        yield address
    finally:
        ray.shutdown()
        for p in reversed(procs):
            _stop_group(p)
        shutil.rmtree(temp_dir, ignore_errors=True)


@pytest.mark.ray
@pytest.mark.timeout(600)
def test_ray_runs_the_jobs_on_both_nodes_with_the_local_results(tmp_path, two_node_cluster):
    jobs = [Job(train_job, (tiny_config(tmp_path / "ray", f"r{i}", seed=i, steps=3, eval_every=0),), name=f"r{i}",
                run_dir=tmp_path / "ray" / f"r{i}") for i in range(4)]
    res = run_jobs(jobs, ray=two_node_cluster, threads=1, progress=False)
    assert res.complete and all(finished for _, finished in res)
    assert len(set(res.where)) == 2  # one CPU per node: the four jobs were spread over both nodes
    assert all((tmp_path / "ray" / f"r{i}" / "metrics.parquet").is_file() for i in range(4))  # written in place
    local = run_jobs([Job(train_job, (tiny_config(tmp_path / "local", f"r{i}", seed=i, steps=3, eval_every=0),),
                          name=f"r{i}") for i in range(4)], workers=1, threads=1, progress=False)
    for (a, _), (b, _) in zip(res, local):
        keep = [c for c in a.columns if not c.startswith(TIMING)]
        pd.testing.assert_frame_equal(a[keep], b[keep])
    assert NOT_RUN not in res


# ---- the studies' call sites -------------------------------------------------------------------------------------------
ARM_OPTIONS = dict(n_small=2, n_large=8, prompts_small=2, prompts_large=2)  # 4 vs 16 samples per step: ratio 4


def tiny_base(root: Path, **kw):
    from brorl_lab.study.recipe import recipe_config

    d = dict(model="default", tasks=["gcd"], steps=2, eval_every=1, checkpoint_every=1, eval_prompts=4,
             eval_samples=2, optimizer_steps_per_step=1, max_new_tokens=6, max_resample_rounds=1, torch_threads=1,
             run_dir=str(root))
    d.update(kw)
    return recipe_config(**d)


@pytest.mark.timeout(600)
def test_the_arms_at_two_jobs_equal_the_arms_one_after_another(tmp_path):
    from brorl_lab.study.arms import run_rollout_scaling

    base = tiny_base(tmp_path)
    one = run_rollout_scaling(base, seeds=[0, 1], root=tmp_path / "one", progress=False, jobs=1, threads=1,
                              **ARM_OPTIONS)
    two = run_rollout_scaling(base, seeds=[0, 1], root=tmp_path / "two", progress=False, jobs=2, threads=1,
                              **ARM_OPTIONS)
    assert list(two["run"].unique()) == ["prorl_s0", "brorl_s0", "prorl_s1", "brorl_s1"]  # the sequential order
    pd.testing.assert_frame_equal(without_timing(one), without_timing(two))  # bit-equal metrics, run by run


KILLED_STUDY = """
import sys
sys.path[:0] = {paths!r}
from pathlib import Path
from test_jobs import KILL_OPTIONS, KILL_STEPS, tiny_base
from brorl_lab.study.arms import run_rollout_scaling

run_rollout_scaling(tiny_base(Path({root!r}), steps=KILL_STEPS), seeds=[0], root=Path({root!r}) / "arms",
                    progress=False, jobs=2, threads=1, **KILL_OPTIONS)
"""
# BroRL 16 x 2 samples for 4 steps, ProRL 2 x 1 for 64 steps: ProRL is far from done when BroRL finishes, so the
# kill below lands mid-run however fast the machine (with ARM_OPTIONS' ratio of 4 a fast CI machine finished ProRL).
KILL_OPTIONS = dict(ARM_OPTIONS, n_small=2, prompts_small=1, n_large=16)
KILL_STEPS = 4


@pytest.mark.timeout(600)
def test_a_killed_study_resumes_finished_runs_skipped_partial_runs_from_their_checkpoints(tmp_path):
    """SIGKILL to the study (no handler runs): the workers see their parent gone and stop at a checkpoint. The next
    call reads the finished arm back (not re-run: its files are untouched) and resumes the partial one; the result
    equals an uninterrupted study."""
    from brorl_lab.study.arms import run_rollout_scaling

    root = tmp_path / "killed"
    script = KILLED_STUDY.format(paths=[str(REPO), str(REPO / "tests")], root=str(root))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")])}
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(script)], env=env, stderr=subprocess.PIPE,
                            text=True)
    arms = root / "arms"
    deadline = time.monotonic() + 300
    prorl_steps = KILL_STEPS * 16
    while not (_status(arms / "brorl_s0") == "finished" and _step(arms / "prorl_s0") >= 3):
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "the study never got there"
        time.sleep(0.2)
    proc.kill()
    proc.wait()
    while _status(arms / "prorl_s0") == "running":  # the orphaned worker checkpoints and exits by itself
        assert time.monotonic() < deadline + 120, "the orphaned worker kept running"
        time.sleep(0.5)
    assert _status(arms / "prorl_s0") == "interrupted" and _step(arms / "prorl_s0") < prorl_steps
    finished = {p: p.stat().st_mtime_ns for p in (arms / "brorl_s0").rglob("*") if p.is_file()}

    base = tiny_base(root, steps=KILL_STEPS)
    resumed = run_rollout_scaling(base, seeds=[0], root=arms, progress=False, jobs=2, threads=1, **KILL_OPTIONS)
    assert {p: p.stat().st_mtime_ns for p in (arms / "brorl_s0").rglob("*") if p.is_file()} == finished
    events = [json.loads(line) for line in (arms / "prorl_s0" / "events.jsonl").read_text().splitlines()]
    assert [e["event"] for e in events].count("resumed") == 1
    fresh = run_rollout_scaling(tiny_base(tmp_path / "fresh", steps=KILL_STEPS), seeds=[0],
                                root=tmp_path / "fresh" / "arms", progress=False, jobs=1, threads=1, **KILL_OPTIONS)
    assert fresh.loc[fresh["arm"] == "prorl", "step"].max() == prorl_steps
    pd.testing.assert_frame_equal(without_timing(fresh), without_timing(resumed))


def _status(run: Path) -> str:
    try:
        return json.loads((run / "status.json").read_text()).get("status", "")
    except (OSError, ValueError):
        return ""


@pytest.mark.timeout(600)
def test_theorem_updates_as_jobs_equal_the_updates_one_after_another(tmp_path):
    from brorl_lab.study import theorem as T

    st = T.setup("default", prompts=4, held_out=1, tasks=["gcd", "spell_backward"])
    kw = dict(n_values=[4, 16], seeds=[0, 1], prompts=4, held_out=1, progress=False, st=st)
    one = T.run_theorem("default", root=tmp_path / "one", jobs=1, threads=1, **kw)
    two = T.run_theorem("default", root=tmp_path / "two", jobs=2, threads=1, **kw)
    assert sorted(p.name for p in (tmp_path / "two" / "default_adamw").glob("n*_s*.csv")) == \
        ["n16_s0.csv", "n16_s1.csv", "n4_s0.csv", "n4_s1.csv"]
    pd.testing.assert_frame_equal(one, two)


@pytest.mark.ray
@pytest.mark.timeout(600)
def test_ctrl_c_with_ray_stops_the_study_and_it_resumes_to_the_same_results(tmp_path, two_node_cluster):
    import threading

    root = tmp_path / "ray_stop"
    jobs = _train_jobs(root, names=("a", "b"))

    def interrupt_when_running():  # SIGINT to this process once both tasks are training: the runner's handler takes it
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if all(_step(root / n) >= 2 for n in ("a", "b")):
                os.kill(os.getpid(), signal.SIGINT)
                return
            time.sleep(0.2)  # never there: no signal (the assertions below fail instead)

    watcher = threading.Thread(target=interrupt_when_running, daemon=True)
    watcher.start()
    res = run_jobs(jobs, ray=two_node_cluster, threads=1, progress=False, stop_if=lambda r: not r[1])
    watcher.join()
    assert res.stopped == "SIGINT"  # the runner stopped; a task already running may finish (Ray runs it off the
    for n in ("a", "b"):  # main thread, where a Trainer cannot take the interrupt), else it left a checkpoint
        assert (root / n / "checkpoint").is_dir() and _step(root / n) >= 2
    again = run_jobs(jobs, ray=two_node_cluster, threads=1, progress=False)
    assert again.complete and all(finished for _, finished in again)
    fresh = run_jobs(_train_jobs(tmp_path / "fresh", names=("a", "b")), workers=1, threads=1, progress=False)
    for (a, _), (b, _) in zip(again, fresh):
        keep = [c for c in a.columns if not c.startswith(TIMING)]
        pd.testing.assert_frame_equal(a[keep].reset_index(drop=True), b[keep].reset_index(drop=True))


@pytest.mark.timeout(600)
def test_the_seeds_per_hour_bench_writes_its_comparison_with_provenance(tmp_path):
    """bench/bench_jobs.py at tiny sizes: both configs run the same slice from scratch; the JSON holds the wall times,
    the per-run slowdown, the load and the command (no speed is asserted: benchmarks are not tests)."""
    from bench.bench_jobs import main

    out = main(["--smoke", "--seeds", "0", "--configs", "1x1", "2x1", "--root", str(tmp_path / "runs"),
                "--json", str(tmp_path / "jobs.json")])
    saved = json.loads((tmp_path / "jobs.json").read_text())
    assert saved["results"] == json.loads(json.dumps(out["results"]))
    one, two = saved["results"]
    assert (one["config"], two["config"]) == ("1x1", "2x1") and one["speedup_vs_first"] == 1.0
    assert set(one["run_s"]) == set(two["run_s"]) == {"prorl_s0", "brorl_s0"}
    assert all(v > 0 for v in two["run_s"].values()) and set(two["run_slowdown_vs_first"]) == set(two["run_s"])
    assert saved["command"].startswith("python -m bench.bench_jobs --smoke") and saved["commit"]
    assert two["rounds"][0]["load"]["samples"] >= 1 and saved["machine"]["physical_cores"] >= 1
