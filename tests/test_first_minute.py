"""What a user meets in the first minute (issue 46): refusals in a second, before torch loads; every user-side
fault one line with exit 2; a sweep over `train` flags whose report pairs seeds; one set of flags (a flag two
commands share states its default where they differ). No dead end whatever stopped a run, at whatever phase:
tests/test_stop_matrix.py.

Real processes where a refusal is timed; the tiny model of helpers_models and a few steps each."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from helpers_models import save_tiny

from brorl_lab.core.runlock import RunLock

ROOT = Path(__file__).resolve().parent.parent
TINY = dict(template="plain", rollouts_per_prompt=4, prompts_per_step=2, max_new_tokens=4, eval_prompts=4,
            eval_samples=4, eval_k=[1], eval_every=0, checkpoint_every=0, threads=1, dynamic_sampling=False, lr=1e-2)
HEAVY = ("torch", "transformers", "pandas", "vllm", "ray", "datasets", "reasoning_gym")


def env() -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> str:
    return str(save_tiny(tmp_path_factory.mktemp("model") / "tiny"))


def train_cmd(model: str, root: Path, name: str, **over) -> list[str]:
    out = []
    for k, v in {**TINY, "model": model, "run_dir": str(root), "run_name": name, **over}.items():
        flag = "--" + k.replace("_", "-")
        out += [flag, *map(str, v)] if isinstance(v, list) else (
            [flag if v else f"--no-{k.replace('_', '-')}"] if isinstance(v, bool) else [flag, str(v)])
    return [sys.executable, "-m", "brorl_lab", "train", "--quiet", *out]


def run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, env=env(), capture_output=True, text=True, timeout=300, **kw)


def cli(argv: list[str], capsys) -> tuple[int, str, str]:
    """``python -m brorl_lab argv`` in this process (torch already loaded: fast): (exit status, stdout, stderr)."""
    from brorl_lab.cli import main

    capsys.readouterr()
    try:
        rc = main([str(a) for a in argv])
    except SystemExit as e:
        rc = e.code
    out, err = capsys.readouterr()
    return rc, out, err


def last_line(err: str) -> str:
    assert "Traceback" not in err, err
    lines = [ln for ln in err.splitlines() if ln.strip() and not ln.startswith(("notice:", "note:"))]
    return lines[-1]


# ---- answers in a second ---------------------------------------------------------------------------------------------
REFUSALS = {
    "advantage": (["train", "--advantage", "grop"], "did you mean 'grpo'"),
    "engine": (["train", "--engine", "trch"], "did you mean 'torch'"),
    "task": (["train", "--tasks", "chain_summ"], "did you mean 'chain_sum'"),
    "model path": (["train", "--model", "./no_such_model"], "config field 'model'"),
    "abbreviated flag": (["train", "--step", "2"], "unrecognized arguments: --step"),
}


@pytest.mark.parametrize("name", list(REFUSALS))
def test_a_bad_name_is_refused_in_one_line_before_torch_loads(name, tmp_path):
    """Checked in-process (no heavy module imported by the refusal) and timed in a process of its own."""
    argv, needle = REFUSALS[name]
    code = ("import sys\nfrom brorl_lab.cli import main\ntry:\n    main(sys.argv[1:])\nexcept SystemExit as e:\n"
            "    print('rc', e.code)\nprint('heavy', sorted(m for m in %r if m in sys.modules))\n" % (HEAVY,))
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-c", code, *argv, "--run-dir", str(tmp_path)], env=env(),
                       capture_output=True, text=True, timeout=120)
    seconds = time.perf_counter() - t0
    assert "rc 2" in p.stdout and "heavy []" in p.stdout, (p.stdout, p.stderr)
    assert needle in last_line(p.stderr)
    assert seconds < 8, f"{seconds:.1f} s"  # about 1 s on an idle 2-core machine; generous for a loaded CI


def test_a_locked_run_is_refused_naming_its_writer_before_torch_loads(tmp_path):
    code = ("import sys\nfrom brorl_lab.cli import main\ntry:\n    main(sys.argv[1:])\nexcept SystemExit as e:\n"
            "    print('rc', e.code)\nprint('torch' in sys.modules)\n")
    with RunLock.acquire(tmp_path / "busy"):
        t0 = time.perf_counter()
        p = subprocess.run([sys.executable, "-c", code, "train", "--run-dir", str(tmp_path), "--run-name", "busy"],
                           env=env(), capture_output=True, text=True, timeout=120)
        seconds = time.perf_counter() - t0
    assert p.stdout.split() == ["rc", "2", "False"], (p.stdout, p.stderr)
    assert f"being written by pid {os.getpid()}" in last_line(p.stderr)
    assert seconds < 8, f"{seconds:.1f} s"


@pytest.mark.parametrize("field, ours", [("save_total_limit", "keep_checkpoints"),
                                         ("gradient_accumulation_steps", "train_micro_batch_tokens")])
def test_trl_names_without_a_one_to_one_value_are_refused_with_our_equivalent(field, ours, tmp_path):
    (tmp_path / "c.yaml").write_text(f"{field}: 2\n")
    p = run([sys.executable, "-m", "brorl_lab", "train", "--config", str(tmp_path / "c.yaml")])
    assert p.returncode == 2 and f"here: {ours}" in last_line(p.stderr)


# ---- no dead ends: every way to stop x every phase is tests/test_stop_matrix.py ------------------------------------


def test_damaged_weights_are_one_line_for_eval_and_train(tiny_model, tmp_path, capsys):
    rc, _, err = cli(train_cmd(tiny_model, tmp_path, "r", steps=1)[3:], capsys)
    assert rc == 0, err
    weights = tmp_path / "r" / "policy" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    for argv in (["eval", "--model", str(tmp_path / "r"), "--eval-samples", "2", "--eval-prompts", "2"],
                 train_cmd(str(tmp_path / "r"), tmp_path, "next", steps=1)[3:]):
        rc, _, err = cli(argv, capsys)
        line = last_line(err)
        assert rc == 2 and "config field 'model'" in line and "safetensors" in line, (argv[0], err[-1500:])


def test_launch_reads_yaml_as_train_does_and_a_bad_file_is_one_line(tmp_path, capsys):
    from brorl_lab.lab.verl_launch import load_config

    (tmp_path / "ok.yaml").write_text("lr: 1e-4\n")
    assert load_config(tmp_path / "ok.yaml").lr == 1e-4
    (tmp_path / "bad.yaml").write_text("lr: [1e-4\nsteps: 2\n")
    rc, _, err = cli(["launch", "--to", "verl", tmp_path / "bad.yaml", tmp_path / "out"], capsys)
    assert rc == 2 and "bad.yaml: line 2" in last_line(err)


# ---- sweeps and reports that compare ----------------------------------------------------------------------------------
def test_a_sweep_over_train_flags_and_its_report_pair_the_seeds(tiny_model, tmp_path, capsys):
    fixed = [x for k, v in TINY.items() if k not in ("threads", "rollouts_per_prompt", "eval_every")
             for x in ("-p", f"{k}={v!r}" if isinstance(v, (list, str)) else f"{k}={v}")]
    argv = [sys.executable, "-m", "brorl_lab", "sweep", "--grid", "rollouts_per_prompt=2,4", "--grid", "seed=0,1",
            "--steps", "1", "--out", str(tmp_path / "sw"), "--parallel", "1", "--threads", "1", "--quiet",
            "-p", f"model={tiny_model}", "-p", "eval_every=1", *fixed]
    rc, first, err = cli(argv[3:], capsys)  # in this process: the sweep runs its points here (--parallel 1)
    assert rc == 0, err[-2000:]
    index = pd.read_parquet(tmp_path / "sw" / "index.parquet")
    assert sorted(index["run"]) == ["rollouts_per_prompt2_seed0", "rollouts_per_prompt2_seed1",
                                    "rollouts_per_prompt4_seed0", "rollouts_per_prompt4_seed1"]
    assert (index["status"] == "finished").all()
    assert "paired by seed" in first and "rollouts_per_prompt=4" in first
    rc, out, _ = cli(["report", tmp_path / "sw"], capsys)
    assert rc == 0 and "seeds" in out and "(n=2, t=12.71" in out, out
    before = (tmp_path / "sw" / "rollouts_per_prompt2_seed0" / "checkpoint" / "state.pt").stat().st_mtime_ns
    rc, out, err = cli(argv[3:], capsys)  # resumable: every point finished, read back, not trained again
    assert rc == 0 and "paired by seed" in out, err
    assert (tmp_path / "sw" / "rollouts_per_prompt2_seed0" / "checkpoint" / "state.pt").stat().st_mtime_ns == before


def test_the_declared_names_are_exactly_the_registered_implementations():
    """A registry's names are known before torch loads (rl.names, rollout.engine_names); once the implementations
    are imported, every declared name has one and the package registers nothing else."""
    import brorl_lab.rl.algo  # noqa: F401 - registers the estimators, losses and KL estimators
    import brorl_lab.rl.trackers  # noqa: F401
    import brorl_lab.rollout.engines  # noqa: F401
    from brorl_lab.rl import names
    from brorl_lab.rollout.engine_names import ENGINES

    for reg in (names.ADVANTAGES, names.POLICY_LOSSES, names.KL_ESTIMATORS, names.LOSS_AGGREGATIONS, names.TRACKERS,
                ENGINES):
        assert reg.declared and set(reg.declared) == set(reg._items), reg.kind
    names.POLICY_LOSSES.register("my_loss", lambda *a, **kw: None)  # a notebook's own: joins the names
    try:
        assert names.POLICY_LOSSES.names() == ["ppo_clip", "pg", "my_loss"]
    finally:
        del names.POLICY_LOSSES._items["my_loss"]


@pytest.mark.parametrize("argv, eval_k", [(["--eval-samples", "2"], [1]), (["--eval-samples", "8"], [1, 4]),
                                          (["--eval-samples", "8", "--eval-k", "2"], [2])])
def test_eval_k_is_cut_to_eval_samples_unless_given(argv, eval_k):
    from brorl_lab.cli import build_parser, config_from_args

    assert config_from_args(build_parser().parse_args(["train", *argv])).eval_k == eval_k


def test_overwrite_says_what_it_removed_naming_the_users_own_files(tiny_model, tmp_path, capsys):
    run_dir = tmp_path / "r"
    (run_dir / "checkpoint").mkdir(parents=True)
    (run_dir / "checkpoint" / "state.pt").write_bytes(b"old")
    (run_dir / "notes.txt").write_text("mine")
    rc, _, err = cli(train_cmd(tiny_model, tmp_path, "r", steps=1)[3:] + ["--overwrite"], capsys)
    assert rc == 0, err
    line = next(ln for ln in err.splitlines() if "--overwrite removed" in ln)
    assert "checkpoint" in line and "notes.txt" in line and "not written by a run: notes.txt" in line, line
    assert not (run_dir / "notes.txt").exists()


def test_a_notebook_is_named_with_or_without_ipynb():
    from brorl_lab.cli import _notebook_path
    from brorl_lab.core.config import ConfigError
    from brorl_lab.core.paths import NOTEBOOK_DIR

    assert _notebook_path("00_quickstart") == _notebook_path("00_quickstart.ipynb") == \
        NOTEBOOK_DIR / "00_quickstart.ipynb"
    with pytest.raises(ConfigError, match="NOTEBOOK: '00_quickstar' .*00_quickstart"):
        _notebook_path("00_quickstar")


@pytest.mark.parametrize("argv, eval_k", [(["--eval-samples", "8"], [1, 8]), (["--eval-samples", "4"], [1]),
                                          (["--eval-samples", "8", "--eval-k", "1", "2"], [1, 2])])
def test_scaling_eval_samples_alone_trims_eval_k_and_eval_k_is_a_flag(argv, eval_k, tmp_path, monkeypatch):
    """Issue 46: `scaling --eval-samples 8` died after 18 s on the floor's eval_k [1, 8, 64]; it now trims eval_k to
    what the samples allow (as train and eval do), and --eval-k sets it. The settings reach the runner, whose Config
    accepts them (the floor's run itself is not started here: its own tests run it)."""
    from brorl_lab import cli
    from brorl_lab.study import runner
    from brorl_lab.study.recipe import recipe_config

    seen = {}

    class Stop(Exception):
        pass

    def capture(out, *, settings, **kw):
        seen.update(settings)
        raise Stop

    monkeypatch.setattr(runner, "run_floor", capture)
    with pytest.raises(Stop):
        cli.main(["scaling", "--out", str(tmp_path / "floor"), *argv])
    assert seen["eval_k"] == eval_k
    cfg = recipe_config(eval_samples=seen["eval_samples"], eval_k=seen["eval_k"])  # a Config the floor can build
    assert cfg.eval_k == eval_k


# ---- one set of flags ------------------------------------------------------------------------------------------------
def test_a_flag_two_commands_share_states_its_default_where_they_differ_and_the_docs_list_them_all():
    """Every flag taken by two or more commands: where their defaults differ, each command's --help says its
    default (or where it comes from: a study's design); docs/CLI.md carries the whole table, as the parsers have it."""
    import argparse

    from brorl_lab.cli import _HelpFormatter, build_parser, shared_flags, shared_flags_markdown

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    table = shared_flags(parser)
    assert table["--threads"]["train"] == "0" and table["--threads"]["eval"] == "1"  # the difference the help explains
    unexplained = []
    for flag, by in table.items():
        if len(set(by.values())) == 1:
            continue
        for command in by:
            action = next(a for a in sub.choices[command]._actions if flag in a.option_strings)
            if "default" not in _HelpFormatter(command)._get_help_string(action):
                unexplained.append(f"{command} {flag}")
    assert not unexplained, unexplained
    assert shared_flags_markdown() in (ROOT / "docs" / "CLI.md").read_text(), (
        "docs/CLI.md's table of shared flags differs from the parsers: paste the output of `python -c 'from "
        "brorl_lab.cli import shared_flags_markdown as t; print(t())'` over it")
