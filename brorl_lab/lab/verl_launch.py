"""``python -m brorl_lab launch --to verl CONFIG_OR_RUN OUT/``: the same experiment as files verl 0.9.1 runs.

    res = launch_verl(cfg, "out/verl_brorl")     # writes, in out/verl_brorl/:
    #   overrides.txt      one Hydra override of verl.trainer.main_ppo per line (names: lab.verl_names.VERL_FIELDS)
    #   train.parquet      train-split task items, verl's RL schema (below), enough for every step and resample
    #   eval.parquet       the first eval_prompts items of each eval family's frozen set (the same held-out items)
    #   reward.py          verl's custom_reward_function: brorl_lab's verifiers (lab/verl_reward.py, verbatim)
    #   run_verl.sh        `bash run_verl.sh [more overrides]` on the head node of a Ray cluster
    #   brorl_config.yaml  the Config (what `import-run --from verl` labels the imported run with)
    #   WARNINGS.txt       one line per knob verl cannot express (also printed)
    #   launch.json        the overrides as values, for `launch --check` (lab.verl_compose.check_launch)
    #   model/             a local model directory, copied (unless --model-path names the cluster's copy)
    #   data/              the files of local:<file> tasks, copied (reward.py rebuilds those tasks from them)

A row of the parquet files, in verl's schema (what ``verl.utils.dataset.rl_dataset.RLHFDataset`` and the reward
manager read):

    data_source   the task family (verl groups validation metrics by it: val-core/<family>/acc/mean@n)
    prompt        [{"role": "user", "content": ...}]: chat messages; for the 'plain' template the content is our
                  whole prompt and actor_rollout_ref.model.custom_chat_template passes it through unchanged
    ability       "reasoning"
    reward_model  {"style": "rule", "ground_truth": the item's answer}
    extra_info    {"split", "index", "uid", "item" (the TaskItem as JSON), "template", "reward", "task_config"}

Paths in overrides.txt are ``${oc.env:BRORL_VERL_DIR}/...``: run_verl.sh replaces that prefix with its own
directory before verl sees the lines (verl's trainer runs in a Ray actor, which does not inherit the shell's
environment), so OUT/ can be copied to the cluster as it is; it also hands verl's file logger its path
(OUT/logs/metrics.jsonl) through Ray's runtime_env. Nothing in OUT names a path of the machine that wrote it: a
local model directory is copied into OUT/model/ (``--model-path`` names the cluster's copy instead; a hub id stays
a hub id), and a ``local:`` task's file into OUT/data/, which each row names relative to OUT (``extra_info.task_file``)
for reward.py. :func:`portability_problems` (run by ``launch --check``) lists anything that would not travel.
"""

from __future__ import annotations

import json
import math
import shutil
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

import pandas as pd
import yaml
from tqdm.auto import tqdm

from brorl_lab.core.config import Config, ConfigError, read_config_file
from brorl_lab.core.rundir import atomic_copy_dir, atomic_write, atomic_write_text
from brorl_lab.core.trl_names import apply_trl_aliases
from brorl_lab.lab.verl_names import override_lines, verl_overrides

VERL_VERSION = "0.9.1"
DATA_DIR_ENV = "BRORL_VERL_DIR"
DATA_DIR = "${oc.env:" + DATA_DIR_ENV + "}"
REWARD_TEMPLATE = Path(__file__).with_name("verl_reward.py")
CONFIG_FILE = "brorl_config.yaml"
INTENDED_FILE = "launch.json"  # the overrides as values (what check_launch compares verl's composed config with)
FILES = ("overrides.txt", "train.parquet", "eval.parquet", "reward.py", "run_verl.sh", CONFIG_FILE, "WARNINGS.txt",
         INTENDED_FILE, "model", "data")
MODEL_DIR, TASK_DATA_DIR = "model", "data"  # in OUT: the copied local model and local task files
#: Jinja chat templates handed to verl (actor_rollout_ref.model.custom_chat_template) so its prompt is ours:
#: 'plain' passes our whole prompt through; 'chat' without a tokenizer template reproduces templates.CHAT_FALLBACK
#: ("User: {content}\nAssistant:"; the newline is a Jinja string escape, so the override stays on one line).
PLAIN_CHAT_TEMPLATE = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
FALLBACK_CHAT_TEMPLATE = "{% for m in messages %}User: {{ m['content'] }}{{ '\\n' }}Assistant:{% endfor %}"
MAX_DEFAULT_TRAIN_PROMPTS = 20_000


@dataclass
class LaunchResult:
    out: Path
    overrides: dict[str, Any]
    warnings: list[str]
    template: str
    train_rows: int
    eval_rows: dict[str, int] = field(default_factory=dict)
    max_prompt_length: int = 0
    notes: list[str] = field(default_factory=list)  # what was copied into OUT so it travels (also in WARNINGS.txt)

    def summary(self) -> str:
        evals = ", ".join(f"{k} {v}" for k, v in self.eval_rows.items())
        return (f"verl {VERL_VERSION} launch files in {self.out}: {len(self.overrides)} overrides, train.parquet "
                f"{self.train_rows} prompts, eval.parquet ({evals}), template {self.template!r}, max prompt length "
                f"{self.max_prompt_length} tokens\nrun on the head node of a Ray cluster: bash {self.out}/run_verl.sh")


# ---- which config ---------------------------------------------------------------------------------------------------
def load_config(source: str | Path) -> Config:
    """A YAML file of Config fields, or a run directory (its config.yaml), as a validated Config."""
    path = Path(source)
    if path.is_dir():
        path = path / "config.yaml"
    if not path.is_file():
        raise ConfigError(f"CONFIG_OR_RUN: {source} is neither a YAML file nor a run directory with config.yaml; "
                          "allowed: a config file (as `train --config` reads) or a run directory")
    data = read_config_file(path)  # as `train --config` reads it: `lr: 1e-4` a float, a bad file one line
    data, notes = apply_trl_aliases(data, f"CONFIG_OR_RUN {path}", Config.field_names())
    for note in notes:
        print(note, file=sys.stderr)
    return Config.from_dict(data)


# ---- prompts as chat messages ----------------------------------------------------------------------------------------
def _tokenizer_or_none(model: str):
    """The model's tokenizer when it can be opened here (local directory or cached hub id), else None."""
    from brorl_lab.core.models import load_tokenizer

    try:
        return load_tokenizer(model)
    except (OSError, ValueError):
        return None


def user_content(family, item, template: str) -> str:
    """The user turn our prompt holds: the whole prompt for 'plain'; for 'chat' the instruction the family wraps in
    a chat template (read back from the template-less chat form, templates.CHAT_FALLBACK)."""
    from brorl_lab.rollout.tasks.templates import CHAT_FALLBACK

    if template == "plain":
        return family.format_prompt(item, "plain")
    head, tail = CHAT_FALLBACK.split("{content}")
    text = family.format_prompt(item, "chat")
    if not (text.startswith(head) and text.endswith(tail)):
        raise ValueError(f"task {item.family!r}: its chat prompt does not follow templates.CHAT_FALLBACK; allowed: "
                         "families that format prompts with templates.format_prompt")
    return text[len(head):len(text) - len(tail)]


def _rows(items, split: str, template: str, reward: str, task_configs: dict, families,
          task_files: Optional[dict] = None) -> list[dict]:
    from brorl_lab.core.console import live_bars
    from brorl_lab.rollout.tasks import family_of

    rows = []
    for i, item in enumerate(tqdm(items, desc=f"{split} rows", leave=False, disable=not live_bars())):
        family = family_of(item.family, families)  # the run's own (RunSpec.families)
        conf = task_configs.get(item.family)
        rows.append({
            "data_source": item.family,
            "prompt": [{"role": "user", "content": user_content(family, item, template)}],
            "ability": "reasoning",
            "reward_model": {"style": "rule", "ground_truth": item.answer},
            "extra_info": {"split": split, "index": i, "uid": item.uid, "template": template, "reward": reward,
                           "item": json.dumps(asdict(item), sort_keys=True),
                           "task_config": json.dumps(conf, sort_keys=True) if conf else "",
                           "task_file": (task_files or {}).get(item.family, "")},
        })
    return rows


def _write_parquet(rows: list[dict], path: Path) -> Path:
    return atomic_write(path, lambda f: pd.DataFrame(rows).to_parquet(f, index=False))


def local_task_files(cfg: Config) -> dict[str, tuple[Path, str]]:
    """{task name: (its file here, its path in OUT)} for the ``local:<file>`` tasks a launch trains and evaluates
    on: each file goes to OUT/data/ (two files of one name get a numbered prefix)."""
    out: dict[str, tuple[Path, str]] = {}
    for name in dict.fromkeys([*cfg.tasks, *(cfg.eval_tasks or [])]):
        if name.startswith("local:"):
            src = Path(name.partition(":")[2]).expanduser().resolve()
            rel = f"{TASK_DATA_DIR}/{src.name}"
            if rel in {r for _, r in out.values()}:
                rel = f"{TASK_DATA_DIR}/{len(out)}_{src.name}"
            out[name] = (src, rel)
    return out


def portability_problems(out: str | Path) -> list[str]:
    """What in a launch folder would not work once it is copied elsewhere: an absolute path in overrides.txt
    (the model or a data file of this machine), a data file or the model directory that the overrides or the rows
    name but that is missing from the folder. [] when the folder travels."""
    out = Path(out)
    problems = []
    try:
        given = json.loads((out / INTENDED_FILE).read_text()).get("model_path_given", False)
    except (OSError, ValueError):
        given = False
    for line in read_overrides(out / "overrides.txt"):
        key, _, value = line.partition("=")
        value = value.strip("'\"")
        if key == "actor_rollout_ref.model.path" and given:
            continue  # --model-path: the cluster's own copy, named by the user
        if value.startswith("/") or value.startswith("~"):
            problems.append(f"{key} is an absolute path ({value}): it must exist at that path on every node")
        if value.startswith(DATA_DIR + "/") and not (out / value[len(DATA_DIR) + 1:]).exists():
            problems.append(f"{key}: {value[len(DATA_DIR) + 1:]} is missing from {out}")
    for split in ("train", "eval"):
        path = out / f"{split}.parquet"
        if path.is_file():
            rows = pd.read_parquet(path, columns=["extra_info"])["extra_info"]
            for f in sorted({r.get("task_file") for r in rows if r.get("task_file")}):
                if not (out / f).is_file():
                    problems.append(f"{split}.parquet names the task file {f}, missing from {out}")
    return problems


def default_train_prompts(cfg: Config) -> int:
    """Prompts for train.parquet: every step's prompts, times the resample rounds dynamic sampling may use; capped
    (verl cycles through the file again: total_epochs)."""
    rounds = 1 + (cfg.max_resample_rounds if cfg.dynamic_sampling else 0)
    return min(cfg.steps * cfg.prompts_per_step * rounds, MAX_DEFAULT_TRAIN_PROMPTS)


def prompt_lengths(rows: list[dict], tokenizer, chat_template: Optional[str]) -> list[int]:
    """Tokens of each row's prompt as verl renders it (the chat template with the generation prompt)."""
    kw = {"chat_template": chat_template} if chat_template else {}
    out = []
    for r in rows:
        ids = tokenizer.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=True, **kw)
        ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
        out.append(len(ids))
    return out


# ---- the files ------------------------------------------------------------------------------------------------------
RUN_SCRIPT = """#!/usr/bin/env bash
# Written by `{command}` for verl {version}. Run it on the head node of a Ray cluster
# (`ray start --head` there, `ray start --address=HEAD:6379` on the others), in an environment with
# `pip install verl=={version} brorl_lab` (+ vllm), from a directory every node sees at the same path (the reward
# workers load reward.py from it). Extra Hydra overrides on the command line win; --dry-run prints the overrides.
set -euo pipefail
{env}="$(cd "$(dirname "${{BASH_SOURCE[0]}}")" && pwd)"
mkdir -p "${env}/logs"
OVERRIDES=()
while IFS= read -r line; do
  [[ -z "$line" || "$line" == "#"* ]] && continue
  OVERRIDES+=("${{line//'{marker}'/${env}}}")
done < "${env}/overrides.txt"
# verl's trainer (and its file logger) runs in a Ray actor: its environment comes through Ray's runtime_env.
OVERRIDES+=("+ray_kwargs.ray_init.runtime_env.env_vars.VERL_FILE_LOGGER_PATH='${env}/logs/metrics.jsonl'")
OVERRIDES+=("+ray_kwargs.ray_init.runtime_env.env_vars.TENSORBOARD_DIR='${env}/logs/tensorboard'")
if [[ "${{1:-}}" == "--dry-run" ]]; then printf '%s\\n' "${{OVERRIDES[@]}}"; exit 0; fi
${{PYTHON:-python3}} -m verl.trainer.main_ppo "${{OVERRIDES[@]}}" "$@" 2>&1 | tee "${env}/logs/console.log"
"""


def launch_verl(cfg: Config, out: str | Path, *, model_path: Optional[str] = None, gpus_per_node: int = 8,  # noqa: C901 - every check before the first write, then the writes, in one readable order
                nodes: int = 1, rollout_engine: str = "vllm", train_prompts: Optional[int] = None,
                max_prompt_length: Optional[int] = None, strict: bool = False, overwrite: bool = False,
                command: str = "python -m brorl_lab launch --to verl") -> LaunchResult:
    """Write the verl files for ``cfg`` into ``out`` (see module doc) and return what was written.

    ``model_path`` is the model as the cluster sees it (default: ``cfg.model`` resolved here). ``strict`` turns
    the warnings (knobs verl cannot express) into one ConfigError, before anything is written; so does an ``out``
    that already holds launch files unless ``overwrite``."""
    from brorl_lab.core.models import resolve_model
    from brorl_lab.rl.spec import resolve
    from brorl_lab.rollout.tasks import eval_set, sample_items

    if not isinstance(cfg, Config):
        raise ConfigError(f"cfg: got {type(cfg).__name__}; allowed: a brorl_lab Config")
    if cfg.rollout_allocation != "uniform":  # refused, not warned: it would run a different experiment
        raise ConfigError(f"rollout_allocation: {cfg.rollout_allocation!r} cannot run on verl {VERL_VERSION}, which "
                          "draws the same rollout.n for every prompt of a step (no per-prompt N: verl #4585 asked, "
                          "closed unanswered); allowed: uniform (train here for a per-prompt allocation)")
    for name, v in (("gpus_per_node", gpus_per_node), ("nodes", nodes)):
        if not isinstance(v, int) or v < 1:
            raise ConfigError(f"{name}: got {v!r}; allowed: an integer >= 1")
    if rollout_engine not in ("vllm", "sglang"):
        raise ConfigError(f"rollout_engine: got {rollout_engine!r}; allowed: vllm, sglang")
    out = Path(out)
    existing = [f for f in FILES if (out / f).exists()]
    if existing and not overwrite:
        raise ConfigError(f"OUT: {out} already holds {', '.join(existing)}; allowed: a new directory, or --overwrite")
    tok = _tokenizer_or_none(cfg.model)
    spec = resolve(cfg, tokenizer=tok)  # names checked, the run's own task families, template 'auto' resolved
    template = spec.template
    chat_template = PLAIN_CHAT_TEMPLATE if template == "plain" else (
        None if tok is not None and getattr(tok, "chat_template", None) else FALLBACK_CHAT_TEMPLATE)
    # Validate everything (and collect warnings) before the slow part and before writing.
    probe, warnings = verl_overrides(cfg, data_dir=DATA_DIR, model_path="", max_prompt_length=1,
                                     custom_chat_template=chat_template, gpus_per_node=gpus_per_node, nodes=nodes,
                                     rollout_engine=rollout_engine)
    if tok is None and max_prompt_length is None:
        raise ConfigError(f"max_prompt_length: the tokenizer of model={cfg.model!r} cannot be opened here to measure "
                          "the prompts; allowed: --max-prompt-length N")
    if tok is None and template == "chat":
        warnings.append(f"model={cfg.model!r}: its tokenizer could not be opened here; verl wraps the prompts in the "
                        "model's own chat template, assumed to be the one brorl_lab would use")
    if strict and warnings:
        raise ConfigError("launch --strict: knobs verl 0.9.1 cannot express: " + "; ".join(warnings))
    n_train = default_train_prompts(cfg) if train_prompts is None else train_prompts
    if not isinstance(n_train, int) or n_train < cfg.prompts_per_step:
        raise ConfigError(f"train_prompts: got {n_train!r}; allowed: an integer >= prompts_per_step="
                          f"{cfg.prompts_per_step}")

    local_files = local_task_files(cfg)
    task_files = {name: rel for name, (_, rel) in local_files.items()}
    train_rows = _rows(sample_items(cfg.tasks, n_train, seed=cfg.seed, split="train", task_families=spec.families),
                       "train", template, cfg.reward, cfg.task_configs, spec.families, task_files)
    eval_rows: list[dict] = []
    per_family: dict[str, int] = {}
    for fam in cfg.eval_tasks or cfg.tasks:
        rows = _rows(eval_set(fam, limit=cfg.eval_prompts, task_families=spec.families), "eval", template, cfg.reward,
                     cfg.task_configs, spec.families, task_files)
        per_family[fam] = len(rows)
        eval_rows += rows
    if tok is not None:
        measured = max(prompt_lengths(train_rows + eval_rows, tok, chat_template))
        max_prompt_length = max(measured, max_prompt_length or 0)
    notes = []
    local_model = None if model_path else resolve_model(cfg.model)
    if local_model is not None and Path(local_model).is_dir():  # this machine's directory: it travels in OUT/model
        model = f"{DATA_DIR}/{MODEL_DIR}"
        size = sum(f.stat().st_size for f in Path(local_model).rglob("*") if f.is_file())
        notes.append(f"note: model {cfg.model!r} is a local directory: copied into {MODEL_DIR}/ ({size / 1e6:.1f} MB), "
                     "so the folder travels; --model-path PATH names the cluster's copy instead")
    else:
        model = model_path or local_model
    for name, (src, rel) in local_files.items():
        notes.append(f"note: task {name!r}: its file was copied into {rel}; reward.py rebuilds the task from it")
    epochs = max(1, math.ceil(cfg.steps * cfg.prompts_per_step * 64 / len(train_rows)))  # never the limit
    overrides, _ = verl_overrides(cfg, data_dir=DATA_DIR, model_path=model, max_prompt_length=int(max_prompt_length),
                                  custom_chat_template=chat_template, gpus_per_node=gpus_per_node, nodes=nodes,
                                  rollout_engine=rollout_engine, total_epochs=epochs)
    assert overrides.keys() == probe.keys()

    out.mkdir(parents=True, exist_ok=True)
    if model.startswith(DATA_DIR):
        atomic_copy_dir(local_model, out / MODEL_DIR)
    if local_files:
        (out / TASK_DATA_DIR).mkdir(exist_ok=True)
        for src, rel in local_files.values():
            atomic_write(out / rel, lambda f, src=src: f.write(src.read_bytes()))
    _write_parquet(train_rows, out / "train.parquet")
    _write_parquet(eval_rows, out / "eval.parquet")
    shutil.copyfile(REWARD_TEMPLATE, out / "reward.py")
    header = [f"# {command}", f"# verl {VERL_VERSION} main_ppo overrides (brorl_lab names: docs/ECOSYSTEM.md 'verl names'); "
                              f"paths under ${DATA_DIR_ENV}, set by run_verl.sh"]
    atomic_write_text(out / "overrides.txt", "\n".join(header + override_lines(overrides)) + "\n")
    atomic_write_text(out / "run_verl.sh", RUN_SCRIPT.format(command=command, version=VERL_VERSION, env=DATA_DIR_ENV,
                                                             marker=DATA_DIR))
    (out / "run_verl.sh").chmod(0o755)
    atomic_write_text(out / CONFIG_FILE, yaml.safe_dump(cfg.to_dict(), sort_keys=False))
    atomic_write_text(out / "WARNINGS.txt", "".join(f"{w}\n" for w in [*warnings, *notes]))
    atomic_write_text(out / INTENDED_FILE, json.dumps({"verl": VERL_VERSION, "data_dir_env": DATA_DIR_ENV,
                                                       "model_path_given": model_path is not None,
                                                       "overrides": overrides, "warnings": warnings}, indent=1))
    return LaunchResult(out=out, overrides=overrides, warnings=warnings, template=template, train_rows=len(train_rows),
                        eval_rows=per_family, max_prompt_length=int(max_prompt_length), notes=notes)


def read_overrides(path: str | Path) -> list[str]:
    """The override lines of an overrides.txt (comments and blank lines skipped)."""
    return [ln for ln in Path(path).read_text().splitlines() if ln.strip() and not ln.startswith("#")]
