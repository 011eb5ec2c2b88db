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
from collections.abc import Iterable, Mapping, Sequence
from fractions import Fraction
from pathlib import Path
from typing import Optional

import pandas as pd

from brorl_lab.core.config import LR_SCALINGS, Config
from brorl_lab.core.paths import RUNS_DIR
from brorl_lab.core.rundir import RunDir, atomic_write, atomic_write_text
from brorl_lab.core.validation import check_int, check_seeds, is_number
from brorl_lab.study.compare import ARM_NAMES
from brorl_lab.study.recipe import ARM_TABLE, IGNORED_FIELDS, PAPER_ARMS, check_same_config, open_trainer

DEFAULT_ROOT = RUNS_DIR / "rollout_scaling"


# ---- the arms ----------------------------------------------------------------------------------------------------------
#: The one name of each quantity an arm is built from (issue 42): its N is ``rollouts_per_prompt``, its prompts per
#: step ``prompts_per_step``, as the Config fields. An *arm table* maps arm -> {field: value}; the study's is the
#: recipe's :data:`~brorl_lab.study.recipe.ARM_TABLE`, the one place its numbers are written.
ARM_FIELDS = ("rollouts_per_prompt", "prompts_per_step")
HEADLINE_ARMS = ("prorl", "brorl")  # the arms every comparison has; "middle" is optional
# BroRL's samples per step over ProRL's in the recipe's table (8): the update ratio at equal samples
_RATIO = Fraction(ARM_TABLE["brorl"]["rollouts_per_prompt"] * ARM_TABLE["brorl"]["prompts_per_step"],
                  ARM_TABLE["prorl"]["rollouts_per_prompt"] * ARM_TABLE["prorl"]["prompts_per_step"])
SAMPLES_RATIO = int(_RATIO) if _RATIO.denominator == 1 else float(_RATIO)
#: Keyword names arm_configs took before arm tables, still accepted from callers outside the study's arm modules
#: (study.paid and study.runner build them with study.recipe.arm_options; bench/bench_jobs, tests/test_jobs): each
#: -> (arm, field) of the table it stands for. Without its prompts, the BroRL arm's come from ``samples_ratio``.
LEGACY_ARM_OPTIONS = {"n_small": ("prorl", "rollouts_per_prompt"), "prompts_small": ("prorl", "prompts_per_step"),
                      "n_large": ("brorl", "rollouts_per_prompt"), "prompts_large": ("brorl", "prompts_per_step"),
                      "n_mid": ("middle", "rollouts_per_prompt"), "prompts_mid": ("middle", "prompts_per_step")}


def legacy_arm_table(**options) -> tuple[dict, tuple[str, ...]]:
    """(arm table, arms) from the old keywords of :data:`LEGACY_ARM_OPTIONS`: the recipe's ProRL row, its BroRL N
    with prompts per step left to ``samples_ratio``, each given keyword set; the middle arm when its N is given."""
    unknown = sorted(set(options) - set(LEGACY_ARM_OPTIONS))
    if unknown:
        raise ValueError(f"{unknown[0]}: not an arm option; allowed: arm_table (arm -> {', '.join(ARM_FIELDS)}), "
                         f"arms, samples_ratio, lr_scaling (or the old names {', '.join(LEGACY_ARM_OPTIONS)})")
    table = {"prorl": dict(ARM_TABLE["prorl"]),
             "brorl": {"rollouts_per_prompt": ARM_TABLE["brorl"]["rollouts_per_prompt"], "prompts_per_step": None},
             "middle": {"rollouts_per_prompt": None, "prompts_per_step": None}}
    for key, value in options.items():
        arm, name = LEGACY_ARM_OPTIONS[key]
        table[arm][name] = value
    middle = table["middle"]["rollouts_per_prompt"] is not None
    if not middle and table["middle"]["prompts_per_step"] is not None:
        raise ValueError(f"prompts_mid: got {table['middle']['prompts_per_step']!r} without n_mid; allowed: None, or "
                         "pass n_mid too")
    return table, ("prorl", "middle", "brorl") if middle else HEADLINE_ARMS


def check_arm_table(table: Mapping, arms: Sequence[str]) -> dict:
    """``table`` restricted to ``arms`` (which must hold 'prorl' and 'brorl'), every N an integer >= 1 and every
    prompts per step one too (None only for the BroRL and middle arms: derived in :func:`arm_configs`)."""
    if not isinstance(table, Mapping):
        raise ValueError(f"arm_table: got {type(table).__name__}; allowed: arm -> {{{', '.join(ARM_FIELDS)}}} "
                         "(study.recipe.ARM_TABLE)")
    missing = [a for a in (*HEADLINE_ARMS, *arms) if a not in table]
    if missing or not set(HEADLINE_ARMS) <= set(arms):
        raise ValueError(f"arms: got {list(arms)} of a table with {list(table)}; allowed: 'prorl', 'brorl' and "
                         "optionally 'middle', each a row of arm_table")
    out = {}
    for arm in arms:
        row = table[arm]
        if not isinstance(row, Mapping) or set(row) - set(ARM_FIELDS):
            raise ValueError(f"arm_table[{arm!r}]: got {row!r}; allowed: a dict of {', '.join(ARM_FIELDS)}")
        check_int(f"arm_table[{arm!r}]['rollouts_per_prompt']", row.get("rollouts_per_prompt"), 1)
        prompts = row.get("prompts_per_step")
        if prompts is not None or arm == "prorl":
            check_int(f"arm_table[{arm!r}]['prompts_per_step']", prompts, 1)
        out[arm] = {"rollouts_per_prompt": row["rollouts_per_prompt"], "prompts_per_step": prompts}
    return out


def arm_configs(base: Config, arm_table: Optional[Mapping] = None, *, arms: Optional[Sequence[str]] = None,
                samples_ratio: float = SAMPLES_RATIO, lr_scaling: str = "none", **legacy) -> dict[str, Config]:
    """The arms of BroRL's experiment from one base config, as ``{"prorl": cfg, "brorl": cfg}`` (and ``"middle"``
    when ``arms`` names it, between them), evaluated on one shared grid.

    Each arm's N (``rollouts_per_prompt``) and ``prompts_per_step`` are its row of ``arm_table`` (default the
    recipe's :data:`~brorl_lab.study.recipe.ARM_TABLE`: ProRL N x 64 prompts, BroRL 8x its samples per step at a
    quarter of its prompts; BroRL Sec. 5 ran 16 x 512 against 512 x 128, :data:`PAPER_ARMS`); ``arms`` picks the
    rows (default ProRL and BroRL). A BroRL row without ``prompts_per_step`` gets ``samples_ratio`` times the ProRL
    arm's samples per step; a middle row without it the geometric mean of the two arms' prompts. All keep
    ``base.optimizer_steps_per_step`` and, with ``lr_scaling="none"`` (our default: under Adam the sqrt rule in
    samples made the tiny model's BroRL arm collapse), ``base.lr``; ``"sqrt_samples"`` / ``"sqrt_prompts"`` scale
    the BroRL arm's lr by BroRL's rule, with the ProRL arm as the reference point. The old keywords
    (:data:`LEGACY_ARM_OPTIONS`: ``n_small``, ...) are read as a table (:func:`legacy_arm_table`).

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
    if legacy:
        if arm_table is not None or arms is not None:
            raise ValueError(f"{next(iter(legacy))}: an old arm option beside arm_table / arms; allowed: one or the "
                             "other")
        arm_table, arms = legacy_arm_table(**legacy)
    shapes = check_arm_table(ARM_TABLE if arm_table is None else arm_table, HEADLINE_ARMS if arms is None else arms)
    if lr_scaling not in LR_SCALINGS:
        raise ValueError(f"lr_scaling: got {lr_scaling!r}; allowed: {', '.join(LR_SCALINGS)}")
    _fill_prompts(shapes, samples_ratio)
    pro, bro = shapes["prorl"], shapes["brorl"]
    small = pro["rollouts_per_prompt"] * pro["prompts_per_step"]
    large = bro["rollouts_per_prompt"] * bro["prompts_per_step"]
    grid = shared_grid(base.steps, base.eval_every)
    common = dict(lr_reference_samples=small, lr_reference_prompts=pro["prompts_per_step"], reset_every=0,
                  reset_every_samples=0, eval_every=0)
    out = {}
    for arm in [a for a in ("prorl", "middle") if a in shapes]:
        n, prompts = shapes[arm]["rollouts_per_prompt"], shapes[arm]["prompts_per_step"]
        r = Fraction(large, n * prompts)
        if r.denominator != 1:
            raise ValueError(f"arm_table[{arm!r}]['prompts_per_step']: the {arm} arm's {n} x {prompts} = "
                             f"{n * prompts} samples per step does not divide the BroRL arm's {large}; allowed: "
                             "shapes whose samples per step divide the BroRL arm's (the shared grid needs whole steps)")
        r = int(r)
        out[arm] = base.replace(**common, lr_scaling="none", rollouts_per_prompt=n, prompts_per_step=prompts,
                                steps=base.steps * r, eval_at_steps=sorted({r * g for g in grid} | set(grid)),
                                checkpoint_every=base.checkpoint_every * r, run_name=arm)
    out["brorl"] = base.replace(**common, lr_scaling=lr_scaling, **bro, eval_at_steps=grid, run_name="brorl")
    return out


def _fill_prompts(shapes: dict, samples_ratio: float) -> None:
    """Check the arms' N are in order (ProRL < middle < BroRL) and fill a BroRL row's missing prompts per step
    (``samples_ratio`` times the ProRL arm's samples per step) and a middle row's (the geometric mean), in place."""
    pro, bro = shapes["prorl"], shapes["brorl"]
    if bro["rollouts_per_prompt"] <= pro["rollouts_per_prompt"]:
        raise ValueError(f"arm_table['brorl']['rollouts_per_prompt']: got {bro['rollouts_per_prompt']} with the ProRL "
                         f"arm's {pro['rollouts_per_prompt']}; allowed: a larger N than the ProRL arm's")
    if bro["prompts_per_step"] is None:
        if not is_number(samples_ratio) or not samples_ratio > 0:
            raise ValueError(f"samples_ratio: got {samples_ratio!r}; allowed: a number > 0")
        small = pro["rollouts_per_prompt"] * pro["prompts_per_step"]
        exact = Fraction(samples_ratio).limit_denominator(1000) * small / bro["rollouts_per_prompt"]
        if exact.denominator != 1 or exact < 1:
            raise ValueError(f"arm_table['brorl']['prompts_per_step']: samples_ratio={samples_ratio} gives "
                             f"{float(exact):g} prompts per step for N={bro['rollouts_per_prompt']} (ProRL arm: "
                             f"{pro['prompts_per_step']} x {pro['rollouts_per_prompt']}); allowed: give it "
                             "explicitly or a ratio that makes it a whole number >= 1")
        bro["prompts_per_step"] = int(exact)
    if "middle" in shapes:
        mid = shapes["middle"]
        if not pro["rollouts_per_prompt"] < mid["rollouts_per_prompt"] < bro["rollouts_per_prompt"]:
            raise ValueError(f"arm_table['middle']['rollouts_per_prompt']: got {mid['rollouts_per_prompt']}; allowed: "
                             f"an integer between the ProRL arm's {pro['rollouts_per_prompt']} and the BroRL arm's "
                             f"{bro['rollouts_per_prompt']}")
        if mid["prompts_per_step"] is None:
            mid["prompts_per_step"] = round(math.sqrt(pro["prompts_per_step"] * bro["prompts_per_step"]))


def shared_grid(steps: int, every: int) -> list[int]:
    """The BroRL-arm steps of the shared evaluation grid: every ``every`` steps and the last one."""
    check_int("steps", steps, 1)
    check_int("eval_every", every, 1)
    return sorted(set(range(every, steps + 1, every)) | {steps})


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
    """Run both arms of :func:`arm_configs` (``arm_options``: arm_table, arms, samples_ratio, lr_scaling) for each seed from
    ``base.model``, in run directories ``root/<arm>_s<seed>``; returns one long DataFrame of every metrics row with
    columns ``arm``, ``seed``, ``rollouts_per_prompt``, ``prompts_per_step``, ``cum_trained_samples`` and
    ``cum_updates`` (optimizer updates) added.

    The headline arms (ProRL, BroRL) come first for every seed, then the middle arm (when ``arms`` names it) for
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
              middle_seeds: Optional[Iterable[int]] = None, prefix: str = "") -> list[tuple[str, int, Config]]:
    """The runs of ``arms`` ({arm: Config}, e.g. :func:`arm_configs`) in order, as ``(arm, seed, config)`` with the
    config in ``root/<prefix><arm>_s<seed>`` (``prefix``: several studies' runs side by side in one root, as the
    regime map's settings): the headline arms for every seed first, then the middle arm for
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
    return [(arm, seed, check(arms[arm].replace(seed=seed, run_dir=str(root), run_name=f"{prefix}{arm}_s{seed}")))
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
