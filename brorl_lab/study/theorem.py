"""BroRL's Theorem 1 measured on the language model: one real update, decomposed per prompt, against the one-token
theory fed with the model's own first-token distribution.

What is measured (the *experiment*). From one checkpoint (the plateau branch point, or the default model), for each
N in ``n_values`` and each rollout seed s: sample N responses for each of the same ``prompts`` training prompts,
score them, filter the groups (dynamic sampling), and take ONE trainer update with the flagship recipe
(:data:`brorl_lab.study.recipe.FLAGSHIP_RECIPE`, one optimizer step of a fresh AdamW, same lr at every N), built from
the trainer's own stages (:mod:`brorl_lab.rl.steps`: filter_groups, kl_in_reward, advantages with the run's
advantage_options, make_optimizer, update). Then for
every in-batch prompt and ``held_out`` prompts per family from the frozen eval sets (never sampled):

    dQ(x) = Q_pos(x; theta_after) - Q_pos(x; theta_before)            (exact, brorl_lab.rl.answer_mass)

and, per seed, the share of prompts with dQ < 0 and the means of dQ, dQ / lr and N dQ / lr. Intervals are t
intervals over seeds (:func:`brorl_lab.lab.stats.t_interval`, quantile t_{0.975, seeds-1}).

Which normalisation. Theorem 1 is about one SGD step on the logits: every term carries lr / N, so N dQ / lr is the
quantity comparable across N (docs/THEORY.md). The trainer's first AdamW step is not SGD: with fresh moments
m_1 = (1-b1) g, v_1 = (1-b2) g^2 and bias correction, the step is

    d theta = -lr * g / (|g| + eps)  ~  -lr * sign(g)                       (element-wise)

whatever the gradient's size, so 1/N in the gradient cancels and dQ ~ lr * sum_i |dQ/d theta_i| does not shrink with
N. For Adam the meaningful normalisation is dQ / lr (and the sign: the share of prompts with dQ < 0); N dQ / lr then
grows like N. Both are reported, with raw dQ. Under SGD the 1/N would not appear either: the trainer's loss is a
``token_mean`` of A log pi over the batch, an estimate of the policy gradient whose size does not depend on N,
while the theorem's surrogate -(1/N) sum over distinct drawn tokens of R_i p_i carries it. ``optimizer='sgd'``
runs the same experiment with plain SGD.

What is predicted (the *theory*). At each in-batch prompt's first answer position the policy is a softmax over the
real vocabulary with a known correct set (:func:`brorl_lab.rl.answer_mass.first_token_problem`); fed to
:func:`brorl_lab.theory.balance.logit_problem` it gives, at each N, the expected Theorem 1 terms (normalised,
N E[dQ] / lr, exact) and P(dQ < 0) (Monte Carlo over draws), for the one-token, one-SGD-step model of the paper.

    df = run_theorem("plateau", seeds=range(8), root="runs/theorem")      # resumable; one CSV per (N, seed)
    summary = summarise_theorem(df)                                      # per N and split, t intervals over seeds
    pred = theory_predictions("plateau", ...)                            # per prompt and N
    theorem_figure(summary, pred)

or from a shell: ``python -m brorl_lab theorem``.
"""

from __future__ import annotations

import contextlib
import copy
import json
import warnings
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Optional

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from brorl_lab.core.config import Config
from brorl_lab.core.models import load_policy, make_reference
from brorl_lab.core.paths import RUNS_DIR
from brorl_lab.core.rundir import atomic_write_text
from brorl_lab.core.seeding import derive_seed
from brorl_lab.core.validation import check_int, check_seeds
from brorl_lab.lab.stats import share_interval, t_interval
from brorl_lab.rl import answer_mass as AM
from brorl_lab.rl import steps as S
from brorl_lab.rl.spec import resolve
from brorl_lab.rollout.engines import RolloutSampling, make_engine
from brorl_lab.rollout.tasks import eval_set
from brorl_lab.study.recipe import ARM_TABLE, FLAGSHIP_RECIPE, recipe_config
from brorl_lab.theory import balance

#: The N (rollouts_per_prompt) of the one update: every arm's N of the recipe's table (16, 64, 512), with 4 and 256
#: between them on the doubling-squared grid.
N_VALUES = tuple(sorted({4, 256} | {row["rollouts_per_prompt"] for row in ARM_TABLE.values()}))
#: In-batch prompts (prompts_per_step) of the update: the BroRL arm's; as many held-out prompts per family.
PROMPTS = HELD_OUT = ARM_TABLE["brorl"]["prompts_per_step"]
DEFAULT_ROOT = RUNS_DIR / "theorem"
OPTIMIZERS = ("adamw", "sgd")
SPLITS = ("in_batch", "kept", "held_out")
METRICS = ("share_neg", "dq", "dq_per_lr", "n_dq_per_lr")

__all__ = ["N_VALUES", "DEFAULT_ROOT", "OPTIMIZERS", "METRICS", "theorem_config", "TheoremSetup", "setup",
           "one_update", "measure_update", "run_theorem", "per_seed", "summarise_theorem", "theory_predictions",
           "theory_summary", "compare", "theorem_figure", "theorem_table", "first_order_dq", "theorem_study",
           "theorem_reading", "reading_of_files"]


def theorem_config(model: str = "plateau", *, lr: Optional[float] = None, **overrides) -> Config:
    """The flagship recipe (``prorl_v2``) as ONE optimizer step: ``optimizer_steps_per_step=1`` (the recipe's 2
    mini-batches would be two steps), one rollout round (``max_resample_rounds=0``: refills draw new prompts), no
    lr scaling (the same lr at every N). ``lr`` defaults to the recipe's."""
    extra = {} if lr is None else {"lr": lr}
    return recipe_config(FLAGSHIP_RECIPE, model=model, optimizer_steps_per_step=1, max_resample_rounds=0,
                         lr_scaling="none", reset_every=0, **extra, **overrides)


class TheoremSetup:
    """The checkpoint, its frozen reference, the prompts (in-batch and held-out) and their answer candidates."""

    def __init__(self, cfg: Config, *, prompts: int, held_out: int, prompt_seed: int = 0):
        check_int("prompts", prompts, 1)
        check_int("held_out", held_out, 0)
        self.cfg = cfg
        self.prompts, self.held_out, self.prompt_seed = prompts, held_out, prompt_seed  # rebuilt alike in a job
        self.policy, self.tokenizer = load_policy(cfg.model, device="cpu")
        self.spec = resolve(cfg, tokenizer=self.tokenizer)  # names checked, the run's own families, template
        self.template = self.spec.template
        self.reference = make_reference(self.policy) if cfg.kl_beta > 0 else None
        self.train_items = S.sample_prompts(cfg.tasks, prompts, seed=prompt_seed, task_families=self.spec.families)
        self.held_items = [it for fam in cfg.tasks for it in eval_set(fam, limit=held_out)]
        self.items = self.train_items + self.held_items
        self.split = np.array(["in_batch"] * len(self.train_items) + ["held_out"] * len(self.held_items))
        self.cands = AM.answer_candidates(self.items, self.tokenizer, template=self.template)
        self.q_before = self.q_pos(self.policy)

    def q_pos(self, policy) -> np.ndarray:
        return AM.q_pos(policy, self.tokenizer, self.items, temperature=self.cfg.temperature, cands=self.cands,
                        micro_batch_tokens=self.cfg.train_micro_batch_tokens)


def setup(model: str = "plateau", *, prompts: int = PROMPTS, held_out: int = HELD_OUT, lr: Optional[float] = None,
          prompt_seed: int = 0, **overrides) -> TheoremSetup:
    return TheoremSetup(theorem_config(model, lr=lr, **overrides), prompts=prompts, held_out=held_out,
                        prompt_seed=prompt_seed)


def _optimizer(policy, cfg: Config, optimizer: str) -> torch.optim.Optimizer:
    if optimizer == "adamw":  # the trainer's own optimizer, fresh
        return S.make_optimizer(policy, cfg)
    if optimizer == "sgd":
        return torch.optim.SGD(policy.parameters(), lr=cfg.effective_lr)
    raise ValueError(f"optimizer: got {optimizer!r}; allowed: {', '.join(OPTIMIZERS)}")


def one_update(st: TheoremSetup, n: int, seed: int, *, engine=None, optimizer: str = "adamw"):
    """ONE trainer update from the checkpoint at N = ``n`` with rollout seed ``seed``, through the trainer's stages
    (:mod:`brorl_lab.rl.steps`) on a copy of the policy: rollout -> score -> filter_groups (when
    ``cfg.dynamic_sampling``) -> kl_in_reward -> advantages(``advantage_options(cfg)``) -> update with a fresh
    ``make_optimizer`` (or plain SGD). Returns ``(policy_after, info)`` with ``info`` = correct counts per in-batch
    prompt [P], which groups were kept [P] and the update's metrics."""
    check_int("n", n, 2)
    cfg = st.cfg
    own = engine is None
    engine = engine if engine is not None else make_engine("torch", st.policy, st.tokenizer)
    try:
        sampling = RolloutSampling(temperature=cfg.temperature, top_p=cfg.top_p, max_new_tokens=cfg.max_new_tokens,
                                   seed=derive_seed(seed, "theorem", n))
        batch = S.score(S.rollout(engine, st.train_items, n, sampling, template=st.template, tokenizer=st.tokenizer,
                                  task_families=st.spec.families), template=st.template, reward=cfg.reward,
                        task_families=st.spec.families)
    finally:
        if own:
            engine.close()
    k = batch.grouped(batch.correct).sum(1).numpy()  # [P] correct per group
    train = S.filter_groups(batch)[0] if cfg.dynamic_sampling else batch
    survivors = {id(it) for it in train.items}  # select_prompts keeps the TaskItem objects
    kept = np.array([id(it) in survivors for it in batch.items])  # [P]
    if int(kept.sum()) != train.num_prompts:
        raise ValueError("prompts: the in-batch prompts repeat a TaskItem object; allowed: distinct items "
                         "(steps.sample_prompts draws them)")
    policy = copy.deepcopy(st.policy)
    policy.train()
    metrics = {}
    if train.num_prompts:
        train.meta["temperature"] = cfg.temperature
        train, _ = S.kl_in_reward(train, policy, st.reference, cfg=cfg)  # a no-op unless kl_placement='reward'
        adv = S.advantages(train, cfg.advantage, **S.advantage_options(cfg))
        metrics = S.update(policy, _optimizer(policy, cfg, optimizer), train, adv, cfg=cfg,
                           reference=st.reference).metrics
    return policy, {"k": k, "kept": kept, "metrics": metrics}


def measure_update(st: TheoremSetup, n: int, seed: int, *, engine=None, optimizer: str = "adamw") -> pd.DataFrame:
    """One row per prompt (in-batch, then held-out) for one update: q_before, q_after, dq, and for in-batch prompts
    the group's correct count k and whether it was kept."""
    policy, info = one_update(st, n, seed, engine=engine, optimizer=optimizer)
    q_after = st.q_pos(policy)
    P = len(st.train_items)
    k = np.concatenate([info["k"], np.full(len(st.held_items), -1)])
    kept = np.concatenate([info["kept"], np.zeros(len(st.held_items), dtype=bool)])
    return pd.DataFrame({"n": n, "seed": seed, "uid": [it.uid for it in st.items],
                         "family": [it.family for it in st.items], "split": st.split, "k": k, "kept": kept,
                         "q_before": st.q_before, "q_after": q_after, "dq": q_after - st.q_before,
                         "lr": st.cfg.effective_lr, "groups_kept": int(info["kept"][:P].sum()),
                         "grad_norm": info["metrics"].get("grad_norm", 0.0)})


def run_theorem(model: str = "plateau", *, n_values: Sequence[int] = N_VALUES, seeds: Iterable[int] = range(8),
                prompts: int = PROMPTS, held_out: int = HELD_OUT, lr: Optional[float] = None, optimizer: str = "adamw",
                root: str | Path = DEFAULT_ROOT, prompt_seed: int = 0, progress: bool = True,
                st: Optional[TheoremSetup] = None, jobs: int = 1, ray: Optional[str] = None,
                threads: Optional[int] = None) -> pd.DataFrame:
    """Every (N, seed) update of :func:`measure_update`, one CSV each under ``root/<model name>_<optimizer>/``;
    finished ones are read back (resumable: interrupt and call again), and a root written with other settings is
    an error, not a mix. Returns the long per-prompt table with a ``model`` column.

    ``jobs=1``: one update after another here. ``jobs=K`` (or ``ray``, a cluster address): one job per seed
    (:func:`theorem_job`, its N values in turn) through :func:`brorl_lab.lab.jobs.run_jobs`, ``threads`` torch
    threads each; every update is the same as here, at the same thread count."""
    seeds = check_seeds(seeds)
    n_values = [check_int("n_values", n, 2) for n in n_values]
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer: got {optimizer!r}; allowed: {', '.join(OPTIMIZERS)}")
    st = st if st is not None else setup(model, prompts=prompts, held_out=held_out, lr=lr, prompt_seed=prompt_seed)
    name = Path(model).name if model not in ("plateau", "default") else model
    out = Path(root) / f"{name}_{optimizer}"
    plan = {"model": st.cfg.model, "optimizer": optimizer, "lr": st.cfg.effective_lr, "prompts": prompts,
            "held_out": held_out, "prompt_seed": prompt_seed, "uids": [it.uid for it in st.items]}
    meta = out / "plan.json"
    if meta.is_file():
        old = json.loads(meta.read_text())
        if old != plan:
            diff = sorted(k for k in plan if old.get(k) != plan[k])
            raise ValueError(f"root: {out} holds a run with other settings ({', '.join(diff)}); allowed: the same "
                             "settings (to resume) or another root")
    else:
        atomic_write_text(meta, json.dumps(plan, indent=1))
    todo = [(n, s) for n in n_values for s in seeds if not (out / f"n{n}_s{s}.csv").is_file()]
    if jobs == 1 and ray is None:  # one after another here, on this setup and one engine
        from brorl_lab.lab.jobs import thread_count

        engine = None
        with thread_count(threads) if threads else contextlib.nullcontext():
            try:
                bar = tqdm(todo, desc=f"theorem {name}", disable=not progress)
                for n, s in bar:
                    bar.set_postfix_str(f"N={n} seed={s}")
                    engine = engine or make_engine("torch", st.policy, st.tokenizer)
                    _write_update(out, measure_update(st, n, s, engine=engine, optimizer=optimizer))
            finally:
                if engine is not None:
                    engine.close()
    elif todo:  # one job per seed (its N values in turn), each on its own copy of the setup
        from brorl_lab.lab.jobs import Job, run_jobs

        per_seed = {s: [n for n, s2 in todo if s2 == s] for s in dict.fromkeys(s for _, s in todo)}
        res = run_jobs([Job(theorem_job, (st.cfg, st.prompts, st.held_out, st.prompt_seed, ns, s, optimizer,
                                          str(out.resolve())), name=f"{name} seed {s}")
                        for s, ns in per_seed.items()],
                       workers=jobs, threads=threads, ray=ray, progress=progress, desc=f"theorem {name}")
        if not res.complete:
            warnings.warn(f"run_theorem stopped ({res.stopped}); call again with the same arguments to resume",
                          stacklevel=2)
    done = [out / f"n{n}_s{s}.csv" for n in n_values for s in seeds if (out / f"n{n}_s{s}.csv").is_file()]
    df = pd.concat([pd.read_csv(p) for p in done], ignore_index=True) if done else pd.DataFrame(columns=["n", "seed"])
    # read back from the CSVs: the same table whichever path (here, a worker, a Ray node) computed an update
    df.insert(0, "model", name)
    return df


def _write_update(out: Path, df: pd.DataFrame) -> None:
    atomic_write_text(out / f"n{int(df['n'].iloc[0])}_s{int(df['seed'].iloc[0])}.csv", df.to_csv(index=False))


def theorem_job(cfg: Config, prompts: int, held_out: int, prompt_seed: int, n_values: Sequence[int], seed: int,
                optimizer: str, out: str) -> list[int]:
    """The updates of one seed at each N of ``n_values`` on a fresh :class:`TheoremSetup` (what
    :func:`run_theorem` runs as a job in a worker process or on a Ray node), one CSV each into ``out``; returns
    the N values written."""
    st = TheoremSetup(cfg, prompts=prompts, held_out=held_out, prompt_seed=prompt_seed)
    engine = make_engine("torch", st.policy, st.tokenizer)
    try:
        for n in n_values:
            _write_update(Path(out), measure_update(st, n, seed, engine=engine, optimizer=optimizer))
    finally:
        engine.close()
    return list(n_values)


# ---- summaries -----------------------------------------------------------------------------------------------------
def per_seed(df: pd.DataFrame) -> pd.DataFrame:
    """One row per (model, N, split, seed): the share of prompts with dQ < 0 and the means of dQ, dQ / lr and
    N dQ / lr over the prompts. Splits: ``in_batch`` (every sampled prompt), ``kept`` (the in-batch prompts whose
    group survived dynamic sampling, i.e. carried a gradient; a seed where none did has no row) and
    ``held_out``."""
    d = pd.concat([df, df[df["kept"].astype(bool)].assign(split="kept")], ignore_index=True)
    d = d.assign(neg=d["dq"] < 0, dq_per_lr=d["dq"] / d["lr"], n_dq_per_lr=d["n"] * d["dq"] / d["lr"])
    keys = [c for c in ("model", "n", "split", "seed") if c in d]
    return d.groupby(keys, sort=True).agg(share_neg=("neg", "mean"), dq=("dq", "mean"), dq_per_lr=("dq_per_lr", "mean"),
                                          n_dq_per_lr=("n_dq_per_lr", "mean"), neg=("neg", "sum"),
                                          prompts=("neg", "size"),
                                          groups_kept=("groups_kept", "first")).reset_index()


def summarise_theorem(df: pd.DataFrame, *, level: float = 0.95) -> pd.DataFrame:
    """Per (model, N, split): for each of :data:`METRICS` the mean over seeds with its t interval (``_lo``,
    ``_hi``), and the number of seeds. ``share_neg`` is a share: pooled over seeds (prompts losing mass / prompts)
    with a cluster-bootstrap interval over seeds that stays inside [0, 1] (:func:`brorl_lab.lab.stats.share_interval`;
    a t interval left it: "0.06 [-0.05, 0.18]")."""
    ps = per_seed(df)
    rows = []
    keys = [c for c in ("model", "n", "split") if c in ps]
    for key, g in ps.groupby(keys, sort=True):
        row = dict(zip(keys, key if isinstance(key, tuple) else (key,)))
        row["seeds"] = len(g)
        row["groups_kept"] = g["groups_kept"].mean()
        for m in METRICS:
            if m == "share_neg":
                r = share_interval(g["neg"].to_numpy(), g["prompts"].to_numpy(), level=level)
                row.update({m: r["share"], f"{m}_lo": r["lo"], f"{m}_hi": r["hi"]})
                continue
            r = t_interval(g[m].to_numpy(), level=level)
            row.update({m: r["mean"], f"{m}_lo": r["lo"], f"{m}_hi": r["hi"]})
        rows.append(row)
    return pd.DataFrame(rows)


# ---- the theory on the model's own first-token distribution --------------------------------------------------------
def theory_predictions(st: TheoremSetup, *, n_values: Sequence[int] = N_VALUES, r_c: float = 1.0,
                       r_w: float = -1.0, trials: int = 400, seed: int = 0, progress: bool = False) -> pd.DataFrame:
    """For each in-batch prompt and N: the one-token problem at its first answer position
    (:func:`brorl_lab.rl.answer_mass.first_token_problem`) through :func:`brorl_lab.theory.balance.n_sweep`: the
    expected normalised Theorem 1 terms N E[dQ] / lr (exact: V is small enough for pair probabilities), the
    probability that dQ < 0 (``p_neg``, Monte Carlo over ``trials`` draws), q_pos_first (the one-token Q_pos) and
    the sequence-level Q_pos for comparison. Rewards (r_c, r_w) are the theory's (paper: +1 / -1)."""
    rows = []
    for i, it in enumerate(tqdm(st.train_items, desc="theory", disable=not progress)):
        d = AM.first_token_problem(st.policy, st.tokenizer, it, temperature=st.cfg.temperature, template=st.template)
        if not d["correct"].any():
            continue
        prob = balance.logit_problem(d["logits"], d["correct"], name=it.uid)
        sweep = balance.n_sweep(prob.p, prob.correct, list(n_values), r_c=r_c, r_w=r_w, trials=trials,
                                seed=seed + i, exact_max_vocab=prob.vocab)
        sweep.insert(0, "uid", it.uid)
        sweep.insert(1, "family", it.family)
        sweep["q_pos_first"] = d["q_pos_first"]
        sweep["ambiguous_mass"] = d["ambiguous_mass"]
        sweep["q_pos"] = float(st.q_before[i])
        rows.append(sweep)
    return pd.concat(rows, ignore_index=True)


def theory_summary(pred: pd.DataFrame) -> pd.DataFrame:
    """Per N, over prompts: the expected share of prompts with dQ < 0 (mean of p_neg) and the mean expected terms."""
    cols = [*balance.TERMS_AND_TOTAL, "p_neg"]
    return pred.groupby("n")[cols].mean().reset_index().rename(columns={"p_neg": "share_neg", "total": "n_dq_per_lr"})


def compare(summary: pd.DataFrame, theory: pd.DataFrame) -> pd.DataFrame:
    """Measured (in-batch) beside predicted, per (model and) N: the share of prompts with dQ < 0 and N dQ / lr, with
    the theory's expected terms."""
    keys = ["model", "n"] if "model" in summary and "model" in theory else ["n"]
    m = summary[summary["split"] == "in_batch"][[*keys, "share_neg", "share_neg_lo", "share_neg_hi", "n_dq_per_lr",
                                                 "n_dq_per_lr_lo", "n_dq_per_lr_hi", "dq_per_lr"]]
    t = theory[[*keys, "share_neg", "n_dq_per_lr", *balance.TERMS]].rename(
        columns={"share_neg": "theory_share_neg", "n_dq_per_lr": "theory_n_dq_per_lr"})
    return m.merge(t, on=keys)


def theorem_table(summary: pd.DataFrame, theory: Optional[pd.DataFrame] = None) -> str:
    """A markdown table: per model, N and split, share of dQ < 0 and mean N dQ / lr and dQ / lr with intervals."""
    def iv(r, m, f):
        return f"{f(r[m])} [{f(r[m + '_lo'])}, {f(r[m + '_hi'])}]"

    head = "| model | N | prompts | share dQ<0 | mean N·dQ/lr | mean dQ/lr | mean dQ | theory P(dQ<0) |"
    lines = [head, "|---|---:|---|---|---|---|---|---|"]
    for _, r in summary.iterrows():
        th = ""
        if theory is not None and r["split"] == "in_batch":
            hit = theory[(theory["n"] == r["n"]) & (theory.get("model", r.get("model")) == r.get("model"))]
            th = f"{hit['share_neg'].iloc[0]:.2g}" if len(hit) else ""
        lines.append(f"| {r.get('model', '')} | {int(r['n'])} | {r['split'].replace('_', '-')} | "
                     f"{iv(r, 'share_neg', lambda v: f'{v:.2f}')} | {iv(r, 'n_dq_per_lr', lambda v: f'{v:+.3g}')} | "
                     f"{iv(r, 'dq_per_lr', lambda v: f'{v:+.3g}')} | {r['dq']:+.2e} | {th} |")
    return "\n".join(lines)


def theorem_figure(summary: pd.DataFrame, theory: Optional[pd.DataFrame] = None, *,
                   title: str = "Theorem 1 on the language model: one update, measured vs predicted"):
    """Rows: models. Columns: share of prompts with dQ < 0 (measured in-batch and held-out, with t intervals over
    seeds; the theory's expected share dashed), mean dQ / lr (Adam's scale) and mean N dQ / lr (THEORY.md's scale;
    the theory's N E[dQ] / lr on the right axis). ``theory``: :func:`theory_summary` rows with a ``model`` column."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    from brorl_lab.lab.plots import PALETTE

    models = list(dict.fromkeys(summary["model"])) if "model" in summary else [""]
    fig = make_subplots(rows=len(models), cols=3, specs=[[{}, {}, {"secondary_y": True}]] * len(models),
                        subplot_titles=[t for m in models for t in (f"{m}: share of prompts with dQ_pos < 0",
                                                                    f"{m}: mean dQ_pos / lr (Adam's scale)",
                                                                    f"{m}: mean N·dQ_pos / lr (theorem's scale)")],
                        vertical_spacing=0.12)
    for row, m in enumerate(models, start=1):
        sm = summary[summary["model"] == m] if m else summary
        for j, split in enumerate(SPLITS):
            g = sm[sm["split"] == split].sort_values("n")
            for col, metric in enumerate(("share_neg", "dq_per_lr", "n_dq_per_lr"), start=1):
                fig.add_trace(go.Scatter(
                    x=g["n"], y=g[metric], mode="lines+markers", name=f"measured, {split.replace('_', '-')}",
                    legendgroup=split, showlegend=row == 1 and col == 1, line=dict(color=PALETTE[j]),
                    error_y=dict(type="data", symmetric=False, array=g[f"{metric}_hi"] - g[metric],
                                 arrayminus=g[metric] - g[f"{metric}_lo"])), row=row, col=col)
        if theory is not None:
            th = theory[theory["model"] == m] if "model" in theory else theory
            fig.add_trace(go.Scatter(x=th["n"], y=th["share_neg"], mode="lines+markers", name="theory (one token, "
                                     "one SGD step): E[share]", legendgroup="theory", showlegend=row == 1,
                                     line=dict(color="black", dash="dash")), row=row, col=1)
            fig.add_trace(go.Scatter(x=th["n"], y=th["n_dq_per_lr"], mode="lines+markers", name="theory: N E[dQ]/lr "
                                     "(right axis)", legendgroup="theory2", showlegend=row == 1,
                                     line=dict(color="black", dash="dot")), row=row, col=3, secondary_y=True)
        for col in (1, 2, 3):
            fig.update_xaxes(type="log", title_text="N (rollouts per prompt)", row=row, col=col)
        fig.update_yaxes(range=[0, 1], row=row, col=1)
    fig.update_layout(title_text=title, height=380 * len(models) + 80, legend=dict(orientation="h", y=-0.12))
    return fig


def first_order_dq(st: TheoremSetup, policy_after: torch.nn.Module) -> np.ndarray:
    """The first-order prediction of each prompt's dQ from the gradient at the checkpoint:
    dQ_1(x) = grad_theta Q_pos(x; theta_before) . (theta_after - theta_before)   [prompts]. At a small enough step
    it equals the measured dQ; how far it is at the recipe's lr says how non-linear one update is."""
    params = list(st.policy.parameters())
    after = dict(policy_after.named_parameters())
    delta = [(after[name].detach() - p.detach()).double() for name, p in st.policy.named_parameters()]
    out = np.zeros(len(st.items))
    for i, item in enumerate(st.items):  # one small graph per prompt: P backward passes of one prompt each
        cands = AM.answer_candidates([item], st.tokenizer, template=st.template)
        q = AM.q_pos_tensor(st.policy, cands, temperature=st.cfg.temperature,
                            micro_batch_tokens=st.cfg.train_micro_batch_tokens)[0]
        grads = torch.autograd.grad(q, params, allow_unused=True)
        out[i] = sum(float((g.double() * d).sum()) for g, d in zip(grads, delta) if g is not None)
    return out


FIGURE_NAME = "theorem_on_the_model"
#: The reading's thresholds, declared with it: per model, in-batch mean dQ / lr (Adam's scale: the comparable one
#: under the trainer's optimizer) at the smallest against the largest N, each with its 95% t interval over seeds.
READING_THRESHOLDS = {"split": "in_batch", "metric": "dq_per_lr", "interval": "t over seeds", "level": 0.95,
                      "compare": "smallest N against largest N: disjoint intervals", "against": 0.0}


def theorem_reading(seeds: pd.DataFrame) -> dict:
    """The theorem study's ONE reading (named in its declaration, :func:`theorem_declaration`), per model from the
    per-seed rows (:func:`per_seed`; the shipped theorem_on_the_model_per_seed.csv): does one update's in-batch gain
    per unit lr (mean dQ / lr, its 95% t interval over seeds, as :func:`summarise_theorem`'s) change with N?
    ``rises with N`` when its interval at the largest N lies above the one at the smallest N, ``falls with N``
    when below, ``unresolved`` when they overlap; and at the largest N whether the update ``gains`` (interval above
    0), ``loses`` (below) or ``neither`` correct mass. ``{model: {trend, at_largest, n_lo, n_hi, lo: [mean, lo, hi],
    hi: [...]}}``."""
    t = READING_THRESHOLDS
    rows = seeds[seeds["split"] == t["split"]]
    out = {}
    for model, g in rows.groupby("model", sort=True) if "model" in rows else [("", rows)]:
        ns = sorted(set(g["n"]))
        a, b = (t_interval(g.loc[g["n"] == n, t["metric"]].to_numpy(float), level=t["level"]) for n in
                (ns[0], ns[-1]))
        trend = "rises with N" if b["lo"] > a["hi"] else "falls with N" if b["hi"] < a["lo"] else "unresolved"
        sign = "gains" if b["lo"] > t["against"] else "loses" if b["hi"] < t["against"] else "neither"
        out[str(model)] = {"trend": trend, "at_largest": sign, "n_lo": int(ns[0]), "n_hi": int(ns[-1]),
                           "lo": [a["mean"], a["lo"], a["hi"]], "hi": [b["mean"], b["lo"], b["hi"]]}
    return out


def reading_line(reading: dict) -> str:
    """The reading in one line per model."""
    return "; ".join(f"{model}: in-batch dQ/lr {r['trend']} (N={r['n_lo']}: {r['lo'][0]:+.3g} [{r['lo'][1]:+.3g}, "
                     f"{r['lo'][2]:+.3g}]; N={r['n_hi']}: {r['hi'][0]:+.3g} [{r['hi'][1]:+.3g}, {r['hi'][2]:+.3g}]), "
                     f"the update {r['at_largest']} correct mass at N={r['n_hi']}" for model, r in reading.items())


def reading_of_files(folder: str | Path) -> dict:
    """The reading (:func:`theorem_reading`) of the per-seed rows a run wrote in ``folder``: the shipped
    ``theorem_on_the_model_per_seed.csv`` (notebooks/figures) or a run root's ``per_seed.csv``; the one path by which
    the CLI (``theorem --read``) and a notebook read a folder."""
    from brorl_lab.core.validation import UserError

    folder = Path(folder)
    for name in (f"{FIGURE_NAME}_per_seed.csv", "per_seed.csv"):
        if (folder / name).is_file():
            return theorem_reading(pd.read_csv(folder / name))
    raise UserError(f"folder: {folder} holds no {FIGURE_NAME}_per_seed.csv or per_seed.csv; allowed: a --root "
                    "`python -m brorl_lab theorem` wrote, or notebooks/figures")


def theorem_declaration(models: Sequence[str], settings: dict) -> dict:
    """The theorem study as declared before its run (:func:`brorl_lab.study.results.write_declaration`)."""
    return {"study": "theorem", "models": list(models), **settings,
            "reading": {"function": f"{theorem_reading.__module__}.{theorem_reading.__qualname__}",
                        "thresholds": dict(READING_THRESHOLDS)}}


def theorem_study(models: Sequence[str] = ("plateau", "default"), *, n_values: Sequence[int] = N_VALUES,
                  seeds: Iterable[int] = range(8), prompts: int = PROMPTS, held_out: int = HELD_OUT,
                  lr: Optional[float] = None, optimizer: str = "adamw", trials: int = 400,
                  root: str | Path = DEFAULT_ROOT, figure_dir: Optional[str | Path] = None,
                  progress: bool = True, command: Optional[str] = None, jobs: int = 1, ray: Optional[str] = None,
                  threads: Optional[int] = None, ship: bool = False) -> dict:
    """The whole study on the runner's machinery (:mod:`brorl_lab.study.runner`): the start
    (:func:`~brorl_lab.study.results.start_of_run`) and the declaration (``root/declaration.json``:
    :func:`theorem_declaration`, enforced by :func:`~brorl_lab.study.results.require_preregistered` with ``ship``);
    :func:`run_theorem` (``jobs`` / ``ray`` / ``threads`` as there) and :func:`theory_predictions` for each model;
    the summaries, the markdown table, the figure and the one reading (:func:`theorem_reading`). Writes
    ``root/{per_prompt,per_seed,summary,theory,theory_per_prompt}.csv`` and ``root/table.md`` with their provenance
    and ``root/verdict.json`` / ``verdict.txt`` (:func:`~brorl_lab.study.runner.write_study_files`), the figure as
    ``root/theorem_on_the_model.png``, and into ``figure_dir`` (when given: notebooks/figures) the shipped results
    files (the summary, the per-seed table and the theory, each with the same provenance; the page's figure there
    is drawn from them by ``python -m brorl_lab render``). Resumable like run_theorem."""
    import time

    from brorl_lab.core.console import live_bars
    from brorl_lab.study.results import (
        declaration_record,
        provenance,
        require_preregistered,
        start_of_run,
        write_declaration,
        write_provenance,
    )
    from brorl_lab.study.runner import heartbeat, write_study_files

    t0, start = time.perf_counter(), start_of_run()  # the commit and UTC time when the run starts
    seeds = check_seeds(seeds)
    settings = dict(n_values=list(n_values), seeds=list(seeds), prompts=prompts, held_out=held_out, lr=lr,
                    optimizer=optimizer, trials=trials)
    decl_path = write_declaration(root, theorem_declaration(models, settings))
    declared = require_preregistered(decl_path) if ship else declaration_record(decl_path)
    if threads:
        torch.set_num_threads(threads)
    frames, theories, preds, setups = [], [], [], []
    beat = heartbeat(Path(root), "theorem", runs=len(models), enabled=progress and not live_bars(),
                     count=lambda: len(theories), unit="models (every N x seed, then the theory)")
    with beat:
        for model in models:
            st = setup(model, prompts=prompts, held_out=held_out, lr=lr)
            setups.append(st)
            frames.append(run_theorem(model, n_values=n_values, seeds=seeds, prompts=prompts, held_out=held_out,
                                      lr=lr, optimizer=optimizer, root=root, progress=progress, st=st, jobs=jobs,
                                      ray=ray, threads=threads))
            name = frames[-1]["model"].iloc[0]
            pred = theory_predictions(st, n_values=n_values, trials=trials, progress=progress)
            pred.insert(0, "model", name)
            preds.append(pred)
            th = theory_summary(pred)
            th.insert(0, "model", name)
            theories.append(th)
    df, pred, theory = (pd.concat(x, ignore_index=True) for x in (frames, preds, theories))
    summary, seeds_table = summarise_theorem(df), per_seed(df)
    models_used = {m: s.cfg.model for m, s in zip(dict.fromkeys(df["model"]), setups)}
    root = Path(root)
    tables = {"per_prompt": df, "per_seed": seeds_table, "summary": summary, "theory": theory,
              "theory_per_prompt": pred}
    for fname, table in tables.items():
        atomic_write_text(root / f"{fname}.csv", table.to_csv(index=False))
    table = theorem_table(summary, theory)
    atomic_write_text(root / "table.md", table + "\n")
    reading = theorem_reading(seeds_table)
    record = provenance(command or f"brorl_lab.study.theorem.theorem_study({list(models)!r}, seeds={len(seeds)})",
                        models_used, time.perf_counter() - t0, commit=start["commit"],
                        started_at=start["started_at"], declaration=declared, settings={**settings,
                                                                                         "seeds": len(seeds)})
    files = write_study_files(root, [root / f"{fname}.csv" for fname in tables] + [root / "table.md"], record,
                              {"reading": reading}, reading_line(reading))
    if figure_dir is not None:  # the shipped set; the page's figure there is drawn by `python -m brorl_lab render`
        Path(figure_dir).mkdir(parents=True, exist_ok=True)
        for fname, t in (("summary", summary), ("per_seed", seeds_table), ("theory", theory)):  # its numbers
            path = Path(figure_dir) / f"{FIGURE_NAME}_{fname}.csv"
            atomic_write_text(path, t.to_csv(index=False, float_format="%.6g"))
            files += [path, write_provenance(path, record)]
    fig, png = theorem_figure(summary, theory), root / f"{FIGURE_NAME}.png"
    try:
        fig.write_image(str(png), width=1300)
    except Exception as e:  # noqa: BLE001 - no Chromium/kaleido: the tables are still written
        png = f"PNG export skipped ({type(e).__name__}: {str(e).strip().splitlines()[0][:200]})"
    return {"per_prompt": df, "summary": summary, "theory": theory, "theory_per_prompt": pred, "table": table,
            "figure": fig, "png": png, "reading": reading, "text": reading_line(reading), "files": files,
            "record": record}
