"""The training loop: the stages of :mod:`brorl_lab.rl.steps` called in order, timed, logged, checkpointed.

    trainer = Trainer(Config(rollouts_per_prompt=16, steps=20))
    metrics = trainer.run()            # DataFrame, one row per step (row 0: the evaluation before training)

One step, top to bottom (CleanRL style; the numbers are the ones on the calls in :meth:`Trainer.step`):
    1. rollout + score + filter   repeated (dynamic sampling) until `prompts_per_step` informative groups or the cap
    2. logprobs                   behaviour (old) log-probs, micro-batched by tokens (skipped on-policy: update
                                  then uses its own logp.detach()); the KL penalty here with kl_placement='reward'
    3. advantages                 registered estimator over each group of N
    4. update                     `optimizer_steps_per_step` mini-batches of PPO-clip + KL (the one loop:
                                  :func:`brorl_lab.rl.steps.update`; reference log-probs inside it)
    5. sync                       engine gets the new weights
    6. reset / eval / log / checkpoint

Determinism: all sampling randomness is keyed by (seed, step, round), and checkpoints carry the RNG states, so a
resumed run reproduces an uninterrupted one exactly on CPU. Ctrl-C (or a Jupyter kernel interrupt) stops after
the current step and leaves a resumable checkpoint.

The run directory has one writer: a Trainer holds its lock (:mod:`brorl_lab.core.runlock`) from construction to
:meth:`Trainer.close`; status.json carries its pid, host and a heartbeat, so a run whose process died reads as
"interrupted (writer gone)". Resume from the last checkpoint or any kept one (``checkpoints/step_N``), and extend a
finished run with more ``steps`` (recorded as a config change). docs/runs.md tells the whole story.
"""

from __future__ import annotations

import errno
import json
import math
import os
import random
import signal
import sys
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Optional

import numpy as np
import pandas as pd
import torch

from brorl_lab.core.batch import RolloutBatch
from brorl_lab.core.config import Config, ConfigError
from brorl_lab.core.console import Interrupted, live_bars
from brorl_lab.core.prefix_attention import supports_shared_prefix
from brorl_lab.core.rundir import (
    HEARTBEAT_S,
    RunDir,
    atomic_write,
    atomic_write_dir,
    atomic_write_text,
    commit_dir,
    default_run_name,
    stage_dir,
)
from brorl_lab.core.runlock import RunLock, lock_held
from brorl_lab.core.seeding import derive_seed
from brorl_lab.core.validation import UserError
from brorl_lab.rl import steps as S
from brorl_lab.rl.allocation import allocator_options
from brorl_lab.rl.evaluation import evaluate
from brorl_lab.rl.logprobs import compute_logprobs
from brorl_lab.rl.spec import RunSpec, resolve
from brorl_lab.rl.trackers import check_trackers
from brorl_lab.rollout.engines import make_engine
from brorl_lab.rollout.engines.base import RolloutEngine, RolloutSampling

CHECKPOINT_FILE = "state.pt"
BEST_METRIC = "eval/mean/pass@1"  # what keep_checkpoints calls the best checkpoint
PROGRESS_METRICS = ("reward_mean", "ds_pass_rate", "kl", "entropy")  # shown per step on the bar and in train.log
POLICY_INFO_FILE = "brorl_lab.json"  # in a policy/ directory: the step, run and config it was trained with
WEIGHT_SUFFIXES = (".safetensors", ".bin")  # the weight files whose sha256 brorl_lab.json records


class RunExistsError(UserError):
    """A new Trainer was pointed at a directory that already holds a run (and neither resume nor overwrite)."""


class CheckpointError(RuntimeError):
    """A checkpoint could not be written (disk full, quota, I/O error); the previous checkpoint file is intact."""

    def __init__(self, message: str, *, errno_: Optional[int] = None, kept: Optional[Path] = None):
        super().__init__(message)
        self.errno, self.kept = errno_, kept


PAUSE_ENV, PAUSE_FILE_ENV = "BRORL_PAUSE_AT", "BRORL_PAUSE_FILE"  # a test's hold at a named phase (_pause_at)


def _pause_at(phase: str, stopping: Callable[[], bool] = lambda: False) -> None:
    """A hold for tests that stop a run at an exact moment (tests/test_stop_matrix.py): when ``$BRORL_PAUSE_AT``
    names ``phase``, write this pid to ``$BRORL_PAUSE_FILE`` and wait while that file exists (at most 10 min), so a
    signal, a ``kill -9`` or a full disk lands in that phase and nowhere else; once ``stopping()`` (a first signal
    was handled) it creates ``$BRORL_PAUSE_FILE.stopping``, so the test knows before it lets the run go on. Phases:
    ``start`` (the model loaded, status running, before the first evaluation and step: a signal stops at once) and
    ``step N`` (step N begun, nothing of it done: a first signal lets it finish). Unset (always, outside tests) it
    costs one dict lookup."""
    if os.environ.get(PAUSE_ENV) != phase:
        return
    hold = Path(os.environ[PAUSE_FILE_ENV])
    hold.write_text(str(os.getpid()))
    said, deadline = False, time.monotonic() + 600
    while hold.exists() and time.monotonic() < deadline:
        time.sleep(0.01)  # a signal's handler runs here (it may raise: a second Ctrl-C, or one before the loop)
        if not said and stopping():
            Path(f"{hold}.stopping").touch()
            said = True


def _best_effort(*records: Callable[[], object]) -> None:
    """Write each record of a run that is already failing or stopping (status, event, metrics); a full or
    read-only disk must not hide the original error behind an OSError."""
    for record in records:
        try:
            record()
        except OSError:
            pass


def _check_eval_sets(spec: RunSpec) -> None:
    """Check every evaluated task has a frozen eval set (the run's user-named tasks build theirs into the cache
    here, on first use, for the run's task_configs)."""
    from brorl_lab.rollout.tasks import eval_path

    for t in spec.eval_tasks if spec.cfg.evaluates else ():
        path = eval_path(t, spec.families)
        if not path.is_file():
            raise ConfigError(f"config field 'eval_tasks' (default: tasks): task {t!r} has no frozen eval set "
                              f"({path} missing); allowed: tasks with an eval set, eval_every=0, or "
                              f"generate it with `python -m brorl_lab make-data --families {t}`")


def write_pretrained(out: Path, policy, tokenizer, cfg: Config, *, step: int, run_dir: Optional[Path] = None) -> None:
    """Fill ``out`` with ``policy`` and ``tokenizer`` in Hugging Face format: safetensors weights, tokenizer files, a
    ``generation_config.json`` sampling as the run evaluates (do_sample, eval_temperature, eval_top_p,
    max_new_tokens: what its pass@k numbers mean) and ``brorl_lab.json`` (step, run, config) saying where it came
    from. The tokenizer is saved with right padding, the transformers default for a model others load."""
    import copy
    import json

    from transformers import GenerationConfig

    out = Path(out)
    policy.save_pretrained(out)
    side = tokenizer.padding_side
    try:
        tokenizer.padding_side = "right"
        tokenizer.save_pretrained(out)
    finally:
        tokenizer.padding_side = side
    gen = copy.deepcopy(getattr(policy, "generation_config", None) or GenerationConfig())
    gen.do_sample, gen.temperature, gen.top_p = True, cfg.eval_temperature, cfg.eval_top_p
    gen.max_new_tokens = cfg.max_new_tokens
    gen.pad_token_id = tokenizer.pad_token_id
    if gen.eos_token_id is None:
        gen.eos_token_id = tokenizer.eos_token_id
    gen.save_pretrained(out)
    info = {"step": step, "run_dir": None if run_dir is None else str(run_dir), "model": cfg.model,
            "config": cfg.to_dict(), "weights_sha256": weight_hashes(out)}
    (out / POLICY_INFO_FILE).write_text(json.dumps(info, indent=1, default=str))


def weight_hashes(directory: Path) -> dict[str, str]:
    """{weight file name: sha256} of a model directory's weight files (what export checks a copy against)."""
    import hashlib

    out = {}
    for f in sorted(Path(directory).iterdir()):
        if f.is_file() and f.name.endswith(WEIGHT_SUFFIXES):
            h = hashlib.sha256()
            with open(f, "rb") as fh:
                for block in iter(lambda: fh.read(1 << 20), b""):
                    h.update(block)
            out[f.name] = h.hexdigest()
    return out


def verify_weights(directory: Path, source: Path) -> None:
    """Check the weights of the model directory ``directory`` (a copy of ``source``): against the sha256 that
    ``brorl_lab.json`` recorded when the checkpoint was written, else by reading every tensor of each safetensors
    file. A mismatch or a file that does not read is one :class:`UserError` naming ``source``'s file."""
    info_file = Path(directory) / POLICY_INFO_FILE
    try:
        recorded = json.loads(info_file.read_text()).get("weights_sha256") if info_file.is_file() else None
    except ValueError:
        recorded = None
    files = [f for f in sorted(Path(directory).iterdir()) if f.name.endswith(WEIGHT_SUFFIXES)]
    if not files:
        raise UserError(f"run: {source} holds no weight file (*.safetensors / *.bin); allowed: a run directory "
                        "with a complete checkpoint")
    if isinstance(recorded, dict) and recorded:
        actual = weight_hashes(directory)
        bad = sorted(name for name in set(recorded) | set(actual) if recorded.get(name) != actual.get(name))
        if bad:
            raise UserError(f"run: {source / bad[0]} does not match the checkpoint's record (sha256 in "
                            f"{POLICY_INFO_FILE}): the file is damaged; allowed: a run directory with intact weights "
                            "(a kept checkpoints/step_N/, or resume the run so it writes policy/ again)")
        return
    from safetensors import safe_open

    for f in files:
        if f.suffix != ".safetensors":
            continue
        try:
            with safe_open(str(f), framework="pt") as st:
                for key in st.keys():
                    st.get_tensor(key)
        except Exception as e:  # noqa: BLE001 - a truncated or foreign file: one line naming it
            raise UserError(f"run: {source / f.name} could not be read ({type(e).__name__}: "
                            f"{' '.join(str(e).split())[:160]}); allowed: a run directory with intact weights") from None


def load_state(path: Path, what: str = "run_dir") -> dict:
    """A checkpoint's state.pt, or one :class:`UserError` naming the file when it does not load."""
    try:
        state = torch.load(path, weights_only=False, map_location="cpu")
        if not isinstance(state, dict) or "policy" not in state or "step" not in state:
            raise ValueError("not a brorl_lab checkpoint (no 'policy' and 'step')")
        return state
    except Exception as e:  # noqa: BLE001 - atomic writes make this a foreign or damaged file, not a torn one
        raise UserError(f"{what}: checkpoint {path} could not be loaded ({type(e).__name__}: "
                        f"{' '.join(str(e).split())[:200]}); allowed: a checkpoint written by Trainer") from None


def export_policy(run: str | Path, out: str | Path) -> Path:
    """Copy a run's last checkpoint as a Hugging Face model directory to ``out`` (a new or empty directory).

    ``run`` is a run directory, its ``policy/`` or a kept ``checkpoints/step_N/``. A run written before policy/
    existed is rebuilt from ``checkpoint/state.pt`` and ``config.yaml`` (the base model loaded on CPU, the
    checkpoint's weights loaded in). The run's lock is held while copying (a run being trained is refused, naming
    its writer), and the copied weights are checked against the sha256 the checkpoint recorded before the copy is
    put in place: a damaged weight file is an error, never an export.
    """

    import shutil

    from brorl_lab.core.models import load_policy
    from brorl_lab.core.rundir import check_writable

    run, out = Path(run), Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UserError(f"out: {out} already exists and is not an empty directory; allowed: a new directory")
    check_writable(out, "out")
    policy_dir = None
    if (run / "config.json").is_file() and (run.name == RunDir.POLICY_DIR or run.parent.name == "checkpoints"):
        policy_dir, run = run, (run.parent if run.name == RunDir.POLICY_DIR else run.parent.parent)
    if not run.is_dir():
        raise UserError(f"run: {run} is not a directory; allowed: a run directory written by Trainer")
    with RunLock.acquire(run, what="run"):
        policy_dir = policy_dir or run / RunDir.POLICY_DIR
        if (policy_dir / "config.json").is_file():
            def copy(tmp: Path) -> None:
                shutil.copytree(policy_dir, tmp, dirs_exist_ok=True)
                verify_weights(tmp, policy_dir)

            return atomic_write_dir(out, copy)
        ckpt = run / "checkpoint" / CHECKPOINT_FILE
        if not ckpt.is_file() or not (run / "config.yaml").is_file():
            raise UserError(f"run: {run} has neither {RunDir.POLICY_DIR}/ nor checkpoint/{CHECKPOINT_FILE} with "
                            "config.yaml; allowed: a run directory with a checkpoint")
        cfg = Config.from_dict(RunDir(run).read_config())
        state = load_state(ckpt, what="run")
        policy, tok = load_policy(cfg.model, device="cpu", dtype=cfg.dtype if cfg.dtype != "auto" else "float32")
        policy.load_state_dict(state["policy"])
        return atomic_write_dir(out, lambda tmp: write_pretrained(tmp, policy, tok, cfg, step=state["step"],
                                                                  run_dir=run))


def _resume_target(path: Path, checkpoint: Optional[int | str | Path]) -> tuple[Path, Path]:
    """(run directory, state.pt) of a resume: the last checkpoint, or a kept one named by step or directory."""
    if path.parent.name == "checkpoints" and (path / CHECKPOINT_FILE).is_file() and checkpoint is None:
        path, checkpoint = path.parent.parent, path
    if not path.is_dir():  # RunDir() would create it
        raise UserError(f"run_dir: {path} is not a directory; allowed: a run directory with a checkpoint")
    kept_root = path / "checkpoints"
    kept = sorted(d.name for d in kept_root.glob("step_*") if (d / CHECKPOINT_FILE).is_file())
    if checkpoint is None:
        ckpt = path / "checkpoint" / CHECKPOINT_FILE
        if not ckpt.exists():
            raise UserError(f"run_dir: {path} has no checkpoint ({ckpt} missing); nothing to resume: run the same "
                            "command again without --resume (what it left is cleared)")
        return path, ckpt
    if isinstance(checkpoint, (str, Path)) and not str(checkpoint).isdigit():
        d = Path(checkpoint)
    elif isinstance(checkpoint, (int, str)) and not isinstance(checkpoint, bool) and int(checkpoint) >= 0:
        d = kept_root / f"step_{int(checkpoint):06d}"
    else:
        raise UserError(f"checkpoint: got {checkpoint!r}; allowed: a kept step ({', '.join(kept) or 'none kept'})")
    if not (d / CHECKPOINT_FILE).is_file():
        raise UserError(f"checkpoint: {d} holds no {CHECKPOINT_FILE}; allowed: the last checkpoint or a kept one "
                        f"({', '.join(kept) or 'none kept: keep_checkpoints=0, or kept before they held the state'})")
    return path, d / CHECKPOINT_FILE


def model_load_error(model: str, e: Exception) -> Exception:
    """The one-line :class:`ConfigError` for a model that does not load for a reason on the user's side (no such
    hub id, no network, damaged or truncated weights: safetensors' own error); any other exception as it is."""
    if not isinstance(e, OSError) and type(e).__name__ != "SafetensorError":
        return e
    first = (str(e).strip().splitlines() or [""])[0]
    return ConfigError(f"config field 'model': could not load {model!r} ({type(e).__name__}: {first[:200]}); "
                       "allowed: 'default', a local HF model directory or run with intact weights "
                       "(model.safetensors), or a hub id that is reachable or cached")


def _load_model(cfg: Config):
    """(policy, tokenizer) of ``cfg.model``; a model that does not load for a reason on the user's side (no such
    hub id, no network, damaged weights) is one :class:`ConfigError` (:func:`model_load_error`)."""
    from brorl_lab.core.models import load_policy

    try:
        return load_policy(cfg.model, device=cfg.device, dtype=cfg.dtype)
    except Exception as e:  # transformers' "not a valid model identifier", no network, damaged weights
        err = model_load_error(cfg.model, e)
        if err is e:
            raise
        raise err from e


def _remove_stale_temps(path: Path) -> None:
    """The temp files a killed or failed checkpoint write left (a full disk: ``.policy.*.tmp``), removed with a
    notice; the caller holds the run's lock, so no live writer owns them."""
    removed = RunDir.remove_stale_temps(path)
    if removed:
        print(f"notice: {path}: removed the temp files a stopped write left ({', '.join(removed)})", file=sys.stderr)


def _run_exists(path: Path) -> RunExistsError:
    """The refusal of a new run in ``path``, which holds a checkpoint; its status as it is (the caller holds the
    lock, so a status "running" was left by a writer that is gone: kill -9, an out-of-memory kill)."""
    from brorl_lab.core.rundir import WRITER_GONE

    was = RunDir(path).read_status()
    status = WRITER_GONE if was["status"] == "running" else was["status"]
    go_on = (f"Trainer.resume({str(path)!r}, steps=N) (CLI: train --resume {path} --steps N, N more than its "
             f"{was.get('step', 0)}) to extend it" if status == "finished" else
             f"Trainer.resume({str(path)!r}) (CLI: train --resume {path}) to continue it")
    return RunExistsError(f"run_dir: {path} already holds a run ({', '.join(RunDir.run_files_in(path))}; status "
                          f"{status}); allowed: {go_on}, overwrite=True (CLI: --overwrite) to replace it, or another "
                          "run_name / run_dir")


def ds_round_cap(cfg: Config) -> int:
    """Rollout rounds a step may take: 1, plus ``max_resample_rounds`` refills with dynamic sampling (the declared
    cap; verl DAPO's ``max_num_gen_batches``)."""
    return 1 + (cfg.max_resample_rounds if cfg.dynamic_sampling else 0)


def new_cum() -> dict:
    """The running totals every metrics row carries as ``cum_<key>``: generated samples (``samples``, refills
    included), trained samples, optimizer updates, generated tokens and training wall time (eval excluded)."""
    return {"samples": 0, "trained_samples": 0, "updates": 0, "tokens": 0, "wall_s": 0.0}


class Trainer:
    """Runs a config end to end. Pass ``policy``/``tokenizer``/``engine`` to reuse objects a notebook already built.

    A run directory that already holds a run (``cfg.run_dir/run_name``, or ``run_dir``: a checkpoint, or metrics
    of a trained step) is never overwritten silently: continue it with :meth:`resume`, or pass ``overwrite=True``
    to move all its old files aside (and delete them) before anything new is written; otherwise
    :class:`RunExistsError` names the directory before anything is loaded. What an attempt stopped before its first
    checkpoint left is cleared without ``overwrite`` (with a notice). The directory's lock is taken first: a second
    writer (another process, or a busy Trainer in this one) is refused naming the holder.
    """

    def __init__(self, cfg: Config, *, policy=None, tokenizer=None, engine: Optional[RolloutEngine] = None,
                 run_dir: str | Path | None = None, progress: bool = True,
                 callbacks: Sequence[Callable[["Trainer", dict], None]] = (), overwrite: bool = False,
                 _resuming: bool = False, _lock: Optional[RunLock] = None):
        if not isinstance(overwrite, bool):
            raise ValueError(f"overwrite: got {overwrite!r}; allowed: True or False")
        spec = resolve(cfg)  # names, tasks, model path: fail before the model loads and the run directory is touched
        _check_eval_sets(spec)
        check_trackers(cfg.report_to)
        path = Path(run_dir) if run_dir is not None else Path(cfg.run_dir) / (cfg.run_name or default_run_name(cfg))
        from brorl_lab.core.rundir import check_writable

        check_writable(path, "run_dir")
        self._lock = _lock or RunLock.acquire(path)
        try:
            self._setup(cfg, spec, path, policy, tokenizer, engine, progress, callbacks, overwrite, _resuming)
        except BaseException:
            self._lock.release()
            raise

    def _setup(self, cfg, spec, path, policy, tokenizer, engine, progress, callbacks, overwrite, resuming) -> None:
        from brorl_lab.core.models import make_reference, pick_device

        if not (resuming or overwrite) and RunDir.holds_run(path):
            raise _run_exists(path)
        _remove_stale_temps(path)
        self.cfg = cfg
        if cfg.torch_threads:
            torch.set_num_threads(cfg.torch_threads)
        self.device = pick_device(cfg.device)
        if policy is None:
            policy, tokenizer = _load_model(cfg)
        elif tokenizer is None:
            raise ValueError("tokenizer: required when a policy object is passed")
        self.policy, self.tokenizer = policy, tokenizer
        self.policy.train()
        self.reference = make_reference(policy) if cfg.kl_beta > 0 else None
        self.optimizer = self._make_optimizer()
        self.engine = engine if engine is not None else self._make_engine()
        self._own_engine = engine is None
        self.spec = spec.with_tokenizer(tokenizer)  # template 'auto' -> the tokenizer's
        self.template = self.spec.template
        self.run_dir = RunDir(path)
        self.notices: list[str] = []  # what this Trainer did on its own and said on stderr
        cleared: list[str] = []
        if not resuming:
            # a papermill run that trains into its own directory keeps its parameters, status and notebook
            keep = ({*RunDir.NOTEBOOK_FILES, *(f.name for f in path.glob("*.ipynb"))}
                    if lock_held(path, "notebook") else set())
            cleared = RunDir.clear_run(path, keep=keep)
        if self._lock.notice(path):
            self._notice(self._lock.notice(path), event="lock_taken_over", previous=self._lock.took_over)
        if cleared and not overwrite:
            self._notice(f"notice: {path}: cleared what an attempt stopped before its first checkpoint left "
                         f"({', '.join(cleared)})", event="cleared", files=cleared)
        elif cleared:  # --overwrite says what it removed, the user's own files by name
            own = [f for f in cleared if f not in RunDir.RUN_FILES]
            self._notice(f"notice: {path}: --overwrite removed {', '.join(cleared)}"
                         + (f" (not written by a run: {', '.join(own)})" if own else ""), event="overwritten",
                         files=cleared)
        self._checkpoint_step: Optional[int] = None  # step of the last checkpoint this process wrote or loaded
        self.progress = progress
        self.callbacks = list(callbacks)
        self.trackers: list = []  # cfg.report_to, opened at the first row a run() logs (see _emit)
        self.rows: list[dict] = []
        self.step_idx = 0  # completed training steps
        self.cum = new_cum()  # cum_samples (generated), cum_trained_samples, cum_updates, cum_tokens, cum_wall_s
        self.bad_steps = 0
        self._stop = threading.Event()
        self.stop_signal: Optional[int] = None  # SIGINT / SIGTERM that stopped the last run(), else None
        self.interrupted = False  # the last run() stopped on a signal before its steps were done
        self.run_dir.write_config(cfg.to_dict())
        self.run_dir.write_environment()

    def _notice(self, line: str, *, event: Optional[str] = None, **fields) -> None:
        """Say ``line`` on stderr, in train.log and (as ``event``) in events.jsonl: what the run did on its own that
        the user should know (a lock taken over, files cleared, a metrics or status file rebuilt)."""
        self.notices.append(line)
        print(line, file=sys.stderr, flush=True)
        self.log(line)
        if event:
            self.run_dir.log_event(event, message=line, **fields)

    # ---- construction -----------------------------------------------------------------------------------------------
    def _make_optimizer(self) -> torch.optim.Optimizer:
        return S.make_optimizer(self.policy, self.cfg)

    def _make_engine(self) -> RolloutEngine:
        c = self.cfg
        kw = {"device": c.device, "dtype": c.dtype}
        wrapped = c.ray_worker_engine if c.engine == "ray" else c.engine
        if wrapped in ("torch", "hf"):
            kw["chunk_sequences"] = c.rollout_chunk_sequences
        if c.engine == "torch" and c.compile_step and supports_shared_prefix(self.policy):
            kw["compile_decode"] = True  # the fused decode step needs the shared-prefix kernel
        if c.engine == "ray":
            kw.update(workers=c.ray_workers, worker_engine=c.ray_worker_engine, address=c.ray_address)
        return make_engine(c.engine, self.policy, self.tokenizer, **kw)

    @property
    def allocator(self):
        """The run's per-prompt allocator (config ``rollout_allocation``), built on first use; it remembers each
        prompt's earlier outcomes (the two_stage prior), and that memory is part of the checkpoint
        (:meth:`state_dict` ``allocator``), so a resumed run allocates as the uninterrupted one."""
        if getattr(self, "_allocator", None) is None:
            self._allocator = S.make_allocator(self.cfg.rollout_allocation, **allocator_options(self.cfg))
        return self._allocator

    def sampling(self, step: int, rnd: int) -> RolloutSampling:
        c = self.cfg
        return RolloutSampling(temperature=c.temperature, top_p=c.top_p, max_new_tokens=c.max_new_tokens,
                               seed=derive_seed(c.seed, "rollout", step, rnd))

    # ---- stage 1: rollout + score + dynamic sampling ---------------------------------------------------------------
    def collect(self, step: int) -> tuple[RolloutBatch, dict]:
        """Roll out and score full batches of ``prompts_per_step`` prompts until enough groups are informative
        (dynamic sampling, DAPO): round 0, then refill rounds while fewer than ``prompts_per_step`` groups are kept,
        at most ``max_resample_rounds`` of them (the declared cap: ``1 + max_resample_rounds`` rounds, i.e. at most
        ``(1 + max_resample_rounds) * prompts_per_step * rollouts_per_prompt`` generated samples a step).

        Every sample generated counts (``samples``: what BroRL's table counts), whether trained on or not; the
        row also says what was trained on (``trained_samples``), the cap, how many refill rounds ran and whether
        the cap cut the batch short; each step that refilled or hit the cap logs a ``refill`` event with the kept
        groups and generated samples of every round (events.jsonl)."""
        c = self.cfg
        kept: list[RolloutBatch] = []
        seen: list[RolloutBatch] = []
        t = {"rollout": 0.0, "score": 0.0, "filter": 0.0}
        gen_groups = kept_groups = all_correct = all_wrong = 0
        gen_s = 0.0
        rounds = ds_round_cap(c)
        for rnd in range(rounds):
            t0 = time.perf_counter()
            families = self.spec.families
            items = S.sample_prompts(c.tasks, c.prompts_per_step, seed=derive_seed(c.seed, "prompts", step, rnd),
                                     task_families=families)
            if c.rollout_allocation == "uniform":
                batch = S.rollout(self.engine, items, c.rollouts_per_prompt, self.sampling(step, rnd),
                                  template=self.template, tokenizer=self.tokenizer, task_families=families)
                t1 = time.perf_counter()
                batch = S.score(batch, template=self.template, reward=c.reward, task_families=families)
            else:  # the same budget spread per prompt by the allocator, scored round by round (rl/allocation.py)
                batch = S.rollout_allocated(self.engine, items, self.allocator, budget=c.samples_per_step,
                                            sampling=self.sampling(step, rnd), template=self.template,
                                            tokenizer=self.tokenizer, reward=c.reward, task_families=families)
                t1 = time.perf_counter()
            t2 = time.perf_counter()
            seen.append(batch)
            gen_s += batch.meta.get("generation_seconds", t1 - t0)
            if c.dynamic_sampling:
                batch, fs = S.filter_groups(batch)
                gen_groups += fs.generated_groups
                kept_groups += fs.kept_groups
                all_correct += fs.all_correct_groups
                all_wrong += fs.all_wrong_groups
            kept.append(batch)
            t["rollout"] += t1 - t0
            t["score"] += t2 - t1
            t["filter"] += time.perf_counter() - t2
            if sum(b.num_prompts for b in kept) >= c.prompts_per_step:
                break
        informative = sum(b.num_prompts for b in kept)  # kept groups over all rounds, before truncation
        train = RolloutBatch.concat(kept)
        if train.num_prompts > c.prompts_per_step:
            train = train.select_prompts(range(c.prompts_per_step))
        allb = RolloutBatch.concat(seen)
        s = allb.summary()
        tokens = int(allb.lengths.sum())
        cap_hit = bool(c.dynamic_sampling and train.num_prompts < c.prompts_per_step)
        if c.dynamic_sampling and (len(seen) > 1 or cap_hit):
            self.run_dir.log_event("refill", step=step, rounds=len(seen), round_cap=rounds, cap_hit=cap_hit,
                                   kept_groups_by_round=[b.num_prompts for b in kept],
                                   generated_samples_by_round=[b.size for b in seen])
        info = {
            **{k: s[k] for k in ("reward_mean", "pass_at_1", "response_length_mean", "response_length_max",
                                  "truncation_rate")},
            "samples": allb.size, "tokens": tokens, "rollout_rounds": len(seen),
            "refill_rounds": len(seen) - 1, "ds_round_cap": rounds,
            "ds_sample_cap": rounds * c.prompts_per_step * c.rollouts_per_prompt, "ds_cap_hit": cap_hit,
            "ds_pass_rate": kept_groups / gen_groups if c.dynamic_sampling and gen_groups else float("nan"),
            # the dropped groups by kind, over every round (nan without dynamic sampling): which way a run drifts
            "ds_generated_groups": gen_groups if c.dynamic_sampling else float("nan"),
            "ds_all_correct_groups": all_correct if c.dynamic_sampling else float("nan"),
            "ds_all_wrong_groups": all_wrong if c.dynamic_sampling else float("nan"),
            "kept_groups": train.num_prompts, "surplus_groups": informative - train.num_prompts,
            **S.group_metrics(allb),  # N per prompt and the informative share per generated sample
            "samples_per_s": allb.size / gen_s if gen_s > 0 else float("nan"),
            "tokens_per_s": tokens / gen_s if gen_s > 0 else float("nan"),
            **{f"time/{k}": v for k, v in t.items()},
        }
        train.meta["temperature"] = c.temperature
        return train, info

    # ---- one step -----------------------------------------------------------------------------------------------------
    def step(self) -> dict:
        """Run one training step and return its metrics row (also appended to ``self.rows``)."""
        c = self.cfg
        step = self.step_idx + 1
        t_start = time.perf_counter()
        for group in self.optimizer.param_groups:  # warm-up, then cfg.lr_scheduler_type (Config.lr_at)
            group["lr"] = c.lr_at(step)
        row: dict = {"step": step, "lr": self.optimizer.param_groups[0]["lr"]}

        batch, info = self.collect(step)                                                   # 1. rollout/score/filter
        row.update(info)
        rewards_ok = batch.rewards is None or bool(torch.isfinite(batch.rewards).all())
        skipped, applied = None, 0  # applied: optimizer steps taken (a non-finite update: those before it stopped)
        if batch.num_prompts == 0:
            skipped = "no informative groups"
        elif not rewards_ok:
            skipped = "non-finite rewards"
        else:
            t0 = time.perf_counter()
            old = None if S.is_on_policy(c) else compute_logprobs(                          # 2. logprobs
                self.policy, batch, temperature=c.temperature, micro_batch_tokens=c.train_micro_batch_tokens,
                layout=c.logprob_layout, fused=c.compile_step)  # on-policy: update uses logp.detach()
            batch, kl = S.kl_in_reward(batch, self.policy, self.reference, cfg=c, logprobs=old)  # kl_placement
            if kl is not None:
                row["kl"] = kl
            row["time/logprobs"] = time.perf_counter() - t0
            adv = S.advantages(batch, c.advantage, **S.advantage_options(c))                # 3. advantages
            t0 = time.perf_counter()
            try:
                report = S.update(self.policy, self.optimizer, batch, adv, cfg=c,           # 4. update
                                  reference=self.reference, old_logprobs=old)
                row.update(report.metrics)
                applied = report.optimizer_steps
            except S.NonFiniteError as e:
                skipped, applied = f"non-finite update: {e}", e.optimizer_steps
            row["time/update"] = time.perf_counter() - t0
        if skipped:
            self.bad_steps += 1 if skipped.startswith("non-finite") else 0
            self.run_dir.log_event("skipped_step", step=step, reason=skipped, optimizer_steps=applied)
        else:
            self.bad_steps = 0
        if not skipped or applied:  # mini-batches applied before a non-finite one moved the weights too
            t0 = time.perf_counter()
            S.sync(self.engine, self.policy)                                                # 5. sync
            row["time/sync"] = time.perf_counter() - t0
        row["skipped"] = bool(skipped)
        row["reset"] = self._maybe_reset(step, row)                                         # 6. reset / eval / log
        if c.eval_due(step) or c.eval_due_samples(self.cum["samples"], self.cum["samples"] + row["samples"]):
            t0 = time.perf_counter()
            row.update(self.evaluate(step).metrics)
            row["time/eval"] = time.perf_counter() - t0
        row["step_wall_s"] = time.perf_counter() - t_start
        # what this step trained on: the mini-batches (whole groups) applied; a non-finite update stops part way
        row["updates"] = applied
        row["trained_samples"] = int(batch.group_sizes[:sum(  # groups of any size
            len(g) for g in torch.arange(batch.num_prompts).chunk(c.optimizer_steps_per_step)[:applied])].sum())
        self.cum["samples"] += row["samples"]  # generated (refills included): BroRL's compute unit
        self.cum["trained_samples"] += row["trained_samples"]
        self.cum["updates"] += row["updates"]
        self.cum["tokens"] += row["tokens"]
        self.cum["wall_s"] += row["step_wall_s"] - row.get("time/eval", 0.0)  # training time, eval excluded
        row.update({f"cum_{k}": v for k, v in self.cum.items()})
        self.rows.append(row)
        self.step_idx = step
        if self.bad_steps >= c.max_bad_steps:
            self.save_checkpoint()
            raise RuntimeError(f"stopping: {self.bad_steps} consecutive non-finite steps (max_bad_steps="
                               f"{c.max_bad_steps}); last: {skipped}. The last good state is checkpointed in "
                               f"{self.run_dir.checkpoint_dir}")
        return row

    # ---- ProRL reference reset -----------------------------------------------------------------------------------------
    def _maybe_reset(self, step: int, row: dict) -> bool:
        c = self.cfg
        reason = None
        if c.reset_due(step):
            reason = (f"every {c.reset_every} steps" if c.reset_every
                      else f"every {c.reset_every_samples:,} samples ({step * c.samples_per_step:,} so far)")
        elif c.reset_on_kl and row.get("kl", 0.0) > c.reset_on_kl:
            reason = f"kl {row['kl']:.4g} > {c.reset_on_kl}"
        if reason:
            self.reset_reference(reason, step=step)
        return reason is not None

    def reset_reference(self, reason: str = "manual", step: Optional[int] = None) -> None:
        """ProRL's hard reset: pi_ref := pi (if a reference is kept) and, with ``reset_optimizer``, a fresh AdamW."""
        if self.reference is not None:
            self.reference.load_state_dict(self.policy.state_dict())
        if self.cfg.reset_optimizer:
            self.optimizer = self._make_optimizer()
        self.run_dir.log_event("reset", step=step if step is not None else self.step_idx, reason=reason,
                               optimizer_reset=self.cfg.reset_optimizer, reference_reset=self.reference is not None)

    # ---- evaluation -----------------------------------------------------------------------------------------------------
    def evaluate(self, step: Optional[int] = None):
        c = self.cfg
        sampling = RolloutSampling(temperature=c.eval_temperature, top_p=c.eval_top_p, max_new_tokens=c.max_new_tokens,
                                   seed=derive_seed(c.seed, "eval", step if step is not None else self.step_idx))
        return evaluate(self.engine, c.eval_tasks or c.tasks, samples=c.eval_samples, k=c.eval_k,
                        prompts=c.eval_prompts, sampling=sampling, template=self.template,
                        progress=self.progress and live_bars(),
                        task_families=self.spec.families)

    # ---- the loop -------------------------------------------------------------------------------------------------------
    def run(self, steps: Optional[int] = None) -> pd.DataFrame:
        """Train until ``steps`` (default ``cfg.steps``) steps are done; returns the metrics DataFrame."""
        c = self.cfg
        total = c.steps if steps is None else steps
        if not self._lock.held:  # closed, then run again: the directory's lock again (or a clear refusal)
            self._lock = RunLock.acquire(self.run_dir.path)
        self._lock.busy = True
        beat = threading.Event()
        threading.Thread(target=self._heartbeat, args=(beat,), daemon=True, name="brorl-heartbeat").start()
        try:
            return self._run(total)
        except BaseException as e:  # Ctrl-C / SIGTERM outside the stoppable loop (the first evaluation, a second
            if isinstance(e, KeyboardInterrupt):  # signal): the run dir says so; the CLI exits 130 / 143
                signum = getattr(e, "signum", signal.SIGINT)
                _best_effort(lambda: self.run_dir.write_status("interrupted", step=self.step_idx,
                                                               checkpoint_step=self._checkpoint_step),
                             lambda: self.run_dir.log_event("interrupted", step=self.step_idx, signal=signum,
                                                            checkpoint_step=self._checkpoint_step))
            raise
        finally:
            beat.set()
            self._lock.busy = False

    def _heartbeat(self, stop: threading.Event) -> None:
        """status.json's heartbeat every HEARTBEAT_S seconds while run() runs (a step may take minutes)."""
        while not stop.wait(HEARTBEAT_S):
            try:
                self.run_dir.heartbeat()
            except OSError:
                pass

    def _run(self, total: int) -> pd.DataFrame:
        from tqdm.auto import tqdm

        c = self.cfg
        self.run_dir.write_status("running", step=self.step_idx, steps=total)
        _pause_at("start")
        if not self.rows and c.evaluates:  # row 0: where training starts from
            t0 = time.perf_counter()
            row = {"step": 0, **{f"cum_{k}": v for k, v in self.cum.items()}, **self.evaluate(0).metrics}
            row["time/eval"] = time.perf_counter() - t0
            self.rows.append(row)
            self._emit(row)
        # A terminal or a notebook gets a live bar; a batch job (stderr a file: Slurm, nohup, CI) gets plain lines
        # instead of a stream of carriage returns. Either way every step's line goes to <run>/train.log.
        live = self.progress and live_bars()
        bar = tqdm(total=total, initial=self.step_idx, desc=self.run_dir.path.name, disable=not live)
        self.log(f"start: step {self.step_idx} of {total}", echo=self.progress and not live)
        try:
            with self._interruptible():
                while self.step_idx < total and not self._stop.is_set() and not c.budget_spent(self.cum["samples"]):
                    _pause_at(f"step {self.step_idx + 1}", self._stop.is_set)
                    row = self.step()
                    self._emit(row)
                    self.run_dir.write_status("running", step=self.step_idx, steps=total)  # a sweep's view inside
                    bar.update(1)
                    shown = {k: f"{row[k]:.3g}" for k in (*PROGRESS_METRICS, BEST_METRIC) if isinstance(row.get(k), float)}
                    bar.set_postfix({k: v for k, v in shown.items() if k != BEST_METRIC})
                    self.log(f"step {self.step_idx}/{total} " + " ".join(f"{k}={v}" for k, v in shown.items())
                             + (" skipped" if row.get("skipped") else ""), echo=self.progress and not live)
                    if c.checkpoint_every and self.step_idx % c.checkpoint_every == 0:
                        self.save_checkpoint()
            interrupted = self._stop.is_set() and self.step_idx < total
            self.save_checkpoint()
        except Exception as e:  # e.g. max_bad_steps, a full disk: the run dir says so, not only the traceback
            error = f"{type(e).__name__}: {e}"
            _best_effort(lambda: self.run_dir.write_metrics(self.rows),
                         lambda: self.run_dir.write_status("failed", step=self.step_idx, error=error),
                         lambda: self.run_dir.log_event("failed", step=self.step_idx, error=error))
            raise
        finally:
            bar.close()
            self.close_trackers()
        self.interrupted = interrupted  # a signal in the last step: the run is finished, not interrupted
        self.run_dir.write_status("interrupted" if interrupted else "finished", step=self.step_idx)
        if interrupted:
            self.run_dir.log_event("interrupted", step=self.step_idx)
        self.log(f"{'interrupted' if interrupted else 'finished'} at step {self.step_idx}", echo=self.progress and not live)
        done = [r for r in self.rows if r.get("step", 0) >= 1]
        if done and all(r.get("skipped") for r in done):
            msg = (f"{self.run_dir.path.name}: trained on nothing: all {len(done)} steps were skipped (no informative "
                   "group, or non-finite; reasons in events.jsonl). Try more prompts_per_step, max_resample_rounds "
                   "or rollouts_per_prompt, or dynamic_sampling=False.")
            self.log("warning: " + msg, echo=False)
            warnings.warn(msg, RuntimeWarning, stacklevel=3)  # the caller of run()
        return self.metrics

    def log(self, line: str, *, echo: bool = False) -> None:
        """Append a timestamped ``line`` to ``<run>/train.log`` (and print it to stderr when ``echo``)."""
        stamped = f"{time.strftime('%Y-%m-%d %H:%M:%S')} {line}"
        try:
            with open(self.run_dir.path / "train.log", "a") as f:
                f.write(stamped + "\n")
        except OSError:  # the log is a convenience; a full disk is reported by the writes that matter
            pass
        if echo:
            print(stamped, file=sys.stderr, flush=True)

    def _emit(self, row: dict) -> None:
        self.run_dir.write_metrics(self.rows)
        if self.cfg.report_to and not self.trackers:
            from brorl_lab.rl.trackers import make_trackers

            self.trackers = make_trackers(self.cfg.report_to, self.run_dir.path, self.cfg.to_dict(),
                                          first_step=int(row["step"]))
        for cb in [*self.trackers, *self.callbacks]:
            cb(self, row)

    def close_trackers(self) -> None:
        """Finish the trackers (cfg.report_to); the next row a run() logs opens them again."""
        trackers, self.trackers = self.trackers, []
        for t in trackers:
            t.close()

    @contextmanager
    def _interruptible(self):
        """First Ctrl-C / kernel interrupt, or SIGTERM (how Slurm and Kubernetes preempt): finish this step,
        checkpoint, mark the run interrupted, return; ``stop_signal`` says which signal it was (the CLI exits
        128 + its number, as a shell does). A second one: stop now."""
        self._stop.clear()
        self.stop_signal = None
        if threading.current_thread() is not threading.main_thread():
            yield
            return

        def handler(signum, frame):
            if self._stop.is_set():
                raise Interrupted(signum)
            self.stop_signal = signum
            self._stop.set()

        previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for s, h in previous.items():
                signal.signal(s, h)

    def stop(self) -> None:
        """Ask a running loop (e.g. from a widget button) to stop after the current step."""
        self._stop.set()

    @property
    def metrics(self) -> pd.DataFrame:
        return pd.DataFrame(self.rows)

    # ---- checkpoints --------------------------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {
            "step": self.step_idx, "cum": dict(self.cum), "rows": list(self.rows), "bad_steps": self.bad_steps,
            "policy": self.policy.state_dict(), "optimizer": self.optimizer.state_dict(),
            "reference": None if self.reference is None else self.reference.state_dict(),
            "rng": {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()},
            "config": self.cfg.to_dict(),
            "allocator": None if getattr(self, "_allocator", None) is None else self._allocator.state_dict(),
        }

    def save_checkpoint(self) -> Path:
        """Write the whole state atomically to ``<run>/checkpoint/state.pt`` (temp + fsync + rename) and the policy
        as a Hugging Face model to ``<run>/policy/`` (see :meth:`save_pretrained`), both of the same step.

        The policy directory is staged first (the big write), then state.pt is written, then the staged directory
        is swapped in by renames; so if a write fails (ENOSPC mid-write, quota, I/O error) the temp files are
        removed, the previous checkpoint and policy/ are left as they were, the failure is logged as a
        ``checkpoint_failed`` event, and :class:`CheckpointError` says which checkpoint survived.
        """
        import shutil

        state = self.state_dict()
        target = self.run_dir.checkpoint_dir / CHECKPOINT_FILE
        staged = None
        try:
            staged = stage_dir(self.run_dir.policy_dir, self._write_pretrained)
            path = atomic_write(target, lambda f: torch.save(state, f))
            commit_dir(staged, self.run_dir.policy_dir)
        except Exception as e:  # an OSError, or safetensors' own error for the same full disk ("unexpected pos")
            if not isinstance(e, OSError) and type(e).__name__ != "SafetensorError":
                raise
            if staged is not None:
                shutil.rmtree(staged, ignore_errors=True)
            raise self._checkpoint_failed(target, e) from e
        for stale in path.parent.glob(f".{CHECKPOINT_FILE}.*.tmp"):  # left by a process killed mid-write
            stale.unlink(missing_ok=True)
        for stale in self.run_dir.path.glob(f".{RunDir.POLICY_DIR}.*.tmp"):
            shutil.rmtree(stale, ignore_errors=True)
        self._checkpoint_step = self.step_idx
        if self.cfg.keep_checkpoints:
            self._keep_checkpoint()
        return path

    def _keep_checkpoint(self) -> None:
        """Copy policy/ and state.pt to ``checkpoints/step_NNNNNN/`` (a Hugging Face model directory that
        ``train --resume`` also continues from), then keep the last ``keep_checkpoints`` of those plus the one whose
        step has the best held-out mean pass@1 (only checkpointed steps that were evaluated compete)."""
        import shutil

        root = self.run_dir.path / "checkpoints"
        kept = root / f"step_{self.step_idx:06d}"
        if not kept.exists():
            def copy(tmp: Path) -> None:
                shutil.copytree(self.run_dir.policy_dir, tmp, dirs_exist_ok=True)
                shutil.copyfile(self.run_dir.checkpoint_dir / CHECKPOINT_FILE, tmp / CHECKPOINT_FILE)

            atomic_write_dir(kept, copy)
        steps = sorted(int(d.name[5:]) for d in root.glob("step_*") if d.name[5:].isdigit())
        score = {int(r["step"]): r[BEST_METRIC] for r in self.rows
                 if isinstance(r.get(BEST_METRIC), float) and math.isfinite(r[BEST_METRIC])}
        keep = set(steps[-self.cfg.keep_checkpoints:])
        scored = [s for s in steps if s in score]
        if scored:
            best = max(scored, key=lambda s: (score[s], s))
            keep.add(best)
            atomic_write_text(root / "best.json", json.dumps({"step": best, BEST_METRIC: score[best]}))
        for s in steps:
            if s not in keep:
                shutil.rmtree(root / f"step_{s:06d}", ignore_errors=True)

    def save_pretrained(self, path: str | Path) -> Path:
        """Write the current policy as a Hugging Face model directory (safetensors weights, tokenizer, a generation
        config with the run's eval sampling, and ``brorl_lab.json`` naming step, run and config), atomically, so
        ``AutoModelForCausalLM.from_pretrained(path)``, vLLM and ``Config(model=path)`` open it."""
        return atomic_write_dir(path, self._write_pretrained)

    def _write_pretrained(self, out: Path) -> None:
        write_pretrained(out, self.policy, self.tokenizer, self.cfg, step=self.step_idx, run_dir=self.run_dir.path)

    def _checkpoint_failed(self, target: Path, e: Exception) -> CheckpointError:
        code = getattr(e, "errno", None)
        why = (f"{errno.errorcode.get(code, 'OSError')}: {getattr(e, 'strerror', None) or e}" if code else
               f"{type(e).__name__}: {' '.join(str(e).split())[:160]}")
        if target.is_file():
            at = f"step {self._checkpoint_step}" if self._checkpoint_step is not None else "an earlier step"
            kept = (f"the last good checkpoint ({at}) is kept, unchanged, at {target}; free space, then resume with: "
                    f"python -m brorl_lab train --resume {self.run_dir.path} (in Python: "
                    f"Trainer.resume({str(self.run_dir.path)!r}))")
        else:
            kept = (f"there is no earlier checkpoint to fall back on ({target} was never written); free space, then "
                    "run the same command again (it starts over)")
        try:
            self.run_dir.log_event("checkpoint_failed", step=self.step_idx, error=why,
                                   kept_step=self._checkpoint_step if target.is_file() else None)
        except OSError:
            pass
        return CheckpointError(f"checkpoint at step {self.step_idx} could not be written ({why}); {kept}",
                               errno_=code, kept=target if target.is_file() else None)

    def load_state_dict(self, state: dict) -> None:
        self.policy.load_state_dict(state["policy"])
        if self.reference is not None and state["reference"] is not None:
            self.reference.load_state_dict(state["reference"])
        self.optimizer = self._make_optimizer()
        self.optimizer.load_state_dict(state["optimizer"])
        torch.set_rng_state(state["rng"]["torch"])
        random.setstate(state["rng"]["python"])
        np.random.set_state(state["rng"]["numpy"])
        self.step_idx, self.cum, self.rows = state["step"], {**new_cum(), **state["cum"]}, list(state["rows"])
        self.bad_steps = state.get("bad_steps", 0)
        if state.get("allocator"):  # the allocator's memory (absent in checkpoints written before it was kept)
            self.allocator.load_state_dict(state["allocator"])
        self._checkpoint_step = self.step_idx
        S.sync(self.engine, self.policy)

    @classmethod
    def resume(cls, run_dir: str | Path, *, checkpoint: Optional[int | str | Path] = None,
               steps: Optional[int] = None, **kwargs) -> "Trainer":
        """Re-open a run directory and continue from its last complete checkpoint, or from a kept one
        (``checkpoint``: its step, or its directory ``checkpoints/step_N``; ``run_dir`` may itself be that
        directory). Kept checkpoints after the one resumed from are removed (they belong to the abandoned branch;
        said in a notice). ``steps`` larger than the run's extends it (a finished run too): config.yaml gets the new
        value and events.jsonl a ``config_changed`` event. A metrics.parquet or status.json that does not match the
        checkpoint (damaged, or from later steps) is rebuilt from it, with a notice."""
        from brorl_lab.core.validation import check_int

        run_path, ckpt = _resume_target(Path(run_dir), checkpoint)
        if steps is not None:
            check_int("steps", steps, 1)
        lock = RunLock.acquire(run_path)
        try:
            run = RunDir(run_path)
            try:
                config = run.read_config()
            except Exception as e:  # noqa: BLE001 - missing or unparsable config.yaml
                raise UserError(f"run_dir: {run.path / 'config.yaml'} could not be read ({type(e).__name__}: "
                                f"{str(e).strip()[:200]}); allowed: a run directory written by Trainer") from e
            cfg = Config.from_dict(config)
            state = load_state(ckpt)
            change = None
            if steps is not None and steps != cfg.steps:
                if steps <= state["step"]:
                    raise UserError(f"steps: got {steps}; allowed: more than the {state['step']} steps the checkpoint "
                                    f"has done (to extend the run), or no --steps to continue to {cfg.steps}")
                change = {"steps": [cfg.steps, steps]}
                cfg = cfg.replace(steps=steps)
            was = run.read_status()
            trainer = cls(cfg, run_dir=run.path, _resuming=True, _lock=lock, **kwargs)
        except BaseException:
            lock.release()
            raise
        trainer._after_resume(state, ckpt, was, change)
        return trainer

    def _after_resume(self, state: dict, ckpt: Path, was: dict, change: Optional[dict]) -> None:
        """Load ``state``; report what resuming changed or rebuilt (see :meth:`resume`)."""
        from brorl_lab.core.rundir import WRITER_GONE, RunFileError

        run = self.run_dir
        self.load_state_dict(state)
        if change:
            old, new = change["steps"]
            sched = (f"; the {self.cfg.lr_scheduler_type} lr schedule now spans {new} steps"
                     if self.cfg.lr_scheduler_type != "constant" else "")
            self._notice(f"notice: {run.path}: steps {old} -> {new} (extending the run{sched})",
                         event="config_changed", changes=change)
        if was.get("status") == WRITER_GONE:
            self._notice(f"notice: {run.path}: status said running, but its writer (pid {was.get('pid')} on "
                         f"{was.get('host')}) is gone: interrupted (writer gone); continuing from step "
                         f"{self.step_idx}", event="writer_gone", previous=was)
        elif was.get("status") == "unreadable":
            self._notice(f"notice: {run.path}: status.json was unreadable ({was.get('error')}); rewritten",
                         event="rebuilt", file="status.json")
            run.write_status("interrupted", step=self.step_idx)
        try:
            on_disk = run.read_metrics()
            problem = None if len(on_disk) == len(self.rows) else f"{len(on_disk)} rows"
        except RunFileError as e:
            problem = str(e).split("(", 1)[1].split(")")[0]
        if problem is not None and (self.rows or run.metrics_path.exists()):
            run.write_metrics(self.rows)
            self._notice(f"notice: {run.metrics_path} did not match the checkpoint ({problem}); rebuilt from it "
                         f"({len(self.rows)} rows, up to step {self.step_idx})", event="rebuilt",
                         file="metrics.parquet", was=problem)
        if ckpt.parent != run.checkpoint_dir:  # a kept checkpoint: it becomes the last one, later ones go
            later = sorted(d for d in (run.path / "checkpoints").glob("step_*")
                           if d.name[5:].isdigit() and int(d.name[5:]) > self.step_idx)
            self.save_checkpoint()
            import shutil

            for d in later:
                shutil.rmtree(d, ignore_errors=True)
            self._notice(f"notice: {run.path}: resuming from the kept checkpoint of step {self.step_idx}"
                         + (f"; removed the later kept checkpoints ({', '.join(d.name for d in later)})" if later
                            else ""), event="resumed_from_kept", removed=[d.name for d in later])
        run.log_event("resumed", step=self.step_idx, checkpoint=str(ckpt))

    def close(self) -> None:
        """Finish trackers, close an engine this Trainer made, release the run directory's lock (idempotent)."""
        self.close_trackers()
        if self._own_engine and self.engine is not None:
            self.engine.close()
        self._lock.release()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
