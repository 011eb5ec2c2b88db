"""The allocation study (issue 44): a per-prompt allocation of the step's samples against uniform N at equal generated
samples, declared here as data before any full-size run, with its one reading a function on per-seed tables::

    ALLOCATION                                   # the study as data: stages, allocator options, the shared arms
    ALLOCATION.to_declaration()                  # what study.results.write_declaration commits before the run
    ALLOCATION.stage_arms("two_stage", picks)    # {"<branch>-<base>-two_stage": Config}: the arms this study runs
    run_stage("two_stage", jobs=2)               # through study.runner.run_grid, into its own ledger
    read_stage("two_stage")                      # both ledgers -> per-seed points, the reading, the allocation summary
    allocation_table(points, allocation=..., uniform=[...])   # THE reading: the allocation arm minus each uniform arm
    allocation_summary(metrics)                  # per arm: informative groups per generated sample, N per prompt
    signal_gaps(metrics, ...)                    # allocation - uniform in informative groups per sample, paired

The design (the lead's). The uniform arms are *shared* with the rollout frontier (:mod:`brorl_lab.study.frontier`):
its ``ratio`` stage's ProRL-shaped arm (the smallest N of the 4:1 design, n16x64) and BroRL-shaped arm (the largest,
n512x16) from both branch points, same seeds, budget, marks, evaluation and protocol. This study never runs them: it
reads them from the frontier's ledger (``notebooks/figures/frontier/ratio/<branch>-<arm>_s<seed>.parquet``), each
checked against the frontier's config by its fingerprint (:func:`brorl_lab.study.runner.read_ledger`). What it runs
is one arm per stage and branch point: the ProRL-shaped arm (its prompts per step and its step budget of P x N
generated samples per sampling round, its lr pick from the frontier's ``lr_picks.csv``) with that budget spread
over the step's prompts by an allocator (:mod:`brorl_lab.rl.allocation`), each prompt between 1 and the cap (the
BroRL arm's N: no prompt draws more than uniform BroRL gives every prompt):

- stage ``two_stage`` (primary): Theorem 1's allocator, a probe of ``probe`` draws per prompt, a Beta posterior on
  each p (its prior from the prompt's earlier draws, at most ``prior_draws`` pseudo-draws), then a knapsack on the
  expected informative groups;
- stage ``until_signal`` (secondary): Reinforce-Ada's idea, rounds of ``round_size`` until a group holds both
  outcomes, the leftover spread over the smallest groups so each step spends exactly its budget.

Dynamic sampling refills rounds until the batch is full (the frontier's fill-to-full protocol and round cap), each
round spread again by the allocator; the arm stops at the branch point's budget in generated samples and is
evaluated at the frontier's log-spaced marks.

The reading (declared now): at each budget mark and branch point, the allocation arm minus each uniform arm on their
paired seeds, a 95% paired t interval; "beats both" only when both intervals lie above 0; otherwise it says which
uniform arm it beats (interval above 0), which it loses to (below 0) and against which it is not resolved (the
interval contains 0, or fewer than 2 paired seeds). Beside it, per arm, the informative groups per generated sample
and the N-per-prompt histogram the trainer's metrics record (``alloc/*``: :func:`brorl_lab.rl.allocation.
allocation_metrics`).

The command: ``python -m brorl_lab.study.allocation run two_stage --jobs 2`` (then ``until_signal``);
``python -m brorl_lab.study.allocation read two_stage`` prints the reading from both ledgers. The exploratory cost
pilot (``... pilot --steps 3``, :func:`cost_pilot`) measures wall time per generated sample under each allocator
against uniform; docs/results/allocation_design.md quotes it (:func:`pilot_markdown`).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np
import pandas as pd

from brorl_lab.core.config import Config
from brorl_lab.core.paths import repo_relative
from brorl_lab.core.validation import UserError, check_int
from brorl_lab.study import frontier as F
from brorl_lab.study.paid import METRIC

#: The stages, in the order they run: each one allocator's arm from every branch point.
STAGES = {"two_stage": "the primary arm: Theorem 1's allocator (probe, Beta posterior, knapsack on informative groups)",
          "until_signal": "the secondary arm: Reinforce-Ada's sample-until-signal, rounds until both outcomes"}
HEADLINE_STAGE = "two_stage"  # the declared headline: this stage at each branch point's budget
LEDGER = F.LEDGER.parent / "allocation"  # notebooks/figures/allocation: the declaration, one ledger per stage
FRONTIER_STAGE = "ratio"  # the frontier stage whose uniform arms this study shares
LEVEL = 0.95  # the reading's paired t interval
ALLOC_PREFIX = "alloc/"  # the trainer's allocation columns (rl.allocation.allocation_metrics)
_DEFAULTS = {f.name: f.default for f in dataclasses.fields(Config)}  # the allocator options' Config defaults


def check_stage(stage: str) -> str:
    if stage not in STAGES:
        raise ValueError(f"stage: got {stage!r}; allowed: {', '.join(STAGES)}")
    return stage


# ---- the study as data ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class AllocationStudy:
    """The allocation study as data. ``frontier`` is the frontier whose ``ratio`` stage supplies the uniform arms
    (its branch points, seeds, budgets, marks, evaluation, protocol and lr picks are this study's too);
    ``frontier_ledger`` where its ledger lives (default the frontier's own). ``probe``, ``round_size`` and
    ``prior_draws`` are the allocators' options (Config ``allocation_probe``, ``allocation_round``,
    ``allocation_prior_draws``); ``cap`` the most samples one prompt may get in a step (None: the largest-N
    uniform arm's N)."""

    name: str = "allocation"
    frontier: F.Frontier = F.FRONTIER
    frontier_ledger: Optional[Path] = None
    probe: int = _DEFAULTS["allocation_probe"]
    round_size: int = _DEFAULTS["allocation_round"]
    prior_draws: int = _DEFAULTS["allocation_prior_draws"]
    cap: Optional[int] = None
    level: float = LEVEL

    def __post_init__(self):
        for arg, lo in (("probe", 1), ("round_size", 1), ("prior_draws", 0)):
            check_int(arg, getattr(self, arg), lo)
        base_n = F.arm_n(self.base_arm)
        if self.probe > base_n:
            raise ValueError(f"probe: got {self.probe}; allowed: at most the base arm's N = {base_n}")
        if self.cap is not None:
            check_int("cap", self.cap, base_n)

    # the arms ------------------------------------------------------------------------------------------------------
    @property
    def uniform_arms(self) -> tuple[str, str]:
        """The shared uniform arms: the frontier's 4:1 arms of smallest N (ProRL's shape) and largest N (BroRL's)."""
        arms = self.frontier.arms(FRONTIER_STAGE)
        return min(arms, key=F.arm_n), max(arms, key=F.arm_n)

    @property
    def base_arm(self) -> str:
        """The arm the allocation arms are derived from: the ProRL-shaped uniform arm (its prompts, budget, lr)."""
        return self.uniform_arms[0]

    @property
    def allocation_cap(self) -> int:
        return self.cap if self.cap is not None else F.arm_n(self.uniform_arms[1])

    @property
    def frontier_root(self) -> Path:
        return Path(self.frontier_ledger) if self.frontier_ledger else F.LEDGER

    def arm_of(self, branch: str, stage: str) -> str:
        """``<branch>-<base arm>-<stage>``: the run name of a stage's allocation arm (``learned-n16x64-two_stage``)."""
        return f"{branch}-{self.base_arm}-{check_stage(stage)}"

    def picked(self, picks: Mapping[str, Mapping[str, float]]) -> tuple:
        """The branch points that have lr picks, in the frontier's order (a branch point waits for its pilot)."""
        return tuple(b for b in self.frontier.branches if b in picks)

    def stage_arms(self, stage: str, picks: Mapping[str, Mapping[str, float]]) -> dict[str, Config]:
        """{``<branch>-<base>-<stage>``: Config} for every branch point with picks: the frontier's ``ratio`` config of
        the base arm at its lr pick (``picks`` {branch: {arm: lr}}, :func:`brorl_lab.study.frontier.stage_picks`)
        with the step's budget spread by allocator ``stage`` (probe, cap, round, prior); every other field is the
        shared arm's."""
        check_stage(stage)
        shared = self.frontier.stage_arms(FRONTIER_STAGE, picks=picks, branches=self.picked(picks))
        return {self.arm_of(b, stage): shared[f"{b}-{self.base_arm}"].replace(
                    rollout_allocation=stage, allocation_probe=self.probe, allocation_cap=self.allocation_cap,
                    allocation_round=self.round_size, allocation_prior_draws=self.prior_draws)
                for b in self.picked(picks)}

    def uniform_plan(self, picks: Mapping[str, Mapping[str, float]]) -> list[tuple[str, int, Config]]:
        """The shared uniform runs as the frontier planned them, ``(<branch>-<arm>, seed, config)``: what its ledger
        files must have been written by (same config fingerprint)."""
        from brorl_lab.study.arms import plan_arms

        shared = self.frontier.stage_arms(FRONTIER_STAGE, picks=picks, branches=self.picked(picks))
        arms = {f"{b}-{a}": shared[f"{b}-{a}"] for b in self.picked(picks) for a in self.uniform_arms}
        return plan_arms(arms, seeds=self.frontier.seeds, root=self.frontier_root / "unused")

    # the declaration ------------------------------------------------------------------------------------------------
    def to_declaration(self) -> dict:
        """The study as declared before the run, plain JSON (committed by :func:`brorl_lab.study.results.
        write_declaration` as ``notebooks/figures/allocation/declaration.json``): design, allocator options, seeds,
        budgets and marks, the shared uniform arms and where they are read from, the reading and its thresholds."""
        fr, here = self.frontier, __name__
        small, large = self.uniform_arms
        n, p = self.frontier.arms(FRONTIER_STAGE)[small]
        return {
            "study": self.name,
            "issue": 44,
            "status": ("pre-registered: this file is committed before the first full-size run of any stage; every "
                       "ledger file's provenance names the commit that added it"),
            "question": ("does a per-prompt allocation of the step's generated samples beat uniform N at ProRL's and "
                         "at BroRL's shape, at equal generated samples, from each branch point?"),
            "stages": {st: {"what": STAGES[st], "seeds": list(fr.seeds), "arm": f"<branch>-{self.base_arm}-{st}",
                            "ledger": f"notebooks/figures/allocation/{st}/<branch>-{self.base_arm}-{st}_s<seed>.parquet"}
                       for st in STAGES},
            "allocation_arms": {
                "derived_from": (f"the frontier's {FRONTIER_STAGE!r} config of {small} (study.frontier.FRONTIER."
                                 f"stage_arms('{FRONTIER_STAGE}', picks)) with only the allocation fields changed"),
                "prompts_per_step": p, "rollouts_per_prompt": n,
                "step_budget": {"generated_samples_per_round": n * p,
                                "spread_by": "the stage's allocator, every dynamic-sampling round"},
                "rollout_allocation": list(STAGES), "allocation_probe": self.probe,
                "allocation_cap": self.allocation_cap, "allocation_cap_is": f"the N of {large}",
                "allocation_round": self.round_size, "allocation_prior_draws": self.prior_draws,
                "lr": f"the frontier's lr pick of {small} per branch point (study.frontier.stage_picks: "
                      "notebooks/figures/frontier/lr_pilot/lr_picks.csv, replaced by lr_pilot_long/lr_picks.csv where "
                      "the frontier's lr amendment names the branch point; rule study.frontier.pick_lr); no stage "
                      "starts at a branch point without its pick"},
            "shared_uniform_arms": {
                "arms": [small, large], "frontier_stage": FRONTIER_STAGE,
                "read_from": f"notebooks/figures/frontier/{FRONTIER_STAGE}/<branch>-<arm>_s<seed>.parquet",
                "never_rerun": True,
                "checked_by": "study.runner.read_ledger: the frontier's config fingerprint per arm x seed",
                "frontier_declaration": "notebooks/figures/frontier/declaration.json"},
            "branch_points": {b: {"model": F.BRANCH_POINTS[b][0], "families": F.BRANCH_POINTS[b][1]}
                              for b in fr.branches},
            "seeds": list(fr.seeds),
            "budget": {"unit": "generated samples per arm (every dynamic-sampling round counted)",
                       "per_branch": {b: fr.budgets[b] for b in fr.branches},
                       "marks": {b: fr.budget_marks(b) for b in fr.branches}},
            "protocol": {"dynamic_sampling": "refill until the batch is full (the frontier's primary protocol)",
                         "max_resample_rounds": fr.round_cap},
            "evaluation": {"prompts_per_family": fr.eval_prompts, "samples_per_prompt": fr.eval_samples,
                           "at": "every budget mark", "metric": METRIC},
            "reading": {"function": f"{here}.allocation_table",
                        "thresholds": {"interval": "paired t over seeds", "level": self.level, "against": 0.0,
                                       "beats": "lo > 0", "loses_to": "hi < 0",
                                       "not_resolved": "the interval contains 0, or fewer than 2 paired seeds",
                                       "beats_both": "both intervals (against every shared uniform arm) above 0"},
                        "at": "every budget mark of each branch point, each branch point on its own",
                        "headline": (f"each branch point's budget (its last mark), stage {HEADLINE_STAGE}; the earlier marks "
                                     "are read the same way and reported as the curve, and until_signal as the "
                                     "secondary arm, neither as further claims (no multiplicity correction)"),
                        "words": f"{here}.allocation_reading"},
            "reported_beside": {"function": f"{here}.allocation_summary",
                                "what": ("per arm: informative groups per generated sample (with its t interval over "
                                         "seeds), the share of samples in informative groups, N per prompt (mean, "
                                         "max, histogram shares) from the trainer's alloc/* metrics")},
        }


#: The allocation study as pre-registered (notebooks/figures/allocation/declaration.json): the frontier's arms,
#: seeds, budgets, marks and protocol, the Config defaults for the allocators' options, cap = the BroRL arm's N.
ALLOCATION = AllocationStudy()


# ---- the reading (a function on per-seed tables; fixed before the run) ---------------------------------------------
def classify(gap: Mapping) -> str:
    """One paired interval of allocation - uniform ({n, lo, hi}) by the declared thresholds: ``'beats'`` (n >= 2,
    lo > 0), ``'loses_to'`` (n >= 2, hi < 0), else ``'not_resolved'``."""
    ok = gap["n"] >= 2 and np.isfinite(gap["lo"]) and np.isfinite(gap["hi"])
    return "beats" if ok and gap["lo"] > 0 else "loses_to" if ok and gap["hi"] < 0 else "not_resolved"


def allocation_reading(gaps: Mapping[str, Mapping], *, allocation: str = "allocation") -> str:
    """The reading in words from {uniform arm: {n, lo, hi}} (paired intervals of allocation - uniform, :func:`classify`
    each): ``"<alloc> beats both (a, b)"`` only when every interval lies above 0; else ``"<alloc> beats a; loses to
    b; not resolved against c"`` (the parts that apply)."""
    by = {k: [a for a, g in gaps.items() if classify(g) == k] for k in ("beats", "loses_to", "not_resolved")}
    if len(by["beats"]) == len(gaps) >= 2:
        return f"{allocation} beats both ({', '.join(by['beats'])})"
    words = {"beats": "beats", "loses_to": "loses to", "not_resolved": "not resolved against"}
    return f"{allocation} " + "; ".join(f"{words[k]} {', '.join(v)}" for k, v in by.items() if v)


def allocation_table(points: pd.DataFrame, *, allocation: str, uniform: Sequence[str],
                     level: float = LEVEL) -> pd.DataFrame:
    """THE reading, at every mark (and branch point, when ``points`` has a ``branch`` column): the allocation arm
    minus each uniform arm on their paired seeds (:func:`brorl_lab.lab.stats.paired_t_interval` at ``level``)::

        d_s = v_alloc(s) - v_u(s)  for the seeds s where both arms reached the mark      # [n]
        gap = mean(d),   [lo, hi] = gap -+ t_{(1+level)/2, n-1} sd(d) / sqrt(n)           # NaN when n < 2

    ``points`` is :func:`brorl_lab.study.paid.grid_points`' per-seed table (arm, seed, mark, value). One row per
    branch and mark: ``gap_<arm>``, ``lo_<arm>``, ``hi_<arm>``, ``n_<arm>`` per uniform arm, the arms it
    ``beats``, ``loses_to`` and is ``not_resolved`` against, ``beats_both`` and ``reading``
    (:func:`allocation_reading`)."""
    from brorl_lab.lab.stats import paired_t_interval

    need = {"arm", "seed", "mark", "value"}
    if not isinstance(points, pd.DataFrame) or not need <= set(points.columns):
        raise ValueError(f"points: allowed: a per-seed table with columns {sorted(need)} (study.paid.grid_points)")
    missing = [a for a in (allocation, *uniform) if a not in set(points["arm"])]
    if missing:
        raise ValueError(f"points: no rows of arm(s) {missing}; allowed: arms {sorted(set(points['arm']))}")
    pts = points if "branch" in points.columns else points.assign(branch="")
    rows = []
    for (branch, mark), g in pts.groupby(["branch", "mark"], sort=True):
        w = g.pivot_table(index="seed", columns="arm", values="value")  # [seeds, arms], NaN where not measured
        row, gaps = {"branch": branch, "mark": mark, "allocation": allocation}, {}
        for u in uniform:
            pair = w[[allocation, u]].dropna() if {allocation, u} <= set(w.columns) else pd.DataFrame(columns=[0, 1])
            if len(pair):
                r = paired_t_interval(pair[allocation].to_numpy(), pair[u].to_numpy(), level=level)
            else:
                r = {"n": 0, "mean": np.nan, "lo": np.nan, "hi": np.nan}
            gaps[u] = r
            row.update({f"gap_{u}": r["mean"], f"lo_{u}": r["lo"], f"hi_{u}": r["hi"], f"n_{u}": int(r["n"])})
        text = allocation_reading(gaps, allocation=allocation)
        row.update({k: [u for u in uniform if classify(gaps[u]) == k] for k in ("beats", "loses_to", "not_resolved")})
        row.update({"beats_both": text.startswith(f"{allocation} beats both"), "reading": text})
        rows.append(row)
    out = pd.DataFrame(rows)
    return out if "branch" in points.columns else out.drop(columns="branch")


def allocation_per_seed(metrics: pd.DataFrame) -> pd.DataFrame:
    """Per branch point (when given), arm and seed, over the training steps of the long metrics table (arm, seed,
    step, samples and the trainer's ``alloc/*`` columns): informative groups per generated sample, the share of
    generated samples that sat in an informative group, N per prompt (mean over every generated group, max) and the
    histogram as shares of groups per bin (``share_n_le_<edge>``, ``share_n_gt_<edge>``). Every generated group of a
    step counts, refill rounds included."""
    need = {"arm", "seed", "step", "samples", f"{ALLOC_PREFIX}informative_groups", f"{ALLOC_PREFIX}n_max"}
    if not isinstance(metrics, pd.DataFrame) or not need <= set(metrics.columns):
        raise ValueError(f"metrics: allowed: a long metrics table with columns {sorted(need)}")
    bins = [c for c in metrics.columns if c.startswith(f"{ALLOC_PREFIX}n_le_") or c.startswith(f"{ALLOC_PREFIX}n_gt_")]
    df = metrics[metrics["step"] > 0]
    keys = ["branch", "arm", "seed"] if "branch" in df.columns else ["arm", "seed"]
    rows = []
    for key, s in df.groupby(keys, sort=False):
        samples = float(s["samples"].sum())
        groups = float(s[bins].sum().sum())
        share = s[f"{ALLOC_PREFIX}informative_sample_share"] if f"{ALLOC_PREFIX}informative_sample_share" in s \
            else pd.Series(np.nan, index=s.index)
        rows.append({**dict(zip(keys, key)),
                     "informative_per_sample": float(s[f"{ALLOC_PREFIX}informative_groups"].sum()) / samples,
                     "informative_sample_share": float((share * s["samples"]).sum()) / samples,
                     "n_mean": samples / groups if groups else np.nan, "n_max": int(s[f"{ALLOC_PREFIX}n_max"].max()),
                     **{f"share_{c.removeprefix(ALLOC_PREFIX)}": float(s[c].sum()) / groups if groups else np.nan
                        for c in bins}})
    return pd.DataFrame(rows)


def allocation_summary(metrics: pd.DataFrame) -> pd.DataFrame:
    """:func:`allocation_per_seed` over seeds, per branch point (when given) and arm: informative groups per
    generated sample (mean over seeds with its t interval), the informative sample share and N per prompt (means;
    the max of the maxima) and the histogram's shares (means)."""
    from brorl_lab.lab.stats import t_interval

    per_seed = allocation_per_seed(metrics)
    keys = ["branch", "arm"] if "branch" in per_seed.columns else ["arm"]
    rows = []
    for key, t in per_seed.groupby(keys, sort=False):
        r = t_interval(t["informative_per_sample"].to_numpy())
        key = key if isinstance(key, tuple) else (key,)
        rows.append({**dict(zip(keys, key)), "seeds": len(t), "informative_per_sample": r["mean"],
                     "informative_per_sample_lo": r["lo"], "informative_per_sample_hi": r["hi"],
                     "informative_sample_share": float(t["informative_sample_share"].mean()),
                     "n_mean": float(t["n_mean"].mean()), "n_max": int(t["n_max"].max()),
                     **{c: float(t[c].mean()) for c in t.columns if c.startswith("share_")}})
    return pd.DataFrame(rows)


def signal_gaps(metrics: pd.DataFrame, *, allocation: str, uniform: Sequence[str], level: float = LEVEL
                ) -> pd.DataFrame:
    """The mechanism the allocator is built for, read on its own runs: per branch point (when given) and uniform arm,
    the allocation arm's informative groups per generated sample minus the uniform arm's on their paired seeds, with
    a ``level`` paired t interval (columns gap, lo, hi, n). An allocator that spends the same samples on more mixed
    groups shows gap > 0 here whatever held-out pass@1 does."""
    from brorl_lab.lab.stats import paired_t_interval

    per_seed = allocation_per_seed(metrics)
    groups = per_seed.groupby("branch", sort=False) if "branch" in per_seed.columns else [(None, per_seed)]
    rows = []
    for branch, g in groups:
        w = g.pivot(index="seed", columns="arm", values="informative_per_sample")
        for u in uniform:
            if allocation not in w or u not in w:
                continue
            pair = w[[allocation, u]].dropna()
            r = paired_t_interval(pair[allocation].to_numpy(), pair[u].to_numpy(), level=level)
            rows.append({**({"branch": branch} if branch is not None else {}), "uniform": u, "gap": r["mean"],
                         "lo": r["lo"], "hi": r["hi"], "n": len(pair)})
    return pd.DataFrame(rows)


# ---- the stages, run by the study runner --------------------------------------------------------------------------
def read_picks(study: Optional[AllocationStudy] = None) -> dict:
    """{branch: {arm: lr}}: the frontier's picks (:func:`brorl_lab.study.frontier.stage_picks`: its lr pilot's, the
    amendment's longer pilot's where that names the branch point); missing is an error saying what to run."""
    st = study or ALLOCATION
    path = st.frontier_root / "lr_pilot" / "lr_picks.csv"
    if not path.is_file():
        raise ValueError(f"lr picks: {repo_relative(path)} is missing; allowed: run the frontier's lr pilot to its end "
                         "first (python -m brorl_lab.study.frontier run lr_pilot): this study runs at its "
                         f"{st.base_arm} pick")
    return F.stage_picks(st.frontier_root)


def run_stage(stage: str, *, out: str | Path = "runs/allocation", ledger: Optional[str | Path] = None,
              ship: bool = True, study: Optional[AllocationStudy] = None, jobs: Optional[int] = 2,
              threads: Optional[int] = 1, ray: Optional[str] = None, progress: bool = True,
              command: Optional[str] = None):
    """Run stage ``stage``'s allocation arms (every branch point x the frontier's seeds) through
    :func:`brorl_lab.study.runner.run_grid`: the declaration (:meth:`AllocationStudy.to_declaration`) committed in
    ``ledger`` (default ``notebooks/figures/allocation``; enforced with ``ship``), each finished arm x seed into
    ``ledger/<stage>/`` at once, runs already there read back. The uniform arms are not run here (they are the
    frontier's, read by :func:`read_stage`). Refuses to start without the frontier's lr picks. Returns the
    :class:`~brorl_lab.study.runner.GridRun`."""
    from brorl_lab.study.recipe import resolve_experiment_model
    from brorl_lab.study.runner import run_grid

    st = study or ALLOCATION
    check_stage(stage)
    root = Path(ledger) if ledger else LEDGER
    picks = read_picks(st)
    arms = st.stage_arms(stage, picks)  # the branch points with lr picks (each waits for its pilot)
    cks = {b: resolve_experiment_model(F.BRANCH_POINTS[b][0]) for b in st.picked(picks)}
    return run_grid(f"{st.name}_{stage}", arms, seeds=st.frontier.seeds, out=Path(out) / stage,
                    declaration=st.to_declaration(), declare_in=root, ledger=root / stage, ship=ship,
                    checkpoints=cks, jobs=jobs, ray=ray, threads=threads, progress=progress, command=command)


@dataclass
class StageReading:
    """What :func:`read_stage` returns: the long metrics of every run found (columns branch and arm: the uniform
    arm's name or the stage), the per-seed points at each branch point's marks, the reading's table, the summary,
    and the runs not (yet) in either ledger (``missing``: ``<ledger>/<arm>_s<seed>``)."""

    stage: str
    metrics: pd.DataFrame
    points: pd.DataFrame
    table: pd.DataFrame
    summary: pd.DataFrame
    missing: list

    @property
    def complete(self) -> bool:
        return not self.missing


def read_stage(stage: str, *, ledger: Optional[str | Path] = None,
               study: Optional[AllocationStudy] = None) -> StageReading:
    """Stage ``stage`` read from both ledgers, nothing run: the allocation arm from ``ledger/<stage>/`` and the
    shared uniform arms from the frontier's ``ratio`` ledger, each file checked against the config it must come from
    (:func:`brorl_lab.study.runner.read_ledger`); per branch point :func:`brorl_lab.study.paid.grid_points` at the
    frontier's marks, then :func:`allocation_table` and :func:`allocation_summary` on whatever seeds are there."""
    from brorl_lab.study.arms import plan_arms
    from brorl_lab.study.paid import grid_points
    from brorl_lab.study.runner import ledger_file, read_ledger

    st = study or ALLOCATION
    check_stage(stage)
    root = Path(ledger) if ledger else LEDGER
    picks = read_picks(st)
    mine = plan_arms(st.stage_arms(stage, picks), seeds=st.frontier.seeds, root=root / "unused")
    runs = [(st.frontier_root / FRONTIER_STAGE, a, s, c) for a, s, c in st.uniform_plan(picks)]
    runs += [(root / stage, a, s, c) for a, s, c in mine]
    frames = []
    missing = [f"{b}: no lr pick yet (the frontier's pilot for it)" for b in st.frontier.branches if b not in picks]
    for folder, arm, seed, cfg in runs:
        t = read_ledger(folder, arm, seed, cfg)
        if t is None:
            missing.append(repo_relative(ledger_file(folder, arm, seed)))
            continue
        branch, short = arm.split("-")[0], arm.split("-", 1)[1]
        frames.append(t.assign(branch=branch, arm=stage if short.endswith(f"-{stage}") else short))
    metrics = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    pts = [grid_points(g, st.frontier.budget_marks(b), metric=METRIC).assign(branch=b)
           for b, g in metrics.groupby("branch", sort=False)] if len(metrics) else []
    points = pd.concat(pts, ignore_index=True) if pts else pd.DataFrame(columns=["branch", "arm", "seed", "mark",
                                                                                 "value"])
    arms_there = set(points["arm"])
    table = (allocation_table(points, allocation=stage, uniform=[u for u in st.uniform_arms if u in arms_there],
                              level=st.level)
             if stage in arms_there and arms_there - {stage} else pd.DataFrame())
    summary = allocation_summary(metrics) if len(metrics) else pd.DataFrame()
    return StageReading(stage, metrics, points, table, summary, missing)


# ---- the cost pilot (exploratory): what a generated sample costs under each allocator --------------------------------
PILOT_KEEP = ("step", "samples", "step_wall_s", "time/rollout", "time/score", "refill_rounds", "rollout_rounds",
              "ds_cap_hit", "kept_groups", "trained_samples", "alloc/informative_groups", "alloc/n_max", "alloc/n_min")


def cost_pilot(branches: Sequence[str], *, steps: int, root: str | Path, seed: int = 0, threads: int = 1,
               study: Optional[AllocationStudy] = None) -> pd.DataFrame:
    """A few fill-to-full steps of the base arm's shape from each branch point under ``uniform`` and each stage's
    allocator (:func:`brorl_lab.study.frontier.pilot_config`: the branch point's own lr, the frontier's pilot round
    cap, no evaluation; the study's allocator options), one after another at ``threads`` torch threads. An
    allocator splits a round's generation into several smaller engine calls (two_stage: the probe, then the rest;
    until_signal: one per round), so its wall time per generated sample may differ from uniform's; the study's cost
    estimate needs it. One row per training step: branch, arm ('uniform' or the stage), and :data:`PILOT_KEEP`."""
    from brorl_lab.rl.trainer import Trainer

    st = study or ALLOCATION
    check_int("steps", steps, 1)
    n, p = st.frontier.arms(FRONTIER_STAGE)[st.base_arm]
    rows = []
    for b in branches:
        for alloc in ("uniform", *STAGES):
            cfg = F.pilot_config(b, n, p, steps=steps, seed=seed, root=root, threads=threads).replace(
                rollout_allocation=alloc, allocation_probe=st.probe, allocation_cap=st.allocation_cap,
                allocation_round=st.round_size, allocation_prior_draws=st.prior_draws,
                run_name=f"{b}_{st.base_arm}_{alloc}_s{seed}")
            with Trainer(cfg, progress=False, overwrite=True) as trainer:
                df = trainer.run()
            df = df[df["step"] > 0][[k for k in PILOT_KEEP if k in df.columns]]
            rows.append(df.assign(branch=b, arm=alloc))
    return pd.concat(rows, ignore_index=True)


def pilot_summary(steps: pd.DataFrame) -> pd.DataFrame:
    """:func:`cost_pilot`'s rows per branch point and arm: steps, generated samples, wall ms per generated sample
    (whole steps: rollout, scoring, update), the rollout's share of it, refills per step (mean, max), round-cap
    hits, informative groups per generated sample, the largest N one prompt got, and the ratio of the arm's ms per
    sample to uniform's from the same branch point."""
    out = []
    for (b, arm), g in steps.groupby(["branch", "arm"], sort=False):
        samples = float(g["samples"].sum())
        out.append({"branch": b, "arm": arm, "steps": len(g), "samples": int(samples),
                    "ms_per_sample": 1000 * float(g["step_wall_s"].sum()) / samples,
                    "rollout_share": float(g["time/rollout"].sum() / g["step_wall_s"].sum()),
                    "refills_mean": float(g["refill_rounds"].mean()), "refills_max": int(g["refill_rounds"].max()),
                    "cap_hits": int(g["ds_cap_hit"].astype(bool).sum()),
                    "informative_per_sample": float(g["alloc/informative_groups"].sum()) / samples,
                    "n_max": int(g["alloc/n_max"].max())})
    t = pd.DataFrame(out)
    base = t[t["arm"] == "uniform"].set_index("branch")["ms_per_sample"]
    t["vs_uniform"] = t["ms_per_sample"] / t["branch"].map(base)
    return t


def pilot_markdown(summary: pd.DataFrame, steps: pd.DataFrame) -> str:
    """The cost pilot as the design page's markdown table (a test rebuilds the page's block from the shipped
    ``allocation_pilot.csv`` and ``allocation_pilot_steps.csv``): per branch point and arm, generated samples, ms
    per sample, its ratio to uniform, refills per step, informative groups per generated sample, the largest N of a
    prompt and the mean trained samples of a step's update batch."""
    trained = steps.groupby(["branch", "arm"], sort=False)["trained_samples"].mean()
    rows = ["| branch point | arm | generated samples | ms per sample (under load) | vs uniform | refills per step, "
            "mean (max) | informative groups per generated sample | largest N of a prompt | trained samples per "
            "update batch, mean |", "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in summary.itertuples():
        rows.append(f"| {r.branch} | {r.arm} | {r.samples:,} | {r.ms_per_sample:.2f} | {r.vs_uniform:.2f} | "
                    f"{r.refills_mean:.1f} ({r.refills_max}) | {r.informative_per_sample:.5f} | {r.n_max} | "
                    f"{trained[(r.branch, r.arm)]:,.0f} |")
    return "\n".join(rows)


# ---- the command: python -m brorl_lab.study.allocation run STAGE ----------------------------------------------------
def main(argv: Optional[Sequence[str]] = None) -> int:
    """``run STAGE [--jobs 2] [--threads 1] [--out runs/allocation] [--exploratory]``: one stage through the study
    runner (pre-registered: the committed declaration and a clean tree; ``--exploratory`` puts the ledger under
    ``--out`` and runs unregistered). ``read STAGE [--write]``: the reading from both ledgers (with ``--write``,
    ``<stage>_table.csv`` and ``<stage>_summary.csv`` beside the stage's ledger, each with its provenance).
    Errors: one line, exit 2."""
    import argparse
    import shlex
    import sys

    ap = argparse.ArgumentParser(prog="python -m brorl_lab.study.allocation")
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="one stage of the pre-registered allocation study, through the study runner")
    r.add_argument("stage", choices=list(STAGES), help="; ".join(f"{k}: {v}" for k, v in STAGES.items()))
    r.add_argument("--jobs", type=int, default=2, help="runs side by side (default 2: one per core)")
    r.add_argument("--threads", type=int, default=1, help="torch threads per run (default 1)")
    r.add_argument("--out", default="runs/allocation", help="the runs' checkpoints (not committed)")
    r.add_argument("--exploratory", action="store_true",
                   help="no pre-registration: the ledger goes under --out, records say so")
    q = sub.add_parser("read", help="the reading of one stage from both ledgers (runs nothing)")
    q.add_argument("stage", choices=list(STAGES))
    q.add_argument("--ledger", default=None, help="the study's ledger root (default notebooks/figures/allocation)")
    q.add_argument("--write", action="store_true", help="write <stage>_table.csv and <stage>_summary.csv there")
    c = sub.add_parser("pilot", help="exploratory: wall time per generated sample under uniform and each allocator")
    c.add_argument("--steps", type=int, default=3)
    c.add_argument("--branches", nargs="+", default=list(F.BRANCH_POINTS), choices=list(F.BRANCH_POINTS))
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--out", default="runs/allocation_pilot")
    c.add_argument("--figures", default=None, help="also write the tables here with provenance")
    args = ap.parse_args(argv)
    command = "python -m brorl_lab.study.allocation " + shlex.join(sys.argv[1:] if argv is None else list(argv))
    try:
        if args.cmd == "run":
            check_int("--jobs", args.jobs, 1)
            check_int("--threads", args.threads, 1)
            grid = run_stage(args.stage, out=args.out, ledger=Path(args.out) / "ledger" if args.exploratory else None,
                             ship=not args.exploratory, jobs=args.jobs, threads=args.threads, command=command)
            print(f"{args.stage}: {'finished' if grid.finished else 'stopped: run the same command again to resume'}"
                  f"; {grid.metrics['run'].nunique() if len(grid.metrics) else 0} arm x seed runs in {grid.ledger}; "
                  f"read it with: python -m brorl_lab.study.allocation read {args.stage}")
            return 0 if grid.finished else 130
        t0 = time.perf_counter()
        if args.cmd == "pilot":
            check_int("--steps", args.steps, 1)
            return run_pilot(args, command)
        got = read_stage(args.stage, ledger=args.ledger)
        if got.missing:
            print(f"{len(got.missing)} runs not in the ledgers yet (read on what is there): "
                  + ", ".join(got.missing[:4]) + (" ..." if len(got.missing) > 4 else ""))
        if len(got.table):
            print(got.table[[c for c in got.table.columns if c.startswith(("branch", "mark", "gap_", "lo_", "hi_",
                                                                            "n_", "reading"))]].to_string(index=False))
        if len(got.summary):
            print(got.summary.to_string(index=False))
        if args.write and len(got.table):
            write_reading(got, Path(args.ledger) if args.ledger else LEDGER, command, time.perf_counter() - t0)
        return 0
    except (UserError, ValueError) as e:
        print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2


def run_pilot(args, command: str) -> int:
    """The ``pilot`` command: :func:`cost_pilot` at 1 torch thread -> ``allocation_pilot_steps.csv`` and
    ``allocation_pilot.csv`` (:func:`pilot_summary`) in ``--out`` and ``--figures``, each with a provenance record
    marked exploratory."""
    import torch

    from brorl_lab.study.recipe import resolve_experiment_model
    from brorl_lab.study.results import git_commit, provenance, write_provenance

    torch.set_num_threads(1)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    commit, t0 = git_commit(), time.perf_counter()
    steps = cost_pilot(args.branches, steps=args.steps, root=out / "runs", seed=args.seed)
    written = {"allocation_pilot_steps.csv": steps, "allocation_pilot.csv": pilot_summary(steps)}
    cks = {b: resolve_experiment_model(F.BRANCH_POINTS[b][0]) for b in args.branches}
    record = provenance(command, cks, time.perf_counter() - t0, commit=commit, status="exploratory",
                        note="exploratory pilot, not pre-registered: sizes the allocation study's cost (issue 44)")
    for d in [out] + ([Path(args.figures)] if args.figures else []):
        for name, t in written.items():
            t.to_csv(d / name, index=False)
            write_provenance(d / name, record)
    print(written["allocation_pilot.csv"].to_string(index=False))
    return 0


def write_reading(got: StageReading, root: Path, command: str, wall_s: float) -> list:
    """``<stage>_table.csv`` (the reading) and ``<stage>_summary.csv`` (the allocation summary) under ``root``, each
    with a provenance record (the declaration it reads under, how many runs were still missing)."""
    from brorl_lab.study.recipe import resolve_experiment_model
    from brorl_lab.study.results import declaration_record, provenance, write_provenance

    cks = {b: resolve_experiment_model(F.BRANCH_POINTS[b][0]) for b in sorted(set(got.metrics["branch"]))}
    record = provenance(command, cks, wall_s, declaration=declaration_record(root / "declaration.json"),
                        reading=f"{__name__}.allocation_table", missing_runs=len(got.missing),
                        status="complete" if got.complete else "partial: runs missing")
    written = []
    for name, t in (("table", got.table), ("summary", got.summary)):
        path = root / f"{got.stage}_{name}.csv"
        t.to_csv(path, index=False)
        write_provenance(path, record)
        written.append(path)
    return written


if __name__ == "__main__":  # run as the package's module, so every dotted name it records is brorl_lab.study.allocation
    from brorl_lab.study.allocation import main as _main

    raise SystemExit(_main())
