"""Bad input fails early, as one ValueError-family error naming the field, the value and what is allowed, and never
touches what a run directory already holds.

Configs (Config(...), Config.from_dict, a YAML file through the CLI), the CLI's own options, Trainer/resume
arguments, and papermill parameters (sweep.check_parameters / run_notebook / run_sweep on a small notebook made
here) are fed random bad values by hypothesis: wrong types, out-of-range numbers, NaN/inf, unknown keys and
unknown names.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import math
import os
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from brorl_lab import cli
from brorl_lab.core.config import Config, ConfigError
from brorl_lab.core.rundir import RunDir
from brorl_lab.lab import sweep
from brorl_lab.rl import algo
from brorl_lab.rl.allocation import ALLOCATORS
from brorl_lab.rl.spec import resolve
from brorl_lab.rl.trackers import TRACKERS
from brorl_lab.rollout.engines import ENGINES
from brorl_lab.rollout.tasks import TASKS, eval_path

# Names a Config may hold, from the registries that define them (brorl_lab.rl.spec checks against the same).
NAMES = {"engine": ENGINES.names(), "advantage": algo.ADVANTAGES.names(), "policy_loss": algo.POLICY_LOSSES.names(),
         "task": TASKS.names(), "tracker": TRACKERS.names()}


def names_of(kind: str) -> list[str]:
    return NAMES[kind]
from helpers_models import save_tiny
from helpers_notebooks import write_notebook

FIELDS = Config.field_names()

# ---- what each field allows (the specification the validator is held to) -----------------------------------------
INT_MIN = {  # integer fields and their smallest allowed value
    **dict.fromkeys(["rollouts_per_prompt", "prompts_per_step", "max_new_tokens", "rollout_chunk_sequences",
                     "optimizer_steps_per_step", "train_micro_batch_tokens", "steps", "eval_samples",
                     "eval_prompts", "lr_reference_samples", "lr_reference_prompts", "ray_workers", "max_bad_steps",
                     "allocation_probe", "allocation_cap", "allocation_round"], 1),
    **dict.fromkeys(["eval_every", "checkpoint_every", "keep_checkpoints", "reset_every", "reset_every_samples",
                     "lr_warmup_steps", "max_resample_rounds", "torch_threads", "seed", "max_samples",
                     "allocation_prior_draws"], 0),
}
# float fields: (low, low_inclusive, high, high_inclusive); None = unbounded (but always finite)
FLOAT_RANGE = {
    "temperature": (0, False, None, False), "eval_temperature": (0, False, None, False),
    "top_p": (0, False, 1, True), "eval_top_p": (0, False, 1, True),
    "lr": (0, False, 1, False), "eps_low": (0, True, 1, False), "eps_high": (0, True, None, False),
    "kl_beta": (0, True, None, False), "entropy_coef": (0, True, None, False),
    "weight_decay": (0, True, None, False), "reset_on_kl": (0, True, None, False),
    "grad_clip": (0, False, None, False), "is_cap": (1, True, None, False),
    "icepop_low": (0, False, 1, True), "icepop_high": (1, True, None, False),
}
CHOICES = {  # string fields with a fixed or registered set of names
    "engine": names_of("engine"), "ray_worker_engine": [e for e in names_of("engine") if e != "ray"],
    "advantage": names_of("advantage"), "policy_loss": names_of("policy_loss"),
    "loss_agg": ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"],
    "kl_estimator": ["k1", "k2", "k3"], "kl_placement": ["loss", "reward"],
    "is_correction": ["none", "truncate", "icepop_mask"], "lr_scaling": ["none", "sqrt_samples", "sqrt_prompts"],
    "reward": ["correct", "score"], "device": ["auto", "cpu", "cuda"],
    "dtype": ["auto", "float32", "bfloat16", "float16"], "template": ["auto", "plain", "chat"],
    "logprob_layout": ["auto", "shared_prefix", "packed"], "lr_scheduler_type": ["constant", "linear", "cosine"],
    "rollout_allocation": ALLOCATORS.names(),
}
BOOLS = ["adv_std_norm", "dynamic_sampling", "reset_optimizer", "compile_step"]
SMALL = dict(rollouts_per_prompt=4, prompts_per_step=2, max_new_tokens=4, eval_prompts=4, eval_samples=4,
             eval_k=[1], torch_threads=1)


def test_the_specification_covers_every_field():
    covered = set(INT_MIN) | set(FLOAT_RANGE) | set(CHOICES) | set(BOOLS) | {
        "model", "ray_address", "tasks", "eval_tasks", "task_configs", "adam_betas", "eval_k", "run_dir", "run_name",
        "report_to", "eval_at_steps", "eval_at_samples"}
    assert covered == set(FIELDS), f"new fields need a bad-input spec here: {set(FIELDS) - covered}"


@pytest.mark.parametrize("kw", [
    dict(top_p=1.0, eval_top_p=1.0), dict(eps_low=0.0), dict(eps_low=0.999), dict(rollouts_per_prompt=2),
    dict(is_cap=1.0, icepop_low=1.0, icepop_high=1.0), dict(kl_beta=0.0, entropy_coef=0.0, weight_decay=0.0),
    dict(seed=0, eval_every=0),
    dict(prompts_per_step=12, optimizer_steps_per_step=4), dict(eval_samples=4, eval_k=[1, 4]),
    dict(tasks=("gcd", "chain_sum")), dict(adam_betas=[0, 0.5]), dict(lr=0.5, temperature=1e-3),
    dict(tasks=["rg:basic_arithmetic"], task_configs={"rg:basic_arithmetic": {"min_terms": 2, "max_terms": 2}}),
    dict(tasks=["gcd"], eval_tasks=["rg:basic_arithmetic"], task_configs={}),
    dict(report_to=[]), dict(report_to=["tensorboard", "wandb"]), dict(eval_every=0, eval_at_steps=[1, 3]),
])
def test_boundary_values_are_accepted(kw):
    """The validator must not over-reject: the edges of each allowed range are allowed."""
    cfg = resolve(Config(**kw)).cfg
    for k, v in kw.items():
        assert getattr(cfg, k) == v


# ---- strategies for bad values -----------------------------------------------------------------------------------
NON_FINITE = st.sampled_from([math.nan, math.inf, -math.inf])
WRONG_FOR_NUMBER = st.one_of(st.text(max_size=8), st.none(), st.lists(st.integers(), max_size=2),
                             st.dictionaries(st.text(max_size=3), st.integers(), max_size=2), st.booleans())
WRONG_FOR_STR = st.one_of(st.integers(), st.floats(allow_nan=True), st.none(), st.lists(st.text(max_size=3), max_size=2),
                          st.booleans())


def _outside(lo, lo_inc, hi, hi_inc):
    below = st.floats(max_value=lo, exclude_max=lo_inc, allow_nan=False, allow_infinity=False)
    bad = [below, NON_FINITE]
    if hi is not None:
        bad.append(st.floats(min_value=hi, exclude_min=hi_inc, allow_nan=False, allow_infinity=False))
    return st.one_of(*bad)


def _unknown_name(allowed):
    return st.text(min_size=0, max_size=12).filter(lambda s: s not in allowed)


@st.composite
def bad_field(draw, python_objects: bool = True):  # noqa: C901 - one branch per kind of bad value: the specification of bad input, read as a table
    """(field, bad value, extra valid fields the error depends on)."""
    kind = draw(st.sampled_from(["int", "float", "choice", "bool", "list", "model", "run_name", "cross",
                                 "task_configs"]))
    extra: dict = {}
    if kind == "int":
        name = draw(st.sampled_from(sorted(INT_MIN)))
        value = draw(st.one_of(st.integers(max_value=INT_MIN[name] - 1), WRONG_FOR_NUMBER, st.floats()))
    elif kind == "float":
        name = draw(st.sampled_from(sorted(FLOAT_RANGE)))
        value = draw(st.one_of(_outside(*FLOAT_RANGE[name]), WRONG_FOR_NUMBER))
    elif kind == "choice":
        name = draw(st.sampled_from(sorted(CHOICES)))
        value = draw(st.one_of(_unknown_name(CHOICES[name]), WRONG_FOR_STR))
    elif kind == "bool":
        name = draw(st.sampled_from(BOOLS))
        value = draw(st.one_of(st.integers(), st.text(max_size=5), st.none(), st.floats()))
    elif kind == "list":
        name = draw(st.sampled_from(["tasks", "eval_tasks", "adam_betas", "eval_k", "report_to", "eval_at_steps",
                                            "eval_at_samples"]))
        if name == "report_to":  # tracker names: [] is fine (no tracker), unknown / repeated names and non-lists not
            known = names_of("tracker")
            value = draw(st.one_of(
                st.lists(_unknown_name(known), min_size=1, max_size=3),
                st.lists(st.sampled_from(known), min_size=2, max_size=4).filter(lambda v: len(set(v)) < len(v)),
                st.lists(st.integers(), min_size=1, max_size=2), st.text(max_size=6), st.integers()))
        elif name in ("tasks", "eval_tasks"):
            known = names_of("task")
            value = draw(st.one_of(
                st.just([]), st.lists(_unknown_name(known), min_size=1, max_size=3),
                st.lists(st.sampled_from(known), min_size=2, max_size=4).filter(lambda v: len(set(v)) < len(v)),
                st.lists(st.integers(), min_size=1, max_size=2), st.text(max_size=6), st.integers()))
        elif name in ("eval_at_steps", "eval_at_samples"):  # steps / generated samples (>= 1); [] is fine
            value = draw(st.one_of(st.lists(st.integers(max_value=0), min_size=1, max_size=3),
                                   st.lists(st.floats(allow_nan=True), min_size=1, max_size=2), st.integers(1, 4),
                                   st.text(max_size=4)))
        elif name == "adam_betas":
            value = draw(st.one_of(
                st.lists(st.floats(0, 0.99), max_size=4).filter(lambda v: len(v) != 2),
                st.tuples(st.floats(0, 0.99), st.one_of(st.floats(min_value=1.0), st.floats(max_value=-1e-9),
                                                       NON_FINITE, st.booleans(), st.text(max_size=3))).map(list),
                st.floats(0, 0.99), st.text(max_size=4)))
        else:
            extra = {"eval_samples": draw(st.integers(1, 8))}
            value = draw(st.one_of(
                st.just([]), st.lists(st.integers(max_value=0), min_size=1, max_size=3),
                st.lists(st.integers(min_value=extra["eval_samples"] + 1), min_size=1, max_size=3),
                st.lists(st.floats(allow_nan=True), min_size=1, max_size=2), st.integers(1, 4)))
    elif kind == "model":
        name = "model"
        value = draw(st.one_of(st.just(""), st.text(" \t", min_size=1, max_size=3),
                               st.text("abcxyz", min_size=1, max_size=8).map(lambda s: f"/nonexistent/{s}"),
                               st.text("abcxyz", min_size=1, max_size=8).map(lambda s: f"./no_such_model_{s}"),
                               WRONG_FOR_STR))
    elif kind == "task_configs":
        # task_configs: a dict {user-named task of tasks/eval_tasks: dict of settings}; here tasks are built-in, so
        # any entry is bad, as is anything but a dict
        name = "task_configs"
        value = draw(st.one_of(
            st.dictionaries(st.sampled_from(names_of("task") + ["rg:gcd", "local:x.jsonl", ""]),
                            st.one_of(st.dictionaries(st.text(max_size=4), st.integers(), max_size=2), st.integers()),
                            min_size=1, max_size=2),
            st.lists(st.text(max_size=3), max_size=2), st.text(max_size=5), st.integers(), st.booleans()))
    elif kind == "run_name":
        name = "run_name"
        value = draw(st.one_of(st.sampled_from(["", ".", "..", "/abs", "a/b", "../up"]),
                               st.text("ab/", min_size=2, max_size=6).filter(lambda s: "/" in s), st.integers()))
    else:  # a value that is fine alone but not with another field
        which = draw(st.sampled_from(["group", "divides"]))
        if which == "group":
            name, value, extra = "rollouts_per_prompt", 1, {"advantage": draw(st.sampled_from(names_of("advantage")))}
        else:
            p = draw(st.integers(1, 24))
            k = draw(st.integers(1, 24).filter(lambda k: p % k != 0))
            name, value, extra = "optimizer_steps_per_step", k, {"prompts_per_step": p}
    if not python_objects:
        assume(_yaml_roundtrips(value))
    return name, value, extra


def _yaml_roundtrips(value) -> bool:
    try:
        back = yaml.safe_load(yaml.safe_dump({"v": value}))["v"]
    except yaml.YAMLError:
        return False
    same = (back == value) or (isinstance(value, float) and math.isnan(value) and math.isnan(back))
    return same and type(back) is type(value)


def assert_clear_error(err: BaseException, field: str, value=None) -> None:
    msg = str(err)
    assert isinstance(err, ValueError), f"{type(err).__name__} is not a ValueError: {msg}"
    assert f"'{field}'" in msg, f"field {field!r} not named in: {msg}"
    assert "allowed" in msg or "did you mean" in msg, f"no allowed set in: {msg}"
    if value is not None:
        parts = value if isinstance(value, list) else []
        assert repr(value) in msg or any(repr(x) in msg for x in parts), f"value {value!r} not shown in: {msg}"
    assert len(msg.splitlines()) == 1, f"one line expected: {msg}"


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(bad_field())
def test_random_bad_config_values_fail_with_the_field_the_value_and_the_allowed_set(case):
    name, value, extra = case
    kw = {**SMALL, **extra, name: value}
    # types and ranges fail when the Config is built; names, task settings and model paths when it is resolved
    # (rl.spec.resolve, the Trainer's first step): either way one ConfigError naming the field
    for build in (lambda: resolve(Config(**kw)), lambda: resolve(Config.from_dict(kw)),
                  lambda: resolve(Config(**SMALL).replace(**{**extra, name: value}))):
        with pytest.raises(ConfigError) as e:
            build()
        assert_clear_error(e.value, name, value)


@settings(max_examples=150, deadline=None)
@given(st.one_of(st.text(max_size=20), st.integers(), st.none()).filter(lambda k: k not in FIELDS))
def test_unknown_keys_are_rejected_with_a_suggestion_or_the_valid_fields(key):
    for build in (lambda: Config.from_dict({**SMALL, key: 1}),
                  lambda: Config(**{**SMALL, key: 1}) if isinstance(key, str) else Config.from_dict({key: 1})):
        with pytest.raises(ConfigError) as e:
            build()
        msg = str(e.value)
        assert repr(key) in msg and "unknown field" in msg
        assert "did you mean" in msg or "valid fields: " + ", ".join(FIELDS) in msg


@settings(max_examples=100, deadline=None)
@given(st.sampled_from(FIELDS), st.integers(0, 10**6))
def test_a_one_letter_typo_suggests_a_real_field(field, salt):
    i = salt % len(field)
    typo = field[:i] + field[i + 1:] if salt % 2 else field[:i] + "x" + field[i:]
    assume(typo not in FIELDS)
    with pytest.raises(ConfigError) as e:
        Config(**{typo: 1})
    msg = str(e.value)
    assert "did you mean '" in msg
    suggested = msg.split("did you mean '")[1].split("'")[0]
    assert suggested in FIELDS


def test_a_config_edited_after_construction_is_revalidated_by_the_trainer(tmp_path):
    from brorl_lab.rl.trainer import Trainer

    cfg = Config(**SMALL, run_dir=str(tmp_path))
    cfg.rollouts_per_prompt = 0  # notebooks edit fields in place
    with pytest.raises(ConfigError) as e:
        Trainer(cfg, progress=False)
    assert_clear_error(e.value, "rollouts_per_prompt", 0)
    assert list(tmp_path.iterdir()) == []


# ---- an existing run directory is never touched by bad input ---------------------------------------------------
def snapshot(root: Path) -> dict:
    """Every file under root with its bytes' hash and mtime: equality means nothing was written or removed. A run
    directory's lock file (``.<name>.lock`` beside it: who holds the run, empty when nobody does) is not data: a
    refused writer may take and release it."""
    return {str(p.relative_to(root)): (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
            for p in sorted(root.rglob("*")) if p.is_file() and not p.name.endswith(".lock")}


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> str:
    return str(save_tiny(tmp_path_factory.mktemp("model") / "tiny"))


@pytest.fixture(scope="module")
def finished_run(tiny_model, tmp_path_factory) -> Path:
    """A real (tiny) run: config, environment, metrics, events, status and a checkpoint."""
    from brorl_lab.rl.trainer import Trainer

    root = tmp_path_factory.mktemp("runs")
    cfg = Config(**SMALL, model=tiny_model, template="plain", steps=1, eval_every=1, checkpoint_every=1,
                 dynamic_sampling=False, run_dir=str(root), run_name="done")
    with Trainer(cfg, progress=False) as t:
        t.run()
    run = root / "done"
    assert (run / "checkpoint" / "state.pt").is_file() and (run / "metrics.parquet").is_file()
    return run


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=bad_field(python_objects=False))
def test_a_bad_yaml_config_through_the_cli_exits_with_one_line_and_leaves_the_run_dir_alone(case, finished_run,
                                                                                           tmp_path_factory, capsys):
    name, value, extra = case
    before = snapshot(finished_run.parent)
    cfg_file = tmp_path_factory.mktemp("cfg") / "bad.yaml"
    fields = {**SMALL, "run_dir": str(finished_run.parent), "run_name": finished_run.name, **extra, name: value}
    cfg_file.write_text(yaml.safe_dump(fields))
    with pytest.raises(SystemExit) as e:
        cli.main(["train", "--config", str(cfg_file), "--quiet"])
    err = without_notes(capsys.readouterr().err)
    assert e.value.code == 2
    assert err.startswith("python -m brorl_lab train: error: config field") and err.count("\n") == 1, err
    assert f"'{name}'" in err and "Traceback" not in err
    assert snapshot(finished_run.parent) == before


def without_notes(err: str) -> str:
    """stderr without the ``note:`` / ``notice:`` lines (a command's first line, `training runs/x (loading ...)`)."""
    return "".join(ln for ln in err.splitlines(keepends=True) if not ln.startswith(("notice:", "note:")))


@pytest.mark.parametrize("argv, needle", [
    (["train", "--resume", "{run}", "--lr", "0.1"], "--resume"),
    (["train", "--resume", "{run}", "--steps", "0"], "steps"),
    (["train", "--resume", "{run}/checkpoints/step_000009"], "is not a directory"),
    (["train", "--resume", "{root}/no_such_run"], "run_dir"),
    (["train", "--resume", "{root}"], "has no checkpoint"),
    (["train", "--run-dir", "{root}", "--run-name", "done", "--eval-top-p", "nan"], "eval_top_p"),
    (["train", "--run-dir", "{root}", "--run-name", "done", "--tasks", "chain_sum", "gdc"], "did you mean 'gcd'"),
    (["train", "--run-dir", "{root}", "--run-name", "done", "--eps-low", "1"], "eps_low"),
    (["train", "--run-dir", "{root}", "--run-name", "../escape"], "run_name"),
    (["train", "--config", "{root}/missing.yaml"], "--config"),
    (["train", "--run-dir", "{root}", "--run-name", "done", "--task-configs", "{{bad"], "--task-configs"),
    (["train", "--run-dir", "{root}", "--run-name", "done", "--model", "{root}/nonexistent"], "'model'"),
    (["train", "--run-dir", "{root}", "--run-name", "done", "--tasks", "local:{root}/missing.jsonl"], "'tasks'"),
])
def test_cli_errors_are_one_line_and_write_nothing(argv, needle, finished_run, capsys):
    root = finished_run.parent
    before = snapshot(root)
    argv = [a.format(run=finished_run, root=root) for a in argv]
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    err = without_notes(capsys.readouterr().err)
    assert e.value.code == 2 and needle in err and err.count("\n") == 1 and "Traceback" not in err, err
    assert snapshot(root) == before
    assert not (root / "no_such_run").exists(), "resume must not create the directory it was pointed at"


def test_yaml_numbers_are_numbers_as_trl_and_verl_write_them(tmp_path):
    from brorl_lab.core.config import read_config_file

    path = tmp_path / "run.yaml"
    path.write_text("lr: 1e-4\nkl_beta: 1E-3\neps_high: .28\nsteps: 3\nrun_name: '1e-4'\n")
    fields = read_config_file(path)
    assert fields == {"lr": 1e-4, "kl_beta": 1e-3, "eps_high": 0.28, "steps": 3, "run_name": "1e-4"}
    assert Config.from_dict(fields).lr == 1e-4


@pytest.mark.parametrize("text, needle", [
    ("lr: [1e-4\nsteps: 3\n", "line 2"),
    ("steps: 3\nlr: 'unclosed\n", "line 3"),
    ("- 1\n- 2\n", "holds a list"),
    ('{"steps": 3\n', "line 2"),
])
def test_a_broken_config_file_is_one_line_naming_the_file_and_the_line(text, needle, tmp_path, capsys):
    path = tmp_path / "broken.yaml"
    path.write_text(text)
    with pytest.raises(SystemExit) as e:
        cli.main(["train", "--config", str(path), "--run-dir", str(tmp_path / "runs")])
    err = capsys.readouterr().err
    assert e.value.code == 2 and str(path) in err and needle in err, err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("argv", [
    ["train", "--model", "runs/nonexistent"],
    ["eval", "--model", "runs/nonexistent"],
    ["eval", "--model", "./no_such_model"],
    ["eval", "--model", "a/b/c"],
])
def test_a_local_looking_model_path_fails_at_once_and_never_asks_the_hub(argv, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # `runs/` need not exist: the first path component alone says it is local
    t0 = time.monotonic()
    with pytest.raises(SystemExit) as e:
        cli.main([*argv, "--tasks", "chain_sum"] if argv[0] == "eval" else [*argv, "--run-dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "model" in err and argv[2] in err and err.count("\n") == 1, err
    assert time.monotonic() - t0 < 10, "a hub lookup retries for ~20 s"


def test_hub_ids_and_local_paths_are_told_apart(tmp_path, monkeypatch):
    from brorl_lab.core.paths import looks_local

    monkeypatch.chdir(tmp_path)
    (tmp_path / "ckpts").mkdir()
    assert not any(map(looks_local, ["Qwen/Qwen2.5-0.5B-Instruct", "gpt2", "org/name"]))
    assert all(map(looks_local, ["runs/x", "./x", "/x", "~/x", "a/b/c", "ckpts/x", "ckpts"]))


def test_trainer_level_bad_input_fails_before_the_run_dir_is_touched(finished_run, tiny_model, tmp_path):
    from brorl_lab.rl.trainer import Trainer

    root = finished_run.parent
    before = snapshot(root)
    same_run = dict(SMALL, run_dir=str(root), run_name=finished_run.name)
    # a registered family without a frozen eval set, while evaluation is on
    missing = [t for t in names_of("task") if not eval_path(t).is_file()]
    if missing:
        with pytest.raises(ConfigError) as e:
            Trainer(Config(**same_run, model=tiny_model, tasks=[missing[0]], eval_every=1), progress=False,
                    overwrite=True)
        assert_clear_error(e.value, "eval_tasks")
    # a hub id that is neither cached nor reachable (HF_HUB_OFFLINE=1 in conftest); overwrite=True, and still the
    # existing run is not touched: it is only cleared once everything has loaded
    with pytest.raises(ConfigError) as e:
        Trainer(Config(**same_run, model="brorl-lab-tests/no-such-model"), progress=False, overwrite=True)
    assert_clear_error(e.value, "model", "brorl-lab-tests/no-such-model")
    with pytest.raises(ValueError, match="cfg"):
        Trainer(dataclasses.asdict(Config(**same_run)), progress=False)
    assert snapshot(root) == before
    # resume: a damaged config.yaml or a foreign checkpoint file is one ValueError naming the file
    for damage, needle in [("config.yaml", "config.yaml could not be read"),
                           ("checkpoint/state.pt", "state.pt could not be loaded")]:
        copy = tmp_path / f"damaged_{len(needle)}"
        for p in finished_run.rglob("*"):
            if p.is_file():
                (copy / p.relative_to(finished_run)).parent.mkdir(parents=True, exist_ok=True)
                (copy / p.relative_to(finished_run)).write_bytes(p.read_bytes())
        (copy / damage).write_bytes(b"\x00not: [valid\n")
        with pytest.raises(ValueError, match=needle):
            Trainer.resume(copy, progress=False)
    assert snapshot(root) == before


# ---- papermill parameters ----------------------------------------------------------------------------------------
DECLARED = {"mode": "ok", "x": 1, "label": "", "run_dir": ""}


@pytest.fixture(scope="module")
def notebook(tmp_path_factory) -> Path:
    """A small notebook with a parameters cell; it records each execution and what it received."""
    return write_notebook(tmp_path_factory.mktemp("nb") / "params.ipynb",
                          "\n".join(f"{k} = {v!r}" for k, v in DECLARED.items()),
                          "import json, pathlib\n"
                          "d = pathlib.Path(run_dir)\n"
                          "with open(d / 'executions.txt', 'a') as f:\n"
                          "    f.write('1\\n')\n"
                          "(d / 'received.json').write_text(json.dumps({'mode': mode, 'x': x, 'label': label}))\n"
                          "if mode != 'ok':\n"
                          "    raise ValueError(f'mode: got {mode!r}')\n")


BAD_VALUES = st.one_of(
    st.builds(object), st.sets(st.integers(), min_size=1, max_size=2), st.binary(max_size=4),
    st.complex_numbers(allow_nan=False, max_magnitude=5),
    st.sampled_from(["\ud800", "a\udfffb"]),
    st.dictionaries(st.integers(), st.integers(), min_size=1, max_size=2),
    st.lists(st.builds(object), min_size=1, max_size=2).map(lambda v: [1, v]),
    st.builds(lambda: {"ok": [1, {"deep": object()}]}),
)
BAD_PARAMS = st.one_of(
    # unknown names (with valid values)
    st.dictionaries(st.one_of(st.text(max_size=10), st.integers(), st.none()).filter(lambda k: k not in DECLARED),
                    st.integers(), min_size=1, max_size=2).map(lambda d: ("name", d)),
    # declared names with values papermill cannot write into a cell
    st.tuples(st.sampled_from(sorted(DECLARED)), BAD_VALUES).map(lambda kv: ("value", {kv[0]: kv[1]})),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=BAD_PARAMS)
def test_random_bad_papermill_parameters_fail_early_naming_the_parameter(case, notebook, tmp_path_factory):
    kind, params = case
    key = next(iter(params))
    with pytest.raises(ValueError) as e:
        sweep.check_parameters(notebook, params)
    msg = str(e.value)
    assert f"parameter {key!r}" in msg and "allowed" in msg and len(msg.splitlines()) == 1, msg
    if kind == "name":
        assert ", ".join(DECLARED) in msg
    # run_notebook: same error, and the out dir (holding an earlier run) is untouched
    out = tmp_path_factory.mktemp("run")
    (out / "status.json").write_text('{"status": "finished"}')
    (out / "metrics.parquet").write_bytes(os.urandom(64))
    before = snapshot(out)
    with pytest.raises(ValueError) as e2:
        sweep.run_notebook(notebook, out, params)
    assert str(e2.value) == msg
    assert snapshot(out) == before


@pytest.mark.parametrize("params, needle", [
    (None, "parameters"), ([("x", 1)], "parameters"), ("x=1", "parameters"), ({"x": {1, 2}}, "'x'"),
])
def test_check_parameters_wants_a_mapping(params, needle, notebook):
    with pytest.raises(ValueError, match=needle):
        sweep.check_parameters(notebook, params)


def test_odd_but_valid_values_reach_the_notebook_intact(notebook, tmp_path):
    """The validator must not over-reject: NUL, control characters, non-ASCII digits, NaN are writable values."""
    label = "\x00\x07\u0663\u200b\U0001F600 é"
    status = sweep.run_notebook(notebook, tmp_path / "odd", {"label": label, "x": [1.5, None, {"k": "v"}]},
                                html=False)
    assert status["status"] == "finished", status
    import json

    got = json.loads((tmp_path / "odd" / "received.json").read_text())
    assert got == {"mode": "ok", "x": [1.5, None, {"k": "v"}], "label": label}
    sweep.check_parameters(notebook, {"x": math.nan, "label": "\x1b[31m"})


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(grid=st.one_of(
    BAD_PARAMS.map(lambda c: {k: [v] for k, v in c[1].items()}),
    st.just({"x": []}), st.just({"x": 1}), st.just({"mode": "ok"}), st.just({}), st.just([]),
    st.just([{"x": 1}, 5]), st.just("mode=ok"), st.integers(),
    BAD_PARAMS.map(lambda c: [{"x": 2}, c[1]]),
), parallel=st.one_of(st.just(1), st.integers(max_value=0), st.just(True), st.just(1.5)))
def test_a_bad_sweep_fails_before_any_run_and_the_sweep_dir_is_untouched(grid, parallel, notebook, sweep_dir):
    before = snapshot(sweep_dir)
    with pytest.raises(ValueError) as e:
        sweep.run_sweep(notebook, grid, out=sweep_dir, parallel=parallel, progress=False)
    msg = str(e.value)
    assert any(w in msg for w in ("parameter", "grid", "parallel")) and len(msg.splitlines()) == 1, msg
    assert snapshot(sweep_dir) == before


@pytest.fixture(scope="module")
def sweep_dir(notebook, tmp_path_factory) -> Path:
    """A finished one-run sweep (its index and run directory are what a bad re-run must not touch)."""
    out = tmp_path_factory.mktemp("sweep")
    df = sweep.run_sweep(notebook, {"x": [7]}, out=out, progress=False)
    assert list(df["status"]) == ["finished"]
    return out


def test_a_missing_or_unreadable_notebook_is_a_value_error(tmp_path):
    bad = tmp_path / "not_a_notebook.ipynb"
    bad.write_text("print('hi')")
    for nb in (tmp_path / "missing.ipynb", bad):
        for call in (lambda: sweep.check_parameters(nb, {}), lambda: sweep.run_notebook(nb, tmp_path / "o"),
                     lambda: sweep.run_sweep(nb, {"x": [1]}, out=tmp_path / "s", progress=False)):
            with pytest.raises(ValueError, match="notebook"):
                call()
    assert not (tmp_path / "o").exists() and not (tmp_path / "s").exists()


# ---- model outputs: answer extraction and every verifier -----------------------------------------------------------
FAMILIES = names_of("task")
CALL_BOUND_S = 2.0  # per verifier call, after the one-time imports (reasoning-gym scorers, math-verify, sympy)
DIGITS = ["3", "٣", "３", "੩", "𝟑", "Ⅲ", "³", "⑶"]  # ASCII, Arabic-Indic, fullwidth, Gurmukhi, math bold, ...
FRAGMENTS = DIGITS + ["<answer>", "</answer>", "<answer", "answer>", "\\boxed{", "{", "}", "\\frac{", "\\sqrt{",
                      "$", "\\(", "\\)", "x =", "-", ".", ",", "/", " ", "\n", "\r", "\t", "\x00", "\x1b[2J",
                      "\u202e", "\u200b", "\ufeff", "\ud800", "\udfff", "\x7f", "e", "E", "nan", "inf", "\\infty",
                      "```python\n", "```", "def f(x):\n    return x\n", "Answer:", "\\left(", "\\right)"]
# '^' towers and factorials are left out here: math-verify evaluates '9^9^9' eagerly and never returns (see
# test_math_verify_power_towers_are_bounded below, which runs them in a subprocess with a hard timeout).
ANY_CHAR = st.characters(codec=None, exclude_categories=())  # includes control characters and lone surrogates


def _nested_frac(depth: int) -> str:
    s = "1"
    for _ in range(depth):
        s = "\\frac{" + s + "}{2}"
    return s


ADVERSARIAL = {
    "1 MB of digits": "7" * 1_000_000,
    "1 MB of tags": "<answer>" * 125_000,
    "1 MB then a tagged answer": "x" * 1_000_000 + "<answer>3</answer>",
    "1 MB of unclosed boxes": "\\boxed{" * 150_000,
    "brace flood": "{" * 200_000 + "}" * 200_000,
    "frac 500 deep": _nested_frac(500),
    "frac 500 deep boxed": "\\boxed{" + _nested_frac(500) + "}",
    "frac 500 deep tagged": "<answer>" + _nested_frac(500) + "</answer>",
    "short nested frac tagged": "<answer>" + _nested_frac(6) + "</answer>",
    "control characters": "".join(map(chr, range(32))) + "<answer>\x00\x01 3</answer>",
    "NUL bytes": "\x00" * 4096,
    "NUL inside answer": "<answer>3\x00</answer>",
    "unicode digits": "<answer>٣٤</answer> \\boxed{３} ੩𝟑",
    "lone surrogates": "\ud800<answer>\udfff</answer>\udbff",
    "nested tags": "<answer><answer>1</answer></answer>",
    "paren 100 deep": "<answer>" + "(" * 100 + "1" + ")" * 100 + "</answer>",
    "fence flood": "```python\n" * 50_000,
    "long answer": "<answer>" + "9" * 5000 + "</answer>",
    "128 nines": "9" * 128,
    "empty": "",
    "whitespace": " \n\t\r" * 100,
    "bidi override": "\u202e<answer>3</answer>",
}


@pytest.fixture(scope="module")
def items() -> dict:
    """One real item of every registered family (frozen eval item when there is a set, else a sampled one), and a
    warm-up call per family so the per-call bound measures verification, not first imports."""
    from brorl_lab.rollout.rewards import score_response
    from brorl_lab.rollout.tasks import TASKS, eval_set

    out = {}
    for name in FAMILIES:
        out[name] = eval_set(name, limit=1)[0] if eval_path(name).is_file() else TASKS[name].sample(1, seed=0)[0]
        score_response(out[name].answer, out[name], "plain")
    return out


def check_scored(family: str, item, response, template: str):
    from brorl_lab.rollout.rewards import score_response

    t0 = time.perf_counter()
    r = score_response(response, item, template)
    dt = time.perf_counter() - t0
    bound = CALL_BOUND_S if family != "code" else CODE_BOUND_S
    assert dt < bound, f"{family}/{template}: {dt:.2f}s on {response[:60]!r}"
    assert type(r.correct) is bool, f"{family}: correct is {type(r.correct).__name__}"
    assert isinstance(r.reward, float) and 0.0 <= r.reward <= 1.0, f"{family}: reward {r.reward!r}"
    assert not r.correct or r.reward == 1.0, f"{family}: correct with reward {r.reward}"
    assert r.extracted is None or isinstance(r.extracted, str)
    return r


CODE_BOUND_S = 5.0 + 5.0  # the code family's own sandbox limit (5 s) plus process start and teardown


@pytest.mark.parametrize("family", [f for f in FAMILIES if f != "code"])
@pytest.mark.parametrize("case", list(ADVERSARIAL))
def test_adversarial_outputs_score_in_range_without_raising_or_hanging(family, case, items):
    for template in ("plain", "chat"):
        check_scored(family, items[family], ADVERSARIAL[case], template)


@pytest.mark.parametrize("family", [f for f in FAMILIES if f != "code"])
def test_the_reference_answer_survives_junk_around_it_and_still_scores_in_range(family, items):
    """Sanity for the fuzzing below: the verifier is live (the clean reference scores 1) under both templates."""
    item = items[family]
    for template, wrap in (("plain", " {}"), ("chat", "thinking... <answer>{}</answer>")):
        assert check_scored(family, item, wrap.format(item.answer), template).correct


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(family=st.sampled_from([f for f in FAMILIES if f != "code"]),
       response=st.one_of(st.text(ANY_CHAR, max_size=300),
                          st.lists(st.sampled_from(FRAGMENTS), max_size=40).map("".join),
                          st.tuples(st.lists(st.sampled_from(FRAGMENTS), max_size=10).map("".join),
                                    st.text(ANY_CHAR, max_size=40)).map(lambda t: f"{t[0]}<answer>{t[1]}</answer>")),
       template=st.sampled_from(["plain", "chat"]))
def test_random_outputs_never_raise_and_score_in_range(family, response, template, items):
    check_scored(family, items[family], response, template)


@settings(max_examples=300, deadline=None)
@given(response=st.one_of(st.text(ANY_CHAR, max_size=2000), st.lists(st.sampled_from(FRAGMENTS), max_size=80)
                          .map("".join), st.none(), st.integers(), st.binary(max_size=8)),
       template=st.one_of(st.sampled_from(["plain", "chat"]), st.text(max_size=5)))
def test_extract_answer_never_raises_and_returns_none_or_a_string(response, template):
    from brorl_lab.rollout.tasks.templates import extract_answer

    t0 = time.perf_counter()
    got = extract_answer(response, template)
    assert time.perf_counter() - t0 < 0.5
    assert got is None or isinstance(got, str)
    if not isinstance(response, str) or template not in ("plain", "chat"):
        assert got is None


def test_extract_answer_is_bounded_on_megabyte_outputs():
    from brorl_lab.rollout.tasks.templates import extract_answer

    for case in ("1 MB of digits", "1 MB of tags", "1 MB of unclosed boxes", "brace flood", "frac 500 deep boxed"):
        for template in ("chat", "plain"):
            t0 = time.perf_counter()
            extract_answer(ADVERSARIAL[case], template)
            # a tail of 1024 unclosed '<answer>' is the regex's worst case: ~0.35 s here, bounded by the tail size
            assert time.perf_counter() - t0 < CALL_BOUND_S, case
    assert extract_answer(ADVERSARIAL["1 MB then a tagged answer"], "chat") == "3"  # the tail is searched


@pytest.mark.skipif("code" not in FAMILIES, reason="no code family registered")
def test_code_family_few_adversarial_outputs(items):
    """The code family runs a sandboxed process per call, so only a few cases: huge, binary junk, a fence flood,
    surrogates in code, and code that never returns (bounded by the sandbox's own limit)."""
    item = items["code"]
    for response in (ADVERSARIAL["1 MB of digits"], ADVERSARIAL["fence flood"], ADVERSARIAL["NUL bytes"],
                     "```python\ndef f(x):\n    return '\ud800'\n```", ADVERSARIAL["control characters"]):
        assert check_scored("code", item, response, "chat").reward == 0.0
    r = check_scored("code", item, "```python\nwhile True:\n    pass\n```", "chat")
    assert (r.reward, r.correct) == (0.0, False)


POWER_TOWERS = ["9^9^9", "10**10**10"]
TOWER_SCRIPT = """
import sys, time
from brorl_lab.rollout.rewards import score_response
from brorl_lab.rollout.tasks import eval_set
item = eval_set("simple_equations", limit=1)[0]
score_response(item.answer, item, "plain")  # warm-up
for tower in sys.argv[1:]:
    t0 = time.perf_counter()
    r = score_response(tower, item, "plain")
    print(f"{time.perf_counter() - t0:.3f}", r.reward, r.correct, flush=True)
"""


@pytest.mark.skipif("simple_equations" not in FAMILIES, reason="no math-verify family registered")
def test_math_verify_power_towers_are_bounded():
    import subprocess
    import sys

    try:  # a subprocess: a hung verifier cannot be interrupted in-process (sympy's integer power runs in C)
        out = subprocess.run([sys.executable, "-c", TOWER_SCRIPT, *POWER_TOWERS], capture_output=True, text=True,
                             timeout=120)  # start-up and imports included: generous under load; a hang never ends
    except subprocess.TimeoutExpired:
        pytest.fail(f"simple_equations verifier did not return within 120 s on {POWER_TOWERS}")
    assert out.returncode == 0, out.stderr[-500:]
    lines = [line.split() for line in out.stdout.splitlines()]
    assert len(lines) == len(POWER_TOWERS)
    for seconds, reward, correct in lines:
        assert float(seconds) < CALL_BOUND_S and correct in ("True", "False") and 0 <= float(reward) <= 1


# ---- the file system and damaged files: one line, exit 2, nothing written (issue 37) ------------------------------
@pytest.fixture
def read_only_dir(tmp_path):
    """A directory nobody can create files in: chmod 0555, or for root (whom modes do not stop) the immutable
    attribute (chattr +i), removed again at the end."""
    import subprocess

    d = tmp_path / "read_only"
    d.mkdir()
    (d / "existing.txt").write_text("kept")
    if os.geteuid() == 0:
        made = subprocess.run(["chattr", "+i", str(d)], capture_output=True).returncode == 0
    else:
        d.chmod(0o555)
        made = True
    try:
        (d / "probe").write_text("x")
        (d / "probe").unlink()
        writable = True
    except OSError:
        writable = False
    if not made or writable:
        pytest.skip("this machine cannot make a read-only directory (no chattr as root)")
    yield d
    if os.geteuid() == 0:
        subprocess.run(["chattr", "-i", str(d)], check=True)
    else:
        d.chmod(0o755)


def unwritable_places(tmp_path: Path, read_only: Path) -> dict[str, Path]:
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    return {"read-only": read_only / "out", "under a file": blocker / "out", "/proc": Path("/proc/brorl_out")}


def run_cli(argv, capsys) -> str:
    with pytest.raises(SystemExit) as e:
        cli.main([str(a) for a in argv])
    err = capsys.readouterr().err
    assert e.value.code == 2, err
    lines = [ln for ln in err.splitlines() if not ln.startswith(("notice:", "note:"))]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def small_args(model: str) -> list[str]:
    return ["--model", model, "--template", "plain", "--rollouts-per-prompt", "4", "--prompts-per-step", "2",
            "--max-new-tokens", "4", "--eval-prompts", "4", "--eval-samples", "4", "--eval-k", "1", "--steps", "1",
            "--threads", "1", "--no-dynamic-sampling"]


def test_every_command_that_writes_refuses_an_unwritable_place_in_one_line_before_any_work(
        finished_run, tiny_model, tmp_path, read_only_dir, capsys):
    """train, resume, export, report --out, eval --json, import-run, sweep and launch, each pointed at a read-only
    directory, a path under a file and /proc: exit 2, one line naming the place, nothing written anywhere."""
    import shutil

    places = unwritable_places(tmp_path, read_only_dir)
    nb = write_notebook(tmp_path / "nb.ipynb", "x = 1\nrun_dir = ''", "print(x)")
    log = tmp_path / "verl.log"
    log.write_text("step:1 - critic/score/mean:0.5\n")
    cfg_file = tmp_path / "cfg.yaml"
    cfg_file.write_text(yaml.safe_dump(dict(SMALL, model=tiny_model, tasks=["gcd"], steps=1)))
    root = finished_run.parent
    before = snapshot(root)
    for label, place in places.items():
        cases = {
            "train": ["train", "--run-dir", place, "--run-name", "r", *small_args(tiny_model)],
            "export": ["export", finished_run, place / "hf"],
            "report --out": ["report", finished_run, "--out", place / "r.html"],
            "eval --json": ["eval", "--model", tiny_model, "--tasks", "gcd", "--samples", "2", "--prompts", "2",
                            "--json", place / "e.json"],
            "import-run": ["import-run", "--from", "verl", log, place / "run", "--config", cfg_file],
            "sweep": ["sweep", nb, "--out", place / "sweep"],
            "launch": ["launch", "--to", "verl", cfg_file, place / "launch"],
        }
        for what, argv in cases.items():
            line = run_cli(argv, capsys)
            assert "cannot write" in line and str(place) in line, f"{what} into {label}: {line}"
    # resume of a run whose directory became read-only: the same one line, before any step
    ro_run = read_only_dir.parent / "ro_run"
    shutil.copytree(finished_run, ro_run)
    import subprocess

    if os.geteuid() == 0:
        subprocess.run(["chattr", "+i", str(ro_run)], check=True)
    else:
        ro_run.chmod(0o555)
    try:
        line = run_cli(["train", "--resume", ro_run, "--steps", "2"], capsys)
        assert "cannot write" in line and "run_dir" in line
    finally:
        subprocess.run(["chattr", "-i", str(ro_run)]) if os.geteuid() == 0 else ro_run.chmod(0o755)
    assert snapshot(root) == before
    assert list(read_only_dir.iterdir()) == [read_only_dir / "existing.txt"]
    assert not (tmp_path / "a_file").is_dir() and not Path("/proc/brorl_out").exists()


def damaged_copy(run: Path, dest: Path) -> Path:
    import shutil

    return Path(shutil.copytree(run, dest))


def test_damaged_files_are_one_line_and_nothing_is_written(finished_run, tiny_model, tmp_path, capsys):
    """A garbage metrics.parquet (report), a garbage state.pt (export of a run without policy/), a truncated
    model.safetensors (export verifies the weights it copies), `sweep --parallel 0`: one line, exit 2, no output."""
    import shutil

    bad_metrics = damaged_copy(finished_run, tmp_path / "bad_metrics")
    (bad_metrics / "metrics.parquet").write_bytes(b"PAR1 this is not parquet")
    line = run_cli(["report", bad_metrics], capsys)
    assert "metrics.parquet could not be read" in line
    assert not (bad_metrics / "report.html").exists()

    bad_state = damaged_copy(finished_run, tmp_path / "bad_state")
    shutil.rmtree(bad_state / "policy")
    (bad_state / "checkpoint" / "state.pt").write_bytes(b"\x00garbage")
    line = run_cli(["export", bad_state, tmp_path / "out1"], capsys)
    assert "state.pt could not be loaded" in line and not (tmp_path / "out1").exists()

    truncated = damaged_copy(finished_run, tmp_path / "truncated")
    weights = truncated / "policy" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    line = run_cli(["export", truncated, tmp_path / "out2"], capsys)
    assert "model.safetensors" in line and "damaged" in line and not (tmp_path / "out2").exists()
    assert not list(tmp_path.glob(".out2*")), "the staged copy is removed"

    nb = write_notebook(tmp_path / "nb.ipynb", "x = 1", "print(x)")
    line = run_cli(["sweep", nb, "--parallel", "0", "--out", tmp_path / "sw"], capsys)
    assert "parallel" in line and not (tmp_path / "sw").exists()


def test_a_rebuilt_metrics_or_status_file_is_reported_on_resume(finished_run, tmp_path, capsys):
    from brorl_lab.rl.trainer import Trainer

    run = damaged_copy(finished_run, tmp_path / "garbage")
    (run / "metrics.parquet").write_bytes(b"garbage")
    (run / "status.json").write_text("{not json")
    with Trainer.resume(run, progress=False) as t:
        said = "\n".join(t.notices)
    assert "status.json was unreadable" in said and "metrics.parquet did not match the checkpoint" in said
    assert len(pd.read_parquet(run / "metrics.parquet")) == 2  # row 0 and step 1, from the checkpoint
    assert {e["event"] for e in RunDir(run).read_events()} >= {"rebuilt"}
    assert "rebuilt from it" in capsys.readouterr().err


# ---- habits of TRL users (issue 37) --------------------------------------------------------------------------------
def test_trl_names_in_a_config_file_are_read_with_a_note_or_refused_with_the_hint(tmp_path, capsys):
    path = tmp_path / "trl.yaml"
    path.write_text("num_generations: 8\nlearning_rate: 0.0002\n")
    cfg = cli.config_from_args(cli.build_parser().parse_args(["train", "--config", str(path)]))
    assert cfg.rollouts_per_prompt == 8 and cfg.lr == 2e-4
    err = capsys.readouterr().err
    assert "num_generations (TRL's name) read as rollouts_per_prompt" in err
    path.write_text("generation_batch_size: 64\n")
    line = run_cli(["train", "--config", path], capsys)
    assert "'generation_batch_size' is TRL's name; here: prompts_per_step" in line
    path.write_text("num_generations: 8\nrollouts_per_prompt: 4\n")
    assert "both 'num_generations'" in run_cli(["train", "--config", path], capsys)


def test_one_thread_flag_every_command_and_every_command_in_the_usage_line():
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    usage = parser.format_usage()
    for name, sp in sub.choices.items():
        assert name in usage, f"{name} missing from the usage line"
    torch_commands = ("demo", "train", "eval", "export", "sweep", "plateau", "reach", "scaling", "regime-map",
                      "theorem", "train-default")
    for name in torch_commands:
        flags = {s for a in sub.choices[name]._actions for s in a.option_strings}
        assert "--threads" in flags, f"{name} has no --threads"
    args = parser.parse_args(["train", "--torch-threads", "3"])  # the deprecated alias, same field
    assert args.torch_threads == 3 and parser.parse_args(["train", "--threads", "2"]).torch_threads == 2


def test_eval_samples_alone_works_and_a_runs_policy_is_evaluated_on_its_own_tasks(finished_run):
    parser = cli.build_parser()
    cfg = cli.eval_config(parser.parse_args(["eval", "--samples", "2"]))
    assert cfg.eval_samples == 2 and max(cfg.eval_k) <= 2
    tasks, configs = cli._run_tasks(str(finished_run))
    assert tasks == Config.from_dict(yaml.safe_load((finished_run / "config.yaml").read_text())).tasks


def test_the_automatic_run_name_tells_lr_and_advantage_apart():
    from brorl_lab.rl.trainer import default_run_name

    names = {default_run_name(Config(**kw)) for kw in (dict(), dict(lr=1e-3), dict(lr=3e-3), dict(advantage="rloo"))}
    assert len(names) == 4
    assert default_run_name(Config()) == f"{'-'.join(Config().tasks)}_N{Config().rollouts_per_prompt}_P" \
                                         f"{Config().prompts_per_step}_s0"


def test_a_hub_id_with_no_network_fails_in_one_line_without_retry_cycles(tmp_path, capsys, monkeypatch):
    """No route to the hub (this machine): the CLI sets HF_HUB_OFFLINE before loading, so the one line comes
    without retries; the variable is set only for a hub id."""
    import socket

    def no_network(*a, **kw):
        raise OSError("Network is unreachable")

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(socket, "create_connection", no_network)
    cli._offline_if_unreachable("./local/model")
    assert "HF_HUB_OFFLINE" not in os.environ
    cli._offline_if_unreachable("someorg/no-such-model")
    assert os.environ.get("HF_HUB_OFFLINE") == "1"
    line = run_cli(["train", "--model", "someorg/no-such-model", "--run-dir", tmp_path, "--tasks", "gcd"], capsys)
    assert "'model'" in line and "someorg/no-such-model" in line


def test_a_full_disk_mid_run_is_one_line_saying_what_stays(tiny_model, tmp_path, capsys, monkeypatch):
    import errno

    import torch

    def full(*a, **kw):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", full)  # the checkpoint's state.pt write hits a full disk
    with pytest.raises(SystemExit) as e:  # mid-run: the step lines came first; the error is the one last line
        cli.main([str(a) for a in ["train", "--quiet", "--run-dir", tmp_path, "--run-name", "full",
                                   *small_args(tiny_model), "--eval-every", "0"]])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "Traceback" not in err, err
    line = err.strip().splitlines()[-1]
    assert "checkpoint at step 1 could not be written (ENOSPC" in line and "no earlier checkpoint" in line
    assert RunDir(tmp_path / "full").read_status()["status"] == "failed"
