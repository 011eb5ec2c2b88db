"""The two arms of BroRL's experiment (Sec. 5) branched from one checkpoint: the plan (``arm_configs``,
``arms_table``), running them for several seeds, resumably (``run_rollout_scaling``), and writing the results.

Budget units: a *sample* is one generated response (prompt x rollout), counted over every dynamic-sampling round
(the metrics' ``cum_samples``); *trained samples* are those that survive the filter (kept groups x N). Wall time is
the Trainer's ``cum_wall_s``: training time with evaluation excluded.
"""

from __future__ import annotations

import hashlib
import json
import math
import warnings
from collections.abc import Iterable, Mapping
from fractions import Fraction
from pathlib import Path
from typing import Optional

import pandas as pd

from brorl_lab.core.config import LR_SCALINGS, Config
from brorl_lab.core.paths import RUNS_DIR
from brorl_lab.core.rundir import RunDir, atomic_write, atomic_write_text
from brorl_lab.core.validation import check_int, check_seeds, is_int, is_number
from brorl_lab.study.compare import ARM_NAMES
from brorl_lab.study.recipe import ARM_TABLE, IGNORED_FIELDS, check_same_config, open_trainer

DEFAULT_ROOT = RUNS_DIR / "rollout_scaling"


# ---- the arms ----------------------------------------------------------------------------------------------------------
_PRORL, _BRORL = ARM_TABLE["prorl"], ARM_TABLE["brorl"]  # the defaults: the recipe's arm table


def arm_configs(base: Config, *, n_small: int = _PRORL["rollouts_per_prompt"],  # noqa: C901 - one branch per arm option
                n_large: int = _BRORL["rollouts_per_prompt"], prompts_small: int = _PRORL["prompts_per_step"],
                prompts_large: Optional[int] = None, samples_ratio: float = 8, lr_scaling: str = "none",
                n_mid: Optional[int] = None, prompts_mid: Optional[int] = None) -> dict[str, Config]:
    """The arms of BroRL's experiment from one base config, as ``{"prorl": cfg, "brorl": cfg}`` (and ``"middle"``
    when ``n_mid`` is given), evaluated on one shared grid.

    ProRL arm: N = ``n_small`` with ``prompts_small`` prompts per step (BroRL: 16 x 512; here 16 x 64). BroRL arm:
    N = ``n_large`` with ``prompts_large`` prompts per step, by default ``samples_ratio`` times the ProRL arm's
    samples per step (BroRL: 512 x 128, 8x, prompts 4:1; here 512 x 16). Middle arm: N = ``n_mid`` x
    ``prompts_mid`` (default: the geometric mean of the two arms' prompts, 64 x 32). All keep
    ``base.optimizer_steps_per_step`` and, with ``lr_scaling="none"`` (our default: under Adam the sqrt rule in
    samples made the tiny model's BroRL arm collapse), ``base.lr``; ``"sqrt_samples"`` / ``"sqrt_prompts"`` scale
    the BroRL arm's lr by BroRL's rule, with the ProRL arm as the reference point.

    Budget and the shared grid: ``base.steps`` counts BroRL-arm steps, ``base.eval_every`` the BroRL-arm steps
    between grid points (grid G = e, 2e, ..., and the last step). An arm with r times fewer samples per step
    (r = BroRL samples per step / its own, a whole number) trains r x ``steps`` steps, so every arm trains on the
    same samples (steps x prompts x N), and is evaluated (``eval_at_steps``) at the end of steps r·g (the grid in
    samples: the same sample counts as the BroRL arm's g) and g (the grid in optimizer updates: every arm takes
    ``optimizer_steps_per_step`` updates per step, so step g is the BroRL arm's update count at g). Each budget
    comparison is then a measurement in both arms, never an interpolation.

    Resets are OFF in every arm (``reset_every = reset_every_samples = 0``): ProRL v2 resets every 200-500 steps,
    longer than this branch, and a schedule in nominal samples would not fire at equal *trained* samples (dynamic
    sampling trains a different share of each arm's samples).
    """
    if not isinstance(base, Config):
        raise ValueError(f"base: got {type(base).__name__}; allowed: a brorl_lab.Config")
    for name, v in (("n_small", n_small), ("n_large", n_large), ("prompts_small", prompts_small)):
        check_int(name, v, 1)
    if n_large <= n_small:
        raise ValueError(f"n_large: got {n_large} with n_small={n_small}; allowed: an integer > n_small")
    small = n_small * prompts_small
    if prompts_large is None:
        if not is_number(samples_ratio) or not samples_ratio > 0:
            raise ValueError(f"samples_ratio: got {samples_ratio!r}; allowed: a number > 0")
        exact = Fraction(samples_ratio).limit_denominator(1000) * small / n_large
        if exact.denominator != 1 or exact < 1:
            raise ValueError(f"prompts_large: samples_ratio={samples_ratio} gives {float(exact):g} prompts per step "
                             f"for N={n_large} (ProRL arm: {prompts_small} x {n_small}); allowed: pass prompts_large "
                             "explicitly or a ratio that makes it a whole number >= 1")
        prompts_large = int(exact)
    elif not is_int(prompts_large) or prompts_large < 1:
        raise ValueError(f"prompts_large: got {prompts_large!r}; allowed: None or an integer >= 1")
    if lr_scaling not in LR_SCALINGS:
        raise ValueError(f"lr_scaling: got {lr_scaling!r}; allowed: {', '.join(LR_SCALINGS)}")
    shapes = {"prorl": (n_small, prompts_small)}
    if n_mid is not None:
        check_int("n_mid", n_mid, n_small + 1)
        if n_mid >= n_large:
            raise ValueError(f"n_mid: got {n_mid}; allowed: an integer between n_small={n_small} and n_large={n_large}")
        if prompts_mid is None:
            prompts_mid = round(math.sqrt(prompts_small * prompts_large))
        check_int("prompts_mid", prompts_mid, 1)
        shapes["middle"] = (n_mid, prompts_mid)
    elif prompts_mid is not None:
        raise ValueError(f"prompts_mid: got {prompts_mid!r} without n_mid; allowed: None, or pass n_mid too")
    large = n_large * prompts_large
    grid = shared_grid(base.steps, base.eval_every)
    common = dict(lr_reference_samples=small, lr_reference_prompts=prompts_small, reset_every=0,
                  reset_every_samples=0, eval_every=0)
    arms = {}
    for arm, (n, prompts) in shapes.items():
        r = Fraction(large, n * prompts)
        if r.denominator != 1:
            raise ValueError(f"prompts_{'small' if arm == 'prorl' else 'mid'}: the {arm} arm's {n} x {prompts} = "
                             f"{n * prompts} samples per step does not divide the BroRL arm's {large}; allowed: "
                             "shapes whose samples per step divide the BroRL arm's (the shared grid needs whole steps)")
        r = int(r)
        arms[arm] = base.replace(**common, lr_scaling="none", rollouts_per_prompt=n, prompts_per_step=prompts,
                                 steps=base.steps * r, eval_at_steps=sorted({r * g for g in grid} | set(grid)),
                                 checkpoint_every=base.checkpoint_every * r, run_name=arm)
    arms["brorl"] = base.replace(**common, lr_scaling=lr_scaling, rollouts_per_prompt=n_large,
                                 prompts_per_step=prompts_large, eval_at_steps=grid, run_name="brorl")
    return arms


def shared_grid(steps: int, every: int) -> list[int]:
    """The BroRL-arm steps of the shared evaluation grid: every ``every`` steps and the last one."""
    check_int("steps", steps, 1)
    check_int("eval_every", every, 1)
    return sorted(set(range(every, steps + 1, every)) | {steps})


PAPER_ARMS = {"prorl": dict(rollouts_per_prompt=16, prompts_per_step=512), "brorl": dict(rollouts_per_prompt=512,
                                                                                    prompts_per_step=128)}


def arms_table(arms: dict[str, Config]) -> pd.DataFrame:
    """The arms side by side with BroRL's own values (Sec. 5): N, prompts and samples per step, optimizer updates
    per step, effective lr, steps and the nominal samples each arm will train on."""
    rows = {}
    for arm, c in arms.items():
        paper = PAPER_ARMS.get(arm, {})
        rows[ARM_NAMES.get(arm, arm)] = {
            "N (rollouts_per_prompt)": c.rollouts_per_prompt, "prompts_per_step": c.prompts_per_step,
            "samples_per_step": c.samples_per_step, "optimizer_steps_per_step": c.optimizer_steps_per_step,
            "lr (after sqrt scaling)": f"{c.effective_lr:.3g}", "steps": c.steps,
            "evaluated after steps": ", ".join(map(str, c.eval_at_steps)),
            "nominal trained samples": c.samples_per_step * c.steps,
            "paper: N x prompts": f"{paper['rollouts_per_prompt']} x {paper['prompts_per_step']}" if paper else ""}
    return pd.DataFrame(rows)


def experiment_root(base: Config, run_dir: str | Path | None = None, **arm_options) -> Path:
    """Where the arms' runs live: ``run_dir/arms`` when a run directory is given, else a directory under
    ``runs/rollout_scaling`` named by the settings (so different settings never share, and clash in, one root)."""
    if run_dir:
        return Path(run_dir) / "arms"
    settings = {k: v for k, v in base.to_dict().items() if k not in IGNORED_FIELDS}
    digest = hashlib.sha1(json.dumps([settings, arm_options], sort_keys=True, default=str).encode()).hexdigest()[:8]
    return DEFAULT_ROOT / f"steps{base.steps}_{digest}"


def run_arm(cfg: Config, *, progress: bool = True) -> tuple[pd.DataFrame, bool]:
    """Run one arm to ``cfg.steps`` or its budget of generated samples (``cfg.max_samples``): a finished run in
    ``cfg.run_dir/cfg.run_name`` is read back, not re-run; a partial one resumes from its checkpoint. Returns
    ``(metrics, finished)``."""
    path = Path(cfg.run_dir) / cfg.run_name
    if (path / "config.yaml").is_file():
        check_same_config(path, cfg)
        status = RunDir(path).read_status()
        if status.get("status") == "finished":
            df = RunDir(path).read_metrics()
            if status.get("step") == cfg.steps or cfg.budget_spent(int(df["cum_samples"].max())):
                return df, True
    with open_trainer(cfg, progress=progress) as trainer:
        trainer.run()
        done = trainer.step_idx >= cfg.steps or cfg.budget_spent(trainer.cum["samples"])
    return RunDir(path).read_metrics(), done  # read back, so a fresh and a finished arm give identical frames


def run_rollout_scaling(base: Config, *, seeds: Iterable[int] = (0,), root: str | Path = DEFAULT_ROOT,
                        progress: bool = True, middle_seeds: Optional[Iterable[int]] = None,
                        jobs: int = 1, ray: Optional[str] = None, threads: Optional[int] = None,
                        **arm_options) -> pd.DataFrame:
    """Run both arms of :func:`arm_configs` (``arm_options``: n_small, n_large, prompts_small, ...) for each seed from
    ``base.model``, in run directories ``root/<arm>_s<seed>``; returns one long DataFrame of every metrics row with
    columns ``arm``, ``seed``, ``rollouts_per_prompt``, ``prompts_per_step``, ``cum_trained_samples`` and
    ``cum_updates`` (optimizer updates) added.

    The headline arms (ProRL, BroRL) come first for every seed, then the middle arm (``n_mid``) for
    ``middle_seeds`` (default: ``seeds``), so a run cut short has the headline comparison complete first.

    The runs are independent jobs (:func:`run_plans`): ``jobs`` at a time on this machine (default 1: one after
    another in this process; None: one per physical core), ``threads`` torch threads each (default
    ``base.torch_threads``, or physical cores // jobs when that is 0), or tasks on the Ray cluster at ``ray``. Each run's numbers
    depend on its seed and thread count only, so any ``jobs`` at the same ``threads`` gives the same frame.

    Resumable: finished arms are read back, a partial arm continues from its checkpoint, and a root that holds a
    run with different settings is an error rather than a silent mix. Ctrl-C stops every running arm after its
    current step, at a checkpoint (the partial results are returned with a warning; call again to continue).
    """
    plan = plan_rollout_scaling(base, seeds=seeds, root=root, middle_seeds=middle_seeds, **arm_options)
    return run_plans({None: plan}, jobs=jobs, ray=ray, threads=threads, progress=progress)[None]


def plan_rollout_scaling(base: Config, *, seeds: Iterable[int] = (0,), root: str | Path = DEFAULT_ROOT,
                         middle_seeds: Optional[Iterable[int]] = None, **arm_options) -> list[tuple[str, int, Config]]:
    """The runs of :func:`run_rollout_scaling` in order, as ``(arm, seed, config)``, every name checked."""
    return plan_arms(arm_configs(base, **arm_options), seeds=seeds, root=root, middle_seeds=middle_seeds)


def plan_arms(arms: Mapping[str, Config], *, seeds: Iterable[int], root: str | Path,
              middle_seeds: Optional[Iterable[int]] = None) -> list[tuple[str, int, Config]]:
    """The runs of ``arms`` ({arm: Config}, e.g. :func:`arm_configs`) in order, as ``(arm, seed, config)`` with the
    config in ``root/<arm>_s<seed>``: the headline arms for every seed first, then the middle arm for
    ``middle_seeds`` (default ``seeds``), so a run cut short has the headline comparison complete first. Every
    name is checked before any arm runs."""
    from brorl_lab.rl.spec import check  # imports torch: only when arms run

    seeds = check_seeds(seeds)
    if not isinstance(root, (str, Path)) or not str(root).strip():
        raise ValueError(f"root: got {root!r}; allowed: a directory path")
    middle_seeds = seeds if middle_seeds is None else check_seeds(middle_seeds)
    order = [(arm, seed) for seed in seeds for arm in arms if arm != "middle"]
    order += [("middle", seed) for seed in middle_seeds if "middle" in arms]
    root = Path(root).resolve()  # absolute: worker processes and Ray nodes do not share this working directory
    return [(arm, seed, check(arms[arm].replace(seed=seed, run_dir=str(root), run_name=f"{arm}_s{seed}")))
            for arm, seed in order]


def run_plans(plans: Mapping, *, jobs: Optional[int] = 1, ray: Optional[str] = None,
              threads: Optional[int] = None, progress: bool = True) -> dict:
    """Every run of several :func:`plan_rollout_scaling` plans (``{key: plan}``, e.g. one per regime-map setting)
    as one set of independent jobs (:func:`brorl_lab.lab.jobs.run_jobs`), so the runs of all plans share the
    cores (or the cluster). Each run is :func:`run_arm` at ``threads`` torch threads (default: the configs'
    ``torch_threads`` when they all name the same one, else physical cores // jobs). Returns ``{key: frame}``: the
    plan's labelled metrics in plan order (what running its arms one after another gives). A stop (Ctrl-C, a run
    that returned unfinished) leaves every run at a checkpoint and warns; the frames hold what ran."""
    from brorl_lab.lab.jobs import Job, plan_workers, run_jobs

    given = {cfg.torch_threads for plan in plans.values() for _, _, cfg in plan}
    if not threads and len(given) == 1 and min(given) > 0:
        threads = min(given)  # the configs' own thread count, when they name one
    workers, threads = plan_workers(jobs, threads, ray)
    here = workers == 1 and ray is None  # one after another in this process: each run keeps its own bar
    flat = [(key, arm, seed, cfg.replace(torch_threads=threads)) for key, plan in plans.items()
            for arm, seed, cfg in plan]
    todo = [Job(run_arm, (cfg,), {"progress": progress and here}, name=cfg.run_name,
                run_dir=Path(cfg.run_dir) / cfg.run_name) for _, _, _, cfg in flat]
    res = run_jobs(todo, workers=workers, threads=threads, ray=ray, progress=progress, desc="arms",
                   stop_if=lambda out: not out[1])
    frames: dict = {key: [] for key in plans}
    unfinished = []
    for (key, arm, seed, cfg), out in zip(flat, res):
        if isinstance(out, tuple):
            frames[key].append(label_arm(out[0], arm, seed, cfg))
        if not isinstance(out, tuple) or not out[1]:
            unfinished.append(cfg.run_name if key is None else f"{key}/{cfg.run_name}")
    if unfinished:
        warnings.warn(f"the arms stopped ({res.stopped or 'interrupted'}) with {len(unfinished)} of {len(flat)} runs "
                      f"unfinished ({', '.join(unfinished[:6])}{', ...' if len(unfinished) > 6 else ''}); call again "
                      "with the same arguments to resume", stacklevel=3)
    return {key: pd.concat(f, ignore_index=True) if f else pd.DataFrame() for key, f in frames.items()}


def label_arm(df: pd.DataFrame, arm: str, seed: int, cfg: Config) -> pd.DataFrame:
    df = df.copy()
    df.insert(0, "seed", seed)
    df.insert(0, "arm", arm)
    df.insert(0, "run", cfg.run_name)
    df["rollouts_per_prompt"] = cfg.rollouts_per_prompt
    df["prompts_per_step"] = cfg.prompts_per_step
    kept = df["kept_groups"].fillna(0) if "kept_groups" in df else pd.Series(0.0, index=df.index)
    skipped = df["skipped"].eq(True) if "skipped" in df else pd.Series(False, index=df.index)
    trained = df["step"].gt(0) & ~skipped  # row 0 is the evaluation before training
    # the trainer counts both (rl.trainer: cum_trained_samples, cum_updates); runs written before it did are rebuilt
    if "cum_trained_samples" not in df or df["cum_trained_samples"].isna().any():
        df["cum_trained_samples"] = (kept * cfg.rollouts_per_prompt).where(~skipped, 0).cumsum()
    if "cum_updates" not in df or df["cum_updates"].isna().any():
        df["cum_updates"] = (trained * cfg.optimizer_steps_per_step).cumsum()  # optimizer updates so far
    df["cum_nominal_samples"] = df["step"] * cfg.samples_per_step  # steps x prompts x N: the arms' budget unit
    df["cum_nominal_updates"] = df["step"] * cfg.optimizer_steps_per_step  # as planned (a skipped step takes none)
    return df


def save_outputs(run_dir: str | Path, df: pd.DataFrame, figures: dict, *, summary: Optional[pd.DataFrame] = None,
                 verdict_text: Optional[str] = None, export_png: bool = True,
                 tables: Optional[dict] = None) -> dict:
    """Write the experiment's results into ``run_dir``: metrics.parquet (the long table), summary.csv, verdict.txt,
    each of ``tables`` ({name: DataFrame}) as <name>.csv, and each figure of ``figures`` ({name: go.Figure}) as
    <name>.png with kaleido, all in one batch. PNG export needs Chromium; when it fails the reason is returned
    under "png_note" and nothing else is affected."""
    out = Path(run_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = {"metrics": atomic_write(out / "metrics.parquet", lambda f: df.to_parquet(f, index=False))}
    if summary is not None:
        written["summary"] = atomic_write_text(out / "summary.csv", summary.to_csv())
    if verdict_text is not None:
        written["verdict"] = atomic_write_text(out / "verdict.txt", verdict_text + "\n")
    written["tables"] = [atomic_write_text(out / f"{name}.csv", t.to_csv()) for name, t in (tables or {}).items()]
    written["png"], written["png_note"] = [], None
    if export_png and figures:
        import plotly.io as pio

        todo = {out / f"{name}.png": fig for name, fig in figures.items()}
        for path in todo:  # a PNG left by an earlier run must not pass for this run's
            path.unlink(missing_ok=True)
        try:
            for _ in range(2):  # under heavy load kaleido has been seen to drop a figure of a batch: retry those
                pio.write_images(list(todo.values()), list(todo), width=1100)
                todo = {p: f for p, f in todo.items() if not p.is_file()}
                if not todo:
                    break
            if todo:
                written["png_note"] = f"PNG export did not write {', '.join(p.name for p in todo)}"
        except Exception as e:  # noqa: BLE001 - no Chromium, kaleido missing, a browser crash: figures stay inline
            written["png_note"] = f"PNG export skipped ({type(e).__name__}: {str(e).strip().splitlines()[0][:200]})"
        written["png"] = [out / f"{name}.png" for name in figures if (out / f"{name}.png").is_file()]
    elif figures:
        written["png_note"] = "PNG export off (export_png=False)"
    return written
