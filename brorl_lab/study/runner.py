"""ONE runner for the flagship study (issue 42): a study is declared as data, :class:`Study`, and run by one function,
:func:`run_study`. The CLI (``paid``, ``demo``), notebook 02 and ``make demo`` only build a Study and call it::

    study = preset("learned")                            # the shipped full-size design (or miniature("learned"))
    result = run_study(study, "runs/paid_learned", jobs=2, threads=1)
    print(result.text)                                   # every pre-declared reading, in words
    result.reading                                       # the study's ONE reading: study.reading(headline)

What :func:`run_study` does, in order:

1. takes the run's start (:func:`brorl_lab.study.results.start_of_run`: UTC time and the commit, *before* any arm
   runs) and writes the declaration (:meth:`Study.declaration`: design, budget, seeds, the reading and its
   thresholds) to ``out/declaration.json``; a run meant for shipped results (``study.full_size`` or ``ship=True``)
   refuses to start unless that file is committed and the tracked tree is clean
   (:func:`~brorl_lab.study.results.require_preregistered`: one line, exit 2 on the CLI, saying what to commit);
2. runs the arm x seed grid (:func:`brorl_lab.study.paid.run_paid`: jobs side by side, Ray, resume, progress):
   each arm's N (``rollouts_per_prompt``) and ``prompts_per_step`` come from its Config, built from the recipe's arm
   table (:data:`brorl_lab.study.recipe.ARM_TABLE`);
3. reads every pre-declared reading (:func:`brorl_lab.study.paid.paid_report`; the mechanism against its no-training
   control when declared) and writes the per-seed files (points.csv, mechanism.csv, metrics.parquet), verdict.json
   and verdict.txt into ``out``, each with its provenance (started_at, the commit at the start, the declaration);
4. returns a :class:`StudyResult`: the report, its text and the one reading.

The study's one reading is :func:`brorl_lab.study.paid.headline_reading` (the shipped flagship files were read
with it): the paired 95% t interval of BroRL - ProRL held-out pass@1 at the budget in generated samples, above 0,
below 0, or containing 0. :func:`reading_of_points` gives it from a shipped or produced ``points.csv`` alone, the
one path by which the CLI (``paid --read``), the notebook and the demo read a folder.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import pandas as pd

from brorl_lab.core.console import live_bars
from brorl_lab.core.paths import NOTEBOOK_DIR, repo_relative
from brorl_lab.core.validation import UserError, check_seeds
from brorl_lab.study import paid
from brorl_lab.study.recipe import ARM_TABLE, arm_options, recipe_config, resolve_experiment_model
from brorl_lab.study.results import (
    declaration_record,
    provenance,
    require_preregistered,
    start_of_run,
    write_declaration,
    write_provenance,
)

HEADLINE_AXIS = "cum_samples"  # the reading's basis: equal generated samples (BroRL's compute unit)
#: The reading's thresholds, declared with it: the interval's level and the value it is read against.
READING_THRESHOLDS = {"interval": "paired t over seeds", "level": 0.95, "against": 0.0,
                      "basis": f"{HEADLINE_AXIS} at the budget (the last grid mark)"}
SHIPPED_FIGURES = NOTEBOOK_DIR / "figures"  # where the shipped per-seed files live: paid_<name>_points.csv


@dataclass(frozen=True)
class Study:
    """One study of the flagship family, as data. ``arms`` names rows of the recipe's arm table
    (:data:`~brorl_lab.study.recipe.ARM_TABLE`: each arm's ``rollouts_per_prompt`` and ``prompts_per_step``);
    ``budget`` is each arm's generated samples, ``points`` the grid's thresholds (``budget * k / points``);
    ``overrides`` are recipe fields (eval_prompts, eval_samples, tasks, lr); ``takeoff_level`` /
    ``takeoff_family`` declare the takeoff race; ``mechanism`` the mechanism against its control; ``full_size``
    marks a preset meant for shipped results (pre-registration enforced)."""

    name: str
    model: str
    seeds: tuple[int, ...]
    budget: int
    points: int = paid.GRID_POINTS
    arms: tuple[str, ...] = ("prorl", "brorl", "middle")
    overrides: Mapping = field(default_factory=dict)
    brorl_lr_factor: float = 1.0
    takeoff_level: Optional[float] = None
    takeoff_family: Optional[str] = None
    mechanism: bool = False
    full_size: bool = False
    reading: Callable[[Mapping], str] = paid.headline_reading
    thresholds: Mapping = field(default_factory=lambda: dict(READING_THRESHOLDS))
    arm_table: Mapping = field(default_factory=lambda: dict(ARM_TABLE))  # a test passes a smaller one

    def __post_init__(self):
        object.__setattr__(self, "seeds", tuple(check_seeds(list(self.seeds))))
        unknown = [a for a in self.arms if a not in self.arm_table]
        if unknown or not {"prorl", "brorl"} <= set(self.arms):
            raise UserError(f"arms: got {list(self.arms)}; allowed: 'prorl', 'brorl' and optionally 'middle' (rows of "
                            "study.recipe.ARM_TABLE)")
        if not (isinstance(self.budget, int) and self.budget >= 1):
            raise UserError(f"budget: got {self.budget!r}; allowed: an integer >= 1 (generated samples per arm)")

    @property
    def metric(self) -> str:
        return f"eval/{self.takeoff_family}/pass@1" if self.takeoff_family else paid.METRIC

    def configs(self, *, threads: Optional[int] = None) -> dict:
        """{arm: Config}: the recipe at the branch point's lr (or ``overrides['lr']``), each arm's N and prompts per
        step from :data:`ARM_TABLE`, paid ``budget`` generated samples (:func:`brorl_lab.study.paid.paid_arm_configs`)."""
        over = dict(self.overrides)
        lr = over.pop("lr", None)
        lr = paid.plateau_lr(self.model) if lr is None else lr
        base = recipe_config(model=self.model, lr=lr, **({"torch_threads": threads} if threads else {}), **over)
        return paid.paid_arm_configs(base, budget=self.budget, points=self.points, middle="middle" in self.arms,
                                     lr_factor=self.brorl_lr_factor, **arm_options(self.arm_table,
                                                                                    "middle" in self.arms))

    def declaration(self) -> dict:
        """The study as declared before the run (:func:`brorl_lab.study.results.write_declaration`): plain JSON."""
        arms = {a: {k: getattr(c, k) for k in ("rollouts_per_prompt", "prompts_per_step", "lr", "steps",
                                                         "eval_prompts", "eval_samples", "tasks", "eval_at_samples")}
                for a, c in self.configs().items()}
        reading = self.reading
        return {"study": self.name, "branch_point": self.model, "checkpoint": repo_relative(
                    Path(resolve_experiment_model(self.model))),
                "arms": arms, "budget": {"generated_samples_per_arm": self.budget, "grid_points": self.points},
                "seeds": list(self.seeds), "reading": {"function": f"{reading.__module__}.{reading.__qualname__}",
                                                       "thresholds": dict(self.thresholds)},
                "collapse_rule": dict(paid.COLLAPSE), "metric": self.metric,
                "takeoff_race": ({"level": self.takeoff_level, "family": self.takeoff_family}
                                 if self.takeoff_level is not None else None),
                "mechanism": ({"prompts": paid.MECHANISM_PROMPTS, "draws": paid.MECHANISM_DRAWS,
                               "reach": "only N=512", "control_draw_seed": paid.CONTROL_DRAW_SEED}
                              if self.mechanism else None),
                "brorl_lr_factor": self.brorl_lr_factor, "full_size": self.full_size}


def write_study_files(out: Path, files: list, record: Mapping, report: Mapping, text: str) -> list:
    """``record`` beside every per-seed file of ``files``, then ``out/verdict.json`` (the record and every reading)
    and ``out/verdict.txt`` (the text); returns every path written."""
    for path in files:  # every per-seed file carries its provenance: shippable as it is
        write_provenance(path, record)
    (out / "verdict.json").write_text(json.dumps({"provenance": dict(record), **report}, indent=1, default=float))
    (out / "verdict.txt").write_text(text + "\n")
    return [*files, out / "verdict.json", out / "verdict.txt"]


# ---- the presets ------------------------------------------------------------------------------------------------------
#: The shipped full-size designs (docs/results/flagship.md's commands): the learned plateau (20 paired seeds, the
#: middle arm and the mechanism) and the takeoff base (10 seeds, the race to +10 points on spell_backward).
FULL_BUDGET = 131_072  # 16 BroRL steps of its samples per step (512 x 16)
TAKEOFF_OVERRIDES = {"lr": 3e-4, "tasks": ["spell_backward"], "eval_prompts": 200, "eval_samples": 8}
PRESETS = {
    "learned": Study("learned", "learned", tuple(range(20)), FULL_BUDGET, mechanism=True, full_size=True),
    "takeoff": Study("takeoff", "takeoff", tuple(range(10)), FULL_BUDGET, arms=("prorl", "brorl"),
                     overrides=TAKEOFF_OVERRIDES, takeoff_level=paid.TAKEOFF_LEVEL, takeoff_family="spell_backward",
                     full_size=True),
}
#: The miniature (what notebook 02 and ``make demo`` run by default): the same arms and recipe from the same branch
#: points, an eighth of the budget (2 grid marks), 3 paired seeds and a lighter evaluation. Sized to take about 3
#: minutes on 2 CPU cores for both branch points; it can only see large gaps, and says so.
MINIATURE = dict(budget=FULL_BUDGET // 8, points=2, seeds=(0, 1, 2), eval_prompts=32, eval_samples=4)


def preset(name: str) -> Study:
    """The full-size study ``name`` ('learned' or 'takeoff')."""
    if name not in PRESETS:
        raise UserError(f"study: got {name!r}; allowed: {', '.join(PRESETS)}")
    return PRESETS[name]


def miniature(name: str, **changes) -> Study:
    """The full-size study ``name`` at the miniature's sizes (:data:`MINIATURE`; ``changes`` override any field):
    no middle arm, no mechanism, not meant for shipping."""
    full = preset(name)
    m = {**MINIATURE, **changes}
    over = {**full.overrides, "eval_prompts": m.pop("eval_prompts"), "eval_samples": m.pop("eval_samples")}
    return dataclasses.replace(full, name=f"{name}_miniature", arms=("prorl", "brorl"), mechanism=False,
                               full_size=False, overrides=over, **m)


# ---- the run ------------------------------------------------------------------------------------------------------------
@dataclass
class StudyResult:
    """What :func:`run_study` returns: the study, its folder, whether every arm spent its budget, the report
    (:func:`brorl_lab.study.paid.paid_report`'s keys, the mechanism's summary under ``mechanism``), its text, the
    one reading, the files written and the provenance record they carry."""

    study: Study
    out: Path
    finished: bool
    report: dict
    text: str
    reading: str
    files: list
    record: dict

    def __repr__(self) -> str:
        state = "finished" if self.finished else "unfinished"
        return f"StudyResult({getattr(self.study, 'name', 'floor')!r}, {state}: {self.reading})"


def run_study(study: Study, out: str | Path, *, jobs: Optional[int] = 1, ray: Optional[str] = None,
              threads: Optional[int] = None, progress: bool = True, ship: bool = False,
              command: Optional[str] = None, ledger: Optional[str | Path] = None) -> StudyResult:
    """Run ``study`` into ``out`` (module docstring): declaration (enforced for ``study.full_size`` or ``ship``),
    the arm x seed grid (``out/arms/<arm>_s<seed>``, resumable; ``jobs`` at a time, or Ray tasks at ``ray``, at
    ``threads`` torch threads each), the per-seed files with provenance, the readings. An unfinished grid (Ctrl-C,
    a stop) returns ``finished=False`` with nothing but the arms' checkpoints written: the same call resumes.
    ``ledger``: a folder to commit (e.g. notebooks/figures/paid/<name>) that holds the declaration and one small
    file per finished arm x seed (:func:`run_grid`), so a shipped run can be declared in git although ``out`` (the
    checkpoints) is not, and resumes on another clone from the committed files."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)  # with a ledger every run may be read back and nothing made it
    arms = study.configs(threads=threads)
    grid = run_grid(study.name, arms, seeds=study.seeds, out=out, declaration=study.declaration(),
                    declare_in=ledger, ledger=ledger, ship=ship or study.full_size, jobs=jobs, ray=ray,
                    threads=threads, progress=progress)
    df, start, declared = grid.metrics, grid.start, grid.declared
    if not grid.finished:
        return StudyResult(study, out, False, {}, "stopped before every arm spent its budget: run the same command "
                           "again to resume", "not read: unfinished", [], {})
    report = paid.paid_report(df, budget=study.budget, points=study.points, metric=study.metric,
                              takeoff_level=study.takeoff_level)
    tables = {"points": report.pop("points")}
    if study.mechanism:  # the mechanism against its no-training re-draw (128 prompts x 512 draws per policy)
        import torch

        from brorl_lab.lab.jobs import physical_cores

        torch.set_num_threads(physical_cores())  # measured here, after the runs: every core
        gaps = paid.measure_mechanism(arms, seeds=study.seeds, root=out / "arms",
                                      branch=resolve_experiment_model(study.model))
        tables["mechanism"] = gaps
        report["mechanism"] = paid.control_summary(gaps).to_dict(orient="records")
    df.to_parquet(out / "metrics.parquet")
    files = paid.write_per_seed(out, tables) + [out / "metrics.parquet"]
    record = provenance(command or f"brorl_lab.study.runner.run_study({study.name!r})",
                        {"branch": resolve_experiment_model(study.model)}, grid.wall_s,
                        commit=start["commit"], started_at=start["started_at"], declaration=declared,
                        seeds=list(study.seeds), budget=study.budget, lr=arms["brorl"].lr / study.brorl_lr_factor,
                        collapse_rule=paid.COLLAPSE, arms={a: f"{c.rollouts_per_prompt} x {c.prompts_per_step}"
                                                           for a, c in arms.items()})
    text = paid.paid_text(report)
    return StudyResult(study, out, True, report, text, study.reading(report["headline"]),
                       write_study_files(out, files, record, report, text), record)


# ---- any grid of arms given whole (the frontier, the allocation study) ----------------------------------------------
@dataclass
class GridRun:
    """What :func:`run_grid` returns: the long metrics table of every arm x seed that ran or was read back
    (:func:`brorl_lab.study.arms.label_arm`'s columns), whether every run finished, the run's start
    (:func:`~brorl_lab.study.results.start_of_run`), its declaration record and its wall time."""

    metrics: pd.DataFrame
    finished: bool
    start: dict
    declared: dict
    wall_s: float
    ledger: Optional[Path] = None


def config_fingerprint(cfg) -> str:
    """sha256 (16 hex) of a run's config without the fields that do not change its numbers (where it runs, its
    threads, its name): two runs with one fingerprint and one seed compute the same numbers. A model inside the
    checkout counts by its repo-relative path (``data/takeoff_base``), so the same run fingerprints alike from any
    clone, on any machine: a ledger resumes wherever it is checked out."""
    import hashlib

    from brorl_lab.core.paths import repo_relative
    from brorl_lab.study.recipe import IGNORED_FIELDS

    keep = {k: v for k, v in cfg.to_dict().items() if k not in (*IGNORED_FIELDS, "run_name")}
    if isinstance(keep.get("model"), str) and Path(keep["model"]).is_absolute():
        keep["model"] = repo_relative(keep["model"])
    return hashlib.sha256(json.dumps(keep, sort_keys=True, default=str).encode()).hexdigest()[:16]


def ledger_file(ledger: Path, arm: str, seed: int) -> Path:
    """Where one finished arm x seed run's metrics are kept: ``ledger/<arm>_s<seed>.parquet`` (a small file, meant to
    be committed as soon as it is written, so a study longer than a session resumes on any machine)."""
    return Path(ledger) / f"{arm}_s{seed}.parquet"


def run_into_ledger(cfg, path: str, record: Mapping, arm: str) -> tuple:
    """One job of :func:`run_grid`: :func:`brorl_lab.study.arms.run_arm` (resumes from its checkpoint), then, when it
    finished, its labelled metrics written to the ledger file ``path`` with its provenance (``record`` plus this
    run's wall time and config fingerprint). Returns run_arm's ``(metrics, finished)``."""
    from brorl_lab.core.rundir import atomic_write
    from brorl_lab.study.arms import label_arm, run_arm

    t0 = time.perf_counter()
    df, done = run_arm(cfg, progress=False)
    if done:
        table = label_arm(df, arm, cfg.seed, cfg)
        atomic_write(Path(path), lambda f: table.to_parquet(f, index=False))
        write_provenance(path, {**record, "wall_s": round(time.perf_counter() - t0, 1), "arm": arm, "seed": cfg.seed,
                                "config": config_fingerprint(cfg), "lr": cfg.lr,
                                "shape": f"{cfg.rollouts_per_prompt} x {cfg.prompts_per_step}"})
    return df, done


def read_ledger(ledger: Path, arm: str, seed: int, cfg) -> Optional[pd.DataFrame]:
    """The ledger's table for ``arm`` x ``seed`` when it was written by a run of ``cfg`` (same fingerprint); None when
    there is none. A ledger file of another config is an error: committed results are never overwritten."""
    from brorl_lab.study.results import read_provenance

    path = ledger_file(ledger, arm, seed)
    if not path.is_file():
        return None
    got = read_provenance(path).get("config")
    if got != config_fingerprint(cfg):
        raise UserError(f"ledger: {repo_relative(path)} holds a run of another config (fingerprint {got}, asked "
                        f"{config_fingerprint(cfg)}); allowed: the same study settings, or another ledger folder")
    return pd.read_parquet(path)


def run_grid(name: str, arms: Mapping, *, seeds, out: str | Path, declaration: Mapping,
             declare_in: Optional[str | Path] = None, ledger: Optional[str | Path] = None, ship: bool = False,
             checkpoints: Optional[Mapping] = None, jobs: Optional[int] = 1, ray: Optional[str] = None,
             threads: Optional[int] = None, progress: bool = True, command: Optional[str] = None) -> GridRun:
    """Run every arm of ``arms`` ({arm: Config}, each whole: N, prompts per step, lr, budget, marks, any field) for
    every seed, the one grid machinery every study shares:

    1. the start (commit and UTC time) before any arm runs; ``declaration`` written to
       ``declare_in/declaration.json`` (default ``out``); a run meant for shipped results (``ship``) refuses to start
       unless that file is committed as written and the tracked tree is clean;
    2. with a ``ledger`` folder: every arm x seed already there (same config fingerprint) is read back, not run; each
       run that finishes writes ``ledger/<arm>_s<seed>.parquet`` with its provenance at once (commit them as they
       come: a study longer than a session resumes anywhere);
    3. the rest as independent jobs in ``out/arms/<arm>_s<seed>`` (:func:`brorl_lab.study.arms.run_plans`'s
       machinery: ``jobs`` at a time or Ray, resumable from checkpoints, a heartbeat line every 15 s).

    Returns a :class:`GridRun` (``finished`` False after a stop: the same call resumes)."""
    from brorl_lab.lab.jobs import Job, plan_workers, run_jobs
    from brorl_lab.study.arms import plan_arms, run_plans

    out = Path(out)
    start = start_of_run()
    t0 = time.perf_counter()
    decl_path = write_declaration(Path(declare_in) if declare_in else out, declaration)
    declared = require_preregistered(decl_path) if ship else declaration_record(decl_path)
    plan = plan_arms(arms, seeds=seeds, root=out / "arms")
    runs = len(plan)
    if ledger is None:
        with heartbeat(out / "arms", name, runs=runs, enabled=progress and not live_bars()):
            df = run_plans({None: plan}, jobs=jobs, ray=ray, threads=threads, progress=progress)[None]
        done = df["run"].nunique() == runs if len(df) else False
        finished = bool(done and all(c.budget_spent(int(df.loc[df["run"] == c.run_name, "cum_samples"].max()))
                                     or df.loc[df["run"] == c.run_name, "step"].max() >= c.steps for _, _, c in plan))
        return GridRun(df, finished, start, declared, time.perf_counter() - t0)
    ledger = Path(ledger)
    ledger.mkdir(parents=True, exist_ok=True)
    have = {(a, s): read_ledger(ledger, a, s, c) for a, s, c in plan}
    todo = [(a, s, c) for a, s, c in plan if have[(a, s)] is None]
    record = provenance(command or f"brorl_lab.study.runner.run_grid({name!r})", dict(checkpoints or {}), 0.0,
                        commit=start["commit"], started_at=start["started_at"], declaration=declared, study=name)
    workers, threads = plan_workers(jobs, threads, ray)
    jobs_ = [Job(run_into_ledger, (c.replace(torch_threads=threads), str(ledger_file(ledger, a, s)), record, a),
                 name=c.run_name, run_dir=Path(c.run_dir) / c.run_name) for a, s, c in todo]
    if todo:
        print(f"{name}: {runs - len(todo)} of {runs} arm x seed runs read from {repo_relative(ledger)}; "
              f"running {len(todo)}", flush=True)
    with heartbeat(out / "arms", name, runs=runs, enabled=progress and not live_bars()):
        res = run_jobs(jobs_, workers=workers, threads=threads, ray=ray, progress=progress, desc=name,
                       stop_if=lambda r: not r[1])
    for (a, s, c), r in zip(todo, res):
        if isinstance(r, tuple) and r[1]:
            have[(a, s)] = pd.read_parquet(ledger_file(ledger, a, s))
    frames = [have[(a, s)] for a, s, _ in plan if have[(a, s)] is not None]
    df = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    return GridRun(df, len(frames) == runs, start, declared, time.perf_counter() - t0, ledger)


HEARTBEAT_S = 15.0  # a plain progress line at least this often where no bar renders (papermill, a log file)
HEARTBEAT_ENV = "BRORL_HEARTBEAT_S"  # overrides HEARTBEAT_S (seconds), also in a kernel papermill starts


@contextlib.contextmanager
def heartbeat(root: Path, name: str, *, runs: int, enabled: bool, every_s: Optional[float] = None,
              count: Optional[Callable[[], int]] = None, unit: str = "arm runs") -> Iterator[None]:
    """While the body runs, print one plain line every ``every_s`` seconds: the study, the time so far, the ``unit``
    finished of ``runs`` and each run in flight at its step (read from the run directories under ``root``; a study
    whose units are not run directories passes ``count``, a function giving the units finished so far). For
    consoles where a tqdm bar shows nothing: a notebook under papermill (``BRORL_PLAIN_PROGRESS=1``), a log file;
    worker processes' own lines do not reach a kernel's output."""
    if not enabled:
        yield
        return
    from brorl_lab.core.rundir import RunDir
    from brorl_lab.lab.sweep import progress_text

    every_s = every_s or float(os.environ.get(HEARTBEAT_ENV) or HEARTBEAT_S)
    stop, t0 = threading.Event(), time.monotonic()

    print(f"{time.strftime('%H:%M:%S')} {name}: {runs} {unit} to run or read back (a line every {every_s:g} s)",
          flush=True)

    def beat() -> None:
        while not stop.wait(every_s):
            if count is not None:
                done, busy = count(), []
            else:
                dirs = sorted(d for d in Path(root).glob("*_s*") if d.is_dir())
                finished = [d for d in dirs if RunDir(d).read_status().get("status") == "finished"]
                done, busy = len(finished), [d for d in dirs if d not in finished]
            print(f"{time.strftime('%H:%M:%S')} {name}: {time.monotonic() - t0:.0f} s, {done} of {runs} {unit} "
                  f"finished" + (f"; {progress_text(busy)}" if busy else ""), flush=True)

    thread = threading.Thread(target=beat, name=f"heartbeat-{name}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=5)


# ---- reading a folder: the one path the CLI, the notebook and the demo share -------------------------------------------
def headline_of_points(points: pd.DataFrame) -> dict:
    """The headline (BroRL - ProRL at the last generated-samples mark: :func:`brorl_lab.study.paid.paired_at_grid`)
    from a per-seed points table (``points.csv``: arm, seed, mark, value, axis, ...)."""
    pts = points[points["axis"] == HEADLINE_AXIS] if "axis" in points else points
    grid = paid.paired_at_grid(pts)
    return grid.iloc[-1].to_dict() if len(grid) else {}


def reading_of_points(path: str | Path, reading: Callable[[Mapping], str] = paid.headline_reading) -> str:
    """The study's reading of a per-seed ``points.csv`` (a run's, or a shipped ``paid_<name>_points.csv``)."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"points: {path} is not a file; allowed: a points.csv a study run wrote, or "
                        f"{repo_relative(SHIPPED_FIGURES)}/paid_<name>_points.csv")
    return reading(headline_of_points(pd.read_csv(path)))


def shipped_points(name: str) -> Path:
    """The shipped full-size per-seed file of study ``name`` ('learned', 'takeoff')."""
    return SHIPPED_FIGURES / f"paid_{name}_points.csv"


def headline_line(points: str | Path) -> str:
    """One line: the headline gap with its interval (points of held-out pass@1) and the reading, from a points file."""
    h = headline_of_points(pd.read_csv(points))
    if not h:
        return "no paired seeds"
    ci = (f"[{100 * h['lo']:+.2f}, {100 * h['hi']:+.2f}]" if math.isfinite(h["lo"]) else "[no interval]")
    return (f"BroRL - ProRL {100 * h['gap']:+.2f} {ci} points at {h['mark']:,.0f} generated samples, {int(h['n'])} "
            f"paired seeds: {paid.headline_reading(h)}")


def live_and_shipped(live: Mapping[str, str | Path], shipped: Optional[Mapping[str, str | Path]] = None
                     ) -> pd.DataFrame:
    """Per-seed headline gaps (points of pass@1) of live runs and of the shipped full-size files side by side: one
    row per study, source ('live' / 'shipped') and seed, with the budget the gap was read at."""
    shipped = shipped if shipped is not None else {k: shipped_points(k.replace("_miniature", "")) for k in live}
    rows = []
    for source, files in (("live", live), ("shipped", shipped)):
        for name, path in files.items():
            h = headline_of_points(pd.read_csv(path))
            for seed, gap in (h.get("per_seed") or {}).items():
                rows.append({"study": name.replace("_miniature", ""), "source": source, "seed": int(seed),
                             "gap_points": 100 * float(gap), "budget": h["mark"]})
    return pd.DataFrame(rows)


def live_and_shipped_figure(table: pd.DataFrame, *, title: Optional[str] = None):
    """A dot per seed (BroRL - ProRL at the budget, points), live and shipped side by side per study, each labelled."""
    import plotly.graph_objects as go

    fig = go.Figure()
    colors = {"live": "rgba(214,39,40,0.75)", "shipped": "rgba(31,119,180,0.6)"}
    for source, g in table.groupby("source", sort=False):
        xs = [f"{s} ({source}, {b:,.0f} samples)" for s, b in zip(g["study"], g["budget"])]
        fig.add_trace(go.Scatter(name=f"{source}: one seed", x=xs, y=g["gap_points"], mode="markers",
                                 marker=dict(color=colors.get(source, "grey"), size=8),
                                 text=[f"{source} seed {s}" for s in g["seed"]], hoverinfo="text+y"))
    fig.add_hline(y=0, line_color="grey", line_width=1)
    fig.update_layout(title_text=title or "BroRL - ProRL held-out pass@1 per seed at the budget: live miniature "
                      "beside the shipped full-size runs", yaxis_title="points of pass@1", height=420,
                      legend=dict(orientation="h", y=-0.25))
    return fig



# ---- the floor (docs/results/floor.md): the superseded design, kept as a named setting with its own command --------
#: The floor's design as shipped (notebook 02 before issue 42; `python -m brorl_lab scaling`): from data/plateau_model,
#: arms on a shared grid of *nominal* samples (steps x prompts x N), read by its own rule fixed before that run
#: (study.revival.brorl_revives). The arms' N and prompts per step are the recipe's arm table's.
FLOOR = dict(model="plateau", steps=8, eval_every=1, seeds=(0, 1, 2), optimizer_steps_per_step=2, lr=3e-4,
             lr_scaling="none", lr_warmup_steps=0, reward="correct", eval_prompts=64, eval_samples=64,
             eval_k=[1, 8, 64], mechanism_prompts=64, mechanism_draws=512, measure_mechanism=True)
FLOOR_FULL_SEEDS = 8  # --full-size: 8 paired seeds and the middle arm


def run_floor(out: str | Path, *, settings: Optional[Mapping] = None, middle_seeds=None, middle: bool = False,
              arm_table: Optional[Mapping] = None, jobs: Optional[int] = 1, ray: Optional[str] = None,
              threads: Optional[int] = None, progress: bool = True, command: Optional[str] = None) -> StudyResult:
    """The floor study (:data:`FLOOR`, ``settings`` overriding it) into ``out``: the arms of
    :func:`brorl_lab.study.arms.arm_configs` (N and prompts per step from ``arm_table``, default the recipe's) for
    every seed in ``out/arms`` (resumable), the mechanism on ``mechanism_prompts`` training prompts at
    ``mechanism_draws`` draws (condition 4), then its one reading :func:`brorl_lab.study.revival.revival_report`
    (``revives``) and text; metrics.parquet, verdict.json and verdict.txt with their provenance."""
    from brorl_lab.core.models import load_policy
    from brorl_lab.rl.steps import sample_prompts
    from brorl_lab.study import arms as arms_
    from brorl_lab.study import mechanism
    from brorl_lab.study import revival as R
    from brorl_lab.study.compare import ARMS

    unknown = sorted(set(settings or {}) - set(FLOOR) - {"tasks"})
    if unknown:
        raise UserError(f"settings: unknown {', '.join(unknown)}; allowed: {', '.join(sorted(FLOOR))}, tasks")
    out, s = Path(out), {**FLOOR, **(settings or {})}
    start, t0 = start_of_run(), time.perf_counter()
    opts = {**arm_options(arm_table or ARM_TABLE, middle), "lr_scaling": s["lr_scaling"]}
    base = recipe_config(model=s["model"], steps=s["steps"], eval_every=s["eval_every"],
                         checkpoint_every=s["eval_every"], optimizer_steps_per_step=s["optimizer_steps_per_step"],
                         lr=s["lr"], lr_warmup_steps=s["lr_warmup_steps"], reward=s["reward"],
                         eval_prompts=s["eval_prompts"], eval_samples=s["eval_samples"], eval_k=list(s["eval_k"]),
                         **({"tasks": s["tasks"]} if s.get("tasks") else {}),
                         **({"torch_threads": threads} if threads else {}))
    seeds = list(check_seeds(list(s["seeds"])))
    planned = arms_.arm_configs(base, **opts)
    with heartbeat(out / "arms", "floor", runs=len(planned) * len(seeds), enabled=progress and not live_bars()):
        df = arms_.run_rollout_scaling(base, seeds=seeds, root=out / "arms", progress=progress,
                                       middle_seeds=middle_seeds, jobs=jobs, ray=ray, threads=threads, **opts)
    steps = df.groupby("arm")["step"].max().to_dict() if len(df) else {}
    if any(steps.get(a) != c.steps for a, c in planned.items()):
        return StudyResult(None, out, False, {}, "stopped before every arm finished: run the same command again to "
                           "resume", "not read: unfinished", [], {})
    mech = None
    if s["measure_mechanism"]:
        items = sample_prompts(base.tasks, s["mechanism_prompts"], seed=paid.MECHANISM_ITEM_SEED)

        def rates(model_dir) -> pd.DataFrame:
            policy, tok = load_policy(str(model_dir))
            return mechanism.prompt_pass_rates(policy, tok, items, base, n_draws=s["mechanism_draws"],
                                               n_small=opts["n_small"])

        before = rates(base.model)
        mech = R.mechanism_gaps(before, {seed: {a: rates(out / "arms" / f"{a}_s{seed}") for a in ARMS}
                                         for seed in seeds})
    report = R.revival_report(df, mechanism=mech)
    text = R.revival_text(report)
    df.to_parquet(out / "metrics.parquet")
    record = provenance(command or "brorl_lab.study.runner.run_floor()", {"branch": base.model},
                        time.perf_counter() - t0, commit=start["commit"], started_at=start["started_at"],
                        declaration=None, seeds=seeds, settings={k: v for k, v in s.items() if k != "seeds"},
                        arms={a: f"{c.rollouts_per_prompt} x {c.prompts_per_step}" for a, c in planned.items()})
    verdict = "revives" if report["revives"] else "does not revive"
    return StudyResult(None, out, True, report, text, f"by the floor's rule (study.revival.brorl_revives): BroRL "
                       f"{verdict} the plateau", write_study_files(out, [out / "metrics.parquet"], record, report, text),
                       record)
