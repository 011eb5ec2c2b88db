"""Independent runs as jobs: side by side in processes on this machine, or as Ray tasks on a cluster.

    jobs = [Job(run_arm, (cfg,), name="prorl_s0", run_dir=root / "prorl_s0"), ...]
    res = run_jobs(jobs, workers=2)                 # two processes, physical cores // 2 torch threads each
    res = run_jobs(jobs, ray="head-node:6379")      # one Ray task per job, num_cpus = its torch threads
    res[i]                                          # job i's return value, or NOT_RUN (stopped before it started)

A *job* is a picklable call ``fn(*args, **kwargs)`` (``fn`` a module-level function) that writes what it makes into
its own ``run_dir`` and returns a picklable value. Jobs must not depend on each other: each one's result is what it
would be alone, so a study run at ``workers=1`` and ``workers=K`` gives the same numbers (run by run, for the same
seeds and torch thread count; see *Reproducibility*).

**This machine** (``workers = K >= 2``). At most K jobs at once in K worker processes (``spawn``: no state shared
with the caller), each kept warm for the next job (imports and torch start-up paid once per worker, not once per
job; a job's numbers depend on its inputs and thread count only, as at ``workers=1``, where every job shares this
process), with ``torch.set_num_threads(threads)`` and ``OMP_NUM_THREADS`` /
``MKL_NUM_THREADS`` = ``threads``, by default physical cores // K (:func:`split_threads`): two torch processes with
2 threads each on 2 cores thrash (ARCHITECTURE.md: 0.3 s -> 3.5 s per step). ``workers=1`` runs the jobs one after
another in the calling process (a notebook keeps each run's own progress bar).

**A Ray cluster** (``ray="host:port"`` or ``"auto"``). Every job becomes one Ray task with ``num_cpus = threads``
(default 1: a small model gains little from a second thread, a cluster gains a whole job), submitted at once, so
Ray places them on the nodes as CPUs free up; a task lost with its node is retried by Ray. Outputs go where the
job's ``run_dir`` says, which must be on a **filesystem every node mounts** (NFS, Lustre, a cloud file share): a
partial run's checkpoint has to be where its next attempt (on any node, or after the driver was killed) finds it,
which results shipped back through the driver would lose with the driver. The runner checks this first: every task
looks for a marker the driver wrote beside the run directories and fails with one clear error if it cannot see
it. ``run_dir`` paths must be absolute (workers do not share the driver's working directory).

**Stopping.** The first Ctrl-C (SIGINT) or SIGTERM starts nothing new and passes the signal on, once, to every
running job (local workers run in their own process group, so a terminal's Ctrl-C reaches them only through the
runner): a Trainer finishes its step, checkpoints and returns. On Ray the tasks are cancelled (``ray.cancel``): one
not yet started never starts, but a running one may run to its end (Ray executes it off the worker's main thread,
where a Trainer cannot take the interrupt); either way its run directory holds a checkpoint to resume from.
A second signal is passed on again (a Trainer then stops at once, keeping its last checkpoint). A
job that returns a value for which ``stop_if(value)`` is true (a Trainer run that was interrupted) stops the
others the same way, and so does a job that raises; the error is raised, naming the job, once the rest have
stopped. A worker whose parent dies stops itself the same way. Call again to resume: finished runs are read back,
partial ones continue from their checkpoints (that is the jobs' part: :func:`brorl_lab.study.arms.run_arm`).

**Reproducibility.** A job's numbers are reproducible given its inputs *and its torch thread count*: float
reductions (matmul) split differently over 1 and 2 threads, so the same run at 1 and 2 threads can differ in the
last bits and then diverge. ``workers=1`` with ``threads=t`` and ``workers=K`` with ``threads=t`` give bit-equal
results; the defaults (cores // K) change ``t`` with K, and a run records its thread count (``torch_threads`` in
its config.yaml). Across machines and library versions runs agree in distribution only.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import pickle
import signal
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import wait as wait_ready
from pathlib import Path
from typing import Any, Optional

from brorl_lab.core.validation import UserError, is_int


class _NotRun:
    """The result of a job that was never started (the runner stopped first)."""

    def __repr__(self) -> str:
        return "NOT_RUN"

    def __reduce__(self):
        return "NOT_RUN"


NOT_RUN = _NotRun()
THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


@dataclass(frozen=True)
class Job:
    """One independent run: ``fn(*args, **kwargs)``, writing into ``run_dir`` (whose status.json the progress bar
    reads: a Trainer's step). ``fn`` must be importable by name (a module-level function) for processes and Ray."""

    fn: Callable[..., Any]
    args: tuple = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    name: str = ""
    run_dir: Optional[Path] = None

    def __call__(self) -> Any:
        return self.fn(*self.args, **self.kwargs)


class JobResults(list):
    """Each job's return value in job order (:data:`NOT_RUN` for one never started), with ``stopped`` (why the
    runner stopped early: ``"SIGINT"``, ``"SIGTERM"``, ``"stop_if <job>"``; None when every job ran),
    ``wall_s`` (each job's seconds, None when not run), ``where`` (``"pid <n>"`` or the Ray node id), ``threads``
    (torch threads per job) and ``workers``."""

    stopped: Optional[str] = None
    wall_s: list
    where: list
    threads: int = 1
    workers: int = 1

    @property
    def complete(self) -> bool:
        return self.stopped is None and all(r is not NOT_RUN for r in self)


class JobError(RuntimeError):
    """A job raised; ``job`` names it. The job's own exception is the ``__cause__``."""

    def __init__(self, job: str, message: str):
        super().__init__(message)
        self.job = job


# ---- cores and threads -------------------------------------------------------------------------------------------
def physical_cores() -> int:
    """Physical cores this process may use: psutil's physical count (hyper-threads share a core's float units)
    capped by the CPU affinity mask (a container or ``taskset`` may allow fewer); the logical count without
    psutil."""
    try:
        allowed = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        allowed = os.cpu_count() or 1
    try:
        import psutil

        physical = psutil.cpu_count(logical=False) or allowed
    except ImportError:
        physical = allowed
    return max(1, min(physical, allowed))


def split_threads(workers: int, cores: Optional[int] = None) -> int:
    """Torch threads per job when ``workers`` jobs share ``cores`` (default :func:`physical_cores`, or fewer where
    ``$OMP_NUM_THREADS`` asks for fewer: a process started at one thread, a test worker or a ``--jobs`` worker,
    starts its own jobs at one thread too instead of taking a core another process holds): cores // workers, at
    least 1."""
    if cores is None:
        cores, asked = physical_cores(), os.environ.get("OMP_NUM_THREADS", "")
        cores = min(cores, int(asked)) if asked.isdigit() and int(asked) > 0 else cores
    return max(1, cores // workers)


def check_workers(workers: Any, name: str = "jobs") -> int:
    if not is_int(workers) or workers < 1:
        what = "runs at a time" if name == "jobs" else "torch threads per run"
        raise UserError(f"{name}: got {workers!r}; allowed: an integer >= 1 ({what})")
    return int(workers)


def plan_workers(jobs: Optional[int] = None, threads: Optional[int] = None,
                 ray: Optional[str] = None) -> tuple[int, int]:
    """``(jobs, threads)`` with the defaults filled in and checked: jobs None -> one per physical core; threads
    None (or 0) -> physical cores // jobs here, 1 per Ray task."""
    jobs = check_workers(physical_cores() if jobs is None else jobs)
    threads = threads or (1 if ray is not None else split_threads(jobs))
    return jobs, check_workers(threads, "threads")


# ---- the runner ------------------------------------------------------------------------------------------------------
def run_jobs(jobs: Sequence[Job], *, workers: Optional[int] = None, threads: Optional[int] = None,
             ray: Optional[str] = None, progress: bool = True, desc: str = "runs",
             stop_if: Optional[Callable[[Any], bool]] = None, poll_s: float = 2.0) -> JobResults:
    """Run ``jobs``: ``workers`` at a time on this machine (default: one per physical core; 1 runs them here, one
    after another), or as Ray tasks on the cluster at ``ray``. ``threads``: torch threads per job (default: physical
    cores // workers here, 1 on Ray). ``progress``: a tqdm.auto bar over jobs naming each one in flight with its
    step. Returns a :class:`JobResults`; raises :class:`JobError` (after stopping the rest) when a job raises."""
    jobs = list(jobs)
    for j in jobs:
        if not isinstance(j, Job) or not callable(j.fn):
            raise UserError(f"jobs: got {j!r}; allowed: a list of brorl_lab.lab.jobs.Job")
    if ray is not None and (not isinstance(ray, str) or not ray.strip()):
        raise UserError(f"ray: got {ray!r}; allowed: a Ray cluster address (host:port, ray://host:port or 'auto')")
    if threads is not None:
        check_workers(threads, "threads")
    workers, threads = plan_workers(workers, threads, ray)
    res = JobResults([NOT_RUN] * len(jobs))
    res.wall_s, res.where, res.threads, res.workers = [None] * len(jobs), [None] * len(jobs), threads, workers
    if not jobs:
        return res
    with _bar(jobs, desc, progress) as bar:
        if ray is not None:
            _run_ray(jobs, res, ray, threads, bar, stop_if, poll_s)
        elif workers == 1:
            _run_here(jobs, res, threads, bar, stop_if)
        else:
            _run_local(jobs, res, workers, threads, bar, stop_if, poll_s)
    return res


@contextlib.contextmanager
def _bar(jobs: Sequence[Job], desc: str, progress: bool) -> Iterator[Callable[..., None]]:
    """A tqdm.auto bar over jobs; ``update(done, running)`` advances it by ``done`` and names the jobs in flight
    with their Trainer step (read from their run directories' status.json)."""
    from tqdm.auto import tqdm

    from brorl_lab.lab.sweep import progress_text

    bar = tqdm(total=len(jobs), desc=desc, unit="run", disable=not progress)

    def update(done: int = 0, running: Sequence[int] = ()) -> None:
        bar.update(done)
        dirs = [jobs[i].run_dir for i in running if jobs[i].run_dir is not None]
        bar.set_postfix_str(progress_text(dirs) if dirs else ", ".join(jobs[i].name for i in running), refresh=True)

    try:
        yield update
    finally:
        bar.close()


def _job_name(jobs: Sequence[Job], i: int) -> str:
    return jobs[i].name or f"job {i}"


def _raise_failure(jobs: Sequence[Job], failed: Optional[tuple[int, BaseException, str]]) -> None:
    if failed is not None:
        i, err, tb = failed
        if isinstance(err, UserError):  # bad input stays one line (the CLI's exit 2), naming the job
            raise UserError(f"job {_job_name(jobs, i)}: {err}") from err
        raise JobError(_job_name(jobs, i), f"job {_job_name(jobs, i)} failed: {type(err).__name__}: {err}"
                       + (f"\n{tb}" if tb else "")) from err


@contextlib.contextmanager
def thread_count(threads: int) -> Iterator[None]:
    """torch's thread count (and the OpenMP/MKL variables a spawned child reads at start) set to ``threads``."""
    import torch

    saved = {k: os.environ.get(k) for k in THREAD_VARS}
    before = torch.get_num_threads()
    os.environ.update({k: str(threads) for k in THREAD_VARS})
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _run_here(jobs, res, threads, bar, stop_if) -> None:
    """workers=1: one job after another in this process. A Trainer inside a job takes the first Ctrl-C itself
    (finishes its step, checkpoints, returns); ``stop_if`` then stops the loop."""
    failed = None
    with thread_count(threads):
        for i, job in enumerate(jobs):
            bar(0, [i])
            t0 = time.perf_counter()
            try:
                res[i] = job()
            except KeyboardInterrupt:
                res.stopped = "SIGINT"
                break
            except Exception as e:  # noqa: BLE001 - named and re-raised below, like a worker's
                failed = (i, e, "")
                break
            res.wall_s[i], res.where[i] = time.perf_counter() - t0, f"pid {os.getpid()}"
            bar(1)
            if stop_if is not None and stop_if(res[i]):
                res.stopped = f"stop_if {_job_name(jobs, i)}"
                break
    _raise_failure(jobs, failed)


class _Stopper:
    """The runner's SIGINT/SIGTERM handler (main thread only): counts signals and passes each on to the jobs in
    flight through ``forward(signum)``."""

    def __init__(self, forward: Callable[[int], None]):
        self.forward, self.reason, self.count = forward, None, 0

    def __call__(self, signum, frame) -> None:
        self.stop(signal.Signals(signum).name, signum)

    def stop(self, reason: str, signum: int = signal.SIGINT) -> None:
        self.count += 1
        self.reason = self.reason or reason
        self.forward(signum)

    @contextlib.contextmanager
    def installed(self) -> Iterator["_Stopper"]:
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        previous = {s: signal.signal(s, self) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield self
        finally:
            for s, h in previous.items():
                signal.signal(s, h)


class _Worker:
    """A spawned worker process kept warm across jobs (imports, torch and the model files loaded once per process,
    not once per job: a study's arm x seed runs are short). A job goes down its pipe, its outcome comes back."""

    def __init__(self, ctx, threads: int):
        self.conn, theirs = ctx.Pipe(duplex=True)
        self.proc = ctx.Process(target=_child, args=(theirs, threads, os.getpid()), name="brorl-job-worker",
                                daemon=False)
        with thread_count(threads):  # the child's OMP/MKL variables at exec
            self.proc.start()
        theirs.close()

    def close(self, kill: bool = False) -> None:
        if kill:
            self.proc.kill()
        else:
            with contextlib.suppress(OSError):
                self.conn.send(None)  # no more jobs: the worker exits
        self.proc.join()
        self.conn.close()


def _run_local(jobs, res, workers, threads, bar, stop_if, poll_s) -> None:  # noqa: C901 - start, wait, collect, stop: one loop
    """K >= 2: at most ``workers`` spawned processes, each running one job at a time and kept for the next one;
    results come back through each worker's pipe. Signals go to the workers with a job in flight only."""
    ctx = mp.get_context("spawn")
    running: dict[int, tuple[_Worker, float]] = {}  # job index -> (its worker, start time)
    idle: list[_Worker] = []

    def forward(signum: int) -> None:
        for w, _ in running.values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(w.proc.pid, signum)

    stopper, todo, failed = _Stopper(forward), list(range(len(jobs))), None
    with stopper.installed():
        try:
            while todo or running:
                while todo and len(running) < workers and stopper.reason is None:
                    i = todo.pop(0)
                    w = idle.pop() if idle else _Worker(ctx, threads)
                    w.conn.send(jobs[i])
                    running[i] = (w, time.perf_counter())
                    bar(0, list(running))
                if not running:
                    break
                wait_ready([w.conn for w, _ in running.values()] + [w.proc.sentinel for w, _ in running.values()],
                           timeout=poll_s)
                for i, (w, t0) in list(running.items()):
                    msg = _receive(w.conn, w.proc)
                    if msg is None:
                        continue
                    del running[i]
                    if w.proc.is_alive():
                        idle.append(w)
                    else:
                        w.close()
                    res.wall_s[i], res.where[i] = time.perf_counter() - t0, f"pid {w.proc.pid}"
                    kind, value, tb = msg
                    if kind == "ok":
                        res[i] = value
                        if stop_if is not None and stop_if(value) and stopper.reason is None:
                            stopper.stop(f"stop_if {_job_name(jobs, i)}")
                    elif kind == "error":
                        failed = failed or (i, value, tb)
                        if stopper.reason is None:
                            stopper.stop(f"failed {_job_name(jobs, i)}")
                    bar(1, list(running))
                bar(0, list(running))
        finally:
            for w, _ in running.values():  # only on an error in the runner itself: leave nothing behind
                w.close(kill=True)
            for w in idle:
                w.close()
    if stopper.reason is not None and not stopper.reason.startswith("failed"):
        res.stopped = stopper.reason
    _raise_failure(jobs, failed)


def _receive(conn, proc) -> Optional[tuple[str, Any, str]]:
    """The worker's message once it has sent one or exited; None while it runs."""
    if conn.poll():
        try:
            return conn.recv()
        except (EOFError, ConnectionResetError):  # it exited (or was stopped mid-start) without a whole message
            pass
    elif proc.is_alive():
        return None
    proc.join()
    if proc.exitcode in (-signal.SIGINT, -signal.SIGTERM):  # killed by a signal before its job took over
        return ("stopped", None, "")
    return ("error", RuntimeError(f"worker process exited with code {proc.exitcode} without a result"), "")


def _child(conn, threads: int, parent: int) -> None:
    """A worker process: its own process group (a terminal's Ctrl-C reaches it through the runner only), a watch on
    the parent (gone: stop like a Ctrl-C), ``threads`` torch threads, then jobs from the pipe one at a time, each
    one's outcome sent back, until the runner sends None (or is gone)."""
    with contextlib.suppress(OSError):
        os.setpgrp()
    threading.Thread(target=_watch_parent, args=(parent,), daemon=True).start()
    import torch

    torch.set_num_threads(threads)
    while True:
        try:
            job = conn.recv()
        except (EOFError, OSError, KeyboardInterrupt):
            break
        if job is None:
            break
        try:
            msg = ("ok", job(), "")
        except KeyboardInterrupt:
            msg = ("stopped", None, "")
        except BaseException as e:  # noqa: BLE001 - every failure goes back to the runner, which names the job
            msg = ("error", _picklable(e), traceback.format_exc(limit=-4))
        torch.set_num_threads(threads)  # whatever the job did, the next one starts alike
        try:
            conn.send(msg)
        except (pickle.PicklingError, TypeError, AttributeError) as e:
            conn.send(("error", RuntimeError(f"the job's result could not be pickled ({e})"), ""))
        except OSError:  # the runner is gone (killed): the run directory holds the outcome
            break
    conn.close()


def _picklable(e: BaseException) -> BaseException:
    try:
        pickle.loads(pickle.dumps(e))
        return e
    except Exception:  # noqa: BLE001 - any exception type may refuse pickling
        return RuntimeError(f"{type(e).__name__}: {e}")


def _watch_parent(parent: int, every_s: float = 1.0) -> None:
    while os.getppid() == parent:
        time.sleep(every_s)
    os.kill(os.getpid(), signal.SIGTERM)  # a Trainer checkpoints and returns; nobody reads the result


# ---- Ray -------------------------------------------------------------------------------------------------------------
RAY_MARKER = ".brorl-jobs-visible"


def _run_ray(jobs, res, address, threads, bar, stop_if, poll_s) -> None:  # noqa: C901 - connect, check, submit, wait, stop: one loop
    """One Ray task per job (``num_cpus=threads``), all submitted at once; a marker file beside each run directory
    checks that every node sees the driver's filesystem."""
    try:
        import ray
        from ray.exceptions import RayTaskError, TaskCancelledError
    except ImportError as e:
        raise UserError("ray: Ray is not installed; allowed: without --ray, or install the ray extra "
                        "(pip install 'brorl_lab[ray]' -c requirements/cpu-lock.txt; `make env` does)") from e
    for j in jobs:
        if j.run_dir is None or not Path(j.run_dir).is_absolute():
            raise UserError(f"run_dir: job {j.name!r} has {j.run_dir!r}; allowed: an absolute path on a filesystem "
                            "every Ray node mounts")
    owns = not ray.is_initialized()
    if owns:
        try:
            ray.init(address=address, log_to_driver=False)
        except (ConnectionError, ValueError, RuntimeError) as e:
            raise UserError(f"ray: could not connect to a Ray cluster at {address!r} ({str(e).strip()[:200]}); "
                            "allowed: the address `ray start --head` printed (host:port), or 'auto' on a node of "
                            "the cluster") from e
    token = uuid.uuid4().hex
    markers = {}
    for j in jobs:
        parent = Path(j.run_dir).parent
        parent.mkdir(parents=True, exist_ok=True)
        markers[parent] = parent / f"{RAY_MARKER}-{token}"
        markers[parent].write_text(token)
    task = ray.remote(_ray_task)
    refs: dict[Any, int] = {}
    started: dict[int, float] = {}
    failed = None

    def forward(signum: int) -> None:  # cancel raises KeyboardInterrupt in a running task, as a Ctrl-C would
        for ref in refs:
            ray.cancel(ref, force=False)

    stopper = _Stopper(forward)
    try:
        with stopper.installed():
            for i, j in enumerate(jobs):
                ref = task.options(num_cpus=threads, name=_job_name(jobs, i)[:60]).remote(
                    j, threads, str(markers[Path(j.run_dir).parent]), token)
                refs[ref] = i
                started[i] = time.perf_counter()
            while refs:
                ready, _ = ray.wait(list(refs), num_returns=1, timeout=poll_s)
                for ref in ready:
                    i = refs.pop(ref)
                    try:
                        value, where = ray.get(ref)
                        res[i], res.where[i] = value, where
                        res.wall_s[i] = time.perf_counter() - started[i]
                        if stop_if is not None and stop_if(value) and stopper.reason is None:
                            stopper.stop(f"stop_if {_job_name(jobs, i)}")
                    except TaskCancelledError:
                        pass  # stopped before or while it ran: NOT_RUN (a Trainer has checkpointed)
                    except RayTaskError as e:
                        cause = e.as_instanceof_cause()
                        if isinstance(cause, KeyboardInterrupt) or isinstance(getattr(e, "cause", None),
                                                                                KeyboardInterrupt):
                            continue
                        failed = failed or (i, getattr(e, "cause", None) or cause, "")
                        if stopper.reason is None:
                            stopper.stop(f"failed {_job_name(jobs, i)}")
                    bar(1)
                bar(0, [refs[r] for r in refs][: 8])
    finally:
        for ref in refs:
            ray.cancel(ref, force=True)
        for m in markers.values():
            m.unlink(missing_ok=True)
        if owns:
            ray.shutdown()
    if stopper.reason is not None and not stopper.reason.startswith("failed"):
        res.stopped = stopper.reason
    _raise_failure(jobs, failed)


def _ray_task(job: Job, threads: int, marker: str, token: str) -> tuple[Any, str]:
    """A job inside a Ray worker: check that this node sees the driver's files, set the thread count, run it."""
    import ray
    import torch

    node = ray.get_runtime_context().get_node_id()
    m = Path(marker)
    if not m.is_file() or m.read_text() != token:
        raise UserError(f"run_dir: {m.parent} is not visible on Ray node {node[:12]}; allowed: a study directory "
                        "on a filesystem every node mounts (--ray writes each run where its run_dir says)")
    os.environ.update({k: str(threads) for k in THREAD_VARS})
    torch.set_num_threads(threads)
    return job(), node


__all__ = ["Job", "JobResults", "JobError", "NOT_RUN", "physical_cores", "split_threads", "check_workers",
           "plan_workers", "thread_count", "run_jobs"]
