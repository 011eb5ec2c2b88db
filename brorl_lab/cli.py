"""``python -m brorl_lab <command>``: demo, train, eval, report, export, tensorboard, sweep, iso-compute, ...

Every Config field is a ``train`` option (``--rollouts-per-prompt 512``), and ``--config run.yaml`` reads a file
of the same fields; options override the file. Everything is validated before any work starts, and a bad value
ends with one line naming the field, the value and what is allowed.

Parsing and checking the flags imports no torch (defaults the parser shows come from plain data; the commands
import what they run). An error the user caused (a :class:`~brorl_lab.core.validation.UserError`: a bad flag, a
config field, a path or run directory that is not what the command needs) is one line and exit status 2; any other
exception is a bug and keeps its traceback. ``--debug`` shows the traceback of every error. So are the file system's
refusals (an output in a directory that cannot be written, a full disk): every command checks where it will write
before it starts. Ctrl-C and SIGTERM end any command with one line and exit status 130 / 143.

Every command that runs torch takes ``--threads N`` (torch.set_num_threads; ``train``'s ``--torch-threads`` stays as
a deprecated alias of the same config field).
"""

from __future__ import annotations

import argparse
import dataclasses
import errno
import json
import logging
import os
import sys
import time
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Optional

from brorl_lab.core.config import Config, ConfigError, read_config_file
from brorl_lab.core.console import live_bars
from brorl_lab.core.paths import DEFAULT_MODEL_DIR, EVAL_DIR, NOTEBOOK_DIR, PLATEAU_MODEL_DIR, REPO_ROOT, RUNS_DIR
from brorl_lab.core.validation import UserError

FLAGSHIP = "02_rollout_scaling.ipynb"
THEORY = "01_mass_balance_theory.ipynb"


# ---- Config fields as options ------------------------------------------------------------------------------------
def _none_or(cast):
    def parse(s: str):
        return None if s.lower() in ("none", "null", "") else cast(s)

    parse.__name__ = getattr(cast, "__name__", "value")
    return parse


def _json_dict(s: str) -> dict:
    """A dict option (``--task-configs '{"rg:knights_knaves": {"n_people": 2}}'``), as JSON."""
    try:
        value = json.loads(s)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"{s!r} is not JSON ({e.msg} at line {e.lineno} column {e.colno}); "
                                         "allowed: a JSON object") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"{s!r} is a JSON {type(value).__name__}; allowed: a JSON object")
    return value


_json_dict.__name__ = "JSON object"


def add_config_options(parser: argparse.ArgumentParser) -> None:
    hints = typing.get_type_hints(Config)
    group = parser.add_argument_group("config fields (brorl_lab/core/config.py; each help cites its paper)")
    defaults = Config().to_dict()  # shown in --help; the flags themselves default to "not given" (SUPPRESS)
    for f in dataclasses.fields(Config):
        flag = "--" + f.name.replace("_", "-")
        flags = (THREADS_FLAG, flag) if f.name == "torch_threads" else (flag,)  # one thread flag for every command
        hint, optional = hints[f.name], False
        if typing.get_origin(hint) is typing.Union:
            hint, optional = next(a for a in typing.get_args(hint) if a is not type(None)), True
        helptext = f"{f.metadata.get('help', '')} (default: {defaults[f.name]!r})".replace("%", "%%")
        if f.name == "torch_threads":
            helptext += f" ({flag} is a deprecated alias of {THREADS_FLAG}). Defaults: {THREADS_WHY}"
        kw: dict[str, Any] = {"dest": f.name, "default": argparse.SUPPRESS, "help": helptext}
        if hint is bool:
            group.add_argument(*flags, action=argparse.BooleanOptionalAction, **kw)
        elif hint is dict:
            group.add_argument(*flags, type=_json_dict, metavar="JSON", **kw)
        elif hint is list:
            default = f.default_factory() if f.default_factory is not dataclasses.MISSING else []  # type: ignore
            elem = type(default[0]) if default else f.metadata.get("elem", str)
            group.add_argument(*flags, nargs="+", type=elem, metavar=elem.__name__.upper(), **kw)
        else:
            cast = {int: int, float: float, str: str}.get(hint, str)
            group.add_argument(*flags, type=_none_or(cast) if optional else cast, metavar=cast.__name__.upper(), **kw)


THREADS_FLAG = "--threads"


#: why ``--threads`` has three defaults (every command's help says it): one run a user starts takes the cores;
#: what measures documented numbers measures them as they were made; runs side by side share the cores.
THREADS_WHY = ("train and train-default: 0, torch's default (every core for the one run); eval, export, reach and "
               "plateau: 1, as their documented numbers were measured (another count can change a matmul's last bits, "
               "and with them a sampled token); sweep, demo and the study commands: physical cores // runs at a time")


def add_threads(parser: argparse.ArgumentParser, default: Optional[int] = 1, what: str = "") -> None:
    """The one thread flag every command that runs torch takes; its default differs by kind of command
    (:data:`THREADS_WHY`, said in the help)."""
    shown = "" if default is None else f"default {default}; "
    parser.add_argument(THREADS_FLAG, type=int, default=default, metavar="N",
                        help=f"torch threads{what} ({shown}0: leave torch's default). Defaults: {THREADS_WHY}")


def set_threads(n: Optional[int]) -> None:
    if n is not None and n < 0:
        raise ConfigError(f"{THREADS_FLAG}: got {n}; allowed: an integer >= 0 (0: torch's default)")
    if n:
        import torch

        torch.set_num_threads(n)


#: ``eval`` options and the Config fields they stand for: defaults and help come from those fields, so
#: ``python -m brorl_lab eval`` samples exactly as a training run's evaluation does (eval_temperature 0.6, ...).
EVAL_OPTIONS = {"model": "model", "engine": "engine", "samples": "eval_samples", "k": "eval_k",
                "prompts": "eval_prompts", "temperature": "eval_temperature", "top_p": "eval_top_p",
                "max_new_tokens": "max_new_tokens", "template": "template", "seed": "seed",
                "task_configs": "task_configs"}


def add_eval_options(parser: argparse.ArgumentParser) -> None:
    by_name = {f.name: f for f in dataclasses.fields(Config)}
    hints = typing.get_type_hints(Config)
    defaults = Config().to_dict()
    for dest, name in EVAL_OPTIONS.items():
        f, hint = by_name[name], hints[name]
        helptext = f.metadata.get("help", "").replace("%", "%%") + f" (config field {name}; default %(default)s)"
        kw: dict[str, Any] = {"dest": dest, "default": defaults[name], "help": helptext}
        if dest == "k":  # the default: the config's eval_k values that --samples allows (--samples 2 alone works)
            kw["help"] = helptext.replace("default %(default)s", "default %(default)s, those <= --samples")
        if hint is list:
            kw.update(nargs="+", type=type(defaults[name][0]))
        elif hint is dict:
            kw.update(type=_json_dict, metavar="JSON")
        else:
            kw["type"] = {int: int, float: float}.get(hint, str)
        flags = ["--" + dest.replace("_", "-")]  # --samples, --prompts, ...: the short names eval always took
        if name.startswith("eval_"):  # train's (and the study commands') spelling first: --eval-samples, --eval-k
            flags.insert(0, "--" + name.replace("_", "-"))
        parser.add_argument(*flags, **kw)


def eval_config(args: argparse.Namespace) -> Config:
    """The eval options (and ``--tasks`` when given) as a validated Config: one error naming the field for a bad
    value; user-named tasks are built with their ``--task-configs``."""
    default_k = Config().eval_k
    if list(args.k) == default_k and isinstance(args.samples, int):  # the default k, cut to what --samples allows
        args.k = [k for k in default_k if k <= args.samples] or [1]
    fields = {name: getattr(args, dest) for dest, name in EVAL_OPTIONS.items()}
    if getattr(args, "tasks", None):
        fields["tasks"] = list(args.tasks)
    return Config.from_dict(fields)


def config_from_args(args: argparse.Namespace) -> Config:
    """File fields, then command-line overrides; validated once, as a whole."""
    data: dict = {}
    if getattr(args, "config", None):
        path = Path(args.config)
        if not path.exists():
            raise ConfigError(f"--config: file {path} does not exist")
        loaded = read_config_file(path)
        if not isinstance(loaded, dict):
            raise ConfigError(f"--config: {path} must hold a mapping of config fields")
        from brorl_lab.core.trl_names import apply_trl_aliases

        loaded, notes = apply_trl_aliases(loaded, f"--config {path}", Config.field_names())
        for note in notes:
            print(note, file=sys.stderr)
        data.update(loaded)
    data.update({f.name: getattr(args, f.name) for f in dataclasses.fields(Config) if hasattr(args, f.name)})
    return Config.from_dict(trim_eval_k(data))


def trim_eval_k(fields: dict) -> dict:
    """``fields`` with the default ``eval_k`` cut to the k that ``eval_samples`` allows when eval_samples is given
    and eval_k is not (``--eval-samples 2`` works alone, as in ``eval``); an eval_k the user gave is checked as is."""
    n = fields.get("eval_samples")
    if "eval_k" not in fields and isinstance(n, int) and not isinstance(n, bool) and n >= 1:
        fields = {**fields, "eval_k": [k for k in Config().eval_k if k <= n] or [1]}
    return fields


# ---- commands -------------------------------------------------------------------------------------------------------
RESUME_ALSO = ("steps", "torch_threads")  # what --resume takes besides the run: more steps extend it; --threads


def _check_resume_flags(args) -> None:
    if args.resume:
        given = [f"--{f.name.replace('_', '-')}" for f in dataclasses.fields(Config)
                 if hasattr(args, f.name) and f.name not in RESUME_ALSO]
        given += [flag for flag, on in (("--config", args.config), ("--overwrite", args.overwrite)) if on]
        if given:
            raise ConfigError(f"--resume: got {args.resume!r} together with {', '.join(given)}; "
                              "allowed: --resume RUN_DIR (or RUN_DIR/checkpoints/step_N) alone, with --steps N "
                              "to extend the run, or --threads N (it continues with its own config.yaml)")


def cmd_train(args) -> int:
    _check_resume_flags(args)
    cfg = None if args.resume else config_from_args(args)  # validate before importing anything heavy
    restart = _precheck_train(cfg, args)  # names, paths, the run's lock, writability: still no torch
    if restart is not None:  # --resume on a run stopped before its first checkpoint: start it again
        cfg, args.resume = restart, None
    if cfg is not None:
        _offline_if_unreachable(cfg.model)
    print(f"note: {'resuming' if args.resume else 'training'} {_run_path(cfg, args)} (loading torch and the model)",
          file=sys.stderr, flush=True)
    started = time.time()
    trainer, df = _train(args, cfg, started)
    if df is None:  # a signal after the last step had finished the run
        return _finished_anyway(trainer)
    try:
        return _after_training(trainer, df)
    except KeyboardInterrupt:  # a signal while the report is written: the run itself had finished
        if _finished(trainer, started):
            return _finished_anyway(trainer)
        raise


def _train(args, cfg: Optional[Config], started: float):
    """Make (or resume) the Trainer and run it: (trainer, metrics), or (trainer, None) when a signal came after the
    last step had finished the run. Every other way it stops is one line: a signal says what is left (the same
    command, or --resume), the file system's refusal says what stays and what to type once there is space."""
    from brorl_lab.rl.trainer import CheckpointError, Trainer

    trainer = None
    try:
        if args.resume:
            trainer = Trainer.resume(args.resume, progress=not args.quiet, steps=getattr(args, "steps", None))
            set_threads(getattr(args, "torch_threads", None))  # this process only; config.yaml keeps the run's
        else:
            trainer = Trainer(cfg, progress=not args.quiet, overwrite=args.overwrite)
        with trainer:
            return trainer, trainer.run()  # a finished run and a clean stop (first Ctrl-C): both get a report
    except KeyboardInterrupt as e:  # before the first step could finish (loading, the first evaluation), or a
        if _finished(trainer, started):  # ... or after the last step, once this run had finished: nothing is left
            return trainer, None
        e.hint = _interrupt_hint(trainer)  # second Ctrl-C: one line (main) saying what is left
        raise
    except CheckpointError as e:  # a full disk or quota mid-run: the file system said no; the message says what stays
        raise UserError(str(e)) from e
    except OSError as e:  # ... or it said no to a small file (metrics, status): one line with what to type next
        if not _refused_by_the_file_system(e):
            raise
        raise UserError(f"{e.filename}: {e.strerror} ({errno.errorcode[e.errno]}); free space, then: "
                        f"{_interrupt_hint(trainer)}") from e


def _finished(trainer, since: float) -> bool:
    """Whether this command's run wrote status ``finished`` (a status file older than ``since`` is an earlier run's:
    resuming a finished run to extend it, stopped while loading, has not finished)."""
    try:
        path = trainer.run_dir.path / "status.json"
        return path.stat().st_mtime >= since and trainer.run_dir.read_status().get("status") == "finished"
    except (OSError, ValueError, AttributeError):
        return False


def _finished_anyway(trainer) -> int:
    """A signal that came after the last step had finished the run: exit 0, and say where the report comes from."""
    print(f"a signal came after the last step; the run finished (status finished); its report: python -m brorl_lab "
          f"report {trainer.run_dir.path}", file=sys.stderr)
    return 0


def _after_training(trainer, df) -> int:
    """What `train` prints and writes once the loop returned: the run's files, its report, its last evaluations, and
    the exit code (128 + the signal of a clean stop, 0 for a finished run)."""
    print(f"run directory: {trainer.run_dir.path}")
    print(f"metrics: {trainer.run_dir.metrics_path} ({len(df)} rows)")
    from brorl_lab.lab.report import try_write_report

    report = try_write_report([trainer.run_dir.path])
    if report:
        print(f"report: {report}")
    evals = [c for c in df.columns if c.startswith("eval/") and c.endswith("pass@1")]
    if evals:
        print(df[["step", *evals]].dropna().tail(3).to_string(index=False))
    if trainer.stop_signal is not None and not trainer.interrupted:  # the signal came in the last step: it finished
        print(f"signal {trainer.stop_signal} came during the last step; the run finished (status finished)",
              file=sys.stderr)
    elif trainer.stop_signal is not None:  # checkpointed and marked interrupted: exit as a shell reports a signal
        print(f"interrupted by signal {trainer.stop_signal} at step {trainer.step_idx}; "
              f"resume with: python -m brorl_lab train --resume {trainer.run_dir.path}", file=sys.stderr)
        return 128 + int(trainer.stop_signal)
    return 0


def _run_path(cfg: Optional[Config], args) -> Path:
    """The run directory ``train`` writes: ``--resume``'s (a kept checkpoint's run), else the config's."""
    from brorl_lab.core.rundir import default_run_name

    if cfg is None:
        p = Path(args.resume)
        return p.parent.parent if p.parent.name == "checkpoints" else p
    return Path(cfg.run_dir) / (cfg.run_name or default_run_name(cfg))


def _precheck_train(cfg: Optional[Config], args) -> Optional[Config]:
    """What ``train`` can refuse before torch is imported (answers in a second, issue 46): every name against its
    registry, the model path, the run directory writable and its lock free (a second writer is refused naming
    the first). Returns the run's own config when ``--resume`` names a run that has no checkpoint yet (stopped
    before its first one: a second Ctrl-C, kill -9, an out-of-memory kill): it starts again from its config.yaml,
    as the same command would."""
    from brorl_lab.core.rundir import RunDir, check_writable
    from brorl_lab.core.runlock import RunLock, lock_held
    from brorl_lab.rl.names import check_names

    if cfg is not None:
        check_names(cfg)
    elif getattr(args, "steps", None) is not None:
        from brorl_lab.core.validation import check_int

        check_int("steps", args.steps, 1)
    path = _run_path(cfg, args)
    if cfg is None and not Path(args.resume).is_dir():
        raise ConfigError(f"run_dir: {args.resume} is not a directory; allowed: a run directory with a checkpoint "
                          "(or its checkpoints/step_N)")
    check_writable(path, "run_dir")
    if lock_held(path):
        RunLock.acquire(path).release()  # held: the one-line refusal naming the writer (pid, host, command)
    if cfg is not None or Path(args.resume).parent.name == "checkpoints" or RunDir.holds_run(path):
        return None
    if not (path / "config.yaml").is_file():
        raise ConfigError(f"run_dir: {path} has no checkpoint and no config.yaml; nothing to resume; allowed: a run "
                          "directory written by train")
    again = Config.from_dict(RunDir(path).read_config())
    if getattr(args, "steps", None) is not None:
        again = again.replace(steps=args.steps)
    check_names(again)
    print(f"note: {path} has no checkpoint yet (stopped before its first one); starting it again from its "
          "config.yaml", file=sys.stderr)
    return again.replace(run_dir=str(path.parent), run_name=path.name)


def _interrupt_hint(trainer) -> str:
    if trainer is None:
        return "nothing was trained; run the same command again"
    step = trainer._checkpoint_step
    if step is None:
        return (f"no checkpoint was written in {trainer.run_dir.path}; run the same command again, or train --resume "
                f"{trainer.run_dir.path} (either starts it again; what it left is cleared)")
    return f"the checkpoint of step {step} stays; resume with: python -m brorl_lab train --resume {trainer.run_dir.path}"


def _offline_if_unreachable(model: str) -> None:
    """A hub id with no network in reach: set HF_HUB_OFFLINE before transformers is imported, so the lookup fails
    (or finds the cache) in seconds instead of retrying for a minute. Local paths and aliases ask nothing."""
    from brorl_lab.core.paths import looks_local

    if not isinstance(model, str) or "/" not in model or looks_local(model) or os.environ.get("HF_HUB_OFFLINE"):
        return
    import socket
    from urllib.parse import urlparse

    host = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co")).hostname or "huggingface.co"
    try:
        socket.create_connection((host, 443), timeout=3).close()
    except OSError:
        os.environ["HF_HUB_OFFLINE"] = "1"


def _run_tasks(model: str) -> Optional[tuple[list, dict]]:
    """(eval tasks, task_configs) of the run whose policy ``model`` names (``runs/x``, its policy/ or a kept
    checkpoint), from its brorl_lab.json; None for any other model."""
    from brorl_lab.core.rundir import hf_model_dir

    d = hf_model_dir(model) if isinstance(model, str) else None
    info = d / "brorl_lab.json" if d is not None else None
    if info is None or not info.is_file():
        return None
    try:
        cfg = json.loads(info.read_text()).get("config") or {}
    except ValueError:
        return None
    tasks = cfg.get("eval_tasks") or cfg.get("tasks")
    return (list(tasks), dict(cfg.get("task_configs") or {})) if tasks else None


def cmd_eval(args) -> int:
    own = _run_tasks(args.model) if args.tasks is None else None
    if own is not None:  # a run's policy: its own tasks (and their task_configs) by default
        args.tasks = own[0]
        if not args.task_configs:
            args.task_configs = own[1]
        print(f"tasks: {', '.join(args.tasks)} (the run's eval tasks; --tasks to choose others)", file=sys.stderr)
    cfg = eval_config(args)  # the flags' types and ranges, before anything heavy is imported
    if args.json:
        from brorl_lab.core.rundir import check_writable

        check_writable(args.json, "--json")
    from brorl_lab.rl.names import check_names

    check_names(cfg)  # engine, tasks, the model path: before torch loads
    print(f"note: evaluating {args.model} (loading torch and the model)", file=sys.stderr, flush=True)
    set_threads(args.threads)
    _offline_if_unreachable(args.model)
    from brorl_lab.core.models import load_policy
    from brorl_lab.rl.evaluation import evaluate
    from brorl_lab.rl.spec import resolve
    from brorl_lab.rollout.engines import make_engine
    from brorl_lab.rollout.engines.base import RolloutSampling
    from brorl_lab.rollout.tasks import TASKS

    if args.tasks is None:  # every registered family but code (its sandboxed runs are slow)
        args.tasks = [t for t in TASKS.names() if t != "code"]
        cfg = eval_config(args)
    spec = resolve(cfg)  # every option against its config field, tasks built, before any load
    try:
        policy, tok = load_policy(args.model)
    except Exception as e:  # damaged weights, no such hub id: one line; anything else keeps its traceback
        from brorl_lab.rl.trainer import model_load_error

        err = model_load_error(args.model, e)
        if err is e:
            raise
        raise err from e
    spec = spec.with_tokenizer(tok)
    engine = make_engine(args.engine, policy, tok)
    try:
        res = evaluate(engine, args.tasks, samples=args.samples, k=tuple(args.k), prompts=args.prompts,
                       sampling=RolloutSampling(temperature=args.temperature, top_p=args.top_p,
                                                max_new_tokens=args.max_new_tokens, seed=args.seed),
                       template=spec.template, progress=not args.quiet and live_bars(),
                       task_families=spec.families)  # a batch job: no bar, the table at the end
    finally:
        engine.close()
    table = res.table()
    print(f"model={args.model} engine={args.engine} samples={args.samples} prompts<={args.prompts} "
          f"temperature={args.temperature} top_p={args.top_p} seed={args.seed}")
    print(table.to_string(float_format=lambda x: f"{x:.3f}"))
    if args.json:
        from brorl_lab.core.rundir import atomic_write_text

        atomic_write_text(args.json, json.dumps(res.metrics, indent=2))
    return 0


def cmd_export(args) -> int:
    from brorl_lab.rl.trainer import export_policy

    out = export_policy(args.run, args.out)
    print(f"Hugging Face model directory: {out} ({', '.join(sorted(p.name for p in out.iterdir()))})")
    print(f"open it with AutoModelForCausalLM.from_pretrained({str(out)!r}), vLLM, or --model {out}")
    return 0


def cmd_tensorboard(args) -> int:
    from brorl_lab.rl.trackers import metrics_to_tensorboard

    runs = [Path(r) for r in args.runs]
    missing = [str(r) for r in runs if not (r / "metrics.parquet").is_file()]
    if missing:  # check all before writing any
        raise ConfigError(f"runs: {', '.join(missing)} hold no metrics.parquet; allowed: run directories written by "
                          "Trainer")
    for r in runs:
        print(f"{r}: {metrics_to_tensorboard(r)}")
    parent = runs[0].parent if len({r.parent for r in runs}) == 1 else "<run parent>"
    print(f"view with: tensorboard --logdir {parent}")
    return 0


def cmd_report(args) -> int:
    print(f"note: reading {len(args.runs)} path(s) for the report", file=sys.stderr, flush=True)
    from brorl_lab.lab.report import write_report

    if args.out:
        from brorl_lab.core.rundir import check_writable

        check_writable(args.out, "--out")

    print(f"report: {write_report(args.runs, args.out, x=args.x)}")
    if len(args.runs) > 1 or not (Path(args.runs[0]) / "metrics.parquet").is_file():  # several runs: compared
        from brorl_lab.lab.report import collect_runs, compare_text
        from brorl_lab.lab.tracking import load_run_dirs

        text = compare_text(load_run_dirs(collect_runs(args.runs, allow_empty=True)))
        if text:
            print(text)
    return 0


def cmd_demo(args) -> int:
    from brorl_lab.lab.sweep import run_notebook

    nb = NOTEBOOK_DIR / (FLAGSHIP if (NOTEBOOK_DIR / FLAGSHIP).exists() else THEORY)
    out = Path(args.out)
    params = _params(args.param)  # the flagship's miniature by default (study.runner.MINIATURE); -p full_size=True
    params.setdefault("run_dir", str(out.resolve()))  # each study's per-seed files, arm runs and declaration
    p = _jobs_params(argparse.Namespace(jobs=params.get("jobs"), threads=args.threads or params.get("torch_threads"),
                                        ray=params.get("ray")))  # the demo runs alone: one arm run per core
    params.setdefault("jobs", p["jobs"])
    params.setdefault("torch_threads", p["torch_threads"])
    print(f"running {nb.name} under papermill -> {out}/ (the flagship in miniature; progress below)")
    status = run_notebook(nb, out, params, progress=True, stream=_stream_kernels())
    print(f"status: {status['status']}" + (f" ({status.get('error')})" if status["status"] != "finished" else ""))
    print(f"executed notebook: {out / nb.name}")
    if status.get("html"):
        print(f"html export:       {status['html']}")
    pngs = sorted(out.glob("*.png"))
    if pngs:
        print("figures:           " + ", ".join(str(p) for p in pngs))
    if (out / "metrics.parquet").exists():
        print(f"metrics:           {out / 'metrics.parquet'}")
    from brorl_lab.lab.report import try_write_report
    from brorl_lab.lab.tracking import find_run_dirs

    if find_run_dirs(out) and (report := try_write_report([out])):
        print(f"report:            {report}")
    return 0 if status["status"] == "finished" else 1


def _notebook_path(name: str) -> Path:
    """A notebook by path or by name under notebooks/, with or without ``.ipynb`` (``00_quickstart``)."""
    for cand in (Path(name), NOTEBOOK_DIR / name, Path(name + ".ipynb"), NOTEBOOK_DIR / (name + ".ipynb")):
        if cand.is_file():
            return cand
    known = sorted(p.stem for p in NOTEBOOK_DIR.glob("*.ipynb"))
    raise ConfigError(f"NOTEBOOK: {name!r} is not a notebook file or a name under notebooks/; allowed: a path, or "
                      f"one of {', '.join(known)}")


def cmd_sweep(args) -> int:
    from brorl_lab.core.rundir import check_writable

    check_writable(args.out, "--out")
    grid: dict = {}
    for kv in args.grid or []:
        k, _, v = kv.partition("=")
        if not v:
            raise ConfigError(f"--grid: got {kv!r}; allowed: name=v1,v2,...")
        grid[k] = [_literal(x) for x in v.split(",")]
    base = _params(args.param)
    print(f"note: sweep into {args.out}: {' x '.join(f'{k} ({len(v)})' for k, v in grid.items()) or 'one point'}",
          file=sys.stderr, flush=True)
    if args.notebook is None:  # train over a grid of Config fields: no notebook
        return _train_sweep(args, grid, base)
    from brorl_lab.lab.sweep import run_sweep

    nb = _notebook_path(args.notebook)
    if "use_solutions" in nb.read_text():  # a course exercise left unsolved must not fail a sweep point
        base.setdefault("use_solutions", True)
    if args.threads:
        base.setdefault("torch_threads", args.threads)
    df = run_sweep(nb, grid or {"seed": [0]}, out=args.out, parallel=args.parallel, base=base,
                   stream=_stream_kernels())
    print(df.to_string(index=False))
    print(f"index: {Path(args.out) / 'index.parquet'}")
    return 0 if (df["status"] == "finished").all() else 1


def _train_sweep(args, grid: dict, base: dict) -> int:
    """``sweep --grid rollouts_per_prompt=4,32 --grid seed=0,1 [--steps N] [-p field=value]``: train runs over
    Config fields (lab.train_sweep.run_train_sweep), then the runs compared by config, paired by seed."""
    from brorl_lab.lab.report import compare_text, try_write_report
    from brorl_lab.lab.tracking import load_runs
    from brorl_lab.lab.train_sweep import run_train_sweep

    if getattr(args, "steps", None) is not None:
        base.setdefault("steps", args.steps)
    base = trim_eval_k({**base, **({"eval_samples": min(grid["eval_samples"])} if "eval_samples" in grid else {})})
    if "eval_samples" in grid:
        base.pop("eval_samples")
    index = run_train_sweep(grid or {"seed": [0]}, out=args.out, base=base, jobs=args.parallel,
                            threads=args.threads, progress=not args.quiet)
    print(index.to_string(index=False, float_format=lambda v: f"{v:.4f}"))
    text = compare_text(load_runs(args.out))
    if text:
        print(text)
    print(f"index: {Path(args.out) / 'index.parquet'}")
    report = try_write_report([args.out])
    if report:
        print(f"report: {report}")
    return 0 if (index["status"] == "finished").all() else 130


def _stream_kernels() -> bool:
    """The notebook kernels this command starts print plain progress lines (a Trainer's steps), which papermill
    streams to this console as they come (a widget would show nothing there)."""
    from brorl_lab.core.console import PLAIN_PROGRESS_ENV

    os.environ[PLAIN_PROGRESS_ENV] = "1"
    return True


def _params(pairs: Optional[Sequence[str]]) -> dict:
    """``--param NAME=VALUE`` pairs as a dict, values read as Python literals where they parse."""
    out = {}
    for kv in pairs or []:
        k, _, v = kv.partition("=")
        if not k or not _:
            raise ConfigError(f"--param: got {kv!r}; allowed: NAME=VALUE")
        out[k] = _literal(v)
    return out


def cmd_iso_compute(args) -> int:
    from brorl_lab.core.rundir import atomic_write_text, check_writable
    from brorl_lab.lab.analysis import iso_compute_summary
    from brorl_lab.lab.plots import iso_compute_figure
    from brorl_lab.lab.sweep import run_iso_compute
    from brorl_lab.lab.tracking import load_runs

    check_writable(args.out, "--out")
    index = run_iso_compute(args.samples_per_step, args.n, seeds=args.seeds, out=args.out, parallel=args.parallel,
                            params=_params(args.param), stream=_stream_kernels())
    print(index[["run", "status", "wall_s"]].to_string(index=False))
    done = index.loc[index["status"] == "finished", "run"]
    runs = load_runs(args.out)
    runs = runs[runs["run"].str.split("/").str[0].isin(set(done))] if not runs.empty else runs
    if runs.empty:
        print("no finished runs to summarise")
        return 1
    summary = iso_compute_summary(runs)
    out = Path(args.out)
    atomic_write_text(out / "iso_compute_summary.csv", summary.to_csv(index=False))
    iso_compute_figure(summary).write_html(out / "iso_compute.html", include_plotlyjs=True)
    print(summary.to_string(index=False, float_format=lambda v: f"{v:.4f}"))
    print(f"summary: {out / 'iso_compute_summary.csv'}; figure: {out / 'iso_compute.html'}")
    return 0 if (index["status"] == "finished").all() else 1


def cmd_bench(args) -> int:
    sys.path.insert(0, str(REPO_ROOT))
    try:
        from bench import run_all
    except ImportError as e:
        raise ConfigError(f"bench: the bench/ package is not available ({e})") from e
    return run_all.main(only=args.only, smoke=args.smoke, json_path=args.json)


def cmd_plateau(args) -> int:
    from brorl_lab.study.plateau import plateau_config, train_plateau

    lr = {} if args.lr is None else {"lr": args.lr}  # default: study.plateau.PLATEAU_SETTINGS
    cfg = plateau_config(model=args.model, steps=args.steps, tasks=args.families, seed=args.seed,
                         eval_every=args.eval_every, checkpoint_every=args.eval_every, run_dir=args.run_dir,
                         torch_threads=args.threads, **lr)
    rule = {k: v for k, v in (("window", args.window), ("max_slope", args.max_slope), ("gain", args.gain))
            if v is not None}  # unset: study.plateau.PLATEAU_RULE
    res = train_plateau(cfg, out=args.out, rule=rule, gate_prompts=args.gate_prompts, command=_command_line(args))
    print(res.curve.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    r = res.rule
    print(f"{'plateau reached' if res.plateaued else 'NO plateau within the step cap'} at step {res.steps}: slope "
          f"{100 * r['slope']:+.2f} [{100 * r['lo']:+.2f}, {100 * r['hi']:+.2f}] points per {r['per_steps']} steps; "
          + (f"reach gate {100 * res.gate['share']:.1f}% rare-success prompts "
             f"({'passed' if res.gate['passed'] else 'FAILED'}); " if res.gate else "")
          + f"model: {res.out}; run: {res.run_dir}")
    return 0 if res.passed else 3


SCALING_OPTIONS = ("steps", "eval_every", "seeds", "model", "eval_prompts", "eval_samples", "eval_k", "measure_mechanism")


def cmd_reach(args) -> int:
    import time

    from brorl_lab.study.plateau import reach_rates, reach_table_of, save_reach

    set_threads(args.threads)
    t0 = time.perf_counter()
    rates = reach_rates(args.model, args.families, prompts=args.prompts)
    print(reach_table_of(rates).to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    if args.out:
        from brorl_lab.study.recipe import resolve_experiment_model
        from brorl_lab.study.results import provenance, write_provenance

        save_reach(args.out, args.model, rates, command=_command_line(args))
        model = "default" if args.model == "default" else resolve_experiment_model(args.model)
        write_provenance(Path(args.out) / "reach.json", provenance(_command_line(args), {"model": model},
                                                                   time.perf_counter() - t0))
        print(f"written: {args.out}/branch_rates.csv (every prompt) and {args.out}/reach.json (table, p histogram)")
    return 0


def cmd_scaling(args) -> int:
    """The floor study (docs/results/floor.md; the flagship before issue 42), headless: argument parsing and ONE
    call of :func:`brorl_lab.study.runner.run_floor` into ``--out`` (resumable), then its verdict.txt."""
    from brorl_lab.study import runner

    p = _jobs_params(args)
    settings = {k: getattr(args, k) for k in SCALING_OPTIONS if getattr(args, k, None) is not None}
    settings.update(_params(args.param))
    if "eval_samples" in settings and "eval_k" not in settings:  # --eval-samples 8 alone works, as in train and eval
        n = settings["eval_samples"]
        settings["eval_k"] = [k for k in runner.FLOOR["eval_k"] if isinstance(n, int) and k <= n] or [1]
    if args.full_size:
        settings["seeds"] = sorted(set(settings.get("seeds", runner.FLOOR["seeds"])) | set(range(runner.FLOOR_FULL_SEEDS)))
    res = runner.run_floor(args.out, settings=settings, middle=args.full_size or args.middle_seeds is not None,
                           middle_seeds=args.middle_seeds, jobs=p["jobs"], ray=p["ray"], threads=p["torch_threads"],
                           command=_command_line(args))
    print(res.text, file=sys.stdout if res.finished else sys.stderr)
    if res.finished:
        print(f"written: {Path(args.out) / 'verdict.txt'} (verdict.json and metrics.parquet beside it)")
    if res.finished and args.figures:  # the floor's shipped name (docs/results/floor.md reads it)
        from brorl_lab.study.results import publish

        print(f"written: {publish(args.out, args.figures, {'verdict.json': 'flagship_verdict.json'}, res.record)[0]}")
    return 0 if res.finished else 130


def cmd_paid(args) -> int:
    """The flagship paid in generated samples, headless: argument parsing and ONE call of
    :func:`brorl_lab.study.runner.run_study` (every arm and seed into ``--out/arms``, resumable; then points.csv,
    metrics.parquet, verdict.json and verdict.txt, each with its provenance). ``--read POINTS`` runs nothing: the
    study's one reading of a per-seed file. ``--ship`` (or a full-size preset: ``--preset``) enforces
    pre-registration: the declaration committed, the tree clean."""
    from brorl_lab.study import runner

    if args.read:
        print(runner.headline_line(args.read) if Path(args.read).is_file() else runner.reading_of_points(args.read))
        return 0
    p = _jobs_params(args)
    if args.preset:
        study = runner.preset(args.preset)
    else:
        over = {k: v for k, v in (("eval_prompts", args.eval_prompts), ("eval_samples", args.eval_samples),
                                  ("tasks", args.families), ("lr", args.lr)) if v is not None}
        study = runner.Study(name=Path(args.out).name, model=args.model, seeds=tuple(args.seeds), budget=args.budget,
                             points=args.points, arms=("prorl", "brorl") if args.no_middle else
                             ("prorl", "brorl", "middle"), overrides=over, brorl_lr_factor=args.brorl_lr_factor,
                             takeoff_level=args.takeoff_level, takeoff_family=args.takeoff_family,
                             mechanism=args.mechanism)
    res = runner.run_study(study, Path(args.out), jobs=p["jobs"], ray=p["ray"], threads=p["torch_threads"],
                           progress=True, ship=args.ship, command=_command_line(args), ledger=args.ledger)
    print(res.text, file=sys.stdout if res.finished else sys.stderr)
    if res.finished and args.figures:  # the shipped names: paid_<out's name without paid_>_<file>
        from brorl_lab.study.results import publish

        stem = "paid_" + Path(args.out).name.removeprefix("paid_")
        names = {f: f"{stem}_{f}" for f in ("points.csv", "mechanism.csv", "metrics.parquet", "verdict.json")}
        print("written: " + ", ".join(str(w) for w in publish(args.out, args.figures, names, res.record)[::2]))
    return 0 if res.finished else 130


def cmd_regime_map(args) -> int:
    """The regime map headless: argument parsing and ONE call of :func:`brorl_lab.study.regime.run_regime_map`
    into ``--out`` (resumable; the declaration first, every results file with its provenance). ``--read FOLDER``
    runs nothing: the map's one reading of a folder's per-seed files; ``--summarize`` redoes its tables, reading
    and figure from them."""
    from brorl_lab.study import regime

    if args.read:
        print(regime.reading_line(regime.reading_of_files(args.read)))
        return 0
    if args.summarize:
        res = regime.write_outputs(Path(args.out), *regime.read_outputs(Path(args.out)))
        print(res["text"] + (f"\n{res['png_note']}" if res["png_note"] else ""))
        return 0
    p = _jobs_params(args)
    study = regime.preset("quick" if args.quick else "full", **_params(args.param))
    res = regime.run_regime_map(study, Path(args.out), jobs=p["jobs"], ray=p["ray"], threads=p["torch_threads"],
                                ship=args.ship, figures=args.figures, command=_command_line(args))
    print(res.text, file=sys.stdout if res.finished else sys.stderr)
    if res.finished:
        print(f"reading: {res.reading}\nwritten: {Path(args.out)} (regime.txt, regime_map.csv, ...)"
              + (f" and {args.figures}" if args.figures else ""))
    return 0 if res.finished else 130


def _jobs_params(args) -> dict:
    """``--jobs / --ray / --threads`` as the study notebooks' parameters, checked here (one line, exit 2) before a
    notebook starts."""
    from brorl_lab.lab.jobs import plan_workers

    jobs, threads = plan_workers(args.jobs, args.threads, args.ray)
    return {"jobs": jobs, "ray": args.ray, "torch_threads": threads}


def cmd_theorem(args) -> int:
    """Theorem 1 on the model, headless: argument parsing and ONE call of
    :func:`brorl_lab.study.theorem.theorem_study` (the declaration first, resumable, its files with provenance, its
    one reading). ``--read FOLDER`` runs nothing: the study's one reading of FOLDER's per-seed file."""
    from brorl_lab.study import theorem

    if args.read:
        print(theorem.reading_line(theorem.reading_of_files(args.read)))
        return 0
    p = _jobs_params(args)
    given = {k: v for k, v in (("n_values", args.n_values), ("prompts", args.prompts), ("held_out", args.held_out))
             if v is not None}  # unset: study.theorem's N_VALUES, PROMPTS, HELD_OUT
    res = theorem.theorem_study(args.models, seeds=range(args.seeds), lr=args.lr, optimizer=args.optimizer,
                                trials=args.trials, root=args.root, figure_dir=args.figure_dir,
                                command=_command_line(args), jobs=p["jobs"], ray=p["ray"], threads=p["torch_threads"],
                                ship=args.ship, **given)
    print(res["table"])
    print(f"reading: {res['text']}\nfigure: {res['png']}; tables: {args.root}; wall {res['record']['wall_s']:.0f} s, "
          f"load average {os.getloadavg()[0]:.1f}")
    return 0


def cmd_make_data(args) -> int:
    from brorl_lab.rollout.make_data import make_eval_sets

    given = {k: getattr(args, k) for k in ("families", "size", "seed") if getattr(args, k) is not None}
    for name, path in make_eval_sets(**given, out_dir=Path(args.out_dir)).items():
        print(f"{name}: {path}")
    return 0


def cmd_train_default(args) -> int:
    from brorl_lab.rl.train_default import TRAIN_DEFAULTS, train_default_model

    options = {k: getattr(args, k) for k in TRAIN_DEFAULTS if getattr(args, k) is not None}  # None: the default
    families = {} if args.families is None else {"families": args.families}
    report = train_default_model(args.out, command=_command_line(args), **families, **options)
    print(json.dumps(report, indent=1))
    return 0



def cmd_render(args) -> int:
    """Rebuild the results pages, their figures and the README's headline from the shipped files (study.render);
    with --check, write nothing and exit 1 at the first file that differs from its render."""
    from brorl_lab.study.render import RenderError, differences, render, write

    try:
        rendered = render()
    except RenderError as e:
        print(f"render: {e}", file=sys.stderr)
        return 2
    if args.check:
        diff = differences(rendered)
        for line in diff[:1] if diff else [f"render: {len(rendered)} files equal their render"]:
            print(line, file=sys.stderr if diff else sys.stdout)
        return 1 if diff else 0
    for name in write(rendered):
        print(f"wrote {name}")
    return 0


def cmd_adopt(args) -> int:
    """Copy a study clone's finished, clean-provenance results files into this checkout (study.results.adopt), then
    say what to run next; exit 1 when a file here differs from the clone's (left untouched), 2 on a bad source."""
    from brorl_lab.study.results import adopt

    try:
        got = adopt(args.source, REPO_ROOT, dry_run=args.dry_run)
    except ValueError as e:
        print(f"adopt: {e}", file=sys.stderr)
        return 2
    verb = "would adopt" if args.dry_run else "adopted"
    print(f"{verb} {len(got['adopted'])} results files, {len(got['same'])} already here, "
          f"{len(got['conflicts'])} conflicting, {len(got['refused'])} refused")
    for kind in ("conflicts", "refused"):
        for line in got[kind]:
            print(f"  {kind[:-1] if kind == 'conflicts' else 'refused'}: {line}")
    if got["adopted"] and not args.dry_run:
        print("next: python -m brorl_lab render, then commit notebooks/figures, docs/results and README.md")
    return 1 if got["conflicts"] else 0


def cmd_launch(args) -> int:
    from brorl_lab.core.rundir import check_writable
    from brorl_lab.lab.verl_launch import launch_verl, load_config

    check_writable(args.out, "OUT")

    cfg = load_config(args.source)
    res = launch_verl(cfg, args.out, model_path=args.model_path, gpus_per_node=args.gpus_per_node, nodes=args.nodes,
                      rollout_engine=args.rollout_engine, train_prompts=args.train_prompts,
                      max_prompt_length=args.max_prompt_length, strict=args.strict, overwrite=args.overwrite,
                      command=_command_line(args))
    for w in res.warnings:
        print(f"warning: {w}")
    print(res.summary())
    if args.check:
        from brorl_lab.lab.verl_compose import check_launch

        print(check_launch(res.out))
    return 0


def cmd_import_run(args) -> int:
    from brorl_lab.core.rundir import check_writable
    from brorl_lab.lab.verl_import import import_verl_run

    check_writable(args.run, "RUN")

    run = import_verl_run(args.logdir, args.run, config=args.config, overwrite=args.overwrite)
    print(f"run directory: {run} (config.yaml, metrics.parquet, verl_metrics.parquet)")
    print(f"draw it: python -m brorl_lab report {run}")
    return 0


def _command_line(args) -> str:
    """The command as typed (recorded in the files a command writes, so anyone can re-run it)."""
    return " ".join(["python -m brorl_lab", *(args.argv if args.argv is not None else sys.argv[1:])])


def _literal(s: str) -> Any:
    import ast

    try:
        return ast.literal_eval(s)
    except (ValueError, SyntaxError):
        return s


# ---- parser ---------------------------------------------------------------------------------------------------------
def add_jobs_options(parser: argparse.ArgumentParser) -> None:
    """A study's runs as independent jobs (brorl_lab.lab.jobs, docs/study-jobs.md)."""
    parser.add_argument("--jobs", type=int, default=None,
                        help="runs side by side on this machine, each in its own process and run directory (default: "
                             "one per physical core; 1: one after another). Same numbers at any --jobs for the same "
                             "--threads")
    parser.add_argument("--ray", metavar="ADDRESS", default=None,
                        help="run every run as a Ray task on the cluster at ADDRESS (host:port from `ray start "
                             "--head`, or auto); the output directory must be on a filesystem every node mounts")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads per run (default: physical cores // --jobs; 1 per Ray task)")


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Every option's help states its default: ``(default: X)`` is added where the help does not say it already."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if (action.option_strings and "default" not in text and action.default is not argparse.SUPPRESS
                and action.default is not None and action.default is not False and action.nargs != 0):
            text += " (default: %(default)s)"
        return text


class _Parser(argparse.ArgumentParser):
    """argparse, with a bad flag reported as one line (the usage is one --help away), like every other user error,
    and no abbreviations (``--step 2`` is an error, not ``--steps 2``); subcommands are built with the same class,
    and every option's help states its default (:class:`_HelpFormatter`)."""

    def __init__(self, *a, **kw):
        kw["allow_abbrev"] = False
        kw.setdefault("formatter_class", _HelpFormatter)
        super().__init__(*a, **kw)

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m brorl_lab", description=__doc__.splitlines()[0])
    p.add_argument("--debug", action="store_true", help="show the traceback of every error, also of bad input")
    sub = p.add_subparsers(dest="command", required=True)

    d = sub.add_parser("demo", help="run the flagship experiment notebook under papermill")
    d.add_argument("--out", default="runs/demo", help="output directory (default runs/demo)")
    d.add_argument("--param", "-p", action="append", metavar="NAME=VALUE", help="notebook parameter override")
    add_threads(d, None, " (default: up to 2, the demo runs alone)")
    d.set_defaults(func=cmd_demo)

    t = sub.add_parser("train", help="train with a config (options and/or --config YAML)")
    t.add_argument("--config", help="YAML file of config fields")
    t.add_argument("--resume", metavar="RUN_DIR", help="continue a run from its last checkpoint (RUN_DIR), or from a "
                   "kept one (RUN_DIR/checkpoints/step_N); with --steps N (more than before) extend a finished run")
    t.add_argument("--quiet", action="store_true", help="no progress bar")
    t.add_argument("--overwrite", action="store_true",
                   help="replace the run already in the run directory (without it such a run is an error)")
    add_config_options(t)
    t.set_defaults(func=cmd_train)

    e = sub.add_parser("eval", help="pass@k of a model on the frozen eval sets")
    add_eval_options(e)
    e.add_argument("--tasks", nargs="+", required=False, default=None,
                   help="default: a run's own eval tasks for --model RUN, else every family but code")
    e.add_argument("--json", help="also write the metrics as JSON here (default: none, the table only)")
    e.add_argument("--quiet", action="store_true", help="no progress bar")
    add_threads(e)
    e.set_defaults(func=cmd_eval)

    x = sub.add_parser("export", help="copy a run's last checkpoint as a Hugging Face model directory")
    x.add_argument("run", help="run directory (or its policy/)")
    x.add_argument("out", help="new directory to write (safetensors, tokenizer, generation config)")
    add_threads(x)
    x.set_defaults(func=cmd_export)

    tb = sub.add_parser("tensorboard", help="write TensorBoard event files (<run>/tensorboard/) from runs' metrics")
    tb.add_argument("runs", nargs="+", help="run directories (with metrics.parquet)")
    tb.set_defaults(func=cmd_tensorboard)

    r = sub.add_parser("report", help="one self-contained HTML page of one or more runs (several are overlaid)")
    r.add_argument("runs", nargs="+", metavar="RUN",
                   help="a run directory, or a directory holding runs (a sweep, a runs root)")
    r.add_argument("--out", help="the HTML file to write (default for one RUN: RUN/report.html)")
    r.add_argument("--x", default="step", help="x axis of the curves: step (default), cum_samples, cum_updates or "
                   "cum_wall_s (checked against lab.plots.X_AXES)")
    r.set_defaults(func=cmd_report)

    s = sub.add_parser("sweep", help="train over a grid of config fields (no NOTEBOOK), or run a notebook over a "
                       "parameter grid with papermill")
    s.add_argument("notebook", nargs="?", default=None, help="notebook path or name under notebooks/ (.ipynb "
                   "optional); without it, each grid point is a `train` run of those Config fields")
    s.add_argument("--grid", "-g", action="append", metavar="NAME=V1,V2", help="a swept parameter (a Config field "
                   "without NOTEBOOK: --grid rollouts_per_prompt=4,32 --grid seed=0,1)")
    s.add_argument("--param", "-p", action="append", metavar="NAME=VALUE", help="a fixed parameter (a Config field "
                   "without NOTEBOOK); a notebook with course exercises gets use_solutions=True unless given")
    s.add_argument("--steps", type=int, default=None, help="train steps of every run (without NOTEBOOK; default: the "
                   "config's steps, 20)")
    s.add_argument("--quiet", action="store_true", help="no progress bar")
    s.add_argument("--out", default="runs/sweeps/sweep", help="sweep directory")
    s.add_argument("--jobs", "--parallel", dest="parallel", type=int, default=1,
                   help="runs at a time (each gets cores // jobs threads; default 1: each point is a whole train "
                   "run that takes the cores, where a study's arms are sized for one thread each)")
    add_threads(s, None, " per run (default: cores // parallel)")
    s.set_defaults(func=cmd_sweep)

    i = sub.add_parser("iso-compute", help="sweep N at a fixed number of samples per step (notebook 05, papermill)")
    i.add_argument("--samples-per-step", type=int, default=512, help="prompts x N, the same for every N")
    i.add_argument("--n", type=int, nargs="+", default=[4, 16, 64, 256, 512], help="rollouts per prompt to try")
    i.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    i.add_argument("--param", "-p", action="append", metavar="NAME=VALUE",
                   help="a fixed notebook parameter (steps, eval_every, eval_k, model, ...)")
    i.add_argument("--out", default="runs/iso_compute", help="sweep directory")
    i.add_argument("--parallel", type=int, default=1, help="runs at a time (each gets cores // parallel threads)")
    i.set_defaults(func=cmd_iso_compute)

    b = sub.add_parser("bench", help="benchmarks: ratios against peers, measured side by side")
    b.add_argument("--only", nargs="+", help="run only these figures")
    b.add_argument("--smoke", action="store_true", help="tiny sizes (what the tests run)")
    b.add_argument("--json", default="runs/bench/bench.json", help="where to write the JSON")
    b.set_defaults(func=cmd_bench)

    la = sub.add_parser("launch", help="write what another trainer needs to run the same experiment (verl 0.9.1: "
                                       "Hydra overrides, parquet data, reward module, run script)")
    la.add_argument("--to", required=True, choices=["verl"], help="the trainer to launch on")
    la.add_argument("source", metavar="CONFIG_OR_RUN", help="a YAML file of config fields or a run directory")
    la.add_argument("out", metavar="OUT", help="directory to write (overrides.txt, train/eval.parquet, reward.py, "
                                              "run_verl.sh, brorl_config.yaml, WARNINGS.txt)")
    la.add_argument("--model-path", help="the model as the cluster sees it (default: the config's model, resolved here)")
    la.add_argument("--gpus-per-node", type=int, default=8, help="trainer.n_gpus_per_node (default 8)")
    la.add_argument("--nodes", type=int, default=1, help="trainer.nnodes (default 1)")
    la.add_argument("--rollout-engine", default="vllm", choices=["vllm", "sglang"], help="verl's rollout engine")
    la.add_argument("--train-prompts", type=int, help="prompts in train.parquet (default: steps x prompts per step x "
                                                       "(1 + resample rounds), at most 20000; verl cycles through it)")
    la.add_argument("--max-prompt-length", type=int, help="data.max_prompt_length when the tokenizer cannot be "
                                                           "opened here (default: measured on the written prompts)")
    la.add_argument("--strict", action="store_true", help="refuse (one error) instead of warning about knobs verl "
                                                          "cannot express")
    la.add_argument("--check", action="store_true", help="also compose the overrides with verl's own packaged Hydra "
                                                         "config (needs verl installed: `make env` does) and compare")
    la.add_argument("--overwrite", action="store_true", help="replace launch files already in OUT")
    la.set_defaults(func=cmd_launch)

    ir = sub.add_parser("import-run", help="a run logged by another trainer (verl) as a brorl_lab run directory, "
                                           "for report and the run browser")
    ir.add_argument("--from", dest="source", required=True, choices=["verl"], help="the trainer that logged it")
    ir.add_argument("logdir", metavar="LOGDIR", help="verl's file-logger jsonl or console log, or a directory holding "
                                                     "one (launch's OUT/ or OUT/logs/)")
    ir.add_argument("run", metavar="RUN", help="the run directory to write")
    ir.add_argument("--config", help="the config it was launched with (default: brorl_config.yaml at or above the log)")
    ir.add_argument("--overwrite", action="store_true", help="replace a run already in RUN")
    ir.set_defaults(func=cmd_import_run)

    # Defaults that live with their commands (study.recipe.RECIPE, rl.train_default.TRAIN_DEFAULTS,
    # rollout.make_data): None here, so parsing imports none of them (nor torch); each command fills them in.
    a = sub.add_parser("plateau", help="train the default model with the ProRL recipe until held-out pass@1 stalls")
    a.add_argument("--steps", type=int, default=800, help="step cap (the plateau rule usually stops earlier)")
    a.add_argument("--out", default=str(PLATEAU_MODEL_DIR), help="HF model directory to write")
    a.add_argument("--families", nargs="+", default=None, help="default: study.plateau.PLATEAU_FAMILIES")
    a.add_argument("--model", default="default", help="the base the plateau run starts from: 'default', a model "
                   "alias of study.recipe.MODEL_ALIASES or a model directory (e.g. a shorter train-default's)")
    a.add_argument("--seed", type=int, default=0)
    a.add_argument("--eval-every", type=int, default=10)
    a.add_argument("--window", type=int, default=None,
                   help="plateau rule: steps the slope is fit on (default: study.plateau.PLATEAU_RULE, 100)")
    a.add_argument("--max-slope", type=float, default=None,
                   help="plateau rule: bound on the slope interval's upper end, pass@1 per 100 steps (default 0.005)")
    a.add_argument("--gain", type=float, default=None,
                   help="plateau rule: pass@1 the window's mean must have gained over the start (default: none)")
    a.add_argument("--gate-prompts", type=int, default=128,
                   help="reach gate: training prompts measured at 512 draws (0: skip the gate)")
    a.add_argument("--lr", type=float, default=None, help="default: study.plateau.PLATEAU_SETTINGS (3e-5)")
    a.add_argument("--run-dir", default="runs", help="parent of the resumable run directory 'plateau'")
    add_threads(a)
    a.set_defaults(func=cmd_plateau)

    rc = sub.add_parser("reach", help="per family: the share of training prompts with rare successes (512 draws each "
                        "at the training sampler) and the rest of mechanism.reach_summary")
    rc.add_argument("--model", default="default", help="'default', 'plateau' or a model directory")
    rc.add_argument("--families", nargs="+", required=True)
    rc.add_argument("--prompts", type=int, default=128, help="training prompts per family")
    rc.add_argument("--out", default=None, help="also write branch_rates.csv (every prompt's p) and reach.json "
                    "(the table and the per-prompt p histogram) into this directory (default: none, the table only)")
    add_threads(rc)
    rc.set_defaults(func=cmd_reach)

    pa = sub.add_parser("paid", help="the flagship paid in generated samples (study.paid): ProRL 16x64, BroRL "
                        "512x16 and the middle arm from a branch point at its lr, compared at equal generated samples, "
                        "trained samples, updates and wall time")
    pa.add_argument("--model", default="learned", help="branch point: 'learned', 'floor', 'takeoff' or a directory")
    pa.add_argument("--budget", type=int, default=131_072, help="generated samples per arm (default: 16 BroRL steps "
                    "of 512 x 16; BroRL's table counts generated samples)")
    pa.add_argument("--points", type=int, default=8, help="grid thresholds: budget x k / points")
    pa.add_argument("--seeds", type=int, nargs="+", default=list(range(10)))
    pa.add_argument("--lr", type=float, default=None, help="default: the branch point's own lr (its plateau.json)")
    pa.add_argument("--families", nargs="+", default=None, help="default: the branch point's plateau families")
    pa.add_argument("--eval-prompts", type=int, default=None, help="default: the study's (study.runner.Study)")
    pa.add_argument("--eval-samples", type=int, default=None, help="default: the study's (study.runner.Study)")
    pa.add_argument("--no-middle", action="store_true", help="headline arms only")
    pa.add_argument("--brorl-lr-factor", type=float, default=1.0, help="the lr ablation: BroRL's lr x this "
                    "(study.paid.LR_ABLATION: sqrt(8), BroRL's sqrt rule in samples; 0.5, in prompts)")
    pa.add_argument("--takeoff-level", type=float, default=None, help="the takeoff race: pass@1 gain each arm must "
                    "reach (study.paid.TAKEOFF_LEVEL = 0.10), as generated samples to the level, censored at the budget")
    pa.add_argument("--mechanism", action="store_true", help="also the mechanism against its no-training control: "
                    "the 'only N=512' prompts re-drawn at the branch point, and after every headline arm and seed")
    pa.add_argument("--takeoff-family", default=None, help="the family the race and the grid read (default: mean)")
    pa.add_argument("--out", default="runs/paid")
    pa.add_argument("--preset", choices=["learned", "takeoff"], default=None, help="a shipped full-size design "
                    "(study.runner.PRESETS; the other design flags are ignored): pre-registration enforced")
    pa.add_argument("--ship", action="store_true", help="a run meant for shipped results: refuses to start unless "
                    "OUT/declaration.json is committed and the tree is clean (study.results.require_preregistered)")
    pa.add_argument("--ledger", default=None, metavar="DIR", help="declare in DIR and write one small file per "
                    "finished arm x seed there (a folder to commit, e.g. notebooks/figures/paid/<name>): --ship then "
                    "needs DIR/declaration.json committed, not OUT's, and the run resumes from DIR on another clone")
    pa.add_argument("--figures", default=None, metavar="DIR", help="also write the run's per-seed files, metrics and "
                    "verdict.json into DIR (notebooks/figures) as paid_<OUT's name>_<file>, each with its provenance "
                    "(--out runs/paid_learned -> paid_learned_points.csv, ...)")
    pa.add_argument("--read", metavar="POINTS", default=None, help="run nothing: print the study's one reading of a "
                    "per-seed points.csv (e.g. notebooks/figures/paid_learned_points.csv)")
    add_jobs_options(pa)
    pa.set_defaults(func=cmd_paid)

    s = sub.add_parser("scaling", help="the floor study headless (docs/results/floor.md): from data/plateau_model, "
                       "arms on a shared grid of nominal samples, read by its own rule (study.revival.brorl_revives)")
    s.add_argument("--full-size", action="store_true", help="8 paired seeds and the middle arm (floor.md's run)")
    s.add_argument("--out", default="runs/scaling", help="run directory (arm runs in OUT/arms; resumable)")
    s.add_argument("--steps", type=int, default=None, help="BroRL-arm steps (the ProRL arm gets ratio x as many)")
    s.add_argument("--eval-every", type=int, default=None, help="BroRL-arm steps between shared-grid points")
    s.add_argument("--seeds", type=int, nargs="+", default=None)
    s.add_argument("--middle-seeds", type=int, nargs="+", default=None, help="seeds of the middle arm (given: the "
                   "middle arm runs)")
    s.add_argument("--model", default=None, help="default: plateau")
    s.add_argument("--eval-prompts", type=int, default=None)
    s.add_argument("--eval-samples", type=int, default=None, help="samples per held-out prompt; alone, it trims "
                   "the floor's eval_k to the k it allows")
    s.add_argument("--eval-k", type=int, nargs="+", default=None, help="the k of pass@k (each <= --eval-samples)")
    s.add_argument("--measure-mechanism", action=argparse.BooleanOptionalAction, default=None)
    s.add_argument("--figures", default=None, metavar="DIR", help="also write verdict.json into DIR "
                   "(notebooks/figures) as flagship_verdict.json, the floor page's file, with its provenance")
    s.add_argument("--param", "-p", action="append", metavar="NAME=VALUE", help="any other setting of "
                   "study.runner.FLOOR (lr, reward, eval_k, mechanism_prompts, mechanism_draws, tasks, ...)")
    add_jobs_options(s)
    for action in s._actions:  # not given: the floor design's own value
        if action.default is None and action.dest in SCALING_OPTIONS and "default" not in (action.help or ""):
            action.help = (action.help + " " if action.help else "") + "(default: study.runner.FLOOR's)"
    s.set_defaults(func=cmd_scaling)

    g = sub.add_parser("regime-map", help="the same branch on several task settings: BroRL - ProRL against rho "
                       "(study.regime.run_regime_map; notebook 06 calls the same)")
    g.add_argument("--out", default="runs/regime_map", help="run directory (each setting's arm runs below it)")
    g.add_argument("--param", "-p", action="append", metavar="NAME=VALUE",
                   help="a setting of study.regime.RegimeMap (settings, seeds, steps, model, arm_table, ...); any "
                   "change makes the run exploratory")
    g.add_argument("--read", metavar="FOLDER", default=None,
                   help="run nothing: the map's one reading (study.regime.regime_reading) of FOLDER's per-seed "
                   "files (a run's --out, or notebooks/figures)")
    g.add_argument("--ship", action="store_true", help="a run meant for shipped results: the declaration "
                   "committed and the tree clean (the full-size design enforces this anyway)")
    g.add_argument("--figures", default=None, metavar="DIR", help="also write the shipped set (regime_*.csv, "
                   "regime.json, regime.txt, each with its provenance) into DIR (notebooks/figures; `render` draws "
                   "the page's figure from them)")
    add_jobs_options(g)
    g.add_argument("--summarize", action="store_true",
                   help="run nothing: redo the table, reading and figure from OUT/regime_seeds.csv and "
                   "OUT/regime_branch.csv")
    g.add_argument("--quick", action="store_true", help="the tiny preset (3 settings, tiny sizes): minutes")
    g.set_defaults(func=cmd_regime_map)

    th = sub.add_parser("theorem", help="Theorem 1 on the model: one update at each N, dQ_pos per prompt, vs theory")
    th.add_argument("--models", nargs="+", default=["plateau", "default"])
    th.add_argument("--n-values", type=int, nargs="+", default=None,
                    help="the N (rollouts_per_prompt) of the update (default: study.theorem.N_VALUES, 4 to 512)")
    th.add_argument("--seeds", type=int, default=16, help="rollout seeds 0..K-1")
    th.add_argument("--prompts", type=int, default=None,
                    help="in-batch prompts (prompts_per_step; default: study.theorem.PROMPTS, the BroRL arm's)")
    th.add_argument("--held-out", type=int, default=None,
                    help="held-out prompts per family (frozen eval sets; default: study.theorem.HELD_OUT)")
    th.add_argument("--lr", type=float, default=None, help="default: the flagship recipe's")
    th.add_argument("--optimizer", default="adamw", choices=["adamw", "sgd"])
    th.add_argument("--trials", type=int, default=400, help="Monte-Carlo draws per prompt and N for P(dQ<0)")
    th.add_argument("--root", default=str(RUNS_DIR / "theorem"))
    th.add_argument("--figure-dir", default=str(NOTEBOOK_DIR / "figures"))
    th.add_argument("--read", metavar="FOLDER", default=None, help="run nothing: the study's one reading "
                    "(study.theorem.theorem_reading) of FOLDER's per-seed file (a --root, or notebooks/figures)")
    th.add_argument("--ship", action="store_true", help="a run meant for shipped results: its declaration "
                    "(ROOT/declaration.json) committed and the tree clean")
    add_jobs_options(th)
    th.set_defaults(func=cmd_theorem)

    m = sub.add_parser("make-data", help="regenerate the frozen eval sets data/eval/<family>.jsonl")
    m.add_argument("--families", nargs="+", default=None, help="default: the built-in families")
    m.add_argument("--size", type=int, default=None, help="default: rollout.make_data.EVAL_SIZE (200)")
    m.add_argument("--seed", type=int, default=None, help="default: rollout.make_data.EVAL_SEED (0)")
    m.add_argument("--out-dir", default=str(EVAL_DIR))
    m.set_defaults(func=cmd_make_data)

    d = sub.add_parser("train-default", help="train the shipped default model from scratch (supervised warm start)")
    d.add_argument("--out", default=str(DEFAULT_MODEL_DIR))
    d.add_argument("--families", nargs="+", default=None, help="default: the built-in families")
    for flag in ("--steps", "--sequences-per-step", "--lr", "--seed", "--hidden-size", "--layers"):
        d.add_argument(flag, type=float if flag == "--lr" else int, default=None,
                       help="default: rl.train_default.TRAIN_DEFAULTS")
    d.add_argument("--eval-prompts", type=int, default=None,
                   help="eval prompts per family for the report (0: skip; default: TRAIN_DEFAULTS)")
    d.add_argument("--eval-samples", type=int, default=None,
                   help="samples per eval prompt at each temperature (default: TRAIN_DEFAULTS)")
    add_threads(d, 0)
    d.set_defaults(func=cmd_train_default)

    rd = sub.add_parser("render", help="rebuild docs/results/*.md, their figures and the README's headline table "
                        "from the shipped results files (study.render)")
    rd.add_argument("--check", action="store_true", help="write nothing; exit 1 naming the first differing line")
    rd.set_defaults(func=cmd_render)
    ad = sub.add_parser("adopt", help="copy the finished results files (each with a clean, known commit in its "
                        "provenance) of a study clone's notebooks/figures into this checkout; nothing here is "
                        "overwritten")
    ad.add_argument("source", help="the study clone (a checkout of this repository that ran a study)")
    ad.add_argument("--dry-run", action="store_true", help="list what would be copied; copy nothing")
    ad.set_defaults(func=cmd_adopt)
    sub.metavar = "{" + ",".join(sub.choices) + "}"  # the usage line lists every command
    return p


def shared_flags(parser: Optional[argparse.ArgumentParser] = None) -> dict[str, dict[str, str]]:
    """Every flag that two or more commands take: {flag: {command: its default}}, the default as the command uses
    it (``train``'s are the Config's; ``-`` is "not given": the command's help says what it then does, e.g. a
    study's own design). docs/CLI.md lists this table; tests/test_first_minute.py holds the two together."""
    parser = parser or build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    config, root = Config().to_dict(), str(REPO_ROOT) + os.sep
    table: dict[str, dict[str, str]] = {}
    for command, p in sub.choices.items():
        for action in p._actions:
            default = config.get(action.dest) if action.default is argparse.SUPPRESS else action.default
            shown = "-" if default is None else str(default).replace(root, "")
            for flag in action.option_strings:
                if flag.startswith("--") and flag != "--help":
                    table.setdefault(flag, {})[command] = shown
    return {flag: by for flag, by in sorted(table.items()) if len(by) > 1}


def shared_flags_markdown() -> str:
    """:func:`shared_flags` as the Markdown table docs/CLI.md carries."""
    lines = ["| flag | command: default |", "|---|---|"]
    for flag, by in shared_flags().items():
        lines.append(f"| `{flag}` | " + "; ".join(f"{c}: `{d}`" for c, d in by.items()) + " |")
    return "\n".join(lines)


def quiet_third_party() -> None:
    """A command's console shows our progress only: no transformers weight-loading / shard-writing bars (they read
    HF_HUB_DISABLE_PROGRESS_BARS when first imported) and no math-verify timeout warnings (a timeout scores the
    answer wrong, which the metrics already count). Notebooks keep both."""
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    logging.getLogger("math_verify").setLevel(logging.ERROR)


#: errno values that are the file system saying no (not a bug): one line and exit 2, like bad input (EFBIG: a
#: file-size limit, ulimit -f or a quota per file, refuses a write as a full disk does)
FS_ERRNOS = ("EACCES", "EPERM", "EROFS", "ENOSPC", "EDQUOT", "EFBIG", "ENOTDIR", "EISDIR", "ENAMETOOLONG", "EEXIST",
             "EIO", "ENOENT")


def _refused_by_the_file_system(e: OSError) -> bool:
    return errno.errorcode.get(e.errno or 0) in FS_ERRNOS and e.filename is not None


def _raise_on_sigint():
    """SIGINT raises KeyboardInterrupt in the main thread even where the process started with it ignored (a job
    sent to the background by a non-interactive shell, `cmd &`: there `kill -INT` was silently ignored and a run
    meant to stop finished instead). Returns the handler it replaced, or None outside the main thread."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(signal.SIGINT, signal.default_int_handler)


def main(argv: Optional[Sequence[str]] = None) -> int:
    import signal

    from brorl_lab.core.console import PLAIN_PROGRESS_ENV, raise_on_sigterm

    quiet_third_party()
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = None if argv is None else list(argv)
    where = f"{parser.prog} {args.command}"
    previous = raise_on_sigterm()
    previous_int = _raise_on_sigint()
    plain = os.environ.get(PLAIN_PROGRESS_ENV)
    try:
        return args.func(args)
    except UserError as e:  # bad input: one line. Anything else is a bug and keeps its traceback.
        if args.debug:
            raise
        parser.exit(2, f"{where}: error: {' '.join(str(e).splitlines())}\n")
    except KeyboardInterrupt as e:  # Ctrl-C / SIGTERM at any moment: one line, 128 + the signal, as a shell says
        if args.debug:
            raise
        signum = int(getattr(e, "signum", signal.SIGINT))
        hint = getattr(e, "hint", "")
        parser.exit(128 + signum, f"{where}: interrupted ({signal.Signals(signum).name})"
                                  + (f"; {hint}" if hint else "") + "\n")
    except OSError as e:  # the file system said no (a read-only place, a full disk) where no check could tell
        if args.debug or not _refused_by_the_file_system(e):
            raise
        parser.exit(2, f"{where}: error: {e.filename}: {e.strerror} ({errno.errorcode[e.errno]}); nothing more was "
                       "written; allowed: a path you can write to, with space\n")
    finally:
        if previous is not None:  # main() called in-process (tests, notebooks): SIGTERM as it was
            signal.signal(signal.SIGTERM, previous)
        if previous_int is not None:
            signal.signal(signal.SIGINT, previous_int)
        if plain is None:  # and the plain-progress flag a papermill command set for its kernels (_stream_kernels)
            os.environ.pop(PLAIN_PROGRESS_ENV, None)
        else:
            os.environ[PLAIN_PROGRESS_ENV] = plain
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
