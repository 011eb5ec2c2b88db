"""Held-out evaluation on the frozen eval sets: pass@1 and pass@k with the unbiased estimator.

    res = evaluate(engine, ["chain_sum", "gcd"], samples=8, k=(1, 4), prompts=64)
    res.metrics          # {"eval/chain_sum/pass@1": 0.81, ..., "eval/mean/pass@1": ...}
    res.per_item         # DataFrame: family, uid, samples, correct -> pass@k per item

pass@k is estimated per item from n samples with c correct as 1 - C(n-c, k) / C(n, k) (Chen et al. 2021; ProRL's
"reasoning boundary" is pass@128 from 256 samples) and averaged over items.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Optional

import pandas as pd

from brorl_lab.core.rundir import eval_key
from brorl_lab.core.validation import check_int
from brorl_lab.rl.algo import pass_at_k
from brorl_lab.rl.steps import rollout
from brorl_lab.rollout.engines.base import RolloutEngine, RolloutSampling
from brorl_lab.rollout.rewards import score
from brorl_lab.rollout.tasks import TaskFamily, eval_set


@dataclass
class EvalResult:
    metrics: dict
    per_item: pd.DataFrame

    def table(self) -> pd.DataFrame:
        """pass@k per family as a small table (families x k)."""
        rows = {}
        for key, v in self.metrics.items():
            fam, metric = eval_key(key)
            rows.setdefault(fam, {})[metric] = v
        return pd.DataFrame(rows).T

    def _repr_html_(self) -> str:
        return self.table().to_html(float_format=lambda x: f"{x:.3f}")


def evaluate(engine: RolloutEngine, families: Sequence[str], *, samples: int = 8, k: Sequence[int] = (1,),
             prompts: int = 64, sampling: RolloutSampling | None = None, template: str = "plain",
             chunk_prompts: int = 64, progress: bool = True,
             task_families: Optional[Mapping[str, TaskFamily]] = None) -> EvalResult:
    """Sample ``samples`` responses for the first ``prompts`` items of each family's frozen eval set and score them.

    Use the same ``sampling.seed`` to compare checkpoints on identical randomness. ``progress`` shows a bar over
    families x chunks with pass@1 so far (over every item scored yet, and the current family's), since with a real
    model this is the longest silent stretch of a run. ``task_families``: the run's own families
    (``RunSpec.families``), so a user-named task is evaluated on the eval set of the run's task_configs.
    """
    from tqdm.auto import tqdm

    check_int('samples', samples, 1)
    bad_k = [x for x in k if not (isinstance(x, int) and 1 <= x <= samples)]
    if not k or bad_k:
        raise ValueError(f"k: got {list(k)!r}; allowed: integers in [1, samples={samples}]")
    sampling = sampling or RolloutSampling(temperature=0.6, top_p=0.95)
    check_int("chunk_prompts", chunk_prompts, 1)
    sets = {fam: eval_set(fam, limit=prompts, task_families=task_families) for fam in families}
    chunks = [(fam, items[s:s + chunk_prompts]) for fam, items in sets.items() for s in range(0, len(items), chunk_prompts)]
    rows = []
    seen = {"all": [0, 0]}  # correct samples, samples: pass@1 so far is their ratio
    with tqdm(total=len(chunks), desc=f"eval {len(families)} families", unit="chunk", leave=False,
              disable=not progress) as bar:
        for fam, chunk in chunks:
            batch = score(rollout(engine, chunk, n=samples, sampling=sampling, template=template,
                                  task_families=task_families), template=template, task_families=task_families)
            correct = batch.grouped(batch.correct).sum(1).tolist()  # [P] correct samples per item
            reward = batch.grouped(batch.rewards).mean(1).tolist()
            for item, c, r in zip(chunk, correct, reward):
                rows.append({"family": fam, "uid": item.uid, "samples": samples, "correct": int(c), "reward": r})
            for key in ("all", fam):
                seen.setdefault(key, [0, 0])
                seen[key][0] += int(sum(correct))
                seen[key][1] += samples * len(chunk)
            bar.set_postfix({"pass@1": f"{seen['all'][0] / seen['all'][1]:.3f}",
                             f"{fam}/pass@1": f"{seen[fam][0] / seen[fam][1]:.3f}"}, refresh=False)
            bar.update(1)
    per_item = pd.DataFrame(rows)
    metrics = {}
    for fam, g in per_item.groupby("family", sort=False):
        for kk in k:
            metrics[f"eval/{fam}/pass@{kk}"] = float(sum(pass_at_k(samples, c, kk) for c in g["correct"]) / len(g))
    for kk in k:
        vals = [metrics[f"eval/{fam}/pass@{kk}"] for fam in families]
        metrics[f"eval/mean/pass@{kk}"] = sum(vals) / len(vals)
    return EvalResult(metrics, per_item)
