"""Tasks a user names instead of registering: any reasoning-gym dataset (``rg:<dataset>``) and a local
question/answer file (``local:<path>``), each with an optional config from ``Config.task_configs``.

    Config(tasks=["rg:knights_knaves"], task_configs={"rg:knights_knaves": {"n_people": 2, "depth_constraint": 1}})
    Config(tasks=["local:gsm8k_train.jsonl"],
           task_configs={"local:gsm8k_train.jsonl": {"question_column": "question", "answer_column": "answer",
                                                     "answer_after": "####"}})

Both are registered as prefixes on :data:`~brorl_lab.rollout.tasks.base.TASKS` (a family is built on first use,
since neither set can be listed up front) and behave like the built-in families:

- **rg:** a :class:`~.gym.GymFamily` over the named dataset with the given kwargs: the same seeded streams and
  the same question-hash partition into train and eval (so no training question is ever an eval question),
  scored by the dataset's own ``score_answer`` (``reward`` in [0, 1]; ``correct`` iff ``reward == 1``). Its
  frozen eval set is the first :data:`USER_EVAL_SIZE` distinct questions of the eval stream, written on first use
  to ``cache_dir()/eval/`` under a key of (dataset, config, reasoning-gym version), never into the package data.
- **local:** a jsonl or parquet file read through the ``datasets`` library, one question and one reference answer
  per row (column names configurable), scored by math-verify exactly as ``simple_equations`` is. Rows split
  deterministically by a hash of the question text: a question is held out for eval iff its hash falls below
  ``eval_fraction``, so the split does not depend on row order and a repeated question never lands on both sides.
  The held-out rows, in file order, are the frozen eval set (written to the cache, keyed by the file's bytes).
- **pool:** a fixed pool of TaskItems of known families (a jsonl as ``write_items`` writes it) with its held-out
  items beside it (``<stem>.eval.jsonl``, or ``eval_file`` in its config): training draws from the pool, the frozen
  eval set is the held-out file, and every item is formatted and scored by its own family (so a pool of
  products_2d prompts is products_2d, restricted). The regime map writes its constructed settings this way.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import random
from functools import lru_cache
from importlib import metadata
from pathlib import Path
from typing import Any

from brorl_lab.core.paths import cache_dir
from brorl_lab.core.validation import did_you_mean, is_number
from brorl_lab.rollout.tasks.base import TASKS, RewardResult, TaskFamily, TaskItem
from brorl_lab.rollout.tasks.gym import GymFamily, check_sample_args
from brorl_lab.rollout.tasks.math_tasks import MathVerifyFamily
from brorl_lab.rollout.tasks.sets import write_items

USER_EVAL_SIZE = 200  # distinct questions in a generated rg eval set (as make-data's EVAL_SIZE)
USER_EVAL_SEED = 0
# Items per rg stream. Most reasoning-gym datasets generate item k on demand, but a few build all `size` items in
# __init__ (acre, list_functions), so user-named datasets get far fewer than the built-ins' 10**7.
RG_STREAM_LEN = 2**16
SET_BY_BRORL = ("seed", "size")  # reasoning-gym config fields the streams set themselves


def _one_line(e: BaseException) -> str:
    return " ".join(f"{type(e).__name__}: {e}".split())[:300]


def _digest(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _cycled(size: int, count: int, key: str) -> list[int]:
    """``count`` indices into ``size`` rows: the rows in an order shuffled by ``key``, reshuffled each time they are
    used up (so a step sees each row at most once while it has enough). ``key`` names the content, the split and the
    seed, never a path: the same rows elsewhere draw alike."""
    rng = random.Random(key)
    out: list[int] = []
    while len(out) < count:
        out.extend(rng.sample(range(size), size)[:count - len(out)])
    return out


def _first_distinct(items, size: int, budget: int) -> list[TaskItem]:
    """The first ``size`` items with distinct questions among the first ``budget`` of ``items``."""
    seen, out = set(), []
    for k, item in enumerate(items):
        if k >= budget or len(out) >= size:
            break
        if item.question not in seen:
            seen.add(item.question)
            out.append(item)
    return out


# ---- rg:<dataset> ---------------------------------------------------------------------------------------------------
def _rg_datasets() -> dict:
    import reasoning_gym  # noqa: F401  (importing the package registers every dataset)
    from reasoning_gym.factory import DATASETS

    return DATASETS


def check_rg(spec: str) -> None:
    datasets = _rg_datasets()
    if spec not in datasets:
        raise ValueError(f"no reasoning-gym dataset {spec!r}{did_you_mean(spec, datasets)}; allowed: "
                         f"rg:<one of {', '.join(sorted(datasets))}>")


def build_rg(spec: str, config: dict) -> "RgFamily":
    """An :class:`RgFamily` for dataset ``spec`` with ``config`` (reasoning-gym's config-class fields), validated by
    building the dataset and generating one item, so a bad value fails here, not in the middle of a run."""
    config_cls = _rg_datasets()[spec][1]
    keys = [f.name for f in dataclasses.fields(config_cls) if f.name not in SET_BY_BRORL]
    allowed = f"keys of {config_cls.__name__}: {', '.join(keys)}"
    for key in config:
        if key in SET_BY_BRORL:
            raise ValueError(f"config key {key!r} is set by brorl_lab (seeded streams); allowed: {allowed}")
        if key not in keys:
            raise ValueError(f"config {config!r}: unknown key {key!r}{did_you_mean(key, keys)}; allowed: {allowed}")
    try:
        json.dumps(config, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise ValueError(f"config {config!r} is not plain JSON data ({_one_line(e)}); allowed: {allowed} with "
                         "numbers, strings, booleans, lists or dicts as values") from None
    family = RgFamily(spec, config)
    try:
        family._make_dataset(0)[0]
    except Exception as e:  # reasoning-gym validates with assert, TypeError, ValueError, ...
        raise ValueError(f"config {config!r} rejected by reasoning-gym ({_one_line(e)}); allowed: {allowed} "
                         "with values its validate() accepts") from None
    return family


class RgFamily(GymFamily):
    """Any reasoning-gym dataset by name (``rg:<dataset>``), with its config; eval set built on first use."""

    stream_len = RG_STREAM_LEN

    def __init__(self, dataset: str, config: dict):
        shown = ", ".join(f"{k}={v!r}" for k, v in config.items()) or "its default config"
        super().__init__(f"rg:{dataset}", dataset, config,
                         f"reasoning-gym {dataset} ({shown}), scored by its score_answer")

    def eval_file(self) -> Path:
        key = _digest({"dataset": self.dataset, "config": self.config, "size": USER_EVAL_SIZE,
                       "seed": USER_EVAL_SEED, "stream_len": self.stream_len,
                       "reasoning_gym": metadata.version("reasoning-gym")})
        path = cache_dir() / "eval" / f"rg_{self.dataset}-{key}.jsonl"
        if not path.is_file():
            # at most 8x USER_EVAL_SIZE eval draws (make-data's budget); small question spaces give fewer items
            try:
                items = _first_distinct(self.iter_items(seed=USER_EVAL_SEED, split="eval"), USER_EVAL_SIZE,
                                        8 * USER_EVAL_SIZE)
            except RuntimeError:  # the stream ran out: no question of this config hashes into the eval split
                items = []
            if not items:
                raise ValueError(f"task {self.name!r} with config {self.config!r}: no eval question in "
                                 f"{self.stream_len} draws (its question space is too small to hold some out); "
                                 "allowed: a config with more distinct questions, or eval_every=0")
            write_items(items, path)
        return path


# ---- local:<path> ----------------------------------------------------------------------------------------------------
FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}  # suffix -> datasets builder
LOCAL_DEFAULTS = {"question_column": "question", "answer_column": "answer", "eval_fraction": 0.125,
                  "answer_after": None}
LOCAL_ALLOWED = ("question_column (default 'question'), answer_column (default 'answer'), eval_fraction (a float "
                 "in (0, 1), default 0.125), answer_after (None, or a marker such as '####': the reference is the "
                 "text after its last occurrence)")


def check_local(spec: str) -> None:
    form = "local:<path to a .jsonl, .json or .parquet file>"
    try:
        path = Path(spec).expanduser()
        ok = bool(spec.strip()) and path.is_file()
    except (OSError, ValueError):  # e.g. an embedded NUL byte
        ok = False
    if not ok:
        raise ValueError(f"file {spec!r} does not exist; allowed: {form}")
    if path.suffix.lower() not in FORMATS:
        raise ValueError(f"file {spec!r} has suffix {path.suffix!r}; allowed: {form}")


class TaskFileError(ValueError):
    """A ``local:`` file that exists but cannot be read (the file is at fault, not its task_configs)."""


def _first_bad_line(path: str) -> str:
    """``'<path> line K: <why>'`` for the first line of a jsonl file that is not a JSON object, else ''."""
    import json

    if not path.lower().endswith(".jsonl"):
        return ""
    with open(path, errors="replace") as f:
        for k, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                ok = isinstance(json.loads(line), dict)
                why = "not a JSON object"
            except json.JSONDecodeError as e:
                ok, why = False, f"{e.msg} at column {e.colno}"
            if not ok:
                return f"{path} line {k}: {why}"
    return ""


@lru_cache(maxsize=16)
def _read_columns(path: str, mtime_ns: int, size: int) -> tuple[dict, str]:
    """All columns of a jsonl/parquet file as lists, read with ``datasets`` (cached per file version), and the
    sha256 of its bytes (the key of its held-out eval set in the cache)."""
    from datasets import load_dataset
    from datasets import utils as ds_utils

    builder = FORMATS[Path(path).suffix.lower()]
    quiet = ds_utils.are_progress_bars_disabled()
    ds_utils.disable_progress_bars()  # a config check should not draw "Generating train split" bars
    try:
        ds = load_dataset(builder, data_files=path, split="train", cache_dir=str(cache_dir() / "datasets"))
    except Exception as e:  # malformed json, not parquet, ...
        raise TaskFileError(f"could not be read as {builder} ({_first_bad_line(path) or _one_line(e)}); allowed: "
                            f"a {builder} file with one question/answer record per row") from None
    finally:
        if not quiet:
            ds_utils.enable_progress_bars()
    return ds.to_dict(), hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _check_local_config(config: dict) -> dict:
    for key in config:
        if key not in LOCAL_DEFAULTS:
            raise ValueError(f"config {config!r}: unknown key {key!r}{did_you_mean(key, LOCAL_DEFAULTS)}; "
                             f"allowed: {LOCAL_ALLOWED}")
    conf = {**LOCAL_DEFAULTS, **config}
    for key in ("question_column", "answer_column"):
        if not isinstance(conf[key], str) or not conf[key]:
            raise ValueError(f"config {key}={conf[key]!r}; allowed: {LOCAL_ALLOWED}")
    frac = conf["eval_fraction"]
    if not (is_number(frac) and 0 < frac < 1):
        raise ValueError(f"config eval_fraction={frac!r}; allowed: {LOCAL_ALLOWED}")
    if conf["answer_after"] is not None and (not isinstance(conf["answer_after"], str) or not conf["answer_after"]):
        raise ValueError(f"config answer_after={conf['answer_after']!r}; allowed: {LOCAL_ALLOWED}")
    return conf


def held_out(question: str, eval_fraction: float) -> bool:
    """Whether ``question`` belongs to the eval split: the first 8 bytes of its sha256, as a fraction of 2**64,
    fall below ``eval_fraction``."""
    h = int.from_bytes(hashlib.sha256(question.encode("utf-8")).digest()[:8], "big")
    return h / 2**64 < eval_fraction


def build_local(spec: str, config: dict) -> "LocalFamily":
    conf = _check_local_config(config)
    path = Path(spec).expanduser().resolve()
    stat = path.stat()
    columns, sha = _read_columns(str(path), stat.st_mtime_ns, stat.st_size)
    for key in ("question_column", "answer_column"):
        if conf[key] not in columns:
            raise ValueError(f"column {conf[key]!r} ({key}) is not in {spec}; allowed: one of its columns "
                             f"({', '.join(columns)}), named in task_configs['local:{spec}']['{key}']")
    rows = []
    marker = conf["answer_after"]
    for row, (q, a) in enumerate(zip(columns[conf["question_column"]], columns[conf["answer_column"]])):
        q, a = ("" if q is None else str(q).strip()), ("" if a is None else str(a).strip())
        if marker is not None:
            if marker not in a:
                raise ValueError(f"row {row} of {spec}: answer {a[:60]!r} lacks answer_after={marker!r}; allowed: "
                                 "every answer holding the marker, or answer_after None")
            a = a.rsplit(marker, 1)[1].strip()
        if not q or not a:
            raise ValueError(f"row {row} of {spec}: empty {'question' if not q else 'answer'}; allowed: a "
                             "non-empty question and answer in every row")
        rows.append((row, q, a))
    splits = {"train": [r for r in rows if not held_out(r[1], conf["eval_fraction"])],
              "eval": [r for r in rows if held_out(r[1], conf["eval_fraction"])]}
    for split, part in splits.items():
        if not part:
            raise ValueError(f"{spec}: eval_fraction={conf['eval_fraction']} leaves no {split} rows of {len(rows)}; "
                             f"allowed: a file with enough distinct questions, or another eval_fraction "
                             f"({LOCAL_ALLOWED})")
    return LocalFamily(spec, conf, splits, sha, (stat.st_mtime_ns, stat.st_size))


class LocalFamily(MathVerifyFamily):
    """A question/answer file (``local:<path>``), answers checked by math-verify, rows split by question hash."""

    def __init__(self, spec: str, config: dict, splits: dict[str, list[tuple[int, str, str]]], sha256: str,
                 version: tuple[int, int] = (0, 0)):
        super().__init__(f"local:{spec}", None, config,
                         f"{spec}: {len(splits['train'])} train / {len(splits['eval'])} held-out rows, verified "
                         "by math-verify")
        self.spec, self.splits, self.sha256, self.version = spec, splits, sha256, version

    def is_stale(self) -> bool:
        """True when the file changed since it was read (``TASKS.get`` then reads it again; a run's own build is fresh)."""
        try:
            stat = Path(self.spec).expanduser().resolve().stat()
        except OSError:
            return True
        return (stat.st_mtime_ns, stat.st_size) != self.version

    def _item(self, row: int, question: str, answer: str) -> TaskItem:
        return TaskItem(family=self.name, uid=f"{self.name}:{row}", question=question, answer=answer,
                        meta={"row": row})

    def sample(self, count: int, *, seed: int, split: str = "train") -> list[TaskItem]:
        """``count`` rows of ``split``, deterministic in (the file's content, seed, split), wherever the file lies:
        the rows in an order shuffled by the seed, reshuffled each time they are used up (so a step sees each row at
        most once while it has enough)."""
        check_sample_args(count, seed, split)
        rows = self.splits[split]
        return [self._item(*rows[i]) for i in _cycled(len(rows), count, f"local|{self.sha256}|{split}|{seed}")]

    def eval_file(self) -> Path:
        key = _digest({"sha256": self.sha256, "config": self.config, "name": self.name})  # items carry the name
        path = cache_dir() / "eval" / f"local_{Path(self.name).stem}-{key}.jsonl"
        if not path.is_file():
            items = [self._item(*r) for r in self.splits["eval"]]
            write_items(_first_distinct(items, len(items), len(items)), path)
        return path


# ---- pool:<path> -----------------------------------------------------------------------------------------------------
POOL_ALLOWED = ("eval_file (default: the pool file with .eval.jsonl for .jsonl): a jsonl of TaskItems, the pool's "
                "held-out set")


def pool_eval_path(path: str | Path) -> Path:
    """The held-out file beside a pool file: ``<stem>.eval.jsonl`` for ``<stem>.jsonl``."""
    path = Path(path)
    return path.with_name(path.name[: -len(".jsonl")] + ".eval.jsonl")


def check_pool(spec: str) -> None:
    form = "pool:<path to a .jsonl of TaskItems (brorl_lab.rollout.tasks.sets.write_items)>"
    try:
        ok = bool(spec.strip()) and Path(spec).expanduser().is_file() and spec.lower().endswith(".jsonl")
    except (OSError, ValueError):
        ok = False
    if not ok:
        raise ValueError(f"file {spec!r} does not exist or is not .jsonl; allowed: {form}")


def _read_pool(path: Path, what: str) -> list[TaskItem]:
    items = []
    with path.open(encoding="utf-8") as f:
        for k, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                item = TaskItem(**json.loads(line))
                TASKS.get(item.family)
            except (TypeError, ValueError) as e:
                raise TaskFileError(f"{what} {path} line {k}: {_one_line(e)}; allowed: one TaskItem of a known "
                                    "family per line (write_items)") from None
            items.append(item)
    if not items:
        raise TaskFileError(f"{what} {path} holds no items; allowed: a non-empty jsonl of TaskItems")
    return items


def build_pool(spec: str, config: dict) -> "PoolFamily":
    for key in config:
        if key != "eval_file":
            raise ValueError(f"config {config!r}: unknown key {key!r}; allowed: {POOL_ALLOWED}")
    path = Path(spec).expanduser().resolve()
    held = Path(config.get("eval_file") or pool_eval_path(path)).expanduser().resolve()
    if not held.is_file():
        raise ValueError(f"eval_file {str(held)!r} of pool:{spec} does not exist; allowed: {POOL_ALLOWED}")
    train, evals = _read_pool(path, "pool"), _read_pool(held, "eval_file")
    both = {it.uid for it in train} & {it.uid for it in evals}
    if both:
        raise ValueError(f"pool:{spec}: {len(both)} items are in both the pool and its eval_file (e.g. "
                         f"{sorted(both)[0]!r}); allowed: disjoint training and held-out items")
    return PoolFamily(spec, config, train, held)


class PoolFamily(TaskFamily):
    """A fixed pool of items of known families (``pool:<path>``): training samples come from the pool, the frozen eval
    set is its ``eval_file``, and each item is formatted and scored by its own family, exactly as outside the pool.
    The regime map's constructed settings use it: a family's prompts filtered by their measured pass rate
    (:mod:`brorl_lab.study.regime`)."""

    def __init__(self, spec: str, config: dict, items: list[TaskItem], held: Path):
        self.name, self.spec, self.config, self.items, self.held = f"pool:{spec}", spec, config, items, held
        fams = sorted({it.family for it in items})
        self.description = f"{len(items)} items of {', '.join(fams)} from {spec}, held out: {held.name}"

    def sample(self, count: int, *, seed: int, split: str = "train") -> list[TaskItem]:
        """``count`` pool items (``split`` 'eval': the held-out ones), deterministic in (the pool's items, seed,
        split) wherever its file lies, each used once before any repeats (as ``local:``)."""
        check_sample_args(count, seed, split)
        rows = self.items if split == "train" else _read_pool(self.held, "eval_file")
        content = hashlib.sha256("\n".join(it.uid for it in rows).encode()).hexdigest()  # the items, not the path
        return [rows[i] for i in _cycled(len(rows), count, f"pool|{content}|{split}|{seed}")]

    def format_prompt(self, item: TaskItem, template: str = "plain", tokenizer: Any = None) -> str:
        return TASKS.get(item.family).format_prompt(item, template, tokenizer)

    def score(self, response: str, item: TaskItem, template: str = "plain") -> RewardResult:
        return TASKS.get(item.family).score(response, item, template)

    def eval_file(self) -> Path:
        return self.held


TASKS.add_prefix("rg", check_rg, build_rg, "rg:<reasoning-gym dataset>")
TASKS.add_prefix("local", check_local, build_local, "local:<.jsonl/.parquet file>")
TASKS.add_prefix("pool", check_pool, build_pool, "pool:<.jsonl of TaskItems>")
