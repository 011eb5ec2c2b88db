"""Parameterised notebook runs with papermill: one run, a grid of runs, and the iso-compute planner.

    run_notebook("notebooks/01_mass_balance_theory.ipynb", "runs/theory", {"steps": 50})
    run_sweep("notebooks/02_rollout_scaling.ipynb", {"seed": [0, 1, 2], "big_n": [64, 512]}, out="runs/sweeps/n")
    iso_compute_plan(samples_per_step=512, n_values=[4, 8, 16, 64, 256, 512])

Each run gets its own directory (executed notebook, HTML export, whatever the notebook writes into its
``run_dir`` parameter: metrics.parquet, figures) and a ``status.json``. Re-running a sweep skips runs whose status
is "finished"; a failed run records its error and the sweep goes on. A run retried in a directory that has a status
gets ``overwrite=True`` when its notebook declares an ``overwrite`` parameter (a Trainer refuses to replace an
existing run without it). ``index.parquet`` lists every run; ``report.html`` (:mod:`brorl_lab.lab.report`) shows the
index and every training run the sweep's notebooks wrote, overlaid.

One writer per directory: a papermill run holds the ``notebook`` lock of its directory and a sweep the ``sweep``
lock of its ``out`` (:mod:`brorl_lab.core.runlock`), so a second sweep into the same place is refused naming the
first. With ``stream=True`` (the CLI's ``demo``, ``sweep`` and studies) what a notebook's cells print (a Trainer's
step lines) reaches the console as it happens, each line prefixed with its run in a sweep; in a batch job's log the
sweep's progress is plain lines, no carriage returns.

Kernels are started with CurveZMQ transport encryption where pyzmq and the kernelspec support it: ipykernel
otherwise warns on every run that it "is running over TCP without encryption" (see :func:`kernel_options`).
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
import math
import os
import sys
import time
import traceback
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any, Optional

import pandas as pd

from brorl_lab.core.console import live_bars
from brorl_lab.core.runlock import RunLock
from brorl_lab.core.validation import UserError, check_int, did_you_mean, is_int, is_number
from brorl_lab.lab.tracking import RunDir, atomic_write

KERNEL = "python3"


def expand_grid(grid: Mapping[str, Sequence[Any]]) -> list[dict]:
    """Cartesian product of a {name: [values]} grid, in a stable order."""
    if not isinstance(grid, Mapping) or not grid:
        raise UserError("grid: allowed: a non-empty mapping of parameter name -> list of values")
    for k, v in grid.items():
        if isinstance(v, (str, bytes)) or not isinstance(v, Sequence) or len(v) == 0:
            raise UserError(f"grid[{k!r}]: got {v!r}; allowed: a non-empty list of values")
    keys = list(grid)
    return [dict(zip(keys, combo)) for combo in itertools.product(*(grid[k] for k in keys))]


def run_id(params: Mapping[str, Any], first: Sequence[str] = ()) -> str:
    """Readable, stable directory name for a parameter set: ``first`` (a sweep's swept parameters) lead, so the
    80-character slug never cuts off what tells two runs apart; the digest keeps every name unique."""
    order = [k for k in first if k in params] + sorted(k for k in params if k not in first)
    slug = "_".join(f"{k}={_short(params[k])}" for k in order)[:80] or "default"
    digest = hashlib.sha1(json.dumps(params, sort_keys=True, default=str).encode()).hexdigest()[:8]
    return f"{_safe(slug)}-{digest}"


def _short(v: Any) -> str:
    return "-".join(map(str, v)) if isinstance(v, (list, tuple)) else str(v)


def _safe(s: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "=-_.," else "-" for ch in s)


def notebook_parameters(notebook: str | os.PathLike) -> dict:
    """The names and default values declared in a notebook's ``parameters`` cell."""
    import papermill as pm

    if not Path(notebook).is_file():
        raise UserError(f"notebook: {notebook} does not exist; allowed: a path to an .ipynb file")
    try:
        declared = pm.inspect_notebook(str(notebook))
    except Exception as e:  # noqa: BLE001 - not JSON, not nbformat, unreadable: one error naming the notebook
        raise UserError(f"notebook: {notebook} could not be read as a notebook ({type(e).__name__}: "
                         f"{str(e).strip()[:200]}); allowed: a path to an .ipynb file") from e
    return {name: info["default"] for name, info in declared.items()}


def check_parameters(notebook: str | os.PathLike, params: Mapping[str, Any]) -> None:
    """Reject parameters the notebook does not declare (papermill would silently inject them) and values papermill
    cannot write into a cell (anything but None, bool, int, float, str and lists / str-keyed dicts of them)."""

    if not isinstance(params, Mapping):
        raise UserError(f"parameters: got {type(params).__name__}; allowed: a mapping of parameter name -> value")
    known = notebook_parameters(notebook)
    for k, v in params.items():
        if k not in known:
            raise UserError(f"parameter {k!r}{did_you_mean(k, known)} is not in the parameters cell of {Path(notebook).name}; "
                             f"allowed: {', '.join(known)}")
        _check_value(k, v, v)


def _check_value(name: str, value: Any, part: Any) -> None:
    if isinstance(part, str):
        try:
            part.encode("utf-8")
            return
        except UnicodeEncodeError:
            pass
    elif part is None or isinstance(part, (bool, int, float)):
        return
    elif isinstance(part, (list, tuple)):
        for x in part:
            _check_value(name, value, x)
        return
    elif isinstance(part, dict) and all(isinstance(key, str) for key in part):
        for x in part.values():
            _check_value(name, value, x)
        return
    raise UserError(f"parameter {name!r}: got {value!r} (contains {type(part).__name__} {part!r}); allowed: None, "
                     "bool, int, float, UTF-8 str, or lists and str-keyed dicts of these")


def kernel_options() -> dict:
    """papermill options that start each kernel with CurveZMQ transport encryption, when available.

    An unencrypted kernel makes ipykernel log a warning on every start ("Kernel is running over TCP without
    encryption ... Use IPC transport or launch with kernel manager-provisioned CurveZMQ keys"), which buried a
    sweep's progress. jupyter_client >= 8.10 provisions the keys when asked (``transport_encryption="auto"``: only
    for kernelspecs declaring ``supported_encryption: curve``, as ipykernel's does), so the warning goes because its
    cause does; nothing on stderr is filtered, and a real error still shows. Without CurveZMQ in pyzmq, or with an
    older jupyter_client, kernels start as before (and warn as before)."""
    try:
        import zmq
        from jupyter_client.manager import AsyncKernelManager
    except ImportError:
        return {}
    if not zmq.has("curve") or not AsyncKernelManager.class_traits().get("transport_encryption"):
        return {}
    return {"kernel_manager_class": _encrypted_kernel_manager()}


@functools.cache
def _encrypted_kernel_manager() -> type:
    from jupyter_client.manager import AsyncKernelManager
    from traitlets import default

    class EncryptedKernelManager(AsyncKernelManager):
        """nbclient's kernel manager, provisioning CurveZMQ keys for kernels that support them."""

        @default("transport_encryption")
        def _transport_encryption_default(self) -> str:
            return "auto"

    return EncryptedKernelManager


class _ConsoleLines:
    """A file-like papermill writes a kernel's stdout/stderr into: whole lines to the console (``tqdm.write``, so
    a bar in the terminal is redrawn below them), each with ``prefix``; carriage-return redraws keep their last
    state only."""

    def __init__(self, prefix: str = ""):
        self.prefix, self._buf = prefix, ""

    def write(self, text: str) -> int:
        from tqdm.auto import tqdm

        self._buf += text
        *lines, self._buf = self._buf.split("\n")
        for line in lines:
            line = line.rsplit("\r", 1)[-1]
            if line.strip():
                tqdm.write(f"{self.prefix}{line}", file=sys.stderr)
        return len(text)

    def flush(self) -> None:
        pass


def run_notebook(notebook: str | os.PathLike, out_dir: str | os.PathLike, parameters: Optional[dict] = None, *,
                 html: bool = True, progress: bool = False, timeout_s: Optional[float] = None,
                 stream: bool | str = False) -> dict:
    """Execute ``notebook`` with papermill into ``out_dir`` (passed to the notebook as ``run_dir`` when it declares
    one). Returns a status dict; never raises for a failing notebook (the error is recorded in status.json).
    ``stream``: send what the cells print to the console as it comes (a string: the prefix of each line). The
    directory's ``notebook`` lock is held while it runs (another run into it is refused, naming this one)."""
    from brorl_lab.core.rundir import check_writable

    notebook = Path(notebook)
    if not notebook.exists():
        raise UserError(f"notebook: {notebook} does not exist")
    check_writable(out_dir, "out")
    with RunLock.acquire(out_dir, "notebook", what="out"):
        return _run_notebook(notebook, out_dir, parameters, html=html, progress=progress, timeout_s=timeout_s,
                             stream=stream)


def _run_notebook(notebook: Path, out_dir, parameters, *, html, progress, timeout_s, stream) -> dict:
    import papermill as pm

    if timeout_s is not None and (not is_number(timeout_s)
                                  or not timeout_s > 0):
        raise UserError(f"timeout_s: got {timeout_s!r}; allowed: None or a number of seconds > 0")
    check_parameters(notebook, {} if parameters is None else parameters)
    params = dict(parameters or {})
    if "run_dir" in notebook_parameters(notebook):
        params.setdefault("run_dir", str(Path(out_dir).resolve()))
    run = RunDir(out_dir)
    out_nb = run.path / notebook.name
    atomic_write(run.path / "parameters.json", lambda f: f.write(json.dumps(params, indent=2, default=str)), "w")
    run.write_status("running", notebook=str(notebook), parameters=params)
    t0 = time.time()
    status: dict = {"notebook": str(notebook), "run_dir": str(run.path), "parameters": params}
    lines = {}
    if stream is not False:
        prefix = stream if isinstance(stream, str) else ""
        lines = {"stdout_file": _ConsoleLines(prefix), "stderr_file": _ConsoleLines(prefix)}
    try:
        pm.execute_notebook(str(notebook), str(out_nb), parameters=params, kernel_name=KERNEL,
                            progress_bar=progress and live_bars(), cwd=str(notebook.parent.resolve()),
                            execution_timeout=timeout_s, **lines, **kernel_options())
        status["status"] = "finished"
    except BaseException as e:  # noqa: BLE001 - a failed run is recorded, the sweep goes on
        if isinstance(e, KeyboardInterrupt):
            run.write_status("interrupted", **status)
            raise
        status.update(status="failed", error=f"{type(e).__name__}: {_first_line(e)}",
                      traceback=traceback.format_exc(limit=3))
    status["wall_s"] = time.time() - t0
    if html and out_nb.exists():
        status["html"] = _export_html(out_nb)
    run.write_status(**status)
    return status


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[-1] if text else repr(e)


def _export_html(nb_path: Path) -> Optional[str]:
    try:
        import nbformat
        from nbconvert import HTMLExporter

        body, _ = HTMLExporter().from_notebook_node(nbformat.read(nb_path, as_version=4))
        out = nb_path.with_suffix(".html")
        atomic_write(out, lambda f: f.write(body), "w")
        return str(out)
    except Exception as e:  # noqa: BLE001 - the executed notebook is what matters; HTML is a convenience
        return f"html export failed: {e}"


def run_sweep(notebook: str | os.PathLike, grid: Mapping[str, Sequence[Any]] | Iterable[dict], *,  # noqa: C901 - validate, plan, run in parallel and record, one loop the reader follows whole
              out: str | os.PathLike, parallel: int = 1, base: Optional[dict] = None,
              skip_finished: bool = True, progress: bool = True, poll_s: float = 2.0,
              stream: bool = False) -> pd.DataFrame:
    """Run ``notebook`` once per parameter set (a grid mapping or a list of dicts), ``parallel`` at a time.

    Each concurrent run gets ``torch_threads = cores // parallel`` (when the notebook declares it) so runs side
    by side do not thrash. Returns (and writes) the index: one row per run with its status. ``progress`` shows a
    bar over runs whose text names each run in flight with its training step (read every ``poll_s`` seconds from
    the status.json its Trainer writes after every step); in a batch job (no terminal, no kernel) the same as
    plain lines, one per finished run and one a minute. ``stream``: each notebook's printed lines too, prefixed
    with its run. The sweep holds the ``sweep`` lock of ``out`` throughout.
    """

    check_int('parallel', parallel, 1)
    if not is_number(poll_s) or not 0 < poll_s < math.inf:
        raise UserError(f"poll_s: got {poll_s!r}; allowed: a number of seconds > 0")
    if isinstance(grid, Mapping):
        sets = expand_grid(grid)
    elif isinstance(grid, Iterable) and not isinstance(grid, (str, bytes)):
        sets = list(grid)
        for p in sets:
            if not isinstance(p, Mapping):
                raise UserError(f"grid: got an element {p!r}; allowed: a mapping name -> [values] or a list of "
                                 "parameter dicts")
        sets = [dict(p) for p in sets]
    else:
        raise UserError(f"grid: got {type(grid).__name__}; allowed: a mapping name -> [values] or a list of dicts")
    if not sets:
        raise UserError("grid: no parameter sets to run")
    if base is not None and not isinstance(base, Mapping):
        raise UserError(f"base: got {type(base).__name__}; allowed: None or a mapping of fixed parameters")
    declared = notebook_parameters(notebook)
    base = dict(base or {})
    if "torch_threads" in declared and "torch_threads" not in base:
        base["torch_threads"] = max(1, (os.cpu_count() or 1) // parallel)
    runs = [{**base, **p} for p in sets]
    for p in runs:  # validate everything before starting anything
        check_parameters(notebook, p)
    out = Path(out)
    from brorl_lab.core.rundir import check_writable

    check_writable(out, "out")
    with RunLock.acquire(out, "sweep", what="out"):
        return _run_jobs(notebook, runs, out, declared, skip_finished=skip_finished, parallel=parallel,
                         progress=progress, poll_s=poll_s, stream=stream)


def _run_jobs(notebook, runs: list[dict], out: Path, declared: dict, *, skip_finished: bool, parallel: int,
              progress: bool, poll_s: float, stream: bool) -> pd.DataFrame:
    from tqdm.auto import tqdm

    jobs = []
    dirs = sweep_dirs(out, runs)
    for p, d in zip(runs, dirs):
        status = RunDir(d).read_status().get("status")
        if skip_finished and status == "finished":
            continue
        if status != "unknown" and "overwrite" in declared:  # a retry: the notebook's Trainer replaces its old run
            p = {**p, "overwrite": True}
        jobs.append((p, d))
    live = progress and live_bars()
    with ThreadPoolExecutor(max_workers=parallel) as pool:
        futures = {pool.submit(run_notebook, notebook, d, p, stream=f"[{d.name[:24]}] " if stream else False): d
                   for p, d in jobs}
        pending = set(futures)
        said, finished = time.monotonic(), 0
        with tqdm(total=len(futures), desc=f"sweep {out.name}", unit="run", disable=not live) as bar:
            while pending:  # the runs in flight show their step counts, read from their status.json
                done, pending = wait(pending, timeout=poll_s, return_when=FIRST_COMPLETED)
                finished += len(done)
                bar.update(len(done))
                bar.set_postfix_str(progress_text([futures[f] for f in pending]), refresh=True)
                if progress and not live and (done or time.monotonic() - said > 60):  # a batch log: plain lines
                    said = time.monotonic()
                    print(f"sweep {out.name}: {finished}/{len(futures)} runs done"
                          + (f"; {progress_text([futures[f] for f in pending])}" if pending else ""),
                          file=sys.stderr, flush=True)
    index = write_index(out, runs, dirs)
    write_sweep_report(out, index)
    return index


def write_sweep_report(out: Path, index: pd.DataFrame) -> Optional[Path]:
    """``out/report.html``: the sweep's index and every training run its notebooks wrote (config.yaml with
    metrics.parquet below a run's directory), overlaid; a sweep of notebooks that train nothing gets the index
    alone. A report that fails is said on stderr; the sweep's results stand."""
    from brorl_lab.lab.report import REPORT_FILE, try_write_report

    dirs = [out / run for run in index["run"] if (out / run).is_dir()]
    return try_write_report(dirs or [out], out / REPORT_FILE, index=index, title=f"Sweep {out.name}",
                            allow_empty=True)


def run_progress(run_dir: str | os.PathLike) -> Optional[tuple[int, int]]:
    """(step, steps) of the Trainer running in ``run_dir`` (its status.json, or one in a directory below it, as a
    notebook that names its own run inside the sweep's run_dir writes it); None before its first step is known."""
    run_dir = Path(run_dir)
    for p in [run_dir / "status.json", *sorted(run_dir.glob("*/status.json"))]:
        try:
            st = json.loads(p.read_text())
        except (OSError, ValueError):  # not written yet; atomic writes never leave half a file
            continue
        if isinstance(st, dict) and is_int(st.get("step")) and is_int(st.get("steps")):
            return int(st["step"]), int(st["steps"])
    return None


def progress_text(run_dirs: Sequence[Path]) -> str:
    """``name: step/steps`` for each run in flight (what the sweep bar shows after its run count)."""
    parts = []
    for d in run_dirs:
        at = run_progress(d)
        parts.append(f"{d.name[:24]}: " + (f"step {at[0]}/{at[1]}" if at else "starting"))
    return ", ".join(parts)


def sweep_dirs(out: Path, runs: Sequence[dict]) -> list[Path]:
    """Each run's directory: :func:`run_id` of its parameters (torch_threads aside), the swept ones first."""
    swept = [k for k in dict.fromkeys(k for p in runs for k in p)
             if len({json.dumps(p.get(k), sort_keys=True, default=str) for p in runs}) > 1]
    return [out / run_id({k: v for k, v in p.items() if k != "torch_threads"}, first=swept) for p in runs]


def write_index(out: Path, runs: Sequence[dict], dirs: Sequence[Path]) -> pd.DataFrame:
    rows = []
    for p, d in zip(runs, dirs):
        st = RunDir(d).read_status()
        rows.append({"run": d.name, "status": st.get("status"), "error": st.get("error"), "wall_s": st.get("wall_s"),
                     **{f"param.{k}": (str(v) if isinstance(v, (list, dict)) else v) for k, v in p.items()}})
    df = pd.DataFrame(rows)
    atomic_write(out / "index.parquet", lambda f: df.to_parquet(f, index=False))
    return df


def iso_compute_plan(samples_per_step: int, n_values: Sequence[int]) -> pd.DataFrame:
    """(N, prompts_per_step) pairs with the same samples per step, as the follow-up literature compares them.

    Pairs where N does not divide the budget are dropped (and listed with a reason), never rounded silently.
    """
    check_int('samples_per_step', samples_per_step, 1)
    rows = []
    for n in n_values:
        if not is_int(n) or n < 1:
            raise UserError(f"n_values: got {n!r}; allowed: integers >= 1")
        ok = samples_per_step % n == 0
        rows.append({"rollouts_per_prompt": n, "prompts_per_step": samples_per_step // n if ok else None,
                     "samples_per_step": samples_per_step if ok else None,
                     "note": "" if ok else f"N={n} does not divide {samples_per_step}"})
    return pd.DataFrame(rows)


ISO_COMPUTE_NOTEBOOK = "05_iso_compute.ipynb"


def run_iso_compute(samples_per_step: int, n_values: Sequence[int], *, seeds: Sequence[int] = (0, 1, 2),
                    out: str | os.PathLike, notebook: str | os.PathLike | None = None, parallel: int = 1,
                    params: Optional[dict] = None, progress: bool = True, stream: bool = False) -> pd.DataFrame:
    """The iso-compute sweep over N: every (N, prompts per step) pair of :func:`iso_compute_plan` with the same
    ``samples_per_step``, for each seed, as one run of ``notebook`` (default notebooks/05_iso_compute.ipynb; fixed
    ``params`` such as steps or eval_k) through :func:`run_sweep`. Resumable: finished runs are skipped and a
    partial run resumes from its checkpoint. Returns the sweep index; read the results with
    ``analysis.iso_compute_summary(load_runs(out))``. Pairs where N does not divide the budget are an error."""
    from brorl_lab.core.paths import NOTEBOOK_DIR

    plan = iso_compute_plan(samples_per_step, n_values)
    bad = plan[plan["prompts_per_step"].isna()]
    if not bad.empty:
        raise UserError(f"n_values: {'; '.join(bad['note'])}; allowed: divisors of samples_per_step")
    if not seeds or any(not is_int(s) or s < 0 for s in seeds):
        raise UserError(f"seeds: got {list(seeds)!r}; allowed: a non-empty list of integers >= 0")
    grid = [{"rollouts_per_prompt": int(r.rollouts_per_prompt), "prompts_per_step": int(r.prompts_per_step),
             "seed": int(s)} for r in plan.itertuples() for s in seeds]
    nb = Path(notebook) if notebook else NOTEBOOK_DIR / ISO_COMPUTE_NOTEBOOK
    return run_sweep(nb, grid, out=out, parallel=parallel, base=params, progress=progress, stream=stream)
