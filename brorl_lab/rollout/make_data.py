"""Regenerate the frozen eval sets: ``data/eval/<family>.jsonl``, one :class:`~brorl_lab.rollout.tasks.TaskItem` per line.

    python -m brorl_lab make-data                          # every family of gym.py and math_tasks.py (and the
                                                           # difficulty variants), 200 items each
    python -m brorl_lab make-data --families code --size 100

An eval set is a seeded sample of the distribution training draws from, held out from training:

* **Held out.** Eval items come from ``split="eval"``: the family's generator keeps only questions whose text hashes
  into the eval partition (``sha256(question) mod 8 == 0``, :func:`brorl_lab.rollout.tasks.gym.split_of`), and every
  training stream keeps only the others. So no eval question can ever be trained on, for any training seed, even
  where the question space is so small that a training run sees every train question many times (``chain_sum`` with
  two terms has a few hundred). Drawing eval items from a disjoint *seed* instead would not do: on such spaces the
  training stream emits every question, and none would be left to hold out.
* **Drawn like training.** Training draws i.i.d. from the generator (repeats included), so the eval set does too:
  repeated questions are kept, each with its own uid (the old rule, "the first 200 *distinct* questions", thinned out
  the small strata: 6.5% one-digit products against 50% in training). The hash partition is independent of a
  question's difficulty, but a small stratum gets a random share of it (the two-term ``chain_sum`` questions are 52%
  of training draws and 31% of raw eval draws), so the set is *post-stratified*: each stratum -- the generator's own
  difficulty draws, :func:`stratum` -- gets ``round(size * w_s)`` items (largest remainder), ``w_s`` its share of
  :data:`TRAIN_REFERENCE` draws of the training stream (seed 0), filled with the first items of that stratum in the
  eval stream (i.i.d. within the stratum). Within a stratum the eval questions are the partition's, so a tiny stratum
  is tested on its few held-out questions.

``tests/test_tasks.py`` checks both: the committed sets' feature shares (digit counts, terms, coprime ``gcd`` pairs)
match a large training sample within sampling error, and no eval question appears in it. The files are committed;
regenerating them with the same reasoning-gym version reproduces them.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from brorl_lab.core.paths import EVAL_DIR
from brorl_lab.core.validation import UserError, check_int
from brorl_lab.rollout.tasks import BUILTIN_FAMILIES, TASKS, TaskItem, write_items
from brorl_lab.rollout.tasks.gym import VARIANT_FAMILIES

EVAL_SIZE = 200
EVAL_SEED = 0
TRAIN_REFERENCE = 20_000  # training-stream draws that fix the stratum shares w_s (s.e. of a share <= 0.35 points)
MAX_EVAL_DRAWS = 200 * EVAL_SIZE  # eval-stream draws searched for a stratum's items before giving up
# The reasoning-gym metadata fields the families draw per item from their difficulty ranges (terms, digits, length).
STRATUM_FIELDS = ("num_terms", "num_digits", "word_len")
DEFAULT_EVAL_FAMILIES = (*BUILTIN_FAMILIES, *VARIANT_FAMILIES)


def stratum(item: TaskItem) -> tuple:
    """The item's difficulty stratum: its values of :data:`STRATUM_FIELDS` in the generator's metadata (``()`` for
    families without them, e.g. ``simple_equations``: one stratum; ``code`` items, not drawn from a reasoning-gym
    stream, are sampled i.i.d. without strata)."""
    meta = (item.meta.get("entry") or {}).get("metadata") or {} if isinstance(item.meta, dict) else {}
    return tuple((k, meta[k]) for k in STRATUM_FIELDS if k in meta)


def stratum_counts(name: str, size: int, *, reference: int = TRAIN_REFERENCE) -> dict[tuple, int]:
    """``size`` split over the strata of family ``name`` in proportion to their shares of ``reference`` training
    draws (seed 0), rounded by largest remainder so the counts sum to ``size``."""
    shares = Counter(stratum(it) for it in TASKS.get(name).sample(reference, seed=0, split="train"))
    exact = {s: size * c / reference for s, c in shares.items()}
    counts = {s: int(v) for s, v in exact.items()}
    for s in sorted(exact, key=lambda s: (counts[s] - exact[s], str(s)))[:size - sum(counts.values())]:
        counts[s] += 1
    return {s: c for s, c in counts.items() if c}


def training_like_eval_items(name: str, size: int, seed: int, *, reference: int = TRAIN_REFERENCE) -> list[TaskItem]:
    """``size`` items of the eval stream ``(name, 'eval', seed)``, post-stratified to the training stream's stratum
    shares (module docstring), in eval-stream order; repeated questions are kept, as training keeps them."""
    family = TASKS.get(name)
    if not hasattr(family, "iter_items"):  # not a generator stream (``code``): one stratum, i.i.d. draws
        return family.sample(size, seed=seed, split="eval")
    want = stratum_counts(name, size, reference=reference)
    got: dict[tuple, int] = Counter()
    items = []
    for item in itertools.islice(family.iter_items(seed=seed, split="eval"), MAX_EVAL_DRAWS):
        s = stratum(item)
        if got[s] < want.get(s, 0):
            got[s] += 1
            items.append(item)
            if len(items) == size:
                return items
    short = {s: want[s] - got[s] for s in want if got[s] < want[s]}
    raise UserError(f"size: task {name!r} has too few eval items in strata {short} within {MAX_EVAL_DRAWS} eval "
                     f"draws; allowed: a smaller size (or widen the family's difficulty config)")


def make_eval_sets(families: Sequence[str] = DEFAULT_EVAL_FAMILIES, *, size: int = EVAL_SIZE, seed: int = EVAL_SEED,
                   out_dir: Path = EVAL_DIR) -> dict[str, Path]:
    """Write ``size`` eval items per family (:func:`training_like_eval_items`) to ``out_dir/<family>.jsonl``;
    returns the paths written."""
    check_int('size', size, 1)
    return {name: write_items(training_like_eval_items(name, size, seed), Path(out_dir) / f"{name}.jsonl")
            for name in families}
